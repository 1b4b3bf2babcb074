//! `roofline automl`'s workflow: a request (the classifier's run options and the search's)
//! checked and made into [`Settings`] — the data, the starting ResNet as a description, the
//! workers' cores, the hyper-parameter choices, the limits — with a calibration step that
//! refuses a budget too short for one trial; then the run.

use crate::master::{self, Progress, Settings, Workers};
use crate::rules::Space;
use crate::worker::{Fault, Gpus};
use roofline_model::automl::Automl;
use roofline_workloads::checkpoint::Checkpoint;
use roofline_workloads::graph::morph::{layer_count, Limits};
use roofline_workloads::graph::Description;
use roofline_workloads::run::{self, Job, Prepared, RunError, Spec};
use roofline_workloads::train::GraphTask;
use roofline_workloads::train::{train, Quiet};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// What the command line asks for.
#[derive(Clone, Debug)]
pub struct Request {
    /// The classifier's options (data, resolution, the starting ResNet's width, depth and
    /// version, classes, images, batch, learning rate, seed, threads).
    pub spec: Spec,
    pub budget: Duration,
    pub rounds: Vec<usize>,
    /// Workers in this process (the cores split among them).
    pub workers: usize,
    /// Under an MPI launcher: ranks per worker (rank 0 is the master, the others form teams
    /// of this many).
    pub team: usize,
    /// Batch and kernel choices for TPE (empty: around the starting batch; 3, 5, 7).
    pub batches: Vec<usize>,
    pub kernels: Vec<usize>,
    pub max_layers: Option<usize>,
    pub max_parameters: Option<f64>,
    pub neighbours: usize,
    /// Children start from their parent's trained weights (else from He's initialisation, or
    /// `spec.init`'s file).
    pub from_parent: bool,
    pub sample_every: Duration,
    pub stall: Duration,
    pub out: PathBuf,
    /// Go on from this automl.json (and the weights beside it).
    pub resume: bool,
    pub fault: Option<Fault>,
}

/// What a calibration step measured: seconds of one step of the starting network, and the
/// first trial's estimate.
#[derive(Clone, Copy, Debug)]
pub struct Calibration {
    pub step_seconds: f64,
    pub trial_seconds: f64,
}

/// Checks `req`, builds the settings (`teams` of MPI ranks as workers, or threads of this
/// process) and measures one step of the starting network.
pub fn settings(req: &Request, teams: Option<usize>) -> Result<(Settings, Calibration), RunError> {
    let input = |m: String| RunError::Input(m);
    let gpus = gpus(&req.spec)?;
    if req.spec.steps.is_some() || req.spec.epochs.is_some() || req.spec.target_top1.is_some() {
        return Err(input(
            "automl trains each candidate for its round's epochs (--rounds) until --budget ends; --steps, --epochs and --target-top1 do not apply".into(),
        ));
    }
    if req.rounds.is_empty() || req.rounds.contains(&0) {
        return Err(input(
            "--rounds: give epochs per round, each 1 or more (e.g. 15,30,45,60)".into(),
        ));
    }
    if req.budget.is_zero() {
        return Err(input("--budget must be more than 0".into()));
    }
    if req.spec.eval_images == 0 {
        return Err(input(
            "--eval-images 0: the search needs held-out accuracy".into(),
        ));
    }
    if req.workers == 0 || req.neighbours == 0 {
        return Err(input("--workers and --neighbours must be 1 or more".into()));
    }
    let prep = run::prepare(&req.spec)?;
    let Job::Classifier(classify) = &prep.job else {
        return Err(input("automl searches image classifiers".into()));
    };
    if let (None, Some(g)) = (teams, &gpus) {
        if req.workers > g.count {
            return Err(input(format!(
                "--workers {}: more workers than the {} GPU(s) of this machine (one worker a GPU; leave --workers out for one on each)",
                req.workers, g.count
            )));
        }
    }
    if teams.is_none() && req.workers > prep.cpus.len() {
        return Err(input(format!(
            "--workers {}: more workers than the {} cores this run has (--threads)",
            req.workers,
            prep.cpus.len()
        )));
    }
    let per = prep.cpus.len() / req.workers;
    let workers = match teams {
        Some(n) => Workers::Teams(n),
        None => Workers::Threads(
            (0..req.workers)
                .map(|w| prep.cpus[w * per..(w + 1) * per].to_vec())
                .collect(),
        ),
    };
    let calibration_cpus = match &workers {
        Workers::Threads(t) => t[0].clone(),
        Workers::Teams(_) => prep.cpus.clone(),
    };
    let side = classify.data.resolution();
    let start = Description::resnet(&classify.model, 3);
    let layers = start
        .layers(side, side)
        .map_err(|e| input(format!("the starting network at {side}²: {e}")))?;
    let params: f64 = layers.iter().map(|l| l.params).sum();
    let batch = classify.run.batch;
    let batches = if req.batches.is_empty() {
        let mut b = vec![(batch / 2).max(1), batch, batch * 2];
        b.dedup();
        b
    } else {
        req.batches.clone()
    };
    if batches.contains(&0) || req.kernels.iter().any(|k| k % 2 == 0) {
        return Err(input(
            "--batches must be 1 or more; --kernels odd (1, 3, 5, 7)".into(),
        ));
    }
    let kernels = if req.kernels.is_empty() {
        vec![3, 5, 7]
    } else {
        req.kernels.clone()
    };
    let resume = if req.resume {
        if !req.out.is_file() {
            return Err(input(format!(
                "--resume: {} does not exist",
                req.out.display()
            )));
        }
        let doc = Automl::read(&req.out).map_err(|e| input(format!("--resume: {e}")))?;
        // Its candidates started from one file, He's initialisation or their parents: the
        // rest must too (a file from before `weights` was kept started from its parents).
        let was_path = doc
            .configuration
            .get("init")
            .and_then(|i| i.get("path"))
            .and_then(|p| p.as_str())
            .map(str::to_string);
        let was = doc
            .configuration
            .get("weights")
            .and_then(|w| w.as_str())
            .unwrap_or(if was_path.is_some() {
                "pretrained"
            } else {
                "parent"
            })
            .to_string();
        let now_path = classify
            .run
            .init
            .as_ref()
            .map(|p| p.path.display().to_string());
        let now = start_name(&classify.run.init, req.from_parent);
        if (was.as_str(), &was_path) != (now, &now_path) {
            let say = |w: &str, p: &Option<String>| match (w, p) {
                (_, Some(p)) => format!("--init {p}"),
                ("parent", None) => "--from-parent".to_string(),
                _ => "He's initialisation (neither --init nor --from-parent)".to_string(),
            };
            return Err(input(format!(
                "--resume: {} started with {}; go on with the same",
                req.out.display(),
                say(&was, &was_path),
            )));
        }
        Some(doc)
    } else {
        roofline_model::write::check_writable(&req.out).map_err(|e| input(e.to_string()))?;
        None
    };
    let imagenet_224 = req.spec.data.is_some() && side == 224 && classify.model.classes == 1000;
    let m = &classify.model;
    let start_resnet50 = m.width == 1.0 && m.blocks == [3, 4, 6, 3] && m.classes == 1000;
    let cores = roofline_kernels::affinity::cores(None)
        .map(|c| c.all.len())
        .unwrap_or(prep.cpus.len());
    let mut provenance = roofline_collectors::provenance::here(
        roofline_kernels::probe::node::cpu_here(cores),
        false,
        Instant::now(),
    );
    if let Some(g) = &gpus {
        provenance.devices = (0..g.count)
            .map(|i| match roofline_kernels::cuda::device::Gpu::open(i) {
                Ok(gpu) => format!("gpu{i}: {} (sm_{})", gpu.name, gpu.arch()),
                Err(e) => format!("gpu{i}: not opened ({e})"),
            })
            .collect();
    }
    let limits = Limits {
        layers: req.max_layers.unwrap_or(layer_count(&start) + 24),
        parameters: req.max_parameters.unwrap_or(4.0 * params),
    };
    let configuration = serde_json::json!({
        "data": prep.data_name(),
        "data_path": req.spec.data,
        "resolution": side,
        "classes": classify.model.classes,
        "train_images": classify.train_images,
        "eval_images": classify.eval_images,
        "start": prep.model_name(),
        "start_parameters": params,
        "batch": batch,
        "batches": batches,
        "kernels": kernels,
        "lr_per_256": classify.base_lr_per_256,
        "rounds": req.rounds,
        "budget_s": req.budget.as_secs_f64(),
        "workers": match &workers {
            Workers::Threads(t) => serde_json::json!(t),
            Workers::Teams(n) => serde_json::json!(format!("{n} teams of {} MPI rank(s)", req.team)),
        },
        "max_layers": limits.layers,
        "max_parameters": limits.parameters,
        "neighbours": req.neighbours,
        "sample_every_s": req.sample_every.as_secs_f64(),
        "stall_s": req.stall.as_secs_f64(),
        "seed": req.spec.seed,
        "weights": start_name(&classify.run.init, req.from_parent),
        "init": classify.run.init.as_ref().map(|p| serde_json::json!({
            "path": p.path,
            "layout": p.layout.to_string(),
        })),
        "precision": req.spec.precision.to_string(),
        "device": match &gpus {
            Some(g) => format!("cuda ({} GPU(s), one a worker)", g.count),
            None => "cpu".to_string(),
        },
        "ops_rule": "AIPerf (tables I-III): training images x (forward + backward + update), evaluation images x forward",
    });
    let s = Settings {
        classify: classify.clone(),
        start: start.clone(),
        rounds: req.rounds.clone(),
        budget: req.budget,
        workers,
        gpus,
        batch,
        kernel: 3,
        space: Space {
            kernels: kernels.clone(),
            batch: (
                *batches.iter().min().expect("one at least"),
                *batches.iter().max().expect("one at least"),
            ),
            dropout: (0.0, 0.2),
        },
        limits,
        neighbours: req.neighbours,
        from_parent: req.from_parent,
        sample_every: req.sample_every,
        stall: req.stall,
        out: req.out.clone(),
        seed: req.spec.seed,
        checks: crate::tally::Checks {
            imagenet_224,
            start_resnet50,
            eval_images: classify.eval_images,
            // The graph trainer's precision: f32 on the CPU, `--precision` on the GPU.
            precision: req.spec.precision,
        },
        deviations: deviations(
            &crate::worker::Start::new(classify.run.init.clone(), req.from_parent),
            req.sample_every,
            roofline_model::automl::counts_as_score_py(classify.train_images),
        ),
        configuration: configuration.as_object().cloned().unwrap_or_default(),
        provenance,
        resume,
        fault: req.fault,
    };
    // One step of the starting network on one worker's cores: is there time for a trial?
    let mut probe = classify.clone();
    probe.run = roofline_workloads::run::RunOptions::new(batch, 1, req.spec.seed);
    probe.eval_images = 0;
    let task = GraphTask::new(start, probe).map_err(|e| input(e.to_string()))?;
    let pool = roofline_kernels::affinity::pinned_pool(&calibration_cpus).map_err(|source| {
        RunError::Threads {
            threads: calibration_cpus.len(),
            source,
        }
    })?;
    let step = match &gpus {
        None => {
            let t0 = Instant::now();
            pool.install(|| train::<f32, _>(&task, &Quiet, None))?;
            t0.elapsed().as_secs_f64()
        }
        // The master's thread keeps no context (worker 0 trains on the same GPU).
        Some(g) => gpu_step_seconds(
            &task,
            run::GpuRun {
                keep: false,
                ..g.for_worker(0)
            },
        )?,
    };
    let per_epoch = (classify.train_images / batch).max(1) as f64;
    // Evaluation costs about a third of a training step per image.
    let epoch = step * (per_epoch + classify.eval_images as f64 / batch as f64 / 3.0);
    let trial = epoch * s.rounds[0] as f64;
    let left = s.budget.as_secs_f64() - s.resume.as_ref().map_or(0.0, |d| d.score.elapsed_s);
    if trial > left {
        return Err(input(format!(
            "--budget {:.0} s is shorter than one trial: the starting network trains {} epoch(s) of {} steps at about {step:.2} s a step (about {trial:.0} s); give a longer --budget, fewer --rounds epochs or fewer --train-images",
            left,
            s.rounds[0],
            per_epoch as usize
        )));
    }
    Ok((
        s,
        Calibration {
            step_seconds: step,
            trial_seconds: trial,
        },
    ))
}

/// Workers in one process when `--workers` is not given: one on the CPU, one a GPU with
/// `--device cuda`.
pub fn default_workers(spec: &Spec) -> Result<usize, RunError> {
    Ok(gpus(spec)?.map_or(1, |g| g.count))
}

/// Where the workers train: the GPUs of this node with `--device cuda` (in `--precision`,
/// checked against the trainer's and AIPerf's rule: FP16 or more), else the CPU (in f32).
fn gpus(spec: &Spec) -> Result<Option<Gpus>, RunError> {
    if spec.device != run::Device::Cuda {
        if spec.precision != roofline_model::Precision::F32 {
            return Err(RunError::Input(format!(
                "--precision {}: automl trains on the CPU in f32; mixed precision is the GPU's (--device cuda)",
                spec.precision
            )));
        }
        return Ok(None);
    }
    let precision = run::prepare::trainer_precision(spec.precision)?;
    let count = roofline_kernels::cuda::device::init().map_err(RunError::NoGpu)?;
    Ok(Some(Gpus {
        run: run::GpuRun {
            gpu: None,
            precision,
            graph: spec.cuda_graph,
            keep: true,
        },
        count,
    }))
}

/// Seconds of one training step of `task`'s network on `on`'s GPU: the fastest of the steps
/// after the first (the first compiles the kernels and measures the convolutions' algorithms).
fn gpu_step_seconds(task: &GraphTask, on: run::GpuRun) -> Result<f64, RunError> {
    let mut task = task.clone();
    task.classify.run.steps = 3;
    let (s, _) = on.train::<roofline_workloads::gpu::GpuGraph, _>(&task, &Quiet, None)?;
    s.timing
        .iter()
        .skip(1)
        .map(|t| t.seconds)
        .reduce(f64::min)
        .ok_or_else(|| RunError::Run("the calibration ran no step".into()))
}

/// The run in one process: settings, a fresh shared buffer, then the search.
pub fn run(
    req: &Request,
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<(Automl, Calibration), RunError> {
    let (s, cal) = settings(req, None)?;
    master::buffer_dir(&s.out).create().map_err(|e| {
        RunError::Input(format!("the shared buffer beside {}: {e}", s.out.display()))
    })?;
    let gpus = match &s.gpus {
        Some(g) => format!(
            ", each on a GPU of its own (of {}) in {}",
            g.count, g.run.precision
        ),
        None => String::new(),
    };
    progress.line(&format!(
        "{} worker(s) on cores {:?}{gpus}; one step of the starting network {:.2} s, its first trial about {:.0} s; budget {:.0} s",
        s.workers.count(),
        match &s.workers {
            Workers::Threads(t) => t.clone(),
            Workers::Teams(_) => Vec::new(),
        },
        cal.step_seconds,
        cal.trial_seconds,
        s.budget.as_secs_f64()
    ));
    Ok((master::automl(&s, progress, cancel)?, cal))
}

/// automl.json's `weights`: what the candidates start from (`--init`'s file, `--from-parent`,
/// or He's initialisation).
fn start_name(
    init: &Option<Arc<roofline_workloads::init::Pretrained>>,
    from_parent: bool,
) -> &'static str {
    crate::worker::Start::new(init.clone(), from_parent).name()
}

/// Where `roofline automl` departs from AIPerf (its paper's Table IV and its reference code),
/// each with its reason: the candidates' `start`, the series sampled `every`, an epoch's
/// operations counted as `score.py` counts them (`score_py_count`: on ImageNet's set) or not.
pub fn deviations(
    start: &crate::worker::Start,
    every: Duration,
    score_py_count: bool,
) -> Vec<String> {
    use crate::worker::Start;
    let mut v = vec![match start {
        Start::He => "candidates start from He initialisation, AIPerf's Table IV default (\"method in [21]\"; normal, fan-out mode), never their parent's weights; the reference code instead loads ImageNet-pretrained ResNet-50 weights into every candidate, layer by layer: --init FILE does so (Keras's ResNet50 .h5, the reference's file, or torchvision's safetensors)".to_string(),
        Start::Parent => "candidates start from their parent's trained weights (--from-parent: Net2Net, function-preserving morphisms), neither AIPerf's Table IV default (He initialisation, the default without it) nor the reference code's (ImageNet-pretrained weights in every candidate, --init FILE)".to_string(),
        Start::Pretrained(_) => "the pretrained file's layers go into a candidate's by name and shape (every layer still ResNet-50's, with its shape); the reference pairs them in the order they were created and skips a file layer that does not fit: the same pairing for the start and for children that only add layers (deeper, skip), but past a widened layer it tries each later file layer on that layer, loading the rest only where shapes happen to agree".to_string(),
    }];
    v.push("the per-trial TPE's batch is drawn between the smallest and the largest of --batches; the reference's between 12 and 14 × the GPU's memory in GiB".into());
    if every != Duration::from_secs(3600) {
        v.push(format!("the FLOPS series is sampled every {} s and at the end, where the reference's score.py samples every hour (--sample-every 1h; its FLOPS, the operations of the epochs finished over the time to the last one's end, is counted as it counts it)", every.as_secs_f64()));
    }
    if !score_py_count {
        v.push("an epoch counts the training and held-out images it trained and evaluated, where score.py counts a fixed 1,280,000 and 50,000 (ImageNet's, which a run on ImageNet's 1,281,167 training images counts too)".into());
    }
    v.push("the Skip morphism adds its value into a convolution's output before that convolution's batch norm, where the reference joins after it".into());
    v
}

/// What every worker rank trains with (its own view of the data), and its cores.
pub fn worker_context(req: &Request) -> Result<(crate::worker::Context, Vec<usize>), RunError> {
    let prep = run::prepare(&req.spec)?;
    let Job::Classifier(classify) = &prep.job else {
        return Err(RunError::Input("automl searches image classifiers".into()));
    };
    Ok((
        crate::worker::Context::new(
            classify,
            req.from_parent,
            req.fault,
            gpus(&req.spec)?.map(|g| g.run),
        ),
        prep.cpus.clone(),
    ))
}

/// Candidate `id` of the AutoML run in `path` (its best when `None`) as a prepared training
/// run: its network from its trained weights, on the run's data, resolution and classes;
/// `spec` gives the rest (batch, steps, threads). For `place`.
pub fn prepare_candidate(
    path: &Path,
    id: Option<usize>,
    spec: &Spec,
) -> Result<Prepared, RunError> {
    let input = |m: String| RunError::Input(m);
    let doc = Automl::read(path).map_err(|e| input(e.to_string()))?;
    let id = match id.or(doc.score.best_candidate) {
        Some(i) => i,
        None => {
            return Err(input(format!(
                "{}: no candidate has an accuracy yet",
                path.display()
            )))
        }
    };
    let c = doc
        .candidates
        .iter()
        .find(|c| c.id == id)
        .ok_or_else(|| input(format!("{}: no candidate {id}", path.display())))?;
    let net: Description = serde_json::from_value(c.description.clone())
        .map_err(|e| input(format!("{}: candidate {id}: {e}", path.display())))?;
    let conf = &doc.configuration;
    let num = |k: &str| conf.get(k).and_then(|v| v.as_u64()).map(|v| v as usize);
    let side = num("resolution").ok_or_else(|| {
        input(format!(
            "{}: no resolution in its configuration",
            path.display()
        ))
    })?;
    let mut spec = spec.clone();
    spec.workload = run::Kind::Resnet50;
    spec.resolution = Some(run::Resolution { h: side, w: side });
    spec.classes = num("classes").unwrap_or(spec.classes);
    // The synthetic images are drawn from the seed: the run's data, not another set.
    spec.seed = conf
        .get("seed")
        .and_then(|v| v.as_u64())
        .unwrap_or(spec.seed);
    spec.train_images = spec.train_images.or(num("train_images"));
    if spec.data.is_none() {
        spec.data = conf
            .get("data_path")
            .and_then(|v| v.as_str())
            .map(PathBuf::from);
    }
    if spec.batch.is_none() {
        spec.batch = Some(c.batch);
    }
    let mut prep = run::prepare(&spec)?;
    let Job::Classifier(classify) = &prep.job else {
        return Err(input("an AutoML candidate is a classifier".into()));
    };
    let mut task =
        GraphTask::new(net, classify.clone()).map_err(|e| input(format!("candidate {id}: {e}")))?;
    let weights = master::weights_dir(path).join(format!("{id}.safetensors"));
    if weights.is_file() {
        let mut ck = Checkpoint::load(&weights).map_err(|e| input(e.to_string()))?;
        // Its trained parameters and statistics; a fresh optimiser.
        for (name, t) in ck.tensors.iter_mut() {
            if name.ends_with(".momentum") {
                t.data.iter_mut().for_each(|b| *b = 0);
            }
        }
        // A file that does not fit the network is refused here, not when the run builds it.
        let side = task.classify.data.resolution();
        roofline_workloads::graph::Graph::<f32>::new(task.net.clone(), side, side, 0)
            .map_err(|e| input(format!("candidate {id}: {e}")))?
            .load(&ck)
            .map_err(|e| {
                input(format!(
                    "{}: not candidate {id}'s weights: {e}",
                    weights.display()
                ))
            })?;
        task.init = Some(Arc::new(ck));
    }
    prep.job = Job::Graph {
        task,
        label: format!("automl#{id}"),
    };
    Ok(prep)
}
