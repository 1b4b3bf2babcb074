//! The one training loop ([`run`]): data read one batch ahead, the learning-rate schedule
//! (HPC AI500 V2.0 section 5.1.2), steps on a device, the ranks' data-parallel exchange,
//! evaluation and time-to-quality, checkpoints that resume a run exactly, the tally and its
//! summary. Generic over the model and the task ([`Model`], [`Task`]) and the device
//! ([`Device`]: [`Cpu`] or a GPU): ResNet-50 ([`classify`]) and the detector
//! ([`crate::ewa`]) are two tasks of it.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::data::DataError;
use crate::exchange::CommOptions;
use crate::layers::{Param, Reducer};
use crate::tensor::Float;
use roofline_collectors::timeline::{span, timed};
use std::sync::Arc;
use std::time::Instant;

pub mod classify;
mod described;
mod error;
pub mod model;
mod optim;
mod options;
mod reports;
pub use classify::{evaluate, predict, softmax_loss, Labels, Order, Source, TrainConfig};
pub use described::GraphTask;
pub use error::{EvalError, TrainError};
pub use model::{Cpu, Device, Infer, Loader, Loss, Model, Stage, Stepped, Task};
pub use optim::{Decay, Schedule, Sgd};
pub use options::RunOptions;
pub use reports::{GraphMode, GraphReport, SearchReport};

/// One evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct Eval {
    pub step: usize,
    pub top1: f64,
    pub top5: f64,
    pub loss: f64,
    /// mAP@0.5 (the detection workload, whose Top-1, Top-5 and loss are NaN); None for the
    /// classifier.
    pub map: Option<f64>,
}

impl Eval {
    /// The figure a target is set on: mAP@0.5 for the detector, Top-1 for the classifier.
    pub fn quality(&self) -> f64 {
        self.map.unwrap_or(self.top1)
    }
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct Summary {
    pub parameters: usize,
    pub steps: usize,
    pub images: usize,
    /// Seconds spent in training steps (forward, backward, update; data included).
    pub train_seconds: f64,
    pub images_per_second: f64,
    /// Images/s over the steady steps: the steps after the CUDA-graph trial where the GPU
    /// trainer made one (all of them then run one way), else after the first (which pays for
    /// first-touch allocations). `steady` says which.
    pub steady_images_per_second: f64,
    /// Which steps `steady_images_per_second` counts.
    pub steady: Steady,
    pub flops_forward_per_image: f64,
    pub flops_step_per_image: f64,
    /// Training FLOP/s over the steady steps (after the first).
    pub achieved_flops: f64,
    /// Mean loss of the last step over the global batch.
    pub final_loss: f64,
    pub evals: Vec<Eval>,
    /// Ranks that trained together (1: a single process).
    pub ranks: usize,
    /// Bytes each rank puts into the gradient allreduce per step (fused buckets, in the wire
    /// format), and the batch-norm statistics; 0 for a single process.
    pub comm_bytes_per_step: f64,
    /// Seconds the CPU trainer waited for gradient sums after its backward passes (the
    /// communication that overlap did not hide), over every step of the run.
    pub comm_wait_seconds: f64,
    /// The most times the host waited for the GPU in one step, over the steps after the first
    /// (0 on the CPU; every step's count is in `timing`).
    pub host_syncs_per_step: u64,
    /// The most device allocations of one step, over the steps after the second (the GPU's pool
    /// fills in the first two; 0 on the CPU; every step's count is in `timing`).
    pub device_allocations_per_step: u64,
    /// The gradient exchange used.
    pub comm: CommOptions,
    /// What the GPU trainer did with CUDA graphs: the choice, the step times it was made on,
    /// and why (None: a device without them, the CPU).
    pub cuda_graph: Option<GraphReport>,
    /// What the GPU trainer's convolution searches did (None: the CPU).
    pub conv_search: Option<SearchReport>,
    /// Every step's wall time and what it waited for.
    pub timing: Vec<StepTiming>,
    /// Seconds from the first batch read to the end of the run (evaluations included).
    pub elapsed_seconds: f64,
    /// √Σ w² over every parameter at the end (compares runs).
    pub param_norm: f64,
    /// The step the run started from (a resumed run's checkpoint step).
    pub start_step: usize,
    /// Seconds from the first batch read to reaching the target (HPC AI500's time-to-quality).
    pub time_to_quality: Option<f64>,
    /// A bagged model's predictions on the held-out images at the end, for the ensemble.
    pub predictions: Option<crate::bagging::Predictions>,
}

/// The steps a run's steady rate counts, and what kind they were.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Steady {
    /// The rate counts the steps after this one (1-based; the run's own, a resumed run's
    /// start included).
    pub after_step: usize,
    /// How many steps it counts.
    pub steps: usize,
    pub kind: StepKind,
}

/// What kind of steps a steady rate counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// Steps run call by call with no CUDA-graph trial (the CPU, `--cuda-graph off`, a run
    /// whose steps cannot be captured).
    Eager,
    /// Launches of the captured graph, after the trial chose it.
    Graph,
    /// Steps run call by call after the trial chose them over the graph.
    EagerChosen,
    /// The run ended inside the graph trial: warm-up, eager and graph steps together.
    Mixed,
}

impl Steady {
    /// Which steps the steady rate counts: "the 19 steps after step 1", "the 12 steps after
    /// the CUDA-graph trial (step 8), graph".
    pub fn describe(&self) -> String {
        match self.kind {
            StepKind::Eager => format!("the {} steps after step {}", self.steps, self.after_step),
            StepKind::Graph | StepKind::EagerChosen => format!(
                "the {} steps after the CUDA-graph trial (step {}), {}",
                self.steps,
                self.after_step,
                self.kind.name()
            ),
            StepKind::Mixed => format!(
                "the steps after step {}, {}: run more steps for a steady rate",
                self.after_step,
                self.kind.name()
            ),
        }
    }
}

impl StepKind {
    pub fn name(self) -> &'static str {
        match self {
            StepKind::Eager => "eager",
            StepKind::Graph => "graph",
            StepKind::EagerChosen => "eager (the graph trial chose it)",
            StepKind::Mixed => "mixed (the run ended inside the CUDA-graph trial)",
        }
    }
}

impl Summary {
    /// Counts the steady rate over the steps after the CUDA-graph trial, where the GPU trainer
    /// made one (`cuda_graph` set first): those steps all ran the chosen way. A run that ended
    /// inside the trial keeps the rate after its first step, and says it is mixed.
    pub fn settle_on_graph_choice(&mut self) {
        let Some(g) = &self.cuda_graph else {
            return;
        };
        let run_steps = self.steps.saturating_sub(self.start_step);
        let batch = self.images / run_steps.max(1);
        match g.settled_after {
            Some(k) => {
                let after = self.start_step + k;
                let (n, seconds) = self
                    .timing
                    .iter()
                    .filter(|t| t.step > after)
                    .fold((0usize, 0.0f64), |(n, s), t| (n + 1, s + t.seconds));
                if n == 0 {
                    self.steady.kind = StepKind::Mixed;
                    return;
                }
                self.steady_images_per_second = (n * batch) as f64 / seconds.max(1e-12);
                self.achieved_flops = self.flops_step_per_image * self.steady_images_per_second;
                self.steady = Steady {
                    after_step: after,
                    steps: n,
                    kind: if g.used {
                        StepKind::Graph
                    } else {
                        StepKind::EagerChosen
                    },
                };
            }
            // No choice: either never to be captured (every step eager) or cut short.
            None if g.why.starts_with("not captured: the run ended") => {
                self.steady.kind = StepKind::Mixed
            }
            None => {}
        }
    }
}

/// The batch read ahead by a loader thread (a `data` span on the timeline while waiting).
fn wait_for_batch<B>(
    pending: &mut Option<std::thread::JoinHandle<Result<B, DataError>>>,
) -> Result<B, TrainError> {
    timed(
        "data",
        || "wait for batch".into(),
        || {
            Ok(pending
                .take()
                .ok_or(DataError::NotFetched)?
                .join()
                .map_err(|_| DataError::LoaderPanicked)??)
        },
    )
}

/// What a training loop accumulates for its summary, step by step.
struct Tally {
    pub batch: usize,
    pub ranks: usize,
    pub comm: CommOptions,
    pub start_step: usize,
    pub steps_done: usize,
    pub train_seconds: f64,
    /// Seconds of the steps after the first (which pays for first-touch allocations).
    pub steady_seconds: f64,
    pub final_loss: f64,
    pub evals: Vec<Eval>,
    pub time_to_quality: Option<f64>,
    /// Gradient bytes this rank put into the allreduces in the last step.
    pub comm_bytes: f64,
    pub comm_wait: f64,
    pub timing: Vec<StepTiming>,
}

impl Tally {
    pub fn new(batch: usize, ranks: usize, comm: CommOptions, start_step: usize) -> Tally {
        Tally {
            batch,
            ranks,
            comm,
            start_step,
            steps_done: start_step,
            train_seconds: 0.0,
            steady_seconds: 0.0,
            final_loss: f64::NAN,
            evals: Vec::new(),
            time_to_quality: None,
            comm_bytes: 0.0,
            comm_wait: 0.0,
            timing: Vec::new(),
        }
    }

    /// Step `step` (0-based) finished: its wall time, its waits (`waits`: seconds for its
    /// batch, seconds for gradient sums, the host's waits for the GPU, the device allocations
    /// it made), its loss.
    pub fn step(&mut self, step: usize, seconds: f64, waits: (f64, f64, u64, u64), loss: f64) {
        let (data_s, comm_s, host_syncs, device_allocations) = waits;
        self.timing.push(StepTiming {
            step: step + 1,
            seconds,
            data_s,
            comm_s,
            host_syncs,
            device_allocations,
        });
        self.train_seconds += seconds;
        if step > self.start_step {
            self.steady_seconds += seconds;
        }
        self.comm_wait += comm_s;
        self.final_loss = loss;
        self.steps_done = step + 1;
    }

    /// The run's summary: `flops` per image, the parameters at the end, `bn_channels`
    /// batch-norm channels (whose statistics data-parallel ranks sum in f64: Σx, Σx² forward,
    /// Σdy, Σdy·x backward), `elapsed` seconds from the first batch read.
    pub fn summary<T: Float>(
        self,
        flops: crate::resnet::Flops,
        params: Vec<&mut Param<T>>,
        bn_channels: usize,
        elapsed: f64,
    ) -> Summary {
        let images = (self.steps_done - self.start_step) * self.batch;
        let steady = if self.steps_done > self.start_step + 1 {
            ((self.steps_done - self.start_step - 1) * self.batch) as f64
                / self.steady_seconds.max(1e-12)
        } else {
            images as f64 / self.train_seconds.max(1e-12)
        };
        let parameters = params.iter().map(|p| p.value.len()).sum();
        let param_norm = params
            .iter()
            .flat_map(|p| p.value.iter())
            .map(|w| w.to_f64() * w.to_f64())
            .sum::<f64>()
            .sqrt();
        let stats_bytes = if self.ranks > 1 {
            8.0 * 4.0 * bn_channels as f64
        } else {
            0.0
        };
        Summary {
            parameters,
            steps: self.steps_done,
            images,
            train_seconds: self.train_seconds,
            images_per_second: images as f64 / self.train_seconds.max(1e-12),
            steady_images_per_second: steady,
            steady: Steady {
                after_step: self.start_step + 1,
                steps: self.steps_done.saturating_sub(self.start_step + 1),
                kind: StepKind::Eager,
            },
            flops_forward_per_image: flops.forward,
            flops_step_per_image: flops.training(),
            achieved_flops: flops.training() * steady,
            final_loss: self.final_loss,
            evals: self.evals,
            time_to_quality: self.time_to_quality,
            ranks: self.ranks,
            comm_bytes_per_step: self.comm_bytes + stats_bytes,
            comm_wait_seconds: self.comm_wait,
            host_syncs_per_step: steady_most(&self.timing, self.start_step + 1, |t| t.host_syncs),
            device_allocations_per_step: steady_most(&self.timing, self.start_step + 2, |t| {
                t.device_allocations
            }),
            timing: self.timing,
            elapsed_seconds: elapsed,
            comm: self.comm,
            cuda_graph: None,
            conv_search: None,
            param_norm,
            start_step: self.start_step,
            predictions: None,
        }
    }
}

/// One step's wall time, and the parts of it spent waiting for its batch and for gradient sums
/// (the communication the backward pass did not hide).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepTiming {
    pub step: usize,
    pub seconds: f64,
    pub data_s: f64,
    pub comm_s: f64,
    /// Times the host waited for the GPU during the step (0 on the CPU).
    pub host_syncs: u64,
    /// Device memory allocations during the step (0 on the CPU).
    pub device_allocations: u64,
}

/// The most of `f` over the steps after step `after` (1-based), or over the last step where
/// no step comes after it.
fn steady_most(timing: &[StepTiming], after: usize, f: impl Fn(&StepTiming) -> u64) -> u64 {
    let steady = timing.iter().filter(|t| t.step > after).map(&f).max();
    steady.or_else(|| timing.last().map(f)).unwrap_or(0)
}

/// Receives one line per step (for the progress bar).
pub trait Monitor {
    fn step(&self, step: usize, steps: usize, loss: f64, images_per_second: f64);
}

pub struct Quiet;

impl Monitor for Quiet {
    fn step(&self, _: usize, _: usize, _: f64, _: f64) {}
}

/// Keeps freed memory in the process: every step allocates and frees the same activation
/// tensors, and glibc would otherwise return each large one to the kernel (munmap) and fault it
/// back in, page by page, on the next step (seconds of system time per ResNet-50 step).
fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only changes allocator tuning parameters.
    unsafe {
        libc::mallopt(libc::M_MMAP_MAX, 0);
        libc::mallopt(libc::M_TRIM_THRESHOLD, i32::MAX);
    }
}

/// Trains `task` on the CPU layers; with `reducer`, data parallel over its ranks: every rank
/// draws the same global batch and trains on its share, batch norm uses global statistics and
/// gradients are averaged, so that N ranks compute what one process computes on the whole
/// batch. Deterministic for a given configuration and thread count.
pub fn train<T: Float, W: Task<T>>(
    task: &W,
    monitor: &dyn Monitor,
    reducer: Option<Arc<dyn Reducer>>,
) -> Result<Summary, TrainError> {
    run(task, monitor, &mut Cpu::new(reducer, task.options().comm))
}

/// The training loop: `task` on `device`, data parallel over the device's reducer's ranks.
pub fn run<T: Float, W: Task<T>>(
    task: &W,
    monitor: &dyn Monitor,
    device: &mut dyn Device<T, W::Model>,
) -> Result<Summary, TrainError> {
    keep_freed_memory();
    let opts = task.options();
    let reducer = device.reducer();
    let (ranks, rank) = reducer.as_ref().map_or((1, 0), |r| (r.ranks(), r.rank()));
    task.check(ranks)?;
    let local = opts.batch / ranks;
    let rows = rank * local..(rank + 1) * local;
    let mut model = task.build();
    let sgd = Sgd {
        decay_all: opts.decay_all,
        ..Sgd::default()
    };
    let schedule = task.schedule();
    let flops = task.flops(&model);
    let (mut start_step, mut order) = (0, task.first_order());
    if let Some(p) = &opts.init {
        let setup = |e: crate::init::InitError| TrainError::Setup(e.to_string());
        p.params(model.params()).map_err(setup)?;
        p.stats(model.running_stats()).map_err(setup)?;
    }
    if let Some(path) = &opts.resume {
        (start_step, order) = load(path, task, &mut model)?;
        if start_step >= opts.steps {
            return Err(TrainError::Setup(format!(
                "--resume {}: the checkpoint is at step {start_step}, and this run ends at step {}: nothing is left to train (give --steps or --epochs past step {start_step})",
                path.display(),
                opts.steps
            )));
        }
    }
    device.begin(&mut model).map_err(TrainError::Device)?;
    let mut tally = Tally::new(opts.batch, ranks, opts.comm, start_step);
    let first_read = Instant::now();
    let end = opts.stop_at.unwrap_or(opts.steps).min(opts.steps);
    // One batch ahead: the next step's images are read on another thread while this one
    // computes, and handed to the device's stager there (a GPU uploads it on a copy stream
    // while it trains on this one).
    let stager = device.stager();
    let fetch = |order: &mut W::Order, step: usize| {
        let load = task.next_batch(order, step, rows.clone());
        let stager = stager.clone();
        std::thread::spawn(move || {
            let batch = timed("data", || format!("load batch {}", step + 1), load);
            if let (Ok((x, _)), Some(s)) = (&batch, &stager) {
                timed(
                    "data",
                    || format!("stage batch {}", step + 1),
                    || s.stage(x),
                );
            }
            batch
        })
    };
    // The data order as of the last finished step (before the prefetch's draw).
    let mut saved = order.clone();
    let mut pending = (start_step < end).then(|| fetch(&mut order, start_step));
    let stop_asked = || {
        opts.stop
            .as_ref()
            .is_some_and(|s| s.load(std::sync::atomic::Ordering::SeqCst))
    };
    for step in start_step..end {
        // Alone, a stop is seen before the next step; data parallel, every rank's flag is
        // summed with the step's loss so that all stop after the same step.
        if reducer.is_none() && stop_asked() {
            break;
        }
        let t0 = Instant::now();
        let step_span = span("step", || format!("step {}", step + 1));
        let (x, truth) = wait_for_batch(&mut pending)?;
        let data_s = t0.elapsed().as_secs_f64();
        // The data order after this step's draw (what a checkpoint after this step records).
        let after_draw = order.clone();
        if step + 1 < end {
            pending = Some(fetch(&mut order, step + 1));
        }
        let seed = task.step_seed(step, rank);
        let done = device
            .step(&mut model, &x, &truth, seed, schedule.lr(step), &sgd)
            .map_err(TrainError::Device)?;
        tally.comm_bytes = done.comm_bytes;
        let mut loss = done.loss.total();
        let mut agreed_stop = false;
        if let Some(r) = &reducer {
            let mut l = [loss, if stop_asked() { 1.0 } else { 0.0 }];
            r.sum_f64(&mut l);
            loss = l[0] / ranks as f64;
            agreed_stop = l[1] > 0.0;
        }
        if !loss.is_finite() {
            return Err(TrainError::Diverged {
                step: step + 1,
                losses: format!("{:?}", done.loss),
            });
        }
        drop(step_span);
        let dt = t0.elapsed().as_secs_f64();
        let waits = (
            data_s,
            done.comm_wait_s,
            done.host_syncs,
            done.device_allocations,
        );
        tally.step(step, dt, waits, loss);
        monitor.step(step + 1, opts.steps, loss, opts.batch as f64 / dt);
        if let (Some(path), Some(every)) = (&opts.checkpoint, opts.checkpoint_every) {
            if every > 0 && (step + 1).is_multiple_of(every) && step + 1 < opts.steps {
                // Every rank stores (a device's copy comes back), rank 0 writes.
                device.store(&mut model).map_err(TrainError::Device)?;
                if rank == 0 {
                    save(path, task, &mut model, step + 1, &after_draw)?;
                }
            }
        }
        saved = after_draw;
        let last = step + 1 == opts.steps;
        if task.evaluates() && ((step + 1) % opts.eval_every.max(1) == 0 || last) {
            // Every rank evaluates the same images with the same parameters (batch norm on
            // running statistics): the same figure everywhere, so that all stop together.
            let e = task.evaluate(&mut |x| device.infer(&mut model, x), step + 1, local)?;
            let reached = opts.target.is_some_and(|t| e.quality() >= t);
            tally.evals.push(e);
            if reached && tally.time_to_quality.is_none() {
                tally.time_to_quality = Some(first_read.elapsed().as_secs_f64());
            }
            if reached && opts.stop_at_target {
                break;
            }
        }
        if agreed_stop {
            break;
        }
    }
    // A bagged model's held-out predictions, for the ensemble.
    let predictions = match &opts.ensemble {
        Some(_) if task.evaluates() => {
            Some(task.predict(&mut |x| device.infer(&mut model, x), local)?)
        }
        _ => None,
    };
    device.store(&mut model).map_err(TrainError::Device)?;
    if let (Some(path), 0) = (&opts.checkpoint, rank) {
        save(path, task, &mut model, tally.steps_done, &saved)?;
    }
    let channels = model.synced_channels();
    let mut summary = tally.summary(
        flops,
        model.params(),
        channels,
        first_read.elapsed().as_secs_f64(),
    );
    summary.predictions = predictions;
    summary.cuda_graph = device.cuda_graph();
    summary.conv_search = device.conv_search();
    summary.settle_on_graph_choice();
    Ok(summary)
}

/// Writes the whole training state: parameters, momenta, running statistics, the step and
/// the data order, with what the run was (workload, model, batch).
fn save<T: Float, W: Task<T>>(
    path: &std::path::Path,
    task: &W,
    model: &mut W::Model,
    step: usize,
    order: &W::Order,
) -> Result<(), CheckpointError> {
    let mut c = Checkpoint::default();
    c.put_params(model.params());
    c.put_stats(model.running_stats());
    task.save_order(order, &mut c);
    let meta = [
        ("format", "roofline/checkpoint/v1".to_string()),
        ("workload", task.name().to_string()),
        ("step", step.to_string()),
        ("model", model.describe()),
        ("batch", task.options().batch.to_string()),
    ];
    for (k, v) in meta {
        c.metadata.insert(k.into(), v);
    }
    c.save(path)
}

/// Restores what `save` wrote into `model`; returns the step and the data order. A checkpoint
/// of another workload, model or batch is refused.
fn load<T: Float, W: Task<T>>(
    path: &std::path::Path,
    task: &W,
    model: &mut W::Model,
) -> Result<(usize, W::Order), CheckpointError> {
    let c = Checkpoint::load(path)?;
    // Checkpoints written before the workload was recorded are the classifier's.
    let workload = c.meta("workload").unwrap_or("resnet50");
    let batch = task.options().batch.to_string();
    let (model_was, model_now) = (c.meta("model")?, model.describe());
    let mut differs = Vec::new();
    if workload != task.name() {
        differs.push(format!("workload {workload} there, {} now", task.name()));
    }
    if model_was != model_now {
        differs.extend(model_differences(model_was, &model_now));
    }
    if c.meta("batch")? != batch {
        differs.push(format!("batch {} there, {batch} now", c.meta("batch")?));
    }
    if !differs.is_empty() {
        return Err(CheckpointError::Mismatch(format!(
            "{} was written for another run ({}): resume with the arguments it was written with",
            path.display(),
            differs.join("; ")
        )));
    }
    c.take_params(model.params())?;
    c.take_stats(model.running_stats())?;
    let step = c
        .meta("step")?
        .parse::<usize>()
        .map_err(|_| CheckpointError::Mismatch("bad step in the checkpoint".into()))?;
    Ok((step, task.load_order(&c)?))
}

/// How two models' descriptions (`Model::describe`, `Name { key: value, … }`) differ, one
/// "key value there, value now" each; a list too long to print by its length or its first
/// item that differs ("model nodes: 12 there, 14 now", "model nodes: 4 of 12 differs");
/// "another model" where they cannot be read apart.
pub(crate) fn model_differences(was: &str, now: &str) -> Vec<String> {
    /// The items of `[a, b, c]` (the top level of `inner` split at commas), in order.
    fn split(inner: &str) -> Vec<&str> {
        let (mut out, mut depth, mut start) = (Vec::new(), 0i32, 0);
        for (i, ch) in inner.char_indices().chain([(inner.len(), ',')]) {
            match ch {
                '[' | '{' | '(' => depth += 1,
                ']' | '}' | ')' => depth -= 1,
                ',' if depth == 0 => {
                    if !inner[start..i].trim().is_empty() {
                        out.push(inner[start..i].trim());
                    }
                    start = i + 1;
                }
                _ => {}
            }
        }
        out
    }
    /// The items of a `[a, b]` value.
    fn list(v: &str) -> Option<Vec<&str>> {
        Some(split(v.strip_prefix('[')?.strip_suffix(']')?))
    }
    /// The top-level fields of `Name { a: 1, b: [2, 3] }`, in order.
    fn fields(d: &str) -> Option<Vec<(&str, &str)>> {
        let inner = d.split_once('{')?.1.trim_end().strip_suffix('}')?.trim();
        split(inner)
            .into_iter()
            .map(|f| f.split_once(':').map(|(k, v)| (k.trim(), v.trim())))
            .collect()
    }
    let (Some(a), Some(b)) = (fields(was), fields(now)) else {
        return vec!["another model".into()];
    };
    let mut out: Vec<String> = b
        .iter()
        .filter_map(|(k, v)| {
            let old = a
                .iter()
                .find(|(ka, _)| ka == k)
                .map_or("(none)", |(_, v)| v);
            let k = k.replace('_', " ");
            Some(match (list(old), list(v)) {
                _ if old == *v => return None,
                (Some(a), Some(b)) if old.len() + v.len() > 80 && a.len() != b.len() => {
                    format!("model {k}: {} there, {} now", a.len(), b.len())
                }
                (Some(a), Some(b)) if old.len() + v.len() > 80 => {
                    let i = a.iter().zip(&b).position(|(x, y)| x != y).unwrap_or(0);
                    format!("model {k}: {} of {} differs", i + 1, b.len())
                }
                _ if old.len() + v.len() > 80 => format!("model {k} differs"),
                _ => format!("model {k} {old} there, {v} now"),
            })
        })
        .collect();
    if out.is_empty() {
        out.push("another model".into());
    }
    out
}

#[cfg(test)]
pub(crate) mod tests;
