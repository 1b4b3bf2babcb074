//! Convolution forward, backward-data and backward-filter on NHWC tensors with RSCK filters (the
//! layout of `roofline_kernels::cpu::conv`: a filter is a `r·s·c × k` matrix). 1×1 stride-1
//! convolutions are single GEMMs; the others go through im2col in cache-sized blocks of output
//! rows, whole images per task (so that backward-data's col2im never races), the filter prepared
//! once per call (packed once in bf16). 3×3 stride-1 layers go through Winograd's algorithm
//! instead (`winograd`): F(4×4, 3×3) with f32 (or f64) products, F(2×2, 3×3) with bf16 ones
//! where it is faster (`winograd::half::applies_to`).

pub mod rounding;
mod taps;
pub mod winograd;

use crate::tensor::{
    as_uninit, bf16, fill_uninit, gemm_mixed, gemm_rhs_first, long_on_own, ordered_sum_into,
    partitions, products, round_bf16, Float, Lhs, Mat, Products, Rhs,
};
use rayon::prelude::*;
use roofline_kernels::cpu::bf16::Bf16Gemm;
pub use roofline_kernels::cpu::conv::ConvShape;
use std::mem::MaybeUninit;

/// The fewest elements of a filter gradient (`depth × k`) whose products take B packed first
/// (`rhs_first`): 2 MiB of f32, twice L2 on the machines measured.
const RHS_FIRST_MIN: usize = 1 << 19;

/// Whether a filter gradient's f32 products take B (the output gradient) packed first
/// (`gemm_rhs_first`, roofline's f32 kernels): a gradient larger than L2, with more rows
/// (depth) than columns (k). Those kernels prefetch each next tile of the gradient while they
/// multiply, where the gemm crate waited on memory for it (trainer_conv, bwd_filter,
/// interleaved twice: layer4.0's strided 3×3, 4608 × 512, 321–337 → 418–428 GFLOP/s,
/// layer3.0's, 2304 × 256, 398–409 → 434–437, layer4.1 conv1, 2048 × 512, 382–388 →
/// 429–432). Wider gradients ran slower on them (layer3.0 conv3, 256 × 1024, 411–413 →
/// 317–318; layer4.0 conv3, 512 × 2048, 433–450 → 385–387), and so did layer2.0's strided
/// 3×3, 1152 × 128, which fits L2 (402–410 → 372–373). bf16 products keep their own path.
fn rhs_first(depth: usize, k: usize) -> bool {
    depth * k > RHS_FIRST_MIN && depth > k
}

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

/// Whether 3×3 stride-1 layers go through Winograd's algorithm (F(4×4, 3×3) with products in
/// their own type, F(2×2, 3×3) with bf16 ones where it pays): yes, unless
/// `ROOFLINE_CONV=im2col`.
pub fn winograd_enabled() -> bool {
    !im2col_forced()
}

/// `x` as a slice of `T` where a convolution of this shape goes through Winograd's F(4×4, 3×3):
/// a 3×3 stride-1 layer whose operands are stored in `T` and whose products are in `T` (bf16
/// products: `half_winograd`), unless `ROOFLINE_CONV=im2col` (the A/B switch).
fn winograd_operand<'a, T: Float, S: 'static>(sh: &ConvShape, x: &'a [S]) -> Option<&'a [T]> {
    let same = std::any::TypeId::of::<S>() == std::any::TypeId::of::<T>();
    (same && winograd_enabled() && products() == Products::Native && winograd::applies(sh))
        // SAFETY: S is T.
        .then(|| unsafe { &*(x as *const [S] as *const [T]) })
}

/// The bf16 products where a pass of a convolution of this shape goes through Winograd's
/// F(2×2, 3×3) (`winograd::half`): a 3×3 stride-1 layer of f32 tensors whose products are bf16
/// and not on AMX (`half::pays_with`), on images the tiles cover well (`half::applies_to`; for
/// the filter gradient, `filter`, with enough channels: `half::filter_applies_to`), unless
/// `ROOFLINE_CONV=im2col`.
fn half_winograd<T: 'static>(sh: &ConvShape, filter: bool) -> Option<Bf16Gemm> {
    let shape = if filter {
        winograd::half::filter_applies_to(sh.h, sh.w, sh.c, sh.k)
    } else {
        winograd::half::applies_to(sh.h, sh.w)
    };
    match products() {
        Products::Bf16(g)
            if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
                && winograd::half::pays_with(g.path())
                && winograd_enabled()
                && winograd::applies(sh)
                && shape =>
        {
            Some(g)
        }
        _ => None,
    }
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
    if let Some((r, _plain)) = rounding::take::<T, S, T>() {
        let (xo, wo) = (
            r.operand(rounding::as_f32(x)),
            r.operand(rounding::as_f32(w)),
        );
        let mut out = vec![0.0f32; y.len()];
        forward(&xo, &wo, &mut out, sh);
        r.perturb(&mut out, sh.r * sh.s * sh.c, rounding::salt(1, &xo));
        r.stored(&mut out);
        return write_f32(y, &out);
    }
    if let Some(x) = winograd_operand::<T, S>(sh, x) {
        return winograd::forward(x, w, y, sh);
    }
    if let Some(g) = half_winograd::<T>(sh, false) {
        return winograd::half::forward(&g, x, w, y, sh);
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
    // SAFETY (the product): patch rows × depth, the block of y rows × k.
    im2col_forward(x, w, y, sh, |wb, patch, rows, yb| unsafe {
        S::gemm_rhs(
            wb,
            rows,
            yb.as_mut_ptr() as *mut T,
            k,
            false,
            Mat::rows(patch.as_ptr(), depth),
            false,
        )
    });
}

/// The im2col forward pass: for each block of output rows (`tiling`), the patch, then
/// `product(w, patch, rows, y block)` writes the block (`rows × k`) of `y`.
fn im2col_forward<T: Float, S: Lhs<T>, O: Send>(
    x: &[S],
    w: &[T],
    y: &mut [MaybeUninit<O>],
    sh: &ConvShape,
    product: impl Fn(&Rhs<T>, &[S], usize, &mut [MaybeUninit<O>]) + Sync,
) {
    let (depth, k, per_img) = (sh.depth(), sh.k, sh.oh() * sh.ow());
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
                    product(&wb, patch, rows, &mut y_t[r0 * k..(r0 + rows) * k]);
                }
            })
        });
}

/// `forward_into` with the output rounded to bf16 (a batch norm's input in bf16 training: f32
/// layers with bf16 products, `half_activations`), so that memory sees the output in bf16
/// only: F(2×2, 3×3)'s output transform rounds as it stores; a 1×1 layer's blocks of rows of
/// the product, and the im2col layers' (strided, projections, 3×3 on small images), go into
/// f32 scratch and are rounded there (the filter packed once). With bf16 products those are
/// `forward_into`'s paths, so the bits are its output's rounded.
pub fn forward_half<T: Float, S: Lhs<T>>(
    x: &[S],
    w: &[T],
    y: &mut [MaybeUninit<bf16>],
    sh: &ConvShape,
) {
    check_lengths::<T>(sh, x.len(), w.len(), y.len());
    if let Some(g) = half_winograd::<T>(sh, false) {
        return winograd::half::forward_half(&g, x, w, y, sh);
    }
    let (depth, k) = (sh.depth(), sh.k);
    if !pointwise(sh) {
        return im2col_forward(x, w, y, sh, |wb, patch, rows, yb| {
            product_rounded(wb, patch, rows, depth, yb)
        });
    }
    // SAFETY: w is depth × k, alive and unchanged while wb is used.
    let wb = unsafe { Rhs::new(depth, k, Mat::rows(w.as_ptr(), k)) };
    let mb = block_rows::<T>(k);
    y.par_chunks_mut(mb * k)
        .enumerate()
        .for_each(|(t, yb)| product_rounded(&wb, &x[t * mb * depth..], yb.len() / k, depth, yb));
}

/// `yb` (`rows × k`) = the first `rows` rows of `a` (`depth` wide) times `wb` (`depth × k`),
/// the product into f32 scratch, then rounded to bf16.
fn product_rounded<T: Float, S: Lhs<T>>(
    wb: &Rhs<T>,
    a: &[S],
    rows: usize,
    depth: usize,
    yb: &mut [MaybeUninit<bf16>],
) {
    let k = yb.len() / rows.max(1);
    assert_eq!(yb.len(), rows * k, "product_rounded: shapes");
    scratch_product(wb, a, rows, depth, k, |buf| round_bf16(buf, yb))
}

/// `finish` given the first `rows` rows of `a` (`depth` wide) times `wb` (`depth × k`), made
/// in this thread's scratch in `T` (`rows × k`, row-major): a product kept in bf16, rounded
/// (or added and rounded) once from its sum in `T`.
fn scratch_product<T: Float, S: Lhs<T>, R>(
    wb: &Rhs<T>,
    a: &[S],
    rows: usize,
    depth: usize,
    k: usize,
    finish: impl FnOnce(&mut [T]) -> R,
) -> R {
    assert!(a.len() >= rows * depth, "scratch_product: shapes");
    T::with_scratch(rows * k, |buf| {
        // SAFETY: a holds rows × depth (checked), wb is depth × k, buf rows × k.
        unsafe {
            S::gemm_rhs(
                wb,
                rows,
                buf.as_mut_ptr(),
                k,
                false,
                Mat::rows(a.as_ptr(), depth),
                false,
            )
        };
        finish(buf)
    })
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

/// wᵀ (k × depth) as the backward-data products' right-hand side: packed in bf16 straight
/// from w's strides; for the native products, a row-major copy, kept here (the `Rhs` points
/// into it).
struct Transposed<T> {
    rhs: Rhs<T>,
    _copy: Vec<T>,
}

/// # Safety
/// `w` (depth × k) is alive and unchanged while the result is used.
unsafe fn transposed_rhs<T: Float>(w: &[T], depth: usize, k: usize) -> Transposed<T> {
    // SAFETY: this function's contract.
    let packed = unsafe { Rhs::new(k, depth, Mat::transposed(w.as_ptr(), k)) };
    if packed.is_packed() {
        return Transposed {
            rhs: packed,
            _copy: Vec::new(),
        };
    }
    let copy = transpose(w, depth, k);
    // SAFETY: the copy's buffer moves with it, unchanged, and lives as long as the Rhs.
    let rhs = unsafe { Rhs::new(k, depth, Mat::rows(copy.as_ptr(), depth)) };
    Transposed { rhs, _copy: copy }
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
    if let Some(out) = emulated_data(dy, w, sh) {
        return write_f32(dx, &out);
    }
    // SAFETY: without accumulation nothing of dx is read before it is written.
    unsafe { backward_data_impl(dy, w, dx, sh, false) }
}

/// The input gradient of a convolution emulating a GPU's rounding (`rounding::take`), or None
/// where no rounding is in force.
fn emulated_data<T: Float, D: Lhs<T>>(dy: &[D], w: &[T], sh: &ConvShape) -> Option<Vec<f32>> {
    let (r, _plain) = rounding::take::<T, D, T>()?;
    let (dyo, wo) = (
        r.operand(rounding::as_f32(dy)),
        r.operand(rounding::as_f32(w)),
    );
    let mut out = vec![0.0f32; sh.input_len()];
    backward_data(&dyo, &wo, &mut out, sh);
    let terms = (sh.r * sh.s * sh.k).div_ceil(sh.stride * sh.stride);
    r.perturb(&mut out, terms, rounding::salt(3, &dyo));
    r.stored(&mut out);
    Some(out)
}

/// `v` (f32 values) into `y`, whose element type `rounding::take` found to be f32.
fn write_f32<T: 'static>(y: &mut [MaybeUninit<T>], v: &[f32]) {
    assert_eq!(std::any::TypeId::of::<T>(), std::any::TypeId::of::<f32>());
    assert_eq!(y.len(), v.len());
    // SAFETY: T is f32 (asserted), MaybeUninit<f32> is laid out as f32.
    let y = unsafe { &mut *(y as *mut [MaybeUninit<T>] as *mut [MaybeUninit<f32>]) };
    for (d, s) in y.iter_mut().zip(v) {
        d.write(*s);
    }
}

/// `dx += ∂L/∂x` from `dy`: the input gradient added to one already there (a residual block's
/// shortcut gradient) by the products themselves, where a separate sum would read both
/// tensors and write one more time.
pub fn backward_data_add<T: Float, D: Lhs<T>>(dy: &[D], w: &[T], dx: &mut [T], sh: &ConvShape) {
    // Emulating a GPU's f32 activations: the gradient written in the convolution's type, then
    // added in f32.
    if let Some(out) = emulated_data(dy, w, sh) {
        let dx = rounding::as_f32_mut(dx);
        dx.iter_mut().zip(&out).for_each(|(a, b)| *a += b);
        return;
    }
    // SAFETY: dx is initialised, and the products and col2im write only computed values.
    unsafe { backward_data_impl(dy, w, as_uninit(dx), sh, true) }
}

/// `backward_data_add` into an input gradient kept in bf16 (a residual block's shortcut
/// gradient in bf16 training): each block of rows of the products goes into f32 scratch, the
/// kept value is added there and the sum rounded once — half the bytes of the f32 gradient's
/// read and write, the sum as the f32 products' (`old + new` in f32), rounded.
pub fn backward_data_add_half<T: Float, D: Lhs<T>>(
    dy: &[D],
    w: &[T],
    dx: &mut [bf16],
    sh: &ConvShape,
) {
    check_lengths::<T>(sh, dx.len(), w.len(), dy.len());
    let (depth, k) = (sh.depth(), sh.k);
    if !pointwise(sh) {
        // Not a bottleneck's first convolution: the gradient whole, then added.
        let mut full = vec![T::zero(); dx.len()];
        backward_data(dy, w, &mut full, sh);
        full.par_chunks_mut(1 << 14)
            .zip(dx.par_chunks_mut(1 << 14))
            .for_each(|(s, d)| add_round(s, d));
        return;
    }
    // SAFETY: w is alive and unchanged while wt is used.
    let wt = unsafe { transposed_rhs(w, depth, k) };
    let wb = &wt.rhs;
    let mb = block_rows::<T>(depth);
    dx.par_chunks_mut(mb * depth)
        .enumerate()
        .for_each(|(t, dxb)| {
            let rows = dxb.len() / depth;
            let dyb = &dy[t * mb * k..];
            scratch_product(wb, dyb, rows, k, depth, |buf| add_round(buf, dxb))
        });
}

/// `dx = round(dx + sum)`, the sum in f32 (`sum` is overwritten).
fn add_round<T: Float>(sum: &mut [T], dx: &mut [bf16]) {
    crate::tensor::simd(
        #[inline(always)]
        || {
            for (s, d) in sum.iter_mut().zip(dx.iter()) {
                *s = Lhs::<T>::widen(*d) + *s;
            }
        },
    );
    // SAFETY: round_bf16 writes only values.
    round_bf16(sum, unsafe { as_uninit(dx) });
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
    if let Some(g) = half_winograd::<T>(sh, false) {
        // SAFETY: this function's contract.
        return unsafe { winograd::half::backward_data(&g, dy, w, dx, sh, accumulate) };
    }
    let (depth, k) = (sh.depth(), sh.k);
    // SAFETY: w is alive and unchanged while wt is used.
    let wt = unsafe { transposed_rhs(w, depth, k) };
    let wb = &wt.rhs;
    if pointwise(sh) {
        // SAFETY: dy rows × k, wᵀ k × c (w is c × k), dx rows × c.
        unsafe {
            D::gemm_rhs(
                wb,
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
                            wb,
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
    if let Some((r, _plain)) = rounding::take::<T, S, D>() {
        let (xo, dyo) = (
            r.operand(rounding::as_f32(x)),
            r.operand(rounding::as_f32(dy)),
        );
        let out = rounding::as_f32_mut(dw);
        backward_filter(&xo, &dyo, out, sh);
        r.perturb(out, sh.n * sh.oh() * sh.ow(), rounding::salt(2, &dyo));
        r.stored(out);
        return;
    }
    if let (Some(x), Some(dy)) = (
        winograd_operand::<T, S>(sh, x),
        winograd_operand::<T, D>(sh, dy),
    ) {
        return winograd::backward_filter(x, dy, dw, sh);
    }
    if let Some(g) = half_winograd::<T>(sh, true) {
        return winograd::half::backward_filter(&g, x, dy, dw, sh);
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
        // Whether the long-reduction kernels take dw = xᵀ·dy as it is.
        let as_is = long_on_own(depth, k, per, x_t, dy_r);
        let swap = (k > depth && long_on_own(k, depth, per, dy_t, x_r))
            || (k <= 128 && depth > k && products() == Products::Native && !as_is);
        // Not where the long-reduction kernels take it as it is.
        let first = rhs_first(depth, k) && !as_is;
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
            let (a, b) = (Mat::transposed(xp, depth), Mat::rows(dyp, k));
            let acc_p = acc.as_mut_ptr() as *mut T;
            // SAFETY: x rows [r0, r1) transposed depth × n, dy rows n × k, acc depth × k
            // (written over, not read).
            if first && unsafe { gemm_rhs_first(depth, k, r1 - r0, acc_p, k, false, a, b) } {
                return;
            }
            // SAFETY: as above.
            unsafe { gemm_mixed(depth, k, r1 - r0, acc_p, k, false, a, b, false) };
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
    let rhs_first = rhs_first(depth, k);
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
                let (a, b) = (
                    Mat::transposed(patch.as_ptr(), depth),
                    Mat::rows(dyb.as_ptr(), k),
                );
                let acc_p = acc.as_mut_ptr() as *mut T;
                // SAFETY: patchᵀ depth × rows, dy block rows × k, acc depth × k: written over
                // by the first block (never read before), added to by the others.
                if rhs_first
                    && unsafe { gemm_rhs_first(depth, k, rows, acc_p, k, r0 > first, a, b) }
                {
                    continue;
                }
                // SAFETY: as above.
                unsafe { gemm_mixed(depth, k, rows, acc_p, k, r0 > first, a, b, false) };
            }
        })
    });
}

#[cfg(test)]
mod tests;
