//! DSCP marking by class (`set_dscp`, `set_dscp_over`), driven by `BPF_PROG_TEST_RUN` on the
//! host kernel: the packet the program leaves has the class's DSCP, its ECN bits as they
//! were and a correct IPv4 header checksum; out of profile (beyond the class's guaranteed
//! rate, past a burst of `PROFILE_BURST_FRAMES`) packets get the lower class's DSCP. Needs
//! root.

use std::net::{Ipv4Addr, Ipv6Addr};

use shaper_common::{ClassConfig, DSCP_OVER, DSCP_SET, FULL_FRAME, PROFILE_BURST_FRAMES};
use shaper_tests::{ipv4, ipv4_checksum, ipv6, loopback_datapath, run, Frame, SkbCtx, L4, TC_ACT_OK};

const DEFAULT: u32 = 9;
const EF: u8 = 46;
const AF11: u8 = 10;
const CS1: u8 = 8;
/// Ethernet header length: the IP header starts here.
const L3: usize = 14;

/// The default class, fast enough that nothing queues, marking as `flags` says.
fn marking(flags: u8, set: u8, over: u8, guarantee_bytes: u64) -> shaper::bpf::Datapath {
    let mut dp = loopback_datapath(&[], DEFAULT);
    let config = ClassConfig {
        rate_bytes: 1_000_000_000,
        horizon_ns: 1_000_000_000,
        guarantee_bytes,
        dscp_flags: flags,
        set_dscp: set,
        over_dscp: over,
        ..ClassConfig::default()
    };
    dp.set_class(DEFAULT, config).unwrap();
    dp
}

fn v4(tos: u8, payload: usize) -> Vec<u8> {
    ipv4(
        &Frame { tos, payload, ..Frame::default() },
        Ipv4Addr::new(192, 168, 1, 110),
        Ipv4Addr::new(198, 51, 100, 7),
        L4::Udp { sport: 4000, dport: 5000 },
    )
}

fn v6(tos: u8, payload: usize) -> Vec<u8> {
    let (src, dst): (Ipv6Addr, Ipv6Addr) = ("fd00:1::110".parse().unwrap(), "2001:db8::7".parse().unwrap());
    ipv6(&Frame { tos, payload, ..Frame::default() }, src, dst, &[], L4::Tcp { sport: 4000, dport: 443 })
}

/// The DSCP and ECN of an IPv4 packet as the program left it; its header checksum must hold.
fn v4_marks(dp: &shaper::bpf::Datapath, packet: &[u8]) -> (u8, u8) {
    let out = run(dp, packet, SkbCtx::default(), 1);
    assert_eq!(out.action, TC_ACT_OK);
    assert_eq!(ipv4_checksum(&out.data[L3..L3 + 20]), 0, "the IPv4 header checksum holds");
    assert_eq!(out.data[..=L3], packet[..=L3], "nothing before the TOS byte changes");
    assert_eq!(out.data[L3 + 2..L3 + 10], packet[L3 + 2..L3 + 10], "nothing else in the header changes");
    assert_eq!(out.data[L3 + 12..], packet[L3 + 12..], "addresses and payload unchanged");
    (out.data[L3 + 1] >> 2, out.data[L3 + 1] & 3)
}

/// The DSCP and ECN of an IPv6 packet as the program left it (traffic class: the low nibble
/// of the first byte and the high nibble of the second).
fn v6_marks(dp: &shaper::bpf::Datapath, packet: &[u8]) -> (u8, u8) {
    let out = run(dp, packet, SkbCtx::default(), 1);
    assert_eq!(out.action, TC_ACT_OK);
    assert_eq!(out.data[L3] >> 4, 6, "still IPv6");
    assert_eq!(out.data[L3 + 1] & 0x0f, packet[L3 + 1] & 0x0f, "the flow label is kept");
    assert_eq!(out.data[L3 + 2..], packet[L3 + 2..], "the rest is unchanged");
    let tc = ((out.data[L3] & 0x0f) << 4) | (out.data[L3 + 1] >> 4);
    (tc >> 2, tc & 3)
}

#[test]
fn a_class_sets_or_washes_the_dscp_and_keeps_the_ecn_bits() {
    let dp = marking(DSCP_SET, AF11, 0, 0);
    for ecn in 0..4 {
        assert_eq!(v4_marks(&dp, &v4((EF << 2) | ecn, 64)), (AF11, ecn), "IPv4, ECN {ecn}");
        assert_eq!(v6_marks(&dp, &v6((EF << 2) | ecn, 64)), (AF11, ecn), "IPv6, ECN {ecn}");
    }
    // Already right: left as it is.
    assert_eq!(v4_marks(&dp, &v4((AF11 << 2) | 1, 64)), (AF11, 1));
    let wash = marking(DSCP_SET, 0, 0, 0);
    assert_eq!(v4_marks(&wash, &v4((EF << 2) | 2, 64)), (0, 2));
    assert_eq!(v6_marks(&wash, &v6((EF << 2) | 1, 64)), (0, 1));
    // A class that does not mark leaves the DSCP alone.
    let none = marking(0, AF11, CS1, 0);
    assert_eq!(v4_marks(&none, &v4(EF << 2, 64)), (EF, 0));
}

/// The DSCPs of 20 copies of `packet` run back to back through a fresh class of `flags`
/// (guarantee 1,000,000 bytes/s, in-profile `AF11`, out `CS1`), read by `marks`. The profile
/// refills a 1000-byte packet's worth each millisecond: a run the host paused for longer (a
/// busy machine deschedules the test between two packets) does not say what a burst gets,
/// and is run again on a new class, up to five times.
fn burst(flags: u8, packet: &[u8], marks: fn(&shaper::bpf::Datapath, &[u8]) -> (u8, u8)) -> Vec<u8> {
    const REFILL: std::time::Duration = std::time::Duration::from_millis(1);
    let mut took = Vec::new();
    for _ in 0..5 {
        let dp = marking(flags, AF11, CS1, 1_000_000);
        let start = std::time::Instant::now();
        let run: Vec<u8> = (0..20).map(|_| marks(&dp, packet).0).collect();
        if start.elapsed() < REFILL {
            return run;
        }
        took.push(start.elapsed());
    }
    panic!("no burst of 20 packets within {REFILL:?} in five tries: {took:?}");
}

#[test]
fn packets_beyond_the_guaranteed_rate_are_re_marked() {
    // Guarantee 1,000,000 bytes/s: a 1000-byte packet takes 1 ms of the profile, which
    // tolerates a burst of PROFILE_BURST_FRAMES full frames (6.056 ms). A burst of packets
    // sent back to back: the first 7 are in profile (AF11), the rest out (CS1).
    let packet = v4(EF << 2, 1000 - 14 - 20 - 8);
    let marks = burst(DSCP_SET | DSCP_OVER, &packet, v4_marks);
    let in_profile = 1 + (PROFILE_BURST_FRAMES * FULL_FRAME * 1_000 / 1_000_000) as usize;
    assert_eq!(in_profile, 7);
    // The run takes some microseconds per packet: at most one more fits in the profile.
    let kept = marks.iter().take_while(|&&d| d == AF11).count();
    assert!((in_profile..=in_profile + 1).contains(&kept), "{kept} packets in profile: {marks:?}");
    assert!(marks[kept..].iter().all(|&d| d == CS1), "the rest re-marked: {marks:?}");
    // Without DSCP_SET, in-profile packets keep their own DSCP.
    let marks = burst(DSCP_OVER, &packet, v4_marks);
    assert_eq!((marks[0], marks[19]), (EF, CS1), "{marks:?}");
    // IPv6 too.
    let marks = burst(DSCP_OVER, &v6(EF << 2, 1000), v6_marks);
    assert_eq!((marks[0], marks[19]), (EF, CS1), "{marks:?}");
}
