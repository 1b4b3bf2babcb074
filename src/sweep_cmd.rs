//! `roofline sweep`: a training workload over a grid of problem sizes (training samples, image
//! size, model variants — or SAIH's model filter, `--model-flops LO..HI`) and process counts
//! (threads, or MPI ranks through a launcher), each point a `roofline place` run of its own
//! (a child process: clean memory, its own affinity) on the same machine.json; the points, the
//! strong-scaling series and three charts (% of peak against size, scaling, the trajectory on the
//! roofline). `sweep.json` is rewritten after every point, so an interrupted sweep keeps what it
//! measured.

use crate::exit::Failure;
use anyhow::anyhow;
use roofline_model::placement::Placement;
use roofline_model::sweep::{Problem, Sweep};
use roofline_model::{write::write_atomic, Machine};
use roofline_workloads::run::sweep::{FlopsRange, SweepSpec};
use roofline_workloads::run::sweeping::{self, Swept};
use roofline_workloads::run::Kind;
use std::path::{Path, PathBuf};

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
    /// SAIH's data scaling: --images is the whole set, and the points train on 1/D of it for
    /// each D in the list (SAIH: 64,32,16,8,4,2,1 at 4 nodes); sweep.json's data_scaling
    /// holds each share's FLOP/s per process against the smallest share's.
    #[arg(long, value_delimiter = ',', value_name = "D,…")]
    pub data_shares: Vec<usize>,
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
    /// Threads per point, a list (processes of one node, one pinned thread per physical core as
    /// every verb chooses them; default: all the cores roofline may use).
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
    /// Global batch of every point (default 16; it must divide among the ranks), or with
    /// --per-process-batch each thread's or rank's.
    #[arg(long, default_value_t = 16)]
    pub batch: usize,
    /// --batch is each process's, so that the global batch grows with the processes: SAIH's
    /// node scaling (its per-GPU batches are 10, 4 and 1), the speedup then taken from the
    /// epoch's time. Without it strong scaling holds one global batch.
    #[arg(long)]
    pub per_process_batch: bool,
    /// Measured steps per point (after --warm).
    #[arg(long, default_value_t = 3)]
    pub steps: usize,
    /// Warm-up steps per point, run before the measured --steps and not timed (the first
    /// step allocates and fills the caches).
    #[arg(long, default_value_t = 1)]
    pub warm: usize,
    /// Train each point this many epochs over its --images (warm-up and measured steps
    /// together: ⌈E × images / batch⌉ steps) instead of --warm + --steps whatever its images,
    /// so that every image is read and the data axis is real (SAIH trains each point 60
    /// epochs). Without it each point's epoch time is estimated from its measured steps.
    #[arg(long, value_name = "E", value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..))]
    pub epochs: Option<usize>,
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
    // Every thread count is checked here, as the other verbs check theirs, rather than by
    // the first point that fails.
    for &t in &a.threads {
        roofline_kernels::affinity::cores(Some(t))
            .map_err(|e| Failure::Input(anyhow!("--threads {t}: {e}")))?;
    }
    crate::exit::install_ctrlc()?;
    let req = sweeping::Request {
        workload: a.workload,
        spec: SweepSpec {
            workload: a.workload,
            resolutions: a.resolution.clone(),
            widths: a.width.clone(),
            depths: a.depth.clone(),
            images: a.images.clone(),
            model_flops: a.model_flops,
            threads: a.threads.clone(),
            ranks: a.ranks.clone(),
            batch: a.batch,
            per_process_batch: a.per_process_batch,
            steps: a.steps,
            data_shares: a.data_shares.clone(),
        },
        machine: &machine,
        machine_path: &a.machine,
        output: &a.output,
        exe: std::env::current_exe().map_err(|e| Failure::Run(e.into()))?,
        mpirun: a.mpirun.clone(),
        steps: a.steps,
        warm: a.warm,
        epochs: a.epochs,
        data: a.data.clone(),
    };
    let Swept {
        sweep: result,
        placements,
        points_dir: dir,
    } = sweeping::sweep(&req, &Printed, &crate::exit::CANCEL)?;
    let kind = result.processes.as_str();
    let charts = charts(&result, &placements, &machine, &a.output)?;
    crate::output::sweep::scaling(&result, kind);
    crate::output::sweep::intensity(&result);
    for n in &result.notes {
        outln!("note: {n}");
    }
    for d in &result.deviations {
        outln!("departs from SAIH: {d}");
    }
    outln!(
        "wrote {}, {} and {}/",
        a.output.display(),
        charts.join(", "),
        dir.display()
    );
    Ok(())
}

/// The sweep's progress: the table on stdout as points end, the rest on stderr.
struct Printed;

impl sweeping::Report for Printed {
    fn header(&self, kind: &str) {
        crate::output::sweep::header(kind);
    }
    fn started(&self, ran: usize, total: usize, problem: &Problem, kind: &str) {
        eprintln!(
            "point {ran}/{total}: {} at {} {kind} …",
            problem.size_label(),
            problem.processes
        );
    }
    fn point(&self, sweep: &Sweep) {
        crate::output::sweep::row(sweep.points.last(), sweep);
    }
    fn failed(&self, why: &str) {
        eprintln!("  failed: {why}");
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
