//! The one convolution search, for the trainer's plans and the probe's convolution ceilings
//! alike: every method cuDNN offers for one shape, direction and precision — the legacy API's
//! measured choice (`dnn::find`) and every engine of the backend API (`dnn_graph`) — each
//! prepared, run once, checked, and timed on the device; the fastest correct one is kept.
//!
//! The bookkeeping ([`search`]) is generic over a [`Bench`] and the driver's [`Timer`], so
//! that its rules are tested on a simulated device: a method cuDNN refuses, one whose
//! numerics the precision excludes, one needing more workspace than offered, one that fails
//! to run and one whose result is wrong are each recorded with why and never chosen; an
//! interruption ends the search; the same method listed twice is tried once.

use super::blas::Prec;
use super::device::{Events, Gpu};
use super::dnn::{execute, find, workspace_of, Algo, Descs, Dir, Handle};
use super::dnn_graph::{ConvGraph, ConvOp, EngineConfig, EnginePlan};
use super::CudaError;
use crate::cpu::conv::ConvShape;
use crate::driver::Timer;
use std::cell::Cell;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, Ordering};

/// What became of one method.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// cuDNN does not support it here (the engine, its knobs or its plan refused).
    Refused(String),
    /// Its numerics are not the precision's (TF32 in f32, a down-conversion).
    Excluded(String),
    /// It needs this many bytes of workspace, more than offered.
    Workspace(usize),
    /// It was accepted but failed to run.
    Failed(String),
    /// It ran and its result disagreed with the reference.
    Wrong(String),
    /// It ran, was right, and took this many seconds (the best of the timed runs).
    Timed(f64),
    /// Not tried: the search's time was spent, with a method already timed.
    NotTried,
}

/// One method tried, by name.
#[derive(Clone, Debug, PartialEq)]
pub struct Tried {
    pub name: String,
    pub outcome: Outcome,
}

/// A search's record, and the fastest correct method ready to run.
pub struct Searched<R> {
    pub tried: Vec<Tried>,
    pub best: Option<(R, String, f64)>,
}

impl<R> Searched<R> {
    /// How many methods ended each way: "41 methods: 12 timed, 25 refused, 3 excluded, 1 over
    /// the workspace".
    pub fn summary(&self) -> String {
        let mut n = [0usize; 7];
        for t in &self.tried {
            n[match t.outcome {
                Outcome::Timed(_) => 0,
                Outcome::Refused(_) => 1,
                Outcome::Excluded(_) => 2,
                Outcome::Workspace(_) => 3,
                Outcome::Failed(_) => 4,
                Outcome::Wrong(_) => 5,
                Outcome::NotTried => 6,
            }] += 1;
        }
        let words = [
            "timed",
            "refused",
            "excluded",
            "over the workspace",
            "failed",
            "wrong",
            "not tried (search budget)",
        ];
        let parts: Vec<String> = n
            .iter()
            .zip(words)
            .filter(|(c, _)| **c > 0)
            .map(|(c, w)| format!("{c} {w}"))
            .collect();
        format!("{} methods: {}", self.tried.len(), parts.join(", "))
    }

    /// The seconds of method `name`, where it was timed.
    pub fn seconds_of(&self, name: &str) -> Option<f64> {
        self.tried.iter().find_map(|t| match t.outcome {
            Outcome::Timed(s) if t.name == name => Some(s),
            _ => None,
        })
    }
}

/// What a search runs methods on.
pub trait Bench {
    type Method;
    /// A method made ready to run (a plan).
    type Ready;
    /// The method made ready, or why it cannot be (refused, excluded, over the workspace).
    fn prepare(&mut self, m: &Self::Method) -> Result<Self::Ready, Outcome>;
    /// One run; an error that is not an interruption makes the method `Failed`.
    fn run(&mut self, r: &Self::Ready) -> Result<(), CudaError>;
    /// After a run: whether its result is right (the error's words when not).
    fn check(&mut self, r: &Self::Ready) -> Result<(), String>;
}

/// Tries every `(name, method)` on `bench`: prepared, run once untimed (a first run may
/// compile or load), checked, then timed `runs` times by `timer` (the best kept). Stops with
/// `Interrupted` when `cancel` is set. Once a method is timed and `spent()` says the search's
/// time is up, the methods left are `NotTried` (the heuristic's come first in the list).
pub fn search<B: Bench, T: Timer<Error = CudaError>>(
    bench: &mut B,
    timer: &mut T,
    methods: Vec<(String, B::Method)>,
    runs: usize,
    cancel: &AtomicBool,
    spent: &mut dyn FnMut() -> bool,
) -> Result<Searched<B::Ready>, CudaError> {
    let mut out = Searched {
        tried: Vec::new(),
        best: None,
    };
    for (name, m) in methods {
        if out.tried.iter().any(|t| t.name == name) {
            continue;
        }
        if cancel.load(Ordering::Relaxed) {
            return Err(CudaError::Interrupted);
        }
        if out.best.is_some() && spent() {
            out.tried.push(Tried {
                name,
                outcome: Outcome::NotTried,
            });
            continue;
        }
        let outcome = match bench.prepare(&m) {
            Err(o) => o,
            Ok(ready) => match try_ready(bench, timer, &ready, runs)? {
                Outcome::Timed(s) => {
                    if out.best.as_ref().is_none_or(|b| s < b.2) {
                        out.best = Some((ready, name.clone(), s));
                    }
                    Outcome::Timed(s)
                }
                other => other,
            },
        };
        out.tried.push(Tried { name, outcome });
    }
    Ok(out)
}

fn try_ready<B: Bench, T: Timer<Error = CudaError>>(
    bench: &mut B,
    timer: &mut T,
    ready: &B::Ready,
    runs: usize,
) -> Result<Outcome, CudaError> {
    let failed = |e: CudaError| match e {
        CudaError::Interrupted => Err(CudaError::Interrupted),
        e => Ok(Outcome::Failed(e.to_string())),
    };
    if let Err(e) = bench.run(ready).and_then(|_| timer.settle()) {
        return failed(e);
    }
    if let Err(why) = bench.check(ready) {
        return Ok(Outcome::Wrong(why));
    }
    let mut best = f64::INFINITY;
    for _ in 0..runs.max(1) {
        match timer.time(&mut || bench.run(ready)) {
            Ok(s) => best = best.min(s),
            Err(e) => return failed(e),
        }
    }
    Ok(Outcome::Timed(best))
}

/// A cuDNN method for one direction.
#[derive(Clone, Debug)]
pub(crate) enum Method {
    /// A legacy-API algorithm, with the math type `find` set on the direction's descriptor.
    Legacy(Algo),
    /// A backend-API engine.
    Engine(EngineConfig),
}

/// A method ready to run.
pub(crate) enum Chosen {
    Legacy(Algo),
    Engine(EnginePlan),
}

impl Chosen {
    /// Runs the direction: `operands` in `dnn::execute`'s order, the output overwritten.
    pub(crate) fn run(
        &self,
        h: &Handle,
        d: &Descs,
        operands: [u64; 3],
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        match self {
            Chosen::Legacy(a) => execute(h, d, *a, operands, ws),
            Chosen::Engine(p) => p.execute(h, operands, ws),
        }
    }
}

/// The right-ness of a direction's output after a run: the probe's check against the CPU's
/// reference, or none (the trainer's search, whose operands are arbitrary; `train --check`
/// checks the model).
pub type Check<'a> = &'a mut dyn FnMut() -> Result<(), String>;

/// One direction's operands and workspace on one GPU, with the graph its engines run on.
struct DnnBench<'a> {
    h: &'a Handle,
    d: &'a Descs,
    graph: Option<Rc<ConvGraph>>,
    p: Prec,
    operands: [u64; 3],
    ws: (u64, usize),
    check: Check<'a>,
}

impl Bench for DnnBench<'_> {
    type Method = Method;
    type Ready = Chosen;

    fn prepare(&mut self, m: &Method) -> Result<Chosen, Outcome> {
        match m {
            Method::Legacy(a) => match workspace_of(self.h, self.d, *a) {
                Ok(need) if need > self.ws.1 => Err(Outcome::Workspace(need)),
                Ok(_) => Ok(Chosen::Legacy(*a)),
                Err(e) => Err(Outcome::Refused(e.to_string())),
            },
            Method::Engine(c) => {
                let g = self
                    .graph
                    .as_ref()
                    .ok_or_else(|| Outcome::Refused("no operation graph".into()))?;
                // The engine's notes first: an excluded one is never made a plan (a plan may
                // compile).
                let notes = g.notes(c).map_err(|e| Outcome::Refused(e.to_string()))?;
                if let Some(why) = notes.excludes(self.p) {
                    return Err(Outcome::Excluded(why.into()));
                }
                let plan =
                    EnginePlan::new(self.h, g, c).map_err(|e| Outcome::Refused(e.to_string()))?;
                if plan.workspace > self.ws.1 {
                    return Err(Outcome::Workspace(plan.workspace));
                }
                Ok(Chosen::Engine(plan))
            }
        }
    }

    fn run(&mut self, r: &Chosen) -> Result<(), CudaError> {
        r.run(self.h, self.d, self.operands, self.ws)
    }

    fn check(&mut self, _: &Chosen) -> Result<(), String> {
        (self.check)()
    }
}

/// Timed runs of each method in a search (after its untimed first run).
pub const SEARCH_RUNS: usize = 3;

/// Seconds one direction's search may take before the methods left are not tried (once one
/// is timed): the trainer's and the full probe's, and the quick probe's.
pub const SEARCH_BUDGET_S: f64 = 1.0;
pub const QUICK_SEARCH_BUDGET_S: f64 = 0.25;

/// Seconds all of one training run's searches may take together (its plans are made before
/// the first step), shared among ResNet-50's [`TRAINER_SEARCHES`] directions; the rest of a
/// larger network's searches keep the legacy API's measured choice. Shapes already in the
/// algorithm cache (the probe's, or an earlier run's) are not searched again.
pub const TRAINER_SEARCH_S: f64 = 20.0;
pub const TRAINER_SEARCHES: usize = 69;

/// Shares a budget of seconds among searches: each gets at most `cap` seconds and at most an
/// even share of what is left for the searches still expected (the probe's convolution
/// section, whose searches it counts; the trainer's run, which expects ResNet-50's). A search
/// given 0 s still runs until its first method is timed (the legacy API's measured choice).
#[derive(Debug)]
pub struct SearchBudget {
    cap: f64,
    total_s: f64,
    left_s: Cell<f64>,
    searches_left: Cell<usize>,
    done: Cell<usize>,
}

impl SearchBudget {
    pub fn new(total_s: f64, cap: f64, searches: usize) -> SearchBudget {
        SearchBudget {
            cap,
            total_s,
            left_s: Cell::new(total_s.max(0.0)),
            searches_left: Cell::new(searches.max(1)),
            done: Cell::new(0),
        }
    }

    /// Seconds the next search may take (0: only its first timed method).
    pub fn next(&self) -> f64 {
        let share = self.left_s.get() / self.searches_left.get().max(1) as f64;
        share.min(self.cap).max(0.0)
    }

    /// A search took `seconds`.
    pub fn spent(&self, seconds: f64) {
        self.done.set(self.done.get() + 1);
        self.left_s.set((self.left_s.get() - seconds).max(0.0));
        self.searches_left
            .set(self.searches_left.get().saturating_sub(1).max(1));
    }

    /// Seconds left for the searches to come.
    pub fn left(&self) -> f64 {
        self.left_s.get()
    }

    /// The budget's seconds in all, the most one search may take, and the searches so far.
    pub fn total(&self) -> f64 {
        self.total_s
    }
    pub fn cap(&self) -> f64 {
        self.cap
    }
    pub fn searches(&self) -> usize {
        self.done.get()
    }
}

/// The fastest correct method cuDNN offers for `dir` of `shape` in `p` on these operands
/// (`[a0, a1, out]` as `dnn::execute` takes them; `out` is overwritten) within the workspace:
/// the legacy API's measured choice first, then every backend engine. `d` is the direction's
/// own descriptor set (the legacy choice sets its math type there). The notes say what could
/// not be listed (no graph, no heuristic), for the caller to report; the legacy API's choice
/// comes back too (a plan keeps it for what it runs with the legacy API).
#[allow(clippy::too_many_arguments)]
pub(crate) fn best_method(
    gpu: &Gpu,
    h: &Handle,
    d: &Descs,
    shape: &ConvShape,
    p: Prec,
    dir: Dir,
    operands: [u64; 3],
    ws: (u64, usize),
    check: Check<'_>,
    cancel: &AtomicBool,
    budget_s: f64,
) -> Result<Found, CudaError> {
    let start = std::time::Instant::now();
    let mut notes = Vec::new();
    let mut methods = Vec::new();
    let mut legacy = None;
    match find(h, d, p, dir, operands, ws) {
        Ok((a, _)) => {
            legacy = Some(a);
            methods.push((a.name(), Method::Legacy(a)));
        }
        Err(CudaError::Interrupted) => return Err(CudaError::Interrupted),
        Err(e) => notes.push(format!("legacy API: {e}")),
    }
    let graph = ConvOp::new(shape, p, dir, 0.0)
        .and_then(|op| ConvGraph::new(h, op))
        .map(Rc::new);
    let graph = match graph {
        Ok(g) => Some(g),
        Err(e) => {
            notes.push(format!("backend API: {e}"));
            None
        }
    };
    if let Some(g) = &graph {
        match g.engines() {
            Ok((list, heuristic)) => {
                if let Some(e) = heuristic {
                    notes.push(format!("backend heuristic: {e}"));
                }
                methods.extend(list.into_iter().map(|c| (c.name(), Method::Engine(c))));
            }
            Err(e) => notes.push(format!("backend engines: {e}")),
        }
    }
    let mut bench = DnnBench {
        h,
        d,
        graph: graph.clone(),
        p,
        operands,
        ws,
        check,
    };
    let searched = search(
        &mut bench,
        &mut Events(gpu),
        methods,
        SEARCH_RUNS,
        cancel,
        &mut || start.elapsed().as_secs_f64() > budget_s,
    )?;
    Ok(Found {
        searched,
        legacy,
        notes,
    })
}

/// What [`best_method`] found: the search, the legacy API's choice, and what could not be
/// listed.
pub(crate) struct Found {
    pub searched: Searched<Chosen>,
    pub legacy: Option<Algo>,
    pub notes: Vec<String>,
}

#[cfg(test)]
mod tests;
