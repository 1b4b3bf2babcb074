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
use crate::cuda::CudaError;
use cudarc::driver::{result as cu, sys};
use roofline_model::{
    Ceiling, CeilingId, CeilingKind, Curve, CurvePoint, Family, GpuInfo, Level, MemOp, On, PeakDb,
    PerIteration, Precision, Stats, Table, TheoreticalPeak,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

mod conv;
mod gemm;
pub use gemm::all_shapes as gemm_shapes;

/// What a library section hands back to the probe.
#[derive(Default)]
pub struct SectionResult {
    pub ceilings: Vec<Ceiling>,
    pub tables: Vec<Table>,
    pub notes: Vec<String>,
    /// (kernel, check outcome) per precision or shape family.
    pub checks: Vec<(String, Result<String, CudaError>)>,
}

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

/// The versions of the CUDA libraries in use, for provenance (those present), with the file
/// each was loaded from: the doctor's versions.
pub fn library_versions() -> Vec<String> {
    use crate::cuda::libs::{self, Lib};
    Lib::ALL
        .iter()
        .filter(|l| !matches!(l, Lib::Nvml) && libs::present(**l))
        .filter_map(|l| {
            let v = crate::cuda::doctor::version(*l)?;
            Some(match libs::in_use(*l) {
                Some(path) => format!("{} {v} ({path})", l.label()),
                None => format!("{} {v}", l.label()),
            })
        })
        .collect()
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

    /// Records one kernel's check: a failure is a line of `checks` (and, outside check mode, a
    /// note); only an interruption or a refused library ends the probe.
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
            Err(e @ CudaError::Shadowed(_)) => Err(e),
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
            // A wrong result costs its own precision or section: no ceiling is written from it
            // (each kernel pushes its ceiling only after its check passed), the failure is
            // kept (machine.json's `failures`, exit 1), and the other kernels still run. On
            // code first run on a new GPU, one over-tight tolerance must not erase the rest.
            Err(e @ (CudaError::Check(_) | CudaError::Verify(_))) => {
                self.out.notes.push(format!(
                    "gpu{gpu} {kernel}: RESULT CHECK FAILED, its ceiling is left out: {e}"
                ));
                self.out.checks.push(CheckLine {
                    gpu,
                    kernel: kernel.into(),
                    failure: Some(e.to_string()),
                    skipped: false,
                    detail: String::new(),
                });
                Ok(())
            }
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
    /// failed setup is a note naming the section; a failed result check a failure line).
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

    /// Keeps a measured ceiling (not in check mode, and only with samples): a roof of the
    /// roofline (its id, precision or level from the `CeilingId`) or another ceiling by its id.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        id: impl Into<Named>,
        kind: CeilingKind,
        unit: &str,
        samples: &[f64],
        per_iteration: PerIteration,
        method: String,
        peak: Option<TheoreticalPeak>,
    ) {
        if self.mode == Mode::Check {
            return;
        }
        let Some(stats) = Stats::from_samples(samples) else {
            return;
        };
        let c = match id.into() {
            Named::Roof(r) => {
                Ceiling::measured(r.to_string(), kind, unit, 1, stats, per_iteration, method)
                    .as_roof(r)
            }
            Named::Other(id) => Ceiling::measured(id, kind, unit, 1, stats, per_iteration, method),
        };
        self.out.ceilings.push(c.with_peak(peak));
    }
}

/// Runs `work` once as warm-up, then `samples` timed times; returns seconds per sample.
fn timed(
    ctx: &Ctx,
    gpu: &Gpu,
    mut work: impl FnMut() -> Result<(), CudaError>,
) -> Result<Vec<f64>, CudaError> {
    crate::driver::sample(
        &mut device::Events(gpu),
        1,
        ctx.mode.samples(),
        &mut || ctx.cancelled(),
        &mut work,
    )
}

/// Iterations (from `base`, at most `cap`) that make one launch last the mode's sample time,
/// by the driver's calibration rule, timed with the GPU's events; `base` in check mode.
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
    let n = crate::driver::calibrate(
        &mut device::Events(gpu),
        base.max(1) as u64,
        cap.max(1) as u64,
        ctx.mode.sample_seconds(),
        // The counts stay within `cap`, an i32.
        &mut |n| launch(n as i32),
    )?;
    Ok(n as i32)
}

/// Times an operation that may be short (one copy, one pass): `one` is repeated back to back
/// within each sample, as many times as make a sample last the mode's sample time (5 ms quick,
/// 20 ms full; once in check mode), so that the launch and event overheads (a few µs) stay far
/// under 1% however short one operation is. Returns the seconds of one operation per sample
/// and the repetitions per sample.
fn timed_repeated(
    ctx: &Ctx,
    gpu: &Gpu,
    mut one: impl FnMut() -> Result<(), CudaError>,
) -> Result<(Vec<f64>, u32), CudaError> {
    let mut run = |reps: i32| -> Result<(), CudaError> {
        for _ in 0..reps.max(1) {
            one()?;
        }
        Ok(())
    };
    let reps = calibrate(ctx, gpu, 1, 1 << 12, &mut run)?;
    let times = timed(ctx, gpu, || run(reps))?;
    Ok((
        times.iter().map(|t| t / reps.max(1) as f64).collect(),
        reps.max(1) as u32,
    ))
}

/// What a ceiling is: a roof of the roofline, or another ceiling (a copy, a link) by its id.
pub(super) enum Named {
    Roof(CeilingId),
    Other(String),
}

impl From<CeilingId> for Named {
    fn from(r: CeilingId) -> Named {
        Named::Roof(r)
    }
}

impl From<String> for Named {
    fn from(id: String) -> Named {
        Named::Other(id)
    }
}

/// The id of GPU `ordinal`'s compute roof of `family` in `precision` (`direction`: a
/// convolution's).
pub(super) fn compute_roof(
    ordinal: usize,
    family: Family,
    precision: Precision,
    direction: Option<roofline_model::ConvDir>,
) -> CeilingId {
    CeilingId::Compute {
        on: On::Gpu(ordinal),
        family,
        precision,
        direction,
    }
}

/// Probes every GPU. `Missing`/`NoDevice` errors say there is nothing to probe.
pub fn run(
    cfg: &GpuConfig,
    cancel: &AtomicBool,
    progress: &dyn Progress,
    peaks: &PeakDb,
    enrich: &dyn Fn(&mut GpuInfo) -> Result<(), roofline_collectors::nvml::NvmlError>,
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
            let r = gemm::gemm_section(gpu, ctx.mode, cancel, peaks);
            absorb(&mut ctx, gpu.ordinal, "gemm", r)?;
        }
        if has(Section::Conv) {
            progress.advance(&format!("gpu{} cuDNN convolution", gpu.ordinal));
            let r = conv::conv_section(gpu, ctx.mode, cancel, peaks);
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
    r: Result<SectionResult, CudaError>,
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

mod copy;
mod mem;
mod peaks;
use copy::*;
pub use copy::{nvlink_link_rate, pcie_peak};
use mem::*;
pub use peaks::mma_support;
use peaks::*;

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

    /// fp8 mma.sync is measured only where it is QMMA (sm_89, sm_120): on sm_90 and sm_100
    /// ptxas emulates it, and the row says so instead of a number (the SASS gate checks the
    /// instruction on every architecture this allows).
    #[test]
    fn fp8_mma_only_where_the_tensor_cores_run_it() {
        for arch in [89, 120, 121] {
            assert_eq!(mma_support("mma_fp8", arch), Ok(()), "sm_{arch}");
        }
        for arch in [90, 100, 103] {
            let why = mma_support("mma_fp8", arch).unwrap_err();
            assert!(
                why.starts_with("not supported here") && why.contains("gpu/gemm/fp8"),
                "{why}"
            );
        }
        assert!(mma_support("mma_fp8", 80).unwrap_err().contains("sm_89"));
        for k in ["mma_f16", "mma_bf16", "mma_tf32", "mma_int8"] {
            for arch in [80, 86, 89, 90, 100, 120] {
                assert_eq!(mma_support(k, arch), Ok(()), "{k} sm_{arch}");
            }
        }
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
                Precision::F16 => (1.0, 1.0 / 1024.0),
                Precision::Bf16 | Precision::Tf32 => (1.0, 1.0 / 1024.0),
                Precision::Int8 => (1.0, 1.0),
                _ => (1.0, 1.0 / 64.0),
            };
            assert_eq!(s.per_mma, k * a * b, "{}", s.precision);
        }
    }

    /// The GPU's roofs are written as the files spell them, and a ceiling built as a roof
    /// carries the precision or level its id names.
    #[test]
    fn gpu_roof_ids_are_the_files_ids() {
        use roofline_model::ConvDir;
        let cases = [
            (
                compute_roof(0, Family::Mma, Precision::Bf16, None),
                "gpu0/mma/bf16",
            ),
            (
                compute_roof(0, Family::Fma, Precision::F64, None),
                "gpu0/fma/f64",
            ),
            (
                compute_roof(1, Family::Gemm, Precision::Tf32, None),
                "gpu1/gemm/tf32",
            ),
            (
                compute_roof(1, Family::Conv, Precision::F16, Some(ConvDir::BwdData)),
                "gpu1/conv/f16/bwd_data",
            ),
            (
                CeilingId::Memory {
                    on: On::Gpu(0),
                    level: Level::Hbm,
                    op: MemOp::Triad,
                },
                "gpu0/mem/HBM/triad",
            ),
        ];
        for (roof, id) in cases {
            assert_eq!(roof.to_string(), id);
            assert_eq!(CeilingId::parse(id), Some(roof));
        }
        let stats = Stats::from_samples(&[1.0, 2.0]).unwrap();
        let per = PerIteration {
            ops: 1.0,
            bytes: 1.0,
        };
        let c = Ceiling::measured(
            "x",
            CeilingKind::Memory,
            "B/s",
            1,
            stats.clone(),
            per.clone(),
            "m".into(),
        )
        .as_roof(cases[4].0);
        assert_eq!(
            (c.id.as_str(), c.level.as_deref(), c.precision),
            ("gpu0/mem/HBM/triad", Some("HBM"), None)
        );
        let c = Ceiling::measured(
            "x",
            CeilingKind::Compute,
            "FLOP/s",
            1,
            stats,
            per,
            "m".into(),
        )
        .as_roof(cases[0].0);
        assert_eq!(
            (c.id.as_str(), c.precision),
            ("gpu0/mma/bf16", Some(Precision::Bf16))
        );
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
    fn a_failed_setup_is_a_note_and_a_failed_check_costs_only_its_own_kernel() {
        let peaks = PeakDb::builtin().unwrap();
        let cancel = AtomicBool::new(false);
        let mut ctx = Ctx {
            mode: Mode::Full,
            cancel: &cancel,
            peaks: &peaks,
            out: GpuResult::default(),
        };
        let refused = CudaError::Call {
            call: "cublasLtMatmulAlgoGetHeuristic".into(),
            detail: "CUBLAS_STATUS_INVALID_VALUE".into(),
        };
        assert!(ctx.section(0, "gemm", Err(refused)).is_ok());
        let compile = CudaError::Compile {
            file: "mma_fp8.cu".into(),
            target: "sm_90".into(),
            log: "ptxas fatal".into(),
        };
        assert!(ctx.checked(0, "mma_fp8", Err(compile)).is_ok());
        assert_eq!(ctx.out.notes.len(), 2, "{:?}", ctx.out.notes);
        assert!(ctx.out.checks.is_empty());
        assert!(
            ctx.out.notes[0].starts_with("gpu0 gemm: not measured: cublasLtMatmulAlgoGetHeuristic")
        );
        // A wrong result: recorded as a failure, and the probe goes on to the next section.
        let wrong = CudaError::Check("stream_read: sum 0x1, expected 0x2".into());
        assert!(ctx.section(0, "mem", Err(wrong)).is_ok());
        let last = ctx.out.checks.last().unwrap();
        assert!(!last.skipped && last.kernel == "mem");
        assert!(last.failure.as_deref().unwrap().contains("sum 0x1"));
        assert!(ctx
            .out
            .notes
            .last()
            .unwrap()
            .contains("RESULT CHECK FAILED"));
        assert!(ctx.out.ceilings.is_empty());
        // Two copies of a library end it (the verbs refuse them).
        assert!(matches!(
            ctx.section(0, "gemm", Err(CudaError::Shadowed("two copies".into()))),
            Err(CudaError::Shadowed(_))
        ));
        assert!(matches!(
            ctx.section(0, "fma", Err(CudaError::Interrupted)),
            Err(CudaError::Interrupted)
        ));
        // In --check mode every failure is a line of the table, none ends the run.
        ctx.mode = Mode::Check;
        assert!(ctx
            .checked(0, "fma_f32", Err(CudaError::Check("x".into())))
            .is_ok());
        assert!(ctx.out.checks.last().unwrap().failure.is_some());
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
