//! The gate's noise model: how far a figure may move between two runs of an unchanged machine
//! before a change is the code's.
//!
//! Three sources, the widest wins ([`tolerance`]):
//! - the baseline's own samples: (max − min) / median (what a figure moved within a healthy
//!   run; the current run's scatter is not asked, so that a loaded run cannot hide its own
//!   fall behind its own noise);
//! - the runs' spread, where several files are pooled per side: (max − min) / median of the
//!   runs' medians (what it moved between runs here, today);
//! - what this project measured of run-to-run noise per kind of figure ([`PRIORS`]): one run's
//!   own samples do not hold the spread between runs of a shared machine (a DRAM ceiling
//!   measured in one quiet second, and again in another), so a single run per side is gated
//!   against the noise measured between such runs.
//!
//! A figure whose noise is beyond [`super::MAX_TOLERANCE`] is reported as too noisy to judge,
//! never as a regression.

use super::{spread, Metric};

/// The run-to-run noise of one kind of figure: the largest relative change between two
/// back-to-back runs of an idle machine, with a margin.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Prior {
    /// Ids it covers (a glob: `*` any run of characters, `?` one), first match wins; a
    /// distributed probe's `node<i>/` prefix is taken off first.
    pub pattern: &'static str,
    /// Relative change (0.10: 10%).
    pub noise: f64,
}

/// What the project measured of run-to-run noise, per kind of figure. The CPU figures: 40
/// back-to-back pairs of `roofline probe --quick` on an idle 2-vCPU AMD EPYC VM (family 26
/// model 2, AVX-512; two runs of `scripts/gate-study.sh`, docs/gate.md): each kind's third
/// largest fall of its ceiling (the best sample) from one run to the next, with a margin of a
/// quarter, rounded up. The larger falls were single measurements hit by another tenant: a
/// ceiling that falls while its one-thread / all-core twin does not is a warning, not a
/// failure ([`corroborate`]). A full probe (more samples) moves less. The rest are not yet
/// measured between runs: set from the spreads seen within runs on the machines of docs/gpu/
/// and docs/performance/, and marked so in docs/gate.md.
pub const PRIORS: &[Prior] = &[
    // CPU compute: the FMA chains (third largest fall 5.6%), the convolutions (5.1%), the
    // GEMM sweeps (5.9%; f16 on every core, converted through f32 by the crate, 21.5%).
    Prior {
        pattern: "cpu/fma/*",
        noise: 0.08,
    },
    Prior {
        pattern: "cpu/conv/*",
        noise: 0.08,
    },
    Prior {
        pattern: "cpu/gemm/f16/all",
        noise: 0.29,
    },
    Prior {
        pattern: "cpu/gemm/*",
        noise: 0.09,
    },
    // CPU memory, level by level, one core (t1) and every core (all), which share the host's
    // caches and memory with its other tenants: L1 5.2% / 8.6%; L2 12.7% / 17.4% (write),
    // 5.4% / 6.7% (the rest); L3 14.9% / 14.4%; DRAM 8.1% on one core, and on every core
    // 44–50%: too noisy to gate with one run per side on such a VM.
    Prior {
        pattern: "cpu/mem/L1/*/t1",
        noise: 0.07,
    },
    Prior {
        pattern: "cpu/mem/L1/*",
        noise: 0.11,
    },
    Prior {
        pattern: "cpu/mem/L2/write/t1",
        noise: 0.16,
    },
    Prior {
        pattern: "cpu/mem/L2/write/*",
        noise: 0.22,
    },
    Prior {
        pattern: "cpu/mem/L2/*/t1",
        noise: 0.07,
    },
    Prior {
        pattern: "cpu/mem/L2/*",
        noise: 0.09,
    },
    Prior {
        pattern: "cpu/mem/L3/*",
        noise: 0.19,
    },
    Prior {
        pattern: "cpu/mem/DRAM/*/t1",
        noise: 0.11,
    },
    Prior {
        pattern: "cpu/mem/DRAM/*",
        noise: 0.65,
    },
    Prior {
        pattern: "agg/*",
        noise: 0.11,
    },
    // Not yet measured between runs. GPUs: clocks held by the driver, samples within 1–3% in
    // every bring-up run.
    Prior {
        pattern: "gpu*/mem/*",
        noise: 0.05,
    },
    Prior {
        pattern: "gpu-link/*",
        noise: 0.10,
    },
    Prior {
        pattern: "gpu*",
        noise: 0.05,
    },
    // Communication and storage: other tenants' traffic.
    Prior {
        pattern: "net/*",
        noise: 0.20,
    },
    Prior {
        pattern: "link/*",
        noise: 0.20,
    },
    Prior {
        pattern: "io/*",
        noise: 0.30,
    },
    // Training runs: a step's time on a shared VM.
    Prior {
        pattern: "placement/*",
        noise: 0.10,
    },
    Prior {
        pattern: "score/*",
        noise: 0.10,
    },
    Prior {
        pattern: "automl/*",
        noise: 0.15,
    },
];

/// The twin of a CPU ceiling: the same kernel on one thread (`…/t1`) for one on every core
/// (`…/all`), and the reverse.
pub fn twin(id: &str) -> Option<String> {
    if !id.starts_with("cpu/") {
        return None;
    }
    id.strip_suffix("/t1")
        .map(|s| format!("{s}/all"))
        .or_else(|| id.strip_suffix("/all").map(|s| format!("{s}/t1")))
}

/// A regression of a kernel shows on one thread and on every core alike; another tenant's
/// burst (a memory-bound neighbour, the host putting both vCPUs on one core for a second) hits
/// one measurement. So under the built-in rules a CPU ceiling that fell beyond its tolerance
/// while its twin ([`twin`]) did not is marked [`Verdict::Alone`](super::Verdict::Alone): a
/// warning, not a failure (20 + 20 quiet pairs of quick probes on a 2-vCPU VM: 12 single
/// ceilings fell 10–51% from one run to the next, none with its twin; the 40 pairs slowed by
/// 15% failed on 22 or more twinned ceilings each). A ceiling whose twin is too noisy to
/// judge cannot be confirmed, and is reported as not gated (20 quiet pairs on Zen 5 had
/// one-core L2 write and DRAM fall alone beside their all-core twins' 22% and 65% noise; a Zen
/// 3 VM's one-core L1 write fell 29% alone); a ceiling without a twin in both files
/// (`cpu/conv/f32/all`) stands on its own.
pub fn corroborate(comparisons: &mut [super::Comparison]) {
    use super::Verdict;
    let fell: Vec<bool> = comparisons
        .iter()
        .map(|c| c.change < -c.tolerance)
        .collect();
    let at = |id: &str| comparisons.iter().position(|c| c.id == id);
    let alone: Vec<usize> = comparisons
        .iter()
        .enumerate()
        .filter(|(_, c)| c.verdict == Verdict::Regressed)
        .filter_map(|(i, c)| {
            let t = at(&twin(&c.id)?)?;
            // A ceiling whose twin is too noisy to judge is not gated at all (`gate_with`).
            (!fell[t] && comparisons[t].verdict != Verdict::Noisy).then_some(i)
        })
        .collect();
    for i in alone {
        comparisons[i].verdict = Verdict::Alone;
    }
}

/// Noise for an id no prior covers.
pub const DEFAULT_NOISE: f64 = 0.10;

/// The run-to-run noise the project measured for `id`'s kind of figure.
pub fn prior(id: &str) -> f64 {
    let bare = match id.strip_prefix("node") {
        Some(rest) => rest
            .split_once('/')
            .filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit()))
            .map_or(id, |(_, r)| r),
        None => id,
    };
    PRIORS
        .iter()
        .find(|p| super::glob(p.pattern, bare))
        .map_or(DEFAULT_NOISE, |p| p.noise)
}

/// A calibrated side (a `probe --runs N` baseline, or N files pooled) holds each id to the
/// spread measured between its runs once it has this many.
pub const MIN_RUNS: usize = 3;

/// The chance, per id, that an unchanged runner fails a calibrated gate: one-sided, 1%. A
/// quick probe gates about 45 ids, and a CPU ceiling fails only with its twin
/// ([`corroborate`]).
pub const ALARM: f64 = 0.01;

/// The smallest detectable regression is the one caught 19 times in 20.
pub const POWER: f64 = 0.95;

/// An id that cannot see a regression of this size is not gated: reported as too noisy,
/// never failed, never passed silently.
pub const BLIND: f64 = 0.30;

/// A built-in prior is taken as this many standard deviations of the log-change between two
/// quiet runs: what a one-run baseline's detectable regression is computed from. On the VM the
/// priors were measured on they sit at 2.6 (the median over its ids; held by
/// `gate::tests::the_priors_sit_at_two_deviations_or_more_where_they_were_measured`), so 2
/// overstates a quiet runner's noise, never understates it; on the Zen 3 VM they sit at 0.6,
/// which is why a baseline there wants its own runs.
pub const PRIOR_DEVIATIONS: f64 = 2.0;

/// Where an id's tolerance came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// The spread between this runner's runs (a calibrated baseline).
    Runs,
    /// The built-in prior for its kind of figure, or the files' own spread where wider.
    Prior,
}

/// The noise of one comparison: how far it may move unchanged, and the deviation of its
/// log-change, from which the smallest detectable regression follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Noise {
    /// The relative fall tolerated (unclamped).
    pub tolerance: f64,
    /// The standard deviation of ln(current / baseline) on an unchanged runner.
    pub deviation: f64,
    pub source: Source,
}

impl Noise {
    /// The smallest slowdown caught [`POWER`] of the time with `tolerance` as the threshold;
    /// a ceiling with a twin must fall with it, so each of the two at √POWER.
    pub fn detectable(&self, tolerance: f64, twinned: bool) -> f64 {
        let p = if twinned { POWER.sqrt() } else { POWER };
        1.0 - (1.0 - tolerance) * (-normal_quantile(p) * self.deviation).exp()
    }
}

/// The run values' mean and sum of squared deviations, in logs.
fn log_moments(runs: &[f64]) -> (f64, f64) {
    let logs: Vec<f64> = runs.iter().filter(|x| **x > 0.0).map(|x| x.ln()).collect();
    let n = logs.len().max(1) as f64;
    let mean = logs.iter().sum::<f64>() / n;
    (mean, logs.iter().map(|x| (x - mean).powi(2)).sum())
}

/// The noise of one comparison. With [`MIN_RUNS`] runs or more in the baseline, from the
/// spread between runs: the deviation of ln(value) pooled over both sides' runs, and a
/// tolerance at the one-sided [`ALARM`] quantile of Student's t (a new run against the runs'
/// centre: √(1/n + 1/m) deviations). Otherwise the widest of the two files' own spreads, the
/// spread between their runs where several are pooled, and the prior for its kind.
pub fn noise(b: &Metric, c: &Metric) -> Noise {
    let positive = |r: &[f64]| r.iter().all(|x| *x > 0.0);
    let (n, m) = (b.runs.len(), c.runs.len());
    if n >= MIN_RUNS && positive(&b.runs) && positive(&c.runs) {
        let (_, sb) = log_moments(&b.runs);
        let (_, sc) = if m >= 2 {
            log_moments(&c.runs)
        } else {
            (0.0, 0.0)
        };
        let df = (n - 1) + m.saturating_sub(1);
        let sd = ((sb + sc) / df as f64).sqrt();
        let se = sd * (1.0 / n as f64 + 1.0 / m.max(1) as f64).sqrt();
        let measured = 1.0 - (-student_t(1.0 - ALARM, df) * se).exp();
        // The prior stays the floor: five runs that agree to 1% do not promise that the sixth
        // will (a Zen 3 VM's GEMM ceilings agreed to 2% over five runs, then fell 31%).
        let floor = prior(&b.id);
        return if measured >= floor {
            Noise {
                tolerance: measured,
                deviation: se,
                source: Source::Runs,
            }
        } else {
            Noise {
                tolerance: floor,
                deviation: se.max(floor / PRIOR_DEVIATIONS),
                source: Source::Prior,
            }
        };
    }
    // The baseline's own samples say how far the figure moves within a healthy run; the
    // current's are not asked: a run whose samples scatter (a loaded core, a throttling GPU)
    // would otherwise hide its own fall behind its own noise (a pretend node 36% short, its
    // samples 38% apart, was "too noisy" on a CI run). Its scatter is in the interval.
    let within = spread(&b.samples);
    let between = spread(&b.runs).max(spread(&c.runs));
    let tolerance = within.max(between).max(prior(&b.id));
    Noise {
        tolerance,
        deviation: tolerance / PRIOR_DEVIATIONS,
        source: Source::Prior,
    }
}

/// The noise of one comparison (unclamped): [`noise`]'s tolerance.
pub fn tolerance(b: &Metric, c: &Metric) -> f64 {
    noise(b, c).tolerance
}

/// The standard normal quantile (Acklam's rational approximation, |error| < 1.2e-9).
pub fn normal_quantile(p: f64) -> f64 {
    const A: [f64; 6] = [
        -3.969_683_028_665_376e1,
        2.209_460_984_245_205e2,
        -2.759_285_104_469_687e2,
        1.383_577_518_672_69e2,
        -3.066_479_806_614_716e1,
        2.506_628_277_459_239,
    ];
    const B: [f64; 5] = [
        -5.447_609_879_822_406e1,
        1.615_858_368_580_409e2,
        -1.556_989_798_598_866e2,
        6.680_131_188_771_972e1,
        -1.328_068_155_288_572e1,
    ];
    const C: [f64; 6] = [
        -7.784_894_002_430_293e-3,
        -3.223_964_580_411_365e-1,
        -2.400_758_277_161_838,
        -2.549_732_539_343_734,
        4.374_664_141_464_968,
        2.938_163_982_698_783,
    ];
    const D: [f64; 4] = [
        7.784_695_709_041_462e-3,
        3.224_671_290_700_398e-1,
        2.445_134_137_142_996,
        3.754_408_661_907_416,
    ];
    let p = p.clamp(1e-300, 1.0 - 1e-16);
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5])
            / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Student's t quantile at `p` with `df` degrees of freedom, by bisection on the exact
/// distribution (Abramowitz & Stegun 26.7.3–4: finite series for integer `df`); the normal
/// quantile beyond 300.
pub fn student_t(p: f64, df: usize) -> f64 {
    if df == 0 {
        return f64::INFINITY;
    }
    if df > 300 {
        return normal_quantile(p);
    }
    // P(|T| < t).
    let central = |t: f64| {
        let v = df as f64;
        let th = (t / v.sqrt()).atan();
        let (s, c2) = (th.sin(), th.cos().powi(2));
        if df.is_multiple_of(2) {
            let (mut term, mut sum) = (1.0, 1.0);
            for k in 1..df / 2 {
                term *= c2 * (2 * k - 1) as f64 / (2 * k) as f64;
                sum += term;
            }
            s * sum
        } else if df == 1 {
            2.0 * th / std::f64::consts::PI
        } else {
            let (mut term, mut sum) = (1.0, 1.0);
            for k in 1..(df - 1) / 2 {
                term *= c2 * (2 * k) as f64 / (2 * k + 1) as f64;
                sum += term;
            }
            2.0 / std::f64::consts::PI * (th + s * th.cos() * sum)
        }
    };
    let (q, sign) = if p < 0.5 { (1.0 - p, -1.0) } else { (p, 1.0) };
    let target = 2.0 * q - 1.0;
    let (mut lo, mut hi) = (0.0f64, 1.0e7f64);
    for _ in 0..200 {
        let mid = 0.5 * (lo + hi);
        if central(mid) < target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    sign * 0.5 * (lo + hi)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn priors_by_kind_and_node() {
        assert_eq!(prior("cpu/fma/f32/all"), 0.08);
        assert_eq!(prior("node3/cpu/fma/f32/all"), 0.08);
        assert_eq!(prior("cpu/mem/DRAM/triad/t1"), 0.11);
        assert_eq!(prior("cpu/mem/DRAM/triad/all"), 0.65);
        assert_eq!(prior("cpu/gemm/f16/all"), 0.29);
        assert_eq!(prior("cpu/gemm/f16/t1"), 0.09);
        assert_eq!(prior("cpu/mem/L2/write/all"), 0.22);
        assert_eq!(twin("cpu/fma/f32/all").as_deref(), Some("cpu/fma/f32/t1"));
        assert_eq!(
            twin("cpu/mem/L2/copy/t1").as_deref(),
            Some("cpu/mem/L2/copy/all")
        );
        assert_eq!(twin("gpu0/fma/f32"), None);
        assert_eq!(prior("gpu0/mma/bf16"), 0.05);
        assert_eq!(prior("nodeX/cpu/fma/f32/all"), DEFAULT_NOISE);
        assert_eq!(prior("something/else"), DEFAULT_NOISE);
    }

    /// The quantiles against the tables: the normal's, and Student's t at 99% one-sided.
    #[test]
    fn quantiles_match_the_tables() {
        let close = |a: f64, b: f64| (a - b).abs() < 1e-3 * b.abs();
        assert!(close(normal_quantile(0.975), 1.959_964));
        assert!(close(normal_quantile(0.95), 1.644_854));
        assert!(close(normal_quantile(0.01), -2.326_348));
        for (df, t) in [
            (1, 31.821),
            (2, 6.965),
            (3, 4.541),
            (4, 3.747),
            (5, 3.365),
            (9, 2.821),
            (10, 2.764),
            (30, 2.457),
        ] {
            assert!(
                close(student_t(0.99, df), t),
                "df {df}: {}",
                student_t(0.99, df)
            );
        }
        assert!(close(student_t(0.975, 4), 2.776));
        assert!(close(student_t(0.01, 4), -3.747));
    }

    /// Five runs that agree to 1% keep the prior (the floor); a runner whose runs spread 30%
    /// gets a wide tolerance, far wider than the prior: the table is never a ceiling on the
    /// runner's noise.
    #[test]
    fn calibrated_runs_set_the_tolerance_both_ways() {
        let m = |id: &str, runs: Vec<f64>| Metric {
            id: id.into(),
            unit: "B/s".into(),
            direction: super::super::Direction::Higher,
            value: runs[0],
            samples: vec![runs[0]],
            runs,
        };
        let quiet = m("cpu/mem/L1/read/t1", vec![100.0, 101.0, 99.5, 100.5, 100.2]);
        let one = m("cpu/mem/L1/read/t1", vec![100.0]);
        let n = noise(&quiet, &one);
        // Under the prior, the prior is the floor: five runs that agree do not promise a sixth.
        assert_eq!(n.source, Source::Prior);
        assert_eq!(n.tolerance, 0.07);
        let d = n.detectable(n.tolerance, true);
        assert!(d > n.tolerance && d < 0.15, "{d}");
        let loud = m(
            "cpu/mem/L1/read/t1",
            vec![110.0, 175.0, 140.0, 160.0, 120.0],
        );
        let n = noise(&loud, &one);
        assert_eq!(n.source, Source::Runs);
        assert!(n.tolerance > 0.5, "{n:?}");
        assert!(n.detectable(n.tolerance, true) > BLIND);
        // Two runs are not enough to learn from: the prior holds.
        let two = m("cpu/mem/L1/read/t1", vec![100.0, 100.1]);
        assert_eq!(noise(&two, &one).source, Source::Prior);
        assert_eq!(noise(&two, &one).tolerance, 0.07);
    }

    /// Pooled runs that disagree widen the tolerance beyond every run's own spread.
    #[test]
    fn the_runs_spread_counts() {
        let m = |samples: Vec<f64>, runs: Vec<f64>| Metric {
            id: "cpu/fma/f32/all".into(),
            unit: "FLOP/s".into(),
            direction: super::super::Direction::Higher,
            value: samples[0],
            samples,
            runs,
        };
        let one = m(vec![100.0, 100.5], vec![100.0]);
        assert_eq!(tolerance(&one, &one), 0.08);
        let pooled = m(vec![100.0, 100.5, 70.0, 70.5], vec![100.2, 70.2]);
        let t = tolerance(&pooled, &one);
        assert!(t >= (100.2 - 70.2) / 85.2, "{t}");
    }
}
