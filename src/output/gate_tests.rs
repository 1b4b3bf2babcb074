//! The gate reports' tests: GitHub's limits, the xunit schema.
use super::*;
use roofline_model::gate::{noise::Source, Direction};

fn report(regressions: usize) -> Report {
    let c = |i: usize| Comparison {
        id: format!("cpu/mem/L{i}/read/all"),
        unit: "B/s".into(),
        direction: Direction::Higher,
        baseline: 100.0,
        current: 50.0 + i as f64,
        change: -0.5 + 0.01 * i as f64,
        low: -0.6,
        high: -0.4,
        tolerance: 0.1,
        detectable: 0.14,
        source: Source::Prior,
        clock: None,
        verdict: Verdict::Regressed,
        samples: (5, 5),
        runs: (1, 1),
    };
    Report {
        comparisons: (0..regressions).map(c).collect(),
        missing: vec!["cpu/fma/f64/all".into()],
        added: vec![],
        provenance: vec!["kernel: baseline a, current b".into()],
        ignored: 0,
        single_runs: true,
        runs: (1, 1),
        clock_change: None,
        per_clock: false,
        figures: "each figure is a ceiling: its best sample".into(),
    }
}

fn policy(strict: bool) -> Policy {
    Policy {
        strict,
        allow_missing: false,
    }
}

#[test]
fn github_annotations_stay_within_its_limits() {
    let gh = github(&report(37), policy(false));
    let errors: Vec<&str> = gh.lines().filter(|l| l.starts_with("::error")).collect();
    assert_eq!(errors.len(), GITHUB_LIMIT);
    // The worst first (the most negative change), the 28 others in one summary.
    assert!(errors[0].contains("cpu/mem/L0/read/all regressed"), "{gh}");
    assert!(
        errors[9].starts_with("::error title=roofline gate: 28 more::"),
        "{gh}"
    );
    assert_eq!(gh.lines().filter(|l| l.starts_with("::warning")).count(), 2);
    assert_eq!(gh.lines().filter(|l| l.starts_with("::notice")).count(), 1);
    let few = github(&report(3), policy(true));
    assert_eq!(few.lines().filter(|l| l.starts_with("::error")).count(), 5);
}

/// Against the common xunit schema (Jenkins' junit-10): testsuite has name, tests,
/// failures and errors; every testcase a name; a testcase holds only skipped, error,
/// failure, system-out and system-err; the counts match the cases.
#[test]
fn junit_has_what_the_xunit_schema_requires() {
    for strict in [false, true] {
        let x = junit(&report(4), policy(strict));
        let attrs = |tag: &str| -> Vec<String> {
            x.match_indices(&format!("<{tag} "))
                .map(|(i, _)| x[i..i + x[i..].find('>').unwrap()].to_string())
                .collect()
        };
        let suites = attrs("testsuite");
        assert_eq!(suites.len(), 1);
        for a in ["name=", "tests=\"6\"", "errors=\"0\"", "skipped="] {
            assert!(suites[0].contains(a), "{a} in {}", suites[0]);
        }
        let failures = if strict {
            "failures=\"6\""
        } else {
            "failures=\"4\""
        };
        assert!(suites[0].contains(failures), "{}", suites[0]);
        let cases = attrs("testcase");
        assert_eq!(cases.len(), 6);
        assert!(cases.iter().all(|c| c.contains(" name=\"")));
        for (i, _) in x.match_indices("<testcase ") {
            let end = i + x[i..].find("</testcase>").unwrap();
            let inner = &x[i + x[i..].find('>').unwrap() + 1..end];
            for (j, _) in inner.match_indices('<') {
                let name: String = inner[j + 1..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '-' || *c == '/')
                    .collect();
                let name = name.trim_start_matches('/');
                assert!(
                    ["skipped", "error", "failure", "system-out", "system-err"].contains(&name),
                    "<{name}> in a testcase"
                );
            }
        }
        // Each id's detectable regression is a property of the suite (junit-10 allows
        // properties there, before the cases), and in each case's message.
        let props = x.find("<properties>").unwrap();
        assert!(props < x.find("<testcase ").unwrap());
        assert!(x.contains("<property name=\"detectable/cpu/mem/L0/read/all\" value=\"0.1400\"/>"));
        assert!(x.contains("detects ≥14%"), "{x}");
    }
}

/// The verdict's first words say what was not compared: many missing ids fail unless allowed,
/// a few are named; ids that cannot see 30% are counted apart. The table names its figures
/// for what they are (never "median" for a best sample).
#[test]
fn the_verdict_says_what_was_not_compared() {
    let mut r = report(0);
    r.comparisons = vec![];
    let c = report(1).comparisons[0].clone();
    r.comparisons.push(Comparison {
        verdict: Verdict::Unchanged,
        change: 0.0,
        ..c.clone()
    });
    r.missing = (0..39).map(|i| format!("cpu/x/{i}")).collect();
    let s = summary(&r, policy(false));
    assert!(
        s.starts_with("FAIL: 39 of 40 baseline ids missing from the current result"),
        "{s}"
    );
    let allowed = Policy {
        strict: false,
        allow_missing: true,
    };
    assert!(r.failures(allowed).is_empty());
    let s = summary(&r, allowed);
    assert!(
        s.starts_with("PASS, with 39 ids not compared (missing from the current result)"),
        "{s}"
    );
    r.missing.truncate(2);
    assert!(r.failures(policy(false)).is_empty());
    assert!(!r.failures(policy(true)).is_empty());
    r.comparisons.push(Comparison {
        id: "cpu/mem/DRAM/read/all".into(),
        verdict: Verdict::Noisy,
        detectable: 0.65,
        ..c
    });
    let s = summary(&r, policy(false));
    assert!(s.contains("1 ids not gated"), "{s}");
    assert!(
        s.contains("caught 19 times in 20 from: L0 14%; not gated, they cannot see 30% on this runner: DRAM only 65% or more"),
        "{s}"
    );
    let t = table(&r, policy(false), 0.95);
    assert!(!t.contains("med."), "{t}");
    assert!(
        t.contains("each figure is a ceiling: its best sample"),
        "{t}"
    );
    let j: serde_json::Value = serde_json::from_str(&json(&r, policy(false), 0.95)).unwrap();
    assert_eq!(j["comparisons"][1]["detectable"], 0.65);
    assert_eq!(j["comparisons"][1]["verdict"], "too noisy");
    assert_eq!(j["pass"], true);
}
