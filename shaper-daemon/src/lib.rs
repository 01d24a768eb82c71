//! shaper: an eBPF traffic shaper for Linux gateways.
//!
//! Where things happen:
//! - [`config`]: the TOML configuration, parsed then validated as a whole;
//! - [`rate`]: rates in tc's spelling;
//! - [`rules`]: rules compiled into the datapath's lookup tables;
//! - [`bpf`]: the embedded tc program, its loading, attachment and typed maps;
//! - [`qdisc`]: the `fq` root qdisc that enforces departure times (netlink);
//! - [`api`]: the control protocol between `shaperctl` and `shaperd`;
//! - [`metrics`]: the Prometheus exposition served at `/metrics`;
//! - [`daemon`]: wiring, signals and shutdown.

pub mod api;
pub mod bpf;
pub mod config;
pub mod control;
pub mod daemon;
pub mod metrics;
pub mod qdisc;
pub mod rate;
pub mod rules;
pub mod tree;
