//! The control plane under load: while a class shaped to 4 mbit/s carries a greedy flow,
//! shaperd's socket and its metrics port take at once waves of 1,000 concurrent `status`
//! requests (threads speaking the protocol) and 50 real `shaperctl status` processes, 120
//! clients that connect and never send a line (reconnecting whenever shaperd closes them),
//! clients sending a 100 MB line, clients that never read their replies, 50 scrapers in a loop
//! and a few slow-loris HTTP clients. Every good request must be answered correctly, shaperd's
//! memory must stay bounded, the flow's rate must not move, and the control loop must keep its
//! 10 ms period (its `shaper_allocator_tick_interval_seconds` histogram, read from /metrics
//! before and after the storm).
//!
//! Timing (TCG, 2 vCPUs): about a minute of VM time: 10 s to start, a 30 s flow with the storm
//! in its middle 15 s.

use std::{
    collections::BTreeMap,
    io::{BufRead as _, BufReader, Read as _, Write as _},
    os::unix::net::UnixStream,
    path::Path,
    process::{Command, Stdio},
    sync::{
        atomic::{AtomicU64, Ordering},
        Barrier, Mutex,
    },
    thread::sleep,
    time::{Duration, Instant},
};

use serde_json::Value;
use shaper_tests::{
    bin,
    gateway::{monotonic_secs, receiver_intervals, require_fq, sleep_until, wire_rate, Topology},
};

use super::{proc_stat_field, proc_status_kb, topology};

/// One class shaped to 4 mbit/s for the flow; the metrics port at its default, 127.0.0.1:9640
/// in the gateway's namespace; the default 10 ms tick.
const CONFIG: &str = r#"
[daemon]
tick = "10ms"

[[interface]]
name = "wan0"
rate = "100mbit"
default = "other"

[[class]]
name = "shaped"
rate = "4mbit"
ceil = "4mbit"

[[class]]
name = "other"
rate = "1mbit"

[[rule]]
class = "shaped"
src = "10.1.0.2"
"#;
const RATE: f64 = 4e6;
const METRICS: &str = "127.0.0.1:9640";

/// The flow's length and the storm within it, seconds from the flow's start.
const FLOW: u32 = 30;
const STORM_FROM: f64 = 11.0;
const STORM_TO: f64 = 26.0;

/// Concurrent requests per wave, and real shaperctl processes with each (few: under QEMU's
/// emulation, starting one costs more CPU than shaperd spends on a hundred requests).
const WAVE: usize = 1000;
const CTL_PROCESSES: usize = 10;
const STUCK: usize = 120;
const DEAF: usize = 5;
const SCRAPERS: usize = 50;
const SLOW_LORIS: usize = 3;
/// Time any good client gives shaperd before it counts as not answered.
/// (Shaperd answers within 3 s in the storm; the stuck clients stay for 15 s.)
const PATIENCE: Duration = Duration::from_secs(10);

/// What the storm's clients saw; every failure fails the test.
#[derive(Default)]
struct Tally {
    /// By kind: how many, and the first one's details.
    failures: Mutex<BTreeMap<&'static str, (u64, String)>>,
    requests: AtomicU64,
    ctl_calls: AtomicU64,
    slowest_request_ms: AtomicU64,
    stuck_closed: AtomicU64,
    long_lines: AtomicU64,
    longest_line_written: AtomicU64,
    scrapes: AtomicU64,
    slowest_scrape_ms: AtomicU64,
    loris_closed: AtomicU64,
    loris_longest_ms: AtomicU64,
}

impl Tally {
    /// One line per kind of failure.
    fn failures(&self) -> Vec<String> {
        let failures = self.failures.lock().unwrap();
        failures.iter().map(|(kind, (count, first))| format!("{kind}: {count} times, the first: {first}")).collect()
    }

    fn fail(&self, kind: &'static str, details: String) {
        let mut failures = self.failures.lock().unwrap();
        let entry = failures.entry(kind).or_insert((0, details));
        entry.0 += 1;
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Whether `reply` (one line) is a correct `status` reply of [`CONFIG`].
fn status_is_correct(reply: &str) -> bool {
    let Ok(v) = serde_json::from_str::<Value>(reply) else { return false };
    let classes = &v["Ok"]["status"]["classes"];
    classes.as_array().is_some_and(|c| c.iter().any(|c| c["name"] == "shaped" && c["ceil"] == 4_000_000))
}

/// Threads that make a wave's connections, `WAVE / WAVE_THREADS` each (a thread per
/// connection would cost the emulated CPUs more than shaperd does).
const WAVE_THREADS: usize = 20;

/// One wave: `WAVE` connections each send `status` at once, and `CTL_PROCESSES` shaperctl
/// processes start with them.
fn wave(socket: &Path, tally: &Tally) {
    let start = Barrier::new(WAVE_THREADS + 1);
    std::thread::scope(|s| {
        for _ in 0..WAVE_THREADS {
            s.spawn(|| {
                // As shaperctl does, each sends its request as it connects; all of them before
                // any reply is read.
                start.wait();
                let asked = Instant::now();
                let mut sent = Vec::new();
                for _ in 0..WAVE / WAVE_THREADS {
                    let request = UnixStream::connect(socket).and_then(|mut stream| {
                        stream.write_all(b"{\"cmd\":\"status\"}\n")?;
                        Ok(stream)
                    });
                    match request {
                        Ok(stream) => sent.push(stream),
                        Err(e) => tally.fail("status: connect and send", format!("{e}")),
                    }
                }
                for stream in sent {
                    stream
                        .set_read_timeout(Some(PATIENCE.saturating_sub(asked.elapsed()).max(Duration::from_millis(1))))
                        .unwrap();
                    let mut line = String::new();
                    match BufReader::new(stream).read_line(&mut line) {
                        Ok(_) if status_is_correct(&line) => {
                            tally.requests.fetch_add(1, Ordering::Relaxed);
                            tally.slowest_request_ms.fetch_max(millis(asked.elapsed()), Ordering::Relaxed);
                        }
                        Ok(_) => tally.fail("status: wrong reply", format!("{:.200}", line.trim_end())),
                        Err(e) => tally.fail("status: no reply", format!("after {:?}: {e}", asked.elapsed())),
                    }
                }
            });
        }
        start.wait();
        let mut ctl: Vec<_> = (0..CTL_PROCESSES)
            .map(|_| {
                Command::new(bin("shaperctl"))
                    .arg("--socket")
                    .arg(socket)
                    .args(["status", "--json"])
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("starting shaperctl")
            })
            .collect();
        let deadline = Instant::now() + PATIENCE;
        while Instant::now() < deadline && ctl.iter_mut().any(|c| c.try_wait().unwrap().is_none()) {
            sleep(Duration::from_millis(50));
        }
        for mut c in ctl.drain(..) {
            let _ = c.kill();
            let out = c.wait_with_output().unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let json: Option<Value> = serde_json::from_str(&stdout).ok();
            let ok = json.is_some_and(|v| {
                v["classes"]
                    .as_array()
                    .is_some_and(|c| c.iter().any(|c| c["name"] == "shaped" && c["ceil"] == 4_000_000))
            });
            if out.status.success() && ok {
                tally.ctl_calls.fetch_add(1, Ordering::Relaxed);
            } else {
                tally.fail(
                    "shaperctl status failed",
                    format!(
                        "{} {:.200} {:.200}",
                        out.status,
                        stdout.trim_end(),
                        String::from_utf8_lossy(&out.stderr).trim_end()
                    ),
                );
            }
        }
    });
}

/// `STUCK` connections that never send anything; each one shaperd closes is opened again
/// (a broken client that retries), until `until`.
fn stuck_clients(socket: &Path, until: f64, tally: &Tally) {
    let connect = || {
        let s = UnixStream::connect(socket).expect("connecting a stuck client");
        s.set_nonblocking(true).unwrap();
        s
    };
    let mut open: Vec<UnixStream> = (0..STUCK).map(|_| connect()).collect();
    while monotonic_secs() < until {
        sleep(Duration::from_secs(1));
        for s in &mut open {
            let mut buf = [0; 512];
            let gone = loop {
                match s.read(&mut buf) {
                    Ok(0) => break true,
                    // Shaperd's reply to a connection that sent nothing for 5 s, before it closes it.
                    Ok(_) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
                    Err(_) => break true,
                }
            };
            if gone {
                tally.stuck_closed.fetch_add(1, Ordering::Relaxed);
                *s = connect();
            }
        }
    }
}

/// Sends lines of 100 MB until `until`: each must be refused (a `bad-request` reply) before
/// more than a few MB of it were taken.
fn long_lines(socket: &Path, until: f64, tally: &Tally) {
    let chunk = vec![b'x'; 1 << 20];
    while monotonic_secs() < until {
        let mut stream = UnixStream::connect(socket).expect("connecting");
        stream.set_write_timeout(Some(PATIENCE)).unwrap();
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        let mut written: u64 = 0;
        while written < 100 << 20 {
            match stream.write(&chunk) {
                Ok(n) => written += n as u64,
                Err(_) => break,
            }
        }
        tally.longest_line_written.fetch_max(written, Ordering::Relaxed);
        let mut reply = String::new();
        let _ = BufReader::new(&stream).read_line(&mut reply);
        if written >= 8 << 20 || !reply.contains("longer than") {
            tally.fail("a 100 MB line not refused", format!("{written} bytes taken, reply {:.200}", reply.trim_end()));
        }
        tally.long_lines.fetch_add(1, Ordering::Relaxed);
        sleep(Duration::from_millis(500));
    }
}

/// Sends `status` requests and never reads a reply: shaperd must close the connection (the
/// writes then fail) within its reply timeout, plus the time to handle what came before.
fn deaf_client(socket: &Path, tally: &Tally) {
    let mut stream = UnixStream::connect(socket).expect("connecting");
    stream.set_write_timeout(Some(Duration::from_secs(30))).unwrap();
    let started = Instant::now();
    let mut sent = 0u64;
    while stream.write_all(b"{\"cmd\":\"status\"}\n").is_ok() {
        sent += 1;
    }
    if started.elapsed() > Duration::from_secs(15) {
        let details = format!("closed after {:?} ({sent} requests)", started.elapsed());
        tally.fail("a client that reads no replies kept open", details);
    }
}

/// One HTTP GET of /metrics; the whole answer.
fn scrape() -> Result<String, String> {
    let mut stream = std::net::TcpStream::connect(METRICS).map_err(|e| format!("connect: {e}"))?;
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.set_write_timeout(Some(PATIENCE)).unwrap();
    stream
        .write_all(format!("GET /metrics HTTP/1.1\r\nHost: {METRICS}\r\nConnection: close\r\n\r\n").as_bytes())
        .map_err(|e| format!("send: {e}"))?;
    let mut answer = String::new();
    stream.read_to_string(&mut answer).map_err(|e| format!("answer: {e}"))?;
    Ok(answer)
}

/// Scrapes in a loop until `until` (on a thread in the gateway's namespace).
fn scraper(until: f64, tally: &Tally) {
    while monotonic_secs() < until {
        let asked = Instant::now();
        match scrape() {
            Ok(a) if a.starts_with("HTTP/1.1 200 ") && a.contains("shaper_allocator_tick_interval_seconds_count") => {
                tally.scrapes.fetch_add(1, Ordering::Relaxed);
                tally.slowest_scrape_ms.fetch_max(millis(asked.elapsed()), Ordering::Relaxed);
            }
            Ok(a) => tally.fail("scrape: wrong answer", format!("{a:.200}")),
            Err(e) => tally.fail("scrape: no answer", format!("after {:?}: {e}", asked.elapsed())),
        }
        sleep(Duration::from_millis(50));
    }
}

/// A header that never ends, one line every 500 ms, again and again until `until`: each
/// connection must be closed within the header timeout (2 s) and some slack.
fn slow_loris(until: f64, tally: &Tally) {
    while monotonic_secs() < until {
        let mut stream = std::net::TcpStream::connect(METRICS).expect("connecting to the metrics port");
        let opened = Instant::now();
        let _ = stream.write_all(b"GET /metrics HTTP/1.1\r\n");
        stream.set_read_timeout(Some(Duration::from_millis(500))).unwrap();
        loop {
            let mut buf = [0; 256];
            match stream.read(&mut buf) {
                Ok(0) => break,
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => break,
            }
            if stream.write_all(b"X-Slow: 1\r\n").is_err() {
                break;
            }
            if opened.elapsed() > PATIENCE {
                break;
            }
        }
        let held = opened.elapsed();
        tally.loris_closed.fetch_add(1, Ordering::Relaxed);
        tally.loris_longest_ms.fetch_max(millis(held), Ordering::Relaxed);
        if held > Duration::from_secs(6) {
            tally.fail("a slow-loris scrape kept open", format!("{held:?}"));
        }
    }
}

/// The buckets (upper bound s, cumulative count) of histogram `name` in an exposition.
fn histogram(text: &str, name: &str) -> Vec<(f64, u64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            let (le, count) = l.strip_prefix(&prefix)?.split_once("\"} ")?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, count.trim().parse().ok()?))
        })
        .collect()
}

/// The bucket bound the `q` quantile lies in, of the observations between two readings of a
/// histogram, and their number.
fn quantile(before: &[(f64, u64)], after: &[(f64, u64)], q: f64) -> (f64, u64) {
    assert_eq!(before.len(), after.len(), "the same histogram twice");
    let counts: Vec<(f64, u64)> = before.iter().zip(after).map(|(b, a)| (a.0, a.1 - b.1)).collect();
    let total = counts.last().map_or(0, |c| c.1);
    let bound = counts.iter().find(|(_, c)| *c as f64 >= q * total as f64).map_or(f64::INFINITY, |c| c.0);
    (bound, total)
}

/// Raises this process's open-file limit to its hard limit: the storm holds over 1,100
/// sockets at once, past the usual soft limit of 1,024.
fn raise_open_file_limit() {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit(2)/setrlimit(2) with a valid pointer to a local rlimit.
    let ok = unsafe {
        libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) == 0 && {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) == 0
        }
    };
    let needed = (WAVE + STUCK + SCRAPERS + 200) as libc::rlim_t;
    assert!(
        ok && limit.rlim_cur >= needed,
        "the storm needs {needed} open files, the limit is {} ({})",
        limit.rlim_cur,
        std::io::Error::last_os_error()
    );
}

/// The /proc directory of shaperd's control thread.
fn control_thread(pid: u32) -> std::path::PathBuf {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("listing shaperd's threads")
        .flatten()
        .find_map(|task| {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            (comm.trim() == "shaperd-control").then(|| task.path())
        })
        .expect("shaperd's control loop has a thread of its own, shaperd-control")
}

/// Time shaperd's control thread has run and waited for a CPU, ns (its schedstat).
fn control_thread_sched(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(control_thread(pid).join("schedstat")).expect("reading schedstat");
    let v: Vec<u64> = stat.split_whitespace().map(|x| x.parse().expect("a number")).collect();
    (v[0], v[1])
}

/// The nice value of shaperd's control thread (field 19 of its stat).
fn control_thread_nice(pid: u32) -> i64 {
    proc_stat_field(&control_thread(pid).join("stat"), 19)
}

/// Runs every client of the storm at once until `until` (`CLOCK_MONOTONIC` s); returns what
/// they saw and the number of waves of requests.
fn storm(topo: &Topology, until: f64) -> (Tally, u64) {
    let socket = topo.socket();
    let tally = Tally::default();
    let waves = AtomicU64::new(0);
    std::thread::scope(|s| {
        s.spawn(|| stuck_clients(&socket, until, &tally));
        s.spawn(|| long_lines(&socket, until, &tally));
        for _ in 0..DEAF {
            s.spawn(|| deaf_client(&socket, &tally));
        }
        for _ in 0..SCRAPERS {
            s.spawn(|| {
                topo.gw.enter();
                scraper(until, &tally);
            });
        }
        for _ in 0..SLOW_LORIS {
            s.spawn(|| {
                topo.gw.enter();
                slow_loris(until, &tally);
            });
        }
        // The stuck clients take every place first.
        sleep(Duration::from_secs(1));
        s.spawn(|| {
            while monotonic_secs() < until - 3.0 {
                wave(&socket, &tally);
                waves.fetch_add(1, Ordering::Relaxed);
            }
        });
    });
    let waves = waves.into_inner();
    (tally, waves)
}

/// shaperd's /metrics, fetched from a thread in the gateway's namespace, and when.
fn metrics_now(topo: &Topology) -> (f64, String) {
    std::thread::scope(|s| {
        s.spawn(|| {
            topo.gw.enter();
            (monotonic_secs(), scrape().expect("a scrape outside the storm"))
        })
        .join()
        .unwrap()
    })
}

#[test]
fn the_control_plane_under_load_answers_every_good_request_and_shaping_keeps_its_pace() {
    require_fq();
    raise_open_file_limit();
    let topo = topology("shaper-vm-control", &["10.1.0.2"]);
    let daemon = topo.shaperd(CONFIG);

    let server = topo.iperf_server(7601);
    let t0 = monotonic_secs();
    let flow = topo.iperf_client("10.1.0.2", 7601, FLOW, "1");
    sleep_until(t0 + STORM_FROM);
    let (quiet_at, quiet) = metrics_now(&topo);
    let rss_before = proc_status_kb(daemon.pid(), "VmRSS:");
    let sched_before = control_thread_sched(daemon.pid());
    let (tally, waves) = storm(&topo, t0 + STORM_TO);
    let (stormy_at, stormy) = metrics_now(&topo);
    let sched_after = control_thread_sched(daemon.pid());
    let nice = control_thread_nice(daemon.pid());
    let hwm = proc_status_kb(daemon.pid(), "VmHWM:");
    let rss_after = proc_status_kb(daemon.pid(), "VmRSS:");
    let intervals = receiver_intervals(flow);
    drop(server);

    let before = wire_rate(&intervals, 3.0, STORM_FROM);
    let during = wire_rate(&intervals, STORM_FROM + 1.0, STORM_TO.min(stormy_at - t0));
    let interval = "shaper_allocator_tick_interval_seconds";
    let (quiet_hist, stormy_hist) = (histogram(&quiet, interval), histogram(&stormy, interval));
    let boot: Vec<(f64, u64)> = quiet_hist.iter().map(|b| (b.0, 0)).collect();
    let (p99_quiet, ticks_quiet) = quantile(&boot, &quiet_hist, 0.99);
    let (p99_storm, ticks_storm) = quantile(&quiet_hist, &stormy_hist, 0.99);
    let (p50_storm, _) = quantile(&quiet_hist, &stormy_hist, 0.5);
    let duration = "shaper_allocator_tick_duration_seconds";
    let (p99_duration, _) = quantile(&histogram(&quiet, duration), &histogram(&stormy, duration), 0.99);
    let buckets: Vec<String> =
        quiet_hist.iter().zip(&stormy_hist).map(|(b, a)| format!("{}:{}", a.0 * 1e3, a.1 - b.1)).collect();
    // Ticks the storm's time holds at the configured 10 ms.
    let expected_ticks = (stormy_at - quiet_at) / 0.010;

    let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
    println!(
        "storm {STORM_FROM}–{:.1} s: {waves} waves, {} status requests answered (slowest {} ms), {} shaperctl \
         calls; {} stuck clients closed to make room or for silence; {} lines of 100 MB refused (at most {} bytes \
         taken); {} scrapes (slowest {} ms), {} slow-loris connections closed (held at most {} ms)",
        stormy_at - t0,
        get(&tally.requests),
        get(&tally.slowest_request_ms),
        get(&tally.ctl_calls),
        get(&tally.stuck_closed),
        get(&tally.long_lines),
        get(&tally.longest_line_written),
        get(&tally.scrapes),
        get(&tally.slowest_scrape_ms),
        get(&tally.loris_closed),
        get(&tally.loris_longest_ms),
    );
    println!(
        "shaperd memory: VmRSS {rss_before} kB before, {rss_after} kB after, VmHWM {hwm} kB; tick interval p99 \
         {:.1} ms over {ticks_quiet} quiet ticks; over the storm {ticks_storm} ticks of {expected_ticks:.0}, p50 \
         {:.1} ms, p99 {:.1} ms; tick duration p99 {:.2} ms",
        p99_quiet * 1e3,
        p50_storm * 1e3,
        p99_storm * 1e3,
        p99_duration * 1e3
    );
    println!("storm tick intervals by bucket (ms:cumulative count): {}", buckets.join(" "));
    println!(
        "shaperd's control thread (nice {nice}) over the storm: {:.0} ms on a CPU, {:.0} ms waiting for one",
        (sched_after.0 - sched_before.0) as f64 / 1e6,
        (sched_after.1 - sched_before.1) as f64 / 1e6,
    );
    println!(
        "shaped flow: {:.3} mbit/s before, {:.3} mbit/s during the storm ({:+.2} %)",
        before / 1e6,
        during / 1e6,
        (during / before - 1.0) * 100.0
    );

    let mut failures = tally.failures();
    // shaperd runs as root here: its control thread may, and must, take the better nice value.
    if nice != -10 {
        failures.push(format!("the control thread's nice value is {nice}, not -10"));
    }
    if waves == 0 || get(&tally.requests) < WAVE as u64 || get(&tally.ctl_calls) < CTL_PROCESSES as u64 {
        failures.push("not even one whole wave of requests was answered".into());
    }
    if get(&tally.stuck_closed) < STUCK as u64 {
        failures.push("the stuck clients were not closed: they never took the places".into());
    }
    // Idle, shaperd holds 7-10 MB; each open connection at most MAX_LINE (64 KB) of request
    // and a reply, 64 of them; each scrape its answer, 16 at once. 40 MB leaves room for the
    // allocator's arenas and the threads' stacks, and none for buffering a 100 MB line.
    if hwm > 40 << 10 {
        failures.push(format!("shaperd's memory peaked at {hwm} kB"));
    }
    // The class's rate is its ceiling, which no tick changes: what moves the flow is the CPU
    // time its ends and the gateway's softirqs get among the storm's ~200 threads. Measured
    // over the storm: -0.05 % in CI runs on a faster host. On a host that ran the whole suite
    // 30 % slower: -3.95 % in CI; with the flow's ends at nice -5, -3.46 % in a run of the
    // whole suite and +0.05 % with the test run alone.
    if (during / before - 1.0).abs() > 0.05 || (during / RATE - 1.0).abs() > 0.05 {
        failures.push(format!("the flow ran at {:.3} mbit/s, {:.3} before the storm", during / 1e6, before / 1e6));
    }
    // On time, a tick starts 9-11 ms after the last (tokio's timer has a 1 ms resolution): the
    // median must be there, and at most one tick in ten may be skipped. The 99th percentile is
    // bounded by what the VM allows: its two CPUs are emulated (TCG) on a host that runs other
    // work, and even before the storm one interval in a hundred exceeds 15-25 ms; during it,
    // the control thread waits for a CPU among the storm's ~200 threads and shaperd's own
    // workers (it waits at the state lock for one request and one scrape at most): 1-2.3 s in
    // all at nice 0 (one CI run lost 10.04 % of its ticks so), 0.47-0.54 s at its nice -10.
    // 50 ms (five periods) at the 99th percentile still catches a control loop that waits
    // behind a queue of requests or scrapes, or for a worker of the busy runtime: those stall
    // it for 100s of ms here.
    if p50_storm > 0.011 || p99_storm > 0.050 || (ticks_storm as f64) < 0.9 * expected_ticks {
        failures.push(format!(
            "the control loop lost its pace: {ticks_storm} ticks of {expected_ticks:.0}, p50 {:.1} ms, p99 {:.1} ms",
            p50_storm * 1e3,
            p99_storm * 1e3
        ));
    }
    assert!(
        failures.is_empty(),
        "{} failures:\n{}\nshaperd's log:\n{}",
        failures.len(),
        failures.join("\n"),
        daemon.log()
    );
}
