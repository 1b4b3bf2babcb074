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
use roofline_model::ceiling_id::{GpuCopy, PeerCopy};
use roofline_model::conditions::SampleConditions;
use roofline_model::{
    Ceiling, CeilingId, CeilingKind, Curve, CurvePoint, Family, GpuInfo, Level, MemOp, On, PeakDb,
    PerIteration, Precision, RoofId, Stats, Table, TheoreticalPeak,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

mod conv;
mod gemm;
pub use conv::{ConvOperands, ConvOptions, CONV_BATCH};
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
    /// The convolution section's batch and search budget.
    pub conv: ConvOptions,
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
            // In check mode every failure is a line of the table. Outside it, a wrong result
            // costs its own precision or section: no ceiling is written from it (each kernel
            // pushes its ceiling only after its check passed), the failure is kept
            // (machine.json's `failures`, exit 1), and the other kernels still run. On code
            // first run on a new GPU, one over-tight tolerance must not erase the rest.
            Err(e)
                if self.mode == Mode::Check
                    || matches!(e, CudaError::Check(_) | CudaError::Verify(_)) =>
            {
                if self.mode != Mode::Check {
                    self.out.notes.push(format!(
                        "gpu{gpu} {kernel}: RESULT CHECK FAILED, its ceiling is left out: {e}"
                    ));
                }
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
    /// roofline (its id, precision or level from the `RoofId`) or another ceiling by its id.
    #[allow(clippy::too_many_arguments)]
    fn push(
        &mut self,
        id: impl Into<CeilingId>,
        kind: CeilingKind,
        unit: &str,
        samples: &[f64],
        per_iteration: PerIteration,
        method: String,
        peak: Option<TheoreticalPeak>,
        conditions: Option<SampleConditions>,
    ) {
        if self.mode == Mode::Check {
            return;
        }
        let Some(stats) = Stats::from_samples(samples) else {
            return;
        };
        let id = id.into();
        let c = Ceiling::measured(id.clone(), kind, unit, 1, stats, per_iteration, method);
        let c = match id.roof() {
            Some(r) => c.as_roof(r),
            None => c,
        };
        self.out
            .ceilings
            .push(c.with_peak(peak).with_conditions(conditions));
    }
}

/// Runs `work` once as warm-up, then `samples` timed times; returns seconds per sample and
/// what NVML saw at the end of each ([`Gpu::watched`]).
fn timed(
    ctx: &Ctx,
    gpu: &Gpu,
    mut work: impl FnMut() -> Result<(), CudaError>,
) -> Result<(Vec<f64>, Option<SampleConditions>), CudaError> {
    gpu.watched(
        || {
            crate::driver::sample(
                &mut device::Events(gpu),
                1,
                ctx.mode.samples(),
                &mut || ctx.cancelled(),
                &mut work,
            )
        },
        |s| s.len(),
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
/// under 1% however short one operation is ([`crate::driver::repeated`]). Returns the seconds
/// of one operation per sample, the repetitions per sample and the samples' conditions.
fn timed_repeated(
    ctx: &Ctx,
    gpu: &Gpu,
    mut one: impl FnMut() -> Result<(), CudaError>,
) -> Result<(Vec<f64>, u32, Option<SampleConditions>), CudaError> {
    let ((seconds, reps), conditions) = gpu.watched(
        || {
            crate::driver::repeated(
                &mut device::Events(gpu),
                ctx.mode.samples(),
                ctx.mode.sample_seconds(),
                1 << 12,
                &mut || ctx.cancelled(),
                &mut one,
            )
        },
        |r| r.0.len(),
    )?;
    Ok((seconds, reps as u32, conditions))
}

/// As [`timed_repeated`] for a kernel that repeats its pass itself: `launch(n)` runs `n`
/// passes in one launch (at most `cap`); returns the seconds of one pass per sample and the
/// passes per launch and the samples' conditions.
fn timed_passes(
    ctx: &Ctx,
    gpu: &Gpu,
    cap: i32,
    mut launch: impl FnMut(i32) -> Result<(), CudaError>,
) -> Result<(Vec<f64>, i32, Option<SampleConditions>), CudaError> {
    let ((seconds, passes), conditions) = gpu.watched(
        || {
            crate::driver::per_operation(
                &mut device::Events(gpu),
                ctx.mode.samples(),
                ctx.mode.sample_seconds(),
                cap.max(1) as u64,
                &mut || ctx.cancelled(),
                // The counts stay within `cap`, an i32.
                &mut |n| launch(n as i32),
            )
        },
        |r| r.0.len(),
    )?;
    Ok((seconds, passes as i32, conditions))
}

/// The id of GPU `ordinal`'s compute roof of `family` in `precision` (`direction`: a
/// convolution's).
pub(super) fn compute_roof(
    ordinal: usize,
    family: Family,
    precision: Precision,
    direction: Option<roofline_model::ConvDir>,
) -> RoofId {
    RoofId::Compute {
        on: On::Gpu(ordinal),
        family,
        precision,
        direction,
    }
}

/// Probes every GPU. `Missing`/`NoDevice` errors say there is nothing to probe. `enrich` adds
/// NVML's part of a GPU's inventory; `watch` gives, for a GPU's NVML uuid, what reads its
/// conditions at the end of every sample (`None`: not read).
pub fn run(
    cfg: &GpuConfig,
    cancel: &AtomicBool,
    progress: &dyn Progress,
    peaks: &PeakDb,
    enrich: &dyn Fn(&mut GpuInfo) -> Result<(), roofline_collectors::nvml::NvmlError>,
    watch: &dyn Fn(&str) -> Option<device::Reader>,
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
        if let Some(reader) = watch(&info.uuid) {
            gpu.set_reader(reader);
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
            let r = wgmma_section(&mut ctx, gpu);
            ctx.section(o, "wgmma", r)?;
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
            let r = conv::conv_section(gpu, ctx.mode, cancel, peaks, cfg.conv);
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
mod mma_layout;
mod wgmma;
mod wgmma_layout;
pub use wgmma::wgmma_support;
use wgmma::*;

#[cfg(test)]
mod tests;
