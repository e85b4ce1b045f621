//! The causes triage names (`triage.rs`): the vocabulary of `--xfail` entries, below every
//! module that reads it.

/// Every cause triage names, with what it means: the words `--xfail` entries expect.
pub const CAUSES: [(&str, &str); 6] = [
    (
        "nan_leak",
        "passes with every unread slot finite: NaN leaks from memory no row may read (docs/operator.md section 5, class 7)",
    ),
    (
        "split_combine",
        "passes with one split: the split-KV path or its combine is wrong",
    ),
    ("flaky", "passes when run again on the same inputs"),
    (
        "wrong",
        "wrong in every variant triage ran: neither NaN from unread memory nor the split",
    ),
    (
        "fault",
        "a trap, a fault or a sanitizer report (not run again)",
    ),
    ("error", "the run could not complete (not run again)"),
];

/// What a cause means (None for a word that is not a cause).
pub fn meaning(cause: &str) -> Option<&'static str> {
    CAUSES.iter().find(|(c, _)| *c == cause).map(|(_, m)| *m)
}
