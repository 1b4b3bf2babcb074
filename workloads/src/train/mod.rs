//! The optimiser, the learning-rate schedule (HPC AI500 V2.0 section 5.1.2) and the training
//! loop with evaluation and time-to-quality.

use crate::checkpoint::CheckpointError;
use crate::data::{DataError, Rng, Synthetic};
use crate::exchange::{Buckets, CommOptions, Exchange};
use crate::folder::ImageFolder;
use crate::layers::{softmax_cross_entropy, Param, Reducer};
use crate::resnet::FWD;
use crate::resnet::{Config, ResNet};
use crate::run::RunOptions;
use crate::tensor::Float;
use crate::tensor::Tensor;
use roofline_collectors::timeline::{span, timed};
use roofline_kernels::cuda::CudaError;
use std::sync::Arc;
use std::time::Instant;

mod error;
mod optim;
pub use error::{EvalError, TrainError};
pub use optim::{Decay, Schedule, Sgd};

/// Where the images come from.
#[derive(Clone, Debug)]
pub enum Source {
    Synthetic(Synthetic),
    /// ImageNet-style folders (the evaluation folder is optional).
    Folder {
        train: Arc<ImageFolder>,
        eval: Option<Arc<ImageFolder>>,
        resolution: usize,
    },
}

impl Source {
    pub fn resolution(&self) -> usize {
        match self {
            Source::Synthetic(s) => s.resolution,
            Source::Folder { resolution, .. } => *resolution,
        }
    }

    /// A training batch; `seed` drives the augmentation of this step.
    fn train_batch<T: Float>(
        &self,
        ids: &[u64],
        seed: u64,
    ) -> Result<(Tensor<T>, Vec<usize>), DataError> {
        match self {
            Source::Synthetic(s) => Ok(s.batch(ids)),
            Source::Folder {
                train, resolution, ..
            } => train.batch(ids, *resolution, true, seed),
        }
    }

    /// Evaluation batch `ids` (held-out synthetic images, or the evaluation folder).
    fn eval_batch<T: Float>(&self, ids: &[u64]) -> Result<(Tensor<T>, Vec<usize>), DataError> {
        match self {
            Source::Synthetic(s) => {
                Ok(s.batch(&ids.iter().map(|i| (1u64 << 40) + i).collect::<Vec<_>>()))
            }
            Source::Folder {
                eval, resolution, ..
            } => match eval {
                Some(f) => f.batch(ids, *resolution, false, 0),
                None => Err(DataError::Invalid("no evaluation folder".into())),
            },
        }
    }
}

/// The data order: a permutation per epoch drawn from a generator, and the position in it.
#[derive(Clone, Debug)]
struct Order {
    rng: Rng,
    order: Vec<usize>,
    cursor: usize,
    images: usize,
}

impl Order {
    fn draw(&mut self, n: usize) -> Vec<u64> {
        let mut ids = Vec::with_capacity(n);
        while ids.len() < n {
            if self.cursor == self.order.len() {
                self.order = self.rng.permutation(self.images);
                self.cursor = 0;
            }
            ids.push(self.order[self.cursor] as u64);
            self.cursor += 1;
        }
        ids
    }
}

/// What to train.
#[derive(Clone, Debug)]
pub struct TrainConfig {
    pub model: Config,
    pub data: Source,
    pub train_images: usize,
    pub eval_images: usize,
    pub base_lr_per_256: f64,
    pub label_smoothing: f64,
    pub decay: Decay,
    /// The schedule, the target Top-1, checkpoints, the exchange, the ensemble member.
    pub run: RunOptions,
}

/// Saves the whole training state.
fn save_checkpoint<T: Float>(
    path: &std::path::Path,
    model: &mut ResNet<T>,
    step: usize,
    rng: &Rng,
    order: &[usize],
    cursor: usize,
    cfg: &TrainConfig,
) -> Result<(), CheckpointError> {
    use crate::checkpoint::{Checkpoint, Stored};
    let mut c = Checkpoint::default();
    c.put_params(model.params());
    c.put_stats(model.running_stats());
    c.tensors.insert(
        "trainer.order".into(),
        Stored::u64s(order.iter().map(|&i| i as u64)),
    );
    let (state, spare) = rng.state();
    c.metadata
        .insert("format".into(), "roofline/checkpoint/v1".into());
    c.metadata.insert("step".into(), step.to_string());
    c.metadata.insert("cursor".into(), cursor.to_string());
    c.metadata.insert("rng_state".into(), state.to_string());
    c.metadata.insert(
        "rng_spare".into(),
        spare.map(|s| s.to_bits().to_string()).unwrap_or_default(),
    );
    c.metadata
        .insert("model".into(), format!("{:?}", cfg.model));
    c.metadata.insert("batch".into(), cfg.run.batch.to_string());
    c.save(path)
}

/// Restores what `save_checkpoint` wrote; returns (step, rng, order, cursor).
fn load_checkpoint<T: Float>(
    path: &std::path::Path,
    model: &mut ResNet<T>,
    cfg: &TrainConfig,
) -> Result<(usize, Rng, Vec<usize>, usize), CheckpointError> {
    use crate::checkpoint::Checkpoint;
    let c = Checkpoint::load(path)?;
    if c.meta("model")? != format!("{:?}", cfg.model)
        || c.meta("batch")? != cfg.run.batch.to_string()
    {
        return Err(CheckpointError::Mismatch(format!(
            "{} was written for another model or batch: {} batch {}",
            path.display(),
            c.meta("model")?,
            c.meta("batch")?
        )));
    }
    c.take_params(model.params())?;
    c.take_stats(model.running_stats())?;
    let bad = |k: &str| CheckpointError::Mismatch(format!("bad {k} in the checkpoint"));
    let num =
        |k: &str| -> Result<u64, CheckpointError> { c.meta(k)?.parse::<u64>().map_err(|_| bad(k)) };
    let spare = match c.meta("rng_spare")? {
        "" => None,
        s => Some(f64::from_bits(
            s.parse::<u64>().map_err(|_| bad("rng_spare"))?,
        )),
    };
    let order: Vec<usize> = c
        .tensor("trainer.order")?
        .to_u64s()?
        .into_iter()
        .map(|i| i as usize)
        .collect();
    Ok((
        num("step")? as usize,
        Rng::from_state(num("rng_state")?, spare),
        order,
        num("cursor")? as usize,
    ))
}

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

/// What a run did.
#[derive(Clone, Debug)]
pub struct Summary {
    pub parameters: usize,
    pub steps: usize,
    pub images: usize,
    /// Seconds spent in training steps (forward, backward, update; data included).
    pub train_seconds: f64,
    pub images_per_second: f64,
    /// Images/s over the steps after the first (which pays for first-touch allocations).
    pub steady_images_per_second: f64,
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
    /// The gradient exchange used.
    pub comm: CommOptions,
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

/// The batch read ahead by a loader thread (a `data` span on the timeline while waiting).
pub(crate) fn wait_for_batch<B>(
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
pub(crate) struct Tally {
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

    /// Step `step` (0-based) finished: its wall time, its waits, its loss.
    pub fn step(&mut self, step: usize, seconds: f64, data_s: f64, comm_s: f64, loss: f64) {
        self.timing.push(StepTiming {
            step: step + 1,
            seconds,
            data_s,
            comm_s,
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
            flops_forward_per_image: flops.forward,
            flops_step_per_image: flops.training(),
            achieved_flops: flops.training() * steady,
            final_loss: self.final_loss,
            evals: self.evals,
            time_to_quality: self.time_to_quality,
            ranks: self.ranks,
            comm_bytes_per_step: self.comm_bytes + stats_bytes,
            comm_wait_seconds: self.comm_wait,
            timing: self.timing,
            elapsed_seconds: elapsed,
            comm: self.comm,
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
}

/// Receives one line per step (for the progress bar).
pub trait Monitor {
    fn step(&self, step: usize, steps: usize, loss: f64, images_per_second: f64);
}

pub struct Quiet;

impl Monitor for Quiet {
    fn step(&self, _: usize, _: usize, _: f64, _: f64) {}
}

/// Top-1/Top-5 and loss over `images` held-out images.
pub fn evaluate<T: Float>(
    model: &mut ResNet<T>,
    data: &Source,
    images: usize,
    batch: usize,
    step: usize,
) -> Result<Eval, EvalError> {
    evaluate_with(
        &mut |x| Ok(model.forward(x, false)),
        data,
        images,
        batch,
        step,
    )
}

/// Inference logits of a batch (the CPU model's or a device's).
pub type Logits<'a, T> = dyn FnMut(&Tensor<T>) -> Result<Tensor<T>, CudaError> + 'a;

/// `evaluate` with the inference logits from `forward` (the CPU model or a device).
pub fn evaluate_with<T: Float>(
    forward: &mut Logits<'_, T>,
    data: &Source,
    images: usize,
    batch: usize,
    step: usize,
) -> Result<Eval, EvalError> {
    let (mut top1, mut top5, mut loss) = (0usize, 0usize, 0.0);
    for start in (0..images).step_by(batch.max(1)) {
        let ids: Vec<u64> = (start..(start + batch).min(images))
            .map(|i| i as u64)
            .collect();
        let (x, labels) = data.eval_batch::<T>(&ids)?;
        let z = forward(&x)?;
        let (l, _, t1, t5) = softmax_cross_entropy(&z, &labels, 0.0);
        top1 += t1;
        top5 += t5;
        loss += l * ids.len() as f64;
    }
    let n = images.max(1) as f64;
    Ok(Eval {
        step,
        top1: top1 as f64 / n,
        top5: top5 as f64 / n,
        loss: loss / n,
        map: None,
    })
}

/// Softmax probabilities of the `images` held-out images from the inference logits of
/// `forward`, with their labels (a bagged model's share of the ensemble).
pub fn predict_with<T: Float>(
    forward: &mut Logits<'_, T>,
    data: &Source,
    images: usize,
    batch: usize,
) -> Result<crate::bagging::Predictions, EvalError> {
    let (mut probabilities, mut all_labels, mut classes) = (Vec::new(), Vec::new(), 0);
    for start in (0..images).step_by(batch.max(1)) {
        let ids: Vec<u64> = (start..(start + batch).min(images))
            .map(|i| i as u64)
            .collect();
        let (x, labels) = data.eval_batch::<T>(&ids)?;
        let z = forward(&x)?;
        classes = z.c;
        for row in z.data.chunks(z.c.max(1)) {
            let m = row
                .iter()
                .map(|v| v.to_f64())
                .fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = row.iter().map(|v| (v.to_f64() - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            probabilities.extend(e.iter().map(|v| (v / sum) as f32));
        }
        all_labels.extend(labels);
    }
    Ok(crate::bagging::Predictions::Classes {
        classes,
        probabilities,
        labels: all_labels,
    })
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

/// Trains on the synthetic set. Deterministic for a given configuration and thread count.
pub fn train<T: Float>(cfg: &TrainConfig, monitor: &dyn Monitor) -> Result<Summary, TrainError> {
    train_with::<T>(cfg, monitor, None)
}

impl TrainConfig {
    /// This run, stopped after `steps` steps of its schedule (the schedule still spans
    /// `self.steps`): what an interrupted run does before it resumes.
    pub fn stop_after(mut self, steps: usize) -> TrainConfig {
        self.run.stop_at = Some(steps);
        self
    }
}

/// A device that runs the training step in place of the CPU layers (the CUDA path,
/// [`crate::gpu`]). The CPU model stays the reference copy: the device takes its parameters
/// after a resume and writes them back for checkpoints and the summary.
pub trait Accelerator<T> {
    /// Takes `model`'s parameters, momenta and running statistics.
    fn begin(&mut self, model: &mut ResNet<T>) -> Result<(), CudaError>;
    /// One step on this rank's share of the batch: forward, loss, backward, gradient
    /// allreduce, update at `lr`. Returns (mean loss over this rank's rows, bytes this rank
    /// put into gradient allreduces).
    fn step(
        &mut self,
        x: &Tensor<T>,
        labels: &[usize],
        lr: f64,
        smoothing: f64,
        sgd: &Sgd,
    ) -> Result<(f64, f64), CudaError>;
    /// Inference logits.
    fn logits(&mut self, x: &Tensor<T>) -> Result<Tensor<T>, CudaError>;
    /// Writes parameters, momenta and running statistics back into `model`.
    fn store(&mut self, model: &mut ResNet<T>) -> Result<(), CudaError>;
}

/// `train`, data parallel over the ranks of `reducer`: every rank draws the same global batch
/// and trains on its share; batch norm uses global statistics and gradients are allreduced,
/// so that N ranks compute what one process computes on the whole batch.
pub fn train_with<T: Float>(
    cfg: &TrainConfig,
    monitor: &dyn Monitor,
    reducer: Option<Arc<dyn Reducer>>,
) -> Result<Summary, TrainError> {
    train_on::<T>(cfg, monitor, reducer, None)
}

/// `train_with`, the steps run by `device` when given (the CPU layers otherwise).
pub fn train_on<T: Float>(
    cfg: &TrainConfig,
    monitor: &dyn Monitor,
    reducer: Option<Arc<dyn Reducer>>,
    mut device: Option<&mut dyn Accelerator<T>>,
) -> Result<Summary, TrainError> {
    keep_freed_memory();
    let (ranks, rank) = reducer.as_ref().map_or((1, 0), |r| (r.ranks(), r.rank()));
    assert!(
        cfg.run.batch.is_multiple_of(ranks),
        "the global batch must divide among the ranks"
    );
    let local = cfg.run.batch / ranks;
    let mut model = ResNet::<T>::new(cfg.model.clone(), cfg.run.seed);
    // The CPU layers' reductions all go through the exchange's thread (the device path sums
    // its gradients itself).
    let exchange = match (&reducer, &device) {
        (Some(r), None) => Some(Exchange::start(Arc::clone(r))),
        _ => None,
    };
    let reducer: Option<Arc<dyn Reducer>> = match &exchange {
        Some(e) => Some(Arc::clone(e) as Arc<dyn Reducer>),
        None => reducer,
    };
    if let Some(r) = &reducer {
        model.set_reducer(Arc::clone(r));
    }
    let sgd = Sgd::default();
    let schedule = Schedule {
        base_lr_per_256: cfg.base_lr_per_256,
        global_batch: cfg.run.batch,
        warmup_steps: cfg.run.warmup_steps,
        total_steps: cfg.run.steps,
        decay: cfg.decay,
    };
    let flops = model.flops_per_image(cfg.data.resolution());
    let mut rng = Rng::new(cfg.run.seed ^ 0xDA7A);
    let order = rng.permutation(cfg.train_images.max(1));
    let mut data = Order {
        rng,
        order,
        cursor: 0,
        images: cfg.train_images.max(1),
    };
    let mut start_step = 0;
    if let Some(path) = &cfg.run.resume {
        let (s0, r, o, c) =
            load_checkpoint(path, &mut model, cfg).map_err(TrainError::Checkpoint)?;
        start_step = s0;
        data = Order {
            rng: r,
            order: o,
            cursor: c,
            images: cfg.train_images.max(1),
        };
    }
    if let Some(d) = device.as_deref_mut() {
        d.begin(&mut model).map_err(TrainError::Device)?;
    }
    let mut tally = Tally::new(cfg.run.batch, ranks, cfg.run.comm, start_step);
    let first_read = Instant::now();
    let end = cfg.run.stop_at.unwrap_or(cfg.run.steps).min(cfg.run.steps);
    // One batch ahead: the next step's images decode on other threads while this one computes.
    let fetch = |ids: Vec<u64>, step: usize| {
        let src = cfg.data.clone();
        let seed = cfg.run.seed ^ (step as u64).wrapping_mul(0xA5A5_5A5A_1234_5678);
        // A bagged model reads its bootstrap sample: position i of the order is image
        // sample[i] (some images twice, some never).
        let mine: Vec<u64> = ids[rank * local..(rank + 1) * local]
            .iter()
            .map(|&i| match &cfg.run.ensemble {
                Some(m) => m.sample.get(i as usize).map_or(i, |&s| s as u64),
                None => i,
            })
            .collect();
        std::thread::spawn(move || {
            timed(
                "data",
                || format!("load batch {}", step + 1),
                || src.train_batch::<T>(&mine, seed),
            )
        })
    };
    // The data order as of the last finished step (before the prefetch's draw).
    let mut saved = data.clone();
    let mut pending = (start_step < end).then(|| fetch(data.draw(cfg.run.batch), start_step));
    for step in start_step..end {
        let t0 = Instant::now();
        let step_span = span("step", || format!("step {}", step + 1));
        let (x, labels) = wait_for_batch(&mut pending)?;
        let data_s = t0.elapsed().as_secs_f64();
        let mut comm_s = 0.0;
        // The data order after this step's draw (what a checkpoint after this step records).
        let after_draw = data.clone();
        if step + 1 < end {
            pending = Some(fetch(data.draw(cfg.run.batch), step + 1));
        }
        let mut loss = match device.as_deref_mut() {
            Some(d) => {
                let (loss, bytes) = d
                    .step(&x, &labels, schedule.lr(step), cfg.label_smoothing, &sgd)
                    .map_err(TrainError::Device)?;
                tally.comm_bytes = bytes;
                loss
            }
            None => {
                let z = model.forward(&x, true);
                let (loss, g, _, _) = timed(
                    FWD,
                    || "softmax".into(),
                    || softmax_cross_entropy(&z, &labels, cfg.label_smoothing),
                );
                match &exchange {
                    Some(ex) => {
                        let mut buckets = Buckets::new(ex, cfg.run.comm);
                        model.backward_with(&g, &mut |ps| {
                            for p in ps {
                                buckets.push(p.grad.iter().map(|g| g.to_f64() as f32));
                            }
                        });
                        tally.comm_bytes = buckets.bytes;
                        // The global batch's mean gradient.
                        comm_s = buckets.finish_into(model.backward_order(), ranks);
                    }
                    None => model.backward(&g),
                }
                timed(
                    "optimizer",
                    || "sgd".into(),
                    || sgd.step(model.params(), schedule.lr(step)),
                );
                loss
            }
        };
        if let Some(r) = &reducer {
            let mut l = [loss];
            r.sum_f64(&mut l);
            loss = l[0] / ranks as f64;
        }
        drop(step_span);
        let dt = t0.elapsed().as_secs_f64();
        tally.step(step, dt, data_s, comm_s, loss);
        monitor.step(step + 1, cfg.run.steps, loss, cfg.run.batch as f64 / dt);
        if let (Some(path), Some(every)) = (&cfg.run.checkpoint, cfg.run.checkpoint_every) {
            if every > 0 && (step + 1).is_multiple_of(every) && step + 1 < cfg.run.steps {
                if let Some(d) = device.as_deref_mut() {
                    d.store(&mut model).map_err(TrainError::Device)?;
                }
                save_checkpoint(
                    path,
                    &mut model,
                    step + 1,
                    &after_draw.rng,
                    &after_draw.order,
                    after_draw.cursor,
                    cfg,
                )
                .map_err(TrainError::Checkpoint)?;
            }
        }
        saved = after_draw;
        let last = step + 1 == cfg.run.steps;
        if cfg.eval_images > 0 && ((step + 1) % cfg.run.eval_every.max(1) == 0 || last) {
            let e = match device.as_deref_mut() {
                Some(d) => evaluate_with(
                    &mut |x| d.logits(x),
                    &cfg.data,
                    cfg.eval_images,
                    cfg.run.batch,
                    step + 1,
                ),
                None => evaluate(
                    &mut model,
                    &cfg.data,
                    cfg.eval_images,
                    cfg.run.batch,
                    step + 1,
                ),
            }
            .map_err(TrainError::Evaluation)?;
            let reached = cfg.run.target.is_some_and(|t| e.top1 >= t);
            tally.evals.push(e);
            if reached {
                tally.time_to_quality = Some(first_read.elapsed().as_secs_f64());
                break;
            }
        }
    }
    // A bagged model's held-out predictions, for the ensemble.
    let predictions = match (&cfg.run.ensemble, cfg.eval_images) {
        (Some(_), n) if n > 0 => Some(
            match device.as_deref_mut() {
                Some(d) => predict_with(&mut |x| d.logits(x), &cfg.data, n, cfg.run.batch),
                None => predict_with(
                    &mut |x| Ok(model.forward(x, false)),
                    &cfg.data,
                    n,
                    cfg.run.batch,
                ),
            }
            .map_err(TrainError::Evaluation)?,
        ),
        _ => None,
    };
    if let Some(d) = device {
        d.store(&mut model).map_err(TrainError::Device)?;
    }
    if let Some(path) = &cfg.run.checkpoint {
        save_checkpoint(
            path,
            &mut model,
            tally.steps_done,
            &saved.rng,
            &saved.order,
            saved.cursor,
            cfg,
        )
        .map_err(TrainError::Checkpoint)?;
    }
    // Batch-norm channels: each has a γ and a β.
    let bn_channels: usize = model
        .params()
        .iter()
        .filter(|p| p.name.contains("bn") || p.name.contains("downsample.1"))
        .map(|p| p.value.len())
        .sum::<usize>()
        / 2;
    let mut summary = tally.summary(
        flops,
        model.params(),
        bn_channels,
        first_read.elapsed().as_secs_f64(),
    );
    summary.predictions = predictions;
    Ok(summary)
}

#[cfg(test)]
mod tests;
