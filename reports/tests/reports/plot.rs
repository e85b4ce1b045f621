//! The report plots: written with the report, one series per path, linked from summary.md, and
//! redrawn by `plot` for a report written without them.

use crate::common::{row, write};
use relattn_reports::{load, plot, show, Row, Status, REPORT_PLOTS};
use std::fs;

/// Judged rows of three paths over two layers, four KV lengths and two split counts, one exact
/// output (ratio 0) and one non-finite error.
fn judged_rows() -> Vec<Row> {
    let mut rows = Vec::new();
    for (p, path) in ["sheared_bias", "score_mod", "fallback"].iter().enumerate() {
        for i in 0..8 {
            let mut r = row(&format!("gpu::{path}::c{i}"), path, Status::Pass);
            r.max_abs = Some(1e-3 * (1 + i + p) as f64);
            r.params
                .insert("max_kv_len".into(), (512 << (i % 4)).to_string());
            r.params
                .insert("num_splits_run".into(), (1 + i % 2).to_string());
            let layer = if i % 2 == 0 {
                "global_e1024"
            } else {
                "local_e512"
            };
            r.params.insert("layer".into(), layer.into());
            rows.push(r);
        }
    }
    rows[0].max_abs = Some(0.0);
    rows[1].max_abs = Some(f64::NAN);
    rows[1].status = Status::Fail;
    rows
}

#[test]
fn a_report_draws_every_plot_with_one_series_per_path() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "sm90", "1/1", &judged_rows());
    let dir = tmp.path().join("sm90/plots");
    for (file, _, _) in REPORT_PLOTS {
        let svg = fs::read_to_string(dir.join(file)).unwrap_or_else(|e| panic!("{file}: {e}"));
        assert!(
            svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"),
            "{file}"
        );
        for (path, n) in [("fallback", "8"), ("score_mod", "8")] {
            assert!(
                svg.contains(&format!("{path} ({n})")),
                "{file}: no series {path}"
            );
        }
        // The non-finite error is counted in its path's legend, not drawn.
        assert!(svg.contains("sheared_bias (7, 1 non-finite)"), "{file}");
    }
    let headroom = fs::read_to_string(dir.join("headroom.svg")).unwrap();
    // One line per path in its colour (and its legend mark), and the bound in red.
    for color in ["#1F77B4", "#FF7F0E", "#2CA02C"] {
        let lines = headroom
            .matches(&format!(
                "<polyline fill=\"none\" opacity=\"1\" stroke=\"{color}\""
            ))
            .count();
        assert_eq!(lines, 2, "{color}");
    }
    assert!(headroom.contains("stroke=\"#FF0000\""));
    let by_kv = fs::read_to_string(dir.join("ratio_by_kv_len.svg")).unwrap();
    assert!(
        by_kv.matches("<circle").count() >= 23,
        "every finite point drawn"
    );
    let by_layer = fs::read_to_string(dir.join("ratio_by_layer.svg")).unwrap();
    assert!(by_layer.contains("global_e1024\n</text>") && by_layer.contains("local_e512\n</text>"));
    let md = fs::read_to_string(tmp.path().join("sm90/summary.md")).unwrap();
    assert!(
        md.contains("[error / bound per path](plots/headroom.svg)")
            && md.contains("(plots/ratio_by_layer.svg)"),
        "{md}"
    );
    assert!(show(tmp.path()).unwrap().contains("(plots/headroom.svg)"));
}

#[test]
fn a_report_without_judged_trials_has_no_plots() {
    let tmp = tempfile::tempdir().unwrap();
    let mut check = Row::new("c", "reference::oracle::c", "reference", Status::Pass);
    check.max_abs = Some(1e-15);
    let skip = Row::new("c", "gpu::score_mod::c", "score_mod", Status::Skip);
    write(tmp.path(), "cpu", "1/1", &[check, skip]);
    assert!(!tmp.path().join("cpu/plots").exists());
    let md = fs::read_to_string(tmp.path().join("cpu/summary.md")).unwrap();
    assert!(!md.contains("Plots:"), "{md}");
    let drawn = plot(tmp.path()).unwrap();
    assert!(drawn[0].drawn.is_empty() && drawn[0].skipped.is_empty());
}

#[test]
fn plot_draws_and_links_the_plots_of_a_report_written_without_them() {
    let tmp = tempfile::tempdir().unwrap();
    write(tmp.path(), "sm90", "1/1", &judged_rows());
    let arch = tmp.path().join("sm90");
    fs::remove_dir_all(arch.join("plots")).unwrap();
    let rows =
        |d: &std::path::Path| serde_json::to_string(&load(d).unwrap().archs["sm90"].rows).unwrap();
    let before = rows(tmp.path());
    let drawn = plot(tmp.path()).unwrap();
    assert_eq!(drawn.len(), 1);
    assert_eq!(drawn[0].dir, arch);
    assert_eq!(drawn[0].drawn.len(), REPORT_PLOTS.len());
    for file in &drawn[0].drawn {
        assert!(fs::metadata(arch.join("plots").join(file)).unwrap().len() > 1000);
    }
    assert!(fs::read_to_string(arch.join("summary.md"))
        .unwrap()
        .contains("(plots/headroom.svg)"));
    // Nothing else changed.
    assert_eq!(rows(tmp.path()), before);
}

#[test]
fn a_parameter_every_trial_shares_is_not_plotted_and_summary_md_says_why() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rows = judged_rows();
    for r in &mut rows {
        r.params.insert("num_splits_run".into(), "1".into());
    }
    write(tmp.path(), "sm90", "1/1", &rows);
    let arch = tmp.path().join("sm90");
    assert!(!arch.join("plots/ratio_by_splits.svg").exists());
    assert!(arch.join("plots/ratio_by_kv_len.svg").exists());
    let why = "every judged trial has num_splits_run 1: one value is not a plot";
    let md = fs::read_to_string(arch.join("summary.md")).unwrap();
    assert!(
        md.contains(&format!("Not drawn: `ratio_by_splits.svg`: {why}.")),
        "{md}"
    );
    let drawn = plot(tmp.path()).unwrap();
    assert_eq!(
        drawn[0].skipped,
        vec![("ratio_by_splits.svg", why.to_string())]
    );
}

#[test]
fn zeros_are_drawn_a_decade_below_the_smallest_ratio_and_the_axis_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    // judged_rows: one ratio of 0; the smallest positive one is 2e-3 / 2e-2 = 0.1.
    write(tmp.path(), "sm90", "1/1", &judged_rows());
    let svg = fs::read_to_string(tmp.path().join("sm90/plots/ratio_by_kv_len.svg")).unwrap();
    assert!(svg.contains("1 of 0 drawn at 1.0e-2"), "{svg}");
    // In view of the bound: no note that it is off the axis.
    assert!(!svg.contains("off the axis"), "{svg}");
}
