//! `cargo xtask bench`: the datapath's cost per packet, measured with `BPF_PROG_TEST_RUN`
//! (many repeats per run, the kernel's own timing), for 10 and 10,000 rules, next to a tc
//! program that does nothing, measured in the same run. Prints figures and ratios; asserts
//! nothing (the tests do that).
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "figures for reports and tolerances"
)]

use std::net::Ipv4Addr;

use ipnet::IpNet;
use shaper::{bpf::Datapath, rules::RuleSpec};
use shaper_common::{ClassConfig, ISOLATE_HOST};
use shaper_tests::{ipv4, loopback_datapath, require_root, run, Frame, SkbCtx, L4};

/// Runs per measurement, and measurements per figure (the median is reported).
const REPEAT: u32 = 200_000;
const SAMPLES: usize = 7;

fn host_rules(n: u32) -> Vec<RuleSpec> {
    (0..n)
        .map(|i| RuleSpec {
            src: Some(IpNet::from(std::net::IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i)))),
            ..RuleSpec::new(i, i % 16)
        })
        .collect()
}

/// A household/office mix: hosts, a subnet, ports, DSCP and a mark, six tuple shapes.
fn mixed_rules() -> Vec<RuleSpec> {
    let base = RuleSpec::new(0, 1);
    let mut rules = vec![
        RuleSpec { dscp: Some(46), class: 2, ..base.clone() },
        RuleSpec { proto: Some(17), dport: Some((53, 53)), class: 3, ..base.clone() },
        RuleSpec { mark: Some(0x10), class: 4, ..base.clone() },
        RuleSpec { proto: Some(6), dport: Some((3072, 4095)), class: 5, ..base.clone() },
        RuleSpec { dst: Some("192.0.2.0/24".parse().unwrap()), class: 6, ..base.clone() },
    ];
    rules.extend(host_rules(5).into_iter().map(|r| RuleSpec { class: 7, ..r }));
    for (i, r) in rules.iter_mut().enumerate() {
        r.index = u32::try_from(i).unwrap();
    }
    rules
}

fn datapath(rules: &[RuleSpec]) -> Datapath {
    datapath_with(rules, ClassConfig::default())
}

/// Every class paced, and set up as `extra` has it otherwise.
fn datapath_with(rules: &[RuleSpec], extra: ClassConfig) -> Datapath {
    let mut dp = loopback_datapath(rules, 20);
    for class in 0..=20 {
        // Fast enough that the class clock never runs into the horizon during the runs.
        dp.set_class(class, ClassConfig { rate_bytes: 1_000_000_000_000, horizon_ns: 10_000_000_000, ..extra })
            .unwrap();
    }
    dp
}

/// Isolation by host, with a share that no host's clock outruns during the runs: the host
/// lookup and its clock on every packet.
fn isolated() -> ClassConfig {
    ClassConfig {
        isolation: ISOLATE_HOST,
        share_bytes: 100_000_000_000,
        share_horizon_ns: 5_000_000_000,
        share_slack_ns: 1_000_000_000,
        share_near_ns: 1_000,
        ..ClassConfig::default()
    }
}

/// Median ns per packet over SAMPLES runs of REPEAT.
fn ns_per_packet(mut one_run: impl FnMut() -> std::time::Duration) -> f64 {
    let mut samples: Vec<f64> = (0..SAMPLES).map(|_| one_run().as_secs_f64() * 1e9).collect();
    samples.sort_by(f64::total_cmp);
    samples[SAMPLES / 2]
}

fn main() {
    require_root();
    let packet = |src: u32| {
        ipv4(
            &Frame { payload: 1000, ..Frame::default() },
            Ipv4Addr::from(src),
            Ipv4Addr::new(198, 51, 100, 1),
            L4::Tcp { sport: 40000, dport: 443 },
        )
    };
    let ctx = SkbCtx::default();

    let mut baseline_dp = datapath(&[]);
    let pass = baseline_dp.pass_program().expect("loading the baseline program");
    let baseline = ns_per_packet(|| {
        use aya::programs::{TestRun, TestRunOptions};
        let p = packet(0x0a00_0001);
        let opts = TestRunOptions { data_in: Some(&p), repeat: REPEAT, ..TestRunOptions::default() };
        pass.test_run(opts).expect("BPF_PROG_TEST_RUN").duration
    });

    let mut rows: Vec<(String, f64)> = Vec::new();
    for (name, rules, last_src) in [
        ("10 host rules", host_rules(10), 0x0a00_0000 + 9),
        ("10,000 host rules", host_rules(10_000), 0x0a00_0000 + 9_999),
        ("10 mixed rules (6 shapes)", mixed_rules(), 0x0a00_0004),
    ] {
        let dp = datapath(&rules);
        let matched = packet(last_src);
        let unmatched = packet(0xc0a8_0001);
        rows.push((format!("{name}, last rule matches"), ns_per_packet(|| run(&dp, &matched, ctx, REPEAT).duration)));
        rows.push((format!("{name}, no rule matches"), ns_per_packet(|| run(&dp, &unmatched, ctx, REPEAT).duration)));
    }

    let dp = datapath_with(&host_rules(10), isolated());
    let matched = packet(0x0a00_0000 + 9);
    rows.push((
        "10 host rules, isolation by host".to_owned(),
        ns_per_packet(|| run(&dp, &matched, ctx, REPEAT).duration),
    ));

    println!("datapath cost per packet (BPF_PROG_TEST_RUN, {REPEAT} repeats, median of {SAMPLES}; 1066-byte TCP/IPv4 packet)");
    println!("{:<44} {:>10} {:>14} {:>14}", "program", "ns/packet", "x empty prog", "extra ns");
    println!("{:<44} {:>10.1} {:>14.2} {:>14.1}", "empty tc program (baseline)", baseline, 1.0, 0.0);
    for (name, ns) in &rows {
        println!("{:<44} {:>10.1} {:>14.2} {:>14.1}", name, ns, ns / baseline, ns - baseline);
    }
    let ten = rows[0].1;
    let ten_k = rows[2].1;
    println!("10,000 vs 10 host rules (last rule matches): {:.2}x", ten_k / ten);
    println!();
    print_tuning();
}

/// The control loop's tick and headroom, swept on the model (`shaper::tuning`); the row of
/// the defaults is the baseline.
fn print_tuning() {
    use shaper::{allocation::demand::HEADROOM_PERCENT, model::MS, tuning};
    let rows = tuning::sweep(&[5 * MS, 10 * MS, 20 * MS, 50 * MS], &[1, 2, 4, 8]);
    let base = rows
        .iter()
        .find(|t| t.tick_ns == 10 * MS && t.headroom_percent == HEADROOM_PERCENT)
        .expect("the defaults are in the sweep")
        .clone();
    println!("control loop tuning on the model (seed 000's classes, 10 mbit/s; see shaper::tuning)");
    println!(
        "{:>5} {:>9} {:>9} {:>11} {:>8} {:>14} {:>14} {:>10}",
        "tick", "headroom", "link use", "share err", "on/off", "pacing p90", "wake overshoot", "x default"
    );
    for t in &rows {
        let mark = if *t == base { "  (default)" } else { "" };
        println!(
            "{:>3}ms {:>8}% {:>8.2}% {:>10.2}% {:>7.1}% {:>13}‰ {:>12} B {:>10.2}{mark}",
            t.tick_ns / MS,
            t.headroom_percent,
            t.link_use,
            t.share_error,
            t.on_off,
            t.pacing_change,
            t.wake_overshoot,
            t.wake_overshoot as f64 / base.wake_overshoot.max(1) as f64,
        );
    }
}
