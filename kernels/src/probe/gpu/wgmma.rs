//! Hopper's tensor-core peak through warpgroup-level `wgmma` (`kernels/cuda/wgmma.cu`, sm_90a):
//! what the dense datasheet rate needs on sm_90, where `mma.sync` reaches about two thirds of
//! it. One warpgroup a block, both operands in shared memory, an m64n256 accumulator in
//! registers; every accumulator element is checked against the closed form on the host, and
//! the layout first on distinct values (`wgmma_layout.rs`). The
//! blocks per SM (one to three warpgroups) are tried in turn and the fastest kept.

use super::*;

/// Threads of one block: one warpgroup.
pub(super) const WGMMA_BLOCK: u32 = 128;
/// wgmmas per loop iteration (the kernel's `UNROLL`).
pub(super) const WGMMA_UNROLL: f64 = 4.0;
/// The instruction's M × N.
const MN: f64 = 64.0 * 256.0;

pub(super) struct WgmmaSpec {
    pub(super) precision: Precision,
    pub(super) kernel: &'static str,
    /// K of the instruction: 2·M·N·K operations each.
    pub(super) k: f64,
    /// 32-bit patterns of one A and one B element, repeated over the word.
    pub(super) a: u32,
    pub(super) b: u32,
    /// What one instruction adds to every accumulator element: K · a · b.
    pub(super) per_wgmma: f64,
    pub(super) int: bool,
    /// The ceiling it gives (e5m2 runs at e4m3's rate and is reported beside it).
    pub(super) ceiling: bool,
}

pub(super) const WGMMA: [WgmmaSpec; 6] = [
    // f16: a = 1.0 (0x3C00), b = 2^-10 (0x1400), K = 16.
    WgmmaSpec {
        precision: Precision::F16,
        kernel: "wgmma_f16",
        k: 16.0,
        a: 0x3C00_3C00,
        b: 0x1400_1400,
        per_wgmma: 16.0 / 1024.0,
        int: false,
        ceiling: true,
    },
    // bf16: a = 1.0 (0x3F80), b = 2^-10 (0x3A80), K = 16.
    WgmmaSpec {
        precision: Precision::Bf16,
        kernel: "wgmma_bf16",
        k: 16.0,
        a: 0x3F80_3F80,
        b: 0x3A80_3A80,
        per_wgmma: 16.0 / 1024.0,
        int: false,
        ceiling: true,
    },
    // tf32 (f32 bits): a = 1.0, b = 2^-10, K = 8.
    WgmmaSpec {
        precision: Precision::Tf32,
        kernel: "wgmma_tf32",
        k: 8.0,
        a: 0x3F80_0000,
        b: 0x3A80_0000,
        per_wgmma: 8.0 / 1024.0,
        int: false,
        ceiling: true,
    },
    // e4m3: a = 1.0 (0x38), b = 2^-6 (0x08), K = 32.
    WgmmaSpec {
        precision: Precision::Fp8,
        kernel: "wgmma_e4m3",
        k: 32.0,
        a: 0x3838_3838,
        b: 0x0808_0808,
        per_wgmma: 32.0 / 64.0,
        int: false,
        ceiling: true,
    },
    // e5m2: a = 1.0 (0x3C), b = 2^-6 (0x24: exponent 9 of bias 15), K = 32.
    WgmmaSpec {
        precision: Precision::Fp8,
        kernel: "wgmma_e5m2",
        k: 32.0,
        a: 0x3C3C_3C3C,
        b: 0x2424_2424,
        per_wgmma: 32.0 / 64.0,
        int: false,
        ceiling: false,
    },
    // int8: a = b = 1, K = 32.
    WgmmaSpec {
        precision: Precision::Int8,
        kernel: "wgmma_int8",
        k: 32.0,
        a: 0x0101_0101,
        b: 0x0101_0101,
        per_wgmma: 32.0,
        int: true,
        ceiling: true,
    },
];

/// Whether the probe runs the wgmma kernels on a GPU of architecture `arch`: `Err` says why
/// not (they are sm_90a code, which runs on sm_90 only).
pub fn wgmma_support(arch: u32) -> Result<(), String> {
    if arch == 90 {
        Ok(())
    } else {
        Err(format!(
            "wgmma is sm_90a code, which runs on sm_90 (Hopper) only; this GPU is sm_{arch} (Blackwell's tcgen05.mma needs tensor memory and is not built)"
        ))
    }
}

pub(super) fn wgmma_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    if let Err(why) = wgmma_support(gpu.arch()) {
        ctx.out.notes.push(format!("gpu{}: {why}", gpu.ordinal));
        return Ok(());
    }
    let mut e4m3: Option<f64> = None;
    for spec in &WGMMA {
        ctx.cancelled()?;
        let r = wgmma_one(ctx, gpu, spec, e4m3).map(|(detail, best)| {
            if spec.kernel == "wgmma_e4m3" {
                e4m3 = Some(best);
            }
            detail
        });
        ctx.checked(gpu.ordinal, spec.kernel, r)?;
    }
    Ok(())
}

/// The closed form every accumulator element holds after `wgmmas` instructions.
pub(super) fn wgmma_expected(spec: &WgmmaSpec, wgmmas: f64) -> f64 {
    wgmmas * spec.per_wgmma
}

/// The fastest launch shape of a kernel: its best rate, blocks an SM, iterations, operations a
/// launch, every sample's rate and the samples' conditions.
struct Launch {
    top: f64,
    per_sm: u32,
    iters: i32,
    ops: f64,
    rates: Vec<f64>,
    conditions: Option<SampleConditions>,
}

/// One kernel: each blocks-per-SM count in turn (one, two, three warpgroups), every lane's
/// value checked, the fastest pushed as the precision's `wgmma` ceiling (e5m2's rate is
/// reported beside e4m3's, `e4m3` its best). Returns the check's detail and the best rate.
fn wgmma_one(
    ctx: &mut Ctx,
    gpu: &mut Gpu,
    spec: &WgmmaSpec,
    e4m3: Option<f64>,
) -> Result<(String, f64), CudaError> {
    // First the layout: one wgmma of the same instruction and descriptors on distinct values
    // (the peak kernel's uniform values cannot show a wrong layout). A wrong one fails the
    // kernel's check after the timings: the rate stays, beside the failure that flags it.
    let layout = super::wgmma_layout::check_layout(gpu, spec);
    if let Err(CudaError::Interrupted) = layout {
        return Err(CudaError::Interrupted);
    }
    let f = gpu.function(spec.kernel)?;
    let mut best: Option<Launch> = None;
    for per_sm in 1..=3u32 {
        let grid = gpu.grid_for(WGMMA_BLOCK, per_sm * WGMMA_BLOCK);
        let threads = (grid * WGMMA_BLOCK) as usize;
        let out = gpu.alloc(threads * 4)?;
        let (a, b) = (spec.a, spec.b);
        let mut launch = |iters: i32| unsafe {
            gpu.launch(
                f,
                grid,
                WGMMA_BLOCK,
                &mut [arg(&out.ptr), arg(&a), arg(&b), arg(&iters)],
            )
        };
        let base = if ctx.mode == Mode::Check { 4 } else { 64 };
        // At most 1024 iterations (4096 wgmmas): every accumulator then holds at most 4096
        // increments, exact even where fp8 accumulates with about 14 bits.
        let iters = calibrate(ctx, gpu, base, 1 << 10, &mut launch)?;
        let (times, conditions) = timed(ctx, gpu, || launch(iters))?;
        let want = wgmma_expected(spec, iters as f64 * WGMMA_UNROLL);
        // Exactly: every accumulator holds the closed form.
        let bad = wrong_lane(gpu, &out, want, spec.int, 0.0)?;
        if let Some((i, got)) = bad {
            return Err(CudaError::Check(format!(
                "{} ({per_sm} warpgroup(s) an SM) lane {i}: GPU {got}, expected {want} (NaN or -2147483648: the lane's accumulators differ)",
                spec.kernel
            )));
        }
        let ops = grid as f64 * iters as f64 * WGMMA_UNROLL * 2.0 * MN * spec.k;
        let rates: Vec<f64> = times.iter().map(|t| ops / t).collect();
        let top = rates.iter().copied().fold(0.0, f64::max);
        if best.as_ref().is_none_or(|b| top > b.top) {
            best = Some(Launch {
                top,
                per_sm,
                iters,
                ops,
                rates,
                conditions,
            });
        }
    }
    let Launch {
        top,
        per_sm,
        iters,
        ops,
        rates,
        conditions,
    } = best.ok_or_else(|| CudaError::Check("no launch".into()))?;
    if !spec.ceiling {
        let beside = e4m3.map_or(String::new(), |e| {
            format!(" ({:.2} × e4m3's)", top / e.max(1e-300))
        });
        ctx.out.notes.push(format!(
            "gpu{}: wgmma fp8 e5m2 {}FLOP/s{beside}; the fp8 ceiling is e4m3's",
            gpu.ordinal,
            roofline_model::si(top)
        ));
        return Ok((detail(per_sm, top, layout?), top));
    }
    let peak = ctx.peak(gpu, spec.precision.name(), "matrix");
    let unit = if spec.int { "OP/s" } else { "FLOP/s" };
    ctx.push(
        compute_roof(gpu.ordinal, Family::Wgmma, spec.precision, None),
        CeilingKind::Compute,
        unit,
        &rates,
        PerIteration { ops, bytes: 0.0 },
        format!(
            "NVRTC kernel {} (sm_90a): warpgroup wgmma.mma_async m64n256k{}, both operands from shared memory through descriptors, the accumulator in registers; {} block(s) of one warpgroup an SM (the fastest of one to three), {iters} iterations of {} wgmmas, one commit group in flight; every accumulator of every lane equals the closed form, and the layout kernel's one wgmma on distinct values equals A x B^T in every accumulator",
            spec.kernel, spec.k, per_sm, WGMMA_UNROLL
        ),
        peak,
        conditions,
    );
    Ok((detail(per_sm, top, layout?), top))
}

/// A kernel's check line: its launch, its exactness, its layout check.
fn detail(per_sm: u32, top: f64, layout: String) -> String {
    format!(
        "{per_sm} warpgroup(s) an SM, every accumulator exact, {}FLOP/s; {layout}",
        roofline_model::si(top)
    )
}
