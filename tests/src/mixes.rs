//! Randomised traffic mixes on the model (`shaper::model`), for what the link carries when a
//! greedy class shares it with the senders a gateway really sees: constant-rate streams,
//! application-limited writes, small-packet floods, stalling streams and on/off senders, at
//! 5 to 90 % of the link. Every mix has a greedy class whose ceil is the link, so by HTB's
//! rules the link is always full; each other class's rate is compared with the independent
//! HTB reference (`crate::htb`), but for on/off senders, whose share changes with their phase.
//! `cargo xtask bench` prints the scan (`shaper-bench`); it is a figure, not a bar.

use shaper::model::{simulate, ClassSpec, Source, GREEDY, MBIT, MS, SECOND};

use crate::htb::model_shares;

/// The link of every mix, bit/s.
const LINK: u64 = 10 * MBIT;
/// Each mix runs this long; rates are read from `FROM` on.
const DURATION: u64 = 6 * SECOND;
const FROM: u64 = 2 * SECOND;

/// What one mix gave.
#[derive(Debug, Clone)]
pub struct Mix {
    pub classes: Vec<ClassSpec>,
    /// The link's use, percent of its rate.
    pub link_use: f64,
    /// The largest distance of a class with a steady demand from HTB's share, percent of the
    /// link.
    pub share_error: f64,
}

/// A small deterministic generator (xorshift64*), so that a scan is the same in every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }
}

/// One random mix: the greedy class and one to three others, with their steady demands
/// (`None`: an on/off sender).
fn mix(rng: &mut Rng) -> (Vec<ClassSpec>, Vec<Option<u64>>) {
    let others = 1 + rng.below(3);
    let shares: Vec<u64> = (0..=others).map(|_| 1 + rng.below(40)).collect();
    let total = shares.iter().sum::<u64>().max(40);
    let mut classes = vec![ClassSpec { rate: LINK * shares[0] / total, ceil: LINK, prio: 1, source: GREEDY }];
    let mut demand = vec![Some(u64::MAX)];
    for &share in &shares[1..] {
        let bits = LINK * (5 + rng.below(86)) / 100;
        let k = 1 + rng.below(9);
        let (source, steady) = match rng.below(5) {
            0 => (Source::Udp { bits, size: 1514 }, Some(bits)),
            1 => {
                // Writes every 20 to 180 ms, as an application that sends at its own pace.
                let period_ns = k * 20 * MS;
                let burst = bits * period_ns / SECOND / 8;
                (Source::Bursts { burst, period_ns }, Some(burst * 8 * SECOND / period_ns))
            }
            2 => (Source::Udp { bits, size: 200 }, Some(bits)),
            3 => (Source::Jittery { bits, stall_ns: k * 3 * MS, period_ns: 100 * MS }, Some(bits)),
            _ => (Source::OnOff { bits, on_ns: k * 50 * MS, off_ns: k * 70 * MS, phase_ns: 0 }, None),
        };
        #[expect(clippy::cast_possible_truncation, reason = "prio 0..3")]
        let prio = rng.below(3) as u8;
        classes.push(ClassSpec { rate: LINK * share / total, ceil: LINK, prio, source });
        demand.push(steady);
    }
    (classes, demand)
}

/// Runs `n` mixes from seed `seed`.
#[must_use]
pub fn scan(n: usize, seed: u64) -> Vec<Mix> {
    scan_with(n, seed, simulate)
}

/// [`scan`] with another simulation of the same signature.
#[must_use]
#[expect(clippy::cast_precision_loss, reason = "percentages")]
pub fn scan_with(
    n: usize,
    seed: u64,
    simulate: fn(u64, &[ClassSpec], u64, u64, u64) -> shaper::model::Run,
) -> Vec<Mix> {
    let mut rng = Rng(seed | 1);
    (0..n)
        .map(|_| {
            let (classes, demand) = mix(&mut rng);
            let run = simulate(LINK, &classes, DURATION, 10 * MS, 200 * MS);
            let got = run.rates(FROM, DURATION);
            let link_use = got.iter().sum::<u64>() as f64 * 100.0 / LINK as f64;
            let share_error = if demand.iter().all(Option::is_some) {
                let want: Vec<u64> = demand.iter().map(|d| d.expect("steady")).collect();
                let htb = model_shares(LINK, &classes, &want);
                got.iter().zip(&htb).map(|(&g, &e)| g.abs_diff(e) as f64 * 100.0 / LINK as f64).fold(0.0, f64::max)
            } else {
                0.0
            };
            Mix { classes, link_use, share_error }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan is the same in every run, and its mixes hold every kind of sender.
    #[test]
    fn the_mixes_are_fixed_and_varied() {
        let (mut a, mut b) = (Rng(7), Rng(7));
        let (x, y): (Vec<_>, Vec<_>) = (0..200).map(|_| (mix(&mut a).0, mix(&mut b).0)).unzip();
        assert_eq!(x, y);
        let kinds =
            x.iter().flatten().map(|c| std::mem::discriminant(&c.source)).collect::<std::collections::HashSet<_>>();
        assert_eq!(kinds.len(), 5, "greedy, UDP (full frames and small), writes, jittery, on/off: {kinds:?}");
    }
}
