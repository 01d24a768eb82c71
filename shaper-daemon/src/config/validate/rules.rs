//! The checks of each `[[rule]]` table: its class a leaf, its match fields valid and
//! consistent with one another (a rule whose fields no packet can have at once is an error,
//! not a rule that silently never matches).

use std::collections::HashMap;

use ipnet::IpNet;
use toml::Spanned;

use super::{positions, ClassDraft, Validator};
use crate::config::error::{ConfigError, Problem};
use crate::config::model::Rule;
use crate::config::raw::{RawRule, Scalar};
use crate::config::values::{
    list, parse_dscp, parse_icmp_type, parse_len, parse_mac, parse_mark, parse_net, parse_ports, parse_proto,
    parse_tcp_flags, proto_name, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP,
};

/// Checks that a rule's `class` names a leaf class (`index`: the classes' positions by name).
fn rule_class(wanted: &str, classes: &[ClassDraft], index: &HashMap<&str, usize>) -> Result<String, Problem> {
    let leaves = || list(classes.iter().filter(|c| c.children.is_empty()).map(|c| c.name.as_str()));
    let Some(class) = index.get(wanted).map(|&n| &classes[n]) else {
        return Err(Problem::new(format!("no class named {wanted:?}; expected a leaf class: {}", leaves())));
    };
    if !class.children.is_empty() {
        return Err(Problem::new(format!(
            "class {wanted:?} has child classes ({}); rules must name a leaf class: {}",
            list(class.children.iter().map(|&c| classes[c].name.as_str())),
            leaves()
        )));
    }
    Ok(wanted.to_owned())
}

impl Validator<'_> {
    /// The rules, in file order.
    pub(super) fn rules(&self, raw: &[Spanned<RawRule>], classes: &[ClassDraft]) -> Result<Vec<Rule>, ConfigError> {
        let by_name = positions(classes);
        raw.iter().enumerate().map(|(i, rule)| self.rule(i, rule, classes, &by_name)).collect()
    }

    /// Checks rule number `index`: its class, then each match field.
    fn rule(
        &self,
        index: usize,
        spanned: &Spanned<RawRule>,
        classes: &[ClassDraft],
        by_name: &HashMap<&str, usize>,
    ) -> Result<Rule, ConfigError> {
        let line = self.line(spanned);
        let raw = spanned.get_ref();
        let key = |field: &str| format!("rule[{index}].{field}");
        let class = self.required(
            raw.class.as_ref(),
            &key("class"),
            line,
            "name the leaf class this rule sends packets to, e.g. class = \"guest\"",
        )?;
        let class = self.check(&key("class"), class, |wanted| rule_class(wanted, classes, by_name))?;

        let net = |field: &str, value: &Option<Spanned<String>>| {
            value.as_ref().map(|v| self.check(&key(field), v, |text| parse_net(text))).transpose()
        };
        let src = net("src", &raw.src)?;
        let dst = net("dst", &raw.dst)?;
        if let (Some(src), Some(dst), Some(dst_value)) = (src, dst, &raw.dst) {
            if matches!(src, IpNet::V4(_)) != matches!(dst, IpNet::V4(_)) {
                return Err(self.error(
                    self.line(dst_value),
                    key("dst"),
                    format!("{dst} and src {src} are of different address families; a packet has one family, so use both IPv4 or both IPv6 (write two rules to match both)"),
                ));
            }
        }

        let proto = raw.proto.as_ref().map(|v| self.check(&key("proto"), v, parse_proto)).transpose()?;
        if let (Some(proto @ (PROTO_ICMP | PROTO_ICMPV6)), Some(proto_value)) = (proto, &raw.proto) {
            let wrong_family = src.or(dst).filter(|net| matches!(net, IpNet::V4(_)) == (proto == PROTO_ICMPV6));
            if let Some(net) = wrong_family {
                let (want, family) = if proto == PROTO_ICMP { ("icmpv6", "IPv6") } else { ("icmp", "IPv4") };
                return Err(self.error(
                    self.line(proto_value),
                    key("proto"),
                    format!("proto {} never matches {family} network {net}; use proto = \"{want}\"", proto_name(proto)),
                ));
            }
        }

        let mut ports = [None, None];
        for (slot, (field, value)) in ports.iter_mut().zip([("sport", &raw.sport), ("dport", &raw.dport)]) {
            let Some(value) = value else { continue };
            let range = self.check(&key(field), value, parse_ports)?;
            if let Some(p) = proto.filter(|&p| p != PROTO_TCP && p != PROTO_UDP) {
                return Err(self.error(
                    self.line(value),
                    key(field),
                    format!("{field} needs proto tcp or udp (or no proto), but this rule has proto = {:?}; remove {field} or change proto", proto_name(p)),
                ));
            }
            *slot = Some(range);
        }

        let mark = raw.mark.as_ref().map(|v| self.check(&key("mark"), v, parse_mark)).transpose()?;
        let dscp = raw.dscp.as_ref().map(|v| self.check(&key("dscp"), v, parse_dscp)).transpose()?;
        let len = raw.len.as_ref().map(|v| self.check(&key("len"), v, parse_len)).transpose()?;
        let src_mac = raw.src_mac.as_ref().map(|v| self.check(&key("src_mac"), v, |t| parse_mac(t))).transpose()?;

        let tcp_flags = match &raw.tcp_flags {
            None => None,
            Some(value) => {
                let flags = self.check(&key("tcp_flags"), value, |t| parse_tcp_flags(t))?;
                if let Some(p) = proto.filter(|&p| p != PROTO_TCP) {
                    return Err(self.error(
                        self.line(value),
                        key("tcp_flags"),
                        format!("tcp_flags needs proto tcp (or no proto: tcp_flags matches TCP packets only), but this rule has proto = {:?}; remove tcp_flags or change proto", proto_name(p)),
                    ));
                }
                Some(flags)
            }
        };

        let icmp_type = match &raw.icmp_type {
            None => None,
            Some(value) => Some(self.icmp_type(index, value, proto, src.or(dst), raw)?),
        };

        Ok(Rule {
            index,
            line,
            class,
            src,
            dst,
            proto,
            sport: ports[0],
            dport: ports[1],
            mark,
            dscp,
            len,
            tcp_flags,
            icmp_type,
            src_mac,
        })
    }

    /// Checks rule `index`'s `icmp_type`: ICMP's or `ICMPv6`'s, as `proto` or the family of
    /// the rule's network `net` says, and without fields only other protocols have.
    fn icmp_type(
        &self,
        index: usize,
        value: &Spanned<Scalar>,
        proto: Option<u8>,
        net: Option<IpNet>,
        raw: &RawRule,
    ) -> Result<u8, ConfigError> {
        let key = format!("rule[{index}].icmp_type");
        let fail = |message: String| Err(self.error(self.line(value), key.clone(), message));
        let v6 = match (proto, net) {
            (Some(PROTO_ICMP), _) => false,
            (Some(PROTO_ICMPV6), _) => true,
            (Some(p), _) => {
                return fail(format!(
                    "icmp_type needs proto icmp or icmpv6, but this rule has proto = {:?}; remove icmp_type or change proto",
                    proto_name(p)
                ))
            }
            (None, Some(net)) => matches!(net, IpNet::V6(_)),
            (None, None) => {
                return fail(
                    "icmp_type needs proto = \"icmp\" or \"icmpv6\" (or a src or dst network, whose family says which): the two number their types differently".to_owned(),
                )
            }
        };
        let field =
            [("sport", raw.sport.is_some()), ("dport", raw.dport.is_some()), ("tcp_flags", raw.tcp_flags.is_some())]
                .into_iter()
                .find_map(|(field, set)| set.then_some(field));
        if let Some(field) = field {
            return fail(format!(
                "icmp_type and {field} never match the same packet (an ICMP packet has no ports nor TCP flags); write two rules"
            ));
        }
        self.check(&key, value, |v| parse_icmp_type(v, v6))
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;

    use super::*;
    use crate::config::test_util::{fails, fails_at, line_of, ok, parse, GUEST, IFACE};
    use crate::config::PortRange;
    use crate::rules::TcpFlags;

    /// [`IFACE`] with a tree: house (a parent) with room, and guest.
    fn with_rule(rule: &str) -> String {
        format!(
            "{IFACE}{GUEST}[[class]]\nname = \"house\"\nrate = \"2mbit\"\n[[class]]\nname = \"room\"\nparent = \"house\"\nrate = \"1mbit\"\n\n[[rule]]\nclass = \"room\"\n\n[[rule]]\n{rule}\n"
        )
    }

    #[test]
    fn rule_class() {
        fails_at(
            &with_rule("class = \"nobody\""),
            "nobody",
            "rule[1].class",
            &["no class named \"nobody\"", "guest, room"],
        );
        fails_at(
            &with_rule("class = \"house\""),
            "class = \"house\"",
            "rule[1].class",
            &["\"house\" has child classes (room)", "leaf class: guest, room"],
        );
        let text = with_rule("src = \"10.0.0.1\"");
        fails(&text, line_of(&text, "[[rule]]", 1), "rule[1].class", &["missing", "class = \"guest\""]);
        let config = ok(&with_rule("class = \"guest\""));
        assert_eq!(config.rules[1].index, 1);
        assert_eq!(config.rules[1].line, line_of(&with_rule(""), "[[rule]]", 1));
        // A rule with no match field is a catch-all.
        assert_eq!(
            config.rules[1],
            Rule {
                index: 1,
                line: config.rules[1].line,
                class: "guest".into(),
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
                src_mac: None
            }
        );
    }

    #[test]
    fn rule_networks() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        let config = ok(&rule("src = \"192.168.1.0/24\"\ndst = \"10.0.0.1\""));
        assert_eq!(config.rules[1].src, Some("192.168.1.0/24".parse().unwrap()));
        assert_eq!(config.rules[1].dst, Some("10.0.0.1/32".parse().unwrap()));
        let config = ok(&rule("src = \"fd00:1::110\"\ndst = \"fd00::/8\""));
        assert_eq!(config.rules[1].src, Some("fd00:1::110/128".parse().unwrap()));
        fails_at(
            &rule("src = \"192.168.1.300\""),
            "src",
            "rule[1].src",
            &["not an IP address or a CIDR network", "192.168.1.0/24"],
        );
        fails_at(&rule("dst = \"10.0.0.0/33\""), "dst", "rule[1].dst", &["not a CIDR network"]);
        fails_at(&rule("src = \"192.168.1.5/24\""), "src", "rule[1].src", &["host bits set", "\"192.168.1.0/24\""]);
        fails_at(&rule("src = \"fd00:1::110/64\""), "src", "rule[1].src", &["host bits set", "\"fd00:1::/64\""]);
        fails_at(
            &rule("src = \"10.0.0.0/8\"\ndst = \"fd00::/8\""),
            "dst",
            "rule[1].dst",
            &["different address families"],
        );
        let e = parse(&rule("src = \"nonsense\"")).unwrap_err();
        assert!(StdError::source(&e).is_some(), "the address parse error is kept");
    }

    #[test]
    fn rule_ports() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        let config = ok(&rule("proto = \"udp\"\nsport = \"53\"\ndport = \" 1024 - 65535 \""));
        assert_eq!(config.rules[1].sport, Some(PortRange { start: 53, end: 53 }));
        assert_eq!(config.rules[1].dport, Some(PortRange { start: 1024, end: 65535 }));
        assert_eq!(ok(&rule("dport = 0")).rules[1].dport, Some(PortRange { start: 0, end: 0 }));
        assert_eq!(ok(&rule("proto = 6\ndport = 80")).rules[1].proto, Some(6));
        fails_at(&rule("dport = 70000"), "dport", "rule[1].dport", &["port 70000 is out of range", "0..=65535"]);
        fails_at(&rule("sport = \"70000\""), "sport", "rule[1].sport", &["port 70000 is out of range"]);
        fails_at(&rule("dport = \"1-99999999999999999999999\""), "dport", "rule[1].dport", &["out of range"]);
        fails_at(&rule("dport = -1"), "dport", "rule[1].dport", &["out of range"]);
        fails_at(&rule("dport = \"4095-3072\""), "dport", "rule[1].dport", &["reversed", "\"3072-4095\""]);
        fails_at(&rule("dport = \"http\""), "dport", "rule[1].dport", &["invalid port range", "\"A-B\""]);
        fails_at(&rule("dport = \"1-2-3\""), "dport", "rule[1].dport", &["invalid port range"]);
        fails_at(
            &rule("proto = \"icmp\"\ndport = 80"),
            "dport",
            "rule[1].dport",
            &["needs proto tcp or udp", "\"icmp\""],
        );
        fails_at(&rule("proto = \"sctp\"\nsport = 80"), "sport", "rule[1].sport", &["needs proto tcp or udp"]);
    }

    #[test]
    fn rule_proto() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        for (name, number) in [
            ("tcp", 6),
            ("UDP", 17),
            ("icmp", 1),
            ("icmpv6", 58),
            ("sctp", 132),
            ("gre", 47),
            ("esp", 50),
            ("\"47\"", 47),
        ] {
            let value = if name.starts_with('"') { name.to_owned() } else { format!("\"{name}\"") };
            assert_eq!(ok(&rule(&format!("proto = {value}"))).rules[1].proto, Some(number), "{name}");
        }
        assert_eq!(ok(&rule("proto = 255")).rules[1].proto, Some(255));
        fails_at(&rule("proto = 256"), "proto", "rule[1].proto", &["out of range", "0..=255", "tcp"]);
        fails_at(&rule("proto = \"tcpp\""), "proto", "rule[1].proto", &["unknown protocol \"tcpp\"", "udp"]);
        fails_at(
            &rule("proto = \"icmp\"\nsrc = \"fd00::/8\""),
            "proto",
            "rule[1].proto",
            &["never matches IPv6", "icmpv6"],
        );
        fails_at(
            &rule("proto = \"icmpv6\"\ndst = \"10.0.0.1\""),
            "proto",
            "rule[1].proto",
            &["never matches IPv4", "\"icmp\""],
        );
    }

    #[test]
    fn rule_mark() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        assert_eq!(ok(&rule("mark = 0x10")).rules[1].mark, Some(16));
        assert_eq!(ok(&rule("mark = 0xffffffff")).rules[1].mark, Some(u32::MAX));
        assert_eq!(ok(&rule("mark = 0")).rules[1].mark, Some(0));
        fails_at(&rule("mark = -1"), "mark", "rule[1].mark", &["out of range", "0xffffffff"]);
        fails_at(&rule("mark = 0x100000000"), "mark", "rule[1].mark", &["out of range"]);
        fails_at(&rule("mark = \"0x10\""), "mark", "rule[1].mark", &["is a string", "mark = 0x10"]);
    }

    #[test]
    fn rule_dscp() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        for (value, want) in [
            ("46", 46),
            ("0", 0),
            ("63", 63),
            ("\"ef\"", 46),
            ("\"EF\"", 46),
            ("\"le\"", 1),
            ("\"cs0\"", 0),
            ("\"cs1\"", 8),
            ("\"cs7\"", 56),
            ("\"af11\"", 10),
            ("\"af12\"", 12),
            ("\"af13\"", 14),
            ("\"af21\"", 18),
            ("\"af31\"", 26),
            ("\"af42\"", 36),
            ("\"af43\"", 38),
            ("\"12\"", 12),
        ] {
            assert_eq!(ok(&rule(&format!("dscp = {value}"))).rules[1].dscp, Some(want), "{value}");
        }
        fails_at(&rule("dscp = 64"), "dscp", "rule[1].dscp", &["DSCP 64 is out of range", "0..=63", "af41"]);
        fails_at(&rule("dscp = -1"), "dscp", "rule[1].dscp", &["out of range"]);
        for bad in ["cs8", "af14", "af51", "af1", "af111", "voice", "cs"] {
            fails_at(&rule(&format!("dscp = \"{bad}\"")), "dscp", "rule[1].dscp", &["unknown DSCP", "cs0..cs7"]);
        }
    }

    #[test]
    fn rule_len() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        assert_eq!(ok(&rule("len = \"0-63\"")).rules[1].len, Some(PortRange { start: 0, end: 63 }));
        assert_eq!(ok(&rule("len = 1500")).rules[1].len, Some(PortRange { start: 1500, end: 1500 }));
        assert_eq!(ok(&rule("len = \" 64 \"")).rules[1].len, Some(PortRange { start: 64, end: 64 }));
        fails_at(&rule("len = 70000"), "len", "rule[1].len", &["length 70000 is out of range", "0..=65535"]);
        fails_at(&rule("len = \"64-0\""), "len", "rule[1].len", &["reversed", "\"0-64\""]);
        fails_at(&rule("len = \"<64\""), "len", "rule[1].len", &["invalid length", "\"A-B\""]);
    }

    #[test]
    fn rule_tcp_flags() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        let flags = |value: &str| ok(&rule(&format!("tcp_flags = {value:?}"))).rules[1].tcp_flags.unwrap();
        let exactly = |value| TcpFlags { value, mask: 0x3f, no_payload: false };
        assert_eq!(flags("ack"), exactly(0x10));
        assert_eq!(flags("SYN"), exactly(0x02));
        assert_eq!(flags("syn,ack"), exactly(0x12));
        assert_eq!(flags(" syn | ack "), exactly(0x12));
        assert_eq!(flags("pure-ack"), TcpFlags { no_payload: true, ..exactly(0x10) });
        assert_eq!(flags("syn / syn,ack"), TcpFlags { value: 0x02, mask: 0x12, no_payload: false });
        assert_eq!(flags("syn/syn"), TcpFlags { value: 0x02, mask: 0x02, no_payload: false });
        assert_eq!(flags("/ rst"), TcpFlags { value: 0, mask: 0x04, no_payload: false });
        assert_eq!(
            flags("ack / fin,syn,rst,psh,ack,urg,ece,cwr"),
            TcpFlags { value: 0x10, mask: 0xff, no_payload: false }
        );
        assert_eq!(ok(&rule("proto = \"tcp\"\ntcp_flags = \"syn\"")).rules[1].proto, Some(6));
        fails_at(
            &rule("tcp_flags = \"sin\""),
            "tcp_flags",
            "rule[1].tcp_flags",
            &["unknown TCP flag \"sin\"", "pure-ack", "fin, syn"],
        );
        fails_at(
            &rule("tcp_flags = \"syn / ack\""),
            "tcp_flags",
            "rule[1].tcp_flags",
            &["syn not in the mask", "never match"],
        );
        fails_at(&rule("tcp_flags = \"\""), "tcp_flags", "rule[1].tcp_flags", &["names no flag"]);
        fails_at(&rule("tcp_flags = \"ack /\""), "tcp_flags", "rule[1].tcp_flags", &["tests no flag"]);
        fails_at(
            &rule("proto = \"udp\"\ntcp_flags = \"syn\""),
            "tcp_flags",
            "rule[1].tcp_flags",
            &["needs proto tcp", "\"udp\""],
        );
    }

    #[test]
    fn rule_icmp_type() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        let kind = |fields: &str| ok(&rule(fields)).rules[1].icmp_type;
        assert_eq!(kind("proto = \"icmp\"\nicmp_type = 8"), Some(8));
        assert_eq!(kind("proto = \"icmp\"\nicmp_type = \"echo-request\""), Some(8));
        assert_eq!(kind("proto = \"icmpv6\"\nicmp_type = \"echo-request\""), Some(128));
        assert_eq!(kind("dst = \"fd00::/8\"\nicmp_type = \"neighbor-solicitation\""), Some(135));
        assert_eq!(kind("src = \"10.0.0.0/8\"\nicmp_type = \"time-exceeded\""), Some(11));
        fails_at(&rule("icmp_type = 8"), "icmp_type", "rule[1].icmp_type", &["needs proto = \"icmp\" or \"icmpv6\""]);
        fails_at(
            &rule("proto = \"tcp\"\nicmp_type = 8"),
            "icmp_type",
            "rule[1].icmp_type",
            &["needs proto icmp or icmpv6", "\"tcp\""],
        );
        fails_at(
            &rule("proto = \"icmp\"\nicmp_type = 256"),
            "icmp_type",
            "rule[1].icmp_type",
            &["out of range", "echo-request"],
        );
        fails_at(
            &rule("proto = \"icmp\"\nicmp_type = \"neighbor-solicitation\""),
            "icmp_type",
            "rule[1].icmp_type",
            &["unknown icmp type", "echo-reply"],
        );
        fails_at(
            &rule("proto = \"icmp\"\ntcp_flags = \"syn\"\nicmp_type = 8"),
            "tcp_flags",
            "rule[1].tcp_flags",
            &["needs proto tcp"],
        );
        fails_at(
            &rule("tcp_flags = \"syn\"\nsrc = \"10.0.0.0/8\"\nicmp_type = 8"),
            "icmp_type",
            "rule[1].icmp_type",
            &["icmp_type and tcp_flags never match"],
        );
    }

    #[test]
    fn rule_src_mac() {
        let rule = |fields: &str| with_rule(&format!("class = \"guest\"\n{fields}"));
        let mac = |text: &str| ok(&rule(&format!("src_mac = {text:?}"))).rules[1].src_mac;
        assert_eq!(mac("02:00:00:00:01:10"), Some([2, 0, 0, 0, 1, 0x10]));
        assert_eq!(mac("AA-BB-CC-DD-EE-FF"), Some([0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xff]));
        for bad in ["02:00:00:00:01", "02:00:00:00:01:10:11", "02:00:00:00:01:1g", "020:00:00:00:01:10", "nonsense"] {
            fails_at(
                &rule(&format!("src_mac = {bad:?}")),
                "src_mac",
                "rule[1].src_mac",
                &["not a MAC address", "02:00:00:00:01:10"],
            );
        }
        fails_at(&rule("src_mac = \"00:00:00:00:00:00\""), "src_mac", "rule[1].src_mac", &["all-zero"]);
    }
}
