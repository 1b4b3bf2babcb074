//! `sweep.json` (schema `roofline/sweep/v1`): a workload over a grid of problem sizes and
//! process counts, every point placed on the machine's roofline (SAIH: scale the data and the
//! model as HPL scales its matrix, and follow the trend).
//!
//! - Problem size: the analytic training FLOPs of one epoch, FLOPs per sample × training
//!   samples (it grows with the data and with the model).
//! - % of peak: the point's FLOP/s over the highest compute roof it was placed against, at the
//!   ceiling's theoretical peak where the machine has one (else its measured value) — the peak of
//!   the resources the point used.
//! - Strong scaling: the same problem (data and model) at several process counts; speedup
//!   `t(p₀) / t(p)` of one epoch's time (`⌈images / global batch⌉ ×` the median step) over the
//!   fewest processes p₀, efficiency `speedup × p₀ / p`. At one global batch (the default) that
//!   is the steps' ratio; with each process's batch held (`sweep --per-process-batch`, SAIH's
//!   node scaling) the global batch grows with the processes and the epoch takes fewer steps.
//! - Weak scaling: the data grown with the processes (the same images per process); each
//!   point's epoch time against the fewest processes': efficiency `t(p₀) / t(p)`. SAIH has no
//!   such series: its "data scaling" is the next.
//! - Data scaling (SAIH §5.4): the processes held, the data's share grown (SAIH: 4 nodes, 1/64
//!   to 1/1 of the data); each share's FLOP/s per process against the smallest share's.
//! - I/O share: the part of a step spent waiting for its data.

use crate::machine::{CeilingKind, Machine, Provenance};
use crate::placement::{BoundKind, Placement};
use crate::ModelError;
use serde::{Deserialize, Serialize};

pub const SWEEP_SCHEMA: &str = "roofline/sweep/v1";

/// What one point ran: its problem (data and model) and its processes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Problem {
    /// Training samples (SAIH's data size).
    pub images: usize,
    /// Image size, `N` or `HxW`.
    pub resolution: String,
    /// The model variant: backbone width multiplier and blocks per stage.
    pub width: f64,
    pub depth: String,
    /// Processes: threads of one process (`threads`) or MPI ranks (`ranks`).
    pub processes: usize,
    /// The point's global batch, over all its processes (0 in files before it was kept).
    #[serde(default)]
    pub batch: usize,
}

impl Problem {
    /// The problem without its process count (what strong scaling holds fixed).
    pub fn size_label(&self) -> String {
        format!(
            "{} images, {}, width {}, depth {}",
            self.images, self.resolution, self.width, self.depth
        )
    }
}

/// One point of the sweep.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SweepPoint {
    pub index: usize,
    pub problem: Problem,
    /// Analytic training FLOPs per sample.
    pub flops_per_sample: f64,
    /// flops_per_sample × images: SAIH's problem size (one epoch).
    pub problem_flops: f64,
    /// Seconds one epoch over the point's images takes at its measured rate: ⌈images /
    /// batch⌉ steps × the median step (0 in files before it was kept).
    #[serde(default)]
    pub epoch_seconds: f64,
    /// Epochs the point trained over its images (`sweep --epochs`: every image read, so that
    /// the data axis is real); None: a fixed number of measured steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epochs: Option<usize>,
    pub flops_per_step: f64,
    /// Median seconds per measured step.
    pub step_seconds: f64,
    /// FLOP/s of the median step.
    pub achieved_flops: f64,
    /// achieved / processes.
    pub per_process_flops: f64,
    pub peak_ceiling: String,
    pub peak_flops: f64,
    /// achieved / peak, a fraction (0.25 is 25%), as every share in the file (`io_share`).
    pub fraction_of_peak: f64,
    /// FLOP per byte of the analytic minimum of memory traffic: not SAIH's arithmetic
    /// intensity, which counts memory transactions ([`IntensityUnits`]).
    #[serde(alias = "arithmetic_intensity")]
    pub analytic_flop_per_byte: f64,
    pub bound: String,
    pub attainable_flops: f64,
    /// Seconds waiting for data / seconds per step.
    pub io_share: f64,
    /// The placement file of this point.
    pub placement: String,
}

impl SweepPoint {
    /// Point `index` of `problem` from its placement on `machine`.
    #[allow(clippy::too_many_arguments)]
    pub fn from_placement(
        index: usize,
        problem: Problem,
        flops_per_sample: f64,
        epochs: Option<usize>,
        p: &Placement,
        machine: &Machine,
        file: &str,
    ) -> SweepPoint {
        let pt = &p.point;
        let step = pt.seconds_per_step.median;
        let achieved = pt.flops_per_step / step.max(1e-300);
        // The highest compute roof the point was held against, at its theoretical peak.
        let (peak_ceiling, peak_flops) = pt
            .bound
            .roofs
            .iter()
            .filter(|r| r.kind == BoundKind::Compute)
            .map(|r| {
                let peak = machine
                    .ceilings
                    .iter()
                    .find(|c| c.id == r.ceiling && c.kind == CeilingKind::Compute)
                    .and_then(|c| c.theoretical_peak.as_ref().map(|t| t.value))
                    .unwrap_or(r.value);
                (r.ceiling.clone(), peak.max(r.value))
            })
            .fold(
                (String::new(), 0.0f64),
                |a, b| if b.1 > a.1 { b } else { a },
            );
        let processes = problem.processes.max(1);
        let batch = match problem.batch {
            0 => p.workload.batch.unwrap_or(1).max(1),
            b => b,
        };
        SweepPoint {
            index,
            flops_per_sample,
            problem_flops: flops_per_sample * problem.images as f64,
            epoch_seconds: problem.images.div_ceil(batch) as f64 * step,
            epochs,
            flops_per_step: pt.flops_per_step,
            step_seconds: step,
            achieved_flops: achieved,
            per_process_flops: achieved / processes as f64,
            fraction_of_peak: if peak_flops > 0.0 {
                achieved / peak_flops
            } else {
                0.0
            },
            peak_ceiling,
            peak_flops,
            analytic_flop_per_byte: pt.oi.analytic,
            bound: format!("{} under {}", pt.bound.kind.as_str(), pt.bound.ceiling),
            attainable_flops: pt.bound.attainable,
            io_share: if p.time.total_s > 0.0 {
                p.time.data_s / p.time.total_s
            } else {
                0.0
            },
            placement: file.to_string(),
            problem,
        }
    }
}

/// One problem at several process counts.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Scaling {
    pub problem: String,
    pub points: Vec<ScalingPoint>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScalingPoint {
    pub processes: usize,
    pub step_seconds: f64,
    pub speedup: f64,
    pub efficiency: f64,
}

/// SAIH's arithmetic intensity (its Table 3): FLOPs over the memory accesses nvprof counts,
/// reads plus writes (transactions, not bytes: at 32 bytes a DRAM transaction the FLOP per
/// byte of roofline's OI is this over 32).
pub fn saih_intensity(flops: f64, reads: f64, writes: f64) -> f64 {
    flops / (reads + writes)
}

/// Bytes of one DRAM transaction as nvprof counts them (`dram_read_transactions`).
pub const BYTES_PER_TRANSACTION: f64 = 32.0;

/// One row of SAIH's Table 3 (4 GPUs, 1/32 of the data), with its intensity in our units.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SaihRow {
    /// SAIH's model: S, M or L.
    pub model: String,
    /// Per-GPU batch.
    pub batch: usize,
    pub flops: f64,
    /// Memory transactions nvprof counted.
    pub reads: f64,
    pub writes: f64,
    /// FLOPs per transaction, as the table prints it (808, 2500, 1442).
    pub saih_intensity: f64,
    /// The same traffic in FLOP per byte: `saih_intensity / 32`, comparable with a point's
    /// `analytic_flop_per_byte` (measured traffic, where ours is the analytic minimum).
    pub flop_per_byte: f64,
}

/// What sweep.json's intensity is and how SAIH's compares: printed beside the points.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct IntensityUnits {
    pub ours: String,
    pub saih: String,
    /// SAIH's figure over ours for the same traffic.
    pub factor: f64,
    pub saih_table_3: Vec<SaihRow>,
}

impl IntensityUnits {
    /// The units and SAIH's Table 3, each row's intensity computed from its counts.
    pub fn saih() -> IntensityUnits {
        let rows = [
            ("S", 10, 6.9e10, 1e7, 7.53e7),
            ("M", 4, 4.64e12, 1.15e9, 7.09e8),
            ("L", 1, 1.78e13, 7.13e9, 5.21e9),
        ];
        IntensityUnits {
            ours: "analytic_flop_per_byte: the trainer's FLOPs over the analytic minimum of memory traffic, in bytes (no memory transactions are counted)".into(),
            saih: "SAIH's arithmetic intensity: FLOPs over the memory transactions nvprof counts (reads plus writes, 32 bytes each in DRAM)".into(),
            factor: BYTES_PER_TRANSACTION,
            saih_table_3: rows
                .iter()
                .map(|&(model, batch, flops, reads, writes)| {
                    let i = saih_intensity(flops, reads, writes);
                    SaihRow {
                        model: model.into(),
                        batch,
                        flops,
                        reads,
                        writes,
                        saih_intensity: i,
                        flop_per_byte: i / BYTES_PER_TRANSACTION,
                    }
                })
                .collect(),
        }
    }
}

/// A point's epoch time, or (files before it was kept) its step.
fn epoch_or_step(p: &SweepPoint) -> f64 {
    if p.epoch_seconds > 0.0 {
        p.epoch_seconds
    } else {
        p.step_seconds
    }
}

/// The strong-scaling series of `points`: every problem run at two or more process counts,
/// against its fewest, by the time of one epoch (at one global batch, the steps' ratio).
pub fn strong_scaling(points: &[SweepPoint]) -> Vec<Scaling> {
    series(
        points,
        |p| Some(p.problem.size_label()),
        |first, p| {
            let speedup = epoch_or_step(first) / epoch_or_step(p).max(1e-300);
            let p0 = first.problem.processes.max(1) as f64;
            (speedup, speedup * p0 / p.problem.processes.max(1) as f64)
        },
    )
}

/// The weak-scaling series of `points`: every model variant at one resolution whose images
/// per process are the same at two or more process counts (the data grown with the
/// processes), its epoch time against the fewest processes' (`speedup` is t(p₀) / t(p), and
/// `efficiency` the same: 1 when the time holds as the data and the processes grow together).
pub fn weak_scaling(points: &[SweepPoint]) -> Vec<Scaling> {
    series(
        points,
        |p| {
            let q = &p.problem;
            let n = q.processes.max(1);
            (q.images.is_multiple_of(n) && p.epoch_seconds > 0.0).then(|| {
                format!(
                    "{} images per process, {}, width {}, depth {}",
                    q.images / n,
                    q.resolution,
                    q.width,
                    q.depth
                )
            })
        },
        |first, p| {
            let e = first.epoch_seconds / p.epoch_seconds.max(1e-300);
            (e, e)
        },
    )
}

/// One share of the data in a data-scaling series.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataSharePoint {
    pub images: usize,
    /// images over the series' largest (SAIH's 1/64 … 1/1).
    pub share: f64,
    pub epoch_seconds: f64,
    pub achieved_flops: f64,
    pub per_process_flops: f64,
    /// per_process_flops over the smallest share's: 1 while the data's growth costs nothing
    /// (SAIH's small model: about 800 GFLOPS a GPU up to 1/4, then 520 at 1/2 and 1/1, 0.65).
    pub relative: f64,
}

/// SAIH's data scaling of one model variant at one process count: its shares of the data,
/// smallest first.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct DataScaling {
    /// The model, the resolution and the processes held.
    pub problem: String,
    pub processes: usize,
    pub points: Vec<DataSharePoint>,
}

/// The data-scaling series of `points`: every model variant at one resolution and process
/// count run on two or more numbers of images, each against the smallest.
pub fn data_scaling(points: &[SweepPoint]) -> Vec<DataScaling> {
    let key = |p: &SweepPoint| {
        let q = &p.problem;
        Some((
            format!("{}, width {}, depth {}", q.resolution, q.width, q.depth),
            q.processes,
        ))
    };
    groups(points, key, |p| p.problem.images)
        .into_iter()
        .map(|((problem, processes), s)| {
            let largest = s[s.len() - 1].problem.images.max(1) as f64;
            let base = s[0].per_process_flops.max(1e-300);
            DataScaling {
                problem,
                processes,
                points: s
                    .iter()
                    .map(|p| DataSharePoint {
                        images: p.problem.images,
                        share: p.problem.images as f64 / largest,
                        epoch_seconds: p.epoch_seconds,
                        achieved_flops: p.achieved_flops,
                        per_process_flops: p.per_process_flops,
                        relative: p.per_process_flops / base,
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The points of each `key` (None: in no group), in the order the keys first appear, each
/// group sorted by `axis` with one point per value, and only the groups of two or more values:
/// what every series of the sweep is drawn over.
fn groups<K: PartialEq>(
    points: &[SweepPoint],
    key: impl Fn(&SweepPoint) -> Option<K>,
    axis: impl Fn(&SweepPoint) -> usize,
) -> Vec<(K, Vec<&SweepPoint>)> {
    let mut keys: Vec<K> = Vec::new();
    for k in points.iter().filter_map(&key) {
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    keys.into_iter()
        .filter_map(|k| {
            let mut s: Vec<&SweepPoint> = points
                .iter()
                .filter(|p| key(p).as_ref() == Some(&k))
                .collect();
            s.sort_by_key(|p| axis(p));
            s.dedup_by_key(|p| axis(p));
            (s.len() >= 2).then_some((k, s))
        })
        .collect()
}

/// The points of each `key` (None: in no series) at two or more process counts ([`groups`]),
/// each scaled against the fewest by `scale` (first, point) → (speedup, efficiency).
fn series(
    points: &[SweepPoint],
    key: impl Fn(&SweepPoint) -> Option<String>,
    scale: impl Fn(&SweepPoint, &SweepPoint) -> (f64, f64),
) -> Vec<Scaling> {
    groups(points, key, |p| p.problem.processes)
        .into_iter()
        .map(|(l, s)| {
            let first = s[0];
            Scaling {
                problem: l,
                points: s
                    .iter()
                    .map(|p| {
                        let (speedup, efficiency) = scale(first, p);
                        ScalingPoint {
                            processes: p.problem.processes,
                            step_seconds: p.step_seconds,
                            speedup,
                            efficiency,
                        }
                    })
                    .collect(),
            }
        })
        .collect()
}

/// The whole `sweep.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sweep {
    pub schema: String,
    pub workload: String,
    /// `threads` or `ranks`.
    pub processes: String,
    /// The machine.json the points were placed on.
    pub machine: String,
    pub provenance: Provenance,
    /// In the order they ran (problem sizes ascending, then processes).
    pub points: Vec<SweepPoint>,
    pub scaling: Vec<Scaling>,
    /// Weak scaling ([`weak_scaling`]; empty in files before it was kept).
    #[serde(default)]
    pub weak_scaling: Vec<Scaling>,
    /// SAIH's data scaling ([`data_scaling`]; empty in files before it was kept).
    #[serde(default)]
    pub data_scaling: Vec<DataScaling>,
    /// Each point's --batch was its processes' each (`sweep --per-process-batch`, SAIH's node
    /// scaling), the global batch growing with them; false: one global batch for all.
    #[serde(default)]
    pub per_process_batch: bool,
    /// What `analytic_flop_per_byte` is, and SAIH's Table 3 in its units and ours (None in
    /// files before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intensity_units: Option<IntensityUnits>,
    /// Grid points left out (the model filter's choices, failed runs) and why.
    #[serde(default)]
    pub notes: Vec<String>,
    /// Where the sweep departs from SAIH's method, each with its reason (empty: none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deviations: Vec<String>,
}

impl Sweep {
    pub fn from_json(text: &str) -> Result<Sweep, ModelError> {
        crate::from_json_with_schema(text, SWEEP_SCHEMA)
    }

    pub fn to_json(&self) -> Result<String, ModelError> {
        serde_json::to_string_pretty(self).map_err(ModelError::Json)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// SAIH Table 3 (4 GPUs, 1/32 of the data): the small, medium and large 3D CNNs' counts
    /// give the table's 808, 2500 and 1442, which are 32 times our FLOP per byte.
    #[test]
    fn saih_table_3_intensities() {
        let u = IntensityUnits::saih();
        assert_eq!(u.factor, 32.0);
        assert_eq!(u.saih_table_3.len(), 3);
        for (r, intensity) in u.saih_table_3.iter().zip([808.0, 2500.0, 1442.0]) {
            let got = saih_intensity(r.flops, r.reads, r.writes);
            // The table rounds to three or four figures.
            assert!((got / intensity - 1.0).abs() < 2e-3, "{got} vs {intensity}");
            assert_eq!(r.saih_intensity, got);
            assert!((r.flop_per_byte * 32.0 - got).abs() < 1e-9);
        }
        let batches: Vec<usize> = u.saih_table_3.iter().map(|r| r.batch).collect();
        assert_eq!(batches, vec![10, 4, 1]);
    }

    fn point(images: usize, processes: usize, step: f64) -> SweepPoint {
        SweepPoint {
            index: 0,
            problem: Problem {
                images,
                resolution: "32".into(),
                width: 0.25,
                depth: "1,1,1,1".into(),
                processes,
                batch: 8,
            },
            flops_per_sample: 1e9,
            problem_flops: 1e9 * images as f64,
            epoch_seconds: images.div_ceil(8) as f64 * step,
            epochs: None,
            flops_per_step: 8e9,
            step_seconds: step,
            achieved_flops: 8e9 / step,
            per_process_flops: 8e9 / step / processes as f64,
            peak_ceiling: "cpu/conv/f32/all".into(),
            peak_flops: 1e11,
            fraction_of_peak: 8e9 / step / 1e11,
            analytic_flop_per_byte: 10.0,
            bound: "compute-bound".into(),
            attainable_flops: 1e11,
            io_share: 0.0,
            placement: "p.json".into(),
        }
    }

    /// Speedup and efficiency by hand: 1 → 2 → 4 processes at 8, 5 and 4 s per step: speedups
    /// 1, 1.6, 2; efficiencies 1, 0.8, 0.5; a problem run at one count has no series.
    #[test]
    fn strong_scaling_by_hand() {
        let pts = vec![
            point(64, 2, 5.0),
            point(64, 1, 8.0),
            point(64, 4, 4.0),
            point(256, 1, 30.0),
        ];
        let s = strong_scaling(&pts);
        assert_eq!(s.len(), 1);
        let got: Vec<(usize, f64, f64)> = s[0]
            .points
            .iter()
            .map(|p| (p.processes, p.speedup, p.efficiency))
            .collect();
        assert_eq!(got, vec![(1, 1.0, 1.0), (2, 1.6, 0.8), (4, 2.0, 0.5)]);
        assert!(s[0].problem.starts_with("64 images"));
    }

    /// Weak scaling by hand, a batch of 8: 64 images on 1 process at 8 s a step is 8 steps, 64
    /// s an epoch; 128 on 2 at 5 s is 16 steps, 80 s (efficiency 0.8); 256 on 4 at 4 s is 128
    /// s (0.5). 64 on 2 has 32 a process: a series of its own, with no second count.
    #[test]
    fn weak_scaling_by_hand() {
        let pts = vec![
            point(128, 2, 5.0),
            point(64, 1, 8.0),
            point(256, 4, 4.0),
            point(64, 2, 5.0),
        ];
        let w = weak_scaling(&pts);
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].problem.starts_with("64 images per process"));
        let got: Vec<(usize, f64)> = w[0]
            .points
            .iter()
            .map(|p| (p.processes, p.efficiency))
            .collect();
        assert_eq!(got, vec![(1, 1.0), (2, 0.8), (4, 0.5)]);
    }

    /// SAIH's node scaling by hand: 64 images, each process's batch 8 (global 8, 16, 32):
    /// 8 steps of 8 s on 1 process is 64 s an epoch; 4 steps of 10 s on 2 is 40 s (speedup
    /// 1.6, 80%); 2 steps of 16 s on 4 is 32 s (2, 50%). The steps' ratio would say < 1.
    #[test]
    fn node_scaling_by_the_epoch_with_each_process_batch_held() {
        let at = |p: usize, step: f64| {
            let mut x = point(64, p, step);
            x.problem.batch = 8 * p;
            x.epoch_seconds = 64usize.div_ceil(8 * p) as f64 * step;
            x
        };
        let s = strong_scaling(&[at(1, 8.0), at(2, 10.0), at(4, 16.0)]);
        let got: Vec<(usize, f64, f64)> = s[0]
            .points
            .iter()
            .map(|p| (p.processes, p.speedup, p.efficiency))
            .collect();
        assert_eq!(got, vec![(1, 1.0, 1.0), (2, 1.6, 0.8), (4, 2.0, 0.5)]);
    }

    /// SAIH's data scaling by hand: 4 processes, 16, 32 and 64 images (shares 1/4, 1/2, 1)
    /// at 8, 8 and 10 s a step of 8 GFLOP: 0.25 GFLOP/s a process, the same, then 0.2
    /// (relative 0.8); another process count is a series of its own, one of one share none.
    #[test]
    fn data_scaling_by_hand() {
        let pts = vec![
            point(64, 4, 10.0),
            point(16, 4, 8.0),
            point(32, 4, 8.0),
            point(64, 2, 10.0),
        ];
        let d = data_scaling(&pts);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!(d[0].processes, 4);
        assert!(d[0].problem.contains("width 0.25"));
        let got: Vec<(usize, f64, f64)> = d[0]
            .points
            .iter()
            .map(|p| (p.images, p.share, p.relative))
            .collect();
        assert_eq!(got, vec![(16, 0.25, 1.0), (32, 0.5, 1.0), (64, 1.0, 0.8)]);
        assert!((d[0].points[2].per_process_flops - 0.2e9).abs() < 1.0);
    }
}
