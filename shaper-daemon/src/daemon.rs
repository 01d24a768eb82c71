//! shaperd's wiring: from a validated configuration to a shaping datapath, the control
//! socket, and a clean shutdown that gives every interface back what it had.
//!
//! [`run`] takes the shutdown signal as a future, so tests drive the daemon the same way
//! the binary does with SIGTERM.

use std::{
    collections::VecDeque,
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use shaper_common::{
    frames_ns, ClassConfig, IfaceConfig, CLASS_QUIET, DELAY_BUCKETS, DELAY_BUCKET_BASE_NS, IFACE_DOWNLOAD,
    IFACE_ENABLED, IFACE_L3, ISOLATE_FLOW, ISOLATE_HOST, ISOLATE_NONE, LINK_SLACK_PERCENT, MAX_CLASSES,
};
use tokio::sync::{watch, Mutex};
use tracing::{debug, error, info, instrument, warn};

use crate::{
    api::{ApiError, ClassStatus, Handler, Reply, Request, Response, Server, SocketError, Status},
    bpf::{BpfError, Datapath},
    config::{
        diff::describe_changes,
        edit::{self, ClassKey, EditError, NewValue},
        Class, Config, Direction, Isolation,
    },
    demand::{self, Counters, Estimator, Observation},
    metrics::{self, ClassSample, Metrics, Snapshot},
    pacing::{self, Pacer},
    qdisc::{self, FqGuard, QdiscError},
    rate::Rate,
    rules::{self, CompileError, RuleSpec},
    tree::Tree,
    ErrorChain,
};

/// The window of the added-delay percentile that `status` reports.
const DELAY_WINDOW_NS: u64 = 1_000_000_000;

/// Why the daemon could not start (or stop cleanly).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("interface {name} (in {path}): not found in this network namespace")]
    NoInterface { name: String, path: PathBuf },
    #[error("compiling the rules of {path}")]
    Rules {
        path: PathBuf,
        #[source]
        source: CompileError,
    },
    #[error(transparent)]
    Qdisc(#[from] QdiscError),
    #[error(transparent)]
    Bpf(#[from] BpfError),
    #[error(transparent)]
    Socket(#[from] SocketError),
    #[error("listening for Prometheus on {addr} (daemon.metrics_listen)")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
}

/// A class as the daemon tracks it.
#[derive(Clone, Debug)]
struct ClassEntry {
    /// Index in the datapath's class arrays.
    id: u32,
    leaf: bool,
    /// The rate the datapath paces the class at.
    current: Rate,
    /// The allocator's last share for the class (inner classes: their children's sum).
    allocated: Rate,
    estimator: Estimator,
    /// The offered rate the estimator last read.
    throughput: Rate,
    /// Whether the estimator found the class limited by its pacing rate at the last tick.
    limited: bool,
    /// Whether the class is paced at its wake rate, behind the link clock (`CLASS_QUIET`).
    quiet: bool,
    /// Isolation: one host's fair share of the class (bits/s; 0 before the first tick), and
    /// the isolation counters at the last tick.
    share: u64,
    share_counters: (u64, u64, u64),
    /// Delay histograms over the last second (`CLOCK_MONOTONIC` ns), oldest first, for the
    /// p99 in `status`.
    delays: VecDeque<(u64, [u64; DELAY_BUCKETS])>,
}

impl ClassEntry {
    fn new(id: u32, leaf: bool, rate: Rate) -> Self {
        Self {
            id,
            leaf,
            current: if leaf { rate } else { Rate::ZERO },
            allocated: Rate::ZERO,
            estimator: Estimator::new(),
            throughput: Rate::ZERO,
            quiet: false,
            limited: false,
            share: 0,
            share_counters: (0, 0, 0),
            delays: VecDeque::new(),
        }
    }

    /// Records the class's delay histogram, keeping one second of history.
    fn record_delays(&mut self, now_ns: u64, hist: [u64; DELAY_BUCKETS]) {
        demand::slide(&mut self.delays, now_ns, hist, DELAY_WINDOW_NS);
    }

    /// The 99th percentile of the added delay over the recorded window, as the upper bound of
    /// its bucket (µs); `None` when nothing was sent in the window.
    fn p99_delay_us(&self) -> Option<u64> {
        let ((_, first), (_, last)) = (self.delays.front()?, self.delays.back()?);
        let counts: Vec<u64> = last.iter().zip(first).map(|(l, f)| l.saturating_sub(*f)).collect();
        let total: u64 = counts.iter().sum();
        if total == 0 {
            return None;
        }
        let mut seen = 0;
        for (i, c) in counts.iter().enumerate() {
            seen += c;
            if seen * 100 >= total * 99 {
                return Some(if i + 1 == DELAY_BUCKETS { u64::MAX } else { (DELAY_BUCKET_BASE_NS << i) / 1000 });
            }
        }
        None
    }
}

/// One interface's class tree; node `n` stands for class `classes[n]` (root: `None`).
struct IfaceTree {
    tree: Tree,
    classes: Vec<Option<usize>>,
    pacer: Pacer,
}

struct State {
    config: Config,
    /// One entry per class of `config`, in the same order.
    classes: Vec<ClassEntry>,
    trees: Vec<IfaceTree>,
    datapath: Datapath,
    /// The index of each interface of `config`, in the same order.
    ifindexes: Vec<u32>,
    /// Incremented by every change applied after the start.
    generation: u64,
    options: Options,
    /// `CLOCK_MONOTONIC` time of the last control tick, ns.
    last_tick_ns: u64,
}

/// The datapath's settings of a leaf class paced at `rate`, whose hosts' fair share is
/// `share` (bits/s; 0: none yet), quiet or not (see `pacing`).
fn class_config(class: &Class, rate: Rate, share: u64, quiet: bool) -> ClassConfig {
    let (target, interval) =
        class.aqm.map_or((0, 0), |a| codel_params(horizon_ns(a.target), horizon_ns(a.interval), rate));
    let isolation = match class.isolation {
        Isolation::None => ISOLATE_NONE,
        Isolation::Host => ISOLATE_HOST,
        Isolation::Flow => ISOLATE_FLOW,
    };
    let share_bytes = if isolation == ISOLATE_NONE { 0 } else { share / 8 };
    // A host is over its share once its clock is CoDel's target ahead: the standing queue
    // CoDel signals about is then its own. A larger slack withheld every signal from a class's
    // only host (at its share, its clock is as far ahead as the queue), and its queue grew to
    // the horizon. Without AQM, eight full frames. One that runs half the horizon ahead
    // ignores the congestion signals, and is dropped.
    let slack = if target == 0 { frames_ns(8, share_bytes).max(2_000_000) } else { target };
    ClassConfig {
        rate_bytes: rate.bytes_per_sec(),
        horizon_ns: horizon_ns(class.horizon),
        burst_ns: frames_ns(1, rate.bytes_per_sec()),
        codel_target_ns: target,
        codel_interval_ns: interval,
        isolation,
        flags: if quiet { CLASS_QUIET } else { 0 },
        share_bytes,
        share_horizon_ns: (horizon_ns(class.horizon) / 2).max(slack * 4),
        share_slack_ns: slack,
        // Two frames at the share: hosts sending a third of it or more contend for it.
        share_near_ns: frames_ns(2, share_bytes),
    }
}

/// CoDel's target and interval for a class paced at `rate`. A target shorter than the time a
/// few full-size frames take at that rate would signal congestion on every other packet and
/// starve TCP at low rates (at 300 kbit/s one frame takes 40 ms), so the target is at least
/// three frame times and the interval grows with it, as CAKE does (`cake_set_rate`, which
/// uses 1.5 frames but splits GSO packets; here a GSO packet of two segments is one packet).
pub(crate) fn codel_params(target_ns: u64, interval_ns: u64, rate: Rate) -> (u64, u64) {
    let frame_ns = demand::frames_ns(1, rate.bits_per_sec());
    let target = target_ns.max(frame_ns.saturating_mul(3));
    let interval = (interval_ns + (target - target_ns)).max(target.saturating_mul(2));
    (target, interval)
}

fn trees(config: &Config) -> Vec<IfaceTree> {
    config
        .interfaces
        .iter()
        .map(|i| {
            let (tree, classes) = Tree::from_config(config, &i.name);
            IfaceTree { tree, classes, pacer: Pacer::default() }
        })
        .collect()
}

/// fq limits that hold every packet the horizons admit (see [`qdisc::FqLimits`]): the
/// fastest class's ceil over its horizon, in 1000-byte packets, per flow (a class may be a
/// single flow), and four times that in all.
fn fq_limits(config: &Config, iface: &str) -> qdisc::FqLimits {
    let most_bytes = config
        .classes
        .iter()
        .filter(|c| c.interface == iface)
        .map(|c| u128::from(c.ceil.bits_per_sec() / 8) * c.horizon.as_nanos() / 1_000_000_000)
        .max()
        .unwrap_or(0);
    let flow = u32::try_from(most_bytes / 1000).unwrap_or(u32::MAX).clamp(1_000, 100_000);
    qdisc::FqLimits { packets: flow.saturating_mul(4).max(10_000), flow_packets: flow }
}

/// `CLOCK_MONOTONIC` now, in ns: the clock of the datapath's departure times.
fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: valid pointer to a timespec.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &raw mut ts) };
    u64::try_from(ts.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec).unwrap_or(0)
}

struct Shared {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (index != 0).then_some(index)
}

/// Interfaces without a link-layer header (tun, WireGuard, PPP) hand the program packets that
/// start with the IP header. The hardware type comes from `SIOCGIFHWADDR`, which asks this
/// thread's network namespace (`/sys/class/net` shows the namespace sysfs was mounted in).
fn is_l3(name: &str) -> bool {
    // SAFETY: an all-zero ifreq is valid.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    if name.len() >= ifr.ifr_name.len() {
        return false;
    }
    for (dst, &src) in ifr.ifr_name.iter_mut().zip(name.as_bytes()) {
        *dst = src.cast_signed();
    }
    // SAFETY: plain socket(2); the descriptor is closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return false;
    }
    // SAFETY: SIOCGIFHWADDR fills the ifreq we pass.
    let rc = unsafe { libc::ioctl(fd, libc::SIOCGIFHWADDR, &raw mut ifr) };
    // SAFETY: fd is ours.
    unsafe { libc::close(fd) };
    // SAFETY: on success the kernel wrote the hardware address variant of the union.
    // Ethernet and loopback devices carry an Ethernet header; the others shaper meets
    // (ARPHRD_NONE for tun and WireGuard, PPP, raw IP) start at the IP header.
    rc == 0 && !matches!(unsafe { ifr.ifr_ifru.ifru_hwaddr.sa_family }, libc::ARPHRD_ETHER | libc::ARPHRD_LOOPBACK)
}

fn horizon_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The rules of `config` with class and interface names resolved to ids; `ids[n]` is the
/// datapath id of `config.classes[n]`.
#[must_use]
pub fn rule_specs(config: &Config, ids: &[u32]) -> Vec<RuleSpec> {
    let position = |name: &str| config.classes.iter().position(|c| c.name == name).expect("validated");
    let slot = |iface: &str| config.interfaces.iter().position(|i| i.name == iface).expect("validated");
    config
        .rules
        .iter()
        .map(|r| {
            let class = position(&r.class);
            RuleSpec {
                index: u32::try_from(r.index).expect("fewer rules than u32::MAX"),
                line: r.line,
                class: ids[class],
                iface_slot: u16::try_from(slot(&config.classes[class].interface)).expect("at most MAX_INTERFACES"),
                src: r.src,
                dst: r.dst,
                proto: r.proto,
                sport: r.sport.map(|p| (p.start, p.end)),
                dport: r.dport.map(|p| (p.start, p.end)),
                mark: r.mark,
                dscp: r.dscp,
            }
        })
        .collect()
}

/// Datapath ids for the classes of `config`: a class that `previous` (name, id) already has
/// keeps its id, so its counters and pacing clock carry on; a new class takes the lowest id
/// that no class of either configuration uses, so no packet of a removed class is counted
/// for it while the rules switch over.
fn assign_ids(config: &Config, previous: &[(&str, u32)]) -> Option<Vec<u32>> {
    let taken: std::collections::HashSet<u32> = previous.iter().map(|&(_, id)| id).collect();
    let mut free = (0..MAX_CLASSES).filter(|id| !taken.contains(id));
    config
        .classes
        .iter()
        .map(|c| previous.iter().find(|(name, _)| *name == c.name).map(|&(_, id)| id).or_else(|| free.next()))
        .collect()
}

/// What the daemon is asked to do while it runs (the binary maps signals onto these).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Signal {
    /// Re-read the configuration file (SIGHUP).
    Reload,
    /// Detach, restore every interface and exit (SIGTERM, SIGINT).
    Stop,
    /// Exit and leave the datapath shaping at its last rates, pinned, for the next shaperd to
    /// take over (SIGUSR2; an upgrade).
    Handover,
}

/// Where the daemon listens and keeps its state.
#[derive(Clone, Debug)]
pub struct Options {
    /// The control socket.
    pub socket: PathBuf,
    /// Where the maps (and TCX links) are pinned, so that shaping outlives the process and a
    /// later shaperd takes it over; `None` keeps everything to this process.
    pub pin_dir: Option<PathBuf>,
}

impl Options {
    /// What the next shaperd needs to take the pinned maps over ([`Handover`]), kept beside
    /// the socket; none when nothing is pinned.
    fn handover_file(&self) -> Option<PathBuf> {
        self.pin_dir.as_ref().map(|_| self.socket.with_file_name("shaperd.handover.json"))
    }
}

/// What [`start`] set up.
struct Started {
    classes: Vec<ClassEntry>,
    server: Server,
    metrics_listener: Option<tokio::net::TcpListener>,
}

/// Runs the daemon until a [`Signal::Stop`] arrives (or `signals` closes), then detaches and
/// restores every interface; or until [`Signal::Handover`], leaving shaping in place. `ready`
/// is called once shaping is in place and the control socket listens (the binary tells
/// systemd).
///
/// Everything that can be checked without touching the kernel is checked first; if a later
/// step fails, what was already changed is undone before the error is returned.
pub async fn run(
    config: Config,
    options: Options,
    mut signals: tokio::sync::mpsc::Receiver<Signal>,
    ready: impl FnOnce(),
) -> Result<Exit, DaemonError> {
    let mut ifindexes = Vec::new();
    for iface in &config.interfaces {
        let index = ifindex(&iface.name)
            .ok_or_else(|| DaemonError::NoInterface { name: iface.name.clone(), path: config.path.clone() })?;
        ifindexes.push(index);
    }
    // Compiled before the kernel is touched, so that rules it cannot hold are refused first.
    let fresh_ids = assign_ids(&config, &[]).expect("validated: at most MAX_CLASSES classes");
    let compiled = rules::compile(&rule_specs(&config, &fresh_ids))
        .map_err(|source| DaemonError::Rules { path: config.path.clone(), source })?;
    let (mut datapath, adopted) = match &options.pin_dir {
        Some(root) => Datapath::load_pinned(root)?,
        None => (Datapath::load()?, false),
    };
    if adopted {
        info!(pins = %options.pin_dir.as_deref().unwrap_or(Path::new("")).display(), "taking over the maps an earlier shaperd left");
    }
    let mut guards: Vec<FqGuard> = Vec::new();
    let fresh = (fresh_ids, compiled);
    let started = start(&config, &options, &mut datapath, adopted, &ifindexes, fresh, &mut guards).await;
    let Started { classes, server, metrics_listener } = match started {
        Ok(s) => s,
        Err(e) => {
            teardown(&mut datapath, guards, &options).await;
            return Err(e);
        }
    };
    info!(config = %config.path.display(), socket = %options.socket.display(), classes = classes.len(), rules = config.rules.len(), "shaping");
    ready();

    let tick = config.daemon.tick;
    let trees = trees(&config);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            config,
            classes,
            trees,
            datapath,
            ifindexes,
            generation: 0,
            options: options.clone(),
            last_tick_ns: monotonic_ns(),
        }),
        metrics: Arc::new(Metrics::new()),
    });
    let (stop, stopped) = watch::channel(false);
    let control = tokio::spawn(control_loop(Arc::clone(&shared), tick, stopped.clone()));
    let exporter = metrics_listener.map(|listener| spawn_exporter(listener, &shared, stopped.clone()));
    let mut server_stopped = stopped;
    let (last, ()) = tokio::join!(
        async {
            let mut last = Signal::Stop;
            while let Some(signal) = signals.recv().await {
                match signal {
                    Signal::Reload => {
                        if let Err(e) = shared.reload().await {
                            error!(error = %e, "reload refused; the running configuration stays in force");
                        }
                    }
                    Signal::Stop | Signal::Handover => {
                        last = signal;
                        break;
                    }
                }
            }
            let _ = stop.send(true);
            last
        },
        server.serve(Arc::clone(&shared), async move {
            let _ = server_stopped.wait_for(|s| *s).await;
        }),
    );
    if let Err(e) = control.await {
        warn!(error = %e, "the control loop ended abnormally");
    }
    if let Some(Err(e)) = match exporter {
        Some(task) => Some(task.await),
        None => None,
    } {
        warn!(error = %e, "the metrics endpoint ended abnormally");
    }
    drop(server);
    let mut state = shared.state.lock().await;
    if last == Signal::Handover && options.pin_dir.is_some() {
        state.datapath.leave_in_place();
        info!("exiting with the datapath left in place at its last rates, for the next shaperd to take over");
        Ok(Exit::HandedOver)
    } else {
        if last == Signal::Handover {
            warn!("nothing is pinned (--no-pin): stopping instead of handing over");
        }
        info!("shutting down");
        teardown(&mut state.datapath, guards, &options).await;
        Ok(Exit::Stopped)
    }
}

/// How [`run`] ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Everything was detached and restored.
    Stopped,
    /// The datapath was left shaping for the next shaperd ([`Signal::Handover`]).
    HandedOver,
}

/// Sets everything up: `fq` on each interface, the classes, the rules, the attachments, the
/// control socket and the metrics listener. `fresh` is the class ids in file order and the
/// rules compiled with them; with `adopted` maps, the class ids and rates an earlier shaperd
/// used carry on instead (and the rules are compiled again only if its ids differ).
async fn start(
    config: &Config,
    options: &Options,
    datapath: &mut Datapath,
    adopted: bool,
    ifindexes: &[u32],
    fresh: (Vec<u32>, rules::Compiled),
    guards: &mut Vec<FqGuard>,
) -> Result<Started, DaemonError> {
    let handover = match options.handover_file() {
        Some(path) if adopted => Handover::read(&path),
        _ => Handover::default(),
    };
    datapath.assume_bank_ports(handover.bank_ports);
    let previous: Vec<(&str, u32)> = handover.classes.iter().map(|(n, id)| (n.as_str(), *id)).collect();
    let ids = assign_ids(config, &previous).expect("validated: at most MAX_CLASSES classes");
    let (fresh_ids, mut compiled) = fresh;
    if ids != fresh_ids {
        compiled = rules::compile(&rule_specs(config, &ids))
            .map_err(|source| DaemonError::Rules { path: config.path.clone(), source })?;
    }
    for iface in &config.interfaces {
        guards.push(qdisc::ensure_fq(&iface.name, iface.replace_qdisc, fq_limits(config, &iface.name)).await?);
    }
    let mut classes = Vec::new();
    for (class, &id) in config.classes.iter().zip(&ids) {
        let leaf = config.is_leaf(&class.name);
        let mut entry = ClassEntry::new(id, leaf, class.rate);
        if leaf {
            if previous.iter().any(|&(n, _)| n == class.name) {
                // Go on at the rate the class was paced at, not back to its guarantee.
                let paced = Rate::from_bits_per_sec(datapath.class_config(id)?.rate_bytes.saturating_mul(8));
                entry.current = paced.max(class.rate).min(class.ceil);
            }
            datapath.set_class(id, class_config(class, entry.current, entry.share, entry.quiet))?;
        }
        classes.push(entry);
    }
    set_ifaces(datapath, config, ifindexes, &ids)?;
    datapath.load_rules(&compiled)?;
    for iface in &config.interfaces {
        let (mode, took_over) = datapath.attach(&iface.name)?;
        info!(interface = %iface.name, ?mode, took_over, "attached at egress");
    }
    if let Some(path) = options.handover_file() {
        Handover::write(&path, config, &ids, datapath);
    }
    let server = Server::bind(&options.socket).await?;
    let metrics_listener = match config.daemon.metrics_listen {
        Some(addr) => {
            Some(tokio::net::TcpListener::bind(addr).await.map_err(|source| DaemonError::Metrics { addr, source })?)
        }
        None => None,
    };
    Ok(Started { classes, server, metrics_listener })
}

/// What a shaperd records beside its socket for the next one to take its pinned maps over:
/// which datapath id each class has, and which ports each rule bank uses.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Handover {
    classes: Vec<(String, u32)>,
    bank_ports: [Option<Vec<u32>>; 2],
}

impl Handover {
    /// What an earlier shaperd wrote; nothing if there is no file or it cannot be read (the
    /// classes then get fresh ids, in file order).
    fn read(path: &Path) -> Handover {
        match std::fs::read(path) {
            Ok(bytes) => serde_json::from_slice(&bytes).unwrap_or_else(|e| {
                warn!(file = %path.display(), error = %e, "ignoring an unreadable handover file");
                Handover::default()
            }),
            Err(e) => {
                if e.kind() != std::io::ErrorKind::NotFound {
                    warn!(file = %path.display(), error = %e, "reading the handover file");
                }
                Handover::default()
            }
        }
    }

    /// Records the state of `datapath` running `config` with class ids `ids`.
    fn write(path: &Path, config: &Config, ids: &[u32], datapath: &Datapath) {
        let handover = Handover {
            classes: config.classes.iter().zip(ids).map(|(c, &id)| (c.name.clone(), id)).collect(),
            bank_ports: datapath.bank_ports(),
        };
        let json = serde_json::to_vec(&handover).expect("serializable");
        let tmp = path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path)) {
            warn!(file = %path.display(), error = %e, "writing the handover file");
        }
    }
}

/// Serves Prometheus scrapes from `listener` until `stopped` turns true.
fn spawn_exporter(
    listener: tokio::net::TcpListener,
    shared: &Arc<Shared>,
    mut stopped: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    let source = Arc::clone(shared);
    let listen = listener.local_addr().map_or_else(|e| e.to_string(), |a| a.to_string());
    info!(%listen, "serving Prometheus metrics at /metrics");
    tokio::spawn(metrics::serve(
        listener,
        Arc::clone(&shared.metrics),
        move || {
            let source = Arc::clone(&source);
            async move { source.state.lock().await.snapshot() }
        },
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        },
    ))
}

/// Writes each interface's slot, default class and overhead.
fn set_ifaces(datapath: &mut Datapath, config: &Config, ifindexes: &[u32], ids: &[u32]) -> Result<(), BpfError> {
    for (slot, (iface, &index)) in config.interfaces.iter().zip(ifindexes).enumerate() {
        let default = config.classes.iter().position(|c| c.name == iface.default_class).expect("validated");
        let flags = IFACE_ENABLED
            | if is_l3(&iface.name) { IFACE_L3 } else { 0 }
            | if iface.direction == Direction::Download { IFACE_DOWNLOAD } else { 0 };
        datapath.set_iface(
            index,
            IfaceConfig {
                slot: u32::try_from(slot).expect("at most MAX_INTERFACES"),
                default_class: ids[default],
                overhead: iface.overhead,
                flags,
                link_bytes: iface.rate.bytes_per_sec() / 100 * (100 + LINK_SLACK_PERCENT),
            },
        )?;
    }
    Ok(())
}

/// Every `tick`: measure each leaf's demand, run the allocator, write the new rates.
async fn control_loop(shared: Arc<Shared>, tick: Duration, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(tick);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            changed = stopped.changed() => {
                if changed.is_err() || *stopped.borrow() {
                    return;
                }
            }
            _ = interval.tick() => {
                let mut state = shared.state.lock().await;
                let started = Instant::now();
                if let Err(e) = state.control_tick() {
                    warn!(error = %e, "control tick");
                }
                shared.metrics.observe_tick(started.elapsed());
            }
        }
    }
}

/// Detaches the program, removes the clsact qdiscs it added, restores the root qdiscs and
/// removes the pins and the handover file.
async fn teardown(datapath: &mut Datapath, guards: Vec<FqGuard>, options: &Options) {
    match datapath.detach_all() {
        Ok(added_clsact) => {
            for iface in added_clsact {
                if let Err(e) = qdisc::delete_clsact(&iface).await {
                    warn!(interface = %iface, error = %e, "removing the clsact qdisc");
                }
            }
        }
        Err(e) => warn!(error = %e, "detaching"),
    }
    for guard in guards {
        let iface = guard.ifname().to_owned();
        if let Err(e) = guard.restore().await {
            warn!(interface = %iface, error = %e, "restoring the root qdisc");
        }
    }
    if let Err(e) = datapath.unpin_maps() {
        warn!(error = %e, "removing the pins");
    }
    if let Some(path) = options.handover_file() {
        let _ = std::fs::remove_file(path);
    }
}

impl State {
    /// One round of the control loop.
    fn control_tick(&mut self) -> Result<(), BpfError> {
        let mono = monotonic_ns();
        let elapsed = mono.saturating_sub(std::mem::replace(&mut self.last_tick_ns, mono));
        for t in &mut self.trees {
            let mut leaves = vec![pacing::Leaf::default(); t.tree.nodes.len()];
            // Isolation, per node: (bits/s from light hosts, hosts over their share, hosts
            // near it) over the last tick.
            let mut hosts = vec![(0u64, 0u64, 0u64); t.tree.nodes.len()];
            for (node, class) in t.classes.iter().enumerate() {
                let Some(c) = *class else { continue };
                let entry = &mut self.classes[c];
                if !entry.leaf {
                    continue;
                }
                let stats = self.datapath.class_stats(entry.id)?;
                let clock = self.datapath.class_state(entry.id)?.next_ns;
                let backlog = clock.saturating_sub(mono);
                let estimate = entry.estimator.update(&Observation {
                    now_ns: mono,
                    counters: Counters {
                        offered_bytes: stats.bytes
                            + stats.drop_horizon_bytes
                            + stats.drop_aqm_bytes
                            + stats.drop_share_bytes,
                        packets: stats.packets,
                        idle_packets: stats.idle_packets,
                    },
                    backlog_ns: backlog,
                    pacing: entry.current.bits_per_sec(),
                });
                entry.throughput = Rate::from_bits_per_sec(estimate.offered);
                entry.limited = estimate.limited;
                entry.record_delays(mono, stats.delay_hist);
                leaves[node] = pacing::Leaf {
                    demand: estimate.demand,
                    limited: estimate.limited,
                    lately_limited: estimate.lately_limited,
                    backlog_ns: backlog,
                };
                let now = (stats.share_under_bytes, stats.hosts_over, stats.hosts_near);
                let (under, over, near) = std::mem::replace(&mut entry.share_counters, now);
                let under_bits = u128::from(now.0.saturating_sub(under)) * 8 * 1_000_000_000;
                hosts[node] = (
                    u64::try_from(under_bits.checked_div(u128::from(elapsed)).unwrap_or(0)).unwrap_or(u64::MAX),
                    now.1.saturating_sub(over),
                    now.2.saturating_sub(near),
                );
            }
            let rates = t.pacer.tick(&t.tree, &leaves, mono);
            for (node, class) in t.classes.iter().enumerate() {
                let Some(c) = *class else { continue };
                let entry = &mut self.classes[c];
                entry.allocated = Rate::from_bits_per_sec(rates.allocated[node]);
                if !entry.leaf {
                    continue;
                }
                let spec = &self.config.classes[c];
                let pacing = Rate::from_bits_per_sec(rates.pacing[node]);
                let (under, over, near) = hosts[node];
                let share = demand::fair_share(pacing.bits_per_sec(), entry.limited, under, over, near, entry.share);
                let quiet = rates.quiet[node];
                // Rewritten when the rate or quietness changes, or the share by more than 1/32.
                if pacing != entry.current || quiet != entry.quiet || share.abs_diff(entry.share) > entry.share / 32 {
                    self.datapath.set_class(entry.id, class_config(spec, pacing, share, quiet))?;
                    if pacing != entry.current {
                        debug!(class = %spec.name, from = %entry.current, to = %pacing, "rate");
                    }
                    entry.current = pacing;
                    entry.share = share;
                    entry.quiet = quiet;
                }
            }
        }
        self.datapath.next_epoch()?;
        Ok(())
    }

    /// Every class's counters and rates, for a Prometheus scrape. A class whose counters
    /// cannot be read is left out (and logged) rather than failing the whole scrape.
    fn snapshot(&self) -> Snapshot {
        let mut classes = Vec::with_capacity(self.classes.len());
        for (class, entry) in self.config.classes.iter().zip(&self.classes) {
            let s = match self.datapath.class_stats(entry.id) {
                Ok(s) => s,
                Err(e) => {
                    warn!(class = %class.name, error = %e, "reading counters for a scrape");
                    continue;
                }
            };
            classes.push(ClassSample {
                interface: class.interface.clone(),
                class: class.name.clone(),
                leaf: entry.leaf,
                bytes: s.bytes,
                packets: s.packets,
                drops_horizon_packets: s.drop_horizon_packets,
                drops_horizon_bytes: s.drop_horizon_bytes,
                drops_aqm_packets: s.drop_aqm_packets,
                drops_aqm_bytes: s.drop_aqm_bytes,
                drops_share_packets: s.drop_share_packets,
                drops_share_bytes: s.drop_share_bytes,
                ecn_marks: s.ecn_marked_packets,
                rate_bps: class.rate.bits_per_sec(),
                ceil_bps: class.ceil.bits_per_sec(),
                allocated_bps: entry.allocated.bits_per_sec(),
                pacing_bps: if entry.leaf { entry.current.bits_per_sec() } else { 0 },
                delay_buckets: s.delay_hist,
                delay_ns_total: s.delay_ns_total,
            });
        }
        Snapshot { generation: self.generation, classes }
    }

    fn status(&self) -> Result<Status, ApiError> {
        let mut out = Vec::new();
        for (class, entry) in self.config.classes.iter().zip(&self.classes) {
            let s = self.datapath.class_stats(entry.id).map_err(|e| ApiError::Internal { message: format!("{e}") })?;
            let drops = s.drop_horizon_packets + s.drop_aqm_packets + s.drop_share_packets;
            out.push(ClassStatus {
                name: class.name.clone(),
                interface: class.interface.clone(),
                parent: class.parent.clone(),
                leaf: entry.leaf,
                rate: class.rate,
                ceil: class.ceil,
                prio: class.prio,
                current_rate: entry.current,
                allocated: entry.allocated,
                throughput: entry.throughput,
                bytes: s.bytes,
                packets: s.packets,
                drops,
                drops_horizon: s.drop_horizon_packets,
                drops_aqm: s.drop_aqm_packets,
                drops_share: s.drop_share_packets,
                share: entry.share,
                ecn_marks: s.ecn_marked_packets,
                sparse_packets: s.sparse_packets,
                limited: entry.limited,
                delayed_packets: s.delayed_packets,
                mean_delay_us: s.delay_ns_total.checked_div(s.delayed_packets).unwrap_or(0) / 1000,
                p99_delay_us: entry.p99_delay_us(),
            });
        }
        Ok(Status { config: self.config.path.clone(), generation: self.generation, classes: out })
    }

    /// Changes one key of a class: in the configuration's text, validated as a whole file,
    /// then applied.
    fn set_class_key(&mut self, class: &str, key: ClassKey, value: &NewValue) -> Result<Response, ApiError> {
        let (_, config) =
            edit::set_class_key(&self.config.text, &self.config.path, class, key, value).map_err(|e| edit_error(&e))?;
        let changes = self.apply(config)?;
        Ok(Response::Changed { generation: self.generation, changes })
    }

    /// Makes `new` the running configuration: stable class ids, class parameters, interface
    /// defaults, then the rules in one switch (see [`Datapath::load_rules`]), then the
    /// allocation at once. Nothing is changed when the new configuration cannot be applied.
    fn apply(&mut self, new: Config) -> Result<Vec<String>, ApiError> {
        let invalid = |message: String| ApiError::InvalidConfig { message };
        let internal = |e: BpfError| ApiError::Internal { message: format!("{e}") };
        let old_ifaces: Vec<&str> = self.config.interfaces.iter().map(|i| i.name.as_str()).collect();
        let new_ifaces: Vec<&str> = new.interfaces.iter().map(|i| i.name.as_str()).collect();
        if old_ifaces != new_ifaces {
            return Err(invalid(format!(
                "{}: the interfaces would change from [{}] to [{}]; shaperd sets up interfaces when it \
                 starts: restart it to apply this",
                new.path.display(),
                old_ifaces.join(", "),
                new_ifaces.join(", ")
            )));
        }
        let previous: Vec<(&str, u32)> =
            self.config.classes.iter().zip(&self.classes).map(|(c, e)| (c.name.as_str(), e.id)).collect();
        let ids = assign_ids(&new, &previous).ok_or_else(|| {
            invalid(format!("{}: more than {MAX_CLASSES} classes old and new together", new.path.display()))
        })?;
        // A change of rates or priorities leaves the rules as they are: they are compiled and
        // switched only when they (or the class ids they resolve to) change.
        let specs = rule_specs(&new, &ids);
        let old_ids: Vec<u32> = self.classes.iter().map(|e| e.id).collect();
        let compiled = if specs == rule_specs(&self.config, &old_ids) {
            None
        } else {
            Some(rules::compile(&specs).map_err(|e| invalid(format!("{}: {e}", new.path.display())))?)
        };

        let mut entries = Vec::with_capacity(new.classes.len());
        for (class, &id) in new.classes.iter().zip(&ids) {
            let leaf = new.is_leaf(&class.name);
            let kept = self.config.classes.iter().position(|c| c.name == class.name).map(|p| &self.classes[p]);
            let entry = match kept {
                Some(e) if e.leaf == leaf => ClassEntry { current: e.current.max(class.rate), ..e.clone() },
                _ => ClassEntry::new(id, leaf, class.rate),
            };
            if leaf {
                self.datapath
                    .set_class(id, class_config(class, entry.current, entry.share, entry.quiet))
                    .map_err(internal)?;
            }
            entries.push(entry);
        }
        set_ifaces(&mut self.datapath, &new, &self.ifindexes, &ids).map_err(internal)?;
        if let Some(compiled) = &compiled {
            self.datapath.load_rules(compiled).map_err(internal)?;
        }
        // Classes that no longer carry traffic: unpaced and zeroed, so that a class that takes
        // the id later starts from nothing.
        for (class, entry) in self.config.classes.iter().zip(&self.classes) {
            let gone = new.class(&class.name).is_none();
            if gone || entry.leaf && !new.is_leaf(&class.name) {
                self.datapath.set_class(entry.id, ClassConfig::default()).map_err(internal)?;
            }
            if gone {
                self.datapath.reset_class(entry.id).map_err(internal)?;
            }
        }
        let changes = describe_changes(&self.config, &new);
        if let Some(path) = self.options.handover_file() {
            Handover::write(&path, &new, &ids, &self.datapath);
        }
        self.config = new;
        self.classes = entries;
        self.trees = trees(&self.config);
        self.generation += 1;
        self.control_tick().map_err(internal)?;
        for change in &changes {
            info!(generation = self.generation, %change, "applied");
        }
        Ok(changes)
    }
}

/// The API error for a runtime change that the configuration refuses.
fn edit_error(e: &EditError) -> ApiError {
    let message = format!("{}", ErrorChain(e));
    match e {
        EditError::UnknownClass { .. } => ApiError::UnknownClass { message },
        EditError::Invalid { source, .. }
            if source.key().and_then(|k| k.rsplit('.').next()).is_some_and(|k| k == "rate" || k == "ceil") =>
        {
            ApiError::InvalidRate { message }
        }
        _ => ApiError::InvalidConfig { message },
    }
}

impl Shared {
    /// Re-reads the configuration file and applies it; the running configuration stays in
    /// force if the file is not valid.
    async fn reload(&self) -> Result<Response, ApiError> {
        let mut state = self.state.lock().await;
        let path = state.config.path.clone();
        let new =
            Config::load(&path).map_err(|e| ApiError::InvalidConfig { message: format!("{}", ErrorChain(&e)) })?;
        let changes = state.apply(new)?;
        info!(generation = state.generation, changes = changes.len(), config = %path.display(), "reloaded");
        Ok(Response::Changed { generation: state.generation, changes })
    }
}

impl Handler for Shared {
    #[instrument(skip(self))]
    async fn handle(&self, request: Request) -> Reply {
        let mut state = self.state.lock().await;
        match request {
            Request::Status {} => state.status().map(Response::Status),
            Request::SetRate { class, rate } => {
                state.set_class_key(&class, ClassKey::Rate, &NewValue::Rate(rate.to_string()))
            }
            Request::SetCeil { class, ceil } => {
                state.set_class_key(&class, ClassKey::Ceil, &NewValue::Rate(ceil.to_string()))
            }
            Request::SetPrio { class, prio } => state.set_class_key(&class, ClassKey::Prio, &NewValue::Prio(prio)),
            Request::Reload {} => {
                drop(state);
                self.reload().await
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_missing_interfaces_are_not_l3() {
        assert!(!is_l3("lo"), "loopback frames carry an Ethernet header");
        assert!(!is_l3("no-such-if0"));
        assert!(!is_l3("a-name-longer-than-ifnamsiz"));
    }

    fn config(classes: &[&str]) -> Config {
        let text: String = classes
            .iter()
            .map(|c| format!("[[class]]\nname = \"{c}\"\nrate = \"1mbit\"\n"))
            .fold(String::from("[[interface]]\nname = \"lan0\"\nrate = \"10mbit\"\ndefault = \"a\"\n"), |t, c| t + &c);
        Config::parse(&text, Path::new("t.toml")).unwrap()
    }

    #[test]
    fn class_ids_are_kept_by_name_and_new_ones_never_reuse_an_old_id() {
        let ids = assign_ids(&config(&["a", "b", "c"]), &[]).unwrap();
        assert_eq!(ids, [0, 1, 2]);
        // b removed, d added: a and c keep theirs; d takes neither b's nor anyone's.
        let ids = assign_ids(&config(&["a", "c", "d"]), &[("a", 0), ("b", 1), ("c", 2)]).unwrap();
        assert_eq!(ids, [0, 2, 3]);
    }
}
