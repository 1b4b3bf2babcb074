//! `roofline automl`: AIPerf's AutoML benchmark on the embedded trainer.

use crate::args::numbers;
use crate::exit::{Failure, CANCEL};
use anyhow::anyhow;
use roofline_automl::master::{weights_dir, Progress};
use roofline_automl::setup::{self, Request};
use roofline_plots::si;
use roofline_workloads::exchange::CommOptions;
use roofline_workloads::resnet::Version;
use roofline_workloads::run::{Depth, Device, Kind, Resolution, Spec};
use std::path::PathBuf;
use std::time::Duration;

#[derive(clap::Args)]
pub struct AutomlArgs {
    /// An ImageNet-style folder, DIR/train/<class>/*.jpg and DIR/val/<class>/*.jpg (held-out
    /// accuracy); synthetic, learnable images without it.
    #[arg(long, value_name = "DIR")]
    data: Option<PathBuf>,
    /// AIPerf's settings: ImageNet (--data) at 224², ResNet-50 v1 as the start (width 1,
    /// 3,4,6,3), rounds of 15, 30, 45 then 60 epochs, a budget of 1 hour (the rules' minimum),
    /// the series sampled every hour as AIPerf's score.py does. Any option given explicitly
    /// still wins.
    #[arg(long)]
    official: bool,
    /// How long the search runs (seconds, or with s, m, h: 90s, 3m, 1h). Default 3m (official:
    /// 1h). Trials still running when it ends stop at their next step; their finished epochs
    /// count.
    #[arg(long, value_parser = crate::args::parse_duration)]
    budget: Option<Duration>,
    /// Epochs of each round, comma-separated; the last repeats. A trial's round is its
    /// sequence number over the workers (AIPerf's); its patience min(6 + 2·round, 20) epochs
    /// on the validation loss; from round 4 it trains once more with a TPE draw (kernel, batch,
    /// dropout) and is the better of the two; trials of 10 to 79 epochs get AIPerf's predicted
    /// accuracy at epoch 90. Default 1,2,3 (official: 15,30,45,60).
    #[arg(long, value_name = "LIST")]
    rounds: Option<String>,
    /// Image size (square). Default 32 (official: 224).
    #[arg(long, value_name = "N")]
    resolution: Option<usize>,
    /// The starting ResNet's width multiplier. Default 0.125 (official: 1).
    #[arg(long)]
    width: Option<f64>,
    /// The starting ResNet's bottlenecks per stage. Default 1,1,1,1 (official: 3,4,6,3).
    #[arg(long, value_name = "A,B,C,D")]
    depth: Option<String>,
    /// Classes of the synthetic data (a folder has its own). Default 20 (few enough to learn in
    /// minutes, enough that the search does not reach 100 % at once).
    #[arg(long, default_value_t = 20)]
    classes: usize,
    /// Training images per epoch (synthetic; with --data, the first this many). Default 256.
    #[arg(long)]
    train_images: Option<usize>,
    /// Held-out images evaluated after every epoch (with --data, the first this many of
    /// DIR/val). Default 128 (official: 50000, ImageNet's validation set, which AIPerf's
    /// reference evaluates and counts).
    #[arg(long)]
    eval_images: Option<usize>,
    /// The starting batch (images per step). Default 32.
    #[arg(long)]
    batch: Option<usize>,
    /// Batch sizes, comma-separated: the per-trial TPE draws its batch uniformly between the
    /// smallest and the largest (AIPerf's 12 to 14 × the GPU's memory in GiB, rounded down to
    /// a multiple of 16). Default: half, the same and twice --batch.
    #[arg(long, value_name = "LIST")]
    batches: Option<String>,
    /// Kernel sizes the per-trial TPE draws among for the layers the search added (odd;
    /// default 3,5,7, AIPerf's).
    #[arg(long, value_name = "LIST")]
    kernels: Option<String>,
    /// Workers in this process; the cores (--threads) are split evenly among them, each worker
    /// trains its candidates data parallel on its share, or (--device cuda) on a GPU of its
    /// own. Default 1 on the CPU; with --device cuda one a GPU of this machine.
    #[arg(long)]
    workers: Option<usize>,
    /// Under mpirun/srun: MPI ranks per worker. Rank 0 is the master; the other ranks form
    /// teams of this many, each team a worker training its candidates data parallel
    /// (synchronous all-reduce inside the team). The ranks must share a file system (the
    /// buffer and the candidates' weights beside --output).
    #[arg(long, default_value_t = 1)]
    team: usize,
    /// Cores to use, one pinned thread per physical core (the rule every training verb
    /// follows); default all.
    #[arg(long)]
    threads: Option<usize>,
    /// Learning rate per 256 images (default 0.1), scaled with each candidate's batch.
    #[arg(long)]
    lr: Option<f64>,
    /// Seed of the synthetic data, the networks' initialisation and the search (same seed,
    /// same threads: the same candidates, apart from what timing decides).
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Start every candidate from pretrained ResNet-50 weights, as AIPerf's reference does
    /// (never from its parent): Keras's ResNet50 .h5 (the reference's file) or torchvision's
    /// state dict as safetensors. Each layer a candidate still has from ResNet-50, in its
    /// shape, takes the file's weights; layers the morphisms added or widened start from the
    /// seed. The file must fit the starting network (--classes, --width, --depth). Without it
    /// (and --from-parent) every candidate starts from He initialisation, AIPerf's default.
    #[arg(long, value_name = "FILE")]
    init: Option<PathBuf>,
    /// Start each child from its parent's trained weights, carried through the morphisms so
    /// that it computes what its parent computed (Net2Net): neither AIPerf's default nor its
    /// reference code's start, and named in automl.json's deviations.
    #[arg(long, conflicts_with = "init")]
    from_parent: bool,
    /// Convolution and dense layers a candidate may have (default: the start's + 24).
    #[arg(long)]
    max_layers: Option<usize>,
    /// Parameters a candidate may have (default: 4 × the start's).
    #[arg(long)]
    max_parameters: Option<f64>,
    /// Children sampled per morphism step (AIPerf: 8).
    #[arg(long, default_value_t = 8)]
    neighbours: usize,
    /// The FLOPS series' interval (seconds, or 90s, 6m). Default: the budget / 30, at least
    /// 1 s (official: 1h, as AIPerf's score.py samples).
    #[arg(long, value_parser = crate::args::parse_duration)]
    sample_every: Option<Duration>,
    /// A trial whose worker makes no training step for this long is ended and its candidate
    /// given to another worker.
    #[arg(long, value_parser = crate::args::parse_duration, default_value = "10m")]
    stall: Duration,
    /// Where automl.json goes (rewritten as it goes, at most every second or 20 × its writing
    /// time); the candidates' weights go to
    /// <stem>.weights/ beside it, the report to <stem>.html.
    #[arg(short, long, default_value = "automl.json")]
    output: PathBuf,
    /// Go on from --output (and the weights beside it): the finished candidates are kept, the
    /// clock goes on from where it stopped, the budget counts from the first start.
    #[arg(long)]
    resume: bool,
    /// Where the workers train: cpu (their share of the cores, in f32), or cuda (each worker
    /// on a GPU of its own, its candidates on cuDNN and cuBLAS; under mpirun/srun each rank on
    /// its own GPU, a team's gradients summed with NCCL).
    #[arg(long, value_enum, default_value = "cpu")]
    device: Device,
    /// With --device cuda: the convolutions' precision, f16 by default (mixed precision, f32
    /// master weights, dynamic loss scaling: AIPerf's rule asks for FP16 or more), or bf16,
    /// tf32, f32. The CPU trains in f32.
    #[arg(long, value_parser = crate::run_args::precision_parser())]
    precision: Option<roofline_model::Precision>,
}

struct Printed;

impl Progress for Printed {
    fn line(&self, line: &str) {
        eprintln!("{line}");
    }
}

/// The request the options make.
fn request(a: &AutomlArgs) -> Result<Request, Failure> {
    let off = a.official;
    if off && a.data.is_none() {
        return Err(Failure::Input(anyhow!(
            "--official runs on ImageNet: give --data DIR (DIR/train/<class>/*.jpg, DIR/val/<class>/*.jpg)"
        )));
    }
    let depth: Depth = a
        .depth
        .as_deref()
        .unwrap_or(if off { "3,4,6,3" } else { "1,1,1,1" })
        .parse()
        .map_err(|e| Failure::Input(anyhow!("--depth {e}")))?;
    let side = a.resolution.unwrap_or(if off { 224 } else { 32 });
    let budget = a
        .budget
        .unwrap_or(Duration::from_secs(if off { 3600 } else { 180 }));
    let rounds = match &a.rounds {
        Some(_) => numbers(&a.rounds, "--rounds")?,
        None if off => vec![15, 30, 45, 60],
        None => vec![1, 2, 3],
    };
    let spec = Spec {
        workload: Kind::Resnet50,
        data: a.data.clone(),
        batch: Some(a.batch.unwrap_or(32)),
        resolution: Some(Resolution { h: side, w: side }),
        steps: None,
        epochs: None,
        train_images: Some(a.train_images.unwrap_or(if off && a.data.is_some() {
            1_281_167
        } else {
            256
        })),
        eval_images: a.eval_images.unwrap_or(if off {
            roofline_model::automl::EVAL_IMAGES
        } else {
            128
        }),
        target_top1: None,
        target_map: None,
        eval_every: None,
        classes: a.classes,
        anchors: 9,
        width: a.width.unwrap_or(if off { 1.0 } else { 0.125 }),
        depth,
        version: Version::V1,
        warmup_steps: None,
        lr: a.lr,
        label_smoothing: 0.0,
        seed: a.seed,
        threads: a.threads,
        device: a.device,
        precision: a.precision.unwrap_or(match a.device {
            Device::Cuda => roofline_model::Precision::F16,
            Device::Cpu => roofline_model::Precision::F32,
        }),
        gpu: None,
        cuda_graph: Default::default(),
        decay_all: false,
        comm: CommOptions::default(),
        // Checked against the starting network when the run is prepared.
        init: a.init.clone(),
    };
    let workers = match a.workers {
        Some(w) => w,
        None => setup::default_workers(&spec)?,
    };
    Ok(Request {
        spec,
        budget,
        rounds,
        workers,
        team: a.team,
        batches: numbers(&a.batches, "--batches")?,
        kernels: numbers(&a.kernels, "--kernels")?,
        max_layers: a.max_layers,
        max_parameters: a.max_parameters,
        neighbours: a.neighbours,
        from_parent: a.from_parent,
        sample_every: a.sample_every.unwrap_or(if off {
            Duration::from_secs(3600)
        } else {
            (budget / 30).max(Duration::from_secs(1))
        }),
        stall: a.stall,
        out: a.output.clone(),
        resume: a.resume,
        fault: None,
    })
}

pub fn automl(a: &AutomlArgs) -> Result<(), Failure> {
    let req = request(a)?;
    let html = a.output.with_extension("html");
    // The report goes beside -o, so -o is the option to change for either.
    crate::args::check_writable(&a.output, "-o").map_err(Failure::Input)?;
    crate::args::check_writable(&html, "-o: the report goes beside it").map_err(Failure::Input)?;
    crate::exit::install_ctrlc()?;
    let launched = roofline_kernels::comm::launched_ranks();
    if launched.is_none() && a.team != 1 {
        return Err(Failure::Input(anyhow!(
            "--team {} sets MPI ranks per worker under mpirun/srun; in one process use --workers",
            a.team
        )));
    }
    if launched.is_some() && a.workers.is_some_and(|w| w != 1) {
        return Err(Failure::Input(anyhow!(
            "--workers splits one process's cores; under mpirun/srun every rank but the master is a worker: use --team for ranks per worker"
        )));
    }
    let result = match launched {
        None => setup::run(&req, &Printed, &CANCEL).map(Some),
        #[cfg(feature = "mpi")]
        Some(_) => roofline_automl::ranks::run(&req, &Printed, &CANCEL),
        #[cfg(not(feature = "mpi"))]
        Some(n) => {
            return Err(Failure::Input(anyhow!(
                "started by an MPI launcher with {n} ranks, but this roofline was built without MPI: rebuild it with `cargo build --release --features mpi`, or run one process (--workers N splits its cores)"
            )))
        }
    };
    // A worker rank: the master (rank 0) reports.
    if let Ok(None) = result {
        return Ok(());
    }
    // Whatever was kept (also when interrupted) gets its report.
    if let Ok(doc) = roofline_model::automl::Automl::read(&a.output) {
        roofline_model::write::write_atomic(&html, roofline_plots::automl::html(&doc).as_bytes())
            .map_err(|e| Failure::Run(anyhow!("{e}")))?;
    }
    let Some((doc, _)) = result? else {
        return Ok(());
    };
    let s = &doc.score;
    outln!("{}", doc.headline());
    for d in &doc.deviations {
        outln!("  departs from AIPerf's reference: {d}");
    }
    outln!(
        "  score (highest FLOPS of the series): {}FLOP/s; regulated score {}FLOP/s; error {:.4}{}",
        si(s.flops),
        si(s.regulated),
        s.error,
        s.best_candidate
            .map_or(String::new(), |b| format!(" (best: candidate {b})"))
    );
    outln!(
        "  {:.2} candidates a minute; the workers spent {:.1} % of the run training and {:.1} s searching; the master was busy {:.1} s ({:.2} % of the run)",
        s.candidates_per_minute,
        100.0 * s.training_share,
        s.search_seconds,
        s.master_seconds,
        if s.elapsed_s > 0.0 {
            100.0 * s.master_seconds / s.elapsed_s
        } else {
            0.0
        }
    );
    outln!(
        "  wrote {}, {} and the candidates' weights in {}",
        a.output.display(),
        html.display(),
        weights_dir(&a.output).display()
    );
    if let Some(b) = s.best_candidate {
        outln!(
            "  the best on the roofline: roofline place --workload automl:{}#{b} --machine machine.json",
            a.output.display()
        );
    }
    Ok(())
}
