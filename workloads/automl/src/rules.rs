//! AIPerf's per-trial rules, as its reference code applies them on each worker
//! (`examples/trials/network_morphism/imagenet/imagenet_train.py` and `utils.py` of
//! `AI-HPC-Research-Team/AIPerf`, the TensorFlow version):
//!
//! - **patience** `min(6 + 2·round, 20)` epochs (round: the trial's sequence number over the
//!   number of workers), counted by Keras's `EarlyStopping` on the validation loss with
//!   `min_delta` 0.001;
//! - **predicted accuracy** for trials of 10 to 79 epochs: the curve `a·log₂(x + b) + c` fitted
//!   to the validation accuracies and an anchor point (120, 0.75), read at epoch 90, less twice
//!   the fit's RMSE; when that falls below the trial's highest accuracy or above 1, that highest
//!   accuracy instead (`max(acc_y[:-1])`: the anchor, appended last, left out);
//! - **one more training per trial from round 4** (sequence number ≥ 3 × workers), with a TPE
//!   draw over the kernel size, the batch and the dropout rate. Each trial makes its own tuner,
//!   which has seen one result when it draws; hyperopt's TPE draws from the prior until it has
//!   seen 20, so the draw is the prior's: a kernel from the choices, a batch uniform in the
//!   range (rounded down to a multiple of 16 from 16 up) and a dropout rate in [0, 0.2].

use crate::curve;
use roofline_workloads::data::Rng;
use serde::{Deserialize, Serialize};

/// Keras's `EarlyStopping(min_delta=…)`: an epoch improves on the best loss by more than this.
pub const MIN_DELTA: f64 = 0.001;
/// The anchor the accuracy curve is fitted through, (epoch, top-1).
pub const ANCHOR: (f64, f64) = (120.0, 0.75);
/// The epoch the prediction is read at.
pub const PREDICT_AT: f64 = 90.0;
/// Trials of this many epochs (planned) are predicted: `10 ≤ epochs < 80`.
pub const PREDICTED: std::ops::Range<usize> = 10..80;
/// The round (0-based) from which every trial trains once more with a TPE draw.
pub const TUNED_FROM_ROUND: usize = 3;
/// hyperopt's TPE draws from the prior until it has seen this many results.
pub const TPE_STARTUP: usize = 20;

/// The patience of a trial in round `round` (0-based).
pub fn patience(round: usize) -> usize {
    (6 + 2 * round).min(20)
}

/// Keras's `EarlyStopping` on the validation loss.
#[derive(Clone, Debug)]
pub struct EarlyStopping {
    patience: usize,
    best: f64,
    wait: usize,
}

impl EarlyStopping {
    pub fn new(patience: usize) -> EarlyStopping {
        EarlyStopping {
            patience,
            best: f64::INFINITY,
            wait: 0,
        }
    }

    /// After an epoch whose validation loss is `loss`: whether training stops here. Keras
    /// negates `min_delta` for a quantity to minimise, so a loss improves when it is below the
    /// best by more than `MIN_DELTA`; one that is not a number never improves (the comparison
    /// is false).
    pub fn stop(&mut self, loss: f64) -> bool {
        if loss + MIN_DELTA < self.best {
            self.best = loss;
            self.wait = 0;
            return false;
        }
        self.wait += 1;
        self.wait >= self.patience
    }
}

/// AIPerf's predicted accuracy of a trial of `planned` epochs from its validation curve
/// `(epoch, top-1)`; `None` when the rule does not apply (planned epochs outside 10–79) or the
/// curve cannot be fitted (the reference's "Predict failed.").
pub fn predicted(planned: usize, curve: &[(f64, f64)]) -> Option<f64> {
    if !PREDICTED.contains(&planned) || curve.is_empty() {
        return None;
    }
    let mut points = curve.to_vec();
    points.push(ANCHOR);
    let fit = curve::fit(&points)?;
    let f = |x: f64| curve::at(&fit, x);
    let rmse =
        (points.iter().map(|p| (f(p.0) - p.1).powi(2)).sum::<f64>() / points.len() as f64).sqrt();
    let p = f(PREDICT_AT) - 2.0 * rmse;
    // The reference's `max(acc_y[:-1])`: its list with the anchor appended, less the last
    // element, i.e. the trial's own accuracies.
    let highest = curve.iter().map(|p| p.1).fold(f64::NEG_INFINITY, f64::max);
    Some(if p < highest || p > 1.0 { highest } else { p })
}

/// What the per-trial TPE draws from (the reference's `search_space.json`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Space {
    pub kernels: Vec<usize>,
    /// The batch's range, both ends included (the reference: 12 to 14 × the GPU's memory in
    /// GiB; on the CPU, the `--batches` given).
    pub batch: (usize, usize),
    /// The dropout rate's range (the reference: 0 to 0.2).
    pub dropout: (f64, f64),
}

/// One draw of the per-trial TPE.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Draw {
    pub kernel: usize,
    pub batch: usize,
    pub dropout: f64,
}

/// The per-trial tuner's draw after `seen` results: the prior's while `seen` is under
/// hyperopt's 20 (always, for one tuner a trial).
pub fn draw(space: &Space, seen: usize, rng: &mut Rng) -> Draw {
    debug_assert!(seen < TPE_STARTUP, "a trial's tuner sees one result");
    let kernel = space.kernels
        [(rng.unit() * space.kernels.len() as f64) as usize % space.kernels.len().max(1)];
    let (lo, hi) = (
        space.batch.0.min(space.batch.1),
        space.batch.0.max(space.batch.1),
    );
    let raw = lo as f64 + rng.unit() * (hi - lo) as f64;
    // The reference's (int(batch) // 16) * 16, which would make a batch under 16 zero.
    let batch = if raw >= 16.0 {
        raw as usize / 16 * 16
    } else {
        (raw as usize).max(1)
    };
    let dropout = space.dropout.0 + rng.unit() * (space.dropout.1 - space.dropout.0);
    Draw {
        kernel,
        batch,
        dropout,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The patience of AIPerf's rounds: 6, 8, 10, … up to 20.
    #[test]
    fn patience_grows_to_twenty() {
        let p: Vec<usize> = (0..10).map(patience).collect();
        assert_eq!(p, [6, 8, 10, 12, 14, 16, 18, 20, 20, 20]);
    }

    /// Keras's rule: a loss must beat the best by more than 0.001 to count; `patience`
    /// epochs without that stop training; a NaN never improves.
    #[test]
    fn early_stopping_follows_keras() {
        let mut e = EarlyStopping::new(2);
        assert!(!e.stop(1.0));
        assert!(!e.stop(0.9995), "better by less than min_delta: wait 1");
        assert!(e.stop(0.9991), "not below 1.0 − 0.001: wait 2, stop");
        let mut e = EarlyStopping::new(2);
        assert!(!e.stop(1.0));
        assert!(!e.stop(1.01), "worse: wait 1");
        assert!(!e.stop(0.998), "below 1.0 − 0.001: the wait starts again");
        assert!(!e.stop(0.998), "wait 1");
        let mut e = EarlyStopping::new(2);
        for l in [1.0, 0.99, 0.98, 0.97] {
            assert!(!e.stop(l), "each better by 0.01");
        }
        assert!(!e.stop(f64::NAN));
        assert!(e.stop(f64::NAN));
    }

    /// The prediction by hand: a curve that is the model itself (through the anchor) has no
    /// residual, so the prediction is the model at 90, below the anchor's 0.75 (the anchor is
    /// not a floor: the reference's `max(acc_y[:-1])` leaves it out); a curve whose prediction
    /// less twice its RMSE falls below its own best falls back to that best; 9 and 80 epochs
    /// are not predicted.
    #[test]
    fn predicted_accuracy_is_aiperf_s() {
        // a·log2(x + 1) + c through (120, 0.75): c = 0.75 − a·log2(121).
        let a = 0.08;
        let c = ANCHOR.1 - a * (ANCHOR.0 + 1.0).log2();
        let curve: Vec<(f64, f64)> = (1..=15)
            .map(|x| (x as f64, a * (x as f64 + 1.0).log2() + c))
            .collect();
        let want = a * 91f64.log2() + c;
        let got = predicted(15, &curve).unwrap();
        assert!(want < ANCHOR.1 && want > curve[14].1);
        assert!((got - want).abs() < 1e-9, "{got} {want}");
        // A jagged curve: the fit's RMSE takes the prediction below the trial's best, 0.7,
        // which is the result (not the anchor's 0.75).
        let jagged: Vec<(f64, f64)> = (1..=15)
            .map(|x| (x as f64, if x % 2 == 1 { 0.7 } else { 0.2 }))
            .collect();
        assert_eq!(predicted(15, &jagged), Some(0.7));
        // A curve that reaches above the anchor's accuracy at 90 epochs, exactly the model.
        let c2 = 0.95 - a * 121f64.log2();
        let high: Vec<(f64, f64)> = (1..=15)
            .map(|x| (x as f64, a * (x as f64 + 1.0).log2() + c2))
            .collect();
        let mut pts = high.clone();
        pts.push(ANCHOR);
        let fit = curve::fit(&pts).unwrap();
        let f = |x: f64| curve::at(&fit, x);
        let rmse = (pts.iter().map(|p| (f(p.0) - p.1).powi(2)).sum::<f64>() / 16.0).sqrt();
        let by_hand = f(90.0) - 2.0 * rmse;
        let got = predicted(15, &high).unwrap();
        let best = high.iter().map(|p| p.1).fold(0.0, f64::max);
        if (best..=1.0).contains(&by_hand) {
            assert!((got - by_hand).abs() < 1e-12, "{got} {by_hand}");
        } else {
            assert_eq!(got, best);
        }
        assert_eq!(predicted(9, &high), None);
        assert_eq!(predicted(80, &high), None);
        assert!(predicted(79, &high).is_some());
    }

    /// The draw stays in the space: kernels from the choices (each drawn), batches in range
    /// and multiples of 16 from 16 up, dropout in [0, 0.2].
    #[test]
    fn draws_come_from_the_prior() {
        let space = Space {
            kernels: vec![3, 5, 7],
            batch: (12 * 80, 14 * 80),
            dropout: (0.0, 0.2),
        };
        let mut rng = Rng::new(3);
        let mut kernels = std::collections::BTreeSet::new();
        for _ in 0..200 {
            let d = draw(&space, 1, &mut rng);
            kernels.insert(d.kernel);
            assert!(
                (960..=1120).contains(&d.batch) && d.batch.is_multiple_of(16),
                "{d:?}"
            );
            assert!((0.0..=0.2).contains(&d.dropout));
        }
        assert_eq!(kernels.len(), 3);
        let small = Space {
            kernels: vec![3],
            batch: (4, 8),
            dropout: (0.0, 0.2),
        };
        for _ in 0..50 {
            let d = draw(&small, 1, &mut rng);
            assert!((4..8).contains(&d.batch), "{d:?}");
        }
    }
}
