//! `--check`'s whole training step: a small ResNet (every block kind, v1.5) stepped once on the
//! GPU and on the CPU from the same start. In f32 the CPU side is the model's own step, held to
//! fixed tolerances. In tf32, f16 and bf16 it is the reference with the GPU's rounding points
//! (`reference.rs`), and the tolerances are calibrated: three times the farthest that the
//! reference moves under three other orders of its sums (`Rounding::jitter`), and never below
//! the f32 ones. A reduced-precision step is chaotic at this size (a ReLU that flips, a batch
//! norm over 16 values), so a fixed bound would either pass anything or fail a correct step;
//! the calibrated one asks the GPU to stray no further than a correct implementation does.

use super::*;

/// The small step's network, batch and labels, learning rate and label smoothing.
pub(super) fn setup() -> (
    roofline_models::resnet::Config,
    Tensor<f32>,
    [usize; 4],
    f64,
    f64,
) {
    let cfg = roofline_models::resnet::Config {
        version: roofline_models::resnet::Version::V1_5,
        blocks: [1, 1, 1, 1],
        width: 0.125,
        classes: 7,
        zero_init_residual: false,
    };
    let mut rng = roofline_models::data::Rng::new(0x57E9);
    let x = Tensor::from_vec(4, 40, 40, 3, random(4 * 40 * 40 * 3, &mut rng));
    (cfg, x, [0, 3, 6, 2], 0.05, 0.1)
}

/// A model after one training step from the setup's start: its loss, each parameter's update,
/// its running statistics, and its inference logits on the batch after the step.
pub(super) struct Outcome {
    pub loss: f64,
    pub updates: Vec<(String, Vec<f32>)>,
    pub stats: Vec<f32>,
    pub logits: Vec<f32>,
}

impl Outcome {
    pub(super) fn of(
        m: &mut impl roofline_models::train::Model<f32>,
        init: &[Vec<f32>],
        loss: f64,
        logits: Vec<f32>,
    ) -> Outcome {
        let updates = m
            .params()
            .iter()
            .zip(init)
            .map(|(p, i)| {
                let d = p.value.iter().zip(i).map(|(a, b)| a - b).collect();
                (p.name.clone(), d)
            })
            .collect();
        let stats = running_stats(m);
        Outcome {
            loss,
            updates,
            stats,
            logits,
        }
    }
}

/// Every batch norm's running mean then variance, in the model's order.
pub(super) fn running_stats(m: &mut impl roofline_models::train::Model<f32>) -> Vec<f32> {
    m.running_stats()
        .into_iter()
        .flat_map(|(_, a, b)| a.iter().chain(b.iter()).copied().collect::<Vec<_>>())
        .collect()
}

pub(super) fn values(m: &mut impl roofline_models::train::Model<f32>) -> Vec<Vec<f32>> {
    m.params().iter().map(|p| p.value.clone()).collect()
}

/// The CPU reference's step with rounding points `r` (the GPU's in precision `p`, whose loss
/// scale it takes).
pub(super) fn reference_outcome(p: Prec, r: Rounding) -> Outcome {
    reference_outcome_scaled(r, LossScale::for_step(p, Wire::F32).scale)
}

/// `reference_outcome` with the loss scaled by `scale`.
pub(super) fn reference_outcome_scaled(r: Rounding, scale: f64) -> Outcome {
    let (cfg, x, labels, lr, smoothing) = setup();
    let mut m = ResNet::<f32>::new(cfg, 11);
    let init = values(&mut m);
    let sgd = roofline_models::train::Sgd::default();
    let loss = reference_step(&mut m, &x, &labels, (lr, smoothing, scale), &sgd, r);
    let logits = reference_logits(&mut m, &x, r).data;
    Outcome::of(&mut m, &init, loss, logits)
}

/// The CPU model's own f32 step.
pub(super) fn cpu_outcome() -> Outcome {
    let (cfg, x, labels, lr, smoothing) = setup();
    let mut m = ResNet::<f32>::new(cfg, 11);
    let init = values(&mut m);
    let z = m.forward(&x, true);
    let (loss, g, _, _) = roofline_models::layers::softmax_cross_entropy(&z, &labels, smoothing);
    m.backward(&g);
    roofline_models::train::Sgd::default().step(m.params(), lr);
    let logits = m.forward(&x, false).data;
    Outcome::of(&mut m, &init, loss, logits)
}

/// The bounds of a step's comparisons: the loss's relative error, each parameter update's,
/// the running statistics' and the inference logits' normwise errors.
#[derive(Clone, Debug)]
pub(super) struct Tolerances {
    pub loss: f64,
    pub params: Vec<f64>,
    pub stats: f64,
    pub logits: f64,
}

/// The errors of `a` against `b`, in the shape of [`Tolerances`].
pub(super) fn errors(a: &Outcome, b: &Outcome) -> Tolerances {
    Tolerances {
        loss: ((a.loss - b.loss) / b.loss.abs().max(1e-30)).abs(),
        params: a
            .updates
            .iter()
            .zip(&b.updates)
            .map(|((_, x), (_, y))| normwise(x, y))
            .collect(),
        stats: normwise(&a.stats, &b.stats),
        logits: normwise(&a.logits, &b.logits),
    }
}

/// A whole step's bounds (or errors) as one list, in a fixed order: what the two whole-step
/// checks (the classifier's and the detector's) calibrate alike.
pub(super) trait Bounds: Sized {
    fn each(&mut self) -> Vec<&mut f64>;
}

/// `floor` raised to three times the farthest error of `spread` (correct steps with other
/// orders of sums against the reference), bound by bound.
pub(super) fn calibrated<B: Bounds>(mut floor: B, spread: impl Iterator<Item = B>) -> B {
    for mut e in spread {
        for (b, e) in floor.each().into_iter().zip(e.each()) {
            *b = b.max(3.0 * *e);
        }
    }
    floor
}

impl Bounds for Tolerances {
    fn each(&mut self) -> Vec<&mut f64> {
        let mut v = vec![&mut self.loss, &mut self.stats, &mut self.logits];
        v.extend(self.params.iter_mut());
        v
    }
}

impl Tolerances {
    /// The f32 step's: a step compounds every layer's rounding, and batch norm divides by small
    /// spreads.
    pub(super) fn fixed(params: usize) -> Tolerances {
        Tolerances {
            loss: 1e-3,
            params: vec![1e-3; params],
            stats: 1e-3,
            logits: 1e-2,
        }
    }

    /// Three times the farthest any of `samples` (correct steps with other orders of sums)
    /// lies from `want`, each at least the f32 step's bound.
    pub(super) fn calibrated(want: &Outcome, samples: &[Outcome]) -> Tolerances {
        calibrated(
            Tolerances::fixed(want.updates.len()),
            samples.iter().map(|s| errors(s, want)),
        )
    }

    /// Each bound at least `least` (a compressed wire's rounding).
    pub(super) fn at_least(&self, least: f64) -> Tolerances {
        let mut t = self.clone();
        t.each().into_iter().for_each(|b| *b = b.max(least));
        t
    }

    /// `got` against `want`: the loss, the parameter update furthest over its bound (named),
    /// the running statistics, the inference logits.
    pub(super) fn checks(&self, prefix: &str, got: &Outcome, want: &Outcome) -> Vec<Check> {
        let e = errors(got, want);
        let check = |name: String, error: f64, tolerance: f64| Check {
            name,
            error,
            tolerance,
        };
        // The parameter with the largest error for its bound (a non-finite one first).
        let worst = (0..e.params.len()).max_by(|&a, &b| {
            let ratio = |i: usize| {
                let r = e.params[i] / self.params[i];
                if r.is_nan() {
                    f64::INFINITY
                } else {
                    r
                }
            };
            ratio(a).total_cmp(&ratio(b))
        });
        let mut out = vec![check(format!("{prefix}network loss"), e.loss, self.loss)];
        if let Some(i) = worst {
            out.push(check(
                format!(
                    "{prefix}network parameter updates of one step (worst: {})",
                    want.updates[i].0
                ),
                e.params[i],
                self.params[i],
            ));
        } else {
            out.push(check(
                format!("{prefix}network parameter updates: none"),
                f64::INFINITY,
                0.0,
            ));
        }
        out.push(check(
            format!("{prefix}network running statistics"),
            e.stats,
            self.stats,
        ));
        out.push(check(
            format!("{prefix}network inference logits"),
            e.logits,
            self.logits,
        ));
        out
    }
}

/// The GPU's step of the setup on `ctx` (with gradients through `nccl` when given): its
/// outcome and whether the update was applied.
fn gpu_outcome(
    ctx: Ctx,
    nccl: Option<Communicator>,
    opts: CommOptions,
) -> Result<(Outcome, bool, Ctx), CudaError> {
    let (cfg, x, labels, lr, smoothing) = setup();
    let mut m = ResNet::<f32>::new(cfg, 11);
    let init = values(&mut m);
    let mut net = GpuResNet::new(ctx, &mut m, nccl, None, opts)?;
    let sgd = roofline_models::train::Sgd::default();
    let r = net.step(&x, &labels, lr, smoothing, &sgd)?;
    let logits = net.logits(&x)?.data;
    net.store(&mut m)?;
    let ctx = net.into_parts().0;
    Ok((Outcome::of(&mut m, &init, r.loss, logits), r.applied, ctx))
}

/// The device allocations of a model's third step on `ctx`. The first takes every buffer a step
/// needs; the second may take a few more (a buffer the first kept for good, such as batch
/// norm's running statistics, may have come from the free list at a moment of low demand);
/// from then on the pool hands out what it holds.
fn steady_step_allocations(ctx: Ctx) -> Result<(u64, Ctx), CudaError> {
    let (cfg, x, labels, lr, smoothing) = setup();
    let mut m = ResNet::<f32>::new(cfg, 11);
    let mut net = GpuResNet::new(ctx, &mut m, None, None, CommOptions::default())?;
    let sgd = roofline_models::train::Sgd::default();
    for _ in 0..2 {
        net.step(&x, &labels, lr, smoothing, &sgd)?;
    }
    let before = net.ctx.allocations();
    net.step(&x, &labels, lr, smoothing, &sgd)?;
    let allocated = net.ctx.allocations() - before;
    Ok((allocated, net.into_parts().0))
}

/// The whole-step comparisons of `--check` in precision `p` on `ctx`'s GPU, and the same step
/// with its gradients through NCCL (a one-rank communicator: the sum is the gradient itself)
/// in small buckets queued during the backward pass, in each wire format.
pub(super) fn step_checks(ctx: Ctx, p: Prec) -> Result<Vec<Check>, CudaError> {
    let (want, tol) = if p == Prec::F32 {
        let want = cpu_outcome();
        let n = want.updates.len();
        (want, Tolerances::fixed(n))
    } else {
        let r = Rounding::of(p);
        let want = reference_outcome(p, r);
        let samples: Vec<Outcome> = (1..=3)
            .map(|seed| reference_outcome(p, Rounding { jitter: seed, ..r }))
            .collect();
        let tol = Tolerances::calibrated(&want, &samples);
        (want, tol)
    };
    let (got, applied, ctx) = gpu_outcome(ctx, None, CommOptions::default())?;
    let mut out = tol.checks("", &got, &want);
    out.push(Check {
        name: "network step applied".into(),
        error: if applied { 0.0 } else { 1.0 },
        tolerance: 0.0,
    });
    let (allocated, ctx) = steady_step_allocations(ctx)?;
    out.push(Check {
        name: "device allocations in a third step of the same shapes".into(),
        error: allocated as f64,
        tolerance: 0.0,
    });
    out.extend(super::check_graph::graph_checks(ctx.gpu.ordinal, p)?);
    if roofline_kernels::comm::nccl::available().is_err() {
        return Ok(out);
    }
    let ordinal = ctx.gpu.ordinal;
    drop(ctx);
    for (wire, wire_tol) in [(Wire::F32, 0.0), (Wire::F16, 5e-3), (Wire::Bf16, 2e-2)] {
        let id = roofline_kernels::comm::nccl::unique_id()?;
        let nccl = Communicator::new(&id, 1, 0, ordinal)?;
        let ctx = Ctx::new(Gpu::open(ordinal)?, p)?;
        let opts = CommOptions {
            wire,
            overlap: true,
            bucket: 20_000,
        };
        let (got, applied, _) = gpu_outcome(ctx, Some(nccl), opts)?;
        let name = match wire {
            Wire::F32 => "f32",
            Wire::F16 => "f16",
            Wire::Bf16 => "bf16",
        };
        let prefix = format!("through NCCL, gradients in {name}: ");
        let mut c = tol
            .at_least(wire_tol)
            .checks(&prefix, &got, &want)
            .into_iter()
            .filter(|c| c.name.contains("parameter updates"))
            .collect::<Vec<_>>();
        if !applied {
            c.iter_mut().for_each(|c| c.error = f64::INFINITY);
        }
        out.extend(c);
    }
    Ok(out)
}
