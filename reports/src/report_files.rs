//! The names and writes of a report's files, below every module that reads or writes them.

use crate::error::{io, ReportError};
use relattn_common::files;
use std::path::Path;

/// Whether `name` is an architecture name relattn writes: `cpu`, or `sm` and digits (the
/// compute capability, `sm90`, `sm100`). Only such names become directories, so a report
/// read back never names a path outside the directory it is written to.
pub(crate) fn is_arch_name(name: &str) -> bool {
    name == "cpu"
        || name
            .strip_prefix("sm")
            .is_some_and(|d| !d.is_empty() && d.len() <= 8 && d.bytes().all(|b| b.is_ascii_digit()))
}

pub(crate) fn check_arch_name(name: &str) -> Result<(), ReportError> {
    if is_arch_name(name) {
        Ok(())
    } else {
        Err(ReportError::BadArchName {
            name: name.to_string(),
        })
    }
}

/// Writes through a temporary file and a rename (`files::write_atomic`), so a reader never
/// sees half a file.
pub(crate) fn write_atomic(path: &Path, bytes: &[u8]) -> Result<(), ReportError> {
    files::write_atomic(path, |w| w.write_all(bytes)).map_err(io("write", path))
}
