//! An interface with several transmit queues: shaperd puts `mq` at its root with an `fq` on
//! each queue (each CPU transmits through a queue and a lock of its own), the class clocks
//! stay shared by all CPUs in the BPF maps, and the classes keep their rates. Every veth of
//! the topology has two queues; wan0 transmits through queue N on CPU N (XPS, as drivers of
//! multi-queue NICs set it up), and each class sends four TCP flows from a client pinned to a
//! CPU of its own, whose packets the gateway forwards on that CPU.
//! Timing (TCG, 2 vCPUs): about 40 s of VM time.

use std::process::Child;

use shaper_tests::{
    gateway::{receiver_intervals, require_fq, wire_rate, Topology},
    sh, Netns,
};

/// A veth pair with two transmit and two receive queues on each end.
fn veth2(a: &Netns, a_if: &str, a_addr: &[&str], b: &Netns, b_if: &str, b_addr: &[&str]) {
    let queues = ["numtxqueues", "2", "numrxqueues", "2"];
    let mut args = vec!["ip", "link", "add", a_if, "netns", &a.name];
    args.extend(queues);
    args.extend(["type", "veth", "peer", "name", b_if, "netns", &b.name]);
    args.extend(queues);
    sh(&args);
    for (ns, ifname, addrs) in [(a, a_if, a_addr), (b, b_if, b_addr)] {
        for addr in addrs {
            ns.sh(&["ip", "addr", "add", addr, "dev", ifname]);
        }
        ns.sh(&["ip", "link", "set", ifname, "up"]);
    }
}

/// `Topology::new`'s namespaces and routes, with two-queue veths.
fn topology(tag: &str) -> Topology {
    let lan = Netns::new(&format!("{tag}-lan"));
    let gw = Netns::new(&format!("{tag}-gw"));
    let srv = Netns::new(&format!("{tag}-srv"));
    veth2(&lan, "eth0", &["10.1.0.2/24", "10.1.0.3/24"], &gw, "lan0", &["10.1.0.1/24"]);
    veth2(&gw, "wan0", &["10.2.0.1/24"], &srv, "eth0", &["10.2.0.2/24"]);
    lan.sh(&["ip", "route", "add", "default", "via", "10.1.0.1"]);
    srv.sh(&["ip", "route", "add", "10.1.0.0/24", "via", "10.2.0.1"]);
    gw.sh(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
    for (queue, cpus) in [(0, "1"), (1, "2")] {
        let path = format!("/sys/class/net/wan0/queues/tx-{queue}/xps_cpus");
        gw.sh(&["sh", "-c", &format!("echo {cpus} > {path}")]);
    }
    let dir = std::env::temp_dir().join(tag);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch directory");
    Topology { lan, gw, srv, dir }
}

/// Bytes each `fq` under shaper's `mq` sent, by the queue it serves (`tc -s qdisc`).
fn sent_per_queue(topo: &Topology) -> Vec<(String, u64)> {
    let out = topo.gw.sh(&["tc", "-s", "qdisc", "show", "dev", "wan0"]);
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut per_queue = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.get(1) != Some(&"fq") {
            continue;
        }
        let parent = words.iter().skip_while(|w| **w != "parent").nth(1).map_or("?", |p| *p).to_owned();
        let sent = lines
            .next()
            .and_then(|l| l.split_whitespace().skip_while(|w| *w != "Sent").nth(1).and_then(|b| b.parse().ok()))
            .unwrap_or_else(|| panic!("no Sent line after {line:?} in {text}"));
        per_queue.push((parent, sent));
    }
    per_queue
}

#[test]
fn on_two_transmit_queues_mq_gets_an_fq_per_queue_and_the_classes_keep_their_rates() {
    require_fq();
    let topo = topology("shaper-vm-mq");
    // c2 and c3 held to their ceilings (2 and 3 mbit/s) on a 100 mbit/s link.
    let mut daemon = topo.shaperd(super::STATIC_CONFIG);
    let qdisc = String::from_utf8_lossy(&topo.gw.sh(&["tc", "qdisc", "show", "dev", "wan0"]).stdout).into_owned();
    assert!(qdisc.contains("qdisc mq 5a1f: root"), "shaperd puts its mq at the root: {qdisc}\n{}", daemon.log());
    for queue in ["5a1f:1", "5a1f:2"] {
        assert!(qdisc.contains(&format!("parent {queue}")), "an fq on queue {queue}: {qdisc}");
    }
    let seconds = 20;
    let flows = [("c2", "10.1.0.2", 5701, 2e6, "0"), ("c3", "10.1.0.3", 5702, 3e6, "1")];
    let servers: Vec<Child> = flows.iter().map(|f| topo.iperf_server(f.2)).collect();
    let clients: Vec<Child> =
        flows.iter().map(|f| topo.iperf_client_with(f.1, f.2, seconds, "1", &["-P", "4", "-A", f.4])).collect();
    let mut failures = Vec::new();
    for (flow, client) in flows.iter().zip(clients) {
        let rate = wire_rate(&receiver_intervals(client), 4.0, f64::from(seconds) - 1.0);
        let error = rate / flow.3 - 1.0;
        println!("class {}: {:.3} mbit/s over four flows ({:+.2} %)", flow.0, rate / 1e6, error * 100.0);
        if error.abs() > 0.02 {
            failures.push(format!("{}: {:.3} mbit/s ({:+.2} %)", flow.0, rate / 1e6, error * 100.0));
        }
    }
    for mut s in servers {
        let _ = s.wait();
    }
    let per_queue = sent_per_queue(&topo);
    println!("bytes sent per queue: {per_queue:?}");
    let busy = per_queue.iter().filter(|(_, sent)| *sent > 1_000_000).count();
    assert!(busy >= 2, "traffic left through both queues: {per_queue:?}");
    assert!(failures.is_empty(), "classes off their rates by more than 2 %: {failures:?}\n{}", daemon.log());
    let log = daemon.stop();
    let qdisc = String::from_utf8_lossy(&topo.gw.sh(&["tc", "qdisc", "show", "dev", "wan0"]).stdout).into_owned();
    assert!(!qdisc.contains("5a1f:"), "shaperd removes its mq on stop: {qdisc}\n{log}");
}
