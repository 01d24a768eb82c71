//! The checks that span a class tree: parents on the same interface and without cycles,
//! rates and ceils resolved from the top down, the children's guaranteed rates within their
//! parent's, and each interface's default a leaf class of it.

use super::{positions, ClassDraft, IfaceDraft, Validator};
use crate::config::error::{ConfigError, Problem};
use crate::config::values::{fmt_sum, list};
use crate::rate::{Rate, RateSpec};

/// Where a rate, ceil or child sum comes from: an interface or a class.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Node {
    Interface(usize),
    Class(usize),
}

impl Validator<'_> {
    /// Resolves `parent` names, checks they share the interface and form no cycle.
    pub(super) fn link_parents(
        &self,
        classes: &mut [ClassDraft],
        interfaces: &[IfaceDraft],
    ) -> Result<(), ConfigError> {
        let index = positions(classes);
        let mut parents = vec![None; classes.len()];
        for (i, class) in classes.iter().enumerate() {
            let Some(parent) = &class.parent_name else {
                continue;
            };
            let key = format!("class[{i}].parent");
            let p = self.check(&key, parent, |wanted| {
                index.get(wanted.as_str()).copied().ok_or_else(|| {
                    let same_iface = classes
                        .iter()
                        .filter(|c| c.interface == class.interface && c.name != class.name)
                        .map(|c| c.name.as_str());
                    Problem::new(format!(
                        "no class named {wanted:?}; expected a class of interface {}: {}",
                        interfaces[class.interface].name,
                        list(same_iface)
                    ))
                })
            })?;
            if classes[p].interface != class.interface {
                return Err(self.error(
                    self.line(parent),
                    key,
                    format!(
                        "parent {:?} is on interface {}, but this class is on {}; a class and its parent must be on the same interface",
                        classes[p].name, interfaces[classes[p].interface].name, interfaces[class.interface].name
                    ),
                ));
            }
            parents[i] = Some(p);
        }
        // Follow each parent chain until it reaches a class known to lead to a root (or a
        // root); reaching a class of the chain being followed means a cycle. Each class is
        // walked once.
        let mut reaches_root = vec![false; classes.len()];
        let mut on_chain = vec![false; classes.len()];
        for start in 0..classes.len() {
            let mut chain = vec![start];
            on_chain[start] = true;
            let mut at = start;
            while let Some(p) = parents[at].filter(|&p| !reaches_root[p]) {
                if on_chain[p] {
                    let pos = chain.iter().position(|&c| c == p).expect("p is on the chain");
                    let cycle = &chain[pos..];
                    let first = *cycle.iter().min().expect("a cycle has members");
                    let from = cycle.iter().position(|&c| c == first).expect("first is in the cycle");
                    let names: Vec<&str> = cycle[from..]
                        .iter()
                        .chain(&cycle[..from])
                        .chain(std::iter::once(&first))
                        .map(|&c| classes[c].name.as_str())
                        .collect();
                    let parent = classes[first].parent_name.as_ref().expect("a class in a cycle has a parent");
                    return Err(self.error(
                        self.line(parent),
                        format!("class[{first}].parent"),
                        format!(
                            "parents form a cycle: {} (each class names the next as parent); the classes of an interface must form a tree",
                            names.join(" -> ")
                        ),
                    ));
                }
                chain.push(p);
                on_chain[p] = true;
                at = p;
            }
            for c in chain {
                on_chain[c] = false;
                reaches_root[c] = true;
            }
        }
        for (i, parent) in parents.into_iter().enumerate() {
            classes[i].parent = parent;
            if let Some(p) = parent {
                classes[p].children.push(i);
            }
        }
        Ok(())
    }

    /// Resolves rates and ceils from the top of each tree down, checking
    /// `rate <= ceil <= parent's ceil`.
    pub(super) fn resolve_rates(
        &self,
        classes: &mut [ClassDraft],
        interfaces: &[IfaceDraft],
    ) -> Result<(), ConfigError> {
        let mut order: Vec<usize> = (0..classes.len()).filter(|&i| classes[i].parent.is_none()).collect();
        let mut next = 0;
        while next < order.len() {
            order.extend_from_slice(&classes[order[next]].children);
            next += 1;
        }
        for i in order {
            let class = &classes[i];
            let (parent_rate, parent_ceil, parent_desc) = if let Some(p) = class.parent {
                let parent = &classes[p];
                (parent.rate, parent.ceil, format!("parent class {:?}", parent.name))
            } else {
                let iface = &interfaces[class.interface];
                (iface.rate, iface.rate, format!("interface {}", iface.name))
            };
            let rate = class.rate_spec.resolve(parent_rate);
            if rate == Rate::ZERO {
                let problem = match class.rate_spec {
                    RateSpec::Absolute(_) => "rate is 0; a class needs a positive guaranteed rate, e.g. rate = \"1mbit\"".to_owned(),
                    RateSpec::Percent(_) => format!(
                        "rate {} of {parent_desc}'s rate {parent_rate} rounds down to 0bit; use a larger share or an absolute rate",
                        class.rate_spec
                    ),
                };
                return Err(self.error(class.rate_line, format!("class[{i}].rate"), problem));
            }
            let ceil = class.ceil_spec.map_or(parent_ceil, |(spec, _)| spec.resolve(parent_ceil));
            match class.ceil_spec {
                Some((_, ceil_line)) if ceil < rate => {
                    return Err(self.error(
                        ceil_line,
                        format!("class[{i}].ceil"),
                        format!("ceil {ceil} is below the class's rate {rate}; ceil must be at least the rate (or omit it to borrow up to {parent_desc}'s ceil {parent_ceil})"),
                    ))
                }
                None if ceil < rate => {
                    return Err(self.error(
                        class.rate_line,
                        format!("class[{i}].rate"),
                        format!("rate {rate} is above the ceil {ceil} inherited from {parent_desc}; expected at most {ceil}"),
                    ))
                }
                Some((_, ceil_line)) if ceil > parent_ceil => {
                    return Err(self.error(
                        ceil_line,
                        format!("class[{i}].ceil"),
                        format!("ceil {ceil} is above {parent_desc}'s ceil {parent_ceil}; a class cannot borrow more than its parent may use, so expected at most {parent_ceil}"),
                    ))
                }
                _ => {}
            }
            classes[i].rate = rate;
            classes[i].ceil = ceil;
        }
        Ok(())
    }

    /// Checks that the guaranteed rates of each node's children fit in the node's rate.
    pub(super) fn check_sums(&self, classes: &[ClassDraft], interfaces: &[IfaceDraft]) -> Result<(), ConfigError> {
        let nodes = (0..interfaces.len()).map(Node::Interface).chain((0..classes.len()).map(Node::Class));
        for node in nodes {
            let children: Vec<&ClassDraft> = match node {
                Node::Interface(n) => classes.iter().filter(|c| c.parent.is_none() && c.interface == n).collect(),
                Node::Class(n) => classes[n].children.iter().map(|&c| &classes[c]).collect(),
            };
            let sum: u128 = children.iter().map(|c| u128::from(c.rate.bits_per_sec())).sum();
            let (rate, line, key, whose) = match node {
                Node::Interface(n) => {
                    let iface = &interfaces[n];
                    (
                        iface.rate,
                        iface.rate_line,
                        format!("interface[{n}].rate"),
                        format!("the top-level classes of interface {}", iface.name),
                    )
                }
                Node::Class(n) => {
                    let class = &classes[n];
                    (
                        class.rate,
                        class.rate_line,
                        format!("class[{n}].rate"),
                        format!("the children of class {:?}", class.name),
                    )
                }
            };
            if sum > u128::from(rate.bits_per_sec()) {
                let terms: Vec<String> = children.iter().map(|c| format!("{} {}", c.name, c.rate)).collect();
                return Err(self.error(
                    line,
                    key,
                    format!(
                        "the guaranteed rates of {whose} add up to {} ({}), more than its rate {rate}; lower them so that they add up to at most {rate}",
                        fmt_sum(sum),
                        terms.join(" + ")
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Checks that each interface's `default` is one of its leaf classes.
    pub(super) fn check_defaults(&self, classes: &[ClassDraft], interfaces: &[IfaceDraft]) -> Result<(), ConfigError> {
        for (n, iface) in interfaces.iter().enumerate() {
            let default = &iface.default;
            let leaves =
                || list(classes.iter().filter(|c| c.interface == n && c.children.is_empty()).map(|c| c.name.as_str()));
            self.check(&format!("interface[{n}].default"), default, |wanted| {
                let Some(class) = classes.iter().find(|c| c.name == *wanted) else {
                    return Err(Problem::new(format!(
                        "no class named {wanted:?}; expected a leaf class of interface {}: {}",
                        iface.name,
                        leaves()
                    )));
                };
                if class.interface != n {
                    return Err(Problem::new(format!(
                        "class {wanted:?} is on interface {}, not {}; expected a leaf class of {}: {}",
                        interfaces[class.interface].name,
                        iface.name,
                        iface.name,
                        leaves()
                    )));
                }
                if !class.children.is_empty() {
                    return Err(Problem::new(format!(
                        "class {wanted:?} has child classes ({}); only leaf classes carry packets, expected one of: {}",
                        list(class.children.iter().map(|&c| classes[c].name.as_str())),
                        leaves()
                    )));
                }
                Ok(())
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use crate::config::test_util::{fails_at, ok, GUEST, IFACE};
    use crate::config::MAX_CLASSES;

    #[test]
    fn ceil_defaults_to_parent_ceil() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "8mbit"
ceil = "9mbit"
[[class]]
name = "room"
parent = "house"
rate = "2mbit"
{GUEST}"#
        );
        let config = ok(&text);
        assert_eq!(config.class("room").unwrap().ceil, "9mbit".parse().unwrap());
        assert_eq!(config.class("guest").unwrap().ceil, "10mbit".parse().unwrap());
    }

    #[test]
    fn ceil_below_rate() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"2mbit\"\nceil = \"1mbit\"\n");
        fails_at(&text, "ceil", "class[0].ceil", &["ceil 1mbit is below the class's rate 2mbit", "at least the rate"]);
        // Without a ceil, the inherited one applies.
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "5mbit"
ceil = "5mbit"
[[class]]
name = "guest"
parent = "house"
rate = "6mbit"
"#
        );
        fails_at(
            &text,
            "rate = \"6mbit\"",
            "class[1].rate",
            &["rate 6mbit is above the ceil 5mbit inherited from parent class \"house\""],
        );
    }

    #[test]
    fn ceil_above_parent_ceil() {
        let text = format!("{IFACE}[[class]]\nname = \"guest\"\nrate = \"2mbit\"\nceil = \"20mbit\"\n");
        fails_at(
            &text,
            "ceil",
            "class[0].ceil",
            &["ceil 20mbit is above interface lan0's ceil 10mbit", "at most 10mbit"],
        );
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "5mbit"
ceil = "8mbit"
[[class]]
name = "guest"
parent = "house"
rate = "1mbit"
ceil = "9mbit"
"#
        );
        fails_at(
            &text,
            "ceil = \"9mbit\"",
            "class[1].ceil",
            &["above parent class \"house\"'s ceil 8mbit", "at most 8mbit"],
        );
    }

    #[test]
    fn parents() {
        let text = format!("{IFACE}{GUEST}parent = \"nobody\"\n");
        fails_at(&text, "nobody", "class[0].parent", &["no class named \"nobody\"", "interface lan0"]);
        let text = format!("{IFACE}{GUEST}parent = \"guest\"\n");
        fails_at(&text, "parent", "class[0].parent", &["cycle: guest -> guest", "tree"]);
        let text = format!(
            r#"{IFACE}{GUEST}
[[class]]
name = "a"
parent = "c"
rate = "1kbit"
[[class]]
name = "b"
parent = "a"
rate = "1kbit"
[[class]]
name = "c"
parent = "b"
rate = "1kbit"
"#
        );
        fails_at(&text, "parent = \"c\"", "class[1].parent", &["cycle: a -> c -> b -> a"]);
        let text = format!(
            r#"{IFACE}{GUEST}
[[interface]]
name = "wan0"
rate = "1mbit"
default = "w"
[[class]]
name = "w"
interface = "wan0"
parent = "guest"
rate = "1kbit"
"#
        );
        let text = text.replace("name = \"guest\"", "name = \"guest\"\ninterface = \"lan0\"");
        fails_at(
            &text,
            "parent = \"guest\"",
            "class[1].parent",
            &["\"guest\" is on interface lan0, but this class is on wan0"],
        );
    }

    #[test]
    fn children_over_parent_rate() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "house"
rate = "4mbit"
[[class]]
name = "alex"
parent = "house"
rate = "1.9mbit"
[[class]]
name = "betty"
parent = "house"
rate = "2.9mbit"
{GUEST}"#
        );
        fails_at(
            &text,
            "rate = \"4mbit\"",
            "class[0].rate",
            &["children of class \"house\"", "add up to 4.8mbit", "alex 1.9mbit + betty 2.9mbit", "its rate 4mbit"],
        );
    }

    #[test]
    fn top_level_over_interface_rate() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "alex"
rate = "5mbit"
[[class]]
name = "betty"
rate = "4.5mbit"
{GUEST}"#
        );
        fails_at(
            &text,
            "rate = \"10mbit\"",
            "interface[0].rate",
            &[
                "top-level classes of interface lan0",
                "add up to 10.5mbit",
                "alex 5mbit + betty 4.5mbit + guest 1mbit",
                "its rate 10mbit",
            ],
        );
        ok(&text.replace("4.5mbit", "4mbit"));
    }

    #[test]
    fn percent_rates_fit_exactly() {
        let text = format!(
            r#"{IFACE}
[[class]]
name = "a"
rate = "33.33%"
[[class]]
name = "b"
rate = "33.33%"
[[class]]
name = "guest"
rate = "33.34%"
"#
        );
        let config = ok(&text);
        let sum: u64 = config.classes.iter().map(|c| c.rate.bits_per_sec()).sum();
        assert_eq!(sum, 10_000_000);
    }

    #[test]
    fn deep_tree_and_shared_ancestors() {
        // A chain as deep as the class table allows validates quickly.
        let mut text = IFACE.replace("guest", &format!("c{}", MAX_CLASSES - 1));
        for n in 0..MAX_CLASSES {
            let parent = if n == 0 { String::new() } else { format!("parent = \"c{}\"\n", n - 1) };
            let _ = write!(text, "[[class]]\nname = \"c{n}\"\n{parent}rate = \"1kbit\"\n");
        }
        let config = ok(&text);
        assert_eq!(config.leaves().count(), 1);
        assert_eq!(config.classes[MAX_CLASSES - 1].ceil, "10mbit".parse().unwrap());
        // A class whose ancestors loop is reported at the loop, not at the class.
        let text = format!(
            r#"{IFACE}{GUEST}
[[class]]
name = "leaf"
parent = "x"
rate = "1kbit"
[[class]]
name = "x"
parent = "y"
rate = "1kbit"
[[class]]
name = "y"
parent = "x"
rate = "1kbit"
"#
        );
        fails_at(&text, "parent = \"y\"", "class[2].parent", &["cycle: x -> y -> x"]);
    }

    #[test]
    fn default_class_checks() {
        let two = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "DEFAULT"

[[interface]]
name = "wan0"
rate = "10mbit"
default = "w"

[[class]]
name = "house"
interface = "lan0"
rate = "5mbit"

[[class]]
name = "room"
interface = "lan0"
parent = "house"
rate = "1mbit"

[[class]]
name = "w"
interface = "wan0"
rate = "1mbit"
"#;
        let at = "default = \"DEFAULT\"";
        fails_at(
            &two.replace("DEFAULT", "nobody"),
            at.replace("DEFAULT", "nobody").as_str(),
            "interface[0].default",
            &["no class named \"nobody\"", "leaf class of interface lan0: room"],
        );
        fails_at(
            &two.replace("DEFAULT", "house"),
            "default = \"house\"",
            "interface[0].default",
            &["\"house\" has child classes (room)", "room"],
        );
        fails_at(
            &two.replace("DEFAULT", "w"),
            "default = \"w\"",
            "interface[0].default",
            &["\"w\" is on interface wan0, not lan0", "room"],
        );
        assert_eq!(ok(&two.replace("DEFAULT", "room")).interfaces[0].default_class, "room");
    }
}
