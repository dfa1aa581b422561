//! Latency by percentile as SVG: x is `1/(1-p)` on a log scale (labelled as
//! percentiles: 90%, 99%, 99.9% …), y is latency in ms; several runs overlay.
//! Input is a histogram or a classic `.hgrm` file.

use std::path::Path;

use hdrhistogram::Histogram;
use plotters::prelude::*;

use super::{ioerr, BenchError};

/// One line of the plot.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// `(1/(1-p), latency ms)` points, p < 1.
    pub points: Vec<(f64, f64)>,
}

impl Series {
    /// From a histogram in µs (5 ticks per half-distance, like the `.hgrm`).
    pub fn from_histogram(label: &str, h: &Histogram<u64>) -> Series {
        let points = h
            .iter_quantiles(5)
            .map(|v| (v.quantile_iterated_to(), h.highest_equivalent(v.value_iterated_to()) as f64 / 1000.0))
            .filter(|(q, _)| *q < 1.0)
            .map(|(q, ms)| (1.0 / (1.0 - q), ms))
            .collect();
        Series { label: label.to_string(), points }
    }

    /// Parses a classic `.hgrm` text: every line of four numbers
    /// `Value Percentile TotalCount 1/(1-Percentile)` is a point; headers,
    /// the final `p = 1` line and `#[` footers are skipped.
    ///
    /// # Errors
    /// [`BenchError::Invalid`] when the text holds no such line.
    pub fn from_hgrm(label: &str, text: &str) -> Result<Series, BenchError> {
        let points: Vec<(f64, f64)> = text
            .lines()
            .filter_map(|l| {
                let f: Vec<f64> = l.split_whitespace().map(str::parse).collect::<Result<_, _>>().ok()?;
                (f.len() == 4 && f[1] < 1.0).then(|| (f[3], f[0]))
            })
            .collect();
        if points.is_empty() {
            return Err(BenchError::Invalid(format!("{label}: no percentile lines (not an .hgrm file?)")));
        }
        Ok(Series { label: label.to_string(), points })
    }

    /// Reads and parses an `.hgrm` file; the label is the file stem.
    ///
    /// # Errors
    /// [`BenchError::Io`] when unreadable; as [`Series::from_hgrm`].
    pub fn read(path: &Path) -> Result<Series, BenchError> {
        let text = std::fs::read_to_string(path).map_err(ioerr(format!("read {}", path.display())))?;
        let label = path.file_stem().map(|s| s.to_string_lossy().into_owned()).unwrap_or_default();
        Series::from_hgrm(&label, &text)
    }
}

fn percentile_label(x: f64) -> String {
    let p = 100.0 * (1.0 - 1.0 / x.max(1.0));
    let digits = (x.log10().round() as usize).saturating_sub(2);
    format!("{p:.digits$}%")
}

/// Draws `series` into an SVG file at `path`.
///
/// # Errors
/// [`BenchError::Io`] when the directory cannot be made;
/// [`BenchError::Invalid`] carrying the drawing error (e.g. unwritable path).
pub fn svg(series: &[Series], title: &str, path: &Path) -> Result<(), BenchError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(ioerr(format!("create {}", dir.display())))?;
    }
    let text = svg_string(series, title, (960, 560))
        .map_err(|e| BenchError::Invalid(format!("plot {}: {e}", path.display())))?;
    std::fs::write(path, text).map_err(ioerr(format!("write {}", path.display())))
}

/// Draws `series` as an SVG document of `size` pixels (the status page
/// shows it inline).
///
/// # Errors
/// [`BenchError::Invalid`] carrying the drawing error.
pub fn svg_string(series: &[Series], title: &str, size: (u32, u32)) -> Result<String, BenchError> {
    let err = |e: &dyn std::fmt::Display| BenchError::Invalid(e.to_string());
    let all = || series.iter().flat_map(|s| s.points.iter());
    let xmax = all().map(|p| p.0).fold(100.0, f64::max) * 1.5;
    let ymax = all().map(|p| p.1).fold(0.001, f64::max) * 1.1;
    let mut out = String::new();
    let root = SVGBackend::with_string(&mut out, size).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d((1f64..xmax).log_scale(), 0f64..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("latency (ms)")
        .x_label_formatter(&|x| percentile_label(*x))
        .draw()
        .map_err(|e| err(&e))?;
    for (i, s) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(s.points.iter().copied(), color.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(s.label.clone())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    drop(chart);
    drop(root);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_hgrm_parse() {
        assert_eq!(percentile_label(10.0), "90%");
        assert_eq!(percentile_label(1000.0), "99.9%");
        let text = "       Value     Percentile TotalCount 1/(1-Percentile)\n\n   0.100 0.500000000000   5   2.00\n   0.200 1.000000000000   10\n#[Mean    =   0.150]\n";
        let s = Series::from_hgrm("a", text).unwrap();
        assert_eq!(s.points, vec![(2.0, 0.1)]);
        assert!(Series::from_hgrm("b", "nothing").is_err());
    }
}
