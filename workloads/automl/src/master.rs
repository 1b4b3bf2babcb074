//! The AutoML master: records the candidates the workers propose (each worker runs the search
//! itself, from the shared history, as AIPerf's slaves do) and refuses a network already taken,
//! follows the workers (heartbeats, a watchdog that ends a stalled trial and gives its
//! candidate to another worker), samples the FLOPS time series and rewrites `automl.json` (the
//! history the workers read) after every change.

use crate::buffer::{self, Ack, Folder, Link};
use crate::propose::{Plan, Proposal};
use crate::rules::{self, Space};
use crate::tally;
use crate::worker::{self, Context, Event, Fault, Trial};
use roofline_model::automl::{
    Automl, AutomlScore, Candidate, Ops, Outcome, Retrain, Worker, AUTOML_SCHEMA,
};
use roofline_model::Provenance;
use roofline_workloads::accounting;
use roofline_workloads::graph::morph::{self, Limits, Morphism};
use roofline_workloads::graph::Description;
use roofline_workloads::run::RunError;
use roofline_workloads::train::TrainConfig;
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
    /// The GPUs the worker threads train on, one each (None: the CPU).
    pub gpus: Option<crate::worker::Gpus>,
    /// The starting batch and kernel, and what the per-trial TPE draws from (from round 4).
    pub batch: usize,
    pub kernel: usize,
    pub space: Space,
    pub limits: Limits,
    /// Children sampled per morphism step (8).
    pub neighbours: usize,
    /// Children start from their parent's weights (`--from-parent`; else He's or `--init`'s).
    pub from_parent: bool,
    /// The time series' interval (AIPerf's score.py: an hour).
    pub sample_every: Duration,
    /// A trial that sends nothing (no step) for this long is ended.
    pub stall: Duration,
    /// automl.json; the candidates' weights go beside it in `<stem>.weights/`.
    pub out: PathBuf,
    pub seed: u64,
    /// What AIPerf's validity rules look at.
    pub checks: tally::Checks,
    /// Where the run departs from AIPerf's reference code, and why.
    pub deviations: Vec<String>,
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

/// The least time between two writes of automl.json.
const WRITE_GAP: Duration = Duration::from_secs(1);

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
    /// Candidates recorded (a resumed run's included): the next one's sequence number.
    handed: usize,
    /// Seconds the workers spent in the search, and the master busy, before this run's
    /// resume included.
    search_s: f64,
    master_s: f64,
    /// The run has ended: no proposal is recorded any more.
    ended: bool,
    buffer: buffer::Master,
    cx: Context,
    start: Instant,
    last_sample: Instant,
    /// automl.json: changed since written, when last written, and the least time between two
    /// writes (20 × the last write's, at least a second: writing keeps the master at most 5 %
    /// busy, however long the history).
    dirty: bool,
    last_write: Instant,
    write_gap: Duration,
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
    // A resumed run's candidates in the history log, then the plan the workers wait for.
    for c in &run.doc.candidates {
        run.buffer.log(c).map_err(RunError::Run)?;
    }
    run.write_now()?;
    run.buffer.plan(&run.plan()).map_err(RunError::Run)?;
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
            score: AutomlScore::fresh(),
            epoch_seconds: None,
            valid: false,
            invalid_because: Vec::new(),
            deviations: Vec::new(),
        });
        doc.deviations = s.deviations.clone();
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
            master_s: doc.score.master_seconds,
            ended: false,
            doc,
            nets,
            morphs,
            pending: BTreeMap::new(),
            running: BTreeMap::new(),
            next_id,
            buffer,
            cx: Context::new(&s.classify, s.from_parent, s.fault, s.gpus.map(|g| g.run)),
            start,
            last_sample: Instant::now(),
            dirty: true,
            last_write: Instant::now(),
            write_gap: WRITE_GAP,
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
        let mut cx = self.cx.clone();
        cx.gpu = self.s.gpus.map(|g| g.for_worker(id));
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
        let began = Instant::now();
        let busy_before = self.master_s;
        loop {
            let interrupted = cancel.load(Ordering::SeqCst);
            if (interrupted || self.elapsed() >= budget) && !self.ended {
                self.end(
                    p,
                    if interrupted {
                        "interrupted"
                    } else {
                        "the budget is spent"
                    },
                );
            }
            if self.ended && self.running.is_empty() {
                break;
            }
            if let Some(e) = self
                .buffer
                .next(Duration::from_millis(20))
                .map_err(RunError::Run)?
            {
                self.on(e, p)?;
            }
            self.watchdog(p)?;
            if self.last_sample.elapsed() >= self.s.sample_every {
                self.sample_now();
                self.write()?;
            }
            if self.dirty && self.last_write.elapsed() >= self.write_gap {
                self.write_now()?;
            }
            // Busy: all but the waits for an event.
            self.master_s =
                busy_before + (began.elapsed().saturating_sub(self.buffer.slept())).as_secs_f64();
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
        self.write_now()?;
        Ok(self.doc.clone())
    }

    /// No proposal is recorded from now on; the trials in progress stop at their next step.
    fn end(&mut self, p: &dyn Progress, why: &str) {
        self.ended = true;
        self.buffer.stop();
        p.line(&format!(
            "{:.0} s: {why}; the trials in progress stop at their next step",
            self.elapsed()
        ));
    }

    /// What the workers' search needs.
    fn plan(&self) -> Plan {
        Plan {
            start: self.s.start.clone(),
            side: self.s.classify.data.resolution(),
            batch: self.s.batch,
            kernel: self.s.kernel,
            limits: self.s.limits,
            neighbours: self.s.neighbours,
            space: self.s.space.clone(),
            seed: self.s.seed,
            weights: weights_dir(&self.s.out),
        }
    }

    /// A worker's proposal: refused when its network is taken (or over the limits), else
    /// recorded as the next candidate and given to the worker that proposed it.
    fn record(&mut self, worker: usize, prop: Proposal, p: &dyn Progress) -> Ack {
        let s = self.s;
        if let Some(i) = self.nets.iter().position(|n| *n == prop.description) {
            return Ack::Rejected(format!(
                "candidate {} has this network",
                self.doc.candidates[i].id
            ));
        }
        let side = s.classify.data.resolution();
        let layers = match prop.description.layers(side, side) {
            Ok(l) => l,
            Err(e) => return Ack::Rejected(format!("the network does not build: {e}")),
        };
        let parameters: f64 = layers.iter().map(|l| l.params).sum();
        if morph::layer_count(&prop.description) > s.limits.layers
            || parameters > s.limits.parameters
        {
            return Ack::Rejected("over the limits".into());
        }
        let dir = weights_dir(&s.out);
        let parent = match prop.parent {
            None => None,
            Some(pid) => match self.index(pid) {
                Some(i) if dir.join(format!("{pid}.safetensors")).is_file() => {
                    Some((self.nets[i].clone(), dir.join(format!("{pid}.safetensors"))))
                }
                _ => return Ack::Rejected(format!("candidate {pid} has no trained weights")),
            },
        };
        // AIPerf's round: the sequence number over the workers (uncapped for the patience and
        // the per-trial TPE; the last round's epochs repeat).
        let workers = s.workers.count().max(1);
        let round = self.handed / workers;
        let epochs = s.rounds[round.min(s.rounds.len() - 1)];
        let id = self.next_id;
        self.next_id += 1;
        self.handed += 1;
        let ops = roofline_workloads::accounting::aiperf(&layers);
        let t = Trial {
            id,
            parent,
            morphisms: prop.morphisms.clone(),
            description: prop.description.clone(),
            batch: prop.batch,
            kernel: prop.kernel,
            epochs,
            patience: rules::patience(round),
            tune: (round >= rules::TUNED_FROM_ROUND).then(|| s.space.clone()),
            checkpoint: dir.join(format!("{id}.safetensors")),
            seed: s.seed.wrapping_add(id as u64 * 7919),
            train_ops: ops.total(),
            eval_ops: ops.forward,
        };
        if let Err(e) = self.buffer.assign(&t) {
            return Ack::Rejected(e);
        }
        p.line(&format!(
            "candidate {id} from worker {worker}: {} (batch {}, kernel {}, {epochs} epochs{})",
            match (&prop.parent, prop.morphisms.as_slice()) {
                (None, []) => "the starting network".to_string(),
                (par, ms) => format!(
                    "from {} by {}",
                    par.map_or("the start".into(), |p| format!("candidate {p}")),
                    ms.iter()
                        .map(|m| m.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
            prop.batch,
            prop.kernel,
            if t.tune.is_some() {
                ", then once more with a TPE draw"
            } else {
                ""
            }
        ));
        // With --init every candidate starts from the file: how much of it fits.
        let pretrained = match self.cx.start.pretrained() {
            Some(f) => match f.filled(&prop.description, side) {
                Ok(n) => Some(n),
                Err(e) => return Ack::Rejected(e.to_string()),
            },
            None => None,
        };
        self.doc.candidates.push(Candidate {
            id,
            parent: prop.parent,
            morphisms: prop
                .morphisms
                .iter()
                .map(|m| serde_json::to_value(m).expect("plain data"))
                .collect(),
            description: serde_json::to_value(&prop.description).expect("plain data"),
            parameters,
            ops_per_image: Ops {
                forward: ops.forward,
                backward: ops.backward,
                total: ops.total(),
            },
            batch: prop.batch,
            kernel: prop.kernel,
            round,
            epochs_planned: epochs,
            patience: t.patience,
            expected: prop.expected,
            worker,
            started_s: self.elapsed(),
            finished_s: None,
            epochs: Vec::new(),
            predicted_top1: None,
            retrain: None,
            pretrained,
            outcome: Outcome::Running,
        });
        self.nets.push(prop.description);
        self.morphs.push(prop.morphisms);
        self.running.insert(id, (worker, Instant::now()));
        if let Err(e) = self.log(id) {
            return Ack::Rejected(e);
        }
        Ack::Trial(id)
    }

    fn index(&self, id: usize) -> Option<usize> {
        self.doc.candidates.iter().position(|c| c.id == id)
    }

    fn on(&mut self, e: Event, p: &dyn Progress) -> Result<(), RunError> {
        let now = self.elapsed();
        match e {
            Event::Proposed {
                worker,
                seq,
                proposal,
                search_seconds,
            } => {
                self.search_s += search_seconds;
                let ack = match proposal {
                    _ if self.ended => Ack::Stop,
                    Some(prop) => self.record(worker, prop, p),
                    None if self.running.is_empty() && self.pending.is_empty() => {
                        self.end(
                            p,
                            "the search has no candidate left to train (the limits are reached)",
                        );
                        Ack::Stop
                    }
                    None => Ack::Wait,
                };
                // The log the worker's next proposal reads has the record already.
                if matches!(ack, Ack::Trial(_)) {
                    self.write()?;
                }
                self.buffer.ack(worker, seq, &ack).map_err(RunError::Run)?;
            }
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
                tuned,
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
                if let Some(t) = tuned {
                    c.retrain = Some(Retrain {
                        batch: t.draw.batch,
                        kernel: t.draw.kernel,
                        dropout: t.draw.dropout,
                        top1: t.best,
                        won: t.won,
                    });
                    if t.won {
                        // The candidate is the better of its two trainings (its weights too).
                        let side = self.s.classify.data.resolution();
                        if let Ok(layers) = t.description.layers(side, side) {
                            let ops = roofline_workloads::accounting::aiperf(&layers);
                            c.ops_per_image = Ops {
                                forward: ops.forward,
                                backward: ops.backward,
                                total: ops.total(),
                            };
                            c.parameters = layers.iter().map(|l| l.params).sum();
                        }
                        c.batch = t.draw.batch;
                        c.kernel = t.draw.kernel;
                        c.description = serde_json::to_value(&t.description).expect("plain data");
                        c.morphisms = t
                            .morphisms
                            .iter()
                            .map(|m| serde_json::to_value(m).expect("plain data"))
                            .collect();
                        self.nets[i] = t.description;
                        self.morphs[i] = t.morphisms;
                    }
                }
                let c = &self.doc.candidates[i];
                p.line(&format!(
                    "{now:.0} s: candidate {trial} {}: best top-1 {}",
                    match &outcome {
                        Outcome::Failed { why } => format!("failed ({why})"),
                        o => format!("{o:?}").to_lowercase(),
                    },
                    c.best_top1().map_or("none".into(), |a| format!("{a:.3}"))
                ));
                self.log(trial).map_err(RunError::Run)?;
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
            tune: (c.round >= rules::TUNED_FROM_ROUND).then(|| self.s.space.clone()),
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
            retrain: None,
            outcome: Outcome::Running,
            ..c
        });
        self.nets.push(net);
        self.morphs.push(t.morphisms.clone());
        let _ = self.log(id);
        if self.buffer.hand(&t).is_ok() {
            self.pending.insert(id, t);
        }
    }

    /// Ends trials whose worker sent nothing for longer than the stall limit: the worker is
    /// given up (a fresh one takes its cores) and the candidate handed out again.
    fn watchdog(&mut self, p: &dyn Progress) -> Result<(), RunError> {
        let ended = self.ended;
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
            self.log(trial).map_err(RunError::Run)?;
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

    /// Candidate `id`'s state now, in the history log the workers read.
    fn log(&mut self, id: usize) -> Result<(), String> {
        match self.index(id) {
            Some(i) => self.buffer.log(&self.doc.candidates[i]),
            None => Ok(()),
        }
    }

    /// The document is written when the least time between writes has passed (else soon, by
    /// the loop).
    fn write(&mut self) -> Result<(), RunError> {
        self.dirty = true;
        if self.last_write.elapsed() >= self.write_gap {
            self.write_now()?;
        }
        Ok(())
    }

    /// The score from what is known now, and the document written (atomically).
    fn write_now(&mut self) -> Result<(), RunError> {
        let t0 = Instant::now();
        let workers = self.s.workers.count();
        let elapsed = self.elapsed();
        tally::rescore(
            &mut self.doc,
            elapsed,
            workers,
            (self.search_s, self.master_s),
            &self.s.checks,
        );
        let json = self
            .doc
            .to_json()
            .map_err(|e| RunError::Run(e.to_string()))?;
        roofline_model::write::write_atomic(&self.s.out, json.as_bytes())
            .map_err(|e| RunError::Run(e.to_string()))?;
        self.dirty = false;
        self.last_write = Instant::now();
        self.write_gap = WRITE_GAP.max(20 * t0.elapsed());
        Ok(())
    }
}
