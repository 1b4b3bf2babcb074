//! Training the EWA workload (Faster R-CNN on the Extreme Weather data) with the trainer's
//! parts: SGD with momentum and the warm-up + cosine schedule, data parallel over the ranks of
//! a reducer (synchronised batch norm, every gradient summed in fused buckets through the same
//! exchange thread — the heads' and the pyramid's while the backbone's backward pass runs —
//! optionally 16-bit on the wire), checkpoints that resume the run exactly,
//! timeline spans, one batch read ahead, evaluation by mAP@0.5 and time-to-quality.

use crate::checkpoint::{Checkpoint, CheckpointError};
use crate::data::Rng;
use crate::detect::map::{mean_average_precision, Detection, Truth};
use crate::detect::model::{Detector, DetectorConfig, Losses, Target};
use crate::ewa_data::EwaSet;
use crate::exchange::{Buckets, Exchange};
use crate::layers::Reducer;
use crate::run::RunOptions;
use crate::tensor::{Float, Tensor};
use crate::train::{
    wait_for_batch, Eval, EvalError, Monitor, Schedule, Sgd, Summary, Tally, TrainError,
};
use roofline_collectors::timeline::{span, timed};
use roofline_kernels::cuda::CudaError;
use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

/// What to train.
#[derive(Clone)]
pub struct EwaConfig {
    pub model: DetectorConfig,
    pub data: Arc<EwaSet>,
    /// The images trained on and the held-out images evaluated (indices into `data`).
    pub train: Range<usize>,
    pub eval: Range<usize>,
    /// Learning rate per 16 images (torchvision's detection reference: 0.02).
    pub base_lr_per_16: f64,
    /// The schedule, the target mAP@0.5 (the paper: 0.35), checkpoints, the exchange, the
    /// ensemble member.
    pub run: RunOptions,
}

impl EwaConfig {
    /// The images of step `step` (the global batch): epoch after epoch, each a permutation of
    /// the training images drawn from the seed and the epoch — a function of the step alone,
    /// so that a resumed run reads what the uninterrupted run would have.
    pub fn batch_ids(&self, step: usize) -> Vec<usize> {
        let n = self.train.len().max(1);
        let mut perm: Option<(usize, Vec<usize>)> = None;
        (0..self.run.batch)
            .map(|i| {
                let k = step * self.run.batch + i;
                let epoch = k / n;
                if perm.as_ref().map(|(e, _)| *e) != Some(epoch) {
                    let mut rng = Rng::new(self.run.seed ^ 0xE90C_0000 ^ epoch as u64);
                    perm = Some((epoch, rng.permutation(n)));
                }
                let (_, p) = perm.as_ref().expect("drawn");
                // A bagged model: position i is its bootstrap sample's image sample[i].
                let i = p[k % n];
                self.train.start
                    + self
                        .run
                        .ensemble
                        .as_ref()
                        .and_then(|m| m.sample.get(i).copied())
                        .unwrap_or(i)
            })
            .collect()
    }
}

/// A batch: NHWC images and their targets.
pub fn batch<T: Float>(
    data: &EwaSet,
    ids: &[usize],
) -> Result<(Tensor<T>, Vec<Target>), crate::data::DataError> {
    let (h, w) = (data.height, data.width);
    let c = crate::ewa_data::CHANNELS;
    let mut x = Tensor::zeros(ids.len(), h, w, c);
    let mut targets = Vec::with_capacity(ids.len());
    for (n, &i) in ids.iter().enumerate() {
        let (img, boxes) = data.item(i)?;
        for (d, v) in x.data[n * h * w * c..(n + 1) * h * w * c]
            .iter_mut()
            .zip(&img)
        {
            *d = T::from_f64(*v as f64);
        }
        targets.push(Target {
            boxes: boxes.iter().map(|b| b.0).collect(),
            classes: boxes.iter().map(|b| b.1).collect(),
        });
    }
    Ok((x, targets))
}

/// mAP@0.5 of `model` over the images `ids`, `size` at a time, and each class's AP (None: no
/// box of that class among the images).
pub fn evaluate<T: Float>(
    model: &mut Detector<T>,
    data: &EwaSet,
    ids: Range<usize>,
    size: usize,
) -> Result<(f64, Vec<Option<f64>>), EvalError> {
    let classes = model.cfg.classes;
    evaluate_with(&mut |x| Ok(model.detect(x)), data, ids, size, classes)
}

/// Each image's detections, as a batch gives them.
pub type Detections = Vec<Vec<Detection>>;

/// `evaluate` with the detections made by `detect` (the CPU model or a device).
pub fn evaluate_with<T: Float>(
    detect: &mut Detect<'_, T>,
    data: &EwaSet,
    ids: Range<usize>,
    size: usize,
    classes: usize,
) -> Result<(f64, Vec<Option<f64>>), EvalError> {
    let (detections, truths) = detect_all(detect, data, ids, size)?;
    let (map, per_class) = mean_average_precision(&detections, &truths, classes, 0.5);
    Ok((map.ok_or(EvalError::NoTruth)?, per_class))
}

/// The detections of a batch (the CPU model's or a device's).
pub type Detect<'a, T> = dyn FnMut(&Tensor<T>) -> Result<Detections, CudaError> + 'a;

/// Every detection of the images `ids` (each `image` the image's id) and their ground truth.
pub fn predict_with<T: Float>(
    detect: &mut Detect<'_, T>,
    data: &EwaSet,
    ids: Range<usize>,
    size: usize,
    classes: usize,
) -> Result<crate::bagging::Predictions, EvalError> {
    let (detections, truths) = detect_all(detect, data, ids, size)?;
    Ok(crate::bagging::Predictions::Boxes {
        classes,
        detections,
        truths,
    })
}

/// Every detection of the images `ids`, `size` at a time, and their ground truth.
fn detect_all<T: Float>(
    detect: &mut Detect<'_, T>,
    data: &EwaSet,
    ids: Range<usize>,
    size: usize,
) -> Result<(Vec<Detection>, Vec<Truth>), EvalError> {
    let (mut dets, mut truths) = (Vec::new(), Vec::new());
    let ids: Vec<usize> = ids.collect();
    for chunk in ids.chunks(size.max(1)) {
        let (x, targets) = batch::<T>(data, chunk)?;
        let found = detect(&x)?;
        for (k, (f, t)) in found.into_iter().zip(&targets).enumerate() {
            let image = chunk[k];
            dets.extend(f.into_iter().map(|mut d| {
                d.image = image;
                d
            }));
            truths.extend(t.boxes.iter().zip(&t.classes).map(|(b, &c)| Truth {
                image,
                class: c,
                bbox: *b,
            }));
        }
    }
    Ok((dets, truths))
}

/// The CPU's optimizer step.
fn cpu_update<T: Float>(sgd: &Sgd, model: &mut Detector<T>, lr: f64) {
    timed(
        "optimizer",
        || "sgd".into(),
        || sgd.step(model.params(), lr),
    );
}

fn save<T: Float>(
    path: &std::path::Path,
    model: &mut Detector<T>,
    step: usize,
    cfg: &EwaConfig,
) -> Result<(), CheckpointError> {
    let mut c = Checkpoint::default();
    c.put_params(model.params());
    c.put_stats(model.backbone.running_stats());
    c.metadata
        .insert("format".into(), "roofline/checkpoint/v1".into());
    c.metadata.insert("workload".into(), "ewa".into());
    c.metadata.insert("step".into(), step.to_string());
    c.metadata
        .insert("model".into(), format!("{:?}", cfg.model));
    c.metadata.insert("batch".into(), cfg.run.batch.to_string());
    c.save(path)
}

fn load<T: Float>(
    path: &std::path::Path,
    model: &mut Detector<T>,
    cfg: &EwaConfig,
) -> Result<usize, CheckpointError> {
    let c = Checkpoint::load(path)?;
    if c.meta("workload").ok() != Some("ewa")
        || c.meta("model")? != format!("{:?}", cfg.model)
        || c.meta("batch")? != cfg.run.batch.to_string()
    {
        return Err(CheckpointError::Mismatch(format!(
            "{} was written for another workload, model or batch",
            path.display()
        )));
    }
    c.take_params(model.params())?;
    c.take_stats(model.backbone.running_stats())?;
    c.meta("step")?
        .parse::<usize>()
        .map_err(|_| CheckpointError::Mismatch("bad step in the checkpoint".into()))
}

/// A device that runs the detector's steps in place of the CPU layers (the CUDA path,
/// [`crate::gpu::GpuDetector`]), as [`crate::train::Accelerator`] is for the classifier. The CPU
/// model stays the reference copy: the device takes its parameters at the start (after a
/// resume) and writes them back for checkpoints and the summary.
pub trait DetectorDevice<T> {
    /// Takes `model`'s parameters, momenta and running statistics.
    fn begin(&mut self, model: &mut Detector<T>) -> Result<(), CudaError>;
    /// One step on this rank's share of the batch: forward, losses, backward, gradient
    /// allreduce, update at `lr`. Returns (this rank's losses, bytes it put into gradient
    /// allreduces).
    fn step(
        &mut self,
        x: &Tensor<T>,
        truth: &[Target],
        seed: u64,
        lr: f64,
        sgd: &Sgd,
    ) -> Result<(Losses, f64), CudaError>;
    /// Detections for a batch (inference).
    fn detect(&mut self, x: &Tensor<T>) -> Result<Detections, CudaError>;
    /// Writes parameters, momenta and running statistics back into `model`.
    fn store(&mut self, model: &mut Detector<T>) -> Result<(), CudaError>;
}

/// Trains the detector, data parallel over the ranks of `reducer` (each rank its share of the
/// global batch). Returns the trainer's summary: its evaluations carry mAP@0.5 (`map`), with
/// no Top-1/Top-5 (NaN).
pub fn train<T: Float>(
    cfg: &EwaConfig,
    monitor: &dyn Monitor,
    reducer: Option<Arc<dyn Reducer>>,
) -> Result<Summary, TrainError> {
    train_on::<T>(cfg, monitor, reducer, None)
}

/// `train`, the steps run by `device` when given (the CPU layers otherwise): the same loop,
/// data, schedule, checkpoints, evaluation and tally either way.
pub fn train_on<T: Float>(
    cfg: &EwaConfig,
    monitor: &dyn Monitor,
    reducer: Option<Arc<dyn Reducer>>,
    mut device: Option<&mut dyn DetectorDevice<T>>,
) -> Result<Summary, TrainError> {
    let (ranks, rank) = reducer.as_ref().map_or((1, 0), |r| (r.ranks(), r.rank()));
    if cfg.run.batch == 0 || !cfg.run.batch.is_multiple_of(ranks) {
        return Err(TrainError::Setup(format!(
            "the global batch ({}) must divide among the {ranks} ranks",
            cfg.run.batch
        )));
    }
    if cfg.train.is_empty() || cfg.train.end > cfg.data.len() || cfg.eval.end > cfg.data.len() {
        return Err(TrainError::Setup(format!(
            "training images {:?} and evaluation images {:?} must lie in the {} images given",
            cfg.train,
            cfg.eval,
            cfg.data.len()
        )));
    }
    let local = cfg.run.batch / ranks;
    let mut model = Detector::<T>::new(cfg.model.clone(), cfg.run.seed);
    // The CPU layers' reductions all go through the exchange's thread (a device sums its
    // gradients itself, and its batch norms use the reducer it was given).
    let exchange = match (&reducer, &device) {
        (Some(r), None) => Some(Exchange::start(Arc::clone(r))),
        _ => None,
    };
    if let Some(e) = &exchange {
        model.set_reducer(Arc::clone(e) as Arc<dyn Reducer>);
    }
    let reducer: Option<Arc<dyn Reducer>> = match &exchange {
        Some(e) => Some(Arc::clone(e) as Arc<dyn Reducer>),
        None => reducer,
    };
    let sgd = Sgd::default();
    let schedule = Schedule {
        // The trainer's schedule is per 256 images.
        base_lr_per_256: cfg.base_lr_per_16 * 16.0,
        global_batch: cfg.run.batch,
        warmup_steps: cfg.run.warmup_steps,
        total_steps: cfg.run.steps,
        decay: crate::train::Decay::Cosine,
    };
    let flops = cfg.model.flops(cfg.data.height, cfg.data.width).total();
    let mut start_step = 0;
    if let Some(path) = &cfg.run.resume {
        start_step = load(path, &mut model, cfg).map_err(TrainError::Checkpoint)?;
    }
    if let Some(d) = device.as_deref_mut() {
        d.begin(&mut model).map_err(TrainError::Device)?;
    }
    let end = cfg.run.stop_at.unwrap_or(cfg.run.steps).min(cfg.run.steps);
    let fetch = |step: usize| {
        let data = Arc::clone(&cfg.data);
        let ids = cfg.batch_ids(step)[rank * local..(rank + 1) * local].to_vec();
        std::thread::spawn(move || {
            timed(
                "data",
                || format!("load batch {}", step + 1),
                || batch::<T>(&data, &ids),
            )
        })
    };
    let mut pending = (start_step < end).then(|| fetch(start_step));
    let mut tally = Tally::new(cfg.run.batch, ranks, cfg.run.comm, start_step);
    let first_read = Instant::now();
    for step in start_step..end {
        let t0 = Instant::now();
        let step_span = span("step", || format!("step {}", step + 1));
        let (x, targets) = wait_for_batch(&mut pending)?;
        let data_s = t0.elapsed().as_secs_f64();
        if step + 1 < end {
            pending = Some(fetch(step + 1));
        }
        let seed = cfg.run.seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (rank as u64);
        let mut comm_s = 0.0;
        let losses = match (device.as_deref_mut(), &exchange) {
            (Some(d), _) => {
                let (losses, bytes) = d
                    .step(&x, &targets, seed, schedule.lr(step), &sgd)
                    .map_err(TrainError::Device)?;
                tally.comm_bytes = bytes;
                losses
            }
            (None, None) => {
                let losses = model.train_step(&x, &targets, seed);
                cpu_update(&sgd, &mut model, schedule.lr(step));
                losses
            }
            (None, Some(ex)) => {
                // Each group's gradients go into the fused buckets as soon as the backward
                // pass finishes them (heads first, backbone last).
                let mut buckets = Buckets::new(ex, cfg.run.comm);
                let losses = model.train_step_with(&x, &targets, seed, &mut |ps| {
                    for p in ps {
                        buckets.push(p.grad.iter().map(|g| g.to_f64() as f32));
                    }
                });
                tally.comm_bytes = buckets.bytes;
                comm_s = buckets.finish_into(model.backward_order(), ranks);
                cpu_update(&sgd, &mut model, schedule.lr(step));
                losses
            }
        };
        let mut loss = losses.total();
        if let Some(r) = &reducer {
            let mut l = [loss];
            r.sum_f64(&mut l);
            loss = l[0] / ranks as f64;
        }
        if !loss.is_finite() {
            return Err(TrainError::Diverged {
                step: step + 1,
                losses: format!("{losses:?}"),
            });
        }
        drop(step_span);
        let dt = t0.elapsed().as_secs_f64();
        tally.step(step, dt, data_s, comm_s, loss);
        monitor.step(step + 1, cfg.run.steps, loss, cfg.run.batch as f64 / dt);
        if let (Some(path), Some(every)) = (&cfg.run.checkpoint, cfg.run.checkpoint_every) {
            if every > 0 && (step + 1).is_multiple_of(every) && step + 1 < cfg.run.steps {
                // Every rank stores (a device's copy comes back), rank 0 writes.
                if let Some(d) = device.as_deref_mut() {
                    d.store(&mut model).map_err(TrainError::Device)?;
                }
                if rank == 0 {
                    save(path, &mut model, step + 1, cfg).map_err(TrainError::Checkpoint)?;
                }
            }
        }
        let last = step + 1 == cfg.run.steps;
        if !cfg.eval.is_empty() && ((step + 1) % cfg.run.eval_every.max(1) == 0 || last) {
            // Every rank evaluates the same images with the same parameters (batch norm on
            // running statistics): the same mAP everywhere, so that all stop together.
            let (map, _) = timed(
                "eval",
                || "mAP".into(),
                || match device.as_deref_mut() {
                    Some(d) => evaluate_with(
                        &mut |x| d.detect(x),
                        &cfg.data,
                        cfg.eval.clone(),
                        local.max(1),
                        cfg.model.classes,
                    ),
                    None => evaluate(&mut model, &cfg.data, cfg.eval.clone(), local.max(1)),
                },
            )
            .map_err(TrainError::Evaluation)?;
            tally.evals.push(Eval {
                step: step + 1,
                top1: f64::NAN,
                top5: f64::NAN,
                loss: f64::NAN,
                map: Some(map),
            });
            if cfg.run.target.is_some_and(|t| map >= t) {
                tally.time_to_quality = Some(first_read.elapsed().as_secs_f64());
                break;
            }
        }
    }
    // A bagged model's held-out detections, for the ensemble.
    let predictions = match &cfg.run.ensemble {
        Some(_) if !cfg.eval.is_empty() => Some(
            match device.as_deref_mut() {
                Some(d) => predict_with(
                    &mut |x| d.detect(x),
                    &cfg.data,
                    cfg.eval.clone(),
                    local.max(1),
                    cfg.model.classes,
                ),
                None => predict_with(
                    &mut |x| Ok(model.detect(x)),
                    &cfg.data,
                    cfg.eval.clone(),
                    local.max(1),
                    cfg.model.classes,
                ),
            }
            .map_err(TrainError::Evaluation)?,
        ),
        _ => None,
    };
    if let Some(d) = device {
        d.store(&mut model).map_err(TrainError::Device)?;
    }
    if let (Some(path), 0) = (&cfg.run.checkpoint, rank) {
        save(path, &mut model, tally.steps_done, cfg).map_err(TrainError::Checkpoint)?;
    }
    let bn_channels: usize = model
        .backbone
        .running_stats()
        .iter()
        .map(|(_, m, _)| m.len())
        .sum();
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
mod tests {
    use super::*;
    use crate::ewa_data::write_synthetic;
    use crate::exchange::CommOptions;
    use crate::train::Quiet;

    /// A synthetic year of `n` images at `h × w`, written as HDF5 and opened through the loader.
    fn synthetic(name: &str, n: usize, h: usize, w: usize) -> Arc<EwaSet> {
        let p = std::env::temp_dir().join(format!(
            "roofline-ewa-train-{name}-{}.h5",
            std::process::id()
        ));
        write_synthetic(&p, n, h, w, 42).unwrap();
        let set = Arc::new(EwaSet::open(std::slice::from_ref(&p), h, w).unwrap());
        let _ = std::fs::remove_file(&p);
        let _ = std::fs::remove_file(format!("{}.stats.json", p.display()));
        set
    }

    /// The scaled-down model (sampling scaled with the image area).
    fn small(h: usize, w: usize) -> DetectorConfig {
        DetectorConfig::scaled(0.25, [1, 1, 1, 1], h, w)
    }

    fn config(data: Arc<EwaSet>, train: Range<usize>, eval: Range<usize>) -> EwaConfig {
        EwaConfig {
            model: small(data.height, data.width),
            data,
            train,
            eval,
            base_lr_per_16: 0.02,
            run: RunOptions {
                batch: 8,
                steps: 200,
                warmup_steps: 20,
                seed: 1,
                target: None,
                eval_every: 200,
                checkpoint: None,
                resume: None,
                stop_at: None,
                checkpoint_every: None,
                comm: Default::default(),
                ensemble: None,
            },
        }
    }

    /// Detection works end to end: a scaled-down model trained on synthetic storms at 64×96
    /// (written to HDF5 and read back through the loader) reaches mAP@0.5 ≥ 0.5 on held-out
    /// images; before training it finds nothing.
    #[test]
    fn a_small_detector_learns_the_synthetic_storms() {
        let data = synthetic("learn", 320, 64, 96);
        let cfg = config(data, 0..256, 256..320);
        let s = train::<f32>(&cfg, &Quiet, None).unwrap();
        let map = s.evals.last().and_then(|e| e.map).unwrap();
        eprintln!("mAP@0.5 after {} steps: {map:.4}", s.steps);
        assert!(map >= 0.5, "mAP@0.5 {map}");
        let mut fresh = Detector::<f32>::new(cfg.model.clone(), cfg.run.seed);
        // Running statistics from one forward pass in training mode, no update.
        let (x, t) = batch::<f32>(&cfg.data, &cfg.batch_ids(0)).unwrap();
        fresh.train_step(&x, &t, 1);
        let (before, _) = evaluate(&mut fresh, &cfg.data, 256..320, 8).unwrap();
        assert!(before < 0.1, "untrained mAP {before}");
        assert!(s.flops_step_per_image > 3.0 * s.flops_forward_per_image * 0.9);
    }

    /// Stopped, checkpointed and resumed, a run ends where the uninterrupted run ends, bit for
    /// bit; the target mAP stops a run early with its time-to-quality.
    #[test]
    fn checkpoints_resume_exactly_and_targets_stop_the_run() {
        let base = config(synthetic("resume", 40, 32, 48), 0..32, 32..40);
        let cfg = EwaConfig {
            run: RunOptions {
                steps: 6,
                batch: 4,
                eval_every: 6,
                ..base.run.clone()
            },
            ..base
        };
        let whole = train::<f32>(&cfg, &Quiet, None).unwrap();
        let path =
            std::env::temp_dir().join(format!("roofline-ewa-ckpt-{}.st", std::process::id()));
        let first = EwaConfig {
            run: RunOptions {
                stop_at: Some(3),
                checkpoint: Some(path.clone()),
                ..cfg.run.clone()
            },
            ..cfg.clone()
        };
        train::<f32>(&first, &Quiet, None).unwrap();
        let rest = EwaConfig {
            run: RunOptions {
                resume: Some(path.clone()),
                ..cfg.run.clone()
            },
            ..cfg.clone()
        };
        let resumed = train::<f32>(&rest, &Quiet, None).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(resumed.start_step, 3);
        assert_eq!(resumed.param_norm.to_bits(), whole.param_norm.to_bits());
        assert_eq!(resumed.final_loss.to_bits(), whole.final_loss.to_bits());
        // Another model's checkpoint is refused.
        let mut other = cfg.clone();
        other.model.hidden += 1;
        train::<f32>(&first, &Quiet, None).unwrap();
        let e = train::<f32>(
            &EwaConfig {
                run: RunOptions {
                    resume: Some(path.clone()),
                    ..other.run.clone()
                },
                ..other
            },
            &Quiet,
            None,
        )
        .unwrap_err();
        let _ = std::fs::remove_file(&path);
        assert!(
            e.to_string().contains("another workload, model or batch"),
            "{e}"
        );
        // Any mAP reaches a target of zero at the first evaluation.
        let quick = train::<f32>(
            &EwaConfig {
                run: RunOptions {
                    target: Some(0.0),
                    eval_every: 2,
                    ..cfg.run.clone()
                },
                ..cfg
            },
            &Quiet,
            None,
        )
        .unwrap();
        assert_eq!(quick.steps, 2);
        assert!(quick.time_to_quality.is_some());
    }

    /// Two data-parallel ranks keep the same parameters (batch norm over both ranks' images,
    /// gradients averaged), put every gradient on the wire (4 bytes each in f32, 2 in fp16),
    /// and both report the same loss.
    /// A device that computes what the CPU does: its own copy of the detector.
    struct Mirror {
        net: Option<Detector<f32>>,
        stored: usize,
    }

    fn copy(from: &mut Detector<f32>, to: &mut Detector<f32>) {
        for (a, b) in from.params().into_iter().zip(to.params()) {
            b.value.clone_from(&a.value);
            b.momentum.clone_from(&a.momentum);
        }
        let stats = from.backbone.running_stats();
        for ((_, m, v), (_, m2, v2)) in stats.into_iter().zip(to.backbone.running_stats()) {
            m2.clone_from(m);
            v2.clone_from(v);
        }
    }

    fn not_begun() -> CudaError {
        CudaError::Check("not begun".into())
    }

    impl DetectorDevice<f32> for Mirror {
        fn begin(&mut self, model: &mut Detector<f32>) -> Result<(), CudaError> {
            let mut n = Detector::new(model.cfg.clone(), 999);
            copy(model, &mut n);
            self.net = Some(n);
            Ok(())
        }
        fn step(
            &mut self,
            x: &Tensor<f32>,
            truth: &[Target],
            seed: u64,
            lr: f64,
            sgd: &Sgd,
        ) -> Result<(Losses, f64), CudaError> {
            let n = self.net.as_mut().ok_or_else(not_begun)?;
            let l = n.train_step(x, truth, seed);
            sgd.step(n.params(), lr);
            Ok((l, 0.0))
        }
        fn detect(&mut self, x: &Tensor<f32>) -> Result<Detections, CudaError> {
            Ok(self.net.as_mut().ok_or_else(not_begun)?.detect(x))
        }
        fn store(&mut self, model: &mut Detector<f32>) -> Result<(), CudaError> {
            self.stored += 1;
            copy(self.net.as_mut().ok_or_else(not_begun)?, model);
            Ok(())
        }
    }

    /// The loop with a device (the CUDA path's shape) is the CPU's loop: the same losses,
    /// parameters, evaluations and checkpoint, the device's copy written back for each
    /// checkpoint and at the end.
    #[test]
    fn a_device_that_computes_what_the_cpu_does_gives_the_cpu_run() {
        let data = synthetic("device", 24, 32, 48);
        let path = std::env::temp_dir().join(format!("roofline-ewa-dev-{}.st", std::process::id()));
        let base = config(data, 0..16, 16..24);
        let cfg = EwaConfig {
            run: RunOptions {
                steps: 4,
                batch: 4,
                eval_every: 2,
                checkpoint: Some(path.clone()),
                checkpoint_every: Some(2),
                ..base.run.clone()
            },
            ..base
        };
        let cpu = train::<f32>(&cfg, &Quiet, None).unwrap();
        let written = std::fs::read(&path).unwrap();
        let mut dev = Mirror {
            net: None,
            stored: 0,
        };
        let on = train_on::<f32>(&cfg, &Quiet, None, Some(&mut dev)).unwrap();
        let again = std::fs::read(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(on.param_norm.to_bits(), cpu.param_norm.to_bits());
        assert_eq!(on.final_loss.to_bits(), cpu.final_loss.to_bits());
        let maps = |s: &Summary| -> Vec<(usize, Option<f64>)> {
            s.evals.iter().map(|e| (e.step, e.map)).collect()
        };
        assert_eq!(maps(&on), maps(&cpu));
        assert_eq!(on.evals.len(), 2);
        assert!(on.evals.iter().all(|e| e.map.is_some()));
        assert_eq!(written, again, "the same checkpoint");
        assert_eq!(
            dev.stored, 2,
            "written back for the checkpoint at step 2 and at the end"
        );
    }

    #[test]
    fn two_ranks_stay_in_step() {
        let data = synthetic("ranks", 16, 32, 48);
        let mut bytes = Vec::new();
        for wire in [crate::exchange::Wire::F32, crate::exchange::Wire::F16] {
            let cfg = EwaConfig {
                run: RunOptions {
                    steps: 3,
                    batch: 4,
                    comm: CommOptions {
                        wire,
                        ..Default::default()
                    },
                    ..config(Arc::clone(&data), 0..16, 0..0).run.clone()
                },
                ..config(Arc::clone(&data), 0..16, 0..0)
            };
            let runs = crate::exchange::tests::on_ranks(2, |r| {
                train::<f32>(&cfg, &Quiet, Some(r)).unwrap()
            });
            assert_eq!(runs[0].param_norm.to_bits(), runs[1].param_norm.to_bits());
            assert_eq!(runs[0].final_loss.to_bits(), runs[1].final_loss.to_bits());
            assert_eq!(runs[0].ranks, 2);
            bytes.push((runs[0].parameters as f64, runs[0].comm_bytes_per_step));
        }
        // f32 → fp16 halves the gradients' bytes (the batch-norm statistics stay f64).
        let (p, f32_bytes) = bytes[0];
        assert_eq!(f32_bytes - bytes[1].1, 2.0 * p);
        assert!(f32_bytes > 4.0 * p);
    }

    /// The batch order is a function of the step: every image once per epoch.
    #[test]
    fn every_image_once_per_epoch() {
        let base = config(synthetic("order", 12, 32, 48), 2..12, 0..0);
        let cfg = EwaConfig {
            run: RunOptions {
                batch: 4,
                ..base.run.clone()
            },
            ..base
        };
        let mut seen: Vec<usize> = (0..5).flat_map(|s| cfg.batch_ids(s)).collect();
        assert_eq!(seen.len(), 20);
        let (first, second) = seen.split_at_mut(10);
        first.sort();
        second.sort();
        assert_eq!(first, (2..12).collect::<Vec<_>>());
        assert_eq!(first, second);
    }
}
