//! The trainer's convolution passes (forward, backward data, backward filter; f32, both cores)
//! on every distinct ResNet-50 v1.5 layer shape at batch 32, 224×224: what `place` sees per
//! layer, split by direction. Each bench's throughput is in FLOP (criterion prints elem/s:
//! read it as FLOP/s), to be held against `cpu/gemm/f32/all`. `ROOFLINE_BENCH_LAYERS=a,b`
//! keeps the layers whose names contain one of a, b; `ROOFLINE_BENCH_BATCH` sets the batch;
//! `ROOFLINE_BENCH_PRECISION=bf16` runs them as `--precision bf16` does (bf16 products, f32
//! sums: hold them against `cpu/gemm/bf16/all`), with the names suffixed `_bf16`.
//! In bf16 the input and the output gradient are kept in bf16, as the trainer keeps them.
//! `ROOFLINE_CONV=im2col` runs the 3×3 stride-1 layers on im2col instead of Winograd's
//! F(4×4, 3×3) (f32) or F(2×2, 3×3) (bf16), whose rates count the direct convolution's FLOPs,
//! so they can pass the ceiling.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roofline_kernels::cpu::conv::resnet50_layers;
use roofline_workloads::conv::{backward_data, backward_filter, forward_into};
use roofline_workloads::tensor::{bf16, set_products, Bf16Gemm, Products};

/// As the trainer: large blocks start on a cache line and come back from a cache (`enable`).
#[global_allocator]
static ALLOC: roofline_workloads::alloc::Caching = roofline_workloads::alloc::Caching;

fn data(len: usize, seed: f32) -> Vec<f32> {
    (0..len)
        .map(|i| ((i as f32 * 0.618 + seed).sin()) * 0.5)
        .collect()
}

fn passes(c: &mut Criterion) {
    let batch = std::env::var("ROOFLINE_BENCH_BATCH")
        .ok()
        .and_then(|b| b.parse().ok())
        .unwrap_or(32);
    let keep: Vec<String> = std::env::var("ROOFLINE_BENCH_LAYERS")
        .map(|s| s.split(',').map(str::to_string).collect())
        .unwrap_or_default();
    let bf16 = std::env::var("ROOFLINE_BENCH_PRECISION").is_ok_and(|p| p == "bf16");
    // As the trainer: freed large blocks (the filter gradients' partial sums) come back from
    // the cache, not from fresh pages.
    assert!(
        roofline_workloads::alloc::enable(8 << 30),
        "the caching allocator"
    );
    let products = if bf16 {
        Products::Bf16(Bf16Gemm::detect().expect("ROOFLINE_BENCH_PRECISION=bf16 on this CPU"))
    } else {
        Products::Native
    };
    let pool = rayon::ThreadPoolBuilder::new().build().expect("a pool");
    set_products(&pool, products);
    let suffix = if bf16 { "_bf16" } else { "" };
    let mut g = c.benchmark_group("trainer_conv");
    g.sample_size(10);
    for layer in resnet50_layers(batch) {
        if !keep.is_empty() && !keep.iter().any(|k| layer.name.contains(k.as_str())) {
            continue;
        }
        let sh = layer.shape;
        let x = data(sh.input_len(), 0.1);
        let w = data(sh.weight_len(), 0.2);
        let dy = data(sh.output_len(), 0.3);
        let mut y = vec![std::mem::MaybeUninit::<f32>::uninit(); sh.output_len()];
        let mut dx = vec![0f32; sh.input_len()];
        let mut dw = vec![0f32; sh.weight_len()];
        // As the trainer keeps them in bf16 training: the input and the output gradient in bf16.
        let half = |v: &[f32]| -> Vec<bf16> {
            let h = if bf16 { v.len() } else { 0 };
            v[..h].iter().map(|&a| bf16::from_f32(a)).collect()
        };
        let (xh, dyh) = (half(&x), half(&dy));
        g.throughput(Throughput::Elements(sh.flops() as u64));
        let name = layer.name.replace(' ', "_");
        g.bench_function(format!("{name}/fwd{suffix}"), |b| {
            b.iter(|| {
                pool.install(|| {
                    if bf16 {
                        forward_into(&xh, &w, &mut y, &sh)
                    } else {
                        forward_into(&x, &w, &mut y, &sh)
                    }
                })
            })
        });
        if sh.c > 3 {
            g.bench_function(format!("{name}/bwd_data{suffix}"), |b| {
                b.iter(|| {
                    pool.install(|| {
                        if bf16 {
                            backward_data(&dyh, &w, &mut dx, &sh)
                        } else {
                            backward_data(&dy, &w, &mut dx, &sh)
                        }
                    })
                })
            });
        }
        g.bench_function(format!("{name}/bwd_filter{suffix}"), |b| {
            b.iter(|| {
                pool.install(|| {
                    if bf16 {
                        backward_filter(&xh, &dyh, &mut dw, &sh)
                    } else {
                        backward_filter(&x, &dy, &mut dw, &sh)
                    }
                })
            })
        });
    }
    g.finish();
}

criterion_group!(benches, passes);
criterion_main!(benches);
