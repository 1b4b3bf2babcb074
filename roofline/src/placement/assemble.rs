//! A measured workload placed: its point and its top layers held against the machine's roofs,
//! the energy per FLOP, the advice.

use super::{
    advise, bound, cpu_roofs, gpu_roofs, Coi, Energy, Intensity, MachineRef, Placement, Point,
    RoofAt, TimeBreakdown, WorkloadInfo, PLACEMENT_SCHEMA,
};
use crate::ids::{Family, Precision};
use crate::machine::{Machine, Provenance};
use crate::stats::Stats;
use std::path::Path;

/// One layer's share of a measured step: its time, its FLOPs, its analytic minimum bytes and
/// its footprint.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerTime {
    pub name: String,
    /// Mean seconds per measured step.
    pub seconds: f64,
    /// Each measured step's seconds (the samples of `seconds`; empty when not known).
    pub step_seconds: Vec<f64>,
    pub flops: f64,
    pub min_bytes: f64,
    pub footprint: f64,
    /// How it computed its FLOPs, where they are not what ran (e.g. a fast convolution
    /// algorithm: the FLOPs counted are the direct convolution's).
    pub note: Option<String>,
    /// The library's algorithms it ran (cuDNN's, per direction), where a library chose them.
    pub algorithm: Option<String>,
    /// Where the layer is one convolution: its shape as the probe's convolution tables name
    /// a row (`n=… c=… h=… w=… k=… r=… s=… stride=… pad=…`, this rank's batch), and whether it
    /// is the stem (no backward-data).
    pub conv: Option<LayerConv>,
}

/// A layer's convolution, as the probe's tables know it.
#[derive(Clone, Debug, PartialEq)]
pub struct LayerConv {
    pub shape: String,
    pub first: bool,
}

/// The roof of a GPU layer that is one convolution of a shape the probe measured in each of
/// its directions (forward, backward-filter, and backward-data unless it is the stem): the
/// rate of doing the layer's directions, each at its measured rate, one after the other — the
/// directions' equal FLOPs over the sum of their times, a harmonic mean. None where a
/// direction's row is missing (another batch, another precision, an older machine.json).
pub fn measured_conv_roof(
    m: &Machine,
    gpu: usize,
    precision: Precision,
    conv: &LayerConv,
) -> Option<RoofAt> {
    use crate::ceiling_id::TableRows;
    use crate::ids::{ConvDir, On, RoofId};
    let dirs: &[ConvDir] = if conv.first {
        &[ConvDir::Fwd, ConvDir::BwdFilter]
    } else {
        &ConvDir::ALL
    };
    let mut inverse = 0.0;
    for &dir in dirs {
        let of = RoofId::Compute {
            on: On::Gpu(gpu),
            family: Family::Conv,
            precision,
            direction: Some(dir),
        };
        let row = m
            .tables
            .iter()
            .filter(|t| t.id.of == of && t.id.rows == TableRows::Table)
            .flat_map(|t| &t.rows)
            .find(|r| r.shape == conv.shape && r.value > 0.0)?;
        inverse += 1.0 / row.value;
    }
    let value = dirs.len() as f64 / inverse;
    Some(RoofAt {
        ceiling: format!(
            "gpu{gpu}/conv/{precision} at {} ({} measured)",
            conv.shape,
            dirs.iter()
                .map(|d| d.name())
                .collect::<Vec<_>>()
                .join(" + ")
        ),
        kind: super::BoundKind::Compute,
        value,
        unit: "FLOP/s".into(),
        allows: value,
    })
}

/// What running a workload gave, before it is placed.
#[derive(Clone, Debug)]
pub struct Measured {
    pub info: WorkloadInfo,
    pub flops_per_step: f64,
    /// Every measured step's (or sample's, per iteration) seconds.
    pub step_seconds: Vec<f64>,
    pub min_bytes: f64,
    pub footprint: f64,
    pub coi: Option<Coi>,
    pub layers: Vec<LayerTime>,
    pub time: TimeBreakdown,
    pub energy: Energy,
}

/// Why a measurement cannot be placed.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlaceError {
    #[error("no finite measurement")]
    NoFiniteMeasurement,
    /// The machine.json lacks the ceilings of the run's device and precision (the input's fault).
    #[error("the machine.json has no {device} {precision} compute or memory ceiling to place this on: run `roofline probe{probe}` without --only")]
    NoRoof {
        device: String,
        precision: String,
        probe: &'static str,
    },
}

fn stats(v: &[f64]) -> Result<Stats, PlaceError> {
    Stats::from_samples(v).ok_or(PlaceError::NoFiniteMeasurement)
}

/// A layer's share of the step: the median of its per-step times over the median step. Each
/// step's layer time lies within that step, so the k-th smallest layer time is at most the k-th
/// smallest step time, and the share never passes 1 however one step stalled. (The mean layer
/// time over the median step did: a layer that stalled in one measured step of a sweep's point
/// on a busy CI runner read 1.10 of the step, and the sweep refused the file it had written.)
/// Where a layer's per-step times are not known its mean stands for them, held to 1.
pub fn share_of_step(layer_median: f64, step_median: f64) -> f64 {
    (layer_median / step_median.max(1e-12)).clamp(0.0, 1.0)
}

/// Places `r` on machine `m` (read from `path`): the point held against the roofs of its
/// device and precision, its `top` layers by time each against theirs, the energy per FLOP, the
/// advice; `provenance` is where and when it ran.
pub fn assemble(
    m: &Machine,
    path: &Path,
    r: Measured,
    top: usize,
    mut provenance: Provenance,
) -> Result<Placement, PlaceError> {
    let seconds = stats(&r.step_seconds)?;
    let rates: Vec<f64> = r
        .step_seconds
        .iter()
        .map(|s| r.flops_per_step / s)
        .collect();
    let achieved = stats(&rates)?;
    let oi = r.flops_per_step / r.min_bytes;
    let families: &[Family] = match r.info.kind.as_str() {
        "gemm" | "stream" => &[Family::Gemm, Family::Fma],
        _ => &[Family::Conv, Family::Gemm, Family::Fma],
    };
    // A GPU run is held against that GPU's ceilings (`gpuN/...`), a CPU run against the CPU's.
    let gpu: Option<usize> = r
        .info
        .device
        .strip_prefix("gpu")
        .and_then(|g| g.parse().ok());
    let no_roof = || PlaceError::NoRoof {
        device: r.info.device.clone(),
        precision: r.info.precision.clone(),
        probe: if gpu.is_some() { " --device cuda" } else { "" },
    };
    let precision: Precision = r.info.precision.parse().map_err(|_| no_roof())?;
    let roofs_at = |footprint: f64, coi: Option<&Coi>| match gpu {
        Some(g) => gpu_roofs(m, g, precision, families, footprint, coi),
        None => cpu_roofs(m, precision, families, r.info.threads, footprint, coi),
    };
    let roofs = roofs_at(r.footprint, r.coi.as_ref());
    let b = bound(&roofs, oi, r.coi.as_ref(), achieved.max).ok_or_else(no_roof)?;
    let measured_note = "no hardware memory-traffic counters are read (yet): the OI is the analytic minimum, an upper bound of the true one".to_string();
    let mut point = Point {
        label: r.info.name.clone(),
        flops_per_step: r.flops_per_step,
        seconds_per_step: seconds.clone(),
        achieved_flops: achieved.max,
        achieved,
        footprint_bytes: r.footprint,
        oi: Intensity {
            analytic_min_bytes: r.min_bytes,
            analytic: oi,
            measured: None,
            measured_note: measured_note.clone(),
        },
        coi: r.coi.clone(),
        share_of_step: None,
        bound: b,
        note: None,
    };
    // The layers that count FLOPs they did not do (Winograd's fewer multiplies, counted as the
    // direct convolution's): the whole's rate may pass its roof by their share.
    let (noted, noted_s): (usize, f64) = r
        .layers
        .iter()
        .filter(|l| l.note.is_some())
        .fold((0, 0.0), |(n, s), l| (n + 1, s + l.seconds));
    if noted > 0 {
        point.note = Some(format!(
            "{noted} of its layers ({:.0}% of the step) run a fast algorithm (Winograd's or an FFT: fewer multiplies than the direct convolution; each layer's footnote says which) and count the direct convolution's FLOPs, as the papers' rules do: the rate can pass a roof of the operations that ran",
            100.0 * noted_s / seconds.median.max(1e-12)
        ));
    }
    let mut layers = Vec::new();
    let mut by_time = r.layers.clone();
    by_time.sort_by(|x, y| y.seconds.total_cmp(&x.seconds));
    for l in by_time.into_iter().take(top) {
        if l.seconds <= 0.0 || l.flops <= 0.0 {
            continue;
        }
        let oi = l.flops / l.min_bytes;
        let rate = l.flops / l.seconds;
        let mut roofs = roofs_at(l.footprint, None);
        // A convolution of a shape the probe measured: its own measured rate is its compute
        // roof (in place of the families' best-shape ceilings); the memory's stays.
        let own = match (gpu, &l.conv) {
            (Some(g), Some(c)) => measured_conv_roof(m, g, precision, c),
            _ => None,
        };
        if let Some(own) = own {
            roofs.retain(|(r, _)| r.kind != super::BoundKind::Compute);
            roofs.push((own, super::Axis::Flat));
        }
        let Some(b) = bound(&roofs, oi, None, rate) else {
            continue;
        };
        let per_step = stats(if l.step_seconds.is_empty() {
            std::slice::from_ref(&l.seconds)
        } else {
            &l.step_seconds
        })?;
        let share = share_of_step(per_step.median, seconds.median);
        layers.push(Point {
            label: l.name,
            flops_per_step: l.flops,
            seconds_per_step: per_step,
            achieved_flops: rate,
            // One rate per measured step (its mean is not `rate`: `rate` is the mean time's).
            achieved: stats(&if l.step_seconds.iter().all(|s| *s > 0.0)
                && !l.step_seconds.is_empty()
            {
                l.step_seconds
                    .iter()
                    .map(|s| l.flops / s)
                    .collect::<Vec<_>>()
            } else {
                vec![rate]
            })?,
            footprint_bytes: l.footprint,
            oi: Intensity {
                analytic_min_bytes: l.min_bytes,
                analytic: oi,
                measured: None,
                measured_note: measured_note.clone(),
            },
            coi: None,
            share_of_step: Some(share),
            bound: b,
            // The fast-algorithm note and the library's algorithms, one footnote.
            note: match (l.note, l.algorithm) {
                (Some(n), Some(a)) => Some(format!("{n}; {a}")),
                (n, a) => n.or(a),
            },
        });
    }
    let mut energy = r.energy;
    if let Some(j) = energy.joules_per_step {
        energy.flops_per_watt = Some(r.flops_per_step / j);
    }
    let advice = advise(&r.info, &point, &layers, &r.time, m);
    provenance.notes.push(energy.note.clone());
    Ok(Placement {
        schema: PLACEMENT_SCHEMA.into(),
        provenance,
        machine: MachineRef::of(m, path),
        workload: r.info,
        point,
        layers,
        time: r.time,
        energy,
        advice,
    })
}
