//! Convolution ceilings through cuDNN over every distinct convolution of ResNet-50 v1.5 at the
//! trainer's batch ([`CONV_BATCH`] unless told another) and of the EWA detector at its batch
//! ([`EWA_BATCH`]): forward, backward-data and backward-filter, f32 / tf32 / f16 / bf16, NHWC
//! tensors and KRSC filters, f32 accumulation. The quick probe measures the same shapes at the
//! same batch as the full one, with fewer samples.
//!
//! Each shape and direction takes the fastest correct method of the one search the trainer's
//! plans use (`cuda::conv_search`: the legacy API's measured choice and every backend engine,
//! each checked), recorded per row with what the search tried, beside cuDNN's heuristic (its
//! `_v7` first choice) and its rate. A shape whose own roof is the memory's is timed on a cold
//! L2 (a buffer twice the L2 written before each run, outside the timed interval), as a layer's
//! operands arrive in training. Every result is checked on 24 entries against f64 sums on the
//! CPU. The operands are counter-based (`reference::Operand`): element `i` is a function of the
//! seed and `i`, written once per precision (in parallel) for the upload and computed again for
//! the reference, so that no f64 copy of a batch-128 tensor is kept on the host.

mod operands;
mod reference;

pub use operands::ConvOperands;

use super::{Mode, SectionResult};
use crate::cpu::conv::{ewa_layers, resnet50_all, resnet50_layers, ConvShape, Layer, EWA_BATCH};
use crate::cuda::blas::{not_supported, GemmPrec, Prec};
use crate::cuda::conv_search::{
    best_method, Chosen, Found, Outcome, SearchBudget, QUICK_SEARCH_BUDGET_S, SEARCH_BUDGET_S,
};
use crate::cuda::device::{DevBuf, Events, Gpu};
use crate::cuda::dnn::{choose, descs, execute, Dir, Handle, DIRECTIONS, WORKSPACE_LIMIT};
use crate::cuda::dnn::{math_of, Algo, Descs, PlanChoice};
use crate::cuda::dnn_cache::AlgoCache;
use crate::cuda::dnn_graph::EngineConfig;
use crate::cuda::dnn_plan::legacy_of;
use crate::cuda::CudaError;
use crate::driver::Timer;
use cudarc::cudnn::sys::cudnnMathType_t;
use reference::min_bytes;
use roofline_model::ceiling_id::{TableId, TableRows};
use roofline_model::conditions::SampleConditions;
use roofline_model::machine::Choice;
use roofline_model::{
    Ceiling, CeilingKind, Family, PeakDb, PerIteration, Stats, Table, TableRow, TheoreticalPeak,
};
use std::cell::{Cell, RefCell};
use std::sync::atomic::{AtomicBool, Ordering};

const PRECISIONS: [Prec; 4] = [Prec::F32, Prec::Tf32, Prec::F16, Prec::Bf16];

/// The batch ResNet-50's convolutions run at unless told another (`probe --conv-batch`): the
/// trainer's, in the quick probe as in the full one.
pub const CONV_BATCH: usize = 128;

/// Seconds the whole section's searches may take unless told another (`probe
/// --conv-search-budget`), by mode: every search gets at most its own cap
/// ([`QUICK_SEARCH_BUDGET_S`], [`SEARCH_BUDGET_S`]) and at most an even share of what is left
/// of this, so that the section ends in time whatever cuDNN offers. A search whose share is
/// spent still runs the legacy API's measured choice (cuDNN's find), then stops: every row
/// keeps a checked method and its rate, and the rows record the methods not tried.
pub const QUICK_SECTION_SEARCH_S: f64 = 30.0;
pub const FULL_SECTION_SEARCH_S: f64 = 240.0;

/// How the convolution section runs: ResNet-50's batch and the searches' budget.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ConvOptions {
    /// The batch of ResNet-50's convolutions ([`CONV_BATCH`] by default; `--check` runs batch
    /// 2 whatever this is).
    pub batch: usize,
    /// Seconds for all the section's searches together; None: the mode's default
    /// ([`QUICK_SECTION_SEARCH_S`], [`FULL_SECTION_SEARCH_S`]; `--check` has no cap).
    pub search_budget_s: Option<f64>,
}

impl Default for ConvOptions {
    fn default() -> Self {
        ConvOptions {
            batch: CONV_BATCH,
            search_budget_s: None,
        }
    }
}

impl ConvOptions {
    /// The section's search budget in `mode`.
    pub fn section_budget(&self, mode: Mode) -> f64 {
        match (mode, self.search_budget_s) {
            (Mode::Check, _) => f64::INFINITY,
            (_, Some(s)) => s,
            (Mode::Quick, None) => QUICK_SECTION_SEARCH_S,
            (Mode::Full, None) => FULL_SECTION_SEARCH_S,
        }
    }
}

/// The shapes the section measures: in the full probe ResNet-50's at `batch` and the
/// detector's at its own batch; in the quick probe a representative subset of those
/// ([`quick_subset`]); in `--check` mode three of ResNet-50's at batch 2 and the detector's
/// smallest (a non-square one) at batch 1.
pub fn conv_layers(mode: Mode, batch: usize) -> Vec<Layer> {
    match mode {
        Mode::Check => {
            let mut v = resnet50_layers(2);
            v.truncate(3);
            v.extend(ewa_layers(1).into_iter().last());
            v
        }
        Mode::Quick => quick_subset(&resnet50_layers(batch), &ewa_layers(EWA_BATCH)),
        Mode::Full => {
            let mut v = resnet50_layers(batch);
            v.extend(ewa_layers(EWA_BATCH));
            v
        }
    }
}

/// The quick probe's shapes: of ResNet-50's, the one of most FLOPs for each kernel size and
/// stride (the stem, the 3×3s at stride 1 and 2, the 1×1s at stride 1 and the strided
/// projection), and of the detector's its 3×3 and 1×1 at stride 1 of most FLOPs (the
/// pyramid's and the RPN's): every kind of convolution the trainers run, at its costliest,
/// in a tenth of the full probe's searches. The probe's notes name them.
pub fn quick_subset(resnet: &[Layer], ewa: &[Layer]) -> Vec<Layer> {
    let mut keys: Vec<(usize, usize)> = Vec::new();
    for l in resnet {
        let k = (l.shape.r, l.shape.stride);
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let most = |from: &[Layer], k: (usize, usize)| {
        from.iter()
            .filter(|l| (l.shape.r, l.shape.stride) == k)
            .max_by(|a, b| a.shape.flops().total_cmp(&b.shape.flops()))
            .cloned()
    };
    let mut v: Vec<Layer> = keys.iter().filter_map(|&k| most(resnet, k)).collect();
    v.extend([(3, 1), (1, 1)].into_iter().filter_map(|k| most(ewa, k)));
    v
}

/// CUDA events around each sample, after the L2 has been filled with another buffer (written
/// outside the timed interval): a cold-L2 timing.
struct Cold<'a> {
    gpu: &'a Gpu,
    flush: &'a DevBuf,
}

impl Timer for Cold<'_> {
    type Error = CudaError;
    fn time(&mut self, work: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
        // SAFETY: the whole buffer, on the GPU's stream, before the start event.
        unsafe { self.gpu.zero_async(self.flush.ptr, self.flush.bytes) }?;
        self.gpu.time(work)
    }
    fn settle(&mut self) -> Result<(), CudaError> {
        self.gpu.sync()
    }
    fn observe(&mut self) {
        self.gpu.observe();
    }
}

/// How a convolution is timed. Warm: the calibrated repetitions per sample (5 ms quick, 20 ms
/// full), 3 or 5 samples. Cold (`flush`): one run a sample after the L2 is flushed, 10 or 30
/// samples. NVML's readings at the end of each sample.
struct Timing<'a> {
    gpu: &'a Gpu,
    mode: Mode,
    cancel: &'a AtomicBool,
    flops: f64,
    flush: Option<&'a DevBuf>,
}

impl Timing<'_> {
    /// The rates of `run` and the samples' conditions; None without a sample.
    fn measure(
        &self,
        run: &dyn Fn() -> Result<(), CudaError>,
    ) -> Result<Option<(Stats, Option<SampleConditions>)>, CudaError> {
        let gpu = self.gpu;
        let quick = self.mode == Mode::Quick;
        let mut stop = || match self.cancel.load(Ordering::Relaxed) {
            true => Err(CudaError::Interrupted),
            false => Ok(()),
        };
        let (reps, (times, conditions)) = match self.flush {
            Some(flush) => {
                let n = if quick { 10 } else { 30 };
                let mut timer = Cold { gpu, flush };
                let r = gpu.watched(
                    || crate::driver::sample(&mut timer, 1, n, &mut stop, &mut || run()),
                    |t| t.len(),
                )?;
                (1, r)
            }
            None => {
                let want = if quick { 0.005 } else { 0.02 };
                let reps = crate::driver::calibrate(&mut Events(gpu), 1, 200, want, &mut |r| {
                    (0..r).try_for_each(|_| run())
                })?;
                let n = if quick { 3 } else { 5 };
                let r = gpu.watched(
                    || {
                        crate::driver::sample(&mut Events(gpu), 0, n, &mut stop, &mut || {
                            (0..reps).try_for_each(|_| run())
                        })
                    },
                    |t| t.len(),
                )?;
                (reps, r)
            }
        };
        let rates: Vec<f64> = times
            .iter()
            .map(|tm| self.flops * reps as f64 / tm)
            .collect();
        Ok(Stats::from_samples(&rates).map(|s| (s, conditions)))
    }
}

/// A shape's own roof, min(the precision's datasheet peak, its operational intensity × the
/// datasheet memory bandwidth), and whether the memory's is the lower; None for a GPU the
/// peak database lacks.
fn shape_roof(
    peaks: &PeakDb,
    gpu: &Gpu,
    p: Prec,
    s: &ConvShape,
    dir: Dir,
    flops: f64,
) -> Option<(f64, bool)> {
    let peak = peak_for(peaks, gpu, p)?.value;
    let bw = peaks.device(&gpu.name)?.memory_bandwidth;
    let memory = flops / min_bytes(s, p, dir) * bw;
    Some((peak.min(memory), memory < peak))
}

fn peak_for(peaks: &PeakDb, gpu: &Gpu, p: Prec) -> Option<TheoreticalPeak> {
    let d = peaks.device(&gpu.name)?;
    let engine = if p == Prec::F32 { "vector" } else { "matrix" };
    let pk = d.engine_peak(p.name(), engine)?;
    Some(TheoreticalPeak {
        value: pk.value,
        unit: pk.unit.clone(),
        source: format!("{} ({} {engine} peak): {}", d.name, p.name(), d.source),
        uncertainty: 0.0,
    })
}

pub fn conv_section(
    gpu: &mut Gpu,
    mode: Mode,
    cancel: &AtomicBool,
    peaks: &PeakDb,
    opts: ConvOptions,
) -> Result<SectionResult, CudaError> {
    let h = Handle::new(gpu)?;
    let layers = conv_layers(mode, opts.batch);
    let cap = match mode {
        Mode::Quick => QUICK_SEARCH_BUDGET_S,
        Mode::Check | Mode::Full => SEARCH_BUDGET_S,
    };
    let total = opts.section_budget(mode);
    let searches = layers.len() * DIRECTIONS.len() * PRECISIONS.len();
    let budget = SearchBudget::new(total, cap, searches);
    let ws = gpu.alloc(WORKSPACE_LIMIT)?;
    // Twice the L2, written before each cold-L2 sample.
    let flush = match gpu.l2_bytes {
        0 => None,
        l2 => Some(gpu.alloc(2 * l2 as usize)?),
    };
    let mut out = SectionResult::default();
    if mode == Mode::Quick {
        let names: Vec<String> = layers
            .iter()
            .map(|l| format!("{} ({})", l.name, l.shape.describe()))
            .collect();
        out.notes.push(format!(
            "gpu{} conv (quick): a representative subset of {} shapes (each kind of convolution at its costliest; the full probe measures every one): {}",
            gpu.ordinal,
            layers.len(),
            names.join("; ")
        ));
    }
    if total.is_finite() {
        out.notes.push(format!(
            "gpu{} conv: {searches} searches within {total:.0} s together (at most {cap} s each; one whose share is spent keeps cuDNN's measured legacy choice: see each row's methods not tried)",
            gpu.ordinal
        ));
    }
    if flush.is_none() {
        out.notes.push(format!(
            "gpu{} conv: the driver reports no L2 size; memory-bound shapes are timed warm",
            gpu.ordinal
        ));
    }
    let bench = Bench {
        gpu,
        h: &h,
        ws: &ws,
        flush: flush.as_ref(),
        mode,
        cancel,
        peaks,
        budget: &budget,
        cache: RefCell::new(if mode == Mode::Check {
            None
        } else {
            AlgoCache::for_gpu(gpu)
        }),
    };
    for p in PRECISIONS {
        let r = bench.precision(p, &layers, &mut out);
        if matches!(r, Err(CudaError::Interrupted)) {
            return Err(CudaError::Interrupted);
        }
        out.checks.push((format!("cudnn_conv_{}", p.name()), r));
    }
    if total.is_finite() {
        out.notes.push(format!(
            "gpu{} conv: the searches took {:.1} s of their {total:.0} s",
            gpu.ordinal,
            total - budget.left()
        ));
    }
    Ok(out)
}

/// What every shape of the section runs with.
struct Bench<'a> {
    gpu: &'a Gpu,
    h: &'a Handle,
    ws: &'a DevBuf,
    flush: Option<&'a DevBuf>,
    mode: Mode,
    cancel: &'a AtomicBool,
    peaks: &'a PeakDb,
    budget: &'a SearchBudget,
    /// Where the checked choices go for the trainer (None: no cache folder, or not written
    /// in --check mode).
    cache: RefCell<Option<AlgoCache>>,
}

/// One direction's checked choice: the legacy algorithm, its descriptor's math type, the
/// engine run instead where the search chose one.
type Pick = (Algo, cudnnMathType_t, Option<EngineConfig>);

/// What a plan keeps of a direction's chosen method: a legacy algorithm as it is; an engine
/// beside the legacy API's measured choice (or, where the search listed none, its heuristic's).
fn pick_of(
    h: &Handle,
    d: &Descs,
    p: Prec,
    dir: Dir,
    chosen: &Chosen,
    legacy: Option<Algo>,
) -> Option<Pick> {
    let (algo, engine) = match chosen {
        Chosen::Legacy(a) => (*a, None),
        Chosen::Engine(e) => (
            legacy_of(h, d, p, dir, legacy).ok()?.0,
            Some(e.config.clone()),
        ),
    };
    Some((algo, math_of(d).ok()?, engine))
}

/// Per direction: the best layer's statistics, FLOPs, description and sample conditions.
type Best = (Stats, f64, String, Option<SampleConditions>);

impl Bench<'_> {
    /// A shape's three checked choices into the algorithm cache, where the trainer takes them
    /// instead of searching (a cache it cannot write is dropped with a note).
    fn cache_choice(&self, s: &ConvShape, p: Prec, picks: Vec<Option<Pick>>) {
        let mut cache = self.cache.borrow_mut();
        let Some(c) = cache.as_mut() else { return };
        let Some(picks) = picks.into_iter().collect::<Option<Vec<Pick>>>() else {
            return;
        };
        let choice = PlanChoice::new(
            [picks[0].0, picks[1].0, picks[2].0],
            [picks[0].1, picks[1].1, picks[2].1],
            [picks[0].2.clone(), picks[1].2.clone(), picks[2].2.clone()],
            0,
        );
        if let Err(e) = c.put(s, p, &choice) {
            eprintln!("note: the convolution algorithm cache was not written: {e}");
            *cache = None;
        }
    }

    fn precision(
        &self,
        p: Prec,
        layers: &[Layer],
        out: &mut SectionResult,
    ) -> Result<String, CudaError> {
        let (gpu, h, ws) = (self.gpu, self.h, self.ws);
        let mut rows: Vec<Vec<TableRow>> = vec![Vec::new(); 3];
        let mut best: Vec<Option<Best>> = vec![None, None, None];
        let worst = Cell::new(0.0f64);
        let (mut refused, mut measured) = (None, 0usize);
        let mut wrong: Vec<String> = Vec::new();
        let mut notes: Vec<String> = Vec::new();
        for (li, layer) in layers.iter().enumerate() {
            let s = &layer.shape;
            // One descriptor set per direction, as in ConvPlan: a legacy choice sets the math
            // type it wants on its descriptor.
            let ds = [descs(s, p)?, descs(s, p)?, descs(s, p)?];
            let t = ConvOperands::new(gpu, s, p, 0xC0FFEE + 3 * li as u64)?;
            let flops = 2.0 * (s.rows() * s.depth() * s.k) as f64;
            // Each direction's checked choice, for the algorithm cache the trainer reads.
            let mut picks: Vec<Option<Pick>> = vec![None, None, None];
            // The row's shape as a placement names a layer's (`ConvShape::describe`).
            let shape = s.describe();
            for (di, dir) in DIRECTIONS.into_iter().enumerate() {
                if self.cancel.load(Ordering::Relaxed) {
                    return Err(CudaError::Interrupted);
                }
                let d = &ds[di];
                let ops = t.operands(dir);
                let wsp = (ws.ptr, ws.bytes);
                // Every method cuDNN offers, each checked against the CPU's reference; the
                // worst error of this row's methods, and of the precision's.
                let here = Cell::new(0.0f64);
                let mut check = || {
                    t.check(gpu, dir).map(|e| {
                        here.set(here.get().max(e));
                        worst.set(worst.get().max(e));
                    })
                };
                let searched_at = std::time::Instant::now();
                let share = self.budget.next();
                let found = best_method(
                    gpu,
                    h,
                    d,
                    s,
                    p,
                    dir,
                    ops,
                    wsp,
                    &mut check,
                    self.cancel,
                    share,
                )
                .map_err(not_supported);
                self.budget.spent(searched_at.elapsed().as_secs_f64());
                let where_ = format!(
                    "gpu{} conv {} {} {}",
                    gpu.ordinal,
                    p.name(),
                    dir.name(),
                    layer.name
                );
                let Found {
                    searched,
                    notes: listed,
                    legacy,
                } = match found {
                    Ok(f) => f,
                    Err(CudaError::Interrupted) => return Err(CudaError::Interrupted),
                    Err(e) => {
                        out.notes.push(format!("{where_}: not measured: {e}"));
                        refused = Some(e);
                        continue;
                    }
                };
                for n in listed {
                    if !notes.contains(&n) {
                        notes.push(n);
                    }
                }
                for tried in &searched.tried {
                    if let Outcome::Wrong(why) = &tried.outcome {
                        wrong.push(format!("{where_}: {}: {why}", tried.name));
                    }
                }
                let summary = searched.summary();
                let Some((chosen, name, _)) = searched.best else {
                    let e = CudaError::Unsupported(format!("no usable method ({summary})"));
                    out.notes.push(format!("{where_}: not measured: {e}"));
                    refused = Some(e);
                    continue;
                };
                measured += 1;
                // The choice as a plan keeps it, with the math type the search left on the
                // descriptor (before the heuristic below sets its own).
                picks[di] = pick_of(h, d, p, dir, &chosen, legacy);
                if self.mode == Mode::Check {
                    continue;
                }
                let (roof, memory_bound) = shape_roof(self.peaks, gpu, p, s, dir, flops)
                    .map_or((None, false), |(r, m)| (Some(r), m));
                let timing = Timing {
                    gpu,
                    mode: self.mode,
                    cancel: self.cancel,
                    flops,
                    flush: if memory_bound { self.flush } else { None },
                };
                let Some((stats, conditions)) = timing.measure(&|| chosen.run(h, d, ops, wsp))?
                else {
                    continue;
                };
                // The row holds what the ceiling would: the best clean sample.
                let value = SampleConditions::best_rate(conditions.as_ref(), &stats);
                // cuDNN's heuristic (its _v7 first choice) beside the fastest measured: timed
                // too where it is another method. (It sets its math type on the descriptor,
                // after the fastest's timing.)
                let heuristic = match choose(h, d, p, dir) {
                    Ok((a, _)) if a.name() == name => Some(Choice {
                        detail: a.name(),
                        value,
                    }),
                    Ok((a, _)) => match timing.measure(&|| execute(h, d, a, ops, wsp)) {
                        Ok(Some((hs, hc))) => Some(Choice {
                            detail: a.name(),
                            value: SampleConditions::best_rate(hc.as_ref(), &hs),
                        }),
                        Ok(None) | Err(_) => None,
                    },
                    Err(_) => None,
                };
                let detail = format!(
                    "{name}{}; {summary}",
                    if timing.flush.is_some() {
                        ", cold L2"
                    } else {
                        ""
                    }
                );
                if best[di]
                    .as_ref()
                    .is_none_or(|b| value > SampleConditions::best_rate(b.3.as_ref(), &b.0))
                {
                    best[di] = Some((
                        stats.clone(),
                        flops,
                        format!("{} ({shape}), {name}", layer.name),
                        conditions,
                    ));
                }
                rows[di].push(TableRow {
                    name: layer.name.clone(),
                    shape: shape.clone(),
                    precision: Some(p.name().into()),
                    threads: 1,
                    value,
                    stats,
                    max_rel_error: Some(here.get()),
                    detail: Some(detail),
                    heuristic,
                    roof,
                    efficiency: roof.map(|r| value / r),
                });
            }
            self.cache_choice(s, p, picks);
        }
        out.notes.extend(
            notes
                .into_iter()
                .map(|n| format!("gpu{} conv {}: {n}", gpu.ordinal, p.name())),
        );
        self.push_ceilings(p, layers, best, rows, out);
        if !wrong.is_empty() {
            return Err(CudaError::Check(format!(
                "{} cuDNN method(s) gave a wrong result (never chosen): {}",
                wrong.len(),
                wrong.join("; ")
            )));
        }
        match refused {
            // Nothing ran at all: the precision is not supported here.
            Some(e) if measured == 0 => Err(e),
            _ => Ok(format!("max normwise error {:.1e}", worst.get())),
        }
    }

    fn push_ceilings(
        &self,
        p: Prec,
        layers: &[Layer],
        mut best: Vec<Option<Best>>,
        mut rows: Vec<Vec<TableRow>>,
        out: &mut SectionResult,
    ) {
        let gpu = self.gpu;
        let batch = layers.first().map_or(0, |l| l.shape.n);
        // ResNet-50's 53 convolutions at the section's batch, each with its shape's row.
        let network = resnet50_all(batch);
        for (di, dir) in DIRECTIONS.into_iter().enumerate() {
            let Some((_, _, how, _)) = best[di].take() else {
                continue;
            };
            // The stem's input needs no gradient: backward-data leaves it out.
            let convs: Vec<&Layer> = network
                .iter()
                .filter(|l| !(dir == Dir::BwdData && l.shape.c == 3))
                .collect();
            let found: Vec<(f64, &[f64])> = convs
                .iter()
                .filter_map(|l| {
                    let key = l.shape.describe();
                    let row = rows[di].iter().find(|r| r.shape == key)?;
                    Some((l.shape.flops(), row.stats.values.as_slice()))
                })
                .collect();
            let missing = convs.len() - found.len();
            let Some(stats) = Stats::from_samples(&network_samples(&found)) else {
                continue;
            };
            let flops: f64 = found.iter().map(|(f, _)| f).sum();
            let method = format!(
                "cuDNN {}, NHWC/KRSC, f32 accumulation{}: ResNet-50 v1.5's {} convolutions at batch {batch} each at its own shape's measured rate, their FLOPs over the sum of their times (the network's rate, not its fastest shape's{}), sample k of the ceiling from each shape's k-th best; the fastest shape of the table (beside the EWA detector's at batch {EWA_BATCH}): {how}; each shape's fastest correct method of every one cuDNN offers (the legacy API's measured choice, then the backend heuristic's engines in its order, then every other engine; at most {budget} s a direction, within the section's search budget); memory-bound shapes timed on a cold L2; 24 entries per result checked against f64 (normwise ≤ {:.0e}); CUDA-event timed",
                dir.name(),
                if p == Prec::F32 { ", FMA math (no TF32)" } else { ", tensor-op math" },
                found.len(),
                if missing > 0 {
                    format!("; {missing} of them not measured and left out")
                } else {
                    String::new()
                },
                p.tolerance(),
                budget = self.budget.cap(),
            );
            let per_iteration = PerIteration {
                ops: flops,
                bytes: 0.0,
            };
            let roof = super::compute_roof(gpu.ordinal, Family::Conv, p, Some(dir));
            out.ceilings.push(
                Ceiling::measured(
                    roof,
                    CeilingKind::Compute,
                    "FLOP/s",
                    1,
                    stats,
                    per_iteration,
                    method,
                )
                .as_roof(roof)
                .with_peak(peak_for(self.peaks, gpu, p)),
            );
            out.tables.push(Table {
                id: TableId {
                    of: roof,
                    rows: TableRows::Table,
                },
                unit: "FLOP/s".into(),
                rows: std::mem::take(&mut rows[di]),
            });
        }
    }
}

/// The network's rate from its parts' samples: part `(flops, samples)` is one convolution's
/// FLOPs and its rates; sample k is the total FLOPs over the sum of each part's time at its
/// k-th best rate (as many samples as the part with fewest has).
fn network_samples(parts: &[(f64, &[f64])]) -> Vec<f64> {
    let sorted: Vec<Vec<f64>> = parts
        .iter()
        .map(|(_, v)| {
            let mut v = v.to_vec();
            v.sort_by(|a, b| b.total_cmp(a));
            v
        })
        .collect();
    let n = sorted.iter().map(Vec::len).min().unwrap_or(0);
    let total: f64 = parts.iter().map(|(f, _)| f).sum();
    (0..n)
        .map(|k| {
            let time: f64 = parts.iter().zip(&sorted).map(|((f, _), v)| f / v[k]).sum();
            total / time
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two convolutions of 1 and 3 GFLOP at 100 and 300 GFLOP/s take 10 ms each: the network
    /// runs 4 GFLOP in 20 ms, 200 GFLOP/s, not the best shape's 300; the second best of each
    /// combine likewise, and a part with fewer samples bounds the count.
    #[test]
    fn the_network_rate_is_its_flops_over_its_time() {
        let a = [100e9, 50e9];
        let b = [150e9, 300e9, 200e9];
        let v = network_samples(&[(1e9, &a), (3e9, &b)]);
        assert_eq!(v.len(), 2);
        assert!((v[0] - 200e9).abs() < 1.0, "{}", v[0]);
        // 1/50 + 3/200 = 0.035 s for 4 GFLOP.
        assert!((v[1] - 4e9 / 0.035).abs() < 1.0, "{}", v[1]);
        assert!(network_samples(&[]).is_empty());
    }

    /// The budget is shared evenly among the searches left, never above the cap, and a search
    /// that overran leaves less to the rest; once spent, every search gets 0 (its first timed
    /// method only).
    #[test]
    fn the_search_budget_is_shared_and_ends() {
        let b = SearchBudget::new(10.0, 1.0, 40);
        assert_eq!(b.next(), 0.25);
        b.spent(5.0);
        // 5 s for 39 searches.
        assert!((b.next() - 5.0 / 39.0).abs() < 1e-12);
        let wide = SearchBudget::new(100.0, 0.25, 4);
        assert_eq!(wide.next(), 0.25);
        b.spent(7.0);
        assert_eq!(b.left(), 0.0);
        assert_eq!(b.next(), 0.0);
        let endless = SearchBudget::new(f64::INFINITY, 1.0, 3);
        assert_eq!(endless.next(), 1.0);
        // The mode's defaults, and --check unbounded.
        let o = ConvOptions::default();
        assert_eq!(o.section_budget(Mode::Quick), QUICK_SECTION_SEARCH_S);
        assert_eq!(o.section_budget(Mode::Full), FULL_SECTION_SEARCH_S);
        assert!(o.section_budget(Mode::Check).is_infinite());
        let told = ConvOptions {
            search_budget_s: Some(12.0),
            ..o
        };
        assert_eq!(told.section_budget(Mode::Quick), 12.0);
    }

    /// The quick probe's shapes: each kind of ResNet-50 convolution (kernel size and stride) at
    /// its costliest, and the detector's 3×3 and 1×1; far fewer than the full probe's, and
    /// every one of them among the full probe's.
    #[test]
    fn the_quick_subset_has_every_kind_at_its_costliest() {
        let full = conv_layers(Mode::Full, CONV_BATCH);
        let quick = conv_layers(Mode::Quick, CONV_BATCH);
        assert!(
            quick.len() * 5 < full.len(),
            "{} of {}",
            quick.len(),
            full.len()
        );
        for l in &quick {
            assert!(full.iter().any(|f| f.shape == l.shape), "{}", l.name);
        }
        let resnet = resnet50_layers(CONV_BATCH);
        for r in &resnet {
            let k = (r.shape.r, r.shape.stride);
            let pick = quick
                .iter()
                .find(|q| (q.shape.r, q.shape.stride) == k && q.shape.n == CONV_BATCH)
                .unwrap_or_else(|| panic!("no {k:?} in the quick subset"));
            assert!(pick.shape.flops() >= r.shape.flops(), "{}", r.name);
        }
        let ewa: Vec<&Layer> = quick.iter().filter(|l| l.shape.n == EWA_BATCH).collect();
        assert_eq!(ewa.len(), 2);
        assert_eq!((ewa[0].shape.r, ewa[1].shape.r), (3, 1));
    }
}
