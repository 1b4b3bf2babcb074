//! The core clock, measured: a chain of dependent integer adds retires one add per cycle on
//! every x86-64 and aarch64 core, so adds per second is cycles per second. /proc/cpuinfo's MHz
//! is often the nominal or the host's clock on virtual machines and ignores turbo.
//!
//! The adds are register to register (`add x, one`): Intel's cores since Golden Cove (Alder
//! Lake, Sapphire Rapids) fold a chain of immediate adds (`add x, 1`) in the renamer and retire
//! several a cycle — a 2.6 GHz Sapphire Rapids VM read 24 GHz, an H100 host 11 GHz, and the
//! idle-versus-after comparison then called an idle machine busy.

use crate::driver::{CheckError, Kernel};

/// Dependent adds per loop iteration (long, so that the loop branch costs < 0.05%).
pub const ADDS_PER_ITER: u64 = 1000;

/// A kernel whose "operations" are clock cycles.
pub struct ClockKernel {
    value: u64,
    total_iters: u64,
}

impl ClockKernel {
    pub fn new() -> ClockKernel {
        ClockKernel {
            value: 0,
            total_iters: 0,
        }
    }
}

impl Default for ClockKernel {
    fn default() -> Self {
        Self::new()
    }
}

/// x86-64: `add` of a register (holding 1) to the chain: one cycle of latency, not foldable.
#[cfg(target_arch = "x86_64")]
fn chain(mut x: u64, n: u64) -> u64 {
    if n == 0 {
        return x;
    }
    // SAFETY: plain integer arithmetic on registers; n ≥ 1.
    unsafe {
        std::arch::asm!(
            "2:",
            ".rept 1000",
            "add {x}, {one}",
            ".endr",
            "dec {n}",
            "jnz 2b",
            x = inout(reg) x,
            n = inout(reg) n => _,
            one = in(reg) std::hint::black_box(1u64),
            options(nostack, nomem),
        );
    }
    x
}

/// aarch64: `add` of a register has one cycle of latency on every Neoverse and Cortex-A core.
#[cfg(target_arch = "aarch64")]
fn chain(mut x: u64, n: u64) -> u64 {
    if n == 0 {
        return x;
    }
    // SAFETY: plain integer arithmetic on registers; n ≥ 1.
    unsafe {
        std::arch::asm!(
            "2:",
            ".rept 1000",
            "add {x}, {x}, {one}",
            ".endr",
            "subs {n}, {n}, #1",
            "b.ne 2b",
            x = inout(reg) x,
            n = inout(reg) n => _,
            one = in(reg) std::hint::black_box(1u64),
            options(nostack, nomem),
        );
    }
    x
}

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
fn chain(mut x: u64, n: u64) -> u64 {
    for _ in 0..n * ADDS_PER_ITER {
        x = std::hint::black_box(x) + 1;
    }
    x
}

/// The calling thread's core clock, Hz, from the add chain alone (not the counter's factor):
/// the best of `repeats` runs of about 10 ms each. For a quick reference, not a ceiling.
pub fn quick_hz(repeats: usize) -> f64 {
    let iters = 30_000u64;
    let mut best = 0.0f64;
    let mut x = 0;
    for _ in 0..repeats.max(1) {
        let t = std::time::Instant::now();
        x = chain(x, iters);
        let s = t.elapsed().as_secs_f64();
        if s > 0.0 {
            best = best.max((iters * ADDS_PER_ITER) as f64 / s);
        }
    }
    std::hint::black_box(x);
    best
}

/// The calling thread's core clock around one sample, adds per second of the chain alone (the
/// probe applies the counter's factor): the best of three runs of 40,000 adds (about 12 µs
/// each at 3.5 GHz), so that one interrupt does not read as a low clock, and the reading costs
/// under 50 µs.
pub fn sample_hz() -> f64 {
    let iters = 40u64;
    let mut best = 0.0f64;
    let mut x = 0;
    for _ in 0..3 {
        let t = std::time::Instant::now();
        x = chain(x, iters);
        let s = t.elapsed().as_secs_f64();
        if s > 0.0 {
            best = best.max((iters * ADDS_PER_ITER) as f64 / s);
        }
    }
    std::hint::black_box(x);
    best
}

/// Core cycles per add of the chain, by the CPU's cycle counter (`perf_event_open`) on the
/// calling thread: two runs of different lengths, their difference (start-up cancels). 1.00
/// confirms that adds per second is the clock; `None` where the counter cannot be read.
pub fn cycles_per_add() -> Option<f64> {
    let (short, long) = (20_000u64, 60_000u64);
    let (_, a) = crate::perf::count(crate::perf::Event::Cycles, || chain(0, short));
    let (_, b) = crate::perf::count(crate::perf::Event::Cycles, || chain(0, long));
    let (a, b) = (a?, b?);
    let adds = ((long - short) * ADDS_PER_ITER) as f64;
    let per_add = (b as f64 - a as f64) / adds;
    (per_add.is_finite() && per_add > 0.0).then_some(per_add)
}

/// What the cycle counter says of the add-chain clock: `(factor, note)`, where `factor`
/// multiplies the adds-per-second clock to give the cycles-per-second one. Within 3% of one
/// cycle per add, the chain is confirmed and the factor is 1; further off, the counter is
/// believed (a core that fuses or eliminates the adds, or a slow one).
pub fn counter_verdict(per_add: Option<f64>) -> (f64, String) {
    match per_add {
        Some(c) if (c - 1.0).abs() <= 0.03 => (
            1.0,
            format!("clock confirmed by the CPU's cycle counter: {c:.3} cycles per add of the chain"),
        ),
        Some(c) => (
            c,
            format!(
                "the CPU's cycle counter reads {c:.3} cycles per add of the chain, not 1: the clock is the chain's rate × {c:.3}"
            ),
        ),
        None => (
            1.0,
            "clock not confirmed by a cycle counter (perf_event_open unavailable here); a chain of dependent adds runs at one per cycle on every x86-64 and aarch64 core".into(),
        ),
    }
}

impl Kernel for ClockKernel {
    fn ops_per_iter(&self) -> f64 {
        ADDS_PER_ITER as f64
    }
    fn bytes_per_iter(&self) -> f64 {
        0.0
    }
    fn run(&mut self, iters: u64) {
        self.value = chain(self.value, iters);
        self.total_iters += iters;
    }
    fn is_reference(&self) -> bool {
        true
    }
    fn check(&mut self) -> Result<f64, CheckError> {
        let want = self.total_iters.wrapping_mul(ADDS_PER_ITER);
        if self.value == want {
            Ok(0.0)
        } else {
            Err(CheckError::exact(
                format!("add chain after {} iterations", self.total_iters),
                self.value,
                want,
            ))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chain_counts_exactly() {
        let mut k = ClockKernel::new();
        k.run(3);
        k.run(1000);
        assert_eq!(k.check(), Ok(0.0));
        k.value += 1;
        assert!(k.check().is_err());
    }

    /// No core runs at 7 GHz: a chain that the CPU folds (immediate adds on Intel's cores since
    /// Golden Cove read 24 GHz on a 2.6 GHz Sapphire Rapids) would read above it. A loaded
    /// host reads lower, never higher, so the bound holds on a busy machine.
    #[test]
    fn the_chain_is_not_folded() {
        let hz = quick_hz(5);
        assert!(hz > 0.0 && hz < 7e9, "{:.2} GHz", hz / 1e9);
    }

    /// Where the counter is readable the chain runs at one add per cycle; the verdict keeps
    /// the clock within 3% of that and scales it by the counter beyond.
    #[test]
    fn the_cycle_counter_confirms_one_add_per_cycle() {
        match cycles_per_add() {
            Some(c) => assert!((c - 1.0).abs() < 0.1, "{c} cycles per add"),
            None => eprintln!("no cycle counter here: the clock is not confirmed"),
        }
        assert_eq!(counter_verdict(Some(1.01)).0, 1.0);
        assert_eq!(counter_verdict(Some(0.5)).0, 0.5);
        assert!(counter_verdict(Some(0.5)).1.contains("not 1"));
        assert_eq!(counter_verdict(None).0, 1.0);
    }
}
