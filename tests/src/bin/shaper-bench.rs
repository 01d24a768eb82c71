//! `cargo xtask bench`: what shaper costs, each figure next to a baseline measured in the same
//! run, as one table with ratios (see `shaper_tests::bench`), written to `target/bench/` as
//! JSON and a PNG chart.
//!
//! - The datapath on a packet mix of many flows, more than its flows' table holds: each
//!   `BPF_PROG_TEST_RUN` runs one packet of the mix (the kernel times the run), next to a tc
//!   program that does nothing, run on the same packets. Also on one packet repeated, the
//!   figure earlier versions printed.
//! - The kernel memory of the datapath's maps with 10,000 and 100,000 host rules, next to
//!   the same with 10.
//! - The control loop's tick (demand estimators and the allocator) at 10,000 classes, next to
//!   the same at 100 classes (scaling), and against the 1 ms it may take.
//! - The control loop's tick length and headroom on the model.
//!
//! `--short` runs fewer packets and ticks and skips the model sweep; `--check` exits non-zero
//! if a ratio regresses past its bound (CI runs both). `--tick` runs the control loop's tick
//! alone.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "figures for reports and tolerances"
)]

use std::net::Ipv4Addr;

use aya::programs::{TestRun, TestRunOptions};
use clap::Parser;
use ipnet::IpNet;
use shaper::{bpf::Datapath, rules::RuleSpec};
use shaper_common::{ClassConfig, ClassStats, FLOW_SLOTS, ISOLATE_HOST};
use shaper_tests::{
    bench::{median, Report, Row},
    ipv4, loopback_datapath, require_root, run, Frame, SkbCtx, L4,
};

#[derive(Parser, Debug)]
struct Args {
    /// Fewer packets and ticks, no model sweep (CI).
    #[arg(long)]
    short: bool,
    /// Exit with status 1 if a ratio regresses past its bound.
    #[arg(long)]
    check: bool,
    /// Only the control loop's tick (no BPF, no root; nothing written): for work on the
    /// estimators and the allocator.
    #[arg(long)]
    tick: bool,
    /// Where the JSON and PNG go.
    #[arg(long, default_value = "target/bench")]
    out: std::path::PathBuf,
}

/// Classes the rules point to (0 is the default class).
const CLASSES: u32 = 20;

fn host_rules(n: u32) -> Vec<RuleSpec> {
    (0..n)
        .map(|i| RuleSpec {
            src: Some(IpNet::from(std::net::IpAddr::V4(Ipv4Addr::from(HOSTS_BASE + i)))),
            ..RuleSpec::new(i, 1 + i % 16)
        })
        .collect()
}

/// A household/office mix: DSCP, ports, a mark, a subnet and hosts, six tuple shapes.
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

const HOSTS_BASE: u32 = 0x0a00_0000;

/// Every class paced, and set up as `extra` has it otherwise.
fn datapath_with(rules: &[RuleSpec], extra: ClassConfig) -> Datapath {
    let mut dp = loopback_datapath(rules, 0);
    for class in 0..=CLASSES {
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

/// A small, fast, deterministic generator (xorshift64*).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// How the packets of the mix are spread over its flows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Spread {
    /// Flow sizes as measured on real links: the k-th largest flow sends in proportion to
    /// 1/k (Zipf, s = 1), so a few flows carry most packets and most flows a few.
    Zipf,
    /// Every flow equally likely: no flow sends twice in a row more than chance has it (the
    /// caches' worst case).
    Uniform,
}

/// One flow of the mix: its packet and skb mark.
struct FlowSpec {
    packet: Vec<u8>,
    mark: u32,
}

/// Flows in the mix: twice the slots of the flows' table (`FLOWS`).
const MIX_FLOWS: u32 = 2 * FLOW_SLOTS;

/// Flow `i` of the mix: a source among `hosts` hosts, TCP to a web server mostly, some DNS,
/// calls, a port range, a subnet, DSCP 46 and a mark, each flow with a source port of its own.
/// The largest flows carry full frames, the others small packets.
fn flow(i: u32, hosts: u32) -> FlowSpec {
    let mut h = Rng(u64::from(i).wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let pick = h.next();
    let src = Ipv4Addr::from(HOSTS_BASE + (pick % u64::from(hosts)) as u32);
    let dst = if (pick >> 20).is_multiple_of(8) { Ipv4Addr::new(192, 0, 2, 7) } else { Ipv4Addr::new(198, 51, 100, 1) };
    let sport = 1024 + (i % 60_000) as u16;
    let l4 = match (pick >> 24) % 10 {
        0 => L4::Udp { sport, dport: 53 },
        1 => L4::Udp { sport, dport: 3478 },
        2 => L4::Tcp { sport, dport: 3072 + (pick >> 32) as u16 % 1024 },
        _ => L4::Tcp { sport, dport: 443 },
    };
    let tos = if (pick >> 40).is_multiple_of(16) { 46 << 2 } else { 0 };
    let payload = if i < 1000 { 1400 } else { 100 };
    let mark = if (pick >> 44).is_multiple_of(16) { 0x10 } else { 0 };
    FlowSpec { packet: ipv4(&Frame { tos, payload, ..Frame::default() }, src, dst, l4), mark }
}

/// The order in which a mix's packets come: flow indexes, `len` of them.
fn sequence(spread: Spread, len: usize, seed: u64) -> Vec<u32> {
    let mut rng = Rng(seed);
    match spread {
        Spread::Uniform => (0..len).map(|_| (rng.next() % u64::from(MIX_FLOWS)) as u32).collect(),
        Spread::Zipf => {
            // Inverse of the cumulative distribution, by binary search.
            let mut cdf = Vec::with_capacity(MIX_FLOWS as usize);
            let mut sum = 0.0;
            for k in 1..=MIX_FLOWS {
                sum += 1.0 / f64::from(k);
                cdf.push(sum);
            }
            (0..len)
                .map(|_| {
                    let u = rng.unit() * sum;
                    cdf.partition_point(|&c| c < u).min(MIX_FLOWS as usize - 1) as u32
                })
                .collect()
        }
    }
}

/// A packet mix: its flows and the order of their packets.
struct Mix {
    flows: Vec<FlowSpec>,
    order: Vec<u32>,
}

impl Mix {
    fn new(hosts: u32, spread: Spread, packets: usize) -> Self {
        Self { flows: (0..MIX_FLOWS).map(|i| flow(i, hosts)).collect(), order: sequence(spread, packets, 7) }
    }

    /// The same mix, its packets folded onto its first `flows` flows: few enough that their
    /// lines of the datapath's tables stay in the CPU's caches from one of their packets to
    /// the next.
    /// Only those flows are built.
    fn folded(hosts: u32, spread: Spread, packets: usize, flows: u32) -> Self {
        Self {
            flows: (0..flows).map(|i| flow(i, hosts)).collect(),
            order: sequence(spread, packets, 7).into_iter().map(|f| f % flows).collect(),
        }
    }
}

/// Mean ns per packet of `program` over the mix's packets, each in a run of its own, and
/// the datapath's flow-cache misses among them (if `dp` is the datapath's).
fn run_mix(program: &aya::programs::SchedClassifier, mix: &Mix) -> f64 {
    let mut total = 0u128;
    let mut ctx = [0u8; 192];
    for &f in &mix.order {
        let flow = &mix.flows[f as usize];
        ctx[8..12].copy_from_slice(&flow.mark.to_ne_bytes());
        ctx[40..44].copy_from_slice(&shaper_tests::LO.to_ne_bytes());
        let opts =
            TestRunOptions { data_in: Some(&flow.packet), ctx_in: Some(&ctx), repeat: 1, ..TestRunOptions::default() };
        total += program.test_run(opts).expect("BPF_PROG_TEST_RUN").duration.as_nanos();
    }
    total as f64 / mix.order.len() as f64
}

/// The sum of all classes' counters.
fn all_stats(dp: &Datapath) -> ClassStats {
    (0..=CLASSES).map(|c| dp.class_stats(c).unwrap()).fold(ClassStats::default(), |a, s| a.merge(&s))
}

/// One row of the mix's measurement: a datapath and its mix.
struct MixRow<'a> {
    name: &'static str,
    dp: Datapath,
    mix: &'a Mix,
    /// The goal and the CI bound (see `shaper_tests::bench::Row`).
    goal: Option<(f64, f64)>,
    /// Said after its misses.
    note: &'static str,
    samples: Vec<f64>,
    before: shaper_common::ClassStats,
}

fn datapath_mix(report: &mut Report, short: bool) {
    let packets = if short { 50_000 } else { 200_000 };
    let passes = if short { 5 } else { 9 };
    let section = "datapath, many-flow mix";
    let ten_thousand_hosts = Mix::new(10_000, Spread::Zipf, packets);
    let hundred_thousand_hosts = Mix::new(100_000, Spread::Zipf, packets);
    let thousand_hosts = Mix::new(1_000, Spread::Zipf, packets);
    let thousand_hosts_uniform = Mix::new(1_000, Spread::Uniform, packets);
    let warm_flows = Mix::folded(10_000, Spread::Zipf, packets, 500);
    let row = |name, dp, mix, goal| MixRow {
        name,
        dp,
        mix,
        goal,
        note: "",
        samples: Vec::new(),
        before: ClassStats::default(),
    };
    let plain = ClassConfig::default();
    let mut rows = vec![
        row("10,000 host rules", datapath_with(&host_rules(10_000), plain), &ten_thousand_hosts, Some((4.0, 7.0))),
        // What the program costs when its data is warm: the difference from the row above is
        // what the many flows' memory costs.
        MixRow {
            note: "; the lines of its 500 flows stay warm",
            ..row(
                "10,000 host rules, the mix on 500 flows",
                datapath_with(&host_rules(10_000), plain),
                &warm_flows,
                None,
            )
        },
        row("10 mixed rules (6 shapes)", datapath_with(&mixed_rules(), plain), &thousand_hosts, None),
        row(
            "10 mixed rules, isolation by host",
            datapath_with(&mixed_rules(), isolated()),
            &thousand_hosts,
            Some((5.0, 8.0)),
        ),
        row(
            "10 mixed rules, isolation, flows uniform",
            datapath_with(&mixed_rules(), isolated()),
            &thousand_hosts_uniform,
            None,
        ),
    ];
    let mut empty = datapath_with(&[], plain);
    let pass = empty.pass_program().expect("loading the baseline program");
    let base = measure(&mut rows, pass, &ten_thousand_hosts, passes);
    report.baseline(section, "empty tc program, one packet per run", base, "ns/packet");
    push_rows(report, section, rows, base, "");
    // 100,000 host rules in passes of their own, each next to the empty program (its own
    // baseline): its tables are the largest, and would leave the rows run after it colder.
    let mut big =
        vec![row("100,000 host rules", datapath_with(&host_rules(100_000), plain), &hundred_thousand_hosts, None)];
    let own_base = measure(&mut big, pass, &hundred_thousand_hosts, passes);
    push_rows(report, section, big, own_base, &format!("; empty program {own_base:.1} ns in its passes"));
}

/// Runs a pass of the mix that warms the maps up, then `passes` measured ones, each running
/// the empty program `pass` on `baseline_mix` and every row in turn, so that whatever else
/// the machine does is spread over all. Returns the baseline's median ns per packet; the
/// rows keep their samples.
fn measure(rows: &mut [MixRow], pass: &aya::programs::SchedClassifier, baseline_mix: &Mix, passes: usize) -> f64 {
    for r in rows.iter_mut() {
        run_mix(r.dp.program(), r.mix);
        r.before = all_stats(&r.dp);
    }
    let mut baseline = Vec::new();
    for _ in 0..passes {
        baseline.push(run_mix(pass, baseline_mix));
        for r in rows.iter_mut() {
            let ns = run_mix(r.dp.program(), r.mix);
            r.samples.push(ns);
        }
    }
    median(&mut baseline)
}

/// Reports each row's median against `base`, with its flow-cache misses (and `note` after
/// them), its goal and its bound.
fn push_rows(report: &mut Report, section: &str, rows: Vec<MixRow>, base: f64, note: &str) {
    for mut r in rows {
        let misses = misses_note(misses_since(&r.dp, &r.before));
        let row = Row::ratio(section, r.name, median(&mut r.samples), base, "ns/packet")
            .note(format!("{misses}{}{note}", r.note));
        report.push(match r.goal {
            Some((goal, bound)) => row.goal(goal).bound(bound),
            None => row,
        });
    }
}

/// The share of the packets `dp` ran since its counters were `before` that missed its flow
/// cache.
fn misses_since(dp: &Datapath, before: &ClassStats) -> f64 {
    let after = all_stats(dp);
    let packets = (after.packets - before.packets).max(1);
    (after.flow_misses - before.flow_misses) as f64 / packets as f64
}

/// Bytes of kernel memory charged to this process's BPF maps: the `memlock` of each map fd
/// in `/proc/self/fdinfo` (what the kernel reports as the map's memory usage).
fn maps_memory() -> u64 {
    let Ok(fds) = std::fs::read_dir("/proc/self/fdinfo") else { return 0 };
    fds.filter_map(|e| std::fs::read_to_string(e.ok()?.path()).ok())
        .filter(|info| info.contains("map_type:"))
        .filter_map(|info| info.lines().find_map(|l| l.strip_prefix("memlock:")?.trim().parse::<u64>().ok()))
        .sum()
}

/// The kernel memory of a datapath's maps with 10,000 and 100,000 host rules, against the
/// same with 10 rules, loaded one at a time (the difference in `maps_memory` that loading
/// each makes).
fn datapath_memory(report: &mut Report) {
    let section = "kernel memory of the datapath's maps";
    let mib = |bytes: u64| bytes as f64 / f64::from(1u32 << 20);
    let loaded = |rules: u32| {
        let before = maps_memory();
        let dp = datapath_with(&host_rules(rules), ClassConfig::default());
        let bytes = maps_memory() - before;
        drop(dp);
        bytes
    };
    let base = mib(loaded(10));
    report.baseline(section, "10 host rules", base, "MiB");
    for (name, rules) in [("10,000 host rules", 10_000), ("100,000 host rules", 100_000)] {
        report.push(Row::ratio(section, name, mib(loaded(rules)), base, "MiB"));
    }
}

fn misses_note(share: f64) -> String {
    format!("class cache missed {:.1} % of packets", share * 100.0)
}

/// The figures earlier versions printed: one packet repeated (every lookup hits a warm
/// cache), many runs per `BPF_PROG_TEST_RUN`.
fn datapath_repeated(report: &mut Report, short: bool) {
    let repeat = if short { 50_000 } else { 200_000 };
    let samples = if short { 3 } else { 7 };
    let median_of_runs =
        |mut one_run: Box<dyn FnMut() -> f64 + '_>| median(&mut (0..samples).map(|_| one_run()).collect::<Vec<_>>());
    let section = "datapath, one packet repeated";
    let packet = |src: u32| {
        ipv4(
            &Frame { payload: 1000, ..Frame::default() },
            Ipv4Addr::from(src),
            Ipv4Addr::new(198, 51, 100, 1),
            L4::Tcp { sport: 40000, dport: 443 },
        )
    };
    let mut empty = datapath_with(&[], ClassConfig::default());
    let pass = empty.pass_program().expect("loading the baseline program");
    let p = packet(HOSTS_BASE + 1);
    let baseline = median_of_runs(Box::new(|| {
        let opts = TestRunOptions { data_in: Some(&p), repeat, ..TestRunOptions::default() };
        pass.test_run(opts).expect("BPF_PROG_TEST_RUN").duration.as_secs_f64() * 1e9
    }));
    report.baseline(section, "empty tc program", baseline, "ns/packet");
    let ctx = SkbCtx::default();
    for (name, rules, src, extra) in [
        ("10,000 host rules", host_rules(10_000), HOSTS_BASE + 9_999, ClassConfig::default()),
        ("10 mixed rules, no rule matches", mixed_rules(), 0xc0a8_0001, ClassConfig::default()),
        ("10 host rules, isolation by host", host_rules(10), HOSTS_BASE + 9, isolated()),
    ] {
        let dp = datapath_with(&rules, extra);
        let p = packet(src);
        let ns = median_of_runs(Box::new(|| run(&dp, &p, ctx, repeat).duration.as_secs_f64() * 1e9));
        report.push(Row::ratio(section, name, ns, baseline, "ns/packet"));
    }
}

fn main() {
    let args = Args::parse();
    let mut report = Report::default();
    if args.tick {
        shaper_tests::bench::control_loop(&mut report, args.short);
        report.print();
        return;
    }
    require_root();
    datapath_mix(&mut report, args.short);
    datapath_repeated(&mut report, args.short);
    datapath_memory(&mut report);
    shaper_tests::bench::control_loop(&mut report, args.short);
    report.print();
    if let Err(e) = report.write(&args.out) {
        eprintln!("shaper-bench: writing {}: {e:#}", args.out.display());
        std::process::exit(2);
    }
    if !args.short {
        println!();
        print_tuning();
        println!();
        print_mixes();
    }
    let regressed = report.regressions();
    if args.check && !regressed.is_empty() {
        eprintln!("shaper-bench: {} ratio(s) past their bound: {}", regressed.len(), regressed.join("; "));
        std::process::exit(1);
    }
}

/// What the link carries in random mixes of a greedy class with streams, application-limited
/// writes, small-packet floods and on/off senders, on the model (`shaper_tests::mixes`).
fn print_mixes() {
    let mixes = shaper_tests::mixes::scan(200, 7);
    let below = mixes.iter().filter(|m| m.link_use < 98.0).count();
    let over = mixes.iter().filter(|m| m.link_use > 101.0).count();
    let off = mixes.iter().filter(|m| m.share_error > 3.0).count();
    let worst = mixes.iter().min_by(|a, b| a.link_use.total_cmp(&b.link_use)).expect("mixes");
    let mut uses: Vec<f64> = mixes.iter().map(|m| m.link_use).collect();
    uses.sort_by(f64::total_cmp);
    println!(
        "work conservation on the model: {} random mixes, each with a greedy class (see shaper_tests::mixes)",
        mixes.len()
    );
    println!(
        "  link use: median {:.1} %, p10 {:.1} %, lowest {:.1} %; {below} mixes below 98 %, {over} over 101 %; {off} with a share more than 3 % of the link from HTB's",
        uses[uses.len() / 2],
        uses[uses.len() / 10],
        worst.link_use
    );
    println!("  the lowest: {:?}", worst.classes);
}

/// The control loop's tick and headroom, swept on the model (`shaper::tuning`); the row of
/// the defaults is the baseline.
fn print_tuning() {
    use shaper::{allocation::demand::HEADROOM_PERCENT, model::MS};
    use shaper_tests::tuning;
    let rows = tuning::sweep(&[5 * MS, 10 * MS, 20 * MS, 50 * MS], &[1, 2, 4, 8]);
    let base = rows
        .iter()
        .find(|t| t.tick_ns == 10 * MS && t.headroom_percent == HEADROOM_PERCENT)
        .expect("the defaults are in the sweep")
        .clone();
    println!("control loop tuning on the model (seed 000's classes, 10 mbit/s; see shaper_tests::tuning)");
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
