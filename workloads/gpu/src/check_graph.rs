//! `--check`'s CUDA graph: the training step launched as a graph against the same steps
//! enqueued call by call. Two copies of the small step's model, on fresh contexts with the same
//! convolution algorithms, take the same steps over batches, labels and learning rates that
//! change at every step, so that a graph replaying the batch, the labels or the scalars it was
//! captured with would train on stale ones and drift at once; the second runs with
//! `--cuda-graph on`. The graph must have run, and the two runs must agree: every step's loss,
//! every parameter's change, the running statistics.

use super::*;

/// Steps of each run: warm-up (two or three), the trial's eager steps, the capture, and
/// launches of the graph.
const STEPS: usize = 4 + 2 * TRIAL_STEPS;

/// One run of the graph check: its losses, its parameters' changes, its running statistics,
/// what it did with graphs, and the convolution algorithms it used.
struct Run {
    losses: Vec<f64>,
    updates: Vec<f32>,
    stats: Vec<f32>,
    graph: GraphReport,
    choices: Vec<((ConvShape, Prec), PlanChoice)>,
}

fn run(
    ordinal: usize,
    p: Prec,
    mode: GraphMode,
    choices: &[((ConvShape, Prec), PlanChoice)],
) -> Result<Run, CudaError> {
    let (cfg, x, labels, lr, smoothing) = super::check_step::setup();
    let mut rng = roofline_models::data::Rng::new(0x6A4F);
    let x2 = Tensor::from_vec(x.n, x.h, x.w, x.c, random(x.data.len(), &mut rng));
    let classes = cfg.classes;
    let mut ctx = Ctx::new(Gpu::open(ordinal)?, p)?;
    ctx.graph = mode;
    ctx.choices = choices.to_vec();
    let mut m = ResNet::<f32>::new(cfg, 11);
    let init: Vec<f32> = m.params().iter().flat_map(|p| p.value.clone()).collect();
    let mut net = GpuResNet::new(ctx, &mut m, None, None, CommOptions::default())?;
    let sgd = roofline_models::train::Sgd::default();
    let mut losses = Vec::new();
    for i in 0..STEPS {
        let xi = if i % 2 == 0 { &x } else { &x2 };
        let li: Vec<usize> = labels.iter().map(|&l| (l + i) % classes).collect();
        let r = net.step(xi, &li, lr * (1.0 + 0.1 * i as f64), smoothing, &sgd)?;
        losses.push(r.loss);
    }
    let graph = net.cuda_graph();
    net.store(&mut m)?;
    let updates = m
        .params()
        .iter()
        .flat_map(|p| p.value.clone())
        .zip(&init)
        .map(|(a, b)| a - b)
        .collect();
    let stats = super::check_step::running_stats(&mut m);
    let choices = net.ctx.choices.clone();
    Ok(Run {
        losses,
        updates,
        stats,
        graph,
        choices,
    })
}

/// The graph's comparisons in precision `p` on GPU `ordinal`.
pub(super) fn graph_checks(ordinal: usize, p: Prec) -> Result<Vec<Check>, CudaError> {
    let eager = run(ordinal, p, GraphMode::Off, &[])?;
    let graph = run(ordinal, p, GraphMode::On, &eager.choices)?;
    let tol = tolerance(p);
    let loss = eager
        .losses
        .iter()
        .zip(&graph.losses)
        .map(|(e, g)| ((g - e) / e.abs().max(1e-30)).abs())
        .fold(0.0f64, f64::max);
    let launched = graph.graph.graph_steps;
    Ok(vec![
        Check {
            name: format!(
                "CUDA graph: steps launched as the graph ({launched} of {STEPS}; {})",
                graph.graph.why
            ),
            error: if launched > TRIAL_STEPS { 0.0 } else { 1.0 },
            tolerance: 0.0,
        },
        Check {
            name: format!("CUDA graph: every step's loss against the steps enqueued call by call ({STEPS} steps, new batch, labels and learning rate each)"),
            error: loss,
            tolerance: tol,
        },
        Check {
            name: "CUDA graph: parameter changes over the run".into(),
            error: normwise(&graph.updates, &eager.updates),
            tolerance: tol,
        },
        Check {
            name: "CUDA graph: running statistics".into(),
            error: normwise(&graph.stats, &eager.stats),
            tolerance: tol,
        },
    ])
}
