//! Classification: first matching rule in file order wins, at a cost that does not grow with
//! the number of rules.
//!
//! Userspace groups rules by their *tuple*: which fields they test and with which prefix
//! lengths (a tuple-space search). All rules of one tuple sit in one hash map under the
//! packet key masked by the tuple, so a tuple costs one lookup whatever its number of rules.
//! Tuples are sorted by the smallest rule index they hold, so once a match is found, every
//! tuple whose smallest index is larger can be skipped.

use shaper_common::{Globals, RuleKey, RuleTarget, MAX_TUPLES, PORT_SLOTS, RULE_KEY_WORDS};

use crate::{DPORT_IDS, GLOBALS, RULES, SPORT_IDS, TUPLES};

/// The active rule bank and its tuple count. Read once per packet, so that a packet is
/// classified by one rule set even while the daemon switches banks.
#[inline(always)]
pub fn rule_set() -> Globals {
    GLOBALS.get(0).copied().unwrap_or_default()
}

/// Replaces raw ports in the key by their interval ids (the unit rules are compiled in).
#[inline(always)]
pub fn port_ids(set: Globals, key: &mut RuleKey, sport: u16, dport: u16) {
    let base = (set.bank & 1) * PORT_SLOTS;
    key.sport = SPORT_IDS.get(base + u32::from(sport)).copied().unwrap_or(0);
    key.dport = DPORT_IDS.get(base + u32::from(dport)).copied().unwrap_or(0);
}

/// Returns the target of the first rule (in file order) that matches `key`.
#[inline(always)]
pub fn classify(set: Globals, key: &RuleKey) -> Option<RuleTarget> {
    let found = first_match(set.tuple_count, set.bank, key);
    // Truncations: the two halves of the packed target.
    (found != NO_MATCH).then_some(RuleTarget { rule: (found >> 32) as u32, class: found as u32 })
}

/// [`first_match`]'s answer when no rule matches.
const NO_MATCH: u64 = u64::MAX;

/// The first matching rule's target, packed as `rule << 32 | class`, or [`NO_MATCH`].
///
/// Not inlined: its three masked copies of the key live in a stack frame of their own (the
/// BPF stack is 512 bytes a frame, and the verifier adds up the frames of a call chain).
#[inline(never)]
fn first_match(count: u32, bank: u32, key: &RuleKey) -> u64 {
    let base = (bank & 1) * MAX_TUPLES;
    // SAFETY: RuleKey is repr(C), RULE_KEY_WORDS * 8 bytes long (asserted in shaper-common),
    // and read_unaligned copes with its 4-byte alignment.
    let words: [u64; RULE_KEY_WORDS] = unsafe { core::ptr::read_unaligned(core::ptr::from_ref(key).cast()) };
    let mut best = NO_MATCH;
    let mut best_rule = u32::MAX;
    for i in 0..MAX_TUPLES {
        if i >= count {
            break;
        }
        let Some(tuple) = TUPLES.get(base + i) else { break };
        if tuple.min_rule >= best_rule {
            break;
        }
        let mut masked = [0u64; RULE_KEY_WORDS];
        for w in 0..RULE_KEY_WORDS {
            masked[w] = words[w] & tuple.mask[w];
        }
        // The tuple id (its `TUPLES` index) is the key's first field (bits 0..16 of word 0
        // on little endian); masks never keep those bits.
        masked[0] |= u64::from((base + i) as u16);
        // SAFETY: same layout argument as above, in the other direction.
        let lookup: RuleKey = unsafe { core::ptr::read_unaligned(masked.as_ptr().cast()) };
        // SAFETY: the value is copied out at once; entries are replaced whole by userspace.
        if let Some(target) = unsafe { RULES.get(&lookup) } {
            if target.rule < best_rule {
                best_rule = target.rule;
                best = (u64::from(target.rule) << 32) | u64::from(target.class);
            }
        }
    }
    best
}
