//! DSL framing on a real link: a class on an ATM line is paced by the cells its packets take,
//! so it delivers the payload those cells leave room for, not what its rate would carry on
//! Ethernet.

use shaper_tests::gateway::{goodput, receiver_intervals, require_fq};

use super::topology;

/// One class of 1 mbit/s for the LAN client; `FRAMING` is replaced by the interface's
/// link-layer keys.
const CONFIG: &str = r#"
[[interface]]
name = "wan0"
rate = "100mbit"
default = "other"
FRAMING

[[class]]
name = "c1"
rate = "1mbit"
ceil = "1mbit"

[[class]]
name = "other"
rate = "1mbit"
ceil = "1mbit"

[[rule]]
class = "c1"
src = "10.1.0.2"
"#;

/// UDP payload of 100-byte frames (+ UDP 8, IPv4 20, Ethernet 14).
const PAYLOAD: u32 = 58;

/// tc-stab's example: a 100-byte frame takes 3 cells (159 bytes) on an ATM line, so a class
/// of 1 mbit/s carries 786 such packets a second there, not 1250; their payload, 365 kbit/s
/// rather than 580. Both measured by the iperf3 receiver, from a flood of 1 mbit/s of payload.
#[test]
fn an_atm_class_carries_the_payload_its_cells_leave_room_for() {
    require_fq();
    for (tag, framing, wire_bytes) in [("eth", "", 100.0), ("atm", "linklayer = \"atm\"", 159.0)] {
        let topo = topology(&format!("shaper-vm-ll-{tag}"), &["10.1.0.2"]);
        let _shaperd = topo.shaperd(&CONFIG.replace("FRAMING", framing));
        let server = topo.iperf_server(5601);
        let client = topo.iperf_client_with("10.1.0.2", 5601, 8, "1", &["-u", "-b", "1M", "-l", &PAYLOAD.to_string()]);
        let intervals = receiver_intervals(client);
        drop(server);
        let rate = goodput(&intervals, 2.0, 8.0);
        let expected = 1e6 / wire_bytes * f64::from(PAYLOAD);
        println!(
            "{tag}: {:.1} kbit/s of payload in 100-byte frames ({wire_bytes} bytes on the line), expected {:.1}",
            rate / 1e3,
            expected / 1e3
        );
        topo.print_class_counters();
        assert!(
            (rate / expected - 1.0).abs() <= 0.03,
            "{tag}: {:.1} kbit/s of payload, not {:.1} (±3 %)",
            rate / 1e3,
            expected / 1e3
        );
    }
}

/// A device with no Ethernet header (`ppp0` on a DSL line; here an IPIP tunnel, which hands
/// its qdisc IP packets just as PPP does): shaped directly, its packets are classified on
/// their IP header and counted from it. With the 10 bytes of `PPPoA` (VC-mux) on ATM, a
/// 58-byte UDP payload's 86-byte packet takes 96 bytes, two cells, 106 bytes on the line: a
/// class of 1 mbit/s carries 547 kbit/s of such payload (on an Ethernet device the same
/// packets would count 14 bytes more, 3 cells).
#[test]
fn a_device_without_an_ethernet_header_is_shaped_by_its_ip_packets() {
    require_fq();
    let topo = topology("shaper-vm-ll-l3", &["10.1.0.2"]);
    for (ns, local, remote, addr) in
        [(&topo.gw, "10.2.0.1", "10.2.0.2", "10.9.0.1/30"), (&topo.srv, "10.2.0.2", "10.2.0.1", "10.9.0.2/30")]
    {
        ns.sh(&["ip", "link", "add", "tun0", "type", "ipip", "local", local, "remote", remote]);
        ns.sh(&["ip", "addr", "add", addr, "dev", "tun0"]);
        ns.sh(&["ip", "link", "set", "tun0", "up"]);
    }
    topo.srv.sh(&["ip", "route", "replace", "10.1.0.0/24", "dev", "tun0"]);
    let config = CONFIG
        .replace("name = \"wan0\"", "name = \"tun0\"")
        .replace("FRAMING", "linklayer = \"atm\"\noverhead = 10\nreplace_qdisc = true");
    let mut shaperd = topo.shaperd(&config);
    let server = topo.iperf_server(5602);
    let client =
        topo.iperf_client_to("10.9.0.2", "10.1.0.2", 5602, 8, "1", &["-u", "-b", "1M", "-l", &PAYLOAD.to_string()]);
    let intervals = receiver_intervals(client);
    drop(server);
    let rate = goodput(&intervals, 2.0, 8.0);
    let expected = 1e6 / 106.0 * f64::from(PAYLOAD);
    println!("ipip tunnel, ATM, PPPoA: {:.1} kbit/s of payload, expected {:.1}", rate / 1e3, expected / 1e3);
    topo.print_class_counters();
    let bytes = |name: &str| topo.class_bytes(name);
    // Classified by the inner source on a device whose packets start at the IP header.
    assert!(bytes("c1") > 300_000, "the client's packets counted in c1: {} bytes", bytes("c1"));
    assert!(bytes("other") < bytes("c1") / 10, "other: {} bytes", bytes("other"));
    assert!(
        (rate / expected - 1.0).abs() <= 0.03,
        "{:.1} kbit/s of payload, not {:.1} (±3 %)",
        rate / 1e3,
        expected / 1e3
    );
    shaperd.stop();
}
