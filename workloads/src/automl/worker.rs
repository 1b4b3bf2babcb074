//! An AutoML worker: takes trials from the shared buffer, makes each child from its parent's
//! trained weights (the morphisms, function-preserving), and trains it epoch by epoch in the
//! one training loop (a checkpoint after every epoch, the next epoch resumed from it), with
//! early stopping, reporting every finished epoch and a heartbeat a second to the master. A
//! worker is a thread in the master's process or a team of MPI ranks training data parallel
//! (the team's root speaks for it).

use super::buffer::Link;
use super::morph::{self, Morphism, Weights};
use super::tpe;
use crate::checkpoint::Checkpoint;
use crate::graph::{Description, GraphTask};
use crate::train::{train, Monitor, TrainConfig};
use roofline_model::automl::{Epoch, Outcome};
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
    /// The epochs the final round trains (the warm-up's prediction is for them).
    pub final_epochs: usize,
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
    },
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
    pub fault: Option<Fault>,
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

/// The worker's loop (on `pool`'s cores when given) until the run stops or the buffer fails.
pub fn work(
    worker: usize,
    link: &Link,
    cx: &Context,
    pool: Option<&rayon::ThreadPool>,
) -> Result<(), String> {
    let mut taken = 0;
    while let Some(trial) = link.take()? {
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
        let (outcome, predicted) = match result {
            Ok(Ok(done)) => done,
            Ok(Err(why)) => (Outcome::Failed { why }, None),
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
                )
            }
        };
        link.send(&Event::Done {
            worker,
            trial: trial.id,
            outcome,
            predicted,
            train_seconds: t0.elapsed().as_secs_f64(),
        });
    }
    Ok(())
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

/// Trains `trial` epoch by epoch; the outcome and, in warm-up, the predicted final accuracy.
fn run_trial(
    worker: usize,
    trial: &Trial,
    link: &Link,
    cx: &Context,
    fault: Option<Fault>,
) -> Result<(Outcome, Option<f64>), String> {
    let side = cx.classify.data.resolution();
    let mut classify = cx.classify.clone();
    let images = classify.train_images.max(1);
    let per_epoch = (images / trial.batch).max(1);
    let steps = per_epoch * trial.epochs;
    classify.run = crate::run::RunOptions {
        warmup_steps: per_epoch.min(steps / 10),
        eval_every: per_epoch,
        checkpoint: Some(trial.checkpoint.clone()),
        stop: Some(Arc::clone(&link.stop)),
        comm: classify.run.comm,
        ..crate::run::RunOptions::new(trial.batch, steps, trial.seed)
    };
    let mut task =
        GraphTask::new(trial.description.clone(), classify).map_err(|e| e.to_string())?;
    task.init = inherit(trial, side)?;
    let beats = Beats {
        link,
        worker,
        trial: trial.id,
        last: Mutex::new(Instant::now()),
    };
    let mut curve: Vec<(f64, f64)> = Vec::new();
    let (mut best, mut since_best) = (f64::NEG_INFINITY, 0);
    for e in 0..trial.epochs {
        // Alone a worker sees the stop itself; a team learns it inside the loop (all its ranks
        // stop after the same step).
        if link.team().is_none() && link.stop.load(Ordering::SeqCst) {
            return Ok((Outcome::Cut, None));
        }
        match fault {
            Some(Fault::Stall { .. }) if e == 0 => {
                while !link.stop.load(Ordering::SeqCst) {
                    std::thread::sleep(Duration::from_millis(50));
                }
                return Ok((Outcome::Cut, None));
            }
            Some(Fault::Die { .. }) => panic!("fault injected into worker {worker}"),
            _ => {}
        }
        let t0 = Instant::now();
        task.classify.run.stop_at = Some((e + 1) * per_epoch);
        task.classify.run.resume = (e > 0).then(|| trial.checkpoint.clone());
        let s = train::<f32, _>(&task, &beats, link.team()).map_err(|e| e.to_string())?;
        // The root wrote the checkpoint the next epoch resumes from: the team waits for it.
        link.team_barrier();
        if s.steps < (e + 1) * per_epoch || s.evals.is_empty() {
            // The budget ended the epoch part-way: it does not count.
            return Ok((Outcome::Cut, None));
        }
        let ev = s.evals.last().expect("checked");
        let epoch = Epoch {
            epoch: e + 1,
            top1: ev.top1,
            loss: ev.loss,
            seconds: t0.elapsed().as_secs_f64(),
            ops: (per_epoch * trial.batch) as f64 * trial.train_ops
                + task.classify.eval_images as f64 * trial.eval_ops,
            // The master stamps its own clock when it hears of the epoch.
            at_s: 0.0,
        };
        curve.push(((e + 1) as f64, ev.top1));
        link.send(&Event::Epoch {
            worker,
            trial: trial.id,
            epoch,
        });
        if ev.top1 > best {
            (best, since_best) = (ev.top1, 0);
        } else {
            since_best += 1;
            if since_best >= trial.patience && e + 1 < trial.epochs {
                return Ok((Outcome::EarlyStopped, predicted(&curve, trial, best)));
            }
        }
    }
    Ok((Outcome::Trained, predicted(&curve, trial, best)))
}

/// The warm-up's prediction of the final round's accuracy, when it exceeds the best observed.
fn predicted(curve: &[(f64, f64)], trial: &Trial, best: f64) -> Option<f64> {
    if trial.epochs >= trial.final_epochs {
        return None;
    }
    tpe::predict(curve, trial.final_epochs as f64).filter(|&p| p > best)
}
