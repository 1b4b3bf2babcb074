//! `roofline place` as one library call ([`place`]): a training run of the embedded trainer
//! (warm-up steps, then measured ones with the timeline on and the energy counted), or a
//! micro-kernel on the probe's kernels, placed on the machine's rooflines. The command line
//! parses, checks its files, calls it, writes and prints.

use super::place::{assemble, measured};
use super::{execute, reducer, Prepared, RunError};
use roofline_collectors::energy;
use roofline_collectors::timeline::{self, Span};
use roofline_kernels::micro::Micro;
use roofline_model::placement::{Measured, Placement};
use roofline_model::Machine;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::time::Instant;

/// What to place.
pub enum What<'a> {
    /// A training run: `warm` steps, then `steps` measured ones.
    Training {
        prep: Box<Prepared>,
        warm: usize,
        steps: usize,
    },
    /// A GEMM, convolution or triad on the probe's kernels, `threads` as every verb chooses
    /// cores, `steps` samples after `warm` ones.
    Kernel {
        micro: &'a Micro,
        threads: Option<usize>,
        steps: usize,
        warm: usize,
        cancel: &'a AtomicBool,
    },
}

/// Hears a placement's progress (the command line prints it).
pub trait Report: Sync {
    /// Something the person placing should know (energy not measured, …).
    fn note(&self, line: &str);
    /// A training step ended.
    fn step(&self, step: usize, steps: usize, loss: f64, images_per_second: f64);
}

/// `what` measured and placed on `m` (read from `path`) with its `top` layers; with the
/// measured steps' timeline. None on the ranks that do not report.
pub fn place(
    what: What<'_>,
    m: &Machine,
    path: &Path,
    top: usize,
    report: &dyn Report,
) -> Result<Option<(Placement, Vec<Span>)>, RunError> {
    let start = Instant::now();
    let (r, spans) = match what {
        What::Training {
            mut prep,
            warm,
            steps,
        } => match training(&mut prep, warm, steps.max(1), report)? {
            Some(x) => x,
            None => return Ok(None),
        },
        What::Kernel {
            micro,
            threads,
            steps,
            warm,
            cancel,
        } => (kernel(micro, threads, steps, warm, cancel)?, Vec::new()),
    };
    Ok(Some((assemble(m, path, r, top, start)?, spans)))
}

/// A micro workload on the probe's CPU kernels and driver, the CPU packages' energy over it.
fn kernel(
    w: &Micro,
    threads: Option<usize>,
    steps: usize,
    warm: usize,
    cancel: &AtomicBool,
) -> Result<Measured, RunError> {
    let cores = roofline_kernels::affinity::cores(threads)
        .map_err(|e| RunError::Input(e.to_string()))?
        .chosen;
    let meter = energy::Meter::start();
    let (mut m, iterations) = w
        .measure(&cores, steps, warm, llc_bytes(), cancel)
        .map_err(|e| match e {
            roofline_kernels::ProbeError::Interrupted => RunError::Interrupted,
            e => RunError::Run(e.to_string()),
        })?;
    let reading = meter.and_then(|m| m.read());
    m.energy = energy::per_step(&reading, iterations, "over the measured steps");
    Ok(m)
}

/// The last-level cache's total size (the stream workload streams past it with non-temporal
/// stores, as the probe's DRAM ceiling does).
fn llc_bytes() -> usize {
    let cpu = roofline_kernels::probe::node::cpu_here(1);
    cpu.caches
        .iter()
        .map(|c| c.size_bytes as usize * c.instances.max(1))
        .max()
        .unwrap_or(32 << 20)
}

/// A training run (resnet50, ewa) on the embedded trainer: `warm` steps, then `measured` ones,
/// with the timeline on for the per-layer times.
fn training(
    prep: &mut Prepared,
    warm: usize,
    measured_steps: usize,
    report: &dyn Report,
) -> Result<Option<(Measured, Vec<Span>)>, RunError> {
    prep.for_measurement(warm + measured_steps);
    let (reducer, root) = reducer(prep.batch())?;
    let (ranks, nodes) = reducer.as_ref().map_or((1, 1), |r| (r.ranks(), r.nodes()));
    let cuda = prep.spec.device == super::Device::Cuda;
    timeline::start();
    let step = |s: usize, n: usize, l: f64, i: f64| report.step(s, n, l, i);
    let monitor = super::execute::EnergyAfter::new(warm, (cuda, prep.spec.gpu), &step);
    let result = execute(prep, &monitor, reducer);
    let spans = timeline::stop();
    let (s, _) = result?;
    // On a GPU, its energy over the same steps (NVML) joins the CPU packages'.
    let (reading, note) = monitor.stop(&s.timing);
    if let Some(n) = note {
        report.note(&n);
    }
    let energy = energy::per_step(&reading, measured_steps, "over the measured steps");
    if !root {
        return Ok(None);
    }
    Ok(Some(measured(
        &s,
        prep,
        (ranks, nodes),
        warm,
        &spans,
        energy,
    )?))
}
