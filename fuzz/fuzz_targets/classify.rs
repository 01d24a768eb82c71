//! Packets and rules from arbitrary bytes: the reference parser (the model of the tc program's
//! parser, tests/src/reference.rs) never panics, and on what it reads the compiled tables'
//! lookup (`Compiled::lookup`, the datapath's algorithm) finds the rule a linear scan in file
//! order does (`first_match`).
#![no_main]

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::IpNet;
use libfuzzer_sys::{
    arbitrary::{Result, Unstructured},
    fuzz_target,
};
use shaper::rules::{compile, first_match, PacketFields, RuleSpec, TcpFlags};
use shaper_tests::reference;

fn network(u: &mut Unstructured<'_>, v6: bool) -> Result<IpNet> {
    let net = if v6 {
        let bytes: [u8; 16] = u.arbitrary()?;
        IpNet::new(IpAddr::V6(Ipv6Addr::from(bytes)), u.int_in_range(0..=128)?)
    } else {
        let bytes: [u8; 4] = u.arbitrary()?;
        IpNet::new(IpAddr::V4(Ipv4Addr::from(bytes)), u.int_in_range(0..=32)?)
    };
    Ok(net.expect("prefix length in range").trunc())
}

fn range(u: &mut Unstructured<'_>) -> Result<(u16, u16)> {
    let (a, b): (u16, u16) = (u.arbitrary()?, u.arbitrary()?);
    Ok((a.min(b), a.max(b)))
}

fn tcp_flags(u: &mut Unstructured<'_>, no_payload: bool) -> Result<TcpFlags> {
    let (value, mask): (u8, u8) = (u.arbitrary()?, u.arbitrary()?);
    Ok(TcpFlags { value: value & mask, mask, no_payload })
}

fn mac(u: &mut Unstructured<'_>) -> Result<[u8; 6]> {
    let mut mac: [u8; 6] = u.arbitrary()?;
    // The all-zero address is refused (it is what packets without a link layer have).
    if mac == [0; 6] {
        mac[5] = 1;
    }
    Ok(mac)
}

fn rule(u: &mut Unstructured<'_>, index: u32) -> Result<RuleSpec> {
    // Two bytes say which fields the rule tests, so that most rules test few.
    let fields: u8 = u.arbitrary()?;
    let more: u8 = u.arbitrary()?;
    let v6 = u.arbitrary()?;
    let on = |bit: u8| fields & (1 << bit) != 0;
    let also = |bit: u8| more & (1 << bit) != 0;
    Ok(RuleSpec {
        len: if also(0) { Some(range(u)?) } else { None },
        tcp_flags: if also(1) { Some(tcp_flags(u, also(2))?) } else { None },
        icmp_type: if also(3) { Some(u.arbitrary()?) } else { None },
        src_mac: if also(4) { Some(mac(u)?) } else { None },
        src: if on(0) { Some(network(u, v6)?) } else { None },
        dst: if on(1) { Some(network(u, v6)?) } else { None },
        proto: if on(2) { Some(u.arbitrary()?) } else { None },
        sport: if on(3) { Some(range(u)?) } else { None },
        dport: if on(4) { Some(range(u)?) } else { None },
        mark: if on(5) { Some(u.int_in_range(0..=3)?) } else { None },
        dscp: if on(6) { Some(u.int_in_range(0..=63)?) } else { None },
        iface_slot: u16::from(on(7) && u.ratio(1, 8)?),
        ..RuleSpec::new(index, u.int_in_range(0..=7)?)
    })
}

/// Compiled lookup and linear scan agree on `packet`.
fn agree(rules: &[RuleSpec], compiled: &shaper::rules::Compiled, packet: &PacketFields) {
    let want = first_match(rules, packet).map(|r| (r.index, r.class));
    let got = compiled.lookup(packet).map(|t| (t.rule, t.class));
    assert_eq!(got, want, "packet {packet:?}, rules {rules:?}");
}

fuzz_target!(|data: &[u8]| {
    let mut u = Unstructured::new(data);
    let Ok(count) = u.int_in_range(0..=8u32) else { return };
    let Ok(rules) = (0..count).map(|i| rule(&mut u, i)).collect::<Result<Vec<_>>>() else { return };
    let (Ok(l3), Ok(mark)) = (u.arbitrary::<bool>(), u.int_in_range(0..=3u32)) else { return };
    let packet = u.take_rest();
    let fields = reference::parse(packet, l3, mark);
    // Mixed address families in one rule are refused; too many shapes or entries cannot occur
    // with eight rules.
    let Ok(compiled) = compile(&rules) else { return };
    let Some(fields) = fields else { return };
    agree(&rules, &compiled, &fields);
    // The packet again from each rule's networks, so that prefixes match, not only by chance.
    for r in &rules {
        let at = |net: Option<IpNet>, addr| net.map_or(addr, |n| Some(n.addr()));
        let moved = PacketFields {
            src: at(r.src, fields.src),
            dst: at(r.dst, fields.dst),
            src_mac: r.src_mac.or(fields.src_mac),
            ..fields
        };
        if moved.src.map(|a| a.is_ipv4()) == moved.dst.map(|a| a.is_ipv4()) {
            agree(&rules, &compiled, &moved);
        }
    }
});
