//! Demand estimation: what each leaf class would send if it could, from the datapath's
//! counters, every tick. The allocator ([`crate::tree`]) turns demands into allocations, and
//! [`pacing_rate`] allocations into the rates the datapath paces at.
//!
//! A class is *limited* when its pacing rate holds it back, and the sign of that is a queue
//! that never empties: over the last [`QUEUE_WINDOW`] (or four full frames at its rate, if
//! longer) it sent packets and none of them found the class's clock idle (the datapath's
//! `idle_packets` counter), or its clock is now further ahead than that window (a queue that
//! cannot drain within it). A class sending below its pacing rate, however close to it, finds
//! its clock idle now and then, so a steady stream is never mistaken for a greedy sender
//! (which a test on the sent rate alone does: a class paced at what it sends always sends at
//! its pacing rate).
//!
//! - A limited class wants more than it has: its pacing rate (or offered rate, if higher)
//!   times `1 + g`, where `g` starts at 1/16 and doubles with every further limited tick, up
//!   to one. A class just short of what it needs, which stops being limited after a tick or
//!   two, grows by a few percent; a greedy one doubles per tick until the allocator caps it at its
//!   share or ceil (a class that joins at 0.3 mbit/s reaches 8 within about ten ticks).
//! - A class that is not limited wants what it offered over [`RATE_WINDOW_NS`] plus
//!   [`HEADROOM_PERCENT`], so that its own jitter does not queue it; a new demand within a
//!   dead band around the last one keeps the last one, so that a steady sender's allocation
//!   (and so its borrowers') does not follow the window's sampling noise (packets entering
//!   and leaving it).
//!
//! The headroom is not lent: the rates paced add up to at most the link, and a link a
//! greedy class shares with steady ones runs at `1 - 2 % * (their share)` of its rate (99.6 %
//! next to a 2 mbit/s stream on 10 mbit/s). Lending it too was tried in the model
//! ([`crate::model`]): the sum of the rates then exceeds the link whenever the steady classes
//! use their headroom, and the datapath's link clock, which takes slots when packets are
//! paced, cannot hold back packets already given a departure time.
//!
//! A class is never paced below its guaranteed rate ([`pacing_rate`]): a class that starts
//! sending gets its guarantee at once, without waiting for a tick, and the link clock keeps
//! the interface near its rate until the next tick moves the borrowers down.

use std::collections::VecDeque;

/// Window over which the offered rate of a class that is not limited is measured.
pub const RATE_WINDOW_NS: u64 = 400_000_000;
/// Shortest window over which a class must have had a queue throughout to count as limited.
pub const QUEUE_WINDOW_NS: u64 = 50_000_000;
/// Headroom over the offered rate of a class that is not limited (2 %, plus 8 kbit/s so that
/// a class that starts sending is not paced at nothing).
pub const HEADROOM_PERCENT: u64 = 2;
pub const HEADROOM_FLOOR: u64 = 8_000;
/// The dead band: a class that is not limited keeps its last demand while that is between
/// `offered * (1 + DEAD_BAND_LOW_PERCENT)` and `offered * (1 + DEAD_BAND_HIGH_PERCENT)`.
pub const DEAD_BAND_LOW_PERCENT: u64 = 1;
pub const DEAD_BAND_HIGH_PERCENT: u64 = 4;
/// A limited class's first growth step, as a divisor: `1 + 1/16`; each further limited tick
/// doubles the step, up to doubling the rate.
const FIRST_GROWTH_DIVISOR: u64 = 16;
/// A full-size Ethernet frame, in bits.
const FRAME_BITS: u64 = 1514 * 8;

/// The datapath's cumulative counters of one class, as the estimator reads them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counters {
    /// Bytes offered: sent plus dropped (wire bytes).
    pub offered_bytes: u64,
    /// Packets (segments) sent.
    pub packets: u64,
    /// Packets that found the class's clock idle.
    pub idle_packets: u64,
}

/// What the daemon observes of one leaf class at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// `CLOCK_MONOTONIC` time of the observation, ns.
    pub now_ns: u64,
    pub counters: Counters,
    /// How far the class's clock is ahead of now, ns (0 if behind).
    pub backlog_ns: u64,
    /// The rate the class is paced at, bits/s.
    pub pacing: u64,
}

/// What the estimator concluded at a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Estimate {
    /// What the class wants, bits/s (`u64::MAX` never: growth is bounded by the pacing rate).
    pub demand: u64,
    /// The offered rate over [`RATE_WINDOW_NS`], bits/s.
    pub offered: u64,
    /// Whether the pacing rate holds the class back.
    pub limited: bool,
}

/// The demand estimator of one leaf class: its counter history and last demand.
#[derive(Debug, Clone, Default)]
pub struct Estimator {
    /// (time ns, counters), oldest first, covering [`RATE_WINDOW_NS`].
    samples: VecDeque<(u64, Counters)>,
    /// The last demand given.
    demand: u64,
    /// Limited ticks in a row.
    streak: u32,
}

impl Estimator {
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Records an observation and returns the class's demand.
    pub fn update(&mut self, o: &Observation) -> Estimate {
        slide(&mut self.samples, o.now_ns, o.counters, RATE_WINDOW_NS);
        let offered = self.offered_rate(o.now_ns, o.counters);
        let limited = self.limited(o);
        let demand = if limited {
            self.streak = self.streak.saturating_add(1);
            let base = o.pacing.max(offered);
            let step = (base / FIRST_GROWTH_DIVISOR) << (self.streak - 1).min(FIRST_GROWTH_DIVISOR.ilog2());
            base.saturating_add(step.min(base))
        } else {
            self.streak = 0;
            let low = percent_over(offered, DEAD_BAND_LOW_PERCENT);
            let high = percent_over(offered, DEAD_BAND_HIGH_PERCENT).saturating_add(HEADROOM_FLOOR);
            if (low..=high).contains(&self.demand) {
                self.demand
            } else {
                percent_over(offered, HEADROOM_PERCENT).saturating_add(HEADROOM_FLOOR)
            }
        };
        self.demand = demand;
        Estimate { demand, offered, limited }
    }

    /// The offered rate over the window (or what history there is), bits/s.
    fn offered_rate(&self, now: u64, c: Counters) -> u64 {
        let (t0, c0) = self.samples[0];
        let bits = u128::from(c.offered_bytes.saturating_sub(c0.offered_bytes)) * 8;
        (bits * 1_000_000_000).checked_div(u128::from(now.saturating_sub(t0))).map_or(0, saturate)
    }

    /// Whether the class had a queue throughout the queue window, or has one longer than it.
    fn limited(&self, o: &Observation) -> bool {
        if o.pacing == 0 {
            return false;
        }
        let frames_ns = saturate(u128::from(4 * FRAME_BITS) * 1_000_000_000 / u128::from(o.pacing));
        let window = QUEUE_WINDOW_NS.max(frames_ns);
        if o.backlog_ns >= window {
            return true;
        }
        if o.backlog_ns == 0 {
            return false;
        }
        // The newest sample at least a window old: the queue must have lasted since then.
        let Some(&(t0, c0)) = self.samples.iter().rev().find(|(t, _)| o.now_ns.saturating_sub(*t) >= window) else {
            return false;
        };
        debug_assert!(t0 <= o.now_ns);
        o.counters.packets > c0.packets && o.counters.idle_packets == c0.idle_packets
    }
}

/// `value * (100 + percent) / 100`, saturating.
fn percent_over(value: u64, percent: u64) -> u64 {
    saturate(u128::from(value) * u128::from(100 + percent) / 100)
}

fn saturate(v: u128) -> u64 {
    u64::try_from(v).unwrap_or(u64::MAX)
}

/// Appends `sample`, taken at `now`, to a time series and forgets what is older than
/// `window`, keeping the newest sample at or before the window's start: it marks the start.
pub fn slide<T, N: Copy + Into<u128>>(samples: &mut VecDeque<(N, T)>, now: N, sample: T, window: N) {
    samples.push_back((now, sample));
    let (now, window) = (now.into(), window.into());
    while samples.len() > 2 && samples.get(1).is_some_and(|s| now.saturating_sub(s.0.into()) >= window) {
        samples.pop_front();
    }
}

/// The rate a leaf is paced at: its allocation, and never less than its guarantee.
#[must_use]
pub fn pacing_rate(allocated: u64, guaranteed: u64) -> u64 {
    allocated.max(guaranteed)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const MBIT: u64 = 1_000_000;

    /// Drives an estimator with a class that offers `offered` bits/s, in full frames, paced
    /// at `pacing`, for `ticks` ticks of 10 ms; `queued(tick)` says whether the class's clock
    /// stays ahead of now through the tick. Returns the last estimate.
    fn drive(
        e: &mut Estimator,
        start: &mut (u64, Counters),
        offered: u64,
        pacing: u64,
        ticks: u32,
        queued: bool,
    ) -> Estimate {
        let mut last = None;
        for _ in 0..ticks {
            let (t, c) = start;
            *t += 10 * MS;
            let bytes = offered / 8 / 100;
            c.offered_bytes += bytes;
            let packets = (bytes / 1514).max(1);
            c.packets += packets;
            if !queued {
                c.idle_packets += 1;
            }
            last = Some(e.update(&Observation {
                now_ns: *t,
                counters: *c,
                backlog_ns: if queued { 5 * MS } else { 0 },
                pacing,
            }));
        }
        last.expect("at least one tick")
    }

    #[test]
    fn a_steady_stream_is_not_limited_and_wants_what_it_sends_plus_headroom() {
        let mut e = Estimator::new();
        let mut s = (0, Counters::default());
        let r = drive(&mut e, &mut s, 2 * MBIT, 2_100_000, 100, false);
        assert!(!r.limited);
        assert_eq!(r.offered, 2 * MBIT);
        assert_eq!(r.demand, 2 * MBIT * 102 / 100 + HEADROOM_FLOOR);
    }

    #[test]
    fn a_queue_that_never_empties_makes_a_class_limited_and_its_demand_grows() {
        let mut e = Estimator::new();
        let mut s = (0, Counters::default());
        drive(&mut e, &mut s, 300_000, 300_000, 10, false);
        // Queued, but not yet for a whole window (four frames at 0.3 mbit/s: 161 ms).
        assert!(!drive(&mut e, &mut s, 300_000, 300_000, 15, true).limited);
        let first = drive(&mut e, &mut s, 300_000, 300_000, 2, true);
        assert!(first.limited);
        // Steps of 1/16, 1/8, ... of the pacing rate, then doubling.
        let mut pacing = first.demand;
        let mut ticks = 0;
        while pacing < 8 * MBIT {
            let r = drive(&mut e, &mut s, 300_000, pacing, 1, true);
            assert!(r.demand > pacing);
            pacing = r.demand;
            ticks += 1;
        }
        assert!(ticks <= 10, "{ticks} ticks to reach 8 mbit/s");
    }

    #[test]
    fn a_deep_queue_counts_at_once() {
        let mut e = Estimator::new();
        let c = Counters { offered_bytes: 1514, packets: 1, idle_packets: 1 };
        let r = e.update(&Observation { now_ns: MS, counters: c, backlog_ns: 200 * MS, pacing: 1_000_000 });
        assert!(r.limited);
        assert!(r.demand > 1_000_000);
    }

    #[test]
    fn the_dead_band_keeps_a_steady_demand_steady() {
        let mut e = Estimator::new();
        let mut s = (0, Counters::default());
        let before = drive(&mut e, &mut s, 2 * MBIT, 2_100_000, 60, false).demand;
        // The offered rate wobbles by 1 %: the demand stays.
        let after = drive(&mut e, &mut s, 2 * MBIT * 101 / 100, before, 60, false).demand;
        assert_eq!(before, after);
        // It drops by half: the demand follows within the window.
        let later = drive(&mut e, &mut s, MBIT, before, 41, false);
        assert!((MBIT * 101 / 100..=MBIT * 104 / 100 + HEADROOM_FLOOR).contains(&later.demand), "{later:?}");
    }

    #[test]
    fn slide_keeps_the_window_start() {
        let mut v = VecDeque::new();
        for t in 0..10u64 {
            slide(&mut v, t * 10, t, 30);
        }
        assert_eq!(v.front().unwrap().0, 60);
        assert_eq!(v.back().unwrap().0, 90);
    }

    #[test]
    fn never_paced_below_the_guarantee() {
        assert_eq!(pacing_rate(0, 300_000), 300_000);
        assert_eq!(pacing_rate(8_100_000, 300_000), 8_100_000);
    }
}
