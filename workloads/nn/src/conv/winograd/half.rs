//! 3×3 stride-1 convolutions of f32 layers with bf16 products by Winograd's F(2×2, 3×3): each
//! 2×2 tile of output is `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` for the 4×4 input block `d` around it, so
//! the products over channels become 16 GEMMs (one per point ξ of the 4×4 transform domain):
//! 16 multiplies per 4 outputs and channel pair where the direct sum takes 36. The transforms
//! run in f32; the products round the transformed tiles and filter to bf16 as they pack them
//! and sum in f32, as every bf16 product does. F(4×4, 3×3), which f32 layers use, rounded so
//! loses ten times bf16's accuracy; F(2×2, 3×3)'s constants (1 and 1/2) cost about twice the
//! error of direct sums of the same rounded operands (1.8–2.0× on uniform noise, pass by pass:
//! the tests bound each; `scripts/winograd-bf16-error.py` measured 1.2–1.5× on its data).
//! Only where it is faster than the im2col products: `pays_with` (not on AMX), `applies_to`,
//! `filter_applies_to`.
//!
//! The passes go in blocks of tiles whose transformed operands (f32) stay in cache between the
//! transforms and the products; the transformed filter is packed once per call (`U[ξ]` for the
//! forward pass, `U[ξ]ᵀ` for the input gradient). Each output tile is one block's and each input
//! gradient is added up by one task (whole images) in tile order, whatever the threads; the
//! filter gradient sums one part of the batch per thread, in order (as the im2col passes do).

use super::transforms::F2;
use super::{filter_gradient_transform, filter_transform, with_buffers, ConvShape, Grid, Points};
use crate::tensor::{fill_uninit, ordered_sum_into, partitions, round_bf16, simd, Float, Lhs};
use half::bf16;
use rayon::prelude::*;
use roofline_kernels::cpu::bf16::{Bf16Gemm, Operand, PackedB, Path, MR};
use std::mem::MaybeUninit;

/// Points of the transform domain (4 × 4).
const XI: usize = 16;

/// The stride between tiles in a block's transformed operands, for `width` channels: a tile's
/// 16 points together (`Points::Interleaved`) and one vector more, so that neighbouring tiles'
/// rows do not fall 4 KiB apart (64 channels: a block's rows and a micro-kernel's rows of C
/// would all share a set of L1).
fn row_len(width: usize) -> usize {
    XI * width + 16
}

/// Whether F(2×2, 3×3) can pay with products on `path`: on `vdpbf16ps` (and the portable
/// kernels), yes; on AMX tiles, no: there the products run faster than `vdpbf16ps` can at all
/// (`cpu/gemm/bf16/t1` 806 GFLOP/s on one Emerald Rapids core, 2.4 times `vdpbf16ps`'s peak at
/// its 2.6 GHz), so the f32 transforms cost more than the multiplies saved. On 16 such cores
/// (`place --workload resnet50 --batch 32 --precision bf16`, interleaved, ms a step), with
/// AMX: F(2×2) 971–1026 against im2col's 920–955 (layer3 conv2 131–147 against 103–113); with
/// `ROOFLINE_AMX=0`: F(2×2) 1545–1572 against 1746–1783 (layer3 conv2 192–206 against 257–265).
pub fn pays_with(path: Path) -> bool {
    path != Path::Amx
}

/// Whether the forward and input-gradient passes of a 3×3 stride-1 layer with bf16 products
/// and `h × w` images go through F(2×2, 3×3): where its grid of 2×2 tiles covers the images
/// with at most 1/8 more outputs than they have. ResNet-50's 56², 28² and 14² images: yes;
/// layer4's 7², padded to 8² (31% more), no: every pass ran slower there than on im2col
/// (trainer_conv, layer4.1 conv2, twice: forward 713–748 against 875–910 GFLOP/s, input
/// gradient 700–747 against 870–879, filter gradient 596–603 against 638–677).
pub fn applies_to(h: usize, w: usize) -> bool {
    let covered = h.next_multiple_of(2) * w.next_multiple_of(2);
    8 * covered <= 9 * h * w
}

/// `applies_to` for the filter gradient, which also takes at least 128 channels in and out:
/// layer1's 64 × 64 products per point pack more than they multiply (trainer_conv, layer1.0
/// conv2, twice: 500–552 against im2col's 584–594 GFLOP/s; layer2's 128 channels 876 against
/// 782, layer3's 256 950 against 880).
pub fn filter_applies_to(h: usize, w: usize, c: usize, k: usize) -> bool {
    applies_to(h, w) && c.min(k) >= 128
}

/// Bytes of a block's transformed operands (input and output side together, f32) in the
/// forward and backward-data passes.
const BLOCK_BYTES: usize = 1 << 20;

/// Bytes of a block's transformed operands in the filter gradient: its products reduce over
/// the block's tiles into the whole `16 · c × k` gradient, so a block is long.
const FILTER_BLOCK_BYTES: usize = 8 << 20;

/// Tiles per block of the forward and backward-data passes: a multiple of the micro-kernel's
/// rows, two of them at least.
fn block_tiles(c: usize, k: usize) -> usize {
    (BLOCK_BYTES / (XI * (c + k) * 4)).max(2 * MR) / MR * MR
}

/// Tiles per block of the filter gradient: a multiple of 32 (the reduction AMX takes at a
/// time), 256 at least.
fn filter_block_tiles(c: usize, k: usize) -> usize {
    (FILTER_BLOCK_BYTES / (XI * (c + k) * 4)).max(256) / 32 * 32
}

/// The block size that splits `tiles` into as many blocks as blocks of `tb` would, as evenly as
/// one size can (a short last block multiplied the whole transformed filter for a few rows).
fn even(tiles: usize, tb: usize) -> usize {
    tiles.div_ceil(tiles.div_ceil(tb.max(1)).max(1)).max(1)
}

/// The 2×2 tiles of a Winograd shape.
fn grid(sh: &ConvShape) -> Grid {
    assert!(
        super::applies(sh),
        "not a Winograd shape: {}",
        sh.describe()
    );
    Grid::new(sh, 2)
}

/// `x` as a slice of `B`, which `A` is (the layers this module serves are f32 ones).
fn same<A: 'static, B: 'static>(x: &[A]) -> &[B] {
    assert_eq!(
        std::any::TypeId::of::<A>(),
        std::any::TypeId::of::<B>(),
        "bf16 products serve f32 layers"
    );
    // SAFETY: A is B.
    unsafe { &*(x as *const [A] as *const [B]) }
}

/// `same` for a mutable slice.
fn same_mut<A: 'static, B: 'static>(x: &mut [A]) -> &mut [B] {
    assert_eq!(
        std::any::TypeId::of::<A>(),
        std::any::TypeId::of::<B>(),
        "bf16 products serve f32 layers"
    );
    // SAFETY: A is B.
    unsafe { &mut *(x as *mut [A] as *mut [B]) }
}

/// `f(x)` with `x` in bf16: as it is where it is kept so, else rounded first (to the operand
/// every bf16 product rounds it to, so that a kept input and its f32 value give the same
/// bits; the layers keep these inputs in bf16, and the trainer never pays this pass).
fn in_bf16<T: Float, S: Lhs<T>, R>(x: &[S], f: impl FnOnce(&[bf16]) -> R) -> R {
    use std::any::TypeId;
    if TypeId::of::<S>() == TypeId::of::<bf16>() {
        // SAFETY: S is bf16.
        return f(unsafe { &*(x as *const [S] as *const [bf16]) });
    }
    assert_eq!(TypeId::of::<S>(), TypeId::of::<T>(), "stored in T or bf16");
    // SAFETY: S is T.
    let x = unsafe { &*(x as *const [S] as *const [T]) };
    let mut h = Vec::with_capacity(x.len());
    round_bf16(x, &mut h.spare_capacity_mut()[..x.len()]);
    // SAFETY: round_bf16 wrote every element.
    unsafe { h.set_len(x.len()) };
    f(&h)
}

/// The transformed filter `U[ξ]` (`c × k`, f32), packed for the bf16 products point by point:
/// as it is (`k` columns) or transposed (`c` columns).
fn packed_filter(
    gemm: &Bf16Gemm,
    w: &[f32],
    (c, k): (usize, usize),
    transposed: bool,
) -> Vec<PackedB> {
    // In this thread's scratch (every element written: no zeroing, no fresh pages).
    <f32 as Float>::with_scratch(XI * c * k, |u| {
        filter_transform::<f32, F2, 4, 2>(w, c, k, u, Points::Interleaved);
        let u = &*u;
        (0..XI)
            .into_par_iter()
            .map(|xi| {
                let p = u[xi * k..].as_ptr();
                // SAFETY: U[ξ] is c × k at ξ·k, leading dimension 16·k, alive while it is
                // packed.
                unsafe {
                    if transposed {
                        gemm.pack_b(k, c, Operand::transposed(p, XI * k), false)
                    } else {
                        gemm.pack_b(c, k, Operand::rows(p, XI * k), false)
                    }
                }
            })
            .collect()
    })
}

/// A block's 16 products `out[ξ] = a[ξ] · b[ξ]` (`rows × n`), on this thread. `a` and `out`
/// are laid out tile by tile: `a[ξ]` (`rows × depth`) at `a + ξ·depth`, `out[ξ]` at
/// `out + ξ·n`, leading dimensions `row_len` of their widths.
///
/// # Safety
/// `a` and `out` hold the 16 matrices; `b[ξ]` is `depth × n`.
#[inline(always)]
unsafe fn block_products(gemm: &Bf16Gemm, rows: usize, a: &[f32], b: &[PackedB], out: &mut [f32]) {
    let (depth, n) = b[0].dims();
    for (xi, bx) in b.iter().enumerate() {
        let (ax, ox) = (a[xi * depth..].as_ptr(), out[xi * n..].as_mut_ptr());
        // SAFETY: the caller's contract.
        unsafe {
            gemm.gemm_packed(
                rows,
                ox,
                row_len(n),
                false,
                Operand::rows(ax, row_len(depth)),
                bx,
                false,
            )
        };
    }
}

/// `y = conv(x, w)` (every element of `y` written); `x` stored in `T` or bf16.
pub fn forward<T: Float, S: Lhs<T>>(
    gemm: &Bf16Gemm,
    x: &[S],
    w: &[T],
    y: &mut [MaybeUninit<T>],
    sh: &ConvShape,
) {
    let (w, y) = (same(w), same_mut::<MaybeUninit<T>, MaybeUninit<f32>>(y));
    in_bf16(x, |x| {
        forward_by(gemm, x, w, y, sh, block_tiles(sh.c, sh.k))
    })
}

/// `forward` with the output rounded to bf16 (a batch norm's input in bf16 training): the
/// output transform rounds its f32 values as it stores them.
pub fn forward_half<T: Float, S: Lhs<T>>(
    gemm: &Bf16Gemm,
    x: &[S],
    w: &[T],
    y: &mut [MaybeUninit<bf16>],
    sh: &ConvShape,
) {
    let w = same(w);
    in_bf16(x, |x| {
        forward_by(gemm, x, w, y, sh, block_tiles(sh.c, sh.k))
    })
}

/// `forward` in blocks of `tb` tiles, the output stored in `O`.
fn forward_by<O: tiles::Lanes>(
    gemm: &Bf16Gemm,
    x: &[bf16],
    w: &[f32],
    y: &mut [MaybeUninit<O>],
    sh: &ConvShape,
    tb: usize,
) {
    assert_eq!((x.len(), y.len()), (sh.input_len(), sh.output_len()));
    let (g, c, k) = (grid(sh), sh.c, sh.k);
    let u = packed_filter(gemm, w, (c, k), false);
    let tiles = g.tiles();
    let out = super::Out(y.as_mut_ptr() as *mut O);
    let tb = even(tiles, tb);
    (0..tiles.div_ceil(tb)).into_par_iter().for_each(|blk| {
        let (first, count) = (blk * tb, tb.min(tiles - blk * tb));
        with_buffers(
            [count * row_len(c), count * row_len(k)],
            |[v, m]: [&mut [f32]; 2]| {
                simd(
                    #[inline(always)]
                    || {
                        for slot in 0..count {
                            let vo = v[slot * row_len(c)..].as_mut_ptr();
                            // SAFETY: slot's row of v, inside it.
                            unsafe { tiles::input(x, &g, c, first + slot, vo) };
                        }
                        // SAFETY: V[ξ] count × c, U[ξ] c × k, M[ξ] count × k.
                        unsafe { block_products(gemm, count, v, &u, m) };
                        for slot in 0..count {
                            // SAFETY: slot's row of m; y's allocation, each tile's outputs its
                            // block's alone.
                            unsafe {
                                tiles::output(
                                    m[slot * row_len(k)..].as_ptr(),
                                    &g,
                                    k,
                                    first + slot,
                                    out.at(0),
                                )
                            };
                        }
                    },
                )
            },
        )
    });
}

/// `dx (+)= ∂L/∂x` from `dy` (stored in `T` or bf16): added to what `dx` holds where
/// `accumulate`, written over it otherwise.
///
/// # Safety
/// With `accumulate`, every element of `dx` is initialised.
pub unsafe fn backward_data<T: Float, D: Lhs<T>>(
    gemm: &Bf16Gemm,
    dy: &[D],
    w: &[T],
    dx: &mut [MaybeUninit<T>],
    sh: &ConvShape,
    accumulate: bool,
) {
    let (w, dx) = (same(w), same_mut::<MaybeUninit<T>, MaybeUninit<f32>>(dx));
    let tb = block_tiles(sh.c, sh.k);
    // SAFETY: the caller's contract.
    in_bf16(dy, |dy| unsafe {
        backward_data_by(gemm, dy, w, dx, sh, accumulate, tb)
    })
}

/// `backward_data` in blocks of `tb` tiles.
///
/// # Safety
/// As `backward_data`.
unsafe fn backward_data_by(
    gemm: &Bf16Gemm,
    dy: &[bf16],
    w: &[f32],
    dx: &mut [MaybeUninit<f32>],
    sh: &ConvShape,
    accumulate: bool,
    tb: usize,
) {
    assert_eq!((dy.len(), dx.len()), (sh.output_len(), sh.input_len()));
    let (g, c, k) = (grid(sh), sh.c, sh.k);
    let ut = packed_filter(gemm, w, (c, k), true);
    let per = g.per_image();
    // Whole images per task (neighbouring tiles' input blocks overlap), as many as leave every
    // thread two tasks, split into even blocks (tasks of a block's worth left layer4's 7×7
    // images a block of 4 tiles after each of 28).
    let images = (g.n / (2 * partitions())).max(1);
    let image_len = g.h * g.w * c;
    dx.par_chunks_mut(images * image_len)
        .enumerate()
        .for_each(|(task, dx_t)| {
            let dx_t = if accumulate {
                // SAFETY: initialised (the contract).
                unsafe { &mut *(dx_t as *mut [MaybeUninit<f32>] as *mut [f32]) }
            } else {
                fill_uninit(dx_t, 0.0)
            };
            let t0 = task * images * per;
            let t1 = t0 + dx_t.len() / image_len * per;
            let tb = even(t1 - t0, tb);
            with_buffers(
                [tb * row_len(k), tb * row_len(c)],
                |[dm, dv]: [&mut [f32]; 2]| {
                    simd(
                        #[inline(always)]
                        || {
                            for first in (t0..t1).step_by(tb) {
                                let count = tb.min(t1 - first);
                                for slot in 0..count {
                                    let mo = dm[slot * row_len(k)..].as_mut_ptr();
                                    // SAFETY: slot's row of dm, inside it.
                                    unsafe { tiles::output_gradient(dy, &g, k, first + slot, mo) };
                                }
                                // SAFETY: dM[ξ] count × k, U[ξ]ᵀ k × c, dV[ξ] count × c.
                                unsafe { block_products(gemm, count, dm, &ut, dv) };
                                for slot in 0..count {
                                    let t = first + slot;
                                    let img = t / per - task * images;
                                    let dx_img = &mut dx_t[img * image_len..(img + 1) * image_len];
                                    // SAFETY: slot's row of dv.
                                    unsafe {
                                        tiles::input_gradient(
                                            dv[slot * row_len(c)..].as_ptr(),
                                            &g,
                                            c,
                                            t,
                                            dx_img,
                                        )
                                    };
                                }
                            }
                        },
                    )
                },
            )
        });
}

/// `dw = ∂L/∂w` from the layer's input `x` and `dy` (each stored in `T` or bf16; written over
/// `dw`).
pub fn backward_filter<T: Float, S: Lhs<T>, D: Lhs<T>>(
    gemm: &Bf16Gemm,
    x: &[S],
    dy: &[D],
    dw: &mut [T],
    sh: &ConvShape,
) {
    let tb = filter_block_tiles(sh.c, sh.k);
    let dw = same_mut(dw);
    in_bf16(x, |x| {
        in_bf16(dy, |dy| backward_filter_by(gemm, x, dy, dw, sh, tb))
    })
}

/// `backward_filter` in blocks of `tb` tiles.
fn backward_filter_by(
    gemm: &Bf16Gemm,
    x: &[bf16],
    dy: &[bf16],
    dw: &mut [f32],
    sh: &ConvShape,
    tb: usize,
) {
    assert_eq!((x.len(), dy.len()), (sh.input_len(), sh.output_len()));
    let (g, c, k) = (grid(sh), sh.c, sh.k);
    let per = g.per_image();
    // Images in a fixed number of contiguous parts, each summed in order, the parts in order.
    let parts = partitions().min(g.n);
    let images = g.n.div_ceil(parts);
    let mut du = vec![0f32; XI * c * k];
    ordered_sum_into(&mut du, parts, |p, acc| {
        let (t0, t1) = (p * images * per, ((p + 1) * images).min(g.n) * per);
        if t1 <= t0 {
            fill_uninit(acc, 0.0);
            return;
        }
        let acc = acc.as_mut_ptr() as *mut f32;
        let tb = even(t1 - t0, tb);
        with_buffers(
            [tb * row_len(c), tb * row_len(k)],
            |[v, dm]: [&mut [f32]; 2]| {
                simd(
                    #[inline(always)]
                    || {
                        for first in (t0..t1).step_by(tb) {
                            let count = tb.min(t1 - first);
                            for slot in 0..count {
                                let vo = v[slot * row_len(c)..].as_mut_ptr();
                                let mo = dm[slot * row_len(k)..].as_mut_ptr();
                                // SAFETY: slot's rows of v and dm, inside them.
                                unsafe {
                                    tiles::input(x, &g, c, first + slot, vo);
                                    tiles::output_gradient(dy, &g, k, first + slot, mo);
                                }
                            }
                            for xi in 0..XI {
                                let (vx, mx) = (v[xi * c..].as_ptr(), dm[xi * k..].as_ptr());
                                // SAFETY: V[ξ]ᵀ c × count, dM[ξ] count × k (tile by tile, `row_len`),
                                // dU[ξ] c × k in acc (row by row, leading dimension 16·k):
                                // written over by the part's first block (never read before),
                                // added to by the others.
                                unsafe {
                                    gemm.gemm(
                                        c,
                                        k,
                                        count,
                                        acc.add(xi * k),
                                        XI * k,
                                        first > t0,
                                        Operand::transposed(vx, row_len(c)),
                                        Operand::rows(mx, row_len(k)),
                                        false,
                                    )
                                };
                            }
                        }
                    },
                )
            },
        )
    });
    filter_gradient_transform::<f32, F2, 4, 2>(&du, c, k, dw, Points::Interleaved);
}

#[cfg(test)]
mod tests;
mod tiles;
