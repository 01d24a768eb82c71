//! Prometheus metrics of `shaperd`, served over HTTP at `/metrics`.
//!
//! Two kinds of metric come out of one scrape:
//! - daemon-level ones observed as they happen (how long an allocator tick takes, how long
//!   from one tick to the next), held in [`Metrics`];
//! - per-class ones that the datapath counts (per CPU) and that the daemon reads at scrape time,
//!   handed to [`Metrics::encode`] as a [`Snapshot`]. Reading them per scrape rather than mirroring
//!   them into prometheus-client counters means nothing copies counters between scrapes, and a
//!   scrape sees the maps as they are.
//!
//! # Metrics
//! Every class metric carries the labels `interface` and `class`. Counters and the delay
//! histogram exist for leaf classes only (inner classes carry no traffic of their own); the rate
//! gauges exist for every class.
//!
//! | name | type | |
//! |---|---|---|
//! | `shaper_class_bytes_total` | counter | wire bytes sent |
//! | `shaper_class_packets_total` | counter | packets (GSO segments) sent |
//! | `shaper_class_drops_total{reason}` | counter | packets dropped; `reason` is `horizon` or `aqm` |
//! | `shaper_class_dropped_bytes_total{reason}` | counter | bytes of those packets |
//! | `shaper_class_ecn_marks_total` | counter | packets the AQM marked CE instead of dropping |
//! | `shaper_class_added_delay_seconds` | histogram | delay the shaper added to each packet sent |
//! | `shaper_class_rate_bytes_per_second` | gauge | configured guaranteed rate |
//! | `shaper_class_ceil_bytes_per_second` | gauge | configured ceiling |
//! | `shaper_class_allocation_bytes_per_second` | gauge | the allocator's current share |
//! | `shaper_class_pacing_rate_bytes_per_second` | gauge | the rate the datapath paces the class at |
//! | `shaper_config_generation` | gauge | generation of the configuration in force |
//! | `shaper_allocator_tick_duration_seconds` | histogram | time one allocator tick took |
//! | `shaper_allocator_tick_interval_seconds` | histogram | time from one tick's start to the next's (the configured `tick` when on time) |
//! | `shaper_interface_reattachments_total{interface}` | counter | times shaping was put back on the interface (re-created, renamed back, or its `fq` or filter found missing) |
//! | `shaper_interface_attached{interface}` | gauge | 1 while the interface is shaped, 0 while it is gone |
//!
//! Rates are exported in bytes per second although the configuration speaks bits: Prometheus
//! wants base units, and `promtool check metrics` rejects `bits`. `8 * shaper_class_rate_bytes_per_second`
//! gives tc's bits.
//!
//! # Server
//! [`serve`] answers `GET /metrics` in the format the client asks for: `OpenMetrics`
//! ([`OPENMETRICS_CONTENT_TYPE`]) when its `Accept` header names it, as Prometheus's does,
//! else Prometheus's classic text format ([`CLASSIC_CONTENT_TYPE`], what `curl … | promtool
//! check metrics` reads); any other path gets 404 and other methods on `/metrics` 405. It serves at most
//! [`MAX_CONNECTIONS`] connections at once (more wait in the listen backlog), one request per
//! connection, whose header must arrive within [`HEADER_TIMEOUT`] and which is answered within
//! [`CONNECTION_TIMEOUT`], so that a slow or stuck client costs the daemon one permit for a
//! bounded time and nothing else. Scrapes take their snapshot one at a time, and a scrape that
//! waited while another took one answers with that one (it was taken after the scrape arrived):
//! a storm of scrapes costs one snapshot at a time, and the control loop, which takes the state
//! lock a snapshot takes, never waits behind more than one.

use std::{
    convert::Infallible,
    fmt::{self, Write as _},
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use http_body_util::Full;
use hyper::{
    body::{Bytes, Incoming},
    header, Method, Request, Response, StatusCode,
};
use hyper_util::rt::{TokioIo, TokioTimer};
use prometheus_client::{
    collector::Collector,
    encoding::{
        text, DescriptorEncoder, EncodeLabelSet, EncodeLabelValue, EncodeMetric, LabelValueEncoder, MetricEncoder,
        NoLabelSet,
    },
    metrics::{
        counter::{ConstCounter, Counter},
        family::Family,
        gauge::{ConstGauge, Gauge},
        histogram::Histogram,
        MetricType, TypedMetric,
    },
    registry::{Registry, Unit},
};
use shaper_common::{DELAY_BUCKETS, DELAY_BUCKET_BASE_NS};
use tokio::{net::TcpListener, sync::Semaphore, task::JoinSet};
use tracing::{debug, warn};

use crate::api::{ClassStatus, Status};

/// Prefix of every metric name.
pub const PREFIX: &str = "shaper";
/// The content type of a scrape's answer: what prometheus-client's text encoder writes.
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of an answer in Prometheus's classic text format (version 0.0.4), for
/// clients that do not ask for `OpenMetrics`.
pub const CLASSIC_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
/// Connections served at once; more wait in the listen backlog.
pub const MAX_CONNECTIONS: usize = 16;
/// Time a connection may take, from accept to the last byte of the answer.
pub const CONNECTION_TIMEOUT: Duration = Duration::from_secs(10);
/// Time a client has to send its request's header (a scraper sends it at once; a slow-loris
/// client is closed after this, rather than after [`CONNECTION_TIMEOUT`]).
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(2);

/// Upper bounds (s) of the allocator tick histogram: 10 µs to 100 ms in 1-2.5-5 steps. A tick
/// walks the class tree once; beyond 100 ms it would delay the next tick, which is what the
/// `+Inf` bucket shows.
const TICK_BUCKETS: [f64; 13] =
    [10e-6, 25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3];

/// Upper bounds (s) of the tick interval histogram: 1 ms to 2.5 s, finest around the default
/// 10 ms tick, whose on-time intervals fall in 9-11 ms (tokio's timer has a 1 ms resolution):
/// the buckets above 11 ms count the ticks that came late, by how much.
const TICK_INTERVAL_BUCKETS: [f64; 15] =
    [1e-3, 2.5e-3, 5e-3, 9e-3, 11e-3, 12.5e-3, 15e-3, 20e-3, 25e-3, 50e-3, 100e-3, 250e-3, 500e-3, 1.0, 2.5];

/// What the daemon hands over for one scrape: the `status` reply, whose per-class records
/// (counters since the datapath was loaded, rates, the delay histogram) the metrics encode.
pub type Snapshot = Status;

/// The daemon-level metrics, observed as they happen, and the encoder of a whole scrape.
///
/// One registry holds both kinds: the tick histogram, and a collector that encodes the
/// [`Snapshot`] a scrape hands to [`Metrics::encode`].
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    tick: Histogram,
    tick_interval: Histogram,
    /// Per interface: how many times shaping was put back on it.
    reattachments: Family<InterfaceLabels, Counter>,
    /// Per interface: whether it is shaped now (1) or gone (0).
    attached: Family<InterfaceLabels, Gauge>,
    /// The snapshot the collector encodes; written by each scrape before it encodes.
    snapshot: Arc<Mutex<Snapshot>>,
    /// Held for a whole scrape, so that concurrent scrapes do not encode each other's snapshot.
    scrape: Mutex<()>,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Registers the daemon-level metrics and the per-class collector.
    #[must_use]
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let tick = Histogram::new(TICK_BUCKETS);
        registry.register_with_unit(
            "allocator_tick_duration",
            "Time one allocator tick took (reading counters, sharing rates, writing them back)",
            Unit::Seconds,
            tick.clone(),
        );
        let tick_interval = Histogram::new(TICK_INTERVAL_BUCKETS);
        registry.register_with_unit(
            "allocator_tick_interval",
            "Time from the start of one allocator tick to the start of the next: the configured tick \
             when the control loop keeps its period, more when a tick came late",
            Unit::Seconds,
            tick_interval.clone(),
        );
        let reattachments = Family::<InterfaceLabels, Counter>::default();
        registry.register(
            "interface_reattachments",
            "Times shaping was put back on the interface: it was deleted and created again, renamed \
             back to its configured name, or its fq or filter was found missing",
            reattachments.clone(),
        );
        let attached = Family::<InterfaceLabels, Gauge>::default();
        registry.register(
            "interface_attached",
            "Whether the interface is shaped (1), or gone, deleted or renamed away (0)",
            attached.clone(),
        );
        let snapshot = Arc::new(Mutex::new(Snapshot::default()));
        registry.register_collector(Box::new(SnapshotCollector(Arc::clone(&snapshot))));
        Self { registry, tick, tick_interval, reattachments, attached, snapshot, scrape: Mutex::new(()) }
    }

    /// Records whether `interface` is shaped (at start, and whenever it comes or goes).
    pub fn set_interface_attached(&self, interface: &str, attached: bool) {
        let labels = InterfaceLabels { interface: interface.to_owned() };
        // The counter is there from the start, at 0, so that its first step shows in rate().
        let _ = self.reattachments.get_or_create(&labels);
        self.attached.get_or_create(&labels).set(i64::from(attached));
    }

    /// Counts one time shaping was put back on `interface`.
    pub fn count_reattachment(&self, interface: &str) {
        self.reattachments.get_or_create(&InterfaceLabels { interface: interface.to_owned() }).inc();
    }

    /// Records the duration of one allocator tick.
    pub fn observe_tick(&self, d: Duration) {
        self.tick.observe(d.as_secs_f64());
    }

    /// Records the time from the start of the previous allocator tick to the start of this one.
    pub fn observe_tick_interval(&self, d: Duration) {
        self.tick_interval.observe(d.as_secs_f64());
    }

    /// The `OpenMetrics` text of a scrape: the daemon-level metrics and those of `snapshot`,
    /// ending with `# EOF`.
    #[must_use]
    pub fn encode(&self, snapshot: Snapshot) -> String {
        let _scrape = self.scrape.lock().unwrap_or_else(PoisonError::into_inner);
        *self.snapshot.lock().unwrap_or_else(PoisonError::into_inner) = snapshot;
        let mut out = String::new();
        // Writing into a String cannot fail, and the encoder only fails when its writer does.
        text::encode(&mut out, &self.registry).expect("encoding into a String");
        out
    }
}

/// Encodes the [`Snapshot`] of the scrape under way as metric families.
#[derive(Debug)]
struct SnapshotCollector(Arc<Mutex<Snapshot>>);

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> fmt::Result {
        let snapshot = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let classes = &snapshot.classes;
        let leaves: Vec<&ClassStatus> = classes.iter().filter(|c| c.leaf).collect();
        let e = &mut encoder;

        let counter = |value: fn(&ClassStatus) -> u64| {
            leaves.iter().map(|c| (labels(c), ConstCounter::new(value(c)))).collect::<Vec<_>>()
        };
        family(e, "class_bytes", "Wire bytes the class sent.", None, &counter(|c| c.bytes))?;
        family(
            e,
            "class_packets",
            "Packets the class sent (GSO segments counted one by one).",
            None,
            &counter(|c| c.packets),
        )?;
        let by_reason =
            |horizon: fn(&ClassStatus) -> u64, aqm: fn(&ClassStatus) -> u64, share: fn(&ClassStatus) -> u64| {
                leaves
                    .iter()
                    .flat_map(|c| {
                        [
                            (labels_with_reason(c, DropReason::Horizon), ConstCounter::new(horizon(c))),
                            (labels_with_reason(c, DropReason::Aqm), ConstCounter::new(aqm(c))),
                            (labels_with_reason(c, DropReason::Share), ConstCounter::new(share(c))),
                        ]
                    })
                    .collect::<Vec<_>>()
            };
        family(
            e,
            "class_drops",
            "Packets the class dropped, by reason: horizon (departure time too far ahead), aqm, or \
             share (their host far over its fair share of the class).",
            None,
            &by_reason(|c| c.drops_horizon, |c| c.drops_aqm, |c| c.drops_share),
        )?;
        family(
            e,
            "class_dropped_bytes",
            "Wire bytes of the packets the class dropped, by reason.",
            None,
            &by_reason(|c| c.drops_horizon_bytes, |c| c.drops_aqm_bytes, |c| c.drops_share_bytes),
        )?;
        family(
            e,
            "class_ecn_marks",
            "ECN-capable packets the AQM marked CE instead of dropping them.",
            None,
            &counter(|c| c.ecn_marks),
        )?;
        family(
            e,
            "class_added_delay",
            "Delay the shaper added to each packet the class sent (its departure time minus its arrival).",
            Some(&Unit::Seconds),
            &leaves.iter().map(|c| (labels(c), DelayHistogram::of(c))).collect::<Vec<_>>(),
        )?;

        let gauge = |value: fn(&ClassStatus) -> u64| {
            classes.iter().map(|c| (labels(c), ConstGauge::new(bits_to_bytes(value(c))))).collect::<Vec<_>>()
        };
        family(
            e,
            "class_rate_bytes_per_second",
            "Configured guaranteed rate of the class.",
            None,
            &gauge(|c| c.rate.bits_per_sec()),
        )?;
        family(
            e,
            "class_ceil_bytes_per_second",
            "Configured ceiling of the class.",
            None,
            &gauge(|c| c.ceil.bits_per_sec()),
        )?;
        family(
            e,
            "class_allocation_bytes_per_second",
            "Rate the allocator currently shares out to the class.",
            None,
            &gauge(|c| c.allocation.bits_per_sec()),
        )?;
        family(
            e,
            "class_pacing_rate_bytes_per_second",
            "Rate the datapath currently paces the class at.",
            None,
            &gauge(|c| c.pacing_rate.bits_per_sec()),
        )?;
        // Encoded without a label set, which the family encoder would write as `{}`.
        let generation = ConstGauge::new(snapshot.generation);
        generation.encode(e.encode_descriptor(
            "config_generation",
            "Generation of the configuration in force; it grows by one on every reload or change.",
            None,
            generation.metric_type(),
        )?)
    }
}

/// Labels of an interface metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct InterfaceLabels {
    interface: String,
}

/// Labels of a class metric.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClassLabels {
    interface: String,
    class: String,
}

/// Why the datapath dropped a packet: the `reason` label of the drop counters.
#[derive(Clone, Copy, Debug, Hash, PartialEq, Eq)]
enum DropReason {
    /// Its departure time was beyond the class's horizon.
    Horizon,
    /// CoDel dropped it (it was not ECN-capable).
    Aqm,
    /// Its host was far over its fair share of the class.
    Share,
}

impl EncodeLabelValue for DropReason {
    fn encode(&self, encoder: &mut LabelValueEncoder) -> fmt::Result {
        encoder.write_str(match self {
            Self::Horizon => "horizon",
            Self::Aqm => "aqm",
            Self::Share => "share",
        })
    }
}

/// Labels of a drop counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DropLabels {
    #[prometheus(flatten)]
    class: ClassLabels,
    reason: DropReason,
}

fn labels(c: &ClassStatus) -> ClassLabels {
    ClassLabels { interface: c.interface.clone(), class: c.name.clone() }
}

fn labels_with_reason(c: &ClassStatus, reason: DropReason) -> DropLabels {
    DropLabels { class: labels(c), reason }
}

/// Encodes one metric family from its samples; a family without samples is left out rather than
/// announced empty.
fn family<L: EncodeLabelSet, M: EncodeMetric + TypedMetric>(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: &[(L, M)],
) -> fmt::Result {
    if samples.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, unit, M::TYPE)?;
    for (labels, metric) in samples {
        metric.encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

#[expect(
    clippy::cast_precision_loss,
    reason = "f64 is exact up to 2^53 bit/s, far above any link; Prometheus values are f64 anyway"
)]
fn bits_to_bytes(bps: u64) -> f64 {
    bps as f64 / 8.0
}

/// The added-delay histogram of one class, as read from the datapath.
#[derive(Debug)]
struct DelayHistogram {
    sum_seconds: f64,
    count: u64,
    /// `(upper bound in s, packets in this bucket only)`; the encoder makes them cumulative.
    buckets: [(f64, u64); DELAY_BUCKETS],
}

impl DelayHistogram {
    #[expect(clippy::cast_precision_loss, reason = "ns totals below 2^53 (104 days of added delay) are exact")]
    fn of(c: &ClassStatus) -> Self {
        let buckets = std::array::from_fn(|i| {
            let bound = if i + 1 < DELAY_BUCKETS { (DELAY_BUCKET_BASE_NS << i) as f64 / 1e9 } else { f64::INFINITY };
            (bound, c.delay_buckets.get(i).copied().unwrap_or(0))
        });
        // Prometheus requires `_count` to equal the `+Inf` bucket, so it is the sum of the buckets
        // rather than `packets`, which the datapath updates separately.
        let count = c.delay_buckets.iter().sum();
        Self { sum_seconds: c.delay_ns_total as f64 / 1e9, count, buckets }
    }
}

impl TypedMetric for DelayHistogram {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for DelayHistogram {
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        encoder.encode_histogram::<NoLabelSet>(self.sum_seconds, self.count, &self.buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Serves `GET /metrics` on `listener` until `shutdown` completes; see the module doc.
///
/// `snapshot` is called once per scrape. Connections still open at shutdown are dropped: a
/// scrape is not worth delaying the daemon's exit for.
pub async fn serve<F, Fut>(
    listener: TcpListener,
    metrics: Arc<Metrics>,
    snapshot: F,
    shutdown: impl Future<Output = ()>,
) where
    F: Fn() -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Snapshot> + Send,
{
    let snapshot = Arc::new(snapshot);
    let last = Arc::new(LastExposition::default());
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        while connections.try_join_next().is_some() {}
        // The permit is taken before accepting, so that excess clients wait in the kernel's
        // backlog instead of in the daemon's memory.
        let permit = tokio::select! {
            () = &mut shutdown => break,
            permit = permits.clone().acquire_owned() => permit.expect("the semaphore is never closed"),
        };
        let stream = tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(error) => {
                    // Usually EMFILE/ENFILE: retrying at once would spin, so wait a little.
                    warn!(%error, "accepting a metrics connection");
                    tokio::select! {
                        () = &mut shutdown => break,
                        () = tokio::time::sleep(Duration::from_millis(100)) => continue,
                    }
                }
            },
        };
        let peer = stream.peer_addr().ok();
        let metrics = metrics.clone();
        let snapshot = snapshot.clone();
        let last = last.clone();
        connections.spawn(async move {
            let _permit = permit;
            let service = hyper::service::service_fn(move |request| {
                let metrics = metrics.clone();
                let snapshot = snapshot.clone();
                let last = last.clone();
                async move { Ok::<_, Infallible>(respond(&request, &metrics, &*snapshot, &last).await) }
            });
            // One request per connection: the timeout then bounds a request, and an idle
            // keep-alive connection cannot sit on a permit between scrapes.
            let connection = hyper::server::conn::http1::Builder::new()
                .keep_alive(false)
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .serve_connection(TokioIo::new(stream), service);
            match tokio::time::timeout(CONNECTION_TIMEOUT, connection).await {
                Ok(Ok(())) => {}
                Ok(Err(error)) => debug!(?peer, %error, "metrics connection failed"),
                Err(_) => debug!(?peer, timeout = ?CONNECTION_TIMEOUT, "metrics connection timed out"),
            }
        });
    }
}

/// The last exposition a scrape made (`OpenMetrics` text) and when its snapshot was taken.
type LastExposition = tokio::sync::Mutex<Option<(Instant, Arc<str>)>>;

/// A scrape's `OpenMetrics` text: a new snapshot, or the one a scrape took while this one
/// waited for its turn (see the module doc).
async fn exposition<F, Fut>(last: &LastExposition, arrived: Instant, metrics: &Metrics, snapshot: &F) -> Arc<str>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Snapshot>,
{
    let mut last = last.lock().await;
    if let Some((taken, text)) = last.as_ref().filter(|(taken, _)| *taken >= arrived) {
        debug!(age = ?taken.elapsed(), "metrics scrape answered with the snapshot taken while it waited");
        return Arc::clone(text);
    }
    let taken = Instant::now();
    let text: Arc<str> = metrics.encode(snapshot().await).into();
    *last = Some((taken, Arc::clone(&text)));
    text
}

/// The answer to one request.
async fn respond<F, Fut>(
    request: &Request<Incoming>,
    metrics: &Metrics,
    snapshot: &F,
    last: &LastExposition,
) -> Response<Full<Bytes>>
where
    F: Fn() -> Fut,
    Fut: Future<Output = Snapshot>,
{
    let plain = |status: StatusCode, body: &'static str| {
        Response::builder()
            .status(status)
            .header(header::CONTENT_TYPE, "text/plain; charset=utf-8")
            .body(Full::new(Bytes::from_static(body.as_bytes())))
    };
    let response = match (request.uri().path(), request.method()) {
        ("/metrics", &Method::GET) => {
            let text = exposition(last, Instant::now(), metrics, snapshot).await;
            let (content_type, text) = if wants_openmetrics(request.headers()) {
                (OPENMETRICS_CONTENT_TYPE, text.to_string())
            } else {
                (CLASSIC_CONTENT_TYPE, as_classic_text(&text))
            };
            Response::builder()
                .header(header::CONTENT_TYPE, content_type)
                .header(header::VARY, "Accept")
                .body(Full::new(Bytes::from(text)))
        }
        ("/metrics", _) => plain(StatusCode::METHOD_NOT_ALLOWED, "only GET is allowed on /metrics\n").map(|mut r| {
            r.headers_mut().insert(header::ALLOW, header::HeaderValue::from_static("GET"));
            r
        }),
        _ => plain(StatusCode::NOT_FOUND, "not found; metrics are at /metrics\n"),
    };
    let response = response.expect("a response built from constant, valid parts");
    debug!(method = %request.method(), path = request.uri().path(), status = %response.status(), "metrics request");
    response
}

/// Whether the request's `Accept` header names `OpenMetrics` (with any parameters and any
/// non-zero quality), as Prometheus's scraper does.
fn wants_openmetrics(headers: &header::HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).flat_map(|v| v.split(',')).any(|range| {
        let mut parts = range.split(';').map(str::trim);
        let media = parts.next().unwrap_or_default();
        let refused = parts.filter_map(|p| p.strip_prefix("q=")).any(|q| q.parse::<f32>().is_ok_and(|q| q <= 0.0));
        media.eq_ignore_ascii_case("application/openmetrics-text") && !refused
    })
}

/// `openmetrics` as Prometheus's classic text format writes it, which is what `promtool check
/// metrics` parses (for checking the exposition): `OpenMetrics` names a counter family without its `_total` suffix, so
/// promtool, reading `# TYPE x counter` followed by samples `x_total`, would take them for an
/// untyped family without help. Nothing else differs for the metrics here (`# UNIT` and
/// `# EOF` are comments to it).
#[must_use]
pub fn as_classic_text(openmetrics: &str) -> String {
    let counters: Vec<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::new();
    for line in openmetrics.lines() {
        let renamed = ["# HELP ", "# TYPE "].iter().find_map(|kind| {
            let rest = line.strip_prefix(kind)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(&name).then(|| format!("{kind}{name}_total {tail}"))
        });
        out.push_str(renamed.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use std::{io::Write as _, process::Stdio};

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::rate::Rate;

    /// A leaf with traffic and its parent, an inner class.
    fn snapshot() -> Snapshot {
        let mut delay_buckets = vec![0; DELAY_BUCKETS];
        delay_buckets[0] = 90;
        delay_buckets[3] = 7;
        delay_buckets[DELAY_BUCKETS - 1] = 3;
        let leaf = ClassStatus {
            interface: "lan0".into(),
            name: "alex".into(),
            leaf: true,
            bytes: 150_000,
            packets: 100,
            drops_horizon: 2,
            drops_horizon_bytes: 3000,
            drops_aqm: 5,
            drops_aqm_bytes: 7500,
            ecn_marks: 11,
            rate: Rate::from_bits_per_sec(2_000_000),
            ceil: Rate::from_bits_per_sec(10_000_000),
            allocation: Rate::from_bits_per_sec(4_000_004),
            pacing_rate: Rate::from_bits_per_sec(3_000_000),
            delay_buckets,
            delay_ns_total: 2_500_000_000,
            ..ClassStatus::default()
        };
        let inner = ClassStatus {
            interface: "lan0".into(),
            name: "home".into(),
            leaf: false,
            rate: Rate::from_bits_per_sec(8_000_000),
            ceil: Rate::from_bits_per_sec(100_000_000),
            allocation: Rate::from_bits_per_sec(50_000_000),
            ..ClassStatus::default()
        };
        Snapshot { generation: 7, classes: vec![leaf, inner], ..Snapshot::default() }
    }

    /// The value of the sample `name{labels}` (labels as written, in order), if any.
    fn sample<'a>(text: &'a str, series: &str) -> Option<&'a str> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
    }

    #[test]
    fn encodes_class_metrics_with_labels() {
        let metrics = Metrics::new();
        metrics.observe_tick(Duration::from_micros(300));
        metrics.observe_tick_interval(Duration::from_micros(10_400));
        metrics.observe_tick_interval(Duration::from_millis(14));
        let text = metrics.encode(snapshot());
        let leaf = r#"interface="lan0",class="alex""#;
        let inner = r#"interface="lan0",class="home""#;
        let expect = [
            (format!("shaper_class_bytes_total{{{leaf}}}"), "150000"),
            (format!("shaper_class_packets_total{{{leaf}}}"), "100"),
            (format!(r#"shaper_class_drops_total{{{leaf},reason="horizon"}}"#), "2"),
            (format!(r#"shaper_class_drops_total{{{leaf},reason="aqm"}}"#), "5"),
            (format!(r#"shaper_class_dropped_bytes_total{{{leaf},reason="horizon"}}"#), "3000"),
            (format!(r#"shaper_class_dropped_bytes_total{{{leaf},reason="aqm"}}"#), "7500"),
            (format!("shaper_class_ecn_marks_total{{{leaf}}}"), "11"),
            (format!("shaper_class_rate_bytes_per_second{{{leaf}}}"), "250000.0"),
            (format!("shaper_class_ceil_bytes_per_second{{{leaf}}}"), "1250000.0"),
            (format!("shaper_class_allocation_bytes_per_second{{{leaf}}}"), "500000.5"),
            (format!("shaper_class_pacing_rate_bytes_per_second{{{leaf}}}"), "375000.0"),
            (format!("shaper_class_rate_bytes_per_second{{{inner}}}"), "1000000.0"),
            (format!("shaper_class_ceil_bytes_per_second{{{inner}}}"), "12500000.0"),
            (format!("shaper_class_allocation_bytes_per_second{{{inner}}}"), "6250000.0"),
            (format!("shaper_class_pacing_rate_bytes_per_second{{{inner}}}"), "0.0"),
            (format!("shaper_class_added_delay_seconds_sum{{{leaf}}}"), "2.5"),
            (format!("shaper_class_added_delay_seconds_count{{{leaf}}}"), "100"),
            ("shaper_config_generation".to_owned(), "7"),
            ("shaper_allocator_tick_duration_seconds_count".to_owned(), "1"),
            (r#"shaper_allocator_tick_duration_seconds_bucket{le="0.00025"}"#.to_owned(), "0"),
            (r#"shaper_allocator_tick_duration_seconds_bucket{le="0.0005"}"#.to_owned(), "1"),
            ("shaper_allocator_tick_interval_seconds_count".to_owned(), "2"),
            (r#"shaper_allocator_tick_interval_seconds_bucket{le="0.009"}"#.to_owned(), "0"),
            (r#"shaper_allocator_tick_interval_seconds_bucket{le="0.011"}"#.to_owned(), "1"),
            (r#"shaper_allocator_tick_interval_seconds_bucket{le="0.015"}"#.to_owned(), "2"),
        ];
        for (series, value) in expect {
            assert_eq!(sample(&text, &series), Some(value), "{series} in\n{text}");
        }
        for family in [
            "# TYPE shaper_class_bytes counter",
            "# TYPE shaper_class_drops counter",
            "# TYPE shaper_class_added_delay_seconds histogram",
            "# TYPE shaper_class_pacing_rate_bytes_per_second gauge",
            "# TYPE shaper_config_generation gauge",
            "# TYPE shaper_allocator_tick_duration_seconds histogram",
            "# TYPE shaper_allocator_tick_interval_seconds histogram",
        ] {
            assert!(text.contains(family), "{family} in\n{text}");
        }
        // Inner classes carry no traffic: no counters, no histogram.
        for line in text.lines().filter(|l| l.contains(inner)) {
            assert!(line.contains("_bytes_per_second{"), "inner class with a traffic metric: {line}");
        }
        assert!(!text.contains("_total_total"), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
        // Every family has help text.
        let types = text.lines().filter(|l| l.starts_with("# TYPE ")).count();
        let helps = text.lines().filter(|l| l.starts_with("# HELP shaper_")).count();
        assert_eq!(types, 13, "{text}");
        assert_eq!(helps, types, "{text}");
    }

    #[test]
    fn interfaces_report_whether_they_are_shaped_and_their_reattachments() {
        let metrics = Metrics::new();
        metrics.set_interface_attached("wan0", true);
        metrics.set_interface_attached("lan0", true);
        let text = metrics.encode(Snapshot::default());
        assert_eq!(sample(&text, r#"shaper_interface_attached{interface="wan0"}"#), Some("1"), "{text}");
        // There from the start, at 0, so that the first re-attachment shows in rate().
        assert_eq!(sample(&text, r#"shaper_interface_reattachments_total{interface="wan0"}"#), Some("0"), "{text}");
        metrics.set_interface_attached("wan0", false);
        let text = metrics.encode(Snapshot::default());
        assert_eq!(sample(&text, r#"shaper_interface_attached{interface="wan0"}"#), Some("0"), "{text}");
        metrics.set_interface_attached("wan0", true);
        metrics.count_reattachment("wan0");
        let text = metrics.encode(Snapshot::default());
        assert_eq!(sample(&text, r#"shaper_interface_attached{interface="wan0"}"#), Some("1"), "{text}");
        assert_eq!(sample(&text, r#"shaper_interface_reattachments_total{interface="wan0"}"#), Some("1"), "{text}");
        assert_eq!(sample(&text, r#"shaper_interface_reattachments_total{interface="lan0"}"#), Some("0"), "{text}");
        for family in ["# TYPE shaper_interface_reattachments counter", "# TYPE shaper_interface_attached gauge"] {
            assert!(text.contains(family), "{family} in\n{text}");
        }
    }

    #[test]
    fn delay_histogram_is_cumulative() {
        let text = Metrics::new().encode(snapshot());
        // prometheus-client writes `le` first.
        let prefix = r#"shaper_class_added_delay_seconds_bucket{le=""#;
        let labels = r#"",interface="lan0",class="alex"} "#;
        let buckets: Vec<(String, u64)> = text
            .lines()
            .filter_map(|l| l.strip_prefix(prefix))
            .map(|l| {
                let (le, value) = l.split_once(labels).expect("bucket line of class alex");
                (le.to_owned(), value.parse().expect("integer bucket"))
            })
            .collect();
        let bounds: Vec<&str> = buckets.iter().map(|(le, _)| le.as_str()).collect();
        assert_eq!(bounds.len(), DELAY_BUCKETS, "{text}");
        assert_eq!(bounds[..4], ["0.000125", "0.00025", "0.0005", "0.001"]);
        assert_eq!(bounds[DELAY_BUCKETS - 2..], ["2.048", "+Inf"]);
        let counts: Vec<u64> = buckets.iter().map(|b| b.1).collect();
        assert!(counts.windows(2).all(|w| w[0] <= w[1]), "not cumulative: {counts:?}");
        assert_eq!(counts[..5], [90, 90, 90, 97, 97]);
        assert_eq!(counts[DELAY_BUCKETS - 2], 97);
        assert_eq!(counts[DELAY_BUCKETS - 1], snapshot().classes[0].packets);
    }

    #[test]
    fn no_classes_no_class_families() {
        let text = Metrics::new().encode(Snapshot::default());
        assert!(!text.contains("shaper_class_"), "{text}");
        assert_eq!(sample(&text, "shaper_config_generation"), Some("0"));
    }

    #[test]
    fn label_values_are_escaped() {
        let mut s = snapshot();
        s.classes[0].name = r#"a"b\c"#.into();
        let text = Metrics::new().encode(s);
        assert!(text.contains(r#"class="a\"b\\c""#), "{text}");
    }

    #[test]
    fn promtool_finds_nothing_to_lint() {
        let metrics = Metrics::new();
        metrics.observe_tick(Duration::from_millis(2));
        metrics.observe_tick_interval(Duration::from_millis(10));
        metrics.set_interface_attached("lan0", true);
        metrics.count_reattachment("lan0");
        let text = as_classic_text(&metrics.encode(snapshot()));
        let mut child = match std::process::Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
        {
            Ok(child) => child,
            Err(e) => panic!(
                "cannot run promtool ({e}): it lints the metrics. Run `cargo xtask setup` (it installs the \
                 Debian package `prometheus`, which provides /usr/bin/promtool)"
            ),
        };
        child.stdin.take().expect("piped stdin").write_all(text.as_bytes()).expect("writing to promtool");
        let out = child.wait_with_output().expect("waiting for promtool");
        let report = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert!(
            out.status.success() && report.trim().is_empty(),
            "promtool check metrics: {}\n{report}\n{text}",
            out.status
        );
    }

    /// Sends a raw HTTP/1.1 request and returns the whole answer.
    async fn http(addr: std::net::SocketAddr, request: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connecting to the metrics server");
        stream.write_all(request.as_bytes()).await.expect("sending the request");
        let mut answer = String::new();
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut answer))
            .await
            .expect("an answer within 5 s")
            .expect("reading the answer");
        answer
    }

    #[tokio::test]
    async fn serves_metrics_over_http() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let server = tokio::spawn(serve(listener, Arc::new(Metrics::new()), || async { snapshot() }, async {
            let _ = stopped.await;
        }));

        // A client that connects and says nothing holds one permit, not the server.
        let _idle = tokio::net::TcpStream::connect(addr).await.expect("connecting");

        // Prometheus asks for OpenMetrics and gets it.
        let prometheus_accept = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;\
                                 version=0.0.1;q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        let ok =
            http(addr, &format!("GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: {prometheus_accept}\r\n\r\n"))
                .await;
        let (head, body) = ok.split_once("\r\n\r\n").expect("a header and a body");
        assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{ok}");
        assert!(
            head.to_ascii_lowercase().contains(&format!("\r\ncontent-type: {OPENMETRICS_CONTENT_TYPE}\r\n")),
            "{head}"
        );
        assert_eq!(sample(body, "shaper_config_generation"), Some("7"), "{body}");
        assert!(body.contains(r#"shaper_class_bytes_total{interface="lan0",class="alex"} 150000"#), "{body}");
        assert!(body.contains("# TYPE shaper_class_bytes counter\n"), "{body}");
        assert!(body.ends_with("# EOF\n"), "{body}");

        // A client that does not ask (curl) gets the classic format, counters named with
        // their `_total`, which promtool reads without complaint.
        for request in [
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: */*\r\n\r\n",
            "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: application/openmetrics-text;q=0\r\n\r\n",
        ] {
            let classic = http(addr, request).await;
            let (head, body) = classic.split_once("\r\n\r\n").expect("a header and a body");
            assert!(
                head.to_ascii_lowercase().contains(&format!("\r\ncontent-type: {CLASSIC_CONTENT_TYPE}\r\n")),
                "{request}: {head}"
            );
            assert!(body.contains("# TYPE shaper_class_bytes_total counter\n"), "{body}");
            assert!(body.contains(r#"shaper_class_bytes_total{interface="lan0",class="alex"} 150000"#), "{body}");
        }

        let missing = http(addr, "GET /other HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n").await;
        assert!(missing.starts_with("HTTP/1.1 404 Not Found\r\n"), "{missing}");
        let post = http(addr, "POST /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 0\r\n\r\n").await;
        assert!(post.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{post}");
        assert!(post.to_ascii_lowercase().contains("\r\nallow: get\r\n"), "{post}");

        stop.send(()).expect("server still running");
        tokio::time::timeout(Duration::from_secs(5), server)
            .await
            .expect("serve returns once shutdown completes")
            .expect("serve did not panic");
    }

    #[tokio::test]
    async fn slow_clients_are_closed_and_concurrent_scrapes_share_snapshots() {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("binding 127.0.0.1:0");
        let addr = listener.local_addr().expect("local address");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&taken);
        let take = move || {
            let counter = Arc::clone(&counter);
            async move {
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                // As long as a busy daemon might take: the other scrapes queue meanwhile.
                tokio::time::sleep(Duration::from_millis(100)).await;
                snapshot()
            }
        };
        let server = tokio::spawn(serve(listener, Arc::new(Metrics::new()), take, async {
            let _ = stopped.await;
        }));

        // A slow-loris client: a header that never ends. It is closed after HEADER_TIMEOUT,
        // not CONNECTION_TIMEOUT.
        let started = std::time::Instant::now();
        let mut slow = tokio::net::TcpStream::connect(addr).await.expect("connecting");
        slow.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").await.expect("writing");
        let mut answer = Vec::new();
        let read = tokio::time::timeout(HEADER_TIMEOUT * 2, async {
            loop {
                if slow.write_all(b"X-Slow: 1\r\n").await.is_err() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mut buf = [0; 1024];
                match tokio::time::timeout(Duration::from_millis(10), slow.read(&mut buf)).await {
                    Ok(Ok(0) | Err(_)) => break,
                    Ok(Ok(n)) => answer.extend_from_slice(&buf[..n]),
                    Err(_) => {}
                }
            }
        })
        .await;
        assert!(read.is_ok(), "the slow client is still open after {:?}", started.elapsed());
        assert!(started.elapsed() >= HEADER_TIMEOUT, "closed after {:?}", started.elapsed());

        // Twenty scrapes at once: the first takes a snapshot; those that waited meanwhile share
        // the next, taken after they arrived.
        let scrapes: Vec<_> =
            (0..20).map(|_| tokio::spawn(http(addr, "GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"))).collect();
        for scrape in scrapes {
            let answer = scrape.await.expect("scrape task");
            assert!(
                answer.starts_with("HTTP/1.1 200 OK\r\n") && answer.contains("shaper_config_generation 7"),
                "{answer}"
            );
        }
        let taken = taken.load(std::sync::atomic::Ordering::Relaxed);
        assert!((1..=3).contains(&taken), "{taken} snapshots for 20 concurrent scrapes");

        stop.send(()).expect("server still running");
        tokio::time::timeout(Duration::from_secs(5), server).await.expect("serve returns").expect("no panic");
    }
}
