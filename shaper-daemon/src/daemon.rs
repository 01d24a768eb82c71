//! shaperd's wiring: from a validated configuration to a shaping datapath, the control
//! socket, and a clean shutdown that gives every interface back what it had.
//!
//! [`run`] takes the shutdown signal as a future, so tests drive the daemon the same way
//! the binary does with SIGTERM.

use std::{
    future::Future,
    path::PathBuf,
    sync::Arc,
    time::{Duration, Instant},
};

use shaper_common::{ClassConfig, IfaceConfig, IFACE_ENABLED, IFACE_L3};
use tokio::sync::{watch, Mutex};
use tracing::{debug, info, instrument, warn};

use crate::{
    api::{ApiError, ClassStatus, Handler, Reply, Request, Response, Server, SocketError, Status},
    bpf::{BpfError, Datapath},
    config::{Class, Config},
    control::{self, Meter, Observation},
    qdisc::{self, FqGuard, QdiscError},
    rate::Rate,
    rules::{self, CompileError, RuleSpec},
    tree::Tree,
};

/// How far back the demand of a class is measured: long enough to tell a queue that lasts
/// from a burst that drains (an application's 128 KB write takes 200 ms at 5 mbit/s), short
/// enough that an idle class gives its share back within the 300 ms the shares must settle
/// in.
const METER_WINDOW: Duration = Duration::from_millis(200);

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
    meter: Meter,
}

/// One interface's class tree; node `n` stands for class `classes[n]` (root: `None`).
struct IfaceTree {
    tree: Tree,
    classes: Vec<Option<usize>>,
}

struct State {
    config: Config,
    classes: Vec<ClassEntry>,
    trees: Vec<IfaceTree>,
    datapath: Datapath,
}

fn class_config(class: &Class, rate: Rate) -> ClassConfig {
    let (target, interval) =
        class.aqm.map_or((0, 0), |a| codel_params(horizon_ns(a.target), horizon_ns(a.interval), rate));
    ClassConfig {
        rate_bytes: rate.bytes_per_sec(),
        horizon_ns: horizon_ns(class.horizon),
        codel_target_ns: target,
        codel_interval_ns: interval,
    }
}

/// CoDel's target and interval for a class paced at `rate`. A target shorter than the time a
/// few full-size frames take at that rate would signal congestion on every other packet and
/// starve TCP at low rates (at 300 kbit/s one frame takes 40 ms), so the target is at least
/// three frame times and the interval grows with it, as CAKE does (`cake_set_rate`, which
/// uses 1.5 frames but splits GSO packets; here a GSO packet of two segments is one packet).
fn codel_params(target_ns: u64, interval_ns: u64, rate: Rate) -> (u64, u64) {
    const FRAME_BITS: u64 = 1514 * 8;
    let frame_ns = u64::try_from(u128::from(FRAME_BITS) * 1_000_000_000 / u128::from(rate.bits_per_sec().max(1)))
        .unwrap_or(u64::MAX);
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
            IfaceTree { tree, classes }
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
}

fn ifindex(name: &str) -> Option<u32> {
    let c = std::ffi::CString::new(name).ok()?;
    // SAFETY: valid NUL-terminated string.
    let index = unsafe { libc::if_nametoindex(c.as_ptr()) };
    (index != 0).then_some(index)
}

/// Interfaces without a link-layer header (tun, WireGuard, PPP) hand the program packets that
/// start with the IP header.
fn is_l3(name: &str) -> bool {
    const ARPHRD_ETHER: &str = "1";
    std::fs::read_to_string(format!("/sys/class/net/{name}/type")).is_ok_and(|t| t.trim() != ARPHRD_ETHER)
}

fn horizon_ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The rules of `config` with class and interface names resolved to ids.
#[must_use]
pub fn rule_specs(config: &Config) -> Vec<RuleSpec> {
    let class_id = |name: &str| config.classes.iter().position(|c| c.name == name).expect("validated");
    let slot = |iface: &str| config.interfaces.iter().position(|i| i.name == iface).expect("validated");
    config
        .rules
        .iter()
        .map(|r| {
            let class = &config.classes[class_id(&r.class)];
            RuleSpec {
                index: u32::try_from(r.index).expect("fewer rules than u32::MAX"),
                line: r.line,
                class: u32::try_from(class_id(&r.class)).expect("at most MAX_CLASSES"),
                iface_slot: u16::try_from(slot(&class.interface)).expect("at most MAX_INTERFACES"),
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

/// Runs the daemon until `shutdown` completes, then detaches and restores every interface.
///
/// Everything that can be checked without touching the kernel is checked first; if a later
/// step fails, what was already changed is undone before the error is returned.
pub async fn run(config: Config, socket: PathBuf, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    let mut ifindexes = Vec::new();
    for iface in &config.interfaces {
        let index = ifindex(&iface.name)
            .ok_or_else(|| DaemonError::NoInterface { name: iface.name.clone(), path: config.path.clone() })?;
        ifindexes.push(index);
    }
    let compiled = rules::compile(&rule_specs(&config))
        .map_err(|source| DaemonError::Rules { path: config.path.clone(), source })?;
    let mut datapath = Datapath::load()?;

    let mut guards: Vec<FqGuard> = Vec::new();
    let started = async {
        for iface in &config.interfaces {
            guards.push(qdisc::ensure_fq(&iface.name, iface.replace_qdisc, fq_limits(&config, &iface.name)).await?);
        }
        for (slot, (iface, &index)) in config.interfaces.iter().zip(&ifindexes).enumerate() {
            let default = config.classes.iter().position(|c| c.name == iface.default_class).expect("validated");
            let flags = IFACE_ENABLED | if is_l3(&iface.name) { IFACE_L3 } else { 0 };
            datapath.set_iface(
                index,
                IfaceConfig {
                    slot: u32::try_from(slot).expect("at most MAX_INTERFACES"),
                    default_class: u32::try_from(default).expect("at most MAX_CLASSES"),
                    overhead: iface.overhead,
                    flags,
                },
            )?;
        }
        datapath.load_rules(&compiled)?;
        let mut classes = Vec::new();
        for (id, class) in config.classes.iter().enumerate() {
            let id = u32::try_from(id).expect("at most MAX_CLASSES");
            let leaf = config.is_leaf(&class.name);
            if leaf {
                datapath.set_class(id, class_config(class, class.rate))?;
            }
            classes.push(ClassEntry {
                id,
                leaf,
                current: if leaf { class.rate } else { Rate::ZERO },
                allocated: Rate::ZERO,
                meter: Meter::new(METER_WINDOW),
            });
        }
        for iface in &config.interfaces {
            let mode = datapath.attach(&iface.name)?;
            info!(interface = %iface.name, ?mode, "attached at egress");
        }
        let server = Server::bind(&socket).await?;
        Ok::<_, DaemonError>((classes, server))
    }
    .await;

    let (classes, server) = match started {
        Ok(s) => s,
        Err(e) => {
            teardown(&mut datapath, guards).await;
            return Err(e);
        }
    };
    info!(config = %config.path.display(), socket = %socket.display(), classes = classes.len(), rules = config.rules.len(), "shaping");

    let tick = config.daemon.tick;
    let trees = trees(&config);
    let shared = Arc::new(Shared { state: Mutex::new(State { config, classes, trees, datapath }) });
    let (stop, stopped) = watch::channel(false);
    let control = tokio::spawn(control_loop(Arc::clone(&shared), tick, stopped.clone()));
    let mut server_stopped = stopped;
    tokio::join!(
        async {
            shutdown.await;
            let _ = stop.send(true);
        },
        server.serve(Arc::clone(&shared), async move {
            let _ = server_stopped.wait_for(|s| *s).await;
        }),
    );
    if let Err(e) = control.await {
        warn!(error = %e, "the control loop ended abnormally");
    }
    drop(server);
    info!("shutting down");
    let mut state = shared.state.lock().await;
    teardown(&mut state.datapath, guards).await;
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
                if let Err(e) = state.control_tick(Instant::now()) {
                    warn!(error = %e, "control tick");
                }
            }
        }
    }
}

/// Detaches the program, removes the clsact qdiscs it added and restores the root qdiscs.
async fn teardown(datapath: &mut Datapath, guards: Vec<FqGuard>) {
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
}

impl State {
    /// One round of the control loop.
    fn control_tick(&mut self, now: Instant) -> Result<(), BpfError> {
        let mono = monotonic_ns();
        for t in &self.trees {
            let mut demand = vec![0u64; t.tree.nodes.len()];
            for (node, class) in t.classes.iter().enumerate() {
                let Some(c) = *class else { continue };
                let entry = &mut self.classes[c];
                if !entry.leaf {
                    continue;
                }
                let stats = self.datapath.class_stats(entry.id)?;
                let clock = self.datapath.class_state(entry.id)?.next_ns;
                let offered = stats.bytes + stats.drop_horizon_bytes + stats.drop_aqm_bytes;
                let pacing = entry.current.bits_per_sec();
                let queued = control::queued(clock.saturating_sub(mono), pacing);
                let r = entry.meter.update(now, offered, queued);
                let o = Observation {
                    offered: r.rate,
                    queued_permille: r.queued_permille,
                    samples: r.samples,
                    queued_streak: r.queued_streak,
                    pacing,
                };
                demand[node] = control::demand(&o);
            }
            let alloc = t.tree.allocate(&demand);
            for (node, class) in t.classes.iter().enumerate() {
                let Some(c) = *class else { continue };
                let entry = &mut self.classes[c];
                entry.allocated = Rate::from_bits_per_sec(alloc[node]);
                if !entry.leaf {
                    continue;
                }
                let spec = &self.config.classes[c];
                let pacing = Rate::from_bits_per_sec(control::pacing_rate(alloc[node], spec.rate.bits_per_sec()));
                if pacing != entry.current {
                    self.datapath.set_class(entry.id, class_config(spec, pacing))?;
                    debug!(class = %spec.name, from = %entry.current, to = %pacing, "rate");
                    entry.current = pacing;
                }
            }
        }
        Ok(())
    }

    fn status(&self) -> Result<Status, ApiError> {
        let mut out = Vec::new();
        for (class, entry) in self.config.classes.iter().zip(&self.classes) {
            let s = self.datapath.class_stats(entry.id).map_err(|e| ApiError::Internal { message: format!("{e}") })?;
            let drops = s.drop_horizon_packets + s.drop_aqm_packets;
            out.push(ClassStatus {
                name: class.name.clone(),
                interface: class.interface.clone(),
                parent: class.parent.clone(),
                leaf: entry.leaf,
                rate: class.rate,
                ceil: class.ceil,
                prio: class.prio,
                current_rate: entry.current,
                bytes: s.bytes,
                packets: s.packets,
                drops,
                drops_horizon: s.drop_horizon_packets,
                drops_aqm: s.drop_aqm_packets,
                ecn_marks: s.ecn_marked_packets,
                delayed_packets: s.delayed_packets,
                mean_delay_us: s.delay_ns_total.checked_div(s.delayed_packets).unwrap_or(0) / 1000,
            });
        }
        Ok(Status { classes: out })
    }

    fn set_rate(&mut self, name: &str, rate: Rate) -> Result<Response, ApiError> {
        let Some(pos) = self.config.classes.iter().position(|c| c.name == name) else {
            let names: Vec<&str> = self.config.classes.iter().map(|c| c.name.as_str()).collect();
            return Err(ApiError::UnknownClass {
                message: format!("no class named `{name}`; classes: {}", names.join(", ")),
            });
        };
        let class = &self.config.classes[pos];
        if rate == Rate::ZERO {
            return Err(ApiError::InvalidRate {
                message: format!("class `{name}`: a rate of 0 would stop the class; give a positive rate"),
            });
        }
        if rate > class.ceil {
            return Err(ApiError::InvalidRate {
                message: format!("class `{name}`: rate {rate} is above its ceil {}", class.ceil),
            });
        }
        // The guarantees of the class and its siblings must still fit in what their parent
        // (or the interface) guarantees.
        let (budget, owner) = match &class.parent {
            Some(p) => (self.config.class(p).expect("validated").rate, format!("parent class `{p}`")),
            None => (
                self.config.interface(&class.interface).expect("validated").rate,
                format!("interface {}", class.interface),
            ),
        };
        let siblings: u64 = self
            .config
            .classes
            .iter()
            .filter(|c| c.interface == class.interface && c.parent == class.parent && c.name != name)
            .map(|c| c.rate.bits_per_sec())
            .sum();
        let total = siblings + rate.bits_per_sec();
        if total > budget.bits_per_sec() {
            return Err(ApiError::InvalidRate {
                message: format!(
                    "class `{name}`: with rate {rate}, the guaranteed rates under {owner} would sum to {}, over its {budget}",
                    Rate::from_bits_per_sec(total)
                ),
            });
        }
        let children: u64 = self.config.children(name).map(|c| c.rate.bits_per_sec()).sum();
        if children > rate.bits_per_sec() {
            return Err(ApiError::InvalidRate {
                message: format!(
                    "class `{name}`: its children are guaranteed {} in all, more than {rate}",
                    Rate::from_bits_per_sec(children)
                ),
            });
        }
        let old = class.rate;
        self.config.classes[pos].rate = rate;
        self.trees = trees(&self.config);
        // Apply now rather than at the next tick.
        self.control_tick(Instant::now()).map_err(|e| ApiError::Internal { message: format!("{e}") })?;
        info!(class = name, from = %old, to = %rate, "set rate");
        Ok(Response::Applied { class: name.to_owned(), rate })
    }
}

impl Handler for Shared {
    #[instrument(skip(self))]
    async fn handle(&self, request: Request) -> Reply {
        let mut state = self.state.lock().await;
        match request {
            Request::Status {} => state.status().map(Response::Status),
            Request::SetRate { class, rate } => state.set_rate(&class, rate),
        }
    }
}
