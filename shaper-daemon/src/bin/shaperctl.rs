//! shaperctl: runtime control of shaperd over its Unix socket.

#![deny(unsafe_code)]

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    process::ExitCode,
    time::Duration,
};

use clap::{CommandFactory as _, Parser, Subcommand};
use shaper::{
    api::{ApiError, ClassStatus, Client, Request, Response, SocketError, Status, DEFAULT_SOCKET, SOCKET_ENV},
    config::Config,
    rate::Rate,
    ErrorChain,
};

/// Runtime control of shaperd.
#[derive(Parser, Debug)]
#[command(name = "shaperctl", version, about)]
struct Args {
    /// shaperd's control socket.
    #[arg(long, global = true, env = SOCKET_ENV, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// The class tree: rate, ceil, allocation (`+`: held back by it, offered any spare),
    /// measured throughput, drops, ECN marks, p99 added delay.
    Status {
        /// Print the daemon's JSON reply (rates in bits per second).
        #[arg(long)]
        json: bool,
    },
    /// The status, refreshed every interval until interrupted.
    Top {
        /// Seconds between refreshes.
        #[arg(long, default_value_t = 1.0, value_parser = parse_interval)]
        interval: f64,
        /// Stop after this many refreshes.
        #[arg(long, short = 'n')]
        iterations: Option<u64>,
    },
    /// Set a class's guaranteed rate, e.g. `shaperctl set-rate alex 2mbit`.
    SetRate {
        /// Class name.
        class: String,
        /// Rate in tc's spelling: 500kbit, 2mbit, 1gbit, 125kbps (bytes/s)...
        rate: Rate,
        /// Also have shaperd write the change into its configuration file, keeping its
        /// comments, layout and permissions (without it, `status` lists the change as unsaved
        /// and a reload undoes it).
        #[arg(long)]
        save: bool,
    },
    /// Set a class's ceiling, e.g. `shaperctl set-ceil guest 5mbit`.
    SetCeil {
        /// Class name.
        class: String,
        /// Rate in tc's spelling.
        ceil: Rate,
        /// Also write the change into the configuration file.
        #[arg(long)]
        save: bool,
    },
    /// Set a class's priority (0-7, lower is offered spare bandwidth first).
    SetPrio {
        /// Class name.
        class: String,
        /// Priority.
        prio: u8,
        /// Also write the change into the configuration file.
        #[arg(long)]
        save: bool,
    },
    /// Make shaperd re-read its configuration file (as SIGHUP does). A file with errors is
    /// refused and the running configuration stays in force.
    Reload,
    /// Validate a configuration file without applying it.
    Check {
        /// The file.
        file: PathBuf,
    },
    /// Print a shell completion script.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff).
    Man,
}

fn parse_interval(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|e| format!("{e}"))?;
    if (0.1..=3600.0).contains(&v) {
        Ok(v)
    } else {
        Err("the interval must be between 0.1 and 3600 seconds".into())
    }
}

/// A failure, and the exit code it maps to: 2 when shaperd could not be reached, 1 otherwise.
enum Failure {
    Socket(SocketError),
    Api(ApiError),
    Other(String),
}

fn print_chain(e: &dyn std::error::Error) {
    eprintln!("shaperctl: {e}");
    let mut source = e.source();
    while let Some(s) = source {
        eprintln!("  caused by: {s}");
        source = s.source();
    }
}

async fn call(socket: &Path, request: &Request) -> Result<Response, Failure> {
    let mut client = Client::connect(socket).await.map_err(Failure::Socket)?;
    client.call(request).await.map_err(Failure::Socket)?.map_err(Failure::Api)
}

fn rate_cell(r: shaper::rate::Rate) -> String {
    r.to_string()
}

fn delay_cell(c: &ClassStatus) -> String {
    match c.p99_delay_us {
        None => "-".into(),
        Some(u64::MAX) => "> 2 s".into(),
        Some(us) if us >= 1000 => format!("<= {} ms", us / 1000),
        Some(us) => format!("<= {us} us"),
    }
}

/// Classes in tree order (each class after its parent), with their depth.
fn tree_order(status: &Status) -> Vec<(usize, &ClassStatus)> {
    fn visit<'a>(
        status: &'a Status,
        parent: Option<&str>,
        iface: &str,
        depth: usize,
        out: &mut Vec<(usize, &'a ClassStatus)>,
    ) {
        for c in status.classes.iter().filter(|c| c.interface == iface && c.parent.as_deref() == parent) {
            out.push((depth, c));
            visit(status, Some(&c.name), iface, depth + 1, out);
        }
    }
    let mut ifaces: Vec<&str> = Vec::new();
    for c in &status.classes {
        if !ifaces.contains(&c.interface.as_str()) {
            ifaces.push(&c.interface);
        }
    }
    let mut out = Vec::new();
    for iface in ifaces {
        visit(status, None, iface, 0, &mut out);
    }
    out
}

fn render_status(status: &Status) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(out, "config {} (generation {})", status.config.display(), status.generation);
    for change in &status.unsaved {
        let _ = writeln!(out, "unsaved: {change} (set-* --save writes a change; reload drops it)");
    }
    let _ = writeln!(
        out,
        "{:<20} {:<8} {:>4} {:>10} {:>10} {:>10} {:>10} {:>9} {:>8} {:>9} {:>10}",
        "CLASS", "IFACE", "PRIO", "RATE", "CEIL", "ALLOC", "MEASURED", "DROPS", "ECN", "P99 DELAY", "BYTES"
    );
    for (depth, c) in tree_order(status) {
        let name = format!("{}{}", "  ".repeat(depth), c.name);
        let (measured, drops, ecn, delay) = if c.leaf {
            (rate_cell(c.throughput), c.drops.to_string(), c.ecn_marks.to_string(), delay_cell(c))
        } else {
            ("-".into(), "-".into(), "-".into(), "-".into())
        };
        let _ = writeln!(
            out,
            "{name:<20} {:<8} {:>4} {:>10} {:>10} {:>10} {:>10} {drops:>9} {ecn:>8} {delay:>9} {:>10}",
            c.interface,
            c.prio,
            rate_cell(c.rate),
            rate_cell(c.ceil),
            // A `+` marks a class held back by its rate: it is offered any spare bandwidth.
            format!("{}{}", rate_cell(c.allocation), if c.limited { "+" } else { "" }),
            measured,
            c.bytes
        );
    }
    out
}

async fn change(socket: &Path, request: Request) -> Result<(), Failure> {
    let response = call(socket, &request).await?;
    if let Response::Changed { generation, changes, saved } = &response {
        for c in changes {
            println!("{c}");
        }
        if changes.is_empty() {
            println!("no change");
        }
        println!("generation {generation}");
        if let Some(path) = saved {
            println!("saved to {}", path.display());
        }
    }
    Ok(())
}

async fn execute(args: Args) -> Result<(), Failure> {
    let socket = args.socket.as_path();
    match args.command {
        Command::Status { json } => {
            let Response::Status(status) = call(socket, &Request::Status {}).await? else {
                return Err(Failure::Other("shaperd answered status with something else".into()));
            };
            if json {
                println!("{}", serde_json::to_string_pretty(&status).expect("status serializes"));
            } else {
                print!("{}", render_status(&status));
            }
        }
        Command::Top { interval, iterations } => {
            let mut client = Client::connect(socket).await.map_err(Failure::Socket)?;
            let mut n = 0;
            loop {
                let reply = client.call(&Request::Status {}).await.map_err(Failure::Socket)?;
                let Response::Status(status) = reply.map_err(Failure::Api)? else {
                    return Err(Failure::Other("shaperd answered status with something else".into()));
                };
                let mut stdout = std::io::stdout().lock();
                // Clear the screen and go home, as top does.
                let _ = write!(stdout, "\x1b[H\x1b[2J{}", render_status(&status));
                let _ = stdout.flush();
                n += 1;
                if iterations.is_some_and(|i| n >= i) {
                    break;
                }
                tokio::time::sleep(Duration::from_secs_f64(interval)).await;
            }
        }
        Command::SetRate { class, rate, save } => change(socket, Request::SetRate { class, rate, save }).await?,
        Command::SetCeil { class, ceil, save } => change(socket, Request::SetCeil { class, ceil, save }).await?,
        Command::SetPrio { class, prio, save } => change(socket, Request::SetPrio { class, prio, save }).await?,
        Command::Reload => change(socket, Request::Reload {}).await?,
        Command::Check { file } => {
            let config = Config::load(&file).map_err(|e| Failure::Other(ErrorChain(&e).to_string()))?;
            println!("{}", config.summary());
        }
        Command::Completions { shell } => {
            clap_complete::generate(shell, &mut Args::command(), "shaperctl", &mut std::io::stdout());
        }
        Command::Man => {
            clap_mangen::Man::new(Args::command())
                .render(&mut std::io::stdout())
                .map_err(|e| Failure::Other(format!("writing the man page: {e}")))?;
        }
    }
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match execute(Args::parse()).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Socket(e)) => {
            print_chain(&e);
            ExitCode::from(2)
        }
        Err(Failure::Api(e)) => {
            eprintln!("shaperctl: {e}");
            ExitCode::FAILURE
        }
        Err(Failure::Other(text)) => {
            eprintln!("shaperctl: {text}");
            ExitCode::FAILURE
        }
    }
}
