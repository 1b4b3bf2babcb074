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
        k.check().expect("gemm result");
    }
    g.finish();
}

criterion_group!(benches, fma, triad, gemm);
criterion_main!(benches);
