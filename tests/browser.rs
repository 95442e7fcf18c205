//! The dashboard in a real browser (issue 8): headless Chromium, driven by chromedriver over the
//! W3C WebDriver protocol, loads the page of a running `cdnmap serve`, checks that the map, the
//! cluster table and the charts show the same data as the JSON API, that every chart has axes
//! (y ticks in its unit from 0, x ticks in clock time) and every resource load its unit (bit/s,
//! flytes/s), sorts the table by a click and from the keyboard, drains the busiest cluster by
//! clicking its button (with the token typed into the page), sees the preview (the moved demand,
//! the flows out of it on the map, nothing applied yet), confirms, sees its state change on the page
//! and in the next round's map, sees the drained and then a marked-down cluster head the table
//! (the down one offering "Mark up"), compares the map versions before and after the drain
//! (the drained cluster's demand leaving it, as `/api/diff` says), runs a lookup, saves a screenshot to
//! `<target>/test-artifacts/dashboard.png` (and the preview's, `dashboard-preview.png`), and at 800 × 600 checks that the page does not
//! scroll sideways and the action buttons are in view (`dashboard-800x600.png`).
//!
//! The test installs what it needs (Debian's `chromium` and `chromium-driver`, through
//! `ensure_debian_tool`) and fails — never skips — when they cannot be had or the page does
//! not show real data. The WebDriver client is a few JSON requests over the same small HTTP
//! client as `dashboard.rs` (no TLS, no browser download: this machine's network is closed).

mod dash_support;

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine;
use cdnmap_tests::{ensure_debian_tool, find_program};
use dash_support::{request, DashServer, CLUSTERS, ROUND_TIMEOUT, TOKEN};
use serde_json::{json, Value};

/// The W3C WebDriver element reference key.
const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";
/// How long the page may take to show something that the API already has.
const PAGE_TIMEOUT: Duration = Duration::from_secs(30);
const OPERATOR: &str = "browser-e2e";

/// chromedriver and the browsers it starts, in a process group of their own: ended (the whole
/// group) when dropped, also when the test fails half-way.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.0.id())])
            .status();
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running chromedriver and one browser session; both ended when dropped.
struct Driver {
    addr: SocketAddr,
    session: String,
    // Dropped after the session is deleted, and before the profile is removed (fields drop
    // in order).
    _group: Group,
    _profile: tempfile::TempDir,
}

impl Drop for Driver {
    fn drop(&mut self) {
        let _ = request(
            self.addr,
            "DELETE",
            &format!("/session/{}", self.session),
            &[],
            None,
        );
    }
}

impl Driver {
    fn start(chromium: PathBuf, chromedriver: PathBuf) -> Driver {
        // On port 0: chromedriver says which port it took on its standard output ("ChromeDriver
        // was started successfully on port N.").
        // One name per driver: the tests of this file run side by side in one process.
        static DRIVERS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = DRIVERS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("chromedriver-{}-{n}", std::process::id());
        let log = std::env::temp_dir().join(format!("{name}.log"));
        let said = std::env::temp_dir().join(format!("{name}.out"));
        let out = std::fs::File::create(&said).expect("create chromedriver's output file");
        let child = Command::new(&chromedriver)
            .process_group(0)
            .arg("--port=0")
            .arg(format!("--log-path={}", log.display()))
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {}: {e}", chromedriver.display()));
        let group = Group(child);
        let started = Instant::now();
        let addr = loop {
            let text = std::fs::read_to_string(&said).unwrap_or_default();
            if let Some(port) = started_on_port(&text) {
                break SocketAddr::from(([127, 0, 0, 1], port));
            }
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver said on no port:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        while TcpStream::connect(addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "chromedriver did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        let profile = tempfile::Builder::new()
            .prefix("cdnmap-chromium-")
            .tempdir()
            .expect("a profile directory");
        let args = [
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-quic",
            "--no-first-run",
            "--disable-component-update",
            "--disable-sync",
            "--disable-dev-shm-usage",
            "--window-size=1600,1700",
            &format!("--user-data-dir={}", profile.path().display()),
        ];
        let caps = json!({"capabilities": {"alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": {"binary": chromium, "args": args},
        }}});
        let r = request(
            addr,
            "POST",
            "/session",
            &[("Content-Type", "application/json")],
            Some(&caps.to_string()),
        );
        assert_eq!(
            r.status,
            200,
            "new WebDriver session: {}\nchromedriver log:\n{}",
            r.body,
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        let session = r.json()["value"]["sessionId"]
            .as_str()
            .expect("a session id")
            .to_string();
        Driver {
            addr,
            session,
            _profile: profile,
            _group: group,
        }
    }

    /// A WebDriver command; returns its `value` or the WebDriver error.
    fn cmd(&self, method: &str, path: &str, body: Option<Value>) -> Result<Value, String> {
        let path = format!("/session/{}{path}", self.session);
        let body = body.map(|b| b.to_string());
        let r = request(
            self.addr,
            method,
            &path,
            &[("Content-Type", "application/json")],
            body.as_deref(),
        );
        let v = r.json();
        if r.status == 200 {
            Ok(v["value"].clone())
        } else {
            Err(format!("{method} {path}: {} {}", r.status, v["value"]))
        }
    }

    fn goto(&self, url: &str) {
        self.cmd("POST", "/url", Some(json!({ "url": url })))
            .expect("navigate");
    }

    fn js(&self, script: &str) -> Value {
        self.cmd(
            "POST",
            "/execute/sync",
            Some(json!({"script": script, "args": []})),
        )
        .unwrap_or_else(|e| panic!("script failed: {e}\n{script}"))
    }

    fn find(&self, css: &str) -> Result<String, String> {
        let v = self.cmd(
            "POST",
            "/element",
            Some(json!({"using": "css selector", "value": css})),
        )?;
        v[ELEMENT]
            .as_str()
            .map(str::to_string)
            .ok_or_else(|| format!("no element reference for {css}: {v}"))
    }

    /// Types `text` into the element `css` (real key events).
    fn type_into(&self, css: &str, text: &str) {
        let e = self.find(css).expect("the input");
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": text })),
        )
        .expect("type");
    }

    /// Clicks the element `css`; retried while the page re-renders it (stale references).
    fn click(&self, css: &str) {
        let started = Instant::now();
        loop {
            let r = self
                .find(css)
                .and_then(|e| self.cmd("POST", &format!("/element/{e}/click"), Some(json!({}))));
            match r {
                Ok(_) => return,
                Err(e) if started.elapsed() < PAGE_TIMEOUT => {
                    eprintln!("click {css}: {e}; retrying");
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(e) => panic!("could not click {css}: {e}"),
            }
        }
    }

    /// Polls `script` until it returns something truthy (not null/false/0/""); returns it.
    fn wait_for(&self, what: &str, timeout: Duration, script: &str) -> Value {
        let started = Instant::now();
        loop {
            let v = self.js(script);
            let truthy = match &v {
                Value::Null => false,
                Value::Bool(b) => *b,
                Value::Number(n) => n.as_f64() != Some(0.0),
                Value::String(s) => !s.is_empty(),
                _ => true,
            };
            if truthy {
                return v;
            }
            assert!(
                started.elapsed() < timeout,
                "the page did not show {what} within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(250));
        }
    }

    /// Sets the window's outer size.
    fn resize(&self, width: u32, height: u32) {
        self.cmd(
            "POST",
            "/window/rect",
            Some(json!({"width": width, "height": height})),
        )
        .expect("set the window's size");
    }

    /// Focuses the element `css` and presses Enter on it (WebDriver key events).
    fn press_enter(&self, css: &str) {
        let e = self.find(css).expect("the element");
        self.cmd(
            "POST",
            &format!("/element/{e}/value"),
            Some(json!({ "text": "\u{E007}" })),
        )
        .unwrap_or_else(|err| panic!("Enter on {css}: {err}"));
    }

    fn screenshot(&self) -> Vec<u8> {
        let b64 = self.cmd("GET", "/screenshot", None).expect("a screenshot");
        base64::engine::general_purpose::STANDARD
            .decode(b64.as_str().expect("base64 text"))
            .expect("valid base64")
    }
}

/// The port in chromedriver's "ChromeDriver was started successfully on port N." line.
fn started_on_port(said: &str) -> Option<u16> {
    let key = "started successfully on port ";
    let line = said.lines().find(|l| l.contains(key))?;
    let at = line.find(key)? + key.len();
    line[at..].trim_end().trim_end_matches('.').parse().ok()
}

/// `<target>/test-artifacts`, next to the profile directory this test runs from.
fn artifacts_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test executable");
    let target = exe
        .parent()
        .and_then(|deps| deps.parent())
        .and_then(|profile| profile.parent())
        .expect("the test executable lives in <target>/<profile>/deps");
    let dir = target.join("test-artifacts");
    std::fs::create_dir_all(&dir).expect("create test-artifacts");
    dir
}

/// What the page shows, read from its DOM.
const READ_PAGE: &str = r#"
const q = (s) => [...document.querySelectorAll(s)];
const pts = (s) => ((s.querySelector('polyline') || {getAttribute: () => ''}).getAttribute('points') || '')
  .trim().split(/\s+/).filter(Boolean).length;
return {
  version: Number(document.body.dataset.version || -1),
  map_version: Number(document.body.dataset.mapVersion || -1),
  clusters: q('#map svg circle.cluster').map(c => [c.dataset.id, c.dataset.state, Number(c.dataset.util)]),
  flows: q('#map svg .flows path').length,
  regions: q('#map svg .regions circle').length,
  rows: q('#clusters tbody tr').map(r => [r.dataset.id, r.dataset.state, Number(r.dataset.demand)]),
  bars: q('#clusters tbody .bar').length,
  charts: q('#charts svg').map(s => [s.dataset.metric, Number(s.dataset.points), pts(s)]),
  header: document.getElementById('figures').textContent,
  estimator: q('#estimator tbody tr').map(r => r.cells[0].textContent),
};
"#;

#[test]
fn the_dashboard_renders_real_data_and_drains_a_cluster_in_chromium() {
    let chromium = ensure_debian_tool("chromium", &["chromium", "chromium-driver"])
        .unwrap_or_else(|e| panic!("the browser test needs Chromium: {e}"));
    let chromedriver = find_program("chromedriver")
        .or_else(|| ensure_debian_tool("chromedriver", &["chromium-driver"]).ok())
        .expect("chromedriver (Debian's chromium-driver)");
    let server = DashServer::start(true);
    let driver = Driver::start(chromium, chromedriver);
    driver.goto(&format!("http://{}/", server.http));

    // Two rounds, so every chart has a line (churn has a point from the second round on).
    let started = Instant::now();
    // The page and the API are compared on one map version: read again when a round lands
    // between the reads.
    let (page, api, api_map) = loop {
        let page = driver.js(READ_PAGE);
        let charts = page["charts"].as_array().cloned().unwrap_or_default();
        let ready = charts.len() == 5
            && charts.iter().all(|c| c[1].as_u64().unwrap_or(0) >= 1)
            && charts
                .iter()
                .any(|c| c[0] == "solve_ms" && c[1].as_u64().unwrap_or(0) >= 2);
        if ready && page["version"] == page["map_version"] {
            let api = server.get_ok("/api/clusters");
            let api_map = server.get_ok("/api/map");
            if api["map_version"] == page["version"] && api_map["map_version"] == page["version"] {
                break (page, api, api_map);
            }
        }
        assert!(
            started.elapsed() < ROUND_TIMEOUT + PAGE_TIMEOUT,
            "the page did not render two rounds: {page}\n{}",
            server.log()
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let version = page["version"].as_u64().expect("version");

    // The map and the table show the API's clusters (same version), with real figures.
    let api_rows = api["clusters"].as_array().expect("clusters");
    let ids: BTreeSet<&str> = api_rows.iter().filter_map(|c| c["id"].as_str()).collect();
    let on_map = page["clusters"].as_array().expect("map clusters");
    assert_eq!(on_map.len() as u64, CLUSTERS);
    assert_eq!(
        on_map
            .iter()
            .filter_map(|c| c[0].as_str())
            .collect::<BTreeSet<_>>(),
        ids
    );
    for c in on_map {
        let a = api_rows
            .iter()
            .find(|r| r["id"] == c[0])
            .expect("the cluster in the API");
        let (page_util, api_util) = (
            c[2].as_f64().expect("util"),
            a["utilization"].as_f64().expect("util"),
        );
        assert!((page_util - api_util).abs() < 1e-3, "{c} vs {a}");
    }
    assert!(
        on_map.iter().any(|c| c[2].as_f64().unwrap_or(0.0) > 0.5),
        "no busy cluster drawn"
    );
    assert_eq!(
        page["flows"].as_u64(),
        Some(api_map["flows"].as_array().expect("flows").len() as u64)
    );
    assert!(page["flows"].as_u64().unwrap_or(0) > 10);
    assert_eq!(
        page["regions"].as_u64(),
        Some(api_map["regions"].as_array().expect("regions").len() as u64)
    );
    let rows = page["rows"].as_array().expect("rows");
    assert_eq!(rows.len() as u64, CLUSTERS);
    let page_demand: f64 = rows.iter().map(|r| r[2].as_f64().unwrap_or(0.0)).sum();
    let api_demand: f64 = api_rows
        .iter()
        .map(|r| r["demand"].as_f64().unwrap_or(0.0))
        .sum();
    assert!(api_demand > 0.0 && (page_demand - api_demand).abs() <= 1e-6 * api_demand);
    // The default sort is by demand, busiest first.
    assert_eq!(
        rows[0][0].as_str(),
        api_rows
            .iter()
            .max_by(|a, b| a["demand"]
                .as_f64()
                .unwrap_or(0.0)
                .total_cmp(&b["demand"].as_f64().unwrap_or(0.0)))
            .and_then(|r| r["id"].as_str())
    );
    let nodes: usize = api_rows
        .iter()
        .map(|r| r["nodes"].as_array().map_or(0, Vec::len))
        .sum();
    assert_eq!(
        page["bars"].as_u64(),
        Some((nodes + api_rows.len()) as u64),
        "a bar per node plus one per cluster"
    );
    for c in page["charts"].as_array().expect("charts") {
        assert_eq!(c[1], c[2], "chart {}: points drawn vs data", c[0]);
    }
    let classes: Vec<Value> = server.get_ok("/api/estimator")["coefficients"]
        .as_array()
        .expect("coefficients")
        .iter()
        .map(|c| c["class"].clone())
        .collect();
    assert_eq!(page["estimator"].as_array(), Some(&classes));
    let header = page["header"].as_str().unwrap_or_default();
    assert!(
        header.contains("mean RTT") && header.contains(" ms"),
        "{header}"
    );

    // Every chart has axes: y ticks in its unit starting at 0, x ticks in clock time.
    let axes = driver.js(READ_AXES);
    for c in axes.as_array().expect("charts") {
        let metric = c["metric"].as_str().unwrap_or_default();
        let ys: Vec<&str> = c["y"]
            .as_array()
            .expect("y ticks")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        let unit_ok = |t: &str| match metric {
            "solve_ms" | "mean_rtt_ms" => t.ends_with(" ms") || t.ends_with(" s"),
            "churn" | "overflow_share" => t.ends_with('%'),
            "demand" => t.chars().next().is_some_and(|c| c.is_ascii_digit()),
            other => panic!("unknown chart {other}"),
        };
        assert!(ys.len() >= 3, "{metric}: y ticks {ys:?}");
        assert!(ys.iter().all(|t| unit_ok(t)), "{metric}: y ticks {ys:?}");
        assert!(
            ys[0].trim_start_matches(['0', '.']).starts_with([' ', '%']) || ys[0] == "0",
            "{metric}: the y axis starts at 0: {ys:?}"
        );
        let xs = c["x"].as_array().expect("x ticks");
        assert!(!xs.is_empty(), "{metric}: no x tick");
        for x in xs {
            let x = x.as_str().unwrap_or_default();
            let clock = x.split(':').collect::<Vec<_>>();
            assert!(
                (2..=3).contains(&clock.len())
                    && clock
                        .iter()
                        .all(|p| p.len() == 2 && p.bytes().all(|b| b.is_ascii_digit())),
                "{metric}: x tick {x:?} is not a clock time"
            );
        }
        let title = c["title"].as_str().unwrap_or_default();
        assert!(
            title.ends_with(')'),
            "{metric}: title {title:?} has no unit"
        );
    }
    // Resource loads with their units: bit/s for Bps nodes (the model's bytes × 8), flytes/s
    // for Fps nodes, and how full the node is.
    let labels = driver.js(
        "return [...document.querySelectorAll('#clusters tbody tr')].map(r => [r.dataset.id, \
         [...r.querySelectorAll('.nodes .bar span')].map(s => s.textContent)]);",
    );
    for r in labels.as_array().expect("rows") {
        let id = r[0].as_str().expect("id");
        let api_row = api_rows.iter().find(|a| a["id"] == id).expect("the row");
        let nodes = api_row["nodes"].as_array().expect("nodes");
        let shown = r[1].as_array().expect("labels");
        assert_eq!(shown.len(), nodes.len(), "{id}");
        for (n, label) in nodes.iter().zip(shown) {
            let label = label.as_str().unwrap_or_default();
            let (kind, cap) = (
                n["kind"].as_str().expect("kind"),
                n["capacity"].as_f64().expect("capacity"),
            );
            let unit = match kind {
                "bps" => format!("{}bps", si_prefix(8.0 * cap)),
                "fps" => format!("{}flytes/s", si_prefix(cap)),
                other => panic!("unknown kind {other}"),
            };
            assert!(
                label.starts_with(n["name"].as_str().unwrap_or("?"))
                    && label.contains(&format!(" {unit} · "))
                    && label.ends_with('%'),
                "{id}: {label:?} for {n}"
            );
        }
    }

    // Sorting: a click on "cluster" sorts by id, a second click reverses it.
    let ids_shown =
        "return [...document.querySelectorAll('#clusters tbody tr')].map(r => r.dataset.id);";
    let mut sorted: Vec<Value> = ids.iter().map(|id| Value::from(*id)).collect();
    driver.click("#clusters th[data-sort=\"id\"]");
    assert_eq!(
        driver.js(ids_shown).as_array(),
        Some(&sorted),
        "sorted by id"
    );
    driver.click("#clusters th[data-sort=\"id\"]");
    sorted.reverse();
    assert_eq!(
        driver.js(ids_shown).as_array(),
        Some(&sorted),
        "sorted by id, descending"
    );
    // From the keyboard: Enter on the focused "utilization" header sorts by it, fullest first.
    driver.press_enter("#clusters th[data-sort=\"utilization\"]");
    let shown = driver.js(ids_shown);
    let util_of = |id: &Value| {
        api_rows
            .iter()
            .find(|a| &a["id"] == id)
            .and_then(|a| a["utilization"].as_f64())
            .expect("the row's utilization")
    };
    let utils: Vec<f64> = shown.as_array().expect("ids").iter().map(util_of).collect();
    assert_eq!(utils.len() as u64, CLUSTERS);
    assert!(
        utils.windows(2).all(|w| w[0] >= w[1]),
        "sorted by utilization, descending: {utils:?}"
    );
    driver.click("#clusters th[data-sort=\"demand\"]"); // back to the busiest first

    // Drain the busiest cluster through the page: token and operator typed in, button clicked.
    let busiest = rows[0][0].as_str().expect("id").to_string();
    driver.type_into("#token", TOKEN);
    driver.type_into("#operator", OPERATOR);
    driver.type_into("#reason", "browser test");
    driver.wait_for(
        "the actions enabled",
        PAGE_TIMEOUT,
        "return document.getElementById('mode').textContent === 'actions enabled';",
    );
    let button = format!("button[data-action=\"drain\"][data-cluster=\"{busiest}\"]");
    driver.click(&button);
    // First the preview: what the next round would do, drawn on the map, and nothing applied
    // until it is confirmed.
    let previewed = driver.wait_for(
        "the drain's preview",
        ROUND_TIMEOUT,
        &format!(
            "const h = document.querySelector('#confirm .confirm-headline');
             const out = [...document.querySelectorAll('#confirm .confirm-flows tr[data-from=\"{busiest}\"]')];
             const drawn = document.querySelectorAll('#map .preview-layer [data-from=\"{busiest}\"]').length;
             return h && out.length && drawn ? [Number(h.dataset.moved), out.length, drawn] : null;"
        ),
    );
    assert!(
        previewed[0].as_f64().is_some_and(|m| m > 0.0),
        "{previewed}"
    );
    assert_eq!(
        server.get_ok(&format!("/api/clusters/{busiest}"))["state"],
        "up",
        "a previewed drain is not applied"
    );
    // A unit that would move, looked up from the preview: the lookup panel shows it.
    let unit = driver.js(
        "const b = document.querySelector('#confirm .confirm-units button[data-unit]'); \
         if (b) { b.click(); return b.dataset.unit; } return null;",
    );
    let unit = unit
        .as_str()
        .expect("a moving unit in the preview")
        .to_string();
    driver.wait_for(
        "the moving unit looked up",
        PAGE_TIMEOUT,
        &format!("return document.getElementById('lookup').textContent.includes('{unit}');"),
    );
    let path = artifacts_dir().join("dashboard-preview.png");
    std::fs::write(&path, driver.screenshot()).expect("write the preview's screenshot");
    driver.click("#confirm-apply");
    let row = format!("#clusters tr[data-id=\"{busiest}\"]");
    driver.wait_for(
        "the drained state in the table and on the map",
        PAGE_TIMEOUT,
        &format!(
            "const r = document.querySelector('{row}'); const c = document.querySelector('#map circle.cluster[data-id=\"{busiest}\"]');
             return r && c && r.dataset.state === 'drained' && c.dataset.state === 'drained';"
        ),
    );
    assert_eq!(
        server.get_ok(&format!("/api/clusters/{busiest}"))["state"],
        "drained"
    );
    let event = driver.wait_for(
        "the action in the event list",
        PAGE_TIMEOUT,
        "const li = document.querySelector('#events li[data-seq]'); return li ? li.textContent : '';",
    );
    let event = event.as_str().unwrap_or_default();
    assert!(
        event.contains(OPERATOR)
            && event.contains(&format!("drain {busiest}"))
            && event.contains("up → drained"),
        "{event}"
    );
    let logged = &server.get_ok("/api/events")["events"][0];
    assert_eq!(logged["who"], OPERATOR);
    assert_eq!(logged["reason"], "browser test");

    // The next round takes the cluster's demand away; the page follows without a reload.
    driver.js("window.__sameDocument = true; return true;");
    driver.wait_for(
        "the drained cluster empty after the next round",
        ROUND_TIMEOUT,
        &format!(
            "const r = document.querySelector('{row}');
             return r && Number(document.body.dataset.version) > {version} && Number(r.dataset.demand) === 0 && !r.querySelector('.pending');"
        ),
    );
    assert_eq!(
        driver.js("return window.__sameDocument === true;"),
        Value::Bool(true),
        "the page reloaded"
    );
    // The versions before and after the drain compared on the page (with the token typed in
    // above): the drained cluster's demand left it, as the JSON API says.
    let now = driver
        .js("return Number(document.body.dataset.version);")
        .as_u64()
        .expect("the version shown");
    driver.type_into("#diff-from", &version.to_string());
    driver.type_into("#diff-to", &now.to_string());
    driver.click("#diff-form button");
    let shown = driver.wait_for(
        "the comparison's flows out of the drained cluster",
        PAGE_TIMEOUT,
        &format!(
            "const rows = [...document.querySelectorAll('#diff .diff-flows tr[data-from=\"{busiest}\"]')];
             const h = document.querySelector('#diff .diff-headline');
             return rows.length && h ? [Number(h.dataset.moved), rows.reduce((s, r) => s + Number(r.dataset.demand), 0)] : null;"
        ),
    );
    let auth = format!("Bearer {TOKEN}");
    let reply = request(
        server.http,
        "GET",
        &format!("/api/diff?from={version}&to={now}&flows=20"),
        &[("Authorization", auth.as_str())],
        None,
    );
    assert_eq!(reply.status, 200, "{}", reply.body);
    let diffed = reply.json();
    let out_of_busiest: f64 = diffed["flows"]
        .as_array()
        .expect("flows")
        .iter()
        .filter(|f| f["from"] == busiest.as_str())
        .map(|f| f["demand"].as_f64().expect("demand"))
        .sum();
    assert!(out_of_busiest > 0.0, "{diffed}");
    assert_eq!(
        shown[0].as_f64(),
        diffed["moved"].as_f64(),
        "the moved demand shown"
    );
    let on_page = shown[1].as_f64().expect("a sum");
    assert!(
        (on_page - out_of_busiest).abs() <= 1e-9 * out_of_busiest,
        "{on_page} vs {diffed}"
    );
    assert_eq!(
        request(server.http, "GET", "/api/diff?from=1", &[], None).status,
        401,
        "a diff needs the token"
    );

    // Sorted by demand, the drained cluster (no demand now) still heads the table, with its
    // badge and the action that takes it back.
    let first_row = "const r = document.querySelector('#clusters tbody tr'); \
         return [r.dataset.id, r.querySelector('.state').textContent, \
         [...r.querySelectorAll('button[data-action]')].map(b => b.dataset.action + ':' + b.textContent)];";
    assert_eq!(
        driver.js(first_row),
        json!([busiest, "drained", ["undrain:Undrain", "down:Mark down"]]),
        "the drained cluster first"
    );
    // Mark another cluster down from the page: it comes first (down, then drained), and its
    // way back says "Mark up".
    let other = driver
        .js(ids_shown)
        .as_array()
        .and_then(|ids| ids.get(1).and_then(Value::as_str).map(str::to_string))
        .expect("a second row");
    assert_ne!(other, busiest);
    driver.click(&format!(
        "button[data-action=\"down\"][data-cluster=\"{other}\"]"
    ));
    driver.wait_for(
        "the preview of marking it down",
        ROUND_TIMEOUT,
        "return !!document.querySelector('#confirm-apply');",
    );
    driver.click("#confirm-apply");
    driver.wait_for(
        "the down cluster first, then the drained one",
        PAGE_TIMEOUT,
        &format!(
            "const ids = [...document.querySelectorAll('#clusters tbody tr')].map(r => r.dataset.id);
             return ids[0] === '{other}' && ids[1] === '{busiest}';"
        ),
    );
    assert_eq!(
        driver.js(first_row),
        json!([other, "down", ["drain:Drain", "undrain:Mark up"]]),
        "the down cluster's actions"
    );

    // A lookup from the page, by prefix: a unit that a full cluster passed over (the tests'
    // world keeps the generator's tight headroom, so its clusters run full), so the page shows
    // the full node as the reason.
    let passed_over = |lookup: &Value| {
        lookup["units"][0]["candidates"]
            .as_array()
            .is_some_and(|c| {
                c.iter().any(|c| {
                    c["verdict"] == "passed over"
                        && c["why"].as_str().is_some_and(|w| w.contains("is full"))
                })
            })
    };
    let (unit, prefix) = server.get_ok("/api/clusters?top=20")["clusters"]
        .as_array()
        .expect("clusters")
        .iter()
        .flat_map(|c| c["top_units"].as_array().cloned().unwrap_or_default())
        .filter_map(|u| u["id"].as_str().map(str::to_string))
        .find_map(|id| {
            let l = server.get_ok(&format!("/api/lookup?q={id}"));
            let prefix = l["units"][0]["prefixes"][0].as_str()?.to_string();
            passed_over(&l).then_some((id, prefix))
        })
        .expect("a unit passed over by some cluster");
    driver.type_into("#lookup-q", &prefix);
    driver.click("#lookup-form button");
    let found = driver.wait_for(
        "the lookup's answer",
        PAGE_TIMEOUT,
        &format!(
            "const u = document.querySelector('#lookup .unit[data-unit=\"{unit}\"]'); return u ? u.textContent : '';"
        ),
    );
    let found = found.as_str().unwrap_or_default();
    assert!(
        found.contains("went to:") && found.contains("passed over") && found.contains("is full"),
        "{found}"
    );

    // The screenshot: a real PNG of the page.
    let png = driver.screenshot();
    assert!(
        png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000,
        "{} bytes",
        png.len()
    );
    let path = artifacts_dir().join("dashboard.png");
    std::fs::write(&path, &png).expect("write the screenshot");
    eprintln!("screenshot: {}", path.display());

    // At 800 × 600: no horizontal scrolling of the page, and the first rows' action buttons
    // inside the window and inside the table's scrolling box once the row is scrolled to.
    driver.resize(800, 600);
    let fit = driver.wait_for(
        "the page laid out at 800 px",
        PAGE_TIMEOUT,
        "return document.documentElement.clientWidth < 800 ? document.documentElement.clientWidth : 0;",
    );
    let fit = fit.as_f64().expect("a width");
    let boxes = driver.js(
        "const d = document.documentElement, wrap = document.querySelector('.table-wrap');
         const out = {scroll_width: d.scrollWidth, client_width: d.clientWidth, buttons: []};
         for (const r of [...document.querySelectorAll('#clusters tbody tr')].slice(0, 5)) {
           r.scrollIntoView({block: 'nearest'});
           const w = wrap.getBoundingClientRect();
           for (const b of r.querySelectorAll('button[data-action]')) {
             const x = b.getBoundingClientRect();
             out.buttons.push({id: r.dataset.id, label: b.textContent, left: x.left, right: x.right, top: x.top, bottom: x.bottom,
               visible_right: Math.min(w.right, d.clientWidth), visible_bottom: Math.min(w.bottom, innerHeight)});
           }
         }
         return out;",
    );
    assert!(
        boxes["scroll_width"].as_f64() <= Some(fit),
        "the page scrolls sideways at 800 px: {boxes}"
    );
    let buttons = boxes["buttons"].as_array().expect("buttons");
    assert!(buttons.len() >= 10, "{boxes}");
    for b in buttons {
        let v = |k: &str| b[k].as_f64().unwrap_or(f64::NAN);
        assert!(
            v("right") - v("left") >= 20.0
                && v("bottom") - v("top") >= 10.0
                && v("left") >= 0.0
                && v("right") <= v("visible_right")
                && v("top") >= 0.0
                && v("bottom") <= v("visible_bottom"),
            "a button out of view at 800 x 600: {b}"
        );
    }
    let png = driver.screenshot();
    let path = artifacts_dir().join("dashboard-800x600.png");
    std::fs::write(&path, &png).expect("write the screenshot");
    eprintln!("screenshot: {}", path.display());
}

/// The policy panel (issue 46) on the policy example as the service's world: the page shows the
/// policy and the map's cost; a new policy typed in is previewed (what it would move, cost
/// before and after) and applied, as the API then says.
#[test]
fn the_policy_is_shown_previewed_and_applied_in_chromium() {
    let chromium = ensure_debian_tool("chromium", &["chromium", "chromium-driver"])
        .unwrap_or_else(|e| panic!("the browser test needs Chromium: {e}"));
    let chromedriver = find_program("chromedriver")
        .or_else(|| ensure_debian_tool("chromedriver", &["chromium-driver"]).ok())
        .expect("chromedriver (Debian's chromium-driver)");
    let example = cdnmap_tests::workspace_root()
        .join("docs")
        .join("examples")
        .join("policy.json");
    let top = format!("instance = {:?}\n", example.to_str().expect("a UTF-8 path"));
    let server = DashServer::start_with(cdnmap_tests::mapper::Setup::with_config(
        cdnmap_tests::bin!(),
        true,
        &top,
        "",
    ));
    let driver = Driver::start(chromium, chromedriver);
    driver.goto(&format!("http://{}/", server.http));
    driver.type_into("#token", TOKEN);
    let shown = driver.wait_for(
        "the policy and the map's cost",
        PAGE_TIMEOUT,
        "const p = document.querySelector('#policy [data-weight]'); \
         const n = document.getElementById('policy-note').textContent; \
         return p && n.includes('cost') ? [Number(p.dataset.weight), n] : null;",
    );
    assert_eq!(shown[0], 2.0, "{shown}");
    // Weight 0: the cost rises back; previewed first, then applied.
    driver.js(
        "const b = document.getElementById('policy-json'); const p = JSON.parse(b.value); \
         p.cost.weight = 0; b.value = JSON.stringify(p); b.dataset.edited = '1'; return true;",
    );
    driver.click("#policy-preview");
    let moved = driver.wait_for(
        "the policy's preview",
        ROUND_TIMEOUT,
        "const d = document.querySelector('#policy-preview-out .policy-preview'); \
         return d ? [Number(d.dataset.movedShare), d.textContent] : null;",
    );
    assert!(moved[0].as_f64() > Some(0.0), "{moved}");
    assert_eq!(
        server.get_ok("/api/policy")["policy"]["cost"]["weight"],
        2.0,
        "previewed only"
    );
    driver.click("#policy-apply");
    driver.wait_for(
        "the policy applied",
        PAGE_TIMEOUT,
        "return document.getElementById('policy-preview-out').textContent.includes('applied');",
    );
    assert_eq!(
        server.get_ok("/api/policy")["policy"]["cost"]["weight"],
        0.0
    );
}

/// A drain ramped from the page (issue 45): the preview's "over N rounds", confirmed, shows in
/// the Ramps panel with its progress step by step, and its Cancel writes the cluster back.
#[test]
fn a_drain_ramped_from_the_page_shows_its_steps_and_cancels_in_chromium() {
    let chromium = ensure_debian_tool("chromium", &["chromium", "chromium-driver"])
        .unwrap_or_else(|e| panic!("the browser test needs Chromium: {e}"));
    let chromedriver = find_program("chromedriver")
        .or_else(|| ensure_debian_tool("chromedriver", &["chromium-driver"]).ok())
        .expect("chromedriver (Debian's chromium-driver)");
    let server = DashServer::start_with(cdnmap_tests::mapper::Setup::with_extra(
        cdnmap_tests::bin!(),
        true,
        "[guard]\nmax_moved_share_per_round = 0.01\n",
    ));
    let busiest = server.get_ok("/api/clusters?sort=demand&order=desc")["clusters"][0]["id"]
        .as_str()
        .expect("id")
        .to_string();
    let capacity = |id: &str| {
        server.get_ok(&format!("/api/clusters/{id}"))["nodes"][0]["configured_capacity"].clone()
    };
    let before = capacity(&busiest);
    let driver = Driver::start(chromium, chromedriver);
    driver.goto(&format!("http://{}/", server.http));
    driver.type_into("#token", TOKEN);
    driver.type_into("#reason", "ramped from the page");
    driver.wait_for(
        "the ramps panel and the actions",
        ROUND_TIMEOUT,
        "return document.getElementById('mode').textContent === 'actions enabled' && \
         document.getElementById('ramps-note').textContent.includes('movement budget 1');",
    );
    driver.click(&format!(
        "button[data-action=\"drain\"][data-cluster=\"{busiest}\"]"
    ));
    driver.wait_for(
        "the drain's preview with its rounds",
        ROUND_TIMEOUT,
        "return !!document.querySelector('#confirm-apply') && !!document.getElementById('confirm-rounds');",
    );
    driver.js("document.getElementById('confirm-rounds').value = '4'; return true;");
    driver.click("#confirm-apply");
    let row = format!("#ramps tr[data-cluster=\"{busiest}\"]");
    driver.wait_for(
        "the ramp's second step shown",
        ROUND_TIMEOUT + ROUND_TIMEOUT,
        &format!(
            "const r = document.querySelector('{row}'); \
             return r && r.dataset.phase === 'running' && /step [2-9]/.test(r.textContent);"
        ),
    );
    let ramp = &server.get_ok("/api/ramps")["ramps"][0];
    assert_eq!(
        (ramp["cluster"].as_str(), ramp["rounds"].as_u64()),
        (Some(busiest.as_str()), Some(4)),
        "{ramp}"
    );
    assert_ne!(capacity(&busiest), before, "stepped down");
    let path = artifacts_dir().join("dashboard-ramp.png");
    std::fs::write(&path, driver.screenshot()).expect("write the ramp's screenshot");
    driver.click(&format!("#ramps button[data-cancel=\"{busiest}\"]"));
    driver.wait_for(
        "the ramp cancelled",
        PAGE_TIMEOUT,
        &format!("const r = document.querySelector('{row}'); return r && r.dataset.phase === 'cancelled';"),
    );
    assert_eq!(capacity(&busiest), before, "written back");
    assert_eq!(
        server.get_ok(&format!("/api/clusters/{busiest}"))["state"],
        "up"
    );
}

/// The SI prefix the page gives a quantity of this size (its formatter, `quantity`).
fn si_prefix(x: f64) -> &'static str {
    let a = x.abs();
    if a >= 1e12 {
        "T"
    } else if a >= 1e9 {
        "G"
    } else if a >= 1e6 {
        "M"
    } else if a >= 1e3 {
        "k"
    } else {
        ""
    }
}

/// Each chart's axes, read from its SVG: tick labels and the title (with its unit).
const READ_AXES: &str = r#"
return [...document.querySelectorAll('#charts .chart')].map(ch => ({
  metric: ch.querySelector('svg').dataset.metric,
  title: ch.querySelector('.chart-title').textContent,
  y: [...ch.querySelectorAll('svg text.tick.y')].map(t => t.textContent),
  x: [...ch.querySelectorAll('svg text.tick.x')].map(t => t.textContent),
}));
"#;
