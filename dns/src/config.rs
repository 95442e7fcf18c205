//! The DNS front end's configuration: a TOML file (`cdnmap dns --config FILE`), each key
//! overridable on the command line. Unknown keys are refused, every value is checked with its
//! key named, and the defaults serve `cdn.example.` on 127.0.0.1:5353 from a mapper on
//! 127.0.0.1:50051.
//!
//! ```toml
//! mapper = "https://mapper-a.cdn.example:50051,https://mapper-b.cdn.example:50051"
//!                                     # the mappers' gRPC addresses, comma-separated, at most
//!                                     # 16 (default: http://127.0.0.1:50051, plaintext on
//!                                     # loopback); the highest (epoch, version) is followed
//! listen = "127.0.0.1:5353"           # UDP and TCP (port 0: any port free for both)
//! zones = ["cdn.example."]            # authoritative for these (and every name below them)
//! ttl_secs = 20                       # TTL of A/AAAA answers
//! name = "dns-1"                      # the reporter name in demand reports
//! report_secs = 10                    # demand reports: one batch per period
//! nameservers = ["ns1.cdn.example."]  # the apex's NS records (default: ns1.<zone>)
//! hostmaster = "hostmaster.cdn.example."
//! max_udp_payload = 1232              # the largest UDP response; larger ones are truncated
//! tcp_timeout_secs = 10               # idle TCP connections are closed after this
//! udp_threads = 2                     # UDP answering loops, each on its own socket
//!                                     # (SO_REUSEPORT); default: one per core
//! udp_coalesce_us = 50                # under load (queries closer than this), wait this
//!                                     # long between receives to take them in batches
//!                                     # (0: never wait)
//! metrics_listen = "127.0.0.1:9153"   # Prometheus /metrics (absent: none)
//! mapper_ca_file = "mapper-ca.crt"    # https:// mappers: the CA their certificate must chain to
//! cert_file = "dns-1.crt"             # this front end's certificate and key, for a mapper
//! key_file = "dns-1.key"              #   with mutual TLS (its first DNS name is our name there)
//! feedback_token = "a-long-random-token"  # for a mapper with feedback_tokens (sent with
//!                                     #   the reports and WatchMap)
//! # feedback_token_file = "/run/credentials/cdnmap-dns.service/feedback-token"  # or the
//! #                                   #   token in a file, or in CDNMAP_FEEDBACK_TOKEN: one of three
//! # soa_serial = 2026120701           # the SOA serial (default: the map's epoch in seconds)
//! cookie_secret = "e5e973e5a6b2a43f48e7dc849e37bfcf"  # DNS cookies (RFC 7873/9018): one
//!                                     #   secret for the fleet, 32 hex digits (default: a
//!                                     #   random one per process); or cookie_secret_file
//! # cookie_secret_previous = "dd3bdf9344b678b185a6f5cb60fca715"  # still accepted (rotation)
//! rrl_responses_per_sec = 0           # response rate limiting per client prefix and kind
//!                                     #   (0: off); below, BIND's defaults
//! rrl_window_secs = 15                # seconds of responses a prefix may owe
//! rrl_slip = 2                        # every 2nd limited response TC=1 (or BADCOOKIE)
//! rrl_ipv4_prefix = 24                # client prefixes counted together
//! rrl_ipv6_prefix = 56
//! # [[records]]                       # static records: the nameservers' addresses, TXT, CAA,
//! # name = "ns1"                      #   MX, SRV, CNAME (`crate::zonedata`, docs/dns.md's
//! # type = "A"                        #   "Zone data"); reloaded on SIGHUP
//! # data = "192.0.2.53"
//! # [[services]]                      # HTTPS/SVCB records at mapped names, their ipv4hint
//! # name = "*.cdn.example."           #   and ipv6hint the map's answer to the same client
//! # data = "1 . alpn=h3,h2"           #   (`crate::service`); reloaded on SIGHUP
//! # dnstap_file = "/var/log/cdnmap/dns.dnstap"  # dnstap query log (`crate::dnstap`), or
//! # dnstap_socket = "/run/dnstap.sock"  #   to a Frame Streams reader's unix socket
//! # dnstap_sample = 100               #   one query of every 100 (default 1: all)
//! # dnstap_identity = "dns-1"         #   the messages' identity (default: `name`)
//! # dnstap_messages = "both"          #   "queries", "responses" or "both" (default)
//! # dnssec_keys = ["/etc/cdnmap/keys/Kcdn.example.+013+34532"]  # DNSSEC: BIND key files' base
//! #                                   #   paths (.key and .private), algorithms 13 and 15;
//! #                                   #   the zone is the DNSKEY's owner; reloaded on SIGHUP
//! # dnssec_validity_secs = 604800     # an RRSIG's validity (expiration - inception)
//! # dnssec_inception_offset_secs = 3600  # inception at least this far before now
//! # dnssec_cache_entries = 65536      # signatures cached (distinct RRsets x keys x windows)
//! ```
//!
//! **Several mappers.** `mapper` is one URL or a comma-separated list of them (spaces around
//! the commas are allowed; an empty entry, a URL listed twice, and more than [`MAX_MAPPERS`]
//! are refused, each error naming the entry as `mapper[i]`, counted from 0): the replicas of a
//! highly available mapper. The front end follows all of them and answers from the highest
//! map identity (epoch, version) any of them has sent; it sends its demand reports to all.
//! The TLS settings and the token below apply to every mapper.
//!
//! `https://` is TLS and needs `mapper_ca_file`; `http://` is plaintext, and a CA, a
//! certificate or a token given with it is refused (it would cross the network in clear).
//!
//! Port 0 takes a free port; the log's `listening` line names the addresses bound
//! (`dns=` for UDP and TCP, `metrics=`).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use hickory_server::proto::rr::Name;
use serde::Deserialize;

use crate::cookie::{parse_secret, Cookies};
use crate::rrl::RrlConfig;
use crate::service::{ServiceConfig, Services};
use crate::zonedata::{RecordConfig, StaticData};

/// The environment variable the front end's token may come from (instead of
/// `feedback_token` or `feedback_token_file`).
pub const FEEDBACK_TOKEN_ENV: &str = "CDNMAP_FEEDBACK_TOKEN";

/// The TTLs an answer may carry, in seconds (the service's `ttl_secs` takes the same range).
pub use crate::zonedata::TTL_SECS;

/// Why the front end's configuration was refused: which key, and what is wrong with it.
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

/// Most zones one front end serves.
pub const MAX_ZONES: usize = 64;
/// Most NS names at an apex.
pub const MAX_NAMESERVERS: usize = 16;
/// The smallest and largest UDP payloads a response may be limited to.
pub const UDP_PAYLOAD: std::ops::RangeInclusive<u16> = 512..=4096;
/// Most mappers one front end follows (the replicas of one highly available mapper: each is a
/// stream held open and a copy of every demand report).
pub const MAX_MAPPERS: usize = 16;
/// An RRSIG's validity, seconds: an hour to 90 days.
pub const DNSSEC_VALIDITY_SECS: std::ops::RangeInclusive<u32> = 3600..=90 * 86_400;
/// Report periods, seconds.
pub const REPORT_SECS: std::ops::RangeInclusive<u64> = 1..=3600;
/// UDP answering loops (threads, each with its own socket).
pub const UDP_THREADS: std::ops::RangeInclusive<usize> = 1..=64;
/// The UDP loops' receive coalescing, microseconds (0: off); see `udp::serve`.
pub const UDP_COALESCE_US: std::ops::RangeInclusive<u64> = 0..=1000;

#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct DnsConfig {
    pub mapper: String,
    pub listen: SocketAddr,
    pub zones: Vec<String>,
    pub ttl_secs: u32,
    pub name: String,
    pub report_secs: u64,
    pub nameservers: Vec<String>,
    pub hostmaster: Option<String>,
    pub max_udp_payload: u16,
    pub tcp_timeout_secs: u64,
    /// UDP answering loops, each a thread with its own socket (absent: one per core).
    pub udp_threads: Option<usize>,
    /// Under load, how long (µs) a UDP loop waits between receives so that each takes a
    /// batch of queries (0: never waits).
    pub udp_coalesce_us: u64,
    /// Where to serve Prometheus `/metrics` (none when absent).
    pub metrics_listen: Option<SocketAddr>,
    /// The CA an `https://` mapper's certificate must chain to.
    pub mapper_ca_file: Option<PathBuf>,
    /// This front end's certificate chain and key (PEM), presented to the mapper.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
    /// The token of this front end in the mapper's `feedback_tokens`, sent with its reports
    /// and its WatchMap (a mapper with `watch_open = false` needs it to be followed).
    pub feedback_token: Option<String>,
    /// A file holding `feedback_token` (one trailing newline dropped), read at start by
    /// [`DnsConfig::load_secrets`], as [`FEEDBACK_TOKEN_ENV`] is: one of the three.
    pub feedback_token_file: Option<PathBuf>,
    /// The zones' SOA serial (absent: the map's epoch in seconds, the same on every front end
    /// following the same mappers; see `Zones::follow_epoch`).
    pub soa_serial: Option<u32>,
    /// Static records beside the map's names: the nameservers' addresses (the glue), TXT,
    /// CAA, MX, SRV, CNAME (`crate::zonedata`).
    pub records: Vec<RecordConfig>,
    /// HTTPS and SVCB records at the map's names, their hints from the map
    /// (`crate::service`).
    pub services: Vec<ServiceConfig>,
    /// The server cookies' secret, 32 hex digits, the same on every front end of a fleet
    /// (`crate::cookie`; absent, and no file: a random one for this process).
    pub cookie_secret: Option<String>,
    /// A file holding `cookie_secret`, read at start and on SIGHUP.
    pub cookie_secret_file: Option<PathBuf>,
    /// The secret before `cookie_secret`: cookies it made stay valid (a rotation), none is
    /// made with it.
    pub cookie_secret_previous: Option<String>,
    /// Response rate limiting (`crate::rrl`): responses a second per client prefix and kind
    /// (0: off).
    pub rrl_responses_per_sec: u32,
    /// Seconds of responses a limited prefix may owe.
    pub rrl_window_secs: u32,
    /// Every this many limited responses one is sent truncated (or BADCOOKIE); 0: none.
    pub rrl_slip: u32,
    /// The client prefixes counted together.
    pub rrl_ipv4_prefix: u8,
    pub rrl_ipv6_prefix: u8,
    /// dnstap (`crate::dnstap`): the file the queries and responses are logged to, or the
    /// unix socket of a Frame Streams reader; one query of `dnstap_sample`; the messages'
    /// identity (absent: `name`); which messages (absent: both).
    pub dnstap_file: Option<PathBuf>,
    pub dnstap_socket: Option<PathBuf>,
    pub dnstap_sample: Option<u32>,
    pub dnstap_identity: Option<String>,
    pub dnstap_messages: Option<Messages>,
    /// DNSSEC: the base paths of BIND key files (`K<zone>+<alg>+<tag>`, `.key` and
    /// `.private`), the zone each signs taken from its DNSKEY's owner (`crate::dnssec`).
    pub dnssec_keys: Vec<PathBuf>,
    /// An RRSIG's expiration minus its inception, seconds.
    pub dnssec_validity_secs: u32,
    /// How far before now an RRSIG's inception is at the least, seconds.
    pub dnssec_inception_offset_secs: u32,
    /// Signatures the signature cache holds at most.
    pub dnssec_cache_entries: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        DnsConfig {
            mapper: "http://127.0.0.1:50051".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 5353)),
            zones: vec!["cdn.example.".into()],
            ttl_secs: 20,
            name: "cdnmap-dns".into(),
            report_secs: 10,
            nameservers: Vec::new(),
            hostmaster: None,
            max_udp_payload: 1232,
            tcp_timeout_secs: 10,
            udp_threads: None,
            udp_coalesce_us: 50,
            metrics_listen: None,
            mapper_ca_file: None,
            cert_file: None,
            key_file: None,
            feedback_token: None,
            feedback_token_file: None,
            soa_serial: None,
            records: Vec::new(),
            services: Vec::new(),
            cookie_secret: None,
            cookie_secret_file: None,
            cookie_secret_previous: None,
            rrl_responses_per_sec: RrlConfig::default().responses_per_sec,
            rrl_window_secs: RrlConfig::default().window_secs,
            rrl_slip: RrlConfig::default().slip,
            rrl_ipv4_prefix: RrlConfig::default().ipv4_prefix,
            rrl_ipv6_prefix: RrlConfig::default().ipv6_prefix,
            dnstap_file: None,
            dnstap_socket: None,
            dnstap_sample: None,
            dnstap_identity: None,
            dnstap_messages: None,
            dnssec_keys: Vec::new(),
            dnssec_validity_secs: 7 * 86_400,
            dnssec_inception_offset_secs: 3600,
            dnssec_cache_entries: 65_536,
        }
    }
}

/// A zone as the front end serves it.
pub use crate::zonedata::ZoneConfig;

/// A domain name from the config, fully qualified.
pub fn fqdn(key: &str, text: &str) -> Result<Name, ConfigError> {
    let mut name = Name::from_ascii(text)
        .map_err(|e| invalid(key, format!("{text:?} is not a domain name: {e}")))?;
    if text.is_empty() || name.is_root() {
        return Err(invalid(
            key,
            format!("{text:?} is not a domain name below the root"),
        ));
    }
    name.set_fqdn(true);
    Ok(name.to_lowercase())
}

impl DnsConfig {
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        let config = DnsConfig::parse_toml(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Parses a TOML document (unknown keys refused) without checking the values: for a
    /// caller that overrides some first (the command line), then calls [`Self::validate`].
    pub fn parse_toml(text: &str) -> Result<Self, ConfigError> {
        Ok(toml::from_str(text)?)
    }

    /// Reads the token kept outside the configuration, from `feedback_token_file` or the
    /// environment variable [`FEEDBACK_TOKEN_ENV`] (read through `env`): at most one of them
    /// and `feedback_token`. The file's key is emptied (its token is now `feedback_token`), so
    /// [`Self::validate`] checks the token as if written inline. Returns warnings for the log
    /// (a file others may read); an error names the key, the variable and the file.
    pub fn load_secrets(
        &mut self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Vec<String>, ConfigError> {
        let from_env = env(FEEDBACK_TOKEN_ENV);
        let file = self.feedback_token_file.take();
        let token = cdnmap_proto::secret::token(cdnmap_proto::secret::Sources {
            inline: self
                .feedback_token
                .as_deref()
                .map(|t| ("feedback_token", t)),
            file: file.as_deref().map(|p| ("feedback_token_file", p)),
            env: from_env.as_deref().map(|v| (FEEDBACK_TOKEN_ENV, v)),
        })
        .map_err(|e| invalid("feedback_token", e))?;
        Ok(match token {
            Some(secret) => {
                self.feedback_token = Some(secret.value);
                secret.warning.into_iter().collect()
            }
            None => Vec::new(),
        })
    }

    /// Checks every value; the error names the key.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.static_data()?;
        self.services()?;
        let mappers = self.mappers();
        if mappers.len() > MAX_MAPPERS {
            return Err(invalid(
                "mapper",
                format!("{} mappers; at most {MAX_MAPPERS}", mappers.len()),
            ));
        }
        for (i, url) in mappers.iter().enumerate() {
            self.validate_mapper(&mappers, i, url)?;
        }
        if self.cert_file.is_some() != self.key_file.is_some() {
            return Err(invalid(
                if self.cert_file.is_some() {
                    "key_file"
                } else {
                    "cert_file"
                },
                "cert_file and key_file go together",
            ));
        }
        if let Some(t) = &self.feedback_token {
            if t.len() < 8 || t.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(invalid(
                    "feedback_token",
                    "must be at least 8 characters, without spaces or control characters",
                ));
            }
        }
        if !TTL_SECS.contains(&self.ttl_secs) {
            return Err(invalid(
                "ttl_secs",
                format!("{} is outside 1..=86400", self.ttl_secs),
            ));
        }
        if self.name.is_empty() || self.name.len() > 253 {
            return Err(invalid("name", "must be 1 to 253 characters"));
        }
        if !REPORT_SECS.contains(&self.report_secs) {
            return Err(invalid(
                "report_secs",
                format!("{} is outside 1..=3600", self.report_secs),
            ));
        }
        if !UDP_PAYLOAD.contains(&self.max_udp_payload) {
            return Err(invalid(
                "max_udp_payload",
                format!("{} is outside 512..=4096", self.max_udp_payload),
            ));
        }
        // Port 0 takes any free port, a different one for each.
        if self.listen.port() != 0 && self.metrics_listen == Some(self.listen) {
            return Err(invalid(
                "metrics_listen",
                format!("{} is also listen", self.listen),
            ));
        }
        if !(1..=3600).contains(&self.tcp_timeout_secs) {
            return Err(invalid(
                "tcp_timeout_secs",
                format!("{} is outside 1..=3600", self.tcp_timeout_secs),
            ));
        }
        if let Some(n) = self.udp_threads.filter(|n| !UDP_THREADS.contains(n)) {
            return Err(invalid(
                "udp_threads",
                format!("{n} is outside {UDP_THREADS:?}"),
            ));
        }
        Settings::from_config(self)?;
        self.validate_dnssec()?;
        if !UDP_COALESCE_US.contains(&self.udp_coalesce_us) {
            return Err(invalid(
                "udp_coalesce_us",
                format!("{} is outside {UDP_COALESCE_US:?}", self.udp_coalesce_us),
            ));
        }
        self.validate_cookies()?;
        self.validate_rrl()
    }

    /// The cookie keys: a secret inline or in a file, not both; the previous one only with a
    /// secret; each 32 hex digits (a file's is checked when it is read, [`Self::cookies`]).
    fn validate_cookies(&self) -> Result<(), ConfigError> {
        if self.cookie_secret.is_some() && self.cookie_secret_file.is_some() {
            return Err(invalid(
                "cookie_secret_file",
                "cookie_secret is given too: keep one of them",
            ));
        }
        let has_secret = self.cookie_secret.is_some() || self.cookie_secret_file.is_some();
        if self.cookie_secret_previous.is_some() && !has_secret {
            return Err(invalid(
                "cookie_secret_previous",
                "is given without cookie_secret or cookie_secret_file (the secret that replaced it)",
            ));
        }
        for (key, value) in [
            ("cookie_secret", &self.cookie_secret),
            ("cookie_secret_previous", &self.cookie_secret_previous),
        ] {
            if let Some(text) = value {
                parse_secret(text).map_err(|e| invalid(key, e))?;
            }
        }
        Ok(())
    }

    /// The `rrl_*` keys within their bounds (`crate::rrl`).
    fn validate_rrl(&self) -> Result<(), ConfigError> {
        use crate::rrl::{IPV4_PREFIX, IPV6_PREFIX, RESPONSES_PER_SEC, SLIP, WINDOW_SECS};
        let bounded = [
            (
                "rrl_responses_per_sec",
                self.rrl_responses_per_sec,
                RESPONSES_PER_SEC,
            ),
            ("rrl_window_secs", self.rrl_window_secs, WINDOW_SECS),
            ("rrl_slip", self.rrl_slip, SLIP),
            (
                "rrl_ipv4_prefix",
                u32::from(self.rrl_ipv4_prefix),
                u32::from(*IPV4_PREFIX.start())..=u32::from(*IPV4_PREFIX.end()),
            ),
            (
                "rrl_ipv6_prefix",
                u32::from(self.rrl_ipv6_prefix),
                u32::from(*IPV6_PREFIX.start())..=u32::from(*IPV6_PREFIX.end()),
            ),
        ];
        for (key, value, range) in bounded {
            if !range.contains(&value) {
                return Err(invalid(key, format!("{value} is outside {range:?}")));
            }
        }
        Ok(())
    }

    /// The DNSSEC settings' bounds (the key files are read by [`Self::dnssec_keyset`]).
    fn validate_dnssec(&self) -> Result<(), ConfigError> {
        if self.dnssec_keys.len() > crate::dnssec::keys::MAX_KEYS {
            return Err(invalid(
                "dnssec_keys",
                format!(
                    "{} keys; at most {}",
                    self.dnssec_keys.len(),
                    crate::dnssec::keys::MAX_KEYS
                ),
            ));
        }
        if !DNSSEC_VALIDITY_SECS.contains(&self.dnssec_validity_secs) {
            return Err(invalid(
                "dnssec_validity_secs",
                format!(
                    "{} is outside {DNSSEC_VALIDITY_SECS:?}",
                    self.dnssec_validity_secs
                ),
            ));
        }
        if self.dnssec_inception_offset_secs >= self.dnssec_validity_secs / 2 {
            return Err(invalid(
                "dnssec_inception_offset_secs",
                format!(
                    "{} must be below half of dnssec_validity_secs ({})",
                    self.dnssec_inception_offset_secs, self.dnssec_validity_secs
                ),
            ));
        }
        let cache = crate::dnssec::cache::CACHE_ENTRIES;
        if !cache.contains(&self.dnssec_cache_entries) {
            return Err(invalid(
                "dnssec_cache_entries",
                format!("{} is outside {cache:?}", self.dnssec_cache_entries),
            ));
        }
        Ok(())
    }

    /// The server cookies' secrets: `cookie_secret` (or the file of `cookie_secret_file`, read
    /// now) and `cookie_secret_previous`; `None` when no secret is configured (a random one
    /// then). The error names the key and the file, never the secret.
    pub fn cookies(&self) -> Result<Option<Cookies>, ConfigError> {
        let current = match (&self.cookie_secret, &self.cookie_secret_file) {
            (Some(text), _) => parse_secret(text).map_err(|e| invalid("cookie_secret", e))?,
            (None, Some(path)) => {
                let text = std::fs::read_to_string(path).map_err(|e| {
                    invalid("cookie_secret_file", format!("{}: {e}", path.display()))
                })?;
                parse_secret(&text).map_err(|e| {
                    invalid("cookie_secret_file", format!("{}: {e}", path.display()))
                })?
            }
            (None, None) => return Ok(None),
        };
        let previous = self
            .cookie_secret_previous
            .as_deref()
            .map(|t| parse_secret(t).map_err(|e| invalid("cookie_secret_previous", e)))
            .transpose()?;
        Ok(Some(Cookies::new(current, previous)))
    }

    /// The response rate limits.
    pub fn rrl(&self) -> RrlConfig {
        RrlConfig {
            responses_per_sec: self.rrl_responses_per_sec,
            window_secs: self.rrl_window_secs,
            slip: self.rrl_slip,
            ipv4_prefix: self.rrl_ipv4_prefix,
            ipv6_prefix: self.rrl_ipv6_prefix,
        }
    }

    /// The DNSSEC keys of `dnssec_keys`, read now (`None` without any); an error names the
    /// entry (`dnssec_keys[i]`) and the file.
    pub fn dnssec_keyset(&self) -> Result<Option<crate::dnssec::KeySet>, ConfigError> {
        if self.dnssec_keys.is_empty() {
            return Ok(None);
        }
        crate::dnssec::KeySet::load(&self.dnssec_keys, &self.zones()?)
            .map(Some)
            .map_err(|e| ConfigError::Invalid {
                key: e.key,
                problem: e.problem,
            })
    }

    /// The signatures' validity settings.
    pub fn dnssec_validity(&self) -> crate::dnssec::sign::Validity {
        crate::dnssec::sign::Validity {
            validity_secs: self.dnssec_validity_secs,
            inception_offset_secs: self.dnssec_inception_offset_secs,
        }
    }

    /// The mappers' URLs: `mapper` split at its commas, each trimmed (unchecked: see
    /// [`Self::validate`]).
    pub fn mappers(&self) -> Vec<&str> {
        self.mapper.split(',').map(str::trim).collect()
    }

    /// Checks entry `i` (`url`) of `mappers`: the checks of one mapper URL, and of the TLS
    /// settings that go with it; the error names the entry (`mapper[i]`, or `mapper` when it
    /// is the only one).
    fn validate_mapper(&self, mappers: &[&str], i: usize, url: &str) -> Result<(), ConfigError> {
        let entry = if mappers.len() == 1 {
            "mapper".to_string()
        } else {
            format!("mapper[{i}]")
        };
        if url.is_empty() {
            return Err(invalid(
                &entry,
                format!("an empty entry in {:?} (a comma too many?)", self.mapper),
            ));
        }
        if mappers[..i].contains(&url) {
            return Err(invalid(&entry, format!("{url:?} is listed twice")));
        }
        if !url.starts_with("http://") && !url.starts_with("https://") {
            return Err(invalid(
                &entry,
                format!("{url:?} must be a URL such as http://127.0.0.1:50051"),
            ));
        }
        tonic::transport::Endpoint::from_shared(url.to_string())
            .map_err(|e| invalid(&entry, format!("{url:?}: {e}")))?;
        // The mapper named in the TLS keys' errors: the URL alone when it is the only one.
        let named = if mappers.len() == 1 {
            format!("{url:?}")
        } else {
            format!("{url:?} ({entry})")
        };
        let https = url.starts_with("https://");
        if https && self.mapper_ca_file.is_none() {
            return Err(invalid(
                "mapper_ca_file",
                format!("{named} is https://: name the CA its certificate must chain to"),
            ));
        }
        if !https {
            for (key, given) in [
                ("mapper_ca_file", self.mapper_ca_file.is_some()),
                ("cert_file", self.cert_file.is_some()),
                ("key_file", self.key_file.is_some()),
                (
                    "feedback_token",
                    (self.feedback_token.is_some() || self.feedback_token_file.is_some())
                        && !is_loopback(url),
                ),
            ] {
                if given {
                    return Err(invalid(
                        key,
                        format!(
                            "is given but the mapper {named} is plaintext (http://, beyond loopback for a token): use https://"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether every mapper's URL names a loopback address (or `localhost`).
    pub fn mapper_is_loopback(&self) -> bool {
        self.mappers().into_iter().all(is_loopback)
    }

    /// The static records (`records`) of the zones, validated (`crate::zonedata`).
    pub fn static_data(&self) -> Result<StaticData, ConfigError> {
        StaticData::build(&self.zones()?, &self.records).map_err(|e| ConfigError::Invalid {
            key: e.key,
            problem: e.problem,
        })
    }

    /// The service bindings (`services`) of the zones, validated (`crate::service`).
    pub fn services(&self) -> Result<Services, ConfigError> {
        Services::build(&self.zones()?, &self.services).map_err(|e| ConfigError::Invalid {
            key: e.key,
            problem: e.problem,
        })
    }

    /// The zones with their NS names and hostmaster, validated.
    pub fn zones(&self) -> Result<Vec<ZoneConfig>, ConfigError> {
        if self.zones.is_empty() || self.zones.len() > MAX_ZONES {
            return Err(invalid(
                "zones",
                format!("{} zones; 1 to {MAX_ZONES} are allowed", self.zones.len()),
            ));
        }
        if self.nameservers.len() > MAX_NAMESERVERS {
            return Err(invalid(
                "nameservers",
                format!(
                    "{} names; at most {MAX_NAMESERVERS}",
                    self.nameservers.len()
                ),
            ));
        }
        let nameservers = self
            .nameservers
            .iter()
            .enumerate()
            .map(|(i, n)| fqdn(&format!("nameservers[{i}]"), n))
            .collect::<Result<Vec<_>, _>>()?;
        let hostmaster = self
            .hostmaster
            .as_deref()
            .map(|h| fqdn("hostmaster", h))
            .transpose()?;
        let mut out: Vec<ZoneConfig> = Vec::with_capacity(self.zones.len());
        for (i, z) in self.zones.iter().enumerate() {
            let key = format!("zones[{i}]");
            let apex = fqdn(&key, z)?;
            if out.iter().any(|o| o.apex == apex) {
                return Err(invalid(&key, format!("{z:?} is listed twice")));
            }
            let ns = |label: &str| -> Result<Name, ConfigError> {
                Name::from_ascii(label)
                    .and_then(|l| l.append_domain(&apex))
                    .map_err(|e| invalid(&key, format!("{z:?}: {e}")))
            };
            out.push(ZoneConfig {
                nameservers: if nameservers.is_empty() {
                    vec![ns("ns1")?]
                } else {
                    nameservers.clone()
                },
                hostmaster: match &hostmaster {
                    Some(h) => h.clone(),
                    None => ns("hostmaster")?,
                },
                apex,
            });
        }
        Ok(out)
    }
}

/// Whether `url` names a loopback address (or `localhost`).
pub use cdnmap_proto::client_tls::is_loopback;

/// The TOML example in a module's doc comment (between "//! ```toml" and "//! ```"), so a
/// test can check that the documented example is valid (this module's and the service's).
#[doc(hidden)]
pub fn doc_example(source: &str) -> String {
    source
        .lines()
        .skip_while(|l| !l.starts_with("//! ```toml"))
        .skip(1)
        .take_while(|l| !l.starts_with("//! ```"))
        .map(|l| l.trim_start_matches("//!").trim_start_matches(' '))
        .collect::<Vec<_>>()
        .join("\n")
}

// dnstap's settings (`crate::dnstap` writes what they say).

/// `dnstap_sample`'s range.
pub const DNSTAP_SAMPLE: std::ops::RangeInclusive<u32> = 1..=1_000_000;
/// `dnstap_identity`'s length in bytes.
pub const DNSTAP_IDENTITY_BYTES: std::ops::RangeInclusive<usize> = 1..=255;
/// The longest unix socket path (`sun_path` holds 108 bytes with its final NUL).
pub const DNSTAP_MAX_SOCKET_PATH: usize = 107;

/// What is logged of each sampled query (`dnstap_messages`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Messages {
    /// `AUTH_QUERY` only.
    Queries,
    /// `AUTH_RESPONSE` only.
    Responses,
    /// Both.
    #[default]
    Both,
}

impl Messages {
    pub(crate) fn queries(self) -> bool {
        self != Messages::Responses
    }
    pub(crate) fn responses(self) -> bool {
        self != Messages::Queries
    }
}

/// Where the frames go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sink {
    /// A file, created (or emptied) at start.
    File(PathBuf),
    /// A unix socket a Frame Streams reader listens on.
    Socket(PathBuf),
}

/// dnstap's settings, from the configuration's `dnstap_*` keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    pub sink: Sink,
    /// One query of this many is logged.
    pub sample: u32,
    /// The `identity` of every message: `dnstap_identity`, else the front end's `name`.
    pub identity: String,
    pub messages: Messages,
}

impl Settings {
    /// dnstap's settings in `config`: `None` without `dnstap_file` or `dnstap_socket`. The
    /// other `dnstap_*` keys are refused without one of them (they would do nothing); an error
    /// names its key.
    pub fn from_config(config: &DnsConfig) -> Result<Option<Settings>, ConfigError> {
        let sink = match (&config.dnstap_file, &config.dnstap_socket) {
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "dnstap_socket",
                    "is given with dnstap_file: dnstap goes to one of them",
                ))
            }
            (Some(f), None) => Sink::File(checked_path("dnstap_file", f)?),
            (None, Some(s)) => {
                let s = checked_path("dnstap_socket", s)?;
                if s.as_os_str().len() > DNSTAP_MAX_SOCKET_PATH {
                    return Err(invalid(
                        "dnstap_socket",
                        format!(
                            "{}: a unix socket path is at most {DNSTAP_MAX_SOCKET_PATH} bytes",
                            s.display()
                        ),
                    ));
                }
                Sink::Socket(s)
            }
            (None, None) => {
                for (key, given) in [
                    ("dnstap_sample", config.dnstap_sample.is_some()),
                    ("dnstap_identity", config.dnstap_identity.is_some()),
                    ("dnstap_messages", config.dnstap_messages.is_some()),
                ] {
                    if given {
                        return Err(invalid(
                            key,
                            "is given without dnstap_file or dnstap_socket: nothing is logged",
                        ));
                    }
                }
                return Ok(None);
            }
        };
        let sample = config.dnstap_sample.unwrap_or(1);
        if !DNSTAP_SAMPLE.contains(&sample) {
            return Err(invalid(
                "dnstap_sample",
                format!("{sample} is outside {DNSTAP_SAMPLE:?}"),
            ));
        }
        let identity = config
            .dnstap_identity
            .clone()
            .unwrap_or_else(|| config.name.clone());
        if !DNSTAP_IDENTITY_BYTES.contains(&identity.len()) {
            return Err(invalid(
                "dnstap_identity",
                format!("must be {DNSTAP_IDENTITY_BYTES:?} bytes"),
            ));
        }
        Ok(Some(Settings {
            sink,
            sample,
            identity,
            messages: config.dnstap_messages.unwrap_or_default(),
        }))
    }
}

fn checked_path(key: &str, path: &Path) -> Result<PathBuf, ConfigError> {
    if path.as_os_str().is_empty() {
        return Err(invalid(key, "is empty: name a path"));
    }
    Ok(path.to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_documented_example_parses() {
        let doc = doc_example(include_str!("config.rs"));
        let c = DnsConfig::from_toml(&doc).expect("the module doc's example is valid");
        assert_eq!(c.name, "dns-1");
        let zones = c.zones().expect("zones");
        assert_eq!(zones[0].apex.to_ascii(), "cdn.example.");
        assert_eq!(zones[0].nameservers[0].to_ascii(), "ns1.cdn.example.");
        assert_eq!(
            DnsConfig::default().validate().map_err(|e| e.to_string()),
            Ok(())
        );
    }

    #[test]
    fn bad_values_are_refused_naming_the_key() {
        let cases = [
            ("zones = []", "zones"),
            ("zones = [\"a..b\"]", "zones[0]"),
            ("zones = [\".\"]", "zones[0]"),
            ("zones = [\"a.\", \"A\"]", "zones[1]"),
            ("mapper = \"127.0.0.1:50051\"", "mapper"),
            ("ttl_secs = 0", "ttl_secs"),
            ("report_secs = 0", "report_secs"),
            ("max_udp_payload = 100", "max_udp_payload"),
            ("udp_threads = 0", "udp_threads"),
            ("udp_threads = 65", "udp_threads"),
            ("udp_coalesce_us = 1001", "udp_coalesce_us"),
            ("udp_coalesce_us = -1", "udp_coalesce_us"),
            ("nameservers = [\"\"]", "nameservers[0]"),
            ("listen = \"nowhere\"", "listen"),
            ("zone = \"x.\"", "zone"),
            ("metrics_listen = \"127.0.0.1:5353\"", "metrics_listen"),
            ("cookie_secret = \"00\"", "cookie_secret"),
            ("cookie_secret_previous = \"e5e973e5a6b2a43f48e7dc849e37bfcf\"", "cookie_secret_previous"),
            (
                "cookie_secret = \"e5e973e5a6b2a43f48e7dc849e37bfcf\"\ncookie_secret_previous = \"xx\"",
                "cookie_secret_previous",
            ),
            (
                "cookie_secret = \"e5e973e5a6b2a43f48e7dc849e37bfcf\"\ncookie_secret_file = \"s\"",
                "cookie_secret_file",
            ),
            ("rrl_responses_per_sec = 100001", "rrl_responses_per_sec"),
            ("rrl_window_secs = 0", "rrl_window_secs"),
            ("rrl_slip = 11", "rrl_slip"),
            ("rrl_ipv4_prefix = 33", "rrl_ipv4_prefix"),
            ("rrl_ipv6_prefix = 129", "rrl_ipv6_prefix"),
            // TLS: https:// needs the CA; a CA or certificate with http:// is refused, and a
            // token over plaintext beyond loopback.
            ("mapper = \"https://m.example:1\"", "mapper_ca_file"),
            ("mapper_ca_file = \"ca.crt\"", "mapper_ca_file"),
            ("cert_file = \"fe.crt\"", "cert_file"),
            (
                "mapper = \"http://10.0.0.1:1\"\nfeedback_token = \"abcdefghij\"",
                "feedback_token",
            ),
            (
                "mapper = \"https://m:1\"\nmapper_ca_file = \"ca\"\ncert_file = \"a\"",
                "key_file",
            ),
            (
                "mapper = \"https://m:1\"\nmapper_ca_file = \"ca\"\nfeedback_token = \"a b\"",
                "feedback_token",
            ),
        ];
        for (text, key) in cases {
            let e = DnsConfig::from_toml(text).expect_err(text).to_string();
            assert!(e.contains(key), "{text}: {e}");
        }
        // A token to a mapper on loopback may go in plaintext.
        for ok in [
            "feedback_token = \"abcdefghij\"",
            "mapper = \"http://[::1]:1\"\nfeedback_token = \"abcdefghij\"",
            "mapper = \"http://localhost:1\"\nfeedback_token = \"abcdefghij\"",
        ] {
            if let Err(e) = DnsConfig::from_toml(ok) {
                panic!("{ok}: {e}");
            }
        }
        // Port 0 for both is two free ports, not one address twice.
        let any = "listen = \"127.0.0.1:0\"\nmetrics_listen = \"127.0.0.1:0\"";
        if let Err(e) = DnsConfig::from_toml(any) {
            panic!("{any}: {e}");
        }
    }

    /// A list of mappers: each entry checked as one mapper is, the error naming the entry by
    /// its position; an empty entry, one listed twice and more than [`MAX_MAPPERS`] refused.
    #[test]
    fn a_list_of_mappers_is_checked_entry_by_entry() {
        let ok = DnsConfig::from_toml(
            "mapper = \"http://127.0.0.1:50051, http://[::1]:50052,http://localhost:3\"",
        )
        .expect("three mappers");
        assert_eq!(
            ok.mappers(),
            [
                "http://127.0.0.1:50051",
                "http://[::1]:50052",
                "http://localhost:3"
            ]
        );
        assert!(ok.mapper_is_loopback());
        let sixteen: Vec<String> = (0..MAX_MAPPERS)
            .map(|i| format!("http://127.0.0.1:{}", 50_000 + i))
            .collect();
        let config = DnsConfig {
            mapper: sixteen.join(","),
            ..DnsConfig::default()
        };
        assert_eq!(config.validate().map_err(|e| e.to_string()), Ok(()));
        let seventeen = DnsConfig {
            mapper: format!("{},http://127.0.0.1:1", sixteen.join(",")),
            ..DnsConfig::default()
        };
        let cases = [
            (
                "http://a:1,ftp://b:2",
                "mapper[1]: \"ftp://b:2\" must be a URL such as http://127.0.0.1:50051",
            ),
            (
                "http://a:1,,http://b:2",
                "mapper[1]: an empty entry in \"http://a:1,,http://b:2\" (a comma too many?)",
            ),
            (
                "http://a:1,",
                "mapper[1]: an empty entry in \"http://a:1,\" (a comma too many?)",
            ),
            ("", "mapper: an empty entry in \"\" (a comma too many?)"),
            (
                "http://a:1, http://b:2 ,http://a:1",
                "mapper[2]: \"http://a:1\" is listed twice",
            ),
            (
                "http://a:1,https://b:2",
                "mapper_ca_file: \"https://b:2\" (mapper[1]) is https://: name the CA its \
                 certificate must chain to",
            ),
            (
                "ftp://b:2",
                "mapper: \"ftp://b:2\" must be a URL such as http://127.0.0.1:50051",
            ),
            (&seventeen.mapper, "mapper: 17 mappers; at most 16"),
        ];
        for (mapper, want) in cases {
            let config = DnsConfig {
                mapper: mapper.to_string(),
                ..DnsConfig::default()
            };
            let e = config.validate().expect_err(mapper).to_string();
            assert_eq!(e, want, "{mapper}");
        }
        // The TLS settings go with every mapper: a token for one plaintext mapper beyond
        // loopback is refused naming it, a CA with a plaintext one too.
        let token = DnsConfig {
            mapper: "http://127.0.0.1:1,http://10.0.0.1:2".into(),
            feedback_token: Some("abcdefghij".into()),
            ..DnsConfig::default()
        };
        assert_eq!(
            token.validate().expect_err("a token in clear").to_string(),
            "feedback_token: is given but the mapper \"http://10.0.0.1:2\" (mapper[1]) is \
             plaintext (http://, beyond loopback for a token): use https://"
        );
        assert!(!token.mapper_is_loopback());
        let mixed = DnsConfig {
            mapper: "https://a:1,http://b:2".into(),
            mapper_ca_file: Some("ca.crt".into()),
            ..DnsConfig::default()
        };
        assert_eq!(
            mixed
                .validate()
                .expect_err("a CA for plaintext")
                .to_string(),
            "mapper_ca_file: is given but the mapper \"http://b:2\" (mapper[1]) is \
             plaintext (http://, beyond loopback for a token): use https://"
        );
        let tls = DnsConfig {
            mapper: "https://a:1,https://b:2".into(),
            mapper_ca_file: Some("ca.crt".into()),
            ..DnsConfig::default()
        };
        assert_eq!(tls.validate().map_err(|e| e.to_string()), Ok(()));
    }

    /// docs/dns.md's configuration reference lists every key the front end's configuration
    /// accepts and no other, the accepted keys found by asking the parser
    /// (`cdnmap_tests::config_doc`).
    #[test]
    fn the_dns_reference_lists_every_key_and_no_other() {
        use cdnmap_tests::config_doc::{accepted_keys, assert_same_keys, documented_keys};
        let accepted = accepted_keys(|text| {
            DnsConfig::parse_toml(text).map(drop).map_err(|e| match e {
                ConfigError::Toml(e) => e.message().to_string(),
                other => other.to_string(),
            })
        });
        assert!(accepted.contains("udp_coalesce_us"), "{accepted:?}");
        let doc = include_str!("../../docs/dns.md");
        let documented = documented_keys(doc, "dns-config-reference");
        assert_same_keys(&documented, &accepted, "docs/dns.md");
    }

    /// The front end's token from `feedback_token_file` or `CDNMAP_FEEDBACK_TOKEN`, checked
    /// then as an inline one (a plaintext mapper beyond loopback refuses it); two sources
    /// refused naming both.
    #[test]
    fn the_token_comes_from_a_file_or_the_environment_one_source_each() {
        let path = std::env::temp_dir().join(format!("cdnmap-dns-token-{}", std::process::id()));
        std::fs::write(&path, "front-end-token\n").expect("write");
        let no_env = |_: &str| None;
        let env = |n: &str| (n == FEEDBACK_TOKEN_ENV).then(|| "env-front-token".to_string());
        let load = |text: &str, env: &dyn Fn(&str) -> Option<String>| {
            let mut c = DnsConfig::parse_toml(text)?;
            c.load_secrets(env)?;
            c.validate()?;
            Ok::<DnsConfig, ConfigError>(c)
        };
        let c = load(&format!("feedback_token_file = {path:?}"), &no_env).expect("a file");
        assert_eq!(c.feedback_token.as_deref(), Some("front-end-token"));
        let c = load("", &env).expect("the environment");
        assert_eq!(c.feedback_token.as_deref(), Some("env-front-token"));
        let e = load("feedback_token = \"inline-token\"", &env).unwrap_err();
        assert_eq!(
            e.to_string(),
            "feedback_token: the token is given by feedback_token and CDNMAP_FEEDBACK_TOKEN: keep one of them"
        );
        let e = load(
            &format!("mapper = \"http://10.0.0.1:1\"\nfeedback_token_file = {path:?}"),
            &no_env,
        )
        .unwrap_err();
        assert!(
            e.to_string().starts_with("feedback_token: is given but"),
            "{e}"
        );
        // Refused before it is read, too (parse, then validate, as `from_toml` does).
        let e = DnsConfig::from_toml(&format!(
            "mapper = \"http://10.0.0.1:1\"\nfeedback_token_file = {path:?}"
        ))
        .unwrap_err();
        assert!(
            e.to_string().starts_with("feedback_token: is given but"),
            "{e}"
        );
        let _ = std::fs::remove_file(&path);
    }

    /// The cookie secret inline or from a file, the previous one beside it; a file that is
    /// missing or holds no secret is refused naming the key and the file, not the secret.
    #[test]
    fn cookie_secrets_come_inline_or_from_a_file() {
        let path = std::env::temp_dir().join(format!("cdnmap-dns-cookie-{}", std::process::id()));
        std::fs::write(&path, "e5e973e5a6b2a43f48e7dc849e37bfcf\n").expect("write");
        let from_file = DnsConfig::from_toml(&format!(
            "cookie_secret_file = {path:?}\ncookie_secret_previous = \"dd3bdf9344b678b185a6f5cb60fca715\""
        ))
        .expect("valid");
        let inline = DnsConfig::from_toml("cookie_secret = \"e5e973e5a6b2a43f48e7dc849e37bfcf\"")
            .expect("valid");
        let client: std::net::IpAddr = "198.51.100.100".parse().expect("an address");
        let option = [0x24, 0x64, 0xc4, 0xab, 0xcf, 0x10, 0xc9, 0x57];
        let made = |c: &DnsConfig| match c
            .cookies()
            .expect("read")
            .expect("a secret")
            .check(&option, client, 1559731985)
        {
            crate::cookie::Checked::Good { reply, .. } => reply,
            other => panic!("{other:?}"),
        };
        assert_eq!(made(&from_file), made(&inline));
        assert!(DnsConfig::default().cookies().expect("none").is_none());
        std::fs::write(&path, "not a secret").expect("write");
        let e = from_file.cookies().expect_err("a bad file").to_string();
        assert!(
            e.starts_with("cookie_secret_file: ") && e.contains(&path.display().to_string()),
            "{e}"
        );
        let _ = std::fs::remove_file(&path);
        let e = from_file.cookies().expect_err("no file").to_string();
        assert!(e.starts_with("cookie_secret_file: "), "{e}");
    }

    /// The example configuration of `deploy/systemd/` parses and is valid.
    #[test]
    fn the_systemd_example_is_valid() {
        let c = DnsConfig::from_toml(include_str!("../../deploy/systemd/dns.toml"))
            .expect("deploy/systemd/dns.toml");
        assert!(c.feedback_token.is_none() && c.feedback_token_file.is_some());
        assert_eq!(c.listen.port(), 53);
    }
}
