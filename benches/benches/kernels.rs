//! Criterion benches of the hot kernels: peak FMA, the triad, and GEMM (the gemm crate's f32,
//! roofline's bf16 and f32). Throughput is reported
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
    use roofline_kernels::cpu::bf16::{Bf16Gemm, Bf16GemmKernel, Operand};
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
    // A 1×1 layer's filter gradient as each thread's part of the trainer's runs it: dw (256 ×
    // 64) = xᵀ·dy over 50176 pixels, x and dy in f32 straight from memory (51 MB: both operands
    // packed as they stream past, the rows ahead prefetched).
    let (depth, k, px) = (256, 64, 50176);
    let x: Vec<f32> = (0..px * depth).map(|i| (i as f32 * 0.37).sin()).collect();
    let dy: Vec<f32> = (0..px * k).map(|i| (i as f32 * 0.11).cos()).collect();
    let mut dw = vec![0f32; depth * k];
    g.throughput(Throughput::Elements((2 * depth * k * px) as u64));
    g.bench_function("resnet50_1x1_filter_gradient_256x64_over_50176_t1", |b| {
        b.iter(|| unsafe {
            // SAFETY: x is px × depth, dy px × k, dw depth × k, all dense.
            gemm.gemm(
                depth,
                k,
                px,
                dw.as_mut_ptr(),
                k,
                false,
                Operand::transposed(x.as_ptr(), depth),
                Operand::rows(dy.as_ptr(), k),
                false,
            )
        })
    });
    g.finish();
}

/// roofline's own f32 product (`cpu::sgemm`, B packed once) beside the gemm crate's, on the
/// pool: a square, layer4's 3×3 as the trainer runs it in f32 (56 blocks of 28 patch rows
/// against one 4608 × 512 filter: the crate packs the filter for every block), and layer1's
/// 1×1 forward products at batch 8 (A's 25088 rows read in place). Checked against each other.
fn gemm_f32_own(c: &mut Criterion) {
    use rayon::prelude::*;
    use roofline_kernels::cpu::bf16::Operand;
    use roofline_kernels::cpu::sgemm::F32Gemm;
    use roofline_workloads::tensor::{native_gemm, Mat};
    let Some(own) = F32Gemm::detect() else {
        eprintln!("gemm_f32_own: no AVX-512 or AVX2 here, skipped");
        return;
    };
    let mut g = c.benchmark_group("gemm_f32_own");
    g.sample_size(10);
    let data = |len: usize, seed: f32| -> Vec<f32> {
        (0..len)
            .map(|i| ((i as f32 * 0.618 + seed).sin()) * 0.5)
            .collect()
    };
    for (name, rows, blocks, k, n) in [
        ("square_1024", 1024, 1, 1024, 1024),
        ("resnet50_layer4_3x3_28_rows", 28, 56, 4608, 512),
        ("resnet50_layer1_1x1_64_to_256", 25088, 1, 64, 256),
        ("resnet50_layer1_1x1_256_to_64", 25088, 1, 256, 64),
    ] {
        let (a, b) = (data(rows * blocks * k, 0.1), data(k * n, 0.2));
        let (mut c_own, mut c_crate) =
            (vec![0f32; rows * blocks * n], vec![0f32; rows * blocks * n]);
        g.throughput(Throughput::Elements((2 * rows * blocks * k * n) as u64));
        let parallel = blocks == 1;
        let run_own = |c: &mut [f32]| {
            // SAFETY: a is (rows · blocks) × k, b k × n, c (rows · blocks) × n, all dense.
            let p = unsafe { own.pack_b(k, n, Operand::rows(b.as_ptr(), n), true) };
            c.par_chunks_mut(rows * n)
                .enumerate()
                .for_each(|(t, ct)| unsafe {
                    let at = Operand::rows(a[t * rows * k..].as_ptr(), k);
                    own.gemm_packed(rows, ct.as_mut_ptr(), n, false, at, &p, parallel)
                });
        };
        let run_crate = |c: &mut [f32]| {
            c.par_chunks_mut(rows * n)
                .enumerate()
                .for_each(|(t, ct)| unsafe {
                    let at = Mat::rows(a[t * rows * k..].as_ptr(), k);
                    let bt = Mat::rows(b.as_ptr(), n);
                    native_gemm(rows, n, k, ct.as_mut_ptr(), n, false, at, bt, parallel)
                });
        };
        g.bench_function(format!("{name}_own"), |bch| {
            bch.iter(|| run_own(&mut c_own))
        });
        g.bench_function(format!("{name}_crate"), |bch| {
            bch.iter(|| run_crate(&mut c_crate))
        });
        run_own(&mut c_own);
        run_crate(&mut c_crate);
        let worst = c_own
            .iter()
            .zip(&c_crate)
            .map(|(x, y)| (x - y).abs() / (1.0 + y.abs()))
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-4,
            "{name}: own and crate products differ by {worst}"
        );
    }
    g.finish();
}

criterion_group!(benches, fma, triad, gemm, gemm_bf16, gemm_f32_own);
criterion_main!(benches);
