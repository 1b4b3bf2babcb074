//! The clock as a cause, not a regression. A cloud VM's core clock wanders between runs
//! (2.66 to 2.82 GHz between two quick probes of one Zen 3 VM): every ceiling bound by the core
//! clock (the FMA peaks, GEMM, the convolutions, the caches) moves with it, while DRAM does
//! not. The gate says so beside each such figure that moved with the clock, and `--per-clock`
//! compares them per cycle instead: the code's question, where a fleet check asks the
//! machine's (a slower clock is then the finding).

use super::{median, GateInput};

/// A clock change smaller than this is the measurement's own noise (the same threshold as
/// the provenance warning).
pub const MOVED: f64 = 0.03;

/// Ids whose figure scales with the core clock: the CPU's compute and its caches (not DRAM,
/// not another node's, whose clock this file does not hold).
pub fn clock_bound(id: &str) -> bool {
    [
        "cpu/fma/",
        "cpu/gemm/",
        "cpu/conv/",
        "cpu/mem/L1/",
        "cpu/mem/L2/",
        "cpu/mem/L3/",
    ]
    .iter()
    .any(|p| id.starts_with(p))
}

/// The result's one-core clock: the median of its runs' (Hz).
pub fn clock_of(g: &GateInput) -> Option<f64> {
    let mut v: Vec<f64> = g.clocks.iter().flatten().copied().collect();
    (!v.is_empty()).then(|| median(&mut v))
}

/// The clock's relative change from `base` to `cur`, where both were measured.
pub fn change(base: &GateInput, cur: &GateInput) -> Option<f64> {
    Some(clock_of(cur)? / clock_of(base)? - 1.0)
}

/// Marks each clock-bound comparison that moved the way the clock did, when the clock moved
/// more than [`MOVED`].
pub fn annotate(comparisons: &mut [super::Comparison], clock_change: f64) {
    if clock_change.abs() <= MOVED {
        return;
    }
    for c in comparisons.iter_mut().filter(|c| clock_bound(&c.id)) {
        if c.change * clock_change > 0.0 {
            c.clock = Some(clock_change);
        }
    }
}

/// The result with its clock-bound figures per cycle of its measured one-core clock: each
/// run's value by its own run's clock (a calibrated baseline keeps one per run), the headline
/// the median of those, the samples by the result's clock; the unit `…/cycle`. A result
/// without a measured clock is returned as it is (and its figures compared per second).
pub fn per_clock(g: &GateInput) -> GateInput {
    let mut out = g.clone();
    let Some(clock) = clock_of(g) else {
        return out;
    };
    let per_run: Option<Vec<f64>> = g.clocks.iter().copied().collect();
    for m in out.metrics.iter_mut().filter(|m| clock_bound(&m.id)) {
        match &per_run {
            Some(clocks) if clocks.len() == m.runs.len() && m.runs.len() > 1 => {
                for (r, k) in m.runs.iter_mut().zip(clocks) {
                    *r /= k;
                }
                m.value = median(&mut m.runs.clone());
            }
            _ => {
                m.value /= clock;
                for r in m.runs.iter_mut() {
                    *r /= clock;
                }
            }
        }
        for s in m.samples.iter_mut() {
            *s /= clock;
        }
        m.unit = match m.unit.strip_suffix("/s") {
            Some(u) => format!("{u}/cycle"),
            None => format!("{}/Hz", m.unit),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gate::{gate, gate_with, metric, Options, Rules, Verdict};

    fn input(clock: f64, fma: f64, dram: f64) -> GateInput {
        GateInput {
            kind: "machine",
            provenance: crate::placement::tests::machine().provenance,
            metrics: vec![
                metric("cpu/fma/f64/t1".into(), "FLOP/s", fma, &[fma, fma * 0.99]),
                metric(
                    "cpu/mem/DRAM/read/t1".into(),
                    "B/s",
                    dram,
                    &[dram, dram * 0.99],
                ),
            ],
            work: vec![],
            runs: 1,
            clocks: vec![Some(clock)],
        }
    }

    /// A clock 10% lower takes the FMA peak down 10%: per second it is a regression, with the
    /// clock named beside it; per cycle it is unchanged. DRAM is never clock-bound.
    #[test]
    fn a_slower_clock_is_named_and_per_clock_takes_it_out() {
        let base = input(3.0e9, 100e9, 20e9);
        let cur = input(2.7e9, 90e9, 20e9);
        let r = gate(&base, &cur, &Rules::default());
        assert!((r.clock_change.unwrap() + 0.1).abs() < 1e-12);
        let fma = &r.comparisons[0];
        assert_eq!(fma.verdict, Verdict::Regressed);
        assert_eq!(fma.clock, Some(r.clock_change.unwrap()));
        assert_eq!(r.comparisons[1].clock, None);
        let p = gate_with(&base, &cur, &Rules::default(), Options { per_clock: true });
        assert!(p.per_clock);
        let fma = &p.comparisons[0];
        assert_eq!(fma.verdict, Verdict::Unchanged, "{fma:?}");
        assert!(fma.change.abs() < 1e-9);
        assert_eq!(fma.unit, "FLOP/cycle");
        assert_eq!(p.comparisons[1].unit, "B/s");
        // Without a measured clock on one side, nothing is compared per cycle.
        let mut unclocked = cur.clone();
        unclocked.clocks = vec![None];
        let p = gate_with(
            &base,
            &unclocked,
            &Rules::default(),
            Options { per_clock: true },
        );
        assert!(!p.per_clock);
        assert_eq!(p.comparisons[0].unit, "FLOP/s");
        // A figure that moved against the clock is not the clock's.
        let against = input(2.7e9, 110e9, 20e9);
        assert_eq!(
            gate(&base, &against, &Rules::default()).comparisons[0].clock,
            None
        );
    }

    #[test]
    fn clock_bound_ids() {
        assert!(clock_bound("cpu/mem/L1/copy/all"));
        assert!(clock_bound("cpu/gemm/f32/t1"));
        assert!(!clock_bound("cpu/mem/DRAM/copy/all"));
        assert!(!clock_bound("gpu0/fma/f32"));
        assert!(!clock_bound("node1/cpu/fma/f32/t1"));
    }
}
