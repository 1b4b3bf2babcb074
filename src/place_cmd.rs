//! `roofline place`: runs a workload, measures it, and puts it on the machine's rooflines.

use crate::exit::{Failure, CANCEL};
use crate::run_args::{self, RunArgs};
use anyhow::anyhow;
use roofline_collectors::timeline;
use roofline_kernels::micro::Micro;
use roofline_model::{write::write_atomic, Machine};
use roofline_workloads::run::placing::{self, What};
use roofline_workloads::run::Kind;
use std::path::PathBuf;

#[derive(clap::Args)]
#[command(mut_arg("steps", |a| a.help(
    "Measured steps after --warm: training steps (default 5), or a kernel's samples (default 10)"
)))]
pub struct PlaceArgs {
    /// What to place: `resnet50` or `ewa` (a training run of the embedded trainer; the
    /// training options below apply; ewa at e.g. --resolution 192x288 on small machines),
    /// `gemm:MxNxK[:f32|f64|f16]`, `conv:N,C,H,W,K,R,S,stride,pad` (f32 forward, NHWC), or
    /// `stream:BYTES` (a triad over BYTES of arrays), or `automl:FILE[#ID]` (a candidate of a
    /// `roofline automl` run — its best without an id — from its trained weights, on the run's
    /// data, resolution and classes).
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
    /// Place against a machine file from other hardware (another CPU family, model or
    /// stepping, caches, SIMD, fewer cores, another GPU), with a warning, where
    /// place otherwise refuses it (exit 2): its roofs are not this machine's.
    #[arg(long)]
    pub allow_other_machine: bool,
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
    /// An AutoML run's candidate (its best without an id).
    Automl(PathBuf, Option<usize>),
    /// A GEMM, convolution or triad on the probe's kernels.
    Micro(Micro),
}

pub fn parse_workload(w: &str) -> Result<Workload, String> {
    match w {
        "resnet50" => Ok(Workload::Training(Kind::Resnet50)),
        "ewa" => Ok(Workload::Training(Kind::Ewa)),
        w if w.starts_with("automl:") => {
            let rest = &w["automl:".len()..];
            let (file, id) = match rest.rsplit_once('#') {
                Some((f, i)) => (
                    f,
                    Some(i.parse::<usize>().map_err(|_| {
                        format!("--workload {w}: expected automl:FILE or automl:FILE#ID (a candidate's number)")
                    })?),
                ),
                None => (rest, None),
            };
            Ok(Workload::Automl(PathBuf::from(file), id))
        }
        _ => Micro::parse(w).map(Workload::Micro),
    }
}

pub fn place(a: &PlaceArgs) -> Result<(), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    let workload = parse_workload(&a.workload).map_err(input)?;
    if let Workload::Micro(micro) = &workload {
        let what = format!("--workload {}", a.workload);
        roofline_collectors::fits_in_memory(micro.memory_bytes(), &what).map_err(input)?;
    }
    let m = Machine::read(&a.machine).map_err(|e| {
        // A file of another kind (a placement, a score) is the user's: never suggest
        // overwriting it with a probe.
        let other_kind = matches!(&e, roofline_model::ModelError::InFile { inner, .. }
            if matches!(**inner, roofline_model::ModelError::Schema { .. }));
        if other_kind {
            input(format!(
                "{e}; --machine takes the machine.json that `roofline probe` wrote"
            ))
        } else {
            input(format!(
                "{e}; place needs the machine's ceilings: run `roofline probe -o {}` first",
                a.machine.display()
            ))
        }
    })?;
    if m.ceilings.is_empty() {
        return Err(input(format!(
            "{} has no ceilings: run `roofline probe` without --only",
            a.machine.display()
        )));
    }
    if a.run.steps == Some(0) {
        return Err(input(
            "--steps 0 measures nothing: give at least one measured step".into(),
        ));
    }
    crate::args::check_writable(&a.output, "-o").map_err(Failure::Input)?;
    let plot_path = a
        .plot
        .clone()
        .unwrap_or_else(|| a.output.with_extension("svg"));
    crate::args::check_writable(&plot_path, "--plot").map_err(Failure::Input)?;
    if a.trace.is_some() && !matches!(workload, Workload::Training(_) | Workload::Automl(..)) {
        return Err(input(
            "--trace records a training run's timeline: use it with --workload resnet50 or ewa"
                .into(),
        ));
    }
    if let Some(t) = &a.trace {
        crate::args::check_writable(t, "--trace").map_err(Failure::Input)?;
    }
    if matches!(workload, Workload::Training(_) | Workload::Automl(..)) {
        crate::exit::exit_on_ctrlc(
            "nothing was written (the placement, its plot and the trace are written at the end)"
                .into(),
        )?;
    }
    if a.run.cuda() {
        let gpu = a.run.gpu.unwrap_or(0);
        let g = format!("gpu{gpu}/");
        if !m.ceilings.iter().any(
            |c| matches!(c.id.roof().map(|r| r.on()), Some(roofline_model::On::Gpu(n)) if n == gpu),
        ) {
            return Err(input(format!(
                "{} has no {} ceilings to place a GPU run on: run `roofline probe --device cuda -o {}` on this machine first",
                a.machine.display(),
                g.trim_end_matches('/'),
                a.machine.display()
            )));
        }
    }
    if a.run.cuda() && !matches!(workload, Workload::Training(_) | Workload::Automl(..)) {
        return Err(input(
            "--device cuda places a training run (--workload resnet50 or ewa) on a GPU's roofline; a GEMM, convolution or STREAM kernel on the GPU is what `roofline probe --device cuda` measures (its gemm, conv and mem ceilings)"
                .into(),
        ));
    }
    this_machine(&m, a)?;
    let what = match &workload {
        Workload::Training(kind) => {
            let prep = run_args::prepare(&a.run, *kind)?;
            let steps = a.run.steps.unwrap_or(5).max(1);
            eprintln!(
                "placing {}: {} warm-up and {steps} measured training steps, batch {}, {} …",
                a.workload,
                a.warm,
                prep.batch(),
                prep.resolution
            );
            What::Training {
                prep: Box::new(prep),
                warm: a.warm,
                steps,
            }
        }
        Workload::Automl(file, id) => {
            let prep =
                roofline_automl::setup::prepare_candidate(file, *id, &a.run.spec(Kind::Resnet50)?)?;
            let steps = a.run.steps.unwrap_or(5).max(1);
            eprintln!(
                "placing {} of {}: {} warm-up and {steps} measured training steps, batch {}, {} …",
                prep.workload_name(),
                file.display(),
                a.warm,
                prep.batch(),
                prep.resolution
            );
            What::Training {
                prep: Box::new(prep),
                warm: a.warm,
                steps,
            }
        }
        Workload::Micro(micro) => What::Kernel {
            micro,
            threads: a.run.threads,
            steps: a.run.steps.unwrap_or(10),
            warm: a.warm,
            cancel: &CANCEL,
        },
    };
    let Some((placement, spans)) = placing::place(what, &m, &a.machine, a.top, &Printed)? else {
        // Another rank reports.
        return Ok(());
    };
    if let Some(t) = &a.trace {
        let j = timeline::chrome_trace(&spans, 0, "roofline place (rank 0)");
        let text = serde_json::to_string(&j).map_err(|e| Failure::Run(e.into()))?;
        write_atomic(t, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    }
    let text = placement.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    let svg = roofline_plots::placed::placements_svg(&m, &[&placement])
        .map_err(|e| Failure::Run(anyhow!("{e}")))?;
    write_atomic(&plot_path, svg.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    if a.json {
        outln!("{text}");
    } else {
        crate::output::placement_table(&placement);
        outln!(
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

/// Refuses (or with --allow-other-machine, warns about) a machine file that does not describe
/// this machine: a point placed under another machine's roofs says nothing true.
fn this_machine(m: &Machine, a: &PlaceArgs) -> Result<(), Failure> {
    use roofline_model::identity::{Cores, Identity};
    // The GPU this rank trains on: --gpu, else the launcher's local rank modulo the GPUs.
    let gpus: Vec<usize> = if a.run.cuda() {
        let count = roofline_kernels::probe::gpu::init().unwrap_or(1).max(1);
        vec![a
            .run
            .gpu
            .unwrap_or(roofline_workloads::run::execute::local_rank() % count)]
    } else {
        Vec::new()
    };
    let here = roofline_kernels::probe::node::identity_here(&gpus)
        .map_err(|e| Failure::Input(anyhow!("cannot open the GPU to place on: {e}")))?;
    // The file's GPUs that this run uses (none on the CPU).
    let mut file_gpus = m.provenance.gpus.clone();
    file_gpus.retain(|g| gpus.contains(&g.index));
    let mut file = Identity::of_parts(&m.provenance.cpu, &file_gpus);
    // Not the clock class (`here` has none): a probe under mpirun (its ranks share the node)
    // or beside another load measures a lower clock than this idle moment (3.4 against 4.2
    // GHz in a CI run).
    file.clock_hz = None;
    let why = file.differences(&here, ("the file", "this machine"), Cores::AtMostHere);
    if why.is_empty() {
        return Ok(());
    }
    if a.allow_other_machine {
        eprintln!(
            "warning: {} was probed on another machine ({}): placing against it anyway, as --allow-other-machine asks",
            a.machine.display(),
            why.join("; ")
        );
        return Ok(());
    }
    Err(Failure::Input(anyhow!(
        "{} does not describe this machine: {}. Probe this one (`roofline probe -o here.json`, then --machine here.json), or pass --allow-other-machine",
        a.machine.display(),
        why.join("; ")
    )))
}

/// The placement's progress on stderr.
struct Printed;

impl placing::Report for Printed {
    fn note(&self, line: &str) {
        eprintln!("note: {line}");
    }
    fn step(&self, step: usize, steps: usize, loss: f64, ips: f64) {
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
