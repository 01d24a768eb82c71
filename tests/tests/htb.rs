//! shaper's allocator (`Tree::allocate`) against the independent HTB reference
//! (`shaper_tests::htb`) on random trees and demands. No root needed.
//!
//! Where they must agree, this asserts it: on flat trees, with weights set to HTB's quanta,
//! every class within a bit or two; with shaper's default weights (a class's rate), wherever
//! HTB's quanta are not clamped (rates of 80 kbit/s to 16 mbit/s). On nested trees shaper
//! deliberately differs (`allocation/tree.rs`: a class's prio and weight order it among its
//! siblings only, where HTB has each leaf borrow from an ancestor with its own prio and
//! quantum): there both must still give every guarantee, keep every ceil, and carry the same
//! total (both fill the link whenever a class below its ceil wants more), the allocator
//! agrees within a bit or two with that rule stated on its own (`htb::sibling_shares`), and
//! the cases where its shares differ from HTB's are counted, the largest printed.

use proptest::{prelude::*, strategy::ValueTree, test_runner::RngSeed};
use shaper::allocation::tree::{Node, Tree};
use shaper_tests::htb::{self, Htb};

/// A random class tree of up to three levels under a link of 1 to 100 mbit/s: (parent, rate,
/// ceil, prio) per class, parents first; every parent's children's rates within its rate.
#[derive(Clone, Debug)]
struct Spec {
    link: u64,
    classes: Vec<(Option<usize>, u64, u64, u8)>,
    /// Per class: 0 idle, `u64::MAX` greedy, else bit/s (inner classes: ignored).
    demand: Vec<u64>,
}

impl Spec {
    fn tree(&self, weight: impl Fn(u64) -> u64) -> Tree {
        let mut nodes = vec![Node { rate: self.link, ceil: self.link, prio: 0, weight: 1, children: Vec::new() }];
        for (i, &(parent, rate, ceil, prio)) in self.classes.iter().enumerate() {
            nodes.push(Node { rate, ceil, prio, weight: weight(rate), children: Vec::new() });
            nodes[parent.map_or(0, |p| p + 1)].children.push(i + 1);
        }
        Tree { nodes }
    }

    #[expect(clippy::cast_precision_loss, reason = "rates far below 2^52")]
    fn htb(&self) -> Htb {
        let classes = self
            .classes
            .iter()
            .map(|&(parent, rate, ceil, prio)| htb::Class::new(parent, rate as f64, ceil as f64, prio))
            .collect();
        Htb { link: self.link as f64, classes }
    }

    fn flat(&self) -> bool {
        self.classes.iter().all(|c| c.0.is_none())
    }

    fn leaf(&self, i: usize) -> bool {
        !self.classes.iter().any(|c| c.0 == Some(i))
    }

    /// The demands as the reference takes them (greedy: infinite).
    fn want(&self) -> Vec<f64> {
        self.demand.iter().copied().map(htb::want).collect()
    }

    /// Both allocations, per class: (shaper's, HTB's).
    #[expect(clippy::cast_precision_loss, reason = "as above")]
    fn both(&self, weight: impl Fn(u64) -> u64) -> (Vec<f64>, Vec<f64>) {
        let mut demand = vec![0];
        demand.extend(self.classes.iter().enumerate().map(|(i, _)| if self.leaf(i) { self.demand[i] } else { 0 }));
        let ours = self.tree(weight).allocate(&demand)[1..].iter().map(|&a| a as f64).collect();
        (ours, self.htb().shares(&self.want()))
    }
}

fn arb_spec() -> impl Strategy<Value = Spec> {
    // Up to 4 top classes, each a leaf or with up to 3 children, each of those a leaf or with
    // up to 2 children: shares of the parent's rate, ceilings between the rate and the link.
    let leaf_or_inner = |depth: u32| {
        prop::collection::vec(
            (1u64..20, 0u64..=100, 0u8..4, prop::collection::vec((1u64..20, 0u64..=100, 0u8..4), 0..=depth as usize)),
            1..=3,
        )
    };
    (
        prop::collection::vec((1u64..20, 0u64..=100, 0u8..4, leaf_or_inner(2)), 1..=4),
        prop::bool::weighted(0.4),
        prop::collection::vec(prop_oneof![Just(0u64), Just(u64::MAX), 1u64..1200], 40),
        prop_oneof![Just(1_000_000u64), Just(10_000_000), Just(50_000_000), Just(100_000_000)],
    )
        .prop_map(|(top, flat, demands, link)| {
            let mut classes = Vec::new();
            let total: u64 = top.iter().map(|t| t.0).sum();
            for (share, extra, prio, kids) in top {
                let rate = link * share / total.max(20);
                let me = classes.len();
                classes.push((None, rate, rate + (link - rate) * extra / 100, prio));
                if flat {
                    continue;
                }
                let sum: u64 = kids.iter().map(|k| k.0).sum();
                // Not every inner class is fully subscribed.
                for (share, extra, prio, grandkids) in kids {
                    let r = rate * share / (sum + 3);
                    let ceil = r + (link - r) * extra / 100;
                    let kid = classes.len();
                    classes.push((Some(me), r, ceil, prio));
                    let gsum: u64 = grandkids.iter().map(|g| g.0).sum();
                    for (share, extra, prio) in grandkids {
                        let gr = r * share / (gsum + 1);
                        classes.push((Some(kid), gr, gr + (link - gr) * extra / 100, prio));
                    }
                }
            }
            // Demands in steps of a thousandth of the link, up to 1.2 links.
            let demand = demands
                .iter()
                .take(classes.len())
                .map(|&d| if d == 0 || d == u64::MAX { d } else { link / 1000 * d })
                .collect();
            Spec { link, classes, demand }
        })
}

/// The largest difference of two allocations, bit/s, and where.
fn largest_difference(a: &[f64], b: &[f64]) -> (f64, usize) {
    a.iter()
        .zip(b)
        .enumerate()
        .map(|(i, (x, y))| ((x - y).abs(), i))
        .fold((0.0, 0), |m, d| if d.0 > m.0 { d } else { m })
}

#[test]
fn the_allocator_agrees_with_htb_where_it_claims_to() {
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 4000,
        rng_seed: RngSeed::Fixed(0x4_7b),
        ..ProptestConfig::default()
    });
    let (mut nested, mut differ, mut flat, mut clamped, mut clamp_differ) = (0u32, 0u32, 0u32, 0u32, 0u32);
    let mut worst: Option<(f64, Spec, Vec<f64>, Vec<f64>)> = None;
    for _ in 0..4000 {
        let spec = arb_spec().new_tree(&mut runner).expect("a tree").current();
        let (ours, reference) = spec.both(|rate| rate.max(1));
        if spec.flat() {
            flat += 1;
            // With HTB's quanta as the weights, the same allocation within rounding.
            let (quanta, _) = spec.both(|rate| {
                #[expect(
                    clippy::cast_possible_truncation,
                    clippy::cast_sign_loss,
                    clippy::cast_precision_loss,
                    reason = "a quantum"
                )]
                // In thousandths of a byte: weights are proportions.
                let q = (htb::quantum(rate as f64) * 1000.0).round() as u64;
                q
            });
            let (d, i) = largest_difference(&quanta, &reference);
            assert!(d <= 8.0, "class {i} differs by {d} bit/s with HTB's quanta as weights: {spec:?}\nours {quanta:?}\nHTB  {reference:?}");
            let unclamped = spec.classes.iter().all(|c| {
                #[expect(clippy::cast_precision_loss, reason = "as above")]
                let q = c.1 as f64 / 8.0 / htb::R2Q;
                (htb::QUANTUM_MIN..=htb::QUANTUM_MAX).contains(&q)
            });
            if unclamped {
                let (d, i) = largest_difference(&ours, &reference);
                assert!(d <= 8.0, "class {i} differs by {d} bit/s: {spec:?}\nours {ours:?}\nHTB  {reference:?}");
            } else {
                clamped += 1;
                let total: f64 = reference.iter().sum();
                if largest_difference(&ours, &reference).0 > 0.01 * total.max(1.0) {
                    clamp_differ += 1;
                }
            }
            continue;
        }
        nested += 1;
        // Shaper's own rule for nested trees, stated apart from the allocator: the same
        // allocation within rounding.
        #[expect(clippy::cast_precision_loss, reason = "as above")]
        let weights: Vec<f64> = spec.classes.iter().map(|c| c.1.max(1) as f64).collect();
        let siblings = htb::sibling_shares(&spec.htb(), &weights, &spec.want());
        let (d, i) = largest_difference(&ours, &siblings);
        assert!(d <= 8.0, "class {i} differs by {d} bit/s from prio and weight among siblings: {spec:?}\nours {ours:?}\nrule {siblings:?}");
        let ours_total: f64 =
            spec.classes.iter().enumerate().filter(|(i, _)| spec.leaf(*i)).map(|(i, _)| ours[i]).sum();
        let htb_total: f64 =
            spec.classes.iter().enumerate().filter(|(i, _)| spec.leaf(*i)).map(|(i, _)| reference[i]).sum();
        assert!(
            (ours_total - htb_total).abs() <= 64.0,
            "totals {ours_total} and {htb_total}: {spec:?}\nours {ours:?}\nHTB  {reference:?}"
        );
        for (i, &(_, rate, ceil, _)) in spec.classes.iter().enumerate() {
            #[expect(clippy::cast_precision_loss, reason = "as above")]
            let (rate, ceil, want) = (rate as f64, ceil as f64, spec.demand[i] as f64);
            assert!(ours[i] <= ceil + 1.0 && reference[i] <= ceil + 1.0, "class {i} over its ceil: {spec:?}");
            if spec.leaf(i) {
                let due = want.min(rate);
                assert!(ours[i] + 1.0 >= due && reference[i] + 1.0 >= due, "class {i} below its guarantee: {spec:?}");
            }
        }
        let (d, _) = largest_difference(&ours, &reference);
        if d > 0.01 * htb_total.max(1.0) {
            differ += 1;
            if worst.as_ref().is_none_or(|w| d > w.0) {
                worst = Some((d, spec.clone(), ours, reference));
            }
        }
    }
    println!(
        "{flat} flat trees agree with HTB ({clamped} of them with HTB's quanta clamped: they agree with those as \
         weights, {clamp_differ} differ by more than 1 % of the link with weights by rate); \
         {nested} nested trees follow prio and weight among siblings, keep every guarantee, ceil and HTB's \
         total, {differ} of them with shares more than 1 % of the link from HTB's (which uses each leaf's own)"
    );
    if let Some((d, spec, ours, reference)) = worst {
        println!("largest difference {d:.0} bit/s: {spec:?}\n  ours {ours:?}\n  HTB  {reference:?}");
    }
    assert!(flat > 1000 && nested > 1000, "the generator makes both kinds: {flat} flat, {nested} nested");
}

/// The difference named: a prio-7 leaf under a prio-2 parent, beside a prio-4 class. HTB has
/// the leaf borrow from the link with its own prio 7, after the prio-4 class; shaper orders
/// the parent among its siblings by its prio 2, so the leaf comes first.
#[test]
fn shaper_orders_prio_among_siblings_where_htb_orders_leaves() {
    const M: u64 = 1_000_000;
    let spec = Spec {
        link: 10 * M,
        // servers (rate 3, prio 2) with backup (rate 3, prio 7) under it; guest (rate 1, prio 4).
        classes: vec![(None, 3 * M, 10 * M, 2), (Some(0), 3 * M, 10 * M, 7), (None, M, 10 * M, 4)],
        demand: vec![0, u64::MAX, u64::MAX],
    };
    let (ours, reference) = spec.both(|rate| rate.max(1));
    assert_eq!((ours[1], ours[2]), (9e6, 1e6), "shaper: the servers' prio 2 first");
    let close = |a: f64, b: f64| (a - b).abs() < 1.0;
    assert!(
        close(reference[1], 3e6) && close(reference[2], 7e6),
        "HTB: the guest's prio 4 before the backup's 7: {reference:?}"
    );
}
