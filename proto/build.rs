//! Compiles `cdnmap/v1/*.proto` with the protoc that the `protoc-bin-vendored` crate ships, so a
//! fresh machine needs nothing beyond cargo. Also writes the file descriptor set, which the
//! server's reflection service embeds. Also compiles `dnstap/dnstap.proto` (messages only, its
//! bytes fields as `bytes::Bytes`), the query log format `cdnmap dns` writes.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // prost-build runs the protoc named by PROTOC; a build script is single-threaded.
    std::env::set_var("PROTOC", protoc);
    let out = PathBuf::from(std::env::var("OUT_DIR")?);
    let protos = [
        "cdnmap/v1/mapping.proto",
        "cdnmap/v1/feedback.proto",
        "cdnmap/v1/admin.proto",
    ];
    for p in &protos {
        println!("cargo:rerun-if-changed={p}");
    }
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("cdnmap_v1_descriptor.bin"))
        .compile_protos(&protos, &["."])?;
    // dnstap: no services, and its wire messages shared, not copied, into each frame.
    println!("cargo:rerun-if-changed=dnstap/dnstap.proto");
    tonic_prost_build::configure()
        .build_client(false)
        .build_server(false)
        .bytes(".dnstap")
        .compile_protos(&["dnstap/dnstap.proto"], &["."])?;
    Ok(())
}
