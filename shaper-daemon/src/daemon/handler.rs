//! Where a `shaperctl` request is handled: `status`, the runtime changes of a class's rate,
//! ceil or priority (written into the configuration file, then applied), and reloads.

use shaper_common::ClassConfig;
use tracing::{info, instrument, warn};

use super::{
    handover::Handover,
    ids::{assign_ids, rule_specs},
    ifb,
    setup::{fq_limits, set_ifaces},
    state::{class_config, trees, ClassEntry, State},
    Shared,
};
use crate::{
    api::{ApiError, Handler, Reply, Request, Response},
    bpf::BpfError,
    config::{
        diff::describe_changes,
        edit::{self, ClassKey, EditError, NewValue},
        Config, Direction, Interface,
    },
    qdisc::{self, FqLimits},
    rules, ErrorChain,
};

impl Handler for Shared {
    #[instrument(skip(self))]
    async fn handle(&self, request: Request) -> Reply {
        let mut state = self.state.lock().await;
        match request {
            Request::Status {} => state.status().map(Response::Status),
            Request::SetRate { class, rate, save } => {
                state.set_class_key(&class, ClassKey::Rate, &NewValue::Rate(rate.to_string()), save)
            }
            Request::SetCeil { class, ceil, save } => {
                state.set_class_key(&class, ClassKey::Ceil, &NewValue::Rate(ceil.to_string()), save)
            }
            Request::SetPrio { class, prio, save } => {
                state.set_class_key(&class, ClassKey::Prio, &NewValue::Prio(prio), save)
            }
            Request::Reload {} => {
                drop(state);
                self.reload().await
            }
        }
    }
}

impl Shared {
    /// Re-reads the configuration file and applies it; the running configuration stays in
    /// force if the file is not valid.
    pub(super) async fn reload(&self) -> Result<Response, ApiError> {
        let mut state = self.state.lock().await;
        let path = state.config.path.clone();
        let new =
            Config::load(&path).map_err(|e| ApiError::InvalidConfig { message: format!("{}", ErrorChain(&e)) })?;
        let limits = |config: &Config| -> Vec<FqLimits> {
            config.interfaces.iter().map(|i| fq_limits(config, &i.name)).collect()
        };
        let before = limits(&state.config);
        let mut changes = state.apply(new.clone())?;
        // The horizons or an interface's rate changed what fq must hold.
        for ((iface, was), need) in new.interfaces.iter().zip(before).zip(limits(&new)) {
            if was == need {
                continue;
            }
            match qdisc::resize_fq(&ifb::shaped_device(iface), need).await {
                Ok(true) => changes.push(format!("interface {}: fq {need} (was {was})", iface.name)),
                Ok(false) => {}
                Err(e) => warn!(interface = %iface.name, error = %ErrorChain(&e), "fq limits not changed"),
            }
        }
        state.file = new;
        info!(generation = state.generation, changes = changes.len(), config = %path.display(), "reloaded");
        Ok(Response::Changed { generation: state.generation, changes, saved: None })
    }
}

impl State {
    /// Changes one key of a class: in the configuration's text, validated as a whole file,
    /// then applied. With `save`, the same key is changed in the file as it is on disk: that
    /// change is validated before anything is applied, and written once it is.
    fn set_class_key(
        &mut self,
        class: &str,
        key: ClassKey,
        value: &NewValue,
        save: bool,
    ) -> Result<Response, ApiError> {
        let path = self.config.path.clone();
        let (_, config) =
            edit::set_class_key(&self.config.text, &path, class, key, value).map_err(|e| edit_error(&e))?;
        let file =
            if save { Some(edit::edit_file(&path, class, key, value).map_err(|e| edit_error(&e))?) } else { None };
        let changes = self.apply(config)?;
        let Some((text, file)) = file else {
            return Ok(Response::Changed { generation: self.generation, changes, saved: None });
        };
        edit::write_file(&path, &text).map_err(|e| ApiError::NotSaved {
            message: format!("applied (generation {}) but not saved: {}", self.generation, ErrorChain(&e)),
        })?;
        info!(config = %path.display(), "saved");
        self.file = file;
        Ok(Response::Changed { generation: self.generation, changes, saved: Some(path) })
    }

    /// Makes `new` the running configuration: stable class ids, class parameters, interface
    /// defaults, then the rules in one switch (see [`Datapath::load_rules`]), then the
    /// allocation at once. Nothing is changed when the new configuration cannot be applied.
    ///
    /// [`Datapath::load_rules`]: crate::bpf::Datapath::load_rules
    fn apply(&mut self, new: Config) -> Result<Vec<String>, ApiError> {
        let invalid = |message: String| ApiError::InvalidConfig { message };
        let internal = |e: BpfError| ApiError::Internal { message: format!("{e}") };
        let old_ifaces: Vec<&str> = self.config.interfaces.iter().map(|i| i.name.as_str()).collect();
        let new_ifaces: Vec<&str> = new.interfaces.iter().map(|i| i.name.as_str()).collect();
        if old_ifaces != new_ifaces {
            return Err(invalid(format!(
                "{}: the interfaces would change from [{}] to [{}]; shaperd sets up interfaces when it \
                 starts: restart it to apply this",
                new.path.display(),
                old_ifaces.join(", "),
                new_ifaces.join(", ")
            )));
        }
        for (old, iface) in self.config.interfaces.iter().zip(&new.interfaces) {
            same_ingress(old, iface).map_err(|e| invalid(format!("{}: {e}", new.path.display())))?;
            if old.lan != iface.lan {
                return Err(invalid(format!(
                    "{}: the LAN side of {} would change from [{}] to [{}]; shaperd sets up interfaces when it \
                     starts: restart it to apply this",
                    new.path.display(),
                    iface.name,
                    old.lan.join(", "),
                    iface.lan.join(", ")
                )));
            }
        }
        let previous: Vec<(&str, u32)> =
            self.config.classes.iter().zip(&self.classes).map(|(c, e)| (c.name.as_str(), e.id)).collect();
        let slots = self.datapath.class_slots();
        let ids = assign_ids(&new, &previous, slots).ok_or_else(|| {
            invalid(format!(
                "{}: more than {slots} classes old and new together, what the class arrays hold (sized for the \
                 configuration shaperd started with): restart shaperd to size them for this one",
                new.path.display()
            ))
        })?;
        // A change of rates or priorities leaves the rules as they are: they are compiled and
        // switched only when they (or the class ids they resolve to) change.
        let specs = rule_specs(&new, &ids);
        let old_ids: Vec<u32> = self.classes.iter().map(|e| e.id).collect();
        let compiled = if specs == rule_specs(&self.config, &old_ids) {
            None
        } else {
            Some(rules::compile(&specs).map_err(|e| invalid(format!("{}: {e}", new.path.display())))?)
        };

        let old_at = self.config.class_positions();
        let (new_at, new_leaves) = (new.class_positions(), new.leaf_flags());
        let mut entries = Vec::with_capacity(new.classes.len());
        for ((class, &id), &leaf) in new.classes.iter().zip(&ids).zip(&new_leaves) {
            let kept = old_at.get(class.name.as_str()).map(|&p| &self.classes[p]);
            entries.push(match kept {
                Some(e) if e.leaf == leaf => e.carried_over(class.rate),
                _ => ClassEntry::new(id, leaf, class.rate),
            });
        }
        // Classes that no longer carry traffic: unpaced, and zeroed once the change is in.
        let retired: Vec<(u32, bool)> = self
            .config
            .classes
            .iter()
            .zip(&self.classes)
            .filter_map(|(class, entry)| {
                let now = new_at.get(class.name.as_str());
                let gone = now.is_none();
                (gone || entry.leaf && now.is_some_and(|&p| !new_leaves[p])).then_some((entry.id, gone))
            })
            .collect();
        // All of it or none: a write the kernel refuses half-way puts back what was written.
        let ifindexes = &self.ifindexes;
        self.datapath
            .all_or_nothing(|datapath| {
                for ((class, entry), &id) in new.classes.iter().zip(&entries).zip(&ids) {
                    if entry.leaf {
                        datapath.set_class(id, class_config(class, entry.pacing_rate, entry.share, entry.mode))?;
                    }
                }
                set_ifaces(datapath, &new, ifindexes, &ids)?;
                if let Some(compiled) = &compiled {
                    datapath.load_rules(compiled)?;
                }
                // After the switch: until then, the old rules may still send packets here.
                for &(id, _) in &retired {
                    datapath.set_class(id, ClassConfig::default())?;
                }
                Ok::<_, BpfError>(())
            })
            .map_err(internal)?;
        // A class that takes a given-up id later starts from nothing.
        for &(id, gone) in &retired {
            if gone {
                self.datapath.reset_class(id).map_err(internal)?;
            }
        }
        let changes = describe_changes(&self.config, &new);
        if let Some(path) = self.options.handover_file() {
            Handover::write(&path, &new, &ids, &self.datapath);
        }
        self.config = new;
        self.classes = entries;
        self.trees = trees(&self.config);
        self.generation += 1;
        self.control_tick().map_err(internal)?;
        for change in &changes {
            info!(generation = self.generation, %change, "applied");
        }
        Ok(changes)
    }
}

/// The API error for a runtime change that the configuration refuses.
fn edit_error(e: &EditError) -> ApiError {
    let message = format!("{}", ErrorChain(e));
    match e {
        EditError::UnknownClass { .. } => ApiError::UnknownClass { message },
        EditError::Invalid { source, .. }
            if source.key().and_then(|k| k.rsplit('.').next()).is_some_and(|k| k == "rate" || k == "ceil") =>
        {
            ApiError::InvalidRate { message }
        }
        _ => ApiError::InvalidConfig { message },
    }
}

/// Refuses a reload that would make an interface shaped on ingress or no longer so: that
/// takes an IFB device and a redirect, which shaperd sets up when it starts.
fn same_ingress(old: &Interface, new: &Interface) -> Result<(), String> {
    let (was, will) = (old.direction == Direction::Ingress, new.direction == Direction::Ingress);
    if was == will {
        return Ok(());
    }
    Err(format!(
        "{} would {} shaped on ingress (through an IFB device); shaperd sets up interfaces when it starts: \
         restart it to apply this",
        new.name,
        if will { "become" } else { "no longer be" }
    ))
}
