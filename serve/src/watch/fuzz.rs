//! Fuzz targets for the front end's side of WatchMap, the gRPC conversion that takes the most
//! from the wire: `MapUpdate` messages, as prost decodes them from a stream's bytes, applied by
//! a [`Follower`]. Whatever the messages, applying them never panics; a message refused leaves
//! what is held as it was; and a map the follower comes to hold is one the mapper's side
//! would send again as it is: encoded whole (`full_part`) and followed by a new front end, it
//! encodes to the same bytes.
//!
//! The corpus (`src/watch/__fuzz__/watch__fuzz__map_updates/corpus`) is the messages of a
//! stream: a 60-unit map in parts, then a delta to the next version, which carries the
//! clusters that changed (`sections`), as a front end that asks for changes only gets it, and
//! a delta of a round that changed nothing (written by the ignored test `write_corpus`). `cdnmap_tests::fuzz` says how the targets run.

use std::path::Path;

use cdnmap_proto::prost::Message;
use cdnmap_tests::fuzz::{assert_bounded, corpus, Mutation};
use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;

use super::tests::{id, map, with_edge};
use super::*;

const CORPUS: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/src/watch/__fuzz__/watch__fuzz__map_updates/corpus"
);

/// A stream's messages: the first map whole, in parts of at most `part_units`, then a delta
/// to a second map over the same units, then a delta that changes nothing.
fn stream() -> Vec<pb::MapUpdate> {
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    let first = map(&mut rng, 60, &["a", "b", "c"]);
    let mut rng = ChaCha8Rng::seed_from_u64(12);
    let second = map(&mut rng, 60, &["a", "b", "c"]);
    let mut messages: Vec<pb::MapUpdate> = (0..full_parts(&first))
        .map(|p| with_edge(|e| full_part(e, id(1, 1), &first, p)))
        .collect();
    messages.extend(with_edge(|e| {
        delta_update(e, id(1, 1), &first, id(1, 2), &second)
    }));
    // A round that changed nothing: `sections` with no section named.
    messages.extend(with_edge(|e| {
        delta_update(e, id(1, 2), &second, id(1, 3), &second)
    }));
    messages
}

/// The held map, encoded whole as the mapper would send it: with the rules, policies and
/// server loads the follower took.
fn encoded(f: &Follower) -> Option<Vec<Vec<u8>>> {
    let held = f.held()?;
    let x = &held.extras;
    let clusters = held.map.clusters();
    let load = |cluster: &str, addr: IpAddr| {
        let c = clusters.iter().position(|c| c.id == cluster)?;
        let a = clusters[c].addresses.iter().position(|&a2| a2 == addr)?;
        x.loads.get(c)?.get(a).copied()
    };
    let load = |cluster: &str, addr: IpAddr| load(cluster, addr).unwrap_or(f64::NAN);
    let edge = Edge {
        policies: &x.policies,
        load: &load,
        rules: &x.rules,
        default_class: &x.default_class,
        bypass: &x.bypass,
    };
    Some(
        (0..full_parts(&held.map))
            .map(|p| full_part(&edge, held.identity, &held.map, p).encode_to_vec())
            .collect(),
    )
}

/// Decodes and applies `messages` in order, as a front end does, stopping where the stream
/// would end (a message that does not decode, or one refused); checks what is held.
fn check(messages: &[&[u8]]) {
    let mut f = Follower::default();
    for bytes in messages {
        let Ok(update) = pb::MapUpdate::decode(*bytes) else {
            break; // tonic ends the stream; the front end reconnects
        };
        let before = encoded(&f);
        if let Err(e) = f.apply(update) {
            assert_bounded(&e.to_string(), bytes.len());
            assert!(
                encoded(&f) == before,
                "a refused message changed the map held"
            );
            break;
        }
    }
    let Some(parts) = encoded(&f) else {
        return;
    };
    let mut again = Follower::default();
    for part in &parts {
        let update = pb::MapUpdate::decode(part.as_slice()).expect("an encoded part decodes");
        again
            .apply(update)
            .unwrap_or_else(|e| panic!("a held map, sent whole, is refused: {e}"));
    }
    assert!(
        encoded(&again) == Some(parts),
        "sent whole and followed, another map"
    );
}

/// Raw messages: each corpus message alone, then random bytes.
#[test]
fn map_updates() {
    bolero::check!().for_each(|bytes: &[u8]| check(&[bytes]));
}

/// A whole stream with one message mutated.
#[test]
fn map_update_mutations() {
    let corpus = corpus(Path::new(CORPUS));
    assert!(corpus.len() >= 2, "the corpus is a stream of messages");
    // Fields put in whole: an address and a prefix of 3,000 bytes, numbers at the edge.
    let long = "a".repeat(3000);
    let tokens: Vec<Vec<u8>> = vec![
        pb::MapUpdate {
            clusters: vec![pb::ClusterAddresses {
                id: "a".into(),
                addresses: vec![long.clone()],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec(),
        pb::MapUpdate {
            units: vec![pb::UnitMapping {
                id: "u000001".into(),
                prefixes: vec![long.clone()],
                ..Default::default()
            }],
            ..Default::default()
        }
        .encode_to_vec(),
        pb::MapUpdate {
            sections: Some(pb::DeltaSections {
                class_rules: true,
                fallbacks: true,
                bypass: true,
            }),
            removed_clusters: vec!["a".into(), "b".into()],
            ..Default::default()
        }
        .encode_to_vec(),
        vec![0xff; 10],
        vec![0x80, 0x80, 0x80, 0x80, 0x10],
        vec![0x08, 0x00],
    ];
    let tokens: Vec<&[u8]> = tokens.iter().map(Vec::as_slice).collect();
    bolero::check!().with_type::<Mutation>().for_each(|m| {
        let mutated = m.apply(&corpus, &tokens);
        let at = usize::from(m.input) % corpus.len();
        let messages: Vec<&[u8]> = corpus
            .iter()
            .enumerate()
            .map(|(i, c)| if i == at { &mutated[..] } else { &c[..] })
            .collect();
        check(&messages);
    });
}

/// Writes the corpus: `cargo test -p cdnmap-serve write_corpus -- --ignored`.
#[test]
#[ignore]
fn write_corpus() {
    std::fs::create_dir_all(CORPUS).expect("the corpus directory");
    for (i, m) in stream().iter().enumerate() {
        let path = format!("{CORPUS}/{i:02}-{}", if m.full { "full" } else { "delta" });
        std::fs::write(&path, m.encode_to_vec()).expect("a corpus file");
    }
}

/// The corpus is the stream as it is made today, and it is followed to its last version.
#[test]
fn the_corpus_is_a_stream_followed_to_its_end() {
    let files = corpus(Path::new(CORPUS));
    let made: Vec<Vec<u8>> = stream().iter().map(|m| m.encode_to_vec()).collect();
    assert_eq!(files, made, "run write_corpus again");
    let mut f = Follower::default();
    for bytes in &files {
        f.apply(pb::MapUpdate::decode(bytes.as_slice()).expect("decodes"))
            .expect("applies");
    }
    assert_eq!(f.identity(), (1, 3));
}
