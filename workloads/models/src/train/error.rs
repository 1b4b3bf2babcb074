//! What can stop a training run, and what can stop its evaluation.

use crate::data::DataError;
use roofline_kernels::cuda::CudaError;

/// What can stop a run.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("data: {0}")]
    Data(#[from] DataError),
    /// The run's configuration does not fit its data or ranks.
    #[error("{0}")]
    Setup(String),
    #[error("the loss diverged at step {step} ({losses}); lower the learning rate")]
    Diverged { step: usize, losses: String },
    /// Evaluating the held-out images failed (reading them, or the device).
    #[error("evaluation: {0}")]
    Evaluation(#[from] EvalError),
    /// The GPU (the accelerator of `--device cuda`) failed.
    #[error("--device cuda: {0}")]
    Device(#[source] CudaError),
}

/// What can stop an evaluation (of a run, or of a bagged model's predictions).
#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    /// Reading the held-out images.
    #[error("{0}")]
    Data(#[from] DataError),
    /// The device that made the logits or detections.
    #[error("--device cuda: {0}")]
    Device(#[from] CudaError),
    /// mAP needs at least one ground-truth box.
    #[error("the evaluation images hold no ground-truth box: mAP is undefined")]
    NoTruth,
}
