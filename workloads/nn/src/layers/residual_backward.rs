//! A residual block's end backward, `relu(bn(x) + shortcut)`, in two passes over the
//! activations: each input gradient written over its kept input where that is kept in `T`, and
//! into a new bf16 tensor where it is kept in bf16 (a convolution's output in bf16 training,
//! whose output gradient its products round to bf16 anyway).

use super::act::{rows_per_block, Stored};
use super::residual::dims;
use super::{Act, BatchNorm, Gate, InputGradient, Kept, CHUNK_ROWS};
use crate::tensor::{bf16, round_bf16, simd, Float, Lhs, Positive, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Arc;

impl<T: Float> BatchNorm<T> {
    /// `backward_add_relu` from the output of `forward_add_relu_act`, in whichever precision
    /// it is kept, and from the block output's gradient in `T` or in bf16 (the shortcut
    /// gradient of the block after it, in bf16 training): with an identity shortcut, the
    /// masked gradient is the shortcut's, kept in the precision it came in (masking is exact).
    /// Each input gradient (conv3's output gradient, and the projection's) is written over its
    /// kept input where that is in `T`, and in bf16 where the input was kept in bf16
    /// (`forward_add_relu_kept`, `Shortcut::ProjectedHalf`).
    pub fn backward_add_relu_act(
        &mut self,
        dy: Act<T>,
        out: &Act<T>,
        projection: Option<&mut BatchNorm<T>>,
    ) -> (Act<T>, Act<T>) {
        let x = self.input.take().expect("backward before forward");
        let p = projection;
        match (dy, out) {
            (Act::Full(d), Act::Full(o)) => self.end_sums(x, Arc::unwrap_or_clone(d), o, p),
            (Act::Full(d), Act::Half(o)) => self.end_sums(x, Arc::unwrap_or_clone(d), o, p),
            (Act::Half(d), Act::Full(o)) => self.end_sums(x, Arc::unwrap_or_clone(d), o, p),
            (Act::Half(d), Act::Half(o)) => self.end_sums(x, Arc::unwrap_or_clone(d), o, p),
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
        let (g, s) = self.end_sums(x, dy, out, projection);
        (g.into_full(), s.into_full())
    }

    /// `backward_add_relu` from the kept input `x` and the output gradient `dy`, each stored
    /// in `T` or bf16: the first pass (the masked gradient, and what each input gradient needs
    /// per channel), then the second (`EndSums::gradients`).
    fn end_sums<O: Positive, G: Stored<T>>(
        &mut self,
        x: Kept<T>,
        mut dy: Tensor<G>,
        out: &Tensor<O>,
        mut projection: Option<&mut BatchNorm<T>>,
    ) -> (Act<T>, Act<T>) {
        let xs = projection
            .as_mut()
            .map(|bn| bn.input.take().expect("backward before forward"));
        assert!(
            x.dims() == dims(&dy) && dims(out) == dims(&dy),
            "{}: gradient shape",
            self.gamma.name
        );
        if let Some(s) = &xs {
            assert!(s.dims() == dims(&dy), "shortcut shape");
        }
        // With a projection, the ReLU's mask from both inputs and the forward pass's affine
        // maps (the same operations, so the same signs) instead of a read of `out`.
        let maps = match (self.relu_affine.take(), projection.as_mut()) {
            (Some(m), Some(bn)) => bn.relu_affine.take().map(|m2| (m, m2)),
            _ => None,
        };
        let first = FirstPass {
            out: &out.data,
            maps: maps.as_ref(),
            c: dy.c,
        };
        let [s1, s2, s3] = match &x {
            Kept::Full(x) => first.over(&mut dy.data, &x.data, xs.as_ref()),
            Kept::Half(x) => first.over(&mut dy.data, &x.data, xs.as_ref()),
        };
        let rows = dy.n * dy.h * dy.w;
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
        .gradients()
    }
}

/// The forward pass's affine maps, the branch's and the projection's: `(a, d)` each.
type EndMaps<T> = ((Vec<T>, Vec<T>), (Vec<T>, Vec<T>));

/// The block end's first pass: the ReLU's mask (`out`'s sign, or with a projection the
/// forward maps `maps`) and the per-channel sums, over rows of `c` channels.
struct FirstPass<'a, T, O> {
    out: &'a [O],
    maps: Option<&'a EndMaps<T>>,
    c: usize,
}

impl<T: Float, O: Positive> FirstPass<'_, T, O> {
    /// Masks `g` in place and returns Σ g, Σ g·x and (with a projection whose kept input is
    /// `xs`) Σ g·x_s per channel, for `x` stored in `X`.
    fn over<G: Lhs<T>, X: Lhs<T>>(
        &self,
        g: &mut [G],
        x: &[X],
        xs: Option<&Kept<T>>,
    ) -> [Vec<f64>; 3] {
        match xs {
            None => self.sums::<G, X, T>(g, x, None),
            Some(Kept::Full(s)) => self.sums(g, x, Some(&s.data)),
            Some(Kept::Half(s)) => self.sums(g, x, Some(&s.data)),
        }
    }

    fn sums<G: Lhs<T>, X: Lhs<T>, S: Lhs<T>>(
        &self,
        g: &mut [G],
        x: &[X],
        second: Option<&[S]>,
    ) -> [Vec<f64>; 3] {
        let c = self.c;
        let chunk = CHUNK_ROWS * c;
        let zero = T::zero();
        // Per chunk of rows, in the element type: Σ g, Σ g·x, Σ g·x_s.
        let partials: Vec<[Vec<T>; 3]> = g
            .par_chunks_mut(chunk)
            .zip(self.out.par_chunks(chunk))
            .zip(x.par_chunks(chunk))
            .enumerate()
            .map(|(i, ((gc, oc), xc))| {
                let sc = second.map(|s| &s[i * chunk..i * chunk + xc.len()]);
                simd(
                    #[inline(always)]
                    || {
                        let mut p = [vec![zero; c], vec![zero; c], vec![zero; c]];
                        let [q1, q2, q3] = &mut p;
                        let q = [&mut q1[..c], &mut q2[..c], &mut q3[..c]];
                        let mask = match self.maps {
                            Some(((a, d), (a2, d2))) if sc.is_some() => {
                                EndMask::Affine(a, d, a2, d2)
                            }
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
        s
    }
}

/// A block end's masked output gradient `g` (stored in `G`), the branch batch norm's kept
/// input `x` and what its input gradient needs, and the projection's coefficients and kept
/// input (with a projection).
struct EndSums<T, G> {
    g: Tensor<G>,
    x: Kept<T>,
    grad: InputGradient<T>,
    projected: Option<(InputGradient<T>, Kept<T>)>,
}

/// Where the second pass writes a chunk of rows of an input gradient: over the kept input
/// (in `T`), or into a new bf16 tensor from the input kept in bf16.
enum Target<'a, T> {
    InPlace(&'a mut [T]),
    Rounded(&'a mut [MaybeUninit<bf16>], &'a [bf16]),
}

/// The chunks of `kept`'s gradient (`Target`): in place, or into `out`'s spare capacity
/// (reserved here for the whole tensor).
fn targets<'a, T: Float>(
    kept: &'a mut Kept<T>,
    out: &'a mut Vec<bf16>,
    chunk: usize,
) -> Vec<Target<'a, T>> {
    match kept {
        Kept::Full(x) => x.data.chunks_mut(chunk).map(Target::InPlace).collect(),
        Kept::Half(x) => {
            let len = x.data.len();
            out.reserve_exact(len);
            out.spare_capacity_mut()[..len]
                .chunks_mut(chunk)
                .zip(x.data.chunks(chunk))
                .map(|(o, x)| Target::Rounded(o, x))
                .collect()
        }
    }
}

/// The gradient as the layers keep it: the kept input's tensor (written over), or `out`.
fn gradient<T: Float>(kept: Kept<T>, mut out: Vec<bf16>) -> Act<T> {
    match kept {
        Kept::Full(x) => Act::Full(Arc::new(x)),
        Kept::Half(x) => {
            // SAFETY: the second pass wrote every element of the first x.len() (`targets`).
            unsafe { out.set_len(x.data.len()) };
            let (n, h, w, c) = dims(&x);
            Act::Half(Arc::new(Tensor {
                n,
                h,
                w,
                c,
                data: out,
            }))
        }
    }
}

impl<T: Float, G: Stored<T>> EndSums<T, G> {
    /// The second pass: each input gradient into its `Target`, chunks of rows in parallel.
    /// Returns the branch's and the shortcut's (the projection's, or `g` itself for an
    /// identity).
    fn gradients(self) -> (Act<T>, Act<T>) {
        let EndSums {
            g,
            mut x,
            grad,
            projected,
        } = self;
        let c = g.c;
        let chunk = CHUNK_ROWS * c;
        let (mut out, mut out_s) = (Vec::new(), Vec::new());
        let (grad_s, mut xs) = match projected {
            Some((gs, xs)) => (Some(gs), Some(xs)),
            None => (None, None),
        };
        let branch = targets(&mut x, &mut out, chunk);
        let side: Vec<Option<Target<T>>> = match xs.as_mut() {
            Some(xs) => targets(xs, &mut out_s, chunk)
                .into_iter()
                .map(Some)
                .collect(),
            None => (0..branch.len()).map(|_| None).collect(),
        };
        branch
            .into_par_iter()
            .zip(side)
            .zip(g.data.par_chunks(chunk))
            .for_each(|((t, ts), gc)| match (t, ts, &grad_s) {
                (Target::InPlace(xc), Some(Target::InPlace(sc)), Some(grad_s)) => {
                    both_in_place(&grad, grad_s, xc, sc, gc, c)
                }
                (t, ts, grad_s) => {
                    second_chunk(&grad, t, gc, c);
                    if let (Some(ts), Some(grad_s)) = (ts, grad_s) {
                        second_chunk(grad_s, ts, gc, c);
                    }
                }
            });
        let shortcut = match xs {
            Some(xs) => gradient(xs, out_s),
            None => G::act(g),
        };
        (gradient(x, out), shortcut)
    }
}

/// Both gradients of a chunk of rows written over their kept inputs, row by row (the f32 pass
/// reads each row of `g` once for both).
fn both_in_place<T: Float, G: Lhs<T>>(
    grad: &InputGradient<T>,
    grad_s: &InputGradient<T>,
    xc: &mut [T],
    sc: &mut [T],
    gc: &[G],
    c: usize,
) {
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
}

/// One input gradient over a chunk of rows, into its `Target`: in place, or a block of rows
/// at a time into f32 scratch, then rounded.
fn second_chunk<T: Float, G: Lhs<T>>(
    grad: &InputGradient<T>,
    t: Target<'_, T>,
    gc: &[G],
    c: usize,
) {
    match t {
        Target::InPlace(xc) => simd(
            #[inline(always)]
            || {
                for (xr, gr) in xc.chunks_exact_mut(c).zip(gc.chunks_exact(c)) {
                    grad.row(xr, gr, Gate::<T, T>::Open);
                }
            },
        ),
        Target::Rounded(oc, xc) => {
            let block = rows_per_block(c) * c;
            T::with_scratch(block, |buf| {
                simd(
                    #[inline(always)]
                    || {
                        for ((ob, xb), gb) in oc
                            .chunks_mut(block)
                            .zip(xc.chunks(block))
                            .zip(gc.chunks(block))
                        {
                            let buf = &mut buf[..gb.len()];
                            for ((br, xr), gr) in buf
                                .chunks_exact_mut(c)
                                .zip(xb.chunks_exact(c))
                                .zip(gb.chunks_exact(c))
                            {
                                grad.row_into(br, xr, gr, Gate::<T, T>::Open);
                            }
                            round_bf16(buf, ob);
                        }
                    },
                )
            })
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
fn mask_and_sum_rows<T: Float, G: Lhs<T>, X: Lhs<T>, S: Lhs<T>, O: Positive>(
    g: &mut [G],
    mask: EndMask<'_, T, O>,
    x: &[X],
    s: Option<&[S]>,
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
                zero_where_not_positive::<T, G, O>(&mut g[r0 * c..r1 * c], &out[r0 * c..r1 * c])
            }
            EndMask::Affine(a, d, a2, d2) => {
                let s = s.expect("a projection's input");
                for r in r0..r1 {
                    let o = r * c;
                    let (gr, xr, sr) = (&mut g[o..o + c], &x[o..o + c], &s[o..o + c]);
                    let (a, d, a2, d2) = (&a[..c], &d[..c], &a2[..c], &d2[..c]);
                    for j in 0..c {
                        let t = (xr[j].widen() * a[j] + d[j]) + (sr[j].widen() * a2[j] + d2[j]);
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
                        s3[j] += gr[j].widen() * sr[j].widen();
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
                    q3[j] += gj * s[o + j].widen();
                }
            }
        }
    }
}

/// `g` set to +0 where `out` is not positive, in place. Written as `g = if positive { g } else
/// { 0 }`, LLVM folds the store of a select of what was loaded from the same place into a
/// masked store of the zeros (`vmaskmovps` on AVX2, `vmovups {k}` on AVX-512; AMD cores run
/// either slowly): perf annotate of trainer_norm's layer1 f32 identity end backward on Zen 3,
/// 31% of its mask-and-sum function on those stores. Here each block of lanes gets its masks
/// (all bits or none) through `black_box`, so the compiler cannot see them as a select: the
/// value is anded with its mask and stored plainly. The same bits (a kept value anded with all
/// ones is itself; a dropped one becomes +0, `G::default()`). (The projection's mask, computed
/// from the two inputs, is a select whose load AVX-512 masks instead, and stores plainly.)
#[inline(always)]
fn zero_where_not_positive<T: Float, G: Lhs<T>, O: Positive>(g: &mut [G], out: &[O]) {
    const L: usize = 32;
    let mut gc = g.chunks_exact_mut(L);
    let mut oc = out.chunks_exact(L);
    for (gl, ol) in (&mut gc).zip(&mut oc) {
        let mut m = [G::default(); L];
        for j in 0..L {
            m[j] = G::lane_mask(ol[j].positive());
        }
        let m = std::hint::black_box(m);
        // Every load before the first store: the masks' escaped block could alias g as far as
        // the compiler knows, and anded in place the lanes went one by one.
        let mut kept = [G::default(); L];
        for j in 0..L {
            kept[j] = gl[j].and_mask(m[j]);
        }
        gl.copy_from_slice(&kept);
    }
    for (gj, oj) in gc.into_remainder().iter_mut().zip(oc.remainder()) {
        *gj = if oj.positive() { *gj } else { G::default() };
    }
}
