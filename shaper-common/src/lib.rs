//! Types shared by the tc program (`shaper-ebpf`) and userspace (`shaper-daemon`).
//!
//! Every struct here is a BPF map key or value: `#[repr(C)]`, no `bool`, explicit padding
//! and a compile-time size assertion, so that the kernel side and the userspace side agree
//! byte for byte. The `user` feature adds `aya::Pod` implementations.
#![no_std]
// Padding fields are public so both sides can build the structs with literals.
#![allow(clippy::pub_underscore_fields)]

/// Most classes across all interfaces. Class ids index the class arrays directly.
pub const MAX_CLASSES: u32 = 1024;
/// Most shaped interfaces.
pub const MAX_INTERFACES: u32 = 64;
/// Most distinct rule shapes ("tuples"). A packet costs one hash lookup per tuple that can
/// still beat the best match found so far, whatever the number of rules.
pub const MAX_TUPLES: u32 = 32;
/// Rule sets are double-buffered: `TUPLES`, `SPORT_IDS` and `DPORT_IDS` hold two banks
/// (bank `b` starts at `b * MAX_TUPLES` and `b * PORT_SLOTS`), and a tuple's id in `RULES`
/// keys is its `TUPLES` index, so the two banks' entries never collide. The daemon writes a
/// new rule set into the inactive bank and switches `Globals` in one write: a packet sees the
/// old rules or the new ones, never a mix.
pub const RULE_BANKS: u32 = 2;
/// Most compiled rule entries per bank (one rule with a port range may need several).
pub const MAX_RULE_ENTRIES: u32 = 65536;
/// Port interval ids (one array slot per port number).
pub const PORT_SLOTS: u32 = 65536;

/// Hosts (or flows) remembered for isolation inside classes (`HOSTS`, an LRU hash).
pub const HOST_SLOTS: u32 = 65536;

/// Flows remembered for sparse-flow priority (`FLOWS`, an LRU hash: the least recently
/// seen flow is forgotten first).
pub const FLOW_SLOTS: u32 = 65536;

/// A sparse flow's packets may use at most `1 / SPARSE_SHARE` of their class's rate ahead of
/// the class's queue (a budget kept by `ClassState::sparse_next_ns`); the rest wait in the queue.
pub const SPARSE_SHARE: u64 = 16;
/// A sparse packet leaves ahead of its class's queue only while that queue is at most this
/// many full-size frames long at the class's rate. With [`SPARSE_SHARE`], this bounds what
/// sparse packets can add to the class's rate over any window to half a frame.
pub const SPARSE_MAX_QUEUE_FRAMES: u64 = 8;
/// A full-size Ethernet frame (1500-byte MTU plus the 14-byte header), in bytes.
pub const FULL_FRAME: u64 = 1514;

/// How long `frames` full-size frames take at `bytes_per_sec`, ns (0 at a rate of 0).
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn frames_ns(frames: u64, bytes_per_sec: u64) -> u64 {
    match (frames * FULL_FRAME * 1_000_000_000).checked_div(bytes_per_sec) {
        Some(ns) => ns,
        None => 0,
    }
}

/// Buckets of the per-class added-delay histogram.
pub const DELAY_BUCKETS: usize = 16;
/// The smallest bucket's upper bound (ns); bucket `i < DELAY_BUCKETS - 1` counts packets whose
/// added delay is at most `DELAY_BUCKET_BASE_NS << i` (125 µs, 250 µs, ... 2.048 s) and above
/// the previous bound; the last bucket counts the rest.
pub const DELAY_BUCKET_BASE_NS: u64 = 125_000;

/// The histogram bucket of an added delay (see [`DELAY_BUCKET_BASE_NS`]).
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub fn delay_bucket(delay_ns: u64) -> usize {
    let mut i = 0;
    while i < DELAY_BUCKETS - 1 && delay_ns > DELAY_BUCKET_BASE_NS << i {
        i += 1;
    }
    i
}

/// The version of the maps' layout (their key and value types and sizes). Pinned maps live in
/// a directory named after it, so a shaperd whose maps differ never opens the pins of another:
/// bump it whenever a map definition or a struct in this file changes.
pub const MAP_LAYOUT_VERSION: u32 = 5;

/// Map names, as they appear in the object file.
pub mod maps {
    pub const IFACES: &str = "IFACES";
    pub const TUPLES: &str = "TUPLES";
    pub const RULES: &str = "RULES";
    pub const SPORT_IDS: &str = "SPORT_IDS";
    pub const DPORT_IDS: &str = "DPORT_IDS";
    pub const CLASS_CONFIG: &str = "CLASS_CONFIG";
    pub const CLASS_STATE: &str = "CLASS_STATE";
    pub const CLASS_STATS: &str = "CLASS_STATS";
    pub const GLOBALS: &str = "GLOBALS";
    pub const FLOWS: &str = "FLOWS";
    pub const HOSTS: &str = "HOSTS";
    pub const LINKS: &str = "LINKS";
    /// Every map, for pinning.
    pub const ALL: [&str; 12] = [
        IFACES,
        TUPLES,
        RULES,
        SPORT_IDS,
        DPORT_IDS,
        CLASS_CONFIG,
        CLASS_STATE,
        CLASS_STATS,
        GLOBALS,
        FLOWS,
        HOSTS,
        LINKS,
    ];
}

/// Name of the tc program in the object file.
pub const PROGRAM_NAME: &str = "shaper_egress";
/// Name of the program that only returns `TC_ACT_OK`, the benchmarks' baseline.
pub const PASS_PROGRAM_NAME: &str = "shaper_pass";

/// `IfaceConfig::flags`: the interface is shaped (the slot is in use).
pub const IFACE_ENABLED: u32 = 1;
/// `IfaceConfig::flags`: the interface has no link-layer header (tun, WireGuard, PPP), so
/// packets start with the IP header.
pub const IFACE_L3: u32 = 2;
/// `IfaceConfig::flags`: the interface carries downloads (towards the hosts): a class's hosts
/// are its packets' destination addresses. Without it (uploads), their source addresses.
pub const IFACE_DOWNLOAD: u32 = 4;

/// `ClassConfig::isolation`: no isolation inside the class.
pub const ISOLATE_NONE: u32 = 0;
/// `ClassConfig::isolation`: the class's rate is shared fairly between its hosts.
pub const ISOLATE_HOST: u32 = 1;
/// `ClassConfig::isolation`: the class's rate is shared fairly between its flows.
pub const ISOLATE_FLOW: u32 = 2;

/// Per-interface settings, keyed by ifindex in `IFACES`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceConfig {
    /// Interface slot: the `iface` field of rule keys.
    pub slot: u32,
    /// Class of packets that match no rule (and of packets that cannot be parsed).
    pub default_class: u32,
    /// Bytes added to every packet on the wire (PPPoE, ATM cell framing, preamble...).
    /// May be negative, as with tc's `overhead`, to subtract headers the link does not carry.
    pub overhead: i32,
    pub flags: u32,
    /// The rate of the interface's link clock (`LINKS`, indexed by `slot`), bytes/s: the
    /// link's rate plus [`LINK_SLACK_PERCENT`]; 0: no link clock.
    pub link_bytes: u64,
}

/// The link clock runs this much faster than the link. Every paced packet takes its time on
/// the wire from it, so it tells how far ahead the link's departures are committed; quiet
/// classes wait behind it (see [`CLASS_QUIET`]). The busy classes' rates add up to the link,
/// plus the headroom of those that are not limited: at exactly the link's rate, the clock
/// would drift ahead of the departures it stands for.
pub const LINK_SLACK_PERCENT: u64 = 2;

/// `ClassConfig::flags`: the class is quiet, paced at its wake rate (what it would get if it
/// woke) rather than at an allocation, which the other classes' rates leave no room for.
/// Its packets leave no earlier than the link clock, behind the departures the busy classes
/// have been given, until the next tick allocates it its share; a packet of a sparse flow
/// (one per 10 ms or less, within the sparse budget) still leaves at once.
pub const CLASS_QUIET: u32 = 1;

/// `ClassConfig::flags`: the class is paced above its guarantee, on bandwidth the allocator
/// lent it. Its packets leave no earlier than the quiet classes' packets held behind the link
/// clock (`LinkState::hold_ns`): a class that wakes takes its first packets' time from the
/// borrowers, as HTB serves it ahead of them, rather than on top of what they were given.
/// Classes within their guarantee are never held.
pub const CLASS_BORROWING: u32 = 2;

/// The link's state, one per interface slot in `LINKS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LinkState {
    /// The link clock: when the bytes paced so far will have left at the link's rate (plus
    /// its slack, `IfaceConfig::link_bytes`).
    pub next_ns: u64,
    /// When the packets quiet classes were given behind the link clock will have left; the
    /// borrowers' packets wait for it ([`CLASS_BORROWING`]).
    pub hold_ns: u64,
}

/// Number of tuples in use, and other global knobs; one entry in `GLOBALS`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Globals {
    /// How many tuples the active rule bank has (packed from the bank's first `TUPLES` slot).
    pub tuple_count: u32,
    /// The active rule bank, 0 or 1 (see [`RULE_BANKS`]).
    pub bank: u32,
    /// The daemon's tick count: the datapath counts each host once per epoch
    /// (`ClassStats::hosts_near`, `hosts_over`).
    pub epoch: u32,
    pub _pad: u32,
}

/// The fields a packet is classified on. The same layout is the key of `RULES`: a rule is
/// stored with every field it does not test zeroed, and the packet's key is masked by the
/// rule's tuple before the lookup.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct RuleKey {
    /// Tuple id (set from the tuple, not from the packet).
    pub tuple: u16,
    /// Interface slot; always part of the match.
    pub iface: u16,
    /// 4 or 6; 0 for packets that are neither.
    pub family: u8,
    /// IP protocol number (for IPv6: the upper-layer protocol after extension headers).
    pub proto: u8,
    /// DSCP, the upper six bits of the TOS / traffic class byte.
    pub dscp: u8,
    pub _pad: u8,
    /// `skb->mark` (fwmark).
    pub mark: u32,
    /// Source port interval id (0: the packet has no ports).
    pub sport: u16,
    /// Destination port interval id (0: the packet has no ports).
    pub dport: u16,
    /// Source address; IPv4 addresses use the first four bytes.
    pub src: [u8; 16],
    /// Destination address; IPv4 addresses use the first four bytes.
    pub dst: [u8; 16],
}

/// `RuleKey` as 64-bit words, the unit in which tuple masks are applied.
pub const RULE_KEY_WORDS: usize = 6;

/// One tuple: the mask of the fields that its rules test, and the smallest rule index
/// (file order) among its rules, so the datapath can stop once no later tuple can win.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuple {
    pub mask: [u64; RULE_KEY_WORDS],
    pub min_rule: u32,
    pub _pad: u32,
}

/// Value of a `RULES` entry.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleTarget {
    /// Position of the rule in the configuration (first rule = 0); lower wins.
    pub rule: u32,
    /// Class id.
    pub class: u32,
}

/// Per-class pacing parameters, written by the daemon (`CLASS_CONFIG`, indexed by class id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassConfig {
    /// Current rate in bytes per second; 0 means the class is not in use (packets pass
    /// unpaced and are counted as `unpaced`).
    pub rate_bytes: u64,
    /// Packets that would leave later than `now + horizon_ns` are dropped.
    pub horizon_ns: u64,
    /// How far behind now the class's clock may restart after it fell behind (idle, or
    /// sending below its rate): the class may send that much at once (one full frame at its
    /// rate, HTB's burst).
    pub burst_ns: u64,
    /// CoDel on the departure delay: target and interval (RFC 8289); a target of 0 turns the
    /// AQM off for the class.
    pub codel_target_ns: u64,
    pub codel_interval_ns: u64,
    /// Isolation inside the class: [`ISOLATE_NONE`], [`ISOLATE_HOST`] or [`ISOLATE_FLOW`].
    pub isolation: u32,
    /// [`CLASS_QUIET`] or [`CLASS_BORROWING`], or 0.
    pub flags: u32,
    /// One host's (or flow's) fair share of the class's rate, bytes/s, as the daemon last
    /// estimated it; 0: no isolation. Each host has a clock at this rate: a host whose clock
    /// runs ahead of now sends more than its share, and only its packets get the AQM's
    /// congestion signals.
    pub share_bytes: u64,
    /// A host whose clock runs further ahead of now than this is dropped (a host that does
    /// not respond to congestion signals gets its share, not more).
    pub share_horizon_ns: u64,
    /// A host counts as over its share once its clock is this far ahead of now (a few
    /// frames at the share: bursts within it do not count).
    pub share_slack_ns: u64,
    /// A host within its share whose clock is at most this far behind now sends at a good
    /// part of its share (two frames at the share: a third of it or more): it contends for
    /// the class, and takes part in dividing it. Further behind, it is a light host (DNS, a
    /// call) that keeps what it sends.
    pub share_near_ns: u64,
}

/// Key of `HOSTS`: a host (or flow) of a class.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct HostKey {
    pub class: u32,
    /// [`ISOLATE_HOST`]: `addr` is an address (IPv4 in the first four bytes);
    /// [`ISOLATE_FLOW`]: the flow hash in the first four bytes.
    pub kind: u32,
    pub addr: [u8; 16],
}

/// Value of `HOSTS`: one host's clock and when it was last counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostState {
    /// When the host's bytes so far will have left at its fair share (`CLOCK_MONOTONIC` ns).
    pub next_ns: u64,
    /// The epoch in which the host was last counted in `hosts_near`, and in `hosts_over`.
    pub near_epoch: u32,
    pub over_epoch: u32,
}

/// Per-class pacing and AQM state (`CLASS_STATE`, indexed by class id). Several CPUs update
/// it at once; the datapath changes it only with atomic operations.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassState {
    /// Earliest departure time (`CLOCK_MONOTONIC` ns) of the class's next packet.
    pub next_ns: u64,
    /// CoDel: when the delay, above target since then, has been so for an interval (0: the
    /// delay is below target).
    pub first_above_ns: u64,
    /// CoDel: time of the next congestion signal while dropping; after the dropping state
    /// ends, the time of the last one.
    pub drop_next_ns: u64,
    /// CoDel: signals given in the current (or last) dropping state.
    pub count: u64,
    /// CoDel: 1 while in the dropping state.
    pub dropping: u64,
    /// The sparse-flow budget's clock: a sparse packet may leave ahead of the class's queue
    /// only when this is not ahead of now; each one moves it by
    /// [`SPARSE_SHARE`] times its cost at the class's rate.
    pub sparse_next_ns: u64,
}

/// Per-class, per-CPU counters (`CLASS_STATS`, a per-CPU array indexed by class id).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Wire bytes and packets (segments for GSO packets) sent.
    pub bytes: u64,
    pub packets: u64,
    /// Dropped because the departure time was beyond the horizon.
    pub drop_horizon_bytes: u64,
    pub drop_horizon_packets: u64,
    /// Packets given a departure time in the future, and the sum of those delays.
    pub delayed_packets: u64,
    pub delay_ns_total: u64,
    /// Packets that reached a class with no rate set (passed unpaced).
    pub unpaced_packets: u64,
    /// AQM congestion signals: ECN-capable packets marked CE, others dropped.
    pub ecn_marked_packets: u64,
    pub drop_aqm_packets: u64,
    pub drop_aqm_bytes: u64,
    /// Packets sent (segments for GSO packets) by added delay, see [`delay_bucket`].
    pub delay_hist: [u64; DELAY_BUCKETS],
    /// Packets of sparse flows sent ahead of the class's queue (see the datapath's `sparse`).
    pub sparse_packets: u64,
    /// Isolation: bytes from light hosts (well within their fair share); hosts counted once
    /// per epoch, those near their share and those over it; packets and bytes dropped because
    /// their host was over its share by more than the share horizon.
    pub share_under_bytes: u64,
    pub hosts_near: u64,
    pub hosts_over: u64,
    pub drop_share_packets: u64,
    pub drop_share_bytes: u64,
    /// Packets (segments) that found the class's clock idle (at or behind their earliest
    /// departure): the class had no queue. A class that sends and never finds its clock idle
    /// is held back by its rate (the daemon's demand estimator reads this).
    pub idle_packets: u64,
}

impl ClassStats {
    /// Sums per-CPU values.
    #[must_use]
    pub fn merge(mut self, o: &Self) -> Self {
        self.bytes += o.bytes;
        self.packets += o.packets;
        self.drop_horizon_bytes += o.drop_horizon_bytes;
        self.drop_horizon_packets += o.drop_horizon_packets;
        self.delayed_packets += o.delayed_packets;
        self.delay_ns_total += o.delay_ns_total;
        self.unpaced_packets += o.unpaced_packets;
        self.ecn_marked_packets += o.ecn_marked_packets;
        self.drop_aqm_packets += o.drop_aqm_packets;
        self.drop_aqm_bytes += o.drop_aqm_bytes;
        for (a, b) in self.delay_hist.iter_mut().zip(&o.delay_hist) {
            *a += b;
        }
        self.sparse_packets += o.sparse_packets;
        self.idle_packets += o.idle_packets;
        self.share_under_bytes += o.share_under_bytes;
        self.hosts_near += o.hosts_near;
        self.hosts_over += o.hosts_over;
        self.drop_share_packets += o.drop_share_packets;
        self.drop_share_bytes += o.drop_share_bytes;
        self
    }
}

const _: () = assert!(core::mem::size_of::<IfaceConfig>() == 24);
const _: () = assert!(core::mem::size_of::<Globals>() == 16);
const _: () = assert!(core::mem::size_of::<RuleKey>() == RULE_KEY_WORDS * 8);
const _: () = assert!(core::mem::size_of::<Tuple>() == 56);
const _: () = assert!(core::mem::size_of::<RuleTarget>() == 8);
const _: () = assert!(core::mem::size_of::<ClassConfig>() == 80);
const _: () = assert!(core::mem::size_of::<HostKey>() == 24);
const _: () = assert!(core::mem::size_of::<HostState>() == 16);
const _: () = assert!(core::mem::size_of::<ClassState>() == 48);
const _: () = assert!(core::mem::size_of::<ClassStats>() == 136 + 8 * DELAY_BUCKETS);

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, made only of integers, with explicit padding,
    // so every bit pattern is valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::IfaceConfig {}
    unsafe impl aya::Pod for super::Globals {}
    unsafe impl aya::Pod for super::RuleKey {}
    unsafe impl aya::Pod for super::Tuple {}
    unsafe impl aya::Pod for super::RuleTarget {}
    unsafe impl aya::Pod for super::ClassConfig {}
    unsafe impl aya::Pod for super::ClassState {}
    unsafe impl aya::Pod for super::ClassStats {}
    unsafe impl aya::Pod for super::HostKey {}
    unsafe impl aya::Pod for super::HostState {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delay_buckets_double_from_125_microseconds() {
        assert_eq!(delay_bucket(0), 0);
        assert_eq!(delay_bucket(125_000), 0);
        assert_eq!(delay_bucket(125_001), 1);
        assert_eq!(delay_bucket(250_000), 1);
        assert_eq!(delay_bucket(5_000_000), 6); // 4 ms < 5 ms <= 8 ms
        assert_eq!(delay_bucket(DELAY_BUCKET_BASE_NS << (DELAY_BUCKETS - 2)), DELAY_BUCKETS - 2);
        assert_eq!(delay_bucket(u64::MAX), DELAY_BUCKETS - 1);
    }
}
