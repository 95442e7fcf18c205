//! The gRPC server's request metrics, counted once for every service as a tower layer around
//! tonic's router ([`RpcMetricsLayer`]): `cdnmap_grpc_requests_total{service, method, code}`
//! and `cdnmap_grpc_request_duration_seconds{service, method}`.
//!
//! What is counted: every request that reaches the router, whatever its service (Mapping,
//! Feedback, Admin — requests its token check refuses too —, health, both reflections), when
//! its response's headers are ready. The code is the response's `grpc-status` header when it
//! has one (a trailers-only response: every error a handler or an interceptor returns), else
//! the HTTP status's mapping (gRPC's `http-grpc-status-mapping.md`) when it is not 200, else
//! `OK`: a unary call's answer, or a stream (WatchMap, health's Watch, reflection) that
//! opened. A stream's end is not counted again (`cdnmap_watch_streams_dropped_total` says why
//! WatchMap streams were dropped). A request dropped before its headers (its client or
//! connection gone) counts as `Canceled`. The duration is the time to those headers: a unary
//! call's whole answer, a stream's opening.
//!
//! Labels are bounded: a path outside [`METHODS`] counts as `service="other",
//! method="other"`, and the code is one of gRPC's 17 names. Every (service, method) of
//! [`METHODS`] is registered with `code="OK"` at start ([`register`]), so an alert on a rate
//! sees 0, not nothing, before the first call.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use cdnmap_proto::v1 as pb;
use tonic::server::NamedService;

/// Every service the gRPC listener serves and its methods (a test checks it against the
/// proto's descriptors).
pub const METHODS: &[(&str, &[&str])] = &[
    (
        <pb::mapping_server::MappingServer<crate::mapping::MappingService> as NamedService>::NAME,
        &["Resolve", "ResolveBatch", "WatchMap"],
    ),
    (
        <pb::feedback_server::FeedbackServer<crate::feedback::FeedbackService> as NamedService>::NAME,
        &["ReportDemand", "ReportLoad", "ReportRtt", "ReportHealth"],
    ),
    (
        <pb::admin_server::AdminServer<crate::admin::AdminService> as NamedService>::NAME,
        &[
            "GetCluster",
            "ListClusters",
            "UpsertCluster",
            "DeleteCluster",
            "GetMapUnit",
            "ListMapUnits",
            "UpsertMapUnit",
            "DeleteMapUnit",
            "SetClusterState",
            "GetStatus",
            "DiffMaps",
            "Preview",
            "GetPolicy",
            "SetPolicy",
        ],
    ),
    ("grpc.health.v1.Health", &["Check", "Watch"]),
    ("grpc.reflection.v1.ServerReflection", &["ServerReflectionInfo"]),
    (
        "grpc.reflection.v1alpha.ServerReflection",
        &["ServerReflectionInfo"],
    ),
];

/// gRPC's status codes by number, as their canonical names.
const CODES: [&str; 17] = [
    "OK",
    "Canceled",
    "Unknown",
    "InvalidArgument",
    "DeadlineExceeded",
    "NotFound",
    "AlreadyExists",
    "PermissionDenied",
    "ResourceExhausted",
    "FailedPrecondition",
    "Aborted",
    "OutOfRange",
    "Unimplemented",
    "Internal",
    "Unavailable",
    "DataLoss",
    "Unauthenticated",
];

/// The (service, method) labels of a request path `/package.Service/Method`: itself when
/// [`METHODS`] has it, else `("other", "other")`.
pub fn labels_of(path: &str) -> (&'static str, &'static str) {
    let known = path.strip_prefix('/').and_then(|p| p.split_once('/'));
    known
        .and_then(|(service, method)| {
            let (s, methods) = METHODS.iter().find(|(s, _)| *s == service)?;
            let m = methods.iter().find(|m| **m == method)?;
            Some((*s, *m))
        })
        .unwrap_or(("other", "other"))
}

/// The gRPC code a response's headers say: `grpc-status` when present, else what its HTTP
/// status maps to.
pub fn code_of(status: axum::http::StatusCode, headers: &axum::http::HeaderMap) -> &'static str {
    if let Some(v) = headers.get("grpc-status") {
        return v
            .to_str()
            .ok()
            .and_then(|v| v.parse::<usize>().ok())
            .and_then(|n| CODES.get(n).copied())
            .unwrap_or("Unknown");
    }
    match status.as_u16() {
        200 => "OK",
        400 => "Internal",
        401 => "Unauthenticated",
        403 => "PermissionDenied",
        404 => "Unimplemented",
        429 | 502 | 503 | 504 => "Unavailable",
        _ => "Unknown",
    }
}

/// Registers every (service, method) with `code="OK"` and describes the metrics.
pub fn register() {
    metrics::describe_counter!(
        "cdnmap_grpc_requests_total",
        "gRPC requests by service, method and status code (counted when the response's headers are ready: a stream when it opens)."
    );
    metrics::describe_histogram!(
        "cdnmap_grpc_request_duration_seconds",
        metrics::Unit::Seconds,
        "gRPC requests' time to their response's headers (a unary call's answer, a stream's opening), by service and method."
    );
    for (service, methods) in METHODS {
        for method in *methods {
            count(service, method, "OK", None);
        }
    }
}

/// Counts one request (`took`: its duration; `None` registers the series at 0).
fn count(service: &'static str, method: &'static str, code: &'static str, took: Option<f64>) {
    let counter = metrics::counter!("cdnmap_grpc_requests_total", "service" => service, "method" => method, "code" => code);
    let histogram = metrics::histogram!("cdnmap_grpc_request_duration_seconds", "service" => service, "method" => method);
    if let Some(took) = took {
        counter.increment(1);
        histogram.record(took);
    } else {
        counter.increment(0);
    }
}

/// The layer that counts and times every gRPC request (module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct RpcMetricsLayer;

impl<S> tower::Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics(inner)
    }
}

/// The service of [`RpcMetricsLayer`].
#[derive(Debug, Clone)]
pub struct RpcMetrics<S>(S);

impl<S, B, R> tower::Service<axum::http::Request<B>> for RpcMetrics<S>
where
    S: tower::Service<axum::http::Request<B>, Response = axum::http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = axum::http::Response<R>;
    type Error = S::Error;
    type Future = Pin<
        Box<dyn std::future::Future<Output = Result<axum::http::Response<R>, S::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, request: axum::http::Request<B>) -> Self::Future {
        let (service, method) = labels_of(request.uri().path());
        let mut pending = Pending {
            service,
            method,
            started: Instant::now(),
            counted: false,
        };
        let answer = self.0.call(request);
        Box::pin(async move {
            let response = answer.await;
            pending.count(match &response {
                Ok(r) => code_of(r.status(), r.headers()),
                Err(_) => "Unknown",
            });
            response
        })
    }
}

/// A request not yet counted: counted with its code when its headers are ready, or as
/// `Canceled` if it is dropped before (the client went away, the connection closed).
struct Pending {
    service: &'static str,
    method: &'static str,
    started: Instant,
    counted: bool,
}

impl Pending {
    fn count(&mut self, code: &'static str) {
        if !self.counted {
            self.counted = true;
            let took = self.started.elapsed().as_secs_f64();
            count(self.service, self.method, code, Some(took));
        }
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.count("Canceled");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_name_their_service_and_method_or_other() {
        assert_eq!(
            labels_of("/cdnmap.v1.Admin/GetStatus"),
            ("cdnmap.v1.Admin", "GetStatus")
        );
        assert_eq!(
            labels_of("/grpc.health.v1.Health/Check"),
            ("grpc.health.v1.Health", "Check")
        );
        assert_eq!(labels_of("/cdnmap.v1.Admin/Nope"), ("other", "other"));
        assert_eq!(labels_of("/x.Y/Z"), ("other", "other"));
        assert_eq!(labels_of("/"), ("other", "other"));
    }

    #[test]
    fn codes_come_from_grpc_status_else_the_http_status() {
        let mut h = axum::http::HeaderMap::new();
        assert_eq!(code_of(axum::http::StatusCode::OK, &h), "OK");
        assert_eq!(
            code_of(axum::http::StatusCode::NOT_FOUND, &h),
            "Unimplemented"
        );
        h.insert("grpc-status", axum::http::HeaderValue::from_static("16"));
        assert_eq!(code_of(axum::http::StatusCode::OK, &h), "Unauthenticated");
        h.insert("grpc-status", axum::http::HeaderValue::from_static("99"));
        assert_eq!(code_of(axum::http::StatusCode::OK, &h), "Unknown");
    }

    /// [`METHODS`] has every service and method of the proto's descriptors (cdnmap.v1's, and
    /// health's), and no other.
    #[test]
    fn the_table_is_the_protos_services() {
        use prost::Message as _;
        let mut declared = Vec::new();
        for set in [
            cdnmap_proto::v1::FILE_DESCRIPTOR_SET,
            tonic_health::pb::FILE_DESCRIPTOR_SET,
        ] {
            let set = prost_types::FileDescriptorSet::decode(set).expect("decodes");
            for f in &set.file {
                for s in &f.service {
                    for m in &s.method {
                        declared.push(format!("{}.{}/{}", f.package(), s.name(), m.name()));
                    }
                }
            }
        }
        declared.sort();
        let mut listed: Vec<String> = METHODS
            .iter()
            .filter(|(s, _)| !s.starts_with("grpc.reflection."))
            .flat_map(|(s, ms)| ms.iter().map(move |m| format!("{s}/{m}")))
            .collect();
        listed.sort();
        assert_eq!(listed, declared);
    }
}
