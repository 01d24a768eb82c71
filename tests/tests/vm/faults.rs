//! Faults that used to cost a class its rate: a local sender's far-off departure time, and
//! `fq` limits sized for the ceilings a class had at start rather than for what it may reach.

use std::process::Stdio;

use shaper_tests::gateway::{
    htb_fq_codel_commands, iperf_result, receiver_intervals, require_fq, wire_rate, Topology, SERVER,
};

use super::topology;

fn parse(config: &str) -> shaper::config::Config {
    shaper::config::Config::parse(config, std::path::Path::new("faults.toml")).unwrap_or_else(|e| panic!("{e}"))
}

/// One class of 2 mbit/s for a LAN client and for the gateway's own connections to port 5402.
const LOCAL_SENDER_CONFIG: &str = r#"
[[interface]]
name = "wan0"
rate = "100mbit"
default = "other"

[[class]]
name = "c2"
rate = "2mbit"
ceil = "2mbit"

[[class]]
name = "other"
rate = "1mbit"
ceil = "1mbit"

[[rule]]
class = "c2"
src = "10.1.0.2"

[[rule]]
class = "c2"
dport = 5402
"#;

/// A TCP connection from the gateway itself, paced by its socket at 400 kbit/s
/// (`SO_MAX_PACING_RATE`, iperf3's `--fq-rate`), in the class of a greedy LAN flow. With `fq`
/// as root qdisc TCP hands its packets down with their departure times (CLOCK_MONOTONIC, a
/// pacing gap of ~60 ms apart for its two-segment packets) and leaves the waiting to `fq`.
/// Those times used to become the class's clock, so that each such packet held the whole
/// class until it left: the LAN flow got a fraction of the rest of the class's rate. The
/// class's schedule no longer waits for a sender's time, and the sender's pacing still holds.
/// Runs the greedy LAN flow and the gateway's paced flow side by side through whatever
/// shapes wan0, and returns their wire rates (bit/s) over the steady part.
fn lan_and_paced_flow(topo: &Topology, ports: (u16, u16)) -> (f64, f64) {
    let lan_server = topo.iperf_server(ports.0);
    let local_server = topo.iperf_server(ports.1);
    let local = topo
        .gw
        .command("iperf3")
        .args(["-c", SERVER, "-p", &ports.1.to_string(), "-t", "16", "-i", "1", "-J", "--get-server-output"])
        .args(["--fq-rate", "400k"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting iperf3 -c on the gateway");
    let client = topo.iperf_client("10.1.0.2", ports.0, 14, "1");
    let intervals = receiver_intervals(client);
    let local = iperf_result(local);
    drop((lan_server, local_server));
    let per_second = |i: &[shaper_tests::gateway::Interval]| {
        (1..14)
            .map(|s| format!("{:.2}", wire_rate(i, f64::from(s), f64::from(s + 1)) / 1e6))
            .collect::<Vec<_>>()
            .join(" ")
    };
    println!("  LAN flow, per second:   {}", per_second(&intervals));
    println!("  paced flow, per second: {}", per_second(&local.receiver));
    (wire_rate(&intervals, 4.0, 13.0), wire_rate(&local.receiver, 4.0, 13.0))
}

#[test]
fn a_senders_own_departure_times_do_not_stall_its_class() {
    require_fq();
    let topo = topology("shaper-vm-txtime", &["10.1.0.2"]);
    let mut daemon = topo.shaperd(LOCAL_SENDER_CONFIG);
    let (lan, paced) = lan_and_paced_flow(&topo, (5401, 5402));
    topo.print_class_counters();
    daemon.stop();
    topo.gw_script(&htb_fq_codel_commands(&parse(LOCAL_SENDER_CONFIG), "wan0"));
    let (htb_lan, htb_paced) = lan_and_paced_flow(&topo, (5411, 5402));
    println!(
        "c2 (2 mbit/s): LAN flow / the gateway's flow paced at 400 kbit/s: shaper {:.3} / {:.3}, HTB + fq_codel {:.3} / {:.3} mbit/s",
        lan / 1e6,
        paced / 1e6,
        htb_lan / 1e6,
        htb_paced / 1e6
    );
    // The sender's pacing holds (TCP's pacing rate counts its own headers, not Ethernet's).
    assert!(
        paced > 0.3e6 && paced < 0.45e6,
        "the gateway's flow, paced at 400 kbit/s, carried {:.3} mbit/s",
        paced / 1e6
    );
    // The class keeps to its rate and stays as full as HTB keeps it: the LAN flow gets the rest.
    let (class, htb) = (lan + paced, htb_lan + htb_paced);
    assert!(class < 2e6 * 1.02, "c2 carried {:.3} mbit/s, over its 2", class / 1e6);
    assert!(
        class > (2e6_f64 * 0.97).min(htb * 0.98),
        "c2 carried {:.3} mbit/s (LAN {:.3} + gateway {:.3}), HTB {:.3}",
        class / 1e6,
        lan / 1e6,
        paced / 1e6,
        htb / 1e6
    );
}
