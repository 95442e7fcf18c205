//! Coefficient learning (written next).
