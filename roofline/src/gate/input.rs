//! What gate reads from a result file: its comparable figures with their samples, the work
//! it describes (compared before any figure: two files of different work are not compared),
//! and its provenance.

use super::Direction;
use crate::machine::{Machine, Provenance};
use crate::placement::Placement;
use crate::score::Score;
use crate::ModelError;

/// One comparable figure of a result.
#[derive(Clone, Debug, PartialEq)]
pub struct Metric {
    pub id: String,
    pub unit: String,
    pub direction: Direction,
    /// The headline value (the ceiling, the best step, the olympic mean).
    pub value: f64,
    /// The samples behind it (at least the value itself).
    pub samples: Vec<f64>,
    /// Each run's headline value: one for a single run, every run's for a calibrated baseline
    /// (`probe --runs N`) or several files pooled (`gate::pool`): the run-to-run spread the
    /// noise model learns from.
    pub runs: Vec<f64>,
}

/// A result file gate can compare, with its provenance.
#[derive(Clone, Debug)]
pub struct GateInput {
    pub kind: &'static str,
    pub provenance: Provenance,
    pub metrics: Vec<Metric>,
    /// The work it measured, as (what, value): workload, shapes, batch, precision, device,
    /// threads, ranks. Two files that differ here (or in their hardware,
    /// `provenance`) are not compared.
    pub work: Vec<(&'static str, String)>,
    /// How many runs it holds: a calibrated baseline's, or the result files pooled
    /// (`gate::pool`).
    pub runs: usize,
    /// Each run's measured one-core clock, Hz, in run order (for `--per-clock` and the clock
    /// as a cause).
    pub clocks: Vec<Option<f64>>,
}

/// The part of a result's work its provenance holds: the MPI world it ran in (the hardware is
/// [`crate::identity::Identity`]'s, compared apart).
pub(super) fn hardware(p: &Provenance) -> Vec<(&'static str, String)> {
    vec![(
        "MPI world",
        p.cluster.as_ref().map_or("1".to_string(), |c| {
            format!("{} on {} nodes", c.ranks, c.nodes)
        }),
    )]
}

pub(super) fn metric(id: String, unit: &str, value: f64, samples: &[f64]) -> Metric {
    Metric {
        id,
        unit: unit.to_string(),
        direction: Direction::of_unit(unit),
        value,
        samples: if samples.is_empty() {
            vec![value]
        } else {
            samples.to_vec()
        },
        runs: vec![value],
    }
}

/// The result's one-core clock, as its probe measured it.
fn clock(p: &Provenance) -> Option<f64> {
    p.cpu.measured_clock_hz_t1.as_ref().map(|s| s.median)
}

/// What the two figures of a gate's row are, for a result of this kind.
pub(super) fn figures(g: &GateInput) -> String {
    match g.kind {
        "machine" if g.runs >= super::noise::MIN_RUNS => format!(
            "each figure is a ceiling (its best sample); the baseline's, the median of its {} runs' ceilings",
            g.runs
        ),
        "machine" => "each figure is a ceiling: its best sample".into(),
        "placement" => "each figure is the best step's rate, or the median step's time".into(),
        "score" => "each figure is the mean over the score's runs".into(),
        _ => "each figure is the run's score, its best accuracy, its rates".into(),
    }
}

/// Reads any of the three result kinds (by its schema).
pub fn read_input(text: &str) -> Result<GateInput, ModelError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ModelError::Json)?;
    let schema = value.get("schema").and_then(|s| s.as_str()).unwrap_or("");
    match schema {
        crate::MACHINE_SCHEMA => {
            let m = Machine::from_json(text)?;
            let cal = m.calibration.as_ref().filter(|c| !c.runs.is_empty());
            let mut metrics: Vec<Metric> = m
                .ceilings
                .iter()
                .map(|c| {
                    let mut x = metric(c.id.to_string(), &c.unit, c.value, &c.stats.values);
                    if let Some(v) = cal.map(|k| k.values(&c.id.to_string())) {
                        if !v.is_empty() {
                            x.runs = v;
                        }
                    }
                    x
                })
                .collect();
            for n in &m.nodes {
                for c in &n.ceilings {
                    metrics.push(metric(
                        format!("node{}/{}", n.node, c.id),
                        &c.unit,
                        c.value,
                        &c.stats.values,
                    ));
                }
            }
            // The fleet's links, pair by pair (a node's own ceilings are `node<i>/…` above),
            // between hosts (`link/…`) and between GPUs (`gpu-link/…`).
            let f = m.fleet.as_ref();
            for (l, prefix) in [
                (f.and_then(|f| f.links.as_ref()), "link"),
                (f.and_then(|f| f.gpu_links.as_ref()), "gpu-link"),
            ] {
                let Some(l) = l else { continue };
                for k in &l.links {
                    let slower = if k.bandwidth_ab.median <= k.bandwidth_ba.median {
                        &k.bandwidth_ab
                    } else {
                        &k.bandwidth_ba
                    };
                    let id = |what: &str| format!("{prefix}/node{}-node{}/{what}", k.a, k.b);
                    metrics.push(metric(
                        id("bandwidth"),
                        "B/s",
                        slower.median,
                        &slower.values,
                    ));
                    metrics.push(metric(
                        id("latency"),
                        "s",
                        k.latency.median,
                        &k.latency.values,
                    ));
                }
            }
            // The `all` ceilings' thread count (--threads) is part of the work.
            let all_threads = m
                .ceilings
                .iter()
                .filter(|c| c.id.to_string().ends_with("/all"))
                .map(|c| c.threads)
                .max()
                .unwrap_or(0);
            let work = vec![("threads of the `all` ceilings", all_threads.to_string())];
            let clocks = match cal.and_then(|k| k.clocks()) {
                Some(c) => c.into_iter().map(Some).collect(),
                None => vec![clock(&m.provenance); cal.map_or(1, |k| k.runs.len())],
            };
            Ok(GateInput {
                kind: "machine",
                runs: cal.map_or(1, |k| k.runs.len()),
                work,
                clocks,
                provenance: m.provenance,
                metrics,
            })
        }
        crate::placement::PLACEMENT_SCHEMA => {
            let p = Placement::from_json(text)?;
            let w = &p.workload.name;
            let mut metrics = vec![
                metric(
                    format!("placement/{w}/achieved"),
                    "FLOP/s",
                    p.point.achieved_flops,
                    &p.point.achieved.values,
                ),
                metric(
                    format!("placement/{w}/step"),
                    "s",
                    p.point.seconds_per_step.median,
                    &p.point.seconds_per_step.values,
                ),
            ];
            for l in &p.layers {
                metrics.push(metric(
                    format!("placement/{w}/layer/{}", l.label),
                    "FLOP/s",
                    l.achieved_flops,
                    &l.achieved.values,
                ));
            }
            let wl = &p.workload;
            let work = vec![
                ("workload", format!("{} ({})", wl.name, wl.kind)),
                ("shapes", wl.description.clone()),
                ("batch", format!("{:?}", wl.batch)),
                ("precision", wl.precision.clone()),
                ("device", wl.device.clone()),
                ("threads", wl.threads.to_string()),
                ("ranks", format!("{} on {} nodes", wl.ranks, wl.nodes)),
                ("parameters", format!("{:?}", wl.parameters)),
            ];
            Ok(GateInput {
                kind: "placement",
                runs: 1,
                clocks: vec![clock(&p.provenance)],
                work,
                provenance: p.provenance,
                metrics,
            })
        }
        crate::score::SCORE_SCHEMA => {
            let s = Score::from_json(text)?;
            let w = &s.workload;
            let runs =
                |f: fn(&crate::score::Run) -> f64| -> Vec<f64> { s.runs.iter().map(f).collect() };
            let sc = &s.scores;
            let mut metrics = vec![
                metric(
                    format!("score/{w}/flops"),
                    "FLOP/s",
                    sc.flops.mean,
                    &runs(|r| r.flops),
                ),
                metric(
                    format!("score/{w}/vflops"),
                    "FLOP/s",
                    sc.vflops.mean,
                    &runs(|r| r.vflops),
                ),
            ];
            // A time to quality only where every run reached the target.
            if let Some(t) = &sc.time_to_quality_s {
                metrics.push(metric(
                    format!("score/{w}/time_to_quality"),
                    "s",
                    t.mean,
                    &runs(|r| r.time_to_quality_s),
                ));
            }
            // A bagged score (V3.0): its flops and vflops above are the ensemble's; the single
            // model's and the ensemble's quality beside them.
            if let Some(b) = &sc.bagging {
                let bag = |f: fn(&crate::bagging::BaggedRun) -> f64| -> Vec<f64> {
                    s.runs
                        .iter()
                        .filter_map(|r| r.bagging.as_ref())
                        .map(f)
                        .collect()
                };
                metrics.push(metric(
                    format!("score/{w}/bagging/single_model_flops"),
                    "FLOP/s",
                    b.single_model_flops.mean,
                    &bag(|r| r.members.first().map_or(0.0, |m| m.flops)),
                ));
                metrics.push(metric(
                    format!("score/{w}/bagging/ensemble_quality"),
                    &s.target.metric,
                    b.ensemble_quality.mean,
                    &bag(|r| r.ensemble_quality),
                ));
            }
            let work = vec![
                ("workload", s.workload.clone()),
                ("level", s.level.to_string()),
                ("target", format!("{} {}", s.target.metric, s.target.value)),
                (
                    "configuration",
                    serde_json::Value::Object(s.configuration.clone()).to_string(),
                ),
            ];
            Ok(GateInput {
                kind: "score",
                runs: 1,
                clocks: vec![clock(&s.provenance)],
                work,
                provenance: s.provenance,
                metrics,
            })
        }
        crate::automl::AUTOML_SCHEMA => automl(text),
        other => Err(ModelError::Schema {
            expected: format!(
                "{}, {}, {} or {}",
                crate::MACHINE_SCHEMA,
                crate::placement::PLACEMENT_SCHEMA,
                crate::score::SCORE_SCHEMA,
                crate::automl::AUTOML_SCHEMA
            ),
            found: if other.is_empty() {
                "no \"schema\" field".into()
            } else {
                format!("\"{other}\"")
            },
        }),
    }
}

/// An AutoML run: its score (the series' highest FLOPS, with the series as samples), the
/// regulated score, the best accuracy (the candidates' as samples), the candidates a minute
/// and the seconds an epoch took. The work: where the workers trained (`device`: cpu, or
/// cuda and its GPUs), the trainer's precision, and the rest of the run's configuration (a
/// run from before the GPU's without the first two: cpu, f32).
fn automl(text: &str) -> Result<GateInput, ModelError> {
    let a = crate::automl::Automl::from_json(text)?;
    let series =
        |f: fn(&crate::automl::Sample) -> f64| -> Vec<f64> { a.series.iter().map(f).collect() };
    let best: Vec<f64> = a.candidates.iter().filter_map(|c| c.best_top1()).collect();
    let s = &a.score;
    let mut metrics = vec![
        metric(
            "automl/flops".into(),
            "FLOP/s",
            s.flops,
            &series(|p| p.flops),
        ),
        metric(
            "automl/regulated".into(),
            "FLOP/s",
            s.regulated,
            &series(|p| p.regulated),
        ),
        metric("automl/best_top1".into(), "top-1", 1.0 - s.error, &best),
        metric(
            "automl/candidates_per_minute".into(),
            "1/min",
            s.candidates_per_minute,
            &[],
        ),
    ];
    if let Some(e) = &a.epoch_seconds {
        metrics.push(metric("automl/epoch".into(), "s", e.median, &e.values));
    }
    Ok(GateInput {
        kind: "automl",
        runs: 1,
        clocks: vec![clock(&a.provenance)],
        work: automl_work(&a.configuration),
        provenance: a.provenance,
        metrics,
    })
}

/// An AutoML run's work: its device, its precision, the rest of its configuration.
pub(super) fn automl_work(
    conf: &serde_json::Map<String, serde_json::Value>,
) -> Vec<(&'static str, String)> {
    let mut rest = conf.clone();
    let mut take = |key: &str, old: &str| match rest.remove(key) {
        Some(serde_json::Value::String(s)) => s,
        Some(v) => v.to_string(),
        None => old.to_string(),
    };
    let device = take("device", "cpu");
    let precision = take("precision", "f32");
    vec![
        ("device", device),
        ("precision", precision),
        ("configuration", serde_json::Value::Object(rest).to_string()),
    ]
}
