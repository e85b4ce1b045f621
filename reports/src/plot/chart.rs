//! The chart every plot is drawn on (the report plots and `relattn bench`'s roofline): axes,
//! tick labels, series colours, marks and legend.

use plotters::coord::ranged1d::{AsRangedCoord, ValueFormatter};
use plotters::prelude::*;
use std::collections::BTreeMap;

pub(crate) const SIZE: (u32, u32) = (900, 560);

pub(crate) type Series = BTreeMap<String, Vec<(f64, f64)>>;

/// Series colours (Tableau 10 without its red, which marks the bound).
const COLORS: [RGBColor; 9] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

pub(crate) fn color(i: usize) -> RGBColor {
    COLORS[i % COLORS.len()]
}

/// A log axis covering `values` (and `also`), `room` times wider at the top and 2 times at
/// the bottom; finite whatever the values.
pub(crate) fn log_range(
    values: impl Iterator<Item = f64>,
    also: &[f64],
    room: f64,
) -> std::ops::Range<f64> {
    let (mut lo, mut hi) = (f64::INFINITY, 0.0f64);
    for v in values.chain(also.iter().copied()) {
        if v.is_finite() && v > 0.0 {
            lo = lo.min(v);
            hi = hi.max(v);
        }
    }
    let (lo, hi) = (lo / 2.0, hi * room);
    if lo.is_finite() && hi.is_finite() && lo > 0.0 && hi > lo {
        lo..hi
    } else {
        0.1..10.0
    }
}

pub(crate) fn err(e: impl std::fmt::Display) -> String {
    e.to_string()
}

/// The radius of a series' mark in the legend (the points have 3).
pub(crate) const LEGEND_MARK: i32 = 4;

/// How an axis writes its tick labels.
pub(crate) type TickLabel<'a> = &'a dyn Fn(&f64) -> String;

/// How a chart draws its series: lines, or points.
pub(crate) enum Style {
    Lines,
    Points,
}
pub(crate) use Style::{Lines, Points};

/// Draws `series` (one colour and legend entry each) on a chart with the given axes, then
/// `extra` (bound lines, roofs, labels) and the legend.
#[allow(clippy::too_many_arguments)]
pub(crate) fn chart<X, Y>(
    title: &str,
    x: X,
    y: Y,
    x_desc: &str,
    y_desc: &str,
    series: &Series,
    style: Style,
    labels: (TickLabel<'_>, TickLabel<'_>),
    extra: impl FnOnce(
        &mut ChartContext<'_, SVGBackend<'_>, Cartesian2d<X::CoordDescType, Y::CoordDescType>>,
    ) -> Result<(), String>,
) -> Result<String, String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: ValueFormatter<f64>,
    Y::CoordDescType: ValueFormatter<f64>,
{
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, SIZE).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut c = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 20))
            .margin(16)
            .x_label_area_size(44)
            .y_label_area_size(64)
            .build_cartesian_2d(x, y)
            .map_err(err)?;
        // Few light lines: on a log axis plotters draws one per key point, and near a decade's
        // end they merge into a grey band.
        c.configure_mesh()
            .x_label_formatter(labels.0)
            .y_label_formatter(labels.1)
            .x_max_light_lines(2)
            .y_max_light_lines(2)
            .light_line_style(BLACK.mix(0.06))
            .x_desc(x_desc)
            .y_desc(y_desc)
            .draw()
            .map_err(err)?;
        for (i, (name, points)) in series.iter().enumerate() {
            let color = color(i);
            let drawn = if matches!(style, Lines) {
                c.draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))
                .map_err(err)?
            } else {
                c.draw_series(points.iter().map(|&p| Circle::new(p, 3, color.filled())))
                    .map_err(err)?
            };
            // The legend shows the mark the series is drawn with.
            let entry = drawn.label(name.as_str());
            if matches!(style, Points) {
                // A size larger than the points': a reader of the SVG tells them apart.
                entry.legend(move |(x, y)| Circle::new((x + 9, y), LEGEND_MARK, color.filled()));
            } else {
                entry.legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
                });
            }
        }
        extra(&mut c)?;
        c.configure_series_labels()
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .position(SeriesLabelPosition::UpperLeft)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A tick label of a log axis: only 1, 2 and 5 times a power of ten are labelled (plotters puts
/// a tick at every digit of a decade, and `8e-5`, `9e-5` and `1e-4` ran together).
pub(crate) fn log_tick(v: &f64) -> String {
    if !(v.is_finite() && *v > 0.0) {
        return String::new();
    }
    let mantissa = v / 10f64.powf(v.log10().floor());
    let near = |m: f64| (mantissa - m).abs() < 1e-6 * m || (mantissa - 10.0 * m).abs() < 1e-5 * m;
    if near(1.0) || near(2.0) || near(5.0) {
        compact(v)
    } else {
        String::new()
    }
}

/// A tick label: short decimals, exponents for the very small and very large.
pub(crate) fn compact(v: &f64) -> String {
    let a = v.abs();
    if *v == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        // Four significant digits: a log axis' ticks are products like 3 * 1e-5, which print
        // as 3.0000000000000004e-5 in full.
        let text = format!("{v:.3e}");
        match text.split_once('e') {
            Some((mantissa, exp)) => {
                let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
                format!("{mantissa}e{exp}")
            }
            None => text,
        }
    } else {
        let s = format!("{v:.3}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}
