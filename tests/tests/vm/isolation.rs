//! Isolation inside a class: two hosts share one class, one of them with eight TCP connections
//! (or a UDP flood) and the other with one. shaper's default `isolation = "host"` gives them
//! equal halves; HTB with `fq_codel` under the class, fair per flow, gives the first host
//! eight ninths. Both run on the roommates topology in the same VM run; shaper's figures are
//! asserted, HTB's printed next to them.

use std::path::Path;

use shaper::config::Config;
use shaper_tests::gateway::{goodput, htb_fq_codel_commands, iperf_result, require_fq, Topology, WIRE_PER_GOODPUT};

use super::{roommates, HOSTS};

/// One 10 mbit/s class for the whole house, shared by host (the default isolation).
const HOUSE: &str = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "house"

[[class]]
name = "house"
rate = "10mbit"
"#;

const RUN: u32 = 12;
/// The steady part of the runs, seconds.
const FROM: f64 = 4.0;
const TO: f64 = 11.0;

/// What the heavy host runs next to the light host's single TCP flow.
#[derive(Clone, Copy)]
enum Heavy {
    /// `n` parallel TCP flows.
    Tcp(u32),
    /// UDP at 20 mbit/s, twice the link.
    UdpFlood,
}

/// Runs the heavy host (alex) and the light host (betty, one TCP flow) at once through
/// whatever shapes `lan0`; returns their wire rates (bit/s) over the steady part.
fn run(topo: &Topology, heavy: Heavy, port: u16) -> (f64, f64) {
    let servers = topo.iperf_servers(&[port, port + 1]);
    let (args, heavy_factor): (Vec<String>, f64) = match heavy {
        Heavy::Tcp(n) => (vec!["-P".to_owned(), n.to_string()], WIRE_PER_GOODPUT),
        Heavy::UdpFlood => (["-u", "-l", "1472", "-b", "20M"].map(str::to_owned).to_vec(), 1514.0 / 1472.0),
    };
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let a = topo.iperf_client_with(HOSTS[0], port, RUN, "1", &args);
    let b = topo.iperf_client_with(HOSTS[1], port + 1, RUN, "1", &[]);
    let a = goodput(&iperf_result(a).receiver, FROM, TO) * heavy_factor;
    let b = goodput(&iperf_result(b).receiver, FROM, TO) * WIRE_PER_GOODPUT;
    for mut s in servers {
        let _ = s.wait();
    }
    (a, b)
}

/// Runs `heavy` through HTB + `fq_codel` and through shaper; prints both, asserts the link
/// at least 97 % full and each host's part of it within `tolerance` of half.
fn equal_halves(tag: &str, heavy: Heavy, what: &str, tolerance: f64) {
    require_fq();
    let config = Config::parse(HOUSE, Path::new("house.toml")).unwrap_or_else(|e| panic!("{e}"));
    let htb = {
        let topo = roommates(&format!("{tag}-htb"));
        topo.gw_script(&htb_fq_codel_commands(&config, "lan0"));
        run(&topo, heavy, 7400)
    };
    let ours = {
        let topo = roommates(tag);
        let daemon = topo.shaperd(HOUSE);
        let rates = run(&topo, heavy, 7500);
        let status = topo.status();
        let house = status["classes"].as_array().unwrap().iter().find(|c| c["name"] == "house").unwrap().clone();
        println!(
            "  shaper's house class: share {:.2} mbit/s, {} ECN marks, {} AQM drops, {} share drops",
            house["share"].as_f64().unwrap_or(0.0) / 1e6,
            house["ecn_marks"],
            house["drops_aqm"],
            house["drops_share"]
        );
        drop(daemon);
        rates
    };
    println!("one 10 mbit/s class, alex: {what}, betty: 1 TCP flow ({FROM}–{TO} s of {RUN} s, wire mbit/s):");
    println!("  {:<14} {:>8} {:>8} {:>8}", "", "alex", "betty", "total");
    for (label, (a, b)) in [("HTB+fq_codel", htb), ("shaper", ours)] {
        println!("  {label:<14} {:>8.2} {:>8.2} {:>8.2}", a / 1e6, b / 1e6, (a + b) / 1e6);
    }
    let (a, b) = ours;
    let total = a + b;
    assert!(total >= 9.7e6, "the link at {:.2} mbit/s", total / 1e6);
    for (who, r) in [("alex", a), ("betty", b)] {
        assert!(
            (r / (total / 2.0) - 1.0).abs() <= tolerance,
            "{who} got {:.2} of {:.2} mbit/s, not half ± {:.0} %",
            r / 1e6,
            total / 1e6,
            tolerance * 100.0
        );
    }
}

#[test]
fn a_host_with_eight_connections_and_a_host_with_one_get_near_equal_halves() {
    // The goal is halves within 10 %. Measured: 5.08 / 4.92 since a host's bytes count as
    // light only when it does not contend (5.51 / 4.45 to 5.97 / 4.03 before; HTB + fq_codel:
    // 8.77 / 1.10).
    equal_halves("shaper-vm-iso-tcp", Heavy::Tcp(8), "8 TCP flows", 0.10);
}

#[test]
fn a_udp_flood_gets_its_host_half_of_the_class_not_more() {
    equal_halves("shaper-vm-iso-udp", Heavy::UdpFlood, "UDP at 20 mbit/s", 0.10);
}
