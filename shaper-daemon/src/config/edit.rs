//! Changes to one key of a class, made in the configuration's TOML text so that everything
//! else in the file (comments, layout, key order) stays as the admin wrote it.
//!
//! The daemon applies a runtime change (`shaperctl set-rate`...) to the text it runs from and
//! validates the result as a whole file ([`super::Config::parse`]), so a change is held to
//! exactly the rules a file is; `shaperctl --save` makes the same edit to the file on disk.

use std::{fs, io::Write as _, path::Path};

use toml_edit::{DocumentMut, Item, Value};

use super::{Config, ConfigError};

/// A key of a `[[class]]` table that can be changed at run time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ClassKey {
    Rate,
    Ceil,
    Prio,
}

impl ClassKey {
    /// The key as it is spelled in the file.
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            ClassKey::Rate => "rate",
            ClassKey::Ceil => "ceil",
            ClassKey::Prio => "prio",
        }
    }
}

/// Why an edit could not be made.
#[derive(Debug, thiserror::Error)]
pub enum EditError {
    #[error("{}: not valid TOML", .path.display())]
    Syntax {
        path: std::path::PathBuf,
        #[source]
        source: Box<toml_edit::TomlError>,
    },
    #[error("{}: no class named `{class}`; classes: {}", .path.display(), .known.join(", "))]
    UnknownClass { path: std::path::PathBuf, class: String, known: Vec<String> },
    #[error("{}: with {}", .source.path().display(), .change)]
    Invalid {
        change: String,
        #[source]
        source: Box<ConfigError>,
    },
    #[error("{}: {action}", .path.display())]
    Io {
        path: std::path::PathBuf,
        action: &'static str,
        #[source]
        source: std::io::Error,
    },
}

/// The new value of a [`ClassKey`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NewValue {
    /// A rate in tc's spelling, e.g. `2mbit`.
    Rate(String),
    Prio(u8),
}

impl NewValue {
    fn to_toml(&self) -> Value {
        match self {
            NewValue::Rate(r) => Value::from(r.as_str()),
            NewValue::Prio(p) => Value::from(i64::from(*p)),
        }
    }
}

impl std::fmt::Display for NewValue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NewValue::Rate(r) => write!(f, "\"{r}\""),
            NewValue::Prio(p) => write!(f, "{p}"),
        }
    }
}

/// Sets `key` of class `class` to `value` in configuration `text` (read from `path`), and
/// validates the result. Returns the new text and the configuration it describes; `text` is
/// not changed when anything is wrong.
pub fn set_class_key(
    text: &str,
    path: &Path,
    class: &str,
    key: ClassKey,
    value: &NewValue,
) -> Result<(String, Config), EditError> {
    let mut doc: DocumentMut =
        text.parse().map_err(|source| EditError::Syntax { path: path.to_owned(), source: Box::new(source) })?;
    let unknown = |doc: &DocumentMut| EditError::UnknownClass {
        path: path.to_owned(),
        class: class.to_owned(),
        known: class_names(doc),
    };
    let Some(classes) = doc.get_mut("class").and_then(Item::as_array_of_tables_mut) else {
        return Err(unknown(&doc));
    };
    let Some(table) = classes.iter_mut().find(|t| t.get("name").and_then(Item::as_str) == Some(class)) else {
        return Err(unknown(&doc));
    };
    let mut new = value.to_toml();
    if let Some(old) = table.get(key.name()).and_then(Item::as_value) {
        // Keep the comment after the value and the spacing around it.
        *new.decor_mut() = old.decor().clone();
    }
    table.insert(key.name(), Item::Value(new));
    let text = doc.to_string();
    let config = Config::parse(&text, path).map_err(|source| EditError::Invalid {
        change: format!("class `{class}` {} = {value}", key.name()),
        source: Box::new(source),
    })?;
    Ok((text, config))
}

fn class_names(doc: &DocumentMut) -> Vec<String> {
    doc.get("class")
        .and_then(Item::as_array_of_tables)
        .map(|a| a.iter().filter_map(|t| t.get("name").and_then(Item::as_str)).map(str::to_owned).collect())
        .unwrap_or_default()
}

/// The configuration file at `path` as it is on disk, with one key of a class changed: the
/// new text (comments and layout kept) and the configuration it makes, validated as a whole.
/// Nothing is written; see [`write_file`].
pub fn edit_file(path: &Path, class: &str, key: ClassKey, value: &NewValue) -> Result<(String, Config), EditError> {
    let text = fs::read_to_string(path).map_err(|source| EditError::Io {
        path: path.to_owned(),
        action: "reading the configuration",
        source,
    })?;
    set_class_key(&text, path, class, key, value)
}

/// Replaces the file at `path` with `text` atomically (a file written and synced beside it,
/// then renamed over it), keeping the file's permissions.
pub fn write_file(path: &Path, text: &str) -> Result<(), EditError> {
    let io = |action, source| EditError::Io { path: path.to_owned(), action, source };
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let permissions = fs::metadata(path).map_err(|e| io("reading the file's permissions", e))?.permissions();
    let mut tmp = tempfile::NamedTempFile::new_in(dir).map_err(|e| io("creating a temporary file beside it", e))?;
    tmp.write_all(text.as_bytes()).map_err(|e| io("writing the temporary file", e))?;
    tmp.as_file().sync_all().map_err(|e| io("syncing the temporary file", e))?;
    fs::set_permissions(tmp.path(), permissions).map_err(|e| io("setting the temporary file's permissions", e))?;
    tmp.persist(path).map_err(|e| io("replacing the file", e.error))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = r#"# The house link.
[[interface]]
name = "lan0"
rate = "10mbit"   # what the ISP sells
default = "guest"

[[class]]
name = "alex"
rate = "1.9mbit"  # alex's share
ceil = "10mbit"

[[class]]
name = "guest"
rate = "0.3mbit"
"#;

    fn set(class: &str, key: ClassKey, value: &NewValue) -> Result<(String, Config), EditError> {
        set_class_key(TEXT, Path::new("house.toml"), class, key, value)
    }

    #[test]
    fn changes_one_value_and_keeps_comments_and_layout() {
        let (text, config) = set("alex", ClassKey::Rate, &NewValue::Rate("2mbit".into())).unwrap();
        assert_eq!(text, TEXT.replace(r#"rate = "1.9mbit"  # alex's share"#, r#"rate = "2mbit"  # alex's share"#));
        assert_eq!(config.class("alex").unwrap().rate.bits_per_sec(), 2_000_000);
        let (text, config) = set("guest", ClassKey::Prio, &NewValue::Prio(0)).unwrap();
        assert!(text.ends_with("rate = \"0.3mbit\"\nprio = 0\n"), "{text}");
        assert_eq!(config.class("guest").unwrap().prio, 0);
    }

    #[test]
    fn refuses_what_a_file_could_not_say() {
        let e = set("alex", ClassKey::Rate, &NewValue::Rate("20mbit".into())).unwrap_err();
        let text = format!("{e:#}");
        assert!(matches!(e, EditError::Invalid { .. }), "{e:?}");
        assert!(text.contains("class `alex` rate = \"20mbit\""), "{text}");
        let EditError::Invalid { source, .. } = e else { unreachable!() };
        assert_eq!(source.key(), Some("class[0].ceil"), "{source}");
        let e = set("nobody", ClassKey::Ceil, &NewValue::Rate("1mbit".into())).unwrap_err();
        assert_eq!(e.to_string(), "house.toml: no class named `nobody`; classes: alex, guest");
        let e = set("alex", ClassKey::Ceil, &NewValue::Rate("1kbit".into())).unwrap_err();
        assert!(matches!(e, EditError::Invalid { .. }), "{e:?}");
    }

    #[test]
    fn saving_replaces_the_file_with_the_same_permissions() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("house.toml");
        fs::write(&path, TEXT).unwrap();
        fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
        let (text, _) = edit_file(&path, "alex", ClassKey::Ceil, &NewValue::Rate("8mbit".into())).unwrap();
        write_file(&path, &text).unwrap();
        let text = fs::read_to_string(&path).unwrap();
        assert!(text.contains("ceil = \"8mbit\"\n") && text.starts_with("# The house link."), "{text}");
        assert_eq!(fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640);
        // A change the file cannot take is refused before anything is written.
        edit_file(&path, "alex", ClassKey::Rate, &NewValue::Rate("9mbit".into())).unwrap_err();
        assert_eq!(fs::read_to_string(&path).unwrap(), text);
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left behind");
    }
}
