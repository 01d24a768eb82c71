//! IPv6 end to end: seed 000's link sharing with every packet IPv6, classes by prefix.
//!
//! The roommates' class tree (`config/roommates.toml`), each roommate's devices on a /64 of
//! their own (`fd00:1:0:a::/64` for alex, `b` betty, `c` carl; the guest's `d` has no rule
//! and falls in the default class), greedy iperf3 TCP over IPv6 to the server's
//! `fd00:2::2`, shaped on the gateway's `lan0` egress (uploads: a packet's host is its
//! source). The rows and tolerances are those of `seed_000_shares_with_tcp` (IPv4): each
//! class within 4 % of HTB's share (the guest within 0.05 mbit/s), the link 98 % full. The
//! same rows run first through the HTB tree a tc script would build from the same file, its
//! rules as `u32 match ip6 src` filters. About 90 s of VM time.

use std::{process::Child, thread::sleep, time::Duration};

use shaper_tests::gateway::{goodput, htb_fq_codel_commands, receiver_intervals, require_fq, Topology, SERVER6};

use super::{check_rows, roommates, seed_000_rows_named, Load, Row, ROOMMATES};

/// The roommates' classes, by IPv6 prefix.
const ROOMMATES6: &str = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "guest"

[[class]]
name = "alex"
rate = "1.9mbit"
ceil = "10mbit"
prio = 1

[[class]]
name = "betty"
rate = "2.9mbit"
ceil = "10mbit"
prio = 1

[[class]]
name = "carl"
rate = "4.9mbit"
ceil = "10mbit"
prio = 1

[[class]]
name = "guest"
rate = "0.3mbit"
ceil = "10mbit"
prio = 0

[[rule]]
class = "alex"
src = "fd00:1:0:a::/64"

[[rule]]
class = "betty"
src = "fd00:1:0:b::/64"

[[rule]]
class = "carl"
src = "fd00:1:0:c::/64"
"#;

/// The gateway's address in each roommate's /64 (the first is the hosts' router).
const ROUTER6: [&str; 4] = ["fd00:1:0:a::1/64", "fd00:1:0:b::1/64", "fd00:1:0:c::1/64", "fd00:1:0:d::1/64"];
/// alex, betty, carl and the guest.
const HOSTS6: [&str; 4] = ["fd00:1:0:a::2", "fd00:1:0:b::2", "fd00:1:0:c::2", "fd00:1:0:d::2"];
/// Full-size TCP segments over IPv6 with timestamps: 1428 bytes of payload in a 1514-byte frame.
const WIRE_PER_GOODPUT6: f64 = 1514.0 / 1428.0;
/// Length of each row's run, seconds, and its steady part (as `run_rows` for IPv4).
const RUN: u32 = 12;
const FROM: f64 = 4.0;

fn parse(config: &str, name: &str) -> shaper::config::Config {
    shaper::config::Config::parse(config, std::path::Path::new(name)).unwrap_or_else(|e| panic!("{e}"))
}

/// A roommates topology with IPv6 on top: each host an address in its own /64.
fn topology6(tag: &str) -> Topology {
    let topo = roommates(tag);
    let hosts: Vec<String> = HOSTS6.iter().map(|h| format!("{h}/64")).collect();
    let hosts: Vec<&str> = hosts.iter().map(String::as_str).collect();
    topo.add_ipv6("home0", "lan0", &ROUTER6, &hosts);
    topo
}

/// Runs every row (greedy or idle hosts) over IPv6 through whatever shapes `lan0` in
/// `topo`; returns the measured wire rates (mbit/s) per row.
fn run_rows6(topo: &Topology, rows: &[Row], base_port: u16) -> Vec<[f64; 4]> {
    let mut out = Vec::new();
    for (k, row) in rows.iter().enumerate() {
        let active: Vec<usize> = (0..4).filter(|&i| !matches!(row.loads[i], Load::Idle)).collect();
        assert!(active.iter().all(|&i| matches!(row.loads[i], Load::Greedy)), "{}: greedy hosts only", row.what);
        let port = |i: usize| base_port + u16::try_from(k * 10 + i).expect("a port");
        let servers: Vec<Child> = active.iter().map(|&i| topo.iperf_server(port(i))).collect();
        let clients: Vec<(usize, Child)> =
            active.iter().map(|&i| (i, topo.iperf_client_to(SERVER6, HOSTS6[i], port(i), RUN, "1", &[]))).collect();
        let mut measured = [0.0; 4];
        for (i, client) in clients {
            let intervals = receiver_intervals(client);
            measured[i] = goodput(&intervals, FROM, f64::from(RUN) - 1.0) * WIRE_PER_GOODPUT6 / 1e6;
        }
        for mut s in servers {
            let _ = s.wait();
        }
        out.push(measured);
        // Let queues drain and the control loop see the idle classes before the next row.
        sleep(Duration::from_secs(1));
    }
    out
}

#[test]
fn seed_000_shares_over_ipv6_with_classes_by_prefix() {
    require_fq();
    // The IPv4 test's expectations hold only for the same class tree.
    let summary = |c: &shaper::config::Config| -> Vec<(String, u64, u64, u8)> {
        c.classes.iter().map(|c| (c.name.clone(), c.rate.bits_per_sec(), c.ceil.bits_per_sec(), c.prio)).collect()
    };
    let config = parse(ROOMMATES6, "roommates6.toml");
    assert_eq!(summary(&config), summary(&parse(ROOMMATES, "roommates.toml")), "the roommates' classes");
    let rows = seed_000_rows_named(&["alex + betty + carl", "all four"]);

    let htb = {
        let topo = topology6("shaper-vm-ipv6-htb");
        topo.gw_script(&htb_fq_codel_commands(&config, "lan0"));
        run_rows6(&topo, &rows, 6600)
    };
    let htb_failures = check_rows(
        &rows,
        &htb,
        None,
        "Linux HTB + fq_codel from the same config, TCP over IPv6 (measured (expected) mbit/s)",
    );
    let topo = topology6("shaper-vm-ipv6");
    let daemon = topo.shaperd(ROOMMATES6);
    let ours = run_rows6(&topo, &rows, 6700);
    let failures = check_rows(&rows, &ours, Some(&htb), "shaper, TCP over IPv6 (measured (expected) mbit/s)");
    topo.print_class_counters();
    drop(daemon);
    println!("  (HTB + fq_codel, reported only: {htb_failures:?})");
    // HTB's own filters classified IPv6 (else the comparison says nothing): with every
    // roommate's packets in the guest class, the three would share the link equally.
    let first = &rows[0];
    for ((name, got), expected) in ["alex", "betty", "carl"].iter().zip(htb[0]).zip(first.expected) {
        assert!(
            (got / expected - 1.0).abs() < 0.10,
            "HTB's u32 ip6 filters: {name} got {got:.3} mbit/s in \"{}\", expected {expected:.2}",
            first.what
        );
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
