//! The probe of an MPI world (`mpirun`/`srun`): every node probes itself concurrently (its
//! lowest rank; the other ranks sleep), then every rank takes part in the communication
//! probes, the root probes storage if asked, gathers the nodes' results, and alone gets the
//! machine (with every node's ceilings, the aggregates, the cluster).

use super::node;
use super::run::{bare, check_output, io_probe, node_probe, Request, RunError};
use super::{Progress, Section};
use crate::comm::mpi::{CommConfig, LinkConfig, LinkRun, World};
use roofline_model::fleet::{self, Conditions};
use roofline_model::links::{Link, LinkMatrix};
use roofline_model::{Machine, NodeCeilings};
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// The error with this rank named.
fn on_rank(e: RunError, who: &str) -> RunError {
    match e {
        e @ (RunError::Interrupted | RunError::OtherRank(_)) => e,
        e if e.is_input() => RunError::Input(format!("{who}: {e}")),
        e => RunError::Run(format!("{who}: {e}")),
    }
}

/// Another rank's progress: its notes, not the bar (the root's alone is drawn).
struct NotesOnly<'a>(&'a dyn Progress);

impl Progress for NotesOnly<'_> {
    fn begin(&self, _: u64) {}
    fn advance(&self, _: &str) {}
    fn note(&self, line: &str) {
        self.0.note(line)
    }
}

/// See the module: every rank calls it; the root gets the machine.
pub fn probe(
    req: &Request,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<Option<Machine>, RunError> {
    let world = World::init(req.comm_timeout).map_err(|e| RunError::Input(format!("MPI: {e}")))?;
    let root = world.is_root();
    let quiet = NotesOnly(progress);
    let progress: &dyn Progress = if root { progress } else { &quiet };
    let who = format!("rank {} ({})", world.rank, world.hosts[world.rank]);
    // The launcher bound each rank to a core; the rank that probes its node needs them all
    // (a pretend node: the cores its own ranks were bound to).
    let node_cpus = if world.layout.fake {
        world.node_allowed_cpus()
    } else {
        roofline_collectors::node_cpus()
    };
    let mut widened = None;
    if world.is_leader() {
        let (before, after) = crate::affinity::widen_to(&node_cpus);
        if after != before {
            widened = Some(format!(
                "node leaders widened their CPU affinity from {before} to {after} CPUs for the node probe (the MPI launcher had bound them)"
            ));
        }
    }
    // Input: each rank checks what concerns it (its GPUs, its cores), the root the output.
    let checked = (|| -> Result<_, RunError> {
        let gpus = node::gpu_status(req.devices, &req.sections)?;
        let cores = node::cores_for(req.threads)?;
        if root {
            check_output(req)?;
        }
        Ok((gpus, cores))
    })();
    if world.any(checked.is_err()) {
        return Err(match checked {
            Err(e) => on_rank(e, &who),
            Ok(_) => RunError::OtherRank(2),
        });
    }
    let (gpus, (cores, machine_cores)) = checked?;
    let start = Instant::now();
    // 1. Every node probes its own CPU and GPUs, all nodes at once.
    let node_sections: Vec<Section> = req
        .sections
        .iter()
        .copied()
        .filter(|s| s.on_node())
        .collect();
    let probe_here = || {
        if node_sections.is_empty() {
            Ok(bare(req, machine_cores.len(), start))
        } else {
            node_probe(
                req,
                &node_sections,
                &gpus,
                (&cores, &machine_cores),
                (cancel, progress),
                start,
                // The job's other ranks wait on this node while its leader probes.
                false,
            )
        }
    };
    let local = if world.layout.fake {
        // Pretend nodes share one host's memory and caches: they take turns.
        let mut local = None;
        for turn in 0..world.layout.nodes() {
            if turn == world.node() && world.is_leader() {
                local = Some(probe_here());
            }
            world.wait_unbounded();
        }
        local
    } else {
        let local = world.is_leader().then(probe_here);
        world.wait_unbounded();
        local
    };
    if world.any(matches!(local, Some(Err(_)))) {
        progress.finish();
        return Err(match local {
            Some(Err(e)) => on_rank(e, &who),
            _ => RunError::OtherRank(1),
        });
    }
    // 2. Communication: intra-node, inter-node, world.
    let mut comm = None;
    if req.sections.contains(&Section::Comm) {
        let cfg = CommConfig {
            max_size: req.max_size,
            quick: req.quick,
            margin: req.fleet_margin,
        };
        match world.comm_probe(&cfg, progress) {
            Ok(r) => comm = Some(r),
            Err(e) => {
                progress.finish();
                progress.note(&format!("error: {who}: {e}; nothing was written"));
                world.abort(1);
            }
        }
    }
    // 3. Storage, on the root only (the others sleep meanwhile).
    let mut io_part: Option<Machine> = None;
    if root && req.sections.contains(&Section::Io) {
        let mut m = bare(req, machine_cores.len(), start);
        match io_probe(req, &mut m, cancel, progress) {
            Ok(()) => io_part = Some(m),
            Err(e) => {
                progress.finish();
                match e {
                    RunError::Interrupted => progress.note("interrupted; nothing was written"),
                    e => progress.note(&format!("error: {who}: {e}")),
                }
                world.abort(1);
            }
        }
    }
    world.wait_unbounded();
    // 4. Every node's result to the root.
    let bytes = match &local {
        Some(Ok(m)) => m.to_json().map(String::into_bytes).unwrap_or_default(),
        _ => Vec::new(),
    };
    let gathered = world.gather_from_leaders(&bytes);
    let mut machine = if root {
        progress.finish();
        Some(assemble(
            req,
            &world,
            gathered.unwrap_or_default(),
            (&node_sections, widened, comm, io_part),
            start,
        )?)
    } else {
        None
    };
    // 5. The link matrix: every pair of nodes, in rounds.
    if req.sections.contains(&Section::Comm) && world.layout.nodes() > 1 {
        links(req, &world, machine.as_mut(), progress, &who);
    }
    if let Some(m) = machine.as_mut() {
        m.provenance.duration_s = start.elapsed().as_secs_f64();
    }
    Ok(machine)
}

/// The root's machine from the gathered nodes (node 0's result the base), the communication,
/// storage, the aggregates and the fleet's screening.
fn assemble(
    req: &Request,
    world: &World,
    gathered: Vec<Vec<u8>>,
    (node_sections, widened, comm, io_part): (
        &[Section],
        Option<String>,
        Option<crate::comm::mpi::CommResult>,
        Option<Machine>,
    ),
    start: Instant,
) -> Result<Machine, RunError> {
    let mut nodes = Vec::new();
    for (i, b) in gathered.iter().enumerate() {
        let text = String::from_utf8_lossy(b);
        nodes.push(
            Machine::from_json(&text)
                .map_err(|e| RunError::Run(format!("node {i}'s result could not be read: {e}")))?,
        );
    }
    let Some(mut m) = nodes.first().cloned() else {
        return Err(RunError::Run("no node result reached the root".into()));
    };
    m.provenance.cluster = Some(world.cluster_info());
    // Every node's failed result checks, named by node (node 0's are already in `m`).
    for (i, n) in nodes.iter().enumerate().skip(1) {
        m.failures
            .extend(n.failures.iter().map(|f| roofline_model::CheckFailure {
                on: format!("node {i} ({}) {}", n.provenance.host, f.on),
                ..f.clone()
            }));
    }
    if world.layout.fake {
        m.provenance.notes.push(format!(
            "ROOFLINE_FAKE_NODES: {} pretend nodes on one host (for tests): they took turns for the node probe, and their \"inter-node\" communication is shared memory",
            world.layout.nodes()
        ));
    }
    if !node_sections.is_empty() {
        m.provenance.notes.extend(widened);
    }
    let names = world.node_names();
    if nodes.len() > 1 && !node_sections.is_empty() {
        m.ceilings.extend(roofline_model::aggregate(&nodes));
        m.nodes = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeCeilings {
                node: i,
                host: names.get(i).cloned().unwrap_or(n.provenance.host.clone()),
                ceilings: n.ceilings.clone(),
            })
            .collect();
    }
    if world.layout.nodes() > 1 {
        let conditions: Vec<Conditions> = nodes.iter().map(Conditions::of).collect();
        let mut fleet = fleet::screen(&m.nodes, &conditions, req.fleet_margin);
        fleet.nodes = world.layout.nodes();
        m.fleet = Some(fleet);
    }
    if let Some(c) = comm {
        m.ceilings.extend(c.ceilings);
        m.curves.extend(c.curves);
        m.provenance.notes.extend(c.notes);
        if let (Some(run), Some(f)) = (c.gpu_links, m.fleet.as_mut()) {
            f.gpu_links = Some(gpu_link_matrix(req, world, run));
        }
    }
    if let Some(io) = io_part {
        m.ceilings.extend(io.ceilings);
        m.provenance.notes.extend(io.provenance.notes);
    }
    m.provenance.duration_s = start.elapsed().as_secs_f64();
    Ok(m)
}

/// The GPU links' matrix, judged as the host links are.
fn gpu_link_matrix(req: &Request, world: &World, run: LinkRun) -> LinkMatrix {
    let version = crate::comm::nccl::version().unwrap_or_default();
    let method = format!(
        "NCCL {version} ncclSend/ncclRecv between the GPUs of the lowest ranks of every pair of nodes, device memory: half the round trip of 8 B as the host sees it ({} round trips), and windows of up to 16 messages of {} each way (at most 256 MiB), CUDA events on the sender once the receiver has posted, the last window checked on the receiver; a link's figure is its median sample (bandwidth: the slower direction); rounds of disjoint pairs (n − 1 rounds for n nodes){}; a link that read slow measured again alone, in a round of its own, keeping the better of its two figures",
        if req.quick { 100 } else { 500 },
        crate::probe::cpu::human_bytes(run.bytes as f64),
        if run.in_turns {
            "; pretend nodes on one host: the pairs of a round took turns"
        } else {
            ", the pairs of a round at once"
        }
    );
    let mut lm = LinkMatrix::judge(
        world.node_names(),
        method,
        run.bytes,
        run.rounds,
        run.seconds,
        run.links,
        req.fleet_margin,
    );
    lm.seconds = run.seconds;
    lm
}

/// The link rounds on every rank; the root keeps what they measured in `machine` (and in the
/// result file as they go: a node that dies or hangs loses nothing measured before its round).
/// A failure ends the job (exit 1) after a message naming the pair.
fn links(
    req: &Request,
    world: &World,
    mut machine: Option<&mut Machine>,
    progress: &dyn Progress,
    who: &str,
) {
    let margin = req.fleet_margin;
    let cfg = LinkConfig {
        bytes: req.max_size.min(if req.quick { 1 << 20 } else { 4 << 20 }),
        quick: req.quick,
        margin,
    };
    let names = world.node_names();
    let method = format!(
        "MPI point to point between the lowest ranks of every pair of nodes, host memory ({}): half the round trip of 8 B ({} round trips), and windows of {} messages each way, each window's last message checked; a link's figure is its median sample (bandwidth: the slower direction); rounds of disjoint pairs (n − 1 rounds for n nodes){}; a link that read slow measured again alone, in a round of its own, keeping the better of its two figures",
        world.library,
        if req.quick { 100 } else { 500 },
        crate::probe::cpu::human_bytes(cfg.bytes as f64),
        if world.layout.fake {
            "; pretend nodes on one host: the pairs of a round took turns"
        } else {
            ", the pairs of a round at once"
        }
    );
    let started = Instant::now();
    let mut written: Option<Instant> = None;
    let matrix = |links: &[Link], rounds: usize| {
        LinkMatrix::judge(
            names.clone(),
            method.clone(),
            cfg.bytes,
            rounds,
            started.elapsed().as_secs_f64(),
            links.to_vec(),
            margin,
        )
    };
    // The root keeps the machine with the links so far: in the watchdog (written if this rank
    // hangs) and in the file: before every round up to 64 rounds, then at most every 2 s
    // (a large fleet's file is large).
    let mut keep = |links: &[Link], round: usize, rounds: usize| {
        let Some(m) = machine.as_deref() else { return };
        if round >= rounds {
            crate::comm::watchdog::keep(None);
            return;
        }
        if rounds > 64 && written.is_some_and(|t| t.elapsed().as_secs_f64() < 2.0) {
            return;
        }
        let mut partial = m.clone();
        let mut lm = matrix(links, rounds);
        let why = format!(
            "the link rounds did not finish: this file was written before round {} of {rounds}",
            round + 1
        );
        lm.incomplete = Some(why.clone());
        partial.provenance.notes.push(format!("INCOMPLETE: {why}"));
        if let Some(f) = partial.fleet.as_mut() {
            f.links = Some(lm);
        }
        if let Ok(text) = partial.to_json() {
            let _ = roofline_model::write::write_atomic(&req.output, text.as_bytes());
            crate::comm::watchdog::keep(Some((req.output.clone(), text)));
        }
        written = Some(Instant::now());
    };
    match world.link_rounds(&cfg, progress, &mut keep) {
        Ok(Some(run)) => {
            if let Some(f) = machine.as_mut().and_then(|m| m.fleet.as_mut()) {
                let mut lm = matrix(&run.links, run.rounds);
                lm.seconds = run.seconds;
                f.links = Some(lm);
            }
        }
        Ok(None) => {}
        Err(e) => {
            progress.finish();
            let kept = if world.is_root() {
                format!(
                    "; what was measured before that round is in {}",
                    req.output.display()
                )
            } else {
                String::new()
            };
            progress.note(&format!("error: {who}: {e}{kept}"));
            world.abort(1);
        }
    }
}
