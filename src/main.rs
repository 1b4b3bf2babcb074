//! The `roofline` command line. Only argument handling, output and exit codes live here.

mod output;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use roofline_kernels::probe::{cpu as cpu_probe, gpu as gpu_probe, Progress, Section};
use roofline_model::{write::write_atomic, Machine, Provenance, MACHINE_SCHEMA};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// Set by Ctrl-C; the probe stops at the next sample and nothing is written.
static CANCEL: AtomicBool = AtomicBool::new(false);

#[derive(Parser)]
#[command(
    name = "roofline",
    version,
    about = "Measure what a machine can do (compute, memory ceilings) and draw its roofline",
    long_about = "roofline measures a machine's ceilings (peak FMA, GEMM and convolution per precision; \
bandwidth of every cache level and of DRAM) and writes them to machine.json; `roofline plot` draws \
the roofline from that file.\n\nTypical use:\n  roofline probe              # about 2 minutes; writes machine.json\n  \
roofline probe --quick      # under 30 s, same ceilings, fewer repeats\n  roofline plot machine.json  # writes roofline.svg"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Measure this machine's ceilings and write machine.json.
    ///
    /// Every probe checks its own result. Compute: peak FMA (f64, f32; bf16 and int8 dot products
    /// where the CPU has them), GEMM (f64, f32, f16) over square and ResNet-50 shapes, convolution
    /// over ResNet-50's layer shapes. Memory: a working-set sweep from 4 KiB to 4x the last-level
    /// cache (at least 512 MiB) for read, write, copy and triad; its plateaus become the L1, L2,
    /// L3 and DRAM ceilings. Each on one thread (ids ending in /t1) and one pinned thread per core
    /// (/all). Ctrl-C stops the probe and writes nothing.
    ///
    /// With an NVIDIA driver present (or --device cuda), every GPU is measured too, each result
    /// checked against a CPU reference: FMA and tensor-core (mma.sync) peaks per precision, an
    /// L2/HBM bandwidth sweep and the ERT FLOPs-per-element curve, cuBLAS/cuBLASLt GEMM, cuDNN
    /// convolution (forward and both backward passes), host/device and peer copies. Run
    /// `roofline probe --check` first on a new GPU machine.
    Probe {
        /// Where to write the result.
        #[arg(short, long, default_value = "machine.json")]
        output: PathBuf,
        /// Fewer repeats and a coarser sweep (same ceiling ids); under 30 s on 2 cores.
        #[arg(long)]
        quick: bool,
        /// Measure only these sections, comma-separated: fma, mem, gemm, conv, copy (copy:
        /// host-device and peer copies, GPUs only).
        #[arg(long, value_name = "LIST")]
        only: Option<String>,
        /// Threads for the `all` ceilings (default: one per physical core).
        #[arg(long, value_name = "N")]
        threads: Option<usize>,
        /// Print machine.json on stdout instead of the table (the file is written too).
        #[arg(long)]
        json: bool,
        /// What to probe: `auto` probes the CPU and every NVIDIA GPU found (saying so when
        /// none is); `cpu` only the CPU; `cuda` only the GPUs, and fails (exit 2) without an
        /// NVIDIA driver.
        #[arg(long, default_value = "auto", value_parser = ["auto", "cpu", "cuda"])]
        device: String,
        /// GPU self-test: run every GPU kernel and library call once on small inputs, compare
        /// with CPU references, print pass/fail per kernel (exit 1 on any failure). Writes
        /// nothing. The first thing to run on a new GPU machine.
        #[arg(long)]
        check: bool,
    },
    /// List the CUDA kernels roofline compiles at run time, with NVRTC's resource report.
    ///
    /// Compiles every kernel source (kernels/cuda/*.cu, built into the binary) with NVRTC to
    /// SASS for each architecture and shows registers per thread, shared memory and spills;
    /// no GPU is needed, only NVRTC (libnvrtc: the CUDA toolkit, or the pip wheel
    /// nvidia-cuda-nvrtc-cu12 with ROOFLINE_CUDA_LIBS pointing at its site-packages/nvidia).
    Kernels {
        /// Architectures (compute capability × 10), comma-separated.
        #[arg(long, default_value = "80,90", value_name = "LIST")]
        arch: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Draw the classic roofline of a machine.json as SVG.
    ///
    /// Log-log: operational intensity (FLOP per byte of memory traffic) against FLOP/s. Every
    /// memory level is a slanted roof, every compute ceiling a flat one, theoretical peaks are
    /// dashed, and the ridge points (where a bandwidth roof meets the top compute roof) are marked.
    Plot {
        /// The machine.json written by `roofline probe`.
        machine: PathBuf,
        /// Where to write the SVG.
        #[arg(short, long, default_value = "roofline.svg")]
        output: PathBuf,
        /// Which ceilings: those of one thread (t1) or of one thread per core (all).
        #[arg(long, default_value = "all", value_parser = ["all", "t1"])]
        threads: String,
        /// Which memory operation's ceilings form the slanted roofs.
        #[arg(long, default_value = "triad", value_parser = ["read", "write", "copy", "triad"])]
        op: String,
        /// Whose roofline: `cpu`, or a GPU of the machine.json (`gpu0`, `gpu1`, ...): its FMA,
        /// mma and GEMM roofs, its L2 and HBM roofs, and its measured ERT curve.
        #[arg(long, default_value = "cpu", value_name = "cpu|gpuN")]
        device: String,
    },
    /// Show the theoretical-peak database (accelerators, and the CPU rule).
    Peaks {
        /// Print the database as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// How the command ended.
enum Failure {
    /// Bad input: exit 2.
    Input(anyhow::Error),
    /// Interrupted: exit 130, nothing written.
    Interrupted,
    /// A probe failed (e.g. a result check): exit 1.
    Run(anyhow::Error),
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Run(e)
    }
}

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`roofline peaks |
    // head`) instead of panicking on a broken pipe.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Probe {
            output,
            quick,
            only,
            threads,
            json,
            device,
            check,
        } => {
            if check {
                gpu_check(&device)
            } else {
                probe(&output, quick, only.as_deref(), threads, json, &device)
            }
        }
        Command::Kernels { arch, json } => output::kernels(&arch, json).map_err(Failure::Input),
        Command::Plot {
            machine,
            output,
            threads,
            op,
            device,
        } => plot(&machine, &output, &threads, &op, &device),
        Command::Peaks { json } => output::peaks(json).map_err(Failure::Input),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(e)) => {
            eprintln!("roofline: error: {e:#}");
            ExitCode::from(2)
        }
        Err(Failure::Interrupted) => {
            eprintln!("roofline: interrupted; nothing was written");
            ExitCode::from(130)
        }
        Err(Failure::Run(e)) => {
            eprintln!("roofline: error: {e:#}");
            ExitCode::from(1)
        }
    }
}

/// Parses `--only`.
fn parse_only(only: Option<&str>) -> Result<Vec<Section>, anyhow::Error> {
    let Some(list) = only else {
        return Ok(Section::ALL.to_vec());
    };
    let mut v = Vec::new();
    for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let s = Section::parse(item).ok_or_else(|| {
            anyhow!("unknown --only entry `{item}`; expected a comma-separated list of: fma, mem, gemm, conv, copy")
        })?;
        if !v.contains(&s) {
            v.push(s);
        }
    }
    if v.is_empty() {
        return Err(anyhow!(
            "--only is empty; expected a comma-separated list of: fma, mem, gemm, conv, copy"
        ));
    }
    Ok(v)
}

/// Fails early (before minutes of probing) when `path` cannot be written.
fn check_writable(path: &Path) -> Result<(), anyhow::Error> {
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

fn probe(
    output: &Path,
    quick: bool,
    only: Option<&str>,
    threads: Option<usize>,
    json: bool,
    device: &str,
) -> Result<(), Failure> {
    let sections = parse_only(only).map_err(Failure::Input)?;
    // With --device cuda and no driver, say so before any work.
    let gpu_count = match (device, gpu_probe::init()) {
        ("cpu", _) => Err("GPUs not probed (--device cpu)".to_string()),
        ("cuda", Err(e)) => return Err(Failure::Input(anyhow!("--device cuda: {e}"))),
        (_, Err(e)) => Err(e.to_string()),
        (_, Ok(n)) => Ok(n),
    };
    if let Err(why) = &gpu_count {
        if sections.iter().all(|s| *s == Section::Copy) {
            return Err(Failure::Input(anyhow!(
                "--only copy measures GPU copies, and no GPU is probed: {why}"
            )));
        }
    }
    check_writable(output).map_err(Failure::Input)?;
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
    ctrlc::set_handler(|| CANCEL.store(true, Ordering::SeqCst))
        .map_err(|e| Failure::Run(anyhow!("cannot install the Ctrl-C handler: {e}")))?;

    let ident = roofline_collectors::cpu_ident();
    let mut cpu = roofline_collectors::cpu_info(&ident, machine_cores.len());
    let cfg = cpu_probe::CpuConfig {
        cores: cores.clone(),
        caches: cpu.caches.clone(),
        vendor: ident.vendor.clone(),
        family: ident.family,
        model: ident.model,
        quick,
        sections,
    };
    let bar = if std::io::stderr().is_terminal() {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        Some(b)
    } else {
        None
    };
    let progress = Bar(bar);
    let start = Instant::now();
    let result = if device == "cuda" {
        Ok(cpu_probe::CpuResult::default())
    } else {
        cpu_probe::run(&cfg, &CANCEL, &progress)
    };
    let mut result = match result {
        Ok(r) => r,
        Err(roofline_kernels::ProbeError::Interrupted) => {
            if let Some(b) = &progress.0 {
                b.finish_and_clear();
            }
            return Err(Failure::Interrupted);
        }
        Err(e) => {
            if let Some(b) = &progress.0 {
                b.finish_and_clear();
            }
            return Err(Failure::Run(anyhow!("probe failed: {e}")));
        }
    };
    let mut gpus = Vec::new();
    let mut gpu_libraries = Vec::new();
    match gpu_count {
        Err(why) => {
            if device == "auto" && !json {
                eprintln!("roofline: no GPU found, probing the CPU only ({why})");
            }
            result.notes.push(format!("no GPU found: {why}"))
        }
        Ok(_) => {
            let mode = if quick {
                gpu_probe::Mode::Quick
            } else {
                gpu_probe::Mode::Full
            };
            let gpu = run_gpus(mode, &cfg.sections, &progress);
            if let Some(b) = &progress.0 {
                b.finish_and_clear();
            }
            let g = gpu?;
            result.ceilings.extend(g.ceilings);
            result.curves.extend(g.curves);
            result.tables.extend(g.tables);
            result.notes.extend(g.notes);
            gpus = g.gpus;
            gpu_libraries = gpu_probe::library_versions();
        }
    }
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
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
    if cores.len() < machine_cores.len() {
        notes.push(format!(
            "the `all` ceilings ran on {} of the {} cores roofline may use (--threads {})",
            cores.len(),
            machine_cores.len(),
            cores.len()
        ));
    }
    let machine = Machine {
        schema: MACHINE_SCHEMA.into(),
        provenance: Provenance {
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
                .chain(gpu_libraries)
                .collect(),
            time_utc: roofline_collectors::now_utc(),
            host: roofline_collectors::hostname(),
            os: roofline_collectors::os_name(),
            kernel: roofline_collectors::kernel_release(),
            cpu,
            devices: gpus
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
                .collect(),
            gpus,
            notes,
            quick,
            duration_s: start.elapsed().as_secs_f64(),
        },
        ceilings: result.ceilings,
        curves: result.curves,
        tables: result.tables,
    };
    if CANCEL.load(Ordering::SeqCst) {
        return Err(Failure::Interrupted);
    }
    let text = machine.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    if json {
        println!("{text}");
    } else {
        output::machine_table(&machine);
        println!(
            "\nwrote {} ({:.0} s); draw it with: roofline plot {}",
            output.display(),
            machine.provenance.duration_s,
            output.display()
        );
    }
    Ok(())
}

fn plot(
    machine: &Path,
    output: &Path,
    threads: &str,
    op: &str,
    device: &str,
) -> Result<(), Failure> {
    let m = Machine::read(machine).map_err(|e| Failure::Input(e.into()))?;
    let gpus: Vec<String> = m
        .provenance
        .gpus
        .iter()
        .map(|g| format!("gpu{}", g.index))
        .collect();
    if device != "cpu" && !gpus.iter().any(|g| g == device) {
        return Err(Failure::Input(anyhow!(
            "--device {device}: {} has {}; use cpu{}",
            machine.display(),
            if gpus.is_empty() {
                "no GPU".to_string()
            } else {
                format!("GPUs {}", gpus.join(", "))
            },
            if gpus.is_empty() {
                String::new()
            } else {
                format!(" or one of {}", gpus.join(", "))
            }
        )));
    }
    check_writable(output).map_err(Failure::Input)?;
    let opt = roofline_plots::ClassicOptions {
        device: device.into(),
        threads: threads.into(),
        op: op.into(),
        ..Default::default()
    };
    let svg = roofline_plots::classic_svg(&m, &opt).map_err(|e| Failure::Input(e.into()))?;
    write_atomic(output, svg.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    println!("wrote {}", output.display());
    Ok(())
}

/// Probes every GPU with NVML sampling clocks, power, temperature and throttle reasons.
fn run_gpus(
    mode: gpu_probe::Mode,
    sections: &[Section],
    progress: &dyn Progress,
) -> Result<gpu_probe::GpuResult, Failure> {
    let peaks = roofline_model::PeakDb::builtin().map_err(|e| Failure::Run(e.into()))?;
    let nvml_path = roofline_kernels::cuda::libs::locate(roofline_kernels::cuda::libs::Lib::Nvml);
    let nvml = roofline_collectors::nvml::open(nvml_path.as_deref());
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
    let enrich = |g: &mut roofline_model::GpuInfo| match &nvml {
        Ok(n) => roofline_collectors::nvml::fill_inventory(n, g),
        Err(e) => Err(format!("no NVML inventory or telemetry: {e}")),
    };
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
fn gpu_check(device: &str) -> Result<(), Failure> {
    if device == "cpu" {
        return Err(Failure::Input(anyhow!(
            "--check tests the GPU kernels; it does not go with --device cpu (the CPU probes check themselves on every run)"
        )));
    }
    if let Err(e) = gpu_probe::init() {
        return Err(Failure::Input(anyhow!("--check: {e}")));
    }
    ctrlc::set_handler(|| CANCEL.store(true, Ordering::SeqCst))
        .map_err(|e| Failure::Run(anyhow!("cannot install the Ctrl-C handler: {e}")))?;
    let peaks = roofline_model::PeakDb::builtin().map_err(|e| Failure::Run(e.into()))?;
    let cfg = gpu_probe::GpuConfig {
        mode: gpu_probe::Mode::Check,
        sections: Section::ALL.to_vec(),
    };
    let nvml_path = roofline_kernels::cuda::libs::locate(roofline_kernels::cuda::libs::Lib::Nvml);
    let nvml = roofline_collectors::nvml::open(nvml_path.as_deref());
    let enrich = |g: &mut roofline_model::GpuInfo| match &nvml {
        Ok(n) => roofline_collectors::nvml::fill_inventory(n, g),
        Err(e) => Err(format!("no NVML inventory: {e}")),
    };
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
