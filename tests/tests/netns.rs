//! The tc program attached to a real veth on the host kernel, with real traffic between
//! network namespaces: per-class counters must add up to what crossed the wire. The host
//! kernel has no `sch_fq`, so this checks classification and counting, not pacing (the VM
//! tests do that), and that shaperd refuses to start there. Needs root.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "figures for reports and tolerances"
)]

use shaper::{
    bpf::{Datapath, Hook},
    rules::{compile, RuleSpec},
};
use shaper_common::{ClassConfig, IfaceConfig, IFACE_ENABLED};
use shaper_tests::{require_root, veth, Netns};

fn rx_bytes(ns: &Netns, ifname: &str) -> u64 {
    let out = ns.sh(&["cat", &format!("/sys/class/net/{ifname}/statistics/rx_bytes")]);
    String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
}

fn rule(index: u32, class: u32, src: &str) -> RuleSpec {
    RuleSpec { src: Some(src.parse().unwrap()), ..RuleSpec::new(index, class) }
}

#[test]
fn per_class_counters_match_bytes_that_crossed_the_veth() {
    require_root();
    let gw = Netns::new("shaper-t-gw");
    let lan = Netns::new("shaper-t-lan");
    veth(
        &gw,
        "lan0",
        &["10.77.0.1/24", "10.77.0.2/24", "fd77::1/64"],
        &lan,
        "eth0",
        &["10.77.0.100/24", "fd77::100/64"],
    );

    let (mut dp, ifindex) = std::thread::scope(|s| {
        s.spawn(|| {
            gw.enter();
            let mut dp = Datapath::load().expect("loading the tc program");
            // (/sys still shows the namespace it was mounted in; the ioctl asks this thread's.)
            // SAFETY: valid NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(c"lan0".as_ptr()) };
            dp.set_iface(
                ifindex,
                IfaceConfig { slot: 0, default_class: 3, flags: IFACE_ENABLED, ..IfaceConfig::default() },
            )
            .unwrap();
            let rules = [rule(0, 1, "10.77.0.1/32"), rule(1, 2, "10.77.0.2/32"), rule(2, 4, "fd77::/64")];
            dp.load_rules(&compile(&rules).unwrap()).unwrap();
            for class in 1..=4 {
                // Fast enough that nothing waits: this kernel would not hold packets anyway.
                dp.set_class(
                    class,
                    ClassConfig { rate_bytes: 1_000_000_000, horizon_ns: 1_000_000_000, ..ClassConfig::default() },
                )
                .unwrap();
            }
            dp.attach("lan0", Hook::Egress).expect("attaching to lan0");
            (dp, ifindex)
        })
        .join()
        .unwrap()
    });
    assert!(ifindex > 0);

    // Let the new links fall quiet (IPv6 duplicate address detection, MLD reports), then warm
    // up neighbour caches (ARP, NDP) so that only the measured pings cross below.
    std::thread::sleep(std::time::Duration::from_secs(3));
    gw.sh(&["ping", "-q", "-c", "1", "-I", "10.77.0.1", "10.77.0.100"]);
    gw.sh(&["ping", "-q", "-c", "1", "-I", "10.77.0.2", "10.77.0.100"]);
    gw.sh(&["ping", "-q", "-c", "1", "fd77::100"]);
    let before: Vec<_> = (0..=4).map(|c| dp.class_stats(c).unwrap()).collect();
    let rx_before = rx_bytes(&lan, "eth0");

    // 50 pings of 1000 bytes from each address; the replies flow the other way, unshaped.
    for src in ["10.77.0.1", "10.77.0.2"] {
        gw.sh(&["ping", "-q", "-c", "50", "-i", "0.002", "-s", "958", "-I", src, "10.77.0.100"]);
    }
    gw.sh(&["ping", "-q", "-c", "20", "-i", "0.002", "-s", "938", "fd77::100"]);
    let crossed = rx_bytes(&lan, "eth0") - rx_before;

    let delta: Vec<(u64, u64)> = (0..=4)
        .map(|c| {
            let s = dp.class_stats(c).unwrap();
            (s.packets - before[c as usize].packets, s.bytes - before[c as usize].bytes)
        })
        .collect();
    // 958 bytes of ICMP payload + 8 ICMP + 20 IPv4 + 14 Ethernet = 1000 bytes on the wire.
    assert_eq!(delta[1], (50, 50_000), "class 1 (10.77.0.1)");
    assert_eq!(delta[2], (50, 50_000), "class 2 (10.77.0.2)");
    // 938 + 8 ICMPv6 + 40 IPv6 + 14 = 1000.
    assert_eq!(delta[4], (20, 20_000), "class 4 (fd77::/64)");
    // Whatever else crossed went to the default class; nothing was lost or counted twice.
    let counted: u64 = delta.iter().map(|d| d.1).sum();
    assert_eq!(counted, crossed, "bytes counted by the program vs bytes received by the peer");
    assert_eq!(delta[0], (0, 0));
    let warm_up = before[1].packets + before[2].packets + before[4].packets;
    assert!(warm_up >= 3, "the warm-up pings were classified too: {warm_up}");
    drop(dp.detach_all());
}

#[test]
fn shaperd_refuses_to_start_without_fq() {
    require_root();
    let gw = Netns::new("shaper-t-nofq");
    let lan = Netns::new("shaper-t-nofq-lan");
    veth(&gw, "lan0", &["10.78.0.1/24"], &lan, "eth0", &["10.78.0.100/24"]);
    let dir = std::env::temp_dir().join("shaper-t-nofq");
    std::fs::create_dir_all(&dir).unwrap();
    let config = dir.join("shaper.toml");
    std::fs::write(
        &config,
        "[[interface]]\nname = \"lan0\"\nrate = \"10mbit\"\ndefault = \"rest\"\n\n[[class]]\nname = \"rest\"\nrate = \"10mbit\"\n",
    )
    .unwrap();
    let pins = "/sys/fs/bpf/shaper-t-nofq";
    let out = gw
        .command(shaper_tests::bin("shaperd").to_str().unwrap())
        .args(["--config", config.to_str().unwrap(), "--socket", dir.join("s.sock").to_str().unwrap()])
        .args(["--pin-dir", pins])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "shaperd must not run without fq: {stderr}");
    assert!(stderr.contains("sch_fq"), "the error names the missing qdisc: {stderr}");
    // Nothing left behind: no clsact filter, root qdisc untouched.
    let filters = gw.sh(&["tc", "filter", "show", "dev", "lan0", "egress"]);
    assert!(String::from_utf8_lossy(&filters.stdout).trim().is_empty());
    let qdisc = gw.sh(&["tc", "qdisc", "show", "dev", "lan0"]);
    assert!(String::from_utf8_lossy(&qdisc.stdout).contains("noqueue"), "{}", String::from_utf8_lossy(&qdisc.stdout));
    assert!(!std::path::Path::new(pins).exists(), "the pins it made are removed");
}

/// The TCX links, system-wide, whose program is shaper's (link info does not name the
/// interface; the tests run one at a time).
fn shaper_tcx_links() -> usize {
    use aya::programs::{links::LinkType, loaded_links};
    let ours: std::collections::HashSet<u32> = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .filter(|p| p.name_as_str() == Some(shaper_common::PROGRAM_NAME))
        .map(|p| p.id())
        .collect();
    loaded_links()
        .filter_map(Result::ok)
        .filter(|l| l.link_type().ok() == Some(LinkType::Tcx) && ours.contains(&l.program_id()))
        .count()
}

/// A datapath pinned under bpffs outlives its process and is taken over by the next one:
/// the TCX link gets the new program in place (no second link), the rules, rates and
/// counters carry on, and the last one to stop removes everything.
#[test]
fn pinned_datapath_is_taken_over_in_place() {
    require_root();
    let gw = Netns::new("shaper-t-pin");
    let lan = Netns::new("shaper-t-pin-lan");
    veth(&gw, "lan0", &["10.79.0.1/24"], &lan, "eth0", &["10.79.0.100/24"]);
    let root = std::path::PathBuf::from("/sys/fs/bpf/shaper-t-pin");
    let _ = std::fs::remove_dir_all(&root);
    std::thread::scope(|s| {
        s.spawn(|| {
            gw.enter();
            // SAFETY: valid NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(c"lan0".as_ptr()) };
            let baseline = shaper_tcx_links();
            // Class arrays sized for 2000 classes (4096 slots), so that a class id above the
            // fewest slots (1024) is shaped, pinned and taken over.
            let big: u32 = 3000;
            let (mut first, adopted) = Datapath::load_pinned(&root, 2000).expect("loading with pins");
            assert!(!adopted);
            assert_eq!(first.class_slots(), 4096);
            first
                .set_iface(
                    ifindex,
                    IfaceConfig { slot: 0, default_class: 3, flags: IFACE_ENABLED, ..IfaceConfig::default() },
                )
                .unwrap();
            first.load_rules(&compile(&[rule(0, big, "10.79.0.1/32")]).unwrap()).unwrap();
            let fast = ClassConfig { rate_bytes: 1_000_000_000, horizon_ns: 1_000_000_000, ..ClassConfig::default() };
            first.set_class(big, fast).unwrap();
            let (_, took_over) = first.attach("lan0", Hook::Egress).unwrap();
            assert!(!took_over);
            gw.sh(&["ping", "-q", "-c", "5", "-i", "0.01", "10.79.0.100"]);
            let counted = first.class_stats(big).unwrap().packets;
            assert!(counted >= 5, "{counted}");
            // The process "exits" leaving everything in place.
            first.leave_in_place();
            drop(first);
            gw.sh(&["ping", "-q", "-c", "5", "-i", "0.01", "10.79.0.100"]);

            // Asked for the fewest slots, it keeps the arrays it takes over, at their size.
            let (mut second, adopted) = Datapath::load_pinned(&root, 0).expect("taking over the pins");
            assert!(adopted, "the maps an earlier process pinned are taken over");
            assert_eq!(second.class_slots(), 4096, "the class arrays taken over keep their slots");
            assert!(second.class_stats(big).unwrap().packets >= counted + 5, "shaping went on without a process");
            assert_eq!(second.class_config(big).unwrap(), fast.with_byte_ns(), "the rates are the ones left");
            let beyond = second.set_class(4096, fast).unwrap_err().to_string();
            assert_eq!(beyond, "class id 4096 is out of range: the class arrays hold 4096 classes");
            let (_, took_over) = second.attach("lan0", Hook::Egress).unwrap();
            assert!(took_over, "the pinned link is reused");
            assert_eq!(shaper_tcx_links(), baseline + 1, "no second attachment");
            // A new rule set goes into the bank the first process did not leave active.
            second.load_rules(&compile(&[rule(0, 2, "10.79.0.1/32")]).unwrap()).unwrap();
            second.set_class(2, fast).unwrap();
            gw.sh(&["ping", "-q", "-c", "5", "-i", "0.01", "10.79.0.100"]);
            assert!(second.class_stats(2).unwrap().packets >= 5);
            second.detach_all().unwrap();
            second.unpin_maps().unwrap();
            assert_eq!(shaper_tcx_links(), baseline);
        })
        .join()
        .unwrap();
    });
    assert!(!root.exists(), "nothing left under bpffs");
}

#[test]
fn interfaces_without_a_link_layer_header_are_told_apart() {
    require_root();
    let ns = Netns::new("shaper-netdev");
    ns.sh(&["ip", "tuntap", "add", "dev", "tun0", "mode", "tun"]);
    ns.sh(&["ip", "link", "add", "veth0", "type", "veth", "peer", "name", "veth1"]);
    std::thread::scope(|s| {
        s.spawn(|| {
            // The lookups ask the calling thread's namespace, where these interfaces are.
            ns.enter();
            assert!(shaper::netdev::is_l3("tun0"), "a tun device hands over IP packets");
            assert!(!shaper::netdev::is_l3("veth0"), "a veth carries Ethernet frames");
            assert!(!shaper::netdev::is_l3("lo"));
            assert!(shaper::netdev::index("tun0").is_some());
            assert_eq!(shaper::netdev::index("tun1"), None);
        })
        .join()
        .unwrap();
    });
}

#[test]
fn the_pin_directory_is_held_by_one_shaperd_at_a_time() {
    require_root();
    let root = std::path::PathBuf::from("/sys/fs/bpf/shaper-test-lock");
    let _ = std::fs::remove_dir_all(&root);
    let held = shaper::bpf::PinLock::take(&root).expect("the first lock");
    match shaper::bpf::PinLock::take(&root) {
        Err(shaper::bpf::BpfError::PinsInUse { path, holder }) => {
            assert_eq!(path, root);
            assert_eq!(holder, Some(std::process::id()), "/proc/locks names the holder");
        }
        other => panic!("a second lock was not refused: {other:?}"),
    }
    let message = shaper::bpf::PinLock::take(&root).unwrap_err().to_string();
    assert!(message.contains(&format!("in use by another shaperd (pid {})", std::process::id())), "{message}");
    drop(held);
    let again = shaper::bpf::PinLock::take(&root).expect("taken again once released");
    drop(again);
    std::fs::remove_dir(&root).unwrap();
}
