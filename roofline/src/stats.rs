//! Statistics of a set of samples: every figure roofline writes carries them.

use serde::{Deserialize, Serialize};

/// The statistics of one measured figure: how many samples, their spread, and the samples
/// themselves (kept so that `roofline gate` can decide from the samples, not from one number).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Number of samples.
    pub samples: usize,
    pub min: f64,
    pub median: f64,
    pub max: f64,
    pub mean: f64,
    /// Coefficient of variation: standard deviation / mean (0 for one sample).
    pub cv: f64,
    /// The samples, in the order they were taken.
    pub values: Vec<f64>,
}

impl Stats {
    /// Statistics of `values`. Returns `None` for an empty set or one holding a non-finite value.
    pub fn from_samples(values: &[f64]) -> Option<Stats> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(|a, b| a.total_cmp(b));
        let n = sorted.len();
        let median = if n % 2 == 1 {
            sorted[n / 2]
        } else {
            0.5 * (sorted[n / 2 - 1] + sorted[n / 2])
        };
        let mean = sorted.iter().sum::<f64>() / n as f64;
        let cv = if n > 1 && mean != 0.0 {
            let var = sorted.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64;
            var.sqrt() / mean.abs()
        } else {
            0.0
        };
        Some(Stats {
            samples: n,
            min: sorted[0],
            median,
            max: sorted[n - 1],
            mean,
            cv,
            values: values.to_vec(),
        })
    }

    /// The same statistics with every value multiplied by `k` (k > 0), e.g. seconds → rate.
    pub fn scaled(&self, k: f64) -> Stats {
        let values: Vec<f64> = self.values.iter().map(|v| v * k).collect();
        Stats::from_samples(&values).unwrap_or_else(|| self.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn odd_and_even_medians() {
        let s = Stats::from_samples(&[3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.min, s.median, s.max, s.samples), (1.0, 2.0, 3.0, 3));
        let s = Stats::from_samples(&[4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!(s.median, 2.5);
        assert_eq!(s.values, vec![4.0, 1.0, 2.0, 3.0]);
    }

    #[test]
    fn coefficient_of_variation() {
        // mean 5, sample standard deviation sqrt(((−3)²+(−1)²+1²+3²)/3) = sqrt(20/3)
        let s = Stats::from_samples(&[2.0, 4.0, 6.0, 8.0]).unwrap();
        assert!((s.cv - (20.0f64 / 3.0).sqrt() / 5.0).abs() < 1e-12);
        assert_eq!(Stats::from_samples(&[7.0]).unwrap().cv, 0.0);
    }

    #[test]
    fn rejects_empty_and_non_finite() {
        assert!(Stats::from_samples(&[]).is_none());
        assert!(Stats::from_samples(&[1.0, f64::NAN]).is_none());
    }

    #[test]
    fn scaling_keeps_shape() {
        let s = Stats::from_samples(&[1.0, 2.0, 4.0]).unwrap().scaled(10.0);
        assert_eq!((s.min, s.median, s.max), (10.0, 20.0, 40.0));
    }
}
