//! A userspace model of what the tc program's parser makes of a packet: the fields a packet is
//! classified on ([`PacketFields`]), or `None` when the packet is malformed and goes to its
//! interface's default class. `tests/tests/fuzz.rs` checks the program against it on random and
//! damaged packets, and the `classify` fuzz target runs it on arbitrary bytes.
//!
//! It follows the policy written down in the parser's documentation (shaper-ebpf/src/parse.rs)
//! and in the README, not the parser's code, so that a slip in either shows as a disagreement:
//!
//! - Link layer: an Ethernet header with at most one 802.1Q or 802.1ad tag; on an interface
//!   without a link layer (`IFACE_L3`) the packet starts with its IP header, whose version
//!   nibble says which. A packet too short for its link header, or whose version nibble is
//!   neither 4 nor 6 on such an interface, is malformed. The Ethernet source address is a
//!   field of every packet that has an Ethernet header.
//! - PPPoE: behind the Ethernet header (and its tag), a session frame (ethertype 0x8864)
//!   whose 8-byte PPPoE and PPP header is cut short is malformed; with version/type 0x11,
//!   code 0 and PPP protocol 0x0021 or 0x0057, its IPv4 or IPv6 packet follows and is read as
//!   any other; any other session frame is not IP.
//! - A frame of another ethertype (ARP, MPLS, a second VLAN tag...) is not IP: it has no
//!   addresses, protocol 0 and DSCP 0, so only rules on the fwmark can match it.
//! - IP header: a truncated fixed header, a version that is not the ethertype's, an IPv4 IHL
//!   below 5 words or a total length below the IHL make the packet malformed. Otherwise the
//!   packet is classified on its addresses, protocol and DSCP whatever follows.
//! - Ports: read from a TCP header (whole 20 bytes present, data offset at least 5 words) or a
//!   UDP header (8 bytes) behind a complete IP header: IPv4 options must all be present, the
//!   packet must be a first fragment (or not fragmented). Absent otherwise. The TCP flags are
//!   read with the ports; the segment has no payload when its IP length ends where its TCP
//!   header does. The ICMP type is read under the same conditions from an ICMP header
//!   (IPv4, protocol 1) or an `ICMPv6` header (IPv6, next header 58) whose first 4 bytes are
//!   present.
//! - Length: an IP packet's IPv4 total length, or IPv6 payload length plus 40 (for a payload
//!   length of 0, a jumbogram's, the packet's length from its IP header on), at most 65535.
//! - IPv6 extension headers: hop-by-hop, routing, destination options, fragment and AH are
//!   followed, at most [`V6_EXT_HEADERS_FOLLOWED`] of them. A header is followed when the
//!   fields the walk needs can be read: its next-header and length bytes (its first two), and
//!   for a fragment header its offset too (its first four). The protocol is that of the header
//!   the walk ends at: the upper layer when it gets there; otherwise the extension header it
//!   could not read, or the one beyond the bound, and the packet has no ports. A non-first
//!   fragment ends the walk at its fragment header: what follows it is the middle of the
//!   original packet, not headers, so the protocol is the fragment header's next header and
//!   the packet has no ports.
//! - The skb's mark is a field like the others; malformed packets are not classified at all
//!   (rules on the mark do not see them).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use shaper::rules::PacketFields;

/// IPv6 extension headers followed before the parser gives up (the parser's
/// `MAX_V6_EXT_HEADERS`: RFC 8200 section 4.1's recommended order holds one of each, with the
/// destination options header twice).
pub const V6_EXT_HEADERS_FOLLOWED: usize = 6;

const ETHERTYPE_IPV4: u16 = 0x0800;
const ETHERTYPE_IPV6: u16 = 0x86dd;
const ETHERTYPE_VLAN: u16 = 0x8100;
const ETHERTYPE_QINQ: u16 = 0x88a8;
const ETHERTYPE_PPPOE_SESSION: u16 = 0x8864;

const PROTO_ICMP: u8 = 1;
const PROTO_TCP: u8 = 6;
const PROTO_UDP: u8 = 17;
const PROTO_ICMPV6: u8 = 58;

/// The fields a packet is classified on, or `None` when it is malformed. `l3`: the interface has
/// no link-layer header (the packet starts with its IP header).
#[must_use]
pub fn parse(packet: &[u8], l3: bool, mark: u32) -> Option<PacketFields> {
    let bytes = Bytes(packet);
    let mut not_ip = PacketFields { mark, ..PacketFields::default() };
    let (ethertype, ip_at) = if l3 {
        match bytes.u8(0)? >> 4 {
            4 => (ETHERTYPE_IPV4, 0),
            6 => (ETHERTYPE_IPV6, 0),
            _ => return None,
        }
    } else {
        let (ethertype, at) = match bytes.u16(12)? {
            ETHERTYPE_VLAN | ETHERTYPE_QINQ => (bytes.u16(16)?, 18),
            other => (other, 14),
        };
        not_ip.src_mac = Some(bytes.slice(6, 6)?.try_into().expect("6 bytes"));
        if ethertype == ETHERTYPE_PPPOE_SESSION {
            let h = bytes.slice(at, 8)?;
            let inner = match (h[0], h[1], u16::from_be_bytes([h[6], h[7]])) {
                (0x11, 0, 0x0021) => ETHERTYPE_IPV4,
                (0x11, 0, 0x0057) => ETHERTYPE_IPV6,
                _ => 0,
            };
            (inner, at + 8)
        } else {
            (ethertype, at)
        }
    };
    let (ip, icmp) = match ethertype {
        ETHERTYPE_IPV4 => (ipv4(bytes, ip_at)?, PROTO_ICMP),
        ETHERTYPE_IPV6 => (ipv6(bytes, ip_at)?, PROTO_ICMPV6),
        _ => return Some(not_ip),
    };
    let ports = ip.transport.and_then(|at| ports(bytes, at, ip.proto));
    let tcp =
        ip.transport.filter(|_| ip.proto == PROTO_TCP).and_then(|at| bytes.slice(at, 20)).filter(|t| t[12] >> 4 >= 5);
    let tcp_end = tcp.map(|t| ip.transport.expect("read") + usize::from(t[12] >> 4) * 4);
    let icmp_type = ip.transport.filter(|_| ip.proto == icmp).and_then(|at| bytes.slice(at, 4)).map(|h| h[0]);
    Some(PacketFields {
        src: Some(ip.src),
        dst: Some(ip.dst),
        proto: ip.proto,
        dscp: ip.dscp,
        ports,
        len: Some(ip.len),
        tcp_flags: tcp.map(|t| t[13]),
        tcp_no_payload: tcp_end.is_some_and(|end| end - ip_at == usize::from(ip.len)),
        icmp_type,
        ..not_ip
    })
}

/// What an IP header (and, for IPv6, its extension headers) tells.
struct Ip {
    src: IpAddr,
    dst: IpAddr,
    proto: u8,
    dscp: u8,
    /// The IP length (see the module's documentation).
    len: u16,
    /// Where the transport header starts, when it is there to be read (complete IP header,
    /// first fragment).
    transport: Option<usize>,
}

fn ipv4(bytes: Bytes, at: usize) -> Option<Ip> {
    let header = bytes.slice(at, 20)?;
    let version = header[0] >> 4;
    let header_len = usize::from(header[0] & 0xf) * 4;
    let total_len = usize::from(u16::from_be_bytes([header[2], header[3]]));
    if version != 4 || header_len < 20 || total_len < header_len {
        return None;
    }
    let fragment_offset = u16::from_be_bytes([header[6], header[7]]) & 0x1fff;
    let options_present = bytes.slice(at, header_len).is_some();
    Some(Ip {
        src: IpAddr::V4(Ipv4Addr::new(header[12], header[13], header[14], header[15])),
        dst: IpAddr::V4(Ipv4Addr::new(header[16], header[17], header[18], header[19])),
        proto: header[9],
        dscp: header[1] >> 2,
        len: u16::try_from(total_len).expect("a 16-bit field"),
        transport: (fragment_offset == 0 && options_present).then_some(at + header_len),
    })
}

/// Where an IPv6 extension header chain ends.
enum ChainEnd {
    /// At an upper-layer protocol (or one the parser does not follow) whose header starts at
    /// `at`.
    Upper { proto: u8, at: usize },
    /// Before that: a header that could not be read, one beyond the bound, or a non-first
    /// fragment's payload. `proto` is the header type the walk ended at.
    GaveUp { proto: u8 },
}

fn ipv6(bytes: Bytes, at: usize) -> Option<Ip> {
    let header = bytes.slice(at, 40)?;
    if header[0] >> 4 != 6 {
        return None;
    }
    let traffic_class = (header[0] << 4) | (header[1] >> 4);
    let address = |from: usize| {
        let octets: [u8; 16] = header[from..from + 16].try_into().expect("16 bytes");
        IpAddr::V6(Ipv6Addr::from(octets))
    };
    let (proto, transport) = match walk_extension_headers(bytes, header[6], at + 40) {
        ChainEnd::Upper { proto, at } => (proto, Some(at)),
        ChainEnd::GaveUp { proto } => (proto, None),
    };
    let len = match u16::from_be_bytes([header[4], header[5]]) {
        0 => bytes.0.len() - at,
        payload => usize::from(payload) + 40,
    };
    let len = u16::try_from(len).unwrap_or(u16::MAX);
    Some(Ip { src: address(8), dst: address(24), proto, dscp: traffic_class >> 2, len, transport })
}

/// Follows the extension headers from `first` (the IPv6 header's next header) at `at`.
fn walk_extension_headers(bytes: Bytes, first: u8, at: usize) -> ChainEnd {
    let (mut kind, mut at) = (first, at);
    let mut followed = 0;
    loop {
        // What each header needs read to be followed, and how long it is (RFC 8200 section 4;
        // AH counts 4-byte words less 2, RFC 4302 section 2.2).
        let (needed, len): (usize, fn(&[u8]) -> usize) = match kind {
            0 | 43 | 60 => (2, |h| (usize::from(h[1]) + 1) * 8),
            51 => (2, |h| (usize::from(h[1]) + 2) * 4),
            44 => (4, |_| 8),
            proto => return ChainEnd::Upper { proto, at },
        };
        if followed == V6_EXT_HEADERS_FOLLOWED {
            return ChainEnd::GaveUp { proto: kind };
        }
        let Some(h) = bytes.slice(at, needed) else { return ChainEnd::GaveUp { proto: kind } };
        if kind == 44 && u16::from_be_bytes([h[2], h[3]]) >> 3 != 0 {
            return ChainEnd::GaveUp { proto: h[0] };
        }
        followed += 1;
        at += len(h);
        kind = h[0];
    }
}

/// Source and destination ports of a TCP or UDP header at `at`, if complete and sound.
fn ports(bytes: Bytes, at: usize, proto: u8) -> Option<(u16, u16)> {
    let header = match proto {
        PROTO_TCP => bytes.slice(at, 20).filter(|tcp| tcp[12] >> 4 >= 5)?,
        PROTO_UDP => bytes.slice(at, 8)?,
        _ => return None,
    };
    Some((u16::from_be_bytes([header[0], header[1]]), u16::from_be_bytes([header[2], header[3]])))
}

/// A packet's bytes, read only within bounds.
#[derive(Clone, Copy)]
struct Bytes<'a>(&'a [u8]);

impl<'a> Bytes<'a> {
    fn slice(self, at: usize, len: usize) -> Option<&'a [u8]> {
        self.0.get(at..at.checked_add(len)?)
    }

    fn u8(self, at: usize) -> Option<u8> {
        self.0.get(at).copied()
    }

    fn u16(self, at: usize) -> Option<u16> {
        self.slice(at, 2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ipv4, ipv6, Frame, L4};

    const TCP: L4 = L4::Tcp { sport: 40000, dport: 443 };

    fn v4(frame: &Frame, l4: L4) -> Vec<u8> {
        ipv4(frame, Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2), l4)
    }

    fn v6(ext: &[(u8, usize)], l4: L4) -> Vec<u8> {
        ipv6(&Frame::default(), "2001:db8::1".parse().unwrap(), "2001:db8::2".parse().unwrap(), ext, l4)
    }

    #[test]
    fn reads_a_sound_packet() {
        let p = parse(&v4(&Frame { tos: (46 << 2) | 1, vlan: Some(3), ..Frame::default() }, TCP), false, 7).unwrap();
        assert_eq!(p.src, Some(IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1))));
        assert_eq!((p.proto, p.dscp, p.mark, p.ports), (6, 46, 7, Some((40000, 443))));
        let udp = parse(&v6(&[(0, 8), (60, 16)], L4::Udp { sport: 1, dport: 2 }), false, 0).unwrap();
        assert_eq!((udp.proto, udp.ports), (17, Some((1, 2))));
        // Without a link layer, the same IP packet.
        let l3 = parse(&v4(&Frame::default(), TCP)[14..], true, 7).unwrap();
        assert_eq!(l3, PacketFields { dscp: 0, src_mac: None, ..p });
        assert_eq!(p.src_mac, Some([2, 0, 0, 0, 0, 1]));
        // The builder's TCP header: ACK with 12 bytes of options, 64 bytes of payload.
        assert_eq!((p.len, p.tcp_flags, p.tcp_no_payload, p.icmp_type), (Some(20 + 32 + 64), Some(0x10), false, None));
        let ack = parse(&v4(&Frame { payload: 0, ..Frame::default() }, TCP), false, 0).unwrap();
        assert_eq!((ack.len, ack.tcp_flags, ack.tcp_no_payload), (Some(52), Some(0x10), true));
        let ping = parse(&v6(&[], L4::Icmp), false, 0).unwrap();
        assert_eq!((ping.proto, ping.icmp_type, ping.len), (1, None, Some(40 + 8 + 64)), "ICMP's number in IPv6");
    }

    #[test]
    fn damage_after_the_ip_header_loses_only_the_ports() {
        let good = v4(&Frame::default(), TCP);
        let cut = parse(&good[..14 + 20 + 10], false, 0).unwrap();
        assert_eq!((cut.proto, cut.ports, cut.src.is_some()), (6, None, true));
        let mut fragment = good.clone();
        fragment[14 + 7] = 1;
        assert_eq!(parse(&fragment, false, 0).unwrap().ports, None);
        assert_eq!(parse(&good[..14 + 19], false, 0), None);
        let arp = [&good[..12], &[0x08, 0x06], &[0; 28]].concat();
        assert_eq!(
            parse(&arp, false, 5),
            Some(PacketFields { mark: 5, src_mac: Some([2, 0, 0, 0, 0, 1]), ..PacketFields::default() })
        );
    }

    #[test]
    fn pppoe_sessions_carry_ip() {
        let plain = v4(&Frame::default(), TCP);
        // PPPoE session header (version/type 0x11, code 0, session 1, length) and PPP's IPv4.
        let pppoe = |ppp: [u8; 2]| {
            let mut p = plain.clone();
            p[12..14].copy_from_slice(&[0x88, 0x64]);
            p.splice(14..14, [0x11, 0, 0, 1, 0, 0, ppp[0], ppp[1]]);
            p
        };
        assert_eq!(parse(&pppoe([0, 0x21]), false, 0), parse(&plain, false, 0));
        let lcp = parse(&pppoe([0xc0, 0x21]), false, 0).unwrap();
        assert_eq!((lcp.src, lcp.len), (None, None), "LCP is not IP");
        assert_eq!(parse(&pppoe([0, 0x21])[..21], false, 0), None, "a PPPoE header cut short");
    }

    #[test]
    fn extension_headers_are_followed_up_to_the_bound() {
        let dst_opts = |n| vec![(60u8, 8usize); n];
        let six = parse(&v6(&dst_opts(6), TCP), false, 0).unwrap();
        assert_eq!((six.proto, six.ports), (6, Some((40000, 443))));
        let seven = parse(&v6(&dst_opts(7), TCP), false, 0).unwrap();
        assert_eq!((seven.proto, seven.ports), (60, None));
        // A non-first fragment stops at its fragment header.
        let mut fragment = v6(&[(44, 8), (60, 8)], TCP);
        fragment[14 + 40 + 3] = 0x08;
        let p = parse(&fragment, false, 0).unwrap();
        assert_eq!((p.proto, p.ports), (60, None));
    }
}
