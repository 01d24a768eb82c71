//! Charts as PNG: per-class throughput over time for the demo, ratios for the bench.

use std::path::Path;

use plotters::prelude::*;

/// One line of the chart: a class and its (time s, mbit/s) points.
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

const FONT: &str = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf";
const COLORS: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
];

/// Registers the font the charts use.
fn register() -> anyhow::Result<()> {
    let font = std::fs::read(FONT).map_err(|e| anyhow::anyhow!("{FONT} (package fonts-dejavu-core): {e}"))?;
    // register_font wants a 'static slice; a run draws a handful of charts.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{FONT} is not a usable font"))?;
    Ok(())
}

/// Draws `series` (wire mbit/s against seconds) under `title` into `path` (PNG).
pub fn draw(path: &Path, title: &str, series: &[Series], y_max: f64) -> anyhow::Result<()> {
    register()?;
    let x_max = series.iter().flat_map(|s| s.points.iter().map(|p| p.0)).fold(1.0, f64::max);
    let root = BitMapBackend::new(path, (960, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(56)
        .build_cartesian_2d(0f64..x_max, 0f64..y_max)?;
    chart.configure_mesh().x_desc("seconds").y_desc("wire rate, mbit/s").label_style(("sans-serif", 14)).draw()?;
    for (i, s) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))?
            .label(s.name.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .label_font(("sans-serif", 14))
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
}

/// One bar of [`bars`]: a ratio and, if it has one, its goal.
pub struct Bar {
    pub label: String,
    pub value: f64,
    pub goal: Option<f64>,
}

/// Draws `bars` as horizontal bars (log scale), each goal as a black tick, under `title`
/// into `path` (PNG).
pub fn bars(path: &Path, title: &str, bars: &[Bar]) -> anyhow::Result<()> {
    register()?;
    let height = 120 + 34 * u32::try_from(bars.len()).unwrap_or(40);
    let root = BitMapBackend::new(path, (1100, height)).into_drawing_area();
    root.fill(&WHITE)?;
    let x_max = bars.iter().flat_map(|b| [b.value, b.goal.unwrap_or(0.0)]).fold(2.0, f64::max) * 1.5;
    let n = bars.len();
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(16)
        .x_label_area_size(36)
        .y_label_area_size(520)
        .build_cartesian_2d((0.5f64..x_max).log_scale(), (0..n).into_segmented())?;
    chart
        .configure_mesh()
        .disable_y_mesh()
        .x_desc("x baseline (log scale); black tick: goal")
        .y_labels(n)
        .y_label_formatter(&|v| match v {
            SegmentValue::CenterOf(i) => {
                (n - 1).checked_sub(*i).and_then(|k| bars.get(k)).map_or_else(String::new, |b| b.label.clone())
            }
            _ => String::new(),
        })
        .label_style(("sans-serif", 13))
        .draw()?;
    for (i, b) in bars.iter().enumerate() {
        let y = n - 1 - i;
        let color = if b.goal.is_some_and(|g| b.value > g) { COLORS[3] } else { COLORS[0] };
        chart.draw_series(std::iter::once(Rectangle::new(
            [(0.5, SegmentValue::Exact(y)), (b.value, SegmentValue::Exact(y + 1))],
            color.mix(0.8).filled(),
        )))?;
        if let Some(g) = b.goal {
            chart.draw_series(std::iter::once(PathElement::new(
                vec![(g, SegmentValue::Exact(y)), (g, SegmentValue::Exact(y + 1))],
                BLACK.stroke_width(3),
            )))?;
        }
    }
    root.present()?;
    Ok(())
}
