//! The `roofline` command line. Only argument handling, output and exit codes live here.

mod output;

use anyhow::{anyhow, Context};
use clap::{Parser, Subcommand};
use roofline_kernels::probe::{cpu as cpu_probe, Progress, Section};
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
    Probe {
        /// Where to write the result.
        #[arg(short, long, default_value = "machine.json")]
        output: PathBuf,
        /// Fewer repeats and a coarser sweep (same ceiling ids); under 30 s on 2 cores.
        #[arg(long)]
        quick: bool,
        /// Measure only these sections, comma-separated: fma, mem, gemm, conv.
        #[arg(long, value_name = "LIST")]
        only: Option<String>,
        /// Threads for the `all` ceilings (default: one per physical core).
        #[arg(long, value_name = "N")]
        threads: Option<usize>,
        /// Print machine.json on stdout instead of the table (the file is written too).
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
        } => probe(&output, quick, only.as_deref(), threads, json),
        Command::Plot {
            machine,
            output,
            threads,
            op,
        } => plot(&machine, &output, &threads, &op),
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
            anyhow!("unknown --only entry `{item}`; expected a comma-separated list of: fma, mem, gemm, conv")
        })?;
        if !v.contains(&s) {
            v.push(s);
        }
    }
    if v.is_empty() {
        return Err(anyhow!(
            "--only is empty; expected a comma-separated list of: fma, mem, gemm, conv"
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
        if let Some(b) = &self.0 {
            b.set_length(total);
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
) -> Result<(), Failure> {
    let sections = parse_only(only).map_err(Failure::Input)?;
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
    let result = cpu_probe::run(&cfg, &CANCEL, &progress);
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
    }
    let result = match result {
        Ok(r) => r,
        Err(roofline_kernels::ProbeError::Interrupted) => return Err(Failure::Interrupted),
        Err(e) => return Err(Failure::Run(anyhow!("probe failed: {e}"))),
    };

    cpu.simd = result.simd.clone();
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
    notes.push("no GPU probed: this version of roofline measures CPUs only".into());
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
                .collect(),
            time_utc: roofline_collectors::now_utc(),
            host: roofline_collectors::hostname(),
            os: roofline_collectors::os_name(),
            kernel: roofline_collectors::kernel_release(),
            cpu,
            devices: Vec::new(),
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

fn plot(machine: &Path, output: &Path, threads: &str, op: &str) -> Result<(), Failure> {
    let m = Machine::read(machine).map_err(|e| Failure::Input(e.into()))?;
    check_writable(output).map_err(Failure::Input)?;
    let opt = roofline_plots::ClassicOptions {
        threads: threads.into(),
        op: op.into(),
        ..Default::default()
    };
    let svg = roofline_plots::classic_svg(&m, &opt).map_err(|e| Failure::Input(e.into()))?;
    write_atomic(output, svg.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    println!("wrote {}", output.display());
    Ok(())
}
