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
