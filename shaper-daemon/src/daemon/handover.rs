//! The handover file: what a shaperd that leaves its datapath in place (SIGUSR2, an upgrade,
//! or a crash) records beside its socket, so that the next one takes the pinned maps over
//! without renumbering the classes or rewriting every port of the rule banks, and lets go of
//! the interfaces it no longer shapes.

use std::path::Path;

use tracing::{info, warn};

use crate::{bpf::Datapath, config::Config, qdisc, ErrorChain};

/// What a shaperd records beside its socket for the next one to take its pinned maps over:
/// which datapath id each class has, which ports each rule bank uses, and what it set up on
/// which interfaces.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Handover {
    /// Each class's name and datapath id.
    pub(super) classes: Vec<(String, u32)>,
    /// The ports with interval ids in each rule bank (see [`Datapath::bank_ports`]).
    pub(super) bank_ports: [Option<Vec<u32>>; 2],
    /// The interfaces it shaped.
    #[serde(default)]
    pub(super) interfaces: Vec<String>,
    /// The interfaces whose clsact qdisc it added (see [`Datapath::added_clsact`]).
    #[serde(default)]
    pub(super) added_clsact: Vec<String>,
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
            interfaces: config.interfaces.iter().map(|i| i.name.clone()).collect(),
            added_clsact: datapath.added_clsact().to_vec(),
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
    /// added on interfaces `config` shapes become this one's to remove on stop; interfaces it
    /// shaped (by this record, or by a TCX link it pinned) that `config` no longer names are
    /// given back: the program detached, shaper's `fq` and the clsact it added removed. A
    /// failure there is logged: that interface stays as the earlier shaperd left it.
    pub(super) async fn take_interfaces_over(&self, config: &Config, datapath: &mut Datapath) {
        let configured = |name: &str| config.interfaces.iter().any(|i| i.name == name);
        datapath.assume_added_clsact(self.added_clsact.iter().filter(|i| configured(i)).cloned());
        let mut dropped: Vec<String> =
            self.interfaces.iter().cloned().chain(datapath.pinned_links()).filter(|i| !configured(i)).collect();
        dropped.sort();
        dropped.dedup();
        for iface in dropped {
            let detached = datapath.detach_left(&iface);
            let fq = qdisc::remove_shaper_fq(&iface).await;
            let clsact = if self.added_clsact.contains(&iface) { qdisc::delete_clsact(&iface).await } else { Ok(()) };
            match (detached, fq, clsact) {
                (Ok(detached), Ok(fq), Ok(())) => {
                    info!(interface = %iface, detached, fq_removed = fq, "no longer in the configuration: given back");
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
                    warn!(interface = %iface, errors = %errors.join("; "), "no longer in the configuration, but not all given back");
                }
            }
        }
    }
}
