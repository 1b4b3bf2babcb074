//! A run built from typed choices ([`Spec`], what `train`, `place` and `score` are told on the
//! command line): the workload's configuration, checked, and its pinned thread pool.

use super::{RunError, RunOptions, Workload};
use crate::data::{DataError, Synthetic};
use crate::ewa::EwaConfig;
use crate::exchange::CommOptions;
use crate::folder::ImageFolder;
use crate::resnet::{Config, Version};
use crate::tensor::{Bf16Gemm, Products};
use crate::train::{Decay, Source, TrainConfig};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The training workloads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Kind {
    /// ResNet-50 classification (ImageNet-style).
    Resnet50,
    /// HPC AI500's Extreme Weather detection (Faster R-CNN, ResNet-50-FPN).
    Ewa,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Resnet50 => "resnet50",
            Kind::Ewa => "ewa",
        }
    }
}

/// Where a run trains.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Device {
    #[default]
    Cpu,
    Cuda,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Device {
    pub fn name(self) -> &'static str {
        match self {
            Device::Cpu => "cpu",
            Device::Cuda => "cuda",
        }
    }
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

/// Bottlenecks per stage (ResNet-50: 3,4,6,3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Depth(pub [usize; 4]);

impl std::str::FromStr for Depth {
    type Err = String;
    fn from_str(s: &str) -> Result<Depth, String> {
        let bad = || format!("{s}: expected four numbers, e.g. 3,4,6,3");
        let v: Vec<usize> = s
            .split(',')
            .map(|x| x.trim().parse::<usize>())
            .collect::<Result<_, _>>()
            .map_err(|_| bad())?;
        Ok(Depth(v.try_into().map_err(|_| bad())?))
    }
}

impl std::fmt::Display for Depth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let [a, b, c, d] = self.0;
        write!(f, "{a},{b},{c},{d}")
    }
}

/// Everything a training run is told, typed (the command line's shared run options).
#[derive(Clone, Debug)]
pub struct Spec {
    pub workload: Kind,
    /// A folder (resnet50) or Extreme Weather files (ewa); synthetic data when `None`.
    pub data: Option<PathBuf>,
    pub batch: Option<usize>,
    pub resolution: Option<Resolution>,
    pub steps: Option<usize>,
    pub epochs: Option<usize>,
    pub train_images: Option<usize>,
    pub eval_images: usize,
    pub target_top1: Option<f64>,
    pub target_map: Option<f64>,
    pub eval_every: Option<usize>,
    pub classes: usize,
    /// ewa: anchors a cell (9 or 3).
    pub anchors: usize,
    pub width: f64,
    pub depth: Depth,
    pub version: Version,
    pub warmup_steps: Option<usize>,
    pub lr: Option<f64>,
    pub label_smoothing: f64,
    pub seed: u64,
    pub threads: Option<usize>,
    pub device: Device,
    /// The GPU's convolution precision (f32, tf32, f16, bf16).
    pub precision: roofline_model::Precision,
    pub gpu: Option<usize>,
    /// Whether the GPU trainer launches its step as a CUDA graph.
    pub cuda_graph: crate::gpu::GraphMode,
    /// Weight decay on every parameter (HPC AI500's rule), or on the weights alone.
    pub decay_all: bool,
    pub comm: CommOptions,
    /// Pretrained ResNet-50 weights to start from (torchvision safetensors or Keras HDF5).
    pub init: Option<PathBuf>,
}

/// What a prepared run trains.
#[derive(Clone)]
pub enum Job {
    /// ResNet-50 classification (resnet50).
    Classifier(TrainConfig),
    /// Faster R-CNN detection (ewa).
    Detector(EwaConfig),
    /// A described network on the classifier's data (an AutoML candidate, `label`).
    Graph {
        task: crate::train::GraphTask,
        label: String,
    },
}

impl Job {
    pub fn workload(&self) -> &dyn Workload {
        match self {
            Job::Classifier(c) => c,
            Job::Detector(c) => c,
            Job::Graph { task, .. } => task,
        }
    }

    pub fn workload_mut(&mut self) -> &mut dyn Workload {
        match self {
            Job::Classifier(c) => c,
            Job::Detector(c) => c,
            Job::Graph { task, .. } => task,
        }
    }
}

/// A training run set up: its configuration, what it was built from, its thread pool.
pub struct Prepared {
    pub job: Job,
    pub spec: Spec,
    pub threads: usize,
    /// The CPUs the run's threads are pinned to, one per physical core.
    pub cpus: Vec<usize>,
    pub resolution: Resolution,
    pub(super) pool: rayon::ThreadPool,
}

impl Prepared {
    pub fn workload(&self) -> &dyn Workload {
        self.job.workload()
    }

    pub fn run(&self) -> &RunOptions {
        self.job.workload().run()
    }

    pub fn run_mut(&mut self) -> &mut RunOptions {
        self.job.workload_mut().run_mut()
    }

    pub fn batch(&self) -> usize {
        self.run().batch
    }

    pub fn steps(&self) -> usize {
        self.run().steps
    }

    /// A run of `steps` steps measured for its speed: no evaluation, no target.
    pub fn for_measurement(&mut self, steps: usize) {
        let w = self.job.workload_mut();
        w.no_evaluation();
        let r = w.run_mut();
        r.steps = steps;
        r.warmup_steps = r.warmup_steps.min(steps);
        r.target = None;
        r.eval_every = steps;
    }

    pub fn set_checkpoints(
        &mut self,
        checkpoint: Option<PathBuf>,
        resume: Option<PathBuf>,
        every: Option<usize>,
    ) {
        let r = self.run_mut();
        (r.checkpoint, r.resume, r.checkpoint_every) = (checkpoint, resume, every);
    }

    /// Base model `m` of a bagged ensemble: this run with the member's seed and bootstrap
    /// sample (keeping its held-out predictions), on its own pinned pool of `cpus`.
    pub fn member(&self, m: crate::bagging::Member, cpus: &[usize]) -> Result<Prepared, RunError> {
        let mut job = self.job.clone();
        let r = job.workload_mut().run_mut();
        r.seed = m.seed;
        r.ensemble = Some(m);
        Ok(Prepared {
            job,
            spec: self.spec.clone(),
            threads: cpus.len().max(1),
            cpus: cpus.to_vec(),
            resolution: self.resolution,
            pool: pool(cpus, cpu_products(&self.spec)?)?,
        })
    }

    /// Makes sure the run evaluates held-out images: the synthetic classifier's default is 512
    /// fresh images (returned); the others need --eval-images.
    pub fn ensure_eval(&mut self) -> Result<Option<usize>, RunError> {
        if self.job.workload().eval_images() > 0 {
            return Ok(None);
        }
        match &mut self.job {
            Job::Classifier(c) | Job::Graph { task: crate::train::GraphTask { classify: c, .. }, .. }
                if matches!(c.data, Source::Synthetic(_)) =>
            {
                c.eval_images = 512;
                Ok(Some(512))
            }
            Job::Classifier(_) | Job::Graph { .. } => Err(RunError::Input(
                "quality is measured on held-out images: give --eval-images N (with DIR/val)".into(),
            )),
            Job::Detector(_) => Err(RunError::Input(
                "quality (mAP@0.5) is measured on held-out images: give --eval-images N (the last N images of the data are held out)"
                    .into(),
            )),
        }
    }

    /// Another run of the same data: the model's initialisation and the order from `seed`.
    pub fn reseed(&mut self, seed: u64, data_seed: u64) {
        self.run_mut().seed = seed;
        // The detector's data are a file: already the same for every run.
        if let Job::Classifier(c)
        | Job::Graph {
            task: crate::train::GraphTask { classify: c, .. },
            ..
        } = &mut self.job
        {
            if let Source::Synthetic(s) = &mut c.data {
                *s = Synthetic::new(s.classes, s.resolution, data_seed);
            }
        }
    }

    /// Every layer's count per image (the accounting's rules).
    pub fn layers(&self) -> Vec<crate::accounting::LayerCount> {
        self.job
            .workload()
            .layers(self.resolution.h, self.resolution.w)
    }

    /// The workload's name in reports (resnet50, ewa, or the AutoML candidate's label).
    pub fn workload_name(&self) -> String {
        match &self.job {
            Job::Graph { label, .. } => label.clone(),
            _ => self.spec.workload.name().to_string(),
        }
    }

    /// The model in words.
    pub fn model_name(&self) -> String {
        let s = &self.spec;
        let v = s.version;
        match &self.job {
            Job::Classifier(_) => format!("ResNet-50 v{v} (width {}, depth {:?})", s.width, s.depth.0),
            Job::Graph { task, label } => format!(
                "{label} ({} convolution and dense layers, {} nodes)",
                crate::graph::morph::layer_count(&task.net),
                task.net.nodes.len()
            ),
            Job::Detector(c) => format!(
                "Faster R-CNN, ResNet-50 v{v}-FPN backbone (width {}, depth {:?}), {} input channels, {} classes",
                s.width, s.depth.0, c.model.in_channels, c.model.classes
            ),
        }
    }

    /// The data in words.
    pub fn data_name(&self) -> String {
        match (&self.job, &self.spec.data) {
            (Job::Classifier(c), None) => format!("synthetic ({} classes)", c.model.classes),
            (Job::Graph { task, .. }, None) => match &task.classify.data {
                Source::Synthetic(s) => format!("synthetic ({} classes)", s.classes),
                Source::Folder { train, .. } => train.root.display().to_string(),
            },
            (Job::Classifier(_) | Job::Graph { .. }, Some(d)) => d.display().to_string(),
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
}

/// The precisions the trainer's convolutions run in (the model's others are the probe's).
pub const TRAINER_PRECISIONS: [roofline_model::Precision; 4] = [
    roofline_model::Precision::F32,
    roofline_model::Precision::Tf32,
    roofline_model::Precision::F16,
    roofline_model::Precision::Bf16,
];

/// `p` when the trainer runs in it, else the input error that lists the ones it does.
pub fn trainer_precision(
    p: roofline_model::Precision,
) -> Result<roofline_model::Precision, RunError> {
    if TRAINER_PRECISIONS.contains(&p) {
        Ok(p)
    } else {
        Err(RunError::Input(format!(
            "--precision {p}: the trainer's convolutions run in f32, tf32, f16 or bf16"
        )))
    }
}

/// The pinned pool of a run's threads, its products set (bf16 mixed precision on the CPU).
fn pool(cpus: &[usize], products: Products) -> Result<rayon::ThreadPool, RunError> {
    let pool =
        roofline_kernels::affinity::pinned_pool(cpus).map_err(|source| RunError::Threads {
            threads: cpus.len(),
            source,
        })?;
    crate::tensor::set_products(&pool, products);
    Ok(pool)
}

/// What the CPU layers' matrix products run in for `spec` (f32, or bf16 on CPUs with the
/// instruction), or why `spec` cannot run on the CPU.
pub fn cpu_products(spec: &Spec) -> Result<Products, RunError> {
    use roofline_model::Precision as P;
    match (spec.device, spec.precision) {
        (Device::Cuda, _) | (_, P::F32) => Ok(Products::Native),
        (_, P::Bf16) => Bf16Gemm::detect().map(Products::Bf16).map_err(|why| {
            RunError::Input(format!(
                "--precision bf16 on the CPU: {why}; train in f32 (the default) here, or bf16 on a GPU"
            ))
        }),
        (_, p) => Err(RunError::Input(format!(
            "--precision {p} applies to --device cuda; the CPU trains in f32, or bf16 on CPUs with AVX512_BF16"
        ))),
    }
}

/// `ROOFLINE_ISA` for a CPU run: refused where it names no instruction set (as `probe` refuses
/// it), and where it caps, said on stderr with what it does not reach.
fn isa_cap_note() -> Result<(), RunError> {
    use roofline_kernels::cpu::isa::{Isa, ENV};
    match Isa::cap() {
        Err(e) => Err(RunError::Input(e.to_string())),
        Ok(Some(cap)) if cap < Isa::detected() => {
            eprintln!(
                "{ENV}={}: the trainer's element-wise passes and roofline's own kernels run {} \
                 (this CPU has {}); the gemm crate's products take the CPU's widest set that the \
                 crate was built for (AVX-512 in the default build: build without its \
                 \"x86-v4\" feature to cap them too)",
                cap.name(),
                Isa::current().name(),
                Isa::detected().name()
            );
            Ok(())
        }
        Ok(_) => Ok(()),
    }
}

/// Checks `spec` and builds its configuration (no checkpoints; the caller adds them) and its
/// pinned thread pool.
pub fn prepare(spec: &Spec) -> Result<Prepared, RunError> {
    let input = |m: String| RunError::Input(m);
    if spec.device != Device::Cuda && spec.gpu.is_some() {
        return Err(input("--gpu applies to --device cuda".into()));
    }
    trainer_precision(spec.precision)?;
    let products = cpu_products(spec)?;
    if spec.device != Device::Cuda {
        isa_cap_note()?;
    }
    crate::alloc::enable_for_training();
    if spec.steps == Some(0) || spec.epochs == Some(0) {
        return Err(input("nothing to train: --steps or --epochs is 0".into()));
    }
    let (job, resolution) = match spec.workload {
        Kind::Ewa => detector(spec)?,
        Kind::Resnet50 => classifier(spec)?,
    };
    // The one rule for cores: one pinned thread per physical core, the first --threads.
    let cpus = roofline_kernels::affinity::cores(spec.threads)
        .map_err(|e| input(e.to_string()))?
        .chosen;
    let prepared = Prepared {
        job,
        spec: spec.clone(),
        threads: cpus.len(),
        resolution,
        pool: pool(&cpus, products)?,
        cpus,
    };
    let ranks = roofline_kernels::comm::launched_ranks().unwrap_or(1);
    let what = format!(
        "--batch {} on {} training images at {}x{}{}",
        prepared.batch(),
        prepared.workload().train_images(),
        resolution.h,
        resolution.w,
        if ranks > 1 {
            format!(" ({ranks} ranks: each rank's share)")
        } else {
            String::new()
        }
    );
    roofline_collectors::fits_in_memory(prepared.least_memory(ranks), &what).map_err(input)?;
    Ok(prepared)
}

/// Steps from --steps / --epochs (default 20).
fn steps_of(a: &Spec, train_images: usize, batch: usize) -> usize {
    match (a.steps, a.epochs) {
        (_, Some(e)) => (e * train_images.max(1)).div_ceil(batch),
        (Some(s), None) => s,
        (None, None) => 20,
    }
}

/// The shared options of a run of `steps` steps on `batch` images.
fn run_options(a: &Spec, batch: usize, steps: usize, target: Option<f64>) -> RunOptions {
    RunOptions {
        warmup_steps: a.warmup_steps.unwrap_or(steps / 10),
        target,
        decay_all: a.decay_all,
        eval_every: a.eval_every.unwrap_or(steps),
        comm: a.comm,
        ..RunOptions::new(batch, steps, a.seed)
    }
}

fn classifier(a: &Spec) -> Result<(Job, Resolution), RunError> {
    let input = |m: String| RunError::Input(m);
    if a.target_map.is_some() {
        return Err(input(
            "--target-map is ewa's (mAP@0.5); resnet50 stops at --target-top1".into(),
        ));
    }
    if a.anchors != 9 {
        return Err(input(format!(
            "--anchors {} is ewa's (the detector's anchors a cell); resnet50 has none",
            a.anchors
        )));
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
    // The one constraint broken, said alone (the first of them, in the options' order).
    let broken = [
        (batch == 0, format!("--batch {batch}: give 1 or more")),
        (
            resolution < 32,
            format!("--resolution {resolution}: give 32 or more (resnet50 downsamples by 32)"),
        ),
        (
            a.classes < 2,
            format!("--classes {}: give 2 or more", a.classes),
        ),
        (
            !(a.width > 0.0 && a.width <= 4.0),
            format!("--width {}: give more than 0 and at most 4", a.width),
        ),
        (
            train_images == 0,
            "--train-images 0: give 1 or more".to_string(),
        ),
    ];
    if let Some((_, why)) = broken.into_iter().find(|b| b.0) {
        return Err(input(why));
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
            version: a.version,
            blocks: a.depth.0,
            width: a.width,
            classes,
            zero_init_residual: false,
        },
        data: source,
        train_images,
        eval_images,
        base_lr_per_256: a.lr.unwrap_or(0.1),
        label_smoothing: a.label_smoothing,
        decay: Decay::Cosine,
        run: run_options(a, batch, steps, a.target_top1),
    };
    let mut cfg = cfg;
    if let Some(path) = &a.init {
        // Read and checked against the model now: a file that does not fit is bad input.
        let p = crate::init::Pretrained::read(path).map_err(|e| input(e.to_string()))?;
        p.check(&crate::resnet::ResNet::<f32>::new(cfg.model.clone(), 0).shapes())
            .map_err(|e| input(e.to_string()))?;
        cfg.run.init = Some(std::sync::Arc::new(p));
    }
    Ok((Job::Classifier(cfg), res))
}

/// The Extreme Weather files of `--data`: the file itself, or a folder's climo_*.h5 (else its
/// *.h5), in name order.
fn ewa_files(path: &Path) -> Result<Vec<PathBuf>, DataError> {
    if !path.is_dir() {
        if !path.is_file() {
            return Err(DataError::Missing(path.to_path_buf()));
        }
        return Ok(vec![path.to_path_buf()]);
    }
    let mut h5: Vec<PathBuf> = std::fs::read_dir(path)
        .map_err(|source| DataError::Read {
            path: path.to_path_buf(),
            source,
        })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "h5"))
        .collect();
    h5.sort();
    let climo: Vec<PathBuf> = h5
        .iter()
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("climo_"))
        })
        .cloned()
        .collect();
    let files = if climo.is_empty() { h5 } else { climo };
    if files.is_empty() {
        return Err(DataError::File {
            path: path.to_path_buf(),
            what: "no .h5 files (the Extreme Weather data are climo_<year>.h5)".into(),
        });
    }
    Ok(files)
}

fn detector(a: &Spec) -> Result<(Job, Resolution), RunError> {
    use crate::detect::model::DetectorConfig;
    use crate::ewa_data::{write_synthetic, EwaSet};
    let input = |m: String| RunError::Input(m);
    if a.init.is_some() {
        return Err(input(
            "--init loads ResNet-50 weights for resnet50; the ewa detector starts from its seed"
                .into(),
        ));
    }
    if a.target_top1.is_some() {
        return Err(input(
            "--target-top1 is resnet50's; ewa stops at --target-map (mAP@0.5)".into(),
        ));
    }
    if a.label_smoothing != 0.0 {
        return Err(input(
            "--label-smoothing smooths resnet50's class labels; the ewa detector's losses take none"
                .into(),
        ));
    }
    let res = a.resolution.unwrap_or(Resolution { h: 768, w: 1152 });
    let batch = a.batch.unwrap_or(2);
    let broken = [
        (batch == 0, format!("--batch {batch}: give 1 or more")),
        (
            res.h < 64 || res.w < 64,
            format!(
                "--resolution {}x{}: give at least 64x64 (P6 has stride 64)",
                res.h, res.w
            ),
        ),
        (
            !(a.width > 0.0 && a.width <= 4.0),
            format!("--width {}: give more than 0 and at most 4", a.width),
        ),
    ];
    if let Some((_, why)) = broken.into_iter().find(|b| b.0) {
        return Err(input(why));
    }
    if a.depth.0.contains(&0) {
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
    // Checked before any data is read or written.
    let anchored = |model: DetectorConfig| {
        model
            .with_anchors(a.anchors)
            .map_err(|e| input(format!("--anchors {e}")))
    };
    anchored(DetectorConfig::ewa())?;
    let files = match &a.data {
        Some(p) => ewa_files(p).map_err(|e| input(format!("--data {e}")))?,
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
                    .map_err(|e| RunError::Run(format!("synthetic data: {e}")))?;
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
    let mut model = anchored(DetectorConfig::scaled(a.width, a.depth.0, res.h, res.w))?;
    model.backbone.version = a.version;
    let cfg = EwaConfig {
        model,
        data: Arc::new(data),
        train: 0..train_end,
        eval: n - a.eval_images..n,
        base_lr_per_16: a.lr.unwrap_or(0.02),
        run: run_options(a, batch, steps, a.target_map),
    };
    Ok((Job::Detector(cfg), res))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_depths_parse_or_say_what_they_expect() {
        assert_eq!(
            "224".parse::<Resolution>(),
            Ok(Resolution { h: 224, w: 224 })
        );
        assert_eq!(
            "192x288".parse::<Resolution>(),
            Ok(Resolution { h: 192, w: 288 })
        );
        assert!("0x3"
            .parse::<Resolution>()
            .unwrap_err()
            .contains("expected N or HxW"));
        assert_eq!("3,4,6,3".parse::<Depth>(), Ok(Depth([3, 4, 6, 3])));
        assert_eq!(Depth([1, 2, 3, 4]).to_string(), "1,2,3,4");
        assert!("3,4,6"
            .parse::<Depth>()
            .unwrap_err()
            .contains("four numbers"));
    }
}
