//! Apache Traffic Control coverage zone files: client networks grouped into cache groups,
//! each group perhaps with coordinates, and a world of them ([`world_of`]).
//!
//! The format (Traffic Router's `coverageZones`, and `deepCoverageZones` alike):
//!
//! ```json
//! {"coverageZones": {"us-east": {"network": ["192.0.2.0/24"], "network6": ["2001:db8::/48"],
//!                                "coordinates": {"latitude": 39.0, "longitude": -77.5}}}}
//! ```
//!
//! Every network becomes map units, one per class of the mix, id `NETWORK-CLASS`. A mapping
//! table names the cluster of each group: that cluster is the units' first candidate, and the
//! other clusters follow by their RTT estimate from the zone's coordinates (from the group's
//! cluster when the zone has none), at most `candidates` of them within `max_rtt_ms`. The
//! group's cluster is scored [`GROUP_MARGIN_MS`] below the best of the others when it is not
//! nearer (an operator's coverage zone outranks distance). A group the table does not name is reported, and its networks
//! placed by distance from its coordinates; one with neither is reported and left out. A
//! network in two zones is taken from the first (coverage zones before deep ones, then in
//! the file's order) and counted.

use std::collections::{BTreeMap, HashSet};

use anyhow::{bail, ensure, Context, Result};
use cdnmap_mapper::model::{ClusterIdx, DEFAULT_MAX_CANDIDATES, MAX_MAP_UNITS};
use cdnmap_mapper::{CandidateSpec, Limits, MapUnitSpec};
use cdnmap_topology::{Topology, TopologyBuilder};
use ipnet::IpNet;
use serde_json::Value;

use crate::world::{rtt_ms, ClassMix};

/// One group's zone.
#[derive(Debug, Clone, PartialEq)]
pub struct Zone {
    pub group: String,
    pub networks: Vec<IpNet>,
    /// (latitude, longitude).
    pub coordinates: Option<(f64, f64)>,
    /// From `deepCoverageZones`.
    pub deep: bool,
}

/// How far below the best other cluster a group's cluster is scored when it is not nearer.
pub const GROUP_MARGIN_MS: f64 = 0.01;

/// Most groups in a file.
pub const MAX_GROUPS: usize = 1_000_000;

/// The zones of the coverage zone file `text` (`what` names it in errors): those of
/// `coverageZones`, then of `deepCoverageZones`, each in the file's order. Refuses a file with
/// neither, a CIDR that does not parse (naming the group and the entry), coordinates out of
/// range or half given, and fields of the wrong type.
pub fn parse(text: &str, what: &str) -> Result<Vec<Zone>> {
    let doc: Value = serde_json::from_str(text).with_context(|| format!("{what}: not JSON"))?;
    let Some(top) = doc.as_object() else {
        bail!("{what}: not a JSON object");
    };
    ensure!(
        top.contains_key("coverageZones") || top.contains_key("deepCoverageZones"),
        "{what}: neither coverageZones nor deepCoverageZones"
    );
    let mut zones = Vec::new();
    let mut networks = 0usize;
    for (key, deep) in [("coverageZones", false), ("deepCoverageZones", true)] {
        let Some(groups) = top.get(key) else {
            continue;
        };
        let Some(groups) = groups.as_object() else {
            bail!("{what}: {key} is not an object of groups");
        };
        ensure!(
            zones.len() + groups.len() <= MAX_GROUPS,
            "{what}: more than {MAX_GROUPS} groups"
        );
        for (group, zone) in groups {
            let at = format!("{what}: {key}.{group}");
            ensure!(
                !group.is_empty(),
                "{what}: {key}: a group with an empty name"
            );
            let Some(zone) = zone.as_object() else {
                bail!("{at}: not an object");
            };
            let mut nets = Vec::new();
            for field in ["network", "network6"] {
                let Some(list) = zone.get(field) else {
                    continue;
                };
                let Some(list) = list.as_array() else {
                    bail!("{at}.{field}: not a list of networks");
                };
                for (i, entry) in list.iter().enumerate() {
                    let Some(s) = entry.as_str() else {
                        bail!("{at}.{field}[{i}]: {entry} is not a string");
                    };
                    let net: IpNet = s
                        .trim()
                        .parse()
                        .map_err(|_| anyhow::anyhow!("{at}.{field}[{i}]: {s:?} is not a CIDR"))?;
                    ensure!(
                        (field == "network") == net.addr().is_ipv4(),
                        "{at}.{field}[{i}]: {s:?} is IPv{} (network holds IPv4, network6 IPv6)",
                        if net.addr().is_ipv4() { 4 } else { 6 }
                    );
                    // A v4-mapped network6 entry is its IPv4 network (as the index has it).
                    nets.push(cdnmap_topology::canonical(&net).trunc());
                }
            }
            networks += nets.len();
            ensure!(
                networks <= MAX_MAP_UNITS,
                "{what}: more than {MAX_MAP_UNITS} networks"
            );
            let coordinates = match zone.get("coordinates") {
                None | Some(Value::Null) => None,
                Some(c) => {
                    let get = |k: &str| c.get(k).and_then(Value::as_f64);
                    match (get("latitude"), get("longitude")) {
                        (Some(lat), Some(lon))
                            if (-90.0..=90.0).contains(&lat) && (-180.0..=180.0).contains(&lon) =>
                        {
                            Some((lat, lon))
                        }
                        _ => bail!(
                            "{at}.coordinates: {c} needs a latitude in [-90, 90] and a longitude in [-180, 180]"
                        ),
                    }
                }
            };
            zones.push(Zone {
                group: group.clone(),
                networks: nets,
                coordinates,
                deep,
            });
        }
    }
    Ok(zones)
}

/// What [`world_of`] made of the zones.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Report {
    /// Networks taken (each one unit per class of the mix).
    pub networks: usize,
    /// Groups the mapping table does not name, with their networks (placed by distance).
    pub unknown_groups: Vec<(String, usize)>,
    /// Groups left out: not in the table and without coordinates, with their networks.
    pub left_out: Vec<(String, usize)>,
    /// Groups of the table that no zone has.
    pub unused: Vec<String>,
    /// Networks in more than one zone (the first zone's taken).
    pub duplicates: usize,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let list = |v: &[(String, usize)]| {
            v.iter()
                .map(|(g, n)| format!("{g} ({n} networks)"))
                .collect::<Vec<_>>()
                .join(", ")
        };
        writeln!(f, "{} networks taken", self.networks)?;
        if !self.unknown_groups.is_empty() {
            writeln!(
                f,
                "groups the mapping does not name, placed by distance from their coordinates: {}",
                list(&self.unknown_groups)
            )?;
        }
        if !self.left_out.is_empty() {
            writeln!(
                f,
                "groups left out (not in the mapping, no coordinates): {}",
                list(&self.left_out)
            )?;
        }
        if !self.unused.is_empty() {
            writeln!(f, "mapped groups no zone has: {}", self.unused.join(", "))?;
        }
        write!(
            f,
            "{} networks in more than one zone (the first taken)",
            self.duplicates
        )
    }
}

/// The settings of [`world_of`].
#[derive(Debug, Clone)]
pub struct ZoneParams {
    pub mix: ClassMix,
    /// At most this many candidates per unit.
    pub candidates: usize,
    /// Clusters farther than this RTT estimate are not candidates (the group's always is).
    pub max_rtt_ms: f64,
}

/// A world of `zones`' networks over `base`'s clusters and classes (its map units are not
/// taken), with `groups` naming each group's cluster (module docs).
pub fn world_of(
    zones: &[Zone],
    base: &Topology,
    groups: &BTreeMap<String, String>,
    params: &ZoneParams,
) -> Result<(Topology, Report)> {
    let instance = &base.instance;
    let class_names: Vec<&str> = instance.classes().iter().map(|c| c.name.as_str()).collect();
    let classes = params.mix.classes_in(&class_names)?;
    check_params(params)?;
    let clusters = instance.clusters();
    let mut report = Report::default();
    let in_file: HashSet<&str> = zones.iter().map(|z| z.group.as_str()).collect();
    report.unused = groups
        .keys()
        .filter(|g| !in_file.contains(g.as_str()))
        .cloned()
        .collect();
    let group_cluster = group_clusters(groups, clusters)?;
    let mut zoned = zone_candidates(zones, clusters, &group_cluster, params, &mut report);
    // The first zone's network of each; then in id order (the network's text, then the
    // class), so the builder need not sort.
    let mut seen: HashSet<IpNet> = HashSet::with_capacity(zoned.taken.len());
    let before = zoned.taken.len();
    zoned.taken.retain(|(n, _)| seen.insert(*n));
    drop(seen);
    report.duplicates = before - zoned.taken.len();
    report.networks = zoned.taken.len();
    ensure!(
        !zoned.taken.is_empty(),
        "no network to map (every zone left out or empty)"
    );
    let map_units = zoned.taken.len().saturating_mul(classes.len());
    ensure!(
        map_units <= MAX_MAP_UNITS,
        "{} networks × {} classes make {map_units} map units, at most {MAX_MAP_UNITS}",
        zoned.taken.len(),
        classes.len()
    );
    let topology = build(base, &zoned, (&classes, &class_names), map_units, params)?;
    Ok((topology, report))
}

/// Refuses a candidate count outside 1..=255 and an RTT bound that is not a number > 0.
fn check_params(params: &ZoneParams) -> Result<()> {
    ensure!(
        (1..=255).contains(&params.candidates),
        "candidates must be in 1..=255, got {}",
        params.candidates
    );
    ensure!(
        params.max_rtt_ms.is_finite() && params.max_rtt_ms > 0.0,
        "max_rtt_ms must be a finite number > 0, got {}",
        params.max_rtt_ms
    );
    Ok(())
}

/// Each group's cluster by index; an error names a group whose cluster does not exist.
fn group_clusters<'a>(
    groups: &'a BTreeMap<String, String>,
    clusters: &[cdnmap_mapper::Cluster],
) -> Result<BTreeMap<&'a str, ClusterIdx>> {
    let mut group_cluster: BTreeMap<&str, ClusterIdx> = BTreeMap::new();
    for (g, c) in groups {
        let Some(j) = clusters.iter().position(|x| &x.id == c) else {
            bail!("the mapping names cluster {c:?} for group {g:?}, and there is no such cluster");
        };
        group_cluster.insert(g, j as ClusterIdx);
    }
    Ok(group_cluster)
}

/// The zones' networks with their zone, and each zone's candidates and origin.
struct Zoned {
    /// Every network of a zone that is mapped, with the zone's index.
    taken: Vec<(IpNet, usize)>,
    /// Each zone's candidates: (score, cluster), best first (empty for a zone left out).
    lists: Vec<Vec<(f64, ClusterIdx)>>,
    /// Each zone's (lat, lon).
    origins: Vec<(f64, f64)>,
}

/// Each zone's candidates from where it is (its coordinates, else its group's cluster); a
/// zone with neither is left out, one whose group has no cluster is told in `report`.
fn zone_candidates(
    zones: &[Zone],
    clusters: &[cdnmap_mapper::Cluster],
    group_cluster: &BTreeMap<&str, ClusterIdx>,
    params: &ZoneParams,
    report: &mut Report,
) -> Zoned {
    let mut zoned = Zoned {
        taken: Vec::new(),
        lists: Vec::with_capacity(zones.len()),
        origins: Vec::with_capacity(zones.len()),
    };
    for (z, zone) in zones.iter().enumerate() {
        let mine = group_cluster.get(zone.group.as_str()).copied();
        let origin = match (zone.coordinates, mine) {
            (Some(at), _) => at,
            (None, Some(j)) => (clusters[j as usize].lat, clusters[j as usize].lon),
            (None, None) => {
                report
                    .left_out
                    .push((zone.group.clone(), zone.networks.len()));
                zoned.lists.push(Vec::new());
                zoned.origins.push((0.0, 0.0));
                continue;
            }
        };
        if mine.is_none() {
            report
                .unknown_groups
                .push((zone.group.clone(), zone.networks.len()));
        }
        zoned
            .lists
            .push(candidates_from(origin, mine, clusters, params));
        zoned.origins.push(origin);
        zoned.taken.extend(zone.networks.iter().map(|&n| (n, z)));
    }
    zoned
}

/// The candidates of a zone at `origin`: its group's cluster `mine` first (scored strictly
/// below the best other), then the nearest within the bound, at least the nearest one.
fn candidates_from(
    origin: (f64, f64),
    mine: Option<ClusterIdx>,
    clusters: &[cdnmap_mapper::Cluster],
    params: &ZoneParams,
) -> Vec<(f64, ClusterIdx)> {
    let mut by_rtt: Vec<(f64, ClusterIdx)> = clusters
        .iter()
        .enumerate()
        .filter(|&(j, _)| Some(j as ClusterIdx) != mine)
        .map(|(j, c)| (rtt_ms(origin.0, origin.1, c.lat, c.lon), j as ClusterIdx))
        .collect();
    by_rtt.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
    let mut list = Vec::with_capacity(params.candidates);
    if let Some(j) = mine {
        let c = &clusters[j as usize];
        let own = rtt_ms(origin.0, origin.1, c.lat, c.lon);
        // Strictly below the best other (candidates are ordered by score, then cluster).
        let best = by_rtt.first().map_or(own, |b| b.0 - GROUP_MARGIN_MS);
        list.push((own.min(best).max(0.0), j));
    }
    for &(rtt, j) in &by_rtt {
        if list.len() >= params.candidates || rtt > params.max_rtt_ms {
            break;
        }
        list.push((rtt, j));
    }
    if list.is_empty() {
        // Nothing within reach: the nearest cluster.
        list.extend(by_rtt.first().copied());
    }
    list
}

/// The topology: `base`'s clusters and classes, a map unit per network taken and class (in
/// id order: the network's text, then the class).
fn build(
    base: &Topology,
    zoned: &Zoned,
    (classes, class_names): (&[(usize, f64)], &[&str]),
    map_units: usize,
    params: &ZoneParams,
) -> Result<Topology> {
    let instance = &base.instance;
    let clusters = instance.clusters();
    let mut order: Vec<(String, usize)> = zoned
        .taken
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.to_string(), i))
        .collect();
    order.sort_unstable();
    let specs = crate::world::cluster_specs_of(instance)
        .into_iter()
        .enumerate()
        .map(|(j, spec)| (spec, base.cluster_addresses(j as ClusterIdx).to_vec()))
        .collect();
    let limits = Limits {
        max_candidates: params.candidates.max(DEFAULT_MAX_CANDIDATES),
    };
    let mut builder = TopologyBuilder::new(instance.classes().to_vec(), specs, limits)?;
    builder.reserve(map_units, map_units * params.candidates, map_units);
    let mut id = String::with_capacity(64);
    let mut candidates: Vec<CandidateSpec<'_>> = Vec::with_capacity(params.candidates);
    for (text, i) in &order {
        let (net, z) = zoned.taken[*i];
        candidates.clear();
        candidates.extend(zoned.lists[z].iter().map(|&(score, j)| CandidateSpec {
            cluster: &clusters[j as usize].id,
            score,
            cluster_rank: None,
        }));
        let (lat, lon) = zoned.origins[z];
        for &(k, share) in classes {
            id.clear();
            id.push_str(text);
            id.push('-');
            id.push_str(class_names[k]);
            builder.push_unit(
                &MapUnitSpec {
                    id: &id,
                    class: class_names[k],
                    demand: share,
                    lat,
                    lon,
                    candidates: &candidates,
                },
                std::slice::from_ref(&net),
            )?;
        }
    }
    Ok(builder.finish()?)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::world::{generate, WorldParams};

    const GOOD: &str = r#"{
      "coverageZones": {
        "east": {"network": ["192.0.2.0/24", "198.51.100.0/25"], "network6": ["2001:db8:1::/48"],
                 "coordinates": {"latitude": 40.7, "longitude": -74.0}},
        "west": {"network": ["203.0.113.0/24"]},
        "unmapped": {"network": ["10.1.0.0/16"], "coordinates": {"latitude": 51.5, "longitude": -0.1}},
        "nowhere": {"network": ["10.2.0.0/16"]}
      },
      "deepCoverageZones": {
        "east-deep": {"network": ["192.0.2.0/24", "10.3.0.0/16"],
                      "coordinates": {"latitude": 40.7, "longitude": -74.0}}
      }
    }"#;

    fn base() -> Topology {
        generate(
            &WorldParams {
                map_units: 30,
                clusters: 40,
                seed: 5,
                ..WorldParams::default()
            },
            &|_| {},
        )
        .expect("a world")
    }

    /// A good file: every network of a mapped group becomes a unit per class with the group's
    /// cluster first and the rest by distance; the unmapped group with coordinates is placed
    /// by distance and reported, the one without is left out and reported; a network in a
    /// deep zone too is taken once; a mapped group no zone has is reported.
    #[test]
    fn a_coverage_zone_file_becomes_units_with_the_groups_cluster_first() {
        let zones = parse(GOOD, "czf.json").expect("parses");
        assert_eq!(zones.len(), 5);
        assert_eq!(zones[0].group, "east");
        assert!(zones[4].deep);
        let base = base();
        let ids: Vec<String> = base
            .instance
            .clusters()
            .iter()
            .map(|c| c.id.clone())
            .collect();
        // East is mapped to the cluster farthest from New York; west (no coordinates) to
        // another.
        let far = base
            .instance
            .clusters()
            .iter()
            .max_by(|a, b| {
                rtt_ms(40.7, -74.0, a.lat, a.lon).total_cmp(&rtt_ms(40.7, -74.0, b.lat, b.lon))
            })
            .expect("clusters")
            .id
            .clone();
        let west = ids
            .iter()
            .find(|&i| *i != far)
            .expect("two clusters")
            .clone();
        let groups = BTreeMap::from([
            ("east".to_string(), far.clone()),
            ("east-deep".to_string(), far.clone()),
            ("west".to_string(), west.clone()),
            ("gone".to_string(), west.clone()),
        ]);
        let params = ZoneParams {
            mix: "web=0.5,video=0.5".parse().expect("a mix"),
            candidates: 4,
            max_rtt_ms: 150.0,
        };
        let (world, report) = world_of(&zones, &base, &groups, &params).expect("a world");
        assert_eq!(report.networks, 6, "{report}");
        assert_eq!(report.duplicates, 1);
        assert_eq!(report.unknown_groups, vec![("unmapped".to_string(), 1)]);
        assert_eq!(report.left_out, vec![("nowhere".to_string(), 1)]);
        assert_eq!(report.unused, vec!["gone".to_string()]);
        let inst = &world.instance;
        assert_eq!(inst.unit_count(), 12);
        let first = |unit: &str| {
            let u = inst
                .unit_index(unit)
                .unwrap_or_else(|| panic!("no unit {unit}"));
            let c: Vec<String> = inst
                .candidates(u)
                .map(|c| inst.clusters()[c.cluster as usize].id.clone())
                .collect();
            let scores: Vec<f32> = inst.candidates(u).map(|c| c.score).collect();
            (c, scores)
        };
        // Brute force: the clusters other than `but` by RTT estimate from (lat, lon).
        let nearest = |lat: f64, lon: f64, but: &str| {
            let mut all: Vec<(f64, String)> = inst
                .clusters()
                .iter()
                .filter(|c| c.id != but)
                .map(|c| (rtt_ms(lat, lon, c.lat, c.lon), c.id.clone()))
                .collect();
            all.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            all.into_iter().map(|x| x.1).take(3).collect::<Vec<_>>()
        };
        let (east, scores) = first("192.0.2.0/24-web");
        assert_eq!(east[0], far, "the group's cluster first");
        assert_eq!(
            east[1..],
            nearest(40.7, -74.0, &far)[..],
            "then by distance"
        );
        assert!(scores.windows(2).all(|w| w[0] <= w[1]), "{scores:?}");
        assert_eq!(first("2001:db8:1::/48-video").0, east);
        let (w, _) = first("203.0.113.0/24-web");
        assert_eq!(w[0], west);
        let at = inst.clusters().iter().find(|c| c.id == west).expect("west");
        assert_eq!(
            w[1..],
            nearest(at.lat, at.lon, &west)[..],
            "by distance from the cluster"
        );
        let (unmapped, _) = first("10.1.0.0/16-web");
        assert_eq!(
            unmapped[..3],
            nearest(51.5, -0.1, "")[..],
            "by distance alone"
        );
        assert!(inst.unit_index("10.2.0.0/16-web").is_none(), "left out");
        assert!(
            inst.unit_index("10.3.0.0/16-web").is_some(),
            "a deep zone's own network"
        );
        assert_eq!(inst.clusters().len(), base.instance.clusters().len());
    }

    /// Bad files are refused naming the group and the entry; missing fields and wrong types
    /// name the field.
    #[test]
    fn a_bad_coverage_zone_file_is_refused_naming_the_group_and_entry() {
        for (text, names) in [
            ("[]", "not a JSON object"),
            ("{}", "neither coverageZones"),
            (r#"{"coverageZones": []}"#, "coverageZones is not an object"),
            (
                r#"{"coverageZones": {"g": 3}}"#,
                "coverageZones.g: not an object",
            ),
            (
                r#"{"coverageZones": {"g": {"network": ["192.0.2.0/24", "192.0.2/24"]}}}"#,
                "coverageZones.g.network[1]: \"192.0.2/24\" is not a CIDR",
            ),
            (
                r#"{"coverageZones": {"g": {"network": ["2001:db8::/32"]}}}"#,
                "coverageZones.g.network[0]",
            ),
            (
                r#"{"coverageZones": {"g": {"network": "192.0.2.0/24"}}}"#,
                "g.network: not a list",
            ),
            (
                r#"{"coverageZones": {"g": {"network6": [7]}}}"#,
                "g.network6[0]: 7 is not a string",
            ),
            (
                r#"{"coverageZones": {"g": {"coordinates": {"latitude": 1}}}}"#,
                "g.coordinates",
            ),
            (
                r#"{"coverageZones": {"g": {"coordinates": {"latitude": 91, "longitude": 0}}}}"#,
                "g.coordinates",
            ),
            ("{\"coverageZones\": {\"g\": ", "not JSON"),
        ] {
            let e = parse(text, "bad.json").expect_err(text).to_string();
            assert!(e.contains("bad.json") && e.contains(names), "{text}: {e}");
        }
        // A mapping naming a cluster that does not exist.
        let zones = parse(GOOD, "czf.json").expect("parses");
        let groups = BTreeMap::from([("east".to_string(), "no-such-1".to_string())]);
        let params = ZoneParams {
            mix: ClassMix::default(),
            candidates: 4,
            max_rtt_ms: 150.0,
        };
        let e = world_of(&zones, &base(), &groups, &params).expect_err("no cluster");
        assert!(
            e.to_string().contains("no-such-1") && e.to_string().contains("east"),
            "{e}"
        );
    }
}
