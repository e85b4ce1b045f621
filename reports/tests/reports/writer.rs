//! The writer: files, header, durability, escaping, summaries.

use crate::common::{env, row};
use relattn_reports::{
    load, show, CompileCheck, ReportError, ReportWriter, Row, Status, FIXED_COLUMNS,
};
use std::fs;

const HEADER: &str = "case_id,trial,path,status,max_abs,mean_abs,rel_l2,bound,first_bad,ms,\
                      tflops,gbps,seed,message,wall_ms";

fn mixed_rows() -> Vec<Row> {
    let mut a = row("gpu::sheared_bias::a", "sheared_bias", Status::Pass);
    a.params.insert("heads".into(), "h16_kv2".into());
    let mut b = row("gpu::score_mod::b", "score_mod", Status::Fail);
    b.first_bad = Some("3:1:64".into());
    b.max_abs = Some(0.5);
    b.params.remove("dtype");
    b.params.insert("page".into(), "16".into());
    let mut c = Row::new("id_c", "reference::smoke::c", "reference", Status::Skip);
    c.message = "E % 128 != 0".into();
    vec![a, b, c]
}

#[test]
fn finish_writes_the_four_files_with_the_exact_header() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = mixed_rows();
    let mut w = ReportWriter::create(tmp.path(), "sm90", env("1/1")).unwrap();
    for r in &rows {
        w.push(r.clone()).unwrap();
    }
    let summary = w.finish().unwrap();
    let dir = tmp.path().join("sm90");
    for f in [
        "results.csv",
        "summary.json",
        "summary.md",
        "junit.xml",
        "results.jsonl",
    ] {
        assert!(dir.join(f).is_file(), "{f} missing");
    }
    assert_eq!(FIXED_COLUMNS.join(","), HEADER);
    let csv = fs::read_to_string(dir.join("results.csv")).unwrap();
    let header = csv.lines().next().unwrap();
    // Parameter columns: the sorted union over rows.
    assert_eq!(header, format!("{HEADER},dtype,heads,layer,page"));
    let second = csv.lines().nth(2).unwrap();
    assert!(second.starts_with("id_gpu::score_mod::b,gpu::score_mod::b,score_mod,fail,0.5,"));
    // The row has no dtype nor heads: those cells are empty.
    assert!(second.ends_with(",,,global_e1024,16"), "{second}");

    assert_eq!(
        (
            summary.counts.pass,
            summary.counts.fail,
            summary.counts.skip
        ),
        (1, 1, 1)
    );
    assert!(summary.complete);
    let worst = summary.by_path["score_mod"].worst.as_ref().unwrap();
    assert_eq!(worst.ratio, 0.5 / 2e-2);

    let back = load(tmp.path()).unwrap();
    assert_eq!(back.archs["sm90"].rows, rows);
    assert!(back.archs["sm90"].complete);
    // Without results.jsonl the CSV alone gives the same rows.
    fs::remove_file(dir.join("results.jsonl")).unwrap();
    assert_eq!(load(&dir).unwrap().archs["sm90"].rows, rows);
}

#[test]
fn summary_json_has_counts_worst_ratio_and_timing_per_path() {
    let tmp = tempfile::tempdir().unwrap();
    let mut w = ReportWriter::create(tmp.path(), "sm100", env("2/4")).unwrap();
    w.environment_mut().compile_checks.push(CompileCheck {
        arch: "sm_100".into(),
        program: "score_mod".into(),
        ok: false,
        message: "error: identifier undefined".into(),
    });
    w.environment_mut()
        .extra
        .insert("peak_tflops".into(), serde_json::json!(400.0));
    for (i, ms) in [1.0, 3.0, 2.0].into_iter().enumerate() {
        let mut r = row(&format!("gpu::fallback::t{i}"), "fallback", Status::Pass);
        r.ms = Some(ms);
        r.max_abs = Some(1e-3 * (i + 1) as f64);
        w.push(r).unwrap();
    }
    w.finish().unwrap();
    let text = fs::read_to_string(tmp.path().join("sm100/summary.json")).unwrap();
    let j: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(j["schema_version"], 1);
    assert_eq!(j["arch"], "sm100");
    assert_eq!(j["environment"]["gpu_name"], "NVIDIA H200");
    assert_eq!(j["environment"]["shard"], "2/4");
    assert!(j["environment"]["finished"].is_string());
    assert_eq!(j["counts"]["pass"], 3);
    assert_eq!(j["compile_checks_failed"], 1);
    let p = &j["by_path"]["fallback"];
    assert_eq!(p["counts"]["pass"], 3);
    assert_eq!(p["by_layer"]["global_e1024"]["pass"], 3);
    assert_eq!(p["worst"]["trial"], "gpu::fallback::t2");
    assert_eq!(p["timing"]["median_ms"], 2.0);
    assert_eq!(p["timing"]["total_ms"], 6.0);
    assert_eq!(p["timing"]["slowest_trial"], "gpu::fallback::t1");
    assert_eq!(p["timing"]["best_tflops_pct_of_peak"], 25.0);
    assert!(p["timing"]["best_gbps_pct_of_peak"].is_null());
    // A failed compile check makes the report fail even when every trial passed.
    let md = fs::read_to_string(tmp.path().join("sm100/summary.md")).unwrap();
    assert!(md.contains("**FAIL**"), "{md}");
    assert!(md.contains("identifier undefined"));
    assert!(md.contains("best 100.0 (25.00% of peak)"), "{md}");
}

#[test]
fn rows_pushed_before_an_interruption_stay_on_disk() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = mixed_rows();
    {
        let mut w = ReportWriter::create(tmp.path(), "cpu", env("1/1")).unwrap();
        w.push(rows[0].clone()).unwrap();
        w.push(rows[1].clone()).unwrap();
        // Dropped without finish, as when a run is killed.
    }
    let report = load(tmp.path()).unwrap();
    let cpu = &report.archs["cpu"];
    assert_eq!(cpu.rows, rows[..2].to_vec());
    assert!(!cpu.complete);
    assert_eq!(cpu.environment.gpu_name.as_deref(), Some("NVIDIA H200"));
    assert!(show(tmp.path()).unwrap().contains("INCOMPLETE"));

    // A row torn mid-write is dropped, the others kept.
    let log = tmp.path().join("cpu/results.jsonl");
    let mut text = fs::read_to_string(&log).unwrap();
    text.push_str("{\"case_id\":\"x\",\"tri");
    fs::write(&log, text).unwrap();
    assert_eq!(load(tmp.path()).unwrap().archs["cpu"].rows.len(), 2);
}

#[test]
fn a_new_run_replaces_the_files_of_an_old_one() {
    let tmp = tempfile::tempdir().unwrap();
    crate::common::write(tmp.path(), "sm90", "1/1", &mixed_rows());
    let w = ReportWriter::create(tmp.path(), "sm90", env("1/1")).unwrap();
    assert!(!tmp.path().join("sm90/results.csv").exists());
    drop(w);
    assert!(load(tmp.path()).unwrap().archs["sm90"].rows.is_empty());
}

#[test]
fn junit_escapes_markup_in_messages() {
    let tmp = tempfile::tempdir().unwrap();
    let mut fail = row("gpu::score_mod::<x>", "score_mod", Status::Fail);
    fail.message = "max|out-ref| <= bound && \"t\" 'h'\nrerun: relattn exec --case a&b\u{1}".into();
    let mut skip = Row::new("id2", "gpu::fallback::y", "fallback", Status::Skip);
    skip.message = "needs E < 1024 & \"page\" > 16\u{FFFF}".into();
    let err = Row::new("id3", "gpu::fallback::z", "fallback", Status::Error);
    crate::common::write(tmp.path(), "sm90", "1/1", &[fail, skip, err]);
    let xml = fs::read_to_string(tmp.path().join("sm90/junit.xml")).unwrap();
    assert!(
        xml.contains("message=\"max|out-ref| &lt;= bound &amp;&amp; &quot;t&quot; &apos;h&apos;"),
        "{xml}"
    );
    // A control character is shown as an escape, not dropped nor written raw.
    assert!(xml.contains("relattn exec --case a&amp;b\\u{1}\""), "{xml}");
    assert!(xml.contains("<testcase name=\"gpu::score_mod::&lt;x&gt;\""));
    assert!(xml.contains(
        "<skipped message=\"needs E &lt; 1024 &amp; &quot;page&quot; &gt; 16\u{FFFD}\"/>"
    ));
    assert!(xml.contains("<error type=\"error\"/>"), "{xml}");
    assert!(xml.contains(
        "<testsuite name=\"fallback\" tests=\"2\" skipped=\"1\" errors=\"1\" failures=\"0\""
    ));
    assert!(!xml.contains("a&b") && !xml.contains("<x>") && !xml.contains('\u{1}'));
    assert!(!xml.contains('\u{FFFF}'));
}

#[test]
fn junit_classnames_are_dotted_and_testcase_names_unique() {
    let tmp = tempfile::tempdir().unwrap();
    let rows = [
        row("impl::numpy::numpy::a::c1", "numpy/numpy", Status::Pass),
        row("impl::numpy::numpy::b::c2", "numpy/numpy", Status::Fail),
        row("gpu::fallback::a::c1", "fallback", Status::Pass),
    ];
    crate::common::write(tmp.path(), "cpu", "1/1", &rows);
    let xml = fs::read_to_string(tmp.path().join("cpu/junit.xml")).unwrap();
    let classnames: Vec<&str> = xml
        .split(" classname=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    assert_eq!(
        classnames,
        [
            "relattn.cpu.fallback",
            "relattn.cpu.numpy.numpy",
            "relattn.cpu.numpy.numpy"
        ],
        "{xml}"
    );
    let mut names: Vec<&str> = xml
        .split("<testcase name=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .collect();
    names.sort();
    names.dedup();
    assert_eq!(names.len(), rows.len(), "{xml}");
}

#[test]
fn junit_times_are_wall_times_and_never_negative() {
    let tmp = tempfile::tempdir().unwrap();
    let mut pass = row("gpu::score_mod::a", "score_mod", Status::Pass);
    (pass.ms, pass.wall_ms) = (Some(0.25), Some(1250.0));
    let skipped = Row::new("id2", "gpu::fallback::b", "fallback", Status::Skip);
    crate::common::write(tmp.path(), "sm90", "1/1", &[pass, skipped]);
    let xml = fs::read_to_string(tmp.path().join("sm90/junit.xml")).unwrap();
    // The testcase takes the trial's wall time, not the kernel's 0.25 ms.
    assert!(xml.contains("time=\"1.250\""), "{xml}");
    // A suite whose trials were all skipped has time 0, not -0.
    assert!(
        xml.contains("<testsuite name=\"fallback\" tests=\"1\" skipped=\"1\" errors=\"0\" failures=\"0\" time=\"0.000\">"),
        "{xml}"
    );
    assert!(!xml.contains("-0"), "{xml}");
    let root = xml.lines().find(|l| l.starts_with("<testsuites")).unwrap();
    assert!(!root.contains("skipped="), "{root}");
}

#[test]
fn summary_md_tables_by_path_and_layer_with_failures() {
    let tmp = tempfile::tempdir().unwrap();
    let mut rows = mixed_rows();
    let mut local = row("gpu::score_mod::local", "score_mod", Status::Pass);
    local.params.insert("layer".into(), "local_e512".into());
    rows.push(local);
    crate::common::write(tmp.path(), "sm90", "1/1", &rows);
    let md = show(tmp.path()).unwrap();
    assert!(
        md.contains("## Path `score_mod`: 1 pass, 1 fail, 0 skip, 0 error"),
        "{md}"
    );
    assert!(
        md.contains("| global_e1024 | 0 | 1 | 0 | 0 | 25.00 | `gpu::score_mod::b` |"),
        "{md}"
    );
    assert!(md.contains("| local_e512 | 1 | 0 | 0 | 0 |"), "{md}");
    assert!(md.contains("- `gpu::score_mod::b` (fail) [max_abs 0.5000, bound 0.02000]: gpu::score_mod::b did not pass"), "{md}");
    assert!(md.contains("- 1 x E % 128 != 0"), "{md}");
    assert_eq!(
        md,
        fs::read_to_string(tmp.path().join("sm90/summary.md")).unwrap()
    );
}

#[test]
fn bad_names_and_missing_directories_are_errors() {
    let tmp = tempfile::tempdir().unwrap();
    for name in ["", "..", "a/b"] {
        let e = ReportWriter::create(tmp.path(), name, env("1/1")).unwrap_err();
        assert!(matches!(e, ReportError::BadArchName { .. }), "{name}: {e}");
    }
    assert!(matches!(
        load(&tmp.path().join("nope")).unwrap_err(),
        ReportError::Io { .. }
    ));
    assert!(matches!(
        load(tmp.path()).unwrap_err(),
        ReportError::NotAReport { .. }
    ));
}
