//! One node probing itself: its CPU's sections, every GPU with NVML sampling its clocks, power
//! and throttling, the provenance that says what was measured and in what state; and the GPU
//! self-test. What `roofline probe` runs on each node (alone, or as each node's leader under
//! mpirun).

use super::{cpu as cpu_probe, gpu as gpu_probe, Progress, Section};
use crate::cuda::CudaError;
use crate::ProbeError;
use roofline_collectors::load;
use roofline_model::{CpuInfo, GpuInfo, Machine, Provenance, MACHINE_SCHEMA};
use std::sync::atomic::AtomicBool;

/// What to probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Devices {
    /// The CPU and every NVIDIA GPU found (saying so when none is).
    #[default]
    Auto,
    /// The CPU only.
    Cpu,
    /// The GPUs only; no driver is an error.
    Cuda,
}

/// Why a node probe did not finish.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    #[error("interrupted")]
    Interrupted,
    /// What was asked cannot be done here (exit 2).
    #[error("{0}")]
    Input(String),
    #[error("probe failed: {0}")]
    Cpu(#[source] ProbeError),
    #[error("GPU probe failed: {0}")]
    Gpu(#[source] CudaError),
    #[error("GPU self-test could not run: {0}")]
    Check(#[source] CudaError),
    #[error("peak database: {0}")]
    Peaks(#[source] roofline_model::ModelError),
    /// A GPU was asked for (`flag`) and there is none: the CUDA error says what was looked for.
    #[error("{flag}: {source}")]
    NoGpu {
        flag: &'static str,
        #[source]
        source: CudaError,
    },
    /// NVML did not open (the GPU sampler's, the inventory's).
    #[error("{0}")]
    Nvml(#[from] roofline_collectors::nvml::NvmlError),
}

impl NodeError {
    /// Whether the fault is what was asked (exit 2), not the run's.
    pub fn is_input(&self) -> bool {
        matches!(self, NodeError::Input(_) | NodeError::NoGpu { .. })
    }
}

/// The GPUs a node probe measures, or why it measures none.
#[derive(Debug)]
pub enum Gpus {
    Found(usize),
    /// `--device cpu`.
    NotAsked,
    /// No driver, or no device: the error says what was looked for.
    Absent(CudaError),
}

impl std::fmt::Display for Gpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gpus::Found(n) => write!(f, "{n} GPU(s)"),
            Gpus::NotAsked => f.write_str("GPUs not probed (--device cpu)"),
            Gpus::Absent(e) => write!(f, "{e}"),
        }
    }
}

impl From<ProbeError> for NodeError {
    fn from(e: ProbeError) -> NodeError {
        match e {
            ProbeError::Interrupted => NodeError::Interrupted,
            e => NodeError::Cpu(e),
        }
    }
}

impl From<CudaError> for NodeError {
    fn from(e: CudaError) -> NodeError {
        match e {
            CudaError::Interrupted => NodeError::Interrupted,
            e => NodeError::Gpu(e),
        }
    }
}

/// A node probe: what to measure, on which cores, how long.
pub struct NodeConfig {
    pub devices: Devices,
    pub sections: Vec<Section>,
    /// The cores of the `all` ceilings (one pinned thread each).
    pub cores: Vec<usize>,
    /// Every core roofline may use here.
    pub machine_cores: Vec<usize>,
    pub quick: bool,
    /// Check that the machine is quiet (`provenance.load`): not under MPI, where the job's
    /// own ranks share the node.
    pub check_load: bool,
    /// The GPU convolution section's batch and search budget.
    pub conv: gpu_probe::ConvOptions,
}

/// The cores for the `all` ceilings and all the cores roofline may use, by the one rule
/// ([`crate::affinity::cores`]).
pub fn cores_for(threads: Option<usize>) -> Result<(Vec<usize>, Vec<usize>), NodeError> {
    let c = crate::affinity::cores(threads).map_err(|e| NodeError::Input(e.to_string()))?;
    Ok((c.chosen, c.all))
}

/// How many GPUs are probed, or why none is; `Devices::Cuda` without a driver, or only GPU
/// sections without a GPU, is an input error.
pub fn gpu_status(devices: Devices, sections: &[Section]) -> Result<Gpus, NodeError> {
    let status = match (devices, gpu_probe::init()) {
        (Devices::Cpu, _) => Gpus::NotAsked,
        (Devices::Cuda, Err(source)) => {
            return Err(NodeError::NoGpu {
                flag: "--device cuda",
                source,
            })
        }
        // Two copies of a library: refused, whatever was asked (not "no GPU").
        (_, Err(e @ CudaError::Shadowed(_))) => return Err(NodeError::Input(e.to_string())),
        (_, Err(e)) => Gpus::Absent(e),
        (_, Ok(n)) => Gpus::Found(n),
    };
    if !matches!(status, Gpus::Found(_)) && sections.iter().all(|s| *s == Section::Copy) {
        return Err(NodeError::Input(format!(
            "--only copy measures GPU copies, and no GPU is probed: {status}"
        )));
    }
    Ok(status)
}

/// A machine.json with provenance only (no node section was asked).
pub fn bare(provenance: Provenance) -> Machine {
    Machine {
        schema: MACHINE_SCHEMA.into(),
        provenance,
        ceilings: Vec::new(),
        curves: Vec::new(),
        tables: Vec::new(),
        nodes: Vec::new(),
        failures: Vec::new(),
        fleet: None,
        calibration: None,
    }
}

/// This CPU as `/proc/cpuinfo` and sysfs describe it (`cores` of them), with the SIMD the
/// kernels run with: everything of its identity but the clock ([`cpu_here`] measures it).
pub fn cpu_described(cores: usize) -> CpuInfo {
    let mut cpu = roofline_collectors::cpu_info(&roofline_collectors::cpu_ident(), cores);
    cpu.simd = crate::cpu::fma::best_isa(crate::cpu::fma::Precision::F32)
        .unwrap_or(crate::cpu::fma::Isa::Scalar)
        .name()
        .to_string();
    cpu
}

/// [`cpu_described`] with a quick measurement of the one-core clock (about 0.3 s): a result's
/// provenance holds its machine's whole identity ([`roofline_model::identity`]).
pub fn cpu_here(cores: usize) -> CpuInfo {
    use crate::cpu::clock;
    let mut cpu = cpu_described(cores);
    // The best of three short measurements a moment apart: on a shared machine one can fall
    // in another process's time slice (the identity wants the clock, not the contention).
    let (factor, _) = clock::counter_verdict(clock::cycles_per_add());
    let mut best = clock::quick_hz(10);
    for _ in 0..2 {
        std::thread::sleep(std::time::Duration::from_millis(30));
        best = best.max(clock::quick_hz(10));
    }
    cpu.measured_clock_hz_t1 = roofline_model::Stats::from_samples(&[best * factor]);
    cpu
}

/// This node's physical cores: one CPU a core of every CPU its cgroup may give this process,
/// not only those it is bound to (an MPI launcher binds a rank to one core); at least one.
pub fn node_cores() -> usize {
    let mut cpus = roofline_collectors::node_cpus();
    if cpus.is_empty() {
        cpus = crate::affinity::allowed_cpus();
    }
    roofline_collectors::one_cpu_per_core(
        std::path::Path::new(roofline_collectors::SYSFS_CPU),
        &cpus,
    )
    .len()
    .max(1)
}

/// This machine's identity as a machine file is checked against: its CPU ([`cpu_described`]
/// on [`node_cores`] cores; no clock class, which `place` leaves out: a probe under mpirun
/// measures its shared node's lower clock) and the GPUs of `gpus` (ordinals; their name and memory from the
/// driver). An error when a GPU asked for cannot be opened.
pub fn identity_here(gpus: &[usize]) -> Result<roofline_model::identity::Identity, CudaError> {
    let cpu = cpu_described(node_cores());
    let mut infos = Vec::new();
    for &i in gpus {
        let gpu = crate::cuda::device::Gpu::open(i)?;
        infos.push(gpu_probe::inventory(&gpu));
    }
    Ok(roofline_model::identity::Identity::of_parts(&cpu, &infos))
}

/// Probes this node: its CPU (unless `Devices::Cuda`), then its GPUs when `gpus` found some
/// (else a note saying why not). `provenance` makes the run's provenance around the CPU as
/// measured.
pub fn probe(
    cfg: &NodeConfig,
    gpus: &Gpus,
    provenance: &dyn Fn(CpuInfo) -> Provenance,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<Machine, NodeError> {
    let ident = roofline_collectors::cpu_ident();
    let mut cpu = roofline_collectors::cpu_info(&ident, cfg.machine_cores.len());
    // The idle reference, before the work: others' share of the CPUs, the one-core clock.
    let window = std::time::Duration::from_millis(300);
    let before = cfg.check_load.then(|| {
        (
            load::others_over(window),
            crate::cpu::clock::quick_hz(5),
            load::cpu_times(),
        )
    });
    let cpu_cfg = cpu_probe::CpuConfig {
        cores: cfg.cores.clone(),
        caches: cpu.caches.clone(),
        vendor: ident.vendor.clone(),
        family: ident.family,
        model: ident.model,
        quick: cfg.quick,
        sections: cfg.sections.clone(),
    };
    let mut result = if cfg.devices == Devices::Cuda {
        cpu_probe::CpuResult::default()
    } else {
        cpu_probe::run(&cpu_cfg, cancel, progress)?
    };
    let mut gpu_infos = Vec::new();
    let mut gpu_libraries = Vec::new();
    let mut failures = Vec::new();
    match gpus {
        Gpus::NotAsked | Gpus::Absent(_) => result.notes.push(format!("no GPU found: {gpus}")),
        Gpus::Found(_) => {
            let mode = if cfg.quick {
                gpu_probe::Mode::Quick
            } else {
                gpu_probe::Mode::Full
            };
            let g = run_gpus(mode, &cfg.sections, cfg.conv, cancel, progress)?;
            failures = g
                .checks
                .iter()
                .filter(|c| !c.skipped)
                .filter_map(|c| {
                    Some(roofline_model::CheckFailure {
                        on: format!("gpu{}", c.gpu),
                        kernel: c.kernel.clone(),
                        error: c.failure.clone()?,
                    })
                })
                .collect();
            result.ceilings.extend(g.ceilings);
            result.curves.extend(g.curves);
            result.tables.extend(g.tables);
            result.notes.extend(g.notes);
            gpu_infos = g.gpus;
            gpu_libraries = gpu_probe::library_versions();
        }
    }
    if !result.simd.is_empty() {
        cpu.simd = result.simd.clone();
    }
    // /proc/cpuinfo's names of the features the probes use.
    cpu.features = [
        "fma",
        "avx2",
        "avx512f",
        "avx512_bf16",
        "avx512_vnni",
        // aarch64's names.
        "asimd",
        "sve",
        "sve2",
        "bf16",
        "i8mm",
    ]
    .iter()
    .filter(|f| ident.flags.contains(**f))
    .map(|f| f.to_string())
    .collect();
    cpu.measured_clock_hz_t1 = result.clock_t1.clone();
    cpu.measured_clock_hz_all = result.clock_all.clone();
    let mut notes = result.notes.clone();
    // ... and checked after it.
    let load_check = before.map(|(others_before, clock_before, during_from)| {
        let during = during_from
            .zip(load::cpu_times())
            .and_then(|(a, b)| load::others_share(&a, &b));
        let clock_after = crate::cpu::clock::quick_hz(5);
        let others_after = load::others_over(window);
        // The references are the chain's rate; the run's clock is that times the counter's
        // cycles per add.
        let f = result.clock_factor();
        let (clock_before, clock_after) = (clock_before * f, clock_after * f);
        roofline_model::LoadCheck::judge(
            [others_before, during, others_after],
            Some(clock_before).filter(|c| *c > 0.0),
            result.clock_t1.as_ref().map(|s| s.median),
            Some(clock_after).filter(|c| *c > 0.0),
        )
    });
    if let Some(w) = load_check.as_ref().and_then(|l| l.warning()) {
        notes.push(w);
    }
    cpu.shared_cores = roofline_model::SharedCores::detect(&cpu, &result.ceilings);
    if let Some(s) = &cpu.shared_cores {
        notes.push(format!(
            "the cores were shared while the all-core ceilings ran: the all-core clock was {:.0}% of the one-core clock (two vCPUs on one physical core, or another load); {} `all` ceilings are marked as measured in that state (provenance.cpu.shared_cores) and understate this machine: probe again when it is idle",
            100.0 * s.ratio,
            s.ceilings.len()
        ));
    }
    let slow = crate::driver::test_slowdown();
    if slow > 0.0 {
        notes.push(format!(
            "{}={slow}: every CPU sample was stretched so that every CPU ceiling is {:.0}% lower than measured (a controlled slowdown for testing `roofline gate`; not this machine's ceilings)",
            crate::driver::TEST_SLOWDOWN,
            100.0 * slow
        ));
    }
    if cfg.cores.len() < cfg.machine_cores.len() {
        notes.push(format!(
            "the `all` ceilings ran on {} of the {} cores roofline may use (--threads {})",
            cfg.cores.len(),
            cfg.machine_cores.len(),
            cfg.cores.len()
        ));
    }
    let mut p = provenance(cpu);
    p.libraries.extend(gpu_libraries);
    p.devices = gpu_infos
        .iter()
        .map(|g| {
            format!(
                "gpu{}: {} (sm_{}, {} SMs, {}B)",
                g.index,
                g.name,
                g.compute_capability.replace('.', ""),
                g.sm_count,
                roofline_model::si(g.memory_bytes as f64)
            )
        })
        .collect();
    p.gpus = gpu_infos;
    p.notes = notes;
    p.load = load_check;
    Ok(Machine {
        ceilings: result.ceilings,
        curves: result.curves,
        tables: result.tables,
        failures,
        ..bare(p)
    })
}

/// NVML, opened from where the CUDA library search found libnvidia-ml.
pub fn open_nvml(
) -> Result<std::sync::Arc<roofline_collectors::nvml::Nvml>, roofline_collectors::nvml::NvmlError> {
    let path = crate::cuda::libs::locate(crate::cuda::libs::Lib::Nvml);
    roofline_collectors::nvml::open(path.as_deref())
}

/// Probes every GPU with NVML sampling clocks, power, temperature and throttle reasons.
fn run_gpus(
    mode: gpu_probe::Mode,
    sections: &[Section],
    conv: gpu_probe::ConvOptions,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<gpu_probe::GpuResult, NodeError> {
    let peaks = roofline_model::PeakDb::builtin().map_err(NodeError::Peaks)?;
    let nvml = open_nvml();
    // The sampler needs the GPUs' UUIDs: open them once for the inventory.
    let uuids = gpu_probe::uuids().unwrap_or_default();
    let sampler = nvml.as_ref().ok().map(|n| {
        roofline_collectors::nvml::Sampler::start(
            n.clone(),
            uuids.clone(),
            std::time::Duration::from_millis(200),
        )
    });
    let cfg = gpu_probe::GpuConfig {
        mode,
        sections: sections.to_vec(),
        conv,
    };
    let enrich = |g: &mut GpuInfo| roofline_collectors::nvml::inventory(&nvml, g);
    // Every sample's conditions: NVML's SM clock, power and throttle reasons at its end.
    let watch = |uuid: &str| -> Option<crate::cuda::device::Reader> {
        let nvml = nvml.as_ref().ok()?.clone();
        let uuid = uuid.to_string();
        Some(Box::new(move || {
            roofline_collectors::nvml::reading(&nvml, &uuid)
        }))
    };
    let result = gpu_probe::run(&cfg, cancel, progress, &peaks, &enrich, &watch);
    let telemetry = sampler.map(|s| s.stop()).unwrap_or_default();
    let mut r = result?;
    for g in r.gpus.iter_mut() {
        if let Some(pos) = uuids.iter().position(|u| *u == g.uuid) {
            g.telemetry = telemetry.get(pos).cloned();
        }
        if let Some(t) = &g.telemetry {
            if !t.throttle_reasons.is_empty() {
                r.notes.push(format!(
                    "gpu{} was throttled during the probe: {}",
                    g.index,
                    t.throttle_reasons.join(", ")
                ));
            }
        }
    }
    Ok(r)
}

/// `roofline probe --check`: every GPU kernel and library call once on small inputs, against
/// CPU references.
pub fn gpu_check(devices: Devices, cancel: &AtomicBool) -> Result<gpu_probe::GpuResult, NodeError> {
    if devices == Devices::Cpu {
        return Err(NodeError::Input(
            "--check tests the GPU kernels; it does not go with --device cpu (the CPU probes check themselves on every run)".into(),
        ));
    }
    if let Err(source) = gpu_probe::init() {
        return Err(NodeError::NoGpu {
            flag: "--check",
            source,
        });
    }
    let peaks = roofline_model::PeakDb::builtin().map_err(NodeError::Peaks)?;
    let cfg = gpu_probe::GpuConfig {
        mode: gpu_probe::Mode::Check,
        sections: Section::ALL.to_vec(),
        conv: gpu_probe::ConvOptions::default(),
    };
    let nvml = open_nvml();
    let enrich = |g: &mut GpuInfo| roofline_collectors::nvml::inventory(&nvml, g);
    gpu_probe::run(&cfg, cancel, &super::Silent, &peaks, &enrich, &|_| None).map_err(|e| match e {
        CudaError::Interrupted => NodeError::Interrupted,
        e => NodeError::Check(e),
    })
}
