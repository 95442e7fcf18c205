//! State that survives: what the running `cdnmap serve` acknowledged is what it holds after a
//! graceful stop (SIGTERM), a crash (kill -9) and a restart, whatever Admin did before.
//!
//! - Deleting a map unit and a cluster, then restarting at once (SIGTERM, then kill -9): the
//!   server starts and serves; a configuration naming the deleted cluster starts with a warning.
//! - A front end joining right after a restart gets exactly the map that was published (shares
//!   in (0, 1], the same epoch and version), and the first round after it churns like any other
//!   (the estimator's checkpoint and the rounds' entries after it were stored with the maps), under a new epoch.
//! - Interleaved Admin and dashboard changes from four clients, then kill -9 at once: the store
//!   holds exactly the last change each client had acknowledged.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use cdnmap_proto::v1 as pb;
use cdnmap_proto::v1::admin_client::AdminClient;
use cdnmap_tests::bin;
use cdnmap_tests::mapper::{
    all_clusters, all_units, authed, http_post, ok, resolves, status, Server, Setup, CLUSTERS,
    CYCLE_SECS, MAP_UNITS, TOKEN,
};
use tonic::transport::Channel;

/// How long a test waits for the next round.
const ROUND_WAIT: Duration = Duration::from_secs(3 * CYCLE_SECS);

/// Waits until the server publishes a map with a version above `version`; returns its status.
async fn round_after(server: &Server, version: u64) -> pb::Status {
    let started = Instant::now();
    loop {
        let s = status(server).await;
        if s.map_version > version {
            return s;
        }
        assert!(
            started.elapsed() < ROUND_WAIT,
            "no round after version {version} within {ROUND_WAIT:?}:\n{}",
            server.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The first message of a new WatchMap stream: the whole map.
async fn full_map(server: &Server) -> pb::MapUpdate {
    let mut stream = ok(
        server
            .mapping()
            .watch_map(pb::WatchMapRequest::default())
            .await,
        "WatchMap",
    );
    let update = tokio::time::timeout(Duration::from_secs(30), stream.message())
        .await
        .expect("a full map within 30 s")
        .expect("the stream")
        .expect("a message");
    assert!(update.full);
    cdnmap_serve::watch::readable(update).expect("a readable map")
}

fn assert_shares_in_range(update: &pb::MapUpdate) {
    for u in &update.units {
        for s in &u.shares {
            assert!(
                s.share > 0.0 && s.share <= 1.0,
                "unit {}: share {} not in (0, 1]",
                u.id,
                s.share
            );
        }
        let total: f64 = u.shares.iter().map(|s| s.share).sum::<f64>() + u.overflow_share;
        assert!((total - 1.0).abs() < 1e-9, "unit {}: total {total}", u.id);
    }
}

/// Demand reports for every unit: its configured demand times `factor`.
async fn report_demand(server: &Server, units: &[pb::MapUnit], factor: f64) {
    let samples = units
        .iter()
        .map(|u| pb::DemandSample {
            target: Some(pb::demand_sample::Target::MapUnit(u.id.clone())),
            traffic_class: u.traffic_class.clone(),
            queries: u.demand * factor,
        })
        .collect::<Vec<_>>();
    let n = samples.len() as u64;
    let ack = ok(
        server
            .feedback()
            .report_demand(pb::DemandReport {
                reporter: "e2e-state".into(),
                period_start_unix_ms: 0,
                period_end_unix_ms: 0,
                samples,
            })
            .await,
        "ReportDemand",
    );
    assert_eq!(ack.accepted, n);
}

/// Waits until `/metrics` says map `version` is stored.
async fn stored_version(server: &Server, version: u64) {
    let started = Instant::now();
    loop {
        let (_, body) = server.http_get("/metrics");
        let stored = body
            .lines()
            .find_map(|l| l.strip_prefix("cdnmap_map_stored_version "))
            .and_then(|v| v.trim().parse::<f64>().ok());
        if stored == Some(version as f64) {
            return;
        }
        assert!(
            started.elapsed() < ROUND_WAIT,
            "map version {version} not stored within {ROUND_WAIT:?} ({stored:?})"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn warnings<T>(r: &tonic::Response<T>) -> Vec<String> {
    r.metadata()
        .get_all("cdnmap-warnings")
        .iter()
        .filter_map(|v| v.to_str().ok().map(str::to_string))
        .collect()
}

#[tokio::test]
async fn acknowledged_deletes_never_keep_the_server_from_starting() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let units = all_units(&server).await;
    let cls = all_clusters(&server).await;
    let mut admin = server.admin();
    let delete_unit = |id: &str| authed(pb::DeleteRequest { id: id.into() }, Some(TOKEN));
    let (gone_unit, gone_cluster) = (units[0].id.clone(), cls[0].id.clone());
    let r = admin
        .delete_map_unit(delete_unit(&gone_unit))
        .await
        .expect("DeleteMapUnit");
    assert!(r.get_ref().deleted);
    let r = admin
        .delete_cluster(delete_unit(&gone_cluster))
        .await
        .expect("DeleteCluster");
    assert!(r.get_ref().deleted);
    let said = warnings(&r);
    assert!(
        said.iter().any(|w| w.contains("candidate entries")),
        "the dropped candidates are counted: {said:?}"
    );

    // A graceful stop right after (no round has stored a map since), then a configuration
    // whose selection override names the deleted cluster.
    drop(admin);
    server.terminate().await;
    let extra =
        format!("\n[selection.clusters.{gone_cluster:?}]\npolicy = \"power-of-d\"\nd = 2\n");
    let mut text = std::fs::read_to_string(&setup.config).expect("read the config");
    text.push_str(&extra);
    std::fs::write(&setup.config, text).expect("write the config");
    let server = setup.start().await;
    resolves(&server, &units[1]).await;
    assert!(
        server.log().contains("the selection override is not used"),
        "{}",
        server.log()
    );
    let s = status(&server).await;
    assert_eq!(
        (s.map_units, s.clusters),
        (MAP_UNITS - 1, CLUSTERS - 1),
        "the deletes were kept"
    );

    // Again, with a crash instead.
    let mut admin = server.admin();
    admin
        .delete_map_unit(delete_unit(&units[1].id))
        .await
        .expect("DeleteMapUnit");
    admin
        .delete_cluster(delete_unit(&cls[1].id))
        .await
        .expect("DeleteCluster");
    server.kill();
    let server = setup.start().await;
    resolves(&server, &units[2]).await;
    let s = status(&server).await;
    assert_eq!((s.map_units, s.clusters), (MAP_UNITS - 2, CLUSTERS - 2));
    // And the next round maps the edited topology.
    let after = round_after(&server, s.map_version).await;
    assert!(!after.last_round_failed, "{}", after.last_round_error);
    let update = full_map(&server).await;
    assert_eq!(update.units.len() as u64, MAP_UNITS - 2);
    assert!(update.clusters.iter().all(|c| c.id != cls[1].id));
}

#[tokio::test]
async fn a_restart_serves_exactly_what_was_published_and_remembers_the_forecasts() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let units = all_units(&server).await;
    // Demand reports far from the configured demand: the rounds map the forecast.
    let mut version = status(&server).await.map_version;
    let mut churns = Vec::new();
    for _ in 0..3 {
        report_demand(&server, &units, 2.5).await;
        let s = round_after(&server, version).await;
        version = s.map_version;
        churns.push(s.churn);
    }
    let before = status(&server).await;
    let published = full_map(&server).await;
    assert_eq!(
        (published.epoch, published.version),
        (before.map_epoch, before.map_version)
    );
    // A map is stored before it is published; the crash comes once this one is seen stored
    // (the check costs nothing and says what the restart must serve).
    stored_version(&server, published.version).await;
    server.kill();

    // A front end joining at once gets the restored map: the same identity and shares.
    let server = setup.start().await;
    let restored = full_map(&server).await;
    assert_shares_in_range(&restored);
    assert_eq!(
        (restored.epoch, restored.version),
        (published.epoch, published.version),
        "the stored map is served as it was published"
    );
    let by_id = |u: &pb::MapUpdate| -> BTreeMap<String, Vec<(String, f64)>> {
        u.units
            .iter()
            .map(|m| {
                let shares = m
                    .shares
                    .iter()
                    .map(|s| (s.cluster.clone(), s.share))
                    .collect();
                (m.id.clone(), shares)
            })
            .collect()
    };
    assert!(by_id(&restored) == by_id(&published), "the same shares");
    let answer = resolves(&server, &units[3]).await;
    assert_eq!(
        (answer.map_epoch, answer.map_version),
        (published.epoch, published.version)
    );

    // The first round after the restart: a new epoch, and the churn of a normal round (with
    // the forecasts forgotten, the demand would fall back to the configured 1/2.5 of it).
    let first = round_after(&server, published.version).await;
    assert!(!first.last_round_failed, "{}", first.last_round_error);
    assert!(first.map_epoch > published.epoch, "{first:?}");
    let normal = churns[1..].iter().copied().fold(0.0, f64::max);
    assert!(
        first.churn <= 2.0 * normal + 0.002,
        "churn after the restart {} vs {normal} in normal rounds ({churns:?})",
        first.churn
    );
    let next = full_map(&server).await;
    assert_shares_in_range(&next);
    assert_eq!(
        (next.epoch, next.version),
        (first.map_epoch, first.map_version)
    );
}

/// One client's changes: its own clusters drained, undrained and marked down, alternately
/// through Admin and the dashboard, and its own units' demand through Admin upserts.
async fn client_changes(
    mut admin: AdminClient<Channel>,
    http: SocketAddr,
    clusters: Vec<String>,
    mut units: Vec<pb::MapUnit>,
    changes: usize,
    seed: usize,
) -> (BTreeMap<String, i32>, BTreeMap<String, f64>) {
    let (mut states, mut demands) = (BTreeMap::new(), BTreeMap::new());
    for i in 0..changes {
        let k = (i * 7 + seed) % 3;
        match (i + seed) % 3 {
            0 | 1 => {
                let id = clusters[(i / 3) % clusters.len()].clone();
                let (state, name) = [
                    (pb::ClusterState::Drained, "drained"),
                    (pb::ClusterState::Up, "up"),
                    (pb::ClusterState::Down, "down"),
                ][k];
                if (i + seed).is_multiple_of(3) {
                    ok(
                        admin
                            .set_cluster_state(authed(
                                pb::SetClusterStateRequest {
                                    id: id.clone(),
                                    state: state as i32,
                                    reason: format!("e2e {seed}/{i}"),
                                    force: false,
                                },
                                Some(TOKEN),
                            ))
                            .await,
                        "SetClusterState",
                    );
                } else {
                    let path = format!("/api/clusters/{id}/state");
                    let body = format!("{{\"state\": \"{name}\", \"reason\": \"e2e {seed}/{i}\"}}");
                    let (line, body) = tokio::task::spawn_blocking(move || {
                        let auth = format!("Bearer {TOKEN}");
                        http_post(http, &path, &[("Authorization", &auth)], &body)
                    })
                    .await
                    .expect("the POST");
                    assert!(line.contains(" 200 "), "{line}\n{body}");
                }
                states.insert(id, state as i32);
            }
            _ => {
                let n = units.len();
                let u = &mut units[(i / 3) % n];
                u.demand = (seed * 1000 + i) as f64 + 0.25;
                ok(
                    admin.upsert_map_unit(authed(u.clone(), Some(TOKEN))).await,
                    "UpsertMapUnit",
                );
                demands.insert(u.id.clone(), u.demand);
            }
        }
    }
    (states, demands)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn interleaved_admin_and_dashboard_changes_survive_kill_minus_9() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let units = all_units(&server).await;
    let cls: Vec<String> = all_clusters(&server)
        .await
        .into_iter()
        .map(|c| c.id)
        .collect();
    // Four clients at once, 25 changes each, each on its own clusters and units.
    let mut jobs = Vec::new();
    for w in 0..4 {
        let mine: Vec<String> = cls.iter().skip(w).step_by(4).take(3).cloned().collect();
        let my_units: Vec<pb::MapUnit> = units.iter().skip(w).step_by(4).take(3).cloned().collect();
        jobs.push(tokio::spawn(client_changes(
            server.admin(),
            server.http,
            mine,
            my_units,
            25,
            w,
        )));
    }
    let mut results = Vec::new();
    for j in jobs {
        results.push(j.await.expect("a client"));
    }
    // No quiet time: the crash comes right after the last acknowledgement.
    server.kill();
    let server = setup.start().await;
    let now: BTreeMap<String, i32> = all_clusters(&server)
        .await
        .into_iter()
        .map(|c| (c.id, c.state))
        .collect();
    let demand: BTreeMap<String, f64> = all_units(&server)
        .await
        .into_iter()
        .map(|u| (u.id, u.demand))
        .collect();
    let mut checked = 0;
    for (states, demands) in results {
        for (id, state) in states {
            assert_eq!(now[&id], state, "cluster {id}");
            checked += 1;
        }
        for (id, d) in demands {
            assert_eq!(demand[&id], d, "map unit {id}");
            checked += 1;
        }
    }
    assert!(checked >= 4 * 5, "{checked} keys checked");
}

/// `cdnmap store list` and `cdnmap store dump` read a running server's store (whose sled lock
/// the server holds) from its value files: the first version is listed under the server's
/// epoch, dumped with the instance it was solved for, and the independent verifier accepts
/// the pair (the first round is a cold solve, checked against the plain preferences); a
/// version the store does not keep is refused, naming the ones it keeps.
#[tokio::test]
async fn a_running_servers_stored_versions_are_listed_and_dumped() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let s = round_after(&server, 0).await;
    stored_version(&server, s.map_version).await;
    let data = setup.dir.path().join("data");
    let run = |args: &[&str]| {
        let out = std::process::Command::new(bin!())
            .args(args)
            .output()
            .expect("run cdnmap");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let data_dir = data.to_str().expect("a UTF-8 path");
    let (ok, stdout, stderr) = run(&["store", "list", "--data-dir", data_dir]);
    assert!(ok, "store list: {stderr}");
    let listed: Vec<(u64, u64)> = stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((f.first()?.parse().ok()?, f.get(1)?.parse().ok()?))
        })
        .collect();
    assert!(listed.contains(&(s.map_epoch, 1)), "{stdout}");

    let instance = setup.dir.path().join("dumped-instance.json");
    let assignment = setup.dir.path().join("dumped-assignment.json");
    let (ok, _, stderr) = run(&[
        "store",
        "dump",
        "--data-dir",
        data_dir,
        "--version",
        "1",
        "--instance",
        instance.to_str().expect("path"),
        "--out",
        assignment.to_str().expect("path"),
    ]);
    assert!(ok, "store dump: {stderr}");
    let file: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&assignment).expect("read")).expect("JSON");
    assert_eq!(file["summary"]["version"], 1);
    assert_eq!(file["summary"]["epoch"], s.map_epoch);
    let units = all_units(&server).await;
    assert_eq!(
        file["assignments"].as_array().map(Vec::len),
        Some(units.len())
    );
    let (ok, stdout, stderr) = run(&[
        "verify",
        instance.to_str().expect("path"),
        assignment.to_str().expect("path"),
    ]);
    assert!(ok, "verify the dumped version:\n{stdout}\n{stderr}");

    let (ok, _, stderr) = run(&[
        "store",
        "dump",
        "--data-dir",
        data_dir,
        "--version",
        "999999",
    ]);
    assert!(!ok);
    assert!(
        stderr.contains("map version 999999 is not stored") && stderr.contains("kept: 1"),
        "{stderr}"
    );
    server.terminate().await;
}

/// A cluster whose resource tree is a chain of `levels` nodes, the last serving web.
fn chain_cluster(id: &str, levels: usize) -> pb::Cluster {
    let node = |i: usize, children| pb::ResourceNode {
        name: format!("n{i}"),
        kind: "bps".into(),
        capacity: 1e6,
        classes: if i == levels {
            vec!["web".into()]
        } else {
            vec![]
        },
        children,
    };
    pb::Cluster {
        id: id.into(),
        lat: 50.0,
        lon: 8.0,
        addresses: vec!["192.0.2.77".into()],
        state: 0,
        resources: Some(
            (1..levels)
                .rev()
                .fold(node(levels, vec![]), |tree, i| node(i, vec![tree])),
        ),
    }
}

/// The levels of a resource tree.
fn levels(n: &pb::ResourceNode) -> usize {
    1 + n.children.iter().map(levels).max().unwrap_or(0)
}

/// Issue 41 (1): Admin once acknowledged a cluster whose resource tree was 62 levels deep,
/// journaled it, and every start after it exited 2 (the journal's JSON reader stops at 128
/// levels of nesting). A tree deeper than the model takes is refused before anything is
/// stored, naming the level and the limit; the deepest tree taken is acknowledged, and a
/// kill -9 restart serves it.
#[tokio::test]
async fn a_tree_too_deep_is_refused_and_the_deepest_one_taken_survives_a_restart() {
    let deepest = cdnmap_mapper::MAX_TREE_DEPTH;
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let mut admin = server.admin();
    let refused = admin
        .upsert_cluster(authed(chain_cluster("deep-62", 62), Some(TOKEN)))
        .await
        .expect_err("a tree 62 levels deep is refused");
    assert_eq!(refused.code(), tonic::Code::InvalidArgument, "{refused:?}");
    assert_eq!(
        refused.message(),
        format!(
            "resources: node \"n{0}\" is at level {0}, deeper than the {deepest} levels a \
             resource tree may have",
            deepest + 1
        )
    );
    ok(
        admin
            .upsert_cluster(authed(chain_cluster("deep-max", deepest), Some(TOKEN)))
            .await,
        "UpsertCluster at the deepest",
    );
    drop(admin);
    server.kill();
    let server = setup.start().await;
    let mut admin = server.admin();
    let get = |id: &str| authed(pb::GetClusterRequest { id: id.into() }, Some(TOKEN));
    let kept = ok(admin.get_cluster(get("deep-max")).await, "GetCluster");
    assert_eq!(
        kept.resources.as_ref().map(levels),
        Some(deepest),
        "the deepest tree, kept"
    );
    let gone = admin
        .get_cluster(get("deep-62"))
        .await
        .expect_err("never stored");
    assert_eq!(gone.code(), tonic::Code::NotFound);
    resolves(&server, &all_units(&server).await[0]).await;
}

/// Sets `cluster` to `state` through Admin, then waits for the first stored version after
/// `base` whose diff from version `from(it)` moves demand out of the cluster: that version's
/// status and the diff (`Admin.DiffMaps`).
async fn set_and_diff(
    server: &Server,
    (cluster, state): (&str, pb::ClusterState),
    base: u64,
    from: impl Fn(u64) -> u64,
) -> (pb::Status, pb::MapDiff) {
    let mut admin = server.admin();
    let request = pb::SetClusterStateRequest {
        id: cluster.to_string(),
        state: state as i32,
        reason: "a test of map diffs".into(),
        force: false,
    };
    ok(
        admin.set_cluster_state(authed(request, Some(TOKEN))).await,
        "SetClusterState",
    );
    let mut after = round_after(server, base).await;
    loop {
        stored_version(server, after.map_version).await;
        let request = pb::DiffMapsRequest {
            from_version: from(after.map_version),
            to_version: after.map_version,
            max_flows: 0,
            max_units: 5,
        };
        let d = ok(
            admin.diff_maps(authed(request, Some(TOKEN))).await,
            "DiffMaps",
        );
        if d.flows.iter().any(|f| f.from_cluster == cluster) {
            return (after, d);
        }
        after = round_after(server, after.map_version).await;
    }
}

/// `Admin.DiffMaps` and `cdnmap store diff` on a running server's store: a cluster that held
/// demand goes down, and the diff of the maps just before and after says its demand left it and
/// none went to it. The moved share of two consecutive versions is the churn the round reported
/// (`Admin.GetStatus`, the engine's own measure, read from the maps in memory, where the diff
/// reads them back from the store); the command line prints the same figures. A version not
/// stored is NOT_FOUND, a call without the token UNAUTHENTICATED.
#[tokio::test(flavor = "multi_thread")]
async fn a_cluster_down_shows_in_the_diff_of_the_stored_maps() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let first = round_after(&server, 0).await;
    let units = all_units(&server).await;
    let down = resolves(&server, &units[0]).await.cluster_ids[0].clone();
    let mut admin = server.admin();
    // The first round that no longer places anything at the down cluster, against the one
    // before it.
    let (after, diffed) = set_and_diff(
        &server,
        (&down, pb::ClusterState::Down),
        first.map_version,
        |v| v - 1,
    )
    .await;
    assert_eq!(diffed.to_version, after.map_version);
    assert!(
        (diffed.moved_share - after.churn).abs() < 1e-9,
        "the diff's {} against the round's churn {}",
        diffed.moved_share,
        after.churn
    );
    assert!(
        diffed.flows.iter().all(|f| f.to_cluster != down),
        "{diffed:?}"
    );
    let flowed: f64 = diffed.flows.iter().map(|f| f.demand).sum();
    assert!(diffed.flow_count as usize == diffed.flows.len());
    assert!(
        (flowed - diffed.moved).abs() <= 1e-6 * diffed.moved,
        "{diffed:?}"
    );
    assert!(diffed.units_changed > 0 && diffed.changed_units.len() <= 5);
    assert_eq!(diffed.units_compared as usize, units.len());

    // The command line, on the same store, says the same.
    let data = setup.dir.path().join("data");
    let out = std::process::Command::new(bin!())
        .args(["store", "diff", "--data-dir"])
        .arg(&data)
        .args([
            (after.map_version - 1).to_string(),
            after.map_version.to_string(),
        ])
        .output()
        .expect("run cdnmap store diff");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}");
    let headline = format!(
        "map version {} -> {}: {:.1} of {:.1} demand moved ({:.3}%), {} of {} map units changed",
        after.map_version - 1,
        after.map_version,
        diffed.moved,
        diffed.demand,
        100.0 * diffed.moved_share,
        diffed.units_changed,
        diffed.units_compared
    );
    assert!(stdout.starts_with(&headline), "{headline}\n{stdout}");
    // `cdnmap map diff` is the same command.
    let again = std::process::Command::new(bin!())
        .args(["map", "diff", "--data-dir"])
        .arg(&data)
        .args([
            (after.map_version - 1).to_string(),
            after.map_version.to_string(),
        ])
        .output()
        .expect("run cdnmap map diff");
    assert!(again.status.success());
    assert_eq!(String::from_utf8_lossy(&again.stdout), stdout);

    let missing = pb::DiffMapsRequest {
        from_version: 999_999,
        ..Default::default()
    };
    let e = admin
        .diff_maps(authed(missing, Some(TOKEN)))
        .await
        .expect_err("not stored");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(
        e.message().contains("map version 999999 is not stored"),
        "{e:?}"
    );
    let e = admin
        .diff_maps(authed(missing, None))
        .await
        .expect_err("no token");
    assert_eq!(e.code(), tonic::Code::Unauthenticated);
    server.terminate().await;
}

/// `Admin.Preview` of a drain, then the drain itself (issue 45, "predicted against observed"):
/// the next round moves the demand the preview said it would (within 5%), with the overflow
/// it said; nothing is published by the preview; an unknown cluster is NOT_FOUND.
#[tokio::test(flavor = "multi_thread")]
async fn a_previewed_drain_moves_what_the_preview_said() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    let first = round_after(&server, 0).await;
    let units = all_units(&server).await;
    let drained = resolves(&server, &units[0]).await.cluster_ids[0].clone();
    let mut admin = server.admin();
    let change = |id: &str| pb::ClusterStateChange {
        id: id.to_string(),
        state: pb::ClusterState::Drained as i32,
    };
    let request = pb::PreviewRequest {
        changes: vec![change(&drained)],
        max_flows: 0,
        max_units: 5,
        edits: Vec::new(),
    };
    let p = ok(admin.preview(authed(request, Some(TOKEN))).await, "Preview");
    let predicted = p.diff.clone().expect("the diff");
    // The moved demand by region: each region's units among the changed ones, all of them
    // when there are few regions.
    let by_region: f64 = p.regions.iter().map(|r| r.moved).sum();
    assert!(!p.regions.is_empty(), "{p:?}");
    assert!(by_region <= predicted.moved * (1.0 + 1e-9), "{p:?}");
    if p.regions.len() < 20 {
        assert!(
            (by_region - predicted.moved).abs() <= 1e-6 * predicted.moved,
            "{p:?}"
        );
    }
    assert!(p.based_on_version >= first.map_version);
    let out: f64 = predicted
        .flows
        .iter()
        .filter(|f| f.from_cluster == drained)
        .map(|f| f.demand)
        .sum();
    assert!(
        out > 0.0,
        "the drained cluster's demand moves: {predicted:?}"
    );
    assert!(predicted.flows.iter().all(|f| f.to_cluster != drained));
    assert_eq!(
        status(&server).await.map_version,
        p.based_on_version,
        "nothing published"
    );

    // The first round after the drain against the map the preview started from.
    let (after, observed) = set_and_diff(
        &server,
        (&drained, pb::ClusterState::Drained),
        p.based_on_version,
        |_| p.based_on_version,
    )
    .await;
    eprintln!(
        "moved: predicted {:.1} observed {:.1}; overflow share: predicted {:.4} observed {:.4}",
        predicted.moved, observed.moved, p.overflow_share_after, after.overflow_share
    );
    let within = |a: f64, b: f64| (a - b).abs() <= 0.05 * a.abs().max(b.abs()).max(1e-9);
    assert!(
        within(predicted.moved, observed.moved),
        "moved: predicted {} observed {}",
        predicted.moved,
        observed.moved
    );
    assert!(
        within(p.overflow_share_after, after.overflow_share)
            || (p.overflow_share_after - after.overflow_share).abs() < 1e-3,
        "overflow share: predicted {} observed {}",
        p.overflow_share_after,
        after.overflow_share
    );
    let request = pb::PreviewRequest {
        changes: vec![change("no-such-cluster")],
        ..Default::default()
    };
    let e = admin
        .preview(authed(request, Some(TOKEN)))
        .await
        .expect_err("unknown cluster");
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    assert!(
        e.message()
            .contains("changes[0]: no cluster \"no-such-cluster\""),
        "{e:?}"
    );
    server.terminate().await;
}

/// `Admin.Preview` of other changes (issue 45, "any set of Admin changes"): a cluster's
/// capacity halved (an upsert, as `UpsertCluster` would make it) moves demand off it without
/// changing the topology in service; a map unit deleted shows as removed; an edit that does not
/// apply is INVALID_ARGUMENT naming its position among all the changes.
#[tokio::test(flavor = "multi_thread")]
async fn previews_take_any_topology_edit() {
    let mut setup = Setup::new(bin!(), true);
    let server = setup.start().await;
    round_after(&server, 0).await;
    let units = all_units(&server).await;
    let busy = resolves(&server, &units[0]).await.cluster_ids[0].clone();
    let mut admin = server.admin();
    let get = pb::GetClusterRequest { id: busy.clone() };
    let cluster = ok(
        admin.get_cluster(authed(get.clone(), Some(TOKEN))).await,
        "GetCluster",
    );
    fn halve(n: &mut pb::ResourceNode) {
        n.capacity *= 0.5;
        n.children.iter_mut().for_each(halve);
    }
    let mut halved = cluster.clone();
    halved
        .resources
        .as_mut()
        .map(halve)
        .expect("a resource tree");
    let edit = |e: pb::preview_edit::Edit| pb::PreviewEdit { edit: Some(e) };
    let request = pb::PreviewRequest {
        edits: vec![edit(pb::preview_edit::Edit::UpsertCluster(halved))],
        max_units: 5,
        ..Default::default()
    };
    let p = ok(admin.preview(authed(request, Some(TOKEN))).await, "Preview");
    let d = p.diff.clone().expect("the diff");
    let out: f64 = d
        .flows
        .iter()
        .filter(|f| f.from_cluster == busy)
        .map(|f| f.demand)
        .sum();
    assert!(out > 0.0 && d.moved >= out, "{d:?}");
    assert!(p.overflow_after >= p.overflow_before, "{p:?}");
    let now = ok(
        admin.get_cluster(authed(get, Some(TOKEN))).await,
        "GetCluster",
    );
    assert_eq!(now, cluster, "a preview changes nothing");

    let request = pb::PreviewRequest {
        edits: vec![edit(pb::preview_edit::Edit::DeleteMapUnit(
            units[0].id.clone(),
        ))],
        ..Default::default()
    };
    let p = ok(admin.preview(authed(request, Some(TOKEN))).await, "Preview");
    assert_eq!(p.diff.expect("the diff").units_removed, 1);

    let mut stray = units[0].clone();
    stray.traffic_class = "no-such-class".into();
    let request = pb::PreviewRequest {
        changes: vec![pb::ClusterStateChange {
            id: busy.clone(),
            state: pb::ClusterState::Drained as i32,
        }],
        edits: vec![edit(pb::preview_edit::Edit::UpsertMapUnit(stray))],
        ..Default::default()
    };
    let e = admin
        .preview(authed(request, Some(TOKEN)))
        .await
        .expect_err("an edit that does not apply");
    assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("changes[1]: "), "{e:?}");
    server.terminate().await;
}
