//! The gate's noise model: how far a figure may move between two runs of an unchanged machine
//! before a change is the code's.
//!
//! Three sources, the widest wins ([`tolerance`]):
//! - the files' own samples: the wider of the two runs' (max − min) / median (what a figure
//!   moved within one run);
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

/// What the project measured of run-to-run noise, per kind of figure. The CPU figures: 20
/// back-to-back pairs of `roofline probe --quick` on an idle 2-vCPU AMD EPYC VM (AVX-512;
/// `scripts/gate-study.sh`, docs/gate.md), each kind's largest fall of its ceiling (the best
/// sample) from one run to the next, times 1.25, rounded up; a full probe (more samples) moves
/// less. The rest are not yet measured between runs: set from the spreads seen within runs on
/// the machines of docs/gpu/ and docs/performance/, and marked so in docs/gate.md.
pub const PRIORS: &[Prior] = &[
    // CPU compute: the FMA chains (largest fall 6.0%), the convolutions (5.1%), the GEMM
    // sweeps (8.5%; f16 on all cores, converted through f32 by the crate, 22.9%).
    Prior {
        pattern: "cpu/fma/*",
        noise: 0.08,
    },
    Prior {
        pattern: "cpu/conv/*",
        noise: 0.07,
    },
    Prior {
        pattern: "cpu/gemm/f16/all",
        noise: 0.29,
    },
    Prior {
        pattern: "cpu/gemm/*",
        noise: 0.11,
    },
    // CPU memory, level by level; one core (t1) against every core (all), which share the
    // host's caches and memory with its other tenants. L1 5.6% / 15.6%; L2 8.3% / 18.0%; L3
    // 15.1% / 14.5%; DRAM 8.1% on one core, and on every core 51%: too noisy to gate with one
    // run per side on such a VM.
    Prior {
        pattern: "cpu/mem/L1/*/t1",
        noise: 0.07,
    },
    Prior {
        pattern: "cpu/mem/L1/*",
        noise: 0.20,
    },
    Prior {
        pattern: "cpu/mem/L2/*/t1",
        noise: 0.11,
    },
    Prior {
        pattern: "cpu/mem/L2/*",
        noise: 0.23,
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

/// The noise of one comparison (unclamped): the widest of the two files' own spreads, the
/// spread between their runs where several are pooled, and the prior for its kind.
pub fn tolerance(b: &Metric, c: &Metric) -> f64 {
    let within = spread(&b.samples).max(spread(&c.samples));
    let between = spread(&b.runs).max(spread(&c.runs));
    within.max(between).max(prior(&b.id))
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
        assert_eq!(prior("cpu/gemm/f16/t1"), 0.11);
        assert_eq!(prior("gpu0/mma/bf16"), 0.05);
        assert_eq!(prior("nodeX/cpu/fma/f32/all"), DEFAULT_NOISE);
        assert_eq!(prior("something/else"), DEFAULT_NOISE);
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
        assert!(t >= (100.2 - 70.2) / 85.2 && t > 0.3, "{t}");
    }
}
