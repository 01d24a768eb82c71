//! shaperd's wiring: from a validated configuration to a shaping datapath, the control
//! socket, and a clean shutdown that gives every interface back what it had.
//!
//! [`run`] takes the shutdown signal as a future, so tests drive the daemon the same way
//! the binary does with SIGTERM.

use std::{future::Future, path::PathBuf, sync::Arc, time::Duration};

use shaper_common::{ClassConfig, IfaceConfig, IFACE_ENABLED, IFACE_L3};
use tokio::sync::Mutex;
use tracing::{info, instrument, warn};

use crate::{
    api::{ApiError, ClassStatus, Handler, Reply, Request, Response, Server, SocketError, Status},
    bpf::{BpfError, Datapath},
    config::Config,
    qdisc::{self, FqGuard, QdiscError},
    rate::Rate,
    rules::{self, CompileError, RuleSpec},
};

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
}

struct State {
    config: Config,
    classes: Vec<ClassEntry>,
    datapath: Datapath,
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
            guards.push(qdisc::ensure_fq(&iface.name, iface.replace_qdisc).await?);
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
                datapath.set_class(
                    id,
                    ClassConfig { rate_bytes: class.rate.bytes_per_sec(), horizon_ns: horizon_ns(class.horizon) },
                )?;
            }
            classes.push(ClassEntry { id, leaf, current: if leaf { class.rate } else { Rate::ZERO } });
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

    let shared = Arc::new(Shared { state: Mutex::new(State { config, classes, datapath }) });
    server.serve(Arc::clone(&shared), shutdown).await;
    drop(server);
    info!("shutting down");
    let mut state = shared.state.lock().await;
    teardown(&mut state.datapath, guards).await;
    Ok(())
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
    fn status(&self) -> Result<Status, ApiError> {
        let mut out = Vec::new();
        for (class, entry) in self.config.classes.iter().zip(&self.classes) {
            let s = self.datapath.class_stats(entry.id).map_err(|e| ApiError::Internal { message: format!("{e}") })?;
            let drops = s.drop_horizon_packets + s.drop_contention_packets;
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
        let entry = &mut self.classes[pos];
        if entry.leaf {
            let horizon = horizon_ns(class.horizon);
            self.datapath
                .set_class(entry.id, ClassConfig { rate_bytes: rate.bytes_per_sec(), horizon_ns: horizon })
                .map_err(|e| ApiError::Internal { message: format!("{e}") })?;
            entry.current = rate;
        }
        let old = class.rate;
        self.config.classes[pos].rate = rate;
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
