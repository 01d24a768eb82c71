//! The `fq` root qdisc that enforces the departure times set by the tc program.
//!
//! shaper's egress program does not queue anything itself: it stamps each packet with the
//! earliest time it may leave (`skb->tstamp`, "Earliest Departure Time") and relies on the `fq`
//! qdisc to hold the packet until then. Any other root qdisc ignores the timestamp and the
//! packet leaves at once, so the shaping would silently do nothing. This module makes sure the
//! interface's root qdisc is `fq`, talking rtnetlink directly (it never runs `tc`), and hands
//! back an [`FqGuard`] that undoes its change on shutdown.
//!
//! What is found at the root decides what happens ([`RootQdisc`], then [`Restore`]):
//! - `fq`, whoever installed it, or `mq` with `fq` on every queue: kept, and left in place on
//!   shutdown;
//! - a kernel default (handle `0:`: `noqueue`, `pfifo_fast`, `mq`, `fq_codel`..., or `noop` on an
//!   interface never brought up): replaced by `fq`, or on an interface with several transmit
//!   queues by `mq` with an `fq` on each queue (as Cilium does: each CPU transmits through its
//!   own queue and lock, and the class clocks, in BPF maps, are shared by all); on shutdown
//!   shaper's root is deleted and the kernel attaches its default again by itself;
//! - anything an admin configured (handle other than `0:`, e.g. `htb 1:`): left alone and
//!   [`QdiscError::Occupied`], unless `replace_other` (`replace_qdisc = true` in the interface's
//!   configuration) lets `fq` replace it; on shutdown `fq` is deleted, which brings back the
//!   kernel default but not the admin's setup (logged as a warning).
//!
//! A kernel built without `sch_fq` makes [`ensure_fq`] fail with
//! [`QdiscError::FqUnavailable`]: shaper must refuse to start there rather than run without
//! effect.
//!
//! Every call opens its own short-lived rtnetlink socket in the network namespace of the calling
//! thread, and must run inside a tokio runtime.
//!
//! This file holds the policy: what a root qdisc is, what to do about it, and what to undo on
//! shutdown. The rtnetlink requests, and the reading of the kernel's replies, are in the
//! `netlink` submodule.

use std::fmt;

use netlink_packet_route::{tc::TcMessage, RouteNetlinkMessage};
use nix::errno::Errno;
use tracing::{debug, info, warn};

mod netlink;

use netlink::tc_index;
pub use netlink::KernelError;
pub(crate) use netlink::Rtnl;

/// Packet limits of the `fq` qdisc shaper installs (`limit` and `flow_limit` in tc's words).
///
/// fq's defaults (10000 packets, 100 per flow) are too small for EDT shaping: a single flow
/// in a class paced at 10 mbit/s with a 200 ms horizon queues 165 full-size packets. When fq
/// drops a packet the tc program already gave a departure slot, that slot is lost and the
/// class runs below its rate; so fq must hold whatever the horizons allow, and the tc program
/// does all the dropping.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FqLimits {
    pub packets: u32,
    pub flow_packets: u32,
}

impl FqLimits {
    /// Whether these limits hold at least what `need` holds.
    #[must_use]
    pub fn cover(&self, need: &Self) -> bool {
        self.packets >= need.packets && self.flow_packets >= need.flow_packets
    }
}

impl fmt::Display for FqLimits {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "limit {} flow_limit {}", self.packets, self.flow_packets)
    }
}

/// `TC_H_ROOT`: the parent of a root qdisc.
const TC_H_ROOT: u32 = 0xFFFF_FFFF;
/// `TC_H_INGRESS` (= `TC_H_CLSACT`): the parent of the `ingress`/`clsact` qdisc.
const TC_H_INGRESS: u32 = 0xFFFF_FFF1;
/// The handle of the `fq` that shaperd installs (`5a1f:`). A later shaperd that finds it (the
/// previous one was killed, or left the datapath in place for an upgrade) knows the qdisc is
/// shaper's and removes it on stop, rather than keeping it as an admin's `fq`.
pub const SHAPER_FQ_HANDLE: u32 = 0x5A1F_0000;
/// The kind of qdisc that enforces `skb->tstamp`.
const FQ: &str = "fq";
/// The kind of the multiqueue root qdisc.
const MQ: &str = "mq";

/// The root qdisc of an interface, as far as `fq` is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RootQdisc {
    /// A qdisc the kernel attached by itself (handle `0:`): `noqueue`, `pfifo_fast`, `mq`,
    /// `fq_codel`..., or `noop` on an interface never brought up.
    Default {
        /// The qdisc's kind, as `tc` names it.
        kind: String,
    },
    /// `fq`, whoever installed it (handle `0:` when it is the kernel's default).
    Fq {
        /// The qdisc's handle (`0x8001_0000` is `8001:`).
        handle: u32,
    },
    /// `mq` whose every child (one per transmit queue) is `fq`.
    MqAllFq,
    /// The `mq` shaper installs on an interface with several transmit queues (handle
    /// [`SHAPER_FQ_HANDLE`]), with an `fq` on each queue.
    ShaperMq,
    /// Any other qdisc, configured by someone (handle ≠ `0:`), e.g. `htb 1:`.
    Other {
        /// The qdisc's kind, as `tc` names it.
        kind: String,
        /// The qdisc's handle (`0x0001_0000` is `1:`).
        handle: u32,
    },
}

impl fmt::Display for RootQdisc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Default { kind } => write!(f, "{kind} 0: (kernel default)"),
            Self::Fq { handle } => write!(f, "{FQ} {}", HandleDisplay(*handle)),
            Self::MqAllFq => write!(f, "{MQ} with {FQ} on every queue"),
            Self::ShaperMq => write!(f, "{MQ} {} with shaper's {FQ} on every queue", HandleDisplay(SHAPER_FQ_HANDLE)),
            Self::Other { kind, handle } => write!(f, "{kind} {}", HandleDisplay(*handle)),
        }
    }
}

/// What [`FqGuard::restore`] has to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restore {
    /// `fq` was already there: leave it.
    Nothing,
    /// `fq` replaced a kernel default: deleting it makes the kernel attach its default again.
    DeleteRoot,
    /// `fq` replaced an admin's qdisc (`replace_qdisc = true`): delete `fq`, which brings back the
    /// kernel default but not the admin's setup; that is logged.
    Replaced {
        /// The kind of the qdisc that `fq` replaced.
        kind: String,
    },
}

/// The `fq` root qdisc of one interface, as [`ensure_fq`] left it: what was there before and what
/// [`restore`](Self::restore) must do on shutdown.
#[derive(Debug)]
#[must_use = "call restore() on shutdown to give the interface its previous root qdisc back"]
pub struct FqGuard {
    ifname: String,
    ifindex: u32,
    action: Restore,
    /// Handle of the `fq` this module installed (meaningless when `action` is `Nothing`).
    fq_handle: u32,
}

/// Errors of this module; each one names the interface.
#[derive(Debug, thiserror::Error)]
pub enum QdiscError {
    /// No interface has that name (in this network namespace).
    #[error("interface {ifname} does not exist")]
    NoSuchInterface {
        /// The interface asked for.
        ifname: String,
    },
    /// The rtnetlink socket could not be opened.
    #[error("cannot open an rtnetlink socket to manage the qdisc of {ifname}")]
    Socket {
        /// The interface being managed.
        ifname: String,
        /// Why the socket could not be opened.
        source: std::io::Error,
    },
    /// Looking the interface up failed for another reason than its absence.
    #[error("cannot look up interface {ifname}")]
    Link {
        /// The interface asked for.
        ifname: String,
        /// The failed request.
        source: KernelError,
    },
    /// Listing the qdiscs failed.
    #[error("cannot list the qdiscs of {ifname}")]
    Dump {
        /// The interface being inspected.
        ifname: String,
        /// The failed request.
        source: KernelError,
    },
    /// Listing the filters at egress failed.
    #[error("cannot list the egress filters of {ifname}")]
    Filters {
        /// The interface being inspected.
        ifname: String,
        /// The failed request.
        source: KernelError,
    },
    /// Someone configured the root qdisc, and replacing it was not allowed.
    #[error(
        "the root qdisc of {ifname} is `{kind}`, configured by someone else; shaper needs `fq` \
         there to enforce departure times and would replace it (losing that setup), so it leaves \
         it alone: set `replace_qdisc = true` in the configuration of interface {ifname} to allow \
         the replacement, or remove that qdisc yourself"
    )]
    Occupied {
        /// The interface.
        ifname: String,
        /// The kind of the qdisc found there, e.g. `htb`.
        kind: String,
    },
    /// The kernel has no `fq` qdisc.
    #[error(
        "cannot install the `fq` qdisc on {ifname}: this kernel has no sch_fq (build it with \
         CONFIG_NET_SCH_FQ, or load it with `modprobe sch_fq`); without fq the departure times \
         that shaper sets would be ignored and no traffic would be shaped, so shaper refuses to \
         start"
    )]
    FqUnavailable {
        /// The interface.
        ifname: String,
        /// The kernel's refusal.
        source: KernelError,
    },
    /// Installing `fq` failed for another reason.
    #[error("cannot install `fq` as the root qdisc of {ifname}")]
    Install {
        /// The interface.
        ifname: String,
        /// The kernel's refusal.
        source: KernelError,
    },
    /// The kernel accepted `fq` but the root qdisc is something else afterwards.
    #[error("installed `fq` as the root qdisc of {ifname}, but the root qdisc is now {found}")]
    NotInstalled {
        /// The interface.
        ifname: String,
        /// What was found at the root instead.
        found: RootQdisc,
    },
    /// Deleting shaper's `fq` failed.
    #[error("cannot delete shaper's `fq` root qdisc from {ifname}")]
    Delete {
        /// The interface.
        ifname: String,
        /// The kernel's refusal.
        source: KernelError,
    },
}

/// What [`ensure_fq`] does about a root qdisc.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Decision {
    /// `fq` is already in charge.
    Keep,
    /// The `fq` an earlier shaperd installed: take it over; restoring deletes it.
    Adopt,
    /// Install `fq`; restoring will take this action.
    Install(Restore),
    /// Leave the admin's qdisc alone and fail.
    Refuse {
        /// The admin's qdisc kind.
        kind: String,
    },
}

/// Decides what to do about `root`: the policy, with no I/O.
fn decide(root: &RootQdisc, replace_other: bool) -> Decision {
    match root {
        RootQdisc::Fq { handle } if *handle == SHAPER_FQ_HANDLE => Decision::Adopt,
        RootQdisc::ShaperMq => Decision::Adopt,
        RootQdisc::Fq { .. } | RootQdisc::MqAllFq => Decision::Keep,
        RootQdisc::Default { .. } => Decision::Install(Restore::DeleteRoot),
        RootQdisc::Other { kind, .. } if replace_other => Decision::Install(Restore::Replaced { kind: kind.clone() }),
        RootQdisc::Other { kind, .. } => Decision::Refuse { kind: kind.clone() },
    }
}

/// One qdisc of one interface, from a dump.
#[derive(Debug, Clone, PartialEq, Eq)]
struct QdiscEntry {
    kind: String,
    handle: u32,
    parent: u32,
    /// An `fq`'s packet limits, when it is one and they could be read.
    fq_limits: Option<FqLimits>,
}

/// Classifies the root qdisc of an interface from all its qdiscs.
///
/// No root in the dump means the builtin `noop` (the kernel never dumps it): the interface is
/// down or has no queue yet, and gets its default qdisc when it comes up.
fn classify(entries: &[QdiscEntry]) -> RootQdisc {
    let Some(root) = entries.iter().find(|e| e.parent == TC_H_ROOT) else {
        return RootQdisc::Default { kind: "noop".to_owned() };
    };
    if root.kind == FQ {
        return RootQdisc::Fq { handle: root.handle };
    }
    if root.kind == MQ && root.handle == SHAPER_FQ_HANDLE {
        return RootQdisc::ShaperMq;
    }
    if root.kind == MQ {
        // mq's children hang off its classes: parent = <mq major>:<queue number>.
        let children: Vec<_> = entries
            .iter()
            .filter(|e| {
                e.parent != TC_H_ROOT
                    && e.parent != TC_H_INGRESS
                    && e.parent >> 16 == root.handle >> 16
                    && e.parent & 0xFFFF != 0
            })
            .collect();
        if !children.is_empty() && children.iter().all(|c| c.kind == FQ) {
            return RootQdisc::MqAllFq;
        }
    }
    if root.handle == 0 {
        RootQdisc::Default { kind: root.kind.clone() }
    } else {
        RootQdisc::Other { kind: root.kind.clone(), handle: root.handle }
    }
}

/// Formats a qdisc handle the way `tc` does: `8001:`, `1:2`.
struct HandleDisplay(u32);

impl fmt::Display for HandleDisplay {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (major, minor) = (self.0 >> 16, self.0 & 0xFFFF);
        if minor == 0 {
            write!(f, "{major:x}:")
        } else {
            write!(f, "{major:x}:{minor:x}")
        }
    }
}

/// Removes the `clsact` qdisc of `ifname` (with every filter under it), as `tc qdisc del dev
/// IF clsact` does. The datapath adds clsact on kernels without TCX and, having added it,
/// removes it on shutdown. An interface that is gone, or has no clsact, is not an error.
pub async fn delete_clsact(ifname: &str) -> Result<(), QdiscError> {
    /// `TC_H_CLSACT`, the parent handle of clsact (same value as `TC_H_INGRESS`).
    const TC_H_CLSACT: u32 = 0xFFFF_FFF1;
    /// The handle the kernel gives clsact: `ffff:`.
    const CLSACT_HANDLE: u32 = 0xFFFF_0000;
    let rtnl = Rtnl::open(ifname)?;
    let ifindex = match rtnl.ifindex(ifname).await {
        Ok(i) => i,
        Err(QdiscError::NoSuchInterface { .. }) => return Ok(()),
        Err(e) => return Err(e),
    };
    let mut message = TcMessage::with_index(tc_index(ifname, ifindex)?);
    message.header.parent = TC_H_CLSACT.into();
    message.header.handle = CLSACT_HANDLE.into();
    match rtnl.acked(RouteNetlinkMessage::DelQueueDiscipline(message), 0).await {
        Ok(()) => {
            info!(interface = %ifname, "removed the clsact qdisc shaper had added");
            Ok(())
        }
        Err(source) if matches!(source.errno().map(Errno::from_raw), Some(Errno::ENOENT | Errno::EINVAL)) => Ok(()),
        Err(source) => Err(QdiscError::Delete { ifname: ifname.to_owned(), source }),
    }
}

/// Removes the `fq` (or `mq`) shaper installed on `ifname` (handle [`SHAPER_FQ_HANDLE`]), so that the
/// kernel attaches its default root qdisc again: for an interface an earlier shaperd shaped
/// and this one does not. Any other root qdisc, or a missing interface, is left alone.
/// Returns whether it removed one.
pub async fn remove_shaper_fq(ifname: &str) -> Result<bool, QdiscError> {
    let rtnl = Rtnl::open(ifname)?;
    let ifindex = match rtnl.ifindex(ifname).await {
        Ok(i) => i,
        Err(QdiscError::NoSuchInterface { .. }) => return Ok(false),
        Err(e) => return Err(e),
    };
    match rtnl.root(ifname, ifindex).await? {
        RootQdisc::Fq { handle: SHAPER_FQ_HANDLE } | RootQdisc::ShaperMq => {
            rtnl.delete_root(ifname, ifindex, SHAPER_FQ_HANDLE).await?;
            Ok(true)
        }
        _ => Ok(false),
    }
}

/// Whether interface `ifindex` (called `ifname`) has a `cls_bpf` filter at egress with
/// `priority` and `handle` (shaper's, see `crate::bpf::FILTER_PRIORITY`).
pub async fn has_egress_filter(ifname: &str, ifindex: u32, priority: u16, handle: u32) -> Result<bool, QdiscError> {
    let rtnl = Rtnl::open(ifname)?;
    Ok(rtnl.egress_filters(ifname, ifindex, "bpf").await?.contains(&(priority, handle)))
}

/// Tells what the root qdisc of `ifname` is.
pub async fn inspect_root(ifname: &str) -> Result<RootQdisc, QdiscError> {
    let rtnl = Rtnl::open(ifname)?;
    let ifindex = rtnl.ifindex(ifname).await?;
    rtnl.root(ifname, ifindex).await
}

/// Makes sure the root qdisc of `ifname` is `fq`, installing it if needed (see the module docs).
///
/// An admin-configured root qdisc is replaced only if `replace_other` is true (the interface's
/// `replace_qdisc` setting); otherwise this fails with [`QdiscError::Occupied`]. A kernel
/// without `sch_fq` makes it fail with [`QdiscError::FqUnavailable`].
pub async fn ensure_fq(ifname: &str, replace_other: bool, limits: FqLimits) -> Result<FqGuard, QdiscError> {
    let rtnl = Rtnl::open(ifname)?;
    let ifindex = rtnl.ifindex(ifname).await?;
    let (root, fq_limits) = rtnl.root_with_fq_limits(ifname, ifindex).await?;
    let action = match decide(&root, replace_other) {
        Decision::Keep => {
            info!(interface = %ifname, %root, "root qdisc already enforces departure times; keeping it");
            check_kept_fq(ifname, fq_limits, limits);
            return Ok(FqGuard { ifname: ifname.to_owned(), ifindex, action: Restore::Nothing, fq_handle: 0 });
        }
        Decision::Adopt => {
            info!(interface = %ifname, "taking over the fq an earlier shaperd installed; it is removed on stop");
            // Sized for what this configuration's classes may queue, which the earlier one's
            // limits may not be; the kernel changes them in place.
            rtnl.install_fq(ifname, ifindex, limits, &root).await?;
            info!(interface = %ifname, %limits, "fq limits set");
            return Ok(FqGuard {
                ifname: ifname.to_owned(),
                ifindex,
                action: Restore::DeleteRoot,
                fq_handle: SHAPER_FQ_HANDLE,
            });
        }
        Decision::Refuse { kind } => return Err(QdiscError::Occupied { ifname: ifname.to_owned(), kind }),
        Decision::Install(action) => action,
    };
    rtnl.install_fq(ifname, ifindex, limits, &root).await?;
    let fq_handle = match rtnl.root(ifname, ifindex).await? {
        RootQdisc::Fq { handle } => handle,
        RootQdisc::ShaperMq => SHAPER_FQ_HANDLE,
        found => return Err(QdiscError::NotInstalled { ifname: ifname.to_owned(), found }),
    };
    if let Restore::Replaced { .. } = action {
        warn!(
            interface = %ifname,
            replaced = %root,
            fq = %HandleDisplay(fq_handle),
            "replaced the admin's root qdisc with fq (replace_qdisc = true); it will not be \
             rebuilt on shutdown"
        );
    } else {
        info!(interface = %ifname, replaced = %root, fq = %HandleDisplay(fq_handle), "installed fq as root qdisc");
    }
    Ok(FqGuard { ifname: ifname.to_owned(), ifindex, action, fq_handle })
}

/// Warns if an `fq` that is not shaper's (an admin's, or the kernel's default) holds fewer
/// packets than `need`: it would drop packets the tc program gave departure slots, and the
/// classes would run below their rates. Its limits are the admin's to change; the warning
/// says how.
fn check_kept_fq(ifname: &str, have: Option<FqLimits>, need: FqLimits) {
    match have {
        Some(have) if !have.cover(&need) => warn!(
            interface = %ifname,
            fq = %have,
            needed = %need,
            "the root fq holds fewer packets than the classes may queue; fq would drop packets \
             that were given departure slots, and classes would run below their rates: \
             tc qdisc change dev {ifname} root fq {need}"
        ),
        _ => {}
    }
}

/// Sizes the root `fq` of `ifname` for `limits` (a reload that changed the horizons or the
/// interface's rate): shaper's own `fq` is changed in place; another one is checked and
/// warned about, as at start. Returns whether shaper's `fq` was changed.
pub async fn resize_fq(ifname: &str, limits: FqLimits) -> Result<bool, QdiscError> {
    let rtnl = Rtnl::open(ifname)?;
    let ifindex = rtnl.ifindex(ifname).await?;
    match rtnl.root_with_fq_limits(ifname, ifindex).await? {
        (root @ (RootQdisc::Fq { handle: SHAPER_FQ_HANDLE } | RootQdisc::ShaperMq), _) => {
            rtnl.install_fq(ifname, ifindex, limits, &root).await?;
            info!(interface = %ifname, %limits, "fq limits set");
            Ok(true)
        }
        (RootQdisc::Fq { .. }, have) => {
            check_kept_fq(ifname, have, limits);
            Ok(false)
        }
        _ => Ok(false),
    }
}

impl FqGuard {
    /// Undoes [`ensure_fq`]: deletes the `fq` it installed, so that the kernel attaches its
    /// default root qdisc again; does nothing if `fq` was already there.
    ///
    /// An admin's qdisc that `fq` replaced is not rebuilt (that is logged). If the root qdisc is
    /// no longer the `fq` that was installed, someone changed it since: it is left alone, with a
    /// warning. An interface that disappeared took its qdiscs with it: nothing to do.
    pub async fn restore(self) -> Result<(), QdiscError> {
        let Self { ifname, ifindex, action, fq_handle } = self;
        if action == Restore::Nothing {
            debug!(interface = %ifname, "root qdisc was fq before shaper: leaving it");
            return Ok(());
        }
        let rtnl = Rtnl::open(&ifname)?;
        if !rtnl.link_exists(&ifname, ifindex).await? {
            info!(interface = %ifname, ifindex, "interface is gone, and its qdiscs with it");
            return Ok(());
        }
        match rtnl.root(&ifname, ifindex).await? {
            RootQdisc::Fq { handle } if handle == fq_handle => {}
            RootQdisc::ShaperMq if fq_handle == SHAPER_FQ_HANDLE => {}
            now => {
                warn!(
                    interface = %ifname,
                    %now,
                    "root qdisc is no longer the fq shaper installed; leaving it alone"
                );
                return Ok(());
            }
        }
        rtnl.delete_root(&ifname, ifindex, fq_handle).await?;
        if let Restore::Replaced { kind } = action {
            warn!(
                interface = %ifname,
                "removed shaper's fq; the `{kind}` root qdisc it had replaced (replace_qdisc = \
                 true) was NOT restored, with its classes and filters: the kernel's default \
                 qdisc is in place until that setup is applied again"
            );
        } else {
            info!(interface = %ifname, "removed shaper's fq; the kernel's default root qdisc is back");
        }
        Ok(())
    }

    /// The index of the interface.
    #[must_use]
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The name the interface had when [`ensure_fq`] ran.
    #[must_use]
    pub fn ifname(&self) -> &str {
        &self.ifname
    }

    /// What [`restore`](Self::restore) will do.
    #[must_use]
    pub fn action(&self) -> &Restore {
        &self.action
    }
}

#[cfg(test)]
mod tests {
    use super::netlink::nack;
    use super::*;

    fn entry(kind: &str, handle: u32, parent: u32) -> QdiscEntry {
        QdiscEntry { kind: kind.to_owned(), handle, parent, fq_limits: None }
    }

    #[test]
    fn kernel_defaults_are_replaced_and_restored_by_deletion() {
        for kind in ["noqueue", "pfifo_fast", "mq", "fq_codel", "noop"] {
            let root = classify(&[entry(kind, 0, TC_H_ROOT)]);
            assert_eq!(root, RootQdisc::Default { kind: kind.into() });
            assert_eq!(decide(&root, false), Decision::Install(Restore::DeleteRoot));
            assert_eq!(decide(&root, true), Decision::Install(Restore::DeleteRoot));
        }
    }

    #[test]
    fn no_root_in_dump_is_noop() {
        let root = classify(&[entry("clsact", 0xFFFF_0000, TC_H_INGRESS)]);
        assert_eq!(root, RootQdisc::Default { kind: "noop".into() });
        assert_eq!(classify(&[]), root);
    }

    #[test]
    fn fq_is_kept_whatever_its_handle_but_shapers_own_is_taken_over() {
        let root = RootQdisc::Fq { handle: SHAPER_FQ_HANDLE };
        assert_eq!(decide(&root, false), Decision::Adopt);
        for handle in [0, 0x8001_0000, 0x0001_0000] {
            let root = classify(&[entry("clsact", 0xFFFF_0000, TC_H_INGRESS), entry(FQ, handle, TC_H_ROOT)]);
            assert_eq!(root, RootQdisc::Fq { handle });
            assert_eq!(decide(&root, false), Decision::Keep);
            assert_eq!(decide(&root, true), Decision::Keep);
        }
    }

    #[test]
    fn mq_with_only_fq_children_is_kept() {
        for mq in [0, 0x0001_0000] {
            let root = classify(&[
                entry(MQ, mq, TC_H_ROOT),
                entry(FQ, 0, mq | 1),
                entry(FQ, 0x8002_0000, mq | 2),
                entry("clsact", 0xFFFF_0000, TC_H_INGRESS),
            ]);
            assert_eq!(root, RootQdisc::MqAllFq);
            assert_eq!(decide(&root, false), Decision::Keep);
        }
    }

    #[test]
    fn shapers_mq_is_taken_over_whatever_its_children() {
        let mq = entry(MQ, SHAPER_FQ_HANDLE, TC_H_ROOT);
        let fq1 = entry(FQ, 0x8001_0000, SHAPER_FQ_HANDLE | 1);
        let fifo2 = entry("pfifo_fast", 0, SHAPER_FQ_HANDLE | 2);
        assert_eq!(classify(&[mq.clone(), fq1.clone(), fifo2]), RootQdisc::ShaperMq);
        assert_eq!(classify(&[mq, fq1]), RootQdisc::ShaperMq);
        assert_eq!(decide(&RootQdisc::ShaperMq, false), Decision::Adopt);
        assert_eq!(RootQdisc::ShaperMq.to_string(), "mq 5a1f: with shaper's fq on every queue");
    }

    #[test]
    fn default_mq_with_other_children_is_a_default() {
        let root = classify(&[entry(MQ, 0, TC_H_ROOT), entry(FQ, 0, 1), entry("fq_codel", 0, 2)]);
        assert_eq!(root, RootQdisc::Default { kind: MQ.into() });
        // An mq with no child listed is not "all fq".
        let root = classify(&[entry(MQ, 0, TC_H_ROOT)]);
        assert_eq!(root, RootQdisc::Default { kind: MQ.into() });
    }

    #[test]
    fn admin_mq_with_other_children_is_other() {
        let root = classify(&[entry(MQ, 0x0001_0000, TC_H_ROOT), entry("pfifo_fast", 0, 0x0001_0001)]);
        assert_eq!(root, RootQdisc::Other { kind: MQ.into(), handle: 0x0001_0000 });
    }

    #[test]
    fn admin_qdisc_is_refused_unless_replacing_is_allowed() {
        let root = classify(&[entry("htb", 0x0001_0000, TC_H_ROOT), entry(FQ, 0x0010_0000, 0x0001_0001)]);
        assert_eq!(root, RootQdisc::Other { kind: "htb".into(), handle: 0x0001_0000 });
        assert_eq!(decide(&root, false), Decision::Refuse { kind: "htb".into() });
        assert_eq!(decide(&root, true), Decision::Install(Restore::Replaced { kind: "htb".into() }));
    }

    #[test]
    fn handles_print_like_tc() {
        assert_eq!(HandleDisplay(0).to_string(), "0:");
        assert_eq!(HandleDisplay(0x8001_0000).to_string(), "8001:");
        assert_eq!(HandleDisplay(0x0001_0002).to_string(), "1:2");
        assert_eq!(RootQdisc::Other { kind: "htb".into(), handle: 0x0001_0000 }.to_string(), "htb 1:");
    }

    #[test]
    fn messages_name_the_interface_and_the_way_out() {
        let occupied = QdiscError::Occupied { ifname: "eth0".into(), kind: "htb".into() }.to_string();
        assert!(occupied.contains("eth0") && occupied.contains("`htb`"));
        assert!(occupied.contains("replace_qdisc = true"));

        let unavailable = QdiscError::FqUnavailable {
            ifname: "eth0".into(),
            source: KernelError::new(rtnetlink::Error::NetlinkError(nack(Errno::ENOENT as i32, None))),
        };
        let text = unavailable.to_string();
        for needle in ["eth0", "sch_fq", "CONFIG_NET_SCH_FQ", "modprobe sch_fq", "refuses"] {
            assert!(text.contains(needle), "{needle} missing from {text}");
        }
        assert!(std::error::Error::source(&unavailable).is_some());
    }
}
