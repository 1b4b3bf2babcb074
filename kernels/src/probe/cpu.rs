//! The CPU probe: clock, peak arithmetic, the memory working-set sweep, GEMM and convolution,
//! each on one thread (`t1`) and on one pinned thread per core (`all`).

pub use super::cpu_mem::{level_of, sweep_sizes};
use super::{compute_ceiling, rate_stats, Progress, Section};
use crate::affinity::pinned_pool;
use crate::cpu::bf16::{Bf16Gemm, Bf16GemmKernel, MR, NR};
use crate::cpu::clock::ClockKernel;
use crate::cpu::conv::{resnet50_layers, ConvKernel, ConvShape};
use crate::cpu::fma::{accumulators, best_isa, FmaKernel, Isa, Precision};
use crate::cpu::gemm::{Elem, GemmKernel, Shape};
use crate::cpu::stream::Op;
use crate::driver::{measure_here, measure_threads, Measurement, Plan};
use crate::ProbeError;
use roofline_model::ceiling_id::{TableId, TableRows};
use roofline_model::conditions::SampleConditions;
use roofline_model::{
    cpu_peak, CacheInfo, Ceiling, CeilingKind, Curve, Family, On, PeakDb, RoofId, Stats, Table,
    TableRow, TheoreticalPeak, Threads,
};
use std::sync::atomic::AtomicBool;

/// What to probe and where.
#[derive(Clone, Debug)]
pub struct CpuConfig {
    /// One CPU per physical core: the `all` configuration runs one pinned thread on each.
    pub cores: Vec<usize>,
    /// The cache hierarchy as the OS reports it (data and unified caches are used).
    pub caches: Vec<CacheInfo>,
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    /// Fewer repeats and coarser sweeps (same ids).
    pub quick: bool,
    pub sections: Vec<Section>,
}

/// Everything the CPU probe measured.
#[derive(Clone, Debug, Default)]
pub struct CpuResult {
    pub ceilings: Vec<Ceiling>,
    pub curves: Vec<Curve>,
    pub tables: Vec<Table>,
    pub clock_t1: Option<Stats>,
    pub clock_all: Option<Stats>,
    /// The widest SIMD the compute probes used.
    pub simd: String,
    pub notes: Vec<String>,
    clock_samples_t1: Vec<f64>,
    clock_samples_all: Vec<f64>,
    /// Cycles per add of the clock chain by the CPU's counter where it disagrees with one
    /// (the clock is the chain's rate times it); `None`: one.
    clock_factor: Option<f64>,
}

impl CpuResult {
    /// The run's clock statistics for `threads` threads (one core's, or all cores').
    pub fn clock(&self, threads: usize) -> Option<&Stats> {
        if threads == 1 {
            self.clock_t1.as_ref()
        } else {
            self.clock_all.as_ref()
        }
    }

    /// The conditions of `m`'s samples on `threads` cores: each sample's clock (the chain's
    /// readings around it, times the counter's factor) held to `reference` = (clock, drift),
    /// the clock measured around the ceiling, or else to the run's clock for that many threads
    /// (its median, with twice its coefficient of variation as the drift). `None` where no
    /// clock was read.
    fn sample_conditions(
        &self,
        m: &Measurement,
        threads: usize,
        reference: Option<(f64, f64)>,
    ) -> Option<SampleConditions> {
        if m.clock_hz.is_empty() {
            return None;
        }
        let (hz, drift) =
            reference.or_else(|| self.clock(threads).map(|s| (s.median, 2.0 * s.cv)))?;
        let k = self.clock_factor();
        Some(SampleConditions::cpu(
            m.clock_hz.iter().map(|c| c * k).collect(),
            hz,
            drift,
        ))
    }

    /// Cycles per add of the clock chain (1 unless the CPU's counter said otherwise): the
    /// clock is the chain's rate times it.
    pub fn clock_factor(&self) -> f64 {
        self.clock_factor.unwrap_or(1.0)
    }
}

pub(super) struct Ctx<'a> {
    pub(super) cfg: &'a CpuConfig,
    pub(super) cancel: &'a AtomicBool,
    pub(super) progress: &'a dyn Progress,
    pub(super) plan: Plan,
    big_plan: Plan,
    peak_plan: Plan,
    db: PeakDb,
    pool: rayon::ThreadPool,
}

/// The thread configurations: (suffix, CPUs).
pub(super) fn configs(cfg: &CpuConfig) -> Vec<(Threads, Vec<usize>)> {
    vec![
        (Threads::T1, cfg.cores[..1].to_vec()),
        (Threads::All, cfg.cores.clone()),
    ]
}

/// The id of a CPU compute ceiling.
fn compute_id(family: Family, p: roofline_model::Precision, t: Threads) -> RoofId {
    RoofId::Compute {
        on: On::Cpu(t),
        family,
        precision: p,
        direction: None,
    }
}

fn gemm_squares(cfg: &CpuConfig, precision: &str) -> Vec<usize> {
    match (cfg.quick, precision) {
        (true, "f32") => vec![256, 1024, 2048],
        (true, _) => vec![256, 1024],
        (false, "f32") => vec![256, 512, 1024, 2048, 4096],
        (false, _) => vec![256, 512, 1024, 2048],
    }
}

/// GEMM shapes of ResNet-50's 1×1 stride-1 convolutions (batch `n`: m = n·h·w) and of its
/// classifier (batch at least 64, as m = 8 is a matrix-vector product).
fn resnet50_gemms(n: usize) -> Vec<(String, Shape)> {
    let mut v: Vec<(String, Shape)> = resnet50_layers(n)
        .into_iter()
        .filter(|l| l.shape.r == 1 && l.shape.stride == 1)
        .map(|l| {
            (
                format!("resnet50 {}", l.name),
                Shape {
                    m: l.shape.rows(),
                    n: l.shape.k,
                    k: l.shape.c,
                },
            )
        })
        .collect();
    v.push((
        format!("resnet50 fc, batch {}", n.max(64)),
        Shape {
            m: n.max(64),
            n: 1000,
            k: 2048,
        },
    ));
    v
}

fn conv_layers(cfg: &CpuConfig) -> Vec<(String, ConvShape)> {
    let layers = resnet50_layers(if cfg.quick { 4 } else { 8 });
    let keep = |name: &str| {
        !cfg.quick
            || [
                "conv1 7x7/2",
                "layer1.0 conv2 3x3/1",
                "layer3.1 conv2 3x3",
                "layer4.1 conv1 1x1",
            ]
            .contains(&name)
    };
    layers
        .into_iter()
        .filter(|l| keep(&l.name))
        .map(|l| (format!("resnet50 {}", l.name), l.shape))
        .collect()
}

/// How many measurements `run` will make (for the progress bar).
pub fn planned_measurements(cfg: &CpuConfig) -> u64 {
    let has = |s| cfg.sections.contains(&s);
    // Clock t1 and all: around every FMA measurement, or once without that section.
    let mut n = if has(Section::Fma) { 0 } else { 2 };
    if has(Section::Fma) {
        n += 6 * Precision::ALL
            .iter()
            .filter(|p| best_isa(**p).is_some())
            .count() as u64;
    }
    if has(Section::Mem) {
        n += 2 * Op::ALL.len() as u64 * sweep_sizes(&cfg.caches, cfg.quick).len() as u64;
    }
    if has(Section::Gemm) {
        for p in ["f64", "f32", "f16", "bf16"] {
            if p == "bf16" && Bf16Gemm::detect().is_err() {
                continue;
            }
            n += 2 * gemm_shapes(cfg, p).len() as u64;
        }
    }
    if has(Section::Conv) {
        n += conv_layers(cfg).len() as u64;
    }
    n
}

/// Runs the CPU probe.
pub fn run(
    cfg: &CpuConfig,
    cancel: &AtomicBool,
    progress: &dyn Progress,
) -> Result<CpuResult, ProbeError> {
    if cfg.cores.is_empty() {
        return Err(ProbeError::NoCpu);
    }
    // Peak arithmetic is cheap to sample: more and longer samples ride out clock changes.
    let (plan, big_plan, peak_plan) = if cfg.quick {
        (
            Plan::new(3, 1, 0.01),
            Plan::new(3, 1, 0.02),
            Plan::new(5, 1, 0.01),
        )
    } else {
        (
            Plan::new(5, 1, 0.02),
            Plan::new(5, 1, 0.08),
            Plan::new(20, 2, 0.05),
        )
    };
    let ctx = Ctx {
        cfg,
        cancel,
        progress,
        plan,
        big_plan,
        peak_plan,
        db: PeakDb::builtin().map_err(ProbeError::Peaks)?,
        pool: pinned_pool(&cfg.cores).map_err(ProbeError::Threads)?,
    };
    progress.begin(planned_measurements(cfg));
    let mut out = CpuResult::default();
    // The clock method checked against the cycle counter where one is readable.
    let (factor, note) = crate::cpu::clock::counter_verdict(crate::cpu::clock::cycles_per_add());
    out.clock_factor = Some(factor);
    out.notes.push(note);

    // The theoretical peaks need the clock. The FMA section measures it around each of its
    // measurements; without that section, measure it once here.
    if !cfg.sections.contains(&Section::Fma) {
        for (suffix, cpus) in configs(cfg) {
            measure_clock(&ctx, &mut out, suffix, &cpus, &ctx.peak_plan)?;
        }
    }
    let isa = best_isa(Precision::F32).unwrap_or(Isa::Scalar);
    out.simd = isa.name().to_string();

    let has = |s| cfg.sections.contains(&s);
    if has(Section::Fma) {
        fma(&ctx, &mut out)?;
    }
    if has(Section::Mem) {
        super::cpu_mem::memory(&ctx, &mut out)?;
    }
    if has(Section::Gemm) {
        use roofline_model::Precision as P;
        gemm_section::<f64>(&ctx, &mut out, P::F64)?;
        gemm_section::<f32>(&ctx, &mut out, P::F32)?;
        gemm_section::<half::f16>(&ctx, &mut out, P::F16)?;
        gemm_bf16_section(&ctx, &mut out)?;
    }
    if has(Section::Conv) {
        conv(&ctx, &mut out)?;
    }
    Ok(out)
}

/// Measures the core clock on `cpus` (every thread runs the add chain; a sample's clock is the
/// slowest thread's), adds the samples to the run's clock statistics and returns this
/// measurement's highest sample, Hz.
fn measure_clock(
    ctx: &Ctx,
    out: &mut CpuResult,
    suffix: Threads,
    cpus: &[usize],
    plan: &Plan,
) -> Result<f64, ProbeError> {
    ctx.progress.advance(&format!("clock {suffix}"));
    let m = measure_threads(cpus, plan, ctx.cancel, |_| Ok(ClockKernel::new()))?;
    // ops = adds = cycles on every thread (× the counter's cycles per add where it disagrees);
    // per-thread clock = total / threads.
    let per_thread: Vec<f64> = m
        .op_rates()
        .iter()
        .map(|r| r * out.clock_factor.unwrap_or(1.0) / cpus.len() as f64)
        .collect();
    let all = if suffix == Threads::T1 {
        &mut out.clock_samples_t1
    } else {
        &mut out.clock_samples_all
    };
    all.extend(&per_thread);
    let stats = Stats::from_samples(all);
    if suffix == Threads::T1 {
        out.clock_t1 = stats;
    } else {
        out.clock_all = stats;
    }
    Ok(per_thread.iter().copied().fold(0.0, f64::max))
}

impl Ctx<'_> {
    /// The CPU rule's peak for `threads` cores at the higher of `clock_hz` = (higher, lower)
    /// measured around the ceiling (default: the highest clock sample of the run), so that the
    /// peak errs high rather than flag a true measurement.
    fn peak(
        &self,
        out: &CpuResult,
        precision: &str,
        threads: usize,
        isa: Isa,
        clock_hz: Option<(f64, f64)>,
    ) -> Option<TheoreticalPeak> {
        let run_max = out.clock(threads).map(|s| s.max);
        let clock = clock_hz.map(|c| c.0).or(run_max)?;
        if precision == AMX_BF16 {
            // One TMUL per core: tdpbf16ps (16 × 16 × 32 products) every 16 cycles.
            return Some(TheoreticalPeak {
                value: threads as f64 * clock * 1024.0,
                unit: "FLOP/s".into(),
                source: format!(
                    "AMX-BF16: {threads} cores × {:.2} GHz × 1024 FLOP per cycle (one tdpbf16ps of 16×16×32 every 16 cycles)",
                    clock / 1e9
                ),
                uncertainty: 0.005,
            });
        }
        let units = self
            .db
            .fma_units(&self.cfg.vendor, self.cfg.family, self.cfg.model);
        // A VM may report another model than its host's (this project's Sapphire Rapids VMs say
        // 167, Rocket Lake, a client core with one 512-bit FMA unit): AMX exists only on Xeon
        // server cores (Sapphire Rapids and later), each with two.
        let server = isa == Isa::Avx512
            && units.avx512 < 2
            && self.cfg.vendor == "GenuineIntel"
            && crate::cpu::bf16::Bf16Gemm::amx_in_cpuid();
        let fma_units = match isa {
            Isa::Avx512 if server => 2,
            Isa::Avx512 => units.avx512,
            Isa::Avx2 => units.avx2,
            Isa::Neon => units.neon,
            Isa::Scalar => return None,
        };
        let (value, rule) = cpu_peak(threads, clock, isa.bits(), fma_units, precision)?;
        let unit = if precision == "int8" {
            "OP/s"
        } else {
            "FLOP/s"
        };
        // The clock is known to within the drift between the measurements before and after
        // (`clock_hz` = (higher, lower)), at least ±0.5%.
        let uncertainty = clock_hz
            .map(|(hi, lo)| (hi - lo) / hi)
            .unwrap_or(0.0)
            .max(0.005);
        Some(TheoreticalPeak {
            value,
            unit: unit.into(),
            source: if server {
                format!(
                    "{rule} [the CPU has AMX: an Intel server core with two 512-bit FMA units, though it reports model {} ({})]",
                    self.cfg.model, units.name
                )
            } else {
                format!("{rule} [{}]", units.name)
            },
            uncertainty,
        })
    }
}

fn fma(ctx: &Ctx, out: &mut CpuResult) -> Result<(), ProbeError> {
    for p in Precision::ALL {
        let Some(isa) = best_isa(p) else {
            out.notes.push(format!(
                "cpu/fma/{}: this CPU has no {} instruction; not measured",
                p.name(),
                p.name()
            ));
            continue;
        };
        // The instructions the kernel claims, confirmed with the CPU's counter where one is.
        let confirmed = match FmaKernel::confirm_instructions(p, isa)? {
            Some(n) => format!("instruction count confirmed by the CPU's counter: {n:.2} per loop iteration (24 + dec/jnz)"),
            None => "instruction count not confirmed (no perf counter here); the loop is 24 instructions + dec/jnz by construction".into(),
        };
        for (suffix, cpus) in configs(ctx.cfg) {
            // The clock moves (turbo, the host's load): measure it right before and after, and
            // take the peak at the higher of the two.
            let before = measure_clock(ctx, out, suffix, &cpus, &ctx.peak_plan)?;
            ctx.progress.advance(&format!("fma {} {suffix}", p.name()));
            let m = measure_threads(&cpus, &ctx.peak_plan, ctx.cancel, |_| {
                FmaKernel::new(p, isa)
            })?;
            let after = measure_clock(ctx, out, suffix, &cpus, &ctx.peak_plan)?;
            let Some(stats) = rate_stats(&m, CeilingKind::Compute) else {
                continue;
            };
            let instr = match (p, isa) {
                (Precision::F64, Isa::Neon) => "fmla .2d (by +b, then by -b)",
                (Precision::F32, Isa::Neon) => "fmla .4s (by +b, then by -b)",
                (_, Isa::Scalar) => "multiply and add",
                (Precision::F64, _) => "vfmadd213pd",
                (Precision::F32, _) => "vfmadd213ps",
                (Precision::Bf16, _) => "vdpbf16ps",
                (Precision::Int8, _) => "vpdpbusd",
            };
            let method = format!(
                "{} {instr} ({}-bit) on {} independent accumulators, inline assembly, {}; result checked bit-exact against a scalar reference; {confirmed}",
                isa.name(), isa.bits(), accumulators(isa), pinned(cpus.len())
            );
            let (hi, lo) = (before.max(after), before.min(after));
            let peak = ctx.peak(out, p.name(), cpus.len(), isa, Some((hi, lo)));
            let conditions = out.sample_conditions(&m, cpus.len(), Some((hi, (hi - lo) / hi)));
            out.ceilings.push(
                compute_ceiling(
                    compute_id(Family::Fma, p.into(), suffix),
                    p.unit(),
                    cpus.len(),
                    stats,
                    &m,
                    method,
                    peak,
                )
                .with_isa(isa.name())
                .with_conditions(conditions),
            );
        }
    }
    Ok(())
}

/// The rows of a swept table and its best row so far.
struct Sweep {
    rows: Vec<TableRow>,
    best: Option<Best>,
}

/// The best configuration of a sweep: its index, statistics, measurement and sample
/// conditions.
type Best = (usize, Stats, Measurement, Option<SampleConditions>);

impl Sweep {
    fn new() -> Sweep {
        Sweep {
            rows: Vec::new(),
            best: None,
        }
    }

    /// Records configuration `i` (a table row) and keeps it if it is `eligible` for the
    /// ceiling and the best so far. The row's value is what the ceiling's would be: the best
    /// of the samples that `conditions` keep.
    #[allow(clippy::too_many_arguments)]
    fn add(
        &mut self,
        i: usize,
        name: &str,
        shape: String,
        precision: &str,
        threads: usize,
        m: Measurement,
        conditions: Option<SampleConditions>,
        eligible: bool,
    ) {
        let Some(stats) = rate_stats(&m, CeilingKind::Compute) else {
            return;
        };
        let value = SampleConditions::best_rate(conditions.as_ref(), &stats);
        let beats = |b: &Best| value > SampleConditions::best_rate(b.3.as_ref(), &b.1);
        if eligible && self.best.as_ref().is_none_or(beats) {
            self.best = Some((i, stats.clone(), m.clone(), conditions));
        }
        self.rows.push(TableRow {
            name: name.to_string(),
            shape,
            precision: Some(precision.into()),
            threads,
            value,
            stats,
            max_rel_error: Some(m.max_rel_error),
            detail: None,
            heuristic: None,
            roof: None,
            efficiency: None,
        });
    }
}

/// The GEMM ceilings of one precision: the gemm crate's products for f64, f32, f16.
fn gemm_section<T: Elem>(
    ctx: &Ctx,
    out: &mut CpuResult,
    p: roofline_model::Precision,
) -> Result<(), ProbeError> {
    let isa = crate::cpu::gemm::gemm_isa();
    let f16_note = if p.name() == "f16" {
        ", computed in f32 and rounded (no native f16 arithmetic used)"
    } else {
        ""
    };
    let method = format!(
        "gemm crate ({} kernels, its own dispatch) in blocks of 1024{f16_note}, C = A·B row-major, random inputs",
        isa.name()
    );
    let peak_precision = if p == roofline_model::Precision::F16 {
        "f32"
    } else {
        p.name()
    };
    gemm_ceilings(
        ctx,
        out,
        p,
        isa,
        &method,
        peak_precision,
        |shape, threads| GemmKernel::<T>::new(shape, threads),
    )
}

/// The peak name of the AMX-BF16 tile unit (not a precision of the FMA table).
const AMX_BF16: &str = "bf16-amx";

/// The bf16 GEMM ceilings (bf16 inputs, f32 sums), where the CPU has the dot-product
/// instruction and the cap allows it.
fn gemm_bf16_section(ctx: &Ctx, out: &mut CpuResult) -> Result<(), ProbeError> {
    let gemm = match Bf16Gemm::detect() {
        Ok(g) => g,
        Err(why) => {
            out.notes.push(format!("no cpu/gemm/bf16 ceiling: {why}"));
            return Ok(());
        }
    };
    let amx = gemm.path() == crate::cpu::bf16::Path::Amx;
    let method = if amx {
        "roofline's bf16 GEMM (AMX tdpbf16ps, 32×32 tiles of C, vdpbf16ps for k past a multiple of 32, GotoBLAS blocking; ROOFLINE_AMX=0 measures vdpbf16ps alone), A and B in bf16, C in f32, row-major, random inputs".to_string()
    } else {
        format!(
            "roofline's bf16 GEMM (vdpbf16ps, {MR}×{NR} tiles, GotoBLAS blocking), A and B in bf16, C in f32, row-major, random inputs"
        )
    };
    gemm_ceilings(
        ctx,
        out,
        roofline_model::Precision::Bf16,
        Isa::Avx512,
        &method,
        if amx { AMX_BF16 } else { "bf16" },
        |shape, threads| Bf16GemmKernel::new(gemm, shape, threads),
    )
}

/// The shapes a GEMM ceiling of `precision` is the best of: squares, and for the training
/// precisions the GEMMs of ResNet-50.
fn gemm_shapes(cfg: &CpuConfig, precision: &str) -> Vec<(String, Shape)> {
    let mut shapes: Vec<(String, Shape)> = gemm_squares(cfg, precision)
        .into_iter()
        .map(|n| (format!("square {n}"), Shape { m: n, n, k: n }))
        .collect();
    if precision == "f32" || precision == "bf16" {
        let mut r = resnet50_gemms(if cfg.quick { 2 } else { 8 });
        if cfg.quick {
            r.truncate(3);
        }
        shapes.extend(r);
    }
    shapes
}

#[allow(clippy::too_many_arguments)]
fn gemm_ceilings<K: crate::driver::Kernel>(
    ctx: &Ctx,
    out: &mut CpuResult,
    p: roofline_model::Precision,
    isa: Isa,
    method: &str,
    peak_precision: &str,
    make: impl Fn(Shape, usize) -> Result<K, ProbeError> + Sync,
) -> Result<(), ProbeError> {
    let precision = p.name();
    let shapes = gemm_shapes(ctx.cfg, precision);
    for (suffix, cpus) in configs(ctx.cfg) {
        let threads = cpus.len();
        let mut sweep = Sweep::new();
        for (i, (name, shape)) in shapes.iter().enumerate() {
            ctx.progress
                .advance(&format!("gemm {precision} {suffix} {name}"));
            let plan = if shape.flops() > 1e9 {
                ctx.big_plan
            } else {
                ctx.plan
            };
            // Built and run on a pinned pool thread; `threads` > 1 spreads over the pool.
            let m = ctx.pool.install(|| -> Result<Measurement, ProbeError> {
                let mut k = make(*shape, threads)?;
                measure_here(&plan, ctx.cancel, &mut k)
            })?;
            let conditions = out.sample_conditions(&m, threads, None);
            sweep.add(
                i,
                name,
                shape.describe(),
                precision,
                threads,
                m,
                conditions,
                true,
            );
        }
        out.tables.push(Table {
            id: TableId {
                of: compute_id(Family::Gemm, p, suffix),
                rows: TableRows::Shapes,
            },
            unit: "FLOP/s".into(),
            rows: sweep.rows,
        });
        if let Some((i, stats, m, conditions)) = sweep.best {
            let method = format!(
                "{method}; best of {} shapes: {} ({}), {}; 16 entries checked against f64 (max error {:.1e} of Σ|a·b|)",
                shapes.len(), shapes[i].0, shapes[i].1.describe(), pinned(threads), m.max_rel_error
            );
            let peak = ctx.peak(out, peak_precision, threads, isa, None);
            out.ceilings.push(
                compute_ceiling(
                    compute_id(Family::Gemm, p, suffix),
                    "FLOP/s",
                    threads,
                    stats,
                    &m,
                    method,
                    peak,
                )
                .with_isa(isa.name())
                .with_conditions(conditions),
            );
        }
    }
    Ok(())
}

fn conv(ctx: &Ctx, out: &mut CpuResult) -> Result<(), ProbeError> {
    let layers = conv_layers(ctx.cfg);
    let threads = ctx.cfg.cores.len();
    let isa = crate::cpu::gemm::gemm_isa();
    let mut sweep = Sweep::new();
    for (i, (name, shape)) in layers.iter().enumerate() {
        ctx.progress.advance(&format!("conv f32 all {name}"));
        let m = ctx.pool.install(|| -> Result<Measurement, ProbeError> {
            let mut k = ConvKernel::new(*shape, threads > 1)?;
            measure_here(&ctx.big_plan, ctx.cancel, &mut k)
        })?;
        // A 1×1 stride-1 layer is one GEMM, the GEMM ceiling's kernel: the convolution ceiling
        // is taken from the layers that are not (im2col and a GEMM per block).
        let conditions = out.sample_conditions(&m, threads, None);
        sweep.add(
            i,
            name,
            shape.describe(),
            "f32",
            threads,
            m,
            conditions,
            !shape.is_pointwise(),
        );
    }
    let pointwise = sweep
        .rows
        .iter()
        .filter(|r| layers.iter().any(|(n, s)| *n == r.name && s.is_pointwise()))
        .max_by(|a, b| a.value.total_cmp(&b.value))
        .map(|r| {
            format!(
                "; the 1×1 layers (one GEMM each, as the GEMM ceiling) are in the table, not in this ceiling: best {} at {:.1} GFLOP/s",
                r.name,
                r.value / 1e9
            )
        })
        .unwrap_or_default();
    out.tables.push(Table {
        id: TableId {
            of: compute_id(Family::Conv, roofline_model::Precision::F32, Threads::All),
            rows: TableRows::Layers,
        },
        unit: "FLOP/s".into(),
        rows: sweep.rows,
    });
    if let Some((i, stats, m, conditions)) = sweep.best {
        let method = format!(
            "forward convolution, NHWC/RSCK, im2col in cache-sized blocks + gemm; best of the {} ResNet-50 layer shapes that are not 1×1 stride 1: {} ({}), {}; 16 outputs checked against f64{pointwise}",
            layers.iter().filter(|(_, s)| !s.is_pointwise()).count(), layers[i].0, layers[i].1.describe(), pinned(threads)
        );
        let peak = ctx.peak(out, "f32", threads, isa, None);
        out.ceilings.push(
            compute_ceiling(
                compute_id(Family::Conv, roofline_model::Precision::F32, Threads::All),
                "FLOP/s",
                threads,
                stats,
                &m,
                method,
                peak,
            )
            .with_isa(isa.name())
            .with_conditions(conditions),
        );
    }
    Ok(())
}

/// "1 thread" or "N threads pinned one per core".
pub(super) fn pinned(threads: usize) -> String {
    if threads == 1 {
        "1 thread, pinned".into()
    } else {
        format!("{threads} threads pinned one per core")
    }
}

/// `1.5 MiB`-style sizes.
pub fn human_bytes(b: f64) -> String {
    const U: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i < U.len() - 1 {
        v /= 1024.0;
        i += 1;
    }
    if v.fract() == 0.0 {
        format!("{v:.0} {}", U[i])
    } else {
        format!("{v:.1} {}", U[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quick_probe_of_fma_on_one_core_measures_and_checks() {
        let cfg = CpuConfig {
            cores: crate::affinity::allowed_cpus()[..1].to_vec(),
            caches: super::super::cpu_mem::tests::caches(),
            vendor: "AuthenticAMD".into(),
            family: 26,
            model: 2,
            quick: true,
            sections: vec![Section::Fma],
        };
        let r = run(&cfg, &AtomicBool::new(false), &super::super::Silent).unwrap();
        let f32t1 = r
            .ceilings
            .iter()
            .find(|c| c.id == "cpu/fma/f32/t1")
            .unwrap();
        assert!(f32t1.value > 1e8, "{}", f32t1.value);
        assert_eq!(f32t1.stats.samples, 5);
        // Every sample carries the clock measured around it; the value is the best clean one.
        let c = f32t1.conditions.as_ref().expect("each sample's clock");
        assert_eq!(c.clock_hz.len(), 5);
        assert!(c.clock_hz.iter().all(|hz| *hz > 1e8), "{:?}", c.clock_hz);
        assert_eq!(c.clean + c.left_out.len(), 5);
        let clean = c.clean_values(&f32t1.stats.values);
        assert_eq!(
            f32t1.value,
            clean.iter().copied().fold(0.0, f64::max),
            "a ceiling is its best clean sample"
        );
        assert!(r.clock_t1.unwrap().median > 1e8);
        assert!(r.ceilings.iter().any(|c| c.id == "cpu/fma/f64/all"));
    }
}
