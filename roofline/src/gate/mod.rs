//! `roofline gate`: noise-aware regression checks between two results (machine.json,
//! placement.json or score.json).
//!
//! Every figure is compared in its direction (higher is better for rates — FLOP/s, B/s, OP/s,
//! images/s —, lower for times and latencies) from its stored samples: the change is the ratio
//! of the medians, and its confidence interval comes from a bootstrap of that ratio (both sample
//! sets resampled with replacement, 2000 times, seeded, so the verdict is reproducible). A
//! regression is a change worse than the tolerance whose interval excludes "no change" (a ratio
//! of 1). Tolerances come per id pattern (globs: `*` any run of characters, `?` one) from a rules
//! file, with a default.

use crate::identity::{Cores, Identity};
use crate::machine::Provenance;
use serde::Deserialize;

/// Which way is better.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Direction {
    Higher,
    Lower,
}

impl Direction {
    /// From a unit: rates (`…/s`) are better higher, times (`s`, `ms`, `us`, `ns`) lower.
    pub fn of_unit(unit: &str) -> Direction {
        if ["s", "ms", "us", "µs", "ns"].contains(&unit) {
            Direction::Lower
        } else {
            Direction::Higher
        }
    }
}

mod input;
#[cfg(test)]
use input::metric;
pub use input::{read_input, GateInput, Metric};

/// `gate.toml`.
#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    #[serde(default)]
    pub default: Defaults,
    /// The first rule whose pattern matches an id gives its tolerance.
    #[serde(default, rename = "rule")]
    pub rules: Vec<Rule>,
    /// The built-in rules: each id's tolerance from the two files' own spread
    /// ([`spread_tolerance`]), not from a table.
    #[serde(skip)]
    pub from_spread: bool,
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Defaults {
    /// Relative change tolerated before a change can be a regression (0.10: 10%).
    #[serde(default = "default_tolerance")]
    pub tolerance: f64,
    /// Confidence of the interval that must exclude "no change" (0.95).
    #[serde(default = "default_confidence")]
    pub confidence: f64,
}

fn default_tolerance() -> f64 {
    0.10
}
fn default_confidence() -> f64 {
    0.95
}

impl Default for Defaults {
    fn default() -> Self {
        Defaults {
            tolerance: default_tolerance(),
            confidence: default_confidence(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub pattern: String,
    pub tolerance: f64,
    /// Leave these ids out of the comparison.
    #[serde(default)]
    pub ignore: bool,
}

/// The built-in rules: every id's tolerance from the files' own spread ([`spread_tolerance`]),
/// at 95% confidence. A rules file replaces them with fixed tolerances.
impl Default for Rules {
    fn default() -> Self {
        Rules {
            default: Defaults::default(),
            rules: Vec::new(),
            from_spread: true,
        }
    }
}

/// The spread of samples: (max − min) / median; 0 for one sample.
pub fn spread(samples: &[f64]) -> f64 {
    if samples.len() < 2 {
        return 0.0;
    }
    let mut v = samples.to_vec();
    let m = median(&mut v);
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    if m > 0.0 {
        (hi - lo) / m
    } else {
        0.0
    }
}

/// The tolerance the built-in rules give one id: the wider of the two files' spreads (what
/// the figure moved within each run), at least [`MIN_TOLERANCE`] and at most
/// [`MAX_TOLERANCE`]. A change beyond what either run saw of itself is a change.
pub fn spread_tolerance(b: &Metric, c: &Metric) -> f64 {
    spread(&b.samples)
        .max(spread(&c.samples))
        .clamp(MIN_TOLERANCE, MAX_TOLERANCE)
}

/// The built-in tolerance's floor (clock and timer resolution) and ceiling.
pub const MIN_TOLERANCE: f64 = 0.02;
pub const MAX_TOLERANCE: f64 = 0.5;

/// Why two results cannot be compared: they describe different work (workload, shapes, batch,
/// precision, device, threads, ranks), or one was measured on a busy machine. Empty when they
/// can. Different hardware is [`other_machine`]'s, refused apart (and allowed on request).
pub fn not_comparable(base: &GateInput, cur: &GateInput) -> Vec<String> {
    let mut out = Vec::new();
    let (hb, hc) = (
        input::hardware(&base.provenance),
        input::hardware(&cur.provenance),
    );
    let (wb, wc) = (
        [&base.work[..], &hb].concat(),
        [&cur.work[..], &hc].concat(),
    );
    for (what, b) in &wb {
        match wc.iter().find(|w| w.0 == *what) {
            Some((_, c)) if c != b => {
                out.push(format!("{what}: baseline {b}, current {c}"));
            }
            _ => {}
        }
    }
    for (name, g) in [("baseline", base), ("current", cur)] {
        if let Some(l) = g.provenance.load.as_ref().filter(|l| l.is_busy()) {
            out.push(format!(
                "the {name} was measured on a busy machine ({})",
                l.busy.join("; ")
            ));
        }
    }
    out
}

/// How the machines of two results differ ([`Identity`]: CPU vendor, family, model, stepping,
/// sockets, cores, caches, SIMD, GPUs, clock class); empty on the same hardware.
pub fn other_machine(base: &GateInput, cur: &GateInput) -> Vec<String> {
    Identity::of(&base.provenance).differences(
        &Identity::of(&cur.provenance),
        ("baseline", "current"),
        Cores::Equal,
    )
}

/// Several runs of one kind as one: every id's samples pooled over the runs (so that the
/// interval sees the run-to-run spread), its value the median of the runs' values; the first
/// run's provenance.
pub fn pool(runs: Vec<GateInput>) -> Option<GateInput> {
    let mut it = runs.into_iter();
    let mut first = it.next()?;
    let mut values: Vec<Vec<f64>> = first.metrics.iter().map(|m| vec![m.value]).collect();
    for r in it {
        first.runs += r.runs;
        for m in r.metrics {
            match first.metrics.iter().position(|f| f.id == m.id) {
                Some(i) => {
                    first.metrics[i].samples.extend(m.samples);
                    values[i].push(m.value);
                }
                None => {
                    values.push(vec![m.value]);
                    first.metrics.push(m);
                }
            }
        }
    }
    for (m, v) in first.metrics.iter_mut().zip(values.iter_mut()) {
        m.value = median(v);
    }
    Some(first)
}

/// Why a rules file is not one.
#[derive(Debug, thiserror::Error)]
pub enum RulesError {
    #[error("{0}")]
    Toml(#[source] toml::de::Error),
    #[error("tolerances are fractions in [0, 1), e.g. 0.05 for 5%")]
    Tolerance,
    #[error("confidence is a fraction in (0.5, 1), e.g. 0.95")]
    Confidence,
}

impl Rules {
    pub fn parse(text: &str) -> Result<Rules, RulesError> {
        let r: Rules = toml::from_str(text).map_err(RulesError::Toml)?;
        let bad = |t: f64| !(0.0..1.0).contains(&t);
        if bad(r.default.tolerance) || r.rules.iter().any(|x| bad(x.tolerance)) {
            return Err(RulesError::Tolerance);
        }
        if !(r.default.confidence > 0.5 && r.default.confidence < 1.0) {
            return Err(RulesError::Confidence);
        }
        Ok(r)
    }

    /// The tolerance for `id`, or None when a rule ignores it.
    pub fn tolerance(&self, id: &str) -> Option<f64> {
        match self.rules.iter().find(|r| glob(&r.pattern, id)) {
            Some(r) if r.ignore => None,
            Some(r) => Some(r.tolerance),
            None => Some(self.default.tolerance),
        }
    }
}

/// Glob match: `*` any run of characters (slashes included), `?` one character.
pub fn glob(pattern: &str, s: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), s.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || p[pi] == t[ti]) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(sp) = star {
            pi = sp + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    while pi < p.len() && p[pi] == '*' {
        pi += 1;
    }
    pi == p.len()
}

/// A small deterministic generator (splitmix64) for the bootstrap.
struct Mix(u64);

impl Mix {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        0.5 * (v[n / 2 - 1] + v[n / 2])
    }
}

/// The ratio of medians current / baseline and its bootstrap percentile interval at
/// `confidence`, seeded by `seed`.
pub fn ratio_interval(base: &[f64], cur: &[f64], confidence: f64, seed: u64) -> (f64, f64, f64) {
    let ratio = median(&mut cur.to_vec()) / median(&mut base.to_vec());
    if base.len() < 2 && cur.len() < 2 {
        return (ratio, ratio, ratio);
    }
    const B: usize = 2000;
    let mut rng = Mix(seed ^ 0x5EED_6A7E);
    let (mut rb, mut rc) = (vec![0.0; base.len()], vec![0.0; cur.len()]);
    let mut ratios: Vec<f64> = (0..B)
        .map(|_| {
            for x in rb.iter_mut() {
                *x = base[rng.below(base.len())];
            }
            for x in rc.iter_mut() {
                *x = cur[rng.below(cur.len())];
            }
            median(&mut rc) / median(&mut rb)
        })
        .collect();
    ratios.sort_by(|a, b| a.total_cmp(b));
    let a = (1.0 - confidence) / 2.0;
    let at = |q: f64| ratios[((q * (B - 1) as f64).round() as usize).min(B - 1)];
    (ratio, at(a), at(1.0 - a))
}

/// What a comparison concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Better than the baseline beyond the tolerance, with confidence.
    Improved,
    Unchanged,
    /// Worse beyond the tolerance, and the interval excludes no change.
    Regressed,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Improved => "improved",
            Verdict::Unchanged => "ok",
            Verdict::Regressed => "REGRESSED",
        }
    }
}

/// One compared id.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub id: String,
    pub unit: String,
    pub direction: Direction,
    /// The medians of the samples: the figures the change compares.
    pub baseline: f64,
    pub current: f64,
    /// Relative change of the medians, signed so that negative is worse.
    pub change: f64,
    /// The interval of that change.
    pub low: f64,
    pub high: f64,
    pub tolerance: f64,
    pub verdict: Verdict,
    pub samples: (usize, usize),
}

/// Compares one metric.
pub fn compare(b: &Metric, c: &Metric, tolerance: f64, confidence: f64) -> Comparison {
    let seed = b.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    });
    let (r, lo, hi) = ratio_interval(&b.samples, &c.samples, confidence, seed);
    // Signed so that negative is worse: rates lose when the ratio drops, times when it grows.
    let signed = |x: f64| match b.direction {
        Direction::Higher => x - 1.0,
        Direction::Lower => 1.0 / x - 1.0,
    };
    let (change, a, z) = (signed(r), signed(lo), signed(hi));
    let (low, high) = (a.min(z), a.max(z));
    let verdict = if change < -tolerance && high < 0.0 {
        Verdict::Regressed
    } else if change > tolerance && low > 0.0 {
        Verdict::Improved
    } else {
        Verdict::Unchanged
    };
    Comparison {
        id: b.id.clone(),
        unit: b.unit.clone(),
        direction: b.direction,
        baseline: median(&mut b.samples.clone()),
        current: median(&mut c.samples.clone()),
        change,
        low,
        high,
        tolerance,
        verdict,
        samples: (b.samples.len(), c.samples.len()),
    }
}

/// The whole gate.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    pub comparisons: Vec<Comparison>,
    /// Ids in the baseline that the current result lacks, and the reverse.
    pub missing: Vec<String>,
    pub added: Vec<String>,
    /// Differences of hardware, clocks, power limits, drivers, libraries.
    pub provenance: Vec<String>,
    pub ignored: usize,
    /// Set when the tolerances came from one run per side: a run's own spread does not hold
    /// the spread between runs of a shared machine (what pooling several runs adds).
    pub single_runs: bool,
}

impl Report {
    pub fn regressions(&self) -> usize {
        self.comparisons
            .iter()
            .filter(|c| c.verdict == Verdict::Regressed)
            .count()
    }
}

/// Compares every id of `base` found in `cur`.
pub fn gate(base: &GateInput, cur: &GateInput, rules: &Rules) -> Report {
    let mut comparisons = Vec::new();
    let mut missing = Vec::new();
    let mut ignored = 0;
    for b in &base.metrics {
        let Some(tol) = rules.tolerance(&b.id) else {
            ignored += 1;
            continue;
        };
        match cur.metrics.iter().find(|c| c.id == b.id) {
            Some(c) => {
                let tol = if rules.from_spread {
                    spread_tolerance(b, c)
                } else {
                    tol
                };
                comparisons.push(compare(b, c, tol, rules.default.confidence))
            }
            None => missing.push(b.id.clone()),
        }
    }
    let added = cur
        .metrics
        .iter()
        .filter(|c| !base.metrics.iter().any(|b| b.id == c.id))
        .map(|c| c.id.clone())
        .collect();
    Report {
        comparisons,
        missing,
        added,
        provenance: provenance_differences(&base.provenance, &cur.provenance),
        ignored,
        single_runs: rules.from_spread && (base.runs == 1 || cur.runs == 1),
    }
}

/// What differs between two results' machines and software, in words.
pub fn provenance_differences(a: &Provenance, b: &Provenance) -> Vec<String> {
    let mut out = Vec::new();
    let mut diff = |what: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{what}: baseline {x}, current {y}"));
        }
    };
    diff("CPU", a.cpu.model_name.clone(), b.cpu.model_name.clone());
    diff(
        "CPU cores",
        a.cpu.cores.to_string(),
        b.cpu.cores.to_string(),
    );
    diff("SIMD", a.cpu.simd.clone(), b.cpu.simd.clone());
    diff("host", a.host.clone(), b.host.clone());
    diff("kernel", a.kernel.clone(), b.kernel.clone());
    diff("tool", a.tool.clone(), b.tool.clone());
    diff("compiler", a.compiler.clone(), b.compiler.clone());
    diff("libraries", a.libraries.join(", "), b.libraries.join(", "));
    if let (Some(x), Some(y)) = (&a.cpu.measured_clock_hz_t1, &b.cpu.measured_clock_hz_t1) {
        if (y.median / x.median - 1.0).abs() > 0.03 {
            out.push(format!(
                "CPU clock (one core, measured): baseline {:.3} GHz, current {:.3} GHz",
                x.median / 1e9,
                y.median / 1e9
            ));
        }
    }
    let gpus = |p: &Provenance| -> Vec<String> { p.gpus.iter().map(|g| g.name.clone()).collect() };
    if gpus(a) != gpus(b) {
        out.push(format!(
            "GPUs: baseline [{}], current [{}]",
            gpus(a).join(", "),
            gpus(b).join(", ")
        ));
    }
    for (x, y) in a.gpus.iter().zip(&b.gpus) {
        let g = format!("gpu{}", x.index);
        let o = |v: &Option<String>| v.clone().unwrap_or("?".into());
        if x.driver_version != y.driver_version {
            out.push(format!(
                "{g} driver: baseline {}, current {}",
                o(&x.driver_version),
                o(&y.driver_version)
            ));
        }
        if x.power_limit_w != y.power_limit_w {
            out.push(format!(
                "{g} power limit: baseline {:?} W, current {:?} W",
                x.power_limit_w, y.power_limit_w
            ));
        }
        if x.sm_clock_max_mhz != y.sm_clock_max_mhz {
            out.push(format!(
                "{g} maximum SM clock: baseline {:?} MHz, current {:?} MHz",
                x.sm_clock_max_mhz, y.sm_clock_max_mhz
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Samples of `n` values around `mean` with relative noise `noise` (deterministic).
    fn noisy(mean: f64, noise: f64, n: usize, seed: u64) -> Vec<f64> {
        let mut r = Mix(seed);
        (0..n)
            .map(|_| {
                // Sum of uniforms ≈ normal, unit variance.
                let z: f64 = (0..12)
                    .map(|_| (r.next() >> 11) as f64 / (1u64 << 53) as f64)
                    .sum::<f64>()
                    - 6.0;
                mean * (1.0 + noise * z)
            })
            .collect()
    }

    fn m(id: &str, unit: &str, s: Vec<f64>) -> Metric {
        metric(id.into(), unit, s[0], &s)
    }

    #[test]
    fn a_20_percent_drop_in_5_percent_noise_is_caught() {
        for seed in 0..20 {
            let b = m("cpu/fma/f32/all", "FLOP/s", noisy(100.0, 0.05, 5, seed));
            let c = m(
                "cpu/fma/f32/all",
                "FLOP/s",
                noisy(80.0, 0.05, 5, seed + 100),
            );
            let r = compare(&b, &c, 0.10, 0.95);
            assert_eq!(r.verdict, Verdict::Regressed, "seed {seed}: {r:?}");
            assert!(r.change < -0.1 && r.high < 0.0);
        }
        // A time that grows 20% is a regression too; one that shrinks is an improvement.
        let b = m("score/x/time_to_quality", "s", noisy(10.0, 0.05, 5, 1));
        let c = m("score/x/time_to_quality", "s", noisy(12.0, 0.05, 5, 2));
        assert_eq!(compare(&b, &c, 0.1, 0.95).verdict, Verdict::Regressed);
        let c = m("score/x/time_to_quality", "s", noisy(8.0, 0.05, 5, 3));
        assert_eq!(compare(&b, &c, 0.1, 0.95).verdict, Verdict::Improved);
    }

    /// Noise alone: over 100 comparisons with no tolerance at all (the interval decides alone),
    /// no more false alarms than the confidence allows (5 at 95%); with the default tolerance,
    /// none.
    #[test]
    fn noise_alone_gives_no_more_false_alarms_than_the_confidence_allows() {
        let (mut strict, mut default) = (0, 0);
        for seed in 0..100u64 {
            let b = m("x", "B/s", noisy(50.0, 0.05, 10, 2 * seed));
            let c = m("x", "B/s", noisy(50.0, 0.05, 10, 2 * seed + 1));
            strict += usize::from(compare(&b, &c, 0.0, 0.95).verdict == Verdict::Regressed);
            default += usize::from(compare(&b, &c, 0.10, 0.95).verdict == Verdict::Regressed);
        }
        assert!(strict <= 5, "{strict} false alarms in 100 at 95%");
        assert_eq!(default, 0);
    }

    /// Two runs at 100 and two at 50 (a bimodal machine) against the same: pooled, the interval
    /// spans both modes and the gate does not fire; one run of each would.
    #[test]
    fn pooled_runs_carry_the_run_to_run_spread() {
        let run = |v: f64, seed: u64| GateInput {
            kind: "machine",
            provenance: serde_json::from_value(serde_json::json!({
                "tool": "t", "command_line": [], "time_utc": "t", "host": "h", "os": "o",
                "kernel": "k", "quick": true, "duration_s": 1.0,
                "cpu": { "vendor": "v", "model_name": "m", "family": 1, "model": 2, "stepping": 3,
                         "sockets": 1, "cores": 2, "logical_cpus": 2, "features": [], "simd": "x",
                         "caches": [] }
            }))
            .unwrap(),
            metrics: vec![m("cpu/mem/DRAM/triad/all", "B/s", noisy(v, 0.01, 3, seed))],
            work: vec![("CPU", "m".into())],
            runs: 1,
        };
        let strict = Rules::parse("[default]\ntolerance = 0.1\n").unwrap();
        let one = gate(&run(100.0, 1), &run(50.0, 2), &strict);
        assert_eq!(one.regressions(), 1);
        let base = pool(vec![run(100.0, 1), run(50.0, 3), run(100.0, 5)]).unwrap();
        let cur = pool(vec![run(50.0, 2), run(100.0, 4), run(50.0, 6)]).unwrap();
        assert_eq!(base.metrics[0].samples.len(), 9);
        assert_eq!(
            base.metrics[0].value,
            base.metrics[0].value.clamp(99.0, 101.0)
        );
        let r = gate(&base, &cur, &strict);
        assert_eq!(r.regressions(), 0, "{:?}", r.comparisons);
        assert!(r.comparisons[0].low < 0.0 && r.comparisons[0].high > 0.0);
    }

    #[test]
    fn single_samples_compare_their_values() {
        let b = m("x", "FLOP/s", vec![100.0]);
        let c = m("x", "FLOP/s", vec![85.0]);
        let r = compare(&b, &c, 0.10, 0.95);
        assert_eq!(r.verdict, Verdict::Regressed);
        assert_eq!((r.low, r.high), (r.change, r.change));
        assert_eq!(compare(&b, &c, 0.20, 0.95).verdict, Verdict::Unchanged);
    }

    #[test]
    fn rules_and_globs() {
        let r = Rules::parse(
            "[default]\ntolerance = 0.05\n\n[[rule]]\npattern = \"cpu/mem/*/all\"\ntolerance = 0.15\n\n[[rule]]\npattern = \"net/*\"\ntolerance = 0.5\nignore = true\n",
        )
        .unwrap();
        assert_eq!(r.tolerance("cpu/mem/DRAM/triad/all"), Some(0.15));
        assert_eq!(r.tolerance("cpu/mem/DRAM/triad/t1"), Some(0.05));
        assert_eq!(r.tolerance("net/allreduce/intra"), None);
        assert!(glob("cpu/fma/f??/*", "cpu/fma/f32/all"));
        assert!(!glob("cpu/fma/f??/*", "cpu/fma/bf16/all"));
        assert!(glob("*", ""));
        assert!(matches!(
            Rules::parse("[default]\ntolerance = 2\n"),
            Err(RulesError::Tolerance)
        ));
        assert!(
            matches!(Rules::parse("[defaults]\n"), Err(RulesError::Toml(_))),
            "unknown tables are errors"
        );
        let d = Rules::default();
        assert!(d.from_spread && d.rules.is_empty());
        assert!(!r.from_spread, "a rules file gives fixed tolerances");
    }

    /// The built-in tolerance is the files' own spread: a DRAM ceiling falling 49% with 5%
    /// noise is a regression; the same noise alone is not; a noisy figure gets a wide one.
    #[test]
    fn built_in_tolerances_come_from_the_files_spread() {
        let d = Rules::default();
        let one = |id: &str, s: Vec<f64>| GateInput {
            kind: "machine",
            provenance: crate::placement::tests::machine().provenance,
            metrics: vec![m(id, "B/s", s)],
            work: vec![],
            runs: 1,
        };
        let base = one("cpu/mem/DRAM/read/all", noisy(40e9, 0.05, 5, 1));
        let fell = one("cpu/mem/DRAM/read/all", noisy(0.51 * 40e9, 0.05, 5, 2));
        let same = one("cpu/mem/DRAM/read/all", noisy(40e9, 0.05, 5, 3));
        let r = gate(&base, &fell, &d);
        assert_eq!(r.regressions(), 1, "{:?}", r.comparisons);
        let t = r.comparisons[0].tolerance;
        assert!((MIN_TOLERANCE..0.3).contains(&t), "{t}");
        assert_eq!(gate(&base, &same, &d).regressions(), 0);
        // The table's figures are the medians the change compares.
        let c = &r.comparisons[0];
        assert!((c.current / c.baseline - 1.0 - c.change).abs() < 1e-9);
        let wide = one("x", vec![1.0, 2.0, 3.0]);
        assert_eq!(
            spread_tolerance(&wide.metrics[0], &wide.metrics[0]),
            MAX_TOLERANCE
        );
    }

    /// Files of different work, or from a busy machine, are not compared.
    #[test]
    fn different_work_and_busy_machines_are_not_comparable() {
        let p = |batch: usize, width: &str| GateInput {
            kind: "placement",
            provenance: crate::placement::tests::machine().provenance,
            metrics: vec![m("placement/resnet50/achieved", "FLOP/s", vec![1.0])],
            work: vec![
                ("shapes", format!("ResNet-50 v1.5 (width {width})")),
                ("batch", format!("{:?}", Some(batch))),
                ("precision", "f32".into()),
            ],
            runs: 1,
        };
        let (a, b) = (p(8, "1"), p(16, "0.25"));
        let why = not_comparable(&a, &b);
        assert_eq!(why.len(), 2, "{why:?}");
        assert!(
            why[0].starts_with("shapes:") && why[1].starts_with("batch:"),
            "{why:?}"
        );
        assert!(not_comparable(&a, &a).is_empty());
        let mut busy = a.clone();
        busy.provenance.load = Some(crate::LoadCheck::judge(
            [Some(0.4), None, None],
            None,
            None,
            None,
        ));
        let why = not_comparable(&a, &busy);
        assert!(
            why[0].contains("current was measured on a busy machine"),
            "{why:?}"
        );
    }

    #[test]
    fn a_changed_cpu_is_reported() {
        let text = crate::placement::tests::machine().to_json().unwrap();
        let a = read_input(&text).unwrap();
        let mut b = a.clone();
        b.provenance.cpu.model_name = "Intel Xeon Platinum 8480+".into();
        b.provenance.libraries = vec!["gemm 0.20.0".into()];
        let r = gate(&a, &b, &Rules::default());
        assert!(
            r.provenance.iter().any(|p| p.starts_with("CPU: baseline")),
            "{:?}",
            r.provenance
        );
        assert!(r.provenance.iter().any(|p| p.starts_with("libraries")));
        // A renamed CPU of the same kind is the same machine; another family is another.
        assert!(other_machine(&a, &b).is_empty());
        b.provenance.cpu.family += 1;
        let why = other_machine(&a, &b);
        assert!(
            why.len() == 1 && why[0].starts_with("CPU family/model/stepping: baseline"),
            "{why:?}"
        );
        assert!(not_comparable(&a, &b).is_empty(), "the work is the same");
        assert!(gate(&a, &a, &Rules::default()).provenance.is_empty());
        // Missing and added ids.
        let mut c = a.clone();
        let gone = c.metrics.remove(0).id;
        let r = gate(&a, &c, &Rules::default());
        assert_eq!(r.missing, vec![gone.clone()]);
        assert_eq!(gate(&c, &a, &Rules::default()).added, vec![gone]);
        assert!(read_input("{\"schema\": \"x\"}")
            .unwrap_err()
            .to_string()
            .contains("roofline/machine/v1"));
    }
}
