//! relattn-harness: the `relattn` command's library part, shared with the `trials` test target.

pub mod cmd;
pub mod exit;
pub mod judge;
pub mod selfcheck;
