//! The checks of the `[daemon]` table.

use std::path::PathBuf;

use super::Validator;
use crate::config::error::{ConfigError, Problem};
use crate::config::model::{DaemonSettings, TICK_RANGE};
use crate::config::raw::RawDaemon;
use crate::config::values::duration_in;

/// Longest unix socket path (`sun_path` less the terminating NUL).
const MAX_SOCKET_PATH_LEN: usize = 107;

impl Validator<'_> {
    /// The `[daemon]` settings: the file's, or the defaults where it sets none.
    pub(super) fn daemon(&self, raw: Option<&RawDaemon>) -> Result<DaemonSettings, ConfigError> {
        let mut settings = DaemonSettings::default();
        let Some(raw) = raw else {
            return Ok(settings);
        };
        if let Some(socket) = &raw.socket {
            let path = self.check("daemon.socket", socket, |path| {
                if path.is_empty() || path.contains('\0') {
                    Err(Problem::new(format!(
                        "invalid socket path {path:?}; expected a file path, e.g. \"/run/shaper/shaper.sock\""
                    )))
                } else if path.len() > MAX_SOCKET_PATH_LEN {
                    Err(Problem::new(format!(
                        "socket path is {} bytes long; a unix socket path has at most {MAX_SOCKET_PATH_LEN} bytes",
                        path.len()
                    )))
                } else {
                    Ok(PathBuf::from(path))
                }
            })?;
            settings.socket = Some(path);
        }
        if let Some(tick) = &raw.tick {
            settings.tick = self.check("daemon.tick", tick, |v| duration_in(v, "tick", &TICK_RANGE, "10ms"))?;
        }
        if let Some(listen) = &raw.metrics_listen {
            settings.metrics_listen = self.check("daemon.metrics_listen", listen, |text| {
                if text.is_empty() {
                    return Ok(None);
                }
                text.parse().map(Some).map_err(|_| {
                    Problem::new(format!(
                        "invalid address {text:?}; expected an address and a port, e.g. \"127.0.0.1:9640\" or \"[::1]:9640\", or \"\" to turn the endpoint off"
                    ))
                })
            })?;
        }
        Ok(settings)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use crate::config::test_util::{fails_at, ok, GUEST, IFACE};
    use crate::config::{Direction, Isolation};

    #[test]
    fn bad_durations() {
        let with_tick = |tick: &str| format!("[daemon]\ntick = {tick}\n{IFACE}{GUEST}");
        fails_at(&with_tick("\"10\""), "tick", "daemon.tick", &["no unit", "10ms"]);
        fails_at(&with_tick("10"), "tick", "daemon.tick", &["no unit", "\"10ms\""]);
        fails_at(&with_tick("\"10 parsecs\""), "tick", "daemon.tick", &["unknown unit \"parsecs\"", "ms"]);
        fails_at(&with_tick("\"fast\""), "tick", "daemon.tick", &["invalid duration", "10ms"]);
        fails_at(&with_tick("\"-5ms\""), "tick", "daemon.tick", &["invalid duration"]);
        fails_at(&with_tick("\"0ms\""), "tick", "daemon.tick", &["out of range", "1ms..=1s"]);
        fails_at(&with_tick("\"2s\""), "tick", "daemon.tick", &["out of range", "1ms..=1s"]);
        fails_at(&with_tick("\"0.5ns\""), "tick", "daemon.tick", &["whole number of nanoseconds"]);
        fails_at(&with_tick("\"99999999999999999999s\""), "tick", "daemon.tick", &["too long"]);
        assert_eq!(ok(&with_tick("\"1s\"")).daemon.tick, Duration::from_secs(1));
        assert_eq!(ok(&with_tick("\"1500us\"")).daemon.tick, Duration::from_micros(1500));
        fails_at(&with_tick("\"250µs\""), "tick", "daemon.tick", &["out of range"]);

        let with_isolation = |i: &str| format!("{IFACE}{GUEST}isolation = {i}\n");
        assert_eq!(ok(&with_isolation("\"flow\"")).classes[0].isolation, Isolation::Flow);
        assert_eq!(ok(&with_isolation("\"none\"")).classes[0].isolation, Isolation::None);
        fails_at(
            &with_isolation("\"fair\""),
            "isolation",
            "class[0].isolation",
            &["\"fair\"", "\"host\"", "\"flow\"", "\"none\""],
        );
        let with_direction = |d: &str| format!("{IFACE}direction = {d}\n{GUEST}");
        assert_eq!(ok(&with_direction("\"download\"")).interfaces[0].direction, Direction::Download);
        fails_at(
            &with_direction("\"sideways\""),
            "direction",
            "interface[0].direction",
            &["\"upload\"", "\"download\""],
        );

        let with_horizon = |h: &str| format!("{IFACE}{GUEST}horizon = {h}\n");
        fails_at(&with_horizon("\"20s\""), "horizon", "class[0].horizon", &["out of range", "1ms..=10s"]);
        fails_at(&with_horizon("\"500us\""), "horizon", "class[0].horizon", &["out of range"]);
        fails_at(&with_horizon("2"), "horizon", "class[0].horizon", &["no unit", "\"2s\""]);
        assert_eq!(ok(&with_horizon("\"10s\"")).classes[0].horizon, Duration::from_secs(10));
        assert_eq!(ok(&with_horizon("\"1.5s\"")).classes[0].horizon, Duration::from_millis(1500));
    }

    #[test]
    fn bad_socket() {
        let text = format!("[daemon]\nsocket = \"\"\n{IFACE}{GUEST}");
        fails_at(&text, "socket", "daemon.socket", &["invalid socket path"]);
        let long = "/x".repeat(60);
        let text = format!("[daemon]\nsocket = \"{long}\"\n{IFACE}{GUEST}");
        fails_at(&text, "socket", "daemon.socket", &["120 bytes", "at most 107"]);
    }

    #[test]
    fn metrics_listen_is_an_address_or_off() {
        let text = format!("[daemon]\nmetrics_listen = \"localhost\"\n{IFACE}{GUEST}");
        fails_at(
            &text,
            "metrics_listen",
            "daemon.metrics_listen",
            &["invalid address \"localhost\"", "127.0.0.1:9640"],
        );
        let config = ok(&format!("[daemon]\nmetrics_listen = \"\"\n{IFACE}{GUEST}"));
        assert_eq!(config.daemon.metrics_listen, None);
        let config = ok(&format!("[daemon]\nmetrics_listen = \"[::1]:9100\"\n{IFACE}{GUEST}"));
        assert_eq!(config.daemon.metrics_listen, Some("[::1]:9100".parse().unwrap()));
    }
}
