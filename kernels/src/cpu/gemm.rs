//! Dense matrix products through the `gemm` crate (AVX-512 kernels with its `x86-v4` feature):
//! `C = A·B`, row-major, f64 / f32 / f16 (f16 is computed in f32 and rounded on x86 cores
//! without native f16 arithmetic).
//!
//! Leading dimensions are padded by 64 bytes when a row is a multiple of 4 KiB, as BLAS users do:
//! power-of-two strides map every row to the same cache sets (at n = 4096 the unpadded product
//! runs ~8% slower here).
//!
//! Check: 16 entries of C, spread over the matrix, against an f64 dot product of the stored
//! inputs; the error is relative to Σ|a·b| (the scale of the rounding error of any summation
//! order), within a bound per precision.

use super::isa::Isa;
use crate::buffer::{Buffer, Zeroable};
use crate::driver::{CheckError, Kernel};
use crate::ProbeError;
use gemm::Parallelism;

/// An element type the probe multiplies.
pub trait Elem: Zeroable {
    const NAME: &'static str;
    /// Bound on |c − reference| / Σ|a·b| for a correct product.
    const TOLERANCE: f64;
    /// Whether partial sums over blocks of k may be stored in the destination type (not for
    /// f16: each store would round the partial sum to 11 bits).
    const SPLIT_K: bool = true;
    fn from_f64(x: f64) -> Self;
    fn to_f64(self) -> f64;
}

impl Elem for f64 {
    const NAME: &'static str = "f64";
    const TOLERANCE: f64 = 1e-12;
    fn from_f64(x: f64) -> Self {
        x
    }
    fn to_f64(self) -> f64 {
        self
    }
}
impl Elem for f32 {
    const NAME: &'static str = "f32";
    const TOLERANCE: f64 = 2e-5;
    fn from_f64(x: f64) -> Self {
        x as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}
impl Elem for half::f16 {
    const NAME: &'static str = "f16";
    const SPLIT_K: bool = false;
    const TOLERANCE: f64 = 4e-3;
    fn from_f64(x: f64) -> Self {
        half::f16::from_f64(x)
    }
    fn to_f64(self) -> f64 {
        half::f16::to_f64(self)
    }
}

/// `m × k` times `k × n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Shape {
    pub m: usize,
    pub n: usize,
    pub k: usize,
}

impl Shape {
    pub fn flops(&self) -> f64 {
        2.0 * self.m as f64 * self.n as f64 * self.k as f64
    }
    pub fn describe(&self) -> String {
        format!("m={} n={} k={}", self.m, self.n, self.k)
    }
}

/// The padded leading dimension for rows of `cols` elements of `size` bytes.
pub fn leading_dim(cols: usize, size: usize) -> usize {
    let per_line = (64 / size).max(1);
    let ld = cols.div_ceil(per_line) * per_line;
    if (ld * size).is_multiple_of(4096) {
        ld + per_line
    } else {
        ld
    }
}

/// A deterministic pseudo-random value in [−1, 1) (never all zeros, no structure).
pub fn noise(seed: u64, i: usize) -> f64 {
    let mut z = seed.wrapping_add((i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    (z >> 11) as f64 / (1u64 << 52) as f64 - 1.0
}

/// Products larger than this in any dimension are computed block by block: the `gemm` crate's
/// own cache blocking loses 3-5% at n = 4096 on a 1 MiB-L2 core against 1024-blocks (measured
/// here, interleaved: 241 against 253 GFLOP/s), so the outer blocking is ours.
pub const OUTER_BLOCK: usize = 1024;

/// `dst[m×n] = lhs[m×k] · rhs[k×n]` for row-major matrices with leading dimensions.
///
/// # Safety
/// The pointers must cover the matrices their dimensions and leading dimensions describe, and
/// `dst` must not overlap the inputs.
#[allow(clippy::too_many_arguments)]
pub unsafe fn matmul<T: Elem>(
    shape: Shape,
    dst: *mut T,
    ldd: usize,
    lhs: *const T,
    lda: usize,
    rhs: *const T,
    ldb: usize,
    par: Parallelism,
) {
    // SAFETY: blocked asks what matmul's caller guarantees.
    blocked(OUTER_BLOCK, shape, dst, ldd, lhs, lda, rhs, ldb, par)
}

/// [`matmul`] in outer blocks of `b` in each dimension ([`OUTER_BLOCK`], but in the tests,
/// which cross small blocks: the same code at under a thousandth of the work, which counts
/// under the Arm build's emulation).
///
/// # Safety
/// As [`matmul`]'s.
#[allow(clippy::too_many_arguments)]
unsafe fn blocked<T: Elem>(
    b: usize,
    shape: Shape,
    dst: *mut T,
    ldd: usize,
    lhs: *const T,
    lda: usize,
    rhs: *const T,
    ldb: usize,
    par: Parallelism,
) {
    let one = T::from_f64(1.0);
    let kb = if T::SPLIT_K { b } else { shape.k.max(1) };
    for i0 in (0..shape.m).step_by(b) {
        let mm = b.min(shape.m - i0);
        for j0 in (0..shape.n).step_by(b) {
            let nn = b.min(shape.n - j0);
            for p0 in (0..shape.k).step_by(kb) {
                let kk = kb.min(shape.k - p0);
                // dst = 1·dst + 1·lhs·rhs, except for the first block of k, which overwrites.
                gemm::gemm(
                    mm,
                    nn,
                    kk,
                    dst.add(i0 * ldd + j0),
                    1,
                    ldd as isize,
                    p0 > 0,
                    lhs.add(i0 * lda + p0),
                    1,
                    lda as isize,
                    rhs.add(p0 * ldb + j0),
                    1,
                    ldb as isize,
                    one,
                    one,
                    false,
                    false,
                    false,
                    par,
                );
            }
        }
    }
}

/// A GEMM probe kernel over its own matrices.
pub struct GemmKernel<T: Elem> {
    shape: Shape,
    lda: usize,
    ldb: usize,
    ldc: usize,
    a: Buffer<T>,
    b: Buffer<T>,
    c: Buffer<T>,
    threads: usize,
    /// The outer blocks' size ([`OUTER_BLOCK`]; smaller in the tests).
    block: usize,
}

impl<T: Elem> GemmKernel<T> {
    /// `threads` = 1 runs single-threaded; more runs on the current rayon pool.
    pub fn new(shape: Shape, threads: usize) -> Result<GemmKernel<T>, ProbeError> {
        let size = std::mem::size_of::<T>();
        let (lda, ldb, ldc) = (
            leading_dim(shape.k, size),
            leading_dim(shape.n, size),
            leading_dim(shape.n, size),
        );
        let alloc = |len: usize, seed: u64| {
            Buffer::from_fn(len, |i| T::from_f64(noise(seed, i)))
                .ok_or(ProbeError::Alloc(len * size))
        };
        Ok(GemmKernel {
            shape,
            lda,
            ldb,
            ldc,
            a: alloc(shape.m * lda, 1)?,
            b: alloc(shape.k * ldb, 2)?,
            c: Buffer::zeroed(shape.m * ldc).ok_or(ProbeError::Alloc(shape.m * ldc * size))?,
            threads,
            block: OUTER_BLOCK,
        })
    }

    fn par(&self) -> Parallelism {
        if self.threads > 1 {
            Parallelism::Rayon(self.threads)
        } else {
            Parallelism::None
        }
    }
}

/// The instruction set the gemm crate dispatches to on this CPU (it detects its own, and
/// `ROOFLINE_ISA` does not cap it): x86-64-v4 (AVX-512 F/BW/CD/DQ/VL) or v3 (AVX2, FMA).
pub fn gemm_isa() -> Isa {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f")
            && has!("avx512bw")
            && has!("avx512cd")
            && has!("avx512dq")
            && has!("avx512vl")
        {
            return Isa::Avx512;
        }
        if has!("avx2") && has!("fma") {
            return Isa::Avx2;
        }
    }
    Isa::Scalar
}

/// Checks 16 entries of `c` against f64 references; returns the largest normwise error.
#[allow(clippy::too_many_arguments)]
pub fn check_product<T: Elem>(
    shape: Shape,
    a: &[T],
    lda: usize,
    b: &[T],
    ldb: usize,
    c: &[T],
    ldc: usize,
) -> Result<f64, CheckError> {
    let mut worst = 0.0f64;
    for s in 0..16usize {
        let i = (s * 7919 + 3) % shape.m;
        let j = (s * 104_729 + 5) % shape.n;
        let (mut want, mut scale) = (0.0f64, 0.0f64);
        for p in 0..shape.k {
            let t = a[i * lda + p].to_f64() * b[p * ldb + j].to_f64();
            want += t;
            scale += t.abs();
        }
        let got = c[i * ldc + j].to_f64();
        let err = (got - want).abs() / scale.max(f64::MIN_POSITIVE);
        if !got.is_finite() || err > T::TOLERANCE {
            return Err(CheckError::Bound {
                what: format!("{} GEMM {}: C[{i},{j}]", T::NAME, shape.describe()),
                got,
                want,
                err,
                scale: "Σ|a·b|",
                bound: T::TOLERANCE,
            });
        }
        worst = worst.max(err);
    }
    Ok(worst)
}

impl<T: Elem> Kernel for GemmKernel<T> {
    fn ops_per_iter(&self) -> f64 {
        self.shape.flops()
    }
    fn bytes_per_iter(&self) -> f64 {
        let s = self.shape;
        ((s.m * s.k + s.k * s.n + s.m * s.n) * std::mem::size_of::<T>()) as f64
    }
    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            // SAFETY: buffers sized m×lda, k×ldb, m×ldc in `new`; c does not alias a or b.
            unsafe {
                blocked(
                    self.block,
                    self.shape,
                    self.c.as_mut_ptr(),
                    self.ldc,
                    self.a.as_ptr(),
                    self.lda,
                    self.b.as_ptr(),
                    self.ldb,
                    self.par(),
                );
            }
        }
    }
    fn check(&mut self) -> Result<f64, CheckError> {
        check_product(
            self.shape, &self.a, self.lda, &self.b, self.ldb, &self.c, self.ldc,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Outer blocks of 64 for the last shape, which crosses them in every dimension (k twice,
    /// where partial sums are stored: f64 and f32). Crossing `OUTER_BLOCK` itself (1027 × 1094
    /// × 2053) took 109 s of the Arm build's 117 s of kernel tests under qemu, and no entry the
    /// check samples fell in its last block of rows; here two do, and every block of columns
    /// holds one (a product that skips a last block, or overwrites a block of k's partial
    /// sums, fails).
    const SMALL_BLOCK: usize = 64;

    fn product_checks<T: Elem>() {
        let b = SMALL_BLOCK;
        for (shape, block) in [
            (Shape { m: 1, n: 1, k: 1 }, OUTER_BLOCK),
            (
                Shape {
                    m: 37,
                    n: 50,
                    k: 129,
                },
                OUTER_BLOCK,
            ),
            (
                Shape {
                    m: 256,
                    n: 64,
                    k: 576,
                },
                OUTER_BLOCK,
            ),
            (
                Shape {
                    m: b + 3,
                    n: b + 70,
                    k: 2 * b + 5,
                },
                b,
            ),
        ] {
            let mut k = GemmKernel::<T>::new(shape, 1).unwrap();
            k.block = block;
            assert!(
                k.check().is_err() || shape.m == 1,
                "an unrun product must fail its check"
            );
            k.run(1);
            let err = k.check().unwrap();
            assert!(err <= T::TOLERANCE);
            // A wrong entry is caught (entry 0 of the sample is row 3 % m, column 5 % n).
            let (i, j) = (3 % shape.m, 5 % shape.n);
            let v = k.c[i * k.ldc + j].to_f64();
            k.c[i * k.ldc + j] = T::from_f64(v + 100.0);
            assert!(k.check().is_err(), "{} {:?}", T::NAME, shape);
        }
    }

    #[test]
    fn f64_f32_f16_products_are_right() {
        product_checks::<f64>();
        product_checks::<f32>();
        product_checks::<half::f16>();
    }

    #[test]
    fn parallel_product_in_a_pool_is_right() {
        let pool = crate::affinity::pinned_pool(&crate::affinity::allowed_cpus()).unwrap();
        let mut k = GemmKernel::<f32>::new(
            Shape {
                m: 300,
                n: 200,
                k: 100,
            },
            2,
        )
        .unwrap();
        pool.install(|| k.run(2));
        assert!(k.check().is_ok());
    }

    #[test]
    fn padding_avoids_4k_strides() {
        assert_eq!(leading_dim(4096, 4), 4112);
        assert_eq!(leading_dim(1000, 4), 1008);
        assert_eq!(leading_dim(3, 8), 8);
        assert_eq!(leading_dim(512, 8), 520);
    }
}
