//! A convolution with a short filter depth (`r·s·c` ≤ KC: ResNet's 7×7 stem on 3 channels)
//! multiplied where its taps lie, without an im2col patch. In NHWC, the `s·c` taps of one filter
//! row are consecutive inputs, and consecutive output pixels of one output row start `stride·c`
//! inputs apart: over a zero-padded image, one output row's patch is `r` matrices (one per
//! filter row, a padded image row apart), each with rows `stride·c` apart and `s·c` contiguous
//! values — readable in place by the micro-kernel's broadcasts. im2col copied 147 floats per
//! output pixel in 21-float runs, 30% of the stem's forward pass (perf, trainer_conv).
//!
//! Forward: `y = Σ_f A_f · W_f` over the filter rows f, the sums kept in registers across them.
//! Filter gradient: `dW += patchᵀ · dy` over one output row's pixels, a tile of dW's rows (taps)
//! reading each tap's inputs from where they lie (a tile's 14 taps may span two filter rows).

use super::micro::{MR, NR};
#[cfg(target_arch = "x86_64")]
use super::Kernel;
use super::{F32Gemm, PackedF32, KC, NC};
use crate::cpu::tiles::Dest;

/// One output row's patch over a zero-padded image: pixel `i`'s values of filter row `f` are
/// the `run` values from `a + f·row + i·pixel`.
#[derive(Clone, Copy, Debug)]
pub struct Taps {
    /// Pixel 0's first value.
    pub a: *const f32,
    /// Between consecutive output pixels (`stride·c`).
    pub pixel: usize,
    /// Between consecutive filter rows (a padded image row, `(w + 2·pad)·c`).
    pub row: usize,
    /// Filter rows (`r`).
    pub rows: usize,
    /// Values per filter row (`s·c`).
    pub run: usize,
}

impl Taps {
    /// The patch's depth (`r·s·c`).
    pub fn depth(&self) -> usize {
        self.rows * self.run
    }

    /// Tap `d`'s first value (pixel 0).
    fn tap(&self, d: usize) -> *const f32 {
        self.a.wrapping_add(d / self.run * self.row + d % self.run)
    }
}

/// Whether `taps_forward` and `taps_filter` take a convolution of this depth into `n` output
/// channels: a depth within one block of k, whole column panels within one block of columns.
pub fn taps_apply(depth: usize, n: usize) -> bool {
    depth > 0 && depth <= KC && n > 0 && n.is_multiple_of(NR) && n <= NC
}

impl F32Gemm {
    /// `c[m×n] = Σ_f A_f · W_f`: one output row (`m` pixels) from its taps and the filter `w`
    /// packed by `pack_b` (`depth × n`, `taps_apply`), `c` overwritten.
    ///
    /// # Safety
    /// `taps_apply(taps.depth(), w.n)`; the inputs `taps` names are readable for
    /// `m.next_multiple_of(MR)` pixels (a partial tile's extra pixels are read, not used);
    /// `c` covers `m × n` with leading dimension `ldc`.
    pub unsafe fn taps_forward(
        &self,
        taps: Taps,
        m: usize,
        c: *mut f32,
        ldc: usize,
        w: &PackedF32,
    ) {
        let (k, n) = w.dims();
        assert!(
            taps_apply(k, n) && k == taps.depth(),
            "taps_forward: {taps:?} against {k} × {n}"
        );
        for ip in 0..m.div_ceil(MR) {
            let a = taps.a.add(ip * MR * taps.pixel);
            for jp in 0..n / NR {
                let d = Dest {
                    c: c.add(ip * MR * ldc + jp * NR),
                    ldc,
                    rows: MR.min(m - ip * MR),
                    cols: NR,
                    overwrite: true,
                };
                let b = w.values[w.base + jp * k * NR..].as_ptr();
                let t = Taps { a, ..taps };
                match self.kernel {
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx512 => x86::forward(t, b, d),
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx2 => avx2::forward(t, b, d),
                    _ => forward_portable(t, b, d),
                }
            }
        }
    }

    /// `dw[depth×n] (+)= patchᵀ · dy`: one output row's `m` pixels, `dy` its `m × n` gradient
    /// (rows `ldy` apart); `dw` (leading dimension `ldw`) added to when `accumulate`.
    ///
    /// # Safety
    /// `taps_apply(taps.depth(), n)`; the inputs `taps` names are readable for `m` pixels, and
    /// for `m` pixels from tap 0 (a partial tile's extra taps read tap 0's, not used); `dy`
    /// covers `m × n`; `dw` covers `depth × n`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn taps_filter(
        &self,
        taps: Taps,
        m: usize,
        dy: *const f32,
        ldy: usize,
        n: usize,
        dw: *mut f32,
        ldw: usize,
        accumulate: bool,
    ) {
        let depth = taps.depth();
        assert!(
            taps_apply(depth, n),
            "taps_filter: {taps:?} into {n} columns"
        );
        if m == 0 {
            if !accumulate {
                for d in 0..depth {
                    std::ptr::write_bytes(dw.add(d * ldw), 0, n);
                }
            }
            return;
        }
        for ip in 0..depth.div_ceil(MR) {
            let rows = MR.min(depth - ip * MR);
            let a: [*const f32; MR] =
                std::array::from_fn(|i| taps.tap(if i < rows { ip * MR + i } else { 0 }));
            for jp in 0..n / NR {
                let d = Dest {
                    c: dw.add(ip * MR * ldw + jp * NR),
                    ldc: ldw,
                    rows,
                    cols: NR,
                    overwrite: !accumulate,
                };
                let b = dy.add(jp * NR);
                match self.kernel {
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx512 => x86::filter(m, &a, taps.pixel, b, ldy, d),
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx2 => avx2::filter(m, &a, taps.pixel, b, ldy, d),
                    _ => filter_portable(m, &a, taps.pixel, b, ldy, d),
                }
            }
        }
    }
}

/// One tile of `taps_forward`: MR pixels by a panel of NR columns (`b`, packed), every filter
/// row in turn.
///
/// # Safety
/// As `taps_forward`, for this tile.
unsafe fn forward_portable(t: Taps, b: *const f32, d: Dest) {
    let mut acc = [[0f32; NR]; MR];
    for f in 0..t.rows {
        let (a, b) = (t.a.add(f * t.row), b.add(f * t.run * NR));
        for p in 0..t.run {
            let bw = std::slice::from_raw_parts(b.add(p * NR), NR);
            for (i, row) in acc.iter_mut().enumerate() {
                let av = *a.add(i * t.pixel + p);
                for (x, &w) in row.iter_mut().zip(bw) {
                    *x = av.mul_add(w, *x);
                }
            }
        }
    }
    d.store_portable(&acc);
}

/// One tile of `taps_filter`: MR taps (tap `i`'s inputs from `a[i]`, a pixel `pixel` apart)
/// by NR columns of `dy` (rows `ldy` apart), over `m` pixels.
///
/// # Safety
/// As `taps_filter`, for this tile.
unsafe fn filter_portable(
    m: usize,
    a: &[*const f32; MR],
    pixel: usize,
    b: *const f32,
    ldy: usize,
    d: Dest,
) {
    let mut acc = [[0f32; NR]; MR];
    for p in 0..m {
        let bw = std::slice::from_raw_parts(b.add(p * ldy), NR);
        for (row, &ai) in acc.iter_mut().zip(a) {
            let av = *ai.add(p * pixel);
            for (x, &w) in row.iter_mut().zip(bw) {
                *x = av.mul_add(w, *x);
            }
        }
    }
    d.store_portable(&acc);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::super::micro::NV;
    use super::*;
    use std::arch::x86_64::*;

    /// As `forward_portable` (the same bits), in AVX-512 F.
    ///
    /// # Safety
    /// As `forward_portable`; AVX-512 F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn forward(t: Taps, b: *const f32, d: Dest) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for f in 0..t.rows {
            let (a, b) = (t.a.add(f * t.row), b.add(f * t.run * NR));
            for p in 0..t.run {
                let bv: [__m512; NV] =
                    std::array::from_fn(|v| _mm512_loadu_ps(b.add(p * NR + 16 * v)));
                for (i, row) in acc.iter_mut().enumerate() {
                    let av = _mm512_set1_ps(*a.add(i * t.pixel + p));
                    for (x, &w) in row.iter_mut().zip(&bv) {
                        *x = _mm512_fmadd_ps(av, w, *x);
                    }
                }
            }
        }
        d.store(&acc);
    }

    /// As `filter_portable` (the same bits), in AVX-512 F.
    ///
    /// # Safety
    /// As `filter_portable`; AVX-512 F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn filter(
        m: usize,
        a: &[*const f32; MR],
        pixel: usize,
        b: *const f32,
        ldy: usize,
        d: Dest,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for p in 0..m {
            let bv: [__m512; NV] =
                std::array::from_fn(|v| _mm512_loadu_ps(b.add(p * ldy + 16 * v)));
            let at = p * pixel;
            for (row, &ai) in acc.iter_mut().zip(a) {
                let av = _mm512_set1_ps(*ai.add(at));
                for (x, &w) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, w, *x);
                }
            }
        }
        d.store(&acc);
    }
}

/// The taps kernels on AVX2: each tile in six passes of 5, 5 and 4 rows by 16 columns, as
/// `micro::tile_avx2` (the same sums in the same order: the portable kernels' bits).
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::super::micro::avx2::{part, sweep, GROUPS};
    use super::*;
    use std::arch::x86_64::*;

    /// As `forward_portable` (the same bits).
    ///
    /// # Safety
    /// As `forward_portable`; AVX2 and FMA present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn forward(t: Taps, b: *const f32, d: Dest) {
        for h in 0..d.cols.div_ceil(16) {
            for (r0, n) in GROUPS {
                if r0 >= d.rows {
                    break;
                }
                // The panel in halves of 16 columns (`pack_panel` for this kernel).
                let (b, d) = (b.add(16 * t.depth() * h), part(d, r0, n, h));
                match n {
                    5 => forward_pass::<5>(t, r0, b, d),
                    _ => forward_pass::<4>(t, r0, b, d),
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn forward_pass<const R: usize>(t: Taps, r0: usize, b: *const f32, d: Dest) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for f in 0..t.rows {
            let mut rows = [t.a; R];
            for (i, row) in rows.iter_mut().enumerate() {
                *row = t.a.add((r0 + i) * t.pixel + f * t.row);
            }
            acc = sweep(acc, &rows, 1, b.add(f * t.run * 16), 16, t.run);
        }
        d.store_avx2(&acc);
    }

    /// As `filter_portable` (the same bits).
    ///
    /// # Safety
    /// As `filter_portable`; AVX2 and FMA present.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn filter(
        m: usize,
        a: &[*const f32; MR],
        pixel: usize,
        b: *const f32,
        ldy: usize,
        d: Dest,
    ) {
        for h in 0..d.cols.div_ceil(16) {
            for (r0, n) in GROUPS {
                if r0 >= d.rows {
                    break;
                }
                let (b, d) = (b.add(16 * h), part(d, r0, n, h));
                match n {
                    5 => filter_pass::<5>(m, a, r0, pixel, b, ldy, d),
                    _ => filter_pass::<4>(m, a, r0, pixel, b, ldy, d),
                }
            }
        }
    }

    #[inline(always)]
    unsafe fn filter_pass<const R: usize>(
        m: usize,
        a: &[*const f32; MR],
        r0: usize,
        pixel: usize,
        b: *const f32,
        ldy: usize,
        d: Dest,
    ) {
        let mut rows = [a[0]; R];
        rows.copy_from_slice(&a[r0..r0 + R]);
        let acc = sweep([[_mm256_setzero_ps(); 2]; R], &rows, pixel, b, ldy, m);
        d.store_avx2(&acc);
    }
}
