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
//! # Where things are
//!
//! - `model.rs`: the validated types ([`Config`], [`Class`], [`Rule`], ...), their limits
//!   and defaults, and [`Config::load`] and [`Config::parse`].
//! - `raw.rs`: the structures serde reads the TOML into, and the line, column and key of
//!   what the TOML reader rejects.
//! - `values.rs`: single values: durations, rates, names, protocols, DSCP, ports, marks,
//!   networks.
//! - `validate/`: the checks of each table (`daemon.rs`, `interfaces.rs`, `classes.rs`,
//!   `rules.rs`) and of each class tree (`tree.rs`: parents, rates, ceils, defaults).
//! - `error.rs`: [`ConfigError`].
//! - `edit.rs` and `diff.rs`: runtime changes to the text, and what differs between two
//!   configurations.
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
//! mpu = 0                # optional: least bytes a packet counts, overhead included, 0..=256
//! linklayer = "ethernet" # optional: "ethernet" (default), "atm" (ADSL: 48-byte cells in 53)
//!                        # or "ptm" (VDSL2: a byte more per 64)
//! replace_qdisc = false  # optional: may the daemon replace an existing root qdisc
//! direction = "upload"   # optional: "upload" (the hosts send: a packet's host is its
//!                        # source) or "download" (its destination); default "upload"
//!                        # "ingress": the packets arriving on it are shaped (a WAN's
//!                        # download, shared by all LAN interfaces), hosts = destinations,
//!                        # through an IFB device shaperd creates ("ifb-" + the name)
//! lan = ["lan0"]         # optional, upload only: the interfaces the hosts send from, on a
//!                        # gateway that translates their addresses here (masquerade):
//!                        # packets are classified by the source they had there
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
//! set_dscp = "af11"      # optional: the DSCP its packets leave with (0..=63 or a name;
//!                        # "wash" = 0), ECN bits kept
//! set_dscp_over = "cs1"  # optional: the DSCP of its packets beyond its guaranteed rate
//!                        # (a meter at `rate` with a burst of four full frames)
//!
//! [[rule]]               # first matching rule wins, in file order
//! class = "alex"         # a leaf class
//! src = "192.168.1.110"  # optional: src, dst, proto, sport, dport, mark, dscp, len,
//!                        # tcp_flags, icmp_type, src_mac
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
//! `dscp` is 0..=63 or a name (`cs0`..`cs7`, `af11`..`af43`, `ef`, `le`), IPv4 or IPv6;
//! `len` is the IP length in bytes (IPv4 total length, IPv6 payload length + 40; one
//! segment's for a GSO packet), a value or an inclusive range like ports (`"0-63"`);
//! `tcp_flags` is a list of flag names (`fin`, `syn`, `rst`, `psh`, `ack`, `urg`, `ece`,
//! `cwr`) that must be exactly the ones set among the first six (`"syn"`, `"syn,ack"`,
//! `"ack"`), or `FLAGS / MASK` to compare only the flags in MASK (`"syn / syn"`: SYN set), or
//! `"pure-ack"` (ACK alone and no payload); `icmp_type` is a number or a name
//! (`echo-request`, ...) of ICMP or `ICMPv6`, as `proto` or the rule's src/dst says;
//! `src_mac` is the Ethernet source address (`"02:00:00:00:01:10"`), which only the
//! interface the host's frames reach still carries, or a routed upload interface whose `lan`
//! interfaces record it with each flow's origin. A
//! rule applies to the packets leaving its class's interface; a rule with no match field
//! matches every such packet.

pub mod diff;
pub mod edit;
mod error;
mod model;
mod raw;
#[cfg(test)]
pub(crate) mod test_util;
mod validate;
mod values;

pub use error::ConfigError;
pub use model::{
    Aqm, Class, Config, DaemonSettings, Direction, Interface, Isolation, LinkLayer, Marking, PortRange, Rule,
    AQM_INTERVAL_RANGE, AQM_TARGET_RANGE, DEFAULT_AQM, DEFAULT_HORIZON, DEFAULT_METRICS_LISTEN, DEFAULT_TICK,
    HORIZON_RANGE, MAX_CLASSES, MAX_INTERFACES, MAX_PRIO, MPU_RANGE, OVERHEAD_RANGE, TICK_RANGE,
};
