//! What trials run on: the implementations of a session, as one thread of the engine sees them.

use crate::runner::{Runner, Target};
use std::sync::Arc;

/// The implementations trials run on: the native paths (with the device slot of this thread)
/// and the session's workers, by index.
#[derive(Clone, Copy, Default)]
pub struct Runners<'a> {
    pub native: Option<(&'a dyn Runner, usize)>,
    pub workers: &'a [Arc<dyn Runner>],
    /// Where failing worker trials keep their case and output files (a report's `failures/`).
    pub keep: Option<&'a std::path::Path>,
    /// The process of each worker's pool this thread runs its trials on.
    pub worker_slot: usize,
    /// Run failing and erroring GPU trials again in variants that tell causes apart
    /// (`triage.rs`).
    pub triage: bool,
    /// Expected failures (`--xfail`), applied to every row once it is judged and triaged.
    pub xfail: Option<&'a crate::xfail::XFails>,
}

impl<'a> Runners<'a> {
    /// Only the native paths (or nothing).
    pub fn native(native: Option<(&'a dyn Runner, usize)>) -> Runners<'a> {
        Runners {
            native,
            workers: &[],
            keep: None,
            worker_slot: 0,
            triage: false,
            xfail: None,
        }
    }

    pub(crate) fn for_target(&self, target: &Target) -> Option<(&'a dyn Runner, usize)> {
        match target {
            Target::Native { .. } => self.native,
            Target::Worker { worker, .. } => {
                self.workers.get(*worker).map(|w| (&**w, self.worker_slot))
            }
        }
    }
}
