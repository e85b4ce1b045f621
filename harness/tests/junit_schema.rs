//! junit.xml against the JUnit schema CI importers check: `tests/data/junit-10.xsd`, the Jenkins
//! xunit plugin's junit-10.xsd (MIT, its licence in the file) as pytest 8.3.4's source
//! distribution ships it for the same check. Validated by python3 with the `xmlschema` package
//! (or `lxml`); no Rust crate validates this schema correctly yet. Without either, xmlschema is
//! installed once into `target/` (as the worker tests install numpy); where pip cannot get it
//! (no network), the checks are ignored when the list is built, with the reason printed.
//!
//! The checks: the junit.xml of a real CPU run (routing passes, reference checks, GPU suites
//! whose trials are all skipped), one written from rows of every status with hostile text, and
//! a control that the validator rejects what the schema forbids (a negative suite time, a
//! `skipped` count on the root), so a validator that checks nothing cannot pass.

mod binary;
mod common;
#[allow(dead_code)]
mod python;

use libtest_mimic::{Arguments, Failed, Trial};
use relattn_reports::{Environment, ReportWriter, Row, Status};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode};

/// Validates each file named after the schema; prints one line per file, exit 1 if any fails.
const VALIDATE: &str = r#"
import sys
schema_path, files = sys.argv[1], sys.argv[2:]
try:
    import xmlschema
    schema = xmlschema.XMLSchema(schema_path)
    def errors(path):
        return [str(e).splitlines()[0] for e in schema.iter_errors(path)]
except ImportError:
    from lxml import etree
    schema = etree.XMLSchema(etree.parse(schema_path))
    def errors(path):
        return [] if schema.validate(etree.parse(path)) else [str(e) for e in schema.error_log]
bad = 0
for path in files:
    found = errors(path)
    print(("invalid: " if found else "valid: ") + path + "".join("\n  " + e for e in found[:5]))
    bad += bool(found)
sys.exit(1 if bad else 0)
"#;

fn schema() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/junit-10.xsd")
}

/// The `PYTHONPATH` under which python3 has a validator (xmlschema or lxml), or why there is none.
fn validator_path() -> Result<String, String> {
    static PATH: std::sync::OnceLock<Result<String, String>> = std::sync::OnceLock::new();
    PATH.get_or_init(|| {
        let probe = Command::new("python3")
            .args([
                "-c",
                "import importlib.util as u, sys; \
                 sys.exit(0 if u.find_spec('xmlschema') or u.find_spec('lxml') else 1)",
            ])
            .output();
        match probe {
            Ok(out) if out.status.success() => Ok(String::new()),
            Ok(_) => python::package_path("xmlschema", "xmlschema"),
            Err(e) => Err(format!("no python3 to validate with ({e})")),
        }
    })
    .clone()
}

/// (passed, what the validator printed).
fn validate(files: &[&Path]) -> (bool, String) {
    let out = Command::new("python3")
        .env("PYTHONPATH", validator_path().unwrap_or_default())
        .arg("-c")
        .arg(VALIDATE)
        .arg(schema())
        .args(files)
        .output()
        .expect("python3 runs");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    (out.status.success(), text)
}

fn valid(files: &[&Path]) -> Result<(), Failed> {
    match validate(files) {
        (true, _) => Ok(()),
        (false, text) => Err(text.into()),
    }
}

/// A real report: `relattn run` on one smoke case (no GPU here, so its GPU suites are all skips).
fn run_report() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let case = relattn_matrices::load_tier("smoke")?.expand()?.cases[0]
        .id
        .clone();
    let out = dir.path().to_str().ok_or("temporary path is not UTF-8")?;
    let run = common::relattn(&["run", "--matrix", "smoke", "--case", &case, "--out", out]);
    if !run.status.success() {
        return Err(common::text(&run.stderr).into());
    }
    let mut files = Vec::new();
    for arch in std::fs::read_dir(dir.path())? {
        let junit = arch?.path().join("junit.xml");
        if junit.is_file() {
            files.push(junit);
        }
    }
    if files.is_empty() {
        return Err("the run wrote no junit.xml".into());
    }
    valid(&files.iter().map(PathBuf::as_path).collect::<Vec<_>>())
}

/// Rows of every status, with markup, control characters, non-finite figures and a suite whose
/// trials were all skipped.
fn every_status() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let env = Environment {
        gpu_name: Some("NVIDIA H200 <\"&'>".into()),
        shard: Some("1/1".into()),
        ..Environment::default()
    };
    let mut w = ReportWriter::create(dir.path(), "sm90", env)?;
    let mut pass = Row::new("c1", "gpu::score_mod::a::c1", "score_mod", Status::Pass);
    (pass.max_abs, pass.bound, pass.ms, pass.wall_ms) =
        (Some(1e-3), Some(2e-2), Some(0.2), Some(3.5));
    let mut fail = Row::new("c2", "gpu::score_mod::<b>::c2", "score_mod", Status::Fail);
    (fail.max_abs, fail.bound, fail.wall_ms) = (Some(f64::NAN), Some(2e-2), Some(1e4));
    fail.first_bad = Some("3:1:64".into());
    fail.message = "max|out-ref| > bound && \"t\"\n\u{1}\u{1b}[31mred\u{FFFF}".into();
    let mut error = Row::new("c3", "gpu::fallback::c::c3", "fallback", Status::Error);
    error.wall_ms = Some(0.0);
    let mut skip = Row::new(
        "c4",
        "gpu::sheared_bias::d::c4",
        "sheared_bias",
        Status::Skip,
    );
    skip.message = "no GPU".into();
    for r in [pass, fail, error, skip] {
        w.push(r)?;
    }
    w.finish()?;
    valid(&[&dir.path().join("sm90/junit.xml")])
}

/// The validator is real: it rejects a negative suite time and a `skipped` count on the root.
fn validator_rejects() -> Result<(), Failed> {
    let dir = tempfile::tempdir()?;
    let ok = "<testsuite name=\"p\" tests=\"1\" failures=\"0\" errors=\"0\" skipped=\"1\" \
              time=\"0.000\"><testcase name=\"t\"><skipped/></testcase></testsuite>";
    let cases = [
        (
            "good.xml",
            format!("<testsuites tests=\"1\">{ok}</testsuites>"),
            true,
        ),
        (
            "negative_time.xml",
            format!("<testsuites>{}</testsuites>", ok.replace("0.000", "-0.000")),
            false,
        ),
        (
            "root_skipped.xml",
            format!("<testsuites tests=\"1\" skipped=\"1\">{ok}</testsuites>"),
            false,
        ),
    ];
    for (name, body, expect) in cases {
        let path = dir.path().join(name);
        std::fs::write(&path, format!("<?xml version=\"1.0\"?>\n{body}\n"))?;
        let (passed, text) = validate(&[&path]);
        if passed != expect {
            return Err(format!("{name}: expected valid = {expect}: {text}").into());
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Arguments::from_args();
    let ignore = validator_path().err();
    if let (Some(why), false) = (&ignore, args.list) {
        eprintln!("junit_schema: ignored: {why}");
    }
    let tests = [
        (
            "junit_schema::run_report",
            run_report as fn() -> Result<(), Failed>,
        ),
        ("junit_schema::every_status", every_status),
        ("junit_schema::validator_rejects", validator_rejects),
    ]
    .into_iter()
    .map(|(name, test)| {
        let why = ignore.clone();
        Trial::test(name, move || match why {
            // Asked to run anyway (--ignored): not a pass.
            Some(why) => Err(format!("cannot validate here: {why}").into()),
            None => test(),
        })
        .with_ignored_flag(ignore.is_some())
    })
    .collect();
    libtest_mimic::run(&args, tests).exit_code()
}
