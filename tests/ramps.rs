//! Ramps end to end (issue 45, item 2 and the guard's rollback of item 3) against the real
//! binary: a drain of the busiest cluster ramped over rounds steps its capacity down, keeps
//! every step within the per-round movement budget (and so takes more rounds than asked when
//! the budget says so), ends drained with its capacities as they were, and is in the change
//! history; a change made at once past the budget is refused naming the rounds a ramp needs;
//! a ramp survives a restart and an operator's cancel writes the cluster back; the guard halts
//! and rolls back a ramp whose rounds raise the overflow past its limit.
//!
//! Each test starts its own `cdnmap serve` on the small demo world (10 s cycle); a ramp takes
//! a round a step, so each test takes a minute or two.

mod dash_support;

use std::collections::BTreeSet;
use std::time::Duration;

use cdnmap_tests::mapper::Setup;
use dash_support::{DashServer, TOKEN};
use serde_json::Value;

/// How long a ramp may take to end here (a step a round, rounds every 10 s).
const RAMP_TIMEOUT: Duration = Duration::from_secs(300);

fn f(v: &Value) -> f64 {
    v.as_f64().unwrap_or_else(|| panic!("not a number: {v}"))
}

/// A server on the demo world with `extra` tables.
fn server(extra: &str) -> DashServer {
    DashServer::start_with(Setup::with_extra(cdnmap_tests::bin!(), true, extra))
}

fn post(s: &DashServer, path: &str, body: &str) -> dash_support::Reply {
    let auth = format!("Bearer {TOKEN}");
    s.post(path, &[("Authorization", &auth)], body)
}

/// The clusters, busiest first.
fn by_demand(s: &DashServer) -> Vec<Value> {
    s.get_ok("/api/clusters?sort=demand&order=desc")["clusters"]
        .as_array()
        .expect("clusters")
        .clone()
}

/// Cluster `id`'s configured capacities (the topology's), in the page's node order.
fn capacities(s: &DashServer, id: &str) -> Vec<f64> {
    s.get_ok(&format!("/api/clusters/{id}"))["nodes"]
        .as_array()
        .expect("nodes")
        .iter()
        .map(|n| f(&n["configured_capacity"]))
        .collect()
}

/// The ramp of `id` (the newest), as `/api/ramps` lists it.
fn ramp_of(s: &DashServer, id: &str) -> Value {
    s.get_ok("/api/ramps")["ramps"]
        .as_array()
        .expect("ramps")
        .iter()
        .find(|r| r["cluster"] == id)
        .cloned()
        .unwrap_or_else(|| panic!("no ramp of {id}"))
}

/// Waits until `id`'s ramp is no longer running; returns it.
fn ended(s: &DashServer, id: &str) -> Value {
    s.wait_until("the ramp to end", RAMP_TIMEOUT, || {
        let r = ramp_of(s, id);
        (r["phase"] != "running").then_some(r)
    })
}

fn close(a: &[f64], b: &[f64], rel: f64) -> bool {
    a.len() == b.len()
        && a.iter()
            .zip(b)
            .all(|(x, y)| (x - y).abs() <= rel * x.abs().max(y.abs()).max(1.0))
}

#[test]
fn a_ramped_drain_steps_within_the_budget_and_ends_drained() {
    const BUDGET: f64 = 0.01;
    let s = server(&format!("[guard]\nmax_moved_share_per_round = {BUDGET}\n"));
    let clusters = by_demand(&s);
    let busiest = clusters[0]["id"].as_str().expect("id").to_string();
    let total: f64 = clusters.iter().map(|c| f(&c["demand"])).sum();
    let share = f(&clusters[0]["demand"]) / total;
    assert!(share > 3.0 * BUDGET, "the busiest holds {share}");
    let before = capacities(&s, &busiest);

    // At once, it would move more than the budget: refused, naming the ramp it needs.
    let at_once = post(
        &s,
        &format!("/api/clusters/{busiest}/state"),
        r#"{"state": "drained", "reason": "maintenance"}"#,
    );
    assert_eq!(at_once.status, 409, "{}", at_once.body);
    let said = at_once.error();
    assert!(
        said.contains(
            "in one round, more than the budget (guard.max_moved_share_per_round = 0.01)"
        ) && said.contains("ramp it over"),
        "{said}"
    );

    // Bad asks are named.
    for (body, what) in [
        (
            r#"{"to": "drained", "rounds": 1}"#,
            "rounds: 1 is outside 2..=1000",
        ),
        (
            r#"{"to": "capacity", "scale": 1.5, "rounds": 3}"#,
            "scale: 1.5 is outside (0, 1)",
        ),
        (
            r#"{"to": "drained", "scale": 0.5, "rounds": 3}"#,
            "expected",
        ),
        (r#"{"to": "drained"}"#, "missing field `rounds`"),
    ] {
        let r = post(&s, &format!("/api/clusters/{busiest}/ramp"), body);
        assert_eq!(r.status, 400, "{body}: {}", r.body);
        assert!(r.error().contains(what), "{body}: {}", r.body);
    }
    let nobody = post(
        &s,
        "/api/clusters/nope/ramp",
        r#"{"to": "drained", "rounds": 3}"#,
    );
    assert_eq!(nobody.status, 404, "{}", nobody.body);
    let untokened = s.post(
        &format!("/api/clusters/{busiest}/ramp"),
        &[],
        r#"{"to": "drained", "rounds": 3}"#,
    );
    assert_eq!(untokened.status, 401, "{}", untokened.body);

    // Ramped over 3 rounds: the first step is written at once, a cut of the capacities.
    let started = post(
        &s,
        &format!("/api/clusters/{busiest}/ramp"),
        r#"{"to": "drained", "rounds": 3, "reason": "maintenance"}"#,
    );
    assert_eq!(started.status, 200, "{}", started.body);
    let r = started.json();
    assert_eq!(r["phase"], "running", "{r}");
    let first = f(&r["steps"][0]["scale"]);
    assert!((0.0..1.0).contains(&first), "{r}");
    let stepped = capacities(&s, &busiest);
    let expected: Vec<f64> = before.iter().map(|c| c * first).collect();
    assert!(
        close(&stepped, &expected, 1e-9),
        "{stepped:?} vs {expected:?}"
    );
    let again = post(
        &s,
        &format!("/api/clusters/{busiest}/ramp"),
        r#"{"to": "drained", "rounds": 3}"#,
    );
    assert_eq!(again.status, 400, "{}", again.body);
    assert!(
        again.error().contains("is ramping already"),
        "{}",
        again.body
    );

    let done = ended(&s, &busiest);
    assert_eq!(done["phase"], "done", "{done}");
    for x in done["steps"].as_array().expect("steps") {
        eprintln!(
            "step: scale {:.3}, estimated {:.4}, observed churn {:.4}, overflow {:.4}",
            f(&x["scale"]),
            f(&x["estimated_moved_share"]),
            f(&x["observed"]["moved_share"]),
            f(&x["observed"]["overflow_share"])
        );
    }
    eprintln!(
        "busiest {busiest} held {share:.4} of the demand; {}",
        done["why"]
    );
    let steps = done["steps"].as_array().expect("steps");
    // The budget held it back: more steps than the 3 rounds asked, each estimated within it,
    // each scale below the one before, the last the drain.
    assert!(steps.len() > 3, "{done}");
    assert_eq!(done["steps_written"].as_u64(), Some(steps.len() as u64));
    let scales: Vec<f64> = steps.iter().map(|x| f(&x["scale"])).collect();
    assert!(scales.windows(2).all(|w| w[1] < w[0]), "{scales:?}");
    assert_eq!(*scales.last().expect("a step"), 0.0);
    for x in steps {
        assert!(f(&x["estimated_moved_share"]) <= BUDGET + 1e-9, "{x}");
        // What the round that mapped it moved (all of its churn) stays near the budget.
        let churn = f(&x["observed"]["moved_share"]);
        assert!(churn <= 2.0 * BUDGET, "{x}");
    }
    let row = s.get_ok(&format!("/api/clusters/{busiest}"));
    assert_eq!(row["state"], "drained", "{row}");
    assert!(
        close(&capacities(&s, &busiest), &before, 1e-9),
        "restored capacities"
    );
    let events = s.get_ok("/api/events")["events"].clone();
    let actions: Vec<&str> = events
        .as_array()
        .expect("events")
        .iter()
        .filter(|e| e["cluster"] == busiest.as_str())
        .filter_map(|e| e["action"].as_str())
        .collect();
    assert!(
        actions.starts_with(&["ramp_done", "ramp_start"]),
        "{actions:?}"
    );
    let done_event = &events[0];
    assert!(
        done_event["observed"]["version"].as_u64().is_some(),
        "{done_event}"
    );
}

#[test]
fn a_ramp_goes_on_after_a_restart_and_a_cancel_writes_the_cluster_back() {
    let mut s = server("");
    let clusters = by_demand(&s);
    let id = clusters[1]["id"].as_str().expect("id").to_string();
    let before = capacities(&s, &id);
    let r = post(
        &s,
        &format!("/api/clusters/{id}/ramp"),
        r#"{"to": "capacity", "scale": 0.5, "rounds": 50, "reason": "slow cut"}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    assert_eq!(f(&r.json()["steps"][0]["scale"]), 0.99);
    // Two steps mapped, then a restart: the ramp is read back from the history and goes on.
    s.wait_until("two steps", RAMP_TIMEOUT, || {
        (ramp_of(&s, &id)["steps_written"].as_u64() >= Some(2)).then_some(())
    });
    s.restart();
    let back = ramp_of(&s, &id);
    assert_eq!(back["phase"], "running", "{back}");
    let written = back["steps_written"].as_u64().expect("steps_written");
    s.wait_until("a step after the restart", RAMP_TIMEOUT, || {
        (ramp_of(&s, &id)["steps_written"].as_u64() > Some(written)).then_some(())
    });
    assert!(capacities(&s, &id)[0] < before[0]);

    let cancelled = post(
        &s,
        &format!("/api/clusters/{id}/ramp/cancel"),
        r#"{"reason": "changed my mind"}"#,
    );
    assert_eq!(cancelled.status, 200, "{}", cancelled.body);
    let c = cancelled.json();
    assert_eq!(c["phase"], "cancelled", "{c}");
    assert!(
        c["why"]
            .as_str()
            .is_some_and(|w| w.contains("changed my mind")),
        "{c}"
    );
    assert!(close(&capacities(&s, &id), &before, 1e-9), "written back");
    assert_eq!(s.get_ok(&format!("/api/clusters/{id}"))["state"], "up");
    let none = post(&s, &format!("/api/clusters/{id}/ramp/cancel"), "{}");
    assert_eq!(none.status, 400, "{}", none.body);
    assert!(
        none.error().contains("has no running ramp"),
        "{}",
        none.body
    );

    // The history's export: every record the store keeps, across the restart, oldest first;
    // the ramp's last record is the cancelled ramp.
    assert_eq!(s.get("/api/events/export").status, 401);
    let auth = format!("Bearer {TOKEN}");
    let export = dash_support::request(
        s.http,
        "GET",
        "/api/events/export",
        &[("Authorization", &auth)],
        None,
    );
    assert_eq!(export.status, 200, "{}", export.body);
    assert_eq!(export.header("content-type"), Some("application/x-ndjson"));
    let lines: Vec<Value> = export
        .body
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    let times: Vec<i64> = lines
        .iter()
        .map(|l| l["at_unix_ms"].as_i64().expect("at"))
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "{times:?}");
    let ramps: Vec<&Value> = lines
        .iter()
        .map(|l| &l["record"])
        .filter(|r| r["kind"] == "ramp" && r["cluster"] == id.as_str())
        .collect();
    assert!(
        ramps.len() as u64 >= written + 2,
        "a record a step and the end: {}",
        ramps.len()
    );
    assert_eq!(
        ramps.last().map(|r| &r["phase"]),
        Some(&Value::from("cancelled"))
    );
    let kinds: BTreeSet<&str> = lines
        .iter()
        .filter_map(|l| l["record"]["kind"].as_str())
        .collect();
    assert!(kinds.contains("event"), "{kinds:?}");
}

#[test]
fn the_guard_halts_and_rolls_back_a_ramp_whose_rounds_raise_the_overflow() {
    let s = server("[guard]\nmax_overflow_points = 0.05\n");
    let clusters = by_demand(&s);
    let busiest = clusters[0]["id"].as_str().expect("id").to_string();
    let before = capacities(&s, &busiest);
    // The goal's preview passes the limit: refused unless forced with a reason.
    let ask = r#"{"to": "drained", "rounds": 4, "reason": "see what happens", "force": true}"#;
    let refused = post(
        &s,
        &format!("/api/clusters/{busiest}/ramp"),
        r#"{"to": "drained", "rounds": 4}"#,
    );
    assert_eq!(refused.status, 409, "{}", refused.body);
    assert!(
        refused.error().contains("guard.max_overflow_points"),
        "{}",
        refused.body
    );
    let forced = post(&s, &format!("/api/clusters/{busiest}/ramp"), ask);
    assert_eq!(forced.status, 200, "{}", forced.body);
    assert!(
        forced.json()["reason"]
            .as_str()
            .is_some_and(|r| r.contains("[forced past the guard")),
        "{}",
        forced.body
    );
    let r = ended(&s, &busiest);
    assert_eq!(r["phase"], "rolled_back", "{r}");
    let why = r["why"].as_str().expect("why");
    assert!(
        why.starts_with("halted by the guard") && why.contains("guard.max_overflow_points = 0.05"),
        "{why}"
    );
    assert!(
        r["steps_written"].as_u64() < Some(4),
        "halted before its end: {r}"
    );
    assert!(
        close(&capacities(&s, &busiest), &before, 1e-9),
        "rolled back"
    );
    assert_eq!(s.get_ok(&format!("/api/clusters/{busiest}"))["state"], "up");
    let e = &s.get_ok("/api/events")["events"][0];
    assert_eq!(e["action"], "ramp_rollback", "{e}");
}

/// Every node of `n` at `f` times its capacity.
fn scale_tree(n: &mut cdnmap_proto::v1::ResourceNode, f: f64) {
    n.capacity *= f;
    for c in &mut n.children {
        scale_tree(c, f);
    }
}

/// The topology is the truth of where a ramp is: the cluster written at another step of it
/// (what a process killed between journaling a step and recording it leaves) is taken up as
/// the ramp's position, and the ramp goes on from there; a tree edited otherwise interrupts it,
/// left as that edit left it.
#[test]
fn a_step_found_in_the_topology_is_taken_up_and_another_edit_interrupts() {
    use cdnmap_proto::v1 as pb;
    use cdnmap_proto::v1::admin_client::AdminClient;
    use cdnmap_tests::mapper::authed;
    let s = server("");
    let id = by_demand(&s)[2]["id"].as_str().expect("id").to_string();
    let before = capacities(&s, &id);
    let r = post(
        &s,
        &format!("/api/clusters/{id}/ramp"),
        r#"{"to": "capacity", "scale": 0.2, "rounds": 100}"#,
    );
    assert_eq!(r.status, 200, "{}", r.body);
    let rt = tokio::runtime::Runtime::new().expect("a runtime");
    let admin_scale = |f: f64, root_only: bool| {
        rt.block_on(async {
            let mut admin = AdminClient::connect(format!("http://{}", s.grpc))
                .await
                .expect("connect");
            let get = pb::GetClusterRequest { id: id.clone() };
            let mut c = admin
                .get_cluster(authed(get, Some(TOKEN)))
                .await
                .expect("GetCluster")
                .into_inner();
            let root = c.resources.as_mut().expect("a tree");
            if root_only {
                root.capacity *= f;
            } else {
                scale_tree(root, f);
            }
            admin
                .upsert_cluster(authed(c, Some(TOKEN)))
                .await
                .expect("UpsertCluster");
        })
    };
    // Written at half its first step: a step of the ramp.
    let first = f(&r.json()["steps"][0]["scale"]);
    let half = 0.5 * first;
    admin_scale(0.5, false);
    let taken = s.wait_until("the step taken up", RAMP_TIMEOUT, || {
        let r = ramp_of(&s, &id);
        let scales: Vec<f64> = r["steps"]
            .as_array()
            .expect("steps")
            .iter()
            .map(|x| f(&x["scale"]))
            .collect();
        scales
            .iter()
            .any(|&x| (x - half).abs() < 1e-6)
            .then_some((r, scales))
    });
    assert_eq!(taken.0["phase"], "running", "{}", taken.0);
    // The ramp went on from there: the step after it is lower still.
    s.wait_until("a step after it", RAMP_TIMEOUT, || {
        let r = ramp_of(&s, &id);
        let last = r["steps"]
            .as_array()
            .and_then(|x| x.last())
            .map(|x| f(&x["scale"]));
        last.filter(|&x| x < half - 1e-6).map(|_| ())
    });
    // The root alone cut: not a step of the ramp.
    admin_scale(0.5, true);
    let r = ended(&s, &id);
    assert_eq!(r["phase"], "interrupted", "{r}");
    assert!(
        r["why"]
            .as_str()
            .is_some_and(|w| w.contains("edited the cluster's resources")),
        "{r}"
    );
    let now = capacities(&s, &id);
    assert!(
        now[0] < 0.5 * before[0],
        "left as the edit left it: {now:?}"
    );
}
