//! Human output: tables on stdout.

use roofline_model::{Ceiling, Machine, PeakDb};
use roofline_plots::si;

fn stats_cell(c: &Ceiling) -> String {
    format!("{:>2} × cv {:>5.2}%", c.stats.samples, 100.0 * c.stats.cv)
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
    println!("{} — {} cores, {}", cpu.model_name, cpu.cores, cpu.simd);
    if let Some(c) = &cpu.measured_clock_hz_t1 {
        let all = cpu
            .measured_clock_hz_all
            .as_ref()
            .map(|a| format!(", all cores {:.3} GHz", a.median / 1e9))
            .unwrap_or_default();
        println!(
            "measured clock: one core {:.3} GHz{all} (cpuinfo says {} MHz)",
            c.median / 1e9,
            cpu.cpuinfo_mhz
                .map(|v| format!("{v:.0}"))
                .unwrap_or("?".into())
        );
    }
    println!();
    println!(
        "{:<28} {:>14} {:>7} {:>14} {:>24}",
        "ceiling", "value", "threads", "samples", "of theoretical peak"
    );
    for c in &m.ceilings {
        println!(
            "{:<28} {:>14} {:>7} {:>14} {:>24}",
            c.id,
            format!("{}{}", si(c.value), c.unit),
            c.threads,
            stats_cell(c),
            peak_cell(c)
        );
    }
    let flagged: Vec<&str> = m
        .ceilings
        .iter()
        .filter(|c| c.above_peak)
        .map(|c| c.id.as_str())
        .collect();
    if !flagged.is_empty() {
        println!("\nwarning: measured above the theoretical peak (the peak rule or the clock measurement is off): {}", flagged.join(", "));
    }
    for n in &m.provenance.notes {
        println!("note: {n}");
    }
}

/// The peak database as a table (or JSON).
pub fn peaks(json: bool) -> Result<(), anyhow::Error> {
    let db = PeakDb::builtin()?;
    if json {
        println!("{}", serde_json::to_string_pretty(&db)?);
        return Ok(());
    }
    println!(
        "{:<24} {:<6} {:<7} {:<6} {:>16} {:>10}  source",
        "device", "prec.", "engine", "sparse", "peak", "clock"
    );
    for d in &db.devices {
        for p in &d.peaks {
            println!(
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
        println!(
            "{:<24} memory {}B/s, {} GiB  ({})",
            d.name,
            si(d.memory_bandwidth),
            d.memory_bytes >> 30,
            d.source
        );
    }
    println!("\nCPU rule: {}", db.cpu_rule.formula);
    println!("  {}", db.cpu_rule.note);
    for f in db
        .cpu_rule
        .fma_units
        .iter()
        .chain(std::iter::once(&db.cpu_rule.default))
    {
        println!(
            "  {}: {} × 512-bit, {} × 256-bit FMA units ({})",
            f.name, f.avx512, f.avx2, f.source
        );
    }
    Ok(())
}
