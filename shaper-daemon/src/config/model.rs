//! The validated configuration: [`Config`] and the tables it holds, the limits and defaults
//! they are checked against, and [`Config::load`] and [`Config::parse`], which build it.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::ops::RangeInclusive;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;

use super::error::ConfigError;
use super::raw::{syntax_error, LineIndex, RawConfig};
use super::validate::Validator;
use crate::rate::Rate;
use crate::rules::TcpFlags;

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
/// Valid values of an interface's `mpu`, in bytes: CAKE's range. The largest minimum a link
/// pads to is Ethernet's 84 bytes on the wire (64 and the preamble, SFD and gap), plus what
/// an encapsulation around it adds.
pub const MPU_RANGE: RangeInclusive<u32> = 0..=256;
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

    /// The LAN-side interfaces of all upload interfaces (`lan`), each once, in file order.
    #[must_use]
    pub fn lan_interfaces(&self) -> Vec<&str> {
        let mut names: Vec<&str> = Vec::new();
        for name in self.interfaces.iter().flat_map(|i| &i.lan) {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
        names
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

    /// Each class's position in `classes`, by name: for lookups of many names (one
    /// [`Config::class`] is a walk of the classes).
    #[must_use]
    pub fn class_positions(&self) -> HashMap<&str, usize> {
        self.classes.iter().enumerate().map(|(n, c)| (c.name.as_str(), n)).collect()
    }

    /// Whether each class (in file order) is a leaf: [`Config::is_leaf`] of every class in one
    /// pass.
    #[must_use]
    pub fn leaf_flags(&self) -> Vec<bool> {
        let parents: HashSet<&str> = self.classes.iter().filter_map(|c| c.parent.as_deref()).collect();
        self.classes.iter().map(|c| !parents.contains(c.name.as_str())).collect()
    }

    /// The leaf classes, in file order.
    pub fn leaves(&self) -> impl Iterator<Item = &Class> + '_ {
        self.classes.iter().zip(self.leaf_flags()).filter_map(|(c, leaf)| leaf.then_some(c))
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
    /// Least bytes a packet counts, its overhead added (`mpu`), within [`MPU_RANGE`]; 0 by
    /// default.
    pub mpu: u32,
    /// How the line carries each frame (`linklayer`).
    pub linklayer: LinkLayer,
    /// Whether the daemon may replace an existing root qdisc (`replace_qdisc`).
    pub replace_qdisc: bool,
    /// Which way the interface carries traffic, and so which address is a packet's host.
    pub direction: Direction,
    /// The LAN-side interfaces of a gateway that translates its hosts' addresses on this
    /// (upload) interface (`lan`): their packets are classified by the addresses and ports
    /// they had there. Empty: by what they carry here.
    pub lan: Vec<String>,
}

/// How an interface's line carries each frame (`linklayer`): the datapath counts a packet as
/// the bytes it takes there (`shaper_common::frame_wire_len`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LinkLayer {
    /// As it is, plus the overhead.
    #[default]
    Ethernet,
    /// ADSL's ATM cells: 48 bytes of payload in 53, the last cell padded.
    Atm,
    /// VDSL2's PTM (64b/65b): a byte more per 64 bytes or part of them.
    Ptm,
}

impl LinkLayer {
    /// The value of `IfaceConfig::linklayer`.
    #[must_use]
    pub fn datapath(self) -> u32 {
        match self {
            LinkLayer::Ethernet => shaper_common::LINKLAYER_ETHERNET,
            LinkLayer::Atm => shaper_common::LINKLAYER_ATM,
            LinkLayer::Ptm => shaper_common::LINKLAYER_PTM,
        }
    }
}

impl fmt::Display for LinkLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            LinkLayer::Ethernet => "ethernet",
            LinkLayer::Atm => "atm",
            LinkLayer::Ptm => "ptm",
        })
    }
}

/// Which way an interface carries traffic (`direction`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direction {
    /// Towards the internet: a packet's host is its source address.
    #[default]
    Upload,
    /// Towards the hosts: a packet's host is its destination address.
    Download,
    /// What arrives on the interface is shaped (its download, on a WAN interface), through
    /// an IFB device that shaperd creates: a packet's host is its destination address.
    Ingress,
}

impl Direction {
    /// Whether a packet's host is its destination address.
    #[must_use]
    pub fn towards_hosts(self) -> bool {
        matches!(self, Direction::Download | Direction::Ingress)
    }
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
    /// The DSCP the class's packets leave with.
    pub marking: Marking,
    /// Line of the class's `[[class]]` header (1-based).
    pub line: usize,
}

/// The DSCP a class gives its packets; `None`: as they came.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Marking {
    /// Every packet's (`set_dscp`; 0 washes the hosts' marks).
    pub set: Option<u8>,
    /// The packets beyond the class's guaranteed rate (`set_dscp_over`): out of profile,
    /// re-marked to a lower class as a `DiffServ` marker does.
    pub over: Option<u8>,
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
    /// IP length range, bytes (see [`crate::rules::PacketFields::len`]).
    pub len: Option<PortRange>,
    /// TCP flags; the rule then matches TCP packets only.
    pub tcp_flags: Option<TcpFlags>,
    /// ICMP type (IPv4) or `ICMPv6` type (IPv6, when `proto` is icmpv6 or the networks are
    /// IPv6); the rule then matches that protocol's packets only.
    pub icmp_type: Option<u8>,
    /// Ethernet source address (never all zero).
    pub src_mac: Option<[u8; 6]>,
}

/// An inclusive range of ports (or of IP lengths, for `len`), `start <= end`.
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
                mpu: 0,
                linklayer: LinkLayer::Ethernet,
                replace_qdisc: false,
                direction: Direction::Upload,
                lan: Vec::new(),
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
                marking: Marking::default(),
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
mpu = 64
linklayer = "ptm"
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
len = "0-63"
tcp_flags = "pure-ack"
src_mac = "02:00:00:00:01:10"
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
        assert_eq!((iface.mpu, iface.linklayer), (64, LinkLayer::Ptm));
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
                len: Some(PortRange { start: 0, end: 63 }),
                tcp_flags: Some(TcpFlags { value: 0x10, mask: 0x3f, no_payload: true }),
                icmp_type: None,
                src_mac: Some([2, 0, 0, 0, 1, 0x10]),
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
        assert_eq!(config.leaf_flags(), [false, true, true, true]);
        let at = config.class_positions();
        assert_eq!((at["house"], at["b"], at["guest"], at.get("nobody")), (0, 2, 3, None));
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
        for seed in ["seed-001-download", "seed-002-diffserv", "seed-003-dsl-uplink", "seed-004-lab"] {
            assert!(loaded.contains(&format!("{seed}.toml")), "{seed}: {loaded:?}");
        }
    }

    /// Each seed's setup says what its script says: the figures the seeds' tables were
    /// measured with.
    #[test]
    fn seed_examples() {
        let load = |name: &str| {
            let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config").join(name);
            Config::load(&path).unwrap_or_else(|e| panic!("{e}"))
        };
        let classes = |config: &Config| -> Vec<(String, u64, u64, u8)> {
            config
                .classes
                .iter()
                .map(|c| (c.name.clone(), c.rate.bits_per_sec(), c.ceil.bits_per_sec(), c.prio))
                .collect()
        };
        let owned = |v: &[(&str, u64, u64, u8)]| -> Vec<(String, u64, u64, u8)> {
            v.iter().map(|&(n, r, c, p)| (n.to_owned(), r, c, p)).collect()
        };

        let c001 = load("seed-001-download.toml");
        assert_eq!(c001.interfaces[0].direction, Direction::Download);
        assert_eq!(classes(&c001), owned(&[("bulk", 200_000, 900_000, 1), ("browsing", 700_000, 900_000, 0)]));

        let c002 = load("seed-002-diffserv.toml");
        assert_eq!(
            classes(&c002),
            owned(&[
                ("voip", 100_000, 100_000, 0),
                ("audio", 100_000, 100_000, 1),
                ("video", 1_100_000, 1_100_000, 2),
                ("best-effort", 8_000_000, 8_000_000, 3),
            ])
        );
        assert_eq!(c002.class("voip").unwrap().marking.set, Some(46));
        assert_eq!(c002.class("best-effort").unwrap().marking.set, Some(0));
        assert_eq!(c002.rules.iter().filter(|r| r.dst.is_some()).count(), 3);

        let c003 = load("seed-003-dsl-uplink.toml");
        let iface = &c003.interfaces[0];
        assert_eq!((iface.linklayer, iface.overhead, iface.rate.bits_per_sec()), (LinkLayer::Atm, 18, 608_000));
        assert_eq!(
            classes(&c003),
            owned(&[
                ("interactive", 53_000, 608_000, 1),
                ("normal", 371_000, 608_000, 2),
                ("bulk", 69_000, 608_000, 3),
                ("p2p", 69_000, 608_000, 4),
            ])
        );
        assert!(c003.rules.iter().any(|r| r.class == "interactive" && r.tcp_flags.is_some()));

        let c004 = load("seed-004-lab.toml");
        assert_eq!(
            classes(&c004),
            owned(&[
                ("port-5001", 6_000_000, 6_000_000, 0),
                ("port-5002", 4_000_000, 8_000_000, 1),
                ("other", 1_000_000, 1_000_000, 2)
            ])
        );
        assert_eq!(c004.rules.iter().filter(|r| r.mark.is_some()).count(), 2);
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
