//! The roofline of a benchmark table: TFLOP/s against FLOP per byte, one series per path, each
//! point labelled, under the measured compute and memory roofs (drawn with `plot`'s chart).

use crate::plot::{chart, err, log_range, log_tick, Points, Series};
use plotters::prelude::*;

/// One measured point of a roofline.
#[derive(Debug, Clone, PartialEq)]
pub struct RooflinePoint {
    /// The series (a path).
    pub series: String,
    /// Written beside the point (a shape).
    pub label: String,
    /// FLOP per byte of the fewest bytes the work must move.
    pub intensity: f64,
    pub tflops: f64,
}

/// A roofline: the points (one series per path, each labelled), under the compute roof
/// `peaks.0` TFLOP/s and the memory roof `peaks.1` GB/s when they were measured.
pub fn roofline(
    title: &str,
    points: &[RooflinePoint],
    peaks: Option<(f64, f64)>,
) -> Result<String, String> {
    let mut series = Series::new();
    let drawable = |p: &&RooflinePoint| {
        [p.intensity, p.tflops]
            .iter()
            .all(|v| v.is_finite() && *v > 0.0)
    };
    for p in points.iter().filter(drawable) {
        series
            .entry(p.series.clone())
            .or_default()
            .push((p.intensity, p.tflops));
    }
    let peaks = peaks.filter(|(t, g)| t.is_finite() && g.is_finite() && *t > 0.0 && *g > 0.0);
    // The ridge: where the memory roof meets the compute roof.
    let ridge = peaks.map(|(t, g)| t * 1e3 / g);
    let x = log_range(
        series.values().flatten().map(|p| p.0),
        ridge.as_slice(),
        2.0,
    );
    let y = log_range(
        series.values().flatten().map(|p| p.1),
        &peaks.map(|p| p.0).into_iter().collect::<Vec<_>>(),
        2.0,
    );
    let (x0, x1) = (x.start, x.end);
    let labels: Vec<(f64, f64, String)> = points
        .iter()
        .filter(drawable)
        .map(|p| (p.intensity, p.tflops, p.label.clone()))
        .collect();
    chart(
        title,
        x.log_scale(),
        y.log_scale(),
        "FLOP per byte (fewest bytes the work must move)",
        "TFLOP/s (at the median time)",
        &series,
        Points,
        (&log_tick, &log_tick),
        move |c| {
            if let Some((tflops, gbps)) = peaks {
                // Straight on a log-log chart: the memory roof up to the ridge, then compute.
                let ridge = tflops * 1e3 / gbps;
                let roofs = [(x0, x0 * gbps / 1e3), (ridge, tflops), (x1, tflops)];
                c.draw_series(LineSeries::new(roofs, BLACK.stroke_width(2)))
                    .map_err(err)?
                    .label(format!("roofs: {tflops:.0} TFLOP/s, {gbps:.0} GB/s"))
                    .legend(|(x, y)| {
                        PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2))
                    });
            }
            c.draw_series(labels.iter().map(|(x, y, text)| {
                Text::new(text.clone(), (*x, *y), ("sans-serif", 12).into_font())
            }))
            .map_err(err)?;
            Ok(())
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostile_points_and_peaks_draw_without_panicking() {
        let points =
            [f64::NAN, f64::INFINITY, 0.0, -1.0, 1e308, 1e-308, 3.0].map(|v| RooflinePoint {
                series: "p".into(),
                label: "s".into(),
                intensity: v,
                tflops: v,
            });
        for peaks in [
            None,
            Some((f64::INFINITY, 1.0)),
            Some((1e-300, 1e300)),
            Some((700.0, 4000.0)),
        ] {
            roofline("t", &points, peaks).unwrap();
        }
    }
}
