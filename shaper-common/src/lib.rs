//! Types shared by the tc program (`shaper-ebpf`) and userspace (`shaper-daemon`).
//!
//! Every struct here is a BPF map key or value: `#[repr(C)]`, no `bool`, explicit padding
//! and a compile-time size assertion, so that the kernel side and the userspace side agree
//! byte for byte. The `user` feature adds `aya::Pod` implementations.
#![no_std]
// Padding fields are public so both sides can build the structs with literals.
#![allow(clippy::pub_underscore_fields)]

/// Most classes across all interfaces. Class ids index the class arrays directly, which
/// shaperd sizes when it loads them ([`class_slots`]): their per-CPU counters take 280 bytes
/// a slot on each CPU, too much to reserve this bound on a machine of many CPUs.
pub const MAX_CLASSES: u32 = 16_384;
/// The fewest slots of the class arrays (`CLASS_CONFIG`, `CLASS_STATE`, `CLASS_STATS`).
pub const MIN_CLASS_SLOTS: u32 = 1024;

/// The slots the class arrays are given for a configuration of `classes` classes: room for
/// as many again (a reload gives new classes ids that no class of the old configuration
/// holds, so both sets live side by side while the rules switch over), as a power of two,
/// at least [`MIN_CLASS_SLOTS`], at most [`MAX_CLASSES`].
#[must_use]
#[allow(clippy::cast_possible_truncation, reason = "the power of two is below MAX_CLASSES where it is cast")]
pub const fn class_slots(classes: usize) -> u32 {
    let wanted = classes.saturating_mul(2);
    if wanted <= MIN_CLASS_SLOTS as usize {
        MIN_CLASS_SLOTS
    } else if wanted >= MAX_CLASSES as usize {
        MAX_CLASSES
    } else {
        wanted.next_power_of_two() as u32
    }
}
/// Most shaped interfaces.
pub const MAX_INTERFACES: u32 = 64;
/// Most distinct rule shapes ("tuples"). A packet costs one hash lookup per tuple that can
/// still beat the best match found so far, whatever the number of rules.
pub const MAX_TUPLES: u32 = 32;
/// Rule sets are double-buffered: `TUPLES`, `SPORT_IDS`, `DPORT_IDS` and `LEN_IDS` hold two
/// banks (bank `b` starts at `b * MAX_TUPLES` and `b * PORT_SLOTS`), and a tuple's id in `RULES`
/// keys is its `TUPLES` index, so the two banks' entries never collide. The daemon writes a
/// new rule set into the inactive bank and switches `Globals` in one write: a packet sees the
/// old rules or the new ones, never a mix.
pub const RULE_BANKS: u32 = 2;
/// Most compiled rule entries per bank (one rule with a port range may need several). `RULES`
/// allocates an entry when it is written (it is not preallocated): its memory follows the
/// rules in use, not this bound, beyond its bucket array (16 bytes a slot).
pub const MAX_RULE_ENTRIES: u32 = 131_072;
/// Port interval ids (one array slot per port number); also the IP length interval ids of
/// `LEN_IDS` (one slot per length, 0..=65535).
pub const PORT_SLOTS: u32 = 65536;

/// Hosts (or flows) remembered for isolation inside classes (`HOSTS`, see [`HostState`]).
pub const HOST_SLOTS: u32 = 65536;

/// Slots of the flows' table (`FLOWS`, one [`FlowEntry`] a flow, the slot picked by the
/// flow's hash: a flow takes the slot over from another whose hash picks it). A power of two.
pub const FLOW_SLOTS: u32 = 65536;

/// Slots of the class cache (`CLASS_CACHE`, each a [`FlowEntry::word`]: the rules' answer for
/// the packets that agree on the fields the rules test, see [`cache_hash`]), in sets of
/// [`CACHE_WAYS`]. A power of two.
pub const CACHE_SLOTS: u32 = 32768;
/// Slots of a set of the class cache (adjacent in `CLASS_CACHE`: 64 bytes).
pub const CACHE_WAYS: u32 = 8;
/// Sets of the class cache.
pub const CACHE_SETS: u32 = CACHE_SLOTS / CACHE_WAYS;

/// The fields of a [`RuleKey`] that any tuple of a rule bank tests, and the interface, as
/// masks of its words (see [`cache_mask`]).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KeyMask {
    pub words: [u64; RULE_KEY_WORDS],
}

/// Value of `CACHE_MASKS`, its one entry: each rule bank's [`KeyMask`]. One entry rather than
/// one a bank: the datapath looks it up at a constant index, and picks the bank's words
/// without a branch (looked up by the bank, Linux 6.1's verifier walked the egress program
/// 437,558 instructions rather than 249,974).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CacheMasks {
    pub banks: [KeyMask; RULE_BANKS as usize],
}

/// Value of `FLOWS`: a flow the datapath has seen, found again by its hash ([`flow_hash`])
/// without a hash-map lookup: the class its packets went to and its latest departure
/// (sparse-flow priority). Written for each packet without being read first; read only for a
/// packet whose class has a queue (the only time a flow's last departure matters).
///
/// CPUs write entries without locks. `word` says whose entry it is and its class in one
/// 64-bit store; `last_ns` is written apart, and may be another flow's for a packet (it only
/// steers the sparse-flow heuristic).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct FlowEntry {
    /// [`FlowEntry::word`] of the flow and its classification; 0 in an empty slot.
    pub word: u64,
    /// When the flow's latest packet was to leave (`CLOCK_MONOTONIC` ns).
    pub last_ns: u64,
}

#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[expect(clippy::cast_possible_truncation, reason = "a word keeps 16 bits of a class and of a generation")]
impl FlowEntry {
    /// The word of the flow whose [`flow_hash`] is `hash` (its [`flow_tag`] in the high 32
    /// bits), classified into `rule_class` ([`NO_RULE`] or a class id, kept as its low 16
    /// bits: 0xffff is `NO_RULE`) by the rules of `generation` (its low 16 bits: the daemon
    /// empties the cache each time they come round to 0, see [`flow_cache_expires`]).
    #[inline(always)]
    #[must_use]
    pub const fn word(hash: u64, generation: u32, rule_class: u32) -> u64 {
        ((flow_tag(hash) as u64) << 32) | ((generation as u16 as u64) << 16) | rule_class as u16 as u64
    }

    /// The class a word holds, [`NO_RULE`] for none.
    #[inline(always)]
    #[must_use]
    pub const fn class(word: u64) -> u32 {
        let c = word as u16;
        if c == NO_RULE as u16 {
            NO_RULE
        } else {
            c as u32
        }
    }

    /// The [`flow_tag`] a word holds (0 in an empty slot's).
    #[inline(always)]
    #[must_use]
    pub const fn tag(word: u64) -> u32 {
        (word >> 32) as u32
    }

    /// Whether a word holds a classification by the rules of `generation`.
    #[inline(always)]
    #[must_use]
    pub const fn of_generation(word: u64, generation: u32) -> bool {
        (word >> 16) as u16 == generation as u16
    }
}

/// The tag an entry of `FLOWS` or `CLASS_CACHE` carries: the high 32 bits of its hash (the set is picked
/// by low ones), never 0.
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn flow_tag(hash: u64) -> u32 {
    (hash >> 32) as u32 | 1
}

/// Whether the class cache must be emptied before the rules of `generation` become active: a
/// cache entry keeps 16 bits of its generation, so one left from 65,536 generations before
/// would pass for the new rules' answer.
#[expect(clippy::cast_possible_truncation, reason = "the low 16 bits")]
#[must_use]
pub const fn flow_cache_expires(generation: u32) -> bool {
    generation as u16 == 0
}

/// The rules' answer when no rule matches the flow (its interface's default class applies).
pub const NO_RULE: u32 = u32::MAX;

/// The bits of the `(offset, size)` fields of a [`RuleKey`] in its little-endian words.
const fn key_bits(fields: &[(usize, usize)]) -> [u64; RULE_KEY_WORDS] {
    let mut mask = [0; RULE_KEY_WORDS];
    let mut f = 0;
    while f < fields.len() {
        let (offset, size) = fields[f];
        let mut byte = offset;
        while byte < offset + size {
            mask[byte / 8] |= 0xff << ((byte % 8) * 8);
            byte += 1;
        }
        f += 1;
    }
    mask
}

/// The fields of a [`RuleKey`] that may differ between the packets of one flow.
const PER_PACKET_MASK: [u64; RULE_KEY_WORDS] = key_bits(&[
    (core::mem::offset_of!(RuleKey, tcp_flags), 1),
    (core::mem::offset_of!(RuleKey, len), 2),
    (core::mem::offset_of!(RuleKey, l4), 1),
]);

/// The words of a [`RuleKey`] that make a flow: all but the tuple id, the fields that differ
/// between the packets of a flow, and the ports' interval ids ([`flow_hash`] takes the raw
/// ports).
pub const FLOW_KEY_MASK: [u64; RULE_KEY_WORDS] = {
    let other = key_bits(&[(core::mem::offset_of!(RuleKey, tuple), 2), (core::mem::offset_of!(RuleKey, sport), 4)]);
    let mut mask = [0; RULE_KEY_WORDS];
    let mut i = 0;
    while i < RULE_KEY_WORDS {
        mask[i] = !(PER_PACKET_MASK[i] | other[i]);
        i += 1;
    }
    mask
};

/// The flow of a packet whose key (as the parser left it: no interval ids) is `words` and
/// whose raw ports are `sport` and `dport`: a 64-bit hash. Never 0 (the value of an empty
/// slot).
///
/// Each word is mixed on its own (with a constant of its position, multiplied, its high bits
/// folded down: a bijection of the word), the mixed words summed, and the sum mixed again
/// (another bijection). So two keys that differ in one word never share a hash, and the
/// multiplications do not wait on one another: mixed in turn, each word into the hash of the
/// ones before, the eight made a chain of eight multiplications (about 15 % of the egress
/// program's `perf` samples, one packet repeated).
#[inline(always)]
#[must_use]
pub const fn flow_hash(words: &[u64; RULE_KEY_WORDS], sport: u16, dport: u16) -> u64 {
    const K: u64 = MIX_MULTIPLIER;
    let mut h = mix(K ^ ((sport as u64) << 16 | dport as u64));
    let mut i = 0;
    while i < RULE_KEY_WORDS {
        // Position i's constant: the words' places are not interchangeable.
        h = h.wrapping_add(mix((words[i] & FLOW_KEY_MASK[i]) ^ K.wrapping_mul(2 * i as u64 + 3)));
        i += 1;
    }
    mix(h ^ (h >> 32)) | 1
}

/// The word of a [`RuleKey`] that holds its port interval ids, and where in it they start:
/// [`cache_hash`] puts the raw ports there.
const PORTS_WORD: usize = core::mem::offset_of!(RuleKey, sport) / 8;
const PORTS_SHIFT: usize = (core::mem::offset_of!(RuleKey, sport) % 8) * 8;
const _: () =
    assert!(core::mem::offset_of!(RuleKey, dport) == core::mem::offset_of!(RuleKey, sport) + 2 && PORTS_SHIFT <= 32);

/// The class cache's hash of a packet whose key (as the parser left it: no interval ids) is
/// `words`, with raw ports `ports` (source port in the low 16 bits), under the [`KeyMask`] of
/// rule bank `bank` in `masks`: packets that agree on the fields the rules test share it, and
/// so share the rules' answer. On a gateway whose rules name hosts, a host's flows share one
/// entry. The raw ports stand in for the interval ids the rules test. Mixed as
/// [`flow_hash`]; never 0 (its lowest bit is set).
#[inline(always)]
#[must_use]
pub const fn cache_hash(words: &[u64; RULE_KEY_WORDS], masks: &CacheMasks, bank: u32, ports: u32) -> u64 {
    const K: u64 = MIX_MULTIPLIER;
    // All ones for bank 1: each mask word picked without a branch.
    let pick = ((bank & 1) as u64).wrapping_neg();
    let (first, second) = (&masks.banks[0].words, &masks.banks[1].words);
    let mut h = 0u64;
    let mut i = 0;
    while i < RULE_KEY_WORDS {
        let w = if i == PORTS_WORD { words[i] | (ports as u64) << PORTS_SHIFT } else { words[i] };
        let mask = first[i] ^ ((first[i] ^ second[i]) & pick);
        h = h.wrapping_add(mix((w & mask) ^ K.wrapping_mul(2 * i as u64 + 3)));
        i += 1;
    }
    mix(h ^ (h >> 32)) | 1
}

/// The [`KeyMask`] of a rule bank whose tuples are `tuples`: the fields any of them tests that
/// do not differ between the packets of a flow (a bank with such tests is not cached, see
/// [`RULES_PER_PACKET`]), and the interface.
#[must_use]
pub fn cache_mask<'a>(tuples: impl IntoIterator<Item = &'a Tuple>) -> KeyMask {
    let iface = key_bits(&[(core::mem::offset_of!(RuleKey, iface), 2)]);
    let tuple = key_bits(&[(core::mem::offset_of!(RuleKey, tuple), 2)]);
    let mut words = iface;
    for t in tuples {
        for (w, m) in words.iter_mut().zip(&t.mask) {
            *w |= m;
        }
    }
    for i in 0..RULE_KEY_WORDS {
        words[i] &= !(PER_PACKET_MASK[i] | tuple[i]);
    }
    KeyMask { words }
}

/// [`mix`]'s odd multiplier (2^64 over the golden ratio).
const MIX_MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// A bijection of 64-bit words that spreads each bit over the bits above it (the odd
/// multiplier) and the high bits over the low ones (the shift).
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
const fn mix(x: u64) -> u64 {
    let x = x.wrapping_mul(MIX_MULTIPLIER);
    x ^ (x >> 29)
}

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

/// The time a byte takes at `bytes_per_sec`, in nanoseconds as 32.32 fixed point (0 at a
/// rate of 0): shaperd writes it next to each rate the datapath paces by, and the datapath
/// multiplies a packet's length by it ([`pace_ns`]) rather than divide by the rate. A 64-bit
/// division takes more cycles than the two multiplications (`perf` put 7 % of the egress
/// program's samples on the class clock's division, one packet repeated).
#[must_use]
pub const fn byte_ns(bytes_per_sec: u64) -> u64 {
    // 10^9 << 32 is below 2^63: every rate of at least a byte a second has its value.
    match (1_000_000_000u64 << 32).checked_div(bytes_per_sec) {
        Some(v) => v,
        None => 0,
    }
}

/// How long `bytes` (below 2^31) take at the rate whose [`byte_ns`] is `byte_ns`: within
/// 2 ns below `bytes * 10^9 / rate`.
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn pace_ns(bytes: u64, byte_ns: u64) -> u64 {
    bytes.wrapping_mul(byte_ns >> 32).wrapping_add(bytes.wrapping_mul(byte_ns & 0xffff_ffff) >> 32)
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
pub const MAP_LAYOUT_VERSION: u32 = 14;

/// Map names, as they appear in the object file.
pub mod maps {
    pub const IFACES: &str = "IFACES";
    pub const IFACE_SLOTS: &str = "IFACE_SLOTS";
    pub const TUPLES: &str = "TUPLES";
    pub const RULES: &str = "RULES";
    pub const SPORT_IDS: &str = "SPORT_IDS";
    pub const DPORT_IDS: &str = "DPORT_IDS";
    pub const LEN_IDS: &str = "LEN_IDS";
    pub const CLASS_CONFIG: &str = "CLASS_CONFIG";
    pub const CLASS_STATE: &str = "CLASS_STATE";
    pub const CLASS_STATS: &str = "CLASS_STATS";
    pub const GLOBALS: &str = "GLOBALS";
    pub const FLOWS: &str = "FLOWS";
    pub const CLASS_CACHE: &str = "CLASS_CACHE";
    pub const CACHE_MASKS: &str = "CACHE_MASKS";
    pub const HOSTS: &str = "HOSTS";
    pub const LINKS: &str = "LINKS";
    pub const LAN_IFACES: &str = "LAN_IFACES";
    pub const ORIGINS: &str = "ORIGINS";
    pub const IFB_TARGETS: &str = "IFB_TARGETS";
    pub const RULE_FILTER: &str = "RULE_FILTER";
    pub const ACTIVE: &str = "ACTIVE";
    /// Every map, for pinning.
    pub const ALL: [&str; 21] = [
        IFACES,
        IFACE_SLOTS,
        TUPLES,
        RULES,
        SPORT_IDS,
        DPORT_IDS,
        LEN_IDS,
        CLASS_CONFIG,
        CLASS_STATE,
        CLASS_STATS,
        GLOBALS,
        FLOWS,
        CLASS_CACHE,
        CACHE_MASKS,
        HOSTS,
        LINKS,
        LAN_IFACES,
        ORIGINS,
        IFB_TARGETS,
        RULE_FILTER,
        ACTIVE,
    ];
}

/// Name of the tc program in the object file.
pub const PROGRAM_NAME: &str = "shaper_egress";
/// Name of the program attached at ingress of LAN-side interfaces (see [`Origin`]).
pub const INGRESS_PROGRAM_NAME: &str = "shaper_ingress";
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
/// `IfaceConfig::flags`: hosts behind this interface's NAT send from LAN-side interfaces,
/// where their packets' origins are recorded (see [`Origin`]): a packet is classified by
/// the address and port it had there.
pub const IFACE_NAT: u32 = 8;

/// `ClassConfig::isolation`: no isolation inside the class.
pub const ISOLATE_NONE: u32 = 0;
/// `ClassConfig::isolation`: the class's rate is shared fairly between its hosts.
pub const ISOLATE_HOST: u32 = 1;
/// `ClassConfig::isolation`: the class's rate is shared fairly between its flows.
pub const ISOLATE_FLOW: u32 = 2;

/// Slots of `IFACE_SLOTS` (a power of two).
pub const IFACE_SLOTS: u32 = 64;

/// The slot of `IFACE_SLOTS` that interface `ifindex` may hold.
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn iface_slot(ifindex: u32) -> u32 {
    ifindex & (IFACE_SLOTS - 1)
}

/// Value of `IFACE_SLOTS`, an array the datapath reads an interface's settings from before it
/// looks in `IFACES` (a hash map: hashing the key and walking a bucket took about 8 % of a
/// packet's cost on the many-flow mix of `cargo xtask bench`). Interface `ifindex` may hold
/// slot [`iface_slot`]`(ifindex)`; one whose slot another holds is found in `IFACES`. shaperd
/// keeps each slot a copy of the `IFACES` entry of the interface that holds it.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceSlot {
    /// The interface that holds the slot; 0 (no interface's index): none.
    pub ifindex: u32,
    pub _pad: u32,
    pub config: IfaceConfig,
}

/// Per-interface settings, keyed by ifindex in `IFACES` (and copied into `IFACE_SLOTS`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IfaceConfig {
    /// Interface slot: the `iface` field of rule keys.
    pub slot: u32,
    /// Class of packets that match no rule (and of packets that cannot be parsed).
    pub default_class: u32,
    /// Bytes added to every frame (each GSO segment) on the wire: PPPoE, ATM's AAL5 trailer
    /// and LLC header, Ethernet's preamble... on top of the length the device sees, as tc's
    /// `stab overhead`. May be negative, to subtract headers the link does not carry. See
    /// [`frame_wire_len`] for the order in which it, [`mpu`](Self::mpu) and the
    /// [`linklayer`](Self::linklayer) apply.
    pub overhead: i32,
    pub flags: u32,
    /// The rate of the interface's link clock (`LINKS`, indexed by `slot`), bytes/s: the
    /// link's rate plus [`LINK_SLACK_PERCENT`]; 0: no link clock.
    pub link_bytes: u64,
    /// [`byte_ns`] of `link_bytes` (shaperd's `set_iface` writes it).
    pub link_byte_ns: u64,
    /// Minimum packet unit: a frame counts at least this many bytes once the overhead is
    /// added, before cell rounding (tc-stab's and CAKE's `mpu`). 0: no minimum.
    pub mpu: u32,
    /// How the line carries frames: [`LINKLAYER_ETHERNET`] (as they are),
    /// [`LINKLAYER_ATM`] or [`LINKLAYER_PTM`].
    pub linklayer: u32,
}

/// `IfaceConfig::linklayer`: frames go on the line as they are (Ethernet, fibre, cable, or
/// any link whose framing a flat `overhead` describes).
pub const LINKLAYER_ETHERNET: u32 = 0;
/// `IfaceConfig::linklayer`: ADSL's ATM: each frame is cut into 48-byte cell payloads, the
/// last one padded, and each cell takes 53 bytes on the line.
pub const LINKLAYER_ATM: u32 = 1;
/// `IfaceConfig::linklayer`: VDSL2's PTM (64b/65b encoding): one byte more for every 64
/// bytes or part of them.
pub const LINKLAYER_PTM: u32 = 2;
/// Payload bytes of an ATM cell.
pub const ATM_CELL_PAYLOAD: u64 = 48;
/// Bytes an ATM cell takes on the line (5 bytes of header).
pub const ATM_CELL: u64 = 53;

/// The bytes one frame takes on the line, of `len` bytes as the device sees it (`skb->len`
/// of one segment: from the Ethernet header on an Ethernet device, from the IP header on a
/// PPP or tun device).
///
/// The order is tc-stab's and CAKE's (`cake_calc_overhead` in `net/sched/sch_cake.c`;
/// `__qdisc_calculate_pkt_len` and iproute2's `tc_adjust_size` for stab): the overhead is
/// added first, then the frame is raised to the `mpu`, then cut into cells. The overhead
/// belongs in the cells (the AAL5 trailer, LLC and PPPoE headers are carried in them), and
/// the mpu is a minimum of the frame the link pads (Ethernet's 60 or 64 bytes inside bridged
/// encapsulations, RFC 2684), so it applies before the cells too. A frame counts at least
/// one byte (and so one cell), as stab's `pkt_len < 1` floor.
///
/// PTM is counted as CAKE counts it: `len + ceil(len / 64)`. The 64b/65b codewords carry
/// frames back to back, so the real cost is `len * 65 / 64` plus the frame's start and end
/// markers; CAKE's form errs by at most a byte above that, and never below. (Rounding each
/// frame up to whole 65-byte codewords would charge a 1500-byte packet 1560 bytes rather
/// than about 1524.)
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn frame_wire_len(len: u64, overhead: i32, mpu: u32, linklayer: u32) -> u64 {
    // `len` is at most 64 KiB (a device's frame, or a GSO segment), so neither the sum nor
    // the conversions below can overflow.
    #[expect(clippy::cast_possible_wrap, reason = "len is a frame length, far below i64::MAX")]
    let framed = len as i64 + overhead as i64;
    #[expect(clippy::cast_sign_loss, reason = "at least 1 by the comparison")]
    let framed = if framed < 1 { 1 } else { framed as u64 };
    let framed = if framed < mpu as u64 { mpu as u64 } else { framed };
    match linklayer {
        LINKLAYER_ATM => framed.div_ceil(ATM_CELL_PAYLOAD) * ATM_CELL,
        LINKLAYER_PTM => framed + framed.div_ceil(64),
        _ => framed,
    }
}

/// The bytes an skb puts on the line: each of its `gso_segs` segments is a frame of its own
/// (with its own copy of the `hdr_len` bytes of headers, as qdiscs count it in
/// `qdisc_pkt_len_init`), framed by [`frame_wire_len`].
///
/// A GSO skb of `len` bytes leaves as `gso_segs - 1` segments of `gso_size + hdr_len` bytes
/// and a last one of the rest (`len - (gso_segs - 1) * gso_size`), as `cake_overhead`
/// splits it; so the count is exact for every segment. Without a usable `gso_size` (0, or
/// too large for `len`: a packet the stack would not build), the payload is split evenly
/// and the last segment takes the remainder; the bytes before framing still add up to
/// `len + (gso_segs - 1) * hdr_len`.
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn wire_len(len: u32, gso_segs: u32, gso_size: u32, hdr_len: u32, iface: &IfaceConfig) -> u64 {
    let (overhead, mpu, linklayer) = (iface.overhead, iface.mpu, iface.linklayer);
    let len = len as u64;
    if gso_segs <= 1 {
        return frame_wire_len(len, overhead, mpu, linklayer);
    }
    let more = gso_segs as u64 - 1;
    let hdr = if (hdr_len as u64) < len { hdr_len as u64 } else { 0 };
    let size = if gso_size != 0 && (gso_size as u64) * more < len {
        gso_size as u64
    } else {
        match (len - hdr).checked_div(more + 1) {
            Some(n) => n,
            None => 0,
        }
    };
    frame_wire_len(size + hdr, overhead, mpu, linklayer) * more
        + frame_wire_len(len - size * more, overhead, mpu, linklayer)
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
/// (one per 10 ms or less, within the sparse budget) still leaves at once, and so does one
/// within the class's guarantee (its profile meter, `ClassState::profile_next_ns`), the
/// borrowers held in its place.
pub const CLASS_QUIET: u32 = 1;

/// How far ahead of now a quiet class's packets hold the borrowers ([`CLASS_BORROWING`]) at
/// most: three ticks at the default, by when the next tick has lowered the borrowers to
/// what the waking class leaves them. A longer hold took their guarantee from them for all
/// of a waking class's burst (seed 001: a 16 KB page at 700 kbit/s held the download for
/// 190 ms, where HTB keeps it at its 200 kbit/s).
pub const HOLD_MAX_NS: u64 = 30_000_000;

/// `ClassConfig::flags`: the class is paced above its guarantee, on bandwidth the allocator
/// lent it. Its packets leave no earlier than the quiet classes' packets held behind the link
/// clock (`LinkState::hold_ns`, up to [`HOLD_MAX_NS`] ahead): a class that wakes takes its
/// first packets' time from the borrowers, as HTB serves it ahead of them, rather than on
/// top of what they were given.
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
    /// Goes up by one each time the daemon switches rule banks (or back): a classification
    /// the class cache holds from another generation is not used (see [`FlowEntry`]).
    pub generation: u32,
    /// [`RULES_PER_PACKET`].
    pub flags: u32,
    /// Goes up by one each time shaperd takes the active classes ([`ActiveClasses`]): a
    /// class's packet marks it only if its CPU has not marked it in this generation
    /// (`ClassStats::marked`).
    pub active_gen: u32,
}

impl Globals {
    /// The rule bank and the tuple count, packed in one word (a BPF function takes five
    /// arguments of a word each, at most).
    #[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
    #[inline(always)]
    #[must_use]
    pub const fn packed(&self) -> u64 {
        ((self.bank as u64) << 32) | self.tuple_count as u64
    }

    /// What [`Self::packed`] packed; the other fields zero.
    #[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
    #[expect(clippy::cast_possible_truncation, reason = "the two halves of the word")]
    #[inline(always)]
    #[must_use]
    pub const fn unpacked(word: u64) -> Self {
        Self { tuple_count: word as u32, bank: (word >> 32) as u32, epoch: 0, generation: 0, flags: 0, active_gen: 0 }
    }
}

/// `Globals::flags`: some rule tests a field that differs between the packets of one flow
/// (TCP flags, the IP length, whether a TCP segment carries payload), so the class cache's
/// classification is not used: each packet is classified.
pub const RULES_PER_PACKET: u32 = 1;

/// The fields a packet is classified on. The same layout is the key of `RULES`: a rule is
/// stored with every field it does not test zeroed, and the packet's key is masked by the
/// rule's tuple before the lookup. Aligned to 8 bytes: the datapath reads it as words.
#[repr(C, align(8))]
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
    /// The TCP header's flags byte (CWR ECE URG ACK PSH RST SYN FIN, high bit first); valid
    /// only with [`L4_TCP`] in `l4`, else 0.
    pub tcp_flags: u8,
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
    /// The Ethernet source address; zero on an interface without a link-layer header.
    pub src_mac: [u8; 6],
    /// Interval id of the packet's IP length (`LEN_IDS`; 0: the packet is not IP). The IP
    /// length is the IPv4 total length or the IPv6 payload length plus 40; for a GSO packet,
    /// that of one full segment (its headers plus `gso_size`).
    pub len: u16,
    /// The ICMP (IPv4) or `ICMPv6` (IPv6) type; valid only with [`L4_ICMP`] in `l4`, else 0.
    pub icmp_type: u8,
    /// What the parser read of the transport header: [`L4_TCP`], [`L4_TCP_NO_PAYLOAD`],
    /// [`L4_ICMP`].
    pub l4: u8,
    pub _pad: [u8; 6],
}

/// `RuleKey::l4`: a TCP header was read (`tcp_flags` holds its flags).
pub const L4_TCP: u8 = 1;
/// `RuleKey::l4`: a TCP segment that carries no payload (its IP length is its headers'
/// length; never a GSO packet): with the ACK flag alone, a pure ACK.
pub const L4_TCP_NO_PAYLOAD: u8 = 2;
/// `RuleKey::l4`: an ICMP header (IPv4, protocol 1) or `ICMPv6` header (IPv6, next header 58)
/// was read (`icmp_type` holds its type).
pub const L4_ICMP: u8 = 4;

/// `RuleKey` as 64-bit words, the unit in which tuple masks are applied.
pub const RULE_KEY_WORDS: usize = 8;

impl RuleKey {
    /// The key as the words the hashes read ([`flow_hash`], [`cache_hash`]).
    #[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
    #[inline(always)]
    #[must_use]
    pub const fn words(&self) -> &[u64; RULE_KEY_WORDS] {
        // SAFETY: RuleKey is repr(C, align(8)) and RULE_KEY_WORDS words long (asserted
        // below), all of it plain data: aligned word reads.
        unsafe { &*core::ptr::from_ref(self).cast::<[u64; RULE_KEY_WORDS]>() }
    }
}

/// One tuple: the mask of the fields that its rules test, and the smallest rule index
/// (file order) among its rules, so the datapath can stop once no later tuple can win.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tuple {
    pub mask: [u64; RULE_KEY_WORDS],
    pub min_rule: u32,
    /// The rule bank's filter (`RULE_FILTER`), as the mask of a bit's index in it: a bit
    /// count minus one, at most `FILTER_WORDS * 64 - 1`. 0: no filter, the tuple is looked
    /// up for every packet it is searched for.
    pub filter_mask: u32,
}

impl Tuple {
    /// Whether the tuple's rules test a field that differs between the packets of one flow
    /// (see [`RULES_PER_PACKET`]).
    #[must_use]
    pub fn per_packet(&self) -> bool {
        self.mask.iter().zip(&PER_PACKET_MASK).any(|(m, p)| m & p != 0)
    }
}

/// Words of `RULE_FILTER` per rule bank: up to 2^21 bits (256 KiB), of which a bank uses
/// a power of two, about 16 per `RULES` entry (see [`Tuple::filter_mask`]).
///
/// The filter sits in front of `RULES`: each entry of a bank sets the bit its key hashes to
/// ([`filter_hash`]), and the datapath looks a masked key up only if its bit is set. A key
/// that no rule holds (most of a tuple search's lookups: a flow matches one tuple or two)
/// then costs a hash of its eight words and one read of a filter small enough to stay in
/// the caches, rather than a hash-map lookup that misses them (its bucket array is sized
/// for `MAX_RULE_ENTRIES` per bank).
pub const FILTER_WORDS: u32 = 32768;

/// The hash of a `RULES` key (`words`: the key as words, tuple id included) that picks its
/// bit in `RULE_FILTER`; the bit is `filter_hash(words) & Tuple::filter_mask`. Word by word
/// ([`FILTER_SEED`], then [`filter_step`] for each), so that the datapath can hash a key as
/// it masks it.
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn filter_hash(words: &[u64; RULE_KEY_WORDS]) -> u64 {
    let mut h = FILTER_SEED;
    let mut i = 0;
    while i < RULE_KEY_WORDS {
        h = filter_step(h, words[i]);
        i += 1;
    }
    h
}

/// [`filter_hash`] before the first word.
pub const FILTER_SEED: u64 = 0xc2b2_ae3d_27d4_eb4f;

/// [`filter_hash`]'s state `h` after one more word.
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn filter_step(h: u64, word: u64) -> u64 {
    let h = (h ^ word).wrapping_mul(FILTER_SEED);
    h ^ (h >> 29)
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
    /// [`byte_ns`] of `rate_bytes` (shaperd's `set_class` writes it, and `share_byte_ns`).
    pub rate_byte_ns: u64,
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
    /// [`byte_ns`] of `share_bytes`.
    pub share_byte_ns: u64,
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
    /// The class's guaranteed rate, bytes/s: the profile its packets are metered against
    /// for [`DSCP_OVER`].
    pub guarantee_bytes: u64,
    /// [`DSCP_SET`] and/or [`DSCP_OVER`], or 0: the class leaves DSCP alone.
    pub dscp_flags: u8,
    /// The DSCP its packets get (with [`DSCP_SET`]).
    pub set_dscp: u8,
    /// The DSCP its packets beyond the guaranteed rate get (with [`DSCP_OVER`]).
    pub over_dscp: u8,
    pub _pad_dscp: [u8; 5],
}

impl ClassConfig {
    /// The configuration with its [`byte_ns`] fields worked out from its rates.
    #[must_use]
    pub const fn with_byte_ns(self) -> Self {
        Self { rate_byte_ns: byte_ns(self.rate_bytes), share_byte_ns: byte_ns(self.share_bytes), ..self }
    }
}

impl IfaceConfig {
    /// The configuration with `link_byte_ns` worked out from `link_bytes`.
    #[must_use]
    pub const fn with_byte_ns(self) -> Self {
        Self { link_byte_ns: byte_ns(self.link_bytes), ..self }
    }
}

/// `ClassConfig::dscp_flags`: every packet of the class gets `set_dscp` (0 washes the
/// marks a host set).
pub const DSCP_SET: u8 = 1;
/// `ClassConfig::dscp_flags`: packets beyond the class's guaranteed rate (a meter at
/// `guarantee_bytes` that tolerates a burst of [`PROFILE_BURST_FRAMES`]) get `over_dscp`,
/// as a `DiffServ` marker re-marks traffic out of profile to a lower class.
pub const DSCP_OVER: u8 = 2;
/// Full frames at the guaranteed rate a class may send at once and stay in profile.
pub const PROFILE_BURST_FRAMES: u64 = 4;

/// Ways of a `HOSTS` set: a host's state is in one of the four ways of the set its hash
/// picks, and a host that finds none of them its own takes the way of the host idle longest.
pub const HOST_WAYS: u32 = 4;

/// Sets of `HOSTS`: [`HOST_SLOTS`] hosts in all.
pub const HOST_SETS: u32 = HOST_SLOTS / HOST_WAYS;

/// One host (or flow) of a class in `HOSTS` (an array; the four ways of a set are consecutive
/// entries, one cache line): its clock at its fair share and when it was last counted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HostState {
    /// The host's hash (class, kind of isolation, address or flow), never 0; 0: a free way.
    pub tag: u32,
    /// The epoch (its low 16 bits) in which the host was last counted in `hosts_near`, and
    /// in `hosts_over`.
    pub near_epoch: u16,
    pub over_epoch: u16,
    /// When the host's bytes so far will have left at its fair share (`CLOCK_MONOTONIC` ns).
    pub next_ns: u64,
}

/// Where [`HostState::near_epoch`] and [`HostState::over_epoch`] are in the value's first
/// 64-bit word (with the tag, little-endian), which the datapath sets with a
/// compare-and-exchange: the CPU that sets the epoch counts the host, once however many send
/// for it at once.
pub const NEAR_EPOCH_SHIFT: u32 = 32;
pub const OVER_EPOCH_SHIFT: u32 = 48;
const _: () = assert!(
    core::mem::offset_of!(HostState, near_epoch) * 8 == NEAR_EPOCH_SHIFT as usize
        && core::mem::offset_of!(HostState, over_epoch) * 8 == OVER_EPOCH_SHIFT as usize
        && core::mem::size_of::<HostState>() == 16
);

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
    /// The profile meter's clock (see [`DSCP_OVER`]): when the bytes sent in profile will
    /// have left at the guaranteed rate.
    pub profile_next_ns: u64,
    /// To a cache line: a class's state is one line, which the CPUs that send for it share.
    pub _pad: u64,
}

/// Per-class, per-CPU counters (`CLASS_STATS`, a per-CPU array indexed by class id). The
/// counters every packet moves come first, in one cache line, then the delay histogram (one
/// of its lines per packet), then those of drops and isolation.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassStats {
    /// Wire bytes and packets (segments for GSO packets) sent.
    pub bytes: u64,
    pub packets: u64,
    /// Packets given a departure time in the future, and the sum of those delays.
    pub delayed_packets: u64,
    pub delay_ns_total: u64,
    /// Packets (segments) that found the class's clock idle (at or behind their earliest
    /// departure): the class had no queue. A class that sends and never finds its clock idle
    /// is held back by its rate (the daemon's demand estimator reads this).
    pub idle_packets: u64,
    /// Packets whose class the class cache did not hold (the first of the packets that agree
    /// on the fields the rules test, such packets evicted by others of the same set, or a
    /// classification of an older rule set): classified by the rules.
    pub flow_misses: u64,
    /// Packets of sparse flows sent ahead of the class's queue (see the datapath's `sparse`).
    pub sparse_packets: u64,
    /// The generation (`Globals::active_gen`, with bit 32 set so that a zeroed value is none)
    /// in which this CPU last marked the class in `ACTIVE`: not a counter, and not summed.
    pub marked: u64,
    /// The `HOSTS` slot (plus one) isolation charged for this CPU's last packet of the
    /// class, which the datapath takes back if the class drops the packet: not a counter,
    /// and not summed.
    pub charged_host: u64,
    /// Packets that reached a class with no rate set (passed unpaced).
    pub unpaced_packets: u64,
    /// Packets sent (segments for GSO packets) by added delay, see [`delay_bucket`].
    pub delay_hist: [u64; DELAY_BUCKETS],
    /// Dropped because the departure time was beyond the horizon.
    pub drop_horizon_bytes: u64,
    pub drop_horizon_packets: u64,
    /// AQM congestion signals: ECN-capable packets marked CE, others dropped.
    pub ecn_marked_packets: u64,
    pub drop_aqm_packets: u64,
    pub drop_aqm_bytes: u64,
    /// Isolation: bytes from light hosts (well within their fair share); hosts counted once
    /// per epoch, those near their share and those over it (each of the three as two 32-bit
    /// counters, see [`epoch_unit`]); packets and bytes dropped because their host was over
    /// its share by more than the share horizon.
    pub share_under_bytes: u64,
    pub hosts_near: u64,
    pub hosts_over: u64,
    pub drop_share_packets: u64,
    pub drop_share_bytes: u64,
}

/// What the datapath adds to an isolation counter (`ClassStats::share_under_bytes`,
/// `hosts_near`, `hosts_over`) for one unit counted in `epoch`: the low 32 bits count the even
/// epochs, the high 32 bits the odd ones. shaperd starts an epoch at each tick and reads the
/// counters after that; a host counted in the epoch that just ended, after the last read, and
/// again in the new one, before this read, was in one tick's difference twice (a class's only
/// host halved its own share, one tick in eight in a VM). Split by epoch, the half of the
/// epoch that ended moved only in it since the read before the last. A low half that wraps
/// carries one into the high half: one unit more, once every 2^32.
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
#[must_use]
pub const fn epoch_unit(epoch: u32) -> u64 {
    1 << epoch_shift(epoch)
}

/// Where the counters of `epoch`'s parity are in an isolation counter (see [`epoch_unit`]).
#[expect(clippy::inline_always, reason = "called per packet in the tc program, which has no calls to spare")]
#[inline(always)]
const fn epoch_shift(epoch: u32) -> u32 {
    (epoch & 1) * 32
}

/// The isolation counters of the epochs of `epoch`'s parity (see [`epoch_unit`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EpochCounts {
    pub share_under_bytes: u32,
    pub hosts_near: u32,
    pub hosts_over: u32,
}

impl EpochCounts {
    /// What was counted between `earlier` and `self` (wrapping).
    #[must_use]
    pub const fn since(self, earlier: Self) -> Self {
        Self {
            share_under_bytes: self.share_under_bytes.wrapping_sub(earlier.share_under_bytes),
            hosts_near: self.hosts_near.wrapping_sub(earlier.hosts_near),
            hosts_over: self.hosts_over.wrapping_sub(earlier.hosts_over),
        }
    }
}

/// A class's isolation counters as the datapath keeps them (see [`epoch_unit`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IsolationCounters {
    pub share_under_bytes: u64,
    pub hosts_near: u64,
    pub hosts_over: u64,
}

impl IsolationCounters {
    /// The counters of the epochs of `epoch`'s parity.
    #[must_use]
    #[expect(clippy::cast_possible_truncation, reason = "the halves, as documented")]
    pub const fn epoch(self, epoch: u32) -> EpochCounts {
        let shift = epoch_shift(epoch);
        EpochCounts {
            share_under_bytes: (self.share_under_bytes >> shift) as u32,
            hosts_near: (self.hosts_near >> shift) as u32,
            hosts_over: (self.hosts_over >> shift) as u32,
        }
    }
}

impl ClassStats {
    /// The isolation counters.
    #[must_use]
    pub const fn isolation(&self) -> IsolationCounters {
        IsolationCounters {
            share_under_bytes: self.share_under_bytes,
            hosts_near: self.hosts_near,
            hosts_over: self.hosts_over,
        }
    }

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
        self.flow_misses += o.flow_misses;
        self
    }
}

const _: () = assert!(core::mem::size_of::<IfaceConfig>() == 40);
const _: () = assert!(core::mem::size_of::<IfaceSlot>() == 48);
/// Words of [`ActiveClasses`]: a bit per class id.
pub const ACTIVE_WORDS: usize = (MAX_CLASSES as usize).div_ceil(64);

/// The classes that counted a packet since shaperd last looked (`ACTIVE`, one value). The
/// datapath sets a class's bit with the first packet a CPU counts there in a generation
/// (`Globals::active_gen`); each tick shaperd reads the bits, clears them, moves the
/// generation on, and reads the counters and clock of the marked classes only: a class
/// without packets has neither counted nor moved its clock since.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ActiveClasses {
    pub words: [u64; ACTIVE_WORDS],
}

impl Default for ActiveClasses {
    fn default() -> Self {
        Self { words: [0; ACTIVE_WORDS] }
    }
}

impl ActiveClasses {
    /// Whether class `class`'s bit is set.
    #[must_use]
    pub fn has(&self, class: u32) -> bool {
        self.words.get(class as usize / 64).is_some_and(|w| w & (1 << (class % 64)) != 0)
    }
}

const _: () = assert!(IFACE_SLOTS.is_power_of_two());
const _: () = assert!(core::mem::size_of::<Globals>() == 24);
const _: () = assert!(core::mem::size_of::<FlowEntry>() == 16);
// A class id and `NO_RULE` (0xffff there) fit in `FlowEntry::word`'s 16 bits apart.
const _: () = assert!(MAX_CLASSES < 0xffff);
const _: () = assert!(core::mem::size_of::<RuleKey>() == RULE_KEY_WORDS * 8);
const _: () = assert!(core::mem::size_of::<Tuple>() == 8 * RULE_KEY_WORDS + 8);
const _: () = assert!(core::mem::size_of::<RuleTarget>() == 8);
const _: () = assert!(core::mem::size_of::<ClassConfig>() == 112);
const _: () = assert!(core::mem::size_of::<HostState>() == 16);
const _: () = assert!(core::mem::size_of::<ClassState>() == 64);
const _: () = assert!(core::mem::size_of::<ClassStats>() == 160 + 8 * DELAY_BUCKETS);

/// `LAN_IFACES` value flags: the LAN-side interface has no link-layer header (as
/// [`IFACE_L3`]).
pub const LAN_L3: u32 = 1;

/// Packet origins remembered (`ORIGINS`, an LRU hash keyed by the skb's flow hash).
pub const ORIGIN_SLOTS: u32 = 32768;

/// Value of `ORIGINS`: a flow as it came in on a LAN-side interface, before the gateway's
/// source NAT. The key is the skb's flow hash, which the kernel computes once (at LAN
/// ingress, from the original addresses and ports) and keeps while the packet is routed and
/// translated, so the WAN egress program finds the record by the same hash. Destination,
/// its port, the protocol and the family are what source NAT leaves alone: the egress
/// program takes the source (address, port and Ethernet address) from a record only if they
/// match the packet it holds.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Origin {
    pub src: [u8; 16],
    pub dst: [u8; 16],
    /// Raw ports as on the wire (0 for packets without ports).
    pub sport: u16,
    pub dport: u16,
    pub family: u8,
    pub proto: u8,
    /// The Ethernet source address the host's frame came with (zero on a LAN-side interface
    /// without a link-layer header): routing replaces it with the gateway's own, so
    /// `src_mac` rules on the WAN interface match it only through the record.
    pub src_mac: [u8; 6],
    pub _pad: [u8; 4],
}
const _: () = assert!(core::mem::size_of::<Origin>() == 48);

/// Name of the program attached at ingress of an interface whose arriving packets are shaped
/// (`direction = "ingress"`): it redirects them to the egress of the interface's IFB device,
/// where the shaper program paces them (see [`maps::IFB_TARGETS`]).
pub const IFB_PROGRAM_NAME: &str = "shaper_ifb";

/// Most interfaces shaped on ingress (`IFB_TARGETS`: ifindex of the interface → ifindex of
/// its IFB device). Each is also a shaped interface: one of [`MAX_INTERFACES`].
pub const MAX_IFB_TARGETS: u32 = MAX_INTERFACES;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all of these are `#[repr(C)]`, made only of integers, with explicit padding,
    // so every bit pattern is valid and there are no uninitialised bytes.
    unsafe impl aya::Pod for super::IfaceConfig {}
    unsafe impl aya::Pod for super::IfaceSlot {}
    unsafe impl aya::Pod for super::Globals {}
    unsafe impl aya::Pod for super::RuleKey {}
    unsafe impl aya::Pod for super::Tuple {}
    unsafe impl aya::Pod for super::RuleTarget {}
    unsafe impl aya::Pod for super::ClassConfig {}
    unsafe impl aya::Pod for super::ClassState {}
    unsafe impl aya::Pod for super::ClassStats {}
    unsafe impl aya::Pod for super::HostState {}
    unsafe impl aya::Pod for super::Origin {}
    unsafe impl aya::Pod for super::FlowEntry {}
    unsafe impl aya::Pod for super::CacheMasks {}
    unsafe impl aya::Pod for super::ActiveClasses {}
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;

    /// A host counted in an epoch after shaperd's read and again in the next before the next
    /// read (each tick starts an epoch, then reads): the epoch that ended counts it once.
    #[test]
    fn the_ended_epoch_counts_each_host_once() {
        let count = |stats: &mut ClassStats, epoch: u32, bytes: u64| {
            stats.hosts_over += epoch_unit(epoch);
            stats.share_under_bytes += bytes * epoch_unit(epoch);
        };
        let mut stats = ClassStats::default();
        let mut reads = [IsolationCounters::default(); 2];
        // Tick 1 starts epoch 7 and reads; the host is counted in 7 after the read, with 500
        // light bytes before that, and (tick 2 starts epoch 8) in 8 before tick 2 reads.
        count(&mut stats, 7, 500);
        reads = [reads[1], stats.isolation()];
        count(&mut stats, 7, 0);
        count(&mut stats, 8, 0);
        reads = [reads[1], stats.isolation()];
        // Tick 3 starts epoch 9: epoch 8 counted it once, and it is in the 32 bits of the
        // even epochs only.
        count(&mut stats, 9, 0);
        let ended = stats.isolation().epoch(8).since(reads[0].epoch(8));
        assert_eq!(ended, EpochCounts { share_under_bytes: 0, hosts_near: 0, hosts_over: 1 });
        assert_eq!(stats.isolation().epoch(7), EpochCounts { share_under_bytes: 500, hosts_near: 0, hosts_over: 3 });
        // Tick 2's difference over the epochs of both parities (as before the split) counted
        // it twice.
        let both = |c: IsolationCounters| c.epoch(0).hosts_over + c.epoch(1).hosts_over;
        assert_eq!(both(reads[1]) - both(reads[0]), 2);
        // A half that wraps carries one into the other, and its own difference is right.
        let before = IsolationCounters { share_under_bytes: u64::from(u32::MAX), ..IsolationCounters::default() };
        let after = IsolationCounters { share_under_bytes: u64::from(u32::MAX) + 10, ..before };
        assert_eq!(after.epoch(0).since(before.epoch(0)).share_under_bytes, 10);
    }

    /// xorshift64*: made-up keys for the flow hash's tests.
    fn next(state: &mut u64) -> u64 {
        *state ^= *state >> 12;
        *state ^= *state << 25;
        *state ^= *state >> 27;
        state.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    #[test]
    fn a_packet_paced_by_byte_ns_takes_what_the_division_gives() {
        let mut rng = 11;
        for _ in 0..200_000 {
            let rate = match next(&mut rng) % 3 {
                0 => 1 + next(&mut rng) % 1_000,
                1 => 1 + next(&mut rng) % 100_000_000,
                _ => 1 + next(&mut rng) % 100_000_000_000,
            };
            let bytes = next(&mut rng) % (1 << 20);
            let exact = bytes * 1_000_000_000 / rate;
            let paced = pace_ns(bytes, byte_ns(rate));
            assert!(paced <= exact && exact - paced <= 1, "{bytes} bytes at {rate} B/s: {paced} ns, not {exact}");
        }
        assert_eq!(pace_ns(1500, byte_ns(0)), 0);
        assert_eq!(pace_ns((1 << 31) - 1, byte_ns(1)), ((1 << 31) - 1) * 1_000_000_000);
    }

    #[test]
    fn flows_that_differ_in_one_bit_have_other_hashes() {
        let mut rng = 7;
        for _ in 0..2_000 {
            let words: [u64; RULE_KEY_WORDS] = core::array::from_fn(|_| next(&mut rng));
            let [sport, dport, ..] = [next(&mut rng), next(&mut rng)].map(|v| u16::try_from(v >> 48).unwrap());
            let h = flow_hash(&words, sport, dport);
            for bit in 0..64 * RULE_KEY_WORDS {
                let (w, b) = (bit / 64, 1u64 << (bit % 64));
                let mut other = words;
                other[w] ^= b;
                let moved = flow_hash(&other, sport, dport) != h;
                assert_eq!(moved, FLOW_KEY_MASK[w] & b != 0, "word {w} bit {}", bit % 64);
            }
            for b in 0..16 {
                assert_ne!(flow_hash(&words, sport ^ (1 << b), dport), h);
                assert_ne!(flow_hash(&words, sport, dport ^ (1 << b)), h);
            }
        }
    }

    /// The class cache's hash keeps the fields a bank's rules test and drops the others:
    /// under rules that name source hosts, a host's flows share one entry whatever their
    /// ports and destinations; where the rules also test the destination port, two ports
    /// are two entries. Each bank hashes under its own mask.
    #[test]
    fn the_class_cache_hash_keeps_what_the_rules_test() {
        let (src, dport) = ((core::mem::offset_of!(RuleKey, src), 16), (core::mem::offset_of!(RuleKey, dport), 2));
        let hosts = Tuple { mask: key_bits(&[src]), min_rule: 0, filter_mask: 0 };
        let host_ports = Tuple { mask: key_bits(&[src, dport]), min_rule: 0, filter_mask: 0 };
        let masks = CacheMasks { banks: [cache_mask([&hosts]), cache_mask([&host_ports])] };
        let key = |host: u8, server: u8| RuleKey {
            family: 4,
            proto: 6,
            src: [10, 0, 0, host, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            dst: [192, 0, 2, server, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..RuleKey::default()
        };
        let hash = |k: &RuleKey, sport: u16, dport: u16, bank: u32| {
            cache_hash(k.words(), &masks, bank, u32::from(sport) | u32::from(dport) << 16)
        };
        let (a, b) = (key(1, 7), key(1, 9));
        assert_eq!(hash(&a, 1024, 443, 0), hash(&b, 2048, 80, 0), "one host's flows, hosts named");
        assert_ne!(hash(&a, 1024, 443, 0), hash(&key(2, 7), 1024, 443, 0), "two hosts");
        assert_eq!(hash(&a, 1024, 443, 1), hash(&b, 2048, 443, 1), "one host, one port");
        assert_ne!(hash(&a, 1024, 443, 1), hash(&a, 1024, 80, 1), "one host, two ports tested");
        let mut other_iface = a;
        other_iface.iface = 1;
        assert_ne!(hash(&a, 1024, 443, 0), hash(&other_iface, 1024, 443, 0), "two interfaces");
    }

    /// Flows as a gateway's are alike: one host's differ in their source port only, hosts
    /// in their address's last bits. Their hashes spread over the slots of `FLOWS` as random
    /// ones would (at one flow a slot on average, none above 10), and no two share a slot
    /// and a tag.
    #[test]
    fn alike_flows_spread_over_the_flows_table() {
        let mut key = RuleKey {
            family: 4,
            proto: 6,
            dst: [192, 0, 2, 7, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
            ..RuleKey::default()
        };
        let (mut sets, mut seen) = (vec![0u32; FLOW_SLOTS as usize], std::collections::HashSet::new());
        let flows = FLOW_SLOTS;
        for i in 0..flows {
            let [_, _, host, port] = i.to_be_bytes();
            key.src = [10, 0, host >> 6, host & 0x3f, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0];
            let h = flow_hash(key.words(), 1024 + u16::from(port), 443);
            let set = u32::try_from((h >> 1) & u64::from(FLOW_SLOTS - 1)).unwrap();
            sets[set as usize] += 1;
            assert!(seen.insert((set, flow_tag(h))), "flow {i} shares its slot and tag with another");
        }
        let fullest = sets.iter().max().copied().unwrap_or(0);
        let empty = sets.iter().filter(|&&n| n == 0).count();
        // One a slot at random: e^-1 of the slots empty (36.8 %, 24,109 of 65,536).
        assert!(fullest <= 10 && (23_000..25_200).contains(&empty), "fullest slot {fullest}, {empty} slots empty");
    }

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

    #[test]
    fn class_arrays_have_room_for_as_many_classes_again() {
        assert_eq!(class_slots(0), MIN_CLASS_SLOTS);
        assert_eq!(class_slots(512), 1024);
        assert_eq!(class_slots(513), 2048);
        assert_eq!(class_slots(3000), 8192);
        assert_eq!(class_slots(8192), MAX_CLASSES);
        assert_eq!(class_slots(10_000), MAX_CLASSES);
        assert_eq!(class_slots(usize::MAX), MAX_CLASSES);
    }

    /// An interface's framing, for [`wire_len`].
    fn framing(overhead: i32, mpu: u32, linklayer: u32) -> IfaceConfig {
        IfaceConfig { overhead, mpu, linklayer, ..IfaceConfig::default() }
    }

    /// tc-stab's own example (`man tc-stab`): a 100-byte packet needs three 48-byte cell
    /// payloads, 159 bytes on the line.
    #[test]
    fn atm_cells_carry_48_bytes_in_53() {
        assert_eq!(frame_wire_len(100, 0, 0, LINKLAYER_ATM), 3 * 53);
        assert_eq!(frame_wire_len(96, 0, 0, LINKLAYER_ATM), 2 * 53, "two full cells, no padding");
        assert_eq!(frame_wire_len(97, 0, 0, LINKLAYER_ATM), 3 * 53, "one byte more takes a cell");
        assert_eq!(frame_wire_len(1, 0, 0, LINKLAYER_ATM), 53);
        // Nothing changes on Ethernet but the overhead.
        assert_eq!(frame_wire_len(100, 0, 0, LINKLAYER_ETHERNET), 100);
        assert_eq!(frame_wire_len(100, 24, 0, LINKLAYER_ETHERNET), 124);
    }

    /// A full-size packet on ADSL lines, shaped on the PPP device (`ppp0`: the skb starts at
    /// the IP header), with the overheads of `man tc-stab` and CAKE's keywords.
    #[test]
    fn a_full_size_packet_on_adsl() {
        // PPPoA, LLC (14: PPP 2, LLC 4, AAL5 trailer 8): 1514 bytes in 32 cells (1536).
        assert_eq!(frame_wire_len(1500, 14, 0, LINKLAYER_ATM), 32 * 53);
        // PPPoA, VC-mux (10): 1510 bytes, still 32 cells.
        assert_eq!(frame_wire_len(1500, 10, 0, LINKLAYER_ATM), 1696);
        // PPPoE over bridged LLC/SNAP (40: PPPoE 6, PPP 2, Ethernet 14, LLC/SNAP 10, AAL5 8):
        // 1540 bytes, 33 cells; the same line shaped at its 1500-byte IP rate would overrun by
        // 13%.
        assert_eq!(frame_wire_len(1500, 40, 0, LINKLAYER_ATM), 33 * 53);
    }

    /// A pure TCP ACK (40 bytes of IPv4 and TCP headers) is where cells cost most: 8 bytes
    /// of overhead (IP over ATM) fit it in one cell, 10 (PPP over ATM) need a second, mostly
    /// padding.
    #[test]
    fn a_pure_ack_takes_one_or_two_cells() {
        assert_eq!(frame_wire_len(40, 8, 0, LINKLAYER_ATM), 53, "IPoA VC-mux: 48 bytes, one cell");
        assert_eq!(frame_wire_len(40, 10, 0, LINKLAYER_ATM), 106, "PPPoA VC-mux: 50 bytes, two cells");
        assert_eq!(frame_wire_len(40, 40, 0, LINKLAYER_ATM), 106, "PPPoE LLC/SNAP: 80 bytes");
        // The same ACK seen on the Ethernet device under the PPPoE session: 14 + 8 + 40 = 62
        // bytes, and the overhead less the 22 bytes the device already counts.
        assert_eq!(frame_wire_len(62, 40 - 22, 0, LINKLAYER_ATM), 106);
        // A modem that keeps the Ethernet FCS pads the bridged frame to 64 bytes (RFC 2684;
        // `man tc-stab` asks for an mpu then): overhead 18 + 4, mpu 64 + LLC/SNAP 10 + AAL5 8
        // = 82. The ACK still takes two cells, and so does a frame of any size.
        assert_eq!(frame_wire_len(62, 18 + 4, 82, LINKLAYER_ATM), 106);
        assert_eq!(frame_wire_len(30, 18 + 4, 82, LINKLAYER_ATM), 106, "mpu before the cells");
    }

    /// The order: overhead, then mpu, then cells. (mpu after the cells would let a frame
    /// count between cell sizes; mpu before the overhead would count the overhead twice for
    /// small frames.)
    #[test]
    fn overhead_then_mpu_then_cells() {
        // 40 + 8 = 48 fits one cell, but an mpu of 60 makes it two.
        assert_eq!(frame_wire_len(40, 8, 60, LINKLAYER_ATM), 106);
        // An mpu below the framed length does nothing.
        assert_eq!(frame_wire_len(1500, 8, 60, LINKLAYER_ATM), 1508u64.div_ceil(48) * 53);
        // Ethernet: the mpu is the count itself (CAKE's `ethernet` keyword: overhead 38,
        // mpu 84, the 64-byte minimum frame with preamble, SFD and gap).
        assert_eq!(frame_wire_len(40, 38, 84, LINKLAYER_ETHERNET), 84);
        assert_eq!(frame_wire_len(1500, 38, 84, LINKLAYER_ETHERNET), 1538);
        // A negative overhead never makes a frame free: it counts at least one byte.
        assert_eq!(frame_wire_len(20, -64, 0, LINKLAYER_ETHERNET), 1);
        assert_eq!(frame_wire_len(20, -64, 0, LINKLAYER_ATM), 53);
        assert_eq!(frame_wire_len(20, -64, 64, LINKLAYER_ETHERNET), 64);
    }

    /// VDSL2's PTM, as CAKE counts it: a byte more per 64 bytes or part of them.
    #[test]
    fn ptm_adds_a_byte_in_65() {
        // CAKE's `pppoe-ptm` (overhead 30: PPPoE 8, Ethernet 14 and its FCS 4, PTM 4) on
        // ppp0: a 1500-byte packet is 1530 bytes, and a byte more for each of its 24 blocks.
        assert_eq!(frame_wire_len(1500, 30, 0, LINKLAYER_PTM), 1530 + 24);
        assert_eq!(frame_wire_len(64, 0, 0, LINKLAYER_PTM), 65);
        assert_eq!(frame_wire_len(65, 0, 0, LINKLAYER_PTM), 67);
        // A pure ACK under `bridged-ptm` (overhead 22) on an Ethernet device: 54 + 22 = 76.
        assert_eq!(frame_wire_len(54, 22, 0, LINKLAYER_PTM), 78);
    }

    #[test]
    fn unknown_link_layers_count_as_ethernet() {
        assert_eq!(frame_wire_len(100, 4, 0, 7), 104);
    }

    /// A GSO skb counts as the frames it leaves as: `gso_segs - 1` segments of
    /// `gso_size + hdr_len` and the rest in the last one.
    #[test]
    fn gso_segments_are_framed_one_by_one() {
        let hdr = 14 + 20 + 32;
        let atm = framing(40 - 22, 0, LINKLAYER_ATM);
        // Three full segments of 1448 bytes: 1514 bytes each, 1532 with the overhead, 32
        // cells each. The skb holds one copy of the headers.
        let len = hdr + 3 * 1448;
        assert_eq!(wire_len(len, 3, 1448, hdr, &atm), 3 * 32 * 53);
        assert_eq!(wire_len(len, 3, 1448, hdr, &atm), 3 * wire_len(hdr + 1448, 1, 0, hdr, &atm));
        // A last segment of 100 bytes of payload: 166 + 18 = 184 bytes, 4 cells.
        let len = hdr + 2 * 1448 + 100;
        assert_eq!(wire_len(len, 3, 1448, hdr, &atm), 2 * 32 * 53 + 4 * 53);
        // Cells are counted per segment, not over the skb: segments of 1537 bytes take 33
        // cells each, 47 bytes of them padding; the same bytes as one frame would take 68
        // cells, not 70.
        let len = hdr + 2 * 1453 + 100;
        assert_eq!(wire_len(len, 3, 1453, hdr, &atm), (33 + 33 + 4) * 53);
        assert_eq!(frame_wire_len(u64::from(len + 2 * hdr), 3 * 18, 0, LINKLAYER_ATM), 68 * 53);
        let len = hdr + 2 * 1448 + 100;
        // On Ethernet with a flat overhead, the count is what it always was: the skb's bytes,
        // the copied headers and the overhead per segment.
        let flat = framing(8, 0, LINKLAYER_ETHERNET);
        assert_eq!(wire_len(len, 3, 1448, hdr, &flat), u64::from(len + 2 * hdr) + 3 * 8);
        // Not GSO: the skb is one frame.
        assert_eq!(wire_len(100, 0, 0, hdr, &atm), frame_wire_len(100, 18, 0, LINKLAYER_ATM));
        assert_eq!(wire_len(100, 1, 0, hdr, &atm), frame_wire_len(100, 18, 0, LINKLAYER_ATM));
    }

    /// Without a usable `gso_size`, the payload is split evenly: the bytes still add up, and
    /// equal segments are counted exactly.
    #[test]
    fn gso_without_a_segment_size_splits_evenly() {
        let hdr = 66;
        let flat = framing(0, 0, LINKLAYER_ETHERNET);
        let atm = framing(0, 0, LINKLAYER_ATM);
        for (len, segs, size) in [(hdr + 3 * 1448, 3, 0), (hdr + 1001, 4, 0), (hdr + 100, 2, 1000), (hdr + 10, 40, 0)] {
            assert_eq!(wire_len(len, segs, size, hdr, &flat), u64::from(len + (segs - 1) * hdr), "{len} {segs} {size}");
        }
        assert_eq!(wire_len(hdr + 3 * 1448, 3, 0, hdr, &atm), wire_len(hdr + 3 * 1448, 3, 1448, hdr, &atm));
        // Headers longer than the skb (a parser that gave up): no underflow.
        assert_eq!(wire_len(50, 2, 0, 66, &flat), 50);
    }
}
