//! The validated configuration: [`Config`] and the tables it holds, the limits and defaults
//! they are checked against, and [`Config::load`] and [`Config::parse`], which build it.

use std::collections::HashSet;
use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use super::error::ConfigError;
use super::raw::{syntax_error, LineIndex, RawConfig};
use super::validate::Validator;
use crate::rate::Rate;

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

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The file it was read from (as given to [`Config::load`] or [`Config::parse`]).
    pub path: PathBuf,
    /// The text it was parsed from; runtime changes ([`edit`](super::edit)) are made to it.
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

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;

    use super::*;
    use crate::config::test_util::{line_of, ok, GUEST, IFACE, PATH};

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

    #[test]
    fn port_range_helpers() {
        let range = PortRange { start: 3072, end: 4095 };
        assert!(range.contains(3072) && range.contains(4095) && !range.contains(4096));
        assert_eq!(range.to_string(), "3072-4095");
        assert_eq!(PortRange { start: 80, end: 80 }.to_string(), "80");
    }
}
