//! Placed workloads as points of a roofline: each workload's point and its top layers, one
//! colour per workload.

use crate::{classic_svg, ClassicOptions, PlotError, PlotPoint};
use roofline_model::placement::{Placement, Point};
use roofline_model::{Machine, Threads};

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
