//! `roofline place`: runs a workload, measures it, and puts it on the machine's rooflines.

use crate::run_args::{self, RunArgs};
use crate::{Failure, CANCEL};
use anyhow::anyhow;
use roofline_collectors::timeline;
use roofline_kernels::cpu::conv::{ConvKernel, ConvShape};
use roofline_kernels::cpu::gemm::{GemmKernel, Shape};
use roofline_kernels::cpu::stream::{self, Op, StreamKernel};
use roofline_kernels::driver::{measure_here, measure_threads, Measurement, Plan};
use roofline_model::placement::{
    advise, bound, cpu_roofs, gpu_roofs, Coi, Energy, Intensity, MachineRef, Placement, Point,
    TimeBreakdown, WorkloadInfo, PLACEMENT_SCHEMA,
};
use roofline_model::{write::write_atomic, Machine, Stats};
use roofline_workloads::accounting;
use roofline_workloads::run::Kind;
use std::path::{Path, PathBuf};
use std::time::Instant;

#[derive(clap::Args)]
pub struct PlaceArgs {
    /// What to place: `resnet50` or `ewa` (a training run of the embedded trainer; the
    /// training options below apply; ewa at e.g. --resolution 192x288 on small machines),
    /// `gemm:MxNxK[:f32|f64|f16]`, `conv:N,C,H,W,K,R,S,stride,pad` (f32 forward, NHWC), or
    /// `stream:BYTES` (a triad over BYTES of arrays).
    #[arg(long, value_name = "W")]
    pub workload: String,
    /// The machine's ceilings, from `roofline probe`.
    #[arg(long, default_value = "machine.json", value_name = "FILE")]
    pub machine: PathBuf,
    /// Where to write the placement (roofline/placement/v1).
    #[arg(short, long, default_value = "placement.json")]
    pub output: PathBuf,
    /// The roofline with the point (and its top layers) drawn on it (default: the output's
    /// name with .svg).
    #[arg(long, value_name = "SVG")]
    pub plot: Option<PathBuf>,
    /// resnet50, ewa: also write the timeline of the measured steps (data, every layer's forward
    /// and backward pass, allreduce buckets, optimiser) as Chrome trace JSON; Perfetto
    /// (ui.perfetto.dev) and chrome://tracing open it.
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// Steps (kernels: samples) run first and not counted.
    #[arg(long, default_value_t = 2)]
    pub warm: usize,
    /// resnet50, ewa: how many of its layers (by time) to place as their own points.
    #[arg(long, default_value_t = 8)]
    pub top: usize,
    /// Print the placement as JSON on stdout too.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub run: RunArgs,
}

/// A parsed `--workload`.
#[derive(Clone, Debug, PartialEq)]
pub enum Workload {
    /// A training run of the named workload (resnet50, ewa).
    Training(Kind),
    Gemm(Shape, String),
    Conv(ConvShape),
    Stream(usize),
}

pub fn parse_workload(w: &str) -> Result<Workload, String> {
    let bad = |what: &str| format!("--workload {w}: {what}");
    let num = |s: &str| -> Result<usize, String> {
        s.trim()
            .replace('_', "")
            .parse::<usize>()
            .ok()
            .filter(|v| *v > 0)
            .ok_or_else(|| bad(&format!("{s:?} is not a positive whole number")))
    };
    match w {
        "resnet50" => return Ok(Workload::Training(Kind::Resnet50)),
        "ewa" => return Ok(Workload::Training(Kind::Ewa)),
        _ => {}
    }
    let (kind, rest) = w.split_once(':').ok_or_else(|| {
        bad("expected resnet50, ewa, gemm:MxNxK[:precision], conv:N,C,H,W,K,R,S,stride,pad or stream:BYTES")
    })?;
    match kind {
        "gemm" => {
            let (dims, prec) = match rest.split_once(':') {
                Some((d, p)) => (d, p.to_string()),
                None => (rest, "f32".to_string()),
            };
            if !["f32", "f64", "f16"].contains(&prec.as_str()) {
                return Err(bad(&format!("precision {prec}: f32, f64 or f16")));
            }
            let d: Vec<usize> = dims.split('x').map(num).collect::<Result<_, _>>()?;
            let [m, n, k] = d[..] else {
                return Err(bad("expected three sizes, MxNxK"));
            };
            Ok(Workload::Gemm(Shape { m, n, k }, prec))
        }
        "conv" => {
            let d: Vec<usize> = rest
                .split(',')
                .enumerate()
                .map(|(i, s)| {
                    // Padding may be zero.
                    if i == 8 {
                        s.trim().parse::<usize>().map_err(|_| bad("bad padding"))
                    } else {
                        num(s)
                    }
                })
                .collect::<Result<_, _>>()?;
            let [n, c, h, w, k, r, s, stride, pad] = d[..] else {
                return Err(bad("expected nine numbers: N,C,H,W,K,R,S,stride,pad"));
            };
            let sh = ConvShape {
                n,
                c,
                h,
                w,
                k,
                r,
                s,
                stride,
                pad,
            };
            if !sh.valid() {
                return Err(bad("the filter does not fit the padded input"));
            }
            Ok(Workload::Conv(sh))
        }
        "stream" => {
            let b = num(rest)?;
            if b < 3 * 64 * 8 {
                return Err(bad("at least 1536 bytes (three arrays of 64 doubles)"));
            }
            Ok(Workload::Stream(b))
        }
        _ => Err(bad(&format!(
            "unknown kind {kind:?}: resnet50, ewa, gemm:…, conv:… or stream:…"
        ))),
    }
}

/// What running a workload gave, before it is placed.
pub(crate) struct Measured {
    info: WorkloadInfo,
    flops_per_step: f64,
    step_seconds: Vec<f64>,
    min_bytes: f64,
    footprint: f64,
    coi: Option<Coi>,
    layers: Vec<(String, f64, f64, f64, f64)>,
    time: TimeBreakdown,
    energy: Energy,
    spans: Vec<timeline::Span>,
}

pub fn place(a: &PlaceArgs) -> Result<(), Failure> {
    let input = |m: String| Failure::Input(anyhow!(m));
    let workload = parse_workload(&a.workload).map_err(input)?;
    let m = Machine::read(&a.machine).map_err(|e| {
        input(format!(
            "{e}; place needs the machine's ceilings: run `roofline probe -o {}` first",
            a.machine.display()
        ))
    })?;
    if m.ceilings.is_empty() {
        return Err(input(format!(
            "{} has no ceilings: run `roofline probe` without --only",
            a.machine.display()
        )));
    }
    crate::probe_cmd::check_writable(&a.output).map_err(Failure::Input)?;
    let plot_path = a
        .plot
        .clone()
        .unwrap_or_else(|| a.output.with_extension("svg"));
    crate::probe_cmd::check_writable(&plot_path).map_err(Failure::Input)?;
    if a.trace.is_some() && !matches!(workload, Workload::Training(_)) {
        return Err(input(
            "--trace records a training run's timeline: use it with --workload resnet50 or ewa"
                .into(),
        ));
    }
    if let Some(t) = &a.trace {
        crate::probe_cmd::check_writable(t).map_err(Failure::Input)?;
    }
    if a.run.cuda() {
        let g = format!("gpu{}/", a.run.gpu.unwrap_or(0));
        if !m.ceilings.iter().any(|c| c.id.starts_with(&g)) {
            return Err(input(format!(
                "{} has no {} ceilings to place a GPU run on: run `roofline probe --device cuda -o {}` on this machine first",
                a.machine.display(),
                g.trim_end_matches('/'),
                a.machine.display()
            )));
        }
    }
    if a.run.cuda() && !matches!(workload, Workload::Training(_)) {
        return Err(input(
            "--device cuda places a training run (--workload resnet50 or ewa) on a GPU's roofline; a GEMM, convolution or STREAM kernel on the GPU is what `roofline probe --device cuda` measures (its gemm, conv and mem ceilings)"
                .into(),
        ));
    }
    let start = Instant::now();
    let measured = match &workload {
        Workload::Training(kind) => training(a, *kind)?,
        w => kernel(a, w)?,
    };
    let Some(measured) = measured else {
        // Another rank reports.
        return Ok(());
    };
    if let Some(t) = &a.trace {
        let j = timeline::chrome_trace(&measured.spans, 0, "roofline place (rank 0)");
        let text = serde_json::to_string(&j).map_err(|e| Failure::Run(e.into()))?;
        write_atomic(t, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    }
    let placement = assemble(&m, &a.machine, measured, a.top, start)?;
    let text = placement.to_json().map_err(|e| Failure::Run(e.into()))?;
    write_atomic(&a.output, text.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    let svg = draw(&m, &[&placement]).map_err(|e| Failure::Run(anyhow!("{e}")))?;
    write_atomic(&plot_path, svg.as_bytes()).map_err(|e| Failure::Input(e.into()))?;
    if a.json {
        println!("{text}");
    } else {
        report(&placement);
        println!(
            "wrote {} and {}{}",
            a.output.display(),
            plot_path.display(),
            a.trace
                .as_ref()
                .map(|t| format!(" and {}", t.display()))
                .unwrap_or_default()
        );
    }
    Ok(())
}

/// The classic roofline (CPU, all cores, triad) with every placement's point and layers.
pub fn draw(m: &Machine, placements: &[&Placement]) -> Result<String, roofline_plots::PlotError> {
    let mut points = Vec::new();
    for p in placements {
        let group = p.workload.name.clone();
        points.push(plot_point(&p.point, &group, true));
        points.extend(p.layers.iter().map(|l| plot_point(l, &group, false)));
    }
    let threads = if placements.iter().all(|p| p.workload.threads <= 1) {
        "t1"
    } else {
        "all"
    };
    // GPU runs on their GPU's roofline (when they all ran on one), CPU runs on the CPU's.
    let device = match placements.first().map(|p| p.workload.device.as_str()) {
        Some(d) if d.starts_with("gpu") && placements.iter().all(|p| p.workload.device == d) => {
            d.to_string()
        }
        _ => "cpu".to_string(),
    };
    roofline_plots::classic_svg(
        m,
        &roofline_plots::ClassicOptions {
            threads: threads.into(),
            device,
            points,
            ..Default::default()
        },
    )
}

fn plot_point(p: &Point, group: &str, main: bool) -> roofline_plots::PlotPoint {
    roofline_plots::PlotPoint {
        label: p.label.clone(),
        group: group.to_string(),
        intensity: p.oi.analytic,
        achieved: p.achieved_flops,
        attainable: p.bound.attainable,
        main,
        share: p.share_of_step,
        binding: Some(p.bound.ceiling.clone()),
    }
}

fn stats(v: &[f64]) -> Result<Stats, Failure> {
    Stats::from_samples(v).ok_or_else(|| Failure::Run(anyhow!("no finite measurement")))
}

/// Places the measured workload and its layers.
pub(crate) fn assemble(
    m: &Machine,
    path: &Path,
    r: Measured,
    top: usize,
    start: Instant,
) -> Result<Placement, Failure> {
    let seconds = stats(&r.step_seconds)?;
    let rates: Vec<f64> = r
        .step_seconds
        .iter()
        .map(|s| r.flops_per_step / s)
        .collect();
    let achieved = stats(&rates)?;
    let oi = r.flops_per_step / r.min_bytes;
    let families: &[&str] = match r.info.kind.as_str() {
        "gemm" | "stream" => &["gemm", "fma"],
        _ => &["conv", "gemm", "fma"],
    };
    // A GPU run is held against that GPU's ceilings (`gpuN/...`), a CPU run against the CPU's.
    let gpu: Option<usize> = r
        .info
        .device
        .strip_prefix("gpu")
        .and_then(|g| g.parse().ok());
    let roofs_at = |footprint: f64, coi: Option<&Coi>| match gpu {
        Some(g) => gpu_roofs(m, g, &r.info.precision, families, footprint, coi),
        None => cpu_roofs(
            m,
            &r.info.precision,
            families,
            r.info.threads,
            footprint,
            coi,
        ),
    };
    let roofs = roofs_at(r.footprint, r.coi.as_ref());
    let no_roof = || {
        Failure::Input(anyhow!(
            "the machine.json has no {} {} compute or memory ceiling to place this on: run `roofline probe{}` without --only",
            r.info.device,
            r.info.precision,
            if gpu.is_some() { " --device cuda" } else { "" }
        ))
    };
    let b = bound(&roofs, oi, r.coi.as_ref(), achieved.max).ok_or_else(no_roof)?;
    let measured_note = "no hardware memory-traffic counters are read (yet): the OI is the analytic minimum, an upper bound of the true one".to_string();
    let point = Point {
        label: r.info.name.clone(),
        flops_per_step: r.flops_per_step,
        seconds_per_step: seconds.clone(),
        achieved_flops: achieved.max,
        achieved,
        footprint_bytes: r.footprint,
        oi: Intensity {
            analytic_min_bytes: r.min_bytes,
            analytic: oi,
            measured: None,
            measured_note: measured_note.clone(),
        },
        coi: r.coi.clone(),
        share_of_step: None,
        bound: b,
    };
    let mut layers = Vec::new();
    let mut by_time = r.layers.clone();
    by_time.sort_by(|x, y| y.1.total_cmp(&x.1));
    for (name, secs, flops, bytes, footprint) in by_time.into_iter().take(top) {
        if secs <= 0.0 || flops <= 0.0 {
            continue;
        }
        let oi = flops / bytes;
        let rate = flops / secs;
        let roofs = roofs_at(footprint, None);
        let Some(b) = bound(&roofs, oi, None, rate) else {
            continue;
        };
        layers.push(Point {
            label: name,
            flops_per_step: flops,
            seconds_per_step: stats(&[secs])?,
            achieved_flops: rate,
            achieved: stats(&[rate])?,
            footprint_bytes: footprint,
            oi: Intensity {
                analytic_min_bytes: bytes,
                analytic: oi,
                measured: None,
                measured_note: measured_note.clone(),
            },
            coi: None,
            share_of_step: Some(secs / seconds.median.max(1e-12)),
            bound: b,
        });
    }
    let mut energy = r.energy;
    if let Some(j) = energy.joules_per_step {
        energy.flops_per_watt = Some(r.flops_per_step / j);
    }
    let advice = advise(&r.info, &point, &layers, &r.time, m);
    let ident = roofline_collectors::cpu_ident();
    let cpu = roofline_collectors::cpu_info(&ident, m.provenance.cpu.cores);
    let mut provenance = crate::probe_cmd::provenance(cpu, false, start);
    provenance.notes.push(energy.note.clone());
    Ok(Placement {
        schema: PLACEMENT_SCHEMA.into(),
        provenance,
        machine: MachineRef::of(m, path),
        workload: r.info,
        point,
        layers,
        time: r.time,
        energy,
        advice,
    })
}

pub(crate) fn energy_from(
    meter: &Result<roofline_collectors::energy::Meter, String>,
    steps: usize,
) -> Energy {
    let reading = meter.as_ref().map_err(Clone::clone).and_then(|m| m.read());
    energy_of(&reading, steps, "over the measured steps")
}

/// `reading` with the GPU's NVML energy over `seconds` added
/// (`roofline_collectors::nvml::with_gpu_energy`), what it could not measure said on stderr.
pub(crate) fn with_gpu_energy(
    reading: Result<roofline_collectors::energy::Reading, String>,
    telemetry: Result<Vec<roofline_model::GpuTelemetry>, String>,
    seconds: f64,
) -> Result<roofline_collectors::energy::Reading, String> {
    let (r, note) = roofline_collectors::nvml::with_gpu_energy(reading, telemetry, seconds);
    if let Some(n) = note {
        eprintln!("note: {n}");
    }
    r
}

/// Energy per step from a reading over `steps` steps; `span` says what it covers in the note.
/// No reading, or counters that did not advance: not measured, and why.
pub(crate) fn energy_of(
    reading: &Result<roofline_collectors::energy::Reading, String>,
    steps: usize,
    span: &str,
) -> Energy {
    match reading {
        Ok(r) if r.joules > 0.0 && steps > 0 => Energy {
            measured: true,
            sources: r.sources.clone(),
            joules_per_step: Some(r.joules / steps as f64),
            average_watts: Some(r.joules / r.seconds.max(1e-12)),
            flops_per_watt: None,
            note: format!("energy {span} from {}", r.sources.join(", ")),
        },
        Ok(_) => Energy {
            note: "energy not measured: the energy counters did not advance; no per-watt figure is reported".into(),
            ..Default::default()
        },
        Err(e) => Energy {
            note: format!("energy not measured: {e}; no per-watt figure is reported"),
            ..Default::default()
        },
    }
}

/// A micro workload on the CPU kernels of the probe, with the probe's driver (warm-up, pinned
/// threads, result checks).
fn kernel(a: &PlaceArgs, w: &Workload) -> Result<Option<Measured>, Failure> {
    let cores = crate::probe_cmd::cores_for(a.run.threads)?.0;
    let threads = cores.len();
    let samples = a.run.steps.unwrap_or(10).max(1);
    let plan = Plan::new(samples, a.warm, 0.2);
    let pool = roofline_kernels::affinity::pinned_pool(&cores)
        .map_err(|e| Failure::Run(anyhow!("cannot start {threads} threads: {e}")))?;
    let meter = roofline_collectors::energy::Meter::start();
    let fail = |e: roofline_kernels::ProbeError| match e {
        roofline_kernels::ProbeError::Interrupted => Failure::Interrupted,
        e => Failure::Run(anyhow!("{e}")),
    };
    let (m, name, kind, description, precision, min_bytes, footprint): (
        Measurement,
        String,
        &str,
        String,
        String,
        f64,
        f64,
    ) = match w {
        Workload::Gemm(shape, prec) => {
            let m = pool
                .install(|| -> Result<Measurement, roofline_kernels::ProbeError> {
                    match prec.as_str() {
                        "f64" => measure_here(
                            &plan,
                            &CANCEL,
                            &mut GemmKernel::<f64>::new(*shape, threads)?,
                        ),
                        "f16" => measure_here(
                            &plan,
                            &CANCEL,
                            &mut GemmKernel::<half::f16>::new(*shape, threads)?,
                        ),
                        _ => measure_here(
                            &plan,
                            &CANCEL,
                            &mut GemmKernel::<f32>::new(*shape, threads)?,
                        ),
                    }
                })
                .map_err(fail)?;
            let size = match prec.as_str() {
                "f64" => 8.0,
                "f16" => 2.0,
                _ => 4.0,
            };
            let (mm, n, k) = (shape.m as f64, shape.n as f64, shape.k as f64);
            let bytes = size * (mm * k + k * n + mm * n);
            (
                m,
                format!("gemm:{}x{}x{}:{prec}", shape.m, shape.n, shape.k),
                "gemm",
                format!(
                    "C = A·B, {} (gemm crate, the probe's GEMM kernel), {threads} pinned threads; the analytic minimum traffic reads A and B and writes C once",
                    shape.describe()
                ),
                // f16 products are computed in f32 (see the probe's method).
                if prec == "f16" { "f32".to_string() } else { prec.clone() },
                bytes,
                bytes,
            )
        }
        Workload::Conv(sh) => {
            let m = pool
                .install(|| measure_here(&plan, &CANCEL, &mut ConvKernel::new(*sh, threads > 1)?))
                .map_err(fail)?;
            (
                m,
                format!(
                    "conv:{},{},{},{},{},{},{},{},{}",
                    sh.n, sh.c, sh.h, sh.w, sh.k, sh.r, sh.s, sh.stride, sh.pad
                ),
                "conv",
                format!(
                    "forward convolution {} (the probe's im2col + GEMM kernel), {threads} pinned threads",
                    sh.describe()
                ),
                "f32".into(),
                sh.min_bytes(),
                sh.min_bytes(),
            )
        }
        Workload::Stream(bytes) => {
            let per = bytes / threads;
            let llc = m_llc_bytes();
            let nt = *bytes > llc;
            let m = measure_threads(&cores, &plan, &CANCEL, |_| {
                StreamKernel::new(Op::Triad, per, nt)
            })
            .map_err(fail)?;
            let actual =
                (stream::elems_for(Op::Triad, per) * Op::Triad.bytes_per_elem() * threads) as f64;
            (
                m,
                format!("stream:{bytes}"),
                "stream",
                format!(
                    "triad a = b + q·c over {actual} bytes of f64 arrays, {threads} pinned threads{}; 2 FLOPs and 24 bytes per element",
                    if nt { ", non-temporal stores" } else { "" }
                ),
                "f64".into(),
                actual,
                actual,
            )
        }
        Workload::Training(_) => unreachable!("placed by training()"),
    };
    let steps = m.seconds.len();
    let step_seconds: Vec<f64> = m.seconds.iter().map(|s| s / m.iters as f64).collect();
    let total = step_seconds.iter().sum::<f64>() / steps.max(1) as f64;
    let energy = energy_from(&meter, steps * m.iters as usize);
    Ok(Some(Measured {
        info: WorkloadInfo {
            name,
            kind: kind.into(),
            description: format!(
                "{description}; every sample's result checked (max error {:.1e})",
                m.max_rel_error
            ),
            precision,
            device: "cpu".into(),
            threads,
            ranks: 1,
            nodes: 1,
            warm_steps: a.warm,
            measured_steps: steps,
            parameters: None,
            batch: None,
        },
        flops_per_step: m.ops_per_iter,
        step_seconds,
        min_bytes,
        footprint,
        coi: None,
        layers: Vec::new(),
        time: TimeBreakdown {
            total_s: total,
            compute_s: total,
            ..Default::default()
        },
        energy,
        spans: Vec::new(),
    }))
}

/// The last-level cache's total size (the stream workload streams past it with non-temporal
/// stores, as the probe's DRAM ceiling does).
fn m_llc_bytes() -> usize {
    let ident = roofline_collectors::cpu_ident();
    let cpu = roofline_collectors::cpu_info(&ident, 1);
    cpu.caches
        .iter()
        .map(|c| c.size_bytes as usize * c.instances.max(1))
        .max()
        .unwrap_or(32 << 20)
}

/// A training run (resnet50, ewa) on the embedded trainer: `warm` steps, then `--steps`
/// measured ones (default 5), with the timeline on for the per-layer times.
fn training(a: &PlaceArgs, workload: Kind) -> Result<Option<Measured>, Failure> {
    let measured = a.run.steps.unwrap_or(5).max(1);
    let mut prep = run_args::prepare(&a.run, workload)?;
    prep.for_measurement(a.warm + measured);
    let (reducer, root) = crate::ranks::reducer(prep.batch())?;
    let (ranks, nodes) = reducer.as_ref().map_or((1, 1), |r| (r.ranks(), r.nodes()));
    eprintln!(
        "placing {}: {} warm-up and {measured} measured training steps, batch {}, {} …",
        a.workload,
        a.warm,
        prep.batch(),
        prep.resolution
    );
    timeline::start();
    let meter_cell: std::sync::Mutex<Option<Result<roofline_collectors::energy::Meter, String>>> =
        std::sync::Mutex::new(None);
    let sampler_cell: SamplerCell = std::sync::Mutex::new(None);
    let monitor = WarmMonitor {
        warm: a.warm,
        meter: &meter_cell,
        gpu: (a.run.cuda()).then_some((&a.run, &sampler_cell)),
    };
    let result = run_args::execute(&prep, &monitor, reducer);
    let spans = timeline::stop();
    let (s, _) = result?;
    let meter = meter_cell
        .into_inner()
        .unwrap_or_else(|e| e.into_inner())
        .unwrap_or_else(|| Err("the measured steps did not start".into()));
    let mut reading = meter.as_ref().map_err(Clone::clone).and_then(|m| m.read());
    // On a GPU, its energy over the same steps (NVML) joins the CPU packages'.
    if let Some(sampler) = sampler_cell.into_inner().unwrap_or_else(|e| e.into_inner()) {
        let seconds = s
            .timing
            .iter()
            .filter(|t| t.step > a.warm)
            .map(|t| t.seconds)
            .sum();
        reading = with_gpu_energy(reading, sampler.map(|x| x.stop()), seconds);
    }
    let energy = energy_of(&reading, measured, "over the measured steps");
    if !root {
        return Ok(None);
    }
    from_training(
        &s,
        &prep,
        &a.run,
        &a.workload,
        (ranks, nodes),
        a.warm,
        spans,
        energy,
    )
    .map(Some)
}

/// A finished training run as a measurement: its steps after `warm`, the layers' times from
/// `spans` (none: no layer points), this rank's FLOPs and bytes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn from_training(
    s: &train::Summary,
    prep: &roofline_workloads::run::Prepared,
    run: &RunArgs,
    name: &str,
    (ranks, nodes): (usize, usize),
    warm: usize,
    spans: Vec<timeline::Span>,
    energy: Energy,
) -> Result<Measured, Failure> {
    let timing: Vec<_> = s.timing.iter().filter(|t| t.step > warm).collect();
    if timing.is_empty() {
        return Err(Failure::Run(anyhow!("no measured step finished")));
    }
    let n = timing.len() as f64;
    let mean = |f: &dyn Fn(&train::StepTiming) -> f64| timing.iter().map(|t| f(t)).sum::<f64>() / n;
    let total = mean(&|t| t.seconds);
    let data = mean(&|t| t.data_s);
    let comm = mean(&|t| t.comm_s);
    // The measured steps' window on the timeline.
    let window: Vec<(u64, u64)> = spans
        .iter()
        .filter(|sp| sp.cat == "step")
        .filter(|sp| {
            sp.name
                .strip_prefix("step ")
                .and_then(|k| k.parse::<usize>().ok())
                .is_some_and(|k| k > warm)
        })
        .map(|sp| (sp.start_ns, sp.start_ns + sp.dur_ns))
        .collect();
    let inside = |sp: &&timeline::Span| {
        window
            .iter()
            .any(|(a, b)| sp.start_ns >= *a && sp.start_ns < *b)
    };
    let measured_spans: Vec<timeline::Span> = spans.iter().filter(inside).cloned().collect();
    // Without a timeline, compute is what data and communication left (idle unknown: 0).
    let busy: f64 = if measured_spans.is_empty() {
        (total - comm - data).max(0.0)
    } else {
        measured_spans
            .iter()
            .filter(|sp| matches!(sp.cat, "forward" | "backward" | "optimizer"))
            .map(|sp| sp.dur_ns as f64 * 1e-9)
            .sum::<f64>()
            / n
    };
    let time = TimeBreakdown {
        total_s: total,
        compute_s: busy.min(total),
        communication_s: comm,
        data_s: data,
        idle_s: (total - busy - comm - data).max(0.0),
    };
    // Per layer: time over the measured steps, its FLOPs (AIPerf's rules, forward and
    // backward) and minimum bytes for this rank's batch.
    let local = (prep.batch() / ranks) as f64;
    let counted = prep.layers();
    let mut layers = Vec::new();
    let mut per_layer: Vec<(String, f64)> = timeline::totals(&measured_spans, "forward");
    for (name, t) in timeline::totals(&measured_spans, "backward") {
        match per_layer.iter_mut().find(|(n, _)| *n == name) {
            Some((_, x)) => *x += t,
            None => per_layer.push((name, t)),
        }
    }
    for (name, t) in per_layer {
        let ls = accounting::span_layers(&counted, &name);
        if ls.is_empty() {
            continue;
        }
        let owned: Vec<_> = ls.iter().map(|l| (*l).clone()).collect();
        let flops = accounting::aiperf(&owned).total() * local;
        let bytes: f64 = ls
            .iter()
            .map(|l| accounting::min_bytes_training(l))
            .sum::<f64>()
            * local;
        let footprint: f64 = ls
            .iter()
            .map(|l| 4.0 * (local * (l.inputs + l.outputs) + 3.0 * l.params))
            .sum();
        layers.push((name, t / n, flops, bytes, footprint));
    }
    let flops_per_step = s.flops_step_per_image * local;
    let min_bytes = counted
        .iter()
        .map(accounting::min_bytes_training)
        .sum::<f64>()
        * local;
    let footprint: f64 = counted
        .iter()
        .map(|l| 4.0 * (local * l.outputs + 3.0 * l.params))
        .sum();
    let coi = (ranks > 1 && s.comm_bytes_per_step > 0.0).then(|| {
        let b = s.comm_bytes_per_step;
        if nodes > 1 {
            Coi {
                intra_node_bytes: 0.0,
                inter_node_bytes: b,
                intra_node: None,
                inter_node: Some(flops_per_step / b),
            }
        } else {
            Coi {
                intra_node_bytes: b,
                inter_node_bytes: 0.0,
                intra_node: Some(flops_per_step / b),
                inter_node: None,
            }
        }
    });
    Ok(Measured {
        info: WorkloadInfo {
            name: name.to_string(),
            kind: "training".into(),
            description: format!(
                "{} training on {}, {}, SGD; FLOPs per step: {} per image (forward, backward) × {} images on this rank",
                prep.model_name(),
                prep.data_name(),
                prep.resolution,
                roofline_plots::si(s.flops_step_per_image),
                local
            ),
            // On a GPU: the trainer's precision, and the GPU this (the root) rank trained on.
            precision: if run.cuda() {
                run.precision.to_string()
            } else {
                "f32".into()
            },
            device: if run.cuda() {
                format!("gpu{}", run.gpu.unwrap_or(0))
            } else {
                "cpu".into()
            },
            threads: prep.threads,
            ranks,
            nodes,
            warm_steps: warm,
            measured_steps: timing.len(),
            parameters: Some(s.parameters),
            batch: Some(prep.batch()),
        },
        flops_per_step,
        step_seconds: timing.iter().map(|t| t.seconds).collect(),
        min_bytes,
        footprint,
        coi,
        layers,
        time,
        energy,
        spans: measured_spans,
    })
}

use roofline_workloads::train;

/// A GPU's NVML sampler, once started.
type SamplerCell = std::sync::Mutex<Option<Result<roofline_collectors::nvml::Sampler, String>>>;

/// Starts the energy meter (and on a GPU its NVML sampler) when the warm-up steps are done.
struct WarmMonitor<'a> {
    warm: usize,
    meter: &'a std::sync::Mutex<Option<Result<roofline_collectors::energy::Meter, String>>>,
    gpu: Option<(&'a RunArgs, &'a SamplerCell)>,
}

impl train::Monitor for WarmMonitor<'_> {
    fn step(&self, step: usize, steps: usize, loss: f64, ips: f64) {
        if step == self.warm || (self.warm == 0 && step == 1) {
            *self.meter.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(roofline_collectors::energy::Meter::start());
            if let Some((run, cell)) = self.gpu {
                *cell.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(crate::score_cmd::gpu_sampler(run));
            }
        }
        eprintln!("  step {step}/{steps}: loss {loss:.4}, {ips:.2} images/s");
    }
}

/// The placement as a table on stdout.
fn report(p: &Placement) {
    use roofline_plots::si;
    let pt = &p.point;
    println!(
        "{} on {} ({} threads{}): {}FLOP/s (best of {} steps; median {}FLOP/s), {}FLOP per step",
        p.workload.name,
        p.machine.cpu,
        p.workload.threads,
        if p.workload.ranks > 1 {
            format!(", {} ranks", p.workload.ranks)
        } else {
            String::new()
        },
        si(pt.achieved_flops),
        pt.achieved.samples,
        si(pt.achieved.median),
        si(pt.flops_per_step)
    );
    println!(
        "  OI {:.3} FLOP/B (analytic minimum traffic {}B){}",
        pt.oi.analytic,
        si(pt.oi.analytic_min_bytes),
        pt.coi
            .as_ref()
            .map(|c| format!(
                ", COI {:.1} FLOP/B ({}B communicated per step)",
                c.intra_node.or(c.inter_node).unwrap_or(0.0),
                si(c.intra_node_bytes + c.inter_node_bytes)
            ))
            .unwrap_or_default()
    );
    println!(
        "  {} under {}: attainable {}FLOP/s, achieved {:.0}% of it",
        pt.bound.kind.as_str(),
        pt.bound.ceiling,
        si(pt.bound.attainable),
        100.0 / pt.bound.headroom
    );
    let t = &p.time;
    if p.workload.kind == "training" {
        println!(
            "  per step {:.3} s: compute {:.3}, communication {:.3}, data {:.3}, idle {:.3}",
            t.total_s, t.compute_s, t.communication_s, t.data_s, t.idle_s
        );
    }
    if !p.layers.is_empty() {
        println!(
            "  {:<28} {:>8} {:>12} {:>9}  bound",
            "top layers", "share", "FLOP/s", "OI"
        );
        for l in &p.layers {
            println!(
                "  {:<28} {:>7.1}% {:>12} {:>9.2}  {} ({:.0}% of {})",
                l.label,
                100.0 * l.share_of_step.unwrap_or(0.0),
                si(l.achieved_flops),
                l.oi.analytic,
                l.bound.kind.as_str(),
                100.0 / l.bound.headroom,
                l.bound.ceiling
            );
        }
    }
    println!("  {}", p.energy.note);
    for a in &p.advice {
        println!("  advice ({}): {}", a.topic, a.text);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workloads_parse_with_clear_errors() {
        assert_eq!(
            parse_workload("resnet50").unwrap(),
            Workload::Training(Kind::Resnet50)
        );
        assert_eq!(
            parse_workload("ewa").unwrap(),
            Workload::Training(Kind::Ewa)
        );
        assert_eq!(
            parse_workload("gemm:64x32x16").unwrap(),
            Workload::Gemm(
                Shape {
                    m: 64,
                    n: 32,
                    k: 16
                },
                "f32".into()
            )
        );
        assert!(
            matches!(parse_workload("gemm:8x8x8:f64").unwrap(), Workload::Gemm(_, p) if p == "f64")
        );
        assert!(parse_workload("gemm:8x8").unwrap_err().contains("MxNxK"));
        assert!(parse_workload("gemm:8x8x8:int4")
            .unwrap_err()
            .contains("precision"));
        let Workload::Conv(c) = parse_workload("conv:2,64,56,56,64,3,3,1,1").unwrap() else {
            panic!()
        };
        assert_eq!((c.n, c.c, c.k, c.r, c.stride, c.pad), (2, 64, 64, 3, 1, 1));
        assert!(parse_workload("conv:1,3,4,4,8,7,7,1,0")
            .unwrap_err()
            .contains("fit"));
        assert_eq!(
            parse_workload("stream:1_073_741_824").unwrap(),
            Workload::Stream(1 << 30)
        );
        assert!(parse_workload("stream:0").unwrap_err().contains("positive"));
        assert!(parse_workload("bert").unwrap_err().contains("expected"));
    }
}
