//! The bounds of WatchMap: what one message carries and what a front end holds at most. Both
//! sides check them, the mapper's as it splits a map ([`crate::watch`]) and the front end's as
//! it takes one in (the follower and [`crate::columns`]), so no message and no copy of a map
//! grows past them.

/// Most map units in one message of a full map.
pub const PART_UNITS: usize = 65_536;
/// Most map units a delta carries, changed or gone: a round that moves more is sent whole.
pub const MAX_DELTA_UNITS: usize = PART_UNITS;
/// Most map units a front end holds: as many as an instance may have (a front end that
/// refused a map the mapper can make would answer from its last one forever).
pub const MAX_UNITS: usize = cdnmap_mapper::model::MAX_MAP_UNITS;
/// Most clusters a front end holds.
pub const MAX_CLUSTERS: usize = 100_000;
/// Most prefixes of one map unit, and most shares.
pub const MAX_UNIT_PREFIXES: usize = 4_096;
/// Most traffic classes (names in fallbacks, rules and the default).
pub const MAX_CLASSES: usize = 256;
