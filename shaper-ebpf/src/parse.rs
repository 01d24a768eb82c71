//! Header parsing: Ethernet (with at most one 802.1Q/802.1ad tag), IPv4, IPv6 (extension
//! headers skipped up to a fixed bound), TCP, UDP. Every read goes through
//! `bpf_skb_load_bytes`, which checks the offset against the packet length at run time, so a
//! truncated packet makes the read fail instead of reading past the end. A packet whose IP
//! header is sound is classified on what it tells (addresses, DSCP, protocol) even when what
//! follows cannot be read (IPv4 options or a transport header cut short, more IPv6 extension
//! headers than the parser follows): rules on ports do not match it, but it stays in its
//! host's class rather than leave by the default class, which a host could otherwise reach
//! on purpose. A failed read or an inconsistent header before that makes the parse fail, and
//! the packet goes to the default class.

use aya_ebpf::programs::TcContext;
use shaper_common::RuleKey;

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_DSTOPTS: u8 = 60;

/// IPv6 extension headers followed before giving up (RFC 8200 recommends an order with at
/// most one of each, plus the destination options header twice).
const MAX_V6_EXT_HEADERS: usize = 6;

/// A parse failure: the packet is truncated or its headers are inconsistent.
pub struct Malformed;

impl From<i64> for Malformed {
    fn from(_errno: i64) -> Self {
        Self
    }
}

/// What the parser learnt besides the classification key.
#[derive(Clone, Copy)]
pub struct Parsed {
    /// Raw source and destination ports (0 when the packet has none).
    pub sport: u16,
    pub dport: u16,
    pub has_ports: bool,
    /// Bytes of headers in front of the transport payload (link, network, transport), i.e.
    /// what every segment of a GSO packet carries again on the wire; 0 when unknown.
    pub hdr_len: u32,
    /// Offset of the IP header (0 when the packet is not IP) and its ECN field.
    pub l3: u32,
    pub ecn: u8,
}

impl Parsed {
    const fn empty() -> Self {
        Self { sport: 0, dport: 0, has_ports: false, hdr_len: 0, l3: 0, ecn: 0 }
    }
}

#[inline(always)]
fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Fills `key` (family, protocol, DSCP, addresses) and returns the ports and header length.
/// `l3` is set for interfaces without a link-layer header (tun, WireGuard, PPP).
#[inline(always)]
pub fn parse(ctx: &TcContext, l3: bool, key: &mut RuleKey) -> Result<Parsed, Malformed> {
    let (off, ethertype) = if l3 {
        let first: u8 = ctx.load(0)?;
        match first >> 4 {
            4 => (0, ETH_P_IP),
            6 => (0, ETH_P_IPV6),
            _ => return Err(Malformed),
        }
    } else {
        let et = be16(ctx.load(12)?);
        if et == ETH_P_8021Q || et == ETH_P_8021AD {
            (ETH_HLEN + VLAN_HLEN, be16(ctx.load(ETH_HLEN + 2)?))
        } else {
            (ETH_HLEN, et)
        }
    };
    match ethertype {
        ETH_P_IP => parse_v4(ctx, off, key),
        ETH_P_IPV6 => parse_v6(ctx, off, key),
        // ARP, LLDP, MPLS...: no IP fields to classify on; rules on fwmark still apply.
        _ => Ok(Parsed::empty()),
    }
}

#[inline(always)]
fn parse_v4(ctx: &TcContext, off: usize, key: &mut RuleKey) -> Result<Parsed, Malformed> {
    let h: [u8; 20] = ctx.load(off)?;
    if h[0] >> 4 != 4 {
        return Err(Malformed);
    }
    let ihl = usize::from(h[0] & 0x0f) * 4;
    let total_len = usize::from(be16([h[2], h[3]]));
    if ihl < 20 || total_len < ihl {
        return Err(Malformed);
    }
    key.family = 4;
    key.dscp = h[1] >> 2;
    let ecn = h[1] & 0x3;
    key.proto = h[9];
    key.src[..4].copy_from_slice(&h[12..16]);
    key.dst[..4].copy_from_slice(&h[16..20]);
    // Only the first fragment carries the transport header.
    let frag_off = be16([h[6], h[7]]) & 0x1fff;
    if frag_off != 0 {
        return Ok(Parsed { l3: off as u32, ecn, ..Parsed::empty() });
    }
    // Options beyond the fixed header must be present too; without them, or without a
    // sound transport header, the packet is classified on its IP header alone.
    if ihl > 20 && ctx.load::<u8>(off + ihl - 1).is_err() {
        return Ok(Parsed { l3: off as u32, ecn, ..Parsed::empty() });
    }
    let p = transport(ctx, off + ihl, h[9]);
    Ok(Parsed { l3: off as u32, ecn, ..p })
}

#[inline(always)]
fn parse_v6(ctx: &TcContext, off: usize, key: &mut RuleKey) -> Result<Parsed, Malformed> {
    let h: [u8; 40] = ctx.load(off)?;
    if h[0] >> 4 != 6 {
        return Err(Malformed);
    }
    let traffic_class = ((h[0] & 0x0f) << 4) | (h[1] >> 4);
    let (l3, ecn) = (off as u32, traffic_class & 0x3);
    key.family = 6;
    key.dscp = traffic_class >> 2;
    key.src.copy_from_slice(&h[8..24]);
    key.dst.copy_from_slice(&h[24..40]);
    let mut next = h[6];
    let mut off = off + 40;
    let mut first_fragment = true;
    for _ in 0..MAX_V6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let Ok(e) = ctx.load::<[u8; 2]>(off) else { break };
                next = e[0];
                off += (usize::from(e[1]) + 1) * 8;
            }
            IPPROTO_AH => {
                let Ok(e) = ctx.load::<[u8; 2]>(off) else { break };
                next = e[0];
                off += (usize::from(e[1]) + 2) * 4;
            }
            IPPROTO_FRAGMENT => {
                let Ok(e) = ctx.load::<[u8; 4]>(off) else { break };
                next = e[0];
                if be16([e[2], e[3]]) & 0xfff8 != 0 {
                    // What follows is the middle of the original packet, not headers.
                    first_fragment = false;
                    break;
                }
                off += 8;
            }
            _ => break,
        }
    }
    // The header the chain stopped at: the upper-layer protocol, or, for a chain longer than
    // the bound or cut short, the extension header where the parser gave up. (Checked after
    // the loop, so that the header after the last extension header the bound allows is read.)
    key.proto = next;
    let done = !matches!(next, IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS | IPPROTO_AH | IPPROTO_FRAGMENT);
    if !done || !first_fragment {
        return Ok(Parsed { l3, ecn, ..Parsed::empty() });
    }
    let p = transport(ctx, off, next);
    Ok(Parsed { l3, ecn, ..p })
}

/// The ports and header length of the transport header at `off`; none if it cannot be read
/// or is inconsistent (the packet is then classified on its IP header alone).
#[inline(always)]
fn transport(ctx: &TcContext, off: usize, proto: u8) -> Parsed {
    match proto {
        IPPROTO_TCP => {
            let Ok(t) = ctx.load::<[u8; 20]>(off) else { return Parsed::empty() };
            let doff = usize::from(t[12] >> 4) * 4;
            if doff < 20 {
                return Parsed::empty();
            }
            Parsed {
                sport: be16([t[0], t[1]]),
                dport: be16([t[2], t[3]]),
                has_ports: true,
                hdr_len: (off + doff) as u32,
                ..Parsed::empty()
            }
        }
        IPPROTO_UDP => {
            let Ok(u) = ctx.load::<[u8; 8]>(off) else { return Parsed::empty() };
            Parsed {
                sport: be16([u[0], u[1]]),
                dport: be16([u[2], u[3]]),
                has_ports: true,
                hdr_len: (off + 8) as u32,
                ..Parsed::empty()
            }
        }
        _ => Parsed { hdr_len: off as u32, ..Parsed::empty() },
    }
}
