//! `roofline probe` and `roofline probe --check`: argument checks, the node probe (CPU and
//! GPUs), storage, and under mpirun the distributed run (communication, gathering, aggregates).

use crate::{output, Failure, CANCEL};
use anyhow::{anyhow, Context};
use roofline_kernels::probe::{cpu as cpu_probe, gpu as gpu_probe, Progress, Section};
use roofline_model::{write::write_atomic, Machine, Provenance, MACHINE_SCHEMA};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Parses `--only`.
fn parse_only(only: Option<&str>) -> Result<Vec<Section>, anyhow::Error> {
    let Some(list) = only else {
        return Ok(Section::ALL.to_vec());
    };
    let mut v = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let s = Section::parse(item).ok_or_else(|| {
            anyhow!("unknown --only entry `{item}`; expected a comma-separated list of: fma, mem, gemm, conv, copy, comm, io")
        })?;
        if !v.contains(&s) {
            v.push(s);
        }
    }
    if v.is_empty() {
        return Err(anyhow!(
            "--only is empty; expected a comma-separated list of: fma, mem, gemm, conv, copy, comm, io"
        ));
    }
    Ok(v)
}

/// Fails early (before minutes of probing) when `path` cannot be written.
pub(crate) fn check_writable(path: &Path) -> Result<(), anyhow::Error> {
    roofline_model::write::check_target(path)?;
    let tmp = roofline_model::write::temp_path(path);
    std::fs::File::create(&tmp)
        .and_then(|_| std::fs::remove_file(&tmp))
        .with_context(|| {
            format!(
                "cannot write {} (choose another path with -o)",
                path.display()
            )
        })
}

struct Bar(Option<indicatif::ProgressBar>);

impl Progress for Bar {
    fn begin(&self, total: u64) {
        // The CPU probe and then the GPU probe each announce their own steps.
        if let Some(b) = &self.0 {
            b.inc_length(total);
        }
    }
    fn advance(&self, label: &str) {
        if let Some(b) = &self.0 {
            if b.position() > 0 || !b.message().is_empty() {
                b.inc(1);
            }
            b.set_message(label.to_string());
        }
    }
}

/// What `roofline probe` was asked.
#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Where to write the result.
    #[arg(short, long, default_value = "machine.json")]
    pub output: PathBuf,
    /// Fewer repeats and a coarser sweep (same ceiling ids); under 30 s on 2 cores.
    #[arg(long)]
    pub quick: bool,
    /// Measure only these sections, comma-separated: fma, mem, gemm, conv, copy (host-device
    /// and peer copies, GPUs only), comm (between MPI ranks, under mpirun), io (storage; as
    /// --io).
    #[arg(long, value_name = "LIST")]
    pub only: Option<String>,
    /// Threads for the `all` ceilings (default: one per physical core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Print machine.json on stdout instead of the table (the file is written too).
    #[arg(long)]
    pub json: bool,
    /// What to probe: `auto` probes the CPU and every NVIDIA GPU found (saying so when
    /// none is); `cpu` only the CPU; `cuda` only the GPUs, and fails (exit 2) without an
    /// NVIDIA driver.
    #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
    pub device: String,
    /// GPU self-test: run every GPU kernel and library call once on small inputs, compare
    /// with CPU references, print pass/fail per kernel (exit 1 on any failure). Writes
    /// nothing. The first thing to run on a new GPU machine.
    #[arg(long)]
    pub check: bool,
    /// Also measure how fast storage is read (large files sequentially; 100 KiB files in a
    /// random order, as an image dataset): test files are written under PATH (default: the
    /// temporary folder), read back with O_DIRECT where possible, and removed.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    pub io: Option<Option<PathBuf>>,
    /// Largest message of the communication sweeps (under mpirun): e.g. 256M (default),
    /// 4G.
    #[arg(long, default_value = "256M", value_name = "BYTES", value_parser = parse_bytes)]
    pub max_size: usize,
    /// Under mpirun: seconds a rank waits for the others in one operation before the run
    /// ends with a message naming who did not answer (a rank died or hangs).
    #[arg(long, default_value = "60", value_name = "SECONDS", value_parser = parse_seconds)]
    pub comm_timeout: Duration,
}

/// `256M`, `4G`, `1024`: bytes (binary multiples).
fn parse_bytes(s: &str) -> Result<usize, String> {
    let t = s.trim();
    let (num, mult) = match t.chars().last() {
        Some('k' | 'K') => (&t[..t.len() - 1], 1usize << 10),
        Some('m' | 'M') => (&t[..t.len() - 1], 1 << 20),
        Some('g' | 'G') => (&t[..t.len() - 1], 1 << 30),
        _ => (t, 1),
    };
    let v: usize = num
        .parse()
        .map_err(|_| format!("`{s}`: expected bytes such as 1048576, 256M or 4G"))?;
    let bytes = v
        .checked_mul(mult)
        .ok_or_else(|| format!("`{s}` is too large"))?;
    if !(8..=(2usize << 30) - 1).contains(&bytes) && bytes != 2 << 30 {
        return Err(format!("`{s}`: give 8 bytes to 2G (MPI counts are 32-bit)"));
    }
    Ok(bytes)
}

fn parse_seconds(s: &str) -> Result<Duration, String> {
    let v: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: expected seconds, e.g. 60"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("`{s}`: give 0 < seconds ≤ 86400"));
    }
    Ok(Duration::from_secs_f64(v))
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Run(e)
    }
}

impl ProbeArgs {
    fn io_path(&self) -> PathBuf {
        match &self.io {
            Some(Some(p)) => p.clone(),
            _ => std::env::temp_dir(),
        }
    }
}

/// The sections of this run: `--only`, plus `io` when `--io` was given.
fn sections_of(a: &ProbeArgs) -> Result<Vec<Section>, Failure> {
    let mut s = parse_only(a.only.as_deref()).map_err(Failure::Input)?;
    if a.io.is_some() && !s.contains(&Section::Io) {
        s.push(Section::Io);
    }
    Ok(s)
}

/// Whether GPUs are probed, and why not; `--device cuda` without a driver is an input error.
fn gpu_status(device: &str, sections: &[Section]) -> Result<Result<usize, String>, Failure> {
    let status = match (device, gpu_probe::init()) {
        ("cpu", _) => Err("GPUs not probed (--device cpu)".to_string()),
        ("cuda", Err(e)) => return Err(Failure::Input(anyhow!("--device cuda: {e}"))),
        (_, Err(e)) => Err(e.to_string()),
        (_, Ok(n)) => Ok(n),
    };
    if let Err(why) = &status {
        if sections.iter().all(|s| *s == Section::Copy) {
            return Err(Failure::Input(anyhow!(
                "--only copy measures GPU copies, and no GPU is probed: {why}"
            )));
        }
    }
    Ok(status)
}

/// The cores for the `all` ceilings (`--threads` checked), and all the machine's cores.
pub(crate) fn cores_for(threads: Option<usize>) -> Result<(Vec<usize>, Vec<usize>), Failure> {
    let allowed = roofline_kernels::affinity::allowed_cpus();
    let machine_cores =
        roofline_collectors::one_cpu_per_core(Path::new(roofline_collectors::SYSFS_CPU), &allowed);
    let mut cores = machine_cores.clone();
    if let Some(n) = threads {
        if n == 0 || n > cores.len() {
            return Err(Failure::Input(anyhow!(
                "--threads {n}: this machine lets roofline use {} cores; give 1 to {}",
                cores.len(),
                cores.len()
            )));
        }
        cores.truncate(n);
    }
    Ok((cores, machine_cores))
}

fn progress_bar(show: bool) -> Bar {
    let bar = (show && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    Bar(bar)
}

fn install_ctrlc() -> Result<(), Failure> {
    ctrlc::set_handler(|| CANCEL.store(true, Ordering::SeqCst))
        .map_err(|e| Failure::Run(anyhow!("cannot install the Ctrl-C handler: {e}")))
}

/// `roofline probe`.
pub fn probe(a: ProbeArgs) -> Result<(), Failure> {
    let sections = sections_of(&a)?;
    if let Some(n) = roofline_kernels::comm::launched_ranks() {
        #[cfg(feature = "mpi")]
        {
            let _ = n;
            return distributed::probe(&a, &sections);
        }
        #[cfg(not(feature = "mpi"))]
        return Err(Failure::Input(anyhow!(
            "started by an MPI launcher with {n} ranks, but this roofline was built without MPI: rebuild it with `cargo build --release --features mpi` (needs an MPI library and libclang: Debian's openmpi-bin libopenmpi-dev libclang-dev), or run it without mpirun"
        )));
    }
    if sections.iter().all(|s| *s == Section::Comm) {
        return Err(Failure::Input(anyhow!(
            "--only comm measures communication between MPI ranks, and this run is a world of one: start it as `mpirun -np N roofline probe --only comm` (a build with --features mpi)"
        )));
    }
    let gpu_count = gpu_status(&a.device, &sections)?;
    let (cores, machine_cores) = cores_for(a.threads)?;
    check_writable(&a.output).map_err(Failure::Input)?;
    install_ctrlc()?;
    let start = Instant::now();
    let progress = progress_bar(true);
    let mut m = if sections.iter().any(|s| s.on_node()) {
        probe_node(
            &a,
            &sections,
            &gpu_count,
            &cores,
            &machine_cores,
            &progress,
            start,
        )?
    } else {
        bare_machine(&a, &machine_cores, start)
    };
    if sections.contains(&Section::Comm) {
        m.provenance.notes.push(
            "no communication measured: a world of one (run it under mpirun -np N, built with --features mpi)".into(),
        );
    }
    if sections.contains(&Section::Io) {
        io_probe(&a, &mut m, &progress)?;
    }
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
    }
    m.provenance.duration_s = start.elapsed().as_secs_f64();
    finish(&a, &m)
}

/// The storage probe into `m`.
fn io_probe(a: &ProbeArgs, m: &mut Machine, progress: &dyn Progress) -> Result<(), Failure> {
    let path = a.io_path();
    let label = if a.io.as_ref().is_some_and(|p| p.is_some()) {
        roofline_kernels::io::label_for(&path)
    } else {
        "tmp".to_string()
    };
    let readers = roofline_kernels::affinity::allowed_cpus().len().clamp(2, 8);
    let cfg = roofline_kernels::io::IoConfig {
        path,
        readers,
        quick: a.quick,
    };
    match roofline_kernels::io::run(&cfg, &label, &CANCEL, progress) {
        Ok(r) => {
            m.ceilings.extend(r.ceilings);
            m.provenance.notes.extend(r.notes);
            Ok(())
        }
        Err(roofline_kernels::ProbeError::Interrupted) => Err(Failure::Interrupted),
        Err(roofline_kernels::ProbeError::Io(e)) => Err(Failure::Input(anyhow!("--io: {e}"))),
        Err(e) => Err(Failure::Run(anyhow!("storage probe failed: {e}"))),
    }
}

/// Writes machine.json and prints the table (or the JSON).
fn finish(a: &ProbeArgs, m: &Machine) -> Result<(), Failure> {
    if CANCEL.load(Ordering::SeqCst) {
        return Err(Failure::Interrupted);
    }
    let text = m.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    if a.json {
        println!("{text}");
    } else {
        output::machine_table(m);
        println!(
            "\nwrote {} ({:.0} s); draw it with: roofline plot {}",
            a.output.display(),
            m.provenance.duration_s,
            a.output.display()
        );
    }
    Ok(())
}

pub(crate) fn provenance(cpu: roofline_model::CpuInfo, quick: bool, start: Instant) -> Provenance {
    Provenance {
        tool: format!("roofline {}", env!("CARGO_PKG_VERSION")),
        git_revision: option_env!("ROOFLINE_GIT_REVISION")
            .filter(|s| !s.is_empty())
            .map(String::from),
        command_line: std::env::args().collect(),
        compiler: env!("ROOFLINE_RUSTC_VERSION").to_string(),
        libraries: env!("ROOFLINE_LIBRARIES")
            .split(", ")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        time_utc: roofline_collectors::now_utc(),
        host: roofline_collectors::hostname(),
        os: roofline_collectors::os_name(),
        kernel: roofline_collectors::kernel_release(),
        cpu,
        devices: Vec::new(),
        gpus: Vec::new(),
        notes: Vec::new(),
        cluster: None,
        quick,
        duration_s: start.elapsed().as_secs_f64(),
    }
}

/// A machine.json with provenance only (no node probe was asked).
fn bare_machine(a: &ProbeArgs, machine_cores: &[usize], start: Instant) -> Machine {
    let ident = roofline_collectors::cpu_ident();
    let cpu = roofline_collectors::cpu_info(&ident, machine_cores.len());
    Machine {
        schema: MACHINE_SCHEMA.into(),
        provenance: provenance(cpu, a.quick, start),
        ceilings: Vec::new(),
        curves: Vec::new(),
        tables: Vec::new(),
        nodes: Vec::new(),
    }
}

/// This node's own ceilings: its CPU and its GPUs.
fn probe_node(
    a: &ProbeArgs,
    sections: &[Section],
    gpu_count: &Result<usize, String>,
    cores: &[usize],
    machine_cores: &[usize],
    progress: &Bar,
    start: Instant,
) -> Result<Machine, Failure> {
    let ident = roofline_collectors::cpu_ident();
    let mut cpu = roofline_collectors::cpu_info(&ident, machine_cores.len());
    let cfg = cpu_probe::CpuConfig {
        cores: cores.to_vec(),
        caches: cpu.caches.clone(),
        vendor: ident.vendor.clone(),
        family: ident.family,
        model: ident.model,
        quick: a.quick,
        sections: sections.to_vec(),
    };
    let clear = || {
        if let Some(b) = &progress.0 {
            b.finish_and_clear();
        }
    };
    let result = if a.device == "cuda" {
        Ok(cpu_probe::CpuResult::default())
    } else {
        cpu_probe::run(&cfg, &CANCEL, progress)
    };
    let mut result = match result {
        Ok(r) => r,
        Err(roofline_kernels::ProbeError::Interrupted) => {
            clear();
            return Err(Failure::Interrupted);
        }
        Err(e) => {
            clear();
            return Err(Failure::Run(anyhow!("probe failed: {e}")));
        }
    };
    let mut gpus = Vec::new();
    let mut gpu_libraries = Vec::new();
    match gpu_count {
        Err(why) => {
            if a.device == "auto" && !a.json {
                eprintln!("roofline: no GPU found, probing the CPU only ({why})");
            }
            result.notes.push(format!("no GPU found: {why}"))
        }
        Ok(_) => {
            let mode = if a.quick {
                gpu_probe::Mode::Quick
            } else {
                gpu_probe::Mode::Full
            };
            let gpu = run_gpus(mode, &cfg.sections, progress);
            clear();
            let g = gpu?;
            result.ceilings.extend(g.ceilings);
            result.curves.extend(g.curves);
            result.tables.extend(g.tables);
            result.notes.extend(g.notes);
            gpus = g.gpus;
            gpu_libraries = gpu_probe::library_versions();
        }
    }
    if !result.simd.is_empty() {
        cpu.simd = result.simd.clone();
    }
    // /proc/cpuinfo's names of the features the probes use.
    cpu.features = ["fma", "avx2", "avx512f", "avx512_bf16", "avx512_vnni"]
        .iter()
        .filter(|f| ident.flags.contains(**f))
        .map(|f| f.to_string())
        .collect();
    cpu.measured_clock_hz_t1 = result.clock_t1.clone();
    cpu.measured_clock_hz_all = result.clock_all.clone();
    let mut notes = result.notes.clone();
    cpu.shared_cores = roofline_model::SharedCores::detect(&cpu, &result.ceilings);
    if let Some(s) = &cpu.shared_cores {
        notes.push(format!(
            "the cores were shared while the all-core ceilings ran: the all-core clock was {:.0}% of the one-core clock (two vCPUs on one physical core, or another load); {} `all` ceilings are marked as measured in that state (provenance.cpu.shared_cores) and understate this machine: probe again when it is idle",
            100.0 * s.ratio,
            s.ceilings.len()
        ));
    }
    if cores.len() < machine_cores.len() {
        notes.push(format!(
            "the `all` ceilings ran on {} of the {} cores roofline may use (--threads {})",
            cores.len(),
            machine_cores.len(),
            cores.len()
        ));
    }
    let mut p = provenance(cpu, a.quick, start);
    p.libraries.extend(gpu_libraries);
    p.devices = gpus
        .iter()
        .map(|g| {
            format!(
                "gpu{}: {} (sm_{}, {} SMs, {})",
                g.index,
                g.name,
                g.compute_capability.replace('.', ""),
                g.sm_count,
                roofline_plots::si(g.memory_bytes as f64) + "B"
            )
        })
        .collect();
    p.gpus = gpus;
    p.notes = notes;
    Ok(Machine {
        schema: MACHINE_SCHEMA.into(),
        provenance: p,
        ceilings: result.ceilings,
        curves: result.curves,
        tables: result.tables,
        nodes: Vec::new(),
    })
}

/// The aggregate compute ceilings of a distributed run: every compute ceiling that every node
/// has, summed (`agg/<id>`); its statistics are those of the per-node values.
#[cfg_attr(not(feature = "mpi"), allow(dead_code))]
pub fn aggregate(nodes: &[Machine]) -> Vec<roofline_model::Ceiling> {
    let Some(first) = nodes.first() else {
        return Vec::new();
    };
    first
        .ceilings
        .iter()
        .filter(|c| c.kind == roofline_model::CeilingKind::Compute)
        .filter_map(|c| {
            let all: Vec<&roofline_model::Ceiling> =
                nodes.iter().filter_map(|m| m.ceiling(&c.id)).collect();
            if all.len() != nodes.len() {
                return None;
            }
            let values: Vec<f64> = all.iter().map(|x| x.value).collect();
            let mut agg = c.clone();
            agg.id = format!("agg/{}", c.id);
            agg.value = values.iter().sum();
            agg.stats = roofline_model::Stats::from_samples(&values)?;
            agg.threads = all.iter().map(|x| x.threads).sum();
            agg.theoretical_peak = all
                .iter()
                .map(|x| x.theoretical_peak.clone())
                .collect::<Option<Vec<_>>>()
                .map(|peaks| {
                    let mut p = peaks[0].clone();
                    p.value = peaks.iter().map(|q| q.value).sum();
                    p.source = format!("sum over {} nodes of: {}", nodes.len(), p.source);
                    p
                });
            agg.method = format!(
                "sum over the {} nodes of {} (each node probed itself, concurrently); stats are the per-node values",
                nodes.len(),
                c.id
            );
            agg.flag_against_peak();
            Some(agg)
        })
        .collect()
}

/// NVML, opened from where the CUDA library search found libnvidia-ml.
pub(crate) fn open_nvml() -> Result<std::sync::Arc<roofline_collectors::nvml::Nvml>, String> {
    let path = roofline_kernels::cuda::libs::locate(roofline_kernels::cuda::libs::Lib::Nvml);
    roofline_collectors::nvml::open(path.as_deref())
}

/// Probes every GPU with NVML sampling clocks, power, temperature and throttle reasons.
fn run_gpus(
    mode: gpu_probe::Mode,
    sections: &[Section],
    progress: &dyn Progress,
) -> Result<gpu_probe::GpuResult, Failure> {
    let peaks = roofline_model::PeakDb::builtin().map_err(|e| Failure::Run(e.into()))?;
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
    };
    let enrich = |g: &mut roofline_model::GpuInfo| roofline_collectors::nvml::inventory(&nvml, g);
    let result = gpu_probe::run(&cfg, &CANCEL, progress, &peaks, &enrich);
    let telemetry = sampler.map(|s| s.stop()).unwrap_or_default();
    let mut r = match result {
        Ok(r) => r,
        Err(roofline_kernels::cuda::CudaError::Interrupted) => return Err(Failure::Interrupted),
        Err(e) => return Err(Failure::Run(anyhow!("GPU probe failed: {e}"))),
    };
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

/// `roofline probe --check`: every GPU kernel once, against CPU references.
pub fn gpu_check(device: &str) -> Result<(), Failure> {
    if device == "cpu" {
        return Err(Failure::Input(anyhow!(
            "--check tests the GPU kernels; it does not go with --device cpu (the CPU probes check themselves on every run)"
        )));
    }
    if let Err(e) = gpu_probe::init() {
        return Err(Failure::Input(anyhow!("--check: {e}")));
    }
    install_ctrlc()?;
    let peaks = roofline_model::PeakDb::builtin().map_err(|e| Failure::Run(e.into()))?;
    let cfg = gpu_probe::GpuConfig {
        mode: gpu_probe::Mode::Check,
        sections: Section::ALL.to_vec(),
    };
    let nvml = open_nvml();
    let enrich = |g: &mut roofline_model::GpuInfo| roofline_collectors::nvml::inventory(&nvml, g);
    let r = match gpu_probe::run(
        &cfg,
        &CANCEL,
        &roofline_kernels::probe::Silent,
        &peaks,
        &enrich,
    ) {
        Ok(r) => r,
        Err(roofline_kernels::cuda::CudaError::Interrupted) => return Err(Failure::Interrupted),
        Err(e) => return Err(Failure::Run(anyhow!("GPU self-test could not run: {e}"))),
    };
    let failed = output::check_table(&r);
    if failed > 0 {
        return Err(Failure::Run(anyhow!("{failed} GPU kernel check(s) failed")));
    }
    Ok(())
}

/// The probe under mpirun / srun: every node probes itself concurrently (its lowest rank; the
/// other ranks sleep), then every rank takes part in the communication probes, the root probes
/// storage if asked, gathers the nodes' results, and writes machine.json alone.
#[cfg(feature = "mpi")]
mod distributed {
    use super::*;
    use roofline_kernels::comm::mpi::{CommConfig, World};
    use roofline_model::NodeCeilings;

    /// The error with this rank named.
    fn on_rank(e: Failure, who: &str) -> Failure {
        match e {
            Failure::Input(e) => Failure::Input(anyhow!("{who}: {e:#}")),
            Failure::Run(e) => Failure::Run(anyhow!("{who}: {e:#}")),
            other => other,
        }
    }

    pub fn probe(a: &ProbeArgs, sections: &[Section]) -> Result<(), Failure> {
        let world = World::init(a.comm_timeout).map_err(|e| Failure::Input(anyhow!("MPI: {e}")))?;
        let root = world.is_root();
        let who = format!("rank {} ({})", world.rank, world.hosts[world.rank]);
        // The launcher bound each rank to a core; the rank that probes its node needs them all.
        let mut widened = None;
        if world.is_leader() {
            let (before, after) =
                roofline_kernels::affinity::widen_to(&roofline_collectors::node_cpus());
            if after != before {
                widened = Some(format!(
                    "node leaders widened their CPU affinity from {before} to {after} CPUs for the node probe (the MPI launcher had bound them)"
                ));
            }
        }
        // Input: each rank checks what concerns it (its GPUs, its cores), the root the output.
        let checked = (|| -> Result<_, Failure> {
            let gpu_count = gpu_status(&a.device, sections)?;
            let cores = cores_for(a.threads)?;
            if root {
                check_writable(&a.output).map_err(Failure::Input)?;
            }
            Ok((gpu_count, cores))
        })();
        if world.any(checked.is_err()) {
            return Err(match checked {
                Err(e) => on_rank(e, &who),
                Ok(_) => Failure::Quiet(2),
            });
        }
        let (gpu_count, (cores, machine_cores)) = checked?;
        install_ctrlc()?;
        let start = Instant::now();
        let progress = progress_bar(root);
        let clear = || {
            if let Some(b) = &progress.0 {
                b.finish_and_clear();
            }
        };
        // 1. Every node probes its own CPU and GPUs, all nodes at once.
        let node_sections: Vec<Section> =
            sections.iter().copied().filter(|s| s.on_node()).collect();
        let local = world.is_leader().then(|| {
            if node_sections.is_empty() {
                Ok(bare_machine(a, &machine_cores, start))
            } else {
                probe_node(
                    a,
                    &node_sections,
                    &gpu_count,
                    &cores,
                    &machine_cores,
                    &progress,
                    start,
                )
            }
        });
        world.wait_unbounded();
        if world.any(matches!(local, Some(Err(_)))) {
            clear();
            return Err(match local {
                Some(Err(e)) => on_rank(e, &who),
                _ => Failure::Quiet(1),
            });
        }
        // 2. Communication: intra-node, inter-node, world.
        let mut comm = None;
        if sections.contains(&Section::Comm) {
            let cfg = CommConfig {
                max_size: a.max_size,
                quick: a.quick,
            };
            let silent = roofline_kernels::probe::Silent;
            let shown: &dyn Progress = if root { &progress } else { &silent };
            match world.comm_probe(&cfg, shown) {
                Ok(r) => comm = Some(r),
                Err(e) => {
                    clear();
                    eprintln!("roofline: error: {who}: {e}; nothing was written");
                    world.abort(1);
                }
            }
        }
        // 3. Storage, on the root only (the others sleep meanwhile).
        let mut io_part: Option<Machine> = None;
        if root && sections.contains(&Section::Io) {
            let mut m = bare_machine(a, &machine_cores, start);
            match io_probe(a, &mut m, &progress) {
                Ok(()) => io_part = Some(m),
                Err(e) => {
                    clear();
                    match e {
                        Failure::Input(e) | Failure::Run(e) => {
                            eprintln!("roofline: error: {who}: {e:#}")
                        }
                        _ => eprintln!("roofline: interrupted; nothing was written"),
                    }
                    world.abort(1);
                }
            }
        }
        world.wait_unbounded();
        // 4. Every node's result to the root.
        let bytes = match &local {
            Some(Ok(m)) => m.to_json().map(String::into_bytes).unwrap_or_default(),
            _ => Vec::new(),
        };
        let gathered = world.gather_from_leaders(&bytes);
        if !root {
            return Ok(());
        }
        clear();
        let mut nodes = Vec::new();
        for (i, b) in gathered.unwrap_or_default().iter().enumerate() {
            let text = String::from_utf8_lossy(b);
            nodes.push(
                Machine::from_json(&text).map_err(|e| {
                    Failure::Run(anyhow!("node {i}'s result could not be read: {e}"))
                })?,
            );
        }
        let Some(mut m) = nodes.first().cloned() else {
            return Err(Failure::Run(anyhow!("no node result reached the root")));
        };
        m.provenance.cluster = Some(world.cluster_info());
        if world.layout.fake {
            m.provenance.notes.push(format!(
                "ROOFLINE_FAKE_NODES: {} pretend nodes on one host (for tests): they took turns for the node probe, and their \"inter-node\" communication is shared memory",
                world.layout.nodes()
            ));
        }
        if node_sections.iter().any(|s| s.on_node()) {
            m.provenance.notes.extend(widened);
        }
        if nodes.len() > 1 && node_sections.iter().any(|s| s.on_node()) {
            m.ceilings.extend(aggregate(&nodes));
            m.nodes = nodes
                .iter()
                .enumerate()
                .map(|(i, n)| NodeCeilings {
                    node: i,
                    host: n.provenance.host.clone(),
                    ceilings: n.ceilings.clone(),
                })
                .collect();
        }
        if let Some(c) = comm {
            m.ceilings.extend(c.ceilings);
            m.curves.extend(c.curves);
            m.provenance.notes.extend(c.notes);
        }
        if let Some(io) = io_part {
            m.ceilings.extend(io.ceilings);
            m.provenance.notes.extend(io.provenance.notes);
        }
        m.provenance.duration_s = start.elapsed().as_secs_f64();
        finish(a, &m)
    }
}
