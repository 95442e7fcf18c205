//! The demand trace format (`docs/trace.md`): JSON Lines, one record per line, in time order.
//!
//! ```text
//! {"header": {"round_ms": 10000, "start_ms": 1764460800000, "true_per_unit": {"web": {"bps": 1.3, "fps": 0.6}}}}
//! {"t": 1764460800000, "map_unit": "u00000001-web", "demand": 12.5}
//! {"t": 1764460800000, "prefix": "1.0.1.0/24", "class": "video", "demand": 3.25}
//! {"t": 1764460800000, "load": {"cluster": "fra-1", "node": "cpu", "value": 118.0}}
//! {"t": 1764460810000, "state": {"cluster": "fra-1", "to": "down"}}
//! ```
//!
//! Reading is strict: a line that is not one of these records (an unknown key included, at
//! every level: the header, its `true_per_unit`, a load, a state), a time that goes backwards,
//! or a negative or non-finite number is an error naming the file and the line
//! (`trace.jsonl:7: ...`; `trace.jsonl:7:40: ...` with the column when serde found it);
//! nothing is skipped.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use anyhow::{bail, Context, Result};
use cdnmap_mapper::{ClusterState, PerUnit};
use ipnet::IpNet;
use serde::{Deserialize, Serialize};

/// The most records one trace may hold (a day of 10 s rounds at a few hundred thousand
/// units fits; more is refused rather than exhausting memory).
pub const MAX_RECORDS: usize = 200_000_000;

/// The first line of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Header {
    /// The round length the trace was recorded (or generated) at.
    pub round_ms: i64,
    /// The time of the first round.
    pub start_ms: i64,
    /// For synthetic traces: what one unit of each class really costs, so a replay can compute
    /// the loads it would have measured.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub true_per_unit: BTreeMap<String, PerUnit>,
}

/// A measured load of one resource node.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Load {
    pub cluster: String,
    pub node: String,
    pub value: f64,
}

/// A cluster changing state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateChange {
    pub cluster: String,
    pub to: ClusterState,
}

/// One line of a trace after the header.
#[derive(Debug, Clone, PartialEq)]
pub enum Record {
    /// Demand of a map unit over the round starting at `t`.
    Unit {
        t: i64,
        map_unit: String,
        demand: f64,
    },
    /// Demand of a client prefix and class over the round starting at `t`.
    Prefix {
        t: i64,
        prefix: IpNet,
        class: String,
        demand: f64,
    },
    Load {
        t: i64,
        load: Load,
    },
    State {
        t: i64,
        state: StateChange,
    },
}

impl Record {
    pub fn t(&self) -> i64 {
        match self {
            Record::Unit { t, .. }
            | Record::Prefix { t, .. }
            | Record::Load { t, .. }
            | Record::State { t, .. } => *t,
        }
    }
}

/// The JSON shape of a line (exactly one of the payload fields).
#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Line {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    header: Option<Header>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    t: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    map_unit: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    prefix: Option<IpNet>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    class: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    demand: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    load: Option<Load>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    state: Option<StateChange>,
}

fn number(what: &str, x: f64) -> Result<f64> {
    if x.is_finite() && x >= 0.0 {
        Ok(x)
    } else {
        bail!(
            "{what} is {}, must be a finite number >= 0",
            cdnmap_mapper::model::shown_number(x)
        )
    }
}

fn record_of(line: Line) -> Result<Record> {
    let t = line.t.context("no \"t\" (the record's time, Unix ms)")?;
    let record = match (line.map_unit, line.prefix, line.load, line.state) {
        (Some(map_unit), None, None, None) => {
            if line.class.is_some() {
                bail!("a map_unit record has no \"class\" (the unit has one)");
            }
            Record::Unit {
                t,
                map_unit,
                demand: number("demand", line.demand.context("no \"demand\"")?)?,
            }
        }
        (None, Some(prefix), None, None) => Record::Prefix {
            t,
            prefix: prefix.trunc(),
            class: line.class.context("a prefix record needs a \"class\"")?,
            demand: number("demand", line.demand.context("no \"demand\"")?)?,
        },
        (None, None, Some(_), None) | (None, None, None, Some(_)) if line.class.is_some() => {
            bail!("only a prefix record has a \"class\"")
        }
        (None, None, Some(load), None) => {
            number("load.value", load.value)?;
            Record::Load { t, load }
        }
        (None, None, None, Some(state)) => Record::State { t, state },
        _ => bail!("needs exactly one of \"map_unit\", \"prefix\", \"load\" or \"state\""),
    };
    if line.demand.is_some() && matches!(record, Record::Load { .. } | Record::State { .. }) {
        bail!("\"demand\" belongs to map_unit and prefix records");
    }
    Ok(record)
}

/// The most characters of serde's message a trace error repeats (an unknown key of a
/// megabyte is shown cut).
const MAX_SHOWN_CHARS: usize = 512;

/// A line that is not JSON, or not a record's shape (an unknown key, a wrong type), as
/// `name:line:column: message`: the column is serde's, within the line.
fn json_error(name: &str, n: usize, e: &serde_json::Error) -> anyhow::Error {
    let mut message = e.to_string();
    let suffix = format!(" at line {} column {}", e.line(), e.column());
    if let Some(cut) = message.strip_suffix(&suffix) {
        message = cut.to_string();
    }
    if message.chars().count() > MAX_SHOWN_CHARS {
        message = message.chars().take(MAX_SHOWN_CHARS).collect::<String>() + "…";
    }
    anyhow::anyhow!("{name}:{n}:{}: {message}", e.column())
}

/// Reads a whole trace. `name` names it in errors, with the line (and for a line that is not
/// a record's JSON, the column): `trace.jsonl:7:40: unknown field `demnd`, expected ...`,
/// `trace.jsonl:9: time 10000 is before the previous record's 20000`.
pub fn read(input: impl BufRead, name: &str) -> Result<(Header, Vec<Record>)> {
    let mut header = None;
    let mut records = Vec::new();
    let mut last_t = i64::MIN;
    for (i, line) in input.lines().enumerate() {
        let n = i + 1;
        let line = line.with_context(|| format!("{name}:{n}"))?;
        if line.trim().is_empty() {
            continue;
        }
        let mut parsed: Line = serde_json::from_str(&line).map_err(|e| json_error(name, n, &e))?;
        if let Some(h) = parsed.header.take() {
            let Line {
                t,
                map_unit,
                prefix,
                class,
                demand,
                load,
                state,
                ..
            } = &parsed;
            if t.is_some()
                || map_unit.is_some()
                || prefix.is_some()
                || class.is_some()
                || demand.is_some()
                || load.is_some()
                || state.is_some()
            {
                bail!("{name}:{n}: a header line holds the header only (a record is a line of its own)");
            }
            if header.is_some() || !records.is_empty() {
                bail!("{name}:{n}: a header may only be the first line");
            }
            if h.round_ms <= 0 {
                bail!("{name}:{n}: header.round_ms is {}, must be > 0", h.round_ms);
            }
            header = Some(h);
            continue;
        }
        if header.is_none() {
            bail!("{name}:{n}: the first line must be the header");
        }
        let record = record_of(parsed).with_context(|| format!("{name}:{n}"))?;
        if record.t() < last_t {
            bail!(
                "{name}:{n}: time {} is before the previous record's {last_t}",
                record.t()
            );
        }
        last_t = record.t();
        if records.len() >= MAX_RECORDS {
            bail!("{name}: more than {MAX_RECORDS} records");
        }
        records.push(record);
    }
    let header = header.with_context(|| format!("{name}: empty (no header)"))?;
    Ok((header, records))
}

/// Writes one record as a line.
pub fn write_record(out: &mut impl Write, r: &Record) -> Result<()> {
    let line = match r.clone() {
        Record::Unit {
            t,
            map_unit,
            demand,
        } => Line {
            t: Some(t),
            map_unit: Some(map_unit),
            demand: Some(demand),
            ..Line::default()
        },
        Record::Prefix {
            t,
            prefix,
            class,
            demand,
        } => Line {
            t: Some(t),
            prefix: Some(prefix),
            class: Some(class),
            demand: Some(demand),
            ..Line::default()
        },
        Record::Load { t, load } => Line {
            t: Some(t),
            load: Some(load),
            ..Line::default()
        },
        Record::State { t, state } => Line {
            t: Some(t),
            state: Some(state),
            ..Line::default()
        },
    };
    serde_json::to_writer(&mut *out, &line)?;
    out.write_all(b"\n")?;
    Ok(())
}

/// Writes the header line.
pub fn write_header(out: &mut impl Write, h: &Header) -> Result<()> {
    serde_json::to_writer(
        &mut *out,
        &Line {
            header: Some(h.clone()),
            ..Line::default()
        },
    )?;
    out.write_all(b"\n")?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            round_ms: 10_000,
            start_ms: 0,
            true_per_unit: BTreeMap::from([("web".to_string(), PerUnit { bps: 1.3, fps: 0.6 })]),
        }
    }

    #[test]
    fn records_round_trip() {
        let records = vec![
            Record::Unit {
                t: 0,
                map_unit: "u1".into(),
                demand: 12.5,
            },
            Record::Prefix {
                t: 0,
                prefix: "1.0.1.0/24".parse().expect("net"),
                class: "video".into(),
                demand: 3.25,
            },
            Record::Load {
                t: 10_000,
                load: Load {
                    cluster: "fra-1".into(),
                    node: "cpu".into(),
                    value: 118.0,
                },
            },
            Record::State {
                t: 10_000,
                state: StateChange {
                    cluster: "fra-1".into(),
                    to: ClusterState::Down,
                },
            },
        ];
        let mut out = Vec::new();
        write_header(&mut out, &header()).expect("header");
        for r in &records {
            write_record(&mut out, r).expect("record");
        }
        let (h, back) = read(out.as_slice(), "t.jsonl").expect("reads");
        assert_eq!(h, header());
        assert_eq!(back, records);
    }

    /// Every malformed line is an error naming its line number; nothing is skipped.
    #[test]
    fn malformed_lines_name_their_line_number() {
        let head = r#"{"header": {"round_ms": 10000, "start_ms": 0}}"#;
        let cases = [
            ("not json", "t.jsonl:2:2: expected ident"),
            (r#"{"t": 0, "demand": 1}"#, "t.jsonl:2: "),
            (r#"{"map_unit": "u", "demand": 1}"#, "t.jsonl:2: "),
            (r#"{"t": 0, "map_unit": "u"}"#, "t.jsonl:2: "),
            (r#"{"t": 0, "map_unit": "u", "demand": -1}"#, "t.jsonl:2: "),
            (
                r#"{"t": 0, "map_unit": "u", "demand": 1, "class": "web"}"#,
                "t.jsonl:2: ",
            ),
            (
                r#"{"t": 0, "prefix": "1.0.1.0/24", "demand": 1}"#,
                "t.jsonl:2: ",
            ),
            (
                r#"{"t": 0, "prefix": "1.0.1.0/33", "class": "web", "demand": 1}"#,
                "t.jsonl:2:31: invalid IP address syntax",
            ),
            (
                r#"{"t": 0, "map_unit": "u", "prefix": "1.0.1.0/24", "demand": 1}"#,
                "t.jsonl:2: ",
            ),
            (
                r#"{"t": 0, "load": {"cluster": "c", "node": "n", "value": -5}}"#,
                "t.jsonl:2: ",
            ),
            (
                r#"{"t": 0, "state": {"cluster": "c", "to": "sideways"}}"#,
                "t.jsonl:2:51: unknown variant `sideways`",
            ),
            (
                r#"{"t": 0, "map_unit": "u", "demand": 1, "extra": 1}"#,
                "t.jsonl:2:46: unknown field `extra`, expected one of",
            ),
            (
                r#"{"t": 0, "load": {"cluster": "c", "node": "n", "valu": 5}}"#,
                "t.jsonl:2:53: unknown field `valu`, expected one of",
            ),
            (
                r#"{"t": 0, "state": {"cluster": "c", "to": "down", "at": 5}}"#,
                "t.jsonl:2:53: unknown field `at`, expected `cluster` or `to`",
            ),
            (
                r#"{"t": 0, "load": {"cluster": "c", "node": "n", "value": 5}, "class": "web"}"#,
                "t.jsonl:2: only a prefix record has a \"class\"",
            ),
            (
                r#"{"t": 0, "state": {"cluster": "c", "to": "down"}, "class": "web"}"#,
                "t.jsonl:2: only a prefix record has a \"class\"",
            ),
        ];
        for (line, want) in cases {
            let text = format!("{head}\n{line}\n");
            let err = read(text.as_bytes(), "t.jsonl").expect_err(line);
            let msg = format!("{err:#}");
            assert!(msg.starts_with(want), "{line}: {msg}");
        }
        let backwards = format!(
            "{head}\n{}\n{}\n",
            r#"{"t": 10, "map_unit": "u", "demand": 1}"#,
            r#"{"t": 5, "map_unit": "u", "demand": 1}"#
        );
        let msg = format!(
            "{:#}",
            read(backwards.as_bytes(), "t").expect_err("backwards")
        );
        assert!(msg.starts_with("t:3: time 5 is before"), "{msg}");
        assert!(read(r#"{"t": 0, "map_unit": "u", "demand": 1}"#.as_bytes(), "t").is_err());
        assert!(read("".as_bytes(), "t").is_err());
        let two_headers = format!("{head}\n{head}\n");
        assert!(read(two_headers.as_bytes(), "t").is_err());
        // A header line with a record's fields: refused, not read as the header alone (the
        // record was lost).
        let both = r#"{"header": {"round_ms": 10000, "start_ms": 0}, "t": 0, "map_unit": "u", "demand": 5}"#;
        let msg = format!("{:#}", read(both.as_bytes(), "t").expect_err("both"));
        assert!(
            msg.starts_with("t:1: a header line holds the header only"),
            "{msg}"
        );
    }

    /// The header refuses unknown keys at every level, with the line and column.
    #[test]
    fn the_header_refuses_unknown_keys() {
        let cases = [
            (
                r#"{"header": {"round_ms": 10000, "start_ms": 0, "round": 1}}"#,
                "h:1:53: unknown field `round`, expected one of",
            ),
            (
                r#"{"header": {"round_ms": 10000, "start_ms": 0, "true_per_unit": {"web": {"bps": 1, "fps": 1, "rtt": 1}}}}"#,
                "h:1:97: unknown field `rtt`, expected `bps` or `fps`",
            ),
            (
                r#"{"headr": {"round_ms": 10000, "start_ms": 0}}"#,
                "h:1:8: unknown field `headr`, expected one of",
            ),
        ];
        for (line, want) in cases {
            let msg = format!("{:#}", read(line.as_bytes(), "h").expect_err(line));
            assert!(msg.starts_with(want), "{line}: {msg}");
        }
    }
}
