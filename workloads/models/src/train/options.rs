//! The options of a training run beside its model and data ([`RunOptions`]): the schedule,
//! when to stop, checkpoints, the ranks' gradient exchange, the ensemble member it is. Both
//! workloads and every device read them; `run` builds them from the command line.

use crate::exchange::CommOptions;
use std::path::PathBuf;

/// What a run of either workload is told beside its model and data: the schedule, when to stop,
/// checkpoints, the ranks' gradient exchange, the ensemble member it is.
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Images per step (the global batch).
    pub batch: usize,
    pub steps: usize,
    /// Linear warm-up steps of the learning rate.
    pub warmup_steps: usize,
    pub seed: u64,
    /// The quality the run is timed to (time-to-quality): Top-1 for the classifier, mAP@0.5 for
    /// the detector; the run stops there when `stop_at_target`.
    pub target: Option<f64>,
    /// Stop as soon as evaluation reaches `target` (`train`'s way). HPC AI500 V2.0 times a fixed
    /// number of epochs to their end (§5.3.2): a score trains on and records when the target
    /// was first reached.
    pub stop_at_target: bool,
    /// Weight decay on every parameter, batch norm's γ and β and the biases included (HPC
    /// AI500 V2.0 §5.4: leaving it off them is a forbidden change), or on the convolution and
    /// classifier weights alone.
    pub decay_all: bool,
    /// Evaluate every this many steps (and at the end).
    pub eval_every: usize,
    /// Write a checkpoint (safetensors) here at the end of the run.
    pub checkpoint: Option<PathBuf>,
    /// Resume from this checkpoint: the run continues exactly as if it had not stopped.
    pub resume: Option<PathBuf>,
    /// Stop (and checkpoint) after this step although the schedule runs to `steps`.
    pub stop_at: Option<usize>,
    /// Also checkpoint every this many steps (a killed run resumes from the last one).
    pub checkpoint_every: Option<usize>,
    /// How a data-parallel run exchanges gradients (wire format, overlap, bucket size).
    pub comm: CommOptions,
    /// A base model of a bagged ensemble (HPC AI500 V3.0): it trains on its bootstrap sample
    /// of the training images and keeps its held-out predictions (`Summary::predictions`).
    pub ensemble: Option<crate::bagging::Member>,
    /// Stop before the next step once this is set (AutoML's time budget, Ctrl-C): the run ends
    /// as if `stop_at` had been the step it reached.
    pub stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    /// Pretrained starting weights (`--init FILE`), checked against the model when the run
    /// was prepared; a resumed checkpoint still wins.
    pub init: Option<std::sync::Arc<crate::init::Pretrained>>,
}

impl RunOptions {
    /// `batch` images a step for `steps` steps, warm-up over a tenth, evaluated at the end; no
    /// target, no checkpoints, the default exchange.
    pub fn new(batch: usize, steps: usize, seed: u64) -> RunOptions {
        RunOptions {
            batch,
            steps,
            warmup_steps: steps / 10,
            seed,
            target: None,
            stop_at_target: true,
            decay_all: false,
            eval_every: steps,
            checkpoint: None,
            resume: None,
            stop_at: None,
            checkpoint_every: None,
            comm: CommOptions::default(),
            ensemble: None,
            stop: None,
            init: None,
        }
    }
}
