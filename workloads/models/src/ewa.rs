//! Training the EWA workload (Faster R-CNN on the Extreme Weather data) with the trainer's
//! parts: SGD with momentum and the warm-up + cosine schedule, data parallel over the ranks of
//! a reducer (synchronised batch norm, every gradient summed in fused buckets through the same
//! exchange thread — the heads' and the pyramid's while the backbone's backward pass runs —
//! optionally 16-bit on the wire), checkpoints that resume the run exactly,
//! timeline spans, one batch read ahead, evaluation by mAP@0.5 and time-to-quality.

use crate::checkpoint::{Checkpoint, CheckpointError, RunningStats};
use crate::data::Rng;
use crate::detect::map::{mean_average_precision, Detection, Truth};
use crate::detect::model::{Detector, DetectorConfig, Losses, Target};
use crate::ewa_data::EwaSet;
use crate::layers::{Param, Reducer};
use crate::resnet::Flops;
use crate::tensor::{Float, Tensor};
use crate::train::RunOptions;
use crate::train::{
    Decay, Eval, EvalError, Infer, Loader, Loss, Model, Schedule, Task, TrainError,
};
use roofline_collectors::timeline::timed;
use std::ops::Range;
use std::sync::Arc;

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
pub type Detect<'a, T> = Infer<'a, T, Detections>;

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

impl<T: Float> Model<T> for Detector<T> {
    type Truth = Vec<Target>;
    type Output = Detections;
    type Loss = Losses;

    fn describe(&self) -> String {
        format!("{:?}", self.cfg)
    }
    fn params(&mut self) -> Vec<&mut Param<T>> {
        Detector::params(self)
    }
    fn backward_order(&mut self) -> Vec<&mut Param<T>> {
        Detector::backward_order(self)
    }
    fn running_stats(&mut self) -> RunningStats<'_, T> {
        self.backbone.running_stats()
    }
    fn synced_channels(&mut self) -> usize {
        self.backbone
            .running_stats()
            .iter()
            .map(|(_, m, _)| m.len())
            .sum()
    }
    fn set_reducer(&mut self, r: Arc<dyn Reducer>) {
        Detector::set_reducer(self, r)
    }
    fn train_step(
        &mut self,
        x: &Tensor<T>,
        truth: &Vec<Target>,
        seed: u64,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) -> Losses {
        self.train_step_with(x, truth, seed, ready)
    }
    fn infer(&mut self, x: &Tensor<T>) -> Detections {
        self.detect(x)
    }
}

impl Loss for Losses {
    fn total(&self) -> f64 {
        Losses::total(self)
    }
}

/// The detection task: its data order is a function of the step ([`EwaConfig::batch_ids`]),
/// so a checkpoint keeps nothing of it.
impl<T: Float> Task<T> for EwaConfig {
    type Model = Detector<T>;
    type Order = ();

    fn name(&self) -> &'static str {
        "ewa"
    }
    fn options(&self) -> &RunOptions {
        &self.run
    }
    fn check(&self, ranks: usize) -> Result<(), TrainError> {
        if self.run.batch == 0 || !self.run.batch.is_multiple_of(ranks) {
            return Err(TrainError::Setup(format!(
                "the global batch ({}) must divide among the {ranks} ranks",
                self.run.batch
            )));
        }
        if self.train.is_empty()
            || self.train.end > self.data.len()
            || self.eval.end > self.data.len()
        {
            return Err(TrainError::Setup(format!(
                "training images {:?} and evaluation images {:?} must lie in the {} images given",
                self.train,
                self.eval,
                self.data.len()
            )));
        }
        Ok(())
    }
    fn build(&self) -> Detector<T> {
        Detector::new(self.model.clone(), self.run.seed)
    }
    fn schedule(&self) -> Schedule {
        Schedule {
            // The trainer's schedule is per 256 images.
            base_lr_per_256: self.base_lr_per_16 * 16.0,
            global_batch: self.run.batch,
            warmup_steps: self.run.warmup_steps,
            total_steps: self.run.steps,
            decay: Decay::Cosine,
        }
    }
    fn flops(&self, _: &Detector<T>) -> Flops {
        crate::accounting::detector_flops(&self.model, self.data.height, self.data.width).total()
    }
    fn first_order(&self) {}
    fn next_batch(&self, _: &mut (), step: usize, rows: Range<usize>) -> Loader<T, Vec<Target>> {
        let data = Arc::clone(&self.data);
        let ids = self.batch_ids(step)[rows].to_vec();
        Box::new(move || batch::<T>(&data, &ids))
    }
    fn save_order(&self, _: &(), _: &mut Checkpoint) {}
    fn load_order(&self, _: &Checkpoint) -> Result<(), CheckpointError> {
        Ok(())
    }
    fn step_seed(&self, step: usize, rank: usize) -> u64 {
        self.run.seed ^ (step as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ (rank as u64)
    }
    fn evaluates(&self) -> bool {
        !self.eval.is_empty()
    }
    fn evaluate(
        &self,
        infer: &mut Infer<'_, T, Detections>,
        step: usize,
        local: usize,
    ) -> Result<Eval, EvalError> {
        let (map, _) = timed(
            "eval",
            || "mAP".into(),
            || {
                evaluate_with(
                    infer,
                    &self.data,
                    self.eval.clone(),
                    local.max(1),
                    self.model.classes,
                )
            },
        )?;
        Ok(Eval {
            step,
            top1: f64::NAN,
            top5: f64::NAN,
            loss: f64::NAN,
            map: Some(map),
        })
    }
    fn predict(
        &self,
        infer: &mut Infer<'_, T, Detections>,
        local: usize,
    ) -> Result<crate::bagging::Predictions, EvalError> {
        predict_with(
            infer,
            &self.data,
            self.eval.clone(),
            local.max(1),
            self.model.classes,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ewa_data::write_synthetic;
    use crate::exchange::CommOptions;
    use crate::train::tests::Mirror;
    use crate::train::{train, Quiet, Summary};

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
                stop_at_target: true,
                decay_all: false,
                eval_every: 200,
                checkpoint: None,
                resume: None,
                stop_at: None,
                checkpoint_every: None,
                comm: Default::default(),
                ensemble: None,
                stop: None,
                init: None,
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
        let s = train::<f32, _>(&cfg, &Quiet, None).unwrap();
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
        let whole = train::<f32, _>(&cfg, &Quiet, None).unwrap();
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
        train::<f32, _>(&first, &Quiet, None).unwrap();
        let rest = EwaConfig {
            run: RunOptions {
                resume: Some(path.clone()),
                ..cfg.run.clone()
            },
            ..cfg.clone()
        };
        let resumed = train::<f32, _>(&rest, &Quiet, None).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(resumed.start_step, 3);
        assert_eq!(resumed.param_norm.to_bits(), whole.param_norm.to_bits());
        assert_eq!(resumed.final_loss.to_bits(), whole.final_loss.to_bits());
        // Another model's checkpoint is refused.
        let mut other = cfg.clone();
        other.model.hidden += 1;
        train::<f32, _>(&first, &Quiet, None).unwrap();
        let e = train::<f32, _>(
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
            e.to_string()
                .contains("was written for another run (model "),
            "{e}"
        );
        // Any mAP reaches a target of zero at the first evaluation.
        let quick = train::<f32, _>(
            &EwaConfig {
                run: RunOptions {
                    target: Some(0.0),
                    stop_at_target: true,
                    decay_all: false,
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
        let cpu = train::<f32, _>(&cfg, &Quiet, None).unwrap();
        let written = std::fs::read(&path).unwrap();
        let model = cfg.model.clone();
        let mut dev = Mirror::new(move || Detector::new(model.clone(), 999));
        let on = crate::train::run::<f32, _>(&cfg, &Quiet, &mut dev).unwrap();
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
                train::<f32, _>(&cfg, &Quiet, Some(r)).unwrap()
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
