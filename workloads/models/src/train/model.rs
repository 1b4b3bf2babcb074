//! What the one training loop ([`super::run`]) is generic over: the model it trains
//! ([`Model`]: ResNet-50, the detector, any network built from a description), what it trains
//! it on ([`Task`]: the data, its order, the evaluation, the schedule) and where the steps run
//! ([`Device`]: the CPU layers ([`Cpu`]) or a GPU (`CudaTrainer`, in the device trainer crate above)).
//!
//! A new workload implements `Model` for its network (on the CPU layers) and `Task` for its
//! configuration; the loop, its checkpoints, its tally, its evaluation schedule and its
//! data-parallel exchange come with it. A CUDA implementation implements
//! `GpuModel` (the device trainer) for the network's GPU copy.

use super::RunOptions;
use super::{Eval, EvalError, Schedule, Sgd, TrainError};
use crate::checkpoint::{Checkpoint, CheckpointError, RunningStats};
use crate::data::DataError;
use crate::exchange::{Buckets, CommOptions, Exchange};
use crate::layers::{Param, Reducer};
use crate::resnet::Flops;
use crate::tensor::{Float, Tensor};
use roofline_collectors::timeline::timed;
use roofline_kernels::cuda::CudaError;
use std::ops::Range;
use std::sync::Arc;

/// A step's losses: their sum is what the loop reports, averages over the ranks and checks for
/// divergence; `Debug` is what a diverged run prints.
pub trait Loss: std::fmt::Debug {
    fn total(&self) -> f64;
}

impl Loss for f64 {
    fn total(&self) -> f64 {
        *self
    }
}

/// A network the loop trains, on the CPU layers: the reference copy of the parameters (a
/// device takes them at the start and writes them back for checkpoints and the summary).
pub trait Model<T: Float> {
    /// What a batch's images are labelled with (a loader thread makes it).
    type Truth: Send + 'static;
    /// What inference gives for a batch (logits, detections).
    type Output;
    /// A step's losses.
    type Loss: Loss;
    /// The configuration in words, written into checkpoints: a checkpoint written for another
    /// model is refused.
    fn describe(&self) -> String;
    /// Every parameter (the checkpoint's order).
    fn params(&mut self) -> Vec<&mut Param<T>>;
    /// Every parameter in the order the backward pass finishes them (the gradient exchange's).
    fn backward_order(&mut self) -> Vec<&mut Param<T>>;
    /// Every batch norm's running statistics, by name (checkpoints).
    fn running_stats(&mut self) -> RunningStats<'_, T>;
    /// Batch-norm channels whose statistics data-parallel ranks sum (Σx, Σx² forward; Σdy,
    /// Σdy·x backward), for the communication tally.
    fn synced_channels(&mut self) -> usize;
    /// The ranks' reducer for synchronised batch norm.
    fn set_reducer(&mut self, r: Arc<dyn Reducer>);
    /// Forward, losses and backward for a batch: leaves every parameter's gradient and hands
    /// each group to `ready` as soon as the backward pass has finished it (in
    /// `backward_order`'s order). `seed` fixes whatever the step samples.
    fn train_step(
        &mut self,
        x: &Tensor<T>,
        truth: &Self::Truth,
        seed: u64,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) -> Self::Loss;
    /// Inference on a batch.
    fn infer(&mut self, x: &Tensor<T>) -> Self::Output;
}

/// What one step on a device did.
#[derive(Clone, Debug)]
pub struct Stepped<L> {
    /// This rank's losses (over its share of the batch).
    pub loss: L,
    /// Bytes this rank put into gradient allreduces.
    pub comm_bytes: f64,
    /// Seconds waited for gradient sums after the backward pass.
    pub comm_wait_s: f64,
    /// Times the host waited for a GPU during the step (0 on the CPU).
    pub host_syncs: u64,
    /// Device memory allocations the step made (a GPU's pool; 0 on the CPU).
    pub device_allocations: u64,
}

/// Where the steps run. The CPU model is the reference copy: a device takes its parameters,
/// momenta and running statistics in `begin` and writes them back in `store`.
pub trait Device<T: Float, M: Model<T>> {
    /// The reducer this rank's sums go through (the loss's too); None: a single process.
    fn reducer(&self) -> Option<Arc<dyn Reducer>>;
    /// Takes `model`'s parameters, momenta and running statistics.
    fn begin(&mut self, model: &mut M) -> Result<(), CudaError>;
    /// One step on this rank's share of the batch: forward, losses, backward, gradient
    /// allreduce, update at `lr`.
    fn step(
        &mut self,
        model: &mut M,
        x: &Tensor<T>,
        truth: &M::Truth,
        seed: u64,
        lr: f64,
        sgd: &Sgd,
    ) -> Result<Stepped<M::Loss>, CudaError>;
    /// Inference on a batch.
    fn infer(&mut self, model: &mut M, x: &Tensor<T>) -> Result<M::Output, CudaError>;
    /// Writes parameters, momenta and running statistics back into `model`.
    fn store(&mut self, model: &mut M) -> Result<(), CudaError>;
    /// Where the loader's thread puts each batch as soon as it has read it, ahead of the step
    /// that trains on it (a GPU's pinned memory and copy stream, after `begin`); None: the
    /// step takes the batch as it is.
    fn stager(&self) -> Option<Arc<dyn Stage<T>>> {
        None
    }
    /// What the run did with CUDA graphs (None: a device that has none).
    fn cuda_graph(&self) -> Option<super::GraphReport> {
        None
    }
    /// What the run's convolution searches did (None: a device that makes none).
    fn conv_search(&self) -> Option<super::SearchReport> {
        None
    }
}

/// A device's place for batches read ahead ([`Device::stager`]). Staging is an optimisation:
/// a batch that was not staged, or whose staging failed, is still trained on.
pub trait Stage<T>: Send + Sync {
    fn stage(&self, x: &Tensor<T>);
}

/// The GPU trainer's pinned staging buffers (the kernels' `Stager`) as the loop's stage.
impl Stage<f32> for roofline_kernels::cuda::stage::Stager {
    fn stage(&self, x: &Tensor<f32>) {
        roofline_kernels::cuda::stage::Stager::stage(self, &x.data)
    }
}

/// The CPU layers as the loop's device: data parallel over a reducer's ranks, every reduction
/// (batch-norm statistics, the fused gradient buckets, the loss) through one exchange thread.
pub struct Cpu {
    exchange: Option<Arc<Exchange>>,
    comm: CommOptions,
}

impl Cpu {
    /// Steps on this process's CPU layers; with `reducer`, data parallel over its ranks,
    /// exchanging gradients as `comm` says.
    pub fn new(reducer: Option<Arc<dyn Reducer>>, comm: CommOptions) -> Cpu {
        Cpu {
            exchange: reducer.map(Exchange::start),
            comm,
        }
    }
}

impl<T: Float, M: Model<T>> Device<T, M> for Cpu {
    fn reducer(&self) -> Option<Arc<dyn Reducer>> {
        self.exchange
            .as_ref()
            .map(|e| Arc::clone(e) as Arc<dyn Reducer>)
    }

    fn begin(&mut self, model: &mut M) -> Result<(), CudaError> {
        if let Some(r) = Device::<T, M>::reducer(self) {
            model.set_reducer(r);
        }
        Ok(())
    }

    fn step(
        &mut self,
        model: &mut M,
        x: &Tensor<T>,
        truth: &M::Truth,
        seed: u64,
        lr: f64,
        sgd: &Sgd,
    ) -> Result<Stepped<M::Loss>, CudaError> {
        let (loss, comm_bytes, comm_wait_s) = match &self.exchange {
            Some(ex) => {
                // Each group's gradients go into the fused buckets as soon as the backward
                // pass finishes them; the global batch's mean gradient comes back.
                let mut buckets = Buckets::new(ex, self.comm);
                let loss = model.train_step(x, truth, seed, &mut |ps| {
                    for p in ps {
                        buckets.push(p.grad.iter().map(|g| g.to_f64() as f32));
                    }
                });
                let bytes = buckets.bytes;
                let waited = buckets.finish_into(model.backward_order(), ex.ranks());
                (loss, bytes, waited)
            }
            None => (model.train_step(x, truth, seed, &mut |_| {}), 0.0, 0.0),
        };
        timed(
            "optimizer",
            || "sgd".into(),
            || sgd.step(model.params(), lr),
        );
        Ok(Stepped {
            loss,
            comm_bytes,
            comm_wait_s,
            host_syncs: 0,
            device_allocations: 0,
        })
    }

    fn infer(&mut self, model: &mut M, x: &Tensor<T>) -> Result<M::Output, CudaError> {
        Ok(model.infer(x))
    }

    fn store(&mut self, _: &mut M) -> Result<(), CudaError> {
        Ok(())
    }
}

/// A batch read on a loader thread: the images and their truth.
pub type Loader<T, U> = Box<dyn FnOnce() -> Result<(Tensor<T>, U), DataError> + Send>;

/// Inference on a batch, by the CPU model or a device.
pub type Infer<'a, T, O> = dyn FnMut(&Tensor<T>) -> Result<O, CudaError> + 'a;

/// What to train and on what: the model's configuration, the data and its order, the schedule,
/// the evaluation. The classifier's [`super::TrainConfig`] and the detector's
/// [`crate::ewa::EwaConfig`] are tasks.
pub trait Task<T: Float> {
    type Model: Model<T>;
    /// Where the data order stands between steps (what a checkpoint keeps of it).
    type Order: Clone;
    /// The workload's name in checkpoints ("resnet50", "ewa").
    fn name(&self) -> &'static str;
    /// The schedule, target, checkpoints, exchange and ensemble member.
    fn options(&self) -> &RunOptions;
    /// Whether the configuration makes a run on `ranks` ranks (the batch divides among them,
    /// the data holds the images asked for); the error says what does not fit.
    fn check(&self, ranks: usize) -> Result<(), TrainError>;
    /// The model, initialised from the run's seed.
    fn build(&self) -> Self::Model;
    /// The learning-rate schedule.
    fn schedule(&self) -> Schedule;
    /// The model's FLOPs per image at the task's resolution (the trainer's count).
    fn flops(&self, model: &Self::Model) -> Flops;
    /// The data order of a fresh run.
    fn first_order(&self) -> Self::Order;
    /// Draws the global batch of step `step` from `order` and returns the loader of this
    /// rank's `rows` of it.
    fn next_batch(
        &self,
        order: &mut Self::Order,
        step: usize,
        rows: Range<usize>,
    ) -> Loader<T, <Self::Model as Model<T>>::Truth>;
    /// Writes the data order into a checkpoint.
    fn save_order(&self, order: &Self::Order, c: &mut Checkpoint);
    /// The data order a checkpoint kept.
    fn load_order(&self, c: &Checkpoint) -> Result<Self::Order, CheckpointError>;
    /// The seed of step `step` on rank `rank` (for what the step samples).
    fn step_seed(&self, step: usize, rank: usize) -> u64;
    /// Whether the run evaluates held-out images.
    fn evaluates(&self) -> bool;
    /// Evaluates the held-out images at step `step` (`local`: the images a rank steps on).
    fn evaluate(
        &self,
        infer: &mut Infer<'_, T, <Self::Model as Model<T>>::Output>,
        step: usize,
        local: usize,
    ) -> Result<Eval, EvalError>;
    /// A bagged model's predictions on the held-out images, for the ensemble.
    fn predict(
        &self,
        infer: &mut Infer<'_, T, <Self::Model as Model<T>>::Output>,
        local: usize,
    ) -> Result<crate::bagging::Predictions, EvalError>;
}
