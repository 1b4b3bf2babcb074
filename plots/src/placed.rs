//! Placed workloads as points of a roofline: each workload's point and its top layers, one
//! colour per workload.

use crate::{classic_svg, ClassicOptions, PlotError, PlotPoint};
use roofline_model::placement::{Placement, Point};
use roofline_model::{Level, Machine, MemOp, On, RoofId, Threads};

/// The points of `p` (the workload, then its layers) at the intensity `x` gives each (`None`:
/// not placed; a workload without one places nothing).
pub fn points(p: &Placement, x: impl Fn(&Point) -> Option<f64>) -> Vec<PlotPoint> {
    let Some(main) = x(&p.point) else {
        return Vec::new();
    };
    let group = &p.workload.name;
    let point = |pt: &Point, intensity: f64, main: bool| PlotPoint {
        label: pt.label.clone(),
        group: group.clone(),
        intensity,
        achieved: pt.achieved_flops,
        attainable: pt.bound.attainable,
        main,
        share: pt.share_of_step,
        binding: Some(pt.bound.ceiling.clone()),
    };
    std::iter::once(point(&p.point, main, true))
        .chain(
            p.layers
                .iter()
                .filter_map(|l| x(l).map(|i| point(l, i, false))),
        )
        .collect()
}

/// The classic roofline (triad roofs; one thread's when every run had one, else all cores') with
/// every placement's point and layers at their analytic OI: on the GPU's roofline when they all
/// ran on one GPU, else the CPU's.
pub fn placements_svg(m: &Machine, placements: &[&Placement]) -> Result<String, PlotError> {
    let points = placements
        .iter()
        .flat_map(|p| points(p, |pt| Some(pt.oi.analytic)))
        .collect();
    let threads = if placements.iter().all(|p| p.workload.threads <= 1) {
        Threads::T1
    } else {
        Threads::All
    };
    let device = match placements.first().map(|p| p.workload.device.as_str()) {
        Some(d) if d.starts_with("gpu") && placements.iter().all(|p| p.workload.device == d) => {
            d.to_string()
        }
        _ => "cpu".to_string(),
    };
    classic_svg(
        m,
        &ClassicOptions {
            threads,
            device,
            points,
            ..Default::default()
        },
    )
}

/// The hierarchical roofline's points of `p`: one per memory level of `m`'s roofline (`t`'s
/// triad roofs), at the intensity of the traffic that level serves. Without hardware counters
/// that traffic comes from a capacity model: a layer (the workload's top layers, or the
/// workload itself when it has none) whose footprint fits in the level inside L is served
/// there and moves nothing at L; one that does not moves its analytic minimum bytes at L. So
/// every level's intensity is an upper bound (real traffic is at least the minimum), rising
/// outwards; a level that serves nothing has no point. Each point's bound is the lower of
/// the level's roof at its intensity and the highest compute roof.
pub fn hierarchical_points(p: &Placement, m: &Machine, t: Threads) -> Vec<PlotPoint> {
    let items: Vec<&Point> = if p.layers.is_empty() {
        vec![&p.point]
    } else {
        p.layers.iter().collect()
    };
    let flops: f64 = items.iter().map(|l| l.flops_per_step).sum();
    let seconds: f64 = items
        .iter()
        .filter(|l| l.achieved_flops > 0.0)
        .map(|l| l.flops_per_step / l.achieved_flops)
        .sum();
    if flops <= 0.0 || seconds <= 0.0 {
        return Vec::new();
    }
    let achieved = flops / seconds;
    let compute = m
        .ceilings
        .iter()
        .filter(|c| {
            matches!(c.id.roof(), Some(RoofId::Compute { on: On::Cpu(x), .. }) if x == t)
                && c.unit == "FLOP/s"
        })
        .map(|c| c.value)
        .fold(0.0, f64::max);
    // Capacity of cache level n for this configuration (every instance when all cores run).
    let capacity = |n: u32| -> f64 {
        m.provenance
            .cpu
            .caches
            .iter()
            .filter(|c| c.level == n && c.cache_type != "Instruction")
            .map(|c| {
                c.size_bytes as f64
                    * if t == Threads::T1 {
                        1.0
                    } else {
                        c.instances.max(1) as f64
                    }
            })
            .fold(0.0, f64::max)
    };
    let mut out = Vec::new();
    for c in m.ceilings.iter().filter(|c| {
        matches!(
            c.id.roof(),
            Some(RoofId::Memory { on: On::Cpu(x), op: MemOp::Triad, .. }) if x == t
        )
    }) {
        let Some(level) = c.memory_level() else {
            continue;
        };
        // The level inside this one: L(n-1) for Ln, the last cache for DRAM; none for L1.
        let n = (1..=4).find(|&n| Level::cache(n) == Some(level));
        let inner = match n {
            Some(n) => n.saturating_sub(1),
            None => (1..=4).rev().find(|&n| capacity(n) > 0.0).unwrap_or(0),
        };
        let cap = if inner == 0 { 0.0 } else { capacity(inner) };
        let bytes: f64 = items
            .iter()
            .filter(|l| l.footprint_bytes > cap)
            .map(|l| l.oi.analytic_min_bytes)
            .sum();
        if bytes <= 0.0 {
            continue;
        }
        let intensity = flops / bytes;
        let roof = c.value * intensity;
        let (attainable, binding) = if roof < compute || compute <= 0.0 {
            (roof, c.id.to_string())
        } else {
            (compute, "the highest compute roof".to_string())
        };
        // Levels that serve the same traffic share one point ("at L1, L2, L3").
        if let Some(last) = out
            .last_mut()
            .filter(|q: &&mut PlotPoint| (q.intensity - intensity).abs() <= 1e-9 * intensity)
        {
            last.label.push_str(&format!(", {level}"));
            continue;
        }
        out.push(PlotPoint {
            label: format!("{} at {level}", p.workload.name),
            group: p.workload.name.clone(),
            intensity,
            achieved,
            attainable,
            main: false,
            share: None,
            binding: Some(binding),
        });
    }
    out
}
