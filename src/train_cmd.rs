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
    /// The workload: resnet50 (ImageNet-style classification) or ewa (HPC AI500's Extreme
    /// Weather detection: Faster R-CNN with a ResNet-50-FPN backbone on 16-channel fields,
    /// scored by mAP@0.5).
    #[arg(long, default_value = "resnet50", value_parser = ["resnet50", "ewa"])]
    pub workload: String,

    #[command(flatten)]
    pub run: RunArgs,
    /// With --device cuda: compare every GPU layer, and one whole training step of a small
    /// ResNet, with the CPU layers on small shapes in --precision (with --workload ewa also the
    /// detector's pyramid, shared RPN head and a whole step of a small detector); print the
    /// table and exit (1 when a comparison fails). Run it first on a new GPU machine.
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
/// gradient exchange. Shared by `train`, `place --workload resnet50|ewa` and `score`.
#[derive(clap::Args)]
pub struct RunArgs {
    /// Train on synthetic data (the default without --data): resnet50 a learnable image set
    /// generated on the fly; ewa a year file of smooth fields with storms of the four kinds,
    /// written once (at the training resolution) to the temporary folder and read back through
    /// the HDF5 loader.
    #[arg(long)]
    pub synthetic: bool,
    /// resnet50: an ImageNet-style folder, DIR/train/<class>/*.jpg (and DIR/val/<class>/*.jpg
    /// for evaluation), or DIR/<class>/*.jpg; decoded in parallel one batch ahead,
    /// random-resized crop and flip for training, resize and centre crop for evaluation.
    /// ewa: an Extreme Weather year file (climo_<year>.h5) or a folder of them, streamed one
    /// image at a time; the last --eval-images images are held out.
    #[arg(long, value_name = "PATH", conflicts_with = "synthetic")]
    pub data: Option<std::path::PathBuf>,
    /// Images per step (the global batch; default 32 for resnet50, 2 for ewa).
    #[arg(long)]
    pub batch: Option<usize>,
    /// Image size: N (N×N) or HxW. resnet50: square, default 224. ewa: default 768x1152 (the
    /// data's grid); smaller sizes average the fields down (e.g. 192x288 on a laptop).
    #[arg(long, value_name = "N|HxW")]
    pub resolution: Option<Resolution>,
    /// Training steps (default: 20; --epochs overrides).
    #[arg(long)]
    pub steps: Option<usize>,
    /// Epochs over the training images (--train-images, or the data's). The paper's runs: 90
    /// for resnet50, 50 for ewa.
    #[arg(long)]
    pub epochs: Option<usize>,
    /// Images in the synthetic training set (default 1281 for resnet50, 16 for ewa); with
    /// --data and ewa, train on the first this many images only.
    #[arg(long)]
    pub train_images: Option<usize>,
    /// Held-out images evaluated (resnet50 synthetic: fresh images; folder: from DIR/val;
    /// ewa: the last images of the data, never trained on); 0: none.
    #[arg(long, default_value_t = 0)]
    pub eval_images: usize,
    /// resnet50: stop when held-out Top-1 reaches this fraction (e.g. 0.759), evaluating every
    /// --eval-every steps; the JSON then gives HPC AI500's time-to-quality (from the first
    /// batch read to the target).
    #[arg(long, value_name = "FRACTION")]
    pub target_top1: Option<f64>,
    /// ewa: stop when held-out mAP@0.5 reaches this value (the paper's target: 0.35), as
    /// --target-top1 does.
    #[arg(long, value_name = "MAP")]
    pub target_map: Option<f64>,
    /// Evaluate every this many steps (default: at the end only).
    #[arg(long, value_name = "STEPS")]
    pub eval_every: Option<usize>,
    /// resnet50: classes (ewa has its four weather classes).
    #[arg(long, default_value_t = 1000)]
    pub classes: usize,
    /// Width multiplier of the backbone (1 = ResNet-50; 0.25 for small test models); for ewa
    /// the pyramid (256) and box head (1024) scale with it.
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
    /// Learning rate: resnet50 per 256 images (default 0.1), ewa per 16 images (default 0.02,
    /// torchvision's detection reference); scaled linearly with the batch.
    #[arg(long)]
    pub lr: Option<f64>,
    /// Label smoothing.
    #[arg(long, default_value_t = 0.0)]
    pub label_smoothing: f64,
    /// Seed (same seed, same thread count: the same run).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads (default: every CPU roofline may use).
    #[arg(long)]
    pub threads: Option<usize>,
    /// Where to run: cpu, or cuda (resnet50: cuDNN convolutions, cuBLAS classifier, NVRTC
    /// kernels for the rest; ewa: the detector on the same layers, NVRTC RoIAlign and pyramid
    /// kernels, proposals and losses on the host; under mpirun one GPU per rank, gradients
    /// summed with NCCL).
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

pub use crate::ranks::{ranks, reducer, Ranks};

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
    let ordinal_gpu = gpu.ordinal;
    let mut checks = roofline_workloads::gpu::self_test(gpu, prec)
        .map_err(|e| Failure::Run(anyhow!("GPU self-test: {e}")))?;
    if a.workload == "ewa" {
        // The detector's assembled layers and a whole step of a small detector, on a fresh
        // context (the layers' test released its own).
        let gpu = roofline_kernels::cuda::device::Gpu::open(ordinal_gpu)
            .map_err(|e| Failure::Run(anyhow!("--device cuda: GPU {ordinal_gpu}: {e}")))?;
        checks.extend(
            roofline_workloads::gpu::detector_self_test(gpu, prec)
                .map_err(|e| Failure::Run(anyhow!("GPU detector self-test: {e}")))?,
        );
    }
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
    let mut prep = prepare(&a.run, &a.workload)?;
    prep.set_checkpoints(a.checkpoint.clone(), a.resume.clone(), a.checkpoint_every);
    let (steps, threads) = (prep.steps(), prep.threads);
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
    let (reducer, root) = reducer(prep.batch())?;
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
    if let Job::Detector(cfg) = &prep.job {
        return report_detector(a, &prep, cfg, &s, gpu_name.as_deref());
    }
    let last = s.evals.last();
    let counted = prep.layers();
    let res = prep.resolution.h;
    let aiperf = roofline_workloads::accounting::aiperf(&counted);
    let v3 = roofline_workloads::accounting::hpc_ai500_v3(&counted);
    if a.json {
        let v = serde_json::json!({
            "workload": a.workload,
            "model": prep.model_name(&a.run),
            "parameters": s.parameters,
            "batch": prep.batch(),
            "resolution": res,
            "threads": threads,
            "device": a.run.device,
            "gpu": gpu_name,
            "precision": a.run.precision,
            "aiperf_ops_per_image": {"forward": aiperf.forward, "backward": aiperf.backward, "total": aiperf.total()},
            "hpc_ai500_v3_flops_per_image": {"forward": v3.forward, "training": v3.total()},
            "min_forward_bytes_per_image": roofline_workloads::accounting::min_bytes_forward(&counted),
            "top1": last.map(|e| e.top1),
            "top5": last.map(|e| e.top5),
            "evaluations": s.evals.iter().map(|e| serde_json::json!({"step": e.step, "top1": e.top1, "top5": e.top5, "loss": e.loss})).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&with_run(v, &s)).map_err(|e| Failure::Run(e.into()))?
        );
    } else {
        let on = match &gpu_name {
            Some(g) => format!("{g}, convolutions in {}", a.run.precision),
            None => format!("{threads} threads"),
        };
        println!(
            "{}: {} parameters, {res}×{res} {} images, batch {}, {on}",
            prep.model_name(&a.run),
            s.parameters,
            if a.run.data.is_some() {
                "folder"
            } else {
                "synthetic"
            },
            prep.batch(),
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

/// `v` (a JSON object) with what every run reports: steps, images, throughput, FLOPs, loss,
/// the gradient exchange, time-to-quality.
fn with_run(mut v: serde_json::Value, s: &train::Summary) -> serde_json::Value {
    let run = serde_json::json!({
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
        "time_to_quality_seconds": s.time_to_quality,
    });
    if let (Some(o), serde_json::Value::Object(r)) = (v.as_object_mut(), run) {
        o.extend(r);
    }
    v
}

/// `train --workload ewa`'s report: throughput, FLOPs per image by part beside the paper's,
/// parameters beside the paper's, losses and mAP.
fn report_detector(
    a: &TrainArgs,
    prep: &Prepared,
    cfg: &roofline_workloads::ewa::EwaConfig,
    s: &train::Summary,
    gpu: Option<&str>,
) -> Result<(), Failure> {
    use roofline_plots::si;
    use roofline_workloads::detect::model::DetectorConfig;
    let res = prep.resolution;
    let parts = cfg.model.flops(res.h, res.w);
    // The paper's model at the data's full size, whatever this run's scale.
    let at_full = DetectorConfig::ewa().flops(768, 1152).total().training();
    let last = s.evals.last().and_then(|e| e.map);
    if a.json {
        let v = serde_json::json!({
            "workload": a.workload,
            "model": prep.model_name(&a.run),
            "parameters": s.parameters,
            "paper_parameters": 41_000_000,
            "batch": prep.batch(),
            "resolution": [res.h, res.w],
            "data": prep.data_name(&a.run),
            "threads": prep.threads,
            "device": a.run.device,
            "gpu": gpu,
            "precision": a.run.precision,
            "flops_step_per_image_at_768x1152": at_full,
            "paper_flops_per_image": 691e9,
            "flops_per_image_by_part": parts.parts().iter().map(|(n, f)| (n.to_string(), serde_json::json!({"forward": f.forward, "backward": f.backward}))).collect::<serde_json::Map<_, _>>(),
            "map50": last,
            "evaluations": s.evals.iter().map(|e| serde_json::json!({"step": e.step, "map50": e.map})).collect::<Vec<_>>(),
        });
        println!(
            "{}",
            serde_json::to_string_pretty(&with_run(v, s)).map_err(|e| Failure::Run(e.into()))?
        );
        return Ok(());
    }
    let on = match gpu {
        Some(g) => format!("{g}, convolutions in {}", a.run.precision),
        None => format!("{} threads", prep.threads),
    };
    println!(
        "{}: {} parameters (the paper: about 41 M), {res} images from {}, batch {}, {on}",
        prep.model_name(&a.run),
        s.parameters,
        prep.data_name(&a.run),
        prep.batch(),
    );
    println!(
        "{} steps, {} images in {:.1} s: {:.3} images/s ({:.3} after the first step), {}FLOP/s achieved",
        s.steps,
        s.images,
        s.train_seconds,
        s.images_per_second,
        s.steady_images_per_second,
        si(s.achieved_flops)
    );
    println!(
        "FLOPs per image per step: {} ({} forward); the full model at 768×1152: {} (the paper: 691 G, measured with nvprof)",
        si(s.flops_step_per_image),
        si(s.flops_forward_per_image),
        si(at_full)
    );
    println!(
        "  {}",
        parts
            .parts()
            .iter()
            .map(|(n, f)| format!("{n} {}", si(f.training())))
            .collect::<Vec<_>>()
            .join(", ")
    );
    if s.ranks > 1 {
        println!(
            "{} ranks: {}B per rank per step into the allreduces (gradients {}); {:.3} s per step waiting for the sums",
            s.ranks,
            si(s.comm_bytes_per_step),
            match s.comm.wire {
                Wire::F32 => "in f32".to_string(),
                w => format!("compressed to {}", w.name()),
            },
            s.comm_wait_seconds / (s.steps - s.start_step).max(1) as f64
        );
    }
    println!("final training loss {:.4}", s.final_loss);
    if let Some(m) = last {
        println!(
            "held-out: mAP@0.5 {m:.4} on {} images{}",
            cfg.eval.len(),
            match s.time_to_quality {
                Some(t) => format!(", target reached after {t:.1} s"),
                None => String::new(),
            }
        );
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
    if reducer.is_none() && (a.grad_compression != "none" || a.no_overlap) {
        eprintln!(
            "note: --grad-compression and --no-overlap change how ranks exchange gradients; a single process has none to exchange (start it with mpirun -np N)"
        );
    }
    let failure = |e: train::TrainError| match e {
        train::TrainError::Device(m) => Failure::Run(anyhow!("--device cuda: {m}")),
        e => Failure::Input(anyhow!("{e}")),
    };
    if a.device != "cuda" {
        let s = match &p.job {
            Job::Detector(cfg) => p
                .pool
                .install(|| roofline_workloads::ewa::train::<f32>(cfg, monitor, reducer)),
            Job::Classifier(cfg) => p
                .pool
                .install(|| train::train_with::<f32>(cfg, monitor, reducer)),
        }
        .map_err(failure)?;
        return Ok((s, None));
    }
    let prec = roofline_workloads::gpu::precision(&a.precision).map_err(input)?;
    let (gpu, ordinal) = open_gpu(a)?;
    let gpu_name = Some(gpu.name.clone());
    let nccl = match &reducer {
        Some(r) if r.ranks() > 1 => Some(
            roofline_workloads::gpu::communicator(r.as_ref(), ordinal)
                .map_err(|e| Failure::Run(anyhow!("--device cuda: NCCL: {e}")))?,
        ),
        _ => None,
    };
    let ctx = roofline_workloads::gpu::Ctx::new(gpu, prec)
        .map_err(|e| Failure::Run(anyhow!("--device cuda: {e}")))?;
    // The GPU's handles are not Send: this thread drives it (data loads on their own threads).
    let s = match &p.job {
        Job::Detector(cfg) => {
            let mut dev = roofline_workloads::gpu::CudaDetectorTrainer::new(
                ctx,
                nccl,
                reducer.clone(),
                cfg.comm,
            );
            roofline_workloads::ewa::train_on::<f32>(cfg, monitor, reducer, Some(&mut dev))
        }
        Job::Classifier(cfg) => {
            let mut dev =
                roofline_workloads::gpu::CudaTrainer::new(ctx, nccl, reducer.clone(), cfg.comm);
            train::train_on::<f32>(cfg, monitor, reducer, Some(&mut dev))
        }
    }
    .map_err(failure)?;
    Ok((s, gpu_name))
}

/// An image size, `N` (square) or `HxW`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resolution {
    pub h: usize,
    pub w: usize,
}

impl std::str::FromStr for Resolution {
    type Err = String;
    fn from_str(s: &str) -> Result<Resolution, String> {
        let num = |v: &str| {
            v.trim()
                .parse::<usize>()
                .ok()
                .filter(|n| *n > 0)
                .ok_or_else(|| format!("{s:?}: expected N or HxW in pixels, e.g. 224 or 192x288"))
        };
        match s.split_once(['x', 'X', '×']) {
            Some((h, w)) => Ok(Resolution {
                h: num(h)?,
                w: num(w)?,
            }),
            None => {
                let n = num(s)?;
                Ok(Resolution { h: n, w: n })
            }
        }
    }
}

impl std::fmt::Display for Resolution {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}×{}", self.h, self.w)
    }
}

/// What a prepared run trains.
#[derive(Clone)]
pub enum Job {
    /// ResNet-50 classification (resnet50).
    Classifier(TrainConfig),
    /// Faster R-CNN detection (ewa).
    Detector(roofline_workloads::ewa::EwaConfig),
}

/// A training run set up from the command line.
pub struct Prepared {
    pub job: Job,
    pub threads: usize,
    pub blocks: [usize; 4],
    pub resolution: Resolution,
    pool: rayon::ThreadPool,
}

impl Prepared {
    pub fn batch(&self) -> usize {
        match &self.job {
            Job::Classifier(c) => c.batch,
            Job::Detector(c) => c.batch,
        }
    }

    pub fn steps(&self) -> usize {
        match &self.job {
            Job::Classifier(c) => c.steps,
            Job::Detector(c) => c.steps,
        }
    }

    /// A run of `steps` steps measured for its speed: no evaluation, no target.
    pub fn for_measurement(&mut self, steps: usize) {
        match &mut self.job {
            Job::Classifier(c) => {
                c.steps = steps;
                c.warmup_steps = c.warmup_steps.min(steps);
                c.eval_images = 0;
                c.target_top1 = None;
                c.eval_every = steps;
            }
            Job::Detector(c) => {
                c.steps = steps;
                c.warmup_steps = c.warmup_steps.min(steps);
                c.eval = c.eval.end..c.eval.end;
                c.target_map = None;
                c.eval_every = steps;
            }
        }
    }

    pub fn set_checkpoints(
        &mut self,
        checkpoint: Option<std::path::PathBuf>,
        resume: Option<std::path::PathBuf>,
        every: Option<usize>,
    ) {
        match &mut self.job {
            Job::Classifier(c) => {
                (c.checkpoint, c.resume, c.checkpoint_every) = (checkpoint, resume, every);
            }
            Job::Detector(c) => {
                (c.checkpoint, c.resume, c.checkpoint_every) = (checkpoint, resume, every);
            }
        }
    }

    /// Images in the training set (a bagged model's bootstrap sample draws this many).
    pub fn train_images(&self) -> usize {
        match &self.job {
            Job::Classifier(c) => c.train_images,
            Job::Detector(c) => c.train.len(),
        }
    }

    /// Base model `m` of a bagged ensemble: this run with the member's seed and bootstrap
    /// sample (keeping its held-out predictions), on its own pinned pool of `cpus`.
    pub fn member(
        &self,
        m: roofline_workloads::bagging::Member,
        cpus: &[usize],
    ) -> Result<Prepared, Failure> {
        let mut job = self.job.clone();
        match &mut job {
            Job::Classifier(c) => {
                c.seed = m.seed;
                c.ensemble = Some(m);
            }
            Job::Detector(c) => {
                c.seed = m.seed;
                c.ensemble = Some(m);
            }
        }
        let pool = roofline_kernels::affinity::pinned_pool(cpus)
            .map_err(|e| Failure::Run(anyhow!("cannot start {} threads: {e}", cpus.len())))?;
        Ok(Prepared {
            job,
            threads: cpus.len().max(1),
            blocks: self.blocks,
            resolution: self.resolution,
            pool,
        })
    }

    /// Held-out images evaluated.
    pub fn eval_images(&self) -> usize {
        match &self.job {
            Job::Classifier(c) => c.eval_images,
            Job::Detector(c) => c.eval.len(),
        }
    }

    /// Makes sure the run evaluates held-out images: the synthetic classifier's default is 512
    /// fresh images (returned); the others need --eval-images.
    pub fn ensure_eval(&mut self) -> Result<Option<usize>, String> {
        if self.eval_images() > 0 {
            return Ok(None);
        }
        match &mut self.job {
            Job::Classifier(c) if matches!(c.data, Source::Synthetic(_)) => {
                c.eval_images = 512;
                Ok(Some(512))
            }
            Job::Classifier(_) => Err(
                "quality is measured on held-out images: give --eval-images N (with DIR/val)"
                    .into(),
            ),
            Job::Detector(_) => Err(
                "quality (mAP@0.5) is measured on held-out images: give --eval-images N (the last N images of the data are held out)"
                    .into(),
            ),
        }
    }

    /// Stops the run at this quality (Top-1 or mAP@0.5).
    pub fn set_target(&mut self, value: f64) {
        match &mut self.job {
            Job::Classifier(c) => c.target_top1 = Some(value),
            Job::Detector(c) => c.target_map = Some(value),
        }
    }

    /// Another run of the same data: the model's initialisation and the order from `seed`.
    pub fn reseed(&mut self, seed: u64, data_seed: u64) {
        match &mut self.job {
            Job::Classifier(c) => {
                c.seed = seed;
                if let Source::Synthetic(s) = &mut c.data {
                    *s = Synthetic::new(s.classes, s.resolution, data_seed);
                }
            }
            // The data are a file: already the same for every run.
            Job::Detector(c) => c.seed = seed,
        }
    }

    /// Every layer's count per image (the accounting's rules).
    pub fn layers(&self) -> Vec<roofline_workloads::accounting::LayerCount> {
        match &self.job {
            Job::Classifier(c) => {
                roofline_workloads::accounting::layers(&c.model, self.resolution.h)
            }
            Job::Detector(c) => roofline_workloads::accounting::detector(
                &c.model,
                self.resolution.h,
                self.resolution.w,
            ),
        }
    }

    /// The model in words.
    pub fn model_name(&self, a: &RunArgs) -> String {
        match &self.job {
            Job::Classifier(_) => format!(
                "ResNet-50 v{} (width {}, depth {:?})",
                a.version, a.width, self.blocks
            ),
            Job::Detector(c) => format!(
                "Faster R-CNN, ResNet-50 v{}-FPN backbone (width {}, depth {:?}), {} input channels, {} classes",
                a.version, a.width, self.blocks, c.model.in_channels, c.model.classes
            ),
        }
    }

    /// The data in words.
    pub fn data_name(&self, a: &RunArgs) -> String {
        match (&self.job, &a.data) {
            (Job::Classifier(c), None) => format!("synthetic ({} classes)", c.model.classes),
            (Job::Classifier(_), Some(d)) => d.display().to_string(),
            (Job::Detector(c), None) => format!(
                "synthetic Extreme Weather fields ({})",
                c.data.paths[0].display()
            ),
            (Job::Detector(c), Some(_)) => c
                .data
                .paths
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(", "),
        }
    }

    /// The schedule and optimiser in words (for reports).
    pub fn describe(&self) -> Vec<(&'static str, serde_json::Value)> {
        use serde_json::json;
        match &self.job {
            Job::Classifier(c) => vec![
                ("training images", json!(c.train_images)),
                ("held-out images", json!(c.eval_images)),
                (
                    "learning rate",
                    json!(format!(
                        "{} per 256 images × batch / 256, linear warm-up over {} steps, cosine decay",
                        c.base_lr_per_256, c.warmup_steps
                    )),
                ),
                ("label smoothing", json!(c.label_smoothing)),
            ],
            Job::Detector(c) => vec![
                ("training images", json!(c.train.len())),
                ("held-out images", json!(c.eval.len())),
                (
                    "learning rate",
                    json!(format!(
                        "{} per 16 images × batch / 16, linear warm-up over {} steps, cosine decay",
                        c.base_lr_per_16, c.warmup_steps
                    )),
                ),
                (
                    "sampling",
                    json!(format!(
                        "RPN {} anchors per image (half foreground at most), {} proposals after NMS; second stage {} regions per image (a quarter foreground at most)",
                        c.model.rpn_per_image, c.model.rpn_train.post_nms, c.model.roi_per_image
                    )),
                ),
            ],
        }
    }

    pub fn comm(&self) -> CommOptions {
        match &self.job {
            Job::Classifier(c) => c.comm,
            Job::Detector(c) => c.comm,
        }
    }

    pub fn eval_every(&self) -> usize {
        match &self.job {
            Job::Classifier(c) => c.eval_every,
            Job::Detector(c) => c.eval_every,
        }
    }
}

/// The CPUs a run of `threads` threads trains on: the first it may use (at least one).
pub fn training_cpus(threads: usize) -> Vec<usize> {
    let all = roofline_kernels::affinity::allowed_cpus();
    all[..threads.min(all.len()).max(1)].to_vec()
}

/// Checks `run` and builds its configuration for `workload` (no checkpoints; the caller adds
/// them) and its pinned thread pool.
pub fn prepare(a: &RunArgs, workload: &str) -> Result<Prepared, Failure> {
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
    if a.steps == Some(0) || a.epochs == Some(0) {
        return Err(input("nothing to train: --steps or --epochs is 0".into()));
    }
    let comm = CommOptions {
        wire: Wire::parse(&a.grad_compression).map_err(input)?,
        overlap: !a.no_overlap,
        bucket: a.bucket_elements,
    };
    let version = if a.version == "1" {
        Version::V1
    } else {
        Version::V1_5
    };
    let (job, resolution) = match workload {
        "ewa" => detector(a, blocks, version, comm)?,
        _ => classifier(a, blocks, version, comm)?,
    };
    let threads = a
        .threads
        .unwrap_or_else(|| roofline_kernels::affinity::allowed_cpus().len());
    let pool = roofline_kernels::affinity::pinned_pool(&training_cpus(threads))
        .map_err(|e| Failure::Run(anyhow!("cannot start {threads} threads: {e}")))?;
    Ok(Prepared {
        job,
        threads,
        blocks,
        resolution,
        pool,
    })
}

/// Steps from --steps / --epochs (default 20).
fn steps_of(a: &RunArgs, train_images: usize, batch: usize) -> usize {
    match (a.steps, a.epochs) {
        (_, Some(e)) => (e * train_images.max(1)).div_ceil(batch),
        (Some(s), None) => s,
        (None, None) => 20,
    }
}

fn classifier(
    a: &RunArgs,
    blocks: [usize; 4],
    version: Version,
    comm: CommOptions,
) -> Result<(Job, Resolution), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    if a.target_map.is_some() {
        return Err(input(
            "--target-map is ewa's (mAP@0.5); resnet50 stops at --target-top1".into(),
        ));
    }
    let res = a.resolution.unwrap_or(Resolution { h: 224, w: 224 });
    if res.h != res.w {
        return Err(input(format!(
            "--resolution {}x{}: resnet50 trains on square images (--resolution N)",
            res.h, res.w
        )));
    }
    let resolution = res.h;
    let batch = a.batch.unwrap_or(32);
    let train_images = a.train_images.unwrap_or(1281);
    if batch == 0
        || resolution < 32
        || a.classes < 2
        || !(a.width > 0.0 && a.width <= 4.0)
        || train_images == 0
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
    let (source, classes, train_images, eval_images) = match &a.data {
        None => (
            Source::Synthetic(Synthetic::new(a.classes, resolution, a.seed)),
            a.classes,
            train_images,
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
                    resolution,
                },
                classes,
                n,
                eval_images,
            )
        }
    };
    let steps = steps_of(a, train_images, batch);
    let cfg = TrainConfig {
        model: Config {
            version,
            blocks,
            width: a.width,
            classes,
            zero_init_residual: false,
        },
        data: source,
        batch,
        steps,
        train_images,
        eval_images,
        warmup_steps: a.warmup_steps.unwrap_or(steps / 10),
        base_lr_per_256: a.lr.unwrap_or(0.1),
        label_smoothing: a.label_smoothing,
        seed: a.seed,
        decay: Decay::Cosine,
        target_top1: a.target_top1,
        eval_every: a.eval_every.unwrap_or(steps),
        checkpoint: None,
        resume: None,
        stop_at: None,
        checkpoint_every: None,
        comm,
        ensemble: None,
    };
    Ok((Job::Classifier(cfg), res))
}

/// The Extreme Weather files of `--data`: the file itself, or a folder's climo_*.h5 (else its
/// *.h5), in name order.
fn ewa_files(path: &std::path::Path) -> Result<Vec<std::path::PathBuf>, String> {
    if !path.is_dir() {
        if !path.is_file() {
            return Err(format!("--data {}: no such file or folder", path.display()));
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let mut h5: Vec<std::path::PathBuf> = std::fs::read_dir(path)
        .map_err(|e| format!("--data {}: {e}", path.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "h5"))
        .collect();
    h5.sort();
    let climo: Vec<std::path::PathBuf> = h5
        .iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("climo_"))
        })
        .cloned()
        .collect();
    let files = if climo.is_empty() { h5 } else { climo };
    if files.is_empty() {
        return Err(format!(
            "--data {}: no .h5 files (the Extreme Weather data are climo_<year>.h5)",
            path.display()
        ));
    }
    Ok(files)
}

fn detector(
    a: &RunArgs,
    blocks: [usize; 4],
    version: Version,
    comm: CommOptions,
) -> Result<(Job, Resolution), Failure> {
    use roofline_workloads::detect::model::DetectorConfig;
    use roofline_workloads::ewa::EwaConfig;
    use roofline_workloads::ewa_data::{write_synthetic, EwaSet};
    let input = |m: String| Failure::Input(anyhow!(m));
    if a.target_top1.is_some() {
        return Err(input(
            "--target-top1 is resnet50's; ewa stops at --target-map (mAP@0.5)".into(),
        ));
    }
    let res = a.resolution.unwrap_or(Resolution { h: 768, w: 1152 });
    let batch = a.batch.unwrap_or(2);
    if batch == 0 || res.h < 64 || res.w < 64 || !(a.width > 0.0 && a.width <= 4.0) {
        return Err(input(
            "expected --batch ≥ 1, --resolution of at least 64x64 (P6 has stride 64), 0 < --width ≤ 4".into(),
        ));
    }
    if blocks.contains(&0) {
        return Err(input(format!(
            "--depth {}: the feature pyramid needs a block in every stage",
            a.depth
        )));
    }
    if a.target_map.is_some_and(|t| !(t > 0.0 && t <= 1.0))
        || (a.target_map.is_some() && a.eval_images == 0)
    {
        return Err(input(
            "--target-map takes an mAP in (0, 1] and needs --eval-images".into(),
        ));
    }
    let files = match &a.data {
        Some(p) => ewa_files(p).map_err(input)?,
        None => {
            let n = a.train_images.unwrap_or(16) + a.eval_images;
            if n == a.eval_images {
                return Err(input("--train-images 0: nothing to train on".into()));
            }
            let path = std::env::temp_dir().join(format!(
                "roofline-ewa-synthetic-{n}x{}x{}-seed{}.h5",
                res.h, res.w, a.seed
            ));
            if !path.is_file() {
                eprintln!(
                    "writing {n} synthetic Extreme Weather images at {res} to {} …",
                    path.display()
                );
                write_synthetic(&path, n, res.h, res.w, a.seed)
                    .map_err(|e| Failure::Run(anyhow!("synthetic data: {e}")))?;
            }
            vec![path]
        }
    };
    let data = EwaSet::open(&files, res.h, res.w).map_err(|e| input(format!("--data: {e}")))?;
    let n = data.len();
    if a.eval_images >= n {
        return Err(input(format!(
            "--eval-images {}: the data hold {n} images, and some must remain to train on",
            a.eval_images
        )));
    }
    let train_end = match (&a.data, a.train_images) {
        (Some(_), Some(t)) => t.min(n - a.eval_images),
        _ => n - a.eval_images,
    };
    if train_end == 0 {
        return Err(input("--train-images 0: nothing to train on".into()));
    }
    let steps = steps_of(a, train_end, batch);
    let mut model = DetectorConfig::scaled(a.width, blocks, res.h, res.w);
    model.backbone.version = version;
    let cfg = EwaConfig {
        model,
        data: Arc::new(data),
        train: 0..train_end,
        eval: n - a.eval_images..n,
        batch,
        steps,
        warmup_steps: a.warmup_steps.unwrap_or(steps / 10),
        base_lr_per_16: a.lr.unwrap_or(0.02),
        seed: a.seed,
        target_map: a.target_map,
        eval_every: a.eval_every.unwrap_or(steps),
        checkpoint: None,
        resume: None,
        stop_at: None,
        checkpoint_every: None,
        comm,
        ensemble: None,
    };
    Ok((Job::Detector(cfg), res))
}
