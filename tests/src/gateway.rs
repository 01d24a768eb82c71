//! A gateway on network namespaces, as the VM tests and the demo use it:
//!
//! ```text
//! lan (clients, several addresses) ──veth── gw: <lan_if> | <wan_if> (shaperd, egress) ──veth── srv (iperf3 servers)
//! ```
//! Clients send to the server; the gateway forwards and shapes on `wan_if` egress.

use std::{
    path::{Path, PathBuf},
    process::{Child, Command, Output, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{bin, veth, Netns};

/// Wire bytes per goodput byte for full-size TCP segments with timestamps on Ethernet:
/// 1448 bytes of payload travel in a 1514-byte frame.
pub const WIRE_PER_GOODPUT: f64 = 1514.0 / 1448.0;
/// The same for UDP datagrams of [`UDP_PAYLOAD`] bytes: 1472 + 8 + 20 + 14 = 1514.
pub const WIRE_PER_UDP_GOODPUT: f64 = 1514.0 / 1472.0;
/// UDP payload size that fills a 1500-byte MTU.
pub const UDP_PAYLOAD: &str = "1472";

/// The server's address.
pub const SERVER: &str = "10.2.0.2";

/// Panics unless the kernel has `sch_fq` (loading the module if needed) and we are root.
pub fn require_fq() {
    crate::require_root();
    let _ = Command::new("modprobe").arg("sch_fq").status();
    let probe = Netns::new("shaper-fq-probe");
    let out = probe.command("tc").args(["qdisc", "add", "dev", "lo", "root", "fq"]).output().expect("running tc");
    assert!(
        out.status.success(),
        "this needs a kernel with sch_fq (the host kernel here has none); `cargo xtask test` and \
         `cargo xtask demo` boot one in a VM: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The three namespaces and a scratch directory.
pub struct Topology {
    pub lan: Netns,
    pub gw: Netns,
    pub srv: Netns,
    pub dir: PathBuf,
}

impl Topology {
    /// Builds the topology. `lan_net` is the clients' /24 prefix (e.g. "10.1.0"), the gateway
    /// being `.1`; `client_addrs` are the clients' addresses in it.
    #[must_use]
    pub fn new(tag: &str, lan_if: &str, wan_if: &str, lan_net: &str, client_addrs: &[&str]) -> Self {
        let lan = Netns::new(&format!("{tag}-lan"));
        let gw = Netns::new(&format!("{tag}-gw"));
        let srv = Netns::new(&format!("{tag}-srv"));
        let cidrs: Vec<String> = client_addrs.iter().map(|a| format!("{a}/24")).collect();
        let cidrs: Vec<&str> = cidrs.iter().map(String::as_str).collect();
        let gw_addr = format!("{lan_net}.1");
        veth(&lan, "eth0", &cidrs, &gw, lan_if, &[&format!("{gw_addr}/24")]);
        veth(&gw, wan_if, &["10.2.0.1/24"], &srv, "eth0", &["10.2.0.2/24"]);
        lan.sh(&["ip", "route", "add", "default", "via", &gw_addr]);
        srv.sh(&["ip", "route", "add", &format!("{lan_net}.0/24"), "via", "10.2.0.1"]);
        gw.sh(&["sysctl", "-qw", "net.ipv4.ip_forward=1"]);
        // Clients and server negotiate ECN, as current stacks can, so that AQM marks rather
        // than drops their TCP packets.
        for ns in [&lan, &srv] {
            ns.sh(&["sysctl", "-qw", "net.ipv4.tcp_ecn=1"]);
        }
        let dir = std::env::temp_dir().join(tag);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("scratch directory");
        Self { lan, gw, srv, dir }
    }

    #[must_use]
    pub fn socket(&self) -> PathBuf {
        self.dir.join("shaper.sock")
    }

    /// Where this topology's shaperd pins its maps (one directory per topology, so that the
    /// daemons of different tests never take over each other's).
    #[must_use]
    pub fn pin_dir(&self) -> PathBuf {
        PathBuf::from("/sys/fs/bpf").join(self.dir.file_name().expect("a named scratch directory"))
    }

    /// A shaperd command in the gateway namespace, with the configuration `config` (TOML
    /// text, written to `<name>.toml` in the scratch directory), the control socket `socket`
    /// and this topology's pin directory.
    #[must_use]
    pub fn shaperd_command(&self, name: &str, config: &str, socket: &Path) -> Command {
        let path = self.dir.join(format!("{name}.toml"));
        std::fs::write(&path, config).expect("writing the configuration");
        let mut cmd = self.gw.command_net_only(bin("shaperd").to_str().expect("UTF-8 path"));
        cmd.args([
            "--config",
            path.to_str().expect("UTF-8 path"),
            "--socket",
            socket.to_str().expect("UTF-8 path"),
            "--pin-dir",
            self.pin_dir().to_str().expect("UTF-8 path"),
        ]);
        cmd
    }

    /// Starts shaperd in the gateway namespace with the configuration `config` (TOML text)
    /// and waits until it answers on its socket.
    pub fn shaperd(&self, config: &str) -> Daemon {
        let log = self.dir.join("shaperd.log");
        let child = self
            .shaperd_command("shaper", config, &self.socket())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).expect("log file"))
            .spawn()
            .expect("starting shaperd");
        let mut daemon = Daemon { child, log };
        let deadline = Instant::now() + Duration::from_mins(1);
        while Instant::now() < deadline {
            if let Ok(Some(status)) = daemon.child.try_wait() {
                panic!("shaperd exited with {status}: {}", daemon.log());
            }
            if self.ctl(&["status", "--json"]).status.success() {
                return daemon;
            }
            sleep(Duration::from_millis(200));
        }
        let status = self.ctl(&["status", "--json"]);
        panic!(
            "shaperd did not come up: log: {}\nshaperctl: {}",
            daemon.log(),
            String::from_utf8_lossy(&status.stderr)
        );
    }

    /// Runs shaperctl against this topology's daemon.
    #[must_use]
    pub fn ctl(&self, args: &[&str]) -> Output {
        Command::new(bin("shaperctl"))
            .arg("--socket")
            .arg(self.socket())
            .args(args)
            .output()
            .expect("running shaperctl")
    }

    /// `shaperctl status --json`.
    #[must_use]
    pub fn status(&self) -> Value {
        let out = self.ctl(&["status", "--json"]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).expect("status JSON")
    }

    /// `status` straight over the control socket (no shaperctl process: fast enough to poll
    /// every few milliseconds). Returns the classes array of the reply.
    #[must_use]
    pub fn status_now(&self) -> Value {
        use std::io::{BufRead as _, Write as _};
        let mut stream = std::os::unix::net::UnixStream::connect(self.socket()).expect("connecting to shaperd");
        stream.write_all(b"{\"cmd\":\"status\"}\n").expect("sending status");
        let mut line = String::new();
        std::io::BufReader::new(stream).read_line(&mut line).expect("reading the reply");
        let v: Value = serde_json::from_str(&line).expect("status JSON");
        v["Ok"]["status"]["classes"].clone()
    }

    /// The bytes class `name` counted so far ([`Self::status_now`]).
    #[must_use]
    pub fn class_bytes(&self, name: &str) -> u64 {
        let classes = self.status_now();
        let class = classes.as_array().and_then(|c| c.iter().find(|c| c["name"] == name));
        class.and_then(|c| c["bytes"].as_u64()).unwrap_or_else(|| panic!("no class {name} in {classes}"))
    }

    /// Prints each leaf class's counters as the daemon reports them: what a failing
    /// measurement needs to be explained (drops by reason, the host share, the queue delay).
    pub fn print_class_counters(&self) {
        println!("  class     bytes        packets  drops horizon  aqm  share  ecn  sparse  share(bit/s)  p99 delay");
        for c in self.status_now().as_array().into_iter().flatten().filter(|c| c["leaf"] == true) {
            println!(
                "  {:<8} {:>10} {:>10} {:>6} {:>7} {:>4} {:>6} {:>4} {:>7} {:>13} {:>6} us",
                c["name"].as_str().unwrap_or("?"),
                c["bytes"],
                c["packets"],
                c["drops"],
                c["drops_horizon"],
                c["drops_aqm"],
                c["drops_share"],
                c["ecn_marks"],
                c["sparse_packets"],
                c["share"],
                c["p99_delay_us"]
            );
        }
        let qdisc = self.gw.sh(&["tc", "-s", "qdisc", "show"]);
        for line in String::from_utf8_lossy(&qdisc.stdout).lines() {
            println!("  gw: {line}");
        }
    }

    /// Starts a one-shot iperf3 server (JSON output) on `port` in the server namespace and
    /// waits until it listens.
    #[must_use]
    #[expect(clippy::zombie_processes, reason = "the server is returned; the caller waits for it")]
    pub fn iperf_server(&self, port: u16) -> Child {
        let port = port.to_string();
        let mut c = self
            .srv
            .command("iperf3")
            .args(["-s", "-1", "-J", "-i", "0.5", "-p", &port])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting iperf3 -s");
        let deadline = Instant::now() + Duration::from_secs(20);
        let filter = format!("sport = :{port}");
        loop {
            let out = self.srv.command("ss").args(["-Hltn", &filter]).output().expect("running ss");
            if !String::from_utf8_lossy(&out.stdout).trim().is_empty() {
                return c;
            }
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                panic!("iperf3 -s on port {port} did not start listening");
            }
            sleep(Duration::from_millis(50));
        }
    }

    /// Starts a TCP iperf3 client from `src` to the server's `port` for `seconds`, reporting
    /// every `interval` seconds, with the receiver's JSON in its output.
    #[must_use]
    pub fn iperf_client(&self, src: &str, port: u16, seconds: u32, interval: &str) -> Child {
        self.iperf_client_with(src, port, seconds, interval, &[])
    }

    /// Like [`Self::iperf_client`], with more iperf3 options (`-u`, `-b RATE`, `-P N`...).
    #[must_use]
    pub fn iperf_client_with(&self, src: &str, port: u16, seconds: u32, interval: &str, extra: &[&str]) -> Child {
        self.iperf_client_to(SERVER, src, port, seconds, interval, extra)
    }

    /// Like [`Self::iperf_client_with`], to the server's address `server` (e.g. [`SERVER6`]).
    /// With `-R` the server sends (a download): [`download_intervals`] reads the client's side.
    #[must_use]
    pub fn iperf_client_to(
        &self,
        server: &str,
        src: &str,
        port: u16,
        seconds: u32,
        interval: &str,
        extra: &[&str],
    ) -> Child {
        let port = port.to_string();
        let seconds = seconds.to_string();
        let mut args =
            vec!["-c", server, "-B", src, "-p", &port, "-t", &seconds, "-i", interval, "-J", "--get-server-output"];
        args.extend_from_slice(extra);
        self.lan
            .command("iperf3")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting iperf3 -c")
    }
}

/// shaperd, stopped with SIGTERM on drop.
pub struct Daemon {
    child: Child,
    log: PathBuf,
}

impl Daemon {
    /// What shaperd logged so far.
    #[must_use]
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// shaperd's process id (nsenter execs shaperd in place), e.g. for its /proc/<pid>/status.
    #[must_use]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Sends `signal` to shaperd.
    pub fn signal(&self, signal: i32) {
        // SAFETY: kill(2) on our own child's pid (nsenter execs shaperd in place).
        unsafe { libc::kill(i32::try_from(self.child.id()).expect("pid"), signal) };
    }

    /// Kills shaperd with SIGKILL (no cleanup of any kind) and waits for it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Waits for shaperd to exit.
    pub fn wait(&mut self) -> std::process::ExitStatus {
        self.child.wait().expect("waiting for shaperd")
    }

    /// Whether shaperd is still running.
    pub fn is_running(&mut self) -> bool {
        self.child.try_wait().expect("polling shaperd").is_none()
    }

    /// Sends SIGTERM, waits, and returns the log; panics if shaperd did not exit cleanly.
    pub fn stop(&mut self) -> String {
        // SAFETY: kill(2) on our own child's pid.
        unsafe { libc::kill(i32::try_from(self.child.id()).expect("pid"), libc::SIGTERM) };
        let status = self.child.wait().expect("waiting for shaperd");
        let log = self.log();
        assert!(status.success(), "shaperd exited with {status}: {log}");
        log
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            // SAFETY: as in stop().
            unsafe { libc::kill(i32::try_from(self.child.id()).expect("pid"), libc::SIGTERM) };
            let _ = self.child.wait();
        }
    }
}

/// One receiver-side interval of an iperf3 run.
#[derive(Clone, Copy, Debug)]
pub struct Interval {
    pub start: f64,
    pub end: f64,
    /// Goodput, bits per second.
    pub bits_per_second: f64,
}

/// Waits for an iperf3 client and returns the receiver's intervals.
#[must_use]
pub fn receiver_intervals(client: Child) -> Vec<Interval> {
    let out = client.wait_with_output().expect("waiting for iperf3");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("iperf3 JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert!(v.get("error").is_none(), "iperf3: {}", v["error"]);
    receiver_side(&v)
}

/// Waits for an iperf3 client run with `-R` (the server sends, the client receives: a
/// download) and returns the intervals the client measured, the receiver's side.
#[must_use]
pub fn download_intervals(client: Child) -> Vec<Interval> {
    let out = client.wait_with_output().expect("waiting for iperf3");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("iperf3 JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert!(v.get("error").is_none(), "iperf3: {}", v["error"]);
    assert_eq!(v["start"]["test_start"]["reverse"], 1, "not a reverse (-R) run: {}", v["start"]);
    intervals_of(&v["intervals"])
}

/// The receiver's intervals in an iperf3 client's JSON (`--get-server-output`).
fn receiver_side(v: &Value) -> Vec<Interval> {
    intervals_of(&v["server_output_json"]["intervals"])
}

/// The summed intervals of one side of an iperf3 run (its JSON's `intervals` array).
fn intervals_of(intervals: &Value) -> Vec<Interval> {
    intervals
        .as_array()
        .unwrap_or_else(|| panic!("no intervals in {intervals}"))
        .iter()
        .map(|i| {
            let s = &i["sum"];
            Interval {
                start: s["start"].as_f64().expect("start"),
                end: s["end"].as_f64().expect("end"),
                bits_per_second: s["bits_per_second"].as_f64().expect("bits_per_second"),
            }
        })
        .collect()
}

/// Mean goodput (bit/s) over the intervals lying within [from, to] seconds.
#[must_use]
pub fn goodput(intervals: &[Interval], from: f64, to: f64) -> f64 {
    let sel: Vec<&Interval> = intervals.iter().filter(|i| i.start >= from - 1e-6 && i.end <= to + 0.05).collect();
    assert!(!sel.is_empty(), "no intervals in [{from}, {to}]");
    let bits: f64 = sel.iter().map(|i| i.bits_per_second * (i.end - i.start)).sum();
    let secs: f64 = sel.iter().map(|i| i.end - i.start).sum();
    bits / secs
}

/// Mean wire rate (bit/s) of a TCP flow over the intervals lying within [from, to] seconds.
#[must_use]
pub fn wire_rate(intervals: &[Interval], from: f64, to: f64) -> f64 {
    goodput(intervals, from, to) * WIRE_PER_GOODPUT
}

/// The full result of an iperf3 client run: the receiver's intervals and what the sender
/// itself sent.
#[derive(Clone, Debug)]
pub struct IperfResult {
    pub receiver: Vec<Interval>,
    /// The sender's mean goodput over the whole run, bits per second.
    pub sender_bits_per_second: f64,
    /// Segments the sender retransmitted (TCP only).
    pub retransmits: Option<u64>,
}

/// Waits for an iperf3 client and returns its receiver's intervals and its sender's rate.
#[must_use]
pub fn iperf_result(client: Child) -> IperfResult {
    let out = client.wait_with_output().expect("waiting for iperf3");
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("iperf3 JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    assert!(v.get("error").is_none(), "iperf3: {}", v["error"]);
    let receiver = receiver_side(&v);
    // TCP reports the sender's side as `sum_sent`, UDP as `sum`.
    let end = &v["end"];
    let sender = end["sum_sent"]["bits_per_second"].as_f64().or_else(|| end["sum"]["bits_per_second"].as_f64());
    IperfResult {
        receiver,
        sender_bits_per_second: sender.unwrap_or_else(|| panic!("no sender summary in {end}")),
        retransmits: end["sum_sent"]["retransmits"].as_u64(),
    }
}

/// Ethernet + IPv4 + UDP headers: a UDP datagram of `n` payload bytes is `n + 42` bytes on
/// the wire (as shaper and the qdiscs count it: no preamble, no FCS).
pub const UDP_WIRE_HEADERS: usize = 14 + 20 + 8;

/// `CLOCK_MONOTONIC` in seconds: the clock of [`Arrivals`], [`UdpLoad`] schedules and
/// [`Topology::link_meter`] windows.
#[must_use]
pub fn monotonic_secs() -> f64 {
    Duration::from_nanos(crate::monotonic_ns()).as_secs_f64()
}

/// The tc commands that build on `dev` the tree a hand-written HTB script would make from
/// `config` (its first interface): one HTB class per class (minor 10 + position), the same
/// rates, ceilings and priorities, an `fq_codel` under each leaf (as SQM scripts and most
/// current guides do; with the class's CoDel target and interval), u32 filters for the rules
/// in file order (IPv4 and IPv6), unmatched traffic to the default class. Panics on a rule it
/// cannot express (port ranges, marks, lengths, TCP flags, ICMP types, MAC addresses) or a
/// class weight, rather than build a different tree.
#[must_use]
pub fn htb_fq_codel_commands(config: &shaper::config::Config, dev: &str) -> Vec<String> {
    let iface = &config.interfaces[0];
    let minor = |name: &str| 10 + config.classes.iter().position(|c| c.name == name).expect("a configured class");
    let link = iface.rate.bits_per_sec();
    assert!(iface.mpu == 0, "an mpu is not translated");
    // HTB's rate tables count a packet's length plus `overhead`, in cells with `linklayer atm`,
    // as shaper does (tc-stab's and CAKE's rules; HTB has no PTM).
    let framing = match iface.linklayer {
        shaper::config::LinkLayer::Ethernet if iface.overhead == 0 => String::new(),
        shaper::config::LinkLayer::Ethernet => format!(" overhead {}", iface.overhead),
        shaper::config::LinkLayer::Atm => format!(" overhead {} linklayer atm", iface.overhead),
        shaper::config::LinkLayer::Ptm => panic!("HTB has no PTM link layer"),
    };
    let mut cmds = vec![
        format!("tc qdisc add dev {dev} root handle 1: htb default {}", minor(&iface.default_class)),
        format!("tc class add dev {dev} parent 1: classid 1:1 htb rate {link}bit ceil {link}bit{framing}"),
    ];
    for c in &config.classes {
        assert!(c.weight.is_none(), "class {}: HTB's quantum is not a weight; this translation has none", c.name);
        let parent = c.parent.as_deref().map_or(1, minor);
        cmds.push(format!(
            "tc class add dev {dev} parent 1:{parent} classid 1:{} htb rate {}bit ceil {}bit prio {}{framing}",
            minor(&c.name),
            c.rate.bits_per_sec(),
            c.ceil.bits_per_sec(),
            c.prio
        ));
    }
    for c in &config.classes {
        if !config.classes.iter().any(|x| x.parent.as_deref() == Some(c.name.as_str())) {
            // A class's own CoDel parameters (a slow line's longer target) go to its fq_codel;
            // fq_codel's defaults are shaper's (5 ms, 100 ms).
            let codel = match c.aqm {
                Some(aqm) if aqm != shaper::config::DEFAULT_AQM => {
                    format!(" target {}us interval {}us", aqm.target.as_micros(), aqm.interval.as_micros())
                }
                _ => String::new(),
            };
            cmds.push(format!("tc qdisc add dev {dev} parent 1:{} fq_codel{codel}", minor(&c.name)));
        }
    }
    for (k, r) in config.rules.iter().enumerate() {
        assert!(r.mark.is_none(), "rule {k}: a mark is not translated to u32");
        let untranslated = r.len.is_some() || r.icmp_type.is_some() || r.src_mac.is_some();
        assert!(!untranslated, "rule {k}: len, icmp_type and src_mac are not translated to u32");
        // "pure-ack" as the u32 idiom of seed 003 and the LARTC scripts: IPv4, a 20-byte
        // header, IP length below 64, flags byte ACK alone. It misses IPv6, IP options and
        // ACKs with TCP options longer than 12 bytes (SACK blocks), which shaper matches.
        let pure_ack = match r.tcp_flags {
            None => false,
            Some(f) if f.value == 0x10 && f.mask == 0x3f && f.no_payload => true,
            Some(f) => panic!("rule {k}: tcp_flags {f:?} is not translated to u32"),
        };
        let v6 = matches!(r.src.or(r.dst), Some(ipnet::IpNet::V6(_)));
        let v4 = matches!(r.src.or(r.dst), Some(ipnet::IpNet::V4(_)));
        // One filter per family the rule can match, each at its own prio (a prio holds one
        // protocol), in file order: first match wins, as in shaper.
        for (family, prio) in [("ip", 2 * k + 1), ("ip6", 2 * k + 2)] {
            if (family == "ip" && v6) || (family == "ip6" && (v4 || pure_ack)) {
                continue;
            }
            let mut m = Vec::new();
            if let Some(src) = r.src {
                m.push(format!("match {family} src {src}"));
            }
            if let Some(dst) = r.dst {
                m.push(format!("match {family} dst {dst}"));
            }
            if let Some(p) = r.proto {
                m.push(format!("match {family} protocol {p} 0xff"));
            }
            for (what, range) in [("sport", r.sport), ("dport", r.dport)] {
                if let Some(range) = range {
                    // A range u32 can match: a block of 2^n ports that starts at a multiple of
                    // 2^n (`sport 3072 0xfc00` is 3072-4095).
                    let size = u32::from(range.end) - u32::from(range.start) + 1;
                    assert!(
                        size.is_power_of_two() && u32::from(range.start) % size == 0,
                        "rule {k}: the port range {}-{} is not one u32 mask",
                        range.start,
                        range.end
                    );
                    m.push(format!("match {family} {what} {} {:#x}", range.start, 0xffff & !(size - 1)));
                }
            }
            if pure_ack {
                m.push(
                    "match ip protocol 6 0xff match u8 0x05 0x0f at 0 match u16 0x0000 0xffc0 at 2 match u8 0x10 0xff at 33"
                        .to_owned(),
                );
            }
            if let Some(dscp) = r.dscp {
                let field = if family == "ip" { "tos" } else { "priority" };
                m.push(format!("match {family} {field} {:#x} 0xfc", u32::from(dscp) << 2));
            }
            if m.is_empty() {
                m.push("match u32 0 0".to_owned());
            }
            let protocol = if family == "ip" { "ip" } else { "ipv6" };
            cmds.push(format!(
                "tc filter add dev {dev} parent 1: protocol {protocol} prio {prio} u32 {} flowid 1:{}",
                m.join(" "),
                minor(&r.class)
            ));
        }
    }
    cmds
}

// ---- Traffic and counters from threads inside the namespaces. In the VM's emulation a
// process start costs from a fifth of a second (`ip`) to 15 s (`python3`, over 9p), and its
// reading would be stamped that loosely; a thread that entered the namespace reads a
// counter in microseconds. ----

/// Moves the calling thread into the network namespace `name` (as [`Netns::enter`]).
fn enter_netns(name: &str) {
    let path = format!("/run/netns/{name}");
    let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
    // SAFETY: setns(2) on a valid network namespace file descriptor; it changes only this thread.
    let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
    assert_eq!(rc, 0, "entering {name}: {}", std::io::Error::last_os_error());
}

/// Runs `f` on a new thread inside `ns`.
fn spawn_in<T: Send + 'static>(ns: &Netns, f: impl FnOnce() -> T + Send + 'static) -> std::thread::JoinHandle<T> {
    let name = ns.name.clone();
    std::thread::spawn(move || {
        enter_netns(&name);
        f()
    })
}

/// Sleeps until `CLOCK_MONOTONIC` reads `t` seconds.
pub fn sleep_until(t: f64) {
    let left = t - monotonic_secs();
    if left > 0.0 {
        sleep(Duration::from_secs_f64(left));
    }
}

fn realtime_secs() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("after 1970").as_secs_f64()
}

/// A paced UDP load: one socket per destination port on the server, all bound to `src`.
#[derive(Clone, Debug)]
pub struct UdpLoad {
    /// Source address (in the LAN namespace).
    pub src: String,
    /// One flow (socket) per destination port.
    pub ports: Vec<u16>,
    /// Payload bytes per datagram.
    pub payload: usize,
    /// Datagrams per second per flow (while on); the flows' sends are spread evenly in time.
    pub pps_per_flow: f64,
    /// `(on, period)` seconds: send only during the first `on` seconds of each `period`.
    pub on_off: Option<(f64, f64)>,
    pub seconds: f64,
}

/// What a [`UdpLoad`]'s sender did.
#[derive(Clone, Copy, Debug, Default)]
pub struct UdpSent {
    pub sent: u64,
    /// Sends more than 10 ms behind the schedule, and the worst lag (seconds).
    pub late: u64,
    pub max_lag: f64,
    pub errors: u64,
}

/// The datagrams a [`UdpReceiver`] got: kernel receive time (`CLOCK_MONOTONIC`, seconds) and
/// payload size of each.
#[derive(Clone, Debug, Default)]
pub struct Arrivals {
    pub times: Vec<f64>,
    pub sizes: Vec<usize>,
}

impl Arrivals {
    /// Wire bytes (payload + [`UDP_WIRE_HEADERS`]) that arrived within `[from, to)`.
    #[must_use]
    pub fn wire_bytes(&self, from: f64, to: f64) -> u64 {
        self.times
            .iter()
            .zip(&self.sizes)
            .filter(|(t, _)| (from..to).contains(*t))
            .map(|(_, &s)| (s + UDP_WIRE_HEADERS) as u64)
            .sum()
    }

    /// Mean wire rate (bits per second) within `[from, to)`.
    #[must_use]
    #[expect(clippy::cast_precision_loss, reason = "a rate for reports and tolerances")]
    pub fn wire_rate(&self, from: f64, to: f64) -> f64 {
        self.wire_bytes(from, to) as f64 * 8.0 / (to - from)
    }
}

/// A receiver started by [`Topology::udp_receiver`].
pub struct UdpReceiver {
    handle: std::thread::JoinHandle<Arrivals>,
}

impl UdpReceiver {
    /// Waits until the receiver's time is up and returns what it got.
    #[must_use]
    pub fn finish(self) -> Arrivals {
        self.handle.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

/// Sends `load` from the calling thread (inside the LAN namespace) to `dst`, its schedule
/// starting at `start` (`CLOCK_MONOTONIC`, seconds).
#[expect(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "datagram indexes of a schedule of seconds"
)]
fn send_udp(load: &UdpLoad, dst: &str, start: f64) -> UdpSent {
    let socks: Vec<std::net::UdpSocket> = load
        .ports
        .iter()
        .map(|_| {
            std::net::UdpSocket::bind((load.src.as_str(), 0)).unwrap_or_else(|e| panic!("binding {}: {e}", load.src))
        })
        .collect();
    let data = vec![0xab; load.payload];
    let flows = u32::try_from(socks.len()).expect("flows");
    let gap = 1.0 / (load.pps_per_flow * f64::from(flows));
    let end = start + load.seconds;
    let mut out = UdpSent::default();
    let mut k: u32 = 0;
    loop {
        let t = start + f64::from(k) * gap;
        if t >= end {
            break;
        }
        if let Some((on, period)) = load.on_off {
            if (t - start) % period >= on {
                let next = (((t - start) / period).floor() + 1.0) * period;
                k = (k + 1).max((next / gap - 1e-9).ceil() as u32);
                continue;
            }
        }
        let now = monotonic_secs();
        if t > now {
            sleep(Duration::from_secs_f64(t - now));
        } else {
            out.max_lag = out.max_lag.max(now - t);
            out.late += u64::from(now - t > 0.01);
        }
        let i = (k % flows) as usize;
        match socks[i].send_to(&data, (dst, load.ports[i])) {
            Ok(_) => out.sent += 1,
            Err(_) => out.errors += 1,
        }
        k += 1;
    }
    out
}

fn setsockopt_int(fd: std::os::fd::RawFd, level: i32, name: i32, value: i32) {
    // SAFETY: setsockopt(2) with a pointer to an int and its size.
    let rc = unsafe {
        libc::setsockopt(
            fd,
            level,
            name,
            (&raw const value).cast(),
            libc::socklen_t::try_from(std::mem::size_of::<i32>()).expect("4"),
        )
    };
    assert_eq!(rc, 0, "setsockopt({level}, {name}): {}", std::io::Error::last_os_error());
}

/// Receives on `socks` (non-blocking, with `SO_TIMESTAMPNS`) until `until`.
#[expect(clippy::cast_precision_loss, clippy::cast_possible_truncation, reason = "timestamps and a poll timeout")]
fn receive_udp(socks: &[std::net::UdpSocket], until: f64) -> Arrivals {
    use std::os::fd::AsRawFd as _;
    // Kernel timestamps are CLOCK_REALTIME; the two clocks run at the same rate here.
    let offset = realtime_secs() - monotonic_secs();
    let mut fds: Vec<libc::pollfd> =
        socks.iter().map(|s| libc::pollfd { fd: s.as_raw_fd(), events: libc::POLLIN, revents: 0 }).collect();
    let mut arrivals = Arrivals::default();
    let mut buf = vec![0u8; 65536];
    let mut control = [0u64; 16];
    loop {
        let left = until - monotonic_secs();
        if left <= 0.0 {
            break;
        }
        let timeout = (left.min(0.1) * 1e3).ceil() as i32;
        // SAFETY: `fds` is a valid array of `fds.len()` pollfd.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout) };
        if n <= 0 {
            continue;
        }
        for pfd in &fds {
            if pfd.revents & libc::POLLIN == 0 {
                continue;
            }
            loop {
                let mut iov = libc::iovec { iov_base: buf.as_mut_ptr().cast(), iov_len: buf.len() };
                // SAFETY: an all-zero msghdr is valid (no name, no buffers) before we fill it.
                let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
                msg.msg_iov = &raw mut iov;
                msg.msg_iovlen = 1;
                msg.msg_control = control.as_mut_ptr().cast();
                msg.msg_controllen = std::mem::size_of_val(&control);
                // SAFETY: `msg` points at `iov`, `buf` and `control`, all alive for the call.
                let len = unsafe { libc::recvmsg(pfd.fd, &raw mut msg, libc::MSG_DONTWAIT) };
                let Ok(len) = usize::try_from(len) else { break };
                let mut at = None;
                // SAFETY: walks the control messages the kernel wrote into `control`, within
                // `msg.msg_controllen`, with the libc macros that bound-check each header.
                unsafe {
                    let mut c = libc::CMSG_FIRSTHDR(&raw const msg);
                    while !c.is_null() {
                        if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_TIMESTAMPNS {
                            let ts: libc::timespec = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                            at = Some(ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9 - offset);
                        }
                        c = libc::CMSG_NXTHDR(&raw const msg, c);
                    }
                }
                arrivals.times.push(at.unwrap_or_else(monotonic_secs));
                arrivals.sizes.push(len);
            }
        }
    }
    arrivals
}

/// What the gateway's root qdisc on an interface sent over a window, and how busy the VM's
/// CPUs were meanwhile.
#[derive(Clone, Copy, Debug)]
pub struct LinkWindow {
    /// Bits per second the root qdisc sent (its `Sent` counter: what left, each segment of a
    /// GSO packet counted with its headers).
    pub bits_per_second: f64,
    /// Fraction of the CPUs' time not idle (all CPUs, from /proc/stat).
    pub cpu_busy: f64,
}

impl LinkWindow {
    #[expect(clippy::cast_precision_loss, reason = "a rate and a fraction for reports")]
    fn new(bytes: u64, seconds: f64, busy: u64, idle: u64) -> Self {
        Self { bits_per_second: bytes as f64 * 8.0 / seconds, cpu_busy: busy as f64 / (busy + idle).max(1) as f64 }
    }
}

/// (busy, idle) jiffies of all CPUs.
fn cpu_jiffies() -> (u64, u64) {
    let stat = std::fs::read_to_string("/proc/stat").expect("reading /proc/stat");
    let line = stat.lines().next().expect("the cpu line");
    let v: Vec<u64> = line.split_whitespace().skip(1).map(|x| x.parse().expect("a number")).collect();
    // user nice system idle iowait irq softirq steal
    (v[0] + v[1] + v[2] + v[5] + v[6] + v.get(7).copied().unwrap_or(0), v[3] + v[4])
}

const NLMSG_HDR: usize = 16;

/// Sends one netlink dump request (`msg_type`, with `body` after the header) on a new
/// `protocol` socket of the calling thread's namespace; returns each reply's type and body.
fn netlink_dump(protocol: i32, msg_type: u16, body: &[u8]) -> Vec<(u16, Vec<u8>)> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    // SAFETY: socket(2) with constant arguments; the descriptor is owned right below.
    let raw = unsafe { libc::socket(libc::AF_NETLINK, libc::SOCK_RAW | libc::SOCK_CLOEXEC, protocol) };
    assert!(raw >= 0, "netlink socket: {}", std::io::Error::last_os_error());
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let len = u32::try_from(NLMSG_HDR + body.len()).expect("a small request");
    let flags = u16::try_from(libc::NLM_F_REQUEST | libc::NLM_F_DUMP).expect("flags");
    let mut req = Vec::new();
    req.extend_from_slice(&len.to_ne_bytes());
    req.extend_from_slice(&msg_type.to_ne_bytes());
    req.extend_from_slice(&flags.to_ne_bytes());
    req.extend_from_slice(&1u32.to_ne_bytes());
    req.extend_from_slice(&0u32.to_ne_bytes());
    req.extend_from_slice(body);
    // SAFETY: send(2) of an initialised buffer; an unbound netlink socket sends to the kernel.
    let sent = unsafe { libc::send(fd.as_raw_fd(), req.as_ptr().cast(), req.len(), 0) };
    assert_eq!(usize::try_from(sent).ok(), Some(req.len()), "netlink send: {}", std::io::Error::last_os_error());
    let mut out = Vec::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        // SAFETY: recv(2) into a buffer of that length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        let n = usize::try_from(n).unwrap_or_else(|_| panic!("netlink recv: {}", std::io::Error::last_os_error()));
        let mut at = 0;
        while at + NLMSG_HDR <= n {
            let mlen = u32::from_ne_bytes(buf[at..at + 4].try_into().expect("4 bytes")) as usize;
            let mtype = u16::from_ne_bytes(buf[at + 4..at + 6].try_into().expect("2 bytes"));
            if mtype == u16::try_from(libc::NLMSG_DONE).expect("a type") {
                return out;
            }
            let payload = &buf[at + NLMSG_HDR..at + mlen];
            if mtype == u16::try_from(libc::NLMSG_ERROR).expect("a type") {
                let errno = i32::from_ne_bytes(payload[..4].try_into().expect("4 bytes"));
                assert_eq!(errno, 0, "netlink: {}", std::io::Error::from_raw_os_error(-errno));
                return out;
            }
            out.push((mtype, payload.to_vec()));
            at += (mlen + 3) & !3;
        }
    }
}

/// The netlink attributes in `data`: (type without flags, payload).
fn attributes(mut data: &[u8]) -> Vec<(u16, &[u8])> {
    let mut out = Vec::new();
    while data.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([data[0], data[1]]));
        let kind = u16::from_ne_bytes([data[2], data[3]]) & 0x3fff;
        if len < 4 || len > data.len() {
            break;
        }
        out.push((kind, &data[4..len]));
        data = &data[((len + 3) & !3).min(data.len())..];
    }
    out
}

/// Bytes sent by the root qdisc of interface `ifindex` in the calling thread's namespace.
fn root_qdisc_bytes(ifindex: i32) -> u64 {
    const TCA_STATS: u16 = 3;
    const TCA_STATS2: u16 = 7;
    const TCA_STATS_BASIC: u16 = 1;
    let mut tcmsg = [0u8; 20];
    tcmsg[4..8].copy_from_slice(&ifindex.to_ne_bytes());
    for (kind, m) in netlink_dump(libc::NETLINK_ROUTE, libc::RTM_GETQDISC, &tcmsg) {
        let ifi = i32::from_ne_bytes(m[4..8].try_into().expect("4 bytes"));
        let parent = u32::from_ne_bytes(m[12..16].try_into().expect("4 bytes"));
        if kind != libc::RTM_NEWQDISC || ifi != ifindex || parent != u32::MAX {
            continue;
        }
        let attrs = attributes(&m[20..]);
        let basic = attrs
            .iter()
            .filter(|(k, _)| *k == TCA_STATS2)
            .flat_map(|(_, nested)| attributes(nested))
            .find(|(k, _)| *k == TCA_STATS_BASIC)
            .map(|(_, b)| b)
            .or_else(|| attrs.iter().find(|(k, _)| *k == TCA_STATS).map(|(_, b)| *b));
        let b = basic.unwrap_or_else(|| panic!("no statistics for the root qdisc of interface {ifindex}"));
        return u64::from_ne_bytes(b[..8].try_into().expect("8 bytes"));
    }
    panic!("no root qdisc on interface {ifindex}");
}

/// One established TCP connection of a namespace, as `sock_diag` reports it (`ss -ti`).
#[derive(Clone, Copy, Debug)]
pub struct TcpConnection {
    pub sport: u16,
    pub dport: u16,
    /// Smoothed RTT, milliseconds (`ss`'s `rtt:`).
    pub srtt_ms: f64,
    pub bytes_acked: u64,
}

/// The established IPv4 TCP connections of the calling thread's network namespace.
#[must_use]
pub fn tcp_connections() -> Vec<TcpConnection> {
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const INET_DIAG_INFO: u16 = 2;
    const TCP_ESTABLISHED: u32 = 1;
    const INET_DIAG_MSG: usize = 72;
    // struct inet_diag_req_v2: family, protocol, ext (bit INET_DIAG_INFO - 1), pad, states,
    // then a socket id (ignored by a dump).
    let mut req = [0u8; 56];
    req[0] = u8::try_from(libc::AF_INET).expect("a family");
    req[1] = u8::try_from(libc::IPPROTO_TCP).expect("a protocol");
    req[2] = 1 << (INET_DIAG_INFO - 1);
    req[4..8].copy_from_slice(&(1u32 << TCP_ESTABLISHED).to_ne_bytes());
    let rtt = std::mem::offset_of!(libc::tcp_info, tcpi_rtt);
    let acked = std::mem::offset_of!(libc::tcp_info, tcpi_bytes_acked);
    netlink_dump(libc::NETLINK_SOCK_DIAG, SOCK_DIAG_BY_FAMILY, &req)
        .into_iter()
        .filter(|(kind, m)| *kind == SOCK_DIAG_BY_FAMILY && m.len() >= INET_DIAG_MSG)
        .filter_map(|(_, m)| {
            let sport = u16::from_be_bytes([m[4], m[5]]);
            let dport = u16::from_be_bytes([m[6], m[7]]);
            let info = attributes(&m[INET_DIAG_MSG..]).into_iter().find(|(k, _)| *k == INET_DIAG_INFO)?.1.to_vec();
            (info.len() >= acked + 8).then(|| TcpConnection {
                sport,
                dport,
                srtt_ms: f64::from(u32::from_ne_bytes(info[rtt..rtt + 4].try_into().expect("4 bytes"))) / 1e3,
                bytes_acked: u64::from_ne_bytes(info[acked..acked + 8].try_into().expect("8 bytes")),
            })
        })
        .collect()
}

/// Local TCP ports in the listening state in the calling thread's namespace.
fn listening_ports() -> Vec<u16> {
    let mut ports = Vec::new();
    for file in ["/proc/thread-self/net/tcp", "/proc/thread-self/net/tcp6"] {
        let text = std::fs::read_to_string(file).unwrap_or_default();
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.len() > 3 && f[3] == "0A" {
                if let Some(port) = f[1].rsplit(':').next().and_then(|p| u16::from_str_radix(p, 16).ok()) {
                    ports.push(port);
                }
            }
        }
    }
    ports
}

impl Topology {
    /// Delays the server's TCP packets (the clients' flows' ACKs) by `ms` milliseconds, as
    /// `latency_run` in the VM tests does: the clients' TCP flows then see an internet round
    /// trip, the pace CoDel's 100 ms interval is designed for, instead of the VM's fraction
    /// of a millisecond (with which one flow's window is a few packets, and a single CE mark
    /// leaves the link idle). Pings and UDP are not delayed.
    pub fn delay_server_tcp(&self, ms: u32) {
        let delay = format!("{ms}ms");
        self.srv.sh(&["tc", "qdisc", "add", "dev", "eth0", "root", "handle", "1:", "prio"]);
        self.srv.sh(&["tc", "qdisc", "add", "dev", "eth0", "parent", "1:3", "handle", "30:", "netem", "delay", &delay]);
        self.srv.sh(&[
            "tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ip", "prio", "1", "u32", "match", "ip",
            "protocol", "6", "0xff", "flowid", "1:3",
        ]);
    }

    /// Runs command lines (split at whitespace) in the gateway, panicking if one fails.
    pub fn gw_script(&self, cmds: &[String]) {
        for cmd in cmds {
            let args: Vec<&str> = cmd.split_whitespace().collect();
            self.gw.sh(&args);
        }
    }

    /// Starts one-shot iperf3 servers (as [`Self::iperf_server`]) on all `ports` at once and
    /// waits until they all listen.
    #[must_use]
    pub fn iperf_servers(&self, ports: &[u16]) -> Vec<Child> {
        let mut children: Vec<Child> = ports
            .iter()
            .map(|port| {
                self.srv
                    .command("iperf3")
                    .args(["-s", "-1", "-J", "-i", "0.5", "-p", &port.to_string()])
                    .stdout(Stdio::null())
                    .stderr(Stdio::null())
                    .spawn()
                    .expect("starting iperf3 -s")
            })
            .collect();
        let wanted = ports.to_vec();
        let listening = spawn_in(&self.srv, move || {
            let deadline = monotonic_secs() + 20.0;
            loop {
                let open = listening_ports();
                if wanted.iter().all(|p| open.contains(p)) {
                    return true;
                }
                if monotonic_secs() > deadline {
                    return false;
                }
                sleep(Duration::from_millis(20));
            }
        });
        if !listening.join().expect("waiting for the iperf3 servers") {
            for c in &mut children {
                let _ = c.kill();
                let _ = c.wait();
            }
            panic!("iperf3 -s on ports {ports:?} did not all start listening within 20 s");
        }
        children
    }

    /// Starts a UDP receiver on the server's `ports` (one socket each) until `until`
    /// (`CLOCK_MONOTONIC`, seconds); returns once they are bound.
    #[must_use]
    pub fn udp_receiver(&self, ports: &[u16], until: f64) -> UdpReceiver {
        self.udp_receiver_at(SERVER, ports, until)
    }

    /// Like [`Self::udp_receiver`], on another of the server namespace's addresses.
    #[must_use]
    pub fn udp_receiver_at(&self, addr: &str, ports: &[u16], until: f64) -> UdpReceiver {
        use std::os::fd::AsRawFd as _;
        let ports = ports.to_vec();
        let addr = addr.to_owned();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let handle = spawn_in(&self.srv, move || {
            let socks: Vec<std::net::UdpSocket> = ports
                .iter()
                .map(|&p| {
                    let s = std::net::UdpSocket::bind((addr.as_str(), p))
                        .unwrap_or_else(|e| panic!("binding UDP port {p}: {e}"));
                    s.set_nonblocking(true).expect("non-blocking");
                    setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_RCVBUFFORCE, 8 << 20);
                    setsockopt_int(s.as_raw_fd(), libc::SOL_SOCKET, libc::SO_TIMESTAMPNS, 1);
                    s
                })
                .collect();
            let _ = ready_tx.send(());
            receive_udp(&socks, until)
        });
        if ready_rx.recv().is_err() {
            std::panic::resume_unwind(handle.join().expect_err("the receiver stopped before it was ready"));
        }
        UdpReceiver { handle }
    }

    /// Sends `load` from the LAN namespace, its schedule starting at `start`
    /// (`CLOCK_MONOTONIC`, seconds).
    #[must_use]
    pub fn udp_sender(&self, load: UdpLoad, start: f64) -> std::thread::JoinHandle<UdpSent> {
        self.udp_sender_to(SERVER, load, start)
    }

    /// Like [`Self::udp_sender`], to another of the server namespace's addresses.
    #[must_use]
    pub fn udp_sender_to(&self, dst: &str, load: UdpLoad, start: f64) -> std::thread::JoinHandle<UdpSent> {
        let dst = dst.to_owned();
        spawn_in(&self.lan, move || send_udp(&load, &dst, start))
    }

    /// Measures what the gateway's root qdisc on `dev` sends within `[from, to]`
    /// (`CLOCK_MONOTONIC`, seconds), and the CPUs' load meanwhile.
    #[must_use]
    pub fn link_meter(&self, dev: &str, from: f64, to: f64) -> std::thread::JoinHandle<LinkWindow> {
        let dev = std::ffi::CString::new(dev).expect("an interface name");
        spawn_in(&self.gw, move || {
            // SAFETY: if_nametoindex(3) on a NUL-terminated name.
            let ifindex = unsafe { libc::if_nametoindex(dev.as_ptr()) };
            assert_ne!(ifindex, 0, "no interface {dev:?} in the gateway");
            let ifindex = i32::try_from(ifindex).expect("an interface index");
            let read = || {
                let before = monotonic_secs();
                let bytes = root_qdisc_bytes(ifindex);
                (bytes, f64::midpoint(before, monotonic_secs()), cpu_jiffies())
            };
            sleep_until(from);
            let (b0, t0, (busy0, idle0)) = read();
            sleep_until(to);
            let (b1, t1, (busy1, idle1)) = read();
            LinkWindow::new(b1 - b0, t1 - t0, busy1 - busy0, idle1 - idle0)
        })
    }
}

// ---- IPv6 on the same topology. ----

/// The server's IPv6 address, once [`Topology::add_ipv6`] gave it one.
pub const SERVER6: &str = "fd00:2::2";
/// The gateway's IPv6 address on the server's side.
const GATEWAY6_WAN: &str = "fd00:2::1";

impl Topology {
    /// Gives the topology IPv6 as well: the CIDRs `gw_lan` on the gateway's `lan_if` (the
    /// first is the clients' router) and `clients` on the LAN namespace's side, `fd00:2::1/64`
    /// and [`SERVER6`]`/64` across `wan_if`, forwarding on the gateway, default routes both
    /// ways. The addresses skip duplicate address detection (`nodad`), which would hold them
    /// unusable for a second or more; this waits until every client reaches the server.
    pub fn add_ipv6(&self, lan_if: &str, wan_if: &str, gw_lan: &[&str], clients: &[&str]) {
        let add = |ns: &Netns, dev: &str, cidr: &str| ns.sh(&["ip", "-6", "addr", "add", cidr, "dev", dev, "nodad"]);
        for cidr in gw_lan {
            add(&self.gw, lan_if, cidr);
        }
        for cidr in clients {
            add(&self.lan, "eth0", cidr);
        }
        add(&self.gw, wan_if, &format!("{GATEWAY6_WAN}/64"));
        add(&self.srv, "eth0", &format!("{SERVER6}/64"));
        self.gw.sh(&["sysctl", "-qw", "net.ipv6.conf.all.forwarding=1"]);
        let router = gw_lan.first().and_then(|c| c.split('/').next()).expect("a gateway address on the LAN");
        self.lan.sh(&["ip", "-6", "route", "add", "default", "via", router]);
        self.srv.sh(&["ip", "-6", "route", "add", "default", "via", GATEWAY6_WAN]);
        for cidr in clients {
            let src = cidr.split('/').next().expect("an address");
            let deadline = Instant::now() + Duration::from_secs(10);
            loop {
                let out = self
                    .lan
                    .command("ping")
                    .args(["-6", "-n", "-c", "1", "-W", "1", "-I", src, SERVER6])
                    .output()
                    .expect("running ping");
                if out.status.success() {
                    break;
                }
                assert!(
                    Instant::now() < deadline,
                    "{src} does not reach {SERVER6} over IPv6 after 10 s: {}",
                    String::from_utf8_lossy(&out.stdout)
                );
                sleep(Duration::from_millis(100));
            }
        }
    }

    /// Extends [`Self::delay_server_tcp`]'s delay (call that first) to the server's IPv6 TCP
    /// packets.
    pub fn delay_server_tcp6(&self) {
        self.srv.sh(&[
            "tc", "filter", "add", "dev", "eth0", "parent", "1:", "protocol", "ipv6", "prio", "2", "u32", "match",
            "ip6", "protocol", "6", "0xff", "flowid", "1:3",
        ]);
    }
}

// ---- Short TCP transactions ("page fetches"), timed from inside the namespaces. ----

/// What a page server serves: `bytes` bytes per connection, on `server`'s `port`.
#[derive(Clone, Debug)]
pub struct Pages {
    pub server: String,
    pub port: u16,
    pub bytes: usize,
}

impl Topology {
    /// Serves [`Pages`] in the server namespace until [`PageServer::finish`], one connection
    /// at a time: it reads the request line, sends the page and closes. Returns once it
    /// listens.
    #[must_use]
    pub fn page_server(&self, pages: &Pages) -> PageServer {
        let pages = pages.clone();
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let stopped = std::sync::Arc::clone(&stop);
        let handle = spawn_in(&self.srv, move || {
            let addr = (pages.server.as_str(), pages.port);
            let listener = std::net::TcpListener::bind(addr).unwrap_or_else(|e| panic!("listening on {addr:?}: {e}"));
            listener.set_nonblocking(true).expect("a non-blocking listener");
            let _ = ready_tx.send(());
            serve_pages(&listener, pages.bytes, &stopped)
        });
        if ready_rx.recv().is_err() {
            std::panic::resume_unwind(handle.join().expect_err("the page server stopped before it listened"));
        }
        PageServer { handle, stop }
    }

    /// Fetches [`Pages`] from `src` in the LAN namespace, one after another with `pause`
    /// seconds between them, from `from` until `until` (`CLOCK_MONOTONIC`, seconds).
    /// Returns each fetch's time from `connect` to the page's last byte, seconds.
    #[must_use]
    pub fn page_fetches(
        &self,
        pages: &Pages,
        src: &str,
        from: f64,
        until: f64,
        pause: f64,
    ) -> std::thread::JoinHandle<Vec<f64>> {
        let pages = pages.clone();
        let src: std::net::IpAddr = src.parse().unwrap_or_else(|e| panic!("source address {src}: {e}"));
        spawn_in(&self.lan, move || {
            use std::io::{Read as _, Write as _};
            let server: std::net::IpAddr = pages.server.parse().expect("the server's address");
            let dst = std::net::SocketAddr::new(server, pages.port);
            let mut times = Vec::new();
            let mut buf = vec![0u8; 65536];
            sleep_until(from);
            while monotonic_secs() < until {
                let began = monotonic_secs();
                let mut stream =
                    tcp_connect_from(src, dst).unwrap_or_else(|e| panic!("connecting {src} to {dst}: {e}"));
                stream.set_read_timeout(Some(Duration::from_secs(10))).expect("a read timeout");
                stream.write_all(b"GET\n").expect("sending the request");
                let mut got = 0;
                loop {
                    let n = stream.read(&mut buf).unwrap_or_else(|e| panic!("fetching from {dst}: {e}"));
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                assert_eq!(got, pages.bytes, "a short page from {dst}");
                times.push(monotonic_secs() - began);
                sleep(Duration::from_secs_f64(pause));
            }
            times
        })
    }
}

/// A page server started by [`Topology::page_server`].
pub struct PageServer {
    handle: std::thread::JoinHandle<u64>,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl PageServer {
    /// Stops the server (after the page it may be sending) and returns how many it served.
    #[must_use]
    pub fn finish(self) -> u64 {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
    }
}

/// The page server's loop: see [`Topology::page_server`].
fn serve_pages(listener: &std::net::TcpListener, bytes: usize, stop: &std::sync::atomic::AtomicBool) -> u64 {
    use std::io::{BufRead as _, Write as _};
    let page = vec![0x5a; bytes];
    let mut served = 0;
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        match listener.accept() {
            Ok((stream, _)) => {
                stream.set_nonblocking(false).expect("a blocking connection");
                stream.set_read_timeout(Some(Duration::from_secs(5))).expect("a read timeout");
                let mut request = String::new();
                let mut reader = std::io::BufReader::new(&stream);
                if reader.read_line(&mut request).is_ok_and(|n| n > 0) && (&stream).write_all(&page).is_ok() {
                    served += 1;
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => sleep(Duration::from_millis(1)),
            Err(e) => panic!("accepting a page fetch: {e}"),
        }
    }
    served
}

/// A TCP connection from the local address `src` (bound before `connect`, so that the packets
/// carry it whatever the routes would pick) to `dst`.
fn tcp_connect_from(src: std::net::IpAddr, dst: std::net::SocketAddr) -> std::io::Result<std::net::TcpStream> {
    use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
    let family = if src.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) with constant arguments; the descriptor is owned right below.
    let raw = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: `raw` is a fresh descriptor nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    let (local, local_len) = sockaddr(std::net::SocketAddr::new(src, 0));
    // SAFETY: bind(2) with a sockaddr of `local_len` bytes.
    if unsafe { libc::bind(fd.as_raw_fd(), (&raw const local).cast(), local_len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    let (remote, remote_len) = sockaddr(dst);
    // SAFETY: connect(2) with a sockaddr of `remote_len` bytes.
    if unsafe { libc::connect(fd.as_raw_fd(), (&raw const remote).cast(), remote_len) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(std::net::TcpStream::from(fd))
}

/// `addr` as the C socket address the socket calls take, and its length.
fn sockaddr(addr: std::net::SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: all zeros is a valid sockaddr_storage (an unspecified family).
    let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        std::net::SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::sa_family_t::try_from(libc::AF_INET).expect("a family"),
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr { s_addr: u32::from_ne_bytes(a.ip().octets()) },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than, and aligned for, every sockaddr type.
            unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in>(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        std::net::SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::sa_family_t::try_from(libc::AF_INET6).expect("a family"),
                sin6_port: a.port().to_be(),
                sin6_flowinfo: 0,
                sin6_addr: libc::in6_addr { s6_addr: a.ip().octets() },
                sin6_scope_id: 0,
            };
            // SAFETY: as above.
            unsafe { std::ptr::write((&raw mut storage).cast::<libc::sockaddr_in6>(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (storage, libc::socklen_t::try_from(len).expect("a small socket address"))
}
