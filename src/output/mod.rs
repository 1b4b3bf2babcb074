//! Human output: tables on stdout.

pub mod fleet;
pub mod gate;
pub mod gpus;
pub mod sweep;

use roofline_model::{Ceiling, Machine, PeakDb};
use roofline_plots::si;

fn stats_cell(c: &Ceiling) -> String {
    // Samples left out of the value (taken at a low clock or throttled) as "−k", "!" when too
    // few clean ones are left.
    let left = match &c.conditions {
        Some(k) if !k.left_out.is_empty() || k.too_few_clean => format!(
            " −{}{}",
            k.left_out.len(),
            if k.too_few_clean { "!" } else { "" }
        ),
        _ => String::new(),
    };
    format!(
        "{:>2} × cv {:>5.2}%{left}",
        c.stats.samples,
        100.0 * c.stats.cv
    )
}

fn peak_cell(c: &Ceiling) -> String {
    let u = c
        .theoretical_peak
        .as_ref()
        .map(|p| 100.0 * p.uncertainty)
        .unwrap_or(0.0);
    match (c.fraction_of_peak(), c.above_peak) {
        (Some(f), true) => format!("{:>5.1}% ±{u:.1}% ABOVE PEAK", 100.0 * f),
        (Some(f), false) => format!("{:>5.1}% ±{u:.1}%", 100.0 * f),
        (None, _) => String::new(),
    }
}

/// The ceilings of a machine as a table.
pub fn machine_table(m: &Machine) {
    let cpu = &m.provenance.cpu;
    outln!("{} — {} cores, {}", cpu.model_name, cpu.cores, cpu.simd);
    for g in &m.provenance.gpus {
        let clocks = g
            .telemetry
            .as_ref()
            .and_then(|t| t.sm_clock_mhz.as_ref())
            .map(|c| format!(", SM clock {:.0}-{:.0} MHz during the probe", c.min, c.max))
            .unwrap_or_default();
        outln!(
            "gpu{}: {} — compute capability {}, {} SMs, {}B, driver {}{clocks}",
            g.index,
            g.name,
            g.compute_capability,
            g.sm_count,
            si(g.memory_bytes as f64),
            g.driver_version.as_deref().unwrap_or("?")
        );
    }
    if let Some(c) = &cpu.measured_clock_hz_t1 {
        let all = cpu
            .measured_clock_hz_all
            .as_ref()
            .map(|a| format!(", all cores {:.3} GHz", a.median / 1e9))
            .unwrap_or_default();
        outln!(
            "measured clock: one core {:.3} GHz{all} (cpuinfo says {} MHz)",
            c.median / 1e9,
            cpu.cpuinfo_mhz
                .map(|v| format!("{v:.0}"))
                .unwrap_or("?".into())
        );
    }
    let shared: &[String] = cpu
        .shared_cores
        .as_ref()
        .map_or(&[], |s| s.ceilings.as_slice());
    if let Some(s) = &cpu.shared_cores {
        outln!(
            "WARNING: the cores were shared during this probe (all-core clock {:.0}% of one core's): the ceilings marked * understate this machine",
            100.0 * s.ratio
        );
    }
    if let Some(w) = m.provenance.load.as_ref().and_then(|l| l.warning()) {
        outln!("WARNING: {w}");
    }
    outln!();
    outln!(
        "{:<32} {:>14} {:>7} {:>14} {:>24} {:>6}",
        "ceiling",
        "value",
        "threads",
        "samples",
        "of theoretical peak",
        "isa"
    );
    for c in &m.ceilings {
        let mark = if shared.contains(&c.id.to_string()) {
            "*"
        } else {
            ""
        };
        outln!(
            "{:<32} {:>14} {:>7} {:>14} {:>24} {:>6}",
            format!("{}{mark}", c.id),
            format!("{}{}", si(c.value), c.unit),
            c.threads,
            stats_cell(c),
            peak_cell(c),
            c.isa.as_deref().unwrap_or("")
        );
    }
    let flagged: Vec<String> = m
        .ceilings
        .iter()
        .filter(|c| c.above_peak)
        .map(|c| c.id.to_string())
        .collect();
    if !flagged.is_empty() {
        outln!("\nwarning: measured above the theoretical peak (the peak rule or the clock measurement is off): {}", flagged.join(", "));
    }
    let left_out: Vec<String> = m
        .ceilings
        .iter()
        .filter_map(|c| Some(format!("  {}: {}", c.id, c.conditions.as_ref()?.summary()?)))
        .collect();
    if !left_out.is_empty() {
        outln!(
            "\nsamples left out of their ceilings (taken at a clock below the ceiling's by more than its drift, or throttled; kept in stats):\n{}",
            left_out.join("\n")
        );
    }
    let uneven: Vec<String> = m
        .ceilings
        .iter()
        .filter_map(|c| {
            let p = c.plateau.as_ref().filter(|p| !p.flat())?;
            Some(format!(
                "{} ({}{u} to {}{u}, {:.0}%)",
                c.id,
                si(p.low),
                si(p.high),
                100.0 * p.spread,
                u = c.unit
            ))
        })
        .collect();
    if !uneven.is_empty() {
        outln!(
            "\nwarning: plateaus not flat (their working sets' best rates lie more than {:.0}% apart; each ceiling is its window's median point): {}",
            100.0 * roofline_model::Plateau::FLAT,
            uneven.join(", ")
        );
    }
    if let Some(g) = roofline_model::gpu_matrix::GpuMatrix::of(&m.ceilings) {
        for l in gpus::lines(&g) {
            outln!("{l}");
        }
    }
    if let Some(f) = &m.fleet {
        fleet::table(f);
    }
    for n in &m.provenance.notes {
        outln!("note: {n}");
    }
}

/// `probe --check`: one line per GPU kernel; returns the number of failures.
pub fn check_table(r: &roofline_kernels::probe::gpu::GpuResult) -> usize {
    for g in &r.gpus {
        outln!(
            "gpu{}: {} (compute capability {}, {} SMs, {}B, L2 {}B)",
            g.index,
            g.name,
            g.compute_capability,
            g.sm_count,
            si(g.memory_bytes as f64),
            si(g.l2_bytes as f64)
        );
    }
    outln!();
    outln!("{:<6} {:<28} {:<6}  detail", "gpu", "kernel", "result");
    let mut failed = 0;
    for c in &r.checks {
        let (word, detail) = match (&c.failure, c.skipped) {
            (None, _) => ("pass", c.detail.clone()),
            (Some(why), true) => ("skip", why.clone()),
            (Some(why), false) => {
                failed += 1;
                ("FAIL", why.clone())
            }
        };
        outln!(
            "gpu{:<3} {:<28} {:<6}  {}",
            c.gpu,
            c.kernel,
            word,
            detail.replace('\n', " | ")
        );
    }
    for n in &r.notes {
        outln!("note: {n}");
    }
    outln!(
        "\n{} passed, {} failed, {} skipped",
        r.checks.iter().filter(|c| c.failure.is_none()).count(),
        failed,
        r.checks.iter().filter(|c| c.skipped).count()
    );
    failed
}

/// `roofline kernels`: every CUDA kernel source compiled for each architecture.
pub fn kernels(arch: &str, json: bool) -> Result<(), anyhow::Error> {
    use roofline_kernels::cuda::nvrtc::{self, Target, SOURCES};
    let mut archs = Vec::new();
    for a in arch.split(',').map(str::trim).filter(|a| !a.is_empty()) {
        let v: u32 = a.trim_start_matches("sm_").parse().map_err(|_| {
            anyhow::anyhow!("--arch {a}: expected compute capabilities × 10, e.g. 80,90")
        })?;
        if !(50..=130).contains(&v) {
            return Err(anyhow::anyhow!(
                "--arch {a}: expected a compute capability × 10 between 50 and 130, e.g. 80"
            ));
        }
        archs.push(v);
    }
    if archs.is_empty() {
        return Err(anyhow::anyhow!("--arch is empty; expected e.g. 80,90"));
    }
    let (major, minor) = nvrtc::version()?;
    let supported = nvrtc::supported_archs()?;
    if let Some(a) = archs.iter().find(|a| !supported.contains(a)) {
        return Err(anyhow::anyhow!(
            "--arch {a}: NVRTC {major}.{minor} compiles for {}",
            supported
                .iter()
                .map(|s| s.to_string())
                .collect::<Vec<_>>()
                .join(",")
        ));
    }
    let mut report = Vec::new();
    for src in SOURCES {
        for &a in &archs {
            let c = nvrtc::compile(src, Target::Sass(a))?;
            for k in src.kernels {
                let r = c
                    .resources
                    .iter()
                    .find(|r| r.kernel == *k)
                    .cloned()
                    .unwrap_or_default();
                report.push(serde_json::json!({
                    "kernel": k,
                    "source": src.file,
                    "purpose": src.purpose,
                    "arch": format!("sm_{a}"),
                    "registers": r.registers,
                    "shared_bytes": r.shared_bytes,
                    "spill_store_bytes": r.spill_store_bytes,
                    "spill_load_bytes": r.spill_load_bytes,
                    "stack_bytes": r.stack_bytes,
                }));
            }
        }
    }
    if json {
        outln!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"nvrtc": format!("{major}.{minor}"), "kernels": report})
            )?
        );
        return Ok(());
    }
    outln!(
        "NVRTC {major}.{minor}; SASS for {}",
        archs
            .iter()
            .map(|a| format!("sm_{a}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    outln!(
        "{:<12} {:<10} {:<7} {:>5} {:>6} {:>7} {:>7}  purpose",
        "kernel",
        "source",
        "arch",
        "regs",
        "smem",
        "spill-st",
        "spill-ld"
    );
    for r in &report {
        outln!(
            "{:<12} {:<10} {:<7} {:>5} {:>6} {:>7} {:>7}  {}",
            r["kernel"].as_str().unwrap_or(""),
            r["source"].as_str().unwrap_or(""),
            r["arch"].as_str().unwrap_or(""),
            r["registers"].as_u64().unwrap_or(0),
            r["shared_bytes"].as_u64().unwrap_or(0),
            r["spill_store_bytes"].as_u64().unwrap_or(0),
            r["spill_load_bytes"].as_u64().unwrap_or(0),
            r["purpose"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// The peak database as a table (or JSON).
pub fn peaks(json: bool) -> Result<(), anyhow::Error> {
    let db = PeakDb::builtin()?;
    if json {
        outln!("{}", serde_json::to_string_pretty(&db)?);
        return Ok(());
    }
    outln!(
        "{:<24} {:<6} {:<7} {:<6} {:>16} {:>10}  source",
        "device",
        "prec.",
        "engine",
        "sparse",
        "peak",
        "clock"
    );
    for d in &db.devices {
        for p in &d.peaks {
            outln!(
                "{:<24} {:<6} {:<7} {:<6} {:>16} {:>6} MHz  {}{}",
                d.name,
                p.precision,
                p.engine,
                if p.sparse { "2:4" } else { "dense" },
                format!("{}{}", si(p.value), p.unit),
                d.clock_mhz,
                if p.derived { "derived: " } else { "" },
                p.note.as_deref().unwrap_or(&d.source),
            );
        }
        outln!(
            "{:<24} memory {}B/s, {} GiB  ({})",
            d.name,
            si(d.memory_bandwidth),
            d.memory_bytes >> 30,
            d.source
        );
    }
    outln!("\nCPU rule: {}", db.cpu_rule.formula);
    outln!("  {}", db.cpu_rule.note);
    for f in db
        .cpu_rule
        .fma_units
        .iter()
        .chain(std::iter::once(&db.cpu_rule.default))
    {
        if f.neon > 0 {
            outln!(
                "  {}: {} × 128-bit NEON FMA pipes ({})",
                f.name,
                f.neon,
                f.source
            );
        } else {
            outln!(
                "  {}: {} × 512-bit, {} × 256-bit FMA units ({})",
                f.name,
                f.avx512,
                f.avx2,
                f.source
            );
        }
    }
    Ok(())
}

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
            format!("{} threads", p.workload.threads)
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
    outln!(
        "  {} under {}: attainable {}FLOP/s, achieved {:.0}% of it",
        pt.bound.kind.as_str(),
        pt.bound.ceiling,
        si(pt.bound.attainable),
        100.0 / pt.bound.headroom
    );
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
    match &s.vflops_per_watt {
        Some(w) => outln!("  VFLOPS per watt {}FLOP/s/W", si(w.mean)),
        None => outln!("  {}", score.energy_note),
    }
    if let Some(b) = &s.bagging {
        outln!(
            "  bagging: {} models × {} ranks (Sys_scale {}), bagged APC {}FLOP per iteration, T_epoch {:.2} s; ensemble {} {:.4} against {:.4} for its models on average; the first model alone: FLOPS {}FLOP/s, VFLOPS {}FLOP/s",
            b.models,
            b.ranks_per_model,
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
}
