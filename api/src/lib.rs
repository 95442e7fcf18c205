//! The service edge: filled in by the service work (issue 4). The crate exists now so the
//! workspace layout is final.
