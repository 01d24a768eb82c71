//! The daemon's TOML configuration, parsed then validated as a whole.
//!
//! [`Config::load`] reads a file, [`Config::parse`] takes its text. Parsing is done with
//! serde and `toml` into private "raw" structures that reject unknown keys; a validation
//! step then checks every field and the rules that span several fields and tables, and
//! builds the public [`Config`]. Every error is a [`ConfigError`] that names the file, the
//! line, the key (`class[2].ceil`, `rule[0].dport`, ...), what is wrong and what would be
//! valid, e.g.
//!
//! ```text
//! config/home.toml:14: class[2].ceil: ceil 1mbit is below the class's rate 2mbit; ceil must be at least the rate (or omit it to borrow up to interface lan0's ceil 10mbit)
//! ```
//!
//! # File format
//!
//! ```toml
//! [daemon]                             # optional
//! socket = "/run/shaper/shaper.sock"   # optional: control socket
//! tick = "10ms"                        # optional, 1ms..=1s, default 10ms
//!
//! [[interface]]
//! name = "lan0"          # the device shaped on egress
//! rate = "10mbit"        # link capacity: the root of the interface's class tree
//! default = "guest"      # leaf class of packets that match no rule
//! overhead = 0           # optional: bytes added per packet for framing, -64..=256
//! replace_qdisc = false  # optional: may the daemon replace an existing root qdisc
//! direction = "upload"   # optional: "upload" (the hosts send: a packet's host is its
//!                        # source) or "download" (its destination); default "upload"
//!
//! [[class]]
//! name = "alex"
//! interface = "lan0"     # optional when there is exactly one interface
//! parent = "house"       # optional: another class on the same interface
//! rate = "1.9mbit"       # guaranteed rate; "N%" is a share of the parent's rate
//! ceil = "10mbit"        # optional, default and "N%" base: the parent's ceil
//! prio = 1               # optional, 0..=7, lower is served first, default 0
//! weight = 3             # optional, > 0
//! horizon = "200ms"      # optional, 1ms..=10s, default 200ms
//! aqm = true             # optional: CoDel on the departure delay (ECN marks, else drops)
//! aqm_target = "5ms"     # optional, 100us..=1s, default 5ms
//! aqm_interval = "100ms" # optional, 1ms..=10s and above the target, default 100ms
//! isolation = "host"     # optional: share the class fairly between its "host"s (default),
//!                        # its "flow"s, or not at all ("none")
//!
//! [[rule]]               # first matching rule wins, in file order
//! class = "alex"         # a leaf class
//! src = "192.168.1.110"  # optional: src, dst, proto, sport, dport, mark, dscp
//! ```
//!
//! Rates use tc's spelling (see [`crate::rate`]). A top-level class's parent rate and
//! ceil are its interface's rate. Durations are a number and one of `ns`, `us` (or `µs`),
//! `ms`, `s`.
//!
//! Rule fields: `src`/`dst` are an address (meaning /32 or /128) or a CIDR network without
//! host bits, of the same family when both are given; `proto` is a name (`tcp`, `udp`,
//! `icmp`, `icmpv6`, `sctp`, `gre`, `esp`, ...) or a number 0..=255; `sport`/`dport` are a
//! port (`80` or `"80"`) or an inclusive range (`"3072-4095"`), and need `proto` to be
//! absent, `tcp` or `udp`; `mark` is the packet's fwmark, an integer `0..=0xffff_ffff`;
//! `dscp` is 0..=63 or a name (`cs0`..`cs7`, `af11`..`af43`, `ef`, `le`). A rule applies
//! to the packets leaving its class's interface; a rule with no match field matches every
//! such packet.

pub mod diff;
pub mod edit;

use std::collections::{HashMap, HashSet};
use std::error::Error as StdError;
use std::fmt::{self, Write as _};
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde::de::{self, Deserialize, Deserializer, Visitor};
use toml::Spanned;

use crate::rate::{Decimal, Rate, RateSpec, ScaleError};

/// Most interfaces a configuration may shape (the datapath's interface table size).
pub const MAX_INTERFACES: usize = shaper_common::MAX_INTERFACES as usize;
/// Most classes, across all interfaces (the datapath's class table size).
pub const MAX_CLASSES: usize = shaper_common::MAX_CLASSES as usize;
/// `daemon.tick` when the file does not set it.
pub const DEFAULT_TICK: Duration = Duration::from_millis(10);
/// A class's `horizon` when the file does not set it.
///
/// The horizon bounds the queue a backlogged class builds in `fq`: every packet waits at most
/// this long. 200 ms keeps a TCP flow's queue from growing into seconds of bufferbloat (the
/// 1000-packet FIFO behind an HTB class holds 6 s at 2 mbit/s) while leaving tens of
/// packets of buffer at the lowest rates, and it lets a rate change reach the wire within
/// that time, since packets already queued keep the departure times they were given.
pub const DEFAULT_HORIZON: Duration = Duration::from_millis(200);
/// Valid values of `daemon.tick`.
pub const TICK_RANGE: RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(1);
/// Valid values of a class's `horizon`.
pub const HORIZON_RANGE: RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(10);
/// CoDel's defaults (RFC 8289): target delay and interval.
pub const DEFAULT_AQM: Aqm = Aqm { target: Duration::from_millis(5), interval: Duration::from_millis(100) };
/// Valid values of a class's `aqm_target`.
pub const AQM_TARGET_RANGE: RangeInclusive<Duration> = Duration::from_micros(100)..=Duration::from_secs(1);
/// Valid values of a class's `aqm_interval`.
pub const AQM_INTERVAL_RANGE: RangeInclusive<Duration> = Duration::from_millis(1)..=Duration::from_secs(10);
/// Valid values of an interface's `overhead`, in bytes.
pub const OVERHEAD_RANGE: RangeInclusive<i32> = -64..=256;
/// Highest class `prio` (HTB's 8 priorities, 0 served first).
pub const MAX_PRIO: u8 = 7;

/// Longest interface name (`IFNAMSIZ` less the terminating NUL).
const MAX_IFNAME_LEN: usize = 15;
/// Longest class name.
const MAX_CLASS_NAME_LEN: usize = 64;
/// Longest unix socket path (`sun_path` less the terminating NUL).
const MAX_SOCKET_PATH_LEN: usize = 107;
/// How many names an error message lists before "and N more".
const NAMES_LISTED: usize = 12;

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The file it was read from (as given to [`Config::load`] or [`Config::parse`]).
    pub path: PathBuf,
    /// The text it was parsed from; runtime changes ([`edit`]) are made to it.
    pub text: String,
    /// The `[daemon]` table, or its defaults.
    pub daemon: DaemonSettings,
    /// The `[[interface]]` tables, in file order.
    pub interfaces: Vec<Interface>,
    /// The `[[class]]` tables, in file order, every rate resolved.
    pub classes: Vec<Class>,
    /// The `[[rule]]` tables, in file order (which is their priority: first match wins).
    pub rules: Vec<Rule>,
}

/// Settings of the daemon itself (`[daemon]`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonSettings {
    /// Control socket path (`socket`); `None` leaves the choice to the daemon.
    pub socket: Option<PathBuf>,
    /// Period of the daemon's periodic work (`tick`), within [`TICK_RANGE`];
    /// [`DEFAULT_TICK`] by default.
    pub tick: Duration,
    /// Where the Prometheus endpoint listens (`metrics_listen`, an address and port;
    /// [`DEFAULT_METRICS_LISTEN`] by default, `""` to turn it off).
    pub metrics_listen: Option<std::net::SocketAddr>,
}

/// The Prometheus endpoint's default address (9640 is not taken by a known exporter).
pub const DEFAULT_METRICS_LISTEN: std::net::SocketAddr =
    std::net::SocketAddr::new(std::net::IpAddr::V4(std::net::Ipv4Addr::LOCALHOST), 9640);

impl Default for DaemonSettings {
    fn default() -> DaemonSettings {
        DaemonSettings { socket: None, tick: DEFAULT_TICK, metrics_listen: Some(DEFAULT_METRICS_LISTEN) }
    }
}

/// A shaped interface (`[[interface]]`): the root of a class tree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interface {
    /// Network device name, a valid Linux interface name.
    pub name: String,
    /// Link capacity (`rate`), never zero.
    pub rate: Rate,
    /// Leaf class of this interface that gets unmatched packets (`default`).
    pub default_class: String,
    /// Bytes added to each packet's length for framing, within [`OVERHEAD_RANGE`].
    pub overhead: i32,
    /// Whether the daemon may replace an existing root qdisc (`replace_qdisc`).
    pub replace_qdisc: bool,
    /// Which way the interface carries traffic, and so which address is a packet's host.
    pub direction: Direction,
}

/// Which way an interface carries traffic (`direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// Towards the internet: a packet's host is its source address.
    #[default]
    Upload,
    /// Towards the hosts: a packet's host is its destination address.
    Download,
}

/// How a class shares its rate among what it carries (`isolation`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Isolation {
    /// Fairly between its hosts, whatever their number of connections.
    #[default]
    Host,
    /// Fairly between its flows.
    Flow,
    /// As the senders' congestion control makes it (one queue).
    None,
}

/// A traffic class (`[[class]]`), with its rates resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Class {
    /// Unique name across the whole configuration.
    pub name: String,
    /// Name of the interface the class belongs to.
    pub interface: String,
    /// Parent class on the same interface; `None` for a top-level class.
    pub parent: Option<String>,
    /// Guaranteed rate, never zero; the children's rates add up to at most this.
    pub rate: Rate,
    /// Most the class may use when borrowing: at least `rate`, at most the parent's ceil.
    pub ceil: Rate,
    /// Priority, `0..=MAX_PRIO`, lower is served first (HTB's meaning); 0 by default.
    pub prio: u8,
    /// Relative share when borrowing, if set; never zero.
    pub weight: Option<u32>,
    /// Packets that would leave later than this are dropped, within [`HORIZON_RANGE`].
    pub horizon: Duration,
    /// Active queue management on the class's departure delay; `None` when `aqm = false`.
    pub aqm: Option<Aqm>,
    /// How the class shares its rate among its hosts or flows.
    pub isolation: Isolation,
    /// Line of the class's `[[class]]` header (1-based).
    pub line: usize,
}

/// CoDel's parameters for a class (`aqm_target`, `aqm_interval`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Aqm {
    /// Acceptable standing delay.
    pub target: Duration,
    /// How long the delay may stay above target before congestion signals start.
    pub interval: Duration,
}

/// A classification rule (`[[rule]]`). Fields left `None` match anything.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    /// Position among the rules (0-based); lower wins when several match.
    pub index: usize,
    /// Line of the rule's `[[rule]]` header (1-based).
    pub line: usize,
    /// Leaf class that matching packets go to.
    pub class: String,
    /// Source network (host bits clear).
    pub src: Option<IpNet>,
    /// Destination network (host bits clear; same family as `src` when both are set).
    pub dst: Option<IpNet>,
    /// IP protocol number.
    pub proto: Option<u8>,
    /// Source ports; only with `proto` unset, tcp or udp.
    pub sport: Option<PortRange>,
    /// Destination ports; only with `proto` unset, tcp or udp.
    pub dport: Option<PortRange>,
    /// Packet mark (fwmark).
    pub mark: Option<u32>,
    /// DSCP code point, `0..=63`.
    pub dscp: Option<u8>,
}

/// An inclusive range of ports, `start <= end`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortRange {
    /// First port of the range.
    pub start: u16,
    /// Last port of the range (inclusive).
    pub end: u16,
}

impl PortRange {
    /// Whether `port` is in the range.
    #[must_use]
    pub fn contains(self, port: u16) -> bool {
        (self.start..=self.end).contains(&port)
    }
}

impl fmt::Display for PortRange {
    /// `80` for a single port, `3072-4095` for a range.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.start == self.end {
            write!(f, "{}", self.start)
        } else {
            write!(f, "{}-{}", self.start, self.end)
        }
    }
}

/// Why a configuration could not be loaded. Every variant names the file; all but
/// [`ConfigError::Read`] name the line and, where it is known, the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration file: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML, or does not have the configuration's shape (unknown key,
    /// value of the wrong type).
    #[error("{}:{line}:{column}: {}{message}", .path.display(), KeyPrefix(.key.as_deref()))]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// Key at the error, e.g. `class[1].colour`, when it could be found.
        key: Option<String>,
        /// What is wrong (the parser's message, with a hint where one helps).
        message: String,
        /// The parser's error, which also shows the offending line.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A value, or a combination of values, is invalid.
    #[error("{}:{line}: {key}: {problem}", .path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending value (or of its table's header when the value is
        /// missing).
        line: usize,
        /// Key of the offending value, e.g. `class[2].ceil` or `rule[0].dport`.
        key: String,
        /// What is wrong and what would be valid.
        problem: String,
        /// The underlying parse error, if any (e.g. a rate's or an address's).
        #[source]
        source: Option<Box<dyn StdError + Send + Sync + 'static>>,
    },
}

impl ConfigError {
    /// The configuration file the error is about.
    #[must_use]
    pub fn path(&self) -> &Path {
        match self {
            ConfigError::Read { path, .. } | ConfigError::Syntax { path, .. } | ConfigError::Invalid { path, .. } => {
                path
            }
        }
    }

    /// The 1-based line the error is about, if it is about one.
    #[must_use]
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Syntax { line, .. } | ConfigError::Invalid { line, .. } => Some(*line),
        }
    }

    /// The key the error is about (e.g. `class[2].ceil`), if known.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Syntax { key, .. } => key.as_deref(),
            ConfigError::Invalid { key, .. } => Some(key),
        }
    }
}

/// Prints `"key: "` when there is a key, nothing otherwise.
struct KeyPrefix<'a>(Option<&'a str>);

impl fmt::Display for KeyPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(key) => write!(f, "{key}: "),
            None => Ok(()),
        }
    }
}

impl Config {
    /// Reads, parses and validates the configuration file at `path`.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        Config::parse(&text, path)
    }

    /// Parses and validates configuration `text`; `path` is only used to name the file in
    /// errors and is kept in [`Config::path`].
    pub fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| syntax_error(text, path, e))?;
        let validator = Validator { path, lines: LineIndex::new(text) };
        let mut config = validator.validate(&raw)?;
        text.clone_into(&mut config.text);
        Ok(config)
    }

    /// One line saying the file is valid and what it holds (`shaperd --check`,
    /// `shaperctl check`).
    #[must_use]
    pub fn summary(&self) -> String {
        format!(
            "{}: ok ({} interfaces, {} classes, {} rules)",
            self.path.display(),
            self.interfaces.len(),
            self.classes.len(),
            self.rules.len()
        )
    }

    /// The class called `name`.
    #[must_use]
    pub fn class(&self, name: &str) -> Option<&Class> {
        self.classes.iter().find(|c| c.name == name)
    }

    /// The interface called `name`.
    #[must_use]
    pub fn interface(&self, name: &str) -> Option<&Interface> {
        self.interfaces.iter().find(|i| i.name == name)
    }

    /// Whether `name` is a class without child classes (false for unknown names). Only
    /// leaf classes carry packets: rules and defaults name leaves.
    #[must_use]
    pub fn is_leaf(&self, name: &str) -> bool {
        self.class(name).is_some() && self.children(name).next().is_none()
    }

    /// The child classes of class `name`, in file order.
    pub fn children<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Class> + 'a {
        self.classes.iter().filter(move |c| c.parent.as_deref() == Some(name))
    }

    /// The leaf classes, in file order.
    pub fn leaves(&self) -> impl Iterator<Item = &Class> + '_ {
        let parents: HashSet<&str> = self.classes.iter().filter_map(|c| c.parent.as_deref()).collect();
        self.classes.iter().filter(move |c| !parents.contains(c.name.as_str()))
    }
}

// ---------------------------------------------------------------------------------------
// Raw structures, as serde reads them. Values that need checking beyond their TOML type
// keep their span, so that errors can name their line.

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    daemon: Option<RawDaemon>,
    #[serde(default)]
    interface: Vec<Spanned<RawInterface>>,
    #[serde(default)]
    class: Vec<Spanned<RawClass>>,
    #[serde(default)]
    rule: Vec<Spanned<RawRule>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDaemon {
    socket: Option<Spanned<String>>,
    tick: Option<Spanned<Scalar>>,
    metrics_listen: Option<Spanned<String>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawInterface {
    name: Option<Spanned<String>>,
    rate: Option<Spanned<Scalar>>,
    default: Option<Spanned<String>>,
    overhead: Option<Spanned<Integer>>,
    replace_qdisc: Option<bool>,
    direction: Option<Spanned<String>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClass {
    name: Option<Spanned<String>>,
    interface: Option<Spanned<String>>,
    parent: Option<Spanned<String>>,
    rate: Option<Spanned<Scalar>>,
    ceil: Option<Spanned<Scalar>>,
    prio: Option<Spanned<Integer>>,
    weight: Option<Spanned<Integer>>,
    horizon: Option<Spanned<Scalar>>,
    aqm: Option<Spanned<bool>>,
    aqm_target: Option<Spanned<Scalar>>,
    aqm_interval: Option<Spanned<Scalar>>,
    isolation: Option<Spanned<String>>,
}

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRule {
    class: Option<Spanned<String>>,
    src: Option<Spanned<String>>,
    dst: Option<Spanned<String>>,
    proto: Option<Spanned<Scalar>>,
    sport: Option<Spanned<Scalar>>,
    dport: Option<Spanned<Scalar>>,
    mark: Option<Spanned<Scalar>>,
    dscp: Option<Spanned<Scalar>>,
}

/// A TOML integer or string, for values that may be written either way.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Scalar {
    Int(i64),
    Str(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A TOML integer, for values checked after reading (so that a range error can say what
/// is valid rather than name a Rust type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Integer(i64);

impl<'de> Deserialize<'de> for Integer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Integer, D::Error> {
        struct IntegerVisitor;

        impl Visitor<'_> for IntegerVisitor {
            type Value = Integer;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer (without quotes)")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Integer, E> {
                Ok(Integer(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Integer, E> {
                i64::try_from(v)
                    .map(Integer)
                    .map_err(|source| E::custom(format_args!("integer {v} is too large ({source})")))
            }
        }

        deserializer.deserialize_any(IntegerVisitor)
    }
}

struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer or a string")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        i64::try_from(v)
            .map(Scalar::Int)
            .map_err(|source| E::custom(format_args!("integer {v} is too large ({source})")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Scalar, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

// ---------------------------------------------------------------------------------------
// Positions.

/// Byte offsets of line starts, to turn spans into 1-based lines and columns.
struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    fn new(text: &str) -> LineIndex {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        LineIndex { starts }
    }

    /// 1-based line of byte `offset`.
    fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset)
    }

    /// 1-based line and column (in characters) of byte `offset` of `text`.
    fn line_column(&self, text: &str, offset: usize) -> (usize, usize) {
        let line = self.line(offset);
        let start = self.starts[line - 1];
        let column = text.get(start..offset).map_or(offset - start, |s| s.chars().count());
        (line, column + 1)
    }
}

/// Turns a `toml` error into a [`ConfigError::Syntax`] with the line, column and key.
fn syntax_error(text: &str, path: &Path, error: toml::de::Error) -> ConfigError {
    let offset = error.span().map_or(0, |span| span.start);
    let (line, column) = LineIndex::new(text).line_column(text, offset);
    let key = error.span().and_then(|span| locate_key(text, span.start));
    let mut message = error.message().trim_end().to_owned();
    if let Some(key @ ("interface" | "class" | "rule")) = key.as_deref() {
        if message.starts_with("invalid type: map") {
            let _ = write!(message, "; write [[{key}]] (one table per {key}, in an array), not [{key}]");
        }
    }
    ConfigError::Syntax { path: path.to_owned(), line, column, key, message, source: Box::new(error) }
}

/// The key path (`class[1].prio`) of the value at byte `offset`, found in the document's
/// span tree: within each table, the entry that starts last at or before `offset` holds it
/// (a table header's body follows it; keys and values come in order).
fn locate_key(text: &str, offset: usize) -> Option<String> {
    let document = toml::de::DeTable::parse(text).ok()?;
    let root = toml::de::DeValue::Table(document.into_inner());
    let mut path = String::new();
    let mut value = &root;
    loop {
        match value {
            toml::de::DeValue::Table(table) => {
                let best = table
                    .iter()
                    .filter_map(|(key, value)| {
                        let mut starts = vec![key.span().start, value.span().start];
                        if let toml::de::DeValue::Array(items) = value.get_ref() {
                            starts.extend(items.iter().map(|item| item.span().start));
                        }
                        let anchor = starts.into_iter().filter(|&s| s <= offset).max()?;
                        Some((anchor, key, value))
                    })
                    .max_by_key(|&(anchor, _, _)| anchor);
                let Some((_, key, next)) = best else {
                    break;
                };
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key.get_ref());
                if key.span().contains(&offset) {
                    // The error is about the key itself (e.g. an unknown one).
                    break;
                }
                value = next.get_ref();
            }
            toml::de::DeValue::Array(items) => {
                let Some((index, item)) = items
                    .iter()
                    .enumerate()
                    .filter(|(_, item)| item.span().start <= offset)
                    .max_by_key(|(_, item)| item.span().start)
                else {
                    break;
                };
                let _ = write!(path, "[{index}]");
                value = item.get_ref();
            }
            _ => break,
        }
    }
    (!path.is_empty()).then_some(path)
}

// ---------------------------------------------------------------------------------------
// Validation.

/// What is wrong with a value: a message that says what would be valid, and the parse
/// error behind it, if any.
struct Problem {
    text: String,
    source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl Problem {
    fn new(text: impl Into<String>) -> Problem {
        Problem { text: text.into(), source: None }
    }

    /// A problem whose message is `source`'s, itself kept as the source.
    fn from_error(source: impl StdError + Send + Sync + 'static) -> Problem {
        Problem { text: source.to_string(), source: Some(Box::new(source)) }
    }

    fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Problem {
        self.source = Some(Box::new(source));
        self
    }
}

impl From<String> for Problem {
    fn from(text: String) -> Problem {
        Problem::new(text)
    }
}

impl From<&str> for Problem {
    fn from(text: &str) -> Problem {
        Problem::new(text)
    }
}

/// Why a duration could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ParseDurationError {
    #[error("invalid duration \"{0}\"; expected a number and a unit (ns, us, ms or s), e.g. \"10ms\" or \"1.5s\"")]
    Invalid(String),
    #[error("duration \"{0}\" has no unit; add one of ns, us, ms or s, e.g. \"{0}ms\"")]
    MissingUnit(String),
    #[error("unknown unit \"{unit}\" in duration \"{input}\"; valid units: ns, us (or µs), ms, s")]
    UnknownUnit { input: String, unit: String },
    #[error("duration \"{0}\" is not a whole number of nanoseconds")]
    NotWhole(String),
    #[error("duration \"{0}\" is too long")]
    Overflow(String),
}

/// Parses `"10ms"`, `"1.5s"`, `"250us"`, `"100ns"` exactly.
fn parse_duration(s: &str) -> Result<Duration, ParseDurationError> {
    let text = s.trim();
    let Some((number, unit)) = Decimal::split_prefix(text) else {
        return Err(ParseDurationError::Invalid(s.to_owned()));
    };
    let pow10 = match unit.trim_start() {
        "" => return Err(ParseDurationError::MissingUnit(text.to_owned())),
        "ns" => 0,
        "us" | "µs" => 3,
        "ms" => 6,
        "s" => 9,
        unit => return Err(ParseDurationError::UnknownUnit { input: s.to_owned(), unit: unit.to_owned() }),
    };
    match number.scale(pow10, 0) {
        Ok(nanos) => Ok(Duration::from_nanos(nanos)),
        Err(ScaleError::NotWhole) => Err(ParseDurationError::NotWhole(s.to_owned())),
        Err(ScaleError::Overflow) => Err(ParseDurationError::Overflow(s.to_owned())),
    }
}

/// A duration value within `range`.
fn duration_in(
    value: &Scalar,
    what: &str,
    range: &RangeInclusive<Duration>,
    example: &str,
) -> Result<Duration, Problem> {
    let text = match value {
        Scalar::Str(text) => text,
        Scalar::Int(n) => {
            return Err(Problem::new(format!(
                "{what} {n} has no unit; write it as a string with a unit, e.g. {what} = \"{example}\""
            )))
        }
    };
    let duration = parse_duration(text).map_err(Problem::from_error)?;
    if range.contains(&duration) {
        Ok(duration)
    } else {
        Err(Problem::new(format!(
            "{what} {text:?} is out of range; expected {}..={}",
            fmt_duration(*range.start()),
            fmt_duration(*range.end())
        )))
    }
}

/// A short exact spelling of `d` for messages (`"1ms"`, `"10s"`).
fn fmt_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    for (unit, scale) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if nanos.is_multiple_of(scale) {
            return format!("{}{unit}", nanos / scale);
        }
    }
    format!("{nanos}ns")
}

/// A rate (an absolute one: no percentage) from a string, or an integer of bits/s.
fn parse_rate(value: &Scalar) -> Result<Rate, Problem> {
    match value {
        Scalar::Str(text) => text.parse().map_err(Problem::from_error),
        Scalar::Int(n) => u64::try_from(*n)
            .map(Rate::from_bits_per_sec)
            .map_err(|source| Problem::new(format!("negative rate {n}; expected e.g. \"10mbit\"")).with_source(source)),
    }
}

/// A rate or a percentage, from a string, or an integer of bits/s.
fn parse_rate_spec(value: &Scalar) -> Result<RateSpec, Problem> {
    match value {
        Scalar::Str(text) => text.parse().map_err(Problem::from_error),
        Scalar::Int(_) => parse_rate(value).map(RateSpec::Absolute),
    }
}

/// Checks a Linux interface name the way the kernel's `dev_valid_name` does.
fn check_ifname(name: &str) -> Result<(), Problem> {
    let problem = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_IFNAME_LEN {
        "is longer than 15 bytes"
    } else if name == "." || name == ".." {
        "is not a valid device name"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains(':') {
        "contains ':'"
    } else if name.chars().any(|c| c.is_whitespace() || c == '\0') {
        "contains whitespace"
    } else {
        return Ok(());
    };
    Err(Problem::new(format!(
        "interface name {name:?} {problem}; a Linux interface name is 1 to 15 bytes without '/', ':' or whitespace, e.g. \"eth0\""
    )))
}

/// Checks a class name: 1 to 64 ASCII letters, digits, `-`, `_` and `.`, starting with a
/// letter or a digit (names are used on command lines and in the control protocol).
fn check_class_name(name: &str) -> Result<(), Problem> {
    let valid = !name.is_empty()
        && name.len() <= MAX_CLASS_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err(Problem::new(format!(
            "invalid class name {name:?}; expected 1 to {MAX_CLASS_NAME_LEN} ASCII letters, digits, '-', '_' or '.', starting with a letter or a digit, e.g. \"guest\""
        )))
    }
}

/// `a, b, c` (at most [`NAMES_LISTED`] names, then "and N more"), or "none".
fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    if names.is_empty() {
        return "none".to_owned();
    }
    let mut out = names.iter().take(NAMES_LISTED).copied().collect::<Vec<_>>().join(", ");
    if names.len() > NAMES_LISTED {
        let _ = write!(out, " and {} more", names.len() - NAMES_LISTED);
    }
    out
}

/// A sum of rates for messages: a rate's spelling, or plain bits beyond `u64`.
fn fmt_sum(bits: u128) -> String {
    u64::try_from(bits).map_or_else(|_| format!("{bits}bit"), |bits| Rate::from_bits_per_sec(bits).to_string())
}

/// IP protocols known by name.
const PROTOCOLS: &[(&str, u8)] = &[
    ("icmp", 1),
    ("igmp", 2),
    ("ipip", 4),
    ("tcp", 6),
    ("udp", 17),
    ("ipv6", 41),
    ("rsvp", 46),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("icmpv6", 58),
    ("ipv6-icmp", 58),
    ("ospf", 89),
    ("pim", 103),
    ("vrrp", 112),
    ("l2tp", 115),
    ("sctp", 132),
    ("udplite", 136),
];
const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;

/// A protocol name or number.
fn parse_proto(value: &Scalar) -> Result<u8, Problem> {
    let names = || list(PROTOCOLS.iter().map(|&(name, _)| name));
    match value {
        Scalar::Int(n) => u8::try_from(*n).map_err(|source| {
            Problem::new(format!("protocol number {n} is out of range; expected 0..=255 or a name: {}", names()))
                .with_source(source)
        }),
        Scalar::Str(text) => {
            let text = text.trim();
            if let Some(&(_, number)) = PROTOCOLS.iter().find(|(name, _)| name.eq_ignore_ascii_case(text)) {
                return Ok(number);
            }
            text.parse::<u8>().map_err(|source| {
                Problem::new(format!("unknown protocol {text:?}; expected a number 0..=255 or one of {}", names()))
                    .with_source(source)
            })
        }
    }
}

/// The name of protocol `number`, for messages.
fn proto_name(number: u8) -> String {
    PROTOCOLS.iter().find(|&&(_, n)| n == number).map_or_else(|| number.to_string(), |&(name, _)| name.to_owned())
}

/// DSCP names: class selectors, assured forwarding, expedited forwarding, lower effort.
fn dscp_by_name(name: &str) -> Option<u8> {
    let name = name.to_ascii_lowercase();
    match name.as_str() {
        "ef" => return Some(46),
        "le" => return Some(1),
        _ => {}
    }
    let digits = |s: &str| s.parse::<u8>().ok();
    if let Some(n) = name.strip_prefix("cs").and_then(digits) {
        return (n <= 7 && name.len() == 3).then_some(n * 8);
    }
    if let Some(rest) = name.strip_prefix("af") {
        let mut chars = rest.chars();
        let (Some(class), Some(drop), None) = (chars.next(), chars.next(), chars.next()) else {
            return None;
        };
        let class = u8::try_from(class.to_digit(10)?).ok()?;
        let drop = u8::try_from(drop.to_digit(10)?).ok()?;
        return ((1..=4).contains(&class) && (1..=3).contains(&drop)).then_some(class * 8 + drop * 2);
    }
    None
}

/// A DSCP number or name.
fn parse_dscp(value: &Scalar) -> Result<u8, Problem> {
    let valid = "expected 0..=63 or a name: cs0..cs7, af11..af13, af21..af23, af31..af33, af41..af43, ef, le";
    let number = match value {
        Scalar::Int(n) => *n,
        Scalar::Str(text) => {
            if let Some(dscp) = dscp_by_name(text.trim()) {
                return Ok(dscp);
            }
            match text.trim().parse::<i64>() {
                Ok(n) => n,
                Err(source) => return Err(Problem::new(format!("unknown DSCP {text:?}; {valid}")).with_source(source)),
            }
        }
    };
    match u8::try_from(number) {
        Ok(dscp @ 0..=63) => Ok(dscp),
        _ => Err(Problem::new(format!("DSCP {number} is out of range; {valid}"))),
    }
}

/// One port number written as text.
fn parse_port_text(text: &str, whole: &str) -> Result<u16, Problem> {
    let text = text.trim();
    let invalid = || {
        format!(
            "invalid port range {whole:?}; expected a port (e.g. 80) or an inclusive range \"A-B\" with A <= B, within 0..=65535"
        )
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::new(invalid()));
    }
    let out_of_range = || format!("port {text} is out of range; ports are 0..=65535");
    match text.parse::<u64>() {
        Ok(n) => u16::try_from(n).map_err(|source| Problem::new(out_of_range()).with_source(source)),
        Err(source) => Err(Problem::new(out_of_range()).with_source(source)),
    }
}

/// A port or an inclusive port range.
fn parse_ports(value: &Scalar) -> Result<PortRange, Problem> {
    match value {
        Scalar::Int(n) => u16::try_from(*n).map(|port| PortRange { start: port, end: port }).map_err(|source| {
            Problem::new(format!("port {n} is out of range; ports are 0..=65535")).with_source(source)
        }),
        Scalar::Str(text) => {
            let (start, end) = if let Some((start, end)) = text.split_once('-') {
                (parse_port_text(start, text)?, parse_port_text(end, text)?)
            } else {
                let port = parse_port_text(text, text)?;
                (port, port)
            };
            if start > end {
                return Err(Problem::new(format!(
                    "port range {text:?} is reversed; the start must not be above the end: \"{end}-{start}\""
                )));
            }
            Ok(PortRange { start, end })
        }
    }
}

/// A packet mark: a non-negative integer that fits in 32 bits.
fn parse_mark(value: &Scalar) -> Result<u32, Problem> {
    match value {
        Scalar::Int(n) => u32::try_from(*n).map_err(|source| {
            Problem::new(format!("mark {n} is out of range; expected an integer 0..=4294967295 (0xffffffff)"))
                .with_source(source)
        }),
        Scalar::Str(text) => Err(Problem::new(format!(
            "mark {text:?} is a string; write the mark as a TOML integer, e.g. mark = 16 or mark = 0x10"
        ))),
    }
}

/// A network: an address (a /32 or /128) or a CIDR network with its host bits clear.
fn parse_net(text: &str) -> Result<IpNet, Problem> {
    let text = text.trim();
    let examples = "e.g. \"192.168.1.0/24\", \"192.168.1.110\" or \"fd00:1::/64\"";
    if text.contains('/') {
        let net: IpNet = text.parse().map_err(|source| {
            Problem::new(format!("{text:?} is not a CIDR network; expected {examples}")).with_source(source)
        })?;
        if net.trunc() != net {
            return Err(Problem::new(format!(
                "{text:?} has host bits set; did you mean \"{}\" (the network), or \"{}\" (the single address)?",
                net.trunc(),
                IpNet::from(net.addr())
            )));
        }
        Ok(net)
    } else {
        text.parse::<IpAddr>().map(IpNet::from).map_err(|source| {
            Problem::new(format!("{text:?} is not an IP address or a CIDR network; expected {examples}"))
                .with_source(source)
        })
    }
}

/// Checks that a rule's `class` names a leaf class.
fn rule_class(wanted: &str, classes: &[ClassDraft]) -> Result<String, Problem> {
    let leaves = || list(classes.iter().filter(|c| c.children.is_empty()).map(|c| c.name.as_str()));
    let Some(class) = classes.iter().find(|c| c.name == *wanted) else {
        return Err(Problem::new(format!("no class named {wanted:?}; expected a leaf class: {}", leaves())));
    };
    if !class.children.is_empty() {
        return Err(Problem::new(format!(
            "class {wanted:?} has child classes ({}); rules must name a leaf class: {}",
            list(class.children.iter().map(|&c| classes[c].name.as_str())),
            leaves()
        )));
    }
    Ok(wanted.to_owned())
}

/// Where a rate, ceil or child sum comes from: an interface or a class.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    Interface(usize),
    Class(usize),
}

/// An interface being validated.
struct IfaceDraft {
    name: String,
    rate: Rate,
    rate_line: usize,
    default: Spanned<String>,
    overhead: i32,
    replace_qdisc: bool,
    direction: Direction,
}

/// A class being validated.
struct ClassDraft {
    name: String,
    line: usize,
    interface: usize,
    parent_name: Option<Spanned<String>>,
    parent: Option<usize>,
    rate_spec: RateSpec,
    rate_line: usize,
    ceil_spec: Option<(RateSpec, usize)>,
    rate: Rate,
    ceil: Rate,
    prio: u8,
    weight: Option<u32>,
    horizon: Duration,
    aqm: Option<Aqm>,
    isolation: Isolation,
    children: Vec<usize>,
}

/// Checks the raw configuration and builds the public one.
struct Validator<'a> {
    path: &'a Path,
    lines: LineIndex,
}

impl Validator<'_> {
    /// 1-based line of a spanned value.
    fn line<T>(&self, value: &Spanned<T>) -> usize {
        self.lines.line(value.span().start)
    }

    fn error(&self, line: usize, key: impl Into<String>, problem: impl Into<Problem>) -> ConfigError {
        let problem = problem.into();
        ConfigError::Invalid {
            path: self.path.to_owned(),
            line,
            key: key.into(),
            problem: problem.text,
            source: problem.source,
        }
    }

    /// Runs `check` on a spanned value, naming `key` and the value's line on failure.
    fn check<T, U>(
        &self,
        key: &str,
        value: &Spanned<T>,
        check: impl FnOnce(&T) -> Result<U, Problem>,
    ) -> Result<U, ConfigError> {
        check(value.get_ref()).map_err(|problem| self.error(self.line(value), key, problem))
    }

    /// A required value: its key and its table's header line on absence, with `hint`.
    fn required<'v, T>(
        &self,
        value: Option<&'v Spanned<T>>,
        key: &str,
        table_line: usize,
        hint: &str,
    ) -> Result<&'v Spanned<T>, ConfigError> {
        value.ok_or_else(|| self.error(table_line, key, format!("missing; {hint}")))
    }

    fn validate(&self, raw: &RawConfig) -> Result<Config, ConfigError> {
        let daemon = self.daemon(raw.daemon.as_ref())?;
        let interfaces = self.interfaces(&raw.interface)?;
        let mut classes = self.classes(&raw.class, &interfaces)?;
        self.link_parents(&mut classes, &interfaces)?;
        self.resolve_rates(&mut classes, &interfaces)?;
        self.check_sums(&classes, &interfaces)?;
        self.check_defaults(&classes, &interfaces)?;
        let rules = self.rules(&raw.rule, &classes)?;
        Ok(Config {
            path: self.path.to_owned(),
            text: String::new(),
            daemon,
            interfaces: interfaces
                .iter()
                .map(|i| Interface {
                    name: i.name.clone(),
                    rate: i.rate,
                    default_class: i.default.get_ref().clone(),
                    overhead: i.overhead,
                    replace_qdisc: i.replace_qdisc,
                    direction: i.direction,
                })
                .collect(),
            classes: classes
                .iter()
                .map(|c| Class {
                    name: c.name.clone(),
                    interface: interfaces[c.interface].name.clone(),
                    parent: c.parent.map(|p| classes[p].name.clone()),
                    rate: c.rate,
                    ceil: c.ceil,
                    prio: c.prio,
                    weight: c.weight,
                    horizon: c.horizon,
                    aqm: c.aqm,
                    isolation: c.isolation,
                    line: c.line,
                })
                .collect(),
            rules,
        })
    }

    fn daemon(&self, raw: Option<&RawDaemon>) -> Result<DaemonSettings, ConfigError> {
        let mut settings = DaemonSettings::default();
        let Some(raw) = raw else {
            return Ok(settings);
        };
        if let Some(socket) = &raw.socket {
            let path = self.check("daemon.socket", socket, |path| {
                if path.is_empty() || path.contains('\0') {
                    Err(Problem::new(format!(
                        "invalid socket path {path:?}; expected a file path, e.g. \"/run/shaper/shaper.sock\""
                    )))
                } else if path.len() > MAX_SOCKET_PATH_LEN {
                    Err(Problem::new(format!(
                        "socket path is {} bytes long; a unix socket path has at most {MAX_SOCKET_PATH_LEN} bytes",
                        path.len()
                    )))
                } else {
                    Ok(PathBuf::from(path))
                }
            })?;
            settings.socket = Some(path);
        }
        if let Some(tick) = &raw.tick {
            settings.tick = self.check("daemon.tick", tick, |v| duration_in(v, "tick", &TICK_RANGE, "10ms"))?;
        }
        if let Some(listen) = &raw.metrics_listen {
            settings.metrics_listen = self.check("daemon.metrics_listen", listen, |text| {
                if text.is_empty() {
                    return Ok(None);
                }
                text.parse().map(Some).map_err(|_| {
                    Problem::new(format!(
                        "invalid address {text:?}; expected an address and a port, e.g. \"127.0.0.1:9640\" or \"[::1]:9640\", or \"\" to turn the endpoint off"
                    ))
                })
            })?;
        }
        Ok(settings)
    }

    fn interfaces(&self, raw: &[Spanned<RawInterface>]) -> Result<Vec<IfaceDraft>, ConfigError> {
        if raw.is_empty() {
            return Err(self.error(
                1,
                "interface",
                "no interface is configured; add an [[interface]] table with a name, a rate and a default class, e.g. name = \"eth0\", rate = \"100mbit\", default = \"bulk\"",
            ));
        }
        if raw.len() > MAX_INTERFACES {
            return Err(self.error(
                self.line(&raw[MAX_INTERFACES]),
                format!("interface[{MAX_INTERFACES}]"),
                format!("too many interfaces ({}); at most {MAX_INTERFACES} can be shaped", raw.len()),
            ));
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut drafts = Vec::with_capacity(raw.len());
        for (i, spanned) in raw.iter().enumerate() {
            let line = self.line(spanned);
            let iface = spanned.get_ref();
            let key = |field: &str| format!("interface[{i}].{field}");

            let name = self.required(
                iface.name.as_ref(),
                &key("name"),
                line,
                "name the network device to shape, e.g. name = \"eth0\"",
            )?;
            self.check(&key("name"), name, |n| check_ifname(n))?;
            let name_line = self.line(name);
            let name = name.get_ref().clone();
            if let Some(first) = seen.insert(name.clone(), name_line) {
                return Err(self.error(
                    name_line,
                    key("name"),
                    format!("interface {name:?} is already configured at line {first}; each interface has one [[interface]] table"),
                ));
            }

            let rate = self.required(
                iface.rate.as_ref(),
                &key("rate"),
                line,
                "give the link's capacity, e.g. rate = \"100mbit\"",
            )?;
            let rate_line = self.line(rate);
            let rate = self.check(&key("rate"), rate, |v| match parse_rate(v)? {
                r if r == Rate::ZERO => Err(Problem::new(
                    "rate is 0; an interface needs its positive link capacity, e.g. rate = \"100mbit\"",
                )),
                r => Ok(r),
            })?;

            let default = self
                .required(
                    iface.default.as_ref(),
                    &key("default"),
                    line,
                    "name the leaf class of packets that match no rule, e.g. default = \"bulk\"",
                )?
                .clone();

            let overhead = match &iface.overhead {
                None => 0,
                Some(overhead) => self.check(&key("overhead"), overhead, |&Integer(n)| {
                    i32::try_from(n).ok().filter(|n| OVERHEAD_RANGE.contains(n)).ok_or_else(|| {
                        Problem::new(format!(
                            "overhead {n} is out of range; expected {}..={} bytes",
                            OVERHEAD_RANGE.start(),
                            OVERHEAD_RANGE.end()
                        ))
                    })
                })?,
            };

            let direction = match &iface.direction {
                None => Direction::Upload,
                Some(d) => self.check(&key("direction"), d, |d| match d.as_str() {
                    "upload" => Ok(Direction::Upload),
                    "download" => Ok(Direction::Download),
                    other => Err(Problem::new(format!(
                        "direction {other:?} is not one of \"upload\" (the hosts send through it) and \"download\" (it carries traffic to the hosts)"
                    ))),
                })?,
            };

            drafts.push(IfaceDraft {
                name,
                rate,
                rate_line,
                default,
                overhead,
                replace_qdisc: iface.replace_qdisc.unwrap_or(false),
                direction,
            });
        }
        Ok(drafts)
    }

    fn classes(&self, raw: &[Spanned<RawClass>], interfaces: &[IfaceDraft]) -> Result<Vec<ClassDraft>, ConfigError> {
        if raw.len() > MAX_CLASSES {
            return Err(self.error(
                self.line(&raw[MAX_CLASSES]),
                format!("class[{MAX_CLASSES}]"),
                format!("too many classes ({}); at most {MAX_CLASSES} are supported across all interfaces", raw.len()),
            ));
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut drafts = Vec::with_capacity(raw.len());
        for (i, spanned) in raw.iter().enumerate() {
            let draft = self.class(i, spanned, interfaces)?;
            if let Some(first) = seen.insert(draft.name.clone(), draft.line) {
                let name_line = raw[i].get_ref().name.as_ref().map_or(draft.line, |n| self.line(n));
                return Err(self.error(
                    name_line,
                    format!("class[{i}].name"),
                    format!("class {:?} is already defined at line {first}; class names must be unique", draft.name),
                ));
            }
            drafts.push(draft);
        }
        Ok(drafts)
    }

    /// The checks of one class that need no other class.
    #[expect(clippy::too_many_lines, reason = "one check after another, in the order of the keys")]
    fn class(
        &self,
        i: usize,
        spanned: &Spanned<RawClass>,
        interfaces: &[IfaceDraft],
    ) -> Result<ClassDraft, ConfigError> {
        let line = self.line(spanned);
        let class = spanned.get_ref();
        let key = |field: &str| format!("class[{i}].{field}");

        let name =
            self.required(class.name.as_ref(), &key("name"), line, "give the class a name, e.g. name = \"guest\"")?;
        self.check(&key("name"), name, |n| check_class_name(n))?;
        let name = name.get_ref().clone();

        let names = || list(interfaces.iter().map(|i| i.name.as_str()));
        let interface = match &class.interface {
            Some(iface) => self.check(&key("interface"), iface, |wanted| {
                interfaces
                    .iter()
                    .position(|i| i.name == *wanted)
                    .ok_or_else(|| Problem::new(format!("no interface named {wanted:?}; configured interfaces: {}", names())))
            })?,
            None if interfaces.len() == 1 => 0,
            None => {
                return Err(self.error(
                    line,
                    key("interface"),
                    format!(
                        "missing; there are {} interfaces ({}), so each class must say which one it belongs to, e.g. interface = {:?}",
                        interfaces.len(),
                        names(),
                        interfaces[0].name
                    ),
                ))
            }
        };

        let rate = self.required(
            class.rate.as_ref(),
            &key("rate"),
            line,
            "give the class a guaranteed rate, e.g. rate = \"1mbit\" or rate = \"10%\" (of its parent's rate)",
        )?;
        let rate_line = self.line(rate);
        let rate_spec = self.check(&key("rate"), rate, parse_rate_spec)?;
        let ceil_spec = match &class.ceil {
            Some(ceil) => Some((self.check(&key("ceil"), ceil, parse_rate_spec)?, self.line(ceil))),
            None => None,
        };

        let prio = match &class.prio {
            None => 0,
            Some(prio) => self.check(&key("prio"), prio, |&Integer(p)| {
                u8::try_from(p).ok().filter(|&p| p <= MAX_PRIO).ok_or_else(|| {
                    Problem::new(format!("prio {p} is out of range; expected 0..={MAX_PRIO} (lower is served first)"))
                })
            })?,
        };
        let weight = match &class.weight {
            None => None,
            Some(weight) => Some(self.check(&key("weight"), weight, |&Integer(w)| {
                u32::try_from(w).ok().filter(|&w| w > 0).ok_or_else(|| {
                    Problem::new(format!("weight {w} is invalid; expected a positive integer up to {}", u32::MAX))
                })
            })?),
        };
        let horizon = match &class.horizon {
            None => DEFAULT_HORIZON,
            Some(horizon) => {
                self.check(&key("horizon"), horizon, |v| duration_in(v, "horizon", &HORIZON_RANGE, "2s"))?
            }
        };
        let target = match &class.aqm_target {
            None => DEFAULT_AQM.target,
            Some(t) => self.check(&key("aqm_target"), t, |v| duration_in(v, "aqm_target", &AQM_TARGET_RANGE, "5ms"))?,
        };
        let interval = match &class.aqm_interval {
            None => DEFAULT_AQM.interval,
            Some(i) => {
                self.check(&key("aqm_interval"), i, |v| duration_in(v, "aqm_interval", &AQM_INTERVAL_RANGE, "100ms"))?
            }
        };
        if target >= interval {
            let at = class.aqm_target.as_ref().or(class.aqm_interval.as_ref()).map_or(line, |s| self.line(s));
            return Err(self.error(
                at,
                key("aqm_target"),
                format!("aqm_target {target:?} must be below aqm_interval {interval:?} (CoDel: e.g. 5ms and 100ms)"),
            ));
        }
        let aqm = match class.aqm.as_ref().map(|a| *a.get_ref()) {
            Some(false) => None,
            _ => Some(Aqm { target, interval }),
        };
        let isolation = match &class.isolation {
            None => Isolation::Host,
            Some(i) => self.check(&key("isolation"), i, |i| match i.as_str() {
                "host" => Ok(Isolation::Host),
                "flow" => Ok(Isolation::Flow),
                "none" => Ok(Isolation::None),
                other => Err(Problem::new(format!(
                    "isolation {other:?} is not one of \"host\" (share the class fairly between its hosts), \"flow\" (between its flows) and \"none\""
                ))),
            })?,
        };

        Ok(ClassDraft {
            name,
            line,
            interface,
            parent_name: class.parent.clone(),
            parent: None,
            rate_spec,
            rate_line,
            ceil_spec,
            rate: Rate::ZERO,
            ceil: Rate::ZERO,
            prio,
            weight,
            horizon,
            aqm,
            isolation,
            children: Vec::new(),
        })
    }

    /// Resolves `parent` names, checks they share the interface and form no cycle.
    fn link_parents(&self, classes: &mut [ClassDraft], interfaces: &[IfaceDraft]) -> Result<(), ConfigError> {
        let index: HashMap<&str, usize> = classes.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect();
        let mut parents = vec![None; classes.len()];
        for (i, class) in classes.iter().enumerate() {
            let Some(parent) = &class.parent_name else {
                continue;
            };
            let key = format!("class[{i}].parent");
            let p = self.check(&key, parent, |wanted| {
                index.get(wanted.as_str()).copied().ok_or_else(|| {
                    let same_iface = classes
                        .iter()
                        .filter(|c| c.interface == class.interface && c.name != class.name)
                        .map(|c| c.name.as_str());
                    Problem::new(format!(
                        "no class named {wanted:?}; expected a class of interface {}: {}",
                        interfaces[class.interface].name,
                        list(same_iface)
                    ))
                })
            })?;
            if classes[p].interface != class.interface {
                return Err(self.error(
                    self.line(parent),
                    key,
                    format!(
                        "parent {:?} is on interface {}, but this class is on {}; a class and its parent must be on the same interface",
                        classes[p].name, interfaces[classes[p].interface].name, interfaces[class.interface].name
                    ),
                ));
            }
            parents[i] = Some(p);
        }
        // Follow each parent chain until it reaches a class known to lead to a root (or a
        // root); reaching a class of the chain being followed means a cycle. Each class is
        // walked once.
        let mut reaches_root = vec![false; classes.len()];
        let mut on_chain = vec![false; classes.len()];
        for start in 0..classes.len() {
            let mut chain = vec![start];
            on_chain[start] = true;
            let mut at = start;
            while let Some(p) = parents[at].filter(|&p| !reaches_root[p]) {
                if on_chain[p] {
                    let pos = chain.iter().position(|&c| c == p).expect("p is on the chain");
                    let cycle = &chain[pos..];
                    let first = *cycle.iter().min().expect("a cycle has members");
                    let from = cycle.iter().position(|&c| c == first).expect("first is in the cycle");
                    let names: Vec<&str> = cycle[from..]
                        .iter()
                        .chain(&cycle[..from])
                        .chain(std::iter::once(&first))
                        .map(|&c| classes[c].name.as_str())
                        .collect();
                    let parent = classes[first].parent_name.as_ref().expect("a class in a cycle has a parent");
                    return Err(self.error(
                        self.line(parent),
                        format!("class[{first}].parent"),
                        format!(
                            "parents form a cycle: {} (each class names the next as parent); the classes of an interface must form a tree",
                            names.join(" -> ")
                        ),
                    ));
                }
                chain.push(p);
                on_chain[p] = true;
                at = p;
            }
            for c in chain {
                on_chain[c] = false;
                reaches_root[c] = true;
            }
        }
        for (i, parent) in parents.into_iter().enumerate() {
            classes[i].parent = parent;
            if let Some(p) = parent {
                classes[p].children.push(i);
            }
        }
        Ok(())
    }

    /// Resolves rates and ceils from the top of each tree down, checking
    /// `rate <= ceil <= parent's ceil`.
    fn resolve_rates(&self, classes: &mut [ClassDraft], interfaces: &[IfaceDraft]) -> Result<(), ConfigError> {
        let mut order: Vec<usize> = (0..classes.len()).filter(|&i| classes[i].parent.is_none()).collect();
        let mut next = 0;
        while next < order.len() {
            order.extend_from_slice(&classes[order[next]].children);
            next += 1;
        }
        for i in order {
            let class = &classes[i];
            let (parent_rate, parent_ceil, parent_desc) = if let Some(p) = class.parent {
                let parent = &classes[p];
                (parent.rate, parent.ceil, format!("parent class {:?}", parent.name))
            } else {
                let iface = &interfaces[class.interface];
                (iface.rate, iface.rate, format!("interface {}", iface.name))
            };
            let rate = class.rate_spec.resolve(parent_rate);
            if rate == Rate::ZERO {
                let problem = match class.rate_spec {
                    RateSpec::Absolute(_) => "rate is 0; a class needs a positive guaranteed rate, e.g. rate = \"1mbit\"".to_owned(),
                    RateSpec::Percent(_) => format!(
                        "rate {} of {parent_desc}'s rate {parent_rate} rounds down to 0bit; use a larger share or an absolute rate",
                        class.rate_spec
                    ),
                };
                return Err(self.error(class.rate_line, format!("class[{i}].rate"), problem));
            }
            let ceil = class.ceil_spec.map_or(parent_ceil, |(spec, _)| spec.resolve(parent_ceil));
            match class.ceil_spec {
                Some((_, ceil_line)) if ceil < rate => {
                    return Err(self.error(
                        ceil_line,
                        format!("class[{i}].ceil"),
                        format!("ceil {ceil} is below the class's rate {rate}; ceil must be at least the rate (or omit it to borrow up to {parent_desc}'s ceil {parent_ceil})"),
                    ))
                }
                None if ceil < rate => {
                    return Err(self.error(
                        class.rate_line,
                        format!("class[{i}].rate"),
                        format!("rate {rate} is above the ceil {ceil} inherited from {parent_desc}; expected at most {ceil}"),
                    ))
                }
                Some((_, ceil_line)) if ceil > parent_ceil => {
                    return Err(self.error(
                        ceil_line,
                        format!("class[{i}].ceil"),
                        format!("ceil {ceil} is above {parent_desc}'s ceil {parent_ceil}; a class cannot borrow more than its parent may use, so expected at most {parent_ceil}"),
                    ))
                }
                _ => {}
            }
            classes[i].rate = rate;
            classes[i].ceil = ceil;
        }
        Ok(())
    }

    /// Checks that the guaranteed rates of each node's children fit in the node's rate.
    fn check_sums(&self, classes: &[ClassDraft], interfaces: &[IfaceDraft]) -> Result<(), ConfigError> {
        let nodes = (0..interfaces.len()).map(Node::Interface).chain((0..classes.len()).map(Node::Class));
        for node in nodes {
            let children: Vec<&ClassDraft> = match node {
                Node::Interface(n) => classes.iter().filter(|c| c.parent.is_none() && c.interface == n).collect(),
                Node::Class(n) => classes[n].children.iter().map(|&c| &classes[c]).collect(),
            };
            let sum: u128 = children.iter().map(|c| u128::from(c.rate.bits_per_sec())).sum();
            let (rate, line, key, whose) = match node {
                Node::Interface(n) => {
                    let iface = &interfaces[n];
                    (
                        iface.rate,
                        iface.rate_line,
                        format!("interface[{n}].rate"),
                        format!("the top-level classes of interface {}", iface.name),
                    )
                }
                Node::Class(n) => {
                    let class = &classes[n];
                    (
                        class.rate,
                        class.rate_line,
                        format!("class[{n}].rate"),
                        format!("the children of class {:?}", class.name),
                    )
                }
            };
            if sum > u128::from(rate.bits_per_sec()) {
                let terms: Vec<String> = children.iter().map(|c| format!("{} {}", c.name, c.rate)).collect();
                return Err(self.error(
                    line,
                    key,
                    format!(
                        "the guaranteed rates of {whose} add up to {} ({}), more than its rate {rate}; lower them so that they add up to at most {rate}",
                        fmt_sum(sum),
                        terms.join(" + ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that each interface's `default` is one of its leaf classes.
    fn check_defaults(&self, classes: &[ClassDraft], interfaces: &[IfaceDraft]) -> Result<(), ConfigError> {
        for (n, iface) in interfaces.iter().enumerate() {
            let default = &iface.default;
            let leaves =
                || list(classes.iter().filter(|c| c.interface == n && c.children.is_empty()).map(|c| c.name.as_str()));
            self.check(&format!("interface[{n}].default"), default, |wanted| {
                let Some(class) = classes.iter().find(|c| c.name == *wanted) else {
                    return Err(Problem::new(format!(
                        "no class named {wanted:?}; expected a leaf class of interface {}: {}",
                        iface.name,
                        leaves()
                    )));
                };
                if class.interface != n {
                    return Err(Problem::new(format!(
                        "class {wanted:?} is on interface {}, not {}; expected a leaf class of {}: {}",
                        interfaces[class.interface].name,
                        iface.name,
                        iface.name,
                        leaves()
                    )));
                }
                if !class.children.is_empty() {
                    return Err(Problem::new(format!(
                        "class {wanted:?} has child classes ({}); only leaf classes carry packets, expected one of: {}",
                        list(class.children.iter().map(|&c| classes[c].name.as_str())),
                        leaves()
                    )));
                }
                Ok(())
            })?;
        }
        Ok(())
    }

    fn rules(&self, raw: &[Spanned<RawRule>], classes: &[ClassDraft]) -> Result<Vec<Rule>, ConfigError> {
        raw.iter().enumerate().map(|(i, rule)| self.rule(i, rule, classes)).collect()
    }

    fn rule(&self, index: usize, spanned: &Spanned<RawRule>, classes: &[ClassDraft]) -> Result<Rule, ConfigError> {
        let line = self.line(spanned);
        let raw = spanned.get_ref();
        let key = |field: &str| format!("rule[{index}].{field}");
        let class = self.required(
            raw.class.as_ref(),
            &key("class"),
            line,
            "name the leaf class this rule sends packets to, e.g. class = \"guest\"",
        )?;
        let class = self.check(&key("class"), class, |wanted| rule_class(wanted, classes))?;

        let net = |field: &str, value: &Option<Spanned<String>>| {
            value.as_ref().map(|v| self.check(&key(field), v, |text| parse_net(text))).transpose()
        };
        let src = net("src", &raw.src)?;
        let dst = net("dst", &raw.dst)?;
        if let (Some(src), Some(dst), Some(dst_value)) = (src, dst, &raw.dst) {
            if matches!(src, IpNet::V4(_)) != matches!(dst, IpNet::V4(_)) {
                return Err(self.error(
                    self.line(dst_value),
                    key("dst"),
                    format!("{dst} and src {src} are of different address families; a packet has one family, so use both IPv4 or both IPv6 (write two rules to match both)"),
                ));
            }
        }

        let proto = raw.proto.as_ref().map(|v| self.check(&key("proto"), v, parse_proto)).transpose()?;
        if let (Some(proto @ (PROTO_ICMP | PROTO_ICMPV6)), Some(proto_value)) = (proto, &raw.proto) {
            let wrong_family = src.or(dst).filter(|net| matches!(net, IpNet::V4(_)) == (proto == PROTO_ICMPV6));
            if let Some(net) = wrong_family {
                let (want, family) = if proto == PROTO_ICMP { ("icmpv6", "IPv6") } else { ("icmp", "IPv4") };
                return Err(self.error(
                    self.line(proto_value),
                    key("proto"),
                    format!("proto {} never matches {family} network {net}; use proto = \"{want}\"", proto_name(proto)),
                ));
            }
        }

        let mut ports = [None, None];
        for (slot, (field, value)) in ports.iter_mut().zip([("sport", &raw.sport), ("dport", &raw.dport)]) {
            let Some(value) = value else { continue };
            let range = self.check(&key(field), value, parse_ports)?;
            if let Some(p) = proto.filter(|&p| p != PROTO_TCP && p != PROTO_UDP) {
                return Err(self.error(
                    self.line(value),
                    key(field),
                    format!("{field} needs proto tcp or udp (or no proto), but this rule has proto = {:?}; remove {field} or change proto", proto_name(p)),
                ));
            }
            *slot = Some(range);
        }

        let mark = raw.mark.as_ref().map(|v| self.check(&key("mark"), v, parse_mark)).transpose()?;
        let dscp = raw.dscp.as_ref().map(|v| self.check(&key("dscp"), v, parse_dscp)).transpose()?;

        Ok(Rule { index, line, class, src, dst, proto, sport: ports[0], dport: ports[1], mark, dscp })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PATH: &str = "test.toml";

    /// One interface lan0 at 10mbit whose default is "guest".
    const IFACE: &str = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "guest"
"#;

    /// The guest class of [`IFACE`].
    const GUEST: &str = r#"
[[class]]
name = "guest"
rate = "1mbit"
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, Path::new(PATH))
    }

    fn ok(text: &str) -> Config {
        parse(text).unwrap_or_else(|e| panic!("should parse: {e}\n{text}"))
    }

    /// 1-based line of the first occurrence of `needle` (the n-th when `nth > 0`).
    fn line_of(text: &str, needle: &str, nth: usize) -> usize {
        text.lines()
            .enumerate()
            .filter(|(_, l)| l.contains(needle))
            .nth(nth)
            .unwrap_or_else(|| panic!("{needle:?} not in\n{text}"))
            .0
            + 1
    }

    /// Asserts that `text` fails with an error at `line` about `key`, whose message
    /// contains every one of `needles`; returns the message.
    #[track_caller]
    fn fails(text: &str, line: usize, key: &str, needles: &[&str]) -> String {
        let Err(e) = parse(text) else { panic!("should fail at {key}:\n{text}") };
        let message = e.to_string();
        assert_eq!(e.line(), Some(line), "line of: {message}");
        assert_eq!(e.key(), Some(key), "key of: {message}");
        assert_eq!(e.path(), Path::new(PATH));
        assert!(message.starts_with(&format!("{PATH}:{line}:")), "{message}");
        assert!(message.contains(key), "{message}");
        for needle in needles {
            assert!(message.contains(needle), "{needle:?} not in: {message}");
        }
        message
    }

    /// Like [`fails`], with the line given as the line containing `at`.
    #[track_caller]
    fn fails_at(text: &str, at: &str, key: &str, needles: &[&str]) -> String {
        fails(text, line_of(text, at, 0), key, needles)
    }

    #[test]
    fn minimal_config_and_defaults() {
        let text = format!("{IFACE}{GUEST}");
        let config = ok(&text);
        assert_eq!(config.path, Path::new(PATH));
        assert_eq!(config.daemon, DaemonSettings::default());
        assert_eq!(config.daemon.tick, Duration::from_millis(10));
        assert_eq!(
            config.interfaces,
            vec![Interface {
                name: "lan0".into(),
                rate: Rate::from_bits_per_sec(10_000_000),
                default_class: "guest".into(),
                overhead: 0,
                replace_qdisc: false,
                direction: Direction::Upload,
            }]
        );
        assert_eq!(
            config.classes,
            vec![Class {
                name: "guest".into(),
                interface: "lan0".into(),
                parent: None,
                rate: Rate::from_bits_per_sec(1_000_000),
                ceil: Rate::from_bits_per_sec(10_000_000),
                prio: 0,
                weight: None,
                horizon: Duration::from_millis(200),
                aqm: Some(DEFAULT_AQM),
                isolation: Isolation::Host,
                line: line_of(&text, "[[class]]", 0),
            }]
        );
        assert!(config.rules.is_empty());
    }

    #[test]
    fn every_field() {
        let text = r#"
[daemon]
socket = "/run/shaper/test.sock"
tick = "1.5ms"

[[interface]]
name = "eth0"
rate = "1gbit"
default = "leaf"
overhead = -4
replace_qdisc = true

[[class]]
name = "top"
interface = "eth0"
rate = "50%"
ceil = "80%"
prio = 7
weight = 10
horizon = "500ms"

[[class]]
name = "leaf"
parent = "top"
rate = "100%"
ceil = "75%"

[[rule]]
class = "leaf"
src = "10.1.0.0/16"
dst = "10.2.3.4"
proto = "TCP"
sport = 80
dport = "3072-4095"
mark = 0x10
dscp = "AF41"
"#;
        let config = ok(text);
        assert_eq!(
            config.daemon,
            DaemonSettings {
                socket: Some("/run/shaper/test.sock".into()),
                tick: Duration::from_micros(1500),
                metrics_listen: Some(DEFAULT_METRICS_LISTEN)
            }
        );
        let iface = &config.interfaces[0];
        assert_eq!((iface.overhead, iface.replace_qdisc), (-4, true));
        let top = config.class("top").unwrap();
        assert_eq!(top.rate, "500mbit".parse().unwrap());
        assert_eq!(top.ceil, "800mbit".parse().unwrap());
        assert_eq!((top.prio, top.weight, top.horizon), (7, Some(10), Duration::from_millis(500)));
        let leaf = config.class("leaf").unwrap();
        assert_eq!(leaf.parent.as_deref(), Some("top"));
        assert_eq!(leaf.interface, "eth0");
        assert_eq!(leaf.rate, "500mbit".parse().unwrap(), "100% of the parent's rate");
        assert_eq!(leaf.ceil, "600mbit".parse().unwrap(), "75% of the parent's ceil");
        assert_eq!(
            config.rules,
            vec![Rule {
                index: 0,
                line: line_of(text, "[[rule]]", 0),
                class: "leaf".into(),
                src: Some("10.1.0.0/16".parse().unwrap()),
                dst: Some("10.2.3.4/32".parse().unwrap()),
                proto: Some(6),
                sport: Some(PortRange { start: 80, end: 80 }),
                dport: Some(PortRange { start: 3072, end: 4095 }),
                mark: Some(16),
                dscp: Some(34),
            }]
        );
    }

    #[test]
    fn ceil_defaults_to_parent_ceil() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "8mbit"
ceil = "9mbit"
[[class]]
name = "room"
parent = "house"
rate = "2mbit"
{GUEST}"#
        );
        let config = ok(&text);
        assert_eq!(config.class("room").unwrap().ceil, "9mbit".parse().unwrap());
        assert_eq!(config.class("guest").unwrap().ceil, "10mbit".parse().unwrap());
    }

    #[test]
    fn tree_queries() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "8mbit"
[[class]]
name = "a"
parent = "house"
rate = "2mbit"
[[class]]
name = "b"
parent = "house"
rate = "2mbit"
{GUEST}"#
        );
        let config = ok(&text);
        assert!(!config.is_leaf("house"));
        assert!(config.is_leaf("a") && config.is_leaf("guest"));
        assert!(!config.is_leaf("nobody"));
        let leaves: Vec<&str> = config.leaves().map(|c| c.name.as_str()).collect();
        assert_eq!(leaves, ["a", "b", "guest"]);
        let children: Vec<&str> = config.children("house").map(|c| c.name.as_str()).collect();
        assert_eq!(children, ["a", "b"]);
        assert!(config.class("nobody").is_none());
        assert_eq!(config.interface("lan0").unwrap().rate, "10mbit".parse().unwrap());
        assert!(config.interface("lan1").is_none());
        let lines: Vec<usize> = config.classes.iter().map(|c| c.line).collect();
        let want: Vec<usize> = (0..4).map(|n| line_of(&text, "[[class]]", n)).collect();
        assert_eq!(lines, want);
    }

    #[test]
    fn example_files_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config");
        let mut loaded = Vec::new();
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.extension().is_some_and(|ext| ext == "toml") {
                let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
                assert!(!config.interfaces.is_empty());
                assert_eq!(config.path, path);
                loaded.push(path.file_name().unwrap().to_string_lossy().into_owned());
            }
        }
        loaded.sort();
        assert!(loaded.contains(&"roommates.toml".to_owned()), "{loaded:?}");
        assert!(loaded.contains(&"office.toml".to_owned()), "{loaded:?}");
    }

    #[test]
    fn roommates_example() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/roommates.toml");
        let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        let iface = &config.interfaces[0];
        assert_eq!((iface.name.as_str(), iface.rate.bits_per_sec()), ("lan0", 10_000_000));
        assert_eq!(iface.default_class, "guest");
        let summary: Vec<(&str, u64, u64, u8)> = config
            .classes
            .iter()
            .map(|c| (c.name.as_str(), c.rate.bits_per_sec(), c.ceil.bits_per_sec(), c.prio))
            .collect();
        assert_eq!(
            summary,
            [
                ("alex", 1_900_000, 10_000_000, 1),
                ("betty", 2_900_000, 10_000_000, 1),
                ("carl", 4_900_000, 10_000_000, 1),
                ("guest", 300_000, 10_000_000, 0),
            ]
        );
        let rules: Vec<(&str, String)> =
            config.rules.iter().map(|r| (r.class.as_str(), r.src.unwrap().to_string())).collect();
        assert_eq!(
            rules,
            [
                ("alex", "192.168.1.110/32".to_owned()),
                ("alex", "fd00:1::110/128".to_owned()),
                ("betty", "192.168.1.111/32".to_owned()),
                ("betty", "fd00:1::111/128".to_owned()),
                ("carl", "192.168.1.112/32".to_owned()),
                ("carl", "fd00:1::112/128".to_owned()),
            ]
        );
    }

    #[test]
    fn office_example() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/office.toml");
        let config = Config::load(&path).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(config.interfaces.len(), 2);
        assert_eq!(config.class("interactive").unwrap().rate, "15mbit".parse().unwrap());
        assert_eq!(config.class("servers").unwrap().ceil, "80mbit".parse().unwrap());
        assert_eq!(config.class("web").unwrap().ceil, "80mbit".parse().unwrap());
        assert!(!config.is_leaf("staff") && config.is_leaf("voip"));
        assert!(config.rules.iter().any(|r| r.dscp == Some(46)));
        assert!(config.rules.iter().any(|r| r.mark == Some(0x10)));
        assert!(config.rules.iter().any(|r| r.src.is_some_and(|n| matches!(n, IpNet::V6(_)))));
        assert!(config.rules.iter().any(|r| r.sport == Some(PortRange { start: 10_000, end: 20_000 })));
    }

    #[test]
    fn load_reports_unreadable_file() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.toml");
        let e = Config::load(&missing).unwrap_err();
        assert!(matches!(e, ConfigError::Read { .. }));
        assert_eq!(e.path(), missing);
        assert_eq!(e.line(), None);
        assert!(e.to_string().contains("missing.toml"), "{e}");
        assert!(StdError::source(&e).is_some());

        let file = dir.path().join("good.toml");
        std::fs::write(&file, format!("{IFACE}{GUEST}")).unwrap();
        assert_eq!(Config::load(&file).unwrap().path, file);

        let bad = dir.path().join("bad.toml");
        std::fs::write(&bad, format!("{IFACE}{GUEST}prio = 9\n")).unwrap();
        let e = Config::load(&bad).unwrap_err();
        assert!(e.to_string().starts_with(&format!("{}:", bad.display())), "{e}");
    }

    // ----- errors reported while reading the TOML -------------------------------------

    #[test]
    fn unknown_key_names_table_and_line() {
        let text = format!("{IFACE}{GUEST}\n[[class]]\nname = \"x\"\nrate = \"1kbit\"\ncolour = \"red\"\n");
        let message = fails_at(&text, "colour", "class[1].colour", &["unknown field `colour`", "`ceil`"]);
        assert!(message.contains(&format!(":{}:1:", line_of(&text, "colour", 0))), "{message}");
        let e = parse(&text).unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }));
        assert!(StdError::source(&e).is_some());
    }

    #[test]
    fn unknown_keys_everywhere() {
        let text = format!("[daemon]\nsockets = \"/x\"\n{IFACE}{GUEST}");
        fails_at(&text, "sockets", "daemon.sockets", &["unknown field"]);
        let text = format!("{IFACE}speed = 5\n{GUEST}");
        fails_at(&text, "speed", "interface[0].speed", &["unknown field"]);
        let text = format!("{IFACE}{GUEST}[[rule]]\nclass = \"guest\"\nport = 80\n");
        fails_at(&text, "port = 80", "rule[0].port", &["unknown field", "dport"]);
        let text = format!("{IFACE}{GUEST}[[classes]]\nname = \"x\"\n");
        fails_at(&text, "[[classes]]", "classes", &["unknown field `classes`"]);
        let text = format!("top = 1\n{IFACE}{GUEST}");
        fails_at(&text, "top = 1", "top", &["unknown field `top`"]);
    }

    #[test]
    fn wrong_types() {
        let text = format!("{IFACE}{GUEST}[[class]]\nname = 5\nrate = \"1mbit\"\n");
        fails_at(&text, "name = 5", "class[1].name", &["invalid type"]);
        let text = format!("{IFACE}replace_qdisc = \"yes\"\n{GUEST}");
        fails_at(&text, "replace_qdisc", "interface[0].replace_qdisc", &["invalid type"]);
        let text = format!("{IFACE}{GUEST}[[rule]]\nclass = \"guest\"\ndport = [1, 2]\n");
        fails_at(&text, "dport", "rule[0].dport", &["an integer or a string"]);
        let text = format!("{IFACE}\n[class]\nname = \"guest\"\nrate = \"1mbit\"\n");
        fails_at(&text, "[class]", "class", &["[[class]]"]);
    }

    #[test]
    fn toml_syntax_error_has_line_and_column() {
        let text = format!("{IFACE}{GUEST}\n[[rule]]\nclass = guest\n");
        let e = parse(&text).unwrap_err();
        let line = line_of(&text, "class = guest", 0);
        assert_eq!(e.line(), Some(line));
        assert!(e.to_string().starts_with(&format!("{PATH}:{line}:9: ")), "{e}");
    }

    // ----- daemon -----------------------------------------------------------------------

    #[test]
    fn bad_durations() {
        let with_tick = |tick: &str| format!("[daemon]\ntick = {tick}\n{IFACE}{GUEST}");
        fails_at(&with_tick("\"10\""), "tick", "daemon.tick", &["no unit", "10ms"]);
        fails_at(&with_tick("10"), "tick", "daemon.tick", &["no unit", "\"10ms\""]);
        fails_at(&with_tick("\"10 parsecs\""), "tick", "daemon.tick", &["unknown unit \"parsecs\"", "ms"]);
        fails_at(&with_tick("\"fast\""), "tick", "daemon.tick", &["invalid duration", "10ms"]);
        fails_at(&with_tick("\"-5ms\""), "tick", "daemon.tick", &["invalid duration"]);
        fails_at(&with_tick("\"0ms\""), "tick", "daemon.tick", &["out of range", "1ms..=1s"]);
        fails_at(&with_tick("\"2s\""), "tick", "daemon.tick", &["out of range", "1ms..=1s"]);
        fails_at(&with_tick("\"0.5ns\""), "tick", "daemon.tick", &["whole number of nanoseconds"]);
        fails_at(&with_tick("\"99999999999999999999s\""), "tick", "daemon.tick", &["too long"]);
        assert_eq!(ok(&with_tick("\"1s\"")).daemon.tick, Duration::from_secs(1));
        assert_eq!(ok(&with_tick("\"1500us\"")).daemon.tick, Duration::from_micros(1500));
        fails_at(&with_tick("\"250µs\""), "tick", "daemon.tick", &["out of range"]);

        let with_isolation = |i: &str| format!("{IFACE}{GUEST}isolation = {i}\n");
        assert_eq!(ok(&with_isolation("\"flow\"")).classes[0].isolation, Isolation::Flow);
        assert_eq!(ok(&with_isolation("\"none\"")).classes[0].isolation, Isolation::None);
        fails_at(
            &with_isolation("\"fair\""),
            "isolation",
            "class[0].isolation",
            &["\"fair\"", "\"host\"", "\"flow\"", "\"none\""],
        );
        let with_direction = |d: &str| format!("{IFACE}direction = {d}\n{GUEST}");
        assert_eq!(ok(&with_direction("\"download\"")).interfaces[0].direction, Direction::Download);
        fails_at(
            &with_direction("\"sideways\""),
            "direction",
            "interface[0].direction",
            &["\"upload\"", "\"download\""],
        );

        let with_horizon = |h: &str| format!("{IFACE}{GUEST}horizon = {h}\n");
        fails_at(&with_horizon("\"20s\""), "horizon", "class[0].horizon", &["out of range", "1ms..=10s"]);
        fails_at(&with_horizon("\"500us\""), "horizon", "class[0].horizon", &["out of range"]);
        fails_at(&with_horizon("2"), "horizon", "class[0].horizon", &["no unit", "\"2s\""]);
        assert_eq!(ok(&with_horizon("\"10s\"")).classes[0].horizon, Duration::from_secs(10));
        assert_eq!(ok(&with_horizon("\"1.5s\"")).classes[0].horizon, Duration::from_millis(1500));
    }

    #[test]
    fn aqm_settings() {
        let with = |extra: &str| format!("{IFACE}{GUEST}{extra}\n");
        assert_eq!(ok(&with("")).classes[0].aqm, Some(DEFAULT_AQM));
        assert_eq!(ok(&with("aqm = false")).classes[0].aqm, None);
        let custom = ok(&with("aqm_target = \"2ms\"\naqm_interval = \"50ms\""));
        assert_eq!(
            custom.classes[0].aqm,
            Some(Aqm { target: Duration::from_millis(2), interval: Duration::from_millis(50) })
        );
        fails_at(&with("aqm_target = \"200ms\""), "aqm_target", "class[0].aqm_target", &["below aqm_interval"]);
        fails_at(&with("aqm_target = \"5s\""), "aqm_target", "class[0].aqm_target", &["out of range"]);
        fails_at(&with("aqm_interval = \"20s\""), "aqm_interval", "class[0].aqm_interval", &["out of range"]);
    }

    #[test]
    fn parse_duration_units() {
        assert_eq!(parse_duration("100ns"), Ok(Duration::from_nanos(100)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 2 s "), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.000000001s"), Ok(Duration::new(1, 1)));
        assert!(matches!(parse_duration("1.0000000001s"), Err(ParseDurationError::NotWhole(_))));
        assert!(matches!(parse_duration("10"), Err(ParseDurationError::MissingUnit(_))));
        assert!(matches!(parse_duration("10m"), Err(ParseDurationError::UnknownUnit { .. })));
        assert!(matches!(parse_duration(""), Err(ParseDurationError::Invalid(_))));
        assert_eq!(fmt_duration(Duration::from_millis(1)), "1ms");
        assert_eq!(fmt_duration(Duration::from_secs(10)), "10s");
        assert_eq!(fmt_duration(Duration::from_micros(1500)), "1500us");
        assert_eq!(fmt_duration(Duration::from_nanos(7)), "7ns");
    }

    #[test]
    fn bad_socket() {
        let text = format!("[daemon]\nsocket = \"\"\n{IFACE}{GUEST}");
        fails_at(&text, "socket", "daemon.socket", &["invalid socket path"]);
        let long = "/x".repeat(60);
        let text = format!("[daemon]\nsocket = \"{long}\"\n{IFACE}{GUEST}");
        fails_at(&text, "socket", "daemon.socket", &["120 bytes", "at most 107"]);
    }

    #[test]
    fn metrics_listen_is_an_address_or_off() {
        let text = format!("[daemon]\nmetrics_listen = \"localhost\"\n{IFACE}{GUEST}");
        fails_at(
            &text,
            "metrics_listen",
            "daemon.metrics_listen",
            &["invalid address \"localhost\"", "127.0.0.1:9640"],
        );
        let config = ok(&format!("[daemon]\nmetrics_listen = \"\"\n{IFACE}{GUEST}"));
        assert_eq!(config.daemon.metrics_listen, None);
        let config = ok(&format!("[daemon]\nmetrics_listen = \"[::1]:9100\"\n{IFACE}{GUEST}"));
        assert_eq!(config.daemon.metrics_listen, Some("[::1]:9100".parse().unwrap()));
    }

    // ----- interfaces -------------------------------------------------------------------

    #[test]
    fn no_interface() {
        fails("", 1, "interface", &["no interface", "[[interface]]"]);
        fails(GUEST, 1, "interface", &["no interface"]);
    }

    #[test]
    fn too_many_interfaces() {
        let mut text = String::new();
        for n in 0..=MAX_INTERFACES {
            let _ = write!(text, "[[interface]]\nname = \"eth{n}\"\nrate = \"1mbit\"\ndefault = \"c{n}\"\n");
        }
        let line = line_of(&text, "[[interface]]", MAX_INTERFACES);
        fails(&text, line, "interface[64]", &["too many interfaces (65)", "at most 64"]);
    }

    #[test]
    fn duplicate_interface() {
        let text = format!("{IFACE}{IFACE}{GUEST}");
        fails(
            &text,
            line_of(&text, "name = \"lan0\"", 1),
            "interface[1].name",
            &["\"lan0\" is already configured", &format!("line {}", line_of(&text, "name = \"lan0\"", 0))],
        );
    }

    #[test]
    fn bad_interface_names() {
        for (name, why) in [
            ("a-very-long-ifname", "longer than 15 bytes"),
            ("eth/0", "'/'"),
            ("eth 0", "whitespace"),
            ("eth:0", "':'"),
            ("", "is empty"),
            ("..", "not a valid device name"),
        ] {
            let text = format!("[[interface]]\nname = \"{name}\"\nrate = \"1mbit\"\ndefault = \"guest\"\n{GUEST}");
            fails(&text, 2, "interface[0].name", &[why, "1 to 15 bytes"]);
        }
        let text = format!("[[interface]]\nname = \"fifteen-chars-x\"\nrate = \"1mbit\"\ndefault = \"guest\"\n{GUEST}");
        assert_eq!(ok(&text).interfaces[0].name, "fifteen-chars-x");
    }

    #[test]
    fn interface_rate() {
        let iface = |rate: &str| {
            format!("[[interface]]\nname = \"lan0\"\n{rate}\ndefault = \"guest\"\n[[class]]\nname = \"guest\"\nrate = \"1kbit\"\n")
        };
        fails(&iface("rate = \"0mbit\""), 3, "interface[0].rate", &["rate is 0", "100mbit"]);
        fails(&iface("rate = 0"), 3, "interface[0].rate", &["rate is 0"]);
        fails(&iface(""), 1, "interface[0].rate", &["missing", "rate = \"100mbit\""]);
        fails(&iface("rate = \"50%\""), 3, "interface[0].rate", &["percentage", "absolute rate"]);
        fails(&iface("rate = \"10mb\""), 3, "interface[0].rate", &["unknown unit \"mb\"", "mbit"]);
        fails(&iface("rate = -5"), 3, "interface[0].rate", &["negative"]);
        assert_eq!(ok(&iface("rate = 1000000")).interfaces[0].rate, "1mbit".parse().unwrap());
        let e = parse(&iface("rate = \"10mb\"")).unwrap_err();
        let source = StdError::source(&e).expect("the rate error is kept");
        assert!(source.downcast_ref::<crate::rate::ParseRateError>().is_some());
    }

    #[test]
    fn interface_missing_name_and_default() {
        let text = format!("[[interface]]\nrate = \"1mbit\"\ndefault = \"guest\"\n{GUEST}");
        fails(&text, 1, "interface[0].name", &["missing", "name = \"eth0\""]);
        let text = format!("[[interface]]\nname = \"lan0\"\nrate = \"1mbit\"\n{GUEST}");
        fails(&text, 1, "interface[0].default", &["missing", "leaf class"]);
    }

    #[test]
    fn overhead_range() {
        let text = |o: i64| format!("{IFACE}overhead = {o}\n{GUEST}");
        assert_eq!(ok(&text(-64)).interfaces[0].overhead, -64);
        assert_eq!(ok(&text(256)).interfaces[0].overhead, 256);
        fails_at(&text(257), "overhead", "interface[0].overhead", &["out of range", "-64..=256"]);
        fails_at(&text(-65), "overhead", "interface[0].overhead", &["out of range"]);
        fails_at(&text(1 << 40), "overhead", "interface[0].overhead", &["out of range"]);
    }

    #[test]
    fn default_class_checks() {
        let two = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "DEFAULT"

[[interface]]
name = "wan0"
rate = "10mbit"
default = "w"

[[class]]
name = "house"
interface = "lan0"
rate = "5mbit"

[[class]]
name = "room"
interface = "lan0"
parent = "house"
rate = "1mbit"

[[class]]
name = "w"
interface = "wan0"
rate = "1mbit"
"#;
        let at = "default = \"DEFAULT\"";
        fails_at(
            &two.replace("DEFAULT", "nobody"),
            at.replace("DEFAULT", "nobody").as_str(),
            "interface[0].default",
            &["no class named \"nobody\"", "leaf class of interface lan0: room"],
        );
        fails_at(
            &two.replace("DEFAULT", "house"),
            "default = \"house\"",
            "interface[0].default",
            &["\"house\" has child classes (room)", "room"],
        );
        fails_at(
            &two.replace("DEFAULT", "w"),
            "default = \"w\"",
            "interface[0].default",
            &["\"w\" is on interface wan0, not lan0", "room"],
        );
        assert_eq!(ok(&two.replace("DEFAULT", "room")).interfaces[0].default_class, "room");
    }

    // ----- classes ----------------------------------------------------------------------

    #[test]
    fn class_rate_zero_or_missing() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"0bit\"\n");
        fails_at(&text, "rate = \"0bit\"", "class[0].rate", &["rate is 0", "rate = \"1mbit\""]);
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\n");
        fails_at(&text, "[[class]]", "class[0].rate", &["missing", "rate = \"1mbit\""]);
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"0%\"\n");
        fails_at(&text, "rate = \"0%\"", "class[0].rate", &["out of range"]);
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"0.01%\"\n").replace("10mbit", "9999bit");
        fails_at(&text, "rate = \"0.01%\"", "class[0].rate", &["rounds down to 0bit"]);
        let text = format!("{IFACE}[[class]]\nrate = \"1mbit\"\n");
        fails_at(&text, "[[class]]", "class[0].name", &["missing"]);
    }

    #[test]
    fn ceil_below_rate() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"2mbit\"\nceil = \"1mbit\"\n");
        fails_at(&text, "ceil", "class[0].ceil", &["ceil 1mbit is below the class's rate 2mbit", "at least the rate"]);
        // Without a ceil, the inherited one applies.
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "5mbit"
ceil = "5mbit"
[[class]]
name = "guest"
parent = "house"
rate = "6mbit"
"#
        );
        fails_at(
            &text,
            "rate = \"6mbit\"",
            "class[1].rate",
            &["rate 6mbit is above the ceil 5mbit inherited from parent class \"house\""],
        );
    }

    #[test]
    fn ceil_above_parent_ceil() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"2mbit\"\nceil = \"20mbit\"\n");
        fails_at(
            &text,
            "ceil",
            "class[0].ceil",
            &["ceil 20mbit is above interface lan0's ceil 10mbit", "at most 10mbit"],
        );
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "5mbit"
ceil = "8mbit"
[[class]]
name = "guest"
parent = "house"
rate = "1mbit"
ceil = "9mbit"
"#
        );
        fails_at(
            &text,
            "ceil = \"9mbit\"",
            "class[1].ceil",
            &["above parent class \"house\"'s ceil 8mbit", "at most 8mbit"],
        );
    }

    #[test]
    fn duplicate_class() {
        let text = format!("{IFACE}{GUEST}{GUEST}");
        fails(
            &text,
            line_of(&text, "name = \"guest\"", 1),
            "class[1].name",
            &["\"guest\" is already defined", &format!("line {}", line_of(&text, "[[class]]", 0))],
        );
    }

    #[test]
    fn bad_class_names() {
        for name in ["", "-x", "a b", "é", &"x".repeat(65)] {
            let text = format!("{IFACE}{GUEST}[[class]]\nname = \"{name}\"\nrate = \"1kbit\"\n");
            fails(&text, line_of(&text, "name = ", 2), "class[1].name", &["invalid class name", "letters, digits"]);
        }
        let text = format!("{IFACE}{GUEST}[[class]]\nname = \"Room_2.b-c\"\nrate = \"1kbit\"\n");
        ok(&text);
    }

    #[test]
    fn class_interface() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\ninterface = \"wan9\"\nrate = \"1mbit\"\n");
        fails_at(&text, "wan9", "class[0].interface", &["no interface named \"wan9\"", "lan0"]);
        let two = format!("{IFACE}[[interface]]\nname = \"wan0\"\nrate = \"1mbit\"\ndefault = \"w\"\n[[class]]\nname = \"w\"\ninterface = \"wan0\"\nrate = \"1mbit\"\n{GUEST}");
        fails(
            &two,
            line_of(&two, "[[class]]", 1),
            "class[1].interface",
            &["missing", "2 interfaces (lan0, wan0)", "interface = \"lan0\""],
        );
        let fixed = two.replace("name = \"guest\"", "name = \"guest\"\ninterface = \"lan0\"");
        assert_eq!(ok(&fixed).class("guest").unwrap().interface, "lan0");
    }

    #[test]
    fn parents() {
        let text = format!("{IFACE}{GUEST}parent = \"nobody\"\n");
        fails_at(&text, "nobody", "class[0].parent", &["no class named \"nobody\"", "interface lan0"]);
        let text = format!("{IFACE}{GUEST}parent = \"guest\"\n");
        fails_at(&text, "parent", "class[0].parent", &["cycle: guest -> guest", "tree"]);
        let text = format!(
            r#"{IFACE}{GUEST}
[[class]]
name = "a"
parent = "c"
rate = "1kbit"
[[class]]
name = "b"
parent = "a"
rate = "1kbit"
[[class]]
name = "c"
parent = "b"
rate = "1kbit"
"#
        );
        fails_at(&text, "parent = \"c\"", "class[1].parent", &["cycle: a -> c -> b -> a"]);
        let text = format!(
            r#"{IFACE}{GUEST}
[[interface]]
name = "wan0"
rate = "1mbit"
default = "w"
[[class]]
name = "w"
interface = "wan0"
parent = "guest"
rate = "1kbit"
"#
        );
        let text = text.replace("name = \"guest\"", "name = \"guest\"\ninterface = \"lan0\"");
        fails_at(
            &text,
            "parent = \"guest\"",
            "class[1].parent",
            &["\"guest\" is on interface lan0, but this class is on wan0"],
        );
    }

    #[test]
    fn children_over_parent_rate() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "4mbit"
[[class]]
name = "alex"
parent = "house"
rate = "1.9mbit"
[[class]]
name = "betty"
parent = "house"
rate = "2.9mbit"
{GUEST}"#
        );
        fails_at(
            &text,
            "rate = \"4mbit\"",
            "class[0].rate",
            &["children of class \"house\"", "add up to 4.8mbit", "alex 1.9mbit + betty 2.9mbit", "its rate 4mbit"],
        );
    }

    #[test]
    fn top_level_over_interface_rate() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "alex"
rate = "5mbit"
[[class]]
name = "betty"
rate = "4.5mbit"
{GUEST}"#
        );
        fails_at(
            &text,
            "rate = \"10mbit\"",
            "interface[0].rate",
            &[
                "top-level classes of interface lan0",
                "add up to 10.5mbit",
                "alex 5mbit + betty 4.5mbit + guest 1mbit",
                "its rate 10mbit",
            ],
        );
        ok(&text.replace("4.5mbit", "4mbit"));
    }

    #[test]
    fn percent_rates_fit_exactly() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "a"
rate = "33.33%"
[[class]]
name = "b"
rate = "33.33%"
[[class]]
name = "guest"
rate = "33.34%"
"#
        );
        let config = ok(&text);
        let sum: u64 = config.classes.iter().map(|c| c.rate.bits_per_sec()).sum();
        assert_eq!(sum, 10_000_000);
    }

    #[test]
    fn prio_and_weight() {
        let text = |extra: &str| format!("{IFACE}{GUEST}{extra}\n");
        fails_at(&text("prio = 8"), "prio", "class[0].prio", &["prio 8 is out of range", "0..=7"]);
        fails_at(&text("prio = -1"), "prio", "class[0].prio", &["out of range"]);
        assert_eq!(ok(&text("prio = 7")).classes[0].prio, 7);
        fails_at(&text("weight = 0"), "weight", "class[0].weight", &["weight 0 is invalid", "positive integer"]);
        fails_at(&text("weight = -3"), "weight", "class[0].weight", &["positive integer"]);
        fails_at(&text("weight = 4294967296"), "weight", "class[0].weight", &["positive integer"]);
        assert_eq!(ok(&text("weight = 4294967295")).classes[0].weight, Some(u32::MAX));
    }

    #[test]
    fn too_many_classes() {
        let mut text = IFACE.replace("10mbit", "10gbit");
        for n in 0..=MAX_CLASSES {
            let _ = write!(text, "[[class]]\nname = \"c{n}\"\nrate = \"1kbit\"\n");
        }
        let line = line_of(&text, "[[class]]", MAX_CLASSES);
        fails(&text, line, "class[1024]", &["too many classes (1025)", "at most 1024"]);
        // Exactly the maximum is fine.
        let cut = text.lines().take(line - 1).collect::<Vec<_>>().join("\n");
        let cut = cut.replace("default = \"guest\"", "default = \"c0\"");
        assert_eq!(ok(&cut).classes.len(), MAX_CLASSES);
    }

    #[test]
    fn deep_tree_and_shared_ancestors() {
        // A chain as deep as the class table allows validates quickly.
        let mut text = IFACE.replace("guest", &format!("c{}", MAX_CLASSES - 1));
        for n in 0..MAX_CLASSES {
            let parent = if n == 0 { String::new() } else { format!("parent = \"c{}\"\n", n - 1) };
            let _ = write!(text, "[[class]]\nname = \"c{n}\"\n{parent}rate = \"1kbit\"\n");
        }
        let config = ok(&text);
        assert_eq!(config.leaves().count(), 1);
        assert_eq!(config.classes[MAX_CLASSES - 1].ceil, "10mbit".parse().unwrap());
        // A class whose ancestors loop is reported at the loop, not at the class.
        let text = format!(
            r#"{IFACE}{GUEST}
[[class]]
name = "leaf"
parent = "x"
rate = "1kbit"
[[class]]
name = "x"
parent = "y"
rate = "1kbit"
[[class]]
name = "y"
parent = "x"
rate = "1kbit"
"#
        );
        fails_at(&text, "parent = \"y\"", "class[2].parent", &["cycle: x -> y -> x"]);
    }

    // ----- rules ------------------------------------------------------------------------

    /// [`IFACE`] with a tree: house (a parent) with room, and guest.
    fn with_rule(rule: &str) -> String {
        format!(
            "{IFACE}{GUEST}[[class]]\nname = \"house\"\nrate = \"2mbit\"\n[[class]]\nname = \"room\"\nparent = \"house\"\nrate = \"1mbit\"\n\n[[rule]]\nclass = \"room\"\n\n[[rule]]\n{rule}\n"
        )
    }

    #[test]
    fn rule_class() {
        fails_at(
            &with_rule("class = \"nobody\""),
            "nobody",
            "rule[1].class",
            &["no class named \"nobody\"", "guest, room"],
        );
        fails_at(
            &with_rule("class = \"house\""),
            "class = \"house\"",
            "rule[1].class",
            &["\"house\" has child classes (room)", "leaf class: guest, room"],
        );
        let text = with_rule("src = \"10.0.0.1\"");
        fails(&text, line_of(&text, "[[rule]]", 1), "rule[1].class", &["missing", "class = \"guest\""]);
        let config = ok(&with_rule("class = \"guest\""));
        assert_eq!(config.rules[1].index, 1);
        assert_eq!(config.rules[1].line, line_of(&with_rule(""), "[[rule]]", 1));
        // A rule with no match field is a catch-all.
        assert_eq!(
            config.rules[1],
            Rule {
                index: 1,
                line: config.rules[1].line,
                class: "guest".into(),
                src: None,
                dst: None,
                proto: None,
                sport: None,
                dport: None,
                mark: None,
                dscp: None
            }
        );
    }

    #[test]
    fn rule_networks() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        let config = ok(&rule("src = \"192.168.1.0/24\"\ndst = \"10.0.0.1\""));
        assert_eq!(config.rules[1].src, Some("192.168.1.0/24".parse().unwrap()));
        assert_eq!(config.rules[1].dst, Some("10.0.0.1/32".parse().unwrap()));
        let config = ok(&rule("src = \"fd00:1::110\"\ndst = \"fd00::/8\""));
        assert_eq!(config.rules[1].src, Some("fd00:1::110/128".parse().unwrap()));
        fails_at(
            &rule("src = \"192.168.1.300\""),
            "src",
            "rule[1].src",
            &["not an IP address or a CIDR network", "192.168.1.0/24"],
        );
        fails_at(&rule("dst = \"10.0.0.0/33\""), "dst", "rule[1].dst", &["not a CIDR network"]);
        fails_at(&rule("src = \"192.168.1.5/24\""), "src", "rule[1].src", &["host bits set", "\"192.168.1.0/24\""]);
        fails_at(&rule("src = \"fd00:1::110/64\""), "src", "rule[1].src", &["host bits set", "\"fd00:1::/64\""]);
        fails_at(
            &rule("src = \"10.0.0.0/8\"\ndst = \"fd00::/8\""),
            "dst",
            "rule[1].dst",
            &["different address families"],
        );
        let e = parse(&rule("src = \"nonsense\"")).unwrap_err();
        assert!(StdError::source(&e).is_some(), "the address parse error is kept");
    }

    #[test]
    fn rule_ports() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        let config = ok(&rule("proto = \"udp\"\nsport = \"53\"\ndport = \" 1024 - 65535 \""));
        assert_eq!(config.rules[1].sport, Some(PortRange { start: 53, end: 53 }));
        assert_eq!(config.rules[1].dport, Some(PortRange { start: 1024, end: 65535 }));
        assert_eq!(ok(&rule("dport = 0")).rules[1].dport, Some(PortRange { start: 0, end: 0 }));
        assert_eq!(ok(&rule("proto = 6\ndport = 80")).rules[1].proto, Some(6));
        fails_at(&rule("dport = 70000"), "dport", "rule[1].dport", &["port 70000 is out of range", "0..=65535"]);
        fails_at(&rule("sport = \"70000\""), "sport", "rule[1].sport", &["port 70000 is out of range"]);
        fails_at(&rule("dport = \"1-99999999999999999999999\""), "dport", "rule[1].dport", &["out of range"]);
        fails_at(&rule("dport = -1"), "dport", "rule[1].dport", &["out of range"]);
        fails_at(&rule("dport = \"4095-3072\""), "dport", "rule[1].dport", &["reversed", "\"3072-4095\""]);
        fails_at(&rule("dport = \"http\""), "dport", "rule[1].dport", &["invalid port range", "\"A-B\""]);
        fails_at(&rule("dport = \"1-2-3\""), "dport", "rule[1].dport", &["invalid port range"]);
        fails_at(
            &rule("proto = \"icmp\"\ndport = 80"),
            "dport",
            "rule[1].dport",
            &["needs proto tcp or udp", "\"icmp\""],
        );
        fails_at(&rule("proto = \"sctp\"\nsport = 80"), "sport", "rule[1].sport", &["needs proto tcp or udp"]);
    }

    #[test]
    fn rule_proto() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        for (name, number) in [
            ("tcp", 6),
            ("UDP", 17),
            ("icmp", 1),
            ("icmpv6", 58),
            ("sctp", 132),
            ("gre", 47),
            ("esp", 50),
            ("\"47\"", 47),
        ] {
            let value = if name.starts_with('"') { name.to_owned() } else { format!("\"{name}\"") };
            assert_eq!(ok(&rule(&format!("proto = {value}"))).rules[1].proto, Some(number), "{name}");
        }
        assert_eq!(ok(&rule("proto = 255")).rules[1].proto, Some(255));
        fails_at(&rule("proto = 256"), "proto", "rule[1].proto", &["out of range", "0..=255", "tcp"]);
        fails_at(&rule("proto = \"tcpp\""), "proto", "rule[1].proto", &["unknown protocol \"tcpp\"", "udp"]);
        fails_at(
            &rule("proto = \"icmp\"\nsrc = \"fd00::/8\""),
            "proto",
            "rule[1].proto",
            &["never matches IPv6", "icmpv6"],
        );
        fails_at(
            &rule("proto = \"icmpv6\"\ndst = \"10.0.0.1\""),
            "proto",
            "rule[1].proto",
            &["never matches IPv4", "\"icmp\""],
        );
    }

    #[test]
    fn rule_mark() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        assert_eq!(ok(&rule("mark = 0x10")).rules[1].mark, Some(16));
        assert_eq!(ok(&rule("mark = 0xffffffff")).rules[1].mark, Some(u32::MAX));
        assert_eq!(ok(&rule("mark = 0")).rules[1].mark, Some(0));
        fails_at(&rule("mark = -1"), "mark", "rule[1].mark", &["out of range", "0xffffffff"]);
        fails_at(&rule("mark = 0x100000000"), "mark", "rule[1].mark", &["out of range"]);
        fails_at(&rule("mark = \"0x10\""), "mark", "rule[1].mark", &["is a string", "mark = 0x10"]);
    }

    #[test]
    fn rule_dscp() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        for (value, want) in [
            ("46", 46),
            ("0", 0),
            ("63", 63),
            ("\"ef\"", 46),
            ("\"EF\"", 46),
            ("\"le\"", 1),
            ("\"cs0\"", 0),
            ("\"cs1\"", 8),
            ("\"cs7\"", 56),
            ("\"af11\"", 10),
            ("\"af12\"", 12),
            ("\"af13\"", 14),
            ("\"af21\"", 18),
            ("\"af31\"", 26),
            ("\"af42\"", 36),
            ("\"af43\"", 38),
            ("\"12\"", 12),
        ] {
            assert_eq!(ok(&rule(&format!("dscp = {value}"))).rules[1].dscp, Some(want), "{value}");
        }
        fails_at(&rule("dscp = 64"), "dscp", "rule[1].dscp", &["DSCP 64 is out of range", "0..=63", "af41"]);
        fails_at(&rule("dscp = -1"), "dscp", "rule[1].dscp", &["out of range"]);
        for bad in ["cs8", "af14", "af51", "af1", "af111", "voice", "cs"] {
            fails_at(&rule(&format!("dscp = \"{bad}\"")), "dscp", "rule[1].dscp", &["unknown DSCP", "cs0..cs7"]);
        }
    }

    #[test]
    fn locate_key_paths() {
        let text = "top = 1\n[daemon]\ntick = \"1ms\"\n[[class]]\nname = \"a\"\n[[class]]\nname = \"b\"\nx = { y = [1, { z = 2 }] }\n";
        let at = |needle: &str| locate_key(text, text.find(needle).unwrap());
        assert_eq!(at("top").as_deref(), Some("top"));
        assert_eq!(at("tick").as_deref(), Some("daemon.tick"));
        assert_eq!(at("\"1ms\"").as_deref(), Some("daemon.tick"));
        assert_eq!(at("name = \"a\"").as_deref(), Some("class[0].name"));
        assert_eq!(at("\"b\"").as_deref(), Some("class[1].name"));
        assert_eq!(at("z = 2").as_deref(), Some("class[1].x.y[1].z"));
        assert_eq!(locate_key("not toml [", 3), None);
    }

    #[test]
    fn error_accessors_and_display() {
        let text = format!("{IFACE}{GUEST}prio = 9\n");
        let e = parse(&text).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { .. }));
        let line = line_of(&text, "prio", 0);
        assert_eq!(
            e.to_string(),
            format!("{PATH}:{line}: class[0].prio: prio 9 is out of range; expected 0..=7 (lower is served first)")
        );
        assert!(StdError::source(&e).is_none());
    }

    #[test]
    fn port_range_helpers() {
        let range = PortRange { start: 3072, end: 4095 };
        assert!(range.contains(3072) && range.contains(4095) && !range.contains(4096));
        assert_eq!(range.to_string(), "3072-4095");
        assert_eq!(PortRange { start: 80, end: 80 }.to_string(), "80");
    }
}
