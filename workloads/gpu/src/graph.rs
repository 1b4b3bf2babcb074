//! The ResNet step as a CUDA graph: after warm-up the step's whole device work (forward, loss,
//! backward, update) is captured once and then launched as one graph per step, where the host
//! would otherwise enqueue about a thousand kernels and library calls one by one.
//!
//! What makes the step capturable: its inputs (the batch, the labels) and its scalars (the
//! learning rate, the loss scale) are written by the host into buffers the step keeps, before
//! each launch and outside the graph; the readout it leaves for the host is read after it; its
//! buffers come from the pool, which hands out during the capture only what it already holds
//! (the warm-up fills it); cuBLAS has a workspace of its own; cuDNN's algorithms were measured
//! before. Where the loop does not allow it the step is enqueued as before, and the report
//! says why: batch norm's sums or the gradients crossing ranks (a wait on the host, or NCCL on
//! a second stream: not captured here), the timeline timing every layer (`place`), a batch of
//! another size than the captured one (an epoch's last), or a capture the driver refused.
//!
//! Whether the graph pays is measured, not assumed: in `auto` (the default), after warm-up
//! [`TRIAL_STEPS`] steps are timed on the GPU enqueued call by call, then as many launched as
//! the graph, and the faster is kept ([`Policy`]; `train --json` reports both figures).

pub use roofline_models::train::{GraphMode, GraphReport};

/// Steps timed each way before the choice.
pub const TRIAL_STEPS: usize = 3;

/// How the next step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Plan {
    /// Enqueued call by call; `timed`: its GPU time is one of the trial's.
    Eager { timed: bool },
    /// Captured into the graph, which is then launched for this step.
    Capture,
    /// The captured graph launched; `timed` as for `Eager`.
    Replay { timed: bool },
}

impl Plan {
    pub fn timed(self) -> bool {
        matches!(
            self,
            Plan::Eager { timed: true } | Plan::Replay { timed: true }
        )
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Phase {
    /// Until a step (the second or later) makes no device allocation.
    WarmUp,
    /// Timing steps enqueued call by call.
    TimingEager,
    /// Captured; timing the graph's launches.
    TimingGraph,
    /// The graph kept.
    Kept,
    /// Eager kept (the graph was slower, or could not be made).
    Eager,
}

/// The choice between a graph and the eager step, step by step (no GPU in it: the trainer
/// asks it for each step's [`Plan`] and tells it how the step went).
#[derive(Clone, Debug)]
pub struct Policy {
    mode: GraphMode,
    trial: usize,
    /// Why this run's steps can never be captured.
    barred: Option<String>,
    phase: Phase,
    steps: usize,
    /// The rows of the trial's and the captured step (set by the step that ended warm-up: a
    /// batch of another size runs eagerly, untimed).
    rows: Option<usize>,
    /// The rows of the step last planned.
    last_rows: usize,
    eager_s: Vec<f64>,
    graph_s: Vec<f64>,
    graph_steps: usize,
    /// Steps left eager because the timeline timed their layers.
    timeline_steps: usize,
    /// Why the graph was not kept (a failed capture, or the timings).
    why: Option<String>,
    /// The steps planned when the choice was made.
    settled_after: Option<usize>,
}

fn median(v: &[f64]) -> Option<f64> {
    let mut s: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    if s.is_empty() {
        return None;
    }
    s.sort_by(f64::total_cmp);
    let m = s.len() / 2;
    Some(if s.len() % 2 == 1 {
        s[m]
    } else {
        0.5 * (s[m - 1] + s[m])
    })
}

impl Policy {
    /// `mode`, with `barred` saying why this run's steps cannot be captured at all (None: they
    /// can), timing `trial` steps each way.
    pub fn new(mode: GraphMode, barred: Option<String>, trial: usize) -> Policy {
        Policy {
            mode,
            trial: trial.max(1),
            barred,
            phase: Phase::WarmUp,
            steps: 0,
            rows: None,
            last_rows: 0,
            eager_s: Vec::new(),
            graph_s: Vec::new(),
            graph_steps: 0,
            timeline_steps: 0,
            why: None,
            settled_after: None,
        }
    }

    /// How the next step, of `rows` rows, runs; `timeline`: the timeline times its layers.
    pub fn plan(&mut self, rows: usize, timeline: bool) -> Plan {
        let eager = Plan::Eager { timed: false };
        if self.mode == GraphMode::Off || self.barred.is_some() {
            return eager;
        }
        if timeline {
            self.timeline_steps += 1;
            return eager;
        }
        self.last_rows = rows;
        if self.rows.is_some_and(|r| r != rows) {
            return eager;
        }
        match self.phase {
            Phase::WarmUp | Phase::Eager => eager,
            Phase::TimingEager if self.eager_s.len() < self.trial => Plan::Eager { timed: true },
            Phase::TimingEager => Plan::Capture,
            Phase::TimingGraph => Plan::Replay { timed: true },
            Phase::Kept => Plan::Replay { timed: false },
        }
    }

    /// The step planned as `plan` ended: the device allocations it made and, when timed, its
    /// GPU seconds.
    pub fn done(&mut self, plan: Plan, allocations: u64, seconds: Option<f64>) {
        self.steps += 1;
        match plan {
            Plan::Eager { timed } => {
                if self.phase == Phase::WarmUp && self.steps >= 2 && allocations == 0 {
                    self.phase = Phase::TimingEager;
                    self.rows = Some(self.last_rows);
                }
                if timed && self.phase == Phase::TimingEager {
                    self.eager_s.extend(seconds);
                }
            }
            Plan::Capture => {
                self.graph_steps += 1;
                if self.phase == Phase::TimingEager {
                    self.phase = Phase::TimingGraph;
                }
            }
            Plan::Replay { timed } => {
                self.graph_steps += 1;
                if timed && self.phase == Phase::TimingGraph {
                    self.graph_s.extend(seconds);
                    if self.graph_s.len() >= self.trial {
                        self.decide();
                    }
                }
            }
        }
    }

    /// The capture failed (`why`): every later step runs eagerly.
    pub fn failed(&mut self, why: String) {
        self.phase = Phase::Eager;
        self.rows = None;
        self.why = Some(format!("the capture failed: {why}"));
        // The failed capture's step is the trial's last.
        self.settled_after = Some(self.steps + 1);
    }

    /// Whether the trainer should keep its captured graph (false once eager was chosen).
    pub fn keeps_graph(&self) -> bool {
        matches!(self.phase, Phase::TimingGraph | Phase::Kept)
    }

    fn decide(&mut self) {
        self.settled_after = Some(self.steps);
        let (e, g) = (median(&self.eager_s), median(&self.graph_s));
        let faster = match (e, g) {
            (Some(e), Some(g)) => g < e,
            _ => true,
        };
        if self.mode == GraphMode::On || faster {
            self.phase = Phase::Kept;
        } else {
            self.phase = Phase::Eager;
            self.rows = None;
            self.why = Some("slower than the step enqueued call by call".into());
        }
    }

    pub fn report(&self) -> GraphReport {
        let (e, g) = (median(&self.eager_s), median(&self.graph_s));
        let ms = |s: Option<f64>| s.map_or("-".into(), |s| format!("{:.2} ms", 1e3 * s));
        let figures = format!(
            "a step {} launched as a graph, {} enqueued call by call",
            ms(g),
            ms(e)
        );
        let why = if self.mode == GraphMode::Off {
            "--cuda-graph off".to_string()
        } else if let Some(b) = &self.barred {
            b.clone()
        } else {
            match (self.phase, &self.why) {
                (Phase::Kept, _) if self.mode == GraphMode::On => {
                    format!("kept (--cuda-graph on): {figures}")
                }
                (Phase::Kept, _) => format!("kept, the faster: {figures}"),
                (Phase::TimingGraph, _) => format!("captured, the trial unfinished: {figures}"),
                (Phase::Eager, Some(w)) if w.starts_with("the capture") => w.clone(),
                (Phase::Eager, Some(w)) => format!("not kept, {w}: {figures}"),
                _ if self.timeline_steps > 0 && self.timeline_steps >= self.steps => {
                    "not captured: the timeline times every layer of every step (place)".into()
                }
                _ => format!(
                    "not captured: the run ended before warm-up and {} timed steps ({} steps)",
                    self.trial, self.steps
                ),
            }
        };
        GraphReport {
            mode: self.mode,
            used: self.phase == Phase::Kept
                || (self.phase == Phase::TimingGraph && self.graph_steps > 0),
            eager_step_s: e,
            graph_step_s: g,
            graph_steps: self.graph_steps,
            why,
            settled_after: self.settled_after,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `policy` over `steps` steps of `rows(i)` rows, the first two allocating, eager steps
    /// taking `eager_s` and launches `graph_s`; the plans it made.
    fn run(
        policy: &mut Policy,
        steps: usize,
        rows: impl Fn(usize) -> usize,
        (eager_s, graph_s): (f64, f64),
    ) -> Vec<Plan> {
        (0..steps)
            .map(|i| {
                let plan = policy.plan(rows(i), false);
                let allocations = if i < 2 { 5 } else { 0 };
                let s = match plan {
                    Plan::Eager { .. } => eager_s,
                    _ => graph_s,
                };
                policy.done(plan, allocations, plan.timed().then_some(s));
                plan
            })
            .collect()
    }

    const E: Plan = Plan::Eager { timed: false };
    const ET: Plan = Plan::Eager { timed: true };
    const RT: Plan = Plan::Replay { timed: true };
    const R: Plan = Plan::Replay { timed: false };

    #[test]
    fn auto_times_both_ways_after_warm_up_and_keeps_the_faster_graph() {
        let mut p = Policy::new(GraphMode::Auto, None, 2);
        let plans = run(&mut p, 10, |_| 32, (0.010, 0.008));
        // Steps 1–2 allocate; step 3 is the first without: warm. Then two timed eager
        // steps, the capture, two timed launches, and the graph from then on.
        assert_eq!(plans, [E, E, E, ET, ET, Plan::Capture, RT, RT, R, R]);
        let r = p.report();
        assert!(r.used, "{r:?}");
        assert_eq!((r.eager_step_s, r.graph_step_s), (Some(0.010), Some(0.008)));
        assert_eq!(r.graph_steps, 5);
        assert!(r.why.starts_with("kept, the faster"), "{}", r.why);
        // The choice was made at the end of step 8: steps 9 and 10 were all launches.
        assert_eq!(r.settled_after, Some(8));
    }

    #[test]
    fn auto_drops_a_slower_graph_and_on_keeps_it() {
        let mut p = Policy::new(GraphMode::Auto, None, 2);
        let plans = run(&mut p, 10, |_| 32, (0.010, 0.012));
        assert_eq!(&plans[5..], [Plan::Capture, RT, RT, E, E]);
        assert!(!p.keeps_graph());
        let r = p.report();
        assert!(!r.used && r.why.starts_with("not kept"), "{r:?}");
        let mut p = Policy::new(GraphMode::On, None, 2);
        let plans = run(&mut p, 10, |_| 32, (0.010, 0.012));
        assert_eq!(&plans[8..], [R, R]);
        assert!(p.report().used && p.report().why.contains("--cuda-graph on"));
    }

    #[test]
    fn a_batch_of_another_size_runs_eagerly_and_the_graph_stays() {
        let mut p = Policy::new(GraphMode::Auto, None, 1);
        // Every fourth batch is short (an epoch's last).
        let plans = run(
            &mut p,
            12,
            |i| if i % 4 == 3 { 20 } else { 32 },
            (0.010, 0.008),
        );
        for (i, plan) in plans.iter().enumerate() {
            if i % 4 == 3 {
                assert!(matches!(plan, Plan::Eager { .. }), "step {i}: {plan:?}");
            }
        }
        assert_eq!(&plans[4..7], [ET, Plan::Capture, RT]);
        assert_eq!(plans[10], R);
        assert!(p.report().used);
    }

    #[test]
    fn off_barred_timeline_and_failed_captures_run_eagerly_and_say_why() {
        let mut off = Policy::new(GraphMode::Off, None, 1);
        assert!(run(&mut off, 8, |_| 8, (1.0, 0.5)).iter().all(|p| *p == E));
        assert_eq!(off.report().why, "--cuda-graph off");
        let why = "batch norm's sums go through the host".to_string();
        let mut barred = Policy::new(GraphMode::On, Some(why.clone()), 1);
        assert!(run(&mut barred, 8, |_| 8, (1.0, 0.5))
            .iter()
            .all(|p| *p == E));
        assert_eq!(barred.report().why, why);
        let mut timeline = Policy::new(GraphMode::Auto, None, 1);
        for _ in 0..6 {
            let plan = timeline.plan(8, true);
            assert_eq!(plan, E);
            timeline.done(plan, 0, None);
        }
        assert!(
            timeline.report().why.contains("timeline"),
            "{:?}",
            timeline.report()
        );
        let mut failed = Policy::new(GraphMode::Auto, None, 1);
        let plans = run(&mut failed, 5, |_| 8, (1.0, 0.5));
        assert_eq!(plans[4], Plan::Capture);
        failed.failed("cuStreamEndCapture: CUDA_ERROR_STREAM_CAPTURE_INVALIDATED".into());
        assert!(run(&mut failed, 4, |_| 8, (1.0, 0.5))
            .iter()
            .all(|p| *p == E));
        let r = failed.report();
        assert!(!r.used && r.why.starts_with("the capture failed"), "{r:?}");
    }

    #[test]
    fn a_short_run_says_it_ended_before_the_trial() {
        let mut p = Policy::new(GraphMode::Auto, None, 3);
        run(&mut p, 3, |_| 8, (1.0, 0.5));
        let r = p.report();
        assert!(!r.used && r.why.contains("ended before"), "{r:?}");
        assert_eq!(r.settled_after, None);
        assert_eq!(median(&[3.0, 1.0, 2.0, 10.0]), Some(2.5));
        assert_eq!(median(&[]), None);
    }
}
