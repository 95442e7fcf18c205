//! The estimator as the mapping loop and the replay use it: forecasters per map unit (by id, so
//! topology changes keep them), one learner per resource kind, the derater; observations in,
//! the next round's instance (forecast demand, learned coefficients, derated capacities) out.

use std::collections::HashMap;
use std::io::{Read, Write};

use cdnmap_mapper::{Instance, Map, ModelError, PerUnit, ResourceKind, UnitIdx};

use crate::demand_code;
use crate::derate::{DerateConfig, Derater};
use crate::forecast::{ForecastConfig, Forecaster, LegacyForecaster};
use crate::learn::{LearnConfig, LearnError, Learner};
use crate::observed::{merge_by_id, UnitDemand};

const KINDS: [ResourceKind; 2] = [ResourceKind::Bps, ResourceKind::Fps];

/// Demand per class passing each resource node (global index) under a map.
pub type Through = Vec<Vec<f64>>;

/// What `map` (of `instance`, scaled by `actual / planned` demand per unit when given) sends
/// through every node, per class.
pub fn through(instance: &Instance, map: &Map, actual: Option<&[Option<f64>]>) -> Through {
    let classes = instance.classes().len();
    let mut out = vec![vec![0.0; classes]; instance.node_count()];
    for u in 0..instance.unit_count().min(map.unit_count()) as UnitIdx {
        let scale = match actual {
            None => 1.0,
            Some(a) => match a.get(u as usize).copied().flatten() {
                None => continue,
                Some(x) => {
                    let planned = instance.unit_demand(u);
                    if planned > 0.0 {
                        x / planned
                    } else {
                        0.0
                    }
                }
            },
        };
        let k = instance.unit_class(u);
        for a in map.allocations(u) {
            let Some(cl) = instance.clusters().get(a.cluster as usize) else {
                continue;
            };
            for n in cl.path(k) {
                out[instance.global_node(a.cluster, n)][usize::from(k)] += a.amount * scale;
            }
        }
    }
    out
}

/// The estimator's state. A checkpoint of it is the whole ([`Estimates::to_bytes`], read back
/// by [`Estimates::from_bytes`]); between checkpoints each round's [`Estimates::round_entry`]
/// (the demand it observed and the small state after it) is enough to replay the round
/// ([`Estimates::replay`]), so a restart forgets nothing and no round writes the whole state.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Estimates {
    pub forecast_config: ForecastConfig,
    pub learn_config: LearnConfig,
    pub derate_config: DerateConfig,
    learned: Learned,
    forecasts: Forecasts,
}

/// The first bytes of a checkpoint ([`Estimates::write_to`]): its format, a checkpoint in
/// parts, each framed by its length (a `u32`, little-endian) and encoded with postcard: a head
/// ([`Head`]: the configurations, the learned state, the generation, the number of
/// forecasters), then the forecasters with their unit ids in chunks of at most
/// [`CHUNK_UNITS`] ([`Chunk`]). A restart reads it from the file as it decodes it
/// ([`Estimates::read_from`]): at 11 M map units the state is 1.4 GB, and its bytes are never in
/// memory beside it. Checkpoints of the formats before ([`STATE_FORMAT_2`], and postcard alone
/// with forecasters of `f64`s, [`LegacyForecaster`]) are still read.
const STATE_FORMAT: &[u8; 4] = b"EST3";
/// The format before [`STATE_FORMAT`]: the whole [`Estimates`] as one postcard value.
const STATE_FORMAT_2: &[u8; 4] = b"EST2";
/// Forecasters per chunk of a checkpoint: about 2 MB.
const CHUNK_UNITS: usize = 16_384;
/// The most bytes a checkpoint's part may say it holds (a chunk takes about 2 MB): a damaged
/// length is an error, not an allocation.
const MAX_PART: usize = 64 << 20;

/// A checkpoint's first part ([`STATE_FORMAT`]); `L` is the learned state or a reference to it.
#[derive(serde::Serialize, serde::Deserialize)]
struct Head<L> {
    forecast_config: ForecastConfig,
    learn_config: LearnConfig,
    derate_config: DerateConfig,
    learned: L,
    generation: u64,
    units: u64,
}

/// A checkpoint's chunk of forecasters and their unit ids, in id order ([`STATE_FORMAT`]);
/// `F` is a slice of forecasters (written) or a vector (read).
#[derive(serde::Serialize, serde::Deserialize)]
struct Chunk<'a, F> {
    #[serde(borrow)]
    ids: Vec<&'a str>,
    by_unit: F,
}

/// Writes `bytes` as one part of a checkpoint (its length, then the bytes).
fn write_part(out: &mut dyn Write, bytes: &[u8]) -> std::io::Result<()> {
    let len = u32::try_from(bytes.len())
        .ok()
        .filter(|&n| n as usize <= MAX_PART)
        .ok_or_else(|| std::io::Error::other(format!("a part of {} bytes", bytes.len())))?;
    out.write_all(&len.to_le_bytes())?;
    out.write_all(bytes)
}

/// Reads the next part of a checkpoint into `buf`.
fn read_part(r: &mut dyn Read, buf: &mut Vec<u8>) -> Result<(), String> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)
        .map_err(|e| format!("cut short before a part ({e})"))?;
    let len = u32::from_le_bytes(len) as usize;
    if len > MAX_PART {
        return Err(format!(
            "a part says it holds {len} bytes, more than {MAX_PART}"
        ));
    }
    buf.clear();
    buf.resize(len, 0);
    r.read_exact(buf)
        .map_err(|e| format!("cut short in a part of {len} bytes ({e})"))
}

/// The unit ids of a checkpoint's forecasters as they are read: while they are `instance`'s
/// own, in its order, none is copied (at 11 M map units the ids take half a gigabyte); from
/// the first that differs, they are kept.
struct ReadIds<'i> {
    instance: &'i Instance,
    /// Ids read so far.
    count: usize,
    /// The ids read, once one differed from the instance's (empty while none has).
    own: Vec<Box<str>>,
    same: bool,
    last: String,
}

impl<'i> ReadIds<'i> {
    fn new(instance: &'i Instance) -> Self {
        ReadIds {
            instance,
            count: 0,
            own: Vec::new(),
            same: true,
            last: String::new(),
        }
    }

    /// The next id; refused unless it sorts after the one before.
    fn push(&mut self, id: &str) -> Result<(), String> {
        if self.count > 0 && *id <= *self.last {
            return Err("its forecasters' unit ids are not in order".into());
        }
        self.last.clear();
        self.last.push_str(id);
        let u = self.count;
        self.count += 1;
        if self.same {
            if u < self.instance.unit_count() && *self.instance.unit_id(u as UnitIdx) == *id {
                return Ok(());
            }
            self.same = false;
            self.own = (0..u)
                .map(|i| self.instance.unit_id(i as UnitIdx).into())
                .collect();
        }
        self.own.push(id.into());
        Ok(())
    }

    /// The forecasters' ids: their own, or none and the instance they are aligned with.
    fn finish(self) -> (Vec<Box<str>>, Option<Instance>) {
        match (self.same, self.count == self.instance.unit_count()) {
            (true, true) => (Vec::new(), Some(self.instance.clone())),
            (true, false) => (
                (0..self.count)
                    .map(|i| self.instance.unit_id(i as UnitIdx).into())
                    .collect(),
                None,
            ),
            (false, _) => (self.own, None),
        }
    }
}

/// [`Estimates`] as a build before [`STATE_FORMAT`] stored them.
#[derive(serde::Deserialize)]
struct LegacyEstimates {
    forecast_config: ForecastConfig,
    learn_config: LearnConfig,
    derate_config: DerateConfig,
    learned: Learned,
    forecasts: StoredForecasts<LegacyForecaster>,
}

impl From<LegacyEstimates> for Estimates {
    fn from(l: LegacyEstimates) -> Self {
        Estimates {
            forecast_config: l.forecast_config,
            learn_config: l.learn_config,
            derate_config: l.derate_config,
            learned: l.learned,
            forecasts: l.forecasts.into(),
        }
    }
}

/// What the loads teach: small (a few numbers per class and per derated cluster), so each
/// round's entry carries it whole.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct Learned {
    learners: Vec<Learner>,
    derater: Derater,
    configured: Vec<PerUnit>,
}

/// The forecasters as a column by unit index of the units of the last base topology the
/// demand was observed for (in id order). A topology whose units differ is matched by id
/// ([`Forecasts::align`]): units it adds start afresh, units it drops are forgotten, and
/// `generation` counts such changes (a round entry replays only onto the generation it was
/// made in).
///
/// The column's unit ids are that instance's own (`aligned`), not a copy: at 11 M map units a
/// second column of ids is half a gigabyte. Only a state read from a checkpoint, before its
/// first alignment, has ids of its own (`own_ids`; empty otherwise).
#[derive(Debug, Clone, Default)]
struct Forecasts {
    own_ids: Vec<Box<str>>,
    by_unit: Vec<Forecaster>,
    generation: u64,
    /// The instance the column was last aligned with: its unit ids are the column's, and the
    /// next check is a pointer comparison when the units are shared.
    aligned: Option<Instance>,
}

/// [`Forecasts`] as a checkpoint holds them: the ids, the forecasters, the generation.
#[derive(serde::Deserialize)]
struct StoredForecasts<F> {
    ids: Vec<Box<str>>,
    by_unit: Vec<F>,
    generation: u64,
}

impl<F: Into<Forecaster>> From<StoredForecasts<F>> for Forecasts {
    fn from(s: StoredForecasts<F>) -> Self {
        Forecasts {
            own_ids: s.ids,
            by_unit: s.by_unit.into_iter().map(Into::into).collect(),
            generation: s.generation,
            aligned: None,
        }
    }
}

impl serde::Serialize for Forecasts {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        struct Ids<'a>(&'a Forecasts);
        impl serde::Serialize for Ids<'_> {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq((0..self.0.len()).map(|i| self.0.id(i)))
            }
        }
        let mut st = s.serialize_struct("Forecasts", 3)?;
        st.serialize_field("ids", &Ids(self))?;
        st.serialize_field("by_unit", &self.by_unit)?;
        st.serialize_field("generation", &self.generation)?;
        st.end()
    }
}

impl<'de> serde::Deserialize<'de> for Forecasts {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        StoredForecasts::<Forecaster>::deserialize(d).map(Into::into)
    }
}

impl PartialEq for Forecasts {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len()
            && (0..self.len()).all(|i| self.id(i) == other.id(i))
            && self.by_unit == other.by_unit
            && self.generation == other.generation
    }
}

impl Forecasts {
    fn len(&self) -> usize {
        self.by_unit.len()
    }

    /// The unit id of forecaster `i`.
    fn id(&self, i: usize) -> &str {
        match &self.aligned {
            Some(a) => a.unit_id(i as UnitIdx),
            None => &self.own_ids[i],
        }
    }

    /// The forecaster of `unit_id`'s index, if it has one.
    fn index_of(&self, unit_id: &str) -> Option<usize> {
        match &self.aligned {
            Some(a) => a.unit_index(unit_id).map(|u| u as usize),
            None => self.own_ids.binary_search_by(|p| (**p).cmp(unit_id)).ok(),
        }
    }

    /// Whether the column is by unit index of `base`'s units.
    fn is_aligned(&self, base: &Instance) -> bool {
        match &self.aligned {
            Some(a) => a.same_unit_ids(base),
            None => {
                self.own_ids.len() == base.unit_count()
                    && self
                        .own_ids
                        .iter()
                        .enumerate()
                        .all(|(u, id)| **id == *base.unit_id(u as UnitIdx))
            }
        }
    }

    /// Makes the column by unit index of `base`'s units (matched by id).
    fn align(&mut self, base: &Instance) {
        if !self.is_aligned(base) {
            let merged = merge_by_id(
                self.len(),
                |i| self.id(i),
                &self.by_unit,
                base,
                Forecaster::default(),
            );
            self.by_unit = merged;
            self.generation += 1;
        }
        self.own_ids = Vec::new();
        self.aligned = Some(base.clone());
    }

    fn any_observed(&self) -> bool {
        self.by_unit.iter().any(|f| f.observations() > 0)
    }

    /// Each of `base`'s units' demand at `t_ms`: its forecast if it was ever observed (rounded
    /// up to a 16-bit code's value, [`demand_code::round_up`]), else its configured demand.
    fn demands(&self, base: &Instance, t_ms: i64, config: &ForecastConfig) -> Vec<f64> {
        let pick = |u: usize, f: Option<&Forecaster>| match f {
            Some(f) if f.observations() > 0 => demand_code::round_up(f.forecast(t_ms, config)),
            _ => base.unit_demand(u as UnitIdx),
        };
        if self.is_aligned(base) {
            return self
                .by_unit
                .iter()
                .enumerate()
                .map(|(u, f)| pick(u, Some(f)))
                .collect();
        }
        // Not yet aligned (a topology edit since the last observation): by id.
        let at: Vec<usize> = (0..self.len()).collect();
        merge_by_id(self.len(), |i| self.id(i), &at, base, usize::MAX)
            .into_iter()
            .enumerate()
            .map(|(u, i)| pick(u, self.by_unit.get(i)))
            .collect()
    }

    /// Each observed unit's forecaster takes its demand (NaN: not observed).
    fn observe(&mut self, t_ms: i64, demand: &[f64], config: &ForecastConfig) {
        for (f, &q) in self.by_unit.iter_mut().zip(demand) {
            if !q.is_nan() {
                f.observe(t_ms, q, config);
            }
        }
    }
}

/// One round's entry: the demand its forecasters observed (by the forecasters' unit order of
/// `generation`; empty when none was) and the learned state after it.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
struct RoundEntry {
    generation: u64,
    forecast_config: ForecastConfig,
    learn_config: LearnConfig,
    derate_config: DerateConfig,
    learned: Learned,
    at_ms: i64,
    demand: Vec<f64>,
}

impl Estimates {
    /// Starts from `instance`'s configured coefficients.
    pub fn new(instance: &Instance) -> Result<Self, LearnError> {
        let configured: Vec<PerUnit> = instance.classes().iter().map(|c| c.per_unit).collect();
        let learners = KINDS
            .iter()
            .map(|&kind| Learner::new(configured.iter().map(|p| p.get(kind)).collect()))
            .collect::<Result<_, _>>()?;
        Ok(Estimates {
            forecast_config: ForecastConfig::default(),
            learn_config: LearnConfig::default(),
            derate_config: DerateConfig::default(),
            learned: Learned {
                learners,
                derater: Derater::default(),
                configured,
            },
            forecasts: Forecasts::default(),
        })
    }

    /// The whole state, encoded: a checkpoint ([`Self::write_to`]).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        // Writing to memory fails only where a part is over 64 MiB, which a chunk of
        // forecasters never is; an empty result is read back as an error, never as a state.
        if self.write_to(&mut out).is_err() {
            out.clear();
        }
        out
    }

    /// The whole state, a checkpoint ([`STATE_FORMAT`]), written to `out` as it is encoded (a
    /// state of 11 M forecasters is 1.4 GB: it is never whole in memory a second time).
    pub fn write_to(&self, out: &mut dyn Write) -> std::io::Result<()> {
        self.write_in_chunks(out, CHUNK_UNITS)
    }

    /// [`Self::write_to`] in chunks of at most `chunk_units` forecasters.
    fn write_in_chunks(&self, out: &mut dyn Write, chunk_units: usize) -> std::io::Result<()> {
        let encoding = std::io::Error::other;
        out.write_all(STATE_FORMAT)?;
        let f = &self.forecasts;
        let head = Head {
            forecast_config: self.forecast_config,
            learn_config: self.learn_config,
            derate_config: self.derate_config,
            learned: &self.learned,
            generation: f.generation,
            units: f.len() as u64,
        };
        write_part(out, &postcard::to_stdvec(&head).map_err(encoding)?)?;
        let mut buf = Vec::new();
        for start in (0..f.len()).step_by(chunk_units.max(1)) {
            let end = (start + chunk_units.max(1)).min(f.len());
            let chunk = Chunk {
                ids: (start..end).map(|i| f.id(i)).collect(),
                by_unit: &f.by_unit[start..end],
            };
            buf.clear();
            buf = postcard::to_extend(&chunk, buf).map_err(encoding)?;
            write_part(out, &buf)?;
        }
        Ok(())
    }

    /// A state saved by [`Estimates::to_bytes`] (or by a build before [`STATE_FORMAT`], whose
    /// forecasters are read into the compact ones), for `instance`: [`Self::read_from`].
    pub fn from_bytes(bytes: &[u8], instance: &Instance) -> Result<Self, String> {
        Self::read_from(&mut &bytes[..], instance)
    }

    /// A state saved by [`Estimates::write_to`] read from `r` as it is decoded (or one of a
    /// build before [`STATE_FORMAT`], read whole), for `instance`: refused (with the reason)
    /// when it is damaged or cut short, or does not fit the instance's traffic classes. When
    /// the configured coefficients changed since it was saved, the learners start afresh from
    /// the new ones (the forecasts and deratings are kept). Forecasters of `instance`'s units,
    /// in its order, are aligned with it at once, without a copy of their ids.
    pub fn read_from(r: &mut dyn Read, instance: &Instance) -> Result<Self, String> {
        let problem = |e: String| format!("the saved estimator state: {e}");
        let mut format = Vec::with_capacity(STATE_FORMAT.len());
        r.take(STATE_FORMAT.len() as u64)
            .read_to_end(&mut format)
            .map_err(|e| problem(e.to_string()))?;
        let mut est = if format == STATE_FORMAT {
            Self::read_parts(r, instance).map_err(problem)?
        } else {
            let mut bytes = format;
            r.read_to_end(&mut bytes)
                .map_err(|e| problem(e.to_string()))?;
            Self::read_whole(&bytes).map_err(problem)?
        };
        est.check_classes(instance)?;
        Ok(est)
    }

    /// The parts of a checkpoint of [`STATE_FORMAT`] after its first bytes.
    fn read_parts(r: &mut dyn Read, instance: &Instance) -> Result<Self, String> {
        let mut buf = Vec::new();
        read_part(r, &mut buf)?;
        let head: Head<Learned> = postcard::from_bytes(&buf).map_err(|e| e.to_string())?;
        let units = usize::try_from(head.units)
            .map_err(|_| format!("{} forecasters, more than memory holds", head.units))?;
        // Room for what the instance has (a damaged count asks for no more).
        let mut by_unit = Vec::with_capacity(units.min(instance.unit_count()));
        let mut ids = ReadIds::new(instance);
        while by_unit.len() < units {
            read_part(r, &mut buf)?;
            let chunk: Chunk<Vec<Forecaster>> =
                postcard::from_bytes(&buf).map_err(|e| e.to_string())?;
            if chunk.ids.len() != chunk.by_unit.len()
                || chunk.ids.is_empty()
                || chunk.ids.len() > units - by_unit.len()
            {
                return Err("its forecasters do not match their unit ids".into());
            }
            for id in chunk.ids {
                ids.push(id)?;
            }
            by_unit.extend(chunk.by_unit);
        }
        if r.read(&mut [0u8; 1]).map_err(|e| e.to_string())? != 0 {
            return Err("bytes follow its last part".into());
        }
        let (own_ids, aligned) = ids.finish();
        Ok(Estimates {
            forecast_config: head.forecast_config,
            learn_config: head.learn_config,
            derate_config: head.derate_config,
            learned: head.learned,
            forecasts: Forecasts {
                own_ids,
                by_unit,
                generation: head.generation,
                aligned,
            },
        })
    }

    /// A checkpoint of a format before [`STATE_FORMAT`], whole.
    fn read_whole(bytes: &[u8]) -> Result<Self, String> {
        let decoded = match bytes.strip_prefix(STATE_FORMAT_2.as_slice()) {
            Some(body) => postcard::from_bytes::<Estimates>(body),
            None => postcard::from_bytes::<LegacyEstimates>(bytes).map(Into::into),
        };
        let est = decoded.map_err(|e| e.to_string())?;
        let ids = &est.forecasts.own_ids;
        if ids.len() != est.forecasts.by_unit.len() || ids.windows(2).any(|w| w[0] >= w[1]) {
            return Err("its forecasters do not match their unit ids".into());
        }
        Ok(est)
    }

    /// This state (read from a checkpoint, [`Self::read_from`]) with the entries of the rounds
    /// after the checkpoint replayed onto it, in order ([`Estimates::round_entry`]), for
    /// `instance`. Replay stops at the first entry that does not fit (the state is then that
    /// of the round before it), and the reason is returned beside the state with the number
    /// of entries replayed. Entries are taken one at a time, so a caller can read each when it
    /// is needed (at 11 M map units one is 88 MB).
    pub fn replayed<E: AsRef<[u8]>>(
        mut self,
        entries: impl IntoIterator<Item = E>,
        instance: &Instance,
    ) -> Result<(Self, usize, Option<String>), String> {
        let (mut replayed, mut stopped) = (0, None);
        for entry in entries {
            if let Err(e) = self.replay(entry.as_ref()) {
                stopped = Some(e);
                break;
            }
            replayed += 1;
        }
        // An entry brings its round's learned state: checked against the instance again.
        self.check_classes(instance)?;
        Ok((self, replayed, stopped))
    }

    /// Refuses learned state for another set of traffic classes; restarts the learners when
    /// the configured coefficients changed.
    fn check_classes(&mut self, instance: &Instance) -> Result<(), String> {
        let classes = instance.classes().len();
        let l = &self.learned;
        if l.configured.len() != classes
            || l.learners.len() != KINDS.len()
            || l.learners.iter().any(|l| l.classes() != classes)
        {
            return Err(format!(
                "the saved estimator state has {} traffic classes, the topology {classes}",
                l.configured.len()
            ));
        }
        let configured: Vec<PerUnit> = instance.classes().iter().map(|c| c.per_unit).collect();
        if configured != self.learned.configured {
            let fresh = Estimates::new(instance).map_err(|e| e.to_string())?;
            self.learned.learners = fresh.learned.learners;
            self.learned.configured = fresh.learned.configured;
        }
        Ok(())
    }

    /// How many times the forecasters' units changed (an entry replays only onto its own).
    pub fn generation(&self) -> u64 {
        self.forecasts.generation
    }

    /// The last round's entry, to store beside its map: `demand` is what that round observed
    /// (at the period's start `at_ms`), by unit index of the base topology it was observed
    /// for ([`Estimates::observe_demand`] aligned the forecasters with it).
    pub fn round_entry(&self, at_ms: i64, demand: &UnitDemand) -> Vec<u8> {
        let column = match (&self.forecasts.aligned, demand.is_empty()) {
            (Some(base), false) => demand.values_for(base).into_owned(),
            _ => Vec::new(),
        };
        let entry = RoundEntry {
            generation: self.forecasts.generation,
            forecast_config: self.forecast_config,
            learn_config: self.learn_config,
            derate_config: self.derate_config,
            learned: self.learned.clone(),
            at_ms,
            demand: column,
        };
        postcard::to_stdvec(&entry).unwrap_or_default()
    }

    /// Replays a round's entry ([`Estimates::round_entry`]) onto the state it was made after:
    /// its demand through the forecasters, and its learned state. Refused, leaving the state
    /// as it was, when it was made in another generation of units or does not decode.
    pub fn replay(&mut self, entry: &[u8]) -> Result<(), String> {
        let e: RoundEntry =
            postcard::from_bytes(entry).map_err(|e| format!("a round's estimator entry: {e}"))?;
        if e.generation != self.forecasts.generation {
            return Err(format!(
                "a round's estimator entry is of unit generation {}, the state {}",
                e.generation, self.forecasts.generation
            ));
        }
        if !e.demand.is_empty() && e.demand.len() != self.forecasts.by_unit.len() {
            return Err(format!(
                "a round's estimator entry has demand for {} units, the state {}",
                e.demand.len(),
                self.forecasts.by_unit.len()
            ));
        }
        self.forecasts
            .observe(e.at_ms, &e.demand, &e.forecast_config);
        self.forecast_config = e.forecast_config;
        self.learn_config = e.learn_config;
        self.derate_config = e.derate_config;
        self.learned = e.learned;
        Ok(())
    }

    /// The demand observed over the period starting at `t_ms`, for `base`'s map units: each
    /// observed unit's forecaster takes it (the forecasters follow `base`'s units, by id).
    pub fn observe_demand(&mut self, base: &Instance, t_ms: i64, demand: &UnitDemand) {
        // Until some demand is reported there are no forecasters to keep (a column of a
        // million that never observed anything is 250 MB held and checkpointed for nothing).
        if demand.is_empty() && self.forecasts.by_unit.is_empty() {
            return;
        }
        self.forecasts.align(base);
        if demand.is_empty() {
            return;
        }
        let column = demand.values_for(base);
        self.forecasts.observe(t_ms, &column, &self.forecast_config);
    }

    /// The demand forecast of `unit_id` at `t_ms`, if it was ever observed: as the instance
    /// takes it ([`Estimates::apply`]), rounded up to a 16-bit code's value.
    pub fn forecast(&self, unit_id: &str, t_ms: i64) -> Option<f64> {
        let f = &self.forecasts.by_unit[self.forecasts.index_of(unit_id)?];
        (f.observations() > 0)
            .then(|| demand_code::round_up(f.forecast(t_ms, &self.forecast_config)))
    }
    /// Measured loads of `instance`'s nodes `(global node, load)`, with `through` the demand
    /// per class that passed each node: the learners learn, and each cluster with a measured
    /// node is derated (or recovers) by measured vs predicted.
    pub fn observe_loads(
        &mut self,
        instance: &Instance,
        through: &Through,
        loads: &[(usize, f64)],
    ) -> Result<(), LearnError> {
        // Predict with what the mapper uses (learned only once confident): a cluster stays
        // derated until the coefficients that explain its load are in the map.
        let coefficients = self.coefficients(true);
        let mut per_cluster: HashMap<usize, Vec<(String, f64, f64)>> = HashMap::new();
        let mut owner = Vec::with_capacity(instance.node_count());
        for (c, cl) in instance.clusters().iter().enumerate() {
            for n in 0..cl.nodes.len() {
                owner.push((c, n));
            }
        }
        for &(g, load) in loads {
            let Some(&(c, n)) = owner.get(g) else {
                continue;
            };
            let node = &instance.clusters()[c].nodes[n];
            let demand = &through[g];
            if !demand.iter().any(|&d| d > 0.0) {
                continue;
            }
            let kind = usize::from(node.kind == ResourceKind::Fps);
            self.learned.learners[kind].observe(demand, load)?;
            let predicted: f64 = demand
                .iter()
                .zip(&coefficients)
                .map(|(d, p)| d * p.get(node.kind))
                .sum();
            per_cluster
                .entry(c)
                .or_default()
                .push((node.name.clone(), load, predicted));
        }
        let config = self.derate_config;
        for (c, nodes) in per_cluster {
            self.learned
                .derater
                .observe(&instance.clusters()[c].id, &nodes, &config);
        }
        Ok(())
    }

    /// Ages the learners' observations by one round.
    pub fn next_round(&mut self) {
        let config = self.learn_config;
        self.learned
            .learners
            .iter_mut()
            .for_each(|l| l.next_round(&config));
    }

    /// Whether every learner is confident.
    pub fn confident(&self) -> bool {
        self.learned
            .learners
            .iter()
            .all(|l| l.estimate(&self.learn_config).confident)
    }

    /// The coefficients: learned, or — when `require_confidence` is set and the learners are
    /// not yet confident — the configured ones (what the mapper uses).
    pub fn coefficients(&self, require_confidence: bool) -> Vec<PerUnit> {
        let estimates: Vec<_> = self
            .learned
            .learners
            .iter()
            .map(|l| l.estimate(&self.learn_config))
            .collect();
        if require_confidence && !estimates.iter().all(|e| e.confident) {
            return self.learned.configured.clone();
        }
        (0..self.learned.configured.len())
            .map(|k| PerUnit {
                bps: estimates[0].coefficients[k],
                fps: estimates[1].coefficients[k],
            })
            .collect()
    }

    pub fn derater(&self) -> &Derater {
        &self.learned.derater
    }

    /// `base` as the next round (at `t_ms`) should see it: forecast demand for the units that
    /// were ever observed (`forecast`), the learned coefficients once confident and derated
    /// capacities (`learning`). Each forecast is rounded up to a 16-bit code's value
    /// ([`demand_code::round_up`]: within 0.4%, far inside a forecast's own error; up, so a
    /// node the map fills to capacity is not over it by the rounding), so the store keeps the
    /// round's demands in two bytes a unit and still reads back the very instance solved.
    pub fn apply(
        &self,
        base: &Instance,
        t_ms: i64,
        forecast: bool,
        learning: bool,
    ) -> Result<Instance, ModelError> {
        // Nothing to change (no unit observed, nothing learned or derated yet): the base itself,
        // without rebuilding it.
        let changes_demand = forecast && self.forecasts.any_observed();
        let changes_costs =
            learning && (self.confident() || self.learned.derater.derated().next().is_some());
        if !changes_demand && !changes_costs {
            return Ok(base.clone());
        }
        // Edits of the columns that change, sharing the rest (no rebuild through the file
        // form: at 1 M units that took 3-4 s a round).
        let mut next = base.clone();
        if changes_demand {
            next = next.with_demands(self.forecasts.demands(base, t_ms, &self.forecast_config))?;
        }
        if learning {
            let factors: Vec<f64> = base
                .clusters()
                .iter()
                .map(|c| self.learned.derater.factor(&c.id).min(1.0))
                .collect();
            next = next.with_costs(&self.coefficients(true), &factors)?;
        }
        Ok(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cdnmap_mapper::Limits;
    use cdnmap_topology::format::parse_instance;

    /// The demand `reports` (unit id, queries) of `inst`'s units.
    fn demand(inst: &Instance, reports: &[(&str, f64)]) -> UnitDemand {
        let mut d = UnitDemand::new(inst);
        for &(id, q) in reports {
            d.add(inst.unit_index(id).expect("a unit of the instance"), q);
        }
        d
    }

    fn instance() -> Instance {
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 0.5}}],
          "clusters": [{"id": "a", "lat": 0, "lon": 0, "resources":
            {"name": "up", "kind": "bps", "capacity": 100, "children": [
              {"name": "cpu", "kind": "fps", "capacity": 40, "classes": ["web"]}]}}],
          "map_units": [
            {"id": "u1", "class": "web", "demand": 10, "lat": 0, "lon": 0, "candidates": [{"cluster": "a", "score": 1}]},
            {"id": "u2", "class": "web", "demand": 20, "lat": 0, "lon": 0, "candidates": [{"cluster": "a", "score": 1}]}]
        }"#;
        parse_instance(json.as_bytes(), Limits::default())
            .expect("valid")
            .instance
    }

    #[test]
    fn nothing_observed_leaves_the_instance_as_it_is() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        let empty = est.to_bytes().len();
        est.observe_demand(&inst, 0, &UnitDemand::new(&inst));
        assert_eq!(est.apply(&inst, 0, true, true).expect("apply"), inst);
        // No forecaster is kept (nor checkpointed) before some demand is reported.
        assert_eq!((est.generation(), est.to_bytes().len()), (0, empty));
    }

    #[test]
    fn observed_demand_replaces_the_configured_demand_of_that_unit_only() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        est.observe_demand(&inst, 10_000, &demand(&inst, &[("u1", 55.3)]));
        let next = est.apply(&inst, 20_000, true, true).expect("apply");
        let (u1, u2) = (
            next.unit_index("u1").expect("u1"),
            next.unit_index("u2").expect("u2"),
        );
        // The forecast (the one observation) rounded up to a 16-bit code's value: within 2^-8.
        let d = next.unit_demand(u1);
        assert_eq!(d, demand_code::round_up(55.3));
        assert!(d > 55.3 && d / 55.3 - 1.0 <= 2f64.powi(-8), "{d}");
        assert_eq!(est.forecast("u1", 20_000), Some(d));
        assert_eq!(next.unit_demand(u2), 20.0);
        // Without forecasting, the configured demand stays.
        let same = est.apply(&inst, 20_000, false, true).expect("apply");
        assert_eq!(same.unit_demand(u1), 10.0);
    }

    #[test]
    fn loads_above_the_prediction_derate_the_cluster() {
        let inst = instance();
        let map = cdnmap_mapper::solve(&inst, &cdnmap_mapper::SolveOptions::default()).map;
        let flow = through(&inst, &map, None);
        let mut est = Estimates::new(&inst).expect("estimates");
        // The cpu node (global 1) measures twice what the configured 0.5 Fps per unit predicts.
        let predicted = 0.5 * 30.0;
        for _ in 0..20 {
            est.observe_loads(&inst, &flow, &[(1, 2.0 * predicted)])
                .expect("observe");
            est.next_round();
        }
        assert!(
            est.derater().factor("a") < 0.6,
            "{}",
            est.derater().factor("a")
        );
        let next = est.apply(&inst, 0, true, true).expect("apply");
        assert!(next.clusters()[0].nodes[1].capacity < 40.0 * 0.6);
    }

    #[test]
    fn the_saved_state_reads_back_equal_and_forecasts_alike() {
        let inst = instance();
        let map = cdnmap_mapper::solve(&inst, &cdnmap_mapper::SolveOptions::default()).map;
        let flow = through(&inst, &map, None);
        let mut est = Estimates::new(&inst).expect("estimates");
        for r in 0..30i64 {
            let d = demand(
                &inst,
                &[
                    ("u1", 40.0 + (r % 7) as f64 * 1.37),
                    ("u2", 0.1 + r as f64 / 3.0),
                ],
            );
            est.observe_demand(&inst, r * 10_000, &d);
            est.observe_loads(&inst, &flow, &[(1, 19.3 + r as f64 * 0.01)])
                .expect("observe");
            est.next_round();
        }
        let back = Estimates::from_bytes(&est.to_bytes(), &inst).expect("read back");
        assert_eq!(back, est);
        assert_eq!(
            back.apply(&inst, 300_000, true, true).expect("apply"),
            est.apply(&inst, 300_000, true, true).expect("apply")
        );
        // Another set of classes: refused, naming what does not fit.
        let other = instance_with_two_classes();
        let err = Estimates::from_bytes(&est.to_bytes(), &other).expect_err("two classes");
        assert!(err.contains("traffic classes"), "{err}");
        assert!(Estimates::from_bytes(b"{", &inst).is_err());
    }

    #[test]
    fn a_checkpoint_of_a_build_before_the_compact_forecasters_is_read() {
        use crate::forecast::OldForecaster;
        #[derive(serde::Serialize)]
        struct OldForecasts {
            ids: Vec<&'static str>,
            by_unit: Vec<OldForecaster>,
            generation: u64,
        }
        #[derive(serde::Serialize)]
        struct Old<'a> {
            forecast_config: ForecastConfig,
            learn_config: LearnConfig,
            derate_config: DerateConfig,
            learned: &'a Learned,
            forecasts: OldForecasts,
        }
        let inst = instance();
        let est = Estimates::new(&inst).expect("estimates");
        let old = |observations| OldForecaster {
            level: 40.0,
            trend: 0.0,
            season: vec![1.5; crate::forecast::SEASON_BUCKETS],
            error: 1.0,
            last_ms: Some(0),
            observations,
        };
        let bytes = postcard::to_stdvec(&Old {
            forecast_config: est.forecast_config,
            learn_config: est.learn_config,
            derate_config: est.derate_config,
            learned: &est.learned,
            forecasts: OldForecasts {
                ids: vec!["u1", "u2"],
                by_unit: vec![old(5), old(0)],
                generation: 3,
            },
        })
        .expect("encode");
        let back = Estimates::from_bytes(&bytes, &inst).expect("a legacy checkpoint");
        assert_eq!(back.generation(), 3);
        let u1 = back.forecast("u1", 10_000).expect("u1 was observed");
        assert!((u1 / 60.0 - 1.0).abs() < 1e-4, "{u1}");
        assert_eq!(back.forecast("u2", 10_000), None);
        // Written again, it is in the new format, and reads back equal.
        let again = back.to_bytes();
        assert!(again.starts_with(STATE_FORMAT));
        assert!(again.len() < bytes.len());
        assert_eq!(Estimates::from_bytes(&again, &inst).expect("new"), back);
    }

    /// A reader that hands out at most 3 bytes a call (a file's reads end anywhere).
    struct Dribble<'a>(&'a [u8]);

    impl Read for Dribble<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(3).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    #[test]
    fn a_checkpoint_in_parts_reads_back_aligned_with_its_instance_and_any_cut_is_an_error() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        // No forecasters yet: a head and no chunk.
        let empty = est.to_bytes();
        assert_eq!(Estimates::from_bytes(&empty, &inst).expect("empty"), est);
        run_rounds(&mut est, &inst, 0..12);
        // A chunk a unit, to read more than one.
        let mut bytes = Vec::new();
        est.write_in_chunks(&mut bytes, 1).expect("write");
        assert!(bytes.starts_with(STATE_FORMAT));
        let back = Estimates::read_from(&mut Dribble(&bytes), &inst).expect("read in pieces");
        assert_eq!(back, est);
        assert_eq!(back.to_bytes(), est.to_bytes());
        // The forecasters of the instance's own units take no ids of their own.
        assert!(back.forecasts.own_ids.is_empty());
        assert!(back.forecasts.is_aligned(&inst));
        // Every cut, and a byte more, is refused with a reason, never a state or a panic.
        for end in 0..bytes.len() {
            let err = Estimates::from_bytes(&bytes[..end], &inst).expect_err("cut short");
            assert!(err.starts_with("the saved estimator state"), "{end}: {err}");
        }
        let mut longer = bytes.clone();
        longer.push(0);
        let err = Estimates::from_bytes(&longer, &inst).expect_err("a byte more");
        assert!(err.contains("follow its last part"), "{err}");
        // A part that says it holds more than any does.
        let mut huge = bytes[..STATE_FORMAT.len()].to_vec();
        huge.extend(u32::MAX.to_le_bytes());
        let err = Estimates::from_bytes(&huge, &inst).expect_err("huge part");
        assert!(err.contains("more than"), "{err}");
    }

    #[test]
    fn a_checkpoint_of_other_units_keeps_its_ids_and_follows_them_by_id() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        run_rounds(&mut est, &inst, 0..10);
        let u1 = est.forecast("u1", 100_000).expect("u1 observed");
        let bytes = est.to_bytes();
        // Read for a topology with u2 gone and u0 and u3 come.
        for other in [
            with_units(&inst, &["u1"], &["u0", "u3"]),
            with_units(&inst, &["u1"], &[]),
            with_units(&inst, &["u1", "u2"], &["u3"]),
        ] {
            let back = Estimates::from_bytes(&bytes, &other).expect("read back");
            assert_eq!(back, est, "the same state, whatever it is read for");
            assert!(!back.forecasts.is_aligned(&other));
            assert_eq!(back.forecast("u1", 100_000), Some(u1));
            let next = back.apply(&other, 100_000, true, false).expect("apply");
            assert_eq!(next.unit_demand(other.unit_index("u1").expect("u1")), u1);
        }
        // Ids out of order are refused.
        let mut swapped = est.clone();
        swapped.forecasts.own_ids = vec!["u2".into(), "u1".into()];
        swapped.forecasts.aligned = None;
        let err = Estimates::from_bytes(&swapped.to_bytes(), &inst).expect_err("out of order");
        assert!(err.contains("not in order"), "{err}");
    }

    #[test]
    fn a_checkpoint_of_the_whole_state_as_one_value_is_still_read() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        run_rounds(&mut est, &inst, 0..10);
        let old = postcard::to_extend(&est, STATE_FORMAT_2.to_vec()).expect("encode");
        let back = Estimates::from_bytes(&old, &inst).expect("an EST2 checkpoint");
        assert_eq!(back, est);
        assert!(Estimates::from_bytes(&old[..old.len() - 1], &inst).is_err());
    }

    /// `inst` with its units `keep`-filtered and `extra` added (same class, demand, candidates).
    fn with_units(inst: &Instance, keep: &[&str], extra: &[&str]) -> Instance {
        let mut file = cdnmap_topology::format::InstanceFile::of(&cdnmap_topology::Topology::bare(
            inst.clone(),
        ));
        let template = file.map_units[0].clone();
        file.map_units.retain(|u| keep.contains(&u.id.as_str()));
        for id in extra {
            let mut u = template.clone();
            u.id = id.to_string();
            file.map_units.push(u);
        }
        file.build(Limits::default()).expect("valid").instance
    }

    /// Rounds of demand and loads through `est`, returning each round's entry.
    fn run_rounds(
        est: &mut Estimates,
        inst: &Instance,
        rounds: std::ops::Range<i64>,
    ) -> Vec<Vec<u8>> {
        let map = cdnmap_mapper::solve(inst, &cdnmap_mapper::SolveOptions::default()).map;
        let flow = through(inst, &map, None);
        let mut entries = Vec::new();
        for r in rounds {
            let mut reports = vec![("u1", 40.0 + (r % 5) as f64 * 2.5)];
            if r % 3 != 0 {
                reports.push(("u2", 7.0 + r as f64 / 7.0)); // u2 is missing some rounds
            }
            let d = demand(inst, &reports);
            est.observe_loads(inst, &flow, &[(1, 18.0 + (r % 4) as f64)])
                .expect("observe");
            est.observe_demand(inst, r * 10_000, &d);
            est.next_round();
            entries.push(est.round_entry(r * 10_000, &d));
        }
        entries
    }

    #[test]
    fn a_checkpoint_and_the_rounds_after_it_replay_to_the_same_state() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        run_rounds(&mut est, &inst, 0..20);
        let checkpoint = est.to_bytes();
        let entries = run_rounds(&mut est, &inst, 20..45);
        let mut back = Estimates::from_bytes(&checkpoint, &inst).expect("read back");
        assert_ne!(
            back, est,
            "the rounds after the checkpoint changed the state"
        );
        for e in &entries {
            back.replay(e).expect("replay");
        }
        assert_eq!(back, est);
        assert_eq!(
            back.apply(&inst, 460_000, true, true).expect("apply"),
            est.apply(&inst, 460_000, true, true).expect("apply")
        );
        // An entry is small: the demand column and the learned state, not the forecasters.
        assert!(entries[0].len() < checkpoint.len());
        // An entry of another unit generation is refused and changes nothing.
        let other = with_units(&inst, &["u1"], &["u0"]);
        let mut moved = est.clone();
        moved.observe_demand(&other, 460_000, &demand(&other, &[("u0", 3.0)]));
        assert_eq!(moved.generation(), est.generation() + 1);
        let before = moved.clone();
        let err = moved.replay(&entries[0]).expect_err("another generation");
        assert!(err.contains("generation"), "{err}");
        assert_eq!(moved, before);
        assert!(Estimates::from_bytes(b"\x01\x02", &inst).is_err());
    }

    #[test]
    fn forecasts_follow_their_units_by_id_across_topology_edits() {
        let inst = instance();
        let mut est = Estimates::new(&inst).expect("estimates");
        run_rounds(&mut est, &inst, 0..10);
        let u1 = est.forecast("u1", 100_000).expect("u1 observed");
        // u2 goes, u0 and u3 come (u0 sorts before u1: every index moves).
        let edited = with_units(&inst, &["u1"], &["u0", "u3"]);
        let next = est.apply(&edited, 100_000, true, false).expect("apply");
        let at = |i: &Instance, id: &str| i.unit_demand(i.unit_index(id).expect(id));
        assert_eq!(at(&next, "u1"), u1, "u1's forecast, before any observation");
        assert_eq!(
            at(&next, "u0"),
            at(&edited, "u0"),
            "a new unit keeps its configured demand"
        );
        est.observe_demand(&edited, 100_000, &demand(&edited, &[("u3", 5.0)]));
        assert_eq!(
            est.forecast("u2", 110_000),
            None,
            "a dropped unit is forgotten"
        );
        assert!(est.forecast("u1", 110_000).is_some());
        assert!((est.forecast("u3", 110_000).expect("u3") - 5.0).abs() < 1e-9);
        // Demand reported against the old units reaches the same units in the new order.
        let old = demand(&inst, &[("u1", 11.0), ("u2", 12.0)]);
        let column = old.values_for(&edited);
        assert_eq!(column[edited.unit_index("u1").expect("u1") as usize], 11.0);
        assert!(column[edited.unit_index("u0").expect("u0") as usize].is_nan());
        let moved = old.realigned(&edited);
        assert_eq!(moved.reported(), 1);
    }

    fn instance_with_two_classes() -> Instance {
        let json = r#"{
          "traffic_classes": [{"name": "web", "priority": 0, "per_unit": {"bps": 1, "fps": 0.5}},
                              {"name": "video", "priority": 1, "per_unit": {"bps": 4, "fps": 0.1}}],
          "clusters": [{"id": "a", "lat": 0, "lon": 0, "resources":
            {"name": "up", "kind": "bps", "capacity": 100, "classes": ["web", "video"]}}],
          "map_units": []
        }"#;
        parse_instance(json.as_bytes(), Limits::default())
            .expect("valid")
            .instance
    }
}
