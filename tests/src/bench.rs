//! `cargo xtask bench`'s report: rows of figures, each with the baseline it was measured
//! against in the same run, the ratio and the goal; printed as one table and written as JSON
//! and a PNG chart. Also the control loop's tick at 10,000 classes.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "figures for reports"
)]

use std::{path::Path, time::Instant};

use anyhow::Context as _;
use shaper::allocation::{
    demand::{fair_share, Counters, Estimator, Histories, Observation},
    pacing::{Leaf, Pacer},
    tree::{Node, Tree},
};

/// One figure of the report.
#[derive(Clone, Debug, serde::Serialize)]
pub struct Row {
    pub section: String,
    pub name: String,
    pub value: f64,
    pub unit: String,
    /// The baseline the ratio is taken against (measured in the same run), and the ratio.
    pub baseline: Option<f64>,
    pub ratio: Option<f64>,
    /// The ratio the project aims at (printed, with whether it is met).
    pub goal: Option<f64>,
    /// The ratio past which `--check` fails: a regression from what the datapath does now,
    /// with room for the noise of a shared machine. At the goal once the goal is met.
    pub bound: Option<f64>,
    pub note: String,
}

impl Row {
    /// `value` against `baseline`.
    #[must_use]
    pub fn ratio(section: &str, name: &str, value: f64, baseline: f64, unit: &str) -> Self {
        Self {
            section: section.into(),
            name: name.into(),
            value,
            unit: unit.into(),
            baseline: Some(baseline),
            ratio: Some(value / baseline),
            goal: None,
            bound: None,
            note: String::new(),
        }
    }

    #[must_use]
    pub fn goal(self, goal: f64) -> Self {
        Self { goal: Some(goal), ..self }
    }

    #[must_use]
    pub fn bound(self, bound: f64) -> Self {
        Self { bound: Some(bound), ..self }
    }

    #[must_use]
    pub fn note(self, note: impl Into<String>) -> Self {
        Self { note: note.into(), ..self }
    }

    /// Whether the row has a goal and its ratio misses it.
    #[must_use]
    pub fn missed(&self) -> bool {
        matches!((self.ratio, self.goal), (Some(r), Some(g)) if r > g)
    }

    /// Whether the row has a bound and its ratio is past it.
    #[must_use]
    pub fn regressed(&self) -> bool {
        matches!((self.ratio, self.bound), (Some(r), Some(b)) if r > b)
    }
}

/// The whole report, in the order the figures were measured.
#[derive(Debug, Default)]
pub struct Report {
    pub rows: Vec<Row>,
}

impl Report {
    pub fn push(&mut self, row: Row) {
        self.rows.push(row);
    }

    /// A section's baseline: ratio 1 by definition.
    pub fn baseline(&mut self, section: &str, name: &str, value: f64, unit: &str) {
        self.push(Row::ratio(section, name, value, value, unit).note("baseline"));
    }

    /// "name: ratio > bound" for each row past its bound.
    #[must_use]
    pub fn regressions(&self) -> Vec<String> {
        self.rows
            .iter()
            .filter(|r| r.regressed())
            .map(|r| format!("{}: {:.2}x > {:.2}x", r.name, r.ratio.unwrap_or(0.0), r.bound.unwrap_or(0.0)))
            .collect()
    }

    /// Prints the table: one block per section.
    pub fn print(&self) {
        let mut section = "";
        for r in &self.rows {
            if r.section != section {
                section = &r.section;
                println!("\n{section}");
                println!("{:<44} {:>12} {:>9} {:>7} {:>4} {:>7}  note", "", "value", "ratio", "goal", "met", "bound");
            }
            let ratio = r.ratio.map_or_else(String::new, |x| format!("{x:.2}x"));
            let (goal, met) = match r.goal {
                Some(g) => (format!("{g:.2}x"), if r.missed() { "NO" } else { "yes" }),
                None => (String::new(), ""),
            };
            let value = format!("{:.1} {}", r.value, short_unit(&r.unit));
            let bound = r.bound.map_or_else(String::new, |b| format!("{b:.2}x"));
            println!("{:<44} {:>12} {:>9} {:>7} {:>4} {:>7}  {}", r.name, value, ratio, goal, met, bound, r.note);
        }
    }

    /// Writes `bench.json` and `bench.png` into `dir`.
    ///
    /// # Errors
    /// When a file cannot be written or the chart not drawn.
    pub fn write(&self, dir: &Path) -> anyhow::Result<()> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let json = dir.join("bench.json");
        std::fs::write(&json, serde_json::to_string_pretty(&self.rows)?).with_context(|| json.display().to_string())?;
        let bars: Vec<crate::chart::Bar> = self
            .rows
            .iter()
            .filter(|r| r.note != "baseline")
            .filter_map(|r| {
                Some(crate::chart::Bar { label: format!("{}: {}", r.section, r.name), value: r.ratio?, goal: r.goal })
            })
            .collect();
        let png = dir.join("bench.png");
        crate::chart::bars(&png, "shaper: cost against a baseline of the same run (x)", &bars)?;
        println!("\nwritten: {} and {}", json.display(), png.display());
        Ok(())
    }
}

fn short_unit(unit: &str) -> &str {
    match unit {
        "ns/packet" => "ns",
        other => other,
    }
}

/// A class tree of `leaves` leaf classes under `leaves.isqrt()` inner classes, on a
/// 10 gbit/s link: guarantees that add up to half the link, ceilings at the link, four
/// priorities, weights.
fn tree(leaves: usize) -> Tree {
    const LINK: u64 = 10_000_000_000;
    let inner = leaves.isqrt().max(1);
    let per = leaves / inner;
    let mut nodes = vec![Node { rate: LINK, ceil: LINK, prio: 0, weight: 1, children: Vec::new() }];
    for i in 0..inner {
        let parent = nodes.len();
        nodes[0].children.push(parent);
        nodes.push(Node { rate: LINK / 2 / inner as u64, ceil: LINK, prio: 0, weight: 1, children: Vec::new() });
        for j in 0..per {
            let leaf = nodes.len();
            nodes[parent].children.push(leaf);
            let rate = LINK / 2 / (inner * per) as u64;
            nodes.push(Node {
                rate,
                ceil: LINK,
                prio: ((i + j) % 4) as u8,
                weight: 1 + (j % 3) as u64,
                children: Vec::new(),
            });
        }
    }
    Tree { nodes }
}

/// Median ns of one control-loop tick (each leaf's demand estimator fed its counters, the
/// allocation and pacing rates of the tree, each leaf's fair share) at `leaves` classes,
/// one in `every` of which has traffic, which comes and goes: a third greedy, a third at a
/// steady rate, a third on and off. The others send nothing. The traffic's counters are
/// made up before each tick's clock starts: they stand for what shaperd reads from the
/// datapath, and making them up is not the control loop's work.
fn tick_ns(leaves: usize, every: usize, ticks: usize) -> f64 {
    const TICK: u64 = 10_000_000;
    let tree = tree(leaves);
    let n = tree.nodes.len();
    let leaf_nodes = tree.leaves();
    let mut estimators: Vec<Estimator> = (0..n).map(|_| Estimator::new()).collect();
    let mut histories = Histories::new();
    let mut counters = vec![Counters::default(); n];
    let mut observed = vec![None; n];
    let mut pacing = vec![1_000_000u64; n];
    let mut pacer = Pacer::default();
    let mut samples = Vec::with_capacity(ticks);
    for t in 0..ticks + 50 {
        let now = (t as u64 + 1) * TICK;
        for &i in &leaf_nodes {
            let busy = (i / 3).is_multiple_of(every);
            let sends = match i % 3 {
                _ if !busy => 0,
                0 => pacing[i] / 800,
                1 => 125_000 / 100,
                _ => {
                    if (t / 20 + i) % 2 == 0 {
                        pacing[i] / 800
                    } else {
                        0
                    }
                }
            };
            let c = &mut counters[i];
            c.offered_bytes += sends;
            c.packets += sends / 1500 + 1;
            if i % 3 != 0 {
                c.idle_packets += sends / 1500 + 1;
            }
            let backlog = if busy && i % 3 == 0 { 20_000_000 } else { 0 };
            observed[i] = Some(Observation { now_ns: now, counters: *c, backlog_ns: backlog, pacing: pacing[i] });
        }
        let start = Instant::now();
        let mut leaf = vec![Leaf::default(); n];
        histories.start_row(now, n);
        for (i, o) in observed.iter().enumerate() {
            if let Some(o) = o {
                leaf[i] = Leaf::new(&estimators[i].update(&mut histories, i, o), o.backlog_ns);
            }
        }
        let rates = pacer.tick(&tree, &leaf, now);
        for &i in &leaf_nodes {
            pacing[i] = rates.pacing[i];
            std::hint::black_box(fair_share(pacing[i], leaf[i].limited, 1_000, 2, 1, pacing[i] / 2));
        }
        if t >= 50 {
            samples.push(start.elapsed().as_secs_f64() * 1e9);
        }
    }
    median(&mut samples)
}

/// The median of `samples` (reordered); at least one sample.
pub fn median(samples: &mut [f64]) -> f64 {
    samples.sort_by(f64::total_cmp);
    samples[samples.len() / 2]
}

/// The control loop's tick at 10,000 classes: against the same at 100 classes (goal: no
/// worse than linear, with room), and against the 1 ms it may take.
pub fn control_loop(report: &mut Report, short: bool) {
    let ticks = if short { 50 } else { 300 };
    let section = "control loop tick";
    let small = tick_ns(100, 1, ticks * 10);
    report.baseline(section, "100 classes", small / 1e3, "µs");
    let large = tick_ns(10_000, 1, ticks);
    report.push(
        Row::ratio(section, "10,000 classes, against 100", large / 1e3, small / 1e3, "µs")
            .goal(150.0)
            .bound(150.0)
            .note("linear: 100x"),
    );
    report.push(
        Row::ratio(section, "10,000 classes, against a 1 ms budget", large / 1e3, 1_000.0, "µs")
            .goal(1.0)
            .note("this machine's time; not a CI bound"),
    );
    // A gateway's classes are mostly idle at any one moment: a class idle throughout its
    // history is estimated without reading it.
    let mostly_idle = tick_ns(10_000, 10, ticks);
    report.push(
        Row::ratio(section, "10,000 classes, 1 in 10 sending, against all", mostly_idle / 1e3, large / 1e3, "µs")
            .note("this machine's time; not a CI bound"),
    );
}
