//! SVG rooflines. Knows only the model's types.
//!
//! The classic roofline (log-log, operational intensity in FLOP/byte against FLOP/s): every
//! memory level a slanted roof (bandwidth × intensity) drawn up to the highest compute roof,
//! every compute ceiling a flat roof drawn from where it meets the highest bandwidth roof,
//! theoretical peaks dashed, the ridge points (peak / bandwidth) marked and labelled exactly.

pub mod automl;
pub mod check;
pub mod gpus;
pub mod html;
pub mod labels;
pub mod links;
pub mod order;
pub mod placed;
pub(crate) mod render;
pub mod report;
pub mod sweep;

pub(crate) use render::POINT_COLORS;
pub use render::{classic_svg, roof_name};

use roofline_model::{
    Ceiling, CeilingId, CeilingKind, ConvDir, Family, Level, Machine, MemOp, On, RoofId, Threads,
};

/// Errors of plotting.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot: {0}")]
    Empty(String),
    #[error("drawing failed: {0}")]
    Draw(String),
    /// The axes would span more decades than a plot can show (a value in the file is wrong:
    /// the plotting library's tick search never ends on such a range).
    #[error("the {axis} axis would run from {from:e} to {to:e}, more than {MAX_DECADES} decades: a value in the file is wrong")]
    Range {
        axis: &'static str,
        from: f64,
        to: f64,
    },
}

/// The most decades an axis of a roofline plot spans.
pub const MAX_DECADES: f64 = 15.0;

/// `range` when it is finite, positive, increasing and at most [`MAX_DECADES`] wide.
pub(crate) fn checked_range(
    axis: &'static str,
    range: (f64, f64),
) -> Result<(f64, f64), PlotError> {
    let (from, to) = range;
    let ok = from.is_finite()
        && to.is_finite()
        && from > 0.0
        && to > from
        && (to / from).log10() <= MAX_DECADES;
    if ok {
        Ok(range)
    } else {
        Err(PlotError::Range { axis, from, to })
    }
}

/// What to draw.
#[derive(Clone, Debug)]
pub struct ClassicOptions {
    /// Which roofline: memory (classic), or communication (HPC AI500's COI models).
    pub model: Model,
    /// Whose roofline: `cpu`, or a GPU as `gpu0`, `gpu1`, ... (classic model).
    pub device: String,
    /// Which thread configuration (CPU only): ids ending in `/t1` or `/all`.
    pub threads: Threads,
    /// Which memory operation's ceilings make the slanted roofs (`triad`, `read`, ...).
    pub op: MemOp,
    pub width: u32,
    pub height: u32,
    /// Workloads placed on the plot (`roofline place`).
    pub points: Vec<PlotPoint>,
    /// Replaces the generated title.
    pub title: Option<String>,
    /// Lines joining points in order (a sweep's trajectory as its problem grows), each a list
    /// of (intensity, FLOP/s).
    pub trajectories: Vec<Vec<(f64, f64)>>,
    /// Draw a power-capped GPU ceiling's burst figure (before the cap) instead of its
    /// sustained one ([`Ceiling::drawn`]); the title says which.
    pub burst: bool,
}

/// A placed workload or layer: drawn at (intensity, achieved) with a tick at the attainable
/// bound above it (a dotted line between them: the headroom).
#[derive(Clone, Debug, PartialEq)]
pub struct PlotPoint {
    pub label: String,
    /// One colour per group (a workload and its layers share it).
    pub group: String,
    /// FLOP/byte (OI for the classic model, COI for the COI models).
    pub intensity: f64,
    pub achieved: f64,
    pub attainable: f64,
    /// The workload itself (a larger marker) rather than one of its layers.
    pub main: bool,
    /// Its share of the step's time (a layer's): the marker's area grows with it.
    pub share: Option<f64>,
    /// The ceiling that binds it (its roof is drawn thicker).
    pub binding: Option<String>,
}

impl Default for ClassicOptions {
    fn default() -> Self {
        ClassicOptions {
            model: Model::Classic,
            device: "cpu".into(),
            threads: Threads::All,
            op: MemOp::Triad,
            width: 1100,
            height: 760,
            points: Vec::new(),
            title: None,
            trajectories: Vec::new(),
            burst: false,
        }
    }
}

/// The rooflines `roofline plot` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// Operational intensity (FLOP per byte of memory traffic): memory roofs.
    Classic,
    /// HPC AI500 V2.0's single-node COI roofline: FLOP per byte communicated; flat roofs are
    /// the node's compute, GEMM and convolution ceilings; slanted roofs its intra-node
    /// communication and its memory bandwidth.
    NodeCoi,
    /// The distributed COI roofline: flat roofs are the aggregate (all nodes) compute
    /// ceilings; slanted roofs the inter-node network, and intra-node communication as the
    /// better ceiling.
    DistCoi,
}

/// Whether `c` is a flat roof of the COI model `model`: a node's whole compute (the CPU's
/// `all` roofs, a GPU's GEMM and forward convolution); the aggregates of them for the
/// distributed model.
fn coi_flat(c: &Ceiling, model: Model) -> bool {
    if c.kind != CeilingKind::Compute || c.unit != "FLOP/s" {
        return false;
    }
    let node_compute = |id: &CeilingId| match id.roof() {
        Some(RoofId::Compute { on: On::Cpu(t), .. }) => t == Threads::All,
        Some(RoofId::Compute {
            on: On::Gpu(_),
            family,
            direction,
            ..
        }) => family == Family::Gemm || (family == Family::Conv && direction == Some(ConvDir::Fwd)),
        _ => false,
    };
    let id = &c.id;
    match (model, id) {
        (Model::NodeCoi, id) => node_compute(id),
        (Model::DistCoi, CeilingId::Aggregate(of)) => match of.roof() {
            Some(RoofId::Compute { on: On::Cpu(t), .. }) => t == Threads::All,
            Some(RoofId::Compute { on: On::Gpu(_), .. }) => true,
            _ => false,
        },
        _ => false,
    }
}

/// Whether `c` is a slanted roof of the COI model `model`: the communication a step of data
/// parallelism waits for (allreduce, point to point) and, inside a node, its main memory.
fn coi_slanted(c: &Ceiling, model: Model, op: MemOp) -> bool {
    use roofline_model::ceiling_id::{Collective, CommLib, P2pMetric, Scope};
    let id = &c.id;
    let allreduce = |lib, scope| CeilingId::Collective {
        lib,
        op: Collective::AllReduce,
        scope,
    };
    let p2p = |scope| CeilingId::P2p {
        scope,
        metric: P2pMetric::Bandwidth,
    };
    match model {
        Model::NodeCoi => {
            *id == allreduce(CommLib::Mpi, Scope::Intra)
                || *id == p2p(Scope::Intra)
                || *id == allreduce(CommLib::Nccl, Scope::World)
                || (c.kind == CeilingKind::Memory
                    && match id.roof() {
                        Some(RoofId::Memory {
                            on: On::Cpu(Threads::All),
                            level: Level::Dram,
                            op: o,
                        }) => o == op,
                        Some(RoofId::Memory {
                            on: On::Gpu(_),
                            level: Level::Hbm,
                            op: o,
                        }) => o == op,
                        _ => false,
                    })
        }
        Model::DistCoi => {
            *id == allreduce(CommLib::Mpi, Scope::Inter)
                || *id == p2p(Scope::Inter)
                || *id == allreduce(CommLib::Mpi, Scope::Intra)
                || *id == allreduce(CommLib::Nccl, Scope::World)
        }
        Model::Classic => false,
    }
}

/// One roof as drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct DrawnRoof {
    pub label: String,
    pub value: f64,
    pub slanted: bool,
    pub dashed: bool,
    /// The theoretical peak merged into this measured roof (it reaches at least
    /// [`MERGE_PEAK`] of it: the two would be one line on the plot).
    pub peak: Option<f64>,
}

/// A measured compute roof at or above this fraction of its theoretical peak is drawn as one
/// roof with it ("574 of 577 GFLOP/s"), not as two lines a few pixels apart.
pub const MERGE_PEAK: f64 = 0.9;

/// A ridge point: where a bandwidth roof meets the top compute roof.
#[derive(Clone, Debug, PartialEq)]
pub struct Ridge {
    pub memory: String,
    pub compute: String,
    /// FLOP/byte
    pub intensity: f64,
    /// FLOP/s
    pub performance: f64,
}

/// The roofs and ridges the classic plot shows, computed from the machine (testable without
/// rendering).
#[derive(Clone, Debug)]
pub struct ClassicModel {
    pub flat: Vec<DrawnRoof>,
    pub slanted: Vec<DrawnRoof>,
    pub ridges: Vec<Ridge>,
    pub x_range: (f64, f64),
    pub y_range: (f64, f64),
}

fn suffix_matches(c: &Ceiling, threads: Threads) -> bool {
    matches!(c.id.roof().map(|r| r.on()), Some(On::Cpu(t)) if t == threads)
}

/// Whether `c` is a roof of the chosen device's plot: CPU roofs of the chosen thread
/// configuration, or a GPU's own (compute: FMA, mma and GEMM roofs; convolution ceilings stay
/// in the table to keep the plot readable); with `op`, memory roofs of that operation only.
fn selected(c: &Ceiling, opt: &ClassicOptions, op: Option<MemOp>) -> bool {
    let Some(id) = c.id.roof() else {
        return false;
    };
    let on = match id.on() {
        On::Cpu(t) => opt.device == "cpu" && t == opt.threads,
        On::Gpu(g) => opt.device == format!("gpu{g}"),
    };
    on && match id {
        RoofId::Compute { family, .. } => family != Family::Conv || opt.device == "cpu",
        RoofId::Memory { op: o, .. } => match op {
            Some(want) => want == o,
            None => true,
        },
    }
}

/// The configuration named in the legend and the title.
fn config_name(opt: &ClassicOptions) -> String {
    if opt.device == "cpu" {
        opt.threads.name().to_string()
    } else {
        opt.device.clone()
    }
}

/// Level order for the legend: L1, L2, L3, DRAM.
fn level_rank(level: &str) -> u32 {
    level
        .strip_prefix('L')
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

/// Picks the roofs of the classic plot.
pub fn classic_model(m: &Machine, opt: &ClassicOptions) -> Result<ClassicModel, PlotError> {
    let mut flat: Vec<DrawnRoof> = Vec::new();
    let flat_roof = |c: &Ceiling| match opt.model {
        Model::Classic => {
            c.kind == CeilingKind::Compute && c.unit == "FLOP/s" && selected(c, opt, None)
        }
        model => coi_flat(c, model),
    };
    for c in m.ceilings.iter().filter(|c| flat_roof(c)) {
        flat.push(DrawnRoof {
            label: c.id.to_string(),
            value: c.drawn(opt.burst),
            slanted: false,
            dashed: false,
            peak: None,
        });
        // A precision's theoretical peak, where it applies: given by the FMA (or mma)
        // ceiling, whose instruction the rule counts; a CPU GEMM in f16 runs in f32 and has
        // no f16 peak of its own. A GPU's GEMM ceiling carries its datasheet peak.
        let gives_peak = match c.id.roof() {
            Some(RoofId::Compute { on, family, .. }) => {
                matches!(family, Family::Fma | Family::Mma | Family::Wgmma)
                    || matches!(on, On::Gpu(_))
            }
            _ => false,
        };
        let Some(p) = c
            .theoretical_peak
            .as_ref()
            .filter(|p| gives_peak && p.unit == "FLOP/s")
        else {
            continue;
        };
        let prec = c.precision.map(|p| p.to_string()).unwrap_or_default();
        let label = format!("theoretical {prec} peak ({})", config_name(opt));
        let drawn = flat.iter().any(|r| {
            r.label == label
                || (r.dashed && (r.value - p.value).abs() <= 1e-9 * p.value)
                || r.peak
                    .is_some_and(|v| (v - p.value).abs() <= 1e-9 * p.value)
        });
        if drawn {
            continue;
        }
        if c.value >= MERGE_PEAK * p.value {
            // Within a line's width of its peak: one roof, labelled "574 of 577 GFLOP/s".
            if let Some(r) = flat.last_mut() {
                r.peak = Some(p.value);
            }
        } else {
            flat.push(DrawnRoof {
                label,
                value: p.value,
                slanted: false,
                dashed: true,
                peak: None,
            });
        }
    }
    let mut mem: Vec<&Ceiling> = m
        .ceilings
        .iter()
        .filter(|c| match opt.model {
            Model::Classic => c.kind == CeilingKind::Memory && selected(c, opt, Some(opt.op)),
            model => coi_slanted(c, model, opt.op),
        })
        .collect();
    // L1, L2, L3, then DRAM/HBM.
    mem.sort_by_key(|c| level_rank(&c.level.map(|l| l.to_string()).unwrap_or_default()));
    let slanted: Vec<DrawnRoof> = mem
        .iter()
        .map(|c| DrawnRoof {
            label: c.id.to_string(),
            value: c.value,
            slanted: true,
            dashed: false,
            peak: None,
        })
        .collect();
    if flat.is_empty() && slanted.is_empty() {
        return Err(PlotError::Empty(match opt.model {
            Model::Classic => format!(
                "machine.json has no compute or `{}` memory ceilings for `{}`; run `roofline probe` without --only, or pick --device / --threads / --op",
                opt.op,
                config_name(opt)
            ),
            Model::NodeCoi => "machine.json has no node compute or intra-node communication ceilings; run `mpirun -np 2 roofline probe` (a build with --features mpi)".into(),
            Model::DistCoi => "machine.json has no aggregate or inter-node ceilings; run `roofline probe` under mpirun across two or more nodes".into(),
        }));
    }
    if opt.model == Model::NodeCoi && !slanted.iter().any(|r| r.label.starts_with("net/")) {
        return Err(PlotError::Empty(
            "machine.json has no communication ceilings: a COI roofline needs them (it was probed as one process); run `mpirun -np 2 roofline probe` (a build with --features mpi)".into(),
        ));
    }
    if opt.model == Model::DistCoi && !slanted.iter().any(|r| r.label.contains("inter")) {
        return Err(PlotError::Empty(
            "machine.json has no inter-node communication ceilings: it was probed on one node; run `roofline probe` under mpirun across two or more nodes".into(),
        ));
    }
    // Ridge points against the single-precision peak (HPC AI500's reference precision), or the
    // highest measured compute roof when there is none.
    let measured = || flat.iter().filter(|r| !r.dashed);
    let f32_peak = measured()
        .filter(|r| match opt.model {
            Model::Classic => {
                r.label.starts_with("cpu/fma/f32/") || r.label == format!("{}/fma/f32", opt.device)
            }
            Model::NodeCoi => r.label == "cpu/fma/f32/all",
            Model::DistCoi => r.label == "agg/cpu/fma/f32/all",
        })
        .map(|r| (r.value, r.label.clone()))
        .next();
    let top = f32_peak.or_else(|| {
        measured()
            .map(|r| (r.value, r.label.clone()))
            .fold(None::<(f64, String)>, |a, b| match a {
                Some(a) if a.0 >= b.0 => Some(a),
                _ => Some(b),
            })
    });
    let mut ridges = Vec::new();
    if let Some((peak, label)) = &top {
        for s in &slanted {
            ridges.push(Ridge {
                memory: s.label.clone(),
                compute: label.clone(),
                intensity: peak / s.value,
                performance: *peak,
            });
        }
    }
    // Ranges: around the ridges; FLOP/s from the lowest roof at the left edge to above the top.
    let (mut xmin, mut xmax) = (f64::INFINITY, 0.0f64);
    for r in &ridges {
        xmin = xmin.min(r.intensity);
        xmax = xmax.max(r.intensity);
    }
    if !xmin.is_finite() {
        (xmin, xmax) = (1.0, 1.0);
    }
    for p in opt.points.iter().filter(|p| p.intensity > 0.0) {
        xmin = xmin.min(p.intensity);
        xmax = xmax.max(p.intensity);
    }
    let x_range = (pow10_floor(xmin / 4.0), pow10_ceil(xmax * 4.0));
    let ymax = if flat.is_empty() {
        slanted
            .iter()
            .map(|r| r.value * x_range.1)
            .fold(0.0, f64::max)
    } else {
        flat.iter().map(|r| r.value).fold(0.0, f64::max)
    };
    let ymin = slanted
        .iter()
        .map(|r| r.value * x_range.0)
        .chain(flat.iter().map(|r| r.value))
        .chain(
            opt.points
                .iter()
                .filter(|p| p.achieved > 0.0)
                .map(|p| p.achieved),
        )
        .fold(f64::INFINITY, f64::min);
    let ymax = opt
        .points
        .iter()
        .map(|p| p.achieved.max(p.attainable))
        .fold(ymax, f64::max);
    let y_range = (pow10_floor(ymin / 1.5), pow10_ceil(ymax * 1.5));
    let x_range = checked_range("intensity", x_range)?;
    let y_range = checked_range("performance", y_range)?;
    Ok(ClassicModel {
        flat,
        slanted,
        ridges,
        x_range,
        y_range,
    })
}

/// The largest of 1, 2, 5 × 10^k not above `x`.
fn pow10_floor(x: f64) -> f64 {
    let d = 10f64.powf(x.log10().floor());
    [5.0, 2.0, 1.0]
        .into_iter()
        .map(|m| m * d)
        .find(|v| *v <= x * (1.0 + 1e-9))
        .unwrap_or(d)
}
/// The smallest of 1, 2, 5 × 10^k not below `x`.
fn pow10_ceil(x: f64) -> f64 {
    let d = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * d)
        .find(|v| *v >= x * (1.0 - 1e-9))
        .unwrap_or(10.0 * d)
}

/// SI prefix formatting (the model's): 1.2e11 → "120 G".
pub use roofline_model::si;

#[cfg(test)]
mod tests;
