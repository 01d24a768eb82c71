//! The checks of each `[[interface]]` table on its own.

use std::collections::HashMap;

use toml::Spanned;

use super::{IfaceDraft, Validator};
use crate::config::error::{ConfigError, Problem};
use crate::config::model::{Direction, LinkLayer, MAX_INTERFACES, MPU_RANGE, OVERHEAD_RANGE};
use crate::config::raw::{Integer, RawInterface};
use crate::config::values::{check_ifname, parse_rate};
use crate::rate::Rate;

impl Validator<'_> {
    /// The interfaces, in file order, each checked on its own and its name unique.
    pub(super) fn interfaces(&self, raw: &[Spanned<RawInterface>]) -> Result<Vec<IfaceDraft>, ConfigError> {
        if raw.is_empty() {
            return Err(self.error(
                1,
                "interface",
                "no interface is configured; add an [[interface]] table with a name, a rate and a default class, e.g. name = \"eth0\", rate = \"100mbit\", default = \"bulk\"",
            ));
        }
        if raw.len() > MAX_INTERFACES {
            return Err(self.error(
                self.line(&raw[MAX_INTERFACES]),
                format!("interface[{MAX_INTERFACES}]"),
                format!("too many interfaces ({}); at most {MAX_INTERFACES} can be shaped", raw.len()),
            ));
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut drafts = Vec::with_capacity(raw.len());
        for (i, spanned) in raw.iter().enumerate() {
            let line = self.line(spanned);
            let iface = spanned.get_ref();
            let key = |field: &str| format!("interface[{i}].{field}");

            let name = self.required(
                iface.name.as_ref(),
                &key("name"),
                line,
                "name the network device to shape, e.g. name = \"eth0\"",
            )?;
            self.check(&key("name"), name, |n| check_ifname(n))?;
            let name_line = self.line(name);
            let name = name.get_ref().clone();
            if let Some(first) = seen.insert(name.clone(), name_line) {
                return Err(self.error(
                    name_line,
                    key("name"),
                    format!("interface {name:?} is already configured at line {first}; each interface has one [[interface]] table"),
                ));
            }

            let rate = self.required(
                iface.rate.as_ref(),
                &key("rate"),
                line,
                "give the link's capacity, e.g. rate = \"100mbit\"",
            )?;
            let rate_line = self.line(rate);
            let rate = self.check(&key("rate"), rate, |v| match parse_rate(v)? {
                r if r == Rate::ZERO => Err(Problem::new(
                    "rate is 0; an interface needs its positive link capacity, e.g. rate = \"100mbit\"",
                )),
                r => Ok(r),
            })?;

            let default = self
                .required(
                    iface.default.as_ref(),
                    &key("default"),
                    line,
                    "name the leaf class of packets that match no rule, e.g. default = \"bulk\"",
                )?
                .clone();

            let (overhead, mpu, linklayer) = self.framing(iface, key)?;

            let direction = match &iface.direction {
                None => Direction::Upload,
                Some(d) => self.check(&key("direction"), d, |d| match d.as_str() {
                    "upload" => Ok(Direction::Upload),
                    "download" => Ok(Direction::Download),
                    "ingress" => Ok(Direction::Ingress),
                    other => Err(Problem::new(format!(
                        "direction {other:?} is not one of \"upload\" (the hosts send through it), \"download\" (it carries traffic to the hosts) and \"ingress\" (what arrives on it is shaped, e.g. a WAN interface's download)"
                    ))),
                })?,
            };

            let lan = match &iface.lan {
                None => Vec::new(),
                Some(list) => self.lan(list, &key("lan"), &name, direction)?,
            };

            drafts.push(IfaceDraft {
                name,
                rate,
                rate_line,
                default,
                overhead,
                mpu,
                linklayer,
                replace_qdisc: iface.replace_qdisc.unwrap_or(false),
                direction,
                lan,
            });
        }
        self.ingress_not_lan(raw, &drafts)?;
        Ok(drafts)
    }

    /// An interface shaped on ingress is not also another's LAN side: both programs would sit
    /// at its ingress, and the redirect to its IFB device would take the packets away before
    /// their origins were recorded.
    fn ingress_not_lan(&self, raw: &[Spanned<RawInterface>], drafts: &[IfaceDraft]) -> Result<(), ConfigError> {
        for (i, draft) in drafts.iter().enumerate().filter(|(_, d)| d.direction == Direction::Ingress) {
            if let Some(upload) = drafts.iter().find(|d| d.lan.contains(&draft.name)) {
                let line = raw[i].get_ref().direction.as_ref().map_or_else(|| self.line(&raw[i]), |d| self.line(d));
                return Err(self.error(
                    line,
                    format!("interface[{i}].direction"),
                    format!(
                        "{:?} is shaped on ingress and is also in the lan list of {:?}; an interface is either where the hosts' packets arrive to be translated (lan) or where the download arrives (direction = \"ingress\"), not both",
                        draft.name, upload.name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// An interface's `overhead`, `mpu` and `linklayer`: how many bytes a packet takes on its
    /// line (see `shaper_common::frame_wire_len`).
    fn framing(
        &self,
        iface: &RawInterface,
        key: impl Fn(&str) -> String,
    ) -> Result<(i32, u32, LinkLayer), ConfigError> {
        let overhead = match &iface.overhead {
            None => 0,
            Some(overhead) => self.check(&key("overhead"), overhead, |&Integer(n)| {
                i32::try_from(n).ok().filter(|n| OVERHEAD_RANGE.contains(n)).ok_or_else(|| {
                    Problem::new(format!(
                        "overhead {n} is out of range; expected {}..={} bytes",
                        OVERHEAD_RANGE.start(),
                        OVERHEAD_RANGE.end()
                    ))
                })
            })?,
        };
        let mpu = match &iface.mpu {
            None => 0,
            Some(mpu) => self.check(&key("mpu"), mpu, |&Integer(n)| {
                u32::try_from(n).ok().filter(|n| MPU_RANGE.contains(n)).ok_or_else(|| {
                    Problem::new(format!(
                        "mpu {n} is out of range; expected {}..={} bytes (the least a packet counts, its overhead included)",
                        MPU_RANGE.start(),
                        MPU_RANGE.end()
                    ))
                })
            })?,
        };
        let linklayer = match &iface.linklayer {
            None => LinkLayer::Ethernet,
            Some(l) => self.check(&key("linklayer"), l, |l| match l.as_str() {
                "ethernet" => Ok(LinkLayer::Ethernet),
                "atm" => Ok(LinkLayer::Atm),
                "ptm" => Ok(LinkLayer::Ptm),
                other => Err(Problem::new(format!(
                    "linklayer {other:?} is not one of \"ethernet\" (frames as they are, the default), \"atm\" (ADSL: 48-byte cells in 53) and \"ptm\" (VDSL2: 64b/65b)"
                ))),
            })?,
        };
        Ok((overhead, mpu, linklayer))
    }

    /// An upload interface's `lan` list: the interfaces its hosts send from, each a valid
    /// name, other than the interface itself, and listed once.
    fn lan(
        &self,
        list: &Spanned<Vec<Spanned<String>>>,
        key: &str,
        iface: &str,
        direction: Direction,
    ) -> Result<Vec<String>, ConfigError> {
        if direction.towards_hosts() {
            let name = if direction == Direction::Ingress { "ingress" } else { "download" };
            return Err(self.error(
                self.line(list),
                key,
                format!(
                    "lan is for an upload interface, where the gateway translates its hosts' addresses; {iface:?} has direction = \"{name}\" (its packets' hosts are their destinations, which it sees untranslated)"
                ),
            ));
        }
        let mut names: Vec<String> = Vec::new();
        for (j, entry) in list.get_ref().iter().enumerate() {
            let at = format!("{key}[{j}]");
            self.check(&at, entry, |n| check_ifname(n))?;
            let name = entry.get_ref();
            if name == iface {
                return Err(self.error(
                    self.line(entry),
                    at,
                    format!("{name:?} is the interface itself; lan lists the interfaces its hosts send from, e.g. lan = [\"lan0\"]"),
                ));
            }
            if names.contains(name) {
                return Err(self.error(self.line(entry), at, format!("{name:?} is listed twice")));
            }
            names.push(name.clone());
        }
        Ok(names)
    }
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;
    use std::fmt::Write as _;

    use crate::config::test_util::{fails, fails_at, line_of, ok, parse, GUEST, IFACE};
    use crate::config::MAX_INTERFACES;

    #[test]
    fn no_interface() {
        fails("", 1, "interface", &["no interface", "[[interface]]"]);
        fails(GUEST, 1, "interface", &["no interface"]);
    }

    #[test]
    fn too_many_interfaces() {
        let mut text = String::new();
        for n in 0..=MAX_INTERFACES {
            let _ = write!(text, "[[interface]]\nname = \"eth{n}\"\nrate = \"1mbit\"\ndefault = \"c{n}\"\n");
        }
        let line = line_of(&text, "[[interface]]", MAX_INTERFACES);
        fails(&text, line, "interface[64]", &["too many interfaces (65)", "at most 64"]);
    }

    #[test]
    fn duplicate_interface() {
        let text = format!("{IFACE}{IFACE}{GUEST}");
        fails(
            &text,
            line_of(&text, "name = \"lan0\"", 1),
            "interface[1].name",
            &["\"lan0\" is already configured", &format!("line {}", line_of(&text, "name = \"lan0\"", 0))],
        );
    }

    #[test]
    fn bad_interface_names() {
        for (name, why) in [
            ("a-very-long-ifname", "longer than 15 bytes"),
            ("eth/0", "'/'"),
            ("eth 0", "whitespace"),
            ("eth:0", "':'"),
            ("", "is empty"),
            ("..", "not a valid device name"),
        ] {
            let text = format!("[[interface]]\nname = \"{name}\"\nrate = \"1mbit\"\ndefault = \"guest\"\n{GUEST}");
            fails(&text, 2, "interface[0].name", &[why, "1 to 15 bytes"]);
        }
        let text = format!("[[interface]]\nname = \"fifteen-chars-x\"\nrate = \"1mbit\"\ndefault = \"guest\"\n{GUEST}");
        assert_eq!(ok(&text).interfaces[0].name, "fifteen-chars-x");
    }

    #[test]
    fn interface_rate() {
        let iface = |rate: &str| {
            format!("[[interface]]\nname = \"lan0\"\n{rate}\ndefault = \"guest\"\n[[class]]\nname = \"guest\"\nrate = \"1kbit\"\n")
        };
        fails(&iface("rate = \"0mbit\""), 3, "interface[0].rate", &["rate is 0", "100mbit"]);
        fails(&iface("rate = 0"), 3, "interface[0].rate", &["rate is 0"]);
        fails(&iface(""), 1, "interface[0].rate", &["missing", "rate = \"100mbit\""]);
        fails(&iface("rate = \"50%\""), 3, "interface[0].rate", &["percentage", "absolute rate"]);
        fails(&iface("rate = \"10mb\""), 3, "interface[0].rate", &["unknown unit \"mb\"", "mbit"]);
        fails(&iface("rate = -5"), 3, "interface[0].rate", &["negative"]);
        assert_eq!(ok(&iface("rate = 1000000")).interfaces[0].rate, "1mbit".parse().unwrap());
        let e = parse(&iface("rate = \"10mb\"")).unwrap_err();
        let source = StdError::source(&e).expect("the rate error is kept");
        assert!(source.downcast_ref::<crate::rate::ParseRateError>().is_some());
    }

    #[test]
    fn interface_missing_name_and_default() {
        let text = format!("[[interface]]\nrate = \"1mbit\"\ndefault = \"guest\"\n{GUEST}");
        fails(&text, 1, "interface[0].name", &["missing", "name = \"eth0\""]);
        let text = format!("[[interface]]\nname = \"lan0\"\nrate = \"1mbit\"\n{GUEST}");
        fails(&text, 1, "interface[0].default", &["missing", "leaf class"]);
    }

    #[test]
    fn overhead_range() {
        let text = |o: i64| format!("{IFACE}overhead = {o}\n{GUEST}");
        assert_eq!(ok(&text(-64)).interfaces[0].overhead, -64);
        assert_eq!(ok(&text(256)).interfaces[0].overhead, 256);
        fails_at(&text(257), "overhead", "interface[0].overhead", &["out of range", "-64..=256"]);
        fails_at(&text(-65), "overhead", "interface[0].overhead", &["out of range"]);
        fails_at(&text(1 << 40), "overhead", "interface[0].overhead", &["out of range"]);
    }

    #[test]
    fn mpu_range() {
        let text = |m: &str| format!("{IFACE}mpu = {m}\n{GUEST}");
        assert_eq!(ok(&format!("{IFACE}{GUEST}")).interfaces[0].mpu, 0);
        assert_eq!(ok(&text("0")).interfaces[0].mpu, 0);
        assert_eq!(ok(&text("256")).interfaces[0].mpu, 256);
        fails_at(&text("257"), "mpu", "interface[0].mpu", &["mpu 257 is out of range", "0..=256 bytes"]);
        fails_at(&text("-1"), "mpu", "interface[0].mpu", &["out of range", "0..=256"]);
        fails_at(&text("\"64\""), "mpu", "interface[0].mpu", &["expected an integer (without quotes)"]);
    }

    #[test]
    fn linklayer_names() {
        use crate::config::model::LinkLayer;
        let text = |l: &str| format!("{IFACE}linklayer = \"{l}\"\n{GUEST}");
        assert_eq!(ok(&format!("{IFACE}{GUEST}")).interfaces[0].linklayer, LinkLayer::Ethernet);
        assert_eq!(ok(&text("ethernet")).interfaces[0].linklayer, LinkLayer::Ethernet);
        assert_eq!(ok(&text("atm")).interfaces[0].linklayer, LinkLayer::Atm);
        assert_eq!(ok(&text("ptm")).interfaces[0].linklayer, LinkLayer::Ptm);
        for bad in ["adsl", "ATM", ""] {
            fails_at(
                &text(bad),
                "linklayer",
                "interface[0].linklayer",
                &[&format!("linklayer {bad:?} is not one of"), "\"ethernet\"", "\"atm\"", "\"ptm\""],
            );
        }
        fails_at(
            &format!("{IFACE}linklayer = 1\n{GUEST}"),
            "linklayer",
            "interface[0].linklayer",
            &["expected a string"],
        );
    }

    /// The three keys of a PPPoE-over-ATM line, together.
    #[test]
    fn an_adsl_line() {
        use crate::config::model::LinkLayer;
        let text = format!("{IFACE}overhead = 40\nmpu = 0\nlinklayer = \"atm\"\n{GUEST}");
        let iface = &ok(&text).interfaces[0];
        assert_eq!((iface.overhead, iface.mpu, iface.linklayer), (40, 0, LinkLayer::Atm));
        assert_eq!(iface.linklayer.datapath(), shaper_common::LINKLAYER_ATM);
    }
    #[test]
    fn lan_side_interfaces() {
        let text = |lan: &str| format!("{IFACE}lan = {lan}\n{GUEST}");
        assert!(ok(&format!("{IFACE}{GUEST}")).interfaces[0].lan.is_empty());
        let config = ok(&text("[\"eth1\", \"wlan0\"]"));
        assert_eq!(config.interfaces[0].lan, ["eth1", "wlan0"]);
        assert_eq!(config.lan_interfaces(), ["eth1", "wlan0"]);
        fails_at(&text("[\"lan0\"]"), "lan =", "interface[0].lan[0]", &["\"lan0\" is the interface itself"]);
        fails_at(&text("[\"eth1\", \"eth1\"]"), "lan =", "interface[0].lan[1]", &["\"eth1\" is listed twice"]);
        fails_at(&text("[\"eth/1\"]"), "lan =", "interface[0].lan[0]", &["'/'", "1 to 15 bytes"]);
        fails_at(&text("\"eth1\""), "lan =", "interface[0].lan", &["expected a sequence"]);
        let download = format!("{IFACE}direction = \"download\"\nlan = [\"eth1\"]\n{GUEST}");
        fails_at(
            &download,
            "lan =",
            "interface[0].lan",
            &["lan is for an upload interface", "direction = \"download\""],
        );
    }

    /// `direction = "ingress"`: hosts are destinations, no `lan` list, and not another
    /// interface's LAN side.
    #[test]
    fn shaped_on_ingress() {
        use crate::config::model::Direction;
        let iface = &ok(&format!("{IFACE}direction = \"ingress\"\n{GUEST}")).interfaces[0];
        assert_eq!(iface.direction, Direction::Ingress);
        assert!(iface.direction.towards_hosts() && Direction::Download.towards_hosts());
        assert!(!Direction::Upload.towards_hosts());
        fails_at(
            &format!("{IFACE}direction = \"ingress\"\nlan = [\"eth1\"]\n{GUEST}"),
            "lan =",
            "interface[0].lan",
            &["lan is for an upload interface", "direction = \"ingress\""],
        );
        let both = format!(
            "{IFACE}lan = [\"wan0\"]\n{GUEST}[[interface]]\nname = \"wan0\"\nrate = \"1mbit\"\ndefault = \"down\"\ndirection = \"ingress\"\n[[class]]\nname = \"down\"\ninterface = \"wan0\"\nrate = \"1kbit\"\n"
        );
        fails_at(
            &both,
            "direction = \"ingress\"",
            "interface[1].direction",
            &["\"wan0\" is shaped on ingress", "lan list of \"lan0\""],
        );
    }
}
