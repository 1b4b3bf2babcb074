//! `--check`'s whole detector step: the small detector stepped once on the GPU and on the CPU
//! from the same start, the GPU with the CPU's proposals (they carry no gradient and hang on
//! near-ties of the scores). In f32 the CPU side is the model's own step, held to fixed
//! tolerances. In tf32, f16 and bf16 it is the same step with the GPU's rounding points: the
//! body as the GPU runs it in the step's storage (`reference::RoundedBody`: 16-bit activations
//! in f16 and bf16, the classifier's rounding points, C2–C5 widened for the pyramid and their
//! gradients stored before the body adds them in), and the rest of the step's convolutions
//! on f32 activations, each reading and writing its own type
//! (`conv::rounding::with_conv_rounding`). The tolerances are calibrated as the
//! classifier's (`check_step.rs`): three times the farthest that reference moves under three
//! other orders of its convolutions' sums, never below the f32 ones. The reference's losses'
//! gradients are scaled by the GPU's loss scale (f16's, 1024 at the first step) and its
//! parameters' unscaled before the update, so that both store the same scaled gradients in
//! 16 bits.

use super::*;
use roofline_models::conv::rounding::{emulated_convolutions, with_conv_rounding};
use roofline_models::detect::boxes::BBox;
use roofline_models::detect::model::{Body, Detector, DetectorConfig, OwnBody, Target};

/// The four losses, by name, in `Losses`' order.
const LOSSES: [&str; 4] = ["RPN objectness", "RPN box", "classifier", "box regression"];

/// A detector after one training step from the check's start: its losses and regions, each
/// parameter's update (named), its running statistics, and its inference RPN outputs of every
/// level on the batch after the step.
struct Outcome {
    losses: [f64; 4],
    regions: usize,
    updates: Vec<(String, Vec<f32>)>,
    stats: Vec<f32>,
    rpn: Vec<f32>,
}

/// How far one outcome lies from another, in the order of `Outcome`'s fields (the losses
/// relative, the rest normwise); also the bounds they are held to.
#[derive(Clone, Debug)]
struct Errors {
    losses: [f64; 4],
    params: Vec<f64>,
    stats: f64,
    rpn: f64,
}

fn errors(got: &Outcome, want: &Outcome) -> Errors {
    Errors {
        losses: std::array::from_fn(|i| {
            ((got.losses[i] - want.losses[i]) / want.losses[i].abs().max(1e-12)).abs()
        }),
        params: got
            .updates
            .iter()
            .zip(&want.updates)
            .map(|(g, w)| normwise(&g.1, &w.1))
            .collect(),
        stats: normwise(&got.stats, &want.stats),
        rpn: normwise(&got.rpn, &want.rpn),
    }
}

impl Errors {
    /// The f32 step's bounds.
    fn fixed(params: usize) -> Errors {
        Errors {
            losses: [1e-3; 4],
            params: vec![1e-3; params],
            stats: 1e-3,
            rpn: 1e-2,
        }
    }

    /// Three times the farthest any of `samples` lies from `want`, each at least the f32
    /// step's bound.
    fn calibrated(want: &Outcome, samples: &[Outcome]) -> Errors {
        super::check_step::calibrated(
            Errors::fixed(want.updates.len()),
            samples.iter().map(|s| errors(s, want)),
        )
    }
}

impl super::check_step::Bounds for Errors {
    fn each(&mut self) -> Vec<&mut f64> {
        let mut v: Vec<&mut f64> = self.losses.iter_mut().collect();
        v.extend([&mut self.stats, &mut self.rpn]);
        v.extend(self.params.iter_mut());
        v
    }
}

/// The parameter group a detector parameter belongs to.
fn part(name: &str) -> &'static str {
    if name.starts_with("fpn.") {
        "pyramid"
    } else if name.starts_with("rpn.") {
        "RPN head"
    } else if name.starts_with("roi_heads") || name.contains("box_") || name.starts_with("fc6") {
        "box head"
    } else {
        "backbone"
    }
}

/// The check's start: the small detector's configuration, a batch of two random 64 × 96
/// images, their boxes, the sampling seed and the learning rate.
fn setup(
    rng: &mut roofline_models::data::Rng,
) -> (DetectorConfig, Tensor<f32>, Vec<Target>, u64, f64) {
    let cfg = DetectorConfig::scaled(0.0625, [1, 1, 1, 1], 64, 96);
    let x = Tensor::from_vec(
        2,
        64,
        96,
        cfg.in_channels,
        random(2 * 64 * 96 * cfg.in_channels, rng),
    );
    let truth = vec![
        Target {
            boxes: vec![[8.0, 10.0, 40.0, 36.0], [50.0, 4.0, 90.0, 30.0]],
            classes: vec![0, 2],
        },
        Target {
            boxes: vec![[20.0, 30.0, 70.0, 60.0]],
            classes: vec![1],
        },
    ];
    (cfg, x, truth, 23, 0.02)
}

/// The outcome of `model` (at `init`) after `losses`, the step's update applied to it.
fn outcome(
    model: &mut Detector<f32>,
    init: &[Vec<f32>],
    losses: &roofline_models::detect::model::Losses,
    rpn: Vec<f32>,
) -> Outcome {
    let updates = model
        .params()
        .iter()
        .zip(init)
        .map(|(p, i)| {
            let d = p.value.iter().zip(i).map(|(a, b)| a - b).collect();
            (p.name.clone(), d)
        })
        .collect();
    let stats = model
        .backbone
        .running_stats()
        .into_iter()
        .flat_map(|(_, a, b)| a.iter().chain(b.iter()).copied().collect::<Vec<_>>())
        .collect();
    Outcome {
        losses: [
            losses.rpn_objectness,
            losses.rpn_box,
            losses.classifier,
            losses.box_reg,
        ],
        regions: losses.regions,
        updates,
        stats,
        rpn,
    }
}

fn flat_outputs(o: &[(Tensor<f32>, Tensor<f32>)]) -> Vec<f32> {
    o.iter()
        .flat_map(|(a, b)| a.data.iter().chain(&b.data).copied().collect::<Vec<_>>())
        .collect()
}

/// The CPU's step from the setup (with `fixed` proposals, or its own), with `rounding`'s
/// rounding points where there is one and the losses' gradients times `scale` (the GPU's loss
/// scale: f16's gradients are stored scaled), unscaled before the update: its outcome and the
/// proposals it used.
fn cpu_outcome(
    rng_seed: u64,
    (rounding, scale): (Option<Rounding>, f64),
    fixed: Option<&[Vec<BBox>]>,
) -> (Outcome, Vec<Vec<BBox>>) {
    let (cfg, x, truth, seed, lr) = setup(&mut roofline_models::data::Rng::new(rng_seed));
    let run = |body: &mut dyn Body<f32>| {
        let mut m = Detector::<f32>::new(cfg.clone(), 17);
        let init: Vec<Vec<f32>> = m.params().iter().map(|p| p.value.clone()).collect();
        let (losses, props) = m.step_in(&x, &truth, seed, (fixed, &mut |_| {}), (body, scale));
        // Unscaled as the GPU unscales its f32 gradients (exactly: a power of two).
        let inv = (1.0 / scale) as f32;
        for p in m.params() {
            p.grad.iter_mut().for_each(|g| *g *= inv);
        }
        roofline_models::train::Sgd::default().step(m.params(), lr);
        let (_, o, _) = m.first_stage_in(&x, false, body);
        (outcome(&mut m, &init, &losses, flat_outputs(&o)), props)
    };
    match rounding {
        // The body as the GPU runs it in the step's storage, the rest of the step's
        // convolutions rounded as cuDNN's on f32 activations.
        Some(r) => with_conv_rounding(r, || run(&mut RoundedBody::new(r))),
        None => run(&mut OwnBody),
    }
}

/// The whole-step comparisons of `--check` in precision `p` on `ctx`'s GPU; `rng_seed` fixes
/// the batch.
pub(super) fn detector_step_checks(
    ctx: Ctx,
    p: Prec,
    rng_seed: u64,
) -> Result<Vec<Check>, CudaError> {
    let mut out = Vec::new();
    let push = |out: &mut Vec<Check>, name: String, error: f64, tolerance: f64| {
        out.push(Check {
            name,
            error,
            tolerance,
        })
    };
    // The reference, then (reduced precision) the calibration's samples with its proposals.
    let r = (p != Prec::F32).then(|| Rounding::of(p));
    // The GPU's first loss scale (checked below against the built detector's).
    let comm = CommOptions::default();
    let scale = LossScale::for_step(p, comm.wire).scale;
    let before = emulated_convolutions();
    let (want, props) = cpu_outcome(rng_seed, (r, scale), None);
    let tol = match r {
        None => Errors::fixed(want.updates.len()),
        Some(r) => {
            push(
                &mut out,
                "detector step's reference: its convolutions rounded as the GPU's".into(),
                if emulated_convolutions() > before {
                    0.0
                } else {
                    1.0
                },
                0.0,
            );
            let samples: Vec<Outcome> = (1..=3)
                .map(|jitter| {
                    cpu_outcome(
                        rng_seed,
                        (Some(Rounding { jitter, ..r }), scale),
                        Some(&props),
                    )
                    .0
                })
                .collect();
            Errors::calibrated(&want, &samples)
        }
    };
    // The GPU's step from the same start, with the reference's proposals.
    let (cfg, x, truth, seed, lr) = setup(&mut roofline_models::data::Rng::new(rng_seed));
    let mut mirror = Detector::<f32>::new(cfg.clone(), 17);
    let init: Vec<Vec<f32>> = mirror.params().iter().map(|p| p.value.clone()).collect();
    let sgd = roofline_models::train::Sgd::default();
    let mut net = GpuDetector::new(ctx, &mut mirror, None, None, comm)?;
    if net.loss_scale.scale != scale {
        return Err(CudaError::Check(format!(
            "the detector step's reference scales the losses by {scale}, the GPU by {}",
            net.loss_scale.scale
        )));
    }
    let step = net.step(&x, &truth, seed, lr, &sgd, Some(&props))?;
    net.store(&mut mirror)?;
    // Inference after the step: the RPN's outputs of every level, and the device's proposals
    // from them (against the host's from the same outputs, below).
    let (_, og_dev, grids) = net.first_stage(&x, false)?;
    let og = net.download_outputs(&og_dev)?;
    let dims = (x.h as f64, x.w as f64);
    let g = net
        .ctx
        .rpn_proposals(&og_dev, &grids, &cfg.rpn_test, dims)?;
    drop(og_dev);
    let got = outcome(&mut mirror, &init, &step.losses, flat_outputs(&og));
    let e = errors(&got, &want);
    for (i, name) in LOSSES.iter().enumerate() {
        push(
            &mut out,
            format!("detector step: {name} loss"),
            e.losses[i],
            tol.losses[i],
        );
    }
    push(
        &mut out,
        format!("detector step: {} regions sampled on both", want.regions),
        if got.regions == want.regions && want.regions > 0 {
            0.0
        } else {
            f64::INFINITY
        },
        0.0,
    );
    push(
        &mut out,
        "detector step applied".into(),
        if step.applied { 0.0 } else { 1.0 },
        0.0,
    );
    // Each group's parameter furthest over its bound (a non-finite error first), named.
    let mut worst: Vec<(&str, usize)> = Vec::new();
    let ratio = |i: usize| {
        let r = e.params[i] / tol.params[i];
        if r.is_nan() {
            f64::INFINITY
        } else {
            r
        }
    };
    for (i, (name, _)) in want.updates.iter().enumerate() {
        let k = part(name);
        match worst.iter_mut().find(|(p, _)| *p == k) {
            Some(slot) => {
                if ratio(i) > ratio(slot.1) {
                    slot.1 = i;
                }
            }
            None => worst.push((k, i)),
        }
    }
    for (k, i) in worst {
        push(
            &mut out,
            format!(
                "detector step: {k} parameter updates (worst: {})",
                want.updates[i].0
            ),
            e.params[i],
            tol.params[i],
        );
    }
    push(
        &mut out,
        "detector step: running statistics".into(),
        e.stats,
        tol.stats,
    );
    push(
        &mut out,
        "detector inference: RPN outputs of P2–P6".into(),
        e.rpn,
        tol.rpn,
    );
    let anc: Vec<Vec<BBox>> = grids.iter().map(|g| g.anchors()).collect();
    let c: Proposals = (0..x.n)
        .map(|n| {
            roofline_models::detect::rpn::proposals(&og, &anc, n, dims.1, dims.0, &cfg.rpn_test)
        })
        .collect();
    push(
        &mut out,
        "detector inference: proposals on the device vs the host's".into(),
        proposal_mismatch(&g, &c),
        PROPOSAL_TOLERANCE,
    );
    let dets = net.detect(&x)?;
    let ordered = dets.len() == 2
        && dets.iter().enumerate().all(|(n, d)| {
            d.len() <= cfg.detections
                && d.windows(2).all(|w| w[0].score >= w[1].score)
                && d.iter().all(|t| t.image == n && t.class < cfg.classes)
        });
    push(
        &mut out,
        "detector inference: detections per image, ranked, capped".into(),
        if ordered { 0.0 } else { f64::INFINITY },
        0.0,
    );
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Whether `got` passes every bound of `tol` against `want`.
    fn passes(got: &Outcome, want: &Outcome, tol: &Errors) -> bool {
        use super::super::check_step::Bounds;
        let (mut e, mut t) = (errors(got, want), tol.clone());
        e.each().into_iter().zip(t.each()).all(|(a, b)| *a <= *b)
    }

    /// With no rounding and no jitter the reference is the CPU model's own step (within the f32
    /// bounds); in bf16 a step with other sums (another jitter seed, standing in for a correct
    /// GPU) passes the calibrated bounds, and steps with a group's updates wrong fail them. (At
    /// this size a bf16 step is chaotic: under other orders of sums the backbone's updates move
    /// by up to about 60% of their size, the box head's by up to 1.5%; the layer comparisons
    /// of `--check` hold each layer tighter.)
    #[test]
    fn a_correct_bf16_step_passes_the_calibrated_check_and_a_wrong_one_fails_it() {
        let seed = 0x5EED;
        let (plain, props) = cpu_outcome(seed, (None, 1.0), None);
        // The rounded body walks the layers one by one, the model fuses them: with no
        // rounding they are the same step up to the order of f32 sums.
        let (none, _) = cpu_outcome(seed, (Some(Rounding::of(Prec::F32)), 1.0), Some(&props));
        let tight = Errors::fixed(plain.updates.len());
        assert!(
            passes(&none, &plain, &tight),
            "the unrounded reference is not the model's step: {:?}",
            errors(&none, &plain)
        );
        // A loss scale of 2¹⁰ is exact where nothing is rounded to 16 bits.
        let (scaled, _) = cpu_outcome(seed, (Some(Rounding::of(Prec::F32)), 1024.0), Some(&props));
        assert!(scaled.updates == none.updates && scaled.losses == none.losses);
        // In bf16, every step with the reference's proposals (as the GPU's).
        let r = Rounding::of(Prec::Bf16);
        let (want, props) = cpu_outcome(seed, (Some(r), 1.0), None);
        let samples: Vec<Outcome> = (1..=3)
            .map(|jitter| cpu_outcome(seed, (Some(Rounding { jitter, ..r }), 1.0), Some(&props)).0)
            .collect();
        let tol = Errors::calibrated(&want, &samples);
        let other = cpu_outcome(seed, (Some(Rounding { jitter: 9, ..r }), 1.0), Some(&props)).0;
        assert!(
            passes(&other, &want, &tol),
            "{:?}\nagainst {:?}",
            errors(&other, &want),
            tol
        );
        // The rounding points change the step (the reference is not the f32 one).
        let f32_step = cpu_outcome(seed, (None, 1.0), Some(&props)).0;
        assert!(f32_step.updates != want.updates);
        // Wrong steps fail: the box head's updates 10% off, or the backbone's reversed.
        for (group, by) in [("box head", 1.1f32), ("backbone", -1.0)] {
            let mut off =
                cpu_outcome(seed, (Some(Rounding { jitter: 9, ..r }), 1.0), Some(&props)).0;
            for (n, u) in off.updates.iter_mut() {
                if part(n) == group {
                    u.iter_mut().for_each(|v| *v *= by);
                }
            }
            assert!(
                !passes(&off, &want, &tol),
                "the {group}'s updates × {by} pass"
            );
        }
    }
}
