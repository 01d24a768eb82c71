//! The control protocol between `shaperctl` and `shaperd`, over a Unix stream socket.
//!
//! # Protocol
//! A client sends one request per line, a JSON object; the daemon answers each with one line,
//! a JSON object, in order. A connection may carry many requests. Rates in replies are
//! integers in bits per second; in requests a rate is either such an integer or a string in
//! tc's spelling (`"2mbit"`).
//!
//! ```text
//! → {"cmd":"status"}
//! ← {"Ok":{"status":{"config":"/etc/shaper/shaper.toml","generation":2,
//!     "unsaved":["class alex: prio 1 -> 0"],"classes":[
//!     {"name":"alex","interface":"lan0","parent":null,"leaf":true,"rate":1900000,
//!      "ceil":10000000,"prio":1,"pacing_rate":3960000,"allocation":3880000,
//!      "throughput":3950000,"limited":true,"bytes":48211040,"packets":31843,"drops":12,
//!      "drops_horizon":0,"drops_horizon_bytes":0,"drops_aqm":12,"drops_aqm_bytes":18168,
//!      "drops_share":0,"drops_share_bytes":0,"share":3960000,"ecn_marks":220,
//!      "sparse_packets":41,"delayed_packets":30012,"mean_delay_us":4100,"p99_delay_us":16000,
//!      "delay_buckets":[1831,412,807,1950,6120,11022,7400,2301,0,0,0,0,0,0,0,0],
//!      "delay_ns_total":123049200000}]}}}
//! → {"cmd":"set-rate","class":"alex","rate":"2mbit"}
//! ← {"Ok":{"changed":{"generation":3,"changes":["class alex: rate 1.9mbit -> 2mbit"]}}}
//! → {"cmd":"set-rate","class":"nobody","rate":"2mbit"}
//! ← {"Err":{"kind":"unknown-class","message":"/etc/shaper/shaper.toml: no class named `nobody`; classes: alex, betty"}}
//! → {"cmd":"set-ceil","class":"alex","ceil":8000000,"save":true}
//! ← {"Ok":{"changed":{"generation":4,"changes":["class alex: ceil 10mbit -> 8mbit"],"saved":"/etc/shaper/shaper.toml"}}}
//! → {"cmd":"set-prio","class":"alex","prio":0}
//! ← {"Ok":{"changed":{"generation":5,"changes":["class alex: prio 1 -> 0"]}}}
//! → {"cmd":"reload"}
//! ← {"Ok":{"changed":{"generation":6,"changes":["class carl: added (rate 1mbit, ceil 10mbit, prio 0)"]}}}
//! ```
//!
//! (A message is one line on the socket; the status reply is folded here. The unit test
//! `protocol_examples_are_what_the_types_read_and_write` checks every example above.)
//!
//! | `cmd` | fields | does |
//! |---|---|---|
//! | `status` | | every class: configuration, allocation, throughput, counters |
//! | `set-rate` | `class`, `rate`, `save` | changes a class's guaranteed rate |
//! | `set-ceil` | `class`, `ceil`, `save` | changes a class's ceiling |
//! | `set-prio` | `class`, `prio`, `save` | changes a class's priority (0-7, lower first) |
//! | `reload` | | re-reads the configuration file (as SIGHUP does) |
//!
//! A change is made to the configuration's text and the result is validated as a whole file
//! would be (children's rates within the parent's, ceil at least rate...), then applied to
//! the datapath at once: nothing is applied when anything is wrong. Every applied change
//! increments the configuration *generation*. With `"save":true` shaperd also writes the
//! change into the configuration file (the file as it is on disk, with that one key changed,
//! comments and permissions kept, replaced atomically); the file's change is validated before
//! anything is applied, and a write that fails after the change was applied is an error of
//! kind `not-saved`. `status` lists the changes not saved (`unsaved`).
//!
//! A reply is `Result<Response, ApiError>` as serde writes it (`{"Ok": …}` or `{"Err": …}`).
//! A line longer than [`MAX_LINE`] bytes, or that is not a request, gets an `Err` reply of
//! kind `bad-request` and the connection is closed.
//!
//! The server takes at most [`MAX_CONNECTIONS`] connections at once and gives each request
//! [`REQUEST_TIMEOUT`]; the socket is created with mode 0660, group [`SOCKET_GROUP`] when that
//! group exists.

use std::{
    fmt,
    future::Future,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::Arc,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{UnixListener, UnixStream},
    sync::Semaphore,
};
use tracing::{debug, warn};

use crate::rate::Rate;

/// Where `shaperd` listens unless told otherwise.
pub const DEFAULT_SOCKET: &str = "/run/shaper/shaper.sock";
/// Environment variable that overrides the socket path for `shaperctl`.
pub const SOCKET_ENV: &str = "SHAPER_SOCKET";
/// The group that may use the socket, when it exists (the socket is then `root:shaper`,
/// mode 0660; see contrib/shaper.sysusers.conf).
pub const SOCKET_GROUP: &str = "shaper";
/// Longest request line accepted.
pub const MAX_LINE: usize = 64 * 1024;
/// Connections served at once; more wait for a free place.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a request may take, from its first byte to its reply.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A request from `shaperctl`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "kebab-case", deny_unknown_fields)]
pub enum Request {
    /// Every class with its configuration, current rate and counters. (A struct variant, so
    /// that unknown fields are refused as for the others.)
    Status {},
    /// Sets a class's guaranteed rate; with `save`, also in the configuration file.
    SetRate {
        class: String,
        rate: Rate,
        #[serde(default, skip_serializing_if = "is_false")]
        save: bool,
    },
    /// Sets a class's ceiling; with `save`, also in the configuration file.
    SetCeil {
        class: String,
        ceil: Rate,
        #[serde(default, skip_serializing_if = "is_false")]
        save: bool,
    },
    /// Sets a class's priority; with `save`, also in the configuration file.
    SetPrio {
        class: String,
        prio: u8,
        #[serde(default, skip_serializing_if = "is_false")]
        save: bool,
    },
    /// Re-reads the configuration file.
    Reload {},
}

/// A successful answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Response {
    Status(Status),
    /// A change was applied: the new configuration generation and what changed; `saved`:
    /// the file it was also written into.
    Changed {
        generation: u64,
        changes: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        saved: Option<PathBuf>,
    },
}

#[expect(clippy::trivially_copy_pass_by_ref, reason = "serde's skip_serializing_if passes a reference")]
fn is_false(b: &bool) -> bool {
    !b
}

/// What `status` reports.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Status {
    /// The configuration file the daemon runs from.
    pub config: PathBuf,
    /// Incremented by every applied change (runtime change or reload).
    pub generation: u64,
    /// What the running configuration changes from the file as shaperd last read or wrote it
    /// (runtime changes made without `save`), one line per change; lost on a reload.
    #[serde(default)]
    pub unsaved: Vec<String>,
    pub classes: Vec<ClassStatus>,
}

/// One class in a `status` reply. Rates in bits per second, counters since the datapath
/// was loaded.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClassStatus {
    pub name: String,
    pub interface: String,
    pub parent: Option<String>,
    /// Only leaf classes carry traffic.
    pub leaf: bool,
    /// Configured guaranteed rate.
    pub rate: Rate,
    pub ceil: Rate,
    pub prio: u8,
    /// The rate the datapath paces the class at now (0 for inner classes, which carry no
    /// packets of their own).
    pub pacing_rate: Rate,
    /// The allocator's share for the class (for an inner class, its children's sum).
    pub allocation: Rate,
    /// Offered rate (sent and dropped) over the last 400 ms, for leaves.
    pub throughput: Rate,
    /// Whether the class's rate holds it back (its queue never emptied over the last 50 ms):
    /// it is offered any spare bandwidth up to its ceil.
    #[serde(default)]
    pub limited: bool,
    /// Wire bytes and packets sent.
    pub bytes: u64,
    pub packets: u64,
    /// Packets dropped (all reasons).
    pub drops: u64,
    /// Packets dropped because their departure time was beyond the class's horizon, and
    /// their wire bytes.
    pub drops_horizon: u64,
    #[serde(default)]
    pub drops_horizon_bytes: u64,
    /// Packets dropped by the AQM (ECN-capable packets are marked instead, `ecn_marks`), and
    /// their wire bytes.
    pub drops_aqm: u64,
    #[serde(default)]
    pub drops_aqm_bytes: u64,
    /// Packets dropped because their host was far over its fair share of the class, and their
    /// wire bytes.
    #[serde(default)]
    pub drops_share: u64,
    #[serde(default)]
    pub drops_share_bytes: u64,
    /// With isolation: one host's (or flow's) fair share of the class, bits/s, as estimated
    /// at the last tick (the class's rate when nobody needs protecting).
    #[serde(default)]
    pub share: u64,
    pub ecn_marks: u64,
    /// Packets of sparse flows sent ahead of the class's queue.
    pub sparse_packets: u64,
    /// Packets given a later departure time, and their mean added delay.
    pub delayed_packets: u64,
    pub mean_delay_us: u64,
    /// The 99th percentile of the added delay over the last second (the upper bound of its
    /// histogram bucket), if the class sent anything.
    pub p99_delay_us: Option<u64>,
    /// Packets by added delay since the datapath was loaded, NOT cumulative: bucket `i` below
    /// the last counts delays up to `shaper_common::DELAY_BUCKET_BASE_NS << i` (and above the
    /// previous bound), the last one the rest; empty for inner classes.
    #[serde(default)]
    pub delay_buckets: Vec<u64>,
    /// Sum of the added delays, ns.
    #[serde(default)]
    pub delay_ns_total: u64,
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum ApiError {
    #[error("{message}")]
    BadRequest { message: String },
    #[error("{message}")]
    UnknownClass { message: String },
    #[error("{message}")]
    InvalidRate { message: String },
    #[error("{message}")]
    InvalidConfig { message: String },
    #[error("{message}")]
    Internal { message: String },
    /// The change was applied, but writing it into the file failed (`status` lists it as
    /// unsaved).
    #[error("{message}")]
    NotSaved { message: String },
}

/// One reply line.
pub type Reply = Result<Response, ApiError>;

/// Handles requests; implemented by the daemon.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, request: Request) -> impl Future<Output = Reply> + Send;
}

/// Errors of the socket itself (not of a request).
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("creating the socket directory {path}")]
    Dir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("binding {path}")]
    Bind {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another shaperd is already listening on {path}")]
    InUse { path: PathBuf },
    #[error("connecting to shaperd at {path} (is shaperd running? set --socket or {SOCKET_ENV})")]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("talking to shaperd at {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("shaperd at {path} sent a reply that is not valid: {line}")]
    BadReply {
        path: PathBuf,
        line: String,
        #[source]
        source: serde_json::Error,
    },
}

/// The id of group `name`, if it exists (and can be looked up).
fn group_id(name: &str) -> Option<u32> {
    nix::unistd::Group::from_name(name).ok().flatten().map(|group| group.gid.as_raw())
}

/// A bound control socket; the file is removed on drop.
pub struct Server {
    listener: UnixListener,
    path: PathBuf,
}

impl Server {
    /// Binds `path` with mode 0660, creating its directory (mode 0750) if needed. A stale
    /// socket file (nobody listening) is replaced; a live one is an error.
    pub async fn bind(path: &Path) -> Result<Self, SocketError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            if !dir.exists() {
                std::fs::create_dir_all(dir).map_err(|source| SocketError::Dir { path: dir.to_owned(), source })?;
                std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o750))
                    .map_err(|source| SocketError::Dir { path: dir.to_owned(), source })?;
            }
        }
        if path.exists() {
            if UnixStream::connect(path).await.is_ok() {
                return Err(SocketError::InUse { path: path.to_owned() });
            }
            let _ = std::fs::remove_file(path);
        }
        let listener =
            UnixListener::bind(path).map_err(|source| SocketError::Bind { path: path.to_owned(), source })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(|source| SocketError::Bind { path: path.to_owned(), source })?;
        if let Some(gid) = group_id(SOCKET_GROUP) {
            std::os::unix::fs::chown(path, None, Some(gid))
                .map_err(|source| SocketError::Bind { path: path.to_owned(), source })?;
        }
        Ok(Self { listener, path: path.to_owned() })
    }

    /// Serves connections until `shutdown` completes.
    pub async fn serve<H: Handler>(&self, handler: Arc<H>, shutdown: impl Future<Output = ()>) {
        let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
        tokio::pin!(shutdown);
        loop {
            let permit = tokio::select! {
                () = &mut shutdown => return,
                p = Arc::clone(&slots).acquire_owned() => p.expect("semaphore never closed"),
            };
            let stream = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        warn!(error = %e, "accepting a control connection");
                        continue;
                    }
                },
            };
            let handler = Arc::clone(&handler);
            tokio::spawn(async move {
                if let Err(e) = serve_connection(stream, &*handler).await {
                    debug!(error = %e, "control connection ended");
                }
                drop(permit);
            });
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn write_reply(stream: &mut (impl tokio::io::AsyncWrite + Unpin), reply: &Reply) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).expect("replies always serialize");
    line.push(b'\n');
    stream.write_all(&line).await
}

async fn serve_connection(stream: UnixStream, handler: &impl Handler) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    loop {
        line.clear();
        let n = (&mut reader).take(MAX_LINE as u64 + 1).read_until(b'\n', &mut line).await?;
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_LINE {
            let reply = Err(ApiError::BadRequest { message: format!("request longer than {MAX_LINE} bytes") });
            return write_reply(&mut write, &reply).await;
        }
        let reply = match serde_json::from_slice::<Request>(&line) {
            Ok(request) => match tokio::time::timeout(REQUEST_TIMEOUT, handler.handle(request)).await {
                Ok(reply) => reply,
                Err(_) => Err(ApiError::Internal { message: format!("request took longer than {REQUEST_TIMEOUT:?}") }),
            },
            Err(e) => {
                let reply = Err(ApiError::BadRequest { message: format!("not a valid request: {e}") });
                return write_reply(&mut write, &reply).await;
            }
        };
        write_reply(&mut write, &reply).await?;
    }
}

/// A connection to `shaperd`, as `shaperctl` uses it.
pub struct Client {
    stream: BufReader<UnixStream>,
    path: PathBuf,
}

impl Client {
    pub async fn connect(path: &Path) -> Result<Self, SocketError> {
        let stream =
            UnixStream::connect(path).await.map_err(|source| SocketError::Connect { path: path.to_owned(), source })?;
        Ok(Self { stream: BufReader::new(stream), path: path.to_owned() })
    }

    /// Sends one request and waits for its reply.
    pub async fn call(&mut self, request: &Request) -> Result<Reply, SocketError> {
        let io = |source| SocketError::Io { path: self.path.clone(), source };
        let mut line = serde_json::to_vec(request).expect("requests always serialize");
        line.push(b'\n');
        self.stream.get_mut().write_all(&line).await.map_err(io)?;
        let mut reply = String::new();
        let io = |source| SocketError::Io { path: self.path.clone(), source };
        self.stream.read_line(&mut reply).await.map_err(io)?;
        serde_json::from_str(&reply).map_err(|source| SocketError::BadReply {
            path: self.path.clone(),
            line: reply.trim_end().to_owned(),
            source,
        })
    }
}

impl fmt::Display for ClassStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({}): rate {} ceil {} now {}", self.name, self.interface, self.rate, self.ceil, self.pacing_rate)
    }
}

#[cfg(test)]
mod tests {
    use shaper_common::DELAY_BUCKETS;

    use super::*;

    /// The examples of the module documentation: each message (`→` request, `←` reply), its
    /// folded lines joined.
    fn protocol_examples() -> Vec<(char, String)> {
        let source = include_str!("api.rs");
        let mut out: Vec<(char, String)> = Vec::new();
        let mut in_block = false;
        for line in source.lines().filter_map(|l| l.strip_prefix("//!")) {
            let line = line.trim_start();
            if line.starts_with("```") {
                if in_block {
                    break;
                }
                in_block = line == "```text";
                continue;
            }
            if !in_block {
                continue;
            }
            match line.chars().next() {
                Some(arrow @ ('→' | '←')) => out.push((arrow, line[arrow.len_utf8()..].trim().to_owned())),
                _ => out.last_mut().expect("a folded line follows a message").1.push_str(line),
            }
        }
        out
    }

    #[test]
    fn protocol_examples_are_what_the_types_read_and_write() {
        let examples = protocol_examples();
        assert_eq!(examples.iter().filter(|(a, _)| *a == '→').count(), 6, "{examples:?}");
        assert_eq!(examples.iter().filter(|(a, _)| *a == '←').count(), 6, "{examples:?}");
        for (arrow, text) in &examples {
            let value: serde_json::Value =
                serde_json::from_str(text).unwrap_or_else(|e| panic!("not JSON ({e}): {text}"));
            if *arrow == '→' {
                let request: Request = serde_json::from_value(value).unwrap_or_else(|e| panic!("{e}: {text}"));
                // A request reads back as itself (rates as integers).
                let again = serde_json::to_string(&request).unwrap();
                assert_eq!(serde_json::from_str::<Request>(&again).unwrap(), request);
            } else {
                // A reply is exactly what the daemon writes: every field, in its spelling.
                let reply: Reply = serde_json::from_value(value.clone()).unwrap_or_else(|e| panic!("{e}: {text}"));
                assert_eq!(serde_json::to_value(&reply).unwrap(), value, "{text}");
            }
        }
        let status = examples.iter().find_map(|(_, t)| serde_json::from_str::<Reply>(t).ok()?.ok());
        match status {
            Some(Response::Status(s)) => assert_eq!(s.classes[0].delay_buckets.len(), DELAY_BUCKETS),
            other => panic!("the first reply is a status: {other:?}"),
        }
    }

    #[test]
    fn requests_round_trip_and_accept_both_rate_spellings() {
        let r: Request = serde_json::from_str(r#"{"cmd":"set-rate","class":"alex","rate":"2mbit"}"#).unwrap();
        assert_eq!(r, Request::SetRate { class: "alex".into(), rate: Rate::from_bits_per_sec(2_000_000), save: false });
        let r: Request = serde_json::from_str(r#"{"cmd":"set-rate","class":"alex","rate":2000000}"#).unwrap();
        assert_eq!(r, Request::SetRate { class: "alex".into(), rate: Rate::from_bits_per_sec(2_000_000), save: false });
        assert_eq!(serde_json::to_string(&Request::Status {}).unwrap(), r#"{"cmd":"status"}"#);
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"status","x":1}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"reboot"}"#).is_err());
    }

    #[test]
    fn replies_carry_rates_in_bits_per_second() {
        let ok: Reply = Ok(Response::Changed {
            generation: 2,
            changes: vec!["class alex: rate 2mbit -> 1.9mbit".into()],
            saved: None,
        });
        assert_eq!(
            serde_json::to_string(&ok).unwrap(),
            r#"{"Ok":{"changed":{"generation":2,"changes":["class alex: rate 2mbit -> 1.9mbit"]}}}"#
        );
        let err: Reply = Err(ApiError::UnknownClass { message: "no class named `x`".into() });
        let text = serde_json::to_string(&err).unwrap();
        assert_eq!(text, r#"{"Err":{"kind":"unknown-class","message":"no class named `x`"}}"#);
        assert_eq!(serde_json::from_str::<Reply>(&text).unwrap(), err);
    }

    struct Echo;
    impl Handler for Echo {
        async fn handle(&self, request: Request) -> Reply {
            match request {
                Request::Status {} => Ok(Response::Status(Status::default())),
                Request::SetRate { class, rate, .. } => Ok(Response::Changed {
                    generation: 1,
                    changes: vec![format!("class {class}: rate {rate}")],
                    saved: None,
                }),
                _ => Err(ApiError::Internal { message: "not in this test".into() }),
            }
        }
    }

    #[tokio::test]
    async fn socket_serves_line_framed_requests_and_rejects_garbage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run/shaper.sock");
        let server = Server::bind(&path).await.unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        if let Some(gid) = group_id(SOCKET_GROUP) {
            assert_eq!(std::os::unix::fs::MetadataExt::gid(&meta), gid, "the socket belongs to group shaper");
        }
        assert!(matches!(Server::bind(&path).await, Err(SocketError::InUse { .. })));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let serving = tokio::spawn(async move {
            server.serve(Arc::new(Echo), async { stopped.await.unwrap_or(()) }).await;
        });
        let mut client = Client::connect(&path).await.unwrap();
        assert_eq!(client.call(&Request::Status {}).await.unwrap(), Ok(Response::Status(Status::default())));
        let set = Request::SetRate { class: "a".into(), rate: Rate::from_bits_per_sec(8), save: false };
        assert_eq!(
            client.call(&set).await.unwrap(),
            Ok(Response::Changed { generation: 1, changes: vec!["class a: rate 8bit".into()], saved: None })
        );

        let mut raw = UnixStream::connect(&path).await.unwrap();
        raw.write_all(b"{not json}\n").await.unwrap();
        let mut reply = String::new();
        BufReader::new(&mut raw).read_line(&mut reply).await.unwrap();
        let reply: Reply = serde_json::from_str(&reply).unwrap();
        assert!(matches!(reply, Err(ApiError::BadRequest { .. })), "{reply:?}");

        let mut raw = UnixStream::connect(&path).await.unwrap();
        raw.write_all(&vec![b' '; MAX_LINE + 10]).await.unwrap();
        let mut reply = String::new();
        BufReader::new(&mut raw).read_line(&mut reply).await.unwrap();
        assert!(reply.contains("longer than"), "{reply}");

        stop.send(()).unwrap();
        serving.await.unwrap();
        assert!(!path.exists(), "the socket file is removed with the server");
    }
}
