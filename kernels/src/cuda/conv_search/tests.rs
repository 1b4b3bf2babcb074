//! The search's bookkeeping on a simulated device: each method's run advances the device's
//! clock by its cost, and the timer reads the clock.

use super::*;
use std::cell::Cell;
use std::rc::Rc;

/// How a simulated method behaves.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Sim {
    /// Runs and is right, costing this many seconds a run.
    Good(f64),
    /// cuDNN refuses it.
    Refused,
    /// Its numerics are excluded.
    Excluded,
    /// It needs this much workspace.
    Workspace(usize),
    /// Fails on its first run.
    Fails,
    /// Runs fast and is wrong.
    Wrong(f64),
    /// Its first run is interrupted.
    Interrupted,
}

struct Clock(Rc<Cell<f64>>);

impl Timer for Clock {
    type Error = CudaError;
    fn time(&mut self, work: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
        let t0 = self.0.get();
        work()?;
        Ok(self.0.get() - t0)
    }
}

struct SimBench {
    clock: Rc<Cell<f64>>,
    offered: usize,
    runs: Vec<&'static str>,
    prepared: usize,
}

impl Bench for SimBench {
    type Method = (&'static str, Sim);
    type Ready = (&'static str, Sim);

    fn prepare(&mut self, m: &Self::Method) -> Result<Self::Ready, Outcome> {
        self.prepared += 1;
        match m.1 {
            Sim::Refused => Err(Outcome::Refused("CUDNN_STATUS_NOT_SUPPORTED".into())),
            Sim::Excluded => Err(Outcome::Excluded("down-converts its inputs".into())),
            Sim::Workspace(n) if n > self.offered => Err(Outcome::Workspace(n)),
            _ => Ok(*m),
        }
    }

    fn run(&mut self, r: &Self::Ready) -> Result<(), CudaError> {
        self.runs.push(r.0);
        match r.1 {
            Sim::Good(c) | Sim::Wrong(c) => {
                self.clock.set(self.clock.get() + c);
                Ok(())
            }
            Sim::Workspace(_) => {
                self.clock.set(self.clock.get() + 5e-3);
                Ok(())
            }
            Sim::Fails => Err(CudaError::call(
                "cudnnBackendExecute",
                "CUDNN_STATUS_EXECUTION_FAILED",
            )),
            Sim::Interrupted => Err(CudaError::Interrupted),
            Sim::Refused | Sim::Excluded => unreachable!("never prepared"),
        }
    }

    fn check(&mut self, r: &Self::Ready) -> Result<(), String> {
        match r.1 {
            Sim::Wrong(_) => Err("element 7: GPU 3, reference 2".into()),
            _ => Ok(()),
        }
    }
}

fn bench() -> SimBench {
    SimBench {
        clock: Rc::new(Cell::new(0.0)),
        offered: 1 << 20,
        runs: Vec::new(),
        prepared: 0,
    }
}

fn run(
    b: &mut SimBench,
    methods: &[(&'static str, Sim)],
) -> Result<Searched<(&'static str, Sim)>, CudaError> {
    let list = methods.iter().map(|m| (m.0.to_string(), *m)).collect();
    let mut clock = Clock(b.clock.clone());
    search(b, &mut clock, list, 3, &AtomicBool::new(false), &mut || {
        false
    })
}

#[test]
fn the_fastest_correct_method_wins_and_every_other_says_why() {
    let mut b = bench();
    let s = run(
        &mut b,
        &[
            ("legacy IMPLICIT_PRECOMP_GEMM", Sim::Good(2e-3)),
            ("engine 0", Sim::Refused),
            ("engine 1", Sim::Good(1.5e-3)),
            ("engine 2", Sim::Excluded),
            ("engine 3", Sim::Workspace(2 << 20)),
            ("engine 4", Sim::Fails),
            ("engine 5", Sim::Wrong(0.1e-3)),
            ("engine 6", Sim::Good(1.8e-3)),
            ("engine 7", Sim::Workspace(1 << 19)),
        ],
    )
    .unwrap();
    let (ready, name, secs) = s.best.as_ref().unwrap();
    assert_eq!(ready.0, "engine 1");
    assert_eq!(name, "engine 1");
    assert!((secs - 1.5e-3).abs() < 1e-12, "{secs}");
    let outcome = |n: &str| {
        s.tried
            .iter()
            .find(|t| t.name == n)
            .unwrap()
            .outcome
            .clone()
    };
    assert!(matches!(outcome("engine 0"), Outcome::Refused(w) if w.contains("NOT_SUPPORTED")));
    assert!(matches!(outcome("engine 2"), Outcome::Excluded(_)));
    assert_eq!(outcome("engine 3"), Outcome::Workspace(2 << 20));
    assert!(matches!(outcome("engine 4"), Outcome::Failed(w) if w.contains("EXECUTION_FAILED")));
    // The wrong one is the fastest on the clock, but never timed nor chosen.
    assert!(matches!(outcome("engine 5"), Outcome::Wrong(w) if w.contains("element 7")));
    assert_eq!(s.seconds_of("engine 5"), None);
    // A method within the workspace offered runs.
    assert!(matches!(outcome("engine 7"), Outcome::Timed(_)));
    assert!((s.seconds_of("engine 6").unwrap() - 1.8e-3).abs() < 1e-12);
    assert_eq!(s.tried.len(), 9);
    assert_eq!(
        s.summary(),
        "9 methods: 4 timed, 1 refused, 1 excluded, 1 over the workspace, 1 failed, 1 wrong"
    );
    // A timed method runs once untimed and three times timed; a wrong one once; a refused,
    // excluded or oversized one never.
    let runs_of = |n: &str| b.runs.iter().filter(|r| **r == n).count();
    assert_eq!(runs_of("engine 1"), 4);
    assert_eq!(runs_of("engine 5"), 1);
    assert_eq!(runs_of("engine 4"), 1);
    assert_eq!(
        runs_of("engine 0") + runs_of("engine 2") + runs_of("engine 3"),
        0
    );
}

#[test]
fn a_method_listed_twice_is_tried_once() {
    // The heuristic's configurations come first and the global list repeats the engines
    // with default knobs: the same name is one method.
    let mut b = bench();
    let s = run(
        &mut b,
        &[
            ("engine 9", Sim::Good(1e-3)),
            ("engine 9", Sim::Good(1e-3)),
            ("engine 9 {3=2}", Sim::Good(0.9e-3)),
        ],
    )
    .unwrap();
    assert_eq!(s.tried.len(), 2);
    assert_eq!(b.prepared, 2);
    assert_eq!(s.best.unwrap().1, "engine 9 {3=2}");
}

#[test]
fn nothing_usable_is_no_choice_with_every_reason() {
    let mut b = bench();
    let s = run(
        &mut b,
        &[("engine 0", Sim::Refused), ("engine 1", Sim::Wrong(1e-3))],
    )
    .unwrap();
    assert!(s.best.is_none());
    assert_eq!(s.summary(), "2 methods: 1 refused, 1 wrong");
    let s = run(&mut b, &[]).unwrap();
    assert!(s.best.is_none() && s.tried.is_empty());
}

#[test]
fn an_interruption_ends_the_search() {
    let mut b = bench();
    let r = run(
        &mut b,
        &[
            ("engine 0", Sim::Good(1e-3)),
            ("engine 1", Sim::Interrupted),
            ("engine 2", Sim::Good(1e-4)),
        ],
    );
    assert!(matches!(r, Err(CudaError::Interrupted)));
    assert!(!b.runs.contains(&"engine 2"));
    // And a set flag stops it before the next method.
    let mut b = bench();
    let mut clock = Clock(b.clock.clone());
    let r = search(
        &mut b,
        &mut clock,
        vec![("engine 0".into(), ("engine 0", Sim::Good(1e-3)))],
        3,
        &AtomicBool::new(true),
        &mut || false,
    );
    assert!(matches!(r, Err(CudaError::Interrupted)));
    assert_eq!(b.prepared, 0);
}

#[test]
fn a_spent_budget_leaves_the_rest_untried_once_one_is_timed() {
    // The budget is spent from the start: the refused first method does not count, the
    // first timed one is kept, the rest are not tried.
    let mut b = bench();
    let list = [
        ("engine 0", Sim::Refused),
        ("engine 1", Sim::Good(2e-3)),
        ("engine 2", Sim::Good(1e-3)),
        ("engine 3", Sim::Good(0.5e-3)),
    ];
    let mut clock = Clock(b.clock.clone());
    let s = search(
        &mut b,
        &mut clock,
        list.iter().map(|m| (m.0.to_string(), *m)).collect(),
        3,
        &AtomicBool::new(false),
        &mut || true,
    )
    .unwrap();
    assert_eq!(s.best.as_ref().unwrap().1, "engine 1");
    assert_eq!(s.tried[2].outcome, Outcome::NotTried);
    assert_eq!(s.tried[3].outcome, Outcome::NotTried);
    assert_eq!(
        s.summary(),
        "4 methods: 1 timed, 1 refused, 2 not tried (search budget)"
    );
    assert!(!b.runs.contains(&"engine 2"));
}
