//! The trainer's convolution passes (forward, backward data, backward filter; f32, both cores)
//! on every distinct ResNet-50 v1.5 layer shape at batch 32, 224×224: what `place` sees per
//! layer, split by direction. Each bench's throughput is in FLOP (criterion prints elem/s:
//! read it as FLOP/s), to be held against `cpu/gemm/f32/all`. `ROOFLINE_BENCH_LAYERS=a,b`
//! keeps the layers whose names contain one of a, b; `ROOFLINE_BENCH_BATCH` sets the batch;
//! `ROOFLINE_BENCH_PRECISION=bf16` runs them as `--precision bf16` does (bf16 products, f32
//! sums: hold them against `cpu/gemm/bf16/all`), with the names suffixed `_bf16`.
//! `ROOFLINE_CONV=im2col` runs the f32 3×3 stride-1 layers on im2col instead of Winograd's
//! F(4×4, 3×3) (whose rate counts the direct convolution's FLOPs, so it can pass the ceiling).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roofline_kernels::cpu::conv::resnet50_layers;
use roofline_workloads::conv::{backward_data, backward_filter, forward};
use roofline_workloads::tensor::{set_products, Bf16Gemm, Products};

/// As the trainer: large blocks start on a cache line and come back from a cache.
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
        let mut y = vec![0f32; sh.output_len()];
        let mut dx = vec![0f32; sh.input_len()];
        let mut dw = vec![0f32; sh.weight_len()];
        g.throughput(Throughput::Elements(sh.flops() as u64));
        let name = layer.name.replace(' ', "_");
        g.bench_function(format!("{name}/fwd{suffix}"), |b| {
            b.iter(|| pool.install(|| forward(&x, &w, &mut y, &sh)))
        });
        if sh.c > 3 {
            g.bench_function(format!("{name}/bwd_data{suffix}"), |b| {
                b.iter(|| pool.install(|| backward_data(&dy, &w, &mut dx, &sh)))
            });
        }
        g.bench_function(format!("{name}/bwd_filter{suffix}"), |b| {
            b.iter(|| pool.install(|| backward_filter(&x, &dy, &mut dw, &sh)))
        });
    }
    g.finish();
}

criterion_group!(benches, passes);
criterion_main!(benches);
