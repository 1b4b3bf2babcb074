//! `roofline probe` and `roofline probe --check`: argument checks, the node probe (CPU and
//! GPUs), storage, and under mpirun the distributed run (communication, gathering, aggregates).

use crate::exit::{Failure, CANCEL};
use crate::output;
use anyhow::anyhow;
use roofline_kernels::probe::node::{self, Devices};
use roofline_kernels::probe::run::{self, Request, RunError};
use roofline_kernels::probe::{Progress, Section};
use roofline_model::{write::write_atomic, Machine};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

mod progress;
mod runs;

use progress::progress_bar;

/// What `roofline probe` was asked.
#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Where to write the result.
    #[arg(short, long, default_value = "machine.json")]
    pub output: PathBuf,
    /// Fewer repeats and a coarser sweep (same ceiling ids); about 20 s on 2 cores (19–22 s
    /// on a 2-vCPU Zen 3 VM, 25 runs).
    #[arg(long)]
    pub quick: bool,
    /// Cap the CPU kernels' instruction set: avx512, avx2 or scalar (the portable code; on
    /// aarch64 neon or scalar), to measure and check a narrower path on a wider CPU (as the
    /// environment variable ROOFLINE_ISA does). The GEMM and convolution ceilings use the gemm
    /// crate's own dispatch.
    #[arg(long, value_name = "ISA", value_parser = parse_isa)]
    pub isa: Option<roofline_kernels::cpu::isa::Isa>,
    /// Measure only these sections, comma-separated: fma, mem, gemm, conv, copy (host-device
    /// and peer copies, GPUs only), comm (between MPI ranks, under mpirun), io (storage; as
    /// --io).
    #[arg(long, value_name = "LIST")]
    pub only: Option<String>,
    /// Threads for the `all` ceilings, one pinned per physical core: the first N cores roofline
    /// may use (default: all of them); the rule of every verb. N beyond the cores is an error
    /// that says how many there are.
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
    /// Probe N times (1 to 50) and write one calibrated baseline for `roofline gate`: each
    /// ceiling is the median run's, and every run's value and clock are kept, so that gate
    /// holds a later run to the spread measured between these runs on this runner (a CI
    /// baseline: `--quick --runs 5`, about 2 minutes on 2 cores). A run measured on a busy
    /// machine is left out; the file is rewritten after every run, so Ctrl-C keeps the runs
    /// finished.
    #[arg(long, default_value_t = 1, value_name = "N", value_parser = parse_runs, conflicts_with = "check")]
    pub runs: usize,
    /// Print machine.json on stdout instead of the table (the file is written too).
    #[arg(long)]
    pub json: bool,
    /// What to probe: `auto` probes the CPU and every NVIDIA GPU found (saying so when
    /// none is); `cpu` only the CPU; `cuda` only the GPUs, and fails (exit 2) without an
    /// NVIDIA driver.
    #[arg(long, value_enum, default_value = "auto")]
    pub device: Devices,
    /// GPU self-test: run every GPU kernel and library call once on small inputs, compare
    /// with CPU references, print pass/fail per kernel (exit 1 on any failure). Writes
    /// nothing. The first thing to run on a new GPU machine.
    #[arg(long)]
    pub check: bool,
    /// Also measure how fast storage is read (large files sequentially; 100 KiB files in a
    /// random order, as an image dataset): test files are written under PATH (default: the
    /// temporary folder), read back with O_DIRECT where possible, and removed.
    #[arg(long, value_name = "PATH", num_args = 0..=1)]
    pub io: Option<Option<PathBuf>>,
    /// Largest message of the communication sweeps (under mpirun): e.g. 256M (default),
    /// 4G.
    #[arg(long, default_value = "256M", value_name = "BYTES", value_parser = crate::args::parse_bytes)]
    pub max_size: usize,
    /// Under mpirun: seconds a rank waits for the others in one operation before the run
    /// ends with a message naming who did not answer (a rank died or hangs).
    #[arg(long, default_value = "60", value_name = "SECONDS", value_parser = crate::args::parse_seconds)]
    pub comm_timeout: Duration,
    /// Under mpirun with several nodes: a node whose ceiling falls more than this many percent
    /// (plus the noise of its own samples) below the fleet's median is named in the outliers,
    /// and so is a link below the median link by as much.
    #[arg(long, default_value = "10", value_name = "PERCENT", value_parser = parse_percent,
          allow_negative_numbers = true)]
    pub fleet_margin: f64,
    /// The batch of ResNet-50's convolutions in the GPU convolution ceilings (the detector's
    /// run at its own training batch, 2): the trainer's 128 by default, in the quick probe as
    /// in the full one. Set it to the batch your training runs.
    #[arg(long, default_value_t = roofline_kernels::probe::gpu::CONV_BATCH, value_name = "N", value_parser = parse_batch)]
    pub conv_batch: usize,
    /// Seconds all the GPU convolution searches may take together (each shape, direction and
    /// precision searches cuDNN's methods for the fastest correct one): by default 30 s in the
    /// quick probe, 240 s in the full one. Each search gets an even share of what is left, at
    /// most 0.25 s (quick) or 1 s (full); once spent, a search keeps cuDNN's measured legacy
    /// choice and the row says how many methods it did not try.
    #[arg(long, value_name = "SECONDS", value_parser = crate::args::parse_seconds)]
    pub conv_search_budget: Option<Duration>,
}

/// `--conv-batch`: a batch from 1 to 4096.
fn parse_batch(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: expected a batch from 1 to 4096 images")),
    }
}

/// `--runs`: 1 to 50 probes.
fn parse_runs(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=50).contains(&n) => Ok(n),
        _ => Err(format!("{s:?}: expected a number of runs from 1 to 50")),
    }
}

/// `--fleet-margin`: a percentage in [0, 100).
fn parse_percent(s: &str) -> Result<f64, String> {
    let v: f64 = s
        .trim()
        .trim_end_matches('%')
        .parse()
        .map_err(|_| format!("{s:?}: expected a percentage such as 10"))?;
    if (0.0..100.0).contains(&v) {
        Ok(v / 100.0)
    } else {
        Err(format!("{s:?}: expected a percentage from 0 to below 100"))
    }
}

/// The sections of this run: `--only`, plus `io` when `--io` was given.
fn sections_of(a: &ProbeArgs) -> Result<Vec<Section>, Failure> {
    let mut s = Section::parse_list(a.only.as_deref()).map_err(|e| Failure::Input(anyhow!(e)))?;
    if a.io.is_some() && !s.contains(&Section::Io) {
        s.push(Section::Io);
    }
    Ok(s)
}

/// `--isa`: an instruction set by name.
fn parse_isa(s: &str) -> Result<roofline_kernels::cpu::isa::Isa, String> {
    roofline_kernels::cpu::isa::Isa::parse(s).ok_or_else(|| {
        format!(
            "{s:?}: expected {}",
            roofline_kernels::cpu::isa::Isa::expected()
        )
    })
}

/// `roofline probe`: the request from the arguments, the probe (`kernels::probe::run`), the
/// file and the table.
pub fn probe(a: ProbeArgs) -> Result<(), Failure> {
    if let Some(isa) = a.isa {
        // Read by the kernels wherever they choose their instruction set (this thread only
        // runs yet: nothing reads the environment concurrently).
        std::env::set_var(roofline_kernels::cpu::isa::ENV, isa.name());
    }
    if let Some(Some(dir)) = &a.io {
        // Checked before minutes of probing: the test files are written there.
        if !dir.is_dir() {
            return Err(Failure::Input(anyhow!(
                "--io {} is not a folder",
                dir.display()
            )));
        }
        crate::args::check_writable(&dir.join(".roofline-io-test"), "--io")
            .map_err(Failure::Input)?;
    }
    let io = a.io.as_ref().map(|p| match p {
        Some(p) => (p.clone(), roofline_kernels::io::label_for(p)),
        None => (std::env::temp_dir(), "tmp".to_string()),
    });
    let req = Request {
        sections: sections_of(&a)?,
        devices: a.device,
        threads: a.threads,
        quick: a.quick,
        io,
        max_size: a.max_size,
        comm_timeout: a.comm_timeout,
        fleet_margin: a.fleet_margin,
        output: a.output.clone(),
        conv: roofline_kernels::probe::gpu::ConvOptions {
            batch: a.conv_batch,
            search_budget_s: a.conv_search_budget.map(|d| d.as_secs_f64()),
        },
    };
    if a.runs > 1 && roofline_kernels::comm::launched_rank().is_some() {
        return Err(Failure::Input(anyhow!(
            "--runs calibrates one machine's baseline; under mpirun the fleet's nodes are measured against one another (leave --runs out)"
        )));
    }
    crate::exit::install_ctrlc()?;
    let shown = roofline_kernels::comm::launched_rank().is_none_or(|r| r == 0);
    if a.runs > 1 {
        return runs::calibrate(&a, &req);
    }
    let progress = progress_bar(shown);
    match run::probe(&req, &CANCEL, &progress) {
        Ok(Some(m)) => finish(&a, &m),
        Ok(None) => Ok(()),
        Err(e) => {
            progress.finish();
            Err(failure(e))
        }
    }
}

pub(crate) fn failure(e: RunError) -> Failure {
    match e {
        RunError::Interrupted => Failure::Interrupted,
        RunError::OtherRank(code) => Failure::Quiet(code),
        RunError::Output { path, source } => {
            Failure::Input(crate::args::unwritable(&path, "-o", source))
        }
        e if e.is_input() => Failure::Input(anyhow!("{e}")),
        e => Failure::Run(anyhow!("{e}")),
    }
}

/// Writes machine.json and prints the table (or the JSON).
fn finish(a: &ProbeArgs, m: &Machine) -> Result<(), Failure> {
    if CANCEL.load(Ordering::SeqCst) {
        return Err(Failure::Interrupted);
    }
    let text = m.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    if a.json {
        outln!("{text}");
    } else {
        output::machine_table(m);
        outln!(
            "\nwrote {} ({:.0} s); draw it with: roofline plot {}",
            a.output.display(),
            m.provenance.duration_s,
            a.output.display()
        );
    }
    failed_checks(m)
}

/// Exit 1 when a result check failed (its ceiling left out, the rest written), naming each.
pub(crate) fn failed_checks(m: &Machine) -> Result<(), Failure> {
    if m.failures.is_empty() {
        return Ok(());
    }
    let list: Vec<String> = m
        .failures
        .iter()
        .map(|f| format!("{} {}: {}", f.on, f.kernel, f.error))
        .collect();
    Err(Failure::Run(anyhow!(
        "{} result check(s) failed; their ceilings are left out of the file, everything else was written: {} (`roofline probe --check` runs every GPU kernel once against its CPU reference)",
        list.len(),
        list.join("; ")
    )))
}

/// `roofline probe --check`: every GPU kernel once, against CPU references.
pub fn gpu_check(devices: Devices) -> Result<(), Failure> {
    crate::exit::install_ctrlc()?;
    let r = node::gpu_check(devices, &CANCEL).map_err(Failure::from)?;
    let failed = output::check_table(&r);
    if failed > 0 {
        return Err(Failure::Run(anyhow!("{failed} GPU kernel check(s) failed")));
    }
    Ok(())
}
