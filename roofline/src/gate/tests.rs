//! The gate's tests: verdicts, pooling, rules, tolerances, comparability.

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

/// A metric whose headline figure is its samples' median.
fn m(id: &str, unit: &str, s: Vec<f64>) -> Metric {
    metric(id.into(), unit, median(&mut s.clone()), &s)
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
        clocks: vec![None],
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
        clocks: vec![None],
    };
    let base = one("cpu/mem/DRAM/read/t1", noisy(40e9, 0.05, 5, 1));
    let fell = one("cpu/mem/DRAM/read/t1", noisy(0.51 * 40e9, 0.05, 5, 2));
    let same = one("cpu/mem/DRAM/read/t1", noisy(40e9, 0.05, 5, 3));
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
        clocks: vec![None],
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

/// An AutoML run on GPUs and one on the CPU are different work, told apart by their device and
/// precision (not by one long configuration string); a run from before the GPU's reads as the
/// CPU's in f32.
#[test]
fn gpu_and_cpu_automl_runs_are_told_apart() {
    let conf = |v: serde_json::Value| v.as_object().cloned().unwrap();
    let old = input::automl_work(&conf(serde_json::json!({"batch": 32})));
    let cpu = input::automl_work(&conf(
        serde_json::json!({"batch": 32, "precision": "f32", "device": "cpu"}),
    ));
    let gpu = input::automl_work(&conf(serde_json::json!({
        "batch": 32,
        "precision": "f16",
        "device": "cuda (1 GPU(s), one a worker)"
    })));
    assert_eq!(old, cpu);
    assert_eq!(
        gpu,
        vec![
            ("device", "cuda (1 GPU(s), one a worker)".to_string()),
            ("precision", "f16".to_string()),
            ("configuration", r#"{"batch":32}"#.to_string()),
        ]
    );
    let run = |work| GateInput {
        kind: "automl",
        provenance: crate::placement::tests::machine().provenance,
        metrics: vec![m("automl/flops", "FLOP/s", vec![1.0])],
        work,
        runs: 1,
        clocks: vec![None],
    };
    let why = not_comparable(&run(cpu), &run(gpu.clone()));
    assert_eq!(why.len(), 2, "{why:?}");
    assert!(
        why[0].starts_with("device: baseline cpu, current cuda")
            && why[1] == "precision: baseline f32, current f16",
        "{why:?}"
    );
    assert!(not_comparable(&run(gpu.clone()), &run(gpu)).is_empty());
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
        r.provenance
            .iter()
            .any(|p| p.starts_with("CPU name: baseline")),
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

/// A recorded study of `scripts/gate-study.sh`: its runs by name (`q…` quiet, `s…` slowed
/// by 15%), as the probe wrote their ids, units, values, samples and one-core clock.
fn recorded(text: &str) -> Vec<(String, GateInput)> {
    let study: serde_json::Value = serde_json::from_str(text).unwrap();
    let provenance = crate::placement::tests::machine().provenance;
    study["runs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let metrics = r["metrics"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(id, v)| {
                    // [unit, the ceiling's value, its samples], as the probe wrote them.
                    let unit = v[0].as_str().unwrap();
                    let value = v[1].as_f64().unwrap();
                    let samples: Vec<f64> = v[2]
                        .as_array()
                        .unwrap()
                        .iter()
                        .map(|x| x.as_f64().unwrap())
                        .collect();
                    metric(id.clone(), unit, value, &samples)
                })
                .collect();
            let input = GateInput {
                kind: "machine",
                provenance: provenance.clone(),
                metrics,
                work: vec![],
                runs: 1,
                clocks: vec![r["clock_hz_t1"].as_f64()],
            };
            (r["name"].as_str().unwrap().to_string(), input)
        })
        .collect()
}

/// What a study's gates showed: false alarms among the quiet pairs, slowed pairs caught,
/// pairs refused (a runner whose clock fell 10% between the runs), and, over every slowed
/// comparison whose smallest detectable regression was under 15%, how many regressed.
#[derive(Debug, Default)]
struct Tally {
    pairs: usize,
    alarms: Vec<String>,
    caught: usize,
    slowed: usize,
    refused: Vec<String>,
    eligible: usize,
    eligible_caught: usize,
    eligible_missed: Vec<String>,
}

/// Gates every pair of a recorded study as `roofline gate` does (the sides checked, then
/// compared): the baseline is the `k` quiet runs before run `i` (pooled, as a `probe --runs k`
/// baseline), the currents its quiet run `q<i>` and slowed run `s<i>`.
fn tally(runs: &[(String, GateInput)], k: usize) -> Tally {
    let get = |n: String| runs.iter().find(|r| r.0 == n).map(|r| r.1.clone());
    let named = |name: String, input: GateInput| Named { name, input };
    let rules = Rules::default();
    let mut t = Tally::default();
    for i in 1..=runs.len() {
        let (Some(quiet), Some(slowed)) = (get(format!("q{i}")), get(format!("s{i}"))) else {
            continue;
        };
        let base: Option<Vec<Named>> = (i.saturating_sub(k)..i)
            .map(|j| get(format!("q{j}")).map(|g| named(format!("q{j}"), g)))
            .collect();
        let Some(base) = base.filter(|b| b.len() == k && i >= k) else {
            continue;
        };
        t.pairs += 1;
        for (name, cur) in [(format!("q{i}"), quiet), (format!("s{i}"), slowed)] {
            let s = match sides(base.clone(), vec![named(name.clone(), cur)], false, false) {
                Ok(s) => s,
                Err(e) => {
                    t.refused.push(format!("→ {name}: {e}"));
                    continue;
                }
            };
            let r = gate(&s.base, &s.current, &rules);
            if name.starts_with('q') {
                if r.regressions() > 0 {
                    t.alarms.push(format!(
                        "→ {name}: {:?}",
                        r.comparisons
                            .iter()
                            .filter(|c| c.verdict == Verdict::Regressed)
                            .map(|c| (&c.id, c.change, c.tolerance))
                            .collect::<Vec<_>>()
                    ));
                }
                continue;
            }
            t.slowed += 1;
            t.caught += usize::from(r.regressions() > 0);
            for c in r.comparisons.iter().filter(|c| c.detectable < 0.15) {
                t.eligible += 1;
                t.eligible_caught += usize::from(c.verdict == Verdict::Regressed);
                if c.verdict != Verdict::Regressed {
                    t.eligible_missed.push(format!(
                        "{name} {}: {:+.3} (tolerance {:.3}, detects {:.3}, interval {:+.3} … {:+.3}): {}",
                        c.id,
                        c.change,
                        c.tolerance,
                        c.detectable,
                        c.low,
                        c.high,
                        c.verdict.as_str()
                    ));
                }
            }
        }
    }
    t
}

const ZEN5: &str = include_str!("../../data/gate-study-zen5.json");
const ZEN3: &str = include_str!("../../data/gate-study-zen3.json");

/// The recorded runs of an idle 2-vCPU AMD EPYC VM of family 26 model 2 (Zen 5: the third
/// study; the priors came from the first two), gated with one run per side as the priors are
/// for: at most one of the 20 quiet pairs fails, at least 19 of the 20 pairs slowed by 15% do.
#[test]
fn the_priors_cry_wolf_rarely_and_catch_a_15_percent_slowdown_on_zen5() {
    let t = tally(&recorded(ZEN5), 1);
    eprintln!(
        "zen5, one run: {} false alarms, {} of {} slowed caught, {} of {} comparisons that could see 15% caught",
        t.alarms.len(),
        t.caught,
        t.slowed,
        t.eligible_caught,
        t.eligible
    );
    assert_eq!(t.pairs, 20);
    assert!(t.refused.is_empty(), "{t:#?}");
    assert!(t.alarms.len() <= 1, "{t:#?}");
    assert!(t.caught >= 19, "{t:#?}");
}

/// The README's CI recipe on two kinds of VM: a baseline of the 5 quiet runs before each pair
/// (its own for every pair, so the rates are not one baseline's luck), one current run. At
/// most one false alarm in the quiet pairs compared; of every slowed comparison whose smallest
/// detectable regression is under 15%, at least 19 in 20 caught (what the `detects` column
/// promises). On Zen 5 every slowed pair is caught; the Zen 3 VM slowed now and then by 15–45%
/// with its clock (2.60 to 3.22 GHz): those pairs are refused, not failed, and what it cannot
/// see is said rather than gated.
#[test]
fn a_calibrated_baseline_holds_on_zen5_and_on_zen3() {
    for (name, text, pairs, refused) in [("zen5", ZEN5, 16, 0), ("zen3", ZEN3, 20, 12)] {
        let t = tally(&recorded(text), 5);
        // The figures docs/gate.md quotes (`cargo test … -- --nocapture`).
        eprintln!(
            "{name}: {} pairs, {} false alarms in {} quiet compared, {} of {} slowed caught, {} refused, {} of {} comparisons that could see 15% caught",
            t.pairs,
            t.alarms.len(),
            t.pairs * 2 - t.refused.len() - t.slowed,
            t.caught,
            t.slowed,
            t.refused.len(),
            t.eligible_caught,
            t.eligible
        );
        assert_eq!(t.pairs, pairs, "{name}: {t:#?}");
        assert!(t.refused.len() <= refused, "{name}: {t:#?}");
        assert!(t.alarms.len() <= 1, "{name}: {t:#?}");
        assert!(t.eligible > 0, "{name}: {t:#?}");
        assert!(t.eligible_caught * 20 >= 19 * t.eligible, "{name}: {t:#?}");
        if name == "zen5" {
            assert_eq!(t.caught, t.slowed, "{name}: {t:#?}");
        }
    }
}

/// The one-run model takes a prior as [`noise::PRIOR_DEVIATIONS`] deviations of the
/// log-change between two quiet runs. On the Zen 5 VM the priors were measured on, the median
/// id's prior is at least that many deviations of its 20 back-to-back changes (so the
/// detectable regressions a one-run gate reports there are not optimistic); on the Zen 3 VM it
/// is under one, which is what the calibrated baseline is for.
#[test]
fn the_priors_sit_at_two_deviations_or_more_where_they_were_measured() {
    let ratio = |text: &str| {
        let runs = recorded(text);
        let get = |n: &str| runs.iter().find(|r| r.0 == n).map(|r| &r.1);
        let first = runs.iter().find(|r| r.0.starts_with('q')).unwrap();
        let mut ratios: Vec<f64> = first
            .1
            .metrics
            .iter()
            .map(|m| {
                let changes: Vec<f64> = (1..runs.len())
                    .filter_map(|i| {
                        let a = get(&format!("q{}", i - 1))?;
                        let b = get(&format!("q{i}"))?;
                        let v = |g: &GateInput| {
                            g.metrics.iter().find(|x| x.id == m.id).map(|x| x.value)
                        };
                        Some((v(b)? / v(a)?).ln())
                    })
                    .collect();
                let mean = changes.iter().sum::<f64>() / changes.len() as f64;
                let sd = (changes.iter().map(|x| (x - mean).powi(2)).sum::<f64>()
                    / changes.len() as f64)
                    .sqrt();
                noise::prior(&m.id) / sd
            })
            .collect();
        median(&mut ratios)
    };
    let (zen5, zen3) = (ratio(ZEN5), ratio(ZEN3));
    assert!(zen5 >= noise::PRIOR_DEVIATIONS, "zen5: {zen5}");
    assert!(zen3 < 1.0, "zen3: {zen3}");
}

#[test]
fn sides_are_refused_unless_one_kind_of_work_on_one_kind_of_machine() {
    let text = crate::placement::tests::machine().to_json().unwrap();
    let a = read_input(&text).unwrap();
    let named = |name: &str, input: &GateInput| Named {
        name: name.into(),
        input: input.clone(),
    };
    let s = sides(
        vec![named("a.json", &a)],
        vec![named("b.json", &a)],
        false,
        false,
    )
    .unwrap();
    assert!(s.warnings.is_empty());
    assert_eq!(s.base.metrics.len(), a.metrics.len());
    let mut other = a.clone();
    other.provenance.cpu.family += 1;
    let refused = sides(
        vec![named("a.json", &a)],
        vec![named("o.json", &other)],
        false,
        false,
    );
    let e = refused.unwrap_err().to_string();
    assert!(
        e.starts_with("a.json and o.json were measured on different machines: CPU family"),
        "{e}"
    );
    let allowed = sides(
        vec![named("a.json", &a)],
        vec![named("o.json", &other)],
        true,
        false,
    )
    .unwrap();
    assert_eq!(allowed.warnings.len(), 1, "{:?}", allowed.warnings);
    // A second baseline run from another machine is refused too, not only the current.
    let e = sides(
        vec![named("a.json", &a), named("o.json", &other)],
        vec![named("b.json", &a)],
        false,
        false,
    )
    .unwrap_err();
    assert!(matches!(e, SidesError::OtherMachine { .. }), "{e}");
    let mut placement = a.clone();
    placement.kind = "placement";
    let e = sides(
        vec![named("a.json", &a)],
        vec![named("p.json", &placement)],
        false,
        false,
    );
    assert!(matches!(e, Err(SidesError::Kinds { .. })));
    assert!(matches!(
        sides(vec![], vec![named("b.json", &a)], false, false),
        Err(SidesError::Empty)
    ));
    // A busy file is blamed by its own name, on either side.
    let mut busy = a.clone();
    busy.provenance.load = Some(crate::LoadCheck::judge(
        [Some(0.0), Some(0.5), Some(0.0)],
        None,
        None,
        None,
    ));
    for (b, c) in [(&busy, &a), (&a, &busy)] {
        let e = sides(
            vec![named("baseline.json", b)],
            vec![named("current.json", c)],
            false,
            false,
        )
        .unwrap_err()
        .to_string();
        let file = if std::ptr::eq(b, &busy) {
            "baseline.json"
        } else {
            "current.json"
        };
        assert!(
            e.starts_with(&format!("{file} was measured on a busy machine")),
            "{e}"
        );
        assert_eq!(e.matches(".json").count(), 1, "{e}");
    }
}
