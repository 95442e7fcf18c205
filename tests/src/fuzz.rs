//! What the fuzz targets share: a corpus of real inputs read from a directory, and structured
//! mutations of them.
//!
//! Every parser the outside world can reach has two bolero targets (in its crate's
//! `src/fuzz.rs`): one that takes raw bytes, whose corpus (`src/__fuzz__/<target>/corpus`, one
//! file per input) holds real inputs and is where a coverage-guided fuzzer (`cargo bolero test
//! --engine libfuzzer`, on a nightly toolchain) starts from; and one that takes a [`Mutation`]
//! of those same corpus files. On the stable toolchain, in `cargo test`, bolero feeds a target
//! random values for a second: random bytes rarely get past a parser's first check, while
//! mutations of real inputs (bytes set, flipped, cut, spliced, and tokens such as `1e308` or
//! `"\u202e"` put in) reach every later one.

use std::path::Path;

use bolero::TypeGenerator;

/// The inputs of a corpus directory, in file-name order. Panics (a test helper) when the
/// directory is missing or empty: a fuzz target without a corpus is a setup error.
pub fn corpus(dir: &Path) -> Vec<Vec<u8>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("the corpus {}: {e}", dir.display()))
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    let inputs: Vec<Vec<u8>> = files
        .iter()
        .map(|p| std::fs::read(p).unwrap_or_else(|e| panic!("{}: {e}", p.display())))
        .collect();
    assert!(!inputs.is_empty(), "the corpus {} is empty", dir.display());
    inputs
}

/// One change of an input; positions and lengths wrap around the input's length.
#[derive(Debug, Clone, TypeGenerator)]
pub enum Edit {
    /// The byte at a position set.
    Set { at: u16, to: u8 },
    /// One bit of the byte at a position flipped.
    Flip { at: u16, bit: u8 },
    /// Bytes removed.
    Remove { at: u16, len: u8 },
    /// Bytes put in.
    Insert { at: u16, bytes: Vec<u8> },
    /// A range replaced by one of the target's tokens (a number at the edge of a type, an
    /// empty or odd string, a keyword).
    Token { at: u16, len: u8, token: u8 },
    /// A range of another corpus input put in.
    Splice {
        at: u16,
        from: u8,
        start: u16,
        len: u16,
    },
}

/// A corpus input, changed: the input picked by `input`, each edit in turn, then cut to
/// `cut` bytes if that is shorter.
#[derive(Debug, Clone, TypeGenerator)]
pub struct Mutation {
    pub input: u8,
    #[generator(bolero::produce::<Vec<Edit>>().with().len(0usize..8))]
    pub edits: Vec<Edit>,
    pub cut: Option<u16>,
}

impl Mutation {
    /// The changed input, from `corpus` (not empty) and the target's `tokens`.
    pub fn apply(&self, corpus: &[Vec<u8>], tokens: &[&[u8]]) -> Vec<u8> {
        let pick = |i: u8| &corpus[usize::from(i) % corpus.len()];
        let mut out = pick(self.input).clone();
        for edit in &self.edits {
            let at = |at: u16, len: usize| usize::from(at) % (len + 1);
            match edit {
                Edit::Set { at: a, to } => {
                    if !out.is_empty() {
                        let i = usize::from(*a) % out.len();
                        out[i] = *to;
                    }
                }
                Edit::Flip { at: a, bit } => {
                    if !out.is_empty() {
                        let i = usize::from(*a) % out.len();
                        out[i] ^= 1 << (bit % 8);
                    }
                }
                Edit::Remove { at: a, len } => {
                    let i = at(*a, out.len());
                    let end = (i + usize::from(*len)).min(out.len());
                    out.drain(i..end);
                }
                Edit::Insert { at: a, bytes } => {
                    let i = at(*a, out.len());
                    out.splice(i..i, bytes.iter().copied());
                }
                Edit::Token { at: a, len, token } => {
                    if let Some(t) = tokens.get(usize::from(*token) % tokens.len().max(1)) {
                        let i = at(*a, out.len());
                        let end = (i + usize::from(*len)).min(out.len());
                        out.splice(i..end, t.iter().copied());
                    }
                }
                Edit::Splice {
                    at: a,
                    from,
                    start,
                    len,
                } => {
                    let src = pick(*from);
                    let s = at(*start, src.len());
                    let e = (s + usize::from(*len)).min(src.len());
                    let i = at(*a, out.len());
                    out.splice(i..i, src[s..e].iter().copied());
                }
            }
        }
        if let Some(cut) = self.cut {
            out.truncate(usize::from(cut));
        }
        out
    }
}

/// Tokens for JSON inputs: numbers past what each field may hold, strings that are empty,
/// huge or hostile, and every kind of value where another is expected.
pub const JSON_TOKENS: &[&[u8]] = &[
    b"1e308",
    b"-1e308",
    b"1e309",
    b"-0",
    b"0",
    b"-1",
    b"0.5",
    b"4294967296",
    b"18446744073709551616",
    b"9007199254740993",
    b"null",
    b"true",
    b"[]",
    b"{}",
    b"\"\"",
    b"\"\\u0000\"",
    b"\"a\\u202eb\"",
    b"\"\\ud800\"",
    b"\"0.0.0.0/0\"",
    b"\"::/0\"",
    b"\"10.0.0.1/33\"",
    b"\"down\"",
    b"\"drained\"",
    b",",
    b":",
    b"\"",
    b"\n",
];

/// The longest error message a parser may give: errors name the input (a field, a line, an
/// id) but never echo it whole.
pub const MAX_ERROR_LEN: usize = 2048;

/// Panics when an error message is longer than [`MAX_ERROR_LEN`].
pub fn assert_bounded(error: &str, input_len: usize) {
    assert!(
        error.len() <= MAX_ERROR_LEN,
        "an error of {} bytes for an input of {input_len} bytes: {}...",
        error.len(),
        error.chars().take(300).collect::<String>()
    );
}

/// An error and its sources, as the command line prints them (`anyhow`'s `{:#}`).
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        text.push_str(": ");
        text.push_str(&s.to_string());
        source = s.source();
    }
    text
}
