//! The MPI world as the trainer's gradient reducer.

use super::World;
use crate::comm::Reducer;
use std::sync::Arc;

/// The world as the trainer's reducer (data parallel over every rank), and with `teams` (the
/// world split by `World::form_teams`) this rank's team as another.
pub fn reducers(world: World, teams: bool) -> (Arc<dyn Reducer>, Option<Arc<dyn Reducer>>) {
    // Shared by the world's and the team's reducer, which are Send and Sync under the
    // serialized-MPI contract below (`MpiReducer`).
    #[allow(clippy::arc_with_non_send_sync)]
    let world = Arc::new(world);
    let team = teams.then(|| {
        Arc::new(MpiReducer {
            world: Arc::clone(&world),
            team: true,
        }) as Arc<dyn Reducer>
    });
    (Arc::new(MpiReducer { world, team: false }), team)
}

/// The MPI world, or this rank's team of it, as a reducer.
struct MpiReducer {
    world: Arc<World>,
    team: bool,
}

// SAFETY: MPI is initialised with MPI_THREAD_SERIALIZED and the trainer calls the reducer from
// one thread at a time, never concurrently: on the CPU from the gradient exchange's thread only
// (`workloads::exchange`), on GPUs from the training loop.
unsafe impl Send for MpiReducer {}
unsafe impl Sync for MpiReducer {}

impl Reducer for MpiReducer {
    fn ranks(&self) -> usize {
        if self.team {
            self.world.team_size()
        } else {
            self.world.size
        }
    }
    fn rank(&self) -> usize {
        if self.team {
            self.world.team_rank()
        } else {
            self.world.rank
        }
    }
    fn sum_f64(&self, v: &mut [f64]) {
        if self.team {
            self.world.team_sum_f64(v)
        } else {
            self.world.sum_f64(v)
        }
    }
    fn sum_f32(&self, v: &mut [f32]) {
        if self.team {
            self.world.team_sum_f32(v)
        } else {
            self.world.sum_f32(v)
        }
    }
    fn exchange_u16(&self, to: usize, send: &[u16], from: usize, recv: &mut [u16]) {
        if self.team {
            self.world.team_exchange_u16(to, send, from, recv)
        } else {
            self.world.exchange_u16(to, send, from, recv)
        }
    }
    fn nodes(&self) -> usize {
        if self.team {
            self.world.team_nodes()
        } else {
            self.world.cluster_info().nodes
        }
    }
}
