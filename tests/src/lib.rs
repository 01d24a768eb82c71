//! Helpers for shaper's integration tests: crafted packets, `BPF_PROG_TEST_RUN` contexts,
//! network namespaces and veth pairs that clean up after themselves.
//!
//! Kernel tests need root and a kernel with BPF; when they cannot run they panic with the
//! reason, so that a run without privileges fails instead of passing vacuously.
#![allow(clippy::must_use_candidate, reason = "test helpers: the result is often only asserted on")]

use std::{
    net::{Ipv4Addr, Ipv6Addr},
    process::{Command, Output},
};

pub mod bench;
pub mod chart;
pub mod gateway;
pub mod htb;
pub mod mixes;
pub mod prometheus;
pub mod reference;
pub mod tuning;

use aya::programs::{TestRun, TestRunOptions};
use shaper::bpf::Datapath;

/// Panics unless the test runs as root (BPF, netns and qdisc changes need it).
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(
        euid, 0,
        "this kernel test needs root (CAP_BPF, CAP_NET_ADMIN); run it with sudo or via `cargo xtask test`"
    );
}

/// `CLOCK_MONOTONIC` in ns: the clock of `bpf_ktime_get_ns` and of EDT timestamps.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap() * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap()
}

/// Transport header of a crafted packet.
#[derive(Clone, Copy, Debug)]
pub enum L4 {
    Tcp {
        sport: u16,
        dport: u16,
    },
    Udp {
        sport: u16,
        dport: u16,
    },
    Icmp,
    /// An arbitrary protocol number with no header.
    Raw(u8),
}

/// A crafted Ethernet frame.
#[derive(Clone, Debug)]
pub struct Frame {
    pub vlan: Option<u16>,
    pub tos: u8,
    pub payload: usize,
}

impl Default for Frame {
    fn default() -> Self {
        Self { vlan: None, tos: 0, payload: 64 }
    }
}

fn eth(frame: &Frame, ethertype: u16) -> Vec<u8> {
    let mut p = vec![0x02, 0, 0, 0, 0, 2, 0x02, 0, 0, 0, 0, 1];
    if let Some(tci) = frame.vlan {
        p.extend_from_slice(&0x8100u16.to_be_bytes());
        p.extend_from_slice(&tci.to_be_bytes());
    }
    p.extend_from_slice(&ethertype.to_be_bytes());
    p
}

fn l4_bytes(l4: L4, payload: usize) -> (u8, Vec<u8>) {
    let (proto, mut h) = match l4 {
        L4::Tcp { sport, dport } => {
            let mut h = Vec::new();
            h.extend_from_slice(&sport.to_be_bytes());
            h.extend_from_slice(&dport.to_be_bytes());
            h.extend_from_slice(&[0, 0, 0, 1, 0, 0, 0, 0, 0x80, 0x10, 0xff, 0xff, 0, 0, 0, 0]);
            // 12 bytes of options (timestamps), as Linux sends: data offset 8 words.
            h.extend_from_slice(&[1, 1, 8, 10, 0, 0, 0, 1, 0, 0, 0, 1]);
            (6, h)
        }
        L4::Udp { sport, dport } => {
            let mut h = Vec::new();
            h.extend_from_slice(&sport.to_be_bytes());
            h.extend_from_slice(&dport.to_be_bytes());
            let len = u16::try_from(8 + payload).unwrap();
            h.extend_from_slice(&len.to_be_bytes());
            h.extend_from_slice(&[0, 0]);
            (17, h)
        }
        L4::Icmp => (1, vec![8, 0, 0, 0, 0, 1, 0, 1]),
        L4::Raw(p) => (p, Vec::new()),
    };
    h.extend(std::iter::repeat_n(0xab, payload));
    (proto, h)
}

/// An Ethernet + IPv4 packet.
#[must_use]
pub fn ipv4(frame: &Frame, src: Ipv4Addr, dst: Ipv4Addr, l4: L4) -> Vec<u8> {
    let (proto, body) = l4_bytes(l4, frame.payload);
    let mut p = eth(frame, 0x0800);
    let total = u16::try_from(20 + body.len()).unwrap();
    p.extend_from_slice(&[0x45, frame.tos]);
    p.extend_from_slice(&total.to_be_bytes());
    p.extend_from_slice(&[0, 1, 0x40, 0, 64, proto, 0, 0]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    let ip = p.len() - 20;
    let csum = ipv4_checksum(&p[ip..ip + 20]);
    p[ip + 10..ip + 12].copy_from_slice(&csum.to_be_bytes());
    p.extend_from_slice(&body);
    p
}

/// The IPv4 header checksum of `header` (whose checksum field is taken as is: a header with
/// a correct checksum sums to 0).
#[must_use]
pub fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header.chunks(2).map(|w| u32::from(u16::from_be_bytes([w[0], w[1]]))).sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).expect("folded")
}

/// An Ethernet + IPv6 packet with the given extension headers (each `(next_header_type,
/// total length in bytes)`, a multiple of 8) in front of the transport header.
#[must_use]
pub fn ipv6(frame: &Frame, src: Ipv6Addr, dst: Ipv6Addr, ext: &[(u8, usize)], l4: L4) -> Vec<u8> {
    let (proto, body) = l4_bytes(l4, frame.payload);
    let mut p = eth(frame, 0x86DD);
    let mut chain = Vec::new();
    for (i, &(_, len)) in ext.iter().enumerate() {
        let next = ext.get(i + 1).map_or(proto, |e| e.0);
        let mut h = vec![0u8; len];
        h[0] = next;
        h[1] = u8::try_from(len / 8 - 1).unwrap();
        chain.extend_from_slice(&h);
    }
    let first = ext.first().map_or(proto, |e| e.0);
    let plen = u16::try_from(chain.len() + body.len()).unwrap();
    p.extend_from_slice(&[0x60 | (frame.tos >> 4), frame.tos << 4, 0, 0]);
    p.extend_from_slice(&plen.to_be_bytes());
    p.extend_from_slice(&[first, 64]);
    p.extend_from_slice(&src.octets());
    p.extend_from_slice(&dst.octets());
    p.extend_from_slice(&chain);
    p.extend_from_slice(&body);
    p
}

/// The `struct __sk_buff` fields that `BPF_PROG_TEST_RUN` lets a test set and read back.
/// Offsets follow `include/uapi/linux/bpf.h`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SkbCtx {
    pub mark: u32,
    pub ifindex: u32,
    pub tstamp: u64,
    pub gso_segs: u32,
    pub gso_size: u32,
}

const SKB_SIZE: usize = 192;
const OFF_MARK: usize = 8;
const OFF_IFINDEX: usize = 40;
const OFF_TSTAMP: usize = 152;
const OFF_GSO_SEGS: usize = 164;
const OFF_GSO_SIZE: usize = 176;

impl SkbCtx {
    fn to_bytes(self) -> [u8; SKB_SIZE] {
        let mut b = [0u8; SKB_SIZE];
        b[OFF_MARK..OFF_MARK + 4].copy_from_slice(&self.mark.to_ne_bytes());
        b[OFF_IFINDEX..OFF_IFINDEX + 4].copy_from_slice(&self.ifindex.to_ne_bytes());
        b[OFF_TSTAMP..OFF_TSTAMP + 8].copy_from_slice(&self.tstamp.to_ne_bytes());
        b[OFF_GSO_SEGS..OFF_GSO_SEGS + 4].copy_from_slice(&self.gso_segs.to_ne_bytes());
        b[OFF_GSO_SIZE..OFF_GSO_SIZE + 4].copy_from_slice(&self.gso_size.to_ne_bytes());
        b
    }

    fn from_bytes(b: &[u8; SKB_SIZE]) -> Self {
        let u32_at = |o: usize| u32::from_ne_bytes(b[o..o + 4].try_into().unwrap());
        Self {
            mark: u32_at(OFF_MARK),
            ifindex: u32_at(OFF_IFINDEX),
            tstamp: u64::from_ne_bytes(b[OFF_TSTAMP..OFF_TSTAMP + 8].try_into().unwrap()),
            gso_segs: u32_at(OFF_GSO_SEGS),
            gso_size: u32_at(OFF_GSO_SIZE),
        }
    }
}

/// What one `BPF_PROG_TEST_RUN` returned.
#[derive(Clone, Debug)]
pub struct RunResult {
    /// The program's return value (`TC_ACT_OK` = 0, `TC_ACT_SHOT` = 2).
    pub action: u32,
    /// The skb fields after the run (the departure time is `ctx.tstamp`).
    pub ctx: SkbCtx,
    pub duration: std::time::Duration,
    /// The packet as the program left it.
    pub data: Vec<u8>,
}

/// `TC_ACT_OK`.
pub const TC_ACT_OK: u32 = 0;
/// `TC_ACT_SHOT`.
pub const TC_ACT_SHOT: u32 = 2;

/// `BPF_PROG_TEST_RUN` runs tc programs on the loopback device.
pub const LO: u32 = 1;

/// The most instructions the verifier may walk of the egress program, on the host's kernel
/// and on those the VM boots: well within the kernel's 1,000,000, past which it refuses the
/// program (a rule kind or a branch more must not come close to it); the walk is also most
/// of shaperd's start.
pub const VERIFIER_WALK_BOUND: u32 = 300_000;

/// Loads the datapath on the running kernel, prints how many instructions of the egress
/// program its verifier walked and how long the load took, and fails if the kernel refused
/// the program or walked more than [`VERIFIER_WALK_BOUND`].
///
/// # Panics
/// In those two cases, or if the kernel does not report the walk (before Linux 5.16).
pub fn assert_verifier_headroom() {
    require_root();
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("/proc/sys/kernel/osrelease");
    let release = release.trim();
    let started = std::time::Instant::now();
    let dp = Datapath::load().unwrap_or_else(|e| panic!("Linux {release} refused the datapath: {e:#}"));
    let took = started.elapsed();
    let walked = dp.verified_instructions().expect("the kernel reports the verified instructions (Linux 5.16+)");
    println!(
        "Linux {release}: egress program {walked} instructions verified (bound {VERIFIER_WALK_BOUND}, the kernel's \
         limit 1,000,000); the datapath loaded in {:.1} s",
        took.as_secs_f64()
    );
    assert!(
        walked <= VERIFIER_WALK_BOUND,
        "Linux {release}'s verifier walked {walked} instructions of the egress program, over {VERIFIER_WALK_BOUND}"
    );
}

/// A freshly loaded datapath with `rules` compiled in and the loopback device shaped, its
/// unmatched packets going to `default_class`; classes are unpaced until set.
#[must_use]
pub fn loopback_datapath(rules: &[shaper::rules::RuleSpec], default_class: u32) -> Datapath {
    require_root();
    let mut dp = Datapath::load().expect("loading the tc program");
    let iface = shaper_common::IfaceConfig {
        slot: 0,
        default_class,
        flags: shaper_common::IFACE_ENABLED,
        ..shaper_common::IfaceConfig::default()
    };
    dp.set_iface(LO, iface).expect("setting the loopback interface");
    dp.load_rules(&shaper::rules::compile(rules).expect("compiling rules")).expect("loading rules");
    dp
}

/// Runs the datapath's program on `packet` with the given skb fields, `repeat` times.
pub fn run(dp: &Datapath, packet: &[u8], ctx: SkbCtx, repeat: u32) -> RunResult {
    run_at(dp, shaper::bpf::Hook::Egress, packet, ctx, repeat)
}

/// Runs the datapath's program for `hook` on `packet` (see [`run`]).
pub fn run_at(dp: &Datapath, hook: shaper::bpf::Hook, packet: &[u8], ctx: SkbCtx, repeat: u32) -> RunResult {
    let ctx_in = ctx.to_bytes();
    let mut ctx_out = [0u8; SKB_SIZE];
    let mut data_out = vec![0u8; packet.len() + 256];
    let opts = TestRunOptions {
        data_in: Some(packet),
        data_out: Some(&mut data_out),
        ctx_in: Some(&ctx_in),
        ctx_out: Some(&mut ctx_out),
        repeat,
        ..TestRunOptions::default()
    };
    let r = dp
        .program_at(hook)
        .test_run(opts)
        .unwrap_or_else(|e| panic!("BPF_PROG_TEST_RUN on a {}-byte packet with {ctx:?}: {e:?}", packet.len()));
    data_out.truncate(r.data_size_out as usize);
    RunResult { action: r.return_value, ctx: SkbCtx::from_bytes(&ctx_out), duration: r.duration, data: data_out }
}

/// The number after the word `name` in `nft list` output: a counter's `packets` or `bytes`.
#[must_use]
pub fn nft_value(text: &str, name: &str) -> Option<u64> {
    text.split_whitespace().skip_while(|w| *w != name).nth(1).and_then(|v| v.parse().ok())
}

/// Runs a command, panicking with its output if it fails.
pub fn sh(args: &[&str]) -> Output {
    let out = Command::new(args[0]).args(&args[1..]).output().unwrap_or_else(|e| panic!("running {args:?}: {e}"));
    assert!(
        out.status.success(),
        "{args:?} failed: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// A network namespace, deleted on drop (with everything in it).
pub struct Netns {
    pub name: String,
}

impl Netns {
    /// Creates `name` (deleting a leftover of the same name first).
    #[must_use]
    pub fn new(name: &str) -> Self {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        sh(&["ip", "netns", "add", name]);
        sh(&["ip", "-n", name, "link", "set", "lo", "up"]);
        Self { name: name.to_owned() }
    }

    /// Runs a command inside the namespace, panicking if it fails.
    ///
    /// `ip` and `tc` are told the namespace (`-n`), and `sysctl` runs in its network only
    /// (`nsenter --net`): `ip netns exec` also gives a command a mount namespace of its own
    /// with the namespace's /sys, which costs a process and a remount of /sys each time, and
    /// under TCG that is most of a command's time. Other commands (one that reads /sys) get
    /// all of it.
    pub fn sh(&self, args: &[&str]) -> Output {
        let net = self.net_option();
        let full: Vec<&str> = match args {
            [tool @ ("ip" | "tc"), rest @ ..] => {
                [*tool, "-n", &self.name].into_iter().chain(rest.iter().copied()).collect()
            }
            ["sysctl", ..] => ["nsenter", &net].into_iter().chain(args.iter().copied()).collect(),
            _ => ["ip", "netns", "exec", &self.name].into_iter().chain(args.iter().copied()).collect(),
        };
        sh(&full)
    }

    /// Runs `nft` once per rule (a command line, split at whitespace) inside the namespace,
    /// panicking if one fails.
    pub fn nft(&self, rules: &[&str]) {
        for rule in rules {
            let mut args = vec!["nft"];
            args.extend(rule.split_whitespace());
            self.sh(&args);
        }
    }

    /// Moves the calling thread into the namespace: its sockets, and the processes it starts,
    /// are inside from then on (a test thread that talks to daemons on the namespace's
    /// loopback).
    pub fn enter(&self) {
        let path = format!("/run/netns/{}", self.name);
        let file = std::fs::File::open(&path).unwrap_or_else(|e| panic!("opening {path}: {e}"));
        // SAFETY: setns(2) on a valid namespace file descriptor; it changes only this thread.
        let rc = unsafe { libc::setns(std::os::fd::AsRawFd::as_raw_fd(&file), libc::CLONE_NEWNET) };
        assert_eq!(rc, 0, "entering {}: {}", self.name, std::io::Error::last_os_error());
    }

    /// A command to run inside the namespace's network only (`nsenter --net`), keeping the
    /// host's mounts: a daemon whose bpffs pins must outlive it cannot run under `ip netns
    /// exec`, which gives each command a mount namespace of its own (and /sys with it).
    #[must_use]
    pub fn command_net_only(&self, program: &str) -> Command {
        let mut c = Command::new("nsenter");
        c.arg(self.net_option()).arg(program);
        c
    }

    /// nsenter's option for the namespace's network.
    fn net_option(&self) -> String {
        format!("--net=/run/netns/{}", self.name)
    }

    /// A command to run inside the namespace.
    #[must_use]
    pub fn command(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "pids", &self.name]).output().map(|o| {
            for pid in String::from_utf8_lossy(&o.stdout).split_whitespace() {
                let _ = Command::new("kill").args(["-9", pid]).output();
            }
        });
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

/// Connects two namespaces with a veth pair: `a_if` in `a` with `a_addr`, `b_if` in `b`.
/// Addresses are CIDRs such as "10.9.0.1/24".
pub fn veth(a: &Netns, a_if: &str, a_addrs: &[&str], b: &Netns, b_if: &str, b_addrs: &[&str]) {
    sh(&["ip", "link", "add", a_if, "netns", &a.name, "type", "veth", "peer", "name", b_if, "netns", &b.name]);
    for (ns, ifname, addrs) in [(a, a_if, a_addrs), (b, b_if, b_addrs)] {
        for addr in addrs {
            let mut args = vec!["ip", "addr", "add", addr, "dev", ifname];
            if addr.contains(':') {
                args.push("nodad");
            }
            ns.sh(&args);
        }
        ns.sh(&["ip", "link", "set", ifname, "up"]);
    }
}

/// Path of one of the workspace's binaries (`shaperd`, `shaperctl`): next to the running
/// executable (the demo and bench binaries) or next to its `deps/` folder (test
/// executables). `cargo test --workspace` and `cargo xtask test` build them.
#[must_use]
pub fn bin(name: &str) -> std::path::PathBuf {
    // `cargo xtask test` runs the VM tests with release binaries (a gateway runs those, and a
    // debug daemon's own CPU time under QEMU's emulation would blur the measurements).
    if let Some(dir) = std::env::var_os(BIN_DIR_ENV) {
        let path = std::path::Path::new(&dir).join(name);
        assert!(path.is_file(), "{name} is missing in {BIN_DIR_ENV}={}", path.display());
        return path;
    }
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("executable in a folder");
    let candidates = [Some(dir), dir.parent()];
    let found = candidates.iter().flatten().map(|d| d.join(name)).find(|p| p.is_file());
    found.unwrap_or_else(|| {
        panic!(
            "{name} is missing next to {}: run `cargo build --workspace --bins` (cargo xtask test does)",
            exe.display()
        )
    })
}

/// Where [`bin`] finds the project's binaries when set.
pub const BIN_DIR_ENV: &str = "SHAPER_BIN_DIR";
