//! Shaping accuracy on a kernel with `sch_fq`: shaperd on a gateway namespace, iperf3 flows
//! from a LAN namespace to a server namespace, rates measured by the iperf3 receiver.
//!
//! Built only with `--features vm`; `cargo xtask test` runs it inside a VM (the host kernel
//! lacks `sch_fq`, so departure times would not be enforced there). Needs root.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "figures for reports and tolerances"
)]

use std::{
    process::Child,
    thread::sleep,
    time::{Duration, Instant},
};

use shaper_tests::{
    gateway::{receiver_intervals, require_fq, wire_rate, Topology, WIRE_PER_GOODPUT},
    sh, veth, Netns,
};

fn topology(tag: &str, clients: &[&str]) -> Topology {
    Topology::new(tag, "lan0", "wan0", "10.1.0", clients)
}

const STATIC_CONFIG: &str = r#"
[[interface]]
name = "wan0"
rate = "100mbit"
default = "other"

[[class]]
name = "c2"
rate = "2mbit"
ceil = "10mbit"

[[class]]
name = "c3"
rate = "3mbit"

[[class]]
name = "c5"
rate = "5mbit"

[[class]]
name = "c50"
rate = "50mbit"

[[class]]
name = "other"
rate = "1mbit"

[[rule]]
class = "c2"
src = "10.1.0.2"

[[rule]]
class = "c3"
src = "10.1.0.3"

[[rule]]
class = "c5"
src = "10.1.0.5"

[[rule]]
class = "c50"
src = "10.1.0.50"
"#;

/// Length of the static-rate runs.
const SECONDS: u32 = 20;

#[test]
fn static_classes_are_paced_within_two_percent() {
    require_fq();
    let topo = topology("shaper-vm-static", &["10.1.0.2", "10.1.0.3", "10.1.0.5", "10.1.0.50"]);
    let mut daemon = topo.shaperd(STATIC_CONFIG);
    let qdisc = topo.gw.sh(&["tc", "qdisc", "show", "dev", "wan0"]);
    assert!(
        String::from_utf8_lossy(&qdisc.stdout).contains("qdisc fq"),
        "shaperd installs fq: {}",
        String::from_utf8_lossy(&qdisc.stdout)
    );

    let flows = [
        ("c2", "10.1.0.2", 5201u16, 2e6),
        ("c3", "10.1.0.3", 5202, 3e6),
        ("c5", "10.1.0.5", 5203, 5e6),
        ("c50", "10.1.0.50", 5204, 50e6),
    ];
    let servers: Vec<Child> = flows.iter().map(|f| topo.iperf_server(f.2)).collect();
    let clients: Vec<Child> = flows.iter().map(|f| topo.iperf_client(f.1, f.2, SECONDS, "1")).collect();
    let mut failures = Vec::new();
    for (flow, client) in flows.iter().zip(clients) {
        let intervals = receiver_intervals(client);
        // Steady part: after TCP's start-up, before the last (partial) second. A long window
        // keeps the receiver's delivery jitter (data held for a retransmission is delivered
        // in a burst; up to a horizon's worth) small next to the total.
        let rate = wire_rate(&intervals, 4.0, f64::from(SECONDS) - 1.0);
        let error = rate / flow.3 - 1.0;
        println!(
            "class {}: configured {:.2} mbit/s, measured wire rate {:.3} mbit/s ({:+.2} %)",
            flow.0,
            flow.3 / 1e6,
            rate / 1e6,
            error * 100.0
        );
        if error.abs() > 0.02 {
            failures.push(format!(
                "{}: {:.3} mbit/s vs {:.2} ({:+.2} %)",
                flow.0,
                rate / 1e6,
                flow.3 / 1e6,
                error * 100.0
            ));
        }
    }
    for mut s in servers {
        let _ = s.wait();
    }
    // The datapath's own counters saw the same traffic, class by class.
    let status = topo.status();
    for flow in &flows {
        let class = status["classes"].as_array().unwrap().iter().find(|c| c["name"] == flow.0).unwrap();
        let bytes = class["bytes"].as_u64().unwrap();
        let expected = flow.3 / 8.0 * f64::from(SECONDS);
        assert!(
            bytes as f64 > expected * 0.8 && (bytes as f64) < expected * 1.1,
            "class {} counted {bytes} bytes, expected about {expected}",
            flow.0
        );
    }
    assert!(failures.is_empty(), "rates off by more than 2 %: {failures:?}");

    let log = daemon.stop();
    let qdisc = topo.gw.sh(&["tc", "qdisc", "show", "dev", "wan0"]);
    let qdisc = String::from_utf8_lossy(&qdisc.stdout);
    assert!(!qdisc.contains("qdisc fq"), "shaperd removes its fq on exit: {qdisc}\n{log}");
    assert!(!qdisc.contains("clsact"), "shaperd removes the clsact it added: {qdisc}");
}

#[test]
fn set_rate_changes_the_measured_rate_within_a_second() {
    require_fq();
    let topo = topology("shaper-vm-setrate", &["10.1.0.2"]);
    let _daemon = topo.shaperd(STATIC_CONFIG);
    let server = topo.iperf_server(5301);
    let started = Instant::now();
    let client = topo.iperf_client("10.1.0.2", 5301, 14, "0.5");
    sleep(Duration::from_secs(6).saturating_sub(started.elapsed()));
    let changed_at = started.elapsed().as_secs_f64();
    let out = topo.ctl(&["set-rate", "c2", "4mbit"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let intervals = receiver_intervals(client);
    drop(server);

    let before = wire_rate(&intervals, 2.0, 6.0);
    let after = wire_rate(&intervals, changed_at + 1.0, 14.0);
    println!(
        "set-rate c2 2mbit → 4mbit at {changed_at:.2} s: before {:.3} mbit/s, after {:.3} mbit/s",
        before / 1e6,
        after / 1e6
    );
    for i in &intervals {
        println!("  [{:5.2}, {:5.2}) {:.3} mbit/s", i.start, i.end, i.bits_per_second * WIRE_PER_GOODPUT / 1e6);
    }
    // Windows of a few seconds: the receiver's delivery jitter is a few percent of them.
    assert!((before / 2e6 - 1.0).abs() < 0.05, "before: {before}");
    assert!((after / 4e6 - 1.0).abs() < 0.05, "from 1 s after the change on: {after}");
    // Within a second of the change the rate has moved past the midpoint of old and new (a
    // single second's goodput jitters by up to ±20 % as TCP recovers from horizon drops).
    let second = wire_rate(&intervals, changed_at + 1.0, changed_at + 2.0);
    assert!(
        second > 3e6,
        "the second after [{:.1}, {:.1}] runs at {second}, not yet near 4 mbit/s",
        changed_at + 1.0,
        changed_at + 2.0
    );
    let status = topo.status();
    let c2 = status["classes"].as_array().unwrap().iter().find(|c| c["name"] == "c2").unwrap();
    assert_eq!(c2["current_rate"], 4_000_000);
    let bad = topo.ctl(&["set-rate", "c2", "20mbit"]);
    assert!(!bad.status.success());
    assert!(String::from_utf8_lossy(&bad.stderr).contains("ceil"), "{}", String::from_utf8_lossy(&bad.stderr));
    let bad = topo.ctl(&["set-rate", "nobody", "1mbit"]);
    assert!(String::from_utf8_lossy(&bad.stderr).contains("no class named"));
}

#[test]
fn fq_is_installed_over_the_kernel_default_and_restored() {
    require_fq();
    let ns = Netns::new("shaper-vm-fq");
    let peer = Netns::new("shaper-vm-fq-peer");
    veth(&ns, "a0", &["10.9.0.1/24"], &peer, "b0", &["10.9.0.2/24"]);
    let config = "[[interface]]\nname = \"a0\"\nrate = \"10mbit\"\ndefault = \"rest\"\n\n[[class]]\nname = \"rest\"\nrate = \"10mbit\"\n";
    let dir = std::env::temp_dir().join("shaper-vm-fq");
    std::fs::create_dir_all(&dir).unwrap();
    // An admin's qdisc is not replaced without replace_qdisc = true.
    ns.sh(&["tc", "qdisc", "add", "dev", "a0", "root", "handle", "1:", "htb"]);
    std::fs::write(dir.join("c.toml"), config).unwrap();
    let out = ns
        .command(shaper_tests::bin("shaperd").to_str().unwrap())
        .args(["--config", dir.join("c.toml").to_str().unwrap(), "--socket", dir.join("s").to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("replace_qdisc"), "{}", String::from_utf8_lossy(&out.stderr));
    let q = ns.sh(&["tc", "qdisc", "show", "dev", "a0"]);
    assert!(String::from_utf8_lossy(&q.stdout).contains("htb 1:"));
    sh(&["ip", "netns", "exec", &ns.name, "tc", "qdisc", "del", "dev", "a0", "root"]);
}
