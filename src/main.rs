//! The `roofline` command line. Only argument handling, output and exit codes live here.

mod output;
mod probe_cmd;
mod train_cmd;

use anyhow::anyhow;
use clap::{Parser, Subcommand};
use roofline_model::{write::write_atomic, Machine};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// Set by Ctrl-C; the probe stops at the next sample and nothing is written.
pub(crate) static CANCEL: AtomicBool = AtomicBool::new(false);

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
        /// Also measure how fast storage is read (large files sequentially; 100 KiB files in a
        /// random order, as an image dataset): test files are written under PATH (default: the
        /// temporary folder), read back with O_DIRECT where possible, and removed.
        #[arg(long, value_name = "PATH", num_args = 0..=1)]
        io: Option<Option<PathBuf>>,
        /// Largest message of the communication sweeps (under mpirun): e.g. 256M (default),
        /// 4G.
        #[arg(long, default_value = "256M", value_name = "BYTES", value_parser = parse_bytes)]
        max_size: usize,
        /// Under mpirun: seconds a rank waits for the others in one operation before the run
        /// ends with a message naming who did not answer (a rank died or hangs).
        #[arg(long, default_value = "60", value_name = "SECONDS", value_parser = parse_seconds)]
        comm_timeout: Duration,
    },
    /// Train a workload with the embedded trainer and report throughput, loss and accuracy.
    ///
    /// ResNet-50 v1.5 (or v1) on a synthetic, learnable image set or an ImageNet-style JPEG
    /// folder: SGD with momentum 0.9 and weight decay 1e-4, learning rate 0.1 per 256 images
    /// scaled with the batch, linear warm-up then cosine decay. Prints images/s, the loss and
    /// Top-1/Top-5 on held-out images; --json gives the parameter count, images/s, achieved
    /// FLOP/s and FLOPs per image (AIPerf's and HPC AI500 V3.0's rules). Under mpirun (a build
    /// with --features mpi) the ranks train data-parallel on shares of the global batch.
    /// Examples:
    ///   roofline train --workload resnet50 --synthetic --batch 32 --steps 20
    ///   roofline train --data /data/imagenet --epochs 1 --eval-images 5000 --checkpoint r50.safetensors
    Train(Box<train_cmd::TrainArgs>),
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
        /// Which roofline: `classic` (FLOP per byte of memory traffic); `node-coi` (HPC AI500:
        /// FLOP per byte communicated, one node: its compute roofs, intra-node communication
        /// and memory as slanted roofs); `dist-coi` (the aggregate of all nodes against the
        /// inter-node network). The COI models need a probe run under mpirun.
        #[arg(long, default_value = "classic", value_parser = ["classic", "node-coi", "dist-coi"])]
        model: String,
    },
    /// Show the theoretical-peak database (accelerators, and the CPU rule).
    Peaks {
        /// Print the database as JSON.
        #[arg(long)]
        json: bool,
    },
}

/// How the command ended.
pub(crate) enum Failure {
    /// Bad input: exit 2.
    Input(anyhow::Error),
    /// Interrupted: exit 130, nothing written.
    Interrupted,
    /// A probe failed (e.g. a result check): exit 1.
    Run(anyhow::Error),
    /// Under mpirun: another rank failed and said why; exit with this code, silently.
    #[cfg_attr(not(feature = "mpi"), allow(dead_code))]
    Quiet(u8),
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

fn main() -> ExitCode {
    // Like other Unix tools, end quietly when the reader of stdout goes away (`roofline peaks |
    // head`) instead of panicking on a broken pipe.
    #[cfg(unix)]
    // SAFETY: restoring the default disposition of SIGPIPE before any thread exists.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
    let cli = Cli::parse();
    // Under mpirun every verb runs on every rank; apart from `probe` (which gathers) and `train`
    // (data parallel), only rank 0 acts, so that one plot is written and one table printed.
    if !matches!(cli.command, Command::Probe { .. } | Command::Train(_))
        && roofline_kernels::comm::launched_rank().is_some_and(|r| r != 0)
    {
        return ExitCode::SUCCESS;
    }
    let result = match cli.command {
        Command::Probe {
            output,
            quick,
            only,
            threads,
            json,
            device,
            check,
            io,
            max_size,
            comm_timeout,
        } => {
            if check {
                probe_cmd::gpu_check(&device)
            } else {
                probe_cmd::probe(probe_cmd::ProbeArgs {
                    output,
                    quick,
                    only,
                    threads,
                    json,
                    device,
                    io,
                    max_size,
                    comm_timeout,
                })
            }
        }
        Command::Train(args) => train_cmd::train(&args),
        Command::Kernels { arch, json } => output::kernels(&arch, json).map_err(Failure::Input),
        Command::Plot {
            machine,
            output,
            threads,
            op,
            device,
            model,
        } => plot(&machine, &output, &threads, &op, &device, &model),
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
        Err(Failure::Quiet(code)) => ExitCode::from(code),
    }
}

fn plot(
    machine: &Path,
    output: &Path,
    threads: &str,
    op: &str,
    device: &str,
    model: &str,
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
    probe_cmd::check_writable(output).map_err(Failure::Input)?;
    let opt = roofline_plots::ClassicOptions {
        model: roofline_plots::Model::parse(model).unwrap_or(roofline_plots::Model::Classic),
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
