//! The ranks of a training run: under mpirun the MPI world as the trainer's reducer (data
//! parallel), split into teams when bagging (`score --bagging`); without a launcher a single
//! process.

use super::RunError;
use crate::layers::Reducer;
use std::sync::Arc;

/// Under mpirun: the MPI world as the trainer's reducer (data parallel), and whether this rank
/// reports; otherwise a single process.
#[allow(clippy::type_complexity)]
pub fn reducer(batch: usize) -> Result<(Option<Arc<dyn Reducer>>, bool), RunError> {
    let r = ranks(batch, None)?;
    Ok((r.world, r.root))
}

/// The ranks of a run: the world's reducer, and with bagging (`models`) the reducer of this
/// rank's team (the ranks that train its model together) and the plan.
pub struct Ranks {
    pub world: Option<Arc<dyn Reducer>>,
    pub team: Option<Arc<dyn Reducer>>,
    pub root: bool,
    pub plan: Option<crate::bagging::Plan>,
}

/// Under mpirun: the MPI world (split into `models` teams when bagging) as the trainer's
/// reducers; otherwise a single process (whose bagged models share its cores).
pub fn ranks(batch: usize, models: Option<usize>) -> Result<Ranks, RunError> {
    use crate::bagging::Plan;
    let input = RunError::Input;
    let Some(n) = roofline_kernels::comm::launched_ranks() else {
        let plan = match models {
            Some(m) => Some(Plan::new(m, 1, batch).map_err(|e| input(e.to_string()))?),
            None => None,
        };
        return Ok(Ranks {
            world: None,
            team: None,
            root: true,
            plan,
        });
    };
    #[cfg(feature = "mpi")]
    {
        let _ = n;
        let mut world =
            roofline_kernels::comm::mpi::World::init(std::time::Duration::from_secs(600))
                .map_err(|e| RunError::Input(format!("MPI: {e}")))?;
        let plan = match models {
            Some(m) => {
                let plan = Plan::new(m, world.size, batch).map_err(|e| input(e.to_string()))?;
                world
                    .form_teams(m)
                    .map_err(|e| input(format!("MPI: {e}")))?;
                Some(plan)
            }
            None => {
                if !batch.is_multiple_of(world.size) {
                    return Err(input(format!(
                        "--batch {batch} does not divide among {} ranks",
                        world.size
                    )));
                }
                None
            }
        };
        let root = world.is_root();
        let (w, team) = roofline_kernels::comm::mpi::reducers(world, plan.is_some());
        Ok(Ranks {
            world: Some(w),
            team,
            root,
            plan,
        })
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = (batch, models);
        Err(RunError::Input(format!(
            "started by an MPI launcher with {n} ranks, but this roofline was built without MPI: rebuild it with `cargo build --release --features mpi`, or run it without mpirun"
        )))
    }
}

/// Runs `f` with the timeline recording when `trace` names a file, then writes the timeline
/// there as Chrome trace JSON: every rank its own (rank 0 to FILE, rank r to FILE.r).
pub fn traced<T>(
    trace: Option<&std::path::Path>,
    rank: usize,
    verb: &str,
    f: impl FnOnce() -> T,
) -> Result<T, RunError> {
    let Some(t) = trace else {
        return Ok(f());
    };
    roofline_collectors::timeline::start();
    let out = f();
    let spans = roofline_collectors::timeline::stop();
    let path = if rank == 0 {
        t.to_path_buf()
    } else {
        std::path::PathBuf::from(format!("{}.{rank}", t.display()))
    };
    let j = roofline_collectors::timeline::chrome_trace(
        &spans,
        rank,
        &format!("roofline {verb} (rank {rank})"),
    );
    roofline_model::write::write_atomic(&path, j.to_string().as_bytes())
        .map_err(|e| RunError::Input(e.to_string()))?;
    Ok(out)
}

/// What `roofline train` reports on the reporting rank.
pub struct Trained {
    pub summary: crate::train::Summary,
    /// The GPU's name, when it trained on one.
    pub gpu: Option<String>,
    /// The energy of this rank's steps after the first: its CPU packages' counters and, on a
    /// GPU, NVML's energy counter (`measured: false` and why, where there is no meter).
    pub energy: roofline_model::placement::Energy,
    /// Joules per image of this rank's share of the batch, from `energy`.
    pub joules_per_image: Option<f64>,
}

/// `roofline train` as one library call: `prep` run on this process or, under a launcher, data
/// parallel over the MPI world, its timeline written to `trace` when asked, its energy measured
/// over the steps after the first. None on the ranks that do not report.
pub fn train(
    prep: &super::Prepared,
    monitor: &(dyn crate::train::Monitor + Sync),
    trace: Option<&std::path::Path>,
) -> Result<Option<Trained>, RunError> {
    let (reducer, root) = reducer(prep.batch())?;
    let rank = reducer.as_ref().map_or(0, |r| r.rank());
    let ranks = reducer.as_ref().map_or(1, |r| r.ranks());
    let cuda = prep.spec.device == super::Device::Cuda;
    let step = |s: usize, n: usize, l: f64, i: f64| monitor.step(s, n, l, i);
    let metered = super::execute::EnergyAfter::new(1, (cuda, prep.spec.gpu), &step);
    let (summary, gpu) = traced(trace, rank, "train", || {
        super::execute(prep, &metered, reducer)
    })??;
    let (reading, note) = metered.stop(&summary.timing);
    let steady = summary.timing.len().saturating_sub(1);
    let mut energy =
        roofline_collectors::energy::per_step(&reading, steady, "over the steps after the first");
    if let Some(n) = note {
        energy.note = format!("{}; {n}", energy.note);
    }
    let share = (prep.batch() / ranks).max(1) as f64;
    let joules_per_image = energy.joules_per_step.map(|j| j / share);
    Ok(root.then_some(Trained {
        summary,
        gpu,
        energy,
        joules_per_image,
    }))
}
