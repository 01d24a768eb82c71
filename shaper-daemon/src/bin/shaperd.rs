//! shaperd: loads the shaper datapath onto the configured interfaces and serves `shaperctl`.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Parser;
use shaper::{api::DEFAULT_SOCKET, config::Config, daemon};
use tokio::{
    signal::unix::{signal, SignalKind},
    sync::mpsc,
};
use tracing_subscriber::EnvFilter;

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
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")))
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let config = Config::load(&args.config)?;
    if args.check {
        println!(
            "{}: ok ({} interfaces, {} classes, {} rules)",
            config.path.display(),
            config.interfaces.len(),
            config.classes.len(),
            config.rules.len()
        );
        return Ok(());
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
    daemon::run(config, daemon::Options { socket }, signals, ready).await?;
    Ok(())
}

/// Maps SIGHUP to a reload and SIGTERM/SIGINT to a stop.
fn forward_signals() -> anyhow::Result<mpsc::Receiver<daemon::Signal>> {
    let mut term = signal(SignalKind::terminate()).context("installing the SIGTERM handler")?;
    let mut int = signal(SignalKind::interrupt()).context("installing the SIGINT handler")?;
    let mut hup = signal(SignalKind::hangup()).context("installing the SIGHUP handler")?;
    let (tx, rx) = mpsc::channel(4);
    tokio::spawn(async move {
        loop {
            let signal = tokio::select! {
                _ = term.recv() => { tracing::info!("SIGTERM"); daemon::Signal::Stop }
                _ = int.recv() => { tracing::info!("SIGINT"); daemon::Signal::Stop }
                _ = hup.recv() => { tracing::info!("SIGHUP: reloading the configuration"); daemon::Signal::Reload }
            };
            if tx.send(signal).await.is_err() {
                return;
            }
        }
    });
    Ok(rx)
}
