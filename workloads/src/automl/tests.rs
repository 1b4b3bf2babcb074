use super::master::{buffer_dir, weights_dir, Progress, Settings, Workers};
use super::morph::{self, applicable, apply, Limits, Morphism, Weights};
use super::search::{self, distance, Gp, Signature, Trained};
use super::worker::Fault;
use crate::data::{Rng, Synthetic};
use crate::graph::tests::{check_gradients, every_layer, rand};
use crate::graph::{Description, Graph, Op};
use crate::resnet::{Config, Version};
use crate::run::RunOptions;
use crate::train::{Decay, Source, TrainConfig};
use roofline_model::automl::{Automl, Outcome};
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

fn small_resnet() -> Description {
    let cfg = Config {
        blocks: [1, 1, 1, 1],
        width: 0.125,
        classes: 4,
        version: Version::V1,
        ..Config::resnet50(4)
    };
    Description::resnet(&cfg, 3)
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

fn logits(d: &Description, w: &Weights, x: &crate::tensor::Tensor<f64>, side: usize) -> Vec<f64> {
    let mut g = Graph::<f64>::new(d.clone(), side, side, 99).unwrap();
    g.load(&w.to_checkpoint()).unwrap();
    g.forward(x, false).data
}

/// Every morphism that applies to a chain and to a small ResNet gives a child that computes
/// its parent's logits (inference, batch norm on running statistics) to 1e-9 of their scale
/// in f64, with one more block (deeper, skip) or twice the channels (wider).
#[test]
fn every_morphism_preserves_the_function() {
    let mut kinds = [0usize; 3];
    for (d, side) in [(chain(), 8), (every_layer(), 6), (small_resnet(), 32)] {
        let w = trained_weights(&d, side, 3);
        let x = rand(2, side, side, 3, 4);
        let parent = logits(&d, &w, &x, side);
        let scale = parent.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        let all = applicable(&d, side, side, 3);
        assert!(!all.is_empty());
        for (k, &m) in all.iter().enumerate() {
            let m = match m {
                // Kernels 1, 3 and 5 in turn.
                Morphism::Deeper { after, .. } => Morphism::Deeper {
                    after,
                    kernel: 1 + 2 * (k % 3),
                },
                m => m,
            };
            let (child, cw) = apply(&d, &w, m, (side, side), k as u64).unwrap();
            let got = logits(&child, &cw, &x, side);
            let err = parent
                .iter()
                .zip(&got)
                .fold(0.0f64, |e, (a, b)| e.max((a - b).abs()));
            assert!(
                err <= 1e-9 * scale,
                "{m}: logits differ by {err} (scale {scale})"
            );
            let (pn, cn) = (d.nodes.len(), child.nodes.len());
            match m {
                Morphism::Deeper { .. } => {
                    kinds[0] += 1;
                    assert_eq!(cn, pn + 2)
                }
                Morphism::Wider { node } => {
                    kinds[1] += 1;
                    assert_eq!(cn, pn);
                    let ch = |d: &Description| match d.nodes[node].op {
                        Op::Conv { channels, .. } => channels,
                        _ => 0,
                    };
                    assert_eq!(ch(&child), 2 * ch(&d));
                }
                Morphism::Skip { .. } => {
                    kinds[2] += 1;
                    assert_eq!(cn, pn + 2)
                }
            }
        }
    }
    assert!(
        kinds.iter().all(|&k| k > 0),
        "every kind was tried: {kinds:?}"
    );
    // What does not apply says why.
    let d = chain();
    let w = trained_weights(&d, 8, 3);
    let e = apply(
        &d,
        &w,
        Morphism::Deeper {
            after: 1,
            kernel: 3,
        },
        (8, 8),
        0,
    )
    .unwrap_err();
    assert!(e.to_string().contains("not a ReLU's output"), "{e}");
    let e = apply(&every_layer(), &w, Morphism::Wider { node: 0 }, (6, 6), 0).unwrap_err();
    assert!(
        e.to_string().contains("addition or more than one layer"),
        "{e}"
    );
}

/// A network made by each kind of morphism, one after another, still has the gradients of
/// finite differences (the backward pass through the new layers and the new addition).
#[test]
fn morphed_networks_pass_the_gradient_check() {
    let d = chain();
    let w = trained_weights(&d, 8, 3);
    let (d, w) = apply(&d, &w, Morphism::Wider { node: 2 }, (8, 8), 1).unwrap();
    let (d, w) = apply(
        &d,
        &w,
        Morphism::Deeper {
            after: 4,
            kernel: 3,
        },
        (8, 8),
        2,
    )
    .unwrap();
    let skip = applicable(&d, 8, 8, 3)
        .into_iter()
        .find(|m| matches!(m, Morphism::Skip { .. }))
        .expect("a skip applies");
    let (d, _) = apply(&d, &w, skip, (8, 8), 3).unwrap();
    assert!(d.nodes.iter().any(|n| n.op == Op::Add));
    let n = check_gradients(&d, 8, 5);
    assert_eq!(n, 5 + 4 * 2 + 2, "5 convolutions, 4 batch norms, 1 dense");
}

/// Operations by AIPerf's rules from a description: ResNet-50 v1 at 224² is the paper's
/// table III (2.31E10 per image: 7.81E09 forward, 1.52E10 backward); and for morphed
/// networks the multiply-accumulates counted from the description are those the built network
/// ran.
#[test]
fn operations_are_aiperf_s_and_what_ran() {
    let v1 = Config {
        version: Version::V1,
        ..Config::resnet50(1000)
    };
    let c = crate::accounting::aiperf(&Description::resnet(&v1, 3).layers(224, 224).unwrap());
    let near = |a: f64, b: f64| ((a - b) / b).abs() < 0.01;
    assert!(
        near(c.forward, 7.81e9) && near(c.backward, 1.52e10) && near(c.total(), 2.31e10),
        "{c:?}"
    );
    let d = small_resnet();
    let w = trained_weights(&d, 32, 1);
    let mut rng = Rng::new(8);
    let mut net = (d, w);
    for k in 0..4 {
        let ms = applicable(&net.0, 32, 32, 3);
        let m = ms[(rng.next_u64() % ms.len() as u64) as usize];
        net = apply(&net.0, &net.1, m, (32, 32), k).unwrap();
        let layers = net.0.layers(32, 32).unwrap();
        let counted: f64 = layers.iter().map(|l| l.macs).sum();
        let mut g = Graph::<f32>::new(net.0.clone(), 32, 32, 0).unwrap();
        let x = crate::tensor::Tensor::from_vec(1, 32, 32, 3, vec![0.5f32; 32 * 32 * 3]);
        assert_eq!(g.ran_macs(&x), counted, "after {m}");
        let ops = crate::accounting::aiperf(&layers);
        assert!(ops.forward >= 2.0 * counted && ops.backward > ops.forward);
    }
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
) -> Result<Automl, crate::run::RunError> {
    buffer_dir(&s.out).create().unwrap();
    super::automl(s, p, cancel)
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
        space: super::rules::Space {
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
        checks: super::tally::Checks {
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
            super::rules::patience(c.round),
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
    use super::worker::{start_from, Context, Start, Trial};
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
