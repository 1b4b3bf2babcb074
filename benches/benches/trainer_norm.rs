//! The trainer's memory-bound passes around each convolution (f32, both cores), at ResNet-50
//! v1.5 sizes, batch 32, 224×224: batch norm + ReLU, and a residual block's end (bn3, the
//! projection's batch norm, the sum and the ReLU), and the stem's max pool (reading the
//! convolution's output through bn1's map and ReLU), each forward and backward. Throughput is in
//! bytes of the passes' own minimum traffic (every tensor they read or write, once per pass;
//! criterion prints B/s): hold it against `cpu/mem/DRAM/triad/all`, or the L3 roof where the
//! tensors fit. The bn + ReLU benches also run as `--precision bf16` does (`_bf16`: the output
//! and the input gradient kept in bf16, bytes counted so), and so do the block ends (their
//! inputs, output and gradients in bf16 as the trainer keeps them). `ROOFLINE_BENCH_LAYERS=a,b` keeps
//! the benches whose names contain a or b.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use roofline_workloads::layers::{Act, BatchNorm, Kept, MaxPool, Shortcut};
use roofline_workloads::tensor::{set_products, Bf16Gemm, Products, Tensor};

/// As the trainer: freed activations come back from a cache, not from fresh pages.
#[global_allocator]
static ALLOC: roofline_workloads::alloc::Caching = roofline_workloads::alloc::Caching;

use std::sync::Arc;

fn tensor(n: usize, hw: usize, c: usize, seed: f32) -> Tensor<f32> {
    let len = n * hw * hw * c;
    let v = (0..len)
        .map(|i| ((i as f32 * 0.618 + seed).sin()) * 0.5)
        .collect();
    Tensor::from_vec(n, hw, hw, c, v)
}

fn passes(c: &mut Criterion) {
    let keep: Vec<String> = std::env::var("ROOFLINE_BENCH_LAYERS")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    assert!(
        roofline_workloads::alloc::enable(8 << 30),
        "the caching allocator"
    );
    let pool = rayon::ThreadPoolBuilder::new().build().expect("a pool");
    // As `--precision bf16` runs the passes: where the CPU has no bf16 products, the portable
    // ones stand in (these passes make no products; they run as they would with AVX512_BF16).
    let half = rayon::ThreadPoolBuilder::new().build().expect("a pool");
    let bf = Bf16Gemm::detect().unwrap_or_else(|_| Bf16Gemm::portable());
    set_products(&half, Products::Bf16(bf));
    let mut g = c.benchmark_group("trainer_norm");
    g.sample_size(10);
    let n = 32;
    // (name, image side, channels): a block's middle (bn+relu) and its end.
    for (name, hw, ch) in [
        ("layer1.bn1+relu1", 56, 64),
        ("layer3.bn1+relu1", 14, 256),
        ("layer1.bn3+add+relu3", 56, 256),
        ("layer1.bn3+downsample.1+add+relu3", 56, 256),
        ("layer3.bn3+add+relu3", 14, 1024),
    ] {
        if !keep.is_empty() && !keep.iter().any(|k| name.contains(k.as_str())) {
            continue;
        }
        let x = tensor(n, hw, ch, 0.1);
        let s = tensor(n, hw, ch, 0.2);
        let dy = tensor(n, hw, ch, 0.3);
        let e = (x.len() * 4) as u64;
        let projected = name.contains("downsample");
        if !name.contains("add") {
            // Forward: statistics (x), then x → y. Backward: sums (dy, x, mask), then
            // (dy, x, mask) → dx.
            g.throughput(Throughput::Bytes(3 * e));
            g.bench_function(format!("{name}/fwd"), |b| {
                let mut bn = BatchNorm::<f32>::new("bn", ch, 1.0);
                b.iter_batched(
                    || x.clone(),
                    |x| pool.install(|| bn.forward_act(x, true, true)),
                    BatchSize::PerIteration,
                )
            });
            g.throughput(Throughput::Bytes(7 * e));
            g.bench_function(format!("{name}/bwd"), |b| {
                b.iter_batched(
                    || {
                        let mut bn = BatchNorm::<f32>::new("bn", ch, 1.0);
                        let y = pool.install(|| bn.forward_act(x.clone(), true, true));
                        (bn, y)
                    },
                    |(mut bn, y)| pool.install(|| bn.backward_act(&dy, Some(&y))),
                    BatchSize::PerIteration,
                )
            });
            // As `--precision bf16` runs it: the ReLU output kept in bf16 (`forward_relu`), the
            // input gradient too (`backward_relu_act`).
            g.throughput(Throughput::Bytes(2 * e + e / 2));
            g.bench_function(format!("{name}/fwd_bf16"), |b| {
                let mut bn = BatchNorm::<f32>::new("bn", ch, 1.0);
                b.iter_batched(
                    || x.clone(),
                    |x| half.install(|| bn.forward_relu(x, true)),
                    BatchSize::PerIteration,
                )
            });
            g.throughput(Throughput::Bytes(5 * e + e));
            g.bench_function(format!("{name}/bwd_bf16"), |b| {
                b.iter_batched(
                    || {
                        let mut bn = BatchNorm::<f32>::new("bn", ch, 1.0);
                        let y = half.install(|| bn.forward_relu(x.clone(), true));
                        (bn, y)
                    },
                    |(mut bn, y)| half.install(|| bn.backward_relu_act(&dy, &y)),
                    BatchSize::PerIteration,
                )
            });
            continue;
        }
        // In f32, and as `--precision bf16` runs it (`_bf16`: the branch's
        // input (conv3's output), the shortcut, the output and the output gradient in bf16, the
        // backward pass reading the identity's mask from the bf16 output and writing the input
        // gradients in bf16). Forward: statistics (x [, s]), then (x, s) → y. Backward: (dy,
        // y, x [, s]) → masked dy and sums (y not read with a projection), then (dy, x [, s]) →
        // dx [, ds]. Bytes in halves of e.
        let precisions = [
            (&pool, "", if projected { (10, 20) } else { (8, 14) }),
            (&half, "_bf16", if projected { (5, 9) } else { (4, 7) }),
        ];
        for (pool, suffix, (fwd, bwd)) in precisions {
            let kept = pool.install(|| Act::kept(s.clone()));
            let kept_dy = pool.install(|| Act::kept(dy.clone()));
            let as_kept = |t: &Tensor<f32>| match Act::kept(t.clone()) {
                Act::Full(t) => Kept::Full(Arc::unwrap_or_clone(t)),
                Act::Half(t) => Kept::Half(Arc::unwrap_or_clone(t)),
            };
            let (kept_x, kept_s) = pool.install(|| (as_kept(&x), as_kept(&s)));
            let inputs = || (kept_x.clone(), projected.then(|| kept_s.clone()));
            let run_fwd =
                |bn: &mut BatchNorm<f32>,
                 down: &mut BatchNorm<f32>,
                 (x, sp): (Kept<f32>, Option<Kept<f32>>)| match sp {
                    Some(sp) => bn.forward_add_relu_kept(x, Shortcut::projected(down, sp), true),
                    None => bn.forward_add_relu_kept(x, Shortcut::identity(&kept), true),
                };
            g.throughput(Throughput::Bytes(fwd * e / 2));
            g.bench_function(format!("{name}/fwd{suffix}"), |b| {
                let mut bn = BatchNorm::<f32>::new("bn", ch, 1.0);
                let mut down = BatchNorm::<f32>::new("down", ch, 1.0);
                b.iter_batched(
                    inputs,
                    |v| pool.install(|| run_fwd(&mut bn, &mut down, v)),
                    BatchSize::PerIteration,
                )
            });
            g.throughput(Throughput::Bytes(bwd * e / 2));
            g.bench_function(format!("{name}/bwd{suffix}"), |b| {
                b.iter_batched(
                    || {
                        let mut bn = BatchNorm::<f32>::new("bn", ch, 1.0);
                        let mut down = BatchNorm::<f32>::new("down", ch, 1.0);
                        let y = pool.install(|| run_fwd(&mut bn, &mut down, inputs()));
                        (bn, down, y, own(&kept_dy))
                    },
                    |(mut bn, mut down, y, dy)| {
                        let down = projected.then_some(&mut down);
                        pool.install(|| bn.backward_add_relu_act(dy, &y, down))
                    },
                    BatchSize::PerIteration,
                )
            });
        }
    }
    if keep.is_empty() || keep.iter().any(|k| "stem.maxpool".contains(k.as_str())) {
        // Forward: x (112² × 64) → y (56² × 64) and a tap byte per output; backward: (dy,
        // taps) → dx.
        let (x, dy) = (tensor(n, 112, 64, 0.1), tensor(n, 56, 64, 0.3));
        let (a, d) = (vec![0.9f32; 64], vec![0.05f32; 64]);
        let (e, o) = ((x.len() * 4) as u64, (dy.len() * 4) as u64);
        g.throughput(Throughput::Bytes(e + o + o / 4));
        g.bench_function("stem.maxpool/fwd", |b| {
            let mut p = MaxPool::<f32>::default();
            b.iter(|| pool.install(|| p.forward_relu_affine(&x, &a, &d)))
        });
        g.bench_function("stem.maxpool/bwd", |b| {
            let mut p = MaxPool::<f32>::default();
            pool.install(|| p.forward_relu_affine(&x, &a, &d));
            b.iter(|| pool.install(|| p.backward(&dy)))
        });
    }
    g.finish();
}

criterion_group!(benches, passes);
criterion_main!(benches);

/// A copy of `a` with a holder of its own (the backward pass takes it without copying it).
fn own(a: &Act<f32>) -> Act<f32> {
    match a {
        Act::Full(t) => Act::Full(std::sync::Arc::new((**t).clone())),
        Act::Half(t) => Act::Half(std::sync::Arc::new((**t).clone())),
    }
}
