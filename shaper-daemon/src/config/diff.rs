//! What differs between two configurations, in words: the lines a reload or a runtime
//! change logs and replies with.

use super::Config;

/// What differs between `old` and `new`, one line per change.
#[must_use]
pub fn describe_changes(old: &Config, new: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (o, n) in old.interfaces.iter().zip(&new.interfaces) {
        if o.rate != n.rate {
            out.push(format!("interface {}: rate {} -> {}", n.name, o.rate, n.rate));
        }
        if o.default_class != n.default_class {
            out.push(format!("interface {}: default {} -> {}", n.name, o.default_class, n.default_class));
        }
        if o.overhead != n.overhead {
            out.push(format!("interface {}: overhead {} -> {}", n.name, o.overhead, n.overhead));
        }
        if o.mpu != n.mpu {
            out.push(format!("interface {}: mpu {} -> {}", n.name, o.mpu, n.mpu));
        }
        if o.linklayer != n.linklayer {
            out.push(format!("interface {}: linklayer {} -> {}", n.name, o.linklayer, n.linklayer));
        }
    }
    let (old_at, new_at) = (old.class_positions(), new.class_positions());
    for n in &new.classes {
        let Some(o) = old_at.get(n.name.as_str()).map(|&p| &old.classes[p]) else {
            out.push(format!("class {}: added (rate {}, ceil {}, prio {})", n.name, n.rate, n.ceil, n.prio));
            continue;
        };
        let mut field = |what: &str, a: String, b: String| {
            if a != b {
                out.push(format!("class {}: {what} {a} -> {b}", n.name));
            }
        };
        field("rate", o.rate.to_string(), n.rate.to_string());
        field("ceil", o.ceil.to_string(), n.ceil.to_string());
        field("prio", o.prio.to_string(), n.prio.to_string());
        field("weight", format!("{:?}", o.weight), format!("{:?}", n.weight));
        field("parent", format!("{:?}", o.parent), format!("{:?}", n.parent));
        field("horizon", format!("{:?}", o.horizon), format!("{:?}", n.horizon));
        field("aqm", format!("{:?}", o.aqm), format!("{:?}", n.aqm));
    }
    for o in &old.classes {
        if !new_at.contains_key(o.name.as_str()) {
            out.push(format!("class {}: removed", o.name));
        }
    }
    if old.rules != new.rules {
        out.push(format!("rules: {} -> {} rules", old.rules.len(), new.rules.len()));
    }
    if old.daemon != new.daemon {
        out.push("[daemon] settings: changed; they take effect at the next start".to_owned());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::with_classes as config;

    #[test]
    fn changes_are_described_one_per_line() {
        let old = config(&["a", "b"]);
        let mut new = config(&["a", "c"]);
        new.classes[0].prio = 3;
        let changes = describe_changes(&old, &new);
        assert_eq!(
            changes,
            ["class a: prio 0 -> 3", "class c: added (rate 1mbit, ceil 10mbit, prio 0)", "class b: removed"]
        );
    }

    #[test]
    fn link_layer_changes_are_described() {
        let old = config(&["a"]);
        let mut new = old.clone();
        new.interfaces[0].overhead = 40;
        new.interfaces[0].mpu = 64;
        new.interfaces[0].linklayer = crate::config::LinkLayer::Atm;
        assert_eq!(
            describe_changes(&old, &new),
            [
                "interface lan0: overhead 0 -> 40",
                "interface lan0: mpu 0 -> 64",
                "interface lan0: linklayer ethernet -> atm"
            ]
        );
    }
}
