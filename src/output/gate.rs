//! `roofline gate`'s reports: a table, Markdown, JUnit XML, GitHub annotations.

use roofline_model::gate::{clock, reach, Comparison, Policy, Report, Verdict};
use roofline_plots::{report::escape, si};

fn value(v: f64, unit: &str) -> String {
    format!("{}{unit}", si(v))
}

fn pct(x: f64) -> String {
    format!("{:+.1}%", 100.0 * x)
}

/// One comparison in words: the two values, the change, its interval, the tolerance, what it
/// can detect, and the clock where it moved with it.
fn finding(c: &Comparison) -> String {
    format!(
        "{} → {} ({}, interval {} … {}, tolerance {:.0}%, detects {}{})",
        value(c.baseline, &c.unit),
        value(c.current, &c.unit),
        pct(c.change),
        pct(c.low),
        pct(c.high),
        100.0 * c.tolerance,
        detects(c),
        clock_note(c).map_or(String::new(), |n| format!(", {n}"))
    )
}

/// The smallest regression a comparison catches 19 times in 20.
fn detects(c: &Comparison) -> String {
    if c.detectable >= 10.0 {
        "nothing under 1000%".into()
    } else {
        format!("≥{:.0}%", 100.0 * c.detectable)
    }
}

/// "the clock moved −6.1% with it", where it did.
fn clock_note(c: &Comparison) -> Option<String> {
    c.clock
        .map(|k| format!("the clock moved {} with it", pct(k)))
}

/// The verdict's first words: pass or fail and why, and what was not compared or not gated.
pub fn summary(r: &Report, policy: Policy) -> String {
    let failures = r.failures(policy);
    let count = |v: Verdict| r.comparisons.iter().filter(|c| c.verdict == v).count();
    let (noisy, alone, improved) = (
        count(Verdict::Noisy),
        count(Verdict::Alone),
        count(Verdict::Improved),
    );
    let mut not_compared = Vec::new();
    if !r.missing.is_empty() && !failures.iter().any(|f| f.contains("missing")) {
        not_compared.push(format!(
            "{} ids not compared (missing from the current result)",
            r.missing.len()
        ));
    }
    if noisy > 0 {
        not_compared.push(format!(
            "{noisy} ids not gated (they cannot see a 30% regression here)"
        ));
    }
    let head = if failures.is_empty() {
        "PASS".to_string()
    } else {
        format!("FAIL: {}", failures.join("; "))
    };
    let head = if not_compared.is_empty() {
        head
    } else {
        format!("{head}, with {}", not_compared.join(" and "))
    };
    let mut o = format!(
        "{head} — {} ids compared, {improved} improved, {} new, {} ignored by the rules",
        r.comparisons.len(),
        r.added.len(),
        r.ignored
    );
    if alone > 0 {
        o += &format!(", {alone} fell alone (beyond its tolerance, its one-thread / all-core twin not: another tenant, or that variant alone; a failure with --strict)");
    }
    let reach = reach::sentence(r);
    if !reach.is_empty() {
        o += &format!(". {reach}");
    }
    o += &if r.single_runs {
        format!(" (a baseline of {} run(s): each tolerance is at least the run-to-run noise measured for its kind on other runners; `roofline probe --quick --runs 5` learns this runner's)", r.runs.0)
    } else {
        format!(
            " (tolerances from the {} runs of the baseline on this runner)",
            r.runs.0
        )
    };
    if let Some(k) = r
        .clock_change
        .filter(|k| k.abs() > clock::MOVED && !r.per_clock)
    {
        let moved = r.comparisons.iter().filter(|c| c.clock.is_some()).count();
        o += &format!(". The one-core clock moved {} between the two runs, and {moved} clock-bound figure(s) with it: --per-clock compares them per cycle", pct(k));
    }
    if r.per_clock {
        o +=
            ". Clock-bound figures compared per cycle of the measured one-core clock (--per-clock)";
    }
    o
}

pub fn table(r: &Report, policy: Policy, confidence: f64) -> String {
    let mut o = format!(
        "{:<40} {:>14} {:>14} {:>9} {:>20} {:>6} {:>8}  verdict\n",
        "id",
        "baseline",
        "current",
        "change",
        format!("{:.0}% interval", 100.0 * confidence),
        "tol.",
        "detects"
    );
    for c in &r.comparisons {
        o += &format!(
            "{:<40} {:>14} {:>14} {:>9} {:>20} {:>5.0}% {:>8}  {}{}\n",
            c.id,
            value(c.baseline, &c.unit),
            value(c.current, &c.unit),
            pct(c.change),
            format!("[{}, {}]", pct(c.low), pct(c.high)),
            100.0 * c.tolerance,
            detects(c),
            c.verdict.as_str(),
            clock_note(c).map_or(String::new(), |n| format!(" ({n})"))
        );
    }
    o += &format!(
        "({}; the interval: of the change of the samples' medians; detects: the smallest slowdown caught 19 times in 20)\n",
        r.figures
    );
    for m in &r.missing {
        o += &format!("missing from the current result: {m}\n");
    }
    for p in &r.provenance {
        o += &format!(
            "{}: the two results differ — {p}\n",
            if policy.strict { "error" } else { "warning" }
        );
    }
    o + &summary(r, policy) + "\n"
}

pub fn markdown(r: &Report, policy: Policy, confidence: f64) -> String {
    let mut o = format!("### roofline gate: {}\n\n", summary(r, policy));
    o += &format!(
        "| id | baseline | current | change | {:.0}% interval | tolerance | detects | verdict |\n|---|---:|---:|---:|---:|---:|---:|---|\n",
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
            "| `{}` | {} | {} | {} | {} … {} | {:.0}% | {} | {v}{} |\n",
            c.id,
            value(c.baseline, &c.unit),
            value(c.current, &c.unit),
            pct(c.change),
            pct(c.low),
            pct(c.high),
            100.0 * c.tolerance,
            detects(c),
            clock_note(c).map_or(String::new(), |n| format!(" ({n})"))
        );
    }
    o += &format!("\n{}.\n", r.figures);
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

/// The report as JSON (`roofline/gate/v1`): the verdict, why it fails, every comparison with
/// its tolerance and the smallest regression it detects, what was missing.
pub fn json(r: &Report, policy: Policy, confidence: f64) -> String {
    let failures = r.failures(policy);
    let rows: Vec<serde_json::Value> = r
        .comparisons
        .iter()
        .map(|c| {
            serde_json::json!({
                "id": c.id,
                "unit": c.unit,
                "baseline": c.baseline,
                "current": c.current,
                "change": c.change,
                "interval": [c.low, c.high],
                "tolerance": c.tolerance,
                "tolerance_from": match c.source {
                    roofline_model::gate::noise::Source::Runs => "runs",
                    roofline_model::gate::noise::Source::Prior => "prior",
                },
                "detectable": c.detectable,
                "verdict": c.verdict.as_str(),
                "clock_change": c.clock,
                "samples": [c.samples.0, c.samples.1],
                "runs": [c.runs.0, c.runs.1],
            })
        })
        .collect();
    let reach: Vec<serde_json::Value> = reach::reach(r)
        .iter()
        .map(|x| serde_json::json!({"family": x.family, "detectable": x.detectable, "ids": x.ids, "blind": x.blind}))
        .collect();
    let v = serde_json::json!({
        "schema": "roofline/gate/v1",
        "pass": failures.is_empty(),
        "failures": failures,
        "summary": summary(r, policy),
        "figures": r.figures,
        "confidence": confidence,
        "runs": {"baseline": r.runs.0, "current": r.runs.1},
        "clock_change": r.clock_change,
        "per_clock": r.per_clock,
        "comparisons": rows,
        "reach": reach,
        "missing": r.missing,
        "added": r.added,
        "provenance": r.provenance,
        "ignored": r.ignored,
    });
    serde_json::to_string_pretty(&v).unwrap_or_default()
}

pub fn junit(r: &Report, policy: Policy) -> String {
    let strict = policy.strict;
    let alone = r
        .comparisons
        .iter()
        .filter(|c| c.verdict == Verdict::Alone)
        .count();
    // Missing ids fail with --strict, or when more are missing than allowed.
    let missing_fail = r
        .failures(policy)
        .iter()
        .any(|f| f.contains("missing from the current result"));
    let failures = r.regressions()
        + if missing_fail { r.missing.len() } else { 0 }
        + if strict {
            usize::from(!r.provenance.is_empty()) + alone
        } else {
            0
        };
    let tests = r.comparisons.len() + r.missing.len() + usize::from(!r.provenance.is_empty());
    let skipped = if missing_fail { 0 } else { r.missing.len() };
    // The attributes the common xunit schema (Jenkins' junit-10) requires of a testsuite —
    // name, tests, failures, errors — and of a testcase — name.
    let mut o = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"roofline gate\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\">\n<testsuite name=\"roofline gate\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">\n"
    );
    // Each id's smallest detectable regression as a field a CI system can read (the schema
    // allows properties on a testsuite, not on a testcase).
    o += "  <properties>\n";
    o += &format!(
        "    <property name=\"summary\" value=\"{}\"/>\n",
        escape(&summary(r, policy))
    );
    for c in &r.comparisons {
        o += &format!(
            "    <property name=\"detectable/{}\" value=\"{:.4}\"/>\n",
            escape(&c.id),
            c.detectable
        );
    }
    o += "  </properties>\n";
    for c in &r.comparisons {
        let msg = finding(c);
        o += &format!(
            "  <testcase classname=\"roofline.gate\" name=\"{}\">",
            escape(&c.id)
        );
        if c.verdict == Verdict::Regressed {
            o += &format!("<failure message=\"regressed: {}\"/>", escape(&msg));
        } else if c.verdict == Verdict::Alone && strict {
            o += &format!(
                "<failure message=\"fell alone (--strict): {}\"/>",
                escape(&msg)
            );
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
            if missing_fail {
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
            if strict {
                format!("<failure message=\"{text}\"/>")
            } else {
                format!("<system-out>warning: {text}</system-out>")
            }
        );
    }
    o + "</testsuite>\n</testsuites>\n"
}

/// The JUnit report of a gate that refused to compare (bad input, other work, other hardware):
/// one test case in error saying why, so that a CI system reading the report file sees the
/// refusal rather than an empty file.
pub fn junit_refused(why: &str) -> String {
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"roofline gate\" tests=\"1\" failures=\"0\" errors=\"1\">\n<testsuite name=\"roofline gate\" tests=\"1\" failures=\"0\" errors=\"1\" skipped=\"0\">\n  <testcase classname=\"roofline.gate\" name=\"comparable\"><error message=\"{}\"/></testcase>\n</testsuite>\n</testsuites>\n",
        escape(why)
    )
}

/// How many annotations of one level GitHub shows per step.
pub const GITHUB_LIMIT: usize = 10;

/// GitHub Actions workflow commands, within what GitHub shows (10 annotations of each level
/// per step): the worst regressions as errors, the rest in one summary error; missing ids and
/// provenance as warnings (errors with --strict) the same way; a notice with the verdict.
pub fn github(r: &Report, policy: Policy) -> String {
    let strict = policy.strict;
    // Workflow-command data must not contain raw newlines or %.
    let clean = |s: &str| s.replace('%', "%25").replace('\n', "%0A");
    let mut regressed: Vec<&Comparison> = r
        .comparisons
        .iter()
        .filter(|c| c.verdict == Verdict::Regressed)
        .collect();
    regressed.sort_by(|a, b| a.change.total_cmp(&b.change));
    let level = if strict { "error" } else { "warning" };
    // (level, title, message), in the order shown.
    let mut notes: Vec<(&str, String, String)> = regressed
        .iter()
        .map(|c| {
            (
                "error",
                format!("roofline gate: {} regressed", c.id),
                finding(c),
            )
        })
        .collect();
    for c in r.comparisons.iter().filter(|c| c.verdict == Verdict::Alone) {
        notes.push((
            level,
            format!("roofline gate: {} fell alone", c.id),
            format!("{} (its one-thread / all-core twin did not)", finding(c)),
        ));
    }
    let missing_level = if r
        .failures(policy)
        .iter()
        .any(|f| f.contains("missing from the current result"))
    {
        "error"
    } else {
        level
    };
    for m in &r.missing {
        notes.push((
            missing_level,
            "roofline gate: missing id".into(),
            format!("{m} is missing from the current result"),
        ));
    }
    for p in &r.provenance {
        notes.push((
            level,
            "roofline gate: different machine or software".into(),
            p.clone(),
        ));
    }
    let mut o = String::new();
    for lv in ["error", "warning"] {
        let these: Vec<&(&str, String, String)> = notes.iter().filter(|n| n.0 == lv).collect();
        let shown = if these.len() > GITHUB_LIMIT {
            GITHUB_LIMIT - 1
        } else {
            these.len()
        };
        for (_, title, msg) in &these[..shown] {
            o += &format!("::{lv} title={}::{}\n", clean(title), clean(msg));
        }
        if these.len() > shown {
            let rest: Vec<String> = these[shown..]
                .iter()
                .map(|(_, t, m)| format!("{}: {m}", t.trim_start_matches("roofline gate: ")))
                .collect();
            o += &format!(
                "::{lv} title=roofline gate: {} more::{}\n",
                rest.len(),
                clean(&rest.join("\n"))
            );
        }
    }
    o + &format!(
        "::notice title=roofline gate::{}\n",
        clean(&summary(r, policy))
    )
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
