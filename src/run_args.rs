//! The run options `train`, `place`, `score` and `sweep` share, typed, and the run they make.

use crate::exit::Failure;
use anyhow::anyhow;
use clap::builder::TypedValueParser;
use roofline_model::Precision;
use roofline_workloads::exchange::{CommOptions, Wire};
use roofline_workloads::gpu::GraphMode;
use roofline_workloads::resnet::Version;
use roofline_workloads::run::{self, Depth, Device, Kind, Resolution, Spec};

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
    #[arg(long, value_name = "FRACTION", allow_negative_numbers = true)]
    pub target_top1: Option<f64>,
    /// ewa: stop when held-out mAP@0.5 reaches this value (the paper's target: 0.35), as
    /// --target-top1 does.
    #[arg(long, value_name = "MAP", allow_negative_numbers = true)]
    pub target_map: Option<f64>,
    /// Evaluate every this many steps (default: at the end only).
    #[arg(long, value_name = "STEPS",
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub eval_every: Option<usize>,
    /// resnet50: classes (ewa has its four weather classes).
    #[arg(long, default_value_t = 1000)]
    pub classes: usize,
    /// ewa: anchors a cell on every pyramid level: 9 (three sizes × three ratios, the paper's
    /// model) or 3 (one size × three ratios, torchvision's default).
    #[arg(long, default_value_t = 9, value_name = "N")]
    pub anchors: usize,
    /// Width multiplier of the backbone (1 = ResNet-50; 0.25 for small test models); for ewa
    /// the pyramid (256) and box head (1024) scale with it.
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub width: f64,
    /// Bottlenecks per stage, comma-separated (ResNet-50: 3,4,6,3).
    #[arg(long, default_value = "3,4,6,3")]
    pub depth: String,
    /// ResNet version: 1.5 (stride in the 3×3) or 1 (stride in the first 1×1).
    #[arg(long, value_enum, default_value = "1.5")]
    pub version: Version,
    /// Learning-rate warm-up, in steps: the rate rises linearly from 0 to its peak over these
    /// first steps, then decays (default: a tenth of the run's steps).
    #[arg(long)]
    pub warmup_steps: Option<usize>,
    /// Learning rate: resnet50 per 256 images (default 0.1), ewa per 16 images (default 0.02,
    /// torchvision's detection reference); scaled linearly with the batch.
    #[arg(long, allow_negative_numbers = true, value_parser = crate::args::positive_number)]
    pub lr: Option<f64>,
    /// Label smoothing, from 0 (hard labels) up to below 1: the true class gets 1 − ε of the
    /// target's probability and every class ε / classes (resnet50).
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true,
          value_parser = crate::args::fraction_below_one)]
    pub label_smoothing: f64,
    /// Which parameters weight decay (1e-4) applies to: all (every parameter, batch norm's γ
    /// and β and the biases included: HPC AI500 V2.0's rule, §5.4, and `score`'s default), or
    /// weights (the convolution and classifier weights alone: `train`'s and `place`'s default;
    /// in a score, a deviation the report names).
    #[arg(long, value_enum, value_name = "WHICH")]
    pub weight_decay_on: Option<DecayOn>,
    /// Start resnet50 from pretrained weights: torchvision's ResNet-50 state dict saved as
    /// safetensors, or Keras's ResNet50 weights in HDF5 (model.save_weights, Keras 2's names or
    /// keras_applications' older res2a_branch2a ones; AIPerf's file). Layers are mapped by name and shape (torchvision's names; a Keras convolution's
    /// bias folded into its batch norm); a file that does not fit the model (--classes,
    /// --width, --depth) is refused, naming the first tensor that differs.
    #[arg(long, value_name = "FILE")]
    pub init: Option<std::path::PathBuf>,
    /// Seed (same seed, same thread count: the same run).
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Threads, one pinned per physical core: the first N cores roofline may use (default: all
    /// of them); the rule of every verb, `probe` included. N beyond the cores is an error
    /// that says how many there are.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Where to run: cpu, or cuda (resnet50: cuDNN convolutions, cuBLAS classifier, NVRTC
    /// kernels for the rest; ewa: the detector on the same layers, NVRTC RoIAlign and pyramid
    /// kernels, proposals and losses on the device; automl:FILE (place): the candidate's
    /// network walked node by node over the same layers; under mpirun one GPU per rank,
    /// gradients summed with NCCL).
    #[arg(long, value_enum, default_value = "cpu")]
    pub device: Device,
    /// The precision of the products. On the CPU: f32, or bf16 (mixed precision) where the
    /// CPU has AVX512_BF16. With --device cuda: f32; tf32 (tensor cores round the inputs); f16
    /// or bf16 (mixed precision: f32 master weights, batch norm and loss in f32, dynamic loss
    /// scaling for f16).
    #[arg(long, default_value = "f32", value_parser = precision_parser())]
    pub precision: Precision,
    /// With --device cuda: the GPU to use (default: the launcher's local rank modulo the GPU
    /// count, else 0).
    #[arg(long, value_name = "N")]
    pub gpu: Option<usize>,
    /// With --device cuda (resnet50 on one GPU): launch each training step as one CUDA graph,
    /// captured after warm-up, instead of enqueueing its ~1000 kernels and library calls one by
    /// one. auto: time 3 steps each way after warm-up and keep the faster (train --json
    /// reports both figures); on: keep the graph; off: never capture. Steps the timeline
    /// times layer by layer (place), a batch of another size, and multi-GPU runs are enqueued
    /// call by call.
    #[arg(long, value_enum, default_value = "auto", value_name = "MODE")]
    pub cuda_graph: GraphMode,
    /// Under mpirun: the gradients' number format on the wire. none (f32); fp16 (HPC AI500
    /// V2.0 section 7.5.2: half the bytes; on the CPU each bucket is scaled by a power of two
    /// the ranks agree on, so that sums cannot overflow, and summed over a ring of 16-bit
    /// messages; on GPUs NCCL sums f16 under the dynamic loss scale); bf16 (f32's range, 8
    /// mantissa bits).
    #[arg(long, value_enum, default_value = "none", value_name = "FORMAT")]
    pub grad_compression: Wire,
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

/// The parameters weight decay applies to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum DecayOn {
    /// Every parameter (HPC AI500's rule).
    All,
    /// The convolution and classifier weights alone.
    Weights,
}

/// The trainer's precisions (the model's others are the probe's).
pub(crate) fn precision_parser() -> impl clap::builder::TypedValueParser<Value = Precision> {
    clap::builder::PossibleValuesParser::new(run::prepare::TRAINER_PRECISIONS.map(|p| p.name()))
        .try_map(|s| s.parse::<Precision>())
}

impl RunArgs {
    /// The typed run these options describe for `workload` (a bad --depth is an input error on
    /// one line, as the library's own are).
    pub fn spec(&self, workload: Kind) -> Result<Spec, Failure> {
        let depth = self
            .depth
            .parse::<Depth>()
            .map_err(|e| Failure::Input(anyhow!("--depth {e}")))?;
        Ok(Spec {
            workload,
            data: self.data.clone(),
            batch: self.batch,
            resolution: self.resolution,
            steps: self.steps,
            epochs: self.epochs,
            train_images: self.train_images,
            eval_images: self.eval_images,
            target_top1: self.target_top1,
            target_map: self.target_map,
            eval_every: self.eval_every,
            classes: self.classes,
            anchors: self.anchors,
            width: self.width,
            depth,
            version: self.version,
            warmup_steps: self.warmup_steps,
            lr: self.lr,
            label_smoothing: self.label_smoothing,
            seed: self.seed,
            threads: self.threads,
            device: self.device,
            precision: self.precision,
            gpu: self.gpu,
            cuda_graph: self.cuda_graph,
            decay_all: self.weight_decay_on == Some(DecayOn::All),
            init: self.init.clone(),
            comm: CommOptions {
                wire: self.grad_compression,
                overlap: !self.no_overlap,
                bucket: self.bucket_elements,
            },
        })
    }

    pub fn cuda(&self) -> bool {
        self.device == Device::Cuda
    }
}

/// `prepare` for `workload`, with the command line's failure; a single process told how to
/// exchange gradients hears that it has none to exchange.
pub fn prepare(a: &RunArgs, workload: Kind) -> Result<run::Prepared, Failure> {
    let p = run::prepare(&a.spec(workload)?)?;
    let c = p.spec.comm;
    if roofline_kernels::comm::launched_ranks().is_none() && (c.wire != Wire::F32 || !c.overlap) {
        eprintln!(
            "note: --grad-compression and --no-overlap change how ranks exchange gradients; a single process has none to exchange (start it with mpirun -np N)"
        );
    }
    Ok(p)
}
