//! junit.xml: one testsuite per path, one testcase per trial, for CI test-result views.
//!
//! Written with quick-junit (nextest's writer). The file validates against the Jenkins xunit
//! plugin's junit-10.xsd, the schema CI importers check JUnit files against (a test holds it to
//! that schema): testcase times are wall times of the trials, never negative, and the root
//! `<testsuites>` carries no `skipped` count, which that schema does not allow there.

use crate::row::{format_float, Row, Status};
use crate::summary::Summary;
use quick_junit::{NonSuccessKind, Property, Report, TestCase, TestCaseStatus, TestSuite};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

/// A row's wall time as a duration (none for a trial that did not run, or a bad figure).
fn wall_time(r: &Row) -> Option<Duration> {
    r.wall_ms
        .filter(|ms| ms.is_finite() && *ms >= 0.0)
        .and_then(|ms| Duration::try_from_secs_f64(ms / 1e3).ok())
}

/// Text XML 1.0 can hold, and a CI page can show: control characters (which quick-junit
/// would drop, ESC but not the rest of its sequence, and not C1 controls or a carriage return)
/// are written as visible escapes; U+FFFE and U+FFFF become U+FFFD.
fn xml_text(text: &str) -> String {
    crate::text::visible(text).replace(['\u{FFFE}', '\u{FFFF}'], "\u{FFFD}")
}

/// The details under a failure: the figures that judged it, then the message.
fn failure_body(r: &Row) -> String {
    let mut body = String::new();
    for (name, v) in [
        ("max_abs", r.max_abs),
        ("mean_abs", r.mean_abs),
        ("rel_l2", r.rel_l2),
        ("bound", r.bound),
    ] {
        if let Some(v) = v {
            let _ = writeln!(body, "{name} = {}", format_float(v));
        }
    }
    if let Some(fb) = &r.first_bad {
        let _ = writeln!(body, "first_bad (t:h:c) = {fb}");
    }
    body.push_str(&r.message);
    xml_text(&body)
}

fn test_case(r: &Row, classname: &str) -> TestCase {
    let status = match r.status {
        // pytest's convention: an unexpected pass of a non-strict entry passes.
        Status::Pass | Status::XPass => TestCaseStatus::success(),
        // pytest's convention: an expected failure is skipped, with its reason.
        Status::Skip | Status::XFail => {
            let mut s = TestCaseStatus::skipped();
            if !r.message.is_empty() {
                s.set_message(xml_text(&r.message));
            }
            s
        }
        Status::Fail | Status::Error => {
            let kind = if r.status == Status::Fail {
                NonSuccessKind::Failure
            } else {
                NonSuccessKind::Error
            };
            let mut s = TestCaseStatus::non_success(kind);
            s.set_type(r.status.as_str());
            if !r.message.is_empty() {
                s.set_message(xml_text(&r.message));
            }
            let body = failure_body(r);
            if !body.is_empty() {
                s.set_description(body);
            }
            s
        }
    };
    let mut case = TestCase::new(xml_text(&r.trial), status);
    case.set_classname(classname);
    if let Some(t) = wall_time(r) {
        case.set_time(t);
    }
    case
}

fn properties(summary: &Summary) -> Vec<Property> {
    let env = &summary.environment;
    [
        ("gpu", &env.gpu_name),
        ("capability", &env.capability),
        ("driver", &env.driver),
        ("cuda", &env.cuda_version),
        ("nvrtc", &env.nvrtc_version),
        ("relattn_revision", &env.relattn_revision),
        ("relattn_build", &env.relattn_build),
        ("git_revision", &env.git_revision),
        ("matrix", &env.matrix),
        ("shard", &env.shard),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_ref().map(|v| Property::new(k, xml_text(v))))
    .collect()
}

/// The classname of a path's testcases: dotted, as JUnit viewers split it into package and
/// class at dots. A worker's path is `worker/path` (`numpy/numpy`): its slash becomes a dot, so
/// a viewer shows `relattn.cpu.numpy` > `numpy` instead of a class named `numpy/numpy`.
/// Testcase names stay the trial names, unique within an architecture, so no two testcases of a
/// classname share a name.
fn classname(arch: &str, path: &str) -> String {
    format!("relattn.{arch}.{}", path.replace('/', "."))
}

/// Renders junit.xml for one architecture.
pub fn render(summary: &Summary, rows: &[Row]) -> String {
    let arch = &summary.arch;
    let mut by_path: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_path.entry(r.path.as_str()).or_default().push(r);
    }
    let mut report = Report::new(xml_text(&format!("relattn {arch}")));
    let mut total = Duration::ZERO;
    for (path, prs) in &by_path {
        let mut suite = TestSuite::new(xml_text(path));
        suite.add_properties(properties(summary));
        let classname = xml_text(&classname(arch, path));
        let time: Duration = prs.iter().filter_map(|r| wall_time(r)).sum();
        suite.set_time(time);
        total += time;
        suite.add_test_cases(prs.iter().map(|r| test_case(r, &classname)));
        report.add_test_suite(suite);
    }
    report.set_time(total);
    let xml = report
        .to_string()
        .unwrap_or_else(|e| format!("<!-- junit.xml could not be written: {e} -->\n"));
    drop_root_skipped(&xml)
}

/// Removes the `skipped` attribute of the root `<testsuites>` element (the first start tag after
/// the declaration), which quick-junit always writes. Attribute values are escaped, so the
/// first ` skipped="` inside that tag is the attribute.
fn drop_root_skipped(xml: &str) -> String {
    let Some(root) = xml.find("<testsuites") else {
        return xml.to_string();
    };
    let tag_end = root + xml[root..].find('>').unwrap_or(xml.len() - root);
    let Some(at) = xml[root..tag_end].find(" skipped=\"").map(|i| root + i) else {
        return xml.to_string();
    };
    let value_start = at + " skipped=\"".len();
    let Some(len) = xml[value_start..tag_end].find('"') else {
        return xml.to_string();
    };
    format!("{}{}", &xml[..at], &xml[value_start + len + 1..])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_root_loses_its_skipped_count_only() {
        let xml = "<?xml version=\"1.0\"?>\n<testsuites name=\"a skipped=&quot;1&quot;\" \
                   tests=\"2\" skipped=\"1\" failures=\"0\">\n<testsuite skipped=\"1\"/>";
        assert_eq!(
            drop_root_skipped(xml),
            "<?xml version=\"1.0\"?>\n<testsuites name=\"a skipped=&quot;1&quot;\" \
             tests=\"2\" failures=\"0\">\n<testsuite skipped=\"1\"/>"
        );
    }

    #[test]
    fn bad_wall_times_are_left_out() {
        let mut r = Row::new("c", "t", "p", Status::Pass);
        for ms in [f64::NAN, -0.0 - 1.0, f64::INFINITY, 1e300] {
            r.wall_ms = Some(ms);
            assert_eq!(wall_time(&r), None, "{ms}");
        }
        r.wall_ms = Some(1500.0);
        assert_eq!(wall_time(&r), Some(Duration::from_millis(1500)));
    }
}
