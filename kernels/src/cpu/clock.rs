//! The core clock, measured: a chain of dependent integer adds retires one add per cycle on
//! every x86-64 and aarch64 core, so adds per second is cycles per second. /proc/cpuinfo's MHz
//! is often the nominal or the host's clock on virtual machines and ignores turbo.

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
            "add {x}, 1",
            ".endr",
            "dec {n}",
            "jnz 2b",
            x = inout(reg) x,
            n = inout(reg) n => _,
            options(nostack, nomem),
        );
    }
    x
}

/// aarch64: `add` of an immediate has one cycle of latency on every Neoverse and Cortex-A core.
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
            "add {x}, {x}, #1",
            ".endr",
            "subs {n}, {n}, #1",
            "b.ne 2b",
            x = inout(reg) x,
            n = inout(reg) n => _,
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
}
