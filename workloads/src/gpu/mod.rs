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
use crate::layers::{BatchNorm, Conv2d, Reducer};
use crate::resnet::{Bottleneck, ResNet, BWD, FWD};
use crate::tensor::Tensor;
use roofline_kernels::comm::nccl::{Communicator, Elem};
use roofline_kernels::cuda::blas::{Blas, Prec};
use roofline_kernels::cuda::device::{self, arg, Event, Function, Gpu};
use roofline_kernels::cuda::dnn::{ConvPlan, Handle, PlanChoice};
use roofline_kernels::cuda::dnn_cache::{AlgoCache, CacheKey};
use roofline_kernels::cuda::CudaError;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

/// The timeline category of a step's host-to-device copies of its input (`place` counts them
/// as waiting for data).
pub const UPLOAD: &str = "upload";

fn half(p: Prec) -> bool {
    matches!(p, Prec::F16 | Prec::Bf16)
}

/// A stream-ordered device allocation on the trainer's stream, freed in stream order.
pub use roofline_kernels::cuda::device::StreamBuf as Buf;

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

/// The convolution algorithm cache for `gpu` (its name, compute capability, the driver's CUDA
/// version and cuDNN's version make the key), its note said; None where there is no cache
/// folder or a version cannot be read (every shape is then measured).
fn algo_cache(gpu: &Gpu) -> Option<AlgoCache> {
    let path = AlgoCache::default_path()?;
    let key = CacheKey {
        gpu: gpu.name.clone(),
        cc: gpu.cc,
        driver: device::driver_version().ok()?,
        cudnn: roofline_kernels::cuda::dnn::versions().ok()?.0,
    };
    let cache = AlgoCache::open(&path, key);
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
    clock: Option<Clock>,
    dnn: Handle,
    blas: Blas,
    functions: HashMap<&'static str, Function>,
    workspace: Option<Buf>,
    /// The convolution algorithms measured in this run, by shape and precision.
    choices: Vec<((ConvShape, Prec), PlanChoice)>,
    /// Those of earlier runs on this GPU, driver and cuDNN (None: no cache folder).
    cache: Option<AlgoCache>,
    pub prec: Prec,
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
            prec,
            gpu,
        })
    }

    pub fn alloc(&self, bytes: usize) -> Result<Buf, CudaError> {
        self.gpu.alloc_async(bytes)
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

    /// `len` elements from `src`, after everything enqueued so far.
    pub fn get<T: device::bytemuck_like::Pod>(
        &self,
        src: u64,
        len: usize,
    ) -> Result<Vec<T>, CudaError> {
        // SAFETY: the caller's `src` holds at least `len` elements; the copy is waited for.
        unsafe { self.gpu.copy_out(src, len) }
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
        unsafe { self.gpu.zero_async(b, bytes) }
    }

    fn function(&mut self, name: &'static str) -> Result<Function, CudaError> {
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

    /// A convolution plan for `sh` in this context's precision: each direction's algorithm
    /// measured by cuDNN on scratch buffers (`ConvPlan::measured`, as PyTorch's
    /// `cudnn.benchmark`) the first time a shape is met in this run, the same choice for every
    /// later convolution of that shape.
    fn conv_plan(&mut self, sh: &ConvShape) -> Result<ConvPlan, CudaError> {
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
        let bytes = ConvPlan::scratch_bytes(sh, p);
        let mut scratch = Vec::with_capacity(4);
        for b in bytes {
            let buf = self.alloc(b.max(4))?;
            self.zero(buf.ptr, buf.bytes)?;
            scratch.push(buf);
        }
        let ptrs = [
            scratch[0].ptr,
            scratch[1].ptr,
            scratch[2].ptr,
            scratch[3].ptr,
        ];
        let ws = self
            .workspace(roofline_kernels::cuda::dnn::SEARCH_WORKSPACE)
            .map(|b| (b.ptr, b.bytes))?;
        let plan = ConvPlan::measured(&self.dnn, sh, p, ptrs, ws)?;
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
        // SAFETY: the caller's buffers hold the matrices the sizes and leading dimensions
        // describe, on this context's GPU; the product runs on its stream before they drop.
        unsafe {
            self.blas
                .sgemm((ta, tb), (m, n, k), (a, lda), (b, ldb), (c, ldc))
        }
    }
}

/// A step's layer timings on the GPU: a reference event recorded when the step starts (and the
/// host's time then), and each layer's pair of events; read after the step's last sync and put
/// on the timeline, so that `place --device cuda` has per-layer points as on the CPU.
pub(super) struct Clock {
    reference: Event,
    host: std::time::Instant,
    marks: Vec<(&'static str, String, Event, Event)>,
}

impl Ctx {
    /// Starts timing a step's layers, when the timeline records (else nothing is timed).
    pub(super) fn clock_start(&mut self) -> Result<(), CudaError> {
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
    pub(super) fn mark(&mut self) -> Result<Option<Event>, CudaError> {
        if self.clock.is_none() {
            return Ok(None);
        }
        let e = Event::new()?;
        e.record_on(&self.gpu)?;
        Ok(Some(e))
    }

    /// Ends the span that `start` began (no-op when not timing).
    pub(super) fn close(
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
    pub(super) fn clock_flush(&mut self) -> Result<(), CudaError> {
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

mod bn;
mod body;
mod check;
mod check_detector;
mod detect;
mod detector;
mod fpn;
mod layers;
mod resnet;
mod roi_align;
mod trainer;
use bn::*;
use body::*;
pub use check::*;
pub use check_detector::*;
pub use detect::*;
pub use detector::*;
pub use layers::conv_algorithms;
use layers::*;
pub use resnet::*;
pub use roi_align::*;
pub use trainer::*;

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

    /// `sgd_slots` as the GPU runs it, thread by thread: block row `s` of the 2-D grid takes
    /// slot `s` from the table, `gx` blocks of 256 threads stride over it.
    fn sgd_slots_twin(
        (w, g, v): (&mut [f32], &[f32], &mut [f32]),
        table: &[u8],
        slots: usize,
        gx: usize,
        (decay_all, lr, mu, wd, inv): (bool, f32, f32, f32, f32),
    ) {
        let u64_at = |k: usize| u64::from_ne_bytes(table[8 * k..8 * k + 8].try_into().unwrap());
        let u32_at = |k: usize| {
            let b = 16 * slots + 4 * k;
            u32::from_ne_bytes(table[b..b + 4].try_into().unwrap())
        };
        for s in 0..slots {
            let (o, n) = (u64_at(s) as usize, u64_at(slots + s) as usize);
            let d = if decay_all || u32_at(s) != 0 { wd } else { 0.0 };
            for bx in 0..gx {
                for tx in 0..256 {
                    let mut i = bx * 256 + tx;
                    while i < n {
                        let j = o + i;
                        let vi = mu * v[j] + g[j] * inv + d * w[j];
                        v[j] = vi;
                        w[j] -= lr * vi;
                        i += gx * 256;
                    }
                }
            }
        }
    }

    #[test]
    fn one_optimizer_launch_updates_every_slot_once_as_slot_by_slot_sgd_does() {
        // Lengths that cross the block edges (255, 256, 257), span several strides, and one
        // slot of a single element; decays as a ResNet's (filters yes, batch norm no).
        let lens = [255, 256, 257, 1, 3000, 700];
        let decays = [true, false, true, false, true, false];
        let mut slots = Vec::new();
        let mut off = 0;
        for (&len, &decay) in lens.iter().zip(&decays) {
            slots.push(Slot {
                off,
                len,
                decay,
                conv: None,
            });
            off += len;
        }
        let total = off;
        let wave = |k: usize, a: f32| {
            (0..total)
                .map(|i| ((i * k) % 97) as f32 / 97.0 - a)
                .collect::<Vec<f32>>()
        };
        let (w0, g, v0) = (wave(7, 0.5), wave(13, 0.4), wave(29, 0.1));
        let (lr, mu, wd, inv) = (0.1f32, 0.9, 1e-4, 1.0 / 1024.0);
        for decay_all in [false, true] {
            for gx in [1, 2, 5] {
                let (mut w, mut v) = (w0.clone(), v0.clone());
                let table = slot_table(&slots);
                sgd_slots_twin(
                    (&mut w, &g, &mut v),
                    &table,
                    slots.len(),
                    gx,
                    (decay_all, lr, mu, wd, inv),
                );
                // Slot by slot, every element once.
                let (mut w2, mut v2) = (w0.clone(), v0.clone());
                for s in &slots {
                    let d = if decay_all || s.decay { wd } else { 0.0 };
                    for j in s.off..s.off + s.len {
                        v2[j] = mu * v2[j] + g[j] * inv + d * w2[j];
                        w2[j] -= lr * v2[j];
                    }
                }
                assert_eq!(w, w2, "gx {gx}, decay_all {decay_all}");
                assert_eq!(v, v2);
            }
        }
    }

    #[test]
    fn a_loss_readout_is_read_as_softmax_xent_writes_it() {
        // Three rows: losses 1, 2, 3 (f64), then the ranks of their labels 1, 3, 7 (i32).
        let mut bytes: Vec<u8> = [1.0f64, 2.0, 3.0]
            .iter()
            .flat_map(|v| v.to_ne_bytes())
            .collect();
        bytes.extend([1i32, 3, 7].iter().flat_map(|r| r.to_ne_bytes()));
        let (loss, top1, top5) = resnet::Loss { rows: 3 }.read(&bytes).unwrap();
        assert_eq!((loss, top1, top5), (2.0, 1, 2));
        assert!(resnet::Loss { rows: 3 }.read(&bytes[..30]).is_err());
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
        // The trainer refuses the probe's other precisions before it looks for a GPU.
        let e = check_all(None, Prec::Fp8, false, |_| {}).unwrap_err();
        assert!(
            e.is_input() && e.to_string().contains("f32, tf32, f16 or bf16"),
            "{e}"
        );
        assert!(tolerance(Prec::F32) < tolerance(Prec::Tf32));
    }

    #[test]
    fn without_a_driver_the_gpu_cannot_open_and_says_why() {
        if roofline_kernels::cuda::libs::present(roofline_kernels::cuda::libs::Lib::Driver) {
            return; // a machine with a driver: nothing to show here
        }
        let e = device::init().unwrap_err().to_string();
        assert!(e.contains("no NVIDIA driver"), "{e}");
    }
}
