//! End-to-end tests of the `cdnmap` binary live in `tests/tests/`.
