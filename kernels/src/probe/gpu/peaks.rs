//! Compute peaks of one GPU: FMA on the CUDA cores per precision, and the tensor cores through
//! warp-level `mma.sync`, each lane checked against a closed form or a CPU reference.

use super::*;

// ---------------------------------------------------------------------------------------------
// FMA peak on the CUDA cores

pub(super) const FMA_ACC: usize = 8;
pub(super) const FMA_UNROLL: usize = 16;
pub(super) const FMA_BLOCK: u32 = 256;

pub(super) fn fma_start_f64(tid: usize, i: usize) -> f64 {
    ((tid + i) & 255) as f64 / 256.0
}

/// The kernel's per-thread result, computed on the CPU with the same fused operations.
pub(super) fn fma_ref_f64(tid: usize, a: f64, b: f64, iters: usize) -> f64 {
    let mut x: [f64; FMA_ACC] = std::array::from_fn(|i| fma_start_f64(tid, i));
    for _ in 0..iters * FMA_UNROLL {
        for v in x.iter_mut() {
            *v = v.mul_add(a, b);
        }
    }
    x.iter().fold(0.0, |s, v| s + v)
}

pub(super) fn fma_ref_f32(tid: usize, a: f32, b: f32, iters: usize) -> f32 {
    let mut x: [f32; FMA_ACC] = std::array::from_fn(|i| fma_start_f64(tid, i) as f32);
    for _ in 0..iters * FMA_UNROLL {
        for v in x.iter_mut() {
            *v = v.mul_add(a, b);
        }
    }
    x.iter().fold(0.0, |s, v| s + v)
}

/// One packed-half lane: x = round(x * a + b), the product and sum exact in f64.
pub(super) fn half_fma(bits: u16, a: u16, b: u16, bf16: bool) -> u16 {
    if bf16 {
        let f = |v: u16| half::bf16::from_bits(v).to_f64();
        half::bf16::from_f64(f(bits).mul_add(f(a), f(b))).to_bits()
    } else {
        let f = |v: u16| half::f16::from_bits(v).to_f64();
        half::f16::from_f64(f(bits).mul_add(f(a), f(b))).to_bits()
    }
}

pub(super) fn half_bits(v: f64, bf16: bool) -> u16 {
    if bf16 {
        half::bf16::from_f64(v).to_bits()
    } else {
        half::f16::from_f64(v).to_bits()
    }
}

pub(super) fn half_value(bits: u16, bf16: bool) -> f64 {
    if bf16 {
        half::bf16::from_bits(bits).to_f64()
    } else {
        half::f16::from_bits(bits).to_f64()
    }
}

pub(super) fn fma_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let grid = gpu.grid_for(FMA_BLOCK, 2048);
    let threads = (grid * FMA_BLOCK) as usize;
    for p in [
        Precision::F64,
        Precision::F32,
        Precision::F16,
        Precision::Bf16,
    ] {
        ctx.cancelled()?;
        let r = fma_one(ctx, gpu, p, grid, threads);
        ctx.checked(gpu.ordinal, &format!("fma_{p}"), r)?;
    }
    Ok(())
}

/// What an FMA kernel computes on: f64, f32, or two 16-bit halves packed in a 32-bit word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum FmaKind {
    F64,
    F32,
    Half,
}

pub(super) fn fma_one(
    ctx: &mut Ctx,
    gpu: &mut Gpu,
    p: Precision,
    grid: u32,
    threads: usize,
) -> Result<String, CudaError> {
    let precision = p.name();
    // The kernel of each precision: a precision without one fails to compile here when added.
    let (kind, kernel) = match p {
        Precision::F64 => (FmaKind::F64, "fma_f64"),
        Precision::F32 => (FmaKind::F32, "fma_f32"),
        Precision::F16 => (FmaKind::Half, "fma_f16x2"),
        Precision::Bf16 => (FmaKind::Half, "fma_bf16x2"),
        Precision::Tf32 | Precision::Fp8 | Precision::Int8 => {
            return Err(CudaError::Check(format!(
                "{p} has no FMA on the CUDA cores (its peak is the tensor cores')"
            )))
        }
    };
    let f = gpu.function(kernel)?;
    let packed = kind == FmaKind::Half;
    let bf16 = p == Precision::Bf16;
    let out = gpu.alloc(threads * FMA_ACC * 8)?;
    // x = 0.75 x + 0.125 for the halves (exact constants), 0.999 x + 0.001 for f32/f64.
    let (a16, b16) = (half_bits(0.75, bf16), half_bits(0.125, bf16));
    let pa = (a16 as u32) | ((a16 as u32) << 16);
    let pb = (b16 as u32) | ((b16 as u32) << 16);
    let starts: Vec<u32> = (0..256u32)
        .map(|i| {
            let lo = half_bits(i as f64 / 256.0, bf16) as u32;
            let hi = half_bits((255 - i) as f64 / 256.0, bf16) as u32;
            lo | (hi << 16)
        })
        .collect();
    let start_buf = gpu.upload(&starts)?;
    let (a64, b64) = (0.999f64, 0.001f64);
    let (a32, b32) = (0.999f32, 0.001f32);
    let mut launch = |iters: i32| -> Result<(), CudaError> {
        match kind {
            FmaKind::F64 => unsafe {
                gpu.launch(
                    f,
                    grid,
                    FMA_BLOCK,
                    &mut [arg(&out.ptr), arg(&a64), arg(&b64), arg(&iters)],
                )
            },
            FmaKind::F32 => unsafe {
                gpu.launch(
                    f,
                    grid,
                    FMA_BLOCK,
                    &mut [arg(&out.ptr), arg(&a32), arg(&b32), arg(&iters)],
                )
            },
            FmaKind::Half => unsafe {
                gpu.launch(
                    f,
                    grid,
                    FMA_BLOCK,
                    &mut [
                        arg(&out.ptr),
                        arg(&start_buf.ptr),
                        arg(&pa),
                        arg(&pb),
                        arg(&iters),
                    ],
                )
            },
        }
    };
    let base = if ctx.mode == Mode::Check { 8 } else { 64 };
    let iters = calibrate(ctx, gpu, base, 1 << 22, &mut launch)?;
    let (times, conditions) = timed(ctx, gpu, || launch(iters))?;
    // Check a sample of threads against the CPU model of the same chains.
    let lanes = if packed { 2.0 } else { 1.0 };
    let flops = 2.0 * lanes * (FMA_ACC * FMA_UNROLL) as f64 * iters as f64 * threads as f64;
    let sample: Vec<usize> = (0..8).map(|k| k * (threads / 8) + k % 3).collect();
    let mut worst = 0.0f64;
    match kind {
        FmaKind::F64 => {
            let v: Vec<f64> = gpu.download(&out)?;
            for &t in &sample {
                let want = fma_ref_f64(t, a64, b64, iters as usize);
                let err = ((v[t] - want) / want).abs();
                worst = worst.max(err);
                if err > 1e-12 {
                    return Err(CudaError::Check(format!(
                        "fma_f64 thread {t}: GPU {} CPU {want}",
                        v[t]
                    )));
                }
            }
        }
        FmaKind::F32 => {
            let v: Vec<f32> = gpu.download(&out)?;
            for &t in &sample {
                let want = fma_ref_f32(t, a32, b32, iters as usize);
                let err = ((v[t] - want) / want).abs() as f64;
                worst = worst.max(err);
                if err > 1e-6 {
                    return Err(CudaError::Check(format!(
                        "fma_f32 thread {t}: GPU {} CPU {want}",
                        v[t]
                    )));
                }
            }
        }
        FmaKind::Half => {
            let v: Vec<u32> = gpu.download(&out)?;
            for &t in &sample {
                for i in 0..FMA_ACC {
                    let mut x = starts[(t + i) & 255];
                    // Converges to the fixed point 0.5 in a few dozen steps; past that the
                    // chain is constant, so the model stops early.
                    for _ in 0..(iters as usize * FMA_UNROLL).min(4096) {
                        let lo = half_fma(x as u16, a16, b16, bf16) as u32;
                        let hi = half_fma((x >> 16) as u16, a16, b16, bf16) as u32;
                        x = lo | (hi << 16);
                    }
                    let got = v[t * FMA_ACC + i];
                    for shift in [0, 16] {
                        let g = half_value((got >> shift) as u16, bf16);
                        let w = half_value((x >> shift) as u16, bf16);
                        let err = ((g - w) / w).abs();
                        worst = worst.max(err);
                        if err > 1e-2 {
                            return Err(CudaError::Check(format!(
                                "{kernel} thread {t} chain {i}: GPU {g} CPU {w}"
                            )));
                        }
                    }
                }
            }
        }
    }
    let rates: Vec<f64> = times.iter().map(|t| flops / t).collect();
    let peak = ctx.peak(gpu, precision, "vector");
    ctx.push(
        compute_roof(gpu.ordinal, Family::Fma, p, None),
        CeilingKind::Compute,
        "FLOP/s",
        &rates,
        PerIteration { ops: flops, bytes: 0.0 },
        format!(
            "NVRTC kernel {kernel}: {grid} blocks × {FMA_BLOCK} threads, {FMA_ACC} independent FMA chains per thread{}, {iters} × {FMA_UNROLL} steps; CUDA-event timed, best of {} after a warm-up; {} sampled threads match the CPU model",
            if packed { " on packed pairs (2 lanes)" } else { "" },
            ctx.mode.samples(),
            sample.len()
        ),
        peak,
        conditions,
    );
    Ok(format!(
        "{} threads sampled, max rel. error {worst:.1e}",
        sample.len()
    ))
}

// ---------------------------------------------------------------------------------------------
// Tensor-core peak through mma.sync

pub(super) const MMA_CHAINS: f64 = 4.0;
pub(super) const MMA_BLOCK: u32 = 256;

pub(super) struct MmaSpec {
    pub(super) precision: Precision,
    pub(super) kernel: &'static str,
    /// Operations (2·M·N·K) of one mma instruction.
    pub(super) ops: f64,
    pub(super) a: u32,
    pub(super) b: u32,
    /// The product of one A and one B element times K: what each mma adds to each D element.
    pub(super) per_mma: f64,
    pub(super) min_arch: u32,
    /// The architectures from `min_arch` on whose tensor cores run this `mma.sync` natively;
    /// empty: all of them. On the others ptxas emulates it (fp8 on sm_90 and sm_100: e4m3 →
    /// f16 conversions and f16 HMMAs, the product hoisted out of the loop), so a figure would
    /// not be this precision's rate.
    pub(super) native: &'static [u32],
    pub(super) int: bool,
}

pub(super) const MMA: [MmaSpec; 5] = [
    // f16: a = 1.0 (0x3C00), b = 2^-10 (0x1400), K = 16.
    MmaSpec {
        precision: Precision::F16,
        kernel: "mma_f16",
        ops: 4096.0,
        a: 0x3C00_3C00,
        b: 0x1400_1400,
        per_mma: 16.0 / 1024.0,
        min_arch: 80,
        native: &[],
        int: false,
    },
    // bf16: a = 1.0 (0x3F80), b = 2^-10 (0x3A80), K = 16.
    MmaSpec {
        precision: Precision::Bf16,
        kernel: "mma_bf16",
        ops: 4096.0,
        a: 0x3F80_3F80,
        b: 0x3A80_3A80,
        per_mma: 16.0 / 1024.0,
        min_arch: 80,
        native: &[],
        int: false,
    },
    // tf32 (f32 bits): a = 1.0, b = 2^-10, K = 8.
    MmaSpec {
        precision: Precision::Tf32,
        kernel: "mma_tf32",
        ops: 2048.0,
        a: 0x3F80_0000,
        b: 0x3A80_0000,
        per_mma: 8.0 / 1024.0,
        min_arch: 80,
        native: &[],
        int: false,
    },
    // int8: a = b = 1, K = 32.
    MmaSpec {
        precision: Precision::Int8,
        kernel: "mma_int8",
        ops: 8192.0,
        a: 0x0101_0101,
        b: 0x0101_0101,
        per_mma: 32.0,
        min_arch: 80,
        native: &[],
        int: true,
    },
    // fp8 e4m3: a = 1.0 (0x38), b = 2^-6 (0x08), K = 32.
    MmaSpec {
        precision: Precision::Fp8,
        kernel: "mma_fp8",
        ops: 8192.0,
        a: 0x3838_3838,
        b: 0x0808_0808,
        per_mma: 32.0 / 64.0,
        min_arch: 89,
        // QMMA: Ada (sm_89) and the Blackwell GeForce/workstation parts (sm_120, sm_121).
        // Hopper and Blackwell data-centre parts run fp8 only through wgmma / tcgen05.
        native: &[89, 120, 121],
        int: false,
    },
];

/// Whether the probe measures mma kernel `kernel` on a GPU of architecture `arch` (sm_XY as
/// XY): `Err` says why not. The SASS gate (kernels/tests/sass_gate.rs) asserts, for every
/// architecture where this is `Ok`, that the kernel's machine code is the precision's own
/// tensor-core instruction.
pub fn mma_support(kernel: &str, arch: u32) -> Result<(), String> {
    // A layout kernel (mma_layout_*) runs where its peak kernel does.
    let peak = kernel.replace("mma_layout_", "mma_");
    let Some(spec) = MMA.iter().find(|s| s.kernel == peak) else {
        return Err(format!("{kernel} is not an mma kernel"));
    };
    if arch < spec.min_arch {
        return Err(format!(
            "{} mma needs sm_{} or newer; this GPU is sm_{arch}",
            spec.precision, spec.min_arch
        ));
    }
    if !spec.native.is_empty() && !spec.native.contains(&arch) {
        return Err(format!(
            "not supported here: sm_{arch} has no native {} mma.sync (ptxas turns it into conversions and f16 HMMAs, which would not measure the {} tensor-core rate); the {} ceiling of this GPU is cuBLASLt's, gpu/gemm/{}",
            spec.precision, spec.precision, spec.precision, spec.precision
        ));
    }
    Ok(())
}

pub(super) fn mma_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    for spec in &MMA {
        ctx.cancelled()?;
        let r = match mma_support(spec.kernel, gpu.arch()) {
            Err(why) => Err(CudaError::Unsupported(why)),
            Ok(()) => mma_one(ctx, gpu, spec).map_err(|e| fp8_needs_newer_nvrtc(spec, e)),
        };
        ctx.checked(gpu.ordinal, spec.kernel, r)?;
    }
    Ok(())
}

/// NVRTC before 12.4 cannot compile the fp8 mma for sm_89/sm_90 (it needs PTX ISA 8.4): that
/// is a missing capability of the toolkit, noted, not a failed kernel.
pub(super) fn fp8_needs_newer_nvrtc(spec: &MmaSpec, e: CudaError) -> CudaError {
    match (&e, crate::cuda::nvrtc::version()) {
        (CudaError::Compile { .. }, Ok(v)) if spec.kernel == "mma_fp8" && v < (12, 4) => {
            CudaError::Unsupported(format!(
                "the fp8 mma needs NVRTC 12.4 or newer (PTX ISA 8.4); this is NVRTC {}.{}",
                v.0, v.1
            ))
        }
        _ => e,
    }
}

/// The first lane of `out` (one i32 or f32 a thread) that is not `want`, with its value:
/// integers exactly, floats within `rel` of it (a NaN is never within).
/// A kernel's output of i32 (`int`) or f32 values, as f64.
pub(super) fn download_f64(gpu: &Gpu, out: &DevBuf, int: bool) -> Result<Vec<f64>, CudaError> {
    Ok(if int {
        gpu.download::<i32>(out)?
            .into_iter()
            .map(f64::from)
            .collect()
    } else {
        gpu.download::<f32>(out)?
            .into_iter()
            .map(f64::from)
            .collect()
    })
}

pub(super) fn wrong_lane(
    gpu: &Gpu,
    out: &DevBuf,
    want: f64,
    int: bool,
    rel: f64,
) -> Result<Option<(usize, f64)>, CudaError> {
    let v = download_f64(gpu, out, int)?;
    Ok(v.iter()
        .position(|&x| x.is_nan() || (x - want).abs() > rel * want.abs())
        .map(|i| (i, v[i])))
}

pub(super) fn mma_one(ctx: &mut Ctx, gpu: &mut Gpu, spec: &MmaSpec) -> Result<String, CudaError> {
    // First the fragments: one mma of the same instruction on distinct values (the peak
    // kernel's uniform values cannot show a wrong layout). A wrong one fails the kernel's
    // check after the timings: the rate stays, beside the failure that flags it.
    let layout = super::mma_layout::check_mma_layout(gpu, spec.kernel, spec.int);
    if let Err(CudaError::Interrupted) = layout {
        return Err(CudaError::Interrupted);
    }
    let f = gpu.function(spec.kernel)?;
    let grid = gpu.grid_for(MMA_BLOCK, 1024);
    let threads = (grid * MMA_BLOCK) as usize;
    let warps = (threads / 32) as f64;
    let out = gpu.alloc(threads * 4)?;
    let (a, b) = (spec.a, spec.b);
    let mut launch = |iters: i32| unsafe {
        gpu.launch(
            f,
            grid,
            MMA_BLOCK,
            &mut [arg(&out.ptr), arg(&a), arg(&b), arg(&iters)],
        )
    };
    let base = if ctx.mode == Mode::Check { 4 } else { 64 };
    // At most 4096 iterations: every accumulator then holds at most 4096 increments, so the
    // closed form stays exact even where the tensor cores accumulate with fewer than 24 bits
    // (fp8 on sm_90 keeps about 14); int8 sums stay far below 2^31. A 4096-iteration launch
    // already lasts far longer than a sample needs.
    let iters = calibrate(ctx, gpu, base, 1 << 12, &mut launch)?;
    let (times, conditions) = timed(ctx, gpu, || launch(iters))?;
    let want = MMA_CHAINS * 4.0 * iters as f64 * spec.per_mma;
    let bad = wrong_lane(gpu, &out, want, spec.int, 1e-6)?;
    if let Some((i, got)) = bad {
        return Err(CudaError::Check(format!(
            "{} lane {i}: GPU {got}, expected {want}",
            spec.kernel
        )));
    }
    let ops = warps * iters as f64 * MMA_CHAINS * spec.ops;
    let rates: Vec<f64> = times.iter().map(|t| ops / t).collect();
    let unit = if spec.int { "OP/s" } else { "FLOP/s" };
    let peak = ctx.peak(gpu, spec.precision.name(), "matrix");
    ctx.push(
        compute_roof(gpu.ordinal, Family::Mma, spec.precision, None),
        CeilingKind::Compute,
        unit,
        &rates,
        PerIteration { ops, bytes: 0.0 },
        format!(
            "NVRTC kernel {}: warp-level mma.sync, {grid} blocks × {MMA_BLOCK} threads, 4 independent accumulators per warp, {iters} iterations; every lane's sum equals the closed form, and the layout kernel's one mma on distinct values equals A x B in every lane{}",
            spec.kernel,
            if gpu.arch() >= 90 { "; on sm_90 mma.sync reaches only part of the tensor-core peak (wgmma is needed for all of it: gpu/wgmma, and gpu/gemm for the library figure)" } else { "" }
        ),
        peak,
        conditions,
    );
    Ok(format!("{threads} lanes exact; {}", layout?))
}
