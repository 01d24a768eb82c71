//! `cargo xtask demo`: the roommates of seed 000 on a gateway built from network namespaces.
//!
//! Alex (192.168.1.110), Betty (.111), Carl (.112) and a guest (.113) each upload with one
//! TCP iperf3 flow through a gateway whose uplink `lan0` is shaped by shaperd with
//! `config/roommates.toml`; the server counts what arrives. Prints each class's measured
//! wire rate next to its configured rate, and `shaperctl status`. Needs root and a kernel
//! with `sch_fq` (`cargo xtask demo` boots one in a VM when the host has none).
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "figures for reports and tolerances"
)]

use std::path::PathBuf;

use shaper::config::Config;
use shaper_tests::gateway::{receiver_intervals, require_fq, wire_rate, Topology};

const SECONDS: u32 = 14;

fn main() {
    let config_path = std::env::args()
        .nth(1)
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/roommates.toml"), PathBuf::from);
    let text = std::fs::read_to_string(&config_path).unwrap_or_else(|e| panic!("{}: {e}", config_path.display()));
    let config = Config::parse(&text, &config_path).unwrap_or_else(|e| panic!("{e}"));
    require_fq();

    let hosts =
        [("alex", "192.168.1.110"), ("betty", "192.168.1.111"), ("carl", "192.168.1.112"), ("guest", "192.168.1.113")];
    let addrs: Vec<&str> = hosts.iter().map(|h| h.1).collect();
    println!(
        "topology: home (192.168.1.110-113) ── home0 | gateway | lan0 (shaped egress, {}) ── server {}",
        config.interfaces[0].rate,
        shaper_tests::gateway::SERVER
    );
    let topo = Topology::new("shaper-demo", "home0", "lan0", "192.168.1", &addrs);
    let mut daemon = topo.shaperd(&text);
    println!("shaperd is running with {}", config_path.display());

    let servers: Vec<_> = (0..hosts.len()).map(|i| topo.iperf_server(5201 + u16::try_from(i).unwrap())).collect();
    println!("{} TCP uploads for {SECONDS} s, all at once...", hosts.len());
    let clients: Vec<_> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| topo.iperf_client(h.1, 5201 + u16::try_from(i).unwrap(), SECONDS, "1"))
        .collect();
    let results: Vec<_> = clients.into_iter().map(receiver_intervals).collect();
    for mut s in servers {
        let _ = s.wait();
    }

    println!();
    println!("{:<8} {:<15} {:>12} {:>14} {:>8}", "class", "host", "configured", "measured", "error");
    let mut total = 0.0;
    for ((name, addr), intervals) in hosts.iter().zip(&results) {
        let class = config.class(name).expect("class in roommates.toml");
        let measured = wire_rate(intervals, 3.0, f64::from(SECONDS) - 1.0);
        total += measured;
        let configured = class.rate.bits_per_sec() as f64;
        println!(
            "{:<8} {:<15} {:>7.3} mbit {:>9.3} mbit {:>+7.2}%",
            name,
            addr,
            configured / 1e6,
            measured / 1e6,
            (measured / configured - 1.0) * 100.0
        );
    }
    println!(
        "{:<8} {:<15} {:>7.3} mbit {:>9.3} mbit",
        "total",
        "",
        config.interfaces[0].rate.bits_per_sec() as f64 / 1e6,
        total / 1e6
    );
    println!("(wire rates: iperf3 receiver goodput x 1514/1448, seconds 3-{} of the run)", SECONDS - 1);
    println!();
    println!("$ shaperctl status");
    print!("{}", String::from_utf8_lossy(&topo.ctl(&["status"]).stdout));
    daemon.stop();
}
