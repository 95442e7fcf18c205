//! `cdnmap monitor`: a health-check process apart from the mapper (issue 19, point 4), as
//! Traffic Control's Traffic Monitors are. Every interval it reports its verdicts on the
//! clusters' addresses to each mapper (Feedback's `ReportHealth`), and the answer says what to
//! probe next and how (the mapper's `[health]`: one configuration, on the mapper). Its verdicts
//! go through the same anti-flap thresholds as the mapper's own probes (`api::health::Flap`);
//! with several monitors, the mapper takes an address down on a quorum of down votes.
//!
//! It probes only what a mapper names (the topology's cluster addresses at the configured
//! port): nothing else on the network. It reaches the mappers as `cdnmap dns` does (the same
//! configuration keys: `mapper`, `mapper_ca_file`, `cert_file`, `key_file`, `feedback_token`,
//! `name`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Result;
use cdnmap_api::config::{HealthConfig, ProbeKind};
use cdnmap_api::health::{Health, Probe, Target};
use cdnmap_dns::MapperLink;
use cdnmap_proto::v1 as pb;
use cdnmap_proto::v1::feedback_client::FeedbackClient;

/// How long a monitor waits between tries while no mapper has told it what to probe.
const RETRY: Duration = Duration::from_secs(1);

/// The probe settings a mapper's answer gives: what decides whether the monitor's thresholds
/// start over.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Settings {
    interval_ms: u64,
    timeout_ms: u64,
    fall: u32,
    rise: u32,
}

/// Runs the monitor named `name` against `links` until `stop` resolves.
pub async fn run(
    name: String,
    links: Vec<MapperLink>,
    stop: impl std::future::Future<Output = ()>,
) -> Result<()> {
    tokio::pin!(stop);
    let mut state: Option<(Settings, Arc<Health>)> = None;
    loop {
        let started = tokio::time::Instant::now();
        let verdicts: Vec<pb::AddressHealth> = state
            .as_ref()
            .map(|(_, h)| {
                h.own_verdicts()
                    .into_iter()
                    .map(|(cluster, addr, up, error)| pb::AddressHealth {
                        cluster,
                        address: addr.to_string(),
                        up,
                        error: cut(error, cdnmap_api::feedback::MAX_HEALTH_ERROR),
                    })
                    .collect()
            })
            .unwrap_or_default();
        // Every mapper hears the verdicts (each replica solves its own rounds); the first
        // that answers says what to probe.
        let mut told: Option<pb::HealthAck> = None;
        for link in &links {
            match report(link, &name, verdicts.clone()).await {
                Ok(ack) => {
                    told.get_or_insert(ack);
                }
                Err(e) => {
                    tracing::warn!(mapper = %link.url, error = %e, "monitor: the report failed")
                }
            }
        }
        let Some(ack) = told else {
            tokio::select! {
                _ = tokio::time::sleep(RETRY) => continue,
                _ = &mut stop => return Ok(()),
            }
        };
        let settings = Settings {
            interval_ms: ack.interval_ms.clamp(100, 600_000),
            timeout_ms: ack.timeout_ms.clamp(10, 60_000),
            fall: ack.fall.clamp(1, 100),
            rise: ack.rise.clamp(1, 100),
        };
        let health = match &state {
            Some((s, h)) if *s == settings => Arc::clone(h),
            _ => {
                tracing::info!(?settings, "monitor: probing as the mapper says");
                let h = Arc::new(Health::new(config_of(settings)));
                state = Some((settings, Arc::clone(&h)));
                h
            }
        };
        let targets = targets_of(&ack.targets);
        let interval = Duration::from_millis(settings.interval_ms);
        tokio::select! {
            _ = health.sweep_targets(targets) => {}
            _ = &mut stop => return Ok(()),
        }
        tokio::select! {
            _ = tokio::time::sleep_until(started + interval) => {}
            _ = &mut stop => return Ok(()),
        }
    }
}

/// One `ReportHealth` call to `link`, within a few seconds.
async fn report(
    link: &MapperLink,
    name: &str,
    addresses: Vec<pb::AddressHealth>,
) -> Result<pb::HealthAck> {
    let call = async {
        let channel = link.connect().await?;
        let ack = FeedbackClient::new(channel)
            .report_health(link.request(pb::HealthReport {
                monitor: name.to_string(),
                addresses,
            }))
            .await?;
        anyhow::Ok(ack.into_inner())
    };
    tokio::time::timeout(Duration::from_secs(5), call)
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 5 s"))?
}

/// The `[health]` a monitor probes under: the mapper's settings, every target as given.
fn config_of(s: Settings) -> HealthConfig {
    HealthConfig {
        interval_ms: s.interval_ms,
        timeout_ms: s.timeout_ms,
        fall: s.fall,
        rise: s.rise,
        kind: ProbeKind::Tcp,
        port: 1,
        path: "/".into(),
        expect_status: 200,
        clusters: Default::default(),
        local: true,
        monitors: Vec::new(),
        quorum: None,
    }
}

/// The targets of a mapper's answer; one that cannot be read is skipped, with a warning.
fn targets_of(given: &[pb::ProbeTarget]) -> Vec<Target> {
    let mut out = Vec::new();
    for t in given {
        let kind = match t.kind.as_str() {
            "tcp" => ProbeKind::Tcp,
            "http" => ProbeKind::Http,
            other => {
                tracing::warn!(cluster = %t.cluster, kind = other, "monitor: an unknown probe kind; skipped");
                continue;
            }
        };
        let (Ok(expect_status), true) = (
            u16::try_from(t.expect_status),
            t.path.starts_with('/') && !t.path.contains(char::is_whitespace),
        ) else {
            tracing::warn!(cluster = %t.cluster, "monitor: a probe's path or status is unusable; skipped");
            continue;
        };
        for a in &t.addresses {
            let Ok(addr) = a.parse::<SocketAddr>() else {
                tracing::warn!(cluster = %t.cluster, address = %a, "monitor: not an IP:port; skipped");
                continue;
            };
            out.push((
                t.cluster.clone(),
                addr,
                Probe {
                    kind,
                    port: addr.port(),
                    path: t.path.clone(),
                    expect_status,
                },
            ));
        }
    }
    out
}

/// `text` cut to at most `max` bytes, at a character boundary.
fn cut(mut text: String, max: usize) -> String {
    if text.len() > max {
        let mut end = max;
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_are_read_and_bad_ones_skipped() {
        let given = vec![
            pb::ProbeTarget {
                cluster: "a".into(),
                addresses: vec!["127.0.0.2:80".into(), "nonsense".into()],
                kind: "http".into(),
                path: "/health".into(),
                expect_status: 204,
            },
            pb::ProbeTarget {
                cluster: "b".into(),
                addresses: vec!["127.0.0.3:81".into()],
                kind: "icmp".into(),
                path: "/".into(),
                expect_status: 200,
            },
            pb::ProbeTarget {
                cluster: "c".into(),
                addresses: vec!["127.0.0.4:81".into()],
                kind: "http".into(),
                path: "/a b".into(),
                expect_status: 200,
            },
        ];
        let t = targets_of(&given);
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].0, "a");
        assert_eq!(t[0].1, "127.0.0.2:80".parse::<SocketAddr>().expect("addr"));
        assert_eq!(t[0].2.expect_status, 204);
        assert_eq!(t[0].2.kind, ProbeKind::Http);
    }

    #[test]
    fn errors_are_cut_at_a_character() {
        assert_eq!(cut("ééé".into(), 3), "é");
        assert_eq!(cut("abc".into(), 5), "abc");
    }
}
