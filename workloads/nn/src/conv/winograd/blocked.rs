//! The Winograd passes image by image, in blocks of tiles small enough that a block's
//! transformed operands stay in L2 between the transforms and the products: for layers whose
//! transformed filter is small (ResNet-50's layer1, 64 × 64 channels: 576 KiB), where the
//! whole-batch passes wrote and read back their transformed tensors (2.25 times the
//! activations, each way) from memory and ran at two thirds of the other layers' rate.
//!
//! Each image is one task (the filter gradient: whole images in a fixed number of parts,
//! summed in order) and its blocks run in tile order, so that every input gradient is added up
//! in the order of the whole-batch pass and no result depends on the thread count. The sums
//! are those of the whole-batch passes but for rounding: the products run over fewer rows, and
//! the filter gradient adds the batch up in another order (the tests bound the difference).

use super::{
    input_gradient_tile, input_tile, output_gradient_tile, output_tile, with_buffers, Grid, Out,
    F4, XI,
};
use crate::tensor::{fill_uninit, native_gemm, ordered_sum_into, simd, Float, Mat};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// The most bytes of a transformed filter (`36 · c · k` elements) for which the passes go
/// block by block: read again for every block, it must stay in L2 beside them.
const MAX_FILTER_BYTES: usize = 1 << 20;

/// Bytes of a block's transformed operands (input and output side together): 28 tiles of
/// layer1 in f32. (trainer_conv bench, layer1.0 conv2, two rounds: 512 KiB forward 609–677,
/// backward data 538–576, backward filter 563–621 GFLOP/s; 1 MiB 554–634, 503–560, 581–632;
/// 256 KiB 538, 474, 480.)
const BLOCK_BYTES: usize = 1 << 19;

/// Whether a layer of `c` input and `k` output channels goes block by block.
pub(super) fn applies<T>(c: usize, k: usize) -> bool {
    XI * c * k * std::mem::size_of::<T>() <= MAX_FILTER_BYTES
}

/// Tiles per block for `c` input and `k` output channels (at least one, at most an image).
fn block_tiles<T>(g: &Grid, c: usize, k: usize) -> usize {
    (BLOCK_BYTES / (XI * (c + k) * std::mem::size_of::<T>())).clamp(1, g.per_image())
}

/// A block's 36 products `out[ξ] (+)= a(ξ) · b(ξ)` (`m × n` each, dense at `out + ξ·m·n`,
/// reduction `depth`) on this thread, added to `out` where `accumulate`.
///
/// # Safety
/// The operands must cover the matrices they describe, and `out` the 36 products.
#[inline(always)]
unsafe fn products<T: Float>(
    (m, n, depth): (usize, usize, usize),
    out: *mut T,
    accumulate: bool,
    a: impl Fn(usize) -> Mat<T>,
    b: impl Fn(usize) -> Mat<T>,
) {
    for xi in 0..XI {
        // SAFETY: the caller's contract.
        unsafe {
            native_gemm(
                m,
                n,
                depth,
                out.add(xi * m * n),
                n,
                accumulate,
                a(xi),
                b(xi),
                false,
            )
        };
    }
}

/// `y = conv(x, ·)` with the transformed filter `u` (`U[ξ][c][k]`).
pub(super) fn forward<T: Float>(
    x: &[T],
    u: &[T],
    y: &mut [MaybeUninit<T>],
    g: Grid,
    (c, k): (usize, usize),
) {
    let (per, tb) = (g.per_image(), block_tiles::<T>(&g, c, k));
    let out = Out(y.as_mut_ptr() as *mut T);
    (0..g.n).into_par_iter().for_each(|img| {
        with_buffers([XI * tb * c, XI * tb * k], |[v, m]| {
            simd(
                #[inline(always)]
                || {
                    for b0 in (0..per).step_by(tb) {
                        let count = tb.min(per - b0);
                        let first = img * per + b0;
                        let vo = Out(v.as_mut_ptr());
                        for slot in 0..count {
                            // SAFETY: slot's points of v (count · c per point, inside v),
                            // this thread's scratch.
                            unsafe {
                                input_tile::<T, F4, 6, 4>(x, g, c, first + slot, vo, (count, slot))
                            };
                        }
                        // SAFETY: V[ξ] count × c, U[ξ] c × k, M[ξ] count × k, dense.
                        unsafe {
                            products(
                                (count, k, c),
                                m.as_mut_ptr(),
                                false,
                                |xi| Mat::rows(v[xi * count * c..].as_ptr(), c),
                                |xi| Mat::rows(u[xi * c * k..].as_ptr(), k),
                            )
                        };
                        for slot in 0..count {
                            // SAFETY: y's allocation; the tile's outputs are its own, and the
                            // image's tiles are this task's.
                            unsafe {
                                output_tile::<T, F4, 6, 4>(
                                    m,
                                    (count, slot),
                                    g,
                                    k,
                                    first + slot,
                                    out,
                                )
                            };
                        }
                    }
                },
            )
        })
    });
}

/// `dx (+)= ∂L/∂x` from `dy` with the transformed filter transposed, `ut` (`U[ξ]ᵀ`, k × c):
/// added to what `dx` holds where `accumulate`, written over it otherwise (each image zeroed
/// by its own task, in cache).
///
/// # Safety
/// With `accumulate`, every element of `dx` is initialised.
pub(super) unsafe fn backward_data<T: Float>(
    dy: &[T],
    ut: &[T],
    dx: &mut [MaybeUninit<T>],
    accumulate: bool,
    g: Grid,
    (c, k): (usize, usize),
) {
    let (per, tb) = (g.per_image(), block_tiles::<T>(&g, c, k));
    dx.par_chunks_mut(g.h * g.w * c)
        .enumerate()
        .for_each(|(img, dx_img)| {
            let dx_img = if accumulate {
                // SAFETY: initialised (the contract).
                unsafe { &mut *(dx_img as *mut [MaybeUninit<T>] as *mut [T]) }
            } else {
                fill_uninit(dx_img, T::zero())
            };
            with_buffers([XI * tb * k, XI * tb * c], |[dm, dv]| {
                simd(
                    #[inline(always)]
                    || {
                        for b0 in (0..per).step_by(tb) {
                            let count = tb.min(per - b0);
                            let first = img * per + b0;
                            let mo = Out(dm.as_mut_ptr());
                            for slot in 0..count {
                                // SAFETY: as in forward.
                                unsafe {
                                    output_gradient_tile::<T, F4, 6, 4>(
                                        dy,
                                        g,
                                        k,
                                        first + slot,
                                        mo,
                                        (count, slot),
                                    )
                                };
                            }
                            // SAFETY: dM[ξ] count × k, U[ξ]ᵀ k × c, dV[ξ] count × c, dense.
                            unsafe {
                                products(
                                    (count, c, k),
                                    dv.as_mut_ptr(),
                                    false,
                                    |xi| Mat::rows(dm[xi * count * k..].as_ptr(), k),
                                    |xi| Mat::rows(ut[xi * c * k..].as_ptr(), c),
                                )
                            };
                            for slot in 0..count {
                                input_gradient_tile::<T, F4, 6, 4>(
                                    dv,
                                    (count, slot),
                                    g,
                                    c,
                                    first + slot,
                                    dx_img,
                                );
                            }
                        }
                    },
                )
            })
        });
}

/// Parts the filter gradient's sum over the batch is split into (whole images each, summed in
/// order): fixed, so that the bits do not depend on the threads.
const PARTS: usize = 8;

/// `du = ∂L/∂U` (`dU[ξ][c][k]`, written over) from the layer's input `x` and `dy`.
pub(super) fn backward_filter<T: Float>(
    x: &[T],
    dy: &[T],
    du: &mut [T],
    g: Grid,
    (c, k): (usize, usize),
) {
    let (per, tb) = (g.per_image(), block_tiles::<T>(&g, c, k));
    let parts = PARTS.min(g.n);
    let images = g.n.div_ceil(parts);
    ordered_sum_into(du, parts, |p, acc| {
        let (i0, i1) = (p * images, ((p + 1) * images).min(g.n));
        if i1 <= i0 {
            fill_uninit(acc, T::zero());
            return;
        }
        let acc = acc.as_mut_ptr() as *mut T;
        with_buffers([XI * tb * c, XI * tb * k], |[v, dm]| {
            simd(
                #[inline(always)]
                || {
                    // Image by image, each in blocks of tiles (the last one short).
                    for (img, b0) in
                        (i0..i1).flat_map(|i| (0..per).step_by(tb).map(move |b| (i, b)))
                    {
                        let count = tb.min(per - b0);
                        let first = img * per + b0;
                        let (vo, mo) = (Out(v.as_mut_ptr()), Out(dm.as_mut_ptr()));
                        for slot in 0..count {
                            // SAFETY: as in forward.
                            unsafe {
                                input_tile::<T, F4, 6, 4>(x, g, c, first + slot, vo, (count, slot));
                                output_gradient_tile::<T, F4, 6, 4>(
                                    dy,
                                    g,
                                    k,
                                    first + slot,
                                    mo,
                                    (count, slot),
                                );
                            }
                        }
                        // SAFETY: V[ξ]ᵀ c × count, dM[ξ] count × k, dU[ξ] c × k in acc: written
                        // over by the part's first block (never read before), added to by the
                        // others.
                        unsafe {
                            products(
                                (c, k, count),
                                acc,
                                first > i0 * per,
                                |xi| Mat::transposed(v[xi * count * c..].as_ptr(), c),
                                |xi| Mat::rows(dm[xi * count * k..].as_ptr(), k),
                            )
                        };
                    }
                },
            )
        })
    });
}
