//! Link sharing under real traffic types: a steady UDP stream above its guarantee, rate-limited
//! and application-limited TCP, on/off bursts, a hundred sparse flows against a ceiling, small
//! packets flooding a best-effort class, and the queueing delay bulk TCP flows see.
//!
//! Every scenario runs twice, each time on a fresh roommates topology (`lan0` shaped on the
//! gateway's egress): through shaper, and through the tree a hand-written tc script would build
//! from the same configuration (HTB, with `fq_codel` under each leaf), in the same VM run. Both
//! figures are printed side by side; shaper's are asserted (HTB's only where a test says so).
//! The server's ACKs are delayed by 20 ms, as in the latency test, so that TCP runs at an
//! internet round trip rather than the VM's fraction of a millisecond.
//!
//! Rates are wire rates (Ethernet frame without FCS, as shaper and the qdiscs count them) over
//! the steady part of each flow: TCP and iperf3's UDP from the iperf3 receiver's goodput, the
//! test's own UDP flows (steady, on/off, sparse) from the kernel receive time of each datagram;
//! the link's figure is what the root qdisc sent over the same part, read over netlink.
//!
//! Timing (TCG, 2 vCPUs): each test takes about a minute of VM time (the one with two rows a
//! minute and a half), a third of it in the runs of 10 s, the rest building and removing
//! namespaces and starting shaperd (10 to 20 s).

use std::{
    collections::HashMap,
    path::Path,
    process::Child,
    thread::{sleep, JoinHandle},
    time::{Duration, Instant},
};

use shaper::config::Config;
use shaper_tests::{
    gateway::{
        goodput, htb_fq_codel_commands, iperf_result, monotonic_secs, require_fq, sleep_until, tcp_connections, Daemon,
        Topology, UdpLoad, UdpReceiver, UdpSent, UDP_WIRE_HEADERS, WIRE_PER_GOODPUT,
    },
    htb::Htb,
};

use super::{roommates, HOSTS, LATENCY_CONFIG, ROOMMATES};

/// Length of every iperf3 run, seconds.
const RUN: u32 = 10;
/// The steady part, in seconds into each iperf3 flow: after TCP's start-up and the
/// allocator's first windows, before the last (partial) second.
const FROM: f64 = 3.0;
const TO: f64 = 9.0;
/// iperf3 begins its data flows about half a second after it is started (its control
/// exchange, in the emulated VM): the test's own UDP flows start that much after the clients,
/// and the windows taken on the clock (theirs and the link's) that much later than `FROM`.
const CONTROL_EXCHANGE: f64 = 0.5;
/// What the server's ACKs are delayed by, so that TCP sees an internet round trip rather
/// than the VM's fraction of a millisecond (see `Topology::delay_server_tcp`).
const ACK_DELAY_MS: u32 = 20;
/// The link of every configuration here, bit/s.
const LINK: f64 = 10e6;
const MBIT: f64 = 1e6;

/// What one host sends.
#[derive(Clone, Copy, Debug)]
enum Source {
    /// One iperf3 TCP flow, as fast as it can.
    GreedyTcp,
    /// `n` parallel iperf3 TCP flows (`-P n`), as fast as they can.
    GreedyTcpFlows(u32),
    /// iperf3 TCP at this wire rate (bit/s), in 16 KB writes: iperf3's default 128 KB writes
    /// make a rate-limited sender burst for 200 ms at a time at 5 mbit/s.
    TcpAt(f64),
    /// UDP at this wire rate (bit/s), in evenly spaced datagrams of `payload` bytes, sent by
    /// the test itself: an iperf3 UDP client at a couple of mbit/s keeps a fifth of an
    /// emulated CPU busy.
    UdpAt { wire: f64, payload: usize },
    /// iperf3 UDP at `bandwidth` (iperf3's `-b`: goodput), in datagrams of `payload` bytes.
    UdpFlood { payload: usize, bandwidth: &'static str },
    /// Full-size UDP datagrams at `wire` bit/s during the first `on` seconds of each `period`
    /// (sent by the test itself: iperf3 has no on/off, and a new client per burst spends half
    /// a second on its control exchange in the VM).
    OnOff { wire: f64, on: f64, period: f64 },
    /// `flows` UDP flows (one socket and destination port each), each sending one full-size
    /// datagram every `interval` seconds, their sends spread evenly (sent by the test).
    Sparse { flows: u16, interval: f64 },
}

impl Source {
    fn describe(self) -> String {
        match self {
            Self::GreedyTcp => "greedy TCP".to_owned(),
            Self::GreedyTcpFlows(n) => format!("{n} greedy TCP"),
            Self::TcpAt(w) => format!("TCP at {:.2}", w / MBIT),
            Self::UdpAt { wire, payload } => format!("UDP {:.3} ({payload} B)", wire / MBIT),
            Self::UdpFlood { payload, bandwidth } => format!("UDP -b {bandwidth} ({payload} B)"),
            Self::OnOff { wire, on, period } => format!("UDP {:.1} on {on}/{period} s", wire / MBIT),
            Self::Sparse { flows, interval } => format!("{flows} UDP flows, 1/{:.0}ms", interval * 1e3),
        }
    }

    /// iperf3 client options and wire bytes per goodput byte, for the iperf3 sources.
    fn iperf_args(self) -> Option<(Vec<String>, f64)> {
        let udp = |payload: usize, bandwidth: String| {
            let factor = (payload + UDP_WIRE_HEADERS) as f64 / payload as f64;
            (vec!["-u".to_owned(), "-l".to_owned(), payload.to_string(), "-b".to_owned(), bandwidth], factor)
        };
        // (UDP at a set rate, on/off and sparse flows are sent by the test: `udp_load`.)
        match self {
            Self::GreedyTcp => Some((Vec::new(), WIRE_PER_GOODPUT)),
            Self::GreedyTcpFlows(n) => Some((vec!["-P".to_owned(), n.to_string()], WIRE_PER_GOODPUT)),
            Self::TcpAt(wire) => Some((
                vec![
                    "-b".to_owned(),
                    format!("{}", (wire / WIRE_PER_GOODPUT) as u64),
                    "-l".to_owned(),
                    "16K".to_owned(),
                ],
                WIRE_PER_GOODPUT,
            )),
            Self::UdpFlood { payload, bandwidth } => Some(udp(payload, bandwidth.to_owned())),
            Self::UdpAt { .. } | Self::OnOff { .. } | Self::Sparse { .. } => None,
        }
    }

    /// The test's own UDP load from `src` to `ports`, for the sources iperf3 cannot make.
    fn udp_load(self, src: &str, ports: Vec<u16>) -> Option<UdpLoad> {
        let full = 1472;
        let seconds = f64::from(RUN);
        let src = src.to_owned();
        match self {
            Self::UdpAt { wire, payload } => Some(UdpLoad {
                src,
                ports,
                payload,
                pps_per_flow: wire / 8.0 / (payload + UDP_WIRE_HEADERS) as f64,
                on_off: None,
                seconds,
            }),
            Self::OnOff { wire, on, period } => Some(UdpLoad {
                src,
                ports,
                payload: full,
                pps_per_flow: wire / 8.0 / (full + UDP_WIRE_HEADERS) as f64,
                on_off: Some((on, period)),
                seconds,
            }),
            Self::Sparse { interval, .. } => {
                Some(UdpLoad { src, ports, payload: full, pps_per_flow: 1.0 / interval, on_off: None, seconds })
            }
            _ => None,
        }
    }

    /// Whether the test sends this load itself (rather than iperf3).
    fn is_own_udp(self) -> bool {
        matches!(self, Self::UdpAt { .. } | Self::OnOff { .. } | Self::Sparse { .. })
    }

    fn ports(self) -> u16 {
        match self {
            Self::Sparse { flows, .. } => flows,
            _ => 1,
        }
    }

    /// What the source would send with the link to itself (bit/s), for the allocator.
    fn demand(self) -> u64 {
        match self {
            Self::TcpAt(w) | Self::UdpAt { wire: w, .. } => w as u64,
            _ => u64::MAX,
        }
    }
}

/// One host's load, and the class its packets fall into.
#[derive(Clone, Copy, Debug)]
struct Flow {
    class: &'static str,
    host: &'static str,
    source: Source,
}

/// What one system made of a scenario.
#[derive(Clone, Debug, Default)]
struct Measured {
    /// Each flow's wire rate over the steady part, bit/s.
    rates: Vec<f64>,
    /// What the root qdisc sent over the steady part, bit/s.
    link: f64,
    /// With on/off flows (the first one's period): for each on phase, the most wire bytes of
    /// the test's own UDP flows, all together, that arrived within any 100 ms of its first
    /// half second (when the classes wake), and of the rest of it.
    busiest_waking: Vec<u64>,
    busiest_on: Vec<u64>,
    /// Fraction of the VM's CPU time busy over the steady part.
    cpu_busy: f64,
    /// Seconds spent building the topology and starting the shaping.
    setup: f64,
    /// What the senders said about themselves.
    notes: Vec<String>,
}

impl Measured {
    fn total(&self) -> f64 {
        self.rates.iter().sum()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum System {
    HtbFqCodel,
    Shaper,
}

/// A topology with `lan0` shaped by one system; shaperd (if any) stops before the
/// namespaces go.
struct Sut {
    daemon: Option<Daemon>,
    topo: Topology,
}

fn parse(config: &str) -> Config {
    Config::parse(config, Path::new("sharing.toml")).unwrap_or_else(|e| panic!("{e}"))
}

/// A fresh roommates topology (tag `tag`) whose `lan0` is shaped by `system` from `config`,
/// with an internet round trip for TCP.
fn build(system: System, tag: &str, config: &str) -> Sut {
    let topo = roommates(tag);
    topo.delay_server_tcp(ACK_DELAY_MS);
    let daemon = match system {
        System::HtbFqCodel => {
            topo.gw_script(&htb_fq_codel_commands(&parse(config), "lan0"));
            None
        }
        System::Shaper => Some(topo.shaperd(config)),
    };
    Sut { daemon, topo }
}

/// A started flow.
enum Running {
    Iperf { client: Child, factor: f64 },
    Udp { receiver: UdpReceiver, sender: JoinHandle<UdpSent>, load: UdpLoad },
}

/// Runs `flows` at once through whatever shapes `lan0` in `topo` (ports from `base_port`),
/// with `during(start)` alongside on a thread of its own (`start`: when the clients were
/// started, `CLOCK_MONOTONIC` seconds); returns the rates over the steady part and what
/// `during` returned.
fn run_flows<T: Send>(
    topo: &Topology,
    flows: &[Flow],
    base_port: u16,
    during: impl FnOnce(f64) -> T + Send,
) -> (Measured, T) {
    let ports = |i: usize, n: u16| -> Vec<u16> {
        let first = base_port + u16::try_from(i).expect("few flows") * 200;
        (first..first + n).collect()
    };
    // Servers and receivers first, then every client as close together as possible.
    let iperf_ports: Vec<u16> =
        (0..flows.len()).filter(|&i| !flows[i].source.is_own_udp()).map(|i| ports(i, 1)[0]).collect();
    let servers = topo.iperf_servers(&iperf_ports);
    // The UDP flows run from `CONTROL_EXCHANGE` to `CONTROL_EXCHANGE + RUN` after `start`.
    let until = monotonic_secs() + CONTROL_EXCHANGE + f64::from(RUN) + 0.5;
    let mut receivers: Vec<Option<UdpReceiver>> = flows
        .iter()
        .enumerate()
        .map(|(i, f)| f.source.is_own_udp().then(|| topo.udp_receiver(&ports(i, f.source.ports()), until)))
        .collect();
    let start = monotonic_secs();
    // iperf3 sends data once its control exchange is done; the test's own UDP flows begin then.
    let (from, to) = (start + CONTROL_EXCHANGE + FROM, start + CONTROL_EXCHANGE + TO);
    let running: Vec<Running> = flows
        .iter()
        .enumerate()
        .map(|(i, f)| {
            if let Some(load) = f.source.udp_load(f.host, ports(i, f.source.ports())) {
                let sender = topo.udp_sender(load.clone(), start + CONTROL_EXCHANGE);
                Running::Udp { receiver: receivers[i].take().expect("a receiver"), sender, load }
            } else {
                let (args, factor) = f.source.iperf_args().expect("an iperf3 source");
                let args: Vec<&str> = args.iter().map(String::as_str).collect();
                Running::Iperf { client: topo.iperf_client_with(f.host, ports(i, 1)[0], RUN, "1", &args), factor }
            }
        })
        .collect();
    let meter = topo.link_meter("lan0", from, to);
    let extra =
        std::thread::scope(|s| s.spawn(|| during(start)).join().unwrap_or_else(|e| std::panic::resume_unwind(e)));
    let link = meter.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
    let mut measured = Measured { link: link.bits_per_second, cpu_busy: link.cpu_busy, ..Measured::default() };
    let mut udp_arrivals: Vec<(f64, u64)> = Vec::new();
    for (f, r) in flows.iter().zip(running) {
        match r {
            Running::Iperf { client, factor } => {
                let result = iperf_result(client);
                measured.rates.push(goodput(&result.receiver, FROM, TO) * factor);
                measured.notes.push(format!(
                    "{} ({}): iperf3 sent {:.3} mbit/s (wire)",
                    f.class,
                    f.source.describe(),
                    result.sender_bits_per_second * factor / MBIT
                ));
            }
            Running::Udp { receiver, sender, load } => {
                let sent = sender.join().unwrap_or_else(|e| std::panic::resume_unwind(e));
                let arrivals = receiver.finish();
                measured.rates.push(arrivals.wire_rate(from, to));
                udp_arrivals.extend(
                    arrivals.times.iter().zip(&arrivals.sizes).map(|(&t, &s)| (t, (s + UDP_WIRE_HEADERS) as u64)),
                );
                let offered = sent.sent as f64 * (load.payload + UDP_WIRE_HEADERS) as f64 * 8.0 / load.seconds;
                measured.notes.push(format!(
                    "{} ({}): sent {} datagrams ({:.3} mbit/s on average), {} more than 10 ms late (worst {:.1} ms), \
                     {} send errors; {} arrived",
                    f.class,
                    f.source.describe(),
                    sent.sent,
                    offered / MBIT,
                    sent.late,
                    sent.max_lag * 1e3,
                    sent.errors,
                    arrivals.times.len()
                ));
            }
        }
    }
    for mut s in servers {
        let _ = s.wait();
    }
    udp_arrivals.sort_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((on, period)) = flows.iter().find_map(|f| match f.source {
        Source::OnOff { on, period, .. } => Some((on, period)),
        _ => None,
    }) {
        let mut phase = start + CONTROL_EXCHANGE;
        while phase + on <= start + CONTROL_EXCHANGE + f64::from(RUN) {
            measured.busiest_waking.push(busiest(&udp_arrivals, 0.1, phase, phase + 0.5));
            measured.busiest_on.push(busiest(&udp_arrivals, 0.1, phase + 0.5, phase + on));
            phase += period;
        }
    }
    (measured, extra)
}

/// The most bytes of `arrivals` ((time in seconds, bytes), sorted by time) within any
/// `window` seconds that ends in `[from, to)`.
fn busiest(arrivals: &[(f64, u64)], window: f64, from: f64, to: f64) -> u64 {
    let (mut most, mut sum, mut first) = (0, 0, 0);
    for i in 0..arrivals.len() {
        if arrivals[i].0 >= to {
            break;
        }
        sum += arrivals[i].1;
        while arrivals[i].0 - arrivals[first].0 >= window {
            sum -= arrivals[first].1;
            first += 1;
        }
        if arrivals[i].0 >= from {
            most = most.max(sum);
        }
    }
    most
}

/// Runs each row of flows in turn through `system` on one fresh topology; `during(topo, row,
/// start)` runs alongside each row.
fn measure<T: Send>(
    system: System,
    tag: &str,
    config: &str,
    rows: &[&[Flow]],
    base_port: u16,
    during: impl Fn(&Topology, usize, f64) -> T + Sync,
) -> Vec<(Measured, T)> {
    let began = Instant::now();
    let sut = build(system, tag, config);
    let setup = began.elapsed().as_secs_f64();
    let mut out = Vec::new();
    for (k, flows) in rows.iter().enumerate() {
        if k > 0 {
            // Let the queues drain and the meters see the classes idle.
            sleep(Duration::from_secs(1));
        }
        let port = base_port + u16::try_from(k).expect("few rows") * 2000;
        let (mut m, t) = run_flows(&sut.topo, flows, port, |start| during(&sut.topo, k, start));
        m.setup = setup;
        out.push((m, t));
    }
    drop(sut.daemon);
    out
}

/// Both systems on `rows`, HTB first; shaper's runs with `during` alongside.
fn compare<T: Send>(
    tag: &str,
    config: &str,
    rows: &[&[Flow]],
    base_port: u16,
    during: impl Fn(&Topology, usize, f64) -> T + Sync,
) -> Vec<(Measured, Measured, T)> {
    let htb = measure(System::HtbFqCodel, &format!("{tag}-htb"), config, rows, base_port, |_, _, _| ());
    let ours = measure(System::Shaper, tag, config, rows, base_port, during);
    htb.into_iter().zip(ours).map(|((h, ()), (o, t))| (h, o, t)).collect()
}

/// Each flow's class share (bit/s) by HTB's rules (the independent reference,
/// `shaper_tests::htb`), given that each source would send `Source::demand`; other classes
/// idle.
fn expectation(config: &str, flows: &[Flow]) -> Vec<f64> {
    let config = parse(config);
    let htb = Htb::from_config(&config);
    let demand: Vec<f64> = config
        .classes
        .iter()
        .map(|c| {
            shaper_tests::htb::want(
                flows
                    .iter()
                    .filter(|f| f.class == c.name.as_str())
                    .map(|f| f.source.demand())
                    .fold(0, u64::saturating_add),
            )
        })
        .collect();
    let shares = htb.shares(&demand);
    flows
        .iter()
        .map(|f| {
            let class =
                config.classes.iter().position(|c| c.name == f.class).unwrap_or_else(|| panic!("no class {}", f.class));
            shares[class]
        })
        .collect()
}

/// Prints a scenario's table: per flow the class, its load, the expectation (if any), HTB
/// with `fq_codel`, shaper (wire mbit/s); then the sums, the link and the senders' notes.
fn print_table(title: &str, flows: &[Flow], expected: &[Option<f64>], htb: &Measured, ours: &Measured) {
    let cell = |v: Option<f64>| v.map_or_else(|| "-".to_owned(), |v| format!("{:.3}", v / MBIT));
    println!("{title} (wire mbit/s, {FROM}–{TO} s of {RUN} s runs):");
    println!("  {:<8} {:<30} {:>9} {:>14} {:>9}", "class", "load", "expected", "HTB+fq_codel", "shaper");
    for (i, f) in flows.iter().enumerate() {
        println!(
            "  {:<8} {:<30} {:>9} {:>14} {:>9}",
            f.class,
            f.source.describe(),
            cell(expected[i]),
            cell(Some(htb.rates[i])),
            cell(Some(ours.rates[i]))
        );
    }
    println!("  {:<8} {:<30} {:>9} {:>14} {:>9}", "sum", "", "", cell(Some(htb.total())), cell(Some(ours.total())));
    println!(
        "  {:<8} {:<30} {:>9} {:>14} {:>9}",
        "link",
        "root qdisc's bytes sent",
        cell(Some(LINK)),
        cell(Some(htb.link)),
        cell(Some(ours.link))
    );
    for (label, m) in [("HTB+fq_codel", htb), ("shaper", ours)] {
        println!(
            "    {label}: VM CPUs {:.0} % busy over the measured part; topology and shaping set up in {:.1} s",
            m.cpu_busy * 100.0,
            m.setup
        );
        for n in &m.notes {
            println!("    {label}: {n}");
        }
    }
}

/// Appends a failure (with the figures) unless `ok`.
fn check(failures: &mut Vec<String>, ok: bool, what: impl FnOnce() -> String) {
    if !ok {
        failures.push(what());
    }
}

/// Checks each flow against its expectation: within 4 % (at least 0.05 mbit/s, for the
/// small classes).
fn check_shares(failures: &mut Vec<String>, label: &str, flows: &[Flow], expected: &[Option<f64>], m: &Measured) {
    check_shares_within(failures, label, flows, expected, m, 0.04);
}

/// Checks each flow against its expectation: within `share` of it (at least 0.05 mbit/s).
fn check_shares_within(
    failures: &mut Vec<String>,
    label: &str,
    flows: &[Flow],
    expected: &[Option<f64>],
    m: &Measured,
    share: f64,
) {
    for (i, f) in flows.iter().enumerate() {
        if let Some(e) = expected[i] {
            let tolerance = (e * share).max(0.05 * MBIT);
            check(failures, (m.rates[i] - e).abs() <= tolerance, || {
                format!(
                    "{label}: {} got {:.3} mbit/s, expected {:.3} ± {:.3}",
                    f.class,
                    m.rates[i] / MBIT,
                    e / MBIT,
                    tolerance / MBIT
                )
            });
        }
    }
}

/// The nearest-rank `q` quantile of `v` (sorted here).
pub(crate) fn quantile(v: &[f64], q: f64) -> f64 {
    assert!(!v.is_empty(), "no samples");
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((q * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// Each named class's pacing rate (`pacing_rate`, bit/s), sampled every 100 ms over the
/// steady part.
fn sample_pacing(topo: &Topology, start: f64, classes: &[&str]) -> HashMap<String, Vec<f64>> {
    let mut series: HashMap<String, Vec<f64>> = HashMap::new();
    let mut t = start + CONTROL_EXCHANGE + FROM;
    while t < start + CONTROL_EXCHANGE + TO {
        sleep_until(t);
        let status = topo.status_now();
        for c in status.as_array().expect("classes") {
            let name = c["name"].as_str().expect("a name");
            if classes.contains(&name) {
                series.entry(name.to_owned()).or_default().push(c["pacing_rate"].as_f64().expect("pacing_rate"));
            }
        }
        t += 0.1;
    }
    series
}

/// |Δ|/rate between consecutive samples.
fn relative_changes(series: &[f64]) -> Vec<f64> {
    series.windows(2).map(|w| (w[1] - w[0]).abs() / w[0].max(1.0)).collect()
}

#[test]
fn a_steady_stream_above_its_guarantee_leaves_the_rest_to_borrowers() {
    require_fq();
    // The guest (guaranteed 0.3, prio 0) streams a steady 2 mbit/s; alex (1.9, prio 1) is
    // greedy. HTB: the guest gets its 2.0 (borrowing first), alex the other 8.0.
    let flows = [
        Flow { class: "alex", host: HOSTS[0], source: Source::GreedyTcp },
        Flow { class: "guest", host: HOSTS[3], source: Source::UdpAt { wire: 2e6, payload: 1472 } },
    ];
    let expected: Vec<Option<f64>> = expectation(ROOMMATES, &flows).into_iter().map(Some).collect();
    let mut results = compare("shaper-vm-share-steady", ROOMMATES, &[&flows], 21000, |topo, _, start| {
        sample_pacing(topo, start, &["alex", "guest"])
    });
    let (htb, ours, pacing) = results.pop().expect("one row");
    print_table("alex greedy, the guest streams 2 mbit/s of UDP", &flows, &expected, &htb, &ours);
    let mut failures = Vec::new();
    println!("  shaper's pacing rate, change between samples 100 ms apart (|Δ|/rate):");
    for class in ["alex", "guest"] {
        let series = &pacing[class];
        let changes = relative_changes(series);
        let (median, p90) = (quantile(&changes, 0.5), quantile(&changes, 0.9));
        println!(
            "    {class:<6} median {:5.2} %  p90 {:5.2} %  ({} samples, pacing {:.2}–{:.2} mbit/s)",
            median * 100.0,
            p90 * 100.0,
            series.len(),
            quantile(series, 0.0) / MBIT,
            quantile(series, 1.0) / MBIT
        );
        check(&mut failures, median < 0.02, || {
            format!("{class}'s pacing rate moves {:.2} % (median) between samples: it oscillates", median * 100.0)
        });
    }
    let (alex, guest) = (ours.rates[0], ours.rates[1]);
    check(&mut failures, (guest / 2e6 - 1.0).abs() <= 0.03, || {
        format!("guest {:.3} mbit/s, not within 3 % of its 2.0 (HTB: {:.3})", guest / MBIT, htb.rates[1] / MBIT)
    });
    check(&mut failures, alex >= 7.6e6, || {
        format!("alex {:.3} mbit/s, below 7.6 (expected 8.0; HTB: {:.3})", alex / MBIT, htb.rates[0] / MBIT)
    });
    // On a slow host the guest's datagrams come bunched (its sender late by over 10 ms a few
    // times a run), and its estimator grows its demand (pacing 2.03-3.28 mbit/s): what it is
    // allocated and does not send is lent to alex (`pacing::Leaf::kept`), as HTB lends it.
    check_link_use(&mut failures, &ours, &htb, 0.98, 0.99);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Checks the link use a scenario must reach: `of_link` of the link, or `of_htb` of what
/// HTB with `fq_codel` carried in the same VM run if that is less. On a VM whose emulated
/// CPUs fall behind, HTB too leaves the link short (9.59 mbit/s instead of its usual
/// 9.87–9.95 in the steady-stream scenario, 9.16 instead of 9.51–9.69 in the on/off one, in
/// one CI run), and what is asserted is then that shaper carries nearly what HTB does
/// (`of_htb`), as it does on a VM that keeps up.
fn check_link_use(failures: &mut Vec<String>, ours: &Measured, htb: &Measured, of_link: f64, of_htb: f64) {
    let floor = (of_link * LINK).min(of_htb * htb.total());
    check(failures, ours.total() >= floor, || {
        format!(
            "total {:.3} mbit/s, below {:.3} ({:.0} % of the link, or {:.0} % of HTB's {:.3})",
            ours.total() / MBIT,
            floor / MBIT,
            of_link * 100.0,
            of_htb * 100.0,
            htb.total() / MBIT
        )
    });
}

#[test]
fn a_rate_limited_tcp_stream_in_one_class_leaves_the_rest_to_the_others() {
    require_fq();
    // Alex and betty greedy; carl's TCP stream is capped by its application at 6 mbit/s
    // (above his 5.05 share: he is held to it) and then at 3 mbit/s (below it: what he leaves
    // goes to alex and betty in proportion to their rates).
    let caps = [6e6, 3e6];
    let rows: [[Flow; 3]; 2] = caps.map(|carl| {
        [
            Flow { class: "alex", host: HOSTS[0], source: Source::GreedyTcp },
            Flow { class: "betty", host: HOSTS[1], source: Source::GreedyTcp },
            Flow { class: "carl", host: HOSTS[2], source: Source::TcpAt(carl) },
        ]
    });
    let row_refs: Vec<&[Flow]> = rows.iter().map(<[Flow; 3]>::as_slice).collect();
    let results = compare("shaper-vm-share-capped", ROOMMATES, &row_refs, 23000, |_, _, _| ());
    let mut failures = Vec::new();
    for ((flows, (htb, ours, ())), cap) in rows.iter().zip(&results).zip(caps) {
        let expected: Vec<Option<f64>> = expectation(ROOMMATES, flows).into_iter().map(Some).collect();
        let title = format!("alex and betty greedy, carl's application sends TCP at {:.0} mbit/s", cap / MBIT);
        print_table(&title, flows, &expected, htb, ours);
        // Held to its share (6 mbit/s asked), carl's class is greedy: shares within 4 %, the
        // link 98 % full. Below it (3 mbit/s asked, in 16 KB writes), its pauses between
        // writes keep its share reserved (it is paced at its guarantee when it writes again),
        // and what it leaves idle is lent to the greedy classes: measured alex 2.66–2.75, link
        // 9.80–9.88 (HTB + fq_codel 2.77–3.11, 9.87–9.92).
        let (tolerance, floor) = if cap > 5.05 * MBIT { (0.04, 0.98) } else { (0.06, 0.97) };
        check_shares_within(&mut failures, &title, flows, &expected, ours, tolerance);
        check(&mut failures, ours.total() >= floor * LINK, || {
            format!(
                "{title}: total {:.3} mbit/s, below {:.0} % (HTB: {:.3})",
                ours.total() / MBIT,
                floor * 100.0,
                htb.total() / MBIT
            )
        });
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn two_greedy_classes_and_a_small_stream_keep_the_link_full() {
    require_fq();
    let flows = [
        Flow { class: "alex", host: HOSTS[0], source: Source::GreedyTcp },
        Flow { class: "betty", host: HOSTS[1], source: Source::GreedyTcp },
        Flow { class: "guest", host: HOSTS[3], source: Source::UdpAt { wire: 1e6, payload: 1472 } },
    ];
    let expected: Vec<Option<f64>> = expectation(ROOMMATES, &flows).into_iter().map(Some).collect();
    let (htb, ours, ()) = compare("shaper-vm-share-small", ROOMMATES, &[&flows], 25000, |_, _, _| ()).remove(0);
    let title = "alex and betty greedy, the guest streams 1 mbit/s of UDP";
    print_table(title, &flows, &expected, &htb, &ours);
    let mut failures = Vec::new();
    check_shares(&mut failures, title, &flows, &expected, &ours);
    // 98 % of the link, as the other scenarios, or 99 % of HTB's in the same run (on a slow
    // host: 9.793 mbit/s against HTB's 9.841 in one run).
    check_link_use(&mut failures, &ours, &htb, 0.98, 0.99);
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn on_off_bursts_and_an_application_limited_stream() {
    require_fq();
    // Betty sends 4 mbit/s for a second, then nothing for a second; carl's application writes
    // 2 mbit/s; alex takes what they leave, moment by moment. Measured over three whole
    // on/off periods.
    let flows = [
        Flow { class: "alex", host: HOSTS[0], source: Source::GreedyTcp },
        Flow { class: "betty", host: HOSTS[1], source: Source::OnOff { wire: 4e6, on: 1.0, period: 2.0 } },
        Flow { class: "carl", host: HOSTS[2], source: Source::TcpAt(2e6) },
    ];
    let (htb, ours, ()) = compare("shaper-vm-share-onoff", ROOMMATES, &[&flows], 27000, |_, _, _| ()).remove(0);
    let left = |m: &Measured| LINK - m.rates[1] - m.rates[2];
    let expected = [Some(left(&ours)), Some(2e6), Some(2e6)];
    print_table("alex greedy, betty on/off, carl application-limited", &flows, &expected, &htb, &ours);
    println!(
        "  (alex's expectation: the link less what betty and carl sent; with HTB's figures {:.3})",
        left(&htb) / MBIT
    );
    let mut failures = Vec::new();
    let (alex, carl) = (ours.rates[0], ours.rates[2]);
    check(&mut failures, (carl / 2e6 - 1.0).abs() <= 0.04, || {
        format!("carl {:.3} mbit/s, not within 4 % of 2.0 (HTB: {:.3})", carl / MBIT, htb.rates[2] / MBIT)
    });
    // Measured: alex 5.08–5.51 of the 6.02 left, link 9.08–9.51 (HTB + fq_codel: 5.52–5.69,
    // 9.51–9.69; a run-to-run spread of 6 %, which the bars leave room for). Each of betty's
    // bursts is paced at her wake rate, and alex is slowed at the next tick; when she stops,
    // what nobody was given is lent to alex at once, and her share comes back once her 100 ms
    // rate falls under half of her 400 ms one (sooner would give away the share of an
    // application that only pauses between writes).
    // Ours against HTB's in the same run: 94–98 % (9.06 against 9.61 in a CI run, 9.24
    // against 9.55 in the one before; 8.92 against 9.16 on a slow VM). On a slower host, 93 %
    // (8.870 and 8.906 against 9.591 and 9.505, alex 18 % below what betty and carl left)
    // while what a class was allocated and did not send was lent only once its estimator
    // lowered it; lent at once (`pacing::Leaf::kept`), 9.343 against 9.474 (alex 5.356
    // against HTB's 5.497, one run).
    check_link_use(&mut failures, &ours, &htb, 0.90, 0.95);
    check(&mut failures, alex >= left(&ours) * 0.82, || {
        format!(
            "alex {:.3} mbit/s, more than 18 % below the {:.3} betty and carl left (HTB: {:.3} of {:.3})",
            alex / MBIT,
            left(&ours) / MBIT,
            htb.rates[0] / MBIT,
            left(&htb) / MBIT
        )
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// A 1 mbit/s class that may not borrow, next to a default class that may use the link.
const CEILING_CONFIG: &str = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "rest"

[[class]]
name = "capped"
rate = "1mbit"
ceil = "1mbit"

[[class]]
name = "rest"
rate = "9mbit"

[[rule]]
class = "capped"
src = "192.168.1.110"
"#;

#[test]
fn classes_that_wake_together_keep_to_the_link() {
    require_fq();
    // Alex, betty and carl send 8 mbit/s each for a second in two, all at the same moments:
    // five times, three classes wake together on an idle link. Each alone would get all of
    // it (their wake rate), and the allocator learns of them at its next tick. The link must
    // not carry more than its rate over any 100 ms meanwhile.
    //
    // What crosses the link as they wake depends on where the wake falls between two of
    // shaperd's 10 ms ticks. A period of exactly 2 s would keep that the same in every phase
    // of a run (one run measured 133 KB in each phase, another 142 KB); 3.7 ms more moves it
    // by 3.7 ms from phase to phase (0, 3.7, 7.4, 1.1 and 4.8 ms into a tick), so that the
    // median of the phases is that of the positions a wake can have.
    let period = 2.0037;
    let flows: Vec<Flow> = ["alex", "betty", "carl"]
        .iter()
        .zip(HOSTS)
        .map(|(&class, host)| Flow { class, host, source: Source::OnOff { wire: 8e6, on: 1.0, period } })
        .collect();
    let (htb, ours, ()) = compare("shaper-vm-share-wake", ROOMMATES, &[&flows], 29000, |_, _, _| ()).remove(0);
    // Over the on phases: HTB's shares when all three want 8 mbit/s, for the part of the
    // time they are on.
    let expected: Vec<Option<f64>> = expectation(ROOMMATES, &flows).into_iter().map(|e| Some(e / period)).collect();
    print_table("alex, betty and carl send 8 mbit/s UDP a second in two, together", &flows, &expected, &htb, &ours);
    let window = LINK / 8.0 / 10.0;
    let median = |v: &[u64]| quantile(&v.iter().map(|&b| b as f64).collect::<Vec<_>>(), 0.5);
    for (label, m) in [("HTB + fq_codel", &htb), ("shaper", &ours)] {
        println!(
            "  {label}: busiest 100 ms (receive times) of each on phase's first half second {:?} B (median {:.1} % of the link), of its second half {:?} B ({:.1} %)",
            m.busiest_waking,
            median(&m.busiest_waking) / window * 100.0,
            m.busiest_on,
            median(&m.busiest_on) / window * 100.0
        );
    }
    // Receive times in the emulated VM come late in bunches now and then, which a window
    // catches (either system, waking or not: up to 10 % over the link). So the medians of the
    // five phases are compared: the waking half second may exceed the worst steady one (ours
    // or HTB's, or HTB's waking one) by the link clock's slack (2 %) and a frame per class (a
    // new flow's first packet leaves at once). In the VM the senders do not wake in the same
    // tick: a class that wakes next to others already allocated the link took its first
    // packets' time on top of theirs (medians 133-142 KB, worst phases 150-164 KB, until the
    // borrowers waited behind the quiet classes' packets, `CLASS_BORROWING`); since, medians
    // 130-133 KB in three runs against HTB's 129-132. Without the link clock: 150 KB in one run
    // (120 % of the link).
    let reference = median(&htb.busiest_waking).max(median(&htb.busiest_on)).max(median(&ours.busiest_on));
    let bar = reference + window * 0.02 + 3.0 * 1514.0;
    let mut failures = Vec::new();
    check(&mut failures, ours.busiest_waking.len() >= 4, || {
        format!("{} on phases measured", ours.busiest_waking.len())
    });
    let waking = median(&ours.busiest_waking);
    check(&mut failures, waking <= bar, || {
        format!(
            "{waking:.0} B crossed the link in 100 ms as the classes woke (median of the phases), above {bar:.0} (the \
             busiest steady or HTB window {reference:.0} B, 2 % and three frames)"
        )
    });
    // The shares, within the usual 4 % and the wake: until the allocator has seen the classes
    // wake (its first ticks after the wake; three 10 ms ticks are allowed), the three share the
    // link as their packets arrive, a third each, rather than by their weights. Over an on
    // phase that moves a class's mean by (a third of the link - its share) * 30 ms / period:
    // +0.021 mbit/s for alex, -0.026 for carl. (Measured: alex +0.009 to +0.037 in five runs,
    // +0.054 in one, on top of the 0.05 minimum.)
    let transient = 0.030;
    for (i, f) in flows.iter().enumerate() {
        let Some(e) = expected[i] else { continue };
        let third = LINK / flows.len() as f64 / period;
        let tolerance = (e * 0.04).max(0.05 * MBIT) + (third - e).abs() * transient;
        check(&mut failures, (ours.rates[i] - e).abs() <= tolerance, || {
            format!(
                "shaper: {} got {:.3} mbit/s, expected {:.3} ± {:.3} (the wake's transient included)",
                f.class,
                ours.rates[i] / MBIT,
                e / MBIT,
                tolerance / MBIT
            )
        });
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

#[test]
fn a_ceiling_holds_against_a_hundred_sparse_flows() {
    require_fq();
    // A hundred flows, each one full-size datagram per 100 ms (12 mbit/s in all), in a class
    // capped at 1 mbit/s; each alone is sparse, together they are twelve times the ceiling.
    // A greedy TCP flow in the default class fills the rest of the link.
    let flows = [
        Flow { class: "capped", host: HOSTS[0], source: Source::Sparse { flows: 100, interval: 0.1 } },
        Flow { class: "rest", host: HOSTS[1], source: Source::GreedyTcp },
    ];
    let (htb, ours, ()) = compare("shaper-vm-share-sparse", CEILING_CONFIG, &[&flows], 31000, |_, _, _| ()).remove(0);
    // One frame per 100 ms window of slack: the measured window's edges may cut a frame's
    // worth of the class's departures either way.
    let bar = 1e6 * 1.02 + 1514.0 * 8.0 / 0.1;
    let expected = [Some(1e6), Some(9e6)];
    print_table("a hundred sparse UDP flows in a 1 mbit/s ceiling, greedy TCP beside", &flows, &expected, &htb, &ours);
    let mut failures = Vec::new();
    check(&mut failures, ours.rates[0] <= bar, || {
        format!(
            "the capped class got {:.3} mbit/s through, above its 1 mbit/s ceiling (bar {:.3}; HTB: {:.3})",
            ours.rates[0] / MBIT,
            bar / MBIT,
            htb.rates[0] / MBIT
        )
    });
    check(&mut failures, ours.link <= LINK * 1.01, || {
        format!("the link carried {:.3} mbit/s, above 10 × 1.01 (HTB: {:.3})", ours.link / MBIT, htb.link / MBIT)
    });
    assert!(failures.is_empty(), "{failures:#?}");
}

/// Seed 002's classes (link 10 mbit): voice and audio 100 kbit/s, video 1.1 mbit/s, best
/// effort 8 mbit/s and the default, which may borrow the whole link.
const SEED_002_CONFIG: &str = r#"
[[interface]]
name = "lan0"
rate = "10mbit"
default = "best"

[[class]]
name = "voip"
rate = "100kbit"

[[class]]
name = "audio"
rate = "100kbit"

[[class]]
name = "video"
rate = "1.1mbit"

[[class]]
name = "best"
rate = "8mbit"

[[rule]]
class = "voip"
src = "192.168.1.110"

[[rule]]
class = "audio"
src = "192.168.1.111"

[[rule]]
class = "video"
src = "192.168.1.112"
"#;

#[test]
fn small_packets_fill_the_link() {
    require_fq();
    // Seed 002's flows, frame sizes as in its table: voice and audio 33 frames/s of 240 bytes
    // (63 kbit/s), video 139 frames/s of 900 bytes (1 mbit/s); best effort floods 429-byte
    // datagrams at 1.3 times the link (on the wire). Five times, 50 mbit/s, as in the seed,
    // kept the emulated CPUs 95 % busy with the gateway's work: iperf3 itself then sent 5.5
    // to 22 mbit/s, and what was measured was the emulator. At twice the link they were still
    // 78-87 % busy on a slower host: iperf3 sent 9.9-15.8 mbit/s, in bursts after stalls of
    // the emulated CPUs long enough to empty the best-effort queue (through HTB too: 9.62-9.79
    // mbit/s of link use in those runs, shaper 9.13-9.67).
    let frames = |fps: f64, frame: usize| Source::UdpAt { wire: fps * frame as f64 * 8.0, payload: frame - 42 };
    let flows = [
        Flow { class: "voip", host: HOSTS[0], source: frames(33.0, 240) },
        Flow { class: "audio", host: HOSTS[1], source: frames(33.0, 240) },
        Flow { class: "video", host: HOSTS[2], source: frames(139.0, 900) },
        Flow { class: "best", host: HOSTS[3], source: Source::UdpFlood { payload: 429, bandwidth: "12M" } },
    ];
    let expected: Vec<Option<f64>> = expectation(SEED_002_CONFIG, &flows).into_iter().map(Some).collect();
    let (htb, ours, ()) =
        compare("shaper-vm-share-small-pkts", SEED_002_CONFIG, &[&flows], 33000, |_, _, _| ()).remove(0);
    let title = "seed 002: voice, audio, video streams; best effort floods 429-byte datagrams";
    print_table(title, &flows, &expected, &htb, &ours);
    let mut failures = Vec::new();
    // The constant-rate classes get what they send.
    check_shares(&mut failures, title, &flows[..3], &expected[..3], &ours);
    // 97 % of the link, or 95 % of what HTB carried in the same run if that is less. The
    // emulated CPUs are 75-87 % busy here, and shaperd itself takes about 12 % of one (its
    // ticks, under TCG: the footprint bench) that HTB, with no daemon, leaves to the senders:
    // in one run iperf3 sent 11.42 mbit/s through shaper against 13.16 through HTB, and the
    // link carried 9.369 against 9.720 (0.964 of HTB's; 0.989 and 0.997 in two other runs).
    check_link_use(&mut failures, &ours, &htb, 0.97, 0.95);
    assert!(failures.is_empty(), "{failures:#?}");
}

/// The smoothed RTTs (`ss`'s `rtt:`, ms) of the established TCP connections of the calling
/// thread's namespace to the server's `port` that carried data (iperf3's control connection
/// carries a few hundred bytes).
fn data_rtts(port: u16) -> Vec<f64> {
    tcp_connections().into_iter().filter(|c| c.dport == port && c.bytes_acked > 100_000).map(|c| c.srtt_ms).collect()
}

#[test]
fn bulk_flows_own_queueing_delay_is_no_worse_than_htb_fq_codel() {
    require_fq();
    // Four TCP flows from betty saturate the bulk class (and borrow the rest of the link);
    // the server's ACKs take 20 ms more, as in the latency test. Their own RTTs, sampled from
    // the senders' sockets, are their queueing delay at the gateway plus 20 ms.
    let flows = [Flow { class: "bulk", host: HOSTS[1], source: Source::GreedyTcpFlows(4) }];
    let port = 35000;
    let run = |system: System, tag: &str| {
        let began = Instant::now();
        // (`build` delays the server's ACKs by 20 ms, as the latency test does.)
        let sut = build(system, tag, LATENCY_CONFIG);
        let setup = began.elapsed().as_secs_f64();
        let (mut m, (rtts, p99s)) = run_flows(&sut.topo, &flows, port, |start| {
            // The senders' sockets are read over sock_diag from inside the LAN namespace.
            sut.topo.lan.enter();
            let (mut rtts, mut p99s) = (Vec::new(), Vec::new());
            let mut t = start + CONTROL_EXCHANGE + FROM;
            let mut next_status = t + 1.0;
            while t < start + CONTROL_EXCHANGE + TO {
                sleep_until(t);
                rtts.extend(data_rtts(port));
                if system == System::Shaper && monotonic_secs() >= next_status {
                    next_status += 1.0;
                    let classes = sut.topo.status_now();
                    let bulk = classes.as_array().expect("classes").iter().find(|c| c["name"] == "bulk").cloned();
                    if let Some(us) = bulk.and_then(|b| b["p99_delay_us"].as_u64()) {
                        p99s.push(us as f64 / 1e3);
                    }
                }
                t += 0.2;
            }
            (rtts, p99s)
        });
        drop(sut);
        m.setup = setup;
        (m, rtts, p99s)
    };
    let (htb, htb_rtts, _) = run(System::HtbFqCodel, "shaper-vm-share-rtt-htb");
    let (ours, our_rtts, our_p99s) = run(System::Shaper, "shaper-vm-share-rtt");
    print_table("4 bulk TCP flows, 20 ms base RTT", &flows, &[None], &htb, &ours);
    println!("  the bulk flows' smoothed RTT (ss), ms:   p50      p99      max   samples");
    for (label, v) in [("HTB+fq_codel", &htb_rtts), ("shaper", &our_rtts)] {
        assert!(v.len() >= 20, "{label}: only {} RTT samples of the data connections", v.len());
        println!(
            "    {label:<14} {:>22.2} {:>8.2} {:>8.2} {:>8}",
            quantile(v, 0.5),
            quantile(v, 0.99),
            quantile(v, 1.0),
            v.len()
        );
    }
    println!("  shaper's bulk class, datapath added delay p99 per second (histogram bucket bound): {our_p99s:?} ms");
    let (ours_p99, htb_p99) = (quantile(&our_rtts, 0.99), quantile(&htb_rtts, 0.99));
    let bar = htb_p99 * 1.1 + 2.0;
    assert!(
        ours_p99 <= bar,
        "the bulk flows' RTT p99 is {ours_p99:.2} ms through shaper, above HTB+fq_codel's {htb_p99:.2} × 1.1 + 2 ms \
         = {bar:.2} (p50 {:.2} vs {:.2})",
        quantile(&our_rtts, 0.5),
        quantile(&htb_rtts, 0.5)
    );
}

// TODO: hosts_with_unequal_connection_counts (one host with many flows next to one with a
// single flow in the same class), once the datapath isolates hosts within a class.
