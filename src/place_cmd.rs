//! `roofline place`: runs a workload, measures it, and puts it on the machine's rooflines.

use crate::run_args::{self, RunArgs};
use crate::{Failure, CANCEL};
use anyhow::anyhow;
use roofline_collectors::energy;
use roofline_collectors::timeline::{self, Span};
use roofline_kernels::micro::Micro;
use roofline_model::placement::{Measured, Placement};
use roofline_model::{write::write_atomic, Machine};
use roofline_workloads::run::Kind;
use roofline_workloads::train::Monitor;
use std::path::Path;
use std::path::PathBuf;
use std::time::Instant;

#[derive(clap::Args)]
pub struct PlaceArgs {
    /// What to place: `resnet50` or `ewa` (a training run of the embedded trainer; the
    /// training options below apply; ewa at e.g. --resolution 192x288 on small machines),
    /// `gemm:MxNxK[:f32|f64|f16]`, `conv:N,C,H,W,K,R,S,stride,pad` (f32 forward, NHWC), or
    /// `stream:BYTES` (a triad over BYTES of arrays).
    #[arg(long, value_name = "W")]
    pub workload: String,
    /// The machine's ceilings, from `roofline probe`.
    #[arg(long, default_value = "machine.json", value_name = "FILE")]
    pub machine: PathBuf,
    /// Where to write the placement (roofline/placement/v1).
    #[arg(short, long, default_value = "placement.json")]
    pub output: PathBuf,
    /// The roofline with the point (and its top layers) drawn on it (default: the output's
    /// name with .svg).
    #[arg(long, value_name = "SVG")]
    pub plot: Option<PathBuf>,
    /// resnet50, ewa: also write the timeline of the measured steps (data, every layer's forward
    /// and backward pass, allreduce buckets, optimiser) as Chrome trace JSON; Perfetto
    /// (ui.perfetto.dev) and chrome://tracing open it.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Steps (kernels: samples) run first and not counted.
    #[arg(long, default_value_t = 2)]
    pub warm: usize,
    /// resnet50, ewa: how many of its layers (by time) to place as their own points.
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    /// Print the placement as JSON on stdout too.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

/// A parsed `--workload`.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// A training run of the embedded trainer.
    Training(Kind),
    /// A GEMM, convolution or triad on the probe's kernels.
    Micro(Micro),
}

pub fn parse_workload(w: &str) -> Result<Workload, String> {
    match w {
        "resnet50" => Ok(Workload::Training(Kind::Resnet50)),
        "ewa" => Ok(Workload::Training(Kind::Ewa)),
        _ => Micro::parse(w).map(Workload::Micro),
    }
}

pub fn place(a: &PlaceArgs) -> Result<(), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    let workload = parse_workload(&a.workload).map_err(input)?;
    let m = Machine::read(&a.machine).map_err(|e| {
        input(format!(
            "{e}; place needs the machine's ceilings: run `roofline probe -o {}` first",
            a.machine.display()
        ))
    })?;
    if m.ceilings.is_empty() {
        return Err(input(format!(
            "{} has no ceilings: run `roofline probe` without --only",
            a.machine.display()
        )));
    }
    crate::args::check_writable(&a.output, "-o").map_err(Failure::Input)?;
    let plot_path = a
        .plot
        .clone()
        .unwrap_or_else(|| a.output.with_extension("svg"));
    crate::args::check_writable(&plot_path, "--plot").map_err(Failure::Input)?;
    if a.trace.is_some() && !matches!(workload, Workload::Training(_)) {
        return Err(input(
            "--trace records a training run's timeline: use it with --workload resnet50 or ewa"
                .into(),
        ));
    }
    if let Some(t) = &a.trace {
        crate::args::check_writable(t, "--trace").map_err(Failure::Input)?;
    }
    if matches!(workload, Workload::Training(_)) {
        crate::exit_on_ctrlc(
            "nothing was written (the placement, its plot and the trace are written at the end)"
                .into(),
        )?;
    }
    if a.run.cuda() {
        let g = format!("gpu{}/", a.run.gpu.unwrap_or(0));
        if !m.ceilings.iter().any(|c| c.id.starts_with(&g)) {
            return Err(input(format!(
                "{} has no {} ceilings to place a GPU run on: run `roofline probe --device cuda -o {}` on this machine first",
                a.machine.display(),
                g.trim_end_matches('/'),
                a.machine.display()
            )));
        }
    }
    if a.run.cuda() && !matches!(workload, Workload::Training(_)) {
        return Err(input(
            "--device cuda places a training run (--workload resnet50 or ewa) on a GPU's roofline; a GEMM, convolution or STREAM kernel on the GPU is what `roofline probe --device cuda` measures (its gemm, conv and mem ceilings)"
                .into(),
        ));
    }
    let start = Instant::now();
    let measured = match &workload {
        Workload::Training(kind) => training(a, *kind)?,
        Workload::Micro(w) => Some((kernel(a, w)?, Vec::new())),
    };
    let Some((measured, spans)) = measured else {
        // Another rank reports.
        return Ok(());
    };
    if let Some(t) = &a.trace {
        let j = timeline::chrome_trace(&spans, 0, "roofline place (rank 0)");
        let text = serde_json::to_string(&j).map_err(|e| Failure::Run(e.into()))?;
        write_atomic(t, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    }
    let placement = assemble(&m, &a.machine, measured, a.top, start)?;
    let text = placement.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    let svg = roofline_plots::placed::placements_svg(&m, &[&placement])
        .map_err(|e| Failure::Run(anyhow!("{e}")))?;
    write_atomic(&plot_path, svg.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    if a.json {
        println!("{text}");
    } else {
        crate::output::placement_table(&placement);
        println!(
            "wrote {} and {}{}",
            a.output.display(),
            plot_path.display(),
            a.trace
                .as_ref()
                .map(|t| format!(" and {}", t.display()))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// Places `r` on `m` (read from `path`), where and when it ran said by this host's provenance.
pub(crate) fn assemble(
    m: &Machine,
    path: &Path,
    r: Measured,
    top: usize,
    start: Instant,
) -> Result<Placement, Failure> {
    use roofline_model::placement::PlaceError;
    let cpu = roofline_kernels::probe::node::cpu_here(m.provenance.cpu.cores);
    let provenance = crate::probe_cmd::provenance(cpu, false, start);
    roofline_model::placement::assemble(m, path, r, top, provenance).map_err(|e| match e {
        PlaceError::NoRoof { .. } => Failure::Input(anyhow!("{e}")),
        e => Failure::Run(anyhow!("{e}")),
    })
}

/// The reading of `span` stopped now (the GPU's energy over `gpu_seconds`), what it could not
/// measure said on stderr.
pub(crate) fn stop_energy(
    span: energy::Span,
    gpu_seconds: f64,
) -> Result<energy::Reading, energy::EnergyError> {
    let (r, note) = span.stop(gpu_seconds);
    if let Some(n) = note {
        eprintln!("note: {n}");
    }
    r
}

/// A micro workload on the probe's CPU kernels and driver, the CPU packages' energy over it.
fn kernel(a: &PlaceArgs, w: &Micro) -> Result<Measured, Failure> {
    let cores = roofline_kernels::probe::node::cores_for(a.run.threads)
        .map_err(crate::probe_cmd::failure)?
        .0;
    let meter = energy::Meter::start();
    let (mut m, iterations) = w
        .measure(
            &cores,
            a.run.steps.unwrap_or(10),
            a.warm,
            llc_bytes(),
            &CANCEL,
        )
        .map_err(|e| match e {
            roofline_kernels::ProbeError::Interrupted => Failure::Interrupted,
            e => Failure::Run(anyhow!("{e}")),
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

/// A training run (resnet50, ewa) on the embedded trainer: `warm` steps, then `--steps`
/// measured ones (default 5), with the timeline on for the per-layer times.
fn training(a: &PlaceArgs, workload: Kind) -> Result<Option<(Measured, Vec<Span>)>, Failure> {
    let measured = a.run.steps.unwrap_or(5).max(1);
    let mut prep = run_args::prepare(&a.run, workload)?;
    prep.for_measurement(a.warm + measured);
    let (reducer, root) = crate::ranks::reducer(prep.batch())?;
    let (ranks, nodes) = reducer.as_ref().map_or((1, 1), |r| (r.ranks(), r.nodes()));
    eprintln!(
        "placing {}: {} warm-up and {measured} measured training steps, batch {}, {} …",
        a.workload,
        a.warm,
        prep.batch(),
        prep.resolution
    );
    timeline::start();
    let monitor = WarmMonitor {
        warm: a.warm,
        run: &a.run,
        span: std::sync::Mutex::new(None),
    };
    let result = run_args::execute(&prep, &monitor, reducer);
    let spans = timeline::stop();
    let (s, _) = result?;
    // On a GPU, its energy over the same steps (NVML) joins the CPU packages'.
    let seconds = s
        .timing
        .iter()
        .filter(|t| t.step > a.warm)
        .map(|t| t.seconds)
        .sum();
    let reading = match monitor.span.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(span) => stop_energy(span, seconds),
        None => Err(energy::EnergyError::NotStarted),
    };
    let energy = energy::per_step(&reading, measured, "over the measured steps");
    if !root {
        return Ok(None);
    }
    let measured = roofline_workloads::run::place::measured(
        &s,
        &prep,
        (ranks, nodes),
        a.warm,
        &spans,
        energy,
    )?;
    Ok(Some(measured))
}

/// Starts the energy span (the CPU's meter, and on a GPU its NVML sampler) when the warm-up
/// steps are done.
struct WarmMonitor<'a> {
    warm: usize,
    run: &'a RunArgs,
    span: std::sync::Mutex<Option<energy::Span>>,
}

impl Monitor for WarmMonitor<'_> {
    fn step(&self, step: usize, steps: usize, loss: f64, ips: f64) {
        if step == self.warm || (self.warm == 0 && step == 1) {
            *self.span.lock().unwrap_or_else(|e| e.into_inner()) = Some(
                roofline_workloads::run::energy_span(self.run.cuda(), self.run.gpu),
            );
        }
        eprintln!("  step {step}/{steps}: loss {loss:.4}, {ips:.2} images/s");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_with_clear_errors() {
        assert_eq!(
            parse_workload("resnet50").unwrap(),
            Workload::Training(Kind::Resnet50)
        );
        assert_eq!(
            parse_workload("ewa").unwrap(),
            Workload::Training(Kind::Ewa)
        );
        assert!(matches!(
            parse_workload("stream:4096").unwrap(),
            Workload::Micro(Micro::Stream(4096))
        ));
        assert!(parse_workload("bert")
            .unwrap_err()
            .contains("expected resnet50, ewa"));
    }
}
