//! `relattn report diff` and `report plot` on real rows: `tests/data/smoke_numpy/{a,b}` hold the
//! numpy worker's 77 rows of two runs of `relattn run --matrix smoke --impl numpy --paths
//! none` by one build (same verdicts and errors, throughputs 20% to 98% apart), error ratios
//! from 9.6e-6 to 1.4e-4.

use crate::common::{relattn, text};
use relattn_reports::{load, Row, TIMING_NOT_JUDGED};
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Output;

fn fixture(run: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/data/smoke_numpy/{run}"))
}

/// A copy of a fixture run, to edit or to draw into.
fn copy(run: &str, to: &Path) -> PathBuf {
    let dir = to.join(run);
    fs::create_dir_all(dir.join("cpu")).unwrap();
    for f in ["results.jsonl", "summary.json"] {
        fs::copy(fixture(run).join("cpu").join(f), dir.join("cpu").join(f)).unwrap();
    }
    dir
}

fn diff(base: &Path, new: &Path, extra: &[&str]) -> Output {
    let (b, n) = (base.to_str().unwrap(), new.to_str().unwrap());
    relattn(&[&["report", "diff", b, n], extra].concat())
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

#[test]
fn two_runs_of_one_build_diff_clean_by_default() {
    let (a, b) = (fixture("a"), fixture("b"));
    let out = diff(&a, &b, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 0, "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.starts_with("no regression: 77 trials compared"),
        "{stdout}"
    );
    // Timing is left out in one line that says why.
    assert_eq!(stdout.lines().nth(1), Some(TIMING_NOT_JUDGED), "{stdout}");
    assert_eq!(stdout.lines().count(), 2, "{stdout}");

    // The old throughput check is still there when asked for, and the fixture holds exactly
    // the drops that made it cry wolf.
    let out = diff(&a, &b, &["--timing"]);
    assert_eq!(code(&out), 1, "{}", text(&out.stdout));
    assert!(
        text(&out.stdout).contains("Slowdowns ("),
        "{}",
        text(&out.stdout)
    );
    let out = diff(&a, &b, &["--timing", "--throughput-drop", "100"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    // Without --timing the threshold is accepted (scripts that passed it keep working) and
    // said to do nothing.
    let out = diff(&a, &b, &["--throughput-drop", "100"]);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("apply with --timing only"),
        "{}",
        text(&out.stderr)
    );
    let out = diff(&a, &b, &["--timing", "--throughput-drop", "101"]);
    assert_eq!(code(&out), 2, "{}", text(&out.stderr));
}

#[test]
fn a_planted_correctness_regression_exits_1_and_is_listed_first() {
    let tmp = tempfile::tempdir().unwrap();
    let worse = copy("b", tmp.path());
    let jsonl = worse.join("cpu/results.jsonl");
    let mut lines: Vec<String> = fs::read_to_string(&jsonl)
        .unwrap()
        .lines()
        .map(str::to_string)
        .collect();
    // The last trial in name order fails; the first one is gone.
    let (failed, gone) = (lines.len() - 1, 0);
    let trial = |line: &str| serde_json::from_str::<Row>(line).unwrap().trial;
    let (failed_trial, gone_trial) = (trial(&lines[failed]), trial(&lines[gone]));
    assert_eq!(lines[failed].matches("\"status\":\"pass\"").count(), 1);
    lines[failed] = lines[failed].replace("\"status\":\"pass\"", "\"status\":\"fail\"");
    lines.remove(gone);
    fs::write(&jsonl, lines.join("\n") + "\n").unwrap();

    let out = diff(&fixture("a"), &worse, &[]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}");
    assert!(
        stdout.starts_with("REGRESSION: 76 trials compared, 1 new failures"),
        "{stdout}"
    );
    let first_section = stdout.lines().find(|l| l.ends_with("):")).unwrap();
    assert_eq!(first_section, "New failures (1):", "{stdout}");
    assert!(
        stdout.contains(&format!("{failed_trial} (pass -> fail)")),
        "{stdout}"
    );

    // With timing judged too, both correctness findings come before any timing line.
    let out = diff(&fixture("a"), &worse, &["--timing"]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}");
    let slow = stdout
        .find("Slowdowns (")
        .expect("the fixture's drops are listed");
    for trial in [&failed_trial, &gone_trial] {
        let at = stdout.find(trial.as_str()).expect("listed");
        assert!(at < slow, "{trial} after the slowdowns:\n{stdout}");
    }
}

/// The numeric tick labels of one axis of a plotters SVG: (pixel position, value). `anchor`
/// picks the axis: `end` for the y axis (labels right-aligned left of it), `middle` for x.
fn ticks(svg: &str, anchor: &str) -> Vec<(f64, f64)> {
    let mut out = Vec::new();
    for tag in svg.split("<text ").skip(1) {
        let Some((attrs, rest)) = tag.split_once('>') else {
            continue;
        };
        // Every attribute preceded by a space, the first one too.
        let attrs = format!(" {attrs}");
        let attr = |name: &str| -> Option<f64> {
            let start = attrs.find(&format!(" {name}=\""))? + name.len() + 3;
            attrs[start..].split('"').next()?.parse().ok()
        };
        let label = rest.split("</text>").next().unwrap_or("").trim();
        let is_anchor = attrs.contains(&format!("text-anchor=\"{anchor}\""));
        if let (true, Ok(value), Some(x), Some(y)) =
            (is_anchor, label.parse::<f64>(), attr("x"), attr("y"))
        {
            out.push((if anchor == "end" { y } else { x }, value));
        }
    }
    out
}

/// Maps a pixel position to a value on a log axis, from its outermost two tick labels.
fn log_axis(ticks: &[(f64, f64)]) -> impl Fn(f64) -> f64 {
    let lo = ticks
        .iter()
        .copied()
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    let hi = ticks
        .iter()
        .copied()
        .max_by(|a, b| a.0.total_cmp(&b.0))
        .unwrap();
    assert!(hi.0 > lo.0, "{ticks:?}");
    let slope = (hi.1.log10() - lo.1.log10()) / (hi.0 - lo.0);
    move |px| 10f64.powf(lo.1.log10() + (px - lo.0) * slope)
}

/// The smallest and largest of `values`.
fn span(values: impl Iterator<Item = f64>) -> (f64, f64) {
    values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    })
}

fn near(drawn: f64, real: f64) -> bool {
    // A pixel is about 1/70 of a decade here; 25% is many pixels and far less than the 10x
    // a floor would put between them.
    (drawn / real - 1.0).abs() < 0.25
}

#[test]
fn plots_of_a_smoke_report_show_the_real_range_of_its_ratios() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy("a", tmp.path());
    let out = relattn(&["report", "plot", dir.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    assert_eq!(code(&out), 0, "{}", text(&out.stderr));
    assert!(
        stdout.contains(
            "ratio_by_splits.svg: not drawn: every judged trial has num_splits_run 1: one value \
             is not a plot"
        ),
        "{stdout}"
    );
    let plots = dir.join("cpu/plots");
    assert!(!plots.join("ratio_by_splits.svg").exists());
    let rows = load(&dir).unwrap().archs["cpu"].rows.clone();
    let (lo, hi) = span(rows.iter().filter_map(Row::ratio));
    assert!(
        lo > 9e-6 && hi < 2e-4,
        "the fixture's range: {lo:e}..{hi:e}"
    );

    // Each point of ratio_by_kv_len.svg, read back through its y axis' labels.
    let svg = fs::read_to_string(plots.join("ratio_by_kv_len.svg")).unwrap();
    let y = log_axis(&ticks(&svg, "end"));
    // The points (radius 3), not the legend's mark.
    let cys = svg
        .split("<circle ")
        .skip(1)
        .filter(|c| c.contains("r=\"3\""))
        .filter_map(|c| {
            let start = c.find("cy=\"")? + 4;
            c[start..].split('"').next()?.parse::<f64>().ok()
        });
    let drawn: Vec<f64> = cys.map(&y).collect();
    assert_eq!(drawn.len(), rows.len());
    let (dlo, dhi) = span(drawn.iter().copied());
    assert!(
        near(dlo, lo) && near(dhi, hi),
        "drawn {dlo:e}..{dhi:e}, real {lo:e}..{hi:e}"
    );

    // headroom.svg: the distribution's line runs from the smallest ratio to the largest.
    let svg = fs::read_to_string(plots.join("headroom.svg")).unwrap();
    let x = log_axis(&ticks(&svg, "middle"));
    let line = svg
        .split("<polyline ")
        .filter(|p| p.contains("stroke=\"#1F77B4\""))
        .filter_map(|p| p.split("points=\"").nth(1)?.split('"').next())
        .max_by_key(|points| points.len())
        .expect("the numpy path's line");
    let xs = line
        .split_whitespace()
        .filter_map(|xy| xy.split(',').next()?.parse::<f64>().ok());
    let (dlo, dhi) = span(xs.map(&x));
    assert!(
        near(dlo, lo) && near(dhi, hi),
        "drawn {dlo:e}..{dhi:e}, real {lo:e}..{hi:e}"
    );
}
