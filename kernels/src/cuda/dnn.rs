//! Convolution ceilings through cuDNN over ResNet-50 v1.5's layer shapes: forward,
//! backward-data and backward-filter, f32 / tf32 / f16 / bf16, NHWC tensors and KRSC filters,
//! f32 accumulation. The algorithm is cuDNN's heuristic choice (cudnnGet*Algorithm_v7, first
//! that fits the workspace) and is recorded per row. Every result is checked on a sample of
//! entries against f64 sums on the CPU.

use super::blas::{encode, GemmPrec, Prec, Rng, SectionResult};
use super::device::{DevBuf, Gpu};
use super::libs::{self, Lib};
use super::CudaError;
use crate::cpu::conv::{resnet50_layers, ConvShape};
use crate::probe::gpu::Mode;
use cudarc::cudnn::{result as dnn, sys as dsys};
use roofline_model::{
    Ceiling, CeilingKind, PeakDb, PerIteration, Stats, Table, TableRow, TheoreticalPeak,
};
use std::ffi::c_void;
use std::sync::atomic::{AtomicBool, Ordering};

const PRECISIONS: [Prec; 4] = [Prec::F32, Prec::Tf32, Prec::F16, Prec::Bf16];
const DIRECTIONS: [Dir; 3] = [Dir::Fwd, Dir::BwdData, Dir::BwdFilter];
const WORKSPACE_LIMIT: usize = 512 << 20;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Dir {
    Fwd,
    BwdData,
    BwdFilter,
}

impl Dir {
    fn name(self) -> &'static str {
        match self {
            Dir::Fwd => "fwd",
            Dir::BwdData => "bwd_data",
            Dir::BwdFilter => "bwd_filter",
        }
    }
}

fn dtype(p: Prec) -> dsys::cudnnDataType_t {
    match p {
        Prec::F16 => dsys::cudnnDataType_t::CUDNN_DATA_HALF,
        Prec::Bf16 => dsys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
        _ => dsys::cudnnDataType_t::CUDNN_DATA_FLOAT,
    }
}

fn math(p: Prec) -> dsys::cudnnMathType_t {
    match p {
        // plain f32: no TF32 tensor-core rounding
        Prec::F32 => dsys::cudnnMathType_t::CUDNN_FMA_MATH,
        _ => dsys::cudnnMathType_t::CUDNN_TENSOR_OP_MATH,
    }
}

fn e(call: &str) -> impl Fn(dnn::CudnnError) -> CudaError + '_ {
    move |err| CudaError::call(call, err)
}

/// The cuDNN handle and one layer's descriptors, destroyed on drop.
struct Descs {
    x: dsys::cudnnTensorDescriptor_t,
    y: dsys::cudnnTensorDescriptor_t,
    w: dsys::cudnnFilterDescriptor_t,
    conv: dsys::cudnnConvolutionDescriptor_t,
}

impl Drop for Descs {
    fn drop(&mut self) {
        // SAFETY: created in `descs`, destroyed once (null ones skipped).
        unsafe {
            if !self.x.is_null() {
                let _ = dnn::destroy_tensor_descriptor(self.x);
            }
            if !self.y.is_null() {
                let _ = dnn::destroy_tensor_descriptor(self.y);
            }
            if !self.w.is_null() {
                let _ = dnn::destroy_filter_descriptor(self.w);
            }
            if !self.conv.is_null() {
                let _ = dnn::destroy_convolution_descriptor(self.conv);
            }
        }
    }
}

fn descs(s: &ConvShape, p: Prec) -> Result<Descs, CudaError> {
    let mut d = Descs {
        x: std::ptr::null_mut(),
        y: std::ptr::null_mut(),
        w: std::ptr::null_mut(),
        conv: std::ptr::null_mut(),
    };
    let nhwc = dsys::cudnnTensorFormat_t::CUDNN_TENSOR_NHWC;
    let i = |v: usize| v as i32;
    d.x = dnn::create_tensor_descriptor().map_err(e("cudnnCreateTensorDescriptor"))?;
    d.y = dnn::create_tensor_descriptor().map_err(e("cudnnCreateTensorDescriptor"))?;
    d.w = dnn::create_filter_descriptor().map_err(e("cudnnCreateFilterDescriptor"))?;
    d.conv = dnn::create_convolution_descriptor().map_err(e("cudnnCreateConvolutionDescriptor"))?;
    // SAFETY: live descriptors; dimensions from a valid shape.
    unsafe {
        dnn::set_tensor4d_descriptor(d.x, nhwc, dtype(p), [i(s.n), i(s.c), i(s.h), i(s.w)])
            .map_err(e("cudnnSetTensor4dDescriptor(x)"))?;
        dnn::set_tensor4d_descriptor(d.y, nhwc, dtype(p), [i(s.n), i(s.k), i(s.oh()), i(s.ow())])
            .map_err(e("cudnnSetTensor4dDescriptor(y)"))?;
        dnn::set_filter4d_descriptor(d.w, dtype(p), nhwc, [i(s.k), i(s.c), i(s.r), i(s.s)])
            .map_err(e("cudnnSetFilter4dDescriptor"))?;
        dnn::set_convolution2d_descriptor(
            d.conv,
            i(s.pad),
            i(s.pad),
            i(s.stride),
            i(s.stride),
            1,
            1,
            dsys::cudnnConvolutionMode_t::CUDNN_CROSS_CORRELATION,
            dsys::cudnnDataType_t::CUDNN_DATA_FLOAT,
        )
        .map_err(e("cudnnSetConvolution2dDescriptor"))?;
        dnn::set_convolution_math_type(d.conv, math(p))
            .map_err(e("cudnnSetConvolutionMathType"))?;
    }
    Ok(d)
}

/// A cuDNN handle bound to one GPU's stream, destroyed on drop.
pub struct Handle(dsys::cudnnHandle_t);

impl Handle {
    /// A handle whose work goes to `gpu`'s stream.
    pub fn new(gpu: &Gpu) -> Result<Handle, CudaError> {
        if !libs::present(Lib::Cudnn) {
            return Err(CudaError::Missing(libs::not_found(Lib::Cudnn)));
        }
        gpu.bind()?;
        let h = Handle(dnn::create_handle().map_err(e("cudnnCreate"))?);
        // SAFETY: live handle and stream.
        unsafe { dnn::set_stream(h.0, gpu.stream as dsys::cudaStream_t) }
            .map_err(e("cudnnSetStream"))?;
        Ok(h)
    }
}

impl Drop for Handle {
    fn drop(&mut self) {
        // SAFETY: created by cudnnCreate, destroyed once.
        unsafe {
            let _ = dnn::destroy_handle(self.0);
        }
    }
}

/// The algorithm cuDNN's heuristic chose for one direction.
#[derive(Clone, Copy, Debug)]
enum Algo {
    Fwd(dsys::cudnnConvolutionFwdAlgo_t),
    BwdData(dsys::cudnnConvolutionBwdDataAlgo_t),
    BwdFilter(dsys::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    fn name(&self) -> String {
        match self {
            Algo::Fwd(a) => format!("{a:?}"),
            Algo::BwdData(a) => format!("{a:?}"),
            Algo::BwdFilter(a) => format!("{a:?}"),
        }
    }
}

/// Whether a heuristic entry may be used: it succeeded, fits the workspace, and (plain f32)
/// uses FMA math, so that no TF32 rounding slips into the f32 ceiling.
fn usable(p: Prec, status: dsys::cudnnStatus_t, memory: usize, m: dsys::cudnnMathType_t) -> bool {
    status == dsys::cudnnStatus_t::CUDNN_STATUS_SUCCESS
        && memory <= WORKSPACE_LIMIT
        && (p != Prec::F32 || m == dsys::cudnnMathType_t::CUDNN_FMA_MATH)
}

/// The heuristic's first usable algorithm for `dir`, with the math type it wants set on the
/// convolution descriptor (cuDNN's rule for the _v7 heuristics).
fn choose(h: &Handle, d: &Descs, p: Prec, dir: Dir) -> Result<(Algo, usize), CudaError> {
    let mut n = 0i32;
    // SAFETY: live handle and descriptors; out-arrays of the requested length; cuDNN fills
    // `n` ≤ 8 entries, the rest stay zeroed and are not read.
    let found = unsafe {
        match dir {
            Dir::Fwd => {
                let mut perf: [dsys::cudnnConvolutionFwdAlgoPerf_t; 8] = std::mem::zeroed();
                dnn::get_convolution_forward_algorithm(
                    h.0,
                    d.x,
                    d.w,
                    d.conv,
                    d.y,
                    8,
                    &mut n,
                    perf.as_mut_ptr(),
                )
                .map_err(e("cudnnGetConvolutionForwardAlgorithm_v7"))?;
                perf[..n.clamp(0, 8) as usize]
                    .iter()
                    .find(|q| usable(p, q.status, q.memory, q.mathType))
                    .map(|q| (Algo::Fwd(q.algo), q.mathType, q.memory))
            }
            Dir::BwdData => {
                let mut perf: [dsys::cudnnConvolutionBwdDataAlgoPerf_t; 8] = std::mem::zeroed();
                dnn::get_convolution_backward_data_algorithm(
                    h.0,
                    d.w,
                    d.y,
                    d.conv,
                    d.x,
                    8,
                    &mut n,
                    perf.as_mut_ptr(),
                )
                .map_err(e("cudnnGetConvolutionBackwardDataAlgorithm_v7"))?;
                perf[..n.clamp(0, 8) as usize]
                    .iter()
                    .find(|q| usable(p, q.status, q.memory, q.mathType))
                    .map(|q| (Algo::BwdData(q.algo), q.mathType, q.memory))
            }
            Dir::BwdFilter => {
                let mut perf: [dsys::cudnnConvolutionBwdFilterAlgoPerf_t; 8] = std::mem::zeroed();
                dnn::get_convolution_backward_filter_algorithm(
                    h.0,
                    d.x,
                    d.y,
                    d.conv,
                    d.w,
                    8,
                    &mut n,
                    perf.as_mut_ptr(),
                )
                .map_err(e("cudnnGetConvolutionBackwardFilterAlgorithm_v7"))?;
                perf[..n.clamp(0, 8) as usize]
                    .iter()
                    .find(|q| usable(p, q.status, q.memory, q.mathType))
                    .map(|q| (Algo::BwdFilter(q.algo), q.mathType, q.memory))
            }
        }
    };
    let (algo, math_type, memory) = found.ok_or_else(|| {
        CudaError::Unsupported(format!(
            "cuDNN offers no usable {} algorithm for this shape",
            dir.name()
        ))
    })?;
    // SAFETY: live descriptor.
    unsafe { dnn::set_convolution_math_type(d.conv, math_type) }
        .map_err(e("cudnnSetConvolutionMathType"))?;
    Ok((algo, memory))
}

struct Tensors {
    x: DevBuf,
    w: DevBuf,
    y: DevBuf,
    hx: Vec<f64>,
    hw: Vec<f64>,
    hdy: Vec<f64>,
    dy: DevBuf,
}

fn run_once(h: &Handle, d: &Descs, t: &Tensors, algo: Algo, ws: &DevBuf) -> Result<(), CudaError> {
    // The output buffer `y` holds the largest of y, dx and dw.
    let operands = match algo {
        Algo::Fwd(_) => [t.x.ptr, t.w.ptr, t.y.ptr],
        Algo::BwdData(_) => [t.w.ptr, t.dy.ptr, t.y.ptr],
        Algo::BwdFilter(_) => [t.x.ptr, t.dy.ptr, t.y.ptr],
    };
    execute(h, d, algo, operands, (ws.ptr, ws.bytes))
}

/// Runs one convolution direction: `[x, w, y]` (forward), `[w, dy, dx]` (backward-data) or
/// `[x, dy, dw]` (backward-filter), device addresses, the output overwritten.
fn execute(
    h: &Handle,
    d: &Descs,
    algo: Algo,
    [a0, a1, out]: [u64; 3],
    (ws_ptr, ws_bytes): (u64, usize),
) -> Result<(), CudaError> {
    let (one, zero) = (1.0f32, 0.0f32);
    let (al, be) = (
        &one as *const f32 as *const c_void,
        &zero as *const f32 as *const c_void,
    );
    let (p0, p1, po) = (a0 as *const c_void, a1 as *const c_void, out as *mut c_void);
    let wsp = ws_ptr as *mut c_void;
    // SAFETY: live handle and descriptors; the algorithm came from cuDNN's heuristic for this
    // direction and these descriptors; the caller's buffers hold the tensors the descriptors
    // describe, and the workspace is at least the algorithm's.
    unsafe {
        match algo {
            Algo::Fwd(a) => dnn::convolution_forward(
                h.0, al, d.x, p0, d.w, p1, d.conv, a, wsp, ws_bytes, be, d.y, po,
            )
            .map_err(e("cudnnConvolutionForward")),
            Algo::BwdData(a) => dnn::convolution_backward_data(
                h.0, al, d.w, p0, d.y, p1, d.conv, a, wsp, ws_bytes, be, d.x, po,
            )
            .map_err(e("cudnnConvolutionBackwardData")),
            Algo::BwdFilter(a) => dnn::convolution_backward_filter(
                h.0, al, d.x, p0, d.y, p1, d.conv, a, wsp, ws_bytes, be, d.w, po,
            )
            .map_err(e("cudnnConvolutionBackwardFilter")),
        }
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
    hx: &[f64],
    hw: &[f64],
    hdy: &[f64],
    dir: Dir,
    idx: usize,
) -> (f64, f64) {
    let (oh, ow) = (s.oh() as isize, s.ow() as isize);
    let xi = |n: usize, y: isize, x: isize, c: usize| -> Option<f64> {
        if y < 0 || x < 0 || y >= s.h as isize || x >= s.w as isize {
            return None;
        }
        Some(hx[((n * s.h + y as usize) * s.w + x as usize) * s.c + c])
    };
    let wi = |k: usize, r: usize, q: usize, c: usize| hw[((k * s.r + r) * s.s + q) * s.c + c];
    let dyi = |n: usize, p: usize, q: usize, k: usize| {
        hdy[((n * oh as usize + p) * ow as usize + q) * s.k + k]
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
    let len = out_len(s, dir);
    let mut worst = 0.0f64;
    for j in 0..24usize {
        let idx = (j * 2_654_435_761usize) % len;
        let (want, abs) = reference(s, &t.hx, &t.hw, &t.hdy, dir, idx);
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

/// One training convolution on cuDNN: NHWC activations, KRSC filters, f32 accumulation, in
/// `p`'s storage type (f32, or f16/bf16 for mixed precision; tf32 stores f32 and lets the
/// tensor cores round the inputs). Each direction has its own descriptors and the algorithm
/// cuDNN's heuristic chose for it, with the math type that algorithm wants.
pub struct ConvPlan {
    pub shape: ConvShape,
    pub prec: Prec,
    descs: [Descs; 3],
    algos: [Algo; 3],
    /// Workspace bytes each direction needs; the caller passes (address, bytes) of a device
    /// buffer at least this large.
    pub workspace: usize,
}

impl ConvPlan {
    pub fn new(h: &Handle, shape: &ConvShape, p: Prec) -> Result<ConvPlan, CudaError> {
        if !matches!(p, Prec::F32 | Prec::Tf32 | Prec::F16 | Prec::Bf16) {
            return Err(CudaError::Unsupported(format!(
                "training convolutions in {}",
                p.name()
            )));
        }
        let descs = [descs(shape, p)?, descs(shape, p)?, descs(shape, p)?];
        let mut algos = Vec::with_capacity(3);
        let mut workspace = 0;
        for (i, dir) in DIRECTIONS.into_iter().enumerate() {
            let (a, m) = choose(h, &descs[i], p, dir)?;
            algos.push(a);
            workspace = workspace.max(m);
        }
        Ok(ConvPlan {
            shape: *shape,
            prec: p,
            descs,
            algos: [algos[0], algos[1], algos[2]],
            workspace,
        })
    }

    /// The algorithms, e.g. `fwd CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM`.
    pub fn describe(&self) -> String {
        DIRECTIONS
            .iter()
            .zip(&self.algos)
            .map(|(d, a)| format!("{} {}", d.name(), a.name()))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// y = conv(x, w).
    pub fn forward(
        &self,
        h: &Handle,
        x: u64,
        w: u64,
        y: u64,
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.run(h, 0, [x, w, y], ws)
    }

    /// dx = ∂L/∂x from dy and w.
    pub fn backward_data(
        &self,
        h: &Handle,
        w: u64,
        dy: u64,
        dx: u64,
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.run(h, 1, [w, dy, dx], ws)
    }

    /// dw = ∂L/∂w from x and dy (overwritten, not accumulated).
    pub fn backward_filter(
        &self,
        h: &Handle,
        x: u64,
        dy: u64,
        dw: u64,
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        self.run(h, 2, [x, dy, dw], ws)
    }

    fn run(
        &self,
        h: &Handle,
        i: usize,
        operands: [u64; 3],
        ws: (u64, usize),
    ) -> Result<(), CudaError> {
        let (_, ws_bytes) = ws;
        if ws_bytes < self.workspace {
            return Err(CudaError::Check(format!(
                "cuDNN workspace of {ws_bytes} bytes, the plan needs {}",
                self.workspace
            )));
        }
        execute(h, &self.descs[i], self.algos[i], operands, ws)
    }
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
        Mode::Quick => 16,
        Mode::Full => 32,
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
    let mut best: Vec<Option<(Stats, f64, String)>> = vec![None, None, None];
    let mut worst = 0.0f64;
    let (mut refused, mut measured) = (None, 0usize);
    for (li, layer) in layers.iter().enumerate() {
        let s = &layer.shape;
        // One descriptor set per direction, as in ConvPlan: `choose` sets the math type the
        // chosen algorithm wants on its descriptor, and a shared one would hand the forward
        // choice's math type to the backward heuristics.
        let ds = [descs(s, p)?, descs(s, p)?, descs(s, p)?];
        let mut rng = Rng(0xC0FFEE + li as u64);
        let hx: Vec<f64> = (0..s.n * s.h * s.w * s.c).map(|_| rng.value(p)).collect();
        let hw: Vec<f64> = (0..s.k * s.r * s.s * s.c).map(|_| rng.value(p)).collect();
        let hdy: Vec<f64> = (0..s.n * s.oh() * s.ow() * s.k)
            .map(|_| rng.value(p))
            .collect();
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
            x: gpu.upload(&encode(p, &hx))?,
            w: gpu.upload(&encode(p, &hw))?,
            dy: gpu.upload(&encode(p, &hdy))?,
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
            // cuDNN's refusal of one layer and direction (no usable algorithm, or the call
            // refused) costs that row only, noted; a wrong result still fails the precision.
            let attempt = choose(h, d, p, dir)
                .and_then(|(a, _)| run_once(h, d, &t, a, ws).map(|_| a))
                .map_err(super::blas::not_supported);
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
            let one = gpu.time(|| run_once(h, d, &t, algo, ws))?;
            let reps = ((if mode == Mode::Quick { 0.005 } else { 0.02 } / one.max(1e-6)).ceil()
                as usize)
                .clamp(1, 200);
            let mut rates = Vec::new();
            for _ in 0..(if mode == Mode::Quick { 3 } else { 5 }) {
                let tm = gpu.time(|| {
                    for _ in 0..reps {
                        run_once(h, d, &t, algo, ws)?;
                    }
                    Ok(())
                })?;
                rates.push(flops * reps as f64 / tm);
            }
            let Some(stats) = Stats::from_samples(&rates) else {
                continue;
            };
            let algo_name = algo.name();
            let shape = format!(
                "n={} c={} h={} w={} k={} r={} s={} stride={} pad={}",
                s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.stride, s.pad
            );
            if best[di].as_ref().is_none_or(|b| stats.max > b.0.max) {
                best[di] = Some((
                    stats.clone(),
                    flops,
                    format!("{} ({shape}), {algo_name}", layer.name),
                ));
            }
            rows[di].push(TableRow {
                name: layer.name.clone(),
                shape,
                precision: Some(p.name().into()),
                threads: 1,
                value: stats.max,
                stats,
                max_rel_error: Some(err),
                detail: Some(algo_name),
            });
        }
    }
    for (di, dir) in DIRECTIONS.into_iter().enumerate() {
        let Some((stats, flops, how)) = best[di].take() else {
            continue;
        };
        let mut c = Ceiling {
            id: format!("gpu{}/conv/{}/{}", gpu.ordinal, p.name(), dir.name()),
            kind: CeilingKind::Compute,
            value: stats.max,
            unit: "FLOP/s".into(),
            threads: 1,
            precision: Some(p.name().into()),
            level: None,
            stats,
            theoretical_peak: peak_for(peaks, gpu, p),
            above_peak: false,
            method: format!(
                "cuDNN {}, NHWC/KRSC, f32 accumulation{}, best over ResNet-50 v1.5's layer shapes: {how}; 24 entries per layer checked against f64 (normwise ≤ {:.0e}); CUDA-event timed",
                dir.name(),
                if p == Prec::F32 { ", FMA math (no TF32)" } else { ", tensor-op math" },
                p.tolerance()
            ),
            per_iteration: PerIteration { ops: flops, bytes: 0.0 },
        };
        c.flag_against_peak();
        out.ceilings.push(c);
        out.tables.push(Table {
            id: format!("gpu{}/conv/{}/{}/table", gpu.ordinal, p.name(), dir.name()),
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
                .map(|i| reference(&s, &hx, &hw, &hdy, dir, i).0 * other[i])
                .sum()
        };
        let a = dot(Dir::Fwd, &hdy);
        let b = dot(Dir::BwdData, &hx);
        let c = dot(Dir::BwdFilter, &hw);
        assert!((a - b).abs() < 1e-9 * a.abs().max(1.0), "{a} vs {b}");
        assert!((a - c).abs() < 1e-9 * a.abs().max(1.0), "{a} vs {c}");
    }
}
