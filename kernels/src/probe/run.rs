//! `roofline probe` as one library call ([`probe`]): the checks of what was asked, this node's
//! probe (CPU, GPUs), storage, and under an MPI launcher the probe of the whole world
//! ([`super::world`]: every node at once, communication, the gathered nodes and aggregates).
//! The command line parses, calls it, writes and prints.

use super::node::{self, Devices, NodeConfig, NodeError};
use super::{Progress, Section};
use roofline_model::Machine;
use std::path::PathBuf;
use std::sync::atomic::AtomicBool;
use std::time::{Duration, Instant};

/// What a probe run is asked.
#[derive(Clone, Debug)]
pub struct Request {
    /// The sections to measure (storage among them when `io` is given).
    pub sections: Vec<Section>,
    pub devices: Devices,
    /// Threads for the `all` ceilings (None: one per physical core).
    pub threads: Option<usize>,
    /// Fewer repeats and a coarser sweep (same ceiling ids).
    pub quick: bool,
    /// Storage: the folder test files go to and the label of its ceilings (`io/<label>/…`).
    pub io: Option<(PathBuf, String)>,
    /// Largest message of the communication sweeps.
    pub max_size: usize,
    /// How long a rank waits for the others in one operation (under MPI).
    pub comm_timeout: Duration,
    /// Under MPI: how far (a fraction) below the fleet's median a node's ceiling or a link may
    /// fall, beyond its own noise, before it is named.
    pub fleet_margin: f64,
    /// The file the result goes to: checked writable before anything runs (by the root rank
    /// under MPI, its answer agreed by all).
    pub output: PathBuf,
    /// The GPU convolution section's batch and search budget.
    pub conv: crate::probe::gpu::ConvOptions,
}

/// Why a probe run did not give a machine.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Node(NodeError),
    /// What was asked cannot be done here (exit 2).
    #[error("{0}")]
    Input(String),
    /// The run failed on the way (exit 1).
    #[error("{0}")]
    Run(String),
    /// The result's file cannot be written.
    #[error("cannot write {}: {source}", path.display())]
    Output {
        path: PathBuf,
        #[source]
        source: roofline_model::ModelError,
    },
    #[error("interrupted")]
    Interrupted,
    /// Under MPI: another rank failed and said why; this rank ends with this exit code.
    #[error("another rank failed (exit {0})")]
    OtherRank(u8),
}

/// A node probe's error; its interruption is the run's.
impl From<NodeError> for RunError {
    fn from(e: NodeError) -> RunError {
        match e {
            NodeError::Interrupted => RunError::Interrupted,
            e => RunError::Node(e),
        }
    }
}

impl RunError {
    /// Whether the fault is what was asked (exit 2), not the run's.
    pub fn is_input(&self) -> bool {
        match self {
            RunError::Node(e) => e.is_input(),
            RunError::Input(_) | RunError::Output { .. } => true,
            _ => false,
        }
    }
}

/// The probe this request asks for: one process, or (started by an MPI launcher) every rank of
/// the world. Returns the machine on the process that writes it (the root), None on the others.
/// `progress` hears the measurements and the notes (the root's bar; every rank's notes).
pub fn probe(
    req: &Request,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<Option<Machine>, RunError> {
    crate::cpu::isa::Isa::cap().map_err(|e| RunError::Input(e.to_string()))?;
    if let Some(n) = crate::comm::launched_ranks() {
        #[cfg(feature = "mpi")]
        {
            let _ = n;
            return super::world::probe(req, cancel, progress);
        }
        #[cfg(not(feature = "mpi"))]
        return Err(RunError::Input(format!(
            "started by an MPI launcher with {n} ranks, but this roofline was built without MPI: rebuild it with `cargo build --release --features mpi` (needs an MPI library and libclang: Debian's openmpi-bin libopenmpi-dev libclang-dev), or run it without mpirun"
        )));
    }
    if req.sections.iter().all(|s| *s == Section::Comm) {
        return Err(RunError::Input(
            "--only comm measures communication between MPI ranks, and this run is a world of one: start it as `mpirun -np N roofline probe --only comm` (a build with --features mpi)".into(),
        ));
    }
    let gpus = node::gpu_status(req.devices, &req.sections)?;
    let (cores, machine_cores) = node::cores_for(req.threads)?;
    check_output(req)?;
    let start = Instant::now();
    let mut m = if req.sections.iter().any(|s| s.on_node()) {
        node_probe(
            req,
            &req.sections,
            &gpus,
            (&cores, &machine_cores),
            (cancel, progress),
            start,
            true,
        )?
    } else {
        bare(req, machine_cores.len(), start)
    };
    if req.sections.contains(&Section::Comm) {
        m.provenance.notes.push(
            "no communication measured: a world of one (run it under mpirun -np N, built with --features mpi)".into(),
        );
    }
    if req.sections.contains(&Section::Io) {
        io_probe(req, &mut m, cancel, progress)?;
    }
    progress.finish();
    m.provenance.duration_s = start.elapsed().as_secs_f64();
    Ok(Some(m))
}

/// Refuses a result file that cannot be written, before any measurement.
pub(super) fn check_output(req: &Request) -> Result<(), RunError> {
    roofline_model::write::check_writable(&req.output).map_err(|source| RunError::Output {
        path: req.output.clone(),
        source,
    })
}

/// A machine with this run's provenance only.
pub(super) fn bare(req: &Request, machine_cores: usize, start: Instant) -> Machine {
    let cpu = node::cpu_here(machine_cores);
    node::bare(roofline_collectors::provenance::here(cpu, req.quick, start))
}

/// This node's own ceilings (its CPU on `cores`, its GPUs), the progress cleared however it
/// ends; `check_load`: whether the machine's quiet is checked (not where the job's own ranks
/// share the node).
pub(super) fn node_probe(
    req: &Request,
    sections: &[Section],
    gpus: &node::Gpus,
    (cores, machine_cores): (&[usize], &[usize]),
    (cancel, progress): (&AtomicBool, &dyn Progress),
    start: Instant,
    check_load: bool,
) -> Result<Machine, RunError> {
    if let node::Gpus::Absent(why) = gpus {
        if req.devices == Devices::Auto {
            progress.note(&format!("no GPU found, probing the CPU only ({why})"));
        }
    }
    let cfg = NodeConfig {
        devices: req.devices,
        sections: sections.to_vec(),
        cores: cores.to_vec(),
        machine_cores: machine_cores.to_vec(),
        quick: req.quick,
        check_load,
        conv: req.conv,
    };
    let r = node::probe(
        &cfg,
        gpus,
        &|cpu| roofline_collectors::provenance::here(cpu, req.quick, start),
        cancel,
        progress,
    );
    if r.is_err() || matches!(gpus, node::Gpus::Found(_)) {
        progress.finish();
    }
    Ok(r?)
}

/// The storage probe into `m`.
pub(super) fn io_probe(
    req: &Request,
    m: &mut Machine,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<(), RunError> {
    let Some((path, label)) = &req.io else {
        return Ok(());
    };
    let readers = crate::affinity::allowed_cpus().len().clamp(2, 8);
    let cfg = crate::io::IoConfig {
        path: path.clone(),
        readers,
        quick: req.quick,
    };
    match crate::io::run(&cfg, label, cancel, progress) {
        Ok(r) => {
            m.ceilings.extend(r.ceilings);
            m.provenance.notes.extend(r.notes);
            Ok(())
        }
        Err(crate::ProbeError::Interrupted) => Err(RunError::Interrupted),
        Err(e @ (crate::ProbeError::Io { .. } | crate::ProbeError::NotAFolder(_))) => {
            Err(RunError::Input(format!("--io: {e}")))
        }
        Err(e) => Err(RunError::Run(format!("storage probe failed: {e}"))),
    }
}
