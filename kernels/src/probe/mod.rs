//! Probes: sweeps of kernels under the driver, turned into ceilings, curves and tables.

pub mod cpu;
pub mod cpu_mem;
pub mod gpu;
pub mod node;
pub mod run;
#[cfg(feature = "mpi")]
pub mod world;

use crate::driver::Measurement;
use roofline_model::{Ceiling, CeilingKind, PerIteration, Stats, TheoreticalPeak};

/// Receives progress: one `advance` per measurement.
pub trait Progress: Sync {
    /// The number of measurements planned.
    fn begin(&self, total: u64);
    /// One measurement is about to run.
    fn advance(&self, label: &str);
    /// A line for the person running the probe (a GPU not found, an error on another rank).
    fn note(&self, _line: &str) {}
    /// The measurements are over (or stopped): clear what was drawn.
    fn finish(&self) {}
}

/// A progress sink that says nothing.
pub struct Silent;

impl Progress for Silent {
    fn begin(&self, _: u64) {}
    fn advance(&self, _: &str) {}
}

/// What a probe section measures; `--only` takes these names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Section {
    Fma,
    Mem,
    Gemm,
    Conv,
    /// Host-device, device-device and peer copies (GPUs only).
    Copy,
    /// Collectives and point-to-point between MPI ranks (under mpirun only).
    Comm,
    /// The storage read ceiling (only when asked: it writes test files).
    Io,
}

impl Section {
    /// What a plain `roofline probe` measures (everything but `io`).
    pub const ALL: [Section; 6] = [
        Section::Fma,
        Section::Mem,
        Section::Gemm,
        Section::Conv,
        Section::Copy,
        Section::Comm,
    ];

    /// Every section `--only` accepts.
    pub const NAMES: [Section; 7] = [
        Section::Fma,
        Section::Mem,
        Section::Gemm,
        Section::Conv,
        Section::Copy,
        Section::Comm,
        Section::Io,
    ];

    /// Measured by each node on itself (CPU and GPUs), as opposed to between ranks or storage.
    pub fn on_node(self) -> bool {
        !matches!(self, Section::Comm | Section::Io)
    }

    pub fn name(self) -> &'static str {
        match self {
            Section::Fma => "fma",
            Section::Mem => "mem",
            Section::Gemm => "gemm",
            Section::Conv => "conv",
            Section::Copy => "copy",
            Section::Comm => "comm",
            Section::Io => "io",
        }
    }

    /// Parses `--only`'s comma-separated list (none: every section of a plain probe); an
    /// unknown or empty entry list says what is expected.
    pub fn parse_list(only: Option<&str>) -> Result<Vec<Section>, String> {
        let expected = "expected a comma-separated list of: fma, mem, gemm, conv, copy, comm, io";
        let Some(list) = only else {
            return Ok(Section::ALL.to_vec());
        };
        let mut v = Vec::new();
        for item in list.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            let s = Section::parse(item)
                .ok_or_else(|| format!("unknown --only entry `{item}`; {expected}"))?;
            if !v.contains(&s) {
                v.push(s);
            }
        }
        if v.is_empty() {
            return Err(format!("--only is empty; {expected}"));
        }
        Ok(v)
    }

    pub fn parse(s: &str) -> Option<Section> {
        Section::NAMES.into_iter().find(|x| x.name() == s)
    }
}

/// The rate samples of a measurement (ops/s for compute, B/s for memory) as statistics.
pub fn rate_stats(m: &Measurement, kind: CeilingKind) -> Option<Stats> {
    let rates = if kind == CeilingKind::Compute {
        m.op_rates()
    } else {
        m.byte_rates()
    };
    Stats::from_samples(&rates)
}

/// A ceiling from the statistics of its best configuration. Its value is the best sample (as
/// STREAM and likwid-bench report: clocks and neighbours only ever slow a kernel down); the
/// spread stays in `stats`.
#[allow(clippy::too_many_arguments)]
pub fn ceiling(
    id: impl Into<roofline_model::CeilingId>,
    kind: CeilingKind,
    unit: &str,
    threads: usize,
    stats: Stats,
    m: &Measurement,
    method: String,
    peak: Option<TheoreticalPeak>,
) -> Ceiling {
    let per_iteration = PerIteration {
        ops: m.ops_per_iter,
        bytes: m.bytes_per_iter,
    };
    Ceiling::measured(id, kind, unit, threads, stats, per_iteration, method).with_peak(peak)
}

/// A compute ceiling (flat roof): `roof` is its typed id, which says its precision.
#[allow(clippy::too_many_arguments)]
pub fn compute_ceiling(
    roof: roofline_model::RoofId,
    unit: &str,
    threads: usize,
    stats: Stats,
    m: &Measurement,
    method: String,
    peak: Option<TheoreticalPeak>,
) -> Ceiling {
    ceiling(
        roof,
        CeilingKind::Compute,
        unit,
        threads,
        stats,
        m,
        method,
        peak,
    )
    .as_roof(roof)
}
