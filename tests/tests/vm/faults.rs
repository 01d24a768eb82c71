//! Faults that used to cost a class its rate: a local sender's far-off departure time, and
//! `fq` limits sized for the ceilings a class had at start rather than for what it may reach.

use std::process::Stdio;

use shaper_tests::gateway::{
    goodput, htb_fq_codel_commands, iperf_result, receiver_intervals, require_fq, wire_rate, Topology, SERVER,
    UDP_PAYLOAD, WIRE_PER_UDP_GOODPUT,
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
/// as root qdisc TCP hands its packets down with their departure times (`CLOCK_MONOTONIC`, a
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

/// A class that starts at 2 mbit/s without AQM, with a 500 ms horizon, on a 100 mbit/s link:
/// raised at runtime to 40 mbit/s, a flood queues 500 ms of it in `fq`, 1,700 packets of
/// one flow.
const RAISED_CONFIG: &str = r#"
[[interface]]
name = "wan0"
rate = "100mbit"
default = "other"

[[class]]
name = "c"
rate = "2mbit"
ceil = "2mbit"
horizon = "500ms"
aqm = false

[[class]]
name = "other"
rate = "1mbit"
ceil = "1mbit"

[[rule]]
class = "c"
src = "10.1.0.2"
"#;

/// The root fq's `limit` and `flow_limit`, as `tc` shows them.
fn fq_limits_shown(topo: &Topology) -> (u32, u32) {
    let out = topo.gw.sh(&["tc", "qdisc", "show", "dev", "wan0", "root"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let after = |word: &str| -> u32 {
        let rest = text.split(word).nth(1).unwrap_or_else(|| panic!("no {word:?} in {text}"));
        rest.trim_start().trim_end_matches(char::is_whitespace).split('p').next().unwrap().parse().unwrap()
    };
    (after(" limit "), after("flow_limit "))
}

/// The packets the root fq dropped, as `tc -s` shows them.
fn fq_dropped(topo: &Topology) -> u64 {
    let out = topo.gw.sh(&["tc", "-s", "qdisc", "show", "dev", "wan0", "root"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let rest = text.split("(dropped ").nth(1).unwrap_or_else(|| panic!("no drop count in {text}"));
    rest.split(',').next().and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("{text}"))
}

/// fq's limits are sized for what the classes may reach (the link's rate over the longest
/// horizon), not for their ceilings at start: a class raised from 2 to 40 mbit/s at runtime
/// used to find fq holding 1,000 packets per flow, fq dropped packets that had departure
/// slots, and the class ran far below its rate. An `fq` adopted from an earlier shaperd gets
/// the limits too.
#[test]
fn fq_holds_what_a_class_raised_at_runtime_queues() {
    require_fq();
    let topo = topology("shaper-vm-fqlimits", &["10.1.0.2"]);
    let mut first = topo.shaperd(RAISED_CONFIG);
    // 100 mbit/s over 500 ms in 1000-byte packets: 6,250 per flow, four times that in all.
    let sized = (25_000, 6_250);
    assert_eq!(fq_limits_shown(&topo), sized, "fq sized for the link over the longest horizon");
    // An earlier shaperd's fq with smaller limits is resized when it is taken over.
    first.kill();
    topo.gw.sh(&[
        "tc",
        "qdisc",
        "change",
        "dev",
        "wan0",
        "root",
        "handle",
        "5a1f:",
        "fq",
        "limit",
        "10000",
        "flow_limit",
        "100",
    ]);
    assert_eq!(fq_limits_shown(&topo), (10_000, 100));
    let _second = topo.shaperd(RAISED_CONFIG);
    assert_eq!(fq_limits_shown(&topo), sized, "the adopted fq is resized");

    for args in [["set-ceil", "c", "40mbit"], ["set-rate", "c", "40mbit"]] {
        let out = topo.ctl(&args);
        assert!(out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stderr));
    }
    let server = topo.iperf_server(5501);
    let client = topo.iperf_client_with("10.1.0.2", 5501, 10, "1", &["-u", "-b", "50M", "-l", UDP_PAYLOAD]);
    let result = iperf_result(client);
    drop(server);
    // The queue takes the horizon to fill: measure after it.
    let rate = goodput(&result.receiver, 3.0, 9.0) * WIRE_PER_UDP_GOODPUT;
    let sent = result.sender_bits_per_second * WIRE_PER_UDP_GOODPUT;
    let dropped = fq_dropped(&topo);
    println!(
        "c raised from 2 to 40 mbit/s, flooded at 50: {:.2} mbit/s (iperf3 sent {:.2}); fq dropped {dropped} packets",
        rate / 1e6,
        sent / 1e6
    );
    topo.print_class_counters();
    // What the limits are for: fq keeps every packet the class gave a departure time.
    assert_eq!(dropped, 0, "fq dropped packets that had their departure times");
    // And the class runs at its rate, or carries all that was sent if that is less: an
    // emulated CPU may not send 50 mbit/s of datagrams (the class carried 37.28 and 35.85
    // mbit/s in two runs on the slow host of 2026-11-28, before what iperf3 sent was printed;
    // 38.19 of 49.31 sent in the run after). Within 5 %: iperf3's 4,250
    // datagrams a second under TCG come in stalls that a class clock cannot make up for
    // (38.47 and 38.85 mbit/s in two runs on a slow host, with fq dropping nothing; with the
    // limits too small it ran far below).
    let expected = sent.min(40e6);
    assert!(
        (rate / expected - 1.0).abs() <= 0.05,
        "c carried {:.2} mbit/s, not {:.2} (±5 %: 40, or what iperf3 sent if less)",
        rate / 1e6,
        expected / 1e6
    );

    // A reload that doubles the longest horizon resizes fq in place, and says so.
    std::fs::write(topo.dir.join("shaper.toml"), RAISED_CONFIG.replace("500ms", "1s")).unwrap();
    let out = topo.ctl(&["reload"]);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{said}{}", String::from_utf8_lossy(&out.stderr));
    assert!(said.contains("fq limit 50000 flow_limit 12500"), "reload reported: {said}");
    assert_eq!(fq_limits_shown(&topo), (50_000, 12_500), "resized on reload");
}
