//! Counting retired instructions and core cycles with the Linux perf interface
//! (`perf_event_open`), to confirm that a kernel executes the instructions it claims and that
//! the clock measurement counts cycles. Unavailable (→ `None`) where the kernel, the hypervisor
//! or `perf_event_paranoid` does not allow user-space counting.

/// A hardware event of the calling thread, in user space.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// Core cycles (PERF_COUNT_HW_CPU_CYCLES).
    Cycles,
    /// Instructions retired (PERF_COUNT_HW_INSTRUCTIONS).
    Instructions,
}

/// Instructions retired in user space by the calling thread while `f` runs, or `None` when the
/// counter cannot be opened or read.
pub fn count_instructions<R>(f: impl FnOnce() -> R) -> (R, Option<u64>) {
    count(Event::Instructions, f)
}

/// `event` counted on the calling thread in user space while `f` runs, or `None` when the
/// counter cannot be opened or read.
pub fn count<R>(event: Event, f: impl FnOnce() -> R) -> (R, Option<u64>) {
    #[cfg(target_os = "linux")]
    {
        linux::count(event, f)
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = event;
        (f(), None)
    }
}

#[cfg(target_os = "linux")]
mod linux {
    /// `struct perf_event_attr` up to `config1` (PERF_ATTR_SIZE_VER0, 64 bytes).
    #[repr(C)]
    #[derive(Default)]
    struct Attr {
        type_: u32,
        size: u32,
        config: u64,
        sample_period: u64,
        sample_type: u64,
        read_format: u64,
        flags: u64,
        wakeup_events: u32,
        bp_type: u32,
        config1: u64,
    }

    const PERF_TYPE_HARDWARE: u32 = 0;
    const PERF_COUNT_HW_CPU_CYCLES: u64 = 0;
    const PERF_COUNT_HW_INSTRUCTIONS: u64 = 1;
    const FLAG_DISABLED: u64 = 1 << 0;
    const FLAG_EXCLUDE_KERNEL: u64 = 1 << 5;
    const FLAG_EXCLUDE_HV: u64 = 1 << 6;
    const IOC_ENABLE: libc::c_ulong = 0x2400;
    const IOC_DISABLE: libc::c_ulong = 0x2401;
    const IOC_RESET: libc::c_ulong = 0x2403;

    pub fn count<R>(event: super::Event, f: impl FnOnce() -> R) -> (R, Option<u64>) {
        let attr = Attr {
            type_: PERF_TYPE_HARDWARE,
            size: std::mem::size_of::<Attr>() as u32,
            config: match event {
                super::Event::Cycles => PERF_COUNT_HW_CPU_CYCLES,
                super::Event::Instructions => PERF_COUNT_HW_INSTRUCTIONS,
            },
            flags: FLAG_DISABLED | FLAG_EXCLUDE_KERNEL | FLAG_EXCLUDE_HV,
            ..Default::default()
        };
        // SAFETY: perf_event_open reads `size` bytes of a valid attr; pid 0 = this thread,
        // cpu −1 = any, no group, no flags. The returned fd is closed below.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_perf_event_open,
                &attr as *const Attr,
                0,
                -1,
                -1,
                0,
            ) as libc::c_int
        };
        if fd < 0 {
            return (f(), None);
        }
        // SAFETY: ioctls on the perf fd we own; read of 8 bytes into a u64.
        unsafe {
            let ok = libc::ioctl(fd, IOC_RESET, 0) == 0 && libc::ioctl(fd, IOC_ENABLE, 0) == 0;
            let r = f();
            let off = libc::ioctl(fd, IOC_DISABLE, 0) == 0;
            let mut value: u64 = 0;
            let n = libc::read(fd, &mut value as *mut u64 as *mut libc::c_void, 8);
            libc::close(fd);
            let counted = (ok && off && n == 8 && value > 0).then_some(value);
            (r, counted)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_a_loop_when_the_counter_is_available() {
        let n = 1_000_000u64;
        let (sum, count) = count_instructions(|| {
            let mut s = 0u64;
            for i in 0..n {
                s = std::hint::black_box(s + i);
            }
            s
        });
        assert_eq!(sum, n * (n - 1) / 2);
        match count {
            // At least one instruction per iteration; not wildly more.
            Some(c) => assert!(c >= n && c < 50 * n, "{c} instructions for {n} iterations"),
            None => eprintln!("perf counters unavailable here: instruction counts not confirmed"),
        }
    }
}
