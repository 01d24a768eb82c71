//! A benchmark, not a test (`#[ignore]`: `cargo xtask bench --forwarding` runs it in the VM):
//! small UDP datagrams forwarded through the gateway namespace as fast as four senders can
//! send them, with (a) nothing on the WAN interface, (b) shaperd with four classes whose
//! ceilings are above what the machine can forward, (c) Linux HTB with the same tree
//! (`htb_fq_codel_commands`), measured in turn in the same VM, [`ROUNDS`] rounds of the three.
//! Prints datagrams per second that arrived and CPU time per datagram (all CPUs' busy time,
//! /proc/stat), the median of the rounds and their range, and the ratios of the medians;
//! writes them as JSON beside the VM's run (`target/vm/test-run/`). Under QEMU's emulation
//! every figure is far below a real machine's, and one run of each varied by 2x from one
//! benchmark to the next: only the ratios of the rounds' medians mean anything.

use std::process::Child;

use serde_json::{json, Value};
use shaper_tests::gateway::{htb_fq_codel_commands, require_fq, Topology, SERVER};

use super::topology;

/// Four hosts, four classes, each far above what an emulated machine forwards.
const CONFIG: &str = r#"
[[interface]]
name = "wan0"
rate = "40gbit"
default = "c4"

[[class]]
name = "c1"
rate = "1gbit"
ceil = "10gbit"

[[class]]
name = "c2"
rate = "1gbit"
ceil = "10gbit"

[[class]]
name = "c3"
rate = "1gbit"
ceil = "10gbit"

[[class]]
name = "c4"
rate = "1gbit"
ceil = "10gbit"

[[rule]]
class = "c1"
src = "10.1.0.11"

[[rule]]
class = "c2"
src = "10.1.0.12"

[[rule]]
class = "c3"
src = "10.1.0.13"
"#;

const HOSTS: [&str; 4] = ["10.1.0.11", "10.1.0.12", "10.1.0.13", "10.1.0.14"];
const SECONDS: u32 = 4;
/// Rounds of the three setups, each measured once a round: whatever the emulator does at
/// one moment (translating code, the host's other work) is spread over all three.
const ROUNDS: usize = 3;

/// The median of `v` and its range.
fn spread(v: &mut [f64]) -> (f64, f64, f64) {
    v.sort_by(f64::total_cmp);
    (v[v.len() / 2], v[0], v[v.len() - 1])
}

/// Busy and total CPU time of all CPUs so far, in clock ticks (/proc/stat's first line).
fn cpu_ticks() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let fields: Vec<u64> =
        stat.lines().next().expect("a cpu line").split_whitespace().skip(1).filter_map(|f| f.parse().ok()).collect();
    let total: u64 = fields.iter().sum();
    let idle = fields.get(3).copied().unwrap_or(0) + fields.get(4).copied().unwrap_or(0);
    (total - idle, total)
}

/// Datagrams per second that arrived, and busy CPU ns per datagram, for one run of the four
/// senders (18-byte payloads, as fast as iperf3 can send).
fn measure(topo: &Topology, first_port: u16) -> (f64, f64) {
    let ports: Vec<u16> = (0..4).map(|i| first_port + i).collect();
    let servers: Vec<Child> = ports.iter().map(|&p| topo.iperf_server(p)).collect();
    let (busy0, _) = cpu_ticks();
    let clients: Vec<Child> = HOSTS
        .iter()
        .zip(&ports)
        .map(|(src, port)| topo.iperf_client_to(SERVER, src, *port, SECONDS, "1", &["-u", "-b", "0", "-l", "18"]))
        .collect();
    let mut arrived = 0u64;
    for client in clients {
        let out = client.wait_with_output().expect("waiting for iperf3");
        let v: Value = serde_json::from_slice(&out.stdout).expect("iperf3 JSON");
        let sum = &v["end"]["sum"];
        arrived += sum["packets"].as_u64().unwrap_or(0).saturating_sub(sum["lost_packets"].as_u64().unwrap_or(0));
    }
    let (busy1, _) = cpu_ticks();
    for mut s in servers {
        let _ = s.wait();
    }
    // SAFETY: sysconf has no preconditions.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(100);
    let busy_ns = (busy1 - busy0) as f64 * 1e9 / hz as f64;
    (arrived as f64 / f64::from(SECONDS), busy_ns / arrived.max(1) as f64)
}

#[test]
#[ignore = "a benchmark: cargo xtask bench --forwarding runs it in the VM"]
fn small_udp_through_the_gateway_none_shaper_htb() {
    require_fq();
    let topo = topology("shaper-vm-fwd", &HOSTS);
    let config = shaper::config::Config::parse(CONFIG, std::path::Path::new("forwarding.toml")).expect("config");
    let htb_commands = htb_fq_codel_commands(&config, "wan0");
    // Per setup: datagrams/s and CPU ns each, one of each per round.
    let mut runs: [(Vec<f64>, Vec<f64>); 3] = Default::default();
    let mut port = 5801;
    let mut record = |setup: usize, (pps, cpu): (f64, f64)| {
        runs[setup].0.push(pps);
        runs[setup].1.push(cpu);
    };
    for _ in 0..ROUNDS {
        record(0, measure(&topo, port));
        let daemon = topo.shaperd(CONFIG);
        record(1, measure(&topo, port + 4));
        drop(daemon);
        topo.gw_script(&htb_commands);
        record(2, measure(&topo, port + 8));
        topo.gw.sh(&["tc", "qdisc", "del", "dev", "wan0", "root"]);
        port += 12;
    }
    let names = ["nothing on wan0", "shaper, 4 classes", "HTB + fq_codel, same tree"];
    println!(
        "forwarding 18-byte UDP datagrams, four senders, {SECONDS} s a run, {ROUNDS} rounds (QEMU TCG, 2 vCPUs; ratios only)"
    );
    println!("{:<30} {:>12} {:>18} {:>14}", "", "datagrams/s", "(rounds' range)", "CPU ns each");
    let mut medians = [(0.0, 0.0); 3];
    for ((name, (pps, cpu)), median) in names.iter().zip(&mut runs).zip(&mut medians) {
        let (p, lo, hi) = spread(pps);
        let (c, _, _) = spread(cpu);
        println!("{name:<30} {p:>12.0} {:>18} {c:>14.0}", format!("{lo:.0}-{hi:.0}"));
        *median = (p, c);
    }
    let [none, shaper, htb] = medians;
    println!(
        "shaper / HTB: {:.2}x datagrams/s (goal: at least 1.00), {:.2}x CPU each; shaper / nothing: {:.2}x datagrams/s (goal: at least 0.90)",
        shaper.0 / htb.0,
        shaper.1 / htb.1,
        shaper.0 / none.0
    );
    let out = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/vm/test-run/forwarding.json");
    let report = json!({
        "none": {"pps": none.0, "cpu_ns": none.1},
        "shaper": {"pps": shaper.0, "cpu_ns": shaper.1},
        "htb": {"pps": htb.0, "cpu_ns": htb.1},
        "shaper_over_htb": shaper.0 / htb.0,
        "shaper_over_none": shaper.0 / none.0,
    });
    if let Err(e) = std::fs::write(&out, report.to_string()) {
        println!("not written: {}: {e}", out.display());
    }
}
