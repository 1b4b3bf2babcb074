//! A placement's table and a score's summary.

/// The placement as a table on stdout.
pub fn placement_table(p: &roofline_model::placement::Placement) {
    use roofline_plots::si;
    let pt = &p.point;
    outln!(
        "{} on {} ({}{}): {}FLOP/s (best of {} steps; median {}FLOP/s), {}FLOP per step",
        p.workload.name,
        // A GPU run's host threads only feed the device: name the device (this line named the
        // host's CPU for an H200 run, 2026-11-26).
        if p.workload.device.starts_with("gpu") {
            format!("{} of {}", p.workload.device, p.machine.host)
        } else {
            p.machine.cpu.clone()
        },
        if p.workload.device.starts_with("gpu") {
            p.workload.precision.clone()
        } else {
            format!(
                "{}, {}",
                roofline_model::count(p.workload.threads, "thread"),
                p.workload.precision
            )
        },
        if p.workload.ranks > 1 {
            format!(", {} ranks", p.workload.ranks)
        } else {
            String::new()
        },
        si(pt.achieved_flops),
        pt.achieved.samples,
        si(pt.achieved.median),
        si(pt.flops_per_step)
    );
    outln!(
        "  OI {:.3} FLOP/B (analytic minimum traffic {}B){}",
        pt.oi.analytic,
        si(pt.oi.analytic_min_bytes),
        pt.coi
            .as_ref()
            .map(|c| format!(
                ", COI {:.1} FLOP/B ({}B communicated per step)",
                c.intra_node.or(c.inter_node).unwrap_or(0.0),
                si(c.intra_node_bytes + c.inter_node_bytes)
            ))
            .unwrap_or_default()
    );
    // Above its bound only by counting FLOPs it did not do: marked, and the mark explained.
    let mark = pt.note.is_some() && pt.bound.headroom < 1.0;
    outln!(
        "  {} under {}: attainable {}FLOP/s, achieved {:.0}% of it{}",
        pt.bound.kind.as_str(),
        pt.bound.ceiling,
        si(pt.bound.attainable),
        100.0 / pt.bound.headroom,
        if mark { " (*)" } else { "" }
    );
    if let (true, Some(n)) = (mark, &pt.note) {
        outln!("  (*) {n}");
    }
    let t = &p.time;
    if p.workload.kind == "training" {
        outln!(
            "  per step {:.3} s: compute {:.3}, communication {:.3}, data {:.3}, idle {:.3}",
            t.total_s,
            t.compute_s,
            t.communication_s,
            t.data_s,
            t.idle_s
        );
    }
    if !p.layers.is_empty() {
        outln!(
            "  {:<28} {:>8} {:>12} {:>9}  bound",
            "top layers",
            "share",
            "FLOP/s",
            "OI"
        );
        // Each distinct note once, after the table; its layers carry its number.
        let mut notes: Vec<&str> = Vec::new();
        for l in &p.layers {
            let mark = match &l.note {
                Some(n) => {
                    let i = notes.iter().position(|x| x == n).unwrap_or_else(|| {
                        notes.push(n);
                        notes.len() - 1
                    });
                    format!(" [{}]", i + 1)
                }
                None => String::new(),
            };
            outln!(
                "  {:<28} {:>7.1}% {:>12} {:>9.2}  {} ({:.0}% of {}){mark}",
                l.label,
                100.0 * l.share_of_step.unwrap_or(0.0),
                si(l.achieved_flops),
                l.oi.analytic,
                l.bound.kind.as_str(),
                100.0 / l.bound.headroom,
                l.bound.ceiling,
            );
        }
        for (i, note) in notes.iter().enumerate() {
            outln!("  [{}] {note}", i + 1);
        }
    }
    outln!("  {}", p.energy.note);
    for a in &p.advice {
        outln!("  advice ({}): {}", a.topic, a.text);
    }
}

/// A score's summary on stdout: whether it can be compared, then its figures.
pub fn score_summary(score: &roofline_model::score::Score) {
    // The first line says whether the score can be compared with published ones.
    outln!("{}", score.headline());
    for w in &score.warnings {
        outln!("warning: {w}");
    }
    let s = &score.scores;
    let si = roofline_plots::si;
    match &s.time_to_quality_s {
        Some(t) => outln!(
            "  time to quality {:.2} s (variation {:.1}%), {} {:.4}",
            t.mean,
            100.0 * t.variation,
            score.target.metric,
            s.quality.mean
        ),
        None => outln!(
            "  time to quality: not reached ({} of {} runs reached {} {}), {} {:.4}",
            s.runs_reached,
            score.runs.len(),
            score.target.metric,
            score.target.value,
            score.target.metric,
            s.quality.mean
        ),
    }
    outln!(
        "  FLOPS {}FLOP/s (variation {:.1}%), VFLOPS {}FLOP/s",
        si(s.flops.mean),
        100.0 * s.flops.variation,
        si(s.vflops.mean)
    );
    match (&s.flops_per_watt, &s.vflops_per_watt) {
        (Some(f), Some(w)) => outln!(
            "  FLOPS per watt {}FLOP/s/W, VFLOPS per watt {}FLOP/s/W",
            si(f.mean),
            si(w.mean)
        ),
        (None, Some(w)) => outln!("  VFLOPS per watt {}FLOP/s/W", si(w.mean)),
        _ => outln!("  {}", score.energy_note),
    }
    if !s.averaged_runs.is_empty() && s.averaged_runs.len() < score.runs.len() {
        outln!(
            "  means over runs {:?}: the runs with the highest and the lowest VFLOPS dropped (V2.0 §5.3.2)",
            s.averaged_runs
        );
    }
    if let Some(b) = &s.bagging {
        outln!(
            "  bagging: {} × {} (Sys_scale {}), bagged APC {}FLOP per iteration, T_epoch {:.2} s; ensemble {} {:.4} against {:.4} for its models on average; the first model alone: FLOPS {}FLOP/s, VFLOPS {}FLOP/s",
            roofline_model::count(b.models, "model"),
            roofline_model::count(b.ranks_per_model, "rank"),
            b.sys_scale,
            si(b.apc_flops),
            b.epoch_seconds.mean,
            score.target.metric,
            b.ensemble_quality.mean,
            b.member_quality.mean,
            si(b.single_model_flops.mean),
            si(b.single_model_vflops.mean)
        );
    }
    outln!("  AIPerf regulated score {}FLOP/s, FLOPS series maximum {}FLOP/s; HPC AI500 V3.0 analytic FLOPS per epoch {}FLOP/s", si(s.aiperf_regulated.mean), si(s.aiperf_flops_max), si(s.v3_flops_per_epoch.mean));
    for r in &score.rules {
        outln!("  rule: {r}");
    }
}
