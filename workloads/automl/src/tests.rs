use crate::master::{buffer_dir, weights_dir, Progress, Settings, Workers};
use crate::search::{self, distance, Gp, Signature, Trained};
use crate::worker::Fault;
use roofline_model::automl::{Automl, Outcome};
use roofline_workloads::data::{Rng, Synthetic};
use roofline_workloads::graph::morph::{self, apply, Limits, Morphism, Weights};
use roofline_workloads::graph::{Description, Graph, Op};
use roofline_workloads::resnet::Config;
use roofline_workloads::run::RunOptions;
use roofline_workloads::train::{Decay, Source, TrainConfig};
use std::sync::atomic::AtomicBool;
use std::time::Duration;

fn conv(channels: usize, kernel: usize, stride: usize) -> Op {
    Op::Conv {
        channels,
        kernel,
        stride,
    }
}

/// Three convolutions with batch norms on a chain: every morphism applies somewhere.
fn chain() -> Description {
    Description::chain(
        3,
        &[
            conv(4, 3, 1),
            Op::BatchNorm { relu: true },
            conv(6, 3, 2),
            Op::BatchNorm { relu: true },
            conv(6, 3, 1),
            Op::BatchNorm { relu: true },
            Op::GlobalAvgPool,
            Op::Dense { outputs: 5 },
        ],
    )
}

/// A built network with batch-norm statistics and affines away from their defaults (as if
/// trained): its weights.
fn trained_weights(d: &Description, side: usize, seed: u64) -> Weights {
    let mut g = Graph::<f64>::new(d.clone(), side, side, seed).unwrap();
    let mut w = Weights::from_checkpoint(&g.snapshot(), d.nodes.len()).unwrap();
    let mut rng = Rng::new(seed + 1);
    for node in &mut w.nodes {
        for (field, v) in node.iter_mut() {
            for x in v.iter_mut() {
                *x = match field.as_str() {
                    "bn.weight" | "bn.running_var" => rng.uniform(0.5, 1.5),
                    "bn.bias" | "bn.running_mean" => 0.3 * rng.normal(),
                    _ => *x,
                };
            }
        }
    }
    g.load(&w.to_checkpoint()).unwrap();
    w
}

/// The edit distance is 0 to itself, symmetric and grows with the edits; the GP returns what
/// it saw where it saw it, is unsure far away, and the annealing proposes an untrained child
/// that the proposed morphisms make from the proposed parent.
#[test]
fn the_search_proposes_what_its_model_expects() {
    let d = chain();
    let w = trained_weights(&d, 8, 3);
    let (wide, _) = apply(&d, &w, Morphism::Wider { node: 0 }, (8, 8), 0).unwrap();
    let (deep, _) = apply(
        &d,
        &w,
        Morphism::Deeper {
            after: 2,
            kernel: 3,
        },
        (8, 8),
        0,
    )
    .unwrap();
    let (deeper, _) = apply(
        &deep,
        &w,
        Morphism::Deeper {
            after: 2,
            kernel: 3,
        },
        (8, 8),
        0,
    )
    .unwrap();
    let s = |d: &Description| Signature::of(d);
    assert_eq!(distance(&s(&d), &s(&d)), 0.0);
    assert_eq!(distance(&s(&d), &s(&wide)), distance(&s(&wide), &s(&d)));
    assert!(distance(&s(&d), &s(&deeper)) > distance(&s(&d), &s(&deep)));
    let obs = vec![(s(&d), 0.4), (s(&wide), 0.6), (s(&deep), 0.5)];
    let gp = Gp::fit(&obs).unwrap();
    for (sig, acc) in &obs {
        let (m, sd) = gp.predict(sig);
        assert!((m - acc).abs() < 0.03 && sd < 0.05, "{m} ± {sd} at {acc}");
    }
    let far = Description::resnet(
        &Config {
            blocks: [2, 2, 2, 2],
            ..Config::resnet50(5)
        },
        3,
    );
    let (_, sd_far) = gp.predict(&s(&far));
    assert!(sd_far > 0.05, "{sd_far}");
    let trained = vec![
        Trained {
            id: 0,
            description: &d,
            accuracy: 0.4,
        },
        Trained {
            id: 1,
            description: &wide,
            accuracy: 0.6,
        },
    ];
    let settings = search::Settings {
        side: 8,
        kernel: 3,
        limits: Limits {
            layers: 20,
            parameters: 1e6,
        },
        neighbours: 8,
        depth: 3,
        t0: 1.0,
        cooling: 0.9,
        evaluations: 64,
    };
    let taken = vec![d.clone(), wide.clone(), deep.clone()];
    let p = search::propose(&gp, &trained, &taken, settings, &mut Rng::new(1)).unwrap();
    assert!(!taken.contains(&p.description));
    let parent = if p.parent == 0 { &d } else { &wide };
    let pw = trained_weights(parent, 8, 3);
    let mut net = (parent.clone(), pw);
    for &m in &p.morphisms {
        net = apply(&net.0, &net.1, m, (8, 8), 0).unwrap();
    }
    assert_eq!(net.0, p.description);
    // The limits hold.
    let tight = Limits {
        layers: 4,
        parameters: 1e6,
    };
    for (_, c) in morph::neighbours(&d, 8, 3, tight, 8, &mut Rng::new(2)) {
        assert!(morph::layer_count(&c) <= 4);
    }
}

/// A fresh buffer, then the search.
fn automl(
    s: &Settings,
    p: &dyn Progress,
    cancel: &AtomicBool,
) -> Result<Automl, roofline_workloads::run::RunError> {
    buffer_dir(&s.out).create().unwrap();
    crate::automl(s, p, cancel)
}

struct Lines(std::sync::Mutex<Vec<String>>);

impl Progress for Lines {
    fn line(&self, l: &str) {
        self.0.lock().unwrap().push(l.to_string());
    }
}

fn settings(name: &str, budget: f64, fault: Option<Fault>) -> Settings {
    let out = std::env::temp_dir().join(format!(
        "roofline-automl-{name}-{}/automl.json",
        std::process::id()
    ));
    let _ = std::fs::remove_dir_all(out.parent().unwrap());
    std::fs::create_dir_all(out.parent().unwrap()).unwrap();
    let cores = roofline_kernels::affinity::cores(None).unwrap().all;
    Settings {
        classify: TrainConfig {
            model: Config::resnet50(4),
            data: Source::Synthetic(Synthetic::new(4, 16, 5)),
            train_images: 32,
            eval_images: 16,
            base_lr_per_256: 2.0,
            label_smoothing: 0.0,
            decay: Decay::Cosine,
            run: RunOptions::new(8, 1, 1),
        },
        start: Description::chain(
            3,
            &[
                conv(4, 3, 2),
                Op::BatchNorm { relu: true },
                conv(4, 3, 1),
                Op::BatchNorm { relu: true },
                Op::GlobalAvgPool,
                Op::Dense { outputs: 4 },
            ],
        ),
        rounds: vec![1, 2],
        budget: Duration::from_secs_f64(budget),
        workers: Workers::Threads(vec![vec![cores[0]], vec![*cores.last().unwrap()]]),
        gpus: None,
        batch: 8,
        kernel: 3,
        space: crate::rules::Space {
            kernels: vec![1, 3],
            batch: (4, 8),
            dropout: (0.0, 0.2),
        },
        limits: Limits {
            layers: 12,
            parameters: 1e5,
        },
        neighbours: 8,
        // The riskier start: each child's weights made from its parent's by the morphisms.
        from_parent: true,
        sample_every: Duration::from_millis(500),
        stall: Duration::from_secs(2),
        out,
        seed: 7,
        checks: crate::tally::Checks {
            imagenet_224: false,
            start_resnet50: false,
            eval_images: 16,
            precision: roofline_model::Precision::F32,
        },
        deviations: vec!["a test's".into()],
        configuration: serde_json::Map::new(),
        provenance: roofline_collectors::provenance::here(
            roofline_kernels::probe::node::cpu_here(cores.len()),
            true,
            std::time::Instant::now(),
        ),
        resume: None,
        fault,
    }
}

/// A short search with two workers: candidates are made from trained parents, counted,
/// sampled and written; the document reads back valid by its schema, and says why the run
/// is not valid by AIPerf's rules; a resumed run keeps what was found and goes on.
#[test]
fn a_short_search_finds_trains_and_resumes() {
    let s = settings("run", 6.0, None);
    let lines = Lines(Default::default());
    let doc = automl(&s, &lines, &AtomicBool::new(false)).unwrap();
    let read = Automl::read(&s.out).unwrap();
    let ids = |d: &Automl| {
        d.candidates
            .iter()
            .map(|c| (c.id, c.parent, c.epochs.len()))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ids(&read),
        ids(&doc),
        "what was written is what was returned"
    );
    assert!(!doc.running);
    assert!(
        doc.candidates.len() >= 4,
        "{}",
        lines.0.lock().unwrap().join("\n")
    );
    let trained: Vec<_> = doc
        .candidates
        .iter()
        .filter(|c| !c.epochs.is_empty())
        .collect();
    assert!(trained.len() >= 3);
    for c in &doc.candidates {
        if let Some(p) = c.parent {
            let parent = doc
                .candidates
                .iter()
                .find(|x| x.id == p)
                .expect("parent recorded");
            assert!(!parent.epochs.is_empty(), "a parent is trained");
            assert!(!c.morphisms.is_empty());
        }
        assert!(c.worker < doc.workers.len());
        // The epochs of the training the candidate is (the second's when it won).
        let kept = usize::from(c.retrain.as_ref().is_some_and(|r| r.won));
        for e in c.epochs.iter().filter(|e| e.pass == kept) {
            let per_epoch = (32 / c.batch) * c.batch;
            let want = per_epoch as f64 * c.ops_per_image.total + 16.0 * c.ops_per_image.forward;
            assert!((e.ops - want).abs() <= 1e-9 * want);
        }
    }
    assert!(
        doc.candidates.iter().any(|c| c.parent.is_some()),
        "the search made children"
    );
    let ops: f64 = doc
        .candidates
        .iter()
        .flat_map(|c| &c.epochs)
        .map(|e| e.ops)
        .sum();
    let last = doc.series.last().unwrap();
    assert_eq!(last.ops, ops);
    assert!(
        (doc.score.flops - doc.series.iter().map(|s| s.flops).fold(0.0, f64::max)).abs() < 1e-9
    );
    assert!(doc.score.training_share > 0.0 && doc.score.training_share <= 1.0);
    // The workers searched; the master only recorded (its waits left out of its time).
    assert!(doc.score.search_seconds > 0.0);
    assert!(doc.score.master_seconds > 0.0 && doc.score.master_seconds < doc.score.elapsed_s);
    // AIPerf's rules per trial: the patience of the round; from round 4 a second training
    // with a draw from the space, the candidate the better of the two.
    let mut tuned = 0;
    for c in &doc.candidates {
        assert_eq!(
            c.patience,
            crate::rules::patience(c.round),
            "candidate {}",
            c.id
        );
        let second: Vec<_> = c.epochs.iter().filter(|e| e.pass == 1).collect();
        match &c.retrain {
            Some(r) => {
                tuned += 1;
                assert!(c.round >= 3);
                assert!(
                    [1, 3].contains(&r.kernel) && (4..8).contains(&r.batch),
                    "{r:?}"
                );
                // The budget may end the second training before its first epoch.
                assert!(!second.is_empty() || (r.top1.is_none() && !r.won), "{r:?}");
                if r.won {
                    assert_eq!((c.batch, c.kernel), (r.batch, r.kernel));
                }
            }
            // A trial of round 4 or later that ran to its end trained twice.
            None => assert!(
                second.is_empty()
                    && (c.round < 3
                        || !matches!(c.outcome, Outcome::Trained | Outcome::EarlyStopped)),
                "candidate {}",
                c.id
            ),
        }
    }
    assert!(
        tuned > 0
            || doc
                .candidates
                .iter()
                .all(|c| c.round < 3 || c.outcome == Outcome::Cut),
        "{}",
        lines.0.lock().unwrap().join("\n")
    );
    assert!(!doc.valid && doc.invalid_because.iter().any(|w| w.contains("3600")));
    assert!(weights_dir(&s.out).join("0.safetensors").is_file());
    // Resumed: the finished candidates kept, the clock and the ids go on.
    let mut again = settings("resumed", doc.score.elapsed_s + 3.0, None);
    let _ = std::fs::create_dir_all(weights_dir(&again.out));
    roofline_model::write::write_atomic(&again.out, doc.to_json().unwrap().as_bytes()).unwrap();
    for c in &doc.candidates {
        let from = weights_dir(&s.out).join(format!("{}.safetensors", c.id));
        if from.is_file() {
            std::fs::copy(
                &from,
                weights_dir(&again.out).join(format!("{}.safetensors", c.id)),
            )
            .unwrap();
        }
    }
    again.resume = Some(doc.clone());
    let more = automl(&again, &lines, &AtomicBool::new(false)).unwrap();
    assert!(
        more.candidates.len() > doc.candidates.len(),
        "{}",
        lines.0.lock().unwrap().join("\n")
    );
    for c in doc
        .candidates
        .iter()
        .filter(|c| c.outcome != Outcome::Running)
    {
        assert!(more.candidates.contains(c), "candidate {} kept", c.id);
    }
    assert!(more.score.elapsed_s > doc.score.elapsed_s);
    assert!(more.series.len() > doc.series.len());
}

/// A worker that stalls is noticed within the stall limit: its trial is ended, its candidate
/// handed to another worker (a fresh one takes its cores); a worker whose trial panics reports
/// it and the candidate is trained again. The run goes on.
#[test]
fn stalled_and_dead_workers_lose_their_trial_not_the_run() {
    for (name, fault, outcome) in [
        (
            "stall",
            Fault::Stall {
                worker: 0,
                trial: 1,
            },
            Outcome::Stalled,
        ),
        (
            "die",
            Fault::Die {
                worker: 1,
                trial: 0,
            },
            Outcome::Failed { why: String::new() },
        ),
    ] {
        let s = settings(name, 8.0, Some(fault));
        let lines = Lines(Default::default());
        let doc = automl(&s, &lines, &AtomicBool::new(false)).unwrap();
        let log = lines.0.lock().unwrap().join("\n");
        let hit = doc
            .candidates
            .iter()
            .find(|c| std::mem::discriminant(&c.outcome) == std::mem::discriminant(&outcome))
            .unwrap_or_else(|| panic!("{name}: no {outcome:?}\n{log}"));
        let retry = doc
            .candidates
            .iter()
            .find(|c| c.id > hit.id && c.description == hit.description)
            .unwrap_or_else(|| panic!("{name}: not handed out again\n{log}"));
        assert_ne!(retry.worker, usize::MAX, "{name}: the retry was taken");
        if name == "stall" {
            assert_eq!(doc.workers.len(), 3, "a fresh worker");
            assert!(!doc.workers[0].alive);
            assert!(log.contains("sent nothing"), "{log}");
        } else if let Outcome::Failed { why } = &hit.outcome {
            assert!(why.contains("fault injected"), "{why}");
        }
        assert!(
            doc.candidates
                .iter()
                .filter(|c| !c.epochs.is_empty())
                .count()
                >= 2,
            "{log}"
        );
    }
}

/// A candidate's start by the run's choice: He's initialisation reads nothing of its parent
/// (here a parent whose weights are not there), --from-parent reads the parent's weights and
/// fails without them, and a starting network has no parent to read.
#[test]
fn he_starts_fresh_and_from_parent_reads_the_parent() {
    use crate::worker::{start_from, Context, Start, Trial};
    let classify = settings("start", 1.0, None).classify;
    let missing = std::env::temp_dir().join("roofline-no-such-parent.safetensors");
    let trial = Trial {
        id: 1,
        parent: Some((chain(), missing)),
        morphisms: vec![],
        description: chain(),
        batch: 8,
        kernel: 3,
        epochs: 1,
        patience: 6,
        tune: None,
        checkpoint: std::env::temp_dir().join("roofline-start-1.safetensors"),
        seed: 3,
        train_ops: 1.0,
        eval_ops: 1.0,
    };
    let he = Context::new(&classify, false, None, None);
    assert!(matches!(he.start, Start::He));
    assert!(start_from(&trial, &he, 16).unwrap().is_none());
    let parent = Context::new(&classify, true, None, None);
    assert_eq!(parent.start.name(), "parent");
    let err = start_from(&trial, &parent, 16).unwrap_err();
    assert!(err.contains("the parent's weights"), "{err}");
    let first = Trial {
        parent: None,
        ..trial
    };
    assert!(start_from(&first, &parent, 16).unwrap().is_none());
}
