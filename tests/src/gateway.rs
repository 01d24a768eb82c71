//! A gateway on network namespaces, as the VM tests and the demo use it:
//!
//! ```text
//! lan (clients, several addresses) ──veth── gw: <lan_if> | <wan_if> (shaperd, egress) ──veth── srv (iperf3 servers)
//! ```
//! Clients send to the server; the gateway forwards and shapes on `wan_if` egress.

use std::{
    path::PathBuf,
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

    /// Starts shaperd in the gateway namespace with the configuration `config` (TOML text)
    /// and waits until it answers on its socket.
    pub fn shaperd(&self, config: &str) -> Daemon {
        let path = self.dir.join("shaper.toml");
        std::fs::write(&path, config).expect("writing the configuration");
        let log = self.dir.join("shaperd.log");
        let child = self
            .gw
            .command_net_only(bin("shaperd").to_str().expect("UTF-8 path"))
            .args([
                "--config",
                path.to_str().expect("UTF-8 path"),
                "--socket",
                self.socket().to_str().expect("UTF-8 path"),
                "--pin-dir",
                self.pin_dir().to_str().expect("UTF-8 path"),
            ])
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
        let port = port.to_string();
        let seconds = seconds.to_string();
        let mut args =
            vec!["-c", SERVER, "-B", src, "-p", &port, "-t", &seconds, "-i", interval, "-J", "--get-server-output"];
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

/// The receiver's intervals in an iperf3 client's JSON (`--get-server-output`).
fn receiver_side(v: &Value) -> Vec<Interval> {
    v["server_output_json"]["intervals"]
        .as_array()
        .unwrap_or_else(|| panic!("no receiver intervals in {v}"))
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
    IperfResult { receiver, sender_bits_per_second: sender.unwrap_or_else(|| panic!("no sender summary in {end}")) }
}

/// Ethernet + IPv4 + UDP headers: a UDP datagram of `n` payload bytes is `n + 42` bytes on
/// the wire (as shaper and the qdiscs count it: no preamble, no FCS).
pub const UDP_WIRE_HEADERS: usize = 14 + 20 + 8;

/// `CLOCK_MONOTONIC` in seconds: the clock of [`Arrivals`] and of the UDP tool's schedule.
#[must_use]
pub fn monotonic_secs() -> f64 {
    Duration::from_nanos(crate::monotonic_ns()).as_secs_f64()
}

/// The tc commands that build on `dev` the tree a hand-written HTB script would make from
/// `config` (its first interface): one HTB class per class (minor 10 + position), the same
/// rates, ceilings and priorities, an `fq_codel` under each leaf (as SQM scripts and most
/// current guides do), u32 filters for the rules in file order, unmatched traffic to the
/// default class. Panics on a rule it cannot express (port ranges, marks) or a class weight,
/// rather than build a different tree.
#[must_use]
pub fn htb_fq_codel_commands(config: &shaper::config::Config, dev: &str) -> Vec<String> {
    let iface = &config.interfaces[0];
    let minor = |name: &str| 10 + config.classes.iter().position(|c| c.name == name).expect("a configured class");
    let link = iface.rate.bits_per_sec();
    let mut cmds = vec![
        format!("tc qdisc add dev {dev} root handle 1: htb default {}", minor(&iface.default_class)),
        format!("tc class add dev {dev} parent 1: classid 1:1 htb rate {link}bit ceil {link}bit"),
    ];
    for c in &config.classes {
        assert!(c.weight.is_none(), "class {}: HTB's quantum is not a weight; this translation has none", c.name);
        let parent = c.parent.as_deref().map_or(1, minor);
        cmds.push(format!(
            "tc class add dev {dev} parent 1:{parent} classid 1:{} htb rate {}bit ceil {}bit prio {}",
            minor(&c.name),
            c.rate.bits_per_sec(),
            c.ceil.bits_per_sec(),
            c.prio
        ));
    }
    for c in &config.classes {
        if !config.classes.iter().any(|x| x.parent.as_deref() == Some(c.name.as_str())) {
            cmds.push(format!("tc qdisc add dev {dev} parent 1:{} fq_codel", minor(&c.name)));
        }
    }
    for (k, r) in config.rules.iter().enumerate() {
        assert!(r.mark.is_none(), "rule {k}: a mark is not translated to u32");
        let v6 = matches!(r.src.or(r.dst), Some(ipnet::IpNet::V6(_)));
        let v4 = matches!(r.src.or(r.dst), Some(ipnet::IpNet::V4(_)));
        // One filter per family the rule can match, each at its own prio (a prio holds one
        // protocol), in file order: first match wins, as in shaper.
        for (family, prio) in [("ip", 2 * k + 1), ("ip6", 2 * k + 2)] {
            if (family == "ip" && v6) || (family == "ip6" && v4) {
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
                    assert_eq!(range.start, range.end, "rule {k}: a port range is not translated to u32");
                    m.push(format!("match {family} {what} {} 0xffff", range.start));
                }
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

/// A small Python program for UDP loads iperf3 cannot make (`python3` is on the host, and so
/// in the VM, which sees the host's root):
/// - `send {json}`: one socket per destination port, bound to `src`; datagrams of `payload`
///   bytes, `pps_per_flow` per flow, the flows' sends spread evenly in time; with `on` and
///   `period` it sends only during the first `on` seconds of every `period`. Prints its
///   schedule's start (`CLOCK_MONOTONIC`) and how late it fell behind.
/// - `recv {json}`: one socket per port; prints `ready` once bound, then after `seconds` the
///   kernel's receive timestamp (converted to `CLOCK_MONOTONIC`) and size of every datagram,
///   so that a slow receiver under emulation still reports when each one arrived.
pub const UDP_TOOL: &str = r#"
import json, math, select, socket, struct, sys, time

SO_RCVBUFFORCE = 33
SO_TIMESTAMPNS = 35

def send(cfg):
    ports = cfg["ports"]
    socks = []
    for _ in ports:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.bind((cfg["src"], 0))
        socks.append(s)
    data = b"\xab" * cfg["payload"]
    gap = 1.0 / (cfg["pps_per_flow"] * len(socks))
    on, period = cfg.get("on"), cfg.get("period")
    t0 = time.monotonic() + 0.05
    end = t0 + cfg["seconds"]
    k = sent = late = errors = 0
    max_lag = 0.0
    while True:
        t = t0 + k * gap
        if t >= end:
            break
        if period and (t - t0) % period >= on:
            nxt = (math.floor((t - t0) / period) + 1) * period
            k = max(k + 1, math.ceil(nxt / gap - 1e-9))
            continue
        now = time.monotonic()
        if t > now:
            time.sleep(t - now)
        else:
            max_lag = max(max_lag, now - t)
            late += now - t > 0.01
        i = k % len(socks)
        try:
            socks[i].sendto(data, (cfg["dst"], ports[i]))
            sent += 1
        except OSError:
            errors += 1
        k += 1
    print(json.dumps({"t0": t0, "sent": sent, "late": late, "max_lag": max_lag, "errors": errors}), flush=True)

def recv(cfg):
    offset = time.time() - time.monotonic()
    ep = select.epoll()
    socks = {}
    for p in cfg["ports"]:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 8 << 20)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPNS, 1)
        s.bind((cfg["addr"], p))
        s.setblocking(False)
        ep.register(s.fileno(), select.EPOLLIN)
        socks[s.fileno()] = s
    print("ready", flush=True)
    times, sizes = [], []
    end = time.monotonic() + cfg["seconds"]
    while True:
        left = end - time.monotonic()
        if left <= 0:
            break
        for fd, _ in ep.poll(min(left, 0.2)):
            s = socks[fd]
            while True:
                try:
                    msg, anc, _, _ = s.recvmsg(65536, 64)
                except BlockingIOError:
                    break
                ts = None
                for level, kind, d in anc:
                    if level == socket.SOL_SOCKET and kind == SO_TIMESTAMPNS:
                        sec, nsec = struct.unpack("qq", d[:16])
                        ts = sec + nsec * 1e-9 - offset
                times.append(round(ts if ts is not None else time.monotonic(), 6))
                sizes.append(len(msg))
    print(json.dumps({"times": times, "sizes": sizes}), flush=True)

{"send": send, "recv": recv}[sys.argv[1]](json.loads(sys.argv[2]))
"#;

/// A paced UDP load from [`UDP_TOOL`].
#[derive(Clone, Debug)]
pub struct UdpLoad {
    /// Source address (in the LAN namespace).
    pub src: String,
    /// One flow (socket) per destination port on the server.
    pub ports: Vec<u16>,
    /// Payload bytes per datagram.
    pub payload: usize,
    /// Datagrams per second per flow (while on).
    pub pps_per_flow: f64,
    /// `(on, period)` seconds: send during the first `on` seconds of each `period`.
    pub on_off: Option<(f64, f64)>,
    pub seconds: f64,
}

/// What a [`UdpLoad`]'s sender reports when it is done.
#[derive(Clone, Copy, Debug)]
pub struct UdpSent {
    /// When its schedule began (`CLOCK_MONOTONIC`, seconds).
    pub t0: f64,
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

/// A running [`UDP_TOOL`] receiver.
pub struct UdpReceiver {
    child: Child,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

impl UdpReceiver {
    /// Waits for the receiver's time to run out and returns what it got.
    #[must_use]
    pub fn finish(mut self) -> Arrivals {
        use std::io::Read as _;
        let mut text = String::new();
        self.stdout.read_to_string(&mut text).expect("reading the UDP receiver's report");
        let status = self.child.wait().expect("waiting for the UDP receiver");
        assert!(status.success(), "the UDP receiver exited with {status}: {text}");
        let v: Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| panic!("UDP receiver JSON: {e}: {text}"));
        let times = v["times"].as_array().expect("times").iter().map(|t| t.as_f64().expect("a time")).collect();
        let sizes = v["sizes"]
            .as_array()
            .expect("sizes")
            .iter()
            .map(|s| usize::try_from(s.as_u64().expect("a size")).expect("a size"))
            .collect();
        Arrivals { times, sizes }
    }
}

/// Waits for a [`UDP_TOOL`] sender and returns its report.
#[must_use]
pub fn udp_sent(sender: Child) -> UdpSent {
    let out = sender.wait_with_output().expect("waiting for the UDP sender");
    assert!(
        out.status.success(),
        "the UDP sender exited with {}: {}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("UDP sender JSON: {e}: {}", String::from_utf8_lossy(&out.stdout)));
    let n = |k: &str| v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"));
    UdpSent {
        t0: v["t0"].as_f64().expect("t0"),
        sent: n("sent"),
        late: n("late"),
        max_lag: v["max_lag"].as_f64().expect("max_lag"),
        errors: n("errors"),
    }
}

impl Topology {
    /// Runs tc (or any) commands, given as whole command lines, in the gateway.
    pub fn gw_script(&self, cmds: &[String]) {
        for cmd in cmds {
            let args: Vec<&str> = cmd.split_whitespace().collect();
            self.gw.sh(&args);
        }
    }

    /// Bytes the root qdisc of `dev` in the gateway has sent (its `Sent` counter: what left,
    /// counting every segment's headers of a GSO packet), and when it was read
    /// (`CLOCK_MONOTONIC`, seconds).
    #[must_use]
    pub fn root_qdisc_bytes(&self, dev: &str) -> (u64, f64) {
        let before = monotonic_secs();
        let out = self.gw.sh(&["tc", "-s", "-j", "qdisc", "show", "dev", dev]);
        let at = f64::midpoint(before, monotonic_secs());
        let v: Value = serde_json::from_slice(&out.stdout).expect("tc JSON");
        let root = v
            .as_array()
            .and_then(|q| q.iter().find(|q| q["root"] == true))
            .unwrap_or_else(|| panic!("no root qdisc on {dev}: {v}"));
        (root["bytes"].as_u64().unwrap_or_else(|| panic!("no byte count in {root}")), at)
    }

    fn udp_tool(&self) -> PathBuf {
        let path = self.dir.join("udp_tool.py");
        if !path.is_file() {
            std::fs::write(&path, UDP_TOOL).expect("writing the UDP tool");
        }
        path
    }

    /// Starts a [`UDP_TOOL`] receiver on `ports` of the server for `seconds`; returns once
    /// it listens.
    #[must_use]
    pub fn udp_receiver(&self, ports: &[u16], seconds: f64) -> UdpReceiver {
        use std::io::BufRead as _;
        let cfg = serde_json::json!({ "addr": SERVER, "ports": ports, "seconds": seconds });
        let mut child = self
            .srv
            .command("python3")
            .arg(self.udp_tool())
            .args(["recv", &cfg.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .expect("starting the UDP receiver (python3)");
        let mut stdout = std::io::BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line).expect("reading the UDP receiver");
        assert_eq!(line.trim(), "ready", "the UDP receiver did not start: {line}");
        UdpReceiver { child, stdout }
    }

    /// Starts a [`UDP_TOOL`] sender in the LAN namespace; [`udp_sent`] waits for it.
    #[must_use]
    pub fn udp_sender(&self, load: &UdpLoad) -> Child {
        let mut cfg = serde_json::json!({
            "src": load.src, "dst": SERVER, "ports": load.ports, "payload": load.payload,
            "pps_per_flow": load.pps_per_flow, "seconds": load.seconds,
        });
        if let Some((on, period)) = load.on_off {
            cfg["on"] = on.into();
            cfg["period"] = period.into();
        }
        self.lan
            .command("python3")
            .arg(self.udp_tool())
            .args(["send", &cfg.to_string()])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("starting the UDP sender (python3)")
    }
}
