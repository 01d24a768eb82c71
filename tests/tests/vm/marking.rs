//! DSCP marking as seed 002's `DiffServ` marker does it: a class's packets within its
//! guaranteed rate leave with one DSCP (`set_dscp`), those beyond it with a lower one
//! (`set_dscp_over`). The server counts what arrives per DSCP with nftables counters, so the
//! marks are read as the next hop sees them. Timing (TCG, 2 vCPUs): about 40 s of VM time.

use shaper_tests::gateway::{receiver_intervals, require_fq, wire_rate};

use super::topology;

/// alex: 2 mbit/s guaranteed, may borrow up to the link; in profile AF11, beyond CS1.
const MARKING_CONFIG: &str = r#"
[[interface]]
name = "wan0"
rate = "10mbit"
default = "guest"

[[class]]
name = "alex"
rate = "2mbit"
ceil = "10mbit"
set_dscp = "af11"
set_dscp_over = "cs1"

[[class]]
name = "guest"
rate = "8mbit"
ceil = "10mbit"
set_dscp = "wash"

[[rule]]
class = "alex"
src = "10.1.0.2"
"#;

/// Bytes the server's nftables counter `name` counted.
fn counted(topo: &shaper_tests::gateway::Topology, name: &str) -> u64 {
    let out = topo.srv.sh(&["nft", "list", "counter", "inet", "marks", name]);
    let text = String::from_utf8_lossy(&out.stdout);
    shaper_tests::nft_value(&text, "bytes").unwrap_or_else(|| panic!("counter {name}: {text}"))
}

#[test]
fn packets_beyond_the_guaranteed_rate_leave_re_marked() {
    require_fq();
    let topo = topology("shaper-vm-marking", &["10.1.0.2", "10.1.0.9"]);
    topo.srv.nft(&[
        "add table inet marks",
        "add counter inet marks af11",
        "add counter inet marks cs1",
        "add counter inet marks other",
        "add counter inet marks guest",
        "add chain inet marks in { type filter hook input priority 0 ; }",
        "add rule inet marks in ip saddr 10.1.0.2 ip dscp af11 counter name af11",
        "add rule inet marks in ip saddr 10.1.0.2 ip dscp cs1 counter name cs1",
        "add rule inet marks in ip saddr 10.1.0.9 ip dscp != cs0 counter name other",
        "add rule inet marks in ip saddr 10.1.0.9 counter name guest",
    ]);
    let daemon = topo.shaperd(MARKING_CONFIG);
    // alex alone, greedy: 2 mbit/s of it in profile, the rest (8 mbit/s) out. The guest
    // sends EF-marked packets, which leave washed.
    let seconds = 12;
    let server = topo.iperf_server(5401);
    let guest_server = topo.iperf_server(5402);
    let guest = topo.iperf_client_with("10.1.0.9", 5402, seconds, "1", &["-u", "-b", "200k", "--tos", "184"]);
    let alex = topo.iperf_client("10.1.0.2", 5401, seconds, "1");
    let rate = wire_rate(&receiver_intervals(alex), 3.0, f64::from(seconds) - 1.0);
    let _ = receiver_intervals(guest);
    for mut s in [server, guest_server] {
        let _ = s.wait();
    }
    let (af11, cs1, other) = (counted(&topo, "af11"), counted(&topo, "cs1"), counted(&topo, "other"));
    let in_profile = af11 as f64 / (af11 + cs1) as f64;
    println!(
        "alex {:.3} mbit/s; IP bytes in profile (AF11) {af11}, out (CS1) {cs1}: {:.1} % in profile (2 of {:.2} mbit/s: {:.1} %); guest packets not washed: {other} B",
        rate / 1e6,
        in_profile * 100.0,
        rate / 1e6,
        2e6 / rate * 100.0
    );
    let expected = 2e6 / rate;
    assert!(
        (in_profile - expected).abs() < 0.03,
        "in profile {:.3} of alex's bytes, expected {expected:.3}\n{}",
        in_profile,
        daemon.log()
    );
    assert!(af11 > 0 && cs1 > 0, "both marks seen: {af11} / {cs1}");
    let guest = counted(&topo, "guest");
    assert!(guest > 100_000, "the guest's EF-marked stream arrived: {guest} B");
    assert_eq!(other, 0, "every guest packet left washed (DSCP 0)");
}
