//! The checks of each `[[interface]]` table on its own.

use std::collections::HashMap;

use toml::Spanned;

use super::{IfaceDraft, Validator};
use crate::config::error::{ConfigError, Problem};
use crate::config::model::{Direction, MAX_INTERFACES, OVERHEAD_RANGE};
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

            let direction = match &iface.direction {
                None => Direction::Upload,
                Some(d) => self.check(&key("direction"), d, |d| match d.as_str() {
                    "upload" => Ok(Direction::Upload),
                    "download" => Ok(Direction::Download),
                    other => Err(Problem::new(format!(
                        "direction {other:?} is not one of \"upload\" (the hosts send through it) and \"download\" (it carries traffic to the hosts)"
                    ))),
                })?,
            };

            drafts.push(IfaceDraft {
                name,
                rate,
                rate_line,
                default,
                overhead,
                replace_qdisc: iface.replace_qdisc.unwrap_or(false),
                direction,
            });
        }
        Ok(drafts)
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
}
