//! cdnmap's gRPC contract, package `cdnmap.v1` (`proto/cdnmap/v1/*.proto`, documented field by
//! field there): `Mapping` for DNS front ends (Resolve, ResolveBatch, WatchMap), `Feedback` for
//! demand and load reports, `Admin` for operators. Generated at build time with a vendored
//! protoc. Protobuf stops here: the service converts these messages into the mapper's plain
//! types at its edge.

/// The generated messages, clients and servers.
pub mod v1 {
    tonic::include_proto!("cdnmap.v1");

    /// The encoded file descriptor set of `cdnmap.v1`, for gRPC server reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        tonic::include_file_descriptor_set!("cdnmap_v1_descriptor");
}

/// The dnstap schema (`proto/dnstap/dnstap.proto`): the query log `cdnmap dns` writes
/// (`dns/src/dnstap.rs`). Its byte fields are `prost::bytes::Bytes`.
#[allow(clippy::module_inception)] // the schema's message `Dnstap` nests its enum in `dnstap`
pub mod dnstap {
    tonic::include_proto!("dnstap");
}

pub mod client_tls;
pub mod secret;

/// The protobuf runtime the messages are built on (`Message::encoded_len`, say).
pub use prost;

/// The most queries one `ResolveBatch` call may carry.
pub const MAX_BATCH_QUERIES: usize = 1_000;
/// The most samples (or loads) one feedback report may carry.
pub const MAX_REPORT_SAMPLES: usize = 100_000;

#[cfg(test)]
mod tests {
    use super::v1::*;
    use prost::Message;

    #[test]
    fn messages_round_trip() {
        let req = ResolveRequest {
            client_subnet: "198.51.100.0/24".into(),
            resolver_ip: "192.0.2.53".into(),
            qname: "www.cdn.example.".into(),
            qtype: 1,
        };
        let bytes = req.encode_to_vec();
        assert_eq!(
            ResolveRequest::decode(bytes.as_slice()).expect("decodes"),
            req
        );
    }

    #[test]
    fn the_descriptor_set_declares_the_three_services() {
        let set = prost_types::FileDescriptorSet::decode(FILE_DESCRIPTOR_SET).expect("decodes");
        let mut services: Vec<String> = set
            .file
            .iter()
            .filter(|f| f.package() == "cdnmap.v1")
            .flat_map(|f| f.service.iter().map(|s| s.name().to_string()))
            .collect();
        services.sort();
        assert_eq!(services, ["Admin", "Feedback", "Mapping"]);
    }
}
