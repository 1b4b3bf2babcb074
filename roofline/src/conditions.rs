//! What each sample of a ceiling was taken under (nvbench's rule: clocks and throttling are
//! recorded with every sample, and a sample taken under throttling is not a measurement of the
//! machine at its best). A CPU sample carries the core clock measured right before and right
//! after it; a GPU sample the SM clock, the power and the throttle (clock event) reasons NVML
//! reported at its end. A sample at a clock below the ceiling's measured clock by more than the
//! drift, or one taken while the GPU was throttled, stays in the ceiling's `stats` (nothing is
//! hidden) but is marked and left out of its value; a ceiling with too few clean samples is
//! flagged.
//!
//! A GPU running into its power limit is not disturbed: a sustained GEMM on a 700 W SXM part is
//! power-capped by design, and the cap is its operating point. A sample whose only reason is
//! the power cap ([`POWER_CAP`]) is kept, marked `capped`; the ceiling's value is then the
//! best capped sample (the sustained figure), and the best sample before the cap is its burst
//! figure ([`SampleConditions::burst`], [`SampleConditions::sustained`]). Only other reasons
//! (another process, heat, a hardware brake) leave a sample out.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The least drift allowed below the reference clock, before the readings' own noise is added.
pub const MIN_DRIFT: f64 = 0.03;

/// The noise of a set of clock readings, a fraction: three robust standard deviations (1.4826
/// median absolute deviations) over their median. The short readings around each sample move
/// by a few percent on a machine whose clock does not (an SMT sibling's work slows the add
/// chain; seen here: ±4% on a 2-vCPU VM whose samples ran within 1% of each other); being
/// robust, it does not grow when fewer than half the samples are slow.
pub fn reading_noise(readings: &[f64]) -> f64 {
    let Some(median) = crate::fleet::median(readings) else {
        return 0.0;
    };
    let deviations: Vec<f64> = readings.iter().map(|r| (r - median).abs()).collect();
    match crate::fleet::median(&deviations) {
        Some(mad) if median > 0.0 => 3.0 * 1.4826 * mad / median,
        _ => 0.0,
    }
}

/// The throttle reasons that are not a throttle: an idle GPU between samples, or none.
const NOT_THROTTLED: [&str; 2] = ["GPU_IDLE", "NONE"];

/// The reason a GPU gives when it holds its clock to its power limit: an operating point, not
/// a disturbance.
pub const POWER_CAP: &str = "SW_POWER_CAP";

/// A ceiling's power-capped steady state: its best capped sample, how many samples ran under
/// the cap, and their median power and SM clock.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sustained {
    pub value: f64,
    pub samples: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_w: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sm_clock_mhz: Option<f64>,
}

/// The conditions of every sample of one ceiling, in the order of its `stats.values`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleConditions {
    /// CPU: the core clock measured around each sample (the slowest thread's reading right
    /// before and right after it, the higher of the two: a clock low at both ends), Hz.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clock_hz: Vec<f64>,
    /// GPU: NVML's SM clock at the end of each sample, MHz (absent where NVML is not).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sm_clock_mhz: Vec<Option<f64>>,
    /// GPU: NVML's power draw at the end of each sample, W.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub power_w: Vec<Option<f64>>,
    /// GPU: NVML's throttle reasons at the end of each sample (idle left out).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub throttle: Vec<Vec<String>>,
    /// CPU: the clock the samples are held to (the ceiling's own measured clock, or the median
    /// of the readings where lower), Hz.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_clock_hz: Option<f64>,
    /// CPU: how far below the reference a sample's clock may be: the clock's measured drift
    /// (at least [`MIN_DRIFT`]) plus the noise of the samples' readings ([`reading_noise`]), a
    /// fraction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drift: Option<f64>,
    /// The samples left out of the ceiling's value, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<LeftOut>,
    /// Samples the value was taken from.
    pub clean: usize,
    /// GPU: the clean samples taken under the power cap alone ([`POWER_CAP`]), by index.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub capped: Vec<usize>,
    /// Fewer clean samples than [`SampleConditions::enough`] asks: the value stands on too
    /// little (or, with none clean, on samples that were all marked) and is flagged.
    pub too_few_clean: bool,
}

/// One sample left out of the ceiling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LeftOut {
    /// Its index in `stats.values`.
    pub sample: usize,
    pub why: Why,
}

/// Why a sample was left out.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Why {
    /// Its clock was below the reference by more than the drift.
    LowClock { clock_hz: f64, reference_hz: f64 },
    /// NVML reported throttle reasons during it.
    Throttled { reasons: Vec<String> },
}

impl fmt::Display for Why {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Why::LowClock {
                clock_hz,
                reference_hz,
            } => write!(
                f,
                "clock {:.2} GHz, {:.1}% below the ceiling's {:.2} GHz",
                clock_hz / 1e9,
                100.0 * (1.0 - clock_hz / reference_hz),
                reference_hz / 1e9
            ),
            Why::Throttled { reasons } => write!(f, "throttled ({})", reasons.join(", ")),
        }
    }
}

impl SampleConditions {
    /// Whether `clean` of `samples` samples are enough to stand on: at least half of them, and
    /// at least three where three or more were taken.
    pub fn enough(clean: usize, samples: usize) -> bool {
        clean * 2 >= samples && clean >= samples.min(3)
    }

    /// CPU samples with clocks `clock_hz` held to `ceiling_hz`, the ceiling's own measured
    /// clock, or to the median of the readings where that is lower (the short readings run low
    /// when an SMT sibling or a spinning pool thread shares the core: a bias of the reading,
    /// not a slower clock; a ceiling slow as a whole is told by its own clock measurement and
    /// the fleet's): a sample more than `drift` (at least [`MIN_DRIFT`]) plus the readings'
    /// noise below it is left out.
    pub fn cpu(clock_hz: Vec<f64>, ceiling_hz: f64, drift: f64) -> SampleConditions {
        let reference_hz =
            crate::fleet::median(&clock_hz).map_or(ceiling_hz, |m| m.min(ceiling_hz));
        let drift = if drift.is_finite() {
            drift.max(MIN_DRIFT)
        } else {
            MIN_DRIFT
        } + reading_noise(&clock_hz);
        let left_out: Vec<LeftOut> = clock_hz
            .iter()
            .enumerate()
            .filter(|(_, c)| **c < reference_hz * (1.0 - drift))
            .map(|(i, c)| LeftOut {
                sample: i,
                why: Why::LowClock {
                    clock_hz: *c,
                    reference_hz,
                },
            })
            .collect();
        let clean = clock_hz.len() - left_out.len();
        SampleConditions {
            too_few_clean: !Self::enough(clean, clock_hz.len()),
            clock_hz,
            sm_clock_mhz: Vec::new(),
            power_w: Vec::new(),
            throttle: Vec::new(),
            reference_clock_hz: Some(reference_hz),
            drift: Some(drift),
            left_out,
            clean,
            capped: Vec::new(),
        }
    }

    /// GPU samples with NVML's readings at the end of each: a sample with a throttle reason
    /// (idle and none aside) is left out, but for the power cap alone, which is kept and marked
    /// `capped`.
    pub fn gpu(
        sm_clock_mhz: Vec<Option<f64>>,
        power_w: Vec<Option<f64>>,
        throttle: Vec<Vec<String>>,
    ) -> SampleConditions {
        let throttle: Vec<Vec<String>> = throttle
            .into_iter()
            .map(|r| {
                r.into_iter()
                    .filter(|x| !NOT_THROTTLED.iter().any(|n| x.eq_ignore_ascii_case(n)))
                    .collect()
            })
            .collect();
        let only_cap = |r: &[String]| r.iter().all(|x| x.eq_ignore_ascii_case(POWER_CAP));
        let left_out: Vec<LeftOut> = throttle
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty() && !only_cap(r))
            .map(|(i, r)| LeftOut {
                sample: i,
                why: Why::Throttled { reasons: r.clone() },
            })
            .collect();
        let capped: Vec<usize> = throttle
            .iter()
            .enumerate()
            .filter(|(_, r)| !r.is_empty() && only_cap(r))
            .map(|(i, _)| i)
            .collect();
        let n = throttle.len();
        let clean = n - left_out.len();
        SampleConditions {
            capped,
            too_few_clean: !Self::enough(clean, n),
            clock_hz: Vec::new(),
            sm_clock_mhz,
            power_w,
            throttle,
            reference_clock_hz: None,
            drift: None,
            left_out,
            clean,
        }
    }

    /// Samples described (the length of whichever per-sample list is there).
    pub fn samples(&self) -> usize {
        self.clock_hz.len().max(self.throttle.len())
    }

    /// Whether sample `i` counts towards the value.
    pub fn is_clean(&self, i: usize) -> bool {
        !self.left_out.iter().any(|l| l.sample == i)
    }

    /// The samples of `values` that count (all of them when none is clean: the value must come
    /// from somewhere, and `too_few_clean` says it is weak).
    pub fn clean_values(&self, values: &[f64]) -> Vec<f64> {
        let clean: Vec<f64> = values
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_clean(*i))
            .map(|(_, v)| *v)
            .collect();
        if clean.is_empty() {
            values.to_vec()
        } else {
            clean
        }
    }

    /// The best of `values` that count (the smallest where `lower_is_better`, as a time; the
    /// largest otherwise), or `None` where these conditions do not describe `values` (see
    /// [`Self::inconsistency`]) or no value is finite. A ceiling's value and its sweep's table
    /// row both come from here, so the ceiling is always one of its table's rows.
    pub fn best(&self, values: &[f64], lower_is_better: bool) -> Option<f64> {
        if self.inconsistency(values.len()).is_some() {
            return None;
        }
        // Under the power cap the ceiling is its sustained figure.
        let capped: Vec<f64> = self
            .capped
            .iter()
            .filter_map(|&i| values.get(i).copied())
            .collect();
        let clean = if capped.is_empty() {
            self.clean_values(values)
        } else {
            capped
        };
        let best = if lower_is_better {
            clean.iter().copied().fold(f64::INFINITY, f64::min)
        } else {
            clean.iter().copied().fold(f64::NEG_INFINITY, f64::max)
        };
        best.is_finite().then_some(best)
    }

    /// The value of a rate (higher is better) sampled as `stats` under `conditions`: the best
    /// clean sample, or the best sample where there are no conditions or they do not fit.
    pub fn best_rate(conditions: Option<&SampleConditions>, stats: &crate::stats::Stats) -> f64 {
        conditions
            .and_then(|c| c.best(&stats.values, false))
            .unwrap_or(stats.max)
    }

    /// The best clean sample taken before the power cap (a rate: higher is better), where
    /// some samples ran under it; `None` when none did, or none ran before it.
    pub fn burst(&self, values: &[f64]) -> Option<f64> {
        if self.capped.is_empty() || self.inconsistency(values.len()).is_some() {
            return None;
        }
        values
            .iter()
            .enumerate()
            .filter(|(i, _)| self.is_clean(*i) && !self.capped.contains(i))
            .map(|(_, v)| *v)
            .filter(|v| v.is_finite())
            .reduce(f64::max)
    }

    /// The power-capped steady state of `values` (rates), where samples ran under the cap.
    pub fn sustained(&self, values: &[f64]) -> Option<Sustained> {
        if self.capped.is_empty() || self.inconsistency(values.len()).is_some() {
            return None;
        }
        let median = |v: &[Option<f64>]| {
            let got: Vec<f64> = self
                .capped
                .iter()
                .filter_map(|&i| v.get(i).copied().flatten())
                .collect();
            crate::fleet::median(&got)
        };
        Some(Sustained {
            value: self.best(values, false)?,
            samples: self.capped.len(),
            power_w: median(&self.power_w),
            sm_clock_mhz: median(&self.sm_clock_mhz),
        })
    }

    /// One line for the table: how many were left out and why (the first reason), and the
    /// flag; `None` when every sample was clean.
    pub fn summary(&self) -> Option<String> {
        if self.left_out.is_empty() && !self.too_few_clean {
            return None;
        }
        let mut s = format!(
            "{} of {} samples left out",
            self.left_out.len(),
            self.samples()
        );
        if let Some(first) = self.left_out.first() {
            s.push_str(&format!(" (e.g. sample {}: {})", first.sample, first.why));
        }
        if self.too_few_clean {
            s.push_str(&format!("; only {} clean: too few to stand on", self.clean));
        }
        Some(s)
    }

    /// What is wrong with these conditions for a ceiling of `samples` samples (for the
    /// readers), or `None`.
    pub fn inconsistency(&self, samples: usize) -> Option<String> {
        let lists = [
            ("clock_hz", self.clock_hz.len()),
            ("sm_clock_mhz", self.sm_clock_mhz.len()),
            ("power_w", self.power_w.len()),
            ("throttle", self.throttle.len()),
        ];
        if let Some((name, n)) = lists.iter().find(|(_, n)| *n != 0 && *n != samples) {
            return Some(format!("{name} has {n} entries for {samples} samples"));
        }
        if let Some(c) = self.clock_hz.iter().find(|c| !(c.is_finite() && **c > 0.0)) {
            return Some(format!("clock_hz holds {c}: not a positive clock"));
        }
        if let Some(l) = self.left_out.iter().find(|l| l.sample >= samples) {
            return Some(format!("left_out names sample {} of {samples}", l.sample));
        }
        if let Some(i) = self
            .capped
            .iter()
            .find(|&&i| i >= samples || !self.is_clean(i))
        {
            return Some(format!(
                "capped names sample {i}, not a clean one of {samples}"
            ));
        }
        if self.clean + self.left_out.len() != samples {
            return Some(format!(
                "clean {} + left out {} is not the {samples} samples",
                self.clean,
                self.left_out.len()
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cpu_sample_below_the_reference_by_more_than_the_drift_is_left_out() {
        let c = SampleConditions::cpu(vec![3.0e9, 2.95e9, 2.5e9, 3.01e9], 3.0e9, 0.01);
        // The floor, plus three robust deviations of the readings (median 2.975 GHz, MAD
        // 0.03 GHz).
        let noise = 3.0 * 1.4826 * 0.03 / 2.975;
        assert!(
            (c.drift.unwrap() - (MIN_DRIFT + noise)).abs() < 1e-12,
            "{:?}",
            c.drift
        );
        assert_eq!(c.left_out.len(), 1);
        assert_eq!(c.left_out[0].sample, 2);
        assert_eq!(c.clean, 3);
        assert!(!c.too_few_clean);
        assert_eq!(
            c.clean_values(&[10.0, 9.0, 20.0, 11.0]),
            vec![10.0, 9.0, 11.0]
        );
        assert_eq!(
            c.reference_clock_hz,
            Some(2.975e9),
            "the readings' median, below 3 GHz"
        );
        let s = c.summary().unwrap();
        assert!(s.contains("1 of 4 samples left out"), "{s}");
        assert!(s.contains("16.0% below"), "{s}");
        assert_eq!(c.inconsistency(4), None);
        assert!(c.inconsistency(5).is_some());
        // The best clean sample, not the best sample (the left-out one is the fastest here):
        // for rates and for times, and for a sweep's row as for its ceiling.
        let rates = crate::stats::Stats::from_samples(&[10.0, 9.0, 20.0, 11.0]).unwrap();
        assert_eq!(c.best(&rates.values, false), Some(11.0));
        assert_eq!(c.best(&[1.0, 0.9, 0.5, 1.1], true), Some(0.9));
        assert_eq!(SampleConditions::best_rate(Some(&c), &rates), 11.0);
        assert_eq!(SampleConditions::best_rate(None, &rates), 20.0);
        // Conditions of another number of samples say nothing about these.
        assert_eq!(c.best(&[1.0, 2.0, 3.0], false), None);
        // A wider measured drift lets the same sample through.
        let c = SampleConditions::cpu(vec![3.0e9, 2.5e9], 3.0e9, 0.2);
        assert!(c.left_out.is_empty() && c.summary().is_none());
    }

    #[test]
    fn noisy_readings_widen_the_drift_but_a_minority_of_slow_samples_does_not() {
        // Readings ±4% around the clock (as an SMT sibling makes them): none left out.
        let c = SampleConditions::cpu(vec![3.69e9, 3.69e9, 3.65e9, 3.51e9, 3.51e9], 3.67e9, 0.0);
        assert!(c.left_out.is_empty(), "{c:?}");
        // Two of five samples 15% slow: the median and its deviation come from the other three.
        let c = SampleConditions::cpu(vec![3.6e9, 3.6e9, 3.1e9, 3.6e9, 3.1e9], 3.6e9, 0.0);
        assert_eq!(
            c.left_out.iter().map(|l| l.sample).collect::<Vec<_>>(),
            vec![2, 4]
        );
        assert_eq!(reading_noise(&[1.0]), 0.0);
        assert_eq!(reading_noise(&[]), 0.0);
    }

    #[test]
    fn too_few_clean_samples_are_flagged_and_none_clean_keeps_every_value() {
        let c = SampleConditions::cpu(vec![3.0e9, 2.0e9, 3.0e9, 3.0e9, 3.0e9, 2.0e9], 3.1e9, 0.02);
        assert_eq!(
            c.reference_clock_hz,
            Some(3.0e9),
            "the median of the readings"
        );
        assert_eq!(c.clean, 4);
        assert!(!c.too_few_clean, "four of six");
        let c = SampleConditions::cpu(vec![2.0e9, 3.0e9, 3.0e9], 3.0e9, 0.02);
        assert_eq!(c.clean, 2);
        assert!(c.too_few_clean, "two of three");
        assert!(c.summary().unwrap().contains("too few"));
        let mut c = SampleConditions::cpu(vec![2.0e9, 2.0e9], 3.0e9, 0.02);
        assert_eq!(c.clean, 2, "none below the readings' own median");
        c.left_out = (0..2)
            .map(|sample| LeftOut {
                sample,
                why: Why::LowClock {
                    clock_hz: 2.0e9,
                    reference_hz: 3.0e9,
                },
            })
            .collect();
        c.clean = 0;
        assert_eq!(c.clean_values(&[1.0, 2.0]), vec![1.0, 2.0]);
        assert!(SampleConditions::enough(3, 5) && !SampleConditions::enough(2, 5));
        assert!(SampleConditions::enough(1, 1) && !SampleConditions::enough(2, 3));
    }

    #[test]
    fn a_throttled_gpu_sample_is_left_out_and_idle_is_not_a_throttle() {
        let c = SampleConditions::gpu(
            vec![Some(1980.0), Some(1410.0), Some(1980.0)],
            vec![Some(690.0), Some(700.0), None],
            vec![
                vec!["GPU_IDLE".into()],
                vec!["SW_POWER_CAP".into(), "HW_THERMAL_SLOWDOWN".into()],
                vec![],
            ],
        );
        assert_eq!(c.left_out.len(), 1);
        assert_eq!(
            c.left_out[0].why,
            Why::Throttled {
                reasons: vec!["SW_POWER_CAP".into(), "HW_THERMAL_SLOWDOWN".into()]
            }
        );
        assert!(c.capped.is_empty(), "heat with the cap is a disturbance");
        assert!(c.throttle[0].is_empty(), "idle is dropped");
        assert_eq!(c.clean, 2);
        assert!(c.too_few_clean, "two of three");
        assert_eq!(c.inconsistency(3), None);
        let json = serde_json::to_string(&c).unwrap();
        let back: SampleConditions = serde_json::from_str(&json).unwrap();
        assert_eq!(back, c);
    }

    /// The power cap is an operating point: a capped sample is kept, the ceiling is the best
    /// capped sample (sustained, with the capped samples' median power and clock), the best
    /// before the cap is its burst figure, and "too few to stand on" is left to real
    /// disturbance.
    #[test]
    fn a_power_capped_gpu_is_sustained_and_burst_not_throttled() {
        let rates = [990.0, 980.0, 770.0, 760.0, 780.0, 500.0];
        let c = SampleConditions::gpu(
            vec![
                Some(1980.0),
                Some(1980.0),
                Some(1500.0),
                Some(1470.0),
                Some(1530.0),
                Some(900.0),
            ],
            vec![
                Some(600.0),
                Some(650.0),
                Some(700.0),
                Some(699.0),
                Some(701.0),
                Some(300.0),
            ],
            vec![
                vec![],
                vec![],
                vec!["SW_POWER_CAP".into()],
                vec!["SW_POWER_CAP".into()],
                vec!["SW_POWER_CAP".into()],
                vec!["SW_THERMAL_SLOWDOWN".into()],
            ],
        );
        assert_eq!(c.capped, vec![2, 3, 4]);
        assert_eq!(c.left_out.len(), 1, "heat alone is left out");
        assert_eq!((c.clean, c.too_few_clean), (5, false));
        assert_eq!(c.inconsistency(6), None);
        assert_eq!(c.best(&rates, false), Some(780.0), "the sustained figure");
        assert_eq!(c.burst(&rates), Some(990.0));
        assert_eq!(
            c.sustained(&rates),
            Some(Sustained {
                value: 780.0,
                samples: 3,
                power_w: Some(700.0),
                sm_clock_mhz: Some(1500.0),
            })
        );
        // Every sample under the cap: a sustained figure, no burst; a ceiling that never
        // reached it has neither.
        let all = SampleConditions::gpu(
            vec![None; 3],
            vec![None; 3],
            vec![vec!["SW_POWER_CAP".into()]; 3],
        );
        assert_eq!((all.clean, all.too_few_clean), (3, false));
        assert_eq!(all.burst(&[1.0, 2.0, 3.0]), None);
        assert_eq!(all.sustained(&[1.0, 2.0, 3.0]).unwrap().value, 3.0);
        let free = SampleConditions::gpu(vec![None; 2], vec![None; 2], vec![vec![], vec![]]);
        assert_eq!(
            (free.burst(&[1.0, 2.0]), free.sustained(&[1.0, 2.0])),
            (None, None)
        );
        let json = serde_json::to_string(&c).unwrap();
        assert_eq!(serde_json::from_str::<SampleConditions>(&json).unwrap(), c);
    }
}
