//! shaperd's wiring: from a validated configuration to a shaping datapath, the control
//! socket, and a clean shutdown that gives every interface back what it had.
//!
//! [`run`] takes the daemon's signals from a channel, so tests drive the daemon the same way
//! the binary does with SIGTERM. The parts, one file each:
//! - `setup`: putting shaping in place (`fq`, classes, rules, attachments), and the value that
//!   takes it away again on shutdown (the pin lock and the sockets are taken before, in
//!   [`run`]);
//! - `state`: what the daemon tracks per class, and the control loop that sets the rates;
//! - `handler`: the `shaperctl` requests, reloads and runtime changes;
//! - `ids`: which datapath id each class takes, and the rules resolved to those ids;
//! - `links`: interfaces that are deleted and created again, renamed, or go down and up;
//! - `handover`: what a shaperd leaves beside its socket for the next one (upgrades);
//! - `ifb`: the IFB devices that interfaces shaped on ingress are shaped on.

mod handler;
mod handover;
mod ids;
mod ifb;
mod links;
mod setup;
mod state;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::Instant,
};

use futures::future::OptionFuture;
use tokio::sync::{watch, Mutex};
use tracing::{error, info, warn};

/// For the model of the rate path, which sets CoDel up as the daemon does.
#[cfg(any(test, feature = "model"))]
pub(crate) use self::state::codel_params;
use self::{
    ids::assign_ids,
    setup::{Installed, Started},
    state::{control_loop, monotonic_ns, trees, State},
};
pub use self::{ids::rule_specs, ifb::IfbError};
use crate::{
    allocation::demand::Histories,
    api::{Server, SocketError},
    bpf::{BpfError, Datapath, PinLock},
    config::Config,
    metrics::{self, Metrics},
    netdev,
    qdisc::QdiscError,
    rules::{self, CompileError},
};

/// Why the daemon could not start (or stop cleanly).
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// An interface of the configuration does not exist.
    #[error("interface {name} (in {path}): not found in this network namespace")]
    NoInterface { name: String, path: PathBuf },
    /// The rules do not fit in the datapath's tables.
    #[error("compiling the rules of {path}")]
    Rules {
        path: PathBuf,
        #[source]
        source: CompileError,
    },
    /// The `fq` root qdisc could not be put in place.
    #[error(transparent)]
    Qdisc(#[from] QdiscError),
    /// The datapath could not be loaded, attached or written.
    #[error(transparent)]
    Bpf(#[from] BpfError),
    /// The IFB device of an interface shaped on ingress could not be created.
    #[error(transparent)]
    Ifb(#[from] IfbError),
    /// The control socket could not be bound.
    #[error(transparent)]
    Socket(#[from] SocketError),
    /// The class arrays taken over from an earlier shaperd are too small for the configuration.
    #[error(
        "{path}: its {classes} classes do not fit beside the earlier shaperd's in the {slots} slots of the class \
         arrays taken over from it (sized for its configuration); stop shaperd, which removes its maps, and start \
         it again to size them for this one"
    )]
    ClassSlots { path: PathBuf, classes: usize, slots: u32 },
    /// The kernel's link events could not be subscribed to.
    #[error("subscribing to the kernel's link events (rtnetlink), to follow interfaces that come and go")]
    LinkEvents(#[source] std::io::Error),
    /// The Prometheus listener could not be bound.
    #[error("listening for Prometheus on {addr} (daemon.metrics_listen)")]
    Metrics {
        addr: std::net::SocketAddr,
        #[source]
        source: std::io::Error,
    },
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
    /// What the next shaperd needs to take the pinned maps over (the handover file), kept
    /// beside the socket; none when nothing is pinned.
    fn handover_file(&self) -> Option<PathBuf> {
        self.pin_dir.as_ref().map(|_| self.socket.with_file_name("shaperd.handover.json"))
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

/// What the control loop, the request handler and the metrics exporter share.
struct Shared {
    state: Mutex<State>,
    metrics: Arc<Metrics>,
}

/// The index of each configured interface, in file order; every interface `config` names
/// (shaped, or LAN side) must exist: the error is the name of one that does not.
fn ifindexes(config: &Config) -> Result<Vec<u32>, String> {
    if let Some(lan) = config.lan_interfaces().into_iter().find(|l| netdev::index(l).is_none()) {
        return Err(lan.to_owned());
    }
    config.interfaces.iter().map(|i| netdev::index(&i.name).ok_or_else(|| i.name.clone())).collect()
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
    let ifindexes = ifindexes(&config).map_err(|name| DaemonError::NoInterface { name, path: config.path.clone() })?;
    // Compiled before the kernel is touched, so that rules it cannot hold are refused first.
    let fresh_ids = assign_ids(&config, &[], shaper_common::class_slots(config.classes.len()))
        .expect("validated: at most MAX_CLASSES classes, which class_slots makes room for");
    let compiled = rules::compile(&rule_specs(&config, &fresh_ids))
        .map_err(|source| DaemonError::Rules { path: config.path.clone(), source })?;
    // What a running shaperd holds is checked before anything it shapes with is touched: the
    // pin directory's lock (a shaperd shapes with those maps), the control socket, the
    // metrics port. Failing on any of them leaves a running shaper, or the datapath a
    // stopped one left, as it was.
    let _pins = options.pin_dir.as_deref().map(PinLock::take).transpose()?;
    let server = Server::bind(&options.socket).await?;
    let metrics_listener = match config.daemon.metrics_listen {
        Some(addr) => {
            Some(tokio::net::TcpListener::bind(addr).await.map_err(|source| DaemonError::Metrics { addr, source })?)
        }
        None => None,
    };
    // Before the setup: what happens to an interface once it is set up waits there to be read.
    let link_events = links::Subscription::open().map_err(DaemonError::LinkEvents)?;
    let loading = Instant::now();
    let (mut datapath, adopted) = match &options.pin_dir {
        Some(root) => Datapath::load_pinned(root, config.classes.len())?,
        None => (Datapath::load_for(config.classes.len())?, false),
    };
    info!(took_ms = loading.elapsed().as_millis(), verified_instructions = ?datapath.verified_instructions(), "loaded the datapath");
    if adopted {
        info!(pins = %options.pin_dir.as_deref().unwrap_or(Path::new("")).display(), "taking over the maps an earlier shaperd left");
    }
    let fresh = (fresh_ids, compiled);
    let (installed, Started { classes, ifindexes }) =
        Installed::setup(&config, &options, &mut datapath, adopted, &ifindexes, fresh).await?;
    info!(config = %config.path.display(), socket = %options.socket.display(), classes = classes.len(), rules = config.rules.len(), "shaping");
    ready();

    let tick = config.daemon.tick;
    let trees = trees(&config);
    let shared = Arc::new(Shared {
        state: Mutex::new(State {
            file: config.clone(),
            config,
            classes,
            trees,
            datapath,
            ifindexes,
            generation: 0,
            options: options.clone(),
            last_tick_ns: monotonic_ns(),
            ticks: 0,
            histories: Histories::new(),
        }),
        metrics: Arc::new(Metrics::new()),
    });
    // Shared with the links task, which adds the fq of an interface created again.
    let installed = Arc::new(Mutex::new(installed));
    let (stop, stopped) = watch::channel(false);
    let control = tokio::spawn(control_loop(Arc::clone(&shared), tick, stopped.clone()));
    let follower =
        tokio::spawn(links::follow(Arc::clone(&shared), Arc::clone(&installed), link_events, stopped.clone()));
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
    let tasks = [(Some(control), "the control loop"), (Some(follower), "following the interfaces")];
    for (task, what) in tasks.into_iter().chain([(exporter, "the metrics endpoint")]) {
        if let Some(Err(e)) = OptionFuture::from(task).await {
            warn!(error = %e, "{what} ended abnormally");
        }
    }
    drop(server);
    let installed = Arc::into_inner(installed).expect("the links task has ended").into_inner();
    let mut state = shared.state.lock().await;
    if last == Signal::Handover && options.pin_dir.is_some() {
        installed.leave_in_place(&mut state.datapath);
        info!("exiting with the datapath left in place at its last rates, for the next shaperd to take over");
        Ok(Exit::HandedOver)
    } else {
        if last == Signal::Handover {
            warn!("nothing is pinned (--no-pin): stopping instead of handing over");
        }
        info!("shutting down");
        installed.undo(&mut state.datapath).await;
        Ok(Exit::Stopped)
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
