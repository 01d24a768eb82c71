//! The handover file: what a shaperd that leaves its datapath in place (SIGUSR2, an upgrade,
//! or a crash) records beside its socket, so that the next one takes the pinned maps over
//! without renumbering the classes or rewriting every port of the rule banks, and lets go of
//! the interfaces it no longer shapes.

use std::path::Path;

use tracing::{info, warn};

use super::ifb;
use crate::{
    bpf::{Datapath, Hook},
    config::{Config, Direction},
    qdisc, ErrorChain,
};

/// The interfaces `config` shapes on ingress.
fn ingress(config: &Config) -> Vec<&str> {
    config.interfaces.iter().filter(|i| i.direction == Direction::Ingress).map(|i| i.name.as_str()).collect()
}

/// What a shaperd records beside its socket for the next one to take its pinned maps over:
/// which datapath id each class has, which ports each rule bank uses, and what it set up on
/// which interfaces.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Handover {
    /// Each class's name and datapath id.
    pub(super) classes: Vec<(String, u32)>,
    /// The ports with interval ids in each rule bank (see [`Datapath::bank_ports`]).
    pub(super) bank_ports: [Option<Vec<u32>>; 2],
    /// The devices it shaped at egress: the interfaces, or the IFB device of one shaped on
    /// ingress.
    #[serde(default)]
    pub(super) interfaces: Vec<String>,
    /// The interfaces whose clsact qdisc it added (see [`Datapath::added_clsact`]).
    #[serde(default)]
    pub(super) added_clsact: Vec<String>,
    /// The LAN-side interfaces where it recorded origins (see `Config::lan_interfaces`).
    #[serde(default)]
    pub(super) lan_interfaces: Vec<String>,
    /// The interfaces it shaped on ingress (through their IFB devices).
    #[serde(default)]
    pub(super) ingress_interfaces: Vec<String>,
}

impl Handover {
    /// What an earlier shaperd wrote; nothing if there is no file or it cannot be read (the
    /// classes then get fresh ids, in file order).
    pub(super) fn read(path: &Path) -> Handover {
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
    pub(super) fn write(path: &Path, config: &Config, ids: &[u32], datapath: &Datapath) {
        let handover = Handover {
            classes: config.classes.iter().zip(ids).map(|(c, &id)| (c.name.clone(), id)).collect(),
            bank_ports: datapath.bank_ports(),
            interfaces: config.interfaces.iter().map(ifb::shaped_device).collect(),
            added_clsact: datapath.added_clsact().to_vec(),
            lan_interfaces: config.lan_interfaces().into_iter().map(str::to_owned).collect(),
            ingress_interfaces: ingress(config).into_iter().map(str::to_owned).collect(),
        };
        let json = serde_json::to_vec(&handover).expect("serializable");
        let tmp = path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path)) {
            warn!(file = %path.display(), error = %e, "writing the handover file");
        }
    }
}

impl Handover {
    /// Takes over what the earlier shaperd set up on the interfaces: the clsact qdiscs it
    /// added on interfaces `config` shapes or lists as LAN side become this one's to remove
    /// on stop; interfaces it shaped or recorded origins on (by this record, or by a TCX link
    /// it pinned) that `config` no longer names so are given back: the program detached from
    /// that hook, shaper's `fq` removed (egress) and the clsact it added (once neither hook
    /// is in use). An interface it shaped on ingress that `config` does not gets its redirect
    /// detached, and its IFB device deleted. A failure there is logged: that interface stays
    /// as the earlier shaperd left it.
    pub(super) async fn take_interfaces_over(&self, config: &Config, datapath: &mut Datapath) {
        let lan = config.lan_interfaces();
        let ingress = ingress(config);
        let shaped = |name: &str| config.interfaces.iter().any(|i| ifb::shaped_device(i) == name);
        let in_use = |name: &str| shaped(name) || lan.contains(&name) || ingress.contains(&name);
        datapath.assume_added_clsact(self.added_clsact.iter().filter(|i| in_use(i)).cloned());
        let mut dropped: Vec<(Hook, String)> = Vec::new();
        for (hook, recorded) in [
            (Hook::Egress, &self.interfaces),
            (Hook::LanIngress, &self.lan_interfaces),
            (Hook::IfbRedirect, &self.ingress_interfaces),
        ] {
            let configured = |name: &str| match hook {
                Hook::Egress => shaped(name),
                Hook::LanIngress => lan.contains(&name),
                Hook::IfbRedirect => ingress.contains(&name),
            };
            let before = recorded.iter().cloned().chain(datapath.pinned_links(hook));
            dropped.extend(before.filter(|i| !configured(i)).map(|i| (hook, i)));
        }
        dropped.sort_by(|a, b| a.1.cmp(&b.1));
        dropped.dedup();
        for (k, (hook, iface)) in dropped.iter().enumerate() {
            let (hook, iface) = (*hook, iface.as_str());
            let detached = datapath.detach_left(iface, hook);
            let fq = if hook == Hook::Egress { qdisc::remove_shaper_fq(iface).await } else { Ok(false) };
            // Once per interface, after its last hook: the qdisc holds both hooks' filters.
            let last = dropped.get(k + 1).is_none_or(|next| next.1 != iface);
            let clsact = if last && self.added_clsact.iter().any(|i| i == iface) && !in_use(iface) {
                qdisc::delete_clsact(iface).await
            } else {
                Ok(())
            };
            match (detached, fq, clsact) {
                (Ok(detached), Ok(fq), Ok(())) => {
                    info!(interface = %iface, %hook, detached, fq_removed = fq, "no longer in the configuration: given back");
                    if hook == Hook::IfbRedirect {
                        // Nothing is redirected to it any more: its device goes, with the fq
                        // and the attachment at its egress.
                        let name = ifb::device_name(iface);
                        match ifb::delete(&name).await {
                            Ok(deleted) => {
                                info!(interface = %iface, ifb = %name, deleted, "no longer shaped on ingress: IFB device deleted");
                            }
                            Err(e) => {
                                warn!(interface = %iface, ifb = %name, error = %ErrorChain(&e), "no longer shaped on ingress, but its IFB device not deleted");
                            }
                        }
                    }
                }
                (detached, fq, clsact) => {
                    let errors: Vec<String> = [
                        detached.err().map(|e| ErrorChain(&e).to_string()),
                        fq.err().map(|e| ErrorChain(&e).to_string()),
                        clsact.err().map(|e| ErrorChain(&e).to_string()),
                    ]
                    .into_iter()
                    .flatten()
                    .collect();
                    warn!(interface = %iface, %hook, errors = %errors.join("; "), "no longer in the configuration, but not all given back");
                }
            }
        }
    }
}
