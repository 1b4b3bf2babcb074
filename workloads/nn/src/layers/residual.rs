//! A residual block's end, `relu(bn(x) + shortcut)`, forward in one pass over the activations
//! (its backward pass, in two: `residual_backward`).

use super::act::rows_per_block;
use super::{Act, BatchNorm, Kept, CHUNK_ROWS};
use crate::tensor::{as_uninit, bf16, half_activations, round_bf16, simd, Float, Lhs, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// What a residual block adds to its normalised branch (`BatchNorm::forward_add_relu`).
pub enum Shortcut<'a, T: Float> {
    /// The block's input.
    Identity(&'a Tensor<T>),
    /// The block's input, kept in bf16 (the last block's output in bf16 training: `Act`).
    IdentityHalf(&'a Tensor<bf16>),
    /// The projection's convolution output, normalised by its own batch norm in the same pass.
    Projected(&'a mut BatchNorm<T>, Tensor<T>),
    /// The projection's output, kept in bf16 (`Conv2d::forward_kept` in bf16 training).
    ProjectedHalf(&'a mut BatchNorm<T>, Tensor<bf16>),
}

impl<'a, T: Float> Shortcut<'a, T> {
    /// The block's input, in whichever precision it is kept (`Act`).
    pub fn identity(x: &'a Act<T>) -> Shortcut<'a, T> {
        match x {
            Act::Full(t) => Shortcut::Identity(t),
            Act::Half(t) => Shortcut::IdentityHalf(t),
        }
    }

    /// The projection's output `s`, in whichever precision it is kept (`Kept`), normalised by
    /// `bn`.
    pub fn projected(bn: &'a mut BatchNorm<T>, s: Kept<T>) -> Shortcut<'a, T> {
        match s {
            Kept::Full(s) => Shortcut::Projected(bn, s),
            Kept::Half(s) => Shortcut::ProjectedHalf(bn, s),
        }
    }
}

/// The shortcut's values as the block's end reads them.
#[derive(Clone, Copy)]
enum Side<'a, T> {
    Full(&'a [T]),
    Half(&'a [bf16]),
}

impl<T: Float> BatchNorm<T> {
    /// A residual block's end, `relu(bn(x) + shortcut)`, in one pass over memory: the normalised
    /// branch and the sum are never written (with separate passes they were written and read
    /// back once each, and a projection's normalised output once more). The same bits as
    /// `forward_act` then `add_relu` (the same operations in the same order).
    pub fn forward_add_relu(
        &mut self,
        x: Tensor<T>,
        shortcut: Shortcut<'_, T>,
        train: bool,
    ) -> Tensor<T> {
        let y = self.end_forward(&x, shortcut, train, false);
        if train {
            self.input = Some(Kept::Full(x));
        }
        match y {
            Act::Full(y) => Arc::into_inner(y).expect("a new tensor has one owner"),
            Act::Half(_) => unreachable!("a full-precision output was asked for"),
        }
    }

    /// `forward_add_relu`, its output kept as the block's ReLU outputs are (`Act::kept`): in
    /// bf16 where the products are (`half_activations`). The next block's first convolution
    /// and projection then read half the bytes and round nothing, its end adds the bf16 value
    /// (as PyTorch's and TensorFlow's bf16 policies add the block's bf16 input), and the
    /// backward pass reads the ReLU's mask from the bf16 output (the same signs, but where an
    /// output below bf16's smallest subnormal rounded to zero).
    pub fn forward_add_relu_act(
        &mut self,
        x: Tensor<T>,
        shortcut: Shortcut<'_, T>,
        train: bool,
    ) -> Act<T> {
        let half = half_activations::<T>();
        let y = self.end_forward(&x, shortcut, train, half);
        if train {
            self.input = Some(Kept::Full(x));
        }
        y
    }

    /// `forward_add_relu_act` of a convolution's output in either precision (`Kept`: conv3's
    /// in bf16 training, which the backward pass then reads in bf16 too).
    pub fn forward_add_relu_kept(
        &mut self,
        x: Kept<T>,
        shortcut: Shortcut<'_, T>,
        train: bool,
    ) -> Act<T> {
        match x {
            Kept::Full(x) => self.forward_add_relu_act(x, shortcut, train),
            Kept::Half(x) => {
                let y = self.end_forward(&x, shortcut, train, half_activations::<T>());
                if train {
                    self.input = Some(Kept::Half(x));
                }
                y
            }
        }
    }

    /// The block's end from `x` (kept by the caller when training).
    fn end_forward<S: Lhs<T>>(
        &mut self,
        x: &Tensor<S>,
        shortcut: Shortcut<'_, T>,
        train: bool,
        half: bool,
    ) -> Act<T> {
        let c = x.c;
        let (a, d) = self.affine(x, train);
        let (side, down, shape) = match shortcut {
            Shortcut::Identity(s) => (Some(Side::Full(&s.data[..])), None, dims(s)),
            Shortcut::IdentityHalf(s) => (Some(Side::Half(&s.data[..])), None, dims(s)),
            Shortcut::Projected(bn, s) => {
                let ad = bn.affine(&s, train);
                let shape = dims(&s);
                (None, Some((bn, ad, Kept::Full(s))), shape)
            }
            Shortcut::ProjectedHalf(bn, s) => {
                let ad = bn.affine(&s, train);
                let shape = dims(&s);
                (None, Some((bn, ad, Kept::Half(s))), shape)
            }
        };
        assert_eq!(dims(x), shape, "residual shapes");
        let (side, maps) = match &down {
            Some((_, (a2, d2), s)) => {
                let maps = Maps {
                    a: &a,
                    d: &d,
                    a2,
                    d2,
                    projected: true,
                };
                let side = match s {
                    Kept::Full(s) => Side::Full(&s.data[..]),
                    Kept::Half(s) => Side::Half(&s.data[..]),
                };
                (side, maps)
            }
            None => {
                let maps = Maps {
                    a: &a,
                    d: &d,
                    a2: &a,
                    d2: &d,
                    projected: false,
                };
                (side.expect("an identity shortcut"), maps)
            }
        };
        let (n, h, w) = (x.n, x.h, x.w);
        let y = if half {
            let len = x.data.len();
            let mut data: Vec<bf16> = Vec::with_capacity(len);
            end_pass(&mut data.spare_capacity_mut()[..len], &x.data, side, maps);
            // SAFETY: the chunks cover the first len elements, every one written.
            unsafe { data.set_len(len) };
            Act::Half(Arc::new(Tensor { n, h, w, c, data }))
        } else {
            let mut y = Tensor::uninit(n, h, w, c);
            end_pass(&mut y.data, &x.data, side, maps);
            // SAFETY: the chunks cover y, every element written.
            Act::Full(Arc::new(unsafe { y.assume_init() }))
        };
        if train {
            if let Some((bn, (a2, d2), s)) = down {
                bn.input = Some(s);
                // The backward pass's mask, recomputed from the inputs it reads anyway.
                self.relu_affine = Some((a, d));
                bn.relu_affine = Some((a2, d2));
            }
        }
        y
    }
}

/// (n, h, w, c).
pub(super) fn dims<S>(t: &Tensor<S>) -> (usize, usize, usize, usize) {
    (t.n, t.h, t.w, t.c)
}

/// The block end's per-channel maps: the branch's batch norm (`a`, `d`) and, with a
/// projection, the shortcut's (`a2`, `d2`).
#[derive(Clone, Copy)]
struct Maps<'a, T> {
    a: &'a [T],
    d: &'a [T],
    a2: &'a [T],
    d2: &'a [T],
    projected: bool,
}

/// What the block's end writes its output in: the layers' type, or bf16 (computed in `T` a
/// block of rows at a time, then rounded).
trait Store<T: Float>: Sized + Send {
    /// Elements per `store` for rows of `c` channels in chunks of `chunk` elements: the whole
    /// chunk in `T` (the f32 pass as it was before bf16 outputs), `rows_per_block` rows in
    /// bf16.
    fn block(c: usize, chunk: usize) -> usize;
    /// `f` with the scratch `store` needs for `len` elements (none for `T`).
    fn with_buf(len: usize, f: impl FnOnce(&mut [T]));
    /// `y` written by `f`: directly, or through `buf` and one rounding.
    fn store(y: &mut [MaybeUninit<Self>], buf: &mut [T], f: impl FnOnce(&mut [MaybeUninit<T>]));
}

impl<T: Float> Store<T> for T {
    fn block(_: usize, chunk: usize) -> usize {
        chunk
    }
    fn with_buf(_: usize, f: impl FnOnce(&mut [T])) {
        f(&mut [])
    }
    #[inline(always)]
    fn store(y: &mut [MaybeUninit<T>], _: &mut [T], f: impl FnOnce(&mut [MaybeUninit<T>])) {
        f(y)
    }
}

impl<T: Float> Store<T> for bf16 {
    fn block(c: usize, _: usize) -> usize {
        rows_per_block(c) * c
    }
    fn with_buf(len: usize, f: impl FnOnce(&mut [T])) {
        T::with_scratch(len, f)
    }
    #[inline(always)]
    fn store(y: &mut [MaybeUninit<bf16>], buf: &mut [T], f: impl FnOnce(&mut [MaybeUninit<T>])) {
        let buf = &mut buf[..y.len()];
        // SAFETY: `f` writes only values.
        f(unsafe { as_uninit(buf) });
        round_bf16(buf, y);
    }
}

/// `y = relu(x·a + d + shortcut)` (the shortcut normalised by `a2`, `d2` with a projection),
/// chunks of rows in parallel, each in blocks of rows (`Store::block`) stored by `O`.
fn end_pass<T: Float, X: Lhs<T>, O: Store<T>>(
    y: &mut [MaybeUninit<O>],
    x: &[X],
    side: Side<'_, T>,
    maps: Maps<'_, T>,
) {
    let c = maps.a.len();
    let chunk = CHUNK_ROWS * c;
    y.par_chunks_mut(chunk)
        .zip(x.par_chunks(chunk))
        .enumerate()
        .for_each(|(i, (yc, xc))| {
            let at = i * chunk..i * chunk + xc.len();
            // Each (storage, shortcut) its own loop: with the shortcut's kind a run-time
            // test in the rows' loop, the identity ends' forward pass ran 10% slower once a
            // projection read bf16 too (train --trace, layer ends: 30–33 → 34–38 ms a step).
            match (side, maps.projected) {
                (Side::Full(s), true) => end_chunk::<_, _, _, _, true>(yc, xc, &s[at], maps),
                (Side::Full(s), false) => end_chunk::<_, _, _, _, false>(yc, xc, &s[at], maps),
                (Side::Half(s), true) => end_chunk::<_, _, _, _, true>(yc, xc, &s[at], maps),
                (Side::Half(s), false) => end_chunk::<_, _, _, _, false>(yc, xc, &s[at], maps),
            }
        });
}

/// A chunk of rows of the block's end, with a projection (`P`) or an identity shortcut.
fn end_chunk<T: Float, X: Lhs<T>, S: Lhs<T>, O: Store<T>, const P: bool>(
    yc: &mut [MaybeUninit<O>],
    xc: &[X],
    sc: &[S],
    m: Maps<'_, T>,
) {
    let c = m.a.len();
    let block = O::block(c, CHUNK_ROWS * c);
    O::with_buf(block, |buf| {
        simd(
            #[inline(always)]
            || {
                for ((yb, xb), sb) in yc
                    .chunks_mut(block)
                    .zip(xc.chunks(block))
                    .zip(sc.chunks(block))
                {
                    // Inlined: as a function of its own the rows' loop was compiled for
                    // baseline x86-64 (SSE2, 4 lanes) outside `simd`'s AVX-512 (`perf annotate`).
                    O::store(
                        yb,
                        buf,
                        #[inline(always)]
                        |yb| end_rows::<T, X, S, P>(yb, xb, sb, m),
                    );
                }
            },
        )
    })
}

/// Rows of the block's end into `y`.
#[inline(always)]
fn end_rows<T: Float, X: Lhs<T>, S: Lhs<T>, const P: bool>(
    y: &mut [MaybeUninit<T>],
    x: &[X],
    s: &[S],
    m: Maps<'_, T>,
) {
    let c = m.a.len();
    let zero = T::zero();
    let (a, d, a2, d2) = (&m.a[..c], &m.d[..c], &m.a2[..c], &m.d2[..c]);
    for ((yr, xr), sr) in y
        .chunks_exact_mut(c)
        .zip(x.chunks_exact(c))
        .zip(s.chunks_exact(c))
    {
        let (yr, xr, sr) = (&mut yr[..c], &xr[..c], &sr[..c]);
        if P {
            for j in 0..c {
                let t = (xr[j].widen() * a[j] + d[j]) + (sr[j].widen() * a2[j] + d2[j]);
                yr[j] = MaybeUninit::new(if t < zero { zero } else { t });
            }
        } else {
            for j in 0..c {
                let t = (xr[j].widen() * a[j] + d[j]) + sr[j].widen();
                yr[j] = MaybeUninit::new(if t < zero { zero } else { t });
            }
        }
    }
}
