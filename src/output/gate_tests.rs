//! The gate reports' tests: GitHub's limits, the xunit schema.
use super::*;
use roofline_model::gate::Direction;

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
        verdict: Verdict::Regressed,
        samples: (5, 5),
    };
    Report {
        comparisons: (0..regressions).map(c).collect(),
        missing: vec!["cpu/fma/f64/all".into()],
        added: vec![],
        provenance: vec!["kernel: baseline a, current b".into()],
        ignored: 0,
        single_runs: true,
    }
}

#[test]
fn github_annotations_stay_within_its_limits() {
    let gh = github(&report(37), false);
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
    let few = github(&report(3), true);
    assert_eq!(few.lines().filter(|l| l.starts_with("::error")).count(), 5);
}

/// Against the common xunit schema (Jenkins' junit-10): testsuite has name, tests,
/// failures and errors; every testcase a name; a testcase holds only skipped, error,
/// failure, system-out and system-err; the counts match the cases.
#[test]
fn junit_has_what_the_xunit_schema_requires() {
    for strict in [false, true] {
        let x = junit(&report(4), strict);
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
    }
}
