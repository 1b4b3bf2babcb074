//! The probe's bf16 GEMM: A and B stored in bf16, C in f32 (the product a bf16 training step
//! runs), checked as the other GEMMs: 16 entries of C against an f64 dot product of the stored
//! inputs, relative to Σ|a·b|.

use super::{Bf16Gemm, Operand};
use crate::buffer::Buffer;
use crate::cpu::gemm::{leading_dim, noise, Shape};
use crate::driver::{CheckError, Kernel};
use crate::ProbeError;
use half::bf16;

/// Bound on |c − reference| / Σ|a·b|: the inputs are exact, only f32 sums round.
pub const TOLERANCE: f64 = 2e-5;

pub struct Bf16GemmKernel {
    gemm: Bf16Gemm,
    shape: Shape,
    lda: usize,
    ldb: usize,
    ldc: usize,
    a: Buffer<bf16>,
    b: Buffer<bf16>,
    c: Buffer<f32>,
    threads: usize,
}

impl Bf16GemmKernel {
    /// `threads` = 1 runs single-threaded; more runs on the current rayon pool.
    pub fn new(gemm: Bf16Gemm, shape: Shape, threads: usize) -> Result<Bf16GemmKernel, ProbeError> {
        let (lda, ldb, ldc) = (
            leading_dim(shape.k, 2),
            leading_dim(shape.n, 2),
            leading_dim(shape.n, 4),
        );
        let alloc = |len: usize, seed: u64| {
            Buffer::from_fn(len, |i| bf16::from_f64(noise(seed, i)))
                .ok_or(ProbeError::Alloc(len * 2))
        };
        Ok(Bf16GemmKernel {
            gemm,
            shape,
            lda,
            ldb,
            ldc,
            a: alloc(shape.m * lda, 1)?,
            b: alloc(shape.k * ldb, 2)?,
            c: Buffer::zeroed(shape.m * ldc).ok_or(ProbeError::Alloc(shape.m * ldc * 4))?,
            threads,
        })
    }

    /// Entry (i, j) of C (tests).
    pub fn c_mut(&mut self, i: usize, j: usize) -> &mut f32 {
        &mut self.c[i * self.ldc + j]
    }
}

impl Kernel for Bf16GemmKernel {
    fn ops_per_iter(&self) -> f64 {
        self.shape.flops()
    }
    fn bytes_per_iter(&self) -> f64 {
        let s = self.shape;
        ((s.m * s.k + s.k * s.n) * 2 + s.m * s.n * 4) as f64
    }
    fn run(&mut self, iters: u64) {
        let s = self.shape;
        for _ in 0..iters {
            // SAFETY: buffers sized m×lda, k×ldb, m×ldc in `new`; c does not alias a or b.
            unsafe {
                self.gemm.gemm(
                    s.m,
                    s.n,
                    s.k,
                    self.c.as_mut_ptr(),
                    self.ldc,
                    false,
                    Operand::rows(self.a.as_ptr(), self.lda),
                    Operand::rows(self.b.as_ptr(), self.ldb),
                    self.threads > 1,
                )
            };
        }
    }
    fn check(&mut self) -> Result<f64, CheckError> {
        let s = self.shape;
        let mut worst = 0.0f64;
        for t in 0..16usize {
            let i = (t * 7919 + 3) % s.m;
            let j = (t * 104_729 + 5) % s.n;
            let (mut want, mut scale) = (0.0f64, 0.0f64);
            for p in 0..s.k {
                let x = self.a[i * self.lda + p].to_f64() * self.b[p * self.ldb + j].to_f64();
                want += x;
                scale += x.abs();
            }
            let got = self.c[i * self.ldc + j] as f64;
            let err = (got - want).abs() / scale.max(f64::MIN_POSITIVE);
            if !got.is_finite() || err > TOLERANCE {
                return Err(CheckError::Bound {
                    what: format!("bf16 GEMM (f32 sums) {}: C[{i},{j}]", s.describe()),
                    got,
                    want,
                    err,
                    scale: "Σ|a·b|",
                    bound: TOLERANCE,
                });
            }
            worst = worst.max(err);
        }
        Ok(worst)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_probe_kernel_checks_its_product() {
        let gemm = Bf16Gemm::detect().unwrap_or(Bf16Gemm::portable());
        for shape in [
            Shape { m: 1, n: 1, k: 1 },
            Shape {
                m: 37,
                n: 50,
                k: 1100,
            },
        ] {
            let mut k = Bf16GemmKernel::new(gemm, shape, 1).unwrap();
            assert!(k.check().is_err() || shape.m == 1, "an unrun product fails");
            k.run(1);
            assert!(k.check().unwrap() <= TOLERANCE);
            let (i, j) = (3 % shape.m, 5 % shape.n);
            *k.c_mut(i, j) += 1.0;
            assert!(k.check().is_err(), "a wrong entry is caught: {shape:?}");
        }
    }
}
