//! The trainer's context on one GPU ([`Ctx`]: the device, its library handles, the compiled
//! kernels, the cuDNN workspace and the buffer pool) and its tensors ([`GTensor`]), with the
//! casts between f32 and 16-bit storage that every layer uses.

use roofline_kernels::cuda::blas::{Blas, Prec};
use roofline_kernels::cuda::conv_search::{
    SearchBudget, SEARCH_BUDGET_S, TRAINER_SEARCHES, TRAINER_SEARCH_S,
};
use roofline_kernels::cuda::device::{self, arg, Event, Function, Gpu};
use roofline_kernels::cuda::dnn::{ConvPlan, Handle, PlanChoice};
use roofline_kernels::cuda::dnn_cache::AlgoCache;
use roofline_kernels::cuda::{CudaError, Storage, Typed};
use roofline_kernels::probe::gpu::ConvOperands;
use roofline_models::conv::ConvShape;
use roofline_models::tensor::Tensor;
use roofline_models::train::{GraphMode, SearchReport};
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;

/// The kernels of `train.cu` compiled once per storage type.
pub(crate) const BN_SUMS: Typed = roofline_kernels::typed!("bn_sums");
pub(crate) const BN_SUMS_V: Typed = roofline_kernels::typed!("bn_sums_v");
pub(crate) const BN_APPLY: Typed = roofline_kernels::typed!("bn_apply");
pub(crate) const BN_BACKWARD_DX: Typed = roofline_kernels::typed!("bn_backward_dx");
pub(crate) const BN_APPLY_V: Typed = roofline_kernels::typed!("bn_apply_v");
pub(crate) const BN_BACKWARD_DX_V: Typed = roofline_kernels::typed!("bn_backward_dx_v");
pub(crate) const RELU_MASK: Typed = roofline_kernels::typed!("relu_mask");
pub(crate) const ADD_INTO: Typed = roofline_kernels::typed!("add_into");
pub(crate) const MAXPOOL_FORWARD: Typed = roofline_kernels::typed!("maxpool_forward");
pub(crate) const MAXPOOL_BACKWARD: Typed = roofline_kernels::typed!("maxpool_backward");
pub(crate) const AVGPOOL_FORWARD: Typed = roofline_kernels::typed!("avgpool_forward");
pub(crate) const AVGPOOL_BACKWARD: Typed = roofline_kernels::typed!("avgpool_backward");

/// The timeline category of a step's host-to-device copies of its input (`place` counts them
/// as waiting for data).
pub const UPLOAD: &str = "upload";

/// A device buffer of the trainer's (recycled through the context's pool).
pub use crate::pool::Buf;

/// A device NHWC tensor, stored in f32 or in 16 bits (`dt`).
pub struct GTensor {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub dt: Storage,
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

    pub(crate) fn rows(&self) -> usize {
        self.n * self.h * self.w
    }

    /// `k`'s entry point for this tensor's storage.
    pub(crate) fn kernel(&self, k: Typed) -> &'static str {
        self.dt.kernel(k)
    }
}

/// The storage type that tensors `t` share, or an error naming `what` when they differ (a
/// kernel reads and writes one type).
pub(crate) fn same_storage(what: &str, t: &[&GTensor]) -> Result<Storage, CudaError> {
    let dt = t.first().map_or(Storage::F32, |t| t.dt);
    if let Some(other) = t.iter().find(|x| x.dt != dt) {
        return Err(CudaError::Check(format!(
            "{what}: tensors in {} and {}",
            dt.name(),
            other.dt.name()
        )));
    }
    Ok(dt)
}

/// The convolution algorithm cache for `gpu` (`AlgoCache::for_gpu`), its note said.
pub(crate) fn algo_cache(gpu: &Gpu) -> Option<AlgoCache> {
    let cache = AlgoCache::for_gpu(gpu)?;
    if let Some(n) = &cache.note {
        eprintln!("note: {n}");
    }
    Some(cache)
}

/// The GPU, its library handles, the compiled kernels and the cuDNN workspace.
///
/// Fields drop in declaration order, after `Drop::drop`: the cuDNN handle and the workspace
/// go first, and `gpu` (its stream and its hold on the primary context) last, so that no
/// library handle is destroyed in a released context.
pub struct Ctx {
    /// The layers' CUDA events of the step being timed (while the timeline records).
    pub(crate) clock: Option<Clock>,
    pub(crate) dnn: Handle,
    pub(crate) blas: Blas,
    pub(crate) functions: HashMap<&'static str, Function>,
    pub(crate) workspace: Option<Buf>,
    /// The convolution algorithms measured in this run, by shape and precision.
    pub(crate) choices: Vec<((ConvShape, Prec), PlanChoice)>,
    /// Those of earlier runs on this GPU, driver and cuDNN (None: no cache folder).
    pub(crate) cache: Option<AlgoCache>,
    /// The run's searches' budget ([`TRAINER_SEARCH_S`]), and the plans taken from this run's
    /// choices or the cache instead of a search.
    pub(crate) search: SearchBudget,
    pub(crate) known_plans: usize,
    /// The buffers the steps have handed back (`pool.rs`).
    pub(crate) pool: Rc<std::cell::RefCell<crate::pool::Pool>>,
    pub prec: Prec,
    /// Whether a model's training step may be launched as a CUDA graph (`graph.rs`).
    pub graph: GraphMode,
    pub gpu: Gpu,
}

impl Drop for Ctx {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        let _ = self.gpu.sync();
        self.workspace = None;
    }
}

impl Ctx {
    /// Trains on `gpu` with convolutions in `prec` (cuDNN's absence is reported by
    /// `Handle::new`).
    pub fn new(gpu: Gpu, prec: Prec) -> Result<Ctx, CudaError> {
        let blas = Blas::new(&gpu)?;
        gpu.keep_freed_memory()?;
        let dnn = Handle::new(&gpu)?;
        let cache = algo_cache(&gpu);
        Ok(Ctx {
            clock: None,
            dnn,
            blas,
            functions: HashMap::new(),
            workspace: None,
            choices: Vec::new(),
            cache,
            search: SearchBudget::new(TRAINER_SEARCH_S, SEARCH_BUDGET_S, TRAINER_SEARCHES),
            known_plans: 0,
            pool: Rc::default(),
            prec,
            graph: GraphMode::default(),
            gpu,
        })
    }

    /// An f32 tensor.
    pub fn tensor(&self, n: usize, h: usize, w: usize, c: usize) -> Result<GTensor, CudaError> {
        self.tensor_in(Storage::F32, n, h, w, c)
    }

    /// A tensor stored as `dt`.
    pub fn tensor_in(
        &self,
        dt: Storage,
        n: usize,
        h: usize,
        w: usize,
        c: usize,
    ) -> Result<GTensor, CudaError> {
        Ok(GTensor {
            n,
            h,
            w,
            c,
            dt,
            buf: self.alloc(dt.bytes() * n * h * w * c)?,
        })
    }

    /// A tensor of `x`'s storage and these dimensions.
    pub fn tensor_like(
        &self,
        x: &GTensor,
        n: usize,
        h: usize,
        w: usize,
        c: usize,
    ) -> Result<GTensor, CudaError> {
        self.tensor_in(x.dt, n, h, w, c)
    }

    /// Copies `data` to `dst` in stream order (the host slice may be dropped on return).
    pub fn put<T: device::bytemuck_like::Pod>(
        &self,
        dst: u64,
        data: &[T],
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's `dst` holds at least size_of_val(data) bytes; `data` is copied
        // into the GPU's pinned staging memory before the call returns (kept until the next
        // synchronisation), so the host slice may go at once.
        unsafe { self.gpu.copy_in_async(dst, data) }
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

    /// `t` stored as `dt`: uploaded in f32 and, for 16 bits, cast on the device (a network's
    /// input: the one cast of a mixed-precision step's activations).
    pub fn upload_in(&mut self, dt: Storage, t: &Tensor<f32>) -> Result<GTensor, CudaError> {
        let g = self.upload(t)?;
        self.convert(g, dt)
    }

    /// `g` stored as `dt` (itself when it already is).
    pub fn convert(&mut self, g: GTensor, dt: Storage) -> Result<GTensor, CudaError> {
        if g.dt == dt {
            return Ok(g);
        }
        let out = self.tensor_in(dt, g.n, g.h, g.w, g.c)?;
        self.cast_between(g.dt, dt, g.ptr(), out.ptr(), g.len())?;
        Ok(out)
    }

    /// `len` elements from `src`, after everything enqueued so far.
    pub fn get<T: device::bytemuck_like::Pod>(
        &self,
        src: u64,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        // SAFETY: the caller's `src` holds at least `len` elements; the copy is waited for.
        unsafe { self.gpu.copy_out(src, len) }
    }

    /// `g` on the host in f32 (16-bit storage widened exactly).
    pub fn download(&self, g: &GTensor) -> Result<Tensor<f32>, CudaError> {
        let data = match g.dt {
            Storage::F32 => self.get(g.ptr(), g.len())?,
            Storage::F16 => widen(g.dt, &self.get::<u16>(g.ptr(), g.len())?),
            Storage::Bf16 => widen(g.dt, &self.get::<u16>(g.ptr(), g.len())?),
        };
        Ok(Tensor::from_vec(g.n, g.h, g.w, g.c, data))
    }

    pub fn zero(&self, b: u64, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: the caller's buffer holds `bytes`; on our stream.
        unsafe { self.gpu.zero_async(b, bytes) }
    }

    pub(crate) fn function(&mut self, name: &'static str) -> Result<Function, CudaError> {
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
    pub(crate) unsafe fn launch(
        &mut self,
        name: &'static str,
        n: usize,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let f = self.function(name)?;
        let grid = grid_for(n, self.gpu.sms as usize) as u32;
        // SAFETY: the caller's contract.
        unsafe { self.gpu.launch(f, grid, 256, args) }
    }

    /// A cuDNN workspace of at least `bytes`.
    pub(crate) fn workspace(&mut self, bytes: usize) -> Result<&Buf, CudaError> {
        if self.workspace.as_ref().is_none_or(|w| w.bytes < bytes) {
            self.workspace = Some(self.alloc(bytes.max(1 << 20))?);
        }
        self.workspace
            .as_ref()
            .ok_or_else(|| CudaError::Check("no workspace".into()))
    }

    /// A convolution plan for `sh` in this context's precision: each direction's method
    /// measured by the one search (`ConvPlan::measured`: the legacy API's choice and every
    /// backend engine, as PyTorch's `cudnn.benchmark`, each checked at this shape against f64
    /// sums) within the run's search budget, the first time a shape is met in this run and
    /// not in the algorithm cache; the same choice for every later convolution of that shape.
    pub(crate) fn conv_plan(&mut self, sh: &ConvShape) -> Result<ConvPlan, CudaError> {
        let p = self.prec;
        // This run's choice for the shape, else the cache file's, each checked by cuDNN.
        let known = self
            .choices
            .iter()
            .find(|(k, _)| *k == (*sh, p))
            .map(|(_, c)| c.clone())
            .or_else(|| self.cache.as_ref()?.get(sh, p));
        if let Some(c) = known {
            match ConvPlan::from_choice(&self.dnn, sh, p, &c) {
                Ok(plan) => {
                    self.known_plans += 1;
                    if !self.choices.iter().any(|(k, _)| *k == (*sh, p)) {
                        self.choices.push(((*sh, p), plan.choice()));
                    }
                    return Ok(plan);
                }
                Err(e) => eprintln!(
                    "note: a cached convolution algorithm for {sh:?} in {} was refused ({e}); measuring again",
                    p.name()
                ),
            }
        }
        // Counter-based operands, so that every method the search adopts is first checked at
        // this shape against f64 sums of sampled entries (an engine wrong only here would
        // train wrongly, and nothing else would say so).
        let operands = ConvOperands::new(
            &self.gpu,
            sh,
            p,
            0x7EA1_u64 ^ (self.choices.len() as u64) << 8,
        )?;
        let ws = self
            .workspace(roofline_kernels::cuda::dnn::SEARCH_WORKSPACE)
            .map(|b| (b.ptr, b.bytes))?;
        let gpu = &self.gpu;
        let plan = ConvPlan::measured(
            gpu,
            &self.dnn,
            sh,
            p,
            operands.ptrs(),
            ws,
            &self.search,
            &mut |dir| operands.check(gpu, dir).map(|_| ()),
        )?;
        self.choices.push(((*sh, p), plan.choice()));
        if let Some(cache) = self.cache.as_mut() {
            if let Err(e) = cache.put(sh, p, &plan.choice()) {
                // Measured again next run; this one goes on.
                eprintln!("note: the convolution algorithm cache was not written: {e}");
                self.cache = None;
            }
        }
        Ok(plan)
    }

    /// What this context's convolution searches did: for `train --json` and its text.
    pub fn search_report(&self) -> SearchReport {
        SearchReport {
            budget_s: self.search.total(),
            searches: self.search.searches(),
            seconds: self.search.total() - self.search.left(),
            known_plans: self.known_plans,
        }
    }

    /// `n` values at `src` stored as `from`, as an operand of type `to`: in place when the
    /// types agree, else cast into a new buffer (returned, to be kept until the operand's use
    /// is enqueued).
    pub(crate) fn operand(
        &mut self,
        src: u64,
        from: Storage,
        to: Storage,
        n: usize,
    ) -> Result<(u64, Option<Buf>), CudaError> {
        if from == to {
            return Ok((src, None));
        }
        let b = self.alloc(to.bytes() * n)?;
        self.cast_between(from, to, src, b.ptr, n)?;
        Ok((b.ptr, Some(b)))
    }

    /// Where a result of type `dt` bound for `t` is written first: nowhere but `t` when `t`
    /// is stored as `dt` (None), else a buffer to cast into `t` from.
    pub(crate) fn result_buf(&self, t: &GTensor, dt: Storage) -> Result<Option<Buf>, CudaError> {
        if t.dt == dt {
            return Ok(None);
        }
        self.alloc(dt.bytes() * t.len()).map(Some)
    }

    /// Casts `n` values from `from` to `to` (one of them f32; rounding to nearest even).
    pub(crate) fn cast_between(
        &mut self,
        from: Storage,
        to: Storage,
        src: u64,
        dst: u64,
        n: usize,
    ) -> Result<(), CudaError> {
        let k = match (from, to) {
            (Storage::F32, Storage::F16) => "f32_to_f16",
            (Storage::F32, Storage::Bf16) => "f32_to_bf16",
            (Storage::F16, Storage::F32) => "f16_to_f32",
            (Storage::Bf16, Storage::F32) => "bf16_to_f32",
            (a, b) => {
                return Err(CudaError::Check(format!(
                    "no cast from {} to {}",
                    a.name(),
                    b.name()
                )))
            }
        };
        let n64 = n as u64;
        // SAFETY: src holds n values of the source type, dst n of the destination type.
        unsafe { self.launch(k, n, &mut [arg(&src), arg(&dst), arg(&n64)]) }
    }

    /// Column-major `c(m×n) = op(a) · op(b)` in f32 on cuBLAS (`beta` 0: overwrite).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn sgemm(
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
        // SAFETY: the caller's buffers hold the matrices the sizes and leading dimensions
        // describe, on this context's GPU; the product runs on its stream before they drop.
        unsafe {
            self.blas
                .sgemm((ta, tb), (m, n, k), (a, lda), (b, ldb), (c, ldc))
        }
    }
}

/// The blocks of 256 threads `Ctx::launch` gives a grid-stride kernel over `n` items on a GPU
/// of `sms` SMs: enough for the items, at most 16 a SM.
pub(crate) fn grid_for(n: usize, sms: usize) -> usize {
    n.div_ceil(256).clamp(1, sms.max(1) * 16)
}

/// 16-bit values (the bits of `dt`, f16 or bf16) widened to f32, exactly.
pub(crate) fn widen(dt: Storage, bits: &[u16]) -> Vec<f32> {
    match dt {
        Storage::F16 => bits
            .iter()
            .map(|&b| half::f16::from_bits(b).to_f32())
            .collect(),
        _ => bits
            .iter()
            .map(|&b| half::bf16::from_bits(b).to_f32())
            .collect(),
    }
}

/// f32 values rounded to nearest even into `dt`'s 16 bits (f16 or bf16), as the kernels store.
pub(crate) fn narrow(dt: Storage, v: &[f32]) -> Vec<u16> {
    match dt {
        Storage::F16 => v
            .iter()
            .map(|&x| half::f16::from_f32(x).to_bits())
            .collect(),
        _ => v
            .iter()
            .map(|&x| half::bf16::from_f32(x).to_bits())
            .collect(),
    }
}

/// `v` as a GPU stores it in `dt` (f16 or bf16): rounded to nearest even, read back exactly.
pub(crate) fn rounded(dt: Storage, v: &[f32]) -> Vec<f32> {
    widen(dt, &narrow(dt, v))
}

/// A step's layer timings on the GPU: a reference event recorded when the step starts (and the
/// host's time then), and each layer's pair of events; read after the step's last sync and put
/// on the timeline, so that `place --device cuda` has per-layer points as on the CPU.
pub(crate) struct Clock {
    pub(crate) reference: Event,
    pub(crate) host: std::time::Instant,
    pub(crate) marks: Vec<(&'static str, String, Event, Event)>,
}

impl Ctx {
    /// Starts timing a step's layers, when the timeline records (else nothing is timed).
    pub(crate) fn clock_start(&mut self) -> Result<(), CudaError> {
        self.clock = None;
        if !roofline_collectors::timeline::recording() {
            return Ok(());
        }
        let reference = Event::new()?;
        let host = std::time::Instant::now();
        reference.record_on(&self.gpu)?;
        self.clock = Some(Clock {
            reference,
            host,
            marks: Vec::new(),
        });
        Ok(())
    }

    /// An event recorded now, when timing (the start of a layer's span).
    pub(crate) fn mark(&mut self) -> Result<Option<Event>, CudaError> {
        if self.clock.is_none() {
            return Ok(None);
        }
        let e = Event::new()?;
        e.record_on(&self.gpu)?;
        Ok(Some(e))
    }

    /// Ends the span that `start` began (no-op when not timing).
    pub(crate) fn close(
        &mut self,
        cat: &'static str,
        name: impl FnOnce() -> String,
        start: Option<Event>,
    ) -> Result<(), CudaError> {
        let Some(start) = start else {
            return Ok(());
        };
        let end = Event::new()?;
        end.record_on(&self.gpu)?;
        if let Some(c) = self.clock.as_mut() {
            c.marks.push((cat, name(), start, end));
        }
        Ok(())
    }

    /// After the step's work: each timed layer onto the timeline, at the host's time of the
    /// step's start plus its offset on the GPU (the GPU starts the step no earlier than the
    /// host queued it, so the spans lie inside the step).
    pub(crate) fn clock_flush(&mut self) -> Result<(), CudaError> {
        let Some(c) = self.clock.take() else {
            return Ok(());
        };
        let secs = |s: f64| std::time::Duration::from_secs_f64(s.max(0.0));
        for (cat, name, s, e) in c.marks {
            let offset = c.reference.seconds_to(&s)?;
            let dur = s.seconds_to(&e)?;
            roofline_collectors::timeline::record(cat, name, c.host + secs(offset), secs(dur));
        }
        Ok(())
    }
}
