//! A real Prometheus server scraping endpoints on loopback: first a fixed exposition served by
//! hand (which proves the [`shaper_tests::prometheus`] helper), then shaper's own `/metrics`
//! server fed with a synthetic snapshot (which proves Prometheus parses shaper's `OpenMetrics`
//! exposition). No kernel features or root needed; `/usr/bin/prometheus` is (`cargo xtask setup`).
#![allow(clippy::cast_precision_loss, reason = "figures for tolerances")]

use std::{
    io::{BufRead as _, BufReader, Write as _},
    net::TcpListener,
    sync::Arc,
    thread,
    time::{Duration, Instant},
};

use serde_json::Value;
use shaper::{
    api::ClassStatus,
    metrics::{serve, Metrics, Snapshot},
    rate::Rate,
};
use shaper_common::DELAY_BUCKETS;
use shaper_tests::prometheus::Prometheus;

const SCRAPE_INTERVAL: Duration = Duration::from_secs(1);
/// The counters below grow by this much per second.
const PER_SECOND: f64 = 1000.0;

/// Serves `GET /anything` on 127.0.0.1 from a thread with `body(elapsed)` as classic text
/// format; returns the address.
fn serve_text(body: fn(Duration) -> String) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let addr = listener.local_addr().expect("local address").to_string();
    let start = Instant::now();
    // Detached: it lives as long as the test process, which is all a test needs.
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let mut reader = BufReader::new(&stream);
            let mut line = String::new();
            // The request head ends with an empty line; what it asks for does not matter here.
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) && line != "\r\n" {
                line.clear();
            }
            let text = body(start.elapsed());
            let _ = write!(
                &stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{text}",
                text.len()
            );
        }
    });
    addr
}

/// Polls `promql` until it yields one sample, and returns that sample's value.
fn wait_for_value(prometheus: &Prometheus, promql: &str, timeout: Duration) -> f64 {
    let deadline = Instant::now() + timeout;
    loop {
        let result = prometheus.query(promql);
        if let [sample] = result.as_array().map(Vec::as_slice).unwrap_or_default() {
            return value(sample);
        }
        assert!(Instant::now() < deadline, "`{promql}` gave no single sample in {timeout:?}: {result}");
        thread::sleep(Duration::from_millis(250));
    }
}

/// Waits until `series` has `n` samples in the last `window`: `rate()` over a window holding
/// only the first two scrapes extrapolates them to a fraction of the true rate.
fn wait_for_samples(prometheus: &Prometheus, series: &str, window: &str, n: f64) {
    let promql = format!("count_over_time({series}[{window}]) >= {n}");
    wait_for_value(prometheus, &promql, Duration::from_secs(20));
}

/// The value of one sample of a query result (`{"metric": …, "value": [time, "value"]}`).
fn value(sample: &Value) -> f64 {
    sample["value"][1].as_str().and_then(|v| v.parse().ok()).unwrap_or_else(|| panic!("no value in {sample}"))
}

fn assert_near(what: &str, got: f64, want: f64) {
    assert!((got - want).abs() <= want * 0.1, "{what} = {got}, expected {want} ± 10%");
}

#[test]
fn prometheus_scrapes_a_counter_and_computes_its_rate() {
    let target = serve_text(|elapsed| {
        let value = elapsed.as_millis(); // 1000 per second
        format!("# HELP x_total A counter that grows by 1000 per second.\n# TYPE x_total counter\nx_total {value}\n")
    });
    let prometheus = Prometheus::start(&target, SCRAPE_INTERVAL);
    prometheus.wait_for_targets_up(Duration::from_secs(15));
    wait_for_samples(&prometheus, "x_total", "5s", 5.0);
    let rate = wait_for_value(&prometheus, "rate(x_total[5s])", Duration::from_secs(5));
    assert_near("rate(x_total[5s])", rate, PER_SECOND);
    let up = wait_for_value(&prometheus, r#"up{job="shaper"}"#, Duration::from_secs(5));
    assert!((up - 1.0).abs() < f64::EPSILON, "up = {up}");
}

/// A leaf sending 1000 bytes per second since `elapsed` began, and its parent.
fn snapshot(elapsed: Duration) -> Snapshot {
    let bytes = u64::try_from(elapsed.as_millis()).expect("test runs for less than 500 million years");
    let packets = bytes / 100;
    let mut delay_buckets = vec![0; DELAY_BUCKETS];
    // Half without delay, half delayed by 0.5-1 ms (bucket 3).
    delay_buckets[0] = packets - packets / 2;
    delay_buckets[3] = packets / 2;
    let leaf = ClassStatus {
        interface: "lan0".into(),
        name: "alex".into(),
        leaf: true,
        bytes,
        packets,
        rate: Rate::from_bits_per_sec(8000),
        ceil: Rate::from_bits_per_sec(80_000),
        allocation: Rate::from_bits_per_sec(16_000),
        pacing_rate: Rate::from_bits_per_sec(16_000),
        delay_buckets,
        delay_ns_total: packets / 2 * 750_000,
        ..ClassStatus::default()
    };
    let inner = ClassStatus {
        interface: "lan0".into(),
        name: "home".into(),
        rate: Rate::from_bits_per_sec(80_000),
        ceil: Rate::from_bits_per_sec(800_000),
        allocation: Rate::from_bits_per_sec(80_000),
        ..ClassStatus::default()
    };
    Snapshot { generation: 7, classes: vec![leaf, inner], ..Snapshot::default() }
}

#[test]
fn prometheus_reads_shapers_exposition() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("binding 127.0.0.1:0");
    let target = listener.local_addr().expect("local address").to_string();
    listener.set_nonblocking(true).expect("non-blocking listener, as tokio wants it");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("tokio runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::from_std(listener).expect("tokio listener");
            let start = Instant::now();
            let shutdown = async {
                let _ = stopped.await;
            };
            serve(listener, Arc::new(Metrics::new()), move || async move { snapshot(start.elapsed()) }, shutdown).await;
        });
    });

    let prometheus = Prometheus::start(&target, SCRAPE_INTERVAL);
    prometheus.wait_for_targets_up(Duration::from_secs(15));
    let leaf = r#"interface="lan0",class="alex""#;

    let bytes = format!("shaper_class_bytes_total{{{leaf}}}");
    wait_for_samples(&prometheus, &bytes, "5s", 5.0);
    let rate = wait_for_value(&prometheus, &format!("rate({bytes}[5s])"), Duration::from_secs(5));
    assert_near("rate(shaper_class_bytes_total[5s])", rate, PER_SECOND);
    let generation = wait_for_value(&prometheus, "shaper_config_generation", Duration::from_secs(5));
    assert!((generation - 7.0).abs() < f64::EPSILON, "shaper_config_generation = {generation}");
    let ceil =
        wait_for_value(&prometheus, r#"shaper_class_ceil_bytes_per_second{class="home"}"#, Duration::from_secs(5));
    assert!((ceil - 100_000.0).abs() < f64::EPSILON, "ceil of home = {ceil}");

    // The histogram arrives whole: 16 buckets, and quantiles fall in the buckets that hold them.
    let buckets = prometheus.query(&format!("shaper_class_added_delay_seconds_bucket{{{leaf}}}"));
    assert_eq!(buckets.as_array().map(Vec::len), Some(DELAY_BUCKETS), "{buckets}");
    let p90 = wait_for_value(
        &prometheus,
        &format!("histogram_quantile(0.9, rate(shaper_class_added_delay_seconds_bucket{{{leaf}}}[5s]))"),
        Duration::from_secs(5),
    );
    assert!((0.0005..=0.001).contains(&p90), "p90 of the added delay = {p90} s, expected in (0.5 ms, 1 ms]");
    // Inner classes have gauges only.
    let inner_bytes = prometheus.query(r#"shaper_class_bytes_total{class="home"}"#);
    assert_eq!(inner_bytes, Value::Array(Vec::new()), "an inner class with a byte counter");

    drop(prometheus);
    stop.send(()).expect("metrics server still running");
    server.join().expect("metrics server thread");
}
