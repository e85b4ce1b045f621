//! Tests of the report files, merge and diff (one test binary keeps link time low).

mod common;
mod diff;
mod load;
mod merge;
mod plot;
mod untrusted;
mod writer;
