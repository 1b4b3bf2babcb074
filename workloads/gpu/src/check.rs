//! `train --device cuda --check`: every GPU layer and one whole training step against the CPU
//! layers on small shapes (normwise errors against per-precision bounds).

use super::*;

/// One comparison of the self-test: what, the normwise relative error, the tolerance.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub name: String,
    pub error: f64,
    pub tolerance: f64,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }

    /// Whether this row is a stage stopped by an error ([`Check::hard`]).
    pub fn stopped(&self) -> bool {
        self.error.is_infinite() && self.tolerance == 0.0
    }

    /// A stage that ended in a hard error (a CUDA call failed, a layer could not be built):
    /// one failed row that names the stage and keeps the error's words.
    pub fn hard(stage: &str, error: &dyn std::fmt::Display) -> Check {
        Check {
            name: format!("{stage}: stopped by an error: {error}"),
            error: f64::INFINITY,
            tolerance: 0.0,
        }
    }
}

/// ‖a − b‖ / max(‖b‖, tiny): the normwise relative error of GPU `a` against CPU `b`.
pub fn normwise(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut d, mut n) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        d += (*x as f64 - *y as f64).powi(2);
        n += (*y as f64).powi(2);
    }
    if !d.is_finite() {
        return f64::INFINITY;
    }
    d.sqrt() / n.sqrt().max(1e-30)
}

/// Normwise tolerance of a comparison in precision `p` (f32 sums in another order; tf32 and
/// the 16-bit formats round the convolution inputs).
pub fn tolerance(p: Prec) -> f64 {
    match p {
        Prec::F32 => 1e-4,
        Prec::Tf32 => 5e-3,
        Prec::Bf16 => 3e-2,
        _ => 1e-2,
    }
}

pub(super) fn random(n: usize, rng: &mut roofline_models::data::Rng) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// A flat parameter store holding `values` (CPU layout; convolution filters of (depth, k)
/// when `conv`) with zero momenta, for single-layer tests.
pub(super) fn flat_of(
    ctx: &Ctx,
    values: &[&[f32]],
    conv: Option<(usize, usize)>,
) -> Result<Flat, CudaError> {
    let layout: Vec<ParamShape> = values.iter().map(|v| (v.len(), false, conv)).collect();
    let zeros: Vec<Vec<f32>> = values.iter().map(|v| vec![0.0; v.len()]).collect();
    let moms: Vec<&[f32]> = zeros.iter().map(|z| &z[..]).collect();
    Flat::new(ctx, &layout, values, &moms)
}

/// Normwise tolerance of a layer whose operands are stored in 16 bits, against the CPU on the
/// same values with the GPU's rounding points: a sum in another order rounds the odd result
/// to the other neighbour (bf16's 2⁻⁸ apart), so the error is a small fraction of one step.
const STORED_TOLERANCE: f64 = 5e-3;

/// A convolution's output, data gradient and filter gradient.
type ConvResults = (Vec<f32>, Vec<f32>, Vec<f32>);

/// A convolution's results on the CPU.
fn cpu_conv(sh: &ConvShape, x: &[f32], w: &[f32], dy: &[f32]) -> ConvResults {
    let mut y = vec![0.0f32; sh.output_len()];
    roofline_models::conv::forward(x, w, &mut y, sh);
    let mut dx = vec![0.0f32; sh.input_len()];
    roofline_models::conv::backward_data(dy, w, &mut dx, sh);
    let mut dw = vec![0.0f32; sh.weight_len()];
    roofline_models::conv::backward_filter(x, dy, &mut dw, sh);
    (y, dx, dw)
}

/// The same on the GPU (filters in the CPU's layout, activations stored as `store`).
/// The data gradient is added to `acc` (a shortcut's gradient) when given.
fn gpu_conv(
    ctx: &mut Ctx,
    sh: &ConvShape,
    (x, w, dy): (&[f32], &[f32], &[f32]),
    store: Storage,
    acc: Option<&[f32]>,
) -> Result<ConvResults, CudaError> {
    let flat = flat_of(ctx, &[w], Some((sh.depth(), sh.k)))?;
    let mut conv = GConv {
        shape: *sh,
        w: flat.slots[0],
        plans: Vec::new(),
        input: None,
        span: None,
    };
    let xt = Tensor::from_vec(sh.n, sh.h, sh.w, sh.c, x.to_vec());
    let xg = Rc::new(ctx.upload_in(store, &xt)?);
    let yg = conv.forward(ctx, &flat, &xg, true)?;
    let dyt = Tensor::from_vec(sh.n, sh.oh(), sh.ow(), sh.k, dy.to_vec());
    let dyg = ctx.upload_in(store, &dyt)?;
    let dxg = match acc {
        Some(a) => {
            let at = Tensor::from_vec(sh.n, sh.h, sh.w, sh.c, a.to_vec());
            let ag = ctx.upload_in(store, &at)?;
            conv.backward_into(ctx, &flat, &dyg, ag)?
        }
        None => conv
            .backward(ctx, &flat, &dyg, true)?
            .ok_or_else(|| CudaError::Check("no data gradient".into()))?,
    };
    let dw = flat.slots[0].host_layout(&ctx.get::<f32>(flat.grad(flat.slots[0]), sh.weight_len())?);
    Ok((ctx.download(&yg)?.data, ctx.download(&dxg)?.data, dw))
}

/// Compares every GPU layer with the CPU layer on small shapes, in precision `p`: convolution
/// (forward, backward-data, backward-filter) at 1×1, 3×3 stride 2 and 7×7 stride 2; the fully
/// connected layer (forward, weight, bias and data gradients); the detector's box head (outputs,
/// every parameter's gradient, the features' gradient), pyramid kernels (upsample + add, P6, their backward passes) and multi-scale
/// RoIAlign (forward, backward per level, bitwise repeatable); batch norm
/// with ReLU (forward, running statistics, backward); then one whole training step of a small
/// ResNet (max pool, residual adds, average pool, classifier, loss, SGD): the loss, every
/// parameter and every running statistic after the step, and the inference logits.
pub fn self_test(gpu: Gpu, p: Prec) -> Result<Vec<Check>, CudaError> {
    let mut ctx = Ctx::new(gpu, p)?;
    let tol = tolerance(p);
    let mut out = Vec::new();
    let mut rng = roofline_models::data::Rng::new(0x5E1F);
    let push = |out: &mut Vec<Check>, name: String, error: f64, tolerance: f64| {
        out.push(Check {
            name,
            error,
            tolerance,
        })
    };
    for (name, r, stride, pad, c, k, hw) in [
        ("conv 1x1", 1, 1, 0, 16, 24, 9),
        ("conv 3x3/2", 3, 2, 1, 8, 16, 11),
        ("conv 7x7/2", 7, 2, 3, 3, 8, 16),
    ] {
        let sh = ConvShape {
            n: 2,
            c,
            h: hw,
            w: hw,
            k,
            r,
            s: r,
            stride,
            pad,
        };
        let x = random(sh.input_len(), &mut rng);
        let w = random(sh.weight_len(), &mut rng);
        let dy = random(sh.output_len(), &mut rng);
        let (y, dx, dw) = cpu_conv(&sh, &x, &w, &dy);
        // f32 activations (cast around a 16-bit convolution: the detector's).
        let got = gpu_conv(&mut ctx, &sh, (&x, &w, &dy), Storage::F32, None)?;
        for (pass, g, c) in [("forward", &got.0, &y), ("backward-data", &got.1, &dx)] {
            push(&mut out, format!("{name} {pass}"), normwise(g, c), tol);
        }
        push(
            &mut out,
            format!("{name} backward-filter"),
            normwise(&got.2, &dw),
            tol,
        );
        // Activations stored in 16 bits (the ResNet's in f16 and bf16), against the CPU on the
        // same 16-bit values with its results rounded as cuDNN writes them: only the order of
        // the sums differs, and the odd result it rounds the other way.
        let dt = Storage::of(p);
        if dt != Storage::F32 {
            let round = |v: &[f32]| rounded(dt, v);
            let (y, dx, dw) = cpu_conv(&sh, &round(&x), &round(&w), &round(&dy));
            let got = gpu_conv(&mut ctx, &sh, (&x, &w, &dy), dt, None)?;
            for (pass, g, c) in [
                ("forward", &got.0, &y),
                ("backward-data", &got.1, &dx),
                ("backward-filter", &got.2, &dw),
            ] {
                push(
                    &mut out,
                    format!("{name} {pass}, {} storage", dt.name()),
                    normwise(g, &round(c)),
                    STORED_TOLERANCE,
                );
            }
            // A block's conv1: its data gradient added to the shortcut's as cuDNN writes it
            // (one rounding of the f32 sum).
            let s = round(&random(sh.input_len(), &mut rng));
            let got = gpu_conv(&mut ctx, &sh, (&x, &w, &dy), dt, Some(&s))?;
            let sum: Vec<f32> = dx.iter().zip(&s).map(|(a, b)| a + b).collect();
            push(
                &mut out,
                format!(
                    "{name} backward-data added to a shortcut's, {} storage",
                    dt.name()
                ),
                normwise(&got.1, &round(&sum)),
                STORED_TOLERANCE,
            );
        }
    }
    {
        // The fully connected layer (the classifier, and the detector's box head): 12 rows
        // (3 × 2 × 2 cells) of 20 features to 12 outputs, forward and both gradients.
        let (inputs, outputs) = (20, 12);
        let mut lin = roofline_models::layers::Linear::<f32>::new("fc", inputs, outputs, &mut rng);
        let x = Tensor::from_vec(3, 2, 2, inputs, random(12 * inputs, &mut rng));
        let y = lin.forward(&x);
        let dy = Tensor::from_vec(3, 2, 2, outputs, random(12 * outputs, &mut rng));
        let dx = lin.backward(&dy);
        let flat = flat_of(&ctx, &[&lin.weight.value, &lin.bias.value], None)?;
        let g = GLinear {
            w: flat.slots[0],
            b: flat.slots[1],
            inputs,
            outputs,
        };
        let (xg, dyg) = (ctx.upload(&x)?, ctx.upload(&dy)?);
        let yg = g.forward(&mut ctx, &flat, &xg)?;
        g.backward_params(&mut ctx, &flat, &xg, &dyg)?;
        let dxg = g.backward_data(&mut ctx, &flat, &dyg)?;
        let dw = ctx.get::<f32>(flat.grad(g.w), inputs * outputs)?;
        let db = ctx.get::<f32>(flat.grad(g.b), outputs)?;
        for (name, gpu, cpu) in [
            ("linear forward", ctx.download(&yg)?.data, y.data),
            ("linear weight gradient", dw, lin.weight.grad.clone()),
            ("linear bias gradient", db, lin.bias.grad.clone()),
            ("linear data gradient", ctx.download(&dxg)?.data, dx.data),
        ] {
            push(
                &mut out,
                name.into(),
                normwise(&gpu, &cpu),
                tolerance(Prec::F32),
            );
        }
    }
    {
        // The detector's box head: 10 regions of 2 × 2 × 6 pooled features, 16 hidden units,
        // 5 classes; the outputs, every parameter's gradient and the features' gradient.
        let mut head = roofline_models::detect::head::BoxHead::<f32>::new(24, 16, 5, &mut rng);
        // The CPU head takes rows of flattened features; the GPU head flattens RoIAlign's
        // R × 2 × 2 × 6 output itself (the same values in the same order).
        let features = random(10 * 24, &mut rng);
        let x = Tensor::from_vec(10, 2, 2, 6, features.clone());
        let (cls, reg) = head.forward(&Tensor::from_vec(10, 1, 1, 24, features));
        let dcls = Tensor::from_vec(10, 1, 1, 5, random(50, &mut rng));
        let dreg = Tensor::from_vec(10, 1, 1, 20, random(200, &mut rng));
        let dx = head.backward(&dcls, &dreg);
        let values: Vec<Vec<f32>> = head.params().iter().map(|p| p.value.clone()).collect();
        let grads: Vec<(String, Vec<f32>)> = head
            .params()
            .iter()
            .map(|p| (p.name.clone(), p.grad.clone()))
            .collect();
        let refs: Vec<&[f32]> = values.iter().map(|v| &v[..]).collect();
        let flat = flat_of(&ctx, &refs, None)?;
        let mut g = GBoxHead::new(&head, &flat.slots)?;
        let xg = ctx.upload(&x)?;
        let (clsg, regg) = g.forward(&mut ctx, &flat, xg)?;
        let (dclsg, dregg) = (ctx.upload(&dcls)?, ctx.upload(&dreg)?);
        let dxg = g.backward(&mut ctx, &flat, &dclsg, &dregg)?;
        push(
            &mut out,
            "box head class logits".into(),
            normwise(&ctx.download(&clsg)?.data, &cls.data),
            tolerance(Prec::F32),
        );
        push(
            &mut out,
            "box head deltas".into(),
            normwise(&ctx.download(&regg)?.data, &reg.data),
            tolerance(Prec::F32),
        );
        for (slot, (name, grad)) in flat.slots.iter().zip(&grads) {
            let got = ctx.get::<f32>(flat.grad(*slot), grad.len())?;
            push(
                &mut out,
                format!("box head {name} gradient"),
                normwise(&got, grad),
                tolerance(Prec::F32),
            );
        }
        push(
            &mut out,
            "box head features gradient".into(),
            normwise(&ctx.download(&dxg)?.data, &dx.data),
            tolerance(Prec::F32),
        );
    }
    {
        // The pyramid's top-down upsampling (odd sizes too: 7×5 → 13×10) and P6, both ways.
        use roofline_models::detect::fpn::{
            subsample, subsample_backward, upsample, upsample_backward,
        };
        let (n, c) = (2, 6);
        let tensor = |h, w, rng: &mut roofline_models::data::Rng| {
            Tensor::from_vec(n, h, w, c, random(n * h * w * c, rng))
        };
        let (top, lat, dy) = (
            tensor(7, 5, &mut rng),
            tensor(13, 10, &mut rng),
            tensor(13, 10, &mut rng),
        );
        let mut sum = lat.clone();
        roofline_models::layers::add_into(&mut sum, &upsample(&top, 13, 10));
        let dtop = upsample_backward(&dy, 7, 5);
        let p6 = subsample(&sum);
        let d6 = tensor(p6.h, p6.w, &mut rng);
        let mut d5 = dy.clone();
        roofline_models::layers::add_into(&mut d5, &subsample_backward(&d6, (n, 13, 10, c)));
        let (tg, sg, dyg) = (ctx.upload(&top)?, ctx.upload(&lat)?, ctx.upload(&dy)?);
        ctx.upsample_add(&sg, &tg)?;
        let dtg = ctx.upload(&Tensor::zeros(n, 7, 5, c))?;
        ctx.upsample_backward_add(&dtg, &dyg)?;
        let p6g = ctx.subsample2(&sg)?;
        ctx.subsample2_backward_add(&dyg, &ctx.upload(&d6)?)?;
        for (name, gpu, cpu) in [
            ("fpn upsample + add", &sg, &sum),
            ("fpn upsample backward", &dtg, &dtop),
            ("fpn P6 subsample", &p6g, &p6),
            ("fpn P6 backward", &dyg, &d5),
        ] {
            push(
                &mut out,
                name.into(),
                normwise(&ctx.download(gpu)?.data, &cpu.data),
                tolerance(Prec::F32),
            );
        }
    }
    {
        // The detector's multi-scale RoIAlign (f32 in every precision): regions of every size
        // over P2–P5 of two 64×96 images, some past the images' edges.
        let ms = roofline_models::detect::roi_align::MultiScale { out: 7, samples: 2 };
        let (maps, rois) = test_case(2, 64, 96, 8, &mut rng);
        let y = ms.forward(&maps, &rois);
        let dy = Tensor::from_vec(y.n, y.h, y.w, y.c, random(y.data.len(), &mut rng));
        let dx = ms.backward(&dy, &maps, &rois);
        let g: Vec<GTensor> = maps
            .iter()
            .map(|m| ctx.upload(m))
            .collect::<Result<_, _>>()?;
        let gm = [&g[0], &g[1], &g[2], &g[3]];
        let plan = ctx.roi_plan(RoiPlan::new(&ms, &rois, 2), gm)?;
        let yg = ctx.roi_align_forward(gm, &plan)?;
        push(
            &mut out,
            "roi_align forward (P2-P5)".into(),
            normwise(&ctx.download(&yg)?.data, &y.data),
            tolerance(Prec::F32),
        );
        let dyg = ctx.upload(&dy)?;
        let dxg = ctx.roi_align_backward(&dyg, &plan)?;
        for (l, (gpu, cpu)) in dxg.iter().zip(&dx).enumerate() {
            push(
                &mut out,
                format!("roi_align backward P{}", l + 2),
                normwise(&ctx.download(gpu)?.data, &cpu.data),
                tolerance(Prec::F32),
            );
        }
        // The gather is deterministic: a second run gives the same bits.
        let again = ctx.roi_align_backward(&dyg, &plan)?;
        let same = dxg
            .iter()
            .zip(&again)
            .map(|(a, b)| Ok(ctx.download(a)?.data == ctx.download(b)?.data))
            .collect::<Result<Vec<bool>, CudaError>>()?
            .iter()
            .all(|s| *s);
        push(
            &mut out,
            "roi_align backward run twice, same bits".into(),
            if same { 0.0 } else { f64::INFINITY },
            0.0,
        );
    }
    {
        let (n, hw, c) = (4, 5, 40);
        let mut bn = BatchNorm::<f32>::new("bn", c, 1.0);
        bn.gamma.value = random(c, &mut rng);
        bn.beta.value = random(c, &mut rng);
        let x = Tensor::from_vec(n, hw, hw, c, random(n * hw * hw * c, &mut rng));
        let dy = Tensor::from_vec(n, hw, hw, c, random(n * hw * hw * c, &mut rng));
        let flat = flat_of(&ctx, &[&bn.gamma.value, &bn.beta.value], None)?;
        let mut g = GBn::new(&bn, flat.slots[0], flat.slots[1], None);
        let xg = ctx.upload(&x)?;
        let y = bn.forward_act(x, true, true);
        let dx = bn.backward_act(&dy, Some(&y));
        let yg = g.forward(&mut ctx, &flat, xg, true, true)?;
        let dyg = ctx.upload(&dy)?;
        let dxg = g.backward(&mut ctx, &flat, &dyg, Some(&yg))?;
        push(
            &mut out,
            "batch norm + ReLU forward".into(),
            normwise(&ctx.download(&yg)?.data, &y.data),
            1e-5,
        );
        push(
            &mut out,
            "batch norm running statistics".into(),
            {
                let (mean, var) = g.running(&ctx)?;
                normwise(
                    &[&mean[..], &var[..]].concat(),
                    &[&bn.running_mean[..], &bn.running_var[..]].concat(),
                )
            },
            1e-5,
        );
        push(
            &mut out,
            "batch norm + ReLU backward".into(),
            normwise(&ctx.download(&dxg)?.data, &dx.data),
            1e-4,
        );
        let grads: Vec<f32> = ctx.get(flat.grads.ptr, 2 * c)?;
        push(
            &mut out,
            "batch norm gamma/beta gradients".into(),
            normwise(&grads, &[&bn.gamma.grad[..], &bn.beta.grad[..]].concat()),
            1e-4,
        );
    }
    let dt = Storage::of(p);
    if dt != Storage::F32 {
        // A block's end on 16-bit activations (f16 and bf16 training): batch norm, the
        // residual and ReLU in one pass, then batch norm's backward pass under the ReLU's mask,
        // against the CPU on the same 16-bit values with the results rounded where the GPU
        // stores them.
        let (n, hw, c) = (4, 6, 40);
        let len = n * hw * hw * c;
        let round = |v: &[f32]| rounded(dt, v);
        let mut bn = BatchNorm::<f32>::new("bn", c, 1.0);
        bn.gamma.value = random(c, &mut rng);
        bn.beta.value = random(c, &mut rng);
        let tensor = |v: Vec<f32>| Tensor::from_vec(n, hw, hw, c, v);
        let x = tensor(round(&random(len, &mut rng)));
        let s = tensor(round(&random(len, &mut rng)));
        let dy = tensor(round(&random(len, &mut rng)));
        let flat = flat_of(&ctx, &[&bn.gamma.value, &bn.beta.value], None)?;
        let mut g = GBn::new(&bn, flat.slots[0], flat.slots[1], None);
        let (xg, sg, dyg) = (
            ctx.upload_in(dt, &x)?,
            ctx.upload_in(dt, &s)?,
            ctx.upload_in(dt, &dy)?,
        );
        let mut y = bn.forward_act(x, true, false);
        roofline_models::layers::add_relu(&mut y, &s);
        y.data = round(&y.data);
        let mut masked = dy.clone();
        roofline_models::layers::relu_backward(&y, &mut masked);
        let dx = round(&bn.backward_act(&masked, None).data);
        let yg = g.forward_add_relu(&mut ctx, &flat, xg, true, &sg)?;
        // The block's end backward: masked by the output as it is read, the gradient left
        // masked in place for the shortcut.
        let dxg = g.backward_end(&mut ctx, &flat, &dyg, &yg)?;
        let name = dt.name();
        push(
            &mut out,
            format!("batch norm + add + ReLU forward, {name} storage"),
            normwise(&ctx.download(&yg)?.data, &y.data),
            STORED_TOLERANCE,
        );
        push(
            &mut out,
            format!("batch norm backward (ReLU-masked), {name} storage"),
            normwise(&ctx.download(&dxg)?.data, &dx),
            STORED_TOLERANCE,
        );
        // The share of elements that differ: exact but for one whose forward value lay so
        // near zero that the GPU's multiply-add put it on the other side.
        let left = ctx.download(&dyg)?.data;
        let differ = left
            .iter()
            .zip(&masked.data)
            .filter(|(a, b)| a != b)
            .count();
        push(
            &mut out,
            format!("the ReLU's mask left in the gradient, {name} storage"),
            differ as f64 / len as f64,
            1.0 / len as f64,
        );
        let grads: Vec<f32> = ctx.get(flat.grads.ptr, 2 * c)?;
        push(
            &mut out,
            format!("batch norm gamma/beta gradients, {name} storage"),
            normwise(&grads, &[&bn.gamma.grad[..], &bn.beta.grad[..]].concat()),
            STORED_TOLERANCE,
        );
    }
    // A whole step of a small ResNet on both devices (`check_step.rs`).
    out.extend(step_checks(ctx, p)?);
    Ok(out)
}
