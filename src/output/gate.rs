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
    } else if strict && (!r.missing.is_empty() || !r.provenance.is_empty()) {
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

pub fn table(r: &Report, strict: bool, confidence: f64) -> String {
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
            if strict { "error" } else { "warning" }
        );
    }
    o + &summary(r, strict) + "\n"
}

pub fn markdown(r: &Report, strict: bool, confidence: f64) -> String {
    let mut o = format!("### roofline gate: {}\n\n", summary(r, strict));
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

pub fn junit(r: &Report, strict: bool) -> String {
    let failures = r.regressions()
        + if strict {
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

/// GitHub Actions workflow commands: one annotation per finding, a notice with the summary.
pub fn github(r: &Report, strict: bool) -> String {
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
    let level = if strict { "error" } else { "warning" };
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
    o + &format!(
        "::notice title=roofline gate::{}\n",
        clean(&summary(r, strict))
    )
}
