//! The verifier's walk of the egress program on the VM's kernels, which is not the host's.
//!
//! `the_egress_program_leaves_the_verifier_headroom` (`tests/datapath.rs`) bounds the walk on
//! the host's kernel; another kernel's verifier prunes its states otherwise and may walk
//! several times as much of the same program. On 2026-11-29 a parser that filled the caller's
//! `Parsed` through a pointer, rather than returning it, took the walk on Linux 6.18 from
//! 200,967 instructions to 196,537, while Debian's 6.1 walked 766,028 (in 24 s under the
//! VM's emulated CPU, against 5 s) and then refused the program: its call chain's stack came
//! to 544 bytes, over 512. That only showed as VM tests running past their hour.

use std::time::Instant;

use shaper::bpf::Datapath;

/// The walk on Debian's 6.1 and 6.12 (the kernels `cargo xtask test` boots), as on the host
/// (the kernel refuses a program past 1,000,000). On 2026-11-29: 245,547 on 6.1, 190,256 on
/// 6.12.
const BOUND: u32 = 300_000;

#[test]
fn the_egress_program_leaves_the_verifier_headroom_on_the_vm_kernel() {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").expect("/proc/sys/kernel/osrelease");
    let release = release.trim();
    let started = Instant::now();
    let dp = Datapath::load().unwrap_or_else(|e| panic!("Linux {release} refused the datapath: {e:#}"));
    let took = started.elapsed();
    let walked = dp.verified_instructions().expect("the kernel reports the verified instructions (Linux 5.16+)");
    println!(
        "Linux {release}: egress program {walked} instructions verified (bound {BOUND}); the datapath loaded in {:.1} s",
        took.as_secs_f64()
    );
    assert!(
        walked <= BOUND,
        "Linux {release}'s verifier walked {walked} instructions of the egress program, over {BOUND}"
    );
}
