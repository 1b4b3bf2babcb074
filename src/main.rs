//! The `roofline` command line. Only argument handling, output and exit codes live here.

/// `print!` to standard output, checked ([`exit::write_stdout`]).
macro_rules! out {
    ($($t:tt)*) => { $crate::exit::write_stdout(format_args!($($t)*)) };
}

/// `println!` to standard output, checked ([`exit::write_stdout`]).
macro_rules! outln {
    () => { $crate::exit::write_stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::exit::write_stdout(format_args!("{}\n", format_args!($($t)*))) };
}

mod args;
mod automl_cmd;
mod doctor_cmd;
mod exit;
mod gate_cmd;
mod output;
mod place_cmd;
mod plot_cmd;
mod probe_cmd;
mod run_args;
mod score_cmd;
mod sweep_cmd;
mod train_cmd;

use clap::{Parser, Subcommand};
use exit::{causes, Failure};
use std::process::ExitCode;

/// The system allocator plus a cache of large freed blocks, which the trainer turns on (see
/// `roofline_workloads::alloc`).
#[global_allocator]
static ALLOCATOR: roofline_workloads::alloc::Caching = roofline_workloads::alloc::Caching;

#[derive(Parser)]
#[command(
    name = "roofline",
    version,
    about = "Measure what a machine can do (compute, memory ceilings) and draw its roofline",
    long_about = "roofline measures a machine's ceilings (peak FMA, GEMM and convolution per precision; \
bandwidth of every cache level and of DRAM) and writes them to machine.json; `roofline plot` draws \
the roofline from that file.\n\nTypical use:\n  roofline probe              # about 2 minutes; writes machine.json\n  \
roofline probe --quick      # about 20 s on 2 cores, same ceilings, fewer repeats\n  \
roofline plot machine.json  # writes roofline.svg (-o roofline.html: the interactive page)"
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
    Probe(Box<probe_cmd::ProbeArgs>),
    /// Train a workload with the embedded trainer and report throughput, loss and accuracy.
    ///
    /// ResNet-50 v1.5 (or v1) on a synthetic, learnable image set or an ImageNet-style JPEG
    /// folder: SGD with momentum 0.9 and weight decay 1e-4, learning rate 0.1 per 256 images
    /// scaled with the batch, linear warm-up then cosine decay. Prints images/s, the loss and
    /// Top-1/Top-5 on held-out images; --json gives the parameter count, images/s, achieved
    /// FLOP/s and FLOPs per image (AIPerf's and HPC AI500 V3.0's rules). Under mpirun (a build
    /// with --features mpi) the ranks train data-parallel on shares of the global batch.
    ///
    /// --workload ewa trains HPC AI500's Extreme Weather detector: Faster R-CNN with a
    /// ResNet-50-FPN backbone on 16-channel fields (4 classes), on climo_<year>.h5 files
    /// (--data) or synthetic storms; learning rate 0.02 per 16 images; prints the parameter
    /// count and the FLOPs per image beside the paper's (41 M, 691 G) and mAP@0.5 on the held-out
    /// images. On the CPU, or with --device cuda on a GPU (one per rank under mpirun), as
    /// resnet50.
    ///
    /// Examples:
    ///   roofline train --workload resnet50 --synthetic --batch 32 --steps 20
    ///   roofline train --data /data/imagenet --epochs 1 --eval-images 5000 --checkpoint r50.safetensors
    ///   roofline train --workload ewa --resolution 192x288 --steps 10
    ///   roofline train --workload ewa --data /data/ewa --epochs 50 --eval-images 100 --target-map 0.35
    #[command(verbatim_doc_comment)]
    Train(Box<train_cmd::TrainArgs>),
    /// Run a workload and put it on the machine's rooflines: where it sits, what bounds it, and
    /// what to do about it.
    ///
    /// Measures achieved FLOP/s over --steps steps after --warm ones, computes its operational
    /// intensity (FLOPs per byte of the analytic minimum memory traffic) and, under mpirun, its
    /// communication intensity (COI, FLOPs per byte communicated), and holds it against the
    /// machine.json ceilings: the flat compute roofs of its precision, the memory roof of the
    /// level its data lives in, the allreduce roofs. Writes roofline/placement/v1 JSON (achieved
    /// FLOP/s with its samples, OI, COI, time breakdown, binding ceiling, attainable bound,
    /// headroom, energy where counters exist, advice in the manner of HPC AI500 V2.0 section
    /// 7.5) and an SVG with the point. With --device cuda, a resnet50 run trains on the GPU and
    /// is held against that GPU's ceilings (cuDNN, cuBLAS, L2/HBM) from a `probe --device cuda`
    /// machine.json. resnet50 and ewa also place their top layers (ewa: its
    /// parts — pyramid, RPN head, RoIAlign, box head) by time, each as its own point, and
    /// --trace writes the timeline for Perfetto. `roofline plot --placement a.json --placement
    /// b.json` draws several workloads on one roofline. The machine.json must describe this
    /// machine (CPU vendor, family, model, stepping, cores, caches, SIMD; the GPU placed
    /// on): another machine's file is refused unless --allow-other-machine.
    ///
    /// Examples:
    ///   roofline place --workload gemm:4096x4096x4096
    ///   roofline place --workload stream:1073741824
    ///   roofline place --workload resnet50 --resolution 224 --batch 32 --trace r50.trace.json
    ///   roofline place --workload ewa --resolution 192x288 -o ewa.json
    ///   roofline place --workload resnet50 --device cuda --precision bf16 --batch 128
    #[command(verbatim_doc_comment)]
    Place(Box<place_cmd::PlaceArgs>),
    /// Score a workload by the HPC AI500 rules (V2.0's Valid FLOPS and time to quality, V3.0's
    /// FLOPS per epoch and bagging) from repeated training runs, and write
    /// score.json and a self-contained HTML report.
    ///
    /// Each run trains from a fresh model (seeds --seed, --seed + 1, …) until the held-out
    /// quality reaches the target (Top-1 0.763 for resnet50, mAP@0.5 0.35 for ewa; --target-top1
    /// or --target-map sets your own for a scaled-down run, which is then reported as not
    /// comparable) or the run ends. Per run:
    /// time-to-quality (first batch read to the target), FLOPS (the analytic training FLOPs /
    /// training time), VFLOPS = FLOPS × (quality / target)^5 (ewa: ^10), energy and VFLOPS per watt where
    /// counters exist. The score drops the highest and the lowest run and averages the rest;
    /// the variation is standard deviation / mean of all. Beside it: AIPerf's regulated score
    /// and FLOPS maximum, HPC AI500 V3.0's analytic FLOPS per epoch. With --machine, the report
    /// places the workload on the roofline.
    ///
    /// Example (a scaled-down run, minutes):
    ///   roofline score --runs 3 --width 0.25 --resolution 64 --classes 10 --steps 60 --target-top1 0.9 --machine machine.json
    #[command(verbatim_doc_comment)]
    Score(Box<score_cmd::ScoreArgs>),
    /// Run a training workload over a grid of problem sizes and process counts, each point
    /// placed on the roofline (SAIH: scale the data and the model, follow the trend).
    ///
    /// Every point is a `roofline place` run of its own (a child process; under --mpirun for
    /// --ranks) on the same machine.json. Problem size = analytic training FLOPs per sample ×
    /// training samples; % of peak = FLOP/s over the highest compute roof it was held against
    /// (at the ceiling's theoretical peak where known); strong scaling = the same problem at
    /// several process counts (speedup and efficiency over the fewest); I/O share = the part of
    /// a step spent waiting for its data. --model-flops LO..HI keeps the variants (width ×
    /// depth) whose training FLOPs per sample lie in the range (SAIH's model filter). Writes
    /// sweep.json (roofline/sweep/v1; rewritten after every point), the points' placements, and
    /// three charts: % of peak against problem size, speedup and efficiency against processes,
    /// and the points on the roofline joined in order of size.
    ///
    /// Example (minutes on 2 cores):
    ///   roofline sweep --machine machine.json --images 64,256 --resolution 32,64 --threads 1,2
    #[command(verbatim_doc_comment)]
    Sweep(Box<sweep_cmd::SweepArgs>),
    /// Run AIPerf's AutoML benchmark: neural architecture search by network morphism from
    /// ResNet-50, scored by the FLOPS the machine sustains while searching.
    ///
    /// Workers (--workers, each on its share of the cores) search for their own next
    /// candidate on the shared history and train it in the embedded trainer; the master
    /// records what they propose (refusing a network already taken) and scores. Each candidate
    /// is its parent changed by morphisms — deeper (a convolution, batch norm and ReLU block),
    /// wider (a convolution's channels doubled), skip (an addition from an earlier ReLU) — and
    /// starts from He initialisation (AIPerf's default), or from pretrained weights (--init,
    /// as AIPerf's reference code), or from its parent's trained weights carried through the
    /// morphisms (--from-parent, Net2Net). The next candidate is chosen by a Gaussian process over
    /// architectures (edit-distance kernel, UCB, simulated annealing). AIPerf's per-trial
    /// rules: patience min(6 + 2·round, 20) on the validation loss, from round 4 a second
    /// training with a TPE draw (kernel, batch, dropout), the predicted accuracy at epoch 90
    /// for trials of 10–79 epochs. Operations are counted per candidate by AIPerf's rules
    /// (forward, backward, update) for the training and evaluation images of every finished
    /// epoch (on ImageNet score.py's 1,280,000 and 50,000); FLOPS = operations / the time to
    /// the last finished epoch's end, sampled over time: the score is the
    /// highest; regulated score = −ln(error) × FLOPS, error = 1 − best top-1. Valid by the
    /// rules: at least 1 hour, ImageNet at 224², ResNet-50 as the start, 50 000 held-out
    /// images, at least FP16, error at most 30 %; what departs from AIPerf's reference code is
    /// named under the headline and in automl.json.
    ///
    /// Writes automl.json (roofline/automl/v1; rewritten as it goes: an interrupted
    /// run keeps what it found, --resume goes on), the candidates' weights and an HTML report
    /// with the three time series and the tree of candidates. A stalled or failed trial is
    /// ended and its candidate given to another worker. Ctrl-C stops at the next step.
    ///
    /// Examples:
    ///   roofline automl                                   # 3 minutes, synthetic, small
    ///   roofline automl --budget 10m --workers 2 -o run.json
    ///   roofline automl --official --data /data/imagenet  # AIPerf's settings, 1 hour
    ///   roofline automl --resume -o run.json --budget 20m
    #[command(verbatim_doc_comment)]
    Automl(Box<automl_cmd::AutomlArgs>),
    /// Fail a CI job when performance regressed against a baseline, and not on noise.
    ///
    /// Compares two results of one kind (machine.json from `probe`, placement.json from `place`,
    /// score.json from `score`, automl.json from `automl`) id by id, each in its direction (rates higher, times lower):
    /// the change of the headline figures (a ceiling's best sample; a calibrated baseline's
    /// median run) and a bootstrap confidence interval of the change of the samples' medians.
    /// A regression is a change worse than the tolerance whose interval excludes "no change".
    /// Each row says the smallest regression it would catch 19 times in 20, and the summary
    /// what the gate cannot see on this runner. Make the baseline once with
    /// `roofline probe --quick --runs 5` on the runner kind that gates: the tolerances are
    /// then this runner's noise. Also reports ids that disappeared (more than 3 fail, unless
    /// --allow-missing), the clock where figures moved with it, and differences of clocks,
    /// power limits, drivers and libraries between the two (errors with --strict). Results
    /// from different hardware (CPU vendor, family, model, stepping, cores, caches, SIMD, GPUs,
    /// clock class) are refused unless --allow-other-machine.
    ///
    /// Exit: 0 nothing regressed, 1 something did, 2 bad input or not comparable.
    ///
    /// Examples:
    ///   roofline gate --baseline baseline.json --current machine.json
    ///   roofline gate --baseline b.json --current m.json --rules gate.toml --format markdown
    ///   roofline gate --baseline b.json --current m.json --update-baseline
    #[command(verbatim_doc_comment)]
    Gate(Box<gate_cmd::GateArgs>),
    /// Say what the GPU path would use here, and the exact fix for whatever is missing.
    ///
    /// Finds the NVIDIA driver and every CUDA library the way every GPU command does (CUDA 12
    /// and CUDA 13 alike: toolkits, CUDA_HOME/CUDA_PATH, conda, the pip wheels of the active
    /// virtual environment or of ROOFLINE_CUDA_LIBS), prints each with its version and the file
    /// the bindings really call, every GPU (name, SMs, memory, clocks, power limit, PCIe,
    /// NVLink, compute capability) with one of roofline's kernels compiled and loaded on it,
    /// cuBLAS/cuBLASLt/cuDNN handles created, NCCL's version and MPI. Checks that the libraries
    /// are of one CUDA generation and none newer than the driver.
    ///
    /// Exit: 0 everything the GPU path needs is here (warnings allowed), 2 otherwise.
    ///
    /// Examples:
    ///   roofline doctor
    ///   ROOFLINE_CUDA_LIBS=$VIRTUAL_ENV roofline doctor --json
    #[command(verbatim_doc_comment)]
    Doctor(doctor_cmd::DoctorArgs),
    /// List the CUDA kernels roofline compiles at run time, with NVRTC's resource report.
    ///
    /// Compiles every kernel source (kernels/cuda/*.cu, built into the binary) with NVRTC to
    /// SASS for each architecture and shows registers per thread, shared memory and spills;
    /// no GPU is needed, only NVRTC (libnvrtc 12 or 13: the CUDA toolkit, or the pip wheel
    /// nvidia-cuda-nvrtc-cu12 or nvidia-cuda-nvrtc (CUDA 13) in the active virtual environment
    /// or under ROOFLINE_CUDA_LIBS).
    Kernels {
        /// Architectures (compute capability × 10), comma-separated.
        #[arg(long, default_value = "80,90", value_name = "LIST")]
        arch: String,
        /// Print the report as JSON.
        #[arg(long)]
        json: bool,
    },
    /// Draw a machine.json's roofline (and placements) as SVG or an interactive HTML page.
    ///
    /// Log-log: operational intensity (FLOP per byte of memory traffic) against FLOP/s. Every
    /// memory level is a slanted roof, every compute ceiling a flat one, theoretical peaks are
    /// dashed, and the ridge points (where a bandwidth roof meets the f32 FMA roof) are marked.
    /// Placements must come from the machine the file describes (refused otherwise unless
    /// --allow-other-machine). A name ending in .html writes the interactive page, .svg the
    /// figure; other extensions are refused.
    Plot(plot_cmd::PlotArgs),
    /// Show the theoretical-peak database (accelerators, and the CPU rule).
    Peaks {
        /// Print the database as JSON.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    // Standard output is written through `out!`/`outln!`: a closed pipe ends the command
    // quietly (exit 0), a full disk with exit 2 and one line (`exit::write_stdout`).
    let cli = match args::parse::<Cli>() {
        Ok(c) => c,
        Err(code) => return code,
    };
    roofline_collectors::provenance::set_build(roofline_collectors::provenance::Build {
        tool: format!("roofline {}", env!("CARGO_PKG_VERSION")),
        git_revision: option_env!("ROOFLINE_GIT_REVISION")
            .filter(|s| !s.is_empty())
            .map(String::from),
        compiler: env!("ROOFLINE_RUSTC_VERSION").to_string(),
        libraries: env!("ROOFLINE_LIBRARIES")
            .split(", ")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
    });
    // Under mpirun every verb runs on every rank; apart from `probe` (which gathers) and the
    // training verbs (data parallel: `train`, `score`, `place --workload resnet50|ewa`), only rank 0
    // acts, so that one plot is written and one table printed.
    let every_rank = match &cli.command {
        Command::Probe(_) | Command::Train(_) | Command::Score(_) | Command::Automl(_) => true,
        Command::Place(a) => {
            a.workload == "resnet50" || a.workload == "ewa" || a.workload.starts_with("automl:")
        }
        _ => false,
    };
    if !every_rank && roofline_kernels::comm::launched_rank().is_some_and(|r| r != 0) {
        return ExitCode::SUCCESS;
    }
    let result = match cli.command {
        Command::Probe(a) => {
            if a.check {
                probe_cmd::gpu_check(a.device)
            } else {
                probe_cmd::probe(*a)
            }
        }
        Command::Train(args) => train_cmd::train(&args),
        Command::Place(args) => place_cmd::place(&args),
        Command::Score(args) => score_cmd::score(&args),
        Command::Sweep(args) => sweep_cmd::sweep(&args),
        Command::Automl(args) => automl_cmd::automl(&args),
        Command::Doctor(args) => match doctor_cmd::run(&args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Gate(args) => match gate_cmd::run(&args) {
            Ok(code) => return code,
            Err(e) => Err(e),
        },
        Command::Kernels { arch, json } => output::kernels(&arch, json).map_err(Failure::Input),
        Command::Plot(args) => plot_cmd::plot(&args),
        Command::Peaks { json } => output::peaks(json).map_err(Failure::Input),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Input(e)) => {
            eprintln!("roofline: error: {}", causes(&e));
            ExitCode::from(2)
        }
        Err(Failure::Interrupted) => {
            eprintln!("roofline: interrupted; nothing was written");
            ExitCode::from(130)
        }
        Err(Failure::InterruptedKept(kept)) => {
            eprintln!("roofline: interrupted; kept {kept}");
            ExitCode::from(130)
        }
        Err(Failure::Run(e)) => {
            eprintln!("roofline: error: {}", causes(&e));
            ExitCode::from(1)
        }
        Err(Failure::Quiet(code)) => ExitCode::from(code),
    }
}
