//! What a shaperd leaves for the next one, when the next one is not the same: a new map
//! layout (an upgrade), an interface taken out of the configuration between the two, and a
//! stop after a takeover.

use std::path::Path;

use shaper_common::MAP_LAYOUT_VERSION;
use shaper_tests::gateway::{receiver_intervals, require_fq, wire_rate, Topology};

use super::{egress_filters, topology};

/// c2 at 2 mbit/s on wan0, and lan0 shaped too.
const BOTH: &str = r#"
[[interface]]
name = "wan0"
rate = "20mbit"
default = "rest"

[[interface]]
name = "lan0"
rate = "20mbit"
default = "lan_rest"

[[class]]
name = "rest"
interface = "wan0"
rate = "1mbit"

[[class]]
name = "c2"
interface = "wan0"
rate = "2mbit"
ceil = "2mbit"

[[class]]
name = "lan_rest"
interface = "lan0"
rate = "1mbit"

[[rule]]
class = "c2"
src = "10.1.0.2"
"#;

/// The root and clsact qdiscs of `iface` in the gateway, as `tc qdisc show` prints them.
fn qdiscs(topo: &Topology, iface: &str) -> String {
    String::from_utf8_lossy(&topo.gw.sh(&["tc", "qdisc", "show", "dev", iface]).stdout).into_owned()
}

/// The map layouts pinned under the pin directory (`v<N>`).
fn layouts(pin_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> =
        std::fs::read_dir(pin_dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).collect();
    names.sort();
    names
}

/// A shaperd shapes wan0 and lan0 and is killed; its pins are made to look like an older map
/// layout's, and the next shaperd's configuration has wan0 only. The new one attaches to wan0
/// in place of the old program (one attachment), retires the older layout's pins, gives lan0
/// back (no program, no fq, no clsact: they used to stay, shaping lan0 with stale maps), and
/// shapes wan0; stopped, it removes the clsact qdisc the first one added on wan0 (which a
/// shaperd that took the datapath over used to leave).
#[test]
fn the_next_shaperd_takes_over_what_it_shapes_and_gives_back_the_rest() {
    require_fq();
    let topo = topology("shaper-vm-upgrade", &["10.1.0.2"]);
    let mut first = topo.shaperd(BOTH);
    // clsact before 6.6, TCX links (pinned in the layout's directory) after.
    let clsact = shaper::bpf::Datapath::attach_mode() == shaper::bpf::AttachMode::Clsact;
    for iface in ["wan0", "lan0"] {
        assert_eq!(egress_filters(&topo, iface), 1, "{iface}");
        let q = qdiscs(&topo, iface);
        assert!(q.contains("qdisc fq 5a1f:") && q.contains("clsact") == clsact, "{iface}: {q}");
    }
    first.kill();
    let pin_dir = topo.pin_dir();
    let current = format!("v{MAP_LAYOUT_VERSION}");
    let older = format!("v{}", MAP_LAYOUT_VERSION - 1);
    std::fs::rename(pin_dir.join(&current), pin_dir.join(&older)).expect("renaming the layout's pin directory");
    assert_eq!(layouts(&pin_dir), std::slice::from_ref(&older));

    let wan_only = BOTH.replace("[[interface]]\nname = \"lan0\"\nrate = \"20mbit\"\ndefault = \"lan_rest\"\n", "");
    let wan_only = wan_only.replace("[[class]]\nname = \"lan_rest\"\ninterface = \"lan0\"\nrate = \"1mbit\"\n", "");
    let mut second = topo.shaperd(&wan_only);
    let log = second.log();
    assert_eq!(egress_filters(&topo, "wan0"), 1, "wan0: the new program in the old one's place, not beside it");
    assert!(log.contains("removed the pins of an older map layout"), "{log}");
    assert_eq!(layouts(&pin_dir), [current], "only this layout's pins are left");
    assert_eq!(egress_filters(&topo, "lan0"), 0, "lan0 is no longer shaped: {log}");
    let lan = qdiscs(&topo, "lan0");
    assert!(!lan.contains("5a1f:") && !lan.contains("clsact"), "lan0 given back: {lan}\n{log}");
    assert!(log.contains("no longer in the configuration"), "{log}");

    let server = topo.iperf_server(5601);
    let intervals = receiver_intervals(topo.iperf_client("10.1.0.2", 5601, 10, "1"));
    drop(server);
    let rate = wire_rate(&intervals, 3.0, 9.0);
    println!("c2 after the upgrade: {:.3} mbit/s", rate / 1e6);
    assert!((rate / 2e6 - 1.0).abs() <= 0.03, "c2 shaped by the new shaperd: {:.3} mbit/s", rate / 1e6);

    let log = second.stop();
    let wan = qdiscs(&topo, "wan0");
    assert!(!wan.contains("5a1f:") && !wan.contains("clsact"), "wan0 given back on stop: {wan}\n{log}");
    assert!(!pin_dir.join(format!("v{MAP_LAYOUT_VERSION}")).exists(), "pins removed on stop");
}
