//! Criterion benches of the hot kernels: peak FMA, the triad, and GEMM. Throughput is reported
//! in elements = FLOPs (FMA, GEMM) or bytes (triad), so criterion prints FLOP/s and B/s.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roofline_kernels::cpu::fma::{best_isa, FmaKernel, Precision};
use roofline_kernels::cpu::gemm::{GemmKernel, Shape};
use roofline_kernels::cpu::stream::{Op, StreamKernel};
use roofline_kernels::driver::Kernel;

fn fma(c: &mut Criterion) {
    let mut g = c.benchmark_group("fma");
    for p in [Precision::F32, Precision::F64] {
        let Some(isa) = best_isa(p) else { continue };
        let mut k = FmaKernel::new(p, isa).expect("kernel");
        let iters = 100_000;
        g.throughput(Throughput::Elements(
            (k.ops_per_iter() * iters as f64) as u64,
        ));
        g.bench_function(format!("{}_{}", p.name(), isa.name()), |b| {
            b.iter(|| k.run(iters))
        });
        // Checked after a run of its own (a filter may have skipped the bench).
        k.run(iters);
        k.check().expect("fma result");
    }
    g.finish();
}

fn triad(c: &mut Criterion) {
    let mut g = c.benchmark_group("triad");
    for (name, bytes, nt) in [
        ("L1_24KiB", 24 << 10, false),
        ("L2_384KiB", 384 << 10, false),
        ("DRAM_384MiB", 384 << 20, true),
    ] {
        let mut k = StreamKernel::new(Op::Triad, bytes, nt).expect("arrays");
        g.throughput(Throughput::Bytes(k.bytes_per_iter() as u64));
        if bytes > (1 << 20) {
            g.sample_size(10);
        }
        g.bench_function(name, |b| b.iter(|| k.run(1)));
        k.run(1);
        k.check().expect("triad result");
    }
    g.finish();
}

fn gemm(c: &mut Criterion) {
    let mut g = c.benchmark_group("gemm_f32_t1");
    g.sample_size(10);
    for n in [256usize, 1024] {
        let mut k = GemmKernel::<f32>::new(Shape { m: n, n, k: n }, 1).expect("matrices");
        g.throughput(Throughput::Elements(k.ops_per_iter() as u64));
        g.bench_function(format!("square_{n}"), |b| b.iter(|| k.run(1)));
        k.run(1);
        k.check().expect("gemm result");
    }
    g.finish();
}

/// The bf16 product (bf16 inputs, f32 sums) beside the f32 one, one thread and the pool.
fn gemm_bf16(c: &mut Criterion) {
    use roofline_kernels::cpu::bf16::{Bf16Gemm, Bf16GemmKernel};
    let Ok(gemm) = Bf16Gemm::detect() else {
        eprintln!("gemm_bf16: no AVX512_BF16 here, skipped");
        return;
    };
    let mut g = c.benchmark_group("gemm_bf16");
    g.sample_size(10);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    for (name, shape) in [
        (
            "square_1024",
            Shape {
                m: 1024,
                n: 1024,
                k: 1024,
            },
        ),
        (
            "square_2048",
            Shape {
                m: 2048,
                n: 2048,
                k: 2048,
            },
        ),
        // ResNet-50 layer3 3×3 as im2col: batch 8 · 14² rows, 256 filters, 9 · 256 deep.
        (
            "resnet50_layer3_3x3",
            Shape {
                m: 1568,
                n: 256,
                k: 2304,
            },
        ),
    ] {
        for t in [1, threads] {
            let mut k = Bf16GemmKernel::new(gemm, shape, t).expect("matrices");
            g.throughput(Throughput::Elements(k.ops_per_iter() as u64));
            g.bench_function(format!("{name}_t{t}"), |b| b.iter(|| k.run(1)));
            k.run(1);
            k.check().expect("bf16 gemm result");
            let mut f = GemmKernel::<f32>::new(shape, t).expect("matrices");
            g.bench_function(format!("{name}_t{t}_f32"), |b| b.iter(|| f.run(1)));
        }
    }
    g.finish();
}

criterion_group!(benches, fma, triad, gemm, gemm_bf16);
criterion_main!(benches);
