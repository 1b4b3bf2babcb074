//! `roofline doctor`: what the GPU path would use on this machine, and the fix for what is
//! missing. Exit 0 when everything the GPU path needs is there, 2 otherwise.

use crate::exit::Failure;
use anyhow::anyhow;
use roofline_kernels::cuda::doctor::{self, Report, Severity};

#[derive(clap::Args)]
pub struct DoctorArgs {
    /// Print the report as JSON (the same facts, for scripts and the bring-up kit).
    #[arg(long)]
    pub json: bool,
}

pub fn run(a: &DoctorArgs) -> Result<std::process::ExitCode, Failure> {
    let nvml = roofline_kernels::probe::node::open_nvml();
    let enrich = |g: &mut roofline_model::GpuInfo| roofline_collectors::nvml::inventory(&nvml, g);
    let r = doctor::diagnose(&enrich);
    if a.json {
        let text = serde_json::to_string_pretty(&r).map_err(|e| Failure::Run(anyhow!(e)))?;
        outln!("{text}");
    } else {
        out!("{}", render(&r));
    }
    Ok(if r.ok() {
        std::process::ExitCode::SUCCESS
    } else {
        std::process::ExitCode::from(2)
    })
}

fn mib(bytes: u64) -> String {
    if bytes >= 1 << 30 {
        format!("{:.1} GiB", bytes as f64 / (1u64 << 30) as f64)
    } else {
        format!("{} MiB", bytes >> 20)
    }
}

/// The report as text: the driver, one line per library, one block per GPU, MPI, problems.
pub fn render(r: &Report) -> String {
    let mut s = String::from("roofline doctor: what the GPU path would use on this machine\n\n");
    s += &format!(
        "driver      {}\n",
        match (&r.driver_version, r.driver_cuda) {
            (Some(v), Some((a, b))) => format!("{v} (CUDA {a}.{b})"),
            (None, Some((a, b))) => format!("CUDA {a}.{b}"),
            _ => "not found".into(),
        }
    );
    s += &format!(
        "{:<24} {:<26} file (the one the bindings call)\n",
        "library", "version"
    );
    for l in &r.libraries {
        let file = match (&l.in_use, &l.path) {
            (Some(u), _) => u.clone(),
            (None, Some(p)) => format!("{p} (found, not usable)"),
            (None, None) => "missing".into(),
        };
        s += &format!(
            "{:<24} {:<26} {file}\n",
            l.name,
            l.version.as_deref().unwrap_or("-")
        );
    }
    s += "\n";
    if r.gpus.is_empty() {
        s += "GPUs        none\n";
    }
    for g in &r.gpus {
        let i = &g.info;
        s += &format!(
            "gpu{}        {} (compute capability {}, {} SMs, {} memory, {} L2)\n",
            i.index,
            i.name,
            i.compute_capability,
            i.sm_count,
            mib(i.memory_bytes),
            mib(i.l2_bytes)
        );
        let mut parts = Vec::new();
        match (i.sm_clock_max_mhz, g.sm_clock_khz) {
            (Some(m), _) => parts.push(format!("SM clock max {m} MHz")),
            (None, Some(k)) => parts.push(format!("SM clock {} MHz", k / 1000)),
            _ => {}
        }
        match (i.memory_clock_max_mhz, g.memory_clock_khz) {
            (Some(m), _) => parts.push(format!("memory clock max {m} MHz")),
            (None, Some(k)) => parts.push(format!("memory clock {} MHz", k / 1000)),
            _ => {}
        }
        if let Some(b) = g.memory_bus_bits {
            parts.push(format!("{b}-bit bus"));
        }
        if let Some(w) = i.power_limit_w {
            parts.push(format!("power limit {w:.0} W"));
        }
        if let (Some(gen), Some(w)) = (
            i.pcie_generation_max.or(i.pcie_generation),
            i.pcie_width_max.or(i.pcie_width),
        ) {
            parts.push(format!("PCIe gen {gen} x{w}"));
        }
        if !i.nvlinks.is_empty() {
            parts.push(format!("{} NVLinks up", i.nvlinks.len()));
        }
        if !parts.is_empty() {
            s += &format!("            {}\n", parts.join(", "));
        }
        s += &format!(
            "            kernels: {}\n",
            match &g.kernels {
                Ok(how) => format!("load ({how})"),
                Err(why) => format!("do not load: {why}"),
            }
        );
    }
    s += &format!(
        "MPI         {}; mpirun: {}{}\n",
        if r.mpi.built_in {
            "built in"
        } else {
            "not in this build (cargo build --release --features mpi)"
        },
        r.mpi.mpirun.as_deref().unwrap_or("not on the PATH"),
        r.mpi
            .launched_ranks
            .map(|n| format!("; started as one of {n} ranks"))
            .unwrap_or_default()
    );
    s += "\n";
    if r.problems.is_empty() {
        s += "ready: everything the GPU path needs is here.\n";
        return s;
    }
    for p in &r.problems {
        let mark = match p.severity {
            Severity::Blocker => "missing",
            Severity::Warning => "warning",
        };
        s += &format!("{mark}: {}\n    fix: {}\n", p.what, p.fix);
    }
    s += if r.ok() {
        "ready: the GPU path runs; the warnings above cost only what they say.\n"
    } else {
        "not ready: fix what is missing above, then run `roofline doctor` again.\n"
    };
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_kernels::cuda::doctor::{GpuStatus, LibStatus, MpiStatus, Problem};

    fn report(problems: Vec<Problem>) -> Report {
        Report {
            driver_cuda: Some((13, 0)),
            driver_version: Some("580.159.04".into()),
            libraries: vec![LibStatus {
                name: "NVRTC (libnvrtc)",
                path: Some("/venv/nvidia/cu13/lib/libnvrtc.so.13".into()),
                in_use: Some("/venv/nvidia/cu13/lib/libnvrtc.so.13".into()),
                version: Some("13.0 (sm_75…sm_121)".into()),
                role: "",
            }],
            gpus: vec![GpuStatus {
                info: roofline_model::GpuInfo {
                    index: 0,
                    name: "NVIDIA H100 80GB HBM3".into(),
                    compute_capability: "9.0".into(),
                    sm_count: 132,
                    memory_bytes: 85_520_809_984,
                    l2_bytes: 52_428_800,
                    sm_clock_max_mhz: Some(1980),
                    power_limit_w: Some(700.0),
                    pcie_generation_max: Some(5),
                    pcie_width_max: Some(16),
                    ..Default::default()
                },
                sm_clock_khz: Some(1_980_000),
                memory_clock_khz: Some(2_619_000),
                memory_bus_bits: Some(5120),
                kernels: Ok("stream.cu: sm_90".into()),
            }],
            mpi: MpiStatus {
                built_in: false,
                mpirun: None,
                launched_ranks: None,
            },
            problems,
        }
    }

    #[test]
    fn the_report_names_every_part_and_says_ready_or_what_to_fix() {
        let text = render(&report(Vec::new()));
        for want in [
            "580.159.04 (CUDA 13.0)",
            "13.0 (sm_75…sm_121)",
            "/venv/nvidia/cu13/lib/libnvrtc.so.13",
            "gpu0        NVIDIA H100 80GB HBM3 (compute capability 9.0, 132 SMs, 79.6 GiB memory, 50 MiB L2)",
            "SM clock max 1980 MHz",
            "5120-bit bus",
            "power limit 700 W",
            "PCIe gen 5 x16",
            "kernels: load (stream.cu: sm_90)",
            "--features mpi",
            "ready: everything the GPU path needs is here.",
        ] {
            assert!(text.contains(want), "{want:?} not in:\n{text}");
        }
        let text = render(&report(vec![Problem {
            severity: Severity::Blocker,
            what: "no cuDNN (libcudnn) found".into(),
            fix: "pip install nvidia-cudnn-cu13".into(),
        }]));
        assert!(text.contains(
            "missing: no cuDNN (libcudnn) found\n    fix: pip install nvidia-cudnn-cu13"
        ));
        assert!(text.ends_with(
            "not ready: fix what is missing above, then run `roofline doctor` again.\n"
        ));
    }
}
