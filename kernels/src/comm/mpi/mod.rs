//! The MPI driver (cargo feature `mpi`): the world, its nodes, and the communication probes.
//!
//! Ranks on one host form the intra-node communicator (`MPI_Comm_split_type` shared; or, with
//! `ROOFLINE_FAKE_NODES=k`, k nodes of consecutive ranks so that one host exercises the
//! inter-node paths); the lowest rank of each node joins the inter-node communicator. Every
//! measurement starts with an arrival check on its communicator (the root waits at most
//! `--comm-timeout` for each rank and names the ones that never came) and runs under the
//! watchdog (a collective that never completes ends the run). Timing: a barrier, then each
//! iteration timed on every rank; the iteration's time is the maximum over ranks.

use super::watchdog;
use super::{expected, first_difference, iterations, send_data, sizes, Collective, Layout, Scope};
use mpi::collective::SystemOperation;
use mpi::ffi;
use mpi::raw::AsRaw;
use mpi::topology::{Color, SimpleCommunicator};
use mpi::traits::*;
use roofline_model::{Ceiling, CeilingKind, ClusterInfo, Curve, CurvePoint, PerIteration, Stats};
use std::ffi::{c_int, c_void};
use std::time::{Duration, Instant};

mod gpu_links;
mod links;
mod p2p;
mod probe;
mod reducer;
pub use links::{LinkConfig, LinkRun};
pub use p2p::P2p;
pub use probe::{CommConfig, CommResult, Point};
pub use reducer::reducers;

/// Why the MPI world or one of its communications failed.
#[derive(Debug, thiserror::Error)]
pub enum CommError {
    /// An MPI call returned an error code.
    #[error("{call} failed (MPI error {code})")]
    Call { call: String, code: c_int },
    /// The launch does not make a world this run can use (threading, teams, the environment).
    #[error("{0}")]
    Setup(String),
    /// A rank did not arrive in time: it died or stopped answering.
    #[error("{0}")]
    Timeout(String),
    /// A collective's or transfer's result was wrong on some rank.
    #[error("{0}")]
    WrongResult(String),
    #[error("NCCL: {0}")]
    Nccl(#[source] crate::cuda::CudaError),
    /// What went wrong on one rank during one operation of a sweep.
    #[error("{what}: rank {rank}: {source}")]
    OnRank {
        what: String,
        rank: usize,
        #[source]
        source: Box<CommError>,
    },
}

const TAG_ARRIVE: c_int = 7001;
const TAG_GO: c_int = 7002;
const TAG_DATA: c_int = 7003;
const TAG_ACK: c_int = 7004;

/// A communicator with the world ranks of its members.
struct Group {
    comm: SimpleCommunicator,
    members: Vec<usize>,
    scope: Scope,
}

impl Group {
    fn new(comm: SimpleCommunicator, world_rank: usize, scope: Scope) -> Group {
        let n = comm.size() as usize;
        let mut members = vec![0u64; n];
        comm.all_gather_into(&(world_rank as u64), &mut members[..]);
        Group {
            comm,
            members: members.into_iter().map(|m| m as usize).collect(),
            scope,
        }
    }

    fn rank(&self) -> usize {
        self.comm.rank() as usize
    }

    fn size(&self) -> usize {
        self.comm.size() as usize
    }
}

/// The MPI world of this run.
pub struct World {
    world: Group,
    intra: Group,
    inter: Option<Group>,
    /// The team of this rank when the world is split into teams (`form_teams`): the ranks that
    /// train one model of a bagged ensemble together.
    team: Option<Group>,
    pub rank: usize,
    pub size: usize,
    pub layout: Layout,
    pub hosts: Vec<String>,
    pub library: String,
    timeout: Duration,
    // Last: MPI_Finalize runs when the universe drops, after the communicators.
    _universe: mpi::environment::Universe,
}

/// The name of this process's node: Slurm's where Slurm started it (or the daemon that did:
/// `launch`), else MPI's processor name (the host name).
fn host(launch: Option<&super::Launch>) -> String {
    launch
        .and_then(|l| l.node_name.clone())
        .unwrap_or_else(|| mpi::environment::processor_name().unwrap_or_else(|_| "?".into()))
}

impl World {
    /// Initialises MPI (call only under a launcher: see `super::launched_ranks`).
    pub fn init(timeout: Duration) -> Result<World, CommError> {
        let fake = super::fake_nodes_from_env().map_err(CommError::Setup)?;
        // Serialized: MPI calls come from one thread at a time, not necessarily the main one
        // (the trainer runs its loop on a pinned worker thread).
        let (universe, provided) = mpi::initialize_with_threading(mpi::Threading::Serialized)
            .ok_or_else(|| CommError::Setup("MPI was already initialised".into()))?;
        if provided < mpi::Threading::Serialized {
            return Err(CommError::Setup(format!(
                "the MPI library offers only {provided:?} threading; roofline needs Serialized"
            )));
        }
        let world = universe.world();
        let rank = world.rank() as usize;
        let size = world.size() as usize;
        // Tasks that srun started without a PMI(x) server for MPI are each a world of one.
        let launch = super::Launch::here();
        if let Some(l) = launch.as_ref().filter(|l| l.size != size) {
            return Err(CommError::Setup(format!(
                "{} started {} ranks but MPI sees a world of {size}: each rank ran alone{}",
                l.by.as_str(),
                l.size,
                if l.by == super::LaunchedBy::Srun {
                    " (srun --mpi=pmix, or MpiDefault=pmix in slurm.conf; `srun --mpi=list` names the plugins this Slurm has)"
                } else {
                    " (was the binary built against another MPI than the launcher's?)"
                }
            )));
        }
        // Every rank's host name, fixed 256-byte records.
        let mut name = [0u8; 256];
        let h = host(launch.as_ref());
        let n = h.len().min(255);
        name[..n].copy_from_slice(&h.as_bytes()[..n]);
        let mut all = vec![0u8; 256 * size];
        world.all_gather_into(&name[..], &mut all[..]);
        let hosts: Vec<String> = all
            .chunks(256)
            .map(|c| {
                String::from_utf8_lossy(&c[..c.iter().position(|b| *b == 0).unwrap_or(256)])
                    .into_owned()
            })
            .collect();
        let layout = match fake {
            Some(k) => Layout::new(&hosts, Some(k)),
            None => {
                // Nodes as MPI sees shared memory: each rank learns its node's lowest rank.
                let shared = world.split_shared(rank as c_int);
                let mut leader = rank as u64;
                shared.process_at_rank(0).broadcast_into(&mut leader);
                let mut leaders = vec![0u64; size];
                world.all_gather_into(&leader, &mut leaders[..]);
                let mut order: Vec<u64> = leaders.clone();
                order.sort_unstable();
                order.dedup();
                Layout {
                    node_of: leaders
                        .iter()
                        .map(|l| order.iter().position(|o| o == l).unwrap_or(0))
                        .collect(),
                    fake: false,
                }
            }
        };
        let node = layout.node_of[rank];
        let intra_comm = world
            .split_by_color_with_key(Color::with_value(node as c_int), rank as c_int)
            .ok_or_else(|| {
                CommError::Setup("MPI_Comm_split (intra-node) returned no communicator".into())
            })?;
        let leader = layout.leaders().contains(&rank);
        let inter_comm = world.split_by_color_with_key(
            if leader {
                Color::with_value(0)
            } else {
                Color::undefined()
            },
            rank as c_int,
        );
        let library = mpi::environment::library_version()
            .unwrap_or_default()
            .lines()
            .next()
            .unwrap_or("")
            .trim_matches(|c: char| c.is_whitespace() || c == '\0')
            .to_string();
        watchdog::start(timeout, format!("rank {rank} ({})", hosts[rank]));
        let world_group = Group::new(world, rank, Scope::World);
        let intra = Group::new(intra_comm, rank, Scope::Intra);
        let inter = inter_comm.map(|c| Group::new(c, rank, Scope::Inter));
        Ok(World {
            world: world_group,
            intra,
            inter,
            team: None,
            rank,
            size,
            layout,
            hosts,
            library,
            timeout,
            _universe: universe,
        })
    }

    pub fn is_root(&self) -> bool {
        self.rank == 0
    }

    /// The lowest rank of its node: it probes the node's CPU and GPUs.
    pub fn is_leader(&self) -> bool {
        self.intra.rank() == 0
    }

    pub fn node(&self) -> usize {
        self.layout.node_of[self.rank]
    }

    pub fn cluster_info(&self) -> ClusterInfo {
        let nodes = self.layout.nodes();
        ClusterInfo {
            ranks: self.size,
            nodes,
            ranks_per_node: (0..nodes).map(|n| self.layout.ranks_on(n).len()).collect(),
            hosts: (0..nodes)
                .map(|n| {
                    self.layout
                        .ranks_on(n)
                        .first()
                        .map(|r| self.hosts[*r].clone())
                        .unwrap_or_default()
                })
                .collect(),
            mpi_library: self.library.clone(),
            fake_nodes: self.layout.fake,
            launcher: super::Launch::here(),
        }
    }

    /// A barrier on the whole world that sleeps while it waits (ranks that wait for the node
    /// leaders' CPU probe must not take the cores it measures), under the watchdog.
    pub fn wait_all(&self, label: &str) {
        relaxed_barrier(&self.world.comm, label, None);
    }

    /// Like `wait_all`, without a deadline: for waits as long as another rank's CPU probe.
    pub fn wait_unbounded(&self) {
        let mut req = self.world.comm.immediate_barrier();
        loop {
            match req.test() {
                Ok(_) => break,
                Err(r) => {
                    req = r;
                    std::thread::sleep(Duration::from_millis(2));
                }
            }
        }
    }

    /// The CPUs the node's ranks may run on, together (each rank's affinity as the launcher
    /// bound it, gathered over the node): with pretend nodes on one host, a node's own cores.
    pub fn node_allowed_cpus(&self) -> Vec<usize> {
        const WORDS: usize = 16;
        let mut mine = [0u64; WORDS];
        for c in crate::affinity::allowed_cpus() {
            if c < 64 * WORDS {
                mine[c / 64] |= 1 << (c % 64);
            }
        }
        let mut all = vec![0u64; WORDS * self.intra.size()];
        self.intra.comm.all_gather_into(&mine[..], &mut all[..]);
        (0..64 * WORDS)
            .filter(|c| all.chunks(WORDS).any(|m| m[c / 64] & (1 << (c % 64)) != 0))
            .collect()
    }

    /// The logical OR of `flag` over every rank (e.g. "did any rank fail?").
    pub fn any(&self, flag: bool) -> bool {
        let mut out = 0u8;
        self.world
            .comm
            .all_reduce_into(&(flag as u8), &mut out, SystemOperation::max());
        out != 0
    }

    /// Gathers every node leader's bytes on the root (in node order); other ranks get `None`.
    pub fn gather_from_leaders(&self, bytes: &[u8]) -> Option<Vec<Vec<u8>>> {
        let inter = self.inter.as_ref()?;
        let n = inter.size();
        let len = bytes.len() as u64;
        let mut lens = vec![0u64; n];
        inter.comm.all_gather_into(&len, &mut lens[..]);
        let total: u64 = lens.iter().sum();
        let mut all = vec![0u8; total as usize];
        let counts: Vec<c_int> = lens.iter().map(|l| *l as c_int).collect();
        let displs: Vec<c_int> = counts
            .iter()
            .scan(0, |acc, c| {
                let d = *acc;
                *acc += c;
                Some(d)
            })
            .collect();
        {
            let mut partition =
                mpi::datatype::PartitionMut::new(&mut all[..], &counts[..], &displs[..]);
            inter.comm.all_gather_varcount_into(bytes, &mut partition);
        }
        if !self.is_root() {
            return None;
        }
        let mut out = Vec::with_capacity(n);
        for (c, d) in counts.iter().zip(&displs) {
            out.push(all[*d as usize..(*d + *c) as usize].to_vec());
        }
        Some(out)
    }

    /// Splits the world into `teams` teams of consecutive ranks, `size / teams` each (world
    /// ranks `t·P .. (t + 1)·P` form team t). Collective: every rank calls it.
    pub fn form_teams(&mut self, teams: usize) -> Result<(), CommError> {
        if teams == 0 || !self.size.is_multiple_of(teams) {
            return Err(CommError::Setup(format!(
                "{} ranks do not split into {teams} equal teams",
                self.size
            )));
        }
        let per = self.size / teams;
        self.split_teams(self.rank / per)
    }

    /// Splits the world into teams by `color`: the ranks that give the same color form a team
    /// (in world order), of any sizes. Collective: every rank calls it.
    pub fn split_teams(&mut self, color: usize) -> Result<(), CommError> {
        let comm = self
            .world
            .comm
            .split_by_color_with_key(Color::with_value(color as c_int), self.rank as c_int)
            .ok_or_else(|| {
                CommError::Setup("MPI_Comm_split (teams) returned no communicator".into())
            })?;
        self.team = Some(Group::new(comm, self.rank, Scope::World));
        Ok(())
    }

    fn team(&self) -> &Group {
        self.team.as_ref().unwrap_or(&self.world)
    }

    /// This rank's place in its team (the world's when not split).
    pub fn team_rank(&self) -> usize {
        self.team().rank()
    }

    pub fn team_size(&self) -> usize {
        self.team().size()
    }

    /// Nodes the team's ranks are on.
    pub fn team_nodes(&self) -> usize {
        let mut nodes: Vec<usize> = self
            .team()
            .members
            .iter()
            .map(|&r| self.layout.node_of[r])
            .collect();
        nodes.sort_unstable();
        nodes.dedup();
        nodes.len()
    }

    /// Element-wise sums over the team, in place.
    pub fn team_sum_f64(&self, v: &mut [f64]) {
        let src = v.to_vec();
        self.team()
            .comm
            .all_reduce_into(&src[..], v, SystemOperation::sum());
    }

    pub fn team_sum_f32(&self, v: &mut [f32]) {
        let src = v.to_vec();
        self.team()
            .comm
            .all_reduce_into(&src[..], v, SystemOperation::sum());
    }

    /// `exchange_u16` between team ranks `to` and `from`.
    pub fn team_exchange_u16(&self, to: usize, send: &[u16], from: usize, recv: &mut [u16]) {
        let c = &self.team().comm;
        mpi::point_to_point::send_receive_into(
            send,
            &c.process_at_rank(to as i32),
            recv,
            &c.process_at_rank(from as i32),
        );
    }

    /// Element-wise sum over every rank, in place (data-parallel training).
    pub fn sum_f64(&self, v: &mut [f64]) {
        let src = v.to_vec();
        self.world
            .comm
            .all_reduce_into(&src[..], v, SystemOperation::sum());
    }

    pub fn sum_f32(&self, v: &mut [f32]) {
        let src = v.to_vec();
        self.world
            .comm
            .all_reduce_into(&src[..], v, SystemOperation::sum());
    }

    /// Sends `send` to rank `to` and receives `recv.len()` values from rank `from` in one
    /// MPI_Sendrecv (deadlock-free in a ring).
    pub fn exchange_u16(&self, to: usize, send: &[u16], from: usize, recv: &mut [u16]) {
        let c = &self.world.comm;
        mpi::point_to_point::send_receive_into(
            send,
            &c.process_at_rank(to as i32),
            recv,
            &c.process_at_rank(from as i32),
        );
    }

    /// Ends every rank of the job (after a message on this rank).
    pub fn abort(&self, code: i32) -> ! {
        self.world.comm.abort(code)
    }

    /// Broadcasts bytes from the root to every rank.
    pub fn broadcast_bytes(&self, bytes: &mut Vec<u8>) {
        let mut len = bytes.len() as u64;
        self.world.comm.process_at_rank(0).broadcast_into(&mut len);
        bytes.resize(len as usize, 0);
        self.world
            .comm
            .process_at_rank(0)
            .broadcast_into(&mut bytes[..]);
    }
}

/// MPI_Ibarrier, polled with short sleeps, under the watchdog.
fn relaxed_barrier(comm: &SimpleCommunicator, label: &str, _timeout: Option<Duration>) {
    watchdog::arm(&format!("the barrier before {label}"));
    let mut req = comm.immediate_barrier();
    loop {
        match req.test() {
            Ok(_) => break,
            Err(r) => {
                req = r;
                std::thread::sleep(Duration::from_micros(500));
            }
        }
    }
    watchdog::disarm();
}

fn check_rc(call: &str, rc: c_int) -> Result<(), CommError> {
    if rc == 0 {
        Ok(())
    } else {
        Err(CommError::Call {
            call: call.into(),
            code: rc,
        })
    }
}

/// Blocking send of `buf` (bytes) to `peer` on `comm`, its status checked.
fn send_bytes(comm: ffi::MPI_Comm, buf: &[u8], peer: c_int, tag: c_int) -> Result<(), CommError> {
    // SAFETY: `buf` outlives the blocking call; its length fits in c_int (≤ 8 bytes here).
    check_rc("MPI_Send", unsafe {
        ffi::MPI_Send(
            buf.as_ptr() as *const c_void,
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            peer,
            tag,
            comm,
        )
    })
}

/// Blocking receive of exactly `buf.len()` bytes from `peer`.
fn recv_bytes(
    comm: ffi::MPI_Comm,
    buf: &mut [u8],
    peer: c_int,
    tag: c_int,
) -> Result<(), CommError> {
    // SAFETY: as `send_bytes`.
    check_rc("MPI_Recv", unsafe {
        ffi::MPI_Recv(
            buf.as_mut_ptr() as *mut c_void,
            buf.len() as c_int,
            ffi::RSMPI_UINT8_T,
            peer,
            tag,
            comm,
            ffi::RSMPI_STATUS_IGNORE,
        )
    })
}

/// Whether a message from `peer` with `tag` is waiting (MPI_Iprobe).
fn pending(comm: ffi::MPI_Comm, peer: c_int, tag: c_int) -> Result<bool, CommError> {
    let mut flag: c_int = 0;
    // SAFETY: out-parameter; the status is ignored.
    check_rc("MPI_Iprobe", unsafe {
        ffi::MPI_Iprobe(peer, tag, comm, &mut flag, ffi::RSMPI_STATUS_IGNORE)
    })?;
    Ok(flag != 0)
}

/// Every member shows up for `label`, or the root names the ones that did not.
fn arrival(g: &Group, label: &str, timeout: Duration) -> Result<(), CommError> {
    arrival_named(g, label, timeout, &|r| format!("rank {r}"))
}

/// `arrival`, naming a world rank with `name` in the messages.
fn arrival_named(
    g: &Group,
    label: &str,
    timeout: Duration,
    name: &dyn Fn(usize) -> String,
) -> Result<(), CommError> {
    if let Ok(r) = std::env::var("ROOFLINE_TEST_STALL_RANK") {
        // Test hook: this rank stops answering (as a hung rank would); `R@PREFIX` only at an
        // operation whose label starts with PREFIX.
        let (rank, at) = r.split_once('@').unwrap_or((r.as_str(), ""));
        if rank.trim().parse::<usize>().ok() == Some(g.members[g.rank()]) && label.starts_with(at) {
            eprintln!(
                "roofline: rank {} stalls on purpose (ROOFLINE_TEST_STALL_RANK)",
                g.members[g.rank()]
            );
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
    }
    let n = g.size();
    if n <= 1 {
        return Ok(());
    }
    let comm = g.comm.as_raw();
    let deadline = Instant::now() + timeout;
    let mut byte = 1u8;
    // One-byte messages on this communicator, with tags no other code uses.
    if g.rank() == 0 {
        let mut missing: Vec<usize> = (1..n).collect();
        while !missing.is_empty() {
            let mut still = Vec::new();
            for &p in &missing {
                if pending(comm, p as c_int, TAG_ARRIVE)? {
                    recv_bytes(
                        comm,
                        std::slice::from_mut(&mut byte),
                        p as c_int,
                        TAG_ARRIVE,
                    )?;
                } else {
                    still.push(p);
                }
            }
            missing = still;
            if !missing.is_empty() {
                if Instant::now() > deadline {
                    let names: Vec<String> = missing.iter().map(|p| name(g.members[*p])).collect();
                    return Err(CommError::Timeout(format!(
                        "{} did not reach {label} within {:.0} s (it died or stopped answering; raise the limit with --comm-timeout)",
                        names.join(", "),
                        timeout.as_secs_f64()
                    )));
                }
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        for p in 1..n {
            send_bytes(comm, std::slice::from_ref(&byte), p as c_int, TAG_GO)?;
        }
    } else {
        // A member waits twice as long as the root: the root, which may reach the check later
        // (it writes what was measured before a round), is the one that names the missing; a
        // member gives up only when the root itself is gone.
        let patience = 2 * timeout;
        let deadline = Instant::now() + patience;
        send_bytes(comm, std::slice::from_ref(&byte), 0, TAG_ARRIVE)?;
        loop {
            if pending(comm, 0, TAG_GO)? {
                break;
            }
            if Instant::now() > deadline {
                return Err(CommError::Timeout(format!(
                    "{} (the root of this {} communicator) did not answer before {label} within {:.0} s",
                    name(g.members[0]),
                    g.scope.name(),
                    patience.as_secs_f64()
                )));
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        recv_bytes(comm, std::slice::from_mut(&mut byte), 0, TAG_GO)?;
    }
    Ok(())
}

fn human(bytes: usize) -> String {
    crate::probe::cpu::human_bytes(bytes as f64)
}
