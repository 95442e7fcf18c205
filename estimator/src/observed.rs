//! Demand observed per map unit over a period, as a column by unit index: what feedback
//! reports add up to between two rounds, and what a round's forecasters observe.
//!
//! A column needs no key per unit (a map of unit id strings allocated one string a unit and
//! hashed every one twice a round: most of a round's estimator time at 1 M units). The column
//! is by index of one instance's map units; read against another instance's units (a topology
//! edit between the reports and the round), it is matched by id in one merge of the two id
//! orders.

use std::borrow::Cow;

use cdnmap_mapper::{Instance, UnitIdx};

/// Demand per map unit of [`UnitDemand::units`], by unit index; units nobody reported have
/// none.
#[derive(Debug, Clone, Default)]
pub struct UnitDemand {
    units: Option<Instance>,
    /// NaN where nothing was reported (a reported demand is a finite number >= 0).
    values: Vec<f64>,
    reported: usize,
}

impl UnitDemand {
    /// No demand reported yet for any of `units`' map units.
    pub fn new(units: &Instance) -> Self {
        UnitDemand {
            units: Some(units.clone()),
            values: vec![f64::NAN; units.unit_count()],
            reported: 0,
        }
    }

    /// The instance whose unit indices the column uses (`None` for the empty default).
    pub fn units(&self) -> Option<&Instance> {
        self.units.as_ref()
    }

    /// How many units have a reported demand.
    pub fn reported(&self) -> usize {
        self.reported
    }

    pub fn is_empty(&self) -> bool {
        self.reported == 0
    }

    /// Every reported demand times `factor` (a finite number >= 0; anything else changes
    /// nothing): a period's counts as a rate over another length of time.
    pub fn scale(&mut self, factor: f64) {
        if !(factor.is_finite() && factor >= 0.0) {
            return;
        }
        for v in self.values.iter_mut().filter(|v| !v.is_nan()) {
            *v *= factor;
        }
    }

    /// Adds `queries` to unit `u`'s demand. A value that is not a finite number >= 0, or a
    /// unit out of range, is ignored (reports are validated before they get here).
    pub fn add(&mut self, u: UnitIdx, queries: f64) {
        if !(queries.is_finite() && queries >= 0.0) {
            return;
        }
        if let Some(v) = self.values.get_mut(u as usize) {
            if v.is_nan() {
                *v = queries;
                self.reported += 1;
            } else {
                *v += queries;
            }
        }
    }

    /// Holds each reported demand to at most `bound(u)` (a bound that is not a number >= 0
    /// holds to 0); unreported units stay unreported. Returns how many were lowered.
    pub fn limit(&mut self, bound: impl Fn(UnitIdx) -> f64) -> usize {
        let mut lowered = 0;
        for (u, v) in self.values.iter_mut().enumerate() {
            if v.is_nan() {
                continue;
            }
            let b = bound(u as UnitIdx);
            let b = if b >= 0.0 { b } else { 0.0 };
            if *v > b {
                *v = b;
                lowered += 1;
            }
        }
        lowered
    }

    /// Unit `u`'s reported demand, if any.
    pub fn get(&self, u: UnitIdx) -> Option<f64> {
        self.values.get(u as usize).copied().filter(|v| !v.is_nan())
    }

    /// The column by unit index of `other`'s map units (NaN where none was reported): this
    /// column itself when the units are the same, else matched by id.
    pub fn values_for(&self, other: &Instance) -> Cow<'_, [f64]> {
        match &self.units {
            Some(mine) if mine.same_unit_ids(other) => Cow::Borrowed(&self.values),
            Some(mine) => Cow::Owned(by_id(mine, &self.values, other, f64::NAN)),
            None => Cow::Owned(vec![f64::NAN; other.unit_count()]),
        }
    }

    /// The same observations by unit index of `other`'s units (those of units `other` does not
    /// have are dropped).
    pub fn realigned(self, other: &Instance) -> UnitDemand {
        if self.units.as_ref().is_some_and(|u| u.same_unit_ids(other)) {
            return self;
        }
        let values = self.values_for(other).into_owned();
        let reported = values.iter().filter(|v| !v.is_nan()).count();
        UnitDemand {
            units: Some(other.clone()),
            values,
            reported,
        }
    }
}

/// `values` (by unit index of `from`) by unit index of `to`, matching units by id in one merge
/// of the two id orders (units are indexed in id order); `missing` for units `from` lacks.
pub fn by_id<T: Clone>(from: &Instance, values: &[T], to: &Instance, missing: T) -> Vec<T> {
    let n = from.unit_count().min(values.len());
    merge_by_id(n, |i| from.unit_id(i as UnitIdx), values, to, missing)
}

/// [`by_id`] with the first `n` ids of `from_id` (in id order) for `from`'s.
pub(crate) fn merge_by_id<'a, T: Clone>(
    n: usize,
    from_id: impl Fn(usize) -> &'a str,
    values: &[T],
    to: &Instance,
    missing: T,
) -> Vec<T> {
    let mut out = Vec::with_capacity(to.unit_count());
    let mut i = 0usize;
    for u in 0..to.unit_count() as UnitIdx {
        let id = to.unit_id(u);
        while i < n && from_id(i) < id {
            i += 1;
        }
        if i < n && from_id(i) == id {
            out.push(values[i].clone());
        } else {
            out.push(missing.clone());
        }
    }
    out
}
