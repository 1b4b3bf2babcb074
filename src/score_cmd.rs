//! `roofline score`: the HPC AI500 V2.0 score of a workload from repeated training runs, and its
//! report.

use crate::run_args::{self, RunArgs};
use crate::Failure;
use anyhow::anyhow;
use roofline_model::placement::Energy;
use roofline_model::score::{Score, Scores, System, Target, SCORE_SCHEMA};
use roofline_model::{write::write_atomic, Machine};
use roofline_workloads::accounting;
use roofline_workloads::run::{score, Kind};
use std::path::PathBuf;
use std::time::Instant;

/// HPC AI500 V2.0's benchmark levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Level {
    /// The reference workload and hyper-parameters as given.
    Hardware,
    /// Software and hyper-parameters tuned.
    System,
    /// Anything goes.
    Free,
}

impl Level {
    fn name(self) -> &'static str {
        match self {
            Level::Hardware => "hardware",
            Level::System => "system",
            Level::Free => "free",
        }
    }
}

#[derive(clap::Args)]
pub struct ScoreArgs {
    /// The workload: resnet50 (Image Classification, Top-1) or ewa (Extreme Weather
    /// detection, mAP@0.5; give it --eval-images).
    #[arg(long, value_enum, default_value = "resnet50")]
    pub workload: Kind,
    /// Independent runs (seeds --seed, --seed + 1, …). HPC AI500 asks for 10 (resnet50) or 5
    /// (ewa); fewer give a score marked not valid.
    #[arg(long)]
    pub runs: Option<usize>,
    /// The benchmark level you declare (HPC AI500 V2.0): hardware (the reference workload and
    /// hyper-parameters as given), system (software and hyper-parameters tuned), free.
    #[arg(long, value_enum, default_value = "free")]
    pub level: Level,
    /// The machine's ceilings (from `roofline probe`): the report then places the workload on
    /// the machine's roofline.
    #[arg(long, value_name = "FILE")]
    pub machine: Option<PathBuf>,
    /// HPC AI500 V3.0 bagging: train M independent base models of the network, each on its
    /// own bootstrap sample of the training images (drawn with replacement, seeded) with its own
    /// seed, and score their ensemble (the classifier's probabilities averaged; the detector's
    /// detections fused box by box). Under mpirun -np N the ranks split into M teams of
    /// P = N / M (N must be a multiple of M; each team data parallel, no synchronisation
    /// between teams, Sys_scale = M × P); without a launcher the M models train side by side
    /// on M shares of the cores. Each run's FLOPS is then V3.0's (bagged APC × iterations per
    /// epoch / T_epoch) and its quality the ensemble's; the first model's single-model score is
    /// kept beside it.
    #[arg(long, value_name = "M")]
    pub bagging: Option<usize>,
    /// Where to write score.json (roofline/score/v1).
    #[arg(short, long, default_value = "score.json")]
    pub output: PathBuf,
    /// The HTML report (self-contained: inline SVG, no external assets; default: the output's
    /// name with .html).
    #[arg(long, value_name = "HTML")]
    pub report: Option<PathBuf>,
    #[command(flatten)]
    pub run: RunArgs,
}

pub fn score(a: &ScoreArgs) -> Result<(), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    let published =
        Target::published(a.workload.name()).ok_or_else(|| input("unknown workload".into()))?;
    let runs = a.runs.unwrap_or(published.runs);
    if runs == 0 {
        return Err(input("--runs 0: nothing to score".into()));
    }
    crate::args::check_writable(&a.output, "-o").map_err(Failure::Input)?;
    let report_path = a
        .report
        .clone()
        .unwrap_or_else(|| a.output.with_extension("html"));
    crate::args::check_writable(&report_path, "--report").map_err(Failure::Input)?;
    crate::exit_on_ctrlc(
        "nothing was written (score.json and its report are written when every run has ended)"
            .into(),
    )?;
    let machine = match &a.machine {
        Some(p) => Some(Machine::read(p).map_err(|e| input(e.to_string()))?),
        None => None,
    };
    let own = if a.workload == Kind::Ewa {
        a.run.target_map
    } else {
        a.run.target_top1
    };
    let custom = own.is_some();
    let target = Target {
        value: own.unwrap_or(published.value),
        ..published.clone()
    };
    let mut warnings = Vec::new();
    if runs < published.runs {
        warnings.push(format!(
            "{runs} run(s): HPC AI500 V2.0 asks for {} for {}; this score is not valid",
            published.runs, a.workload
        ));
    }
    let mut prep = run_args::prepare(&a.run, a.workload)?;
    // Quality needs held-out images.
    if let Some(n) = prep
        .ensure_eval()
        .map_err(|e| input(format!("score: {e}")))?
    {
        eprintln!("note: evaluating on {n} held-out images (--eval-images)");
    }
    prep.run_mut().target = Some(target.value);
    let start = Instant::now();
    let topo = crate::ranks::ranks(prep.batch(), a.bagging)?;
    let (reducer, root) = (topo.world.clone(), topo.root);
    let (ranks, nodes) = reducer.as_ref().map_or((1, 1), |r| (r.ranks(), r.nodes()));
    if topo.plan.is_some() && prep.workload().eval_images() == 0 {
        return Err(input(
            "--bagging: the ensemble is scored on held-out images".into(),
        ));
    }
    let counted = prep.layers();
    let v3_per_image = accounting::hpc_ai500_v3(&counted).total();
    let mut done = Vec::new();
    let mut energy_note = String::new();
    let mut last = None;
    let mut gpu = None;
    for i in 0..runs {
        let seed = a.run.seed + i as u64;
        // The same data set for every run; the seed changes the model and the order.
        prep.reseed(seed, a.run.seed);
        if root {
            eprintln!("run {}/{runs} (seed {seed}) …", i + 1);
        }
        // The GPU's energy joins the CPU packages' (or stands alone without them).
        let span = roofline_workloads::run::energy_span(a.run.cuda(), a.run.gpu);
        if topo.plan.is_some() {
            let b = crate::bagging_cmd::run(&prep, &topo, seed, &target, v3_per_image)?;
            let Some(b) = b else {
                continue;
            };
            let reading = crate::place_cmd::stop_energy(span, b.wall_seconds);
            gpu = b.gpu.clone();
            let energy =
                roofline_collectors::energy::per_step(&reading, 1, "per run (all the models)");
            energy_note = energy.note.clone();
            done.push(b.record(i, seed, &target, &energy, prep.batch()));
            if root {
                let r = &b.run;
                eprintln!(
                    "  {} models × {} ranks: ensemble {} {:.4} (models {:.4} on average), V3.0 FLOPS {}FLOP/s, VFLOPS {}FLOP/s",
                    r.models,
                    r.ranks_per_model,
                    target.metric,
                    r.ensemble_quality,
                    r.mean_member_quality(),
                    roofline_plots::si(r.flops),
                    roofline_plots::si(r.vflops)
                );
            }
            last = Some(b.first);
            continue;
        }
        let (s, g) = run_args::execute(&prep, &roofline_workloads::train::Quiet, reducer.clone())?;
        gpu = g;
        let reading = crate::place_cmd::stop_energy(span, s.elapsed_seconds);
        let energy = roofline_collectors::energy::per_step(&reading, 1, "per run");
        energy_note = energy.note.clone();
        let run = score::record(i, seed, &s, prep.batch(), &target, v3_per_image, &energy);
        if root {
            eprintln!(
                "  {} {:.4} after {:.1} s ({}), {}FLOP/s, VFLOPS {}FLOP/s",
                target.metric,
                run.quality,
                run.time_to_quality_s,
                if run.reached_target {
                    "target reached"
                } else {
                    "target not reached"
                },
                roofline_plots::si(run.flops),
                roofline_plots::si(run.vflops)
            );
        }
        done.push(run);
        last = Some(s);
    }
    if !root {
        return Ok(());
    }
    let scores = Scores::of(&done).ok_or_else(|| Failure::Run(anyhow!("no run finished")))?;
    let reasons = score::not_comparable(&prep.spec, custom);
    let cores = roofline_kernels::probe::node::cores_for(None)
        .map_err(crate::probe_cmd::failure)?
        .1
        .len();
    let cpu = roofline_kernels::probe::node::cpu_here(cores);
    let provenance = crate::probe_cmd::provenance(cpu.clone(), false, start);
    let configuration = score::configuration(
        &prep,
        last.as_ref().map(|s| s.parameters),
        &target,
        gpu.as_deref(),
        ranks,
        topo.plan.as_ref(),
    );
    let system = System {
        cpu: cpu.model_name.clone(),
        sockets: cpu.sockets,
        cores: cpu.cores,
        logical_cpus: cpu.logical_cpus,
        memory_bytes: roofline_collectors::memory_bytes(),
        accelerators: gpu.iter().cloned().collect(),
        intra_node_links: vec![if ranks > 1 {
            "shared memory (MPI ranks on one node)".into()
        } else {
            "none used (one process)".into()
        }],
        inter_node_links: vec![if nodes > 1 {
            format!("{nodes} nodes over the MPI library's network")
        } else {
            "none (one node)".into()
        }],
        os: provenance.os.clone(),
        kernel: provenance.kernel.clone(),
        driver: roofline_kernels::cuda::device::driver_version().ok(),
        libraries: provenance.libraries.clone(),
        compiler: provenance.compiler.clone(),
        ranks,
        nodes,
    };
    let score_energy_note = format!("per run in the score: {energy_note}");
    let placement = match (&machine, &a.machine, &last) {
        (Some(m), Some(path), Some(s)) => {
            // The last run's steps after the first, on the machine's roofline (bagged: its
            // first model, whose batch its team of P ranks shared).
            let trained_by = topo.plan.map_or(ranks, |p| p.ranks_per_model);
            let (measured, _) = roofline_workloads::run::place::measured(
                s,
                &prep,
                (trained_by, nodes),
                1,
                &[],
                Energy {
                    note: score_energy_note.clone(),
                    ..Default::default()
                },
            )?;
            Some(Box::new(crate::place_cmd::assemble(
                m, path, measured, 0, start,
            )?))
        }
        _ => None,
    };
    let score = Score {
        schema: SCORE_SCHEMA.into(),
        comparable: reasons.is_empty(),
        not_comparable: reasons,
        valid: runs >= published.runs,
        warnings,
        level: a.level.name().to_string(),
        workload: a.workload.name().to_string(),
        target,
        configuration,
        system,
        provenance,
        runs: done,
        scores,
        energy_note,
        placement,
    };
    let svg = match (&machine, &score.placement) {
        (Some(m), Some(p)) => Some(
            roofline_plots::placed::placements_svg(m, &[p.as_ref()])
                .map_err(|e| Failure::Run(anyhow!("{e}")))?,
        ),
        _ => None,
    };
    let text = score.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    let page = roofline_plots::report::html(&score, svg.as_deref());
    write_atomic(&report_path, page.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    crate::output::score_summary(&score);
    println!("wrote {} and {}", a.output.display(), report_path.display());
    Ok(())
}
