//! The rate path: every tick, from the datapath's counters to the rate each class is paced
//! at. [`demand`] estimates what each leaf wants, [`tree`] shares the link out by HTB's
//! rules, and [`pacing`] turns those allocations into the rates the datapath paces at. The
//! daemon's control tick (`daemon::state`) reads the counters and writes the rates.

pub mod demand;
pub mod pacing;
pub mod tree;
