use super::*;
use crate::data::Synthetic;
use crate::resnet::{Config, ResNet, Version};
use crate::train::{
    run, tests::Mirror, train, Decay, GraphTask, Model, Quiet, RunOptions, Source, Task,
    TrainConfig,
};

pub(crate) fn rand(n: usize, h: usize, w: usize, c: usize, seed: u64) -> Tensor<f64> {
    let mut r = Rng::new(seed);
    Tensor::from_vec(n, h, w, c, (0..n * h * w * c).map(|_| r.normal()).collect())
}

/// Every kind of layer, a value read twice (a skip connection) and a convolution on a
/// convolution's output: 6×6×3 images to 5 logits.
pub(crate) fn every_layer() -> Description {
    let conv = |channels, kernel, stride| Op::Conv {
        channels,
        kernel,
        stride,
    };
    let node = |op, inputs: &[usize]| Node {
        op,
        inputs: inputs.to_vec(),
        name: None,
    };
    Description {
        channels: 3,
        nodes: vec![
            node(conv(4, 3, 1), &[0]),
            node(Op::BatchNorm { relu: true }, &[1]),
            node(conv(4, 3, 1), &[2]),
            node(Op::BatchNorm { relu: false }, &[3]),
            node(Op::Add, &[4, 2]),
            node(Op::Relu, &[5]),
            node(Op::MaxPool, &[6]),
            node(conv(6, 1, 2), &[7]),
            node(Op::GlobalAvgPool, &[8]),
            node(Op::Dense { outputs: 5 }, &[9]),
        ],
    }
}

#[test]
fn shapes_follow_the_layers_and_bad_descriptions_say_why() {
    let d = every_layer();
    let s = d.shapes(6, 6).unwrap();
    assert_eq!(s[0], (6, 6, 3));
    assert_eq!(s[7], (3, 3, 4), "max pool halves");
    assert_eq!(s[8], (2, 2, 6), "1×1 stride 2");
    assert_eq!(s[10], (1, 1, 5));
    let mut bad = d.clone();
    bad.nodes[4].inputs = vec![4];
    assert!(matches!(
        bad.shapes(6, 6),
        Err(GraphError::Arity { node: 4, .. })
    ));
    let mut bad = d.clone();
    bad.nodes[2].inputs = vec![5];
    assert!(matches!(
        bad.shapes(6, 6),
        Err(GraphError::Order { node: 2, value: 5 })
    ));
    let mut bad = d.clone();
    bad.nodes[4].inputs = vec![4, 0];
    let e = bad.shapes(6, 6).unwrap_err().to_string();
    assert!(e.contains("adds 6×6×4 and 6×6×3"), "{e}");
    let mut bad = d.clone();
    bad.nodes.truncate(8);
    assert!(matches!(
        bad.shapes(6, 6),
        Err(GraphError::Output { h: 2, .. })
    ));
    // A description is data: JSON and back.
    let json = serde_json::to_string(&d).unwrap();
    assert!(
        json.contains(r#""op":"conv","channels":4,"kernel":3,"stride":1"#),
        "{json}"
    );
    assert_eq!(serde_json::from_str::<Description>(&json).unwrap(), d);
}

/// Finite differences in f64 of L = Σ r·logits over every parameter (a sample of each), with
/// batch norm on batch statistics: the backward pass through every layer, the two paths into
/// the skip connection summed.
#[test]
fn gradients_match_finite_differences() {
    let n = check_gradients(&every_layer(), 6, 7);
    assert_eq!(n, 3 + 2 * 2 + 2, "3 convolutions, 2 batch norms, 1 dense");
}

/// The finite-difference check of every parameter of `d` (built from `seed`) on three random
/// `side × side` images; the number of parameters checked.
pub(crate) fn check_gradients(d: &Description, side: usize, seed: u64) -> usize {
    let classes = d.shapes(side, side).unwrap().last().unwrap().2;
    let x = rand(3, side, side, d.channels, 1);
    let proj = rand(3, 1, 1, classes, 2);
    let mut g = Graph::<f64>::new(d.clone(), side, side, seed).unwrap();
    let z = g.forward(&x, true);
    let mut order = Vec::new();
    g.backward_with(&proj, &mut |ps| {
        order.extend(ps.into_iter().map(|p| p.name.clone()))
    });
    let want: Vec<String> = Model::backward_order(&mut g)
        .into_iter()
        .map(|p| p.name.clone())
        .collect();
    assert_eq!(order, want, "gradients handed over in backward_order");
    let dot = |a: &[f64]| a.iter().zip(&proj.data).map(|(a, b)| a * b).sum::<f64>();
    assert!(dot(&z.data).is_finite());
    let grads: Vec<(String, Vec<f64>, Vec<f64>)> = Model::params(&mut g)
        .into_iter()
        .map(|p| (p.name.clone(), p.value.clone(), p.grad.clone()))
        .collect();
    let mut fresh = Graph::<f64>::new(d.clone(), side, side, seed).unwrap();
    let h = 1e-5;
    for (k, (name, value, grad)) in grads.iter().enumerate() {
        let stride = (value.len() / 11).max(1);
        for i in (0..value.len()).step_by(stride) {
            let mut at = |v: f64| {
                for (j, p) in Model::params(&mut fresh).into_iter().enumerate() {
                    p.value.clone_from(&grads[j].1);
                    if j == k {
                        p.value[i] = v;
                    }
                }
                dot(&fresh.forward(&x, true).data)
            };
            let fd = (at(value[i] + h) - at(value[i] - h)) / (2.0 * h);
            let err = (fd - grad[i]).abs() / (fd.abs() + grad[i].abs()).max(1e-6);
            assert!(
                err < 1e-5,
                "{name}[{i}]: finite difference {fd}, backward {}",
                grad[i]
            );
        }
    }
    grads.len()
}

fn small_resnet() -> Config {
    Config {
        version: Version::V1_5,
        blocks: [1, 1, 0, 0],
        width: 0.125,
        classes: 4,
        zero_init_residual: false,
    }
}

/// ResNet described as data is ResNet: the same weights from the same seed, the same logits,
/// the same FLOP count (the trainer's and the accounting's).
#[test]
fn resnet_as_a_description_is_resnet() {
    for version in [Version::V1_5, Version::V1] {
        let cfg = Config {
            version,
            ..small_resnet()
        };
        let d = Description::resnet(&cfg, 3);
        let mut g = Graph::<f64>::new(d.clone(), 32, 32, 11).unwrap();
        let mut r = ResNet::<f64>::new(cfg.clone(), 11);
        let gp: Vec<Vec<f64>> = Model::params(&mut g)
            .into_iter()
            .map(|p| p.value.clone())
            .collect();
        let mut rp: Vec<Vec<f64>> = r.params().into_iter().map(|p| p.value.clone()).collect();
        rp.sort_by(|a, b| a.partial_cmp(b).unwrap());
        let mut gs = gp.clone();
        gs.sort_by(|a, b| a.partial_cmp(b).unwrap());
        assert_eq!(gs, rp, "{version:?}: the same weights");
        let x = rand(2, 32, 32, 3, 3);
        let (a, b) = (g.forward(&x, true), r.forward(&x, true));
        for (u, v) in a.data.iter().zip(&b.data) {
            assert!(
                (u - v).abs() <= 1e-9 * v.abs().max(1.0),
                "{version:?}: {u} vs {v}"
            );
        }
        let task = GraphTask::new(d, tiny()).unwrap();
        let f = <GraphTask as Task<f64>>::flops(&task, &g);
        assert_eq!(
            f,
            crate::accounting::resnet_flops(&ResNet::<f64>::new(cfg, 0), 32, 32)
        );
    }
}

fn tiny() -> TrainConfig {
    TrainConfig {
        model: small_resnet(),
        data: Source::Synthetic(Synthetic::new(4, 32, 5)),
        train_images: 64,
        eval_images: 32,
        base_lr_per_256: 2.0,
        label_smoothing: 0.0,
        decay: Decay::Cosine,
        run: RunOptions {
            eval_every: 4,
            ..RunOptions::new(16, 8, 3)
        },
    }
}

/// A network that exists only as data trains in the one loop, unchanged: it learns, a device
/// that mirrors the CPU gives the CPU run bit for bit, and a checkpointed run resumes exactly.
#[test]
fn the_loop_trains_a_described_network() {
    let net = Description::chain(
        3,
        &[
            Op::Conv {
                channels: 8,
                kernel: 3,
                stride: 2,
            },
            Op::BatchNorm { relu: true },
            Op::Conv {
                channels: 8,
                kernel: 3,
                stride: 1,
            },
            Op::BatchNorm { relu: true },
            Op::GlobalAvgPool,
            Op::Dense { outputs: 4 },
        ],
    );
    let task = GraphTask::new(net.clone(), tiny()).unwrap();
    let cpu = train::<f32, _>(&task, &Quiet, None).unwrap();
    assert_eq!(cpu.steps, 8);
    assert_eq!(cpu.evals.len(), 2);
    let first = cpu.timing.len();
    assert_eq!(first, 8);
    assert!(cpu.final_loss < 4f64.ln(), "learns: {}", cpu.final_loss);
    assert!(cpu.evals[1].top1 > 0.4, "{:?}", cpu.evals);
    let n = net.clone();
    let mut dev = Mirror::new(move || Graph::<f32>::new(n.clone(), 32, 32, 99).unwrap());
    let on = run::<f32, _>(&task, &Quiet, &mut dev).unwrap();
    assert_eq!(on.param_norm.to_bits(), cpu.param_norm.to_bits());
    assert_eq!(on.evals, cpu.evals);
    // Stopped after 3 steps and resumed: the uninterrupted run's end.
    let ckpt = std::env::temp_dir().join(format!("roofline-graph-{}.st", std::process::id()));
    let mut part = task.clone();
    part.classify.run.checkpoint = Some(ckpt.clone());
    part.classify.run.stop_at = Some(3);
    train::<f32, _>(&part, &Quiet, None).unwrap();
    let mut rest = task.clone();
    rest.classify.run.resume = Some(ckpt.clone());
    let resumed = train::<f32, _>(&rest, &Quiet, None).unwrap();
    assert_eq!(resumed.start_step, 3);
    assert_eq!(resumed.param_norm.to_bits(), cpu.param_norm.to_bits());
    // A checkpoint of another network is refused.
    let mut other = rest.clone();
    other.net.nodes[0].op = Op::Conv {
        channels: 4,
        kernel: 3,
        stride: 2,
    };
    other.net.nodes[2].op = Op::Conv {
        channels: 4,
        kernel: 3,
        stride: 1,
    };
    let e = train::<f32, _>(&other, &Quiet, None)
        .unwrap_err()
        .to_string();
    assert!(e.contains("was written for another run (model "), "{e}");
    let _ = std::fs::remove_file(&ckpt);
}
