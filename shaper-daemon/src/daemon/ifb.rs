//! Shaping what arrives on an interface (`direction = "ingress"`): a qdisc only holds packets
//! that leave, so the packets arriving on the interface are sent through an IFB device
//! (`drivers/net/ifb.c`, the "intermediate functional block") that shaperd creates for it.
//!
//! ```text
//!  wan0 ingress ──shaper_ifb: bpf_redirect──▶ ifb-wan0 egress: shaper_egress + fq
//!                                                   │ (released at its departure time)
//!  stack ◀── ingress of wan0 again (skb_iif) ◀──────┘
//! ```
//!
//! The IFB's egress is shaped as any shaped interface's: `fq` at its root, the shaper program
//! attached there, and the IFB's index in the datapath's interface table, with the
//! configured interface's slot, link-layer type and settings (a packet's host is its
//! destination). The configured interface gets the redirect program at its ingress, and the
//! IFB's index under its own in `IFB_TARGETS`. The IFB hands each packet back to the stack
//! once `fq` releases it, as received on the configured interface, without running that
//! interface's ingress hook again.
//!
//! The IFB is named after the interface ([`device_name`]), so that a later shaperd finds the
//! one an earlier one left (a handover, a crash) and takes it over, fq, attachment and all.
//! It is deleted on stop, and when a later shaperd's configuration no longer shapes the
//! interface on ingress.

use futures::StreamExt;
use netlink_packet_route::{
    link::{InfoKind, LinkAttribute, LinkFlags, LinkInfo, LinkMessage},
    tc::{
        TcAction, TcActionAttribute, TcActionMirror, TcActionMirrorOption, TcActionOption, TcActionType, TcAttribute,
        TcFilterMatchAll, TcFilterMatchAllOption, TcHandle, TcMessage, TcMirror, TcMirrorActionType, TcOption,
    },
    RouteNetlinkMessage,
};
use nix::errno::Errno;
use rtnetlink::{packet_core::NLM_F_CREATE, LinkIfb, LinkUnspec};
use tracing::info;

use crate::{
    bpf::{Hook, FILTER_PRIORITY},
    config::{Direction, Interface},
    qdisc::{KernelError, QdiscError, Rtnl},
};

/// The longest interface name the kernel takes (`IFNAMSIZ` less the terminating zero).
const IFNAME_MAX: usize = 15;
const PREFIX: &str = "ifb-";

/// The name of the IFB device of interface `iface`: `ifb-` and the interface's name, or, when
/// that is longer than an interface name may be, `ifb-`, the name's first five bytes and six
/// hex digits of its hash (two long names with the same start still get two devices).
#[must_use]
pub fn device_name(iface: &str) -> String {
    let name = format!("{PREFIX}{iface}");
    if name.len() <= IFNAME_MAX {
        return name;
    }
    // FNV-1a: stable across releases, so a later shaperd finds the device by its name.
    let hash = iface.bytes().fold(0x811c_9dc5_u32, |h, b| (h ^ u32::from(b)).wrapping_mul(0x0100_0193));
    let mut start = 5;
    while !iface.is_char_boundary(start) {
        start -= 1;
    }
    format!("{PREFIX}{}{:06x}", &iface[..start], hash & 0x00FF_FFFF)
}

/// The device whose egress shapes interface `iface`: its IFB when it is shaped on ingress,
/// else the interface itself.
#[must_use]
pub fn shaped_device(iface: &Interface) -> String {
    if iface.direction == Direction::Ingress {
        device_name(&iface.name)
    } else {
        iface.name.clone()
    }
}

/// Errors of creating, finding or deleting an IFB device; each names the device.
#[derive(Debug, thiserror::Error)]
pub enum IfbError {
    #[error("cannot open an rtnetlink socket to manage {name}")]
    Socket {
        name: String,
        #[source]
        source: QdiscError,
    },
    #[error(
        "cannot create the IFB device {name} for shaping what arrives on {iface} (direction = \"ingress\"): \
         this kernel needs the ifb module (CONFIG_IFB; `modprobe ifb`)"
    )]
    Create {
        name: String,
        iface: String,
        #[source]
        source: rtnetlink::Error,
    },
    #[error(
        "{name} exists and is not an IFB device; shaperd shapes what arrives on {iface} through an IFB device \
         of that name: rename or remove {name}"
    )]
    Occupied { name: String, iface: String },
    #[error("redirecting what arrives on {iface} to {name} (tc filter ... matchall action mirred egress redirect)")]
    Mirred {
        name: String,
        iface: String,
        #[source]
        source: KernelError,
    },
    #[error("{action} {name}")]
    Request {
        name: String,
        action: &'static str,
        #[source]
        source: rtnetlink::Error,
    },
}

/// An IFB device shaperd created (or took over from an earlier shaperd): deleted by
/// [`delete`] on stop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ifb {
    /// The device's name ([`device_name`]).
    pub name: String,
    /// The device's index.
    pub index: u32,
    /// The interface whose arriving packets it shapes.
    pub iface: String,
}

/// The link named `name`; `None` if there is none.
async fn link(rtnl: &Rtnl, name: &str) -> Result<Option<LinkMessage>, IfbError> {
    let mut links = rtnl.handle().link().get().match_name(name.to_owned()).execute();
    match links.next().await {
        Some(Ok(link)) => Ok(Some(link)),
        None => Ok(None),
        Some(Err(rtnetlink::Error::NetlinkError(e))) if e.raw_code() == -(Errno::ENODEV as i32) => Ok(None),
        Some(Err(source)) => Err(IfbError::Request { name: name.to_owned(), action: "looking up", source }),
    }
}
/// Whether `link` is an IFB device.
fn is_ifb(link: &LinkMessage) -> bool {
    link.attributes.iter().any(|a| match a {
        LinkAttribute::LinkInfo(infos) => infos.iter().any(|i| matches!(i, LinkInfo::Kind(InfoKind::Ifb))),
        _ => false,
    })
}

/// Makes sure the IFB device of interface `iface` exists and is up: creates it (the kernel
/// loads the ifb module on demand), or takes over the one an earlier shaperd left. A device of
/// that name that is not an IFB is an error: it is someone else's.
pub async fn ensure(iface: &str) -> Result<Ifb, IfbError> {
    let name = device_name(iface);
    let rtnl = Rtnl::open(&name).map_err(|source| IfbError::Socket { name: name.clone(), source })?;
    let link = match link(&rtnl, &name).await? {
        Some(link) if !is_ifb(&link) => return Err(IfbError::Occupied { name, iface: iface.to_owned() }),
        Some(link) => {
            info!(interface = %iface, ifb = %name, "taking over the IFB device an earlier shaperd created");
            if !link.header.flags.contains(LinkFlags::Up) {
                let up = LinkUnspec::new_with_index(link.header.index).up().build();
                rtnl.handle().link().set(up).execute().await.map_err(|source| IfbError::Request {
                    name: name.clone(),
                    action: "setting up",
                    source,
                })?;
            }
            link
        }
        None => {
            rtnl.handle()
                .link()
                .add(LinkIfb::new(&name).up().build())
                .execute()
                .await
                .map_err(|source| IfbError::Create { name: name.clone(), iface: iface.to_owned(), source })?;
            let link = link(&rtnl, &name)
                .await?
                .ok_or_else(|| IfbError::Occupied { name: name.clone(), iface: iface.to_owned() })?;
            info!(interface = %iface, ifb = %name, ifindex = link.header.index, "created the IFB device its arriving packets are shaped on");
            link
        }
    };
    Ok(Ifb { name, index: link.header.index, iface: iface.to_owned() })
}

/// Redirects what arrives on interface `iface` (index `index`) to the egress of the IFB device
/// `ifb` (an index) with `act_mirred`, as `tc filter add dev IFACE ingress pref 1 handle
/// 0x5a20 matchall action mirred egress redirect dev IFB` does. The clsact qdisc must be
/// there. A filter an earlier shaperd left there is replaced (`cls_matchall` cannot change a
/// filter in place: it is deleted and added again, which leaves what arrives meanwhile, a few
/// microseconds' worth, unshaped).
///
/// For kernels before 6.4, whose `bpf_redirect()` does not mark the skb as redirected from
/// ingress (`bpf: Set skb redirect and from_ingress info in __bpf_tx_skb`), so that
/// `ifb_xmit()` drops every packet it is handed (counted in the IFB's `rx_dropped`; measured
/// on Debian's 6.1: the gateway could not even resolve its neighbours). `act_mirred` sets
/// the marks on any kernel (`skb_set_redirected()`), and clears a receive timestamp too.
pub async fn mirred(iface: &str, index: u32, ifb: &str, ifb_index: u32) -> Result<(), IfbError> {
    let rtnl = Rtnl::open(ifb).map_err(|source| IfbError::Socket { name: ifb.to_owned(), source })?;
    let mirred_err = |source| IfbError::Mirred { name: ifb.to_owned(), iface: iface.to_owned(), source };
    let add = || RouteNetlinkMessage::NewTrafficFilter(mirred_filter(index, Some(ifb_index)));
    match rtnl.acked(add(), NLM_F_CREATE).await {
        Err(e) if e.errno() == Some(Errno::EEXIST as i32) => {
            info!(interface = %iface, ifb = %ifb, "replacing the redirect an earlier shaperd left");
            rtnl.acked(RouteNetlinkMessage::DelTrafficFilter(mirred_filter(index, None)), 0)
                .await
                .map_err(mirred_err)?;
            rtnl.acked(add(), NLM_F_CREATE).await.map_err(mirred_err)
        }
        other => other.map_err(mirred_err),
    }
}

/// The matchall filter at ingress of interface `index` that redirects to the IFB `ifb_index`
/// (`None`: only what names the filter, to delete it).
fn mirred_filter(index: u32, ifb_index: Option<u32>) -> TcMessage {
    /// `ETH_P_ALL`: every protocol.
    const ETH_P_ALL: u16 = 0x0003;
    let mut message = TcMessage::with_index(i32::try_from(index).unwrap_or(i32::MAX));
    message.header.parent = TcHandle { major: 0xFFFF, minor: TcHandle::MIN_INGRESS };
    message.header.handle = Hook::IfbRedirect.filter_handle().into();
    message.header.info = u32::from(TcHandle { major: FILTER_PRIORITY, minor: ETH_P_ALL.to_be() });
    message.attributes = vec![TcAttribute::Kind(TcFilterMatchAll::KIND.to_owned())];
    if let Some(ifb_index) = ifb_index {
        let mut mirror = TcMirror::default();
        mirror.generic.action = TcActionType::Stolen;
        mirror.eaction = TcMirrorActionType::EgressRedir;
        mirror.ifindex = ifb_index;
        let mut action = TcAction::default();
        action.tab = 1;
        action.attributes = vec![
            TcActionAttribute::Kind(TcActionMirror::KIND.to_owned()),
            TcActionAttribute::Options(vec![TcActionOption::Mirror(TcActionMirrorOption::Parms(mirror))]),
        ];
        message
            .attributes
            .push(TcAttribute::Options(vec![TcOption::MatchAll(TcFilterMatchAllOption::Action(vec![action]))]));
    }
    message
}

/// Deletes the IFB device `name` (with its qdiscs and attachments). A device that is gone, or
/// is not an IFB, is left alone. Returns whether it deleted one.
pub async fn delete(name: &str) -> Result<bool, IfbError> {
    let rtnl = Rtnl::open(name).map_err(|source| IfbError::Socket { name: name.to_owned(), source })?;
    let Some(link) = link(&rtnl, name).await? else { return Ok(false) };
    if !is_ifb(&link) {
        return Ok(false);
    }
    match rtnl.handle().link().del(link.header.index).execute().await {
        Ok(()) => Ok(true),
        Err(rtnetlink::Error::NetlinkError(e)) if e.raw_code() == -(Errno::ENODEV as i32) => Ok(false),
        Err(source) => Err(IfbError::Request { name: name.to_owned(), action: "deleting", source }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ifb_names_fit_an_interface_name_and_differ() {
        assert_eq!(device_name("wan0"), "ifb-wan0");
        assert_eq!(device_name("enp0s31f6"), "ifb-enp0s31f6");
        assert_eq!(device_name("enp0s31f6").len(), 13);
        let long = device_name("enp0s20f0u1u2c2");
        assert!(long.len() <= IFNAME_MAX, "{long}");
        assert!(long.starts_with("ifb-enp0s"), "{long}");
        assert_ne!(long, device_name("enp0s20f0u1u2c3"));
        assert_eq!(long, device_name("enp0s20f0u1u2c2"), "stable");
        // Not cut inside a character.
        let wide = device_name("éééééééééééé");
        assert!(wide.len() <= IFNAME_MAX && wide.starts_with("ifb-éé"), "{wide}");
    }
}
