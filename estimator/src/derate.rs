//! Derating (written next).
