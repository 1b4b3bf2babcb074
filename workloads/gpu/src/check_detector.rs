//! `train --workload ewa --device cuda --check`: the detector's assembled GPU layers — the
//! pyramid (lateral and output convolutions with the top-down path and P6) and the RPN head
//! shared by several levels (its filter and bias gradients summed over them), the proposals and
//! the RPN's and box head's losses on the device — and one whole training step of a small
//! detector (`check_detector_step.rs`), against the CPU's, with the same normwise errors and
//! per-precision bounds as the classifier's check (`self_test`, which covers the box head,
//! RoIAlign and the pyramid's kernels on their own). In a reduced precision the CPU side of
//! every layer comparison runs with the GPU's rounding points (`as_gpu`): the layers'
//! activations are f32 on both sides, and their convolutions read and write the precision's
//! type.

use super::*;
use roofline_models::detect::boxes::BBox;
use roofline_models::detect::fpn::Fpn;
use roofline_models::detect::model::DetectorConfig;
use roofline_models::detect::rpn::{proposals, rpn_loss, ProposalRule, RpnHead};
use roofline_models::layers::Param;

/// A flat store's gradients in the CPU layout, slot after slot.
fn grads_of(ctx: &Ctx, flat: &Flat) -> Result<Vec<f32>, CudaError> {
    let g: Vec<f32> = ctx.get(flat.grads.ptr, flat.total)?;
    Ok(flat
        .slots
        .iter()
        .flat_map(|s| s.host_layout(&g[s.off..s.off + s.len]))
        .collect())
}

fn cpu_grads(params: Vec<&mut Param<f32>>) -> Vec<f32> {
    params.iter().flat_map(|p| p.grad.iter().copied()).collect()
}

fn cat(ts: &[Tensor<f32>]) -> Vec<f32> {
    ts.iter().flat_map(|t| t.data.iter().copied()).collect()
}

fn downloads(ctx: &Ctx, ts: &[GTensor]) -> Result<Vec<f32>, CudaError> {
    let mut v = Vec::new();
    for t in ts {
        v.extend(ctx.download(t)?.data);
    }
    Ok(v)
}

fn rand_tensor(
    n: usize,
    h: usize,
    w: usize,
    c: usize,
    rng: &mut roofline_models::data::Rng,
) -> Tensor<f32> {
    Tensor::from_vec(n, h, w, c, random(n * h * w * c, rng))
}

/// `f` (a CPU layer's passes) with the GPU's rounding points in precision `p`: its convolutions
/// rounded as cuDNN's of that type on f32 activations (none in f32).
fn as_gpu<R>(p: Prec, f: impl FnOnce() -> R) -> R {
    if p == Prec::F32 {
        f()
    } else {
        roofline_models::conv::rounding::with_conv_rounding(Rounding::of(p), f)
    }
}

/// Compares the detector's GPU layers and one whole training step with the CPU's in
/// precision `p` (see the module's description).
pub fn detector_self_test(gpu: Gpu, p: Prec) -> Result<Vec<Check>, CudaError> {
    let mut ctx = Ctx::new(gpu, p)?;
    let tol = tolerance(p);
    let mut out = Vec::new();
    let mut rng = roofline_models::data::Rng::new(0xDE7EC7);
    let push = |out: &mut Vec<Check>, name: &str, error: f64, tolerance: f64| {
        out.push(Check {
            name: name.to_string(),
            error,
            tolerance,
        })
    };
    // The pyramid over odd sizes (nearest upsampling by other factors than 2, P6 of an odd P5).
    {
        let chans = [8, 12, 16, 20];
        let sizes = [(9, 13), (5, 7), (3, 4), (2, 2)];
        let mut cpu = Fpn::<f32>::new(chans, 8, &mut rng);
        let c: Vec<Tensor<f32>> = sizes
            .iter()
            .zip(chans)
            .map(|(&(h, w), ch)| rand_tensor(2, h, w, ch, &mut rng))
            .collect();
        let carc: Vec<Arc<Tensor<f32>>> = c.iter().cloned().map(Arc::new).collect();
        let pc = as_gpu(p, || cpu.forward(&carc));
        let g: Vec<Tensor<f32>> = pc
            .iter()
            .map(|t| rand_tensor(t.n, t.h, t.w, t.c, &mut rng))
            .collect();
        let dc = as_gpu(p, || cpu.backward(g.clone()));
        let convs: HashMap<String, (usize, usize)> = fpn_convs(&cpu).collect();
        let flat = flat_params(&ctx, &cpu.params(), &convs)?;
        let mut fpn = GFpn::new(&cpu, &flat.slots)?;
        let mut cg = Vec::new();
        for t in &c {
            cg.push(Rc::new(ctx.upload(t)?));
        }
        let pg = fpn.forward(&mut ctx, &flat, &cg, true)?;
        let mut pv = Vec::new();
        for t in &pg {
            pv.extend(ctx.download(t)?.data);
        }
        push(
            &mut out,
            "pyramid forward (P2–P6)",
            normwise(&pv, &cat(&pc)),
            tol,
        );
        drop(pg);
        let mut gg = Vec::new();
        for t in &g {
            gg.push(ctx.upload(t)?);
        }
        let dcg = fpn.backward(&mut ctx, &flat, gg)?;
        push(
            &mut out,
            "pyramid backward (C2–C5 gradients)",
            normwise(&downloads(&ctx, &dcg)?, &cat(&dc)),
            tol,
        );
        push(
            &mut out,
            "pyramid weight gradients",
            normwise(&grads_of(&ctx, &flat)?, &cpu_grads(cpu.params())),
            tol,
        );
    }
    // The RPN head over three levels: its weights shared, their gradients summed.
    {
        let (width, anchors) = (8, 6);
        let mut cpu = RpnHead::<f32>::new(width, anchors, &mut rng);
        // Larger weights than the 0.01 default, so that the hidden layer is not all ReLU kinks.
        for prm in cpu.params() {
            prm.value.iter_mut().for_each(|v| *v *= 30.0);
        }
        let levels: Vec<Tensor<f32>> = [(8, 12), (4, 6), (2, 3)]
            .iter()
            .map(|&(h, w)| rand_tensor(2, h, w, width, &mut rng))
            .collect();
        let outc = as_gpu(p, || cpu.forward(&levels));
        let g: Vec<(Tensor<f32>, Tensor<f32>)> = outc
            .iter()
            .map(|(o, d)| {
                (
                    rand_tensor(o.n, o.h, o.w, o.c, &mut rng),
                    rand_tensor(d.n, d.h, d.w, d.c, &mut rng),
                )
            })
            .collect();
        let dxc = as_gpu(p, || cpu.backward(&g));
        let convs: HashMap<String, (usize, usize)> = rpn_convs(&cpu).collect();
        let flat = flat_params(&ctx, &cpu.params(), &convs)?;
        let mut rpn = GRpn::new(&cpu, &flat.slots)?;
        let mut lg = Vec::new();
        for t in &levels {
            lg.push(Rc::new(ctx.upload(t)?));
        }
        let outg = rpn.forward(&mut ctx, &flat, &lg, true)?;
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for ((og, dg), (oc, dc)) in outg.iter().zip(&outc) {
            a.extend(ctx.download(og)?.data);
            a.extend(ctx.download(dg)?.data);
            b.extend(&oc.data);
            b.extend(&dc.data);
        }
        push(
            &mut out,
            "RPN head forward (3 levels)",
            normwise(&a, &b),
            tol,
        );
        let mut gg = Vec::new();
        for (o, d) in &g {
            gg.push((ctx.upload(o)?, ctx.upload(d)?));
        }
        let dxg = rpn.backward(&mut ctx, &flat, &gg)?;
        push(
            &mut out,
            "RPN head backward (each level's input gradient)",
            normwise(&downloads(&ctx, &dxg)?, &cat(&dxc)),
            tol,
        );
        push(
            &mut out,
            "RPN head weight and bias gradients, summed over the levels",
            normwise(&grads_of(&ctx, &flat)?, &cpu_grads(cpu.params())),
            tol,
        );
    }
    proposals_check(&mut ctx, &mut out, &mut rng)?;
    region_match_check(&mut ctx, &mut out, &mut rng)?;
    rpn_loss_check(&mut ctx, &mut out, &mut rng)?;
    head_loss_check(&mut ctx, &mut out, &mut rng)?;
    out.extend(detector_step_checks(ctx, p, 0x5EED)?);
    Ok(out)
}

/// The proposals on the device against `rpn::proposals` on the same outputs: two images over
/// five levels of nine anchors, logits in quarters (ties, within a level and across levels),
/// deltas that make tiny boxes, huge ones (the clamp) and boxes past the edges; a rule that
/// selects among many anchors at P2 and takes every anchor at P6, and one at the kernels'
/// capacity (`MAX_PRE_NMS`).
fn proposals_check(
    ctx: &mut Ctx,
    out: &mut Vec<Check>,
    rng: &mut roofline_models::data::Rng,
) -> Result<(), CudaError> {
    let cfg = DetectorConfig::ewa();
    let (ih, iw) = (96usize, 144usize);
    let sizes: Vec<(usize, usize)> = (0..5)
        .map(|l| (ih.div_ceil(4 << l), iw.div_ceil(4 << l)))
        .collect();
    let grids = cfg.level_grids(&sizes);
    let anc: Vec<Vec<BBox>> = grids.iter().map(|g| g.anchors()).collect();
    let a = grids[0].per_cell();
    let mut host = Vec::new();
    let mut dev = Vec::new();
    for &(h, w) in &sizes {
        let logits: Vec<f32> = (0..2 * h * w * a)
            .map(|_| (rng.normal() * 4.0).round() as f32 / 4.0)
            .collect();
        let deltas: Vec<f32> = (0..2 * h * w * a * 4)
            .map(|i| {
                let v = rng.normal() as f32;
                // Every 97th a huge size delta (the clamp), the others spread to ±2.
                if i % 97 == 2 {
                    40.0
                } else {
                    v
                }
            })
            .collect();
        let (o, d) = (
            Tensor::from_vec(2, h, w, a, logits),
            Tensor::from_vec(2, h, w, 4 * a, deltas),
        );
        dev.push((ctx.upload(&o)?, ctx.upload(&d)?));
        host.push((o, d));
    }
    let base = cfg.rpn_train;
    for (what, rule) in [
        (
            "600 a level",
            ProposalRule {
                pre_nms: 600,
                post_nms: 1000,
                ..base
            },
        ),
        (
            "at capacity",
            ProposalRule {
                pre_nms: MAX_PRE_NMS,
                post_nms: 3000,
                ..base
            },
        ),
    ] {
        let g = ctx.rpn_proposals(&dev, &grids, &rule, (ih as f64, iw as f64))?;
        let c: Proposals = (0..2)
            .map(|n| proposals(&host, &anc, n, iw as f64, ih as f64, &rule))
            .collect();
        out.push(Check {
            name: format!("RPN proposals on the device ({what}) vs the host's"),
            error: proposal_mismatch(&g, &c),
            tolerance: PROPOSAL_TOLERANCE,
        });
    }
    Ok(())
}

/// The second stage's matching on the device (`region_match`) against `Matcher::HEAD` on the
/// same candidates: an image with a proposal at IoU exactly 0.5, one just under, a proposal
/// equal to a box and two equal boxes (the first wins), beside random ones; an image of random
/// proposals and boxes; one without boxes (all background); one without proposals (its boxes
/// alone). Every label must be the host's.
fn region_match_check(
    ctx: &mut Ctx,
    out: &mut Vec<Check>,
    rng: &mut roofline_models::data::Rng,
) -> Result<(), CudaError> {
    use roofline_models::detect::head::candidates;
    use roofline_models::detect::matcher::Matcher;
    let random_box = |rng: &mut roofline_models::data::Rng| -> BBox {
        let (x, y) = (rng.uniform(0.0, 90.0), rng.uniform(0.0, 90.0));
        [x, y, x + rng.uniform(1.0, 40.0), y + rng.uniform(1.0, 40.0)]
    };
    let a = [0.0, 0.0, 10.0, 10.0];
    let mut truth: Vec<Vec<BBox>> = vec![vec![a, a, [20.0, 20.0, 40.0, 40.0]]];
    let mut props: Vec<Vec<BBox>> = vec![vec![a, [0.0, 0.0, 10.0, 5.0], [0.0, 0.0, 10.0, 4.9]]];
    truth.push((0..7).map(|_| random_box(rng)).collect());
    props.push((0..300).map(|_| random_box(rng)).collect());
    props[0].extend((0..40).map(|_| random_box(rng)));
    truth.push(Vec::new());
    props.push((0..50).map(|_| random_box(rng)).collect());
    truth.push((0..3).map(|_| random_box(rng)).collect());
    props.push(Vec::new());
    let got = ctx.region_labels(&props, &truth, Matcher::HEAD)?;
    let differing: usize = props
        .iter()
        .zip(&truth)
        .zip(&got)
        .map(|((p, t), g)| {
            let want = Matcher::HEAD.assign(&candidates(p, t), t);
            if want.len() != g.len() {
                return want.len().max(g.len());
            }
            want.iter().zip(g).filter(|(w, g)| w != g).count()
        })
        .sum();
    out.push(Check {
        name: "second stage's matching on the device (proposals then boxes, ties): labels \
               not the host's"
            .into(),
        error: differing as f64,
        tolerance: 0.0,
    });
    Ok(())
}

/// The RPN's losses on the device against `rpn::rpn_loss` on the same outputs: three images
/// over five levels of nine anchors (two boxes; twelve crowded boxes, more foreground anchors
/// than half the draw; none, all background) at a loss scale of 8: the same anchors kept, both
/// losses, every gradient.
fn rpn_loss_check(
    ctx: &mut Ctx,
    out: &mut Vec<Check>,
    rng: &mut roofline_models::data::Rng,
) -> Result<(), CudaError> {
    let cfg = DetectorConfig::ewa();
    let (ih, iw, images) = (96usize, 144usize, 3usize);
    let sizes: Vec<(usize, usize)> = (0..5)
        .map(|l| (ih.div_ceil(4 << l), iw.div_ceil(4 << l)))
        .collect();
    let grids = cfg.level_grids(&sizes);
    let anc: Vec<Vec<BBox>> = grids.iter().map(|g| g.anchors()).collect();
    let a = grids[0].per_cell();
    let (mut host, mut dev) = (Vec::new(), Vec::new());
    for &(h, w) in &sizes {
        let o = rand_tensor(images, h, w, a, rng);
        let mut d = rand_tensor(images, h, w, 4 * a, rng);
        d.data.iter_mut().for_each(|v| *v *= 0.3);
        dev.push((ctx.upload(&o)?, ctx.upload(&d)?));
        host.push((o, d));
    }
    let crowd: Vec<BBox> = (0..12)
        .map(|i| {
            let (x, y) = (8.0 + 10.0 * i as f64, 4.0 + 6.0 * (i % 4) as f64);
            [x, y, x + 24.0, y + 20.0]
        })
        .collect();
    let truth = vec![
        vec![[10.0, 12.0, 50.0, 60.0], [60.0, 20.0, 130.0, 80.0]],
        crowd,
        Vec::new(),
    ];
    let (per_image, seed, scale) = (cfg.rpn_per_image, 11, 8.0);
    let terms = ctx.alloc(terms_bytes(images, per_image))?;
    let l = ctx.rpn_loss(&dev, &grids, &truth, per_image, seed, scale, terms.ptr)?;
    let raw: Vec<f64> = ctx.get(terms.ptr, 3 * l.kept)?;
    let (obj, reg) = rpn_loss_sums(&raw, l.kept, l.count());
    let (want_obj, want_reg, want) = rpn_loss(&host, &anc, &truth, per_image, seed);
    let rel = |g: f64, c: f64| ((g - c) / c.abs().max(1e-300)).abs();
    let (mut got_l, mut got_d) = (Vec::new(), Vec::new());
    for (gl, gd) in &l.grads {
        got_l.extend(ctx.download(gl)?.data.iter().map(|v| v / scale as f32));
        got_d.extend(ctx.download(gd)?.data.iter().map(|v| v / scale as f32));
    }
    let want_l = cat(&want.iter().map(|w| w.0.clone()).collect::<Vec<_>>());
    let want_d = cat(&want.iter().map(|w| w.1.clone()).collect::<Vec<_>>());
    // The kept anchors are those with a logit gradient on either side.
    let differ = got_l
        .iter()
        .zip(&want_l)
        .filter(|(g, w)| (**g != 0.0) != (**w != 0.0))
        .count();
    let kept_host = want_l.iter().filter(|w| **w != 0.0).count();
    for (name, error, tolerance) in [
        (
            format!("RPN loss on the device: the host's {kept_host} anchors kept"),
            differ as f64 + (l.kept != kept_host) as u8 as f64,
            0.0,
        ),
        (
            "RPN loss on the device: objectness vs the host's".to_string(),
            rel(obj, want_obj),
            1e-12,
        ),
        (
            "RPN loss on the device: box regression vs the host's".to_string(),
            rel(reg, want_reg),
            1e-12,
        ),
        (
            "RPN loss on the device: objectness gradients".to_string(),
            normwise(&got_l, &want_l),
            1e-6,
        ),
        (
            "RPN loss on the device: box gradients".to_string(),
            normwise(&got_d, &want_d),
            1e-6,
        ),
    ] {
        out.push(Check {
            name,
            error,
            tolerance,
        });
    }
    Ok(())
}

/// The box head's losses on the device against `head::head_loss` on the same outputs: 300
/// regions of the EWA detector's classes, a third background, logits spread wide, deltas on
/// both sides of the smooth L1's β, under a loss scale of 8.
fn head_loss_check(
    ctx: &mut Ctx,
    out: &mut Vec<Check>,
    rng: &mut roofline_models::data::Rng,
) -> Result<(), CudaError> {
    let (rows, k, scale) = (300, DetectorConfig::ewa().classes + 1, 8.0);
    let mut z = rand_tensor(rows, 1, 1, k, rng);
    z.data.iter_mut().for_each(|v| *v *= 6.0);
    let mut d = rand_tensor(rows, 1, 1, 4 * k, rng);
    d.data.iter_mut().for_each(|v| *v *= 0.2);
    let labels: Vec<usize> = (0..rows)
        .map(|r| if r % 3 == 0 { 0 } else { 1 + r % (k - 1) })
        .collect();
    let targets: Vec<[f64; 4]> = labels
        .iter()
        .map(|&l| match l {
            0 => [0.0; 4],
            _ => std::array::from_fn(|_| rng.normal() * 0.1),
        })
        .collect();
    let terms = ctx.alloc(head_terms_bytes(rows))?;
    let (zg, dg) = (ctx.upload(&z)?, ctx.upload(&d)?);
    let l = ctx.head_loss(&zg, &dg, &labels, &targets, scale, terms.ptr)?;
    let raw: Vec<f64> = ctx.get(terms.ptr, 2 * rows)?;
    let (cls, reg) = head_loss_sums(&raw, l.rows);
    let (want_cls, want_reg, want_z, want_d) =
        roofline_models::detect::head::head_loss(&z, &d, &labels, &targets);
    let unscale = |t: &GTensor| -> Result<Vec<f32>, CudaError> {
        Ok(ctx
            .download(t)?
            .data
            .iter()
            .map(|v| v / scale as f32)
            .collect())
    };
    let rel = |g: f64, c: f64| ((g - c) / c.abs().max(1e-300)).abs();
    for (name, error, tolerance) in [
        ("class loss vs the host's", rel(cls, want_cls), 1e-12),
        ("box loss vs the host's", rel(reg, want_reg), 1e-12),
        (
            "class-logit gradients",
            normwise(&unscale(&l.dlogits)?, &want_z.data),
            1e-6,
        ),
        (
            "box-delta gradients",
            normwise(&unscale(&l.ddeltas)?, &want_d.data),
            1e-6,
        ),
    ] {
        out.push(Check {
            name: format!("box head loss on the device: {name}"),
            error,
            tolerance,
        });
    }
    Ok(())
}
