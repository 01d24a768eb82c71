//! Network interfaces as the kernel knows them: an interface's index by name, whether it has
//! a link-layer header, whether it still exists.
//!
//! Every lookup asks the network namespace of the calling thread: a netlink (or ioctl)
//! socket belongs to the namespace of the thread that opens it, and that is where shaperd
//! shapes. (`/sys/class/net` would show the namespace sysfs was mounted in instead.)

use futures::{Stream, StreamExt};
use netlink_packet_route::{
    link::{LinkAttribute, LinkLayerType, LinkMessage},
    RouteNetlinkMessage,
};
use nix::errno::Errno;
use rtnetlink::{
    packet_core::{NetlinkMessage, NetlinkPayload, NLM_F_REQUEST},
    sys::{protocols::NETLINK_ROUTE, Socket, SocketAddr},
    Handle,
};

/// The index of the interface named `name`; `None` if there is none.
#[must_use]
pub fn index(name: &str) -> Option<u32> {
    nix::net::if_::if_nametoindex(name).ok()
}

/// Whether the interface named `name` has no link-layer header: tun, WireGuard, PPP and raw
/// IP devices hand the tc program packets that start with the IP header. Ethernet and
/// loopback devices carry an Ethernet header; so, as far as the program is concerned, does an
/// interface that cannot be looked up (`false`).
#[must_use]
pub fn is_l3(name: &str) -> bool {
    link(name).is_some_and(|l| !matches!(l.header.link_layer_type, LinkLayerType::Ether | LinkLayerType::Loopback))
}

/// The index of the interface named `name`, asked over the rtnetlink connection `rtnl`;
/// `None` if there is none.
pub async fn find_index(rtnl: &Handle, name: &str) -> Result<Option<u32>, rtnetlink::Error> {
    let link = first(rtnl.link().get().match_name(name.to_owned()).execute()).await?;
    Ok(link.map(|l| l.header.index))
}

/// The kernel's description of interface `index`, asked over the rtnetlink connection
/// `rtnl`; `None` if there is none.
pub async fn link_by_index(rtnl: &Handle, index: u32) -> Result<Option<LinkMessage>, rtnetlink::Error> {
    first(rtnl.link().get().match_index(index).execute()).await
}

/// Whether interface `index` exists, asked over the rtnetlink connection `rtnl`.
pub async fn exists(rtnl: &Handle, index: u32) -> Result<bool, rtnetlink::Error> {
    Ok(first(rtnl.link().get().match_index(index).execute()).await?.is_some())
}

/// The first link of a lookup's replies; `None` when the kernel found no such interface
/// (`ENODEV`, or no reply at all).
async fn first(
    links: impl Stream<Item = Result<LinkMessage, rtnetlink::Error>>,
) -> Result<Option<LinkMessage>, rtnetlink::Error> {
    let mut links = std::pin::pin!(links);
    match links.next().await {
        Some(Ok(link)) => Ok(Some(link)),
        None => Ok(None),
        Some(Err(rtnetlink::Error::NetlinkError(e))) if e.raw_code() == -(Errno::ENODEV as i32) => Ok(None),
        Some(Err(e)) => Err(e),
    }
}

/// The kernel's description of the interface named `name` (`RTM_GETLINK`), asked on a
/// blocking netlink socket of its own: the kernel answers a request for one link at once,
/// so this needs no runtime. `None` if there is no such interface or the kernel cannot be
/// asked.
fn link(name: &str) -> Option<LinkMessage> {
    let mut message = LinkMessage::default();
    message.attributes.push(LinkAttribute::IfName(name.to_owned()));
    let mut request = NetlinkMessage::from(RouteNetlinkMessage::GetLink(message));
    request.header.flags = NLM_F_REQUEST;
    request.finalize();
    let mut bytes = vec![0; request.buffer_len()];
    request.serialize(&mut bytes);

    let socket = Socket::new(NETLINK_ROUTE).ok()?;
    let kernel = SocketAddr::new(0, 0);
    socket.send_to(&bytes, &kernel, 0).ok()?;
    let (reply, _) = socket.recv_from_full().ok()?;
    match NetlinkMessage::<RouteNetlinkMessage>::deserialize(&reply).ok()?.payload {
        NetlinkPayload::InnerMessage(RouteNetlinkMessage::NewLink(link)) => Some(link),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_and_missing_interfaces_are_not_l3() {
        // The lookup itself works: loopback is found, and is loopback.
        assert_eq!(link("lo").map(|l| l.header.link_layer_type), Some(LinkLayerType::Loopback));
        assert!(!is_l3("lo"), "loopback frames carry an Ethernet header");
        assert!(!is_l3("no-such-if0"));
        assert!(!is_l3("a-name-longer-than-ifnamsiz"));
    }
}
