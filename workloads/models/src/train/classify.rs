//! The classification task: ResNet-50 (v1.5 or v1) on synthetic images or an ImageNet-style
//! folder, scored by Top-1 — the loop's [`Task`] and [`Model`] for the classifier.

use super::model::{Infer, Loader, Model, Task};
use super::{Decay, Eval, EvalError, Schedule, TrainError};
use crate::checkpoint::{Checkpoint, CheckpointError, RunningStats, Stored};
use crate::data::{DataError, Rng, Synthetic};
use crate::folder::ImageFolder;
use crate::layers::{softmax_cross_entropy, Param, Reducer};
use crate::resnet::{Config, Flops, ResNet, FWD};
use crate::tensor::{Float, Tensor};
use crate::train::RunOptions;
use roofline_collectors::timeline::timed;
use std::ops::Range;
use std::sync::Arc;

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
pub struct Order {
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

/// A classification batch's truth: each image's class, and the label smoothing of the loss.
#[derive(Clone, Debug, PartialEq)]
pub struct Labels {
    pub classes: Vec<usize>,
    pub smoothing: f64,
}

/// A classifier's loss on its training logits `z`: the mean softmax cross-entropy against
/// `truth` (label-smoothed as it says) and its gradient, ∂loss/∂logits.
pub fn softmax_loss<T: Float>(z: &Tensor<T>, truth: &Labels) -> (f64, Tensor<T>) {
    let (loss, g, _, _) = timed(
        FWD,
        || "softmax".into(),
        || softmax_cross_entropy(z, &truth.classes, truth.smoothing),
    );
    (loss, g)
}

impl<T: Float> Model<T> for ResNet<T> {
    type Truth = Labels;
    type Output = Tensor<T>;
    type Loss = f64;

    fn describe(&self) -> String {
        format!("{:?}", self.config)
    }
    fn params(&mut self) -> Vec<&mut Param<T>> {
        ResNet::params(self)
    }
    fn backward_order(&mut self) -> Vec<&mut Param<T>> {
        ResNet::backward_order(self)
    }
    fn running_stats(&mut self) -> RunningStats<'_, T> {
        ResNet::running_stats(self)
    }
    fn synced_channels(&mut self) -> usize {
        // Batch-norm channels: each has a γ and a β.
        ResNet::params(self)
            .iter()
            .filter(|p| p.name.contains("bn") || p.name.contains("downsample.1"))
            .map(|p| p.value.len())
            .sum::<usize>()
            / 2
    }
    fn set_reducer(&mut self, r: Arc<dyn Reducer>) {
        ResNet::set_reducer(self, r)
    }
    fn train_step(
        &mut self,
        x: &Tensor<T>,
        truth: &Labels,
        _seed: u64,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) -> f64 {
        let z = self.forward(x, true);
        let (loss, g) = softmax_loss(&z, truth);
        self.backward_with(&g, ready);
        loss
    }
    fn infer(&mut self, x: &Tensor<T>) -> Tensor<T> {
        self.forward(x, false)
    }
}

impl<T: Float> Task<T> for TrainConfig {
    type Model = ResNet<T>;
    type Order = Order;

    fn name(&self) -> &'static str {
        "resnet50"
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
        Ok(())
    }
    fn build(&self) -> ResNet<T> {
        ResNet::new(self.model.clone(), self.run.seed)
    }
    fn schedule(&self) -> Schedule {
        Schedule {
            base_lr_per_256: self.base_lr_per_256,
            global_batch: self.run.batch,
            warmup_steps: self.run.warmup_steps,
            total_steps: self.run.steps,
            decay: self.decay,
        }
    }
    fn flops(&self, model: &ResNet<T>) -> Flops {
        let r = self.data.resolution();
        crate::accounting::resnet_flops(model, r, r)
    }
    fn first_order(&self) -> Order {
        let mut rng = Rng::new(self.run.seed ^ 0xDA7A);
        let order = rng.permutation(self.train_images.max(1));
        Order {
            rng,
            order,
            cursor: 0,
            images: self.train_images.max(1),
        }
    }
    fn next_batch(&self, order: &mut Order, step: usize, rows: Range<usize>) -> Loader<T, Labels> {
        let ids = order.draw(self.run.batch);
        let src = self.data.clone();
        let seed = self.run.seed ^ (step as u64).wrapping_mul(0xA5A5_5A5A_1234_5678);
        let smoothing = self.label_smoothing;
        // A bagged model reads its bootstrap sample: position i of the order is image
        // sample[i] (some images twice, some never).
        let mine: Vec<u64> = ids[rows]
            .iter()
            .map(|&i| match &self.run.ensemble {
                Some(m) => m.sample.get(i as usize).map_or(i, |&s| s as u64),
                None => i,
            })
            .collect();
        Box::new(move || {
            let (x, classes) = src.train_batch::<T>(&mine, seed)?;
            Ok((x, Labels { classes, smoothing }))
        })
    }
    fn save_order(&self, o: &Order, c: &mut Checkpoint) {
        c.tensors.insert(
            "trainer.order".into(),
            Stored::u64s(o.order.iter().map(|&i| i as u64)),
        );
        let (state, spare) = o.rng.state();
        c.metadata.insert("cursor".into(), o.cursor.to_string());
        c.metadata.insert("rng_state".into(), state.to_string());
        c.metadata.insert(
            "rng_spare".into(),
            spare.map(|s| s.to_bits().to_string()).unwrap_or_default(),
        );
    }
    fn load_order(&self, c: &Checkpoint) -> Result<Order, CheckpointError> {
        let bad = |k: &str| CheckpointError::Mismatch(format!("bad {k} in the checkpoint"));
        let num = |k: &str| -> Result<u64, CheckpointError> {
            c.meta(k)?.parse::<u64>().map_err(|_| bad(k))
        };
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
        Ok(Order {
            rng: Rng::from_state(num("rng_state")?, spare),
            order,
            cursor: num("cursor")? as usize,
            images: self.train_images.max(1),
        })
    }
    fn step_seed(&self, _step: usize, _rank: usize) -> u64 {
        // The classifier samples nothing in its step (the augmentation is the loader's).
        0
    }
    fn evaluates(&self) -> bool {
        self.eval_images > 0
    }
    fn evaluate(
        &self,
        infer: &mut Infer<'_, T, Tensor<T>>,
        step: usize,
        _local: usize,
    ) -> Result<Eval, EvalError> {
        // Every rank evaluates the same images, a global batch at a time.
        evaluate(infer, &self.data, self.eval_images, self.run.batch, step)
    }
    fn predict(
        &self,
        infer: &mut Infer<'_, T, Tensor<T>>,
        _local: usize,
    ) -> Result<crate::bagging::Predictions, EvalError> {
        predict(infer, &self.data, self.eval_images, self.run.batch)
    }
}

impl TrainConfig {
    /// This run, stopped after `steps` steps of its schedule (the schedule still spans
    /// `self.steps`): what an interrupted run does before it resumes.
    pub fn stop_after(mut self, steps: usize) -> TrainConfig {
        self.run.stop_at = Some(steps);
        self
    }
}

/// Top-1/Top-5 and loss over `images` held-out images, from the inference logits of `forward`
/// (the CPU model or a device), `batch` at a time.
pub fn evaluate<T: Float>(
    forward: &mut Infer<'_, T, Tensor<T>>,
    data: &Source,
    images: usize,
    batch: usize,
    step: usize,
) -> Result<Eval, EvalError> {
    let (mut top1, mut top5, mut loss) = (0usize, 0usize, 0.0);
    held_out(forward, data, images, batch, &mut |z, labels| {
        let (l, _, t1, t5) = softmax_cross_entropy(&z, &labels, 0.0);
        top1 += t1;
        top5 += t5;
        loss += l * labels.len() as f64;
    })?;
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
pub fn predict<T: Float>(
    forward: &mut Infer<'_, T, Tensor<T>>,
    data: &Source,
    images: usize,
    batch: usize,
) -> Result<crate::bagging::Predictions, EvalError> {
    let (mut probabilities, mut all_labels, mut classes) = (Vec::new(), Vec::new(), 0);
    held_out(forward, data, images, batch, &mut |z, labels| {
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
    })?;
    Ok(crate::bagging::Predictions::Classes {
        classes,
        probabilities,
        labels: all_labels,
    })
}

/// The inference logits of the `images` held-out images by `forward`, `batch` at a time, each
/// batch's handed to `each` with its labels.
fn held_out<T: Float>(
    forward: &mut Infer<'_, T, Tensor<T>>,
    data: &Source,
    images: usize,
    batch: usize,
    each: &mut dyn FnMut(Tensor<T>, Vec<usize>),
) -> Result<(), EvalError> {
    for start in (0..images).step_by(batch.max(1)) {
        let ids: Vec<u64> = (start..(start + batch).min(images))
            .map(|i| i as u64)
            .collect();
        let (x, labels) = data.eval_batch::<T>(&ids)?;
        each(forward(&x)?, labels);
    }
    Ok(())
}
