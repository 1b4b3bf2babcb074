//! `--check`'s described networks: [`GpuGraph`] stepped once against the CPU's
//! [`roofline_models::graph::Graph`] from the same start, on the whole-step check's small ResNet described
//! node by node, on its child by each morphism AutoML makes (deeper, wider, skip) and on the
//! child of all three in turn (every op a description has: convolutions of 1, 3 and 7 taps,
//! batch norm with and without ReLU, ReLU, max pool, additions, average pool, dense).
//!
//! In f32 the GPU step is held to the f32 whole step's fixed bounds. In tf32, f16 and bf16 it
//! runs too, against the same f32 CPU step: the loss, the running statistics and the inference
//! logits within the precision's layer tolerance, and the updates of all parameters together
//! within [`COARSE`]: such a step is chaotic at this size (the ResNet's check calibrates its
//! bounds on a reference with the GPU's rounding points; the graph runs the same layers), so
//! this row catches what is wrong by far (a gradient lost, cast twice or left scaled), not
//! rounding. Last, the all-three child's f32 step with its gradients through NCCL (one rank,
//! small buckets, f16 on the wire): its updates within the f32 bounds or f16's rounding, so
//! that a bucket sent before its gradients were final shows.

use super::check_step::{values, Outcome, Tolerances};
use super::*;
use roofline_models::checkpoint::Checkpoint;
use roofline_models::graph::morph::{applicable, apply, Morphism, Weights};
use roofline_models::graph::{Description, Graph};
use roofline_models::train::{Labels, Model};

/// The normwise bound on all of a tf32 or 16-bit step's parameter updates together, against
/// f32's.
pub const COARSE: f64 = 0.25;

/// The networks of the check: a name, a description and the weights it starts from (None: its
/// seed's), or why one morphism found no place in the network.
pub(super) fn networks() -> Result<Vec<(String, Description, Option<Checkpoint>)>, String> {
    let (cfg, x, ..) = super::check_step::setup();
    let side = (x.h, x.w);
    let base = Description::resnet(&cfg, x.c);
    let mut g = Graph::<f32>::new(base.clone(), side.0, side.1, SEED).map_err(|e| e.to_string())?;
    let start =
        Weights::from_checkpoint(&g.snapshot(), base.nodes.len()).map_err(|e| e.to_string())?;
    let mut out = vec![("described ResNet".to_string(), base.clone(), None)];
    let kinds: [Kind; 3] = [
        ("deeper", |m| matches!(m, Morphism::Deeper { .. })),
        ("wider", |m| matches!(m, Morphism::Wider { .. })),
        ("skip", |m| matches!(m, Morphism::Skip { .. })),
    ];
    let (mut all, mut all_w) = (base.clone(), start.clone());
    for (name, is) in kinds {
        let pick = |d: &Description| {
            applicable(d, side.0, side.1, 3)
                .into_iter()
                .find(&is)
                .ok_or_else(|| format!("no {name} morphism applies to the check's network"))
        };
        let m = pick(&base)?;
        let (d, w) = apply(&base, &start, m, side, SEED).map_err(|e| e.to_string())?;
        out.push((format!("{name} ({m})"), d, Some(w.to_checkpoint())));
        let m = pick(&all)?;
        (all, all_w) = apply(&all, &all_w, m, side, SEED).map_err(|e| e.to_string())?;
    }
    out.push((
        "deeper, wider and skip".to_string(),
        all,
        Some(all_w.to_checkpoint()),
    ));
    Ok(out)
}

/// A morphism's kind: its name, and whether a morphism is of it.
type Kind = (&'static str, fn(&Morphism) -> bool);

/// The graphs' seed.
const SEED: u64 = 11;

/// A graph of `d` from `init` (or the seed's weights).
fn built(
    d: &Description,
    init: Option<&Checkpoint>,
    side: (usize, usize),
) -> Result<Graph<f32>, String> {
    let mut g = Graph::<f32>::new(d.clone(), side.0, side.1, SEED).map_err(|e| e.to_string())?;
    if let Some(c) = init {
        g.load(c).map_err(|e| e.to_string())?;
    }
    Ok(g)
}

/// The CPU graph's own f32 step of the setup's batch.
pub(super) fn cpu_outcome(d: &Description, init: Option<&Checkpoint>) -> Result<Outcome, String> {
    let (_, x, labels, lr, smoothing) = super::check_step::setup();
    let mut g = built(d, init, (x.h, x.w))?;
    let start = values(&mut g);
    let truth = Labels {
        classes: labels.to_vec(),
        smoothing,
    };
    let loss = g.train_step(&x, &truth, 0, &mut |_| {});
    roofline_models::train::Sgd::default().step(Model::params(&mut g), lr);
    let logits = g.forward(&x, false).data;
    Ok(Outcome::of(&mut g, &start, loss, logits))
}

/// The GPU graph's step of the same on `ctx`, its gradients through `nccl` as `comm` says
/// when given.
fn gpu_outcome(
    ctx: Ctx,
    d: &Description,
    init: Option<&Checkpoint>,
    (nccl, comm): (Option<Communicator>, CommOptions),
) -> Result<(Outcome, bool, Ctx), CudaError> {
    let (_, x, labels, lr, smoothing) = super::check_step::setup();
    let mut g = built(d, init, (x.h, x.w)).map_err(CudaError::Check)?;
    let start = values(&mut g);
    let mut net = GpuGraph::new(ctx, &mut g, nccl, None, comm)?;
    let r = net.step(
        &x,
        &labels,
        lr,
        smoothing,
        &roofline_models::train::Sgd::default(),
    )?;
    let logits = net.logits(&x)?.data;
    net.store(&mut g)?;
    let ctx = net.into_parts().0;
    Ok((Outcome::of(&mut g, &start, r.loss, logits), r.applied, ctx))
}

/// Every described network's step on GPU `ordinal` in f32 and, when `p` is another precision
/// (tf32 or a 16-bit format), in `p` too, against the CPU graph's.
pub fn described_checks(ordinal: usize, p: Prec) -> Result<Vec<Check>, CudaError> {
    let nets = match networks() {
        Ok(n) => n,
        Err(why) => {
            return Ok(vec![Check {
                name: format!("described networks: {why}"),
                error: f64::INFINITY,
                tolerance: 0.0,
            }])
        }
    };
    let mut out = Vec::new();
    let mut precisions = vec![Prec::F32];
    if p != Prec::F32 {
        precisions.push(p);
    }
    let wants = nets
        .iter()
        .map(|(_, d, init)| cpu_outcome(d, init.as_ref()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(CudaError::Check)?;
    // One context a precision, handed from network to network (kernels compiled once).
    for &q in &precisions {
        let mut ctx = Ctx::new(Gpu::open(ordinal)?, q)?;
        for ((name, d, init), want) in nets.iter().zip(&wants) {
            let (got, applied, back) =
                gpu_outcome(ctx, d, init.as_ref(), (None, CommOptions::default()))?;
            ctx = back;
            let prefix = format!("described network, {name}, {}: ", q.name());
            if q == Prec::F32 {
                out.extend(Tolerances::fixed(want.updates.len()).checks(&prefix, &got, want));
            } else {
                out.extend(coarse_checks(&prefix, q, &got, want));
            }
            out.push(Check {
                name: format!("{prefix}step applied"),
                error: if applied { 0.0 } else { 1.0 },
                tolerance: 0.0,
            });
        }
    }
    // The exchange told, node by node, which gradients are final: through NCCL (one rank) in
    // small buckets with f16 on the wire, a bucket sent before its gradients were final would
    // carry stale values into the update.
    if let (Some((name, d, init)), Ok(())) =
        (nets.last(), roofline_kernels::comm::nccl::available())
    {
        let id = roofline_kernels::comm::nccl::unique_id()?;
        let nccl = Communicator::new(&id, 1, 0, ordinal)?;
        let ctx = Ctx::new(Gpu::open(ordinal)?, Prec::F32)?;
        let comm = CommOptions {
            wire: Wire::F16,
            overlap: true,
            bucket: 5_000,
        };
        let want = wants
            .last()
            .ok_or_else(|| CudaError::Check("no network".into()))?;
        let (got, applied, _) = gpu_outcome(ctx, d, init.as_ref(), (Some(nccl), comm))?;
        let prefix = format!("described network, {name}, through NCCL, gradients in f16: ");
        let mut rows: Vec<Check> = Tolerances::fixed(want.updates.len())
            .at_least(5e-3)
            .checks(&prefix, &got, want)
            .into_iter()
            .filter(|c| c.name.contains("parameter updates"))
            .collect();
        if !applied {
            rows.iter_mut().for_each(|c| c.error = f64::INFINITY);
        }
        out.extend(rows);
    }
    Ok(out)
}

/// A 16-bit step against the f32 one: the loss, running statistics and logits within the
/// precision's tolerance, all the updates together within [`COARSE`].
pub(super) fn coarse_checks(prefix: &str, p: Prec, got: &Outcome, want: &Outcome) -> Vec<Check> {
    let tol = tolerance(p);
    let all = |o: &Outcome| -> Vec<f32> { o.updates.iter().flat_map(|(_, u)| u.clone()).collect() };
    let row = |what: &str, error: f64, tolerance: f64| Check {
        name: format!("{prefix}{what}"),
        error,
        tolerance,
    };
    vec![
        row(
            "network loss",
            ((got.loss - want.loss) / want.loss.abs().max(1e-30)).abs(),
            tol,
        ),
        row(
            "network parameter updates of one step, all together (coarse)",
            normwise(&all(got), &all(want)),
            COARSE,
        ),
        row(
            "network running statistics",
            normwise(&got.stats, &want.stats),
            tol,
        ),
        row(
            "network inference logits",
            normwise(&got.logits, &want.logits),
            tol,
        ),
    ]
}
