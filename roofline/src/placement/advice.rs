//! Advice in the manner of HPC AI500 V2.0 section 7.5: what bounds a placed workload, and what
//! to do about it.

use super::{Advice, BoundKind, Point, TimeBreakdown, WorkloadInfo};
use crate::machine::{CeilingKind, Machine};

/// Advice in the manner of HPC AI500 V2.0 section 7.5 for a placed workload and its layers.
pub fn advise(
    w: &WorkloadInfo,
    p: &Point,
    layers: &[Point],
    time: &TimeBreakdown,
    m: &Machine,
) -> Vec<Advice> {
    let mut out = Vec::new();
    let mut say = |topic: &str, text: String| {
        out.push(Advice {
            topic: topic.into(),
            text,
        })
    };
    let pct = |x: f64| format!("{:.0}%", 100.0 * x);
    let of_roof = 1.0 / p.bound.headroom.max(1e-12);
    match p.bound.kind {
        BoundKind::Communication => say(
            "communication",
            format!(
                "communication-bound under {} ({} of what it allows at COI {}): compress gradients to fp16 for the wire (--grad-compression fp16 halves the bytes, doubling COI), fuse them into larger buckets (--bucket-elements), and overlap the allreduce with the backward pass (the default; check comm_wait)",
                p.bound.ceiling,
                pct(of_roof),
                p.coi
                    .as_ref()
                    .and_then(|c| c.inter_node.or(c.intra_node))
                    .map(|v| format!("{v:.1} FLOP/B"))
                    .unwrap_or_default()
            ),
        ),
        BoundKind::Memory => say(
            "memory",
            format!(
                "memory-bound under {} at OI {:.2} FLOP/B ({} of what it allows): the work moves more bytes than the machine can feed at its compute rate; raise the intensity (block for cache, fuse passes over the same data, keep operands in a narrower type)",
                p.bound.ceiling,
                p.oi.analytic,
                pct(of_roof)
            ),
        ),
        BoundKind::Compute => {
            let gemm = p
                .bound
                .roofs
                .iter()
                .find(|r| r.ceiling.contains("/gemm/"))
                .map(|r| r.value);
            let frac = gemm.map(|g| p.achieved_flops / g);
            // A faster precision on the same device (cpu/…, gpuN/…) as the binding roof.
            let device = p.bound.ceiling.split('/').next().unwrap_or("cpu");
            let mixed = ["bf16", "f16"]
                .iter()
                .filter(|q| **q != w.precision)
                .find_map(|q| {
                    m.ceilings
                        .iter()
                        .find(|c| {
                            c.kind == CeilingKind::Compute
                                && c.id.to_string().split('/').next() == Some(device)
                                && c.precision.map(|p| p.name()) == Some(q)
                                && gemm.is_some_and(|g| c.value > g * 1.2)
                        })
                        .map(|c| c.id.clone())
                });
            let mut text = format!(
                "compute-bound under {} ({} of it)",
                p.bound.ceiling,
                pct(of_roof)
            );
            if let Some(f) = frac {
                text += &format!(", {} of the GEMM ceiling", pct(f));
            }
            if w.kind == "training" {
                // The COI only where gradients cross between ranks: one process communicates
                // nothing, and a batch cannot change that.
                let batch = if w.ranks > 1 {
                    "a larger batch raises both the GEMM efficiency and the COI"
                } else {
                    "a larger batch raises the GEMM efficiency"
                };
                match &mixed {
                    Some(id) => {
                        text += &format!(
                            ": train in mixed precision (a higher ceiling exists on this machine: {id}); {batch}"
                        );
                    }
                    None if ["bf16", "f16"].contains(&w.precision.as_str()) => {
                        text += &format!(": {batch}");
                    }
                    None => {
                        text += &format!(": {batch}; mixed precision (bf16/f16 with f32 master weights) raises the ceiling where the hardware has faster 16-bit arithmetic");
                    }
                }
            } else if frac.is_some_and(|f| f < 0.7) {
                text += ": the shape is far under the GEMM ceiling; larger or better-blocked operands would run closer to it";
            }
            say("compute", text);
        }
    }
    let mem_layers: Vec<&Point> = layers
        .iter()
        .filter(|l| l.bound.kind == BoundKind::Memory)
        .collect();
    if !mem_layers.is_empty() {
        let share: f64 = mem_layers.iter().filter_map(|l| l.share_of_step).sum();
        say(
            "memory",
            format!(
                "memory-bound layers ({} of the step among the top layers): {} — fuse them with their neighbours (batch norm + ReLU + residual add in one pass) or keep their activations in 16 bits",
                pct(share),
                mem_layers
                    .iter()
                    .map(|l| format!("{} (OI {:.2})", l.label, l.oi.analytic))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        );
    }
    if time.total_s > 0.0 {
        if time.data_s / time.total_s > 0.1 {
            say(
                "data",
                format!(
                    "{} of each step waits for data: decode on more threads, prefetch further ahead, or read from faster storage",
                    pct(time.data_s / time.total_s)
                ),
            );
        }
        if time.communication_s / time.total_s > 0.1 && p.bound.kind != BoundKind::Communication {
            say(
                "communication",
                format!(
                    "{} of each step waits for gradient sums the backward pass did not hide: larger buckets, fp16 compression, or more overlap",
                    pct(time.communication_s / time.total_s)
                ),
            );
        }
        if time.idle_s / time.total_s > 0.1 {
            say(
                "idle",
                format!(
                    "{} of each step is idle (neither compute, communication nor data): look at the trace (--trace) for gaps",
                    pct(time.idle_s / time.total_s)
                ),
            );
        }
    }
    if p.bound.headroom < 0.9 {
        say(
            "measurement",
            format!(
                "the point is {} above its lowest roof {}: that ceiling was under-measured (re-run `roofline probe`), or the analytic byte count is too low",
                pct(1.0 / p.bound.headroom - 1.0),
                p.bound.ceiling
            ),
        );
    }
    out
}
