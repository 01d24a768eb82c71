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

use aya_ebpf::{cty::c_void, helpers::bpf_loop};
use shaper_common::{Globals, RuleKey, RuleTarget, MAX_TUPLES, NO_RULE, PORT_SLOTS, RULE_KEY_WORDS};

use crate::{parse::Parsed, DPORT_IDS, GLOBALS, LEN_IDS, RULES, SPORT_IDS, TUPLES};

/// The active rule bank and its tuple count. Read once per packet, so that a packet is
/// classified by one rule set even while the daemon switches banks.
#[inline(always)]
pub fn rule_set() -> Globals {
    GLOBALS.get(0).copied().unwrap_or_default()
}

/// Sets the key's interval ids (the unit range rules are compiled in) from the packet's raw
/// ports and IP length: 0 for a packet without ports, or that is not IP.
#[inline(always)]
pub fn interval_ids(set: Globals, key: &mut RuleKey, p: &Parsed) {
    let base = (set.bank & 1) * PORT_SLOTS;
    if p.has_ports {
        key.sport = SPORT_IDS.get(base + u32::from(p.sport)).copied().unwrap_or(0);
        key.dport = DPORT_IDS.get(base + u32::from(p.dport)).copied().unwrap_or(0);
    }
    if p.ip_len != 0 {
        // At most 65535 (the parser's bound): within the bank's slots.
        key.len = LEN_IDS.get(base + (p.ip_len & 0xffff)).copied().unwrap_or(0);
    }
}

/// The class of the first rule that matches the packet (`NO_RULE`: none): `cached`, the
/// flow cache's answer, unless it is `flow::NOT_HELD`, else by the rules (`set`: the rule
/// bank and tuple count, as [`Globals::packed`] packs them).
///
/// Not inlined: the verifier walks what follows once, with one unknown class, rather than
/// once for a packet the cache answered and once for one the rules did (which took its walk
/// from 146,034 instructions to 541,875 on 6.18).
///
/// Returns the class as a whole word, its upper half zero: a `u32` return value leaves the
/// upper half of the register undefined, and LLVM handed back the rule index there, which
/// the caller's comparisons took for part of the class.
#[inline(never)]
pub fn flow_class(key: &mut RuleKey, p: &Parsed, set: u64, cached: u64) -> u64 {
    if cached != crate::flow::NOT_HELD {
        return cached & 0xffff_ffff;
    }
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
/// of a call chain (each rounded up to 32 bytes), the callback's included, within 512.
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
    let mut masked = [0u64; RULE_KEY_WORDS];
    for (w, (word, mask)) in masked.iter_mut().zip(&tuple.mask).enumerate() {
        // SAFETY: RuleKey is repr(C) and RULE_KEY_WORDS * 8 bytes long (asserted in
        // shaper-common); read_unaligned copes with its 4-byte alignment.
        *word = unsafe { core::ptr::read_unaligned(words.add(w)) } & mask;
    }
    // The tuple id (its `TUPLES` index) is the key's first field (bits 0..16 of word 0 on
    // little endian); masks never keep those bits.
    masked[0] |= u64::from(slot as u16);
    // SAFETY: same layout argument as above; `masked` is 8-byte aligned, more than RuleKey
    // needs, and is read in place.
    let lookup = unsafe { &*masked.as_ptr().cast::<RuleKey>() };
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
