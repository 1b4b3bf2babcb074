//! The micro-kernel: an `MR × NR` tile of C (f32) += A's `MR` rows · one packed panel of B,
//! one fused multiply-add per accumulator per k, 28 accumulators in registers. A is read in
//! place, by broadcast, in one of two layouts (`Layout`); the portable version makes the same
//! fused sums in the same order (`f32::mul_add`), for CPUs without AVX-512 and for the tests.

/// Rows of a tile.
pub const MR: usize = 14;
/// 16-lane vectors per row of a tile.
pub const NV: usize = 2;
/// Columns of a tile.
pub const NR: usize = 16 * NV;

/// Where element (i, p) of a tile's A is, from its first: `Rows` at `i·lda + p` (A's k
/// contiguous: a row-major matrix, im2col patches), `Cols` at `p·lda + i` (A's rows contiguous:
/// a transposed row-major matrix, or a packed panel with `lda = MR`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Rows,
    Cols,
}

/// Where a tile goes: `rows × cols` of C (≤ MR × NR) at `c` with leading dimension `ldc`,
/// overwritten or added to.
#[derive(Clone, Copy)]
pub struct Dest {
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub cols: usize,
    pub overwrite: bool,
}

/// # Safety
/// A's `MR` rows of `kc` elements readable in `layout` at `a`; `b` holds `kc · NR` values; `d`
/// covers its rows and columns.
pub unsafe fn tile_portable(
    kc: usize,
    a: *const f32,
    lda: usize,
    layout: Layout,
    b: *const f32,
    d: Dest,
) {
    let mut acc = [[0f32; NR]; MR];
    for p in 0..kc {
        let bw = std::slice::from_raw_parts(b.add(p * NR), NR);
        for (i, row) in acc.iter_mut().enumerate() {
            let av = *a.add(match layout {
                Layout::Rows => i * lda + p,
                Layout::Cols => p * lda + i,
            });
            for (x, &w) in row.iter_mut().zip(bw) {
                *x = av.mul_add(w, *x);
            }
        }
    }
    // Through raw pointers: an overwritten C may not be initialised yet (it is never read).
    for (i, row) in acc.iter().enumerate().take(d.rows) {
        let dst = d.c.add(i * d.ldc);
        for (j, &x) in row.iter().enumerate().take(d.cols) {
            let y = dst.add(j);
            *y = if d.overwrite { x } else { *y + x };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// # Safety
    /// As `tile_portable`; AVX-512 F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn tile(
        kc: usize,
        a: *const f32,
        lda: usize,
        layout: Layout,
        b: *const f32,
        d: Dest,
    ) {
        match layout {
            Layout::Rows => tile_at::<true>(kc, a, lda, b, d),
            Layout::Cols => tile_at::<false>(kc, a, lda, b, d),
        }
    }

    #[inline(always)]
    unsafe fn tile_at<const ROWS: bool>(
        kc: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        d: Dest,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        for p in 0..kc {
            let bv: [__m512; NV] = std::array::from_fn(|v| _mm512_loadu_ps(b.add(p * NR + 16 * v)));
            for (i, row) in acc.iter_mut().enumerate() {
                let at = if ROWS {
                    a.add(i * lda + p)
                } else {
                    a.add(p * lda + i)
                };
                let av = _mm512_set1_ps(*at);
                for (x, &w) in row.iter_mut().zip(&bv) {
                    *x = _mm512_fmadd_ps(av, w, *x);
                }
            }
        }
        let mask = |lo: usize| -> u16 {
            let n = d.cols.saturating_sub(lo).min(16);
            ((1u32 << n) - 1) as u16
        };
        let masks: [u16; NV] = std::array::from_fn(|v| mask(16 * v));
        for (i, row) in acc.iter().enumerate() {
            if i >= d.rows {
                break;
            }
            let dst = d.c.add(i * d.ldc);
            for (h, (&v, &mk)) in row.iter().zip(&masks).enumerate() {
                let p = dst.add(16 * h);
                let v = if d.overwrite {
                    v
                } else {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), v)
                };
                _mm512_mask_storeu_ps(p, mk, v);
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::tile;
