//! Interfaces that come and go: a PPP link or a USB modem that reconnects is a new interface
//! under the old name, with a new index, no `fq` and no filter; so is a veth re-created by a
//! script, or a device renamed into place. shaperd follows the kernel's link events
//! (rtnetlink's `RTMGRP_LINK`) and, for each configured name:
//! - when the interface it shapes is deleted, or renamed away from the name, suspends shaping
//!   there: the datapath's settings for the old index go (an interface that takes the index
//!   later must not inherit them), and a renamed interface gets its root qdisc and its
//!   attachment taken away, as a stop would;
//! - when an interface takes the name (created, or renamed to it), sets it up as the start
//!   does (`fq` with the same limits, its settings under the new index, the program attached)
//!   and logs "re-attached" with the time it took from the event;
//! - when the interface comes up again, or its MTU changes, checks that `fq` and the filter
//!   are still there (they normally survive both) and puts back what is missing.
//!
//! The kernel drops events when a listener's socket buffer is full (`ENOBUFS`; netlink-proto
//! logs it and reads on), so every 5 s each name is also looked up again: an interface whose
//! event was lost is picked up by the second lookup that finds it changed (one alone might
//! race the event of a change made that instant).
//!
//! What is put in place here is given back on stop like the rest: the `fq` guard of a
//! re-created interface joins [`Installed`], and its attachment the datapath's.

use std::{
    sync::Arc,
    time::{Duration, Instant},
};

use futures::{channel::mpsc::UnboundedReceiver, StreamExt};
use netlink_packet_route::{
    link::{LinkAttribute, LinkFlags, LinkMessage},
    RouteNetlinkMessage,
};
use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload},
    sys::SocketAddr,
    Handle, MulticastGroup,
};
use tokio::sync::{watch, Mutex};
use tracing::{debug, error, info, warn};

use super::{
    ifb,
    setup::{fq_limits, set_ifaces, set_up_lan, set_up_redirect, Installed},
    state::State,
    DaemonError, Shared,
};
use crate::{
    bpf::{AttachMode, BpfError, Datapath, Hook, FILTER_HANDLE, FILTER_PRIORITY},
    config::Direction,
    netdev,
    qdisc::{self, FqGuard, QdiscError, RootQdisc},
    ErrorChain,
};

/// How often every configured name is looked up again, for events the kernel dropped.
const SWEEP: Duration = Duration::from_secs(5);

/// The daemon's subscription to the kernel's link events: taken in `run` before the setup, so
/// that nothing that happens to an interface after it was set up goes unseen.
pub(super) struct Subscription {
    /// The connection, polled in the background (it also carries the lookups of links).
    connection: tokio::task::JoinHandle<()>,
    handle: Handle,
    messages: UnboundedReceiver<(NetlinkMessage<RouteNetlinkMessage>, SocketAddr)>,
}

impl Subscription {
    /// Subscribes to `RTMGRP_LINK` in the calling thread's network namespace.
    pub(super) fn open() -> std::io::Result<Self> {
        let (connection, handle, messages) = rtnetlink::new_multicast_connection(&[MulticastGroup::Link])?;
        Ok(Self { connection: tokio::spawn(connection), handle, messages })
    }
}

impl Drop for Subscription {
    fn drop(&mut self) {
        self.connection.abort();
    }
}

/// What a link event says about one interface.
#[derive(Clone, Debug, PartialEq, Eq)]
struct LinkEvent {
    index: u32,
    /// Its name (absent only from a malformed message).
    name: Option<String>,
    /// `RTM_DELLINK`: the interface is gone (deleted, or moved to another namespace).
    deleted: bool,
    seen: Seen,
}

/// The state of an interface that decides whether its `fq` and filter are checked again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Seen {
    /// Administratively up (`IFF_UP`).
    up: bool,
    mtu: Option<u32>,
}

impl LinkEvent {
    /// The event in a message of the link group; `None` for anything else.
    fn of(payload: NetlinkPayload<RouteNetlinkMessage>) -> Option<Self> {
        let (link, deleted) = match payload {
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => (link, false),
            NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link)) => (link, true),
            _ => return None,
        };
        Some(Self { index: link.header.index, name: name_of(&link), deleted, seen: seen_of(&link) })
    }
}

fn name_of(link: &LinkMessage) -> Option<String> {
    link.attributes.iter().find_map(|a| match a {
        LinkAttribute::IfName(name) => Some(name.clone()),
        _ => None,
    })
}

fn seen_of(link: &LinkMessage) -> Seen {
    let mtu = link.attributes.iter().find_map(|a| match a {
        LinkAttribute::Mtu(mtu) => Some(*mtu),
        _ => None,
    });
    Seen { up: link.header.flags.contains(LinkFlags::Up), mtu }
}

/// What changes for a configured name, from the interface shaped under it (`shaped`) to the
/// one that has it now (`current`): the index to let go of and the one to set up; `None` when
/// it is the same interface (or none, still).
fn change(shaped: Option<u32>, current: Option<u32>) -> Option<(Option<u32>, Option<u32>)> {
    (shaped != current).then_some((shaped, current))
}

/// One configured interface, as this task follows it.
#[derive(Debug)]
struct Slot {
    /// The name of the device shaped at egress: the configured interface's, or that of its
    /// IFB device if it is shaped on ingress (see `ifb`).
    name: String,
    /// The configured name, for the metrics.
    label: String,
    /// The index of the interface shaped under the name; `None` while shaping is suspended.
    shaped: Option<u32>,
    /// An interface that could not be set up: the sweep leaves it alone (its own events
    /// still retry), so that a refusal is not logged every few seconds.
    failed: Option<u32>,
    /// Whether the last sweep found another interface under the name than `shaped`.
    suspect: bool,
    /// The shaped interface's state at its last event.
    seen: Option<Seen>,
}

/// One LAN-side interface (`lan`), or one shaped on ingress, as this task follows it: the
/// program at its ingress is attached again to an interface that takes the name.
#[derive(Debug)]
struct LanSlot {
    name: String,
    role: Ingress,
    /// The index of the interface whose origins are recorded; `None` while there is none.
    index: Option<u32>,
    /// Whether the last sweep found another interface under the name than `index`.
    suspect: bool,
}

/// What the program at the ingress of a [`LanSlot`]'s interface is there for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Ingress {
    /// A LAN-side interface: its packets' origins are recorded.
    Lan,
    /// Shaped on ingress: its packets are redirected to the IFB device of configured
    /// interface `slot` (whose index is `State::ifindexes[slot]`), which the interface's
    /// re-creation leaves in place.
    Ifb { slot: usize },
}

impl Ingress {
    fn hook(self) -> Hook {
        match self {
            Ingress::Lan => Hook::LanIngress,
            Ingress::Ifb { .. } => Hook::IfbRedirect,
        }
    }

    /// What is lost while the interface is gone.
    fn while_gone(self) -> &'static str {
        match self {
            Ingress::Lan => "LAN-side interface gone: its hosts' packets are classified as they leave until it comes back",
            Ingress::Ifb { .. } => "interface shaped on ingress gone: what arrives on an interface of that name is not shaped until the redirect to its IFB device is attached again",
        }
    }
}

impl std::fmt::Display for Ingress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Ingress::Lan => "LAN side",
            Ingress::Ifb { .. } => "redirect to the IFB device",
        })
    }
}

impl Slot {
    /// Whether `event` is about this name: about the interface shaped under it, or about
    /// one that has (or had) the name.
    fn concerns(&self, event: &LinkEvent) -> bool {
        self.shaped == Some(event.index) || event.name.as_deref() == Some(self.name.as_str())
    }
}

/// Follows the configured interfaces until `stopped` turns true; see the module docs.
pub(super) async fn follow(
    shared: Arc<Shared>,
    installed: Arc<Mutex<Installed>>,
    mut subscription: Subscription,
    mut stopped: watch::Receiver<bool>,
) {
    let slots: Vec<Slot> = {
        let state = shared.state.lock().await;
        let ifaces = state.config.interfaces.iter().zip(&state.ifindexes);
        ifaces
            .map(|(i, &index)| Slot {
                name: ifb::shaped_device(i),
                label: i.name.clone(),
                shaped: Some(index),
                failed: None,
                suspect: false,
                seen: None,
            })
            .collect()
    };
    for slot in &slots {
        shared.metrics.set_interface_attached(&slot.label, true);
    }
    let lans: Vec<LanSlot> = {
        let state = shared.state.lock().await;
        let names = state.config.lan_interfaces();
        let lan = names.into_iter().map(|n| (n.to_owned(), Ingress::Lan));
        let ingress = state.config.interfaces.iter().enumerate().filter(|(_, i)| i.direction == Direction::Ingress);
        let ingress = ingress.map(|(slot, i)| (i.name.clone(), Ingress::Ifb { slot }));
        lan.chain(ingress)
            .map(|(name, role)| LanSlot { index: netdev::index(&name), name, role, suspect: false })
            .collect()
    };
    let mut links = Links { shared, installed, handle: subscription.handle.clone(), slots, lans };
    for slot in 0..links.slots.len() {
        links.slots[slot].seen = links.look_up(links.slots[slot].shaped).await;
    }
    let mut sweep = tokio::time::interval_at(tokio::time::Instant::now() + SWEEP, SWEEP);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            // Events first: the sweep is for those the kernel dropped, not those still queued.
            biased;
            changed = stopped.changed() => {
                if changed.is_err() || *stopped.borrow() {
                    return;
                }
            }
            message = subscription.messages.next() => {
                let Some((message, _)) = message else {
                    error!("the kernel's link events stopped coming: interfaces that are deleted and created \
                            again are only found by a lookup every {} s now", SWEEP.as_secs());
                    links.sweep_only(&mut stopped).await;
                    return;
                };
                if let Some(event) = LinkEvent::of(message.payload) {
                    links.on_event(&event, Instant::now()).await;
                }
            }
            _ = sweep.tick() => links.sweep().await,
        }
    }
}

/// The task's state: what it shares with the daemon, and each name's slot.
struct Links {
    shared: Arc<Shared>,
    installed: Arc<Mutex<Installed>>,
    /// For looking links up on the subscription's connection.
    handle: Handle,
    slots: Vec<Slot>,
    lans: Vec<LanSlot>,
}

impl Links {
    /// Handles one link event, received at `at`.
    async fn on_event(&mut self, event: &LinkEvent, at: Instant) {
        for slot in 0..self.slots.len() {
            let s = &mut self.slots[slot];
            if !s.concerns(event) {
                continue;
            }
            debug!(interface = %s.name, ?event, "link event");
            let mut check = false;
            if s.shaped == Some(event.index) && !event.deleted && event.name.as_deref() == Some(s.name.as_str()) {
                let now = event.seen;
                if let Some(before) = s.seen.replace(now) {
                    if before.up != now.up {
                        info!(interface = %s.name, ifindex = event.index, "link {}", if now.up { "up" } else { "down" });
                        // Checked once up again: a deletion starts with "down", and the checks'
                        // requests would wait for the kernel to finish it.
                        check |= now.up;
                    }
                    if before.mtu != now.mtu {
                        info!(interface = %s.name, ifindex = event.index, from = ?before.mtu, to = ?now.mtu, "MTU changed");
                        check = true;
                    }
                }
            }
            self.reconcile(slot, check, at).await;
        }
        for lan in 0..self.lans.len() {
            let l = &self.lans[lan];
            if l.index == Some(event.index) || event.name.as_deref() == Some(l.name.as_str()) {
                self.reconcile_lan(lan, at).await;
            }
        }
    }

    /// Brings LAN slot `lan` in line with the interface that has its name now: the one that
    /// had it is let go of (detached if renamed, forgotten if deleted), and one that took it
    /// gets the ingress program.
    async fn reconcile_lan(&mut self, lan: usize, at: Instant) {
        let (name, role) = (self.lans[lan].name.clone(), self.lans[lan].role);
        let current = netdev::index(&name);
        let Some((old, new)) = change(self.lans[lan].index, current) else { return };
        let renamed = match old {
            Some(old) => self.name_of(old).await,
            None => None,
        };
        let mut remove_clsact = false;
        let mut state = self.shared.state.lock().await;
        if let Some(old) = old {
            let removed = match role {
                Ingress::Lan => state.datapath.remove_lan_iface(old),
                Ingress::Ifb { .. } => state.datapath.remove_ifb_target(old),
            };
            if let Err(e) = removed {
                warn!(interface = %name, ifindex = old, error = %ErrorChain(&e), "removing the settings of a gone interface");
            }
            if renamed.is_some() {
                state.datapath.detach(&name, role.hook());
                // Not shaped under the name either: the clsact qdisc added for it goes too.
                let shaped = state.config.interfaces.iter().any(|i| ifb::shaped_device(i) == name);
                remove_clsact = !shaped && state.datapath.forget_added_clsact(&name);
            } else {
                state.datapath.forget(&name, role.hook());
            }
            warn!(interface = %name, ifindex = old, renamed_to = renamed.as_deref().unwrap_or("-"), "{}", role.while_gone());
        }
        self.lans[lan].index = None;
        if let Some(new) = new {
            let set_up = match role {
                Ingress::Lan => set_up_lan(&mut state.datapath, &name).map_err(DaemonError::from),
                Ingress::Ifb { slot } => match state.ifindexes[slot] {
                    // The IFB device is gone too (see `suspend`): nothing to redirect to.
                    0 => Err(DaemonError::from(BpfError::Attach {
                        iface: name.clone(),
                        hook: Hook::IfbRedirect,
                        source: aya::programs::ProgramError::IOError(std::io::Error::other(format!(
                            "its IFB device {} is gone; restart shaperd to create it again",
                            ifb::device_name(&name)
                        ))),
                    })),
                    ifb => set_up_redirect(&mut state.datapath, &name, ifb).await,
                },
            };
            match set_up {
                Ok((mode, _)) => {
                    self.lans[lan].index = Some(new);
                    info!(interface = %name, ifindex = new, ?mode, %role, took_ms = millis(at), "re-attached at ingress");
                }
                Err(e) => {
                    let _ = match role {
                        Ingress::Lan => state.datapath.remove_lan_iface(new),
                        Ingress::Ifb { .. } => state.datapath.remove_ifb_target(new),
                    };
                    error!(interface = %name, ifindex = new, %role, error = %ErrorChain(&e), "not set up again at ingress; tried again on the interface's next link event");
                }
            }
        }
        drop(state);
        if let (true, Some(now)) = (remove_clsact, renamed) {
            if let Err(e) = qdisc::delete_clsact(&now).await {
                warn!(interface = %now, error = %ErrorChain(&e), "removing the clsact qdisc");
            }
        }
    }

    /// Looks every name up again, for interfaces whose events were lost. A difference is
    /// acted on when two sweeps in a row find it: the event of a change made a moment ago may
    /// still be on its way, and takes care of it.
    async fn sweep(&mut self) {
        for slot in 0..self.slots.len() {
            let s = &mut self.slots[slot];
            let current = netdev::index(&s.name);
            let differs = change(s.shaped, current).is_some() && current.is_none_or(|c| s.failed != Some(c));
            if std::mem::replace(&mut s.suspect, differs) && differs {
                s.suspect = false;
                warn!(interface = %s.name, shaped = ?s.shaped, now = ?current, "found by a lookup, not by its link event (the kernel dropped events?)");
                self.reconcile(slot, false, Instant::now()).await;
            }
        }
        for lan in 0..self.lans.len() {
            let l = &mut self.lans[lan];
            let differs = change(l.index, netdev::index(&l.name)).is_some();
            if std::mem::replace(&mut l.suspect, differs) && differs {
                l.suspect = false;
                warn!(interface = %l.name, role = %l.role, "interface found changed by a lookup, not by its link event");
                self.reconcile_lan(lan, Instant::now()).await;
            }
        }
    }

    /// Sweeps until `stopped` turns true (the events' connection is gone).
    async fn sweep_only(&mut self, stopped: &mut watch::Receiver<bool>) {
        let mut sweep = tokio::time::interval(SWEEP);
        loop {
            tokio::select! {
                changed = stopped.changed() => {
                    if changed.is_err() || *stopped.borrow() {
                        return;
                    }
                }
                _ = sweep.tick() => self.sweep().await,
            }
        }
    }

    /// Brings slot `slot` in line with the interface that has its name now; with `check`,
    /// checks the `fq` and the filter of an interface that is still the same.
    async fn reconcile(&mut self, slot: usize, check: bool, at: Instant) {
        let current = netdev::index(&self.slots[slot].name);
        match change(self.slots[slot].shaped, current) {
            None => {
                if let (true, Some(index)) = (check, current) {
                    self.check(slot, index, at).await;
                }
            }
            Some((release, set_up)) => {
                if let Some(old) = release {
                    self.suspend(slot, old).await;
                }
                if let Some(new) = set_up {
                    self.resume(slot, new, at).await;
                }
            }
        }
    }

    /// The interface `old` no longer has the slot's name (deleted, or renamed): stops shaping
    /// it, and gives a renamed one back what it had.
    async fn suspend(&mut self, slot: usize, old: u32) {
        let name = self.slots[slot].name.clone();
        let renamed = self.name_of(old).await;
        let added_clsact = {
            let mut state = self.shared.state.lock().await;
            state.ifindexes[slot] = 0;
            if let Some(wan) = redirected(&state, slot) {
                // Its IFB device is gone: what arrives there goes on unshaped rather than
                // being sent to a device that is no more.
                let _ = state.datapath.remove_ifb_target(wan);
            }
            if let Err(e) = state.datapath.remove_iface(old) {
                warn!(interface = %name, ifindex = old, error = %ErrorChain(&e), "removing the settings of a gone interface");
            }
            if renamed.is_some() {
                state.datapath.detach(&name, Hook::Egress);
            } else {
                state.datapath.forget(&name, Hook::Egress);
            }
            state.datapath.forget_added_clsact(&name)
        };
        let guard = self.installed.lock().await.take_fq(old);
        if let Some(now) = &renamed {
            // Still there under another name, and not shaped any more: given back what it
            // had, as on a stop.
            if added_clsact {
                if let Err(e) = qdisc::delete_clsact(now).await {
                    warn!(interface = %now, error = %ErrorChain(&e), "removing the clsact qdisc");
                }
            }
            if let Some(guard) = guard {
                if let Err(e) = guard.restore().await {
                    warn!(interface = %now, error = %ErrorChain(&e), "restoring the root qdisc");
                }
            }
        }
        let s = &mut self.slots[slot];
        s.shaped = None;
        s.seen = None;
        self.shared.metrics.set_interface_attached(&s.label, false);
        warn!(
            interface = %name,
            ifindex = old,
            renamed_to = renamed.as_deref().unwrap_or("-"),
            "interface gone: shaping on it is suspended until an interface of that name comes back"
        );
    }

    /// The interface `index` has the slot's name: shapes it as the start does.
    async fn resume(&mut self, slot: usize, index: u32, at: Instant) {
        let name = self.slots[slot].name.clone();
        let guard = match self.ensure_fq(&name).await {
            Ok(guard) => guard,
            Err(e) => {
                error!(interface = %name, ifindex = index, error = %ErrorChain(&e), "shaping not resumed; tried again on the interface's next link event");
                self.slots[slot].failed = Some(index);
                return;
            }
        };
        // Where the time went, should a re-attachment be slow: ms since the event when fq was
        // in place, and when the program was attached.
        let fq_ms = millis(at);
        // The interface that has the name now, should it have changed since it was looked up.
        let index = guard.ifindex();
        let attached = {
            let mut state = self.shared.state.lock().await;
            state.ifindexes[slot] = index;
            let mut result = set_up(&mut state, &name);
            if let (Ok(_), Some(wan)) = (&result, redirected(&state, slot)) {
                // An IFB device created again under the name (not by shaperd): the interface's
                // packets go to it.
                if let Err(e) = state.datapath.set_ifb_target(wan, index) {
                    result = Err(e.into());
                }
            }
            if result.is_err() {
                state.ifindexes[slot] = 0;
                let _ = state.datapath.remove_iface(index);
            }
            result
        };
        let attached_ms = millis(at);
        match attached {
            Ok(mode) => {
                self.installed.lock().await.add_fq(guard);
                let seen = self.look_up(Some(index)).await;
                let s = &mut self.slots[slot];
                s.shaped = Some(index);
                s.failed = None;
                s.seen = seen;
                self.shared.metrics.set_interface_attached(&s.label, true);
                self.shared.metrics.count_reattachment(&s.label);
                info!(interface = %name, ifindex = index, ?mode, took_ms = millis(at), fq_ms, attached_ms, "re-attached");
            }
            Err(e) => {
                error!(interface = %name, ifindex = index, error = %ErrorChain(&*e), "shaping not resumed; tried again on the interface's next link event");
                if let Err(e) = guard.restore().await {
                    warn!(interface = %name, error = %ErrorChain(&e), "restoring the root qdisc");
                }
                self.slots[slot].failed = Some(index);
            }
        }
    }

    /// The interface shaped under the slot's name went down or up, or changed its MTU: puts
    /// back its `fq` or its filter if either is gone.
    async fn check(&mut self, slot: usize, index: u32, at: Instant) {
        let name = self.slots[slot].name.clone();
        let fq = match qdisc::inspect_root(&name).await {
            Ok(RootQdisc::Fq { .. } | RootQdisc::MqAllFq | RootQdisc::ShaperMq) => true,
            Ok(root) => {
                warn!(interface = %name, %root, "the root qdisc is no longer fq: departure times are not enforced");
                false
            }
            Err(e) => {
                check_failed(&name, index, "the root qdisc", &ErrorChain(&e).to_string());
                return;
            }
        };
        let filter = match Datapath::attach_mode() {
            AttachMode::Clsact => qdisc::has_egress_filter(&name, index, FILTER_PRIORITY, FILTER_HANDLE)
                .await
                .map_err(|e| ErrorChain(&e).to_string()),
            AttachMode::Tcx => self
                .shared
                .state
                .lock()
                .await
                .datapath
                .tcx_attached(&name, Hook::Egress)
                .map_err(|e| ErrorChain(&e).to_string()),
        };
        let filter = match filter {
            Ok(attached) => attached,
            Err(e) => {
                check_failed(&name, index, "the attachment", &e);
                return;
            }
        };
        if fq && filter {
            debug!(interface = %name, "fq and the program are in place");
            return;
        }
        if !fq {
            match self.ensure_fq(&name).await {
                Ok(guard) => {
                    let mut installed = self.installed.lock().await;
                    // The fq the old guard would remove is gone already.
                    drop(installed.take_fq(index));
                    installed.add_fq(guard);
                }
                Err(e) => {
                    error!(interface = %name, error = %ErrorChain(&e), "fq not put back: the interface is not shaped");
                    return;
                }
            }
        }
        if !filter {
            let mut state = self.shared.state.lock().await;
            state.datapath.forget(&name, Hook::Egress);
            if let Err(e) = state.datapath.attach(&name, Hook::Egress) {
                error!(interface = %name, error = %ErrorChain(&e), "the program not attached again: the interface is not shaped");
                return;
            }
        }
        self.shared.metrics.count_reattachment(&self.slots[slot].label);
        info!(interface = %name, ifindex = index, fq = !fq, filter = !filter, took_ms = millis(at), "re-attached (put back what was missing)");
    }

    /// `fq` on `name` as the start installs it: the interface's `replace_qdisc`, and the
    /// limits the configuration's classes need.
    async fn ensure_fq(&self, name: &str) -> Result<FqGuard, QdiscError> {
        let (replace, limits) = {
            let state = self.shared.state.lock().await;
            let iface =
                state.config.interfaces.iter().find(|i| ifb::shaped_device(i) == name).expect("a configured interface");
            (iface.replace_qdisc, fq_limits(&state.config, &iface.name))
        };
        qdisc::ensure_fq(name, replace, limits).await
    }

    /// Interface `index` as the kernel describes it now; `None` if there is no such interface
    /// (or it cannot be asked).
    async fn link(&self, index: u32) -> Option<LinkMessage> {
        let mut links = self.handle.link().get().match_index(index).execute();
        links.next().await.and_then(Result::ok)
    }

    /// The name interface `index` has now; `None` if there is no such interface.
    async fn name_of(&self, index: u32) -> Option<String> {
        self.link(index).await.and_then(|link| name_of(&link)).filter(|n| !n.is_empty())
    }

    /// The state of interface `index`, asked of the kernel; `None` if it cannot be told.
    async fn look_up(&self, index: Option<u32>) -> Option<Seen> {
        Some(seen_of(&self.link(index?).await?))
    }
}

/// Logs that `what` of the interface could not be checked, unless the interface is gone
/// meanwhile (a deletion is announced by a "down" first): its own event follows.
fn check_failed(name: &str, index: u32, what: &str, error: &str) {
    if netdev::index(name) == Some(index) {
        warn!(interface = %name, error, "cannot check {what}");
    } else {
        debug!(interface = %name, error, "not checking {what}: the interface is gone");
    }
}

/// Writes the settings of every interface that has an index (the slot's one among them) and
/// attaches the program to `name`.
fn set_up(state: &mut State, name: &str) -> Result<AttachMode, Box<dyn std::error::Error + Send + Sync>> {
    let ids: Vec<u32> = state.classes.iter().map(|e| e.id).collect();
    set_ifaces(&mut state.datapath, &state.config, &state.ifindexes, &ids)?;
    let (mode, _) = state.datapath.attach(name, Hook::Egress)?;
    Ok(mode)
}

/// The index of configured interface `slot` if it is shaped on ingress (its packets are
/// redirected to the device shaped under the slot) and exists.
fn redirected(state: &State, slot: usize) -> Option<u32> {
    let iface = &state.config.interfaces[slot];
    (iface.direction == Direction::Ingress).then(|| netdev::index(&iface.name)).flatten()
}

/// Milliseconds since `at`, for the log.
fn millis(at: Instant) -> f64 {
    at.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod tests {
    use netlink_packet_route::link::LinkHeader;

    use super::*;

    fn link(index: u32, name: &str, up: bool, mtu: u32) -> LinkMessage {
        let mut link = LinkMessage::default();
        link.header = LinkHeader { index, flags: if up { LinkFlags::Up } else { LinkFlags::empty() }, ..link.header };
        link.attributes = vec![LinkAttribute::IfName(name.into()), LinkAttribute::Mtu(mtu)];
        link
    }

    #[test]
    fn link_events_are_read_from_new_and_del_link() {
        let new = NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link(7, "wan0", true, 1500)));
        assert_eq!(
            LinkEvent::of(new),
            Some(LinkEvent {
                index: 7,
                name: Some("wan0".into()),
                deleted: false,
                seen: Seen { up: true, mtu: Some(1500) }
            })
        );
        let del = NetlinkPayload::InnerMessage(RouteNetlinkMessage::DelLink(link(7, "wan0", false, 1400)));
        let event = LinkEvent::of(del).unwrap();
        assert!(event.deleted);
        assert_eq!(event.seen, Seen { up: false, mtu: Some(1400) });
        let other = NetlinkPayload::InnerMessage(RouteNetlinkMessage::GetLink(link(7, "wan0", true, 1500)));
        assert_eq!(LinkEvent::of(other), None);
        assert_eq!(LinkEvent::of(NetlinkPayload::Noop), None);
    }

    #[test]
    fn what_changes_for_a_name() {
        // The same interface (or none, still): nothing to set up or let go of.
        assert_eq!(change(Some(3), Some(3)), None);
        assert_eq!(change(None, None), None);
        // Deleted, or renamed away.
        assert_eq!(change(Some(3), None), Some((Some(3), None)));
        // Deleted and created again (or another renamed into place) before the event was seen.
        assert_eq!(change(Some(3), Some(9)), Some((Some(3), Some(9))));
        // Back.
        assert_eq!(change(None, Some(9)), Some((None, Some(9))));
    }

    #[test]
    fn events_concern_the_shaped_interface_and_the_name() {
        let slot = Slot {
            name: "wan0".into(),
            label: "wan0".into(),
            shaped: Some(3),
            failed: None,
            suspect: false,
            seen: None,
        };
        let event = |index, name: &str| LinkEvent {
            index,
            name: Some(name.into()),
            deleted: false,
            seen: Seen { up: true, mtu: Some(1500) },
        };
        assert!(slot.concerns(&event(3, "wan0")));
        assert!(slot.concerns(&event(3, "old0")), "renamed away");
        assert!(slot.concerns(&event(9, "wan0")), "renamed into place, or created");
        assert!(!slot.concerns(&event(9, "tmp0")));
        let suspended = Slot { shaped: None, ..slot };
        assert!(!suspended.concerns(&event(3, "old0")));
        assert!(suspended.concerns(&event(9, "wan0")));
    }
}
