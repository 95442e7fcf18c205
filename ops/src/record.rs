//! `cdnmap record export`: a period of a running (or stopped) system's demand record, as a
//! trace (`docs/trace.md`) that `cdnmap replay` reads.
//!
//! A running server holds its sled store locked, so the record is read through its HTTP
//! listener (`GET /record?from_ms=&to_ms=`); a stopped server's store can be read directly
//! (`--data-dir`). Either way the reports come as JSON Lines of
//! [`cdnmap_store::record::RecordLine`], the one type the service writes them with.

use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use cdnmap_store::record::{RecordLine, Report, Target};

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
            // A replay maps with the topology's scores: measured RTTs are not replayed.
            Report::Rtt(_) => {}
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
/// `token` (`/record` needs it): hyper's HTTP/1.1 client (the record comes streamed, chunked).
pub fn fetch(addr: SocketAddr, token: Option<&str>, from_ms: i64, to_ms: i64) -> Result<String> {
    use http_body_util::BodyExt;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    runtime.block_on(async {
        let tcp = tokio::time::timeout(
            Duration::from_secs(10),
            tokio::net::TcpStream::connect(addr),
        )
        .await
        .map_err(|_| anyhow::anyhow!("connecting to {addr}: timed out"))?
        .with_context(|| format!("connecting to {addr} (is `cdnmap serve` running?)"))?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tcp)).await?;
        tokio::spawn(conn);
        let mut request = hyper::Request::get(format!("/record?from_ms={from_ms}&to_ms={to_ms}"))
            .header("host", addr.to_string());
        if let Some(t) = token {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        let fetched = async {
            let response = sender
                .send_request(request.body(http_body_util::Empty::<hyper::body::Bytes>::new())?)
                .await?;
            let status = response.status();
            let body = response.into_body().collect().await?.to_bytes();
            anyhow::Ok((status, body))
        };
        let (status, body) = tokio::time::timeout(Duration::from_secs(300), fetched)
            .await
            .map_err(|_| anyhow::anyhow!("{addr}: no whole record within 300 s"))??;
        let body = String::from_utf8(body.to_vec()).context("the response is not UTF-8")?;
        if !status.is_success() {
            // The server's errors are `{"error": "..."}` (the dashboard's form).
            let shown = serde_json::from_str::<serde_json::Value>(&body)
                .ok()
                .and_then(|v| v["error"].as_str().map(str::to_string))
                .unwrap_or_else(|| body.trim().to_string());
            bail!("{addr}: {status}: {shown}");
        }
        Ok(body)
    })
}

/// The record of `[from_ms, to_ms)` from a stopped server's store.
pub fn read_store(data_dir: &Path, from_ms: i64, to_ms: i64) -> Result<String> {
    let store = cdnmap_store::Store::open(data_dir)
        .context("opening the store (if `cdnmap serve` is running on it, use --http instead)")?;
    cdnmap_store::record::json_lines(&store.reports(from_ms, to_ms)?).map_err(anyhow::Error::msg)
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
