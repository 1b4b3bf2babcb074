//! A finished run in JSON (`train --json`): what was trained, how fast, how well, by the
//! accounting's rules.

use super::prepare::{Job, Prepared};
use crate::accounting;
use crate::detect::model::DetectorConfig;
use crate::train::Summary;
use serde_json::{json, Value};

/// The paper's detector: about 41 M parameters, 691 GFLOPs per image (HPC AI500 V2.0).
pub const EWA_PAPER_PARAMETERS: u64 = 41_000_000;
pub const EWA_PAPER_FLOPS: f64 = 691e9;

/// `train --json`'s object for run `p` that ended as `t` says.
pub fn json(p: &Prepared, t: &super::Trained) -> Value {
    let (s, gpu) = (&t.summary, t.gpu.as_deref());
    let res = p.resolution;
    let spec = &p.spec;
    let mut v = match &p.job {
        Job::Classifier(_) | Job::Graph { .. } => {
            let counted = p.layers();
            let aiperf = accounting::aiperf(&counted);
            let v3 = accounting::hpc_ai500_v3(&counted);
            let last = s.evals.last();
            json!({
                "workload": spec.workload.name(),
                "model": p.model_name(),
                "parameters": s.parameters,
                "batch": p.batch(),
                "resolution": res.h,
                "threads": p.threads,
                "device": spec.device.name(),
                "gpu": gpu,
                "precision": spec.precision.name(),
                "aiperf_ops_per_image": {"forward": aiperf.forward, "backward": aiperf.backward, "total": aiperf.total()},
                "hpc_ai500_v3_flops_per_image": {"forward": v3.forward, "training": v3.total()},
                "min_forward_bytes_per_image": accounting::min_bytes_forward(&counted),
                "top1": last.map(|e| e.top1),
                "top5": last.map(|e| e.top5),
                "evaluations": s.evals.iter().map(|e| json!({"step": e.step, "top1": e.top1, "top5": e.top5, "loss": e.loss})).collect::<Vec<_>>(),
            })
        }
        Job::Detector(cfg) => {
            let parts = crate::accounting::detector_flops(&cfg.model, res.h, res.w);
            json!({
                "workload": spec.workload.name(),
                "model": p.model_name(),
                "parameters": s.parameters,
                "paper_parameters": EWA_PAPER_PARAMETERS,
                "batch": p.batch(),
                "resolution": [res.h, res.w],
                "data": p.data_name(),
                "threads": p.threads,
                "device": spec.device.name(),
                "gpu": gpu,
                "precision": spec.precision.name(),
                "flops_step_per_image_at_768x1152": ewa_full_size_flops(cfg.model.scales),
                "anchors_per_cell": cfg.model.anchors_per_cell(),
                "paper_flops_per_image": EWA_PAPER_FLOPS,
                "flops_per_image_by_part": parts.parts().iter().map(|(n, f)| (n.to_string(), json!({"forward": f.forward, "backward": f.backward}))).collect::<serde_json::Map<_, _>>(),
                "map50": s.evals.last().and_then(|e| e.map),
                "evaluations": s.evals.iter().map(|e| json!({"step": e.step, "map50": e.map})).collect::<Vec<_>>(),
            })
        }
    };
    if let (Some(o), Value::Object(r)) = (v.as_object_mut(), run(s)) {
        o.extend(r);
    }
    if let Some(o) = v.as_object_mut() {
        let e = &t.energy;
        o.insert(
            "energy".into(),
            json!({
                "measured": e.measured,
                "joules_per_image": t.joules_per_image,
                "average_watts": e.average_watts,
                "sources": e.sources,
                "note": e.note,
            }),
        );
    }
    v
}

/// The paper's detector at the data's full size (768×1152), with `scales` anchor sizes a
/// level (3: the paper's nine anchors a cell): training FLOPs per image.
pub fn ewa_full_size_flops(scales: usize) -> f64 {
    let cfg = DetectorConfig {
        scales,
        ..DetectorConfig::ewa()
    };
    crate::accounting::detector_flops(&cfg, 768, 1152)
        .total()
        .training()
}

/// What every run reports: steps, images, throughput, FLOPs, loss, the gradient exchange,
/// time-to-quality.
fn run(s: &Summary) -> Value {
    json!({
        "steps": s.steps,
        "images": s.images,
        "train_seconds": s.train_seconds,
        "images_per_second": s.images_per_second,
        "steady_images_per_second": s.steady_images_per_second,
        "steady_steps": {
            "after_step": s.steady.after_step,
            "steps": s.steady.steps,
            "kind": s.steady.kind.name(),
        },
        "achieved_flops": s.achieved_flops,
        "flops_forward_per_image": s.flops_forward_per_image,
        "flops_step_per_image": s.flops_step_per_image,
        "final_loss": s.final_loss,
        "ranks": s.ranks,
        "comm_bytes_per_step": s.comm_bytes_per_step,
        "grad_compression": s.comm.wire.name(),
        "overlap": s.comm.overlap,
        "bucket_elements": s.comm.bucket,
        "comm_wait_seconds": s.comm_wait_seconds,
        "host_syncs_per_step": s.host_syncs_per_step,
        "device_allocations_per_step": s.device_allocations_per_step,
        "cuda_graph": s.cuda_graph.as_ref().map(|g| json!({
            "mode": g.mode.name(),
            "used": g.used,
            "eager_step_seconds": g.eager_step_s,
            "graph_step_seconds": g.graph_step_s,
            "graph_steps": g.graph_steps,
            "why": g.why,
        })),
        "conv_search": s.conv_search.as_ref().map(|c| json!({
            "budget_seconds": c.budget_s,
            "searches": c.searches,
            "seconds": c.seconds,
            "plans_without_search": c.known_plans,
        })),
        "param_norm": s.param_norm,
        "time_to_quality_seconds": s.time_to_quality,
    })
}
