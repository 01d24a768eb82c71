//! The verifier's walk of the egress program on the VM's kernels, which is not the host's.
//!
//! `the_egress_program_leaves_the_verifier_headroom` (`tests/datapath.rs`) bounds the walk on
//! the host's kernel; another kernel's verifier prunes its states otherwise and may walk
//! several times as much of the same program. On 2026-11-29 a parser that filled the caller's
//! `Parsed` through a pointer, rather than returning it, took the walk on Linux 6.18 from
//! 200,967 instructions to 196,537, while Debian's 6.1 walked 766,028 (in 24 s under the
//! VM's emulated CPU, against 5 s) and then refused the program: its call chain's stack came
//! to 544 bytes, over 512. That only showed as VM tests running past their hour.

/// The walk on Debian's 6.1 and 6.12 (the kernels `cargo xtask test` boots), against the bound
/// the host's kernel is held to (`shaper_tests::VERIFIER_WALK_BOUND`). On 2026-11-29: 238,274
/// on 6.1, 167,426 on 6.12; 239,596 and 192,439 with isolation's exact counting and refunds;
/// 177,719 and 88,866 with the class cache's global functions (`shaper-ebpf/src/flow.rs`).
#[test]
fn the_egress_program_leaves_the_verifier_headroom_on_the_vm_kernel() {
    shaper_tests::assert_verifier_headroom();
}
