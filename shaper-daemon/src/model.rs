//! A deterministic model of the whole rate path, for tests that run in seconds on any host:
//! traffic sources offer packets, a sequential copy of the datapath's pacing (class clocks,
//! sparse budget, horizon, CoDel) gives them departure times, and every tick the real
//! [`Estimator`](crate::allocation::demand::Estimator), [`Tree::allocate`] and
//! [`Pacer`](crate::allocation::pacing::Pacer) set the classes' pacing
//! rates from the model's counters, as shaperd does from the maps. The loop is closed:
//! demand → allocation → pacing → what the sources can send → measured demand.
//!
//! What it leaves out: TCP's congestion control (a greedy TCP sender is modelled as keeping
//! its class's queue at a few milliseconds, which is what TCP under CoDel does in steady
//! state; its packets are ECN-capable, so CoDel marks rather than drops them), GSO, and the
//! concurrency of CPUs (the datapath's atomics make each clock update indivisible, which a
//! sequential model is by construction).

use std::collections::HashMap;

use shaper_common::{
    frames_ns, FULL_FRAME, HOLD_MAX_NS, LINK_SLACK_PERCENT, PROFILE_BURST_FRAMES, SPARSE_MAX_QUEUE_FRAMES, SPARSE_SHARE,
};

use crate::{
    allocation::{
        demand::{self, Counters, Estimator, Histories, Observation},
        pacing::{Leaf, Mode, Pacer},
        tree::{Node, Tree},
    },
    config::DEFAULT_AQM,
    daemon,
    rate::Rate,
};

pub const MS: u64 = 1_000_000;
pub const SECOND: u64 = 1_000_000_000;
/// Bits per second.
pub const MBIT: u64 = 1_000_000;
/// A greedy TCP sender as the tests and the tuning sweep model it.
pub const GREEDY: Source = Source::GreedyTcp { queue_ns: 5 * MS };

/// Seed 000's classes under a 10 mbit/s link, with these sources: alex 1.9, betty 2.9,
/// carl 4.9 at prio 1; the guest 0.3 at prio 0; all ceil 10.
#[must_use]
pub fn roommates(sources: [Source; 4]) -> Vec<ClassSpec> {
    let [a, b, c, g] = sources;
    vec![
        ClassSpec { rate: 1_900_000, ceil: 10 * MBIT, prio: 1, source: a },
        ClassSpec { rate: 2_900_000, ceil: 10 * MBIT, prio: 1, source: b },
        ClassSpec { rate: 4_900_000, ceil: 10 * MBIT, prio: 1, source: c },
        ClassSpec { rate: 300_000, ceil: 10 * MBIT, prio: 0, source: g },
    ]
}

/// An application that writes 16 KB every 50 ms (2.6 mbit/s: a video player's segments).
pub const WRITES: Source = Source::Bursts { burst: 16_384, period_ns: 50 * MS };
/// What [`WRITES`] sends, bits/s.
pub const WRITES_BITS: u64 = 16_384 * 8 * SECOND / (50 * MS);
/// What one class's traffic does.
#[derive(Debug, Clone, PartialEq)]
pub enum Source {
    /// Nothing.
    Idle,
    /// A TCP sender that always has data: it keeps `queue_ns` of its packets waiting in the
    /// class (TCP under CoDel keeps a standing queue near the target), full frames.
    GreedyTcp { queue_ns: u64 },
    /// UDP at a fixed offered rate (bits/s) in packets of `size` wire bytes, more than the
    /// class can send if the rate is high: packets past the horizon are dropped.
    Udp { bits: u64, size: u32 },
    /// UDP at a steady `bits` per second whose sender stalls for `stall_ns` every
    /// `period_ns` and then sends what it owes at once (a stream's packets bunched by its
    /// sender's scheduling, as in a busy VM).
    Jittery { bits: u64, stall_ns: u64, period_ns: u64 },
    /// `bits` per second while on, for `on_ns`, then silent for `off_ns`; the first on phase
    /// starts at `phase_ns`.
    OnOff { bits: u64, on_ns: u64, off_ns: u64, phase_ns: u64 },
    /// An application-limited TCP stream: writes of `burst` bytes every `period_ns` (a video
    /// player's segments), sent as a burst of full frames.
    Bursts { burst: u64, period_ns: u64 },
    /// `flows` flows, each sending one packet of `size` bytes every `period_ns`, evenly
    /// staggered (a hundred clients' keep-alives, a port scan, DNS).
    SparseFlows { flows: u32, period_ns: u64, size: u32 },
}

/// A class of the model: HTB parameters (bits/s) and its traffic.
#[derive(Debug, Clone, PartialEq)]
pub struct ClassSpec {
    pub rate: u64,
    pub ceil: u64,
    pub prio: u8,
    pub source: Source,
}

/// The departures of one run and what the control loop did.
#[derive(Debug, Clone)]
pub struct Run {
    pub classes: Vec<ClassSpec>,
    /// (departure ns, class, wire bytes), in the order packets were paced.
    pub departures: Vec<(u64, usize, u32)>,
    /// Pacing rates (bits/s) per tick, per class.
    pub pacing: Vec<Vec<u64>>,
    /// Allocations (bits/s) per tick, per class.
    pub allocation: Vec<Vec<u64>>,
}

impl Run {
    /// Each class's wire rate (bits/s) over `[from, to)`.
    #[must_use]
    pub fn rates(&self, from: u64, to: u64) -> Vec<u64> {
        let mut bytes = vec![0u64; self.classes.len()];
        for &(t, c, b) in &self.departures {
            if (from..to).contains(&t) {
                bytes[c] += u64::from(b);
            }
        }
        bytes.iter().map(|b| b * 8 * SECOND / (to - from)).collect()
    }

    /// The most wire bytes of class `class` (all classes: `None`) whose departures fall in
    /// one window of `window` ns, over windows starting at every departure at or after `from`.
    #[must_use]
    pub fn max_in_window(&self, class: Option<usize>, window: u64, from: u64) -> u64 {
        let mut v: Vec<(u64, u64)> = self
            .departures
            .iter()
            .filter(|d| class.is_none_or(|c| d.1 == c) && d.0 >= from)
            .map(|d| (d.0, u64::from(d.2)))
            .collect();
        v.sort_unstable();
        let (mut best, mut sum, mut lo) = (0, 0, 0);
        for hi in 0..v.len() {
            sum += v[hi].1;
            while v[hi].0 - v[lo].0 >= window {
                sum -= v[lo].1;
                lo += 1;
            }
            best = best.max(sum);
        }
        best
    }

    /// The median, 90th percentile and largest relative change of class `class`'s pacing
    /// rate from one tick to the next over ticks `[from, to)`, in per mille.
    #[must_use]
    pub fn pacing_changes(&self, class: usize, from: usize, to: usize) -> (u64, u64, u64) {
        let mut changes: Vec<u64> = (from.max(1)..to.min(self.pacing.len()))
            .map(|i| {
                let (a, b) = (self.pacing[i - 1][class], self.pacing[i][class]);
                a.abs_diff(b) * 1000 / a.max(1)
            })
            .collect();
        changes.sort_unstable();
        let at = |q: usize| changes.get(changes.len() * q / 100).copied().unwrap_or(0);
        (at(50), at(90), changes.last().copied().unwrap_or(0))
    }
}

/// One class's datapath state and counters.
#[derive(Debug, Default)]
struct ClassState {
    /// Pacing rate, bytes/s.
    rate: u64,
    /// Quiet (behind the link clock), borrowing (behind the quiet packets held there).
    mode: Mode,
    next: u64,
    sparse_next: u64,
    /// The guaranteed rate, bytes/s, and the profile meter at it (`profile_next_ns`).
    guarantee: u64,
    profile_next: u64,
    counters: Counters,
    estimator: Estimator,
    /// The source's own clock: when it next offers a packet.
    source_next: u64,
    codel: Codel,
}

/// CoDel's state (RFC 8289), as `aqm.rs` keeps it per class.
#[derive(Debug, Default)]
struct Codel {
    first_above: u64,
    drop_next: u64,
    count: u64,
    dropping: bool,
}

impl Codel {
    /// Whether the packet that waits `delay` carries a congestion signal; a delay past
    /// `overload` (half the horizon) in a class that gave no signal for 16 intervals does
    /// not wait for the interval.
    fn signal(&mut self, delay: u64, now: u64, target: u64, interval: u64, overload: u64) -> bool {
        #[expect(
            clippy::cast_precision_loss,
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "control law"
        )]
        let law = |count: u64| (interval as f64 / (count as f64).sqrt()) as u64;
        if delay < target {
            self.first_above = 0;
            self.dropping = false;
            return false;
        }
        let recent = now.saturating_sub(self.drop_next) < 16 * interval;
        let overloaded = delay > overload && !recent;
        if self.first_above == 0 {
            self.first_above = now + interval;
            if !overloaded {
                return false;
            }
        } else if now < self.first_above && !overloaded {
            return false;
        }
        if !self.dropping {
            self.dropping = true;
            self.count = if recent && self.count > 2 { self.count - 2 } else { 1 };
            self.drop_next = now + law(self.count);
            return true;
        }
        if now < self.drop_next {
            return false;
        }
        self.count += 1;
        self.drop_next += law(self.count);
        true
    }
}

/// The class tree of `classes` under a root of rate `link`, node `i + 1` for class `i`.
#[must_use]
pub fn tree(link: u64, classes: &[ClassSpec]) -> Tree {
    tree_of(link, &vec![None; classes.len()], classes)
}

/// [`tree`] with class `i` under class `parents[i]` (`None`: under the root); parents come
/// before their children.
#[must_use]
pub fn tree_of(link: u64, parents: &[Option<usize>], classes: &[ClassSpec]) -> Tree {
    assert_eq!(parents.len(), classes.len(), "one parent per class");
    let mut nodes = vec![Node { rate: link, ceil: link, prio: 0, weight: 1, children: Vec::new() }];
    for (i, c) in classes.iter().enumerate() {
        nodes.push(Node { rate: c.rate, ceil: c.ceil, prio: c.prio, weight: c.rate.max(1), children: Vec::new() });
        nodes[parents[i].map_or(0, |p| p + 1)].children.push(i + 1);
    }
    Tree { nodes }
}

/// Simulates `duration` ns of `classes` sharing a link of `link` bits/s, the control loop
/// ticking every `tick` ns, with a horizon of `horizon` ns.
#[must_use]
pub fn simulate(link: u64, classes: &[ClassSpec], duration: u64, tick: u64, horizon: u64) -> Run {
    simulate_with_headroom(link, classes, duration, tick, horizon, demand::HEADROOM_PERCENT)
}

/// [`simulate`] on the tree of [`tree_of`]; an inner class's source must be [`Source::Idle`]
/// (its children carry its traffic).
#[must_use]
pub fn simulate_tree(
    link: u64,
    parents: &[Option<usize>],
    classes: &[ClassSpec],
    duration: u64,
    tick: u64,
    horizon: u64,
) -> Run {
    let tree = tree_of(link, parents, classes);
    for (i, c) in classes.iter().enumerate() {
        assert!(tree.is_leaf(i + 1) || c.source == Source::Idle, "class {i} is an inner class with traffic of its own");
    }
    simulate_on(&tree, classes, duration, tick, horizon, demand::HEADROOM_PERCENT)
}

/// [`simulate`] with classes that are not limited given `headroom` percent over their rate
/// (see [`Estimator::with_headroom`]).
#[must_use]
pub fn simulate_with_headroom(
    link: u64,
    classes: &[ClassSpec],
    duration: u64,
    tick: u64,
    horizon: u64,
    headroom: u64,
) -> Run {
    simulate_on(&tree(link, classes), classes, duration, tick, horizon, headroom)
}

/// The simulation of `classes` on `tree` (node `i + 1` for class `i`).
fn simulate_on(tree: &Tree, classes: &[ClassSpec], duration: u64, tick: u64, horizon: u64, headroom: u64) -> Run {
    const STEP: u64 = 20_000;
    let link = tree.nodes[0].rate;
    let mut st: Vec<ClassState> = classes
        .iter()
        .map(|c| ClassState {
            rate: c.rate / 8,
            guarantee: c.rate / 8,
            estimator: Estimator::with_headroom(headroom),
            ..ClassState::default()
        })
        .collect();
    let mut flows: HashMap<(usize, u32), u64> = HashMap::new();
    let mut link_clock = LinkClock { next: 0, hold: 0, bytes_per_sec: link / 100 * (100 + LINK_SLACK_PERCENT) / 8 };
    let mut run = Run { classes: classes.to_vec(), departures: Vec::new(), pacing: Vec::new(), allocation: Vec::new() };
    let mut pacer = Pacer::default();
    let mut histories = Histories::new();
    let mut next_tick = tick;
    let mut now = 0u64;
    while now < duration {
        for (c, spec) in classes.iter().enumerate() {
            // Offer whatever the source has by now.
            loop {
                let s = &mut st[c];
                let Some((size, flow)) = offer(&spec.source, s, now) else { break };
                let s = &mut st[c];
                s.counters.offered_bytes += u64::from(size);
                let last = flows.get(&(c, flow)).copied();
                let ecn = matches!(spec.source, Source::GreedyTcp { .. } | Source::Bursts { .. });
                if let Some(depart) = pace(s, &mut link_clock, u64::from(size), now, horizon, last, ecn) {
                    s.counters.packets += 1;
                    flows.insert((c, flow), depart);
                    run.departures.push((depart, c, size));
                }
            }
        }
        now += STEP;
        if now >= next_tick {
            next_tick += tick;
            let mut leaves = vec![Leaf::default(); classes.len() + 1];
            histories.start_row(now, classes.len());
            for (c, s) in st.iter_mut().enumerate() {
                let backlog_ns = s.next.saturating_sub(now);
                let e = s.estimator.update(
                    &mut histories,
                    c,
                    &Observation { now_ns: now, counters: s.counters, backlog_ns, pacing: s.rate * 8 },
                );
                if tree.is_leaf(c + 1) {
                    leaves[c + 1] = Leaf::new(&e, backlog_ns);
                }
            }
            let rates = pacer.tick(tree, &leaves, now);
            for (c, s) in st.iter_mut().enumerate() {
                s.rate = rates.pacing[c + 1] / 8;
                s.mode = rates.mode[c + 1];
            }
            run.pacing.push(st.iter().map(|s| s.rate * 8).collect());
            run.allocation.push(rates.allocation[1..].to_vec());
        }
    }
    run
}

/// The next packet the source offers at `now`, if any: (wire bytes, flow id).
fn offer(source: &Source, s: &mut ClassState, now: u64) -> Option<(u32, u32)> {
    let frame = u32::try_from(FULL_FRAME).expect("small");
    match *source {
        Source::Idle => None,
        Source::GreedyTcp { queue_ns } => (s.next < now + queue_ns).then_some((frame, 0)),
        Source::Udp { bits, size } => timed(s, now, u64::from(size) * 8 * SECOND / bits).then_some((size, 0)),
        Source::Jittery { bits, stall_ns, period_ns } => {
            if now % period_ns < stall_ns {
                return None;
            }
            timed(s, now, FULL_FRAME * 8 * SECOND / bits).then_some((frame, 0))
        }
        Source::OnOff { bits, on_ns, off_ns, phase_ns } => {
            if now < phase_ns || (now - phase_ns) % (on_ns + off_ns) >= on_ns {
                s.source_next = s.source_next.max(now);
                return None;
            }
            timed(s, now, FULL_FRAME * 8 * SECOND / bits).then_some((frame, 0))
        }
        Source::Bursts { burst, period_ns } => {
            // `source_next` counts bytes written so far; the application has written
            // `burst * (1 + now / period)` by now.
            let written = burst * (1 + now / period_ns);
            if s.source_next >= written {
                return None;
            }
            s.source_next += FULL_FRAME;
            Some((frame, 0))
        }
        Source::SparseFlows { flows, period_ns, size } => {
            let gap = period_ns / u64::from(flows);
            if !timed(s, now, gap) {
                return None;
            }
            let k = s.source_next / gap.max(1);
            Some((size, u32::try_from(k % u64::from(flows)).expect("fits")))
        }
    }
}

/// A source that offers one packet every `gap` ns: true if one is due at `now`.
fn timed(s: &mut ClassState, now: u64, gap: u64) -> bool {
    if s.source_next > now {
        return false;
    }
    s.source_next += gap.max(1);
    true
}

/// The link clock (`LINKS` in the datapath): when the bytes paced so far will have left at
/// the link's rate plus its slack.
struct LinkClock {
    next: u64,
    /// When the quiet classes' packets held behind the link clock will have left.
    hold: u64,
    bytes_per_sec: u64,
}

impl LinkClock {
    /// Takes `cost` ns: returns when the bytes paced before will have left (`now` at the latest).
    fn take(&mut self, cost: u64, now: u64) -> u64 {
        let start = self.next.max(now);
        self.next = start + cost;
        start
    }
}

/// The datapath's pacing of one packet (`shape` in shaper-ebpf): the sparse test and
/// budget, the link clock, the class clock, the horizon and CoDel. Returns the departure,
/// `None` for a drop.
fn pace(
    s: &mut ClassState,
    link: &mut LinkClock,
    bytes: u64,
    now: u64,
    horizon: u64,
    flow_last: Option<u64>,
    ecn: bool,
) -> Option<u64> {
    let cost = bytes * SECOND / s.rate;
    let link_cost = bytes * SECOND / link.bytes_per_sec;
    // CoDel's parameters as shaperd sets them for a class with the default AQM.
    let (target, interval) = daemon::codel_params(
        u64::try_from(DEFAULT_AQM.target.as_nanos()).expect("5 ms"),
        u64::try_from(DEFAULT_AQM.interval.as_nanos()).expect("100 ms"),
        Rate::from_bits_per_sec(s.rate * 8),
    );
    let last = flow_last.unwrap_or(0);
    // A quiet class's packets are metered against its guarantee (`in_profile`).
    let in_profile = s.mode != Mode::Quiet || {
        let within = s.guarantee > 0 && s.profile_next <= now + frames_ns(PROFILE_BURST_FRAMES, s.guarantee);
        if within {
            s.profile_next = s.profile_next.max(now) + bytes * SECOND / s.guarantee;
        }
        within
    };
    if s.next > now {
        let queue = s.next - now;
        let sparse = last.saturating_add(queue.min(10 * MS)) <= now
            && queue <= frames_ns(SPARSE_MAX_QUEUE_FRAMES, s.rate)
            && queue + cost <= horizon
            && s.sparse_next <= now;
        if sparse {
            s.sparse_next = now + cost * SPARSE_SHARE;
            s.next += cost;
            link.take(link_cost, now);
            return Some(now);
        }
    }
    // A quiet class waits behind the link clock, but for a sparse flow's packet within the
    // sparse budget and a packet within its guarantee; a borrower behind the quiet packets
    // held there.
    let committed = link.take(link_cost, now);
    let start = match s.mode {
        Mode::Quiet if committed > now => {
            if last.saturating_add(10 * MS) <= now && s.sparse_next <= now {
                s.sparse_next = now + cost * SPARSE_SHARE;
                now
            } else {
                // Behind the link clock, but within its guarantee it leaves on its own
                // clock, and the borrowers wait in its place.
                let start = committed.max(s.next);
                link.hold = link.hold.max((start + link_cost).min(now + HOLD_MAX_NS));
                if in_profile {
                    now
                } else {
                    start
                }
            }
        }
        Mode::Borrowing => link.hold.max(now),
        _ => now,
    };
    let (depart, idle) = if s.next > start { (s.next, false) } else { (start, true) };
    if depart - now > horizon {
        link.next -= link_cost;
        return None;
    }
    if s.codel.signal(depart - now, now, target, interval, horizon / 2) && !ecn {
        link.next -= link_cost;
        return None;
    }
    if idle {
        s.counters.idle_packets += 1;
        // A clock that fell behind restarts up to one full frame before now (`burst_ns`);
        // a packet held back (behind the link) restarts it at its own departure.
        let restart = if start > now { start } else { start.saturating_sub(frames_ns(1, s.rate)) };
        s.next = s.next.max(restart) + cost;
    } else {
        s.next += cost;
    }
    Some(depart)
}
