//! Datapath ids: which slot of the datapath's class arrays each class of a configuration
//! takes, and its rules with names resolved to those ids.

use std::collections::{HashMap, HashSet};

use crate::{config::Config, rules::RuleSpec};

/// The rules of `config` with class and interface names resolved to ids; `ids[n]` is the
/// datapath id of `config.classes[n]`.
#[must_use]
pub fn rule_specs(config: &Config, ids: &[u32]) -> Vec<RuleSpec> {
    let positions = config.class_positions();
    let position = |name: &str| *positions.get(name).expect("validated");
    let slot = |iface: &str| config.interfaces.iter().position(|i| i.name == iface).expect("validated");
    config
        .rules
        .iter()
        .map(|r| {
            let class = position(&r.class);
            RuleSpec {
                index: u32::try_from(r.index).expect("fewer rules than u32::MAX"),
                line: r.line,
                class: ids[class],
                iface_slot: u16::try_from(slot(&config.classes[class].interface)).expect("at most MAX_INTERFACES"),
                src: r.src,
                dst: r.dst,
                proto: r.proto,
                sport: r.sport.map(|p| (p.start, p.end)),
                dport: r.dport.map(|p| (p.start, p.end)),
                mark: r.mark,
                dscp: r.dscp,
                len: r.len.map(|l| (l.start, l.end)),
                tcp_flags: r.tcp_flags,
                icmp_type: r.icmp_type,
                src_mac: r.src_mac,
            }
        })
        .collect()
}

/// Datapath ids for the classes of `config`: a class that `previous` (name, id) already has
/// keeps its id, so its counters and pacing clock carry on; a new class takes the lowest id
/// that no class of either configuration uses, so no packet of a removed class is counted
/// for it while the rules switch over. `None` if the ids run out: every id is below `slots`
/// (the class arrays' size).
pub(super) fn assign_ids(config: &Config, previous: &[(&str, u32)], slots: u32) -> Option<Vec<u32>> {
    let taken: HashSet<u32> = previous.iter().map(|&(_, id)| id).collect();
    let kept: HashMap<&str, u32> = previous.iter().copied().collect();
    let mut free = (0..slots).filter(|id| !taken.contains(id));
    config.classes.iter().map(|c| kept.get(c.name.as_str()).copied().or_else(|| free.next())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::with_classes as config;

    #[test]
    fn class_ids_are_kept_by_name_and_new_ones_never_reuse_an_old_id() {
        let ids = assign_ids(&config(&["a", "b", "c"]), &[], 1024).unwrap();
        assert_eq!(ids, [0, 1, 2]);
        // b removed, d added: a and c keep theirs; d takes neither b's nor anyone's.
        let ids = assign_ids(&config(&["a", "c", "d"]), &[("a", 0), ("b", 1), ("c", 2)], 1024).unwrap();
        assert_eq!(ids, [0, 2, 3]);
    }

    #[test]
    fn class_ids_stay_below_the_slots_of_the_class_arrays() {
        // Four slots: a, b and c keep 0-2, so only one new class fits beside them.
        let previous = [("a", 0), ("b", 1), ("c", 2)];
        assert_eq!(assign_ids(&config(&["a", "b", "c", "d"]), &previous, 4), Some(vec![0, 1, 2, 3]));
        assert_eq!(assign_ids(&config(&["a", "d", "e"]), &previous, 4), None);
        assert_eq!(assign_ids(&config(&["d", "e", "f", "g", "h"]), &[], 4), None);
    }
}
