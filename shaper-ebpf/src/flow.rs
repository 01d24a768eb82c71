//! What the datapath remembers between a flow's packets, in two tables of array slots found
//! without a hash-map lookup:
//!
//! - The class cache (`CLASS_CACHE`, sets of eight 8-byte slots, a set 64 bytes): the rules'
//!   answer, so that the rules are searched for the first packet, not for each. Its key is the
//!   packet's key under the active rule bank's mask (`CACHE_MASKS`, see
//!   `shaper_common::cache_hash`): the packets that agree on every field the rules test share
//!   an entry, as all of a host's flows do when the rules name hosts. A packet that finds no
//!   entry takes over an empty slot of its set, or one its hash picks.
//! - The flows' table (`FLOWS`, one 16-byte slot a flow hash): the flow's latest departure,
//!   which only matters while its class has a queue (sparse-flow priority). Each packet writes
//!   its flow's slot without reading it first (a store that misses the CPU's caches does not
//!   hold the program up), and only a packet whose class has a queue reads it.
//!
//! Before the two were split, one slot a flow held both (sets of four 16-byte slots): each
//! packet of a flow the CPU's caches had lost waited for its slot's line. On the bench's
//! many-flow mix (`cargo xtask bench`, 131,072 flows) that was about a third of a packet's
//! time with 10,000 host rules. Split, a packet of that mix cost 273-279 ns rather than
//! 282-290 (10,000 host rules), 314-319 rather than 323-333 (mixed rules with isolation),
//! 345-363 rather than 453-468 (flows drawn uniformly), in three runs of `shaper-bench
//! --short` each, alternated; a packet repeated, whose lines stay warm, 132 ns rather than
//! 117 (the two calls below that a hit makes).
//!
//! The lookup, the hash a miss is remembered under, the write of a miss and the departure's
//! read are BPF global functions: the verifier checks each once, on its own, and goes on
//! after its return from one state whatever it found. They take and return scalars and only
//! read the caller's memory, because Debian 6.1's verifier does not see what a global
//! function writes through a pointer: with the lookup's answer written into the caller's
//! `Flow` it walked the program 348,982 instructions (what followed the parser once for
//! each of its ways out), and 177,719 as they are. Inlined, the split made 6.1 walk 377,000
//! to 1,000,000 instructions, or the classifier's call chain overran its 512 bytes of stack.

use aya_ebpf::{macros::map, maps::Array};
use shaper_common::{
    cache_hash, flow_hash, flow_tag, CacheMasks, FlowEntry, Globals, RuleKey, CACHE_SETS, CACHE_WAYS, FLOW_SLOTS,
    RULES_PER_PACKET,
};

#[map]
static FLOWS: Array<FlowEntry> = Array::with_max_entries(FLOW_SLOTS, 0);
#[map]
static CLASS_CACHE: Array<[u64; CACHE_WAYS as usize]> = Array::with_max_entries(CACHE_SETS, 0);
#[map]
static CACHE_MASKS: Array<CacheMasks> = Array::with_max_entries(1, 0);

/// [`Flow::class`]'s answer when the cache does not hold the packet's class (no class id or
/// `NO_RULE` is this value).
pub const NOT_HELD: u64 = u64::MAX;

/// A packet's flow, and what the class cache held for it.
pub struct Flow {
    /// The flow's hash (`FLOWS`' slot, and isolation by flow); 0 for a packet not parsed.
    pub tag: u64,
    /// What the class cache held for the packet: [`FlowEntry::word`] of hash 0 (its tag bits
    /// mean "held"), the generation and class of the entry whose tag is the packet's; else 0.
    /// A plain value rather than an `Option`: the verifier walks what follows once for both.
    cached: u64,
    /// The rules' generation of the packet's classification (`Globals::generation`).
    generation: u32,
}

impl Flow {
    /// The flow of the packet whose key the parser filled (no interval ids yet), with raw
    /// ports `ports` (`parse::Parsed::ports`), and the class cache's entry for it.
    #[inline(always)]
    pub fn find(key: &RuleKey, ports: u32, set: Globals) -> Self {
        let tag = flow_hash(key.words(), ports as u16, (ports >> 16) as u16);
        let cached = cache_find(core::ptr::from_ref(key), u64::from(ports), u64::from(set.bank));
        Self { tag, cached, generation: set.generation }
    }

    /// A packet that was not parsed: no flow.
    #[inline(always)]
    pub const fn none() -> Self {
        Self { tag: 0, cached: 0, generation: 0 }
    }

    /// The class of the first rule that matches the packet (`NO_RULE`: none), as the cache
    /// holds it for the active rules; [`NOT_HELD`] if it does not, or if the rules test
    /// fields that differ between packets.
    #[inline(always)]
    pub fn class(&self, set: Globals) -> u64 {
        let word = self.cached;
        if word != 0 && set.flags & RULES_PER_PACKET == 0 && FlowEntry::of_generation(word, set.generation) {
            u64::from(FlowEntry::class(word))
        } else {
            NOT_HELD
        }
    }

    /// The class cache's hash of the packet of key `key` (as the parser left it: no interval
    /// ids) and raw ports `ports`, for [`Self::remember`]; 0 if it has none.
    #[inline(always)]
    pub fn key_tag(key: &RuleKey, ports: u32, set: Globals) -> u64 {
        cache_key(core::ptr::from_ref(key), u64::from(ports), u64::from(set.bank))
    }

    /// Keeps `rule_class`, the rules' answer for the packet whose class cache hash is
    /// `key_tag` ([`Self::key_tag`]) and that the cache did not hold, in the cache (see
    /// [`remember`]).
    #[inline(always)]
    pub fn remember(&self, key_tag: u64, rule_class: u32) {
        remember(key_tag, FlowEntry::word(key_tag, self.generation, rule_class));
    }

    /// When the flow's previous packet was to leave, 0 if unknown, as long as its packets
    /// go to class `rule_class` (the rules' answer for this packet).
    #[inline(always)]
    pub fn last(&self, rule_class: u32) -> u64 {
        flow_last(self.tag, u64::from(rule_class))
    }

    /// Whether the packet's class was not in the cache (with this answer of the active rules).
    #[inline(always)]
    pub fn missed(&self, rule_class: u32) -> bool {
        self.tag != 0 && self.cached != FlowEntry::word(0, self.generation, rule_class)
    }

    /// Records the departure of the flow's packet, whose class the rules gave as
    /// `rule_class`, in the flow's slot of `FLOWS`, without reading it.
    #[inline(always)]
    pub fn record(&self, rule_class: u32, depart: u64) {
        if self.tag == 0 {
            return;
        }
        let Some(e) = FLOWS.get_ptr_mut(flow_slot(self.tag)) else { return };
        // SAFETY: a pointer into an array map value, which lives as long as the map.
        unsafe {
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*e).word), FlowEntry::word(self.tag, 0, rule_class));
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*e).last_ns), depart);
        }
    }
}

/// The class cache's hash of the packet of key `key` (no interval ids) and raw ports `ports`
/// under rule bank `bank`'s mask, and its set; `None` if the mask's lookup fails.
#[inline(always)]
fn cache_slot(key: &RuleKey, ports: u64, bank: u64) -> Option<(u64, u32)> {
    let masks = CACHE_MASKS.get(0)?;
    let key_tag = cache_hash(key.words(), masks, bank as u32, ports as u32);
    Some((key_tag, cache_set(key_tag)))
}

/// The set of `CLASS_CACHE` of the packets whose class cache hash is `key_tag` (its lowest
/// bit is always set: the bits above).
#[inline(always)]
fn cache_set(key_tag: u64) -> u32 {
    (key_tag >> 1) as u32 & (CACHE_SETS - 1)
}

/// [`Flow::key_tag`]'s work, a BPF global function (see the module's doc).
#[no_mangle]
#[inline(never)]
pub extern "C" fn cache_key(key: *const RuleKey, ports: u64, bank: u64) -> u64 {
    // SAFETY: the caller's own key, or null.
    let Some(key) = (unsafe { key.as_ref() }) else { return 0 };
    cache_slot(key, ports, bank).map_or(0, |(key_tag, _)| key_tag)
}

/// Writes `word`, the class cache's entry for the packets whose hash is `key_tag`, into their
/// set: into the way that holds their tag if one does, else into an empty one, else into the
/// one the hash picks. Called for a packet the cache missed only; a BPF global function
/// (see the module's doc).
#[no_mangle]
#[inline(never)]
pub extern "C" fn remember(key_tag: u64, word: u64) -> u64 {
    if key_tag == 0 {
        return 0;
    }
    let Some(ways) = CLASS_CACHE.get_ptr_mut(cache_set(key_tag)) else { return 0 };
    let ways = ways.cast::<u64>();
    let tag = flow_tag(key_tag);
    let (mut way, mut found) = ((key_tag >> 40) as usize & (CACHE_WAYS as usize - 1), false);
    for i in 0..CACHE_WAYS as usize {
        // SAFETY: a pointer into an array map value of CACHE_WAYS words, which lives as long
        // as the map; volatile reads (other CPUs may write it meanwhile).
        let held = unsafe { core::ptr::read_volatile(ways.add(i)) };
        if FlowEntry::tag(held) == tag {
            way = i;
            break;
        }
        if held == 0 && !found {
            way = i;
            found = true;
        }
    }
    // SAFETY: as above; `way` is below CACHE_WAYS.
    unsafe { core::ptr::write_volatile(ways.add(way & (CACHE_WAYS as usize - 1)), word) };
    1
}

/// [`Flow::find`]'s lookup, a BPF global function (see the module's doc): the class cache's
/// entry for the packet of key `key` and raw ports `ports` under rule bank
/// `bank`, as [`Flow::cached`] holds it; 0 if none.
#[no_mangle]
#[inline(never)]
pub extern "C" fn cache_find(key: *const RuleKey, ports: u64, bank: u64) -> u64 {
    // SAFETY: the caller's own key, or null.
    let Some(key) = (unsafe { key.as_ref() }) else { return 0 };
    let Some((key_tag, set)) = cache_slot(key, ports, bank) else { return 0 };
    let Some(ways) = CLASS_CACHE.get_ptr(set) else { return 0 };
    let ways = ways.cast::<u64>();
    let want = u64::from(flow_tag(key_tag));
    let (mut cached, mut found) = (0u64, 0u64);
    for way in 0..CACHE_WAYS as usize {
        // SAFETY: a pointer into an array map value of CACHE_WAYS words.
        let word = unsafe { core::ptr::read_volatile(ways.add(way)) };
        let equal = all_ones_if_zero((word >> 32) ^ want);
        cached |= word & equal & !found;
        found |= equal;
    }
    // The tag's bits say "held" (FlowEntry::word of hash 0), so that Flow::missed compares
    // one word without the packet's hash.
    (cached & 0xffff_ffff | 1 << 32) & found
}

/// [`Flow::last`]'s work, a BPF global function (see the module's doc); called only where a
/// queue (its class's, or the link's for a quiet class) makes the departure matter.
#[no_mangle]
#[inline(never)]
pub extern "C" fn flow_last(tag: u64, rule_class: u64) -> u64 {
    let Some(e) = FLOWS.get_ptr(flow_slot(tag)) else { return 0 };
    // SAFETY: a pointer into an array map value, which lives as long as the map; volatile
    // reads (other CPUs may write it meanwhile).
    let (word, last) = unsafe {
        (
            core::ptr::read_volatile(core::ptr::addr_of!((*e).word)),
            core::ptr::read_volatile(core::ptr::addr_of!((*e).last_ns)),
        )
    };
    last & all_ones_if_zero(word ^ FlowEntry::word(tag, 0, rule_class as u32))
}

/// All ones if `x` is 0, else 0, without a branch.
#[inline(always)]
fn all_ones_if_zero(x: u64) -> u64 {
    (((x | x.wrapping_neg()) >> 63) ^ 1).wrapping_neg()
}

/// The slot of `FLOWS` of the flow whose hash is `tag` (its lowest bit is always set: the
/// bits above).
#[inline(always)]
fn flow_slot(tag: u64) -> u32 {
    (tag >> 1) as u32 & (FLOW_SLOTS - 1)
}
