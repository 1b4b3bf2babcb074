//! A product with a long reduction and a small C on one thread (a 1×1 convolution's filter
//! gradient, `dw = xᵀ·dy` over tens of thousands of pixels): A's panels of MR rows read where
//! its columns lie (A's rows contiguous: `xᵀ`), B's panels of NR columns where its rows lie
//! (`dy`) when they are close, else packed block by block. Packing such operands copies each
//! value once for a use or two, and the copy and the arithmetic do not overlap; here the tiles
//! of one block of k also prefetch the next block from memory while they run. The same sums in
//! the same order as `F32Gemm::gemm`'s blocked path (KC of k at a time, each block's sums added
//! to C), so the same bits.

use super::micro::{Layout, Next, MR, NR};
use super::{pack_a, pack_panel, tile, Kernel, Panel, KC};
use crate::cpu::bf16::Operand;
use crate::cpu::tiles::{line, scratch, Dest};
use std::cell::Cell;

/// The shortest reduction (k) taken this way.
pub const MIN_K: usize = 4096;

/// The largest C taken this way: a block of k's operands (A's MAX_M × KC, B's KC × MAX_N)
/// within L2. Past them the gemm crate was faster (trainer_conv, filter gradients of 1×1
/// layers: 128 × 512 330–356 GFLOP/s against 362, 1024 × 256 373–376 against 377–382; up to
/// 512 × 256 this way 10–25% faster).
const MAX_M: usize = 512;
const MAX_N: usize = 256;

/// Whether `long` takes this product: A's rows and B's columns contiguous, strides
/// non-negative, a reduction of at least `MIN_K`, a C of at most MAX_M × MAX_N.
pub fn takes(m: usize, n: usize, k: usize, a: Operand<f32>, b: Operand<f32>) -> bool {
    k >= MIN_K && m <= MAX_M && n <= MAX_N && a.rs == 1 && a.cs >= 0 && b.cs == 1 && b.rs >= 0
}

/// `c[m×n] (+)= a[m×k] · b[k×n]` on this thread, for operands `takes` accepts.
///
/// # Safety
/// As `F32Gemm::gemm`; `takes(m, n, k, a, b)`; the kernel's instructions present.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn gemm(
    kernel: Kernel,
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
    a: Operand<f32>,
    b: Operand<f32>,
) {
    if m == 0 || n == 0 {
        return;
    }
    let (mpanels, npanels) = (m.div_ceil(MR), n.div_ceil(NR));
    // B in place where its rows are at most 2·NR apart (a panel's rows then spread over every
    // L1 set); farther apart they crowd a few sets (1 KiB apart: 8 of 64, and a 256-row panel
    // misses L1 for every A panel) and B is packed block by block (layer1's 64 → 256 filter
    // gradient: 269–286 GFLOP/s in place, 348–373 packed, 295–303 on the gemm crate).
    let b_in_place = b.rs as usize <= 2 * NR;
    let mfull = m / MR * MR;
    let nfull = if b_in_place { n / NR * NR } else { 0 };
    // The edge panels (rows past m, columns past n) copied block by block, zero past the
    // matrix (the kernel reads whole panels), or all of B's.
    let blen = (npanels - nfull / NR) * NR * KC;
    let mut abuf = scratch(&EDGE, MR * KC + blen);
    let edge = line(&mut abuf, MR * KC + blen);
    let (aedge, bedge) = edge.split_at_mut(MR * KC);
    let kblocks = k.div_ceil(KC);
    for pb in 0..kblocks {
        let (pc, kc) = (pb * KC, KC.min(k - pb * KC));
        let at_a = |i: usize, p: usize| a.ptr.offset(i as isize + (pc + p) as isize * a.cs);
        let at_b = |p: usize, j: usize| b.ptr.offset((pc + p) as isize * b.rs + j as isize);
        if mfull < m {
            pack_a(a, mfull, m - mfull, pc, kc, aedge, false);
        }
        for (q, out) in bedge.chunks_mut(kc * NR).enumerate() {
            let j0 = nfull + q * NR;
            if j0 >= n {
                break;
            }
            pack_panel(b, j0, NR.min(n - j0), pc, kc, out, kernel);
        }
        // The next block's A and B, a share of their lines to each tile of this block.
        let ahead = if pb + 1 < kblocks {
            let (pn, kn) = ((pb + 1) * KC, KC.min(k - (pb + 1) * KC));
            [
                Run::span(a, 0..m, pn..pn + kn),
                Run::span(b, pn..pn + kn, 0..n),
            ]
        } else {
            [Run::NONE; 2]
        };
        let total = ahead[0].lines + ahead[1].lines;
        let per_tile = total.div_ceil(mpanels * npanels).min(kc);
        let mut fetched = 0;
        // B's panel in L1 across A's panels (A's from L2).
        for jp in 0..npanels {
            let bp = if jp * NR < nfull {
                Panel::Rows(at_b(0, jp * NR), b.rs as usize)
            } else {
                Panel::Packed(bedge[(jp - nfull / NR) * kc * NR..].as_ptr())
            };
            for ip in 0..mpanels {
                let (ap, lda) = if ip * MR < mfull {
                    (at_a(ip * MR, 0), a.cs as usize)
                } else {
                    (aedge.as_ptr(), MR)
                };
                let d = Dest {
                    c: c.add(ip * MR * ldc + jp * NR),
                    ldc,
                    rows: MR.min(m - ip * MR),
                    cols: NR.min(n - jp * NR),
                    overwrite: pc == 0 && !accumulate,
                };
                let next = Run::piece(ahead, fetched, per_tile);
                fetched += next.lines;
                tile(kernel, kc, ap, lda, Layout::Cols, bp, d, next);
            }
        }
    }
    EDGE.set(abuf);
}

thread_local! {
    /// This thread's copies of the edge panels.
    static EDGE: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// A run of cache lines to prefetch.
#[derive(Clone, Copy)]
struct Run {
    start: *const u8,
    lines: usize,
}

impl Run {
    const NONE: Run = Run {
        start: std::ptr::null(),
        lines: 0,
    };

    /// The lines that hold `rows × cols` of `op`, where they are one run of memory with no
    /// more gaps than values (a row-major block or its transpose, dense or nearly); else none.
    fn span(op: Operand<f32>, rows: std::ops::Range<usize>, cols: std::ops::Range<usize>) -> Run {
        if rows.is_empty() || cols.is_empty() || op.rs < 0 || op.cs < 0 {
            return Run::NONE;
        }
        let at = |i: usize, j: usize| i as isize * op.rs + j as isize * op.cs;
        let (first, last) = (at(rows.start, cols.start), at(rows.end - 1, cols.end - 1));
        if (last - first + 1) as usize > 2 * rows.len() * cols.len() {
            return Run::NONE;
        }
        let start = op.ptr.wrapping_offset(first) as usize;
        let end = op.ptr.wrapping_offset(last + 1) as usize;
        let start = start - start % 64;
        Run {
            start: start as *const u8,
            lines: (end - start).div_ceil(64),
        }
    }

    /// Up to `want` lines from line `from` of `runs` laid end to end, within one of them.
    fn piece(runs: [Run; 2], from: usize, want: usize) -> Next {
        let (run, at) = if from < runs[0].lines {
            (runs[0], from)
        } else {
            (runs[1], from - runs[0].lines)
        };
        Next {
            run: run.start.wrapping_add(at * 64),
            lines: want.min(run.lines.saturating_sub(at)),
            ..Next::NONE
        }
    }
}
