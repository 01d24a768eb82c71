//! The class tree and the allocator: who gets how much of the link, given what each leaf
//! wants. Pure: no I/O, no clock, no BPF; the daemon feeds it demands every tick.
//!
//! The semantics are HTB's, as its users know them:
//! 1. every class first gets `min(demand, rate)`, its guarantee;
//! 2. what a parent has left over goes to its children that want more, lowest `prio` first,
//!    and within one prio in proportion to `weight` (HTB's quantum, by default proportional
//!    to `rate`), each capped at its `ceil` and at its demand;
//! 3. recursively, down to the leaves;
//! 4. nothing is left idle while some class below its ceil still wants more.
//!
//! One deliberate difference from Linux HTB, for nested trees: `prio` and `weight` order a
//! class among its siblings only. A parent's spare goes to its children by their prio, and
//! what a subtree gets from further up is decided by the prio of the subtree's top class.
//! In HTB, a leaf that borrows from an ancestor competes there with its own prio (and
//! quantum), whatever its parents' are: a prio-7 leaf under a prio-2 parent comes after a
//! prio-4 class beside that parent in HTB, and before it here. Priority that follows the tree
//! is what the configuration reads like (a class's prio is written next to its siblings),
//! and it keeps each subtree's spare for its own children first; the test
//! `prio_orders_siblings_only` pins it.
//!
//! Rates are integers (bits per second); shares are computed in 128-bit arithmetic and
//! rounded down, and the remainders handed out one by one, so that the sum of the children's
//! allocations is exactly what their parent could give.

use super::demand::Divisor;
use crate::config::{Class, Config};

/// One node of a class tree: a class, or the interface at the root.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Node {
    /// Guaranteed rate, bits/s.
    pub rate: u64,
    /// Never exceeded, bits/s; at least `rate`.
    pub ceil: u64,
    /// Lower is offered spare bandwidth first.
    pub prio: u8,
    /// Share of spare bandwidth within one prio; never 0.
    pub weight: u64,
    /// Child node indexes; empty for a leaf.
    pub children: Vec<usize>,
}

/// A class tree. Node 0 is the root (the interface: its rate and ceil are the link's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tree {
    pub nodes: Vec<Node>,
}

impl Tree {
    /// The tree of interface `iface` of `config`, with node `i + 1` for the interface's
    /// `i`-th class in file order. Returns the tree and, per node, the index of its class in
    /// `config.classes` (`None` for the root).
    #[must_use]
    pub fn from_config(config: &Config, iface: &str) -> (Self, Vec<Option<usize>>) {
        let link = config.interface(iface).map_or(0, |i| i.rate.bits_per_sec());
        let classes: Vec<(usize, &Class)> =
            config.classes.iter().enumerate().filter(|(_, c)| c.interface == iface).collect();
        let mut nodes = vec![Node { rate: link, ceil: link, prio: 0, weight: 1, children: Vec::new() }];
        let mut ids = vec![None];
        for (i, c) in &classes {
            nodes.push(Node {
                rate: c.rate.bits_per_sec(),
                ceil: c.ceil.bits_per_sec(),
                prio: c.prio,
                weight: c.weight.map_or_else(|| c.rate.bits_per_sec().max(1), u64::from),
                children: Vec::new(),
            });
            ids.push(Some(*i));
        }
        for (pos, (_, c)) in classes.iter().enumerate() {
            let parent =
                c.parent.as_ref().map_or(0, |p| 1 + classes.iter().position(|(_, x)| &x.name == p).expect("validated"));
            nodes[parent].children.push(pos + 1);
        }
        (Self { nodes }, ids)
    }

    /// Whether node `i` is a leaf (carries traffic).
    #[must_use]
    pub fn is_leaf(&self, i: usize) -> bool {
        self.nodes[i].children.is_empty()
    }

    /// Sets `wants[i]` to what node `i` can use, and the same for the nodes under it: a
    /// leaf's own demand, an inner class's children's wants added up, capped at its ceil;
    /// and has `floors` add up the leaves' floors under each node, in the same walk (the
    /// lending pass; [`NoFloors`] for none). Returns `wants[i]` and node `i`'s floor. One pass
    /// over the tree: each node's want is then read, not computed again at each level above
    /// it.
    fn want(&self, p: &Packed, i: usize, demand: &[u64], wants: &mut [u64], floors: &mut impl Floors) -> (u64, u64) {
        let (raw, sum) = if p.leaf[i] {
            (demand[i], floors.leaf(i))
        } else {
            // A leaf child's want is worked out here rather than in a call of its own: most
            // nodes are leaves.
            self.nodes[i]
                .children
                .iter()
                .map(|&c| {
                    if p.leaf[c] {
                        wants[c] = demand[c].min(p.ceil[c]);
                        let f = floors.leaf(c);
                        floors.set(c, f);
                        (wants[c], f)
                    } else {
                        self.want(p, c, demand, wants, floors)
                    }
                })
                .fold((0u64, 0u64), |(w, f), (cw, cf)| (w.saturating_add(cw), f.saturating_add(cf)))
        };
        wants[i] = raw.min(p.ceil[i]);
        floors.set(i, sum);
        (wants[i], sum)
    }

    /// Allocates the link among the leaves. `demand[i]` is what leaf `i` would send (bits/s;
    /// ignored for inner nodes). Returns each node's allocation (inner nodes: the sum of
    /// their children's), so that `alloc[0]` is what the link carries.
    #[must_use]
    pub fn allocate(&self, demand: &[u64]) -> Vec<u64> {
        self.allocate_and_want(demand).0
    }

    /// [`Self::allocate`], and what each node wants (a leaf its demand, an inner node its
    /// children's wants added up, each capped at its ceil): what [`Self::allocate_one`]
    /// starts from.
    #[must_use]
    pub fn allocate_and_want(&self, demand: &[u64]) -> (Vec<u64>, Vec<u64>) {
        self.allocate_and_want_at(&self.packed(), demand)
    }

    /// [`Self::allocate_and_want`], with `p` this tree's [`Self::packed`]: for a caller that
    /// allocates the same tree every tick.
    #[must_use]
    pub fn allocate_and_want_at(&self, p: &Packed, demand: &[u64]) -> (Vec<u64>, Vec<u64>) {
        self.allocate_with(p, demand, &p.rate, self.link_cap())
    }

    /// What the allocator reads of each node, packed.
    #[must_use]
    pub fn packed(&self) -> Packed {
        Packed {
            rate: self.nodes.iter().map(|n| n.rate).collect(),
            ceil: self.nodes.iter().map(|n| n.ceil).collect(),
            weight: self.nodes.iter().map(|n| n.weight).collect(),
            prio: self.nodes.iter().map(|n| n.prio).collect(),
            leaf: self.nodes.iter().map(|n| n.children.is_empty()).collect(),
        }
    }

    /// What the root may give: the link's rate, or its ceil if lower.
    fn link_cap(&self) -> u64 {
        self.nodes[0].ceil.min(self.nodes[0].rate)
    }

    /// The leaves' node indexes, in order (not the root, even alone).
    #[must_use]
    pub fn leaves(&self) -> Vec<usize> {
        (1..self.nodes.len()).filter(|&i| self.is_leaf(i)).collect()
    }

    /// Each node's parent (the root's: itself).
    #[must_use]
    pub fn parents(&self) -> Vec<usize> {
        let mut parents = vec![0; self.nodes.len()];
        for (i, n) in self.nodes.iter().enumerate() {
            for &c in &n.children {
                parents[c] = i;
            }
        }
        parents
    }

    /// What [`Self::allocate`] would give leaf `leaf` if it wanted all it can get and the
    /// other leaves what they want in `wants` (from [`Self::allocate_and_want`]); `parents`
    /// from [`Self::parents`]. Only the wants of the leaf's ancestors change, and only the
    /// split of what each of them gets among its children decides what reaches the leaf: this
    /// visits the children of the leaf's ancestors, not the whole tree. Returns that rate and
    /// the node visits it took (counted as [`Self::allocate`]'s: one per node given a share).
    #[must_use]
    pub fn allocate_one(&self, leaf: usize, wants: &[u64], parents: &[usize]) -> (u64, usize) {
        self.allocate_one_at(&self.packed(), leaf, wants, parents, &mut Scratch::default())
    }

    /// [`Self::allocate_one`], with `p` this tree's [`Self::packed`], and `s` buffers to
    /// reuse: a tick computes a score of these, and their buffers, made anew for each and
    /// grown as they filled, were a twentieth of a tick at 10,000 classes (`malloc`, `realloc`
    /// and `free` under `Pacer::refresh_wake` in `perf`).
    #[must_use]
    pub fn allocate_one_at(
        &self,
        p: &Packed,
        leaf: usize,
        wants: &[u64],
        parents: &[usize],
        s: &mut Scratch,
    ) -> (u64, usize) {
        let mut path = std::mem::take(&mut s.path);
        let mut what_if = std::mem::take(&mut s.what_if);
        path.clear();
        path.push(leaf);
        let mut at = leaf;
        while at != 0 {
            at = parents[at];
            path.push(at);
        }
        path.reverse();
        // The wants along the path, the leaf's first: all it can get, capped at each ceil.
        what_if.clear();
        what_if.resize(path.len(), 0);
        what_if[path.len() - 1] = p.ceil[leaf];
        // What child `c` of the path's node at depth `d` wants.
        let want = |what_if: &[u64], d: usize, c: usize| if c == path[d + 1] { what_if[d + 1] } else { wants[c] };
        let mut visits = 1;
        for d in (0..path.len() - 1).rev() {
            let raw =
                self.nodes[path[d]].children.iter().map(|&c| want(&what_if, d, c)).fold(0u64, u64::saturating_add);
            what_if[d] = raw.min(p.ceil[path[d]]);
        }
        let mut amount = what_if[0].min(self.link_cap());
        for d in 0..path.len() - 1 {
            let n = &self.nodes[path[d]];
            s.wants.clear();
            s.wants.extend(n.children.iter().map(|&c| want(&what_if, d, c)));
            self.split(p, path[d], amount, |c| p.rate[c], s);
            amount = n.children.iter().position(|&c| c == path[d + 1]).map_or(0, |k| s.split[k]);
            visits += n.children.len();
        }
        (s.path, s.what_if) = (path, what_if);
        (amount, visits)
    }

    /// Allocates at most `cap` as [`Self::allocate`] does, but with `floor[i]` as leaf `i`'s
    /// guarantee instead of its configured rate (an inner node's: its leaves' floors added
    /// up). With a first allocation as the floors, this hands out what is left over it by
    /// HTB's rules: by prio, then weight, within every ceil. The floors must fit their ceils
    /// and `cap`, and the leaves want at least their floors.
    #[must_use]
    pub fn allocate_over(&self, demand: &[u64], floor: &[u64], cap: u64) -> Vec<u64> {
        self.allocate_over_at(&self.packed(), demand, floor, cap)
    }

    /// [`Self::allocate_over`], with `p` this tree's [`Self::packed`].
    #[must_use]
    pub fn allocate_over_at(&self, p: &Packed, demand: &[u64], floor: &[u64], cap: u64) -> Vec<u64> {
        assert_eq!(floor.len(), self.nodes.len(), "one floor per node");
        assert_eq!(demand.len(), self.nodes.len(), "one demand per node");
        debug_assert!(*p == self.packed(), "this tree's packed nodes");
        let n = self.nodes.len();
        let (mut rates, mut wants, mut alloc) = (vec![0u64; n], vec![0u64; n], vec![0u64; n]);
        let (root, _) = self.want(p, 0, demand, &mut wants, &mut SumFloors { floor, sums: &mut rates });
        self.give(p, 0, root.min(cap), &wants, &rates, &mut alloc, &mut Scratch::default());
        alloc
    }

    /// [`Self::allocate_and_want`] with `rates` as the nodes' guarantees and `cap` for the
    /// root.
    fn allocate_with(&self, p: &Packed, demand: &[u64], rates: &[u64], cap: u64) -> (Vec<u64>, Vec<u64>) {
        assert_eq!(demand.len(), self.nodes.len(), "one demand per node");
        debug_assert!(*p == self.packed(), "this tree's packed nodes");
        let mut alloc = vec![0u64; self.nodes.len()];
        let mut wants = vec![0u64; self.nodes.len()];
        let (root, _) = self.want(p, 0, demand, &mut wants, &mut NoFloors);
        self.give(p, 0, root.min(cap), &wants, rates, &mut alloc, &mut Scratch::default());
        (alloc, wants)
    }

    /// Gives node `i` exactly `amount` (at most what it wants, `all_wants[i]`) and divides it
    /// among its children, each guaranteed `rates[child]`.
    #[expect(clippy::too_many_arguments, reason = "the recursion's state")]
    fn give(
        &self,
        p: &Packed,
        i: usize,
        amount: u64,
        all_wants: &[u64],
        rates: &[u64],
        alloc: &mut [u64],
        s: &mut Scratch,
    ) {
        alloc[i] = amount;
        if p.leaf[i] {
            return;
        }
        let n = &self.nodes[i];
        s.wants.clear();
        s.wants.extend(n.children.iter().map(|&c| all_wants[c]));
        self.split(p, i, amount, |c| rates[c], s);
        // Every child's share is written before the inner ones divide theirs (which reuses
        // the buffers).
        for (&c, &share) in n.children.iter().zip(&s.split) {
            alloc[c] = share;
        }
        for &c in n.children.iter().filter(|&&c| !p.leaf[c]) {
            self.give(p, c, alloc[c], all_wants, rates, alloc, s);
        }
    }

    /// How node `i`'s `amount` divides among its children, the `k`-th wanting `s.wants[k]`
    /// and guaranteed `rate(child)`, by HTB's rules: into `s.split`.
    fn split(&self, p: &Packed, i: usize, amount: u64, rate: impl Fn(usize) -> u64, s: &mut Scratch) {
        let n = &self.nodes[i];
        let wants = &s.wants;
        // 1. Guarantees.
        s.split.clear();
        s.split.extend(n.children.iter().zip(wants).map(|(&c, &w)| w.min(rate(c))));
        let mut left = amount.saturating_sub(s.split.iter().sum());
        if left == 0 {
            return;
        }
        // 2. Spare, by prio, then in proportion to weight, water-filling up to each want. The
        // children that want more than their guarantee, with their prios, in one pass; their
        // prios as a set of bits, taken lowest first (sorting them was a tenth of a tick at
        // 10,000 classes, and reading each child's prio again for each prio a fiftieth).
        let mut prios = [0u64; 4];
        s.wanting.clear();
        for (k, &c) in n.children.iter().enumerate() {
            if s.split[k] < wants[k] {
                let prio = p.prio[c];
                prios[usize::from(prio / 64)] |= 1 << (prio % 64);
                s.wanting.push((k, prio));
            }
        }
        let prios = prios.into_iter().enumerate().flat_map(|(word, bits)| {
            (0..64u8).filter(move |b| bits & (1 << b) != 0).map(move |b| u8::try_from(word * 64).unwrap_or(0) + b)
        });
        for prio in prios {
            if left == 0 {
                break;
            }
            // Only this prio's children grow here: the others still want more.
            s.open.clear();
            s.open.extend(s.wanting.iter().filter(|&&(_, q)| q == prio).map(|&(k, _)| k));
            left = water_fill(&mut s.open, &mut s.parts, &mut s.split, wants, |k| p.weight[n.children[k]], left);
        }
    }
}

/// What the allocator reads of each node, by node, each in an array of its own: at 10,000
/// classes a [`Node`] takes a cache line, and an allocation read every node's line two or
/// three times (the wants, the shares, the lending's floors), a third of a tick's cache
/// misses. A caller that allocates the same tree every tick keeps one ([`Tree::packed`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Packed {
    rate: Vec<u64>,
    ceil: Vec<u64>,
    weight: Vec<u64>,
    prio: Vec<u8>,
    leaf: Vec<bool>,
}

impl Packed {
    /// Node `i`'s guaranteed rate.
    #[must_use]
    pub fn rate(&self, i: usize) -> u64 {
        self.rate[i]
    }
}

/// What [`Tree::want`] adds up besides the wants: a leaf's floor, and each node's sum.
trait Floors {
    fn leaf(&self, i: usize) -> u64;
    fn set(&mut self, i: usize, sum: u64);
}

/// No floors (the first allocation: its guarantees are the nodes' rates).
struct NoFloors;

impl Floors for NoFloors {
    fn leaf(&self, _: usize) -> u64 {
        0
    }

    fn set(&mut self, _: usize, _: u64) {}
}

/// The leaves' `floor`, added up into `sums` (a leaf's own, an inner node's leaves' sum):
/// the lending pass's guarantees.
struct SumFloors<'a> {
    floor: &'a [u64],
    sums: &'a mut [u64],
}

impl Floors for SumFloors<'_> {
    fn leaf(&self, i: usize) -> u64 {
        self.floor[i]
    }

    fn set(&mut self, i: usize, sum: u64) {
        self.sums[i] = sum;
    }
}

/// The buffers of [`Tree::split`], kept from one node to the next (a few allocations a
/// node, at 10,000 classes, were a twentieth of an allocation), and of
/// [`Tree::allocate_one_at`], kept from one call to the next.
#[derive(Debug, Clone, Default)]
pub struct Scratch {
    /// The path from the root to the leaf, and the wants along it.
    path: Vec<usize>,
    what_if: Vec<u64>,
    /// The children's wants, in order (the caller's input).
    wants: Vec<u64>,
    /// Their shares (the output).
    split: Vec<u64>,
    /// The children that want more than their guarantee, and their prios.
    wanting: Vec<(usize, u8)>,
    /// The water-filling's members and their parts.
    open: Vec<usize>,
    parts: Vec<u64>,
}

/// Shares `left` among `open` (indexes into `share`, each under its want) in proportion to
/// `weight`, each member growing at most to `wants[k]`; what capped members cannot take goes
/// to the others. Returns what is left when every member has what it wants. `open` is left
/// with the members that want more, `parts` is scratch.
fn water_fill(
    open: &mut Vec<usize>,
    parts: &mut Vec<u64>,
    share: &mut [u64],
    wants: &[u64],
    weight: impl Fn(usize) -> u64,
    mut left: u64,
) -> u64 {
    while left > 0 && !open.is_empty() {
        let total_weight: u128 = open.iter().map(|&k| u128::from(weight(k))).sum();
        // Largest step that keeps every member at or under its want: a member whose room is
        // smaller than its proportional part is filled and leaves the group.
        let mut given = 0u64;
        parts.clear();
        match u64::try_from(total_weight) {
            // One divisor for every member (a division for each child of each node, twice a
            // tick, was a good part of a tick at 10,000 classes).
            Ok(total) => {
                let total = Divisor::new(total);
                parts.extend(open.iter().map(|&k| total.map_or(0, |total| total.mul_div(left, weight(k)))));
            }
            Err(_) => parts.extend(open.iter().map(|&k| {
                u64::try_from(u128::from(left) * u128::from(weight(k)) / total_weight).expect("at most left")
            })),
        }
        // Hand out the rounding remainder one unit at a time, so nothing stays idle.
        let mut remainder = left - parts.iter().sum::<u64>();
        for p in parts.iter_mut() {
            if remainder == 0 {
                break;
            }
            *p += 1;
            remainder -= 1;
        }
        for (&k, &part) in open.iter().zip(parts.iter()) {
            let take = part.min(wants[k] - share[k]);
            share[k] += take;
            given += take;
        }
        left -= given;
        open.retain(|&k| share[k] < wants[k]);
        if given == 0 {
            break;
        }
    }
    left
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    const M: u64 = 1_000_000;

    fn leaf(rate: u64, ceil: u64, prio: u8) -> Node {
        Node { rate, ceil, prio, weight: rate, children: Vec::new() }
    }

    #[test]
    fn what_is_left_over_a_first_allocation_goes_by_the_same_rules() {
        // An inner class of ceil 4 (a 2, b 2) beside c (6): a and c were given 1 and 2, b 1,
        // and only a and c would take more. The inner class stops at its ceil; c takes the rest.
        let mut root = leaf(10 * M, 10 * M, 0);
        root.children = vec![1, 4];
        let mut inner = leaf(4 * M, 4 * M, 0);
        inner.children = vec![2, 3];
        let t = Tree { nodes: vec![root, inner, leaf(2 * M, 4 * M, 0), leaf(2 * M, 4 * M, 0), leaf(6 * M, 10 * M, 0)] };
        let floor = [0, 0, M, M, 2 * M];
        let a = t.allocate_over(&[0, 0, u64::MAX, M, u64::MAX], &floor, 10 * M);
        assert_eq!(a, [10 * M, 4 * M, 3 * M, M, 6 * M]);
        // Within a smaller cap, the floors first.
        let a = t.allocate_over(&[0, 0, u64::MAX, M, u64::MAX], &floor, 5 * M);
        assert_eq!(a[2..], [M + 400_000, M, 2 * M + 600_000]);
    }

    /// Seed 000: link 10 mbit; alex 1.9, betty 2.9, carl 4.9 at prio 1, guest 0.3 at prio 0,
    /// all ceil 10 mbit.
    fn roommates() -> Tree {
        let mut root = leaf(10 * M, 10 * M, 0);
        root.children = vec![1, 2, 3, 4];
        Tree {
            nodes: vec![
                root,
                leaf(1_900_000, 10 * M, 1),
                leaf(2_900_000, 10 * M, 1),
                leaf(4_900_000, 10 * M, 1),
                leaf(300_000, 10 * M, 0),
            ],
        }
    }

    const GREEDY: u64 = 100 * M;

    /// Allocation in units of 10 kbit/s (the table's 0.01 mbit), rounded, for alex, betty,
    /// carl, guest.
    fn shares(demand: [u64; 4]) -> [u64; 4] {
        let t = roommates();
        let a = t.allocate(&[0, demand[0], demand[1], demand[2], demand[3]]);
        assert!(a[0] <= 10 * M);
        [1, 2, 3, 4].map(|i| (a[i] + 5_000) / 10_000)
    }

    #[test]
    fn seed_000_table() {
        assert_eq!(shares([GREEDY, 0, 0, 0]), [1000, 0, 0, 0]);
        assert_eq!(shares([GREEDY, GREEDY, 0, 0]), [396, 604, 0, 0]);
        assert_eq!(shares([GREEDY, GREEDY, GREEDY, 0]), [196, 299, 505, 0]);
        assert_eq!(shares([GREEDY, 0, 0, GREEDY]), [190, 0, 0, 810]);
        assert_eq!(shares([GREEDY, GREEDY, GREEDY, GREEDY]), [190, 290, 490, 30]);
        assert_eq!(shares([GREEDY, GREEDY, 2_500_000, 0]), [297, 453, 250, 0]);
    }

    #[test]
    fn ceil_caps_borrowing_and_the_rest_goes_to_others() {
        let mut t = roommates();
        t.nodes[1].ceil = 3 * M;
        let a = t.allocate(&[0, GREEDY, GREEDY, 0, 0]);
        assert_eq!(a[1], 3 * M);
        assert_eq!(a[2], 7 * M);
    }

    /// The difference from HTB (see the module docs): a prio-7 leaf under a prio-2 parent
    /// gets its parent's share of the root's spare before a prio-4 class beside the parent.
    #[test]
    fn prio_orders_siblings_only() {
        // root 10: servers (rate 3, prio 2; child backup rate 3, prio 7), guest (rate 1, prio 4).
        let mut root = leaf(10 * M, 10 * M, 0);
        root.children = vec![1, 3];
        let mut servers = leaf(3 * M, 10 * M, 2);
        servers.children = vec![2];
        let t = Tree { nodes: vec![root, servers, leaf(3 * M, 10 * M, 7), leaf(M, 10 * M, 4)] };
        let a = t.allocate(&[0, 0, GREEDY, GREEDY]);
        // Guest keeps its guarantee; the root's spare goes to servers (prio 2) first.
        assert_eq!((a[2], a[3]), (9 * M, M));
    }

    #[test]
    fn nested_classes_borrow_inside_their_parent_first() {
        // root 10: house (rate 6, children a 3 / b 3), office (rate 4)
        let mut root = leaf(10 * M, 10 * M, 0);
        root.children = vec![1, 4];
        let mut house = leaf(6 * M, 10 * M, 0);
        house.children = vec![2, 3];
        let t =
            Tree { nodes: vec![root, house, leaf(3 * M, 10 * M, 0), leaf(3 * M, 10 * M, 0), leaf(4 * M, 10 * M, 0)] };
        // a greedy, b idle, office greedy: a gets house's 6, office its 4.
        let a = t.allocate(&[0, 0, GREEDY, 0, GREEDY]);
        assert_eq!((a[2], a[3], a[4]), (6 * M, 0, 4 * M));
        // office idle: a borrows everything.
        let a = t.allocate(&[0, 0, GREEDY, 0, 0]);
        assert_eq!(a[2], 10 * M);
    }

    fn arb_tree() -> impl Strategy<Value = (Tree, Vec<u64>)> {
        // A two-level tree: up to 4 top-level classes with up to 3 children each.
        let link = 1_000u64..1_000_000_000;
        (link, prop::collection::vec((1u64..100, 0usize..4, 0u8..3, 1u64..5, 0u64..200), 1..12)).prop_map(
            |(link, specs)| {
                let mut nodes = vec![Node { rate: link, ceil: link, prio: 0, weight: 1, children: Vec::new() }];
                let total_top: u64 = specs.iter().map(|s| s.0).sum();
                // Top-level classes split the link's guarantee; a class's children split its own.
                let tops = specs.len().div_ceil(3);
                for (k, s) in specs.iter().take(tops).enumerate() {
                    let rate = link * s.0 / total_top / 2 + 1;
                    let ceil = (rate + link * s.3 / 4).min(link);
                    nodes.push(Node { rate, ceil, prio: s.2, weight: s.3, children: Vec::new() });
                    nodes[0].children.push(k + 1);
                }
                for s in specs.iter().skip(tops) {
                    let parent = 1 + s.1 % tops;
                    let prate = nodes[parent].rate;
                    let used: u64 = nodes[parent].children.iter().map(|&c| nodes[c].rate).sum();
                    let rate = (prate - used.min(prate)) * s.0 / 200;
                    if rate == 0 {
                        continue;
                    }
                    let ceil = nodes[parent].ceil.min(rate + link * s.3 / 4).max(rate);
                    let id = nodes.len();
                    nodes.push(Node { rate, ceil, prio: s.2, weight: s.3, children: Vec::new() });
                    nodes[parent].children.push(id);
                }
                let demand =
                    specs.iter().map(|s| link * s.4 / 100).chain(std::iter::repeat(0)).take(nodes.len()).collect();
                (Tree { nodes }, demand)
            },
        )
    }

    fn leaves(t: &Tree) -> Vec<usize> {
        (1..t.nodes.len()).filter(|&i| t.is_leaf(i)).collect()
    }

    proptest! {
        #[test]
        fn conservation_guarantees_ceilings_work_conservation((t, demand) in arb_tree()) {
            let a = t.allocate(&demand);
            for (i, n) in t.nodes.iter().enumerate() {
                // Conservation: children never exceed their parent.
                if !n.children.is_empty() {
                    let sum: u64 = n.children.iter().map(|&c| a[c]).sum();
                    prop_assert_eq!(sum, a[i], "node {} gives out exactly what it has", i);
                }
                // Ceilings.
                prop_assert!(a[i] <= n.ceil, "node {} over its ceil", i);
            }
            prop_assert!(a[0] <= t.nodes[0].rate);
            for &l in &leaves(&t) {
                // Never more than asked for; guarantees honoured.
                prop_assert!(a[l] <= demand[l]);
                prop_assert!(a[l] >= demand[l].min(t.nodes[l].rate), "leaf {} below min(demand, rate)", l);
            }
            // Work conservation: a leaf left wanting has a saturated node on its way to the
            // root (itself or an ancestor at its ceil, or the link full).
            let mut parent = vec![usize::MAX; t.nodes.len()];
            for (i, n) in t.nodes.iter().enumerate() {
                for &c in &n.children {
                    parent[c] = i;
                }
            }
            for &l in &leaves(&t) {
                if a[l] < demand[l] {
                    let mut x = l;
                    let mut saturated = false;
                    loop {
                        if a[x] == t.nodes[x].ceil || (x == 0 && a[0] == t.nodes[0].rate) {
                            saturated = true;
                            break;
                        }
                        if x == 0 {
                            break;
                        }
                        x = parent[x];
                    }
                    prop_assert!(saturated, "leaf {} wants {} but has {} with nothing saturated: {:?}", l, demand[l], a[l], a);
                }
            }
        }

        /// A leaf's allocation computed along its path, as if it wanted all it can get, is
        /// what a whole allocation with that want gives it.
        #[test]
        fn one_leaf_wanting_all_it_can_get_is_given_what_a_whole_allocation_gives_it((t, demand) in arb_tree()) {
            let (_, wants) = t.allocate_and_want(&demand);
            let parents = t.parents();
            for l in leaves(&t) {
                let mut what_if = demand.clone();
                what_if[l] = u64::MAX;
                let (one, visits) = t.allocate_one(l, &wants, &parents);
                prop_assert_eq!(one, t.allocate(&what_if)[l], "leaf {}", l);
                prop_assert!(visits <= t.nodes.len());
            }
        }

        /// Two greedy siblings at the same prio, nothing else: spare splits in proportion to
        /// weight; a lower prio is served before a higher one.
        #[test]
        fn proportional_and_priority(w1 in 1u64..100, w2 in 1u64..100, r1 in 1u64..40, r2 in 1u64..40, p2 in 0u8..2) {
            let link = 100 * M;
            let mut root = leaf(link, link, 0);
            root.children = vec![1, 2];
            let n1 = Node { rate: r1 * M, ceil: link, prio: 0, weight: w1, children: vec![] };
            let n2 = Node { rate: r2 * M, ceil: link, prio: p2, weight: w2, children: vec![] };
            let t = Tree { nodes: vec![root, n1, n2] };
            let a = t.allocate(&[0, GREEDY * 10, GREEDY * 10]);
            prop_assert_eq!(a[1] + a[2], link);
            let spare = link - (r1 + r2) * M;
            if p2 == 0 {
                let expect1 = r1 * M + u64::try_from(u128::from(spare) * u128::from(w1) / u128::from(w1 + w2)).unwrap();
                prop_assert!(a[1].abs_diff(expect1) <= 1, "{} vs {}", a[1], expect1);
            } else {
                // Class 1 (prio 0) takes all the spare.
                prop_assert_eq!(a[1], r1 * M + spare);
                prop_assert_eq!(a[2], r2 * M);
            }
        }
    }
}
