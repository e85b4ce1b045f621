//! Which worker trials share a kernel configuration, so a pool of worker processes compiles each
//! configuration once per run: a JIT-compiled kernel (CuTe DSL, Triton) is specialised on the
//! dtype, head counts and dim, page size, window, extent and the bucketed query length
//! (SPEC section 4.4), and on the split settings the case's trials force. Every trial of a case
//! has its case's key, so a case's trials also share one process and one case file.

use crate::trial_list::Trial;
use relattn_matrices::Case;
use std::collections::BTreeMap;

/// A case's kernel configuration, as the workers' JIT caches key it.
pub fn of_case(case: &Case) -> String {
    let f = case.facts();
    let splits: Vec<String> = case.splits.iter().map(|s| s.to_string()).collect();
    format!(
        "{}:h{}:kv{}:d{}:p{}:w{}:e{}:q{}:{}",
        f.dtype.name(),
        f.num_heads,
        f.num_kv_heads,
        f.head_dim,
        f.page_size,
        f.window_left,
        f.rel_extent,
        relattn_routing::bucket_max_seqlen_q(case.shape().max_query_len()),
        splits.join(",")
    )
}

/// `trials` in groups of one configuration each, groups in the order their first trial came.
pub fn groups(trials: Vec<Trial>) -> Vec<Vec<Trial>> {
    let mut index: BTreeMap<String, usize> = BTreeMap::new();
    let mut out: Vec<Vec<Trial>> = Vec::new();
    for t in trials {
        let key = t.case().map(|c| of_case(c)).unwrap_or_default();
        let at = *index.entry(key).or_insert_with(|| {
            out.push(Vec::new());
            out.len() - 1
        });
        out[at].push(t);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn a_cases_trials_share_a_group_and_every_trial_is_in_one() {
        let cases: Vec<std::sync::Arc<Case>> = relattn_matrices::load_tier("ci")
            .unwrap()
            .expand()
            .unwrap()
            .cases
            .into_iter()
            .map(std::sync::Arc::new)
            .collect();
        let trials: Vec<Trial> = cases
            .iter()
            .flat_map(|c| {
                ["a", "b"].map(|p| Trial {
                    name: format!("impl::w::{p}::{}", c.id),
                    kind: crate::trial_list::TrialKind::Gpu {
                        case: c.clone(),
                        target: crate::runner::Target::Worker {
                            worker: 0,
                            name: "w".into(),
                            path: p.into(),
                            label: "--impl w".into(),
                        },
                        split: relattn_matrices::SplitSetting::Policy,
                    },
                    ignore: None,
                })
            })
            .collect();
        let n = trials.len();
        let groups = groups(trials);
        assert_eq!(groups.iter().map(Vec::len).sum::<usize>(), n);
        assert!(
            groups.len() > 10 && groups.len() < cases.len(),
            "{}",
            groups.len()
        );
        let mut seen = HashSet::new();
        for g in &groups {
            let keys: HashSet<String> = g.iter().map(|t| of_case(t.case().unwrap())).collect();
            assert_eq!(keys.len(), 1);
            for t in g {
                assert!(seen.insert(t.name.clone()), "{} twice", t.name);
            }
        }
        // Both trials of a case are in one group.
        for c in &cases {
            let holding: Vec<usize> = groups
                .iter()
                .enumerate()
                .filter(|(_, g)| g.iter().any(|t| t.name.ends_with(&c.id)))
                .map(|(i, _)| i)
                .collect();
            assert_eq!(holding.len(), 1, "{}", c.id);
        }
    }
}
