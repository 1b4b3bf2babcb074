//! `machine.json` (schema `roofline/machine/v1`): what a machine can do.

use crate::stats::Stats;
use crate::ModelError;
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The schema tag every `machine.json` of this version carries.
pub const MACHINE_SCHEMA: &str = "roofline/machine/v1";

/// What a ceiling limits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CeilingKind {
    /// Operations per second (flat roof).
    Compute,
    /// Bytes per second to or from a memory level (slanted roof, OI = FLOPs / byte of memory).
    Memory,
    /// Bytes per second communicated (slanted roof, COI = FLOPs / byte communicated).
    Comm,
    /// Bytes per second read from storage.
    Io,
}

impl CeilingKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CeilingKind::Compute => "compute",
            CeilingKind::Memory => "memory",
            CeilingKind::Comm => "comm",
            CeilingKind::Io => "io",
        }
    }
}

/// A theoretical peak attached to a ceiling, with where it comes from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TheoreticalPeak {
    pub value: f64,
    pub unit: String,
    /// How it was obtained: a datasheet entry or the CPU rule with its factors written out.
    pub source: String,
    /// Relative uncertainty of the peak itself (for CPUs: the spread of the measured clock over
    /// the run). A ceiling is flagged when it exceeds the peak by more than this.
    #[serde(default)]
    pub uncertainty: f64,
}

/// Work done by one iteration of the kernel that measured a ceiling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PerIteration {
    /// Floating-point (or integer) operations per iteration, all threads together.
    pub ops: f64,
    /// Bytes counted per iteration, all threads together (see `method` for what is counted).
    pub bytes: f64,
}

/// One measured ceiling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ceiling {
    /// Stable identifier, e.g. `cpu/fma/f32/all`, `cpu/mem/L2/triad/t1`, `gpu0/mma/bf16`,
    /// `gpu0/mem/HBM/triad`, `gpu0-gpu1/p2p`.
    pub id: crate::CeilingId,
    pub kind: CeilingKind,
    /// The ceiling: the best sample of the best configuration (the spread is in `stats`).
    pub value: f64,
    /// SI, decimal: `FLOP/s`, `OP/s` (integer), `B/s`.
    pub unit: String,
    /// CPU threads that ran the kernel (one per core for `all`); 1 for a GPU ceiling (one
    /// device; its launch configuration is in `method`).
    pub threads: usize,
    /// Precision for compute ceilings (`f64`, `f32`, `tf32`, `f16`, `bf16`, `fp8`, `int8`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<crate::ids::Precision>,
    /// Memory level for memory ceilings (`L1`, `L2`, `L3`, `DRAM`; GPUs: `L2`, `HBM`; typed:
    /// [`Ceiling::memory_level`]); the scope (`intra`, `inter`, `world`) for communication
    /// ceilings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<crate::ceiling_id::Tier>,
    /// The CPU instruction set the kernel ran with (`avx512`, `avx2`, `scalar`: the portable
    /// code of the baseline target), for CPU compute and memory ceilings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isa: Option<String>,
    /// The statistics of the samples behind `value`, in `unit`.
    pub stats: Stats,
    /// The theoretical peak when one is known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub theoretical_peak: Option<TheoreticalPeak>,
    /// True when `value` is above `theoretical_peak`: the measurement or the peak is wrong.
    #[serde(default)]
    pub above_peak: bool,
    /// How it was measured: the kernel, what is counted, the configuration that gave the best.
    pub method: String,
    pub per_iteration: PerIteration,
    /// For a ceiling read off a plateau of a sweep (the memory levels): how flat the window
    /// was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plateau: Option<Plateau>,
    /// What each sample was taken under (clock; GPU: SM clock, power, throttle reasons), the
    /// samples left out of `value` and why ([`crate::conditions`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<crate::conditions::SampleConditions>,
    /// GPU, where samples ran under the power cap (a sustained GEMM on a 700 W part does, by
    /// design): `value` is the sustained figure, this is its best sample before the cap.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub burst: Option<f64>,
    /// The power-capped steady state behind `value`: its samples, power and SM clock.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sustained: Option<crate::conditions::Sustained>,
}

impl Ceiling {
    /// The figure a roofline draws: the sustained (power-capped) `value`, or with `burst` the
    /// figure before the cap where there is one.
    pub fn drawn(&self, burst: bool) -> f64 {
        match (burst, self.burst) {
            (true, Some(b)) => b,
            _ => self.value,
        }
    }
}

pub use crate::plateau::Plateau;

impl Ceiling {
    /// The one way a probe makes a ceiling: from the statistics of its best configuration's
    /// samples, its value the best sample (the highest rate, as STREAM and likwid-bench report:
    /// clocks and neighbours only ever slow a kernel down; the least time for a time in `s`),
    /// the spread kept in `stats`. Add the precision, level and theoretical peak with the
    /// `with_` methods (the peak flags a value above it).
    pub fn measured(
        id: impl Into<crate::CeilingId>,
        kind: CeilingKind,
        unit: &str,
        threads: usize,
        stats: Stats,
        per_iteration: PerIteration,
        method: String,
    ) -> Ceiling {
        Ceiling {
            id: id.into(),
            kind,
            value: if unit == "s" { stats.min } else { stats.max },
            unit: unit.to_string(),
            threads,
            precision: None,
            level: None,
            isa: None,
            stats,
            theoretical_peak: None,
            above_peak: false,
            method,
            per_iteration,
            plateau: None,
            conditions: None,
            burst: None,
            sustained: None,
        }
    }

    /// The conditions of this ceiling's samples: its value becomes the best of the clean ones
    /// (a sample left out stays in `stats`), and the flag against the peak is set again. A
    /// plateau ceiling (a sweep's median point) keeps its value; conditions that do not
    /// describe its samples are not attached.
    pub fn with_conditions(mut self, c: Option<crate::conditions::SampleConditions>) -> Ceiling {
        let Some(c) = c else { return self };
        if c.inconsistency(self.stats.samples).is_some() {
            return self;
        }
        if self.plateau.is_none() {
            if let Some(best) = c.best(&self.stats.values, self.unit == "s") {
                self.value = best;
            }
            if self.unit != "s" {
                self.burst = c.burst(&self.stats.values);
                self.sustained = c.sustained(&self.stats.values);
            }
        }
        self.conditions = Some(c);
        self.flag_against_peak();
        self
    }

    pub fn with_precision(mut self, precision: Option<crate::ids::Precision>) -> Ceiling {
        self.precision = precision;
        self
    }

    /// This ceiling as the roof `roof`: its id, and the precision (a compute roof) or the memory
    /// level (a memory roof) the id names.
    pub fn as_roof(mut self, roof: crate::ids::RoofId) -> Ceiling {
        self.id = roof.into();
        match roof {
            crate::ids::RoofId::Compute { precision, .. } => self.precision = Some(precision),
            crate::ids::RoofId::Memory { level, .. } => {
                self.level = Some(crate::ceiling_id::Tier::Memory(level))
            }
        }
        self
    }

    /// The CPU instruction set the kernel ran with.
    pub fn with_isa(mut self, isa: &str) -> Ceiling {
        self.isa = Some(isa.to_string());
        self
    }

    pub fn with_level(mut self, level: Option<crate::ceiling_id::Tier>) -> Ceiling {
        self.level = level;
        self
    }

    /// The theoretical peak, and the flag when the value is above it.
    pub fn with_peak(mut self, peak: Option<TheoreticalPeak>) -> Ceiling {
        self.theoretical_peak = peak;
        self.flag_against_peak();
        self
    }

    /// The memory level of a memory ceiling, typed.
    pub fn memory_level(&self) -> Option<crate::ids::Level> {
        match self.level? {
            crate::ceiling_id::Tier::Memory(l) => Some(l),
            crate::ceiling_id::Tier::Comm(_) => None,
        }
    }

    /// Sets `above_peak` from `value` and `theoretical_peak`: above the peak by more than the
    /// peak's own uncertainty.
    pub fn flag_against_peak(&mut self) {
        self.above_peak = match &self.theoretical_peak {
            Some(p) => p.unit == self.unit && self.value > p.value * (1.0 + p.uncertainty.max(0.0)),
            None => false,
        };
    }

    /// Fraction of the theoretical peak reached, when a peak is known.
    pub fn fraction_of_peak(&self) -> Option<f64> {
        self.theoretical_peak
            .as_ref()
            .filter(|p| p.unit == self.unit && p.value > 0.0)
            .map(|p| self.value / p.value)
    }
}

/// One point of a measured curve (e.g. bandwidth against working-set size).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CurvePoint {
    /// The x value, in the curve's `x_unit`.
    pub x: f64,
    /// The best sample, in the curve's `unit`.
    pub value: f64,
    pub stats: Stats,
    /// The memory level this point was attributed to, if any (the plateau it belongs to).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub level: Option<crate::ids::Level>,
}

/// A whole measured curve, kept for plotting (e.g. `cpu/mem/sweep/triad/t1`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Curve {
    pub id: String,
    pub x_label: String,
    pub x_unit: String,
    pub unit: String,
    pub threads: usize,
    pub points: Vec<CurvePoint>,
}

/// One row of a kept table (e.g. every GEMM shape measured).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct TableRow {
    /// What was measured, e.g. `square 1024` or `resnet50 layer3 conv2`.
    pub name: String,
    /// The shape, e.g. `m=1024 n=1024 k=1024` or `n=8 c=64 h=56 w=56 k=64 r=3 s=3 stride=1 pad=1`.
    pub shape: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<String>,
    pub threads: usize,
    pub value: f64,
    pub stats: Stats,
    /// Largest relative error of the checked entries against the reference.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rel_error: Option<f64>,
    /// What ran, when the library chose it (e.g. the cuDNN algorithm, the cuBLAS library).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
    /// A library's own first choice for the shape (cuDNN's heuristic) and its rate, where the
    /// row's `detail` is the fastest measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heuristic: Option<Choice>,
    /// The shape's own roof: min(the precision's datasheet peak, its operational intensity ×
    /// the datasheet memory bandwidth), and `value` over it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roof: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub efficiency: Option<f64>,
}

/// What a library chose, and the rate it gave.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Choice {
    pub detail: String,
    pub value: f64,
}

/// A kept table of measurements (e.g. `cpu/gemm/f32/table`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Table {
    pub id: crate::ceiling_id::TableId,
    pub unit: String,
    pub rows: Vec<TableRow>,
}

/// A cache level as the OS reports it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CacheInfo {
    /// 1, 2, 3, ...
    pub level: u32,
    /// `Data`, `Instruction` or `Unified`.
    #[serde(rename = "type")]
    pub cache_type: String,
    pub size_bytes: u64,
    /// How many logical CPUs share one instance.
    pub shared_by_cpus: usize,
    /// How many physical cores share one instance (SMT siblings counted once); 0 when not
    /// known (files written before it was recorded): then `shared_by_cpus`.
    #[serde(default)]
    pub shared_by_cores: usize,
    /// How many instances the machine has.
    pub instances: usize,
}

impl CacheInfo {
    /// Physical cores sharing one instance: a probe runs one thread per core, so this (not the
    /// logical CPUs, which count SMT siblings) is how many of its threads share the cache.
    pub fn cores_sharing(&self) -> usize {
        if self.shared_by_cores > 0 {
            self.shared_by_cores
        } else {
            self.shared_by_cpus.max(1)
        }
    }
}

/// The CPU as the OS and our own measurement see it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuInfo {
    pub vendor: String,
    pub model_name: String,
    pub family: u32,
    pub model: u32,
    pub stepping: u32,
    pub sockets: usize,
    pub cores: usize,
    pub logical_cpus: usize,
    /// The CPU features roofline uses, as detected at run time.
    pub features: Vec<String>,
    /// The widest SIMD instruction set the probes used (`avx512`, `avx2`, `scalar`).
    pub simd: String,
    pub caches: Vec<CacheInfo>,
    /// The clock /proc/cpuinfo states (often wrong on virtual machines), MHz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpuinfo_mhz: Option<f64>,
    /// Core clock measured with a chain of dependent adds, one thread, Hz (every clock
    /// measurement of the run: the probe measures it again around every peak measurement).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_clock_hz_t1: Option<Stats>,
    /// Core clock measured with every core running the chain at once (slowest core), Hz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured_clock_hz_all: Option<Stats>,
    /// Set when the all-core clock was far below the one-core clock: the cores were shared
    /// (two vCPUs on one physical core, or another load) while the `all` ceilings ran.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_cores: Option<SharedCores>,
}

/// The all-core clock far below the one-core clock, and the ceilings measured in that state.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SharedCores {
    /// Median all-core clock / median one-core clock.
    pub ratio: f64,
    /// The `all` ceilings measured while the cores were shared: they understate the machine.
    pub ceilings: Vec<String>,
}

impl SharedCores {
    /// Below this all-core / one-core clock ratio the cores count as shared (turbo alone
    /// lowers the all-core clock by 10-25% on servers; two threads on one core halve it).
    pub const RATIO: f64 = 0.7;

    /// The state of `cpu`'s clocks (None: not shared, or not measured), marking every
    /// multi-thread `all` ceiling of `ceilings`.
    pub fn detect(cpu: &CpuInfo, ceilings: &[Ceiling]) -> Option<SharedCores> {
        let (t1, all) = (
            cpu.measured_clock_hz_t1.as_ref()?,
            cpu.measured_clock_hz_all.as_ref()?,
        );
        let ratio = all.median / t1.median;
        (ratio.is_finite() && ratio < Self::RATIO).then(|| SharedCores {
            ratio,
            ceilings: ceilings
                .iter()
                .filter(|c| {
                    matches!(
                        c.id.roof(),
                        Some(r) if r.on() == crate::On::Cpu(crate::Threads::All)
                    ) && c.threads > 1
                })
                .map(|c| c.id.to_string())
                .collect(),
        })
    }
}

/// Where, when, how and with what a result was measured.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Provenance {
    /// `roofline <version>`.
    pub tool: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub git_revision: Option<String>,
    pub command_line: Vec<String>,
    /// The compiler that built the tool (`rustc --version`).
    #[serde(default)]
    pub compiler: String,
    /// Libraries that do measured work, with their versions (e.g. `gemm 0.19.0`).
    #[serde(default)]
    pub libraries: Vec<String>,
    /// UTC, RFC 3339.
    pub time_utc: String,
    pub host: String,
    pub os: String,
    pub kernel: String,
    pub cpu: CpuInfo,
    /// Accelerators found (empty on a CPU-only machine), one line each.
    #[serde(default)]
    pub devices: Vec<String>,
    /// The GPUs in detail: inventory from NVML and the driver, and what NVML saw while the
    /// probe ran (clocks, power, temperature, throttle reasons).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<GpuInfo>,
    /// Notes on what was and was not measured (e.g. "no GPU found").
    #[serde(default)]
    pub notes: Vec<String>,
    /// The MPI world, when the probe ran under mpirun/srun with more than one rank.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<ClusterInfo>,
    /// True for `--quick` runs (fewer repeats, coarser sweeps).
    pub quick: bool,
    /// Wall time of the whole probe, seconds.
    pub duration_s: f64,
    /// Whether the machine was quiet while it was measured (absent: not checked, as in
    /// files written before the check, or under MPI where the job's own ranks share a node).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load: Option<crate::LoadCheck>,
}

/// One NVLink link of a GPU.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NvLink {
    pub link: u32,
    pub version: u32,
    /// PCI bus id of the device at the other end.
    pub remote_pci_bus_id: String,
}

/// What NVML sampled on one GPU while the probe ran.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuTelemetry {
    pub samples: usize,
    pub interval_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_clock_mhz: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<Stats>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_c: Option<Stats>,
    /// Every throttle (clock event) reason seen in any sample, e.g. `SW_POWER_CAP`.
    #[serde(default)]
    pub throttle_reasons: Vec<String>,
    /// Energy used over the run from the GPU's energy counter, joules.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub energy_j: Option<f64>,
}

/// One GPU: what the driver API and NVML report. Fields NVML could not give are absent.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// CUDA device ordinal (`gpu<index>` in ceiling ids).
    pub index: usize,
    pub name: String,
    pub uuid: String,
    /// e.g. `9.0`.
    pub compute_capability: String,
    pub sm_count: u32,
    pub memory_bytes: u64,
    pub l2_bytes: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pci_bus_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_max_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_clock_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_clock_max_mhz: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_limit_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_generation: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_generation_max: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcie_width_max: Option<u32>,
    #[serde(default)]
    pub nvlinks: Vec<NvLink>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_version: Option<String>,
    /// The CUDA version the driver supports, e.g. `12.4`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cuda_driver_version: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistence_mode: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ecc_enabled: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub telemetry: Option<GpuTelemetry>,
}

/// The MPI world a distributed probe ran in.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterInfo {
    pub ranks: usize,
    pub nodes: usize,
    /// Ranks on each node, in node order (node 0 holds world rank 0).
    pub ranks_per_node: Vec<usize>,
    /// Each node's host name, in node order.
    pub hosts: Vec<String>,
    /// `MPI_Get_library_version`, first line.
    pub mpi_library: String,
    /// True when the node identity came from `ROOFLINE_FAKE_NODES` (one host pretending to be
    /// several nodes, for tests), not from shared memory.
    #[serde(default)]
    pub fake_nodes: bool,
    /// What started the ranks, and the Slurm job they ran in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub launcher: Option<crate::launcher::Launch>,
}

/// One node's own ceilings in a distributed probe (each node probes itself, concurrently).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct NodeCeilings {
    pub node: usize,
    pub host: String,
    pub ceilings: Vec<Ceiling>,
}

/// The whole `machine.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Machine {
    pub schema: String,
    pub provenance: Provenance,
    /// Node 0's ceilings, the communication (`net/…`) and storage (`io/…`) ceilings, and in a
    /// distributed run the aggregate compute ceilings (`agg/…`: sums over the nodes).
    pub ceilings: Vec<Ceiling>,
    #[serde(default)]
    pub curves: Vec<Curve>,
    #[serde(default)]
    pub tables: Vec<Table>,
    /// Every node's own ceilings (distributed runs only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nodes: Vec<NodeCeilings>,
    /// Result checks that failed: each costs its own precision or section (no ceiling is
    /// written from a wrong result), the rest is kept, and the probe exits 1.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failures: Vec<CheckFailure>,
    /// A distributed probe's screening of its nodes and links (`crate::fleet`): the fleet's
    /// median of every ceiling, the nodes short of it, the link matrix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fleet: Option<crate::fleet::Fleet>,
    /// A baseline merged from several runs (`probe --runs N`): every run's ceilings and clock
    /// ([`crate::calibration`]), for `gate` to learn this runner's noise from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub calibration: Option<crate::calibration::Calibration>,
}

/// One failed result check of a probe: what ran where, and what it got wrong.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CheckFailure {
    /// The device (`gpu0`, `cpu`).
    pub on: String,
    /// The kernel, precision or section that failed (`mma_fp8`, `gemm_f16`, `mem`).
    pub kernel: String,
    /// The check's own words: what was expected and what came back.
    pub error: String,
}

impl Machine {
    /// The ceiling with this id.
    pub fn ceiling(&self, id: &str) -> Option<&Ceiling> {
        self.ceiling_of(&crate::CeilingId::parse(id)?)
    }

    /// The ceiling of a typed id.
    pub fn ceiling_of(&self, id: &crate::CeilingId) -> Option<&Ceiling> {
        self.ceilings.iter().find(|c| c.id == *id)
    }

    /// Parses a `machine.json` text, rejecting any other schema with a clear error.
    pub fn from_json(text: &str) -> Result<Machine, ModelError> {
        crate::from_json_with_schema(text, MACHINE_SCHEMA)
    }

    /// Reads and parses a `machine.json` file.
    pub fn read(path: &Path) -> Result<Machine, ModelError> {
        crate::read_with_schema(path, MACHINE_SCHEMA)
    }

    /// Pretty JSON text.
    pub fn to_json(&self) -> Result<String, ModelError> {
        serde_json::to_string_pretty(self).map_err(ModelError::Json)
    }
}

/// The aggregate compute ceilings of a distributed run: every compute ceiling that every node
/// has, summed (`agg/<id>`); its statistics are those of the per-node values.
pub fn aggregate(nodes: &[Machine]) -> Vec<crate::Ceiling> {
    let Some(first) = nodes.first() else {
        return Vec::new();
    };
    first
        .ceilings
        .iter()
        .filter(|c| c.kind == crate::CeilingKind::Compute)
        .filter_map(|c| {
            let all: Vec<&crate::Ceiling> =
                nodes.iter().filter_map(|m| m.ceiling_of(&c.id)).collect();
            if all.len() != nodes.len() {
                return None;
            }
            let values: Vec<f64> = all.iter().map(|x| x.value).collect();
            let mut agg = c.clone();
            agg.id = crate::CeilingId::Aggregate(Box::new(c.id.clone()));
            agg.value = values.iter().sum();
            agg.stats = crate::Stats::from_samples(&values)?;
            // Its samples are the nodes' values, not timed samples: each node's ceiling keeps
            // its own samples' conditions.
            agg.conditions = None;
            agg.threads = all.iter().map(|x| x.threads).sum();
            agg.theoretical_peak = all
                .iter()
                .map(|x| x.theoretical_peak.clone())
                .collect::<Option<Vec<_>>>()
                .map(|peaks| {
                    let mut p = peaks[0].clone();
                    p.value = peaks.iter().map(|q| q.value).sum();
                    p.source = format!("sum over {} nodes of: {}", nodes.len(), p.source);
                    p
                });
            agg.method = format!(
                "sum over the {} nodes of {} (each node probed itself, concurrently); stats are the per-node values",
                nodes.len(),
                c.id
            );
            agg.flag_against_peak();
            Some(agg)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn minimal() -> serde_json::Value {
        serde_json::json!({
            "schema": MACHINE_SCHEMA,
            "provenance": {
                "tool": "roofline 0", "command_line": [], "time_utc": "t", "host": "h", "os": "o",
                "kernel": "k", "quick": true, "duration_s": 1.0,
                "cpu": { "vendor": "v", "model_name": "m", "family": 1, "model": 2, "stepping": 3,
                         "sockets": 1, "cores": 2, "logical_cpus": 2, "features": [], "simd": "avx512",
                         "caches": [] }
            },
            "ceilings": [{
                "id": "cpu/fma/f32/t1", "kind": "compute", "value": 2.0, "unit": "FLOP/s", "threads": 1,
                "stats": { "samples": 1, "min": 2.0, "median": 2.0, "max": 2.0, "mean": 2.0, "cv": 0.0, "values": [2.0] },
                "theoretical_peak": { "value": 1.0, "unit": "FLOP/s", "source": "s" },
                "method": "m", "per_iteration": { "ops": 1.0, "bytes": 0.0 }
            }]
        })
    }

    /// A failed result check is kept in the file and read back; a file without any (every
    /// earlier one) reads as none, and none is written.
    #[test]
    fn failed_checks_are_kept_in_the_file() {
        let m = Machine::from_json(&minimal().to_string()).unwrap();
        assert!(m.failures.is_empty());
        assert!(!m.to_json().unwrap().contains("failures"));
        let mut v = minimal();
        v["failures"] = serde_json::json!([
            { "on": "gpu0", "kernel": "mma_bf16", "error": "result check failed: lane 3: GPU 1, expected 2" }
        ]);
        let m = Machine::from_json(&v.to_string()).unwrap();
        assert_eq!(
            m.failures,
            vec![CheckFailure {
                on: "gpu0".into(),
                kernel: "mma_bf16".into(),
                error: "result check failed: lane 3: GPU 1, expected 2".into(),
            }]
        );
        let again = Machine::from_json(&m.to_json().unwrap()).unwrap();
        assert_eq!(again.failures, m.failures);
    }

    /// Two vCPUs on one core halve the all-core clock: the `all` ceilings of more than one
    /// thread are marked; a 10% turbo drop is not sharing.
    #[test]
    fn shared_cores_are_detected_from_the_clocks() {
        let mut m = Machine::from_json(&minimal().to_string()).unwrap();
        let mut all = m.ceilings[0].clone();
        all.id = "cpu/fma/f32/all".parse().unwrap();
        all.threads = 2;
        m.ceilings.push(all);
        let cpu = &mut m.provenance.cpu;
        assert!(
            SharedCores::detect(cpu, &m.ceilings).is_none(),
            "no clocks measured"
        );
        cpu.measured_clock_hz_t1 = Stats::from_samples(&[3.0e9]);
        cpu.measured_clock_hz_all = Stats::from_samples(&[1.55e9]);
        let s = SharedCores::detect(cpu, &m.ceilings).unwrap();
        assert!((s.ratio - 1.55 / 3.0).abs() < 1e-12);
        assert_eq!(s.ceilings, vec!["cpu/fma/f32/all".to_string()]);
        cpu.measured_clock_hz_all = Stats::from_samples(&[2.7e9]);
        assert!(SharedCores::detect(cpu, &m.ceilings).is_none());
    }

    #[test]
    fn round_trips_and_flags_above_peak() {
        let m = Machine::from_json(&minimal().to_string()).unwrap();
        let mut c = m.ceiling("cpu/fma/f32/t1").unwrap().clone();
        assert!(!c.above_peak, "as read");
        c.flag_against_peak();
        assert!(c.above_peak);
        // Within the peak's uncertainty (2.0 against 1.0 ± 150%): not flagged.
        c.theoretical_peak.as_mut().unwrap().uncertainty = 1.5;
        c.flag_against_peak();
        assert!(!c.above_peak);
        assert_eq!(c.fraction_of_peak(), Some(2.0));
        let again = Machine::from_json(&m.to_json().unwrap()).unwrap();
        assert_eq!(again, m);
    }

    #[test]
    fn rejects_other_schemas_and_malformed_text() {
        let mut v = minimal();
        v["schema"] = "roofline/machine/v2".into();
        let e = Machine::from_json(&v.to_string()).unwrap_err();
        assert!(
            e.to_string()
                .contains("unknown schema \"roofline/machine/v2\""),
            "{e}"
        );
        v.as_object_mut().unwrap().remove("schema");
        assert!(matches!(
            Machine::from_json(&v.to_string()),
            Err(ModelError::Schema { .. })
        ));
        assert!(matches!(Machine::from_json("{"), Err(ModelError::Json(_))));
        let e = Machine::read(Path::new("/nonexistent/machine.json")).unwrap_err();
        assert!(e
            .to_string()
            .starts_with("cannot read /nonexistent/machine.json"));
    }
}
