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
