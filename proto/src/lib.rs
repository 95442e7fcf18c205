//! The gRPC contract, package `cdnmap.v1`: filled in by the service work (issue 4). The
//! directory exists now so the workspace layout is final.
