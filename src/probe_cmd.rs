//! `roofline probe` and `roofline probe --check`: argument checks, the node probe (CPU and
//! GPUs), storage, and under mpirun the distributed run (communication, gathering, aggregates).

use crate::{output, Failure, CANCEL};
use anyhow::anyhow;
use roofline_kernels::probe::node::{self, Devices, NodeConfig, NodeError};
use roofline_kernels::probe::{Progress, Section};
use roofline_model::{write::write_atomic, Machine, Provenance};
use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

pub(crate) struct Bar(pub(crate) Option<indicatif::ProgressBar>);

impl Progress for Bar {
    fn begin(&self, total: u64) {
        // The CPU probe and then the GPU probe each announce their own steps.
        if let Some(b) = &self.0 {
            b.inc_length(total);
        }
    }
    fn advance(&self, label: &str) {
        if let Some(b) = &self.0 {
            if b.position() > 0 || !b.message().is_empty() {
                b.inc(1);
            }
            b.set_message(label.to_string());
        }
    }
}

/// What `roofline probe` was asked.
#[derive(clap::Args)]
pub struct ProbeArgs {
    /// Where to write the result.
    #[arg(short, long, default_value = "machine.json")]
    pub output: PathBuf,
    /// Fewer repeats and a coarser sweep (same ceiling ids); under 30 s on 2 cores.
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
    /// Threads for the `all` ceilings (default: one per physical core).
    #[arg(long, value_name = "N")]
    pub threads: Option<usize>,
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
}

impl From<anyhow::Error> for Failure {
    fn from(e: anyhow::Error) -> Self {
        Failure::Run(e)
    }
}

impl ProbeArgs {
    fn io_path(&self) -> PathBuf {
        match &self.io {
            Some(Some(p)) => p.clone(),
            _ => std::env::temp_dir(),
        }
    }
}

/// The sections of this run: `--only`, plus `io` when `--io` was given.
pub(crate) fn sections_of(a: &ProbeArgs) -> Result<Vec<Section>, Failure> {
    let mut s = Section::parse_list(a.only.as_deref()).map_err(|e| Failure::Input(anyhow!(e)))?;
    if a.io.is_some() && !s.contains(&Section::Io) {
        s.push(Section::Io);
    }
    Ok(s)
}

pub(crate) fn progress_bar(show: bool) -> Bar {
    let bar = (show && std::io::stderr().is_terminal()).then(|| {
        let b = indicatif::ProgressBar::new(0);
        b.set_style(
            indicatif::ProgressStyle::with_template(
                "{elapsed_precise} [{bar:30}] {pos}/{len} {msg}",
            )
            .map(|s| s.progress_chars("=> "))
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    });
    Bar(bar)
}

/// `roofline probe`.
fn parse_isa(s: &str) -> Result<roofline_kernels::cpu::isa::Isa, String> {
    roofline_kernels::cpu::isa::Isa::parse(s).ok_or_else(|| {
        format!(
            "{s:?}: expected {}",
            roofline_kernels::cpu::isa::Isa::expected()
        )
    })
}

pub fn probe(a: ProbeArgs) -> Result<(), Failure> {
    if let Some(isa) = a.isa {
        // Read by the kernels wherever they choose their instruction set (this thread only
        // runs yet: nothing reads the environment concurrently).
        std::env::set_var(roofline_kernels::cpu::isa::ENV, isa.name());
    }
    roofline_kernels::cpu::isa::Isa::cap().map_err(|e| Failure::Input(anyhow!("{e}")))?;
    let sections = sections_of(&a)?;
    if let Some(n) = roofline_kernels::comm::launched_ranks() {
        #[cfg(feature = "mpi")]
        {
            let _ = n;
            return crate::probe_mpi::probe(&a, &sections);
        }
        #[cfg(not(feature = "mpi"))]
        return Err(Failure::Input(anyhow!(
            "started by an MPI launcher with {n} ranks, but this roofline was built without MPI: rebuild it with `cargo build --release --features mpi` (needs an MPI library and libclang: Debian's openmpi-bin libopenmpi-dev libclang-dev), or run it without mpirun"
        )));
    }
    if sections.iter().all(|s| *s == Section::Comm) {
        return Err(Failure::Input(anyhow!(
            "--only comm measures communication between MPI ranks, and this run is a world of one: start it as `mpirun -np N roofline probe --only comm` (a build with --features mpi)"
        )));
    }
    let gpu_count = node::gpu_status(a.device, &sections).map_err(failure)?;
    let (cores, machine_cores) = node::cores_for(a.threads).map_err(failure)?;
    crate::args::check_writable(&a.output, "-o").map_err(Failure::Input)?;
    crate::install_ctrlc()?;
    let start = Instant::now();
    let progress = progress_bar(true);
    let mut m = if sections.iter().any(|s| s.on_node()) {
        node_probe(
            &a,
            &sections,
            &gpu_count,
            (&cores, &machine_cores),
            &progress,
            start,
            true,
        )?
    } else {
        node::bare(provenance(
            node::cpu_here(machine_cores.len()),
            a.quick,
            start,
        ))
    };
    if sections.contains(&Section::Comm) {
        m.provenance.notes.push(
            "no communication measured: a world of one (run it under mpirun -np N, built with --features mpi)".into(),
        );
    }
    if sections.contains(&Section::Io) {
        io_probe(&a, &mut m, &progress)?;
    }
    if let Some(b) = &progress.0 {
        b.finish_and_clear();
    }
    m.provenance.duration_s = start.elapsed().as_secs_f64();
    finish(&a, &m)
}

/// The storage probe into `m`.
pub(crate) fn io_probe(
    a: &ProbeArgs,
    m: &mut Machine,
    progress: &dyn Progress,
) -> Result<(), Failure> {
    let path = a.io_path();
    let label = if a.io.as_ref().is_some_and(|p| p.is_some()) {
        roofline_kernels::io::label_for(&path)
    } else {
        "tmp".to_string()
    };
    let readers = roofline_kernels::affinity::allowed_cpus().len().clamp(2, 8);
    let cfg = roofline_kernels::io::IoConfig {
        path,
        readers,
        quick: a.quick,
    };
    match roofline_kernels::io::run(&cfg, &label, &CANCEL, progress) {
        Ok(r) => {
            m.ceilings.extend(r.ceilings);
            m.provenance.notes.extend(r.notes);
            Ok(())
        }
        Err(roofline_kernels::ProbeError::Interrupted) => Err(Failure::Interrupted),
        Err(
            e @ (roofline_kernels::ProbeError::Io { .. }
            | roofline_kernels::ProbeError::NotAFolder(_)),
        ) => Err(Failure::Input(anyhow!("--io: {e}"))),
        Err(e) => Err(Failure::Run(anyhow!("storage probe failed: {e}"))),
    }
}

/// Writes machine.json and prints the table (or the JSON).
pub(crate) fn finish(a: &ProbeArgs, m: &Machine) -> Result<(), Failure> {
    if CANCEL.load(Ordering::SeqCst) {
        return Err(Failure::Interrupted);
    }
    let text = m.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    if a.json {
        println!("{text}");
    } else {
        output::machine_table(m);
        println!(
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

pub(crate) fn provenance(cpu: roofline_model::CpuInfo, quick: bool, start: Instant) -> Provenance {
    Provenance {
        tool: format!("roofline {}", env!("CARGO_PKG_VERSION")),
        git_revision: option_env!("ROOFLINE_GIT_REVISION")
            .filter(|s| !s.is_empty())
            .map(String::from),
        command_line: std::env::args().collect(),
        compiler: env!("ROOFLINE_RUSTC_VERSION").to_string(),
        libraries: env!("ROOFLINE_LIBRARIES")
            .split(", ")
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        time_utc: roofline_collectors::now_utc(),
        host: roofline_collectors::hostname(),
        os: roofline_collectors::os_name(),
        kernel: roofline_collectors::kernel_release(),
        cpu,
        devices: Vec::new(),
        gpus: Vec::new(),
        notes: Vec::new(),
        cluster: None,
        quick,
        duration_s: start.elapsed().as_secs_f64(),
        load: None,
    }
}

/// A node probe's failure as the command line's.
pub(crate) fn failure(e: NodeError) -> Failure {
    match e {
        NodeError::Interrupted => Failure::Interrupted,
        e if e.is_input() => Failure::Input(anyhow!("{e}")),
        e => Failure::Run(anyhow!("{e}")),
    }
}

/// This node's own ceilings (its CPU on `cores`, its GPUs), the progress bar cleared however it
/// ends; `check_load`: whether the machine's quiet is checked (not where the job's own ranks
/// share the node).
pub(crate) fn node_probe(
    a: &ProbeArgs,
    sections: &[Section],
    gpus: &node::Gpus,
    (cores, machine_cores): (&[usize], &[usize]),
    progress: &Bar,
    start: Instant,
    check_load: bool,
) -> Result<Machine, Failure> {
    if let node::Gpus::Absent(why) = gpus {
        if a.device == Devices::Auto && !a.json {
            eprintln!("roofline: no GPU found, probing the CPU only ({why})");
        }
    }
    let cfg = NodeConfig {
        devices: a.device,
        sections: sections.to_vec(),
        cores: cores.to_vec(),
        machine_cores: machine_cores.to_vec(),
        quick: a.quick,
        check_load,
    };
    let r = node::probe(
        &cfg,
        gpus,
        &|cpu| provenance(cpu, a.quick, start),
        &CANCEL,
        progress,
    );
    if r.is_err() || matches!(gpus, node::Gpus::Found(_)) {
        if let Some(b) = &progress.0 {
            b.finish_and_clear();
        }
    }
    r.map_err(failure)
}

/// `roofline probe --check`: every GPU kernel once, against CPU references.
pub fn gpu_check(devices: Devices) -> Result<(), Failure> {
    crate::install_ctrlc()?;
    let r = node::gpu_check(devices, &CANCEL).map_err(failure)?;
    let failed = output::check_table(&r);
    if failed > 0 {
        return Err(Failure::Run(anyhow!("{failed} GPU kernel check(s) failed")));
    }
    Ok(())
}
