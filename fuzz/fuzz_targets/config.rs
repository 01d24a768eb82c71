//! The configuration loader on arbitrary text: a configuration, or an error that names the file
//! and a line of the text (and the key, for an invalid value); never a panic. A configuration
//! it accepts reads the same again, and its rules compile or are refused with an error.
#![no_main]

use std::path::Path;

use libfuzzer_sys::fuzz_target;
use shaper::{
    config::{Config, ConfigError},
    daemon::rule_specs,
    rules,
};

const PATH: &str = "fuzz.toml";

fuzz_target!(|data: &[u8]| {
    // `Config::load` reads the file as UTF-8 (an error naming the file otherwise).
    let Ok(text) = std::str::from_utf8(data) else { return };
    match Config::parse(text, Path::new(PATH)) {
        Ok(config) => {
            let again = Config::parse(&config.text, Path::new(PATH)).expect("an accepted text is accepted again");
            assert_eq!(again, config);
            let ids: Vec<u32> = (0..u32::try_from(config.classes.len()).unwrap()).collect();
            let _ = rules::compile(&rule_specs(&config, &ids));
        }
        Err(e) => {
            let message = e.to_string();
            let line = e.line().unwrap_or_else(|| panic!("no line in {message}"));
            // A missing table or key is reported one past the text's last line.
            assert!((1..=text.lines().count() + 1).contains(&line), "line {line} is not in the text: {message}");
            assert!(message.starts_with(&format!("{PATH}:{line}:")), "{message}");
            if let ConfigError::Invalid { key, .. } = &e {
                assert!(!key.is_empty(), "{message}");
            }
        }
    }
});
