//! A training run measured for `roofline place`: the steps after the warm-up, each top layer's
//! time from the timeline, this rank's FLOPs and analytic bytes by the accounting's rules.

use super::prepare::{Device, Prepared};
use super::RunError;
use crate::accounting;
use crate::train::{StepTiming, Summary};
use roofline_collectors::timeline::{self, Span};
use roofline_model::placement::{
    Coi, Energy, LayerConv, LayerTime, Measured, TimeBreakdown, WorkloadInfo,
};
use roofline_model::si;

/// What a layer computed by Winograd's F(4×4, 3×3) (f32) says of its FLOPs.
const WINOGRAD_NOTE: &str = "Winograd F(4×4, 3×3): the FLOPs counted are the direct convolution's, computed with up to 4× fewer multiplies (and the transforms), so the rate may pass the FMA and GEMM roofs";

/// What a layer computed by Winograd's F(2×2, 3×3) (bf16) says of its FLOPs.
const WINOGRAD_BF16_NOTE: &str = "Winograd F(2×2, 3×3) in bf16 (forward and input gradient; the filter gradient too with 128 channels or more): the FLOPs counted are the direct convolution's, computed with up to 2.25× fewer multiplies (and the transforms), so the rate may pass the FMA and GEMM roofs";

/// What a GPU layer whose cuDNN algorithm is Winograd's or an FFT (in some direction) says of
/// its FLOPs.
const CUDNN_FAST_NOTE: &str = "cuDNN runs a Winograd or FFT algorithm in some direction: the FLOPs counted are the direct convolution's, computed with fewer multiplies, so the rate may pass the GEMM and tensor-core roofs";

/// Which Winograd algorithm the run's 3×3 stride-1 convolutions went through, if any: on the
/// CPU (`conv::winograd_enabled`), F(4×4, 3×3) in f32, F(2×2, 3×3) in bf16 without AMX on the
/// images it covers well (`conv::winograd::half::{pays_with, applies_to}`; the products' path
/// is the one `train` detects).
fn winograd_ran(prep: &Prepared, size: (usize, usize)) -> Option<&'static str> {
    if prep.spec.device != Device::Cpu || !crate::conv::winograd_enabled() {
        return None;
    }
    match prep.spec.precision {
        roofline_model::Precision::F32 => Some(WINOGRAD_NOTE),
        roofline_model::Precision::Bf16
            if crate::conv::winograd::half::applies_to(size.0, size.1)
                && roofline_kernels::cpu::bf16::Bf16Gemm::detect()
                    .is_ok_and(|g| crate::conv::winograd::half::pays_with(g.path())) =>
        {
            Some(WINOGRAD_BF16_NOTE)
        }
        _ => None,
    }
}

/// A finished training run as a measurement: its steps after `warm`, the layers' times from
/// `spans` (none: no layer points), this rank's FLOPs and bytes.
/// Also returns the measured steps' spans (for `--trace`).
pub fn measured(
    s: &Summary,
    prep: &Prepared,
    (ranks, nodes): (usize, usize),
    warm: usize,
    spans: &[Span],
    energy: Energy,
) -> Result<(Measured, Vec<Span>), RunError> {
    let timing: Vec<_> = s.timing.iter().filter(|t| t.step > warm).collect();
    if timing.is_empty() {
        return Err(RunError::Run("no measured step finished".into()));
    }
    let n = timing.len() as f64;
    let mean = |f: &dyn Fn(&StepTiming) -> f64| timing.iter().map(|t| f(t)).sum::<f64>() / n;
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
    let inside = |sp: &&Span| {
        window
            .iter()
            .any(|(a, b)| sp.start_ns >= *a && sp.start_ns < *b)
    };
    let measured_spans: Vec<Span> = spans.iter().filter(inside).cloned().collect();
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
    // On a GPU, the batch's copies to the device are data too (the host's wait for its
    // batch is `data_s`).
    let uploads = measured_spans
        .iter()
        .filter(|sp| sp.cat == crate::gpu::UPLOAD)
        .map(|sp| sp.dur_ns as f64 * 1e-9)
        .sum::<f64>()
        / n;
    let data = data + uploads;
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
    let algorithms = crate::gpu::conv_algorithms();
    let mut layers = Vec::new();
    let mut per_layer: Vec<(String, f64)> = timeline::totals(&measured_spans, "forward");
    for (name, t) in timeline::totals(&measured_spans, "backward") {
        match per_layer.iter_mut().find(|(n, _)| *n == name) {
            Some((_, x)) => *x += t,
            None => per_layer.push((name, t)),
        }
    }
    // Each measured step's own time per layer: the samples behind the layer's figure.
    let per_step: Vec<Vec<(String, f64)>> = window
        .iter()
        .map(|(a, b)| {
            let step: Vec<Span> = measured_spans
                .iter()
                .filter(|sp| sp.start_ns >= *a && sp.start_ns < *b)
                .cloned()
                .collect();
            let mut t = timeline::totals(&step, "forward");
            t.extend(timeline::totals(&step, "backward"));
            t
        })
        .collect();
    for (name, t) in per_layer {
        let step_seconds: Vec<f64> = per_step
            .iter()
            .map(|st| st.iter().filter(|(n, _)| *n == name).map(|(_, x)| x).sum())
            .collect();
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
        // The model's convolutions are padded by kernel / 2 (their output size is their
        // input's where Winograd's algorithm applies: stride 1).
        let winograd = ls.iter().find_map(|l| match l.kind {
            accounting::Kind::Conv { kernel, stride, .. }
                if crate::conv::winograd::applies_to(kernel, stride, kernel / 2) =>
            {
                winograd_ran(prep, l.size)
            }
            _ => None,
        });
        let algorithm = algorithms
            .iter()
            .find(|(span, _)| *span == name)
            .map(|(_, a)| format!("cuDNN: {a}"));
        // cuDNN's Winograd and FFT algorithms do fewer multiplies than the FLOPs counted.
        let fast = algorithm
            .as_deref()
            .is_some_and(|a| a.contains("WINOGRAD") || a.contains("_FFT"));
        let fast_note = winograd.or(fast.then_some(CUDNN_FAST_NOTE));
        // One convolution (with its batch norm and activation, which carry no FLOPs): the
        // shape the probe's tables name, for the layer's own measured roof.
        let convs: Vec<_> = ls
            .iter()
            .filter_map(|l| Some((accounting::conv_shape(l, local as usize)?, l.kind)))
            .collect();
        let conv = match convs.as_slice() {
            [(shape, accounting::Kind::Conv { first, .. })] => Some(LayerConv {
                shape: shape.describe(),
                first: *first,
            }),
            _ => None,
        };
        layers.push(LayerTime {
            conv,
            name,
            seconds: t / n,
            step_seconds,
            flops,
            min_bytes: bytes,
            footprint,
            note: fast_note.map(str::to_string),
            algorithm,
        });
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
    // Bus bytes (payload × 2(n−1)/n), as the allreduce roofs count busbw.
    let coi = Coi::allreduce(flops_per_step, s.comm_bytes_per_step, ranks, nodes);
    let cuda = prep.spec.device == Device::Cuda;
    let measured = Measured {
        info: WorkloadInfo {
            name: prep.workload_name(),
            kind: "training".into(),
            description: format!(
                "{} training on {}, {}, SGD; FLOPs per step: {} per image (forward, backward) × {} images on this rank",
                prep.model_name(),
                prep.data_name(),
                prep.resolution,
                si(s.flops_step_per_image),
                local
            ),
            // The trainer's precision (the CPU's: f32 or bf16), and the GPU this (the root)
            // rank trained on.
            precision: prep.spec.precision.to_string(),
            device: if cuda {
                format!("gpu{}", prep.spec.gpu.unwrap_or(0))
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
    };
    Ok((measured, measured_spans))
}

/// Places `r` on `m` (read from `path`), where and when it ran said by this host's provenance
/// (`start`: when the run began).
pub fn assemble(
    m: &roofline_model::Machine,
    path: &std::path::Path,
    r: Measured,
    top: usize,
    start: std::time::Instant,
) -> Result<roofline_model::placement::Placement, RunError> {
    use roofline_model::placement::PlaceError;
    let cpu = roofline_kernels::probe::node::cpu_here(m.provenance.cpu.cores);
    let provenance = roofline_collectors::provenance::here(cpu, false, start);
    roofline_model::placement::assemble(m, path, r, top, provenance).map_err(|e| match e {
        PlaceError::NoRoof { .. } => RunError::Input(e.to_string()),
        e => RunError::Run(e.to_string()),
    })
}
