//! Progress of long computations (the references of a large case take minutes): a callback
//! told, from any thread, how many (row, head) pairs just finished.

/// Called with the number of (row, head) pairs just computed.
pub type Progress<'a> = &'a (dyn Fn(u64) + Sync);

/// A progress callback that ignores the counts.
pub fn ignore(_: u64) {}
