//! A gateway that masquerades: its hosts' uploads leave the WAN interface with the gateway's
//! address and ports (nftables `masquerade`), so rules on the hosts' `src` addresses never
//! match there. With `lan = ["lan0"]`, shaperd records each flow's origin at ingress of the
//! LAN interface and classifies the translated packets by it.
//!
//! The server has no route to the hosts' network: every flow that reaches it went through
//! the NAT. Timing (TCG, 2 vCPUs): about 70 s of VM time.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use aya::programs::TcAttachType;
use shaper_tests::{
    gateway::{receiver_intervals, require_fq, wire_rate},
    veth,
};

use super::{attachments, egress_filters, topology};

/// Three hosts and a guest on a 10 mbit/s uplink. alex may borrow up to 5 mbit/s only.
const NAT_CONFIG: &str = r#"
[[interface]]
name = "wan0"
rate = "10mbit"
default = "guest"
lan = ["lan0"]

[[class]]
name = "alex"
rate = "2mbit"
ceil = "5mbit"

[[class]]
name = "betty"
rate = "3mbit"
ceil = "10mbit"

[[class]]
name = "carl"
rate = "4.9mbit"
ceil = "10mbit"

[[class]]
name = "guest"
rate = "0.1mbit"
ceil = "10mbit"

[[rule]]
class = "alex"
src = "10.1.0.2"

[[rule]]
class = "betty"
src = "10.1.0.3"

[[rule]]
class = "carl"
src = "10.1.0.4"
"#;

const MBIT: f64 = 1e6;

/// Runs one greedy TCP upload per `(host, port)` for `seconds` and returns each one's wire
/// rate over the steady part (from 3 s to the last second).
fn uploads(topo: &shaper_tests::gateway::Topology, hosts: &[(&str, u16)], seconds: u32) -> Vec<f64> {
    let servers: Vec<_> = hosts.iter().map(|&(_, port)| topo.iperf_server(port)).collect();
    let clients: Vec<_> = hosts.iter().map(|&(src, port)| topo.iperf_client(src, port, seconds, "1")).collect();
    let rates = clients.into_iter().map(|c| wire_rate(&receiver_intervals(c), 3.0, f64::from(seconds) - 1.0)).collect();
    for mut s in servers {
        let _ = s.wait();
    }
    rates
}

#[test]
fn behind_a_masquerading_gateway_hosts_are_classified_by_their_own_addresses() {
    require_fq();
    let topo = topology("shaper-vm-nat", &["10.1.0.2", "10.1.0.3", "10.1.0.4"]);
    topo.srv.sh(&["ip", "route", "del", "10.1.0.0/24"]);
    topo.gw.nft(&[
        "add table ip nat",
        "add chain ip nat post { type nat hook postrouting priority 100 ; }",
        "add rule ip nat post oifname wan0 masquerade",
    ]);
    let mut daemon = topo.shaperd(NAT_CONFIG);
    assert_eq!(attachments(&topo, "lan0", TcAttachType::Ingress), 1, "one attachment at ingress of lan0");
    assert_eq!(egress_filters(&topo, "wan0"), 1, "one attachment at egress of wan0");
    let mut failures = Vec::new();

    // alex alone may borrow up to its ceiling, not the whole link.
    let alone = uploads(&topo, &[("10.1.0.2", 5301)], 10)[0];
    println!("alex alone: {:.3} mbit/s (ceil 5)", alone / MBIT);
    if (alone / (5.0 * MBIT) - 1.0).abs() > 0.03 {
        failures.push(format!("alex alone: {:.3} mbit/s, ceil 5", alone / MBIT));
    }

    // All three at once: each its guarantee, and the guest's idle 0.1 mbit/s lent in
    // proportion to the rates (HTB's quantum).
    let all = uploads(&topo, &[("10.1.0.2", 5302), ("10.1.0.3", 5303), ("10.1.0.4", 5304)], 12);
    for ((name, rate), measured) in [("alex", 2.0), ("betty", 3.0), ("carl", 4.9)].iter().zip(&all) {
        let expected = rate * (1.0 + 0.1 / 9.9) * MBIT;
        println!("{name}: {:.3} mbit/s, expected {:.3}", measured / MBIT, expected / MBIT);
        if (measured / expected - 1.0).abs() > 0.03 {
            failures.push(format!("{name}: {:.3} mbit/s, expected {:.3}", measured / MBIT, expected / MBIT));
        }
    }

    // The classes' own counters: the hosts' bytes are theirs, next to nothing the guest's.
    let status = topo.status();
    let bytes = |name: &str| {
        let classes = status["classes"].as_array().expect("classes");
        classes.iter().find(|c| c["name"] == name).expect("class")["bytes"].as_u64().expect("bytes")
    };
    let guest = bytes("guest");
    println!(
        "counted: alex {} B, betty {} B, carl {} B, guest {guest} B",
        bytes("alex"),
        bytes("betty"),
        bytes("carl")
    );
    if guest > bytes("alex") / 50 {
        failures.push(format!("the guest class counted {guest} B: translated packets went to the default class"));
    }
    assert!(failures.is_empty(), "{failures:?}\n{}", daemon.log());

    // The LAN interface goes and comes back (a bridge or an access point re-created): its
    // ingress gets the program again, and the hosts are told apart again.
    topo.gw.sh(&["ip", "link", "del", "lan0"]);
    let since = Instant::now();
    veth(&topo.lan, "eth0", &["10.1.0.2/24", "10.1.0.3/24", "10.1.0.4/24"], &topo.gw, "lan0", &["10.1.0.1/24"]);
    topo.lan.sh(&["ip", "route", "add", "default", "via", "10.1.0.1"]);
    while attachments(&topo, "lan0", TcAttachType::Ingress) != 1 {
        assert!(since.elapsed() < Duration::from_secs(10), "lan0 not attached again: {}", daemon.log());
        sleep(Duration::from_millis(50));
    }
    println!("lan0 re-created: attached again after {} ms", since.elapsed().as_millis());
    for line in daemon.log().lines().filter(|l| l.contains("re-attached at ingress")) {
        println!("shaperd: {line}");
    }
    let again = uploads(&topo, &[("10.1.0.2", 5305)], 8)[0];
    println!("alex alone after lan0 came back: {:.3} mbit/s (ceil 5)", again / MBIT);
    assert!((again / (5.0 * MBIT) - 1.0).abs() <= 0.03, "alex after lan0 came back: {:.3} mbit/s", again / MBIT);

    // A crash: the next shaperd takes the LAN side over in place (one attachment, not two).
    daemon.kill();
    let mut daemon = topo.shaperd(NAT_CONFIG);
    let took_over = daemon.log().lines().any(|l| l.contains("attached at ingress") && l.contains("took_over=true"));
    assert!(took_over, "the ingress attachment is taken over: {}", daemon.log());
    assert_eq!(attachments(&topo, "lan0", TcAttachType::Ingress), 1, "one attachment at ingress of lan0");
    // An upgrade to a configuration without the LAN side: the next shaperd gives lan0 back.
    daemon.signal(libc::SIGUSR2);
    assert_eq!(daemon.wait().code(), Some(75), "{}", daemon.log());
    let mut daemon = topo.shaperd(&NAT_CONFIG.replace("lan = [\"lan0\"]\n", ""));
    assert_eq!(attachments(&topo, "lan0", TcAttachType::Ingress), 0, "lan0 given back: {}", daemon.log());
    let qdisc = topo.gw.sh(&["tc", "qdisc", "show", "dev", "lan0"]);
    let qdisc = String::from_utf8_lossy(&qdisc.stdout);
    assert!(!qdisc.contains("clsact"), "the clsact the first shaperd added on lan0 is removed: {qdisc}");
    // And back: a restart with the LAN side (a reload cannot change it).
    daemon.stop();
    let mut daemon = topo.shaperd(NAT_CONFIG);

    let log = daemon.stop();
    assert_eq!(attachments(&topo, "lan0", TcAttachType::Ingress), 0, "detached from lan0 on exit: {log}");
    let qdisc = topo.gw.sh(&["tc", "qdisc", "show", "dev", "lan0"]);
    let qdisc = String::from_utf8_lossy(&qdisc.stdout);
    assert!(!qdisc.contains("clsact"), "the clsact added on lan0 is removed: {qdisc}");
}
