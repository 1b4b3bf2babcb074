//! `roofline sweep` as one library call ([`sweep`]): SAIH's grid of problem sizes × process
//! counts, each point a `roofline place` run of its own (a child process of the binary: clean
//! memory, its own affinity; under the launcher for ranks) on the same machine.json, the
//! points and the strong-scaling series, the file rewritten after every point so that an
//! interrupted sweep keeps what it measured. The command line parses, calls it, draws the
//! charts and prints.

use super::sweep::{GridPoint, Processes, SweepSpec};
use super::{Kind, RunError};
use roofline_model::placement::Placement;
use roofline_model::sweep::{
    data_scaling, strong_scaling, weak_scaling, IntensityUnits, Problem, Sweep, SweepPoint,
    SWEEP_SCHEMA,
};
use roofline_model::{write::write_atomic, Machine};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// What a sweep is asked.
pub struct Request<'a> {
    pub workload: Kind,
    /// The grid.
    pub spec: SweepSpec,
    pub machine: &'a Machine,
    pub machine_path: &'a Path,
    /// sweep.json; each point's placement goes to `<name>-points/`.
    pub output: &'a Path,
    /// The binary each point runs (`roofline place …`).
    pub exe: PathBuf,
    /// The launcher for ranks, before `-np N`.
    pub mpirun: String,
    pub steps: usize,
    pub warm: usize,
    /// Each point trains this many epochs over its images (warm-up and measured steps
    /// together), instead of `warm` + `steps` whatever its images: SAIH's data axis for real.
    pub epochs: Option<usize>,
    pub data: Option<PathBuf>,
}

/// Hears a sweep's progress (the command line prints it).
pub trait Report {
    /// The sweep starts over `kind` ("threads", "ranks").
    fn header(&self, kind: &str);
    /// Point `ran` of `total` starts.
    fn started(&self, ran: usize, total: usize, problem: &Problem, kind: &str);
    /// A point ended: the sweep so far.
    fn point(&self, sweep: &Sweep);
    /// A point failed (its note is kept in the sweep).
    fn failed(&self, why: &str);
}

/// A finished sweep: the file's contents, each point's placement in its order, where the
/// placements are.
pub struct Swept {
    pub sweep: Sweep,
    pub placements: Vec<Placement>,
    pub points_dir: PathBuf,
}

/// Where a sweep of `epochs` per point (None: `--warm` + `--steps` steps; `filtered`: with
/// the model filter; `per_process`: each process's batch held) departs from SAIH, which trains
/// every point over its whole data: the data axis first where it is estimated, then what
/// always differs (SAIH's units) and what differs as asked.
pub fn deviations(epochs: Option<usize>, filtered: bool, per_process: bool) -> Vec<String> {
    let mut v = Vec::new();
    if epochs.is_none() {
        v.push("each point trains --warm + --steps steps whatever its --images, so not every image is read and the data axis is the epoch time estimated from the measured steps; SAIH trains each point over all its data (--epochs E reads every image, ⌈E × images / batch⌉ steps)".into());
    }
    v.push("analytic_flop_per_byte is the trainer's FLOPs per byte of the analytic minimum of memory traffic; SAIH's arithmetic intensity (Table 3: 808, 2500, 1442 for its S, M, L 3D CNNs) is FLOPs per memory transaction nvprof counts, reads plus writes, 32 bytes each in DRAM: for the same traffic SAIH's figure is 32 times ours, and measured traffic exceeds the minimum (intensity_units holds Table 3 in both units)".into());
    if !per_process {
        v.push("strong scaling holds the global batch (--batch) over the process counts; SAIH's node scaling holds each GPU's batch (10, 4, 1 for its S, M, L models), the global batch growing with the nodes: --per-process-batch runs SAIH's".into());
    }
    if filtered {
        v.push("the model filter (--model-flops) counts the trainer's FLOPs per sample (forward and backward as they run), not SAIH's eq. 1 (2 × 3 × the forward multiply-adds): 24.3 against 24.6 GFLOP an image for ResNet-50".into());
    }
    v
}

/// Runs the sweep `req` (Ctrl-C through `cancel` ends it after the running point, keeping
/// what was measured).
pub fn sweep(
    req: &Request<'_>,
    report: &dyn Report,
    cancel: &AtomicBool,
) -> Result<Swept, RunError> {
    let plan = req
        .spec
        .plan()
        .map_err(|e| RunError::Input(e.to_string()))?;
    let (grid, counts, processes) = (&plan.grid, &plan.counts, plan.processes);
    let kind = processes.name();
    let stem = req
        .output
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sweep".into());
    let dir = req.output.with_file_name(format!("{stem}-points"));
    std::fs::create_dir_all(&dir)
        .map_err(|e| RunError::Input(format!("{}: {e}", dir.display())))?;
    let start = Instant::now();
    let total = grid.len() * counts.len();
    let mut result = Sweep {
        schema: SWEEP_SCHEMA.into(),
        workload: req.workload.name().to_string(),
        processes: kind.into(),
        machine: req.machine_path.display().to_string(),
        provenance: roofline_collectors::provenance::here(
            roofline_kernels::probe::node::cpu_here(
                roofline_kernels::affinity::allowed_cpus().len(),
            ),
            false,
            start,
        ),
        points: Vec::new(),
        scaling: Vec::new(),
        weak_scaling: Vec::new(),
        data_scaling: Vec::new(),
        per_process_batch: req.spec.per_process_batch,
        intensity_units: Some(IntensityUnits::saih()),
        notes: plan.notes.clone(),
        deviations: deviations(
            req.epochs,
            req.spec.model_flops.is_some(),
            req.spec.per_process_batch,
        ),
    };
    report.header(kind);
    let mut ran = 0;
    // Each point's placement, beside it (the trajectory chart draws them).
    let mut placements: Vec<Placement> = Vec::new();
    for g in grid {
        for &p in counts {
            let batch = plan.global_batch(p);
            ran += 1;
            let idx = result.points.len();
            let file = dir.join(format!("point-{idx}.json"));
            let problem = Problem {
                images: g.images,
                resolution: g.resolution.to_string(),
                width: g.width,
                depth: g.depth.to_string(),
                processes: p,
                batch,
            };
            if cancel.load(Ordering::SeqCst) {
                return Err(interrupted(&result, total, req.output));
            }
            report.started(ran, total, &problem, kind);
            match run_point(req, processes, p, batch, g, &file) {
                Ok(pl) => {
                    let pt = SweepPoint::from_placement(
                        idx,
                        problem,
                        g.flops_per_sample,
                        req.epochs,
                        &pl,
                        req.machine,
                        &file.file_name().unwrap_or_default().to_string_lossy(),
                    );
                    result.points.push(pt);
                    placements.push(pl);
                    result.scaling = strong_scaling(&result.points);
                    result.weak_scaling = weak_scaling(&result.points);
                    result.data_scaling = data_scaling(&result.points);
                    report.point(&result);
                }
                Err(RunError::Interrupted) => return Err(interrupted(&result, total, req.output)),
                Err(e) => {
                    let why = e.to_string();
                    report.failed(&why);
                    result.notes.push(format!(
                        "{} at {p} {kind}: failed: {why}",
                        problem.size_label()
                    ));
                }
            }
            // What is measured so far survives an interruption.
            let text = result.to_json().map_err(|e| RunError::Run(e.to_string()))?;
            write_atomic(req.output, text.as_bytes())
                .map_err(|e| RunError::Input(e.to_string()))?;
        }
    }
    if result.points.is_empty() {
        return Err(RunError::Run(format!(
            "no point of the sweep ran: {}",
            result.notes.join("; ")
        )));
    }
    Ok(Swept {
        sweep: result,
        placements,
        points_dir: dir,
    })
}

/// An interrupted sweep's ending: what of it is on disk.
fn interrupted(result: &Sweep, total: usize, output: &Path) -> RunError {
    if result.points.is_empty() {
        RunError::Interrupted
    } else {
        RunError::InterruptedKept(format!(
            "{} of the {total} points in {} (written after each point; the charts are drawn at the end)",
            result.points.len(),
            output.display()
        ))
    }
}

/// Runs one point: `roofline place` in a child process (under the launcher for ranks), at the
/// global `batch`.
fn run_point(
    req: &Request<'_>,
    processes: Processes,
    p: usize,
    batch: usize,
    g: &GridPoint,
    out: &Path,
) -> Result<Placement, RunError> {
    let ranks = processes == Processes::Ranks;
    let mut c = if ranks {
        let mut words = req.mpirun.split_whitespace();
        let mut c = Command::new(words.next().unwrap_or("mpirun"));
        c.args(words).arg("-np").arg(p.to_string()).arg(&req.exe);
        c
    } else {
        Command::new(&req.exe)
    };
    let r = g.resolution;
    // With epochs, every image is read: the steps an epoch takes, warm-up included.
    let steps = match req.epochs {
        Some(e) => (e * g.images)
            .div_ceil(batch.max(1))
            .saturating_sub(req.warm)
            .max(1),
        None => req.steps,
    };
    c.args(["place", "--workload", req.workload.name(), "--machine"])
        .arg(req.machine_path)
        .args(["--resolution", &format!("{}x{}", r.h, r.w)])
        .args(["--train-images", &g.images.to_string()])
        .args(["--width", &g.width.to_string()])
        .args(["--depth", &g.depth.to_string()])
        .args(["--batch", &batch.to_string()])
        .args([
            "--steps",
            &steps.to_string(),
            "--warm",
            &req.warm.to_string(),
        ])
        .args(["--threads", &if ranks { 1 } else { p }.to_string()])
        .arg("-o")
        .arg(out);
    if let Some(d) = &req.data {
        c.arg("--data").arg(d);
    }
    let o = c
        .output()
        .map_err(|e| RunError::Run(format!("cannot start the point's run: {e}")))?;
    match o.status.code() {
        Some(0) => Placement::read(out).map_err(|e| RunError::Run(e.to_string())),
        Some(130) | None => Err(RunError::Interrupted),
        Some(code) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err
                .lines()
                .rev()
                .find(|l| l.contains("error"))
                .or_else(|| err.lines().last())
                .unwrap_or("")
                .trim()
                .to_string();
            Err(RunError::Run(format!("exit {code}: {last}")))
        }
    }
}
