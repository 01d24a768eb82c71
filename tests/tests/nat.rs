//! Classification behind NAT, driven by `BPF_PROG_TEST_RUN` on the host kernel: the program
//! at ingress of a LAN-side interface records each flow's origin under the skb's flow hash,
//! and the shaper at egress of an interface with `IFACE_NAT` classifies a translated packet by
//! the origin recorded for its hash, if that record agrees with the packet on what source
//! NAT leaves alone. (`tests/tests/vm/nat.rs` checks the same through a real nftables
//! masquerade.) Needs root.

use std::net::{Ipv4Addr, Ipv6Addr};

use shaper::{bpf::Hook, rules::RuleSpec};
use shaper_common::{IfaceConfig, Origin, IFACE_ENABLED, IFACE_NAT};
use shaper_tests::{ipv4, ipv6, loopback_datapath, run, run_at, Frame, SkbCtx, L4, LO, TC_ACT_OK};

const DEFAULT: u32 = 9;
const ALEX: u32 = 1;
const DNS: u32 = 2;
const BY_MAC: u32 = 3;
/// A LAN host's Ethernet address (a `src_mac` rule's).
const HOST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0x01, 0x30];

/// The hosts' addresses on the LAN, the gateway's on the WAN, and a server.
const HOST: [u8; 4] = [192, 168, 1, 110];
const OTHER_HOST: [u8; 4] = [192, 168, 1, 120];
const GATEWAY: [u8; 4] = [203, 0, 113, 1];
const SERVER: [u8; 4] = [198, 51, 100, 7];

fn v4(src: [u8; 4], dst: [u8; 4], l4: L4) -> Vec<u8> {
    ipv4(&Frame::default(), Ipv4Addr::from(src), Ipv4Addr::from(dst), l4)
}

fn addr(a: [u8; 4]) -> [u8; 16] {
    let mut b = [0; 16];
    b[..4].copy_from_slice(&a);
    b
}

/// An IPv4 flow's origin as the LAN side records it, without an Ethernet address.
fn origin(src: [u8; 4], dst: [u8; 4], sport: u16, dport: u16, proto: u8) -> Origin {
    Origin { src: addr(src), dst: addr(dst), sport, dport, family: 4, proto, src_mac: [0; 6], _pad: [0; 4] }
}

/// Loopback shaped with the rules `src 192.168.1.110 → ALEX`, `src 192.168.1.0/24, UDP
/// source port 5353 → DNS` and `src_mac HOST_MAC → BY_MAC`, as the upload interface of a NAT
/// (`nat`) or not.
fn datapath(nat: bool) -> shaper::bpf::Datapath {
    let rules = vec![
        RuleSpec { src: Some("192.168.1.110/32".parse().unwrap()), ..RuleSpec::new(0, ALEX) },
        RuleSpec {
            src: Some("192.168.1.0/24".parse().unwrap()),
            proto: Some(17),
            sport: Some((5353, 5353)),
            ..RuleSpec::new(1, DNS)
        },
        RuleSpec { src_mac: Some(HOST_MAC), ..RuleSpec::new(2, BY_MAC) },
    ];
    let mut dp = loopback_datapath(&rules, DEFAULT);
    let flags = IFACE_ENABLED | if nat { IFACE_NAT } else { 0 };
    dp.set_iface(LO, IfaceConfig { slot: 0, default_class: DEFAULT, flags, ..IfaceConfig::default() }).unwrap();
    dp
}

/// Runs one packet through the shaper and returns the class whose packet counter moved.
fn class_of(dp: &shaper::bpf::Datapath, packet: &[u8]) -> u32 {
    let before: Vec<u64> = (0..=DEFAULT).map(|c| dp.class_stats(c).unwrap().packets).collect();
    assert_eq!(run(dp, packet, SkbCtx::default(), 1).action, TC_ACT_OK);
    let moved: Vec<u32> = (0..=DEFAULT).filter(|&c| dp.class_stats(c).unwrap().packets != before[c as usize]).collect();
    assert_eq!(moved.len(), 1, "exactly one class must count the packet, got {moved:?}");
    moved[0]
}

/// The flow hash the kernel gives `packet`: the ingress program records the packet's own
/// origin under it (the loopback device made LAN side for the run).
fn hash_of(dp: &mut shaper::bpf::Datapath, packet: &[u8]) -> u32 {
    dp.set_lan_iface(LO, 0).unwrap();
    let before: Vec<u32> = dp.origins().into_iter().map(|(h, _)| h).collect();
    let r = run_at(dp, Hook::LanIngress, packet, SkbCtx::default(), 1);
    assert_eq!(r.action, TC_ACT_OK, "the ingress program never drops");
    assert_eq!(r.data, packet, "the ingress program never changes a packet");
    dp.remove_lan_iface(LO).unwrap();
    let new: Vec<u32> = dp.origins().into_iter().map(|(h, _)| h).filter(|h| !before.contains(h)).collect();
    assert_eq!(new.len(), 1, "one origin recorded for the packet");
    new[0]
}

#[test]
fn the_ingress_program_records_each_flows_origin_on_lan_interfaces_only() {
    let mut dp = datapath(true);
    let packet = v4(HOST, SERVER, L4::Tcp { sport: 40000, dport: 443 });
    // Not a LAN-side interface: nothing is recorded.
    assert_eq!(run_at(&dp, Hook::LanIngress, &packet, SkbCtx::default(), 1).action, TC_ACT_OK);
    assert!(dp.origins().is_empty(), "nothing recorded off the LAN side: {:?}", dp.origins());
    let hash = hash_of(&mut dp, &packet);
    let (_, recorded) = dp.origins().into_iter().find(|&(h, _)| h == hash).unwrap();
    assert_eq!(recorded, Origin { src_mac: packet[6..12].try_into().unwrap(), ..origin(HOST, SERVER, 40000, 443, 6) });
    // IPv6 too.
    let host6: Ipv6Addr = "fd00:1::110".parse().unwrap();
    let server6: Ipv6Addr = "2001:db8::7".parse().unwrap();
    let packet6 = ipv6(&Frame::default(), host6, server6, &[], L4::Udp { sport: 5353, dport: 53 });
    let hash6 = hash_of(&mut dp, &packet6);
    let (_, origin6) = dp.origins().into_iter().find(|&(h, _)| h == hash6).unwrap();
    assert_eq!((origin6.src, origin6.dst), (host6.octets(), server6.octets()));
    assert_eq!((origin6.sport, origin6.dport, origin6.family, origin6.proto), (5353, 53, 6, 17));
}

#[test]
fn a_translated_packet_is_classified_by_its_recorded_origin() {
    let mut dp = datapath(true);
    // The packet as it leaves the WAN interface: the gateway's address and a new port.
    let translated = v4(GATEWAY, SERVER, L4::Tcp { sport: 61000, dport: 443 });
    assert_eq!(class_of(&dp, &translated), DEFAULT, "no origin recorded: classified as it is");
    let hash = hash_of(&mut dp, &translated);
    // What the LAN side recorded for the flow under the same hash: the host's own address.
    dp.set_origin(hash, origin(HOST, SERVER, 40000, 443, 6)).unwrap();
    assert_eq!(class_of(&dp, &translated), ALEX);
    // Another host of the /24: the first rule does not match, and the second needs UDP.
    dp.set_origin(hash, origin(OTHER_HOST, SERVER, 40000, 443, 6)).unwrap();
    assert_eq!(class_of(&dp, &translated), DEFAULT);
    // A record that disagrees on what source NAT leaves alone belongs to another flow with
    // the same hash: it is not used.
    for other in [
        origin(HOST, [198, 51, 100, 8], 40000, 443, 6),
        origin(HOST, SERVER, 40000, 444, 6),
        origin(HOST, SERVER, 40000, 443, 17),
        Origin { family: 6, ..origin(HOST, SERVER, 40000, 443, 6) },
    ] {
        dp.set_origin(hash, other).unwrap();
        assert_eq!(class_of(&dp, &translated), DEFAULT, "record {other:?} disagrees with the packet");
    }
    // The source port comes from the record too: a port rule matches the host's own port.
    let translated_udp = v4(GATEWAY, SERVER, L4::Udp { sport: 1024, dport: 53 });
    let udp_hash = hash_of(&mut dp, &translated_udp);
    dp.set_origin(udp_hash, origin(OTHER_HOST, SERVER, 5353, 53, 17)).unwrap();
    assert_eq!(class_of(&dp, &translated_udp), DNS);
    // And the host's Ethernet address: the frame leaving the WAN carries the gateway's.
    dp.set_origin(hash, Origin { src_mac: HOST_MAC, ..origin(OTHER_HOST, SERVER, 40000, 443, 6) }).unwrap();
    assert_eq!(class_of(&dp, &translated), BY_MAC);
}

#[test]
fn without_a_lan_side_the_records_are_not_used() {
    let mut dp = datapath(false);
    let translated = v4(GATEWAY, SERVER, L4::Tcp { sport: 61000, dport: 443 });
    let hash = hash_of(&mut dp, &translated);
    dp.set_origin(hash, origin(HOST, SERVER, 40000, 443, 6)).unwrap();
    assert_eq!(class_of(&dp, &translated), DEFAULT);
}
