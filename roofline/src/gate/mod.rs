//! `roofline gate`: noise-aware regression checks between two results (machine.json,
//! placement.json, score.json or automl.json).
//!
//! Every figure is compared in its direction (higher is better for rates — FLOP/s, B/s, OP/s,
//! images/s —, lower for times and latencies): the change is the ratio of the headline figures
//! (a ceiling's best sample), and a confidence interval of the change of the samples' medians
//! comes from a bootstrap (both sample sets resampled with replacement, 2000 times, seeded, so
//! the verdict is reproducible). A regression is a change worse than the tolerance whose
//! interval excludes "no change" (a ratio of 1). The built-in tolerances come from the noise
//! model ([`noise`]); a rules file gives them per id pattern (globs: `*` any run of characters,
//! `?` one), with a default.

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

pub mod clock;
mod input;
pub mod noise;
pub mod reach;
mod sides;
#[cfg(test)]
use input::metric;
pub use input::{read_input, GateInput, Metric};
pub use sides::{sides, Named, Sides, SidesError};

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

/// The tolerance the built-in rules give one id ([`noise::tolerance`]): the widest of the
/// two files' own spreads, the spread between their runs where several are pooled, and the
/// run-to-run noise the project measured for its kind of figure, at least [`MIN_TOLERANCE`] and
/// at most [`MAX_TOLERANCE`].
pub fn spread_tolerance(b: &Metric, c: &Metric) -> f64 {
    noise::tolerance(b, c).clamp(MIN_TOLERANCE, MAX_TOLERANCE)
}

/// The built-in tolerance's floor (clock and timer resolution) and ceiling: a figure whose
/// noise is wider than the ceiling is reported as too noisy to judge, never as a regression.
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

/// Several runs of one kind as one: every id's samples and run values pooled over the runs
/// (so that the interval and the noise model see the run-to-run spread), its value the median
/// of the runs' values; the first run's provenance, every run's clock.
pub fn pool(runs: Vec<GateInput>) -> Option<GateInput> {
    let mut it = runs.into_iter();
    let mut first = it.next()?;
    let mut values: Vec<Vec<f64>> = first.metrics.iter().map(|m| m.runs.clone()).collect();
    for r in it {
        first.runs += r.runs;
        first.clocks.extend(r.clocks);
        for m in r.metrics {
            match first.metrics.iter().position(|f| f.id == m.id) {
                Some(i) => {
                    first.metrics[i].samples.extend(m.samples);
                    first.metrics[i].runs.extend(m.runs.iter().copied());
                    values[i].extend(m.runs);
                }
                None => {
                    values.push(m.runs.clone());
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
    /// Its noise between runs is beyond [`MAX_TOLERANCE`]: no change can be told from noise
    /// (pool more runs per side).
    Noisy,
    /// Worse beyond its tolerance, but its one-thread / all-core twin is not ([`noise::corroborate`]):
    /// what another tenant does to one measurement, or a change of that variant alone. A
    /// warning; a failure with `--strict`.
    Alone,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Improved => "improved",
            Verdict::Unchanged => "ok",
            Verdict::Regressed => "REGRESSED",
            Verdict::Noisy => "too noisy",
            Verdict::Alone => "fell alone",
        }
    }
}

/// One compared id.
#[derive(Clone, Debug, PartialEq)]
pub struct Comparison {
    pub id: String,
    pub unit: String,
    pub direction: Direction,
    /// The headline figures the change compares (a ceiling's value: its best sample).
    pub baseline: f64,
    pub current: f64,
    /// Relative change of the headline figures, signed so that negative is worse.
    pub change: f64,
    /// The bootstrap interval of the change of the samples' medians: a regression needs the
    /// samples to have moved as a whole (`high` below 0), not one sample.
    pub low: f64,
    pub high: f64,
    pub tolerance: f64,
    /// The smallest slowdown this comparison catches 19 times in 20 ([`noise::Noise::detectable`]);
    /// beyond [`noise::BLIND`] the id is reported as too noisy, never failed.
    pub detectable: f64,
    /// Where the tolerance came from: the runs of a calibrated baseline, or the prior.
    pub source: noise::Source,
    /// The measured one-core clock's change between the two results, where it moved (over
    /// [`clock::MOVED`]) and this clock-bound figure moved with it ([`clock::annotate`]).
    pub clock: Option<f64>,
    pub verdict: Verdict,
    pub samples: (usize, usize),
    /// Runs behind each side's figure (a calibrated baseline's, or pooled files).
    pub runs: (usize, usize),
}

/// Compares one metric.
pub fn compare(b: &Metric, c: &Metric, tolerance: f64, confidence: f64) -> Comparison {
    let seed = b.id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, x| {
        (h ^ x as u64).wrapping_mul(0x100_0000_01b3)
    });
    // The change is the headline figures' (a ceiling's best sample, a placement's best step, a
    // score's mean: what each file reports); the interval is the medians' (whether the
    // samples moved as a whole, not one sample). A ceiling's best sample moves far less
    // between quiet runs than its median: contention only slows samples down (20 pairs of
    // quick probes: the FMA peaks' medians fell up to 28%, their best samples 6%).
    let (_, lo, hi) = ratio_interval(&b.samples, &c.samples, confidence, seed);
    let r = if b.value > 0.0 && c.value > 0.0 {
        c.value / b.value
    } else {
        median(&mut c.samples.clone()) / median(&mut b.samples.clone())
    };
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
        baseline: b.value,
        current: c.value,
        change,
        low,
        high,
        tolerance,
        detectable: tolerance,
        source: noise::Source::Prior,
        clock: None,
        verdict,
        samples: (b.samples.len(), c.samples.len()),
        runs: (b.runs.len(), c.runs.len()),
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
    /// Set when the baseline has fewer than [`noise::MIN_RUNS`] runs: the tolerances come from
    /// the priors measured on other runners, not from this runner's (`probe --runs 5`).
    pub single_runs: bool,
    /// Runs behind each side (a calibrated baseline counts its runs).
    pub runs: (usize, usize),
    /// The measured one-core clock's change from the baseline to the current result.
    pub clock_change: Option<f64>,
    /// The clock-bound figures were compared per cycle (`--per-clock`).
    pub per_clock: bool,
    /// What the two figures of each row are, in words (the headline of each kind of result).
    pub figures: String,
}

/// More missing ids than this fail the gate unless they are allowed (`--allow-missing`).
pub const MISSING_ALLOWED: usize = 3;

impl Report {
    pub fn regressions(&self) -> usize {
        self.comparisons
            .iter()
            .filter(|c| c.verdict == Verdict::Regressed)
            .count()
    }

    /// Whether the gate fails, and why, in words (empty when it passes): regressions; more
    /// than [`MISSING_ALLOWED`] ids missing unless allowed; with `strict` any missing id, a
    /// ceiling that fell alone, or different software.
    pub fn failures(&self, policy: Policy) -> Vec<String> {
        let Policy {
            strict,
            allow_missing,
        } = policy;
        let mut out = Vec::new();
        let regressed = self.regressions();
        if regressed > 0 {
            out.push(format!("{regressed} regression(s)"));
        }
        let missing = self.missing.len();
        if missing > 0 && (strict || (missing > MISSING_ALLOWED && !allow_missing)) {
            out.push(format!(
                "{missing} of {} baseline ids missing from the current result{}",
                missing + self.comparisons.len() + self.ignored,
                if strict {
                    " (--strict)"
                } else {
                    " (--allow-missing gates the rest alone)"
                }
            ));
        }
        if strict && self.comparisons.iter().any(|c| c.verdict == Verdict::Alone) {
            out.push("a ceiling fell alone (--strict)".into());
        }
        if strict && !self.provenance.is_empty() {
            out.push("different software or settings (--strict)".into());
        }
        out
    }
}

/// What fails a gate beyond a regression.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    /// Missing ids, a ceiling that fell alone, different software: failures, not warnings.
    pub strict: bool,
    /// Any number of missing ids is a warning (a current result of fewer sections).
    pub allow_missing: bool,
}

/// How the gate compares, beyond its rules.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Options {
    /// Compare the clock-bound CPU ceilings per cycle of the measured one-core clock
    /// ([`clock::per_clock`]): for runners whose clock wanders, when the question is the
    /// code's and not the machine's.
    pub per_clock: bool,
}

/// Compares every id of `base` found in `cur`, with the default [`Options`].
pub fn gate(base: &GateInput, cur: &GateInput, rules: &Rules) -> Report {
    gate_with(base, cur, rules, Options::default())
}

/// Compares every id of `base` found in `cur`.
pub fn gate_with(base: &GateInput, cur: &GateInput, rules: &Rules, options: Options) -> Report {
    let (per_clock_base, per_clock_cur);
    // Per cycle only where both sides measured their clock (never cycles against seconds).
    let per_clock =
        options.per_clock && clock::clock_of(base).is_some() && clock::clock_of(cur).is_some();
    let (base, cur) = if per_clock {
        per_clock_base = clock::per_clock(base);
        per_clock_cur = clock::per_clock(cur);
        (&per_clock_base, &per_clock_cur)
    } else {
        (base, cur)
    };
    let mut comparisons = Vec::new();
    let mut noises = Vec::new();
    let mut missing = Vec::new();
    let mut ignored = 0;
    for b in &base.metrics {
        let Some(tol) = rules.tolerance(&b.id) else {
            ignored += 1;
            continue;
        };
        let Some(c) = cur.metrics.iter().find(|c| c.id == b.id) else {
            missing.push(b.id.clone());
            continue;
        };
        let n = noise::noise(b, c);
        let tolerance = if rules.from_spread {
            n.tolerance.clamp(MIN_TOLERANCE, MAX_TOLERANCE)
        } else {
            tol
        };
        let mut r = compare(b, c, tolerance, rules.default.confidence);
        r.source = n.source;
        comparisons.push(r);
        noises.push(n);
    }
    // The detectable regression, first as if each id stood alone; then a CPU ceiling whose
    // twin can be judged must fall with it: the slowdown at which both are caught (each at
    // √POWER), the larger of the two.
    let blind = |n: &noise::Noise, c: &Comparison| {
        rules.from_spread && (n.tolerance > MAX_TOLERANCE || c.detectable > noise::BLIND)
    };
    for (c, n) in comparisons.iter_mut().zip(&noises) {
        c.detectable = n.detectable(c.tolerance, false);
        if blind(n, c) {
            c.verdict = Verdict::Noisy;
        }
    }
    if rules.from_spread {
        let judged: Vec<String> = comparisons
            .iter()
            .filter(|c| c.verdict != Verdict::Noisy)
            .map(|c| c.id.clone())
            .collect();
        let both: Vec<f64> = comparisons
            .iter()
            .zip(&noises)
            .map(|(c, n)| n.detectable(c.tolerance, true))
            .collect();
        let at = |id: &str| comparisons.iter().position(|c| c.id == id);
        let twins: Vec<Option<usize>> = comparisons
            .iter()
            .map(|c| {
                noise::twin(&c.id)
                    .filter(|t| judged.contains(t))
                    .and_then(|t| at(&t))
            })
            .collect();
        let present: Vec<Option<usize>> = comparisons
            .iter()
            .map(|c| noise::twin(&c.id).and_then(|t| at(&t)))
            .collect();
        for (i, (c, n)) in comparisons.iter_mut().zip(&noises).enumerate() {
            // Caught only when both fall: the slowdown at which each does, at √POWER.
            if let Some(t) = twins[i] {
                c.detectable = both[i].max(both[t]);
                if blind(n, c) {
                    c.verdict = Verdict::Noisy;
                }
            } else if let Some(t) = present[i] {
                // Its twin is too noisy to confirm a fall, and one measurement's word is not
                // enough on a shared runner: it sees what the two see together.
                c.detectable = both[i].max(both[t]);
                c.verdict = Verdict::Noisy;
            }
        }
    }
    if rules.from_spread {
        noise::corroborate(&mut comparisons);
    }
    let clock_change = clock::change(base, cur);
    if let (Some(k), false) = (clock_change, per_clock) {
        clock::annotate(&mut comparisons, k);
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
        single_runs: rules.from_spread && base.runs < noise::MIN_RUNS,
        runs: (base.runs, cur.runs),
        clock_change,
        per_clock,
        figures: input::figures(base),
    }
}

/// What differs between two results' software and settings on one machine, in words (the
/// hardware that makes another machine is [`other_machine`]'s).
pub fn provenance_differences(a: &Provenance, b: &Provenance) -> Vec<String> {
    let mut out = Vec::new();
    let mut diff = |what: &str, x: String, y: String| {
        if x != y {
            out.push(format!("{what}: baseline {x}, current {y}"));
        }
    };
    // The hardware that makes another machine (family, model, cores, caches, SIMD, GPUs) is
    // the identity's ([`other_machine`]); here what may differ on the same machine.
    diff(
        "CPU name",
        a.cpu.model_name.clone(),
        b.cpu.model_name.clone(),
    );
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
mod tests;
