//! [`ConfigError`], the error of loading a configuration, and `Problem`, what the check of
//! one value finds wrong before the validator adds the file, the line and the key.

use std::error::Error as StdError;
use std::fmt;
use std::path::{Path, PathBuf};

/// Why a configuration could not be loaded. Every variant names the file; all but
/// [`ConfigError::Read`] name the line and, where it is known, the key.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// The file could not be read.
    #[error("{}: cannot read the configuration file: {source}", .path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// What the operating system said.
        #[source]
        source: std::io::Error,
    },
    /// The text is not valid TOML, or does not have the configuration's shape (unknown key,
    /// value of the wrong type).
    #[error("{}:{line}:{column}: {}{message}", .path.display(), KeyPrefix(.key.as_deref()))]
    Syntax {
        /// The file.
        path: PathBuf,
        /// 1-based line of the error.
        line: usize,
        /// 1-based column (in characters) of the error.
        column: usize,
        /// Key at the error, e.g. `class[1].colour`, when it could be found.
        key: Option<String>,
        /// What is wrong (the parser's message, with a hint where one helps).
        message: String,
        /// The parser's error, which also shows the offending line.
        #[source]
        source: Box<toml::de::Error>,
    },
    /// A value, or a combination of values, is invalid.
    #[error("{}:{line}: {key}: {problem}", .path.display())]
    Invalid {
        /// The file.
        path: PathBuf,
        /// 1-based line of the offending value (or of its table's header when the value is
        /// missing).
        line: usize,
        /// Key of the offending value, e.g. `class[2].ceil` or `rule[0].dport`.
        key: String,
        /// What is wrong and what would be valid.
        problem: String,
        /// The underlying parse error, if any (e.g. a rate's or an address's).
        #[source]
        source: Option<Box<dyn StdError + Send + Sync + 'static>>,
    },
}

impl ConfigError {
    /// The configuration file the error is about.
    #[must_use]
    pub fn path(&self) -> &Path {
        match self {
            ConfigError::Read { path, .. } | ConfigError::Syntax { path, .. } | ConfigError::Invalid { path, .. } => {
                path
            }
        }
    }

    /// The 1-based line the error is about, if it is about one.
    #[must_use]
    pub fn line(&self) -> Option<usize> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Syntax { line, .. } | ConfigError::Invalid { line, .. } => Some(*line),
        }
    }

    /// The key the error is about (e.g. `class[2].ceil`), if known.
    #[must_use]
    pub fn key(&self) -> Option<&str> {
        match self {
            ConfigError::Read { .. } => None,
            ConfigError::Syntax { key, .. } => key.as_deref(),
            ConfigError::Invalid { key, .. } => Some(key),
        }
    }
}

/// Prints `"key: "` when there is a key, nothing otherwise.
struct KeyPrefix<'a>(Option<&'a str>);

impl fmt::Display for KeyPrefix<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(key) => write!(f, "{key}: "),
            None => Ok(()),
        }
    }
}

/// What is wrong with a value: a message that says what would be valid, and the parse
/// error behind it, if any.
pub(super) struct Problem {
    pub(super) text: String,
    pub(super) source: Option<Box<dyn StdError + Send + Sync + 'static>>,
}

impl Problem {
    /// A problem described by `text`, with no error behind it.
    pub(super) fn new(text: impl Into<String>) -> Problem {
        Problem { text: text.into(), source: None }
    }

    /// A problem whose message is `source`'s, itself kept as the source.
    pub(super) fn from_error(source: impl StdError + Send + Sync + 'static) -> Problem {
        Problem { text: source.to_string(), source: Some(Box::new(source)) }
    }

    /// The same problem, with `source` kept as the error behind it.
    pub(super) fn with_source(mut self, source: impl StdError + Send + Sync + 'static) -> Problem {
        self.source = Some(Box::new(source));
        self
    }
}

impl From<String> for Problem {
    fn from(text: String) -> Problem {
        Problem::new(text)
    }
}

impl From<&str> for Problem {
    fn from(text: &str) -> Problem {
        Problem::new(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::test_util::{line_of, parse, GUEST, IFACE, PATH};

    #[test]
    fn error_accessors_and_display() {
        let text = format!("{IFACE}{GUEST}prio = 9\n");
        let e = parse(&text).unwrap_err();
        assert!(matches!(e, ConfigError::Invalid { .. }));
        let line = line_of(&text, "prio", 0);
        assert_eq!(
            e.to_string(),
            format!("{PATH}:{line}: class[0].prio: prio 9 is out of range; expected 0..=7 (lower is served first)")
        );
        assert!(StdError::source(&e).is_none());
    }
}
