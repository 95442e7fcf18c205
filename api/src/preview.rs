//! `Admin.Preview`: what the next round would publish after an operator's changes (any topology
//! edit: cluster states, clusters and map units upserted or deleted), computed by
//! the rounds' own code (`cdnmap_engine::round::preview`) from the map in service and the
//! forecast it was solved with; nothing is published or stored. One preview at a time (each
//! is a solve), off the async threads; the round loop's driver is locked only to read how it
//! solves.

use std::sync::Arc;

use cdnmap_engine::round::{preview, Snapshot};
use cdnmap_mapper::diff::MapDiff;
use cdnmap_mapper::{ClusterState, Instance, Map};
use cdnmap_store::edit::{apply, Edit, EditError};
use cdnmap_topology::Topology;

use crate::service::Shared;

/// Previews run one at a time.
static PREVIEWS: tokio::sync::Semaphore = tokio::sync::Semaphore::const_new(1);

/// The most changes a preview takes.
pub const MAX_CHANGES: usize = 1_000;

/// Why a preview was not made.
#[derive(Debug, thiserror::Error)]
pub enum PreviewError {
    #[error("another preview is running: retry when it is done")]
    Busy,
    #[error("no map yet: the first round has not finished")]
    NoMap,
    #[error("{0}")]
    Invalid(String),
    #[error("changes[{0}]: no cluster {1:?}")]
    NoCluster(usize, String),
    #[error("the preview failed: {0}")]
    Failed(String),
}

/// A map's figures an operator compares before and after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Figures {
    pub overflow: f64,
    pub overflow_share: f64,
    /// Resource nodes at 99.9% of their capacity or more.
    pub nodes_full: u64,
    pub mean_rtt_ms: f64,
    /// The map's cost under the topology's cost policy (`None`: no policy).
    pub cost: Option<f64>,
}

/// The resource nodes of `inst` whose `usage` (by global node index) is at 99.9% of their
/// capacity or more: what the previews, the guard and the ramps count as full.
pub fn nodes_full(inst: &Instance, usage: &[f64]) -> u64 {
    let mut full = 0;
    for (c, cl) in inst.clusters().iter().enumerate() {
        for (n, node) in cl.nodes.iter().enumerate() {
            let u = usage[inst.global_node(c as u32, n as u32)];
            if node.capacity > 0.0 && u >= 0.999 * node.capacity {
                full += 1;
            }
        }
    }
    full
}

impl Figures {
    /// The figures of `map` of `inst`, its scores measured in `measured`.
    pub fn of(inst: &Instance, map: &Map, measured: &cdnmap_mapper::rescore::Rescore) -> Figures {
        let nodes_full = nodes_full(inst, &cdnmap_mapper::map::node_usage(inst, map));
        let demand = inst.total_demand();
        let overflow = map.total_overflow();
        Figures {
            overflow,
            overflow_share: if demand > 0.0 { overflow / demand } else { 0.0 },
            nodes_full,
            mean_rtt_ms: cdnmap_engine::figures::mean_score(inst, map, measured).unwrap_or(0.0),
            cost: cdnmap_mapper::policy::map_cost(inst, map),
        }
    }
}

/// A preview: the map it starts from, the diff to the previewed map, and the figures of both.
pub struct Previewed {
    pub based_on: u64,
    pub diff: MapDiff,
    pub before: Figures,
    pub after: Figures,
    /// The moved demand by the region its units are in, the most first ([`MAX_REGIONS`]).
    pub regions: Vec<cdnmap_engine::figures::RegionMove>,
}

/// The most regions a preview lists.
pub const MAX_REGIONS: usize = 20;

/// `topology` with `edits` applied in order; an edit that does not apply is named by its
/// position.
fn edited(topology: &Topology, edits: &[Edit]) -> Result<Topology, PreviewError> {
    let mut t = Arc::new(topology.clone());
    for (i, e) in edits.iter().enumerate() {
        t = match apply(&t, e) {
            Ok(a) => a.topology,
            Err(EditError::NoCluster(id)) => return Err(PreviewError::NoCluster(i, id)),
            Err(e) => return Err(PreviewError::Invalid(format!("changes[{i}]: {e}"))),
        };
    }
    Ok(Arc::unwrap_or_clone(t))
}

/// When a preview may run while another does (one runs at a time: each holds a whole map).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Turn {
    /// An operator asking: waits up to [`ASK_WAIT`] for the one running, then
    /// [`PreviewError::Busy`].
    Now,
    /// After the ones before it: the guard's check of a change.
    Queue,
    /// Only if none is running ([`PreviewError::Busy`] otherwise): the N-1 view's exact
    /// previews, which give way to operators'.
    Spare,
}

/// How long an operator's preview waits for the one running (an N-1 view's exact preview
/// takes about 0.8 s at 11 M map units).
pub const ASK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The next round after `changes` (cluster id and state, in order) to `shared`'s map in
/// service, listing at most `max_units` changed units.
pub async fn preview_changes(
    shared: &Arc<Shared>,
    changes: Vec<(String, ClusterState)>,
    max_units: usize,
    turn: Turn,
) -> Result<Previewed, PreviewError> {
    let edits = changes
        .into_iter()
        .map(|(id, state)| Edit::ClusterState { id, state })
        .collect();
    preview_edits(shared, edits, max_units, turn).await
}

/// The next round after `edits` (any topology edit: states, clusters and map units upserted
/// or deleted, in order) to `shared`'s map in service, each applied by the one function that
/// changes a topology ([`cdnmap_store::edit::apply`], as the topology writer applies it),
/// listing at most `max_units` changed units.
pub async fn preview_edits(
    shared: &Arc<Shared>,
    edits: Vec<Edit>,
    max_units: usize,
    turn: Turn,
) -> Result<Previewed, PreviewError> {
    if edits.len() > MAX_CHANGES {
        return Err(PreviewError::Invalid(format!(
            "changes: {}; at most {MAX_CHANGES}",
            edits.len()
        )));
    }
    let _one = match turn {
        Turn::Spare => PREVIEWS.try_acquire().map_err(|_| PreviewError::Busy)?,
        Turn::Now => tokio::time::timeout(ASK_WAIT, PREVIEWS.acquire())
            .await
            .map_err(|_| PreviewError::Busy)?
            .map_err(|e| PreviewError::Failed(e.to_string()))?,
        Turn::Queue => PREVIEWS
            .acquire()
            .await
            .map_err(|e| PreviewError::Failed(e.to_string()))?,
    };
    let current: Arc<Snapshot> = shared.current().ok_or(PreviewError::NoMap)?;
    let settings = shared
        .round
        .driver
        .lock()
        .map_err(|_| PreviewError::Failed("the round driver's lock is poisoned".into()))?
        .as_ref()
        .map(|d| d.settings())
        .ok_or_else(|| PreviewError::Failed("the round driver is not running".into()))?;
    let now = crate::clock::now_unix_ms();
    tokio::task::spawn_blocking(move || {
        let topology = edited(&current.topology, &edits)?;
        let solved = preview(&topology, &current, (&settings.0, &settings.1), now)
            .map_err(|e| PreviewError::Failed(e.to_string()))?;
        // Every changed unit, for the regions; then the `max_units` that moved most.
        let mut diff = cdnmap_mapper::diff::diff(
            (&current.topology, &current.map),
            (&solved.topology, &solved.map),
            usize::MAX,
        );
        let moved = diff.changed.iter().map(|(id, m)| (id.as_str(), *m));
        let regions =
            cdnmap_engine::figures::moved_by_region(&current.topology, moved, MAX_REGIONS);
        diff.changed.truncate(max_units);
        Ok(Previewed {
            based_on: current.version,
            diff,
            regions,
            before: Figures::of(&current.topology, &current.map, &current.measured),
            after: Figures::of(&solved.topology, &solved.map, &solved.measured),
        })
    })
    .await
    .map_err(|e| PreviewError::Failed(e.to_string()))?
}
