//! The grid of a SAIH sweep (`roofline sweep`): model variants (width × depth) at each
//! resolution and training-set size, each with its training FLOPs per sample by the trainer's
//! count, kept or left out by a FLOPs range, smallest problem first.

use super::setup::{Depth, Kind, Resolution};
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
    pub depths: Vec<String>,
    pub images: Vec<usize>,
    /// Keep the variants whose training FLOPs per sample lie in `[lo, hi]` (SAIH's filter).
    pub model_flops: Option<(f64, f64)>,
}

/// Training FLOPs per `r` sample of a `workload` variant (the trainer's count).
pub fn flops_per_sample(workload: Kind, width: f64, depth: Depth, r: Resolution) -> f64 {
    match workload {
        Kind::Ewa => DetectorConfig::scaled(width, depth.0, r.h, r.w)
            .flops(r.h, r.w)
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

/// Parses `--model-flops LO..HI`.
pub fn flops_range(s: &str) -> Result<(f64, f64), String> {
    let (a, b) = s
        .split_once("..")
        .ok_or_else(|| format!("--model-flops {s}: expected LO..HI, e.g. 1e8..5e9"))?;
    let num = |x: &str| {
        x.trim()
            .parse::<f64>()
            .map_err(|_| format!("--model-flops {s}: {x:?} is not a number"))
    };
    let (lo, hi) = (num(a)?, num(b)?);
    if !(lo >= 0.0 && hi > lo) {
        return Err(format!("--model-flops {s}: expected 0 <= LO < HI"));
    }
    Ok((lo, hi))
}

impl GridSpec {
    /// The grid, smallest problem (FLOPs per sample × images) first, and a note for each
    /// variant the FLOPs range left out; no variant left is an error naming them.
    pub fn grid(&self) -> Result<(Vec<GridPoint>, Vec<String>), String> {
        let mut notes = Vec::new();
        let mut grid = Vec::new();
        for &r in &self.resolutions {
            for &w in &self.widths {
                for d in &self.depths {
                    let depth = d.parse::<Depth>().map_err(|e| format!("--depth {e}"))?;
                    let f = flops_per_sample(self.workload, w, depth, r);
                    if let Some((lo, hi)) = self.model_flops {
                        if f < lo || f > hi {
                            notes.push(format!(
                                "left out by --model-flops: width {w}, depth {d} at {r}: {}FLOP per sample",
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
            return Err(format!(
                "no model variant's training FLOPs per sample lie in --model-flops: {}",
                notes.join("; ")
            ));
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
            depths: vec!["1,1,1,1".into()],
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
        assert!(none.grid().unwrap_err().contains("no model variant"));
        assert_eq!(flops_range("1e8..5e9"), Ok((1e8, 5e9)));
        assert!(flops_range("5..1").is_err());
    }
}
