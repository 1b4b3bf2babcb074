//! cuDNN wrapped for the convolution probe and the trainer: the handle, NHWC/KRSC descriptors
//! per precision (f32 accumulation), each direction's algorithm measured by cuDNN on the
//! operands ([`find`]: cudnnFind*AlgorithmEx, the fastest that fits the workspace) or from its
//! heuristic ([`choose`]: cudnnGet*Algorithm_v7, the first that fits), one direction run, and
//! [`ConvPlan`] (a training convolution's three directions). The probe section is
//! `probe::gpu::conv`.

use super::blas::Prec;
use super::device::Gpu;
use super::libs::{self, Lib};
use super::CudaError;
use crate::cpu::conv::ConvShape;
use cudarc::cudnn::{result as dnn, sys as dsys};
use std::ffi::c_void;

/// The three directions, in the order of a plan's descriptors and algorithms.
pub(crate) const DIRECTIONS: [Dir; 3] = [Dir::Fwd, Dir::BwdData, Dir::BwdFilter];
pub(crate) const WORKSPACE_LIMIT: usize = 512 << 20;
/// The most workspace an algorithm search offers cuDNN ([`ConvPlan::measured`]).
pub const SEARCH_WORKSPACE: usize = WORKSPACE_LIMIT;

/// A convolution's direction: the model's, whose roofs name it.
pub(crate) use roofline_model::ConvDir as Dir;

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
pub(crate) struct Descs {
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

pub(crate) fn descs(s: &ConvShape, p: Prec) -> Result<Descs, CudaError> {
    if s.stride == 0 || s.h + 2 * s.pad < s.r || s.w + 2 * s.pad < s.s {
        return Err(CudaError::Check(format!(
            "a {}×{} filter (stride {}, padding {}) does not fit a {}×{} input",
            s.r, s.s, s.stride, s.pad, s.h, s.w
        )));
    }
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

/// cuDNN's own output size (n, c, h, w) of `shape`'s convolution in `p`, from descriptors built
/// exactly as the probe and the trainers build them ([`descs`]); needs no handle and no GPU, so
/// the gate checks every layer's against the CPU model's on a machine without one. A
/// descriptor cuDNN refuses (`CUDNN_STATUS_BAD_PARAM`) is the error of the call that set it.
pub fn output_dims(shape: &ConvShape, p: Prec) -> Result<[usize; 4], CudaError> {
    libs::require(Lib::Cudnn)?;
    let d = descs(shape, p)?;
    let (mut n, mut c, mut h, mut w) = (0i32, 0i32, 0i32, 0i32);
    // SAFETY: live descriptors and four out-parameters.
    unsafe {
        dsys::cudnnGetConvolution2dForwardOutputDim(
            d.conv, d.x, d.w, &mut n, &mut c, &mut h, &mut w,
        )
    }
    .result()
    .map_err(e("cudnnGetConvolution2dForwardOutputDim"))?;
    Ok([n, c, h, w].map(|v| v.max(0) as usize))
}

/// cuDNN's version, the CUDA runtime it was built for, and its sub-libraries' own version
/// checks (`cudnnOpsVersionCheck`, `cudnnCnnVersionCheck`, `cudnnAdvVersionCheck`: each
/// fails when a sub-library of another version was loaded beside the dispatcher).
pub fn versions() -> Result<(usize, usize), CudaError> {
    libs::require(Lib::Cudnn)?;
    // SAFETY: no arguments; the checks only compare versions.
    unsafe {
        dsys::cudnnOpsVersionCheck()
            .result()
            .map_err(e("cudnnOpsVersionCheck"))?;
        dsys::cudnnCnnVersionCheck()
            .result()
            .map_err(e("cudnnCnnVersionCheck"))?;
        dsys::cudnnAdvVersionCheck()
            .result()
            .map_err(e("cudnnAdvVersionCheck"))?;
        Ok((dsys::cudnnGetVersion(), dsys::cudnnGetCudartVersion()))
    }
}

/// A cuDNN handle bound to one GPU's stream, destroyed on drop.
pub struct Handle(dsys::cudnnHandle_t);

impl Handle {
    /// A handle whose work goes to `gpu`'s stream.
    pub fn new(gpu: &Gpu) -> Result<Handle, CudaError> {
        libs::require(Lib::Cudnn)?;
        gpu.bind()?;
        let h = Handle(dnn::create_handle().map_err(e("cudnnCreate"))?);
        // SAFETY: live handle and stream.
        unsafe { dnn::set_stream(h.0, gpu.stream as dsys::cudaStream_t) }
            .map_err(e("cudnnSetStream"))?;
        Ok(h)
    }

    /// The raw handle, for the backend API (`cuda::dnn_graph`).
    pub(crate) fn raw(&self) -> dsys::cudnnHandle_t {
        self.0
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
pub(crate) enum Algo {
    Fwd(dsys::cudnnConvolutionFwdAlgo_t),
    BwdData(dsys::cudnnConvolutionBwdDataAlgo_t),
    BwdFilter(dsys::cudnnConvolutionBwdFilterAlgo_t),
}

impl Algo {
    pub(crate) fn name(&self) -> String {
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

/// One entry of cuDNN's algorithm lists (heuristic or measured), whichever direction.
trait AlgoPerf {
    fn entry(&self) -> (Algo, dsys::cudnnStatus_t, usize, dsys::cudnnMathType_t);
}

/// `AlgoPerf` for one direction's perf struct, its algorithm wrapped as `Algo::$dir`.
macro_rules! algo_perf {
    ($perf:ty, $dir:ident) => {
        impl AlgoPerf for $perf {
            fn entry(&self) -> (Algo, dsys::cudnnStatus_t, usize, dsys::cudnnMathType_t) {
                (
                    Algo::$dir(self.algo),
                    self.status,
                    self.memory,
                    self.mathType,
                )
            }
        }
    };
}
algo_perf!(dsys::cudnnConvolutionFwdAlgoPerf_t, Fwd);
algo_perf!(dsys::cudnnConvolutionBwdDataAlgoPerf_t, BwdData);
algo_perf!(dsys::cudnnConvolutionBwdFilterAlgoPerf_t, BwdFilter);

/// The first usable entry of the `n` cuDNN filled (within `workspace` bytes), with the math
/// type it wants set on `d`'s convolution descriptor; `none` is the error's words when there is
/// no such entry.
fn adopt<P: AlgoPerf>(
    d: &Descs,
    p: Prec,
    (perf, n): (&[P], i32),
    workspace: usize,
    none: impl FnOnce() -> String,
) -> Result<(Algo, usize), CudaError> {
    let (algo, _, memory, math_type) = perf[..n.clamp(0, perf.len() as i32) as usize]
        .iter()
        .map(AlgoPerf::entry)
        .find(|&(_, status, memory, m)| usable(p, status, memory, m) && memory <= workspace)
        .ok_or_else(|| CudaError::Unsupported(none()))?;
    // SAFETY: live descriptor.
    unsafe { dnn::set_convolution_math_type(d.conv, math_type) }
        .map_err(e("cudnnSetConvolutionMathType"))?;
    Ok((algo, memory))
}

/// The heuristic's first usable algorithm for `dir`, with the math type it wants set on the
/// convolution descriptor (cuDNN's rule for the _v7 heuristics).
pub(crate) fn choose(h: &Handle, d: &Descs, p: Prec, dir: Dir) -> Result<(Algo, usize), CudaError> {
    let mut n = 0i32;
    let none = || {
        format!(
            "cuDNN offers no usable {} algorithm for this shape",
            dir.name()
        )
    };
    // SAFETY: live handle and descriptors; out-arrays of the requested length; cuDNN fills
    // `n` ≤ 8 entries, the rest stay zeroed and are not read.
    unsafe {
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
                adopt(d, p, (&perf, n), WORKSPACE_LIMIT, none)
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
                adopt(d, p, (&perf, n), WORKSPACE_LIMIT, none)
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
                adopt(d, p, (&perf, n), WORKSPACE_LIMIT, none)
            }
        }
    }
}

/// Results asked of a search: cuDNN can list an algorithm twice (with and without tensor
/// cores), so twice the largest direction's algorithm count.
const FOUND: usize = 16;

/// The fastest usable algorithm for `dir` as cuDNN measures it on these operands
/// (`cudnnFind*AlgorithmEx`: every algorithm whose workspace fits `ws` is run and timed, and
/// the results come sorted by time), with the math type it wants set on the convolution
/// descriptor, as [`choose`] does for the heuristic's. `[a0, a1, out]` as [`execute`] takes
/// them: device buffers the descriptors describe; `out` is overwritten. The trainer's plans and
/// the probe's convolution ceilings both choose this way (PyTorch's `cudnn.benchmark`).
pub(crate) fn find(
    h: &Handle,
    d: &Descs,
    p: Prec,
    dir: Dir,
    [a0, a1, out]: [u64; 3],
    (ws_ptr, ws_bytes): (u64, usize),
) -> Result<(Algo, usize), CudaError> {
    let mut n = 0i32;
    let (p0, p1, po) = (a0 as *const c_void, a1 as *const c_void, out as *mut c_void);
    let (wsp, wsb) = (ws_ptr as *mut c_void, ws_bytes);
    let none = || {
        format!(
            "cuDNN measured no usable {} algorithm for this shape",
            dir.name()
        )
    };
    // SAFETY: live handle and descriptors; the caller's operands hold the tensors the
    // descriptors describe, and the workspace `ws_bytes`; out-arrays of the requested length,
    // of which cuDNN fills `n` ≤ FOUND (the rest stay zeroed and are not read).
    unsafe {
        match dir {
            Dir::Fwd => {
                let mut perf: [dsys::cudnnConvolutionFwdAlgoPerf_t; FOUND] = std::mem::zeroed();
                dsys::cudnnFindConvolutionForwardAlgorithmEx(
                    h.0,
                    d.x,
                    p0,
                    d.w,
                    p1,
                    d.conv,
                    d.y,
                    po,
                    FOUND as i32,
                    &mut n,
                    perf.as_mut_ptr(),
                    wsp,
                    wsb,
                )
                .result()
                .map_err(e("cudnnFindConvolutionForwardAlgorithmEx"))?;
                adopt(d, p, (&perf, n), ws_bytes, none)
            }
            Dir::BwdData => {
                let mut perf: [dsys::cudnnConvolutionBwdDataAlgoPerf_t; FOUND] = std::mem::zeroed();
                dsys::cudnnFindConvolutionBackwardDataAlgorithmEx(
                    h.0,
                    d.w,
                    p0,
                    d.y,
                    p1,
                    d.conv,
                    d.x,
                    po,
                    FOUND as i32,
                    &mut n,
                    perf.as_mut_ptr(),
                    wsp,
                    wsb,
                )
                .result()
                .map_err(e("cudnnFindConvolutionBackwardDataAlgorithmEx"))?;
                adopt(d, p, (&perf, n), ws_bytes, none)
            }
            Dir::BwdFilter => {
                let mut perf: [dsys::cudnnConvolutionBwdFilterAlgoPerf_t; FOUND] =
                    std::mem::zeroed();
                dsys::cudnnFindConvolutionBackwardFilterAlgorithmEx(
                    h.0,
                    d.x,
                    p0,
                    d.y,
                    p1,
                    d.conv,
                    d.w,
                    po,
                    FOUND as i32,
                    &mut n,
                    perf.as_mut_ptr(),
                    wsp,
                    wsb,
                )
                .result()
                .map_err(e("cudnnFindConvolutionBackwardFilterAlgorithmEx"))?;
                adopt(d, p, (&perf, n), ws_bytes, none)
            }
        }
    }
}

/// The math type set on `d`'s convolution descriptor.
/// Sets the math type on `d`'s convolution descriptor (a cached choice's).
pub(crate) fn set_math(d: &Descs, m: dsys::cudnnMathType_t) -> Result<(), CudaError> {
    // SAFETY: live descriptor.
    unsafe { dnn::set_convolution_math_type(d.conv, m) }.map_err(e("cudnnSetConvolutionMathType"))
}

pub(crate) fn math_of(d: &Descs) -> Result<dsys::cudnnMathType_t, CudaError> {
    let mut m = dsys::cudnnMathType_t::CUDNN_DEFAULT_MATH;
    // SAFETY: live descriptor, one out-parameter.
    unsafe { dsys::cudnnGetConvolutionMathType(d.conv, &mut m) }
        .result()
        .map_err(e("cudnnGetConvolutionMathType"))?;
    Ok(m)
}

/// Runs one convolution direction: `[x, w, y]` (forward), `[w, dy, dx]` (backward-data) or
/// `[x, dy, dw]` (backward-filter), device addresses, the output overwritten.
pub(crate) fn execute(
    h: &Handle,
    d: &Descs,
    algo: Algo,
    [a0, a1, out]: [u64; 3],
    (ws_ptr, ws_bytes): (u64, usize),
) -> Result<(), CudaError> {
    blend(h, d, algo, [a0, a1, out], (ws_ptr, ws_bytes), 0.0)
}

/// `execute` with the result blended into the output: out = result + beta · out (cuDNN's
/// scaling parameters, f32 for f32, f16 and bf16 data).
pub(crate) fn blend(
    h: &Handle,
    d: &Descs,
    algo: Algo,
    [a0, a1, out]: [u64; 3],
    (ws_ptr, ws_bytes): (u64, usize),
    beta: f32,
) -> Result<(), CudaError> {
    let one = 1.0f32;
    let (al, be) = (
        &one as *const f32 as *const c_void,
        &beta as *const f32 as *const c_void,
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

/// The workspace `algo` needs on `d` (cuDNN's answer; an error where it does not support the
/// algorithm for these descriptors).
pub(crate) fn workspace_of(h: &Handle, d: &Descs, algo: Algo) -> Result<usize, CudaError> {
    // SAFETY: live handle and descriptors.
    unsafe {
        match algo {
            Algo::Fwd(a) => {
                dnn::get_convolution_forward_workspace_size(h.0, d.x, d.w, d.conv, d.y, a)
                    .map_err(e("cudnnGetConvolutionForwardWorkspaceSize"))
            }
            Algo::BwdData(a) => {
                dnn::get_convolution_backward_data_workspace_size(h.0, d.w, d.y, d.conv, d.x, a)
                    .map_err(e("cudnnGetConvolutionBackwardDataWorkspaceSize"))
            }
            Algo::BwdFilter(a) => {
                dnn::get_convolution_backward_filter_workspace_size(h.0, d.x, d.y, d.conv, d.w, a)
                    .map_err(e("cudnnGetConvolutionBackwardFilterWorkspaceSize"))
            }
        }
    }
}

pub use super::dnn_plan::{ConvPlan, PlanChoice};
