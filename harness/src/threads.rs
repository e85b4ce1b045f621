//! relattn's threads: rayon's global pool, started by `main` before a command runs. A machine
//! that cannot give relattn its threads (a limit on address space or on threads) then ends the
//! command with one message and exit 2, where rayon would panic at its first parallel loop.

use crate::exit;

/// The global pool's size for one of `processes` runs on this machine: rayon's default (None:
/// `RAYON_NUM_THREADS`, else every core) for one, else its share of the cores, rounded up (a
/// run spends part of its time waiting on the GPU, so the shares together may exceed the cores
/// by less than one each), unless `RAYON_NUM_THREADS` sets the count.
pub fn share(processes: usize) -> Option<usize> {
    if processes <= 1 || std::env::var_os("RAYON_NUM_THREADS").is_some() {
        return None;
    }
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    Some(cores.div_ceil(processes))
}

/// Start the global pool with `threads` (None: rayon's default), before anything uses it.
pub fn start(threads: Option<usize>) -> anyhow::Result<()> {
    let mut builder = rayon::ThreadPoolBuilder::new();
    if let Some(n) = threads {
        builder = builder.num_threads(n);
    }
    builder.build_global().map_err(|e| {
        let count = threads
            .or_else(|| std::env::var("RAYON_NUM_THREADS").ok()?.parse().ok())
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
        exit::usage(format!(
            "relattn could not start its {count} threads ({e}): a limit on address space \
             (ulimit -v) or on threads is too low for them; raise it, or set RAYON_NUM_THREADS \
             to fewer"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_run_among_several_takes_its_share_of_the_cores() {
        if std::env::var_os("RAYON_NUM_THREADS").is_some() {
            assert_eq!(share(4), None);
            return;
        }
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        assert_eq!(share(0), None);
        assert_eq!(share(1), None);
        assert_eq!(share(2), Some(cores.div_ceil(2)));
        assert_eq!(share(cores * 3), Some(1));
    }
}
