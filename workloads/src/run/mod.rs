//! A training run of either workload, set up and driven the same way: the options both
//! workloads share ([`RunOptions`]), what each workload answers about itself ([`Workload`]),
//! the run built from typed command-line choices ([`prepare()`]) and executed on the CPU or
//! a GPU ([`execute`]).

pub mod bagged;
pub mod execute;
mod gpu_check;
mod memory;
pub mod place;
pub mod placing;
pub mod prepare;
pub mod ranks;
pub mod report;
pub mod score;
pub mod scoring;
pub mod sweep;
pub mod sweeping;

pub use crate::train::RunOptions;
pub use execute::{energy_span, execute, open_gpu, GpuRun};
pub use gpu_check::check_all;
pub use prepare::{prepare, Depth, Device, Job, Kind, Prepared, Resolution, Spec};
pub use ranks::{ranks, reducer, traced, train, Ranks, Trained};

/// What a workload's configuration says about itself, so that the verbs and the run's setup
/// treat both alike.
pub trait Workload {
    fn run(&self) -> &RunOptions;
    fn run_mut(&mut self) -> &mut RunOptions;
    /// Images in the training set (a bagged model's bootstrap sample draws this many).
    fn train_images(&self) -> usize;
    /// Held-out images evaluated.
    fn eval_images(&self) -> usize;
    /// Evaluates nothing from now on (a run measured for its speed).
    fn no_evaluation(&mut self);
    /// Every layer's count per `h × w` image (the accounting's rules; the one FLOP count).
    fn layers(&self, h: usize, w: usize) -> Vec<crate::accounting::LayerCount>;
    /// The schedule and optimiser in words (for reports).
    fn describe(&self) -> Vec<(&'static str, serde_json::Value)>;
}

/// Why a run could not be set up or did not finish.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The options or the data given do not make a run (the command line's exit 2).
    #[error("{0}")]
    Input(String),
    /// The run could not start or failed on the way (exit 1).
    #[error("{0}")]
    Run(String),
    #[error("cannot start {threads} threads: {source}")]
    Threads {
        threads: usize,
        #[source]
        source: rayon::ThreadPoolBuildError,
    },
    /// `--device cuda` without a driver or a GPU: said with what was looked for.
    #[error("--device cuda: {0}")]
    NoGpu(#[source] roofline_kernels::cuda::CudaError),
    #[error("--device cuda: {0}")]
    Gpu(#[source] roofline_kernels::cuda::CudaError),
    #[error(transparent)]
    Train(#[from] crate::train::TrainError),
    /// Ctrl-C stopped a measurement that polls for it (exit 130).
    #[error("interrupted")]
    Interrupted,
    /// Ctrl-C stopped a run that had written part of its result: what it kept.
    #[error("interrupted; kept {0}")]
    InterruptedKept(String),
}

impl RunError {
    /// Whether the fault is the input's (bad options or data), not the run's.
    pub fn is_input(&self) -> bool {
        match self {
            RunError::Input(_) | RunError::NoGpu(_) => true,
            RunError::Train(e) => !matches!(
                e,
                crate::train::TrainError::Device(_)
                    | crate::train::TrainError::Evaluation(crate::train::EvalError::Device(_))
            ),
            _ => false,
        }
    }
}

impl Workload for crate::train::TrainConfig {
    fn run(&self) -> &RunOptions {
        &self.run
    }
    fn run_mut(&mut self) -> &mut RunOptions {
        &mut self.run
    }
    fn train_images(&self) -> usize {
        self.train_images
    }
    fn eval_images(&self) -> usize {
        self.eval_images
    }
    fn no_evaluation(&mut self) {
        self.eval_images = 0;
    }
    fn layers(&self, h: usize, _w: usize) -> Vec<crate::accounting::LayerCount> {
        crate::accounting::layers(&self.model, h)
    }
    fn describe(&self) -> Vec<(&'static str, serde_json::Value)> {
        use serde_json::json;
        vec![
            ("training images", json!(self.train_images)),
            ("held-out images", json!(self.eval_images)),
            (
                "learning rate",
                json!(format!(
                    "{} per 256 images × batch / 256, linear warm-up over {} steps, cosine decay",
                    self.base_lr_per_256, self.run.warmup_steps
                )),
            ),
            ("label smoothing", json!(self.label_smoothing)),
        ]
    }
}

/// A described network: the classifier's data and schedule, its own layers.
impl Workload for crate::train::GraphTask {
    fn run(&self) -> &RunOptions {
        &self.classify.run
    }
    fn run_mut(&mut self) -> &mut RunOptions {
        &mut self.classify.run
    }
    fn train_images(&self) -> usize {
        self.classify.train_images
    }
    fn eval_images(&self) -> usize {
        self.classify.eval_images
    }
    fn no_evaluation(&mut self) {
        self.classify.eval_images = 0;
    }
    fn layers(&self, h: usize, w: usize) -> Vec<crate::accounting::LayerCount> {
        self.net.layers(h, w).unwrap_or_default()
    }
    fn describe(&self) -> Vec<(&'static str, serde_json::Value)> {
        let mut d = self.classify.describe();
        d.push((
            "network",
            serde_json::to_value(&self.net).unwrap_or_default(),
        ));
        d
    }
}

impl Workload for crate::ewa::EwaConfig {
    fn run(&self) -> &RunOptions {
        &self.run
    }
    fn run_mut(&mut self) -> &mut RunOptions {
        &mut self.run
    }
    fn train_images(&self) -> usize {
        self.train.len()
    }
    fn eval_images(&self) -> usize {
        self.eval.len()
    }
    fn no_evaluation(&mut self) {
        self.eval = self.eval.end..self.eval.end;
    }
    fn layers(&self, h: usize, w: usize) -> Vec<crate::accounting::LayerCount> {
        crate::accounting::detector(&self.model, h, w)
    }
    fn describe(&self) -> Vec<(&'static str, serde_json::Value)> {
        use serde_json::json;
        let m = &self.model;
        vec![
            ("training images", json!(self.train.len())),
            ("held-out images", json!(self.eval.len())),
            (
                "learning rate",
                json!(format!(
                    "{} per 16 images × batch / 16, linear warm-up over {} steps, cosine decay",
                    self.base_lr_per_16, self.run.warmup_steps
                )),
            ),
            (
                "sampling",
                json!(format!(
                    "RPN {} anchors per image (half foreground at most), {} proposals after NMS; second stage {} regions per image (a quarter foreground at most)",
                    m.rpn_per_image, m.rpn_train.post_nms, m.roi_per_image
                )),
            ),
        ]
    }
}
