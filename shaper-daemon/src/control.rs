//! Demand estimation: what each leaf class would send if it could, from the datapath's
//! counters, every tick. The allocator ([`crate::tree`]) turns demands into rates.
//!
//! A class is *limited* when its pacing rate holds it back: it sends at nearly its pacing
//! rate, or its EDT clock ran ahead of now by more than a few packets (packets waiting in
//! `fq`) in nearly every tick of the window. A burst that drains (an application writing
//! 128 KB at a time) is not a limit: the window is long enough to tell the two apart.
//! A limited class wants as much as it can get (the allocator caps it at its ceil and shares
//! spare bandwidth by prio and weight); that is how a backlogged class probes upward. A class
//! that is not limited wants what it sends now, plus a little headroom; that is how an idle
//! class releases its share within a window.
//!
//! A class is never paced below its guaranteed rate ([`pacing_rate`]): a class that starts
//! sending gets its guarantee at once, without waiting for a tick.

use std::{collections::VecDeque, time::Duration, time::Instant};

/// Offered traffic and backlog over a sliding window.
#[derive(Debug, Clone)]
pub struct Meter {
    window: Duration,
    /// (time, (cumulative offered bytes, queued at that time)), oldest first.
    samples: VecDeque<(Instant, (u64, bool))>,
}

/// Appends `sample`, taken at `now`, to a time series and forgets what is older than
/// `window`, keeping the newest sample at or before the window's start: it marks the start.
pub fn slide<T>(samples: &mut VecDeque<(Instant, T)>, now: Instant, sample: T, window: Duration) {
    samples.push_back((now, sample));
    while samples.len() > 2 && samples.get(1).is_some_and(|s| now.duration_since(s.0) >= window) {
        samples.pop_front();
    }
}

/// What a [`Meter`] read over its window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reading {
    /// Offered rate, bits/s.
    pub rate: u64,
    /// Per mille of the window's samples in which the class had a queue.
    pub queued_permille: u32,
    /// Samples in the window.
    pub samples: u32,
    /// The latest samples in a row in which the class had a queue.
    pub queued_streak: u32,
}

impl Meter {
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self { window, samples: VecDeque::new() }
    }

    /// Records the cumulative byte count and whether the class has a queue at `now`; returns
    /// the offered rate over the window (or over what history there is) and how often the
    /// class had a queue.
    pub fn update(&mut self, now: Instant, total_bytes: u64, queued: bool) -> Reading {
        slide(&mut self.samples, now, (total_bytes, queued), self.window);
        let (t0, (b0, _)) = self.samples[0];
        let dt = now.duration_since(t0).as_nanos();
        let bits = u128::from(total_bytes.saturating_sub(b0)) * 8;
        let rate = (bits * 1_000_000_000).checked_div(dt).map_or(0, |r| u64::try_from(r).unwrap_or(u64::MAX));
        // The oldest sample only marks the window's start.
        let recent = self.samples.iter().skip(1);
        let samples = u32::try_from(recent.clone().count()).unwrap_or(u32::MAX);
        let queued = u32::try_from(recent.filter(|s| s.1 .1).count()).unwrap_or(u32::MAX);
        let queued_streak = u32::try_from(self.samples.iter().rev().take_while(|s| s.1 .1).count()).unwrap_or(u32::MAX);
        Reading { rate, queued_permille: (queued * 1000).checked_div(samples).unwrap_or(0), samples, queued_streak }
    }
}

/// What the daemon observed of one leaf class over the meter's window.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Offered rate (sent plus dropped), bits/s.
    pub offered: u64,
    /// Per mille of the window's ticks in which the class had a queue ([`queued`]).
    pub queued_permille: u32,
    /// Ticks in the window.
    pub samples: u32,
    /// The latest ticks in a row with a queue.
    pub queued_streak: u32,
    /// The rate the class is paced at, bits/s.
    pub pacing: u64,
}

/// A full-size Ethernet frame, in bits.
const MTU_BITS: u128 = 1514 * 8;
/// Headroom over the measured rate for a class that is not limited (2 %, plus 8 kbit/s so
/// that a silent class does not read as exactly zero).
const HEADROOM_PERCENT: u64 = 2;
const HEADROOM_FLOOR: u64 = 8_000;

/// Whether a class has a queue: its EDT clock runs `backlog_ns` ahead of now, more than a
/// few packets at its pacing rate (four full-size frames, and at least 2 ms).
#[must_use]
pub fn queued(backlog_ns: u64, pacing: u64) -> bool {
    if pacing == 0 {
        return false;
    }
    let frames_ns = u64::try_from(4 * MTU_BITS * 1_000_000_000 / u128::from(pacing)).unwrap_or(u64::MAX);
    backlog_ns > frames_ns.max(2_000_000)
}

/// Ticks of history needed before a queue alone counts as a limit.
const MIN_SAMPLES: u32 = 3;
/// Ticks in a row with a queue that count as a limit whatever came before: a class that was
/// idle for the whole window is seen to want more within this many ticks of queueing.
const QUEUED_STREAK: u32 = 5;

/// Whether the pacing rate holds the class back: it sends at 95 % of its rate or more, or
/// it had a queue in 90 % of the window's ticks or more, or in the last few ticks in a row.
#[must_use]
pub fn limited(o: &Observation) -> bool {
    if o.pacing == 0 {
        return false;
    }
    let busy = u128::from(o.offered) * 100 >= u128::from(o.pacing) * 95;
    let backlogged = o.samples >= MIN_SAMPLES && o.queued_permille >= 900;
    busy || backlogged || o.queued_streak >= QUEUED_STREAK
}

/// The demand to give the allocator for a leaf class (bits/s).
#[must_use]
pub fn demand(o: &Observation) -> u64 {
    if limited(o) {
        u64::MAX
    } else {
        o.offered.saturating_add(o.offered / 100 * HEADROOM_PERCENT).saturating_add(HEADROOM_FLOOR)
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

    #[test]
    fn meter_reads_the_rate_over_its_window() {
        let t0 = Instant::now();
        let mut m = Meter::new(Duration::from_millis(50));
        assert_eq!(m.update(t0, 0, false).rate, 0);
        // 1250 bytes every 10 ms = 1 mbit/s, queued every other tick.
        let mut r = m.update(t0, 0, false);
        for i in 1..=20u32 {
            r = m.update(t0 + Duration::from_millis(10) * i, 1250 * u64::from(i), i % 2 == 0);
        }
        assert_eq!(r.rate, 1_000_000);
        assert_eq!((r.samples, r.queued_permille, r.queued_streak), (5, 600, 1));
        // The sender stops: within a window the rate reads zero.
        for i in 21..=26u32 {
            r = m.update(t0 + Duration::from_millis(10) * i, 1250 * 20, false);
        }
        assert_eq!((r.rate, r.queued_permille), (0, 0));
    }

    #[test]
    fn limited_when_busy_or_queued_throughout() {
        let mbit = 1_000_000;
        // Sends 2.5 of 4.9 in bursts that queue half the time: not limited.
        let bursty = Observation {
            offered: 25 * mbit / 10,
            queued_permille: 500,
            samples: 20,
            queued_streak: 2,
            pacing: 49 * mbit / 10,
        };
        assert!(!limited(&bursty));
        assert_eq!(demand(&bursty), 2_500_000 + 50_000 + 8_000);
        // Queued in every tick: limited, wants all it can get.
        assert!(limited(&Observation { queued_permille: 1000, ..bursty }));
        assert_eq!(demand(&Observation { queued_permille: 1000, ..bursty }), u64::MAX);
        // ... but not on the strength of two ticks.
        assert!(!limited(&Observation { queued_permille: 1000, samples: 2, ..bursty }));
        // Idle for most of the window, then queued for five ticks in a row: limited.
        assert!(limited(&Observation { queued_permille: 250, queued_streak: 5, ..bursty }));
        // Sending at 96 % of its rate: limited.
        assert!(limited(&Observation { offered: 47 * mbit / 10, queued_permille: 0, ..bursty }));
        // At 300 kbit/s four frames take 160 ms: a 100 ms backlog is still a burst.
        assert!(!queued(100_000_000, 300_000));
        assert!(queued(200_000_000, 300_000));
        assert!(queued(3_000_000, 100 * mbit));
        assert!(!queued(1_000_000, 100 * mbit));
    }

    #[test]
    fn never_paced_below_the_guarantee() {
        assert_eq!(pacing_rate(0, 300_000), 300_000);
        assert_eq!(pacing_rate(8_100_000, 300_000), 8_100_000);
    }
}
