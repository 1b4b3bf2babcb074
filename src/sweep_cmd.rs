//! `roofline sweep`: a training workload over a grid of problem sizes (training samples, image
//! size, model variants — or SAIH's model filter, `--model-flops LO..HI`) and process counts
//! (threads, or MPI ranks through a launcher), each point a `roofline place` run of its own
//! (a child process: clean memory, its own affinity) on the same machine.json; the points, the
//! strong-scaling series and three charts (% of peak against size, scaling, the trajectory on the
//! roofline). `sweep.json` is rewritten after every point, so an interrupted sweep keeps what it
//! measured.

use crate::Failure;
use anyhow::anyhow;
use roofline_model::placement::Placement;
use roofline_model::sweep::{strong_scaling, Problem, Sweep, SweepPoint, SWEEP_SCHEMA};
use roofline_model::{write::write_atomic, Machine};
use roofline_workloads::run::sweep::{FlopsRange, GridPoint, Processes, SweepPlan, SweepSpec};
use roofline_workloads::run::Kind;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

#[derive(clap::Args)]
pub struct SweepArgs {
    /// The training workload: resnet50 or ewa.
    #[arg(long, value_enum, default_value = "resnet50")]
    pub workload: Kind,
    /// The machine's ceilings (`roofline probe`), that every point is placed on.
    #[arg(long, value_name = "FILE")]
    pub machine: PathBuf,
    /// Training samples per point, a list (SAIH's data augment: the epoch grows with them).
    #[arg(long, value_delimiter = ',', default_value = "256")]
    pub images: Vec<usize>,
    /// Image sizes, a list of N or HxW (default 64 for resnet50, 128x192 for ewa).
    #[arg(long, value_delimiter = ',')]
    pub resolution: Vec<roofline_workloads::run::Resolution>,
    /// Backbone width multipliers, a list (default 0.25; with --model-flops the candidates,
    /// default 0.125,0.25,0.5,1).
    #[arg(long, value_delimiter = ',')]
    pub width: Vec<f64>,
    /// Blocks per stage, a list separated by `;` (default 1,1,1,1; with --model-flops the
    /// candidates, default 1,1,1,1;2,2,2,2;3,4,6,3).
    #[arg(long, value_delimiter = ';')]
    pub depth: Vec<roofline_workloads::run::Depth>,
    /// SAIH's model filter: keep the variants (width × depth at each resolution) whose analytic
    /// training FLOPs per sample lie in LO..HI (e.g. 1e8..5e9); the rest are listed as left out.
    #[arg(long, value_name = "LO..HI")]
    pub model_flops: Option<FlopsRange>,
    /// Threads per point, a list (processes of one node; default: every CPU roofline may use).
    #[arg(long, value_delimiter = ',', conflicts_with = "ranks")]
    pub threads: Vec<usize>,
    /// MPI ranks per point, a list: each point runs under `--mpirun` with -np N (one thread
    /// per rank; roofline built with --features mpi).
    #[arg(long, value_delimiter = ',')]
    pub ranks: Vec<usize>,
    /// The launcher for --ranks, before `-np N` (e.g. "srun" does not fit: use
    /// "mpirun --bind-to core").
    #[arg(long, default_value = "mpirun")]
    pub mpirun: String,
    /// Global batch of every point (default 16; it must divide among the ranks).
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// Measured steps per point (after --warm).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    #[arg(long, default_value_t = 1)]
    pub warm: usize,
    /// Train on an image folder or EWA files instead of synthetic data (I/O then grows with
    /// --images, as SAIH measures).
    #[arg(long)]
    pub data: Option<PathBuf>,
    /// Where to write sweep.json (roofline/sweep/v1); the charts go beside it
    /// (<name>-trend.svg, -scaling.svg, -roofline.svg) and each point's placement in
    /// <name>-points/.
    #[arg(short, long, default_value = "sweep.json")]
    pub output: PathBuf,
}

pub fn sweep(a: &SweepArgs) -> Result<(), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    let machine = Machine::read(&a.machine).map_err(|e| {
        input(format!(
            "{e}; sweep places every point: run `roofline probe -o {}` first",
            a.machine.display()
        ))
    })?;
    crate::args::check_writable(&a.output, "-o").map_err(Failure::Input)?;
    // Ctrl-C ends the running point (the child has its own handler); the sweep then says what
    // it kept.
    crate::install_ctrlc()?;
    let SweepPlan {
        grid,
        notes,
        processes,
        counts,
    } = SweepSpec {
        workload: a.workload,
        resolutions: a.resolution.clone(),
        widths: a.width.clone(),
        depths: a.depth.clone(),
        images: a.images.clone(),
        model_flops: a.model_flops,
        threads: a.threads.clone(),
        ranks: a.ranks.clone(),
        batch: a.batch,
        steps: a.steps,
    }
    .plan()
    .map_err(|e| input(e.to_string()))?;
    let kind = processes.name();
    let stem = a
        .output
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sweep".into());
    let dir = a.output.with_file_name(format!("{stem}-points"));
    std::fs::create_dir_all(&dir).map_err(|e| input(format!("{}: {e}", dir.display())))?;
    let start = Instant::now();
    let total = grid.len() * counts.len();
    let mut result = Sweep {
        schema: SWEEP_SCHEMA.into(),
        workload: a.workload.name().to_string(),
        processes: kind.into(),
        machine: a.machine.display().to_string(),
        provenance: crate::probe_cmd::provenance(
            roofline_kernels::probe::node::cpu_here(
                roofline_kernels::affinity::allowed_cpus().len(),
            ),
            false,
            start,
        ),
        points: Vec::new(),
        scaling: Vec::new(),
        notes,
    };
    crate::output::sweep::header(kind);
    let mut ran = 0;
    // Each point's placement, beside it (the trajectory chart draws them).
    let mut placements: Vec<Placement> = Vec::new();
    for g in &grid {
        for &p in &counts {
            ran += 1;
            let idx = result.points.len();
            let file = dir.join(format!("point-{idx}.json"));
            let problem = Problem {
                images: g.images,
                resolution: g.resolution.to_string(),
                width: g.width,
                depth: g.depth.to_string(),
                processes: p,
            };
            if crate::CANCEL.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(interrupted(&result, total, &a.output));
            }
            eprintln!(
                "point {ran}/{total}: {} at {p} {kind} …",
                problem.size_label()
            );
            match run_point(a, processes, p, g, &file) {
                Ok(pl) => {
                    let pt = SweepPoint::from_placement(
                        idx,
                        problem,
                        g.flops_per_sample,
                        &pl,
                        &machine,
                        &file.file_name().unwrap_or_default().to_string_lossy(),
                    );
                    result.points.push(pt);
                    placements.push(pl);
                    result.scaling = strong_scaling(&result.points);
                    crate::output::sweep::row(result.points.last(), &result);
                }
                Err(Failure::Interrupted) => return Err(interrupted(&result, total, &a.output)),
                Err(e) => {
                    let why = match e {
                        Failure::Input(e) | Failure::Run(e) => e.to_string(),
                        _ => "failed".into(),
                    };
                    eprintln!("  failed: {why}");
                    result.notes.push(format!(
                        "{} at {p} {kind}: failed: {why}",
                        problem.size_label()
                    ));
                }
            }
            // What is measured so far survives an interruption.
            let text = result.to_json().map_err(|e| Failure::Run(e.into()))?;
            write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
        }
    }
    if result.points.is_empty() {
        return Err(Failure::Run(anyhow!(
            "no point of the sweep ran: {}",
            result.notes.join("; ")
        )));
    }
    let charts = charts(&result, &placements, &machine, &a.output)?;
    crate::output::sweep::scaling(&result, kind);
    for n in &result.notes {
        println!("note: {n}");
    }
    println!(
        "wrote {}, {} and {}/",
        a.output.display(),
        charts.join(", "),
        dir.display()
    );
    Ok(())
}

/// An interrupted sweep's ending: what of it is on disk.
fn interrupted(result: &Sweep, total: usize, output: &Path) -> Failure {
    if result.points.is_empty() {
        Failure::Interrupted
    } else {
        Failure::InterruptedKept(format!(
            "{} of the {total} points in {} (written after each point; the charts are drawn at the end)",
            result.points.len(),
            output.display()
        ))
    }
}

/// Runs one point: `roofline place` in a child process (under the launcher for ranks).
fn run_point(
    a: &SweepArgs,
    processes: Processes,
    p: usize,
    g: &GridPoint,
    out: &Path,
) -> Result<Placement, Failure> {
    let exe = std::env::current_exe().map_err(|e| Failure::Run(e.into()))?;
    let ranks = processes == Processes::Ranks;
    let mut c = if ranks {
        let mut words = a.mpirun.split_whitespace();
        let mut c = Command::new(words.next().unwrap_or("mpirun"));
        c.args(words).arg("-np").arg(p.to_string()).arg(exe);
        c
    } else {
        Command::new(exe)
    };
    let r = g.resolution;
    c.args(["place", "--workload", a.workload.name(), "--machine"])
        .arg(&a.machine)
        .args(["--resolution", &format!("{}x{}", r.h, r.w)])
        .args(["--train-images", &g.images.to_string()])
        .args(["--width", &g.width.to_string()])
        .args(["--depth", &g.depth.to_string()])
        .args(["--batch", &a.batch.to_string()])
        .args([
            "--steps",
            &a.steps.to_string(),
            "--warm",
            &a.warm.to_string(),
        ])
        .args(["--threads", &if ranks { 1 } else { p }.to_string()])
        .arg("-o")
        .arg(out);
    if let Some(d) = &a.data {
        c.arg("--data").arg(d);
    }
    let o = c
        .output()
        .map_err(|e| Failure::Run(anyhow!("cannot start the point's run: {e}")))?;
    match o.status.code() {
        Some(0) => Placement::read(out).map_err(|e| Failure::Run(e.into())),
        Some(130) | None => Err(Failure::Interrupted),
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
            Err(Failure::Run(anyhow!("exit {code}: {last}")))
        }
    }
}

/// The sweep's charts beside the output (`placements` are the points', in their order);
/// returns their paths.
fn charts(
    s: &Sweep,
    placements: &[Placement],
    m: &Machine,
    out: &Path,
) -> Result<Vec<String>, Failure> {
    let stem = out
        .file_stem()
        .map(|x| x.to_string_lossy().into_owned())
        .unwrap_or_else(|| "sweep".into());
    let mut written = Vec::new();
    for (suffix, svg) in
        roofline_plots::sweep::charts(s, placements, m).map_err(|e| Failure::Run(anyhow!("{e}")))?
    {
        let p = out.with_file_name(format!("{stem}-{suffix}.svg"));
        write_atomic(&p, svg.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
        written.push(p.display().to_string());
    }
    Ok(written)
}
