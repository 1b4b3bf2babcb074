//! GEMM ceilings through cuBLAS and cuBLASLt (`cuda::blas`), per precision, over a sweep of
//! shapes. Inputs are random and never zero, rotated among enough buffer sets to exceed twice
//! the L2, and a sample of C is checked against an f64 dot product on the CPU.

use super::{Mode, SectionResult};
use crate::cuda::blas::{
    enqueue, handles, lt_plan, not_supported, GemmPrec, Handles, Library, Operands, Prec,
};
use crate::cuda::device::{self, Gpu};
use crate::cuda::CudaError;
use crate::driver::CheckError;
use roofline_model::ceiling_id::{TableId, TableRows};
use roofline_model::conditions::SampleConditions;
use roofline_model::{
    Ceiling, CeilingKind, Family, PeakDb, PerIteration, Stats, Table, TableRow, TheoreticalPeak,
};
use std::sync::atomic::{AtomicBool, Ordering};

/// A deterministic generator (xorshift64*).
pub(crate) struct Rng(pub(crate) u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// A value of `p` that is exactly representable there and never zero, in ±[0.25, 1].
    pub(crate) fn value(&mut self, p: Prec) -> f64 {
        let r = self.next();
        let sign = if r & 1 == 0 { 1.0 } else { -1.0 };
        match p {
            Prec::Int8 => sign * (1 + (r >> 8) % 8) as f64,
            // e4m3: exponents -2..0, 3 mantissa bits
            Prec::Fp8 => {
                sign * 2f64.powi(-(((r >> 8) % 3) as i32)) * (1.0 + ((r >> 16) % 8) as f64 / 8.0)
                    / 2.0
            }
            _ => {
                let u = ((r >> 11) as f64) / (1u64 << 53) as f64; // [0, 1)
                let v = sign * (0.25 + 0.75 * u);
                match p {
                    Prec::F16 => half::f16::from_f64(v).to_f64(),
                    Prec::Bf16 => half::bf16::from_f64(v).to_f64(),
                    Prec::F32 | Prec::Tf32 => v as f32 as f64,
                    _ => v,
                }
            }
        }
    }
}

/// e4m3 bits of a value produced by `Rng::value(Prec::Fp8)` (exact by construction).
fn e4m3_bits(v: f64) -> u8 {
    let sign = if v < 0.0 { 0x80u8 } else { 0 };
    let a = v.abs();
    let e = a.log2().floor() as i32;
    let m = ((a / 2f64.powi(e) - 1.0) * 8.0).round() as u8;
    sign | (((e + 7) as u8) << 3) | (m & 7)
}

/// The device bytes of host values in precision `p`.
pub(crate) fn encode(p: Prec, v: &[f64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(v.len() * p.in_bytes());
    for &x in v {
        match p {
            Prec::F64 => out.extend_from_slice(&x.to_le_bytes()),
            Prec::F32 | Prec::Tf32 => out.extend_from_slice(&(x as f32).to_le_bytes()),
            Prec::F16 => out.extend_from_slice(&half::f16::from_f64(x).to_bits().to_le_bytes()),
            Prec::Bf16 => out.extend_from_slice(&half::bf16::from_f64(x).to_bits().to_le_bytes()),
            Prec::Int8 => out.push(x as i8 as u8),
            Prec::Fp8 => out.push(e4m3_bits(x)),
        }
    }
    out
}

/// C element `i` as f64 from the downloaded bytes.
fn decode_out(p: Prec, bytes: &[u8], i: usize) -> f64 {
    let b = p.out_bytes();
    let s = &bytes[i * b..(i + 1) * b];
    match p {
        Prec::F64 => f64::from_le_bytes(s.try_into().unwrap_or([0; 8])),
        Prec::F32 | Prec::Tf32 => f32::from_le_bytes(s.try_into().unwrap_or([0; 4])) as f64,
        Prec::Int8 => i32::from_le_bytes(s.try_into().unwrap_or([0; 4])) as f64,
        Prec::F16 => half::f16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f64(),
        // fp8 GEMMs write bf16
        Prec::Bf16 | Prec::Fp8 => half::bf16::from_bits(u16::from_le_bytes([s[0], s[1]])).to_f64(),
    }
}

/// Checks sampled entries of C (m×n, column-major) against f64 dot products of the host data.
pub fn check_sample(
    p: Prec,
    a: &[f64],
    b: &[f64],
    c: &[u8],
    m: usize,
    n: usize,
    k: usize,
) -> Result<f64, CheckError> {
    let mut worst = 0.0f64;
    for s in 0..64usize {
        let i = (s * 7919) % m;
        let j = (s * 104_729) % n;
        let (mut dot, mut abs) = (0.0f64, 0.0f64);
        for l in 0..k {
            let x = a[l + i * k] * b[l + j * k];
            dot += x;
            abs += x.abs();
        }
        let got = decode_out(p, c, i + j * m);
        let err = (got - dot).abs() / abs.max(f64::MIN_POSITIVE);
        worst = worst.max(err);
        if !got.is_finite() || err > p.tolerance() {
            return Err(CheckError::Bound {
                what: format!("{} GEMM {m}x{n}x{k}: C[{i},{j}]", p.name()),
                got,
                want: dot,
                err,
                scale: "Σ|a·b|",
                bound: p.tolerance(),
            });
        }
    }
    Ok(worst)
}

/// The shapes (m, n, k, name): squares and the ResNet-50 ones that matter most in training.
/// Every GEMM shape (m, n, k) the probe runs in any mode, for the library gate.
pub fn all_shapes() -> Vec<(usize, usize, usize)> {
    let mut v: Vec<(usize, usize, usize)> = [Mode::Check, Mode::Quick, Mode::Full]
        .into_iter()
        .flat_map(shapes)
        .map(|(m, n, k, _)| (m, n, k))
        .collect();
    v.sort_unstable();
    v.dedup();
    v
}

fn shapes(mode: Mode) -> Vec<(usize, usize, usize, String)> {
    let mut v: Vec<(usize, usize, usize, String)> = Vec::new();
    let squares: &[usize] = match mode {
        Mode::Check => &[256],
        Mode::Quick => &[2048, 4096],
        Mode::Full => &[1024, 2048, 4096, 8192],
    };
    for &s in squares {
        v.push((s, s, s, format!("square {s}")));
    }
    if mode == Mode::Full {
        // batch 256: the last 1x1 conv of stage 4 (im2col GEMM) and the fc layer's backward.
        v.push((
            256 * 7 * 7,
            2048,
            512,
            "resnet50 conv5 1x1 expand (batch 256)".into(),
        ));
        v.push((
            2048,
            1000 + 24,
            256,
            "resnet50 fc weight gradient (batch 256, n padded to 1024)".into(),
        ));
    }
    v
}

/// One GEMM problem on the device: `sets` copies of A and B (rotated), and C.
struct Problem {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<device::DevBuf>,
    b: Vec<device::DevBuf>,
    c: device::DevBuf,
    host_a: Vec<f64>,
    host_b: Vec<f64>,
}

fn problem(
    gpu: &Gpu,
    p: Prec,
    m: usize,
    n: usize,
    k: usize,
    seed: u64,
) -> Result<Problem, CudaError> {
    let mut rng = Rng(seed | 1);
    let host_a: Vec<f64> = (0..k * m).map(|_| rng.value(p)).collect();
    let host_b: Vec<f64> = (0..k * n).map(|_| rng.value(p)).collect();
    let (ea, eb) = (encode(p, &host_a), encode(p, &host_b));
    let set_bytes = (ea.len() + eb.len()) as u64;
    let sets = ((2 * gpu.l2_bytes).div_ceil(set_bytes.max(1)) as usize).clamp(1, 16);
    let mut a = Vec::with_capacity(sets);
    let mut b = Vec::with_capacity(sets);
    for _ in 0..sets {
        a.push(gpu.upload(&ea)?);
        b.push(gpu.upload(&eb)?);
    }
    let c = gpu.alloc(m * n * p.out_bytes())?;
    Ok(Problem {
        m,
        n,
        k,
        a,
        b,
        c,
        host_a,
        host_b,
    })
}

impl Problem {
    /// The operands with buffer set `set` of A and B.
    fn operands(&self, set: usize) -> Operands<'_> {
        Operands {
            m: self.m,
            n: self.n,
            k: self.k,
            a: &self.a[set],
            b: &self.b[set],
            c: &self.c,
        }
    }
}

fn peak_for(peaks: &PeakDb, gpu: &Gpu, p: Prec) -> Option<TheoreticalPeak> {
    let d = peaks.device(&gpu.name)?;
    let engine = if p == Prec::F64 {
        d.engine_peak("f64", "matrix")
            .map(|_| "matrix")
            .unwrap_or("vector")
    } else if p == Prec::F32 {
        "vector"
    } else {
        "matrix"
    };
    let pk = d.engine_peak(p.name(), engine)?;
    Some(TheoreticalPeak {
        value: pk.value,
        unit: pk.unit.clone(),
        source: format!("{} ({} {engine} peak): {}", d.name, p.name(), d.source),
        uncertainty: 0.0,
    })
}

/// Measures every precision over every shape with both libraries.
pub fn gemm_section(
    gpu: &mut Gpu,
    mode: Mode,
    cancel: &AtomicBool,
    peaks: &PeakDb,
) -> Result<SectionResult, CudaError> {
    let h = handles(gpu)?;
    let mut out = SectionResult::default();
    for p in Prec::ALL {
        let kernel = format!("gemm_{}", p.name());
        if gpu.arch() < p.min_arch() {
            out.checks.push((
                kernel,
                Err(CudaError::Unsupported(format!(
                    "{} GEMM needs sm_{}+",
                    p.name(),
                    p.min_arch()
                ))),
            ));
            continue;
        }
        let r = gemm_precision(gpu, &h, p, mode, cancel, peaks, &mut out).map_err(not_supported);
        if matches!(r, Err(CudaError::Interrupted)) {
            return Err(CudaError::Interrupted);
        }
        out.checks.push((kernel, r));
    }
    Ok(out)
}

fn gemm_precision(
    gpu: &Gpu,
    h: &Handles,
    p: Prec,
    mode: Mode,
    cancel: &AtomicBool,
    peaks: &PeakDb,
    out: &mut SectionResult,
) -> Result<String, CudaError> {
    let mut rows = Vec::new();
    let mut best: Option<(Stats, f64, String, Option<SampleConditions>)> = None;
    let mut worst_err = 0.0f64;
    let mut refused = None;
    let mut measured = 0usize;
    gpu.bind()?;
    let (free, _) = device::check("cuMemGetInfo", cudarc::driver::result::mem_get_info())?;
    for (i, (m, n, k, name)) in shapes(mode).into_iter().enumerate() {
        let need = (k * (m + n) * p.in_bytes() + m * n * p.out_bytes()) as u64;
        if need * 2 > free as u64 {
            out.notes.push(format!(
                "gpu{} gemm {} {name}: skipped, needs {need} bytes",
                gpu.ordinal,
                p.name()
            ));
            continue;
        }
        let pr = problem(gpu, p, m, n, k, 0x5eed + i as u64)?;
        for lib in [Library::Cublas, Library::CublasLt] {
            if cancel.load(Ordering::Relaxed) {
                return Err(CudaError::Interrupted);
            }
            if lib == Library::Cublas && p == Prec::Fp8 {
                continue;
            }
            // A library's refusal of one shape (the heuristic finds no algorithm, or the call
            // is refused for this shape and type on this GPU and library version) costs that
            // row only: the rows already measured are kept, and the refusal is noted. A wrong
            // result (below) still fails the precision.
            let attempt = if lib == Library::CublasLt {
                lt_plan(h, p, m, n, k).map(Some)
            } else {
                Ok(None)
            }
            .and_then(|plan| enqueue(gpu, h, lib, p, &pr.operands(0), plan.as_ref()).map(|_| plan));
            let plan = match attempt.map_err(not_supported) {
                Ok(plan) => plan,
                Err(CudaError::Interrupted) => return Err(CudaError::Interrupted),
                Err(e) => {
                    out.notes.push(format!(
                        "gpu{} gemm {} {name}: {} not measured: {e}",
                        gpu.ordinal,
                        p.name(),
                        lib.name()
                    ));
                    refused = Some(e);
                    continue;
                }
            };
            // The warm-up above left C: check it.
            let c: Vec<u8> = gpu.download(&pr.c)?;
            let err = check_sample(p, &pr.host_a, &pr.host_b, &c, m, n, k)?;
            worst_err = worst_err.max(err);
            measured += 1;
            if mode == Mode::Check {
                continue;
            }
            let flops = 2.0 * (m * n * k) as f64;
            // GEMMs per sample: enough for the mode's sample time (the driver's calibration,
            // rotating the operand sets as the samples do).
            let want = if mode == Mode::Quick { 0.01 } else { 0.05 };
            let samples = if mode == Mode::Quick { 3 } else { 7 };
            let mut set = 0;
            let reps =
                crate::driver::calibrate(&mut device::Events(gpu), 1, 1000, want, &mut |r| {
                    for _ in 0..r {
                        set = (set + 1) % pr.a.len();
                        enqueue(gpu, h, lib, p, &pr.operands(set), plan.as_ref())?;
                    }
                    Ok(())
                })?;
            // NVML's readings at the end of each sample come with the times.
            let (times, conditions) = gpu.watched(
                || {
                    crate::driver::sample(
                        &mut device::Events(gpu),
                        0,
                        samples,
                        &mut || match cancel.load(Ordering::Relaxed) {
                            true => Err(CudaError::Interrupted),
                            false => Ok(()),
                        },
                        &mut || {
                            for _ in 0..reps {
                                set = (set + 1) % pr.a.len();
                                enqueue(gpu, h, lib, p, &pr.operands(set), plan.as_ref())?;
                            }
                            Ok(())
                        },
                    )
                },
                |t| t.len(),
            )?;
            let rates: Vec<f64> = times.iter().map(|t| flops * reps as f64 / t).collect();
            let Some(stats) = Stats::from_samples(&rates) else {
                continue;
            };
            let shape = format!("m={m} n={n} k={k} TN");
            // The row holds what the ceiling would: the best clean sample.
            let value = SampleConditions::best_rate(conditions.as_ref(), &stats);
            if best
                .as_ref()
                .is_none_or(|b| value > SampleConditions::best_rate(b.3.as_ref(), &b.0))
            {
                best = Some((
                    stats.clone(),
                    flops,
                    format!(
                        "{}, {name} ({shape}), {} buffer sets rotated",
                        lib.name(),
                        pr.a.len()
                    ),
                    conditions,
                ));
            }
            rows.push(TableRow {
                name: name.clone(),
                shape,
                precision: Some(p.name().into()),
                threads: 1,
                value,
                stats,
                max_rel_error: Some(err),
                detail: Some(lib.name().into()),
                heuristic: None,
                roof: None,
                efficiency: None,
            });
        }
    }
    if let Some((stats, flops, how, conditions)) = best {
        let method = format!(
            "best of the shape sweep: {how}; random nonzero inputs; 64 entries of C per shape checked against f64 (normwise error ≤ {:.0e}); CUDA-event timed; the whole sweep is in table gpu{}/gemm/{}/table",
            p.tolerance(),
            gpu.ordinal,
            p.name()
        );
        let per_iteration = PerIteration {
            ops: flops,
            bytes: 0.0,
        };
        let roof = super::compute_roof(gpu.ordinal, Family::Gemm, p, None);
        out.ceilings.push(
            Ceiling::measured(
                roof,
                CeilingKind::Compute,
                p.unit(),
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
                of: roof,
                rows: TableRows::Table,
            },
            unit: p.unit().into(),
            rows,
        });
    }
    match refused {
        // Nothing ran at all: the precision is not supported here.
        Some(e) if measured == 0 => Err(e),
        _ => Ok(format!("max normwise error {worst_err:.1e}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_values_are_exact_nonzero_and_encodable() {
        for p in Prec::ALL {
            let mut r = Rng(42);
            for _ in 0..1000 {
                let v = r.value(p);
                assert!(v != 0.0 && v.abs() <= 8.0, "{p:?} {v}");
                let bytes = encode(p, &[v]);
                assert_eq!(bytes.len(), p.in_bytes());
                let back = match p {
                    Prec::F64 => f64::from_le_bytes(bytes.clone().try_into().unwrap()),
                    Prec::F32 | Prec::Tf32 => {
                        f32::from_le_bytes(bytes.clone().try_into().unwrap()) as f64
                    }
                    Prec::F16 => {
                        half::f16::from_bits(u16::from_le_bytes([bytes[0], bytes[1]])).to_f64()
                    }
                    Prec::Bf16 => {
                        half::bf16::from_bits(u16::from_le_bytes([bytes[0], bytes[1]])).to_f64()
                    }
                    Prec::Int8 => bytes[0] as i8 as f64,
                    Prec::Fp8 => {
                        let b = bytes[0];
                        let s = if b & 0x80 != 0 { -1.0 } else { 1.0 };
                        s * 2f64.powi(((b >> 3) & 15) as i32 - 7) * (1.0 + (b & 7) as f64 / 8.0)
                    }
                };
                assert_eq!(back, v, "{p:?} round trip");
            }
        }
    }

    #[test]
    fn check_sample_accepts_the_right_product_and_rejects_a_wrong_one() {
        let (m, n, k) = (5, 4, 3);
        let mut r = Rng(7);
        let a: Vec<f64> = (0..k * m).map(|_| r.value(Prec::F32)).collect();
        let b: Vec<f64> = (0..k * n).map(|_| r.value(Prec::F32)).collect();
        let mut c = Vec::new();
        for j in 0..n {
            for i in 0..m {
                let dot: f64 = (0..k).map(|l| a[l + i * k] * b[l + j * k]).sum();
                c.push(dot);
            }
        }
        let bytes: Vec<u8> = c.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect();
        assert!(check_sample(Prec::F32, &a, &b, &bytes, m, n, k).is_ok());
        let mut wrong = c.clone();
        wrong[0] += 0.01;
        let bytes: Vec<u8> = wrong
            .iter()
            .flat_map(|x| (*x as f32).to_le_bytes())
            .collect();
        assert!(check_sample(Prec::F32, &a, &b, &bytes, m, n, k).is_err());
        // A NaN is no product: its error compares false with every bound, and must still fail.
        let mut nan = c.clone();
        nan[0] = f64::NAN;
        let bytes: Vec<u8> = nan.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect();
        let e = check_sample(Prec::F32, &a, &b, &bytes, m, n, k).unwrap_err();
        assert!(matches!(e, CheckError::Bound { .. }), "{e}");
    }
}
