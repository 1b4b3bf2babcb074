//! Streaming memory kernels over f64 arrays, STREAM-style:
//! read (`s += b[i]`), write (`a[i] = q`), copy (`a[i] = b[i]`), triad (`a[i] = b[i] + q·c[i]`).
//!
//! Bytes are counted as STREAM counts them: what the kernel reads plus what it writes, with no
//! write-allocate traffic (read 8, write 8, copy 16, triad 24 bytes per element). Working sets
//! larger than the caches use non-temporal stores, which write without allocating, so that the
//! counted bytes are the bytes that move.
//!
//! Checks, as STREAM and BabelStream check: the result of *every* pass, not only the last.
//! The arrays hold small multiples of 1/2, so every sum and triad is exact. Read adds every
//! pass's sum into one total (checked against passes × the array's sum); write stores the
//! pass's number (the array must hold the last one); triad alternates its destination,
//! `a = b + q·c` then `b = a + q·c`, so the last destination holds `b₀ + passes·q·c` and the
//! other `b₀ + (passes − 1)·q·c`. A pass skipped or optimised away fails the check. Copy
//! moves the same values every pass (no arithmetic to count with): its whole destination is
//! checked against the source.
//!
//! The arrays start at different offsets into their first page (0, 1088 and 2176 bytes), as
//! STREAM's `OFFSET`: loads and stores to arrays at one page offset alias in the 4 KiB address
//! bits the core compares between loads and earlier stores.

use super::isa::Isa;
use crate::buffer::Buffer;
use crate::driver::{CheckError, Kernel};
use crate::ProbeError;

/// The operation: the model's memory operation (one type from the kernels to the files).
pub use roofline_model::MemOp as Op;

/// Bytes counted per element of `op` (f64 arrays: reads + writes).
pub fn bytes_per_elem(op: Op) -> usize {
    8 * op.arrays()
}

/// Elements are processed in blocks of this many (8 vectors of 8 doubles).
pub const BLOCK: usize = 64;

const Q: f64 = 3.0;

/// Page offsets of the arrays a, b, c, bytes: 17 and 34 cache lines apart.
pub const OFFSETS: [usize; 3] = [0, 17 * 64, 34 * 64];

fn b_init(i: usize) -> f64 {
    ((i % 7) + 1) as f64 * 0.5
}
fn c_init(i: usize) -> f64 {
    (i % 5) as f64
}

/// Elements per array for a working set of `bytes` (all arrays together), a multiple of
/// [`BLOCK`] and at least one block.
pub fn elems_for(op: Op, bytes: usize) -> usize {
    ((bytes / bytes_per_elem(op)) / BLOCK).max(1) * BLOCK
}

/// A streaming kernel over its own arrays.
pub struct StreamKernel {
    op: Op,
    nt: bool,
    n: usize,
    a: Buffer<f64>,
    b: Buffer<f64>,
    c: Buffer<f64>,
    sum: f64,
    /// Passes run so far (what the check counts with).
    passes: u64,
    isa: Isa,
}

impl StreamKernel {
    /// Arrays for a working set of `bytes`; `nt` selects non-temporal stores. The kernels are
    /// the widest this CPU runs under the `ROOFLINE_ISA` cap ([`Isa::current`]).
    pub fn new(op: Op, bytes: usize, nt: bool) -> Result<StreamKernel, ProbeError> {
        StreamKernel::with_isa(op, bytes, nt, Isa::current())
    }

    /// As `new`, with the kernels of `isa` (which this CPU must run).
    pub fn with_isa(op: Op, bytes: usize, nt: bool, isa: Isa) -> Result<StreamKernel, ProbeError> {
        if isa > Isa::detected() {
            return Err(ProbeError::Unsupported(format!(
                "{} memory kernels on a CPU whose widest is {}",
                isa.name(),
                Isa::detected().name()
            )));
        }
        let n = elems_for(op, bytes);
        let alloc = |len: usize, offset: usize, f: fn(usize) -> f64| {
            Buffer::from_fn_at(len, offset, f).ok_or(ProbeError::Alloc(len * 8))
        };
        let zero = |_| 0.0;
        // Only the arrays the op touches are sized; the others are empty.
        let (na, nb, nc) = match op {
            Op::Read => (0, n, 0),
            Op::Write => (n, 0, 0),
            Op::Copy => (n, n, 0),
            Op::Triad => (n, n, n),
        };
        Ok(StreamKernel {
            op,
            nt,
            n,
            a: alloc(na, OFFSETS[0], zero)?,
            b: alloc(nb, OFFSETS[1], b_init)?,
            c: alloc(nc, OFFSETS[2], c_init)?,
            sum: 0.0,
            passes: 0,
            isa,
        })
    }

    /// Working-set bytes actually used (all arrays).
    pub fn working_set(&self) -> usize {
        self.n * bytes_per_elem(self.op)
    }

    /// The instruction set of this kernel's loops.
    pub fn isa(&self) -> Isa {
        self.isa
    }

    fn pass(&mut self) {
        let n = self.n;
        self.passes += 1;
        // Write stores the pass's number; triad writes a on odd passes, b on even ones.
        let q = self.passes as f64;
        let (mut a, mut b) = (self.a.as_mut_ptr(), self.b.as_mut_ptr());
        if self.op == Op::Triad && self.passes.is_multiple_of(2) {
            std::mem::swap(&mut a, &mut b);
        }
        let a = std::hint::black_box(a);
        let b = std::hint::black_box(b as *const f64);
        let c = std::hint::black_box(self.c.as_ptr());
        if let Some(k) = Kernels::of(self.isa) {
            // SAFETY: `with_isa` refused an instruction set this CPU lacks; the arrays are
            // 64-byte aligned (a page plus `OFFSETS`) with n (a multiple of 64) elements each
            // where the op touches them.
            unsafe {
                match self.op {
                    Op::Read => self.sum += (k.read)(b, n),
                    Op::Write => (k.write)(a, n, q, self.nt),
                    Op::Copy => (k.copy)(a, b, n, self.nt),
                    Op::Triad => (k.triad)(a, b, c, n, self.nt),
                }
            }
            return;
        }
        // Portable fallback (compiler-vectorised, normal stores).
        // SAFETY: as above, the pointers cover n elements where used.
        unsafe {
            match self.op {
                Op::Read => {
                    let b = std::slice::from_raw_parts(b, n);
                    let mut acc = [0.0f64; 8];
                    for ch in b.chunks_exact(8) {
                        for j in 0..8 {
                            acc[j] += ch[j];
                        }
                    }
                    self.sum += acc.iter().sum::<f64>();
                }
                Op::Write => std::slice::from_raw_parts_mut(a, n).fill(q),
                Op::Copy => std::slice::from_raw_parts_mut(a, n)
                    .copy_from_slice(std::slice::from_raw_parts(b, n)),
                Op::Triad => {
                    let (a, b, c) = (
                        std::slice::from_raw_parts_mut(a, n),
                        std::slice::from_raw_parts(b, n),
                        std::slice::from_raw_parts(c, n),
                    );
                    for i in 0..n {
                        a[i] = b[i] + Q * c[i];
                    }
                }
            }
        }
    }
}

impl Kernel for StreamKernel {
    fn ops_per_iter(&self) -> f64 {
        match self.op {
            Op::Triad => 2.0 * self.n as f64,
            Op::Read => self.n as f64,
            _ => 0.0,
        }
    }
    fn bytes_per_iter(&self) -> f64 {
        self.working_set() as f64
    }
    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            self.pass();
        }
    }
    fn check(&mut self) -> Result<f64, CheckError> {
        let (n, p) = (self.n, self.passes);
        if p == 0 {
            return Err(CheckError::exact(
                format!("{} passes run", self.op.name()),
                0,
                "at least 1",
            ));
        }
        let bad = |i: usize, got: f64, want: f64| {
            Err(CheckError::exact(
                format!("{} element {i} of {n} after {p} passes", self.op.name()),
                got,
                want,
            ))
        };
        match self.op {
            Op::Read => {
                // Exact: every partial sum is a multiple of 1/2 far below 2^52.
                let want = p as f64 * (0..n).map(b_init).sum::<f64>();
                if self.sum != want {
                    return Err(CheckError::exact(
                        format!("read: the sum of {p} passes over {n} elements"),
                        self.sum,
                        want,
                    ));
                }
            }
            Op::Write => {
                let want = p as f64;
                if let Some(i) = self.a.iter().position(|&x| x != want) {
                    return bad(i, self.a[i], want);
                }
            }
            Op::Copy => {
                for i in 0..n {
                    if self.a[i] != b_init(i) {
                        return bad(i, self.a[i], b_init(i));
                    }
                }
            }
            Op::Triad => {
                // The last destination (a after an odd count, b after an even one) holds
                // b₀ + p·q·c, the other b₀ + (p − 1)·q·c.
                let (last, other) = if p % 2 == 1 {
                    (&self.a, &self.b)
                } else {
                    (&self.b, &self.a)
                };
                for i in 0..n {
                    let want = |k: u64| b_init(i) + k as f64 * Q * c_init(i);
                    if last[i] != want(p) {
                        return bad(i, last[i], want(p));
                    }
                    if other[i] != want(p - 1) {
                        return bad(i, other[i], want(p - 1));
                    }
                }
            }
        }
        Ok(0.0)
    }
}

/// One instruction set's kernels (the x86 modules' and NEON's), called through one dispatch.
struct Kernels {
    read: unsafe fn(*const f64, usize) -> f64,
    write: unsafe fn(*mut f64, usize, f64, bool),
    copy: unsafe fn(*mut f64, *const f64, usize, bool),
    triad: unsafe fn(*mut f64, *const f64, *const f64, usize, bool),
}

impl Kernels {
    /// The kernels of `isa` on this architecture; `None`: the portable code.
    fn of(isa: Isa) -> Option<&'static Kernels> {
        match isa {
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => Some(&x86::KERNELS),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => Some(&avx2::KERNELS),
            #[cfg(target_arch = "aarch64")]
            Isa::Neon => Some(&neon::KERNELS),
            _ => None,
        }
    }
}

/// One x86 module of kernels: eight vectors of `$w` f64 per step (AVX-512: 8, AVX2: 4), with
/// the width's intrinsics; `$reduce` sums one vector's lanes.
#[cfg(target_arch = "x86_64")]
macro_rules! x86_kernels {
    ($feat:literal, $w:literal, $zero:ident, $set1:ident, $load:ident, $store:ident,
     $stream:ident, $add:ident, $fmadd:ident, $reduce:expr) => {
        use std::arch::x86_64::*;

        pub(super) const KERNELS: super::Kernels = super::Kernels {
            read,
            write,
            copy,
            triad,
        };

        const STEP: usize = 8 * $w;

        /// `f(k)` for the first element `k` of each of the eight vectors of every step.
        #[inline(always)]
        unsafe fn steps(n: usize, mut f: impl FnMut(usize)) {
            let mut i = 0;
            while i < n {
                for j in 0..8 {
                    f(i + $w * j);
                }
                i += STEP;
            }
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn read(b: *const f64, n: usize) -> f64 {
            let mut s = [$zero(); 8];
            let mut i = 0;
            while i < n {
                for (j, acc) in s.iter_mut().enumerate() {
                    *acc = $add(*acc, $load(b.add(i + $w * j)));
                }
                i += STEP;
            }
            let t = $add(
                $add($add(s[0], s[1]), $add(s[2], s[3])),
                $add($add(s[4], s[5]), $add(s[6], s[7])),
            );
            $reduce(t)
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn write(a: *mut f64, n: usize, q: f64, nt: bool) {
            let q = $set1(q);
            // The store kind chosen outside the loops (no branch per store).
            if nt {
                steps(n, |k| $stream(a.add(k), q));
                _mm_sfence();
            } else {
                steps(n, |k| $store(a.add(k), q));
            }
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn copy(a: *mut f64, b: *const f64, n: usize, nt: bool) {
            if nt {
                steps(n, |k| $stream(a.add(k), $load(b.add(k))));
                _mm_sfence();
            } else {
                steps(n, |k| $store(a.add(k), $load(b.add(k))));
            }
        }

        #[target_feature(enable = $feat)]
        pub unsafe fn triad(a: *mut f64, b: *const f64, c: *const f64, n: usize, nt: bool) {
            let q = $set1(super::Q);
            if nt {
                steps(n, |k| {
                    $stream(a.add(k), $fmadd(q, $load(c.add(k)), $load(b.add(k))))
                });
                _mm_sfence();
            } else {
                steps(n, |k| {
                    $store(a.add(k), $fmadd(q, $load(c.add(k)), $load(b.add(k))))
                });
            }
        }
    };
}

/// The AVX-512 kernels: eight 512-bit vectors (64 elements) per step.
#[cfg(target_arch = "x86_64")]
mod x86 {
    x86_kernels!(
        "avx512f",
        8,
        _mm512_setzero_pd,
        _mm512_set1_pd,
        _mm512_load_pd,
        _mm512_store_pd,
        _mm512_stream_pd,
        _mm512_add_pd,
        _mm512_fmadd_pd,
        |t| _mm512_reduce_add_pd(t)
    );
}

/// The AVX2 kernels: eight 256-bit vectors (32 elements) per step.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    x86_kernels!(
        "avx2,fma",
        4,
        _mm256_setzero_pd,
        _mm256_set1_pd,
        _mm256_load_pd,
        _mm256_store_pd,
        _mm256_stream_pd,
        _mm256_add_pd,
        _mm256_fmadd_pd,
        |t| {
            let mut lanes = [0.0f64; 4];
            _mm256_storeu_pd(lanes.as_mut_ptr(), t);
            (lanes[0] + lanes[1]) + (lanes[2] + lanes[3])
        }
    );
}

/// The NEON kernels: eight 128-bit vectors (16 elements) per step; non-temporal stores are
/// `stnp` pairs (a hint: the core may still allocate).
#[cfg(target_arch = "aarch64")]
mod neon {
    use std::arch::aarch64::*;
    use std::arch::asm;

    pub(super) const KERNELS: super::Kernels = super::Kernels {
        read,
        write,
        copy,
        triad,
    };

    /// Stores `x`, `y` to `p` and `p + 2` with a non-temporal pair store.
    #[inline(always)]
    unsafe fn stnp(p: *mut f64, x: float64x2_t, y: float64x2_t) {
        asm!("stnp {x:q}, {y:q}, [{p}]", x = in(vreg) x, y = in(vreg) y, p = in(reg) p,
            options(nostack, preserves_flags));
    }

    pub unsafe fn read(b: *const f64, n: usize) -> f64 {
        let mut s = [vdupq_n_f64(0.0); 8];
        let mut i = 0;
        while i < n {
            for (j, acc) in s.iter_mut().enumerate() {
                *acc = vaddq_f64(*acc, vld1q_f64(b.add(i + 2 * j)));
            }
            i += 16;
        }
        let t = vaddq_f64(
            vaddq_f64(vaddq_f64(s[0], s[1]), vaddq_f64(s[2], s[3])),
            vaddq_f64(vaddq_f64(s[4], s[5]), vaddq_f64(s[6], s[7])),
        );
        vgetq_lane_f64::<0>(t) + vgetq_lane_f64::<1>(t)
    }

    pub unsafe fn write(a: *mut f64, n: usize, q: f64, nt: bool) {
        let q = vdupq_n_f64(q);
        let mut i = 0;
        while i < n {
            for j in (0..8).step_by(2) {
                let p = a.add(i + 2 * j);
                if nt {
                    stnp(p, q, q);
                } else {
                    vst1q_f64(p, q);
                    vst1q_f64(p.add(2), q);
                }
            }
            i += 16;
        }
    }

    pub unsafe fn copy(a: *mut f64, b: *const f64, n: usize, nt: bool) {
        let mut i = 0;
        while i < n {
            for j in (0..8).step_by(2) {
                let k = i + 2 * j;
                let (x, y) = (vld1q_f64(b.add(k)), vld1q_f64(b.add(k + 2)));
                if nt {
                    stnp(a.add(k), x, y);
                } else {
                    vst1q_f64(a.add(k), x);
                    vst1q_f64(a.add(k + 2), y);
                }
            }
            i += 16;
        }
    }

    pub unsafe fn triad(a: *mut f64, b: *const f64, c: *const f64, n: usize, nt: bool) {
        let q = vdupq_n_f64(super::Q);
        let mut i = 0;
        while i < n {
            for j in (0..8).step_by(2) {
                let k = i + 2 * j;
                // b + q·c, one rounding (as the x86 kernels' FMA).
                let x = vfmaq_f64(vld1q_f64(b.add(k)), q, vld1q_f64(c.add(k)));
                let y = vfmaq_f64(vld1q_f64(b.add(k + 2)), q, vld1q_f64(c.add(k + 2)));
                if nt {
                    stnp(a.add(k), x, y);
                } else {
                    vst1q_f64(a.add(k), x);
                    vst1q_f64(a.add(k + 2), y);
                }
            }
            i += 16;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every instruction set this CPU runs (AVX-512, AVX2, portable: each path, not only the
    /// widest), every op, both store kinds, sizes in L1 to past L2: each result checks out.
    #[test]
    fn every_op_checks_out_on_every_isa_with_both_store_kinds() {
        for isa in Isa::available() {
            for op in Op::ALL {
                for nt in [false, true] {
                    for bytes in [4096, 100_000, 3 << 20] {
                        let mut k = StreamKernel::with_isa(op, bytes, nt, isa).unwrap();
                        assert_eq!(k.isa(), isa);
                        assert!(k.working_set() <= bytes.max(BLOCK * bytes_per_elem(op)));
                        k.run(3);
                        k.check().unwrap_or_else(|e| {
                            panic!("{} {} nt={nt} {bytes}: {e}", isa.name(), op.name())
                        });
                    }
                }
            }
        }
        // A wider set than the CPU has is refused, not run.
        if Isa::detected() < Isa::Avx512 {
            assert!(StreamKernel::with_isa(Op::Read, 4096, false, Isa::Avx512).is_err());
        }
    }

    #[test]
    fn a_kernel_that_did_not_run_fails_its_check() {
        for op in [Op::Write, Op::Copy, Op::Triad] {
            let mut k = StreamKernel::new(op, 8192, false).unwrap();
            assert!(k.check().is_err(), "{}", op.name());
        }
        let mut k = StreamKernel::new(Op::Triad, 8192, true).unwrap();
        k.run(1);
        k.a[17] += 1.0;
        assert!(k.check().is_err());
    }

    /// Every pass counts: a pass that did not run (the count advanced, the work skipped) fails
    /// the check of read, write and triad on every instruction set; so does a triad whose
    /// destination did not alternate.
    #[test]
    fn a_skipped_pass_fails_the_check() {
        for isa in Isa::available() {
            for op in [Op::Read, Op::Write, Op::Triad] {
                for runs in [1, 2, 5] {
                    let mut k = StreamKernel::with_isa(op, 8192, false, isa).unwrap();
                    k.run(runs);
                    k.check().unwrap();
                    k.passes += 1;
                    assert!(k.check().is_err(), "{} {} {runs}", isa.name(), op.name());
                }
            }
            // Two passes into the same destination (a = b + q·c twice): b is unchanged and a
            // holds one pass's value, not two.
            let mut k = StreamKernel::with_isa(Op::Triad, 8192, false, isa).unwrap();
            k.run(1);
            k.passes = 0;
            k.run(1);
            k.passes = 2;
            assert!(k.check().is_err(), "{}", isa.name());
        }
    }

    /// The arrays start at three page offsets (STREAM's OFFSET): no two alias in the low 12
    /// address bits, and each stays 64-byte aligned for the aligned vector loads.
    #[test]
    fn arrays_start_at_different_page_offsets() {
        let k = StreamKernel::new(Op::Triad, 3 << 20, false).unwrap();
        let at = [k.a.as_ptr(), k.b.as_ptr(), k.c.as_ptr()].map(|p| p as usize % 4096);
        assert_eq!(at, OFFSETS);
        assert!(at.iter().all(|o| o % 64 == 0));
        assert!(at[0] != at[1] && at[1] != at[2] && at[0] != at[2]);
    }

    #[test]
    fn counts_bytes_as_stream_does() {
        let k = StreamKernel::new(Op::Triad, 3 * 8 * 1024, false).unwrap();
        assert_eq!(k.bytes_per_iter(), 24.0 * 1024.0);
        assert_eq!(k.ops_per_iter(), 2048.0);
        assert_eq!(elems_for(Op::Copy, 10), BLOCK);
    }
}
