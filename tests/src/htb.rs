//! What Linux HTB gives each class in steady state, given what each leaf would send: the
//! reference the sharing tests take their expected rates from. Written from HTB's documented
//! rules (Devera's HTB manual and theory notes, the comments of `net/sched/sch_htb.c`), not
//! from shaper's allocator, so that a slip in either shows as a disagreement:
//!
//! 1. A leaf within its own `rate` sends (HTB's level 0): it gets `min(demand, rate)`,
//!    whatever its ancestors' state. Every byte is charged to the leaf and all its ancestors.
//! 2. A leaf that wants more borrows from its nearest ancestor that still has tokens of its
//!    own `rate` left (`rate` minus what its subtree sends), every class between them being
//!    below its `ceil`. Lenders are served level by level, deepest first: a class's level is
//!    its parent's minus one, the top class (the link) at 7, leaves at 0.
//! 3. Among the leaves borrowing from one lender, the lowest **leaf** `prio` goes first (an
//!    inner class's `prio` is ignored: HTB reads it for leaves only), and leaves of one prio
//!    share in proportion to their **leaf** quantum (deficit round robin, the round passing
//!    through every active leaf of the subtree, whatever the tree's shape).
//! 4. The quantum is `rate / r2q` in bytes (`r2q` 10, tc's default), clamped to
//!    1,000..=200,000 bytes as the kernel does when no quantum is given; `prio` is at most 7.
//!
//! Rates are bits per second in `f64`; a greedy leaf wants `f64::INFINITY`.

use shaper::config::Config;

/// HTB's number of priorities (`TC_HTB_NUMPRIO`): a higher `prio` is taken as 7.
pub const PRIOS: u8 = 8;
/// tc's default rate-to-quantum divisor (`r2q`).
pub const R2Q: f64 = 10.0;
/// The kernel's clamp on a computed quantum, bytes.
pub const QUANTUM_MIN: f64 = 1000.0;
pub const QUANTUM_MAX: f64 = 200_000.0;
/// The top class's level (`TC_HTB_MAXDEPTH - 1`).
const TOP_LEVEL: u8 = 7;
/// Rates closer than this (bit/s) are equal: the water-filling's rounding.
const EPSILON: f64 = 1e-6;

/// One HTB class.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    /// Index of the parent class; `None` for a child of the top class (the link).
    pub parent: Option<usize>,
    /// bit/s.
    pub rate: f64,
    pub ceil: f64,
    pub prio: u8,
    /// bytes.
    pub quantum: f64,
}

impl Class {
    /// A class as `tc class add ... htb rate R ceil C prio P` makes it: the kernel's quantum
    /// for `rate`, `prio` at most 7.
    #[must_use]
    pub fn new(parent: Option<usize>, rate: f64, ceil: f64, prio: u8) -> Self {
        Self { parent, rate, ceil, prio: prio.min(PRIOS - 1), quantum: quantum(rate) }
    }
}

/// What a leaf sending `bits` bit/s wants, as [`Htb::shares`] takes it: `u64::MAX` (greedy) is
/// all it can get.
#[must_use]
#[expect(clippy::cast_precision_loss, reason = "rates far below 2^52 bit/s")]
pub fn want(bits: u64) -> f64 {
    if bits == u64::MAX {
        f64::INFINITY
    } else {
        bits as f64
    }
}

/// The quantum (bytes) HTB computes for a leaf of `rate` bit/s when none is given.
#[must_use]
pub fn quantum(rate: f64) -> f64 {
    (rate / 8.0 / R2Q).clamp(QUANTUM_MIN, QUANTUM_MAX)
}

/// An HTB tree: a top class of rate and ceil `link` (as `tc class add ... classid 1:1 htb
/// rate L ceil L`) and the classes under it.
#[derive(Clone, Debug, PartialEq)]
pub struct Htb {
    pub link: f64,
    pub classes: Vec<Class>,
}

impl Htb {
    /// The tree `gateway::htb_fq_codel_commands` builds from the first interface of `config`:
    /// its classes in file order.
    #[must_use]
    pub fn from_config(config: &Config) -> Self {
        let iface = &config.interfaces[0];
        let mine: Vec<_> = config.classes.iter().filter(|c| c.interface == iface.name).collect();
        let classes = mine
            .iter()
            .map(|c| {
                let parent = c.parent.as_ref().map(|p| mine.iter().position(|x| &x.name == p).expect("a class"));
                #[expect(clippy::cast_precision_loss, reason = "rates far below 2^52 bit/s")]
                Class::new(parent, c.rate.bits_per_sec() as f64, c.ceil.bits_per_sec() as f64, c.prio)
            })
            .collect();
        #[expect(clippy::cast_precision_loss, reason = "as above")]
        let link = iface.rate.bits_per_sec() as f64;
        Self { link, classes }
    }

    /// What each class sends (bit/s; an inner class: its leaves' sum) when each leaf would
    /// send `demand[i]` (inner classes' entries are ignored).
    #[must_use]
    pub fn shares(&self, demand: &[f64]) -> Vec<f64> {
        assert_eq!(demand.len(), self.classes.len(), "one demand per class");
        let tree = Nodes::new(self);
        let n = tree.parent.len();
        // Node 0 is the top class; class i is node i + 1.
        let want: Vec<f64> = (0..n)
            .map(|v| if v > 0 && tree.leaf[v] { demand[v - 1].max(0.0).min(tree.ceil[v]) } else { 0.0 })
            .collect();
        let mut sent = vec![0.0; n];
        // Level 0: every leaf within its own rate.
        for v in (1..n).filter(|&v| tree.leaf[v]) {
            tree.charge(&mut sent, v, want[v].min(tree.rate[v]));
        }
        // Then the lenders, deepest level first.
        let mut lenders: Vec<usize> = (0..n).filter(|&v| !tree.leaf[v]).collect();
        lenders.sort_by_key(|&v| tree.level[v]);
        for a in lenders {
            let mut spare = tree.rate[a] - sent[a];
            for prio in 0..PRIOS {
                if spare <= EPSILON {
                    break;
                }
                spare -= tree.lend(a, prio, spare, &want, &mut sent);
            }
        }
        sent[1..].to_vec()
    }
}

/// How many classes are above node `v` (the top class's children: 1).
fn depth(parent: &[Option<usize>], v: usize) -> usize {
    let mut d = 0;
    let mut u = v;
    while let Some(p) = parent[u] {
        d += 1;
        u = p;
    }
    d
}

/// The tree as arrays over nodes, the top class at 0.
struct Nodes {
    parent: Vec<Option<usize>>,
    leaf: Vec<bool>,
    level: Vec<u8>,
    rate: Vec<f64>,
    ceil: Vec<f64>,
    prio: Vec<u8>,
    quantum: Vec<f64>,
}

impl Nodes {
    fn new(htb: &Htb) -> Self {
        let n = htb.classes.len() + 1;
        let mut parent = vec![None];
        parent.extend(htb.classes.iter().map(|c| Some(c.parent.map_or(0, |p| p + 1))));
        let leaf: Vec<bool> = (0..n).map(|v| !parent.contains(&Some(v))).collect();
        let mut level = vec![TOP_LEVEL; n];
        for v in 1..n {
            // A class's level is its parent's minus one: the top class's less its depth.
            let depth = u8::try_from(depth(&parent, v)).expect("HTB's tree is at most 8 deep");
            level[v] = if leaf[v] { 0 } else { TOP_LEVEL - depth };
        }
        let mut rate = vec![htb.link];
        rate.extend(htb.classes.iter().map(|c| c.rate));
        let mut ceil = vec![htb.link];
        ceil.extend(htb.classes.iter().map(|c| c.ceil));
        let mut prio = vec![0];
        prio.extend(htb.classes.iter().map(|c| c.prio));
        let mut quantum = vec![0.0];
        quantum.extend(htb.classes.iter().map(|c| c.quantum));
        Self { parent, leaf, level, rate, ceil, prio, quantum }
    }

    /// Charges `bits` of leaf `v`'s traffic to it and every ancestor.
    fn charge(&self, sent: &mut [f64], v: usize, bits: f64) {
        let mut u = Some(v);
        while let Some(x) = u {
            sent[x] += bits;
            u = self.parent[x];
        }
    }

    /// The classes strictly between leaf `v` and its ancestor `a`, `v` included.
    fn path(&self, v: usize, a: usize) -> Option<Vec<usize>> {
        let mut path = vec![v];
        let mut u = self.parent[v]?;
        while u != a {
            path.push(u);
            u = self.parent[u]?;
        }
        Some(path)
    }

    /// Lends up to `spare` of lender `a`'s rate to the leaves of prio `prio` under it that
    /// want more, every class on their way below its ceil, in proportion to their quanta
    /// (water-filling). Returns what it lent.
    fn lend(&self, a: usize, prio: u8, spare: f64, want: &[f64], sent: &mut [f64]) -> f64 {
        let mut active: Vec<(usize, Vec<usize>)> = (0..self.parent.len())
            .filter(|&v| self.leaf[v] && self.prio[v] == prio)
            .filter_map(|v| self.path(v, a).map(|p| (v, p)))
            .collect();
        let mut left = spare;
        loop {
            active.retain(|(v, path)| {
                want[*v] - sent[*v] > EPSILON && path.iter().all(|&u| self.ceil[u] - sent[u] > EPSILON)
            });
            if active.is_empty() || left <= EPSILON {
                return spare - left;
            }
            // Each active leaf grows by `quantum * t`; find the t at which something binds.
            let total: f64 = active.iter().map(|(v, _)| self.quantum[*v]).sum();
            let mut t = left / total;
            for (v, path) in &active {
                t = t.min((want[*v] - sent[*v]) / self.quantum[*v]);
                for &u in &path[1..] {
                    let under: f64 = active.iter().filter(|(_, p)| p.contains(&u)).map(|(w, _)| self.quantum[*w]).sum();
                    t = t.min((self.ceil[u] - sent[u]) / under);
                }
                t = t.min((self.ceil[*v] - sent[*v]) / self.quantum[*v]);
            }
            for (v, _) in &active {
                self.charge(sent, *v, self.quantum[*v] * t);
            }
            left -= total * t;
        }
    }
}

/// What shaper gives each class where it deliberately differs from HTB in nested trees
/// (`shaper-daemon/src/allocation/tree.rs`): a class's `prio` and weight order it among its
/// siblings only. Written from that rule, not from the allocator: what a node is given (the
/// link: all it can use) goes first to each child's guarantee, `min(want, rate)`, then to the
/// children that want more, lowest prio first and within a prio in proportion to `weight`
/// (by default the class's rate), each up to its want; and so on down. A node wants its
/// leaves' wants added up, capped at its ceil. Flat trees: the same as [`Htb::shares`] with
/// quanta as weights.
#[must_use]
pub fn sibling_shares(htb: &Htb, weight: &[f64], demand: &[f64]) -> Vec<f64> {
    let tree = Nodes::new(htb);
    let n = tree.parent.len();
    let mut want = vec![0.0; n];
    // Children come after their parents in a valid configuration; sum the wants bottom-up by
    // depth rather than relying on it.
    let mut order: Vec<usize> = (1..n).collect();
    order.sort_by_key(|&v| std::cmp::Reverse(depth(&tree.parent, v)));
    for &v in &order {
        if tree.leaf[v] {
            want[v] = demand[v - 1].max(0.0).min(tree.ceil[v]);
        }
        let p = tree.parent[v].expect("a class has a parent");
        want[v] = want[v].min(tree.ceil[v]);
        want[p] += want[v];
    }
    let mut given = vec![0.0; n];
    given[0] = want[0].min(htb.link);
    let mut top_down = order;
    top_down.reverse();
    for a in std::iter::once(0).chain(top_down.into_iter().filter(|&v| !tree.leaf[v])) {
        let kids: Vec<usize> = (1..n).filter(|&v| tree.parent[v] == Some(a)).collect();
        let mut left = given[a];
        for &k in &kids {
            given[k] = want[k].min(tree.rate[k]);
            left -= given[k];
        }
        for prio in 0..=u8::MAX {
            let mut active: Vec<usize> = kids.iter().copied().filter(|&k| tree.prio[k] == prio).collect();
            while left > EPSILON {
                active.retain(|&k| want[k] - given[k] > EPSILON);
                if active.is_empty() {
                    break;
                }
                let total: f64 = active.iter().map(|&k| weight[k - 1]).sum();
                let t = active.iter().map(|&k| (want[k] - given[k]) / weight[k - 1]).fold(left / total, f64::min);
                for &k in &active {
                    given[k] += weight[k - 1] * t;
                }
                left -= total * t;
            }
        }
    }
    given[1..].to_vec()
}

/// HTB's shares (bit/s) of the model's flat classes under a link of `link` bit/s, each class
/// wanting `demand[i]` (`u64::MAX`: all it can get).
#[must_use]
pub fn model_shares(link: u64, classes: &[shaper::model::ClassSpec], demand: &[u64]) -> Vec<u64> {
    model_tree_shares(link, &vec![None; classes.len()], classes, demand).0
}

/// For the model's tree of `classes` (class `i` under `parents[i]`, as `model::tree_of`)
/// under a link of `link` bit/s, each leaf wanting `demand[i]` (`u64::MAX`: all it can get):
/// HTB's shares, and those of shaper's rule for nested trees ([`sibling_shares`], weights by
/// rate), bit/s.
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "rates far below 2^52 bit/s"
)]
pub fn model_tree_shares(
    link: u64,
    parents: &[Option<usize>],
    classes: &[shaper::model::ClassSpec],
    demand: &[u64],
) -> (Vec<u64>, Vec<u64>) {
    let htb = Htb {
        link: link as f64,
        classes: classes
            .iter()
            .zip(parents)
            .map(|(c, &p)| Class::new(p, c.rate as f64, c.ceil as f64, c.prio))
            .collect(),
    };
    let wants: Vec<f64> = demand.iter().copied().map(want).collect();
    let weights: Vec<f64> = classes.iter().map(|c| c.rate.max(1) as f64).collect();
    let bits = |v: Vec<f64>| v.iter().map(|&s| s.round() as u64).collect();
    (bits(htb.shares(&wants)), bits(sibling_shares(&htb, &weights, &wants)))
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: f64 = 1e6;
    const G: f64 = f64::INFINITY;

    fn close(got: &[f64], expected: &[f64]) {
        for (i, (g, e)) in got.iter().zip(expected).enumerate() {
            assert!((g - e).abs() < 1.0, "class {i}: {got:?} against {expected:?}");
        }
    }

    /// Seed 000's roommates: alex 1.9, betty 2.9, carl 4.9 at prio 1, the guest 0.3 at prio
    /// 0, every ceil the 10 mbit/s link.
    fn roommates() -> Htb {
        let c = |rate: f64, prio| Class::new(None, rate * M, 10.0 * M, prio);
        Htb { link: 10.0 * M, classes: vec![c(1.9, 1), c(2.9, 1), c(4.9, 1), c(0.3, 0)] }
    }

    #[test]
    fn the_seed_000_rows_are_the_seeds_own_figures() {
        let htb = roommates();
        // The spare goes by quantum (rate / 80 bytes) among the borrowers of one prio...
        close(
            &htb.shares(&[G, G, 0.0, 0.0]),
            &[1.9 * M + 5.2 * M * 19.0 / 48.0, 2.9 * M + 5.2 * M * 29.0 / 48.0, 0.0, 0.0],
        );
        // ...and to the guest first, its prio 0 ahead of alex's 1.
        close(&htb.shares(&[G, 0.0, 0.0, G]), &[1.9 * M, 0.0, 0.0, 8.1 * M]);
        close(&htb.shares(&[G, G, G, G]), &[1.9 * M, 2.9 * M, 4.9 * M, 0.3 * M]);
        // An application-limited class keeps what it sends; the greedy one takes the rest.
        close(&htb.shares(&[G, 0.0, 6.0 * M, 0.0]), &[4.0 * M, 0.0, 6.0 * M, 0.0]);
    }

    #[test]
    fn quanta_are_clamped_as_the_kernel_clamps_them() {
        assert!((quantum(1.9 * M) - 23_750.0).abs() < 1e-9);
        assert!((quantum(40_000.0) - QUANTUM_MIN).abs() < 1e-9);
        assert!((quantum(100.0 * M) - QUANTUM_MAX).abs() < 1e-9);
        // 20 and 40 mbit/s both clamp at 200,000 bytes: HTB splits the spare evenly.
        let htb = Htb {
            link: 100.0 * M,
            classes: vec![Class::new(None, 20.0 * M, 100.0 * M, 0), Class::new(None, 40.0 * M, 100.0 * M, 0)],
        };
        close(&htb.shares(&[G, G]), &[40.0 * M, 60.0 * M]);
    }

    /// A leaf borrows from its parent's rate before the link's, and at the link competes with
    /// its own prio and quantum, not its parent's.
    #[test]
    fn a_leaf_borrows_with_its_own_prio_and_quantum() {
        // link 10: A (rate 4, prio 7) with a1 (1, prio 0) and a2 (1, prio 1); b (2, prio 4).
        let classes = vec![
            Class::new(None, 4.0 * M, 10.0 * M, 7),
            Class::new(Some(0), M, 10.0 * M, 0),
            Class::new(Some(0), M, 10.0 * M, 1),
            Class::new(None, 2.0 * M, 10.0 * M, 4),
        ];
        let htb = Htb { link: 10.0 * M, classes };
        // A's spare 2 goes to a1 first (prio 0), then the link's 4 to a1 as well: a1 takes
        // all of both, A's prio 7 notwithstanding.
        close(&htb.shares(&[0.0, G, G, G]), &[8.0 * M, 7.0 * M, M, 2.0 * M]);
        // a1 wants 3.5: it takes A's 2 and 0.5 of the link's; a2 (prio 1) gets the rest of
        // the link's spare ahead of b (prio 4).
        close(&htb.shares(&[0.0, 3.5 * M, G, G]), &[8.0 * M, 3.5 * M, 4.5 * M, 2.0 * M]);
    }

    /// Two subtrees share the link's spare by their leaves' quanta, not by the subtrees'
    /// rates; an inner ceiling stops its leaves.
    #[test]
    fn the_link_s_spare_goes_by_leaf_quantum_across_subtrees() {
        let classes = vec![
            Class::new(None, 4.0 * M, 10.0 * M, 0),
            Class::new(Some(0), M, 10.0 * M, 0),
            Class::new(Some(0), M, 10.0 * M, 0),
            Class::new(None, 2.0 * M, 10.0 * M, 0),
        ];
        let htb = Htb { link: 10.0 * M, classes: classes.clone() };
        // Guarantees 1, 1, 2; A lends its 2 to a1, a2; the link's 4 by quanta 1:1:2.
        close(&htb.shares(&[0.0, G, G, G]), &[6.0 * M, 3.0 * M, 3.0 * M, 4.0 * M]);
        let mut capped = classes;
        capped[0].ceil = 5.0 * M;
        let htb = Htb { link: 10.0 * M, classes: capped };
        close(&htb.shares(&[0.0, G, G, G]), &[5.0 * M, 2.5 * M, 2.5 * M, 5.0 * M]);
    }

    /// A class within its rate sends whatever its parent's ceiling: guarantees come first.
    #[test]
    fn guarantees_do_not_wait_for_the_parent() {
        let classes = vec![
            Class::new(None, 2.0 * M, 2.0 * M, 0),
            Class::new(Some(0), M, 2.0 * M, 0),
            Class::new(Some(0), M, 2.0 * M, 0),
        ];
        let htb = Htb { link: 10.0 * M, classes };
        close(&htb.shares(&[0.0, G, 0.5 * M]), &[2.0 * M, 1.5 * M, 0.5 * M]);
    }
}
