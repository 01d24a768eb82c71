//! The checks of each `[[rule]]` table: its class a leaf, its match fields valid and
//! consistent with one another.

use ipnet::IpNet;
use toml::Spanned;

use super::{ClassDraft, Validator};
use crate::config::error::{ConfigError, Problem};
use crate::config::model::Rule;
use crate::config::raw::RawRule;
use crate::config::values::{
    list, parse_dscp, parse_mark, parse_net, parse_ports, parse_proto, proto_name, PROTO_ICMP, PROTO_ICMPV6, PROTO_TCP,
    PROTO_UDP,
};

/// Checks that a rule's `class` names a leaf class.
fn rule_class(wanted: &str, classes: &[ClassDraft]) -> Result<String, Problem> {
    let leaves = || list(classes.iter().filter(|c| c.children.is_empty()).map(|c| c.name.as_str()));
    let Some(class) = classes.iter().find(|c| c.name == *wanted) else {
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
        raw.iter().enumerate().map(|(i, rule)| self.rule(i, rule, classes)).collect()
    }

    /// Checks rule number `index`: its class, then each match field.
    fn rule(&self, index: usize, spanned: &Spanned<RawRule>, classes: &[ClassDraft]) -> Result<Rule, ConfigError> {
        let line = self.line(spanned);
        let raw = spanned.get_ref();
        let key = |field: &str| format!("rule[{index}].{field}");
        let class = self.required(
            raw.class.as_ref(),
            &key("class"),
            line,
            "name the leaf class this rule sends packets to, e.g. class = \"guest\"",
        )?;
        let class = self.check(&key("class"), class, |wanted| rule_class(wanted, classes))?;

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

        Ok(Rule { index, line, class, src, dst, proto, sport: ports[0], dport: ports[1], mark, dscp })
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;

    use super::*;
    use crate::config::test_util::{fails, fails_at, line_of, ok, parse, GUEST, IFACE};
    use crate::config::PortRange;

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
                dscp: None
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
}
