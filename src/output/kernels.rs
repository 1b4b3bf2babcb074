//! The GPU self-check's table, the CUDA kernels' resource report and the peak database.

use roofline_model::PeakDb;
use roofline_plots::si;

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
            // Arch-specific code (sm_90a's wgmma) is built for its own architecture only.
            let target = match src.arch_specific {
                Some(x) if x == a => Target::SassA(a),
                Some(_) => continue,
                None => Target::Sass(a),
            };
            let c = nvrtc::compile(src, target)?;
            for k in src.kernels {
                let r = c
                    .resources
                    .iter()
                    .find(|r| r.kernel == *k)
                    .cloned()
                    .unwrap_or_default();
                // An mma.sync the architecture has no instruction for is emulated by ptxas
                // (fp8 on sm_90 and sm_100): built, but not run by the probe.
                let emulated = k
                    .starts_with("mma_")
                    .then(|| roofline_kernels::probe::gpu::mma_support(k, a).err())
                    .flatten();
                report.push(serde_json::json!({
                    "kernel": k,
                    "source": src.file,
                    "purpose": src.purpose,
                    "arch": target.name(),
                    "registers": r.registers,
                    "shared_bytes": r.shared_bytes,
                    "spill_store_bytes": r.spill_store_bytes,
                    "spill_load_bytes": r.spill_load_bytes,
                    "stack_bytes": r.stack_bytes,
                    "emulated": emulated.is_some(),
                    "emulation": emulated,
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
            if r["emulated"].as_bool().unwrap_or(false) {
                "EMULATED here, not run by the probe: ptxas turns it into other instructions"
            } else {
                r["purpose"].as_str().unwrap_or("")
            }
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
