//! Convolutions of a short depth (`r·s·c` ≤ KC, few taps a filter row: ResNet's 7×7 stem on
//! 3 channels) in f32 on roofline's kernels, without an im2col patch (`F32Gemm::taps_forward`,
//! `taps_filter`): each image is zero-padded once, and the kernels read every output row's
//! taps where they lie.
//! im2col wrote the stem's 147 values per output pixel in runs of 21 floats, 30% of its
//! forward pass and as much of its filter gradient (perf, trainer_conv).

use super::{im2col_forced, pointwise, ConvShape};
use crate::tensor::{
    fill_uninit, ordered_sum_into, own_f32, partitions, products, Float, Products,
};
use rayon::prelude::*;
use roofline_kernels::cpu::bf16::Operand;
use roofline_kernels::cpu::sgemm::{taps_apply, F32Gemm, Taps, MR};
use std::any::TypeId;
use std::mem::MaybeUninit;

/// The longest run of taps (`s·c` values) taken this way. Where a filter row's taps are many,
/// im2col copies them in long runs at little cost and its blocked GEMMs were faster: layer2.0's
/// projection (1×1 stride 2 on 256 channels, runs of 256) ran slower here (trainer_conv:
/// forward 466–471 → 446–450 GFLOP/s, filter gradient 409–415 → 336–344).
const MAX_RUN: usize = 64;

/// The kernels, where a convolution of this shape takes this path: its products (`T`) and
/// operands (`S`, `D`) all f32, the products native, roofline's f32 kernels present
/// (`own_f32`), not a 1×1 stride-1 layer (one GEMM as it lies), runs of at most `MAX_RUN`
/// taps, a depth within one block of k and whole column panels (`taps_apply`), and
/// `ROOFLINE_CONV` not `im2col`.
pub(super) fn kernels<T: 'static, S: 'static, D: 'static>(sh: &ConvShape) -> Option<F32Gemm> {
    let f32s = [TypeId::of::<T>(), TypeId::of::<S>(), TypeId::of::<D>()]
        .iter()
        .all(|t| *t == TypeId::of::<f32>());
    if !f32s
        || pointwise(sh)
        || sh.s * sh.c > MAX_RUN
        || im2col_forced()
        || products() != Products::Native
        || !taps_apply(sh.depth(), sh.k)
    {
        return None;
    }
    own_f32::<f32>()
}

/// `x` read as f32.
///
/// # Safety
/// `A` is f32.
pub(super) unsafe fn as_f32<A: 'static>(x: &[A]) -> &[f32] {
    debug_assert!(TypeId::of::<A>() == TypeId::of::<f32>());
    &*(x as *const [A] as *const [f32])
}

/// `y` written as f32.
///
/// # Safety
/// `A` is f32.
pub(super) unsafe fn as_f32_mut<A: 'static>(y: &mut [A]) -> &mut [f32] {
    debug_assert!(TypeId::of::<A>() == TypeId::of::<f32>());
    &mut *(y as *mut [A] as *mut [f32])
}

/// Values per padded image row.
fn padded_row(sh: &ConvShape) -> usize {
    (sh.w + 2 * sh.pad) * sh.c
}

/// A padded image and, after it, zeros for a partial tile's extra pixels (`taps_forward`).
fn padded_len(sh: &ConvShape) -> usize {
    (sh.h + 2 * sh.pad) * padded_row(sh) + MR * sh.stride * sh.c
}

/// Image `img` of `x` zero-padded by `sh.pad` on every side, then zeros: all of `out` written.
fn pad_image(x: &[f32], sh: &ConvShape, img: usize, out: &mut [f32]) {
    let (c, row) = (sh.c, padded_row(sh));
    let plane = sh.h * sh.w * c;
    let src = &x[img * plane..(img + 1) * plane];
    let (top, body) = out.split_at_mut(sh.pad * row);
    top.fill(0.0);
    let (left, right) = (sh.pad * c, (sh.pad + sh.w) * c);
    for (dst, line) in body.chunks_exact_mut(row).zip(src.chunks_exact(sh.w * c)) {
        dst[..left].fill(0.0);
        dst[left..right].copy_from_slice(line);
        dst[right..].fill(0.0);
    }
    body[sh.h * row..].fill(0.0);
}

/// Output row `oy`'s taps in a padded image.
fn taps(sh: &ConvShape, padded: &[f32], oy: usize) -> Taps {
    let row = padded_row(sh);
    Taps {
        a: padded[oy * sh.stride * row..].as_ptr(),
        pixel: sh.stride * sh.c,
        row,
        rows: sh.r,
        run: sh.s * sh.c,
    }
}

/// `y = conv(x, w)`, every element of `y` written: images in parallel, each padded once.
pub(super) fn forward(
    g: F32Gemm,
    x: &[f32],
    w: &[f32],
    y: &mut [MaybeUninit<f32>],
    sh: &ConvShape,
) {
    let (depth, k, ow) = (sh.depth(), sh.k, sh.ow());
    let wb = Operand {
        ptr: w.as_ptr(),
        rs: k as isize,
        cs: 1,
    };
    // SAFETY: w is depth × k, row-major (the caller checked its length).
    let packed = unsafe { g.pack_b(depth, k, wb, true) };
    let len = padded_len(sh);
    y.par_chunks_mut(sh.oh() * ow * k)
        .enumerate()
        .for_each(|(img, y_img)| {
            f32::with_scratch(len, |buf| {
                pad_image(x, sh, img, buf);
                for (oy, y_row) in y_img.chunks_exact_mut(ow * k).enumerate() {
                    // SAFETY: buf holds the padded image and a tile's slack after it
                    // (`padded_len`); y_row is ow × k; the filter is depth × k (`kernels`).
                    unsafe {
                        g.taps_forward(
                            taps(sh, buf, oy),
                            ow,
                            y_row.as_mut_ptr() as *mut f32,
                            k,
                            &packed,
                        )
                    }
                }
            })
        });
}

/// `dw = ∂L/∂w` from `x` and `dy`: the images in a fixed number of contiguous groups, each
/// summed in order (image by image, output row by output row), the groups added in order.
pub(super) fn backward_filter(g: F32Gemm, x: &[f32], dy: &[f32], dw: &mut [f32], sh: &ConvShape) {
    let (k, oh, ow) = (sh.k, sh.oh(), sh.ow());
    let parts = partitions().min(sh.n.max(1));
    let per = sh.n.div_ceil(parts);
    let len = padded_len(sh);
    ordered_sum_into(dw, parts, |p, acc| {
        let (first, last) = (p * per, ((p + 1) * per).min(sh.n));
        if last <= first {
            fill_uninit(acc, 0.0);
            return;
        }
        let acc = acc.as_mut_ptr() as *mut f32;
        f32::with_scratch(len, |buf| {
            for img in first..last {
                pad_image(x, sh, img, buf);
                for oy in 0..oh {
                    let dy_row = &dy[((img * oh + oy) * ow) * k..];
                    // SAFETY: the padded image covers the row's taps; dy_row is ow × k; acc
                    // is depth × k, written over by the first row (never read before it).
                    unsafe {
                        g.taps_filter(
                            taps(sh, buf, oy),
                            ow,
                            dy_row.as_ptr(),
                            k,
                            k,
                            acc,
                            k,
                            img > first || oy > 0,
                        )
                    }
                }
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::super::tests::{data, direct, shape};
    use super::*;

    /// f32 layers of short depth (this path where the CPU has roofline's f32 kernels, im2col
    /// elsewhere): the forward pass and the filter gradient agree with f64 sums within f32
    /// rounding, on partial tiles of pixels and of taps, with padding on every side, on two
    /// threads and on more threads than images.
    #[test]
    fn short_depth_layers_agree_with_direct_sums() {
        for threads in [2, 5] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            pool.install(short_depth_layers);
        }
    }

    fn short_depth_layers() {
        // Runs of 256 taps (layer2.0's projection): im2col's.
        assert!(kernels::<f32, f32, f32>(&shape(2, 256, 6, 64, 1, 2, 0)).is_none());
        for sh in [
            // ResNet's stem on a small image: 147 taps, 9 × 10 output pixels.
            shape(3, 3, 17, 64, 7, 2, 3),
            shape(2, 5, 9, 32, 3, 2, 1),
            shape(2, 4, 8, 32, 5, 1, 2),
            // A single channel (runs of 3, shorter than a tile).
            shape(4, 1, 6, 32, 3, 1, 0),
        ] {
            let taken = kernels::<f32, f32, f32>(&sh).is_some();
            let own = roofline_kernels::cpu::sgemm::F32Gemm::detect().is_some()
                && std::env::var_os("ROOFLINE_F32_GEMM").is_none()
                && std::env::var_os("ROOFLINE_CONV").is_none();
            assert_eq!(taken, own, "{}", sh.describe());
            let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
            let (x32, w32, g32) = (
                f(&data(sh.input_len(), 0.3)),
                f(&data(sh.weight_len(), 1.0)),
                f(&data(sh.output_len(), 4.0)),
            );
            let wide = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<_>>();
            let (x, w, gy) = (wide(&x32), wide(&w32), wide(&g32));
            let mut y = vec![0f32; sh.output_len()];
            super::super::forward(&x32, &w32, &mut y, &sh);
            let bound = 2e-6 * sh.depth() as f64;
            for (i, (a, b)) in y.iter().zip(direct(&x, &w, &sh)).enumerate() {
                assert!(
                    (*a as f64 - b).abs() < bound,
                    "{} y[{i}]: {a} {b}",
                    sh.describe()
                );
            }
            // dw[t, k] = Σ over pixels of the patch's tap t times dy[k]: each tap's gradient is
            // the forward pass of the one-hot filter against dy.
            let mut dw = vec![f32::NAN; sh.weight_len()];
            super::super::backward_filter(&x32, &g32, &mut dw, &sh);
            let one = ConvShape { k: 1, ..sh };
            let terms = sh.rows() as f64;
            for t in 0..sh.depth() {
                let mut hot = vec![0.0; sh.depth()];
                hot[t] = 1.0;
                let tap = direct(&x, &hot, &one);
                for j in 0..sh.k {
                    let want: f64 = tap
                        .iter()
                        .enumerate()
                        .map(|(p, v)| v * gy[p * sh.k + j])
                        .sum();
                    let got = dw[t * sh.k + j] as f64;
                    assert!(
                        (got - want).abs() < 2e-6 * terms,
                        "{} dw[{t},{j}]: {got} {want}",
                        sh.describe()
                    );
                }
            }
        }
    }
}
