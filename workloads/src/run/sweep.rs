//! The grid of a SAIH sweep (`roofline sweep`): model variants (width × depth) at each
//! resolution and training-set size, each with its training FLOPs per sample by the trainer's
//! count, kept or left out by a FLOPs range, smallest problem first.

use super::prepare::{Depth, Kind, Resolution};
use crate::accounting::{classifier, trainer};
use crate::detect::model::DetectorConfig;
use crate::resnet::{Config, Version};

/// One point of the grid: a model variant at a resolution on a number of training images.
#[derive(Clone, Debug, PartialEq)]
pub struct GridPoint {
    /// Training FLOPs per sample.
    pub flops_per_sample: f64,
    pub width: f64,
    pub depth: Depth,
    pub resolution: Resolution,
    pub images: usize,
}

/// What a sweep varies.
#[derive(Clone, Debug)]
pub struct GridSpec {
    pub workload: Kind,
    pub resolutions: Vec<Resolution>,
    pub widths: Vec<f64>,
    pub depths: Vec<Depth>,
    pub images: Vec<usize>,
    /// Keep the variants whose training FLOPs per sample lie in `[lo, hi]` (SAIH's filter).
    pub model_flops: Option<(f64, f64)>,
}

/// How a sweep's points run: threads of one process, or MPI ranks through a launcher.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Processes {
    Threads,
    Ranks,
}

impl Processes {
    /// As the sweep's table and sweep.json name it.
    pub fn name(self) -> &'static str {
        match self {
            Processes::Threads => "threads",
            Processes::Ranks => "ranks",
        }
    }
}

/// A sweep as asked: what varies (an empty list takes the default) and the processes of each
/// point (`threads` or `ranks`, at most one of them given).
#[derive(Clone, Debug)]
pub struct SweepSpec {
    pub workload: Kind,
    pub resolutions: Vec<Resolution>,
    pub widths: Vec<f64>,
    pub depths: Vec<Depth>,
    pub images: Vec<usize>,
    pub model_flops: Option<FlopsRange>,
    pub threads: Vec<usize>,
    pub ranks: Vec<usize>,
    /// The global batch of every point, or with `per_process_batch` each process's (SAIH's
    /// node scaling: the global batch grows with the processes); and the measured steps.
    pub batch: usize,
    pub per_process_batch: bool,
    pub steps: usize,
    /// SAIH's data scaling: the one `images` is the whole set, and each point trains on
    /// `images / d` of it for each `d` (64, 32, …, 1: 1/64 to 1/1); empty: `images` as given.
    pub data_shares: Vec<usize>,
}

/// The sweep to run: every grid point at every process count, and a note for each variant the
/// FLOPs range left out.
#[derive(Clone, Debug)]
pub struct SweepPlan {
    pub grid: Vec<GridPoint>,
    pub notes: Vec<String>,
    pub processes: Processes,
    pub counts: Vec<usize>,
    batch: usize,
    per_process_batch: bool,
}

impl SweepPlan {
    /// The global batch of a point at `processes`.
    pub fn global_batch(&self, processes: usize) -> usize {
        if self.per_process_batch {
            self.batch * processes.max(1)
        } else {
            self.batch
        }
    }
}

/// A sweep that cannot be run as asked (the command line's exit 2).
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum SweepError {
    #[error("--images, --steps and --batch must be positive")]
    NotPositive,
    #[error("--{} 0: a point needs a process", .0.name())]
    NoProcess(Processes),
    #[error("--batch {batch} does not divide among {ranks} ranks")]
    Batch { batch: usize, ranks: usize },
    #[error("--data-shares takes the whole data set as one --images (got {0} values)")]
    SharesOfOne(usize),
    #[error("--data-shares {share}: {images} images have no 1/{share} share (it must lie in 1..={images})")]
    Share { share: usize, images: usize },
    #[error("no model variant's training FLOPs per sample lie in --model-flops: {}", .left_out.join("; "))]
    NoVariant { left_out: Vec<String> },
}

impl SweepSpec {
    /// The plan, the defaults filled in: resolution 64 (resnet50) or 128×192 (ewa); width 0.25
    /// and depth 1,1,1,1, or with a FLOPs range the candidates 0.125–1 × 1,1,1,1–3,4,6,3; every
    /// CPU roofline may use as the one thread count.
    pub fn plan(&self) -> Result<SweepPlan, SweepError> {
        if self.images.contains(&0) || self.steps == 0 || self.batch == 0 {
            return Err(SweepError::NotPositive);
        }
        let resolutions = match (self.resolutions.is_empty(), self.workload) {
            (false, _) => self.resolutions.clone(),
            (true, Kind::Ewa) => vec![Resolution { h: 128, w: 192 }],
            (true, Kind::Resnet50) => vec![Resolution { h: 64, w: 64 }],
        };
        let filter = self.model_flops.is_some();
        let widths = match (self.widths.is_empty(), filter) {
            (false, _) => self.widths.clone(),
            (true, true) => vec![0.125, 0.25, 0.5, 1.0],
            (true, false) => vec![0.25],
        };
        let depths = match (self.depths.is_empty(), filter) {
            (false, _) => self.depths.clone(),
            (true, true) => vec![
                Depth([1, 1, 1, 1]),
                Depth([2, 2, 2, 2]),
                Depth([3, 4, 6, 3]),
            ],
            (true, false) => vec![Depth([1, 1, 1, 1])],
        };
        let (processes, counts) = if self.ranks.is_empty() {
            let counts = if self.threads.is_empty() {
                vec![roofline_kernels::affinity::cores(None).map_or(1, |c| c.all.len())]
            } else {
                self.threads.clone()
            };
            (Processes::Threads, counts)
        } else {
            (Processes::Ranks, self.ranks.clone())
        };
        if counts.contains(&0) {
            return Err(SweepError::NoProcess(processes));
        }
        if processes == Processes::Ranks && !self.per_process_batch {
            if let Some(&ranks) = counts.iter().find(|r| !self.batch.is_multiple_of(**r)) {
                return Err(SweepError::Batch {
                    batch: self.batch,
                    ranks,
                });
            }
        }
        let (grid, notes) = GridSpec {
            workload: self.workload,
            resolutions,
            widths,
            depths,
            images: self.images()?,
            model_flops: self.model_flops.map(|r| (r.0, r.1)),
        }
        .grid()?;
        Ok(SweepPlan {
            grid,
            notes,
            processes,
            counts,
            batch: self.batch,
            per_process_batch: self.per_process_batch,
        })
    }

    /// The numbers of training images: as given, or the shares of the one given, smallest
    /// first.
    fn images(&self) -> Result<Vec<usize>, SweepError> {
        if self.data_shares.is_empty() {
            return Ok(self.images.clone());
        }
        let &[all] = self.images.as_slice() else {
            return Err(SweepError::SharesOfOne(self.images.len()));
        };
        let mut v = Vec::new();
        for &d in &self.data_shares {
            if d == 0 || d > all {
                return Err(SweepError::Share {
                    share: d,
                    images: all,
                });
            }
            v.push(all / d);
        }
        v.sort_unstable();
        v.dedup();
        Ok(v)
    }
}

/// Training FLOPs per `r` sample of a `workload` variant (the trainer's count).
pub fn flops_per_sample(workload: Kind, width: f64, depth: Depth, r: Resolution) -> f64 {
    match workload {
        Kind::Ewa => crate::accounting::detector_flops(
            &DetectorConfig::scaled(width, depth.0, r.h, r.w),
            r.h,
            r.w,
        )
        .total()
        .training(),
        Kind::Resnet50 => {
            let cfg = Config {
                version: Version::V1_5,
                blocks: depth.0,
                width,
                classes: 10,
                zero_init_residual: false,
            };
            trainer(&classifier(&cfg, 3, r.h, r.w)).total()
        }
    }
}

/// A range of training FLOPs per sample, `LO..HI` (`--model-flops`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FlopsRange(pub f64, pub f64);

impl std::str::FromStr for FlopsRange {
    type Err = String;
    fn from_str(s: &str) -> Result<FlopsRange, String> {
        let (a, b) = s.split_once("..").ok_or("expected LO..HI, e.g. 1e8..5e9")?;
        let num = |x: &str| {
            x.trim()
                .parse::<f64>()
                .map_err(|_| format!("{x:?} is not a number"))
        };
        let (lo, hi) = (num(a)?, num(b)?);
        if !(lo >= 0.0 && hi > lo) {
            return Err("expected 0 <= LO < HI".into());
        }
        Ok(FlopsRange(lo, hi))
    }
}

impl GridSpec {
    /// The grid, smallest problem (FLOPs per sample × images) first, and a note for each
    /// variant the FLOPs range left out; no variant left is an error naming them.
    pub fn grid(&self) -> Result<(Vec<GridPoint>, Vec<String>), SweepError> {
        let mut notes = Vec::new();
        let mut grid = Vec::new();
        for &r in &self.resolutions {
            for &w in &self.widths {
                for &depth in &self.depths {
                    let f = flops_per_sample(self.workload, w, depth, r);
                    if let Some((lo, hi)) = self.model_flops {
                        if f < lo || f > hi {
                            notes.push(format!(
                                "left out by --model-flops: width {w}, depth {depth} at {r}: {}FLOP per sample",
                                roofline_model::si(f)
                            ));
                            continue;
                        }
                    }
                    for &images in &self.images {
                        grid.push(GridPoint {
                            flops_per_sample: f,
                            width: w,
                            depth,
                            resolution: r,
                            images,
                        });
                    }
                }
            }
        }
        if grid.is_empty() {
            return Err(SweepError::NoVariant { left_out: notes });
        }
        grid.sort_by(|x, y| {
            (x.flops_per_sample * x.images as f64)
                .total_cmp(&(y.flops_per_sample * y.images as f64))
        });
        Ok((grid, notes))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The grid is sorted by problem size, the range filters variants with a note, and the
    /// FLOPs grow with the width.
    #[test]
    fn the_grid_is_sorted_and_filtered() {
        let r = Resolution { h: 32, w: 32 };
        let spec = GridSpec {
            workload: Kind::Resnet50,
            resolutions: vec![r],
            widths: vec![0.5, 0.25],
            depths: vec![Depth([1, 1, 1, 1])],
            images: vec![64, 16],
            model_flops: None,
        };
        let (g, notes) = spec.grid().unwrap();
        assert_eq!(g.len(), 4);
        assert!(notes.is_empty());
        let size: Vec<f64> = g
            .iter()
            .map(|p| p.flops_per_sample * p.images as f64)
            .collect();
        assert!(size.windows(2).all(|w| w[0] <= w[1]), "{size:?}");
        let small = flops_per_sample(Kind::Resnet50, 0.25, Depth([1, 1, 1, 1]), r);
        let large = flops_per_sample(Kind::Resnet50, 0.5, Depth([1, 1, 1, 1]), r);
        assert!(large > 2.0 * small);
        let only_small = GridSpec {
            model_flops: Some((0.0, (small + large) / 2.0)),
            ..spec.clone()
        };
        let (g, notes) = only_small.grid().unwrap();
        assert!(g.iter().all(|p| p.width == 0.25));
        assert_eq!(notes.len(), 1);
        let none = GridSpec {
            model_flops: Some((0.0, 1.0)),
            ..spec
        };
        assert!(matches!(
            none.grid(),
            Err(SweepError::NoVariant { left_out }) if left_out.len() == 2
        ));
        assert_eq!("1e8..5e9".parse(), Ok(FlopsRange(1e8, 5e9)));
        assert!("5..1".parse::<FlopsRange>().is_err());
        assert!("5".parse::<FlopsRange>().is_err());
    }

    fn spec() -> SweepSpec {
        SweepSpec {
            workload: Kind::Resnet50,
            resolutions: vec![Resolution { h: 32, w: 32 }],
            widths: vec![],
            depths: vec![],
            images: vec![6400],
            model_flops: None,
            threads: vec![1],
            ranks: vec![],
            batch: 10,
            per_process_batch: false,
            steps: 1,
            data_shares: vec![],
        }
    }

    /// SAIH's data scaling: one whole set, its shares 1/64 … 1/1 as the images, smallest
    /// first; a share the set cannot give, or shares of several sets, is refused.
    #[test]
    fn data_shares_divide_the_whole_set() {
        let s = SweepSpec {
            data_shares: vec![1, 2, 4, 8, 16, 32, 64],
            ..spec()
        };
        let images: Vec<usize> = s.plan().unwrap().grid.iter().map(|g| g.images).collect();
        assert_eq!(images, vec![100, 200, 400, 800, 1600, 3200, 6400]);
        let too_fine = SweepSpec {
            data_shares: vec![10000],
            ..spec()
        };
        assert!(matches!(
            too_fine.plan(),
            Err(SweepError::Share { share: 10000, .. })
        ));
        let two = SweepSpec {
            images: vec![64, 128],
            data_shares: vec![2],
            ..spec()
        };
        assert_eq!(two.plan().unwrap_err(), SweepError::SharesOfOne(2));
    }

    /// SAIH's node scaling holds each process's batch (10 on 1, 2, 4 ranks: 10, 20, 40), and
    /// then needs no global batch that divides; one global batch must divide.
    #[test]
    fn per_process_batch_grows_the_global_batch() {
        let ranks = SweepSpec {
            threads: vec![],
            ranks: vec![1, 2, 4],
            ..spec()
        };
        assert!(matches!(
            ranks.plan(),
            Err(SweepError::Batch { ranks: 4, .. })
        ));
        let held = SweepSpec {
            per_process_batch: true,
            ..ranks
        };
        let plan = held.plan().unwrap();
        let global: Vec<usize> = plan.counts.iter().map(|&p| plan.global_batch(p)).collect();
        assert_eq!(global, vec![10, 20, 40]);
        assert_eq!(spec().plan().unwrap().global_batch(4), 10);
    }
}
