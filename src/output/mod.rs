//! Human output: tables on stdout (every line through the checked `outln!`).

pub mod fleet;
pub mod gate;
pub mod gpus;
mod kernels;
mod placement;
pub mod sweep;
mod ticker;

pub use kernels::{check_table, kernels, peaks};
pub use placement::{placement_table, score_summary};
pub use ticker::Ticker;

use roofline_model::{Ceiling, Machine};
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
    // Padded to its widest (" −k!"), so that a row with samples left out keeps the columns
    // after it where the others have them.
    format!(
        "{:>2} × cv {:>5.2}%{left:<4}",
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
/// A calibrated baseline's run-to-run spread per kind of figure (the widest of its ids'):
/// "FMA 1.2%, GEMM 3.0%, L1 22%, …".
pub fn calibration_spread(m: &Machine) -> String {
    let Some(c) = &m.calibration else {
        return String::new();
    };
    let mut fams: Vec<(String, f64)> = Vec::new();
    for ceiling in &m.ceilings {
        let id = ceiling.id.to_string();
        let s = roofline_model::gate::spread(&c.values(&id));
        let f = roofline_model::gate::reach::family(&id);
        match fams.iter_mut().find(|x| x.0 == f) {
            Some(x) => x.1 = x.1.max(s),
            None => fams.push((f, s)),
        }
    }
    fams.iter()
        .map(|(f, s)| format!("{f} {:.1}%", 100.0 * s))
        .collect::<Vec<_>>()
        .join(", ")
}

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
    if let Some(c) = &m.provenance.cluster {
        let by = c
            .launcher
            .as_ref()
            .map(|l| format!(", launched by {}", l.describe()))
            .unwrap_or_default();
        outln!(
            "cluster: {} node(s) ({}), {} ranks{by}; {}{}",
            c.nodes,
            c.hosts.join(", "),
            c.ranks,
            c.mpi_library,
            if c.fake_nodes { "; pretend nodes" } else { "" }
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
        "{:<32} {:>14} {:>7} {:<18} {:>24} {:>6}",
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
            "{:<32} {:>14} {:>7} {:<18} {:>24} {:>6}",
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
    let capped: Vec<String> = m
        .ceilings
        .iter()
        .filter_map(|c| {
            let s = c.sustained.as_ref()?;
            let at = [
                s.power_w.map(|w| format!("{w:.0} W")),
                s.sm_clock_mhz.map(|f| format!("SM {f:.0} MHz")),
            ]
            .into_iter()
            .flatten()
            .collect::<Vec<_>>()
            .join(", ");
            Some(format!(
                "  {}: sustained {}{u} ({} samples{}{}){}",
                c.id,
                si(s.value),
                s.samples,
                if at.is_empty() { "" } else { " at " },
                at,
                c.burst.map_or(String::new(), |b| format!(
                    "; burst {}{} before the cap",
                    si(b),
                    c.unit
                )),
                u = c.unit
            ))
        })
        .collect();
    if !capped.is_empty() {
        outln!(
            "\nceilings under the GPU's power cap (its operating point: the value is the sustained figure; `plot --burst` draws the burst one):\n{}",
            capped.join("\n")
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

#[cfg(test)]
mod table_tests {
    /// A ceiling with samples left out takes the width of one without: the columns after it
    /// stay in place.
    #[test]
    fn left_out_samples_do_not_shift_the_columns() {
        let text = include_str!("../../docs/machine-example.json");
        let m = roofline_model::Machine::from_json(text).unwrap();
        let plain = m.ceilings[0].clone();
        let mut marked = plain.clone();
        marked.conditions = Some(
            serde_json::from_value(serde_json::json!({
                "clean": 2,
                "too_few_clean": true,
                "left_out": [
                    {"sample": 0, "why": {"why": "low_clock", "clock_hz": 1e9, "reference_hz": 3e9}},
                    {"sample": 1, "why": {"why": "low_clock", "clock_hz": 1e9, "reference_hz": 3e9}},
                    {"sample": 2, "why": {"why": "low_clock", "clock_hz": 1e9, "reference_hz": 3e9}}
                ]
            }))
            .unwrap(),
        );
        let (a, b) = (super::stats_cell(&plain), super::stats_cell(&marked));
        assert!(b.ends_with(" −3!"), "{b}");
        assert_eq!(a.chars().count(), b.chars().count(), "{a:?} against {b:?}");
        assert!(a.chars().count() <= 18, "{a:?}: wider than its column");
    }
}
