//! Fuzz targets for the instance parsers: the JSON instance file (`format::parse_instance`)
//! and the compact form the store keeps and `cdnmap world --format compact` writes
//! (`compact::decode`, inside its zstd frame and checksum). Whatever the bytes, a parser
//! returns a topology or an error of bounded length, never panics; and a topology it returns
//! is one the writers reproduce: written as JSON and parsed again it is written to the same
//! bytes, and through the compact form and back too.
//!
//! The corpus (`src/__fuzz__/fuzz__instance/corpus`) is `docs/example-instance.json` and two
//! small generated worlds (`cdnmap world --map-units 12 --clusters 4 --candidates 3 --seed 7`
//! and `--map-units 40 --clusters 6 --seed 3`); the compact targets start from the same
//! worlds, encoded. `cdnmap_tests::fuzz` says how the targets run.

use std::path::Path;

use cdnmap_mapper::Limits;
use cdnmap_tests::fuzz::{assert_bounded, corpus, error_chain, Mutation, JSON_TOKENS};

use crate::format::{parse_instance, write_instance};
use crate::{compact, Topology};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/__fuzz__/fuzz__instance/corpus"
);

fn json_of(t: &Topology) -> Vec<u8> {
    let mut out = Vec::new();
    write_instance(t, &mut out).expect("writing to memory");
    out
}

/// What a parsed topology must satisfy (module docs).
fn check_written(t: &Topology) {
    let written = json_of(t);
    let again = parse_instance(&written, Limits::default()).unwrap_or_else(|e| {
        panic!(
            "a written instance does not parse ({}): {}",
            error_chain(&e),
            String::from_utf8_lossy(&written)
        )
    });
    assert!(json_of(&again) == written, "written twice, two files");
    let decoded = compact::decode(&compact::encode(t), Limits::default())
        .unwrap_or_else(|e| panic!("an encoded topology does not decode: {}", error_chain(&e)));
    assert!(json_of(&decoded) == written, "the compact form changed it");
}

fn check_instance(bytes: &[u8]) {
    match parse_instance(bytes, Limits::default()) {
        Ok(t) => check_written(&t),
        Err(e) => assert_bounded(&error_chain(&e), bytes.len()),
    }
}

fn check_compact(bytes: &[u8]) {
    match compact::decode(bytes, Limits::default()) {
        Ok(t) => check_written(&t),
        Err(e) => assert_bounded(&error_chain(&e), bytes.len()),
    }
}

/// Raw instance files: the corpus, then random bytes.
#[test]
fn instance() {
    bolero::check!().for_each(check_instance);
}

/// Mutations of the corpus's files: bytes changed, and tokens such as `1e308`, `-0`, `null`
/// or a string with a bidirectional override put in.
#[test]
fn instance_mutations() {
    let corpus = corpus(Path::new(CORPUS));
    bolero::check!()
        .with_type::<Mutation>()
        .for_each(|m| check_instance(&m.apply(&corpus, JSON_TOKENS)));
}

/// Mutations of the corpus's worlds in the compact form (the bytes inside the zstd frame,
/// whose checksum would refuse any change first).
#[test]
fn compact_mutations() {
    let encoded: Vec<Vec<u8>> = corpus(Path::new(CORPUS))
        .iter()
        .map(|file| {
            let t = parse_instance(file, Limits::default()).expect("the corpus parses");
            compact::encode(&t)
        })
        .collect();
    let tokens: &[&[u8]] = &[&[0], &[0xff; 8], &[0x80, 0x80, 0x80, 0x80, 0x10], b"{}"];
    bolero::check!()
        .with_type::<Mutation>()
        .for_each(|m| check_compact(&m.apply(&encoded, tokens)));
}
