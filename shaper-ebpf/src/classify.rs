//! Classification: first matching rule in file order wins, at a cost that does not grow with
//! the number of rules.
//!
//! Userspace groups rules by their *tuple*: which fields they test and with which prefix
//! lengths (a tuple-space search). All rules of one tuple sit in one hash map under the
//! packet key masked by the tuple, so a tuple costs one lookup whatever its number of rules.
//! Tuples are sorted by the smallest rule index they hold, so once a match is found, every
//! tuple whose smallest index is larger can be skipped.
//!
//! Ranges (ports, the IP length) do not mask: the daemon cuts each field's values into the
//! elementary intervals its rules' ranges make, and the key holds the interval's id, looked
//! up in an array (`SPORT_IDS`, `DPORT_IDS`, `LEN_IDS`) before the tuples are searched.

use aya_ebpf::{cty::c_void, helpers::bpf_loop, macros::map, maps::PerCpuArray};
use shaper_common::{
    filter_step, Globals, RuleKey, RuleTarget, FILTER_SEED, FILTER_WORDS, MAX_TUPLES, NO_RULE, PORT_SLOTS,
};

use crate::{parse::Parsed, DPORT_IDS, GLOBALS, LEN_IDS, RULES, RULE_FILTER, SPORT_IDS, TUPLES};

/// The active rule bank and its tuple count. Read once per packet, so that a packet is
/// classified by one rule set even while the daemon switches banks.
///
/// `None` only if the lookup in the one-entry array fails, which it does not: the egress
/// program then passes the packet on, as for its interface's lookup. An all-zero `Globals`
/// in its place, as the program took before, was a second kind of state whose constants
/// the verifier walked the rest of the program for apart (Debian 6.1 entered the parser six
/// times rather than four, with the class cache).
#[inline(always)]
pub fn rule_set() -> Option<Globals> {
    GLOBALS.get(0).copied()
}

/// Sets the key's interval ids (the unit range rules are compiled in) from the packet's raw
/// ports and IP length: 0 for a packet without ports, or that is not IP.
#[inline(always)]
pub fn interval_ids(set: Globals, key: &mut RuleKey, p: &Parsed) {
    let base = (set.bank & 1) * PORT_SLOTS;
    if p.has_ports {
        key.sport = SPORT_IDS.get(base + u32::from(p.sport())).copied().unwrap_or(0);
        key.dport = DPORT_IDS.get(base + u32::from(p.dport())).copied().unwrap_or(0);
    }
    if p.ip_len != 0 {
        // At most 65535 (the parser's bound): within the bank's slots.
        key.len = LEN_IDS.get(base + (p.ip_len & 0xffff)).copied().unwrap_or(0);
    }
}

/// The class of the first rule that matches the packet (`NO_RULE`: none), for a packet whose
/// flow the class cache does not hold (`set`: the rule bank and tuple count, as
/// [`Globals::packed`] packs them).
///
/// Called for the flows the cache misses only, so its call costs a hit nothing; out of
/// line, the verifier walks what follows once, with one unknown class (when the cache's
/// answer went through it as well, inlining it had taken the walk from 146,034 instructions
/// to 541,875 on 6.18).
///
/// Returns the class as a whole word, its upper half zero: a `u32` return value leaves the
/// upper half of the register undefined, and LLVM handed back the rule index there, which
/// the caller's comparisons took for part of the class.
#[inline(never)]
pub fn flow_class(key: &mut RuleKey, p: &Parsed, set: u64) -> u64 {
    let set = Globals::unpacked(set);
    interval_ids(set, key, p);
    u64::from(classify(set, key).map_or(NO_RULE, |t| t.class))
}

/// Returns the target of the first rule (in file order) that matches `key`.
#[inline(always)]
pub fn classify(set: Globals, key: &RuleKey) -> Option<RuleTarget> {
    let found = first_match(u64::from(set.tuple_count), set.bank, key);
    // Truncations: the two halves of the packed target.
    (found != NO_MATCH).then_some(RuleTarget { rule: (found >> 32) as u32, class: found as u32 })
}

/// Where [`tuple_step`] builds the key it looks up (one per CPU).
#[map]
static MASKED_KEY: PerCpuArray<RuleKey> = PerCpuArray::with_max_entries(1, 0);

/// [`first_match`]'s answer when no rule matches.
const NO_MATCH: u64 = u64::MAX;

/// What [`first_match`] hands each step of its loop.
#[repr(C)]
struct Search {
    /// The packet's key (on the caller's stack).
    key: *const RuleKey,
    /// The first `TUPLES` index of the active bank.
    base: u32,
    /// The smallest rule index matched so far (`u32::MAX`: none).
    best_rule: u32,
    /// Its target, packed as `rule << 32 | class`, or [`NO_MATCH`].
    best: u64,
}

/// The first matching rule's target, packed as `rule << 32 | class`, or [`NO_MATCH`].
///
/// The tuples are walked by the `bpf_loop` helper (kernel 5.17+): the verifier checks one
/// step ([`tuple_step`]) once, rather than each of up to `MAX_TUPLES` unrolled steps for
/// every path the parser leaves, which took Debian 6.1's verifier within 2 % of its
/// million-instruction limit. Not inlined, and small: the verifier adds up the stack frames
/// of a call chain (each rounded up to 32 bytes), the callback's included, within 512. The
/// chain from `shaper_egress` to [`tuple_step`] came to 512 exactly (352 + 32 + 32 + 96)
/// until the step read the key as aligned words (its frame 80 bytes to 56): 480 now, and a
/// frame 8 bytes larger anywhere on it had Debian's 6.1 refuse the program.
///
/// `count` is a whole word: a `u32` argument may come with its register's upper half left
/// as it was (LLVM passed on the rule bank packed there), and the kernel's inlined
/// `bpf_loop` compares the whole register against its limit: it ran no step at all.
#[inline(never)]
fn first_match(count: u64, bank: u32, key: &RuleKey) -> u64 {
    let mut search = Search { key, base: (bank & 1) * MAX_TUPLES, best_rule: u32::MAX, best: NO_MATCH };
    let steps = if count < u64::from(MAX_TUPLES) { count as u32 } else { MAX_TUPLES };
    // SAFETY: `tuple_step` has the callback signature `bpf_loop` expects; `search` and the
    // key it points to outlive the call.
    unsafe {
        bpf_loop(steps, tuple_step as *mut c_void, core::ptr::addr_of_mut!(search).cast(), 0);
    }
    search.best
}

/// One step of [`first_match`]: looks the key up in tuple `index`; returns 1 to stop (no
/// tuple left that could hold an earlier rule), 0 to go on.
extern "C" fn tuple_step(index: u64, ctx: *mut c_void) -> i64 {
    let search = ctx.cast::<Search>();
    // SAFETY: `ctx` is first_match's `Search` (see there); no reference is kept.
    let (base, best_rule) = unsafe { ((*search).base, (*search).best_rule) };
    let slot = base + index as u32;
    let Some(tuple) = TUPLES.get(slot) else { return 1 };
    if tuple.min_rule >= best_rule {
        return 1;
    }
    // SAFETY: as above; the key is first_match's caller's, alive for the whole loop.
    let words = unsafe { (*search).key }.cast::<u64>();
    // The masked key is written to a per-CPU scratch slot rather than the stack: the call
    // chain's frames (each rounded up to 32 bytes) must fit the verifier's 512 bytes.
    let Some(masked) = MASKED_KEY.get_ptr_mut(0) else { return 1 };
    let masked = masked.cast::<u64>();
    // The key's `filter_hash`, as it is masked.
    let mut hash = FILTER_SEED;
    for (w, mask) in tuple.mask.iter().enumerate() {
        // SAFETY: RuleKey is repr(C, align(8)) and RULE_KEY_WORDS * 8 bytes long (asserted
        // in shaper-common): aligned words. (`read_unaligned` read each in eight one-byte
        // loads.)
        let mut word = unsafe { words.add(w).read() } & mask;
        // The tuple id (its `TUPLES` index) is the key's first field (bits 0..16 of word 0
        // on little endian); masks never keep those bits.
        if w == 0 {
            word |= u64::from(slot as u16);
        }
        // SAFETY: a map value of RULE_KEY_WORDS words, aligned to 8; this CPU's alone.
        unsafe { masked.add(w).write(word) };
        hash = filter_step(hash, word);
    }
    // The bank's filter first: a key whose bit is clear is in no rule of the bank.
    if tuple.filter_mask != 0 {
        let bit = hash & u64::from(tuple.filter_mask);
        let bank_words = if base == 0 { 0 } else { FILTER_WORDS };
        // Truncation: bit >> 6 < FILTER_WORDS (the mask's bound).
        if let Some(&bits) = RULE_FILTER.get(bank_words + (bit >> 6) as u32) {
            if (bits >> (bit & 63)) & 1 == 0 {
                return 0;
            }
        }
    }
    // SAFETY: written whole above.
    let lookup = unsafe { &*masked.cast::<RuleKey>() };
    // SAFETY: the value is copied out at once; entries are replaced whole by userspace.
    if let Some(target) = unsafe { RULES.get(lookup) } {
        if target.rule < best_rule {
            // SAFETY: as above.
            unsafe {
                (*search).best_rule = target.rule;
                (*search).best = (u64::from(target.rule) << 32) | u64::from(target.class);
            }
        }
    }
    0
}
