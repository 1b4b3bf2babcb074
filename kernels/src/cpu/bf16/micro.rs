//! The micro-kernel: an `MR × NR` tile of C (f32) += packed A panel · packed B panel, one
//! `vdpbf16ps` per accumulator per pair of k (two products each), 28 accumulators in registers.
//! The portable version computes the same sums in the same order per lane (each pair: the high
//! product added, then the low one, as Intel's pseudo-code for `vdpbf16ps` has it), for CPUs
//! without AVX512_BF16 and as the tests' second opinion.

/// Rows of a tile.
pub const MR: usize = 14;
/// Columns of a tile (two 16-lane vectors).
pub const NR: usize = 32;

use super::super::tiles::Dest;

fn widen(h: u32) -> f32 {
    f32::from_bits(h << 16)
}

/// # Safety
/// `a` holds `pairs · MR` words, `b` `pairs · NR`; `d` covers its rows and columns.
pub unsafe fn tile_portable(pairs: usize, a: *const u32, b: *const u32, d: Dest) {
    let mut acc = [[0f32; NR]; MR];
    for p in 0..pairs {
        let bw = std::slice::from_raw_parts(b.add(p * NR), NR);
        for (i, row) in acc.iter_mut().enumerate() {
            let aw = *a.add(p * MR + i);
            let (alo, ahi) = (widen(aw & 0xffff), widen(aw >> 16));
            for (x, &w) in row.iter_mut().zip(bw) {
                *x += ahi * widen(w >> 16);
                *x += alo * widen(w & 0xffff);
            }
        }
    }
    d.store_portable(&acc);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// A packed as panels (`a` holds `pairs · MR` words, pair-major).
    ///
    /// # Safety
    /// As `tile_portable`; AVX-512 F/BW/VL/BF16 present.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn tile(pairs: usize, a: *const u32, b: *const u32, d: Dest) {
        tile_at::<false>(pairs, a, 0, b, d)
    }

    /// A as rows of `lda` words (row i's pair p at `a + i·lda + p`, rows past `d.rows`
    /// readable): no transposition in the packing.
    ///
    /// # Safety
    /// As `tile_portable`, with A's MR rows of `pairs` words `lda` apart; AVX-512 F/BW/VL/BF16.
    #[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512bf16")]
    pub unsafe fn tile_rows(pairs: usize, a: *const u32, lda: usize, b: *const u32, d: Dest) {
        tile_at::<true>(pairs, a, lda, b, d)
    }

    #[inline(always)]
    unsafe fn tile_at<const ROWS: bool>(
        pairs: usize,
        a: *const u32,
        lda: usize,
        b: *const u32,
        d: Dest,
    ) {
        let mut acc = [[_mm512_setzero_ps(); 2]; MR];
        for p in 0..pairs {
            let b0: __m512bh = std::mem::transmute(_mm512_loadu_si512(b.add(p * NR) as *const _));
            let b1: __m512bh =
                std::mem::transmute(_mm512_loadu_si512(b.add(p * NR + 16) as *const _));
            for (i, row) in acc.iter_mut().enumerate() {
                let at = if ROWS {
                    a.add(i * lda + p)
                } else {
                    a.add(p * MR + i)
                };
                let av: __m512bh = std::mem::transmute(_mm512_set1_epi32(*at as i32));
                row[0] = _mm512_dpbf16_ps(row[0], av, b0);
                row[1] = _mm512_dpbf16_ps(row[1], av, b1);
            }
        }
        d.store(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::{tile, tile_rows};
