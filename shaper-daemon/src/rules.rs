//! Rules compiled into the datapath's lookup tables.
//!
//! The datapath must find the first matching rule (in file order) at a cost that does not
//! grow with the number of rules. Rules are grouped by *tuple*, the set of fields they test
//! and their prefix lengths; one tuple is one hash lookup of the packet key masked by the
//! tuple's mask (tuple space search). Port ranges do not mask, so ports are first mapped to
//! ids of elementary intervals (the ranges' boundaries split 0..=65535 into intervals, one
//! array lookup per port), and a rule with a range is stored once per interval it covers.
//!
//! [`Compiled::lookup`] runs the same algorithm as the datapath, so unit tests can check it
//! against a plain linear scan ([`first_match`]).

use std::{collections::HashMap, mem::offset_of, net::IpAddr};

use ipnet::IpNet;
use shaper_common::{RuleKey, RuleTarget, Tuple, MAX_RULE_ENTRIES, MAX_TUPLES, RULE_KEY_WORDS};

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
}

/// Elementary intervals of 0..=65535 cut by the boundaries of `ranges`; ids start at 1.
fn port_intervals(ranges: impl Iterator<Item = (u16, u16)>) -> Vec<u16> {
    let mut cuts = vec![false; 65537];
    let mut any = false;
    for (start, end) in ranges {
        cuts[usize::from(start)] = true;
        cuts[usize::from(end) + 1] = true;
        any = true;
    }
    if !any {
        return vec![0; 65536];
    }
    let mut ids = vec![0u16; 65536];
    let mut id: u32 = 0;
    for (port, slot) in ids.iter_mut().enumerate() {
        if port == 0 || cuts[port] {
            id += 1;
        }
        // At most 65536 intervals; the last id that could overflow a u16 belongs to port
        // 65535 alone, and saturating keeps it distinct from every other interval.
        *slot = u16::try_from(id).unwrap_or(u16::MAX);
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
    assert!(offset_of!(RuleKey, dscp) == 6 && offset_of!(RuleKey, _pad) == 7);
    assert!(offset_of!(RuleKey, mark) == 8 && offset_of!(RuleKey, sport) == 12);
    assert!(offset_of!(RuleKey, dport) == 14 && offset_of!(RuleKey, src) == 16);
    assert!(offset_of!(RuleKey, dst) == 32 && size_of::<RuleKey>() == RULE_KEY_WORDS * 8);
};

/// The key's memory as the datapath sees it (its fields in `#[repr(C)]` order, native byte
/// order), as 64-bit words: the unit in which tuple masks are applied.
fn words(key: &RuleKey) -> [u64; RULE_KEY_WORDS] {
    let mut bytes = [0u8; RULE_KEY_WORDS * 8];
    bytes[0..2].copy_from_slice(&key.tuple.to_ne_bytes());
    bytes[2..4].copy_from_slice(&key.iface.to_ne_bytes());
    bytes[4..8].copy_from_slice(&[key.family, key.proto, key.dscp, key._pad]);
    bytes[8..12].copy_from_slice(&key.mark.to_ne_bytes());
    bytes[12..14].copy_from_slice(&key.sport.to_ne_bytes());
    bytes[14..16].copy_from_slice(&key.dport.to_ne_bytes());
    bytes[16..32].copy_from_slice(&key.src);
    bytes[32..48].copy_from_slice(&key.dst);
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
        _pad: bytes[7],
        mark: u32::from_ne_bytes(field(8..12).try_into().expect("4 bytes")),
        sport: u16::from_ne_bytes(field(12..14).try_into().expect("2 bytes")),
        dport: u16::from_ne_bytes(field(14..16).try_into().expect("2 bytes")),
        src: field(16..32).try_into().expect("16 bytes"),
        dst: field(32..48).try_into().expect("16 bytes"),
    }
}

/// Compiles rules into the datapath's tables.
pub fn compile(rules: &[RuleSpec]) -> Result<Compiled, CompileError> {
    let sport_ids = port_intervals(rules.iter().filter_map(|r| r.sport));
    let dport_ids = port_intervals(rules.iter().filter_map(|r| r.dport));

    // mask words → (tuple position in `masks`, smallest rule index)
    let mut masks: Vec<([u64; RULE_KEY_WORDS], u32)> = Vec::new();
    // (tuple position, masked key) → target; the earlier rule keeps an identical key.
    let mut entries: Vec<(usize, RuleKey, RuleTarget)> = Vec::new();
    let mut seen: HashMap<(usize, RuleKey), usize> = HashMap::new();

    for rule in rules {
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
        let sports = rule.sport.map_or_else(|| vec![0], |r| ids_in(&sport_ids, r));
        let dports = rule.dport.map_or_else(|| vec![0], |r| ids_in(&dport_ids, r));
        if rule.sport.is_some() {
            mask.sport = u16::MAX;
        }
        if rule.dport.is_some() {
            mask.dport = u16::MAX;
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
                let mut k = key;
                k.sport = sp;
                k.dport = dp;
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
    let tuples = order.iter().map(|&pos| Tuple { mask: masks[pos].0, min_rule: masks[pos].1, _pad: 0 }).collect();
    let entries = entries
        .into_iter()
        .map(|(pos, mut key, target)| {
            key.tuple = id_of[pos];
            (key, target)
        })
        .collect();
    Ok(Compiled { tuples, entries, sport_ids, dport_ids })
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
    let range_ok = |r: &Option<(u16, u16)>, port: Option<u16>| match (r, port) {
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
    })
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use super::*;

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
        (
            net.clone(),
            net,
            prop::option::of(prop_oneof![Just(6u8), Just(17u8)]),
            range.clone(),
            range,
            prop::option::of(0u32..3),
            prop::option::of(0u8..3),
            0u32..5,
        )
            .prop_map(|(src, dst, proto, sport, dport, mark, dscp, class)| RuleSpec {
                src,
                dst,
                proto,
                sport,
                dport,
                mark,
                dscp,
                ..RuleSpec::new(0, class)
            })
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
        )
            .prop_map(|(s, d, proto, sp, dp, mark, dscp)| PacketFields {
                dscp,
                mark,
                ..v4(s, d, proto, (proto != 1).then_some((sp, dp)))
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
