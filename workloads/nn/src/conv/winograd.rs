//! 3×3 stride-1 convolutions by Winograd's minimal filtering F(4×4, 3×3) (Lavin & Gray, "Fast
//! Algorithms for Convolutional Neural Networks", 2016): each 4×4 block of output ("tile") is
//! `Aᵀ [(G g Gᵀ) ⊙ (Bᵀ d B)] A` for the 6×6 input block `d` around it, so that the products
//! over channels become 36 independent GEMMs (one per point ξ of the 6×6 transform domain) of
//! tiles × c by c × k: 36 multiplies per 16 outputs and channel pair where the direct sum
//! takes 144, at the cost of the transforms (memory passes over the data) and of whole tiles
//! on images whose side is not a multiple of 4 (14 and 7 pad to 16 and 8).
//!
//! The three passes share the transforms: the forward pass is a linear map of the input and of
//! the filter, and both backward passes are its exact adjoints (the transposed transforms in
//! reverse order), so that in exact arithmetic they are the convolution's gradients, and in
//! floating point they differ from the direct sums by the transforms' rounding (a few units in
//! the last place of f32 times the transform's constants: the tests bound it).
//!
//! Layouts: the input `x` NHWC, the filter RSCK (`3·3·c × k`), the transformed operands
//! ξ-major: `V[ξ][tile][c]`, `U[ξ][c][k]`, `M[ξ][tile][k]`. Every tile is transformed by one
//! thread, every GEMM run by one thread (the 36 spread over the pool), and each sum in a fixed
//! order: the results do not depend on the thread count.
//!
//! Layers whose transformed filter is small (layer1's) go image by image in blocks of tiles
//! that stay in cache instead (`blocked`): the transformed tensors never reach memory.

mod blocked;
pub mod half;
mod transforms;

use super::ConvShape;
use crate::tensor::{fill_uninit, native_gemm, simd, Float, Mat};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use transforms::{Minimal, F4};

/// Points of the transform domain (6 × 6).
const XI: usize = 36;
/// Channels transformed together: one AVX-512 vector of f32.
const LANES: usize = 16;

/// Whether a convolution of this shape is one this module computes: 3×3, stride 1, padding 1
/// (the shape of ResNet's inner 3×3 layers but the first of layers 2–4, strided).
pub fn applies(sh: &ConvShape) -> bool {
    sh.r == sh.s && applies_to(sh.r, sh.stride, sh.pad) && sh.valid()
}

/// `applies` for a square `kernel × kernel` window moved by `stride` with `pad` (the rule
/// `place` also reads, from the model's layer list).
pub fn applies_to(kernel: usize, stride: usize, pad: usize) -> bool {
    kernel == 3 && stride == 1 && pad == 1
}

/// `R` vectors of `N` channels: a row or a column of a tile.
type Vecs<T, const N: usize, const R: usize> = [[T; N]; R];
/// A tile of `N` channels: `R × R` points.
type Tile<T, const N: usize, const R: usize> = [Vecs<T, N, R>; R];

/// `f` on every column of a `Q × Q` tile, then on every row: `F d Fᵀ` for the matrix `F` of
/// `f` (`P × Q`).
#[inline(always)]
fn two_d<T: Float, const N: usize, const Q: usize, const P: usize>(
    d: &Tile<T, N, Q>,
    f: impl Fn(&Vecs<T, N, Q>) -> Vecs<T, N, P>,
) -> Tile<T, N, P> {
    let mut cols = [[[T::zero(); N]; Q]; P];
    for j in 0..Q {
        let mut col = [[T::zero(); N]; Q];
        for i in 0..Q {
            col[i] = d[i][j];
        }
        let t = f(&col);
        for i in 0..P {
            cols[i][j] = t[i];
        }
    }
    let mut out = [[[T::zero(); N]; P]; P];
    for i in 0..P {
        out[i] = f(&cols[i]);
    }
    out
}

/// The tiles of a shape: `th × tw` per image, `m × m` outputs each (the last row and column of
/// tiles cut where the image ends).
#[derive(Clone, Copy)]
struct Grid {
    n: usize,
    h: usize,
    w: usize,
    m: usize,
    th: usize,
    tw: usize,
}

impl Grid {
    /// The tiles of `m × m` outputs covering `sh`'s images.
    fn new(sh: &ConvShape, m: usize) -> Grid {
        Grid {
            n: sh.n,
            h: sh.h,
            w: sh.w,
            m,
            th: sh.h.div_ceil(m),
            tw: sh.w.div_ceil(m),
        }
    }
    fn per_image(&self) -> usize {
        self.th * self.tw
    }
    fn tiles(&self) -> usize {
        self.n * self.per_image()
    }
    /// Tile `t`'s image and the top-left output pixel.
    fn origin(&self, t: usize) -> (usize, usize, usize) {
        let (img, r) = (t / self.per_image(), t % self.per_image());
        (img, self.m * (r / self.tw), self.m * (r % self.tw))
    }
}

/// Calls `f(c0, N)` over `c` channels in blocks of `LANES`, the rest one at a time, each
/// block through the lane count it needs.
macro_rules! by_lanes {
    ($c:expr, |$c0:ident, $n:ident| $body:block) => {{
        let full = $c / LANES * LANES;
        for $c0 in (0..full).step_by(LANES) {
            const $n: usize = LANES;
            $body
        }
        for $c0 in full..$c {
            const $n: usize = 1;
            $body
        }
    }};
}

/// A raw pointer the transform tasks write through, each to places no other task writes.
#[derive(Clone, Copy)]
struct Out<T>(*mut T);
// SAFETY: the tasks write disjoint elements (see each use).
unsafe impl<T> Send for Out<T> {}
unsafe impl<T> Sync for Out<T> {}

impl<T> Out<T> {
    /// The place `i` elements on.
    ///
    /// # Safety
    /// As `pointer::add`.
    #[inline(always)]
    unsafe fn at(self, i: usize) -> *mut T {
        // SAFETY: the caller's contract.
        unsafe { self.0.add(i) }
    }
}

/// Items (tiles, or filter rows) per transform task: enough to amortise the task, small
/// enough to balance.
const PER_TASK: usize = 32;

/// Runs `f(i)` for every `i < count` (a tile, or a filter row), in tasks of `PER_TASK` spread
/// over the pool, compiled for the CPU's widest vectors.
fn in_tasks(count: usize, f: impl Fn(usize) + Sync) {
    (0..count.div_ceil(PER_TASK))
        .into_par_iter()
        .for_each(|task| {
            simd(
                #[inline(always)]
                || {
                    for i in task * PER_TASK..((task + 1) * PER_TASK).min(count) {
                        f(i)
                    }
                },
            )
        });
}

/// Writes the points of a transformed tile to `out[(ξ · tiles + t) · ld + c0 ..]`.
///
/// # Safety
/// Those places are inside `out`'s allocation and written by no other thread.
#[inline(always)]
unsafe fn scatter_points<T: Float, const N: usize, const R: usize>(
    tile: &Tile<T, N, R>,
    out: Out<T>,
    (tiles, t, ld, c0): (usize, usize, usize, usize),
) {
    for (xi, lanes) in tile.iter().flatten().enumerate() {
        // SAFETY: the caller's contract.
        let p = unsafe { out.at((xi * tiles + t) * ld + c0) };
        unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr(), p, N) };
    }
}

/// The points of tile `t` read from `src[(ξ · tiles + t) · ld + c0 ..]`.
#[inline(always)]
fn gather_points<T: Float, const N: usize, const R: usize>(
    src: &[T],
    (tiles, t, ld, c0): (usize, usize, usize, usize),
) -> Tile<T, N, R> {
    let mut tile = [[[T::zero(); N]; R]; R];
    for (xi, lanes) in tile.iter_mut().flatten().enumerate() {
        let at = (xi * tiles + t) * ld + c0;
        lanes.copy_from_slice(&src[at..at + N]);
    }
    tile
}

/// `V[ξ][t][c] = (Bᵀ d B)[ξ]` for every tile `t` of `x` (NHWC, `c` channels; zero outside).
fn input_transform<T: Float>(x: &[T], g: Grid, c: usize, v: &mut [T]) {
    let tiles = g.tiles();
    assert_eq!(v.len(), XI * tiles * c);
    let out = Out(v.as_mut_ptr());
    // SAFETY: tile t's points, inside v (length checked), written by this task alone.
    in_tasks(
        tiles,
        #[inline(always)]
        |t| unsafe { input_tile::<T, F4, 6, 4>(x, g, c, t, out, (tiles, t)) },
    );
}

/// Tile `t`'s input transform, written as tile `slot` of `count` (`out[(ξ · count + slot) · c ..]`).
///
/// # Safety
/// Those places are inside `out`'s allocation and written by no other thread.
#[inline(always)]
unsafe fn input_tile<T: Float, F: Minimal<A, M>, const A: usize, const M: usize>(
    x: &[T],
    g: Grid,
    c: usize,
    t: usize,
    out: Out<T>,
    (count, slot): (usize, usize),
) {
    let (img, oy, ox) = g.origin(t);
    by_lanes!(c, |c0, N| {
        let mut d = [[[T::zero(); N]; A]; A];
        for (a, row) in d.iter_mut().enumerate() {
            let iy = oy + a;
            if iy == 0 || iy > g.h {
                continue;
            }
            for (bb, lanes) in row.iter_mut().enumerate() {
                let ix = ox + bb;
                if ix == 0 || ix > g.w {
                    continue;
                }
                let i = ((img * g.h + iy - 1) * g.w + ix - 1) * c + c0;
                lanes.copy_from_slice(&x[i..i + N]);
            }
        }
        // SAFETY: the caller's contract.
        unsafe { scatter_points(&two_d(&d, F::bt), out, (count, slot, c, c0)) };
    });
}

/// `dM[ξ][t][k] = (A dY Aᵀ)[ξ]` for every tile of the output gradient `dy` (NHWC, `k`
/// channels; zero past the image): the adjoint of the output transform.
fn output_gradient_transform<T: Float>(dy: &[T], g: Grid, k: usize, dm: &mut [T]) {
    let tiles = g.tiles();
    assert_eq!(dm.len(), XI * tiles * k);
    let out = Out(dm.as_mut_ptr());
    // SAFETY: as in input_transform.
    in_tasks(
        tiles,
        #[inline(always)]
        |t| unsafe { output_gradient_tile::<T, F4, 6, 4>(dy, g, k, t, out, (tiles, t)) },
    );
}

/// Tile `t`'s output-gradient transform, written as tile `slot` of `count`.
///
/// # Safety
/// As `input_tile`.
#[inline(always)]
unsafe fn output_gradient_tile<T: Float, F: Minimal<A, M>, const A: usize, const M: usize>(
    dy: &[T],
    g: Grid,
    k: usize,
    t: usize,
    out: Out<T>,
    (count, slot): (usize, usize),
) {
    let (img, oy, ox) = g.origin(t);
    by_lanes!(k, |k0, N| {
        let mut d = [[[T::zero(); N]; M]; M];
        for (i, row) in d.iter_mut().enumerate().take(g.h - oy) {
            for (j, lanes) in row.iter_mut().enumerate().take(g.w - ox) {
                let p = ((img * g.h + oy + i) * g.w + ox + j) * k + k0;
                lanes.copy_from_slice(&dy[p..p + N]);
            }
        }
        // SAFETY: the caller's contract.
        unsafe { scatter_points(&two_d(&d, F::a), out, (count, slot, k, k0)) };
    });
}

/// `y = Aᵀ M A` for every tile, the parts inside the image written (every output belongs to
/// exactly one tile).
fn output_transform<T: Float>(m: &[T], g: Grid, k: usize, y: &mut [MaybeUninit<T>]) {
    let tiles = g.tiles();
    assert_eq!(m.len(), XI * tiles * k);
    assert_eq!(y.len(), g.n * g.h * g.w * k);
    let out = Out(y.as_mut_ptr() as *mut T);
    // SAFETY: inside y (length checked); each output belongs to one tile alone.
    in_tasks(
        tiles,
        #[inline(always)]
        |t| unsafe { output_tile::<T, F4, 6, 4>(m, (tiles, t), g, k, t, out) },
    );
}

/// Tile `t` of `y` from tile `slot` of `count` in `m`: its outputs inside the image.
///
/// # Safety
/// `out` is `y`'s allocation (`g`'s outputs, `k` channels), tile `t`'s written by no other
/// thread.
#[inline(always)]
unsafe fn output_tile<T: Float, F: Minimal<A, M>, const A: usize, const M: usize>(
    m: &[T],
    (count, slot): (usize, usize),
    g: Grid,
    k: usize,
    t: usize,
    out: Out<T>,
) {
    let (img, oy, ox) = g.origin(t);
    by_lanes!(k, |k0, N| {
        let ty = two_d(&gather_points::<T, N, A>(m, (count, slot, k, k0)), F::at);
        for (i, row) in ty.iter().enumerate().take(g.h - oy) {
            for (j, lanes) in row.iter().enumerate().take(g.w - ox) {
                let p = ((img * g.h + oy + i) * g.w + ox + j) * k + k0;
                // SAFETY: the caller's contract.
                unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr(), out.at(p), N) };
            }
        }
    });
}

/// `dx += B dV Bᵀ` for every tile, the parts inside the image: the adjoint of the input
/// transform. Neighbouring tiles' input blocks overlap (by two pixels), so an image's tiles
/// are added by one task, in order.
fn input_gradient_transform<T: Float>(dv: &[T], g: Grid, c: usize, dx: &mut [T]) {
    let tiles = g.tiles();
    assert_eq!(dv.len(), XI * tiles * c);
    dx.par_chunks_mut(g.h * g.w * c)
        .enumerate()
        .for_each(|(img, dx_img)| {
            simd(
                #[inline(always)]
                || {
                    for t in img * g.per_image()..(img + 1) * g.per_image() {
                        input_gradient_tile::<T, F4, 6, 4>(dv, (tiles, t), g, c, t, dx_img);
                    }
                },
            )
        });
}

/// Adds tile `t`'s input gradient, from tile `slot` of `count` in `dv`, into its image's
/// gradient `dx_img`.
#[inline(always)]
fn input_gradient_tile<T: Float, F: Minimal<A, M>, const A: usize, const M: usize>(
    dv: &[T],
    (count, slot): (usize, usize),
    g: Grid,
    c: usize,
    t: usize,
    dx_img: &mut [T],
) {
    let (_, oy, ox) = g.origin(t);
    by_lanes!(c, |c0, N| {
        let dd = two_d(&gather_points::<T, N, A>(dv, (count, slot, c, c0)), F::b);
        for (a, row) in dd.iter().enumerate() {
            let iy = oy + a;
            if iy == 0 || iy > g.h {
                continue;
            }
            for (bb, lanes) in row.iter().enumerate() {
                let ix = ox + bb;
                if ix == 0 || ix > g.w {
                    continue;
                }
                let p = ((iy - 1) * g.w + ix - 1) * c + c0;
                for (d, &e) in dx_img[p..p + N].iter_mut().zip(lanes) {
                    *d += e;
                }
            }
        }
    });
}

/// How a transformed tensor (`rows` rows of `len` values at each of `points` points) is laid
/// out: point by point (`[ξ][row]`: each point's matrix dense, `len` its leading dimension), or
/// row by row (`[row][ξ]`: a row's points together, a transform's writes contiguous; each
/// point's matrix at `ξ · len` with leading dimension `points · len`).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Points {
    Major,
    Interleaved,
}

impl Points {
    /// `(count, slot)` for `scatter_points` and `gather_points`: where row `row` of `rows` goes.
    fn row(self, points: usize, rows: usize, row: usize) -> (usize, usize) {
        match self {
            Points::Major => (rows, row),
            Points::Interleaved => (1, row * points),
        }
    }
}

/// `U[ξ][c][k] = (G g Gᵀ)[ξ]` for the RSCK filter `w` (laid out by `layout`).
fn filter_transform<T: Float, F: Minimal<A, M>, const A: usize, const M: usize>(
    w: &[T],
    c: usize,
    k: usize,
    u: &mut [T],
    layout: Points,
) {
    assert_eq!(w.len(), 9 * c * k);
    assert_eq!(u.len(), A * A * c * k);
    let out = Out(u.as_mut_ptr());
    in_tasks(
        c,
        #[inline(always)]
        |ci| {
            by_lanes!(k, |k0, N| {
                let mut d = [[[T::zero(); N]; 3]; 3];
                for (r, row) in d.iter_mut().enumerate() {
                    for (s, lanes) in row.iter_mut().enumerate() {
                        let at = ((r * 3 + s) * c + ci) * k + k0;
                        lanes.copy_from_slice(&w[at..at + N]);
                    }
                }
                let (rows, row) = layout.row(A * A, c, ci);
                // SAFETY: row ci of every U[ξ], inside u (length checked), this task's alone.
                unsafe { scatter_points(&two_d(&d, F::gf), out, (rows, row, k, k0)) };
            });
        },
    );
}

/// `u[ξ]ᵀ` for every point (each `c × k` to `k × c`, row-major, by the convolutions'
/// `transpose_into`): the blocked backward-data products read the filter as it is (the gemm
/// crate packed a transposed operand again for each of the 36 products of every block).
fn transpose_points<T: Float>(u: &[T], c: usize, k: usize) -> Vec<T> {
    let mut ut = Vec::with_capacity(u.len());
    ut.spare_capacity_mut()[..u.len()]
        .par_chunks_mut(c * k)
        .zip(u.par_chunks(c * k))
        .for_each(|(t, s)| super::transpose_into(s, c, k, t));
    // SAFETY: transpose_into wrote every element of every point.
    unsafe { ut.set_len(u.len()) };
    ut
}

/// `dw = Gᵀ dU G` into the RSCK filter gradient: the adjoint of the filter transform.
fn filter_gradient_transform<T: Float, F: Minimal<A, M>, const A: usize, const M: usize>(
    du: &[T],
    c: usize,
    k: usize,
    dw: &mut [T],
    layout: Points,
) {
    assert_eq!(dw.len(), 9 * c * k);
    assert_eq!(du.len(), A * A * c * k);
    let out = Out(dw.as_mut_ptr());
    in_tasks(
        c,
        #[inline(always)]
        |ci| {
            by_lanes!(k, |k0, N| {
                let (rows, row) = layout.row(A * A, c, ci);
                let tg = two_d(&gather_points::<T, N, A>(du, (rows, row, k, k0)), F::gt);
                for (r, row) in tg.iter().enumerate() {
                    for (s, lanes) in row.iter().enumerate() {
                        let at = ((r * 3 + s) * c + ci) * k + k0;
                        // SAFETY: inside dw (length checked); row ci is this task's alone.
                        unsafe { std::ptr::copy_nonoverlapping(lanes.as_ptr(), out.at(at), N) };
                    }
                }
            });
        },
    );
}

/// The 36 products `out[ξ] = a[ξ] · b[ξ]` (`m × n` each, reduction `depth`), one thread each,
/// spread over the pool. `a(ξ)` and `b(ξ)` give each product's operands.
///
/// # Safety
/// The operands must cover the matrices they describe; `out` holds `36 · m · n` elements.
unsafe fn products<T: Float>(
    (m, n, depth): (usize, usize, usize),
    out: &mut [T],
    a: impl Fn(usize) -> Mat<T> + Sync,
    b: impl Fn(usize) -> Mat<T> + Sync,
) {
    assert_eq!(out.len(), XI * m * n);
    out.par_chunks_mut(m * n).enumerate().for_each(|(xi, o)| {
        // SAFETY: the caller's contract; o is m × n, dense.
        unsafe { native_gemm(m, n, depth, o.as_mut_ptr(), n, false, a(xi), b(xi), false) }
    });
}

/// Splits this thread's scratch into buffers of the given lengths (contents unspecified).
fn with_buffers<T: Float, R, const K: usize>(
    lens: [usize; K],
    f: impl FnOnce([&mut [T]; K]) -> R,
) -> R {
    T::with_scratch(lens.iter().sum(), |all| {
        let mut rest = all;
        let bufs = lens.map(|len| {
            let (head, tail) = std::mem::take(&mut rest).split_at_mut(len);
            rest = tail;
            head
        });
        f(bufs)
    })
}

/// `y = conv(x, w)` (every element of `y` written).
pub fn forward<T: Float>(x: &[T], w: &[T], y: &mut [MaybeUninit<T>], sh: &ConvShape) {
    forward_by(x, w, y, sh, blocked::applies::<T>(sh.c, sh.k))
}

/// The filter transformed, `U[ξ][c][k]`, for the blocked passes (small: no scratch held
/// across their tasks).
fn transformed_filter<T: Float>(w: &[T], c: usize, k: usize) -> Vec<T> {
    let mut u = vec![T::zero(); XI * c * k];
    filter_transform::<T, F4, 6, 4>(w, c, k, &mut u, Points::Major);
    u
}

/// `forward`, block by block (`blocked`) or over the whole batch.
fn forward_by<T: Float>(
    x: &[T],
    w: &[T],
    y: &mut [MaybeUninit<T>],
    sh: &ConvShape,
    by_block: bool,
) {
    assert!(applies(sh), "not a Winograd shape: {}", sh.describe());
    let (g, c, k) = (Grid::new(sh, 4), sh.c, sh.k);
    if by_block {
        assert_eq!(y.len(), sh.output_len());
        return blocked::forward(x, &transformed_filter(w, c, k), y, g, (c, k));
    }
    let tiles = g.tiles();
    with_buffers([XI * c * k, XI * tiles * c, XI * tiles * k], |[u, v, m]| {
        rayon::join(
            || filter_transform::<T, F4, 6, 4>(w, c, k, u, Points::Major),
            || input_transform(x, g, c, v),
        );
        let (u, v) = (&*u, &*v);
        // SAFETY: V[ξ] is tiles × c, U[ξ] is c × k, both dense.
        unsafe {
            products(
                (tiles, k, c),
                m,
                |xi| Mat::rows(v[xi * tiles * c..].as_ptr(), c),
                |xi| Mat::rows(u[xi * c * k..].as_ptr(), k),
            )
        };
        output_transform(m, g, k, y);
    })
}

/// `dx (+)= ∂L/∂x` from `dy`: added to what `dx` holds where `accumulate`, written over it
/// otherwise.
///
/// # Safety
/// With `accumulate`, every element of `dx` is initialised.
pub unsafe fn backward_data<T: Float>(
    dy: &[T],
    w: &[T],
    dx: &mut [MaybeUninit<T>],
    sh: &ConvShape,
    accumulate: bool,
) {
    let by_block = blocked::applies::<T>(sh.c, sh.k);
    // SAFETY: the caller's contract.
    unsafe { backward_data_by(dy, w, dx, sh, accumulate, by_block) }
}

/// `backward_data`, block by block (`blocked`) or over the whole batch.
///
/// # Safety
/// As `backward_data`.
unsafe fn backward_data_by<T: Float>(
    dy: &[T],
    w: &[T],
    dx: &mut [MaybeUninit<T>],
    sh: &ConvShape,
    accumulate: bool,
    by_block: bool,
) {
    assert!(applies(sh), "not a Winograd shape: {}", sh.describe());
    let (g, c, k) = (Grid::new(sh, 4), sh.c, sh.k);
    assert_eq!(dy.len(), sh.output_len());
    assert_eq!(dx.len(), sh.input_len());
    if by_block {
        // U[ξ]ᵀ (k × c) row-major: the products read it as it is (a transposed operand, the
        // crate packed it again for each of the 36 products of every block).
        let ut = transpose_points(&transformed_filter(w, c, k), c, k);
        // SAFETY: the caller's contract.
        return unsafe { blocked::backward_data(dy, &ut, dx, accumulate, g, (c, k)) };
    }
    let dx = if accumulate {
        // SAFETY: initialised (the contract).
        unsafe { &mut *(dx as *mut [MaybeUninit<T>] as *mut [T]) }
    } else {
        fill_uninit(dx, T::zero())
    };
    let tiles = g.tiles();
    with_buffers(
        [XI * c * k, XI * tiles * k, XI * tiles * c],
        |[u, dm, dv]| {
            rayon::join(
                || filter_transform::<T, F4, 6, 4>(w, c, k, u, Points::Major),
                || output_gradient_transform(dy, g, k, dm),
            );
            let (u, dm) = (&*u, &*dm);
            // SAFETY: dM[ξ] is tiles × k, U[ξ]ᵀ is k × c (U[ξ] c × k, row-major). Read
            // transposed as it is: U transposed first ran slower on the large layers
            // (trainer_conv bwd_data, layer3 640 → 493–542, layer4 540 → 259–297 GFLOP/s).
            unsafe {
                products(
                    (tiles, c, k),
                    dv,
                    |xi| Mat::rows(dm[xi * tiles * k..].as_ptr(), k),
                    |xi| Mat::transposed(u[xi * c * k..].as_ptr(), k),
                )
            };
            input_gradient_transform(dv, g, c, dx);
        },
    )
}

/// `dw = ∂L/∂w` from the layer's input `x` and `dy` (written over `dw`).
pub fn backward_filter<T: Float>(x: &[T], dy: &[T], dw: &mut [T], sh: &ConvShape) {
    backward_filter_by(x, dy, dw, sh, blocked::applies::<T>(sh.c, sh.k))
}

/// `backward_filter`, block by block (`blocked`) or over the whole batch.
fn backward_filter_by<T: Float>(x: &[T], dy: &[T], dw: &mut [T], sh: &ConvShape, by_block: bool) {
    assert!(applies(sh), "not a Winograd shape: {}", sh.describe());
    let (g, c, k) = (Grid::new(sh, 4), sh.c, sh.k);
    if by_block {
        assert_eq!((x.len(), dy.len()), (sh.input_len(), sh.output_len()));
        let mut du = vec![T::zero(); XI * c * k];
        blocked::backward_filter(x, dy, &mut du, g, (c, k));
        return filter_gradient_transform::<T, F4, 6, 4>(&du, c, k, dw, Points::Major);
    }
    let tiles = g.tiles();
    with_buffers(
        [XI * tiles * c, XI * tiles * k, XI * c * k],
        |[v, dm, du]| {
            rayon::join(
                || input_transform(x, g, c, v),
                || output_gradient_transform(dy, g, k, dm),
            );
            let (v, dm) = (&*v, &*dm);
            // SAFETY: V[ξ]ᵀ is c × tiles (V[ξ] tiles × c, row-major), dM[ξ] is tiles × k.
            unsafe {
                products(
                    (c, k, tiles),
                    du,
                    |xi| Mat::transposed(v[xi * tiles * c..].as_ptr(), c),
                    |xi| Mat::rows(dm[xi * tiles * k..].as_ptr(), k),
                )
            };
            filter_gradient_transform::<T, F4, 6, 4>(du, c, k, dw, Points::Major);
        },
    )
}

#[cfg(test)]
mod tests;
