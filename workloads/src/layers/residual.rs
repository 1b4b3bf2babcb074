//! A residual block's end, `relu(bn(x) + shortcut)`, forward and backward, each in as few
//! passes over the activations as their data dependences allow.

use super::{BatchNorm, Gate, CHUNK_ROWS};
use crate::tensor::{simd, Float, Tensor};
use rayon::prelude::*;
use std::borrow::Cow;
use std::mem::MaybeUninit;

/// What a residual block adds to its normalised branch (`BatchNorm::forward_add_relu`).
pub enum Shortcut<'a, T: Float> {
    /// The block's input.
    Identity(&'a Tensor<T>),
    /// The projection's convolution output, normalised by its own batch norm in the same pass.
    Projected(&'a mut BatchNorm<T>, Tensor<T>),
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
        let c = x.c;
        let (a, d) = self.affine(&x, train);
        let (s, down) = match shortcut {
            Shortcut::Identity(s) => (Cow::Borrowed(s), None),
            Shortcut::Projected(bn, s) => {
                let ad = bn.affine(&s, train);
                (Cow::Owned(s), Some((bn, ad)))
            }
        };
        assert!(x.same_shape(&s), "residual shapes");
        let mut y = Tensor::uninit(x.n, x.h, x.w, c);
        let zero = T::zero();
        let projected = down.is_some();
        let (a2, d2) = match &down {
            Some((_, (a2, d2))) => (&a2[..], &d2[..]),
            None => (&a[..], &d[..]),
        };
        y.data
            .par_chunks_mut(CHUNK_ROWS * c)
            .zip(x.data.par_chunks(CHUNK_ROWS * c))
            .zip(s.data.par_chunks(CHUNK_ROWS * c))
            .for_each(|((yc, xc), sc)| {
                simd(
                    #[inline(always)]
                    || {
                        let (a, d, a2, d2) = (&a[..c], &d[..c], &a2[..c], &d2[..c]);
                        for ((yr, xr), sr) in yc
                            .chunks_exact_mut(c)
                            .zip(xc.chunks_exact(c))
                            .zip(sc.chunks_exact(c))
                        {
                            let (yr, xr, sr) = (&mut yr[..c], &xr[..c], &sr[..c]);
                            if projected {
                                for j in 0..c {
                                    let t = (xr[j] * a[j] + d[j]) + (sr[j] * a2[j] + d2[j]);
                                    yr[j] = MaybeUninit::new(if t < zero { zero } else { t });
                                }
                            } else {
                                for j in 0..c {
                                    let t = (xr[j] * a[j] + d[j]) + sr[j];
                                    yr[j] = MaybeUninit::new(if t < zero { zero } else { t });
                                }
                            }
                        }
                    },
                )
            });
        if train {
            self.input = Some(x);
            if let Some((bn, (a2, d2))) = down {
                bn.input = Some(s.into_owned());
                // The backward pass's mask, recomputed from the inputs it reads anyway.
                self.relu_affine = Some((a, d));
                bn.relu_affine = Some((a2, d2));
            }
        }
        // SAFETY: the chunks of rows cover y, and every row's c elements were written.
        unsafe { y.assume_init() }
    }

    /// The backward pass of `forward_add_relu`, from the gradient `dy` of the block's output
    /// `out` (whose sign is the ReLU's mask; with a projection the mask is recomputed from the
    /// two inputs, read anyway, and `out` is not read), with `projection` the batch norm that was given
    /// in `Shortcut::Projected` (None for `Shortcut::Identity`). Returns the gradients of this
    /// batch norm's input and of the shortcut as it was given: the block's input (identity),
    /// or the projection's convolution output.
    ///
    /// Two passes: the first masks `dy` in place and sums Σ g, Σ g·x and Σ g·x_s (both batch
    /// norms see the same g, so one read of it feeds both); the second writes each input
    /// gradient over its kept input. Separately, the ReLU, each batch norm (two passes) and the
    /// shortcut's sum cost 11 tensor passes with an identity shortcut and 16 with a
    /// projection; these cost 7 and 9, and the sum goes into the products of the block's first
    /// convolution (`Conv2d::backward_add`). The same bits as `relu_backward` followed by each
    /// batch norm's `backward` (the same operations in the same order).
    pub fn backward_add_relu(
        &mut self,
        mut dy: Tensor<T>,
        out: &Tensor<T>,
        mut projection: Option<&mut BatchNorm<T>>,
    ) -> (Tensor<T>, Tensor<T>) {
        let mut x = self.input.take().expect("backward before forward");
        let mut xs = projection
            .as_mut()
            .map(|bn| bn.input.take().expect("backward before forward"));
        assert!(
            x.same_shape(&dy) && out.same_shape(&dy),
            "{}: gradient shape",
            self.gamma.name
        );
        if let Some(s) = &xs {
            assert!(s.same_shape(&dy), "shortcut shape");
        }
        let c = dy.c;
        let chunk = CHUNK_ROWS * c;
        let zero = T::zero();
        let projected = xs.is_some();
        let second = xs.as_ref().map_or(&x.data[..], |s| &s.data[..]);
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
            .zip(second.par_chunks(chunk))
            .map(|(((gc, oc), xc), sc)| {
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
                        mask_and_sum_rows(gc, mask, xc, projected.then_some(sc), q);
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
        let rows = dy.rows();
        let grad = self.input_gradient((s1.clone(), s2), rows);
        let g = &dy.data;
        match (projection, xs.as_mut()) {
            (Some(bn), Some(xs)) => {
                let grad_s = bn.input_gradient((s1, s3), rows);
                x.data
                    .par_chunks_mut(chunk)
                    .zip(xs.data.par_chunks_mut(chunk))
                    .zip(g.par_chunks(chunk))
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
            }
            _ => {
                x.data
                    .par_chunks_mut(chunk)
                    .zip(g.par_chunks(chunk))
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
            }
        }
        match xs {
            Some(xs) => (x, xs),
            None => (x, dy),
        }
    }
}

/// Where the block end's ReLU let the gradient through: its output positive, or (with a
/// projection) `(x·a + d) + (s·a2 + d2)` positive, recomputed from the two inputs.
#[derive(Clone, Copy)]
enum EndMask<'a, T> {
    Out(&'a [T]),
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
fn mask_and_sum_rows<T: Float>(
    g: &mut [T],
    mask: EndMask<'_, T>,
    x: &[T],
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
                    *gj = if *oj > zero { *gj } else { zero };
                }
            }
            EndMask::Affine(a, d, a2, d2) => {
                let s = s.expect("a projection's input");
                for r in r0..r1 {
                    let o = r * c;
                    let (gr, xr, sr) = (&mut g[o..o + c], &x[o..o + c], &s[o..o + c]);
                    let (a, d, a2, d2) = (&a[..c], &d[..c], &a2[..c], &d2[..c]);
                    for j in 0..c {
                        let t = (xr[j] * a[j] + d[j]) + (sr[j] * a2[j] + d2[j]);
                        gr[j] = if t > zero { gr[j] } else { zero };
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
                    s1[j] += gr[j];
                    s2[j] += gr[j] * xr[j];
                }
                if let Some(s) = s {
                    let sr = &s[o..o + G];
                    for j in 0..G {
                        s3[j] += gr[j] * sr[j];
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
                q1[j] += g[o + j];
                q2[j] += g[o + j] * x[o + j];
                if let Some(s) = s {
                    q3[j] += g[o + j] * s[o + j];
                }
            }
        }
    }
}
