//! Demand estimation: what each leaf class would send if it could, from the datapath's
//! counters, every tick. The allocator ([`crate::tree`]) turns demands into rates.
//!
//! A class is *limited* when its pacing rate holds it back: its EDT clock runs ahead of now
//! by more than a few packets (packets wait in `fq`), or it sends at nearly its pacing rate.
//! A limited class wants as much as it can get (the allocator caps it at its ceil and shares
//! spare bandwidth by prio and weight); that is how a backlogged class probes upward. A class
//! that is not limited wants what it sends now, plus a little headroom; that is how an idle
//! class releases its share within a window.
//!
//! A class is never paced below its guaranteed rate ([`pacing_rate`]): a class that starts
//! sending gets its guarantee at once, without waiting for a tick.

use std::{collections::VecDeque, time::Duration, time::Instant};

/// Bytes per second of offered traffic, over a sliding window.
#[derive(Debug, Clone)]
pub struct Meter {
    window: Duration,
    /// (time, cumulative offered bytes), oldest first.
    samples: VecDeque<(Instant, u64)>,
}

impl Meter {
    #[must_use]
    pub fn new(window: Duration) -> Self {
        Self { window, samples: VecDeque::new() }
    }

    /// Records the cumulative byte count at `now` and returns the offered rate in bits/s over
    /// the window (or over what history there is).
    pub fn update(&mut self, now: Instant, total_bytes: u64) -> u64 {
        self.samples.push_back((now, total_bytes));
        while self.samples.len() > 2 && self.samples.get(1).is_some_and(|s| now.duration_since(s.0) >= self.window) {
            self.samples.pop_front();
        }
        let (t0, b0) = self.samples[0];
        let dt = now.duration_since(t0).as_nanos();
        if dt == 0 {
            return 0;
        }
        let bits = u128::from(total_bytes.saturating_sub(b0)) * 8;
        u64::try_from(bits * 1_000_000_000 / dt).unwrap_or(u64::MAX)
    }
}

/// What the daemon observed of one leaf class in a tick.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Observation {
    /// Offered rate (sent plus dropped), bits/s, over the meter's window.
    pub offered: u64,
    /// How far the class's EDT clock runs ahead of now, ns.
    pub backlog_ns: u64,
    /// The rate the class is paced at, bits/s.
    pub pacing: u64,
}

/// A full-size Ethernet frame, in bits.
const MTU_BITS: u128 = 1514 * 8;
/// Headroom over the measured rate for a class that is not limited (2 %, plus 8 kbit/s so
/// that a silent class does not read as exactly zero).
const HEADROOM_PERCENT: u64 = 2;
const HEADROOM_FLOOR: u64 = 8_000;

/// Whether the pacing rate holds the class back.
#[must_use]
pub fn limited(o: &Observation) -> bool {
    if o.pacing == 0 {
        return false;
    }
    // A few packets of backlog are bursts; more is a queue. Four frames at the class's rate,
    // and at least 2 ms.
    let frames_ns = u64::try_from(4 * MTU_BITS * 1_000_000_000 / u128::from(o.pacing)).unwrap_or(u64::MAX);
    let queue = o.backlog_ns > frames_ns.max(2_000_000);
    let busy = u128::from(o.offered) * 100 >= u128::from(o.pacing) * 95;
    queue || busy
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
        assert_eq!(m.update(t0, 0), 0);
        // 1250 bytes every 10 ms = 1 mbit/s.
        let mut rate = 0;
        for i in 1..=20u32 {
            rate = m.update(t0 + Duration::from_millis(10) * i, 1250 * u64::from(i));
        }
        assert_eq!(rate, 1_000_000);
        // The sender stops: within a window the rate reads zero.
        for i in 21..=26u32 {
            rate = m.update(t0 + Duration::from_millis(10) * i, 1250 * 20);
        }
        assert_eq!(rate, 0);
    }

    #[test]
    fn limited_when_queued_or_busy() {
        let mbit = 1_000_000;
        // Sends 2.5 of 4.9 with a burst of two frames queued: not limited.
        let light = Observation { offered: 25 * mbit / 10, backlog_ns: 5_000_000, pacing: 49 * mbit / 10 };
        assert!(!limited(&light));
        assert_eq!(demand(&light), 2_500_000 + 50_000 + 8_000);
        // A queue of 50 ms: limited.
        assert!(limited(&Observation { backlog_ns: 50_000_000, ..light }));
        // Sending at 96 % of its rate: limited.
        assert!(limited(&Observation { offered: 47 * mbit / 10, backlog_ns: 0, ..light }));
        assert_eq!(demand(&Observation { offered: 47 * mbit / 10, backlog_ns: 0, ..light }), u64::MAX);
        // At 300 kbit/s four frames take 160 ms: a 100 ms backlog is still a burst.
        assert!(!limited(&Observation { offered: 0, backlog_ns: 100_000_000, pacing: 300_000 }));
    }

    #[test]
    fn never_paced_below_the_guarantee() {
        assert_eq!(pacing_rate(0, 300_000), 300_000);
        assert_eq!(pacing_rate(8_100_000, 300_000), 8_100_000);
    }
}
