//! Packing: operands (f32 or bf16, any strides) rounded to bf16 and laid out for the micro-kernel.
//!
//! A packed panel holds `w` rows of a logical matrix X (rows r, columns along k) for a block of
//! k: for each pair of k (2p, 2p + 1), `w` 32-bit words, word r = (X[r][2p] in the low half,
//! X[r][2p + 1] in the high half) — the layout `vdpbf16ps` multiplies pairwise. For A, X = A
//! (r = row of A); for B, X = Bᵀ (r = column of B). Rows past the matrix and the odd k past its
//! end are zero, so the micro-kernel never needs an edge case along k or inside a panel.
//!
//! Rounding f32 → bf16 is to nearest, ties to even (`vcvtne2ps2bf16`); bf16 sources pass through
//! exactly.

use super::Operand;
#[cfg(target_arch = "x86_64")]
use std::arch::x86_64::*;

/// An element an operand may hold.
pub trait Source: Copy + Send + Sync + 'static {
    /// The value as f32 (exact for both types).
    fn to_f32(self) -> f32;
    /// Loads `n` ≤ 16 consecutive values as f32 lanes (the others zero).
    ///
    /// # Safety
    /// `ptr..ptr + n` readable; AVX-512 F/BW/VL present.
    #[cfg(target_arch = "x86_64")]
    unsafe fn load16(ptr: *const Self, n: usize) -> __m512;
}

impl Source for f32 {
    fn to_f32(self) -> f32 {
        self
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(ptr: *const f32, n: usize) -> __m512 {
        if n >= 16 {
            _mm512_loadu_ps(ptr)
        } else {
            _mm512_maskz_loadu_ps(((1u32 << n) - 1) as u16, ptr)
        }
    }
}

impl Source for half::bf16 {
    fn to_f32(self) -> f32 {
        half::bf16::to_f32(self)
    }
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn load16(ptr: *const half::bf16, n: usize) -> __m512 {
        let mask = if n >= 16 {
            u16::MAX
        } else {
            ((1u32 << n) - 1) as u16
        };
        let h = _mm256_maskz_loadu_epi16(mask, ptr as *const i16);
        _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16))
    }
}

/// The bf16 bits of `x` as `vcvtne2ps2bf16` makes them: to nearest, ties to even, subnormal
/// inputs flushed to zero of their sign (so every packing path gives the same bits).
pub fn round(x: f32) -> u16 {
    let x = if x != 0.0 && x.abs() < f32::MIN_POSITIVE {
        0.0f32.copysign(x)
    } else {
        x
    };
    half::bf16::from_f32(x).to_bits()
}

fn word<T: Source>(lo: T, hi: T) -> u32 {
    round(lo.to_f32()) as u32 | (round(hi.to_f32()) as u32) << 16
}

/// X as a logical matrix over an operand: element (r, p) at `ptr + r·rs + p·ks`.
#[derive(Clone, Copy)]
pub(super) struct View<T> {
    pub ptr: *const T,
    pub rs: isize,
    pub ks: isize,
}

// SAFETY: a view is read only, and its users guarantee the memory outlives the product.
unsafe impl<T: Sync> Send for View<T> {}
unsafe impl<T: Sync> Sync for View<T> {}

impl<T: Source> View<T> {
    /// X = A.
    pub fn of_lhs(a: Operand<T>) -> View<T> {
        View {
            ptr: a.ptr,
            rs: a.rs,
            ks: a.cs,
        }
    }
    /// X = Bᵀ.
    pub fn of_rhs(b: Operand<T>) -> View<T> {
        View {
            ptr: b.ptr,
            rs: b.cs,
            ks: b.rs,
        }
    }

    unsafe fn at(&self, r: usize, p: usize) -> T {
        *self.ptr.offset(r as isize * self.rs + p as isize * self.ks)
    }
}

/// Packs rows `r0 .. r0 + rows` (≤ `w`) and k `k0 .. k0 + kk` of `x` into `out`
/// (`kk.div_ceil(2) · w` words).
///
/// # Safety
/// The view covers those rows and k; with `vector`, AVX-512 F/BW/VL/BF16 are present.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panel<T: Source>(
    x: View<T>,
    r0: usize,
    rows: usize,
    k0: usize,
    kk: usize,
    w: usize,
    out: &mut [u32],
    vector: bool,
) {
    let pairs = kk.div_ceil(2);
    debug_assert!(rows <= w && out.len() >= pairs * w);
    #[cfg(target_arch = "x86_64")]
    if vector {
        if x.rs == 1 {
            return x86::interleave(x, r0, rows, k0, kk, w, out);
        }
        if x.ks == 1 {
            return x86::pairs(x, r0, rows, k0, kk, w, out);
        }
    }
    let _ = vector;
    for p in 0..pairs {
        let dst = &mut out[p * w..(p + 1) * w];
        for (r, d) in dst.iter_mut().enumerate() {
            *d = if r >= rows {
                0
            } else {
                let lo = x.at(r0 + r, k0 + 2 * p);
                if 2 * p + 1 < kk {
                    word(lo, x.at(r0 + r, k0 + 2 * p + 1))
                } else {
                    round(lo.to_f32()) as u32
                }
            };
        }
    }
}

/// The values `k .. min(k + 32, kk)` of a row with k stride 1 (zeros past `kk`), rounded to
/// 16 words of two bf16 each, in k order.
///
/// # Safety
/// `row + k .. row + kk` readable; AVX-512 F/BW/VL/BF16 present.
#[cfg(target_arch = "x86_64")]
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
unsafe fn round32<T: Source>(row: *const T, k: usize, kk: usize) -> __m512i {
    let lo = T::load16(row.add(k), (kk - k).min(16));
    let hi = if kk > k + 16 {
        T::load16(row.add(k + 16), (kk - k - 16).min(16))
    } else {
        _mm512_setzero_ps()
    };
    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo))
}

/// Rounds rows `r0 .. r0 + rows` and k `k0 .. k0 + kk` of `x` into `out` row by row: row r's
/// pair p at word `r · kk.div_ceil(2) + p` (the layout the row micro-kernel broadcasts from; it
/// needs X's k stride 1, so no transposition: one conversion per 32 values).
///
/// # Safety
/// The view covers those rows and k, with k stride 1; AVX-512 F/BW/VL/BF16 are present.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
pub(super) unsafe fn rows<T: Source>(
    x: View<T>,
    r0: usize,
    rows: usize,
    k0: usize,
    kk: usize,
    out: &mut [u32],
) {
    let pairs = kk.div_ceil(2);
    debug_assert!(x.ks == 1 && out.len() >= rows * pairs);
    for r in 0..rows {
        let row = x.ptr.offset((r0 + r) as isize * x.rs + k0 as isize);
        let dst = out.as_mut_ptr().add(r * pairs);
        for p0 in (0..pairs).step_by(16) {
            let v = round32(row, 2 * p0, kk);
            let n = (pairs - p0).min(16);
            _mm512_mask_storeu_epi32(dst.add(p0) as *mut i32, ((1u32 << n) - 1) as u16, v);
        }
    }
}

/// As [`rows`], for any strides: panels of 32 rows (the vector interleave where X's rows are
/// contiguous), their words then transposed into rows.
///
/// # Safety
/// The view covers those rows and k; `kk ≤ KC`; AVX-512 F/BW/VL/BF16 are present.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn rows_any<T: Source>(
    x: View<T>,
    r0: usize,
    rows: usize,
    k0: usize,
    kk: usize,
    out: &mut [u32],
) {
    const W: usize = 32;
    let pairs = kk.div_ceil(2);
    debug_assert!(pairs <= super::KC / 2 && out.len() >= rows * pairs);
    let mut tmp = [0u32; super::KC / 2 * W];
    for g in (0..rows).step_by(W) {
        let n = W.min(rows - g);
        panel(x, r0 + g, n, k0, kk, W, &mut tmp[..pairs * W], true);
        for r in 0..n {
            let dst = &mut out[(g + r) * pairs..(g + r + 1) * pairs];
            for (p, d) in dst.iter_mut().enumerate() {
                *d = tmp[p * W + r];
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    /// Rows contiguous (X's r stride 1): two k's rows of 16 values, rounded together and
    /// interleaved into 16 words.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn interleave<T: Source>(
        x: View<T>,
        r0: usize,
        rows: usize,
        k0: usize,
        kk: usize,
        w: usize,
        out: &mut [u32],
    ) {
        // Word t = (bf16 lane t, bf16 lane 16 + t).
        let idx = _mm512_set_epi16(
            31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6, 21, 5, 20,
            4, 19, 3, 18, 2, 17, 1, 16, 0,
        );
        let zero = _mm512_setzero_ps();
        for p in 0..kk.div_ceil(2) {
            let k = k0 + 2 * p;
            let lo_row = x.ptr.offset(k as isize * x.ks + r0 as isize);
            let hi = 2 * p + 1 < kk;
            let hi_row = x
                .ptr
                .offset((k + hi as usize) as isize * x.ks + r0 as isize);
            let dst = out.as_mut_ptr().add(p * w);
            for r in (0..w).step_by(16) {
                let n = rows.saturating_sub(r).min(16);
                let left = (w - r).min(16);
                let (lo, hi) = if n == 0 {
                    (zero, zero)
                } else {
                    let lo = T::load16(lo_row.add(r), n);
                    (
                        lo,
                        if hi {
                            T::load16(hi_row.add(r), n)
                        } else {
                            zero
                        },
                    )
                };
                let v = _mm512_permutexvar_epi16(
                    idx,
                    std::mem::transmute::<__m512bh, __m512i>(_mm512_cvtne2ps_pbh(hi, lo)),
                );
                _mm512_mask_storeu_epi32(dst.add(r) as *mut i32, ((1u32 << left) - 1) as u16, v);
            }
        }
    }

    /// k contiguous (X's k stride 1): 32 k of one row rounded into 16 words, stored a panel
    /// width apart.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn pairs<T: Source>(
        x: View<T>,
        r0: usize,
        rows: usize,
        k0: usize,
        kk: usize,
        w: usize,
        out: &mut [u32],
    ) {
        let pairs = kk.div_ceil(2);
        let dst = out.as_mut_ptr();
        let mut words = [0u32; 16];
        for r in 0..w {
            if r >= rows {
                for p in 0..pairs {
                    *dst.add(p * w + r) = 0;
                }
                continue;
            }
            let row = x.ptr.offset((r0 + r) as isize * x.rs + k0 as isize);
            for p0 in (0..pairs).step_by(16) {
                let v = round32(row, 2 * p0, kk);
                _mm512_storeu_si512(words.as_mut_ptr() as *mut __m512i, v);
                for (t, wd) in words.iter().enumerate().take((pairs - p0).min(16)) {
                    *dst.add((p0 + t) * w + r) = *wd;
                }
            }
        }
    }
}
