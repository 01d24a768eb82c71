//! The configuration as serde reads it, before validation, and the position (line, column,
//! key) of what the TOML reader rejects.
//!
//! Values that need checking beyond their TOML type keep their span, so that errors can name
//! their line.

use std::fmt::{self, Write as _};
use std::path::Path;

use serde::de::{self, Deserialize, Deserializer, Visitor};
use toml::Spanned;

use super::error::ConfigError;

/// The whole file.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawConfig {
    pub(super) daemon: Option<RawDaemon>,
    #[serde(default)]
    pub(super) interface: Vec<Spanned<RawInterface>>,
    #[serde(default)]
    pub(super) class: Vec<Spanned<RawClass>>,
    #[serde(default)]
    pub(super) rule: Vec<Spanned<RawRule>>,
}

/// The `[daemon]` table.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawDaemon {
    pub(super) socket: Option<Spanned<String>>,
    pub(super) tick: Option<Spanned<Scalar>>,
    pub(super) metrics_listen: Option<Spanned<String>>,
}

/// One `[[interface]]` table.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawInterface {
    pub(super) name: Option<Spanned<String>>,
    pub(super) rate: Option<Spanned<Scalar>>,
    pub(super) default: Option<Spanned<String>>,
    pub(super) overhead: Option<Spanned<Integer>>,
    pub(super) mpu: Option<Spanned<Integer>>,
    pub(super) linklayer: Option<Spanned<String>>,
    pub(super) replace_qdisc: Option<bool>,
    pub(super) direction: Option<Spanned<String>>,
    pub(super) lan: Option<Spanned<Vec<Spanned<String>>>>,
}

/// One `[[class]]` table.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawClass {
    pub(super) name: Option<Spanned<String>>,
    pub(super) interface: Option<Spanned<String>>,
    pub(super) parent: Option<Spanned<String>>,
    pub(super) rate: Option<Spanned<Scalar>>,
    pub(super) ceil: Option<Spanned<Scalar>>,
    pub(super) prio: Option<Spanned<Integer>>,
    pub(super) weight: Option<Spanned<Integer>>,
    pub(super) horizon: Option<Spanned<Scalar>>,
    pub(super) aqm: Option<Spanned<bool>>,
    pub(super) aqm_target: Option<Spanned<Scalar>>,
    pub(super) aqm_interval: Option<Spanned<Scalar>>,
    pub(super) isolation: Option<Spanned<String>>,
    pub(super) set_dscp: Option<Spanned<Scalar>>,
    pub(super) set_dscp_over: Option<Spanned<Scalar>>,
}

/// One `[[rule]]` table.
#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawRule {
    pub(super) class: Option<Spanned<String>>,
    pub(super) src: Option<Spanned<String>>,
    pub(super) dst: Option<Spanned<String>>,
    pub(super) proto: Option<Spanned<Scalar>>,
    pub(super) sport: Option<Spanned<Scalar>>,
    pub(super) dport: Option<Spanned<Scalar>>,
    pub(super) mark: Option<Spanned<Scalar>>,
    pub(super) dscp: Option<Spanned<Scalar>>,
    pub(super) len: Option<Spanned<Scalar>>,
    pub(super) tcp_flags: Option<Spanned<String>>,
    pub(super) icmp_type: Option<Spanned<Scalar>>,
    pub(super) src_mac: Option<Spanned<String>>,
}

/// A TOML integer or string, for values that may be written either way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Scalar {
    Int(i64),
    Str(String),
}

impl fmt::Display for Scalar {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Scalar::Int(n) => write!(f, "{n}"),
            Scalar::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// A TOML integer, for values checked after reading (so that a range error can say what
/// is valid rather than name a Rust type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Integer(pub(super) i64);

impl<'de> Deserialize<'de> for Integer {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Integer, D::Error> {
        struct IntegerVisitor;

        impl Visitor<'_> for IntegerVisitor {
            type Value = Integer;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an integer (without quotes)")
            }

            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Integer, E> {
                Ok(Integer(v))
            }

            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Integer, E> {
                i64::try_from(v)
                    .map(Integer)
                    .map_err(|source| E::custom(format_args!("integer {v} is too large ({source})")))
            }
        }

        deserializer.deserialize_any(IntegerVisitor)
    }
}

/// Reads a [`Scalar`] from whichever of the two types the value has.
struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = Scalar;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an integer or a string")
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
        Ok(Scalar::Int(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
        i64::try_from(v)
            .map(Scalar::Int)
            .map_err(|source| E::custom(format_args!("integer {v} is too large ({source})")))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
        Ok(Scalar::Str(v.to_owned()))
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<Scalar, E> {
        Ok(Scalar::Str(v))
    }
}

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Scalar, D::Error> {
        deserializer.deserialize_any(ScalarVisitor)
    }
}

/// Byte offsets of line starts, to turn spans into 1-based lines and columns.
pub(super) struct LineIndex {
    starts: Vec<usize>,
}

impl LineIndex {
    /// The line starts of `text`.
    pub(super) fn new(text: &str) -> LineIndex {
        let starts = std::iter::once(0).chain(text.match_indices('\n').map(|(i, _)| i + 1)).collect();
        LineIndex { starts }
    }

    /// 1-based line of byte `offset`.
    pub(super) fn line(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset)
    }

    /// 1-based line and column (in characters) of byte `offset` of `text`.
    fn line_column(&self, text: &str, offset: usize) -> (usize, usize) {
        let line = self.line(offset);
        let start = self.starts[line - 1];
        let column = text.get(start..offset).map_or(offset - start, |s| s.chars().count());
        (line, column + 1)
    }
}

/// Turns a `toml` error into a [`ConfigError::Syntax`] with the line, column and key.
pub(super) fn syntax_error(text: &str, path: &Path, error: toml::de::Error) -> ConfigError {
    let offset = error.span().map_or(0, |span| span.start);
    let (line, column) = LineIndex::new(text).line_column(text, offset);
    let key = error.span().and_then(|span| locate_key(text, span.start));
    let mut message = error.message().trim_end().to_owned();
    if let Some(key @ ("interface" | "class" | "rule")) = key.as_deref() {
        if message.starts_with("invalid type: map") {
            let _ = write!(message, "; write [[{key}]] (one table per {key}, in an array), not [{key}]");
        }
    }
    ConfigError::Syntax { path: path.to_owned(), line, column, key, message, source: Box::new(error) }
}

/// The key path (`class[1].prio`) of the value at byte `offset`, found in the document's
/// span tree: within each table, the entry that starts last at or before `offset` holds it
/// (a table header's body follows it; keys and values come in order).
fn locate_key(text: &str, offset: usize) -> Option<String> {
    let document = toml::de::DeTable::parse(text).ok()?;
    let root = toml::de::DeValue::Table(document.into_inner());
    let mut path = String::new();
    let mut value = &root;
    loop {
        match value {
            toml::de::DeValue::Table(table) => {
                let best = table
                    .iter()
                    .filter_map(|(key, value)| {
                        let mut starts = vec![key.span().start, value.span().start];
                        if let toml::de::DeValue::Array(items) = value.get_ref() {
                            starts.extend(items.iter().map(|item| item.span().start));
                        }
                        let anchor = starts.into_iter().filter(|&s| s <= offset).max()?;
                        Some((anchor, key, value))
                    })
                    .max_by_key(|&(anchor, _, _)| anchor);
                let Some((_, key, next)) = best else {
                    break;
                };
                if !path.is_empty() {
                    path.push('.');
                }
                path.push_str(key.get_ref());
                if key.span().contains(&offset) {
                    // The error is about the key itself (e.g. an unknown one).
                    break;
                }
                value = next.get_ref();
            }
            toml::de::DeValue::Array(items) => {
                let Some((index, item)) = items
                    .iter()
                    .enumerate()
                    .filter(|(_, item)| item.span().start <= offset)
                    .max_by_key(|(_, item)| item.span().start)
                else {
                    break;
                };
                let _ = write!(path, "[{index}]");
                value = item.get_ref();
            }
            _ => break,
        }
    }
    (!path.is_empty()).then_some(path)
}

#[cfg(test)]
mod tests {
    use std::error::Error as StdError;

    use super::*;
    use crate::config::test_util::{fails_at, line_of, parse, GUEST, IFACE, PATH};
    use crate::config::ConfigError;

    #[test]
    fn unknown_key_names_table_and_line() {
        let text = format!("{IFACE}{GUEST}\n[[class]]\nname = \"x\"\nrate = \"1kbit\"\ncolour = \"red\"\n");
        let message = fails_at(&text, "colour", "class[1].colour", &["unknown field `colour`", "`ceil`"]);
        assert!(message.contains(&format!(":{}:1:", line_of(&text, "colour", 0))), "{message}");
        let e = parse(&text).unwrap_err();
        assert!(matches!(e, ConfigError::Syntax { .. }));
        assert!(StdError::source(&e).is_some());
    }

    #[test]
    fn unknown_keys_everywhere() {
        let text = format!("[daemon]\nsockets = \"/x\"\n{IFACE}{GUEST}");
        fails_at(&text, "sockets", "daemon.sockets", &["unknown field"]);
        let text = format!("{IFACE}speed = 5\n{GUEST}");
        fails_at(&text, "speed", "interface[0].speed", &["unknown field"]);
        let text = format!("{IFACE}{GUEST}[[rule]]\nclass = \"guest\"\nport = 80\n");
        fails_at(&text, "port = 80", "rule[0].port", &["unknown field", "dport"]);
        let text = format!("{IFACE}{GUEST}[[classes]]\nname = \"x\"\n");
        fails_at(&text, "[[classes]]", "classes", &["unknown field `classes`"]);
        let text = format!("top = 1\n{IFACE}{GUEST}");
        fails_at(&text, "top = 1", "top", &["unknown field `top`"]);
    }

    #[test]
    fn wrong_types() {
        let text = format!("{IFACE}{GUEST}[[class]]\nname = 5\nrate = \"1mbit\"\n");
        fails_at(&text, "name = 5", "class[1].name", &["invalid type"]);
        let text = format!("{IFACE}replace_qdisc = \"yes\"\n{GUEST}");
        fails_at(&text, "replace_qdisc", "interface[0].replace_qdisc", &["invalid type"]);
        let text = format!("{IFACE}{GUEST}[[rule]]\nclass = \"guest\"\ndport = [1, 2]\n");
        fails_at(&text, "dport", "rule[0].dport", &["an integer or a string"]);
        let text = format!("{IFACE}\n[class]\nname = \"guest\"\nrate = \"1mbit\"\n");
        fails_at(&text, "[class]", "class", &["[[class]]"]);
    }

    #[test]
    fn toml_syntax_error_has_line_and_column() {
        let text = format!("{IFACE}{GUEST}\n[[rule]]\nclass = guest\n");
        let e = parse(&text).unwrap_err();
        let line = line_of(&text, "class = guest", 0);
        assert_eq!(e.line(), Some(line));
        assert!(e.to_string().starts_with(&format!("{PATH}:{line}:9: ")), "{e}");
    }

    #[test]
    fn locate_key_paths() {
        let text = "top = 1\n[daemon]\ntick = \"1ms\"\n[[class]]\nname = \"a\"\n[[class]]\nname = \"b\"\nx = { y = [1, { z = 2 }] }\n";
        let at = |needle: &str| locate_key(text, text.find(needle).unwrap());
        assert_eq!(at("top").as_deref(), Some("top"));
        assert_eq!(at("tick").as_deref(), Some("daemon.tick"));
        assert_eq!(at("\"1ms\"").as_deref(), Some("daemon.tick"));
        assert_eq!(at("name = \"a\"").as_deref(), Some("class[0].name"));
        assert_eq!(at("\"b\"").as_deref(), Some("class[1].name"));
        assert_eq!(at("z = 2").as_deref(), Some("class[1].x.y[1].z"));
        assert_eq!(locate_key("not toml [", 3), None);
    }
}
