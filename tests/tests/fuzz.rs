//! The tc program's parser and classifier on random and damaged packets, through
//! `BPF_PROG_TEST_RUN` on the host kernel, against a userspace model: the reference parser
//! (`shaper_tests::reference`) and the rules' specification (`shaper::rules::first_match`).
//!
//! Each case is a random rule set (IPv4 and IPv6 networks, protocols, port ranges, marks, DSCP,
//! IP length ranges, TCP flags, ICMP types, source MACs, a rule now and then on another
//! interface) and a few dozen packets: well-formed ones from the builders (VLAN tags, PPPoE
//! sessions, IPv4 options and fragments, IPv6 extension header chains, TCP with random flags,
//! UDP, ICMP and `ICMPv6` of random types, other protocols, other ethertypes), on an Ethernet
//! or a link-layer-less interface, then
//! damaged (cut at random lengths, bytes flipped or overwritten, garbage appended), and plain
//! garbage. For every packet the program must return `TC_ACT_OK` (the classes are unpaced, or
//! paced far above what a test sends, so nothing is dropped), exactly one class must count it,
//! and that class must be the model's. A failure prints the packet in hex, the interface mode,
//! the mark, the model's parse and the rules.
//!
//! The program is loaded once; each case loads its rules as the daemon does (into the inactive
//! bank, then a switch), which also checks that nothing of a rule set outlives it. The number of
//! cases is fixed (`CASES`, or `SHAPER_FUZZ_CASES` for longer runs); each run draws new ones
//! (`PROPTEST_RNG_SEED` replays a run). The tests after it hold cases it found, one packet each.
//!
//! Needs root.
#![allow(clippy::cast_possible_truncation, reason = "random numbers folded into small ranges")]

use std::{
    cell::RefCell,
    fmt::Write as _,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
};

use aya::programs::{TestRun as _, TestRunOptions};
use ipnet::IpNet;
use proptest::{
    prelude::*,
    sample::{select, Index},
    test_runner::{Config, TestCaseError, TestRunner},
};
use shaper::{
    bpf::Datapath,
    rules::{first_match, PacketFields, RuleSpec, TcpFlags},
};
use shaper_common::{ClassConfig, IfaceConfig, IFACE_ENABLED, IFACE_L3};
use shaper_tests::{ipv4, ipv4_checksum, ipv6, loopback_datapath, reference, Frame, L4, LO, TC_ACT_OK};

/// The loopback interface's default class; rules send packets to classes below it.
const DEFAULT: u32 = 9;
/// Rule sets per run, each with `PACKETS` packets: about 6,000 packets, which take some 20 s
/// (a tenth of a second per rule set, most of it writing the port tables).
const CASES: u32 = 200;
/// Packets per rule set.
const PACKETS: std::ops::Range<usize> = 1..64;
/// Environment variable that sets the number of rule sets, for longer runs.
const CASES_ENV: &str = "SHAPER_FUZZ_CASES";
/// A class paced far above anything a test sends (100 Gbyte/s, a 10 s horizon, no AQM), so
/// that the pacing path runs on the damaged packets too without ever dropping one.
fn fast_class() -> ClassConfig {
    ClassConfig { rate_bytes: 100_000_000_000, horizon_ns: 10_000_000_000, ..ClassConfig::default() }
}

#[test]
fn the_datapath_classifies_random_and_damaged_packets_as_the_model_does() {
    let harness = RefCell::new(Harness::new());
    let mut runner = TestRunner::new(runner_config());
    let stats = RefCell::new(Tally::default());
    let result = runner.run(&(rule_set(), prop::collection::vec(shot(), PACKETS)), |(rules, shots)| {
        check_rule_set(&mut harness.borrow_mut(), &rules, &shots, &mut stats.borrow_mut())
    });
    let stats = stats.into_inner();
    println!(
        "{} packets run ({} malformed by the model, {} not IP, {} with ports, {} matched a rule; \
         {} IP in PPPoE, {} TCP without payload, {} with an ICMP type, {} matched a rule on \
         length, TCP flags, ICMP type or MAC); {} refused by BPF_PROG_TEST_RUN itself",
        stats.run,
        stats.malformed,
        stats.not_ip,
        stats.with_ports,
        stats.matched,
        stats.pppoe_ip,
        stats.tcp_no_payload,
        stats.icmp,
        stats.matched_new,
        stats.refused
    );
    if let Err(e) = result {
        panic!("{e}");
    }
    // The generator must reach every outcome, or the comparison says little.
    assert!(stats.run >= u64::from(CASES) * 16, "too few packets run: {stats:?}");
    assert!(stats.malformed > 0 && stats.not_ip > 0 && stats.with_ports > 0 && stats.matched > 0, "{stats:?}");
    assert!(stats.pppoe_ip > 0 && stats.tcp_no_payload > 0 && stats.icmp > 0 && stats.matched_new > 0, "{stats:?}");
}

fn runner_config() -> Config {
    let cases = std::env::var(CASES_ENV).ok().and_then(|v| v.parse().ok()).unwrap_or(CASES);
    Config {
        cases,
        // A failing case is printed, not written next to the sources.
        failure_persistence: None,
        // Each shrinking step reloads the rules (a fraction of a second).
        max_shrink_iters: 512,
        ..Config::default()
    }
}

/// What the run went through, so that a generator that stopped reaching a case shows.
#[derive(Debug, Default)]
struct Tally {
    run: u64,
    refused: u64,
    malformed: u64,
    not_ip: u64,
    with_ports: u64,
    matched: u64,
    /// IP packets inside a PPPoE session, as the model reads them.
    pppoe_ip: u64,
    tcp_no_payload: u64,
    icmp: u64,
    /// Packets whose matching rule tests the length, TCP flags, ICMP type or source MAC.
    matched_new: u64,
}

/// One packet of a case: how it is built, damaged, and sent.
#[derive(Clone, Debug)]
struct Shot {
    /// The interface has no link-layer header (the packet starts at its IP header).
    l3: bool,
    mark: u32,
    base: Base,
    /// The last byte of the Ethernet source address.
    mac: u8,
    /// A PPPoE session header put in front of the IP packet (on an Ethernet interface): its
    /// code and PPP protocol.
    pppoe: Option<(u8, u16)>,
    /// The TCP flags byte (of a TCP packet), or the ICMP type (of an ICMP packet, or of an
    /// IPv6 packet of next header 58, whose first payload byte it sets).
    l4_byte: u8,
    damage: Vec<Damage>,
}

#[derive(Clone, Debug)]
enum Base {
    V4 {
        frame: Frame,
        src: Ipv4Addr,
        dst: Ipv4Addr,
        l4: L4,
        /// 4-byte words of options.
        options: u8,
        /// Flags and fragment offset (bytes 6-7 of the header).
        fragment: u16,
    },
    V6 {
        frame: Frame,
        src: Ipv6Addr,
        dst: Ipv6Addr,
        chain: Vec<Ext>,
        l4: L4,
    },
    /// An Ethernet frame of another ethertype (or an IP one with anything behind it).
    Other {
        vlan: Option<u16>,
        ethertype: u16,
        body: Vec<u8>,
    },
}

/// An IPv6 extension header.
#[derive(Clone, Copy, Debug)]
enum Ext {
    /// Hop-by-hop (0), routing (43) or destination options (60), `units` + 1 times 8 bytes.
    Options { kind: u8, units: u8 },
    /// A fragment header: offset in 8-byte units, and the more-fragments flag.
    Fragment { offset: u16, more: bool },
    /// An authentication header, `words` + 2 times 4 bytes.
    Ah { words: u8 },
}

#[derive(Clone, Debug)]
enum Damage {
    /// Keep this part of the packet (at least the 14 bytes `BPF_PROG_TEST_RUN` needs).
    Cut(Index),
    /// XOR a byte among the first 100 (the headers).
    Flip(Index, u8),
    /// Overwrite a byte among the first 100 with a value that steers the parser.
    Set(Index, u8),
    Append(Vec<u8>),
}

fn v4_address() -> impl Strategy<Value = Ipv4Addr> {
    prop_oneof![
        3 => select(vec![
            Ipv4Addr::new(10, 0, 0, 1),
            Ipv4Addr::new(10, 0, 0, 2),
            Ipv4Addr::new(10, 0, 1, 7),
            Ipv4Addr::new(192, 168, 1, 110),
            Ipv4Addr::new(8, 8, 8, 8),
            Ipv4Addr::UNSPECIFIED,
            Ipv4Addr::BROADCAST,
        ]),
        1 => any::<[u8; 4]>().prop_map(Ipv4Addr::from),
    ]
}

fn v6_address() -> impl Strategy<Value = Ipv6Addr> {
    prop_oneof![
        3 => select(vec![
            "2001:db8::1".parse::<Ipv6Addr>().unwrap(),
            "2001:db8::2".parse().unwrap(),
            "2001:db8:1::7".parse().unwrap(),
            "fd00::1".parse().unwrap(),
            Ipv6Addr::LOCALHOST,
            Ipv6Addr::UNSPECIFIED,
        ]),
        1 => any::<[u8; 16]>().prop_map(Ipv6Addr::from),
    ]
}

const PORTS: [u16; 10] = [0, 1, 53, 80, 443, 1023, 1024, 5001, 40000, 65535];

fn port() -> impl Strategy<Value = u16> {
    prop_oneof![3 => select(PORTS.to_vec()), 1 => any::<u16>()]
}

/// Protocols the rules and packets use: TCP, UDP, ICMP, `ICMPv6`, and the numbers of IPv6
/// extension headers (which a packet whose chain the parser gives up on is classified as).
const PROTOS: [u8; 10] = [6, 17, 1, 58, 0, 43, 44, 50, 51, 60];

fn network(v6: bool) -> BoxedStrategy<IpNet> {
    if v6 {
        (v6_address(), select(vec![0u8, 16, 32, 48, 64, 120, 127, 128]))
            .prop_map(|(a, len)| IpNet::new(IpAddr::V6(a), len).unwrap().trunc())
            .boxed()
    } else {
        (v4_address(), prop_oneof![select(vec![0u8, 8, 16, 24, 31, 32]), 0u8..=32])
            .prop_map(|(a, len)| IpNet::new(IpAddr::V4(a), len).unwrap().trunc())
            .boxed()
    }
}

/// TCP flag bytes the packets carry and the rules test: SYN, SYN-ACK, ACK, PSH-ACK, FIN-ACK,
/// RST, ACK with ECE, SYN with ECE and CWR.
const TCP_FLAG_BYTES: [u8; 8] = [0x02, 0x12, 0x10, 0x18, 0x11, 0x04, 0x50, 0xc2];

fn tcp_flags() -> impl Strategy<Value = TcpFlags> {
    prop_oneof![
        // As the configuration writes them: exact on the six flags but ECN's, pure ACKs.
        2 => select(TCP_FLAG_BYTES.to_vec()).prop_map(|v| TcpFlags { value: v & 0x3f, mask: 0x3f, no_payload: false }),
        1 => Just(TcpFlags { value: 0x10, mask: 0x3f, no_payload: true }),
        1 => (any::<u8>(), any::<u8>(), any::<bool>())
            .prop_map(|(v, mask, no_payload)| TcpFlags { value: v & mask, mask, no_payload }),
    ]
}

/// Lengths near the builders' packets' (a 20-byte IPv4 header, 32 bytes of TCP, up to 40 of
/// payload, options and extension headers).
fn length() -> impl Strategy<Value = u16> {
    prop_oneof![3 => 20u16..200, 1 => select(vec![0u16, 52, 63, 64, 72, 65535]), 1 => any::<u16>()]
}

fn rule() -> impl Strategy<Value = RuleSpec> {
    let range = || (port(), port()).prop_map(|(a, b)| (a.min(b), a.max(b)));
    let lengths = (length(), length()).prop_map(|(a, b)| (a.min(b), a.max(b)));
    // Fields of the transport header and link: at most one of TCP flags and ICMP type.
    let l4 = prop_oneof![
        3 => Just((None, None)),
        1 => tcp_flags().prop_map(|f| (Some(f), None)),
        1 => prop_oneof![select(vec![0u8, 3, 8, 11, 128, 129, 135]), any::<u8>()].prop_map(|t| (None, Some(t))),
    ];
    let networks = any::<bool>()
        .prop_flat_map(|v6| (prop::option::weighted(0.4, network(v6)), prop::option::weighted(0.3, network(v6))));
    (
        networks,
        prop::option::weighted(0.3, prop_oneof![3 => select(PROTOS.to_vec()), 1 => any::<u8>()]),
        prop::option::weighted(0.2, range()),
        prop::option::weighted(0.3, range()),
        prop::option::weighted(0.15, select(vec![0u32, 1, 0x42])),
        prop::option::weighted(0.15, select(vec![0u8, 10, 46, 63])),
        0..DEFAULT,
        prop::bool::weighted(0.05),
        prop::option::weighted(0.2, lengths),
        l4,
        prop::option::weighted(0.1, (1u8..4).prop_map(|b| [2, 0, 0, 0, 0, b])),
    )
        .prop_map(
            |((src, dst), proto, sport, dport, mark, dscp, class, elsewhere, len, (tcp_flags, icmp_type), src_mac)| {
                RuleSpec {
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
                    // A rule of another interface must never match on this one.
                    iface_slot: u16::from(elsewhere),
                    ..RuleSpec::new(0, class)
                }
            },
        )
}

fn rule_set() -> impl Strategy<Value = Vec<RuleSpec>> {
    prop::collection::vec(rule(), 0..12).prop_map(|mut rules| {
        for (i, r) in rules.iter_mut().enumerate() {
            r.index = u32::try_from(i).unwrap();
            r.line = i + 1;
        }
        rules
    })
}

fn l4() -> impl Strategy<Value = L4> {
    prop_oneof![
        3 => (port(), port()).prop_map(|(sport, dport)| L4::Tcp { sport, dport }),
        3 => (port(), port()).prop_map(|(sport, dport)| L4::Udp { sport, dport }),
        1 => Just(L4::Icmp),
        // ICMPv6 (no header of its own: its first payload byte is the type).
        1 => Just(L4::Raw(58)),
        1 => prop_oneof![select(PROTOS.to_vec()), any::<u8>()].prop_map(L4::Raw),
    ]
}

fn frame() -> impl Strategy<Value = Frame> {
    (
        prop::option::weighted(0.2, any::<u16>()),
        prop_oneof![select(vec![0u8, 46 << 2, (10 << 2) | 1]), any::<u8>()],
        // No payload now and then: pure ACKs.
        prop_oneof![1 => Just(0usize), 3 => 0usize..40],
    )
        .prop_map(|(vlan, tos, payload)| Frame { vlan, tos, payload })
}

fn ext() -> impl Strategy<Value = Ext> {
    prop_oneof![
        4 => (select(vec![0u8, 43, 60]), prop_oneof![3 => Just(0u8), 1 => 0u8..4])
            .prop_map(|(kind, units)| Ext::Options { kind, units }),
        1 => (prop_oneof![Just(0u16), 1u16..0x1fff], any::<bool>())
            .prop_map(|(offset, more)| Ext::Fragment { offset, more }),
        1 => (1u8..5).prop_map(|words| Ext::Ah { words }),
    ]
}

fn base() -> impl Strategy<Value = Base> {
    let fragment = prop_oneof![4 => Just(0x4000u16), 1 => Just(0x2000), 1 => any::<u16>()];
    prop_oneof![
        4 => (frame(), v4_address(), v4_address(), l4(), prop_oneof![3 => Just(0u8), 1 => 1u8..11], fragment)
            .prop_map(|(frame, src, dst, l4, options, fragment)| Base::V4 { frame, src, dst, l4, options, fragment }),
        4 => (frame(), v6_address(), v6_address(), prop::collection::vec(ext(), 0..9), l4())
            .prop_map(|(frame, src, dst, chain, l4)| Base::V6 { frame, src, dst, chain, l4 }),
        1 => (
            prop::option::weighted(0.3, any::<u16>()),
            prop_oneof![select(vec![0x0806u16, 0x8100, 0x88a8, 0x8847, 0x0800, 0x86dd]), any::<u16>()],
            prop::collection::vec(any::<u8>(), 0..80),
        )
            .prop_map(|(vlan, ethertype, body)| Base::Other { vlan, ethertype, body }),
    ]
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        3 => any::<Index>().prop_map(Damage::Cut),
        3 => (any::<Index>(), 1u8..=255).prop_map(|(at, x)| Damage::Flip(at, x)),
        2 => (any::<Index>(), select(vec![0x00u8, 0x08, 0x81, 0x86, 0xdd, 0x45, 0x4f, 0x60, 0x06, 0x11, 0x2c, 0x3c, 0xff]))
            .prop_map(|(at, v)| Damage::Set(at, v)),
        1 => prop::collection::vec(any::<u8>(), 1..40).prop_map(Damage::Append),
    ]
}

fn shot() -> impl Strategy<Value = Shot> {
    let pppoe = prop_oneof![
        3 => Just((0u8, 0x0021u16)),
        3 => Just((0, 0x0057)),
        1 => (select(vec![0u8, 0x09, 0xa7]), select(vec![0x0021u16, 0x0057, 0xc021, 0x8021, 0x0281])),
    ];
    (
        prop::bool::weighted(0.2),
        prop_oneof![3 => Just(0u32), 1 => select(vec![1u32, 0x42]), 1 => any::<u32>()],
        base(),
        1u8..4,
        prop::option::weighted(0.2, pppoe),
        prop_oneof![
            2 => select(TCP_FLAG_BYTES.to_vec()),
            1 => select(vec![0u8, 3, 8, 11, 128, 129, 135]),
            1 => any::<u8>()
        ],
        prop_oneof![2 => Just(Vec::new()), 3 => prop::collection::vec(damage(), 1..4)],
    )
        .prop_map(|(l3, mark, base, mac, pppoe, l4_byte, damage)| Shot {
            l3,
            mark,
            base,
            mac,
            pppoe,
            l4_byte,
            damage,
        })
}

impl Ext {
    fn bytes(self, next: u8) -> Vec<u8> {
        let mut h = match self {
            Ext::Options { units, .. } => {
                let mut h = vec![0u8; (usize::from(units) + 1) * 8];
                h[1] = units;
                h
            }
            Ext::Fragment { offset, more } => {
                let mut h = vec![0u8; 8];
                h[2..4].copy_from_slice(&((offset << 3) | u16::from(more)).to_be_bytes());
                h[4..8].copy_from_slice(&[0, 0, 0x12, 0x34]);
                h
            }
            Ext::Ah { words } => {
                let mut h = vec![0u8; (usize::from(words) + 2) * 4];
                h[1] = words;
                h
            }
        };
        h[0] = next;
        h
    }

    fn kind(self) -> u8 {
        match self {
            Ext::Options { kind, .. } => kind,
            Ext::Fragment { .. } => 44,
            Ext::Ah { .. } => 51,
        }
    }
}

/// The link header's length in front of `frame`'s IP header.
fn link_len(frame: &Frame) -> usize {
    if frame.vlan.is_some() {
        18
    } else {
        14
    }
}

impl Base {
    /// The packet, with its link header unless `l3`, and where its link header ends. Its
    /// TCP flags byte, or its ICMP or `ICMPv6` type, is `l4_byte`.
    fn bytes(&self, l3: bool, l4_byte: u8) -> (Vec<u8>, usize) {
        let (mut packet, link, transport) = match self {
            Base::V4 { frame, src, dst, l4, options, fragment } => {
                let mut p = ipv4(frame, *src, *dst, *l4);
                let ip = link_len(frame);
                let extra = usize::from(*options) * 4;
                let total = u16::from_be_bytes([p[ip + 2], p[ip + 3]]) + u16::from(*options) * 4;
                // NOPs, then an end of options list.
                let mut opts = vec![1u8; extra];
                if let Some(last) = opts.last_mut() {
                    *last = 0;
                }
                p.splice(ip + 20..ip + 20, opts);
                p[ip] = 0x40 | (5 + options);
                p[ip + 2..ip + 4].copy_from_slice(&total.to_be_bytes());
                p[ip + 6..ip + 8].copy_from_slice(&fragment.to_be_bytes());
                p[ip + 10..ip + 12].copy_from_slice(&[0, 0]);
                let sum = ipv4_checksum(&p[ip..ip + 20 + extra]);
                p[ip + 10..ip + 12].copy_from_slice(&sum.to_be_bytes());
                (p, ip, Some((ip + 20 + extra, *l4)))
            }
            Base::V6 { frame, src, dst, chain, l4 } => {
                let mut p = ipv6(frame, *src, *dst, &[], *l4);
                let ip = link_len(frame);
                let proto = p[ip + 6];
                let mut bytes = Vec::new();
                for (i, e) in chain.iter().enumerate() {
                    bytes.extend(e.bytes(chain.get(i + 1).map_or(proto, |n| n.kind())));
                }
                let payload = u16::from_be_bytes([p[ip + 4], p[ip + 5]]) + u16::try_from(bytes.len()).unwrap();
                p[ip + 4..ip + 6].copy_from_slice(&payload.to_be_bytes());
                p[ip + 6] = chain.first().map_or(proto, |e| e.kind());
                let transport = ip + 40 + bytes.len();
                p.splice(ip + 40..ip + 40, bytes);
                (p, ip, Some((transport, *l4)))
            }
            Base::Other { vlan, ethertype, body } => {
                let mut p = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
                if let Some(tci) = vlan {
                    p.extend_from_slice(&[0x81, 0x00]);
                    p.extend_from_slice(&tci.to_be_bytes());
                }
                p.extend_from_slice(&ethertype.to_be_bytes());
                let link = p.len();
                p.extend_from_slice(body);
                (p, link, None)
            }
        };
        let at = match transport {
            Some((at, L4::Tcp { .. })) => Some(at + 13),
            Some((at, L4::Icmp | L4::Raw(58))) => Some(at),
            _ => None,
        };
        if let Some(byte) = at.and_then(|at| packet.get_mut(at)) {
            *byte = l4_byte;
        }
        if l3 {
            (packet[link..].to_vec(), 0)
        } else {
            (packet, link)
        }
    }
}

impl Shot {
    fn packet(&self) -> Vec<u8> {
        let (mut p, link) = self.base.bytes(self.l3, self.l4_byte);
        if !self.l3 {
            p[11] = self.mac;
            if let Some((code, ppp)) = self.pppoe {
                // The session header (version/type, code, session id, length) and PPP's
                // protocol, between the link header and what it carried.
                let len = u16::try_from(p.len() - link + 2).unwrap_or(u16::MAX);
                let [l0, l1] = len.to_be_bytes();
                let [p0, p1] = ppp.to_be_bytes();
                p[link - 2..link].copy_from_slice(&[0x88, 0x64]);
                p.splice(link..link, [0x11, code, 0x12, 0x34, l0, l1, p0, p1]);
            }
        }
        for d in &self.damage {
            match d {
                Damage::Cut(at) if p.len() > 14 => p.truncate(14 + at.index(p.len() - 14 + 1)),
                Damage::Flip(at, x) if !p.is_empty() => {
                    let at = at.index(p.len().min(100));
                    p[at] ^= x;
                }
                Damage::Set(at, v) if !p.is_empty() => {
                    let at = at.index(p.len().min(100));
                    p[at] = *v;
                }
                // Too short to cut, or empty: left as it is.
                Damage::Cut(_) | Damage::Flip(..) | Damage::Set(..) => {}
                Damage::Append(more) => p.extend_from_slice(more),
            }
        }
        p
    }
}

/// The `__sk_buff` bytes `BPF_PROG_TEST_RUN` starts from: all zero but the mark (offset 8, see
/// `include/uapi/linux/bpf.h`).
fn skb_with_mark(mark: u32) -> [u8; 192] {
    let mut ctx = [0u8; 192];
    ctx[8..12].copy_from_slice(&mark.to_ne_bytes());
    ctx
}

/// Runs the program once; `Err` when `BPF_PROG_TEST_RUN` refuses the packet.
fn try_run(dp: &Datapath, packet: &[u8], mark: u32) -> Result<u32, String> {
    let ctx = skb_with_mark(mark);
    let mut out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut out),
        ctx_in: Some(&ctx),
        repeat: 1,
        ..TestRunOptions::default()
    };
    dp.program().test_run(opts).map(|r| r.return_value).map_err(|e| format!("{e:?}"))
}

/// Whether the kernel refuses to run a program on `packet` (before the program sees it):
/// shorter than an Ethernet header, or an IP ethertype with less than the IP header's fixed
/// part behind it (`bpf_prog_test_run_skb` checks the header it fills the socket's addresses
/// from).
fn kernel_refuses(packet: &[u8]) -> bool {
    let Some(ethertype) = packet.get(12..14).map(|b| u16::from_be_bytes([b[0], b[1]])) else { return true };
    let ip_len = packet.len() - 14;
    (ethertype == 0x0800 && ip_len < 20) || (ethertype == 0x86dd && ip_len < 40)
}

/// Every class's counted packets (sent or dropped).
fn counts(dp: &Datapath) -> Vec<u64> {
    (0..=DEFAULT)
        .map(|c| {
            let s = dp.class_stats(c).expect("reading class counters");
            s.packets + s.drop_horizon_packets + s.drop_aqm_packets + s.drop_share_packets
        })
        .collect()
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// The datapath under test, and what it last counted per class.
struct Harness {
    dp: Datapath,
    counts: Vec<u64>,
    /// The interface's current mode (`IFACE_L3` or not), once set.
    l3: Option<bool>,
}

/// What happened to one packet.
enum Outcome {
    /// `BPF_PROG_TEST_RUN` refused it (as expected: see [`kernel_refuses`]).
    Refused,
    /// It ran and was counted in the model's class; the model's parse.
    Classified(Option<PacketFields>),
}

impl Harness {
    fn new() -> Self {
        let mut dp = loopback_datapath(&[], DEFAULT);
        for class in [1, 4, DEFAULT] {
            dp.set_class(class, fast_class()).expect("pacing a class");
        }
        let counts = counts(&dp);
        Self { dp, counts, l3: None }
    }

    fn load_rules(&mut self, rules: &[RuleSpec]) -> Result<(), TestCaseError> {
        let compiled = shaper::rules::compile(rules).map_err(|e| TestCaseError::reject(e.to_string()))?;
        self.dp.load_rules(&compiled).expect("loading rules");
        Ok(())
    }

    /// Runs `packet` and checks the program's verdict and the class that counted it against
    /// the model; the error says all there is to know of the packet.
    fn check(&mut self, rules: &[RuleSpec], packet: &[u8], l3: bool, mark: u32) -> Result<Outcome, TestCaseError> {
        if self.l3 != Some(l3) {
            let flags = if l3 { IFACE_ENABLED | IFACE_L3 } else { IFACE_ENABLED };
            let iface = IfaceConfig { slot: 0, default_class: DEFAULT, flags, ..IfaceConfig::default() };
            self.dp.set_iface(LO, iface).expect("setting the interface");
            self.l3 = Some(l3);
        }
        let fields = reference::parse(packet, l3, mark);
        let want = fields.and_then(|f| first_match(rules, &f)).map_or(DEFAULT, |r| r.class);
        let context = || {
            format!(
                "packet ({} bytes, {} interface, mark {mark:#x}): {}\nmodel's parse: {fields:?}\n\
                 expected class {want}\nrules: {rules:?}",
                packet.len(),
                if l3 { "link-layer-less" } else { "Ethernet" },
                hex(packet),
            )
        };
        let action = match try_run(&self.dp, packet, mark) {
            Ok(action) => action,
            Err(e) => {
                prop_assert!(
                    kernel_refuses(packet),
                    "BPF_PROG_TEST_RUN refused a packet it should take ({e})\n{}",
                    context()
                );
                return Ok(Outcome::Refused);
            }
        };
        prop_assert!(!kernel_refuses(packet), "BPF_PROG_TEST_RUN took a packet expected to be refused\n{}", context());
        prop_assert_eq!(action, TC_ACT_OK, "the program's verdict\n{}", context());
        let after = counts(&self.dp);
        let moved: Vec<u32> = (0..=DEFAULT).filter(|&c| after[c as usize] != self.counts[c as usize]).collect();
        self.counts = after;
        prop_assert_eq!(moved, vec![want], "the class that counted the packet\n{}", context());
        Ok(Outcome::Classified(fields))
    }
}

fn check_rule_set(h: &mut Harness, rules: &[RuleSpec], shots: &[Shot], tally: &mut Tally) -> Result<(), TestCaseError> {
    h.load_rules(rules)?;
    for shot in shots {
        let fields = match h.check(rules, &shot.packet(), shot.l3, shot.mark)? {
            Outcome::Refused => {
                tally.refused += 1;
                continue;
            }
            Outcome::Classified(fields) => fields,
        };
        tally.run += 1;
        match fields {
            None => tally.malformed += 1,
            Some(f) if f.src.is_none() => tally.not_ip += 1,
            Some(f) if f.ports.is_some() => tally.with_ports += 1,
            Some(_) => {}
        }
        if let Some(f) = fields {
            tally.pppoe_ip += u64::from(shot.pppoe.is_some() && f.src.is_some());
            tally.tcp_no_payload += u64::from(f.tcp_no_payload);
            tally.icmp += u64::from(f.icmp_type.is_some());
        }
        let rule = fields.and_then(|f| first_match(rules, &f));
        tally.matched += u64::from(rule.is_some());
        tally.matched_new +=
            u64::from(rule.is_some_and(|r| {
                r.len.is_some() || r.tcp_flags.is_some() || r.icmp_type.is_some() || r.src_mac.is_some()
            }));
    }
    Ok(())
}

/// One packet against one rule set, on a datapath of its own.
fn check_one(rules: &[RuleSpec], packet: &[u8]) {
    let mut h = Harness::new();
    h.load_rules(rules).unwrap();
    if let Err(e) = h.check(rules, packet, false, 0) {
        panic!("{e}");
    }
}

/// Six extension headers are within the parser's bound (`MAX_V6_EXT_HEADERS`), so the
/// transport header behind them is read (seven are not: see datapath.rs).
#[test]
fn ports_behind_six_extension_headers_are_read() {
    let rules = [RuleSpec { dport: Some((443, 443)), ..RuleSpec::new(0, 1) }];
    let chain = [(60, 8); 6];
    let src = "2001:db8::1".parse().unwrap();
    check_one(&rules, &ipv6(&Frame::default(), src, src, &chain, L4::Tcp { sport: 40000, dport: 443 }));
}

/// What follows a non-first fragment's fragment header is the middle of the original packet,
/// not headers: its bytes must not choose the packet's protocol.
#[test]
fn a_non_first_fragment_is_not_read_past_its_fragment_header() {
    let rules = [RuleSpec { proto: Some(6), ..RuleSpec::new(0, 2) }];
    let src = "2001:db8::1".parse().unwrap();
    // A fragment header (offset 100 × 8 bytes) whose next header is destination options, and
    // payload bytes that read as a destination options header followed by TCP.
    let mut packet = ipv6(&Frame::default(), src, src, &[(44, 8)], L4::Raw(60));
    let frag = 14 + 40;
    packet[frag + 2..frag + 4].copy_from_slice(&(100u16 << 3).to_be_bytes());
    packet[frag + 8] = 6;
    packet[frag + 9] = 0;
    check_one(&rules, &packet);
}
