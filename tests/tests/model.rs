//! The model of the rate path (`shaper::model`: the real estimator, allocator and pacer
//! around a sequential copy of the datapath's pacing) on the seeds' traffic, each class's
//! rate against what Linux HTB gives it (`shaper_tests::htb`, independent of the allocator).
//! No root needed: seconds of simulated traffic run in milliseconds.

use proptest::prelude::*;
use shaper::{
    allocation::demand,
    model::{roommates, simulate, ClassSpec, Run, Source, GREEDY, MBIT, MS, SECOND, WRITES, WRITES_BITS},
};
use shaper_common::{FULL_FRAME, LINK_SLACK_PERCENT};
use shaper_tests::htb::model_shares as reference;

const TICK: u64 = 10 * MS;
const HORIZON: u64 = 200 * MS;

fn udp(bits: u64) -> Source {
    Source::Udp { bits, size: 1514 }
}

fn mbit(v: &[u64]) -> Vec<f64> {
    #[expect(clippy::cast_precision_loss, reason = "for display")]
    v.iter().map(|&x| (x as f64 / 1e4).round() / 100.0).collect()
}

/// Runs 6 s and checks the last 3: each class within 3 % (or 30 kbit/s) of `expected`,
/// the link use, and the pacing rates' stability.
fn check(classes: &[ClassSpec], expected: &[u64]) -> Run {
    let run = simulate(10 * MBIT, classes, 6 * SECOND, TICK, HORIZON);
    let got = run.rates(3 * SECOND, 6 * SECOND);
    for (c, (&g, &e)) in got.iter().zip(expected).enumerate() {
        assert!(
            g.abs_diff(e) <= (e * 3 / 100).max(30_000),
            "class {c}: {:?} vs expected {:?}",
            mbit(&got),
            mbit(expected)
        );
    }
    run
}

#[test]
fn seed_000_with_greedy_senders() {
    let g = || GREEDY;
    let i = || Source::Idle;
    check(&roommates([g(), i(), i(), i()]), &[10 * MBIT, 0, 0, 0]);
    check(&roommates([g(), g(), i(), i()]), &[3_960_000, 6_040_000, 0, 0]);
    check(&roommates([g(), i(), i(), g()]), &[1_900_000, 0, 0, 8_100_000]);
    check(&roommates([g(), g(), g(), g()]), &[1_900_000, 2_900_000, 4_900_000, 300_000]);
}

/// The first case: a steady stream above its guarantee no longer starves the
/// borrowers, and nobody's pacing rate swings from tick to tick.
#[test]
fn a_steady_stream_above_its_guarantee_leaves_the_rest_to_the_borrower() {
    let run = check(&roommates([GREEDY, Source::Idle, Source::Idle, udp(2 * MBIT)]), &[8 * MBIT, 0, 0, 2 * MBIT]);
    let total: u64 = run.rates(3 * SECOND, 6 * SECOND).iter().sum();
    assert!(total >= 99 * 10 * MBIT / 100, "link use {total}");
    for class in [0, 3] {
        let (median, _, max) = run.pacing_changes(class, 300, 600);
        assert!(median < 20 && max < 20, "class {class}: pacing moves by {max} per mille at most, median {median}");
    }
}

/// The same with a stream whose sender stalls 20 ms every 200 ms and then catches up:
/// its bursts are drained, not mistaken for a greedy sender.
#[test]
fn a_jittery_stream_is_not_taken_for_a_greedy_one() {
    let jittery = Source::Jittery { bits: 2 * MBIT, stall_ns: 20 * MS, period_ns: 200 * MS };
    // What the stream is allocated and does not send while it stalls (10 % of the time)
    // is lent: alex gets all but the stream and its headroom.
    let alex = 10 * MBIT - 2_040_000;
    let run = check(&roommates([GREEDY, Source::Idle, Source::Idle, jittery]), &[alex, 0, 0, 2 * MBIT]);
    let (median, _, max) = run.pacing_changes(0, 300, 600);
    assert!(median < 20, "alex's pacing moves by {max} per mille at most, median {median}");
    let most = run.allocation[300..600].iter().map(|p| p[3]).max().unwrap_or(0);
    assert!(most < 3 * MBIT, "the stream was allocated up to {most}");
}

/// An on/off sender (4 mbit/s for a second in two) next to a greedy class and a steady
/// stream: the greedy class gets, on average, within 7 % of what HTB gives it in each
/// phase (the on/off sender's share comes back 200 ms after it stops).
#[test]
fn an_on_off_sender_takes_its_share_and_gives_it_back() {
    let on_off = Source::OnOff { bits: 4 * MBIT, on_ns: SECOND, off_ns: SECOND, phase_ns: 0 };
    let classes = roommates([GREEDY, on_off, udp(2 * MBIT), Source::Idle]);
    let run = simulate(10 * MBIT, &classes, 8 * SECOND, TICK, HORIZON);
    let on = reference(10 * MBIT, &classes, &[u64::MAX, 4 * MBIT, 2 * MBIT, 0])[0];
    let off = reference(10 * MBIT, &classes, &[u64::MAX, 0, 2 * MBIT, 0])[0];
    let expected = u64::midpoint(on, off);
    let got = run.rates(2 * SECOND, 8 * SECOND);
    assert!(got[0] >= expected * 96 / 100, "alex {:?} of {:?}", mbit(&got), mbit(&[expected]));
    assert!(got[1].abs_diff(2 * MBIT) <= 2 * MBIT / 100, "{:?}", mbit(&got));
}

/// An application that writes 16 KB every 50 ms (2.6 mbit/s) next to two greedy classes:
/// its pauses between writes do not give its share away, so the link is never over its
/// rate (it was by 8 % in the VM when a 20 ms pause counted as stopping).
#[test]
fn an_application_writing_in_bursts_keeps_its_share() {
    let run = {
        let classes = roommates([GREEDY, GREEDY, WRITES, Source::Idle]);
        check(&classes, &reference(10 * MBIT, &classes, &[u64::MAX, u64::MAX, WRITES_BITS, 0]))
    };
    // From the first second on: the three classes start together, each paced at what it
    // would get alone for their first tick (see `classes_that_wake_together_...`).
    let most = run.max_in_window(None, SECOND, SECOND);
    assert!(most <= 10 * MBIT / 8 + 2 * FULL_FRAME, "{most} bytes in a second through a 10 mbit/s link");
}

/// Quiet classes are paced at what each would get if it woke alone (`pacing`), but behind
/// the link clock: classes that start in the same tick take their turns on the link until
/// the next tick allocates them, and the link holds from their first packet.
#[test]
fn classes_that_wake_together_keep_to_the_link() {
    let classes = roommates([GREEDY, GREEDY, GREEDY, Source::Idle]);
    let run = simulate(10 * MBIT, &classes, 3 * SECOND, TICK, HORIZON);
    let link = 10 * MBIT / 8 / 10;
    for from in [0, 200 * MS] {
        let most = run.max_in_window(None, 100 * MS, from);
        assert!(
            most <= link * (100 + LINK_SLACK_PERCENT) / 100 + 3 * FULL_FRAME,
            "{most} bytes in 100 ms from {from} ns"
        );
    }
    // Within a tick they are where HTB puts them.
    let rates = run.rates(SECOND, 3 * SECOND);
    let htb = reference(10 * MBIT, &classes, &[u64::MAX, u64::MAX, u64::MAX, 0]);
    for (g, e) in rates.iter().zip(&htb) {
        assert!(g.abs_diff(*e) <= e / 50, "{:?} against {:?}", mbit(&rates), mbit(&htb));
    }
}

/// The busiest 100 ms of each wake of three classes that send 8 mbit/s a second in two
/// (the first wakes at `phases` ms into the period), and the busiest steady 100 ms.
fn wakes(phases: [u64; 3]) -> (Vec<u64>, u64) {
    let period = 2 * SECOND + 3_700_000;
    let on = |p: u64| Source::OnOff { bits: 8 * MBIT, on_ns: SECOND, off_ns: period - SECOND, phase_ns: p * MS };
    let classes = roommates([on(phases[0]), on(phases[1]), on(phases[2]), Source::Idle]);
    let run = simulate(10 * MBIT, &classes, 12 * SECOND, TICK, HORIZON);
    let busiest = |from: u64, to: u64| {
        let departures = run.departures.iter().filter(|d| (from..to).contains(&d.0)).copied().collect();
        Run { departures, ..run.clone() }.max_in_window(None, 100 * MS, from)
    };
    // The first wake is the model's start, before any tick; the period moves each later
    // one by 3.7 ms in the tick.
    let waking = (1..6).map(|k| busiest(k * period, k * period + 500 * MS)).collect();
    (waking, busiest(period + 500 * MS, period + SECOND))
}

/// Three classes wake together on an idle link: each is paced at the whole link (its
/// wake rate) until the next tick, behind the link clock. Every wake's busiest 100 ms
/// carries at most two frames more than the busiest steady 100 ms: each class's first
/// packet leaves at once, as a new flow's does. A packet the link holds back restarts its
/// class's clock at its departure, with no burst credit: with the credit, each class sent
/// one more frame as the allocator took over (131.7 KB against 127.2 KB steady).
#[test]
fn classes_that_wake_on_an_idle_link_add_only_their_first_packets() {
    let (waking, steady) = wakes([0, 0, 0]);
    assert!(steady <= 10 * MBIT / 8 / 10 + 2 * FULL_FRAME, "{steady} bytes in a steady 100 ms");
    for w in waking {
        assert!(w <= steady + 2 * FULL_FRAME, "{w} bytes in 100 ms as the classes woke, {steady} steady");
    }
}

/// The same classes wake a few ms apart, as real senders do: one that wakes after the
/// others were allocated the link waits behind the link clock, and they (borrowing) wait
/// behind its packets. When they did not, its first packets went out on top of theirs:
/// up to 136.3 KB in 100 ms against 127.2 KB steady.
#[test]
fn classes_that_wake_one_after_another_keep_to_the_link() {
    for phases in [[0, 2, 5], [0, 4, 8], [3, 0, 6], [0, 12, 24]] {
        let (waking, steady) = wakes(phases);
        for w in waking {
            assert!(
                w <= steady + 3 * FULL_FRAME,
                "{w} bytes in 100 ms as the classes woke at {phases:?} ms, {steady} steady"
            );
        }
    }
}

/// A quiet class that starts a transfer next to a greedy borrower is paced at its share
/// from its first packet: the guest's first 100 ms carry its share of them, not its
/// 0.3 mbit/s guarantee (which queued a TCP sender's first window past the horizon).
#[test]
fn a_class_that_wakes_gets_its_share_from_its_first_packet() {
    let wakes = Source::OnOff { bits: 8 * MBIT, on_ns: SECOND, off_ns: SECOND, phase_ns: 0 };
    let classes = roommates([GREEDY, Source::Idle, Source::Idle, wakes]);
    let run = simulate(10 * MBIT, &classes, 3 * SECOND, TICK, HORIZON);
    // The guest's on phase starts at 2 s (a second on, a second off from 0): the first
    // 50 ms after that.
    let bytes: u64 = run
        .departures
        .iter()
        .filter(|d| d.1 == 3 && (2 * SECOND..2 * SECOND + 50 * MS).contains(&d.0))
        .map(|d| u64::from(d.2))
        .sum();
    assert!(bytes * 8 * 20 >= 7 * MBIT, "{bytes} bytes in the guest's first 50 ms");
}

/// Seed 001: a download (bulk, 200 kbit/s, prio 1) and page fetches (browsing, 700
/// kbit/s, prio 0: 16 KB every 400 ms) on a 900 kbit/s line. Between its pages browsing's
/// allocation is lent to the download, not to browsing itself (limited a moment ago, by
/// its prio first in line, but silent), and while a page leaves the download keeps its
/// guarantee: the page's packets hold it for `shaper_common::HOLD_MAX_NS` at most, by when the next
/// tick has lowered it, not for the whole page (190 ms). The download got 0.51 mbit/s with
/// neither, 0.52 with the first alone; HTB gives it 0.57.
#[test]
fn what_a_class_leaves_unused_between_its_writes_is_lent() {
    let pages = Source::Bursts { burst: 16_384, period_ns: 400 * MS };
    let classes = vec![
        ClassSpec { rate: 200_000, ceil: 900_000, prio: 1, source: GREEDY },
        ClassSpec { rate: 700_000, ceil: 900_000, prio: 0, source: pages },
    ];
    let run = simulate(900_000, &classes, 8 * SECOND, TICK, HORIZON);
    let got = run.rates(2 * SECOND, 8 * SECOND);
    let htb = reference(900_000, &classes, &[u64::MAX, 16_384 * 8 * 10 / 4]);
    assert!(got[1].abs_diff(htb[1]) <= htb[1] / 50, "browsing {:?} (HTB {:?})", mbit(&got), mbit(&htb));
    assert!(got[0] >= htb[0] * 97 / 100, "download {:?} (HTB {:?})", mbit(&got), mbit(&htb));
}

#[test]
fn a_hundred_sparse_flows_cannot_pass_a_ceiling() {
    let classes = vec![
        ClassSpec {
            rate: MBIT,
            ceil: MBIT,
            prio: 0,
            source: Source::SparseFlows { flows: 100, period_ns: 100 * MS, size: 1514 },
        },
        ClassSpec { rate: MBIT, ceil: 10 * MBIT, prio: 1, source: GREEDY },
    ];
    let run = simulate(10 * MBIT, &classes, 5 * SECOND, TICK, HORIZON);
    let window = 100 * MS;
    let capped = run.max_in_window(Some(0), window, 0);
    assert!(capped <= MBIT / 8 / 10 + FULL_FRAME, "{capped} bytes in 100 ms through a 1 mbit/s ceiling");
    let all = run.max_in_window(None, window, 0);
    assert!(all <= 10 * MBIT / 8 / 10 + 2 * FULL_FRAME, "{all} bytes in 100 ms through a 10 mbit/s link");
    let rates = run.rates(SECOND, 5 * SECOND);
    assert!(rates[0] + rates[1] >= 99 * 10 * MBIT / 100, "{:?}", mbit(&rates));
}

fn arb_source() -> impl Strategy<Value = Source> {
    prop_oneof![
        Just(Source::Idle),
        (1u64..20).prop_map(|ms| Source::GreedyTcp { queue_ns: ms * MS }),
        (1u64..60, 1u64..30, 3u64..10).prop_map(|(b, stall, p)| Source::Jittery {
            bits: b * 100_000,
            stall_ns: stall * MS,
            period_ns: p * 100 * MS
        }),
        (1u64..120, prop_oneof![Just(100u32), Just(429), Just(1514)])
            .prop_map(|(b, size)| Source::Udp { bits: b * 100_000, size }),
        (1u64..80, 1u64..10, 1u64..10, 0u64..20).prop_map(|(b, on, off, phase)| Source::OnOff {
            bits: b * 100_000,
            on_ns: on * 100 * MS,
            off_ns: off * 100 * MS,
            phase_ns: phase * MS
        }),
        (1u64..8, 1u64..10).prop_map(|(k, p)| Source::Bursts { burst: k * 16_384, period_ns: p * 50 * MS }),
        (10u32..300, 1u64..10).prop_map(|(n, p)| Source::SparseFlows { flows: n, period_ns: p * 100 * MS, size: 200 }),
    ]
}

/// Up to four classes under a 10 mbit/s link, guarantees within it, random ceilings,
/// prios and sources.
fn arb_classes() -> impl Strategy<Value = Vec<ClassSpec>> {
    prop::collection::vec((1u64..40, 0u64..100, 0u8..3, arb_source()), 1..5).prop_map(|specs| {
        let total: u64 = specs.iter().map(|s| s.0).sum();
        specs
            .into_iter()
            .map(|(share, extra, prio, source)| {
                let rate = 10 * MBIT * share / total.max(40);
                let ceil = (rate + (10 * MBIT - rate) * extra / 100).max(rate);
                ClassSpec { rate, ceil, prio, source }
            })
            .collect()
    })
}

/// What a steady source wants, bits/s; `None` for sources whose demand changes over time.
/// What classes that send `demand` (bits/s; `u64::MAX`: greedy) want of the allocator: the
/// steady ones 2 % more than they send, their headroom, which is not lent (see `demand`); an
/// idle class nothing.
fn with_headroom(demand: &[u64]) -> Vec<u64> {
    demand
        .iter()
        .map(|&d| {
            if d == u64::MAX || d == 0 {
                d
            } else {
                d / 100 * (100 + demand::HEADROOM_PERCENT) + demand::HEADROOM_FLOOR
            }
        })
        .collect()
}

fn steady_demand(source: &Source) -> Option<u64> {
    match *source {
        Source::Idle => Some(0),
        Source::GreedyTcp { .. } => Some(u64::MAX),
        Source::Udp { bits, .. } => Some(bits),
        Source::SparseFlows { flows, period_ns, size } => {
            Some(u64::from(flows) * u64::from(size) * 8 * SECOND / period_ns)
        }
        // A stream that stalls is idle for a moment, then sends at once: as a class that
        // starts sending, it gets its guarantee at once, before the next tick lowers
        // its borrowers (see the README's limits).
        Source::Jittery { .. } | Source::OnOff { .. } | Source::Bursts { .. } => None,
    }
}

proptest! {
    // A fixed seed: the same 48 cases in every run (and in CI), a few seconds in all.
    #![proptest_config(ProptestConfig {
        cases: 48,
        rng_seed: proptest::test_runner::RngSeed::Fixed(0x5_4a9e),
        ..ProptestConfig::default()
    })]

    /// Whatever the traffic, no class exceeds its ceiling in any 100 ms window by more
    /// than two frames. With steady sources (greedy TCP, UDP at any rate and packet size,
    /// sparse flows): every class within 3 % (or 40 kbit/s) of what HTB's rules give it
    /// (with the 2 % headroom of the classes that are not limited, which is not lent),
    /// the link within its rate (plus three frames) in any 100 ms window after the first
    /// 200 ms (in which the classes wake together: the link within its rate plus a tick
    /// at each one's ceil), and full whenever the classes want it (but for the headroom
    /// of the classes that are not limited).
    #[test]
    fn ceilings_hold_and_steady_traffic_gets_htb_shares(classes in arb_classes()) {
        let link = 10 * MBIT;
        let run = simulate(link, &classes, 6 * SECOND, TICK, HORIZON);
        let window = 100 * MS;
        for (c, spec) in classes.iter().enumerate() {
            let most = run.max_in_window(Some(c), window, 0);
            prop_assert!(most <= spec.ceil / 8 / 10 + 2 * FULL_FRAME, "class {} sent {} bytes in 100 ms, ceil {}", c, most, spec.ceil);
        }
        let demand: Option<Vec<u64>> = classes.iter().map(|c| steady_demand(&c.source)).collect();
        if let Some(demand) = demand {
            let all = run.max_in_window(None, window, 200 * MS);
            prop_assert!(all <= link / 8 / 10 + 3 * FULL_FRAME, "link: {} bytes in 100 ms", all);
            let waking: u64 = classes.iter().map(|c| c.ceil * TICK / SECOND / 8).sum();
            let first = run.max_in_window(None, window, 0);
            prop_assert!(first <= link / 8 / 10 + waking + 3 * FULL_FRAME, "link: {} bytes in the first 100 ms", first);
            // HTB's shares when the steady classes want 2 % more than they send: their
            // headroom, which is not lent (see `demand`).
            let mut expected = reference(link, &classes, &with_headroom(&demand));
            for (e, &d) in expected.iter_mut().zip(&demand) {
                *e = (*e).min(d);
            }
            let got = run.rates(3 * SECOND, 6 * SECOND);
            for (c, (&g, &e)) in got.iter().zip(&expected).enumerate() {
                prop_assert!(g.abs_diff(e) <= (e * 3 / 100).max(40_000), "class {}: {:?} vs HTB {:?}", c, mbit(&got), mbit(&expected));
            }
            // No oscillation: from one tick to the next, each class's pacing rate moves by
            // less than 2 % (the median over the last 3 s) and less than 5 % in nine
            // ticks out of ten.
            for c in 0..classes.len() {
                let (median, p90, _) = run.pacing_changes(c, 300, 600);
                prop_assert!(median < 20 && p90 < 50, "class {}: pacing moves {} per mille (median), {} (p90)", c, median, p90);
            }
            let total: u64 = got.iter().sum();
            let wanted: u64 = expected.iter().sum();
            // The headroom of the classes that are not limited (2 %) is not lent.
            prop_assert!(total * 1000 >= wanted * 985, "link use {:?} vs HTB {:?}", mbit(&got), mbit(&expected));
        }
    }
}

/// A two-level tree under a 10 mbit/s link: house (rate 4, prio 1) with alex (2, prio 1) and
/// betty (2, prio 0), office (3, prio 0); every ceil the link, 3 mbit/s unallocated.
fn house_and_office(alex: Source, betty: Source, office: Source) -> (Vec<Option<usize>>, Vec<ClassSpec>) {
    let c = |rate, prio, source| ClassSpec { rate, ceil: 10 * MBIT, prio, source };
    (
        vec![None, Some(0), Some(0), None],
        vec![c(4 * MBIT, 1, Source::Idle), c(2 * MBIT, 1, alex), c(2 * MBIT, 0, betty), c(3 * MBIT, 0, office)],
    )
}

/// Nested classes with greedy and steady senders get what shaper's rule for nested trees
/// gives them (`htb::sibling_shares`): HTB's shares where the leaves' own prios and quanta do
/// not change the order, and the one named difference where they do (first row).
#[test]
fn nested_classes_share_by_their_rule() {
    let udp = |bits| Source::Udp { bits, size: 1514 };
    let rows = [
        // Everyone greedy. The link's spare goes to the office (prio 0) ahead of the house
        // (prio 1): 2 / 2 / 6. HTB has betty borrow it with her own prio 0, beside the
        // office, by their quanta: 2 / 3.2 / 4.8.
        ([GREEDY, GREEDY, GREEDY], [u64::MAX, u64::MAX, u64::MAX], true),
        // Betty streams 1 mbit/s: alex takes the house's spare, the office the link's.
        ([GREEDY, udp(MBIT), GREEDY], [u64::MAX, MBIT, u64::MAX], false),
        // The office idle: the house takes the link, betty (prio 0) first.
        ([GREEDY, GREEDY, Source::Idle], [u64::MAX, u64::MAX, 0], false),
        // Betty idle: alex takes the house's spare, the office the link's.
        ([GREEDY, Source::Idle, GREEDY], [u64::MAX, 0, u64::MAX], false),
        // The office streams 4 mbit/s, 1 over its guarantee: that first, the rest to betty.
        ([GREEDY, GREEDY, udp(4 * MBIT)], [u64::MAX, u64::MAX, 4 * MBIT], false),
    ];
    for (sources, demand, differs) in rows {
        let [a, b, o] = sources;
        let (parents, classes) = house_and_office(a, b, o);
        let run = shaper::model::simulate_tree(10 * MBIT, &parents, &classes, 6 * SECOND, 10 * MS, 200 * MS);
        let got = run.rates(3 * SECOND, 6 * SECOND);
        let want = [0, demand[0], demand[1], demand[2]];
        let (htb, rule) = shaper_tests::htb::model_tree_shares(10 * MBIT, &parents, &classes, &with_headroom(&want));
        println!("shaper {:?}, its rule {:?}, HTB {:?}", mbit(&got), mbit(&rule), mbit(&htb));
        let apart = (1..4).any(|l| htb[l].abs_diff(rule[l]) > rule[l] * 3 / 100);
        assert_eq!(apart, differs, "the rule and HTB: {:?} and {:?}", mbit(&rule), mbit(&htb));
        for leaf in 1..4 {
            let e = rule[leaf].min(want[leaf]);
            assert!(
                got[leaf].abs_diff(e) <= (e * 3 / 100).max(40_000),
                "class {leaf}: {:?} against the rule's {:?} (HTB {:?})",
                mbit(&got),
                mbit(&rule),
                mbit(&htb)
            );
        }
        let total: u64 = got[1..].iter().sum();
        assert!(total * 100 >= 98 * 10 * MBIT, "link use {:?}", mbit(&got));
    }
}
