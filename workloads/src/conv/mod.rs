//! Convolution forward, backward-data and backward-filter on NHWC tensors with RSCK filters (the
//! layout of `roofline_kernels::cpu::conv`: a filter is a `r·s·c × k` matrix). 1×1 stride-1
//! convolutions are single GEMMs; the others go through im2col in cache-sized blocks of output
//! rows, whole images per task (so that backward-data's col2im never races), the filter prepared
//! once per call (packed once in bf16). 3×3 stride-1 layers with f32 (or f64) products go
//! through Winograd's F(4×4, 3×3) instead (`winograd`).

mod taps;
pub mod winograd;

use crate::tensor::{
    as_uninit, fill_uninit, gemm_mixed, long_on_own, ordered_sum_into, partitions, products, Float,
    Lhs, Mat, Products, Rhs,
};
use rayon::prelude::*;
pub use roofline_kernels::cpu::conv::ConvShape;
use std::mem::MaybeUninit;

fn pointwise(sh: &ConvShape) -> bool {
    sh.r == 1 && sh.s == 1 && sh.stride == 1 && sh.pad == 0
}

/// Output rows per im2col block: about 512 KiB of patch.
fn block_rows<T>(depth: usize) -> usize {
    ((512 * 1024) / (std::mem::size_of::<T>() * depth)).clamp(16, 1024)
}

/// How the im2col passes split the batch: `(images per task, output rows per block)`. A task
/// takes whole images. Large images go in blocks of about 512 KiB of patch; small ones, where
/// two or more fit in 2 MiB of patch, several to a block, so that one product covers several
/// images (a layer4 7×7 image is 49 rows: alone, each product went through the whole filter for
/// 28 rows of output), while leaving every thread two tasks or more. Only with a packed filter
/// (bf16): the f32 products (the gemm crate, packing its own blocks) ran 5–10% slower on layer4
/// grouped (trainer_conv bench, forward 194–196 vs 205–218 GFLOP/s).
fn tiling<T>(sh: &ConvShape, packed: bool) -> (usize, usize) {
    let per_img = sh.oh() * sh.ow();
    let most = (sh.n / (2 * partitions())).max(1);
    let g = ((2 << 20) / (std::mem::size_of::<T>() * sh.depth() * per_img)).min(most);
    if g >= 2 && packed {
        return (g, g * per_img);
    }
    (1, block_rows::<T>(sh.depth()))
}

/// Adds the patch rows back into the images `dx_imgs` (the inverse of im2col, summing
/// overlaps); rows are counted from the first of those images. The sums in the CPU's widest
/// vectors (`simd`; baseline x86-64 adds four floats at a time).
fn col2im<T: Float>(patch: &[T], sh: &ConvShape, r0: usize, rows: usize, dx_imgs: &mut [T]) {
    crate::tensor::simd(
        #[inline(always)]
        || col2im_rows(patch, sh, r0, rows, dx_imgs),
    )
}

#[inline(always)]
fn col2im_rows<T: Float>(patch: &[T], sh: &ConvShape, r0: usize, rows: usize, dx_imgs: &mut [T]) {
    let (ow, c, depth) = (sh.ow(), sh.c, sh.depth());
    let per_img = sh.oh() * ow;
    for (t, prow) in patch.chunks_exact(depth).take(rows).enumerate() {
        let (img, row) = ((r0 + t) / per_img, (r0 + t) % per_img);
        let dx_img = &mut dx_imgs[img * sh.h * sh.w * c..(img + 1) * sh.h * sh.w * c];
        let (oy, ox) = (row / ow, row % ow);
        let mut off = 0;
        for ky in 0..sh.r {
            let iy = (oy * sh.stride + ky) as isize - sh.pad as isize;
            for kx in 0..sh.s {
                let ix = (ox * sh.stride + kx) as isize - sh.pad as isize;
                if iy >= 0 && (iy as usize) < sh.h && ix >= 0 && (ix as usize) < sh.w {
                    let dst = (iy as usize * sh.w + ix as usize) * c;
                    for (d, s) in dx_img[dst..dst + c].iter_mut().zip(&prow[off..off + c]) {
                        *d += *s;
                    }
                }
                off += c;
            }
        }
    }
}

/// Whether `ROOFLINE_CONV=im2col` keeps every convolution that is not 1×1 stride 1 on im2col
/// and GEMMs (the A/B switch for Winograd's algorithm and the taps path; read once).
fn im2col_forced() -> bool {
    static IM2COL: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *IM2COL.get_or_init(|| std::env::var("ROOFLINE_CONV").is_ok_and(|v| v == "im2col"))
}

/// Whether 3×3 stride-1 layers with products in their own type go through Winograd's
/// algorithm: yes, unless `ROOFLINE_CONV=im2col`.
pub fn winograd_enabled() -> bool {
    !im2col_forced()
}

/// `x` as a slice of `T` where a convolution of this shape goes through Winograd's algorithm:
/// a 3×3 stride-1 layer whose operands are stored in `T` and whose products are in `T` (the
/// bf16 products keep the im2col GEMMs), unless `ROOFLINE_CONV=im2col` (the A/B switch).
fn winograd_operand<'a, T: Float, S: 'static>(sh: &ConvShape, x: &'a [S]) -> Option<&'a [T]> {
    let same = std::any::TypeId::of::<S>() == std::any::TypeId::of::<T>();
    (same && winograd_enabled() && products() == Products::Native && winograd::applies(sh))
        // SAFETY: S is T.
        .then(|| unsafe { &*(x as *const [S] as *const [T]) })
}

fn check_lengths<T>(sh: &ConvShape, x: usize, w: usize, y: usize) {
    assert!(sh.valid(), "invalid convolution shape {}", sh.describe());
    assert_eq!(x, sh.input_len(), "input length");
    assert_eq!(w, sh.weight_len(), "weight length");
    assert_eq!(y, sh.output_len(), "output length");
    let _ = std::marker::PhantomData::<T>;
}

/// `y = conv(x, w)`.
pub fn forward<T: Float>(x: &[T], w: &[T], y: &mut [T], sh: &ConvShape) {
    // SAFETY: forward_into writes only computed values.
    forward_into(x, w, unsafe { as_uninit(y) }, sh)
}

/// `y = conv(x, w)` into storage not yet written: every element of `y` is written (the GEMMs
/// overwrite their output without reading it). The input may be stored in bf16 (`Lhs`).
pub fn forward_into<T: Float, S: Lhs<T>>(
    x: &[S],
    w: &[T],
    y: &mut [MaybeUninit<T>],
    sh: &ConvShape,
) {
    check_lengths::<T>(sh, x.len(), w.len(), y.len());
    if let Some(x) = winograd_operand::<T, S>(sh, x) {
        return winograd::forward(x, w, y, sh);
    }
    if let Some(g) = taps::kernels::<T, S, T>(sh) {
        // SAFETY: T and S are f32 (`kernels`); MaybeUninit<T> is laid out as T.
        return unsafe {
            let y = &mut *(y as *mut [MaybeUninit<T>] as *mut [MaybeUninit<f32>]);
            taps::forward(g, taps::as_f32(x), taps::as_f32(w), y, sh)
        };
    }
    let (depth, k) = (sh.depth(), sh.k);
    if pointwise(sh) {
        // SAFETY: x is rows × c, w is c × k, y is rows × k, dense.
        unsafe {
            gemm_mixed(
                sh.rows(),
                k,
                depth,
                y.as_mut_ptr() as *mut T,
                k,
                false,
                Mat::rows(x.as_ptr(), depth),
                Mat::rows(w.as_ptr(), k),
                true,
            )
        };
        return;
    }
    let per_img = sh.oh() * sh.ow();
    // SAFETY: w is depth × k, alive and unchanged while wb is used.
    let wb = unsafe { Rhs::new(depth, k, Mat::rows(w.as_ptr(), k)) };
    let (g, mb) = tiling::<S>(sh, wb.is_packed());
    y.par_chunks_mut(g * per_img * k)
        .enumerate()
        .for_each(|(t, y_t)| {
            S::with_scratch(mb * depth, |patch| {
                let (first, rows_t) = (t * g * per_img, y_t.len() / k);
                for r0 in (0..rows_t).step_by(mb) {
                    let rows = mb.min(rows_t - r0);
                    roofline_kernels::cpu::conv::im2col(x, sh, first + r0, rows, patch);
                    // SAFETY: patch rows × depth, the block of y rows × k.
                    unsafe {
                        S::gemm_rhs(
                            &wb,
                            rows,
                            y_t[r0 * k..].as_mut_ptr() as *mut T,
                            k,
                            false,
                            Mat::rows(patch.as_ptr(), depth),
                            false,
                        )
                    };
                }
            })
        });
}

/// `w` (depth × k) transposed to k × depth, row-major: the GEMMs of the backward-data pass
/// then read a row-major operand (packing a strided transpose for every block costs more than
/// this one copy per layer).
fn transpose<T: Float>(w: &[T], depth: usize, k: usize) -> Vec<T> {
    let mut t = Vec::with_capacity(w.len());
    transpose_into(w, depth, k, &mut t.spare_capacity_mut()[..w.len()]);
    // SAFETY: transpose_into wrote every element.
    unsafe { t.set_len(w.len()) };
    t
}

/// `out` (cols × rows) = `a` (rows × cols) transposed, both row-major, every element written.
fn transpose_into<T: Float>(a: &[T], rows: usize, cols: usize, out: &mut [MaybeUninit<T>]) {
    // In 32 × 32 tiles: a row-by-row transpose writes one element per cache line (and, for a
    // deep layer, per page) and ran at a fifth of the copy's speed.
    const TILE: usize = 32;
    assert!(a.len() == rows * cols && out.len() == a.len());
    for d0 in (0..rows).step_by(TILE) {
        for j0 in (0..cols).step_by(TILE) {
            for d in d0..(d0 + TILE).min(rows) {
                for j in j0..(j0 + TILE).min(cols) {
                    out[j * rows + d] = MaybeUninit::new(a[d * cols + j]);
                }
            }
        }
    }
}

/// `dx = ∂L/∂x` from `dy = ∂L/∂y` (stored in `T` or bf16).
pub fn backward_data<T: Float, D: Lhs<T>>(dy: &[D], w: &[T], dx: &mut [T], sh: &ConvShape) {
    // SAFETY: backward_data_into writes only computed values (and zeros).
    backward_data_into(dy, w, unsafe { as_uninit(dx) }, sh)
}

/// `backward_data` into storage not yet written: every element of `dx` is written.
pub fn backward_data_into<T: Float, D: Lhs<T>>(
    dy: &[D],
    w: &[T],
    dx: &mut [MaybeUninit<T>],
    sh: &ConvShape,
) {
    // SAFETY: without accumulation nothing of dx is read before it is written.
    unsafe { backward_data_impl(dy, w, dx, sh, false) }
}

/// `dx += ∂L/∂x` from `dy`: the input gradient added to one already there (a residual block's
/// shortcut gradient) by the products themselves, where a separate sum would read both
/// tensors and write one more time.
pub fn backward_data_add<T: Float, D: Lhs<T>>(dy: &[D], w: &[T], dx: &mut [T], sh: &ConvShape) {
    // SAFETY: dx is initialised, and the products and col2im write only computed values.
    unsafe { backward_data_impl(dy, w, as_uninit(dx), sh, true) }
}

/// # Safety
/// With `accumulate`, every element of `dx` is initialised.
unsafe fn backward_data_impl<T: Float, D: Lhs<T>>(
    dy: &[D],
    w: &[T],
    dx: &mut [MaybeUninit<T>],
    sh: &ConvShape,
    accumulate: bool,
) {
    check_lengths::<T>(sh, dx.len(), w.len(), dy.len());
    if let Some(dy) = winograd_operand::<T, D>(sh, dy) {
        // SAFETY: this function's contract.
        return unsafe { winograd::backward_data(dy, w, dx, sh, accumulate) };
    }
    let (depth, k) = (sh.depth(), sh.k);
    // wᵀ (k × depth): packed in bf16 straight from w's strides; for the native products, a
    // row-major copy.
    // SAFETY: w is depth × k, alive and unchanged while the Rhs are used; so is wt below.
    let packed = unsafe { Rhs::new(k, depth, Mat::transposed(w.as_ptr(), k)) };
    let wt;
    let wb = if packed.is_packed() {
        packed
    } else {
        wt = transpose(w, depth, k);
        unsafe { Rhs::new(k, depth, Mat::rows(wt.as_ptr(), depth)) }
    };
    if pointwise(sh) {
        // SAFETY: dy rows × k, wᵀ k × c (w is c × k), dx rows × c.
        unsafe {
            D::gemm_rhs(
                &wb,
                sh.rows(),
                dx.as_mut_ptr() as *mut T,
                depth,
                accumulate,
                Mat::rows(dy.as_ptr(), k),
                true,
            )
        };
        return;
    }
    let per_img = sh.oh() * sh.ow();
    let (g, mb) = tiling::<T>(sh, wb.is_packed());
    dx.par_chunks_mut(g * sh.h * sh.w * sh.c)
        .enumerate()
        .for_each(|(t, dx_t)| {
            T::with_scratch(mb * depth, |patch| {
                let dx_t = if accumulate {
                    // SAFETY: initialised (this function's contract); col2im adds into it.
                    unsafe { &mut *(dx_t as *mut [MaybeUninit<T>] as *mut [T]) }
                } else {
                    fill_uninit(dx_t, T::zero())
                };
                let first = t * g * per_img;
                let rows_t = dx_t.len() / (sh.h * sh.w * sh.c) * per_img;
                for r0 in (0..rows_t).step_by(mb) {
                    let rows = mb.min(rows_t - r0);
                    let dyb = &dy[(first + r0) * k..];
                    // SAFETY: dy block rows × k, patch rows × depth.
                    unsafe {
                        D::gemm_rhs(
                            &wb,
                            rows,
                            patch.as_mut_ptr(),
                            depth,
                            false,
                            Mat::rows(dyb.as_ptr(), k),
                            false,
                        )
                    };
                    col2im(patch, sh, r0, rows, dx_t);
                }
            })
        });
}

/// `dw = ∂L/∂w` from the layer's input `x` and `dy` (each stored in `T` or bf16).
pub fn backward_filter<T: Float, S: Lhs<T>, D: Lhs<T>>(
    x: &[S],
    dy: &[D],
    dw: &mut [T],
    sh: &ConvShape,
) {
    check_lengths::<T>(sh, x.len(), dw.len(), dy.len());
    if let (Some(x), Some(dy)) = (
        winograd_operand::<T, S>(sh, x),
        winograd_operand::<T, D>(sh, dy),
    ) {
        return winograd::backward_filter(x, dy, dw, sh);
    }
    if let Some(g) = taps::kernels::<T, S, D>(sh) {
        // SAFETY: T, S and D are f32 (`kernels`).
        return unsafe {
            taps::backward_filter(
                g,
                taps::as_f32(x),
                taps::as_f32(dy),
                taps::as_f32_mut(dw),
                sh,
            )
        };
    }
    let (depth, k) = (sh.depth(), sh.k);
    if pointwise(sh) {
        // dw = xᵀ·dy has a small output and a long reduction (all rows): the GEMM's own
        // parallelism (over the output) would leave cores idle, so the rows are split into a
        // fixed number of contiguous parts, summed in order.
        let rows = sh.rows();
        let parts = partitions().min(rows.max(1));
        let per = rows.div_ceil(parts);
        // The gemm crate runs this product faster with a narrow k as its rows than as its
        // columns (one thread, 50176 rows, f32: depth 256 × k 64 at 81 GFLOP/s as dw = xᵀ·dy,
        // 113 as dwᵀ = dyᵀ·x; but 64 × 256 at 112 as dw, 86 as dwᵀ): where k ≤ 128 < depth and
        // the products are the crate's, dwᵀ goes into a buffer and is transposed into dw
        // (trainer_conv bench, both cores: layer1.1 conv1 172 → 220, layer2.1 conv1 222 → 254,
        // layer2.0 conv1 234 → 243; with k = 256, layer3's, nothing gained).
        // Roofline's f32 kernels for long reductions (`long_on_own`) take dw = xᵀ·dy as it is
        // (layer1.0 conv1 305 → 391), but dwᵀ where k > depth and they take it: k's rows fill
        // their 14-row tiles better than depth's, and x's short rows are read in place where dy's
        // were packed (layer1.0 conv3, 64 → 256, 361–382 → 439–443; layer2.0 conv3, 128 → 512,
        // which they did not take as dw, 386–389 → 428–438).
        let (x_t, dy_r) = (
            Mat::transposed(x.as_ptr(), depth).cast::<T>(),
            Mat::rows(dy.as_ptr(), k).cast::<T>(),
        );
        let (dy_t, x_r) = (
            Mat::transposed(dy.as_ptr(), k).cast::<T>(),
            Mat::rows(x.as_ptr(), depth).cast::<T>(),
        );
        let swap = (k > depth && long_on_own(k, depth, per, dy_t, x_r))
            || (k <= 128
                && depth > k
                && products() == Products::Native
                && !long_on_own(depth, k, per, x_t, dy_r));
        ordered_sum_into(dw, parts, |p, acc| {
            // With more threads than rows a part (the last ones) can start past the end.
            let (r0, r1) = (p * per, ((p + 1) * per).min(rows));
            if r1 <= r0 {
                fill_uninit(acc, T::zero());
                return;
            }
            let (xp, dyp) = (x[r0 * depth..].as_ptr(), dy[r0 * k..].as_ptr());
            if swap {
                T::with_scratch(k * depth, |t| {
                    // SAFETY: dy rows [r0, r1) transposed k × n, x rows n × depth, t k × depth
                    // (written over).
                    unsafe {
                        gemm_mixed(
                            k,
                            depth,
                            r1 - r0,
                            t.as_mut_ptr(),
                            depth,
                            false,
                            Mat::transposed(dyp, k),
                            Mat::rows(xp, depth),
                            false,
                        )
                    };
                    transpose_into(t, k, depth, acc);
                });
                return;
            }
            // SAFETY: x rows [r0, r1) transposed depth × n, dy rows n × k, acc depth × k
            // (written over, not read).
            unsafe {
                gemm_mixed(
                    depth,
                    k,
                    r1 - r0,
                    acc.as_mut_ptr() as *mut T,
                    k,
                    false,
                    Mat::transposed(xp, depth),
                    Mat::rows(dyp, k),
                    false,
                )
            };
        });
        return;
    }
    let per_img = sh.oh() * sh.ow();
    // The reduction runs over the rows, across image boundaries: blocks of ~2 MiB of patch, so
    // that each GEMM reads and writes the depth × k gradient once for many rows (with blocks of
    // 512 KiB inside one image, the 9.4 MB gradient of a layer4 3×3 went through memory every
    // 28 rows). Measured (trainer_conv bench, bwd_filter): 0.5, 2, 4, 8, 16 MiB; 2 MiB is the
    // best or within noise of it on every 3×3 shape (layer4: 150–159 → 168–172 GFLOP/s).
    // A multiple of 32 rows: the reduction of each product, which AMX takes 32 at a time (a
    // layer4 3×3 block of 113 rows left 9 pairs of every product to the vector kernel).
    let mb = ((2 << 20) / (std::mem::size_of::<S>() * depth))
        .max(1)
        .next_multiple_of(32);
    // Images in a fixed number of contiguous groups, each summed in order, the groups in order.
    let parts = partitions().min(sh.n.max(1));
    let per = sh.n.div_ceil(parts);
    ordered_sum_into(dw, parts, |p, acc| {
        let (first, last) = (p * per * per_img, ((p + 1) * per).min(sh.n) * per_img);
        if last <= first {
            fill_uninit(acc, T::zero());
            return;
        }
        S::with_scratch(mb.min(last - first) * depth, |patch| {
            for r0 in (first..last).step_by(mb) {
                let rows = mb.min(last - r0);
                roofline_kernels::cpu::conv::im2col(x, sh, r0, rows, patch);
                let dyb = &dy[r0 * k..];
                // SAFETY: patchᵀ depth × rows, dy block rows × k, acc depth × k: written over
                // by the first block (never read before), added to by the others.
                unsafe {
                    gemm_mixed(
                        depth,
                        k,
                        rows,
                        acc.as_mut_ptr() as *mut T,
                        k,
                        r0 > first,
                        Mat::transposed(patch.as_ptr(), depth),
                        Mat::rows(dyb.as_ptr(), k),
                        false,
                    )
                };
            }
        })
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(super) fn shape(
        n: usize,
        c: usize,
        h: usize,
        k: usize,
        r: usize,
        stride: usize,
        pad: usize,
    ) -> ConvShape {
        ConvShape {
            n,
            c,
            h,
            w: h + 1,
            k,
            r,
            s: r,
            stride,
            pad,
        }
    }

    pub(super) fn direct(x: &[f64], w: &[f64], sh: &ConvShape) -> Vec<f64> {
        let mut y = vec![0.0; sh.output_len()];
        for n in 0..sh.n {
            for oy in 0..sh.oh() {
                for ox in 0..sh.ow() {
                    for k in 0..sh.k {
                        let mut s = 0.0;
                        for ky in 0..sh.r {
                            for kx in 0..sh.s {
                                let iy = (oy * sh.stride + ky) as isize - sh.pad as isize;
                                let ix = (ox * sh.stride + kx) as isize - sh.pad as isize;
                                if iy < 0 || ix < 0 || iy >= sh.h as isize || ix >= sh.w as isize {
                                    continue;
                                }
                                for c in 0..sh.c {
                                    s += x[((n * sh.h + iy as usize) * sh.w + ix as usize) * sh.c
                                        + c]
                                        * w[((ky * sh.s + kx) * sh.c + c) * sh.k + k];
                                }
                            }
                        }
                        y[((n * sh.oh() + oy) * sh.ow() + ox) * sh.k + k] = s;
                    }
                }
            }
        }
        y
    }

    pub(super) fn data(len: usize, seed: f64) -> Vec<f64> {
        (0..len)
            .map(|i| ((i as f64 + seed) * 0.618).sin())
            .collect()
    }

    /// Forward against a direct loop; both backward passes through the adjoint identities
    /// <conv(x,w), g> = <x, bwd_data(g,w)> = <w, bwd_filter(x,g)>; on two threads and on 16,
    /// more than some shapes have rows for (the filter gradient's last parts start past the
    /// end, as on a 16-core GPU host).
    #[test]
    fn all_three_passes_agree_with_direct_sums() {
        for threads in [2, 16] {
            rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap()
                .install(all_three_passes);
        }
    }

    fn all_three_passes() {
        for sh in [
            shape(2, 3, 7, 4, 3, 1, 1),
            shape(2, 5, 8, 3, 3, 2, 1),
            shape(3, 4, 5, 6, 1, 1, 0),
            // Depth above k: the filter gradient computed transposed.
            shape(3, 6, 5, 4, 1, 1, 0),
            // 18 rows: on 16 threads, parts of 2 rows, the last six past the end.
            shape(3, 4, 2, 6, 1, 1, 0),
            shape(3, 6, 2, 4, 1, 1, 0),
            shape(2, 4, 6, 5, 1, 2, 0),
            shape(1, 3, 9, 2, 7, 2, 3),
            // Small images, several to a task and block, the last task short.
            shape(9, 3, 4, 5, 3, 1, 1),
            shape(11, 2, 5, 3, 3, 2, 1),
        ] {
            let x = data(sh.input_len(), 0.1);
            let w = data(sh.weight_len(), 2.0);
            let g = data(sh.output_len(), 5.0);
            let mut y = vec![0.0; sh.output_len()];
            forward(&x, &w, &mut y, &sh);
            let want = direct(&x, &w, &sh);
            for (a, b) in y.iter().zip(&want) {
                assert!((a - b).abs() < 1e-10, "{}", sh.describe());
            }
            let mut dx = vec![0.0; sh.input_len()];
            backward_data(&g, &w, &mut dx, &sh);
            // Added to a gradient already there: the same sums, plus what was there.
            let prior = data(sh.input_len(), 7.0);
            let mut sum = prior.clone();
            backward_data_add(&g, &w, &mut sum, &sh);
            for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
                assert!(
                    (s - (p + d)).abs() < 1e-12,
                    "{}: {s} vs {p} + {d}",
                    sh.describe()
                );
            }
            let mut dw = vec![0.0; sh.weight_len()];
            backward_filter(&x, &g, &mut dw, &sh);
            let yg: f64 = y.iter().zip(&g).map(|(a, b)| a * b).sum();
            let xdx: f64 = x.iter().zip(&dx).map(|(a, b)| a * b).sum();
            let wdw: f64 = w.iter().zip(&dw).map(|(a, b)| a * b).sum();
            assert!(
                (yg - xdx).abs() < 1e-9 * yg.abs().max(1.0),
                "{}: {yg} {xdx}",
                sh.describe()
            );
            assert!(
                (yg - wdw).abs() < 1e-9 * yg.abs().max(1.0),
                "{}: {yg} {wdw}",
                sh.describe()
            );
        }
    }

    /// A 1×1 layer's f32 filter gradient over many pixels (each part of the rows a long
    /// reduction: roofline's f32 kernels where the CPU has AVX-512, A and B read in place or
    /// B packed: as dwᵀ = dyᵀ·x with more output channels than input ones, 64 and 200 against
    /// 48, x's rows in place; as dw = xᵀ·dy with fewer, 80 and 32 against 96, dy's rows packed
    /// and in place) against f64 sums; the forward and backward-data products over the pool
    /// (A's rows in place) too.
    #[test]
    fn pointwise_f32_products_over_many_pixels_agree_with_f64_sums() {
        for (c, k) in [(48, 64), (48, 200), (96, 80), (96, 32)] {
            // 16640 rows: at least 4096 a part on up to 4 threads.
            let sh = shape(4, c, 64, k, 1, 1, 0);
            let rows = sh.rows();
            let f = |v: Vec<f64>| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
            let (x, w, dy) = (
                f(data(sh.input_len(), 0.1)),
                f(data(sh.weight_len(), 0.2)),
                f(data(sh.output_len(), 0.3)),
            );
            let mut dw = vec![0f32; sh.weight_len()];
            backward_filter(&x, &dy, &mut dw, &sh);
            let mut y = vec![0f32; sh.output_len()];
            forward(&x, &w, &mut y, &sh);
            let mut dx = vec![0f32; sh.input_len()];
            backward_data(&dy, &w, &mut dx, &sh);
            let c = sh.c;
            // Each value against f64 sums: within a few f32 roundings of the terms' magnitude,
            // where one wrong or missing term moves it by about magnitude / terms.
            let check = |got: f32, terms: &mut dyn Iterator<Item = f64>, rel: f64, what: &str| {
                let (want, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
                let err = (got as f64 - want).abs();
                assert!(
                    err <= rel * size,
                    "k {k}: {what} {got}, want {want} (of {size})"
                );
            };
            for i in 0..c {
                for j in 0..k {
                    let mut terms = (0..rows).map(|p| x[p * c + i] as f64 * dy[p * k + j] as f64);
                    check(dw[i * k + j], &mut terms, 1e-5, &format!("dw[{i},{j}]"));
                }
            }
            for p in (0..rows).step_by(97) {
                for j in 0..k {
                    let mut terms = (0..c).map(|i| x[p * c + i] as f64 * w[i * k + j] as f64);
                    check(y[p * k + j], &mut terms, 2e-6, &format!("y[{p},{j}]"));
                }
                for i in 0..c {
                    let mut terms = (0..k).map(|j| dy[p * k + j] as f64 * w[i * k + j] as f64);
                    check(dx[p * c + i], &mut terms, 2e-6, &format!("dx[{p},{i}]"));
                }
            }
        }
    }

    /// f32 layers with filters of 2 MiB and more (packed once per call for the f32 kernels
    /// where the CPU has AVX-512, the gemm crate elsewhere): all three passes agree with f64
    /// sums within f32 rounding, the strided 3×3 and 1×1 (im2col) paths (3×3 stride 1 goes
    /// through Winograd: its own tests).
    #[test]
    fn f32_products_with_large_filters_agree_with_direct_sums() {
        for sh in [
            shape(3, 256, 6, 256, 3, 2, 1),
            shape(2, 1024, 3, 1024, 1, 2, 0),
        ] {
            let (depth, k) = (sh.depth(), sh.k);
            let w = data(sh.weight_len(), 1.0);
            let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
            let w32 = f(&w);
            // SAFETY: w32 outlives the Rhs.
            let rhs = unsafe { Rhs::new(depth, k, Mat::rows(w32.as_ptr(), k)) };
            let own = roofline_kernels::cpu::sgemm::F32Gemm::detect().is_some()
                && std::env::var_os("ROOFLINE_F32_GEMM").is_none();
            assert_eq!(rhs.is_packed(), own, "{}", sh.describe());
            // The f32 inputs, exactly, in f64 for the reference.
            let x32 = f(&data(sh.input_len(), 0.3));
            let g32 = f(&data(sh.output_len(), 4.0));
            let (x, gy): (Vec<f64>, Vec<f64>) = (
                x32.iter().map(|&a| a as f64).collect(),
                g32.iter().map(|&a| a as f64).collect(),
            );
            let w: Vec<f64> = w32.iter().map(|&a| a as f64).collect();
            let mut y = vec![0f32; sh.output_len()];
            let mut dx = vec![0f32; sh.input_len()];
            let mut dw = vec![0f32; sh.weight_len()];
            forward(&x32, &w32, &mut y, &sh);
            backward_data(&g32, &w32, &mut dx, &sh);
            backward_filter(&x32, &g32, &mut dw, &sh);
            let prior: Vec<f32> = (0..sh.input_len()).map(|i| (i % 7) as f32 - 3.0).collect();
            let mut sum = prior.clone();
            backward_data_add(&g32, &w32, &mut sum, &sh);
            let bound = 1e-6 * depth as f64;
            for (a, b) in y.iter().zip(direct(&x, &w, &sh)) {
                assert!((*a as f64 - b).abs() < bound, "{}: {a} {b}", sh.describe());
            }
            for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
                let err = (s - (p + d)).abs();
                assert!(
                    err <= 1e-5 * (p.abs() + d.abs()).max(1.0),
                    "{}: {s} {p} {d}",
                    sh.describe()
                );
            }
            // Backward data and filter by the adjoint identities, against the f64 forward.
            let yg: f64 = direct(&x, &w, &sh)
                .iter()
                .zip(&gy)
                .map(|(a, b)| a * b)
                .sum();
            let xdx: f64 = x.iter().zip(&dx).map(|(a, b)| a * *b as f64).sum();
            let wdw: f64 = w.iter().zip(&dw).map(|(a, b)| a * *b as f64).sum();
            for (what, v) in [("backward data", xdx), ("backward filter", wdw)] {
                assert!(
                    (yg - v).abs() < 1e-4 * yg.abs().max(1.0),
                    "{} {what}: {yg} {v}",
                    sh.describe()
                );
            }
        }
    }

    /// With bf16 products (the filter packed once per call), forward and backward-data of f32
    /// tensors agree with f64 sums within bf16 rounding, across image groups and ragged blocks.
    #[test]
    fn bf16_products_agree_with_direct_sums() {
        use crate::tensor::{set_products, Bf16Gemm, Products};
        let g = Bf16Gemm::detect().unwrap_or_else(|_| Bf16Gemm::portable());
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        set_products(&pool, Products::Bf16(g));
        for sh in [
            shape(9, 16, 4, 40, 3, 1, 1),
            shape(3, 8, 12, 33, 3, 2, 1),
            shape(4, 48, 6, 40, 1, 1, 0),
        ] {
            let x = data(sh.input_len(), 0.3);
            let w = data(sh.weight_len(), 1.0);
            let gy = data(sh.output_len(), 4.0);
            let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
            let (x32, w32, g32) = (f(&x), f(&w), f(&gy));
            let (mut y, mut dx) = (vec![0f32; sh.output_len()], vec![0f32; sh.input_len()]);
            let prior: Vec<f32> = (0..sh.input_len()).map(|i| (i % 7) as f32 - 3.0).collect();
            let mut sum = prior.clone();
            pool.install(|| {
                forward(&x32, &w32, &mut y, &sh);
                backward_data(&g32, &w32, &mut dx, &sh);
                backward_data_add(&g32, &w32, &mut sum, &sh);
            });
            // The sum in the products' f32 accumulators: within f32 rounding of prior + dx.
            for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
                assert!(
                    (s - (p + d)).abs() <= 1e-5 * (p.abs() + d.abs()).max(1.0),
                    "{}: {s} vs {p} + {d}",
                    sh.describe()
                );
            }
            let want = direct(&x, &w, &sh);
            for (a, b) in y.iter().zip(&want) {
                assert!(
                    (*a as f64 - b).abs() < 0.02 * (sh.depth() as f64).sqrt(),
                    "{}",
                    sh.describe()
                );
            }
            // Backward-data through the adjoint identity <conv(x,w), g> = <x, bwd_data(g,w)>.
            let yg: f64 = want.iter().zip(&gy).map(|(a, b)| a * b).sum();
            let xdx: f64 = x.iter().zip(&dx).map(|(a, b)| a * *b as f64).sum();
            assert!(
                (yg - xdx).abs() < 1e-2 * yg.abs().max(1.0),
                "{}: {yg} {xdx}",
                sh.describe()
            );
        }
    }
}
