//! bf16 matrix products with f32 accumulation: `C (+)= A·B`, C in f32, A and B f32 or bf16 in
//! any strides, rounded to bf16 (nearest even) while they are packed. On AVX512_BF16 CPUs the
//! micro-kernel is `vdpbf16ps` (two bf16 products added into each f32 lane); elsewhere there is
//! no fast path, and `Bf16Gemm::detect` says so (the portable kernel is for tests).
//!
//! Blocking as GotoBLAS: for each block of NC columns and KC of k, B is packed once (panels of
//! NR columns, ~16 KiB each: one stays in L1 while A streams past it); A in blocks of MC rows
//! (~170 KiB, in L2), packed by whichever thread multiplies them. Threads take blocks of rows
//! (or, for short matrices, groups of column panels): every entry of C is summed by one thread
//! in one order, so results do not depend on the thread count.

#[cfg(target_arch = "x86_64")]
mod amx;
mod kernel;
mod micro;
mod pack;

pub use kernel::{Bf16GemmKernel, TOLERANCE};
pub use micro::{MR, NR};
#[cfg(target_arch = "x86_64")]
pub(crate) use pack::transpose16;
pub use pack::{round, round_lanes, round_slice, Source};

use super::tiles::{empty_product, line, line_start, pad, scratch, threads, Dest, SendPtr};
use pack::View;
use rayon::prelude::*;
use std::cell::Cell;

/// k per block (pairs of k: KC / 2).
pub const KC: usize = 256;
/// Rows of A per block.
pub const MC: usize = 24 * MR;
/// Columns of B per block.
pub const NC: usize = 1024;
/// The largest packed B (bytes) whose blocks of k a block of rows takes in turn (C kept in
/// cache); past it, the blocks of k are the outer loop (B's block kept in cache).
const ROWS_FIRST_MAX_B: usize = 256 << 10;
/// Rows of A per block on the AMX path (10 tiles of 32 rows: 160 KiB of A at KC).
#[cfg(target_arch = "x86_64")]
const MC_AMX: usize = 10 * amx::ROWS;

/// A matrix operand: element (i, j) at `ptr + i·rs + j·cs` (a transpose costs nothing).
#[derive(Clone, Copy, Debug)]
pub struct Operand<T> {
    pub ptr: *const T,
    pub rs: isize,
    pub cs: isize,
}

impl<T> Operand<T> {
    /// A row-major matrix with leading dimension `ld`.
    pub fn rows(ptr: *const T, ld: usize) -> Operand<T> {
        Operand {
            ptr,
            rs: ld as isize,
            cs: 1,
        }
    }
    /// The transpose of a row-major matrix with leading dimension `ld`.
    pub fn transposed(ptr: *const T, ld: usize) -> Operand<T> {
        Operand {
            ptr,
            rs: 1,
            cs: ld as isize,
        }
    }
}

// SAFETY: an operand is read only, and its users guarantee the memory outlives the product.
unsafe impl<T: Sync> Send for Operand<T> {}
unsafe impl<T: Sync> Sync for Operand<T> {}

/// Which kernels a product runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Path {
    /// AMX tiles (`tdpbf16ps`, 32 × 32 of C at a time), AVX-512 packing, and `vdpbf16ps` for
    /// the pairs of k past a multiple of 16.
    Amx,
    /// `vdpbf16ps` and AVX-512 packing.
    Avx512Bf16,
    /// Scalar, the same sums per lane: for tests and for checking, ~50× slower.
    Portable,
}

/// The right to multiply in bf16: `detect` gives the fast path only on a CPU that has it and
/// under a `ROOFLINE_ISA` cap that allows AVX-512.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Bf16Gemm {
    path: Path,
}

/// Why there is no fast bf16 product here.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unsupported {
    #[error("this CPU has no bf16 dot-product instruction (AVX512_BF16 on x86-64); bf16 runs on CPUs that have it")]
    NoInstruction,
    #[error(
        "ROOFLINE_ISA={0} caps the instruction set below AVX-512, which the bf16 product needs"
    )]
    Capped(String),
}

impl Bf16Gemm {
    /// The fast path, or why there is none: AMX where the CPU has it and the kernel grants
    /// the tiles (unless `ROOFLINE_AMX=0`), else `vdpbf16ps`.
    pub fn detect() -> Result<Bf16Gemm, Unsupported> {
        if !Bf16Gemm::cpu_has() {
            return Err(Unsupported::NoInstruction);
        }
        let cap = super::isa::Isa::current();
        if cap != super::isa::Isa::Avx512 {
            return Err(Unsupported::Capped(cap.name().into()));
        }
        let off = std::env::var("ROOFLINE_AMX").is_ok_and(|v| v == "0" || v == "off");
        Ok(Bf16Gemm {
            path: if !off && Bf16Gemm::amx_available() {
                Path::Amx
            } else {
                Path::Avx512Bf16
            },
        })
    }

    /// Whether this CPU has AMX-BF16 and the kernel lets this process use its tiles.
    pub fn amx_available() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            Bf16Gemm::cpu_has() && amx::available()
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Whether the CPU says it has AMX-TILE and AMX-BF16, whether or not the kernel grants
    /// the tiles (only Intel's server cores have them: the probe's peak rule asks).
    pub fn amx_in_cpuid() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            amx::in_cpuid()
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// Whether the CPU has AVX-512 F/BW/VL and AVX512_BF16 (whatever the cap).
    pub fn cpu_has() -> bool {
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            has!("avx512f") && has!("avx512bw") && has!("avx512vl") && has!("avx512bf16")
        }
        #[cfg(not(target_arch = "x86_64"))]
        false
    }

    /// The scalar kernels (any CPU).
    pub fn portable() -> Bf16Gemm {
        Bf16Gemm {
            path: Path::Portable,
        }
    }

    pub fn path(&self) -> Path {
        self.path
    }

    /// The same products on `vdpbf16ps` where these ran on AMX tiles (other paths unchanged):
    /// for callers and tests that need the vector kernels on any CPU with AVX512_BF16.
    pub fn without_amx(self) -> Bf16Gemm {
        Bf16Gemm {
            path: match self.path {
                Path::Amx => Path::Avx512Bf16,
                p => p,
            },
        }
    }

    /// `c[m×n] (+)= a[m×k] · b[k×n]` with a and b rounded to bf16, products and sums in f32;
    /// `c` row-major with leading dimension `ldc`, added to when `accumulate`. `parallel` spreads
    /// the work over the current rayon pool.
    ///
    /// # Safety
    /// The operands must cover the matrices their sizes and strides describe; `c` must not
    /// overlap them.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm<A: Source, B: Source>(
        &self,
        m: usize,
        n: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Operand<A>,
        b: Operand<B>,
        parallel: bool,
    ) {
        self.run(
            m,
            n,
            k,
            c,
            ldc,
            accumulate,
            a,
            Rhs::Pack(View::of_rhs(b)),
            parallel,
        )
    }

    /// `b[k×n]` rounded and packed once, for many products with the same right-hand side (a
    /// convolution's filter, multiplied by every block of patch rows: packing it for each block
    /// read the whole filter again for a few rows of output).
    ///
    /// # Safety
    /// `b` must cover the k×n matrix its strides describe.
    pub unsafe fn pack_b<B: Source>(
        &self,
        k: usize,
        n: usize,
        b: Operand<B>,
        parallel: bool,
    ) -> PackedB {
        let vector = self.path != Path::Portable;
        let vb = View::of_rhs(b);
        let mut offsets = Vec::new();
        let mut len = 0;
        for jc in (0..n).step_by(NC) {
            for pc in (0..k).step_by(KC) {
                offsets.push(len);
                len += NC.min(n - jc).div_ceil(NR) * KC.min(k - pc).div_ceil(2) * NR;
            }
        }
        // From a cache line on (`line`).
        let mut words = vec![0u32; len + pad::<u32>()];
        let base = line_start(&words);
        // Every panel on its own: (column, k, panel, its words).
        let mut panels = Vec::new();
        let mut rest = &mut words[base..base + len];
        for jc in (0..n).step_by(NC) {
            for pc in (0..k).step_by(KC) {
                let size = KC.min(k - pc).div_ceil(2) * NR;
                for q in 0..NC.min(n - jc).div_ceil(NR) {
                    let (out, tail) = rest.split_at_mut(size);
                    panels.push((jc + q * NR, pc, out));
                    rest = tail;
                }
            }
        }
        let pack = |(j0, pc, out): (usize, usize, &mut [u32])| {
            pack::panel(vb, j0, NR.min(n - j0), pc, KC.min(k - pc), NR, out, vector)
        };
        if parallel && rayon::current_num_threads() > 1 {
            panels.into_par_iter().for_each(pack);
        } else {
            panels.into_iter().for_each(pack);
        }
        PackedB {
            k,
            n,
            words,
            base,
            offsets,
        }
    }

    /// `c[m×n] (+)= a[m×k] · b` with `b` packed by `pack_b` (k and n are its own); the same
    /// bits as `gemm` with the unpacked `b`.
    ///
    /// # Safety
    /// As `gemm`.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn gemm_packed<A: Source>(
        &self,
        m: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Operand<A>,
        b: &PackedB,
        parallel: bool,
    ) {
        self.run::<A, f32>(m, b.n, b.k, c, ldc, accumulate, a, Rhs::Packed(b), parallel)
    }

    #[allow(clippy::too_many_arguments)]
    unsafe fn run<A: Source, B: Source>(
        &self,
        m: usize,
        n: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Operand<A>,
        rhs: Rhs<B>,
        parallel: bool,
    ) {
        if empty_product(m, n, k, c, ldc, accumulate) {
            return;
        }
        let vector = self.path != Path::Portable;
        let amx = self.path == Path::Amx;
        let va = View::of_lhs(a);
        // A with k contiguous is rounded row by row and the micro-kernel broadcasts from its
        // rows; otherwise A is packed in panels (a transposition of 32-bit pairs). AMX takes
        // rows whatever A's strides.
        let a_rows = amx || (vector && va.ks == 1);
        // Rows per micro-kernel call and per block of A.
        #[cfg(target_arch = "x86_64")]
        let (rm, mc_max) = if amx { (amx::ROWS, MC_AMX) } else { (MR, MC) };
        #[cfg(not(target_arch = "x86_64"))]
        let (rm, mc_max) = (MR, MC);
        let c = SendPtr(c);
        let threads = threads(parallel);
        // Buffers as large as this product's blocks need (a small product, called once per
        // image by the trainer, does not zero the 512 KiB a full block takes).
        let max_pairs = KC.min(k).div_ceil(2);
        let b_len = NC.min(n).next_multiple_of(NR) * max_pairs;
        let mut bpack = match rhs {
            Rhs::Pack(_) => scratch(&B_SCRATCH, b_len),
            Rhs::Packed(_) => Vec::new(),
        };
        // Blocks of rows of equal size (a multiple of MR, at most MC), as many as a multiple of
        // the threads, so that no thread waits on a short last block.
        let mut mblocks = m.div_ceil(mc_max);
        if threads > 1 {
            mblocks = mblocks.div_ceil(threads) * threads;
        }
        let mb = m.div_ceil(mblocks).next_multiple_of(rm).min(mc_max);
        let mblocks = m.div_ceil(mb);
        // On the AMX path, MR rows more: the vector kernel reads whole MR-row panels (the rows
        // past the block's are never stored).
        let a_len = (mb.next_multiple_of(rm) + if amx { MR } else { 0 }) * max_pairs;
        for (jb, jc) in (0..n).step_by(NC).enumerate() {
            let nc = NC.min(n - jc);
            let npanels = nc.div_ceil(NR);
            let groups = (threads / mblocks).clamp(1, npanels);
            let tasks = mblocks * groups;
            let spread = threads > 1 && tasks > 1;
            // Task t (a block of rows, a group of column panels) for the block of k at pc, with
            // B's packed block `bpack`.
            let block = |t: usize, pc: usize, bpack: &[u32], apack: &mut [u32]| {
                let kc = KC.min(k - pc);
                let pairs = kc.div_ceil(2);
                let overwrite = pc == 0 && !accumulate;
                let (ib, g) = (t / groups, t % groups);
                let i0 = ib * mb;
                let mc = mb.min(m - i0);
                let (j0, j1) = (g * npanels / groups, (g + 1) * npanels / groups);
                #[cfg(target_arch = "x86_64")]
                if amx {
                    if va.ks == 1 {
                        pack::rows(va, i0, mc, pc, kc, apack);
                    } else {
                        pack::rows_any(va, i0, mc, pc, kc, apack);
                    }
                    let c_at = |i: usize, j: usize| c.get().add((i0 + i) * ldc + jc + j);
                    let tiles = amx::Tiles::configure();
                    for jp in j0..j1 {
                        let bp = bpack[jp * pairs * NR..].as_ptr();
                        for i in (0..mc).step_by(amx::ROWS) {
                            let (rows, cols) = (amx::ROWS.min(mc - i), NR.min(nc - jp * NR));
                            amx_tile(
                                &tiles,
                                pairs,
                                &apack[i * pairs..],
                                bp,
                                c_at(i, jp * NR),
                                ldc,
                                rows,
                                cols,
                                overwrite,
                            );
                        }
                    }
                    return;
                }
                let mpanels = mc.div_ceil(MR);
                if a_rows {
                    #[cfg(target_arch = "x86_64")]
                    pack::rows(va, i0, mc, pc, kc, apack);
                } else {
                    let out = &mut apack[..mpanels * pairs * MR];
                    pack::panels(va, i0, mc, pc, kc, MR, out, vector);
                }
                for jp in j0..j1 {
                    let bp = bpack[jp * pairs * NR..].as_ptr();
                    for ip in 0..mpanels {
                        let d = Dest {
                            c: c.get().add((i0 + ip * MR) * ldc + jc + jp * NR),
                            ldc,
                            rows: MR.min(mc - ip * MR),
                            cols: NR.min(nc - jp * NR),
                            overwrite,
                        };
                        // Panel ip starts at the same word in both layouts.
                        let ap = apack[ip * pairs * MR..].as_ptr();
                        match (a_rows, self.path) {
                            #[cfg(target_arch = "x86_64")]
                            (true, _) => micro::tile_rows(pairs, ap, pairs, bp, d),
                            #[cfg(target_arch = "x86_64")]
                            (false, Path::Avx512Bf16) => micro::tile(pairs, ap, bp, d),
                            _ => micro::tile_portable(pairs, ap, bp, d),
                        }
                    }
                }
            };
            match rhs {
                // B packed beforehand and small: each task takes its rows through every block
                // of k in turn, its block of C staying in cache between them (with the blocks
                // of k outside, C went out to L3 and back for each block of k past the first:
                // a 1×1 layer's backward data, 25088 × 128 over k = 512, 590–600 → 694–708
                // GFLOP/s). Where B is larger than ROWS_FIRST_MAX_B, each block of B stays in
                // cache for all the rows instead. The same sums in the same order either way.
                Rhs::Packed(p) if k.div_ceil(2) * npanels * NR * 4 <= ROWS_FIRST_MAX_B => {
                    each_task(tasks, spread, a_len, |t, apack| {
                        for (pb, pc) in (0..k).step_by(KC).enumerate() {
                            block(t, pc, p.block(jb, pb, npanels), apack);
                        }
                    })
                }
                Rhs::Packed(p) => {
                    for (pb, pc) in (0..k).step_by(KC).enumerate() {
                        let bp = p.block(jb, pb, npanels);
                        each_task(tasks, spread, a_len, |t, apack| block(t, pc, bp, apack));
                    }
                }
                Rhs::Pack(vb) => {
                    for pc in (0..k).step_by(KC) {
                        let kc = KC.min(k - pc);
                        let pairs = kc.div_ceil(2);
                        let bl = line(&mut bpack, b_len);
                        let size = pairs * NR;
                        if threads > 1 {
                            // Contiguous groups of panels, one a thread, each packed in one
                            // pass (`pack::panels`).
                            let shares = threads.min(npanels);
                            let mut parts = Vec::with_capacity(shares);
                            let mut rest = &mut bl[..npanels * size];
                            for g in 0..shares {
                                let (q0, q1) = (g * npanels / shares, (g + 1) * npanels / shares);
                                let (part, tail) = rest.split_at_mut((q1 - q0) * size);
                                parts.push((q0, q1, part));
                                rest = tail;
                            }
                            parts.into_par_iter().for_each(|(q0, q1, out)| {
                                let cols = (q1 * NR).min(nc) - q0 * NR;
                                pack::panels(vb, jc + q0 * NR, cols, pc, kc, NR, out, vector)
                            });
                        } else {
                            let out = &mut bl[..npanels * size];
                            pack::panels(vb, jc, nc, pc, kc, NR, out, vector);
                        }
                        let bp: &[u32] = &bl[..npanels * size];
                        each_task(tasks, spread, a_len, |t, apack| block(t, pc, bp, apack));
                    }
                }
            }
        }
        if !bpack.is_empty() {
            B_SCRATCH.set(bpack);
        }
    }
}

thread_local! {
    /// This thread's packed blocks of A and of B, kept between products (allocated and zeroed
    /// for every product, they cost the trainer a few percent of a step in `memset` and page
    /// faults). Taken out while in use: a nested product gets buffers of its own.
    static A_SCRATCH: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
    static B_SCRATCH: Cell<Vec<u32>> = const { Cell::new(Vec::new()) };
}

/// Runs `f(t, buffer for A)` for every task `t < tasks`, over the pool when `spread`, each on
/// its thread's A buffer of `a_len` words (from a cache line on).
fn each_task(tasks: usize, spread: bool, a_len: usize, f: impl Fn(usize, &mut [u32]) + Sync) {
    let run = |t: usize| {
        let mut buf = scratch(&A_SCRATCH, a_len);
        f(t, line(&mut buf, a_len));
        A_SCRATCH.set(buf);
    };
    if spread {
        (0..tasks).into_par_iter().for_each(run);
    } else {
        (0..tasks).for_each(run);
    }
}

/// One AMX tile of C at `c` (`rows × cols` ≤ 32 × 32 of it): A's rows from `a` (`pairs`
/// words apart, 32 + MR rows readable), B one packed panel of `pairs` pairs. The pairs past a
/// multiple of 16 go through the vector kernel, after the tiles; an edge tile is computed
/// into a buffer and copied.
///
/// # Safety
/// The tiles configured on this thread; `c` covers `rows × cols` with leading dimension `ldc`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn amx_tile(
    tiles: &amx::Tiles,
    pairs: usize,
    a: &[u32],
    b: *const u32,
    c: *mut f32,
    ldc: usize,
    rows: usize,
    cols: usize,
    overwrite: bool,
) {
    debug_assert!(a.len() >= (amx::ROWS + MR) * pairs);
    let steps = pairs / amx::STEP;
    if steps > 0 {
        if rows == amx::ROWS && cols == NR {
            amx::tile(tiles, steps, a.as_ptr(), pairs, b, c, ldc, !overwrite);
        } else {
            let mut buf = [[0f32; NR]; amx::ROWS];
            amx::tile(
                tiles,
                steps,
                a.as_ptr(),
                pairs,
                b,
                buf.as_mut_ptr() as *mut f32,
                NR,
                false,
            );
            let d = Dest {
                c,
                ldc,
                rows,
                cols,
                overwrite,
            };
            d.store_portable(&buf);
        }
    }
    let done = steps * amx::STEP;
    if done < pairs {
        for i in (0..rows).step_by(MR) {
            let d = Dest {
                c: c.add(i * ldc),
                ldc,
                rows: MR.min(rows - i),
                cols,
                overwrite: overwrite && steps == 0,
            };
            micro::tile_rows(
                pairs - done,
                a[i * pairs + done..].as_ptr(),
                pairs,
                b.add(done * NR),
                d,
            );
        }
    }
}

/// A right-hand side rounded and packed once (`Bf16Gemm::pack_b`): blocks of NC columns by KC
/// of k, column-block major, each in panels of NR columns.
pub struct PackedB {
    k: usize,
    n: usize,
    words: Vec<u32>,
    /// Where the packed words start in `words` (the first 64-byte boundary).
    base: usize,
    /// Where block (column block, k block) starts, column-block major.
    offsets: Vec<usize>,
}

impl PackedB {
    /// Rows (k) and columns of the packed matrix.
    pub fn dims(&self) -> (usize, usize) {
        (self.k, self.n)
    }

    /// The packed block of column block `jb` and k block `pb`: its first `panels` panels.
    fn block(&self, jb: usize, pb: usize, panels: usize) -> &[u32] {
        let pairs = KC.min(self.k - pb * KC).div_ceil(2);
        let at = self.base + self.offsets[jb * self.k.div_ceil(KC) + pb];
        &self.words[at..at + panels * pairs * NR]
    }
}

/// Where a product's right-hand side comes from.
#[derive(Clone, Copy)]
enum Rhs<'a, B> {
    /// Packed block by block as the product runs.
    Pack(View<B>),
    /// Packed beforehand.
    Packed(&'a PackedB),
}

#[cfg(test)]
mod tests;
