//! The micro workloads `roofline place` puts on the roofline beside the training runs: one GEMM,
//! one convolution or one STREAM triad, run on the probe's own kernels with the probe's driver
//! (warm-up, pinned threads, every sample's result checked).

use crate::cpu::conv::{ConvKernel, ConvShape};
use crate::cpu::gemm::{GemmKernel, Shape};
use crate::cpu::stream::{self, Op, StreamKernel};
use crate::driver::{measure_here, measure_threads, Measurement, Plan};
use crate::ProbeError;
use roofline_model::placement::{Measured, TimeBreakdown, WorkloadInfo};
use roofline_model::Precision;
use std::sync::atomic::AtomicBool;

/// A micro workload, as `--workload` names it.
#[derive(Clone, Debug, PartialEq)]
pub enum Micro {
    /// `gemm:MxNxK[:f32|f64|f16]`.
    Gemm(Shape, Precision),
    /// `conv:N,C,H,W,K,R,S,stride,pad` (f32 forward, NHWC).
    Conv(ConvShape),
    /// `stream:BYTES`: a triad over BYTES of arrays.
    Stream(usize),
}

impl Micro {
    /// Parses `w` (`gemm:…`, `conv:…`, `stream:…`); the error names what was expected.
    pub fn parse(w: &str) -> Result<Micro, String> {
        let bad = |what: &str| format!("--workload {w}: {what}");
        let num = |s: &str| -> Result<usize, String> {
            s.trim()
                .replace('_', "")
                .parse::<usize>()
                .ok()
                .filter(|v| *v > 0)
                .ok_or_else(|| bad(&format!("{s:?} is not a positive whole number")))
        };
        let (kind, rest) = w.split_once(':').ok_or_else(|| {
            bad("expected resnet50, ewa, gemm:MxNxK[:precision], conv:N,C,H,W,K,R,S,stride,pad or stream:BYTES")
        })?;
        match kind {
            "gemm" => {
                let (dims, prec) = rest.split_once(':').unwrap_or((rest, "f32"));
                let prec = match prec {
                    "f32" => Precision::F32,
                    "f64" => Precision::F64,
                    "f16" => Precision::F16,
                    p => return Err(bad(&format!("precision {p}: f32, f64 or f16"))),
                };
                let d: Vec<usize> = dims.split('x').map(num).collect::<Result<_, _>>()?;
                let [m, n, k] = d[..] else {
                    return Err(bad("expected three sizes, MxNxK"));
                };
                Ok(Micro::Gemm(Shape { m, n, k }, prec))
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
                    return Err(bad("expected N,C,H,W,K,R,S,stride,pad"));
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
                Ok(Micro::Conv(sh))
            }
            "stream" => {
                let b = num(rest)?;
                if b < 3 * 64 * 8 {
                    return Err(bad("at least 1536 bytes (three arrays of 64 doubles)"));
                }
                Ok(Micro::Stream(b))
            }
            _ => Err(bad(&format!(
                "unknown kind {kind:?}: resnet50, ewa, gemm:…, conv:… or stream:…"
            ))),
        }
    }

    /// The memory it needs at the least (its arrays: A, B and C; the convolution's input,
    /// filter and output; the triad's three arrays), to refuse a size that cannot fit before
    /// anything is allocated.
    pub fn memory_bytes(&self) -> f64 {
        match self {
            Micro::Gemm(s, prec) => {
                let (m, n, k) = (s.m as f64, s.n as f64, s.k as f64);
                prec.bytes() as f64 * (m * k + k * n + m * n)
            }
            Micro::Conv(sh) => sh.min_bytes(),
            Micro::Stream(bytes) => *bytes as f64,
        }
    }

    /// Runs it on `cores` (one pinned thread each): `warm` samples, then `samples` measured;
    /// `llc_bytes` (the last-level cache) decides whether a triad streams past it with
    /// non-temporal stores, as the probe's DRAM ceiling does. Returns the measurement (its
    /// energy is the caller's) and the timed iterations in all (to share the energy out).
    pub fn measure(
        &self,
        cores: &[usize],
        samples: usize,
        warm: usize,
        llc_bytes: usize,
        cancel: &AtomicBool,
    ) -> Result<(Measured, usize), ProbeError> {
        let threads = cores.len();
        let plan = Plan::new(samples.max(1), warm, 0.2);
        let pool = crate::affinity::pinned_pool(cores).map_err(ProbeError::Threads)?;
        let (m, name, kind, description, precision, min_bytes): (
            Measurement,
            String,
            &str,
            String,
            Precision,
            f64,
        ) = match self {
            Micro::Gemm(shape, prec) => {
                let m = pool.install(|| -> Result<Measurement, ProbeError> {
                    match prec {
                        Precision::F64 => measure_here(
                            &plan,
                            cancel,
                            &mut GemmKernel::<f64>::new(*shape, threads)?,
                        ),
                        Precision::F16 => measure_here(
                            &plan,
                            cancel,
                            &mut GemmKernel::<half::f16>::new(*shape, threads)?,
                        ),
                        _ => measure_here(
                            &plan,
                            cancel,
                            &mut GemmKernel::<f32>::new(*shape, threads)?,
                        ),
                    }
                })?;
                let (mm, n, k) = (shape.m as f64, shape.n as f64, shape.k as f64);
                let bytes = prec.bytes() as f64 * (mm * k + k * n + mm * n);
                (
                    m,
                    format!("gemm:{}x{}x{}:{prec}", shape.m, shape.n, shape.k),
                    "gemm",
                    format!(
                        "C = A·B, {} (gemm crate, the probe's GEMM kernel), {} pinned; the analytic minimum traffic reads A and B and writes C once",
                        shape.describe(),
                        roofline_model::count(threads, "thread")
                    ),
                    // f16 products are computed in f32 (see the probe's method).
                    if *prec == Precision::F16 {
                        Precision::F32
                    } else {
                        *prec
                    },
                    bytes,
                )
            }
            Micro::Conv(sh) => {
                let m = pool.install(|| {
                    measure_here(&plan, cancel, &mut ConvKernel::new(*sh, threads > 1)?)
                })?;
                (
                    m,
                    format!(
                        "conv:{},{},{},{},{},{},{},{},{}",
                        sh.n, sh.c, sh.h, sh.w, sh.k, sh.r, sh.s, sh.stride, sh.pad
                    ),
                    "conv",
                    format!(
                        "forward convolution {} (the probe's im2col + GEMM kernel), {} pinned",
                        sh.describe(),
                        roofline_model::count(threads, "thread")
                    ),
                    Precision::F32,
                    sh.min_bytes(),
                )
            }
            Micro::Stream(bytes) => {
                let per = bytes / threads;
                let nt = *bytes > llc_bytes;
                let m = measure_threads(cores, &plan, cancel, |_| {
                    StreamKernel::new(Op::Triad, per, nt)
                })?;
                let actual = (stream::elems_for(Op::Triad, per)
                    * stream::bytes_per_elem(Op::Triad)
                    * threads) as f64;
                (
                    m,
                    format!("stream:{bytes}"),
                    "stream",
                    format!(
                        "triad a = b + q·c over {actual} bytes of f64 arrays, {} pinned{}; 2 FLOPs and 24 bytes per element",
                        roofline_model::count(threads, "thread"),
                        if nt { ", non-temporal stores" } else { "" }
                    ),
                    Precision::F64,
                    actual,
                )
            }
        };
        let steps = m.seconds.len();
        let step_seconds: Vec<f64> = m.seconds.iter().map(|s| s / m.iters as f64).collect();
        let total = step_seconds.iter().sum::<f64>() / steps.max(1) as f64;
        let measured = Measured {
            info: WorkloadInfo {
                name,
                kind: kind.into(),
                description: format!(
                    "{description}; every sample's result checked (max error {:.1e})",
                    m.max_rel_error
                ),
                precision: precision.to_string(),
                device: "cpu".into(),
                threads,
                ranks: 1,
                nodes: 1,
                warm_steps: warm,
                measured_steps: steps,
                parameters: None,
                batch: None,
            },
            flops_per_step: m.ops_per_iter,
            step_seconds,
            min_bytes,
            footprint: min_bytes,
            coi: None,
            layers: Vec::new(),
            time: TimeBreakdown {
                total_s: total,
                compute_s: total,
                ..Default::default()
            },
            energy: Default::default(),
        };
        Ok((measured, steps * m.iters as usize))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn micro_workloads_parse_with_clear_errors() {
        assert_eq!(
            Micro::parse("gemm:64x32x16").unwrap(),
            Micro::Gemm(
                Shape {
                    m: 64,
                    n: 32,
                    k: 16
                },
                Precision::F32
            )
        );
        assert!(
            matches!(Micro::parse("gemm:8x8x8:f64").unwrap(), Micro::Gemm(_, p) if p == Precision::F64)
        );
        assert!(Micro::parse("gemm:8x8").unwrap_err().contains("MxNxK"));
        assert!(Micro::parse("gemm:8x8x8:int4")
            .unwrap_err()
            .contains("precision"));
        let Micro::Conv(c) = Micro::parse("conv:2,64,56,56,64,3,3,1,1").unwrap() else {
            panic!()
        };
        assert_eq!((c.n, c.c, c.k, c.r, c.stride, c.pad), (2, 64, 64, 3, 1, 1));
        assert!(Micro::parse("conv:1,3,4,4,8,7,7,1,0")
            .unwrap_err()
            .contains("fit"));
        assert_eq!(
            Micro::parse("stream:1_073_741_824").unwrap(),
            Micro::Stream(1 << 30)
        );
        assert!(Micro::parse("stream:0").unwrap_err().contains("positive"));
        assert!(Micro::parse("bert").unwrap_err().contains("expected"));
    }

    /// A small GEMM measured and checked: its FLOPs per step are 2·m·n·k, its bytes A, B and C.
    #[test]
    fn a_small_gemm_is_measured_with_its_analytic_counts() {
        let cpus = crate::affinity::allowed_cpus();
        let (m, iterations) = Micro::Gemm(
            Shape {
                m: 64,
                n: 48,
                k: 32,
            },
            Precision::F64,
        )
        .measure(&cpus[..1], 3, 1, 1 << 20, &AtomicBool::new(false))
        .unwrap();
        assert!(iterations >= m.step_seconds.len());
        assert_eq!(m.flops_per_step, 2.0 * 64.0 * 48.0 * 32.0);
        assert_eq!(m.min_bytes, 8.0 * (64.0 * 32.0 + 32.0 * 48.0 + 64.0 * 48.0));
        assert_eq!(m.step_seconds.len(), m.info.measured_steps);
        assert!(m.step_seconds.iter().all(|s| *s > 0.0));
        assert_eq!(
            (m.info.kind.as_str(), m.info.precision.as_str()),
            ("gemm", "f64")
        );
    }
}
