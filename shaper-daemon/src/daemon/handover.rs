//! The handover file: what a shaperd that leaves its datapath in place (SIGUSR2, an upgrade)
//! records beside its socket, so that the next one takes the pinned maps over without
//! renumbering the classes or rewriting every port of the rule banks.

use std::path::Path;

use tracing::warn;

use crate::{bpf::Datapath, config::Config};

/// What a shaperd records beside its socket for the next one to take its pinned maps over:
/// which datapath id each class has, and which ports each rule bank uses.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Handover {
    /// Each class's name and datapath id.
    pub(super) classes: Vec<(String, u32)>,
    /// The ports with interval ids in each rule bank (see [`Datapath::bank_ports`]).
    pub(super) bank_ports: [Option<Vec<u32>>; 2],
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
        };
        let json = serde_json::to_vec(&handover).expect("serializable");
        let tmp = path.with_extension("json.tmp");
        if let Err(e) = std::fs::write(&tmp, json).and_then(|()| std::fs::rename(&tmp, path)) {
            warn!(file = %path.display(), error = %e, "writing the handover file");
        }
    }
}
