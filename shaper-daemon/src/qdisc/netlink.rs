//! The rtnetlink conversation behind the qdisc policy: a short-lived connection per call
//! ([`Rtnl`]), the requests that dump, install and delete qdiscs, and the kernel's refusals
//! read into a [`KernelError`] with the text of its extended ack.

use std::fmt;

use futures::StreamExt;
use netlink_packet_route::{
    link::LinkAttribute,
    tc::{TcAttribute, TcHandle, TcMessage, TcOption},
    RouteNetlinkMessage,
};
use nix::errno::Errno;
use rtnetlink::{
    packet_core::{
        DefaultNla, ErrorMessage, NetlinkMessage, NetlinkPayload, Nla as _, NLM_F_ACK, NLM_F_CREATE, NLM_F_DUMP,
        NLM_F_REPLACE, NLM_F_REQUEST,
    },
    sys::AsyncSocket,
    Handle,
};
use tracing::debug;

use super::{classify, FqLimits, QdiscEntry, QdiscError, RootQdisc, FQ, MQ, SHAPER_FQ_HANDLE, TC_H_ROOT};
use crate::netdev;

/// `TCA_FQ_PLIMIT`, `TCA_FQ_FLOW_PLIMIT` (`include/uapi/linux/pkt_sched.h`).
const TCA_FQ_PLIMIT: u16 = 1;
const TCA_FQ_FLOW_PLIMIT: u16 = 2;
/// `NLMSGERR_ATTR_MSG`: the extended-ack attribute holding the kernel's error text.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Size of a netlink message header (`struct nlmsghdr`).
const NLMSG_HDRLEN: usize = 16;

/// A failed rtnetlink request, with the kernel's own explanation (extended ack) when it gave one.
#[derive(Debug, thiserror::Error)]
pub struct KernelError {
    /// The kernel's extended-ack text, e.g. `Specified qdisc kind is unknown`.
    message: Option<String>,
    /// The error as rtnetlink reported it (errno included).
    source: rtnetlink::Error,
}

impl fmt::Display for KernelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.message {
            Some(message) => write!(f, "the kernel said: {message}"),
            None => f.write_str("rtnetlink request failed"),
        }
    }
}

impl KernelError {
    pub(super) fn new(source: rtnetlink::Error) -> Self {
        let message = match &source {
            rtnetlink::Error::NetlinkError(e) => extack_message(e),
            _ => None,
        };
        Self { message, source }
    }

    /// The errno the kernel returned (positive, e.g. `ENOENT`), if it returned one.
    #[must_use]
    pub fn errno(&self) -> Option<i32> {
        match &self.source {
            rtnetlink::Error::NetlinkError(e) => e.code.map(|c| -c.get()),
            _ => None,
        }
    }

    /// The kernel's extended-ack text, if it gave one.
    #[must_use]
    pub fn message(&self) -> Option<&str> {
        self.message.as_deref()
    }
}

/// Extracts the kernel's text from an `NLMSGERR` payload.
///
/// The socket sets `NETLINK_CAP_ACK`, so the payload after the errno is the request's bare
/// header followed by the extended-ack attributes.
fn extack_message(err: &ErrorMessage) -> Option<String> {
    let value = attribute(err.header.get(NLMSG_HDRLEN..)?, NLMSGERR_ATTR_MSG)?;
    let end = value.iter().position(|&b| b == 0).unwrap_or(value.len());
    let text = String::from_utf8_lossy(&value[..end]).trim().to_owned();
    (!text.is_empty()).then_some(text)
}

/// The value of the first attribute of type `kind` in a run of netlink attributes (each a
/// 4-byte header, length and type, then the value padded to 4 bytes); `None` if there is
/// none or the run is cut short.
fn attribute(mut tlvs: &[u8], kind: u16) -> Option<&[u8]> {
    while tlvs.len() >= 4 {
        let len = usize::from(u16::from_ne_bytes([tlvs[0], tlvs[1]]));
        if len < 4 || len > tlvs.len() {
            return None;
        }
        // The top two bits are the nested and byte-order flags.
        if u16::from_ne_bytes([tlvs[2], tlvs[3]]) & 0x3FFF == kind {
            return Some(&tlvs[4..len]);
        }
        tlvs = tlvs.get((len + 3) & !3..)?;
    }
    None
}

/// An `fq`'s packet limits from its `TCA_OPTIONS` (which netlink-packet-route keeps as one
/// opaque attribute for qdisc kinds it does not know).
fn fq_limits(options: &[TcOption]) -> Option<FqLimits> {
    let nested = options.iter().find_map(|o| match o {
        TcOption::Other(nla) => {
            let mut value = vec![0; nla.value_len()];
            nla.emit_value(&mut value);
            Some(value)
        }
        _ => None,
    })?;
    let u32_of = |kind| attribute(&nested, kind).and_then(|v| Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?)));
    Some(FqLimits { packets: u32_of(TCA_FQ_PLIMIT)?, flow_packets: u32_of(TCA_FQ_FLOW_PLIMIT)? })
}

/// An rtnetlink connection whose background task ends with it.
pub(crate) struct Rtnl {
    handle: Handle,
    /// The connection, polled in the background.
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Rtnl {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    pub(crate) fn open(ifname: &str) -> Result<Self, QdiscError> {
        let (mut connection, handle, _) =
            rtnetlink::new_connection().map_err(|source| QdiscError::Socket { ifname: ifname.to_owned(), source })?;
        let socket = connection.socket_mut().socket_mut();
        // The kernel's error text is a bonus: without it the errno is still there. Capping the
        // ack keeps the layout `extack_message` expects; ext-ack is only asked for if it holds.
        if socket.set_cap_ack(true).is_ok() {
            if let Err(e) = socket.set_ext_ack(true) {
                debug!("NETLINK_EXT_ACK unavailable, kernel error texts will be missing: {e}");
            }
        }
        Ok(Self { handle, task: tokio::spawn(connection) })
    }

    /// Sends one request that expects only an acknowledgement.
    pub(crate) async fn acked(&self, message: RouteNetlinkMessage, flags: u16) -> Result<(), KernelError> {
        let mut request = NetlinkMessage::from(message);
        request.header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        let mut responses = self.handle.clone().request(request).map_err(KernelError::new)?;
        while let Some(response) = responses.next().await {
            if let NetlinkPayload::Error(e) = response.payload {
                return Err(KernelError::new(rtnetlink::Error::NetlinkError(e)));
            }
        }
        Ok(())
    }

    /// The connection's handle, for requests of other kinds.
    pub(crate) fn handle(&self) -> &Handle {
        &self.handle
    }

    /// The index of the interface named `ifname` (see [`netdev::find_index`]).
    pub(super) async fn ifindex(&self, ifname: &str) -> Result<u32, QdiscError> {
        match netdev::find_index(&self.handle, ifname).await {
            Ok(Some(index)) => Ok(index),
            Ok(None) => Err(QdiscError::NoSuchInterface { ifname: ifname.to_owned() }),
            Err(source) => Err(link_error(ifname, source)),
        }
    }

    /// Whether interface `ifindex` still exists (see [`netdev::exists`]).
    pub(super) async fn link_exists(&self, ifname: &str, ifindex: u32) -> Result<bool, QdiscError> {
        netdev::exists(&self.handle, ifindex).await.map_err(|source| link_error(ifname, source))
    }

    /// The root qdisc of interface `ifindex`.
    pub(super) async fn root(&self, ifname: &str, ifindex: u32) -> Result<RootQdisc, QdiscError> {
        Ok(self.root_with_fq_limits(ifname, ifindex).await?.0)
    }

    /// The root qdisc of interface `ifindex`, and its packet limits if it is `fq`, from one dump.
    pub(super) async fn root_with_fq_limits(
        &self,
        ifname: &str,
        ifindex: u32,
    ) -> Result<(RootQdisc, Option<FqLimits>), QdiscError> {
        // The kernel ignores the index of a qdisc dump and sends every interface's qdiscs;
        // TCA_DUMP_INVISIBLE makes it include the children it would hide from `tc qdisc show`.
        let mut request = TcMessage::default();
        request.attributes.push(TcAttribute::DumpInvisible(true));
        let messages = self
            .dumped(RouteNetlinkMessage::GetQueueDiscipline(request))
            .await
            .map_err(|source| QdiscError::Dump { ifname: ifname.to_owned(), source })?;
        let entries: Vec<QdiscEntry> = messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewQueueDiscipline(msg) => QdiscEntry::from_message(msg, ifindex),
                _ => None,
            })
            .collect();
        debug!(interface = %ifname, ?entries, "qdiscs");
        let limits = entries.iter().find(|e| e.parent == TC_H_ROOT && e.kind == FQ).and_then(|e| e.fq_limits);
        Ok((classify(&entries), limits))
    }

    /// The `(priority, handle)` of each filter of kind `kind` at egress of interface
    /// `ifindex` (under clsact), as `tc filter show dev IF egress` lists them.
    pub(super) async fn egress_filters(
        &self,
        ifname: &str,
        ifindex: u32,
        kind: &str,
    ) -> Result<Vec<(u16, u32)>, QdiscError> {
        /// `TC_H_MAKE(TC_H_CLSACT, TC_H_MIN_EGRESS)`: clsact's egress hook.
        const CLSACT_EGRESS: u32 = 0xFFFF_FFF3;
        let mut request = TcMessage::with_index(tc_index(ifname, ifindex)?);
        request.header.parent = CLSACT_EGRESS.into();
        let messages = self
            .dumped(RouteNetlinkMessage::GetTrafficFilter(request))
            .await
            .map_err(|source| QdiscError::Filters { ifname: ifname.to_owned(), source })?;
        Ok(messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewTrafficFilter(msg) => {
                    let is_kind = msg.attributes.iter().any(|a| matches!(a, TcAttribute::Kind(k) if k == kind));
                    // tcm_info holds the priority in its upper half; handle 0 is the
                    // priority's own entry, not a filter.
                    let handle: u32 = msg.header.handle.into();
                    (is_kind && handle != 0).then(|| (u16::try_from(msg.header.info >> 16).unwrap_or(u16::MAX), handle))
                }
                _ => None,
            })
            .collect())
    }

    /// Sends a dump request and returns the kernel's messages, or its refusal.
    async fn dumped(&self, message: RouteNetlinkMessage) -> Result<Vec<RouteNetlinkMessage>, KernelError> {
        let mut request = NetlinkMessage::from(message);
        request.header.flags = NLM_F_REQUEST | NLM_F_DUMP;
        let mut responses = self.handle.clone().request(request).map_err(KernelError::new)?;
        let mut messages = Vec::new();
        while let Some(response) = responses.next().await {
            match response.payload {
                NetlinkPayload::InnerMessage(message) => messages.push(message),
                NetlinkPayload::Error(e) => return Err(KernelError::new(rtnetlink::Error::NetlinkError(e))),
                _ => {}
            }
        }
        Ok(messages)
    }

    /// Makes `fq` with `limits` the root qdisc of `ifindex`: `tc qdisc replace root handle
    /// 5a1f: fq limit .. flow_limit ..`; or, on an interface with several transmit queues,
    /// `mq` there (`tc qdisc replace root handle 5a1f: mq`) and that `fq` on each of its
    /// queues (`tc qdisc replace parent 5a1f:N fq ..`). `current` is the root qdisc now: an
    /// `fq` or `mq` of shaper's already there is kept, and its `fq`s' limits are changed in
    /// place (`tc_modify_qdisc()`: same kind, keeping their queues).
    pub(super) async fn install_fq(
        &self,
        ifname: &str,
        ifindex: u32,
        limits: FqLimits,
        current: &RootQdisc,
    ) -> Result<(), QdiscError> {
        let queues = match current {
            // An fq of shaper's at the root stays (an mq cannot replace it under the same
            // handle).
            RootQdisc::Fq { handle: SHAPER_FQ_HANDLE } => 1,
            _ => self.tx_queues(ifname, ifindex).await?,
        };
        if queues <= 1 {
            return self.new_fq(ifname, ifindex, TcHandle::ROOT, SHAPER_FQ_HANDLE, limits).await;
        }
        let created = *current != RootQdisc::ShaperMq;
        if created {
            let mut message = TcMessage::with_index(tc_index(ifname, ifindex)?);
            message.header.parent = TcHandle::ROOT;
            message.header.handle = SHAPER_FQ_HANDLE.into();
            message.attributes.push(TcAttribute::Kind(MQ.to_owned()));
            self.acked(RouteNetlinkMessage::NewQueueDiscipline(message), NLM_F_CREATE | NLM_F_REPLACE)
                .await
                .map_err(|source| QdiscError::Install { ifname: ifname.to_owned(), source })?;
        }
        // mq has a child for every queue the device has room for, but shows (and uses) only
        // those of the queues in use: a veth has room for one per CPU and uses one unless
        // told otherwise. With one in use, fq at the root instead, as on a single queue.
        let queues = self.mq_children(ifname, ifindex).await?;
        if created && queues.len() <= 1 {
            self.delete_root(ifname, ifindex, SHAPER_FQ_HANDLE).await?;
            return self.new_fq(ifname, ifindex, TcHandle::ROOT, SHAPER_FQ_HANDLE, limits).await;
        }
        for parent in queues {
            if let Err(e) = self.new_fq(ifname, ifindex, parent.into(), 0, limits).await {
                // Nothing half-applied: the mq this call created goes (the kernel's default
                // root comes back).
                if created {
                    let _ = self.delete_root(ifname, ifindex, SHAPER_FQ_HANDLE).await;
                }
                return Err(e);
            }
        }
        Ok(())
    }

    /// The handles (`5a1f:N`) of the queues of shaper's `mq` on `ifindex` that the kernel
    /// shows: those of the transmit queues in use.
    async fn mq_children(&self, ifname: &str, ifindex: u32) -> Result<Vec<u32>, QdiscError> {
        let messages = self
            .dumped(RouteNetlinkMessage::GetQueueDiscipline(TcMessage::default()))
            .await
            .map_err(|source| QdiscError::Dump { ifname: ifname.to_owned(), source })?;
        let mut parents: Vec<u32> = messages
            .iter()
            .filter_map(|m| match m {
                RouteNetlinkMessage::NewQueueDiscipline(msg) => QdiscEntry::from_message(msg, ifindex),
                _ => None,
            })
            .map(|e| e.parent)
            .filter(|p| p >> 16 == SHAPER_FQ_HANDLE >> 16 && p & 0xFFFF != 0)
            .collect();
        parents.sort_unstable();
        parents.dedup();
        Ok(parents)
    }

    /// `tc qdisc replace parent PARENT handle HANDLE fq limit .. flow_limit ..` (handle 0:
    /// the kernel's choice).
    async fn new_fq(
        &self,
        ifname: &str,
        ifindex: u32,
        parent: TcHandle,
        handle: u32,
        limits: FqLimits,
    ) -> Result<(), QdiscError> {
        let mut message = TcMessage::with_index(tc_index(ifname, ifindex)?);
        message.header.parent = parent;
        message.header.handle = handle.into();
        message.attributes.push(TcAttribute::Kind(FQ.to_owned()));
        message.attributes.push(TcAttribute::Options(vec![
            TcOption::Other(DefaultNla::new(TCA_FQ_PLIMIT, limits.packets.to_ne_bytes().to_vec())),
            TcOption::Other(DefaultNla::new(TCA_FQ_FLOW_PLIMIT, limits.flow_packets.to_ne_bytes().to_vec())),
        ]));
        let flags = NLM_F_CREATE | NLM_F_REPLACE;
        match self.acked(RouteNetlinkMessage::NewQueueDiscipline(message), flags).await {
            Ok(()) => Ok(()),
            Err(source) if means_unknown_kind(&source) => {
                Err(QdiscError::FqUnavailable { ifname: ifname.to_owned(), source })
            }
            Err(source) => Err(QdiscError::Install { ifname: ifname.to_owned(), source }),
        }
    }

    /// The number of transmit queues of interface `ifindex` (`IFLA_NUM_TX_QUEUES`; 1 if the
    /// kernel does not say).
    async fn tx_queues(&self, ifname: &str, ifindex: u32) -> Result<u32, QdiscError> {
        let link = netdev::link_by_index(&self.handle, ifindex).await.map_err(|source| link_error(ifname, source))?;
        let queues = link.and_then(|l| {
            l.attributes.into_iter().find_map(|a| match a {
                LinkAttribute::NumTxQueues(n) => Some(n),
                _ => None,
            })
        });
        Ok(queues.unwrap_or(1))
    }

    /// Deletes the root qdisc of `ifindex` if its handle is `handle`.
    pub(super) async fn delete_root(&self, ifname: &str, ifindex: u32, handle: u32) -> Result<(), QdiscError> {
        let mut message = TcMessage::with_index(tc_index(ifname, ifindex)?);
        message.header.parent = TcHandle::ROOT;
        message.header.handle = handle.into();
        self.acked(RouteNetlinkMessage::DelQueueDiscipline(message), 0)
            .await
            .map_err(|source| QdiscError::Delete { ifname: ifname.to_owned(), source })
    }
}

impl QdiscEntry {
    /// The qdisc described by `msg` if it belongs to interface `ifindex`.
    fn from_message(msg: &TcMessage, ifindex: u32) -> Option<Self> {
        if u32::try_from(msg.header.index).ok()? != ifindex {
            return None;
        }
        let kind = msg.attributes.iter().find_map(|a| match a {
            TcAttribute::Kind(k) => Some(k.clone()),
            _ => None,
        })?;
        let fq_limits = if kind == FQ {
            msg.attributes.iter().find_map(|a| match a {
                TcAttribute::Options(options) => fq_limits(options),
                _ => None,
            })
        } else {
            None
        };
        Some(Self { kind, handle: msg.header.handle.into(), parent: msg.header.parent.into(), fq_limits })
    }
}

/// Maps a failed link lookup (a missing interface is not a failure: see [`netdev`]).
fn link_error(ifname: &str, source: rtnetlink::Error) -> QdiscError {
    QdiscError::Link { ifname: ifname.to_owned(), source: KernelError::new(source) }
}

/// Whether a refused `RTM_NEWQDISC` means that the kernel does not know the qdisc kind.
///
/// Linux answers `ENOENT` ("Specified qdisc kind is unknown") once it has failed to find or
/// autoload the module; `EOPNOTSUPP` is accepted too, for kernels that word it that way.
fn means_unknown_kind(error: &KernelError) -> bool {
    matches!(error.errno().map(Errno::from_raw), Some(Errno::ENOENT | Errno::EOPNOTSUPP))
}

/// An interface index as `struct tcmsg` holds it.
pub(super) fn tc_index(ifname: &str, ifindex: u32) -> Result<i32, QdiscError> {
    // Interface indexes are positive `int`s in the kernel: a larger one names no interface.
    let Ok(index) = i32::try_from(ifindex) else {
        return Err(QdiscError::NoSuchInterface { ifname: ifname.to_owned() });
    };
    Ok(index)
}

/// An `NLMSGERR` payload as the kernel sends it with `NETLINK_CAP_ACK` and `NETLINK_EXT_ACK`.
#[cfg(test)]
pub(super) fn nack(errno: i32, text: Option<&str>) -> ErrorMessage {
    let mut payload = vec![0u8; NLMSG_HDRLEN];
    if let Some(text) = text {
        let mut value = text.as_bytes().to_vec();
        value.push(0);
        let len = u16::try_from(4 + value.len()).unwrap();
        payload.extend(len.to_ne_bytes());
        payload.extend(NLMSGERR_ATTR_MSG.to_ne_bytes());
        payload.extend(value);
        payload.resize((payload.len() + 3) & !3, 0);
    }
    // NLMSGERR_ATTR_OFFS, after the message, must not disturb the parsing.
    payload.extend(8u16.to_ne_bytes());
    payload.extend(2u16.to_ne_bytes());
    payload.extend(20u32.to_ne_bytes());
    let mut e = ErrorMessage::default();
    e.code = std::num::NonZeroI32::new(-errno);
    e.header = payload;
    e
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::qdisc::TC_H_ROOT;

    #[test]
    fn entries_of_other_interfaces_are_ignored() {
        let mut message = TcMessage::with_index(7);
        message.header.handle = 0x0001_0000.into();
        message.header.parent = TcHandle::ROOT;
        message.attributes.push(TcAttribute::Kind("htb".into()));
        assert_eq!(
            QdiscEntry::from_message(&message, 7),
            Some(QdiscEntry { kind: "htb".to_owned(), handle: 0x0001_0000, parent: TC_H_ROOT, fq_limits: None })
        );
        assert_eq!(QdiscEntry::from_message(&message, 8), None);
    }

    #[test]
    fn an_fq_entry_carries_its_limits() {
        // As netlink-packet-route reads an fq's TCA_OPTIONS (type 2): one opaque attribute
        // whose value is the nested run, here quantum (3), limit (1) and flow_limit (2).
        let nested: Vec<u8> = [(3u16, 3028u32), (1, 25_000), (2, 6_250)]
            .iter()
            .flat_map(|&(kind, value)| {
                [8u16.to_ne_bytes(), kind.to_ne_bytes()].concat().into_iter().chain(value.to_ne_bytes())
            })
            .collect();
        let mut message = TcMessage::with_index(7);
        message.header.handle = SHAPER_FQ_HANDLE.into();
        message.header.parent = TcHandle::ROOT;
        message.attributes.push(TcAttribute::Kind(FQ.into()));
        message.attributes.push(TcAttribute::Options(vec![TcOption::Other(DefaultNla::new(2, nested.clone()))]));
        let entry = QdiscEntry::from_message(&message, 7).unwrap();
        assert_eq!(entry.fq_limits, Some(FqLimits { packets: 25_000, flow_packets: 6_250 }));
        // Cut short: no limits rather than wrong ones.
        message.attributes[1] = TcAttribute::Options(vec![TcOption::Other(DefaultNla::new(2, nested[..14].to_vec()))]);
        assert_eq!(QdiscEntry::from_message(&message, 7).unwrap().fq_limits, None);
    }

    #[test]
    fn kernel_error_carries_errno_and_extack_text() {
        let e = KernelError::new(rtnetlink::Error::NetlinkError(nack(
            Errno::ENOENT as i32,
            Some("Specified qdisc kind is unknown"),
        )));
        assert_eq!(e.errno(), Some(Errno::ENOENT as i32));
        assert_eq!(e.message(), Some("Specified qdisc kind is unknown"));
        assert!(means_unknown_kind(&e));
        assert_eq!(e.to_string(), "the kernel said: Specified qdisc kind is unknown");

        let e = KernelError::new(rtnetlink::Error::NetlinkError(nack(Errno::EPERM as i32, None)));
        assert_eq!(e.errno(), Some(Errno::EPERM as i32));
        assert_eq!(e.message(), None);
        assert!(!means_unknown_kind(&e));
        assert_eq!(KernelError::new(rtnetlink::Error::RequestFailed).errno(), None);
    }

    #[test]
    fn extack_as_linux_6_18_sends_it() {
        // The NLMSGERR payload of `RTM_NEWQDISC kind fq` on a kernel without sch_fq, captured
        // with NETLINK_CAP_ACK + NETLINK_EXT_ACK: the request's header (flags 0x505 include
        // NLM_F_CREATE|NLM_F_REPLACE), then NLMSGERR_ATTR_MSG.
        let mut e = ErrorMessage::default();
        e.code = std::num::NonZeroI32::new(-(Errno::ENOENT as i32));
        e.header = vec![
            44, 0, 0, 0, 36, 0, 5, 5, 3, 0, 0, 0, 0, 0, 0, 0, 36, 0, 1, 0, 83, 112, 101, 99, 105, 102, 105, 101, 100,
            32, 113, 100, 105, 115, 99, 32, 107, 105, 110, 100, 32, 105, 115, 32, 117, 110, 107, 110, 111, 119, 110, 0,
        ];
        let e = KernelError::new(rtnetlink::Error::NetlinkError(e));
        assert_eq!(e.message(), Some("Specified qdisc kind is unknown"));
        assert!(means_unknown_kind(&e));
    }

    #[test]
    fn truncated_extack_is_ignored() {
        let mut e = nack(Errno::ENOENT as i32, Some("text"));
        e.header.truncate(NLMSG_HDRLEN + 6);
        assert_eq!(extack_message(&e), None);
        e.header.truncate(3);
        assert_eq!(extack_message(&e), None);
    }
}
