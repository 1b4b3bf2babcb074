//! The trainer on one NVIDIA GPU: the same ResNet, layer for layer, on cuDNN (convolutions in
//! three directions), cuBLAS (the classifier) and the NVRTC kernels of `kernels/cuda/train.cu`
//! (batch norm, ReLU, residual adds, pooling, loss, SGD, casts), with f32 master weights and,
//! as an option, f16/bf16 convolutions with dynamic loss scaling. Data parallel over NCCL
//! (gradients) plus the CPU trainer's [`Reducer`] for the batch-norm statistics and the loss.
//!
//! Every CUDA call's status is checked and becomes an error naming the call; nothing here runs
//! without a driver (the caller gets `CudaError::Missing`). Written without a GPU to run it on:
//! [`self_test`] compares every layer, and one whole training step, with the CPU layers on
//! small shapes, and `roofline train --device cuda --check` runs it.

use crate::conv::ConvShape;
use crate::exchange::{CommOptions, Wire};
use crate::layers::{
    backward_coefficients, batch_statistics, global_sums, running_statistics, BatchNorm, Conv2d,
    Reducer,
};
use crate::resnet::{Bottleneck, ResNet};
use crate::tensor::Tensor;
use cudarc::cublas::{result as cublas, sys as bsys};
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use roofline_kernels::comm::nccl::{Communicator, Elem};
use roofline_kernels::cuda::blas::Prec;
use roofline_kernels::cuda::device::{self, arg, check, Event, Gpu};
use roofline_kernels::cuda::dnn::{ConvPlan, Handle};
use roofline_kernels::cuda::libs::{self, Lib};
use roofline_kernels::cuda::CudaError;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

/// The convolutions' storage precision on the GPU.
pub fn precision(name: &str) -> Result<Prec, String> {
    match name {
        "f32" => Ok(Prec::F32),
        "tf32" => Ok(Prec::Tf32),
        "f16" => Ok(Prec::F16),
        "bf16" => Ok(Prec::Bf16),
        _ => Err(format!(
            "--precision {name}: expected f32, tf32, f16 or bf16"
        )),
    }
}

fn half(p: Prec) -> bool {
    matches!(p, Prec::F16 | Prec::Bf16)
}

/// A stream-ordered device allocation (cuMemAllocAsync), freed on drop in stream order: work
/// enqueued before the free still sees it.
pub struct Buf {
    pub ptr: u64,
    pub bytes: usize,
    stream: sys::CUstream,
}

impl Drop for Buf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAllocAsync on `stream`, freed once, in stream order.
        unsafe {
            let _ = cu::free_async(self.ptr, self.stream);
        }
    }
}

/// A device NHWC f32 tensor.
pub struct GTensor {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub buf: Buf,
}

impl GTensor {
    pub fn len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn ptr(&self) -> u64 {
        self.buf.ptr
    }

    fn rows(&self) -> usize {
        self.n * self.h * self.w
    }
}

/// The GPU, its library handles, the compiled kernels and the cuDNN workspace.
///
/// Fields drop in declaration order, after `Drop::drop`: the cuDNN handle and the workspace
/// go first, and `gpu` (its stream and its hold on the primary context) last, so that no
/// library handle is destroyed in a released context.
pub struct Ctx {
    dnn: Handle,
    blas: bsys::cublasHandle_t,
    functions: HashMap<&'static str, sys::CUfunction>,
    workspace: Option<Buf>,
    pub prec: Prec,
    pub gpu: Gpu,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        let _ = self.gpu.sync();
        self.workspace = None;
        // SAFETY: created in `Ctx::new`, destroyed once.
        unsafe {
            let _ = cublas::destroy_handle(self.blas);
        }
    }
}

impl Ctx {
    /// Trains on `gpu` with convolutions in `prec` (cuDNN's absence is reported by
    /// `Handle::new`).
    pub fn new(gpu: Gpu, prec: Prec) -> Result<Ctx, CudaError> {
        if !libs::present(Lib::Cublas) {
            return Err(CudaError::Missing(libs::not_found(Lib::Cublas)));
        }
        gpu.bind()?;
        // Keep freed memory in the stream-ordered pool instead of returning it at every sync.
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: out-parameter; a valid device.
        check("cuDeviceGetDefaultMemPool", unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, gpu.dev).result()
        })?;
        let mut threshold = u64::MAX;
        // SAFETY: the attribute takes a u64.
        check("cuMemPoolSetAttribute(RELEASE_THRESHOLD)", unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                &mut threshold as *mut u64 as *mut c_void,
            )
            .result()
        })?;
        let dnn = Handle::new(&gpu)?;
        let blas = cublas::create_handle().map_err(|e| CudaError::call("cublasCreate", e))?;
        // SAFETY: live handle and stream.
        if let Err(e) = unsafe { cublas::set_stream(blas, gpu.stream as bsys::cudaStream_t) } {
            // SAFETY: created above.
            unsafe {
                let _ = cublas::destroy_handle(blas);
            }
            return Err(CudaError::call("cublasSetStream", e));
        }
        Ok(Ctx {
            dnn,
            blas,
            functions: HashMap::new(),
            workspace: None,
            prec,
            gpu,
        })
    }

    pub fn alloc(&self, bytes: usize) -> Result<Buf, CudaError> {
        // SAFETY: stream-ordered allocation on our live stream; freed by Buf's Drop.
        let ptr = check("cuMemAllocAsync", unsafe {
            cu::malloc_async(self.gpu.stream, bytes.max(4))
        })?;
        Ok(Buf {
            ptr,
            bytes,
            stream: self.gpu.stream,
        })
    }

    pub fn tensor(&self, n: usize, h: usize, w: usize, c: usize) -> Result<GTensor, CudaError> {
        Ok(GTensor {
            n,
            h,
            w,
            c,
            buf: self.alloc(4 * n * h * w * c)?,
        })
    }

    /// Copies `data` to `dst` in stream order (the host slice may be dropped on return).
    pub fn put<T: device::bytemuck_like::Pod>(
        &self,
        dst: u64,
        data: &[T],
    ) -> Result<(), CudaError> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: the caller's `dst` holds at least size_of_val(data) bytes; pageable source
        // memory is staged before the call returns.
        check("cuMemcpyHtoDAsync", unsafe {
            cu::memcpy_htod_async(dst, data, self.gpu.stream)
        })
    }

    pub fn upload_buf<T: device::bytemuck_like::Pod>(&self, data: &[T]) -> Result<Buf, CudaError> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        self.put(b.ptr, data)?;
        Ok(b)
    }

    pub fn upload(&self, t: &Tensor<f32>) -> Result<GTensor, CudaError> {
        let g = self.tensor(t.n, t.h, t.w, t.c)?;
        self.put(g.ptr(), &t.data)?;
        Ok(g)
    }

    /// `len` elements from `src`, after everything enqueued so far.
    pub fn get<T: device::bytemuck_like::Pod>(
        &self,
        src: u64,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        let mut v = vec![T::default(); len];
        if len == 0 {
            return Ok(v);
        }
        // SAFETY: `src` holds at least `len` elements; we wait for the copy before returning.
        check("cuMemcpyDtoHAsync", unsafe {
            cu::memcpy_dtoh_async(&mut v, src, self.gpu.stream)
        })?;
        self.gpu.sync()?;
        Ok(v)
    }

    pub fn download(&self, g: &GTensor) -> Result<Tensor<f32>, CudaError> {
        Ok(Tensor::from_vec(
            g.n,
            g.h,
            g.w,
            g.c,
            self.get(g.ptr(), g.len())?,
        ))
    }

    pub fn zero(&self, b: u64, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: the caller's buffer holds `bytes`; on our stream.
        check("cuMemsetD8Async", unsafe {
            cu::memset_d8_async(b, 0, bytes, self.gpu.stream)
        })
    }

    fn function(&mut self, name: &'static str) -> Result<sys::CUfunction, CudaError> {
        if let Some(f) = self.functions.get(name) {
            return Ok(*f);
        }
        let f = self.gpu.function(name)?;
        self.functions.insert(name, f);
        Ok(f)
    }

    /// Launches kernel `name` of train.cu over `n` elements (grid-stride: any grid is correct).
    ///
    /// # Safety
    /// `args` points to one value per kernel parameter, of the parameter's exact type, and
    /// every buffer they name stays alive until the kernel has run (stream-ordered frees).
    unsafe fn launch(
        &mut self,
        name: &'static str,
        n: usize,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let f = self.function(name)?;
        let block = 256u32;
        let grid = n
            .div_ceil(256)
            .clamp(1, (self.gpu.sms.max(1) * 16) as usize) as u32;
        // SAFETY: the caller's contract.
        unsafe { self.gpu.launch(f, grid, block, args) }
    }

    /// A cuDNN workspace of at least `bytes`.
    fn workspace(&mut self, bytes: usize) -> Result<&Buf, CudaError> {
        if self.workspace.as_ref().is_none_or(|w| w.bytes < bytes) {
            self.workspace = Some(self.alloc(bytes.max(1 << 20))?);
        }
        self.workspace
            .as_ref()
            .ok_or_else(|| CudaError::Check("no workspace".into()))
    }

    /// Casts `n` f32 values to the 16-bit storage type `p` (f16 or bf16) in a new buffer.
    fn cast_to_half(&mut self, src: u64, n: usize) -> Result<Buf, CudaError> {
        let out = self.alloc(2 * n)?;
        self.cast(self.prec == Prec::Bf16, true, src, out.ptr, n)?;
        Ok(out)
    }

    fn cast_from_half(&mut self, src: u64, dst: u64, n: usize) -> Result<(), CudaError> {
        self.cast(self.prec == Prec::Bf16, false, src, dst, n)
    }

    /// Casts `n` values between f32 and f16 (or bf16): to 16 bits when `narrow`.
    fn cast(
        &mut self,
        bf16: bool,
        narrow: bool,
        src: u64,
        dst: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        let k = match (bf16, narrow) {
            (false, true) => "f32_to_f16",
            (true, true) => "f32_to_bf16",
            (false, false) => "f16_to_f32",
            (true, false) => "bf16_to_f32",
        };
        let n64 = n as u64;
        // SAFETY: src holds n values of the source type, dst n of the destination type.
        unsafe { self.launch(k, n, &mut [arg(&src), arg(&dst), arg(&n64)]) }
    }

    /// Column-major `c(m×n) = op(a) · op(b)` in f32 on cuBLAS (`beta` 0: overwrite).
    #[allow(clippy::too_many_arguments)]
    fn sgemm(
        &self,
        ta: bool,
        tb: bool,
        m: usize,
        n: usize,
        k: usize,
        a: u64,
        lda: usize,
        b: u64,
        ldb: usize,
        c: u64,
        ldc: usize,
    ) -> Result<(), CudaError> {
        let op = |t: bool| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: live handle on our stream; the caller's buffers hold the matrices the sizes
        // and leading dimensions describe.
        unsafe {
            cublas::sgemm(
                self.blas,
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &one,
                a as *const f32,
                lda as i32,
                b as *const f32,
                ldb as i32,
                &zero,
                c as *mut f32,
                ldc as i32,
            )
        }
        .map_err(|e| CudaError::call("cublasSgemm", e))
    }
}

/// A parameter's place in the flat value/gradient/momentum buffers.
#[derive(Clone, Copy, Debug)]
struct Slot {
    off: usize,
    len: usize,
    decay: bool,
    /// A convolution filter: (depth = r·s·c, k), stored KRSC on the GPU, RSCK on the CPU.
    conv: Option<(usize, usize)>,
}

impl Slot {
    /// The GPU layout of a CPU parameter value (or momentum).
    fn device_layout(self, v: &[f32]) -> Vec<f32> {
        match self.conv {
            Some((depth, k)) => rsck_to_krsc(v, depth, k),
            None => v.to_vec(),
        }
    }

    fn host_layout(self, v: &[f32]) -> Vec<f32> {
        match self.conv {
            Some((depth, k)) => krsc_to_rsck(v, depth, k),
            None => v.to_vec(),
        }
    }
}

/// A parameter as `Flat::new` lays it out: (length, weight decay, convolution (depth, k)).
type ParamShape = (usize, bool, Option<(usize, usize)>);

/// All parameters in three flat device buffers, so that one allreduce covers every gradient.
struct Flat {
    values: Buf,
    grads: Buf,
    moms: Buf,
    slots: Vec<Slot>,
    total: usize,
}

impl Flat {
    /// Slots laid out one after the other for parameters of these lengths (CPU layout in
    /// `values` and `moms`, one per slot), uploaded in the GPU layout; gradients zeroed.
    fn new(
        ctx: &Ctx,
        params: &[ParamShape],
        values: &[&[f32]],
        moms: &[&[f32]],
    ) -> Result<Flat, CudaError> {
        let mut slots = Vec::with_capacity(params.len());
        let (mut hv, mut hm) = (Vec::new(), Vec::new());
        for ((&(len, decay, conv), v), m) in params.iter().zip(values).zip(moms) {
            let s = Slot {
                off: hv.len(),
                len,
                decay,
                conv,
            };
            hv.extend(s.device_layout(v));
            hm.extend(s.device_layout(m));
            slots.push(s);
        }
        let total = hv.len();
        let grads = ctx.alloc(4 * total)?;
        ctx.zero(grads.ptr, 4 * total)?;
        Ok(Flat {
            values: ctx.upload_buf(&hv)?,
            grads,
            moms: ctx.upload_buf(&hm)?,
            slots,
            total,
        })
    }

    fn value(&self, s: Slot) -> u64 {
        self.values.ptr + 4 * s.off as u64
    }
    fn grad(&self, s: Slot) -> u64 {
        self.grads.ptr + 4 * s.off as u64
    }
}

/// RSCK (the CPU's im2col order: depth × k) → KRSC (cuDNN's NHWC filters).
fn rsck_to_krsc(w: &[f32], depth: usize, k: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for d in 0..depth {
        for j in 0..k {
            t[j * depth + d] = w[d * k + j];
        }
    }
    t
}

fn krsc_to_rsck(w: &[f32], depth: usize, k: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for j in 0..k {
        for d in 0..depth {
            t[d * k + j] = w[j * depth + d];
        }
    }
    t
}

struct GConv {
    shape: ConvShape,
    w: Slot,
    plans: Vec<((usize, usize, usize), ConvPlan)>,
    input: Option<Rc<GTensor>>,
}

impl GConv {
    fn new(c: &Conv2d<f32>, w: Slot) -> GConv {
        GConv {
            shape: c.shape,
            w,
            plans: Vec::new(),
            input: None,
        }
    }

    fn shape_for(&self, x: &GTensor) -> ConvShape {
        ConvShape {
            n: x.n,
            h: x.h,
            w: x.w,
            ..self.shape
        }
    }

    fn plan(&mut self, ctx: &Ctx, sh: &ConvShape) -> Result<usize, CudaError> {
        let key = (sh.n, sh.h, sh.w);
        if let Some(i) = self.plans.iter().position(|(k, _)| *k == key) {
            return Ok(i);
        }
        self.plans
            .push((key, ConvPlan::new(&ctx.dnn, sh, ctx.prec)?));
        Ok(self.plans.len() - 1)
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: &Rc<GTensor>,
        train: bool,
    ) -> Result<GTensor, CudaError> {
        let sh = self.shape_for(x);
        let i = self.plan(ctx, &sh)?;
        let y = ctx.tensor(x.n, sh.oh(), sh.ow(), sh.k)?;
        let plan = &self.plans[i].1;
        if half(ctx.prec) {
            let xh = ctx.cast_to_half(x.ptr(), x.len())?;
            let wh = ctx.cast_to_half(flat.value(self.w), self.w.len)?;
            let yh = ctx.alloc(2 * y.len())?;
            let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
            plan.forward(&ctx.dnn, xh.ptr, wh.ptr, yh.ptr, ws)?;
            ctx.cast_from_half(yh.ptr, y.ptr(), y.len())?;
        } else {
            let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
            plan.forward(&ctx.dnn, x.ptr(), flat.value(self.w), y.ptr(), ws)?;
        }
        if train {
            self.input = Some(Rc::clone(x));
        }
        Ok(y)
    }

    /// The filter gradient into the flat gradients, and dx unless `data_grad` is false.
    fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        data_grad: bool,
    ) -> Result<Option<GTensor>, CudaError> {
        let x = self
            .input
            .take()
            .ok_or_else(|| CudaError::Check("convolution backward before forward".into()))?;
        let sh = self.shape_for(&x);
        let i = self.plan(ctx, &sh)?;
        let plan = &self.plans[i].1;
        let dw = flat.grad(self.w);
        if half(ctx.prec) {
            let xh = ctx.cast_to_half(x.ptr(), x.len())?;
            let wh = ctx.cast_to_half(flat.value(self.w), self.w.len)?;
            let dyh = ctx.cast_to_half(dy.ptr(), dy.len())?;
            let dwh = ctx.alloc(2 * self.w.len)?;
            let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
            plan.backward_filter(&ctx.dnn, xh.ptr, dyh.ptr, dwh.ptr, ws)?;
            ctx.cast_from_half(dwh.ptr, dw, self.w.len)?;
            if !data_grad {
                return Ok(None);
            }
            let dx = ctx.tensor(x.n, x.h, x.w, x.c)?;
            let dxh = ctx.alloc(2 * dx.len())?;
            let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
            plan.backward_data(&ctx.dnn, wh.ptr, dyh.ptr, dxh.ptr, ws)?;
            ctx.cast_from_half(dxh.ptr, dx.ptr(), dx.len())?;
            Ok(Some(dx))
        } else {
            let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
            plan.backward_filter(&ctx.dnn, x.ptr(), dy.ptr(), dw, ws)?;
            if !data_grad {
                return Ok(None);
            }
            let dx = ctx.tensor(x.n, x.h, x.w, x.c)?;
            let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
            plan.backward_data(&ctx.dnn, flat.value(self.w), dy.ptr(), dx.ptr(), ws)?;
            Ok(Some(dx))
        }
    }
}

struct GBn {
    c: usize,
    gamma: Slot,
    beta: Slot,
    running_mean: Vec<f32>,
    running_var: Vec<f32>,
    momentum: f64,
    eps: f64,
    input: Option<GTensor>,
    mean: Vec<f32>,
    inv: Vec<f32>,
    /// [mean | inv] on the device, for the backward pass.
    stats: Option<Buf>,
    reducer: Option<Arc<dyn Reducer>>,
}

impl GBn {
    fn new(b: &BatchNorm<f32>, gamma: Slot, beta: Slot, reducer: Option<Arc<dyn Reducer>>) -> GBn {
        GBn {
            c: b.gamma.value.len(),
            gamma,
            beta,
            running_mean: b.running_mean.clone(),
            running_var: b.running_var.clone(),
            momentum: b.momentum,
            eps: b.eps,
            input: None,
            mean: Vec::new(),
            inv: Vec::new(),
            stats: None,
            reducer,
        }
    }

    /// Per-channel (Σ g, Σ g·b) over this rank's rows, g = a masked by `mask` > 0, in f64.
    fn sums(
        &self,
        ctx: &mut Ctx,
        a: u64,
        b: u64,
        mask: u64,
        rows: usize,
    ) -> Result<(Vec<f64>, Vec<f64>), CudaError> {
        let c = self.c;
        let s = ctx.alloc(16 * c)?;
        ctx.zero(s.ptr, 16 * c)?;
        let tiles = c.div_ceil(32);
        let slices = (rows.div_ceil(8)).clamp(
            1,
            ((ctx.gpu.sms.max(1) as usize) * 8).div_ceil(tiles).max(1),
        );
        let f = ctx.function("bn_sums")?;
        let (rows64, ci, ti) = (rows as u64, c as i32, tiles as i32);
        let (s1, s2) = (s.ptr, s.ptr + 8 * c as u64);
        // SAFETY: a, b (or 0), mask (or 0) hold rows × c f32; s holds 2c f64; 256 threads per
        // block as the kernel assumes, and a grid that is a multiple of `tiles`.
        unsafe {
            ctx.gpu.launch(
                f,
                (tiles * slices) as u32,
                256,
                &mut [
                    arg(&a),
                    arg(&b),
                    arg(&mask),
                    arg(&rows64),
                    arg(&ci),
                    arg(&ti),
                    arg(&s1),
                    arg(&s2),
                ],
            )?
        };
        let mut v: Vec<f64> = ctx.get(s.ptr, 2 * c)?;
        let s2 = v.split_off(c);
        Ok(global_sums(self.reducer.as_ref(), (v, s2)))
    }

    fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: GTensor,
        train: bool,
        relu: bool,
    ) -> Result<GTensor, CudaError> {
        let c = self.c;
        let ranks = self.reducer.as_ref().map_or(1, |r| r.ranks());
        let m = (x.rows() * ranks) as f64;
        let (mean, inv): (Vec<f32>, Vec<f32>) = if train {
            let sums = self.sums(ctx, x.ptr(), 0, 0, x.rows())?;
            batch_statistics(
                sums,
                m,
                self.eps,
                self.momentum,
                &mut self.running_mean,
                &mut self.running_var,
            )
        } else {
            running_statistics(&self.running_mean, &self.running_var, self.eps)
        };
        let stats = ctx.upload_buf(&[&mean[..], &inv[..]].concat())?;
        let y = ctx.tensor(x.n, x.h, x.w, c)?;
        let (xp, yp, g, b) = (
            x.ptr(),
            y.ptr(),
            flat.value(self.gamma),
            flat.value(self.beta),
        );
        let (mp, ip) = (stats.ptr, stats.ptr + 4 * c as u64);
        let (n, ci, r) = (x.len() as u64, c as i32, relu as i32);
        // SAFETY: x, y hold n f32; gamma, beta, mean, inv hold c each.
        unsafe {
            ctx.launch(
                "bn_apply",
                x.len(),
                &mut [
                    arg(&xp),
                    arg(&yp),
                    arg(&g),
                    arg(&b),
                    arg(&mp),
                    arg(&ip),
                    arg(&n),
                    arg(&ci),
                    arg(&r),
                ],
            )?
        };
        if train {
            self.input = Some(x);
            self.mean = mean;
            self.inv = inv;
            self.stats = Some(stats);
        }
        Ok(y)
    }

    /// dx from dy (masked by `relu_out` > 0 when the forward pass applied ReLU); γ and β
    /// gradients into the flat gradients (each rank's share of the global sums, as on the CPU).
    fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        relu_out: Option<&GTensor>,
    ) -> Result<GTensor, CudaError> {
        let x = self
            .input
            .take()
            .ok_or_else(|| CudaError::Check("batch norm backward before forward".into()))?;
        let stats = self
            .stats
            .take()
            .ok_or_else(|| CudaError::Check("batch norm backward before forward".into()))?;
        let c = self.c;
        let ranks = self.reducer.as_ref().map_or(1, |r| r.ranks());
        let m = (dy.rows() * ranks) as f64;
        let mask = relu_out.map_or(0, |t| t.ptr());
        let sums = self.sums(ctx, dy.ptr(), x.ptr(), mask, dy.rows())?;
        let k = backward_coefficients(sums, &self.mean, &self.inv, m, ranks);
        ctx.put(flat.grad(self.gamma), &k.dgamma)?;
        ctx.put(flat.grad(self.beta), &k.dbeta)?;
        let means = [k.mean_g, k.mean_gx].concat();
        let mb = ctx.upload_buf(&means)?;
        let dx = ctx.tensor(dy.n, dy.h, dy.w, c)?;
        let (dyp, xp, dxp, g) = (dy.ptr(), x.ptr(), dx.ptr(), flat.value(self.gamma));
        let (mp, ip) = (stats.ptr, stats.ptr + 4 * c as u64);
        let (mdb, mdg) = (mb.ptr, mb.ptr + 4 * c as u64);
        let (n, ci) = (dy.len() as u64, c as i32);
        // SAFETY: dy, x, mask (or 0), dx hold n f32; the per-channel vectors c each.
        unsafe {
            ctx.launch(
                "bn_backward_dx",
                dy.len(),
                &mut [
                    arg(&dyp),
                    arg(&xp),
                    arg(&mask),
                    arg(&dxp),
                    arg(&g),
                    arg(&mp),
                    arg(&ip),
                    arg(&mdb),
                    arg(&mdg),
                    arg(&n),
                    arg(&ci),
                ],
            )?
        };
        Ok(dx)
    }
}

/// y op= s over n elements: "add_relu" (y = relu(y + s)), "add_into" (y += s), "relu_mask"
/// (s = 0 where y ≤ 0: here `y` is the forward output and `s` the gradient).
fn elementwise(ctx: &mut Ctx, k: &'static str, y: u64, s: u64, n: usize) -> Result<(), CudaError> {
    let n64 = n as u64;
    // SAFETY: both buffers hold n f32.
    unsafe { ctx.launch(k, n, &mut [arg(&y), arg(&s), arg(&n64)]) }
}

struct GBlock {
    c1: GConv,
    b1: GBn,
    c2: GConv,
    b2: GBn,
    c3: GConv,
    b3: GBn,
    down: Option<(GConv, GBn)>,
    a1: Option<Rc<GTensor>>,
    a2: Option<Rc<GTensor>>,
    out: Option<Rc<GTensor>>,
}

impl GBlock {
    fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: &Rc<GTensor>,
        train: bool,
    ) -> Result<Rc<GTensor>, CudaError> {
        let t = self.c1.forward(ctx, flat, x, train)?;
        let a = Rc::new(self.b1.forward(ctx, flat, t, train, true)?);
        let t = self.c2.forward(ctx, flat, &a, train)?;
        let b = Rc::new(self.b2.forward(ctx, flat, t, train, true)?);
        let t = self.c3.forward(ctx, flat, &b, train)?;
        let c = self.b3.forward(ctx, flat, t, train, false)?;
        let shortcut = match &mut self.down {
            Some((conv, bn)) => {
                let t = conv.forward(ctx, flat, x, train)?;
                Some(bn.forward(ctx, flat, t, train, false)?)
            }
            None => None,
        };
        let s = shortcut.as_ref().map_or(x.ptr(), |t| t.ptr());
        elementwise(ctx, "add_relu", c.ptr(), s, c.len())?;
        let out = Rc::new(c);
        if train {
            self.a1 = Some(a);
            self.a2 = Some(b);
            self.out = Some(Rc::clone(&out));
        }
        Ok(out)
    }

    fn backward(&mut self, ctx: &mut Ctx, flat: &Flat, d: GTensor) -> Result<GTensor, CudaError> {
        let missing = || CudaError::Check("block backward before forward".into());
        let out = self.out.take().ok_or_else(missing)?;
        let (a1, a2) = (
            self.a1.take().ok_or_else(missing)?,
            self.a2.take().ok_or_else(missing)?,
        );
        elementwise(ctx, "relu_mask", out.ptr(), d.ptr(), d.len())?;
        let t = self.b3.backward(ctx, flat, &d, None)?;
        let db = self.c3.backward(ctx, flat, &t, true)?.ok_or_else(missing)?;
        let t = self.b2.backward(ctx, flat, &db, Some(&a2))?;
        let da = self.c2.backward(ctx, flat, &t, true)?.ok_or_else(missing)?;
        let t = self.b1.backward(ctx, flat, &da, Some(&a1))?;
        let dx = self.c1.backward(ctx, flat, &t, true)?.ok_or_else(missing)?;
        match &mut self.down {
            Some((conv, bn)) => {
                let t = bn.backward(ctx, flat, &d, None)?;
                let ds = conv.backward(ctx, flat, &t, true)?.ok_or_else(missing)?;
                elementwise(ctx, "add_into", dx.ptr(), ds.ptr(), dx.len())?;
            }
            None => elementwise(ctx, "add_into", dx.ptr(), d.ptr(), dx.len())?,
        }
        Ok(dx)
    }
}

/// Loss scaling for f16 (bf16 and f32 need none): start at 2¹⁰, halve on an overflow (and skip
/// that step), double after 1000 steps without one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScale {
    pub scale: f64,
    good: usize,
    dynamic: bool,
}

impl LossScale {
    /// Dynamic for f16 convolutions, and for f16 gradients on the wire (NCCL sums them in f16:
    /// an overflow skips the step and halves the scale; the scale keeps small gradients out of
    /// f16's subnormals).
    pub fn for_step(p: Prec, wire: Wire) -> LossScale {
        let dynamic = p == Prec::F16 || wire == Wire::F16;
        LossScale {
            scale: if dynamic { 1024.0 } else { 1.0 },
            good: 0,
            dynamic,
        }
    }

    /// After a step: whether to apply it (no overflow), and the scale for the next one.
    pub fn update(&mut self, overflow: bool) -> bool {
        if !self.dynamic {
            return !overflow;
        }
        if overflow {
            self.scale = (self.scale / 2.0).max(1.0);
            self.good = 0;
            return false;
        }
        self.good += 1;
        if self.good >= 1000 {
            self.scale *= 2.0;
            self.good = 0;
        }
        true
    }
}

/// ResNet on the GPU, built from (and written back into) the CPU model.
pub struct GpuResNet {
    flat: Flat,
    stem: GConv,
    stem_bn: GBn,
    blocks: Vec<GBlock>,
    fc_w: Slot,
    fc_b: Slot,
    fc_in: usize,
    fc_out: usize,
    stem_out: Option<Rc<GTensor>>,
    pool_arg: Option<Buf>,
    pool_in: (usize, usize, usize, usize),
    pool_in_hw: (usize, usize),
    last: Option<GTensor>,
    pub loss_scale: LossScale,
    /// Steps skipped because the scaled gradients overflowed.
    pub skipped: usize,
    sync: Option<GradSync>,
    /// Declared last: dropped after every buffer above has been freed on its stream.
    pub ctx: Ctx,
}

/// The NCCL side of a step. The flat gradients are laid out in the forward order, so what the
/// backward pass has finished is always a suffix `[lo, total)`: each bucket is the newly
/// finished stretch, summed on the communicator's stream once the compute stream gets there
/// (an event, no host wait) while the backward pass goes on.
struct GradSync {
    nccl: Communicator,
    opts: CommOptions,
    /// The gradients in the wire's 16-bit format, when compressed.
    wire: Option<Buf>,
    ready: Event,
    done: Event,
    /// Gradients from here on are queued.
    sent: usize,
    bytes: f64,
}

impl GradSync {
    fn new(
        ctx: &Ctx,
        nccl: Communicator,
        opts: CommOptions,
        total: usize,
    ) -> Result<GradSync, CudaError> {
        let wire = match opts.wire {
            Wire::F32 => None,
            _ => Some(ctx.alloc(2 * total)?),
        };
        Ok(GradSync {
            nccl,
            opts,
            wire,
            ready: Event::new()?,
            done: Event::new()?,
            sent: total,
            bytes: 0.0,
        })
    }

    fn begin(&mut self, total: usize) {
        self.sent = total;
        self.bytes = 0.0;
    }

    /// The backward pass has finished the gradients from `lo` on.
    fn finished(&mut self, ctx: &mut Ctx, flat: &Flat, lo: usize) -> Result<(), CudaError> {
        if self.opts.overlap && self.sent - lo >= self.opts.bucket.max(1) {
            self.send(ctx, flat, lo)?;
        }
        Ok(())
    }

    /// Queues the sums of `[lo, sent)`, in buckets from the top.
    fn send(&mut self, ctx: &mut Ctx, flat: &Flat, lo: usize) -> Result<(), CudaError> {
        let (hi, bucket) = (self.sent, self.opts.bucket.max(1));
        if hi <= lo {
            return Ok(());
        }
        let n = hi - lo;
        let elem = match self.opts.wire {
            Wire::F32 => Elem::F32,
            Wire::F16 => Elem::F16,
            Wire::Bf16 => Elem::Bf16,
        };
        let (base, width) = match &self.wire {
            Some(w) => {
                ctx.cast(
                    elem == Elem::Bf16,
                    true,
                    flat.grads.ptr + 4 * lo as u64,
                    w.ptr + 2 * lo as u64,
                    n,
                )?;
                (w.ptr, 2)
            }
            None => (flat.grads.ptr, 4),
        };
        // The communicator's stream starts when the compute stream has got here.
        self.ready.record_on(&ctx.gpu)?;
        self.ready.wait_on(&self.nccl.gpu)?;
        let mut top = hi;
        while top > lo {
            let start = top.saturating_sub(bucket).max(lo);
            self.nccl
                .all_reduce_sum(base + (width * start) as u64, top - start, elem)?;
            top = start;
        }
        self.bytes += (n * elem.bytes()) as f64;
        self.sent = lo;
        ctx.gpu.bind()
    }

    /// Queues the rest, and makes the compute stream wait for every sum (and widen them back).
    fn end(&mut self, ctx: &mut Ctx, flat: &Flat) -> Result<(), CudaError> {
        self.send(ctx, flat, 0)?;
        self.done.record_on(&self.nccl.gpu)?;
        self.done.wait_on(&ctx.gpu)?;
        ctx.gpu.bind()?;
        if let Some(w) = &self.wire {
            ctx.cast(
                self.opts.wire == Wire::Bf16,
                false,
                w.ptr,
                flat.grads.ptr,
                flat.total,
            )?;
        }
        Ok(())
    }
}

impl GpuResNet {
    /// Uploads `model` (parameters, running statistics) to `ctx`'s GPU. With `nccl`, gradients
    /// are summed over its ranks; `reducer` (the same ranks) sums the batch-norm statistics.
    pub fn new(
        ctx: Ctx,
        model: &mut ResNet<f32>,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<GpuResNet, CudaError> {
        // The order of `model.params()`; convolution filters (and momenta) go KRSC.
        let convs = conv_shapes(model);
        let params = model.params();
        let layout: Vec<_> = params
            .iter()
            .map(|p| (p.value.len(), p.decay, convs.get(&p.name).copied()))
            .collect();
        if layout.iter().filter(|l| l.2.is_some()).count() != convs.len() {
            return Err(CudaError::Check(
                "a convolution filter is missing from the parameters".into(),
            ));
        }
        let values: Vec<&[f32]> = params.iter().map(|p| &p.value[..]).collect();
        let moms: Vec<&[f32]> = params.iter().map(|p| &p.momentum[..]).collect();
        let flat = Flat::new(&ctx, &layout, &values, &moms)?;
        let mut it = flat.slots.clone().into_iter();
        let mut next = || {
            it.next()
                .ok_or_else(|| CudaError::Check("parameter list".into()))
        };
        let r = || reducer.clone();
        let stem = GConv::new(&model.stem, next()?);
        let stem_bn = GBn::new(&model.stem_bn, next()?, next()?, r());
        let mut blocks = Vec::new();
        for b in &model.blocks {
            blocks.push(gblock(b, &mut next, &r)?);
        }
        let fc_w = next()?;
        let fc_b = next()?;
        let prec = ctx.prec;
        let sync = match nccl {
            Some(c) => Some(GradSync::new(&ctx, c, comm, flat.total)?),
            None => None,
        };
        let wire = if sync.is_some() { comm.wire } else { Wire::F32 };
        Ok(GpuResNet {
            ctx,
            flat,
            stem,
            stem_bn,
            blocks,
            fc_w,
            fc_b,
            fc_in: model.fc.inputs,
            fc_out: model.fc.outputs,
            stem_out: None,
            pool_arg: None,
            pool_in: (0, 0, 0, 0),
            pool_in_hw: (0, 0),
            last: None,
            loss_scale: LossScale::for_step(prec, wire),
            skipped: 0,
            sync,
        })
    }

    /// Logits (rows × classes) for an NHWC batch on the device.
    fn forward(&mut self, x: GTensor, train: bool) -> Result<GTensor, CudaError> {
        let x = Rc::new(x);
        let t = self.stem.forward(&mut self.ctx, &self.flat, &x, train)?;
        let s = Rc::new(
            self.stem_bn
                .forward(&mut self.ctx, &self.flat, t, train, true)?,
        );
        // Max pool 3×3 / 2, padding 1.
        let (oh, ow) = ((s.h + 2 - 3) / 2 + 1, (s.w + 2 - 3) / 2 + 1);
        let p = self.ctx.tensor(s.n, oh, ow, s.c)?;
        let argb = self.ctx.alloc(4 * p.len())?;
        let (sp, pp, ap) = (s.ptr(), p.ptr(), argb.ptr);
        let dims = [
            s.n as i32, s.h as i32, s.w as i32, s.c as i32, oh as i32, ow as i32,
        ];
        // SAFETY: s holds n·h·w·c, p and arg n·oh·ow·c elements.
        unsafe {
            self.ctx.launch(
                "maxpool_forward",
                p.len(),
                &mut [
                    arg(&sp),
                    arg(&pp),
                    arg(&ap),
                    arg(&dims[0]),
                    arg(&dims[1]),
                    arg(&dims[2]),
                    arg(&dims[3]),
                    arg(&dims[4]),
                    arg(&dims[5]),
                ],
            )?
        };
        if train {
            self.pool_arg = Some(argb);
            self.pool_in = (s.n, s.h, s.w, s.c);
            self.stem_out = Some(Rc::clone(&s));
        }
        let mut h = Rc::new(p);
        for b in &mut self.blocks {
            h = b.forward(&mut self.ctx, &self.flat, &h, train)?;
        }
        // Global average pool → n × c.
        let pooled = self.ctx.tensor(h.n, 1, 1, h.c)?;
        let (hp, op) = (h.ptr(), pooled.ptr());
        let (n, hw, c) = (h.n as i32, (h.h * h.w) as i32, h.c as i32);
        // SAFETY: h holds n·hw·c, pooled n·c.
        unsafe {
            self.ctx.launch(
                "avgpool_forward",
                h.n * h.c,
                &mut [arg(&hp), arg(&op), arg(&n), arg(&hw), arg(&c)],
            )?
        };
        // Classifier: y (n × out) = pooled (n × in) · W (in × out) + b, row-major, as the
        // column-major yᵀ = Wᵀ · pooledᵀ.
        let y = self.ctx.tensor(h.n, 1, 1, self.fc_out)?;
        self.ctx.sgemm(
            false,
            false,
            self.fc_out,
            h.n,
            self.fc_in,
            self.flat.value(self.fc_w),
            self.fc_out,
            pooled.ptr(),
            self.fc_in,
            y.ptr(),
            self.fc_out,
        )?;
        let (yp, bp, ny, k) = (
            y.ptr(),
            self.flat.value(self.fc_b),
            y.len() as u64,
            self.fc_out as i32,
        );
        // SAFETY: y holds n·out, b out elements.
        unsafe {
            self.ctx.launch(
                "add_bias",
                y.len(),
                &mut [arg(&yp), arg(&bp), arg(&ny), arg(&k)],
            )?
        };
        if train {
            self.last = Some(pooled);
            self.pool_in_hw = (h.h, h.w);
        }
        Ok(y)
    }
}

/// (depth = r·s·c, k) of every convolution filter, by parameter name.
fn conv_shapes(model: &ResNet<f32>) -> HashMap<String, (usize, usize)> {
    let mut v = HashMap::new();
    let mut add = |c: &Conv2d<f32>| {
        v.insert(c.weight.name.clone(), (c.shape.depth(), c.shape.k));
    };
    add(&model.stem);
    for b in &model.blocks {
        add(&b.conv1);
        add(&b.conv2);
        add(&b.conv3);
        if let Some((c, _)) = &b.down {
            add(c);
        }
    }
    v
}

fn gblock(
    b: &Bottleneck<f32>,
    next: &mut impl FnMut() -> Result<Slot, CudaError>,
    r: &impl Fn() -> Option<Arc<dyn Reducer>>,
) -> Result<GBlock, CudaError> {
    let c1 = GConv::new(&b.conv1, next()?);
    let b1 = GBn::new(&b.bn1, next()?, next()?, r());
    let c2 = GConv::new(&b.conv2, next()?);
    let b2 = GBn::new(&b.bn2, next()?, next()?, r());
    let c3 = GConv::new(&b.conv3, next()?);
    let b3 = GBn::new(&b.bn3, next()?, next()?, r());
    let down = match &b.down {
        Some((c, bn)) => {
            let gc = GConv::new(c, next()?);
            Some((gc, GBn::new(bn, next()?, next()?, r())))
        }
        None => None,
    };
    Ok(GBlock {
        c1,
        b1,
        c2,
        b2,
        c3,
        b3,
        down,
        a1: None,
        a2: None,
        out: None,
    })
}

/// What one training step reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// Mean loss over this rank's rows.
    pub loss: f64,
    pub top1: usize,
    pub top5: usize,
    /// Bytes this rank put into gradient allreduces.
    pub comm_bytes: f64,
    /// False when a loss-scale overflow skipped the update.
    pub applied: bool,
}

impl GpuResNet {
    fn backward(&mut self, dlogits: &GTensor) -> Result<(), CudaError> {
        let missing = || CudaError::Check("backward before a training forward pass".into());
        let pooled = self.last.take().ok_or_else(missing)?;
        let (rows, out, inp) = (dlogits.rows(), self.fc_out, self.fc_in);
        let ctx = &mut self.ctx;
        let flat = &self.flat;
        let mut sync = self.sync.as_mut();
        if let Some(g) = sync.as_deref_mut() {
            g.begin(flat.total);
        }
        // dW (in × out) = pooledᵀ · dy: column-major dWᵀ = dyᵀ · pooled.
        ctx.sgemm(
            false,
            true,
            out,
            inp,
            rows,
            dlogits.ptr(),
            out,
            pooled.ptr(),
            inp,
            flat.grad(self.fc_w),
            out,
        )?;
        let (dyp, dbp, ri, ki) = (dlogits.ptr(), flat.grad(self.fc_b), rows as i32, out as i32);
        // SAFETY: dy holds rows × out, db out elements.
        unsafe {
            ctx.launch(
                "column_sums",
                out,
                &mut [arg(&dyp), arg(&dbp), arg(&ri), arg(&ki)],
            )?
        };
        if let Some(g) = sync.as_deref_mut() {
            g.finished(ctx, flat, self.fc_w.off.min(self.fc_b.off))?;
        }
        // dpooled (n × in) = dy · Wᵀ: column-major dpooledᵀ = W · dyᵀ.
        let dp = ctx.tensor(rows, 1, 1, inp)?;
        ctx.sgemm(
            true,
            false,
            inp,
            rows,
            out,
            flat.value(self.fc_w),
            out,
            dlogits.ptr(),
            out,
            dp.ptr(),
            inp,
        )?;
        let (hh, hw) = self.pool_in_hw;
        let mut d = ctx.tensor(rows, hh, hw, inp)?;
        let (dpp, dp2, n, hwi, c) = (dp.ptr(), d.ptr(), rows as i32, (hh * hw) as i32, inp as i32);
        // SAFETY: dp holds n × c, d n × hw × c.
        unsafe {
            ctx.launch(
                "avgpool_backward",
                d.len(),
                &mut [arg(&dpp), arg(&dp2), arg(&n), arg(&hwi), arg(&c)],
            )?
        };
        for b in self.blocks.iter_mut().rev() {
            d = b.backward(ctx, flat, d)?;
            if let Some(g) = sync.as_deref_mut() {
                g.finished(ctx, flat, b.c1.w.off)?;
            }
        }
        // Max pool backward: scatter-add into a zeroed input gradient.
        let (n, h, w, c) = self.pool_in;
        let ds = ctx.tensor(n, h, w, c)?;
        ctx.zero(ds.ptr(), 4 * ds.len())?;
        let argb = self.pool_arg.take().ok_or_else(missing)?;
        let (dp3, ap, dsp) = (d.ptr(), argb.ptr, ds.ptr());
        let (ni, hwc, per) = (n as i32, (h * w * c) as i32, (d.h * d.w * d.c) as i32);
        // SAFETY: d and arg hold n × per_out, ds n × h·w·c elements; arg < h·w·c.
        unsafe {
            ctx.launch(
                "maxpool_backward",
                d.len(),
                &mut [
                    arg(&dp3),
                    arg(&ap),
                    arg(&dsp),
                    arg(&ni),
                    arg(&hwc),
                    arg(&per),
                ],
            )?
        };
        let s = self.stem_out.take().ok_or_else(missing)?;
        let dstem = self.stem_bn.backward(ctx, flat, &ds, Some(&s))?;
        // The image needs no gradient: the stem's filter gradient only.
        self.stem.backward(ctx, flat, &dstem, false)?;
        if let Some(g) = sync {
            g.end(ctx, flat)?;
        }
        Ok(())
    }

    /// Softmax cross-entropy of `z` against `labels`: (mean loss, top-1, top-5, ∂loss/∂z × the
    /// loss scale).
    fn loss(
        &mut self,
        z: &GTensor,
        labels: &[usize],
        smoothing: f64,
        scale: f64,
    ) -> Result<(f64, usize, usize, GTensor), CudaError> {
        let rows = z.rows();
        if labels.len() != rows {
            return Err(CudaError::Check(format!(
                "{} labels for {rows} rows",
                labels.len()
            )));
        }
        let l32: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
        if l32.iter().any(|&l| l < 0 || l as usize >= z.c) {
            return Err(CudaError::Check("label out of range".into()));
        }
        let lb = self.ctx.upload_buf(&l32)?;
        let grad = self.ctx.tensor(z.n, z.h, z.w, z.c)?;
        let lossb = self.ctx.alloc(8 * rows)?;
        let rankb = self.ctx.alloc(4 * rows)?;
        let (zp, lp, gp, losp, rp) = (z.ptr(), lb.ptr, grad.ptr(), lossb.ptr, rankb.ptr);
        let (ri, ki, sm, sc) = (rows as i32, z.c as i32, smoothing as f32, scale as f32);
        // SAFETY: z and grad hold rows × k f32, labels rows i32 in [0, k), loss rows f64, rank
        // rows i32.
        unsafe {
            self.ctx.launch(
                "softmax_xent",
                rows,
                &mut [
                    arg(&zp),
                    arg(&lp),
                    arg(&gp),
                    arg(&losp),
                    arg(&rp),
                    arg(&ri),
                    arg(&ki),
                    arg(&sm),
                    arg(&sc),
                ],
            )?
        };
        let losses: Vec<f64> = self.ctx.get(lossb.ptr, rows)?;
        let ranks: Vec<i32> = self.ctx.get(rankb.ptr, rows)?;
        let top1 = ranks.iter().filter(|&&r| r == 1).count();
        let top5 = ranks.iter().filter(|&&r| r <= 5).count();
        Ok((
            losses.iter().sum::<f64>() / rows.max(1) as f64,
            top1,
            top5,
            grad,
        ))
    }

    /// One training step on this rank's share of the batch: forward, loss, backward, gradient
    /// allreduce (NCCL, in buckets), loss-scale check, SGD at `lr`.
    pub fn step(
        &mut self,
        x: &Tensor<f32>,
        labels: &[usize],
        lr: f64,
        smoothing: f64,
        sgd: &crate::train::Sgd,
    ) -> Result<StepResult, CudaError> {
        self.ctx.gpu.bind()?;
        let xg = self.ctx.upload(x)?;
        let z = self.forward(xg, true)?;
        let scale = self.loss_scale.scale;
        let (loss, top1, top5, g) = self.loss(&z, labels, smoothing, scale)?;
        self.backward(&g)?;
        // The sums were queued during the backward pass, and the compute stream waits for them.
        let (comm_bytes, ranks) = self
            .sync
            .as_ref()
            .map_or((0.0, 1), |g| (g.bytes, g.nccl.ranks));
        let overflow = if self.loss_scale.dynamic {
            let flag = self.ctx.alloc(4)?;
            self.ctx.zero(flag.ptr, 4)?;
            let (gp, n, fp) = (self.flat.grads.ptr, self.flat.total as u64, flag.ptr);
            // SAFETY: the gradients hold `total` f32, flag one i32.
            unsafe {
                self.ctx.launch(
                    "nonfinite",
                    self.flat.total,
                    &mut [arg(&gp), arg(&n), arg(&fp)],
                )?
            };
            self.ctx.get::<i32>(flag.ptr, 1)?[0] != 0
        } else {
            false
        };
        let applied = self.loss_scale.update(overflow);
        if applied {
            let inv = (1.0 / (scale * ranks as f64)) as f32;
            let (lr32, mu) = (lr as f32, sgd.momentum as f32);
            for &s in &self.flat.slots {
                let wd = if s.decay || sgd.decay_all {
                    sgd.weight_decay as f32
                } else {
                    0.0
                };
                let (w, g, m, n) = (
                    self.flat.value(s),
                    self.flat.grad(s),
                    self.flat.moms.ptr + 4 * s.off as u64,
                    s.len as u64,
                );
                // SAFETY: each slot's value, gradient and momentum hold `len` f32.
                unsafe {
                    self.ctx.launch(
                        "sgd_step",
                        s.len,
                        &mut [
                            arg(&w),
                            arg(&g),
                            arg(&m),
                            arg(&n),
                            arg(&lr32),
                            arg(&mu),
                            arg(&wd),
                            arg(&inv),
                        ],
                    )?
                };
            }
        } else {
            self.skipped += 1;
        }
        self.ctx.gpu.sync()?;
        Ok(StepResult {
            loss,
            top1,
            top5,
            comm_bytes,
            applied,
        })
    }

    /// Inference logits for a batch.
    pub fn logits(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, CudaError> {
        self.ctx.gpu.bind()?;
        let xg = self.ctx.upload(x)?;
        let z = self.forward(xg, false)?;
        self.ctx.download(&z)
    }

    /// Writes the parameters, momenta and running statistics back into `model` (checkpoints,
    /// evaluation on the CPU, the summary).
    pub fn store(&mut self, model: &mut ResNet<f32>) -> Result<(), CudaError> {
        let values: Vec<f32> = self.ctx.get(self.flat.values.ptr, self.flat.total)?;
        let moms: Vec<f32> = self.ctx.get(self.flat.moms.ptr, self.flat.total)?;
        for (p, s) in model.params().into_iter().zip(&self.flat.slots) {
            p.value = s.host_layout(&values[s.off..s.off + s.len]);
            p.momentum = s.host_layout(&moms[s.off..s.off + s.len]);
        }
        let mut bns: Vec<&GBn> = vec![&self.stem_bn];
        for b in &self.blocks {
            bns.extend([&b.b1, &b.b2, &b.b3]);
            if let Some((_, bn)) = &b.down {
                bns.push(bn);
            }
        }
        for ((_, mean, var), bn) in model.running_stats().into_iter().zip(bns) {
            mean.clone_from(&bn.running_mean);
            var.clone_from(&bn.running_var);
        }
        Ok(())
    }
}

/// One comparison of the self-test: what, the normwise relative error, the tolerance.
#[derive(Clone, Debug, PartialEq)]
pub struct Check {
    pub name: String,
    pub error: f64,
    pub tolerance: f64,
}

impl Check {
    pub fn passed(&self) -> bool {
        self.error <= self.tolerance
    }
}

/// ‖a − b‖ / max(‖b‖, tiny): the normwise relative error of GPU `a` against CPU `b`.
pub fn normwise(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let (mut d, mut n) = (0.0f64, 0.0f64);
    for (x, y) in a.iter().zip(b) {
        d += (*x as f64 - *y as f64).powi(2);
        n += (*y as f64).powi(2);
    }
    if !d.is_finite() {
        return f64::INFINITY;
    }
    d.sqrt() / n.sqrt().max(1e-30)
}

/// Normwise tolerance of a comparison in precision `p` (f32 sums in another order; tf32 and
/// the 16-bit formats round the convolution inputs).
pub fn tolerance(p: Prec) -> f64 {
    match p {
        Prec::F32 => 1e-4,
        Prec::Tf32 => 5e-3,
        Prec::Bf16 => 3e-2,
        _ => 1e-2,
    }
}

fn random(n: usize, rng: &mut crate::data::Rng) -> Vec<f32> {
    (0..n).map(|_| rng.normal() as f32).collect()
}

/// A flat parameter store holding `values` (CPU layout; convolution filters of (depth, k)
/// when `conv`) with zero momenta, for single-layer tests.
fn flat_of(ctx: &Ctx, values: &[&[f32]], conv: Option<(usize, usize)>) -> Result<Flat, CudaError> {
    let layout: Vec<ParamShape> = values.iter().map(|v| (v.len(), false, conv)).collect();
    let zeros: Vec<Vec<f32>> = values.iter().map(|v| vec![0.0; v.len()]).collect();
    let moms: Vec<&[f32]> = zeros.iter().map(|z| &z[..]).collect();
    Flat::new(ctx, &layout, values, &moms)
}

/// Compares every GPU layer with the CPU layer on small shapes, in precision `p`: convolution
/// (forward, backward-data, backward-filter) at 1×1, 3×3 stride 2 and 7×7 stride 2; batch norm
/// with ReLU (forward, running statistics, backward); then one whole training step of a small
/// ResNet (max pool, residual adds, average pool, classifier, loss, SGD): the loss, every
/// parameter and every running statistic after the step, and the inference logits.
pub fn self_test(gpu: Gpu, p: Prec) -> Result<Vec<Check>, CudaError> {
    let mut ctx = Ctx::new(gpu, p)?;
    let tol = tolerance(p);
    let mut out = Vec::new();
    let mut rng = crate::data::Rng::new(0x5E1F);
    let push = |out: &mut Vec<Check>, name: String, error: f64, tolerance: f64| {
        out.push(Check {
            name,
            error,
            tolerance,
        })
    };
    for (name, r, stride, pad, c, k, hw) in [
        ("conv 1x1", 1, 1, 0, 16, 24, 9),
        ("conv 3x3/2", 3, 2, 1, 8, 16, 11),
        ("conv 7x7/2", 7, 2, 3, 3, 8, 16),
    ] {
        let sh = ConvShape {
            n: 2,
            c,
            h: hw,
            w: hw,
            k,
            r,
            s: r,
            stride,
            pad,
        };
        let x = random(sh.input_len(), &mut rng);
        let w = random(sh.weight_len(), &mut rng);
        let dy = random(sh.output_len(), &mut rng);
        let mut y = vec![0.0f32; sh.output_len()];
        crate::conv::forward(&x, &w, &mut y, &sh);
        let mut dx = vec![0.0f32; sh.input_len()];
        crate::conv::backward_data(&dy, &w, &mut dx, &sh);
        let mut dw = vec![0.0f32; sh.weight_len()];
        crate::conv::backward_filter(&x, &dy, &mut dw, &sh);
        let flat = flat_of(&ctx, &[&w], Some((sh.depth(), k)))?;
        let mut conv = GConv {
            shape: sh,
            w: flat.slots[0],
            plans: Vec::new(),
            input: None,
        };
        let xg = Rc::new(ctx.upload(&Tensor::from_vec(2, hw, hw, c, x))?);
        let yg = conv.forward(&mut ctx, &flat, &xg, true)?;
        let dyg = ctx.upload(&Tensor::from_vec(2, sh.oh(), sh.ow(), k, dy))?;
        let dxg = conv
            .backward(&mut ctx, &flat, &dyg, true)?
            .ok_or_else(|| CudaError::Check("no data gradient".into()))?;
        let dwg =
            flat.slots[0].host_layout(&ctx.get::<f32>(flat.grad(flat.slots[0]), sh.weight_len())?);
        push(
            &mut out,
            format!("{name} forward"),
            normwise(&ctx.download(&yg)?.data, &y),
            tol,
        );
        push(
            &mut out,
            format!("{name} backward-data"),
            normwise(&ctx.download(&dxg)?.data, &dx),
            tol,
        );
        push(
            &mut out,
            format!("{name} backward-filter"),
            normwise(&dwg, &dw),
            tol,
        );
    }
    {
        let (n, hw, c) = (4, 5, 40);
        let mut bn = BatchNorm::<f32>::new("bn", c, 1.0);
        bn.gamma.value = random(c, &mut rng);
        bn.beta.value = random(c, &mut rng);
        let x = Tensor::from_vec(n, hw, hw, c, random(n * hw * hw * c, &mut rng));
        let dy = Tensor::from_vec(n, hw, hw, c, random(n * hw * hw * c, &mut rng));
        let flat = flat_of(&ctx, &[&bn.gamma.value, &bn.beta.value], None)?;
        let mut g = GBn::new(&bn, flat.slots[0], flat.slots[1], None);
        let xg = ctx.upload(&x)?;
        let y = bn.forward_act(x, true, true);
        let dx = bn.backward_act(&dy, Some(&y));
        let yg = g.forward(&mut ctx, &flat, xg, true, true)?;
        let dyg = ctx.upload(&dy)?;
        let dxg = g.backward(&mut ctx, &flat, &dyg, Some(&yg))?;
        push(
            &mut out,
            "batch norm + ReLU forward".into(),
            normwise(&ctx.download(&yg)?.data, &y.data),
            1e-5,
        );
        push(
            &mut out,
            "batch norm running statistics".into(),
            normwise(
                &[&g.running_mean[..], &g.running_var[..]].concat(),
                &[&bn.running_mean[..], &bn.running_var[..]].concat(),
            ),
            1e-5,
        );
        push(
            &mut out,
            "batch norm + ReLU backward".into(),
            normwise(&ctx.download(&dxg)?.data, &dx.data),
            1e-4,
        );
        let grads: Vec<f32> = ctx.get(flat.grads.ptr, 2 * c)?;
        push(
            &mut out,
            "batch norm gamma/beta gradients".into(),
            normwise(&grads, &[&bn.gamma.grad[..], &bn.beta.grad[..]].concat()),
            1e-4,
        );
    }
    // A whole step of a small ResNet (every block kind, v1.5) on both devices.
    let cfg = crate::resnet::Config {
        version: crate::resnet::Version::V1_5,
        blocks: [1, 1, 1, 1],
        width: 0.125,
        classes: 7,
        zero_init_residual: false,
    };
    let mut cpu = ResNet::<f32>::new(cfg.clone(), 11);
    let mut mirror = ResNet::<f32>::new(cfg, 11);
    let x = Tensor::from_vec(4, 40, 40, 3, random(4 * 40 * 40 * 3, &mut rng));
    let labels = [0usize, 3, 6, 2];
    let sgd = crate::train::Sgd::default();
    let lr = 0.05;
    let z = cpu.forward(&x, true);
    let (loss, g, _, _) = crate::layers::softmax_cross_entropy(&z, &labels, 0.1);
    cpu.backward(&g);
    sgd.step(cpu.params(), lr);
    let init: Vec<Vec<f32>> = mirror.params().iter().map(|p| p.value.clone()).collect();
    let mut net = GpuResNet::new(ctx, &mut mirror, None, None, CommOptions::default())?;
    let r = net.step(&x, &labels, lr, 0.1, &sgd)?;
    // A whole step compounds every layer's rounding (and batch norm divides by small spreads).
    let step_tol = match p {
        Prec::F32 => 1e-3,
        Prec::Tf32 => 2e-2,
        _ => 5e-2,
    };
    push(
        &mut out,
        "network loss".into(),
        ((r.loss - loss) / loss.abs().max(1e-30)).abs(),
        step_tol,
    );
    push(
        &mut out,
        "network step applied".into(),
        if r.applied { 0.0 } else { 1.0 },
        0.0,
    );
    net.store(&mut mirror)?;
    let names: Vec<String> = cpu.params().iter().map(|p| p.name.clone()).collect();
    let want: Vec<Vec<f32>> = cpu.params().iter().map(|p| p.value.clone()).collect();
    // The updates (after − before), not the parameters: an update is small next to its weights.
    // Returns the worst parameter's error and its name.
    let updates = |m: &mut ResNet<f32>| {
        let (mut worst, mut at) = (0.0f64, String::new());
        let delta =
            |a: &[f32], b: &[f32]| a.iter().zip(b).map(|(x, y)| x - y).collect::<Vec<f32>>();
        for (((name, w), p), i) in names.iter().zip(&want).zip(m.params()).zip(&init) {
            let e = normwise(&delta(&p.value, i), &delta(w, i));
            if e > worst || !e.is_finite() {
                worst = e;
                at = name.clone();
            }
        }
        (worst, at)
    };
    let (worst, at) = updates(&mut mirror);
    push(
        &mut out,
        format!("network parameter updates of one step (worst: {at})"),
        worst,
        step_tol,
    );
    let stats = |m: &mut ResNet<f32>| -> Vec<f32> {
        m.running_stats()
            .into_iter()
            .flat_map(|(_, a, b)| a.iter().chain(b.iter()).copied().collect::<Vec<_>>())
            .collect()
    };
    push(
        &mut out,
        "network running statistics".into(),
        normwise(&stats(&mut mirror), &stats(&mut cpu)),
        step_tol,
    );
    let zc = cpu.forward(&x, false);
    let zg = net.logits(&x)?;
    push(
        &mut out,
        "network inference logits".into(),
        normwise(&zg.data, &zc.data),
        step_tol * 10.0,
    );
    // The same step with its gradients through NCCL (a one-rank communicator: the sum is the
    // gradient itself) in small buckets queued during the backward pass: the event handoffs
    // between the streams, the 16-bit casts of the compressed wire, the loss scale they bring.
    if roofline_kernels::comm::nccl::available().is_ok() {
        let ordinal = net.ctx.gpu.ordinal;
        drop(net);
        for (wire, wire_tol) in [(Wire::F32, 0.0), (Wire::F16, 5e-3), (Wire::Bf16, 2e-2)] {
            let id = roofline_kernels::comm::nccl::unique_id()?;
            let nccl = Communicator::new(&id, 1, 0, ordinal)?;
            let ctx = Ctx::new(Gpu::open(ordinal)?, p)?;
            let mut m = ResNet::<f32>::new(cpu.config.clone(), 11);
            let opts = CommOptions {
                wire,
                overlap: true,
                bucket: 20_000,
            };
            let mut n = GpuResNet::new(ctx, &mut m, Some(nccl), None, opts)?;
            let r = n.step(&x, &labels, lr, 0.1, &sgd)?;
            n.store(&mut m)?;
            let (worst, at) = updates(&mut m);
            push(
                &mut out,
                format!(
                    "network step through NCCL, gradients in {} (worst: {at})",
                    match wire {
                        Wire::F32 => "f32",
                        Wire::F16 => "f16",
                        Wire::Bf16 => "bf16",
                    }
                ),
                if r.applied { worst } else { f64::INFINITY },
                step_tol.max(wire_tol),
            );
        }
    }
    Ok(out)
}

/// The CUDA path as the trainer's [`crate::train::Accelerator`]: the model moves to the GPU at
/// the start of the run (after a resume) and back for checkpoints and the summary.
pub struct CudaTrainer {
    ctx: Option<Ctx>,
    nccl: Option<Communicator>,
    reducer: Option<Arc<dyn Reducer>>,
    comm: CommOptions,
    pub net: Option<GpuResNet>,
}

impl CudaTrainer {
    /// Trains on `ctx`'s GPU; `nccl` sums the gradients over its ranks as `comm` says and
    /// `reducer` (the same ranks, over MPI) the batch-norm statistics.
    pub fn new(
        ctx: Ctx,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> CudaTrainer {
        CudaTrainer {
            ctx: Some(ctx),
            nccl,
            reducer,
            comm,
            net: None,
        }
    }

    fn net(&mut self) -> Result<&mut GpuResNet, String> {
        self.net
            .as_mut()
            .ok_or_else(|| "the GPU model was not loaded".to_string())
    }
}

/// An NCCL communicator over the ranks of `reducer` on GPU `ordinal`: rank 0 makes the unique
/// id and every rank receives it through the reducer.
pub fn communicator(reducer: &dyn Reducer, ordinal: usize) -> Result<Communicator, CudaError> {
    let mut id = [0u8; 128];
    if reducer.rank() == 0 {
        id = roofline_kernels::comm::nccl::unique_id()?;
    }
    reducer.broadcast(&mut id);
    Communicator::new(&id, reducer.ranks(), reducer.rank(), ordinal)
}

impl crate::train::Accelerator<f32> for CudaTrainer {
    fn begin(&mut self, model: &mut ResNet<f32>) -> Result<(), String> {
        let ctx = match (self.ctx.take(), self.net.take()) {
            (Some(c), _) => c,
            (None, Some(n)) => {
                self.nccl = n.sync.map(|g| g.nccl);
                n.ctx
            }
            (None, None) => return Err("the GPU context is gone".into()),
        };
        let net = GpuResNet::new(
            ctx,
            model,
            self.nccl.take(),
            self.reducer.clone(),
            self.comm,
        )
        .map_err(|e| e.to_string())?;
        self.net = Some(net);
        Ok(())
    }

    fn step(
        &mut self,
        x: &Tensor<f32>,
        labels: &[usize],
        lr: f64,
        smoothing: f64,
        sgd: &crate::train::Sgd,
    ) -> Result<(f64, f64), String> {
        let r = self
            .net()?
            .step(x, labels, lr, smoothing, sgd)
            .map_err(|e| e.to_string())?;
        Ok((r.loss, r.comm_bytes))
    }

    fn logits(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, String> {
        self.net()?.logits(x).map_err(|e| e.to_string())
    }

    fn store(&mut self, model: &mut ResNet<f32>) -> Result<(), String> {
        self.net()?.store(model).map_err(|e| e.to_string())
    }
}

#[cfg(test)]
mod tests {
    //! What runs without a GPU: the layout transposes, the loss scaler, the comparisons, and
    //! that the CUDA path fails with a clear error when there is no driver.
    use super::*;

    #[test]
    fn filter_layouts_round_trip_and_put_k_outermost() {
        let (depth, k) = (3 * 3 * 2, 4);
        let w: Vec<f32> = (0..depth * k).map(|i| i as f32).collect();
        let t = rsck_to_krsc(&w, depth, k);
        // KRSC: filter j's depth run is contiguous; element (d, j) of RSCK is d·k + j.
        assert_eq!(t[2 * depth + 5], w[5 * k + 2]);
        assert_eq!(krsc_to_rsck(&t, depth, k), w);
    }

    #[test]
    fn f16_loss_scale_halves_on_overflow_and_grows_after_a_run_of_good_steps() {
        let mut s = LossScale::for_step(Prec::F16, Wire::F32);
        assert_eq!(s.scale, 1024.0);
        assert!(!s.update(true), "an overflow skips the step");
        assert_eq!(s.scale, 512.0);
        for _ in 0..999 {
            assert!(s.update(false));
        }
        assert_eq!(s.scale, 512.0);
        assert!(s.update(false));
        assert_eq!(s.scale, 1024.0);
        let mut b = LossScale::for_step(Prec::Bf16, Wire::F32);
        assert_eq!(b.scale, 1.0);
        assert!(b.update(false));
        assert_eq!(b.scale, 1.0);
        // f16 gradients on the wire scale even f32 convolutions; bf16 on the wire needs none.
        assert_eq!(LossScale::for_step(Prec::F32, Wire::F16).scale, 1024.0);
        assert_eq!(LossScale::for_step(Prec::Tf32, Wire::Bf16).scale, 1.0);
    }

    #[test]
    fn normwise_error_and_precision_names() {
        assert_eq!(normwise(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((normwise(&[1.0, 0.0], &[0.0, 1.0]) - 2f64.sqrt()).abs() < 1e-12);
        assert!(normwise(&[f32::NAN], &[1.0]).is_infinite());
        assert!(normwise(&[1.0], &[1.0, 2.0]).is_infinite());
        assert_eq!(precision("bf16"), Ok(Prec::Bf16));
        assert!(precision("fp8")
            .unwrap_err()
            .contains("expected f32, tf32, f16 or bf16"));
        assert!(tolerance(Prec::F32) < tolerance(Prec::Tf32));
    }

    #[test]
    fn without_a_driver_the_gpu_cannot_open_and_says_why() {
        if roofline_kernels::cuda::libs::present(Lib::Driver) {
            return; // a machine with a driver: nothing to show here
        }
        let e = device::init().unwrap_err().to_string();
        assert!(e.contains("no NVIDIA driver"), "{e}");
    }
}
