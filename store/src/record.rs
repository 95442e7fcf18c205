//! The demand record: every acknowledged Feedback report, kept by the store in the order it
//! arrived. One set of types for its writer (the Feedback service) and its readers (`GET
//! /record`, `cdnmap record export`): the store keeps a report compactly ([`encode`]: a header,
//! then postcard, about a tenth of the JSON), `/record` serves JSON Lines of [`RecordLine`].
//! Reports an older build stored as JSON (`{"kind", "reporter", "body"}`) are still read.

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The header of a report as the store keeps it: the format and its version.
pub const MAGIC: &[u8; 8] = b"CDNREC01";

/// One acknowledged report, and who sent it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordedReport {
    pub reporter: String,
    pub report: Report,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Report {
    Demand(DemandBody),
    Load(LoadBody),
    /// Measured round-trip times (issue 19). Added last: the variants before keep their
    /// numbers in the compact form.
    Rtt(RttBody),
}

/// An RTT report: round trips measured from clients to clusters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RttBody {
    pub measured_at_unix_ms: i64,
    pub samples: Vec<RttSample>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RttSample {
    pub target: Target,
    /// The traffic class as reported (empty: the map unit's own).
    pub class: String,
    /// The map unit it was taken for on arrival (`None`: no map unit covered the prefix); a
    /// restart rebuilds the RTT table from these.
    pub unit: Option<String>,
    pub cluster: String,
    pub rtt_ms: f64,
    pub samples: u64,
}

/// The variant number of [`Report::Rtt`] in the compact form.
const RTT_VARIANT: u8 = 2;

/// Whether stored report `bytes` (the compact form) is an RTT report, read from its first
/// bytes only: a restart looks for them among every report of the last hour without decoding
/// the demand reports.
pub fn is_rtt(bytes: &[u8]) -> bool {
    let Some(body) = bytes.strip_prefix(MAGIC.as_slice()) else {
        return false;
    };
    // postcard: the reporter (a varint length, its bytes), then the report's variant.
    let (mut len, mut shift, mut at) = (0usize, 0u32, 0usize);
    loop {
        let Some(&b) = body.get(at) else {
            return false;
        };
        at += 1;
        if shift > 56 {
            return false;
        }
        len |= usize::from(b & 0x7f) << shift;
        shift += 7;
        if b & 0x80 == 0 {
            break;
        }
    }
    at.checked_add(len)
        .and_then(|i| body.get(i))
        .is_some_and(|&v| v == RTT_VARIANT)
}

/// A demand report: the queries seen over a period, by map unit or by client prefix.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DemandBody {
    pub period_start_unix_ms: i64,
    pub period_end_unix_ms: i64,
    pub samples: Vec<Sample>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub target: Target,
    /// The traffic class as reported (empty: the map unit's own).
    pub class: String,
    /// The queries as the rounds took them: within Feedback's bounds (`budget`), and one
    /// cycle's share of them when the period is longer than a cycle.
    pub queries: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Target {
    MapUnit(String),
    /// Truncated to its length.
    Prefix(IpNet),
}

/// A load report: measured loads of resource nodes, and of servers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadBody {
    pub measured_at_unix_ms: i64,
    pub loads: Vec<NodeLoad>,
    /// Always written (a binary encoding has no optional fields); absent in an older build's
    /// JSON.
    #[serde(default)]
    pub servers: Vec<ServerLoad>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NodeLoad {
    pub cluster: String,
    pub node: String,
    pub load: f64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerLoad {
    pub cluster: String,
    pub address: std::net::IpAddr,
    pub load: f64,
}

/// One line of `/record` (JSON Lines): when the report arrived, and the report.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordLine {
    pub at_unix_ms: i64,
    pub reporter: String,
    pub report: Report,
}

/// `r` as the store keeps it.
pub fn encode(r: &RecordedReport) -> Vec<u8> {
    let mut out = MAGIC.to_vec();
    // postcard writes these plain structs into a Vec without failing.
    out.extend(postcard::to_stdvec(r).unwrap_or_default());
    out
}

/// A stored report: the compact form, or an older build's JSON.
pub fn decode(bytes: &[u8]) -> Result<RecordedReport, String> {
    if let Some(body) = bytes.strip_prefix(MAGIC.as_slice()) {
        return postcard::from_bytes(body).map_err(|e| format!("cut short or damaged: {e}"));
    }
    #[derive(Deserialize)]
    struct Json {
        kind: String,
        reporter: String,
        body: serde_json::Value,
    }
    let old: Json = serde_json::from_slice(bytes)
        .map_err(|e| format!("neither {:?} nor JSON: {e}", String::from_utf8_lossy(MAGIC)))?;
    let report = match old.kind.as_str() {
        "demand" => serde_json::from_value(old.body).map(Report::Demand),
        "load" => serde_json::from_value(old.body).map(Report::Load),
        other => return Err(format!("unknown report kind {other:?}")),
    }
    .map_err(|e| format!("a {} report: {e}", old.kind))?;
    Ok(RecordedReport {
        reporter: old.reporter,
        report,
    })
}

/// Stored reports `(arrival, bytes)` as `/record`'s JSON Lines; a report that cannot be read
/// is an error naming when it arrived.
pub fn json_lines(reports: &[(i64, Vec<u8>)]) -> Result<String, String> {
    let mut out = String::new();
    for (at, bytes) in reports {
        push_json_line(&mut out, *at, bytes)?;
    }
    Ok(out)
}

/// Appends the stored report `bytes`, received at `at`, to `out` as one of `/record`'s JSON
/// Lines (with its newline).
pub fn push_json_line(out: &mut String, at: i64, bytes: &[u8]) -> Result<(), String> {
    let r = decode(bytes).map_err(|e| format!("the report stored at {at} ms: {e}"))?;
    let line = RecordLine {
        at_unix_ms: at,
        reporter: r.reporter,
        report: r.report,
    };
    out.push_str(&serde_json::to_string(&line).map_err(|e| e.to_string())?);
    out.push('\n');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reports() -> Vec<RecordedReport> {
        vec![
            RecordedReport {
                reporter: "fe-1".into(),
                report: Report::Demand(DemandBody {
                    period_start_unix_ms: 20_000,
                    period_end_unix_ms: 30_000,
                    samples: vec![
                        Sample {
                            target: Target::MapUnit("u1".into()),
                            class: String::new(),
                            queries: 5.0,
                        },
                        Sample {
                            target: Target::Prefix("1.0.1.0/24".parse().expect("net")),
                            class: "web".into(),
                            queries: 2.5,
                        },
                    ],
                }),
            },
            RecordedReport {
                reporter: "c1".into(),
                report: Report::Load(LoadBody {
                    measured_at_unix_ms: 10_000,
                    loads: vec![NodeLoad {
                        cluster: "fra-1".into(),
                        node: "cpu".into(),
                        load: 7.0,
                    }],
                    servers: vec![ServerLoad {
                        cluster: "fra-1".into(),
                        address: "198.18.0.1".parse().expect("ip"),
                        load: 0.5,
                    }],
                }),
            },
            RecordedReport {
                reporter: "rum-1".into(),
                report: Report::Rtt(RttBody {
                    measured_at_unix_ms: 10_000,
                    samples: vec![RttSample {
                        target: Target::Prefix("1.0.1.0/24".parse().expect("net")),
                        class: "web".into(),
                        unit: Some("u1".into()),
                        cluster: "fra-1".into(),
                        rtt_ms: 23.5,
                        samples: 40,
                    }],
                }),
            },
        ]
    }

    #[test]
    fn rtt_reports_are_told_from_their_first_bytes() {
        for r in reports() {
            let bytes = encode(&r);
            assert_eq!(is_rtt(&bytes), matches!(r.report, Report::Rtt(_)));
            // Cut before its variant (the header, the reporter's one-byte length, the
            // reporter), a report is not taken for an RTT report; from there on it is read by
            // its variant alone.
            let variant_at = MAGIC.len() + 1 + r.reporter.len();
            for cut in 0..bytes.len() {
                let want = cut > variant_at && matches!(r.report, Report::Rtt(_));
                assert_eq!(is_rtt(&bytes[..cut]), want, "cut at {cut}");
            }
        }
        let mut long = reports()[2].clone();
        long.reporter = "r".repeat(300);
        assert!(is_rtt(&encode(&long)), "a reporter of a two-byte length");
    }

    #[test]
    fn a_report_survives_the_store_and_every_cut_is_refused() {
        for r in reports() {
            let bytes = encode(&r);
            assert_eq!(decode(&bytes), Ok(r.clone()));
            for cut in MAGIC.len()..bytes.len() {
                assert!(decode(&bytes[..cut]).is_err(), "cut at {cut}");
            }
        }
    }

    /// An older build's JSON reports read as the same reports, and their lines are the
    /// compact ones'.
    #[test]
    fn an_older_builds_json_reports_are_read() {
        let old = [
            r#"{"kind":"demand","reporter":"fe-1","body":{"period_start_unix_ms":20000,"period_end_unix_ms":30000,"samples":[{"target":{"map_unit":"u1"},"class":"","queries":5.0},{"target":{"prefix":"1.0.1.0/24"},"class":"web","queries":2.5}]}}"#,
            r#"{"kind":"load","reporter":"c1","body":{"measured_at_unix_ms":10000,"loads":[{"cluster":"fra-1","node":"cpu","load":7.0}],"servers":[{"cluster":"fra-1","address":"198.18.0.1","load":0.5}]}}"#,
        ];
        let want = reports();
        for (json, r) in old.iter().zip(&want) {
            assert_eq!(decode(json.as_bytes()).as_ref(), Ok(r));
        }
        let stored: Vec<(i64, Vec<u8>)> =
            vec![(1, old[0].as_bytes().to_vec()), (2, encode(&want[1]))];
        let lines = json_lines(&stored).expect("lines");
        let back: Vec<RecordLine> = lines
            .lines()
            .map(|l| serde_json::from_str(l).expect("a line"))
            .collect();
        assert_eq!(back.len(), 2);
        assert_eq!((back[0].at_unix_ms, &back[0].report), (1, &want[0].report));
        assert_eq!(
            (back[1].at_unix_ms, &back[1].reporter),
            (2, &"c1".to_string())
        );
        let err = json_lines(&[(9, b"garbage".to_vec())]).expect_err("garbage");
        assert!(err.contains("stored at 9 ms"), "{err}");
        assert!(decode(br#"{"kind":"x","reporter":"r","body":{}}"#).is_err());
    }
}
