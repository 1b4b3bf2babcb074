//! The CPU reference of a reduced-precision GPU training step: the CPU layers, run one by one,
//! with the GPU's rounding points. In f16 and bf16 every activation and activation gradient
//! the GPU stores between layers is rounded to 16 bits where the GPU writes it (the input, each
//! convolution's output and data gradient, each batch norm's output and input gradient, the
//! residual sums, the pools' gradients), the convolutions read the 16-bit copy of the weights
//! and write the filter gradient in 16 bits, and everything else (statistics, the classifier,
//! the loss, the optimizer on the f32 master weights) is f32 or f64 as on the GPU. In tf32 the
//! activations stay f32 and only the convolutions' operands are rounded to tf32. Against this
//! reference a GPU step differs by the order of its sums and the odd rounding flipped by them,
//! not by its precision, so `--check` can hold it to a tolerance a reviewer would accept.
//! The classifier's step is `reference_step`; the detector's body is `RoundedBody`, the same
//! passes behind `detect::model::Body` (its stage outputs and their gradients).

use super::*;
pub(super) use roofline_models::conv::rounding::{salt, without_conv_rounding, Rounding};
use roofline_models::layers::{avgpool_backward, avgpool_forward, relu_backward, MaxPool};

/// A convolution's shape for input `x`.
fn shape(c: &Conv2d<f32>, x: &Tensor<f32>) -> ConvShape {
    ConvShape {
        n: x.n,
        h: x.h,
        w: x.w,
        ..c.shape
    }
}

fn conv_forward(c: &Conv2d<f32>, x: &Tensor<f32>, r: Rounding) -> Tensor<f32> {
    let sh = shape(c, x);
    let (xo, wo) = (r.operand(&x.data), r.operand(&c.weight.value));
    let mut y = vec![0.0f32; sh.output_len()];
    roofline_models::conv::forward(&xo, &wo, &mut y, &sh);
    r.perturb(&mut y, sh.r * sh.s * sh.c, salt(1, &xo));
    r.stored(&mut y);
    Tensor::from_vec(x.n, sh.oh(), sh.ow(), sh.k, y)
}

/// The filter gradient from the input `x` and `dy` (written in the convolution's type, then
/// widened, as cuDNN's) into the weight's `grad`.
fn filter_grad(c: &mut Conv2d<f32>, x: &Tensor<f32>, dy: &Tensor<f32>, r: Rounding) {
    let sh = shape(c, x);
    let (xo, dyo) = (r.operand(&x.data), r.operand(&dy.data));
    let mut dw = vec![0.0f32; sh.weight_len()];
    roofline_models::conv::backward_filter(&xo, &dyo, &mut dw, &sh);
    r.perturb(&mut dw, sh.n * sh.oh() * sh.ow(), salt(2, &dyo));
    r.stored(&mut dw);
    c.weight.grad = dw;
}

/// The filter gradient into the weight's `grad`, and the input gradient, stored.
fn conv_backward(
    c: &mut Conv2d<f32>,
    x: &Tensor<f32>,
    dy: &Tensor<f32>,
    r: Rounding,
) -> Tensor<f32> {
    conv_backward_add(c, x, dy, None, r)
}

/// `conv_backward` with the input gradient added to `acc` before it is stored (as cuDNN
/// blends a block's conv1 data gradient into the shortcut's: one rounding).
fn conv_backward_add(
    c: &mut Conv2d<f32>,
    x: &Tensor<f32>,
    dy: &Tensor<f32>,
    acc: Option<&Tensor<f32>>,
    r: Rounding,
) -> Tensor<f32> {
    filter_grad(c, x, dy, r);
    let sh = shape(c, x);
    let (dyo, wo) = (r.operand(&dy.data), r.operand(&c.weight.value));
    let mut dx = acc.map_or_else(|| vec![0.0f32; sh.input_len()], |a| a.data.clone());
    roofline_models::conv::backward_data_add(&dyo, &wo, &mut dx, &sh);
    let terms = (sh.r * sh.s * sh.k).div_ceil(sh.stride * sh.stride);
    r.perturb(&mut dx, terms, salt(3, &dyo));
    r.stored(&mut dx);
    Tensor::from_vec(x.n, x.h, x.w, x.c, dx)
}

/// Batch norm (+ the residual `s`) (+ ReLU), stored as the GPU stores it.
fn bn_forward(
    bn: &mut BatchNorm<f32>,
    x: Tensor<f32>,
    train: bool,
    (s, relu): (Option<&Tensor<f32>>, bool),
    r: Rounding,
) -> Tensor<f32> {
    let mut y = match s {
        None => bn.forward_act(x, train, relu),
        Some(s) => {
            let mut y = bn.forward_act(x, train, false);
            for (v, a) in y.data.iter_mut().zip(&s.data) {
                let t = *v + *a;
                *v = if t < 0.0 { 0.0 } else { t };
            }
            y
        }
    };
    let s = salt(4, &y.data);
    r.perturb(&mut y.data, 1, s);
    r.stored(&mut y.data);
    y
}

/// Batch norm's input gradient from `dy` masked where `relu_out` is not positive.
fn bn_backward(
    bn: &mut BatchNorm<f32>,
    dy: &Tensor<f32>,
    relu_out: Option<&Tensor<f32>>,
    r: Rounding,
) -> Tensor<f32> {
    let mut g = dy.clone();
    if let Some(y) = relu_out {
        relu_backward(y, &mut g);
    }
    let mut dx = bn.backward_act(&g, None);
    let s = salt(5, &dx.data);
    r.perturb(&mut dx.data, 1, s);
    r.stored(&mut dx.data);
    dx
}

/// What a block's backward pass needs of its forward pass.
struct Saved {
    x: Tensor<f32>,
    a1: Tensor<f32>,
    a2: Tensor<f32>,
    out: Tensor<f32>,
}

/// What the body's backward pass needs of its forward pass.
struct BodyPass {
    input: Tensor<f32>,
    stem_out: Tensor<f32>,
    pool: MaxPool<f32>,
    blocks: Vec<Saved>,
}

impl BodyPass {
    /// The output of every stage (C2–C5): its last block's.
    fn stage_outputs(&self, m: &ResNet<f32>) -> Vec<&Tensor<f32>> {
        let mut end = 0;
        m.config
            .blocks
            .iter()
            .map(|&n| {
                end += n;
                &self.blocks[end - 1].out
            })
            .collect()
    }
}

/// The body (stem, pool, every block) on `x` with the rounding points `r`.
fn body_forward(m: &mut ResNet<f32>, x: &Tensor<f32>, train: bool, r: Rounding) -> BodyPass {
    let mut input = x.clone();
    r.stored(&mut input.data);
    let t = conv_forward(&m.stem, &input, r);
    let stem_out = bn_forward(&mut m.stem_bn, t, train, (None, true), r);
    let mut pool = MaxPool::<f32>::default();
    let mut h = pool.forward(&stem_out);
    let mut blocks = Vec::with_capacity(m.blocks.len());
    for b in &mut m.blocks {
        let t = conv_forward(&b.conv1, &h, r);
        let a1 = bn_forward(&mut b.bn1, t, train, (None, true), r);
        let t = conv_forward(&b.conv2, &a1, r);
        let a2 = bn_forward(&mut b.bn2, t, train, (None, true), r);
        let t = conv_forward(&b.conv3, &a2, r);
        let shortcut = match &mut b.down {
            Some((c, bn)) => {
                let s = conv_forward(c, &h, r);
                Some(bn_forward(bn, s, train, (None, false), r))
            }
            None => None,
        };
        let out = bn_forward(
            &mut b.bn3,
            t,
            train,
            (Some(shortcut.as_ref().unwrap_or(&h)), true),
            r,
        );
        let x = std::mem::replace(&mut h, out.clone());
        blocks.push(Saved { x, a1, a2, out });
    }
    BodyPass {
        input,
        stem_out,
        pool,
        blocks,
    }
}

/// Every body parameter's gradient from the stage outputs' gradients `d` (None where a
/// stage's output feeds only the next stage), with the rounding points `r`: each given one is
/// stored (cast to 16 bits on the GPU) and, below the last stage, added to the next stage's
/// data gradient, the sum stored (the GPU's add in place).
fn body_backward(
    m: &mut ResNet<f32>,
    mut f: BodyPass,
    mut d: Vec<Option<Tensor<f32>>>,
    r: Rounding,
) {
    assert_eq!(d.len(), 4, "one gradient per stage");
    let mut saved = f.blocks;
    let mut g: Option<Tensor<f32>> = None;
    for stage in (0..4).rev() {
        let mut cur = match (g.take(), d.pop().flatten()) {
            (Some(mut x), Some(mut ds)) => {
                r.stored(&mut ds.data);
                roofline_models::layers::add_into(&mut x, &ds);
                r.stored(&mut x.data);
                x
            }
            (Some(x), None) => x,
            (None, Some(mut ds)) => {
                r.stored(&mut ds.data);
                ds
            }
            (None, None) => panic!("no gradient for the body's last stage"),
        };
        let end = saved.len();
        let start = end - m.config.blocks[stage];
        for (b, s) in m.blocks[start..end]
            .iter_mut()
            .zip(saved.drain(start..))
            .rev()
        {
            cur = block_backward(b, s, cur, r);
        }
        g = Some(cur);
    }
    let mut ds = f.pool.backward(&g.expect("a gradient"));
    r.stored(&mut ds.data);
    let t = bn_backward(&mut m.stem_bn, &ds, Some(&f.stem_out), r);
    // The image needs no gradient: the stem's filter gradient only.
    filter_grad(&mut m.stem, &f.input, &t, r);
}

/// A bottleneck's parameter gradients and its input's gradient from its output's, `d`.
fn block_backward(
    b: &mut Bottleneck<f32>,
    s: Saved,
    mut d: Tensor<f32>,
    r: Rounding,
) -> Tensor<f32> {
    relu_backward(&s.out, &mut d);
    let t = bn_backward(&mut b.bn3, &d, None, r);
    let db = conv_backward(&mut b.conv3, &s.a2, &t, r);
    let t = bn_backward(&mut b.bn2, &db, Some(&s.a2), r);
    let da = conv_backward(&mut b.conv2, &s.a1, &t, r);
    let t = bn_backward(&mut b.bn1, &da, Some(&s.a1), r);
    let ds = match &mut b.down {
        Some((c, bn)) => {
            let t = bn_backward(bn, &d, None, r);
            conv_backward(c, &s.x, &t, r)
        }
        None => d,
    };
    // conv1's data gradient added to the shortcut's as cuDNN writes it.
    conv_backward_add(&mut b.conv1, &s.x, &t, Some(&ds), r)
}

/// The classifier on the body's last output, in f32 as on the GPU.
fn logits(m: &mut ResNet<f32>, f: &BodyPass) -> Tensor<f32> {
    let last = f.blocks.last().expect("a block");
    m.fc.forward(&avgpool_forward(&last.out))
}

/// The logits of an inference pass with the GPU's rounding points.
pub(super) fn reference_logits(m: &mut ResNet<f32>, x: &Tensor<f32>, r: Rounding) -> Tensor<f32> {
    let f = body_forward(m, x, false, r);
    logits(m, &f)
}

/// One training step of `m` with the GPU's rounding points `r`: forward, the loss (label
/// smoothing `smoothing`) scaled by `scale`, backward, the gradients unscaled and SGD at `lr`.
/// Returns the mean loss; `m`'s parameters, momenta and running statistics move as the GPU's.
pub(super) fn reference_step(
    m: &mut ResNet<f32>,
    x: &Tensor<f32>,
    labels: &[usize],
    (lr, smoothing, scale): (f64, f64, f64),
    sgd: &roofline_models::train::Sgd,
    r: Rounding,
) -> f64 {
    let f = body_forward(m, x, true, r);
    let z = logits(m, &f);
    let (loss, mut g, _, _) = roofline_models::layers::softmax_cross_entropy(&z, labels, smoothing);
    g.data.iter_mut().for_each(|v| *v *= scale as f32);
    let dp = m.fc.backward(&g);
    let last = &f.blocks.last().expect("a block").out;
    let d = avgpool_backward(&dp, last.h, last.w);
    body_backward(m, f, vec![None, None, None, Some(d)], r);
    let inv = (1.0 / scale) as f32;
    for p in m.params() {
        p.grad.iter_mut().for_each(|g| *g *= inv);
    }
    sgd.step(m.params(), lr);
    loss
}

/// The detector's body as a GPU detector with 16-bit storage runs it (`GpuDetector`): the
/// classifier's rounding points for every body layer, the stage outputs C2–C5 read by the
/// pyramid exactly (widened to f32), and their gradients from the pyramid stored before the
/// body's backward pass adds them in. The body's convolutions round here, not through
/// `conv::rounding::with_conv_rounding` (suspended inside), which the rest of the step's
/// convolutions use.
pub(super) struct RoundedBody {
    pub r: Rounding,
    saved: Option<BodyPass>,
}

impl RoundedBody {
    pub(super) fn new(r: Rounding) -> RoundedBody {
        RoundedBody { r, saved: None }
    }
}

impl roofline_models::detect::model::Body<f32> for RoundedBody {
    fn forward(
        &mut self,
        m: &mut ResNet<f32>,
        x: &Tensor<f32>,
        train: bool,
    ) -> Vec<Arc<Tensor<f32>>> {
        let f = without_conv_rounding(|| body_forward(m, x, train, self.r));
        let out = f
            .stage_outputs(m)
            .into_iter()
            .map(|t| Arc::new(t.clone()))
            .collect();
        if train {
            self.saved = Some(f);
        }
        out
    }

    fn backward(&mut self, m: &mut ResNet<f32>, dc: Vec<Tensor<f32>>) {
        let f = self
            .saved
            .take()
            .expect("backward after a training forward pass");
        let r = self.r;
        without_conv_rounding(|| body_backward(m, f, dc.into_iter().map(Some).collect(), r));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_rounding_the_reference_is_the_cpu_models_own_step() {
        // The reference walks the layers one by one; the CPU model fuses them. In f32 they are
        // the same step: the reference's wiring (every block, the shortcut, the pools, the
        // classifier, the unscaled optimizer) is the model's. A loss scale of 2⁵ cancels
        // exactly.
        let e = errors(
            &reference_outcome_scaled(Rounding::of(Prec::F32), 32.0),
            &cpu_outcome(),
        );
        let updates = e.params.iter().fold(0.0f64, |a, &b| a.max(b));
        assert!(e.loss < 1e-6, "loss {:e}", e.loss);
        assert!(
            updates < 1e-4 && e.stats < 1e-6,
            "updates {updates:e}, statistics {:e}",
            e.stats
        );
        assert!(e.logits < 1e-5, "logits {:e}", e.logits);
    }

    #[test]
    fn a_correct_step_passes_the_calibrated_check_and_a_wrong_one_fails_it() {
        // Five correct steps with these rounding points (the reference, three other orders of
        // sums as the tolerances' sample, a fourth as the step under test) and a wrong one: a
        // step that stores nothing in 16 bits (f32 activations where the GPU stores f16/bf16).
        for p in [Prec::Bf16, Prec::F16, Prec::Tf32] {
            let r = Rounding::of(p);
            let want = reference_outcome(p, r);
            let samples: Vec<Outcome> = (1..=3)
                .map(|seed| reference_outcome(p, Rounding { jitter: seed, ..r }))
                .collect();
            let tol = Tolerances::calibrated(&want, &samples);
            let other = reference_outcome(p, Rounding { jitter: 99, ..r });
            let checks = tol.checks("", &other, &want);
            eprintln!("{}:", p.name());
            for c in &checks {
                eprintln!(
                    "  {} {:.2e} (tolerance {:.2e})",
                    c.name, c.error, c.tolerance
                );
            }
            assert!(checks.iter().all(Check::passed), "{}: {checks:?}", p.name());
            let wide = reference_outcome(p, Rounding::of(Prec::F32));
            let failed = |o: &Outcome| tol.checks("", o, &want).iter().any(|c| !c.passed());
            if p != Prec::Tf32 {
                assert!(failed(&wide), "{}: f32 storage passed", p.name());
            }
        }
    }
}
