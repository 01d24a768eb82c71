//! shaper: an eBPF traffic shaper for Linux gateways.
//!
//! Where things happen:
//! - [`config`]: the TOML configuration, parsed then validated as a whole;
//! - [`rate`]: rates in tc's spelling;
//! - [`rules`]: rules compiled into the datapath's lookup tables;
//! - [`bpf`]: the embedded tc program, its loading, attachment and typed maps;
//! - [`allocation`]: the rate path, every tick: [`allocation::demand`] (what each class
//!   wants, from the datapath's counters), [`allocation::tree`] (the class tree and the
//!   allocator, HTB's rules) and [`allocation::pacing`] (from allocations to the rates the
//!   datapath paces at: handing the link on, wake rates, lending);
//! - [`qdisc`]: the `fq` root qdisc that enforces departure times (netlink);
//! - [`netdev`]: interfaces as the kernel knows them (index, link-layer type);
//! - [`api`]: the control protocol between `shaperctl` and `shaperd`;
//! - [`metrics`]: the Prometheus exposition served at `/metrics`;
//! - [`daemon`]: wiring, signals and shutdown (setup and undo, the control loop, request
//!   handling);
//! - `model` (the `model` feature): a deterministic model of the whole rate path, which
//!   `tests/tests/model.rs` checks against the HTB reference and `shaper_tests::tuning`
//!   sweeps the control loop's tick and headroom on.
//!
//! The crate has no `unsafe`: system calls go through `nix`, netlink through `rtnetlink`.

#![deny(unsafe_code)]

pub mod allocation;
pub mod api;
pub mod bpf;
pub mod config;
pub mod daemon;
pub mod metrics;
#[cfg(any(test, feature = "model"))]
pub mod model;
pub mod netdev;
pub mod qdisc;
pub mod rate;
pub mod rules;

/// Displays an error with its sources, `: `-separated (for one-line messages: API replies,
/// `shaperctl` errors).
pub struct ErrorChain<'a>(pub &'a dyn std::error::Error);

impl std::fmt::Display for ErrorChain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = self.0.source();
        while let Some(s) = source {
            write!(f, ": {s}")?;
            source = s.source();
        }
        Ok(())
    }
}
