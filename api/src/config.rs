//! The service's configuration: a TOML file (`cdnmap serve --config FILE`). Unknown keys are
//! refused, every value is validated, and every key has a default, so no file at all serves the
//! built-in demo world on 127.0.0.1.
//!
//! ```toml
//! cycle_secs = 10                  # a mapping round every 10..=30 seconds
//! grpc_listen = "127.0.0.1:50051"
//! http_listen = "127.0.0.1:8080"   # dashboard and /metrics
//! data_dir = "cdnmap-data"         # the store: topology, maps, demand record
//! maps_kept = 64                   # map versions kept in the store
//! ttl_secs = 20                    # DNS answer TTL
//! admin_token = "change-me"        # Admin calls need "authorization: Bearer <token>"; none: Admin refused
//! # admin_token_file = "/run/credentials/cdnmap-serve.service/admin-token"  # or the token in a
//! #                                #   file, or in CDNMAP_ADMIN_TOKEN: one of the three
//! # feedback_tokens_file = "front-end-tokens.toml"  # more [feedback_tokens], in a file of their own
//! #                                #   (and in CDNMAP_FEEDBACK_TOKENS="fe-1=TOKEN fe-2=TOKEN")
//! learning = true                  # learned coefficients and derating go into the rounds
//! record_retention_hours = 168     # how long feedback reports stay in the demand record
//! record_max_mb = 768              # and the most disk it takes (the oldest reports go first)
//! instance = "world.json"          # the topology to start from; absent: the demo world
//! http_header_timeout_secs = 10    # an HTTP client's headers must arrive within this
//! http_max_connections = 1024      # HTTP connections open at once, at most
//! grpc_max_connections = 1024      # gRPC connections open at once, at most
//! handshake_timeout_secs = 10      # a connection's TLS handshake, HTTP/2 preface and first answered
//!                                  #   request within this of its arrival, or it is closed
//! idle_timeout_secs = 120          # a connection with no request open this long is closed
//! max_connections_per_source = 256 # connections one address (IPv6: one /64) holds on a listener
//! watch_open = true                # WatchMap for anyone; false: only front ends with a token of
//!                                  #   [feedback_tokens] (with client_ca_file: a certificate)
//! watch_stall_secs = 60            # a WatchMap stream whose client takes nothing this long is dropped
//! watch_max_streams = 1024         # WatchMap streams open at once, at most
//! etcd = ["https://10.0.0.1:2379"] # replicas: a leader elected through etcd publishes (none: alone)
//! node_id = "mapper-1"             # this replica's name (needed with etcd)
//! etcd_prefix = "cdnmap/"          # the prefix of the replicas' keys in etcd
//! etcd_ca_file = "etcd-ca.crt"     # https:// etcd: the CA its certificate must chain to
//! etcd_cert_file = "mapper-1.crt"  # and this replica's client certificate and key, for an
//! etcd_key_file = "mapper-1.key"   #   etcd that asks for one (--client-cert-auth)
//! advertise_url = "https://10.0.0.5:50051" # where the other replicas reach this one (https:// with [tls]; absent: grpc_listen's address)
//! feedback_samples_per_sec = 200000 # each feedback source's budget (30 s of it at once)
//! feedback_max_demand_ratio = 10.0 # a round's reports give a unit at most this times its demand
//! feedback_open = false            # true: take anonymous feedback beyond loopback (else the start
//!                                  #   is refused there without [feedback_tokens] or client_ca_file)
//! default_class = "web"
//!
//! [[class_rules]]
//! pattern = "*.video.cdn.example"
//! class = "video"
//!
//! [tls]                            # none: plaintext (the loopback default)
//! cert_file = "mapper.crt"         # PEM chain and key; reloaded on SIGHUP or when they change
//! key_file = "mapper.key"
//! client_ca_file = "front-ends-ca.crt"  # optional, mutual TLS: only front ends with a
//!                                  # certificate from this CA may watch maps and send feedback
//! peer_ca_file = "mappers-ca.crt"  # replicated: a standby follows the leader's maps over TLS,
//! peer_cert_file = "m1-peer.crt"   #   trusting this CA, with this client certificate when
//! peer_key_file = "m1-peer.key"    #   the leader asks for one (its client_ca_file)
//!
//! [feedback_tokens]                # front ends' own tokens (not the Admin token): with any,
//! "fe-ams-1" = "a-long-random-token" # Feedback needs "authorization: Bearer <token>" and
//!                                  # records the token's name as the reporter
//!
//! [stickiness]
//! margin = 0.1                     # 0: every round a cold solve
//! incumbents_first = true
//!
//! [n1]                             # the N-1 view: what each cluster's or site's loss would do
//! every_secs = 60                  # a sweep this often (0: never), at a low CPU priority
//! budget_secs = 120                # a sweep stops (incomplete) past this
//! exact_top = 3                    # the worst clusters and sites then previewed exactly
//!
//! # [guard]                        # refuse an operator's change whose preview goes past these
//! # max_overflow_points = 2.0      # (each off when absent) unless forced with a reason
//! # max_moved_share = 0.1
//! # max_nodes_full_added = 0
//! # max_moved_share_per_round = 0.02  # the movement budget: a ramp's steps keep within it; a
//!                                  # change at once moving more is refused (ramp it instead)
//!
//! [second_chance]                  # what the stable pass leaves in overflow
//! mode = "off"                     # or "beyond-lists": the nearest clusters with room
//!                                  # beyond a unit's candidate list
//! max_beyond_ms = 150              # at most this much over the unit's best listed score
//!
//! [selection.default]              # which servers of a cluster an answer names
//! policy = "consistent"            # or "bounded" (with c) or "power-of-d" (with d)
//! vnodes = 100
//!
//! [selection.clusters."fra-1"]     # per cluster, overriding the default
//! policy = "power-of-d"
//! d = 2
//!
//! [demo]                           # the built-in world, when no instance is given
//! map_units = 30000
//! clusters = 120
//! seed = 1
//! headroom = 2.0                   # total capacity over total demand
//! # companion = { web = 0.33 }     # go with the winner: per class, the share its answers'
//! #                                # second cluster draws, reserved there (default: none)
//!
//! # [mmdb]                         # or, instead of `instance`: map units from MaxMind DBs
//! # files = ["GeoLite2-City.mmdb"] # one unit per located network and class
//! # sites = "sites.csv"            # edge sites (data/pop-sites.csv's format); absent: built-in
//! # clusters = 240
//! # class_mix = "web=0.5,video=0.35,apps=0.15"
//! # v6_fold_len = 48               # IPv6 networks fold to this length (IPv4 to /24)
//! # seed = 1
//!
//! [bypass.video]                   # a class's last resort (a partner CDN): clients of a
//! cname = "video.partner.example." # unit whose every candidate is full or down get this
//! # addresses = ["192.0.2.10"]     # (or these addresses) instead of the fallback cluster
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;

use serde::Deserialize;

/// Bounds of the values, named so the errors and the docs can quote them.
pub const CYCLE_SECS: std::ops::RangeInclusive<u64> = 10..=30;
pub const MAPS_KEPT: std::ops::RangeInclusive<usize> = 1..=10_000;
pub const RECORD_RETENTION_HOURS: std::ops::RangeInclusive<u64> = 1..=24 * 365;
pub const HTTP_HEADER_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=300;
pub const HTTP_MAX_CONNECTIONS: std::ops::RangeInclusive<usize> = 1..=100_000;
pub const FEEDBACK_SAMPLES_PER_SEC: std::ops::RangeInclusive<u64> = 1..=100_000_000;
pub const FEEDBACK_MAX_DEMAND_RATIO: std::ops::RangeInclusive<f64> = 1.0..=1e6;
pub const GRPC_MAX_CONNECTIONS: std::ops::RangeInclusive<usize> = 1..=100_000;
pub const HANDSHAKE_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=300;
pub const IDLE_TIMEOUT_SECS: std::ops::RangeInclusive<u64> = 1..=86_400;
pub const MAX_CONNECTIONS_PER_SOURCE: std::ops::RangeInclusive<usize> = 1..=100_000;
pub const WATCH_STALL_SECS: std::ops::RangeInclusive<u64> = 1..=3_600;
pub const WATCH_MAX_STREAMS: std::ops::RangeInclusive<usize> = 1..=100_000;
/// The demand record's disk bound, in MiB: two segments at least (the log deletes whole
/// segments of 32 MiB), a TiB at most.
pub const RECORD_MAX_MB: std::ops::RangeInclusive<u64> = 64..=1 << 20;
pub const TTL_SECS: std::ops::RangeInclusive<u32> = 1..=86_400;
pub const MAX_CLASS_RULES: usize = 10_000;

/// At most this many front ends' tokens in [`FEEDBACK_TOKENS_ENV`].
pub const MAX_FEEDBACK_TOKENS_ENV: usize = 10_000;
/// The demo world may be as large as the model allows: the field's scale (about 3.8 M client
/// /24 blocks × a few classes) runs from the compact store.
pub const MAX_DEMO_MAP_UNITS: usize = cdnmap_mapper::model::MAX_MAP_UNITS;

/// Why a configuration was refused: which key, and what is wrong with it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// (Transparent: with `{0}` and `from`, the parser's message printed twice, as the
    /// error and again as its source.)
    #[error(transparent)]
    Toml(#[from] toml::de::Error),
    #[error("{key}: {problem}")]
    Invalid { key: String, problem: String },
}

/// The error for a bad value of `key`.
pub(crate) fn invalid(key: &str, problem: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        problem: problem.into(),
    }
}

/// `value` of `key` within `range`, or the error saying so.
fn in_range<T: PartialOrd + std::fmt::Display>(
    key: &str,
    value: T,
    range: &std::ops::RangeInclusive<T>,
) -> Result<(), ConfigError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{value} is outside {}..={}", range.start(), range.end()),
        ))
    }
}

/// The environment variable the Admin token may come from (instead of `admin_token` or
/// `admin_token_file`).
pub const ADMIN_TOKEN_ENV: &str = "CDNMAP_ADMIN_TOKEN";

/// The environment variable more front ends' tokens may come from, as `NAME=TOKEN` pairs
/// separated by white space (a token has none; it may hold `=`, a name may not), joined to
/// `[feedback_tokens]` as `feedback_tokens_file`'s are.
pub const FEEDBACK_TOKENS_ENV: &str = "CDNMAP_FEEDBACK_TOKENS";

/// A bearer token's rules: at least 8 characters, no spaces or control characters.
fn check_token(key: &str, token: &str) -> Result<(), ConfigError> {
    if token.len() < 8 || token.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(invalid(
            key,
            "must be at least 8 characters, without spaces or control characters",
        ));
    }
    Ok(())
}

/// The whole configuration.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    pub cycle_secs: u64,
    pub grpc_listen: SocketAddr,
    pub http_listen: SocketAddr,
    pub data_dir: PathBuf,
    pub maps_kept: usize,
    pub ttl_secs: u32,
    pub admin_token: Option<String>,
    /// A file holding the Admin token (one trailing newline dropped), instead of
    /// `admin_token`; read at start by [`Config::load_secrets`], as `CDNMAP_ADMIN_TOKEN` is.
    pub admin_token_file: Option<PathBuf>,
    /// Feed measured loads to the estimator: learned coefficients (once confident) and derated
    /// capacities go into the rounds.
    pub learning: bool,
    /// How long feedback reports stay in the demand record, by arrival: counted as reports
    /// keep arriving, so a jump of the wall clock hides none (a pause in the feed counts as
    /// a minute at most, `cdnmap_store`'s `reports`).
    pub record_retention_hours: u64,
    /// The most disk the demand record takes, in MiB: past it the oldest reports go, whatever
    /// their age (at 100,000 demand samples a second a week of reports would be terabytes).
    pub record_max_mb: u64,
    /// An instance file to start from; `None`: the demo world.
    pub instance: Option<PathBuf>,
    /// How long an HTTP client may take to send a request's headers before its connection is
    /// closed (a slow-header, "slowloris", client holds nothing longer).
    pub http_header_timeout_secs: u64,
    /// The most HTTP connections open at once; one more is closed as soon as it is accepted.
    pub http_max_connections: usize,
    /// The most gRPC connections open at once (front ends, operators' tools).
    pub grpc_max_connections: usize,
    /// Within this of its arrival a connection must have been through its TLS handshake (in
    /// plaintext: sent its first bytes) and had a request answered (one not refused for want
    /// of credentials; one sent whole holds this off while it is answered), or it is closed: a
    /// client that sends a byte, or HTTP/2's preface, and then nothing holds no slot longer.
    pub handshake_timeout_secs: u64,
    /// A connection with no request open (no call, no WatchMap stream) for this long is
    /// closed; the client connects again when it needs to.
    pub idle_timeout_secs: u64,
    /// The most connections one source address (IPv6: one /64) may hold open on each
    /// listener (with at most its `*_max_connections`); one more is closed on arrival.
    pub max_connections_per_source: usize,
    /// Whether anyone may follow the map (WatchMap). `false`: only a front end the mapper
    /// knows, by a token of `feedback_tokens` ("authorization: Bearer <token>"); with mutual
    /// TLS, WatchMap needs a client certificate whatever this says.
    pub watch_open: bool,
    /// A WatchMap stream with a message waiting that its client has taken nothing of for this
    /// long is dropped with its connection (and the memory it held returns). A front end
    /// that is slow for a moment (applying a part, indexing a new map) is well within it.
    pub watch_stall_secs: u64,
    /// The most WatchMap streams open at once; one more is refused (RESOURCE_EXHAUSTED).
    pub watch_max_streams: usize,
    /// etcd's client URLs: with any, this mapper is one replica of several, and publishes
    /// only while it leads (`lead`); none: it runs alone.
    pub etcd: Vec<String>,
    /// This replica's name among the replicas (required with `etcd`).
    pub node_id: Option<String>,
    /// The prefix of every key the replicas keep in etcd.
    pub etcd_prefix: String,
    /// With `https://` etcd URLs: the CA etcd's certificate must chain to (PEM). Required
    /// with them, refused with `http://` ones.
    pub etcd_ca_file: Option<PathBuf>,
    /// This replica's client certificate and key (PEM) for an etcd that authenticates its
    /// clients (`--client-cert-auth`): both or neither, with `https://` URLs only.
    pub etcd_cert_file: Option<PathBuf>,
    pub etcd_key_file: Option<PathBuf>,
    /// The URL the other replicas reach this one's gRPC listener at (they follow the leader's
    /// maps); absent: `http(s)://` and the address `grpc_listen` bound.
    pub advertise_url: Option<String>,
    /// TLS on both listeners; `None`: plaintext.
    pub tls: Option<TlsConfig>,
    /// Front end name → its Feedback token. With any (or with mutual TLS), Feedback takes
    /// reports only from a front end it knows, under that front end's name.
    pub feedback_tokens: std::collections::BTreeMap<String, String>,
    /// A TOML file of more front ends' tokens, shaped as `[feedback_tokens]` (`"fe-1" =
    /// "token"` lines), read at start by [`Config::load_secrets`]; a name in both is refused.
    pub feedback_tokens_file: Option<PathBuf>,
    /// Samples (demand samples, loads, server loads) a second each feedback source may send,
    /// with 30 s of it at once (`budget::BURST_SECS`).
    pub feedback_samples_per_sec: u64,
    /// The reports of a round's period (every source together, per cycle) give a unit at most
    /// this times its demand in the last round (or its class's mean unit demand, when more);
    /// beyond, they are clipped (`budget`).
    pub feedback_max_demand_ratio: f64,
    /// Take Feedback from anyone (under the name a report gives, budgeted by address) with
    /// the gRPC listener beyond loopback. Without it, such a listener needs a way to know its
    /// front ends, `[feedback_tokens]` or `tls.client_ca_file`, or the start is refused.
    pub feedback_open: bool,
    pub default_class: String,
    pub class_rules: Vec<ClassRuleConfig>,
    pub stickiness: StickinessConfig,
    pub second_chance: SecondChanceConfig,
    /// `[guard]`: the limits past which an operator's change is refused unless forced.
    pub guard: GuardConfig,
    /// `[n1]`: the N-1 view's sweeps.
    pub n1: N1Config,
    pub selection: SelectionConfig,
    pub demo: DemoConfig,
    /// Map units from MaxMind DBs instead of the demo world (read when the store has no
    /// topology, as `instance` is).
    pub mmdb: Option<MmdbConfig>,
    /// Health checks of the clusters' addresses (`health`); `None`: none, clusters go down
    /// only when an operator says so.
    pub health: Option<HealthConfig>,
    /// Per traffic class, its last resort (`[bypass.CLASS]`, a partner CDN): what clients of
    /// a unit whose every candidate is full or down are answered with.
    pub bypass: std::collections::BTreeMap<String, BypassConfig>,
    /// Measured round-trip times (`[rtt]`, Feedback's `ReportRtt`): how reports are weighed
    /// and how many (unit, cluster) pairs are kept.
    pub rtt: cdnmap_estimator::rtt::RttConfig,
}

/// `[bypass.CLASS]`: `cname = "cdn.partner.example."` or `addresses = ["192.0.2.10"]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BypassConfig {
    pub cname: Option<String>,
    pub addresses: Option<Vec<String>>,
}

impl BypassConfig {
    /// The last resort this says, or what is wrong with it.
    pub fn bypass(&self) -> Result<cdnmap_serve::watch::Bypass, String> {
        use cdnmap_serve::watch::Bypass;
        match (&self.cname, &self.addresses) {
            (Some(name), None) => Bypass::cname(name),
            (None, Some(a)) => Bypass::addresses(a),
            _ => Err("give cname or addresses, one of the two".into()),
        }
    }
}

/// How a cluster's addresses are probed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ProbeKind {
    /// A TCP connection is accepted.
    #[default]
    Tcp,
    /// `GET path` answers `expect_status`.
    Http,
}

/// `[health]`: probes of every cluster's addresses, and when an address counts as down.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthConfig {
    #[serde(default = "HealthConfig::default_interval_ms")]
    pub interval_ms: u64,
    #[serde(default = "HealthConfig::default_timeout_ms")]
    pub timeout_ms: u64,
    /// Down after this many failures in a row.
    #[serde(default = "HealthConfig::default_fall")]
    pub fall: u32,
    /// Up again after this many successes in a row.
    #[serde(default = "HealthConfig::default_rise")]
    pub rise: u32,
    #[serde(default)]
    pub kind: ProbeKind,
    pub port: u16,
    #[serde(default = "HealthConfig::default_path")]
    pub path: String,
    #[serde(default = "HealthConfig::default_expect_status")]
    pub expect_status: u16,
    /// Per cluster id: what differs from the above (`enabled = false`: not probed).
    #[serde(default)]
    pub clusters: std::collections::BTreeMap<String, ClusterProbe>,
    /// Whether the mapper probes too (one vote); `false` leaves it to the monitors.
    #[serde(default = "HealthConfig::default_local")]
    pub local: bool,
    /// The `cdnmap monitor`s whose reports (Feedback's `ReportHealth`, under this name: a
    /// feedback identity, or the name claimed where the service takes reports from anyone)
    /// vote. Each monitor and the mapper (when `local`) have one vote per address.
    #[serde(default)]
    pub monitors: Vec<String>,
    /// Down votes that take an address down; default a majority of the voters configured
    /// (`monitors`, and the mapper when `local`). Fewer voters reporting than this (monitors
    /// silent for 3 intervals) take nothing down: losing monitors fails open.
    pub quorum: Option<u32>,
}

/// `[health.clusters."id"]`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClusterProbe {
    pub enabled: Option<bool>,
    pub kind: Option<ProbeKind>,
    pub port: Option<u16>,
    pub path: Option<String>,
    pub expect_status: Option<u16>,
}

/// The most `cdnmap monitor`s a `[health]` names.
pub const MAX_MONITORS: usize = 64;

impl HealthConfig {
    fn default_interval_ms() -> u64 {
        2_000
    }
    fn default_timeout_ms() -> u64 {
        1_000
    }
    fn default_fall() -> u32 {
        3
    }
    fn default_rise() -> u32 {
        2
    }
    fn default_path() -> String {
        "/".into()
    }
    fn default_local() -> bool {
        true
    }

    /// The voters configured: the monitors, and the mapper when it probes.
    pub fn voters(&self) -> usize {
        self.monitors.len() + usize::from(self.local)
    }

    /// Down votes needed to take an address down (see `quorum`).
    pub fn quorum(&self) -> usize {
        self.quorum.map_or(self.voters() / 2 + 1, |q| q as usize)
    }
    fn default_expect_status() -> u16 {
        200
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let check = |ok: bool, key: &str, problem: String| {
            if ok {
                Ok(())
            } else {
                Err(invalid(key, problem))
            }
        };
        check(
            (100..=600_000).contains(&self.interval_ms),
            "health.interval_ms",
            format!("{} is outside 100..=600000", self.interval_ms),
        )?;
        check(
            (10..=60_000).contains(&self.timeout_ms) && self.timeout_ms <= self.interval_ms,
            "health.timeout_ms",
            format!(
                "{} is outside 10..=60000 or above interval_ms",
                self.timeout_ms
            ),
        )?;
        check(
            (1..=100).contains(&self.fall),
            "health.fall",
            format!("{} is outside 1..=100", self.fall),
        )?;
        check(
            (1..=100).contains(&self.rise),
            "health.rise",
            format!("{} is outside 1..=100", self.rise),
        )?;
        let paths = std::iter::once(("health", self.port, &self.path, self.expect_status));
        for (at, port, path, status) in paths {
            check(port != 0, &format!("{at}.port"), "must not be 0".into())?;
            check_path(&format!("{at}.path"), path)?;
            check(
                (100..=599).contains(&status),
                &format!("{at}.expect_status"),
                format!("{status} is not an HTTP status"),
            )?;
        }
        check(
            self.voters() > 0,
            "health.local",
            "false with no monitors: nobody would probe".into(),
        )?;
        check(
            self.monitors.len() <= MAX_MONITORS,
            "health.monitors",
            format!("{} monitors, more than {MAX_MONITORS}", self.monitors.len()),
        )?;
        for (i, m) in self.monitors.iter().enumerate() {
            cdnmap_mapper::model::check_id("monitor", m, String::new)
                .map_err(|e| invalid(&format!("health.monitors[{i}]"), e.to_string()))?;
            check(
                !self.monitors[..i].contains(m),
                &format!("health.monitors[{i}]"),
                format!("{m:?} is named twice"),
            )?;
        }
        if let Some(q) = self.quorum {
            check(
                q >= 1 && q as usize <= self.voters(),
                "health.quorum",
                format!(
                    "{q} is outside 1..={} (the voters configured)",
                    self.voters()
                ),
            )?;
        }
        for (id, o) in &self.clusters {
            let at = format!("health.clusters.{id}");
            if o.port == Some(0) {
                return Err(invalid(&format!("{at}.port"), "must not be 0"));
            }
            if let Some(path) = &o.path {
                check_path(&format!("{at}.path"), path)?;
            }
            if let Some(s) = o.expect_status {
                check(
                    (100..=599).contains(&s),
                    &format!("{at}.expect_status"),
                    format!("{s} is not an HTTP status"),
                )?;
            }
        }
        Ok(())
    }
}

/// An HTTP probe's path: starts with `/`, printable ASCII without spaces, at most 1 KiB (it
/// goes into the request line as it is).
fn check_path(key: &str, path: &str) -> Result<(), ConfigError> {
    if path.starts_with('/') && path.len() <= 1024 && path.bytes().all(|b| b.is_ascii_graphic()) {
        Ok(())
    } else {
        Err(invalid(
            key,
            format!("{path:?} must start with / and hold printable ASCII without spaces"),
        ))
    }
}

/// Most MaxMind DB files in `[mmdb]`.
pub const MAX_MMDB_FILES: usize = 16;

/// The world of a MaxMind DB's located networks (`cdnmap world --mmdb` takes the same).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmdbConfig {
    pub files: Vec<PathBuf>,
    #[serde(default)]
    pub sites: Option<PathBuf>,
    #[serde(default = "MmdbConfig::default_clusters")]
    pub clusters: usize,
    #[serde(default = "MmdbConfig::default_class_mix")]
    pub class_mix: String,
    #[serde(default = "MmdbConfig::default_v6_fold_len")]
    pub v6_fold_len: u8,
    #[serde(default = "MmdbConfig::default_seed")]
    pub seed: u64,
}

impl MmdbConfig {
    fn default_clusters() -> usize {
        240
    }
    fn default_class_mix() -> String {
        "web=0.5,video=0.35,apps=0.15".into()
    }
    fn default_v6_fold_len() -> u8 {
        48
    }
    fn default_seed() -> u64 {
        1
    }
}

/// In-cluster server selection: a default policy and per-cluster overrides.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SelectionConfig {
    pub default: PolicyConfig,
    /// Cluster id → its policy.
    pub clusters: std::collections::BTreeMap<String, PolicyConfig>,
}

/// One selection policy (`mapper::servers::Policy`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    pub policy: PolicyName,
    pub vnodes: u32,
    /// Bounded loads' factor (> 1).
    pub c: f64,
    /// Power-of-d's d.
    pub d: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyName {
    Consistent,
    Bounded,
    PowerOfD,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            policy: PolicyName::Consistent,
            vnodes: 100,
            c: 1.25,
            d: 2,
        }
    }
}

impl PolicyConfig {
    pub fn policy(&self) -> cdnmap_serve::servers::Policy {
        use cdnmap_serve::servers::Policy;
        let vnodes = self.vnodes;
        match self.policy {
            PolicyName::Consistent => Policy::Consistent { vnodes },
            PolicyName::Bounded => Policy::BoundedLoads { vnodes, c: self.c },
            PolicyName::PowerOfD => Policy::PowerOfD { vnodes, d: self.d },
        }
    }
}

impl SelectionConfig {
    /// The policy of each cluster of `instance`, in cluster order.
    pub fn policies(
        &self,
        instance: &cdnmap_mapper::Instance,
    ) -> Vec<cdnmap_serve::servers::Policy> {
        instance
            .clusters()
            .iter()
            .map(|c| self.clusters.get(&c.id).unwrap_or(&self.default).policy())
            .collect()
    }

    /// Refuses overrides for clusters `instance` does not have (a typo would otherwise go
    /// unnoticed).
    pub fn check_clusters(&self, instance: &cdnmap_mapper::Instance) -> Result<(), ConfigError> {
        match self
            .clusters
            .keys()
            .find(|id| instance.cluster_index(id).is_none())
        {
            Some(id) => Err(invalid(
                &format!("selection.clusters.{id}"),
                "no such cluster in the topology",
            )),
            None => Ok(()),
        }
    }
}

/// A TLS client's files, (CA, certificate, key) named by `keys`, each error naming its key:
/// none empty; none given when `refused` says why they cannot be used; the CA given when
/// `ca_needed` says why, and with a certificate; the certificate and its key both or neither.
fn check_client_tls(
    keys: [&str; 3],
    files: [&Option<PathBuf>; 3],
    refused: Option<&str>,
    ca_needed: Option<&str>,
) -> Result<(), ConfigError> {
    for (key, path) in keys.into_iter().zip(files) {
        if path.as_ref().is_some_and(|p| p.as_os_str().is_empty()) {
            return Err(invalid(key, "is empty"));
        }
        if let (Some(_), Some(why)) = (path, refused) {
            return Err(invalid(key, why));
        }
    }
    let [ca, cert, key] = files;
    match (cert, key) {
        (Some(_), None) => {
            return Err(invalid(
                keys[2],
                format!("is needed with {} (the certificate's private key)", keys[1]),
            ))
        }
        (None, Some(_)) => {
            return Err(invalid(
                keys[1],
                format!("is needed with {} (the key's certificate)", keys[2]),
            ))
        }
        _ => {}
    }
    if ca.is_none() {
        if let Some(why) = ca_needed {
            return Err(invalid(keys[0], why));
        }
        if cert.is_some() {
            return Err(invalid(
                keys[0],
                format!(
                    "is needed with {}: the CA the server's certificate must chain to",
                    keys[1]
                ),
            ));
        }
    }
    Ok(())
}

/// `[tls]`: the listeners' certificate and key, and the CA of front ends for mutual TLS;
/// replicated, what a standby needs to follow the leader's maps over TLS.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    #[serde(default)]
    pub client_ca_file: Option<PathBuf>,
    /// The CA the other replicas' listener certificates chain to. With it a standby follows
    /// the leader's WatchMap over TLS and seeds its rounds from the leader's maps; without
    /// it, it seeds from its own (a takeover then moves more).
    #[serde(default)]
    pub peer_ca_file: Option<PathBuf>,
    /// This replica's client certificate and key for a leader whose listeners ask for one
    /// (its `client_ca_file`): both or neither, with `peer_ca_file`.
    #[serde(default)]
    pub peer_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub peer_key_file: Option<PathBuf>,
}

impl Config {
    /// Whether client certificates identify front ends (`[tls] client_ca_file`): then only
    /// clients with one may watch maps and send feedback.
    pub fn mutual_tls(&self) -> bool {
        self.tls
            .as_ref()
            .is_some_and(|t| t.client_ca_file.is_some())
    }
}

impl TlsConfig {
    /// The peer keys, each error naming its key (`replicated`: whether there are peers).
    fn validate_peers(&self, replicated: bool) -> Result<(), ConfigError> {
        check_client_tls(
            [
                "tls.peer_ca_file",
                "tls.peer_cert_file",
                "tls.peer_key_file",
            ],
            [
                &self.peer_ca_file,
                &self.peer_cert_file,
                &self.peer_key_file,
            ],
            (!replicated).then_some("is given but this mapper has no peers (no etcd)"),
            None,
        )
    }

    pub fn to_files(&self) -> crate::tls::TlsFiles {
        crate::tls::TlsFiles {
            cert_file: self.cert_file.clone(),
            key_file: self.key_file.clone(),
            client_ca_file: self.client_ca_file.clone(),
        }
    }
}

/// One hostname rule: `pattern` ("www.cdn.example" or "*.video.cdn.example") → `class`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClassRuleConfig {
    pub pattern: String,
    pub class: String,
}

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StickinessConfig {
    pub margin: f64,
    pub incumbents_first: bool,
}

/// `[second_chance]`: whether rounds place overflow beyond the units' candidate lists.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecondChanceConfig {
    /// "off" or "beyond-lists" ("within-lists", the chains, is refused: its cost at scale).
    pub mode: String,
    pub max_beyond_ms: f32,
}

impl Default for SecondChanceConfig {
    fn default() -> Self {
        SecondChanceConfig {
            mode: "off".into(),
            max_beyond_ms: cdnmap_mapper::SecondChanceParams::default().max_beyond_ms,
        }
    }
}

/// `[guard]`: each limit off when absent.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// The most the overflow share may rise, in points of the demand (1.0: from 1.2% to 2.2%).
    pub max_overflow_points: Option<f64>,
    /// The largest share of the demand one change may move (0.1: a tenth).
    pub max_moved_share: Option<f64>,
    /// The most resource nodes a change may newly fill (to 99.9% of their capacity or more).
    pub max_nodes_full_added: Option<u64>,
    /// The per-round movement budget: the largest share of the demand an operator's change
    /// may move in one round. A ramp's steps keep within it; a change made at once that
    /// would move more is refused (unless forced), with the rounds a ramp would need.
    pub max_moved_share_per_round: Option<f64>,
}

impl GuardConfig {
    /// Whether any limit is set.
    pub fn is_on(&self) -> bool {
        self.max_overflow_points.is_some()
            || self.max_moved_share.is_some()
            || self.max_nodes_full_added.is_some()
            || self.max_moved_share_per_round.is_some()
    }

    /// A limit out of its range, named (`[guard]`'s keys); `None` when all are fine.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if let Some(p) = self.max_overflow_points {
            if !(p.is_finite() && (0.0..=100.0).contains(&p)) {
                return Some((
                    "guard.max_overflow_points",
                    format!("{p} is outside 0..=100"),
                ));
            }
        }
        if let Some(s) = self.max_moved_share {
            if !(s.is_finite() && (0.0..=1.0).contains(&s)) {
                return Some(("guard.max_moved_share", format!("{s} is outside 0..=1")));
            }
        }
        if let Some(s) = self.max_moved_share_per_round {
            if !(s.is_finite() && s > 0.0 && s <= 1.0) {
                return Some((
                    "guard.max_moved_share_per_round",
                    format!("{s} is outside (0, 1]: a ramp could never finish"),
                ));
            }
        }
        None
    }
}

/// `[n1]`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct N1Config {
    /// How often a sweep starts (0: never).
    pub every_secs: u64,
    /// How long one sweep may take; a sweep past it stops and says it is incomplete.
    pub budget_secs: u64,
    /// The worst clusters and sites (each) previewed exactly after the sweep.
    pub exact_top: usize,
}

impl Default for N1Config {
    fn default() -> Self {
        N1Config {
            every_secs: 60,
            budget_secs: 120,
            exact_top: 3,
        }
    }
}

/// The most clusters or sites previewed exactly after a sweep.
pub const MAX_N1_EXACT_TOP: usize = 50;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DemoConfig {
    pub map_units: usize,
    pub clusters: usize,
    pub seed: u64,
    /// Total capacity over total demand, per resource kind (the generator's `headroom`). The
    /// demo's default leaves most clusters well under full and a few hot spots, so the
    /// dashboard's map shows where the trouble is; the generator's own default (1.1, what
    /// `cdnmap world` and the benchmarks use) runs most of them full.
    pub headroom: f64,
    /// Go with the winner: per class name, the share of each unit's demand a second cluster
    /// in its answers draws, reserved for it there (`TrafficClass::companion_share`, in
    /// [0, 0.5]). Empty (the default): answers name only the clusters the map gives a unit.
    pub companion: std::collections::BTreeMap<String, f64>,
}

/// The demo world's default capacity headroom (see [`DemoConfig::headroom`]).
pub const DEFAULT_DEMO_HEADROOM: f64 = 2.0;

impl Default for Config {
    fn default() -> Self {
        Config {
            cycle_secs: 10,
            grpc_listen: SocketAddr::from(([127, 0, 0, 1], 50051)),
            http_listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            data_dir: PathBuf::from("cdnmap-data"),
            maps_kept: 64,
            ttl_secs: 20,
            admin_token: None,
            admin_token_file: None,
            learning: true,
            record_retention_hours: 7 * 24,
            record_max_mb: 768,
            instance: None,
            http_header_timeout_secs: 10,
            http_max_connections: 1024,
            grpc_max_connections: 1024,
            handshake_timeout_secs: 10,
            idle_timeout_secs: 120,
            max_connections_per_source: 256,
            watch_open: true,
            watch_stall_secs: 60,
            watch_max_streams: 1024,
            etcd: Vec::new(),
            node_id: None,
            etcd_prefix: "cdnmap/".into(),
            etcd_ca_file: None,
            etcd_cert_file: None,
            etcd_key_file: None,
            advertise_url: None,
            tls: None,
            feedback_tokens: Default::default(),
            feedback_tokens_file: None,
            feedback_samples_per_sec: 200_000,
            feedback_max_demand_ratio: 10.0,
            feedback_open: false,
            default_class: "web".into(),
            class_rules: vec![
                ClassRuleConfig {
                    pattern: "www.cdn.example".into(),
                    class: "web".into(),
                },
                ClassRuleConfig {
                    pattern: "*.web.cdn.example".into(),
                    class: "web".into(),
                },
                ClassRuleConfig {
                    pattern: "*.video.cdn.example".into(),
                    class: "video".into(),
                },
                ClassRuleConfig {
                    pattern: "*.apps.cdn.example".into(),
                    class: "apps".into(),
                },
            ],
            stickiness: StickinessConfig::default(),
            second_chance: SecondChanceConfig::default(),
            guard: GuardConfig::default(),
            n1: N1Config::default(),
            selection: SelectionConfig::default(),
            demo: DemoConfig::default(),
            mmdb: None,
            health: None,
            bypass: Default::default(),
            rtt: Default::default(),
        }
    }
}

impl Default for StickinessConfig {
    fn default() -> Self {
        StickinessConfig {
            margin: cdnmap_mapper::DEFAULT_STICKINESS,
            incumbents_first: true,
        }
    }
}

impl Default for DemoConfig {
    fn default() -> Self {
        DemoConfig {
            map_units: 30_000,
            clusters: 120,
            seed: 1,
            headroom: DEFAULT_DEMO_HEADROOM,
            companion: Default::default(),
        }
    }
}

/// Most etcd endpoints.
pub const MAX_ETCD_ENDPOINTS: usize = 16;
/// Longest node id and etcd prefix.
pub const MAX_NODE_ID_BYTES: usize = 64;

impl Config {
    /// Whether this mapper is one replica of several (leader elected through etcd).
    pub fn replicated(&self) -> bool {
        !self.etcd.is_empty()
    }

    /// `etcd`, `node_id` and `etcd_prefix`, each error naming its key and entry.
    fn validate_etcd(&self) -> Result<(), ConfigError> {
        let tls = self.validate_etcd_urls()?;
        self.validate_etcd_tls(tls)?;
        self.validate_advertise_url()?;
        self.validate_replica_names()
    }

    /// The `etcd` URLs: at most [`MAX_ETCD_ENDPOINTS`], each `http://` or `https://` (one
    /// scheme for all) and HOST:PORT, none twice. Whether they are `https://`.
    fn validate_etcd_urls(&self) -> Result<bool, ConfigError> {
        if self.etcd.len() > MAX_ETCD_ENDPOINTS {
            return Err(invalid(
                "etcd",
                format!(
                    "{} endpoints, more than {MAX_ETCD_ENDPOINTS}",
                    self.etcd.len()
                ),
            ));
        }
        // One scheme for all: TLS to some members and not to others would be a cluster
        // half trusted.
        let tls = self.etcd.first().is_some_and(|u| u.starts_with("https://"));
        let scheme = if tls { "https://" } else { "http://" };
        for (i, url) in self.etcd.iter().enumerate() {
            let key = format!("etcd[{i}]");
            let shown = cdnmap_mapper::model::shown_id(url);
            let authority = url.strip_prefix(scheme).ok_or_else(|| {
                invalid(
                    &key,
                    if i > 0 && url.starts_with(if tls { "http://" } else { "https://" }) {
                        format!("{shown}: etcd[0] is {scheme}, and every entry must be too")
                    } else {
                        format!("{shown} is not an http:// or https:// URL")
                    },
                )
            })?;
            let authority = authority.trim_end_matches('/');
            if authority.is_empty()
                || authority.contains(['/', '?', '#', '@'])
                || authority
                    .chars()
                    .any(|c| c.is_whitespace() || c.is_control())
                || !authority
                    .parse::<axum::http::uri::Authority>()
                    .is_ok_and(|a| a.port_u16().is_some_and(|p| p != 0))
            {
                return Err(invalid(
                    &key,
                    format!("{shown} is not an {scheme}HOST:PORT URL"),
                ));
            }
            if self.etcd[..i].contains(url) {
                return Err(invalid(&key, format!("{shown} is given twice")));
            }
        }
        Ok(tls)
    }

    /// `advertise_url`, in the scheme the listeners speak.
    fn validate_advertise_url(&self) -> Result<(), ConfigError> {
        if let Some(url) = &self.advertise_url {
            let shown = cdnmap_mapper::model::shown_id(url);
            // The scheme the listeners speak: a standby follows the URL as advertised, and
            // one configured for TLS refuses a plaintext one.
            let scheme = if self.tls.is_some() {
                "https://"
            } else {
                "http://"
            };
            let authority = url.strip_prefix(scheme).map(|a| a.trim_end_matches('/'));
            let ok = authority.is_some_and(|a| {
                !a.is_empty()
                    && !a.contains(['/', '?', '#', '@', ' '])
                    && a.parse::<axum::http::uri::Authority>()
                        .is_ok_and(|a| a.port_u16().is_some_and(|p| p != 0))
            });
            if !ok {
                let listeners = if self.tls.is_some() {
                    "TLS ([tls])"
                } else {
                    "plaintext"
                };
                return Err(invalid(
                    "advertise_url",
                    format!(
                        "{shown} is not an {scheme}HOST:PORT URL (the listeners are {listeners})"
                    ),
                ));
            }
        }
        Ok(())
    }

    /// `node_id` (needed with `etcd`) and `etcd_prefix`: names of at most
    /// [`MAX_NODE_ID_BYTES`] of A-Z a-z 0-9 - _ . (and / in the prefix, which ends in one).
    fn validate_replica_names(&self) -> Result<(), ConfigError> {
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= MAX_NODE_ID_BYTES
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
        };
        match (&self.node_id, self.replicated()) {
            (None, true) => {
                return Err(invalid(
                    "node_id",
                    "is needed with etcd: each replica's own name (--node-id)",
                ))
            }
            (Some(id), _) if !name_ok(id) => {
                return Err(invalid(
                    "node_id",
                    format!(
                        "{}: 1 to {MAX_NODE_ID_BYTES} of A-Z a-z 0-9 - _ .",
                        cdnmap_mapper::model::shown_id(id)
                    ),
                ))
            }
            _ => {}
        }
        let prefix = self.etcd_prefix.trim_end_matches('/');
        if !name_ok(&prefix.replace('/', "")) || !self.etcd_prefix.ends_with('/') {
            return Err(invalid(
                "etcd_prefix",
                format!(
                    "{}: 1 to {MAX_NODE_ID_BYTES} of A-Z a-z 0-9 - _ . /, ending in /",
                    cdnmap_mapper::model::shown_id(&self.etcd_prefix)
                ),
            ));
        }
        Ok(())
    }

    /// The etcd TLS keys against the URLs' scheme (`tls`: https://), each error naming its
    /// key.
    fn validate_etcd_tls(&self, tls: bool) -> Result<(), ConfigError> {
        let refused = match (tls, self.etcd.is_empty()) {
            (true, _) => None,
            (false, true) => Some("is given but etcd is not"),
            (false, false) => Some("is given but etcd is plaintext (http://): use https://"),
        };
        check_client_tls(
            ["etcd_ca_file", "etcd_cert_file", "etcd_key_file"],
            [
                &self.etcd_ca_file,
                &self.etcd_cert_file,
                &self.etcd_key_file,
            ],
            refused,
            tls.then_some("is needed with https:// etcd: the CA its certificate must chain to"),
        )
    }

    /// Beyond loopback, Feedback from known front ends only, unless `feedback_open` says
    /// otherwise: anyone who can reach the listener could report demand and steer the map.
    fn validate_feedback_open(&self) -> Result<(), ConfigError> {
        let known = self.has_feedback_tokens() || self.mutual_tls();
        if known || self.feedback_open || self.grpc_listen.ip().is_loopback() {
            return Ok(());
        }
        Err(invalid(
            "feedback_open",
            format!(
                "grpc_listen {} is beyond loopback, and Feedback would take reports from anyone \
                 who reaches it: give the front ends [feedback_tokens] or a client CA \
                 (tls.client_ca_file), or set feedback_open = true to take anonymous reports",
                self.grpc_listen
            ),
        ))
    }

    /// The WatchMap keys, each error naming its key.
    fn validate_watch(&self) -> Result<(), ConfigError> {
        in_range("watch_stall_secs", self.watch_stall_secs, &WATCH_STALL_SECS)?;
        in_range(
            "watch_max_streams",
            self.watch_max_streams,
            &WATCH_MAX_STREAMS,
        )?;
        if !self.watch_open && !self.has_feedback_tokens() && !self.mutual_tls() {
            return Err(invalid(
                "watch_open",
                "is false, and no front end could follow the map: give [feedback_tokens] \
                 (or [tls] client_ca_file)",
            ));
        }
        Ok(())
    }

    /// Whether front ends' tokens are configured (inline, or in `feedback_tokens_file`, which
    /// [`Config::load_secrets`] reads).
    fn has_feedback_tokens(&self) -> bool {
        !self.feedback_tokens.is_empty() || self.feedback_tokens_file.is_some()
    }

    /// Reads the secrets kept outside the configuration: the Admin token from
    /// `admin_token_file` or the environment variable [`ADMIN_TOKEN_ENV`] (read through `env`),
    /// at most one of them and `admin_token`; the front ends' tokens of `feedback_tokens_file`
    /// and of [`FEEDBACK_TOKENS_ENV`] into `feedback_tokens`. The files' keys are emptied (what they held is now inline), so
    /// [`Config::validate`] then checks the tokens as if written inline. Returns warnings for
    /// the log (a file others may read). Errors name the key, the variable and the file.
    pub fn load_secrets(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<String>, ConfigError> {
        let mut warnings = Vec::new();
        let from_env = env(ADMIN_TOKEN_ENV);
        let file = self.admin_token_file.take();
        let admin = cdnmap_proto::secret::token(cdnmap_proto::secret::Sources {
            inline: self.admin_token.as_deref().map(|t| ("admin_token", t)),
            file: file.as_deref().map(|p| ("admin_token_file", p)),
            env: from_env.as_deref().map(|v| (ADMIN_TOKEN_ENV, v)),
        })
        .map_err(|e| invalid("admin_token", e))?;
        if let Some(secret) = admin {
            warnings.extend(secret.warning);
            self.admin_token = Some(secret.value);
        }
        if let Some(path) = self.feedback_tokens_file.take() {
            let key = "feedback_tokens_file";
            let read = cdnmap_proto::secret::read_file(key, &path).map_err(|e| invalid(key, e))?;
            warnings.extend(read.warning);
            let tokens: std::collections::BTreeMap<String, String> = toml::from_str(&read.value)
                .map_err(|e| {
                    invalid(
                        key,
                        format!("{}: {}", path.display(), e.message().trim_end()),
                    )
                })?;
            let source = path.display().to_string();
            self.join_feedback_tokens(key, &source, "[feedback_tokens]", tokens)?;
        }
        if let Some(pairs) = env(FEEDBACK_TOKENS_ENV).filter(|v| !v.trim().is_empty()) {
            let key = FEEDBACK_TOKENS_ENV;
            let mut tokens = std::collections::BTreeMap::new();
            for pair in pairs.split_whitespace().take(MAX_FEEDBACK_TOKENS_ENV + 1) {
                if tokens.len() == MAX_FEEDBACK_TOKENS_ENV {
                    return Err(invalid(
                        key,
                        format!("more than {MAX_FEEDBACK_TOKENS_ENV} NAME=TOKEN pairs"),
                    ));
                }
                let Some((name, token)) = pair.split_once('=').filter(|(n, _)| !n.is_empty())
                else {
                    // The pair is not shown: it may be a token.
                    return Err(invalid(
                        key,
                        format!(
                            "pair {} is not NAME=TOKEN (pairs separated by white space)",
                            tokens.len() + 1
                        ),
                    ));
                };
                if tokens.insert(name.to_string(), token.to_string()).is_some() {
                    let shown = cdnmap_mapper::model::shown_id(name);
                    return Err(invalid(key, format!("{shown} is named twice")));
                }
            }
            let elsewhere = "[feedback_tokens] or feedback_tokens_file";
            self.join_feedback_tokens(key, "the environment", elsewhere, tokens)?;
        }
        Ok(warnings)
    }

    /// Adds the front ends' `tokens` read from `source` (under `key`) to `feedback_tokens`; a
    /// name already there (from `elsewhere`) is refused.
    fn join_feedback_tokens(
        &mut self,
        key: &str,
        source: &str,
        elsewhere: &str,
        tokens: std::collections::BTreeMap<String, String>,
    ) -> Result<(), ConfigError> {
        for (name, token) in tokens {
            if self.feedback_tokens.contains_key(&name) {
                let shown = cdnmap_mapper::model::shown_id(&name);
                return Err(invalid(
                    key,
                    format!("{source}: {shown} is also in {elsewhere}: keep one"),
                ));
            }
            self.feedback_tokens.insert(name, token);
        }
        Ok(())
    }

    /// Parses and validates a TOML document.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config = Config::parse_toml(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document (unknown keys and wrong types refused) without checking the
    /// values: for a caller that adds what is kept outside the file ([`Config::load_secrets`])
    /// before [`Config::validate`].
    pub fn parse_toml(text: &str) -> Result<Self, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.validate_ranges()?;
        if self.grpc_listen == self.http_listen && self.grpc_listen.port() != 0 {
            return Err(invalid(
                "http_listen",
                format!("{} is also grpc_listen", self.http_listen),
            ));
        }
        if self.data_dir.as_os_str().is_empty() {
            return Err(invalid("data_dir", "is empty"));
        }
        self.validate_etcd()?;
        if let Some(tls) = &self.tls {
            tls.validate_peers(self.replicated())?;
        }
        if let Some(token) = &self.admin_token {
            check_token("admin_token", token)?;
        }
        self.validate_feedback_open()?;
        self.validate_feedback_tokens()?;
        self.validate_classes()?;
        cdnmap_mapper::Stickiness {
            margin: self.stickiness.margin,
            incumbents_first: self.stickiness.incumbents_first,
        }
        .validate()
        .map_err(|e| invalid("stickiness.margin", e.to_string()))?;
        self.round_chance()?;
        if let Some((key, problem)) = self.guard.problem() {
            return Err(invalid(key, problem));
        }
        if self.n1.exact_top > MAX_N1_EXACT_TOP {
            return Err(invalid(
                "n1.exact_top",
                format!("{} is more than {}", self.n1.exact_top, MAX_N1_EXACT_TOP),
            ));
        }
        if self.n1.every_secs > 86_400 {
            return Err(invalid(
                "n1.every_secs",
                format!("{} is more than a day (86400)", self.n1.every_secs),
            ));
        }
        if self.n1.every_secs > 0 && !(1..=86_400).contains(&self.n1.budget_secs) {
            return Err(invalid(
                "n1.budget_secs",
                format!(
                    "{} is outside 1..=86400 while sweeps run",
                    self.n1.budget_secs
                ),
            ));
        }
        self.validate_selection()?;
        if let Some(h) = &self.health {
            h.validate()?;
        }
        self.rtt.validate().map_err(|e| invalid("rtt", e))?;
        for (class, b) in &self.bypass {
            b.bypass()
                .map_err(|e| invalid(&format!("bypass.{class}"), e))?;
        }
        self.validate_start()
    }

    /// The numbers with a range (timeouts, connection counts, WatchMap's, the feedback
    /// budget and bounds, what is kept), each error naming its key.
    fn validate_ranges(&self) -> Result<(), ConfigError> {
        in_range("cycle_secs", self.cycle_secs, &CYCLE_SECS)?;
        in_range(
            "http_header_timeout_secs",
            self.http_header_timeout_secs,
            &HTTP_HEADER_TIMEOUT_SECS,
        )?;
        in_range(
            "http_max_connections",
            self.http_max_connections,
            &HTTP_MAX_CONNECTIONS,
        )?;
        in_range(
            "grpc_max_connections",
            self.grpc_max_connections,
            &GRPC_MAX_CONNECTIONS,
        )?;
        in_range(
            "handshake_timeout_secs",
            self.handshake_timeout_secs,
            &HANDSHAKE_TIMEOUT_SECS,
        )?;
        in_range(
            "idle_timeout_secs",
            self.idle_timeout_secs,
            &IDLE_TIMEOUT_SECS,
        )?;
        in_range(
            "max_connections_per_source",
            self.max_connections_per_source,
            &MAX_CONNECTIONS_PER_SOURCE,
        )?;
        self.validate_watch()?;
        in_range(
            "feedback_samples_per_sec",
            self.feedback_samples_per_sec,
            &FEEDBACK_SAMPLES_PER_SEC,
        )?;
        if !(self.feedback_max_demand_ratio.is_finite()
            && FEEDBACK_MAX_DEMAND_RATIO.contains(&self.feedback_max_demand_ratio))
        {
            return Err(invalid(
                "feedback_max_demand_ratio",
                format!(
                    "{} is outside {}..={}",
                    self.feedback_max_demand_ratio,
                    FEEDBACK_MAX_DEMAND_RATIO.start(),
                    FEEDBACK_MAX_DEMAND_RATIO.end()
                ),
            ));
        }
        in_range("maps_kept", self.maps_kept, &MAPS_KEPT)?;
        in_range("ttl_secs", self.ttl_secs, &TTL_SECS)?;
        in_range(
            "record_retention_hours",
            self.record_retention_hours,
            &RECORD_RETENTION_HOURS,
        )?;
        in_range("record_max_mb", self.record_max_mb, &RECORD_MAX_MB)?;
        Ok(())
    }

    /// `feedback_tokens`: each name an id, each token a token, none the Admin token's nor
    /// another front end's.
    fn validate_feedback_tokens(&self) -> Result<(), ConfigError> {
        let mut seen = std::collections::BTreeMap::new();
        for (name, token) in &self.feedback_tokens {
            let key = format!("feedback_tokens.{}", cdnmap_mapper::model::shown_id(name));
            cdnmap_mapper::model::check_id("front end name", name, String::new)
                .map_err(|e| invalid(&key, e.to_string()))?;
            check_token(&key, token)?;
            if self.admin_token.as_deref() == Some(token.as_str()) {
                return Err(invalid(
                    &key,
                    "is the Admin token: a front end's token must be its own",
                ));
            }
            if let Some(other) = seen.insert(token.as_str(), name) {
                return Err(invalid(&key, format!("is also the token of {other:?}")));
            }
        }
        Ok(())
    }

    /// `default_class` and `class_rules` (at most [`MAX_CLASS_RULES`], none empty).
    fn validate_classes(&self) -> Result<(), ConfigError> {
        if self.default_class.is_empty() {
            return Err(invalid("default_class", "is empty"));
        }
        if self.class_rules.len() > MAX_CLASS_RULES {
            return Err(invalid(
                "class_rules",
                format!(
                    "{} rules, more than {MAX_CLASS_RULES}",
                    self.class_rules.len()
                ),
            ));
        }
        for (i, rule) in self.class_rules.iter().enumerate() {
            if rule.pattern.is_empty() || rule.class.is_empty() {
                return Err(invalid(
                    &format!("class_rules[{i}]"),
                    "pattern and class must not be empty",
                ));
            }
        }
        Ok(())
    }

    /// The selection policies, the default's and each cluster's.
    fn validate_selection(&self) -> Result<(), ConfigError> {
        let policies = std::iter::once(("selection.default".to_string(), &self.selection.default))
            .chain(
                self.selection
                    .clusters
                    .iter()
                    .map(|(id, p)| (format!("selection.clusters.{id}"), p)),
            );
        for (key, p) in policies {
            p.policy()
                .validate()
                .map_err(|e| invalid(&key, e.to_string()))?;
        }
        Ok(())
    }

    /// What the topology starts from: `[mmdb]` (not with `instance`), else with neither the
    /// demo world's size.
    fn validate_start(&self) -> Result<(), ConfigError> {
        if let Some(m) = &self.mmdb {
            if self.instance.is_some() {
                return Err(invalid(
                    "mmdb",
                    "instance and [mmdb] both name the topology to start from; give one",
                ));
            }
            if m.files.is_empty() || m.files.len() > MAX_MMDB_FILES {
                return Err(invalid(
                    "mmdb.files",
                    format!("{} files, must be 1..={MAX_MMDB_FILES}", m.files.len()),
                ));
            }
            if !(1..=1 << 16).contains(&m.clusters) {
                return Err(invalid(
                    "mmdb.clusters",
                    format!("{} is outside 1..=65536", m.clusters),
                ));
            }
            if !(1..=128).contains(&m.v6_fold_len) {
                return Err(invalid(
                    "mmdb.v6_fold_len",
                    format!("{} is outside 1..=128", m.v6_fold_len),
                ));
            }
        } else if self.instance.is_none() {
            if !(1..=MAX_DEMO_MAP_UNITS).contains(&self.demo.map_units) {
                return Err(invalid(
                    "demo.map_units",
                    format!(
                        "{} is outside 1..={MAX_DEMO_MAP_UNITS}",
                        self.demo.map_units
                    ),
                ));
            }
            if self.demo.clusters == 0 {
                return Err(invalid("demo.clusters", "must be at least 1"));
            }
            if !(self.demo.headroom.is_finite() && (0.1..=100.0).contains(&self.demo.headroom)) {
                return Err(invalid(
                    "demo.headroom",
                    format!("{} is outside 0.1..=100", self.demo.headroom),
                ));
            }
            for (class, &share) in &self.demo.companion {
                let most = cdnmap_mapper::model::MAX_COMPANION_SHARE;
                if !(share.is_finite() && (0.0..=most).contains(&share)) {
                    return Err(invalid(
                        &format!("demo.companion.{class}"),
                        format!("{share} is outside 0..={most}"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The last resorts by class name (those that check: `validate` refused the others).
    pub fn bypass_pairs(&self) -> Vec<(String, cdnmap_serve::watch::Bypass)> {
        self.bypass
            .iter()
            .filter_map(|(class, b)| Some((class.clone(), b.bypass().ok()?)))
            .collect()
    }

    /// The hostname rules as the mapper's `ClassRules` takes them.
    pub fn class_rule_pairs(&self) -> Vec<(String, String)> {
        self.class_rules
            .iter()
            .map(|r| (r.pattern.clone(), r.class.clone()))
            .collect()
    }

    /// The second chance rounds give overflow (`[second_chance]`), checked.
    pub fn round_chance(&self) -> Result<cdnmap_engine::round::RoundChance, ConfigError> {
        use cdnmap_mapper::SecondChance;
        let c = &self.second_chance;
        if !(c.max_beyond_ms.is_finite() && c.max_beyond_ms > 0.0 && c.max_beyond_ms <= 10_000.0) {
            return Err(invalid(
                "second_chance.max_beyond_ms",
                format!("{} is outside (0, 10000] ms", c.max_beyond_ms),
            ));
        }
        match c.mode.parse::<SecondChance>() {
            Ok(SecondChance::Off) => Ok(cdnmap_engine::round::RoundChance::default()),
            Ok(SecondChance::BeyondLists) => Ok(cdnmap_engine::round::RoundChance::beyond_lists(
                c.max_beyond_ms,
            )),
            Ok(SecondChance::WithinLists) => Err(invalid(
                "second_chance.mode",
                "\"within-lists\" (chains of moves) costs 90-560x the solve at 100 k-1 M units \
                 (docs/perf/overflow.md); rounds take \"off\" or \"beyond-lists\"",
            )),
            Err(e) => Err(invalid("second_chance.mode", e)),
        }
    }

    /// The stickiness as the mapper takes it.
    pub fn stickiness(&self) -> cdnmap_mapper::Stickiness {
        cdnmap_mapper::Stickiness {
            margin: self.stickiness.margin,
            incumbents_first: self.stickiness.incumbents_first,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_file_means_the_defaults_and_they_are_valid() {
        let c = Config::from_toml("").expect("empty file is the defaults");
        assert_eq!(c, Config::default());
        assert_eq!(c.cycle_secs, 10);
        assert_eq!(c.grpc_listen.to_string(), "127.0.0.1:50051");
        assert_eq!(c.http_listen.to_string(), "127.0.0.1:8080");
    }

    #[test]
    fn the_documented_example_parses() {
        let doc = cdnmap_dns::config::doc_example(include_str!("config.rs"));
        let c = Config::from_toml(&doc).expect("the module doc's example is valid");
        assert_eq!(c.admin_token.as_deref(), Some("change-me"));
        assert_eq!(c.class_rules.len(), 1);
        assert_eq!(c.instance, Some(PathBuf::from("world.json")));
        assert_eq!(c.etcd_ca_file, Some(PathBuf::from("etcd-ca.crt")));
        assert_eq!(
            (c.idle_timeout_secs, c.max_connections_per_source),
            (120, 256)
        );
        assert_eq!(
            (c.watch_open, c.watch_stall_secs, c.watch_max_streams),
            (true, 60, 1024)
        );
        let tls = c.tls.expect("the example's [tls]");
        assert_eq!(tls.peer_ca_file, Some(PathBuf::from("mappers-ca.crt")));
    }

    /// etcd over TLS: a CA alone (server authentication), or with a client certificate.
    #[test]
    fn etcd_over_tls_takes_its_ca_and_a_client_certificate() {
        let base = "etcd = [\"https://10.0.0.1:2379\", \"https://etcd-2.example:2379/\"]\nnode_id = \"m1\"\netcd_ca_file = \"etcd-ca.crt\"\n";
        let c = Config::from_toml(base).expect("a CA alone");
        assert_eq!(c.etcd_ca_file, Some(PathBuf::from("etcd-ca.crt")));
        assert_eq!(c.etcd_cert_file, None);
        let c = Config::from_toml(&format!(
            "{base}etcd_cert_file = \"m1.crt\"\netcd_key_file = \"m1.key\"\n"
        ))
        .expect("with a client certificate");
        assert_eq!(c.etcd_cert_file, Some(PathBuf::from("m1.crt")));
        assert_eq!(c.etcd_key_file, Some(PathBuf::from("m1.key")));
    }

    /// Beyond loopback, Feedback needs a way to know its front ends — tokens or a client CA —
    /// or `feedback_open = true`; the refusal names all three. On loopback anyone may report.
    #[test]
    fn feedback_beyond_loopback_needs_tokens_a_client_ca_or_feedback_open() {
        let tls = "[tls]\ncert_file = \"c.crt\"\nkey_file = \"c.key\"\n";
        for listen in [
            "0.0.0.0:50051",
            "192.0.2.1:50051",
            "[::]:50051",
            "[2001:db8::1]:1",
        ] {
            let beyond = format!("grpc_listen = \"{listen}\"\n");
            let err = Config::from_toml(&beyond).expect_err(listen).to_string();
            for key in [
                "feedback_open",
                "feedback_tokens",
                "tls.client_ca_file",
                listen,
            ] {
                assert!(err.contains(key), "{listen}: {err:?} does not name {key:?}");
            }
            // TLS alone does not say who the front ends are.
            assert!(Config::from_toml(&format!("{beyond}{tls}")).is_err());
            for known in [
                "feedback_open = true\n".to_string(),
                "[feedback_tokens]\n\"fe-1\" = \"fe-1-token\"\n".to_string(),
                format!("{tls}client_ca_file = \"fe-ca.crt\"\n"),
            ] {
                let c = Config::from_toml(&format!("{beyond}{known}"));
                assert!(c.is_ok(), "{listen} with {known:?}: {c:?}");
            }
        }
        for loopback in ["127.0.0.1:0", "127.3.4.5:50051", "[::1]:50051"] {
            let c = Config::from_toml(&format!("grpc_listen = \"{loopback}\"\n"));
            assert!(c.is_ok(), "{loopback}: {c:?}");
        }
        // HTTP beyond loopback carries no Feedback.
        assert!(Config::from_toml("http_listen = \"0.0.0.0:8080\"\n").is_ok());
        assert!(Config::from_toml("feedback_open = \"yes\"\n").is_err());
    }

    /// Each bad value is refused, and the message names its key.
    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let cases = [
            ("cycle_secs = 5", "cycle_secs"),
            ("cycle_secs = 31", "cycle_secs"),
            ("etcd = [\"http://127.0.0.1:2379\"]", "node_id"),
            ("etcd = [\"127.0.0.1:2379\"]\nnode_id = \"m1\"", "etcd[0]"),
            (
                "etcd = [\"http://a:1\", \"http://a:1\"]\nnode_id = \"m1\"",
                "etcd[1]",
            ),
            (
                "etcd = [\"https://a:1\"]\nnode_id = \"m1\"",
                "etcd_ca_file",
            ),
            (
                "etcd = [\"https://a:1\", \"http://b:1\"]\nnode_id = \"m1\"\netcd_ca_file = \"ca\"",
                "etcd[1]",
            ),
            (
                "etcd = [\"http://a:1\"]\nnode_id = \"m1\"\netcd_ca_file = \"ca\"",
                "etcd_ca_file",
            ),
            ("etcd_ca_file = \"ca\"", "etcd_ca_file"),
            (
                "etcd = [\"https://a:1\"]\nnode_id = \"m1\"\netcd_ca_file = \"\"",
                "etcd_ca_file",
            ),
            (
                "etcd = [\"https://a:1\"]\nnode_id = \"m1\"\netcd_ca_file = \"ca\"\netcd_cert_file = \"c\"",
                "etcd_key_file",
            ),
            (
                "etcd = [\"https://a:1\"]\nnode_id = \"m1\"\netcd_ca_file = \"ca\"\netcd_key_file = \"k\"",
                "etcd_cert_file",
            ),
            (
                "etcd = [\"http://a:1\"]\nnode_id = \"m1\"\netcd_key_file = \"k\"",
                "etcd_key_file",
            ),
            (
                "[tls]\ncert_file = \"c\"\nkey_file = \"k\"\npeer_ca_file = \"ca\"",
                "tls.peer_ca_file",
            ),
            (
                "etcd = [\"http://a:1\"]\nnode_id = \"m1\"\n[tls]\ncert_file = \"c\"\nkey_file = \"k\"\npeer_cert_file = \"pc\"\npeer_key_file = \"pk\"",
                "tls.peer_ca_file",
            ),
            (
                "etcd = [\"http://a:1\"]\nnode_id = \"m1\"\n[tls]\ncert_file = \"c\"\nkey_file = \"k\"\npeer_ca_file = \"ca\"\npeer_cert_file = \"pc\"",
                "tls.peer_key_file",
            ),
            ("etcd = [\"ftp://a:1\"]\nnode_id = \"m1\"", "etcd[0]"),
            ("etcd = [\"http://a\"]\nnode_id = \"m1\"", "etcd[0]"),
            ("etcd = [\"http://a:0\"]\nnode_id = \"m1\"", "etcd[0]"),
            ("advertise_url = \"http://10.0.0.5\"", "advertise_url"),
            (
                "advertise_url = \"http://10.0.0.5:50051\"\n[tls]\ncert_file = \"c\"\nkey_file = \"k\"",
                "advertise_url",
            ),
            ("advertise_url = \"https://10.0.0.5:50051\"", "advertise_url"),
            ("etcd = [\"http://a:1/v3\"]\nnode_id = \"m1\"", "etcd[0]"),
            ("etcd = [\"http://a:1\"]\nnode_id = \"m 1\"", "node_id"),
            ("etcd_prefix = \"cdnmap\"", "etcd_prefix"),
            ("etcd_prefix = \"/\"", "etcd_prefix"),
            ("advertise_url = \"10.0.0.5:50051\"", "advertise_url"),
            ("maps_kept = 0", "maps_kept"),
            ("ttl_secs = 0", "ttl_secs"),
            ("record_retention_hours = 0", "record_retention_hours"),
            ("record_max_mb = 1", "record_max_mb"),
            ("record_max_mb = 99999999", "record_max_mb"),
            ("grpc_listen = \"127.0.0.1:8080\"", "http_listen"),
            ("grpc_listen = \"not an address\"", "grpc_listen"),
            ("data_dir = \"\"", "data_dir"),
            ("admin_token = \"short\"", "admin_token"),
            ("admin_token = \"has a space\"", "admin_token"),
            ("default_class = \"\"", "default_class"),
            (
                "[[class_rules]]\npattern = \"\"\nclass = \"web\"",
                "class_rules[0]",
            ),
            ("[stickiness]\nmargin = 0.95", "stickiness.margin"),
            ("[stickiness]\nmargin = nan", "stickiness.margin"),
            (
                "[second_chance]\nmode = \"within-lists\"",
                "second_chance.mode",
            ),
            (
                "[second_chance]\nmode = \"sometimes\"",
                "second_chance.mode",
            ),
            (
                "[second_chance]\nmax_beyond_ms = 0",
                "second_chance.max_beyond_ms",
            ),
            (
                "[second_chance]\nmax_beyond_ms = nan",
                "second_chance.max_beyond_ms",
            ),
            ("[demo]\nmap_units = 0", "demo.map_units"),
            ("[demo]\nmap_units = 16777217", "demo.map_units"),
            (
                "[selection.default]\npolicy = \"bounded\"\nc = 1.0",
                "selection.default",
            ),
            (
                "[selection.clusters.x]\npolicy = \"power-of-d\"\nd = 17",
                "selection.clusters.x",
            ),
            ("[selection.default]\npolicy = \"random\"", "random"),
            ("[demo]\nclusters = 0", "demo.clusters"),
            ("[demo]\nheadroom = 0", "demo.headroom"),
            ("[demo]\nheadroom = nan", "demo.headroom"),
            ("[demo]\ncompanion = { web = 0.9 }", "demo.companion.web"),
            ("[n1]\nevery_secs = 100000", "n1.every_secs"),
            ("[n1]\nbudget_secs = 0", "n1.budget_secs"),
            ("[n1]\nexact_top = 51", "n1.exact_top"),
            ("[guard]\nmax_overflow_points = -1", "guard.max_overflow_points"),
            ("[demo]\ncompanion = { web = -0.1 }", "demo.companion.web"),
            ("[mmdb]\nfiles = []", "mmdb.files"),
            ("[health]\nport = 0", "health.port"),
            ("[bypass.web]\ncname = \"a..b\"", "bypass.web"),
            ("[bypass.web]\naddresses = []", "bypass.web"),
            ("[bypass.web]\naddresses = [\"x\"]", "bypass.web"),
            (
                "[bypass.web]\ncname = \"a.b\"\naddresses = [\"192.0.2.1\"]",
                "bypass.web",
            ),
            ("[bypass.web]\ncnam = \"a.b\"", "cnam"),
            ("[health]\nport = 80\ninterval_ms = 5", "health.interval_ms"),
            (
                "[health]\nport = 80\ntimeout_ms = 5000",
                "health.timeout_ms",
            ),
            ("[health]\nport = 80\nfall = 0", "health.fall"),
            ("[health]\nport = 80\nlocal = false", "health.local"),
            (
                "[health]\nport = 80\nmonitors = [\"m1\", \"m1\"]",
                "health.monitors[1]",
            ),
            (
                "[health]\nport = 80\nmonitors = [\"\"]",
                "health.monitors[0]",
            ),
            (
                "[health]\nport = 80\nmonitors = [\"m1\"]\nquorum = 3",
                "health.quorum",
            ),
            ("[health]\nport = 80\nquorum = 0", "health.quorum"),
            ("[rtt]\nhalf_life_secs = 0.5", "rtt.half_life_secs"),
            ("[rtt]\nmax_pairs = 1000000000", "rtt.max_pairs"),
            ("[rtt]\nbogus = 1", "bogus"),
            ("[health]\nport = 80\npath = \"/a b\"", "health.path"),
            (
                "[health]\nport = 80\nexpect_status = 42",
                "health.expect_status",
            ),
            ("[health]\nport = 80\nkind = \"icmp\"", "icmp"),
            (
                "[health]\nport = 80\n[health.clusters.x]\npath = \"x\"",
                "health.clusters.x.path",
            ),
            (
                "[mmdb]\nfiles = [\"a.mmdb\"]\nclusters = 0",
                "mmdb.clusters",
            ),
            (
                "[mmdb]\nfiles = [\"a.mmdb\"]\nv6_fold_len = 0",
                "mmdb.v6_fold_len",
            ),
            ("[mmdb]\nfiles = [\"a.mmdb\"]\nsite = \"x\"", "site"),
            (
                "instance = \"w.json\"\n[mmdb]\nfiles = [\"a.mmdb\"]",
                "mmdb",
            ),
            ("cycle_secs = \"ten\"", "cycle_secs"),
            ("cycles = 10", "cycles"),
            ("[stickiness]\nmargn = 0.1", "margn"),
            ("grpc_max_connections = 0", "grpc_max_connections"),
            ("handshake_timeout_secs = 0", "handshake_timeout_secs"),
            ("idle_timeout_secs = 0", "idle_timeout_secs"),
            ("idle_timeout_secs = 86401", "idle_timeout_secs"),
            ("max_connections_per_source = 0", "max_connections_per_source"),
            ("watch_stall_secs = 0", "watch_stall_secs"),
            ("watch_stall_secs = 3601", "watch_stall_secs"),
            ("watch_max_streams = 0", "watch_max_streams"),
            ("watch_open = false", "watch_open"),
            ("feedback_samples_per_sec = 0", "feedback_samples_per_sec"),
            (
                "feedback_max_demand_ratio = 0.5",
                "feedback_max_demand_ratio",
            ),
            (
                "feedback_max_demand_ratio = nan",
                "feedback_max_demand_ratio",
            ),
            ("[tls]\ncert_file = \"a.crt\"", "key_file"),
            (
                "[tls]\ncert_file = \"a\"\nkey_file = \"b\"\nca = \"c\"",
                "ca",
            ),
            (
                "[feedback_tokens]\n\"fe-1\" = \"short\"",
                "feedback_tokens.\"fe-1\"",
            ),
            (
                "admin_token = \"same-token\"\n[feedback_tokens]\n\"fe-1\" = \"same-token\"",
                "is the Admin token",
            ),
            (
                "[feedback_tokens]\n\"fe-1\" = \"token-one\"\n\"fe-2\" = \"token-one\"",
                "is also the token of \"fe-1\"",
            ),
            ("[feedback_tokens]\n\"fe\\u0000\" = \"token-one\"", "U+0000"),
            (
                "[[class_rules]]\npattern = \"a\"\nclass = \"web\"\nweight = 2",
                "weight",
            ),
        ];
        for (toml, key) in cases {
            let err = Config::from_toml(toml).expect_err(toml);
            let msg = err.to_string();
            assert!(msg.contains(key), "{toml:?}: {msg:?} does not name {key:?}");
        }
    }

    /// A file at `dir/name` holding `text`, readable by its owner only.
    fn secret_file(dir: &std::path::Path, name: &str, text: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join(name);
        std::fs::write(&path, text).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        path
    }

    /// The Admin token from `admin_token_file` or `CDNMAP_ADMIN_TOKEN`, checked then as an
    /// inline one; two sources refused naming both; the front ends' tokens of
    /// `feedback_tokens_file` join `[feedback_tokens]`, a name in both refused; a file's
    /// problem names the key and the file.
    #[test]
    fn secrets_come_from_files_or_the_environment_one_source_each() {
        let dir = tempfile::tempdir().expect("a temporary directory");
        let token = secret_file(dir.path(), "admin", "file-admin-token\n");
        let no_env = |_: &str| None;
        let load = |text: &str, env: &dyn Fn(&str) -> Option<String>| {
            let mut c = Config::from_toml(text)?;
            c.load_secrets(env)?;
            c.validate()?;
            Ok::<Config, ConfigError>(c)
        };
        let c = load(&format!("admin_token_file = {token:?}"), &no_env).expect("a file");
        assert_eq!(c.admin_token.as_deref(), Some("file-admin-token"));
        assert_eq!(c.admin_token_file, None);
        let env = |name: &str| (name == ADMIN_TOKEN_ENV).then(|| "env-admin-token".to_string());
        let c = load("", &env).expect("the environment");
        assert_eq!(c.admin_token.as_deref(), Some("env-admin-token"));
        let e = load("admin_token = \"inline-token\"", &env).unwrap_err();
        assert_eq!(
            e.to_string(),
            "admin_token: the token is given by admin_token and CDNMAP_ADMIN_TOKEN: keep one of them"
        );
        let e = load(&format!("admin_token_file = {token:?}"), &env).unwrap_err();
        assert!(
            e.to_string()
                .contains("by admin_token_file and CDNMAP_ADMIN_TOKEN"),
            "{e}"
        );
        // A token file's content is checked as an inline token is.
        let short = secret_file(dir.path(), "short", "short\n");
        let e = load(&format!("admin_token_file = {short:?}"), &no_env).unwrap_err();
        assert!(
            e.to_string().starts_with("admin_token: must be at least 8"),
            "{e}"
        );
        let empty = secret_file(dir.path(), "empty", "\n");
        let e = load(&format!("admin_token_file = {empty:?}"), &no_env).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "admin_token: admin_token_file {}: is empty",
                empty.display()
            )
        );

        let fronts = secret_file(dir.path(), "fronts", "\"fe-2\" = \"front-end-2-token\"\n");
        let c = load(
            &format!(
                "grpc_listen = \"10.0.0.1:50051\"\nfeedback_tokens_file = {fronts:?}\n\
                 [feedback_tokens]\n\"fe-1\" = \"front-end-1-token\"\n"
            ),
            &no_env,
        )
        .expect("tokens in both");
        assert_eq!(c.feedback_tokens.len(), 2);
        assert_eq!(c.feedback_tokens["fe-2"], "front-end-2-token");
        let twice = secret_file(dir.path(), "twice", "\"fe-1\" = \"front-end-9-token\"\n");
        let e = load(
            &format!(
                "feedback_tokens_file = {twice:?}\n[feedback_tokens]\n\"fe-1\" = \"front-end-1-token\"\n"
            ),
            &no_env,
        )
        .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!(
                "feedback_tokens_file: {}: \"fe-1\" is also in [feedback_tokens]: keep one",
                twice.display()
            )
        );
        // CDNMAP_FEEDBACK_TOKENS: NAME=TOKEN pairs (a token may hold '='), joined to the
        // others; before the values are checked, so `watch_open = false` may rest on them.
        let fronts_env = |pairs: &'static str| {
            move |name: &str| (name == FEEDBACK_TOKENS_ENV).then(|| pairs.to_string())
        };
        let mut c = Config::parse_toml(
            "watch_open = false\n[feedback_tokens]\n\"fe-1\" = \"front-end-1-token\"\n",
        )
        .expect("parse");
        c.load_secrets(&fronts_env(
            "fe-2=front-end-2-token==\n fe-3=front-end-3-token",
        ))
        .expect("pairs");
        c.validate().expect("valid");
        assert_eq!(c.feedback_tokens.len(), 3);
        assert_eq!(c.feedback_tokens["fe-2"], "front-end-2-token==");
        let mut c = Config::parse_toml("watch_open = false").expect("parse");
        c.load_secrets(&fronts_env("fe-9=front-end-9-token"))
            .expect("one pair");
        c.validate()
            .expect("watch_open = false with the environment's tokens");
        for (pairs, error) in [
            (
                "fe-1=front-end-7-token",
                "CDNMAP_FEEDBACK_TOKENS: the environment: \"fe-1\" is also in [feedback_tokens] or feedback_tokens_file: keep one",
            ),
            (
                "fe-2=front-end-2-token just-a-secret-token",
                "CDNMAP_FEEDBACK_TOKENS: pair 2 is not NAME=TOKEN (pairs separated by white space)",
            ),
            (
                "fe-2=front-end-2-token fe-2=front-end-8-token",
                "CDNMAP_FEEDBACK_TOKENS: \"fe-2\" is named twice",
            ),
            (
                "=front-end-2-token",
                "CDNMAP_FEEDBACK_TOKENS: pair 1 is not NAME=TOKEN (pairs separated by white space)",
            ),
        ] {
            let e = load(
                "[feedback_tokens]\n\"fe-1\" = \"front-end-1-token\"\n",
                &fronts_env(pairs),
            )
            .unwrap_err();
            assert_eq!(e.to_string(), error, "{pairs}");
            assert!(!e.to_string().contains("secret-token"), "{e}");
        }
        // A token from the environment is checked as an inline one.
        let e = load("", &fronts_env("fe-2=short")).unwrap_err();
        assert!(
            e.to_string()
                .starts_with("feedback_tokens.\"fe-2\": must be at least 8"),
            "{e}"
        );
        let missing = dir.path().join("missing");
        let e = load(&format!("feedback_tokens_file = {missing:?}"), &no_env).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!(
                "feedback_tokens_file: feedback_tokens_file {}: ",
                missing.display()
            )),
            "{e}"
        );
    }

    /// The example configuration of `deploy/systemd/` parses and is valid (its secrets are
    /// credential files, read at start only).
    #[test]
    fn the_systemd_example_is_valid() {
        let c = Config::from_toml(include_str!("../../deploy/systemd/serve.toml"))
            .expect("deploy/systemd/serve.toml");
        assert!(c.admin_token.is_none() && c.admin_token_file.is_some());
        assert!(c.feedback_tokens_file.is_some());
    }

    /// docs/operations.md's configuration reference lists every key the configuration accepts
    /// and no other. The accepted keys come from the parser itself (serde's "unknown field ...,
    /// expected one of ..." for each table, `cdnmap_tests::config_doc`), not from a list kept
    /// by hand, so a key added to `Config` or any of its tables fails this until it is
    /// documented.
    #[test]
    fn the_operations_reference_lists_every_key_and_no_other() {
        use cdnmap_tests::config_doc::{accepted_keys, assert_same_keys, documented_keys};
        let accepted = accepted_keys(|text| {
            toml::from_str::<Config>(text)
                .map(drop)
                .map_err(|e| e.message().to_string())
        });
        // The walk found the nested tables, maps of tables and arrays of tables.
        for key in [
            "cycle_secs",
            "tls.cert_file",
            "health.clusters.*.port",
            "class_rules[].pattern",
            "feedback_tokens.*",
            "rtt.max_pairs",
        ] {
            assert!(accepted.contains(key), "{key} not found in {accepted:?}");
        }
        let doc = include_str!("../../docs/operations.md");
        let documented = documented_keys(doc, "config-reference");
        assert_same_keys(&documented, &accepted, "docs/operations.md");
    }
}
