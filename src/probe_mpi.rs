//! `roofline probe` under mpirun / srun: every node probes itself concurrently (its lowest
//! rank; the other ranks sleep), then every rank takes part in the communication probes, the
//! root probes storage if asked, gathers the nodes' results, and writes machine.json alone.

use crate::probe_cmd::{failure, finish, io_probe, node_probe, progress_bar, ProbeArgs};
use crate::Failure;
use anyhow::anyhow;
use roofline_kernels::comm::mpi::{CommConfig, World};
use roofline_kernels::probe::node;
use roofline_kernels::probe::{Progress, Section};
use roofline_model::{Machine, NodeCeilings};
use std::time::Instant;

/// A machine.json with this run's provenance only.
fn bare(a: &ProbeArgs, machine_cores: &[usize], start: Instant) -> Machine {
    let cpu = node::cpu_here(machine_cores.len());
    node::bare(crate::probe_cmd::provenance(cpu, a.quick, start))
}

/// The error with this rank named.
fn on_rank(e: Failure, who: &str) -> Failure {
    match e {
        Failure::Input(e) => Failure::Input(anyhow!("{who}: {e:#}")),
        Failure::Run(e) => Failure::Run(anyhow!("{who}: {e:#}")),
        other => other,
    }
}

pub fn probe(a: &ProbeArgs, sections: &[Section]) -> Result<(), Failure> {
    let world = World::init(a.comm_timeout).map_err(|e| Failure::Input(anyhow!("MPI: {e}")))?;
    let root = world.is_root();
    let who = format!("rank {} ({})", world.rank, world.hosts[world.rank]);
    // The launcher bound each rank to a core; the rank that probes its node needs them all.
    let mut widened = None;
    if world.is_leader() {
        let (before, after) =
            roofline_kernels::affinity::widen_to(&roofline_collectors::node_cpus());
        if after != before {
            widened = Some(format!(
                "node leaders widened their CPU affinity from {before} to {after} CPUs for the node probe (the MPI launcher had bound them)"
            ));
        }
    }
    // Input: each rank checks what concerns it (its GPUs, its cores), the root the output.
    let checked = (|| -> Result<_, Failure> {
        let gpu_count = node::gpu_status(a.device, sections).map_err(failure)?;
        let cores = node::cores_for(a.threads).map_err(failure)?;
        if root {
            crate::args::check_writable(&a.output, "-o").map_err(Failure::Input)?;
        }
        Ok((gpu_count, cores))
    })();
    if world.any(checked.is_err()) {
        return Err(match checked {
            Err(e) => on_rank(e, &who),
            Ok(_) => Failure::Quiet(2),
        });
    }
    let (gpu_count, (cores, machine_cores)) = checked?;
    crate::install_ctrlc()?;
    let start = Instant::now();
    let progress = progress_bar(root);
    let clear = || {
        if let Some(b) = &progress.0 {
            b.finish_and_clear();
        }
    };
    // 1. Every node probes its own CPU and GPUs, all nodes at once.
    let node_sections: Vec<Section> = sections.iter().copied().filter(|s| s.on_node()).collect();
    let local = world.is_leader().then(|| {
        if node_sections.is_empty() {
            Ok(bare(a, &machine_cores, start))
        } else {
            node_probe(
                a,
                &node_sections,
                &gpu_count,
                (&cores, &machine_cores),
                &progress,
                start,
                // The job's other ranks wait on this node while its leader probes.
                false,
            )
        }
    });
    world.wait_unbounded();
    if world.any(matches!(local, Some(Err(_)))) {
        clear();
        return Err(match local {
            Some(Err(e)) => on_rank(e, &who),
            _ => Failure::Quiet(1),
        });
    }
    // 2. Communication: intra-node, inter-node, world.
    let mut comm = None;
    if sections.contains(&Section::Comm) {
        let cfg = CommConfig {
            max_size: a.max_size,
            quick: a.quick,
        };
        let silent = roofline_kernels::probe::Silent;
        let shown: &dyn Progress = if root { &progress } else { &silent };
        match world.comm_probe(&cfg, shown) {
            Ok(r) => comm = Some(r),
            Err(e) => {
                clear();
                eprintln!("roofline: error: {who}: {e}; nothing was written");
                world.abort(1);
            }
        }
    }
    // 3. Storage, on the root only (the others sleep meanwhile).
    let mut io_part: Option<Machine> = None;
    if root && sections.contains(&Section::Io) {
        let mut m = bare(a, &machine_cores, start);
        match io_probe(a, &mut m, &progress) {
            Ok(()) => io_part = Some(m),
            Err(e) => {
                clear();
                match e {
                    Failure::Input(e) | Failure::Run(e) => {
                        eprintln!("roofline: error: {who}: {e:#}")
                    }
                    _ => eprintln!("roofline: interrupted; nothing was written"),
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
    if !root {
        return Ok(());
    }
    clear();
    let mut nodes = Vec::new();
    for (i, b) in gathered.unwrap_or_default().iter().enumerate() {
        let text = String::from_utf8_lossy(b);
        nodes.push(
            Machine::from_json(&text)
                .map_err(|e| Failure::Run(anyhow!("node {i}'s result could not be read: {e}")))?,
        );
    }
    let Some(mut m) = nodes.first().cloned() else {
        return Err(Failure::Run(anyhow!("no node result reached the root")));
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
    if node_sections.iter().any(|s| s.on_node()) {
        m.provenance.notes.extend(widened);
    }
    if nodes.len() > 1 && node_sections.iter().any(|s| s.on_node()) {
        m.ceilings.extend(roofline_model::aggregate(&nodes));
        m.nodes = nodes
            .iter()
            .enumerate()
            .map(|(i, n)| NodeCeilings {
                node: i,
                host: n.provenance.host.clone(),
                ceilings: n.ceilings.clone(),
            })
            .collect();
    }
    if let Some(c) = comm {
        m.ceilings.extend(c.ceilings);
        m.curves.extend(c.curves);
        m.provenance.notes.extend(c.notes);
    }
    if let Some(io) = io_part {
        m.ceilings.extend(io.ceilings);
        m.provenance.notes.extend(io.provenance.notes);
    }
    m.provenance.duration_s = start.elapsed().as_secs_f64();
    finish(a, &m)
}
