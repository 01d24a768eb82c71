//! Header parsing: Ethernet (with at most one 802.1Q/802.1ad tag, and a PPPoE session header
//! behind it), IPv4, IPv6 (extension headers skipped up to a fixed bound), TCP, UDP, ICMP and
//! `ICMPv6`. Every read is checked against the packet's end (see [`parse`]), so a truncated
//! packet makes the read fail instead of reading past the end. A packet whose IP
//! header is sound is classified on what it tells (addresses, DSCP, protocol) even when what
//! follows cannot be read (IPv4 options or a transport header cut short, more IPv6 extension
//! headers than the parser follows): rules on ports do not match it, but it stays in its
//! host's class rather than leave by the default class, which a host could otherwise reach
//! on purpose. A failed read or an inconsistent header before that makes the parse fail, and
//! the packet goes to the default class.
//!
//! PPPoE (RFC 2516): a session frame (ethertype 0x8864) whose 6-byte PPPoE header has
//! version/type 0x11 and code 0 carries a PPP frame; its 2-byte protocol 0x0021 (IPv4) or
//! 0x0057 (IPv6) says the IP header follows, 8 bytes after the PPPoE header's start. Those
//! packets are classified on their inner IP header as if the PPPoE header were not there;
//! the offsets this module reports (`l3`, `hdr_len`) count it, so the CE mark and the GSO
//! segments' header length land on the right bytes. Other PPPoE frames (LCP, discovery) are
//! not IP.

use aya_ebpf::{bindings::__sk_buff, helpers::bpf_skb_pull_data, programs::TcContext};
use shaper_common::{RuleKey, L4_ICMP, L4_TCP, L4_TCP_NO_PAYLOAD};

const ETH_HLEN: usize = 14;
const VLAN_HLEN: usize = 4;
const ETH_P_IP: u16 = 0x0800;
const ETH_P_IPV6: u16 = 0x86DD;
const ETH_P_8021Q: u16 = 0x8100;
const ETH_P_8021AD: u16 = 0x88A8;
const ETH_P_PPP_SES: u16 = 0x8864;
/// The PPPoE header (6 bytes) and the PPP protocol field (2 bytes).
const PPPOE_HLEN: usize = 8;
/// PPPoE version 1, type 1, and the session data code (RFC 2516 section 4).
const PPPOE_VER_TYPE: u8 = 0x11;
const PPPOE_CODE_SESSION: u8 = 0;
const PPP_IP: u16 = 0x0021;
const PPP_IPV6: u16 = 0x0057;

const IPPROTO_HOPOPTS: u8 = 0;
const IPPROTO_ICMP: u8 = 1;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const IPPROTO_ROUTING: u8 = 43;
const IPPROTO_FRAGMENT: u8 = 44;
const IPPROTO_AH: u8 = 51;
const IPPROTO_ICMPV6: u8 = 58;
const IPPROTO_DSTOPTS: u8 = 60;

/// IPv6 extension headers followed before giving up (RFC 8200 recommends an order with at
/// most one of each, plus the destination options header twice).
const MAX_V6_EXT_HEADERS: usize = 6;

/// A parse failure: the packet is truncated or its headers are inconsistent.
pub struct Malformed;

/// What the parser learnt besides the classification key. Whole words, for
/// [`crate::zero_in_place`].
#[derive(Clone, Copy)]
#[repr(C, align(8))]
pub struct Parsed {
    /// Raw source port (low 16 bits) and destination port (high 16 bits); 0 when the packet
    /// has none. One field, so that the parser writes it as one word: its caller reads the
    /// two ports as one word, and a load that spans two stores waits for both to reach the
    /// cache (`perf` put a tenth of the program's samples on it, one packet repeated).
    pub ports: u32,
    pub has_ports: bool,
    /// Bytes of headers in front of the transport payload (link, network, transport), i.e.
    /// what every segment of a GSO packet carries again on the wire; 0 when unknown.
    pub hdr_len: u32,
    /// Offset of the IP header (0 when the packet is not IP) and its ECN field.
    pub l3: u32,
    pub ecn: u8,
    /// The IP length (see `RuleKey::len`), at most 65535; 0 when the packet is not IP.
    pub ip_len: u32,
}

impl Parsed {
    const fn empty() -> Self {
        Self { ports: 0, has_ports: false, hdr_len: 0, l3: 0, ecn: 0, ip_len: 0 }
    }

    /// `ports` of source port `sport` and destination port `dport`.
    #[inline(always)]
    pub const fn ports(sport: u16, dport: u16) -> u32 {
        sport as u32 | (dport as u32) << 16
    }

    #[inline(always)]
    pub const fn sport(&self) -> u16 {
        self.ports as u16
    }

    #[inline(always)]
    pub const fn dport(&self) -> u16 {
        (self.ports >> 16) as u16
    }

    /// Sets the source port (a translated flow's, as its host sent it).
    #[inline(always)]
    pub fn set_sport(&mut self, sport: u16) {
        self.ports = Self::ports(sport, self.dport());
    }
}

#[inline(always)]
fn be16(b: [u8; 2]) -> u16 {
    u16::from_be_bytes(b)
}

/// Fills `key` (source MAC, family, protocol, DSCP, addresses, TCP flags, ICMP type) and
/// returns the ports, header length and IP length. `l3` is set for interfaces without a
/// link-layer header (tun, WireGuard, PPP).
///
/// Headers are read in place from the skb's linear data, with plain loads checked against
/// its end. The stack and drivers put the headers there; if the linear data is shorter
/// than [`HEADERS_MAX`] bytes and the packet is not, `bpf_skb_pull_data` first makes that
/// much of it linear. Reading through `bpf_skb_load_bytes` instead took 3 helper calls and
/// copies of 14 to 40 bytes for a TCP/IPv4 packet, 35 of its 156 ns (one packet repeated)
/// and 70 of 398 on a many-flow mix (`cargo xtask bench`).
#[inline(always)]
pub fn parse(ctx: &TcContext, l3: bool, key: &mut RuleKey) -> Result<Parsed, Malformed> {
    let skb = ctx.skb.skb;
    // SAFETY: the context pointer is valid for the whole program run.
    let len = unsafe { (*skb).len };
    let want = if len < HEADERS_MAX { len } else { HEADERS_MAX };
    if ((ctx.data_end() - ctx.data()) as u32) < want {
        // SAFETY: the helper only makes the skb's first `want` bytes linear (or fails, and
        // the reads below fail where the linear data ends).
        unsafe { bpf_skb_pull_data(skb.cast(), want) };
    }
    let mut parsed = core::mem::MaybeUninit::<Parsed>::uninit();
    let parsed = crate::zero_in_place(&mut parsed);
    if parse_into(ctx, l3, key, parsed) {
        Ok(*parsed)
    } else {
        Err(Malformed)
    }
}

/// The bytes the parser wants in the linear data: a VLAN tag, a PPPoE header, an IPv4
/// header with options and a TCP header after the Ethernet header come to 110; an IPv6
/// header with extension headers beyond them is read as far as it lies within.
pub const HEADERS_MAX: u32 = 128;

/// [`parse`], as a function of its own: `out` gets what [`parse`] returns; false when the
/// packet is malformed.
///
/// Not inlined: the verifier walks what follows the parser once for each state the parser
/// leaves at its end, and the parser's many paths (link headers, IP versions, transport
/// protocols, GSO) leave many. Returning from a function of its own, they meet at one
/// instruction, where the verifier merges those that differ only in values nothing after
/// depends on. With the parser inlined, Linux 6.1's verifier walked 726,744 instructions
/// (6.18's 579,178); as a function of its own, 337,781 (6.18's 146,034; see the datapath
/// test `the_verifier_walk_keeps_two_fifths_of_its_budget`). It takes and returns plain types (no
/// Rust enum), as the BTF that describes it to the kernel must. Its stack frame counts with
/// its caller's within the 512 bytes a call chain may use, so what it reads goes straight
/// into `key` where it can.
#[inline(never)]
fn parse_into(ctx: &TcContext, l3: bool, key: &mut RuleKey, out: &mut Parsed) -> bool {
    // Through `black_box`: the fields are 32 bits wide, and knowing that, LLVM compares the
    // pointers in 32 bits, which tells the verifier nothing of the packet's bounds.
    let (data, end) = (core::hint::black_box(ctx.data()), core::hint::black_box(ctx.data_end()));
    let src = Linear { skb: ctx.skb.skb, data, end };
    match headers(&src, l3, key) {
        Ok(p) => {
            *out = p;
            true
        }
        Err(Malformed) => false,
    }
}

/// The skb's linear data, read in place; a read beyond its end fails.
struct Linear {
    skb: *mut __sk_buff,
    data: usize,
    end: usize,
}

impl Linear {
    /// A pointer to the `len` bytes at `off`, if the linear data holds them.
    #[inline(always)]
    fn at(&self, off: usize, len: usize) -> Result<*const u8, Malformed> {
        let start = self.data + off;
        if start + len > self.end {
            return Err(Malformed);
        }
        Ok(start as *const u8)
    }

    #[inline(always)]
    fn skb(&self) -> *mut __sk_buff {
        self.skb
    }

    /// The `T` at byte `off` of the packet.
    #[inline(always)]
    fn load<T: Copy>(&self, off: usize) -> Result<T, Malformed> {
        let p = self.at(off, core::mem::size_of::<T>())?;
        // SAFETY: within the linear data (checked above, as the verifier requires).
        Ok(unsafe { core::ptr::read_unaligned(p.cast::<T>()) })
    }

    /// Copies `len` bytes at `off` to `dst` (the key, in the caller's frame, rather than a
    /// buffer in the parser's).
    #[inline(always)]
    fn load_into(&self, off: usize, dst: *mut u8, len: usize) -> Result<(), Malformed> {
        let p = self.at(off, len)?;
        // SAFETY: `len` bytes within the linear data (checked above); `dst` points to `len`
        // writable bytes (callers pass fields of the key).
        unsafe { core::ptr::copy_nonoverlapping(p, dst, len) };
        Ok(())
    }
}

// `parse_v6` reads both addresses with one load.
const _: () = assert!(core::mem::offset_of!(RuleKey, dst) == core::mem::offset_of!(RuleKey, src) + 16);

/// [`parse`]'s work.
#[inline(always)]
fn headers(src: &Linear, l3: bool, key: &mut RuleKey) -> Result<Parsed, Malformed> {
    let (off, ethertype) = if l3 {
        let first: u8 = src.load(0)?;
        match first >> 4 {
            4 => (0, ETH_P_IP),
            6 => (0, ETH_P_IPV6),
            _ => return Err(Malformed),
        }
    } else {
        let eth: [u8; ETH_HLEN] = src.load(0)?;
        key.src_mac.copy_from_slice(&eth[6..12]);
        let et = be16([eth[12], eth[13]]);
        let (off, et) = if et == ETH_P_8021Q || et == ETH_P_8021AD {
            (ETH_HLEN + VLAN_HLEN, be16(src.load(ETH_HLEN + 2)?))
        } else {
            (ETH_HLEN, et)
        };
        if et == ETH_P_PPP_SES {
            let h: [u8; PPPOE_HLEN] = src.load(off)?;
            let inner = match be16([h[6], h[7]]) {
                _ if h[0] != PPPOE_VER_TYPE || h[1] != PPPOE_CODE_SESSION => 0,
                PPP_IP => ETH_P_IP,
                PPP_IPV6 => ETH_P_IPV6,
                _ => 0,
            };
            (off + PPPOE_HLEN, inner)
        } else {
            (off, et)
        }
    };
    match ethertype {
        ETH_P_IP => parse_v4(src, off, key),
        ETH_P_IPV6 => parse_v6(src, off, key),
        // ARP, LLDP, MPLS...: no IP fields to classify on; rules on fwmark and source MAC
        // still apply.
        _ => Ok(Parsed::empty()),
    }
}

#[inline(always)]
fn parse_v4(src: &Linear, off: usize, key: &mut RuleKey) -> Result<Parsed, Malformed> {
    let h: [u8; 20] = src.load(off)?;
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
    let ip = Parsed { l3: off as u32, ecn, ip_len: total_len as u32, ..Parsed::empty() };
    // Only the first fragment carries the transport header.
    let frag_off = be16([h[6], h[7]]) & 0x1fff;
    if frag_off != 0 {
        return Ok(ip);
    }
    // Options beyond the fixed header must be present too; without them, or without a
    // sound transport header, the packet is classified on its IP header alone.
    if ihl > 20 && src.load::<u8>(off + ihl - 1).is_err() {
        return Ok(ip);
    }
    Ok(transport(src, ip, off + ihl, h[9], IPPROTO_ICMP, key))
}

#[inline(always)]
fn parse_v6(src: &Linear, off: usize, key: &mut RuleKey) -> Result<Parsed, Malformed> {
    // The fixed header's first 8 bytes, then both addresses (contiguous in the key too).
    let h: [u8; 8] = src.load(off)?;
    if h[0] >> 4 != 6 {
        return Err(Malformed);
    }
    src.load_into(off + 8, key.src.as_mut_ptr(), 32)?;
    let traffic_class = ((h[0] & 0x0f) << 4) | (h[1] >> 4);
    let (l3, ecn) = (off as u32, traffic_class & 0x3);
    // A payload length of 0 is a jumbogram's (RFC 2675) or BIG TCP's: the skb's length
    // tells instead.
    let payload = u32::from(be16([h[4], h[5]]));
    // SAFETY: the context pointer is valid for the whole program run.
    let skb_len = unsafe { (*src.skb()).len };
    let ip_len = if payload == 0 { skb_len.saturating_sub(l3) } else { payload + 40 }.min(u32::from(u16::MAX));
    key.family = 6;
    key.dscp = traffic_class >> 2;
    let mut next = h[6];
    let mut off = off + 40;
    let mut first_fragment = true;
    for _ in 0..MAX_V6_EXT_HEADERS {
        match next {
            IPPROTO_HOPOPTS | IPPROTO_ROUTING | IPPROTO_DSTOPTS => {
                let Ok(e) = src.load::<[u8; 2]>(off) else { break };
                next = e[0];
                off += (usize::from(e[1]) + 1) * 8;
            }
            IPPROTO_AH => {
                let Ok(e) = src.load::<[u8; 2]>(off) else { break };
                next = e[0];
                off += (usize::from(e[1]) + 2) * 4;
            }
            IPPROTO_FRAGMENT => {
                let Ok(e) = src.load::<[u8; 4]>(off) else { break };
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
    let ip = Parsed { l3, ecn, ip_len, ..Parsed::empty() };
    if !done || !first_fragment {
        return Ok(ip);
    }
    Ok(transport(src, ip, off, next, IPPROTO_ICMPV6, key))
}

/// What the IP header `ip` tells, with the ports and header length of the transport header at
/// `off`; none if it cannot be read or is inconsistent (the packet is then classified on its
/// IP header alone). Sets the TCP flags, or the type of an ICMP header (`icmp`: the family's
/// ICMP protocol number), in `key`.
///
/// A GSO packet's IP length is one segment's: each carries the headers and `gso_size` bytes
/// of payload (the last one less); the IP header's, if set at all (BIG TCP leaves it 0), is
/// the whole skb's. The stack builds GSO packets only with a transport header; without one
/// the header's length stands.
///
/// Each branch works out its own result, with no test that compares two offsets: an offset
/// is a constant on each path the verifier walks (one per link header and IP header
/// length), and a branch on constants would keep those paths apart for all that follows.
#[inline(always)]
fn transport(src: &Linear, ip: Parsed, off: usize, proto: u8, icmp: u8, key: &mut RuleKey) -> Parsed {
    // SAFETY: the context pointer is valid for the whole program run; `gso_size` is readable
    // from tc programs since Linux 5.7.
    let (gso_segs, gso_size) = unsafe { ((*src.skb()).gso_segs, (*src.skb()).gso_size) };
    let l3 = ip.l3 as usize;
    let ip_len = |hdr_len: usize| {
        if gso_segs > 1 {
            ((hdr_len - l3) as u32 + gso_size).min(u32::from(u16::MAX))
        } else {
            ip.ip_len
        }
    };
    match proto {
        IPPROTO_TCP => {
            let Ok(t) = src.load::<[u8; 20]>(off) else { return ip };
            let doff = usize::from(t[12] >> 4) * 4;
            if doff < 20 {
                return ip;
            }
            let hdr_len = off + doff;
            key.tcp_flags = t[13];
            key.l4 |=
                if gso_segs <= 1 && (hdr_len - l3) as u32 == ip.ip_len { L4_TCP | L4_TCP_NO_PAYLOAD } else { L4_TCP };
            Parsed {
                ports: Parsed::ports(be16([t[0], t[1]]), be16([t[2], t[3]])),
                has_ports: true,
                hdr_len: hdr_len as u32,
                ip_len: ip_len(hdr_len),
                ..ip
            }
        }
        IPPROTO_UDP => {
            let Ok(u) = src.load::<[u8; 8]>(off) else { return ip };
            Parsed {
                ports: Parsed::ports(be16([u[0], u[1]]), be16([u[2], u[3]])),
                has_ports: true,
                hdr_len: (off + 8) as u32,
                ip_len: ip_len(off + 8),
                ..ip
            }
        }
        _ => {
            // ICMP and ICMPv6 share their first four bytes: type, code, checksum (RFC 792,
            // RFC 4443 section 2.1). ICMP's number in IPv6 (and ICMPv6's in IPv4) is not ICMP.
            if proto == icmp {
                if let Ok(i) = src.load::<[u8; 4]>(off) {
                    key.icmp_type = i[0];
                    key.l4 |= L4_ICMP;
                }
            }
            Parsed { hdr_len: off as u32, ip_len: ip_len(off), ..ip }
        }
    }
}
