//! AutoML under an MPI launcher: rank 0 is the master (it checks the request, calibrates,
//! makes the shared buffer and runs the search); the other ranks form teams of `--team`
//! ranks, each team a worker that trains its candidates data parallel (synchronous all-reduce
//! inside the team). Master and workers speak through the shared buffer's folder, so the ranks
//! must share a file system (as AIPerf's nodes do).

use crate::buffer::Link;
use crate::master::{self, buffer_dir, Progress};
use crate::setup::{self, Calibration, Request};
use crate::worker;
use roofline_kernels::comm::mpi::{reducers, World};
use roofline_model::automl::Automl;
use roofline_workloads::run::RunError;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

/// The run on this rank: the document and the calibration on rank 0, None on a worker rank.
pub fn run(
    req: &Request,
    progress: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<Option<(Automl, Calibration)>, RunError> {
    let mut world =
        World::init(Duration::from_secs(600)).map_err(|e| RunError::Input(format!("MPI: {e}")))?;
    let (size, rank, per) = (world.size, world.rank, req.team.max(1));
    if size < 2 || !(size - 1).is_multiple_of(per) {
        // Every rank sees the same sizes: none waits for another.
        return if rank == 0 {
            Err(RunError::Input(format!(
                "automl under MPI: rank 0 is the master and the other {} rank(s) form teams of --team {per}: give 1 + a multiple of {per} ranks",
                size - 1
            )))
        } else {
            Ok(None)
        };
    }
    let teams = (size - 1) / per;
    // Rank 0 checks, calibrates and makes a fresh buffer; every worker rank reads its data.
    let master = (rank == 0).then(|| {
        setup::settings(req, Some(teams)).and_then(|(s, cal)| {
            buffer_dir(&s.out).create().map_err(|e| {
                RunError::Input(format!("the shared buffer beside {}: {e}", s.out.display()))
            })?;
            Ok((s, cal))
        })
    });
    let context = (rank > 0).then(|| setup::worker_context(req));
    let failed = matches!(master, Some(Err(_))) || matches!(context, Some(Err(_)));
    if world.any(failed) {
        return match (master, context) {
            (Some(Err(e)), _) => Err(e),
            (Some(Ok(_)), _) => Err(RunError::Run(
                "a worker rank could not start (it said why on its own stderr)".into(),
            )),
            (None, Some(Err(e))) => {
                eprintln!("roofline: rank {rank}: {e}");
                Ok(None)
            }
            (None, _) => Ok(None),
        };
    }
    world
        .split_teams(if rank == 0 { 0 } else { 1 + (rank - 1) / per })
        .map_err(|e| RunError::Input(format!("MPI: {e}")))?;
    let (_world, team) = reducers(world, true);
    match (master, context) {
        (Some(Ok((s, cal))), _) => {
            progress.line(&format!(
                "{teams} worker(s), teams of {per} MPI rank(s); one step of the starting network {:.2} s on the master's cores, its first trial about {:.0} s; budget {:.0} s",
                cal.step_seconds,
                cal.trial_seconds,
                s.budget.as_secs_f64()
            ));
            Ok(Some((master::automl(&s, progress, cancel)?, cal)))
        }
        (_, Some(Ok((cx, cpus)))) => {
            let id = (rank - 1) / per;
            let link = Link::new(buffer_dir(&req.out), id, team);
            let pool = roofline_kernels::affinity::pinned_pool(&cpus).map_err(|source| {
                RunError::Threads {
                    threads: cpus.len(),
                    source,
                }
            })?;
            worker::work(id, &link, &cx, Some(&pool)).map_err(RunError::Run)?;
            Ok(None)
        }
        _ => Ok(None),
    }
}
