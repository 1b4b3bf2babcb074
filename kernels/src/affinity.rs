//! Pinning threads to CPUs (Linux `sched_setaffinity`); a no-op elsewhere.

/// The CPUs this process may run on, in increasing order.
pub fn allowed_cpus() -> Vec<usize> {
    #[cfg(target_os = "linux")]
    {
        // SAFETY: cpu_set_t is plain data; sched_getaffinity writes at most its size.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) == 0 {
                let v: Vec<usize> = (0..libc::CPU_SETSIZE as usize)
                    .filter(|&c| libc::CPU_ISSET(c, &set))
                    .collect();
                if !v.is_empty() {
                    return v;
                }
            }
        }
    }
    (0..std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1))
        .collect()
}

/// The cores a run uses, chosen by the one rule every verb follows (`probe`, `train`, `place`,
/// `score`, `sweep`): one pinned thread per physical core this process may run on (the first
/// hardware thread of each), the first `threads` of them, all of them by default.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Cores {
    /// The CPUs the run's threads are pinned to, one each.
    pub chosen: Vec<usize>,
    /// One CPU of every physical core this process may use.
    pub all: Vec<usize>,
}

/// `--threads` outside 1 to the cores this process may use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--threads {asked}: this machine lets roofline use {cores} cores (one thread per physical core); give 1 to {cores}")]
pub struct TooManyThreads {
    pub asked: usize,
    pub cores: usize,
}

/// The rule: see [`Cores`].
pub fn cores(threads: Option<usize>) -> Result<Cores, TooManyThreads> {
    let allowed = allowed_cpus();
    let all = roofline_collectors::one_cpu_per_core(
        std::path::Path::new(roofline_collectors::SYSFS_CPU),
        &allowed,
    );
    let mut chosen = all.clone();
    if let Some(n) = threads {
        if n == 0 || n > all.len() {
            return Err(TooManyThreads {
                asked: n,
                cores: all.len(),
            });
        }
        chosen.truncate(n);
    }
    Ok(Cores { chosen, all })
}

/// Sets this process's CPU affinity to `cpus` (an MPI launcher binds each rank to one core;
/// the rank that probes its node needs them all). Returns (before, after) CPU counts; unchanged
/// when the OS refuses or `cpus` is empty.
pub fn widen_to(cpus: &[usize]) -> (usize, usize) {
    let before = allowed_cpus().len();
    #[cfg(target_os = "linux")]
    {
        let cpus: Vec<usize> = cpus
            .iter()
            .copied()
            .filter(|c| *c < libc::CPU_SETSIZE as usize)
            .collect();
        if !cpus.is_empty() {
            // SAFETY: cpu_set_t is plain data; every index is below CPU_SETSIZE.
            unsafe {
                let mut set: libc::cpu_set_t = std::mem::zeroed();
                for c in &cpus {
                    libc::CPU_SET(*c, &mut set);
                }
                libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
            }
        }
    }
    #[cfg(not(target_os = "linux"))]
    let _ = cpus;
    (before, allowed_cpus().len())
}

/// Pins the calling thread to `cpu`. Returns false when the OS refused.
pub fn pin_current_thread(cpu: usize) -> bool {
    #[cfg(target_os = "linux")]
    {
        if cpu >= libc::CPU_SETSIZE as usize {
            return false;
        }
        // SAFETY: as above; the set holds one valid CPU index.
        unsafe {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = cpu;
        false
    }
}

/// A rayon pool with one thread per CPU in `cpus`, each pinned to its CPU.
pub fn pinned_pool(cpus: &[usize]) -> Result<rayon::ThreadPool, rayon::ThreadPoolBuildError> {
    let cpus = cpus.to_vec();
    rayon::ThreadPoolBuilder::new()
        .num_threads(cpus.len().max(1))
        .thread_name(|i| format!("roofline-{i}"))
        .start_handler(move |i| {
            if let Some(&c) = cpus.get(i) {
                pin_current_thread(c);
            }
        })
        .build()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_to_an_allowed_cpu() {
        let cpus = allowed_cpus();
        assert!(!cpus.is_empty());
        let last = *cpus.last().unwrap();
        std::thread::spawn(move || {
            assert!(pin_current_thread(last));
            #[cfg(target_os = "linux")]
            // SAFETY: sched_getcpu has no preconditions.
            assert_eq!(unsafe { libc::sched_getcpu() } as usize, last);
        })
        .join()
        .unwrap();
    }
}
