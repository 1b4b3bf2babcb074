//! HPC AI500 V3.0 bagging in `score.json`: M base models of the same network, each trained on
//! its own bootstrap sample of the training set with data parallelism P, on `Sys_scale = M × P`
//! processes, without synchronisation between the models; the ensemble predicts by averaging.
//!
//! - Bagged APC (the amount of parallel computation in an iteration, V3.0 eq. 4): the sum over
//!   the M models and each model's batch of every sample's analytic training FLOPs (V3.0 table
//!   3): `APC = M × |B| × FLOPs per sample` for models of one network and batch.
//! - FLOPS (eq. 6): `Σ over the N/|B| iterations of an epoch of APC / T_epoch`, T_epoch the time of
//!   one epoch of the ensemble (its models run side by side: the slowest sets it).
//! - VFLOPS (eqs. 7–8): `FLOPS × (ensemble quality / target)^n`.

use crate::score::Summary;
use serde::{Deserialize, Serialize};

/// Bagged APC (V3.0 eq. 4) of `models` models of batch `batch`, `flops_per_sample` each.
pub fn bagged_apc(models: usize, batch: usize, flops_per_sample: f64) -> f64 {
    models as f64 * batch as f64 * flops_per_sample
}

/// FLOPS (V3.0 eq. 6): `iterations` iterations of an epoch, each of `apc` FLOPs, in `t_epoch`
/// seconds.
pub fn epoch_flops(apc: f64, iterations: f64, t_epoch: f64) -> f64 {
    iterations * apc / t_epoch.max(1e-300)
}

/// How T_epoch is had: measured (V3.0 eq. 6: the time of an epoch, first step, evaluations and
/// stalls included: the slowest model's training time per epoch of images it trained), or
/// projected from the steady steps (the slowest model's mean step × N / |B|: none of those).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EpochTime {
    #[default]
    Measured,
    Projected,
}

impl EpochTime {
    /// What T_epoch is, in words (the rules' line and the report).
    pub fn describe(self) -> &'static str {
        match self {
            EpochTime::Measured => "T_epoch measured: the slowest model's training time per epoch of the images it trained, first step, evaluations and stalls included (V3.0 eq. 6)",
            EpochTime::Projected => "T_epoch projected (--epoch-time projected): the slowest model's mean steady step × N / |B|, without the first step, evaluations or stalls",
        }
    }
}

/// One base model of a bagged run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Member {
    /// 1-based.
    pub model: usize,
    /// The seed of its initialisation and data order.
    pub seed: u64,
    /// The seed its bootstrap sample was drawn from.
    pub sample_seed: u64,
    /// Images in its sample (the training set's size: drawn with replacement) and how many of
    /// them are distinct (about 63.2% of them).
    pub sample_images: usize,
    pub distinct_images: usize,
    /// Its own quality on the held-out images (Top-1 or mAP@0.5).
    pub quality: f64,
    /// Seconds per training step (steady steps, the mean).
    pub step_seconds: f64,
    /// Training seconds.
    pub train_seconds: f64,
    /// Images it trained in them (0 in files written before it was kept).
    #[serde(default)]
    pub trained_images: usize,
    /// As a single model: its FLOPS (its batch's FLOPs by the same rule / its seconds per
    /// step) and VFLOPS with its own quality.
    pub flops: f64,
    pub vflops: f64,
}

/// One run's bagging: its M, P, members, and V3.0's figures.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaggedRun {
    /// M.
    pub models: usize,
    /// P (`P_degree`).
    pub ranks_per_model: usize,
    /// M × P.
    pub sys_scale: usize,
    pub members: Vec<Member>,
    /// FLOPs of one sample's training step: the paper's published count for its model (23 G
    /// for ResNet-50, as V3.0's APC example counts), else roofline's by V3.0 table 3's rules.
    pub flops_per_sample: f64,
    /// roofline's analytic count by V3.0 table 3's rules, where `flops_per_sample` is the
    /// published one (the report shows both).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytic_flops_per_sample: Option<f64>,
    /// The batch of each model.
    pub batch: usize,
    /// Bagged APC per iteration (eq. 4).
    pub apc_flops: f64,
    /// N / |B|: iterations of one epoch.
    pub iterations_per_epoch: f64,
    /// T_epoch ([`EpochTime`]).
    pub epoch_seconds: f64,
    /// How T_epoch was had.
    #[serde(default)]
    pub epoch_time: EpochTime,
    /// How the models' predictions are combined.
    pub ensemble_rule: String,
    pub ensemble_quality: f64,
    /// Σ APC / T_epoch (eq. 6) and VFLOPS with the ensemble's quality (eqs. 7–8).
    pub flops: f64,
    pub vflops: f64,
}

impl BaggedRun {
    /// V3.0's figures of `members` (each with `batch` per iteration) over an epoch of
    /// `train_images`, the ensemble's quality against `target` with exponent `n`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        members: Vec<Member>,
        ranks_per_model: usize,
        batch: usize,
        flops_per_sample: f64,
        train_images: usize,
        ensemble_rule: &str,
        ensemble_quality: f64,
        (target, n): (f64, i32),
        epoch_time: EpochTime,
    ) -> BaggedRun {
        let models = members.len();
        let apc = bagged_apc(models, batch, flops_per_sample);
        let iterations = train_images as f64 / batch.max(1) as f64;
        let slowest = members.iter().map(|m| m.step_seconds).fold(0.0, f64::max);
        // Measured where every model says what it trained; else the projection, and it says so.
        let measured = members
            .iter()
            .map(|m| {
                (m.trained_images > 0)
                    .then(|| m.train_seconds * train_images as f64 / m.trained_images as f64)
            })
            .collect::<Option<Vec<f64>>>()
            .filter(|_| epoch_time == EpochTime::Measured && !members.is_empty());
        let (epoch_seconds, epoch_time) = match measured {
            Some(t) => (t.into_iter().fold(0.0, f64::max), EpochTime::Measured),
            None => (slowest * iterations, EpochTime::Projected),
        };
        let flops = epoch_flops(apc, iterations, epoch_seconds);
        BaggedRun {
            models,
            ranks_per_model,
            sys_scale: models * ranks_per_model,
            members,
            flops_per_sample,
            analytic_flops_per_sample: None,
            batch,
            apc_flops: apc,
            iterations_per_epoch: iterations,
            epoch_seconds,
            epoch_time,
            ensemble_rule: ensemble_rule.to_string(),
            ensemble_quality,
            flops,
            vflops: crate::score::vflops(flops, ensemble_quality, target, n),
        }
    }

    /// The mean quality of the members.
    pub fn mean_member_quality(&self) -> f64 {
        self.members.iter().map(|m| m.quality).sum::<f64>() / self.members.len().max(1) as f64
    }
}

/// Bagging over the runs of a score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BaggingScores {
    pub models: usize,
    pub ranks_per_model: usize,
    pub sys_scale: usize,
    pub apc_flops: f64,
    /// The FLOPs a sample counts, and roofline's analytic count beside a published one
    /// ([`BaggedRun`]'s).
    #[serde(default)]
    pub flops_per_sample: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub analytic_flops_per_sample: Option<f64>,
    pub epoch_seconds: Summary,
    pub ensemble_quality: Summary,
    /// Each run's mean member quality.
    pub member_quality: Summary,
    /// The first model of each run as a single-model score, beside the ensemble's.
    pub single_model_flops: Summary,
    pub single_model_vflops: Summary,
}

impl BaggingScores {
    /// None when no run was bagged. The means are over the runs `keep` marks (the score's
    /// averaged runs, [`crate::score::averaged_runs`]).
    pub fn of(runs: &[&BaggedRun], keep: &[bool]) -> Option<BaggingScores> {
        let first = runs.first()?;
        let f = |g: &dyn Fn(&BaggedRun) -> f64| -> Option<Summary> {
            Summary::over(&runs.iter().map(|r| g(r)).collect::<Vec<_>>(), keep)
        };
        Some(BaggingScores {
            models: first.models,
            ranks_per_model: first.ranks_per_model,
            sys_scale: first.sys_scale,
            apc_flops: first.apc_flops,
            flops_per_sample: first.flops_per_sample,
            analytic_flops_per_sample: first.analytic_flops_per_sample,
            epoch_seconds: f(&|r| r.epoch_seconds)?,
            ensemble_quality: f(&|r| r.ensemble_quality)?,
            member_quality: f(&|r| r.mean_member_quality())?,
            single_model_flops: f(&|r| r.members.first().map_or(0.0, |m| m.flops))?,
            single_model_vflops: f(&|r| r.members.first().map_or(0.0, |m| m.vflops))?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(model: usize, quality: f64, step_seconds: f64) -> Member {
        Member {
            model,
            seed: model as u64,
            sample_seed: 100 + model as u64,
            sample_images: 1000,
            distinct_images: 632,
            quality,
            step_seconds,
            train_seconds: step_seconds * 10.0,
            trained_images: 0,
            flops: 1.0,
            vflops: 1.0,
        }
    }

    /// V3.0's example: ResNet-50 at |B| = 512 is 11 776 GFLOPs per iteration (23 GFLOPs per
    /// image); bagging 4 models makes it 4× that. With ImageNet's 1 281 167 images an epoch is
    /// 2 502.28 iterations; at 0.5 s per step (the slowest model) T_epoch = 1 251.14 s and
    /// FLOPS = 2 502.28 × 47 104 GFLOPs / 1 251.14 s = 94.208 TFLOP/s (= 4 × 512 × 23 G / 0.5 s).
    #[test]
    fn the_equations_by_hand() {
        let apc = bagged_apc(4, 512, 23e9);
        assert_eq!(apc, 47_104e9);
        assert_eq!(bagged_apc(1, 512, 23e9), 11_776e9);
        let members = vec![
            member(1, 0.70, 0.4),
            member(2, 0.72, 0.5),
            member(3, 0.71, 0.45),
            member(4, 0.69, 0.5),
        ];
        // V3.0's example's run of `members`: M = 4, P = 2, |B| = 512, ImageNet, 0.74.
        let bag = |members| {
            BaggedRun::new(
                members,
                2,
                512,
                23e9,
                1_281_167,
                "mean",
                0.74,
                (0.763, 5),
                EpochTime::Measured,
            )
        };
        let r = bag(members.clone());
        // No model said what it trained: projected, and named so.
        assert_eq!(r.epoch_time, EpochTime::Projected);
        assert_eq!((r.models, r.ranks_per_model, r.sys_scale), (4, 2, 8));
        assert!((r.iterations_per_epoch - 2_502.279_296_875).abs() < 1e-9);
        assert!((r.epoch_seconds - 1_251.139_648_437_5).abs() < 1e-9);
        assert!((r.flops / 1e12 - 94.208).abs() < 1e-9, "{}", r.flops);
        // VFLOPS with the ensemble's 0.74 against 0.763, n = 5: × 0.858 096.
        let k = (0.74f64 / 0.763).powi(5);
        assert!((r.vflops / r.flops - k).abs() < 1e-12);
        assert!((k - 0.858_096).abs() < 1e-6);
        assert!((r.mean_member_quality() - 0.705).abs() < 1e-12);
        let s = BaggingScores::of(&[&r, &r], &[true, true]).unwrap();
        assert_eq!(s.sys_scale, 8);
        assert_eq!(s.ensemble_quality.mean, 0.74);
        assert!(BaggingScores::of(&[], &[]).is_none());
        // Measured: the slowest model's training time per epoch of images, its first step
        // and stalls in it. Model 2 trained 5 120 images in 6 s: T_epoch = 6 × 1 281 167 /
        // 5 120 = 1 501.37 s, where its steady steps project 1 251.14 s.
        let mut timed = members;
        for m in &mut timed {
            m.trained_images = 5120;
        }
        timed[1].train_seconds = 6.0;
        let r = bag(timed);
        assert_eq!(r.epoch_time, EpochTime::Measured);
        assert!((r.epoch_seconds - 6.0 * 1_281_167.0 / 5120.0).abs() < 1e-9);
        assert!(
            (r.flops - epoch_flops(47_104e9, r.iterations_per_epoch, r.epoch_seconds)).abs() < 1.0
        );
    }
}
