//! `cargo xtask demo`: the roommates of seed 000 on a gateway built from network namespaces,
//! replaying the seed's timelines through shaperd with `config/roommates.toml`.
//!
//! Alex (192.168.1.110), Betty (.111), Carl (.112) and a guest (.113) send UDP (as in the
//! seed; `--tcp` for TCP) through a gateway whose uplink `lan0` is shaped by shaperd; the
//! server measures what arrives. For each timeline the demo prints the measured wire rates
//! of each phase next to what HTB's rules give, and draws the per-class throughput over time
//! into a PNG. Needs root and a kernel with `sch_fq` (`cargo xtask demo` boots one in a VM
//! when the host has none).
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "figures for reports"
)]

use std::{path::PathBuf, process::Child, thread::sleep, time::Duration, time::Instant};

use clap::Parser;
use shaper::config::Config;
use shaper_tests::{
    chart::{self, Series},
    gateway::{receiver_intervals, require_fq, Topology, UDP_PAYLOAD, WIRE_PER_GOODPUT, WIRE_PER_UDP_GOODPUT},
};

#[derive(Parser)]
struct Args {
    /// Configuration (default: config/roommates.toml).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Where the charts go.
    #[arg(long, default_value = "target/demo")]
    out: PathBuf,
    /// TCP flows instead of the seed's UDP.
    #[arg(long)]
    tcp: bool,
}

const HOSTS: [&str; 4] = ["192.168.1.110", "192.168.1.111", "192.168.1.112", "192.168.1.113"];
const NAMES: [&str; 4] = ["alex", "betty", "carl", "guest"];

/// One sender: host index, start (s), duration (s), wire rate limit (None: as fast as it can).
struct Flow(usize, f64, u32, Option<f64>);

/// A phase to report: its time window and the expected rate of each host (mbit/s, None when
/// the host is idle then).
struct Phase(&'static str, f64, f64, [Option<f64>; 4]);

struct Timeline {
    name: &'static str,
    title: &'static str,
    flows: Vec<Flow>,
    phases: Vec<Phase>,
}

fn timelines() -> Vec<Timeline> {
    vec![
        Timeline {
            name: "all-four",
            title: "Everyone at once: guarantees 1.9 / 2.9 / 4.9 / 0.3 mbit/s",
            flows: vec![Flow(0, 0.0, 12, None), Flow(1, 0.0, 12, None), Flow(2, 0.0, 12, None), Flow(3, 0.0, 12, None)],
            phases: vec![Phase("all four", 3.0, 11.0, [Some(1.9), Some(2.9), Some(4.9), Some(0.3)])],
        },
        Timeline {
            name: "guest-joins",
            title: "Alex alone, then a guest joins (prio 0 borrows first)",
            flows: vec![Flow(0, 0.0, 20, None), Flow(3, 10.0, 10, None)],
            phases: vec![
                Phase("alex alone", 2.0, 9.5, [Some(10.0), None, None, None]),
                Phase("alex + guest", 12.0, 19.5, [Some(1.9), None, None, Some(8.1)]),
            ],
        },
        Timeline {
            name: "carl-joins",
            title: "Alex and Betty; Carl joins at 2.5 mbit/s, then wants all he can get",
            flows: vec![
                Flow(0, 0.0, 19, None),
                Flow(1, 0.0, 19, None),
                Flow(2, 6.0, 6, Some(2.5e6)),
                Flow(2, 12.0, 7, None),
            ],
            phases: vec![
                Phase("alex + betty", 2.0, 5.5, [Some(3.96), Some(6.04), None, None]),
                Phase("carl sends 2.5", 8.0, 11.5, [Some(2.97), Some(4.53), Some(2.5), None]),
                Phase("carl greedy", 14.0, 18.5, [Some(1.96), Some(2.99), Some(5.05), None]),
            ],
        },
    ]
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let config_path =
        args.config.unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../config/roommates.toml"));
    let text = std::fs::read_to_string(&config_path)?;
    let config = Config::parse(&text, &config_path)?;
    require_fq();
    std::fs::create_dir_all(&args.out)?;
    let factor = if args.tcp { WIRE_PER_GOODPUT } else { WIRE_PER_UDP_GOODPUT };

    println!(
        "topology: home (192.168.1.110-113) -- home0 | gateway | lan0 (shaped egress, {}) -- server {}",
        config.interfaces[0].rate,
        shaper_tests::gateway::SERVER
    );
    let topo = Topology::new("shaper-demo", "home0", "lan0", "192.168.1", &HOSTS);
    let mut daemon = topo.shaperd(&text);
    println!("shaperd is running with {}; flows are {}", config_path.display(), if args.tcp { "TCP" } else { "UDP" });

    for (t, timeline) in timelines().iter().enumerate() {
        println!();
        println!("== {} ==", timeline.title);
        let port = |f: usize| 5201 + u16::try_from(t * 10 + f).expect("few flows");
        let servers: Vec<Child> = (0..timeline.flows.len()).map(|f| topo.iperf_server(port(f))).collect();
        let start = Instant::now();
        let mut running = Vec::new();
        let mut order: Vec<usize> = (0..timeline.flows.len()).collect();
        order.sort_by(|a, b| timeline.flows[*a].1.total_cmp(&timeline.flows[*b].1));
        for f in order {
            let Flow(host, at, seconds, limit) = &timeline.flows[f];
            sleep(Duration::from_secs_f64(*at).saturating_sub(start.elapsed()));
            let offset = start.elapsed().as_secs_f64();
            let mut extra: Vec<String> = Vec::new();
            if !args.tcp {
                extra.extend(["-u".into(), "-l".into(), UDP_PAYLOAD.into(), "-b".into(), "20M".into()]);
            }
            if let Some(bits) = limit {
                extra.retain(|a| a != "-b" && a != "20M");
                extra.extend(["-b".into(), format!("{}", (bits / factor) as u64)]);
            }
            let extra: Vec<&str> = extra.iter().map(String::as_str).collect();
            running.push((*host, offset, topo.iperf_client_with(HOSTS[*host], port(f), *seconds, "0.5", &extra)));
        }
        // (host, time, wire mbit/s) for every half second of every flow.
        let mut points: Vec<(usize, f64, f64)> = Vec::new();
        for (host, offset, client) in running {
            for i in receiver_intervals(client) {
                points.push((host, offset + f64::midpoint(i.start, i.end), i.bits_per_second * factor / 1e6));
            }
        }
        for mut s in servers {
            let _ = s.wait();
        }

        println!("{:<16} {:>18} {:>18} {:>18} {:>18}", "phase", NAMES[0], NAMES[1], NAMES[2], NAMES[3]);
        for Phase(label, from, to, expected) in &timeline.phases {
            let cells: Vec<String> = (0..4)
                .map(|h| {
                    let sel: Vec<f64> =
                        points.iter().filter(|p| p.0 == h && p.1 >= *from && p.1 <= *to).map(|p| p.2).collect();
                    match expected[h] {
                        Some(e) if !sel.is_empty() => {
                            format!("{:.2} ({:.2})", sel.iter().sum::<f64>() / sel.len() as f64, e)
                        }
                        _ => "-".into(),
                    }
                })
                .collect();
            println!("{label:<16} {:>18} {:>18} {:>18} {:>18}", cells[0], cells[1], cells[2], cells[3]);
        }
        let series: Vec<Series> = (0..4)
            .filter(|h| points.iter().any(|p| p.0 == *h))
            .map(|h| {
                let mut pts: Vec<(f64, f64)> = points.iter().filter(|p| p.0 == h).map(|p| (p.1, p.2)).collect();
                pts.sort_by(|a, b| a.0.total_cmp(&b.0));
                Series { name: NAMES[h].into(), points: pts }
            })
            .collect();
        let png = args.out.join(format!("{}.png", timeline.name));
        chart::draw(&png, timeline.title, &series, 11.0)?;
        println!("(measured (expected) wire mbit/s; chart: {})", png.display());
        sleep(Duration::from_secs(1));
    }
    println!();
    println!("$ shaperctl status");
    print!("{}", String::from_utf8_lossy(&topo.ctl(&["status"]).stdout));
    daemon.stop();
    Ok(())
}
