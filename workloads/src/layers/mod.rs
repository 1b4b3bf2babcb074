//! Layers with explicit forward and backward passes. Each keeps what its backward pass needs
//! from the last forward pass; parameter gradients are overwritten by each backward pass.

use crate::conv::{self, ConvShape};
use crate::tensor::{gemm, simd, Float, Mat, Tensor};
use rayon::prelude::*;
use std::borrow::Cow;
use std::mem::MaybeUninit;
use std::sync::Arc;

/// Sums across the ranks of a data-parallel run: the communication layer's (`kernels::comm`).
pub use roofline_kernels::comm::Reducer;

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

/// Per-channel sums over the rows of an NHWC tensor: (Σ g, Σ g·b) for each channel, where g is
/// `a` with the entries whose `mask` is not positive set to zero (no mask: g = a; no `b`: b = a,
/// so Σ a²). Each chunk of rows sums in the element type (vectorised); the chunks' partial sums
/// are added in f64 in chunk order (deterministic).
fn channel_sums<T: Float>(
    a: &[T],
    b: Option<&[T]>,
    mask: Option<&[T]>,
    c: usize,
) -> (Vec<f64>, Vec<f64>) {
    let chunk = CHUNK_ROWS * c;
    let zero = T::zero();
    let b = b.unwrap_or(a);
    let masked = mask.is_some();
    let mask = mask.unwrap_or(a);
    let partials: Vec<(Vec<T>, Vec<T>)> = a
        .par_chunks(chunk)
        .zip(b.par_chunks(chunk))
        .zip(mask.par_chunks(chunk))
        .map(|((ac, bc), mc)| {
            simd(
                #[inline(always)]
                || {
                    let mut p1 = vec![zero; c];
                    let mut p2 = vec![zero; c];
                    let (q1, q2) = (&mut p1[..c], &mut p2[..c]);
                    for ((ar, br), mr) in ac
                        .chunks_exact(c)
                        .zip(bc.chunks_exact(c))
                        .zip(mc.chunks_exact(c))
                    {
                        // Indexed over equal-length slices: no bounds checks, vectorised over
                        // channels.
                        let (ar, br, mr) = (&ar[..c], &br[..c], &mr[..c]);
                        if masked {
                            for j in 0..c {
                                let g = if mr[j] > zero { ar[j] } else { zero };
                                q1[j] += g;
                                q2[j] += g * br[j];
                            }
                        } else {
                            for j in 0..c {
                                q1[j] += ar[j];
                                q2[j] += ar[j] * br[j];
                            }
                        }
                    }
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
    input: Option<Arc<Tensor<T>>>,
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

    fn shape_for(&self, x: &Tensor<T>) -> ConvShape {
        shape_for(&self.shape, &self.weight.name, x)
    }

    /// The input is shared, not copied: the backward pass needs it for the filter gradient.
    pub fn forward(&mut self, x: &Arc<Tensor<T>>) -> Tensor<T> {
        let sh = self.shape_for(x);
        let mut y = Tensor::uninit(x.n, sh.oh(), sh.ow(), sh.k);
        conv::forward_into(&x.data, &self.weight.value, &mut y.data, &sh);
        self.input = Some(Arc::clone(x));
        // SAFETY: forward_into writes every output element.
        unsafe { y.assume_init() }
    }

    /// The input kept by the last forward pass (for the backward pass).
    pub(crate) fn take_input(&mut self) -> Arc<Tensor<T>> {
        self.input.take().expect("backward before forward")
    }

    pub fn backward(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        let x = self.take_input();
        let sh = self.shape_for(&x);
        conv::backward_filter(&x.data, &dy.data, &mut self.weight.grad, &sh);
        let mut dx = Tensor::uninit(x.n, x.h, x.w, x.c);
        conv::backward_data_into(&dy.data, &self.weight.value, &mut dx.data, &sh);
        // SAFETY: backward_data_into writes every element (a GEMM without accumulation, or
        // zero-filled images for col2im).
        unsafe { dx.assume_init() }
    }
}

/// A convolution's shape for input `x` (its batch and size; its channels checked against the
/// filter `name`'s).
pub(crate) fn shape_for<T>(shape: &ConvShape, name: &str, x: &Tensor<T>) -> ConvShape {
    assert_eq!(x.c, shape.c, "{name}: input channels");
    ConvShape {
        n: x.n,
        h: x.h,
        w: x.w,
        ..*shape
    }
}

/// Batch normalisation over N·H·W per channel, with running statistics for inference.
/// What a residual block adds to its normalised branch (`BatchNorm::forward_add_relu`).
pub enum Shortcut<'a, T: Float> {
    /// The block's input.
    Identity(&'a Tensor<T>),
    /// The projection's convolution output, normalised by its own batch norm in the same pass.
    Projected(&'a mut BatchNorm<T>, Tensor<T>),
}

pub struct BatchNorm<T> {
    pub gamma: Param<T>,
    pub beta: Param<T>,
    pub running_mean: Vec<T>,
    pub running_var: Vec<T>,
    pub momentum: f64,
    pub eps: f64,
    input: Option<Tensor<T>>,
    mean: Vec<T>,
    inv_std: Vec<T>,
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
            reducer: None,
        }
    }

    pub fn forward(&mut self, x: &Tensor<T>, train: bool) -> Tensor<T> {
        self.forward_act(x.clone(), train, false)
    }

    /// The batch's (training) or the running (inference) statistics as the per-channel affine
    /// map `y = x·a + d`; training keeps the statistics for the backward pass.
    fn affine(&mut self, x: &Tensor<T>, train: bool) -> (Vec<T>, Vec<T>) {
        let c = x.c;
        let ranks = self.reducer.as_ref().map_or(1, |r| r.ranks());
        let m = (x.rows() * ranks) as f64;
        let (mean, inv_std): (Vec<T>, Vec<T>) = if train {
            batch_statistics(
                global_sums(self.reducer.as_ref(), channel_sums(&x.data, None, None, c)),
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
            self.input = Some(x);
        }
        // SAFETY: the chunks of rows cover y, and every row's c elements were written.
        unsafe { y.assume_init() }
    }

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
            if let Some((bn, _)) = down {
                bn.input = Some(s.into_owned());
            }
        }
        // SAFETY: the chunks of rows cover y, and every row's c elements were written.
        unsafe { y.assume_init() }
    }

    pub fn backward(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        self.backward_act(dy, None)
    }

    /// `backward` of `forward_act(.., relu = true)`: `relu_out` is that pass's output, whose
    /// sign masks `dy` (the ReLU's backward pass, fused into this one's reads).
    pub fn backward_act(&mut self, dy: &Tensor<T>, relu_out: Option<&Tensor<T>>) -> Tensor<T> {
        let x = self.input.take().expect("backward before forward");
        let c = dy.c;
        let ranks = self.reducer.as_ref().map_or(1, |r| r.ranks());
        let m = (dy.rows() * ranks) as f64;
        let chunk = CHUNK_ROWS * c;
        let zero = T::zero();
        let mask = relu_out.map(|y| &y.data[..]).unwrap_or(&dy.data[..]);
        let masked = relu_out.is_some();
        // Σ dy and Σ dy·x per channel (dy masked by the ReLU).
        let sums = channel_sums(&dy.data, Some(&x.data), relu_out.map(|y| &y.data[..]), c);
        let k = backward_coefficients(
            global_sums(self.reducer.as_ref(), sums),
            &self.mean,
            &self.inv_std,
            m,
            ranks,
        );
        self.gamma.grad = k.dgamma;
        self.beta.grad = k.dbeta;
        // dx = γ/σ · (dy − mean(dy) − x̂ · mean(dy·x̂)), x̂ = (x − μ)/σ recomputed.
        let scale: Vec<T> = (0..c)
            .map(|j| self.gamma.value[j] * self.inv_std[j])
            .collect();
        let (mdb, mdg) = (k.mean_g, k.mean_gx);
        let (mean, inv) = (&self.mean, &self.inv_std);
        let mut dx = Tensor::uninit(dy.n, dy.h, dy.w, c);
        dx.data
            .par_chunks_mut(chunk)
            .zip(dy.data.par_chunks(chunk))
            .zip(x.data.par_chunks(chunk))
            .zip(mask.par_chunks(chunk))
            .for_each(|(((dxc, dyc), xc), mc)| {
                simd(
                    #[inline(always)]
                    || {
                        for (((dxr, dyr), xr), mr) in dxc
                            .chunks_exact_mut(c)
                            .zip(dyc.chunks_exact(c))
                            .zip(xc.chunks_exact(c))
                            .zip(mc.chunks_exact(c))
                        {
                            let (dxr, dyr, xr, mr) = (&mut dxr[..c], &dyr[..c], &xr[..c], &mr[..c]);
                            let (mean, inv, scale, mdb, mdg) =
                                (&mean[..c], &inv[..c], &scale[..c], &mdb[..c], &mdg[..c]);
                            for j in 0..c {
                                let g = if !masked || mr[j] > zero {
                                    dyr[j]
                                } else {
                                    zero
                                };
                                let h = (xr[j] - mean[j]) * inv[j];
                                dxr[j] = MaybeUninit::new(scale[j] * (g - mdb[j] - h * mdg[j]));
                            }
                        }
                    },
                )
            });
        // SAFETY: the chunks of rows cover dx, and every row's c elements were written.
        unsafe { dx.assume_init() }
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

/// Max pooling, 3×3, stride 2, padding 1 (ResNet's stem).
pub struct MaxPool<T> {
    argmax: Vec<u32>,
    input_shape: (usize, usize, usize, usize),
    _t: std::marker::PhantomData<T>,
}

impl<T: Float> Default for MaxPool<T> {
    fn default() -> Self {
        MaxPool {
            argmax: Vec::new(),
            input_shape: (0, 0, 0, 0),
            _t: std::marker::PhantomData,
        }
    }
}

impl<T: Float> MaxPool<T> {
    pub fn forward(&mut self, x: &Tensor<T>) -> Tensor<T> {
        let (oh, ow) = ((x.h + 2 - 3) / 2 + 1, (x.w + 2 - 3) / 2 + 1);
        let mut y = Tensor::for_overwrite(x.n, oh, ow, x.c);
        let mut arg = vec![0u32; y.len()];
        let c = x.c;
        y.data
            .par_chunks_mut(oh * ow * c)
            .zip(arg.par_chunks_mut(oh * ow * c))
            .enumerate()
            .for_each(|(n, (yi, ai))| {
                let image = x.h * x.w * c;
                let xi = &x.data[n * image..(n + 1) * image];
                // Taps in order (ky, kx), channels the vector lanes: the first valid tap is
                // taken, a later one only where strictly greater (the first maximum wins).
                simd(
                    #[inline(always)]
                    || {
                        for oy in 0..oh {
                            for ox in 0..ow {
                                let o = (oy * ow + ox) * c;
                                let (yo, ao) = (&mut yi[o..o + c], &mut ai[o..o + c]);
                                let mut first = true;
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
                                        let row = &xi[base..base + c];
                                        if first {
                                            yo.copy_from_slice(row);
                                            for (j, a) in ao.iter_mut().enumerate() {
                                                *a = (base + j) as u32;
                                            }
                                            first = false;
                                            continue;
                                        }
                                        for (j, ((b, a), v)) in
                                            yo.iter_mut().zip(ao.iter_mut()).zip(row).enumerate()
                                        {
                                            if *v > *b {
                                                *b = *v;
                                                *a = (base + j) as u32;
                                            }
                                        }
                                    }
                                }
                                if first {
                                    yo.fill(T::zero());
                                    ao.fill(0);
                                }
                            }
                        }
                    },
                )
            });
        self.argmax = arg;
        self.input_shape = (x.n, x.h, x.w, x.c);
        y
    }

    pub fn backward(&mut self, dy: &Tensor<T>) -> Tensor<T> {
        let (n, h, w, c) = self.input_shape;
        let mut dx = Tensor::zeros(n, h, w, c);
        let per_out = dy.h * dy.w * c;
        dx.data
            .par_chunks_mut(h * w * c)
            .enumerate()
            .for_each(|(img, dxi)| {
                for o in 0..per_out {
                    dxi[self.argmax[img * per_out + o] as usize] += dy.data[img * per_out + o];
                }
            });
        dx
    }
}

/// Global average pooling: n × h × w × c → n × 1 × 1 × c.
pub fn avgpool_forward<T: Float>(x: &Tensor<T>) -> Tensor<T> {
    let hw = x.h * x.w;
    let inv = T::from_f64(1.0 / hw as f64);
    let mut y = Tensor::zeros(x.n, 1, 1, x.c);
    for n in 0..x.n {
        for p in 0..hw {
            let row = &x.data[(n * hw + p) * x.c..(n * hw + p + 1) * x.c];
            for (o, v) in y.data[n * x.c..(n + 1) * x.c].iter_mut().zip(row) {
                *o += *v;
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

#[cfg(test)]
mod tests;
