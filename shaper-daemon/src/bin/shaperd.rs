//! shaperd: loads the shaper datapath onto the configured interfaces and serves `shaperctl`.

#![deny(unsafe_code)]

use std::{path::PathBuf, process::ExitCode};

use anyhow::Context as _;
use clap::Parser;
use shaper::{api::DEFAULT_SOCKET, config::Config, daemon};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};
use tracing_subscriber::EnvFilter;

/// The exit status after SIGUSR2 (the datapath left shaping for the next shaperd).
const HANDOVER_EXIT_STATUS: u8 = 75;

/// The shaper daemon: EDT traffic shaping with an eBPF tc program and the fq qdisc.
#[derive(Parser, Debug)]
#[command(version, about)]
struct Args {
    /// Configuration file (TOML).
    #[arg(long, short, value_name = "FILE")]
    config: PathBuf,
    /// Control socket; overrides the configuration's `[daemon] socket`.
    #[arg(long, value_name = "PATH")]
    socket: Option<PathBuf>,
    /// Validate the configuration, print a summary and exit without touching the kernel.
    #[arg(long)]
    check: bool,
    /// Where the datapath's maps (and TCX links) are pinned, on bpffs: shaping outlives
    /// shaperd (kill -9, SIGUSR2 for an upgrade) and the next shaperd takes it over.
    #[arg(long, value_name = "DIR", default_value = "/sys/fs/bpf/shaper")]
    pin_dir: PathBuf,
    /// Keep the datapath to this process: nothing pinned, nothing taken over.
    #[arg(long, conflicts_with = "pin_dir")]
    no_pin: bool,
}

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        // Colours only on a terminal: the journal and log files get plain `key=value` fields.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let args = Args::parse();
    let config = Config::load(&args.config)?;
    if args.check {
        println!("{}", config.summary());
        return Ok(ExitCode::SUCCESS);
    }
    let socket = args.socket.or_else(|| config.daemon.socket.clone()).unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET));
    let signals = forward_signals()?;
    let ready = || {
        // Under systemd (Type=notify): shaping is in place. Elsewhere NOTIFY_SOCKET is unset
        // and this does nothing.
        if let Err(e) = sd_notify::notify(&[sd_notify::NotifyState::Ready]) {
            tracing::warn!(error = %e, "telling systemd the daemon is ready");
        }
    };
    let pin_dir = (!args.no_pin).then_some(args.pin_dir);
    match daemon::run(config, daemon::Options { socket, pin_dir }, signals, ready).await? {
        daemon::Exit::Stopped => Ok(ExitCode::SUCCESS),
        // A distinct status, so that systemd restarts the (upgraded) binary at once
        // (`RestartForceExitStatus=` in contrib/shaperd.service).
        daemon::Exit::HandedOver => Ok(ExitCode::from(HANDOVER_EXIT_STATUS)),
    }
}

/// Maps SIGHUP to a reload, SIGTERM/SIGINT to a stop and SIGUSR2 to a handover.
fn forward_signals() -> anyhow::Result<mpsc::Receiver<daemon::Signal>> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let mut usr2 = signal(SignalKind::user_defined2()).context("installing the SIGUSR2 handler")?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let signal = tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM"); daemon::Signal::Stop }
                _ = int.recv() => { tracing::info!("SIGINT"); daemon::Signal::Stop }
                _ = hup.recv() => { tracing::info!("SIGHUP: reloading the configuration"); daemon::Signal::Reload }
                _ = usr2.recv() => { tracing::info!("SIGUSR2: handing over to the next shaperd"); daemon::Signal::Handover }
            };
            if tx.send(signal).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
