//! The flow cache: sets of four array slots (`FLOWS`, a set 64 bytes), the set picked
//! by the flow's hash and found without a hash-map lookup, each slot holding what each packet
//! of a flow needs: the rules' answer for it (so that a flow is classified by the rules once,
//! not on every packet) and its latest departure (sparse-flow priority). A flow that finds no
//! slot of its set its own takes over the one whose flow left longest ago.
//!
//! Sets rather than one slot a hash: on the bench's many-flow mix (`cargo xtask bench`,
//! 131,072 flows) the cache missed 19.6 % of the packets with one slot a hash (which also
//! left every other slot unused: the hash's lowest bit is always set), 7.3 % with two and
//! 4.4 % with four. A hit in any way leaves the same state behind (its word and time are read
//! from the map), and the way is found again when the entry is written, at the end of the
//! program, so the verifier walks what follows once.
//!
//! A slot takes 16 bytes: 1 MB in all. With 32-byte slots (2 MB) a packet of the mix cost
//! 380 ns, and 340 with half as many slots, which missed more flows; with 16-byte slots,
//! 339 ns at two ways and 318-327 at four (one run each, 10,000 host rules).

use aya_ebpf::{macros::map, maps::Array};
use shaper_common::{
    flow_hash, flow_tag, FlowEntry, Globals, RuleKey, FLOW_SETS, FLOW_SLOTS, FLOW_WAYS, RULES_PER_PACKET,
    RULE_KEY_WORDS,
};

#[map]
static FLOWS: Array<FlowEntry> = Array::with_max_entries(FLOW_SLOTS, 0);

/// [`Flow::class`]'s answer when the cache does not hold the flow's class (no class id or
/// `NO_RULE` is this value).
pub const NOT_HELD: u64 = u64::MAX;

/// A packet's flow, and what the cache held of it.
pub struct Flow {
    /// The first slot of the flow's set in `FLOWS` (`u32::MAX`: none). An index rather than
    /// a pointer, and the way found again when the entry is written: a pointer that may be
    /// null, or a way that may be either, makes the verifier walk what follows once for each.
    set: u32,
    /// The flow's hash.
    pub tag: u64,
    /// The entry's `word`, if the entry holds this flow; else 0. A plain value rather than
    /// an `Option`: the verifier walks what follows once for both (see `classify::flow_class`).
    cached: u64,
    last_ns: u64,
    /// The rules' generation of the packet's classification (`Globals::generation`).
    generation: u32,
}

impl Flow {
    /// The flow of the packet whose key the parser filled (no interval ids yet), with raw
    /// ports `sport` and `dport`.
    #[inline(always)]
    pub fn find(key: &RuleKey, sport: u16, dport: u16, set: Globals) -> Self {
        // SAFETY: RuleKey is repr(C, align(8)) and RULE_KEY_WORDS words long (asserted in
        // shaper-common): aligned word reads.
        let words = unsafe { &*core::ptr::from_ref(key).cast::<[u64; RULE_KEY_WORDS]>() };
        let tag = flow_hash(words, sport, dport);
        // The hash's lowest bit is always set (see flow_hash): the set from the bits above.
        let slot = ((tag >> 1) as u32 & (FLOW_SETS - 1)) * FLOW_WAYS;
        let (mut cached, mut last_ns) = (0, 0);
        for way in 0..FLOW_WAYS {
            let Some((word, last)) = read(slot + way) else { break };
            if FlowEntry::tag(word) == flow_tag(tag) {
                cached = word;
                last_ns = last;
                break;
            }
        }
        Self { set: slot, tag, cached, last_ns, generation: set.generation }
    }

    /// A packet that was not parsed: no flow.
    #[inline(always)]
    pub const fn none() -> Self {
        Self { set: u32::MAX, tag: 0, cached: 0, last_ns: 0, generation: 0 }
    }

    /// The class of the first rule that matches the flow (`NO_RULE`: none), as the cache
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

    /// When the flow's previous packet was to leave, 0 if unknown, as long as its packets
    /// go to class `rule_class` (the rules' answer for this packet).
    #[inline(always)]
    pub fn last(&self, rule_class: u32) -> u64 {
        if self.cached != 0 && FlowEntry::class(self.cached) == rule_class {
            self.last_ns
        } else {
            0
        }
    }

    /// Whether the packet's flow was not in the cache (with this answer of the active rules).
    #[inline(always)]
    pub fn missed(&self, rule_class: u32) -> bool {
        self.tag != 0 && !self.hit(rule_class)
    }

    /// Whether the cache held this flow with this answer of the active rules.
    #[inline(always)]
    pub fn hit(&self, rule_class: u32) -> bool {
        self.cached == FlowEntry::word(self.tag, self.generation, rule_class)
    }

    /// Records the departure of the flow's packet, whose class the rules gave as
    /// `rule_class`: the whole entry if the cache did not hold the flow so, else only the
    /// time. The slot is the set's that holds the flow, else the one whose flow left longest
    /// ago (an empty one's left at 0).
    #[inline(always)]
    pub fn record(&self, rule_class: u32, depart: u64) {
        if self.set >= FLOW_SLOTS {
            return;
        }
        let tag = flow_tag(self.tag);
        let (mut way, mut oldest) = (0, u64::MAX);
        for i in 0..FLOW_WAYS {
            let Some((word, last)) = read(self.set + i) else { return };
            if FlowEntry::tag(word) == tag {
                way = i;
                break;
            }
            if last < oldest {
                (way, oldest) = (i, last);
            }
        }
        let Some(e) = FLOWS.get_ptr_mut(self.set + way) else { return };
        // SAFETY: a pointer into an array map value, which lives as long as the map.
        unsafe {
            if !self.hit(rule_class) {
                let word = FlowEntry::word(self.tag, self.generation, rule_class);
                core::ptr::write_volatile(core::ptr::addr_of_mut!((*e).word), word);
            }
            core::ptr::write_volatile(core::ptr::addr_of_mut!((*e).last_ns), depart);
        }
    }
}

/// Slot `slot` of `FLOWS`: its word and last departure, each read once (other CPUs may write
/// it meanwhile).
#[inline(always)]
fn read(slot: u32) -> Option<(u64, u64)> {
    let e = FLOWS.get_ptr_mut(slot)?;
    // SAFETY: a pointer into an array map value, which lives as long as the map; volatile
    // reads.
    Some(unsafe {
        (
            core::ptr::read_volatile(core::ptr::addr_of!((*e).word)),
            core::ptr::read_volatile(core::ptr::addr_of!((*e).last_ns)),
        )
    })
}
