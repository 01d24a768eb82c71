//! Single values: durations, rates, interface and class names, protocols, DSCP code points,
//! ports, marks, networks, IP lengths, TCP flags, ICMP types and MAC addresses, each parsed with a message that says what would be valid; and
//! the spelling of name lists and rate sums in messages.

use std::fmt::Write as _;
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use ipnet::IpNet;

use super::error::Problem;
use super::model::PortRange;
use super::raw::Scalar;
use crate::rate::{Decimal, Rate, RateSpec, ScaleError};
use crate::rules::TcpFlags;

/// Longest interface name (`IFNAMSIZ` less the terminating NUL).
const MAX_IFNAME_LEN: usize = 15;
/// Longest class name.
const MAX_CLASS_NAME_LEN: usize = 64;
/// How many names an error message lists before "and N more".
const NAMES_LISTED: usize = 12;

/// Why a duration could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum ParseDurationError {
    #[error("invalid duration \"{0}\"; expected a number and a unit (ns, us, ms or s), e.g. \"10ms\" or \"1.5s\"")]
    Invalid(String),
    #[error("duration \"{0}\" has no unit; add one of ns, us, ms or s, e.g. \"{0}ms\"")]
    MissingUnit(String),
    #[error("unknown unit \"{unit}\" in duration \"{input}\"; valid units: ns, us (or µs), ms, s")]
    UnknownUnit { input: String, unit: String },
    #[error("duration \"{0}\" is not a whole number of nanoseconds")]
    NotWhole(String),
    #[error("duration \"{0}\" is too long")]
    Overflow(String),
}

/// Parses `"10ms"`, `"1.5s"`, `"250us"`, `"100ns"` exactly.
fn parse_duration(s: &str) -> Result<Duration, ParseDurationError> {
    let text = s.trim();
    let Some((number, unit)) = Decimal::split_prefix(text) else {
        return Err(ParseDurationError::Invalid(s.to_owned()));
    };
    let pow10 = match unit.trim_start() {
        "" => return Err(ParseDurationError::MissingUnit(text.to_owned())),
        "ns" => 0,
        "us" | "µs" => 3,
        "ms" => 6,
        "s" => 9,
        unit => return Err(ParseDurationError::UnknownUnit { input: s.to_owned(), unit: unit.to_owned() }),
    };
    match number.scale(pow10, 0) {
        Ok(nanos) => Ok(Duration::from_nanos(nanos)),
        Err(ScaleError::NotWhole) => Err(ParseDurationError::NotWhole(s.to_owned())),
        Err(ScaleError::Overflow) => Err(ParseDurationError::Overflow(s.to_owned())),
    }
}

/// A duration value within `range`.
pub(super) fn duration_in(
    value: &Scalar,
    what: &str,
    range: &RangeInclusive<Duration>,
    example: &str,
) -> Result<Duration, Problem> {
    let text = match value {
        Scalar::Str(text) => text,
        Scalar::Int(n) => {
            return Err(Problem::new(format!(
                "{what} {n} has no unit; write it as a string with a unit, e.g. {what} = \"{example}\""
            )))
        }
    };
    let duration = parse_duration(text).map_err(Problem::from_error)?;
    if range.contains(&duration) {
        Ok(duration)
    } else {
        Err(Problem::new(format!(
            "{what} {text:?} is out of range; expected {}..={}",
            fmt_duration(*range.start()),
            fmt_duration(*range.end())
        )))
    }
}

/// A short exact spelling of `d` for messages (`"1ms"`, `"10s"`).
fn fmt_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    for (unit, scale) in [("s", 1_000_000_000), ("ms", 1_000_000), ("us", 1_000)] {
        if nanos.is_multiple_of(scale) {
            return format!("{}{unit}", nanos / scale);
        }
    }
    format!("{nanos}ns")
}

/// A rate (an absolute one: no percentage) from a string, or an integer of bits/s.
pub(super) fn parse_rate(value: &Scalar) -> Result<Rate, Problem> {
    match value {
        Scalar::Str(text) => text.parse().map_err(Problem::from_error),
        Scalar::Int(n) => u64::try_from(*n)
            .map(Rate::from_bits_per_sec)
            .map_err(|source| Problem::new(format!("negative rate {n}; expected e.g. \"10mbit\"")).with_source(source)),
    }
}

/// A rate or a percentage, from a string, or an integer of bits/s.
pub(super) fn parse_rate_spec(value: &Scalar) -> Result<RateSpec, Problem> {
    match value {
        Scalar::Str(text) => text.parse().map_err(Problem::from_error),
        Scalar::Int(_) => parse_rate(value).map(RateSpec::Absolute),
    }
}

/// Checks a Linux interface name the way the kernel's `dev_valid_name` does.
pub(super) fn check_ifname(name: &str) -> Result<(), Problem> {
    let problem = if name.is_empty() {
        "is empty"
    } else if name.len() > MAX_IFNAME_LEN {
        "is longer than 15 bytes"
    } else if name == "." || name == ".." {
        "is not a valid device name"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains(':') {
        "contains ':'"
    } else if name.chars().any(|c| c.is_whitespace() || c == '\0') {
        "contains whitespace"
    } else {
        return Ok(());
    };
    Err(Problem::new(format!(
        "interface name {name:?} {problem}; a Linux interface name is 1 to 15 bytes without '/', ':' or whitespace, e.g. \"eth0\""
    )))
}

/// Checks a class name: 1 to 64 ASCII letters, digits, `-`, `_` and `.`, starting with a
/// letter or a digit (names are used on command lines and in the control protocol).
pub(super) fn check_class_name(name: &str) -> Result<(), Problem> {
    let valid = !name.is_empty()
        && name.len() <= MAX_CLASS_NAME_LEN
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if valid {
        Ok(())
    } else {
        Err(Problem::new(format!(
            "invalid class name {name:?}; expected 1 to {MAX_CLASS_NAME_LEN} ASCII letters, digits, '-', '_' or '.', starting with a letter or a digit, e.g. \"guest\""
        )))
    }
}

/// `a, b, c` (at most [`NAMES_LISTED`] names, then "and N more"), or "none".
pub(super) fn list<'a>(names: impl IntoIterator<Item = &'a str>) -> String {
    let names: Vec<&str> = names.into_iter().collect();
    if names.is_empty() {
        return "none".to_owned();
    }
    let mut out = names.iter().take(NAMES_LISTED).copied().collect::<Vec<_>>().join(", ");
    if names.len() > NAMES_LISTED {
        let _ = write!(out, " and {} more", names.len() - NAMES_LISTED);
    }
    out
}

/// A sum of rates for messages: a rate's spelling, or plain bits beyond `u64`.
pub(super) fn fmt_sum(bits: u128) -> String {
    u64::try_from(bits).map_or_else(|_| format!("{bits}bit"), |bits| Rate::from_bits_per_sec(bits).to_string())
}

/// IP protocols known by name.
const PROTOCOLS: &[(&str, u8)] = &[
    ("icmp", 1),
    ("igmp", 2),
    ("ipip", 4),
    ("tcp", 6),
    ("udp", 17),
    ("ipv6", 41),
    ("rsvp", 46),
    ("gre", 47),
    ("esp", 50),
    ("ah", 51),
    ("icmpv6", 58),
    ("ipv6-icmp", 58),
    ("ospf", 89),
    ("pim", 103),
    ("vrrp", 112),
    ("l2tp", 115),
    ("sctp", 132),
    ("udplite", 136),
];
/// ICMP's protocol number.
pub(super) const PROTO_ICMP: u8 = 1;
/// TCP's protocol number.
pub(super) const PROTO_TCP: u8 = 6;
/// UDP's protocol number.
pub(super) const PROTO_UDP: u8 = 17;
/// The protocol number of ICMP for IPv6.
pub(super) const PROTO_ICMPV6: u8 = 58;

/// A protocol name or number.
pub(super) fn parse_proto(value: &Scalar) -> Result<u8, Problem> {
    let names = || list(PROTOCOLS.iter().map(|&(name, _)| name));
    match value {
        Scalar::Int(n) => u8::try_from(*n).map_err(|source| {
            Problem::new(format!("protocol number {n} is out of range; expected 0..=255 or a name: {}", names()))
                .with_source(source)
        }),
        Scalar::Str(text) => {
            let text = text.trim();
            if let Some(&(_, number)) = PROTOCOLS.iter().find(|(name, _)| name.eq_ignore_ascii_case(text)) {
                return Ok(number);
            }
            text.parse::<u8>().map_err(|source| {
                Problem::new(format!("unknown protocol {text:?}; expected a number 0..=255 or one of {}", names()))
                    .with_source(source)
            })
        }
    }
}

/// The name of protocol `number`, for messages.
pub(super) fn proto_name(number: u8) -> String {
    PROTOCOLS.iter().find(|&&(_, n)| n == number).map_or_else(|| number.to_string(), |&(name, _)| name.to_owned())
}

/// DSCP names: class selectors, assured forwarding, expedited forwarding, lower effort.
fn dscp_by_name(name: &str) -> Option<u8> {
    let name = name.to_ascii_lowercase();
    match name.as_str() {
        "ef" => return Some(46),
        "le" => return Some(1),
        _ => {}
    }
    let digits = |s: &str| s.parse::<u8>().ok();
    if let Some(n) = name.strip_prefix("cs").and_then(digits) {
        return (n <= 7 && name.len() == 3).then_some(n * 8);
    }
    if let Some(rest) = name.strip_prefix("af") {
        let mut chars = rest.chars();
        let (Some(class), Some(drop), None) = (chars.next(), chars.next(), chars.next()) else {
            return None;
        };
        let class = u8::try_from(class.to_digit(10)?).ok()?;
        let drop = u8::try_from(drop.to_digit(10)?).ok()?;
        return ((1..=4).contains(&class) && (1..=3).contains(&drop)).then_some(class * 8 + drop * 2);
    }
    None
}

/// A DSCP number or name.
pub(super) fn parse_dscp(value: &Scalar) -> Result<u8, Problem> {
    let valid = "expected 0..=63 or a name: cs0..cs7, af11..af13, af21..af23, af31..af33, af41..af43, ef, le";
    let number = match value {
        Scalar::Int(n) => *n,
        Scalar::Str(text) => {
            if let Some(dscp) = dscp_by_name(text.trim()) {
                return Ok(dscp);
            }
            match text.trim().parse::<i64>() {
                Ok(n) => n,
                Err(source) => return Err(Problem::new(format!("unknown DSCP {text:?}; {valid}")).with_source(source)),
            }
        }
    };
    match u8::try_from(number) {
        Ok(dscp @ 0..=63) => Ok(dscp),
        _ => Err(Problem::new(format!("DSCP {number} is out of range; {valid}"))),
    }
}

/// One port number written as text.
fn parse_port_text(text: &str, whole: &str) -> Result<u16, Problem> {
    let text = text.trim();
    let invalid = || {
        format!(
            "invalid port range {whole:?}; expected a port (e.g. 80) or an inclusive range \"A-B\" with A <= B, within 0..=65535"
        )
    };
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(Problem::new(invalid()));
    }
    let out_of_range = || format!("port {text} is out of range; ports are 0..=65535");
    match text.parse::<u64>() {
        Ok(n) => u16::try_from(n).map_err(|source| Problem::new(out_of_range()).with_source(source)),
        Err(source) => Err(Problem::new(out_of_range()).with_source(source)),
    }
}

/// A port or an inclusive port range.
pub(super) fn parse_ports(value: &Scalar) -> Result<PortRange, Problem> {
    match value {
        Scalar::Int(n) => u16::try_from(*n).map(|port| PortRange { start: port, end: port }).map_err(|source| {
            Problem::new(format!("port {n} is out of range; ports are 0..=65535")).with_source(source)
        }),
        Scalar::Str(text) => {
            let (start, end) = if let Some((start, end)) = text.split_once('-') {
                (parse_port_text(start, text)?, parse_port_text(end, text)?)
            } else {
                let port = parse_port_text(text, text)?;
                (port, port)
            };
            if start > end {
                return Err(Problem::new(format!(
                    "port range {text:?} is reversed; the start must not be above the end: \"{end}-{start}\""
                )));
            }
            Ok(PortRange { start, end })
        }
    }
}

/// A packet mark: a non-negative integer that fits in 32 bits.
pub(super) fn parse_mark(value: &Scalar) -> Result<u32, Problem> {
    match value {
        Scalar::Int(n) => u32::try_from(*n).map_err(|source| {
            Problem::new(format!("mark {n} is out of range; expected an integer 0..=4294967295 (0xffffffff)"))
                .with_source(source)
        }),
        Scalar::Str(text) => Err(Problem::new(format!(
            "mark {text:?} is a string; write the mark as a TOML integer, e.g. mark = 16 or mark = 0x10"
        ))),
    }
}

/// A network: an address (a /32 or /128) or a CIDR network with its host bits clear.
pub(super) fn parse_net(text: &str) -> Result<IpNet, Problem> {
    let text = text.trim();
    let examples = "e.g. \"192.168.1.0/24\", \"192.168.1.110\" or \"fd00:1::/64\"";
    if text.contains('/') {
        let net: IpNet = text.parse().map_err(|source| {
            Problem::new(format!("{text:?} is not a CIDR network; expected {examples}")).with_source(source)
        })?;
        if net.trunc() != net {
            return Err(Problem::new(format!(
                "{text:?} has host bits set; did you mean \"{}\" (the network), or \"{}\" (the single address)?",
                net.trunc(),
                IpNet::from(net.addr())
            )));
        }
        Ok(net)
    } else {
        text.parse::<IpAddr>().map(IpNet::from).map_err(|source| {
            Problem::new(format!("{text:?} is not an IP address or a CIDR network; expected {examples}"))
                .with_source(source)
        })
    }
}

/// An IP length in bytes or an inclusive range of them (`len`): `64`, `"64"`, `"0-63"`.
pub(super) fn parse_len(value: &Scalar) -> Result<PortRange, Problem> {
    let valid = "expected a length in bytes (e.g. 64) or an inclusive range \"A-B\" with A <= B, within 0..=65535";
    let number = |text: &str| -> Result<u16, Problem> {
        let text = text.trim();
        if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
            return Err(Problem::new(format!("invalid length {text:?}; {valid}")));
        }
        text.parse::<u16>().map_err(|source| {
            Problem::new(format!("length {text} is out of range; IP lengths are 0..=65535")).with_source(source)
        })
    };
    match value {
        Scalar::Int(n) => u16::try_from(*n).map(|len| PortRange { start: len, end: len }).map_err(|source| {
            Problem::new(format!("length {n} is out of range; IP lengths are 0..=65535")).with_source(source)
        }),
        Scalar::Str(text) => {
            let (start, end) = match text.split_once('-') {
                Some((start, end)) => (number(start)?, number(end)?),
                None => (number(text)?, number(text)?),
            };
            if start > end {
                return Err(Problem::new(format!(
                    "length range {text:?} is reversed; the start must not be above the end: \"{end}-{start}\""
                )));
            }
            Ok(PortRange { start, end })
        }
    }
}

/// TCP flags by name, with their bits in the header's flags byte (RFC 9293, RFC 3168).
const TCP_FLAGS: [(&str, u8); 8] = [
    ("fin", 0x01),
    ("syn", 0x02),
    ("rst", 0x04),
    ("psh", 0x08),
    ("ack", 0x10),
    ("urg", 0x20),
    ("ece", 0x40),
    ("cwr", 0x80),
];
/// The flags a list without a mask is compared on: all but ECN's (ECE and CWR ride on any
/// segment of an ECN connection, SYNs and pure ACKs included).
const TCP_FLAGS_PLAIN_MASK: u8 = 0x3f;
/// The shorthand for seed 003's ACK class.
const PURE_ACK: &str = "pure-ack";

/// `tcp_flags`: `"pure-ack"`, or a list of flag names (`"syn,ack"`), optionally followed by
/// `/` and a mask list (`"syn / syn,ack"`). A list alone is compared with the six flags but
/// ECE and CWR; with a mask, the flags in the mask are compared with the list (nftables'
/// `tcp flags & (syn | ack) == syn`).
pub(super) fn parse_tcp_flags(text: &str) -> Result<TcpFlags, Problem> {
    let valid = || {
        format!(
            "expected \"{PURE_ACK}\" (ACK alone, no payload), flag names joined by ',' (e.g. \"syn\", \"syn,ack\": exactly those among fin, syn, rst, psh, ack, urg), or FLAGS / MASK (e.g. \"syn / syn,ack\": of the flags in MASK, exactly FLAGS set); flags: {}",
            list(TCP_FLAGS.iter().map(|&(name, _)| name))
        )
    };
    let bits = |names: &str| -> Result<u8, Problem> {
        names.split([',', '|']).map(str::trim).filter(|n| !n.is_empty()).try_fold(0u8, |acc, name| {
            TCP_FLAGS
                .iter()
                .find(|(flag, _)| flag.eq_ignore_ascii_case(name))
                .map(|&(_, bit)| acc | bit)
                .ok_or_else(|| Problem::new(format!("unknown TCP flag {name:?} in {text:?}; {}", valid())))
        })
    };
    let trimmed = text.trim();
    if trimmed.eq_ignore_ascii_case(PURE_ACK) {
        return Ok(TcpFlags { value: 0x10, mask: TCP_FLAGS_PLAIN_MASK, no_payload: true });
    }
    let (value, mask) = match trimmed.split_once('/') {
        Some((value, mask)) => (bits(value)?, bits(mask)?),
        None => (bits(trimmed)?, TCP_FLAGS_PLAIN_MASK),
    };
    if mask == 0 {
        return Err(Problem::new(format!("tcp_flags {text:?} tests no flag; {}", valid())));
    }
    if trimmed.split_once('/').is_none() && value == 0 {
        return Err(Problem::new(format!("tcp_flags {text:?} names no flag; {}", valid())));
    }
    if value & !mask != 0 {
        let outside = TCP_FLAGS.iter().filter(|&&(_, bit)| value & !mask & bit != 0).map(|&(name, _)| name);
        return Err(Problem::new(format!(
            "tcp_flags {text:?}: {} not in the mask, so the rule would never match; add {} to the mask after '/'",
            list(outside.clone()),
            list(outside)
        )));
    }
    Ok(TcpFlags { value, mask, no_payload: false })
}

/// ICMP (IPv4) and `ICMPv6` type names (RFC 792, RFC 4443, RFC 4861).
const ICMP_TYPES: [(&str, u8); 4] =
    [("echo-reply", 0), ("destination-unreachable", 3), ("echo-request", 8), ("time-exceeded", 11)];
const ICMPV6_TYPES: [(&str, u8); 9] = [
    ("destination-unreachable", 1),
    ("packet-too-big", 2),
    ("time-exceeded", 3),
    ("echo-request", 128),
    ("echo-reply", 129),
    ("router-solicitation", 133),
    ("router-advertisement", 134),
    ("neighbor-solicitation", 135),
    ("neighbor-advertisement", 136),
];

/// `icmp_type`: a number 0..=255 or a name, of ICMP (`v6` false) or `ICMPv6` (`v6` true).
pub(super) fn parse_icmp_type(value: &Scalar, v6: bool) -> Result<u8, Problem> {
    let (table, proto): (&[(&str, u8)], &str) = if v6 { (&ICMPV6_TYPES, "icmpv6") } else { (&ICMP_TYPES, "icmp") };
    let names = || list(table.iter().map(|&(name, _)| name));
    match value {
        Scalar::Int(n) => u8::try_from(*n).map_err(|source| {
            Problem::new(format!("ICMP type {n} is out of range; expected 0..=255 or a {proto} type name: {}", names()))
                .with_source(source)
        }),
        Scalar::Str(text) => {
            let text = text.trim();
            if let Some(&(_, number)) = table.iter().find(|(name, _)| name.eq_ignore_ascii_case(text)) {
                return Ok(number);
            }
            text.parse::<u8>().map_err(|source| {
                Problem::new(format!("unknown {proto} type {text:?}; expected a number 0..=255 or one of {}", names()))
                    .with_source(source)
            })
        }
    }
}

/// `src_mac`: six hexadecimal bytes separated by ':' or '-'; not all zero (what a packet
/// without an Ethernet header has).
pub(super) fn parse_mac(text: &str) -> Result<[u8; 6], Problem> {
    let invalid = || {
        Problem::new(format!(
            "{text:?} is not a MAC address; expected six hexadecimal bytes separated by ':', e.g. \"02:00:00:00:01:10\""
        ))
    };
    let mut mac = [0u8; 6];
    let mut parts = text.trim().split([':', '-']);
    for byte in &mut mac {
        let part = parts.next().ok_or_else(invalid)?;
        if part.is_empty() || part.len() > 2 {
            return Err(invalid());
        }
        *byte = u8::from_str_radix(part, 16).map_err(|source| invalid().with_source(source))?;
    }
    if parts.next().is_some() {
        return Err(invalid());
    }
    if mac == [0; 6] {
        return Err(Problem::new(format!(
            "{text:?} is the all-zero address, which no host sends from (it stands for \"no Ethernet header\" in the datapath); give the host's MAC address"
        )));
    }
    Ok(mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_duration_units() {
        assert_eq!(parse_duration("100ns"), Ok(Duration::from_nanos(100)));
        assert_eq!(parse_duration("250us"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("250µs"), Ok(Duration::from_micros(250)));
        assert_eq!(parse_duration("10ms"), Ok(Duration::from_millis(10)));
        assert_eq!(parse_duration(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration(" 2 s "), Ok(Duration::from_secs(2)));
        assert_eq!(parse_duration("1.000000001s"), Ok(Duration::new(1, 1)));
        assert!(matches!(parse_duration("1.0000000001s"), Err(ParseDurationError::NotWhole(_))));
        assert!(matches!(parse_duration("10"), Err(ParseDurationError::MissingUnit(_))));
        assert!(matches!(parse_duration("10m"), Err(ParseDurationError::UnknownUnit { .. })));
        assert!(matches!(parse_duration(""), Err(ParseDurationError::Invalid(_))));
        assert_eq!(fmt_duration(Duration::from_millis(1)), "1ms");
        assert_eq!(fmt_duration(Duration::from_secs(10)), "10s");
        assert_eq!(fmt_duration(Duration::from_micros(1500)), "1500us");
        assert_eq!(fmt_duration(Duration::from_nanos(7)), "7ns");
    }
}
