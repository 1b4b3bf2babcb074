//! Pooling and the classifier head: max pooling (the stem), global average pooling, the fully
//! connected layer, softmax cross-entropy.

use super::act::relu_affine;
use super::{Act, Param};
use crate::tensor::{fill_uninit, gemm, simd, Float, Lhs, Mat, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;

/// Max pooling, 3×3, stride 2, padding 1 (ResNet's stem).
///
/// The forward pass keeps, for each output, which of its nine taps won (one byte, `NO_TAP`
/// where none lay inside the image), not the input's index: a quarter of the bytes. The
/// backward pass gathers: each input element sums the output gradients of the (at most four)
/// windows whose winning tap it was, in the order of the outputs (the bits of a scatter in
/// output order into zeros), and is written once; no zero-filled gradient is read back.
pub struct MaxPool<T> {
    taps: Vec<u8>,
    input_shape: (usize, usize, usize, usize),
    _t: std::marker::PhantomData<T>,
}

/// A window with no tap inside the image (none with these sizes: every window holds its
/// centre), whose output is zero and passes no gradient.
const NO_TAP: u8 = 9;

impl<T: Float> Default for MaxPool<T> {
    fn default() -> Self {
        MaxPool {
            taps: Vec::new(),
            input_shape: (0, 0, 0, 0),
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Float> MaxPool<T> {
    /// The output size for an input of `h × w`.
    fn output_size(h: usize, w: usize) -> (usize, usize) {
        ((h + 2 - 3) / 2 + 1, (w + 2 - 3) / 2 + 1)
    }

    pub fn forward(&mut self, x: &Tensor<T>) -> Tensor<T> {
        self.forward_of(x, None)
    }

    /// `forward` of `max(x·a + d, 0)` per channel (a batch norm's affine map and its ReLU),
    /// computed for each tap as it is read: the normalised tensor is never written (the
    /// stem's, 103 MB at batch 32, was written, then read back by the pool). The same bits as
    /// `forward` of that tensor (the same operations).
    /// The input may be stored in bf16 (the stem convolution's output in bf16 training).
    pub fn forward_relu_affine<S: Lhs<T>>(&mut self, x: &Tensor<S>, a: &[T], d: &[T]) -> Tensor<T> {
        assert!(
            a.len() == x.c && d.len() == x.c,
            "max pool: one map per channel"
        );
        self.forward_of(x, Some((a, d)))
    }

    /// Without a map the input is read in place, so it is in `T` (`forward`).
    fn forward_of<S: Lhs<T>>(&mut self, x: &Tensor<S>, map: Option<(&[T], &[T])>) -> Tensor<T> {
        // SAFETY: S is T where the cast is taken.
        let direct: Option<&[T]> = (std::any::TypeId::of::<S>() == std::any::TypeId::of::<T>())
            .then(|| unsafe { &*(&x.data[..] as *const [S] as *const [T]) });
        assert!(
            map.is_some() || direct.is_some(),
            "max pool: a bf16 input without a map"
        );
        let (oh, ow) = Self::output_size(x.h, x.w);
        let mut y = Tensor::uninit(x.n, oh, ow, x.c);
        let mut taps = Vec::with_capacity(y.data.len());
        taps.resize(y.data.len(), std::mem::MaybeUninit::<u8>::uninit());
        let c = x.c;
        y.data
            .par_chunks_mut(oh * ow * c)
            .zip(taps.par_chunks_mut(oh * ow * c))
            .enumerate()
            .for_each(|(n, (yi, ti))| {
                let image = x.h * x.w * c;
                let xi = &x.data[n * image..(n + 1) * image];
                // Empty for a bf16 input, which a map reads instead (asserted above).
                let xd = direct.map_or(&[][..], |d| &d[n * image..(n + 1) * image]);
                let mut mapped = vec![T::zero(); if map.is_some() { c } else { 0 }];
                let (mut best_a, mut best_b) = (vec![T::zero(); c], vec![T::zero(); c]);
                let (mut taken_a, mut taken_b) = (vec![0u32; c], vec![0u32; c]);
                // Taps in order (ky, kx), channels the vector lanes: the first valid tap is
                // taken, a later one only where strictly greater (the first maximum wins).
                simd(
                    #[inline(always)]
                    || {
                        let zero = T::zero();
                        for oy in 0..oh {
                            for ox in 0..ow {
                                // The two input rows this output row reads first (the third
                                // was the last output row's), AHEAD pixels on.
                                let ahead = (ox * 2 + AHEAD) * c;
                                for iy in [oy * 2, oy * 2 + 1] {
                                    let at = xi.as_ptr().wrapping_add(iy * x.w * c + ahead);
                                    for line in (0..2 * c).step_by(64 / size_of::<S>()) {
                                        prefetch(at.wrapping_add(line));
                                    }
                                }
                                // The window's taps inside the image: where each row starts,
                                // and its number.
                                let mut window = [(0usize, 0u8); 9];
                                let mut count = 0;
                                for ky in 0..3 {
                                    let iy = (oy * 2 + ky) as isize - 1;
                                    if iy < 0 || iy >= x.h as isize {
                                        continue;
                                    }
                                    for kx in 0..3 {
                                        let ix = (ox * 2 + kx) as isize - 1;
                                        if ix < 0 || ix >= x.w as isize {
                                            continue;
                                        }
                                        let base = ((iy as usize) * x.w + ix as usize) * c;
                                        window[count] = (base, (ky * 3 + kx) as u8);
                                        count += 1;
                                    }
                                }
                                // Running maxima and their taps, tap by tap from one pair of
                                // buffers into the other: a select written back where it was
                                // read became a masked store (`vmaskmovps`), which AMD cores
                                // run slowly (the stem's pool took 95–128 ms a step on a Zen
                                // 3; with a branch per channel it did not vectorise on AVX2).
                                let (mut best, mut next) = (&mut best_a[..], &mut best_b[..]);
                                let (mut taken, mut tnext) = (&mut taken_a[..], &mut taken_b[..]);
                                for (t, &(base, tap)) in window[..count].iter().enumerate() {
                                    let row = match map {
                                        None => &xd[base..base + c],
                                        Some((a, d)) => {
                                            let r = &xi[base..base + c];
                                            relu_affine(&mut mapped[..c], r, a, d, zero);
                                            &mapped[..c]
                                        }
                                    };
                                    let tap = tap as u32;
                                    if t == 0 {
                                        best.copy_from_slice(row);
                                        taken.fill(tap);
                                        continue;
                                    }
                                    let lanes = next.iter_mut().zip(tnext.iter_mut());
                                    let old = best.iter().zip(taken.iter()).zip(row);
                                    for ((n, tn), ((&b, &k), &v)) in lanes.zip(old) {
                                        let greater = v > b;
                                        *n = if greater { v } else { b };
                                        *tn = if greater { tap } else { k };
                                    }
                                    std::mem::swap(&mut best, &mut next);
                                    std::mem::swap(&mut taken, &mut tnext);
                                }
                                let o = (oy * ow + ox) * c;
                                let (yo, to) = (&mut yi[o..o + c], &mut ti[o..o + c]);
                                if count == 0 {
                                    fill_uninit(yo, zero);
                                    fill_uninit(to, NO_TAP);
                                    continue;
                                }
                                for ((y, t), (&b, &k)) in
                                    yo.iter_mut().zip(to).zip(best.iter().zip(taken.iter()))
                                {
                                    *y = MaybeUninit::new(b);
                                    *t = MaybeUninit::new(k as u8);
                                }
                            }
                        }
                    },
                )
            });
        // SAFETY: every output and its tap were written (zero and NO_TAP without a tap).
        self.taps = unsafe { std::mem::transmute::<Vec<std::mem::MaybeUninit<u8>>, Vec<u8>>(taps) };
        self.input_shape = (x.n, x.h, x.w, x.c);
        // SAFETY: as the taps.
        unsafe { y.assume_init() }
    }

    /// The index in its image of the input element that output element `o` (counted over the
    /// batch) took, `None` where its window held no input.
    pub fn source(&self, o: usize) -> Option<usize> {
        let (_, h, w, c) = self.input_shape;
        let (oh, ow) = Self::output_size(h, w);
        let tap = self.taps[o];
        if tap == NO_TAP {
            return None;
        }
        let (j, p) = (o % c, (o / c) % (oh * ow));
        let (iy, ix) = (
            (p / ow) * 2 + tap as usize / 3 - 1,
            (p % ow) * 2 + tap as usize % 3 - 1,
        );
        Some((iy * w + ix) * c + j)
    }

    pub fn backward(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        let (n, h, w, c) = self.input_shape;
        let (oh, ow) = (dy.h, dy.w);
        assert_eq!(
            (dy.n, oh, ow, dy.c),
            (n, Self::output_size(h, w).0, Self::output_size(h, w).1, c),
            "max pool: gradient shape"
        );
        let mut dx = Tensor::uninit(n, h, w, c);
        let per_out = oh * ow * c;
        dx.data
            .par_chunks_mut(h * w * c)
            .enumerate()
            .for_each(|(img, dxi)| {
                let (dyi, ti) = (
                    &dy.data[img * per_out..(img + 1) * per_out],
                    &self.taps[img * per_out..(img + 1) * per_out],
                );
                simd(
                    #[inline(always)]
                    || {
                        for iy in 0..h {
                            // The windows holding row iy, in output order: iy = 2·oy − 1 + ky.
                            let rows = windows(iy, oh);
                            // The last window row of this input row, AHEAD / 2 windows
                            // on: its gradient and taps, read first here.
                            let oy_last = iy.div_ceil(2).min(oh - 1);
                            for ix in 0..w {
                                if ix % 2 == 0 {
                                    let o = (oy_last * ow + ix / 2 + AHEAD / 2) * c;
                                    let g = dyi.as_ptr().wrapping_add(o);
                                    for line in (0..c).step_by(64 / size_of::<T>()) {
                                        prefetch(g.wrapping_add(line));
                                    }
                                    for line in (0..c).step_by(64) {
                                        prefetch(ti.as_ptr().wrapping_add(o + line));
                                    }
                                }
                                let cols = windows(ix, ow);
                                let i = (iy * w + ix) * c;
                                let d = fill_uninit(&mut dxi[i..i + c], T::zero());
                                for &(oy, ky) in rows.iter().flatten() {
                                    for &(ox, kx) in cols.iter().flatten() {
                                        let o = (oy * ow + ox) * c;
                                        let tap = (ky * 3 + kx) as u8;
                                        let (g, t) = (&dyi[o..o + c], &ti[o..o + c]);
                                        // A select, not a branch: adding +0 leaves a
                                        // sum begun at +0 as it is.
                                        for j in 0..c {
                                            d[j] += if t[j] == tap { g[j] } else { T::zero() };
                                        }
                                    }
                                }
                            }
                        }
                    },
                )
            });
        // SAFETY: every input element's gradient was written (zero first).
        unsafe { dx.assume_init() }
    }
}

/// How far ahead (input pixels) the max pool asks for what it reads first: its input rows
/// (forward: three rows read at once, two of them for the first time), the output gradient's
/// rows and taps (backward). Without, both waited on DRAM (trainer_norm stem.maxpool, the
/// input's loads 60% of the forward pass in perf): forward 11.3–11.6 → 16.4–18.4 GiB/s,
/// backward 15.7 → 32.6–33.6 (against a DRAM triad of 52.7). 16 and 32 were slower (forward
/// 16.2–17.0, 15.8–16.1).
const AHEAD: usize = 8;

/// Asks for the cache line at `p` into L1 (x86-64; nothing elsewhere): a hint, which never
/// faults, past an allocation's end too.
#[inline(always)]
fn prefetch<T>(p: *const T) {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: a prefetch reads nothing the program sees and never faults.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(p as *const i8)
    };
    #[cfg(not(target_arch = "x86_64"))]
    let _ = p;
}

/// The windows (of `outs` along one axis) that hold input position `i`, each with the tap
/// `i` is in it, in output order: at most two.
#[inline(always)]
fn windows(i: usize, outs: usize) -> [Option<(usize, usize)>; 2] {
    // i = 2·o − 1 + k, k in 0..3.
    let mut v = [None, None];
    let mut at = 0;
    for k in [2usize, 1, 0] {
        if (i + 1) >= k && (i + 1 - k).is_multiple_of(2) {
            let o = (i + 1 - k) / 2;
            if o < outs {
                v[at] = Some((o, k));
                at += 1;
            }
        }
    }
    v
}

/// Global average pooling: n × h × w × c → n × 1 × 1 × c.
pub fn avgpool_forward<T: Float>(x: &Tensor<T>) -> Tensor<T> {
    avgpool_of(x)
}

/// `avgpool_forward` of an activation kept in either precision (sums in `T`).
pub fn avgpool_forward_act<T: Float>(x: &Act<T>) -> Tensor<T> {
    match x {
        Act::Full(t) => avgpool_of(t),
        Act::Half(t) => avgpool_of(t),
    }
}

fn avgpool_of<T: Float, S: Lhs<T>>(x: &Tensor<S>) -> Tensor<T> {
    let hw = x.h * x.w;
    let inv = T::from_f64(1.0 / hw as f64);
    let mut y = Tensor::zeros(x.n, 1, 1, x.c);
    for n in 0..x.n {
        for p in 0..hw {
            let row = &x.data[(n * hw + p) * x.c..(n * hw + p + 1) * x.c];
            for (o, v) in y.data[n * x.c..(n + 1) * x.c].iter_mut().zip(row) {
                *o += v.widen();
            }
        }
        for o in &mut y.data[n * x.c..(n + 1) * x.c] {
            *o *= inv;
        }
    }
    y
}

pub fn avgpool_backward<T: Float>(dy: &Tensor<T>, h: usize, w: usize) -> Tensor<T> {
    let inv = T::from_f64(1.0 / (h * w) as f64);
    let mut dx = Tensor::zeros(dy.n, h, w, dy.c);
    let c = dy.c;
    dx.data
        .par_chunks_mut(h * w * c)
        .enumerate()
        .for_each(|(n, di)| {
            for row in di.chunks_exact_mut(c) {
                for (d, g) in row.iter_mut().zip(&dy.data[n * c..(n + 1) * c]) {
                    *d = *g * inv;
                }
            }
        });
    dx
}

/// A fully connected layer `y = x·W + b` (W is in × out).
pub struct Linear<T> {
    pub weight: Param<T>,
    pub bias: Param<T>,
    pub inputs: usize,
    pub outputs: usize,
    input: Option<Tensor<T>>,
}

impl<T: Float> Linear<T> {
    /// Uniform ±1/√in, as torchvision's default for the classifier.
    pub fn new(name: &str, inputs: usize, outputs: usize, rng: &mut crate::data::Rng) -> Linear<T> {
        let bound = 1.0 / (inputs as f64).sqrt();
        Linear {
            weight: Param::new(
                format!("{name}.weight"),
                (0..inputs * outputs)
                    .map(|_| T::from_f64(rng.uniform(-bound, bound)))
                    .collect(),
                true,
            ),
            bias: Param::new(
                format!("{name}.bias"),
                (0..outputs)
                    .map(|_| T::from_f64(rng.uniform(-bound, bound)))
                    .collect(),
                false,
            ),
            inputs,
            outputs,
            input: None,
        }
    }

    pub fn forward(&mut self, x: &Tensor<T>) -> Tensor<T> {
        let n = x.rows();
        assert_eq!(x.c, self.inputs, "{}: input features", self.weight.name);
        let mut y = Tensor::zeros(x.n, x.h, x.w, self.outputs);
        for row in y.data.chunks_exact_mut(self.outputs) {
            row.copy_from_slice(&self.bias.value);
        }
        // SAFETY: x n × in, W in × out, y n × out.
        unsafe {
            gemm(
                n,
                self.outputs,
                self.inputs,
                y.data.as_mut_ptr(),
                self.outputs,
                true,
                Mat::rows(x.data.as_ptr(), self.inputs),
                Mat::rows(self.weight.value.as_ptr(), self.outputs),
                true,
            )
        };
        self.input = Some(x.clone());
        y
    }

    pub fn backward(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        let x = self.input.take().expect("backward before forward");
        let n = x.rows();
        // SAFETY: xᵀ in × n, dy n × out → dW in × out; dy n × out, Wᵀ out × in → dx n × in.
        unsafe {
            gemm(
                self.inputs,
                self.outputs,
                n,
                self.weight.grad.as_mut_ptr(),
                self.outputs,
                false,
                Mat::transposed(x.data.as_ptr(), self.inputs),
                Mat::rows(dy.data.as_ptr(), self.outputs),
                true,
            );
        }
        for (j, g) in self.bias.grad.iter_mut().enumerate() {
            *g = (0..n).fold(T::zero(), |s, i| s + dy.data[i * self.outputs + j]);
        }
        let mut dx = Tensor::zeros(x.n, x.h, x.w, self.inputs);
        // SAFETY: as above.
        unsafe {
            gemm(
                n,
                self.inputs,
                self.outputs,
                dx.data.as_mut_ptr(),
                self.inputs,
                false,
                Mat::rows(dy.data.as_ptr(), self.outputs),
                Mat::transposed(self.weight.value.as_ptr(), self.outputs),
                true,
            );
        }
        dx
    }
}

/// Softmax cross-entropy with label smoothing ε: mean over the batch of −Σ t·log softmax(z),
/// t = (1−ε)·onehot + ε/K. Returns (loss, ∂loss/∂logits, correct top-1, correct top-5).
pub fn softmax_cross_entropy<T: Float>(
    logits: &Tensor<T>,
    labels: &[usize],
    smoothing: f64,
) -> (f64, Tensor<T>, usize, usize) {
    let k = logits.c;
    let n = logits.rows();
    assert_eq!(labels.len(), n, "one label per row");
    let mut grad = Tensor::zeros(logits.n, logits.h, logits.w, k);
    let (mut loss, mut top1, mut top5) = (0.0, 0, 0);
    for (i, (&label, z)) in labels.iter().zip(logits.data.chunks_exact(k)).enumerate() {
        let max = z.iter().fold(f64::NEG_INFINITY, |m, v| m.max(v.to_f64()));
        let sum: f64 = z.iter().map(|v| (v.to_f64() - max).exp()).sum();
        let lse = max + sum.ln();
        for (j, (zj, g)) in z
            .iter()
            .zip(grad.data[i * k..(i + 1) * k].iter_mut())
            .enumerate()
        {
            let p = (zj.to_f64() - lse).exp();
            let t = if j == label { 1.0 - smoothing } else { 0.0 } + smoothing / k as f64;
            loss -= t * (zj.to_f64() - lse);
            *g = T::from_f64((p - t) / n as f64);
        }
        let zl = z[label].to_f64();
        let higher = z.iter().filter(|v| v.to_f64() > zl).count();
        top1 += (higher == 0) as usize;
        top5 += (higher < 5) as usize;
    }
    (loss / n as f64, grad, top1, top5)
}
