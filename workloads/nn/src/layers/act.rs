//! ReLU outputs kept between layers: in the layers' own type, or in bf16 where the products
//! are bf16. The next convolution rounds its input to bf16 anyway (as it packs it), so a
//! batch norm + ReLU that writes bf16 gives every product the same bits, in half the bytes
//! written, read by the convolution's forward and filter-gradient passes, and leaves no
//! rounding to the packing. (The ReLU's backward pass does not read it: batch norm's backward
//! pass recomputes the ReLU's test from its kept input, `Gate::Affine`, in f32 — the same mask
//! but where an output below bf16's smallest subnormal, 2⁻¹³³, rounded to zero.) The
//! batch norm's input gradient, the previous convolution's output gradient, likewise
//! (`backward_relu_act`).

use super::{sums, BatchNorm, Conv2d, Gate, InputGradient, CHUNK_ROWS};
use crate::tensor::{bf16, half_activations, round_bf16, simd, Float, Lhs, Positive, Tensor};
use rayon::prelude::*;
use std::sync::Arc;

/// A ReLU output: the next convolution's input and the ReLU's backward mask.
pub enum Act<T> {
    Full(Arc<Tensor<T>>),
    /// Rounded to bf16 (f32 layers with bf16 products: `tensor::half_activations`).
    Half(Arc<Tensor<bf16>>),
}

impl<T> Clone for Act<T> {
    fn clone(&self) -> Self {
        match self {
            Act::Full(t) => Act::Full(Arc::clone(t)),
            Act::Half(t) => Act::Half(Arc::clone(t)),
        }
    }
}

/// A batch norm's input: a convolution's output in the layers' type, or rounded to bf16
/// where the activations are kept in bf16 (`Conv2d::forward_kept`): the products' f32 sums
/// rounded once, as PyTorch's and TensorFlow's bf16 policies store a convolution's output,
/// written in half the bytes and read in half by the batch norm's four passes over it
/// (statistics, normalisation, and the backward pass's two). The statistics, the affine map
/// and every gradient stay f32.
#[derive(Clone)]
pub enum Kept<T> {
    Full(Tensor<T>),
    Half(Tensor<bf16>),
}

impl<T> Kept<T> {
    /// (n, h, w, c).
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        match self {
            Kept::Full(t) => (t.n, t.h, t.w, t.c),
            Kept::Half(t) => (t.n, t.h, t.w, t.c),
        }
    }
}

/// A tensor's storage, the layers' type or bf16, as the `Act` that holds it.
pub(crate) trait Stored<T>: Lhs<T> {
    fn act(t: Tensor<Self>) -> Act<T>;
}

impl<T: Float> Stored<T> for T {
    fn act(t: Tensor<T>) -> Act<T> {
        Act::Full(Arc::new(t))
    }
}

impl<T: Float> Stored<T> for bf16 {
    fn act(t: Tensor<bf16>) -> Act<T> {
        Act::Half(Arc::new(t))
    }
}

impl<T> Act<T> {
    /// (n, h, w, c).
    pub fn dims(&self) -> (usize, usize, usize, usize) {
        match self {
            Act::Full(t) => (t.n, t.h, t.w, t.c),
            Act::Half(t) => (t.n, t.h, t.w, t.c),
        }
    }
}

impl<T: Float> Act<T> {
    /// `t` kept as the layers keep their activations: rounded to bf16 where this thread's `T`
    /// layers multiply in bf16 (`half_activations`), as it is otherwise.
    pub fn kept(t: Tensor<T>) -> Act<T> {
        if !half_activations::<T>() {
            return Act::Full(Arc::new(t));
        }
        Act::rounded(&t)
    }

    /// `kept` of a tensor the caller keeps: a copy, or its bf16 rounding (no f32 copy).
    pub fn of(t: &Tensor<T>) -> Act<T> {
        if !half_activations::<T>() {
            return Act::Full(Arc::new(t.clone()));
        }
        Act::rounded(t)
    }

    /// `t` rounded to bf16.
    fn rounded(t: &Tensor<T>) -> Act<T> {
        let len = t.len();
        let mut data: Vec<bf16> = Vec::with_capacity(len);
        data.spare_capacity_mut()[..len]
            .par_chunks_mut(1 << 14)
            .zip(t.data.par_chunks(1 << 14))
            .for_each(|(d, s)| round_bf16(s, d));
        // SAFETY: the chunks cover the first len elements, every one written.
        unsafe { data.set_len(len) };
        let (n, h, w, c) = (t.n, t.h, t.w, t.c);
        Act::Half(Arc::new(Tensor { n, h, w, c, data }))
    }

    /// The tensor in the layers' type, owned: itself where this is its only holder (a copy
    /// otherwise), or widened from bf16 (exact).
    pub fn into_full(self) -> Tensor<T> {
        match self {
            Act::Full(t) => Arc::unwrap_or_clone(t),
            half => Arc::unwrap_or_clone(half.full()),
        }
    }

    /// The activation in the layers' type: itself, or a copy widened from bf16 (exact).
    pub fn full(&self) -> Arc<Tensor<T>> {
        match self {
            Act::Full(t) => Arc::clone(t),
            Act::Half(t) => Arc::new(Tensor {
                n: t.n,
                h: t.h,
                w: t.w,
                c: t.c,
                data: t.data.par_iter().map(|v| Lhs::<T>::widen(*v)).collect(),
            }),
        }
    }
}

impl<T: Float> Conv2d<T> {
    /// `forward_act` with the output rounded to bf16 as it is stored where the activations are
    /// kept in bf16 (`half_activations`: `crate::conv::forward_half`), in `T` otherwise: a
    /// batch norm's input.
    pub fn forward_kept(&mut self, x: &Act<T>) -> Kept<T> {
        let sh = match x {
            Act::Full(t) => self.shape_for(t),
            Act::Half(t) => self.shape_for(t),
        };
        if !half_activations::<T>() {
            return Kept::Full(self.forward_act(x));
        }
        let len = sh.output_len();
        let mut data: Vec<bf16> = Vec::with_capacity(len);
        let y = &mut data.spare_capacity_mut()[..len];
        match x {
            Act::Full(t) => crate::conv::forward_half(&t.data, &self.weight.value, y, &sh),
            Act::Half(t) => crate::conv::forward_half(&t.data, &self.weight.value, y, &sh),
        }
        // SAFETY: forward_half writes every output element.
        unsafe { data.set_len(len) };
        self.input = Some(x.clone());
        let (n, h, w, c) = (sh.n, sh.oh(), sh.ow(), sh.k);
        Kept::Half(Tensor { n, h, w, c, data })
    }

    /// `backward_add` into an input gradient kept in bf16 (a block's shortcut gradient in
    /// bf16 training: `crate::conv::backward_data_add_half`).
    pub fn backward_add_half(&mut self, dy: &Act<T>, dx: &mut Tensor<bf16>) {
        match dy {
            Act::Full(t) => self.backward_add_half_from(&t.data, dx),
            Act::Half(t) => self.backward_add_half_from(&t.data, dx),
        }
    }

    fn backward_add_half_from<D: Lhs<T>>(&mut self, dy: &[D], dx: &mut Tensor<bf16>) {
        let sh = self.added_shape(dy, dx);
        crate::conv::backward_data_add_half(dy, &self.weight.value, &mut dx.data, &sh);
    }
}

impl<T: Float> BatchNorm<T> {
    /// The input kept by the forward pass, for a backward pass that reads it in `T` (one whose
    /// forward pass kept it so).
    pub(super) fn take_full_input(&mut self) -> Tensor<T> {
        match self.input.take().expect("backward before forward") {
            Kept::Full(x) => x,
            Kept::Half(_) => panic!("{}: input kept in bf16, read in T", self.gamma.name),
        }
    }

    /// `forward_act(x, train, true)`, kept in bf16 where this thread's `T` layers multiply in
    /// bf16 (`half_activations`), in the layers' type otherwise.
    pub fn forward_relu(&mut self, x: Tensor<T>, train: bool) -> Act<T> {
        if !half_activations::<T>() {
            return Act::Full(Arc::new(self.forward_act(x, train, true)));
        }
        let y = self.relu_rounded(&x, train);
        if train {
            self.input = Some(Kept::Full(x));
        }
        y
    }

    /// `forward_relu` of a convolution's output in either precision (`Kept`).
    pub fn forward_relu_kept(&mut self, x: Kept<T>, train: bool) -> Act<T> {
        match x {
            Kept::Full(x) => self.forward_relu(x, train),
            Kept::Half(x) => {
                let y = self.relu_rounded(&x, train);
                if train {
                    self.input = Some(Kept::Half(x));
                }
                y
            }
        }
    }

    /// `max(x·a + d, 0)` rounded to bf16, a block of rows at a time; training keeps the map
    /// (the backward pass's gate).
    fn relu_rounded<S: Lhs<T>>(&mut self, x: &Tensor<S>, train: bool) -> Act<T> {
        let c = x.c;
        let (a, d) = self.affine(x, train);
        let len = x.data.len();
        let mut data: Vec<bf16> = Vec::with_capacity(len);
        let zero = T::zero();
        data.spare_capacity_mut()[..len]
            .par_chunks_mut(CHUNK_ROWS * c)
            .zip(x.data.par_chunks(CHUNK_ROWS * c))
            .for_each(|(yc, xc)| {
                let block = rows_per_block(c) * c;
                T::with_scratch(block, |buf| {
                    simd(
                        #[inline(always)]
                        || {
                            let (a, d) = (&a[..c], &d[..c]);
                            for (yb, xb) in yc.chunks_mut(block).zip(xc.chunks(block)) {
                                let buf = &mut buf[..xb.len()];
                                for (br, xr) in buf.chunks_exact_mut(c).zip(xb.chunks_exact(c)) {
                                    relu_affine(br, xr, a, d, zero);
                                }
                                round_bf16(buf, yb);
                            }
                        },
                    )
                })
            });
        // SAFETY: the chunks of rows cover the first len elements, every one written.
        unsafe { data.set_len(len) };
        if train {
            self.relu_affine = Some((a, d));
        }
        let (n, h, w) = (x.n, x.h, x.w);
        Act::Half(Arc::new(Tensor { n, h, w, c, data }))
    }

    /// The affine map `forward_act(x, train, true)` would apply, for a consumer that applies it
    /// (and the ReLU) as it reads `x` (`MaxPool::forward_relu_affine`): the normalised tensor
    /// is never written. Training then hands `x` and the map to `keep_relu_input`.
    pub fn relu_maps<S: Lhs<T>>(&mut self, x: &Tensor<S>, train: bool) -> (Vec<T>, Vec<T>) {
        self.affine(x, train)
    }

    /// Keeps the input and the map of `relu_maps` for `backward_relu_recomputed`.
    pub fn keep_relu_input(&mut self, x: Kept<T>, map: (Vec<T>, Vec<T>)) {
        self.input = Some(x);
        self.relu_affine = Some(map);
    }

    /// A backward pass that recomputes the ReLU's mask needs the map `keep_relu_input` kept.
    fn assert_kept_map(&self) {
        assert!(
            self.relu_affine.is_some(),
            "{}: backward without a kept map (keep_relu_input)",
            self.gamma.name
        );
    }

    /// The backward pass after `relu_maps` and `keep_relu_input`: the ReLU's mask recomputed
    /// from the kept input and map (there is no output to read).
    pub(crate) fn backward_relu_recomputed(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        self.assert_kept_map();
        // The empty output is never read: `gate` puts the kept map in its place.
        self.backward_masked(dy, Gate::<T, T>::Output(&[]))
    }

    /// `backward_relu_recomputed`, its input gradient kept in bf16 where the activations are
    /// (`half_activations`), as `backward_relu_act` keeps it: a convolution's output gradient,
    /// which its products round to bf16 anyway.
    pub fn backward_relu_recomputed_act(&mut self, dy: &Tensor<T>) -> Act<T> {
        if !half_activations::<T>() {
            return Act::Full(Arc::new(self.backward_relu_recomputed(dy)));
        }
        self.assert_kept_map();
        // The empty output is never read: `gate` puts the kept map in its place.
        self.backward_half(dy, Gate::<T, T>::Output(&[]))
    }

    /// `backward_act` for a `forward_relu` output.
    pub fn backward_relu(&mut self, dy: &Tensor<T>, out: &Act<T>) -> Tensor<T> {
        match out {
            Act::Full(y) => self.backward_masked(dy, Gate::Output(&y.data)),
            Act::Half(y) => self.backward_masked(dy, Gate::Output(&y.data)),
        }
    }

    /// `backward_relu`, its input gradient kept in bf16 where the ReLU outputs are
    /// (`half_activations`): it is the output gradient of a convolution, whose products (input
    /// gradient and filter gradient) round it to bf16 anyway — the same bits, half the bytes
    /// written and read twice, no rounding left for the packing.
    pub fn backward_relu_act(&mut self, dy: &Tensor<T>, out: &Act<T>) -> Act<T> {
        if let Some(Kept::Half(x)) = self.input.take_if(|x| matches!(x, Kept::Half(_))) {
            return match out {
                Act::Full(y) => self.backward_half_of(x, dy, Gate::Output(&y.data)),
                Act::Half(y) => self.backward_half_of(x, dy, Gate::Output(&y.data)),
            };
        }
        if !half_activations::<T>() {
            return Act::Full(Arc::new(self.backward_relu(dy, out)));
        }
        match out {
            Act::Full(y) => self.backward_half(dy, Gate::Output(&y.data)),
            Act::Half(y) => self.backward_half(dy, Gate::Output(&y.data)),
        }
    }

    /// `backward_half_of` the input kept, in `T` or bf16.
    fn backward_half<M: Positive>(&mut self, dy: &Tensor<T>, gate: Gate<'_, T, M>) -> Act<T> {
        match self.input.take().expect("backward before forward") {
            Kept::Full(x) => self.backward_half_of(x, dy, gate),
            Kept::Half(x) => self.backward_half_of(x, dy, gate),
        }
    }

    /// The input gradient in bf16 from the input `x` kept in `T` or bf16 (`forward_relu_kept`):
    /// each block of rows computed into f32 scratch, then rounded, the input only read.
    fn backward_half_of<S: Lhs<T>, M: Positive>(
        &mut self,
        x: Tensor<S>,
        dy: &Tensor<T>,
        gate: Gate<'_, T, M>,
    ) -> Act<T> {
        assert!(
            (x.n, x.h, x.w, x.c) == (dy.n, dy.h, dy.w, dy.c),
            "{}: gradient shape",
            self.gamma.name
        );
        let relu = self.relu_affine.take();
        let gate = Self::gate(&relu, gate);
        let c = dy.c;
        let sums = sums(&dy.data, &x.data, gate, c);
        let grad = self.input_gradient(sums, dy.rows());
        let (len, chunk) = (x.data.len(), CHUNK_ROWS * c);
        let mut data: Vec<bf16> = Vec::with_capacity(len);
        data.spare_capacity_mut()[..len]
            .par_chunks_mut(chunk)
            .zip(x.data.par_chunks(chunk))
            .zip(dy.data.par_chunks(chunk))
            .enumerate()
            .for_each(|(i, ((oc, xc), gc))| {
                let gate = gate.at(i * chunk, xc.len());
                let block = rows_per_block(c) * c;
                T::with_scratch(block, |buf| {
                    simd(
                        #[inline(always)]
                        || {
                            for (b, ((ob, xb), gb)) in oc
                                .chunks_mut(block)
                                .zip(xc.chunks(block))
                                .zip(gc.chunks(block))
                                .enumerate()
                            {
                                let buf = &mut buf[..xb.len()];
                                for (r, ((br, xr), gr)) in buf
                                    .chunks_exact_mut(c)
                                    .zip(xb.chunks_exact(c))
                                    .zip(gb.chunks_exact(c))
                                    .enumerate()
                                {
                                    grad.row_into(br, xr, gr, gate.at(b * block + r * c, c));
                                }
                                round_bf16(buf, ob);
                            }
                        },
                    )
                })
            });
        // SAFETY: the chunks of rows cover the first len elements, every one written.
        unsafe { data.set_len(len) };
        Act::Half(Arc::new(Tensor {
            n: x.n,
            h: x.h,
            w: x.w,
            c,
            data,
        }))
    }
}

/// Rows of `c` channels computed in f32 before one rounding to bf16 (about 16 KiB of f32, at
/// least a row): row by row, the copy of each row and its rounding were calls of their own
/// (`memcpy`, `round_slice` and its feature check), and the bf16 passes ran slower than the
/// f32 ones that write twice the bytes (trainer_norm layer1.bn1+relu1: forward 2.01 ms against
/// 1.63, backward 3.92 against 2.81).
pub(super) fn rows_per_block(c: usize) -> usize {
    (4096 / c.max(1)).max(1)
}

/// One row of `max(x·a + d, 0)`. A function of its own, so that its slices' exclusive borrows
/// reach the optimiser (vectorised).
#[inline(always)]
pub(super) fn relu_affine<T: Float, S: Lhs<T>>(y: &mut [T], x: &[S], a: &[T], d: &[T], zero: T) {
    let c = y.len();
    let (x, a, d) = (&x[..c], &a[..c], &d[..c]);
    for j in 0..c {
        let t = x[j].widen() * a[j] + d[j];
        y[j] = if t < zero { zero } else { t };
    }
}

impl<T: Float> InputGradient<T> {
    /// `row` into `out` (a block of f32 scratch before its rounding to bf16) from the input
    /// `xr` kept in `T` or bf16, which is only read.
    #[inline(always)]
    pub(super) fn row_into<S: Lhs<T>, G: Lhs<T>, M: Positive>(
        &self,
        out: &mut [T],
        xr: &[S],
        gr: &[G],
        gate: Gate<'_, T, M>,
    ) {
        let c = out.len();
        let zero = T::zero();
        let (xr, gr, mean, inv) = (&xr[..c], &gr[..c], &self.mean[..c], &self.inv[..c]);
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
                    let h = (xr[j].widen() - mean[j]) * inv[j];
                    out[j] = scale[j] * (g - mdb[j] - h * mdg[j]);
                }
            }
            Gate::Affine(fa, fd) => {
                let (fa, fd) = (&fa[..c], &fd[..c]);
                for j in 0..c {
                    let x = xr[j].widen();
                    let g = if x * fa[j] + fd[j] > zero {
                        gr[j].widen()
                    } else {
                        zero
                    };
                    let h = (x - mean[j]) * inv[j];
                    out[j] = scale[j] * (g - mdb[j] - h * mdg[j]);
                }
            }
            Gate::Open => {
                for j in 0..c {
                    let h = (xr[j].widen() - mean[j]) * inv[j];
                    out[j] = scale[j] * (gr[j].widen() - mdb[j] - h * mdg[j]);
                }
            }
        }
    }
}
