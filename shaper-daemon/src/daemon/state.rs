//! What the running daemon knows about each class, and the control loop that keeps the
//! datapath's rates up to date: every tick it reads the counters, estimates each leaf's
//! demand, runs the allocator and writes the rates that changed. `status` and the Prometheus
//! snapshot read the same state.

use std::{
    collections::VecDeque,
    sync::Arc,
    time::{Duration, Instant},
};

use nix::time::{clock_gettime, ClockId};
use shaper_common::{
    frames_ns, ClassConfig, ClassStats, IsolationCounters, CLASS_BORROWING, CLASS_QUIET, DELAY_BUCKETS,
    DELAY_BUCKET_BASE_NS, DSCP_OVER, DSCP_SET, ISOLATE_FLOW, ISOLATE_HOST, ISOLATE_NONE,
};
use tokio::sync::watch;
use tracing::{debug, info, warn};

use super::{Options, Shared};
use crate::{
    allocation::{
        demand::{self, Counters, Estimator, Histories, Observation},
        pacing::{self, Mode, Pacer},
        tree::Tree,
    },
    api::{ApiError, ClassStatus, Status},
    bpf::{BpfError, Datapath, TickStart},
    config::{diff::describe_changes, Class, Config, Isolation},
    rate::Rate,
};

/// The window of the added-delay percentile that `status` reports.
const DELAY_WINDOW_NS: u64 = 1_000_000_000;

/// Every class's counters are read at least once in this many ticks (one second at the
/// default tick), whether the datapath marked it active or not (see [`State::control_tick`]).
const SWEEP_TICKS: u64 = 100;

/// A class as the daemon tracks it.
#[derive(Clone, Debug)]
pub(super) struct ClassEntry {
    /// Index in the datapath's class arrays.
    pub(super) id: u32,
    /// Whether the class has no children (only leaves carry traffic and are paced).
    pub(super) leaf: bool,
    /// The rate the datapath paces the class at.
    pub(super) pacing_rate: Rate,
    /// The allocator's last share for the class (inner classes: their children's sum).
    allocation: Rate,
    /// The demand estimator fed by the class's counters.
    estimator: Estimator,
    /// The offered rate the estimator last read.
    throughput: Rate,
    /// Whether the estimator found the class limited by its pacing rate at the last tick.
    limited: bool,
    /// How the class's packets stand against the link clock (quiet, borrowing).
    pub(super) mode: Mode,
    /// Isolation: one host's fair share of the class (bits/s; 0 before the first tick).
    pub(super) share: u64,
    /// The isolation counters (bytes from light hosts, hosts over their share, hosts near it)
    /// as read at the tick before the last and at the last: the epoch that ended at a tick is
    /// counted in its half since the read before the last (see `shaper_common::epoch_unit`).
    share_counters: [IsolationCounters; 2],
    /// Delay histograms over the last second (`CLOCK_MONOTONIC` ns), oldest first, for the
    /// p99 in `status`: each when the histogram became what it is, so the histogram at a
    /// time is that of the newest entry at or before it. The first is at or before the
    /// second's start. A class that sends nothing keeps one entry, not a hundred (136 bytes
    /// each: 136 MB at 10,000 classes).
    delays: VecDeque<(u64, [u64; DELAY_BUCKETS])>,
    /// The class's counters and clock as last read from the datapath (see
    /// [`State::control_tick`]): `None` until the first read.
    seen: Option<(ClassStats, u64)>,
}

impl ClassEntry {
    /// A class seen for the first time: a leaf starts paced at its guaranteed `rate`.
    pub(super) fn new(id: u32, leaf: bool, rate: Rate) -> Self {
        Self {
            id,
            leaf,
            pacing_rate: if leaf { rate } else { Rate::ZERO },
            allocation: Rate::ZERO,
            estimator: Estimator::new(),
            throughput: Rate::ZERO,
            mode: Mode::Allocated,
            limited: false,
            share: 0,
            share_counters: [IsolationCounters::default(); 2],
            delays: VecDeque::new(),
            seen: None,
        }
    }

    /// The same class in a new configuration that guarantees it `rate`: its id, estimator and
    /// counters carry on, and it is paced at no less than `rate`.
    pub(super) fn carried_over(&self, rate: Rate) -> Self {
        Self { pacing_rate: self.pacing_rate.max(rate), ..self.clone() }
    }

    /// Records the class's delay histogram, keeping one second of history.
    fn record_delays(&mut self, now_ns: u64, hist: [u64; DELAY_BUCKETS]) {
        if self.delays.back().is_none_or(|(_, last)| *last != hist) {
            self.delays.push_back((now_ns, hist));
        }
        while self.delays.get(1).is_some_and(|&(t, _)| now_ns.saturating_sub(t) >= DELAY_WINDOW_NS) {
            self.delays.pop_front();
        }
    }

    /// The 99th percentile of the added delay over the recorded window, as the upper bound of
    /// its bucket (µs); `None` when nothing was sent in the window.
    fn p99_delay_us(&self) -> Option<u64> {
        let ((_, first), (_, last)) = (self.delays.front()?, self.delays.back()?);
        let counts: Vec<u64> = last.iter().zip(first).map(|(l, f)| l.saturating_sub(*f)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen * 100 >= total * 99 {
                return Some(if i + 1 == DELAY_BUCKETS { u64::MAX } else { (DELAY_BUCKET_BASE_NS << i) / 1000 });
            }
        }
        None
    }
}

/// One interface's class tree; node `n` stands for class `classes[n]` (root: `None`).
pub(super) struct IfaceTree {
    /// The allocator's view of the interface's classes.
    tree: Tree,
    /// The class (index in the configuration) of each node.
    classes: Vec<Option<usize>>,
    /// Turns the tree's allocations into pacing rates, tick after tick.
    pacer: Pacer,
}

/// Everything the running daemon holds, behind one lock: the configuration in force, the
/// classes as tracked, the allocator's trees and the datapath.
pub(super) struct State {
    /// The configuration in force.
    pub(super) config: Config,
    /// The configuration file as shaperd last read or wrote it: what `config` changes from it
    /// is unsaved (`status`).
    pub(super) file: Config,
    /// One entry per class of `config`, in the same order.
    pub(super) classes: Vec<ClassEntry>,
    /// One tree per interface of `config`, in the same order.
    pub(super) trees: Vec<IfaceTree>,
    /// The loaded program and its maps.
    pub(super) datapath: Datapath,
    /// The index of each interface of `config`, in the same order.
    pub(super) ifindexes: Vec<u32>,
    /// Incremented by every change applied after the start.
    pub(super) generation: u64,
    /// Where the daemon listens and pins (for the handover file).
    pub(super) options: Options,
    /// `CLOCK_MONOTONIC` time of the last control tick, ns.
    pub(super) last_tick_ns: u64,
    /// Ticks so far (for the sweep of [`State::control_tick`]).
    pub(super) ticks: u64,
    /// The leaves' counter histories, a column for each class id.
    pub(super) histories: Histories,
}

/// The datapath's settings of a leaf class paced at `rate`, whose hosts' fair share is
/// `share` (bits/s; 0: none yet), in `mode` (see `pacing`).
pub(super) fn class_config(class: &Class, rate: Rate, share: u64, mode: Mode) -> ClassConfig {
    let (target, interval) =
        class.aqm.map_or((0, 0), |a| codel_params(horizon_ns(a.target), horizon_ns(a.interval), rate));
    let isolation = match class.isolation {
        Isolation::None => ISOLATE_NONE,
        Isolation::Host => ISOLATE_HOST,
        Isolation::Flow => ISOLATE_FLOW,
    };
    let share_bytes = if isolation == ISOLATE_NONE { 0 } else { share / 8 };
    // A host is over its share once its clock is CoDel's target ahead: the standing queue
    // CoDel signals about is then its own. A larger slack withheld every signal from a class's
    // only host (at its share, its clock is as far ahead as the queue), and its queue grew to
    // the horizon. Without AQM, eight full frames. One that runs half the horizon ahead
    // ignores the congestion signals, and is dropped. So is a class's only host: a flood alone
    // in its class would otherwise fill it to the horizon, where the packets of a host it
    // starved (a TCP flow backing off, counted nowhere then) are dropped too.
    let slack = if target == 0 { frames_ns(8, share_bytes).max(2_000_000) } else { target };
    ClassConfig {
        rate_bytes: rate.bytes_per_sec(),
        // Worked out from the rates by `Datapath::set_class`, which every class goes through.
        rate_byte_ns: 0,
        horizon_ns: horizon_ns(class.horizon),
        burst_ns: frames_ns(1, rate.bytes_per_sec()),
        codel_target_ns: target,
        codel_interval_ns: interval,
        isolation,
        flags: match mode {
            Mode::Allocated => 0,
            Mode::Borrowing => CLASS_BORROWING,
            Mode::Quiet => CLASS_QUIET,
        },
        share_bytes,
        share_byte_ns: 0,
        share_horizon_ns: (horizon_ns(class.horizon) / 2).max(slack * 4),
        share_slack_ns: slack,
        // Two frames at the share: hosts sending a third of it or more contend for it.
        share_near_ns: frames_ns(2, share_bytes),
        guarantee_bytes: class.rate.bytes_per_sec(),
        dscp_flags: class.marking.set.map_or(0, |_| DSCP_SET) | class.marking.over.map_or(0, |_| DSCP_OVER),
        set_dscp: class.marking.set.unwrap_or(0),
        over_dscp: class.marking.over.unwrap_or(0),
        _pad_dscp: [0; 5],
    }
}

/// CoDel's target and interval for a class paced at `rate`. A target shorter than the time a
/// few full-size frames take at that rate would signal congestion on every other packet and
/// starve TCP at low rates (at 300 kbit/s one frame takes 40 ms), so the target is at least
/// three frame times and the interval grows with it, as CAKE does (`cake_set_rate`, which
/// uses 1.5 frames but splits GSO packets; here a GSO packet of two segments is one packet).
pub(crate) fn codel_params(target_ns: u64, interval_ns: u64, rate: Rate) -> (u64, u64) {
    let frame_ns = demand::frames_ns(1, rate.bits_per_sec());
    let target = target_ns.max(frame_ns.saturating_mul(3));
    let interval = (interval_ns + (target - target_ns)).max(target.saturating_mul(2));
    (target, interval)
}

/// The allocator's tree of each interface of `config`, in the same order.
pub(super) fn trees(config: &Config) -> Vec<IfaceTree> {
    config
        .interfaces
        .iter()
        .map(|i| {
            let (tree, classes) = Tree::from_config(config, &i.name);
            IfaceTree { tree, classes, pacer: Pacer::default() }
        })
        .collect()
}

/// `CLOCK_MONOTONIC` now, in ns: the clock of the datapath's departure times.
pub(super) fn monotonic_ns() -> u64 {
    clock_gettime(ClockId::CLOCK_MONOTONIC).map_or(0, |ts| {
        u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec()).unwrap_or(0)
    })
}

/// A duration in ns, as the datapath's settings hold it.
fn horizon_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// Every `tick`: measure each leaf's demand, run the allocator, write the new rates.
///
/// The ticks run on a thread of their own, with a runtime of their own: on the daemon's
/// runtime a tick would wait for a worker behind whatever else is ready to run (a storm of
/// `shaperctl` connections or scrapes), and shaping would pause meanwhile. What they share
/// with requests and scrapes is the state lock, which those take one at a time.
///
/// The thread also asks for a better nice value ([`CONTROL_NICE`]): a gateway busy forwarding
/// (softirq time), or a host running other work, would otherwise delay its wake-ups by whole
/// periods and shaping would follow demand late.
pub(super) async fn control_loop(shared: Arc<Shared>, tick: Duration, stopped: watch::Receiver<bool>) {
    let (done, finished) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new()
        .name("shaperd-control".into())
        .spawn(move || {
            raise_priority();
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("a runtime for the control loop's thread");
            runtime.block_on(ticks(shared, tick, stopped));
            let _ = done.send(());
        })
        .expect("starting the control loop's thread");
    if finished.await.is_err() {
        // The thread panicked (its sender dropped unsent): the same panic here, which the
        // daemon reports as it would the loop's own.
        if let Err(panic) = thread.join() {
            std::panic::resume_unwind(panic);
        }
    }
}

/// The nice value of the control loop's thread. A tick takes little CPU (well under 1 ms with
/// hundreds of classes) but must start on time: at -10 the scheduler gives a waking control
/// thread the CPU ahead of ordinary work, without the real-time class, whose runaway would
/// starve the machine.
const CONTROL_NICE: i32 = -10;

/// Sets the calling thread's nice value to [`CONTROL_NICE`], if shaperd may (`CAP_SYS_NICE`, or a
/// nice limit of at least 10: systemd's `LimitNICE=-10`). Without it ticks run at the
/// process's own priority.
fn raise_priority() {
    let tid = rustix::thread::gettid();
    match rustix::process::setpriority_process(Some(tid), CONTROL_NICE) {
        Ok(()) => debug!(nice = CONTROL_NICE, "control loop's thread"),
        Err(e) => info!(
            error = %e,
            "the control loop runs at shaperd's own priority: raising it to nice {CONTROL_NICE} needs \
             CAP_SYS_NICE or a nice limit (LimitNICE=-10)"
        ),
    }
}

async fn ticks(shared: Arc<Shared>, tick: Duration, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut last_start: Option<Instant> = None;
    loop {
        tokio::select! {
            changed = stopped.changed() => {
                if changed.is_err() || *stopped.borrow() {
                    return;
                }
            }
            _ = interval.tick() => {
                let mut state = shared.state.lock().await;
                let started = Instant::now();
                // From start to start, the lock's wait included: the period the rates are
                // actually updated at.
                if let Some(last) = last_start.replace(started) {
                    shared.metrics.observe_tick_interval(started - last);
                }
                if let Err(e) = state.control_tick() {
                    warn!(error = %e, "control tick");
                }
                shared.metrics.observe_tick(started.elapsed());
            }
        }
    }
}

impl State {
    /// One round of the control loop.
    pub(super) fn control_tick(&mut self) -> Result<(), BpfError> {
        let mono = monotonic_ns();
        let elapsed = mono.saturating_sub(std::mem::replace(&mut self.last_tick_ns, mono));
        let columns = self.classes.iter().map(|c| c.id as usize + 1).max().unwrap_or(0);
        self.histories.start_row(mono, columns);
        // Only the classes that counted a packet since the last tick are read: the others'
        // counters and clocks are as last read. A class whose only packets came between the
        // read of the marks and the new generation (`Datapath::start_tick`, which starts the
        // isolation's epoch too) is read in a sweep that reads every class once every
        // `SWEEP_TICKS` ticks, if not sooner.
        let TickStart { active, ended_epoch } = self.datapath.start_tick()?;
        self.ticks = self.ticks.wrapping_add(1);
        let ticks = self.ticks;
        let sweep = |id: u32| (u64::from(id) + ticks).is_multiple_of(SWEEP_TICKS);
        for t in &mut self.trees {
            let mut leaves = vec![pacing::Leaf::default(); t.tree.nodes.len()];
            // Isolation, per node: (bits/s from light hosts, hosts over their share, hosts
            // near it) over the last tick.
            let mut hosts = vec![(0u64, 0u64, 0u64); t.tree.nodes.len()];
            for (node, class) in t.classes.iter().enumerate() {
                let Some(c) = *class else { continue };
                let entry = &mut self.classes[c];
                if !entry.leaf {
                    continue;
                }
                let (stats, clock) = match entry.seen {
                    Some(seen) if !active.has(entry.id) && !sweep(entry.id) => seen,
                    _ => {
                        let read = (self.datapath.class_stats(entry.id)?, self.datapath.class_state(entry.id)?.next_ns);
                        *entry.seen.insert(read)
                    }
                };
                let backlog = clock.saturating_sub(mono);
                let estimate = entry.estimator.update(
                    &mut self.histories,
                    entry.id as usize,
                    &Observation {
                        now_ns: mono,
                        counters: Counters {
                            offered_bytes: stats.bytes
                                + stats.drop_horizon_bytes
                                + stats.drop_aqm_bytes
                                + stats.drop_share_bytes,
                            packets: stats.packets,
                            idle_packets: stats.idle_packets,
                        },
                        backlog_ns: backlog,
                        pacing: entry.pacing_rate.bits_per_sec(),
                    },
                );
                entry.throughput = Rate::from_bits_per_sec(estimate.offered);
                entry.limited = estimate.limited;
                entry.record_delays(mono, stats.delay_hist);
                leaves[node] = pacing::Leaf::new(&estimate, backlog);
                let [before_last, last] = entry.share_counters;
                let now = stats.isolation();
                entry.share_counters = [last, now];
                let counted = now.epoch(ended_epoch).since(before_last.epoch(ended_epoch));
                hosts[node] = (
                    demand::bits_per_sec(u64::from(counted.share_under_bytes), elapsed),
                    u64::from(counted.hosts_over),
                    u64::from(counted.hosts_near),
                );
            }
            let rates = t.pacer.tick(&t.tree, &leaves, mono);
            for (node, class) in t.classes.iter().enumerate() {
                let Some(c) = *class else { continue };
                let entry = &mut self.classes[c];
                entry.allocation = Rate::from_bits_per_sec(rates.allocation[node]);
                if !entry.leaf {
                    continue;
                }
                let spec = &self.config.classes[c];
                let pacing = Rate::from_bits_per_sec(rates.pacing[node]);
                let (under, over, near) = hosts[node];
                let share = demand::fair_share(pacing.bits_per_sec(), entry.limited, under, over, near, entry.share);
                let mode = rates.mode[node];
                // Rewritten when the rate or the mode changes, or the share by more than 1/32.
                if pacing != entry.pacing_rate || mode != entry.mode || share.abs_diff(entry.share) > entry.share / 32 {
                    self.datapath.set_class(entry.id, class_config(spec, pacing, share, mode))?;
                    if pacing != entry.pacing_rate {
                        debug!(class = %spec.name, from = %entry.pacing_rate, to = %pacing, "rate");
                    }
                    entry.pacing_rate = pacing;
                    entry.share = share;
                    entry.mode = mode;
                }
            }
        }
        Ok(())
    }

    /// Every class's counters and rates, for a Prometheus scrape. A class whose counters
    /// cannot be read is left out (and logged) rather than failing the whole scrape.
    pub(super) fn snapshot(&self) -> Status {
        let classes = self
            .config
            .classes
            .iter()
            .zip(&self.classes)
            .filter_map(|(class, entry)| {
                self.class_status(class, entry)
                    .map_err(|e| warn!(class = %class.name, error = %e, "reading counters for a scrape"))
                    .ok()
            })
            .collect();
        self.status_of(classes)
    }

    /// The reply to `shaperctl status`: every class's settings, rates and counters.
    pub(super) fn status(&self) -> Result<Status, ApiError> {
        let classes = self
            .config
            .classes
            .iter()
            .zip(&self.classes)
            .map(|(class, entry)| self.class_status(class, entry))
            .collect::<Result<_, _>>()
            .map_err(|e| ApiError::Internal { message: format!("{e}") })?;
        Ok(self.status_of(classes))
    }

    /// The daemon's part of a status record, around `classes`.
    fn status_of(&self, classes: Vec<ClassStatus>) -> Status {
        Status {
            config: self.config.path.clone(),
            generation: self.generation,
            unsaved: describe_changes(&self.file, &self.config),
            classes,
        }
    }

    /// One class as `status` and `/metrics` report it.
    fn class_status(&self, class: &Class, entry: &ClassEntry) -> Result<ClassStatus, BpfError> {
        let s = self.datapath.class_stats(entry.id)?;
        Ok(ClassStatus {
            name: class.name.clone(),
            interface: class.interface.clone(),
            parent: class.parent.clone(),
            leaf: entry.leaf,
            rate: class.rate,
            ceil: class.ceil,
            prio: class.prio,
            pacing_rate: if entry.leaf { entry.pacing_rate } else { Rate::ZERO },
            allocation: entry.allocation,
            throughput: entry.throughput,
            bytes: s.bytes,
            packets: s.packets,
            drops: s.drop_horizon_packets + s.drop_aqm_packets + s.drop_share_packets,
            drops_horizon: s.drop_horizon_packets,
            drops_horizon_bytes: s.drop_horizon_bytes,
            drops_aqm: s.drop_aqm_packets,
            drops_aqm_bytes: s.drop_aqm_bytes,
            drops_share: s.drop_share_packets,
            drops_share_bytes: s.drop_share_bytes,
            share: entry.share,
            ecn_marks: s.ecn_marked_packets,
            sparse_packets: s.sparse_packets,
            limited: entry.limited,
            delayed_packets: s.delayed_packets,
            mean_delay_us: s.delay_ns_total.checked_div(s.delayed_packets).unwrap_or(0) / 1000,
            p99_delay_us: entry.p99_delay_us(),
            delay_buckets: if entry.leaf { s.delay_hist.to_vec() } else { Vec::new() },
            delay_ns_total: s.delay_ns_total,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;

    #[test]
    fn the_p99_delay_covers_the_last_second_and_an_idle_class_keeps_one_histogram() {
        let mut class = ClassEntry::new(1, true, Rate::from_bits_per_sec(1_000_000));
        let mut hist = [0u64; DELAY_BUCKETS];
        // 98 packets a tick in bucket 0 and two in bucket 3, for a second.
        for tick in 1..=100 {
            hist[0] += 98;
            hist[3] += 2;
            class.record_delays(tick * 10 * MS, hist);
        }
        assert_eq!(class.p99_delay_us(), Some((DELAY_BUCKET_BASE_NS << 3) / 1000));
        // Then nothing for half a second: the window still holds the packets.
        for tick in 101..=150 {
            class.record_delays(tick * 10 * MS, hist);
        }
        assert!(class.p99_delay_us().is_some());
        assert!(class.delays.len() <= 52, "{} histograms", class.delays.len());
        // And for a second more: none in the window, one histogram kept.
        for tick in 151..=260 {
            class.record_delays(tick * 10 * MS, hist);
        }
        assert_eq!(class.p99_delay_us(), None);
        assert_eq!(class.delays.len(), 1);
        // Packets again, only in bucket 0: the old ones are out of the window.
        hist[0] += 1000;
        class.record_delays(2610 * MS, hist);
        assert_eq!(class.p99_delay_us(), Some(DELAY_BUCKET_BASE_NS / 1000));
    }
}
