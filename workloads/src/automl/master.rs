//! The AutoML master: generates candidates (the search), hands them out through the shared
//! buffer, follows the workers (heartbeats, a watchdog that ends a stalled trial and gives its
//! candidate to another worker), samples the FLOPS time series and rewrites `automl.json`
//! after every finished epoch.

use super::buffer::{self, Folder, Link};
use super::morph::{Limits, Morphism};
use super::search::{self, Gp, Signature, Trained};
use super::worker::{self, Context, Event, Fault, Trial};
use super::{tally, tpe};
use crate::accounting;
use crate::data::Rng;
use crate::graph::Description;
use crate::run::RunError;
use crate::train::TrainConfig;
use roofline_model::automl::{Automl, AutomlScore, Candidate, Ops, Outcome, Worker, AUTOML_SCHEMA};
use roofline_model::Provenance;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Where the workers are.
#[derive(Clone, Debug, PartialEq)]
pub enum Workers {
    /// Threads of this process, each on its CPUs.
    Threads(Vec<Vec<usize>>),
    /// Teams of MPI ranks (this many), started beside the master.
    Teams(usize),
}

impl Workers {
    pub fn count(&self) -> usize {
        match self {
            Workers::Threads(t) => t.len(),
            Workers::Teams(n) => *n,
        }
    }
}

/// Everything a run is told.
#[derive(Clone, Debug)]
pub struct Settings {
    /// The data, evaluation and learning-rate rule every candidate trains with.
    pub classify: TrainConfig,
    /// The network the search starts from.
    pub start: Description,
    /// Epochs of each round (AIPerf's code: 15, 30, 45, then 60); the last repeats. The
    /// rounds before the last are the warm-up: children keep their parent's hyper-parameters
    /// and their accuracy is predicted from the curve.
    pub rounds: Vec<usize>,
    pub budget: Duration,
    pub workers: Workers,
    /// The starting batch and kernel, and the choices TPE picks among after warm-up.
    pub batch: usize,
    pub kernel: usize,
    pub batches: Vec<usize>,
    pub kernels: Vec<usize>,
    pub limits: Limits,
    /// Children sampled per morphism step (8).
    pub neighbours: usize,
    /// The time series' interval (AIPerf: 0.1 hour).
    pub sample_every: Duration,
    /// A trial that sends nothing (no step) for this long is ended.
    pub stall: Duration,
    /// automl.json; the candidates' weights go beside it in `<stem>.weights/`.
    pub out: PathBuf,
    pub seed: u64,
    /// ImageNet at 224² (AIPerf's rules).
    pub imagenet_224: bool,
    /// The caller's settings, recorded with the run's.
    pub configuration: serde_json::Map<String, serde_json::Value>,
    pub provenance: Provenance,
    /// A previous run to go on from.
    pub resume: Option<Automl>,
    pub fault: Option<Fault>,
}

/// What the master tells the user as it goes.
pub trait Progress {
    fn line(&self, line: &str);
}

/// Half the observations the GP holds at most.
const GP_HALF: usize = 32;

/// The `half` most accurate and the `half` latest of `(id, accuracy)`, each once.
fn best_and_latest(mut v: Vec<(usize, f64)>, half: usize) -> Vec<(usize, f64)> {
    if v.len() <= 2 * half {
        return v;
    }
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut keep: Vec<(usize, f64)> = v[..half].to_vec();
    let mut rest = v[half..].to_vec();
    rest.sort_by_key(|x| std::cmp::Reverse(x.0));
    keep.extend(rest.into_iter().take(half));
    keep
}

/// The shared buffer's folder (in the weights' folder).
pub fn buffer_dir(out: &Path) -> Folder {
    Folder(weights_dir(out).join("buffer"))
}

/// The folder of candidates' weights beside `out`.
pub fn weights_dir(out: &Path) -> PathBuf {
    let stem = out
        .file_stem()
        .map_or("automl".into(), |s| s.to_string_lossy().into_owned());
    out.with_file_name(format!("{stem}.weights"))
}

struct Run<'a> {
    s: &'a Settings,
    doc: Automl,
    nets: Vec<Description>,
    morphs: Vec<Vec<Morphism>>,
    /// Trials in the buffer, not yet taken.
    pending: BTreeMap<usize, Trial>,
    /// Taken trials: worker and last sign of life.
    running: BTreeMap<usize, (usize, Instant)>,
    next_id: usize,
    handed: usize,
    /// Seconds spent in the search (`generate`), before this run's resume included.
    search_s: f64,
    rng: Rng,
    buffer: buffer::Master,
    cx: Context,
    start: Instant,
    last_sample: Instant,
}

/// Runs the search until the budget is spent (or `cancel` is set); the document as written.
/// The shared buffer (`buffer_dir`) must have been created fresh (`Folder::create`).
pub fn automl(
    s: &Settings,
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<Automl, RunError> {
    let input = |m: String| RunError::Input(m);
    let side = s.classify.data.resolution();
    s.start
        .shapes(side, side)
        .map_err(|e| input(format!("the starting network: {e}")))?;
    if s.workers.count() == 0 || s.rounds.is_empty() || s.rounds.contains(&0) {
        return Err(input(
            "automl needs a worker and rounds of at least one epoch".into(),
        ));
    }
    let resumed = s.resume.as_ref().map_or(0.0, |d| d.score.elapsed_s);
    let start = Instant::now() - Duration::from_secs_f64(resumed);
    let folder = buffer_dir(&s.out);
    let mut run = Run::new(s, buffer::Master::new(folder), start)?;
    match &s.workers {
        Workers::Threads(cpus) => {
            for c in cpus {
                run.spawn(c)?;
            }
        }
        Workers::Teams(n) => {
            for _ in 0..*n {
                run.add_worker();
            }
        }
    }
    let result = run.drive(progress, cancel);
    // Ends the workers' loops.
    run.buffer.stop();
    let doc = result?;
    if cancel.load(Ordering::SeqCst) {
        return Err(RunError::InterruptedKept(format!(
            "{} ({} candidates; go on with --resume)",
            s.out.display(),
            doc.candidates.len()
        )));
    }
    Ok(doc)
}

impl<'a> Run<'a> {
    fn new(s: &'a Settings, buffer: buffer::Master, start: Instant) -> Result<Run<'a>, RunError> {
        let mut doc = s.resume.clone().unwrap_or_else(|| Automl {
            schema: AUTOML_SCHEMA.into(),
            provenance: s.provenance.clone(),
            configuration: s.configuration.clone(),
            running: true,
            candidates: Vec::new(),
            series: Vec::new(),
            workers: Vec::new(),
            score: AutomlScore {
                flops: 0.0,
                regulated: 0.0,
                error: 1.0,
                best_candidate: None,
                elapsed_s: 0.0,
                candidates_per_minute: 0.0,
                training_share: 0.0,
                search_seconds: 0.0,
            },
            epoch_seconds: None,
            valid: false,
            invalid_because: Vec::new(),
        });
        // A resumed run trains again what was handed out and not finished.
        doc.candidates.retain(|c| c.outcome != Outcome::Running);
        doc.running = true;
        doc.provenance = s.provenance.clone();
        for w in &mut doc.workers {
            w.alive = false;
        }
        let mut nets = Vec::new();
        let mut morphs = Vec::new();
        for c in &doc.candidates {
            let bad = |e: serde_json::Error| {
                RunError::Input(format!("--resume: candidate {}: {e}", c.id))
            };
            nets.push(serde_json::from_value(c.description.clone()).map_err(bad)?);
            morphs.push(
                c.morphisms
                    .iter()
                    .map(|m| serde_json::from_value(m.clone()))
                    .collect::<Result<_, _>>()
                    .map_err(bad)?,
            );
        }
        let next_id = doc.candidates.iter().map(|c| c.id + 1).max().unwrap_or(0);
        Ok(Run {
            s,
            handed: doc.candidates.len(),
            search_s: doc.score.search_seconds,
            doc,
            nets,
            morphs,
            pending: BTreeMap::new(),
            running: BTreeMap::new(),
            next_id,
            rng: Rng::new(s.seed ^ 0xA1_9E4F),
            buffer,
            cx: Context {
                classify: s.classify.clone(),
                fault: s.fault,
            },
            start,
            last_sample: Instant::now(),
        })
    }

    fn elapsed(&self) -> f64 {
        self.start.elapsed().as_secs_f64()
    }

    /// A worker thread on `cpus`.
    fn spawn(&mut self, cpus: &[usize]) -> Result<(), RunError> {
        let id = self.doc.workers.len();
        let pool =
            roofline_kernels::affinity::pinned_pool(cpus).map_err(|source| RunError::Threads {
                threads: cpus.len(),
                source,
            })?;
        let link = Link::new(buffer_dir(&self.s.out), id, None);
        let cx = self.cx.clone();
        std::thread::Builder::new()
            .name(format!("automl-worker-{id}"))
            .spawn(move || {
                if let Err(e) = worker::work(id, &link, &cx, Some(&pool)) {
                    eprintln!("automl worker {id}: {e}");
                }
            })
            .map_err(|e| RunError::Run(format!("cannot start worker {id}: {e}")))?;
        self.add_worker();
        Ok(())
    }

    fn add_worker(&mut self) {
        let id = self.doc.workers.len();
        self.doc.workers.push(Worker {
            id,
            trials: 0,
            train_seconds: 0.0,
            alive: true,
        });
    }

    fn drive(&mut self, p: &dyn Progress, cancel: &AtomicBool) -> Result<Automl, RunError> {
        let budget = self.s.budget.as_secs_f64();
        let mut ended = false;
        loop {
            let interrupted = cancel.load(Ordering::SeqCst);
            if (interrupted || self.elapsed() >= budget) && !ended {
                ended = true;
                self.buffer.stop();
                p.line(&format!(
                    "{:.0} s: {}; the trials in progress stop at their next step",
                    self.elapsed(),
                    if interrupted {
                        "interrupted"
                    } else {
                        "the budget is spent"
                    }
                ));
            }
            if !ended {
                self.fill(p)?;
                if self.running.is_empty() && self.pending.is_empty() {
                    p.line("the search has no candidate left to train (the limits are reached)");
                    ended = true;
                    self.buffer.stop();
                }
            }
            if ended && self.running.is_empty() {
                break;
            }
            if let Some(e) = self
                .buffer
                .next(Duration::from_millis(20))
                .map_err(RunError::Run)?
            {
                self.on(e, p)?;
            }
            self.watchdog(p, ended)?;
            if self.last_sample.elapsed() >= self.s.sample_every {
                self.sample_now();
                self.write()?;
            }
        }
        for id in std::mem::take(&mut self.pending).into_keys() {
            self.buffer.withdraw(id);
        }
        // Handed out and never taken: not candidates; taken and not finished: cut.
        self.doc
            .candidates
            .retain(|c| !(c.outcome == Outcome::Running && c.worker == usize::MAX));
        for c in &mut self.doc.candidates {
            if c.outcome == Outcome::Running {
                c.outcome = Outcome::Cut;
            }
        }
        self.sample_now();
        self.doc.running = false;
        self.write()?;
        Ok(self.doc.clone())
    }

    /// Keeps a trial waiting in the buffer for every live worker beside the one it trains, so
    /// that a worker that finishes takes the next at once (the search runs while it trains).
    fn fill(&mut self, p: &dyn Progress) -> Result<(), RunError> {
        let alive = self.doc.workers.iter().filter(|w| w.alive).count();
        while self.pending.len() + self.running.len() < 2 * alive {
            let t0 = Instant::now();
            let next = self.generate();
            self.search_s += t0.elapsed().as_secs_f64();
            let Some(t) = next else { break };
            p.line(&format!(
                "candidate {}: {} (batch {}, kernel {}, {} epochs)",
                t.id,
                match (&t.parent, t.morphisms.as_slice()) {
                    (None, []) => "the starting network".to_string(),
                    (_, ms) => format!(
                        "from {} by {}",
                        self.parent_of(t.id)
                            .map_or("the start".into(), |p| format!("candidate {p}")),
                        ms.iter()
                            .map(|m| m.to_string())
                            .collect::<Vec<_>>()
                            .join(", ")
                    ),
                },
                t.batch,
                t.kernel,
                t.epochs
            ));
            self.buffer.hand(&t).map_err(RunError::Run)?;
            self.pending.insert(t.id, t);
        }
        Ok(())
    }

    fn parent_of(&self, id: usize) -> Option<usize> {
        self.doc
            .candidates
            .iter()
            .find(|c| c.id == id)
            .and_then(|c| c.parent)
    }

    /// The trained candidates (with their weights on disk) and their accuracy for the search:
    /// the best observed, or the warm-up's prediction when higher.
    fn trained(&self) -> Vec<(usize, f64)> {
        let dir = weights_dir(&self.s.out);
        self.doc
            .candidates
            .iter()
            .filter(|c| {
                matches!(
                    c.outcome,
                    Outcome::Trained | Outcome::EarlyStopped | Outcome::Cut
                )
            })
            .filter(|c| !c.epochs.is_empty() && dir.join(format!("{}.safetensors", c.id)).is_file())
            .map(|c| {
                let acc = c
                    .best_top1()
                    .unwrap_or(0.0)
                    .max(c.predicted_top1.unwrap_or(0.0));
                (c.id, acc)
            })
            .collect()
    }

    fn index(&self, id: usize) -> Option<usize> {
        self.doc.candidates.iter().position(|c| c.id == id)
    }

    /// The next candidate: the starting network first; until one is trained, random children
    /// of it trained from their seed; then the search's proposal, with TPE's hyper-parameters
    /// after the warm-up rounds.
    fn generate(&mut self) -> Option<Trial> {
        let s = self.s;
        let side = s.classify.data.resolution();
        let workers = s.workers.count().max(1);
        let round = (self.handed / workers).min(s.rounds.len() - 1);
        let warm_up = round + 1 < s.rounds.len();
        let trained = self.trained();
        let taken: Vec<Description> = self
            .nets
            .iter()
            .cloned()
            .chain(self.pending.values().map(|t| t.description.clone()))
            .collect();
        let (parent, morphisms, description, expected, hp) = if self.doc.candidates.is_empty()
            && self.pending.is_empty()
        {
            (None, Vec::new(), s.start.clone(), None, (s.batch, s.kernel))
        } else if trained.is_empty() {
            // Nothing trained yet (or no weights kept): a child of the start, or of a network
            // already handed out, trained from its seed.
            let mut found = None;
            for net in std::iter::once(&s.start).chain(&self.nets) {
                let ns = super::morph::neighbours(
                    net,
                    side,
                    s.kernel,
                    s.limits,
                    s.neighbours,
                    &mut self.rng,
                );
                if let Some((m, d)) = ns.into_iter().find(|(_, d)| !taken.contains(d)) {
                    found = Some((m, d));
                    break;
                }
            }
            let (m, d) = found?;
            (None, vec![m], d, None, (s.batch, s.kernel))
        } else {
            // The GP on the best and the latest trained networks (at most 2 × GP_HALF): its
            // cost grows with the square of what it holds, and the master shares the cores.
            let obs: Vec<(Signature, f64)> = best_and_latest(trained.clone(), GP_HALF)
                .iter()
                .filter_map(|&(id, acc)| Some((Signature::of(&self.nets[self.index(id)?]), acc)))
                .collect();
            let gp = Gp::fit(&obs)?;
            let best_parent = trained.iter().max_by(|a, b| a.1.total_cmp(&b.1))?.0;
            let c = &self.doc.candidates[self.index(best_parent)?];
            let mut hp = (c.batch, c.kernel);
            if !warm_up {
                let hps: Vec<_> = self
                    .doc
                    .candidates
                    .iter()
                    .filter_map(|c| Some(((c.batch, c.kernel), c.best_top1()?)))
                    .collect();
                let b: Vec<(usize, f64)> = hps.iter().map(|((b, _), a)| (*b, *a)).collect();
                let k: Vec<(usize, f64)> = hps.iter().map(|((_, k), a)| (*k, *a)).collect();
                hp = (
                    tpe::suggest(&s.batches, &b, &mut self.rng).unwrap_or(hp.0),
                    tpe::suggest(&s.kernels, &k, &mut self.rng).unwrap_or(hp.1),
                );
            }
            let (nets, candidates) = (&self.nets, &self.doc.candidates);
            let list: Vec<Trained> = trained
                .iter()
                .filter_map(|&(id, accuracy)| {
                    Some(Trained {
                        id,
                        description: &nets[candidates.iter().position(|c| c.id == id)?],
                        accuracy,
                    })
                })
                .collect();
            let settings = search::Settings {
                side,
                kernel: hp.1,
                limits: s.limits,
                neighbours: s.neighbours,
                depth: 3,
                t0: 1.0,
                cooling: 0.9,
                evaluations: 96,
            };
            let prop = search::propose(&gp, &list, &taken, settings, &mut self.rng)?;
            if warm_up {
                // In warm-up a child trains with its parent's batch (and the kernel the
                // morphisms used).
                if let Some(i) = self.index(prop.parent) {
                    hp.0 = self.doc.candidates[i].batch;
                }
            }
            (
                Some(prop.parent),
                prop.morphisms,
                prop.description,
                Some((prop.mean, prop.ucb)),
                hp,
            )
        };
        let id = self.next_id;
        self.next_id += 1;
        self.handed += 1;
        let dir = weights_dir(&s.out);
        let parent_net = parent.and_then(|p| Some(self.nets[self.index(p)?].clone()));
        let layers = description.layers(side, side).ok()?;
        let ops = accounting::aiperf(&layers);
        let epochs = s.rounds[round];
        let t = Trial {
            id,
            parent: parent
                .zip(parent_net)
                .map(|(p, net)| (net, dir.join(format!("{p}.safetensors")))),
            morphisms: morphisms.clone(),
            description: description.clone(),
            batch: hp.0,
            kernel: hp.1,
            epochs,
            patience: 2 + round,
            final_epochs: *s.rounds.last().expect("checked"),
            checkpoint: dir.join(format!("{id}.safetensors")),
            seed: s.seed.wrapping_add(id as u64 * 7919),
            train_ops: ops.total(),
            eval_ops: ops.forward,
        };
        let parameters = layers.iter().map(|l| l.params).sum();
        // Recorded now, as running; its worker when one takes it.
        self.doc.candidates.push(Candidate {
            id,
            parent,
            morphisms: morphisms
                .iter()
                .map(|m| serde_json::to_value(m).expect("plain data"))
                .collect(),
            description: serde_json::to_value(&description).expect("plain data"),
            parameters,
            ops_per_image: Ops {
                forward: ops.forward,
                backward: ops.backward,
                total: ops.total(),
            },
            batch: hp.0,
            kernel: hp.1,
            round,
            epochs_planned: epochs,
            patience: t.patience,
            expected,
            worker: usize::MAX,
            started_s: self.elapsed(),
            finished_s: None,
            epochs: Vec::new(),
            predicted_top1: None,
            outcome: Outcome::Running,
        });
        self.nets.push(description);
        self.morphs.push(morphisms);
        Some(t)
    }

    fn on(&mut self, e: Event, p: &dyn Progress) -> Result<(), RunError> {
        let now = self.elapsed();
        match e {
            Event::Took { worker, trial } => {
                self.pending.remove(&trial);
                self.running.insert(trial, (worker, Instant::now()));
                if let Some(i) = self.index(trial) {
                    self.doc.candidates[i].worker = worker;
                    self.doc.candidates[i].started_s = now;
                }
            }
            Event::Beat { worker, trial } => {
                if let Some(r) = self.running.get_mut(&trial).filter(|r| r.0 == worker) {
                    r.1 = Instant::now();
                }
            }
            Event::Epoch {
                worker,
                trial,
                mut epoch,
            } => {
                let Some(r) = self.running.get_mut(&trial).filter(|r| r.0 == worker) else {
                    return Ok(());
                };
                r.1 = Instant::now();
                epoch.at_s = now;
                p.line(&format!(
                    "{now:.0} s: candidate {trial} epoch {} on worker {worker}: top-1 {:.3}, {:.1} s",
                    epoch.epoch, epoch.top1, epoch.seconds
                ));
                if let Some(i) = self.index(trial) {
                    self.doc.candidates[i].epochs.push(epoch);
                }
                self.write()?;
            }
            Event::Done {
                worker,
                trial,
                outcome,
                predicted,
                train_seconds,
            } => {
                if self.running.get(&trial).is_none_or(|r| r.0 != worker) {
                    return Ok(());
                }
                self.running.remove(&trial);
                if let Some(w) = self.doc.workers.get_mut(worker) {
                    w.trials += 1;
                    w.train_seconds += train_seconds;
                }
                let Some(i) = self.index(trial) else {
                    return Ok(());
                };
                let c = &mut self.doc.candidates[i];
                c.finished_s = Some(now);
                c.predicted_top1 = predicted;
                c.outcome = outcome.clone();
                p.line(&format!(
                    "{now:.0} s: candidate {trial} {}: best top-1 {}",
                    match &outcome {
                        Outcome::Failed { why } => format!("failed ({why})"),
                        o => format!("{o:?}").to_lowercase(),
                    },
                    c.best_top1().map_or("none".into(), |a| format!("{a:.3}"))
                ));
                if matches!(outcome, Outcome::Failed { .. }) {
                    self.again(trial);
                }
                self.write()?;
            }
        }
        Ok(())
    }

    /// The candidate of a failed or stalled trial handed out again (once), to another worker
    /// if one is free.
    fn again(&mut self, trial: usize) {
        let Some(i) = self.index(trial) else { return };
        let c = self.doc.candidates[i].clone();
        // A retry is not retried again.
        if self
            .doc
            .candidates
            .iter()
            .filter(|x| x.description == c.description)
            .count()
            > 1
        {
            return;
        }
        let dir = weights_dir(&self.s.out);
        let id = self.next_id;
        self.next_id += 1;
        let net = self.nets[i].clone();
        let side = self.s.classify.data.resolution();
        let Ok(layers) = net.layers(side, side) else {
            return;
        };
        let ops = accounting::aiperf(&layers);
        let parent = c.parent.and_then(|p| {
            Some((
                self.nets[self.index(p)?].clone(),
                dir.join(format!("{p}.safetensors")),
            ))
        });
        let t = Trial {
            id,
            parent,
            morphisms: self.morphs[i].clone(),
            description: net.clone(),
            batch: c.batch,
            kernel: c.kernel,
            epochs: c.epochs_planned,
            patience: c.patience,
            final_epochs: *self.s.rounds.last().expect("checked"),
            checkpoint: dir.join(format!("{id}.safetensors")),
            seed: self.s.seed.wrapping_add(id as u64 * 7919),
            train_ops: ops.total(),
            eval_ops: ops.forward,
        };
        self.doc.candidates.push(Candidate {
            id,
            worker: usize::MAX,
            started_s: self.elapsed(),
            finished_s: None,
            epochs: Vec::new(),
            predicted_top1: None,
            outcome: Outcome::Running,
            ..c
        });
        self.nets.push(net);
        self.morphs.push(t.morphisms.clone());
        if self.buffer.hand(&t).is_ok() {
            self.pending.insert(id, t);
        }
    }

    /// Ends trials whose worker sent nothing for longer than the stall limit: the worker is
    /// given up (a fresh one takes its cores) and the candidate handed out again.
    fn watchdog(&mut self, p: &dyn Progress, ended: bool) -> Result<(), RunError> {
        let stalled: Vec<(usize, usize)> = self
            .running
            .iter()
            .filter(|(_, r)| r.1.elapsed() > self.s.stall)
            .map(|(&t, r)| (t, r.0))
            .collect();
        for (trial, worker) in stalled {
            self.running.remove(&trial);
            p.line(&format!(
                "{:.0} s: worker {worker} sent nothing for {:.0} s: candidate {trial}'s trial is ended{}",
                self.elapsed(),
                self.s.stall.as_secs_f64(),
                if ended { "" } else { " and the candidate handed to another worker" }
            ));
            if let Some(i) = self.index(trial) {
                self.doc.candidates[i].outcome = Outcome::Stalled;
                self.doc.candidates[i].finished_s = Some(self.elapsed());
            }
            if let Some(w) = self.doc.workers.get_mut(worker) {
                w.alive = false;
            }
            if !ended {
                // A thread's cores go to a fresh worker; a team of ranks cannot be replaced.
                if let Workers::Threads(cpus) = &self.s.workers {
                    let c = cpus[worker % cpus.len()].clone();
                    self.spawn(&c)?;
                }
                self.again(trial);
            }
            self.write()?;
        }
        Ok(())
    }

    fn sample_now(&mut self) {
        self.last_sample = Instant::now();
        // A point right after the last one (the run's end) replaces it.
        let close = self.s.sample_every.as_secs_f64() / 10.0;
        let at = self.elapsed();
        tally::add_sample(&mut self.doc, at, close);
    }

    /// The score from what is known now, and the document written (atomically).
    fn write(&mut self) -> Result<(), RunError> {
        let workers = self.s.workers.count();
        let elapsed = self.elapsed();
        tally::rescore(
            &mut self.doc,
            elapsed,
            workers,
            self.search_s,
            self.s.imagenet_224,
        );
        let json = self
            .doc
            .to_json()
            .map_err(|e| RunError::Run(e.to_string()))?;
        roofline_model::write::write_atomic(&self.s.out, json.as_bytes())
            .map_err(|e| RunError::Run(e.to_string()))
    }
}
