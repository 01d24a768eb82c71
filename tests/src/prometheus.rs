//! A real Prometheus server on loopback, for tests that check what Prometheus makes of a
//! `/metrics` endpoint (that it parses the exposition, that `rate()` gives the expected figure),
//! which no amount of string matching on the exposition proves.
//!
//! [`Prometheus::start`] writes a configuration with one scrape target into a temporary
//! directory, starts `/usr/bin/prometheus` (Debian package `prometheus`, installed by
//! `cargo xtask setup`) listening on a free port of 127.0.0.1, and waits until it is ready.
//! Dropping the value kills the server and removes the directory (configuration, TSDB, log).
//!
//! Its HTTP API is spoken with plain HTTP/1.0 over a std `TcpStream`: one request per
//! connection and a body that ends when the server closes, so no client crate is needed.

use std::{
    fmt::Write as _,
    fs,
    io::{Read as _, Write as _},
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    path::PathBuf,
    process::{Child, Command, Stdio},
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;

/// The server binary, as Debian installs it.
pub const PROMETHEUS: &str = "/usr/bin/prometheus";
/// How long [`Prometheus::start`] waits for `/-/ready`.
pub const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// Time one API request may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// A Prometheus server scraping one target; killed, and its files removed, on drop.
pub struct Prometheus {
    child: Child,
    addr: SocketAddr,
    log: PathBuf,
    // Dropped after `child` is killed (see `Drop`), so the TSDB is not removed under a live server.
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts a server that scrapes `http://{target}/metrics` every `scrape_interval` and waits
    /// until it is ready. `target` is `host:port`, e.g. `"127.0.0.1:9640"`.
    ///
    /// Panics, with the server's log, if the binary is missing or the server does not get ready.
    #[must_use]
    pub fn start(target: &str, scrape_interval: Duration) -> Self {
        assert!(
            fs::metadata(PROMETHEUS).is_ok(),
            "{PROMETHEUS} is missing: this test scrapes with a real Prometheus server; run `cargo xtask setup` \
             (it installs the Debian package `prometheus`)"
        );
        let dir = tempfile::Builder::new().prefix("shaper-prometheus-").tempdir().expect("creating a temp dir");
        let config = dir.path().join("prometheus.yml");
        let interval = format!("{}ms", scrape_interval.as_millis().max(1));
        // The scrape timeout defaults to 10 s, which Prometheus refuses when it exceeds the interval.
        let yaml = format!(
            "global:\n  scrape_interval: {interval}\n  scrape_timeout: {interval}\n  evaluation_interval: {interval}\n\
             scrape_configs:\n  - job_name: shaper\n    static_configs:\n      - targets: [\"{target}\"]\n"
        );
        fs::write(&config, yaml).unwrap_or_else(|e| panic!("writing {}: {e}", config.display()));

        let addr = free_port();
        let log = dir.path().join("prometheus.log");
        let log_file = fs::File::create(&log).unwrap_or_else(|e| panic!("creating {}: {e}", log.display()));
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(log_file.try_clone().expect("duplicating the log file"))
            .stderr(log_file)
            .spawn()
            .unwrap_or_else(|e| panic!("starting {PROMETHEUS}: {e}"));
        let mut prometheus = Self { child, addr, log, dir };
        prometheus.wait_ready();
        prometheus
    }

    /// Where the server listens.
    #[must_use]
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The temporary directory holding the configuration, the TSDB and the server's log.
    #[must_use]
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// The server's log so far, for failure messages.
    #[must_use]
    pub fn log(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_else(|e| format!("(cannot read {}: {e})", self.log.display()))
    }

    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(status) = self.child.try_wait().expect("polling prometheus") {
                panic!("prometheus exited before getting ready ({status}):\n{}", self.log());
            }
            if matches!(get(self.addr, "/-/ready"), Ok((200, _))) {
                return;
            }
            assert!(Instant::now() < deadline, "prometheus not ready after {READY_TIMEOUT:?}:\n{}", self.log());
            sleep(Duration::from_millis(100));
        }
    }

    /// Evaluates `promql` now (`/api/v1/query`) and returns `data.result`: for an instant
    /// vector, an array of `{"metric": {labels}, "value": [time, "value"]}`.
    ///
    /// Panics with the answer if the server refuses the query.
    #[must_use]
    pub fn query(&self, promql: &str) -> Value {
        let path = format!("/api/v1/query?query={}", url_encode(promql));
        let json = self.api(&path);
        json["data"]["result"].clone()
    }

    /// Waits until the server has scraped its target successfully (every active target's
    /// health is `up`). Panics after `timeout` with the targets' state, which carries the
    /// last scrape error.
    pub fn wait_for_targets_up(&self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        loop {
            let targets = self.api("/api/v1/targets");
            let active = targets["data"]["activeTargets"].as_array().cloned().unwrap_or_default();
            if !active.is_empty() && active.iter().all(|t| t["health"] == "up") {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "targets not up after {timeout:?}: {:#}\nprometheus log:\n{}",
                targets["data"]["activeTargets"],
                self.log()
            );
            sleep(Duration::from_millis(200));
        }
    }

    /// GETs an API path and returns the JSON answer, panicking unless it is a success.
    fn api(&self, path: &str) -> Value {
        let (status, body) = get(self.addr, path).unwrap_or_else(|e| panic!("GET {path} from prometheus: {e}"));
        let json: Value =
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: {status}, not JSON ({e}): {body}"));
        assert!(status == 200 && json["status"] == "success", "GET {path}: {status}: {body}");
        json
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        // `dir` is removed when the fields are dropped, after this.
    }
}

/// A port of 127.0.0.1 that was free a moment ago. Prometheus takes its listen address on the
/// command line, so the port is chosen here; another process taking it in between would make
/// the server fail to start, with the reason in its log.
fn free_port() -> SocketAddr {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("binding 127.0.0.1:0");
    listener.local_addr().expect("local address")
}

/// One HTTP/1.0 GET: the status code and the body.
fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, REQUEST_TIMEOUT)?;
    stream.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    stream.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer)?;
    let answer = String::from_utf8_lossy(&answer);
    let bad = || std::io::Error::new(std::io::ErrorKind::InvalidData, format!("not an HTTP answer: {answer:?}"));
    let (head, body) = answer.split_once("\r\n\r\n").ok_or_else(bad)?;
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(bad)?;
    Ok((status, body.to_owned()))
}

/// Percent-encodes a query parameter: everything but RFC 3986's unreserved characters.
fn url_encode(s: &str) -> String {
    let mut out = String::with_capacity(s.len() * 3);
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            write!(out, "%{b:02X}").expect("writing into a String");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::url_encode;

    #[test]
    fn url_encoding() {
        assert_eq!(url_encode(r#"rate(x_total{a="b c"}[5s])"#), "rate%28x_total%7Ba%3D%22b%20c%22%7D%5B5s%5D%29");
        assert_eq!(url_encode("é"), "%C3%A9");
    }
}
