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

/// [`round`] without branches, for loops the compiler vectorises (a lane of a transform's
/// output stored in bf16): the same bits for every input — NaN quietened, subnormal inputs to
/// a zero of their sign, the rest to nearest with ties to even (an overflow to infinity).
#[inline(always)]
pub fn round_lanes(x: f32) -> u16 {
    let b = x.to_bits();
    let abs = b & 0x7fff_ffff;
    let nearest = (b.wrapping_add(0x7fff + ((b >> 16) & 1)) >> 16) as u16;
    let nan = ((b >> 16) | 0x40) as u16;
    let zero = ((b >> 16) & 0x8000) as u16;
    if abs > 0x7f80_0000 {
        nan
    } else if abs < 0x0080_0000 {
        zero
    } else {
        nearest
    }
}

/// `src` rounded into `dst` as [`round`] does, element by element (16 at a time with
/// AVX512_BF16): storage for values a product would round anyway.
/// `dst` may be uninitialised: every element is written.
pub fn round_slice(src: &[f32], dst: &mut [std::mem::MaybeUninit<half::bf16>]) {
    assert_eq!(src.len(), dst.len(), "round_slice lengths");
    #[cfg(target_arch = "x86_64")]
    if super::Bf16Gemm::cpu_has() {
        // SAFETY: the features were checked; both slices hold src.len() elements.
        unsafe { x86::round_slice(src, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if std::is_x86_feature_detected!("avx2") {
        // SAFETY: the feature was checked.
        unsafe { round_slice_avx2(src, dst) };
        return;
    }
    round_slice_lanes(src, dst);
}

/// `round_slice` without the bf16 instructions: [`round_lanes`], which vectorises (the
/// branches of [`round`] kept the bf16 passes' rounding scalar, slower than their f32 passes on
/// CPUs that run bf16 only in tests and benches).
#[inline(always)]
fn round_slice_lanes(src: &[f32], dst: &mut [std::mem::MaybeUninit<half::bf16>]) {
    for (d, &s) in dst.iter_mut().zip(src) {
        d.write(half::bf16::from_bits(round_lanes(s)));
    }
}

/// `round_slice_lanes` in AVX2's eight lanes.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn round_slice_avx2(src: &[f32], dst: &mut [std::mem::MaybeUninit<half::bf16>]) {
    round_slice_lanes(src, dst)
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

/// Packs rows `r0 .. r0 + rows` (any number) and k `k0 .. k0 + kk` of `x` into consecutive
/// panels of `w` rows (`rows.div_ceil(w) · kk.div_ceil(2) · w` words): the layout of
/// [`panel`] called for each, the same bits. Where X's rows are contiguous (a pixel-major
/// activation read as Aᵀ or B), every panel is filled pair by pair in one pass, so that each
/// row of memory is read once, front to back: panel after panel, the packing walked a block's
/// rows a panel's width at a time and waited on memory for three quarters of a long bf16
/// reduction (a 1×1 layer's filter gradient).
///
/// # Safety
/// As [`panel`].
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn panels<T: Source>(
    x: View<T>,
    r0: usize,
    rows: usize,
    k0: usize,
    kk: usize,
    w: usize,
    out: &mut [u32],
    vector: bool,
) {
    let size = kk.div_ceil(2) * w;
    let count = rows.div_ceil(w).max(1);
    debug_assert!(out.len() >= count * size);
    #[cfg(target_arch = "x86_64")]
    if vector && x.rs == 1 {
        return x86::interleave(x, r0, rows, k0, kk, w, out);
    }
    for q in 0..count {
        let n = w.min(rows.saturating_sub(q * w));
        panel(
            x,
            r0 + q * w,
            n,
            k0,
            kk,
            w,
            &mut out[q * size..(q + 1) * size],
            vector,
        );
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
    // The rows ahead prefetched, as `x86::interleave` does (a 1×1 layer's forward product
    // spent a third of its time here waiting on memory without it).
    let bytes = kk * std::mem::size_of::<T>();
    let ahead = x86::steps_ahead(bytes);
    for r in 0..rows {
        let row = x.ptr.offset((r0 + r) as isize * x.rs + k0 as isize);
        if r + ahead < rows {
            x86::prefetch(row.offset(ahead as isize * x.rs) as *const i8, bytes);
        }
        let dst = out.as_mut_ptr().add(r * pairs);
        for p0 in (0..pairs).step_by(16) {
            let v = round32(row, 2 * p0, kk);
            let n = (pairs - p0).min(16);
            _mm512_mask_storeu_epi32(dst.add(p0) as *mut i32, ((1u32 << n) - 1) as u16, v);
        }
    }
}

/// As [`rows`], for any strides: panels of 128 rows, their words then transposed into rows,
/// 16 × 16 at a time in registers. Where X's rows are contiguous (a transposed operand) each
/// pair of k is read as two 512-byte runs of memory: in panels of 32 rows, two 128-byte reads
/// a row's stride apart left the packing waiting on memory for two thirds of a pointwise
/// backward-filter product (and the word-by-word transpose cost more than the products).
///
/// # Safety
/// The view covers those rows and k; AVX-512 F/BW/VL/BF16 are present.
#[cfg(target_arch = "x86_64")]
pub(super) unsafe fn rows_any<T: Source>(
    x: View<T>,
    r0: usize,
    rows: usize,
    k0: usize,
    kk: usize,
    out: &mut [u32],
) {
    thread_local! {
        static PANEL: std::cell::RefCell<Vec<u32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    let pairs = kk.div_ceil(2);
    debug_assert!(out.len() >= rows * pairs);
    // Rows per panel: 128 (512 bytes of an f32 row of memory per read; 32, 64, 128 and all the
    // rows measured on the trainer_conv bench's pointwise and 3×3 backward-filter shapes).
    let group = 128;
    PANEL.with_borrow_mut(|tmp| {
        for g in (0..rows).step_by(group) {
            let n = group.min(rows - g);
            let w = n.next_multiple_of(16);
            if tmp.len() < pairs * w {
                tmp.resize(pairs * w, 0);
            }
            panel(x, r0 + g, n, k0, kk, w, &mut tmp[..pairs * w], true);
            let out = &mut out[g * pairs..];
            let full = pairs / 16 * 16;
            let whole = n / 16 * 16;
            for r in (0..whole).step_by(16) {
                for p in (0..full).step_by(16) {
                    x86::transpose16(
                        tmp.as_ptr().add(p * w + r),
                        w,
                        out.as_mut_ptr().add(r * pairs + p),
                        pairs,
                    );
                }
            }
            // The pairs past a multiple of 16, and the rows of a short last block, word by
            // word.
            for r in 0..n {
                let from = if r < whole { full } else { 0 };
                let dst = &mut out[r * pairs..(r + 1) * pairs];
                for (p, d) in dst.iter_mut().enumerate().skip(from) {
                    *d = tmp[p * w + r];
                }
            }
        }
    })
}

#[cfg(target_arch = "x86_64")]
pub(crate) use x86::transpose16;

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;

    /// `pack::round_slice` with `vcvtneps2bf16`: whole vectors with plain loads and stores,
    /// the tail masked. (Masked all the way, on Zen 5: trainer_norm bf16, layer1.bn1+relu1
    /// forward 26 against 35–37 GiB/s, backward on layer3 89–92 against 104–109; `place`'s
    /// bn + ReLU rows 74 against 69 ms a step. Plain stores were not better everywhere: the
    /// GEMM tiles' C stores and the packers' made some products faster and others slower.)
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn round_slice(src: &[f32], dst: &mut [std::mem::MaybeUninit<half::bf16>]) {
        let n = src.len();
        let whole = n - n % 16;
        for i in (0..whole).step_by(16) {
            let h: __m256i =
                std::mem::transmute(_mm512_cvtneps_pbh(_mm512_loadu_ps(src.as_ptr().add(i))));
            _mm256_storeu_si256(dst.as_mut_ptr().add(i) as *mut __m256i, h);
        }
        for i in (whole..n).step_by(16) {
            let left = (n - i).min(16);
            let v = f32::load16(src.as_ptr().add(i), left);
            let h: __m256i = std::mem::transmute(_mm512_cvtneps_pbh(v));
            _mm256_mask_storeu_epi16(
                dst.as_mut_ptr().add(i) as *mut i16,
                ((1u32 << left) - 1) as u16,
                h,
            );
        }
    }

    /// A 16 × 16 block of 32-bit words transposed: row i of `src` (rows `ss` words apart)
    /// becomes column i of `dst` (rows `ds` words apart). Within 128-bit lanes by unpacking
    /// (32-bit, then 64-bit), then the 4 × 4 lanes by two rounds of lane shuffles.
    ///
    /// # Safety
    /// 16 rows of 16 words readable at `src`, writable at `dst`; AVX-512 F present.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn transpose16(src: *const u32, ss: usize, dst: *mut u32, ds: usize) {
        let r: [__m512i; 16] =
            std::array::from_fn(|i| _mm512_loadu_si512(src.add(i * ss) as *const __m512i));
        // a[2i] lane l = (r2i[4l], r2i+1[4l], r2i[4l+1], r2i+1[4l+1]); a[2i+1] the upper two.
        let mut a = [_mm512_setzero_si512(); 16];
        for i in 0..8 {
            a[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
            a[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
        }
        // b[4i + c] lane l = rows 4i .. 4i + 3 of column 4l + c.
        let mut b = [_mm512_setzero_si512(); 16];
        for i in 0..4 {
            b[4 * i] = _mm512_unpacklo_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 1] = _mm512_unpackhi_epi64(a[4 * i], a[4 * i + 2]);
            b[4 * i + 2] = _mm512_unpacklo_epi64(a[4 * i + 1], a[4 * i + 3]);
            b[4 * i + 3] = _mm512_unpackhi_epi64(a[4 * i + 1], a[4 * i + 3]);
        }
        // Column 4l + c = lane l of b[c], b[4 + c], b[8 + c], b[12 + c].
        for c in 0..4 {
            let t0 = _mm512_shuffle_i32x4::<0x44>(b[c], b[4 + c]);
            let t1 = _mm512_shuffle_i32x4::<0xEE>(b[c], b[4 + c]);
            let t2 = _mm512_shuffle_i32x4::<0x44>(b[8 + c], b[12 + c]);
            let t3 = _mm512_shuffle_i32x4::<0xEE>(b[8 + c], b[12 + c]);
            let out = [
                _mm512_shuffle_i32x4::<0x88>(t0, t2),
                _mm512_shuffle_i32x4::<0xDD>(t0, t2),
                _mm512_shuffle_i32x4::<0x88>(t1, t3),
                _mm512_shuffle_i32x4::<0xDD>(t1, t3),
            ];
            for (l, v) in out.into_iter().enumerate() {
                _mm512_storeu_si512(dst.add((4 * l + c) * ds) as *mut __m512i, v);
            }
        }
    }

    /// How far ahead the packers prefetch, in bytes of the rows they read.
    const AHEAD: usize = 8192;

    /// How many steps of `bytes` each (a row, a pair of rows) make up the prefetch distance.
    pub fn steps_ahead(bytes: usize) -> usize {
        (AHEAD / bytes.max(1)).clamp(1, 16)
    }

    /// `bytes` from `at` into L1, a line at a time.
    #[inline(always)]
    pub unsafe fn prefetch(at: *const i8, bytes: usize) {
        for off in (0..bytes).step_by(64) {
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(off));
        }
    }

    /// Rows contiguous (X's r stride 1): two k's rows of 16 values, rounded together and
    /// interleaved into 16 words. `rows` may exceed `w`: the panels of `w` rows follow each
    /// other in `out`, all filled pair by pair (each pair of rows of memory read once).
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
        let pairs = kk.div_ceil(2);
        let count = rows.div_ceil(w).max(1);
        let bytes = rows * std::mem::size_of::<T>();
        let step = steps_ahead(2 * bytes);
        for p in 0..pairs {
            let k = k0 + 2 * p;
            let lo_row = x.ptr.offset(k as isize * x.ks + r0 as isize);
            let hi = 2 * p + 1 < kk;
            let hi_row = x
                .ptr
                .offset((k + hi as usize) as isize * x.ks + r0 as isize);
            // The rows PD pairs ahead, a line at a time (sequential rows of memory, yet read
            // at a quarter of DRAM's rate without it: each pair's misses waited on memory).
            let ahead = p + step;
            if ahead < pairs {
                for kk2 in [2 * ahead, (2 * ahead + 1).min(kk - 1)] {
                    let row = x.ptr.offset((k0 + kk2) as isize * x.ks + r0 as isize);
                    prefetch(row as *const i8, bytes);
                }
            }
            for q in 0..count {
                let dst = out.as_mut_ptr().add((q * pairs + p) * w);
                let rows = rows.saturating_sub(q * w).min(w);
                let (lo_row, hi_row) = (lo_row.add(q * w), hi_row.add(q * w));
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
                    _mm512_mask_storeu_epi32(
                        dst.add(r) as *mut i32,
                        ((1u32 << left) - 1) as u16,
                        v,
                    );
                }
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

#[cfg(all(test, target_arch = "x86_64"))]
mod transpose_tests {
    /// The register transpose against the definition, on a block inside larger strides.
    #[test]
    fn a_16_by_16_block_transposes() {
        if !std::arch::is_x86_feature_detected!("avx512f") {
            return;
        }
        let (ss, ds) = (21, 19);
        let src: Vec<u32> = (0..16 * ss as u32)
            .map(|v| v.wrapping_mul(2654435761))
            .collect();
        let mut dst = vec![0u32; 16 * ds];
        // SAFETY: 16 rows of 16 words at both strides; AVX-512 F checked above.
        unsafe { super::x86::transpose16(src.as_ptr(), ss, dst.as_mut_ptr(), ds) };
        for i in 0..16 {
            for j in 0..16 {
                assert_eq!(dst[j * ds + i], src[i * ss + j], "({i}, {j})");
            }
            for j in 16..ds {
                assert_eq!(dst[i * ds + j], 0, "outside the block");
            }
        }
    }
}

#[cfg(test)]
mod round_tests {
    /// The vector rounding gives the scalar one's bits: ties to even, subnormals flushed, in
    /// whole vectors (the first) and a ragged tail (the last 15).
    #[test]
    fn round_slice_matches_round() {
        let special = [
            1.0 + 2f32.powi(-8),
            1.0 + 3.0 * 2f32.powi(-8),
            f32::MIN_POSITIVE / 4.0,
            -f32::MIN_POSITIVE / 3.0,
            -0.0,
            f32::MAX,
            f32::INFINITY,
        ];
        let mut src = special.to_vec();
        src.extend((0..993).map(|i| (i as f32 * 0.7311).sin() * 3e3));
        src.extend(special);
        assert_eq!(src.len() % 16, 15);
        let mut got = vec![std::mem::MaybeUninit::uninit(); src.len()];
        super::round_slice(&src, &mut got);
        for (s, g) in src.iter().zip(&got) {
            // SAFETY: round_slice wrote every element.
            assert_eq!(
                unsafe { g.assume_init() }.to_bits(),
                super::round(*s),
                "{s:e}"
            );
        }
    }
}
