//! A residual block's end, `relu(bn(x) + shortcut)`, forward and backward, each in as few
//! passes over the activations as their data dependences allow.

use super::act::{rows_per_block, Stored};
use super::{Act, BatchNorm, Gate, InputGradient, Kept, CHUNK_ROWS};
use crate::tensor::{
    as_uninit, bf16, half_activations, round_bf16, simd, Float, Lhs, Positive, Tensor,
};
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
}

impl<'a, T: Float> Shortcut<'a, T> {
    /// The block's input, in whichever precision it is kept (`Act`).
    pub fn identity(x: &'a Act<T>) -> Shortcut<'a, T> {
        match x {
            Act::Full(t) => Shortcut::Identity(t),
            Act::Half(t) => Shortcut::IdentityHalf(t),
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
            self.input = Some(x);
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
            self.input = Some(x);
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
                    self.half_input = Some(Box::new(x));
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
                (None, Some((bn, ad, s)), shape)
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
                (Side::Full(&s.data[..]), maps)
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

    /// `backward_add_relu` from the output of `forward_add_relu_act`, in whichever precision
    /// it is kept, and from the block output's gradient in `T` or in bf16 (the shortcut
    /// gradient of the block after it, in bf16 training): with an identity shortcut, the
    /// masked gradient is the shortcut's, kept in the precision it came in (masking is exact);
    /// with a projection, the projection's input gradient in `T`. The branch's input gradient
    /// (conv3's output gradient) is written over the kept input where that is in `T`, and in
    /// bf16 where the input was kept in bf16 (`forward_add_relu_kept`).
    pub fn backward_add_relu_act(
        &mut self,
        dy: Act<T>,
        out: &Act<T>,
        projection: Option<&mut BatchNorm<T>>,
    ) -> (Act<T>, Act<T>) {
        let p = projection;
        match (self.half_input.take(), dy) {
            (Some(x), Act::Full(d)) => self.end_act(*x, Arc::unwrap_or_clone(d), out, p).rounded(),
            (Some(x), Act::Half(d)) => self.end_act(*x, Arc::unwrap_or_clone(d), out, p).rounded(),
            (None, Act::Full(d)) => {
                let x = self.input.take().expect("backward before forward");
                self.end_act(x, Arc::unwrap_or_clone(d), out, p).in_place()
            }
            (None, Act::Half(d)) => {
                let x = self.input.take().expect("backward before forward");
                self.end_act(x, Arc::unwrap_or_clone(d), out, p).in_place()
            }
        }
    }

    /// `end_sums` with the output in either precision.
    fn end_act<G: Lhs<T>, S: Lhs<T>>(
        &mut self,
        x: Tensor<S>,
        dy: Tensor<G>,
        out: &Act<T>,
        projection: Option<&mut BatchNorm<T>>,
    ) -> EndSums<T, G, S> {
        match out {
            Act::Full(o) => self.end_sums(x, dy, o, projection),
            Act::Half(o) => self.end_sums(x, dy, o, projection),
        }
    }

    /// The backward pass of `forward_add_relu` (or `forward_add_relu_act`), from the gradient
    /// `dy` of the block's output `out` (in `T` or bf16: its sign is the ReLU's mask; with a
    /// projection the mask is recomputed from the two inputs, read anyway, and `out` is not
    /// read), with `projection` the batch norm that was given in `Shortcut::Projected` (None
    /// for an identity shortcut). Returns the gradients of this batch norm's input and of the
    /// shortcut as it was given: the block's input (identity), or the projection's
    /// convolution output.
    ///
    /// Two passes: the first masks `dy` in place and sums Σ g, Σ g·x and Σ g·x_s (both batch
    /// norms see the same g, so one read of it feeds both); the second writes each input
    /// gradient over its kept input. Separately, the ReLU, each batch norm (two passes) and the
    /// shortcut's sum cost 11 tensor passes with an identity shortcut and 16 with a
    /// projection; these cost 7 and 9, and the sum goes into the products of the block's first
    /// convolution (`Conv2d::backward_add`). The same bits as `relu_backward` followed by each
    /// batch norm's `backward` (the same operations in the same order).
    pub fn backward_add_relu<O: Positive>(
        &mut self,
        dy: Tensor<T>,
        out: &Tensor<O>,
        projection: Option<&mut BatchNorm<T>>,
    ) -> (Tensor<T>, Tensor<T>) {
        let x = self.input.take().expect("backward before forward");
        let (g, s) = self.end_sums(x, dy, out, projection).gradients();
        (g, s.into())
    }

    /// The first pass of `backward_add_relu`, from the kept input `x` and the output gradient
    /// `dy`, each stored in `T` or bf16: the masked gradient, and what each input gradient
    /// needs per channel.
    fn end_sums<O: Positive, G: Lhs<T>, S: Lhs<T>>(
        &mut self,
        x: Tensor<S>,
        mut dy: Tensor<G>,
        out: &Tensor<O>,
        mut projection: Option<&mut BatchNorm<T>>,
    ) -> EndSums<T, G, S> {
        let xs = projection
            .as_mut()
            .map(|bn| bn.input.take().expect("backward before forward"));
        assert!(
            dims(&x) == dims(&dy) && dims(out) == dims(&dy),
            "{}: gradient shape",
            self.gamma.name
        );
        if let Some(s) = &xs {
            assert!(dims(s) == dims(&dy), "shortcut shape");
        }
        let c = dy.c;
        let chunk = CHUNK_ROWS * c;
        let zero = T::zero();
        let projected = xs.is_some();
        let second: &[T] = xs.as_ref().map_or(&[], |s| &s.data[..]);
        // With a projection, the ReLU's mask from both inputs and the forward pass's affine
        // maps (the same operations, so the same signs) instead of a read of `out`.
        let maps = match (self.relu_affine.take(), projection.as_mut()) {
            (Some(m), Some(bn)) => bn.relu_affine.take().map(|m2| (m, m2)),
            _ => None,
        };
        // Per chunk of rows, in the element type: Σ g, Σ g·x, Σ g·x_s.
        let partials: Vec<[Vec<T>; 3]> = dy
            .data
            .par_chunks_mut(chunk)
            .zip(out.data.par_chunks(chunk))
            .zip(x.data.par_chunks(chunk))
            .enumerate()
            .map(|(i, ((gc, oc), xc))| {
                let sc = projected.then(|| &second[i * chunk..i * chunk + xc.len()]);
                simd(
                    #[inline(always)]
                    || {
                        let mut p = [vec![zero; c], vec![zero; c], vec![zero; c]];
                        let [q1, q2, q3] = &mut p;
                        let q = [&mut q1[..c], &mut q2[..c], &mut q3[..c]];
                        let mask = match &maps {
                            Some(((a, d), (a2, d2))) if projected => EndMask::Affine(a, d, a2, d2),
                            _ => EndMask::Out(oc),
                        };
                        mask_and_sum_rows(gc, mask, xc, sc, q);
                        p
                    },
                )
            })
            .collect();
        // The chunks' sums in f64, in chunk order (deterministic), as `sums`.
        let mut s = [vec![0.0f64; c], vec![0.0f64; c], vec![0.0f64; c]];
        for p in &partials {
            for (acc, part) in s.iter_mut().zip(p) {
                for j in 0..c {
                    acc[j] += part[j].to_f64();
                }
            }
        }
        let [s1, s2, s3] = s;
        let rows = x.n * x.h * x.w;
        let grad = self.input_gradient((s1.clone(), s2), rows);
        let projected = match (projection, xs) {
            (Some(bn), Some(xs)) => Some((bn.input_gradient((s1, s3), rows), xs)),
            _ => None,
        };
        EndSums {
            g: dy,
            x,
            grad,
            projected,
        }
    }
}

/// A block end's masked output gradient `g` (stored in `G`), the branch batch norm's kept
/// input `x` (in `S`) and what its input gradient needs, and the projection's coefficients
/// and kept input (with a projection).
struct EndSums<T, G, S> {
    g: Tensor<G>,
    x: Tensor<S>,
    grad: InputGradient<T>,
    projected: Option<(InputGradient<T>, Tensor<T>)>,
}

impl<T: Float, G: Lhs<T>> EndSums<T, G, T> {
    /// The second pass: each input gradient written over its kept input. Returns the
    /// branch's and the shortcut's (the projection's, or `g` itself for an identity).
    fn gradients(self) -> (Tensor<T>, EndShortcut<T, G>) {
        let EndSums {
            g,
            mut x,
            grad,
            projected,
        } = self;
        let c = g.c;
        let chunk = CHUNK_ROWS * c;
        match projected {
            Some((grad_s, mut xs)) => {
                x.data
                    .par_chunks_mut(chunk)
                    .zip(xs.data.par_chunks_mut(chunk))
                    .zip(g.data.par_chunks(chunk))
                    .for_each(|((xc, sc), gc)| {
                        simd(
                            #[inline(always)]
                            || {
                                for ((xr, sr), gr) in xc
                                    .chunks_exact_mut(c)
                                    .zip(sc.chunks_exact_mut(c))
                                    .zip(gc.chunks_exact(c))
                                {
                                    grad.row(xr, gr, Gate::<T, T>::Open);
                                    grad_s.row(sr, gr, Gate::<T, T>::Open);
                                }
                            },
                        )
                    });
                (x, EndShortcut::Projected(xs))
            }
            None => {
                x.data
                    .par_chunks_mut(chunk)
                    .zip(g.data.par_chunks(chunk))
                    .for_each(|(xc, gc)| {
                        simd(
                            #[inline(always)]
                            || {
                                for (xr, gr) in xc.chunks_exact_mut(c).zip(gc.chunks_exact(c)) {
                                    grad.row(xr, gr, Gate::<T, T>::Open);
                                }
                            },
                        )
                    });
                (x, EndShortcut::Identity(g))
            }
        }
    }

    /// `gradients` as the layers keep them (`Stored`).
    fn in_place(self) -> (Act<T>, Act<T>)
    where
        G: Stored<T>,
    {
        let (x, s) = self.gradients();
        (Act::Full(Arc::new(x)), s.act())
    }
}

impl<T: Float, G: Stored<T>> EndSums<T, G, bf16> {
    /// The second pass from a bf16 kept input (`Kept::Half`): the branch's input gradient
    /// computed a block of rows at a time into scratch and rounded to bf16 (conv3's output
    /// gradient, which its products round anyway); a projection's written over its f32 kept
    /// input as in `gradients`.
    fn rounded(self) -> (Act<T>, Act<T>) {
        let EndSums {
            g,
            x,
            grad,
            projected,
        } = self;
        let (n, h, w, c) = dims(&g);
        let (len, chunk) = (g.data.len(), CHUNK_ROWS * c);
        let block = rows_per_block(c) * c;
        let (grad_s, xs) = match projected {
            Some((gs, xs)) => (Some(gs), Some(xs)),
            None => (None, None),
        };
        // A chunk of rows: the branch's gradient a block at a time into scratch, rounded; the
        // projection's in place.
        let run = |oc: &mut [MaybeUninit<bf16>], xc: &[bf16], gc: &[G], sc: Option<&mut [T]>| {
            T::with_scratch(block, |buf| {
                simd(
                    #[inline(always)]
                    || {
                        for (b, (ob, gb)) in oc.chunks_mut(block).zip(gc.chunks(block)).enumerate()
                        {
                            let at = b * block..b * block + gb.len();
                            let buf = &mut buf[..gb.len()];
                            for ((br, xr), gr) in buf
                                .chunks_exact_mut(c)
                                .zip(xc[at].chunks_exact(c))
                                .zip(gb.chunks_exact(c))
                            {
                                grad.row_into(br, xr, gr, Gate::<T, T>::Open);
                            }
                            round_bf16(buf, ob);
                        }
                    },
                )
            });
            if let (Some(sc), Some(grad_s)) = (sc, &grad_s) {
                simd(
                    #[inline(always)]
                    || {
                        for (sr, gr) in sc.chunks_exact_mut(c).zip(gc.chunks_exact(c)) {
                            grad_s.row(sr, gr, Gate::<T, T>::Open);
                        }
                    },
                )
            }
        };
        let mut out: Vec<bf16> = Vec::with_capacity(len);
        let out_c = out.spare_capacity_mut()[..len].par_chunks_mut(chunk);
        let chunks = out_c
            .zip(x.data.par_chunks(chunk))
            .zip(g.data.par_chunks(chunk));
        let shortcut = match xs {
            Some(mut xs) => {
                chunks
                    .zip(xs.data.par_chunks_mut(chunk))
                    .for_each(|(((o, x), g), s)| run(o, x, g, Some(s)));
                EndShortcut::Projected(xs)
            }
            None => {
                chunks.for_each(|((o, x), g)| run(o, x, g, None));
                EndShortcut::Identity(g)
            }
        };
        // SAFETY: the chunks cover the first len elements, every one written.
        unsafe { out.set_len(len) };
        let half = Act::Half(Arc::new(Tensor {
            n,
            h,
            w,
            c,
            data: out,
        }));
        (half, shortcut.act())
    }
}

/// The shortcut's gradient from a block's end: the projection's input gradient (in `T`), or
/// the masked output gradient itself (identity), stored as it came (`G`).
enum EndShortcut<T, G> {
    Projected(Tensor<T>),
    Identity(Tensor<G>),
}

impl<T: Float, G: Stored<T>> EndShortcut<T, G> {
    fn act(self) -> Act<T> {
        match self {
            EndShortcut::Projected(t) => Act::Full(Arc::new(t)),
            EndShortcut::Identity(t) => G::act(t),
        }
    }
}

impl<T> From<EndShortcut<T, T>> for Tensor<T> {
    fn from(s: EndShortcut<T, T>) -> Tensor<T> {
        match s {
            EndShortcut::Projected(t) | EndShortcut::Identity(t) => t,
        }
    }
}

/// (n, h, w, c).
fn dims<S>(t: &Tensor<S>) -> (usize, usize, usize, usize) {
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
            match side {
                Side::Full(s) => end_chunk(yc, xc, &s[at], maps),
                Side::Half(s) => end_chunk(yc, xc, &s[at], maps),
            }
        });
}

fn end_chunk<T: Float, X: Lhs<T>, S: Lhs<T>, O: Store<T>>(
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
                    O::store(yb, buf, |yb| end_rows(yb, xb, sb, m));
                }
            },
        )
    })
}

/// Rows of the block's end into `y`.
#[inline(always)]
fn end_rows<T: Float, X: Lhs<T>, S: Lhs<T>>(
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
        if m.projected {
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

/// Where the block end's ReLU let the gradient through: its output positive, or (with a
/// projection) `(x·a + d) + (s·a2 + d2)` positive, recomputed from the two inputs.
#[derive(Clone, Copy)]
enum EndMask<'a, T, O> {
    Out(&'a [O]),
    Affine(&'a [T], &'a [T], &'a [T], &'a [T]),
}

/// The block end's first backward pass over the rows of a chunk: `g` masked where the
/// `mask` says the ReLU's output was not positive (in place), Σ g into `q1`, Σ g·x into `q2`
/// and, with a projection, Σ g·s into `q3`, each channel summed row after row (the bits of a
/// plain loop over rows). As
/// `layers::sum_rows`, each group of channels sums in registers over a block of rows (summed
/// into memory row by row, each row waited on the last one's stores). The mask is written by a
/// loop of its own: fused with the sums, the stores to g, q1 and q2 needed more run-time alias
/// checks than the vectoriser makes wherever the inlining lost the slices' no-alias facts, and
/// the pass ran scalar (0.15 → 0.41 s of a bf16 step).
#[inline(always)]
fn mask_and_sum_rows<T: Float, G: Lhs<T>, X: Lhs<T>, O: Positive>(
    g: &mut [G],
    mask: EndMask<'_, T, O>,
    x: &[X],
    s: Option<&[T]>,
    [q1, q2, q3]: [&mut [T]; 3],
) {
    const G: usize = super::SUM_GROUP;
    let c = q1.len();
    let rows = g.len() / c;
    let full = c / G * G;
    let zero = T::zero();
    for r0 in (0..rows).step_by(super::SUM_ROWS) {
        let r1 = (r0 + super::SUM_ROWS).min(rows);
        match mask {
            EndMask::Out(out) => {
                let block = &mut g[r0 * c..r1 * c];
                for (gj, oj) in block.iter_mut().zip(&out[r0 * c..r1 * c]) {
                    *gj = if oj.positive() { *gj } else { G::default() };
                }
            }
            EndMask::Affine(a, d, a2, d2) => {
                let s = s.expect("a projection's input");
                for r in r0..r1 {
                    let o = r * c;
                    let (gr, xr, sr) = (&mut g[o..o + c], &x[o..o + c], &s[o..o + c]);
                    let (a, d, a2, d2) = (&a[..c], &d[..c], &a2[..c], &d2[..c]);
                    for j in 0..c {
                        let t = (xr[j].widen() * a[j] + d[j]) + (sr[j] * a2[j] + d2[j]);
                        gr[j] = if t > zero { gr[j] } else { G::default() };
                    }
                }
            }
        }
        for g0 in (0..full).step_by(G) {
            let mut s1: [T; G] = q1[g0..g0 + G].try_into().expect("a group");
            let mut s2: [T; G] = q2[g0..g0 + G].try_into().expect("a group");
            let mut s3: [T; G] = q3[g0..g0 + G].try_into().expect("a group");
            for r in r0..r1 {
                let o = r * c + g0;
                let (gr, xr) = (&g[o..o + G], &x[o..o + G]);
                for j in 0..G {
                    s1[j] += gr[j].widen();
                    s2[j] += gr[j].widen() * xr[j].widen();
                }
                if let Some(s) = s {
                    let sr = &s[o..o + G];
                    for j in 0..G {
                        s3[j] += gr[j].widen() * sr[j];
                    }
                }
            }
            q1[g0..g0 + G].copy_from_slice(&s1);
            q2[g0..g0 + G].copy_from_slice(&s2);
            q3[g0..g0 + G].copy_from_slice(&s3);
        }
        for r in r0..r1 {
            let o = r * c;
            for j in full..c {
                let gj = g[o + j].widen();
                q1[j] += gj;
                q2[j] += gj * x[o + j].widen();
                if let Some(s) = s {
                    q3[j] += gj * s[o + j];
                }
            }
        }
    }
}
