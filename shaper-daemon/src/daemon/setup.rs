//! Putting shaping in place and taking it away again.
//!
//! [`Installed::setup`] installs `fq` on each interface (on its IFB device, created first, for
//! one shaped on ingress: see `ifb`), writes the classes, interfaces and rules into the
//! datapath and attaches the program at egress (and the redirect at ingress of an interface
//! shaped on ingress). The pin lock, the control socket and the metrics listener are taken
//! before, in `run`, so that a start that cannot finish fails before it touches anything. It
//! returns an [`Installed`]: what it changed
//! outside this process, to be given back by [`Installed::undo`] on shutdown, or left for the
//! next shaperd by [`Installed::leave_in_place`] on a handover. If a step of the setup fails,
//! what the earlier steps changed is undone before the error is returned, unless the datapath
//! was taken over from an earlier shaperd: that one is left shaping, as it was left.

use std::collections::HashSet;
use std::path::PathBuf;

use shaper_common::{IfaceConfig, IFACE_DOWNLOAD, IFACE_ENABLED, IFACE_L3, IFACE_NAT, LAN_L3, LINK_SLACK_PERCENT};
use tracing::{info, warn};

use super::{
    handover::Handover,
    ids::{assign_ids, rule_specs},
    ifb::{self, Ifb},
    state::{class_config, ClassEntry},
    DaemonError, Options,
};
use crate::{
    bpf::{AttachMode, BpfError, Datapath, Hook},
    config::{Config, Direction},
    netdev,
    qdisc::{self, FqGuard},
    rate::Rate,
    rules, ErrorChain,
};

/// What [`Installed::setup`] made ready to run besides the datapath itself.
pub(super) struct Started {
    /// One entry per class of the configuration, in the same order.
    pub(super) classes: Vec<ClassEntry>,
    /// The index of the device each interface of the configuration is shaped on, in the same
    /// order: the interface's own, or its IFB device's (`direction = "ingress"`).
    pub(super) ifindexes: Vec<u32>,
}

/// What the setup changed outside this process and shutdown must give back: the `fq` root
/// qdisc of each interface (with what was there before), the IFB devices it created, and the
/// handover file. The program's
/// attachments, the clsact qdiscs it added and the pinned maps belong to the [`Datapath`],
/// which [`undo`](Self::undo) is given so that they go first.
///
/// Dropped without [`undo`](Self::undo) or [`leave_in_place`](Self::leave_in_place) (a panic,
/// or the daemon's future dropped while it runs), it still gives each interface its root
/// qdisc back; see the `Drop` impl.
#[must_use = "call undo() to give the interfaces back, or leave_in_place() for the next shaperd"]
pub(super) struct Installed {
    /// The `fq` root qdiscs, in interface order.
    fq: Vec<FqGuard>,
    /// Removed on undo, so that a later shaperd does not take stale class ids over.
    handover_file: Option<PathBuf>,
    /// The IFB devices of the interfaces shaped on ingress, deleted on undo (after the
    /// redirects to them are detached).
    ifbs: Vec<Ifb>,
}

impl Installed {
    /// Sets everything up: `fq` on each interface, the classes, the rules and the attachments.
    /// `fresh` is the class ids in file order and the rules compiled with them; with `adopted`
    /// maps, the class ids and rates an earlier shaperd used carry on instead (and the rules
    /// are compiled again only if its ids differ).
    ///
    /// If a step fails, everything done so far is undone (as [`Self::undo`] does) before the
    /// error is returned; a datapath taken over (`adopted`) is left in place instead.
    pub(super) async fn setup(
        config: &Config,
        options: &Options,
        datapath: &mut Datapath,
        adopted: bool,
        ifindexes: &[u32],
        fresh: (Vec<u32>, rules::Compiled),
    ) -> Result<(Self, Started), DaemonError> {
        let mut installed = Self { fq: Vec::new(), handover_file: options.handover_file(), ifbs: Vec::new() };
        match installed.install(config, options, datapath, adopted, ifindexes, fresh).await {
            Ok(started) => Ok((installed, started)),
            Err(e) if adopted => {
                warn!(error = %e, "setting up failed; the datapath an earlier shaperd left goes on shaping, pinned");
                installed.leave_in_place(datapath);
                Err(e)
            }
            Err(e) => {
                installed.undo(datapath).await;
                Err(e)
            }
        }
    }

    /// The steps of [`Self::setup`], recording in `self` what has to be given back.
    async fn install(
        &mut self,
        config: &Config,
        options: &Options,
        datapath: &mut Datapath,
        adopted: bool,
        ifindexes: &[u32],
        fresh: (Vec<u32>, rules::Compiled),
    ) -> Result<Started, DaemonError> {
        // What an earlier shaperd set up on the interfaces counts whether or not its maps are
        // taken over (a new map layout is not); its class ids and banks only if they are.
        let record = options.handover_file().map(|path| Handover::read(&path)).unwrap_or_default();
        let handover = if adopted {
            record
        } else {
            Handover { interfaces: record.interfaces, added_clsact: record.added_clsact, ..Handover::default() }
        };
        datapath.assume_bank_ports(handover.bank_ports.clone());
        let previous: Vec<(&str, u32)> = handover.classes.iter().map(|(n, id)| (n.as_str(), *id)).collect();
        let slots = datapath.class_slots();
        let ids = assign_ids(config, &previous, slots).ok_or_else(|| DaemonError::ClassSlots {
            path: config.path.clone(),
            classes: config.classes.len(),
            slots,
        })?;
        let (fresh_ids, mut compiled) = fresh;
        if ids != fresh_ids {
            compiled = rules::compile(&rule_specs(config, &ids))
                .map_err(|source| DaemonError::Rules { path: config.path.clone(), source })?;
        }
        let mut ifindexes = ifindexes.to_vec();
        for (iface, index) in config.interfaces.iter().zip(&mut ifindexes) {
            if iface.direction == Direction::Ingress {
                let ifb = ifb::ensure(&iface.name).await?;
                *index = ifb.index;
                self.ifbs.push(ifb);
            }
            let device = ifb::shaped_device(iface);
            self.fq.push(qdisc::ensure_fq(&device, iface.replace_qdisc, fq_limits(config, &iface.name)).await?);
        }
        let mut classes = Vec::new();
        let previous: HashSet<&str> = previous.iter().map(|&(n, _)| n).collect();
        for ((class, &id), leaf) in config.classes.iter().zip(&ids).zip(config.leaf_flags()) {
            let mut entry = ClassEntry::new(id, leaf, class.rate);
            if leaf {
                if previous.contains(class.name.as_str()) {
                    // Go on at the rate the class was paced at, not back to its guarantee.
                    let paced = Rate::from_bits_per_sec(datapath.class_config(id)?.rate_bytes.saturating_mul(8));
                    entry.pacing_rate = paced.max(class.rate).min(class.ceil);
                }
                datapath.set_class(id, class_config(class, entry.pacing_rate, entry.share, entry.mode))?;
            }
            classes.push(entry);
        }
        set_ifaces(datapath, config, &ifindexes, &ids)?;
        datapath.load_rules(&compiled)?;
        for iface in &config.interfaces {
            let device = ifb::shaped_device(iface);
            let (mode, took_over) = datapath.attach(&device, Hook::Egress)?;
            info!(interface = %iface.name, device, ?mode, took_over, "attached at egress");
        }
        for (iface, &index) in config.interfaces.iter().zip(&ifindexes) {
            if iface.direction == Direction::Ingress {
                let (mode, took_over) = set_up_redirect(datapath, &iface.name, index).await?;
                info!(interface = %iface.name, ifb = %ifb::device_name(&iface.name), ?mode, took_over, "attached at ingress: arriving packets are shaped on the IFB device");
            }
        }
        for lan in config.lan_interfaces() {
            let (mode, took_over) = set_up_lan(datapath, lan)?;
            info!(interface = %lan, ?mode, took_over, "attached at ingress: the origins of its hosts' packets are recorded");
        }
        handover.take_interfaces_over(config, datapath).await;
        datapath.retire_older_layouts()?;
        if let Some(path) = options.handover_file() {
            Handover::write(&path, config, &ids, datapath);
        }
        Ok(Started { classes, ifindexes })
    }

    /// Gives everything back: detaches the program from `datapath` (the one the setup
    /// attached), removes the clsact qdiscs it added, restores the root qdiscs, and removes
    /// the pins and the handover file. Failures are logged, and the rest still done.
    pub(super) async fn undo(mut self, datapath: &mut Datapath) {
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
        restore_root_qdiscs(std::mem::take(&mut self.fq)).await;
        // The redirects to them are detached above: nothing is sent to a device that is gone.
        for Ifb { name, iface, .. } in std::mem::take(&mut self.ifbs) {
            match ifb::delete(&name).await {
                Ok(_) => info!(interface = %iface, ifb = %name, "deleted the IFB device"),
                Err(e) => warn!(interface = %iface, ifb = %name, error = %ErrorChain(&e), "deleting the IFB device"),
            }
        }
        if let Err(e) = datapath.unpin_maps() {
            warn!(error = %e, "removing the pins");
        }
        if let Some(path) = self.handover_file.take() {
            let _ = std::fs::remove_file(path);
        }
    }

    /// Takes out the `fq` guard of interface `ifindex` (gone, or renamed away: see `links`), for
    /// the caller to restore or drop.
    pub(super) fn take_fq(&mut self, ifindex: u32) -> Option<FqGuard> {
        let at = self.fq.iter().position(|g| g.ifindex() == ifindex)?;
        Some(self.fq.remove(at))
    }

    /// Adds the `fq` guard of an interface set up after the start (re-created: see `links`),
    /// so that shutdown gives it its root qdisc back like the others.
    pub(super) fn add_fq(&mut self, guard: FqGuard) {
        self.fq.push(guard);
    }

    /// Leaves everything in place for the next shaperd (a handover): the program attached to
    /// `datapath`'s interfaces, the maps pinned, `fq` at the root, the handover file beside the
    /// socket. Nothing is undone, now or on drop.
    pub(super) fn leave_in_place(mut self, datapath: &mut Datapath) {
        datapath.leave_in_place();
        self.fq.clear();
        self.ifbs.clear();
        self.handover_file = None;
    }
}

impl Drop for Installed {
    /// The safety net for a path that neither undid nor left in place: gives each interface
    /// its root qdisc back. The datapath detaches the program when it is dropped itself; the
    /// pins and the handover file stay, as after a crash, for the next shaperd to take over.
    ///
    /// Restoring is asynchronous (rtnetlink) and `drop` is not, and it may run on a thread of a
    /// tokio runtime, where starting another runtime panics. So the restore runs on a
    /// current-thread runtime of its own, on a scoped thread that this one waits for. A new
    /// thread starts in the network namespace of the thread that spawns it, so the qdiscs of
    /// the same interfaces are restored.
    fn drop(&mut self) {
        let fq = std::mem::take(&mut self.fq);
        if fq.is_empty() {
            return;
        }
        warn!(interfaces = fq.len(), "shaperd stopped without a shutdown: restoring the root qdiscs");
        std::thread::scope(|scope| {
            let restoring = scope.spawn(|| match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(runtime) => runtime.block_on(restore_root_qdiscs(fq)),
                Err(e) => warn!(error = %e, "starting a runtime to restore the root qdiscs"),
            });
            if restoring.join().is_err() {
                warn!("restoring the root qdiscs panicked");
            }
        });
    }
}

/// Gives each interface of `guards` its root qdisc back, logging the failures.
async fn restore_root_qdiscs(guards: Vec<FqGuard>) {
    for guard in guards {
        let iface = guard.ifname().to_owned();
        if let Err(e) = guard.restore().await {
            warn!(interface = %iface, error = %e, "restoring the root qdisc");
        }
    }
}

/// Writes each interface's slot, default class and framing (overhead, mpu, link layer)
/// (index 0: the interface is gone, and skipped).
pub(super) fn set_ifaces(
    datapath: &mut Datapath,
    config: &Config,
    ifindexes: &[u32],
    ids: &[u32],
) -> Result<(), BpfError> {
    for (slot, (iface, &index)) in config.interfaces.iter().zip(ifindexes).enumerate() {
        if index == 0 {
            // No interface has the name at the moment (see `links`): nothing to write.
            continue;
        }
        let default = config.classes.iter().position(|c| c.name == iface.default_class).expect("validated");
        let flags = IFACE_ENABLED
            | if netdev::is_l3(&iface.name) { IFACE_L3 } else { 0 }
            | if iface.direction.towards_hosts() { IFACE_DOWNLOAD } else { 0 }
            | if iface.lan.is_empty() { 0 } else { IFACE_NAT };
        datapath.set_iface(
            index,
            IfaceConfig {
                slot: u32::try_from(slot).expect("at most MAX_INTERFACES"),
                default_class: ids[default],
                overhead: iface.overhead,
                flags,
                link_bytes: iface.rate.bytes_per_sec() / 100 * (100 + LINK_SLACK_PERCENT),
                // Worked out from `link_bytes` by `Datapath::set_iface`.
                link_byte_ns: 0,
                mpu: iface.mpu,
                linklayer: iface.linklayer.datapath(),
            },
        )?;
    }
    Ok(())
}

/// The index of interface `iface`, to attach at `hook` of: an interface that is gone
/// meanwhile is an attach error, as at the start.
fn existing_index(iface: &str, hook: Hook) -> Result<u32, BpfError> {
    netdev::index(iface).ok_or_else(|| BpfError::Attach {
        iface: iface.to_owned(),
        hook,
        source: aya::programs::ProgramError::IOError(std::io::Error::from(std::io::ErrorKind::NotFound)),
    })
}

/// Makes `iface` a LAN-side interface: its packets' origins are recorded (see
/// `shaper_common::Origin`) by the program attached at its ingress. An interface that is gone
/// meanwhile is an error, as at the start.
pub(super) fn set_up_lan(datapath: &mut Datapath, iface: &str) -> Result<(AttachMode, bool), BpfError> {
    let index = existing_index(iface, Hook::LanIngress)?;
    datapath.set_lan_iface(index, if netdev::is_l3(iface) { LAN_L3 } else { 0 })?;
    datapath.attach(iface, Hook::LanIngress)
}

/// Sends the packets arriving on `iface` to the IFB device `ifb` (an index), where they are
/// shaped. With TCX (Linux 6.6 and later), by the redirect program attached at the
/// interface's ingress, the IFB's index under the interface's in `IFB_TARGETS`; under clsact,
/// by an `act_mirred` filter ([`ifb::mirred`]: `bpf_redirect()` feeds an IFB only from 6.4
/// on). An interface that is gone meanwhile is an error, as at the start.
pub(super) async fn set_up_redirect(
    datapath: &mut Datapath,
    iface: &str,
    ifb: u32,
) -> Result<(AttachMode, bool), DaemonError> {
    let index = existing_index(iface, Hook::IfbRedirect)?;
    match Datapath::attach_mode() {
        AttachMode::Tcx => {
            datapath.set_ifb_target(index, ifb)?;
            Ok(datapath.attach(iface, Hook::IfbRedirect)?)
        }
        AttachMode::Clsact => {
            datapath.ensure_clsact(iface)?;
            ifb::mirred(iface, index, &ifb::device_name(iface), ifb).await?;
            datapath.adopt_filter(iface, Hook::IfbRedirect)?;
            Ok((AttachMode::Clsact, false))
        }
    }
}

/// fq limits that hold every packet the horizons admit (see [`qdisc::FqLimits`]): what the
/// interface's rate carries over the longest horizon of its classes, in 1000-byte packets,
/// per flow (a class may be a single flow), and four times that in all. The interface's
/// rate, not the classes' ceilings: any class may be raised to it at runtime (`set-ceil`),
/// and fq's limits are set when it is installed (and again on a reload that changes them).
pub(super) fn fq_limits(config: &Config, iface: &str) -> qdisc::FqLimits {
    let link = config.interfaces.iter().find(|i| i.name == iface).map_or(0, |i| i.rate.bits_per_sec() / 8);
    let horizon = config.classes.iter().filter(|c| c.interface == iface).map(|c| c.horizon).max().unwrap_or_default();
    let most_bytes = u128::from(link) * horizon.as_nanos() / 1_000_000_000;
    let flow = u32::try_from(most_bytes / 1000).unwrap_or(u32::MAX).clamp(1_000, 100_000);
    qdisc::FqLimits { packets: flow.saturating_mul(4).max(10_000), flow_packets: flow }
}
