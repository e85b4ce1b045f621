//! junit.xml: one testsuite per path, one testcase per trial, for CI test-result views.

use crate::row::{format_float, Row, Status};
use crate::summary::Summary;
use std::collections::BTreeMap;
use std::fmt::Write;

/// Characters XML 1.0 cannot hold at all (most C0 controls, U+FFFE, U+FFFF) become U+FFFD.
fn xml_char_ok(c: char) -> bool {
    matches!(c, '\t' | '\n' | '\r') || (c >= ' ' && c != '\u{FFFE}' && c != '\u{FFFF}')
}

/// Escapes text for an attribute value; newlines and tabs as character references so parsers
/// keep them (attribute normalisation would turn them into spaces).
pub fn escape_attr(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            '\n' => out.push_str("&#10;"),
            '\r' => out.push_str("&#13;"),
            '\t' => out.push_str("&#9;"),
            c if xml_char_ok(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
    out
}

/// Escapes character data (element content).
pub fn escape_text(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            c if xml_char_ok(c) => out.push(c),
            _ => out.push('\u{FFFD}'),
        }
    }
    out
}

fn seconds(rows: &[&Row]) -> f64 {
    rows.iter()
        .filter_map(|r| r.ms)
        .filter(|m| m.is_finite())
        .sum::<f64>()
        / 1000.0
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
    body
}

/// Renders junit.xml for one architecture.
pub fn render(summary: &Summary, rows: &[Row]) -> String {
    let arch = &summary.arch;
    let mut by_path: BTreeMap<&str, Vec<&Row>> = BTreeMap::new();
    for r in rows {
        by_path.entry(r.path.as_str()).or_default().push(r);
    }
    let all: Vec<&Row> = rows.iter().collect();
    let c = &summary.counts;
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n");
    let _ = writeln!(
        x,
        "<testsuites name=\"relattn {}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
        escape_attr(arch),
        c.total(),
        c.fail,
        c.error,
        c.skip,
        seconds(&all)
    );
    for (path, prs) in &by_path {
        let count = |st: Status| prs.iter().filter(|r| r.status == st).count();
        let _ = writeln!(
            x,
            "  <testsuite name=\"{}\" tests=\"{}\" failures=\"{}\" errors=\"{}\" skipped=\"{}\" time=\"{:.3}\">",
            escape_attr(path),
            prs.len(),
            count(Status::Fail),
            count(Status::Error),
            count(Status::Skip),
            seconds(prs)
        );
        properties(&mut x, summary);
        let classname = escape_attr(&format!("relattn.{arch}.{path}"));
        for r in prs {
            let time = r.ms.filter(|m| m.is_finite()).unwrap_or(0.0) / 1000.0;
            let open = format!(
                "    <testcase name=\"{}\" classname=\"{classname}\" time=\"{time:.6}\"",
                escape_attr(&r.trial)
            );
            let message = escape_attr(&r.message);
            match r.status {
                Status::Pass => {
                    let _ = writeln!(x, "{open}/>");
                }
                Status::Skip => {
                    let _ = writeln!(
                        x,
                        "{open}>\n      <skipped message=\"{message}\"/>\n    </testcase>"
                    );
                }
                Status::Fail | Status::Error => {
                    let tag = if r.status == Status::Fail {
                        "failure"
                    } else {
                        "error"
                    };
                    let _ = writeln!(
                        x,
                        "{open}>\n      <{tag} message=\"{message}\" type=\"{}\">{}</{tag}>\n    </testcase>",
                        r.status,
                        escape_text(&failure_body(r))
                    );
                }
            }
        }
        let _ = writeln!(x, "  </testsuite>");
    }
    x.push_str("</testsuites>\n");
    x
}

fn properties(x: &mut String, summary: &Summary) {
    let env = &summary.environment;
    let props: Vec<(&str, &Option<String>)> = vec![
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
    ];
    let present: Vec<(&str, &String)> = props
        .into_iter()
        .filter_map(|(k, v)| v.as_ref().map(|v| (k, v)))
        .collect();
    if present.is_empty() {
        return;
    }
    let _ = writeln!(x, "    <properties>");
    for (k, v) in present {
        let _ = writeln!(
            x,
            "      <property name=\"{k}\" value=\"{}\"/>",
            escape_attr(v)
        );
    }
    let _ = writeln!(x, "    </properties>");
}
