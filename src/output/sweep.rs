//! `roofline sweep`'s table: a header, a row per point as it finishes, the scaling series and
//! SAIH's intensities beside ours.

use roofline_model::sweep::{Sweep, SweepPoint};

/// The table's header; `kind` names the processes (threads or ranks). FLOP/s is the median
/// step's, as the charts draw it.
pub fn header(kind: &str) {
    outln!(
        "{:>3} {:>7} {:>9} {:>6} {:>9} {:>5} {:>10} {:>11} {:>8} {:>8} {:>6}  bound",
        "#",
        "images",
        "size",
        "width",
        "depth",
        kind,
        "FLOP/smpl",
        "FLOP/s med",
        "% peak",
        "speedup",
        "I/O"
    );
}

/// One row of the sweep's table.
pub fn row(p: Option<&SweepPoint>, s: &Sweep) {
    let Some(p) = p else { return };
    let speedup = s
        .scaling
        .iter()
        .find(|x| x.problem == p.problem.size_label())
        .and_then(|x| x.points.iter().find(|q| q.processes == p.problem.processes))
        .map(|q| format!("{:.2}", q.speedup))
        .unwrap_or_else(|| "-".into());
    outln!(
        "{:>3} {:>7} {:>9} {:>6} {:>9} {:>5} {:>10} {:>11} {:>7.1}% {:>8} {:>5.1}%  {}",
        p.index,
        p.problem.images,
        p.problem.resolution,
        p.problem.width,
        p.problem.depth,
        p.problem.processes,
        roofline_plots::si(p.flops_per_sample),
        roofline_plots::si(p.achieved_flops),
        100.0 * p.fraction_of_peak,
        speedup,
        100.0 * p.io_share,
        p.bound
    );
}

/// Each problem's strong scaling, one line each.
pub fn scaling(result: &Sweep, kind: &str) {
    for s in &result.scaling {
        outln!(
            "strong scaling of {}: {}",
            s.problem,
            s.points
                .iter()
                .map(|p| format!(
                    "{} ×{:.2} ({:.0}%)",
                    roofline_plots::sweep::count(p.processes, kind),
                    p.speedup,
                    100.0 * p.efficiency
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for s in &result.weak_scaling {
        outln!(
            "weak scaling at {}: {}",
            s.problem,
            s.points
                .iter()
                .map(|p| {
                    let n = roofline_plots::sweep::count(p.processes, kind);
                    format!("{n} {:.0}%", 100.0 * p.efficiency)
                })
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for s in &result.data_scaling {
        outln!(
            "data scaling of {} at {}: {}",
            s.problem,
            roofline_plots::sweep::count(s.processes, kind),
            s.points
                .iter()
                .map(|p| format!(
                    "{} images ({:.3}) {}FLOP/s a process ({:.0}%)",
                    p.images,
                    p.share,
                    roofline_plots::si(p.per_process_flops),
                    100.0 * p.relative
                ))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
}

/// Our intensity's units, and SAIH's Table 3 in its units and ours.
pub fn intensity(result: &Sweep) {
    let Some(u) = &result.intensity_units else {
        return;
    };
    outln!("intensity: {}", u.ours);
    outln!(
        "SAIH's Table 3 ({}; ours = SAIH's / {}): {}",
        u.saih,
        u.factor,
        u.saih_table_3
            .iter()
            .map(|r| format!(
                "{} (batch {}) {:.0} = {:.1} FLOP/B",
                r.model, r.batch, r.saih_intensity, r.flop_per_byte
            ))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
