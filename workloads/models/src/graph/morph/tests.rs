//! The morphisms' checks: every child computes its parent's function, passes the gradient
//! check, and is counted as it runs.

use super::{applicable, apply, Morphism, Weights};
use crate::data::Rng;
use crate::graph::tests::{check_gradients, every_layer, rand};
use crate::graph::{Description, Graph, Op};
use crate::resnet::{Config, Version};

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
