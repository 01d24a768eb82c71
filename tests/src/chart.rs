//! Per-class throughput over time as a PNG, for the demo.

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

/// Draws `series` (wire mbit/s against seconds) under `title` into `path` (PNG).
pub fn draw(path: &Path, title: &str, series: &[Series], y_max: f64) -> anyhow::Result<()> {
    let font = std::fs::read(FONT).map_err(|e| anyhow::anyhow!("{FONT} (package fonts-dejavu-core): {e}"))?;
    // register_font wants a 'static slice; the demo draws a handful of charts.
    let font: &'static [u8] = Box::leak(font.into_boxed_slice());
    plotters::style::register_font("sans-serif", FontStyle::Normal, font)
        .map_err(|_| anyhow::anyhow!("{FONT} is not a usable font"))?;
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
