//! A training run as HPC AI500's score counts it: the run's record (time-to-quality, FLOPS,
//! VFLOPS, energy, AIPerf's regulated score, V3.0's FLOPS per epoch), the configuration the report
//! lists, and why a run is not comparable with published scores.

use super::setup::{Kind, Prepared, Resolution, Spec};
use crate::bagging::Plan;
use crate::resnet::Version;
use crate::run::Depth;
use crate::train::Summary;
use roofline_model::placement::Energy;
use roofline_model::score::{aiperf_regulated, vflops, Run, Target};
use serde_json::json;

/// FLOP/s of every step of `s` (AIPerf's series), `batch` images a step.
pub fn flops_series(s: &Summary, batch: usize) -> Vec<f64> {
    s.timing
        .iter()
        .map(|t| s.flops_step_per_image * batch as f64 / t.seconds.max(1e-12))
        .collect()
}

/// Run `i` (seed `seed`) that ended with `s`, scored against `target`; `v3_per_image` is V3.0's
/// analytic training FLOPs per image, `energy` the run's.
pub fn record(
    i: usize,
    seed: u64,
    s: &Summary,
    batch: usize,
    target: &Target,
    v3_per_image: f64,
    energy: &Energy,
) -> Run {
    let quality = s
        .evals
        .last()
        .map(|e| e.map.unwrap_or(e.top1))
        .unwrap_or(0.0);
    let top5 = s.evals.last().filter(|e| e.map.is_none()).map(|e| e.top5);
    let reached = s.time_to_quality.is_some();
    let ttq = s.time_to_quality.unwrap_or(s.elapsed_seconds);
    let flops = s.flops_step_per_image * s.images as f64 / s.train_seconds.max(1e-12);
    let v = vflops(flops, quality, target.value, target.exponent);
    let series = flops_series(s, batch);
    let (energy_j, watts) = (energy.joules_per_step, energy.average_watts);
    Run {
        run: i + 1,
        seed,
        time_to_quality_s: ttq,
        reached_target: reached,
        quality,
        top5,
        steps: s.steps,
        images: s.images,
        train_seconds: s.train_seconds,
        flops,
        vflops: v,
        energy_j,
        average_watts: watts,
        vflops_per_watt: watts.map(|w| v / w),
        flops_per_watt: watts.map(|w| flops / w),
        flops_series_max: series.iter().copied().fold(0.0, f64::max),
        flops_series: series,
        aiperf_regulated: aiperf_regulated(flops, quality),
        v3_flops_per_epoch: v3_per_image * s.images as f64 / s.train_seconds.max(1e-12),
        bagging: None,
    }
}

/// Why run `a` cannot be compared with published scores (empty: it can).
pub fn not_comparable(a: &Spec, custom_target: bool) -> Vec<String> {
    let mut v = Vec::new();
    let ewa = a.workload == Kind::Ewa;
    if custom_target {
        v.push(if ewa {
            format!(
                "its own target quality (--target-map {})",
                a.target_map.unwrap_or(0.0)
            )
        } else {
            format!(
                "its own target quality (--target-top1 {})",
                a.target_top1.unwrap_or(0.0)
            )
        });
    }
    if a.data.is_none() {
        v.push(if ewa {
            "synthetic fields, not the Extreme Weather data".into()
        } else {
            "synthetic data, not ImageNet".into()
        });
    }
    let (rule, epochs) = if ewa {
        (Resolution { h: 768, w: 1152 }, 50)
    } else {
        (Resolution { h: 224, w: 224 }, 90)
    };
    if let Some(r) = a.resolution.filter(|r| *r != rule) {
        v.push(format!("resolution {r} (the rules: {rule})"));
    }
    if a.width != 1.0 || a.depth != Depth([3, 4, 6, 3]) || a.version != Version::V1_5 {
        v.push(format!(
            "a scaled model (ResNet-50 v{}, width {}, depth {})",
            a.version, a.width, a.depth
        ));
    }
    if !ewa && a.classes != 1000 {
        v.push(format!("{} classes", a.classes));
    }
    if !matches!(a.epochs, Some(e) if e >= epochs) {
        v.push(match a.epochs {
            Some(e) => format!("{e} epochs (the rules: {epochs})"),
            None => format!("a run counted in steps, not the rules' {epochs} epochs"),
        });
    }
    v
}

/// The configuration a score's report lists for run `p` (of a model of `parameters`) against
/// `target` (on GPU `gpu`, over `ranks` ranks, bagged by `plan`).
pub fn configuration(
    p: &Prepared,
    parameters: Option<usize>,
    target: &Target,
    gpu: Option<&str>,
    ranks: usize,
    plan: Option<&Plan>,
) -> serde_json::Map<String, serde_json::Value> {
    let comm = p.run().comm;
    let mut entries = vec![
        ("model", json!(p.model_name())),
        ("parameters", json!(parameters)),
        ("data", json!(p.data_name())),
    ];
    entries.extend(p.workload().describe());
    entries.extend([
        ("resolution", json!(p.resolution.to_string())),
        ("global batch", json!(p.batch())),
        ("steps", json!(p.steps())),
        ("epochs", json!(p.spec.epochs)),
        (
            "optimizer",
            json!("SGD, momentum 0.9, weight decay 1e-4 (not on batch norm or biases)"),
        ),
        ("evaluate every (steps)", json!(p.run().eval_every)),
        (
            "target",
            json!(format!(
                "{} {} (VFLOPS exponent {})",
                target.metric, target.value, target.exponent
            )),
        ),
        (
            "device",
            json!(match gpu {
                Some(g) => format!("cuda: {g}, {}", p.spec.precision),
                None => format!("cpu, {} threads", p.threads),
            }),
        ),
        ("ranks", json!(ranks)),
        (
            "gradient exchange",
            json!(format!(
                "fused buckets of {} elements, compression {}, {}",
                comm.bucket,
                comm.wire.name(),
                if comm.overlap {
                    "overlapped with the backward pass"
                } else {
                    "after the backward pass"
                }
            )),
        ),
        ("first seed", json!(p.spec.seed)),
    ]);
    if let Some(b) = plan {
        entries.push((
            "bagging (HPC AI500 V3.0)",
            json!(format!(
                "{} models × {} ranks each (Sys_scale {}), each on a bootstrap sample of the {} training images with its own seed; {}",
                b.models,
                b.ranks_per_model,
                b.sys_scale(),
                p.workload().train_images(),
                if ranks > 1 {
                    "each model data parallel over its team of ranks, no synchronisation between teams"
                } else {
                    "side by side in one process on shares of its cores"
                }
            )),
        ));
    }
    entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}
