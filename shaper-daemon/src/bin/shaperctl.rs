//! shaperctl: runtime control of shaperd over its Unix socket.

use std::{path::PathBuf, process::ExitCode};

use clap::{Parser, Subcommand};
use shaper::{
    api::{Client, Request, Response, Status, DEFAULT_SOCKET, SOCKET_ENV},
    rate::Rate,
};

/// Runtime control of shaperd.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// shaperd's control socket.
    #[arg(long, global = true, env = SOCKET_ENV, default_value = DEFAULT_SOCKET, value_name = "PATH")]
    socket: PathBuf,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Every class: configured rate and ceil, current rate, counters.
    Status {
        /// Print the daemon's JSON reply (rates in bits per second).
        #[arg(long)]
        json: bool,
    },
    /// Set a class's guaranteed rate, e.g. `shaperctl set-rate alex 2mbit`.
    SetRate {
        /// Class name.
        class: String,
        /// Rate in tc's spelling: 500kbit, 2mbit, 1gbit, 125kbps (bytes/s)...
        rate: Rate,
    },
}

fn print_status(status: &Status) {
    println!(
        "{:<16} {:<10} {:>10} {:>10} {:>10} {:>14} {:>10} {:>8} {:>10}",
        "CLASS", "IFACE", "RATE", "CEIL", "CURRENT", "BYTES", "PACKETS", "DROPS", "DELAY(us)"
    );
    for c in &status.classes {
        let name = match &c.parent {
            Some(_) => format!("  {}", c.name),
            None => c.name.clone(),
        };
        let current = if c.leaf { c.current_rate.to_string() } else { "-".into() };
        println!(
            "{:<16} {:<10} {:>10} {:>10} {:>10} {:>14} {:>10} {:>8} {:>10}",
            name,
            c.interface,
            c.rate.to_string(),
            c.ceil.to_string(),
            current,
            c.bytes,
            c.packets,
            c.drops,
            c.mean_delay_us
        );
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    let args = Args::parse();
    let request = match &args.command {
        Command::Status { .. } => Request::Status {},
        Command::SetRate { class, rate } => Request::SetRate { class: class.clone(), rate: *rate },
    };
    let reply = async {
        let mut client = Client::connect(&args.socket).await?;
        client.call(&request).await
    }
    .await;
    match reply {
        Err(e) => {
            eprintln!("shaperctl: {e}");
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                eprintln!("  caused by: {s}");
                source = s.source();
            }
            ExitCode::from(2)
        }
        Ok(Err(e)) => {
            eprintln!("shaperctl: {e}");
            ExitCode::FAILURE
        }
        Ok(Ok(response)) => {
            match (&args.command, &response) {
                (Command::Status { json: true }, Response::Status(s)) => {
                    println!("{}", serde_json::to_string_pretty(s).expect("status serializes"));
                }
                (_, Response::Status(s)) => print_status(s),
                (_, Response::Applied { class, rate }) => println!("{class}: rate {rate}"),
            }
            ExitCode::SUCCESS
        }
    }
}
