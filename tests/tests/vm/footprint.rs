//! A benchmark, not a test (`#[ignore]`: `cargo xtask bench --forwarding` runs it in the VM):
//! shaperd's resident memory and its CPU time while no packet flows, with a few classes and
//! rules, and with [`MANY_CLASSES`] classes and [`MANY_RULES`] host rules. Each is started in
//! turn on the gateway's WAN interface and measured over [`IDLE_SECONDS`] once it answers
//! (the control loop ticks all the while), then its ticks over [`TICK_SECONDS`] (their mean
//! time and how many ran a second, from its metrics: at 100 a second they keep up). Under
//! QEMU's emulation CPU time is far above a real machine's: the ratio to the small
//! configuration is the figure that means something.

use std::{fmt::Write as _, thread::sleep, time::Duration};

use serde_json::json;
use shaper_tests::gateway::require_fq;

use super::{proc_stat_field, proc_status_kb, sample, scrape, topology};

/// The large configuration's classes (a small ISP's subscribers, one class each).
const MANY_CLASSES: usize = 10_000;
/// The large configuration's rules, one host each (`10.128.0.0` and on), spread over its
/// classes.
const MANY_RULES: usize = 100_000;
const IDLE_SECONDS: u64 = 10;
/// How long the ticks are counted for, after that.
const TICK_SECONDS: u64 = 5;

/// A configuration of `classes` leaf classes (the first the default) and `rules` host rules.
fn config(classes: usize, rules: usize) -> String {
    let mut text = String::from("[[interface]]\nname = \"wan0\"\nrate = \"1gbit\"\ndefault = \"c0\"\n\n");
    for c in 0..classes {
        write!(text, "[[class]]\nname = \"c{c}\"\nrate = \"100kbit\"\nceil = \"1gbit\"\n\n").expect("into a String");
    }
    for r in 0..rules {
        let host = std::net::Ipv4Addr::from(0x0a80_0000 + u32::try_from(r).expect("rules fit in u32"));
        write!(text, "[[rule]]\nclass = \"c{}\"\nsrc = \"{host}\"\n\n", r % classes).expect("into a String");
    }
    text
}

/// User and system CPU time of process `pid` so far, in clock ticks (fields 14 and 15 of
/// `/proc/<pid>/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::path::PathBuf::from(format!("/proc/{pid}/stat"));
    proc_stat_field::<u64>(&stat, 14) + proc_stat_field::<u64>(&stat, 15)
}

/// The sum (s) and count of shaperd's allocator ticks so far, from its `/metrics` (read in
/// the gateway's namespace).
fn ticks_so_far(topo: &shaper_tests::gateway::Topology) -> (f64, f64) {
    let body = scrape(topo);
    let value = |series: &str| sample(&body, series).unwrap_or_else(|| panic!("no {series} in {body}"));
    (value("shaper_allocator_tick_duration_seconds_sum"), value("shaper_allocator_tick_duration_seconds_count"))
}

/// A `kB` field of `/proc/<pid>/status` (`VmRSS:`, `VmHWM:`), in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    proc_status_kb(pid, field) as f64 / 1024.0
}

#[test]
#[ignore = "a benchmark: cargo xtask bench --forwarding runs it in the VM"]
fn shaperd_memory_and_idle_cpu_with_many_classes_and_rules() {
    require_fq();
    let topo = topology("shaper-vm-footprint", &["10.1.0.11"]);
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let setups = [("4 classes, 10 rules", 4, 10), ("many", MANY_CLASSES, MANY_RULES)];
    let mut figures = Vec::new();
    for (name, classes, rules) in setups {
        let daemon = topo.shaperd(&config(classes, rules));
        let classes_up = topo.status_now().as_array().map_or(0, Vec::len);
        assert_eq!(classes_up, classes, "{name}: classes shaperd reports");
        sleep(Duration::from_secs(1));
        let before = cpu_ticks(daemon.pid());
        sleep(Duration::from_secs(IDLE_SECONDS));
        let busy = (cpu_ticks(daemon.pid()) - before) as f64 / hz as f64 / IDLE_SECONDS as f64;
        let (rss, peak) = (status_mib(daemon.pid(), "VmRSS:"), status_mib(daemon.pid(), "VmHWM:"));
        // Then the ticks, from its metrics: a scrape of every class's metrics takes memory
        // (kept by the allocator) and CPU time, so it comes after the figures above.
        let (sum, count) = ticks_so_far(&topo);
        sleep(Duration::from_secs(TICK_SECONDS));
        let (sum_after, count_after) = ticks_so_far(&topo);
        let ticks = count_after - count;
        let tick_ms = (sum_after - sum) / ticks.max(1.0) * 1e3;
        figures.push((format!("{classes} classes, {rules} rules"), busy * 100.0, rss, peak, tick_ms, ticks));
        drop(daemon);
    }
    println!("shaperd with no traffic, {IDLE_SECONDS} s after it answered (QEMU TCG, 2 vCPUs; ratios only)");
    println!(
        "{:<32} {:>14} {:>10} {:>10} {:>10} {:>10}",
        "", "CPU % of one", "RSS MiB", "peak MiB", "tick ms", "ticks/s"
    );
    for (name, cpu, rss, peak, tick_ms, ticks) in &figures {
        let per_second = ticks / TICK_SECONDS as f64;
        println!("{name:<32} {cpu:>14.2} {rss:>10.1} {peak:>10.1} {tick_ms:>10.2} {per_second:>10.1}");
    }
    let (small, many) = (&figures[0], &figures[1]);
    println!("{} against {}: {:.2}x CPU, {:.2}x RSS", many.0, small.0, many.1 / small.1.max(0.01), many.2 / small.2);
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/vm/test-run/footprint.json");
    let report: Vec<_> = figures
        .iter()
        .map(|(name, cpu, rss, peak, tick_ms, ticks)| {
            json!({
                "setup": name, "cpu_percent": cpu, "rss_mib": rss, "peak_mib": peak,
                "tick_ms": tick_ms, "ticks_per_second": ticks / TICK_SECONDS as f64,
            })
        })
        .collect();
    if let Err(e) = std::fs::write(&out, serde_json::Value::from(report).to_string()) {
        println!("not written: {}: {e}", out.display());
    }
}
