//! `roofline probe --runs N` and `roofline gate` against such a calibrated baseline, end to end:
//! the baseline keeps every run, the gate says where each tolerance came from and what each
//! id can detect, missing ids fail unless allowed, and a busy file is blamed by its own name.

mod common;

use common::*;

/// The current result, rewritten: the load check's verdict dropped (other tests run beside
/// this one) and `edit` applied.
fn rewrite(path: &std::path::Path, edit: impl Fn(&mut serde_json::Value)) {
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    m["provenance"].as_object_mut().unwrap().remove("load");
    edit(&mut m);
    std::fs::write(path, serde_json::to_string(&m).unwrap()).unwrap();
}

#[test]
fn a_calibrated_baseline_gates_with_what_each_id_can_see() {
    let _machine = alone();
    let dir = tmpdir("gate-calibrated");
    let base = dir.join("base.json");
    let o = bin()
        .args(["probe", "--quick", "--only", "fma", "--runs", "3", "-o"])
        .arg(&base)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("run-to-run spread of the ceilings"), "{out}");
    assert!(
        out.contains("3 runs merged into one calibrated baseline"),
        "{out}"
    );
    let err = stderr(&o);
    assert!(err.contains("run 3 of 3"), "{err}");
    rewrite(&base, |_| {});
    let m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&base).unwrap()).unwrap();
    let cal = &m["calibration"];
    assert_eq!(cal["asked"], 3);
    let runs = cal["runs"].as_array().unwrap();
    assert!(!runs.is_empty() && runs.len() <= 3, "{cal}");
    for c in m["ceilings"].as_array().unwrap() {
        let id = c["id"].as_str().unwrap();
        // Each ceiling is one of its runs' (the median run's), never an average.
        let values: Vec<f64> = runs
            .iter()
            .map(|r| r["values"][id].as_f64().unwrap())
            .collect();
        assert!(
            values.contains(&c["value"].as_f64().unwrap()),
            "{id}: {values:?}"
        );
    }
    // The baseline against itself, as JSON: every id says where its tolerance came from and
    // the slowdown it would catch 19 times in 20.
    let cur = dir.join("cur.json");
    std::fs::copy(&base, &cur).unwrap();
    let gate = |extra: &[&str]| {
        bin()
            .arg("gate")
            .arg("--baseline")
            .arg(&base)
            .arg("--current")
            .arg(&cur)
            .args(extra)
            .output()
            .unwrap()
    };
    let o = gate(&["--format", "json"]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let j: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(j["schema"], "roofline/gate/v1");
    assert_eq!(j["pass"], true);
    assert_eq!(j["runs"]["baseline"], runs.len());
    for c in j["comparisons"].as_array().unwrap() {
        let d = c["detectable"].as_f64().unwrap();
        assert!(d > 0.0 && d.is_finite(), "{c}");
        assert!(
            ["runs", "prior"].contains(&c["tolerance_from"].as_str().unwrap()),
            "{c}"
        );
    }
    let o = gate(&[]);
    let table = String::from_utf8_lossy(&o.stdout);
    assert!(
        table.contains("detects") && !table.contains("med."),
        "{table}"
    );
    assert!(
        table.contains("each figure is a ceiling (its best sample)"),
        "{table}"
    );
    // All but one ceiling gone (8 FMA ids with AVX-512, 4 with AVX2): the verdict's first
    // words say what was not compared; more than 3 missing fail unless allowed.
    let n = j["comparisons"].as_array().unwrap().len();
    rewrite(&cur, |m| {
        // One `all` ceiling kept: the `all` ceilings' thread count is part of the work.
        let all = m["ceilings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["id"].as_str().unwrap().ends_with("/all"))
            .cloned()
            .unwrap();
        m["ceilings"] = serde_json::json!([all]);
    });
    let last_line = |o: &std::process::Output| {
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .last()
            .unwrap()
            .to_string()
    };
    let o = gate(&[]);
    let missing = n - 1;
    if missing > 3 {
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let last = last_line(&o);
        assert!(
            last.starts_with(&format!(
                "FAIL: {missing} of {n} baseline ids missing from the current result"
            )),
            "{last}"
        );
        let o = gate(&["--allow-missing"]);
        assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    }
    let o = gate(&["--allow-missing"]);
    let last = last_line(&o);
    assert!(
        last.starts_with(&format!(
            "PASS, with {missing} ids not compared (missing from the current result)"
        )),
        "{last}"
    );
    let o = gate(&["--strict"]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    // A busy baseline is blamed by its own name, not the current's.
    rewrite(&base, |m| {
        m["provenance"]["load"] = serde_json::json!({
            "others_before": 0.0, "others_during": 0.6, "others_after": 0.0,
            "busy": ["other processes took 60% of the CPUs during the work"]
        });
    });
    let o = gate(&[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    assert!(
        e.contains(&format!(
            "{} was measured on a busy machine",
            base.display()
        )) && !e.contains(&cur.display().to_string()),
        "{e}"
    );
}

/// `--runs` takes 1 to 50, and says so.
#[test]
fn runs_out_of_range_are_refused() {
    for bad in ["0", "51", "x"] {
        let o = bin()
            .args(["probe", "--quick", "--runs", bad])
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{bad}");
        assert!(stderr(&o).contains("from 1 to 50"), "{}", stderr(&o));
    }
}
