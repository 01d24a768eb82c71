//! Checks the raw configuration and builds the public one.
//!
//! [`Validator::validate`] runs the checks in order: the `[daemon]` table and each interface
//! and class on its own (`daemon.rs`, `interfaces.rs`, `classes.rs`), then the class trees
//! (`tree.rs`), then the rules (`rules.rs`). The steps pass the interfaces and classes
//! between them as drafts, from which the last builds [`Config`].

mod classes;
mod daemon;
mod interfaces;
mod rules;
mod tree;

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use toml::Spanned;

use super::error::{ConfigError, Problem};
use super::model::{Aqm, Class, Config, Direction, Interface, Isolation, LinkLayer, Marking};
use super::raw::{LineIndex, RawConfig};
use crate::rate::{Rate, RateSpec};

/// An interface being validated.
struct IfaceDraft {
    name: String,
    rate: Rate,
    rate_line: usize,
    default: Spanned<String>,
    overhead: i32,
    mpu: u32,
    linklayer: LinkLayer,
    replace_qdisc: bool,
    direction: Direction,
    lan: Vec<String>,
}

/// A class being validated.
struct ClassDraft {
    name: String,
    line: usize,
    interface: usize,
    parent_name: Option<Spanned<String>>,
    parent: Option<usize>,
    rate_spec: RateSpec,
    rate_line: usize,
    ceil_spec: Option<(RateSpec, usize)>,
    rate: Rate,
    ceil: Rate,
    prio: u8,
    weight: Option<u32>,
    horizon: Duration,
    aqm: Option<Aqm>,
    isolation: Isolation,
    marking: Marking,
    children: Vec<usize>,
}

/// Each class's position in `classes`, by name (names are unique by then): for the lookups
/// of parents and of rules' classes, one per class or rule.
fn positions(classes: &[ClassDraft]) -> HashMap<&str, usize> {
    classes.iter().enumerate().map(|(i, c)| (c.name.as_str(), i)).collect()
}

/// Checks the raw configuration and builds the public one.
pub(super) struct Validator<'a> {
    pub(super) path: &'a Path,
    pub(super) lines: LineIndex,
}

impl Validator<'_> {
    /// 1-based line of a spanned value.
    fn line<T>(&self, value: &Spanned<T>) -> usize {
        self.lines.line(value.span().start)
    }

    /// A [`ConfigError::Invalid`] at `line` about `key`.
    fn error(&self, line: usize, key: impl Into<String>, problem: impl Into<Problem>) -> ConfigError {
        let problem = problem.into();
        ConfigError::Invalid {
            path: self.path.to_owned(),
            line,
            key: key.into(),
            problem: problem.text,
            source: problem.source,
        }
    }

    /// Runs `check` on a spanned value, naming `key` and the value's line on failure.
    fn check<T, U>(
        &self,
        key: &str,
        value: &Spanned<T>,
        check: impl FnOnce(&T) -> Result<U, Problem>,
    ) -> Result<U, ConfigError> {
        check(value.get_ref()).map_err(|problem| self.error(self.line(value), key, problem))
    }

    /// A required value: its key and its table's header line on absence, with `hint`.
    fn required<'v, T>(
        &self,
        value: Option<&'v Spanned<T>>,
        key: &str,
        table_line: usize,
        hint: &str,
    ) -> Result<&'v Spanned<T>, ConfigError> {
        value.ok_or_else(|| self.error(table_line, key, format!("missing; {hint}")))
    }

    /// Runs every check, in order, and builds the configuration.
    pub(super) fn validate(&self, raw: &RawConfig) -> Result<Config, ConfigError> {
        let daemon = self.daemon(raw.daemon.as_ref())?;
        let interfaces = self.interfaces(&raw.interface)?;
        let mut classes = self.classes(&raw.class, &interfaces)?;
        self.link_parents(&mut classes, &interfaces)?;
        self.resolve_rates(&mut classes, &interfaces)?;
        self.check_sums(&classes, &interfaces)?;
        self.check_defaults(&classes, &interfaces)?;
        let rules = self.rules(&raw.rule, &classes)?;
        Ok(Config {
            path: self.path.to_owned(),
            text: String::new(),
            daemon,
            interfaces: interfaces
                .iter()
                .map(|i| Interface {
                    name: i.name.clone(),
                    rate: i.rate,
                    default_class: i.default.get_ref().clone(),
                    overhead: i.overhead,
                    mpu: i.mpu,
                    linklayer: i.linklayer,
                    replace_qdisc: i.replace_qdisc,
                    direction: i.direction,
                    lan: i.lan.clone(),
                })
                .collect(),
            classes: classes
                .iter()
                .map(|c| Class {
                    name: c.name.clone(),
                    interface: interfaces[c.interface].name.clone(),
                    parent: c.parent.map(|p| classes[p].name.clone()),
                    rate: c.rate,
                    ceil: c.ceil,
                    prio: c.prio,
                    weight: c.weight,
                    horizon: c.horizon,
                    aqm: c.aqm,
                    isolation: c.isolation,
                    marking: c.marking,
                    line: c.line,
                })
                .collect(),
            rules,
        })
    }
}
