//! The GPU probe: every NVIDIA GPU's ceilings, each checked against a CPU reference.
//!
//! Sections (the CPU's names): `fma` (FMA peak per precision on the CUDA cores, tensor-core peak
//! through mma.sync), `mem` (read/write/copy/triad working-set sweep → L2 and HBM plateaus, and
//! the ERT FLOPs-per-element sweep), `gemm` (cuBLAS and cuBLASLt), `conv` (cuDNN), `copy`
//! (host↔device, device↔device, peer to peer). Timing: CUDA events around each sample after a
//! warm-up launch; the ceiling is the best sample, the spread is kept. `Mode::Check` runs every
//! kernel once on small inputs and reports pass/fail per kernel instead of measuring.
//!
//! Every `unsafe { gpu.launch(..) }` below passes arguments whose types and order match the
//! kernel's signature in `kernels/cuda/*.cu` (pointers to device buffers that outlive the
//! launch's completion: each function synchronizes before its buffers drop).

use super::{Progress, Section};
use crate::cuda::device::{self, arg, DevBuf, Gpu};
use crate::cuda::{blas, dnn, CudaError};
use cudarc::driver::{result as cu, sys};
use roofline_model::{
    Ceiling, CeilingKind, Curve, CurvePoint, GpuInfo, PeakDb, PerIteration, Stats, Table,
    TheoreticalPeak,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

/// How much to do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Every kernel once on small inputs, checked; no ceilings.
    Check,
    /// Fewer samples, coarser sweeps.
    Quick,
    Full,
}

impl Mode {
    fn samples(self) -> usize {
        match self {
            Mode::Check => 1,
            Mode::Quick => 5,
            Mode::Full => 15,
        }
    }

    /// Target GPU time of one timed sample, seconds.
    fn sample_seconds(self) -> f64 {
        match self {
            Mode::Check => 0.0,
            Mode::Quick => 0.005,
            Mode::Full => 0.02,
        }
    }
}

pub struct GpuConfig {
    pub mode: Mode,
    pub sections: Vec<Section>,
}

/// One kernel's result check in `--check` mode.
#[derive(Clone, Debug)]
pub struct CheckLine {
    pub gpu: usize,
    pub kernel: String,
    /// `None`: passed; `Some(why)`: failed (or, with `skipped`, not run).
    pub failure: Option<String>,
    pub skipped: bool,
    pub detail: String,
}

#[derive(Default)]
pub struct GpuResult {
    pub gpus: Vec<GpuInfo>,
    pub ceilings: Vec<Ceiling>,
    pub curves: Vec<Curve>,
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
    pub checks: Vec<CheckLine>,
}

/// The inventory the driver API gives (NVML adds the rest in the CLI's collector).
pub fn inventory(gpu: &Gpu) -> GpuInfo {
    GpuInfo {
        index: gpu.ordinal,
        name: gpu.name.clone(),
        uuid: roofline_uuid(&gpu.uuid),
        compute_capability: format!("{}.{}", gpu.cc.0, gpu.cc.1),
        sm_count: gpu.sms,
        memory_bytes: gpu.memory_bytes,
        l2_bytes: gpu.l2_bytes,
        cuda_driver_version: device::driver_version().ok(),
        ..GpuInfo::default()
    }
}

/// Loads the driver and counts the GPUs (see [`device::init`]).
pub fn init() -> Result<usize, CudaError> {
    device::init()
}

/// The UUIDs of every GPU, in ordinal order (NVML's form), without creating contexts.
pub fn uuids() -> Result<Vec<String>, CudaError> {
    let n = device::init()?;
    (0..n)
        .map(|i| {
            let dev = device::check("cuDeviceGet", cu::device::get(i as i32))?;
            let u = device::check("cuDeviceGetUuid", cu::device::get_uuid(dev))?;
            let b: [u8; 16] = std::array::from_fn(|k| u.bytes[k] as u8);
            Ok(roofline_uuid(&b))
        })
        .collect()
}

/// The versions of the CUDA libraries in use, for provenance (those present).
pub fn library_versions() -> Vec<String> {
    use crate::cuda::libs::{self, Lib};
    let mut v = Vec::new();
    if let Ok(d) = device::driver_version() {
        v.push(format!("CUDA driver API {d}"));
    }
    if let Ok((major, minor)) = crate::cuda::nvrtc::version() {
        v.push(format!(
            "NVRTC {major}.{minor} ({})",
            libs::locate(Lib::Nvrtc).unwrap_or_default()
        ));
    }
    if libs::present(Lib::Cublas) {
        use cudarc::cublas::sys as b;
        let mut parts = [0i32; 3];
        let props = [
            b::libraryPropertyType::MAJOR_VERSION,
            b::libraryPropertyType::MINOR_VERSION,
            b::libraryPropertyType::PATCH_LEVEL,
        ];
        // SAFETY: out-parameters; the status is checked.
        let ok = props
            .iter()
            .zip(parts.iter_mut())
            .all(|(p, out)| unsafe { b::cublasGetProperty(*p, out).result().is_ok() });
        if ok {
            v.push(format!("cuBLAS {}.{}.{}", parts[0], parts[1], parts[2]));
        }
    }
    if libs::present(Lib::CublasLt) {
        // SAFETY: no arguments.
        v.push(format!("cuBLASLt {}", unsafe {
            cudarc::cublaslt::sys::cublasLtGetVersion()
        }));
    }
    if libs::present(Lib::Cudnn) {
        v.push(format!("cuDNN {}", cudarc::cudnn::result::get_version()));
    }
    v
}

/// NVML's form of the UUID (`GPU-` + 8-4-4-4-12 hex digits).
pub fn roofline_uuid(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02x}")).collect();
    format!(
        "GPU-{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

struct Ctx<'a> {
    mode: Mode,
    cancel: &'a AtomicBool,
    peaks: &'a PeakDb,
    out: GpuResult,
}

impl Ctx<'_> {
    fn cancelled(&self) -> Result<(), CudaError> {
        if self.cancel.load(Ordering::Relaxed) {
            Err(CudaError::Interrupted)
        } else {
            Ok(())
        }
    }

    /// Records one kernel's check. In check mode a failure is a line; otherwise it ends the
    /// probe (a ceiling from a wrong result is worse than none).
    fn checked(
        &mut self,
        gpu: usize,
        kernel: &str,
        r: Result<String, CudaError>,
    ) -> Result<(), CudaError> {
        match r {
            Ok(detail) => {
                self.out.checks.push(CheckLine {
                    gpu,
                    kernel: kernel.into(),
                    failure: None,
                    skipped: false,
                    detail,
                });
                Ok(())
            }
            Err(CudaError::Interrupted) => Err(CudaError::Interrupted),
            Err(CudaError::Unsupported(why) | CudaError::Missing(why)) => {
                self.out
                    .notes
                    .push(format!("gpu{gpu} {kernel}: not measured: {why}"));
                self.out.checks.push(CheckLine {
                    gpu,
                    kernel: kernel.into(),
                    failure: Some(why),
                    skipped: true,
                    detail: String::new(),
                });
                Ok(())
            }
            Err(e) if self.mode == Mode::Check => {
                self.out.checks.push(CheckLine {
                    gpu,
                    kernel: kernel.into(),
                    failure: Some(e.to_string()),
                    skipped: false,
                    detail: String::new(),
                });
                Ok(())
            }
            // A wrong result ends the probe: a ceiling from it would be worse than none.
            Err(e @ CudaError::Check(_)) => Err(e),
            // Anything else (a library call, a compilation, an allocation) costs this kernel
            // only: a note, and the CPU's and the other kernels' results are still written.
            Err(e) => {
                self.out
                    .notes
                    .push(format!("gpu{gpu} {kernel}: not measured: {e}"));
                Ok(())
            }
        }
    }

    /// Ends one section of one GPU: as [`Ctx::checked`] for what escaped its kernels (a
    /// failed setup is a note naming the section; a failed result check stays fatal).
    fn section(
        &mut self,
        gpu: usize,
        name: &str,
        r: Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        match r {
            Ok(()) => Ok(()),
            Err(e) => self.checked(gpu, name, Err(e)),
        }
    }

    fn peak(&self, gpu: &Gpu, precision: &str, engine: &str) -> Option<TheoreticalPeak> {
        let d = self.peaks.device(&gpu.name)?;
        let p = d.engine_peak(precision, engine)?;
        Some(TheoreticalPeak {
            value: p.value,
            unit: p.unit.clone(),
            source: format!(
                "{} ({} {engine} peak at {} MHz): {}",
                d.name, precision, d.clock_mhz, d.source
            ),
            uncertainty: 0.0,
        })
    }

    fn memory_peak(&self, gpu: &Gpu) -> Option<TheoreticalPeak> {
        let d = self.peaks.device(&gpu.name)?;
        Some(TheoreticalPeak {
            value: d.memory_bandwidth,
            unit: "B/s".into(),
            source: format!("{} memory bandwidth: {}", d.name, d.source),
            uncertainty: 0.0,
        })
    }

    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        id: String,
        kind: CeilingKind,
        unit: &str,
        samples: &[f64],
        per_iteration: PerIteration,
        method: String,
        peak: Option<TheoreticalPeak>,
        precision: Option<&str>,
        level: Option<&str>,
    ) {
        if self.mode == Mode::Check {
            return;
        }
        let Some(stats) = Stats::from_samples(samples) else {
            return;
        };
        let mut c = Ceiling {
            id,
            kind,
            value: stats.max,
            unit: unit.into(),
            threads: 1,
            precision: precision.map(String::from),
            level: level.map(String::from),
            stats,
            theoretical_peak: peak,
            above_peak: false,
            method,
            per_iteration,
        };
        c.flag_against_peak();
        self.out.ceilings.push(c);
    }
}

/// Runs `work` once as warm-up, then `samples` timed times; returns seconds per sample.
fn timed(
    ctx: &Ctx,
    gpu: &Gpu,
    mut work: impl FnMut() -> Result<(), CudaError>,
) -> Result<Vec<f64>, CudaError> {
    work()?;
    gpu.sync()?;
    let mut t = Vec::with_capacity(ctx.mode.samples());
    for _ in 0..ctx.mode.samples() {
        ctx.cancelled()?;
        t.push(gpu.time(&mut work)?);
    }
    Ok(t)
}

/// Iterations that make one launch take about the mode's sample time, from a trial at `base`.
fn calibrate(
    ctx: &Ctx,
    gpu: &Gpu,
    base: i32,
    cap: i32,
    mut launch: impl FnMut(i32) -> Result<(), CudaError>,
) -> Result<i32, CudaError> {
    if ctx.mode == Mode::Check {
        return Ok(base);
    }
    launch(base)?;
    let t = gpu.time(|| launch(base))?;
    let want = ctx.mode.sample_seconds();
    let scale = if t > 0.0 { want / t } else { 64.0 };
    Ok(((base as f64 * scale).round() as i64).clamp(base as i64, cap as i64) as i32)
}

/// Probes every GPU. `Missing`/`NoDevice` errors say there is nothing to probe.
pub fn run(
    cfg: &GpuConfig,
    cancel: &AtomicBool,
    progress: &dyn Progress,
    peaks: &PeakDb,
    enrich: &dyn Fn(&mut GpuInfo) -> Result<(), String>,
) -> Result<GpuResult, CudaError> {
    let n = device::init()?;
    let mut ctx = Ctx {
        mode: cfg.mode,
        cancel,
        peaks,
        out: GpuResult::default(),
    };
    let mut gpus = Vec::with_capacity(n);
    for i in 0..n {
        match Gpu::open(i) {
            Ok(g) => gpus.push(g),
            // A GPU that cannot be opened (taken in exclusive-process mode, fallen off the
            // bus) is a note; the others are still measured.
            Err(e) => ctx.out.notes.push(format!("gpu{i}: not probed: {e}")),
        }
    }
    if gpus.is_empty() {
        return Err(CudaError::NoDevice(format!(
            "none of the {n} GPUs could be opened: {}",
            ctx.out.notes.join("; ")
        )));
    }
    let n = gpus.len();
    let has = |s| cfg.sections.contains(&s);
    let per_gpu = [
        Section::Fma,
        Section::Mem,
        Section::Gemm,
        Section::Conv,
        Section::Copy,
    ]
    .iter()
    .filter(|s| has(**s))
    .count();
    progress.begin(
        (per_gpu * n
            + if has(Section::Copy) {
                n * n.saturating_sub(1)
            } else {
                0
            }) as u64,
    );
    for gpu in gpus.iter_mut() {
        // The collector's part of the inventory (NVML: PCIe, NVLink, clocks) comes first: the
        // copy ceilings take their peaks from it.
        let mut info = inventory(gpu);
        if let Err(e) = enrich(&mut info) {
            ctx.out.notes.push(format!("gpu{}: {e}", gpu.ordinal));
        }
        ctx.out.gpus.push(info);
        let nvrtc = crate::cuda::nvrtc::ensure_nvrtc();
        let own_kernels = nvrtc.is_ok() && gpu.arch() >= 80;
        if let Err(e) = nvrtc {
            ctx.out.notes.push(format!(
                "gpu{}: roofline's own kernels (FMA, mma, memory sweep, ERT, SM peer copies) are not measured: {e}",
                gpu.ordinal
            ));
        }
        if gpu.arch() < 80 {
            ctx.out.notes.push(format!(
                "gpu{}: compute capability {}.{}: roofline's own kernels (FMA, mma, memory, ERT) need 8.0 or newer; only the libraries and copies are measured",
                gpu.ordinal, gpu.cc.0, gpu.cc.1
            ));
        }
        if ctx.peaks.device(&gpu.name).is_none() {
            ctx.out.notes.push(format!(
                "gpu{}: {} is not in the peak database: its ceilings have no theoretical peak",
                gpu.ordinal, gpu.name
            ));
        }
        let o = gpu.ordinal;
        if has(Section::Fma) && own_kernels {
            progress.advance(&format!("gpu{o} fma and mma peaks"));
            let r = fma_section(&mut ctx, gpu);
            ctx.section(o, "fma", r)?;
            let r = mma_section(&mut ctx, gpu);
            ctx.section(o, "mma", r)?;
        }
        if has(Section::Mem) && own_kernels {
            progress.advance(&format!("gpu{o} memory sweep and ERT"));
            let r = mem_section(&mut ctx, gpu);
            ctx.section(o, "mem", r)?;
            let r = ert_section(&mut ctx, gpu);
            ctx.section(o, "ert", r)?;
        }
        if has(Section::Gemm) {
            progress.advance(&format!("gpu{} cuBLAS / cuBLASLt GEMM", gpu.ordinal));
            let r = blas::gemm_section(gpu, ctx.mode, cancel, peaks);
            absorb(&mut ctx, gpu.ordinal, "gemm", r)?;
        }
        if has(Section::Conv) {
            progress.advance(&format!("gpu{} cuDNN convolution", gpu.ordinal));
            let r = dnn::conv_section(gpu, ctx.mode, cancel, peaks);
            absorb(&mut ctx, gpu.ordinal, "conv", r)?;
        }
        if has(Section::Copy) {
            progress.advance(&format!("gpu{o} host-device copies"));
            let r = copy_section(&mut ctx, gpu);
            ctx.section(o, "copy", r)?;
        }
        if !gpu.loaded().is_empty() {
            ctx.out.notes.push(format!(
                "gpu{} kernels loaded as {}",
                gpu.ordinal,
                gpu.loaded().join(", ")
            ));
        }
    }
    if has(Section::Copy) {
        for i in 0..n {
            for j in 0..n {
                if i != j {
                    progress.advance(&format!("gpu{i} -> gpu{j} peer copies"));
                    let (a, b) = pair(&mut gpus, i, j);
                    let (oa, ob) = (a.ordinal, b.ordinal);
                    let r = p2p(&mut ctx, a, b);
                    ctx.section(oa, &format!("p2p to gpu{ob}"), r)?;
                }
            }
        }
    }
    Ok(ctx.out)
}

/// Merges a library section's results (its own checks included).
fn absorb(
    ctx: &mut Ctx,
    gpu: usize,
    what: &str,
    r: Result<blas::SectionResult, CudaError>,
) -> Result<(), CudaError> {
    match r {
        Ok(s) => {
            if ctx.mode != Mode::Check {
                ctx.out.ceilings.extend(s.ceilings);
                ctx.out.tables.extend(s.tables);
            }
            ctx.out.notes.extend(s.notes);
            for (kernel, res) in s.checks {
                ctx.checked(gpu, &kernel, res)?;
            }
            Ok(())
        }
        Err(CudaError::Missing(why)) => {
            ctx.out
                .notes
                .push(format!("gpu{gpu} {what}: not measured: {why}"));
            ctx.out.checks.push(CheckLine {
                gpu,
                kernel: what.into(),
                failure: Some(why),
                skipped: true,
                detail: String::new(),
            });
            Ok(())
        }
        Err(e) => ctx.checked(gpu, what, Err(e)),
    }
}

fn pair(gpus: &mut [Gpu], i: usize, j: usize) -> (&mut Gpu, &mut Gpu) {
    if i < j {
        let (lo, hi) = gpus.split_at_mut(j);
        (&mut lo[i], &mut hi[0])
    } else {
        let (lo, hi) = gpus.split_at_mut(i);
        (&mut hi[0], &mut lo[j])
    }
}

// ---------------------------------------------------------------------------------------------
// FMA peak on the CUDA cores

const FMA_ACC: usize = 8;
const FMA_UNROLL: usize = 16;
const FMA_BLOCK: u32 = 256;

fn fma_start_f64(tid: usize, i: usize) -> f64 {
    ((tid + i) & 255) as f64 / 256.0
}

/// The kernel's per-thread result, computed on the CPU with the same fused operations.
fn fma_ref_f64(tid: usize, a: f64, b: f64, iters: usize) -> f64 {
    let mut x: [f64; FMA_ACC] = std::array::from_fn(|i| fma_start_f64(tid, i));
    for _ in 0..iters * FMA_UNROLL {
        for v in x.iter_mut() {
            *v = v.mul_add(a, b);
        }
    }
    x.iter().fold(0.0, |s, v| s + v)
}

fn fma_ref_f32(tid: usize, a: f32, b: f32, iters: usize) -> f32 {
    let mut x: [f32; FMA_ACC] = std::array::from_fn(|i| fma_start_f64(tid, i) as f32);
    for _ in 0..iters * FMA_UNROLL {
        for v in x.iter_mut() {
            *v = v.mul_add(a, b);
        }
    }
    x.iter().fold(0.0, |s, v| s + v)
}

/// One packed-half lane: x = round(x * a + b), the product and sum exact in f64.
fn half_fma(bits: u16, a: u16, b: u16, bf16: bool) -> u16 {
    if bf16 {
        let f = |v: u16| half::bf16::from_bits(v).to_f64();
        half::bf16::from_f64(f(bits).mul_add(f(a), f(b))).to_bits()
    } else {
        let f = |v: u16| half::f16::from_bits(v).to_f64();
        half::f16::from_f64(f(bits).mul_add(f(a), f(b))).to_bits()
    }
}

fn half_bits(v: f64, bf16: bool) -> u16 {
    if bf16 {
        half::bf16::from_f64(v).to_bits()
    } else {
        half::f16::from_f64(v).to_bits()
    }
}

fn half_value(bits: u16, bf16: bool) -> f64 {
    if bf16 {
        half::bf16::from_bits(bits).to_f64()
    } else {
        half::f16::from_bits(bits).to_f64()
    }
}

fn fma_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let grid = gpu.grid_for(FMA_BLOCK, 2048);
    let threads = (grid * FMA_BLOCK) as usize;
    for precision in ["f64", "f32", "f16", "bf16"] {
        ctx.cancelled()?;
        let r = fma_one(ctx, gpu, precision, grid, threads);
        ctx.checked(gpu.ordinal, &format!("fma_{precision}"), r)?;
    }
    Ok(())
}

fn fma_one(
    ctx: &mut Ctx,
    gpu: &mut Gpu,
    precision: &str,
    grid: u32,
    threads: usize,
) -> Result<String, CudaError> {
    let kernel = match precision {
        "f64" => "fma_f64",
        "f32" => "fma_f32",
        "f16" => "fma_f16x2",
        _ => "fma_bf16x2",
    };
    let f = gpu.function(kernel)?;
    let packed = matches!(precision, "f16" | "bf16");
    let bf16 = precision == "bf16";
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
        match precision {
            "f64" => unsafe {
                gpu.launch(
                    f,
                    grid,
                    FMA_BLOCK,
                    &mut [arg(&out.ptr), arg(&a64), arg(&b64), arg(&iters)],
                )
            },
            "f32" => unsafe {
                gpu.launch(
                    f,
                    grid,
                    FMA_BLOCK,
                    &mut [arg(&out.ptr), arg(&a32), arg(&b32), arg(&iters)],
                )
            },
            _ => unsafe {
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
    let times = timed(ctx, gpu, || launch(iters))?;
    // Check a sample of threads against the CPU model of the same chains.
    let lanes = if packed { 2.0 } else { 1.0 };
    let flops = 2.0 * lanes * (FMA_ACC * FMA_UNROLL) as f64 * iters as f64 * threads as f64;
    let sample: Vec<usize> = (0..8).map(|k| k * (threads / 8) + k % 3).collect();
    let mut worst = 0.0f64;
    match precision {
        "f64" => {
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
        "f32" => {
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
        _ => {
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
    let id = format!("gpu{}/fma/{precision}", gpu.ordinal);
    let peak = ctx.peak(gpu, precision, "vector");
    ctx.push(
        id,
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
        Some(precision),
        None,
    );
    Ok(format!(
        "{} threads sampled, max rel. error {worst:.1e}",
        sample.len()
    ))
}

// ---------------------------------------------------------------------------------------------
// Tensor-core peak through mma.sync

const MMA_CHAINS: f64 = 4.0;
const MMA_BLOCK: u32 = 256;

struct MmaSpec {
    precision: &'static str,
    kernel: &'static str,
    /// Operations (2·M·N·K) of one mma instruction.
    ops: f64,
    a: u32,
    b: u32,
    /// The product of one A and one B element times K: what each mma adds to each D element.
    per_mma: f64,
    min_arch: u32,
    int: bool,
}

const MMA: [MmaSpec; 5] = [
    // f16: a = 1.0 (0x3C00), b = 2^-10 (0x1400), K = 16.
    MmaSpec {
        precision: "f16",
        kernel: "mma_f16",
        ops: 4096.0,
        a: 0x3C00_3C00,
        b: 0x1400_1400,
        per_mma: 16.0 / 1024.0,
        min_arch: 80,
        int: false,
    },
    // bf16: a = 1.0 (0x3F80), b = 2^-10 (0x3A80), K = 16.
    MmaSpec {
        precision: "bf16",
        kernel: "mma_bf16",
        ops: 4096.0,
        a: 0x3F80_3F80,
        b: 0x3A80_3A80,
        per_mma: 16.0 / 1024.0,
        min_arch: 80,
        int: false,
    },
    // tf32 (f32 bits): a = 1.0, b = 2^-10, K = 8.
    MmaSpec {
        precision: "tf32",
        kernel: "mma_tf32",
        ops: 2048.0,
        a: 0x3F80_0000,
        b: 0x3A80_0000,
        per_mma: 8.0 / 1024.0,
        min_arch: 80,
        int: false,
    },
    // int8: a = b = 1, K = 32.
    MmaSpec {
        precision: "int8",
        kernel: "mma_int8",
        ops: 8192.0,
        a: 0x0101_0101,
        b: 0x0101_0101,
        per_mma: 32.0,
        min_arch: 80,
        int: true,
    },
    // fp8 e4m3: a = 1.0 (0x38), b = 2^-6 (0x08), K = 32.
    MmaSpec {
        precision: "fp8",
        kernel: "mma_fp8",
        ops: 8192.0,
        a: 0x3838_3838,
        b: 0x0808_0808,
        per_mma: 32.0 / 64.0,
        min_arch: 89,
        int: false,
    },
];

fn mma_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    for spec in &MMA {
        ctx.cancelled()?;
        let r = if gpu.arch() < spec.min_arch {
            Err(CudaError::Unsupported(format!(
                "{} mma needs sm_{} or newer; this GPU is sm_{}",
                spec.precision,
                spec.min_arch,
                gpu.arch()
            )))
        } else {
            mma_one(ctx, gpu, spec).map_err(|e| fp8_needs_newer_nvrtc(spec, e))
        };
        ctx.checked(gpu.ordinal, spec.kernel, r)?;
    }
    Ok(())
}

/// NVRTC before 12.4 cannot compile the fp8 mma for sm_89/sm_90 (it needs PTX ISA 8.4): that
/// is a missing capability of the toolkit, noted, not a failed kernel.
fn fp8_needs_newer_nvrtc(spec: &MmaSpec, e: CudaError) -> CudaError {
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

fn mma_one(ctx: &mut Ctx, gpu: &mut Gpu, spec: &MmaSpec) -> Result<String, CudaError> {
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
    let times = timed(ctx, gpu, || launch(iters))?;
    let want = MMA_CHAINS * 4.0 * iters as f64 * spec.per_mma;
    let bad = if spec.int {
        let v: Vec<i32> = gpu.download(&out)?;
        v.iter()
            .position(|&x| x as f64 != want)
            .map(|i| (i, v[i] as f64))
    } else {
        let v: Vec<f32> = gpu.download(&out)?;
        v.iter()
            .position(|&x| (x as f64 - want).abs() > 1e-6 * want)
            .map(|i| (i, v[i] as f64))
    };
    if let Some((i, got)) = bad {
        return Err(CudaError::Check(format!(
            "{} lane {i}: GPU {got}, expected {want}",
            spec.kernel
        )));
    }
    let ops = warps * iters as f64 * MMA_CHAINS * spec.ops;
    let rates: Vec<f64> = times.iter().map(|t| ops / t).collect();
    let unit = if spec.int { "OP/s" } else { "FLOP/s" };
    let peak = ctx.peak(gpu, spec.precision, "matrix");
    ctx.push(
        format!("gpu{}/mma/{}", gpu.ordinal, spec.precision),
        CeilingKind::Compute,
        unit,
        &rates,
        PerIteration { ops, bytes: 0.0 },
        format!(
            "NVRTC kernel {}: warp-level mma.sync, {grid} blocks × {MMA_BLOCK} threads, 4 independent accumulators per warp, {iters} iterations; every lane's sum equals the closed form{}",
            spec.kernel,
            if gpu.arch() >= 90 { "; on sm_90 mma.sync reaches only part of the tensor-core peak (wgmma is needed for all of it) — see gpu/gemm for the library figure" } else { "" }
        ),
        peak,
        Some(spec.precision),
        None,
    );
    Ok(format!("{threads} lanes exact"))
}

// ---------------------------------------------------------------------------------------------
// Memory: working-set sweep

const MEM_BLOCK: u32 = 256;
const MEM_OPS: [&str; 4] = ["read", "write", "copy", "triad"];

/// pattern(i, seed) of stream.cu: small integers as f32 bits.
fn pattern(i: u64, seed: u32) -> u32 {
    (((i as u32).wrapping_mul(7).wrapping_add(seed) & 1023) as f32).to_bits()
}

/// Wrapping sum of pattern(w, seed) for w < words (periodic in w with period 1024).
fn pattern_sum(words: u64, seed: u32) -> u32 {
    let period: u32 = (0..1024u64).fold(0u32, |s, w| s.wrapping_add(pattern(w, seed)));
    let full = words / 1024;
    let mut s = period.wrapping_mul(full as u32);
    for w in full * 1024..words {
        s = s.wrapping_add(pattern(w, seed));
    }
    s
}

struct MemBufs {
    a: DevBuf,
    b: DevBuf,
    c: DevBuf,
    sums: DevBuf,
    bad: DevBuf,
    /// Capacity of each buffer in 16-byte words.
    words16: u64,
}

fn mem_sizes(ctx: &Ctx, gpu: &Gpu) -> Result<Vec<u64>, CudaError> {
    gpu.bind()?;
    let (free, _) = check_mem_info()?;
    let cap = (free as u64 / 4).min(4 << 30);
    let top = match ctx.mode {
        Mode::Check => 16 << 20,
        _ => (8 * gpu.l2_bytes).max(1 << 30).min(cap),
    };
    let step = if ctx.mode == Mode::Full { 2 } else { 4 };
    let mut sizes = Vec::new();
    let mut s: u64 = 1 << 20;
    while s <= top {
        sizes.push(s);
        s *= step;
    }
    if sizes.is_empty() {
        return Err(CudaError::Unsupported(format!(
            "only {free} bytes of GPU memory free"
        )));
    }
    Ok(sizes)
}

fn check_mem_info() -> Result<(usize, usize), CudaError> {
    device::check("cuMemGetInfo", cu::mem_get_info())
}

fn mem_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let sizes = match mem_sizes(ctx, gpu) {
        Ok(s) => s,
        Err(e) => return ctx.checked(gpu.ordinal, "stream", Err(e)),
    };
    let max = *sizes.last().unwrap_or(&(1 << 20));
    let grid = gpu.grid_for(MEM_BLOCK, gpu.max_threads_per_sm);
    let bufs = MemBufs {
        a: gpu.alloc(max as usize)?,
        b: gpu.alloc(max as usize)?,
        c: gpu.alloc(max as usize)?,
        sums: gpu.alloc((grid * MEM_BLOCK) as usize * 4)?,
        bad: gpu.alloc(8)?,
        words16: max / 16,
    };
    let init = gpu.function("stream_init")?;
    for (buf, seed) in [(&bufs.b, 1u32), (&bufs.c, 2u32), (&bufs.a, 3u32)] {
        let n = bufs.words16;
        unsafe {
            gpu.launch(
                init,
                grid,
                MEM_BLOCK,
                &mut [arg(&buf.ptr), arg(&n), arg(&seed)],
            )
        }?;
    }
    gpu.sync()?;
    let l2 = gpu.l2_bytes;
    for op in MEM_OPS {
        let mut points = Vec::new();
        let mut worst: Option<String> = None;
        for &size in &sizes {
            ctx.cancelled()?;
            match mem_point(ctx, gpu, &bufs, op, size, grid) {
                Ok((rates, size)) => {
                    if let Some(stats) = Stats::from_samples(&rates) {
                        let level = if size * 2 <= l2 {
                            Some("L2".to_string())
                        } else if size >= 4 * l2 {
                            Some("HBM".to_string())
                        } else {
                            None
                        };
                        points.push(CurvePoint {
                            x: size as f64,
                            value: stats.max,
                            stats,
                            level,
                        });
                    }
                }
                Err(e) => {
                    worst = Some(e.to_string());
                    ctx.checked(
                        gpu.ordinal,
                        &format!("stream_{op} {}", super::cpu::human_bytes(size as f64)),
                        Err(e),
                    )?;
                }
            }
        }
        if worst.is_none() {
            ctx.checked(
                gpu.ordinal,
                &format!("stream_{op}"),
                Ok(format!("{} sizes checked", sizes.len())),
            )?;
        }
        for level in ["L2", "HBM"] {
            let best = points
                .iter()
                .filter(|p| {
                    p.level.as_deref() == Some(level) && (level != "L2" || p.x >= (2 << 20) as f64)
                })
                .max_by(|a, b| a.value.total_cmp(&b.value));
            if let Some(p) = best {
                let peak = if level == "HBM" {
                    ctx.memory_peak(gpu)
                } else {
                    None
                };
                let samples = p.stats.values.clone();
                ctx.push(
                    format!("gpu{}/mem/{level}/{op}", gpu.ordinal),
                    CeilingKind::Memory,
                    "B/s",
                    &samples,
                    PerIteration { ops: 0.0, bytes: p.x },
                    format!(
                        "NVRTC kernel stream_{op}: 16-byte ld.global.cg/st.global, {grid} blocks × {MEM_BLOCK} threads, grid-stride; best working set {} of the {level} plateau ({}), repeated in-kernel so a sample lasts ≥ {:.0} ms; bytes counted: {}; every word checked on the GPU",
                        super::cpu::human_bytes(p.x),
                        if level == "L2" { format!("working sets ≤ half the {} L2", super::cpu::human_bytes(l2 as f64)) } else { format!("working sets ≥ 4× the L2, {} device memory", super::cpu::human_bytes(gpu.memory_bytes as f64)) },
                        ctx.mode.sample_seconds() * 1e3,
                        stream_counted(op)
                    ),
                    peak,
                    None,
                    Some(level),
                );
            }
        }
        if ctx.mode != Mode::Check {
            ctx.out.curves.push(Curve {
                id: format!("gpu{}/mem/sweep/{op}", gpu.ordinal),
                x_label: "working set (all arrays)".into(),
                x_unit: "B".into(),
                unit: "B/s".into(),
                threads: 1,
                points,
            });
        }
    }
    Ok(())
}

fn stream_factor(op: &str) -> f64 {
    match op {
        "copy" => 2.0,
        "triad" => 3.0,
        _ => 1.0,
    }
}

fn stream_counted(op: &str) -> &'static str {
    match op {
        "read" => "one read per word",
        "write" => "one write per word",
        "copy" => "a read and a write per word",
        _ => "two reads and a write per word",
    }
}

/// Measures `op` over a working set of `size` bytes (all its arrays together); returns B/s
/// samples after checking the result, and the working set actually used.
fn mem_point(
    ctx: &Ctx,
    gpu: &mut Gpu,
    bufs: &MemBufs,
    op: &str,
    size: u64,
    grid: u32,
) -> Result<(Vec<f64>, u64), CudaError> {
    // `size` is the whole working set (all arrays), as in the CPU sweep: each array gets its share.
    let n: u64 = (size as f64 / stream_factor(op)) as u64 / 16;
    let size = n * 16; // bytes per array
    if n > bufs.words16 {
        return Err(CudaError::Check(
            "working set larger than the buffers".into(),
        ));
    }
    let f = gpu.function(&format!("stream_{op}"))?;
    let chk = gpu.function("stream_check")?;
    let per_pass = size as f64 * stream_factor(op);
    // A first guess of passes per launch from the bytes (at least 64 MB moved), then the
    // calibration below sets them so that one timed sample lasts the mode's sample time
    // (5 ms quick, 20 ms full): long against the launch and event overheads (a few µs) at
    // every working-set size, L2-resident ones included.
    let guess: i32 = if ctx.mode == Mode::Check {
        1
    } else {
        ((64e6 / per_pass).ceil() as i32).clamp(1, 1 << 16)
    };
    let value: u32 = 0x3F80_0000 ^ (size as u32);
    let s: f32 = 2.0;
    let launch_reps = |gpu: &Gpu, reps: i32| -> Result<(), CudaError> {
        match op {
            "read" => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&bufs.sums.ptr), arg(&bufs.b.ptr), arg(&n), arg(&reps)],
                )
            },
            "write" => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&bufs.a.ptr), arg(&n), arg(&value), arg(&reps)],
                )
            },
            "copy" => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&bufs.a.ptr), arg(&bufs.b.ptr), arg(&n), arg(&reps)],
                )
            },
            _ => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [
                        arg(&bufs.a.ptr),
                        arg(&bufs.b.ptr),
                        arg(&bufs.c.ptr),
                        arg(&s),
                        arg(&n),
                        arg(&reps),
                    ],
                )
            },
        }
    };
    let g: &Gpu = gpu;
    let reps = calibrate(ctx, g, guess, 1 << 24, |r| launch_reps(g, r))?;
    let times = timed(ctx, g, || launch_reps(g, reps))?;
    // Check what the last launch left.
    let words = n * 4;
    if op == "read" {
        let sums: Vec<u32> = g.download(&bufs.sums)?;
        let got = sums.iter().fold(0u32, |s, v| s.wrapping_add(*v));
        let want = pattern_sum(words, 1).wrapping_mul(reps as u32);
        if got != want {
            return Err(CudaError::Check(format!(
                "stream_read over {size} B: sum {got:#x}, expected {want:#x}"
            )));
        }
    } else {
        g.zero(&bufs.bad)?;
        let kind: i32 = match op {
            "write" => 0,
            "copy" => 1,
            _ => 2,
        };
        let (sb, sc) = (1u32, 2u32);
        unsafe {
            g.launch(
                chk,
                grid,
                MEM_BLOCK,
                &mut [
                    arg(&bufs.bad.ptr),
                    arg(&bufs.a.ptr),
                    arg(&words),
                    arg(&kind),
                    arg(&value),
                    arg(&sb),
                    arg(&sc),
                    arg(&s),
                ],
            )
        }?;
        let bad: Vec<u64> = g.download(&bufs.bad)?;
        if bad.first().copied().unwrap_or(1) != 0 {
            return Err(CudaError::Check(format!(
                "stream_{op} over {size} B: {} of {words} words wrong",
                bad[0]
            )));
        }
    }
    let bytes = per_pass * reps as f64;
    Ok((times.iter().map(|t| bytes / t).collect(), per_pass as u64))
}

// ---------------------------------------------------------------------------------------------
// ERT: FLOPs per element sweep

const ERT_K: [u32; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

fn ert_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let r = ert(ctx, gpu);
    ctx.checked(
        gpu.ordinal,
        "ert_f32",
        r.map(|n| format!("{n} elements checked")),
    )
}

fn ert(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<usize, CudaError> {
    let bytes: u64 = match ctx.mode {
        Mode::Check => 4 << 20,
        Mode::Quick => (4 * gpu.l2_bytes).max(64 << 20),
        Mode::Full => (4 * gpu.l2_bytes).max(256 << 20),
    };
    let (free, _) = check_mem_info()?;
    let bytes = bytes.min(free as u64 / 2) / 16 * 16;
    let n16: u64 = bytes / 16;
    let data = gpu.alloc(bytes as usize)?;
    let init = gpu.function("stream_init")?;
    let grid = gpu.grid_for(MEM_BLOCK, gpu.max_threads_per_sm);
    let seed = 5u32;
    unsafe {
        gpu.launch(
            init,
            grid,
            MEM_BLOCK,
            &mut [arg(&data.ptr), arg(&n16), arg(&seed)],
        )
    }?;
    let (a, b) = (0.999f32, 0.001f32);
    let reps: i32 = 1;
    let mut applied: u64 = 0; // FMAs applied to every element so far
    let mut points = Vec::new();
    for k in ERT_K {
        ctx.cancelled()?;
        let f = gpu.function(&format!("ert_f32_{k}"))?;
        let launches = 1 + ctx.mode.samples() as u64;
        let g: &Gpu = gpu;
        let times = timed(ctx, g, || unsafe {
            g.launch(
                f,
                grid,
                MEM_BLOCK,
                &mut [arg(&data.ptr), arg(&n16), arg(&a), arg(&b), arg(&reps)],
            )
        })?;
        applied += launches * k as u64;
        let flops = 2.0 * k as f64 * (n16 * 4) as f64;
        let rates: Vec<f64> = times.iter().map(|t| flops / t).collect();
        if let Some(stats) = Stats::from_samples(&rates) {
            // Operational intensity: 2k FLOPs per 8 bytes (one f32 read, one written).
            points.push(CurvePoint {
                x: 2.0 * k as f64 / 8.0,
                value: stats.max,
                stats,
                level: None,
            });
        }
    }
    // Check a sample of elements against the recurrence applied `applied` times.
    let v: Vec<f32> = gpu.download(&data)?;
    let words = v.len();
    let sample: Vec<usize> = (0..64)
        .map(|i| i * (words / 64) + i % 5)
        .filter(|&i| i < words)
        .collect();
    for &i in &sample {
        let mut x = f32::from_bits(pattern(i as u64, seed));
        for _ in 0..applied {
            x = x.mul_add(a, b);
        }
        let err = ((v[i] - x) / x).abs();
        if err > 1e-6 {
            return Err(CudaError::Check(format!(
                "ert element {i}: GPU {} CPU {x}",
                v[i]
            )));
        }
    }
    if ctx.mode != Mode::Check {
        ctx.out.curves.push(Curve {
            id: format!("gpu{}/ert/f32", gpu.ordinal),
            x_label: "operational intensity".into(),
            x_unit: "FLOP/B".into(),
            unit: "FLOP/s".into(),
            threads: 1,
            points,
        });
    }
    Ok(sample.len())
}

// ---------------------------------------------------------------------------------------------
// Copies: host <-> device, device <-> device, peer to peer

/// Theoretical PCIe bandwidth per direction for a generation and width.
pub fn pcie_peak(gen: u32, width: u32) -> Option<f64> {
    // GT/s per lane and line-code efficiency: 8b/10b up to gen 2, 128b/130b from gen 3;
    // gen 6 (FLIT, PAM4) counted at 242/256.
    let (gts, eff) = match gen {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 242.0 / 256.0),
        _ => return None,
    };
    Some(gts * 1e9 * eff * width as f64 / 8.0)
}

fn copy_bytes(mode: Mode) -> usize {
    match mode {
        Mode::Check => 4 << 20,
        Mode::Quick => 64 << 20,
        Mode::Full => 256 << 20,
    }
}

fn fill_pattern(v: &mut [u32], seed: u32) {
    for (i, x) in v.iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
    }
}

fn first_mismatch(v: &[u32], seed: u32) -> Option<usize> {
    v.iter()
        .enumerate()
        .position(|(i, x)| *x != (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed))
}

fn copy_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let r = copies(ctx, gpu);
    ctx.checked(gpu.ordinal, "copies", r)
}

fn copies(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<String, CudaError> {
    let bytes = copy_bytes(ctx.mode);
    let words = bytes / 4;
    let dev = gpu.alloc(bytes)?;
    let dev2 = gpu.alloc(bytes)?;
    let mut pinned = gpu.alloc_pinned(bytes)?;
    let mut pinned2 = gpu.alloc_pinned(bytes)?;
    fill_pattern(pinned.as_mut_slice::<u32>(), 11);
    let mut pageable = vec![0u32; words];
    fill_pattern(&mut pageable, 13);
    let stream = gpu.stream;
    let pcie = ctx
        .out
        .gpus
        .iter()
        .find(|g| g.index == gpu.ordinal)
        // The link's maximum: an idle link reports a lower current generation (power saving).
        .and_then(|g| {
            Some((
                g.pcie_generation_max.or(g.pcie_generation)?,
                g.pcie_width_max.or(g.pcie_width)?,
            ))
        });
    let pcie_peak = |_: ()| {
        pcie.and_then(|(g, w)| pcie_peak(g, w))
            .map(|v| TheoreticalPeak {
                value: v,
                unit: "B/s".into(),
                source: format!(
                    "PCIe gen {} x{} per direction (line code counted)",
                    pcie.map_or(0, |p| p.0),
                    pcie.map_or(0, |p| p.1)
                ),
                uncertainty: 0.0,
            })
    };
    // Pinned host -> device.
    let src = pinned.as_mut_slice::<u32>().as_ptr();
    let h2d = timed(ctx, gpu, || {
        // SAFETY: pinned buffer of `bytes` bytes into a device buffer of `bytes` bytes.
        device::check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dev.ptr, src as *const _, bytes, stream).result()
        })
    })?;
    let back: Vec<u32> = gpu.download(&dev)?;
    if let Some(i) = first_mismatch(&back, 11) {
        return Err(CudaError::Check(format!(
            "host-to-device copy: word {i} wrong"
        )));
    }
    // Device -> pinned host.
    let dst = pinned2.as_mut_slice::<u32>().as_mut_ptr();
    let d2h = timed(ctx, gpu, || {
        // SAFETY: device buffer of `bytes` bytes into a pinned buffer of `bytes` bytes.
        device::check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst as *mut _, dev.ptr, bytes, stream).result()
        })
    })?;
    gpu.sync()?;
    if let Some(i) = first_mismatch(pinned2.as_mut_slice::<u32>(), 11) {
        return Err(CudaError::Check(format!(
            "device-to-host copy: word {i} wrong"
        )));
    }
    // Both directions at once, on two streams (wall clock around both).
    let other = device::check(
        "cuStreamCreate",
        cu::stream::create(cu::stream::StreamKind::NonBlocking),
    )?;
    let both = (|| -> Result<Vec<f64>, CudaError> {
        let mut t = Vec::new();
        for _ in 0..ctx.mode.samples() + 1 {
            ctx.cancelled()?;
            gpu.sync()?;
            let start = Instant::now();
            // SAFETY: as above; the two copies touch different buffers.
            unsafe {
                device::check(
                    "cuMemcpyHtoDAsync",
                    sys::cuMemcpyHtoDAsync_v2(dev2.ptr, src as *const _, bytes, stream).result(),
                )?;
                device::check(
                    "cuMemcpyDtoHAsync",
                    sys::cuMemcpyDtoHAsync_v2(dst as *mut _, dev.ptr, bytes, other).result(),
                )?;
                device::check("cuStreamSynchronize", cu::stream::synchronize(stream))?;
                device::check("cuStreamSynchronize", cu::stream::synchronize(other))?;
            }
            t.push(start.elapsed().as_secs_f64());
        }
        t.remove(0); // warm-up
        Ok(t)
    })();
    // SAFETY: created above, idle (synchronized) or failed.
    unsafe {
        let _ = cu::stream::synchronize(other);
        let _ = cu::stream::destroy(other);
    }
    let both = both?;
    // Pageable host memory, wall clock from the call to the end of a stream synchronisation:
    // a pageable cuMemcpyHtoD returns once the data is staged, before the last DMA has landed,
    // so timing the call alone overstates the rate. The copies go on the probe's stream (staged
    // by the driver as for the synchronous call), and the clock stops when it is done.
    let mut pageable_h2d = Vec::new();
    let mut pageable_d2h = Vec::new();
    let mut host_back = vec![0u32; words];
    for i in 0..ctx.mode.samples() + 1 {
        ctx.cancelled()?;
        gpu.bind()?;
        gpu.sync()?;
        let t = Instant::now();
        // SAFETY: `pageable` has exactly `bytes` bytes and outlives the synchronisation.
        device::check("cuMemcpyHtoDAsync(pageable)", unsafe {
            cu::memcpy_htod_async(dev2.ptr, &pageable, stream)
        })?;
        gpu.sync()?;
        let a = t.elapsed().as_secs_f64();
        let t = Instant::now();
        // SAFETY: `host_back` has exactly `bytes` bytes and is read only after the sync.
        device::check("cuMemcpyDtoHAsync(pageable)", unsafe {
            cu::memcpy_dtoh_async(&mut host_back, dev2.ptr, stream)
        })?;
        gpu.sync()?;
        let b = t.elapsed().as_secs_f64();
        if i > 0 {
            pageable_h2d.push(a);
            pageable_d2h.push(b);
        }
    }
    if let Some(i) = first_mismatch(&host_back, 13) {
        return Err(CudaError::Check(format!(
            "pageable round trip: word {i} wrong"
        )));
    }
    // Device -> device.
    let d2d = timed(ctx, gpu, || {
        // SAFETY: two device buffers of `bytes` bytes.
        device::check("cuMemcpyDtoDAsync", unsafe {
            cu::memcpy_dtod_async(dev2.ptr, dev.ptr, bytes, stream)
        })
    })?;
    let back: Vec<u32> = gpu.download(&dev2)?;
    if let Some(i) = first_mismatch(&back, 11) {
        return Err(CudaError::Check(format!(
            "device-to-device copy: word {i} wrong"
        )));
    }
    let b = bytes as f64;
    let rate = |t: &[f64], bytes: f64| -> Vec<f64> { t.iter().map(|t| bytes / t).collect() };
    let o = gpu.ordinal;
    let size = super::cpu::human_bytes(bytes as f64);
    type Entry = (String, Vec<f64>, f64, String, Option<TheoreticalPeak>);
    let entries: [Entry; 6] = [
        (format!("gpu{o}/h2d"), rate(&h2d, b), b, format!("cuMemcpyHtoDAsync from pinned host memory, {size}, CUDA-event timed"), pcie_peak(())),
        (format!("gpu{o}/d2h"), rate(&d2h, b), b, format!("cuMemcpyDtoHAsync into pinned host memory, {size}, CUDA-event timed"), pcie_peak(())),
        (format!("gpu{o}/h2d+d2h"), rate(&both, 2.0 * b), 2.0 * b, format!("both directions at once on two streams, {size} each way, pinned; bytes of both directions counted; wall clock"), pcie_peak(()).map(|mut p| { p.value *= 2.0; p.source += ", both directions"; p })),
        (format!("gpu{o}/h2d/pageable"), rate(&pageable_h2d, b), b, format!("cuMemcpyHtoDAsync from pageable (malloc'd) memory, {size}, wall clock to the end of cuStreamSynchronize"), pcie_peak(())),
        (format!("gpu{o}/d2h/pageable"), rate(&pageable_d2h, b), b, format!("cuMemcpyDtoHAsync into pageable memory, {size}, wall clock to the end of cuStreamSynchronize"), pcie_peak(())),
        (format!("gpu{o}/d2d"), rate(&d2d, 2.0 * b), 2.0 * b, format!("cuMemcpyDtoDAsync, {size}; a read and a write counted per byte copied (as STREAM copy)"), ctx.memory_peak(gpu)),
    ];
    for (id, rates, bytes, method, peak) in entries {
        let kind = if id.ends_with("/d2d") {
            CeilingKind::Memory
        } else {
            CeilingKind::Comm
        };
        ctx.push(
            id,
            kind,
            "B/s",
            &rates,
            PerIteration { ops: 0.0, bytes },
            format!("{method}; data verified"),
            peak,
            None,
            None,
        );
    }
    Ok(format!("{size} each way verified"))
}

fn p2p(ctx: &mut Ctx, a: &mut Gpu, b: &mut Gpu) -> Result<(), CudaError> {
    let r = p2p_pair(ctx, a, b);
    let label = format!("p2p gpu{}->gpu{}", a.ordinal, b.ordinal);
    ctx.checked(a.ordinal, &label, r)
}

fn enable_peer(from: &Gpu, to: &Gpu) -> Result<bool, CudaError> {
    let mut can = 0;
    // SAFETY: out-parameter, valid devices.
    device::check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, from.dev, to.dev).result()
    })?;
    if can == 0 {
        return Ok(false);
    }
    from.bind()?;
    // SAFETY: live contexts; "already enabled" is fine.
    match unsafe { sys::cuCtxEnablePeerAccess(to.ctx, 0) } {
        sys::cudaError_enum::CUDA_SUCCESS
        | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        e => device::check("cuCtxEnablePeerAccess", e.result()).map(|_| true),
    }
}

fn p2p_pair(ctx: &mut Ctx, a: &mut Gpu, b: &mut Gpu) -> Result<String, CudaError> {
    let bytes = copy_bytes(ctx.mode);
    let words = bytes / 4;
    let peer = enable_peer(a, b)? && enable_peer(b, a)?;
    let mut host = vec![0u32; words];
    fill_pattern(&mut host, 17);
    let src = a.upload(&host)?;
    let dst = b.alloc(bytes)?;
    let back_src = b.upload(&host)?;
    let back_dst = a.alloc(bytes)?;
    let (sa, sb) = (a.stream, b.stream);
    // Copy engine, one way.
    a.bind()?;
    let one = timed(ctx, a, || {
        // SAFETY: buffers of `bytes` bytes in their own contexts.
        device::check("cuMemcpyPeerAsync", unsafe {
            cu::memcpy_peer_async(b.ctx, dst.ptr, a.ctx, src.ptr, bytes, sa)
        })
    })?;
    let got: Vec<u32> = b.download(&dst)?;
    if let Some(i) = first_mismatch(&got, 17) {
        return Err(CudaError::Check(format!(
            "peer copy gpu{}->gpu{}: word {i} wrong",
            a.ordinal, b.ordinal
        )));
    }
    // Both ways at once (wall clock).
    let mut both = Vec::new();
    for i in 0..ctx.mode.samples() + 1 {
        ctx.cancelled()?;
        a.sync()?;
        b.sync()?;
        let t = Instant::now();
        // SAFETY: as above, on each GPU's own stream.
        unsafe {
            device::check(
                "cuMemcpyPeerAsync",
                cu::memcpy_peer_async(b.ctx, dst.ptr, a.ctx, src.ptr, bytes, sa),
            )?;
            device::check(
                "cuMemcpyPeerAsync",
                cu::memcpy_peer_async(a.ctx, back_dst.ptr, b.ctx, back_src.ptr, bytes, sb),
            )?;
        }
        a.sync()?;
        b.sync()?;
        if i > 0 {
            both.push(t.elapsed().as_secs_f64());
        }
    }
    let got: Vec<u32> = a.download(&back_dst)?;
    if let Some(i) = first_mismatch(&got, 17) {
        return Err(CudaError::Check(format!(
            "peer copy gpu{}->gpu{}: word {i} wrong",
            b.ordinal, a.ordinal
        )));
    }
    // SM copy kernel on `a` writing into `b`'s memory (needs peer access).
    let mut sm = Vec::new();
    let mut sm_both = Vec::new();
    if peer {
        b.zero(&dst)?;
        b.sync()?;
        let f = a.function("stream_copy")?;
        let grid = a.grid_for(MEM_BLOCK, a.max_threads_per_sm);
        let n = (bytes / 16) as u64;
        let reps: i32 = 1;
        let g: &Gpu = a;
        sm = timed(ctx, g, || unsafe {
            g.launch(
                f,
                grid,
                MEM_BLOCK,
                &mut [arg(&dst.ptr), arg(&src.ptr), arg(&n), arg(&reps)],
            )
        })?;
        let got: Vec<u32> = b.download(&dst)?;
        if let Some(i) = first_mismatch(&got, 17) {
            return Err(CudaError::Check(format!(
                "SM peer copy gpu{}->gpu{}: word {i} wrong",
                a.ordinal, b.ordinal
            )));
        }
        // Both ways at once: a's SMs write into b while b's SMs write into a (wall clock).
        a.zero(&back_dst)?;
        let fb = b.function("stream_copy")?;
        let grid_b = b.grid_for(MEM_BLOCK, b.max_threads_per_sm);
        for i in 0..ctx.mode.samples() + 1 {
            ctx.cancelled()?;
            a.sync()?;
            b.sync()?;
            let t = Instant::now();
            a.bind()?;
            // SAFETY: stream_copy(dst, src, n, reps) with buffers of `bytes` bytes that live
            // until both GPUs are synchronized below.
            unsafe {
                a.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&dst.ptr), arg(&src.ptr), arg(&n), arg(&reps)],
                )?;
            }
            b.bind()?;
            // SAFETY: as above, on b (peer access was enabled both ways).
            unsafe {
                b.launch(
                    fb,
                    grid_b,
                    MEM_BLOCK,
                    &mut [arg(&back_dst.ptr), arg(&back_src.ptr), arg(&n), arg(&reps)],
                )?;
            }
            a.sync()?;
            b.sync()?;
            if i > 0 {
                sm_both.push(t.elapsed().as_secs_f64());
            }
        }
        let got: Vec<u32> = a.download(&back_dst)?;
        if let Some(i) = first_mismatch(&got, 17) {
            return Err(CudaError::Check(format!(
                "SM peer copy gpu{}->gpu{}: word {i} wrong",
                b.ordinal, a.ordinal
            )));
        }
    } else {
        ctx.out.notes.push(format!(
            "gpu{} and gpu{} have no peer access: copies between them are staged through host memory",
            a.ordinal, b.ordinal
        ));
    }
    let bf = bytes as f64;
    let nvlink_peak = nvlink_peak(ctx, a.ordinal);
    let rate = |t: &[f64], x: f64| -> Vec<f64> { t.iter().map(|t| x / t).collect() };
    let pair = format!("gpu{}-gpu{}", a.ordinal, b.ordinal);
    let size = super::cpu::human_bytes(bytes as f64);
    ctx.push(
        format!("{pair}/p2p"),
        CeilingKind::Comm,
        "B/s",
        &rate(&one, bf),
        PerIteration {
            ops: 0.0,
            bytes: bf,
        },
        format!(
            "cuMemcpyPeerAsync (copy engine), {size} one way, CUDA-event timed, verified{}",
            if peer {
                ""
            } else {
                "; no peer access (staged through the host)"
            }
        ),
        nvlink_peak.clone(),
        None,
        None,
    );
    ctx.push(format!("{pair}/p2p/bidir"), CeilingKind::Comm, "B/s", &rate(&both, 2.0 * bf), PerIteration { ops: 0.0, bytes: 2.0 * bf }, format!("cuMemcpyPeerAsync both ways at once, {size} each way, both directions counted, wall clock, verified"), nvlink_peak.clone().map(|mut p| { p.value *= 2.0; p }), None, None);
    if !sm.is_empty() {
        ctx.push(format!("{pair}/p2p/sm"), CeilingKind::Comm, "B/s", &rate(&sm, bf), PerIteration { ops: 0.0, bytes: bf }, format!("NVRTC kernel stream_copy on gpu{} storing into gpu{}'s memory (16-byte accesses), {size}, CUDA-event timed, verified", a.ordinal, b.ordinal), nvlink_peak.clone(), None, None);
    }
    if !sm_both.is_empty() {
        ctx.push(
            format!("{pair}/p2p/sm/bidir"),
            CeilingKind::Comm,
            "B/s",
            &rate(&sm_both, 2.0 * bf),
            PerIteration { ops: 0.0, bytes: 2.0 * bf },
            format!("NVRTC kernel stream_copy on both GPUs at once, each storing into the other's memory, {size} each way, both directions counted, wall clock, verified"),
            nvlink_peak.map(|mut p| {
                p.value *= 2.0;
                p
            }),
            None,
            None,
        );
    }
    Ok(format!(
        "{size} verified, peer access {}",
        if peer { "on" } else { "unavailable" }
    ))
}

/// Bytes/s per direction of one NVLink link, from NVML's `nvmlNvlinkVersion_t` (not the
/// NVLink generation: 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0): 20 GB/s
/// for NVLink 1, 25 GB/s for NVLink 2, 3 and 4 (V100, A100, H100: 18 links × 25 = 450 GB/s),
/// 50 GB/s for NVLink 5 (B200). Some drivers report 7 (5.0) for H100's NVLink 4: on a
/// compute-capability 9 GPU that is read as 25 GB/s. `None` for unknown values.
pub fn nvlink_link_rate(nvml_version: u32, cc_major: u32) -> Option<f64> {
    match nvml_version {
        1 => Some(20e9),
        2..=6 => Some(25e9),
        7 if cc_major == 9 => Some(25e9),
        7 => Some(50e9),
        _ => None,
    }
}

/// NVLink bandwidth per direction of `gpu`: the sum of its active links' rates.
fn nvlink_peak(ctx: &Ctx, gpu: usize) -> Option<TheoreticalPeak> {
    let info = ctx.out.gpus.iter().find(|g| g.index == gpu)?;
    let cc_major: u32 = info
        .compute_capability
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let rates: Vec<f64> = info
        .nvlinks
        .iter()
        .filter_map(|l| nvlink_link_rate(l.version, cc_major))
        .collect();
    if rates.is_empty() {
        return None;
    }
    let value: f64 = rates.iter().sum();
    Some(TheoreticalPeak {
        value,
        unit: "B/s".into(),
        source: format!(
            "{} active NVLink links, {:.0} GB/s per direction in all (NVML link versions {:?})",
            rates.len(),
            value / 1e9,
            info.nvlinks.iter().map(|l| l.version).collect::<Vec<_>>()
        ),
        uncertainty: 0.0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pattern_sum_matches_a_plain_loop() {
        for words in [0u64, 1, 1023, 1024, 1025, 5000, 1 << 16] {
            let plain = (0..words).fold(0u32, |s, w| s.wrapping_add(pattern(w, 1)));
            assert_eq!(pattern_sum(words, 1), plain, "{words}");
        }
    }

    #[test]
    fn nvlink_rates_follow_nvmls_enum_not_the_generation() {
        // A100: NVML_NVLINK_VERSION_3_0 = 4, 12 links → 300 GB/s per direction.
        assert_eq!(nvlink_link_rate(4, 8).map(|r| r * 12.0), Some(300e9));
        // H100: NVML_NVLINK_VERSION_4_0 = 6, 18 links → 450 GB/s.
        assert_eq!(nvlink_link_rate(6, 9).map(|r| r * 18.0), Some(450e9));
        // H100 reported as 5.0 (7) by some drivers: still NVLink 4's 25 GB/s.
        assert_eq!(nvlink_link_rate(7, 9), Some(25e9));
        // B200: NVLink 5, 18 links → 900 GB/s.
        assert_eq!(nvlink_link_rate(7, 10).map(|r| r * 18.0), Some(900e9));
        assert_eq!(nvlink_link_rate(0, 9), None);
    }

    #[test]
    fn pcie_peaks() {
        assert!((pcie_peak(4, 16).unwrap() - 31.5e9).abs() < 0.1e9);
        assert!((pcie_peak(5, 16).unwrap() - 63.0e9).abs() < 0.1e9);
        assert_eq!(pcie_peak(9, 16), None);
    }

    #[test]
    fn mma_closed_form_constants() {
        // f16 1.0 and 2^-10, bf16 1.0 and 2^-10, e4m3 1.0 and 2^-6.
        assert_eq!(half::f16::from_f64(1.0).to_bits(), 0x3C00);
        assert_eq!(half::f16::from_f64(1.0 / 1024.0).to_bits(), 0x1400);
        assert_eq!(half::bf16::from_f64(1.0).to_bits(), 0x3F80);
        assert_eq!(half::bf16::from_f64(1.0 / 1024.0).to_bits(), 0x3A80);
        assert_eq!(f32::from_bits(0x3A80_0000), 1.0 / 1024.0);
        // e4m3: bias 7, 3 mantissa bits: 0x38 = 2^0, 0x08 = 2^(1-7).
        let e4m3 = |b: u8| 2f64.powi(((b >> 3) & 15) as i32 - 7) * (1.0 + (b & 7) as f64 / 8.0);
        assert_eq!(e4m3(0x38), 1.0);
        assert_eq!(e4m3(0x08), 1.0 / 64.0);
        for s in &MMA {
            let k = s.ops / (2.0 * 16.0 * 8.0);
            let (a, b) = match s.precision {
                "f16" => (1.0, 1.0 / 1024.0),
                "bf16" | "tf32" => (1.0, 1.0 / 1024.0),
                "int8" => (1.0, 1.0),
                _ => (1.0, 1.0 / 64.0),
            };
            assert_eq!(s.per_mma, k * a * b, "{}", s.precision);
        }
    }

    #[test]
    fn half_fma_rounds_once() {
        // 0.75 * x + 0.125 from 1.0 is 0.875, exact in both formats.
        for bf in [false, true] {
            let one = half_bits(1.0, bf);
            let r = half_fma(one, half_bits(0.75, bf), half_bits(0.125, bf), bf);
            assert_eq!(half_value(r, bf), 0.875);
        }
    }

    #[test]
    fn fma_reference_matches_closed_form() {
        // x_n = a^n x0 + b (1 - a^n) / (1 - a), summed over the chains.
        let (a, b, iters) = (0.5f64, 0.25f64, 3usize);
        let n = (iters * FMA_UNROLL) as i32;
        let want: f64 = (0..FMA_ACC)
            .map(|i| a.powi(n) * fma_start_f64(7, i) + b * (1.0 - a.powi(n)) / (1.0 - a))
            .sum();
        assert!((fma_ref_f64(7, a, b, iters) - want).abs() < 1e-12);
    }

    #[test]
    fn uuid_format() {
        let b: [u8; 16] = std::array::from_fn(|i| i as u8);
        assert_eq!(
            roofline_uuid(&b),
            "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
        );
    }
}
