//! `placement.json` (schema `roofline/placement/v1`): where a workload sits on a machine's
//! rooflines, what bounds it, and what to do about it (HPC AI500 V2.0 sections 6 and 7.5).
//!
//! A point is (intensity, achieved FLOP/s). Its roofs are the machine's flat compute ceilings of
//! the workload's precision, the slanted memory ceiling of the level its footprint lives in
//! (OI = FLOPs per byte of memory traffic) and, for data-parallel runs, the slanted
//! communication ceilings (COI = FLOPs per byte communicated). The attainable bound is the
//! lowest roof at the point's intensities; the binding ceiling is that roof, and its kind is
//! the bound.

use crate::ids::{ConvDir, Family, Level, MemOp, On, Precision, RoofId, Threads};
use crate::machine::{Ceiling, CeilingKind, Machine, Provenance};
use crate::stats::Stats;
use crate::ModelError;
use serde::{Deserialize, Serialize};
use std::path::Path;

mod advice;
mod assemble;

pub use advice::advise;
pub use assemble::{assemble, measured_conv_roof, LayerConv, LayerTime, Measured, PlaceError};

/// The schema tag every `placement.json` of this version carries.
pub const PLACEMENT_SCHEMA: &str = "roofline/placement/v1";

/// The whole `placement.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub schema: String,
    pub provenance: Provenance,
    /// The `machine.json` the workload was placed against.
    pub machine: MachineRef,
    pub workload: WorkloadInfo,
    /// The workload as a whole.
    pub point: Point,
    /// Its top layers by time, each placed on its own (training workloads).
    #[serde(default)]
    pub layers: Vec<Point>,
    /// Seconds per step, split by what the step was doing.
    pub time: TimeBreakdown,
    pub energy: Energy,
    pub advice: Vec<Advice>,
}

/// Which `machine.json` a placement used.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MachineRef {
    pub path: String,
    pub host: String,
    pub cpu: String,
    /// When the machine was probed (UTC, RFC 3339).
    pub probed_utc: String,
}

impl MachineRef {
    pub fn of(m: &Machine, path: &Path) -> MachineRef {
        MachineRef {
            path: path.display().to_string(),
            host: m.provenance.host.clone(),
            cpu: m.provenance.cpu.model_name.clone(),
            probed_utc: m.provenance.time_utc.clone(),
        }
    }
}

/// What ran.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WorkloadInfo {
    /// As given: `resnet50`, `gemm:4096x4096x4096:f32`, `conv:…`, `stream:1073741824`.
    pub name: String,
    /// `training`, `gemm`, `conv`, `stream`.
    pub kind: String,
    pub description: String,
    pub precision: String,
    /// `cpu` or `gpuN`.
    pub device: String,
    pub threads: usize,
    pub ranks: usize,
    pub nodes: usize,
    /// Steps run before the measured ones (not counted).
    pub warm_steps: usize,
    pub measured_steps: usize,
    /// Training workloads: the model's parameters and the global batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<usize>,
}

/// FLOPs per byte of memory traffic.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Intensity {
    /// From the analytic minimum of bytes each operation must move (every input, weight and
    /// output once): an upper bound of the true OI.
    pub analytic_min_bytes: f64,
    pub analytic: f64,
    /// From measured memory traffic (hardware counters) when they were readable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub measured: Option<f64>,
    /// Why there is no measured value, or where it came from.
    pub measured_note: String,
}

/// FLOPs per byte communicated (HPC AI500's COI), per step and rank, in *bus bytes*: the
/// gradient payload a rank puts into its allreduce × the allreduce's bus factor 2(n−1)/n over
/// its n ranks. That is the traffic each link carries, in the units of the roofs it is held
/// against: `net/allreduce/*` are bus bandwidths (busbw = algbw × 2(n−1)/n, nccl-tests'
/// convention), and time = payload / algbw = bus bytes / busbw. (FLOPs over the payload against
/// busbw would put the roof 2(n−1)/n too high: beyond 2 ranks a communication-bound run would
/// read as compute-bound.)
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Coi {
    /// Bus bytes of each rank inside its node and between nodes per step.
    pub intra_node_bytes: f64,
    pub inter_node_bytes: f64,
    /// The payload each rank put into its allreduces per step (0 in files before it was kept).
    #[serde(default)]
    pub payload_bytes: f64,
    /// Bus bytes per payload byte, 2(n−1)/n (1 in files before it was kept: two ranks).
    #[serde(default = "one")]
    pub bus_factor: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intra_node: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inter_node: Option<f64>,
}

fn one() -> f64 {
    1.0
}

impl Coi {
    /// The COI of a data-parallel step of `flops` FLOPs on each of `ranks` ranks over `nodes`
    /// nodes that puts `payload` bytes into an allreduce per step: between nodes when there are
    /// several, else inside the node. None for one rank, or nothing communicated.
    pub fn allreduce(flops: f64, payload: f64, ranks: usize, nodes: usize) -> Option<Coi> {
        if ranks < 2 || payload <= 0.0 {
            return None;
        }
        let factor = crate::ceiling_id::Collective::AllReduce.bus_factor(ranks);
        let bus = payload * factor;
        let (intra, inter) = if nodes > 1 { (0.0, bus) } else { (bus, 0.0) };
        Some(Coi {
            intra_node_bytes: intra,
            inter_node_bytes: inter,
            payload_bytes: payload,
            bus_factor: factor,
            intra_node: (intra > 0.0).then(|| flops / intra),
            inter_node: (inter > 0.0).then(|| flops / inter),
        })
    }
}

/// What bounds a point.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BoundKind {
    Compute,
    Memory,
    Communication,
}

impl BoundKind {
    pub fn as_str(self) -> &'static str {
        match self {
            BoundKind::Compute => "compute-bound",
            BoundKind::Memory => "memory-bound",
            BoundKind::Communication => "communication-bound",
        }
    }
}

/// One roof considered for a point, and what it allows there.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RoofAt {
    /// The ceiling's id in `machine.json`.
    pub ceiling: String,
    pub kind: BoundKind,
    /// The ceiling's own value, in `unit`.
    pub value: f64,
    /// `value`'s unit: FLOP/s for a compute roof, B/s for a memory or communication one.
    #[serde(default)]
    pub unit: String,
    /// FLOP/s it allows at the point's intensity.
    pub allows: f64,
}

/// The binding ceiling and the attainable bound.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Bound {
    pub kind: BoundKind,
    /// The binding ceiling's id.
    pub ceiling: String,
    /// FLOP/s the roofline allows at this point (the lowest roof).
    pub attainable: f64,
    /// attainable / achieved (1: on the roof).
    pub headroom: f64,
    /// Every roof considered.
    pub roofs: Vec<RoofAt>,
}

/// A point on the rooflines.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Point {
    pub label: String,
    /// FLOPs of one step (all ranks' work counts once per rank: this rank's share).
    pub flops_per_step: f64,
    pub seconds_per_step: Stats,
    /// FLOP/s of the best step (`achieved.max`); the samples are in `achieved`.
    pub achieved_flops: f64,
    pub achieved: Stats,
    /// Bytes the data of one step occupies (it decides which memory level feeds it).
    pub footprint_bytes: f64,
    pub oi: Intensity,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coi: Option<Coi>,
    /// A layer's share of the step's time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub share_of_step: Option<f64>,
    pub bound: Bound,
    /// How the point computed its FLOPs where they are not the operations that ran: a layer
    /// computed by a fast algorithm (Winograd's) counts the direct convolution's FLOPs, so its
    /// rate may pass the roofs of the operations it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// Seconds per step.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct TimeBreakdown {
    pub total_s: f64,
    pub compute_s: f64,
    /// Communication the computation did not hide.
    pub communication_s: f64,
    /// Waiting for data (loading, decoding, host-to-device copies).
    pub data_s: f64,
    /// The rest: neither computing, communicating nor waiting for data.
    pub idle_s: f64,
}

/// Energy, where a counter exists. Nothing is estimated: without a source every per-watt figure
/// is absent and `note` says why.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Energy {
    pub measured: bool,
    /// Where the joules came from (`NVML total energy, gpu0`, `powercap intel-rapl:0 (package)`).
    #[serde(default)]
    pub sources: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub joules_per_step: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub average_watts: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub flops_per_watt: Option<f64>,
    pub note: String,
}

/// One piece of advice.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Advice {
    /// `communication`, `compute`, `memory`, `data`, `idle`, `measurement`.
    pub topic: String,
    pub text: String,
}

/// The roofs a point of `precision` on `threads` CPU threads is held against, from `m`:
/// the flat compute ceilings of that precision among `families` (`gemm`, `conv`, `fma`: a
/// GEMM is held against the GEMM and FMA roofs, a convolution or a network also against the
/// convolution roof; the FMA roof not where a GEMM beat it, on AMX), the memory
/// ceiling (triad) of the level a `footprint` of bytes lives in, and, when the point
/// communicates, the allreduce ceilings inside and between nodes.
pub fn cpu_roofs(
    m: &Machine,
    precision: Precision,
    families: &[Family],
    threads: usize,
    footprint: f64,
    coi: Option<&Coi>,
) -> Vec<(RoofAt, Axis)> {
    let on = On::Cpu(if threads <= 1 {
        Threads::T1
    } else {
        Threads::All
    });
    let mut out = Vec::new();
    for &family in families {
        let id = RoofId::Compute {
            on,
            family,
            precision,
            direction: None,
        };
        if let Some(c) = m.ceiling(&id.to_string()) {
            out.push((
                roof(&c.id.to_string(), BoundKind::Compute, c.value),
                Axis::Flat,
            ));
        }
    }
    // A GEMM measured above the FMA roof of its precision ran on a unit that roof does not
    // count (AMX tiles beside vdpbf16ps): the FMA roof would bind the point below what the
    // machine showed it can do, so it goes.
    let gemm = out
        .iter()
        .filter(|(r, _)| r.ceiling.contains("/gemm/"))
        .map(|(r, _)| r.value)
        .fold(0.0, f64::max);
    out.retain(|(r, _)| !(r.ceiling.contains("/fma/") && r.value < gemm));
    let level = memory_level(m, footprint, threads);
    if let Some(c) = memory_roof(m, on, level) {
        out.push((
            roof(&c.id.to_string(), BoundKind::Memory, c.value),
            Axis::Oi,
        ));
    }
    out.extend(comm_roofs(m, coi));
    out
}

/// The memory ceiling of `level` on `on`: triad's, else copy's, else read's.
fn memory_roof(m: &Machine, on: On, level: Level) -> Option<&Ceiling> {
    [MemOp::Triad, MemOp::Copy, MemOp::Read]
        .into_iter()
        .find_map(|op| m.ceiling(&RoofId::Memory { on, level, op }.to_string()))
}

/// The roofs of GPU `gpu` (a device of the machine.json) for a point of `precision`: the flat
/// compute ceilings of that precision among `families` (`gemm`, `conv` (its forward
/// direction), and `fma` for f32 and f64 only: a 16-bit or tf32 network runs on the tensor
/// cores, whose work the CUDA cores' FMA roof would wrongly bind); the memory ceiling of L2
/// when the `footprint` fits in the GPU's L2, else of HBM; and the allreduce ceilings as on the
/// CPU.
pub fn gpu_roofs(
    m: &Machine,
    gpu: usize,
    precision: Precision,
    families: &[Family],
    footprint: f64,
    coi: Option<&Coi>,
) -> Vec<(RoofAt, Axis)> {
    let mut out = Vec::new();
    let on = On::Gpu(gpu);
    let cuda_cores = matches!(precision, Precision::F32 | Precision::F64);
    for &family in families {
        if family == Family::Fma && !cuda_cores {
            continue;
        }
        let id = RoofId::Compute {
            on,
            family,
            precision,
            direction: (family == Family::Conv).then_some(ConvDir::Fwd),
        };
        if let Some(c) = m.ceiling(&id.to_string()) {
            out.push((
                roof(&c.id.to_string(), BoundKind::Compute, c.value),
                Axis::Flat,
            ));
        }
    }
    let l2 = m
        .provenance
        .gpus
        .iter()
        .find(|g| g.index == gpu)
        .map_or(0.0, |g| g.l2_bytes as f64);
    let level = if footprint <= l2 {
        Level::L2
    } else {
        Level::Hbm
    };
    if let Some(c) = memory_roof(m, on, level) {
        out.push((
            roof(&c.id.to_string(), BoundKind::Memory, c.value),
            Axis::Oi,
        ));
    }
    out.extend(comm_roofs(m, coi));
    out
}

/// The allreduce roofs inside and between nodes of a point that communicates.
fn comm_roofs(m: &Machine, coi: Option<&Coi>) -> Vec<(RoofAt, Axis)> {
    let mut out = Vec::new();
    if let Some(coi) = coi {
        for (scope, bytes, axis) in [
            ("intra", coi.intra_node_bytes, Axis::CoiIntra),
            ("inter", coi.inter_node_bytes, Axis::CoiInter),
        ] {
            if bytes <= 0.0 {
                continue;
            }
            if let Some(c) = m
                .ceiling(&format!("net/allreduce/{scope}"))
                .filter(|c| c.kind == CeilingKind::Comm)
            {
                out.push((
                    roof(&c.id.to_string(), BoundKind::Communication, c.value),
                    axis,
                ));
            }
        }
    }
    out
}

fn roof(id: &str, kind: BoundKind, value: f64) -> RoofAt {
    RoofAt {
        ceiling: id.to_string(),
        kind,
        value,
        unit: if kind == BoundKind::Compute {
            "FLOP/s"
        } else {
            "B/s"
        }
        .into(),
        allows: 0.0,
    }
}

/// Which intensity a roof multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Axis {
    Flat,
    Oi,
    CoiIntra,
    CoiInter,
}

/// The memory level whose capacity holds `footprint` bytes on `threads` threads: each core's
/// private caches count once per thread, shared ones once per instance; beyond the last
/// level, `DRAM`.
pub fn memory_level(m: &Machine, footprint: f64, threads: usize) -> Level {
    let mut levels: Vec<(u32, f64)> = Vec::new();
    for c in &m.provenance.cpu.caches {
        if c.cache_type == "Instruction" {
            continue;
        }
        let copies = if c.cores_sharing() <= 1 {
            threads.max(1)
        } else {
            c.instances.max(1)
        };
        levels.push((c.level, c.size_bytes as f64 * copies as f64));
    }
    levels.sort_by_key(|l| l.0);
    levels
        .iter()
        .find(|(_, cap)| footprint <= *cap)
        .and_then(|(l, _)| format!("L{l}").parse().ok())
        .unwrap_or(Level::Dram)
}

/// Places a point with intensities `oi` (and `coi` when it communicates) and `achieved` FLOP/s
/// under `roofs`. None when there is no roof at all (an empty machine.json).
pub fn bound(roofs: &[(RoofAt, Axis)], oi: f64, coi: Option<&Coi>, achieved: f64) -> Option<Bound> {
    let mut all = Vec::new();
    for (r, axis) in roofs {
        let x = match axis {
            Axis::Flat => None,
            Axis::Oi => Some(oi),
            Axis::CoiIntra => coi.and_then(|c| c.intra_node),
            Axis::CoiInter => coi.and_then(|c| c.inter_node),
        };
        let allows = match x {
            None => r.value,
            Some(x) if x.is_finite() => r.value * x,
            Some(_) => continue,
        };
        all.push(RoofAt {
            allows,
            ..r.clone()
        });
    }
    let low = all
        .iter()
        .min_by(|a, b| a.allows.total_cmp(&b.allows))?
        .clone();
    Some(Bound {
        kind: low.kind,
        ceiling: low.ceiling.clone(),
        attainable: low.allows,
        headroom: if achieved > 0.0 {
            low.allows / achieved
        } else {
            f64::INFINITY
        },
        roofs: all,
    })
}

impl Placement {
    /// Parses a `placement.json` text, rejecting any other schema with a clear error.
    pub fn from_json(text: &str) -> Result<Placement, ModelError> {
        crate::from_json_with_schema(text, PLACEMENT_SCHEMA)
    }

    pub fn read(path: &Path) -> Result<Placement, ModelError> {
        crate::read_with_schema(path, PLACEMENT_SCHEMA)
    }

    pub fn to_json(&self) -> Result<String, ModelError> {
        serde_json::to_string_pretty(self).map_err(ModelError::Json)
    }
}

#[cfg(test)]
pub(crate) mod tests;
