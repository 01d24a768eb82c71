//! From allocations to the rates the datapath paces at, every tick.
//!
//! The allocator ([`crate::allocation::tree`]) divides the link among the classes by what each wants
//! ([`crate::allocation::demand`]). Two things stand between its allocation and the rates the datapath
//! paces at, both because EDT gives a packet its departure time when it arrives, and a
//! packet already given one cannot be called back:
//!
//! - **The link is handed on once it is free** ([`Settler`]): what a lowered class gives up
//!   is given to the classes that grow only once the packets it queued at its old rate have
//!   left.
//! - **A quiet class is paced at its wake rate**: what the allocator would give it if it
//!   became greedy now, with every other class's demand as it is. A class that sends little
//!   (nothing, DNS, a ping) is allocated little; paced at that (or at its guarantee), the
//!   first window of a transfer it starts would be queued far ahead at a rate that lasts
//!   only until the next tick, or dropped at the horizon, and TCP would stall on the losses
//!   for seconds. HTB lends such a class the borrowers' bandwidth the moment it has a packet;
//!   paced at its wake rate, its packets are given their times as HTB would send them, and
//!   the borrowers are moved down at the next tick. Meanwhile the link's rate has been given
//!   out already, so a quiet class's packets wait behind the link clock
//!   (`shaper_common::CLASS_QUIET`): behind the departures the busy classes have been given.
//!   The classes paced above their guarantee ([`Mode::Borrowing`]) wait in turn behind the
//!   quiet packets so placed (`shaper_common::CLASS_BORROWING`), up to
//!   `shaper_common::HOLD_MAX_NS` ahead (by then the next tick has moved them down): the
//!   time a waking class takes is the borrowers', not on top of theirs, as HTB serves a
//!   class that wakes ahead of those that borrow. The link so keeps its rate while classes
//!   wake, alone, several in a tick, or one after another next to borrowers that fill the
//!   link; a waking transfer starts behind the link's queue (a few ms under CoDel) and gets
//!   its share from the next tick, its clock carrying that delay on; a sparse flow's packet
//!   (a ping, DNS) still leaves at once, within the sparse budget, and so does a quiet
//!   class's packet within its guarantee (a meter at the guaranteed rate with a burst of
//!   four full frames), the borrowers held in its place: HTB serves a class within its rate
//!   first. Classes within their guarantee never wait.
//!
//!   A class is quiet when it is not limited and wants at most 1/[`QUIET_DIVISOR`] of its
//!   wake rate. A wake rate costs a visit of each child of the class's ancestors
//!   ([`Tree::allocate_one`]); they are refreshed round-robin within [`WAKE_BUDGET`] node
//!   visits a tick: every tick in a flat tree of up to 64 classes; at 1,024 classes, flat,
//!   four a tick, each class's within 2.6 s (at the default 10 ms tick).
//! - **What no class was allocated is lent** to the classes that would send more (limited
//!   lately, and sending still), by HTB's rules (prio, weight, every ceil), on top of their
//!   allocations: the rates paced add up to the link at most, and what one class leaves idle
//!   another may send at once. HTB's borrowing is instant: a greedy TCP flow that halved its
//!   window, or a borrower the tick an on/off sender stops, would otherwise wait for its
//!   estimator to catch up. So is what a class was allocated and does not send now (over the
//!   queue window, more than 1/[`QUIET_DIVISOR`] of it): a stream allocated for a bunch that
//!   has drained, an application between two writes, a sender gone off. It keeps its pacing
//!   rate, so that what it sends next leaves at once; the link may then carry that on top of
//!   the borrowers until the next tick takes the loan back.
//! - No class is paced below its guarantee.

use std::collections::VecDeque;

use super::{
    demand::{mul_div, percent_over, Divisor, Estimate, FRAME_BITS, HEADROOM_FLOOR, HEADROOM_PERCENT},
    tree::{Packed, Scratch, Tree},
};

/// A class that is not limited is quiet while it wants at most `1/QUIET_DIVISOR` of its wake
/// rate: paced at the wake rate, what it sends can add at most that much to the link.
pub const QUIET_DIVISOR: u64 = 8;

/// Node visits per tick the wake rates may cost (an allocation visits every node).
pub const WAKE_BUDGET: usize = 4096;

/// The rates of one tick, indexed like the tree's nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rates {
    /// The allocator's share, as the link is handed on (inner nodes: their children's sum).
    pub allocation: Vec<u64>,
    /// The rate each leaf is paced at (inner nodes: their allocation).
    pub pacing: Vec<u64>,
    /// How each leaf's packets stand against the link clock (inner nodes: the default).
    pub mode: Vec<Mode>,
}

/// How a leaf's packets stand against the link clock.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Mode {
    /// Paced at its allocation, within its guarantee: it keeps to its own clock.
    #[default]
    Allocated,
    /// Paced above its guarantee: its packets wait for those of the quiet classes held
    /// behind the link clock (`shaper_common::CLASS_BORROWING`), so that a class that wakes
    /// takes its first packets' time from the borrowers rather than on top of them.
    Borrowing,
    /// Paced at its wake rate: its packets leave behind the link clock
    /// (`shaper_common::CLASS_QUIET`).
    Quiet,
}

/// What the pacer knows of one leaf at a tick (inner nodes: the default).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Leaf {
    /// What it wants (its estimator's demand), bits/s.
    pub demand: u64,
    /// Whether its pacing rate holds it back now.
    pub limited: bool,
    /// Whether it was limited within its estimator's long window: it would send more (a
    /// greedy TCP flow between two windows is not limited for a moment).
    pub lately_limited: bool,
    /// How far ahead of now its clock is, ns.
    pub backlog_ns: u64,
    /// What it sends now ([`Estimate::sending`]), bits/s.
    pub sending: u64,
}

impl Leaf {
    /// What the estimator concluded of a leaf whose clock is `backlog_ns` ahead of now.
    #[must_use]
    pub fn new(e: &Estimate, backlog_ns: u64) -> Self {
        Self { demand: e.demand, limited: e.limited, lately_limited: e.lately_limited, backlog_ns, sending: e.sending }
    }

    /// What of `allocated` it keeps from the borrowers: all of it, but for a class that is not
    /// limited, has nothing queued and sends less than its allocation by more than
    /// `1/QUIET_DIVISOR` of it (between two writes, off, or allocated for a bunch that has
    /// drained), which keeps what it sends with its headroom.
    fn kept(&self, allocated: u64) -> u64 {
        if self.limited || self.backlog_ns != 0 {
            return allocated;
        }
        let sends = percent_over(self.sending, HEADROOM_PERCENT).saturating_add(HEADROOM_FLOOR);
        if sends < allocated - allocated / QUIET_DIVISOR {
            sends
        } else {
            allocated
        }
    }

    /// Whether it is lent what others leave, if it keeps all it was allocated ([`Self::kept`]):
    /// it was limited lately (it would send more), and it sends now (a class limited until it
    /// went silent, a transfer that ended, would not use it).
    fn borrows(&self) -> bool {
        self.lately_limited && (self.limited || self.backlog_ns > 0 || self.sending > 0)
    }
}

/// Turns allocations into pacing rates, tick after tick (see the module docs).
#[derive(Debug, Clone, Default)]
pub struct Pacer {
    settler: Settler,
    /// Per node: the leaf's wake rate, as last computed (0: never).
    wake: Vec<u64>,
    /// The next leaf whose wake rate to compute.
    cursor: usize,
    /// The tree's leaves, in node order, and each node's parent: a `Pacer` serves one tree
    /// (its state is per node), so they are found once, not every tick (at 10,000 classes,
    /// walking the nodes for them was a few percent of a tick).
    leaves: Vec<usize>,
    parents: Vec<usize>,
    /// The tree's nodes as the allocator reads them ([`Tree::packed`]).
    packed: Packed,
    /// Scratch for each tick's demands and queues, kept for the next tick.
    demand: Vec<u64>,
    backlog: Vec<u64>,
    /// The wake rates' buffers, kept from one to the next.
    scratch: Scratch,
}

impl Pacer {
    /// The rates for this tick, given what is known of each leaf at `now_ns` (`leaves`,
    /// indexed like the tree's nodes).
    pub fn tick(&mut self, tree: &Tree, leaves: &[Leaf], now_ns: u64) -> Rates {
        let n = tree.nodes.len();
        assert_eq!(leaves.len(), n, "one entry per node");
        if self.wake.len() != n {
            self.wake = vec![0; n];
            self.cursor = 0;
            self.leaves = tree.leaves();
            self.parents = tree.parents();
            self.packed = tree.packed();
        }
        debug_assert!(self.parents == tree.parents() && self.packed == tree.packed(), "a Pacer serves one tree");
        let mut demand = std::mem::take(&mut self.demand);
        let mut backlog = std::mem::take(&mut self.backlog);
        demand.clear();
        backlog.clear();
        for l in leaves {
            demand.push(l.demand);
            backlog.push(l.backlog_ns);
        }
        let (allocation, wants) = tree.allocate_and_want_at(&self.packed, &demand);
        let allocated = self.settler.settle(tree, &self.leaves, &allocation, &backlog, now_ns);
        self.refresh_wake(tree, &wants, leaves);
        let mut pacing = Self::lend(tree, &self.packed, &self.leaves, &allocated, leaves, self.settler.committed);
        let mut mode = vec![Mode::Allocated; n];
        for &i in &self.leaves {
            let wake = self.wake[i];
            let guarantee = self.packed.rate(i);
            // A class part of whose allocation is lent (`lend`) is still paced at all of it.
            pacing[i] = pacing[i].max(allocated[i]);
            mode[i] = if !leaves[i].limited && demand[i] <= wake / QUIET_DIVISOR {
                pacing[i] = pacing[i].max(wake);
                Mode::Quiet
            } else if pacing[i] > guarantee {
                Mode::Borrowing
            } else {
                Mode::Allocated
            };
            pacing[i] = pacing[i].max(guarantee);
            self.settler.paced_at(i, pacing[i]);
        }
        (self.demand, self.backlog) = (demand, backlog);
        Rates { allocation: allocated, pacing, mode }
    }

    /// Each node's allocation, plus what is left of the link over the leaves' allocations
    /// (and the queues of lowered classes, `committed` in all), lent by HTB's rules to the
    /// classes that would send more (limited lately). The rates so paced add up to the link
    /// at most: what one class lets idle, another may send at once (a greedy TCP flow after
    /// it halved its window, a borrower the tick a steady class stops), not a tick or more
    /// later. A class that was never limited (a stream, an application's writes) is not
    /// lent anything: it would not use it, and it would take it from those that would. What
    /// a class is allocated and does not send ([`Leaf::kept`]: between two writes, off, or
    /// allocated for a bunch that has drained) is lent too, as HTB lends what a class leaves
    /// idle; its own entry here is what it kept, and `tick` paces it at all of its allocation
    /// (its estimator has not lowered its demand yet).
    fn lend(
        tree: &Tree,
        packed: &Packed,
        leaf_nodes: &[usize],
        allocated: &[u64],
        leaves: &[Leaf],
        committed: u64,
    ) -> Vec<u64> {
        let (mut sum, mut kept, mut any) = (0u64, 0u64, false);
        let mut floor = allocated.to_vec();
        let mut want = allocated.to_vec();
        for &i in leaf_nodes {
            let keeps = leaves[i].kept(allocated[i]);
            sum = sum.saturating_add(allocated[i]);
            kept = kept.saturating_add(keeps);
            floor[i] = keeps;
            want[i] = if keeps == allocated[i] && leaves[i].borrows() {
                any = true;
                u64::MAX
            } else {
                keeps
            };
        }
        let root = &tree.nodes[0];
        let cap = root.rate.min(root.ceil).saturating_sub(committed.saturating_sub(sum));
        if any && cap > kept {
            tree.allocate_over_at(packed, &want, &floor, cap)
        } else {
            floor
        }
    }

    /// Computes the wake rates of as many leaves as [`WAKE_BUDGET`] node visits allow (one
    /// at least), round-robin (limited leaves have no use for one and are skipped); `wants`
    /// as [`Tree::allocate_and_want`] gives them for this tick's demands.
    fn refresh_wake(&mut self, tree: &Tree, wants: &[u64], leaves: &[Leaf]) {
        let n = tree.nodes.len();
        let mut visits = 0;
        for _ in 0..n {
            if visits >= WAKE_BUDGET {
                break;
            }
            let i = self.cursor;
            self.cursor = if i + 1 < n { i + 1 } else { 0 };
            if i == 0 || !tree.is_leaf(i) || leaves[i].limited {
                continue;
            }
            let (wake, cost) = tree.allocate_one_at(&self.packed, i, wants, &self.parents, &mut self.scratch);
            self.wake[i] = wake;
            visits += cost;
        }
    }
}

/// Most cuts a [`Settler`] remembers per class (each lasts as long as the queue it left).
const MAX_HOLDS: usize = 64;

/// Holds back what the allocator gives to classes whose allocation grows while a class whose
/// allocation was lowered still has packets queued at its old rate: the datapath gave those
/// packets their departure times already, and they leave as scheduled, so the capacity a
/// lowered class gives up is only free once its queue has drained. Without this, the link
/// carries both the old queue and the newcomer's new rate for that long.
#[derive(Debug, Clone, Default)]
pub struct Settler {
    /// What each leaf was paced at after the last tick (nodes: what they were given).
    granted: Vec<u64>,
    /// Per node: the rates its queued packets still leave at, and until when (ns), oldest
    /// first.
    held: Vec<VecDeque<(u64, u64)>>,
    /// What the leaves take of the link after the last tick: each one's allocation, or the
    /// rate its queued packets still leave at if higher.
    committed: u64,
    /// Per node, scratch of each tick (a leaf's entries are written before they are read):
    /// what it holds, and the rate its queued packets still leave at.
    holds: Vec<u64>,
    leaving: Vec<u64>,
}

impl Settler {
    /// The allocation to apply now, given the allocator's `alloc` for `tree`, and each leaf's
    /// queue (`backlog_ns`, indexed like the nodes) at `now_ns`. Decreases apply at once;
    /// increases share what the link has left after every class's current allocation and
    /// every lowered class's queue, in proportion to how much each grows.
    /// `leaves` are the tree's leaves ([`Tree::leaves`]).
    pub fn settle(
        &mut self,
        tree: &Tree,
        leaves: &[usize],
        alloc: &[u64],
        backlog_ns: &[u64],
        now_ns: u64,
    ) -> Vec<u64> {
        let n = alloc.len();
        if self.granted.len() != n {
            self.granted = alloc.to_vec();
            self.held = vec![VecDeque::new(); n];
            self.committed = leaves.iter().map(|&i| alloc[i]).fold(0, u64::saturating_add);
            return alloc.to_vec();
        }
        let mut out = alloc.to_vec();
        // What each leaf holds now: its new allocation if that is not more than it had, its
        // old one otherwise, and the rate its queued packets still leave at.
        let (mut holds, mut leaving) = (std::mem::take(&mut self.holds), std::mem::take(&mut self.leaving));
        holds.resize(n, 0);
        leaving.resize(n, 0);
        let (mut used, mut growth) = (0u64, 0u64);
        for &i in leaves {
            let (old, new) = (self.granted[i], alloc[i]);
            // A cut whose queued packets would add less than half a frame to the link is not
            // held: holding it would stall a class that wants to grow by as little. (Worked
            // out for cuts only: a 128-bit division for every class was a tenth of this.)
            let held_back = || mul_div(old - new, backlog_ns[i], 1_000_000_000) > FRAME_BITS / 2;
            let held = &mut self.held[i];
            while held.front().is_some_and(|&(_, until)| until <= now_ns) {
                held.pop_front();
            }
            if new < old && held_back() && held.len() < MAX_HOLDS {
                // The packets queued until then were given departure times at `old`.
                held.push_back((old, now_ns.saturating_add(backlog_ns[i])));
            }
            leaving[i] = if held.is_empty() { 0 } else { held.iter().map(|&(rate, _)| rate).max().unwrap_or(0) };
            holds[i] = new.min(old).max(leaving[i]);
            used = used.saturating_add(holds[i]);
            // A class may grow back to what its own queue holds without taking anything.
            growth = growth.saturating_add(new.saturating_sub(holds[i]));
        }
        let free = tree.nodes[0].rate.saturating_sub(used);
        // `growth` is the same divisor for every class (when the link cannot give it all).
        let growth_divisor = if growth > free { Divisor::new(growth) } else { None };
        for &i in leaves {
            let wanted = alloc[i].saturating_sub(holds[i]);
            if wanted > 0 {
                let given = growth_divisor.map_or(wanted, |growth| growth.mul_div(wanted, free));
                out[i] = alloc[i].min(holds[i]) + given;
            }
        }
        self.granted.clone_from(&out);
        self.committed = leaves.iter().map(|&i| out[i].max(leaving[i])).fold(0, u64::saturating_add);
        (self.holds, self.leaving) = (holds, leaving);
        out
    }

    /// Records that leaf `i` is paced at `rate`, more than it was given (a quiet class paced
    /// at its wake rate): a class that then starts sending keeps that rate without growing.
    fn paced_at(&mut self, i: usize, rate: u64) {
        if let Some(g) = self.granted.get_mut(i) {
            *g = (*g).max(rate);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::allocation::tree::Node;

    const MS: u64 = 1_000_000;
    const MBIT: u64 = 1_000_000;

    fn leaf(rate: u64, prio: u8) -> Node {
        Node { rate, ceil: 10 * MBIT, prio, weight: rate, children: Vec::new() }
    }

    /// One tick of `p`: per node, demand, limited (now and lately), backlog.
    fn tick(p: &mut Pacer, tree: &Tree, demand: &[u64], limited: &[bool], backlog: &[u64], now: u64) -> Rates {
        let leaves: Vec<Leaf> = (0..demand.len())
            .map(|i| Leaf {
                demand: demand[i],
                limited: limited[i],
                lately_limited: limited[i],
                backlog_ns: backlog[i],
                sending: demand[i],
            })
            .collect();
        p.tick(tree, &leaves, now)
    }

    /// A 10 mbit/s link over `leaves`.
    fn flat(leaves: Vec<Node>) -> Tree {
        let mut root = leaf(10 * MBIT, 0);
        root.children = (1..=leaves.len()).collect();
        Tree { nodes: std::iter::once(root).chain(leaves).collect() }
    }

    #[test]
    fn capacity_a_lowered_class_still_uses_is_not_given_away() {
        use crate::allocation::tree::Node;
        let leaf = |rate| Node { rate, ceil: 10 * MBIT, prio: 0, weight: rate, children: Vec::new() };
        let mut root = leaf(10 * MBIT);
        root.children = vec![1, 2];
        let tree = Tree { nodes: vec![root, leaf(MBIT), leaf(MBIT)] };
        let mut s = Settler::default();
        assert_eq!(
            s.settle(&tree, &tree.leaves(), &[10 * MBIT, 9 * MBIT, MBIT], &[0, 0, 0], 0),
            [10 * MBIT, 9 * MBIT, MBIT]
        );
        // Class 1 drops to 5 with 20 ms queued at 9: class 2 may not grow yet.
        let a = s.settle(&tree, &tree.leaves(), &[10 * MBIT, 5 * MBIT, 5 * MBIT], &[0, 20 * MS, 0], 10 * MS);
        assert_eq!((a[1], a[2]), (5 * MBIT, MBIT));
        // Once that queue has left, it gets its share.
        let a = s.settle(&tree, &tree.leaves(), &[10 * MBIT, 5 * MBIT, 5 * MBIT], &[0, 5 * MS, 0], 31 * MS);
        assert_eq!((a[1], a[2]), (5 * MBIT, 5 * MBIT));
        // Class 1 drops to 4 with 20 ms queued at 5, then wants 5 again: its own queue does not
        // hold it back.
        let a = s.settle(&tree, &tree.leaves(), &[10 * MBIT, 4 * MBIT, 5 * MBIT], &[0, 20 * MS, 0], 40 * MS);
        assert_eq!((a[1], a[2]), (4 * MBIT, 5 * MBIT));
        let a = s.settle(&tree, &tree.leaves(), &[10 * MBIT, 5 * MBIT, 5 * MBIT], &[0, 20 * MS, 0], 50 * MS);
        assert_eq!((a[1], a[2]), (5 * MBIT, 5 * MBIT));
    }

    #[test]
    fn a_quiet_class_is_paced_at_what_it_would_get_if_it_woke() {
        // Seed 000: alex (1.9, prio 1) greedy, the guest (0.3, prio 0) sends a few packets.
        let tree = flat(vec![leaf(1_900_000, 1), leaf(300_000, 0)]);
        let mut p = Pacer::default();
        let r = tick(&mut p, &tree, &[0, u64::MAX, 20_000], &[false, true, false], &[0, 10 * MS, 0], 0);
        // The guest is allocated what it sends, and paced at what it would be given greedy.
        assert_eq!((r.allocation[1], r.allocation[2]), (10 * MBIT - 20_000, 20_000));
        assert_eq!((r.pacing[1], r.pacing[2]), (10 * MBIT - 20_000, 8_100_000));
        // It starts a transfer: it keeps that rate while alex's queue drains, and alex is
        // moved down at once.
        let r = tick(&mut p, &tree, &[0, u64::MAX, u64::MAX], &[false, true, true], &[0, 10 * MS, 5 * MS], 10 * MS);
        assert_eq!((r.pacing[1], r.pacing[2]), (1_900_000, 8_100_000));
    }

    #[test]
    fn a_class_paced_above_its_guarantee_borrows_and_one_that_sends_little_is_quiet() {
        // Seed 000: alex (1.9, prio 1) greedy, betty (2.9) streams 1 mbit/s, the guest idle.
        let tree = flat(vec![leaf(1_900_000, 1), leaf(2_900_000, 1), leaf(300_000, 0)]);
        let mut p = Pacer::default();
        let r = tick(&mut p, &tree, &[0, u64::MAX, MBIT, 0], &[false, true, false, false], &[0, 10 * MS, 0, 0], 0);
        // Alex is paced at what betty leaves, over his guarantee: he waits behind the quiet
        // classes' packets. Betty, within hers, never waits; the guest is quiet.
        assert_eq!(r.mode[1..], [Mode::Borrowing, Mode::Allocated, Mode::Quiet]);
        assert!(r.pacing[1] > 1_900_000 && r.pacing[2] >= 2_900_000, "{:?}", r.pacing);
    }

    #[test]
    fn a_class_that_sends_much_is_not_quiet() {
        let tree = flat(vec![leaf(1_900_000, 1), leaf(300_000, 0)]);
        let mut p = Pacer::default();
        // A guest streaming 2 mbit/s (over 1/8 of its wake rate) is paced at its allocation.
        let r = tick(&mut p, &tree, &[0, u64::MAX, 2 * MBIT], &[false, true, false], &[0, 10 * MS, 0], 0);
        assert_eq!(r.pacing[2], 2 * MBIT);
        // A limited class is paced at its allocation however little it is.
        let r = tick(&mut p, &tree, &[0, u64::MAX, 400_000], &[false, true, true], &[0, 10 * MS, 0], 10 * MS);
        assert_eq!(r.pacing[2], 400_000);
    }

    #[test]
    fn what_no_class_was_allocated_is_lent_to_the_classes_that_would_send_more() {
        let tree = flat(vec![leaf(5 * MBIT, 0), leaf(5 * MBIT, 0)]);
        let mut p = Pacer::default();
        // Class 1 streams 2 mbit/s; class 2 is limited and wants 3 for now (a TCP flow
        // growing back after it halved its window): it may send the 5 nobody was given.
        let r = tick(&mut p, &tree, &[0, 2 * MBIT, 3 * MBIT], &[false, false, true], &[0, 0, 10 * MS], 0);
        assert_eq!((r.allocation[1], r.allocation[2]), (2 * MBIT, 3 * MBIT));
        assert_eq!((r.pacing[1], r.pacing[2]), (5 * MBIT, 8 * MBIT));
        // Nothing is lent beyond what the link has: all of it is allocated.
        let r = tick(&mut p, &tree, &[0, 2 * MBIT, u64::MAX], &[false, false, true], &[0, 0, 10 * MS], 10 * MS);
        assert_eq!(r.pacing[2], 8 * MBIT);
    }

    #[test]
    fn nothing_is_lent_while_a_lowered_class_still_drains_its_queue() {
        let tree = flat(vec![leaf(MBIT, 0), leaf(MBIT, 0)]);
        let mut p = Pacer::default();
        let _ = tick(&mut p, &tree, &[0, u64::MAX, 0], &[false, true, false], &[0, 20 * MS, 0], 0);
        // Class 1, lowered from 10 to the 4 it wants now, has 20 ms of packets queued at 10;
        // class 2 wants 3. The 3 nobody was given are still in use by that queue.
        let demand = [0, 4 * MBIT, 3 * MBIT];
        let r = tick(&mut p, &tree, &demand, &[false, true, true], &[0, 20 * MS, 0], 10 * MS);
        assert_eq!((r.pacing[1], r.pacing[2]), (4 * MBIT, 3 * MBIT), "{r:?}");
        // Once it has left, they are lent to both, by weight.
        let r = tick(&mut p, &tree, &demand, &[false, true, true], &[0, 0, 0], 40 * MS);
        assert_eq!((r.pacing[1], r.pacing[2]), (5_500_000, 4_500_000), "{r:?}");
    }

    /// A leaf that wants `demand`, sends `sending` and was limited lately (`greedy`: now too,
    /// with a queue).
    fn sender(demand: u64, sending: u64, lately_limited: bool, greedy: bool) -> Leaf {
        let backlog_ns = if greedy { 10 * MS } else { 0 };
        Leaf { demand, limited: greedy, lately_limited, backlog_ns, sending }
    }

    #[test]
    fn what_a_class_is_allocated_and_does_not_send_is_lent() {
        // Betty was allocated 4 mbit/s for a bunch that has drained (or she pauses between
        // writes): she sends 1 now. Alex, limited, may send all but that and its headroom;
        // she stays paced at her allocation.
        let tree = flat(vec![leaf(MBIT, 0), leaf(2 * MBIT, 0)]);
        let mut p = Pacer::default();
        let leaves = [Leaf::default(), sender(u64::MAX, 6 * MBIT, true, true), sender(4 * MBIT, MBIT, false, false)];
        let r = p.tick(&tree, &leaves, 0);
        assert_eq!((r.allocation[1], r.allocation[2]), (6 * MBIT, 4 * MBIT));
        assert_eq!((r.pacing[1], r.pacing[2]), (10 * MBIT - 1_028_000, 4 * MBIT), "{r:?}");
        // Sending 7/8 of it or more, she keeps all of it.
        let leaves =
            [Leaf::default(), sender(u64::MAX, 6 * MBIT, true, true), sender(4 * MBIT, 3_600_000, false, false)];
        let r = p.tick(&tree, &leaves, 10 * MS);
        assert_eq!((r.pacing[1], r.pacing[2]), (6 * MBIT, 4 * MBIT), "{r:?}");
    }

    #[test]
    fn nothing_is_lent_to_a_class_that_no_longer_sends() {
        // Browsing (prio 0) was limited a moment ago (a page), and is silent now; bulk (prio
        // 1) is limited: what is left goes to bulk, not to browsing first by its prio.
        let tree = flat(vec![leaf(700_000, 0), leaf(200_000, 1)]);
        let mut root = tree.nodes[0].clone();
        root.rate = 900_000;
        root.ceil = 900_000;
        let tree = Tree { nodes: vec![root, tree.nodes[1].clone(), tree.nodes[2].clone()] };
        let mut p = Pacer::default();
        let leaves = [Leaf::default(), sender(8_000, 0, true, false), sender(500_000, 500_000, true, true)];
        let r = p.tick(&tree, &leaves, 0);
        assert_eq!((r.pacing[1], r.pacing[2]), (700_000, 892_000), "{r:?}");
    }

    #[test]
    fn never_paced_below_the_guarantee() {
        let tree = flat(vec![leaf(5 * MBIT, 0), leaf(5 * MBIT, 0)]);
        let mut p = Pacer::default();
        let r = tick(&mut p, &tree, &[0, u64::MAX, 3 * MBIT], &[false, true, false], &[0, 0, 0], 0);
        assert_eq!((r.pacing[1], r.pacing[2]), (7 * MBIT, 5 * MBIT));
    }

    #[test]
    fn wake_rates_stay_within_the_budget() {
        let leaves = 2 * WAKE_BUDGET;
        let tree = flat((0..leaves).map(|_| leaf(1_000, 0)).collect());
        let mut p = Pacer::default();
        let demand = vec![0; leaves + 1];
        let limited = vec![false; leaves + 1];
        let backlog = vec![0; leaves + 1];
        let _ = tick(&mut p, &tree, &demand, &limited, &backlog, 0);
        assert_eq!(p.wake.iter().filter(|&&w| w > 0).count(), 1, "one allocation of 8193 nodes a tick");
        let _ = tick(&mut p, &tree, &demand, &limited, &backlog, 10 * MS);
        assert_eq!(p.wake.iter().filter(|&&w| w > 0).count(), 2);
    }
}
