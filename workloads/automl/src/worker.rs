//! An AutoML worker: proposes its next candidate from the shared history (the search runs on
//! the worker, as AIPerf's does on its slaves) and trains what the master records; starts each
//! candidate from He initialisation (AIPerf's Table IV default), or with `--init` from the
//! pretrained file as AIPerf's reference does (every layer still ResNet-50's from the file,
//! the others from their own initialisation), or with `--from-parent` from its parent's
//! trained weights (the morphisms, function-preserving), and trains it
//! epoch by epoch in the one training loop (a checkpoint after every epoch, the next epoch
//! resumed from it) under AIPerf's per-trial rules (`rules`: early stopping on the validation
//! loss, the predicted accuracy, from round 4 a second training with a TPE draw), reporting
//! every finished epoch and a heartbeat a second to the master. A worker is a thread in the
//! master's process or a team of MPI ranks training data parallel (the team's root speaks for
//! it).

use crate::buffer::{Link, Tail};
use crate::propose::{self, History, Proposal};
use crate::rules::{self, Draw, EarlyStopping, Space};
use roofline_model::automl::{Epoch, Outcome};
use roofline_workloads::checkpoint::Checkpoint;
use roofline_workloads::data::Rng;
use roofline_workloads::gpu::GpuGraph;
use roofline_workloads::graph::morph::{self, Morphism, Weights};
use roofline_workloads::graph::Description;
use roofline_workloads::init::Pretrained;
use roofline_workloads::run::GpuRun;
use roofline_workloads::train::GraphTask;
use roofline_workloads::train::{train, Monitor, TrainConfig};
use serde::{Deserialize, Serialize};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A candidate to train, as the master hands it out.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Trial {
    pub id: usize,
    /// The parent's network and its trained weights (none for the starting network).
    pub parent: Option<(Description, PathBuf)>,
    pub morphisms: Vec<Morphism>,
    pub description: Description,
    pub batch: usize,
    pub kernel: usize,
    pub epochs: usize,
    pub patience: usize,
    /// From round 4: train once more with a draw from this space; the better training is the
    /// candidate.
    pub tune: Option<Space>,
    /// Where its weights go after every epoch.
    pub checkpoint: PathBuf,
    pub seed: u64,
    /// AIPerf operations per training image and per evaluation image.
    pub train_ops: f64,
    pub eval_ops: f64,
}

/// What a worker tells the master.
#[derive(Debug, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "event")]
pub enum Event {
    /// Its next candidate (none: the search found nothing the limits allow), its `seq`-th
    /// proposal; the search's seconds.
    Proposed {
        worker: usize,
        seq: usize,
        proposal: Option<Proposal>,
        search_seconds: f64,
    },
    /// It took trial `trial` from the buffer.
    Took { worker: usize, trial: usize },
    /// It is alive and stepping.
    Beat { worker: usize, trial: usize },
    Epoch {
        worker: usize,
        trial: usize,
        epoch: Epoch,
    },
    Done {
        worker: usize,
        trial: usize,
        outcome: Outcome,
        predicted: Option<f64>,
        train_seconds: f64,
        tuned: Option<Tuned>,
    },
}

/// The per-trial TPE's second training: what it drew and made, its best accuracy (the
/// predicted one when higher), and whether it beat the first.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Tuned {
    pub draw: Draw,
    pub description: Description,
    pub morphisms: Vec<Morphism>,
    pub best: Option<f64>,
    pub won: bool,
}

/// A fault made on purpose (tests): worker `worker`'s `trial`-th trial (0-based) stalls until
/// the run stops, or panics.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub enum Fault {
    Stall { worker: usize, trial: usize },
    Die { worker: usize, trial: usize },
}

/// What every worker trains with.
#[derive(Clone)]
pub struct Context {
    /// The data, schedule and evaluation every candidate trains with.
    pub classify: TrainConfig,
    /// What every candidate's weights start from.
    pub start: Start,
    pub fault: Option<Fault>,
    /// The GPU the worker trains on (None: the CPU, on its pool's cores).
    pub gpu: Option<GpuRun>,
}

/// The GPUs a run's worker threads train on: one a worker, in turn.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Gpus {
    /// Precision and CUDA-graph mode (its GPU left to [`Gpus::for_worker`]).
    pub run: GpuRun,
    /// GPUs on this node.
    pub count: usize,
}

impl Gpus {
    /// Worker `id`'s GPU (a worker started again after one died takes the next in turn).
    pub fn for_worker(&self, id: usize) -> GpuRun {
        GpuRun {
            gpu: Some(id % self.count.max(1)),
            ..self.run
        }
    }
}

/// What a candidate's weights start from.
#[derive(Clone)]
pub enum Start {
    /// He initialisation (normal, fan-out) from the trial's seed: AIPerf's Table IV default,
    /// "method in [21]".
    He,
    /// The parent's trained weights through the morphisms, which keep what the parent
    /// computes (`--from-parent`, Net2Net): neither Table IV's start nor the reference code's.
    Parent,
    /// `--init`'s pretrained ResNet-50, each layer a candidate still has from it: the
    /// reference code's start.
    Pretrained(Arc<Pretrained>),
}

impl Start {
    /// The start of a run with `init` (`--init`'s file) or `from_parent`, He's otherwise.
    pub fn new(init: Option<Arc<Pretrained>>, from_parent: bool) -> Start {
        match (init, from_parent) {
            (Some(p), _) => Start::Pretrained(p),
            (None, true) => Start::Parent,
            (None, false) => Start::He,
        }
    }

    pub fn pretrained(&self) -> Option<&Pretrained> {
        match self {
            Start::Pretrained(p) => Some(p),
            _ => None,
        }
    }

    /// As automl.json's configuration names it (`weights`).
    pub fn name(&self) -> &'static str {
        match self {
            Start::He => "he",
            Start::Parent => "parent",
            Start::Pretrained(_) => "pretrained",
        }
    }
}

impl Context {
    /// The candidates' training settings, and their start: the pretrained file `--init` gave
    /// the run (taken out of the settings: a candidate's layers take it by name,
    /// [`Pretrained::into_graph`], not as ResNet's training run takes it), or the parent's
    /// weights with `from_parent`, or He's initialisation.
    pub fn new(
        classify: &TrainConfig,
        from_parent: bool,
        fault: Option<Fault>,
        gpu: Option<GpuRun>,
    ) -> Context {
        let mut classify = classify.clone();
        let start = Start::new(classify.run.init.take(), from_parent);
        Context {
            classify,
            start,
            fault,
            gpu,
        }
    }
}

/// Sends a heartbeat at most every second.
struct Beats<'a> {
    link: &'a Link,
    worker: usize,
    trial: usize,
    last: Mutex<Instant>,
}

impl Monitor for Beats<'_> {
    fn step(&self, _: usize, _: usize, _: f64, _: f64) {
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if last.elapsed() >= Duration::from_secs(1) {
            *last = Instant::now();
            self.link.send(&Event::Beat {
                worker: self.worker,
                trial: self.trial,
            });
        }
    }
}

/// A worker's search: the plan (read once), its own generator, and the history as far as it
/// has read the master's log.
struct Searcher {
    worker: usize,
    plan: Option<propose::Plan>,
    rng: Rng,
    log: Tail,
    history: History,
}

impl Searcher {
    /// The next proposal from the history as the master has logged it, and the seconds it
    /// took.
    fn next(&mut self, link: &Link) -> Result<(Option<Proposal>, f64), String> {
        let t0 = Instant::now();
        if self.plan.is_none() {
            let Some(p) = link.plan()? else {
                return Ok((None, 0.0));
            };
            self.rng =
                Rng::new(p.seed ^ 0xA1_9E4F ^ (self.worker as u64).wrapping_mul(0x9E37_79B9));
            self.plan = Some(p);
        }
        let path = link.history_log();
        for line in self.log.lines(&path)? {
            let c = serde_json::from_slice(&line)
                .map_err(|e| format!("the history {}: {e}", path.display()))?;
            self.history.update(c)?;
        }
        let plan = self.plan.as_ref().expect("read above");
        let found = propose::propose(&self.history, plan, &mut self.rng);
        Ok((found, t0.elapsed().as_secs_f64()))
    }
}

/// The worker's loop (on `pool`'s cores when given) until the run stops or the buffer fails.
pub fn work(
    worker: usize,
    link: &Link,
    cx: &Context,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), String> {
    let mut taken = 0;
    // The plan is read once; the history before every proposal.
    let mut searcher = Searcher {
        worker,
        plan: None,
        rng: Rng::new(0),
        log: Tail::default(),
        history: History::default(),
    };
    let mut propose = || match pool {
        Some(p) => p.install(|| searcher.next(link)),
        None => searcher.next(link),
    };
    while let Some(trial) = link.take(&mut propose)? {
        link.send(&Event::Took {
            worker,
            trial: trial.id,
        });
        let fault = cx.fault.filter(|f| match *f {
            Fault::Stall { worker: w, trial } | Fault::Die { worker: w, trial } => {
                w == worker && trial == taken
            }
        });
        taken += 1;
        let t0 = Instant::now();
        let run = || run_trial(worker, &trial, link, cx, fault);
        let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| match pool {
            Some(p) => p.install(run),
            None => run(),
        }));
        let (outcome, predicted, tuned) = match result {
            Ok(Ok(done)) => done,
            Ok(Err(why)) => (Outcome::Failed { why }, None, None),
            Err(p) => {
                let why = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_else(|| "panicked".into());
                (
                    Outcome::Failed {
                        why: format!("the worker died: {why}"),
                    },
                    None,
                    None,
                )
            }
        };
        link.send(&Event::Done {
            worker,
            trial: trial.id,
            outcome,
            predicted,
            train_seconds: t0.elapsed().as_secs_f64(),
            tuned,
        });
    }
    Ok(())
}

/// The candidate's starting weights: none for He's initialisation (the network's own, from
/// the trial's seed), the pretrained file's where `--init` gave one, or the parent's trained
/// ones through the morphisms.
pub(super) fn start_from(
    trial: &Trial,
    cx: &Context,
    side: usize,
) -> Result<Option<Arc<Checkpoint>>, String> {
    match &cx.start {
        Start::He => Ok(None),
        Start::Pretrained(p) => {
            let (c, _) = p
                .into_graph(&trial.description, side, trial.seed)
                .map_err(|e| e.to_string())?;
            Ok(Some(Arc::new(c)))
        }
        Start::Parent => inherit(trial, side),
    }
}

/// The child's starting weights: the parent's trained ones through the morphisms.
fn inherit(trial: &Trial, side: usize) -> Result<Option<Arc<Checkpoint>>, String> {
    let Some((parent, path)) = &trial.parent else {
        return Ok(None);
    };
    let c = Checkpoint::load(path).map_err(|e| format!("the parent's weights: {e}"))?;
    let mut net = parent.clone();
    let mut w = Weights::from_checkpoint(&c, net.nodes.len()).map_err(|e| e.to_string())?;
    for (k, &m) in trial.morphisms.iter().enumerate() {
        let seed = trial.seed.wrapping_add(k as u64);
        (net, w) = morph::apply(&net, &w, m, (side, side), seed).map_err(|e| e.to_string())?;
    }
    if net != trial.description {
        return Err("the morphisms do not make the network the master described".into());
    }
    Ok(Some(Arc::new(w.to_checkpoint())))
}

/// What one training of a trial came to.
struct Pass {
    outcome: Outcome,
    /// The best top-1 observed, and AIPerf's prediction.
    best: Option<f64>,
    predicted: Option<f64>,
}

impl Pass {
    /// What the reference compares the trainings by: the prediction when higher.
    fn value(&self) -> Option<f64> {
        match (self.best, self.predicted) {
            (Some(b), Some(p)) => Some(b.max(p)),
            (b, p) => b.or(p),
        }
    }
}

/// Trains `trial`, and from round 4 once more with a TPE draw; the outcome, the predicted
/// accuracy and the second training's record.
fn run_trial(
    worker: usize,
    trial: &Trial,
    link: &Link,
    cx: &Context,
    fault: Option<Fault>,
) -> Result<(Outcome, Option<f64>, Option<Tuned>), String> {
    let first = train_pass(worker, trial, 0, link, cx, fault)?;
    let Some(space) = &trial.tune else {
        return Ok((first.outcome, first.predicted, None));
    };
    if first.outcome == Outcome::Cut {
        return Ok((first.outcome, first.predicted, None));
    }
    let side = cx.classify.data.resolution();
    let draw = rules::draw(space, 1, &mut Rng::new(trial.seed ^ 0x7E_5EED));
    let second = retuned(trial, draw, side, matches!(cx.start, Start::Parent))?;
    let pass = train_pass(worker, &second, 1, link, cx, None)?;
    let won =
        pass.value().unwrap_or(f64::NEG_INFINITY) > first.value().unwrap_or(f64::NEG_INFINITY);
    if won {
        // The candidate's weights are the better training's (children inherit them).
        std::fs::rename(&second.checkpoint, &trial.checkpoint).map_err(|e| {
            format!(
                "cannot keep the second training's weights {}: {e}",
                second.checkpoint.display()
            )
        })?;
    } else {
        let _ = std::fs::remove_file(&second.checkpoint);
    }
    let tuned = Tuned {
        draw,
        description: second.description.clone(),
        morphisms: second.morphisms.clone(),
        best: pass.value(),
        won,
    };
    let (outcome, predicted) = if won {
        (pass.outcome, pass.predicted)
    } else {
        (first.outcome, first.predicted)
    };
    Ok((outcome, predicted, Some(tuned)))
}

/// The trial with the draw's batch, and its deeper layers with the draw's kernel (the
/// reference sets the kernel of the layers the search added); its own checkpoint and ops.
/// `inherits`: the child is made from its parent's weights (else only its description: it
/// starts from He's initialisation or the pretrained file).
fn retuned(trial: &Trial, draw: Draw, side: usize, inherits: bool) -> Result<Trial, String> {
    let mut t = trial.clone();
    t.batch = draw.batch.max(1);
    t.kernel = draw.kernel;
    t.tune = None;
    t.checkpoint = trial.checkpoint.with_extension("tpe.safetensors");
    if let Some((parent, path)) = &trial.parent {
        let mut net = parent.clone();
        t.morphisms = trial
            .morphisms
            .iter()
            .map(|&m| match m {
                Morphism::Deeper { after, .. } => Morphism::Deeper {
                    after,
                    kernel: draw.kernel,
                },
                m => m,
            })
            .collect();
        if inherits {
            let c = Checkpoint::load(path).map_err(|e| format!("the parent's weights: {e}"))?;
            let mut w = Weights::from_checkpoint(&c, net.nodes.len()).map_err(|e| e.to_string())?;
            for (k, &m) in t.morphisms.iter().enumerate() {
                let seed = t.seed.wrapping_add(k as u64);
                (net, w) =
                    morph::apply(&net, &w, m, (side, side), seed).map_err(|e| e.to_string())?;
            }
        } else {
            for &m in &t.morphisms {
                net = morph::child(&net, m, (side, side)).map_err(|e| e.to_string())?;
            }
        }
        let layers = net.layers(side, side).map_err(|e| e.to_string())?;
        let ops = roofline_workloads::accounting::aiperf(&layers);
        (t.train_ops, t.eval_ops) = (ops.total(), ops.forward);
        t.description = net;
    }
    Ok(t)
}

/// Trains `trial` epoch by epoch (training `pass` of the candidate) under AIPerf's early
/// stopping; the outcome, the best accuracy and the prediction.
fn train_pass(
    worker: usize,
    trial: &Trial,
    pass: usize,
    link: &Link,
    cx: &Context,
    fault: Option<Fault>,
) -> Result<Pass, String> {
    let cut = Pass {
        outcome: Outcome::Cut,
        best: None,
        predicted: None,
    };
    let side = cx.classify.data.resolution();
    let mut classify = cx.classify.clone();
    let images = classify.train_images.max(1);
    let per_epoch = (images / trial.batch).max(1);
    let steps = per_epoch * trial.epochs;
    classify.run = roofline_workloads::run::RunOptions {
        warmup_steps: per_epoch.min(steps / 10),
        eval_every: per_epoch,
        checkpoint: Some(trial.checkpoint.clone()),
        stop: Some(Arc::clone(&link.stop)),
        comm: classify.run.comm,
        ..roofline_workloads::run::RunOptions::new(trial.batch, steps, trial.seed)
    };
    let mut task =
        GraphTask::new(trial.description.clone(), classify).map_err(|e| e.to_string())?;
    task.init = start_from(trial, cx, side)?;
    let beats = Beats {
        link,
        worker,
        trial: trial.id,
        last: Mutex::new(Instant::now()),
    };
    let mut curve: Vec<(f64, f64)> = Vec::new();
    let mut stopping = EarlyStopping::new(trial.patience);
    let done = |outcome: Outcome, curve: &[(f64, f64)]| Pass {
        outcome,
        best: curve.iter().map(|p| p.1).reduce(f64::max),
        predicted: rules::predicted(trial.epochs, curve),
    };
    for e in 0..trial.epochs {
        // Alone a worker sees the stop itself; a team learns it inside the loop (all its ranks
        // stop after the same step).
        if link.team().is_none() && link.stop.load(Ordering::SeqCst) {
            return Ok(cut);
        }
        match fault {
            Some(Fault::Stall { .. }) if e == 0 => {
                while !link.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return Ok(cut);
            }
            Some(Fault::Die { .. }) => panic!("fault injected into worker {worker}"),
            _ => {}
        }
        let t0 = Instant::now();
        task.classify.run.stop_at = Some((e + 1) * per_epoch);
        task.classify.run.resume = (e > 0).then(|| trial.checkpoint.clone());
        let s = match &cx.gpu {
            None => train::<f32, _>(&task, &beats, link.team()).map_err(|e| e.to_string())?,
            Some(g) => {
                g.train::<GpuGraph, _>(&task, &beats, link.team())
                    .map_err(|e| e.to_string())?
                    .0
            }
        };
        // The root wrote the checkpoint the next epoch resumes from: the team waits for it.
        link.team_barrier();
        if s.steps < (e + 1) * per_epoch || s.evals.is_empty() {
            // The budget ended the epoch part-way: it does not count.
            return Ok(Pass {
                outcome: Outcome::Cut,
                ..done(Outcome::Cut, &curve)
            });
        }
        let ev = s.evals.last().expect("checked");
        let epoch = Epoch {
            epoch: e + 1,
            top1: ev.top1,
            loss: ev.loss,
            seconds: t0.elapsed().as_secs_f64(),
            ops: roofline_model::automl::epoch_ops(
                trial.train_ops,
                trial.eval_ops,
                per_epoch * trial.batch,
                task.classify.eval_images,
                task.classify.train_images,
            ),
            // The master stamps its own clock when it hears of the epoch.
            at_s: 0.0,
            pass,
        };
        curve.push(((e + 1) as f64, ev.top1));
        link.send(&Event::Epoch {
            worker,
            trial: trial.id,
            epoch,
        });
        if stopping.stop(ev.loss) && e + 1 < trial.epochs {
            return Ok(done(Outcome::EarlyStopped, &curve));
        }
    }
    Ok(done(Outcome::Trained, &curve))
}
