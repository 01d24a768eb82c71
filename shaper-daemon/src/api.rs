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
//! # Limits
//! Local clients can be broken or hostile (one that connects and never writes, one that writes a
//! byte a second or a line of 100 MB, one that never reads its replies); none of them may lock
//! the others out or grow the daemon's memory:
//! - a request line is read only up to [`MAX_LINE`] bytes: a longer one gets its `bad-request`
//!   reply after those, and the connection is closed unread;
//! - a line must be whole within [`REQUEST_TIMEOUT`] of its first byte, and a new connection
//!   must start its first request within that of its accept (else a `bad-request` reply, and the
//!   connection is closed); between requests a connection may stay idle as long as it likes
//!   (`shaperctl top` asks once per `--interval`);
//! - requests are handled one at a time, in arrival order (they all take the daemon's one state
//!   lock, which the control loop takes every tick: a queue of them at that lock would delay
//!   the tick), each answered within [`REQUEST_TIMEOUT`] of its line, waiting included (else an
//!   `internal` error);
//! - a reply the client does not take within [`REPLY_TIMEOUT`] closes the connection;
//! - at most [`MAX_CONNECTIONS`] connections are open. When all are taken, a new one takes the
//!   place of the connection that has waited longest for a request (one that never sent a whole
//!   request before one that did), which is closed; connections with a request under way keep
//!   theirs, and so does a connection that has waited less than [`GIVE_WAY_AFTER`] (a client
//!   that connects and then writes its request may be kept from the CPU in between). While no
//!   place can be taken, new connections wait in the listen backlog.
//!
//! The socket is created with mode 0660, group [`SOCKET_GROUP`] when that group exists.

use std::{
    collections::HashMap,
    fmt,
    future::Future,
    os::unix::fs::PermissionsExt as _,
    path::{Path, PathBuf},
    sync::{Arc, PoisonError},
    time::Duration,
};

use serde::{Deserialize, Serialize};
use tokio::{
    io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader},
    net::{unix::OwnedReadHalf, UnixListener, UnixStream},
    sync::{oneshot, Notify, Semaphore},
    time::Instant,
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
/// Connections open at once; when all are taken, the one that has waited longest for a
/// request gives its place to a new one (see the module doc). Each holds at most
/// [`MAX_LINE`] bytes of request and a reply.
pub const MAX_CONNECTIONS: usize = 64;
/// Time a connection waits for a request before its place may be given to a new one. With
/// every place held by clients that send nothing, a new client waits at most this (and its
/// turn in the listen backlog).
pub const GIVE_WAY_AFTER: Duration = Duration::from_secs(1);
/// Time a request line may take from its first byte to its newline, and from its newline to
/// its reply (waiting for its turn included); a new connection's first request must start
/// within this of its accept.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a client has to take a reply (read enough for it to fit in the socket) before the
/// connection is closed.
pub const REPLY_TIMEOUT: Duration = Duration::from_secs(5);

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
    limits: Limits,
}

/// The server's limits: the constants of this module (shorter in the unit tests).
#[derive(Clone, Copy, Debug)]
struct Limits {
    connections: usize,
    give_way_after: Duration,
    request: Duration,
    reply: Duration,
}

impl Limits {
    const DEFAULT: Self = Self {
        connections: MAX_CONNECTIONS,
        give_way_after: GIVE_WAY_AFTER,
        request: REQUEST_TIMEOUT,
        reply: REPLY_TIMEOUT,
    };
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
        // (tokio listens with the largest backlog the kernel allows, `net.core.somaxconn`:
        // clients beyond the open connections wait there, in the kernel, not in the daemon.)
        let listener =
            UnixListener::bind(path).map_err(|source| SocketError::Bind { path: path.to_owned(), source })?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o660))
            .map_err(|source| SocketError::Bind { path: path.to_owned(), source })?;
        if let Some(gid) = group_id(SOCKET_GROUP) {
            std::os::unix::fs::chown(path, None, Some(gid))
                .map_err(|source| SocketError::Bind { path: path.to_owned(), source })?;
        }
        Ok(Self { listener, path: path.to_owned(), limits: Limits::DEFAULT })
    }

    /// Serves connections until `shutdown` completes; see the module doc for the limits.
    pub async fn serve<H: Handler>(&self, handler: Arc<H>, shutdown: impl Future<Output = ()>) {
        let limits = self.limits;
        let slots = Slots::new(limits.connections, limits.give_way_after);
        let turn = Arc::new(Semaphore::new(1));
        tokio::pin!(shutdown);
        loop {
            let stream = tokio::select! {
                () = &mut shutdown => return,
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        // Usually EMFILE/ENFILE: retrying at once would spin, so wait a little.
                        warn!(error = %e, "accepting a control connection");
                        tokio::select! {
                            () = &mut shutdown => return,
                            () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                        }
                    }
                },
            };
            // A place for it before the next accept: while it waits for one, the clients
            // after it wait in the listen backlog. A place is taken only for a client that is
            // there, never in advance.
            loop {
                let changed = slots.changed.notified();
                let takeable = match slots.make_room() {
                    Room::Made => break,
                    Room::At(when) => Some(when),
                    Room::None => None,
                };
                let takeable = async {
                    match takeable {
                        Some(when) => tokio::time::sleep_until(when).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    () = &mut shutdown => return,
                    () = changed => {}
                    () = takeable => {}
                }
            }
            let slot = slots.open();
            let handler = Arc::clone(&handler);
            let turn = Arc::clone(&turn);
            tokio::spawn(async move {
                if let Err(e) = serve_connection(stream, &*handler, slot, &turn, limits).await {
                    debug!(error = %e, "control connection ended");
                }
            });
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// The open connections, as the accept loop sees them when it needs a place for a new one.
struct Slots {
    limit: usize,
    give_way_after: Duration,
    table: std::sync::Mutex<SlotTable>,
    /// Notified when a connection closes or starts waiting for a request (it may then give
    /// its place away).
    changed: Notify,
}

#[derive(Default)]
struct SlotTable {
    next_id: u64,
    open: HashMap<u64, SlotState>,
}

struct SlotState {
    /// Since when the connection waits for (the rest of) a request, if it does.
    waiting: Option<Waiting>,
    /// Dropped to close the connection (its [`Slot::closed`] then completes).
    _close: oneshot::Sender<()>,
}

/// How long a connection has waited; the least of these gives its place away first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Waiting {
    /// Whether it had a request answered (an idle `shaperctl top`) rather than none (a client
    /// that connects and sends nothing, or never a whole line).
    served: bool,
    since: Instant,
}

impl Slots {
    fn new(limit: usize, give_way_after: Duration) -> Arc<Self> {
        Arc::new(Self { limit, give_way_after, table: std::sync::Mutex::default(), changed: Notify::new() })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, SlotTable> {
        self.table.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether a new connection may have a place now: a place is free, or one was freed by
    /// closing the connection that has waited longest for a request, if it has waited
    /// [`GIVE_WAY_AFTER`] (else when it will have).
    fn make_room(&self) -> Room {
        let mut table = self.table();
        if table.open.len() < self.limit {
            return Room::Made;
        }
        let Some((waiting, id)) = table.open.iter().filter_map(|(id, slot)| Some((slot.waiting?, *id))).min() else {
            return Room::None;
        };
        let takeable = waiting.since + self.give_way_after;
        if Instant::now() < takeable {
            return Room::At(takeable);
        }
        debug!(?waiting, "closing the control connection that waited longest, to make room");
        table.open.remove(&id);
        Room::Made
    }

    /// The place of a connection just accepted: it cannot be taken until the connection has
    /// looked for its first request and found none.
    fn open(self: &Arc<Self>) -> Slot {
        let (close, closed) = oneshot::channel();
        let mut table = self.table();
        let id = table.next_id;
        table.next_id += 1;
        table.open.insert(id, SlotState { waiting: None, _close: close });
        Slot { slots: Arc::clone(self), id, closed }
    }
}

/// What [`Slots::make_room`] found.
enum Room {
    /// A place is free.
    Made,
    /// None yet; the place of the connection that waited longest may be taken at this instant.
    At(Instant),
    /// None while every open connection has a request under way.
    None,
}

/// One connection's place among the [`Slots`]; freed on drop.
struct Slot {
    slots: Arc<Slots>,
    id: u64,
    /// Completes when the place was given to a new connection: this one is to close.
    closed: oneshot::Receiver<()>,
}

impl Slot {
    /// The connection waits for (the rest of) a request: it may give its place away from now.
    fn waiting(&self, served: bool) {
        if let Some(slot) = self.slots.table().open.get_mut(&self.id) {
            slot.waiting = Some(Waiting { served, since: Instant::now() });
        }
        self.slots.changed.notify_one();
    }

    /// The connection has a whole request: it keeps its place until that is answered. False
    /// when the place was given away meanwhile.
    fn busy(&self) -> bool {
        self.slots.table().open.get_mut(&self.id).map(|slot| slot.waiting = None).is_some()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.slots.table().open.remove(&self.id);
        self.slots.changed.notify_one();
    }
}

/// What reading a request line came to.
enum LineRead {
    /// `line` holds a request line (with its newline, unless the client closed after it),
    /// or more than [`MAX_LINE`] bytes of one.
    Line,
    /// The client closed the connection between requests.
    End,
    /// The connection gave its place to a new one.
    GaveWay,
    /// Nothing, or no whole line, came in time; the reply to send before closing.
    TooSlow(String),
}

/// Reads one request line into `line` (see the module doc for the deadlines).
async fn read_request(
    reader: &mut BufReader<OwnedReadHalf>,
    line: &mut Vec<u8>,
    slot: &mut Slot,
    first: bool,
    limits: Limits,
) -> std::io::Result<LineRead> {
    line.clear();
    // What the client already sent is taken without waiting, so that a client that writes its
    // request as it connects (shaperctl) never counts as waiting and cannot be closed to make
    // room.
    let whole = tokio::select! {
        biased;
        read = read_line_part(reader, line) => {
            read?;
            true
        }
        () = std::future::ready(()) => false,
    };
    if !whole {
        slot.waiting(!first);
        if line.is_empty() {
            let start_by = async {
                if first {
                    tokio::time::sleep(limits.request).await;
                } else {
                    std::future::pending::<()>().await;
                }
            };
            tokio::select! {
                _ = &mut slot.closed => return Ok(LineRead::GaveWay),
                () = start_by => {
                    return Ok(LineRead::TooSlow(format!("no request within {:?} of connecting", limits.request)));
                }
                available = reader.fill_buf() => {
                    if available?.is_empty() {
                        return Ok(LineRead::End);
                    }
                }
            }
        }
        tokio::select! {
            _ = &mut slot.closed => return Ok(LineRead::GaveWay),
            () = tokio::time::sleep(limits.request) => {
                return Ok(LineRead::TooSlow(format!("no whole request line within {:?}", limits.request)));
            }
            read = read_line_part(reader, line) => {
                read?;
            }
        }
        if !slot.busy() {
            return Ok(LineRead::GaveWay);
        }
    }
    Ok(if line.is_empty() { LineRead::End } else { LineRead::Line })
}

/// Reads into `line` up to a newline, the end of the stream, or one byte more than
/// [`MAX_LINE`] in all. Cancelled, it keeps what it read in `line`.
async fn read_line_part(reader: &mut BufReader<OwnedReadHalf>, line: &mut Vec<u8>) -> std::io::Result<usize> {
    let left = u64::try_from((MAX_LINE + 1).saturating_sub(line.len())).unwrap_or(u64::MAX);
    reader.take(left).read_until(b'\n', line).await
}

async fn write_reply(
    stream: &mut (impl tokio::io::AsyncWrite + Unpin),
    reply: &Reply,
    limit: Duration,
) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(reply).expect("replies always serialize");
    line.push(b'\n');
    tokio::time::timeout(limit, stream.write_all(&line)).await.map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::TimedOut, format!("the client took no reply for {limit:?}"))
    })?
}

async fn serve_connection(
    stream: UnixStream,
    handler: &impl Handler,
    mut slot: Slot,
    turn: &Semaphore,
    limits: Limits,
) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut reader = BufReader::new(read);
    let mut line = Vec::new();
    let mut first = true;
    loop {
        match read_request(&mut reader, &mut line, &mut slot, first, limits).await? {
            LineRead::Line => {}
            LineRead::End => return Ok(()),
            LineRead::GaveWay => {
                debug!("control connection closed to make room for a new one");
                return Ok(());
            }
            LineRead::TooSlow(message) => {
                // Best effort: the client may not be reading either.
                return write_reply(&mut write, &Err(ApiError::BadRequest { message }), limits.reply).await;
            }
        }
        first = false;
        if line.len() > MAX_LINE {
            // Closed without reading the rest: the client's further writes fail, and what it
            // sent is never buffered beyond MAX_LINE.
            let reply = Err(ApiError::BadRequest { message: format!("request longer than {MAX_LINE} bytes") });
            return write_reply(&mut write, &reply, limits.reply).await;
        }
        let reply = match serde_json::from_slice::<Request>(&line) {
            Ok(request) => {
                let answer = async {
                    let _turn = turn.acquire().await.expect("the semaphore is never closed");
                    handler.handle(request).await
                };
                match tokio::time::timeout(limits.request, answer).await {
                    Ok(reply) => reply,
                    Err(_) => {
                        Err(ApiError::Internal { message: format!("request took longer than {:?}", limits.request) })
                    }
                }
            }
            Err(e) => {
                let reply = Err(ApiError::BadRequest { message: format!("not a valid request: {e}") });
                return write_reply(&mut write, &reply, limits.reply).await;
            }
        };
        write_reply(&mut write, &reply, limits.reply).await?;
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

    /// A server with `limits` on a socket in `dir`, serving [`Echo`] until the sender is used
    /// or dropped.
    async fn serve_with(dir: &Path, limits: Limits) -> (PathBuf, tokio::sync::oneshot::Sender<()>) {
        let path = dir.join("shaper.sock");
        let mut server = Server::bind(&path).await.unwrap();
        server.limits = limits;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            server.serve(Arc::new(Echo), async { stopped.await.unwrap_or(()) }).await;
        });
        (path, stop)
    }

    /// Whether the server closed `stream` (after any reply it wrote), within `within`.
    async fn closed_within(stream: &mut UnixStream, within: Duration) -> Option<String> {
        let mut got = Vec::new();
        match tokio::time::timeout(within, stream.read_to_end(&mut got)).await {
            Ok(Ok(_)) => Some(String::from_utf8_lossy(&got).into_owned()),
            Ok(Err(e)) => Some(format!("error: {e}")),
            Err(_) => None,
        }
    }

    #[tokio::test]
    async fn clients_that_send_nothing_give_their_places_to_new_ones() {
        let dir = tempfile::tempdir().unwrap();
        // Timeouts far longer than the test: only giving way can free a place here.
        let limits = Limits {
            connections: 4,
            give_way_after: Duration::from_millis(100),
            request: Duration::from_mins(1),
            reply: Duration::from_mins(1),
        };
        let (path, _stop) = serve_with(dir.path(), limits).await;
        // An idle client that had a request answered (as `shaperctl top` between refreshes).
        let mut top = Client::connect(&path).await.unwrap();
        assert!(top.call(&Request::Status {}).await.unwrap().is_ok());

        let mut stuck = Vec::new();
        for _ in 0..10 {
            stuck.push(UnixStream::connect(&path).await.unwrap());
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for _ in 0..3 {
            let mut good = Client::connect(&path).await.unwrap();
            let reply = tokio::time::timeout(Duration::from_secs(5), good.call(&Request::Status {}))
                .await
                .expect("a good client is answered while the places are full of clients that send nothing");
            assert_eq!(reply.unwrap(), Ok(Response::Status(Status::default())));
        }
        // Four places, one of them the idle client's: at most three silent clients kept one,
        // and the first good client found them all taken (the others, the first's place
        // maybe). The idle client that had been served kept its place throughout.
        let mut closed = 0;
        for s in &mut stuck {
            if let Some(got) = closed_within(s, Duration::from_millis(200)).await {
                assert_eq!(got, "", "a client closed to make room gets no reply");
                closed += 1;
            }
        }
        assert!(closed >= 8, "{closed} of 10 silent clients closed");
        let again = tokio::time::timeout(Duration::from_secs(5), top.call(&Request::Status {})).await;
        assert!(matches!(again, Ok(Ok(Ok(_)))), "the served idle client kept its place: {again:?}");
    }

    #[tokio::test]
    async fn a_client_slow_to_send_its_request_keeps_its_place_for_a_while() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            connections: 1,
            give_way_after: Duration::from_millis(500),
            request: Duration::from_mins(1),
            reply: Duration::from_mins(1),
        };
        let (path, _stop) = serve_with(dir.path(), limits).await;
        // It connects, is kept from writing for 200 ms, and meanwhile another client comes.
        let slow = UnixStream::connect(&path).await.unwrap();
        tokio::time::sleep(Duration::from_millis(50)).await;
        let next = tokio::spawn({
            let path = path.clone();
            async move {
                let mut client = Client::connect(&path).await.unwrap();
                client.call(&Request::Status {}).await
            }
        });
        tokio::time::sleep(Duration::from_millis(150)).await;
        let (read, mut write) = slow.into_split();
        write.write_all(b"{\"cmd\":\"status\"}\n").await.unwrap();
        let mut reader = BufReader::new(read);
        let mut reply = String::new();
        tokio::time::timeout(Duration::from_secs(5), reader.read_line(&mut reply)).await.unwrap().unwrap();
        assert!(reply.contains("\"Ok\""), "the slow client kept its place and was answered: {reply:?}");
        // Then it waits for another request: after 500 ms its place goes to the next client.
        let answered = tokio::time::timeout(Duration::from_secs(5), next).await.expect("the next client is served");
        assert!(matches!(answered, Ok(Ok(Ok(_)))), "{answered:?}");
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(1), reader.read_to_end(&mut rest)).await;
        assert!(matches!(closed, Ok(Ok(0))), "the slow client gave its place away: {closed:?}");
    }

    #[tokio::test]
    async fn silent_and_slow_clients_are_closed_after_the_request_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            connections: 4,
            give_way_after: Duration::from_millis(100),
            request: Duration::from_millis(300),
            reply: Duration::from_secs(5),
        };
        let (path, _stop) = serve_with(dir.path(), limits).await;
        let started = Instant::now();
        let mut silent = UnixStream::connect(&path).await.unwrap();
        let got = closed_within(&mut silent, Duration::from_secs(5)).await.expect("the silent client is closed");
        assert!(got.contains("bad-request") && got.contains("no request within"), "{got}");
        assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());

        // One byte every 100 ms: the line is never whole within 300 ms.
        let (read, mut write) = UnixStream::connect(&path).await.unwrap().into_split();
        let dribble = tokio::spawn(async move {
            for b in br#"{"cmd":"status"}"# {
                if write.write_all(&[*b]).await.is_err() {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
        let mut reply = String::new();
        tokio::time::timeout(Duration::from_secs(5), BufReader::new(read).read_line(&mut reply))
            .await
            .expect("the slow client is answered and closed")
            .unwrap();
        assert!(reply.contains("no whole request line within"), "{reply}");
        dribble.abort();

        // A client that pauses between requests is fine.
        let mut idle = Client::connect(&path).await.unwrap();
        for _ in 0..2 {
            assert!(idle.call(&Request::Status {}).await.unwrap().is_ok());
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
    }

    #[tokio::test]
    async fn a_client_that_reads_no_replies_is_closed_and_others_are_served_meanwhile() {
        let dir = tempfile::tempdir().unwrap();
        let limits = Limits {
            connections: 4,
            give_way_after: Duration::from_millis(100),
            request: Duration::from_secs(5),
            reply: Duration::from_millis(300),
        };
        let (path, _stop) = serve_with(dir.path(), limits).await;
        let (_read, mut write) = UnixStream::connect(&path).await.unwrap().into_split();
        // Requests until the daemon gives up on the replies piling up unread and closes the
        // connection, which fails the writes.
        let deaf = tokio::spawn(async move {
            let mut sent = 0u64;
            while write.write_all(b"{\"cmd\":\"status\"}\n").await.is_ok() {
                sent += 1;
            }
            sent
        });
        let mut good = Client::connect(&path).await.unwrap();
        assert!(good.call(&Request::Status {}).await.unwrap().is_ok());
        let sent = tokio::time::timeout(Duration::from_secs(10), deaf).await.expect("the deaf client is closed");
        assert!(sent.unwrap() > 10, "it got its replies queued first");
        assert!(good.call(&Request::Status {}).await.unwrap().is_ok());
    }

    #[tokio::test]
    async fn a_huge_line_is_refused_after_max_line_bytes_and_not_read() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _stop) = serve_with(dir.path(), Limits::DEFAULT).await;
        let (read, mut write) = UnixStream::connect(&path).await.unwrap().into_split();
        let writer = tokio::spawn(async move {
            let chunk = vec![b'x'; 1 << 20];
            let mut sent = 0;
            while sent < 100 << 20 && write.write_all(&chunk).await.is_ok() {
                sent += chunk.len();
            }
            sent
        });
        let mut reply = String::new();
        BufReader::new(read).read_line(&mut reply).await.unwrap();
        assert!(reply.contains("bad-request") && reply.contains("longer than"), "{reply}");
        let sent = tokio::time::timeout(Duration::from_secs(10), writer).await.unwrap().unwrap();
        assert!(sent < 8 << 20, "the daemon read {sent} bytes of a line longer than {MAX_LINE}");
    }
}
