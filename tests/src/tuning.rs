//! The control loop's two free parameters, measured on the [`model`](shaper::model): the
//! tick (how often shaperd reads the counters and rewrites the rates) and the headroom
//! (how much more than it sends a class that is not limited is given, see
//! [`demand`](shaper::allocation::demand)). [`sweep`] runs the same traffic under each pair and reports
//! what each costs; `cargo xtask bench` prints the table.
//!
//! The traffic: seed 000's four classes under a 10 mbit/s link (alex 1.9, betty 2.9, carl
//! 4.9 at prio 1, the guest 0.3 at prio 0, all ceil 10), each scenario a class mix the
//! model's tests check one setting of:
//! - greedy: the four classes greedy (the shares HTB gives them);
//! - stream: alex greedy, the guest a steady 2 mbit/s stream (link use, stability);
//! - jittery: the same stream stalling 20 ms in 200 ms and catching up (link use);
//! - on/off: alex greedy, betty 4 mbit/s a second in two, carl 2 mbit/s (alex against HTB's
//!   average over the two phases);
//! - bursts: alex and betty greedy, carl writing 16 KB every 50 ms (link use, shares);
//! - wake: alex, betty and carl start at once (what the link carries over its rate).

use shaper::model::{
    roommates, simulate_with_headroom, ClassSpec, Run, Source, GREEDY, MBIT, MS, SECOND, WRITES, WRITES_BITS,
};

use crate::htb::model_shares as reference;

const LINK: u64 = 10 * MBIT;
const HORIZON: u64 = 200 * MS;
const DURATION: u64 = 6 * SECOND;
/// The steady part of each run, where rates are measured.
const FROM: u64 = 3 * SECOND;

/// What one (tick, headroom) pair gives.
#[derive(Debug, Clone, PartialEq)]
pub struct Tuning {
    pub tick_ns: u64,
    pub headroom_percent: u64,
    /// The lowest link use among the scenarios whose classes want the whole link (stream,
    /// jittery, bursts), percent of the link.
    pub link_use: f64,
    /// The largest distance of a class's rate from HTB's share, greedy, stream and bursts,
    /// percent of the share (shares under 0.5 mbit/s: of 0.5 mbit/s).
    pub share_error: f64,
    /// On/off: alex's rate, percent of what HTB gives him on average.
    pub on_off: f64,
    /// The largest change of a class's pacing rate from one tick to the next in nine
    /// ticks out of ten (stream, bursts), per mille.
    pub pacing_change: u64,
    /// wake: alex, betty and carl start together; the most bytes the link carried over its
    /// rate in a 100 ms window (they ask for more than the link until the next tick).
    pub wake_overshoot: u64,
}

const IDLE: Source = Source::Idle;

#[expect(clippy::cast_precision_loss, reason = "percentages for a report")]
fn percent(part: u64, whole: u64) -> f64 {
    part as f64 * 100.0 / whole.max(1) as f64
}

/// The largest distance of the measured rates from `expected`, percent.
#[expect(clippy::cast_precision_loss, reason = "percentages for a report")]
fn share_error(run: &Run, expected: &[u64]) -> f64 {
    let got = run.rates(FROM, DURATION);
    got.iter().zip(expected).map(|(&g, &e)| g.abs_diff(e) as f64 * 100.0 / e.max(MBIT / 2) as f64).fold(0.0, f64::max)
}

fn link_use(run: &Run) -> f64 {
    percent(run.rates(FROM, DURATION).iter().sum(), LINK)
}

fn pacing_change(run: &Run) -> u64 {
    let ticks = run.pacing.len();
    (0..run.classes.len()).map(|c| run.pacing_changes(c, ticks / 2, ticks).1).max().unwrap_or(0)
}

/// Runs every scenario under one tick and headroom.
#[must_use]
pub fn measure(tick_ns: u64, headroom_percent: u64) -> Tuning {
    let run =
        |classes: &[ClassSpec]| simulate_with_headroom(LINK, classes, DURATION, tick_ns, HORIZON, headroom_percent);
    let udp = Source::Udp { bits: 2 * MBIT, size: 1514 };

    let greedy = roommates([GREEDY, GREEDY, GREEDY, GREEDY]);
    let greedy_run = run(&greedy);
    let greedy_error = share_error(&greedy_run, &reference(LINK, &greedy, &[u64::MAX; 4]));

    let stream = roommates([GREEDY, IDLE, IDLE, udp.clone()]);
    let stream_run = run(&stream);
    let stream_error = share_error(&stream_run, &[8 * MBIT, 0, 0, 2 * MBIT]);

    let jittery = Source::Jittery { bits: 2 * MBIT, stall_ns: 20 * MS, period_ns: 200 * MS };
    let jittery_run = run(&roommates([GREEDY, IDLE, IDLE, jittery]));

    let on_off = Source::OnOff { bits: 4 * MBIT, on_ns: SECOND, off_ns: SECOND, phase_ns: 0 };
    let on_off_classes = roommates([GREEDY, on_off, udp, IDLE]);
    let on_off_run = run(&on_off_classes);
    let on = reference(LINK, &on_off_classes, &[u64::MAX, 4 * MBIT, 2 * MBIT, 0])[0];
    let off = reference(LINK, &on_off_classes, &[u64::MAX, 0, 2 * MBIT, 0])[0];
    let alex = on_off_run.rates(2 * SECOND, DURATION)[0];

    let bursts = roommates([GREEDY, GREEDY, WRITES, IDLE]);
    let bursts_run = run(&bursts);
    let bursts_error = share_error(&bursts_run, &reference(LINK, &bursts, &[u64::MAX, u64::MAX, WRITES_BITS, 0]));

    let wake_run = run(&roommates([GREEDY, GREEDY, GREEDY, IDLE]));
    let wake_overshoot = wake_run.max_in_window(None, 100 * MS, 0).saturating_sub(LINK / 8 / 10);

    Tuning {
        tick_ns,
        headroom_percent,
        link_use: [&stream_run, &jittery_run, &bursts_run].into_iter().map(link_use).fold(f64::MAX, f64::min),
        share_error: greedy_error.max(stream_error).max(bursts_error),
        on_off: percent(alex, u64::midpoint(on, off)),
        pacing_change: pacing_change(&stream_run).max(pacing_change(&bursts_run)),
        wake_overshoot,
    }
}

/// [`measure`] for every pair of `ticks` (ns) and `headrooms` (percent).
#[must_use]
pub fn sweep(ticks: &[u64], headrooms: &[u64]) -> Vec<Tuning> {
    ticks.iter().flat_map(|&t| headrooms.iter().map(move |&h| measure(t, h))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The chosen pair, 10 ms and 2 %, keeps the link full and the shares HTB's in every
    /// scenario (the model's tests check each scenario more closely).
    #[test]
    fn the_chosen_tick_and_headroom_meet_the_targets() {
        let t = measure(10 * MS, shaper::allocation::demand::HEADROOM_PERCENT);
        assert!(t.link_use >= 97.0 && t.share_error <= 3.0 && t.on_off >= 96.0 && t.pacing_change < 50, "{t:?}");
    }
}
