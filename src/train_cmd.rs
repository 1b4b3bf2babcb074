//! `roofline train`: the embedded trainer on the command line.

use crate::exit::Failure;
use crate::run_args::{self, RunArgs};
use anyhow::anyhow;
use roofline_plots::si;
use roofline_workloads::exchange::Wire;
use roofline_workloads::run::{report, Job, Kind, Prepared};
use roofline_workloads::train::{Monitor, Summary};
use std::io::IsTerminal;

#[derive(clap::Args)]
pub struct TrainArgs {
    /// The workload: resnet50 (ImageNet-style classification) or ewa (HPC AI500's Extreme
    /// Weather detection: Faster R-CNN with a ResNet-50-FPN backbone on 16-channel fields,
    /// scored by mAP@0.5).
    #[arg(long, value_enum, default_value = "resnet50")]
    pub workload: Kind,

    #[command(flatten)]
    pub run: RunArgs,
    /// With --device cuda: compare every GPU layer, one whole training step of a small
    /// ResNet, and that ResNet described as data with its children by every AutoML morphism,
    /// with the CPU layers on small shapes in --precision (with --workload ewa also the
    /// detector's pyramid, shared RPN head and a whole step of a small detector); print the
    /// table and exit (1 when a comparison fails). Run it first on a new GPU machine.
    #[arg(long, requires = "device")]
    check: bool,
    /// Write the run's timeline as Chrome trace JSON (Perfetto, chrome://tracing): data
    /// loading, every layer's forward and backward pass, allreduce buckets, the optimiser.
    #[arg(long, value_name = "FILE")]
    trace: Option<std::path::PathBuf>,
    /// Print a JSON summary instead of the text one.
    #[arg(long)]
    json: bool,
    /// Write the training state to this safetensors file at the end.
    #[arg(long, value_name = "PATH")]
    checkpoint: Option<std::path::PathBuf>,
    /// With --checkpoint: also write it every this many steps, so that a killed run resumes
    /// (with the same arguments and --resume) exactly where the last checkpoint left it.
    #[arg(long, value_name = "STEPS")]
    checkpoint_every: Option<usize>,
    /// Continue from this checkpoint (same model and batch; --steps counts from the start).
    #[arg(long, value_name = "PATH")]
    resume: Option<std::path::PathBuf>,
}

/// A run's progress: a bar on a terminal; on a log, the first and last steps and a line at
/// least every ten seconds.
struct Bar(
    Option<indicatif::ProgressBar>,
    Option<crate::output::Ticker>,
);

impl Monitor for Bar {
    fn step(&self, step: usize, steps: usize, loss: f64, ips: f64) {
        if let Some(b) = &self.0 {
            b.set_length(steps as u64);
            b.set_position(step as u64);
            b.set_message(format!("loss {loss:.4}, {ips:.1} images/s"));
        }
        if let Some(t) = &self.1 {
            t.tick("", step <= 1 || step == steps, || {
                format!("step {step}/{steps}: loss {loss:.4}, {ips:.1} images/s")
            });
        }
    }
}

/// `--device cuda --check`: the GPU layers against the CPU layers.
fn check(a: &TrainArgs) -> Result<(), Failure> {
    let checks = roofline_workloads::run::check_all(
        a.run.gpu,
        a.run.precision,
        a.workload == Kind::Ewa,
        |gpu| {
            outln!(
                "GPU {}: {} (sm_{}), trainer layers in {} against the CPU",
                gpu.ordinal,
                gpu.name,
                gpu.arch(),
                a.run.precision
            );
        },
    )?;
    let mut failed = 0;
    for c in &checks {
        outln!(
            "  {:<4} {:<58} error {:.2e} (tolerance {:.0e})",
            if c.passed() { "ok" } else { "FAIL" },
            c.name,
            c.error,
            c.tolerance
        );
        failed += usize::from(!c.passed());
    }
    let stopped = checks.iter().filter(|c| c.stopped()).count();
    if failed > 0 {
        return Err(Failure::Run(anyhow!(
            "GPU self-test: {} of {} comparisons failed, {stopped} stage(s) stopped by an error (the other stages ran)",
            failed - stopped,
            checks.len() - stopped
        )));
    }
    outln!("all {} comparisons passed", checks.len());
    Ok(())
}

pub fn train(a: &TrainArgs) -> Result<(), Failure> {
    if a.check {
        if !a.run.cuda() {
            return Err(Failure::Input(anyhow!(
                "--check compares the GPU layers with the CPU: use it with --device cuda"
            )));
        }
        return check(a);
    }
    if let Some(p) = &a.checkpoint {
        crate::args::check_writable(p, "--checkpoint").map_err(Failure::Input)?;
    }
    if let Some(p) = &a.resume {
        if !p.is_file() {
            return Err(Failure::Input(anyhow!(
                "--resume {}: no such file",
                p.display()
            )));
        }
    }
    if let Some(t) = &a.trace {
        crate::args::check_writable(t, "--trace").map_err(Failure::Input)?;
    }
    let mut prep = run_args::prepare(&a.run, a.workload)?;
    crate::exit::exit_on_ctrlc(match (&a.checkpoint, a.checkpoint_every) {
        (Some(c), Some(n)) => format!(
            "nothing else was written: the last checkpoint (every {n} steps) is in {}; resume with the same arguments and --resume {}",
            c.display(),
            c.display()
        ),
        _ => "nothing was written (the report, the checkpoint and the trace are written at the end)".into(),
    })?;
    prep.set_checkpoints(a.checkpoint.clone(), a.resume.clone(), a.checkpoint_every);
    let bar = (!a.json && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(prep.steps() as u64);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    let log = (!a.json && !std::io::stderr().is_terminal()).then(crate::output::Ticker::new);
    let monitor = Bar(bar, log);
    let Some(trained) = roofline_workloads::run::train(&prep, &monitor, a.trace.as_deref())? else {
        // Another rank reports.
        return Ok(());
    };
    if let Some(b) = &monitor.0 {
        b.finish_and_clear();
    }
    if a.json {
        let v = report::json(&prep, &trained);
        outln!(
            "{}",
            serde_json::to_string_pretty(&v).map_err(|e| Failure::Run(e.into()))?
        );
        return Ok(());
    }
    let (s, gpu) = (&trained.summary, &trained.gpu);
    let on = match gpu {
        Some(g) => format!("{g}, convolutions in {}", a.run.precision),
        None => {
            let threads = roofline_model::count(prep.threads, "thread");
            format!("{threads}, products in {}", a.run.precision)
        }
    };
    match &prep.job {
        Job::Classifier(_) | Job::Graph { .. } => print_classifier(&prep, s, &on),
        Job::Detector(_) => print_detector(&prep, s, &on),
    }
    if s.ranks > 1 {
        outln!(
            "{} ranks: {}B per rank per step into the allreduces (gradients {}, buckets of {} elements, {}); {:.3} s per step waiting for the sums",
            s.ranks,
            si(s.comm_bytes_per_step),
            match s.comm.wire {
                Wire::F32 => "in f32".to_string(),
                w => format!("compressed to {}", w.name()),
            },
            s.comm.bucket,
            if s.comm.overlap {
                "overlapped with the backward pass"
            } else {
                "after the backward pass"
            },
            s.comm_wait_seconds / (s.steps - s.start_step).max(1) as f64
        );
    }
    outln!("final training loss {:.4}", s.final_loss);
    match (trained.joules_per_image, trained.energy.average_watts) {
        (Some(j), Some(w)) => outln!(
            "energy: {j:.3} J per image over the steps after the first, {w:.0} W on average ({})",
            trained.energy.sources.join(", ")
        ),
        _ => outln!("{}", trained.energy.note),
    }
    if gpu.is_some() {
        outln!(
            "the host waited for the GPU at most {} times in a step after the first; a step after \
             the second allocated device memory at most {} times",
            s.host_syncs_per_step,
            s.device_allocations_per_step
        );
    }
    if let Some(g) = &s.cuda_graph {
        outln!(
            "CUDA graph (--cuda-graph {}): {} of {} steps launched as one; {}",
            g.mode.name(),
            g.graph_steps,
            s.steps - s.start_step,
            g.why
        );
    }
    if let Some(c) = &s.conv_search {
        outln!("convolution algorithms: {}", c.describe());
    }
    let held_out = prep.job.workload().eval_images();
    match (&prep.job, s.evals.last()) {
        (Job::Classifier(_) | Job::Graph { .. }, Some(e)) => outln!(
            "held-out: Top-1 {:.2}%, Top-5 {:.2}% on {held_out} images",
            100.0 * e.top1,
            100.0 * e.top5,
        ),
        (Job::Detector(_), Some(e)) => {
            if let Some(m) = e.map {
                outln!(
                    "held-out: mAP@0.5 {m:.4} on {held_out} images{}",
                    match s.time_to_quality {
                        Some(t) => format!(", target reached after {t:.1} s"),
                        None => String::new(),
                    }
                )
            }
        }
        _ => {}
    }
    Ok(())
}

/// `train --workload resnet50`'s throughput and FLOPs by the accounting's rules.
fn print_classifier(prep: &Prepared, s: &Summary, on: &str) {
    let res = prep.resolution.h;
    outln!(
        "{}: {} parameters, {res}×{res} {} images, batch {}, {on}",
        prep.model_name(),
        s.parameters,
        if prep.spec.data.is_some() {
            "folder"
        } else {
            "synthetic"
        },
        prep.batch(),
    );
    outln!(
        "{} steps, {} images in {:.1} s: {:.2} images/s ({:.2} over {}), {} FLOP/s achieved ({} FLOP per image per step, {} forward)",
        s.steps,
        s.images,
        s.train_seconds,
        s.images_per_second,
        s.steady_images_per_second,
        s.steady.describe(),
        si(s.achieved_flops),
        si(s.flops_step_per_image),
        si(s.flops_forward_per_image)
    );
    let counted = prep.layers();
    let aiperf = roofline_workloads::accounting::aiperf(&counted);
    let v3 = roofline_workloads::accounting::hpc_ai500_v3(&counted);
    outln!(
        "per image: AIPerf rules {} forward, {} backward, {} total; HPC AI500 V3.0 rules {} forward, {} training",
        si(aiperf.forward),
        si(aiperf.backward),
        si(aiperf.total()),
        si(v3.forward),
        si(v3.total())
    );
}

/// `train --workload ewa`'s throughput, FLOPs per image by part beside the paper's, parameters
/// beside the paper's.
fn print_detector(prep: &Prepared, s: &Summary, on: &str) {
    let Job::Detector(cfg) = &prep.job else {
        return;
    };
    let res = prep.resolution;
    outln!(
        "{}: {} parameters (the paper: about 41 M), {res} images from {}, batch {}, {on}",
        prep.model_name(),
        s.parameters,
        prep.data_name(),
        prep.batch(),
    );
    outln!(
        "{} steps, {} images in {:.1} s: {:.3} images/s ({:.3} over {}), {}FLOP/s achieved",
        s.steps,
        s.images,
        s.train_seconds,
        s.images_per_second,
        s.steady_images_per_second,
        s.steady.describe(),
        si(s.achieved_flops)
    );
    outln!(
        "FLOPs per image per step: {} ({} forward); the full model at 768×1152: {} (the paper: 691 G, measured with nvprof)",
        si(s.flops_step_per_image),
        si(s.flops_forward_per_image),
        si(report::ewa_full_size_flops(cfg.model.scales))
    );
    outln!(
        "  {}",
        roofline_workloads::accounting::detector_flops(&cfg.model, res.h, res.w)
            .parts()
            .iter()
            .map(|(n, f)| format!("{n} {}", si(f.training())))
            .collect::<Vec<_>>()
            .join(", ")
    );
}
