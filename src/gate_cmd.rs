//! `roofline gate`: fails a CI job when a result regressed against its baseline, not on noise.

use crate::exit::Failure;
use crate::output::gate as gate_out;
use anyhow::anyhow;
use roofline_model::gate::{gate_with, read_input, sides, Named, Options, Policy, Rules, Sides};
use roofline_model::write::write_atomic;
use std::path::PathBuf;

/// How the gate's report is written.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    /// A table on stdout.
    Text,
    /// A Markdown table (a pull-request comment).
    Markdown,
    /// JUnit XML (one test case per id).
    Junit,
    /// GitHub Actions annotations.
    Github,
    /// JSON (`roofline/gate/v1`): the verdict, and every id's change, tolerance and smallest
    /// detectable regression.
    Json,
}

#[derive(clap::Args)]
pub struct GateArgs {
    /// The baseline result: a machine.json, placement.json, score.json or automl.json. Best a
    /// calibrated one, `roofline probe --quick --runs 5` on the runner that will gate: each
    /// id is then held to the spread measured between those runs, here, rather than to the
    /// built-in table measured on other runners. Several files (runs of the same kind) are
    /// pooled the same way: with 3 or more, their spread sets the tolerances.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub baseline: Vec<PathBuf>,
    /// The current result(s), of the same kind.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub current: Vec<PathBuf>,
    /// Tolerances per id pattern (TOML): `[default] tolerance = 0.10, confidence = 0.95` and
    /// `[[rule]] pattern = "cpu/mem/*" tolerance = 0.15` (first match wins; `ignore = true`
    /// leaves ids out). It replaces the built-in rules: with a calibrated baseline (3 runs or
    /// more) each id's tolerance comes from the spread between its runs (a 1% chance per id of
    /// failing an unchanged runner); with one run, it is the widest of the files' own spread
    /// and the run-to-run noise measured for its kind of figure on other runners
    /// (docs/gate.md). Either way a CPU ceiling that fell without its one-thread / all-core
    /// twin is a warning, and an id that cannot see a 30% regression is reported, not
    /// gated. Files of different work (workload, shapes, batch, precision, threads, ranks), of
    /// different hardware or measured on a busy machine are refused (exit 2) before any rule.
    #[arg(long, value_name = "TOML")]
    pub rules: Option<PathBuf>,
    /// text (a table), markdown (for a pull-request comment), junit (XML for CI systems), github
    /// (workflow annotations).
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Fail (exit 1) also when any id is missing from the current result, when a CPU ceiling
    /// fell alone (beyond its tolerance, its one-thread / all-core twin not), or when the two
    /// were measured with different clocks, power limits, drivers or libraries.
    #[arg(long)]
    pub strict: bool,
    /// Pass with any number of baseline ids missing from the current result (a current run of
    /// fewer sections, `probe --only fma`); without it more than 3 missing fail the gate.
    #[arg(long, conflicts_with = "strict")]
    pub allow_missing: bool,
    /// Compare the clock-bound CPU ceilings (FMA, GEMM, convolutions, L1–L3) per cycle of each
    /// run's measured one-core clock, for runners whose clock wanders: the code's question ("did
    /// this change slow the kernel?"). Leave it off for a fleet or health check, where a slower
    /// clock is the finding.
    #[arg(long)]
    pub per_clock: bool,
    /// Compare results from different hardware (another CPU family, model or stepping, other
    /// cores, caches, SIMD, GPUs or clock class) with a warning, where gate otherwise refuses
    /// them (exit 2): their difference is the hardware's.
    #[arg(long)]
    pub allow_other_machine: bool,
    /// Compare, report, then make the current result the new baseline (written atomically);
    /// exits 0 unless the input is bad.
    #[arg(long)]
    pub update_baseline: bool,
}

pub fn run(a: &GateArgs) -> Result<std::process::ExitCode, Failure> {
    let r = compare(a);
    if let (Err(Failure::Input(e)), Format::Junit) = (&r, a.format) {
        // The report file a CI system reads says why there is no comparison.
        out!("{}", gate_out::junit_refused(&crate::exit::causes(e)));
    }
    r
}

fn compare(a: &GateArgs) -> Result<std::process::ExitCode, Failure> {
    let input = |e: String| Failure::Input(anyhow!(e));
    let read = |p: &PathBuf| -> Result<(String, roofline_model::gate::GateInput), Failure> {
        let text = std::fs::read_to_string(p)
            .map_err(|e| input(format!("cannot read {}: {e}", p.display())))?;
        let g = read_input(&text).map_err(|e| input(format!("{}: {e}", p.display())))?;
        Ok((text, g))
    };
    let names = |v: &[PathBuf]| {
        v.iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(" ")
    };
    if a.update_baseline && (a.baseline.len() != 1 || a.current.len() != 1) {
        return Err(input(
            "--update-baseline replaces one baseline file with one current file".into(),
        ));
    }
    let mut currents = Vec::new();
    for p in &a.current {
        currents.push(read(p)?);
    }
    let current_text = currents[0].0.clone();
    if a.update_baseline && !a.baseline[0].exists() {
        // The first baseline.
        write_atomic(&a.baseline[0], current_text.as_bytes())
            .map_err(|e| Failure::Input(e.into()))?;
        eprintln!(
            "no baseline yet: {} now holds {} ({} ids)",
            a.baseline[0].display(),
            a.current[0].display(),
            currents[0].1.metrics.len()
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    let named = |n: &PathBuf, input| Named {
        name: n.display().to_string(),
        input,
    };
    let mut baseline = Vec::new();
    for p in &a.baseline {
        baseline.push(named(p, read(p)?.1));
    }
    let current = a
        .current
        .iter()
        .zip(currents)
        .map(|(p, c)| named(p, c.1))
        .collect();
    let Sides {
        base,
        current: cur,
        warnings,
    } = sides(baseline, current, a.allow_other_machine, a.per_clock)
        .map_err(|e| Failure::Input(e.into()))?;
    for w in warnings {
        eprintln!("warning: {w}");
    }
    let rules = match &a.rules {
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .map_err(|e| input(format!("cannot read {}: {e}", p.display())))?;
            Rules::parse(&t).map_err(|e| input(format!("{}: {e}", p.display())))?
        }
        None => Rules::default(),
    };
    let options = Options {
        per_clock: a.per_clock,
    };
    let r = gate_with(&base, &cur, &rules, options);
    if a.per_clock && !r.per_clock {
        eprintln!("warning: --per-clock: a result without a measured one-core clock (not a probe's, or an older file); every figure compared per second");
    }
    if r.comparisons.is_empty() {
        return Err(input(format!(
            "{} and {} have no id in common: nothing to compare",
            names(&a.baseline),
            names(&a.current)
        )));
    }
    let policy = Policy {
        strict: a.strict,
        allow_missing: a.allow_missing,
    };
    let failed = !r.failures(policy).is_empty();
    let confidence = rules.default.confidence;
    let text = match a.format {
        Format::Markdown => gate_out::markdown(&r, policy, confidence),
        Format::Junit => gate_out::junit(&r, policy),
        Format::Github => gate_out::github(&r, policy),
        Format::Json => gate_out::json(&r, policy, confidence),
        Format::Text => gate_out::table(&r, policy, confidence),
    };
    out!("{text}");
    if a.update_baseline {
        write_atomic(&a.baseline[0], current_text.as_bytes())
            .map_err(|e| Failure::Input(e.into()))?;
        eprintln!(
            "updated the baseline: {} now holds {}",
            a.baseline[0].display(),
            a.current[0].display()
        );
        return Ok(std::process::ExitCode::SUCCESS);
    }
    Ok(if failed {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}
