//! The files in `contrib/` checked on the host, without a VM and without a running systemd:
//! the unit passes `systemd-analyze verify` and keeps its measured security exposure, the
//! sysusers snippet parses and creates the group the unit runs with, and the Grafana
//! dashboard charts exactly the metrics shaperd exports.
//!
//! `systemd-analyze` and `systemd-sysusers` come with the Debian package `systemd`, which
//! `cargo xtask setup` installs; without them these tests fail, they never skip. Neither tool
//! needs a running manager for what is asked here (CI runs in a container without one).

use std::{
    collections::BTreeSet,
    ffi::{OsStr, OsString},
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;
use shaper::{
    api::ClassStatus,
    metrics::{Metrics, Snapshot},
};

/// Every metric shaperd exports, as Prometheus sees it (counters end in `_total`). Rates are in
/// bytes per second (Prometheus base units); the dashboard multiplies them by 8. The test
/// [`metric_list_is_what_shaperd_exports`] keeps this list equal to the daemon's exposition.
const METRICS: &[&str] = &[
    "shaper_class_bytes_total",
    "shaper_class_packets_total",
    "shaper_class_drops_total",
    "shaper_class_dropped_bytes_total",
    "shaper_class_ecn_marks_total",
    "shaper_class_allocation_bytes_per_second",
    "shaper_class_rate_bytes_per_second",
    "shaper_class_ceil_bytes_per_second",
    "shaper_class_pacing_rate_bytes_per_second",
    "shaper_class_added_delay_seconds",
    "shaper_allocator_tick_duration_seconds",
    "shaper_allocator_tick_interval_seconds",
    "shaper_config_generation",
    "shaper_interface_attached",
    "shaper_interface_reattachments_total",
];

/// The histograms among [`METRICS`]: Prometheus stores them as `_bucket`, `_sum` and `_count`.
const HISTOGRAMS: &[&str] = &[
    "shaper_class_added_delay_seconds",
    "shaper_allocator_tick_duration_seconds",
    "shaper_allocator_tick_interval_seconds",
];

/// The labels shaperd's metrics carry, plus the ones Prometheus adds (`instance`, `job`) and
/// the histograms' `le`.
const LABELS: &[&str] = &["interface", "class", "reason", "le", "instance", "job"];

/// `systemd-analyze security` of the unit measured 1.9 (systemd 252, Debian 12); what is left
/// is inherent (root, `CAP_NET_ADMIN` and `CAP_BPF`, the host's network). Every directive dropped
/// costs at least 0.1.
const MAX_EXPOSURE: f64 = 2.0;

/// Security checks the unit must keep passing whatever the score: the capabilities it must not
/// have and the sandboxing that matters most for a root process.
const MUST_PASS: &[&str] = &[
    "CapabilityBoundingSet=~CAP_SYS_ADMIN",
    "CapabilityBoundingSet=~CAP_SYS_MODULE",
    "CapabilityBoundingSet=~CAP_(DAC_*|FOWNER|IPC_OWNER)",
    "CapabilityBoundingSet=~CAP_SYS_PTRACE",
    "CapabilityBoundingSet=~CAP_SET(UID|GID|PCAP)",
    "NoNewPrivileges=",
    "ProtectSystem=",
    "ProtectHome=",
    "ProtectKernelModules=",
    "ProtectKernelTunables=",
    "MemoryDenyWriteExecute=",
    "SystemCallArchitectures=",
    "RestrictAddressFamilies=~AF_PACKET",
];

/// Where the unit installs shaperd; the tests point it at the freshly built binary instead.
const INSTALLED_SHAPERD: &str = "/usr/local/bin/shaperd";

fn contrib(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../contrib").join(path)
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

/// A directory under cargo's scratch space for integration tests, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(name: &str) -> Self {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("contrib-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Runs one of systemd's tools, failing with the way to install it if it is missing.
fn systemd_tool<S: AsRef<OsStr>>(tool: &str, args: &[S]) -> Output {
    Command::new(tool).args(args).env("SYSTEMD_COLORS", "0").env("SYSTEMD_PAGER", "").output().unwrap_or_else(|e| {
        panic!("running {tool}: {e}; it comes with the Debian package `systemd`: run `cargo xtask setup` (as root)")
    })
}

fn text(out: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr))
}

/// The values of `key=` in the unit (every occurrence, in order).
fn directive<'a>(unit: &'a str, key: &str) -> Vec<&'a str> {
    unit.lines().filter_map(|l| l.strip_prefix(key)?.strip_prefix('=')).map(str::trim).collect()
}

/// The unit as shipped, but running the shaperd this workspace built: `systemd-analyze verify`
/// checks that every command exists and is executable, and /usr/local/bin/shaperd does not
/// exist on a build machine. Rewriting that one path (rather than `--root` with a fake tree)
/// keeps every other line, /bin/kill included, checked against the real system.
fn unit_for_this_build(scratch: &Scratch) -> PathBuf {
    let unit = read(&contrib("shaperd.service"));
    assert!(
        directive(&unit, "ExecStart").iter().any(|c| c.starts_with(INSTALLED_SHAPERD)),
        "the unit's ExecStart= no longer runs {INSTALLED_SHAPERD}; update this test"
    );
    let shaperd = shaper_tests::bin("shaperd");
    let path = scratch.0.join("shaperd.service");
    std::fs::write(&path, unit.replace(INSTALLED_SHAPERD, &shaperd.to_string_lossy())).expect("writing the unit");
    path
}

/// `systemd-analyze verify`'s complaints about `unit` (the lines naming it).
fn verify(unit: &Path) -> Vec<String> {
    let out = systemd_tool("systemd-analyze", &[OsStr::new("verify"), OsStr::new("--man=no"), unit.as_os_str()]);
    let name = unit.file_name().expect("unit file name").to_string_lossy().into_owned();
    let all = text(&out);
    let about_unit: Vec<String> = all.lines().filter(|l| l.contains(&name)).map(str::to_owned).collect();
    // Anything else is about the environment (say, a missing dependency's unit file), not ours.
    for line in all.lines().filter(|l| !l.contains(&name)) {
        eprintln!("systemd-analyze verify (not about {name}): {line}");
    }
    assert!(
        out.status.success() || !about_unit.is_empty(),
        "systemd-analyze verify {} failed ({}):\n{all}",
        unit.display(),
        out.status
    );
    about_unit
}

#[test]
fn unit_passes_systemd_analyze_verify() {
    let scratch = Scratch::new("verify");
    let unit = unit_for_this_build(&scratch);
    let complaints = verify(&unit);
    assert!(complaints.is_empty(), "systemd-analyze verify complains about the unit:\n{}", complaints.join("\n"));

    // The check has teeth: the same run reports a misspelled directive (verify exits 0 on
    // those, which is why complaints are read from its output rather than its status).
    let typo = scratch.0.join("shaperd-typo.service");
    std::fs::write(&typo, read(&unit).replace("ProtectClock=yes", "ProtectClok=yes")).unwrap();
    let complaints = verify(&typo);
    assert!(
        complaints.iter().any(|l| l.contains("ProtectClok")),
        "systemd-analyze verify did not notice a misspelled directive: {complaints:?}"
    );
}

#[test]
fn unit_commands_are_ones_shaperd_accepts() {
    // The unit's reload check, run against an example configuration: catches a renamed flag.
    let unit = read(&contrib("shaperd.service"));
    let check = directive(&unit, "ExecReload")
        .into_iter()
        .find(|c| c.starts_with(INSTALLED_SHAPERD))
        .expect("an ExecReload= that validates the configuration with shaperd --check");
    let example = Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/roommates.toml");
    let args: Vec<String> = check
        .split_whitespace()
        .skip(1)
        .map(|a| if a == "/etc/shaper/shaper.toml" { example.to_string_lossy().into_owned() } else { a.to_owned() })
        .collect();
    let out = Command::new(shaper_tests::bin("shaperd")).args(&args).output().expect("running shaperd");
    assert!(out.status.success(), "shaperd {args:?} (the unit's ExecReload=) failed:\n{}", text(&out));

    // ExecStart= has the same shape, minus --check.
    let start = directive(&unit, "ExecStart");
    assert_eq!(start, [check.trim_end_matches("--check").trim_end()], "ExecStart= and the reload check differ");
}

#[test]
fn unit_security_exposure_stays_low() {
    let scratch = Scratch::new("security");
    let unit = unit_for_this_build(&scratch);
    let out = systemd_tool(
        "systemd-analyze",
        &[OsStr::new("security"), OsStr::new("--offline=yes"), OsStr::new("--no-pager"), unit.as_os_str()],
    );
    let report = text(&out);
    assert!(out.status.success(), "systemd-analyze security --offline=yes failed ({}):\n{report}", out.status);
    let score: f64 = report
        .lines()
        .find_map(|l| l.split_once("Overall exposure level for shaperd.service:"))
        .and_then(|(_, rest)| rest.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no overall exposure level in:\n{report}"));
    eprintln!("systemd-analyze security: shaperd.service exposure {score} (at most {MAX_EXPOSURE} allowed)");
    assert!(score <= MAX_EXPOSURE, "the unit's exposure rose to {score} (was 1.9):\n{report}");

    let out = systemd_tool(
        "systemd-analyze",
        &[OsStr::new("security"), OsStr::new("--offline=yes"), OsStr::new("--json=short"), unit.as_os_str()],
    );
    let checks: Vec<Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("systemd-analyze security --json=short: {e}\n{}", text(&out)));
    for name in MUST_PASS {
        let check = checks
            .iter()
            .find(|c| c["name"] == *name)
            .unwrap_or_else(|| panic!("systemd-analyze security has no check {name}"));
        assert_eq!(check["set"], true, "the unit fails the security check {name}: {}", check["description"]);
    }
}

#[test]
fn sysusers_creates_the_group_the_unit_runs_with() {
    let unit = read(&contrib("shaperd.service"));
    let group = *directive(&unit, "Group").first().expect("the unit sets Group=");
    let sysusers = contrib("shaper.sysusers.conf");
    // An empty root: the tool then says what it would create, whatever this machine has.
    let scratch = Scratch::new("sysusers");
    let root = scratch.0.join("root");
    std::fs::create_dir_all(root.join("etc")).unwrap();
    let mut root_arg = OsString::from("--root=");
    root_arg.push(&root);
    let out = systemd_tool("systemd-sysusers", &[OsStr::new("--dry-run"), &root_arg, sysusers.as_os_str()]);
    let said = text(&out);
    assert!(out.status.success(), "systemd-sysusers --dry-run {} failed:\n{said}", sysusers.display());
    assert!(!said.contains("ignoring"), "systemd-sysusers ignored part of {}:\n{said}", sysusers.display());
    assert!(
        said.contains(&format!("Creating group '{group}'")),
        "{} does not create the group {group} of the unit's Group=:\n{said}",
        sysusers.display()
    );
}

#[test]
fn runtime_directory_and_module_match_the_daemon() {
    let unit = read(&contrib("shaperd.service"));
    let runtime = directive(&unit, "RuntimeDirectory");
    let socket_dir = Path::new(shaper::api::DEFAULT_SOCKET).parent().expect("socket in a directory");
    assert_eq!(
        runtime.iter().map(|d| Path::new("/run").join(d)).collect::<Vec<_>>(),
        [socket_dir],
        "RuntimeDirectory= must be the directory of shaperd's default socket"
    );
    let modules = read(&contrib("modules-load.d/shaper.conf"));
    let modules: Vec<&str> = modules.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with('#')).collect();
    assert_eq!(modules, ["sch_fq"], "modules-load.d/shaper.conf loads the qdisc shaperd requires");
}

/// Every panel, rows' nested panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    let mut out = Vec::new();
    for p in dashboard["panels"].as_array().expect("dashboard.panels") {
        out.push(p);
        out.extend(p["panels"].as_array().into_iter().flatten());
    }
    out
}

/// The identifiers in a `PromQL` expression that name shaper metrics.
fn shaper_names(expr: &str) -> Vec<&str> {
    expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.starts_with("shaper_"))
        .collect()
}

/// The label names an expression groups by or selects on.
fn label_names(expr: &str) -> Vec<&str> {
    let mut names = Vec::new();
    for (_, rest) in expr.match_indices("by (").map(|(i, _)| expr.split_at(i + 4)) {
        let list = rest.split(')').next().unwrap_or_default();
        names.extend(list.split(',').map(str::trim).filter(|s| !s.is_empty()));
    }
    for (_, rest) in expr.match_indices('{').map(|(i, _)| expr.split_at(i + 1)) {
        let selector = rest.split('}').next().unwrap_or_default();
        names.extend(
            selector.split(',').filter_map(|m| m.split(['=', '!']).next()).map(str::trim).filter(|s| !s.is_empty()),
        );
    }
    names
}

/// The metric a series name belongs to: a histogram's series carry a suffix.
fn metric_of(series: &str) -> &str {
    for h in HISTOGRAMS {
        if let Some(suffix) = series.strip_prefix(h) {
            if ["_bucket", "_sum", "_count"].contains(&suffix) {
                return h;
            }
        }
    }
    series
}

#[test]
fn dashboard_charts_exactly_the_exported_metrics() {
    let path = contrib("grafana/shaper-dashboard.json");
    let dashboard: Value = serde_json::from_str(&read(&path)).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert!(dashboard["schemaVersion"].as_u64().is_some_and(|v| v >= 36), "schemaVersion: Grafana 9 or later");

    let vars: Vec<&str> = dashboard["templating"]["list"]
        .as_array()
        .expect("templating")
        .iter()
        .filter_map(|v| v["name"].as_str())
        .collect();
    for var in ["DS_PROMETHEUS", "interface", "class"] {
        assert!(vars.contains(&var), "templating variable {var} is missing (have {vars:?})");
    }

    let mut exprs: Vec<(String, &str)> = Vec::new();
    let mut ids = BTreeSet::new();
    for panel in panels(&dashboard) {
        let title = panel["title"].as_str().unwrap_or("(untitled)");
        assert!(ids.insert(panel["id"].as_u64().expect("panel id")), "duplicate panel id in {title}");
        if panel["type"] == "row" {
            continue;
        }
        let targets = panel["targets"].as_array().map_or(&[][..], Vec::as_slice);
        assert!(!targets.is_empty(), "panel {title:?} has no query");
        for t in targets {
            assert_eq!(t["datasource"]["uid"], "${DS_PROMETHEUS}", "panel {title:?} uses another data source");
            let expr = t["expr"].as_str().filter(|e| !e.trim().is_empty());
            exprs.push((format!("panel {title:?}"), expr.unwrap_or_else(|| panic!("panel {title:?}: empty query"))));
        }
    }
    for var in dashboard["templating"]["list"].as_array().expect("templating") {
        if let Some(q) = var["definition"].as_str() {
            exprs.push((format!("variable {}", var["name"]), q));
        }
    }
    for a in dashboard["annotations"]["list"].as_array().into_iter().flatten() {
        if let Some(q) = a["expr"].as_str() {
            exprs.push((format!("annotation {}", a["name"]), q));
        }
    }

    let mut used = BTreeSet::new();
    for (place, expr) in &exprs {
        for series in shaper_names(expr) {
            let metric = metric_of(series);
            assert!(METRICS.contains(&metric), "{place} queries {series}, which shaperd does not export: {expr}");
            used.insert(metric);
        }
        for label in label_names(expr) {
            assert!(LABELS.contains(&label), "{place} uses the label {label:?}, which no metric has: {expr}");
        }
    }
    let unused: Vec<&&str> = METRICS.iter().filter(|m| !used.contains(*m)).collect();
    assert!(unused.is_empty(), "metrics with no panel: {unused:?}");
}

/// The metric families and label names of a scrape of shaperd, from its own encoder, fed one
/// leaf class (families without samples are left out of a scrape).
fn exposition() -> (BTreeSet<String>, BTreeSet<String>) {
    let leaf = ClassStatus { interface: "lan0".into(), name: "alex".into(), leaf: true, ..ClassStatus::default() };
    let metrics = Metrics::new();
    // (Interfaces are labelled once shaperd sets them up.)
    metrics.set_interface_attached("lan0", true);
    let text = metrics.encode(Snapshot { generation: 1, classes: vec![leaf], ..Snapshot::default() });
    let mut families = BTreeSet::new();
    let mut labels = BTreeSet::new();
    for line in text.lines() {
        if let Some(family) = line.strip_prefix("# TYPE ") {
            let (name, kind) = family.split_once(' ').unwrap_or_else(|| panic!("bad TYPE line {line:?}"));
            // OpenMetrics names a counter family without the `_total` its samples carry.
            families.insert(if kind == "counter" { format!("{name}_total") } else { name.to_owned() });
        } else if let Some((_, rest)) = line.split_once('{') {
            let set = rest.split('}').next().unwrap_or_default();
            labels.extend(set.split(',').filter_map(|kv| kv.split_once('=')).map(|(k, _)| k.trim().to_owned()));
        }
    }
    (families, labels)
}

#[test]
fn metric_list_is_what_shaperd_exports() {
    let (families, labels) = exposition();
    let listed: BTreeSet<String> = METRICS.iter().map(|m| (*m).to_owned()).collect();
    assert_eq!(families, listed, "shaperd's metrics changed: update METRICS here and the Grafana dashboard");
    for h in HISTOGRAMS {
        assert!(families.contains(*h), "{h} is no longer a histogram family");
    }
    for label in &labels {
        assert!(
            LABELS.contains(&label.as_str()),
            "shaperd exports the label {label:?}, unknown here: add it to LABELS"
        );
    }
}
