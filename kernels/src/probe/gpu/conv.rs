//! Convolution ceilings through cuDNN (`cuda::dnn`) over ResNet-50 v1.5's layer shapes at the
//! trainer's batch ([`CONV_BATCH`], the quick probe's as the full one's: fewer samples, not a
//! smaller batch): forward, backward-data and backward-filter, f32 / tf32 / f16 / bf16, NHWC
//! tensors and KRSC filters, f32 accumulation. The algorithm is the one cuDNN measures fastest
//! on the layer's operands (`dnn::find`, `cudnnFind*AlgorithmEx`, as the trainer's plans
//! choose) and is recorded per row. Every result is checked on a sample of entries against f64
//! sums on the CPU. The operands are counter-based ([`Operand`]): element `i` is a function of
//! the seed and `i`, written once per precision (in parallel) for the upload and computed
//! again for the reference, so that no f64 copy of a batch-128 tensor is kept on the host.

use super::gemm::{encode, Rng};
use super::{Mode, SectionResult};
use crate::cpu::conv::{resnet50_layers, ConvShape};
use crate::cuda::blas::{not_supported, GemmPrec, Prec};
use crate::cuda::device::{DevBuf, Events, Gpu};
use crate::cuda::dnn::{
    choose, descs, execute, find, Algo, Descs, Dir, Handle, DIRECTIONS, WORKSPACE_LIMIT,
};
use crate::cuda::CudaError;
use roofline_model::ceiling_id::{TableId, TableRows};
use roofline_model::conditions::SampleConditions;
use roofline_model::machine::Choice;
use roofline_model::{
    Ceiling, CeilingKind, Family, PeakDb, PerIteration, Stats, Table, TableRow, TheoreticalPeak,
};
use std::sync::atomic::{AtomicBool, Ordering};

const PRECISIONS: [Prec; 4] = [Prec::F32, Prec::Tf32, Prec::F16, Prec::Bf16];

/// The batch the convolutions run at: the trainer's ResNet-50 batch, in the quick probe as in
/// the full one.
pub const CONV_BATCH: usize = 128;

/// One operand's values: element `i` is `Rng`'s value of precision `p` seeded by `seed` and
/// `i` (exact in `p`, never zero).
#[derive(Clone, Copy)]
struct Operand {
    seed: u64,
    p: Prec,
}

impl Operand {
    fn at(&self, i: usize) -> f64 {
        // SplitMix64 of (seed, i): a nonzero state for the generator.
        let mut z = self.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(z | 1).value(self.p)
    }

    /// The `n` elements encoded in `p`, made in parallel chunks.
    fn bytes(&self, n: usize) -> Vec<u8> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 20;
        let chunks: Vec<Vec<u8>> = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let v: Vec<f64> = (c * CHUNK..((c + 1) * CHUNK).min(n))
                    .map(|i| self.at(i))
                    .collect();
                encode(self.p, &v)
            })
            .collect();
        chunks.concat()
    }
}

struct Tensors {
    x: DevBuf,
    w: DevBuf,
    y: DevBuf,
    hx: Operand,
    hw: Operand,
    hdy: Operand,
    dy: DevBuf,
}

fn run_once(h: &Handle, d: &Descs, t: &Tensors, algo: Algo, ws: &DevBuf) -> Result<(), CudaError> {
    let dir = match algo {
        Algo::Fwd(_) => Dir::Fwd,
        Algo::BwdData(_) => Dir::BwdData,
        Algo::BwdFilter(_) => Dir::BwdFilter,
    };
    execute(h, d, algo, operands(t, dir), (ws.ptr, ws.bytes))
}

/// A direction's operands as `execute` and `find` take them; the output buffer `y` holds the
/// largest of y, dx and dw.
fn operands(t: &Tensors, dir: Dir) -> [u64; 3] {
    match dir {
        Dir::Fwd => [t.x.ptr, t.w.ptr, t.y.ptr],
        Dir::BwdData => [t.w.ptr, t.dy.ptr, t.y.ptr],
        Dir::BwdFilter => [t.x.ptr, t.dy.ptr, t.y.ptr],
    }
}

/// Output element count of a direction: y (fwd), dx (bwd_data), dw (bwd_filter).
fn out_len(s: &ConvShape, dir: Dir) -> usize {
    match dir {
        Dir::Fwd => s.n * s.oh() * s.ow() * s.k,
        Dir::BwdData => s.n * s.h * s.w * s.c,
        Dir::BwdFilter => s.k * s.r * s.s * s.c,
    }
}

fn decode(p: Prec, bytes: &[u8], i: usize) -> f64 {
    match p {
        Prec::F16 => {
            half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f64()
        }
        Prec::Bf16 => {
            half::bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f64()
        }
        _ => f32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]) as f64,
    }
}

/// The reference value of output element `idx` and Σ|terms| (for a normwise error).
fn reference(
    s: &ConvShape,
    hx: &dyn Fn(usize) -> f64,
    hw: &dyn Fn(usize) -> f64,
    hdy: &dyn Fn(usize) -> f64,
    dir: Dir,
    idx: usize,
) -> (f64, f64) {
    let (oh, ow) = (s.oh() as isize, s.ow() as isize);
    let xi = |n: usize, y: isize, x: isize, c: usize| -> Option<f64> {
        if y < 0 || x < 0 || y >= s.h as isize || x >= s.w as isize {
            return None;
        }
        Some(hx(((n * s.h + y as usize) * s.w + x as usize) * s.c + c))
    };
    let wi = |k: usize, r: usize, q: usize, c: usize| hw(((k * s.r + r) * s.s + q) * s.c + c);
    let dyi = |n: usize, p: usize, q: usize, k: usize| {
        hdy(((n * oh as usize + p) * ow as usize + q) * s.k + k)
    };
    let (st, pad) = (s.stride as isize, s.pad as isize);
    let (mut sum, mut abs) = (0.0, 0.0);
    let mut add = |v: f64| {
        sum += v;
        abs += v.abs();
    };
    match dir {
        Dir::Fwd => {
            let k = idx % s.k;
            let q = (idx / s.k) % ow as usize;
            let p = (idx / s.k / ow as usize) % oh as usize;
            let n = idx / s.k / ow as usize / oh as usize;
            for r in 0..s.r {
                for u in 0..s.s {
                    for c in 0..s.c {
                        if let Some(x) = xi(
                            n,
                            p as isize * st - pad + r as isize,
                            q as isize * st - pad + u as isize,
                            c,
                        ) {
                            add(x * wi(k, r, u, c));
                        }
                    }
                }
            }
        }
        Dir::BwdData => {
            let c = idx % s.c;
            let x = ((idx / s.c) % s.w) as isize;
            let y = ((idx / s.c / s.w) % s.h) as isize;
            let n = idx / s.c / s.w / s.h;
            for r in 0..s.r as isize {
                for u in 0..s.s as isize {
                    let (py, qx) = (y + pad - r, x + pad - u);
                    if py % st != 0 || qx % st != 0 {
                        continue;
                    }
                    let (p, q) = (py / st, qx / st);
                    if p < 0 || q < 0 || p >= oh || q >= ow {
                        continue;
                    }
                    for k in 0..s.k {
                        add(dyi(n, p as usize, q as usize, k) * wi(k, r as usize, u as usize, c));
                    }
                }
            }
        }
        Dir::BwdFilter => {
            let c = idx % s.c;
            let u = (idx / s.c) % s.s;
            let r = (idx / s.c / s.s) % s.r;
            let k = idx / s.c / s.s / s.r;
            for n in 0..s.n {
                for p in 0..oh as usize {
                    for q in 0..ow as usize {
                        if let Some(x) = xi(
                            n,
                            p as isize * st - pad + r as isize,
                            q as isize * st - pad + u as isize,
                            c,
                        ) {
                            add(dyi(n, p, q, k) * x);
                        }
                    }
                }
            }
        }
    }
    (sum, abs)
}

fn check(p: Prec, s: &ConvShape, t: &Tensors, dir: Dir, got: &[u8]) -> Result<f64, CudaError> {
    use rayon::prelude::*;
    let len = out_len(s, dir);
    let mut worst = 0.0f64;
    // The references in parallel: a backward-filter entry at batch 128 sums millions of terms.
    let (hx, hw, hdy) = (t.hx, t.hw, t.hdy);
    let refs: Vec<(usize, (f64, f64))> = (0..24usize)
        .into_par_iter()
        .map(|j| {
            let idx = (j * 2_654_435_761usize) % len;
            let r = reference(s, &|i| hx.at(i), &|i| hw.at(i), &|i| hdy.at(i), dir, idx);
            (idx, r)
        })
        .collect();
    for (idx, (want, abs)) in refs {
        let g = decode(p, got, idx);
        let err = (g - want).abs() / abs.max(1e-30);
        worst = worst.max(err);
        if err > p.tolerance() {
            return Err(CudaError::Check(format!(
                "cuDNN {} {} element {idx}: GPU {g}, reference {want} (normwise error {err:.2e})",
                p.name(),
                dir.name()
            )));
        }
    }
    Ok(worst)
}

/// How a convolution is timed: the calibrated repetitions per sample (5 ms quick, 20 ms full),
/// 3 or 5 samples with NVML's readings at the end of each.
struct Timing<'a> {
    gpu: &'a Gpu,
    h: &'a Handle,
    d: &'a Descs,
    t: &'a Tensors,
    ws: &'a DevBuf,
    mode: Mode,
    cancel: &'a AtomicBool,
    flops: f64,
}

impl Timing<'_> {
    /// The rates of `algo` and the samples' conditions; None without a sample.
    fn measure(&self, algo: Algo) -> Result<Option<(Stats, Option<SampleConditions>)>, CudaError> {
        let (gpu, h, d, t, ws) = (self.gpu, self.h, self.d, self.t, self.ws);
        let want = if self.mode == Mode::Quick {
            0.005
        } else {
            0.02
        };
        let reps = crate::driver::calibrate(&mut Events(gpu), 1, 200, want, &mut |r| {
            for _ in 0..r {
                run_once(h, d, t, algo, ws)?;
            }
            Ok(())
        })?;
        // NVML's readings at the end of each sample come with the times.
        let (times, conditions) = gpu.watched(
            || {
                crate::driver::sample(
                    &mut Events(gpu),
                    0,
                    if self.mode == Mode::Quick { 3 } else { 5 },
                    &mut || match self.cancel.load(Ordering::Relaxed) {
                        true => Err(CudaError::Interrupted),
                        false => Ok(()),
                    },
                    &mut || {
                        for _ in 0..reps {
                            run_once(h, d, t, algo, ws)?;
                        }
                        Ok(())
                    },
                )
            },
            |t| t.len(),
        )?;
        let rates: Vec<f64> = times
            .iter()
            .map(|tm| self.flops * reps as f64 / tm)
            .collect();
        Ok(Stats::from_samples(&rates).map(|s| (s, conditions)))
    }
}

/// The bytes a direction moves at least: its two operands read and its output written, in
/// the storage precision.
fn min_bytes(s: &ConvShape, p: Prec, dir: Dir) -> f64 {
    let (x, w, y) = (
        s.n * s.h * s.w * s.c,
        s.k * s.r * s.s * s.c,
        s.n * s.oh() * s.ow() * s.k,
    );
    let elements = match dir {
        Dir::Fwd => x + w + y,
        Dir::BwdData => y + w + x,
        Dir::BwdFilter => x + y + w,
    };
    (elements * p.in_bytes()) as f64
}

/// A shape's own roof: min(the precision's datasheet peak, its operational intensity × the
/// datasheet memory bandwidth); None for a GPU the peak database lacks.
fn shape_roof(
    peaks: &PeakDb,
    gpu: &Gpu,
    p: Prec,
    s: &ConvShape,
    dir: Dir,
    flops: f64,
) -> Option<f64> {
    let peak = peak_for(peaks, gpu, p)?.value;
    let bw = peaks.device(&gpu.name)?.memory_bandwidth;
    Some(peak.min(flops / min_bytes(s, p, dir) * bw))
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
) -> Result<SectionResult, CudaError> {
    let h = Handle::new(gpu)?;
    let batch = match mode {
        Mode::Check => 2,
        Mode::Quick | Mode::Full => CONV_BATCH,
    };
    let mut layers = resnet50_layers(batch);
    if mode == Mode::Check {
        layers.truncate(3);
    }
    let ws = gpu.alloc(WORKSPACE_LIMIT)?;
    let mut out = SectionResult::default();
    for p in PRECISIONS {
        let r = conv_precision(gpu, &h, &ws, p, mode, &layers, cancel, peaks, &mut out);
        if matches!(r, Err(CudaError::Interrupted)) {
            return Err(CudaError::Interrupted);
        }
        out.checks.push((format!("cudnn_conv_{}", p.name()), r));
    }
    Ok(out)
}

#[allow(clippy::too_many_arguments)]
fn conv_precision(
    gpu: &Gpu,
    h: &Handle,
    ws: &DevBuf,
    p: Prec,
    mode: Mode,
    layers: &[crate::cpu::conv::Layer],
    cancel: &AtomicBool,
    peaks: &PeakDb,
    out: &mut SectionResult,
) -> Result<String, CudaError> {
    let mut rows: Vec<Vec<TableRow>> = vec![Vec::new(); 3];
    // Per direction: the best layer's statistics, FLOPs, description and sample conditions.
    type Best = (Stats, f64, String, Option<SampleConditions>);
    let mut best: Vec<Option<Best>> = vec![None, None, None];
    let mut worst = 0.0f64;
    let (mut refused, mut measured) = (None, 0usize);
    for (li, layer) in layers.iter().enumerate() {
        let s = &layer.shape;
        // One descriptor set per direction, as in ConvPlan: `choose` sets the math type the
        // chosen algorithm wants on its descriptor, and a shared one would hand the forward
        // choice's math type to the backward heuristics.
        let ds = [descs(s, p)?, descs(s, p)?, descs(s, p)?];
        let seed = 0xC0FFEE + 3 * li as u64;
        let (hx, hw, hdy) = (
            Operand { seed, p },
            Operand { seed: seed + 1, p },
            Operand { seed: seed + 2, p },
        );
        let out_bytes = [Dir::Fwd, Dir::BwdData, Dir::BwdFilter]
            .iter()
            .map(|d| out_len(s, *d))
            .max()
            .unwrap_or(0)
            * if matches!(p, Prec::F16 | Prec::Bf16) {
                2
            } else {
                4
            };
        let t = Tensors {
            x: gpu.upload(&hx.bytes(s.n * s.h * s.w * s.c))?,
            w: gpu.upload(&hw.bytes(s.k * s.r * s.s * s.c))?,
            dy: gpu.upload(&hdy.bytes(s.n * s.oh() * s.ow() * s.k))?,
            y: gpu.alloc(out_bytes)?,
            hx,
            hw,
            hdy,
        };
        let flops = 2.0 * (s.rows() * s.depth() * s.k) as f64;
        for (di, dir) in DIRECTIONS.into_iter().enumerate() {
            if cancel.load(Ordering::Relaxed) {
                return Err(CudaError::Interrupted);
            }
            let d = &ds[di];
            // The algorithm cuDNN measures fastest on these operands (as the trainer's plans
            // choose). Its refusal of one layer and direction (no usable algorithm, or the call
            // refused) costs that row only, noted; a wrong result still fails the precision.
            let attempt = find(h, d, p, dir, operands(&t, dir), (ws.ptr, ws.bytes))
                .and_then(|(a, _)| run_once(h, d, &t, a, ws).map(|_| a))
                .map_err(not_supported);
            let algo = match attempt {
                Ok(a) => a,
                Err(CudaError::Interrupted) => return Err(CudaError::Interrupted),
                Err(e) => {
                    out.notes.push(format!(
                        "gpu{} conv {} {} {}: not measured: {e}",
                        gpu.ordinal,
                        p.name(),
                        dir.name(),
                        layer.name
                    ));
                    refused = Some(e);
                    continue;
                }
            };
            measured += 1;
            let got: Vec<u8> = gpu.download(&t.y)?;
            let err = check(p, s, &t, dir, &got)?;
            worst = worst.max(err);
            if mode == Mode::Check {
                continue;
            }
            let timing = Timing {
                gpu,
                h,
                d,
                t: &t,
                ws,
                mode,
                cancel,
                flops,
            };
            let Some((stats, conditions)) = timing.measure(algo)? else {
                continue;
            };
            let algo_name = algo.name();
            // The row holds what the ceiling would: the best clean sample.
            let value = SampleConditions::best_rate(conditions.as_ref(), &stats);
            // cuDNN's heuristic (its _v7 first choice) beside the fastest measured: timed
            // too where it is another algorithm. (It sets its math type on the descriptor,
            // after the fastest's timing.)
            let heuristic = match choose(h, d, p, dir) {
                Ok((a, _)) if a.name() == algo.name() => Some(Choice {
                    detail: a.name(),
                    value,
                }),
                Ok((a, _)) => match run_once(h, d, &t, a, ws).and_then(|_| timing.measure(a)) {
                    Ok(Some((hs, hc))) => Some(Choice {
                        detail: a.name(),
                        value: SampleConditions::best_rate(hc.as_ref(), &hs),
                    }),
                    Ok(None) | Err(_) => None,
                },
                Err(_) => None,
            };
            let roof = shape_roof(peaks, gpu, p, s, dir, flops);
            let shape = format!(
                "n={} c={} h={} w={} k={} r={} s={} stride={} pad={}",
                s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.stride, s.pad
            );
            if best[di]
                .as_ref()
                .is_none_or(|b| value > SampleConditions::best_rate(b.3.as_ref(), &b.0))
            {
                best[di] = Some((
                    stats.clone(),
                    flops,
                    format!("{} ({shape}), {algo_name}", layer.name),
                    conditions,
                ));
            }
            rows[di].push(TableRow {
                name: layer.name.clone(),
                shape,
                precision: Some(p.name().into()),
                threads: 1,
                value,
                stats,
                max_rel_error: Some(err),
                detail: Some(algo_name),
                heuristic,
                roof,
                efficiency: roof.map(|r| value / r),
            });
        }
    }
    for (di, dir) in DIRECTIONS.into_iter().enumerate() {
        let Some((stats, flops, how, conditions)) = best[di].take() else {
            continue;
        };
        let method = format!(
            "cuDNN {}, NHWC/KRSC, f32 accumulation{}, best over ResNet-50 v1.5's layer shapes at batch {}: {how}; 24 entries per layer checked against f64 (normwise ≤ {:.0e}); CUDA-event timed",
            dir.name(),
            if p == Prec::F32 { ", FMA math (no TF32)" } else { ", tensor-op math" },
            layers.first().map_or(0, |l| l.shape.n),
            p.tolerance()
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
            .with_peak(peak_for(peaks, gpu, p))
            .with_conditions(conditions),
        );
        out.tables.push(Table {
            id: TableId {
                of: super::compute_roof(gpu.ordinal, Family::Conv, p, Some(dir)),
                rows: TableRows::Table,
            },
            unit: "FLOP/s".into(),
            rows: std::mem::take(&mut rows[di]),
        });
    }
    match refused {
        // Nothing ran at all: the precision is not supported here.
        Some(e) if measured == 0 => Err(e),
        _ => Ok(format!("max normwise error {worst:.1e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CPU references of the three directions agree with each other through the adjoint
    /// identity <conv(x, w), dy> = <x, bwd_data(dy, w)> = <w, bwd_filter(x, dy)>.
    #[test]
    fn references_satisfy_the_adjoint_identities() {
        let s = ConvShape {
            n: 2,
            c: 3,
            h: 7,
            w: 6,
            k: 4,
            r: 3,
            s: 3,
            stride: 2,
            pad: 1,
        };
        let mut rng = Rng(3);
        let p = Prec::F64;
        let mut t_host = |n| (0..n).map(|_| rng.value(p)).collect::<Vec<f64>>();
        let hx = t_host(s.n * s.h * s.w * s.c);
        let hw = (0..s.k * s.r * s.s * s.c)
            .map(|i| ((i * 37) % 11) as f64 - 5.0)
            .collect::<Vec<_>>();
        let hdy = (0..s.n * s.oh() * s.ow() * s.k)
            .map(|i| ((i * 13) % 7) as f64 - 3.0)
            .collect::<Vec<_>>();
        let dot = |dir: Dir, other: &[f64]| -> f64 {
            (0..out_len(&s, dir))
                .map(|i| reference(&s, &|j| hx[j], &|j| hw[j], &|j| hdy[j], dir, i).0 * other[i])
                .sum()
        };
        let a = dot(Dir::Fwd, &hdy);
        let b = dot(Dir::BwdData, &hx);
        let c = dot(Dir::BwdFilter, &hw);
        assert!((a - b).abs() < 1e-9 * a.abs().max(1.0), "{a} vs {b}");
        assert!((a - c).abs() < 1e-9 * a.abs().max(1.0), "{a} vs {c}");
    }

    /// An operand's upload is its values, element for element, in every precision: the bytes
    /// made in parallel chunks decode to what the reference computes again from the index;
    /// values are exact in the precision and never zero, and two seeds differ.
    #[test]
    fn operands_upload_what_the_reference_reads() {
        for p in PRECISIONS {
            let op = Operand { seed: 7, p };
            let n = (1 << 20) + 37; // two chunks, the second short
            let bytes = op.bytes(n);
            assert_eq!(bytes.len(), n * p.in_bytes());
            for i in [0, 1, 5, (1 << 20) - 1, 1 << 20, n - 1] {
                let v = op.at(i);
                assert!(v != 0.0 && v.abs() <= 1.0, "{v}");
                assert_eq!(decode(p, &bytes, i), v, "{} element {i}", p.name());
            }
            let other = Operand { seed: 8, p };
            assert!((0..64).any(|i| other.at(i) != op.at(i)));
        }
    }

    /// The bytes a direction moves at least, by hand: a 1×1 convolution of 64 to 256 channels
    /// on 2 × 4 × 4 at stride 1 reads x (2·4·4·64) and w (256·64) and writes y (2·4·4·256),
    /// in the storage precision's bytes; the backward directions move the same three tensors.
    #[test]
    fn a_direction_moves_its_three_tensors() {
        let s = ConvShape {
            n: 2,
            c: 64,
            h: 4,
            w: 4,
            k: 256,
            r: 1,
            s: 1,
            stride: 1,
            pad: 0,
        };
        let elements = (2 * 4 * 4 * 64 + 256 * 64 + 2 * 4 * 4 * 256) as f64;
        for dir in DIRECTIONS {
            assert_eq!(min_bytes(&s, Prec::Bf16, dir), 2.0 * elements);
            assert_eq!(min_bytes(&s, Prec::F32, dir), 4.0 * elements);
        }
    }
}
