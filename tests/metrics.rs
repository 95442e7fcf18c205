//! The metrics of both processes as an operator's tools see them: `promtool check metrics` on
//! a scrape right after start and after a round, every series the docs list present from
//! start, values that tell the truth (a full cluster reads exactly 1, an unchanged round's
//! churn exactly 0), every gRPC call counted with its code; the shipped alert rules through
//! `promtool check rules` and `promtool test rules`; and a real Prometheus server (Debian's,
//! unpacked) scraping both processes with those rules loaded, evaluating every query of the
//! shipped Grafana dashboard.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use cdnmap_proto::v1 as pb;
use cdnmap_tests::bin;
use cdnmap_tests::dns::Dns;
use cdnmap_tests::mapper::{authed, http_get, Server, Setup, CYCLE_SECS, TOKEN};
use serde_json::Value;
use tonic::Code;

/// The value of the series `series` (its name and labels, exactly as rendered) in `body`.
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.trim().parse().ok())
}

/// The sum over the series of `body` whose line starts with `prefix` (a name and the first
/// labels).
fn sum_of(body: &str, prefix: &str) -> f64 {
    body.lines()
        .filter(|l| l.starts_with(prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// The metric names of the table rows (`| \`name{labels}\`, ... |`) of the section of `doc`
/// that starts at the heading `heading`, up to the next `## ` heading.
fn documented(doc: &str, heading: &str) -> Vec<String> {
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("no {heading:?} in the doc"));
    let section = &doc[start + heading.len()..];
    let section = &section[..section.find("\n## ").unwrap_or(section.len())];
    let mut names = Vec::new();
    for row in section.lines().filter(|l| l.starts_with("| `")) {
        let first_cell = row.split(" | ").next().unwrap_or_default();
        for quoted in first_cell.split('`').skip(1).step_by(2) {
            let name: String = quoted
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            // (`process_*` names a family the row lists in full elsewhere.)
            let prefix = name.starts_with("cdnmap_") || name.starts_with("process_");
            if prefix && !name.ends_with('_') {
                names.push(name);
            }
        }
    }
    assert!(names.len() > 10, "{heading}: only {names:?}");
    names
}

/// Whether `body` has the metric family `name` (its `# TYPE` line).
fn has_family(body: &str, name: &str) -> bool {
    body.contains(&format!("# TYPE {name} "))
}

/// One cluster, "full", with room for exactly its three units' demand (0.1 each, 0.3 of
/// capacity: the sum is 0.30000000000000004 in floats), and "spare", everyone's second choice.
fn write_full_instance(dir: &Path) -> PathBuf {
    use serde_json::json;
    let unit = |id: &str, prefix: &str| {
        json!({"id": id, "class": "web", "demand": 0.1, "prefixes": [prefix], "lat": 50.0,
               "lon": 8.0, "candidates": [{"cluster": "full", "score": 1.0},
                                          {"cluster": "spare", "score": 5.0}]})
    };
    let cluster = |id: &str, address: &str, capacity: f64| {
        json!({"id": id, "lat": 50.0, "lon": 8.0, "addresses": [address],
               "resources": {"name": "uplink", "kind": "bps", "capacity": capacity,
                             "classes": ["web", "video", "apps"]}})
    };
    let classes: Vec<serde_json::Value> = ["web", "video", "apps"]
        .iter()
        .map(|k| json!({"name": k, "priority": 1, "per_unit": {"bps": 1.0, "fps": 1.0}}))
        .collect();
    let instance = json!({
        "traffic_classes": classes,
        "clusters": [cluster("full", "198.51.100.1", 0.3), cluster("spare", "198.51.100.2", 10.0)],
        "map_units": [unit("u1", "10.0.1.0/24"), unit("u2", "10.0.2.0/24"), unit("u3", "10.0.3.0/24")],
    });
    let path = dir.join("full.json");
    std::fs::write(&path, instance.to_string()).expect("write the instance");
    path
}

fn scrape(addr: SocketAddr) -> String {
    let (status, body) = http_get(addr, "/metrics");
    assert!(status.contains(" 200"), "{status}\n{body}");
    body
}

fn workspace_file(path: &str) -> PathBuf {
    cdnmap_tests::workspace_root().join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Waits (bounded: three cycles and ten seconds) until `server` has solved `rounds` rounds;
/// returns the scrape that says so.
async fn wait_rounds(server: &Server, rounds: f64) -> String {
    let deadline = Duration::from_secs(3 * CYCLE_SECS + 10);
    let started = Instant::now();
    loop {
        let body = scrape(server.http);
        if value(&body, "cdnmap_rounds_total").is_some_and(|n| n >= rounds) {
            return body;
        }
        assert!(
            started.elapsed() < deadline,
            "fewer than {rounds} rounds within {deadline:?}:\n{body}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The mapper's /metrics right after start and after a round: promtool finds nothing, every
/// documented series is there from start, the full cluster reads exactly 1, the unchanged
/// round's churn exactly 0; an Admin call with a wrong token and a Feedback call are counted
/// with their codes.
#[tokio::test(flavor = "multi_thread")]
async fn mapper_metrics_are_true_and_present_from_start() {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let path = write_full_instance(dir.path());
    let mut setup = Setup::with_config(bin!(), true, &format!("instance = {path:?}\n"), "");
    let server = setup.start().await;
    let body = scrape(server.http);
    cdnmap_tests::promtool_check_metrics(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));

    // Every documented series, but those the table says come with --etcd or [health].
    let doc = read(&workspace_file("docs/operations.md"));
    let later = [
        "cdnmap_leader",
        "cdnmap_leader_epoch",
        "cdnmap_etcd_reachable",
        "cdnmap_health_clusters_down",
        "cdnmap_health_monitors_fresh",
    ];
    let missing: Vec<String> = documented(&doc, "## Metrics\n")
        .into_iter()
        .filter(|n| !later.contains(&n.as_str()) && !has_family(&body, n))
        .collect();
    assert!(
        missing.is_empty(),
        "not in /metrics at start: {missing:?}\n{body}"
    );
    assert_eq!(value(&body, "cdnmap_rounds_failed_total"), Some(0.0));
    assert_eq!(
        value(
            &body,
            "cdnmap_grpc_requests_total{service=\"cdnmap.v1.Admin\",method=\"DeleteCluster\",code=\"OK\"}"
        ),
        Some(0.0),
        "every method registered at 0"
    );
    assert!(body.contains("cdnmap_build_info{version=\""), "{body}");

    // The full cluster reads exactly 1 (not 1.0000000000000002), the other 0.
    let full = "cdnmap_cluster_utilization_ratio{cluster=\"full\"}";
    assert_eq!(value(&body, full), Some(1.0), "{body}");
    assert_eq!(
        value(&body, "cdnmap_cluster_utilization_ratio{cluster=\"spare\"}"),
        Some(0.0)
    );

    // A wrong Admin token: counted as Unauthenticated, once.
    let unauthenticated = "cdnmap_grpc_requests_total{service=\"cdnmap.v1.Admin\",method=\"GetStatus\",code=\"Unauthenticated\"}";
    let before = value(&body, unauthenticated).unwrap_or(0.0);
    let refused = server
        .admin()
        .get_status(authed(pb::GetStatusRequest {}, Some("not-the-token")))
        .await
        .expect_err("a wrong token is refused");
    assert_eq!(refused.code(), Code::Unauthenticated, "{refused:?}");
    // A Feedback call, whatever its answer.
    let feedback =
        "cdnmap_grpc_requests_total{service=\"cdnmap.v1.Feedback\",method=\"ReportLoad\",";
    let feedback_before = sum_of(&body, feedback);
    let _ = server
        .feedback()
        .report_load(authed(pb::LoadReport::default(), Some(TOKEN)))
        .await;
    let body = scrape(server.http);
    assert_eq!(value(&body, unauthenticated), Some(before + 1.0), "{body}");
    assert_eq!(sum_of(&body, feedback), feedback_before + 1.0, "{body}");
    assert!(
        sum_of(
            &body,
            "cdnmap_grpc_request_duration_seconds_count{service=\"cdnmap.v1.Admin\",method=\"GetStatus\"}"
        ) >= 1.0,
        "{body}"
    );

    // After the next round, on unchanged inputs: nothing moved, exactly; still exactly full.
    let rounds = value(&body, "cdnmap_rounds_total").expect("cdnmap_rounds_total");
    let body = wait_rounds(&server, rounds + 1.0).await;
    assert_eq!(value(&body, "cdnmap_churn_ratio"), Some(0.0), "{body}");
    assert_eq!(value(&body, full), Some(1.0), "{body}");
    assert!(value(&body, "cdnmap_round_seconds_count").is_some_and(|n| n >= 1.0));
    assert!(value(&body, "cdnmap_solve_seconds_count").is_some_and(|n| n >= 1.0));
    cdnmap_tests::promtool_check_metrics(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));

    // A cluster deleted leaves no series behind after the next round (a gauge read on at its
    // last value, and an alert on it fired, until a restart).
    let deleted = server
        .admin()
        .delete_cluster(authed(
            pb::DeleteRequest { id: "spare".into() },
            Some(TOKEN),
        ))
        .await
        .expect("DeleteCluster");
    assert!(deleted.get_ref().deleted);
    // (Two rounds: the first may have started before the deletion.)
    let rounds = value(&body, "cdnmap_rounds_total").expect("cdnmap_rounds_total");
    let body = wait_rounds(&server, rounds + 2.0).await;
    assert_eq!(
        value(&body, "cdnmap_cluster_utilization_ratio{cluster=\"spare\"}"),
        None,
        "{body}"
    );
    assert_eq!(value(&body, full), Some(1.0), "{body}");
    cdnmap_tests::promtool_check_metrics(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
}

/// The demo world's rounds on unchanged inputs: every round after the first reads churn
/// exactly 0 (a sticky round re-derives its amounts, whose last bits differ: the second read
/// 4.4e-16 before churn took the solver's tolerance), and no cluster reads above 1.
#[tokio::test(flavor = "multi_thread")]
async fn the_demo_worlds_unchanged_rounds_read_churn_zero() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let (mut seen, last) = (1.0, 4.0);
    while seen < last {
        let body = wait_rounds(&server, seen + 1.0).await;
        seen = value(&body, "cdnmap_rounds_total").expect("cdnmap_rounds_total");
        assert_eq!(
            value(&body, "cdnmap_churn_ratio"),
            Some(0.0),
            "round {seen}:\n{body}"
        );
        let over: Vec<&str> = body
            .lines()
            .filter(|l| l.starts_with("cdnmap_cluster_utilization_ratio{"))
            .filter(|l| l.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) > Some(1.0))
            .collect();
        assert!(over.is_empty(), "round {seen}: {over:?}");
    }
}

/// The front end's /metrics right after start: promtool finds nothing and every documented
/// series is there; after queries, real rcodes and the batch latency histogram.
#[tokio::test(flavor = "multi_thread")]
async fn front_end_metrics_are_present_from_start() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let mut dns = Dns::start(
        bin!(),
        setup.dir.path(),
        server.grpc,
        "metrics_listen = \"127.0.0.1:0\"\n",
    );
    let metrics = dns.metrics.expect("metrics_listen");
    let body = scrape(metrics);
    cdnmap_tests::promtool_check_metrics(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
    let doc = read(&workspace_file("docs/dns.md"));
    let missing: Vec<String> = documented(&doc, "## Metrics\n")
        .into_iter()
        .filter(|n| !has_family(&body, n))
        .collect();
    assert!(
        missing.is_empty(),
        "not in /metrics at start: {missing:?}\n{body}"
    );
    let mapper = format!(
        "cdnmap_dns_reconnects_total{{mapper=\"http://{}\"}}",
        server.grpc
    );
    assert!(value(&body, &mapper).is_some(), "{body}");
    for name in [
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "process_open_fds",
    ] {
        assert!(has_family(&body, name), "{name}\n{body}");
    }

    dns.wait_answering();
    assert_eq!(dns.dig(&["www.cdn.example", "A"]).status, "NOERROR");
    assert_eq!(dns.dig(&["nope.cdn.example", "A"]).status, "NXDOMAIN");
    let body = scrape(metrics);
    let responses = |labels: &str| {
        value(&body, &format!("cdnmap_dns_responses_total{{{labels}}}")).unwrap_or(0.0)
    };
    assert!(
        responses("rcode=\"NOERROR\",answer=\"records\"") >= 1.0,
        "{body}"
    );
    assert!(
        responses("rcode=\"NXDOMAIN\",answer=\"none\"") >= 1.0,
        "{body}"
    );
    assert!(
        !body.contains("rcode=\"answer\"") && !body.contains("rcode=\"nodata\""),
        "{body}"
    );
    assert!(
        value(&body, "cdnmap_dns_udp_batch_duration_seconds_count").is_some_and(|n| n >= 2.0),
        "{body}"
    );
    cdnmap_tests::promtool_check_metrics(&body).unwrap_or_else(|e| panic!("{e}\n{body}"));
}

/// `promtool check rules` and `promtool test rules` pass on the shipped rules.
#[test]
fn shipped_rules_pass_promtool() {
    let promtool = cdnmap_tests::unpacked_debian_program("prometheus", "usr/bin/promtool")
        .unwrap_or_else(|e| panic!("{e}"));
    let dir = workspace_file("deploy/prometheus");
    for args in [
        ["check", "rules", "cdnmap.rules.yml"],
        ["test", "rules", "cdnmap.rules.test.yml"],
    ] {
        let out = Command::new(&promtool)
            .args(args)
            .current_dir(&dir)
            .stdin(Stdio::null())
            .output()
            .expect("promtool runs");
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(out.status.success(), "promtool {}:\n{said}", args.join(" "));
        assert!(
            said.contains("SUCCESS"),
            "promtool {}:\n{said}",
            args.join(" ")
        );
    }
}

/// A Prometheus server the test started; killed and reaped when dropped.
struct Prometheus {
    child: std::process::Child,
    addr: SocketAddr,
    log: PathBuf,
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Prometheus {
    /// Prometheus on a free loopback port (found by binding port 0: it takes no port 0 itself),
    /// scraping `serve` and `dns` every second, with the shipped rules evaluated every second.
    fn start(dir: &Path, serve: SocketAddr, dns: SocketAddr) -> Prometheus {
        let bin = cdnmap_tests::unpacked_debian_program("prometheus", "usr/bin/prometheus")
            .unwrap_or_else(|e| panic!("{e}"));
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port");
        let rules = workspace_file("deploy/prometheus/cdnmap.rules.yml");
        let config = format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n\
             rule_files: [{rules:?}]\n\
             scrape_configs:\n\
             \x20 - job_name: cdnmap-serve\n    static_configs: [{{targets: [\"{serve}\"]}}]\n\
             \x20 - job_name: cdnmap-dns\n    static_configs: [{{targets: [\"{dns}\"]}}]\n"
        );
        let conf = dir.join("prometheus.yml");
        std::fs::write(&conf, config).expect("write prometheus.yml");
        let log = dir.join("prometheus.log");
        let out = std::fs::File::create(&log).expect("the log");
        let child = Command::new(bin)
            .arg(format!("--config.file={}", conf.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.join("tsdb").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdin(Stdio::null())
            .stdout(out.try_clone().expect("the log"))
            .stderr(out)
            .spawn()
            .expect("prometheus starts");
        Prometheus { child, addr, log }
    }

    /// `GET /api/v1/<path>` as JSON; `None` while Prometheus does not answer yet.
    fn api(&self, path: &str) -> Option<Value> {
        std::net::TcpStream::connect(self.addr).ok()?;
        let (status, body) = http_get(self.addr, &format!("/api/v1/{path}"));
        if status.is_empty() {
            return None;
        }
        serde_json::from_str(&body).ok()
    }

    /// `query` evaluated now: the answer's JSON (whatever its status); `None` while
    /// Prometheus does not answer yet.
    fn try_query(&self, query: &str) -> Option<Value> {
        self.api(&format!("query?query={}", encode(query)))
    }

    /// [`Prometheus::try_query`], which must be answered.
    fn query(&self, query: &str) -> Value {
        self.try_query(query)
            .unwrap_or_else(|| panic!("no answer to {query}:\n{}", self.log()))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Polls `check` every 250 ms until it gives something, for at most `within`.
    fn wait_for<T>(&self, what: &str, within: Duration, mut check: impl FnMut() -> Option<T>) -> T {
        let started = Instant::now();
        loop {
            if let Some(t) = check() {
                return t;
            }
            assert!(
                started.elapsed() < within,
                "{what}: not within {within:?}\n{}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }
}

/// `s` percent-encoded for a URL's query (RFC 3986: all but the unreserved characters).
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The expressions of every panel of the shipped Grafana dashboard, with its variables as
/// Prometheus takes them (`$__rate_interval` a minute, `$job` every job); checks on the way
/// that each panel has a unit and the dashboard a data source variable.
fn dashboard_queries() -> Vec<(String, String)> {
    let dash: Value = serde_json::from_str(&read(&workspace_file("deploy/grafana/cdnmap.json")))
        .expect("the dashboard is JSON");
    assert!(
        dash["schemaVersion"].as_u64().is_some_and(|v| v >= 36),
        "schemaVersion"
    );
    let variables = dash["templating"]["list"].as_array().expect("variables");
    assert!(
        variables
            .iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus data source variable"
    );
    let mut queries = Vec::new();
    for panel in dash["panels"].as_array().expect("panels") {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel["title"].as_str().unwrap_or("?").to_string();
        let unit = panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .unwrap_or("");
        assert!(!unit.is_empty(), "panel {title:?} has no unit");
        assert_eq!(
            panel["datasource"]["uid"], "${datasource}",
            "panel {title:?}"
        );
        for target in panel["targets"].as_array().expect("targets") {
            let expr = target["expr"].as_str().expect("an expression");
            let expr = expr.replace("$__rate_interval", "1m").replace("$job", ".*");
            queries.push((title.clone(), expr));
        }
    }
    assert!(queries.len() >= 20, "{queries:?}");
    queries
}

/// A real Prometheus scrapes both processes: both targets up, the shipped rules loaded and
/// evaluated with health "ok", and every query of the Grafana dashboard accepted.
#[tokio::test(flavor = "multi_thread")]
async fn a_real_prometheus_scrapes_both_and_takes_the_rules_and_the_dashboard() {
    let queries = dashboard_queries();
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let dns = Dns::start(
        bin!(),
        setup.dir.path(),
        server.grpc,
        "metrics_listen = \"127.0.0.1:0\"\n",
    );
    let dir = tempfile::tempdir().expect("a temporary directory");
    let prometheus = Prometheus::start(
        dir.path(),
        server.http,
        dns.metrics.expect("metrics_listen"),
    );
    let within = Duration::from_secs(60);
    // Both targets scraped, and up.
    prometheus.wait_for("both targets up", within, || {
        let up = prometheus.try_query("up")?;
        let result = up["data"]["result"].as_array()?;
        let up: Vec<&str> = result
            .iter()
            .filter(|r| r["value"][1] == "1")
            .filter_map(|r| r["metric"]["job"].as_str())
            .collect();
        (up.contains(&"cdnmap-serve") && up.contains(&"cdnmap-dns")).then_some(())
    });
    // Every rule of the file loaded and evaluated, each healthy.
    let shipped = read(&workspace_file("deploy/prometheus/cdnmap.rules.yml"))
        .lines()
        .filter(|l| l.trim_start().starts_with("- alert: "))
        .count();
    let rules = prometheus.wait_for("the rules evaluated", within, || {
        let answer = prometheus.api("rules")?;
        let rules: Vec<Value> = answer["data"]["groups"]
            .as_array()?
            .iter()
            .flat_map(|g| g["rules"].as_array().cloned().unwrap_or_default())
            .collect();
        let evaluated = rules.iter().all(|r| {
            !r["lastEvaluation"]
                .as_str()
                .unwrap_or("0001")
                .starts_with("0001")
        });
        (rules.len() == shipped && evaluated).then_some(rules)
    });
    let unhealthy: Vec<String> = rules
        .iter()
        .filter(|r| r["health"] != "ok")
        .map(|r| format!("{}: {} {}", r["name"], r["health"], r["lastError"]))
        .collect();
    assert!(unhealthy.is_empty(), "{unhealthy:?}");
    // Every panel's query is accepted; the build info and process metrics of both are there.
    let refused: Vec<String> = queries
        .iter()
        .filter_map(|(title, expr)| {
            let answer = prometheus.query(expr);
            (answer["status"] != "success").then(|| format!("{title}: {expr}: {answer}"))
        })
        .collect();
    assert!(refused.is_empty(), "{refused:#?}");
    for (query, series) in [
        ("cdnmap_build_info", 2),
        ("process_resident_memory_bytes{job=~\"cdnmap-.*\"}", 2),
        ("cdnmap_dns_mapper_connected == 1", 1),
    ] {
        prometheus.wait_for(query, within, || {
            let answer = prometheus.query(query);
            (answer["data"]["result"].as_array()?.len() == series).then_some(())
        });
    }
}
