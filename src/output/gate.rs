//! `roofline gate`'s reports: a table, Markdown, JUnit XML, GitHub annotations.

use roofline_model::gate::{Comparison, Report, Verdict};
use roofline_plots::{report::escape, si};

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

pub fn summary(r: &Report, strict: bool) -> String {
    let regressed = r.regressions();
    let improved = r
        .comparisons
        .iter()
        .filter(|c| c.verdict == Verdict::Improved)
        .count();
    let verdict = if regressed > 0 {
        format!("FAIL: {regressed} regression(s)")
    } else if strict
        && (!r.missing.is_empty()
            || !r.provenance.is_empty()
            || r.comparisons.iter().any(|c| c.verdict == Verdict::Alone))
    {
        "FAIL (--strict): missing ids, a ceiling that fell alone, or different software".to_string()
    } else {
        "PASS".to_string()
    };
    let count = |v: Verdict| r.comparisons.iter().filter(|c| c.verdict == v).count();
    let (noisy, alone) = (count(Verdict::Noisy), count(Verdict::Alone));
    format!(
        "{verdict} — {} ids compared, {improved} improved, {} missing, {} new, {} ignored by the rules{}{}",
        r.comparisons.len(),
        r.missing.len(),
        r.added.len(),
        r.ignored,
        if noisy > 0 {
            format!(", {noisy} too noisy to judge (their run-to-run noise is over 50%: pool several runs per side to gate them)")
        } else {
            String::new()
        } + &if alone > 0 {
            format!(", {alone} fell alone (beyond its tolerance, its one-thread / all-core twin not: another tenant, or that variant alone; a failure with --strict)")
        } else {
            String::new()
        },
        if r.single_runs {
            " (one run per side: each tolerance includes the run-to-run noise measured for its kind of figure)"
        } else {
            ""
        }
    )
}

pub fn table(r: &Report, strict: bool, confidence: f64) -> String {
    let mut o = format!(
        "{:<40} {:>14} {:>14} {:>9} {:>20} {:>6}  verdict\n",
        "id",
        "baseline (med.)",
        "current (med.)",
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
            if strict { "error" } else { "warning" }
        );
    }
    o + &summary(r, strict) + "\n"
}

pub fn markdown(r: &Report, strict: bool, confidence: f64) -> String {
    let mut o = format!("### roofline gate: {}\n\n", summary(r, strict));
    o += &format!(
        "| id | baseline (median) | current (median) | change | {:.0}% interval | tolerance | verdict |\n|---|---:|---:|---:|---:|---:|---|\n",
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

pub fn junit(r: &Report, strict: bool) -> String {
    let alone = r
        .comparisons
        .iter()
        .filter(|c| c.verdict == Verdict::Alone)
        .count();
    let failures = r.regressions()
        + if strict {
            r.missing.len() + usize::from(!r.provenance.is_empty()) + alone
        } else {
            0
        };
    let tests = r.comparisons.len() + r.missing.len() + usize::from(!r.provenance.is_empty());
    let skipped = if strict { 0 } else { r.missing.len() };
    // The attributes the common xunit schema (Jenkins' junit-10) requires of a testsuite —
    // name, tests, failures, errors — and of a testcase — name.
    let mut o = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<testsuites name=\"roofline gate\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\">\n<testsuite name=\"roofline gate\" tests=\"{tests}\" failures=\"{failures}\" errors=\"0\" skipped=\"{skipped}\">\n"
    );
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
            if strict {
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
pub fn github(r: &Report, strict: bool) -> String {
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
    for m in &r.missing {
        notes.push((
            level,
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
        clean(&summary(r, strict))
    )
}

#[cfg(test)]
#[path = "gate_tests.rs"]
mod tests;
