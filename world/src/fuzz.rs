//! Fuzz targets for the demand trace reader (`trace::read`, `docs/trace.md`): whatever the
//! bytes, it returns a trace or an error that names the trace (and the line, where there is
//! one) in bounded length, never panics; and a trace it returns is one the writer
//! reproduces: written and read again, the same header and records.
//!
//! The corpus (`src/__fuzz__/fuzz__trace/corpus`) is the records of `docs/trace.md` (every
//! kind, both prefix families, every state, a blank line) and a generated trace (`cdnmap
//! world --map-units 12 --clusters 4 --candidates 3 --seed 7 --trace 0.01`).
//! `cdnmap_tests::fuzz` says how the targets run.

use std::path::Path;

use cdnmap_tests::fuzz::{assert_bounded, corpus, Mutation, JSON_TOKENS};

use crate::trace::{read, write_header, write_record};

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/__fuzz__/fuzz__trace/corpus"
);

fn check(bytes: &[u8]) {
    match read(bytes, "fuzz.jsonl") {
        Ok((header, records)) => {
            let mut written = Vec::new();
            write_header(&mut written, &header).expect("writing to memory");
            for r in &records {
                write_record(&mut written, r).expect("writing to memory");
            }
            let again = read(written.as_slice(), "written.jsonl").unwrap_or_else(|e| {
                panic!(
                    "a written trace does not read ({e:#}): {}",
                    String::from_utf8_lossy(&written)
                )
            });
            assert!(
                again == (header, records),
                "written and read, another trace"
            );
        }
        Err(e) => {
            let text = format!("{e:#}");
            assert!(
                text.starts_with("fuzz.jsonl:"),
                "an error not naming the trace: {text}"
            );
            assert_bounded(&text, bytes.len());
        }
    }
}

/// Raw traces: the corpus, then random bytes.
#[test]
fn trace() {
    bolero::check!().for_each(check);
}

/// Mutations of the corpus's traces: bytes changed, lines spliced, and tokens such as
/// `1e309`, `-0`, `null` or a newline put in.
#[test]
fn trace_mutations() {
    let corpus = corpus(Path::new(CORPUS));
    bolero::check!()
        .with_type::<Mutation>()
        .for_each(|m| check(&m.apply(&corpus, JSON_TOKENS)));
}
