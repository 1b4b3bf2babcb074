//! `roofline gate`: fails a CI job when a result regressed against its baseline, not on noise.

use crate::Failure;
use anyhow::anyhow;
use roofline_model::gate::{gate, pool, read_input, Comparison, Report, Rules, Verdict};
use roofline_model::write::write_atomic;
use roofline_plots::{report::escape, si};
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
}

#[derive(clap::Args)]
pub struct GateArgs {
    /// The baseline result: a machine.json, placement.json or score.json. Several files (runs
    /// of the same kind) are pooled: every id's samples over all of them, so that the interval
    /// includes the run-to-run spread (use this on noisy machines).
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub baseline: Vec<PathBuf>,
    /// The current result(s), of the same kind.
    #[arg(long, value_name = "FILE", num_args = 1.., required = true)]
    pub current: Vec<PathBuf>,
    /// Tolerances per id pattern (TOML): `[default] tolerance = 0.10, confidence = 0.95` and
    /// `[[rule]] pattern = "cpu/mem/*" tolerance = 0.15` (first match wins; `ignore = true`
    /// leaves ids out); it replaces the built-in rules: 10% at 95% confidence, except DRAM
    /// bandwidth 65%, HBM 25%, other memory levels 20%, GEMM and convolution 25%, network and
    /// storage 50% (what moves between runs of one shared VM; tighten them on dedicated nodes).
    #[arg(long, value_name = "TOML")]
    pub rules: Option<PathBuf>,
    /// text (a table), markdown (for a pull-request comment), junit (XML for CI systems), github
    /// (workflow annotations).
    #[arg(long, value_enum, default_value = "text")]
    pub format: Format,
    /// Fail (exit 1) also when ids are missing from the current result, or when the two were
    /// measured on different hardware, clocks, power limits, drivers or libraries.
    #[arg(long)]
    pub strict: bool,
    /// Compare, report, then make the current result the new baseline (written atomically);
    /// exits 0 unless the input is bad.
    #[arg(long)]
    pub update_baseline: bool,
}

pub fn run(a: &GateArgs) -> Result<std::process::ExitCode, Failure> {
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
    let mut bases = Vec::new();
    for p in &a.baseline {
        bases.push(read(p)?.1);
    }
    let kinds = |v: &[roofline_model::gate::GateInput]| {
        v.iter()
            .map(|g| g.kind)
            .collect::<std::collections::BTreeSet<_>>()
    };
    let currents: Vec<_> = currents.into_iter().map(|c| c.1).collect();
    let (kb, kc) = (kinds(&bases), kinds(&currents));
    if kb.len() != 1 || kb != kc {
        return Err(input(format!(
            "{} and {} are results of kinds {:?} and {:?}: gate compares results of one kind",
            names(&a.baseline),
            names(&a.current),
            kb,
            kc
        )));
    }
    let (Some(base), Some(cur)) = (pool(bases), pool(currents)) else {
        return Err(input("nothing to compare".into()));
    };
    let rules = match &a.rules {
        Some(p) => {
            let t = std::fs::read_to_string(p)
                .map_err(|e| input(format!("cannot read {}: {e}", p.display())))?;
            Rules::parse(&t).map_err(|e| input(format!("{}: {e}", p.display())))?
        }
        None => Rules::default(),
    };
    let r = gate(&base, &cur, &rules);
    if r.comparisons.is_empty() {
        return Err(input(format!(
            "{} and {} have no id in common: nothing to compare",
            names(&a.baseline),
            names(&a.current)
        )));
    }
    let regressed = r.regressions();
    let strict_fail = a.strict && (!r.missing.is_empty() || !r.provenance.is_empty());
    let text = match a.format {
        Format::Markdown => markdown(&r, a, rules.default.confidence),
        Format::Junit => junit(&r, a),
        Format::Github => github(&r, a),
        Format::Text => table(&r, a, rules.default.confidence),
    };
    print!("{text}");
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
    Ok(if regressed > 0 || strict_fail {
        std::process::ExitCode::from(1)
    } else {
        std::process::ExitCode::SUCCESS
    })
}

fn value(v: f64, unit: &str) -> String {
    format!("{}{unit}", si(v))
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", 100.0 * x)
}

/// One comparison in words: the two values, the change, its interval and the tolerance.
fn finding(c: &Comparison) -> String {
    format!(
        "{} → {} ({}, interval {} … {}, tolerance {:.0}%)",
        value(c.baseline, &c.unit),
        value(c.current, &c.unit),
        pct(c.change),
        pct(c.low),
        pct(c.high),
        100.0 * c.tolerance
    )
}

fn summary(r: &Report, a: &GateArgs) -> String {
    let regressed = r.regressions();
    let improved = r
        .comparisons
        .iter()
        .filter(|c| c.verdict == Verdict::Improved)
        .count();
    let verdict = if regressed > 0 {
        format!("FAIL: {regressed} regression(s)")
    } else if a.strict && (!r.missing.is_empty() || !r.provenance.is_empty()) {
        "FAIL (--strict): missing ids or a different machine/software".to_string()
    } else {
        "PASS".to_string()
    };
    format!(
        "{verdict} — {} ids compared, {improved} improved, {} missing, {} new, {} ignored by the rules",
        r.comparisons.len(),
        r.missing.len(),
        r.added.len(),
        r.ignored
    )
}

fn table(r: &Report, a: &GateArgs, confidence: f64) -> String {
    let mut o = format!(
        "{:<40} {:>14} {:>14} {:>9} {:>20} {:>6}  verdict\n",
        "id",
        "baseline",
        "current",
        "change",
        format!("{:.0}% interval", 100.0 * confidence),
        "tol."
    );
    for c in &r.comparisons {
        o += &format!(
            "{:<40} {:>14} {:>14} {:>9} {:>20} {:>5.0}%  {}\n",
            c.id,
            value(c.baseline, &c.unit),
            value(c.current, &c.unit),
            pct(c.change),
            format!("[{}, {}]", pct(c.low), pct(c.high)),
            100.0 * c.tolerance,
            c.verdict.as_str()
        );
    }
    for m in &r.missing {
        o += &format!("missing from the current result: {m}\n");
    }
    for p in &r.provenance {
        o += &format!(
            "{}: the two results differ — {p}\n",
            if a.strict { "error" } else { "warning" }
        );
    }
    o + &summary(r, a) + "\n"
}

fn markdown(r: &Report, a: &GateArgs, confidence: f64) -> String {
    let mut o = format!("### roofline gate: {}\n\n", summary(r, a));
    o += &format!(
        "| id | baseline | current | change | {:.0}% interval | tolerance | verdict |\n|---|---:|---:|---:|---:|---:|---|\n",
        100.0 * confidence
    );
    // Regressions first.
    let mut rows: Vec<&Comparison> = r.comparisons.iter().collect();
    rows.sort_by_key(|c| c.verdict != Verdict::Regressed);
    for c in rows {
        let v = if c.verdict == Verdict::Regressed {
            format!("**{}**", c.verdict.as_str())
        } else {
            c.verdict.as_str().to_string()
        };
        o += &format!(
            "| `{}` | {} | {} | {} | {} … {} | {:.0}% | {v} |\n",
            c.id,
            value(c.baseline, &c.unit),
            value(c.current, &c.unit),
            pct(c.change),
            pct(c.low),
            pct(c.high),
            100.0 * c.tolerance
        );
    }
    if !r.missing.is_empty() {
        o += &format!(
            "\nMissing from the current result: {}\n",
            r.missing
                .iter()
                .map(|m| format!("`{m}`"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    if !r.provenance.is_empty() {
        o += "\n**The two results were measured on different machines or software** (a regression may be the machine's):\n\n";
        for p in &r.provenance {
            o += &format!("- {p}\n");
        }
    }
    o
}

fn junit(r: &Report, a: &GateArgs) -> String {
    let failures = r.regressions()
        + if a.strict {
            r.missing.len() + usize::from(!r.provenance.is_empty())
        } else {
            0
        };
    let tests = r.comparisons.len() + r.missing.len() + usize::from(!r.provenance.is_empty());
    let mut o = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"roofline gate\" tests=\"{tests}\" failures=\"{failures}\">\n<testsuite name=\"roofline gate\" tests=\"{tests}\" failures=\"{failures}\">\n"
    );
    for c in &r.comparisons {
        let msg = finding(c);
        o += &format!(
            "  <testcase classname=\"roofline.gate\" name=\"{}\">",
            escape(&c.id)
        );
        if c.verdict == Verdict::Regressed {
            o += &format!("<failure message=\"regressed: {}\"/>", escape(&msg));
        } else {
            o += &format!(
                "<system-out>{}: {}</system-out>",
                c.verdict.as_str(),
                escape(&msg)
            );
        }
        o += "</testcase>\n";
    }
    for m in &r.missing {
        o += &format!(
            "  <testcase classname=\"roofline.gate\" name=\"{}\">{}</testcase>\n",
            escape(m),
            if a.strict {
                "<failure message=\"missing from the current result\"/>"
            } else {
                "<skipped message=\"missing from the current result\"/>"
            }
        );
    }
    if !r.provenance.is_empty() {
        let text = escape(&r.provenance.join("; "));
        o += &format!(
            "  <testcase classname=\"roofline.gate\" name=\"provenance\">{}</testcase>\n",
            if a.strict {
                format!("<failure message=\"{text}\"/>")
            } else {
                format!("<system-out>warning: {text}</system-out>")
            }
        );
    }
    o + "</testsuite>\n</testsuites>\n"
}

/// GitHub Actions workflow commands: one annotation per finding, a notice with the summary.
fn github(r: &Report, a: &GateArgs) -> String {
    // Workflow-command data must not contain raw newlines or %.
    let clean = |s: &str| s.replace('%', "%25").replace('\n', "%0A");
    let mut o = String::new();
    for c in r
        .comparisons
        .iter()
        .filter(|c| c.verdict == Verdict::Regressed)
    {
        o += &format!(
            "::error title=roofline gate: {} regressed::{}\n",
            clean(&c.id),
            clean(&finding(c))
        );
    }
    let level = if a.strict { "error" } else { "warning" };
    for m in &r.missing {
        o += &format!(
            "::{level} title=roofline gate: missing id::{} is missing from the current result\n",
            clean(m)
        );
    }
    for p in &r.provenance {
        o += &format!(
            "::{level} title=roofline gate: different machine or software::{}\n",
            clean(p)
        );
    }
    o + &format!("::notice title=roofline gate::{}\n", clean(&summary(r, a)))
}
