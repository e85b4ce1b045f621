//! `relattn route --check`: ask a worker for its implementation's routing decision on every
//! capability of the routing table and every shape of the routing trials, and compare each
//! answer with relattn's model. Every disagreement is put in the bug classes of docs/operator.md
//! section 5 it shows. No GPU is needed: the capability is mocked inside the worker.
//!
//! A worker may answer `unsupported` for a capability it has no route for (the `triton`
//! worker routes only the SM8x GPUs a pull request moves): those shapes count as unanswered,
//! neither agreeing nor disagreeing. A route a worker marks `proposed` (an unreleased change) is
//! checked like any other and shown as proposed.

use crate::exit;
use crate::trial_list::routing_shapes;
use crate::worker::protocol::{Route, RouteAnswer, RouteShape};
use crate::worker::WorkerRunner;
use relattn_routing::{decide, lookup, table, Capability, Decision, Shape};
use serde_json::{json, Value};
use std::collections::BTreeMap;

/// A disagreement's bug class (docs/operator.md section 5), with the text reports print.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Class {
    /// num_splits > 1 handed to an architecture without split-KV (docs/operator.md section 5, class
    /// 2).
    SplitKvWithoutSupport,
    /// Routed to another architecture family's path (class 3).
    FamilyMisclassified,
    /// An architecture relattn rejects is routed (class 4: it would fail late).
    NotRejected,
    /// An architecture relattn routes is rejected.
    WronglyRejected,
    /// Same path, another split count, on an architecture that has split-KV.
    NumSplitsDiffer,
    /// The fallback path's split-KV decode: another split count than docs/operator.md section 4.3's
    /// (1 when the decode kernel does not run), as the worker reports it (`decode_splits`).
    DecodeSplitsDiffer,
}

impl Class {
    pub fn key(self) -> &'static str {
        match self {
            Class::SplitKvWithoutSupport => "split_kv_without_support",
            Class::FamilyMisclassified => "family_misclassified",
            Class::NotRejected => "unsupported_not_rejected",
            Class::WronglyRejected => "supported_rejected",
            Class::NumSplitsDiffer => "num_splits_differ",
            Class::DecodeSplitsDiffer => "decode_splits_differ",
        }
    }

    pub fn text(self) -> &'static str {
        match self {
            Class::SplitKvWithoutSupport => {
                "split-KV handed to an architecture without it (docs/operator.md section 5, class 2)"
            }
            Class::FamilyMisclassified => "capability family misclassified (docs/operator.md section 5, class 3)",
            Class::NotRejected => "unsupported architecture not rejected (docs/operator.md section 5, class 4)",
            Class::WronglyRejected => "supported architecture rejected",
            Class::NumSplitsDiffer => "num_splits differs from docs/operator.md section 4.1",
            Class::DecodeSplitsDiffer => "split-KV decode differs from docs/operator.md section 4.3",
        }
    }
}

/// The classes one (model, worker) pair of answers shows; empty when they agree.
pub fn classify(cc: Capability, model: &Decision, worker: &RouteAnswer) -> Vec<Class> {
    let split_kv = lookup(cc).is_some_and(|r| r.split_kv);
    let mut out = Vec::new();
    match (model.path, worker) {
        (_, RouteAnswer::Unsupported(_)) => {}
        (None, RouteAnswer::Rejected(_)) => {}
        (Some(_), RouteAnswer::Rejected(_)) => out.push(Class::WronglyRejected),
        (
            model_path,
            RouteAnswer::Routed {
                path,
                num_splits,
                decode_splits,
            },
        ) => {
            let splits = num_splits.unwrap_or(1);
            if splits > 1 && !split_kv {
                out.push(Class::SplitKvWithoutSupport);
            }
            match model_path {
                None => out.push(Class::NotRejected),
                Some(p) if p.as_str() != path => out.push(Class::FamilyMisclassified),
                Some(p) => {
                    if split_kv && Some(splits) != model.num_splits {
                        out.push(Class::NumSplitsDiffer);
                    }
                    let decode_policy = p == relattn_routing::PathId::Fallback;
                    if decode_policy
                        && decode_splits.is_some_and(|d| Some(d) != model.decode_splits)
                    {
                        out.push(Class::DecodeSplitsDiffer);
                    }
                }
            }
        }
    }
    out
}

/// One capability's tally.
#[derive(Debug, Clone, Default)]
pub struct Tally {
    pub shapes: usize,
    pub agree: usize,
    pub disagree: usize,
    /// Shapes the worker answered `unsupported` for (it has no route there), and its first
    /// message.
    pub unanswered: usize,
    pub unanswered_why: Option<String>,
    /// The worker's text for a proposed route, when an answer was marked so.
    pub proposed: Option<String>,
    pub classes: BTreeMap<Class, usize>,
    /// The first disagreement, as JSON.
    pub example: Option<Value>,
}

fn route_shape(s: &Shape) -> RouteShape {
    RouteShape {
        is_local: s.is_local,
        batch: s.batch,
        max_query_len: s.max_query_len,
        heads: s.num_heads,
        kv_heads: s.num_kv_heads,
        max_kv_len: s.max_kv_len,
        page_size: s.page_size,
        window_left: s.window_left,
    }
}

fn answer_json(a: &RouteAnswer) -> Value {
    match a {
        RouteAnswer::Routed {
            path,
            num_splits,
            decode_splits,
        } => {
            json!({"path": path, "rejected": false, "num_splits": num_splits,
                   "decode_splits": decode_splits})
        }
        RouteAnswer::Rejected(r) => json!({"path": null, "rejected": true, "reason": r}),
        RouteAnswer::Unsupported(m) => json!({"unsupported": m}),
    }
}

/// Compare the worker with the model on every capability of the table and every shape.
pub fn check(worker: &WorkerRunner) -> anyhow::Result<Vec<(Capability, Tally)>> {
    let shapes = routing_shapes();
    let mut out = Vec::new();
    for row in table() {
        let cc = row.cc;
        let mut tally = Tally::default();
        for shape in &shapes {
            let rs = route_shape(shape);
            let Route { answer, proposed } = worker
                .route(&cc.to_string(), &rs)
                .map_err(|e| exit::usage(format!("worker {}: {e}", worker.name())))?;
            tally.shapes += 1;
            if let RouteAnswer::Unsupported(m) = &answer {
                tally.unanswered += 1;
                tally.unanswered_why.get_or_insert_with(|| m.clone());
                continue;
            }
            if let Some(p) = proposed {
                tally.proposed.get_or_insert(p);
            }
            let model = decide(cc, shape);
            let classes = classify(cc, &model, &answer);
            if classes.is_empty() {
                tally.agree += 1;
                continue;
            }
            tally.disagree += 1;
            for &c in &classes {
                *tally.classes.entry(c).or_default() += 1;
            }
            tally.example.get_or_insert_with(|| {
                json!({
                    "shape": serde_json::to_value(shape).unwrap_or(Value::Null),
                    "relattn": {"path": model.path.map(|p| p.as_str()), "rejected": model.rejected,
                                "num_splits": model.num_splits, "decode_splits": model.decode_splits},
                    "worker": answer_json(&answer),
                    "classes": classes.iter().map(|c| c.key()).collect::<Vec<_>>(),
                })
            });
        }
        out.push((cc, tally));
    }
    if out.iter().all(|(_, t)| t.unanswered == t.shapes) {
        let why = out
            .iter()
            .find_map(|(_, t)| t.unanswered_why.clone())
            .unwrap_or_default();
        return Err(exit::usage(format!(
            "worker {} has no routing to check: {why}",
            worker.name()
        )));
    }
    Ok(out)
}

pub fn to_json(worker: &WorkerRunner, tallies: &[(Capability, Tally)]) -> Value {
    json!({
        "worker": {"name": worker.hello.name, "version": worker.hello.version},
        "capabilities": tallies.iter().map(|(cc, t)| json!({
            "cc": cc.to_string(),
            "shapes": t.shapes,
            "agree": t.agree,
            "disagree": t.disagree,
            "unanswered": t.unanswered,
            "unanswered_reason": t.unanswered_why,
            "proposed": t.proposed,
            "classes": t.classes.iter().map(|(c, n)| (c.key().to_string(), json!(n)))
                .collect::<serde_json::Map<_, _>>(),
            "example": t.example,
        })).collect::<Vec<_>>(),
    })
}

pub fn render(worker: &WorkerRunner, tallies: &[(Capability, Tally)]) -> String {
    let mut s = format!(
        "route --check: worker {} ({}) against relattn's routing model, {} shapes per capability\n",
        worker.hello.name,
        worker.hello.version,
        tallies.first().map_or(0, |(_, t)| t.shapes)
    );
    let mut table = crate::table::new(
        &["SM", "shapes", "agree", "disagree", "classes"],
        &[1, 2, 3],
    );
    for (cc, t) in tallies {
        let classes: Vec<String> = t
            .classes
            .iter()
            .map(|(c, n)| format!("{}: {n}", c.text()))
            .collect();
        let mut note = if classes.is_empty() {
            "-".to_string()
        } else {
            classes.join("; ")
        };
        if t.proposed.is_some() {
            note.push_str(" [proposed]");
        }
        if t.unanswered == t.shapes {
            note = format!(
                "not routed by the worker: {}",
                t.unanswered_why.as_deref().unwrap_or("")
            );
        } else if t.unanswered > 0 {
            note.push_str(&format!(
                "; {} shapes not routed by the worker",
                t.unanswered
            ));
        }
        table.add_row(vec![
            cc.to_string(),
            t.shapes.to_string(),
            t.agree.to_string(),
            t.disagree.to_string(),
            note,
        ]);
    }
    s.push_str(&crate::table::text(&table));
    for (cc, t) in tallies {
        if let Some(e) = &t.example {
            s.push_str(&format!("SM {cc}, e.g. {e}\n"));
        }
    }
    // One line per proposal: the rows marked [proposed] check an unreleased change.
    let mut proposals: Vec<&str> = tallies
        .iter()
        .filter_map(|(_, t)| t.proposed.as_deref())
        .collect();
    proposals.dedup();
    for p in proposals {
        let ccs: Vec<String> = tallies
            .iter()
            .filter(|(_, t)| t.proposed.as_deref() == Some(p))
            .map(|(cc, _)| cc.to_string())
            .collect();
        s.push_str(&format!(
            "[proposed] SM {}: a proposed route, not in a release: {p}\n",
            ccs.join(", ")
        ));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn routed(path: &str, n: usize) -> RouteAnswer {
        RouteAnswer::Routed {
            path: path.into(),
            num_splits: Some(n),
            decode_splits: None,
        }
    }

    fn shape(batch: usize, max_kv_len: usize, is_local: bool) -> Shape {
        Shape {
            batch,
            max_query_len: 1,
            num_heads: 8,
            num_kv_heads: 1,
            max_kv_len,
            page_size: 16,
            window_left: if is_local { 511 } else { -1 },
            is_local,
        }
    }

    #[test]
    fn the_released_defects_fall_in_their_classes() {
        let s = shape(1, 1 << 20, false);
        let sm80 = Capability::new(8, 0);
        let m = decide(sm80, &s);
        assert_eq!(
            classify(sm80, &m, &routed("score_mod", 32)),
            [Class::SplitKvWithoutSupport, Class::FamilyMisclassified]
        );
        let sm121 = Capability::new(12, 1);
        let m = decide(sm121, &s);
        assert_eq!(
            classify(sm121, &m, &routed("sheared_bias", 128)),
            [Class::SplitKvWithoutSupport, Class::NotRejected]
        );
        assert!(classify(sm121, &m, &RouteAnswer::Rejected("no".into())).is_empty());
    }

    #[test]
    fn agreement_and_split_differences_on_blackwell() {
        let sm100 = Capability::new(10, 0);
        let s = shape(1, 1 << 20, false);
        let m = decide(sm100, &s);
        let n = m.num_splits.unwrap();
        assert!(classify(sm100, &m, &routed("sheared_bias", n)).is_empty());
        assert_eq!(
            classify(sm100, &m, &routed("sheared_bias", n + 1)),
            [Class::NumSplitsDiffer]
        );
        assert_eq!(
            classify(sm100, &m, &RouteAnswer::Rejected("x".into())),
            [Class::WronglyRejected]
        );
        let sm90 = Capability::new(9, 0);
        let m = decide(sm90, &s);
        assert!(classify(sm90, &m, &routed("score_mod", 1)).is_empty());
        assert_eq!(
            classify(sm90, &m, &routed("score_mod", 32)),
            [Class::SplitKvWithoutSupport]
        );
    }

    #[test]
    fn the_decode_policy_is_compared_where_the_worker_reports_it() {
        let sm86 = Capability::new(8, 6);
        // A local decode over 8192 keys at page 16: docs/operator.md section 4.3 takes the split-KV
        // decode (4 splits: the window's 512 keys in 128s) because max_kv_len >= 8192 comes first.
        let s = shape(1, 8192, true);
        let m = decide(sm86, &s);
        assert_eq!(m.decode_splits, Some(4));
        let fallback = |d: Option<usize>| RouteAnswer::Routed {
            path: "fallback".into(),
            num_splits: Some(1),
            decode_splits: d,
        };
        assert!(classify(sm86, &m, &fallback(Some(4))).is_empty());
        assert!(classify(sm86, &m, &fallback(None)).is_empty());
        assert_eq!(
            classify(sm86, &m, &fallback(Some(1))),
            [Class::DecodeSplitsDiffer]
        );
        // Not compared where the model's path has no decode kernel.
        let sm90 = Capability::new(9, 0);
        let m = decide(sm90, &s);
        let on_hopper = RouteAnswer::Routed {
            path: "score_mod".into(),
            num_splits: Some(1),
            decode_splits: Some(7),
        };
        assert!(classify(sm90, &m, &on_hopper).is_empty());
    }
}
