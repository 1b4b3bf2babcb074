//! `roofline score` as one library call ([`score`]): the repeated runs (single models, or
//! bagged ensembles under `--bagging`), each run's record, the scores, the system and its
//! provenance, and the placement of the last run on the machine's roofline. The command line
//! parses, checks its files, calls it, writes and prints.

use super::score::{configuration, not_comparable, record, Declared, Rules};
use super::{bagged, energy_span, execute, ranks, Prepared, RunError};
use crate::accounting;
use crate::train::Quiet;
use roofline_collectors::energy;
use roofline_model::bagging::{BaggedRun, EpochTime};
use roofline_model::placement::Energy;
use roofline_model::score::{
    Journal, Level, Run, Score, Scores, System, Target, SCORE_RUNS_SCHEMA, SCORE_SCHEMA,
};
use roofline_model::Machine;
use std::path::Path;
use std::time::Instant;

/// What a score is asked: the prepared run (its target set), the runs, the rules.
pub struct Request<'a> {
    pub prep: Prepared,
    pub runs: usize,
    /// Run i trains from seed `seed + i` (the data set stays that of `seed`).
    pub seed: u64,
    pub target: Target,
    /// Whether the target is the user's, not the published one (then not comparable).
    pub custom_target: bool,
    /// HPC AI500 V3.0 bagging: this many base models per run.
    pub bagging: Option<usize>,
    /// How a bagged run's T_epoch is had (measured by default).
    pub epoch_time: EpochTime,
    /// The level declared (HPC AI500 V2.0: hardware, system; or free, not one of V2.0's).
    pub level: Level,
    /// The rules' warnings already known (too few runs).
    pub warnings: Vec<String>,
    /// Whether the runs are valid by the count of runs.
    pub valid: bool,
    /// The machine (and its file) the last run is placed on.
    pub machine: Option<(&'a Machine, &'a Path)>,
    /// The runs an earlier, interrupted score finished (`score --resume`): they are kept, and
    /// the runs go on from the next one. Refused when it was asked with other settings.
    pub resumed: Option<Journal>,
}

/// Hears a score's progress (the command line prints it).
pub trait Report {
    /// Something the person running the score should know (energy not measured, …).
    fn note(&self, line: &str);
    /// Run `i` (0-based) of `runs` starts from `seed`.
    fn started(&self, i: usize, runs: usize, seed: u64);
    /// A single model's run ended (`metric`: what the target is on).
    fn run(&self, run: &Run, metric: &str);
    /// A bagged run ended.
    fn bagged(&self, run: &BaggedRun, metric: &str);
    /// Every run finished so far, after each run (the command line writes them down, so that
    /// an interrupted score keeps them).
    fn kept(&self, journal: &Journal);
}

/// The score of `req`, on the reporting rank (None on the others).
pub fn score(mut req: Request<'_>, report: &dyn Report) -> Result<Option<Score>, RunError> {
    let start = Instant::now();
    let (prep, target) = (&mut req.prep, &req.target);
    let topo = ranks(prep.batch(), req.bagging)?;
    let (reducer, root) = (topo.world.clone(), topo.root);
    let (ranks, nodes) = reducer.as_ref().map_or((1, 1), |r| (r.ranks(), r.nodes()));
    if topo.plan.is_some() && prep.workload().eval_images() == 0 {
        return Err(RunError::Input(
            "--bagging: the ensemble is scored on held-out images".into(),
        ));
    }
    // V3.0's table 3 over the model; a bagged run counts the published count where the model
    // is the paper's (the analytic one beside it).
    let v3_per_image = accounting::hpc_ai500_v3(&prep.layers()).total();
    let bagged_ops = Rules::of(&prep.spec, prep.run(), 0.0).bagged_ops(v3_per_image);
    let (cuda, gpu_index) = (prep.spec.device == super::Device::Cuda, prep.spec.gpu);
    let asked = Asked {
        level: req.level,
        custom_target: req.custom_target,
        bagging: req.bagging,
        epoch_time: req.epoch_time,
    };
    let request = asked.key(prep, target, ranks, topo.plan.as_ref());
    let mut journal = match req.resumed.take() {
        Some(j) => {
            if let Some(d) = j.differs(&request) {
                return Err(RunError::Input(format!(
                    "--resume: the runs kept were asked with other settings ({d}); give the same arguments, or start afresh without --resume"
                )));
            }
            j
        }
        None => Journal {
            schema: SCORE_RUNS_SCHEMA.into(),
            request,
            runs: Vec::new(),
            parameters: None,
            accelerator: None,
            energy_note: String::new(),
        },
    };
    if journal.runs.len() > req.runs {
        return Err(RunError::Input(format!(
            "--resume: {} runs are kept, more than --runs {}; ask for at least {}",
            journal.runs.len(),
            req.runs,
            journal.runs.len()
        )));
    }
    if root && !journal.runs.is_empty() {
        report.note(&format!(
            "resuming: {} of {} runs kept from the interrupted score",
            journal.runs.len(),
            req.runs
        ));
    }
    let mut done = std::mem::take(&mut journal.runs);
    let mut energy_note = journal.energy_note.clone();
    let mut last = None;
    let mut gpu = journal.accelerator.clone();
    for i in done.len()..req.runs {
        let seed = req.seed + i as u64;
        // The same data set for every run; the seed changes the model and the order.
        prep.reseed(seed, req.seed);
        if root {
            report.started(i, req.runs, seed);
        }
        // The GPU's energy joins the CPU packages' (or stands alone without them).
        let span = energy_span(cuda, gpu_index);
        if topo.plan.is_some() {
            let Some(b) = bagged::run(prep, &topo, seed, target, bagged_ops, req.epoch_time)?
            else {
                continue;
            };
            let reading = stop(span, b.wall_seconds, report);
            gpu = b.gpu.clone();
            let energy = energy::per_step(&reading, 1, "per run (all the models)");
            energy_note = energy.note.clone();
            let mut run = b.record(i, seed, target, &energy, prep.batch());
            // Its models trained their epochs to the end unless told to stop at the target.
            run.fixed_epochs = !prep.run().stop_at_target;
            done.push(run);
            report.bagged(&b.run, &target.metric);
            last = Some(b.first);
        } else {
            let (s, g) = execute(prep, &Quiet, reducer.clone())?;
            gpu = g;
            let reading = stop(span, s.elapsed_seconds, report);
            let energy = energy::per_step(&reading, 1, "per run");
            energy_note = energy.note.clone();
            let rules = Rules::of(&prep.spec, prep.run(), s.flops_step_per_image);
            let run = record(
                i,
                seed,
                &s,
                prep.batch(),
                target,
                &rules,
                bagged_ops.0,
                &energy,
            );
            if root {
                report.run(&run, &target.metric);
            }
            done.push(run);
            last = Some(s);
        }
        keep(
            &mut journal,
            &done,
            last.as_ref(),
            &gpu,
            &energy_note,
            root,
            report,
        );
    }
    if !root {
        return Ok(None);
    }
    let scores = Scores::of(&done).ok_or_else(|| RunError::Run("no run finished".into()))?;
    let analytic = last.as_ref().map_or(0.0, |s| s.flops_step_per_image);
    let rules = Rules::of(&prep.spec, prep.run(), analytic);
    let declared = Declared {
        level: req.level,
        custom_target: req.custom_target,
        target,
        train_images: prep.workload().train_images(),
        eval_images: prep.workload().eval_images(),
    };
    let reasons = not_comparable(&prep.spec, &declared, &rules);
    let cores = roofline_kernels::affinity::cores(None)
        .map_err(|e| RunError::Run(e.to_string()))?
        .all
        .len();
    let cpu = roofline_kernels::probe::node::cpu_here(cores);
    let provenance = roofline_collectors::provenance::here(cpu.clone(), false, start);
    let configuration = configuration(
        prep,
        last.as_ref().map(|s| s.parameters).or(journal.parameters),
        target,
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
    let placement = match (req.machine, &last) {
        (Some((m, path)), Some(s)) => {
            // The last run's steps after the first, on the machine's roofline (bagged: its
            // first model, whose batch its team of P ranks shared).
            let trained_by = topo.plan.map_or(ranks, |p| p.ranks_per_model);
            let (measured, _) = super::place::measured(
                s,
                prep,
                (trained_by, nodes),
                1,
                &[],
                Energy {
                    note: format!("per run in the score: {energy_note}"),
                    ..Default::default()
                },
            )?;
            Some(Box::new(super::place::assemble(
                m, path, measured, 0, start,
            )?))
        }
        _ => None,
    };
    Ok(Some(Score {
        schema: SCORE_SCHEMA.into(),
        comparable: reasons.is_empty(),
        not_comparable: reasons,
        rules: {
            let mut r = rules.describe(prep.spec.workload);
            if req.bagging.is_some() {
                // V3.0's FLOPS: its epoch time, measured or projected, never §5.3.2's.
                r[1] = format!("timing (V3.0): {}", req.epoch_time.describe());
            }
            r
        },
        valid: req.valid,
        warnings: req.warnings,
        level: req.level,
        workload: prep.spec.workload.name().to_string(),
        target: req.target,
        configuration,
        system,
        provenance,
        runs: done,
        scores,
        energy_note,
        placement,
    }))
}

/// What a score's runs are asked beside the prepared run, as its journal keeps it.
struct Asked {
    level: Level,
    custom_target: bool,
    bagging: Option<usize>,
    epoch_time: EpochTime,
}

impl Asked {
    /// The configuration (without what the runs measure), the level, the target's origin and
    /// where the runs stop: a resumed score must ask the same.
    fn key(
        &self,
        p: &Prepared,
        target: &Target,
        ranks: usize,
        plan: Option<&crate::bagging::Plan>,
    ) -> serde_json::Map<String, serde_json::Value> {
        let mut key = configuration(p, None, target, None, ranks, plan);
        key.insert(
            "device asked".into(),
            serde_json::json!(format!("{:?} {}", p.spec.device, p.spec.precision)),
        );
        key.insert("level".into(), self.level.name().into());
        key.insert("custom target".into(), self.custom_target.into());
        key.insert("stop at target".into(), p.run().stop_at_target.into());
        key.insert("bagging".into(), serde_json::json!(self.bagging));
        if self.bagging.is_some() {
            key.insert("epoch time".into(), serde_json::json!(self.epoch_time));
        }
        key
    }
}

/// The runs finished so far into `journal`, told to `report` (on the reporting rank).
fn keep(
    journal: &mut Journal,
    done: &[Run],
    last: Option<&crate::train::Summary>,
    gpu: &Option<String>,
    energy_note: &str,
    root: bool,
    report: &dyn Report,
) {
    if !root {
        return;
    }
    journal.runs = done.to_vec();
    journal.parameters = last.map(|s| s.parameters).or(journal.parameters);
    journal.accelerator.clone_from(gpu);
    journal.energy_note = energy_note.to_string();
    report.kept(journal);
}

/// The reading of `span` stopped now (the GPU's energy over `gpu_seconds`), what it could not
/// measure told to `report`.
pub(super) fn stop(
    span: energy::Span,
    gpu_seconds: f64,
    report: &dyn Report,
) -> Result<energy::Reading, energy::EnergyError> {
    let (r, note) = span.stop(gpu_seconds);
    if let Some(n) = note {
        report.note(&n);
    }
    r
}
