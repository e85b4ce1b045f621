//! Matrix cases by id: what `run --case` and `gen --case` say when an id selects nothing, and
//! the one case an id (or a prefix of it) names for `gen --case`.

use crate::exit::usage;
use anyhow::Context;
use relattn_matrices::{Case, ID_PREFIX, TIERS};

/// Why no case of `matrix` has an id starting with `prefix`, with the id format when the prefix
/// lacks its letter.
pub fn no_case_message(matrix: &str, prefix: &str) -> String {
    let mut message = format!("no case of {matrix} has an id starting with `{prefix}`");
    if !prefix.starts_with(ID_PREFIX) {
        message.push_str(&format!(
            " (case ids start with `{ID_PREFIX}`; an id written without it, from before the \
             prefix, is the same digits after `{ID_PREFIX}`: `{ID_PREFIX}{prefix}`)"
        ));
    }
    message
}

/// The one case of `matrix` (a tier or a matrix file; None: every built-in tier) whose id starts
/// with `prefix`. None or several (different cases) is a usage error saying so.
pub fn find(matrix: Option<&str>, prefix: &str) -> anyhow::Result<Case> {
    let names: Vec<&str> = matrix.map_or(TIERS.to_vec(), |m| vec![m]);
    let mut found: Vec<Case> = Vec::new();
    for name in &names {
        let m = relattn_matrices::load(name).with_context(|| format!("loading matrix `{name}`"))?;
        let expansion = m
            .expand()
            .with_context(|| format!("expanding matrix `{name}`"))?;
        for case in expansion.cases {
            // A case in two tiers is one case: same id, same inputs.
            if case.id.starts_with(prefix) && !found.iter().any(|c| c.id == case.id) {
                found.push(case);
            }
        }
    }
    let searched = match matrix {
        Some(m) => format!("`{m}`"),
        None => format!("any built-in tier ({})", TIERS.join(", ")),
    };
    match found.len() {
        0 => Err(usage(no_case_message(&searched, prefix))),
        1 => Ok(found.remove(0)),
        n => {
            let ids: Vec<&str> = found.iter().take(5).map(|c| c.id.as_str()).collect();
            Err(usage(format!(
                "{n} cases of {searched} have an id starting with `{prefix}` ({}{}): give more \
                 of the id",
                ids.join(", "),
                if n > ids.len() { ", ..." } else { "" }
            )))
        }
    }
}
