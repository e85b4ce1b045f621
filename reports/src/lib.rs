//! relattn-reports: report rows, writers, merge and diff.
#![forbid(unsafe_code)]
