//! The micro-kernel: an `MR × NR` tile of C (f32) += A's `MR` rows · one packed panel of B,
//! one fused multiply-add per accumulator per k, 28 accumulators in registers. A is read in
//! place, by broadcast, in one of two layouts (`Layout`); the portable version makes the same
//! fused sums in the same order (`f32::mul_add`), for the tests and CPUs without AVX-512 or AVX2
//! (`tile_avx2` below makes them in six passes).

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

use super::super::tiles::Dest;

/// What the tile after this one reads first, for the kernel to prefetch while it runs: A's
/// `MR` rows (k contiguous, `lda` apart as this tile's, read in place from a matrix in memory),
/// and its tile of C (`MR` rows of `NR`, `ldc` apart as this tile's). Null where there is
/// nothing to fetch; a prefetch never faults, and past a matrix's end it fetches a line unused.
/// Also a run of `lines` cache lines from `run` (the next block of k's operands, streamed
/// from memory while this block is multiplied), one per k, into L2 (`prefetcht1`: into L1
/// they would evict this block's panels).
#[derive(Clone, Copy)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub struct Next {
    pub a: *const f32,
    pub c: *const f32,
    pub run: *const u8,
    pub lines: usize,
}

impl Next {
    pub const NONE: Next = Next {
        a: std::ptr::null(),
        c: std::ptr::null(),
        run: std::ptr::null(),
        lines: 0,
    };
}

/// # Safety
/// A's `MR` rows of `kc` elements readable in `layout` at `a`; B's `kc` rows of `NR` values
/// at `b`, `ldb` apart (`NR` for a packed panel); `d` covers its rows and columns. (`Next` is
/// for the vector kernel.)
#[allow(clippy::too_many_arguments)]
pub unsafe fn tile_portable(
    kc: usize,
    a: *const f32,
    lda: usize,
    layout: Layout,
    b: *const f32,
    ldb: usize,
    d: Dest,
) {
    let mut acc = [[0f32; NR]; MR];
    for p in 0..kc {
        let bw = std::slice::from_raw_parts(b.add(p * ldb), NR);
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
    d.store_portable(&acc);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::*;
    use std::arch::x86_64::*;

    /// As `tile_portable`, fetching `next` into L1 as it goes: one line of the next tile's
    /// A per k (row `p mod MR` at k `p`: each of its rows a line per 14 k, ahead of its 16
    /// values a line), and one of its C per k for the first `2·MR` (asked as for writing, but
    /// without the unstable `prfchw` target feature this is `prefetcht0` too). A read from
    /// memory in place waits on DRAM without it (a tile's first touch of 14 streams at once).
    ///
    /// # Safety
    /// As `tile_portable`; AVX-512 F present.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile(
        kc: usize,
        a: *const f32,
        lda: usize,
        layout: Layout,
        b: *const f32,
        ldb: usize,
        d: Dest,
        next: Next,
    ) {
        match (layout, next.a.is_null()) {
            (Layout::Rows, false) => tile_at::<true, true>(kc, a, lda, b, ldb, d, next),
            (Layout::Rows, true) => tile_at::<true, false>(kc, a, lda, b, ldb, d, next),
            (Layout::Cols, _) => tile_at::<false, false>(kc, a, lda, b, ldb, d, next),
        }
    }

    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile_at<const ROWS: bool, const NEXT_A: bool>(
        kc: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        d: Dest,
        next: Next,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        let mut r = 0;
        for p in 0..kc {
            if NEXT_A {
                _mm_prefetch::<_MM_HINT_T0>(next.a.wrapping_add(r * lda + p) as *const i8);
                r = if r + 1 == MR { 0 } else { r + 1 };
            }
            if p < next.lines {
                _mm_prefetch::<_MM_HINT_T1>(next.run.wrapping_add(p * 64) as *const i8);
            }
            if p < 2 * MR && !next.c.is_null() {
                let at = next.c.wrapping_add((p >> 1) * d.ldc + (p & 1) * 16);
                _mm_prefetch::<_MM_HINT_ET0>(at as *const i8);
            }
            let bv: [__m512; NV] =
                std::array::from_fn(|v| _mm512_loadu_ps(b.add(p * ldb + 16 * v)));
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
        d.store(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
pub use x86::tile;

/// The tile on AVX2 (16 registers of 8 lanes): the same `MR × NR` tile, its fused sums in the
/// same order (so the same bits), made in six passes over k, each rows of a third of the tile
/// by one half of its columns (5, 5 and 4 rows by 16 columns: 10 or 8 accumulators, two of B's
/// vectors and a broadcast of A in registers; at least 8 independent sums, FMA's latency
/// covered). Its packed panels of B are in halves (`pack_panel`): a pass reads one half, a line
/// per k. The first pass prefetches `next` as the AVX-512 kernel does. (On all of a 1×1
/// layer's in-place products, layer2.1 conv1 forward on Zen 3, that pass took 28% of the time
/// for 18% of the sums (perf, cpu-clock): its prefetch code, not where it sits, is the cost —
/// spread over the six passes, a share of A's rows in each, it ran 37.7–38.3 ms against
/// 35.1–35.6; without A's prefetches, 38–41; so it stays in the first pass.)
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// The passes' first rows and row counts.
    pub(in crate::cpu::sgemm) const GROUPS: [(usize, usize); 3] = [(0, 5), (5, 5), (10, 4)];

    /// Row group `(r0, n)`'s part of `d`, columns `16h ..`.
    pub(in crate::cpu::sgemm) fn part(d: Dest, r0: usize, n: usize, h: usize) -> Dest {
        Dest {
            // A pointer into C's tile (`d` covers it).
            c: d.c.wrapping_add(r0 * d.ldc + 16 * h),
            rows: (d.rows - r0).min(n),
            cols: (d.cols - 16 * h).min(16),
            ..d
        }
    }

    /// `acc[i] + Σ_p rows[i][p·step] · b[p·ldb ..][..16]` over `p < kc`: the passes' inner
    /// loop, for the taps kernels (by value: through a reference, the taps forward's
    /// accumulators went to the stack between its filter rows).
    #[inline(always)]
    pub(in crate::cpu::sgemm) unsafe fn sweep<const R: usize>(
        mut acc: [[__m256; 2]; R],
        rows: &[*const f32; R],
        step: usize,
        b: *const f32,
        ldb: usize,
        kc: usize,
    ) -> [[__m256; 2]; R] {
        let mut bp = b;
        for p in 0..kc {
            let bv = [_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8))];
            bp = bp.add(ldb);
            for (row, &at) in acc.iter_mut().zip(rows) {
                let av = _mm256_broadcast_ss(&*at.add(p * step));
                row[0] = _mm256_fmadd_ps(av, bv[0], row[0]);
                row[1] = _mm256_fmadd_ps(av, bv[1], row[1]);
            }
        }
        acc
    }

    /// B's columns 16 .. 32 at `b + half` (16 for B's rows of 32 values, `16·kc` for a panel
    /// packed for this kernel in halves), rows `ldb` apart.
    ///
    /// # Safety
    /// As `tile_portable`, B as said; AVX2 and FMA present.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn tile(
        kc: usize,
        a: *const f32,
        lda: usize,
        layout: Layout,
        b: *const f32,
        ldb: usize,
        half: usize,
        d: Dest,
        next: Next,
    ) {
        let rows_layout = layout == Layout::Rows;
        let mut fetch = next;
        for h in 0..NR / 16 {
            if 16 * h >= d.cols {
                break;
            }
            for (r0, n) in GROUPS {
                if r0 >= d.rows {
                    break;
                }
                // Rows r0 .. r0 + n of A, columns 16h .. 16h + 16 of B and C (C's part
                // written out: through `part`, its wrapping pointer, square 1024 ran 2–7% slower
                // in five interleaved pairs).
                let a0 = if rows_layout {
                    a.add(r0 * lda)
                } else {
                    a.add(r0)
                };
                let b0 = b.add(half * h);
                let sub = Dest {
                    c: d.c.add(r0 * d.ldc + 16 * h),
                    rows: (d.rows - r0).min(n),
                    cols: (d.cols - 16 * h).min(16),
                    ..d
                };
                let pf = !(fetch.a.is_null() && fetch.c.is_null() && fetch.lines == 0);
                match (n, rows_layout, pf) {
                    (5, true, false) => pass::<5, true, false>(kc, a0, lda, b0, ldb, sub, fetch),
                    (5, false, false) => pass::<5, false, false>(kc, a0, lda, b0, ldb, sub, fetch),
                    (5, true, true) => pass::<5, true, true>(kc, a0, lda, b0, ldb, sub, fetch),
                    (5, false, true) => pass::<5, false, true>(kc, a0, lda, b0, ldb, sub, fetch),
                    (_, true, _) => pass::<4, true, false>(kc, a0, lda, b0, ldb, sub, fetch),
                    (_, false, _) => pass::<4, false, false>(kc, a0, lda, b0, ldb, sub, fetch),
                }
                fetch = Next::NONE;
            }
        }
    }

    /// `R` rows by 16 columns of the tile over all of k; with `PF`, the prefetches of the next
    /// tile's A, B run and C interleaved with the first rows of k. (Its loop is `sweep`'s with
    /// the prefetches; the passes without them through `sweep` ran square 1024 at 31–33 ms
    /// against 27 here on Zen 3, interleaved twice: the loop stays written out.)
    #[inline(always)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn pass<const R: usize, const ROWS: bool, const PF: bool>(
        kc: usize,
        a: *const f32,
        lda: usize,
        b: *const f32,
        ldb: usize,
        d: Dest,
        next: Next,
    ) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        let fetch_a = PF && ROWS && !next.a.is_null();
        let fetch_c = PF && !next.c.is_null();
        // Each row's first element and the step along k, held in registers (computed from
        // `lda` in the loop, they were reloaded from the stack at every k).
        let mut rows = [a; R];
        for (i, row) in rows.iter_mut().enumerate() {
            *row = if ROWS { a.add(i * lda) } else { a.add(i) };
        }
        let step = if ROWS { 1 } else { lda };
        let mut r = 0;
        let mut bp = b;
        for p in 0..kc {
            if fetch_a {
                _mm_prefetch::<_MM_HINT_T0>(next.a.wrapping_add(r * lda + p) as *const i8);
                r = if r + 1 == MR { 0 } else { r + 1 };
            }
            if PF && p < next.lines {
                _mm_prefetch::<_MM_HINT_T1>(next.run.wrapping_add(p * 64) as *const i8);
            }
            if fetch_c && p < 2 * MR {
                let at = next.c.wrapping_add((p >> 1) * d.ldc + (p & 1) * 16);
                _mm_prefetch::<_MM_HINT_ET0>(at as *const i8);
            }
            // B 16 k ahead: a pass meets its half panel's lines (one per k) from L2 or L3
            // first, and the hardware did not fetch them ahead (perf: the first pass's B load
            // took a sixth of layer4.0 conv2's forward). With it, trainer_conv on Zen 3, four
            // interleaved rounds (the halves then interleaved, lines 128 bytes apart): layer4.0
            // conv2 forward 79–97 against 87–107 ms, backward data 83–91 against 98–106;
            // layer3.0 conv2 73–91 against 86–97 and 72–78 against 79–89; layer4.0
            // downsample backward data 74–79 against 84–95.
            _mm_prefetch::<_MM_HINT_T0>(bp.wrapping_add(16 * ldb) as *const i8);
            let bv = [_mm256_loadu_ps(bp), _mm256_loadu_ps(bp.add(8))];
            bp = bp.add(ldb);
            for (row, &at) in acc.iter_mut().zip(&rows) {
                let av = _mm256_broadcast_ss(&*at.add(p * step));
                row[0] = _mm256_fmadd_ps(av, bv[0], row[0]);
                row[1] = _mm256_fmadd_ps(av, bv[1], row[1]);
            }
        }
        d.store_avx2(&acc);
    }
}

#[cfg(target_arch = "x86_64")]
pub use avx2::tile as tile_avx2;
