//! `relattn report` exit codes: 0 for identical reports, 1 for a regression, 2 for a bad directory.

use relattn_reports::{Environment, ReportWriter, Row, Status};
use std::path::Path;
use std::process::Output;

fn rows() -> Vec<Row> {
    (0..4)
        .map(|i| {
            let mut r = Row::new(
                format!("c{i}"),
                format!("gpu::fallback::t{i}"),
                "fallback",
                Status::Pass,
            );
            r.max_abs = Some(1e-3);
            r.bound = Some(2e-2);
            r.tflops = Some(100.0);
            r.ms = Some(2.0);
            r.params.insert("layer".into(), "global_e128".into());
            r
        })
        .collect()
}

fn write(dir: &Path, rows: &[Row]) {
    write_arch(dir, "sm90", rows);
}

fn write_arch(dir: &Path, arch: &str, rows: &[Row]) {
    let env = Environment {
        gpu_name: Some("NVIDIA H200".into()),
        ..Environment::default()
    };
    let mut w = ReportWriter::create(dir, arch, env).unwrap();
    for r in rows {
        w.push(r.clone()).unwrap();
    }
    w.finish().unwrap();
}

fn relattn(args: &[&Path]) -> Output {
    crate::binary::relattn_command()
        .args(args)
        .output()
        .unwrap()
}

fn code(out: &Output) -> i32 {
    out.status.code().unwrap_or(-1)
}

#[test]
fn report_diff_show_and_merge_exit_codes() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, same, worse) = (
        tmp.path().join("base"),
        tmp.path().join("same"),
        tmp.path().join("worse"),
    );
    write(&base, &rows());
    write(&same, &rows());
    let mut planted = rows();
    planted[1].status = Status::Fail;
    planted[1].message = "max_abs over bound".into();
    write(&worse, &planted);
    let (report, diff) = (Path::new("report"), Path::new("diff"));

    let out = relattn(&[report, diff, &base, &same]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("no regression"));

    let out = relattn(&[report, diff, &base, &worse]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("gpu::fallback::t1"));

    let out = relattn(&[report, diff, &base, &worse, Path::new("--json")]);
    assert_eq!(code(&out), 1);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["new_failures"][0]["trial"], "gpu::fallback::t1");

    let missing = tmp.path().join("missing");
    let out = relattn(&[report, diff, &base, &missing]);
    assert_eq!(code(&out), 2);
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing"));
    assert_eq!(code(&relattn(&[report, Path::new("show"), &missing])), 2);

    let out = relattn(&[report, Path::new("show"), &worse]);
    assert_eq!(code(&out), 0);
    assert!(String::from_utf8_lossy(&out.stdout).contains("## Path `fallback`"));

    let merged = tmp.path().join("merged");
    let out = relattn(&[
        report,
        Path::new("merge"),
        &base,
        &same,
        Path::new("--out"),
        &merged,
    ]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(code(&relattn(&[report, diff, &base, &merged])), 0);
    // Shards that disagree about a trial cannot be merged.
    let out = relattn(&[
        report,
        Path::new("merge"),
        &base,
        &worse,
        Path::new("--out"),
        &merged,
    ]);
    assert_eq!(code(&out), 2);
}

#[test]
fn diff_of_a_cpu_report_against_a_gpu_baseline_exits_2() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, cpu) = (tmp.path().join("base"), tmp.path().join("cpu"));
    write(&base, &rows());
    write_arch(&cpu, "cpu", &rows());
    let out = relattn(&[Path::new("report"), Path::new("diff"), &base, &cpu]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(code(&out), 2, "{stderr}");
    assert!(stderr.contains("different architectures"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn diff_fails_on_missing_trials_unless_allowed() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, fewer) = (tmp.path().join("base"), tmp.path().join("fewer"));
    write(&base, &rows());
    write(&fewer, &rows()[..2]);
    let (report, diff) = (Path::new("report"), Path::new("diff"));
    let out = relattn(&[report, diff, &base, &fewer]);
    assert_eq!(code(&out), 1, "{}", String::from_utf8_lossy(&out.stdout));
    let out = relattn(&[report, diff, &base, &fewer, Path::new("--allow-missing")]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    assert!(String::from_utf8_lossy(&out.stdout).contains("2 missing"));
}

#[test]
fn report_plot_draws_the_plots_and_links_them() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("r");
    let mut judged = rows();
    for (i, r) in judged.iter_mut().enumerate() {
        r.params
            .insert("max_kv_len".into(), (1024 << i).to_string());
        // Two values of each parameter: a plot against one value is not drawn.
        r.params
            .insert("num_splits_run".into(), (1 + i % 2).to_string());
        let layer = ["global_e128", "local_e128"][i % 2];
        r.params.insert("layer".into(), layer.into());
    }
    write(&dir, &judged);
    let plots = dir.join("sm90/plots");
    std::fs::remove_dir_all(&plots).unwrap();
    let out = relattn(&[Path::new("report"), Path::new("plot"), &dir]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stderr));
    for (file, _, _) in relattn_reports::REPORT_PLOTS {
        let path = plots.join(file);
        assert!(stdout.contains(&path.display().to_string()), "{stdout}");
        assert!(std::fs::metadata(&path).unwrap().len() > 1000, "{file}");
    }
    let md = std::fs::read_to_string(dir.join("sm90/summary.md")).unwrap();
    assert!(md.contains("(plots/headroom.svg)"), "{md}");

    let out = relattn(&[
        Path::new("report"),
        Path::new("plot"),
        &tmp.path().join("none"),
    ]);
    assert_eq!(code(&out), 2);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("panicked"));
}

#[test]
fn diff_reads_a_csv_only_report_as_show_does() {
    let tmp = tempfile::tempdir().unwrap();
    let (base, csv_only) = (tmp.path().join("base"), tmp.path().join("csv_only"));
    write(&base, &rows());
    let mut planted = rows();
    planted[2].status = Status::Fail;
    write(&csv_only, &planted);
    std::fs::remove_file(csv_only.join("sm90/results.jsonl")).unwrap();
    let (report, diff) = (Path::new("report"), Path::new("diff"));
    // The failure is only in results.csv: diff must read it there.
    let out = relattn(&[report, diff, &base, &csv_only]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(code(&out), 1, "{stdout}");
    assert!(
        stdout.contains("gpu::fallback::t2 (pass -> fail)"),
        "{stdout}"
    );
    // And as the baseline.
    let out = relattn(&[report, diff, &csv_only, &csv_only]);
    assert_eq!(code(&out), 0, "{}", String::from_utf8_lossy(&out.stdout));
    let out = relattn(&[report, Path::new("show"), &csv_only]);
    assert!(String::from_utf8_lossy(&out.stdout).contains("1 fail"));
}

#[test]
fn report_help_names_every_subcommand() {
    let out = relattn(&[Path::new("--help")]);
    let help = String::from_utf8_lossy(&out.stdout);
    let line = help
        .lines()
        .find(|l| l.trim_start().starts_with("report "))
        .unwrap_or_else(|| panic!("{help}"));
    let out = relattn(&[Path::new("report"), Path::new("--help")]);
    let report_help = String::from_utf8_lossy(&out.stdout);
    let about = report_help.lines().next().unwrap_or("");
    for sub in ["show", "plot", "merge", "diff"] {
        assert!(line.to_lowercase().contains(sub), "{line}");
        assert!(about.to_lowercase().contains(sub), "{about}");
        assert!(
            report_help.contains(&format!("\n  {sub} ")),
            "{report_help}"
        );
    }
}
