//! Rules compiled into the datapath's lookup tables.
//!
//! The datapath must find the first matching rule (in file order) at a cost that does not
//! grow with the number of rules. Rules are grouped by *tuple*, the set of fields they test
//! and their prefix lengths; one tuple is one hash lookup of the packet key masked by the
//! tuple's mask (tuple space search). Port and length ranges do not mask, so ports and the
//! IP length are first mapped to ids of elementary intervals (the ranges' boundaries split
//! 0..=65535 into intervals, one array lookup per field), and a rule with a range is stored
//! once per interval it covers. TCP flags are a bit mask per rule (rules with different masks
//! are different tuples); the source MAC and the ICMP type are exact.
//!
//! [`Compiled::lookup`] runs the same algorithm as the datapath, so unit tests can check it
//! against a plain linear scan ([`first_match`]).

use std::{
    collections::{BTreeMap, HashMap},
    mem::offset_of,
    net::IpAddr,
};

use ipnet::IpNet;
use shaper_common::{
    filter_hash, RuleKey, RuleTarget, Tuple, FILTER_WORDS, L4_ICMP, L4_TCP, L4_TCP_NO_PAYLOAD, MAX_RULE_ENTRIES,
    MAX_TUPLES, RULE_KEY_WORDS,
};

/// One rule, with names already resolved to ids.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RuleSpec {
    /// Position in the configuration (first rule = 0); the lowest matching one wins.
    pub index: u32,
    /// Line in the configuration file, for error messages.
    pub line: usize,
    pub class: u32,
    pub iface_slot: u16,
    pub src: Option<IpNet>,
    pub dst: Option<IpNet>,
    pub proto: Option<u8>,
    /// Inclusive port ranges.
    pub sport: Option<(u16, u16)>,
    pub dport: Option<(u16, u16)>,
    pub mark: Option<u32>,
    pub dscp: Option<u8>,
    /// Inclusive range of the packet's IP length (see [`PacketFields::len`]).
    pub len: Option<(u16, u16)>,
    /// TCP flags (the rule matches TCP packets only).
    pub tcp_flags: Option<TcpFlags>,
    /// ICMP or `ICMPv6` type (the rule matches ICMP and `ICMPv6` packets only; `proto` or the
    /// networks' family says which).
    pub icmp_type: Option<u8>,
    /// Ethernet source address; never all zero (what packets without a link layer have).
    pub src_mac: Option<[u8; 6]>,
}

/// A test of a TCP header's flags: `flags & mask == value`, and, with `no_payload`, the
/// segment carries no payload.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TcpFlags {
    pub value: u8,
    pub mask: u8,
    pub no_payload: bool,
}

impl TcpFlags {
    /// Whether a TCP header with `flags`, of a segment with no payload or not, passes.
    #[must_use]
    pub fn matches(self, flags: u8, no_payload: bool) -> bool {
        flags & self.mask == self.value && (no_payload || !self.no_payload)
    }
}

impl RuleSpec {
    /// A rule on interface slot 0 that matches every packet (each field `None`), at position
    /// `index`; set fields with struct update syntax.
    #[must_use]
    pub fn new(index: u32, class: u32) -> Self {
        Self {
            index,
            line: index as usize + 1,
            class,
            iface_slot: 0,
            src: None,
            dst: None,
            proto: None,
            sport: None,
            dport: None,
            mark: None,
            dscp: None,
            len: None,
            tcp_flags: None,
            icmp_type: None,
            src_mac: None,
        }
    }
}

/// Why a rule set cannot be compiled.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CompileError {
    #[error(
        "the rules use {count} distinct shapes (combinations of tested fields and prefix lengths); \
         the datapath supports {max}: use fewer distinct prefix lengths or field combinations"
    )]
    TooManyTuples { count: usize, max: u32 },
    #[error("the rules expand to {count} table entries (port ranges count once per interval they cover); the datapath holds {max}")]
    TooManyEntries { count: usize, max: u32 },
    #[error("rule {index} (line {line}): src and dst are of different IP families")]
    MixedFamilies { index: u32, line: usize },
    #[error("rule {index} (line {line}): src_mac 00:00:00:00:00:00 is what packets without an Ethernet header have, not an address a host sends from")]
    ZeroMac { index: u32, line: usize },
    #[error("rule {index} (line {line}): tcp_flags value {value:#04x} has bits outside its mask {mask:#04x}, so it never matches")]
    FlagsOutsideMask { index: u32, line: usize, value: u8, mask: u8 },
}

/// Everything the datapath's classification maps hold.
#[derive(Clone, Debug, Default)]
pub struct Compiled {
    /// Tuples, sorted by their smallest rule index.
    pub tuples: Vec<Tuple>,
    pub entries: HashMap<RuleKey, RuleTarget>,
    /// Port number → interval id, one table per direction.
    pub sport_ids: Vec<u16>,
    pub dport_ids: Vec<u16>,
    /// IP length → interval id.
    pub len_ids: Vec<u16>,
}

/// A packet's classification fields, as the datapath's parser produces them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PacketFields {
    pub iface_slot: u16,
    pub src: Option<IpAddr>,
    pub dst: Option<IpAddr>,
    pub proto: u8,
    pub dscp: u8,
    pub mark: u32,
    /// Raw ports, when the packet has a transport header with ports.
    pub ports: Option<(u16, u16)>,
    /// The Ethernet source address; `None` on an interface without a link layer.
    pub src_mac: Option<[u8; 6]>,
    /// The IP length, when the packet is IP: the IPv4 total length, or the IPv6 payload
    /// length plus 40 (the packet's length from its IP header on when the payload length is
    /// 0, a jumbogram's), at most 65535; for a GSO packet, one full segment's.
    pub len: Option<u16>,
    /// The TCP header's flags byte, when a TCP header was read.
    pub tcp_flags: Option<u8>,
    /// A TCP segment whose IP length is its headers' (not a GSO packet).
    pub tcp_no_payload: bool,
    /// The ICMP type (IPv4 protocol 1) or `ICMPv6` type (IPv6 next header 58), when read.
    pub icmp_type: Option<u8>,
}

/// Elementary intervals of 0..=65535 cut by the boundaries of `ranges`; ids start at 1. Values
/// that no range covers get id 0, the id of a packet without the field: no rule on the field
/// holds it, and the datapath's table needs only the covered values written (a rule on
/// `dport = 53` writes one slot, not 65,536).
fn intervals(ranges: impl Iterator<Item = (u16, u16)>) -> Vec<u16> {
    let mut cuts = vec![false; 65537];
    // Coverage as a difference array: +1 where a range starts, -1 after it ends.
    let mut depth = vec![0i32; 65537];
    for (start, end) in ranges {
        cuts[usize::from(start)] = true;
        cuts[usize::from(end) + 1] = true;
        depth[usize::from(start)] += 1;
        depth[usize::from(end) + 1] -= 1;
    }
    let mut ids = vec![0u16; 65536];
    let (mut id, mut covered): (u32, i32) = (0, 0);
    for (value, slot) in ids.iter_mut().enumerate() {
        covered += depth[value];
        // Coverage changes only where an interval starts (at a cut).
        if covered > 0 && (value == 0 || cuts[value]) {
            id += 1;
        }
        if covered > 0 {
            // At most 65536 intervals; saturating keeps the ids below u16's limit (only a
            // set of one-value ranges on every value could reach it).
            *slot = u16::try_from(id).unwrap_or(u16::MAX);
        }
    }
    ids
}

/// Interval ids covered by an inclusive range.
fn ids_in(ids: &[u16], (start, end): (u16, u16)) -> Vec<u16> {
    let mut out: Vec<u16> = ids[usize::from(start)..=usize::from(end)].to_vec();
    out.dedup();
    out
}

fn key_bytes_mut(key: &mut RuleKey) -> &mut [u8; 16] {
    &mut key.src
}

fn set_prefix(dst: &mut [u8; 16], mask: &mut [u8; 16], net: IpNet) {
    let (bytes, len): (Vec<u8>, u8) = match net {
        IpNet::V4(n) => (n.network().octets().to_vec(), n.prefix_len()),
        IpNet::V6(n) => (n.network().octets().to_vec(), n.prefix_len()),
    };
    for (i, b) in bytes.iter().enumerate() {
        let bits = u32::from(len).saturating_sub(u32::try_from(i).unwrap_or(u32::MAX) * 8).min(8);
        let m = if bits == 0 { 0 } else { 0xffu8 << (8 - bits) };
        mask[i] = m;
        dst[i] = b & m;
    }
}

fn family(net: &IpNet) -> u8 {
    match net {
        IpNet::V4(_) => 4,
        IpNet::V6(_) => 6,
    }
}

// `words` and `from_words` lay the fields out where `#[repr(C)]` puts them, with nothing in
// between: the datapath masks the key's memory as these words.
const _: () = {
    assert!(offset_of!(RuleKey, tuple) == 0 && offset_of!(RuleKey, iface) == 2);
    assert!(offset_of!(RuleKey, family) == 4 && offset_of!(RuleKey, proto) == 5);
    assert!(offset_of!(RuleKey, dscp) == 6 && offset_of!(RuleKey, tcp_flags) == 7);
    assert!(offset_of!(RuleKey, mark) == 8 && offset_of!(RuleKey, sport) == 12);
    assert!(offset_of!(RuleKey, dport) == 14 && offset_of!(RuleKey, src) == 16);
    assert!(offset_of!(RuleKey, dst) == 32 && offset_of!(RuleKey, src_mac) == 48);
    assert!(offset_of!(RuleKey, len) == 54 && offset_of!(RuleKey, icmp_type) == 56);
    assert!(offset_of!(RuleKey, l4) == 57 && offset_of!(RuleKey, _pad) == 58);
    assert!(size_of::<RuleKey>() == RULE_KEY_WORDS * 8);
};

/// A rule bank's filter's fewest bits (64 words, 512 bytes).
const MIN_FILTER_BITS: u64 = 4096;
/// Filter bits per `RULES` entry: about one key in sixteen that no rule holds finds its bit
/// set and is looked up anyway.
const FILTER_BITS_PER_ENTRY: u64 = 16;

/// The filter of a rule bank whose `RULES` keys are `keys` (tuple ids as the bank has them;
/// see [`shaper_common::FILTER_WORDS`]): the mask of a bit's index (`Tuple::filter_mask`) and
/// the words that have bits set, by index within the bank.
#[must_use]
pub fn filter<'a>(keys: impl ExactSizeIterator<Item = &'a RuleKey>) -> (u32, BTreeMap<u32, u64>) {
    let max = u64::from(FILTER_WORDS) * 64;
    let wanted = u64::try_from(keys.len()).unwrap_or(u64::MAX).saturating_mul(FILTER_BITS_PER_ENTRY).min(max);
    let mask = wanted.next_power_of_two().clamp(MIN_FILTER_BITS, max) - 1;
    let mut set = BTreeMap::new();
    for key in keys {
        let bit = filter_hash(&words(key)) & mask;
        *set.entry(u32::try_from(bit >> 6).expect("within FILTER_WORDS")).or_insert(0u64) |= 1 << (bit & 63);
    }
    (u32::try_from(mask).expect("at most 2^21 bits"), set)
}

/// The key's memory as the datapath sees it (its fields in `#[repr(C)]` order, native byte
/// order), as 64-bit words: the unit in which tuple masks are applied.
pub(crate) fn words(key: &RuleKey) -> [u64; RULE_KEY_WORDS] {
    let mut bytes = [0u8; RULE_KEY_WORDS * 8];
    bytes[0..2].copy_from_slice(&key.tuple.to_ne_bytes());
    bytes[2..4].copy_from_slice(&key.iface.to_ne_bytes());
    bytes[4..8].copy_from_slice(&[key.family, key.proto, key.dscp, key.tcp_flags]);
    bytes[8..12].copy_from_slice(&key.mark.to_ne_bytes());
    bytes[12..14].copy_from_slice(&key.sport.to_ne_bytes());
    bytes[14..16].copy_from_slice(&key.dport.to_ne_bytes());
    bytes[16..32].copy_from_slice(&key.src);
    bytes[32..48].copy_from_slice(&key.dst);
    bytes[48..54].copy_from_slice(&key.src_mac);
    bytes[54..56].copy_from_slice(&key.len.to_ne_bytes());
    bytes[56] = key.icmp_type;
    bytes[57] = key.l4;
    bytes[58..64].copy_from_slice(&key._pad);
    let mut words = [0u64; RULE_KEY_WORDS];
    for (word, chunk) in words.iter_mut().zip(bytes.chunks_exact(8)) {
        *word = u64::from_ne_bytes(chunk.try_into().expect("8 bytes"));
    }
    words
}

/// The key whose memory is `w`: the inverse of [`words`].
fn from_words(w: &[u64; RULE_KEY_WORDS]) -> RuleKey {
    let mut bytes = [0u8; RULE_KEY_WORDS * 8];
    for (chunk, word) in bytes.chunks_exact_mut(8).zip(w) {
        chunk.copy_from_slice(&word.to_ne_bytes());
    }
    let field = |range: std::ops::Range<usize>| &bytes[range];
    RuleKey {
        tuple: u16::from_ne_bytes(field(0..2).try_into().expect("2 bytes")),
        iface: u16::from_ne_bytes(field(2..4).try_into().expect("2 bytes")),
        family: bytes[4],
        proto: bytes[5],
        dscp: bytes[6],
        tcp_flags: bytes[7],
        mark: u32::from_ne_bytes(field(8..12).try_into().expect("4 bytes")),
        sport: u16::from_ne_bytes(field(12..14).try_into().expect("2 bytes")),
        dport: u16::from_ne_bytes(field(14..16).try_into().expect("2 bytes")),
        src: field(16..32).try_into().expect("16 bytes"),
        dst: field(32..48).try_into().expect("16 bytes"),
        src_mac: field(48..54).try_into().expect("6 bytes"),
        len: u16::from_ne_bytes(field(54..56).try_into().expect("2 bytes")),
        icmp_type: bytes[56],
        l4: bytes[57],
        _pad: field(58..64).try_into().expect("6 bytes"),
    }
}

/// The mask of the fields `rule` tests (its tuple) and its key under that mask (ports and
/// lengths, which it tests by interval, left at 0).
fn mask_and_key(rule: &RuleSpec) -> Result<(RuleKey, RuleKey), CompileError> {
    if let (Some(s), Some(d)) = (&rule.src, &rule.dst) {
        if family(s) != family(d) {
            return Err(CompileError::MixedFamilies { index: rule.index, line: rule.line });
        }
    }
    let mut mask = RuleKey { iface: u16::MAX, ..RuleKey::default() };
    let mut key = RuleKey { iface: rule.iface_slot, ..RuleKey::default() };
    if let Some(net) = rule.src.or(rule.dst) {
        mask.family = u8::MAX;
        key.family = family(&net);
    }
    if let Some(net) = rule.src {
        set_prefix(key_bytes_mut(&mut key), &mut mask.src, net);
    }
    if let Some(net) = rule.dst {
        set_prefix(&mut key.dst, &mut mask.dst, net);
    }
    if let Some(p) = rule.proto {
        mask.proto = u8::MAX;
        key.proto = p;
    }
    if let Some(d) = rule.dscp {
        mask.dscp = u8::MAX;
        key.dscp = d;
    }
    if let Some(m) = rule.mark {
        mask.mark = u32::MAX;
        key.mark = m;
    }
    if let Some(mac) = rule.src_mac {
        if mac == [0; 6] {
            return Err(CompileError::ZeroMac { index: rule.index, line: rule.line });
        }
        mask.src_mac = [u8::MAX; 6];
        key.src_mac = mac;
    }
    // The `l4` bits say the transport header was read, so a packet whose TCP or ICMP
    // header is missing (flags and type 0) matches no rule on them.
    if let Some(f) = rule.tcp_flags {
        if f.value & !f.mask != 0 {
            return Err(CompileError::FlagsOutsideMask {
                index: rule.index,
                line: rule.line,
                value: f.value,
                mask: f.mask,
            });
        }
        mask.tcp_flags = f.mask;
        key.tcp_flags = f.value;
        mask.l4 |= L4_TCP;
        key.l4 |= L4_TCP;
        if f.no_payload {
            mask.l4 |= L4_TCP_NO_PAYLOAD;
            key.l4 |= L4_TCP_NO_PAYLOAD;
        }
    }
    if let Some(t) = rule.icmp_type {
        mask.icmp_type = u8::MAX;
        key.icmp_type = t;
        mask.l4 |= L4_ICMP;
        key.l4 |= L4_ICMP;
    }
    Ok((mask, key))
}

/// Compiles rules into the datapath's tables.
pub fn compile(rules: &[RuleSpec]) -> Result<Compiled, CompileError> {
    let sport_ids = intervals(rules.iter().filter_map(|r| r.sport));
    let dport_ids = intervals(rules.iter().filter_map(|r| r.dport));
    let len_ids = intervals(rules.iter().filter_map(|r| r.len));

    // mask words → (tuple position in `masks`, smallest rule index)
    let mut masks: Vec<([u64; RULE_KEY_WORDS], u32)> = Vec::new();
    // (tuple position, masked key) → target; the earlier rule keeps an identical key.
    let mut entries: Vec<(usize, RuleKey, RuleTarget)> = Vec::new();
    let mut seen: HashMap<(usize, RuleKey), usize> = HashMap::new();

    for rule in rules {
        let (mut mask, key) = mask_and_key(rule)?;
        let sports = rule.sport.map_or_else(|| vec![0], |r| ids_in(&sport_ids, r));
        let dports = rule.dport.map_or_else(|| vec![0], |r| ids_in(&dport_ids, r));
        let lens = rule.len.map_or_else(|| vec![0], |r| ids_in(&len_ids, r));
        if rule.sport.is_some() {
            mask.sport = u16::MAX;
        }
        if rule.dport.is_some() {
            mask.dport = u16::MAX;
        }
        if rule.len.is_some() {
            mask.len = u16::MAX;
        }

        let mask_words = words(&mask);
        let pos = if let Some(pos) = masks.iter().position(|(m, _)| *m == mask_words) {
            masks[pos].1 = masks[pos].1.min(rule.index);
            pos
        } else {
            masks.push((mask_words, rule.index));
            masks.len() - 1
        };
        let target = RuleTarget { rule: rule.index, class: rule.class };
        for &sp in &sports {
            for &dp in &dports {
                for &len in &lens {
                    let k = RuleKey { sport: sp, dport: dp, len, ..key };
                    match seen.get(&(pos, k)) {
                        Some(&i) if entries[i].2.rule <= rule.index => {}
                        Some(&i) => entries[i].2 = target,
                        None => {
                            seen.insert((pos, k), entries.len());
                            entries.push((pos, k, target));
                        }
                    }
                    if entries.len() > MAX_RULE_ENTRIES as usize {
                        return Err(CompileError::TooManyEntries { count: entries.len(), max: MAX_RULE_ENTRIES });
                    }
                }
            }
        }
    }
    if masks.len() > MAX_TUPLES as usize {
        return Err(CompileError::TooManyTuples { count: masks.len(), max: MAX_TUPLES });
    }

    // Tuple ids follow the order of each tuple's first rule.
    let mut order: Vec<usize> = (0..masks.len()).collect();
    order.sort_by_key(|&i| masks[i].1);
    let mut id_of = vec![0u16; masks.len()];
    for (id, &pos) in order.iter().enumerate() {
        id_of[pos] = u16::try_from(id).expect("at most MAX_TUPLES tuples");
    }
    let tuples =
        order.iter().map(|&pos| Tuple { mask: masks[pos].0, min_rule: masks[pos].1, filter_mask: 0 }).collect();
    let entries = entries
        .into_iter()
        .map(|(pos, mut key, target)| {
            key.tuple = id_of[pos];
            (key, target)
        })
        .collect();
    Ok(Compiled { tuples, entries, sport_ids, dport_ids, len_ids })
}

impl PacketFields {
    /// The packet key as the datapath builds it (raw ports replaced by interval ids).
    #[must_use]
    pub fn key(&self, compiled: &Compiled) -> RuleKey {
        let mut key = RuleKey {
            iface: self.iface_slot,
            proto: self.proto,
            dscp: self.dscp,
            mark: self.mark,
            ..RuleKey::default()
        };
        match (self.src, self.dst) {
            (Some(IpAddr::V4(s)), Some(IpAddr::V4(d))) => {
                key.family = 4;
                key.src[..4].copy_from_slice(&s.octets());
                key.dst[..4].copy_from_slice(&d.octets());
            }
            (Some(IpAddr::V6(s)), Some(IpAddr::V6(d))) => {
                key.family = 6;
                key.src = s.octets();
                key.dst = d.octets();
            }
            _ => {}
        }
        if let Some((sp, dp)) = self.ports {
            key.sport = compiled.sport_ids[usize::from(sp)];
            key.dport = compiled.dport_ids[usize::from(dp)];
        }
        if let Some(len) = self.len {
            key.len = compiled.len_ids[usize::from(len)];
        }
        key.src_mac = self.src_mac.unwrap_or_default();
        if let Some(flags) = self.tcp_flags {
            key.tcp_flags = flags;
            key.l4 = L4_TCP | if self.tcp_no_payload { L4_TCP_NO_PAYLOAD } else { 0 };
        }
        if let Some(t) = self.icmp_type {
            key.icmp_type = t;
            key.l4 = L4_ICMP;
        }
        key
    }
}

impl Compiled {
    /// The datapath's algorithm (shaper-ebpf/src/classify.rs), in userspace.
    #[must_use]
    pub fn lookup(&self, packet: &PacketFields) -> Option<RuleTarget> {
        let w = words(&packet.key(self));
        let mut best: Option<RuleTarget> = None;
        for (id, tuple) in self.tuples.iter().enumerate() {
            if best.is_some_and(|b| tuple.min_rule >= b.rule) {
                break;
            }
            let mut masked = [0u64; RULE_KEY_WORDS];
            for i in 0..RULE_KEY_WORDS {
                masked[i] = w[i] & tuple.mask[i];
            }
            masked[0] |= id as u64;
            if let Some(t) = self.entries.get(&from_words(&masked)) {
                if best.is_none_or(|b| t.rule < b.rule) {
                    best = Some(*t);
                }
            }
        }
        best
    }
}

/// The specification: the first rule, in file order, whose every field matches.
#[must_use]
pub fn first_match<'a>(rules: &'a [RuleSpec], p: &PacketFields) -> Option<&'a RuleSpec> {
    let net_ok = |net: &Option<IpNet>, addr: Option<IpAddr>| match (net, addr) {
        (None, _) => true,
        (Some(n), Some(a)) => n.contains(&a),
        (Some(_), None) => false,
    };
    let range_ok = |r: &Option<(u16, u16)>, value: Option<u16>| match (r, value) {
        (None, _) => true,
        (Some((a, b)), Some(p)) => (*a..=*b).contains(&p),
        (Some(_), None) => false,
    };
    let mut sorted: Vec<&RuleSpec> = rules.iter().collect();
    sorted.sort_by_key(|r| r.index);
    sorted.into_iter().find(|r| {
        r.iface_slot == p.iface_slot
            && net_ok(&r.src, p.src)
            && net_ok(&r.dst, p.dst)
            && r.proto.is_none_or(|x| x == p.proto)
            && r.dscp.is_none_or(|x| x == p.dscp)
            && r.mark.is_none_or(|x| x == p.mark)
            && range_ok(&r.sport, p.ports.map(|x| x.0))
            && range_ok(&r.dport, p.ports.map(|x| x.1))
            && range_ok(&r.len, p.len)
            && r.src_mac.is_none_or(|m| p.src_mac == Some(m))
            && r.tcp_flags.is_none_or(|f| p.tcp_flags.is_some_and(|x| f.matches(x, p.tcp_no_payload)))
            && r.icmp_type.is_none_or(|t| p.icmp_type == Some(t))
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;

    /// `n` keys of host rules: one /32 source each.
    fn host_keys(n: u32) -> Vec<RuleKey> {
        (0..n)
            .map(|i| {
                let mut src = [0u8; 16];
                src[..4].copy_from_slice(&(0x0a00_0000 + i).to_be_bytes());
                RuleKey { tuple: 3, iface: 1, family: 4, src, ..RuleKey::default() }
            })
            .collect()
    }

    /// Whether the filter `(mask, words)` has the bit of `key` set.
    fn passes((mask, set): &(u32, BTreeMap<u32, u64>), key: &RuleKey) -> bool {
        let bit = filter_hash(&words(key)) & u64::from(*mask);
        set.get(&u32::try_from(bit >> 6).unwrap()).is_some_and(|w| w >> (bit & 63) & 1 == 1)
    }

    #[test]
    fn the_filter_passes_every_key_of_its_bank_and_few_others() {
        for n in [0, 10, 10_000, 131_072] {
            let keys = host_keys(n);
            let f = filter(keys.iter());
            // Sixteen bits a key, within 4,096 bits and FILTER_WORDS words.
            let bits = u64::from(f.0) + 1;
            assert!(bits.is_power_of_two() && (4096..=u64::from(FILTER_WORDS) * 64).contains(&bits), "{n}: {bits}");
            assert!(n == 0 || bits >= (u64::from(n) * 16).min(u64::from(FILTER_WORDS) * 64), "{n}: {bits}");
            assert!(f.1.keys().all(|&w| w < FILTER_WORDS));
            assert!(keys.iter().all(|k| passes(&f, k)), "{n}: a key of the bank is filtered out");
            // Keys of another tuple (the same hosts, tested by another rule shape): at most a
            // few in a hundred find their bit set (one in sixteen bits is set, or more with
            // the filter full).
            let others: Vec<RuleKey> = keys.iter().map(|k| RuleKey { tuple: 4, ..*k }).take(5_000).collect();
            let false_positives = others.iter().filter(|k| passes(&f, k)).count();
            let limit = if n > 65_536 { others.len() / 6 } else { others.len() / 12 + 5 };
            assert!(false_positives <= limit, "{n}: {false_positives} of {} pass", others.len());
        }
    }

    fn v4(src: [u8; 4], dst: [u8; 4], proto: u8, ports: Option<(u16, u16)>) -> PacketFields {
        PacketFields {
            src: Some(IpAddr::V4(Ipv4Addr::from(src))),
            dst: Some(IpAddr::V4(Ipv4Addr::from(dst))),
            proto,
            ports,
            ..PacketFields::default()
        }
    }

    #[test]
    fn first_rule_in_file_order_wins_over_longer_prefix() {
        let rules = vec![
            RuleSpec { src: Some("10.0.0.0/8".parse().unwrap()), ..RuleSpec::new(0, 1) },
            RuleSpec { src: Some("10.1.0.0/16".parse().unwrap()), ..RuleSpec::new(1, 2) },
            RuleSpec { src: Some("10.1.2.3/32".parse().unwrap()), ..RuleSpec::new(2, 3) },
        ];
        let c = compile(&rules).unwrap();
        let p = v4([10, 1, 2, 3], [1, 1, 1, 1], 6, Some((1, 2)));
        assert_eq!(c.lookup(&p).unwrap().class, 1);
        let later = vec![rules[2].clone(), RuleSpec { index: 5, ..rules[0].clone() }];
        let c = compile(&later).unwrap();
        assert_eq!(c.lookup(&p).unwrap().class, 3);
    }

    #[test]
    fn ten_thousand_hosts_are_one_tuple() {
        let rules: Vec<RuleSpec> = (0..10_000u32)
            .map(|i| RuleSpec {
                src: Some(IpNet::from(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))),
                ..RuleSpec::new(i, i % 7)
            })
            .collect();
        let c = compile(&rules).unwrap();
        assert_eq!(c.tuples.len(), 1);
        assert_eq!(c.entries.len(), 10_000);
        let p = v4([10, 0, 0x26, 0xff], [8, 8, 8, 8], 17, None);
        assert_eq!(c.lookup(&p).unwrap().rule, 0x26ff);
    }

    #[test]
    fn port_ranges_split_into_intervals() {
        let rules = vec![
            RuleSpec { dport: Some((3072, 4095)), proto: Some(6), ..RuleSpec::new(0, 1) },
            RuleSpec { dport: Some((4000, 5000)), ..RuleSpec::new(1, 2) },
            RuleSpec { sport: Some((53, 53)), ..RuleSpec::new(2, 3) },
        ];
        let c = compile(&rules).unwrap();
        let at = |proto, sp, dp| c.lookup(&v4([1, 2, 3, 4], [5, 6, 7, 8], proto, Some((sp, dp)))).map(|t| t.class);
        assert_eq!(at(6, 1000, 3072), Some(1));
        assert_eq!(at(6, 1000, 4095), Some(1));
        assert_eq!(at(17, 1000, 4095), Some(2));
        assert_eq!(at(17, 1000, 5000), Some(2));
        assert_eq!(at(17, 1000, 5001), None);
        assert_eq!(at(17, 53, 9), Some(3));
        assert_eq!(at(6, 1000, 3071), None);
        // ICMP has no ports: a port rule never matches it.
        assert_eq!(c.lookup(&v4([1, 2, 3, 4], [5, 6, 7, 8], 1, None)), None);
    }

    #[test]
    fn only_values_a_range_covers_have_interval_ids() {
        let ids = intervals([(53, 53), (50, 60), (1000, 1000)].into_iter());
        assert_eq!((ids[0], ids[49], ids[61], ids[999], ids[1001], ids[65535]), (0, 0, 0, 0, 0, 0));
        assert_eq!((ids[50], ids[52], ids[53], ids[54], ids[60], ids[1000]), (1, 1, 2, 3, 3, 4));
        assert!(intervals(std::iter::empty()).iter().all(|&id| id == 0));
        assert!(intervals([(0, 65535)].into_iter()).iter().all(|&id| id == 1));
    }

    #[test]
    fn seed_003s_classes_by_flags_length_and_icmp_type() {
        let ack = TcpFlags { value: 0x10, mask: 0x3f, no_payload: false };
        let rules = vec![
            RuleSpec { tcp_flags: Some(TcpFlags { no_payload: true, ..ack }), ..RuleSpec::new(0, 1) },
            RuleSpec { tcp_flags: Some(ack), len: Some((0, 63)), ..RuleSpec::new(1, 2) },
            RuleSpec { icmp_type: Some(8), ..RuleSpec::new(2, 3) },
            RuleSpec { src_mac: Some([2, 0, 0, 0, 1, 0x10]), ..RuleSpec::new(3, 4) },
        ];
        let c = compile(&rules).unwrap();
        let tcp = |flags, no_payload, len| PacketFields {
            tcp_flags: Some(flags),
            tcp_no_payload: no_payload,
            len: Some(len),
            ..v4([1, 2, 3, 4], [5, 6, 7, 8], 6, Some((1, 2)))
        };
        let class = |p: PacketFields| c.lookup(&p).map(|t| t.class);
        assert_eq!(class(tcp(0x10, true, 52)), Some(1));
        assert_eq!(class(tcp(0x50, true, 72)), Some(1), "ECE is not compared");
        assert_eq!(class(tcp(0x10, false, 60)), Some(2));
        assert_eq!(class(tcp(0x18, false, 60)), None);
        let ping = PacketFields { icmp_type: Some(8), len: Some(84), ..v4([1, 2, 3, 4], [5, 6, 7, 8], 1, None) };
        assert_eq!(class(ping), Some(3));
        assert_eq!(class(PacketFields { icmp_type: Some(0), ..ping }), None);
        // Without a header, no flags nor type: a rule on either never matches.
        assert_eq!(class(PacketFields { icmp_type: None, ..ping }), None);
        assert_eq!(class(PacketFields { src_mac: Some([2, 0, 0, 0, 1, 0x10]), ..ping }), Some(3));
        assert_eq!(class(PacketFields { src_mac: Some([2, 0, 0, 0, 1, 0x10]), icmp_type: None, ..ping }), Some(4));
        let zero = [RuleSpec { src_mac: Some([0; 6]), ..RuleSpec::new(0, 1) }];
        assert_eq!(compile(&zero).unwrap_err(), CompileError::ZeroMac { index: 0, line: 1 });
        let outside = [RuleSpec {
            tcp_flags: Some(TcpFlags { value: 0x12, mask: 0x02, no_payload: false }),
            ..RuleSpec::new(0, 1)
        }];
        assert!(matches!(compile(&outside), Err(CompileError::FlagsOutsideMask { .. })));
    }

    #[test]
    fn families_do_not_mix() {
        let rules = vec![
            RuleSpec { dst: Some("::/0".parse().unwrap()), ..RuleSpec::new(0, 6) },
            RuleSpec { dst: Some("0.0.0.0/0".parse().unwrap()), ..RuleSpec::new(1, 4) },
        ];
        let c = compile(&rules).unwrap();
        assert_eq!(c.lookup(&v4([1, 2, 3, 4], [5, 6, 7, 8], 6, None)).unwrap().class, 4);
        let p6 = PacketFields {
            src: Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            dst: Some(IpAddr::V6(Ipv6Addr::LOCALHOST)),
            ..PacketFields::default()
        };
        assert_eq!(c.lookup(&p6).unwrap().class, 6);
        let mixed = vec![RuleSpec {
            src: Some("::/0".parse().unwrap()),
            dst: Some("0.0.0.0/0".parse().unwrap()),
            ..RuleSpec::new(0, 1)
        }];
        assert_eq!(compile(&mixed).unwrap_err(), CompileError::MixedFamilies { index: 0, line: 1 });
    }

    #[test]
    fn too_many_shapes_is_an_error() {
        let rules: Vec<RuleSpec> = (0..=32u8)
            .map(|len| RuleSpec {
                src: Some(IpNet::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), len).unwrap()),
                ..RuleSpec::new(u32::from(len), 0)
            })
            .collect();
        assert!(matches!(compile(&rules), Err(CompileError::TooManyTuples { count: 33, .. })));
    }

    fn arb_rule() -> impl Strategy<Value = RuleSpec> {
        let net = prop_oneof![
            Just(None),
            (any::<[u8; 4]>(), 0u8..=32)
                .prop_map(|(a, l)| Some(IpNet::new(IpAddr::V4(Ipv4Addr::from(a)), l).unwrap().trunc()))
        ];
        let range = prop_oneof![Just(None), (0u16..8, 0u16..8).prop_map(|(a, b)| Some((a.min(b), a.max(b))))];
        let flags = (0u8..4, 0u8..4, any::<bool>()).prop_map(|(value, mask, no_payload)| TcpFlags {
            value: value & mask,
            mask,
            no_payload,
        });
        (
            net.clone(),
            net,
            prop::option::of(prop_oneof![Just(6u8), Just(17u8)]),
            range.clone(),
            range.clone(),
            prop::option::of(0u32..3),
            prop::option::of(0u8..3),
            0u32..5,
            range,
            prop::option::weighted(0.2, flags),
            prop::option::weighted(0.2, 0u8..3),
            prop::option::weighted(0.2, (1u8..3).prop_map(|b| [2, 0, 0, 0, 0, b])),
        )
            .prop_map(
                |(src, dst, proto, sport, dport, mark, dscp, class, len, tcp_flags, icmp_type, src_mac)| RuleSpec {
                    src,
                    dst,
                    proto,
                    sport,
                    dport,
                    mark,
                    dscp,
                    len,
                    tcp_flags,
                    icmp_type,
                    src_mac,
                    ..RuleSpec::new(0, class)
                },
            )
    }

    fn arb_packet() -> impl Strategy<Value = PacketFields> {
        (
            any::<[u8; 4]>(),
            any::<[u8; 4]>(),
            prop_oneof![Just(6u8), Just(17u8), Just(1u8)],
            0u16..9,
            0u16..9,
            0u32..3,
            0u8..3,
            0u16..9,
            (0u8..4, any::<bool>(), prop::option::of(0u8..3)),
            prop::option::of((0u8..3).prop_map(|b| [2, 0, 0, 0, 0, b])),
        )
            .prop_map(|(s, d, proto, sp, dp, mark, dscp, len, (flags, no_payload, icmp), src_mac)| {
                let tcp = proto == 6;
                PacketFields {
                    dscp,
                    mark,
                    len: Some(len),
                    src_mac,
                    tcp_flags: tcp.then_some(flags),
                    tcp_no_payload: tcp && no_payload,
                    icmp_type: if proto == 1 { icmp } else { None },
                    ..v4(s, d, proto, (proto != 1).then_some((sp, dp)))
                }
            })
    }

    proptest! {
        /// The compiled tables and a linear scan in file order agree on every packet.
        #[test]
        fn compiled_lookup_equals_linear_scan(mut rules in prop::collection::vec(arb_rule(), 0..40), packets in prop::collection::vec(arb_packet(), 1..60)) {
            for (i, r) in rules.iter_mut().enumerate() {
                r.index = u32::try_from(i).unwrap();
                // Addresses near the packets' so that prefixes match often.
                for net in [&mut r.src, &mut r.dst] {
                    if let Some(IpNet::V4(n)) = net {
                        let o = n.network().octets();
                        *net = Some(IpNet::new(IpAddr::V4(Ipv4Addr::new(o[0] & 1, 0, 0, o[3] & 3)), n.prefix_len().min(32)).unwrap().trunc());
                    }
                }
            }
            let Ok(c) = compile(&rules) else { return Ok(()) };
            for mut p in packets {
                for a in [&mut p.src, &mut p.dst] {
                    if let Some(IpAddr::V4(x)) = a {
                        let o = x.octets();
                        *a = Some(IpAddr::V4(Ipv4Addr::new(o[0] & 1, 0, 0, o[3] & 3)));
                    }
                }
                let want = first_match(&rules, &p).map(|r| RuleTarget { rule: r.index, class: r.class });
                prop_assert_eq!(c.lookup(&p), want, "packet {:?}", p);
            }
        }
    }
}
