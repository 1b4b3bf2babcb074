//! What a device says of its run, beside the loop's own figures: the CUDA-graph choice and the
//! convolution searches. The GPU trainer (`gpu`) fills them; the CPU has neither. Plain data,
//! kept with the loop whose summary carries them, so that the loop needs nothing of the GPU.

/// Whether the GPU trainer launches its step as a CUDA graph (`--cuda-graph`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum GraphMode {
    /// Time steps both ways after warm-up and keep the faster.
    #[default]
    Auto,
    /// Capture after warm-up and keep the graph, whatever the timings.
    On,
    /// Enqueue every step call by call.
    Off,
}

impl GraphMode {
    pub fn name(self) -> &'static str {
        match self {
            GraphMode::Auto => "auto",
            GraphMode::On => "on",
            GraphMode::Off => "off",
        }
    }
}

/// What the run did with CUDA graphs, for `train --json` and the text summary.
#[derive(Clone, Debug, PartialEq)]
pub struct GraphReport {
    pub mode: GraphMode,
    /// Whether the run's steps ended as launches of the graph.
    pub used: bool,
    /// Median GPU seconds of a step enqueued call by call, over the trial (None: not timed).
    pub eager_step_s: Option<f64>,
    /// The same for a step launched as the graph.
    pub graph_step_s: Option<f64>,
    /// Steps that ran as a launch of the graph (the capture's included).
    pub graph_steps: usize,
    /// The choice and its figures, or why there was no graph.
    pub why: String,
    /// The steps of the run up to and including the trial (warm-up, the timed eager steps,
    /// the capture, the timed launches), once the choice was made: the steps after them all
    /// run one way, and a rate counted over them is the chosen way's. None: no choice was made
    /// (the run ended inside the trial, or its steps were never to be captured).
    pub settled_after: Option<usize>,
}

/// A run's convolution searches: its budget, the searches made (one a direction of a new
/// shape) and the seconds they took, and the plans that needed none (this run's choice for a
/// shape met again, or the algorithm cache's: the probe's or an earlier run's).
#[derive(Clone, Debug, PartialEq)]
pub struct SearchReport {
    pub budget_s: f64,
    pub searches: usize,
    pub seconds: f64,
    pub known_plans: usize,
}

impl SearchReport {
    pub fn describe(&self) -> String {
        format!(
            "{} cuDNN searches in {:.1} s of their {:.0} s budget; {} plans from this run's earlier choices or the algorithm cache",
            self.searches, self.seconds, self.budget_s, self.known_plans
        )
    }
}
