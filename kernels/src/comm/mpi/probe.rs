//! The communication probes on the MPI world: every collective swept over message sizes on the
//! intra-node, inter-node and world communicators (and NCCL's, where GPUs are), point-to-point
//! pairs and one-sided windows; each size's time the maximum over ranks, each result checked.

use super::p2p::p2p_pair;
use super::*;
use roofline_model::ceiling_id::{CommLib, P2pMetric, Tier};
use roofline_model::CeilingId;

impl World {
    /// Runs the communication probes on every rank; the root's result holds the ceilings.
    pub fn comm_probe(
        &self,
        cfg: &CommConfig,
        progress: &dyn crate::probe::Progress,
    ) -> Result<CommResult, CommError> {
        let mut out = CommResult::default();
        let sizes_swept = sizes(cfg.max_size);
        let nodes = self.layout.nodes();
        let mut steps = 0;
        if self.intra.size() > 1 {
            steps += Collective::ALL.len() + 1;
        }
        if nodes > 1 {
            steps += Collective::ALL.len() + 1;
        }
        steps += Collective::ALL.len();
        progress.begin(steps as u64);
        // Intra-node: every node at once (the root reports node 0's).
        for (group, what) in [
            (Some(&self.intra), Scope::Intra),
            (self.inter.as_ref(), Scope::Inter),
            (Some(&self.world), Scope::World),
        ] {
            let active = match what {
                Scope::Intra => self.intra.size() > 1,
                Scope::Inter => nodes > 1,
                Scope::World => self.size > 1,
            };
            if !active {
                continue;
            }
            if let Some(g) = group {
                for c in Collective::ALL {
                    progress.advance(&format!("{} {}", c.name(), what.name()));
                    let points = sweep(
                        g,
                        &mut Mpi(g),
                        c.name(),
                        c,
                        &sizes_swept,
                        cfg.quick,
                        self.timeout,
                    )?;
                    if self.is_root() {
                        out.add_collective(
                            CommLib::Mpi,
                            c,
                            what,
                            g.size(),
                            &points,
                            &format!("MPI, {}", self.library),
                            nodes,
                            "host memory",
                        );
                    }
                }
                if what != Scope::World {
                    progress.advance(&format!("p2p {}", what.name()));
                    if let Some(points) = p2p_pair(g, &sizes_swept, cfg.quick, self.timeout)? {
                        if self.is_root() {
                            out.add_p2p(what, &points, &self.library);
                        }
                    }
                }
            }
            // Ranks outside this scope's communicator (inter: non-leaders) wait here.
            self.wait_all(&format!("the end of the {} measurements", what.name()));
        }
        self.nccl_probe(&sizes_swept, cfg, progress, &mut out)?;
        if self.is_root() {
            if self.intra.size() <= 1 {
                out.notes.push("one rank on node 0: no intra-node communication measured (run more ranks per node)".into());
            }
            if nodes <= 1 {
                out.notes
                    .push("one node: no inter-node communication measured".into());
            }
        }
        Ok(out)
    }
}

impl World {
    /// One step of NCCL's setup that every rank must pass: a rank that failed says why on its
    /// stderr, all agree, and where any failed the root notes it (`root_what` with its own
    /// error, or `other` for another rank's) and every rank gets `None`.
    fn agreed<T>(
        &self,
        r: Result<T, crate::cuda::CudaError>,
        root_what: &str,
        other: &str,
        out: &mut CommResult,
    ) -> Option<T> {
        if let Err(e) = &r {
            eprintln!("roofline: rank {}: NCCL: {e}", self.rank);
        }
        if !self.any(r.is_err()) {
            return r.ok();
        }
        if self.is_root() {
            out.notes.push(match &r {
                Err(e) => format!("no NCCL measured: {root_what}: {e}"),
                Ok(_) => format!("no NCCL measured: {other} (its error is on its stderr)"),
            });
        }
        None
    }

    /// NCCL over the whole world, one rank per GPU, when every rank has a GPU and NCCL.
    fn nccl_probe(
        &self,
        sizes_swept: &[usize],
        cfg: &CommConfig,
        progress: &dyn crate::probe::Progress,
        out: &mut CommResult,
    ) -> Result<(), CommError> {
        use crate::comm::nccl;
        let local_rank = self.intra.rank();
        let local_size = self.intra.size();
        let gpus = crate::cuda::device::init().unwrap_or(0);
        // The GPU of this rank: local rank modulo the GPUs it sees. Where the launcher gives
        // every rank one GPU of its own (Slurm's --gpus-per-task, CUDA_VISIBLE_DEVICES per
        // rank), each sees one GPU as ordinal 0; where every rank sees all of them, each takes
        // its own. More ranks than GPUs on a node with several visible would put two ranks on
        // one GPU, which NCCL refuses.
        let ordinal = local_rank % gpus.max(1);
        let mut mine = if gpus == 0 {
            Err(format!("rank {} sees no GPU", self.rank))
        } else if gpus > 1 && local_size > gpus {
            Err(format!(
                "{local_size} ranks on rank {}'s node share {gpus} GPUs; NCCL needs one GPU per rank (start at most {gpus} ranks per node, or give each rank its own GPU)",
                self.rank
            ))
        } else {
            nccl::available().map_err(|e| e.to_string())
        };
        // Ranks that each see one GPU may still see the same one (no CUDA_VISIBLE_DEVICES per
        // rank): NCCL would refuse it in ncclCommInitRank. Compared by UUID on each node.
        let uuid = match &mine {
            Ok(()) => crate::probe::gpu::uuids()
                .ok()
                .and_then(|u| u.get(ordinal).cloned())
                .unwrap_or_default(),
            Err(_) => String::new(),
        };
        let mut key = [0u8; 64];
        for (k, b) in key.iter_mut().zip(uuid.bytes()) {
            *k = b;
        }
        let mut all = vec![0u8; 64 * local_size];
        self.intra.comm.all_gather_into(&key[..], &mut all[..]);
        let keys: Vec<[u8; 64]> = all
            .chunks(64)
            .map(|c| std::array::from_fn(|i| c[i]))
            .collect();
        if let (Ok(()), Some((a, b))) = (&mine, crate::comm::shared_gpu(&keys)) {
            mine = Err(format!(
                "local ranks {a} and {b} of rank {}'s node see the same GPU ({uuid}); NCCL needs one GPU per rank: give each rank its own (CUDA_VISIBLE_DEVICES per rank, or srun --gpus-per-task=1)",
                self.rank
            ));
        }
        if self.any(mine.is_err()) {
            if self.is_root() {
                out.notes.push(match mine {
                    Err(why) => format!("no NCCL measured: {why}"),
                    Ok(()) => {
                        "no NCCL measured: some ranks have no GPU of their own or no NCCL".into()
                    }
                });
            }
            return Ok(());
        }
        let log = std::env::temp_dir().join(format!("roofline-nccl-{}.%h.%p", std::process::id()));
        nccl::log_tuning_to(&log);
        // The root's unique id, or nothing when NCCL could not give one: every rank learns it
        // from the broadcast (an empty id), so none is left waiting.
        let mut id_error = None;
        let mut id = if self.is_root() {
            match nccl::unique_id() {
                Ok(id) => id.to_vec(),
                Err(e) => {
                    id_error = Some(e);
                    Vec::new()
                }
            }
        } else {
            Vec::new()
        };
        self.broadcast_bytes(&mut id);
        if id.is_empty() {
            if let Some(e) = id_error {
                out.notes
                    .push(format!("no NCCL measured: ncclGetUniqueId on rank 0: {e}"));
            }
            return Ok(());
        }
        let id: [u8; 128] = id
            .try_into()
            .map_err(|_| CommError::Setup("the NCCL unique id did not arrive whole".into()))?;
        // Each rank's GPU first, agreed by all: a rank that cannot open its GPU never enters the
        // collective init, where the others would wait for it.
        let Some(gpu) = self.agreed(
            nccl::Communicator::gpu(ordinal),
            &format!("rank 0's GPU {ordinal}"),
            "a rank could not open its GPU",
            out,
        ) else {
            return Ok(());
        };
        watchdog::arm("ncclCommInitRank");
        let comm = nccl::Communicator::join(gpu, &id, self.size, self.rank);
        // Disarmed whatever the outcome: a failed init must not leave the watchdog to end the
        // run later, in work that has nothing to do with it.
        watchdog::disarm();
        // Every rank gives NCCL up together; the host results are kept.
        let Some(comm) = self.agreed(
            comm,
            "ncclCommInitRank on rank 0",
            "ncclCommInitRank failed on another rank",
            out,
        ) else {
            return Ok(());
        };
        let version = nccl::version().unwrap_or_default();
        for c in Collective::ALL {
            progress.advance(&format!("NCCL {}", c.name()));
            let mut lib = Nccl {
                comm: &comm,
                world: &self.world.comm,
            };
            let name = format!("NCCL {}", c.name());
            let points = sweep(
                &self.world,
                &mut lib,
                &name,
                c,
                sizes_swept,
                cfg.quick,
                self.timeout,
            )?;
            if self.is_root() {
                out.add_collective(
                    CommLib::Nccl,
                    c,
                    Scope::World,
                    self.size,
                    &points,
                    &format!("NCCL {version}"),
                    self.layout.nodes(),
                    "device memory",
                );
            }
        }
        if self.layout.nodes() > 1 {
            // The GPU link matrix: long messages (fast links need them to reach their rate).
            let links = super::LinkConfig {
                bytes: cfg.max_size.min(if cfg.quick { 8 << 20 } else { 64 << 20 }),
                quick: cfg.quick,
                margin: cfg.margin,
            };
            out.gpu_links = self.gpu_link_rounds(&comm, &links, progress)?;
        }
        drop(comm);
        if self.is_root() {
            // NCCL's algorithm/protocol choices on this host, from its TUNING log.
            let pattern = log
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            let prefix = pattern.split("%h").next().unwrap_or("").to_string();
            let mut choices = Vec::new();
            if let Ok(dir) = std::fs::read_dir(std::env::temp_dir()) {
                for e in dir.flatten() {
                    if e.file_name().to_string_lossy().starts_with(&prefix) {
                        if let Ok(text) = std::fs::read_to_string(e.path()) {
                            choices.extend(nccl::parse_tuning(&text));
                        }
                        let _ = std::fs::remove_file(e.path());
                    }
                }
            }
            choices.sort();
            choices.dedup();
            if choices.is_empty() {
                out.notes.push(format!("NCCL {version}: its algorithm/protocol choices were not found in its TUNING log (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,TUNING into NCCL_DEBUG_FILE: rank 0 of each communicator writes one line per collective and size)"));
            } else {
                let list: Vec<String> = choices.iter().map(|(w, c)| format!("{w}: {c}")).collect();
                out.notes.push(format!(
                    "NCCL {version} chose (busbw is wire bandwidth only for Ring): {}",
                    list.join("; ")
                ));
            }
        }
        Ok(())
    }
}

/// Options of the communication probe.
pub struct CommConfig {
    pub max_size: usize,
    pub quick: bool,
    /// `--fleet-margin`: a GPU link short of the median link by more is measured again.
    pub margin: f64,
}

/// What the root reports.
#[derive(Default)]
pub struct CommResult {
    pub ceilings: Vec<Ceiling>,
    pub curves: Vec<Curve>,
    pub notes: Vec<String>,
    /// The link rounds between the nodes' GPUs over NCCL (several nodes with GPUs).
    pub gpu_links: Option<super::LinkRun>,
}

/// One size of a sweep: the bytes the size stands for and each iteration's seconds (max over
/// ranks).
pub struct Point {
    pub bytes: usize,
    pub seconds: Vec<f64>,
}

impl CommResult {
    #[allow(clippy::too_many_arguments)]
    fn add_collective(
        &mut self,
        lib: CommLib,
        c: Collective,
        scope: Scope,
        ranks: usize,
        points: &[Point],
        library: &str,
        nodes: usize,
        memory: &str,
    ) {
        let factor = c.bus_factor(ranks);
        let id = CeilingId::Collective { lib, op: c, scope };
        let mut bus = Vec::new();
        let mut alg = Vec::new();
        for p in points {
            let algbw: Vec<f64> = p.seconds.iter().map(|t| p.bytes as f64 / t).collect();
            let busbw: Vec<f64> = algbw.iter().map(|a| a * factor).collect();
            if let (Some(a), Some(b)) = (Stats::from_samples(&algbw), Stats::from_samples(&busbw)) {
                alg.push(CurvePoint {
                    x: p.bytes as f64,
                    value: a.max,
                    stats: a,
                    level: None,
                });
                bus.push(CurvePoint {
                    x: p.bytes as f64,
                    value: b.max,
                    stats: b,
                    level: None,
                });
            }
        }
        if let Some(last) = bus.last() {
            let method = format!(
                "{} ({library}) on {memory} over {ranks} ranks ({} scope, {nodes} node(s)), f32, {} B; busbw = algbw × {factor:.3} (nccl-tests' factor); each iteration timed after a barrier, its time the maximum over ranks; best of {} iterations; every rank's result checked; the whole size sweep is in curves {id} (busbw) and {id}/algbw",
                c.name(),
                scope.name(),
                last.x,
                last.stats.samples
            );
            let per_iteration = PerIteration {
                ops: 0.0,
                bytes: last.x * factor,
            };
            self.ceilings.push(
                Ceiling::measured(
                    id.clone(),
                    CeilingKind::Comm,
                    "B/s",
                    ranks,
                    last.stats.clone(),
                    per_iteration,
                    method,
                )
                .with_precision(Some(roofline_model::Precision::F32))
                .with_level(Some(Tier::Comm(scope))),
            );
        }
        for (suffix, pts) in [("", bus), ("/algbw", alg)] {
            self.curves.push(Curve {
                id: format!("{id}{suffix}"),
                x_label: "message size".into(),
                x_unit: "B".into(),
                unit: "B/s".into(),
                threads: ranks,
                points: pts,
            });
        }
    }

    fn add_p2p(&mut self, scope: Scope, r: &P2p, library: &str) {
        let id = |metric| CeilingId::P2p { scope, metric };
        if let Some(stats) = Stats::from_samples(&r.latency) {
            let method = format!("MPI ping-pong of 8 B between two ranks ({library}); half the round trip; the value is the smallest (lower is better)");
            let per_iteration = PerIteration {
                ops: 0.0,
                bytes: 8.0,
            };
            self.ceilings.push(
                Ceiling::measured(
                    id(P2pMetric::Latency),
                    CeilingKind::Comm,
                    "s",
                    2,
                    stats,
                    per_iteration,
                    method,
                )
                .with_level(Some(Tier::Comm(scope))),
            );
        }
        for (metric, pts, what) in [
            (P2pMetric::Bandwidth, &r.one_way, "one way"),
            (
                P2pMetric::BandwidthBidir,
                &r.both_ways,
                "both ways at once (both directions counted)",
            ),
        ] {
            let curve: Vec<CurvePoint> = pts
                .iter()
                .filter_map(|(bytes, bw)| {
                    Stats::from_samples(bw).map(|s| CurvePoint {
                        x: *bytes as f64,
                        value: s.max,
                        stats: s,
                        level: None,
                    })
                })
                .collect();
            if let Some(last) = curve.last() {
                let method = format!(
                    "MPI_Isend/MPI_Irecv windows between two ranks ({library}), {what}, {} B messages; the last message of each window checked; best sample; the size sweep is in curve {}",
                    last.x,
                    id(metric)
                );
                let per_iteration = PerIteration {
                    ops: 0.0,
                    bytes: last.x,
                };
                self.ceilings.push(
                    Ceiling::measured(
                        id(metric),
                        CeilingKind::Comm,
                        "B/s",
                        2,
                        last.stats.clone(),
                        per_iteration,
                        method,
                    )
                    .with_level(Some(Tier::Comm(scope))),
                );
            }
            self.curves.push(Curve {
                id: id(metric).to_string(),
                x_label: "message size".into(),
                x_unit: "B".into(),
                unit: "B/s".into(),
                threads: 2,
                points: curve,
            });
        }
    }
}

/// One library's collectives on a communicator (MPI's own, NCCL's): the one sweep below drives
/// either, as nccl-tests drives every collective with one loop.
trait Collectives {
    /// `c` at `bytes` (the sweep's size; the library's counts from `Collective::counts`):
    /// warmed up, then `iters` operations each timed after a barrier; this rank's seconds per
    /// operation, or what was wrong with this rank's result or call.
    fn measure(&mut self, c: Collective, bytes: usize, iters: usize)
        -> Result<Vec<f64>, CommError>;
}

/// The MPI ranks' timer for the driver: a barrier of the ranks, then the MPI clock around the
/// work (each rank its own time; the sweep takes the maximum over ranks).
struct MpiClock<'a>(&'a SimpleCommunicator);

impl crate::driver::Timer for MpiClock<'_> {
    type Error = CommError;
    fn time(&mut self, work: &mut dyn FnMut() -> Result<(), CommError>) -> Result<f64, CommError> {
        self.0.barrier();
        let t0 = mpi::time();
        work()?;
        Ok(mpi::time() - t0)
    }
}

/// MPI's collectives on a group.
struct Mpi<'a>(&'a Group);

impl Collectives for Mpi<'_> {
    fn measure(
        &mut self,
        c: Collective,
        bytes: usize,
        iters: usize,
    ) -> Result<Vec<f64>, CommError> {
        let g = self.0;
        let (n, r) = (g.size(), g.rank());
        let Some((sc, rc)) = c.counts(bytes, n) else {
            return Ok(Vec::new());
        };
        let send = send_data(c, r, n, sc);
        let mut recv = if c == Collective::Broadcast && r == 0 {
            send.clone()
        } else {
            vec![0f32; rc]
        };
        let op = |recv: &mut Vec<f32>| match c {
            Collective::AllReduce => {
                g.comm
                    .all_reduce_into(&send[..], &mut recv[..], SystemOperation::sum())
            }
            Collective::AllGather => g.comm.all_gather_into(&send[..], &mut recv[..]),
            Collective::ReduceScatter => {
                g.comm
                    .reduce_scatter_block_into(&send[..], &mut recv[..], SystemOperation::sum())
            }
            Collective::Broadcast => g.comm.process_at_rank(0).broadcast_into(&mut recv[..]),
            Collective::AllToAll => g.comm.all_to_all_into(&send[..], &mut recv[..]),
        };
        let times = crate::driver::sample(
            &mut MpiClock(&g.comm),
            2,
            iters,
            &mut || Ok(()),
            &mut || {
                op(&mut recv);
                Ok(())
            },
        )?;
        match first_difference(&recv, &expected(c, r, n, rc)) {
            Some((i, got, want)) => Err(CommError::WrongResult(format!(
                "holds {got} at element {i}, expected {want}"
            ))),
            None => Ok(times),
        }
    }
}

/// NCCL's collectives over the world, each operation after an MPI barrier.
struct Nccl<'a> {
    comm: &'a crate::comm::nccl::Communicator,
    world: &'a SimpleCommunicator,
}

impl Collectives for Nccl<'_> {
    fn measure(
        &mut self,
        c: Collective,
        bytes: usize,
        iters: usize,
    ) -> Result<Vec<f64>, CommError> {
        let world = self.world;
        let mut barrier = || world.barrier();
        self.comm
            .measure(c, bytes, iters, &mut barrier)
            .map_err(CommError::Nccl)
    }
}

/// One collective of `lib` over every size of `sweep` on group `g`: every rank arrives, the
/// library measures under the watchdog, the ranks agree on whether any result was wrong, and
/// each iteration's time is the maximum over ranks. `name` names the operation in messages.
fn sweep(
    g: &Group,
    lib: &mut dyn Collectives,
    name: &str,
    c: Collective,
    sizes: &[usize],
    quick: bool,
    timeout: Duration,
) -> Result<Vec<Point>, CommError> {
    let n = g.size();
    let me = g.members[g.rank()];
    let mut points = Vec::new();
    for &bytes in sizes {
        if c.counts(bytes, n).is_none() {
            continue;
        }
        let label = format!("{name} of {} ({}, {n} ranks)", human(bytes), g.scope.name());
        arrival(g, &label, timeout)?;
        watchdog::arm(&label);
        let result = lib.measure(c, bytes, iterations(bytes, quick));
        // Every rank checked its own result; all agree on whether one failed before the times
        // are gathered (a failed rank has none).
        let mut first_bad = 0u64;
        g.comm.all_reduce_into(
            &(if result.is_err() { me as u64 + 1 } else { 0 }),
            &mut first_bad,
            SystemOperation::max(),
        );
        let times = match result {
            Err(e) => {
                watchdog::disarm();
                return Err(CommError::OnRank {
                    what: label,
                    rank: me,
                    source: Box::new(e),
                });
            }
            Ok(_) if first_bad != 0 => {
                watchdog::disarm();
                return Err(CommError::WrongResult(format!(
                    "{label}: rank {} holds a wrong result",
                    first_bad - 1
                )));
            }
            Ok(t) => t,
        };
        let mut slowest = vec![0f64; times.len()];
        g.comm
            .all_reduce_into(&times[..], &mut slowest[..], SystemOperation::max());
        watchdog::disarm();
        points.push(Point {
            bytes: c.size_bytes(bytes, n).unwrap_or(bytes),
            seconds: slowest,
        });
    }
    Ok(points)
}
