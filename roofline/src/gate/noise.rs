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
/// 15% failed on 22 or more twinned ceilings each). A twin too noisy to judge cannot confirm
/// a fall; a ceiling without a twin in both files (`cpu/conv/f32/all`) stands on its own.
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
            // A twin too noisy to judge cannot confirm the fall either.
            (!fell[t] || comparisons[t].verdict == Verdict::Noisy).then_some(i)
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
