//! Interfaces that come and go under a running shaperd: `wan0` goes down and up, is deleted
//! and created again (a PPP link or a USB modem that reconnects gets a new index, with no
//! `fq` and no filter), is renamed away and another interface renamed into its place, and
//! changes its MTU. After each, a greedy TCP flow in a 2 mbit/s class is shaped again at its
//! rate, and a final stop gives the last `wan0` back what it had.

use std::{
    thread::sleep,
    time::{Duration, Instant},
};

use shaper_tests::{
    gateway::{goodput, receiver_intervals, require_fq, Topology, WIRE_PER_GOODPUT},
    sh,
};

// One 2 mbit/s class for 10.1.0.2 on wan0.
use super::{egress_filters, metric, topology, KILL_CONFIG as CONFIG};

/// Length of each flow, and the steady part measured (after TCP's start, before the end).
const FLOW: u32 = 11;
const FROM: f64 = 3.0;
const TO: f64 = 10.0;

/// Whether wan0 in the gateway has shaper's fq (handle `5a1f:`) at its root and the program
/// attached at egress.
fn shaped(topo: &Topology) -> bool {
    let out = topo.gw.command("tc").args(["qdisc", "show", "dev", "wan0", "root"]).output().expect("running tc");
    out.status.success() && String::from_utf8_lossy(&out.stdout).contains("qdisc fq 5a1f:") && attached(topo, "wan0")
}

/// Whether the program is attached at egress of `iface` (which must exist).
fn attached(topo: &Topology, iface: &str) -> bool {
    egress_filters(topo, iface) == 1
}

/// Polls until wan0 is shaped; returns how long it took from `since`, or `None` after 5 s.
fn wait_until_shaped(topo: &Topology, since: Instant) -> Option<Duration> {
    loop {
        if shaped(topo) {
            return Some(since.elapsed());
        }
        if since.elapsed() > Duration::from_secs(5) {
            return None;
        }
        sleep(Duration::from_millis(10));
    }
}

/// Gives the gateway's `iface` (the wan side of a new veth pair) and the server's `eth0` the
/// addresses and the route the topology set up at first, and brings both up.
fn configure_new_wan(topo: &Topology, iface: &str) {
    topo.gw.sh(&["ip", "addr", "add", "10.2.0.1/24", "dev", iface]);
    topo.gw.sh(&["ip", "link", "set", iface, "up"]);
    topo.srv.sh(&["ip", "addr", "add", "10.2.0.2/24", "dev", "eth0"]);
    topo.srv.sh(&["ip", "link", "set", "eth0", "up"]);
    topo.srv.sh(&["ip", "route", "add", "10.1.0.0/24", "via", "10.2.0.1"]);
}

/// A new veth pair: `iface` in the gateway, `eth0` in the server's namespace, both down.
pub(super) fn new_veth(topo: &Topology, iface: &str) {
    sh(&[
        "ip",
        "link",
        "add",
        iface,
        "netns",
        &topo.gw.name,
        "type",
        "veth",
        "peer",
        "name",
        "eth0",
        "netns",
        &topo.srv.name,
    ]);
}

/// Runs a greedy TCP flow from 10.1.0.2 through wan0 and returns its wire rate (bit/s) over
/// the steady part, for frames of `mtu` bytes.
fn flow_rate(topo: &Topology, port: u16, mtu: f64) -> f64 {
    let server = topo.iperf_server(port);
    let intervals = receiver_intervals(topo.iperf_client("10.1.0.2", port, FLOW, "1"));
    drop(server);
    // TCP with timestamps: 52 bytes of headers in each IP packet, 14 of Ethernet around it.
    let wire_per_goodput =
        if (mtu - 1500.0).abs() < f64::EPSILON { WIRE_PER_GOODPUT } else { (mtu + 14.0) / (mtu - 52.0) };
    goodput(&intervals, FROM, TO) * wire_per_goodput
}

const REATTACHMENTS: &str = r#"shaper_interface_reattachments_total{interface="wan0"}"#;
const ATTACHED: &str = r#"shaper_interface_attached{interface="wan0"}"#;

/// A figure of one phase: what was done, how long until shaped again, the rate after, and
/// what one check of [`shaped`] took just before (three `tc` processes, whose start costs a
/// few hundred ms each under QEMU's emulation, more when the VM is slow: the measure's own
/// resolution).
struct Phase {
    what: &'static str,
    took: Option<Duration>,
    rate: f64,
    check: Duration,
}

/// How long one check of [`shaped`] takes now, on a wan0 that is shaped.
fn check_cost(topo: &Topology) -> Duration {
    let start = Instant::now();
    assert!(shaped(topo), "wan0 shaped before the phase");
    start.elapsed()
}

/// Whether shaperd gave old0 back (no fq of shaper's, no clsact, no program) within 3 s, and
/// old0's qdiscs as last seen. (A single look 300 ms after the rename found shaper's fq and
/// clsact still there once the test's own commands had become faster; shaperd logged the
/// suspension a moment later.)
fn old0_given_back(topo: &Topology) -> (bool, String) {
    let renamed_at = Instant::now();
    loop {
        let old = String::from_utf8_lossy(&topo.gw.sh(&["tc", "qdisc", "show", "dev", "old0"]).stdout).into_owned();
        let given_back = !old.contains("5a1f:") && !old.contains("clsact") && !attached(topo, "old0");
        if given_back || renamed_at.elapsed() > Duration::from_secs(3) {
            println!("  old0 given back after {:.0} ms: {given_back}", renamed_at.elapsed().as_secs_f64() * 1e3);
            return (given_back, old);
        }
        sleep(Duration::from_millis(50));
    }
}

#[test]
fn interfaces_that_come_and_go_are_shaped_again_within_a_second() {
    require_fq();
    let topo = topology("shaper-vm-links", &["10.1.0.2"]);
    let mut daemon = topo.shaperd(CONFIG);
    assert!(shaped(&topo), "shaped at start");
    // The figures are taken as the phases run and asserted at the end, after all of them are
    // printed: a shaperd that does not follow its interfaces shows what it leaves unshaped.
    let mut metrics = vec![("at start", metric(&topo, REATTACHMENTS), metric(&topo, ATTACHED))];
    let mut phases = Vec::new();

    // (a) Down for a second and up again: fq and the filter stay, and are checked.
    let check = check_cost(&topo);
    topo.gw.sh(&["ip", "link", "set", "wan0", "down"]);
    sleep(Duration::from_secs(1));
    topo.gw.sh(&["ip", "link", "set", "wan0", "up"]);
    let took = wait_until_shaped(&topo, Instant::now());
    phases.push(Phase { what: "down 1 s, up", took, rate: flow_rate(&topo, 7601, 1500.0), check });

    // (b) Deleted and created again with the same name and addresses: a new index.
    let check = check_cost(&topo);
    topo.gw.sh(&["ip", "link", "del", "wan0"]);
    sleep(Duration::from_millis(300));
    metrics.push(("wan0 deleted", metric(&topo, REATTACHMENTS), metric(&topo, ATTACHED)));
    let created = Instant::now();
    new_veth(&topo, "wan0");
    let took = wait_until_shaped(&topo, created);
    configure_new_wan(&topo, "wan0");
    phases.push(Phase { what: "deleted, created again", took, rate: flow_rate(&topo, 7602, 1500.0), check });
    metrics.push(("wan0 created again", metric(&topo, REATTACHMENTS), metric(&topo, ATTACHED)));

    // (c) Renamed away: old0 is not shaped any more, and gets its root qdisc back. Then a new
    // interface created as tmp0 is renamed to wan0.
    let check = check_cost(&topo);
    topo.gw.sh(&["ip", "link", "set", "wan0", "down"]);
    topo.gw.sh(&["ip", "link", "set", "wan0", "name", "old0"]);
    let (old_given_back, old) = old0_given_back(&topo);
    topo.gw.sh(&["ip", "link", "del", "old0"]);
    new_veth(&topo, "tmp0");
    let renamed = Instant::now();
    topo.gw.sh(&["ip", "link", "set", "tmp0", "name", "wan0"]);
    let took = wait_until_shaped(&topo, renamed);
    configure_new_wan(&topo, "wan0");
    phases.push(Phase {
        what: "renamed away; tmp0 renamed to wan0",
        took,
        rate: flow_rate(&topo, 7603, 1500.0),
        check,
    });

    // (d) A smaller MTU: the flow's packets shrink (path MTU discovery) and stay shaped.
    let check = check_cost(&topo);
    let changed = Instant::now();
    topo.gw.sh(&["ip", "link", "set", "wan0", "mtu", "1400"]);
    let took = wait_until_shaped(&topo, changed);
    phases.push(Phase { what: "MTU 1500 -> 1400", took, rate: flow_rate(&topo, 7604, 1400.0), check });
    metrics.push(("at the end", metric(&topo, REATTACHMENTS), metric(&topo, ATTACHED)));

    let log = daemon.log();
    println!("c2 (2 mbit/s) through wan0 after:");
    for p in &phases {
        println!(
            "  {:<36} shaped again after {:>8} (a check takes {:>4.0} ms), flow at {:.3} mbit/s ({:+.2} %)",
            p.what,
            p.took.map_or_else(|| "never".to_owned(), |d| format!("{:.0} ms", d.as_secs_f64() * 1e3)),
            p.check.as_secs_f64() * 1e3,
            p.rate / 1e6,
            (p.rate / 2e6 - 1.0) * 100.0
        );
    }
    for (when, reattachments, attached) in &metrics {
        println!("  metrics {when}: reattachments {reattachments:?}, attached {attached:?}");
    }
    let reattached: Vec<&str> = log.lines().filter(|l| l.contains("re-attached")).collect();
    for line in log.lines().filter(|l| l.contains("re-attached") || l.contains("interface gone") || l.contains("MTU")) {
        println!("  log: {line}");
    }
    for p in &phases {
        let took = p.took.unwrap_or_else(|| panic!("{}: wan0 not shaped again within 5 s\n{log}", p.what));
        // Within a second, beyond what checks take: a check that began just before shaperd
        // was done says so only at the next one, so two (shaperd's own time is in its log:
        // `took_ms`, asserted below). On 6.12 on a slow host, after (b): 2,808 ms, shaperd's
        // own 1,238, a check 1,139.
        assert!(
            took < Duration::from_secs(1) + 2 * p.check,
            "{}: shaped again only after {took:?} (a check takes {:?})",
            p.what,
            p.check
        );
        assert!((p.rate / 2e6 - 1.0).abs() <= 0.03, "{}: c2 at {:.3} mbit/s, not 2 (±3 %)", p.what, p.rate / 1e6);
    }
    // Counted once per new wan0: nothing was missing after down/up or the MTU change.
    let expected = [(0.0, 1.0), (0.0, 0.0), (1.0, 1.0), (2.0, 1.0)];
    for ((when, reattachments, attached), (r, a)) in metrics.iter().zip(expected) {
        assert_eq!((*reattachments, *attached), (Some(r), Some(a)), "metrics {when}\n{log}");
    }
    assert_eq!(reattached.len(), 2, "one re-attachment per new wan0: {log}");
    // Shaperd's own time from the event, within the same bound as the whole (a second, and
    // what the VM takes for a check at that moment): its netlink requests wait for the kernel
    // as the test's commands do. On a slow host one re-attachment took 1,109 ms, and in
    // another run the one after (b) took 1,246 ms (fq in place at 1,227) while a check took
    // 1,232 ms, and the one after (c) 22 ms; usually tens of ms.
    for (line, phase) in reattached.iter().zip(&phases[1..3]) {
        let ms: f64 = line.split("took_ms=").nth(1).and_then(|v| v.split_whitespace().next()?.parse().ok()).unwrap();
        let bound = 1000.0 + phase.check.as_secs_f64() * 1e3;
        assert!(ms < bound, "{}: re-attached {ms} ms after the event (bound {bound:.0} ms): {line}", phase.what);
    }
    assert!(log.contains("link down") && log.contains("link up") && log.contains("MTU changed"), "{log}");
    assert!(old_given_back, "old0 given back: {old}\n{log}");

    // A stop gives the last wan0 back what it had, and nothing fails on the ones before it.
    let log = daemon.stop();
    let qdisc = String::from_utf8_lossy(&topo.gw.sh(&["tc", "qdisc", "show", "dev", "wan0"]).stdout).into_owned();
    assert!(!qdisc.contains("qdisc fq") && !qdisc.contains("clsact"), "wan0 after the stop: {qdisc}\n{log}");
    assert_eq!(egress_filters(&topo, "wan0"), 0, "detached on stop");
    let bad: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" ERROR ") || l.contains(" WARN ") && !l.contains("interface gone"))
        .collect();
    assert!(bad.is_empty(), "errors or warnings in the log: {bad:#?}\n{log}");
}
