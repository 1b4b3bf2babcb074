//! f32 matrix products on AVX-512 (`vfmadd231ps`): `C (+)= A·B`, all three in f32, A and B in
//! any strides. The gemm crate makes the same kind of sums, but it packs both operands for
//! every product: a convolution multiplies one filter by hundreds of blocks of ~50–200 patch
//! rows, and a filter larger than L2 (layer3 and layer4 of ResNet-50) was streamed from L3 and
//! packed again for each. Here the right-hand side can be packed once (`pack_b`) for all of
//! them, and a tall A with k contiguous (a 1×1 convolution's activations) is read where it is,
//! once, from memory.
//!
//! Blocking as GotoBLAS: B in panels of NR columns by KC of k (32 KiB), for NC columns at a
//! time; A in blocks of MC rows by KC. A's rows are read in place where its k is contiguous
//! (the micro-kernel broadcasts from 14 row streams, prefetching the next tile's as it goes),
//! copied where they would crowd one L1 set (`spread`), else packed into panels of MR rows. A
//! tile of A meets all of a block's column panels in turn (A in L1, B's panels from L2). A task
//! takes a block of rows (or, for short matrices, a group of column panels) through all of k,
//! so that its part of C stays in L2; every entry of C is summed by one thread in one order,
//! and results do not depend on the thread count.

mod long;
mod micro;
mod taps;

pub use micro::{MR, NR};
pub use taps::{taps_apply, Taps};

use super::bf16::Operand;
use super::tiles::{empty_product, grow, line, line_start, pad, scratch, threads, Dest, SendPtr};
use micro::Layout;
use rayon::prelude::*;
use std::cell::Cell;

/// k per block.
pub const KC: usize = 256;
/// Rows of A per block.
pub const MC: usize = 12 * MR;
/// Columns of B per block.
pub const NC: usize = 1024;

/// The right to multiply on this path: `detect` gives the widest kernel the CPU has (AVX-512,
/// else AVX2 with FMA) that `ROOFLINE_ISA` does not cap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct F32Gemm {
    kernel: Kernel,
}

/// The micro-kernel a product runs on (one sum order, so one set of bits, on all three).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) enum Kernel {
    /// 28 accumulators of 16 lanes; AVX-512 packing.
    Avx512,
    /// The tile in six passes of 8 or 10 accumulators of 8 lanes (`micro::tile_avx2`); A
    /// packed as for the portable kernel, B's panels in halves of 16 columns (`pack_panel`).
    Avx2,
    /// Scalar.
    Portable,
}

impl F32Gemm {
    /// The widest kernel this CPU has under the `ROOFLINE_ISA` cap: AVX-512 F, else AVX2 with
    /// FMA.
    pub fn detect() -> Option<F32Gemm> {
        #[cfg(target_arch = "x86_64")]
        {
            use super::isa::Isa;
            let cap = Isa::current();
            if std::arch::is_x86_feature_detected!("avx512f") && cap == Isa::Avx512 {
                return Some(F32Gemm {
                    kernel: Kernel::Avx512,
                });
            }
            if cap >= Isa::Avx2 {
                return F32Gemm::avx2();
            }
        }
        None
    }

    /// The AVX2 kernel where the CPU has AVX2 and FMA, whatever the cap and wider sets: for
    /// tests and benches that hold it against the others.
    pub fn avx2() -> Option<F32Gemm> {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma")
        {
            return Some(F32Gemm {
                kernel: Kernel::Avx2,
            });
        }
        None
    }

    /// The scalar kernels (any CPU; the same bits as the vector ones): for tests.
    pub fn portable() -> F32Gemm {
        F32Gemm {
            kernel: Kernel::Portable,
        }
    }

    /// Whether this is the AVX-512 kernel (and its packers). The products that read a tall A
    /// in place or reduce over a long k beat the gemm crate there only: on Zen 3's AVX2
    /// (`place` f32, interleaved with `ROOFLINE_F32_GEMM=crate`) the 1×1 layers ran 10–37 ms a
    /// step slower on this kernel, while the products with a large packed filter ran faster
    /// (layer4.0 conv2 276 against 447 ms a step, its projection 228 against 287). Layer by
    /// layer (`trainer_conv`, Zen 3): in place, the AVX2 kernel won layer1's 1×1 products (k =
    /// 64: forward and backward data 5–20% faster) and lost most of layers 2–4's (up to 30%
    /// slower: layer2.1 conv1 forward 36–38 against 30 ms), its long reductions lost layer1's
    /// filter gradients (up to 15%); a KC of 128 for it changed none of these past the noise.
    /// With B packed in halves (`pack_panel`), on one thread (best of three, interleaved) it
    /// matched or beat the crate on layers 3–4's (layer3.0 conv1 forward 82.7 against 85.7
    /// ms, backward data 83.6 against 94.7; layer4.0 conv1 83.9 against 86.2, 87.6 against
    /// 87.1) and lost layer2.1 conv1's forward (43.6 against 39.1); on both cores the host's
    /// noise (one binary's best of three 41–66 ms) hid the difference: the routing stays.
    pub fn is_avx512(&self) -> bool {
        self.kernel == Kernel::Avx512
    }

    /// `c[m×n] (+)= a[m×k] · b[k×n]`, `c` row-major with leading dimension `ldc`, added to
    /// when `accumulate`. `parallel` spreads the work over the current rayon pool.
    ///
    /// # Safety
    /// The operands must cover the matrices their sizes and strides describe; `c` must not
    /// overlap them.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm(
        &self,
        m: usize,
        n: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Operand<f32>,
        b: Operand<f32>,
        parallel: bool,
    ) {
        if !parallel && long::takes(m, n, k, a, b) {
            return long::gemm(self.kernel, m, n, k, c, ldc, accumulate, a, b);
        }
        self.run(m, n, k, c, ldc, accumulate, a, Rhs::Pack(b), parallel)
    }

    /// Whether a product on one thread (`gemm` with `parallel` false) takes the path for long
    /// reductions with a small C (`long`: A's rows contiguous, both operands read in place,
    /// the next block of k prefetched): a 1×1 convolution's filter gradient.
    pub fn long_reduction(m: usize, n: usize, k: usize, a: Operand<f32>, b: Operand<f32>) -> bool {
        long::takes(m, n, k, a, b)
    }

    /// `b[k×n]` packed once, for many products with the same right-hand side.
    ///
    /// # Safety
    /// `b` must cover the k×n matrix its strides describe.
    pub unsafe fn pack_b(&self, k: usize, n: usize, b: Operand<f32>, parallel: bool) -> PackedF32 {
        let len = n.next_multiple_of(NR) * k;
        let mut values = vec![0f32; len + pad::<f32>()];
        // From a cache line on (`line`).
        let base = line_start(&values);
        let parallel = parallel && rayon::current_num_threads() > 1;
        for (jc, out) in (0..n)
            .step_by(NC)
            .zip(values[base..base + len].chunks_mut(NC * k))
        {
            pack_block(b, jc, NC.min(n - jc), k, out, self.kernel, parallel);
        }
        PackedF32 { k, n, values, base }
    }

    /// `c[m×n] (+)= a[m×k] · b` with `b` from `pack_b` (k and n are its own); the same bits as
    /// `gemm` with the unpacked `b`.
    ///
    /// # Safety
    /// As `gemm`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_packed(
        &self,
        m: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Operand<f32>,
        b: &PackedF32,
        parallel: bool,
    ) {
        self.run(m, b.n, b.k, c, ldc, accumulate, a, Rhs::Packed(b), parallel)
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn run(
        &self,
        m: usize,
        n: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Operand<f32>,
        rhs: Rhs,
        parallel: bool,
    ) {
        if empty_product(m, n, k, c, ldc, accumulate) {
            return;
        }
        let kernel = self.kernel;
        // Where A's k is contiguous, the kernel broadcasts from its rows where they are (an
        // edge panel's copied, `row_ld(kc)` apart; all copied where the rows do not `spread`
        // over L1); else A's blocks are packed in panels of MR rows, k-major.
        let rows_src = a.cs == 1;
        let in_place = rows_src && a.rs >= 0 && spread(a.rs as usize);
        let c = SendPtr(c);
        let threads = threads(parallel);
        let kblocks = k.div_ceil(KC);
        let mut bpack = match rhs {
            Rhs::Pack(_) => B_SCRATCH.take(),
            Rhs::Packed(_) => Vec::new(),
        };
        for jc in (0..n).step_by(NC) {
            let nc = NC.min(n - jc);
            let npanels = nc.div_ceil(NR);
            // Blocks of rows of equal size (a multiple of MR, at most MC), as many as a
            // multiple of the threads, so that no thread waits on a short last block. A
            // task runs all of k for its block (its tile of C stays in L2).
            let mut mblocks = m.div_ceil(MC);
            if threads > 1 {
                mblocks = mblocks.div_ceil(threads) * threads;
            }
            let mb = m.div_ceil(mblocks).next_multiple_of(MR).min(MC);
            let mblocks = m.div_ceil(mb);
            let groups = (threads / mblocks).clamp(1, npanels);
            let tasks = mblocks * groups;
            let par = threads > 1 && tasks > 1;
            // Task t over k blocks `pbs`, B's blocks from `b` (the first of `pbs` at its
            // start, each `KC · npanels · NR` values after the one before).
            let task = |t: usize, apack: &mut [f32], pbs: std::ops::Range<usize>, b: &[f32]| {
                let (ib, g) = (t / groups, t % groups);
                let i0 = ib * mb;
                let mc = mb.min(m - i0);
                let (j0, j1) = (g * npanels / groups, (g + 1) * npanels / groups);
                let mpanels = mc.div_ceil(MR);
                for pb in pbs.clone() {
                    let (pc, kc) = (pb * KC, KC.min(k - pb * KC));
                    let bblock = &b[(pb - pbs.start) * KC * npanels * NR..];
                    // A's full panels in place where its rows are (`in_place`); an edge
                    // panel's rows copied (the kernel reads all MR); else all packed.
                    let whole = if in_place { mc / MR * MR } else { 0 };
                    if whole < mc {
                        pack_a(a, i0 + whole, mc - whole, pc, kc, apack, rows_src);
                    }
                    let apack = &*apack;
                    let a_tile = |ip: usize| -> (*const f32, Layout, usize) {
                        if ip * MR < whole {
                            let at = (i0 + ip * MR) as isize * a.rs + pc as isize;
                            (a.ptr.offset(at), Layout::Rows, a.rs as usize)
                        } else if rows_src {
                            let at = (ip * MR - whole) * row_ld(kc);
                            (apack[at..].as_ptr(), Layout::Rows, row_ld(kc))
                        } else {
                            (apack[ip * MR * kc..].as_ptr(), Layout::Cols, MR)
                        }
                    };
                    let c_at = |ip: usize, jp: usize| {
                        c.get().add((i0 + ip * MR) * ldc + jc + jp * NR) as *const f32
                    };
                    // A row panel at a time across the block's column panels: in place, A is
                    // read from memory once, its tile in L1 for all of them, B's panels from L2.
                    for ip in 0..mpanels {
                        let (ap, lay, ld) = a_tile(ip);
                        for jp in j0..j1 {
                            let d = Dest {
                                c: c.get().add((i0 + ip * MR) * ldc + jc + jp * NR),
                                ldc,
                                rows: MR.min(mc - ip * MR),
                                cols: NR.min(nc - jp * NR),
                                overwrite: pc == 0 && !accumulate,
                            };
                            // The next tile: this row panel's next column panel, or the next
                            // row panel's first (whose A, in place, is fetched meanwhile).
                            let last = jp + 1 == j1;
                            let next = micro::Next {
                                a: if last && (ip + 1) * MR < whole {
                                    a_tile(ip + 1).0
                                } else {
                                    std::ptr::null()
                                },
                                c: match (last, ip + 1 < mpanels) {
                                    (false, _) => c_at(ip, jp + 1),
                                    (true, true) => c_at(ip + 1, j0),
                                    (true, false) => std::ptr::null(),
                                },
                                ..micro::Next::NONE
                            };
                            // Rows past the block's (an edge tile's) hold stale values,
                            // and their results are not stored.
                            let bp = bblock[jp * kc * NR..].as_ptr();
                            tile(kernel, kc, ap, ld, lay, Panel::Packed(bp), d, next);
                        }
                    }
                }
            };
            let a_len = mb.next_multiple_of(MR) * row_ld(KC.min(k));
            let block_len = npanels * NR * KC.min(k);
            match rhs {
                Rhs::Packed(p) => {
                    // B's columns jc .. jc + nc, all of k, as `pack_block` lays them out.
                    let b = &p.values[p.base + jc * k..p.base + jc * k + npanels * NR * k];
                    let run_task = |t: usize| {
                        let mut buf = scratch(&A_SCRATCH, a_len);
                        task(t, line(&mut buf, a_len), 0..kblocks, b);
                        A_SCRATCH.set(buf);
                    };
                    if par {
                        (0..tasks).into_par_iter().for_each(run_task);
                    } else {
                        (0..tasks).for_each(run_task);
                    }
                }
                Rhs::Pack(b) if !par => {
                    // On one thread, B's blocks are packed as they are needed, each used by
                    // every task in turn (a long reduction, all of B packed first, would go
                    // out of cache and back).
                    grow(&mut bpack, block_len);
                    let bpack = line(&mut bpack, block_len);
                    let mut abuf = scratch(&A_SCRATCH, a_len);
                    let buf = line(&mut abuf, a_len);
                    for pb in 0..kblocks {
                        let (pc, kc) = (pb * KC, KC.min(k - pb * KC));
                        for (q, out) in bpack[..npanels * kc * NR].chunks_mut(kc * NR).enumerate() {
                            pack_panel(b, jc + q * NR, NR.min(nc - q * NR), pc, kc, out, kernel);
                        }
                        for t in 0..tasks {
                            task(t, buf, pb..pb + 1, bpack);
                        }
                    }
                    A_SCRATCH.set(abuf);
                }
                Rhs::Pack(b) => {
                    let len = npanels * NR * k;
                    grow(&mut bpack, len);
                    let out = line(&mut bpack, len);
                    pack_block(b, jc, nc, k, out, kernel, true);
                    let b = &*out;
                    (0..tasks).into_par_iter().for_each(|t| {
                        let mut buf = scratch(&A_SCRATCH, a_len);
                        task(t, line(&mut buf, a_len), 0..kblocks, b);
                        A_SCRATCH.set(buf);
                    });
                }
            }
        }
        if !bpack.is_empty() {
            B_SCRATCH.set(bpack);
        }
    }
}

/// Where a tile's `kc × NR` of B are.
#[derive(Clone, Copy)]
pub(super) enum Panel {
    /// A panel from `pack_panel` for this kernel.
    Packed(*const f32),
    /// In place: row p at `p·ldb`, its NR values contiguous.
    Rows(*const f32, usize),
}

/// One tile on `kernel` (the vector kernels prefetching `next`).
///
/// # Safety
/// As `micro::tile_portable`; a packed panel packed for `kernel`; the kernel's instructions
/// present (`F32Gemm::detect`).
#[allow(clippy::too_many_arguments)]
unsafe fn tile(
    kernel: Kernel,
    kc: usize,
    a: *const f32,
    lda: usize,
    layout: Layout,
    b: Panel,
    d: Dest,
    next: micro::Next,
) {
    // B's rows `ldb` apart; for the AVX2 kernel, its columns 16 .. 32 at `half` (the next
    // strip of a packed panel).
    let (bp, ldb, half) = match b {
        Panel::Packed(bp) => (bp, strip(kernel), strip(kernel) * kc),
        Panel::Rows(bp, ldb) => (bp, ldb, 16),
    };
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx512 => micro::tile(kc, a, lda, layout, bp, ldb, d, next),
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => micro::tile_avx2(kc, a, lda, layout, bp, ldb, half, d, next),
        _ => {
            let _ = (next, half);
            micro::tile_portable(kc, a, lda, layout, bp, ldb, d)
        }
    }
}

/// Rows `i0 .. i0 + mc` and k `p0 .. p0 + kc` of `a` packed into `out`: with `rows_src` (A's
/// k contiguous) as rows `row_ld(kc)` apart; else in panels of MR rows, element (i, p) of
/// panel q at `q·kc·MR + p·MR + i`, rows past the block zero.
///
/// # Safety
/// `a` covers those rows and k.
pub(super) unsafe fn pack_a(
    a: Operand<f32>,
    i0: usize,
    mc: usize,
    p0: usize,
    kc: usize,
    out: &mut [f32],
    rows_src: bool,
) {
    if rows_src {
        let ld = row_ld(kc);
        for i in 0..mc {
            let src = a.ptr.offset((i0 + i) as isize * a.rs + p0 as isize);
            std::ptr::copy_nonoverlapping(src, out[i * ld..i * ld + kc].as_mut_ptr(), kc);
        }
        return;
    }
    // k outermost: with A's rows contiguous (a transposed row-major matrix), each k reads one
    // run of memory (panel by panel, it read a new cache line per k and waited on memory).
    let panels = mc.div_ceil(MR);
    for p in 0..kc {
        for q in 0..panels {
            let (r0, rows) = (i0 + q * MR, MR.min(mc - q * MR));
            let dst = &mut out[q * kc * MR + p * MR..q * kc * MR + (p + 1) * MR];
            let at = |i: usize| {
                a.ptr
                    .offset((r0 + i) as isize * a.rs + (p0 + p) as isize * a.cs)
            };
            if a.rs == 1 && rows == MR {
                // A fixed-size copy: moves in registers, not a call to memcpy.
                dst.copy_from_slice(&*(at(0) as *const [f32; MR]));
                continue;
            }
            for (i, d) in dst.iter_mut().enumerate() {
                *d = if i < rows { *at(i) } else { 0.0 };
            }
        }
    }
}

/// Whether the micro-kernel may broadcast from rows `ld` floats apart where they are: no more
/// than half of a tile's `MR` rows fall in one set of a 64-set L1 (x86's L1 data caches: 32 KiB
/// 8-way, 48 KiB 12-way). A multiple of 1024 floats puts all 14 in one set (4 KiB apart: a
/// 1024-channel layer's rows), and lines of A are evicted before their 16 k are read (layer3's
/// 1×1 from 1024 channels, trainer_conv: 428–431 GFLOP/s in place, 450–457 copied; from 512
/// channels, 7 rows a set, 491 in place, 439–447 copied).
fn spread(ld: usize) -> bool {
    const SETS: usize = 64;
    let mut count = [0u8; SETS];
    (0..MR).all(|i| {
        let set = (i * ld * 4 / 64) % SETS;
        count[set] += 1;
        count[set] as usize <= MR / 2
    })
}

/// The distance between packed rows of `kc` k: a line more than `kc`, so that a tile's rows
/// fall in different L1 sets (`spread`).
fn row_ld(kc: usize) -> usize {
    kc + 16
}

/// Columns `jc .. jc + nc` (≤ NC) of `b`, all of its `k`, packed into `out`: block pb of k
/// (KC of it, fewer in the last) at `pb·KC·P·NR` for P panels, each panel of the block `kc·NR`
/// values (`pack_panel`).
///
/// # Safety
/// As `pack_panel`.
unsafe fn pack_block(
    b: Operand<f32>,
    jc: usize,
    nc: usize,
    k: usize,
    out: &mut [f32],
    kernel: Kernel,
    parallel: bool,
) {
    let npanels = nc.div_ceil(NR);
    let mut panels = Vec::with_capacity(npanels * k.div_ceil(KC));
    let mut rest = out;
    for pc in (0..k).step_by(KC) {
        let kc = KC.min(k - pc);
        for q in 0..npanels {
            let (panel, tail) = rest.split_at_mut(kc * NR);
            panels.push((jc + q * NR, NR.min(nc - q * NR), pc, kc, panel));
            rest = tail;
        }
    }
    let pack = |(j0, cols, pc, kc, panel): (usize, usize, usize, usize, &mut [f32])| {
        pack_panel(b, j0, cols, pc, kc, panel, kernel)
    };
    if parallel {
        panels.into_par_iter().for_each(pack);
    } else {
        panels.into_iter().for_each(pack);
    }
}

/// The columns a panel packed for `kernel` keeps together, row after row: all NR, or for the
/// AVX2 kernel 16 (the columns one of its passes reads).
fn strip(kernel: Kernel) -> usize {
    if kernel == Kernel::Avx2 {
        16
    } else {
        NR
    }
}

/// Columns `j0 .. j0 + cols` (≤ NR) and k `p0 .. p0 + kc` of `b` as a panel for `kernel`:
/// `kc · NR` values, columns past `cols` zero, in strips of `w = strip(kernel)` columns:
/// element (p, j) at `(j / w)·w·kc + p·w + j % w` (`p·NR + j` where w is NR). (Each of
/// the AVX2 kernel's passes reads one half: as rows of 32, a half's 256 k took one line in
/// two, all in half of L1's sets, which they filled (Zen 3: 32 KiB, 8 ways), and A's rows
/// beside them evicted them between passes. In halves, trainer_conv on one thread, best of three interleaved:
/// layer4.0 conv2 forward 99.8 against 112 ms, backward data 99.9 against 109.6; layer4.0
/// downsample 89.0 against 93.2 and 93.4 against 102.4; layer3.0 conv1 in place 84.2 against
/// 87.5 and 80.4 against 82.8. On both cores, noisier: 6 of those layers faster, layer2.0's
/// downsample forward slower, 52.6 against 48.8.)
///
/// # Safety
/// `b` covers those columns and k; `kernel`'s instructions present.
pub(super) unsafe fn pack_panel(
    b: Operand<f32>,
    j0: usize,
    cols: usize,
    p0: usize,
    kc: usize,
    out: &mut [f32],
    kernel: Kernel,
) {
    let at = |p: usize, j: usize| {
        b.ptr
            .offset((p0 + p) as isize * b.rs + (j0 + j) as isize * b.cs)
    };
    let w = strip(kernel);
    let to = |p: usize, j: usize| j / w * w * kc + p * w + j % w;
    if b.cs == 1 {
        for (s, part) in out[..kc * NR].chunks_exact_mut(w * kc).enumerate() {
            let (first, n) = (w * s, cols.saturating_sub(w * s).min(w));
            for (p, dst) in part.chunks_exact_mut(w).enumerate() {
                if n > 0 {
                    std::ptr::copy_nonoverlapping(at(p, first), dst.as_mut_ptr(), n);
                }
                dst[n..].fill(0.0);
            }
        }
        return;
    }
    // Where Bᵀ is row-major: 16 × 16 blocks transposed in registers, the rest one by one.
    let vector = kernel == Kernel::Avx512;
    let fast = cfg!(target_arch = "x86_64") && vector && b.rs == 1 && b.cs > 0 && cols == NR;
    let p_done = if fast { kc / 16 * 16 } else { 0 };
    #[cfg(target_arch = "x86_64")]
    {
        for p in (0..p_done).step_by(16) {
            for j in (0..NR).step_by(16) {
                super::bf16::transpose16(
                    at(p, j) as *const u32,
                    b.cs as usize,
                    out[p * NR + j..].as_mut_ptr() as *mut u32,
                    NR,
                );
            }
        }
    }
    for p in p_done..kc {
        for j in 0..NR {
            out[to(p, j)] = if j < cols { *at(p, j) } else { 0.0 };
        }
    }
}

thread_local! {
    /// This thread's packed blocks of A and of B, kept between products. Taken out while in
    /// use: a nested product gets buffers of its own.
    static A_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
    static B_SCRATCH: Cell<Vec<f32>> = const { Cell::new(Vec::new()) };
}

/// A right-hand side packed once (`F32Gemm::pack_b`).
pub struct PackedF32 {
    k: usize,
    n: usize,
    /// Column block jc (NC of n) at `base + jc·k`, as `pack_block` lays it out.
    values: Vec<f32>,
    /// Where the packed values start in `values` (the first cache line, `line`).
    base: usize,
}

impl PackedF32 {
    /// Rows (k) and columns of the packed matrix.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }
}

/// Where a product's right-hand side comes from.
#[derive(Clone, Copy)]
enum Rhs<'a> {
    /// Packed block by block as the product runs.
    Pack(Operand<f32>),
    /// Packed beforehand.
    Packed(&'a PackedF32),
}

#[cfg(test)]
mod tests;
