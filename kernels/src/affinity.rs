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

/// Parses a CPU list such as `0-3,8,10-11` (sysfs `online`, cgroup `cpuset.cpus`).
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    v.extend(a..=b);
                }
            }
            None => v.extend(part.trim().parse::<usize>().ok()),
        }
    }
    v
}

/// Widens this process's CPU affinity to every CPU it may use on the node (the cgroup's
/// cpuset, else every online CPU): an MPI launcher binds each rank to one core, and the rank
/// that probes its node needs them all. Returns (before, after) CPU counts; unchanged when the
/// OS refuses.
pub fn widen_to_node() -> (usize, usize) {
    let before = allowed_cpus().len();
    #[cfg(target_os = "linux")]
    {
        let list = [
            "/sys/fs/cgroup/cpuset.cpus.effective",
            "/sys/devices/system/cpu/online",
        ]
        .iter()
        .find_map(|p| {
            std::fs::read_to_string(p)
                .ok()
                .filter(|s| !s.trim().is_empty())
        })
        .unwrap_or_default();
        let cpus: Vec<usize> = parse_cpu_list(&list)
            .into_iter()
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
    fn cpu_lists() {
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), [0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("5"), [5]);
        assert!(parse_cpu_list("").is_empty());
    }

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
