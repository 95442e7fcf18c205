//! `cdnmap record export`: a period of a running (or stopped) system's demand record, as a
//! trace (`docs/trace.md`) that `cdnmap replay` reads.
//!
//! A running server holds its sled store locked, so the record is read through its HTTP
//! listener (`GET /record?from_ms=&to_ms=`); a stopped server's store can be read directly
//! (`--data-dir`). Either way the reports come as JSON Lines of
//! [`cdnmap_api::record::RecordLine`], the one type the service writes them with.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cdnmap_api::record::{RecordLine, Report, Target};

use cdnmap_world::trace::{Header, Load, Record};

/// The stored reports (JSON Lines as `/record` serves them) as a trace. A demand sample becomes
/// a record at its period's start, with its query count as the demand; a load report, load
/// records at its measurement time. Records are put in time order, and the trace starts at the
/// earliest of them (`from_ms` when there are none): reports are selected by when they arrived,
/// but keep the times they describe.
pub fn to_trace(lines: &str, from_ms: i64, round_ms: i64) -> Result<(Header, Vec<Record>)> {
    let mut records = Vec::new();
    for (i, line) in lines
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let n = i + 1;
        let line: RecordLine =
            serde_json::from_str(line).with_context(|| format!("record line {n}"))?;
        match line.report {
            Report::Demand(body) => {
                let t = body.period_start_unix_ms;
                for s in body.samples {
                    records.push(match s.target {
                        Target::MapUnit(map_unit) => Record::Unit {
                            t,
                            map_unit,
                            demand: s.queries,
                        },
                        Target::Prefix(prefix) => Record::Prefix {
                            t,
                            prefix,
                            class: s.class,
                            demand: s.queries,
                        },
                    });
                }
            }
            Report::Load(body) => {
                for l in body.loads {
                    records.push(Record::Load {
                        t: body.measured_at_unix_ms,
                        load: Load {
                            cluster: l.cluster,
                            node: l.node,
                            value: l.load,
                        },
                    });
                }
            }
        }
    }
    records.sort_by_key(Record::t);
    Ok((
        Header {
            round_ms,
            start_ms: records.first().map_or(from_ms, Record::t),
            true_per_unit: Default::default(),
        },
        records,
    ))
}

/// The record of `[from_ms, to_ms)` from a running server's HTTP listener, with its Admin
/// `token` (`/record` needs it).
pub fn fetch(addr: SocketAddr, token: Option<&str>, from_ms: i64, to_ms: i64) -> Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(10))
        .with_context(|| format!("connecting to {addr} (is `cdnmap serve` running?)"))?;
    stream.set_read_timeout(Some(Duration::from_secs(300)))?;
    let authorization = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        stream,
        "GET /record?from_ms={from_ms}&to_ms={to_ms} HTTP/1.1\r\nHost: {addr}\r\n{authorization}Connection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let response = String::from_utf8(response).context("the response is not UTF-8")?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("a malformed HTTP response")?;
    let status = head.lines().next().unwrap_or_default();
    if !status.contains(" 200 ") {
        bail!("{addr}: {status}: {}", body.trim());
    }
    if head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked")
    {
        bail!("{addr}: a chunked response, which this client does not read");
    }
    Ok(body.to_string())
}

/// The record of `[from_ms, to_ms)` from a stopped server's store.
pub fn read_store(data_dir: &Path, from_ms: i64, to_ms: i64) -> Result<String> {
    let store = cdnmap_api::Store::open(data_dir)
        .context("opening the store (if `cdnmap serve` is running on it, use --http instead)")?;
    cdnmap_api::record::json_lines(&store.reports(from_ms, to_ms)?).map_err(anyhow::Error::msg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn demand_and_load_reports_become_trace_records_in_time_order() {
        let lines = r#"{"at_unix_ms":20,"reporter":"fe1","report":{"demand":{"period_start_unix_ms":20000,"period_end_unix_ms":30000,"samples":[{"target":{"map_unit":"u1"},"class":"","queries":5.0},{"target":{"prefix":"1.0.1.0/24"},"class":"web","queries":2.5}]}}}
{"at_unix_ms":10,"reporter":"c1","report":{"load":{"measured_at_unix_ms":10000,"loads":[{"cluster":"fra-1","node":"cpu","load":7.0}]}}}
"#;
        let (h, records) = to_trace(lines, 0, 10_000).expect("converts");
        assert_eq!((h.start_ms, h.round_ms), (10_000, 10_000));
        assert_eq!(records.len(), 3);
        assert!(matches!(&records[0], Record::Load { t: 10_000, load } if load.value == 7.0));
        assert!(
            matches!(&records[1], Record::Unit { t: 20_000, map_unit, demand } if map_unit == "u1" && *demand == 5.0)
        );
        assert!(
            matches!(&records[2], Record::Prefix { class, demand, .. } if class == "web" && *demand == 2.5)
        );
        assert!(to_trace(
            "{\"at_unix_ms\":1,\"reporter\":\"r\",\"report\":{\"x\":{}}}",
            0,
            1
        )
        .is_err());
        assert!(to_trace("garbage", 0, 1).is_err());
    }
}
