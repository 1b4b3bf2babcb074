//! Layers with explicit forward and backward passes. Each keeps what its backward pass needs
//! from the last forward pass; parameter gradients are overwritten by each backward pass.

use crate::conv::{self, ConvShape};
use crate::tensor::{simd, Float, Lhs, Positive, Tensor};
use rayon::prelude::*;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Sums across the ranks of a data-parallel run: the communication layer's (`kernels::comm`).
pub use roofline_kernels::comm::Reducer;

mod act;
mod head;
mod residual;
mod residual_backward;
pub use act::{Act, Kept};
pub use head::{
    avgpool_backward, avgpool_forward, avgpool_forward_act, softmax_cross_entropy, Linear, MaxPool,
};
pub use residual::Shortcut;

/// A trainable parameter with its gradient and momentum buffer.
#[derive(Clone, Debug)]
pub struct Param<T> {
    pub name: String,
    pub value: Vec<T>,
    pub grad: Vec<T>,
    pub momentum: Vec<T>,
    /// Whether weight decay applies (not to batch-norm parameters or biases by default).
    pub decay: bool,
}

impl<T: Float> Param<T> {
    pub fn new(name: String, value: Vec<T>, decay: bool) -> Param<T> {
        let n = value.len();
        Param {
            name,
            value,
            grad: vec![T::zero(); n],
            momentum: vec![T::zero(); n],
            decay,
        }
    }
}

/// Rows per parallel chunk of the element-wise layers.
const CHUNK_ROWS: usize = 256;

/// Where a ReLU let batch norm's output gradient through (its backward pass's mask).
#[derive(Clone, Copy)]
enum Gate<'a, T, M> {
    /// No ReLU: everywhere.
    Open,
    /// Where the ReLU's output (kept in any precision) is positive.
    Output(&'a [M]),
    /// Where `x·a + d > 0` for the kept input `x` and the forward pass's affine map: the test
    /// the forward ReLU made, recomputed from a tensor the pass reads anyway instead of reading
    /// the ReLU's output (twice: two of the pass's seven tensor reads and writes).
    Affine(&'a [T], &'a [T]),
}

impl<'a, T: Float, M: Positive> Gate<'a, T, M> {
    /// This gate for the `len` elements from `at` on (an output mask is cut; the others are
    /// per channel).
    fn at(self, at: usize, len: usize) -> Self {
        match self {
            Gate::Output(m) => Gate::Output(&m[at..at + len]),
            g => g,
        }
    }

    /// Whether element `i` (channel `j`, input value `x`) passes.
    #[inline(always)]
    fn passes(&self, i: usize, j: usize, x: T) -> bool {
        match self {
            Gate::Open => true,
            Gate::Output(m) => m[i].positive(),
            Gate::Affine(a, d) => x * a[j] + d[j] > T::zero(),
        }
    }
}

/// Per-channel sums over the rows of an NHWC tensor: (Σ g, Σ g·b) for each channel, where g is
/// `a` where the `gate` (on `b`, the batch norm's input) lets it through, zero elsewhere. Each
/// chunk of rows sums in the element type (vectorised); the chunks' partial sums are added in
/// f64 in chunk order (deterministic).
fn sums<T: Float, A: Lhs<T>, B: Lhs<T>, M: Positive>(
    a: &[A],
    b: &[B],
    gate: Gate<'_, T, M>,
    c: usize,
) -> (Vec<f64>, Vec<f64>) {
    let chunk = CHUNK_ROWS * c;
    let zero = T::zero();
    let partials: Vec<(Vec<T>, Vec<T>)> = a
        .par_chunks(chunk)
        .zip(b.par_chunks(chunk))
        .enumerate()
        .map(|(i, (ac, bc))| {
            let gate = gate.at(i * chunk, ac.len());
            simd(
                #[inline(always)]
                || {
                    let mut p1 = vec![zero; c];
                    let mut p2 = vec![zero; c];
                    sum_rows(ac, bc, gate, &mut p1[..c], &mut p2[..c]);
                    (p1, p2)
                },
            )
        })
        .collect();
    let (mut s1, mut s2) = (vec![0.0f64; c], vec![0.0f64; c]);
    for (p1, p2) in &partials {
        for j in 0..c {
            s1[j] += p1[j].to_f64();
            s2[j] += p2[j].to_f64();
        }
    }
    (s1, s2)
}

/// Channels per group whose partial sums `sum_rows` keeps in registers (4 AVX-512 vectors of
/// f32 each for Σ g and Σ g·b).
const SUM_GROUP: usize = 64;
/// Rows per block of `sum_rows`: a group's partial sums go through memory once a block.
const SUM_ROWS: usize = 16;

/// `q1 += Σ g`, `q2 += Σ g·b` over the rows of a chunk (g as in `sums`), each channel summed
/// row after row (the order, and so the bits, of a plain loop over rows). Summed row by row
/// into `q1` and `q2` in memory, each row's sum waited on the last one's store: the statistics
/// pass ran at a third of the copy's speed. Here each group of `SUM_GROUP` channels is summed
/// in registers over a block of `SUM_ROWS` rows.
#[inline(always)]
fn sum_rows<T: Float, A: Lhs<T>, B: Lhs<T>, M: Positive>(
    a: &[A],
    b: &[B],
    gate: Gate<'_, T, M>,
    q1: &mut [T],
    q2: &mut [T],
) {
    const G: usize = SUM_GROUP;
    let c = q1.len();
    let rows = a.len() / c;
    let full = c / G * G;
    let zero = T::zero();
    for r0 in (0..rows).step_by(SUM_ROWS) {
        let r1 = (r0 + SUM_ROWS).min(rows);
        for g0 in (0..full).step_by(G) {
            let mut s1: [T; G] = q1[g0..g0 + G].try_into().expect("a group");
            let mut s2: [T; G] = q2[g0..g0 + G].try_into().expect("a group");
            for r in r0..r1 {
                let o = r * c + g0;
                let (ar, br) = (&a[o..o + G], &b[o..o + G]);
                match gate {
                    Gate::Open => {
                        for j in 0..G {
                            s1[j] += ar[j].widen();
                            s2[j] += ar[j].widen() * br[j].widen();
                        }
                    }
                    Gate::Output(mask) => {
                        let mr = &mask[o..o + G];
                        for j in 0..G {
                            let g = if mr[j].positive() {
                                ar[j].widen()
                            } else {
                                zero
                            };
                            s1[j] += g;
                            s2[j] += g * br[j].widen();
                        }
                    }
                    Gate::Affine(fa, fd) => {
                        let (fa, fd) = (&fa[g0..g0 + G], &fd[g0..g0 + G]);
                        for j in 0..G {
                            let x = br[j].widen();
                            let g = if x * fa[j] + fd[j] > zero {
                                ar[j].widen()
                            } else {
                                zero
                            };
                            s1[j] += g;
                            s2[j] += g * x;
                        }
                    }
                }
            }
            q1[g0..g0 + G].copy_from_slice(&s1);
            q2[g0..g0 + G].copy_from_slice(&s2);
        }
        // The channels past the last whole group, row by row.
        for r in r0..r1 {
            let o = r * c;
            for j in full..c {
                let x = b[o + j].widen();
                let g = if gate.passes(o + j, j, x) {
                    a[o + j].widen()
                } else {
                    zero
                };
                q1[j] += g;
                q2[j] += g * x;
            }
        }
    }
}

/// Per-channel sums over every rank's rows (unchanged in a single process): batch norm's
/// statistics on the CPU and on the GPU.
pub(crate) fn global_sums(
    reducer: Option<&Arc<dyn Reducer>>,
    (mut a, mut b): (Vec<f64>, Vec<f64>),
) -> (Vec<f64>, Vec<f64>) {
    if let Some(r) = reducer {
        let c = a.len();
        a.append(&mut b);
        r.sum_f64(&mut a);
        b = a.split_off(c);
    }
    (a, b)
}

/// Batch norm's statistics from the global (Σ x, Σ x²) over `m` rows: (mean, 1/σ) per
/// channel, in f64 rounded once to `T`; the running statistics move by `momentum` (unbiased
/// variance). Shared by the CPU and GPU layers.
pub(crate) fn batch_statistics<T: Float>(
    (s1, s2): (Vec<f64>, Vec<f64>),
    m: f64,
    eps: f64,
    momentum: f64,
    running_mean: &mut [T],
    running_var: &mut [T],
) -> (Vec<T>, Vec<T>) {
    let c = s1.len();
    let mut mean = Vec::with_capacity(c);
    let mut inv = Vec::with_capacity(c);
    for j in 0..c {
        let mu = s1[j] / m;
        let var = (s2[j] / m - mu * mu).max(0.0);
        let unbiased = if m > 1.0 { var * m / (m - 1.0) } else { var };
        running_mean[j] = T::from_f64((1.0 - momentum) * running_mean[j].to_f64() + momentum * mu);
        running_var[j] =
            T::from_f64((1.0 - momentum) * running_var[j].to_f64() + momentum * unbiased);
        mean.push(T::from_f64(mu));
        inv.push(T::from_f64(1.0 / (var + eps).sqrt()));
    }
    (mean, inv)
}

/// Inference statistics: (running mean, 1/σ of the running variance).
pub(crate) fn running_statistics<T: Float>(
    running_mean: &[T],
    running_var: &[T],
    eps: f64,
) -> (Vec<T>, Vec<T>) {
    (
        running_mean.to_vec(),
        running_var
            .iter()
            .map(|v| T::from_f64(1.0 / (v.to_f64() + eps).sqrt()))
            .collect(),
    )
}

/// What batch norm's backward pass needs per channel, from the global (Σ g, Σ g·x) over `m`
/// rows (g: the masked output gradient): γ and β gradients as this rank's share of the global
/// sums (the gradient allreduce, a sum, restores them once), and the means of g and of g·x̂.
pub(crate) struct BackwardCoefficients<T> {
    pub dgamma: Vec<T>,
    pub dbeta: Vec<T>,
    pub mean_g: Vec<T>,
    pub mean_gx: Vec<T>,
}

pub(crate) fn backward_coefficients<T: Float>(
    (sd, sdx): (Vec<f64>, Vec<f64>),
    mean: &[T],
    inv: &[T],
    m: f64,
    ranks: usize,
) -> BackwardCoefficients<T> {
    let share = 1.0 / ranks as f64;
    // Σ g·x̂ = (Σ g·x − μ Σ g)/σ.
    let dgamma: Vec<f64> = (0..sd.len())
        .map(|j| (sdx[j] - mean[j].to_f64() * sd[j]) * inv[j].to_f64())
        .collect();
    BackwardCoefficients {
        dgamma: dgamma.iter().map(|v| T::from_f64(v * share)).collect(),
        dbeta: sd.iter().map(|v| T::from_f64(v * share)).collect(),
        mean_g: sd.iter().map(|v| T::from_f64(v / m)).collect(),
        mean_gx: dgamma.iter().map(|v| T::from_f64(v / m)).collect(),
    }
}

/// A 2-D convolution without bias (ResNet's convolutions are followed by batch norm).
pub struct Conv2d<T> {
    pub shape: ConvShape,
    pub weight: Param<T>,
    input: Option<Act<T>>,
}

impl<T: Float> Conv2d<T> {
    /// He-initialised (normal, fan-out mode, as torchvision's ResNet) from `rng`.
    pub fn new(
        name: &str,
        c: usize,
        k: usize,
        r: usize,
        stride: usize,
        pad: usize,
        rng: &mut crate::data::Rng,
    ) -> Conv2d<T> {
        let std = (2.0 / (k * r * r) as f64).sqrt();
        let w = (0..r * r * c * k)
            .map(|_| T::from_f64(rng.normal() * std))
            .collect();
        Conv2d {
            shape: ConvShape {
                n: 0,
                c,
                h: 0,
                w: 0,
                k,
                r,
                s: r,
                stride,
                pad,
            },
            weight: Param::new(format!("{name}.weight"), w, true),
            input: None,
        }
    }

    fn shape_for<S>(&self, x: &Tensor<S>) -> ConvShape {
        shape_for(&self.shape, &self.weight.name, x)
    }

    /// The input is shared, not copied: the backward pass needs it for the filter gradient.
    pub fn forward(&mut self, x: &Arc<Tensor<T>>) -> Tensor<T> {
        self.forward_act(&Act::Full(Arc::clone(x)))
    }

    /// `forward` from a ReLU output kept in either precision.
    pub fn forward_act(&mut self, x: &Act<T>) -> Tensor<T> {
        let sh = match x {
            Act::Full(t) => self.shape_for(t),
            Act::Half(t) => self.shape_for(t),
        };
        let mut y = Tensor::uninit(sh.n, sh.oh(), sh.ow(), sh.k);
        match x {
            Act::Full(t) => conv::forward_into(&t.data, &self.weight.value, &mut y.data, &sh),
            Act::Half(t) => conv::forward_into(&t.data, &self.weight.value, &mut y.data, &sh),
        }
        self.input = Some(x.clone());
        // SAFETY: forward_into writes every output element.
        unsafe { y.assume_init() }
    }

    /// The filter gradient alone (for a layer whose input needs no gradient).
    pub fn backward_filter_only(&mut self, dy: &Tensor<T>) {
        self.filter_gradient(&dy.data);
    }

    /// `backward_filter_only` from an output gradient kept in either precision.
    pub fn backward_filter_only_act(&mut self, dy: &Act<T>) {
        match dy {
            Act::Full(t) => self.filter_gradient(&t.data),
            Act::Half(t) => self.filter_gradient(&t.data),
        };
    }

    /// The filter gradient, from the input kept by the last forward pass (then let go) and
    /// the output gradient `dy` (in `T` or bf16); returns the convolution's shape.
    pub fn filter_gradient<D: Lhs<T>>(&mut self, dy: &[D]) -> ConvShape {
        let x = self.input.take().expect("backward before forward");
        let (name, g) = (&self.weight.name, &mut self.weight.grad);
        match &x {
            Act::Full(t) => {
                let sh = shape_for(&self.shape, name, t);
                conv::backward_filter(&t.data, dy, g, &sh);
                sh
            }
            Act::Half(t) => {
                let sh = shape_for(&self.shape, name, t);
                conv::backward_filter(&t.data, dy, g, &sh);
                sh
            }
        }
    }

    pub fn backward(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        self.backward_from(&dy.data)
    }

    /// `backward` from an output gradient kept in either precision.
    pub fn backward_act(&mut self, dy: &Act<T>) -> Tensor<T> {
        match dy {
            Act::Full(t) => self.backward_from(&t.data),
            Act::Half(t) => self.backward_from(&t.data),
        }
    }

    fn backward_from<D: Lhs<T>>(&mut self, dy: &[D]) -> Tensor<T> {
        let sh = self.filter_gradient(dy);
        let mut dx = Tensor::uninit(sh.n, sh.h, sh.w, sh.c);
        conv::backward_data_into(dy, &self.weight.value, &mut dx.data, &sh);
        // SAFETY: backward_data_into writes every element (a GEMM without accumulation, or
        // zero-filled images for col2im).
        unsafe { dx.assume_init() }
    }

    /// `backward` with the input gradient added to `dx`, which holds another path's gradient
    /// of the same input (a residual block's shortcut): the products add it, and no pass over
    /// both tensors is needed. The output gradient in either precision.
    pub fn backward_add(&mut self, dy: &Act<T>, dx: &mut Tensor<T>) {
        match dy {
            Act::Full(t) => self.backward_add_from(&t.data, dx),
            Act::Half(t) => self.backward_add_from(&t.data, dx),
        }
    }

    fn backward_add_from<D: Lhs<T>>(&mut self, dy: &[D], dx: &mut Tensor<T>) {
        let sh = self.added_shape(dy, dx);
        conv::backward_data_add(dy, &self.weight.value, &mut dx.data, &sh);
    }

    /// The filter gradient from `dy` (`filter_gradient`), and the shape of the input gradient
    /// that the backward pass adds into `dx`, checked against `dx`'s (in either precision).
    fn added_shape<D: Lhs<T>, U>(&mut self, dy: &[D], dx: &Tensor<U>) -> ConvShape {
        let sh = self.filter_gradient(dy);
        assert_eq!(
            (sh.n, sh.h, sh.w, sh.c),
            (dx.n, dx.h, dx.w, dx.c),
            "{}: input gradient shape",
            self.weight.name
        );
        sh
    }
}

/// A convolution's shape for input `x` (its batch and size; its channels checked against the
/// filter `name`'s).
pub fn shape_for<T>(shape: &ConvShape, name: &str, x: &Tensor<T>) -> ConvShape {
    assert_eq!(x.c, shape.c, "{name}: input channels");
    ConvShape {
        n: x.n,
        h: x.h,
        w: x.w,
        ..*shape
    }
}

/// Batch normalisation over N·H·W per channel, with running statistics for inference.
pub struct BatchNorm<T> {
    pub gamma: Param<T>,
    pub beta: Param<T>,
    pub running_mean: Vec<T>,
    pub running_var: Vec<T>,
    pub momentum: f64,
    pub eps: f64,
    /// The input kept for the backward pass: in `T`, or in bf16 (a convolution's output in
    /// bf16 training: `Kept`).
    input: Option<Kept<T>>,
    mean: Vec<T>,
    inv_std: Vec<T>,
    /// The forward pass's affine map `(a, d)` where it applied the ReLU itself: the backward
    /// pass's gate (`Gate::Affine`).
    relu_affine: Option<(Vec<T>, Vec<T>)>,
    /// Data-parallel runs: statistics over the global batch (synchronised batch norm), so that
    /// N ranks compute what one process computes on the whole batch.
    pub reducer: Option<Arc<dyn Reducer>>,
}

impl<T: Float> BatchNorm<T> {
    pub fn new(name: &str, c: usize, gamma: f64) -> BatchNorm<T> {
        BatchNorm {
            gamma: Param::new(format!("{name}.weight"), vec![T::from_f64(gamma); c], false),
            beta: Param::new(format!("{name}.bias"), vec![T::zero(); c], false),
            running_mean: vec![T::zero(); c],
            running_var: vec![T::one(); c],
            momentum: 0.1,
            eps: 1e-5,
            input: None,
            mean: Vec::new(),
            inv_std: Vec::new(),
            relu_affine: None,
            reducer: None,
        }
    }

    pub fn forward(&mut self, x: &Tensor<T>, train: bool) -> Tensor<T> {
        self.forward_act(x.clone(), train, false)
    }

    /// The batch's (training) or the running (inference) statistics as the per-channel affine
    /// map `y = x·a + d`; training keeps the statistics for the backward pass.
    fn affine<S: Lhs<T>>(&mut self, x: &Tensor<S>, train: bool) -> (Vec<T>, Vec<T>) {
        self.relu_affine = None;
        let c = x.c;
        let ranks = self.reducer.as_ref().map_or(1, |r| r.ranks());
        let m = (x.n * x.h * x.w * ranks) as f64;
        let (mean, inv_std): (Vec<T>, Vec<T>) = if train {
            batch_statistics(
                global_sums(
                    self.reducer.as_ref(),
                    sums(&x.data, &x.data, Gate::<T, T>::Open, c),
                ),
                m,
                self.eps,
                self.momentum,
                &mut self.running_mean,
                &mut self.running_var,
            )
        } else {
            running_statistics(&self.running_mean, &self.running_var, self.eps)
        };
        // y = γ·(x − μ)/σ + β = x·a + d per channel.
        let a: Vec<T> = (0..c).map(|j| self.gamma.value[j] * inv_std[j]).collect();
        let d: Vec<T> = (0..c)
            .map(|j| self.beta.value[j] - mean[j] * a[j])
            .collect();
        if train {
            self.mean = mean;
            self.inv_std = inv_std;
        }
        (a, d)
    }

    /// `forward` followed by ReLU when `relu`, in one pass over memory. Takes the input by
    /// value: training keeps it (not a normalised copy) for the backward pass.
    pub fn forward_act(&mut self, x: Tensor<T>, train: bool, relu: bool) -> Tensor<T> {
        let c = x.c;
        let (a, d) = self.affine(&x, train);
        let mut y = Tensor::uninit(x.n, x.h, x.w, c);
        let zero = T::zero();
        y.data
            .par_chunks_mut(CHUNK_ROWS * c)
            .zip(x.data.par_chunks(CHUNK_ROWS * c))
            .for_each(|(yc, xc)| {
                simd(
                    #[inline(always)]
                    || {
                        let (a, d) = (&a[..c], &d[..c]);
                        for (yr, xr) in yc.chunks_exact_mut(c).zip(xc.chunks_exact(c)) {
                            let (yr, xr) = (&mut yr[..c], &xr[..c]);
                            if relu {
                                for j in 0..c {
                                    let t = xr[j] * a[j] + d[j];
                                    yr[j] = MaybeUninit::new(if t < zero { zero } else { t });
                                }
                            } else {
                                for j in 0..c {
                                    yr[j] = MaybeUninit::new(xr[j] * a[j] + d[j]);
                                }
                            }
                        }
                    },
                )
            });
        if train {
            self.input = Some(Kept::Full(x));
            if relu {
                self.relu_affine = Some((a, d));
            }
        }
        // SAFETY: the chunks of rows cover y, and every row's c elements were written.
        unsafe { y.assume_init() }
    }

    pub fn backward(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        self.backward_act(dy, None)
    }

    /// `backward` of `forward_act(.., relu = true)`: `relu_out` is that pass's output, whose
    /// sign masks `dy` (the ReLU's backward pass, fused into this one's reads). The input
    /// gradient is written over the input kept for this pass, a tensor just read (a new one
    /// is read for ownership before it is written: a third more traffic).
    pub fn backward_act(&mut self, dy: &Tensor<T>, relu_out: Option<&Tensor<T>>) -> Tensor<T> {
        match relu_out {
            Some(y) => self.backward_masked(dy, Gate::Output(&y.data)),
            None => self.backward_masked(dy, Gate::<T, T>::Open),
        }
    }

    /// The gate of a backward pass given the ReLU's output: recomputed from the forward pass's
    /// affine map where this layer applied the ReLU itself (`Gate::Affine`), so that the
    /// output is not read.
    fn gate<'a, M: Positive>(
        relu: &'a Option<(Vec<T>, Vec<T>)>,
        given: Gate<'a, T, M>,
    ) -> Gate<'a, T, M> {
        match (given, relu) {
            (Gate::Output(_), Some((a, d))) => Gate::Affine(a, d),
            (g, _) => g,
        }
    }

    /// `backward_act` through `gate`.
    fn backward_masked<M: Positive>(&mut self, dy: &Tensor<T>, gate: Gate<'_, T, M>) -> Tensor<T> {
        let mut x = self.take_full_input();
        assert!(x.same_shape(dy), "{}: gradient shape", self.gamma.name);
        let relu = self.relu_affine.take();
        let gate = Self::gate(&relu, gate);
        let c = dy.c;
        // Σ dy and Σ dy·x per channel (dy masked by the ReLU).
        let sums = sums(&dy.data, &x.data, gate, c);
        let grad = self.input_gradient(sums, dy.rows());
        let chunk = CHUNK_ROWS * c;
        x.data
            .par_chunks_mut(chunk)
            .zip(dy.data.par_chunks(chunk))
            .enumerate()
            .for_each(|(i, (xc, gc))| {
                let gate = gate.at(i * chunk, xc.len());
                simd(
                    #[inline(always)]
                    || {
                        for (r, (xr, gr)) in
                            xc.chunks_exact_mut(c).zip(gc.chunks_exact(c)).enumerate()
                        {
                            grad.row(xr, gr, gate.at(r * c, c));
                        }
                    },
                )
            });
        x
    }

    /// From this rank's (Σ g, Σ g·x) over its `rows` rows (g: the output gradient, masked):
    /// sets the γ and β gradients and returns what the input gradient needs per channel.
    fn input_gradient(&mut self, sums: (Vec<f64>, Vec<f64>), rows: usize) -> InputGradient<T> {
        let ranks = self.reducer.as_ref().map_or(1, |r| r.ranks());
        let k = backward_coefficients(
            global_sums(self.reducer.as_ref(), sums),
            &self.mean,
            &self.inv_std,
            (rows * ranks) as f64,
            ranks,
        );
        self.gamma.grad = k.dgamma;
        self.beta.grad = k.dbeta;
        let scale = (0..self.mean.len())
            .map(|j| self.gamma.value[j] * self.inv_std[j])
            .collect();
        InputGradient {
            mean: self.mean.clone(),
            inv: self.inv_std.clone(),
            scale,
            mean_g: k.mean_g,
            mean_gx: k.mean_gx,
        }
    }
}

/// Batch norm's input gradient per channel, dx = γ/σ · (g − mean(g) − x̂ · mean(g·x̂)), with
/// x̂ = (x − μ)/σ recomputed from the input x.
struct InputGradient<T> {
    mean: Vec<T>,
    inv: Vec<T>,
    scale: Vec<T>,
    mean_g: Vec<T>,
    mean_gx: Vec<T>,
}

impl<T: Float> InputGradient<T> {
    /// One row: `xr` (the input) becomes its gradient, from the output gradient `gr` where the
    /// `gate` (this row's) lets it through, zero elsewhere (a ReLU's backward pass); `gr` in `T`
    /// or bf16 (a block's output gradient in bf16 training).
    #[inline(always)]
    fn row<G: Lhs<T>, M: Positive>(&self, xr: &mut [T], gr: &[G], gate: Gate<'_, T, M>) {
        let c = xr.len();
        let zero = T::zero();
        let (gr, mean, inv) = (&gr[..c], &self.mean[..c], &self.inv[..c]);
        let (scale, mdb, mdg) = (&self.scale[..c], &self.mean_g[..c], &self.mean_gx[..c]);
        match gate {
            Gate::Output(mr) => {
                let mr = &mr[..c];
                for j in 0..c {
                    let g = if mr[j].positive() {
                        gr[j].widen()
                    } else {
                        zero
                    };
                    let h = (xr[j] - mean[j]) * inv[j];
                    xr[j] = scale[j] * (g - mdb[j] - h * mdg[j]);
                }
            }
            Gate::Affine(fa, fd) => {
                let (fa, fd) = (&fa[..c], &fd[..c]);
                for j in 0..c {
                    let g = if xr[j] * fa[j] + fd[j] > zero {
                        gr[j].widen()
                    } else {
                        zero
                    };
                    let h = (xr[j] - mean[j]) * inv[j];
                    xr[j] = scale[j] * (g - mdb[j] - h * mdg[j]);
                }
            }
            Gate::Open => {
                for j in 0..c {
                    let h = (xr[j] - mean[j]) * inv[j];
                    xr[j] = scale[j] * (gr[j].widen() - mdb[j] - h * mdg[j]);
                }
            }
        }
    }
}

/// ReLU, in place on the forward output (which the backward pass uses as its mask).
pub fn relu_forward<T: Float>(x: &mut Tensor<T>) {
    x.data.par_chunks_mut(1 << 14).for_each(|c| {
        simd(
            #[inline(always)]
            || {
                for v in c {
                    if *v < T::zero() {
                        *v = T::zero();
                    }
                }
            },
        )
    });
}

/// dx = dy where the forward output `y` was positive, in place on `dy`.
pub fn relu_backward<T: Float>(y: &Tensor<T>, dy: &mut Tensor<T>) {
    dy.data
        .par_chunks_mut(1 << 14)
        .zip(y.data.par_chunks(1 << 14))
        .for_each(|(d, yc)| {
            simd(
                #[inline(always)]
                || {
                    for (g, v) in d.iter_mut().zip(yc) {
                        if *v <= T::zero() {
                            *g = T::zero();
                        }
                    }
                },
            )
        });
}

/// `y = relu(y + s)` (a residual connection and its activation, in one pass).
pub fn add_relu<T: Float>(y: &mut Tensor<T>, s: &Tensor<T>) {
    assert!(y.same_shape(s), "residual shapes");
    y.data
        .par_chunks_mut(1 << 14)
        .zip(s.data.par_chunks(1 << 14))
        .for_each(|(o, v)| {
            simd(
                #[inline(always)]
                || {
                    for (o, v) in o.iter_mut().zip(v) {
                        let t = *o + *v;
                        *o = if t < T::zero() { T::zero() } else { t };
                    }
                },
            )
        });
}

/// `y += s`, in parallel.
pub fn add_into<T: Float>(y: &mut Tensor<T>, s: &Tensor<T>) {
    assert!(y.same_shape(s), "shapes");
    y.data
        .par_chunks_mut(1 << 14)
        .zip(s.data.par_chunks(1 << 14))
        .for_each(|(o, v)| {
            simd(
                #[inline(always)]
                || {
                    for (o, v) in o.iter_mut().zip(v) {
                        *o += *v;
                    }
                },
            )
        });
}

#[cfg(test)]
mod half_tests;
#[cfg(test)]
mod tests;
