//! Size limits of the operator's inputs, checked from shapes alone, before anything is allocated
//! or looped over.
//!
//! Two kinds of limit:
//! - ranges of single dimensions ([`Dim`]): what the operator's int32 metadata and the kernels
//!   allow (docs/operator.md section 2), independent of the machine;
//! - the bytes a case holds in memory ([`CaseSize::bytes`]): at most [`max_case_bytes`], by
//!   default [`MEMORY_FRACTION`] of the machine's memory (see [`memory_bytes`]).
//!
//! Every size is computed with saturating arithmetic, so absurd shapes are refused, never
//! wrapped around into small ones.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use thiserror::Error;

/// Largest value of the operator's int32 metadata (positions, lengths, block ids).
pub const INT32_MAX: usize = i32::MAX as usize;
/// Most query or KV heads per rank (the model has 64; 16 times that).
pub const MAX_HEADS: usize = 1024;
/// Largest head dim: the largest a flash-attention kernel supports (the model's is 128).
pub const MAX_HEAD_DIM: usize = 256;
/// Largest page: 16 times the largest a serving engine uses (256).
pub const MAX_PAGE_SIZE: usize = 4096;
/// The default case-byte limit is this fraction of memory: reading a case file holds its floats
/// and its stored bytes at the peak (up to twice its bytes), generating one its floats, and the
/// reference adds its f64 outputs.
pub const MEMORY_FRACTION: u64 = 8;
/// Memory assumed when the machine's cannot be read (no /proc/meminfo).
pub const FALLBACK_MEMORY_BYTES: u64 = 16 << 30;

/// A dimension of the operator's inputs with the range it may take.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dim {
    /// `T`, rows of q (real and padding).
    Rows,
    /// `H`.
    Heads,
    /// `Hkv`.
    KvHeads,
    /// `D`.
    HeadDim,
    /// `E`, entries of rel_logits per (row, head).
    Extent,
    /// Tokens per page.
    PageSize,
    /// Physical blocks of the cache.
    Blocks,
    /// `B`, requests.
    Batch,
    /// Block-table entries per request.
    MaxPages,
    /// `Lk` of a request.
    KvLen,
    /// Rows a sampled reference checks.
    SampleRows,
}

impl Dim {
    /// Inclusive range of the dimension.
    pub fn range(self) -> (usize, usize) {
        match self {
            Dim::Heads | Dim::KvHeads => (1, MAX_HEADS),
            Dim::HeadDim => (1, MAX_HEAD_DIM),
            Dim::PageSize => (1, MAX_PAGE_SIZE),
            Dim::Extent | Dim::SampleRows => (1, INT32_MAX),
            Dim::Rows | Dim::Blocks | Dim::Batch | Dim::MaxPages | Dim::KvLen => (0, INT32_MAX),
        }
    }

    /// Why the range is what it is, for messages.
    pub fn why(self) -> &'static str {
        match self {
            Dim::Rows => "packed rows are int32 offsets (cu_seqlens_q)",
            Dim::Heads | Dim::KvHeads => "at most 1024 heads per rank",
            Dim::HeadDim => "head dims of flash-attention kernels are at most 256",
            Dim::Extent => "relative distances are int32 positions",
            Dim::PageSize => "pages hold at most 4096 tokens",
            Dim::Blocks => "block ids are int32",
            Dim::Batch => "cu_seqlens_q and seqused_k are int32 tensors",
            Dim::MaxPages => "page indices are int32",
            Dim::KvLen => "seqused_k is int32",
            Dim::SampleRows => "sampled rows are int32 row indices",
        }
    }

    /// `value` of this dimension, named `what` in the error.
    pub fn check(self, what: impl Into<String>, value: u128) -> Result<(), LimitError> {
        let (min, max) = self.range();
        if (min as u128..=max as u128).contains(&value) {
            Ok(())
        } else {
            Err(LimitError::Range {
                what: what.into(),
                value,
                min,
                max,
                why: self.why(),
            })
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum LimitError {
    #[error("{what} = {value} is out of range {min}..={max} ({why})")]
    Range {
        what: String,
        value: u128,
        min: usize,
        max: usize,
        why: &'static str,
    },
    #[error(
        "{what} takes {}, over the limit of {} ({})",
        Bytes(*bytes),
        Bytes(*limit),
        limit_origin(*limit)
    )]
    TooLarge {
        what: String,
        bytes: u64,
        limit: u64,
    },
}

/// The dimensions that decide how much memory a case takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CaseSize {
    pub rows: usize,
    pub heads: usize,
    pub kv_heads: usize,
    pub head_dim: usize,
    pub extent: usize,
    pub page_size: usize,
    pub blocks: usize,
    pub batch: usize,
    pub max_pages: usize,
}

impl CaseSize {
    /// Bytes of the case's tensors in memory: q, rel_logits and the K/V buffer as f32, the block
    /// table, seqused_k and cu_seqlens_q as i32 (saturating: never wraps).
    pub fn bytes(&self) -> u64 {
        let n = |x: usize| x as u64;
        let mul = |xs: &[usize]| xs.iter().fold(1u64, |acc, &x| acc.saturating_mul(n(x)));
        let elements = [
            mul(&[self.rows, self.heads, self.head_dim]),
            mul(&[self.rows, self.heads, self.extent]),
            mul(&[2, self.blocks, self.page_size, self.kv_heads, self.head_dim]),
            mul(&[self.batch, self.max_pages]),
            mul(&[2, self.batch]).saturating_add(1),
        ];
        elements
            .iter()
            .fold(0u64, |acc, &e| acc.saturating_add(e))
            .saturating_mul(4)
    }

    /// Refuse the case, named `what` (e.g. "the case in memory"), when its bytes exceed `limit`.
    pub fn check_bytes(&self, what: impl Into<String>, limit: u64) -> Result<(), LimitError> {
        check_bytes(what, self.bytes(), limit)
    }
}

/// Refuse `bytes` of `what` above `limit`.
pub fn check_bytes(what: impl Into<String>, bytes: u64, limit: u64) -> Result<(), LimitError> {
    if bytes <= limit {
        Ok(())
    } else {
        Err(LimitError::TooLarge {
            what: what.into(),
            bytes,
            limit,
        })
    }
}

/// A byte count with its binary-prefixed size, e.g. `3221225472 bytes (3.0 GiB)`.
#[derive(Debug, Clone, Copy)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = self.0;
        let units = [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)];
        match units.iter().find(|(_, shift)| b >= 1u64 << shift) {
            Some((unit, shift)) => {
                let x = b as f64 / (1u64 << shift) as f64;
                write!(f, "{b} bytes ({x:.1} {unit})")
            }
            None => write!(f, "{b} bytes"),
        }
    }
}

/// 0: not set, use the default.
static MAX_CASE_BYTES: AtomicU64 = AtomicU64::new(0);

/// Set the case-byte limit of this process (`--max-case-bytes`); 0 restores the default.
pub fn set_max_case_bytes(bytes: u64) {
    MAX_CASE_BYTES.store(bytes, Ordering::Relaxed);
}

/// The case-byte limit in force: the one set, else [`default_max_case_bytes`].
pub fn max_case_bytes() -> u64 {
    match MAX_CASE_BYTES.load(Ordering::Relaxed) {
        0 => default_max_case_bytes(),
        n => n,
    }
}

/// [`MEMORY_FRACTION`] of [`memory_bytes`].
pub fn default_max_case_bytes() -> u64 {
    memory_bytes().0 / MEMORY_FRACTION
}

/// Where a limit comes from, for messages.
fn limit_origin(limit: u64) -> String {
    match MAX_CASE_BYTES.load(Ordering::Relaxed) {
        0 if limit == default_max_case_bytes() => {
            let (bytes, source) = memory_bytes();
            format!(
                "1/{MEMORY_FRACTION} of {}, {source}; raise it with --max-case-bytes",
                Bytes(bytes)
            )
        }
        n if n == limit => "set with --max-case-bytes".to_string(),
        _ => "the limit given".to_string(),
    }
}

/// The memory this process may use and where the figure comes from: the lowest of `MemTotal`
/// of /proc/meminfo, the cgroup's `memory.max` (containers) and this process's address-space
/// limit (`ulimit -v`, RLIMIT_AS, read from /proc/self/limits), or [`FALLBACK_MEMORY_BYTES`]
/// when none can be read.
pub fn memory_bytes() -> (u64, &'static str) {
    static MEMORY: OnceLock<(u64, &'static str)> = OnceLock::new();
    *MEMORY.get_or_init(|| {
        let read = |path| std::fs::read_to_string(path).ok();
        let total = read("/proc/meminfo").and_then(|text| mem_total(&text));
        let cgroup = read("/sys/fs/cgroup/memory.max").and_then(|text| text.trim().parse().ok());
        let address_space = read("/proc/self/limits").and_then(|text| address_space_limit(&text));
        lowest_memory(total, cgroup, address_space)
    })
}

/// The lowest of the figures that are known, named.
fn lowest_memory(
    total: Option<u64>,
    cgroup: Option<u64>,
    address_space: Option<u64>,
) -> (u64, &'static str) {
    [
        (total, "the machine's memory"),
        (cgroup, "the cgroup's memory.max"),
        (address_space, "the address-space limit (ulimit -v)"),
    ]
    .into_iter()
    .filter_map(|(bytes, source)| Some((bytes?, source)))
    .min_by_key(|&(bytes, _)| bytes)
    .unwrap_or((
        FALLBACK_MEMORY_BYTES,
        "memory assumed, /proc/meminfo unreadable",
    ))
}

/// The soft `Max address space` of /proc/self/limits text, in bytes (None: unlimited).
fn address_space_limit(limits: &str) -> Option<u64> {
    let line = limits
        .lines()
        .find(|l| l.starts_with("Max address space"))?;
    line["Max address space".len()..]
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

/// `MemTotal` of /proc/meminfo text, in bytes.
fn mem_total(meminfo: &str) -> Option<u64> {
    meminfo_bytes(meminfo, "MemTotal:")
}

/// A /proc/meminfo figure (kB there) in bytes.
fn meminfo_bytes(meminfo: &str, key: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// The memory the system could give without swapping now (`MemAvailable` of /proc/meminfo,
/// read anew on each call), or None where it cannot be read.
pub fn memory_available() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    meminfo_bytes(&text, "MemAvailable:")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_figures_are_read_in_bytes() {
        let meminfo = "MemTotal:       131072000 kB\nMemFree:         1000 kB\nMemAvailable:   \
                       65536000 kB\n";
        assert_eq!(mem_total(meminfo), Some(131_072_000 * 1024));
        assert_eq!(
            meminfo_bytes(meminfo, "MemAvailable:"),
            Some(65_536_000 * 1024)
        );
        assert_eq!(meminfo_bytes("MemTotal: lots kB\n", "MemTotal:"), None);
        assert_eq!(meminfo_bytes("", "MemAvailable:"), None);
    }

    #[test]
    fn the_lowest_memory_figure_wins_and_ulimit_v_counts() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max cpu time              unlimited            unlimited            seconds\n\
                      Max address space         2048000000           unlimited            bytes\n";
        assert_eq!(address_space_limit(limits), Some(2_048_000_000));
        let unlimited = limits.replace("2048000000", "unlimited ");
        assert_eq!(address_space_limit(&unlimited), None);
        assert_eq!(
            lowest_memory(Some(24 << 30), None, Some(2 << 30)),
            (2 << 30, "the address-space limit (ulimit -v)")
        );
        assert_eq!(
            lowest_memory(Some(24 << 30), Some(8 << 30), None),
            (8 << 30, "the cgroup's memory.max")
        );
        assert_eq!(lowest_memory(None, None, None).0, FALLBACK_MEMORY_BYTES);
        // This process's own figure is one of them, and never above the machine's memory.
        let own = std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| mem_total(&t));
        if let Some(total) = own {
            assert!(memory_bytes().0 <= total);
        }
    }

    #[test]
    fn ranges_hold_at_their_edges() {
        assert!(Dim::Heads.check("h", 0).is_err());
        assert!(Dim::Heads.check("h", 1).is_ok());
        assert!(Dim::Heads.check("h", MAX_HEADS as u128).is_ok());
        assert!(Dim::Heads.check("h", MAX_HEADS as u128 + 1).is_err());
        assert!(Dim::Blocks.check("b", 0).is_ok());
        assert!(Dim::Blocks.check("b", INT32_MAX as u128).is_ok());
        assert!(Dim::Blocks.check("b", INT32_MAX as u128 + 1).is_err());
        assert!(Dim::Extent.check("e", u64::MAX as u128).is_err());
        let msg = Dim::PageSize
            .check("page_size", 1 << 40)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("page_size = 1099511627776") && msg.contains("1..=4096"),
            "{msg}"
        );
    }

    #[test]
    fn bytes_saturate_instead_of_wrapping() {
        let max = CaseSize {
            rows: usize::MAX,
            heads: usize::MAX,
            head_dim: usize::MAX,
            extent: usize::MAX,
            blocks: usize::MAX,
            page_size: usize::MAX,
            kv_heads: usize::MAX,
            batch: usize::MAX,
            max_pages: usize::MAX,
        };
        assert_eq!(max.bytes(), u64::MAX);
        // 2^64 / 4 elements would wrap to 0 bytes without saturation.
        let wraps = CaseSize {
            rows: 1 << 31,
            heads: 1 << 31,
            head_dim: 1,
            ..CaseSize::default()
        };
        assert_eq!(wraps.bytes(), u64::MAX);
        let small = CaseSize {
            rows: 2,
            heads: 3,
            head_dim: 4,
            extent: 5,
            blocks: 6,
            page_size: 7,
            kv_heads: 1,
            batch: 2,
            max_pages: 3,
        };
        assert_eq!(small.bytes(), 4 * (24 + 30 + 2 * 6 * 7 * 4 + 6 + 5));
        assert!(small.check_bytes("case", small.bytes()).is_ok());
        let msg = small
            .check_bytes("case x", small.bytes() - 1)
            .unwrap_err()
            .to_string();
        assert!(
            msg.contains("case x takes 1604 bytes") && msg.contains("the limit given"),
            "{msg}"
        );
    }

    #[test]
    fn meminfo_is_read_in_bytes() {
        let text = "MemTotal:       24576000 kB\nMemFree:  1 kB\n";
        assert_eq!(mem_total(text), Some(24576000 * 1024));
        assert_eq!(mem_total("nothing"), None);
        assert!(memory_bytes().0 > 0);
    }

    #[test]
    fn byte_counts_print_with_units() {
        assert_eq!(Bytes(512).to_string(), "512 bytes");
        assert_eq!(Bytes(3 << 30).to_string(), "3221225472 bytes (3.0 GiB)");
    }
}
