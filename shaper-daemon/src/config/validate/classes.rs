//! The checks of each `[[class]]` table that need no other class.

use std::collections::HashMap;

use toml::Spanned;

use super::{ClassDraft, IfaceDraft, Validator};
use crate::config::error::{ConfigError, Problem};
use crate::config::model::{
    Aqm, Isolation, Marking, AQM_INTERVAL_RANGE, AQM_TARGET_RANGE, DEFAULT_AQM, DEFAULT_HORIZON, HORIZON_RANGE,
    MAX_CLASSES, MAX_PRIO,
};
use crate::config::raw::{Integer, RawClass, Scalar};
use crate::config::values::{check_class_name, duration_in, list, parse_dscp, parse_rate_spec};
use crate::rate::Rate;

impl Validator<'_> {
    /// The classes, in file order, each checked on its own and its name unique.
    pub(super) fn classes(
        &self,
        raw: &[Spanned<RawClass>],
        interfaces: &[IfaceDraft],
    ) -> Result<Vec<ClassDraft>, ConfigError> {
        if raw.len() > MAX_CLASSES {
            return Err(self.error(
                self.line(&raw[MAX_CLASSES]),
                format!("class[{MAX_CLASSES}]"),
                format!("too many classes ({}); at most {MAX_CLASSES} are supported across all interfaces", raw.len()),
            ));
        }
        let mut seen: HashMap<String, usize> = HashMap::new();
        let mut drafts = Vec::with_capacity(raw.len());
        for (i, spanned) in raw.iter().enumerate() {
            let draft = self.class(i, spanned, interfaces)?;
            if let Some(first) = seen.insert(draft.name.clone(), draft.line) {
                let name_line = raw[i].get_ref().name.as_ref().map_or(draft.line, |n| self.line(n));
                return Err(self.error(
                    name_line,
                    format!("class[{i}].name"),
                    format!("class {:?} is already defined at line {first}; class names must be unique", draft.name),
                ));
            }
            drafts.push(draft);
        }
        Ok(drafts)
    }

    /// The checks of one class that need no other class.
    #[expect(clippy::too_many_lines, reason = "one check after another, in the order of the keys")]
    fn class(
        &self,
        i: usize,
        spanned: &Spanned<RawClass>,
        interfaces: &[IfaceDraft],
    ) -> Result<ClassDraft, ConfigError> {
        let line = self.line(spanned);
        let class = spanned.get_ref();
        let key = |field: &str| format!("class[{i}].{field}");

        let name =
            self.required(class.name.as_ref(), &key("name"), line, "give the class a name, e.g. name = \"guest\"")?;
        self.check(&key("name"), name, |n| check_class_name(n))?;
        let name = name.get_ref().clone();

        let names = || list(interfaces.iter().map(|i| i.name.as_str()));
        let interface = match &class.interface {
            Some(iface) => self.check(&key("interface"), iface, |wanted| {
                interfaces
                    .iter()
                    .position(|i| i.name == *wanted)
                    .ok_or_else(|| Problem::new(format!("no interface named {wanted:?}; configured interfaces: {}", names())))
            })?,
            None if interfaces.len() == 1 => 0,
            None => {
                return Err(self.error(
                    line,
                    key("interface"),
                    format!(
                        "missing; there are {} interfaces ({}), so each class must say which one it belongs to, e.g. interface = {:?}",
                        interfaces.len(),
                        names(),
                        interfaces[0].name
                    ),
                ))
            }
        };

        let rate = self.required(
            class.rate.as_ref(),
            &key("rate"),
            line,
            "give the class a guaranteed rate, e.g. rate = \"1mbit\" or rate = \"10%\" (of its parent's rate)",
        )?;
        let rate_line = self.line(rate);
        let rate_spec = self.check(&key("rate"), rate, parse_rate_spec)?;
        let ceil_spec = match &class.ceil {
            Some(ceil) => Some((self.check(&key("ceil"), ceil, parse_rate_spec)?, self.line(ceil))),
            None => None,
        };

        let prio = match &class.prio {
            None => 0,
            Some(prio) => self.check(&key("prio"), prio, |&Integer(p)| {
                u8::try_from(p).ok().filter(|&p| p <= MAX_PRIO).ok_or_else(|| {
                    Problem::new(format!("prio {p} is out of range; expected 0..={MAX_PRIO} (lower is served first)"))
                })
            })?,
        };
        let weight = match &class.weight {
            None => None,
            Some(weight) => Some(self.check(&key("weight"), weight, |&Integer(w)| {
                u32::try_from(w).ok().filter(|&w| w > 0).ok_or_else(|| {
                    Problem::new(format!("weight {w} is invalid; expected a positive integer up to {}", u32::MAX))
                })
            })?),
        };
        let horizon = match &class.horizon {
            None => DEFAULT_HORIZON,
            Some(horizon) => {
                self.check(&key("horizon"), horizon, |v| duration_in(v, "horizon", &HORIZON_RANGE, "2s"))?
            }
        };
        let target = match &class.aqm_target {
            None => DEFAULT_AQM.target,
            Some(t) => self.check(&key("aqm_target"), t, |v| duration_in(v, "aqm_target", &AQM_TARGET_RANGE, "5ms"))?,
        };
        let interval = match &class.aqm_interval {
            None => DEFAULT_AQM.interval,
            Some(i) => {
                self.check(&key("aqm_interval"), i, |v| duration_in(v, "aqm_interval", &AQM_INTERVAL_RANGE, "100ms"))?
            }
        };
        if target >= interval {
            let at = class.aqm_target.as_ref().or(class.aqm_interval.as_ref()).map_or(line, |s| self.line(s));
            return Err(self.error(
                at,
                key("aqm_target"),
                format!("aqm_target {target:?} must be below aqm_interval {interval:?} (CoDel: e.g. 5ms and 100ms)"),
            ));
        }
        let aqm = match class.aqm.as_ref().map(|a| *a.get_ref()) {
            Some(false) => None,
            _ => Some(Aqm { target, interval }),
        };
        let isolation = match &class.isolation {
            None => Isolation::Host,
            Some(i) => self.check(&key("isolation"), i, |i| match i.as_str() {
                "host" => Ok(Isolation::Host),
                "flow" => Ok(Isolation::Flow),
                "none" => Ok(Isolation::None),
                other => Err(Problem::new(format!(
                    "isolation {other:?} is not one of \"host\" (share the class fairly between its hosts), \"flow\" (between its flows) and \"none\""
                ))),
            })?,
        };
        let dscp = |field: &str, value: &Option<Spanned<Scalar>>| {
            value
                .as_ref()
                .map(|v| {
                    self.check(&key(field), v, |v| match v {
                        Scalar::Str(s) if s.trim() == "wash" => Ok(0),
                        v => parse_dscp(v),
                    })
                })
                .transpose()
        };
        let marking =
            Marking { set: dscp("set_dscp", &class.set_dscp)?, over: dscp("set_dscp_over", &class.set_dscp_over)? };

        Ok(ClassDraft {
            name,
            line,
            interface,
            parent_name: class.parent.clone(),
            parent: None,
            rate_spec,
            rate_line,
            ceil_spec,
            rate: Rate::ZERO,
            ceil: Rate::ZERO,
            prio,
            weight,
            horizon,
            aqm,
            isolation,
            marking,
            children: Vec::new(),
        })
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;
    use std::time::Duration;

    use crate::config::test_util::{fails, fails_at, line_of, ok, GUEST, IFACE};
    use crate::config::{Aqm, DEFAULT_AQM, MAX_CLASSES};

    #[test]
    fn class_rate_zero_or_missing() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"0bit\"\n");
        fails_at(&text, "rate = \"0bit\"", "class[0].rate", &["rate is 0", "rate = \"1mbit\""]);
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\n");
        fails_at(&text, "[[class]]", "class[0].rate", &["missing", "rate = \"1mbit\""]);
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"0%\"\n");
        fails_at(&text, "rate = \"0%\"", "class[0].rate", &["out of range"]);
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"0.01%\"\n").replace("10mbit", "9999bit");
        fails_at(&text, "rate = \"0.01%\"", "class[0].rate", &["rounds down to 0bit"]);
        let text = format!("{IFACE}[[class]]\nrate = \"1mbit\"\n");
        fails_at(&text, "[[class]]", "class[0].name", &["missing"]);
    }

    #[test]
    fn duplicate_class() {
        let text = format!("{IFACE}{GUEST}{GUEST}");
        fails(
            &text,
            line_of(&text, "name = \"guest\"", 1),
            "class[1].name",
            &["\"guest\" is already defined", &format!("line {}", line_of(&text, "[[class]]", 0))],
        );
    }

    #[test]
    fn bad_class_names() {
        for name in ["", "-x", "a b", "é", &"x".repeat(65)] {
            let text = format!("{IFACE}{GUEST}[[class]]\nname = \"{name}\"\nrate = \"1kbit\"\n");
            fails(&text, line_of(&text, "name = ", 2), "class[1].name", &["invalid class name", "letters, digits"]);
        }
        let text = format!("{IFACE}{GUEST}[[class]]\nname = \"Room_2.b-c\"\nrate = \"1kbit\"\n");
        ok(&text);
    }

    #[test]
    fn class_interface() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\ninterface = \"wan9\"\nrate = \"1mbit\"\n");
        fails_at(&text, "wan9", "class[0].interface", &["no interface named \"wan9\"", "lan0"]);
        let two = format!("{IFACE}[[interface]]\nname = \"wan0\"\nrate = \"1mbit\"\ndefault = \"w\"\n[[class]]\nname = \"w\"\ninterface = \"wan0\"\nrate = \"1mbit\"\n{GUEST}");
        fails(
            &two,
            line_of(&two, "[[class]]", 1),
            "class[1].interface",
            &["missing", "2 interfaces (lan0, wan0)", "interface = \"lan0\""],
        );
        let fixed = two.replace("name = \"guest\"", "name = \"guest\"\ninterface = \"lan0\"");
        assert_eq!(ok(&fixed).class("guest").unwrap().interface, "lan0");
    }

    #[test]
    fn prio_and_weight() {
        let text = |extra: &str| format!("{IFACE}{GUEST}{extra}\n");
        fails_at(&text("prio = 8"), "prio", "class[0].prio", &["prio 8 is out of range", "0..=7"]);
        fails_at(&text("prio = -1"), "prio", "class[0].prio", &["out of range"]);
        assert_eq!(ok(&text("prio = 7")).classes[0].prio, 7);
        fails_at(&text("weight = 0"), "weight", "class[0].weight", &["weight 0 is invalid", "positive integer"]);
        fails_at(&text("weight = -3"), "weight", "class[0].weight", &["positive integer"]);
        fails_at(&text("weight = 4294967296"), "weight", "class[0].weight", &["positive integer"]);
        assert_eq!(ok(&text("weight = 4294967295")).classes[0].weight, Some(u32::MAX));
    }

    #[test]
    fn too_many_classes() {
        let mut text = IFACE.replace("10mbit", "10gbit");
        for n in 0..=MAX_CLASSES {
            let _ = write!(text, "[[class]]\nname = \"c{n}\"\nrate = \"1kbit\"\n");
        }
        let line = line_of(&text, "[[class]]", MAX_CLASSES);
        let (key, count, most) = (
            format!("class[{MAX_CLASSES}]"),
            format!("too many classes ({})", MAX_CLASSES + 1),
            format!("at most {MAX_CLASSES}"),
        );
        fails(&text, line, &key, &[&count, &most]);
        // Exactly the maximum is fine.
        let cut = text.lines().take(line - 1).collect::<Vec<_>>().join("\n");
        let cut = cut.replace("default = \"guest\"", "default = \"c0\"");
        assert_eq!(ok(&cut).classes.len(), MAX_CLASSES);
    }

    #[test]
    fn aqm_settings() {
        let with = |extra: &str| format!("{IFACE}{GUEST}{extra}\n");
        assert_eq!(ok(&with("")).classes[0].aqm, Some(DEFAULT_AQM));
        assert_eq!(ok(&with("aqm = false")).classes[0].aqm, None);
        let custom = ok(&with("aqm_target = \"2ms\"\naqm_interval = \"50ms\""));
        assert_eq!(
            custom.classes[0].aqm,
            Some(Aqm { target: Duration::from_millis(2), interval: Duration::from_millis(50) })
        );
        fails_at(&with("aqm_target = \"200ms\""), "aqm_target", "class[0].aqm_target", &["below aqm_interval"]);
        fails_at(&with("aqm_target = \"5s\""), "aqm_target", "class[0].aqm_target", &["out of range"]);
        fails_at(&with("aqm_interval = \"20s\""), "aqm_interval", "class[0].aqm_interval", &["out of range"]);
    }
    #[test]
    fn dscp_marking() {
        use crate::config::model::Marking;
        let with = |extra: &str| format!("{IFACE}{GUEST}{extra}\n");
        assert_eq!(ok(&with("")).classes[0].marking, Marking::default());
        let both = ok(&with("set_dscp = \"af11\"\nset_dscp_over = 8"));
        assert_eq!(both.classes[0].marking, Marking { set: Some(10), over: Some(8) });
        assert_eq!(ok(&with("set_dscp = \"wash\"")).classes[0].marking, Marking { set: Some(0), over: None });
        fails_at(&with("set_dscp = 64"), "set_dscp", "class[0].set_dscp", &["DSCP 64 is out of range", "af41"]);
        fails_at(
            &with("set_dscp_over = \"gold\""),
            "set_dscp_over",
            "class[0].set_dscp_over",
            &["unknown DSCP \"gold\""],
        );
    }
}
