//! The store's one error type: what failed, naming the file, tree or value it was about.

/// Why the store failed, naming what it was doing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("store at {path}: {source}")]
    Open { path: String, source: sled::Error },
    #[error("store: {what}: {source}")]
    Io { what: String, source: sled::Error },
    #[error("store: {what}: {source}")]
    File {
        what: String,
        source: std::io::Error,
    },
    #[error("store: {what} is unreadable: {problem}")]
    Corrupt { what: String, problem: String },
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(sled::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}
