//! `roofline train`: the embedded trainer on the command line.

use crate::Failure;
use anyhow::anyhow;
use roofline_workloads::data::Synthetic;
use roofline_workloads::exchange::{CommOptions, Wire};
use roofline_workloads::folder::ImageFolder;
use roofline_workloads::layers::Reducer;
use roofline_workloads::resnet::{Config, Version};
use roofline_workloads::train::{self, Decay, Monitor, Source, TrainConfig};
use std::io::IsTerminal;
use std::sync::Arc;

#[derive(clap::Args)]
pub struct TrainArgs {
    /// The workload: resnet50 (ImageNet-style classification; ewa is not built yet).
    #[arg(long, default_value = "resnet50", value_parser = ["resnet50"])]
    pub workload: String,

    #[command(flatten)]
    pub run: RunArgs,
    /// With --device cuda: compare every GPU layer, and one whole training step of a small
    /// ResNet, with the CPU layers on small shapes in --precision; print the table and exit
    /// (1 when a comparison fails). Run it first on a new GPU machine.
    #[arg(long, requires = "device")]
    check: bool,
    /// Write the run's timeline as Chrome trace JSON (Perfetto, chrome://tracing): data
    /// loading, every layer's forward and backward pass, allreduce buckets, the optimiser.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
    /// Print a JSON summary instead of the text one.
    #[arg(long)]
    json: bool,
    /// Write the training state to this safetensors file at the end.
    #[arg(long, value_name = "PATH")]
    checkpoint: Option<std::path::PathBuf>,
    /// With --checkpoint: also write it every this many steps, so that a killed run resumes
    /// (with the same arguments and --resume) exactly where the last checkpoint left it.
    #[arg(long, value_name = "STEPS")]
    checkpoint_every: Option<usize>,
    /// Continue from this checkpoint (same model and batch; --steps counts from the start).
    #[arg(long, value_name = "PATH")]
    resume: Option<std::path::PathBuf>,
}

/// How a training run is set up: the model, the data, the schedule, the device, the ranks'
/// gradient exchange. Shared by `train`, `place --workload resnet50` and `score`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Train on the synthetic image set (the default without --data).
    #[arg(long)]
    pub synthetic: bool,
    /// An ImageNet-style folder: DIR/train/<class>/*.jpg (and DIR/val/<class>/*.jpg for
    /// evaluation), or DIR/<class>/*.jpg. Decoded in parallel one batch ahead; random-resized
    /// crop and flip for training, resize and centre crop for evaluation.
    #[arg(long, value_name = "DIR", conflicts_with = "synthetic")]
    pub data: Option<std::path::PathBuf>,
    /// Images per step (the global batch).
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Image side in pixels.
    #[arg(long, default_value_t = 224)]
    pub resolution: usize,
    /// Training steps (default: 20; --epochs overrides).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Epochs over the training images (--train-images, or the folder's).
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Images in the synthetic training set.
    #[arg(long, default_value_t = 1281)]
    pub train_images: usize,
    /// Held-out images evaluated (synthetic: fresh images; folder: from DIR/val); 0: none.
    #[arg(long, default_value_t = 0)]
    pub eval_images: usize,
    /// Stop when held-out Top-1 reaches this fraction (e.g. 0.759), evaluating every
    /// --eval-every steps; the JSON then gives HPC AI500's time-to-quality (from the first
    /// batch read to the target).
    #[arg(long, value_name = "FRACTION")]
    pub target_top1: Option<f64>,
    /// Evaluate every this many steps (default: at the end only).
    #[arg(long, value_name = "STEPS")]
    pub eval_every: Option<usize>,
    /// Classes.
    #[arg(long, default_value_t = 1000)]
    pub classes: usize,
    /// Width multiplier (1 = ResNet-50; 0.25 for small test models).
    #[arg(long, default_value_t = 1.0)]
    pub width: f64,
    /// Bottlenecks per stage, comma-separated (ResNet-50: 3,4,6,3).
    #[arg(long, default_value = "3,4,6,3")]
    pub depth: String,
    /// ResNet version: 1.5 (stride in the 3×3) or 1 (stride in the first 1×1).
    #[arg(long, default_value = "1.5", value_parser = ["1", "1.5"])]
    pub version: String,
    /// Warm-up epochs (linear), as a fraction of the run when no epochs are given: steps/10.
    #[arg(long)]
    pub warmup_steps: Option<usize>,
    /// Learning rate per 256 images.
    #[arg(long, default_value_t = 0.1)]
    pub lr: f64,
    /// Label smoothing.
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    /// Seed (same seed, same thread count: the same run).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads (default: every CPU roofline may use).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where to run: cpu, or cuda (cuDNN convolutions, cuBLAS classifier, NVRTC kernels for
    /// the rest; under mpirun one GPU per rank, gradients summed with NCCL).
    #[arg(long, default_value = "cpu", value_parser = ["cpu", "cuda"])]
    pub device: String,
    /// With --device cuda: the convolutions' precision. f32; tf32 (tensor cores round the
    /// inputs); f16 or bf16 (mixed precision: f32 master weights, batch norm and loss in f32,
    /// dynamic loss scaling for f16).
    #[arg(long, default_value = "f32", value_parser = ["f32", "tf32", "f16", "bf16"])]
    pub precision: String,
    /// With --device cuda: the GPU to use (default: the launcher's local rank modulo the GPU
    /// count, else 0).
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
    /// Under mpirun: the gradients' number format on the wire. none (f32); fp16 (HPC AI500
    /// V2.0 section 7.5.2: half the bytes; on the CPU each bucket is scaled by a power of two
    /// the ranks agree on, so that sums cannot overflow, and summed over a ring of 16-bit
    /// messages; on GPUs NCCL sums f16 under the dynamic loss scale); bf16 (f32's range, 8
    /// mantissa bits).
    #[arg(long, default_value = "none", value_parser = ["none", "fp16", "bf16"], value_name = "FORMAT")]
    pub grad_compression: String,
    /// Under mpirun: sum the gradients after the whole backward pass. By default each fused
    /// bucket is summed as soon as the backward pass has finished its gradients, while the
    /// rest of the backward pass runs.
    #[arg(long)]
    pub no_overlap: bool,
    /// Under mpirun: gradient elements per fused bucket (Horovod's tensor fusion; a parameter
    /// is never split, so a bucket holds at least one).
    #[arg(long, default_value_t = roofline_workloads::exchange::BUCKET, value_name = "ELEMENTS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub bucket_elements: usize,
}

struct Bar(Option<indicatif::ProgressBar>);

impl Monitor for Bar {
    fn step(&self, step: usize, steps: usize, loss: f64, ips: f64) {
        if let Some(b) = &self.0 {
            b.set_length(steps as u64);
            b.set_position(step as u64);
            b.set_message(format!("loss {loss:.4}, {ips:.1} images/s"));
        }
    }
}

/// Under mpirun: the MPI world as the trainer's reducer (data parallel), and whether this rank
/// reports; otherwise a single process.
#[allow(clippy::type_complexity)]
pub fn reducer(a: &RunArgs) -> Result<(Option<Arc<dyn Reducer>>, bool), Failure> {
    let Some(n) = roofline_kernels::comm::launched_ranks() else {
        return Ok((None, true));
    };
    #[cfg(feature = "mpi")]
    {
        let _ = n;
        let world = roofline_kernels::comm::mpi::World::init(std::time::Duration::from_secs(600))
            .map_err(|e| Failure::Input(anyhow!("MPI: {e}")))?;
        if a.batch % world.size != 0 {
            return Err(Failure::Input(anyhow!(
                "--batch {} does not divide among {} ranks",
                a.batch,
                world.size
            )));
        }
        let root = world.is_root();
        let r: Arc<dyn Reducer> = Arc::new(MpiReducer(world));
        Ok((Some(r), root))
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = a;
        Err(Failure::Input(anyhow!(
            "started by an MPI launcher with {n} ranks, but this roofline was built without MPI: rebuild it with `cargo build --release --features mpi`, or run it without mpirun"
        )))
    }
}

#[cfg(feature = "mpi")]
struct MpiReducer(roofline_kernels::comm::mpi::World);

// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED and the trainer calls the reducer from
// one thread at a time, never concurrently: on the CPU from the gradient exchange's thread only
// (`workloads::exchange`), on GPUs from the training loop.
#[cfg(feature = "mpi")]
unsafe impl Send for MpiReducer {}
#[cfg(feature = "mpi")]
unsafe impl Sync for MpiReducer {}

#[cfg(feature = "mpi")]
impl Reducer for MpiReducer {
    fn ranks(&self) -> usize {
        self.0.size
    }
    fn rank(&self) -> usize {
        self.0.rank
    }
    fn sum_f64(&self, v: &mut [f64]) {
        self.0.sum_f64(v);
    }
    fn sum_f32(&self, v: &mut [f32]) {
        self.0.sum_f32(v);
    }
    fn exchange_u16(&self, to: usize, send: &[u16], from: usize, recv: &mut [u16]) {
        self.0.exchange_u16(to, send, from, recv);
    }
    fn nodes(&self) -> usize {
        self.0.cluster_info().nodes
    }
}

/// The launcher's local rank (the GPU a rank takes by default).
fn local_rank() -> usize {
    [
        "OMPI_COMM_WORLD_LOCAL_RANK",
        "MPI_LOCALRANKID",
        "SLURM_LOCALID",
        "PMIX_LOCAL_RANK",
    ]
    .iter()
    .find_map(|v| std::env::var(v).ok()?.trim().parse::<usize>().ok())
    .unwrap_or(0)
}

/// The GPU this rank trains on, opened; `--device cuda` without a driver or GPU is an input
/// error that says what was looked for.
pub(crate) fn open_gpu(
    a: &RunArgs,
) -> Result<(roofline_kernels::cuda::device::Gpu, usize), Failure> {
    use roofline_kernels::cuda::device;
    let count = device::init().map_err(|e| Failure::Input(anyhow!("--device cuda: {e}")))?;
    let ordinal = a.gpu.unwrap_or(local_rank() % count);
    if ordinal >= count {
        return Err(Failure::Input(anyhow!(
            "--gpu {ordinal}: this machine has {count} GPU(s)"
        )));
    }
    let gpu = device::Gpu::open(ordinal)
        .map_err(|e| Failure::Run(anyhow!("--device cuda: GPU {ordinal}: {e}")))?;
    Ok((gpu, ordinal))
}

/// `--device cuda --check`: the GPU layers against the CPU layers.
fn check(a: &TrainArgs) -> Result<(), Failure> {
    let prec = roofline_workloads::gpu::precision(&a.run.precision)
        .map_err(|e| Failure::Input(anyhow!(e)))?;
    let (gpu, ordinal) = open_gpu(&a.run)?;
    println!(
        "GPU {ordinal}: {} (sm_{}), trainer layers in {} against the CPU",
        gpu.name,
        gpu.arch(),
        a.run.precision
    );
    let checks = roofline_workloads::gpu::self_test(gpu, prec)
        .map_err(|e| Failure::Run(anyhow!("GPU self-test: {e}")))?;
    let mut failed = 0;
    for c in &checks {
        println!(
            "  {:<4} {:<58} error {:.2e} (tolerance {:.0e})",
            if c.passed() { "ok" } else { "FAIL" },
            c.name,
            c.error,
            c.tolerance
        );
        failed += usize::from(!c.passed());
    }
    if failed > 0 {
        return Err(Failure::Run(anyhow!(
            "GPU self-test: {failed} of {} comparisons failed",
            checks.len()
        )));
    }
    println!("all {} comparisons passed", checks.len());
    Ok(())
}

pub fn train(a: &TrainArgs) -> Result<(), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    if a.check {
        if a.run.device != "cuda" {
            return Err(input(
                "--check compares the GPU layers with the CPU: use it with --device cuda".into(),
            ));
        }
        return check(a);
    }
    if let Some(p) = &a.checkpoint {
        crate::probe_cmd::check_writable(p).map_err(Failure::Input)?;
    }
    if let Some(p) = &a.resume {
        if !p.is_file() {
            return Err(input(format!("--resume {}: no such file", p.display())));
        }
    }
    let mut prep = prepare(&a.run)?;
    prep.cfg.checkpoint = a.checkpoint.clone();
    prep.cfg.resume = a.resume.clone();
    prep.cfg.checkpoint_every = a.checkpoint_every;
    let (steps, cfg, threads, blocks) = (prep.cfg.steps, &prep.cfg, prep.threads, prep.blocks);
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(steps as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let monitor = Bar(bar);
    let (reducer, root) = reducer(&a.run)?;
    if let Some(t) = &a.trace {
        crate::probe_cmd::check_writable(t).map_err(Failure::Input)?;
        roofline_collectors::timeline::start();
    }
    let rank = reducer.as_ref().map_or(0, |r| r.rank());
    let result = execute(&a.run, &prep, &monitor, reducer);
    if let Some(t) = &a.trace {
        let spans = roofline_collectors::timeline::stop();
        // Every rank writes its own timeline (rank 0 to FILE, rank r to FILE.r).
        let path = if rank == 0 {
            t.clone()
        } else {
            std::path::PathBuf::from(format!("{}.{rank}", t.display()))
        };
        let j = roofline_collectors::timeline::chrome_trace(
            &spans,
            rank,
            &format!("roofline train (rank {rank})"),
        );
        roofline_model::write::write_atomic(&path, j.to_string().as_bytes())
            .map_err(|e| Failure::Input(e.into()))?;
    }
    let (s, gpu_name) = result?;
    if !root {
        return Ok(());
    }
    if let Some(b) = &monitor.0 {
        b.finish_and_clear();
    }
    let last = s.evals.last();
    let counted = roofline_workloads::accounting::layers(&cfg.model, a.run.resolution);
    let aiperf = roofline_workloads::accounting::aiperf(&counted);
    let v3 = roofline_workloads::accounting::hpc_ai500_v3(&counted);
    if a.json {
        let v = serde_json::json!({
            "workload": a.workload,
            "model": format!("ResNet-50 v{} (width {}, depth {:?})", a.run.version, a.run.width, blocks),
            "parameters": s.parameters,
            "batch": a.run.batch,
            "resolution": a.run.resolution,
            "threads": threads,
            "device": a.run.device,
            "gpu": gpu_name,
            "precision": a.run.precision,
            "steps": s.steps,
            "images": s.images,
            "train_seconds": s.train_seconds,
            "images_per_second": s.images_per_second,
            "steady_images_per_second": s.steady_images_per_second,
            "achieved_flops": s.achieved_flops,
            "flops_forward_per_image": s.flops_forward_per_image,
            "flops_step_per_image": s.flops_step_per_image,
            "final_loss": s.final_loss,
            "ranks": s.ranks,
            "comm_bytes_per_step": s.comm_bytes_per_step,
            "grad_compression": s.comm.wire.name(),
            "overlap": s.comm.overlap,
            "bucket_elements": s.comm.bucket,
            "comm_wait_seconds": s.comm_wait_seconds,
            "param_norm": s.param_norm,
            "aiperf_ops_per_image": {"forward": aiperf.forward, "backward": aiperf.backward, "total": aiperf.total()},
            "hpc_ai500_v3_flops_per_image": {"forward": v3.forward, "training": v3.total()},
            "min_forward_bytes_per_image": roofline_workloads::accounting::min_bytes_forward(&counted),
            "top1": last.map(|e| e.top1),
            "top5": last.map(|e| e.top5),
            "evaluations": s.evals.iter().map(|e| serde_json::json!({"step": e.step, "top1": e.top1, "top5": e.top5, "loss": e.loss})).collect::<Vec<_>>(),
            "time_to_quality_seconds": s.time_to_quality,
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Run(e.into()))?
        );
    } else {
        let on = match &gpu_name {
            Some(g) => format!("{g}, convolutions in {}", a.run.precision),
            None => format!("{threads} threads"),
        };
        println!(
            "ResNet-50 v{} (width {}, depth {:?}): {} parameters, {}×{} {} images, batch {}, {on}",
            a.run.version,
            a.run.width,
            blocks,
            s.parameters,
            a.run.resolution,
            a.run.resolution,
            if a.run.data.is_some() {
                "folder"
            } else {
                "synthetic"
            },
            a.run.batch,
        );
        println!(
            "{} steps, {} images in {:.1} s: {:.2} images/s ({:.2} after the first step), {} FLOP/s achieved ({} FLOP per image per step, {} forward)",
            s.steps,
            s.images,
            s.train_seconds,
            s.images_per_second,
            s.steady_images_per_second,
            roofline_plots::si(s.achieved_flops),
            roofline_plots::si(s.flops_step_per_image),
            roofline_plots::si(s.flops_forward_per_image)
        );
        println!(
            "per image: AIPerf rules {} forward, {} backward, {} total; HPC AI500 V3.0 rules {} forward, {} training",
            roofline_plots::si(aiperf.forward),
            roofline_plots::si(aiperf.backward),
            roofline_plots::si(aiperf.total()),
            roofline_plots::si(v3.forward),
            roofline_plots::si(v3.total())
        );
        if s.ranks > 1 {
            println!(
                "{} ranks: {}B per rank per step into the allreduces (gradients {}, buckets of {} elements, {}); {:.3} s per step waiting for the sums",
                s.ranks,
                roofline_plots::si(s.comm_bytes_per_step),
                match s.comm.wire {
                    Wire::F32 => "in f32".to_string(),
                    w => format!("compressed to {}", w.name()),
                },
                s.comm.bucket,
                if s.comm.overlap {
                    "overlapped with the backward pass"
                } else {
                    "after the backward pass"
                },
                s.comm_wait_seconds / (s.steps - s.start_step).max(1) as f64
            );
        }
        println!("final training loss {:.4}", s.final_loss);
        if let Some(e) = last {
            println!(
                "held-out: Top-1 {:.2}%, Top-5 {:.2}% on {} images",
                100.0 * e.top1,
                100.0 * e.top5,
                a.run.eval_images
            );
        }
    }
    Ok(())
}

/// Runs a prepared training on the CPU or (--device cuda) this rank's GPU; returns the summary
/// and the GPU's name.
pub fn execute(
    a: &RunArgs,
    p: &Prepared,
    monitor: &(dyn Monitor + Sync),
    reducer: Option<Arc<dyn Reducer>>,
) -> Result<(train::Summary, Option<String>), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    let cfg = &p.cfg;
    if reducer.is_none() && (a.grad_compression != "none" || a.no_overlap) {
        eprintln!(
            "note: --grad-compression and --no-overlap change how ranks exchange gradients; a single process has none to exchange (start it with mpirun -np N)"
        );
    }
    let mut gpu_name = None;
    let s = if a.device == "cuda" {
        let prec = roofline_workloads::gpu::precision(&a.precision).map_err(input)?;
        let (gpu, ordinal) = open_gpu(a)?;
        gpu_name = Some(gpu.name.clone());
        let nccl = match &reducer {
            Some(r) if r.ranks() > 1 => Some(
                roofline_workloads::gpu::communicator(r.as_ref(), ordinal)
                    .map_err(|e| Failure::Run(anyhow!("--device cuda: NCCL: {e}")))?,
            ),
            _ => None,
        };
        let ctx = roofline_workloads::gpu::Ctx::new(gpu, prec)
            .map_err(|e| Failure::Run(anyhow!("--device cuda: {e}")))?;
        let mut dev =
            roofline_workloads::gpu::CudaTrainer::new(ctx, nccl, reducer.clone(), cfg.comm);
        // The GPU's handles are not Send: this thread drives it (data loads on their own threads).
        train::train_on::<f32>(cfg, monitor, reducer, Some(&mut dev))
    } else {
        p.pool
            .install(|| train::train_with::<f32>(cfg, monitor, reducer))
    }
    .map_err(|e| match e {
        train::TrainError::Device(m) => Failure::Run(anyhow!("--device cuda: {m}")),
        e => Failure::Input(anyhow!("{e}")),
    })?;
    Ok((s, gpu_name))
}

/// A training run set up from the command line.
pub struct Prepared {
    pub cfg: TrainConfig,
    pub threads: usize,
    pub blocks: [usize; 4],
    pool: rayon::ThreadPool,
}

/// Checks `run` and builds its configuration (no checkpoints; the caller adds them) and its
/// pinned thread pool.
pub fn prepare(a: &RunArgs) -> Result<Prepared, Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    if a.device != "cuda" && (a.precision != "f32" || a.gpu.is_some()) {
        return Err(input(
            "--precision and --gpu apply to --device cuda (the CPU trains in f32)".into(),
        ));
    }
    roofline_workloads::alloc::enable_for_training();
    let blocks: Vec<usize> = a
        .depth
        .split(',')
        .map(|s| s.trim().parse::<usize>())
        .collect::<Result<_, _>>()
        .map_err(|_| {
            input(format!(
                "--depth {}: expected four numbers, e.g. 3,4,6,3",
                a.depth
            ))
        })?;
    let blocks: [usize; 4] = blocks.try_into().map_err(|_| {
        input(format!(
            "--depth {}: expected four numbers, e.g. 3,4,6,3",
            a.depth
        ))
    })?;
    if a.batch == 0
        || a.resolution < 32
        || a.classes < 2
        || !(a.width > 0.0 && a.width <= 4.0)
        || a.train_images == 0
    {
        return Err(input(
            "expected --batch ≥ 1, --resolution ≥ 32, --classes ≥ 2, 0 < --width ≤ 4, --train-images ≥ 1".into(),
        ));
    }
    if a.target_top1.is_some_and(|t| !(t > 0.0 && t <= 1.0))
        || (a.target_top1.is_some() && a.eval_images == 0)
    {
        return Err(input(
            "--target-top1 takes a fraction in (0, 1] and needs --eval-images".into(),
        ));
    }
    let mut steps = match (a.steps, a.epochs) {
        (_, Some(e)) => (e * a.train_images.max(1)).div_ceil(a.batch),
        (Some(s), None) => s,
        (None, None) => 20,
    };
    if steps == 0 {
        return Err(input("nothing to train: --steps or --epochs is 0".into()));
    }
    let (source, classes, train_images, eval_images) = match &a.data {
        None => (
            Source::Synthetic(Synthetic::new(a.classes, a.resolution, a.seed)),
            a.classes,
            a.train_images,
            a.eval_images,
        ),
        Some(dir) => {
            let (tdir, vdir) = if dir.join("train").is_dir() {
                (dir.join("train"), Some(dir.join("val")))
            } else {
                (dir.clone(), None)
            };
            let train = ImageFolder::open(&tdir).map_err(|e| input(format!("--data: {e}")))?;
            let eval = match vdir.filter(|v| v.is_dir()) {
                Some(v) => Some(Arc::new(
                    ImageFolder::open(&v).map_err(|e| input(format!("--data: {e}")))?,
                )),
                None => None,
            };
            if let Some(e) = &eval {
                if e.classes != train.classes {
                    return Err(input(format!(
                        "--data: {} and {} have different classes",
                        tdir.display(),
                        e.root.display()
                    )));
                }
            }
            let eval_images = match &eval {
                Some(e) if a.eval_images > 0 => a.eval_images.min(e.len()),
                _ => 0,
            };
            let (classes, n) = (train.classes.len(), train.len());
            (
                Source::Folder {
                    train: Arc::new(train),
                    eval,
                    resolution: a.resolution,
                },
                classes,
                n,
                eval_images,
            )
        }
    };
    if let Some(e) = a.epochs {
        steps = (e * train_images).div_ceil(a.batch);
    }
    let cfg = TrainConfig {
        model: Config {
            version: if a.version == "1" {
                Version::V1
            } else {
                Version::V1_5
            },
            blocks,
            width: a.width,
            classes,
            zero_init_residual: false,
        },
        data: source,
        batch: a.batch,
        steps,
        train_images,
        eval_images,
        warmup_steps: a.warmup_steps.unwrap_or(steps / 10),
        base_lr_per_256: a.lr,
        label_smoothing: a.label_smoothing,
        seed: a.seed,
        decay: Decay::Cosine,
        target_top1: a.target_top1,
        eval_every: a.eval_every.unwrap_or(steps),
        checkpoint: None,
        resume: None,
        stop_at: None,
        checkpoint_every: None,
        comm: CommOptions {
            wire: Wire::parse(&a.grad_compression).map_err(input)?,
            overlap: !a.no_overlap,
            bucket: a.bucket_elements,
        },
    };
    let threads = a
        .threads
        .unwrap_or_else(|| roofline_kernels::affinity::allowed_cpus().len());
    let pool = roofline_kernels::affinity::pinned_pool(
        &roofline_kernels::affinity::allowed_cpus()[..threads
            .min(roofline_kernels::affinity::allowed_cpus().len())
            .max(1)],
    )
    .map_err(|e| Failure::Run(anyhow!("cannot start {threads} threads: {e}")))?;
    Ok(Prepared {
        cfg,
        threads,
        blocks,
        pool,
    })
}
