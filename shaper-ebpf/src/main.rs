//! The shaper datapath: a tc egress classifier.
//!
//! For each packet: parse the headers, classify into a class (first matching rule in file
//! order, else the interface's default class), count it, and give it an earliest departure
//! time from the class's rate; the `fq` qdisc holds it until then. Userspace (shaperd) owns
//! every map: it compiles the rules, sets each class's rate, and reads the counters.
#![no_std]
#![no_main]
#![feature(core_intrinsics)]
#![allow(internal_features)]
// The map methods take `impl Borrow<K>`: passing a key by value instead of by reference
// changes the stack slots and instructions LLVM emits, and this program's code is the one
// verified to fit the kernel's limits (Linux 6.1's instruction count and stack frames).
#![expect(clippy::needless_borrows_for_generic_args, reason = "keeps the generated BPF code as verified")]

mod aqm;
mod classify;
mod edt;
mod flow;
mod parse;

use flow::Flow;

use aya_ebpf::{
    bindings::{BPF_F_NO_PREALLOC, TC_ACT_OK, TC_ACT_SHOT},
    helpers::{bpf_get_hash_recalc, bpf_ktime_get_ns, bpf_redirect},
    macros::{classifier, map},
    maps::{Array, HashMap, LruHashMap, PerCpuArray},
    programs::TcContext,
};
use shaper_common::{
    delay_bucket, frames_ns, pace_ns, ActiveClasses, ClassConfig, ClassState, ClassStats, Globals, HostState,
    IfaceConfig, IfaceSlot, LinkState, Origin, RuleKey, RuleTarget, Tuple, ACTIVE_WORDS, CLASS_BORROWING, CLASS_QUIET,
    DSCP_OVER, DSCP_SET, FILTER_WORDS, FULL_FRAME, HOLD_MAX_NS, HOST_SETS, HOST_SLOTS, HOST_WAYS, IFACE_DOWNLOAD,
    IFACE_L3, IFACE_NAT, ISOLATE_FLOW, ISOLATE_NONE, LAN_L3, MAX_CLASSES, MAX_IFB_TARGETS, MAX_INTERFACES,
    MAX_RULE_ENTRIES, MAX_TUPLES, NEAR_EPOCH_SHIFT, NO_RULE, ORIGIN_SLOTS, OVER_EPOCH_SHIFT, PORT_SLOTS,
    PROFILE_BURST_FRAMES, RULE_BANKS, SPARSE_MAX_QUEUE_FRAMES, SPARSE_SHARE,
};

#[map]
static IFACES: HashMap<u32, IfaceConfig> = HashMap::with_max_entries(MAX_INTERFACES, 0);
#[map]
static IFACE_SLOTS: Array<IfaceSlot> = Array::with_max_entries(shaper_common::IFACE_SLOTS, 0);
#[map]
static GLOBALS: Array<Globals> = Array::with_max_entries(1, 0);
#[map]
static TUPLES: Array<Tuple> = Array::with_max_entries(MAX_TUPLES * RULE_BANKS, 0);
/// Not preallocated: an entry's memory is taken when shaperd writes it. Preallocated, the
/// map took 16 MiB of kernel memory whatever the rules (its elements, 128 bytes each, for
/// every entry of both banks).
#[map]
static RULES: HashMap<RuleKey, RuleTarget> =
    HashMap::with_max_entries(MAX_RULE_ENTRIES * RULE_BANKS, BPF_F_NO_PREALLOC);
/// The rule banks' filters in front of `RULES` (see `shaper_common::FILTER_WORDS`).
#[map]
static RULE_FILTER: Array<u64> = Array::with_max_entries(FILTER_WORDS * RULE_BANKS, 0);
#[map]
static SPORT_IDS: Array<u16> = Array::with_max_entries(PORT_SLOTS * RULE_BANKS, 0);
#[map]
static DPORT_IDS: Array<u16> = Array::with_max_entries(PORT_SLOTS * RULE_BANKS, 0);
/// IP length → its interval id (as the port tables; two banks).
#[map]
static LEN_IDS: Array<u16> = Array::with_max_entries(PORT_SLOTS * RULE_BANKS, 0);
#[map]
static CLASS_CONFIG: Array<ClassConfig> = Array::with_max_entries(MAX_CLASSES, 0);
#[map]
static CLASS_STATE: Array<ClassState> = Array::with_max_entries(MAX_CLASSES, 0);
#[map]
static CLASS_STATS: PerCpuArray<ClassStats> = PerCpuArray::with_max_entries(MAX_CLASSES, 0);
/// Hosts (or flows) of classes by their hash, in sets of four consecutive entries (one cache
/// line) → each one's clock at its fair share (isolation inside classes; see [`share`]).
#[map]
static HOSTS: Array<HostState> = Array::with_max_entries(HOST_SLOTS, 0);
/// The classes that counted a packet since shaperd last read them (`ActiveClasses`).
#[map]
static ACTIVE: Array<ActiveClasses> = Array::with_max_entries(1, 0);
/// Interface slot → the link clock and the quiet classes' hold (`LinkState`).
#[map]
static LINKS: Array<LinkState> = Array::with_max_entries(MAX_INTERFACES, 0);

/// `__sk_buff.tstamp_type` value for a CLOCK_MONOTONIC delivery time
/// (`BPF_SKB_TSTAMP_DELIVERY_MONO` since 5.18, renamed `BPF_SKB_CLOCK_MONOTONIC` in 6.11).
const TSTAMP_MONO: u8 = 1;

/// Interfaces on the hosts' side of a NAT (ifindex → `LAN_*` flags): the LAN-ingress program
/// records the origin of the packets that come in there.
#[map]
static LAN_IFACES: HashMap<u32, u32> = HashMap::with_max_entries(MAX_INTERFACES, 0);
/// Flow hash → the flow as it came in on a LAN-side interface (see [`Origin`]).
#[map]
static ORIGINS: LruHashMap<u32, Origin> = LruHashMap::with_max_entries(ORIGIN_SLOTS, 0);

#[classifier]
pub fn shaper_egress(ctx: TcContext) -> i32 {
    // Anything unexpected lets the packet through unshaped rather than dropping traffic.
    try_egress(&ctx).unwrap_or(TC_ACT_OK)
}

/// Attached at ingress of the LAN-side interfaces of a gateway that masquerades: records each
/// flow's source address and port as the host sent them, under the skb's flow hash, for the
/// egress program of the WAN interface to classify the translated packet by (see
/// [`restore_origin`]). Never drops or changes a packet.
#[classifier]
pub fn shaper_ingress(ctx: TcContext) -> i32 {
    record_origin(&ctx);
    TC_ACT_OK
}

#[inline(always)]
fn record_origin(ctx: &TcContext) {
    let skb = ctx.skb.skb;
    // SAFETY: the context pointer is valid for the whole program run; at ingress, `ifindex`
    // is the receiving device's.
    let ifindex = unsafe { (*skb).ifindex };
    // SAFETY: the value lives as long as the map.
    let Some(flags) = (unsafe { LAN_IFACES.get(&ifindex) }) else { return };
    let mut key = core::mem::MaybeUninit::<RuleKey>::uninit();
    let key = zero_in_place(&mut key);
    let Ok(p) = parse::parse(ctx, *flags & LAN_L3 != 0, key) else { return };
    if key.family == 0 {
        return;
    }
    // The hash the kernel computes here from the original addresses and ports stays with
    // the skb through routing and NAT (nothing on the forwarding path clears it; a
    // reassembled fragment gets a new one), and the egress program reads the same value.
    // SAFETY: the helper only computes (and caches) the skb's flow hash.
    let hash = unsafe { bpf_get_hash_recalc(skb) };
    let origin = Origin {
        src: key.src,
        dst: key.dst,
        sport: p.sport(),
        dport: p.dport(),
        family: key.family,
        proto: key.proto,
        src_mac: key.src_mac,
        _pad: [0; 4],
    };
    match ORIGINS.get_ptr_mut(&hash) {
        // The flow's later packets find their record as it is: no write, no LRU update.
        // SAFETY: a valid map value pointer; a plain read.
        Some(old) if same_origin(unsafe { &*old }, &origin) => {}
        // A flow whose hash another flow had (or NAT on the LAN side changed it): rewritten in
        // place. Two CPUs writing at once may mix two records, which the egress program's
        // check of the destination rejects.
        // SAFETY: as above; the value lives as long as the map.
        Some(old) => unsafe { core::ptr::write_volatile(old, origin) },
        None => {
            let _ = ORIGINS.insert(&hash, &origin, 0);
        }
    }
}

/// Whether two origins are the same flow (field by field: a comparison of the structs as a
/// whole would call `memcmp`, which BPF has not).
#[inline(always)]
fn same_origin(a: &Origin, b: &Origin) -> bool {
    same16(&a.src, &b.src)
        && same16(&a.dst, &b.dst)
        && a.sport == b.sport
        && a.dport == b.dport
        && a.family == b.family
        && a.proto == b.proto
        && a.src_mac == b.src_mac
}

#[inline(always)]
fn same16(a: &[u8; 16], b: &[u8; 16]) -> bool {
    let (a, b) = (a.as_ptr().cast::<u64>(), b.as_ptr().cast::<u64>());
    // SAFETY: both point to 16 readable bytes; unaligned reads.
    unsafe {
        core::ptr::read_unaligned(a) == core::ptr::read_unaligned(b)
            && core::ptr::read_unaligned(a.add(1)) == core::ptr::read_unaligned(b.add(1))
    }
}

/// On a WAN interface behind which hosts are translated (`IFACE_NAT`): puts back the source
/// address and port the packet's flow had on the LAN side, if a record of it is found under
/// the skb's flow hash and agrees with the packet on what source NAT leaves alone
/// (destination, its port, protocol, family). Rules on `src` (and `sport`, `src_mac`) then
/// match the host's own, and isolation sees each host apart. Not inlined: a frame of its own, as
/// `link_take`.
#[inline(never)]
fn restore_origin(skb: *mut aya_ebpf::bindings::__sk_buff, key: &mut RuleKey, p: &mut parse::Parsed) {
    // SAFETY: the helper only reads (and caches) the skb's flow hash.
    let hash = unsafe { bpf_get_hash_recalc(skb) };
    // SAFETY: the value lives as long as the map; fields are read once.
    let Some(o) = (unsafe { ORIGINS.get(&hash) }) else { return };
    if o.family == key.family && o.proto == key.proto && o.dport == p.dport() && same16(&o.dst, &key.dst) {
        key.src = o.src;
        key.src_mac = o.src_mac;
        p.set_sport(o.sport);
    }
}

/// Interfaces whose arriving packets are shaped (`direction = "ingress"`): ifindex → ifindex
/// of the interface's IFB device.
#[map]
static IFB_TARGETS: HashMap<u32, u32> = HashMap::with_max_entries(MAX_IFB_TARGETS, 0);

/// Attached at ingress of an interface shaped on ingress: sends each arriving packet to the
/// egress of the interface's IFB device, where `shaper_egress` paces it and `fq` holds it.
/// The IFB gives it back to the stack at ingress of this interface once `fq` releases it
/// (`ifb_ri_tasklet()` in drivers/net/ifb.c: `netif_receive_skb()` on the device of
/// `skb_iif`, with `tc_skip_classify` set so that this program does not see it again).
/// `bpf_redirect()` to a device's egress marks the skb as redirected from ingress, which
/// `ifb_xmit()` requires (`skb_set_redirected_noclear()` in `__bpf_tx_skb()`, since Linux
/// 6.4: "bpf: Set skb redirect and from_ingress info in __bpf_tx_skb"; before, the IFB drops
/// every packet), and clears a receive timestamp (`skb_clear_tstamp()`): the IFB's `fq` sees
/// only the departure time the shaper sets. shaperd attaches it with TCX (6.6 and later);
/// under clsact it redirects with `act_mirred` instead.
#[classifier]
pub fn shaper_ifb(ctx: TcContext) -> i32 {
    // SAFETY: the context pointer is valid for the whole program run; at ingress, `ifindex`
    // is the receiving device's.
    let ifindex = unsafe { (*ctx.skb.skb).ifindex };
    // SAFETY: the value lives as long as the map.
    match unsafe { IFB_TARGETS.get(&ifindex) } {
        Some(&ifb) => {
            // SAFETY: helper without preconditions.
            let verdict = unsafe { bpf_redirect(ifb, 0) };
            // TC_ACT_REDIRECT; an IFB that is gone meanwhile drops the packet, as act_mirred
            // does with a device that is gone.
            i32::try_from(verdict).unwrap_or(TC_ACT_SHOT)
        }
        // Not (or no longer) shaped: the packet goes on unshaped.
        None => TC_ACT_OK,
    }
}

/// Does nothing: the baseline that `cargo xtask bench` measures the datapath against (the
/// cost of `BPF_PROG_TEST_RUN` and of a tc program run as such). Never attached.
#[classifier]
pub fn shaper_pass(_ctx: TcContext) -> i32 {
    TC_ACT_OK
}

fn try_egress(ctx: &TcContext) -> Result<i32, ()> {
    let skb = ctx.skb.skb;
    // SAFETY: the context pointer is valid for the whole program run.
    let ifindex = unsafe { (*skb).ifindex };
    let iface = &iface_config(ifindex).ok_or(())?;

    let mut key = core::mem::MaybeUninit::<RuleKey>::uninit();
    let key = zero_in_place(&mut key);
    key.iface = iface.slot as u16;
    // SAFETY: as above.
    key.mark = unsafe { (*skb).mark };
    let set = classify::rule_set().ok_or(())?;
    let (rule_class, flow, hdr_len, ip) = match parse::parse(ctx, iface.flags & IFACE_L3 != 0, key) {
        Ok(mut p) => {
            if iface.flags & IFACE_NAT != 0 {
                restore_origin(skb, key, &mut p);
            }
            // The class cache first: the rules are searched for the first packet of those
            // that agree on the fields they test (a host's, when they name hosts), or after
            // the rules changed, not for each. A hit does not call the classifier: a call and
            // its return cost about 8 ns (see `edt::take_slot_packed`).
            let flow = Flow::find(key, p.ports, set);
            let cached = flow.class(set);
            let rule_class = if cached == flow::NOT_HELD {
                // The cache's hash before the classifier puts interval ids in the key.
                let key_tag = Flow::key_tag(key, p.ports, set);
                let class = classify::flow_class(key, &p, set.packed()) as u32;
                flow.remember(key_tag, class);
                class
            } else {
                cached as u32
            };
            (rule_class, flow, p.hdr_len, IpEcn { family: key.family, l3: p.l3, ecn: p.ecn })
        }
        Err(parse::Malformed) => (NO_RULE, Flow::none(), 0, IpEcn { family: 0, l3: 0, ecn: 0 }),
    };
    let class = if rule_class == NO_RULE { iface.default_class } else { rule_class };
    // The host is the address on the hosts' side of the gateway: the source of an upload,
    // the destination of a download (zero for packets that are not IP).
    let host = if iface.flags & IFACE_DOWNLOAD != 0 { &key.dst } else { &key.src };
    // SAFETY: 16 bytes at an offset of the key that is a multiple of 8 (asserted below), in
    // a key aligned to 8.
    let host = unsafe { &*host.as_ptr().cast::<[u64; 2]>() };
    Ok(shape(ctx, &Packet { class, rule_class, flow, hdr_len, ip, host, iface, active_gen: set.active_gen }))
}

/// The settings of interface `ifindex`: its slot's copy in `IFACE_SLOTS` if it holds the
/// slot, else its entry in `IFACES`. A copy either way: a reference into one map or the other
/// would make the verifier walk the rest of the program once for each.
#[inline(always)]
fn iface_config(ifindex: u32) -> Option<IfaceConfig> {
    if let Some(slot) = IFACE_SLOTS.get_ptr(shaper_common::iface_slot(ifindex)) {
        // SAFETY: a valid map value pointer (an array's, never freed). shaperd rewrites a slot
        // only when the configuration changes; a packet that reads half of the old settings
        // and half of the new is shaped by a mix of both, as with the hash map's entry.
        let slot = unsafe { &*slot };
        // An empty slot's ifindex is 0, which no interface has.
        if slot.ifindex == ifindex && ifindex != 0 {
            return Some(slot.config);
        }
    }
    // SAFETY: the value lives as long as the map.
    unsafe { IFACES.get(&ifindex) }.copied()
}

const _: () = assert!(
    core::mem::offset_of!(RuleKey, src).is_multiple_of(8) && core::mem::offset_of!(RuleKey, dst).is_multiple_of(8)
);

/// What the parser and the classifier learnt of a packet, for [`shape`].
struct Packet<'a> {
    class: u32,
    /// The rules' answer: `class`, or `NO_RULE` if the interface's default applies.
    rule_class: u32,
    flow: Flow,
    /// Bytes of headers every GSO segment carries.
    hdr_len: u32,
    ip: IpEcn,
    /// The packet's host (see [`share`]): an address of the key, as two words.
    host: &'a [u64; 2],
    /// The interface's settings: its per-packet overhead and its link clock.
    iface: &'a IfaceConfig,
    /// `Globals::active_gen` as the packet found it.
    active_gen: u32,
}

/// Takes `cost` ns on the link clock at `clock`; returns when the bytes paced before will
/// have left (`now` at the latest). A clock behind now restarts from now (one attempt; a
/// lost race takes the slot after the winner's). Inlined, as `edt::take_slot_packed`: every
/// packet of an interface with a link rate takes its time here.
#[inline(always)]
fn link_take(clock: *mut u64, cost: u64, now: u64) -> u64 {
    // SAFETY: a pointer into an array map value (`LINKS`), which lives as long as the map.
    let last = unsafe { core::ptr::read_volatile(clock) };
    // SAFETY: as above.
    if last <= now && unsafe { edt::cas(clock, last, now + cost) } {
        return now;
    }
    // SAFETY: as above.
    let old = unsafe { edt::fetch_add(clock, cost) };
    if old > now {
        old
    } else {
        now
    }
}

/// Holds the borrowers behind a quiet class's packet that waits for the link: the packet
/// leaves at the link clock `committed`, or at its class's clock at `class_next` if that is
/// later; the hold at `hold` moves to when it will have left (`cost` later), if that is
/// later, but no further than [`HOLD_MAX_NS`] after `now`. Returns the packet's start. Two
/// attempts: a lost race against another quiet packet leaves the later of the two, or one
/// frame short. Not inlined: a frame of its own keeps the verifier's walk of `shape` within
/// bounds on older kernels, and only a quiet class's packets that wait for the link call it.
#[inline(never)]
fn hold_behind(hold: *mut u64, committed: u64, class_next: *mut u64, cost: u64, now: u64) -> u64 {
    // SAFETY: a pointer into an array map value (`CLASS_STATE`), valid for the program run.
    let own = unsafe { core::ptr::read_volatile(class_next) };
    let start = if own > committed { own } else { committed };
    let until = if start + cost < now + HOLD_MAX_NS { start + cost } else { now + HOLD_MAX_NS };
    for _ in 0..2 {
        // SAFETY: a pointer into an array map value (`LINKS`), which lives as long as the map.
        let last = unsafe { core::ptr::read_volatile(hold) };
        // SAFETY: as above.
        if last >= until || unsafe { edt::cas(hold, last, until) } {
            break;
        }
    }
    start
}

/// The start of a borrower's packet: `t0`, or the hold at `hold` if later. Not inlined, as
/// `hold_behind`.
#[inline(never)]
fn after_hold(hold: *mut u64, t0: u64) -> u64 {
    // SAFETY: a pointer into an array map value (`LINKS`), which lives as long as the map.
    let until = unsafe { core::ptr::read_volatile(hold) };
    if until > t0 {
        until
    } else {
        t0
    }
}

/// One packet's time on the link clock.
struct LinkSlot {
    link: Option<*mut LinkState>,
    cost: u64,
}

impl LinkSlot {
    #[inline(always)]
    fn new(iface: &IfaceConfig, bytes: u64) -> Self {
        let link = if iface.link_bytes == 0 { None } else { LINKS.get_ptr_mut(iface.slot) };
        Self { link, cost: pace_ns(bytes, iface.link_byte_ns) }
    }

    /// Takes the packet's time on the link clock: returns when the bytes paced before it
    /// will have left (`now` at the latest, or if there is no link clock).
    #[inline(always)]
    fn take(&self, now: u64) -> u64 {
        match self.link {
            // SAFETY: a pointer into an array map value; no reference is created.
            Some(link) => link_take(unsafe { core::ptr::addr_of_mut!((*link).next_ns) }, self.cost, now),
            None => now,
        }
    }

    /// A quiet class's packet waits for the link: it starts at `committed` (or its class's
    /// clock at `class_next`, if later), and the borrowers are held behind it.
    #[inline(always)]
    fn hold_behind(&self, committed: u64, class_next: *mut u64, now: u64) -> u64 {
        match self.link {
            // SAFETY: a pointer into an array map value; no reference is created.
            Some(link) => {
                hold_behind(unsafe { core::ptr::addr_of_mut!((*link).hold_ns) }, committed, class_next, self.cost, now)
            }
            None => committed,
        }
    }

    /// A borrower's packet starts at `t0`, or behind the quiet classes' packets held for
    /// the link.
    #[inline(always)]
    fn after_hold(&self, t0: u64) -> u64 {
        match self.link {
            // SAFETY: as above.
            Some(link) => after_hold(unsafe { core::ptr::addr_of_mut!((*link).hold_ns) }, t0),
            None => t0,
        }
    }

    /// Returns the packet's time, for a packet that is dropped after all.
    #[inline(always)]
    fn give_back(&self) {
        if let Some(link) = self.link {
            // SAFETY: as above.
            unsafe { edt::give_back(core::ptr::addr_of_mut!((*link).next_ns), self.cost) };
        }
    }
}

/// Where a packet's ECN field is, for CE marking.
#[derive(Clone, Copy)]
struct IpEcn {
    /// 4 or 6; 0 when the packet is not IP (never marked).
    family: u8,
    /// Offset of the IP header.
    l3: u32,
    /// The ECN field: 0 not ECN-capable, 1 or 2 ECT, 3 CE.
    ecn: u8,
}

const ECN_CE: u8 = 3;

/// Sets CE on an ECN-capable packet. Returns false if the packet cannot be marked (not
/// ECN-capable, or the rewrite failed), in which case it must be dropped instead.
#[inline(always)]
fn mark_ce(ctx: &TcContext, ip: IpEcn) -> bool {
    if ip.ecn == 0 {
        return false;
    }
    if ip.ecn == ECN_CE {
        return true;
    }
    let off = ip.l3 as usize;
    match ip.family {
        4 => {
            // The TOS byte is the second byte of the header; the checksum covers it as part of
            // the first 16-bit word (RFC 1624 incremental update via bpf_l3_csum_replace).
            let Ok(word) = ctx.load::<[u8; 2]>(off) else { return false };
            let new = [word[0], word[1] | ECN_CE];
            let from = u64::from(u16::from_ne_bytes(word));
            let to = u64::from(u16::from_ne_bytes(new));
            ctx.l3_csum_replace(off + 10, from, to, 2).is_ok() && ctx.store(off + 1, &new[1], 0).is_ok()
        }
        6 => {
            // The ECN bits are bits 4-5 of the second byte (low bits of the traffic class).
            let Ok(b1) = ctx.load::<u8>(off + 1) else { return false };
            ctx.store(off + 1, &(b1 | (ECN_CE << 4)), 0).is_ok()
        }
        _ => false,
    }
}

/// Bytes this skb puts on the line: each GSO segment is a frame of its own, with its own copy
/// of the headers (as qdiscs count it, `qdisc_pkt_len_init`), its overhead, mpu and cells
/// (as CAKE counts it, `cake_overhead`). See [`shaper_common::wire_len`].
#[inline(always)]
fn wire_len(skb: *const aya_ebpf::bindings::__sk_buff, hdr_len: u32, iface: &IfaceConfig) -> u64 {
    // SAFETY: the context pointer is valid for the whole program run. `gso_size` is readable
    // from tc programs since Linux 5.7 ("bpf: Add gso_size to __sk_buff").
    let (len, gso_segs, gso_size) = unsafe { ((*skb).len, (*skb).gso_segs, (*skb).gso_size) };
    shaper_common::wire_len(len, gso_segs, gso_size, hdr_len, iface)
}

/// `v`, as a value the verifier knows nothing of. The verifier walks `shape` once for each
/// distinct state that reaches a point, and a value it knows exactly (a wire length the
/// parser's path fixed, a `bool` a callee returned as a constant) tells states apart that
/// differ in nothing else: each such value doubled the walk of what follows. Its two 32-bit
/// halves go through stack words that are not at the start of an 8-byte slot, which the
/// verifier does not track (it tracks a spilled register only at a slot's start; a non-zero
/// value written elsewhere reads back unknown), and the paths that differ only by the value
/// are walked once. The egress program's verified instructions (Linux 6.18, with the five
/// values `shape` passes through here): 356,854 before, 213,688 after; loading it took 1.0 s
/// and 0.5 s (6.1's verifier, about 11 s under the VM tests' emulated CPU, gained nothing).
///
/// Each half is read back as it was written, at the same address and size, so the CPU
/// forwards it from its store buffer. (Read back as one 64-bit word over two 32-bit stores,
/// as it was first, each value stalled the packet about 12 cycles: a load that spans two
/// stores cannot be forwarded. `perf` put 14 % of the program's samples on the five loads.)
#[inline(always)]
fn unknown_to_verifier(v: u64) -> u64 {
    let mut words = core::mem::MaybeUninit::<[u64; 2]>::uninit();
    // Through an address the compiler cannot see into, so that it keeps `words` whole (at an
    // 8-aligned place on the stack) rather than give each half a stack word of its own.
    let halves = core::hint::black_box(words.as_mut_ptr()).cast::<u32>();
    // SAFETY: the second half of each of two 8-aligned words of `words`, written, then read
    // back. Volatile, so that the compiler keeps the stores and loads it would otherwise fold.
    unsafe {
        let (lo, hi) = (halves.add(1), halves.add(3));
        core::ptr::write_volatile(lo, v as u32);
        core::ptr::write_volatile(hi, (v >> 32) as u32);
        u64::from(core::ptr::read_volatile(lo)) | u64::from(core::ptr::read_volatile(hi)) << 32
    }
}

/// Counts the packet in its class, and gives it its departure time (or drops it).
#[inline(always)]
fn shape(ctx: &TcContext, p: &Packet) -> i32 {
    let (class, ip) = (p.class, p.ip);
    let skb = ctx.skb.skb;
    let Some(stats) = CLASS_STATS.get_ptr_mut(class) else { return TC_ACT_OK };
    // SAFETY: per-CPU value: only this CPU writes it, and tc programs run with migration
    // disabled, so plain increments are not lost.
    let stats = unsafe { &mut *stats };
    // Bit 32: a zeroed `marked` is no generation.
    let generation = u64::from(p.active_gen) | (1 << 32);
    if stats.marked != generation {
        stats.marked = generation;
        mark_active(u64::from(class));
    }
    // SAFETY: the context pointer is valid for the whole program run.
    let gso_segs = unsafe { (*skb).gso_segs };
    let segs = u64::from(gso_segs.max(1));
    let bytes = unknown_to_verifier(wire_len(skb, p.hdr_len, p.iface));

    let config = match CLASS_CONFIG.get(class) {
        // A reference into the map value rather than a copy: the BPF stack is small. The
        // daemon may rewrite the value meanwhile; each field is read once.
        Some(c) if c.rate_bytes > 0 => c,
        _ => {
            stats.unpaced_packets += segs;
            stats.bytes += bytes;
            stats.packets += segs;
            stats.delay_hist[0] += segs;
            return TC_ACT_OK;
        }
    };
    let Some(state) = CLASS_STATE.get_ptr_mut(class) else { return TC_ACT_OK };

    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    // A departure time already in the skb is the sender's (TCP pacing, SO_TXTIME, another
    // EDT layer on this host) only if it is a CLOCK_MONOTONIC delivery time. A forwarded
    // packet may carry its receive timestamp, on CLOCK_REALTIME; the forwarding path clears it
    // (skb_clear_tstamp() in ip_forward_finish/ip6_forward_finish keeps only mono delivery
    // times), and tstamp_type tells the two apart (kernel 5.18+). The packet leaves at that
    // time if its class's schedule would send it earlier, but it takes its slot on the class
    // clock as if it left on schedule: the class's other packets never wait for one sender's
    // time. (TCP paced by its socket, e.g. SO_MAX_PACING_RATE, hands down packets a pacing
    // gap apart, up to a TSO burst's gap, hundreds of ms at low rates; as the class's clock
    // those times held the whole class each time.) The class keeps to its rate over any
    // window longer than its senders' delays, and may send at most what they delayed early
    // over a shorter one. The sender's time is not bounded by the class's horizon, which
    // bounds the class's own queue: fq drops what is beyond its own (10 s by default).
    // SAFETY: as above.
    let (tstamp, tstamp_type) = unsafe { ((*skb).tstamp, (*skb).tstamp_type) };
    let own = if tstamp_type == TSTAMP_MONO && tstamp > now { tstamp } else { 0 };

    // SAFETY: `state` is a valid map value pointer; no reference is created.
    let next = unsafe { core::ptr::addr_of_mut!((*state).next_ns) };
    let byte_ns = config.rate_byte_ns;
    let cost = pace_ns(bytes, byte_ns);

    if p.flow.missed(p.rule_class) {
        stats.flow_misses += segs;
    }
    let over = match if !isolated(config) {
        Share::Over
    } else {
        share(config, p.host, &ShareOf { class, flow_hash: p.flow.tag as u32, bytes, now }, stats)
    } {
        Share::Within => false,
        Share::Over => true,
        // Dropped only while the class has a queue: the share may lag behind a class that
        // just became free.
        // SAFETY: a valid map value pointer, read once.
        Share::Drop if unsafe { core::ptr::read_volatile(next) } > now + config.codel_target_ns => {
            stats.drop_share_packets += segs;
            stats.drop_share_bytes += bytes;
            return TC_ACT_SHOT;
        }
        Share::Drop => true,
    };
    // What follows is walked once for both (see `unknown_to_verifier`), as for `bytes`,
    // `committed`, `in_profile` and `start`.
    let over = unknown_to_verifier(over as u64) != 0;
    let sent = Sent { skb, flow: &p.flow, rule_class: p.rule_class, tstamp, own, now, bytes, segs };
    let horizon = config.horizon_ns;
    let link = LinkSlot::new(p.iface, bytes);
    let committed = unknown_to_verifier(link.take(now));
    // The class's profile meter at its guarantee, for the packets of a quiet class (which
    // within it do not wait behind the link) and for marking those beyond it. Metered once.
    let in_profile = if config.flags & CLASS_QUIET != 0 || config.dscp_flags & DSCP_OVER != 0 {
        in_profile(state, now, bytes, config.guarantee_bytes)
    } else {
        true
    };
    let in_profile = unknown_to_verifier(in_profile as u64) != 0;
    if segs == 1 && sparse(state, &p.flow, p.rule_class, now, cost, byte_ns, horizon) {
        // A sparse flow leaves ahead of its class's queue, as fq_codel serves new flows
        // first; its slot is still taken from the class clock, so the class keeps to its rate.
        // CoDel does not see it: its delay says nothing about the class's queue.
        // SAFETY: as for `edt::take_slot`.
        unsafe { edt::fetch_add(next, cost) };
        stats.sparse_packets += 1;
        remark(ctx, ip, config, in_profile);
        return sent.record(stats, now);
    }
    // A quiet class's packet leaves behind what the link has committed (see `CLASS_QUIET`),
    // unless its flow is sparse and the class's sparse budget has room; a borrower's behind
    // the quiet classes' packets held there (`CLASS_BORROWING`). Within its guarantee, a
    // quiet class's packet leaves on its own clock, as HTB serves a class within its rate
    // ahead of those that borrow, and the borrowers are held in its place: its interactive
    // traffic (pings, a few per second in a class of tens of kbit/s, beyond the sparse
    // budget) does not wait behind the link's queue.
    let start = if committed > now
        && config.flags & CLASS_QUIET != 0
        && !(segs == 1 && on_time(state, p.flow.last(p.rule_class), now, cost))
    {
        let held = link.hold_behind(committed, next, now);
        if in_profile {
            now
        } else {
            held
        }
    } else if config.flags & CLASS_BORROWING != 0 {
        link.after_hold(now)
    } else {
        now
    };
    let start = unknown_to_verifier(start);
    // SAFETY: `state` points into an array map value that lives as long as the map.
    let edt::Verdict::Send { depart, idle } = (unsafe { edt::take_slot(next, cost, start, now, config) }) else {
        link.give_back();
        refund_host(stats, bytes, config);
        return horizon_drop(stats, bytes, segs);
    };
    // Idle by its own clock: a quiet class held back by the link only waits for its turn (a
    // stream below its share stays quiet; a transfer that wakes shows by what it offers).
    if idle {
        stats.idle_packets += segs;
    }
    if config.codel_target_ns != 0 {
        // With isolation, only the hosts over their fair share are told to slow down.
        // SAFETY: as above.
        let signal = unsafe { aqm::codel(state, depart - now, now, config, over) };
        if let aqm::Signal::Congested = signal {
            if mark_ce(ctx, ip) {
                stats.ecn_marked_packets += segs;
            } else {
                // SAFETY: as above.
                unsafe { edt::give_back(next, cost) };
                link.give_back();
                stats.drop_aqm_packets += segs;
                stats.drop_aqm_bytes += bytes;
                return TC_ACT_SHOT;
            }
        }
    }
    remark(ctx, ip, config, in_profile);
    sent.record(stats, depart)
}

/// Sets class `class`'s bit in `ACTIVE` if it is clear: shaperd reads the class's counters
/// at its next tick. Once a generation per class and CPU (see `ClassStats::marked`), so that
/// a packet does not touch the line all CPUs share.
///
/// Not inlined, and the class a whole word: inlined, LLVM kept the class on the stack as 32
/// bits between its bound check and its use, and Linux 6.1's verifier loses the bound of a
/// value filled from a 32-bit spill (an "invalid access to map value").
#[inline(never)]
fn mark_active(class: u64) {
    let i = (class / 64) as usize;
    if i >= ACTIVE_WORDS {
        return;
    }
    let Some(active) = ACTIVE.get_ptr_mut(0) else { return };
    // SAFETY: a pointer into an array map value, which lives as long as the map; `i` is
    // within its words.
    let word = unsafe { core::ptr::addr_of_mut!((*active).words).cast::<u64>().add(i) };
    let bit = 1u64 << (class % 64);
    // SAFETY: as above; shaperd may clear the word meanwhile (the bit is then set again by
    // the class's first packet of the next generation).
    if unsafe { core::ptr::read_volatile(word) } & bit == 0 {
        // SAFETY: as above.
        unsafe { edt::or(word, bit) };
    }
}

/// Sets the DSCP of a packet that leaves, if its class marks (`ClassConfig::dscp_flags`):
/// `over_dscp` beyond the class's guaranteed rate (`DSCP_OVER`), else `set_dscp`
/// (`DSCP_SET`). A GSO packet is metered and marked as a whole.
#[inline(always)]
fn remark(ctx: &TcContext, ip: IpEcn, config: &ClassConfig, in_profile: bool) {
    let flags = config.dscp_flags;
    if flags == 0 || ip.family == 0 {
        return;
    }
    let dscp = if flags & DSCP_OVER != 0 && !in_profile {
        config.over_dscp
    } else if flags & DSCP_SET != 0 {
        config.set_dscp
    } else {
        return;
    };
    set_dscp(ctx, ip, dscp);
}

/// The class's profile meter (GCRA at its guaranteed `rate`, `PROFILE_BURST_FRAMES` of
/// tolerance): whether a packet of `bytes` sent now is within the profile; if it is, it
/// takes its time from the meter's clock. Plain reads and writes: two CPUs metering at once
/// may lose one packet's cost, which lets one more packet through in profile. Not inlined,
/// as `hold_behind`: only quiet classes and those that mark beyond their guarantee call it.
#[inline(never)]
fn in_profile(state: *mut ClassState, now: u64, bytes: u64, rate: u64) -> bool {
    // SAFETY: `state` points into an array map value (`CLASS_STATE`); no reference is created.
    let clock = unsafe { core::ptr::addr_of_mut!((*state).profile_next_ns) };
    // SAFETY: as above.
    let tat = unsafe { core::ptr::read_volatile(clock) };
    // No guarantee, no profile: nothing is within it.
    if rate == 0 || tat > now + frames_ns(PROFILE_BURST_FRAMES, rate) {
        return false;
    }
    let start = if tat > now { tat } else { now };
    // SAFETY: as above.
    unsafe { core::ptr::write_volatile(clock, start + (bytes * NS).checked_div(rate).unwrap_or(0)) };
    true
}

/// Rewrites the packet's DSCP, keeping its ECN bits; IPv4's header checksum is updated
/// (RFC 1624), IPv6 has none (and the transport checksums do not cover the traffic class).
#[inline(always)]
fn set_dscp(ctx: &TcContext, ip: IpEcn, dscp: u8) {
    let off = ip.l3 as usize;
    let Ok(word) = ctx.load::<[u8; 2]>(off) else { return };
    let new = match ip.family {
        4 => [word[0], (dscp << 2) | (word[1] & 0x03)],
        6 => [(word[0] & 0xF0) | (dscp >> 2), (word[1] & 0x3F) | ((dscp & 0x03) << 6)],
        _ => return,
    };
    if new == word {
        return;
    }
    if ip.family == 4 {
        let from = u64::from(u16::from_ne_bytes(word));
        let to = u64::from(u16::from_ne_bytes(new));
        if ctx.l3_csum_replace(off + 10, from, to, 2).is_ok() {
            let _ = ctx.store(off + 1, &new[1], 0);
        }
    } else {
        let _ = ctx.store(off, &new, 0);
    }
}

/// Nanoseconds per second: costs are `bytes * NS / bytes_per_second`.
const NS: u64 = 1_000_000_000;

#[inline(always)]
fn horizon_drop(stats: &mut ClassStats, bytes: u64, segs: u64) -> i32 {
    stats.drop_horizon_packets += segs;
    stats.drop_horizon_bytes += bytes;
    TC_ACT_SHOT
}

/// Where a packet's host stands against its fair share of the class.
enum Share {
    /// Within it: the packet carries no congestion signal.
    Within,
    /// Over it, or the class has no isolation: the packet may carry a congestion signal.
    Over,
    /// So far over it that the packet is dropped.
    Drop,
}

/// Whether the class's packets go through [`share`]: it isolates its hosts (or flows) and
/// shaperd has given it a share.
#[inline(always)]
fn isolated(config: &ClassConfig) -> bool {
    config.isolation != ISOLATE_NONE && config.share_bytes != 0
}

/// Takes the cost of a packet its class dropped at the horizon back off the clock of the
/// host [`share`] charged for it (`ClassStats::charged_host`): a host pays for what its class
/// had room for. Otherwise each such drop ran its clock ahead of its class's for good: a
/// class's only host, its GSO packets dropped at a 1.9 mbit/s class's horizon (270 ms each),
/// was soon dropped at the share horizon while its class's queue was well within it. A packet
/// CoDel drops stays charged, as a marked one does: a congestion signal its host was given,
/// and a host that ignores them (a flood) so stays ahead, and is dropped at the share horizon
/// (refunded too, a UDP flood got 5.23-5.25 mbit/s of a class against a TCP host's 4.75-4.78,
/// and 4.96-4.99 charged, in one VM boot). Another host may have taken the slot since: it
/// then gets a packet's time back, as a host whose two CPUs update its clock at once may
/// lose one.
#[inline(always)]
fn refund_host(stats: &ClassStats, bytes: u64, config: &ClassConfig) {
    let charged = stats.charged_host;
    if charged == 0 || !isolated(config) {
        return;
    }
    let Some(st) = HOSTS.get_ptr_mut((charged - 1) as u32) else { return };
    // SAFETY: a valid map value pointer (an array's, never freed); a plain read and write.
    unsafe {
        let cost = pace_ns(bytes, config.share_byte_ns);
        (*st).next_ns = (*st).next_ns.saturating_sub(cost);
    }
}

/// What [`share`] is told of a packet besides its host.
struct ShareOf {
    class: u32,
    flow_hash: u32,
    bytes: u64,
    now: u64,
}

/// The hash of a host of a class: `kind` the class and the kind of isolation, `a` and `b`
/// the host's address (or its flow's hash).
#[inline(always)]
fn host_hash(kind: u64, a: u64, b: u64) -> u64 {
    const K: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut h = (kind ^ K).wrapping_mul(K);
    h = (h ^ (h >> 29) ^ a).wrapping_mul(K);
    h = (h ^ (h >> 29) ^ b).wrapping_mul(K);
    h ^ (h >> 32)
}

/// Isolation inside a class: each host (or flow) has a clock at its fair share of the class's
/// rate (`share_bytes`, which the daemon re-estimates every tick as max-min fairness has it:
/// what the light hosts leave, divided among the hosts that contend for it, those over their
/// share and those near it). Packets still
/// leave in the order the class clock gives them; the host clock only decides who is told to
/// slow down: the AQM's congestion signals go to the packets of hosts whose clock runs ahead
/// of now (more than `share_slack_ns`), and a host whose clock runs more than
/// `share_horizon_ns` ahead (one that ignores the signals, a UDP flood) is dropped. A host
/// with eight TCP connections so gets the signals that a host with one does not, until both
/// send at their share.
///
/// Cost: one cache line of `HOSTS` (the set of four its hash picks), and a division. An LRU
/// hash map took 119 of the 443 ns a packet of the bench's many-flow mix cost with isolation
/// (hashing a 24-byte key, walking a bucket, and a locked insert for each new host). A set
/// holds four hosts: a fifth that comes takes the way of the one idle longest, whose clock
/// starts again from now when it comes back (as a host forgotten by the LRU did).
///
/// Not inlined: a function of its own has a stack frame of its own (the BPF stack is 512
/// bytes a frame), and takes its five arguments in registers.
#[inline(never)]
fn share(config: &ClassConfig, host: &[u64; 2], of: &ShareOf, stats: &mut ClassStats) -> Share {
    let (class, hash, bytes, now) = (of.class, of.flow_hash, of.bytes, of.now);
    let (a, b) = if config.isolation == ISOLATE_FLOW { (u64::from(hash), 0) } else { (host[0], host[1]) };
    let h = host_hash(u64::from(class) | (u64::from(config.isolation) << 32), a, b);
    let base = ((h as u32) & (HOST_SETS - 1)) * HOST_WAYS;
    let tag = ((h >> 32) as u32) | 1;
    let epoch32 = classify::rule_set().map_or(0, |set| set.epoch);
    let epoch = epoch32 as u16;
    let unit = shaper_common::epoch_unit(epoch32);
    // The way that holds the host, or the one idle longest. Found by index and looked up
    // again (an array lookup is a few instructions): a pointer to one of four ways makes the
    // verifier walk what follows four times.
    let mut found = u32::MAX;
    let (mut oldest, mut oldest_ns) = (base, u64::MAX);
    for i in 0..HOST_WAYS {
        let Some(w) = HOSTS.get_ptr_mut(base + i) else { return Share::Over };
        // SAFETY: a valid map value pointer (an array's, never freed); plain reads.
        let (t, next) = unsafe { ((*w).tag, (*w).next_ns) };
        if t == tag {
            found = base + i;
            break;
        }
        if next < oldest_ns {
            (oldest, oldest_ns) = (base + i, next);
        }
    }
    let slot = if found == u32::MAX { oldest } else { found };
    let Some(st) = HOSTS.get_ptr_mut(slot) else { return Share::Over };
    // SAFETY: as above; no reference is kept beyond this call.
    let st = unsafe { &mut *st };
    if found == u32::MAX {
        // A host not seen (or forgotten): last counted in the epoch before this one, so it is
        // counted now.
        let before = epoch.wrapping_sub(1);
        *st = HostState { tag, near_epoch: before, over_epoch: before, next_ns: 0 };
    }
    // Plain reads and writes: two CPUs sending for the same host at once may lose one
    // packet's cost on its clock, which only shifts it by a packet.
    // Near its share: its clock not further behind now than a couple of packets at the share.
    let near = st.next_ns + config.share_near_ns >= now;
    let start = if st.next_ns > now { st.next_ns } else { now };
    let ahead = start - now;
    if ahead > config.share_horizon_ns {
        return Share::Drop;
    }
    st.next_ns = start + pace_ns(bytes, config.share_byte_ns);
    stats.charged_host = u64::from(slot) + 1;
    // Each host counts once an epoch, over its share or near it, whichever it was first:
    // counted twice, a lone greedy host would halve its own share. Its bytes count as light
    // only while it was not counted (a contending host's bytes came off its own share). The
    // CPU whose compare-and-exchange sets the epoch counts it: a host's packets pass two CPUs
    // at once (a TCP sender's own and the one its ACKs arrive on), and with plain writes a
    // class's only host was still counted twice in 14 ticks of about 7,000 (a VM, the epochs'
    // counts already apart).
    let marks_at = (st as *mut HostState).cast::<u64>();
    // SAFETY: the value's first word (tag and epochs), 8-byte aligned in the array's value.
    let marks = unsafe { core::ptr::read_volatile(marks_at) };
    let counted = (marks >> NEAR_EPOCH_SHIFT) as u16 == epoch || (marks >> OVER_EPOCH_SHIFT) as u16 == epoch;
    let count_at = |shift: u32| {
        let set = (marks & !(0xffff << shift)) | (u64::from(epoch) << shift);
        // SAFETY: as above.
        unsafe { edt::cas(marks_at, marks, set) }
    };
    if ahead > config.share_slack_ns {
        if !counted && count_at(OVER_EPOCH_SHIFT) {
            stats.hosts_over += unit;
        }
        Share::Over
    } else {
        if !counted {
            if near {
                if count_at(NEAR_EPOCH_SHIFT) {
                    stats.hosts_near += unit;
                }
            } else {
                stats.share_under_bytes += bytes * unit;
            }
        }
        Share::Within
    }
}

/// A packet that leaves: what recording its departure needs.
struct Sent<'a> {
    skb: *mut aya_ebpf::bindings::__sk_buff,
    flow: &'a Flow,
    rule_class: u32,
    /// The skb's timestamp as it came.
    tstamp: u64,
    /// The sender's departure time, if it set one later than now; else 0.
    own: u64,
    now: u64,
    bytes: u64,
    segs: u64,
}

impl Sent<'_> {
    /// Counts the packet, remembers its flow's departure and sets its departure time: the
    /// class's `depart`, or the sender's own time if that is later.
    #[inline(always)]
    fn record(&self, stats: &mut ClassStats, depart: u64) -> i32 {
        let delay = depart - self.now;
        if delay > 0 {
            stats.delayed_packets += self.segs;
            stats.delay_ns_total += delay;
        }
        if let Some(b) = stats.delay_hist.get_mut(delay_bucket(delay)) {
            *b += self.segs;
        }
        stats.bytes += self.bytes;
        stats.packets += self.segs;
        let depart = if self.own > depart { self.own } else { depart };
        self.flow.record(self.rule_class, depart);
        if depart != self.tstamp {
            // SAFETY: writing tstamp is allowed at tc egress; a write there marks the skb's
            // timestamp as a mono delivery time (bpf_convert_tstamp_write()).
            unsafe { (*self.skb).tstamp = depart };
        }
        TC_ACT_OK
    }
}

/// The longest gap that makes a flow sparse: a flow that sends less than one packet per
/// 10 ms (a ping, DNS, a game's or a call's small packets) is sparse whatever the queue.
const SPARSE_GAP_NS: u64 = 10_000_000;

/// Whether a packet may leave ahead of its class's queue: its flow is sparse, the queue is
/// short, and the class's sparse budget has room.
///
/// - The flow is sparse when the class has a queue and the flow's previous packet (which left
///   at `last`, 0 for a new flow) left at least the queue's length ago, or [`SPARSE_GAP_NS`] if
///   the queue is longer: it has nothing waiting and sends less than one packet per queueing
///   delay. A bulk flow, whose packets wait in the queue, never qualifies; a new flow's first
///   packet does (fq_codel treats new flows so).
/// - The queue is at most [`SPARSE_MAX_QUEUE_FRAMES`] full frames long (and the packet fits
///   within the horizon).
/// - The budget: sparse packets may use `1 / SPARSE_SHARE` of the class's rate ahead of the
///   queue (a token bucket of one packet, kept as a clock). Beyond it they wait in the queue.
///
/// A packet that jumps the queue still takes its slot on the class clock, so over a long
/// window the class keeps to its rate; over a short one it sends early at most what its
/// sparse packets carried during the queue's length, which the two bounds above keep to half
/// a full frame (at most `queue * rate / SPARSE_SHARE` bytes).
#[inline(always)]
fn sparse(
    state: *mut ClassState,
    flow: &Flow,
    rule_class: u32,
    now: u64,
    cost: u64,
    byte_ns: u64,
    horizon: u64,
) -> bool {
    // SAFETY: `state` points into a map value (caller); no reference is created.
    let next = unsafe { core::ptr::addr_of_mut!((*state).next_ns) };
    // SAFETY: as above.
    let class_next = unsafe { core::ptr::read_volatile(next) };
    if class_next <= now {
        // No queue: the packet leaves at once anyway.
        return false;
    }
    let queue = class_next - now;
    // The flow's last departure is read only here, for a class with a queue.
    let last = flow.last(rule_class);
    if last.saturating_add(queue.min(SPARSE_GAP_NS)) > now {
        return false;
    }
    if queue > pace_ns(SPARSE_MAX_QUEUE_FRAMES * FULL_FRAME, byte_ns) || queue + cost > horizon {
        return false;
    }
    sparse_budget(state, now, cost)
}

/// Whether a quiet class's packet may leave at its own time rather than behind the link
/// clock: its flow sends less than one packet per [`SPARSE_GAP_NS`] (its previous packet
/// left at `last`), and the class's sparse budget has room. Not inlined, as `hold_behind`.
#[inline(never)]
fn on_time(state: *mut ClassState, last: u64, now: u64, cost: u64) -> bool {
    last.saturating_add(SPARSE_GAP_NS) <= now && sparse_budget(state, now, cost)
}

/// Takes a sparse packet's share of the class's sparse budget (`1 / SPARSE_SHARE` of its
/// rate), if the budget has room.
#[inline(always)]
fn sparse_budget(state: *mut ClassState, now: u64, cost: u64) -> bool {
    // SAFETY: `state` points into a map value (caller); no reference is created.
    let budget = unsafe { core::ptr::addr_of_mut!((*state).sparse_next_ns) };
    // SAFETY: as above.
    let budget_next = unsafe { core::ptr::read_volatile(budget) };
    // SAFETY: as above; a lost race only sends this packet through the queue.
    budget_next <= now && unsafe { edt::cas(budget, budget_next, now + cost * SPARSE_SHARE) }
}

/// Zeroes `value` in place, a word at a time, and returns it. `Default` and struct literals
/// zero what they leave out with a call of `memset`, which the BPF target implements as a
/// loop over bytes (bpf-linker has LLVM keep memory operations as calls, in order): zeroing
/// a key took 260 instructions. Volatile stores are not merged into such a call, and writing
/// them in place leaves no copy that LLVM could turn back into one. `T` is plain data of
/// whole, aligned words (checked at compile time).
#[inline(always)]
pub(crate) fn zero_in_place<T: Copy>(value: &mut core::mem::MaybeUninit<T>) -> &mut T {
    const { assert!(core::mem::size_of::<T>().is_multiple_of(8) && core::mem::align_of::<T>() >= 8) };
    let words = value.as_mut_ptr().cast::<u64>();
    for i in 0..core::mem::size_of::<T>() / 8 {
        // SAFETY: within the value, aligned (asserted above).
        unsafe { core::ptr::write_volatile(words.add(i), 0) };
    }
    // SAFETY: every byte written; `T` is plain data, for which all zeros is a value.
    unsafe { value.assume_init_mut() }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
