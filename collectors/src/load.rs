//! How busy the machine is apart from us: the CPU time every process and the hypervisor took
//! (`/proc/stat`: busy = all but idle and iowait, steal included) less the time this process
//! took (`/proc/self/stat`, every thread), as a share of all the CPUs' time over a window.

use std::time::{Duration, Instant};

/// CPU time counters at one moment, in clock ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CpuTimes {
    /// Every CPU's time, all states.
    pub total: u64,
    /// Every CPU's busy time (user, nice, system, irq, softirq, steal), every process's.
    pub busy: u64,
    /// This process's user + system time, all its threads.
    pub ours: u64,
}

/// `/proc/stat`'s first line (`cpu  user nice system idle iowait irq softirq steal …`) as
/// (total, busy); None when it is not that line.
pub fn parse_stat(text: &str) -> Option<(u64, u64)> {
    let line = text.lines().next()?;
    let mut f = line.split_whitespace();
    if f.next()? != "cpu" {
        return None;
    }
    let v: Vec<u64> = f.take(8).map(|x| x.parse().ok()).collect::<Option<_>>()?;
    if v.len() < 4 {
        return None;
    }
    let total: u64 = v.iter().sum();
    let idle = v[3] + v.get(4).copied().unwrap_or(0);
    Some((total, total - idle))
}

/// `/proc/<pid>/stat`'s utime + stime (fields 14 and 15, after the command in parentheses).
pub fn parse_self_stat(text: &str) -> Option<u64> {
    let after = &text[text.rfind(')')? + 1..];
    let f: Vec<&str> = after.split_whitespace().collect();
    // `after` starts at field 3 (state): utime is field 14, stime 15.
    let ut: u64 = f.get(11)?.parse().ok()?;
    let st: u64 = f.get(12)?.parse().ok()?;
    Some(ut + st)
}

/// The counters now; None where /proc is not readable (not Linux).
pub fn cpu_times() -> Option<CpuTimes> {
    let (total, busy) = parse_stat(&std::fs::read_to_string("/proc/stat").ok()?)?;
    let ours = parse_self_stat(&std::fs::read_to_string("/proc/self/stat").ok()?)?;
    Some(CpuTimes { total, busy, ours })
}

/// The share (0 to 1) of all CPUs' time that others took between `a` and `b`; None when no
/// tick passed.
pub fn others_share(a: &CpuTimes, b: &CpuTimes) -> Option<f64> {
    let total = b.total.checked_sub(a.total)?;
    if total == 0 {
        return None;
    }
    let busy = b.busy.saturating_sub(a.busy) as f64;
    let ours = b.ours.saturating_sub(a.ours) as f64;
    Some(((busy - ours).max(0.0) / total as f64).min(1.0))
}

/// The share others took over the next `window` while this thread sleeps through it.
pub fn others_over(window: Duration) -> Option<f64> {
    let a = cpu_times()?;
    let t = Instant::now();
    std::thread::sleep(window);
    // At least a few ticks (10 ms each at the usual 100 Hz) on every CPU.
    while t.elapsed() < window {
        std::thread::sleep(window - t.elapsed());
    }
    others_share(&a, &cpu_times()?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn proc_stat_and_self_stat_parse() {
        let s = "cpu  100 5 50 800 20 3 2 20 0 0\ncpu0 1 2 3 4\n";
        // total 1000; idle 800 + iowait 20.
        assert_eq!(parse_stat(s), Some((1000, 180)));
        assert_eq!(parse_stat("intr 1 2"), None);
        let me = "4242 (roofline (x)) R 1 4242 4242 0 -1 4194304 100 0 0 0 250 70 0 0 20 0 3 0";
        assert_eq!(parse_self_stat(me), Some(320));
        let a = CpuTimes {
            total: 0,
            busy: 0,
            ours: 0,
        };
        // 400 ticks on 2 CPUs: others took 150 - 50 = 100 of them.
        let b = CpuTimes {
            total: 400,
            busy: 150,
            ours: 50,
        };
        assert_eq!(others_share(&a, &b), Some(0.25));
        assert_eq!(others_share(&a, &a), None);
        // Here: readable, and a share in [0, 1].
        let now = cpu_times().expect("/proc is readable on Linux");
        assert!(now.total > 0 && now.busy <= now.total);
        let share = others_over(Duration::from_millis(60)).unwrap();
        assert!((0.0..=1.0).contains(&share));
    }
}
