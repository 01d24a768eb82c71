//! Helpers shared by the configuration's unit tests: a small valid file to build on, and
//! assertions on where an error points and what it says.

use std::path::Path;

use super::{Config, ConfigError};

/// The file name the tests parse their text as.
pub(super) const PATH: &str = "test.toml";

/// One interface lan0 at 10mbit whose default is "guest".
pub(super) const IFACE: &str = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "guest"
"#;

/// The guest class of [`IFACE`].
pub(super) const GUEST: &str = r#"
[[class]]
name = "guest"
rate = "1mbit"
"#;

/// A valid configuration: interface lan0 at 10mbit and one 1mbit class per name, the first
/// one the default.
pub(crate) fn with_classes(names: &[&str]) -> Config {
    let text: String =
        names.iter().map(|c| format!("[[class]]\nname = \"{c}\"\nrate = \"1mbit\"\n")).fold(
            format!("[[interface]]\nname = \"lan0\"\nrate = \"10mbit\"\ndefault = \"{}\"\n", names[0]),
            |t, c| t + &c,
        );
    parse(&text).expect("a valid configuration")
}

/// Parses `text` as the file [`PATH`].
pub(super) fn parse(text: &str) -> Result<Config, ConfigError> {
    Config::parse(text, Path::new(PATH))
}

/// Parses `text`, which must be valid.
pub(super) fn ok(text: &str) -> Config {
    parse(text).unwrap_or_else(|e| panic!("should parse: {e}\n{text}"))
}

/// 1-based line of the first occurrence of `needle` (the n-th when `nth > 0`).
pub(super) fn line_of(text: &str, needle: &str, nth: usize) -> usize {
    text.lines()
        .enumerate()
        .filter(|(_, l)| l.contains(needle))
        .nth(nth)
        .unwrap_or_else(|| panic!("{needle:?} not in\n{text}"))
        .0
        + 1
}

/// Asserts that `text` fails with an error at `line` about `key`, whose message
/// contains every one of `needles`; returns the message.
#[track_caller]
pub(super) fn fails(text: &str, line: usize, key: &str, needles: &[&str]) -> String {
    let Err(e) = parse(text) else { panic!("should fail at {key}:\n{text}") };
    let message = e.to_string();
    assert_eq!(e.line(), Some(line), "line of: {message}");
    assert_eq!(e.key(), Some(key), "key of: {message}");
    assert_eq!(e.path(), Path::new(PATH));
    assert!(message.starts_with(&format!("{PATH}:{line}:")), "{message}");
    assert!(message.contains(key), "{message}");
    for needle in needles {
        assert!(message.contains(needle), "{needle:?} not in: {message}");
    }
    message
}

/// Like [`fails`], with the line given as the line containing `at`.
#[track_caller]
pub(super) fn fails_at(text: &str, at: &str, key: &str, needles: &[&str]) -> String {
    fails(text, line_of(text, at, 0), key, needles)
}
