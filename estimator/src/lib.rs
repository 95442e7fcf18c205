//! Demand and capacity estimation: filled in by the estimator work (issue 5). The crate exists
//! now so the workspace layout is final; the mapper does not depend on it.
