// How the tc program (`shaper-ebpf`) is compiled: included (`include!`) by the build script
// that builds it (`shaper-daemon/build.rs`) and by the clippy stage that lints it
// (`xtask/src/lint.rs`), so that clippy sees the code the kernel gets.

/// The target the tc program is compiled for.
pub const BPF_TARGET: &str = "bpfel-unknown-none";
/// Debian's cargo and rustc (packages `cargo-web`, `rustc-web`), whose `core` for the BPF
/// targets comes prebuilt (`libstd-rust-web-dev-bpf`).
pub const DEBIAN_CARGO: &str = "/usr/bin/cargo";
pub const DEBIAN_RUSTC: &str = "/usr/bin/rustc";
/// v3 is the first BPF ISA with atomic compare-and-exchange and fetch-and-add (kernel 5.12+),
/// which the per-class pacing clock needs (see `shaper-ebpf/src/edt.rs`). `--btf` has
/// bpf-linker emit BTF from the debug info: the kernel takes a callback (`bpf_loop` in
/// `shaper-ebpf/src/classify.rs`) only from a program whose functions BTF describes. The
/// flags are separated by 0x1f, as `CARGO_ENCODED_RUSTFLAGS` wants.
pub const BPF_RUSTFLAGS: &str = "-Ctarget-cpu=v3\x1f-Clink-arg=--btf";

/// Whether the environment variable `key` is a setting by or for the outer cargo (the host
/// build), which must not reach the cargo that builds the tc program.
#[must_use]
pub fn is_outer_build_setting(key: &str) -> bool {
    (key.starts_with("CARGO_") && key != "CARGO_HOME")
        || key.starts_with("RUSTC_WRAPPER")
        || key == "RUSTC_WORKSPACE_WRAPPER"
        || key.starts_with("CLIPPY_")
        || key == "RUSTFLAGS"
        || key == "RUSTDOC"
}
