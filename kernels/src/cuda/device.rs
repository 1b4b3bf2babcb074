//! One GPU through the CUDA driver API: its primary context, one non-blocking stream, device
//! and pinned host buffers, NVRTC-compiled kernels, launches and event timing.
//!
//! Raw `cudarc::driver::result` calls, each checked and turned into an error naming the call;
//! every resource is released in `Drop`. A `Gpu` makes its context current on the calling
//! thread when opened; call [`Gpu::bind`] before using it from another thread.

use super::libs::{self, Lib};
use super::nvrtc;
use super::CudaError;
use cudarc::driver::result::{self as cu, DriverError};
use cudarc::driver::sys;
use std::ffi::c_void;

/// Turns a driver result into our error, naming the call.
pub fn check<T>(call: &str, r: Result<T, DriverError>) -> Result<T, CudaError> {
    r.map_err(|e| {
        let name = e
            .error_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|_| format!("{:?}", e.0));
        CudaError::Call {
            call: call.to_string(),
            detail: name,
        }
    })
}

/// Loads the driver and counts the GPUs. `Missing` when there is no driver library,
/// `Shadowed` when a CUDA library found is not the one its bindings would call, `NoDevice`
/// when the driver sees no GPU.
pub fn init() -> Result<usize, CudaError> {
    libs::require(Lib::Driver)?;
    // Every GPU verb starts here: a library whose bindings would call a second copy is refused
    // before any work (`Shadowed`, with the fix).
    libs::all_consistent()?;
    match cu::init() {
        Ok(()) => {}
        Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NO_DEVICE => {
            return Err(CudaError::NoDevice("cuInit: CUDA_ERROR_NO_DEVICE".into()))
        }
        Err(e) => return check("cuInit", Err(e)),
    }
    let n = check("cuDeviceGetCount", cu::device::get_count())?;
    if n <= 0 {
        return Err(CudaError::NoDevice("cuDeviceGetCount: 0".into()));
    }
    Ok(n as usize)
}

/// The driver's CUDA version, e.g. 12040 → "12.4".
pub fn driver_version() -> Result<String, CudaError> {
    libs::require(Lib::Driver)?;
    let mut v = 0;
    // SAFETY: out-parameter.
    check(
        "cuDriverGetVersion",
        unsafe { sys::cuDriverGetVersion(&mut v) }.result(),
    )?;
    Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
}

pub use super::slices::{in_slices, parallel_copy};

/// A device allocation, freed on drop.
pub struct DevBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    ctx: sys::CUcontext,
}

impl DevBuf {
    /// `bytes` in `ctx`, which the calling thread has current.
    pub(crate) fn new(ctx: sys::CUcontext, bytes: usize) -> Result<DevBuf, CudaError> {
        // SAFETY: plain allocation in the current context; freed by Drop.
        let ptr = check("cuMemAlloc", unsafe { cu::malloc_sync(bytes.max(1)) })?;
        Ok(DevBuf { ptr, bytes, ctx })
    }
}

impl Drop for DevBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAlloc in `ctx`, freed once.
        unsafe {
            let _ = cu::ctx::set_current(self.ctx);
            let _ = cu::free_sync(self.ptr);
        }
    }
}

/// A stream-ordered device allocation (cuMemAllocAsync on a GPU's stream), freed on drop in
/// stream order: work enqueued before the free still sees it.
pub struct StreamBuf {
    pub ptr: sys::CUdeviceptr,
    pub bytes: usize,
    stream: sys::CUstream,
}

impl Drop for StreamBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemAllocAsync on `stream`, freed once, in stream order.
        unsafe {
            let _ = cu::free_async(self.ptr, self.stream);
        }
    }
}

/// A loaded kernel, as [`Gpu::function`] returns it and [`Gpu::launch`] takes it.
pub type Function = sys::CUfunction;

/// Page-locked host memory (cuMemHostAlloc), freed on drop.
pub struct PinnedBuf {
    ptr: *mut c_void,
    pub bytes: usize,
}

impl PinnedBuf {
    /// `bytes` of page-locked memory, usable by every context (the calling thread has one
    /// current).
    pub(crate) fn new(bytes: usize) -> Result<PinnedBuf, CudaError> {
        // SAFETY: plain allocation; freed by Drop.
        let ptr = check("cuMemHostAlloc", unsafe {
            cu::malloc_host(bytes.max(1), sys::CU_MEMHOSTALLOC_PORTABLE)
        })?;
        Ok(PinnedBuf { ptr, bytes })
    }

    pub fn as_mut_slice<T: bytemuck_like::Pod>(&mut self) -> &mut [T] {
        // SAFETY: the allocation is `bytes` long, page-aligned, and T is plain old data.
        unsafe {
            std::slice::from_raw_parts_mut(
                self.ptr as *mut T,
                self.bytes / std::mem::size_of::<T>(),
            )
        }
    }
}

impl Drop for PinnedBuf {
    fn drop(&mut self) {
        // SAFETY: allocated by cuMemHostAlloc, freed once.
        unsafe {
            let _ = cu::free_host(self.ptr);
        }
    }
}

/// Plain-old-data element types that may be viewed from raw device/host bytes.
pub mod bytemuck_like {
    /// # Safety
    /// Every bit pattern is a valid value and the type has no padding.
    pub unsafe trait Pod: Copy + Default + 'static {}
    unsafe impl Pod for u8 {}
    unsafe impl Pod for i8 {}
    unsafe impl Pod for u16 {}
    unsafe impl Pod for u32 {}
    unsafe impl Pod for i32 {}
    unsafe impl Pod for u64 {}
    unsafe impl Pod for f32 {}
    unsafe impl Pod for f64 {}
}
use bytemuck_like::Pod;

/// A CUDA event, destroyed on drop.
pub struct Event(sys::CUevent);

impl Event {
    pub fn new() -> Result<Event, CudaError> {
        check(
            "cuEventCreate",
            cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT),
        )
        .map(Event)
    }

    /// Records the event on `gpu`'s stream.
    pub fn record_on(&self, gpu: &Gpu) -> Result<(), CudaError> {
        self.record(gpu.stream)
    }

    /// Records the event on `stream` (a live stream of the current context).
    pub(crate) fn record_in(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        // SAFETY: live event and stream.
        check("cuEventRecord", unsafe {
            cu::event::record(self.0, stream)
        })
    }

    fn record(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        self.record_in(stream)
    }

    /// Makes `gpu`'s stream wait (on the device, not the host) for the work before this
    /// event's last record.
    pub fn wait_on(&self, gpu: &Gpu) -> Result<(), CudaError> {
        self.wait_in(gpu.stream)
    }

    /// Makes `stream` wait on the device for the work before this event's last record.
    pub(crate) fn wait_in(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        // SAFETY: live event and stream.
        check("cuStreamWaitEvent", unsafe {
            cu::stream::wait_event(
                stream,
                self.0,
                sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
            )
        })
    }

    /// Waits on the host for the work before this event's last record.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        // SAFETY: a live event.
        check("cuEventSynchronize", unsafe {
            cu::event::synchronize(self.0)
        })
    }

    /// Seconds from `self` to `end` (both recorded; waits for `end`).
    ///
    /// Calls `cuEventElapsedTime` by its first name, which every driver exports: cudarc's CUDA
    /// 13 bindings would take `cuEventElapsedTime_v2`, which drivers before R570 lack.
    pub fn seconds_to(&self, end: &Event) -> Result<f64, CudaError> {
        // SAFETY: live events.
        unsafe {
            check("cuEventSynchronize", cu::event::synchronize(end.0))?;
        }
        let f = elapsed_time_v1()?;
        let mut ms = 0f32;
        // SAFETY: live, recorded, completed events; one out-parameter.
        check(
            "cuEventElapsedTime",
            unsafe { f(&mut ms, self.0, end.0) }.result(),
        )?;
        Ok(ms as f64 * 1e-3)
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        // SAFETY: created by cuEventCreate, destroyed once.
        unsafe {
            let _ = cu::event::destroy(self.0);
        }
    }
}

type ElapsedFn = unsafe extern "C" fn(*mut f32, sys::CUevent, sys::CUevent) -> sys::CUresult;

/// `cuEventElapsedTime` (the first version: same signature as `_v2`, exported by every driver).
fn elapsed_time_v1() -> Result<ElapsedFn, CudaError> {
    static F: std::sync::OnceLock<Option<ElapsedFn>> = std::sync::OnceLock::new();
    let f = F.get_or_init(|| {
        // SAFETY: the driver library is loaded (events exist); `get` only looks the symbol up,
        // and the symbol has exactly this signature in cuda.h.
        unsafe {
            sys::culib()
                .get::<ElapsedFn>(b"cuEventElapsedTime\0")
                .ok()
                .map(|s| *s)
        }
    });
    f.ok_or_else(|| CudaError::Call {
        call: "cuEventElapsedTime".into(),
        detail: "the driver library does not export it".into(),
    })
}

/// One kernel argument: a pointer to the value, as cuLaunchKernel wants it.
pub fn arg<T>(v: &T) -> *mut c_void {
    v as *const T as *mut c_void
}

struct Module {
    file: &'static str,
    module: sys::CUmodule,
    /// `sm_90` (SASS) or `compute_90` (PTX, JIT-compiled by the driver).
    loaded_as: String,
}

/// One GPU with its primary context and a stream.
pub struct Gpu {
    pub ordinal: usize,
    pub dev: sys::CUdevice,
    pub ctx: sys::CUcontext,
    pub stream: sys::CUstream,
    pub name: String,
    pub uuid: [u8; 16],
    pub cc: (i32, i32),
    pub sms: u32,
    pub l2_bytes: u64,
    pub memory_bytes: u64,
    pub max_threads_per_sm: u32,
    modules: Vec<Module>,
    /// Pinned memory that host-to-device copies are staged through ([`Gpu::copy_in_async`]).
    staging: std::cell::RefCell<Staging>,
    /// What reads this GPU's conditions at the end of each timed sample, and the readings of
    /// the measurement in progress ([`Gpu::watched`]).
    watch: std::cell::RefCell<Watch>,
    /// How many times the host has waited for this GPU's stream ([`Gpu::sync`], and every
    /// copy back, which waits): a training step counts its own.
    syncs: std::cell::Cell<u64>,
}

/// Reads a GPU's conditions (NVML's SM clock, power and throttle reasons) at one moment.
pub type Reader = Box<dyn Fn() -> roofline_collectors::nvml::Reading>;

#[derive(Default)]
struct Watch {
    reader: Option<Reader>,
    readings: Vec<roofline_collectors::nvml::Reading>,
}

/// Pinned host memory that uploads are staged through: `cuMemcpyHtoDAsync` from pageable
/// memory "might be synchronous" (the driver's words), so the source could be read after the
/// call returns; from pinned memory the copy is a true DMA. Carved in order and reused only
/// after the stream has been synchronised ([`Gpu::sync`]); a buffer outgrown before that is
/// kept until then.
#[derive(Default)]
struct Staging {
    current: Option<PinnedBuf>,
    used: usize,
    retired: Vec<PinnedBuf>,
}

/// Staging offsets are aligned to this many bytes.
const STAGE_ALIGN: usize = 256;
/// The smallest staging buffer.
const STAGE_MIN: usize = 4 << 20;

/// Where `n` bytes go in a staging buffer of `cap` bytes whose first `used` bytes are taken:
/// `Ok(offset)`, or `Err(capacity)` of the new buffer to allocate (the old one is kept until
/// the next synchronisation; the new one's offset is 0).
fn stage_at(cap: usize, used: usize, n: usize) -> Result<usize, usize> {
    let off = used.next_multiple_of(STAGE_ALIGN);
    if off + n <= cap {
        Ok(off)
    } else {
        Err((2 * cap)
            .max(n.next_multiple_of(STAGE_ALIGN))
            .max(STAGE_MIN))
    }
}

impl Gpu {
    /// Opens device `ordinal` (after [`init`]).
    pub fn open(ordinal: usize) -> Result<Gpu, CudaError> {
        let dev = check("cuDeviceGet", cu::device::get(ordinal as i32))?;
        // SAFETY: `dev` is a valid device; the retained primary context is released in Drop.
        let ctx = check("cuDevicePrimaryCtxRetain", unsafe {
            cu::primary_ctx::retain(dev)
        })?;
        // SAFETY: a live context.
        check("cuCtxSetCurrent", unsafe { cu::ctx::set_current(ctx) })?;
        let stream = match check(
            "cuStreamCreate",
            cu::stream::create(cu::stream::StreamKind::NonBlocking),
        ) {
            Ok(s) => s,
            Err(e) => {
                // SAFETY: retained above.
                unsafe {
                    let _ = cu::primary_ctx::release(dev);
                }
                return Err(e);
            }
        };
        let mut gpu = Gpu {
            ordinal,
            dev,
            ctx,
            stream,
            name: String::new(),
            uuid: [0; 16],
            cc: (0, 0),
            sms: 0,
            l2_bytes: 0,
            memory_bytes: 0,
            max_threads_per_sm: 0,
            modules: Vec::new(),
            staging: Default::default(),
            watch: Default::default(),
            syncs: Default::default(),
        };
        use sys::CUdevice_attribute as A;
        gpu.name = check("cuDeviceGetName", cu::device::get_name(dev))?;
        let uuid = check("cuDeviceGetUuid", cu::device::get_uuid(dev))?;
        for (d, s) in gpu.uuid.iter_mut().zip(uuid.bytes.iter()) {
            // c_char: i8 on x86-64, u8 on aarch64.
            #[allow(clippy::unnecessary_cast)]
            {
                *d = *s as u8;
            }
        }
        gpu.cc = (
            gpu.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?,
            gpu.attribute(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?,
        );
        gpu.sms = gpu.attribute(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
        gpu.l2_bytes = gpu.attribute(A::CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE)? as u64;
        gpu.max_threads_per_sm =
            gpu.attribute(A::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)? as u32;
        // SAFETY: valid device.
        gpu.memory_bytes = check("cuDeviceTotalMem", unsafe { cu::device::total_mem(dev) })? as u64;
        Ok(gpu)
    }

    pub fn attribute(&self, a: sys::CUdevice_attribute) -> Result<i32, CudaError> {
        // SAFETY: valid device.
        check("cuDeviceGetAttribute", unsafe {
            cu::device::get_attribute(self.dev, a)
        })
    }

    /// Compute capability as one number: 8.0 → 80, 9.0 → 90.
    pub fn arch(&self) -> u32 {
        (self.cc.0 * 10 + self.cc.1) as u32
    }

    /// Keeps freed memory in the device's stream-ordered pool instead of returning it to the
    /// driver at every synchronisation (the trainer frees and allocates every step).
    pub fn keep_freed_memory(&self) -> Result<(), CudaError> {
        self.bind()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: out-parameter; a valid device.
        check("cuDeviceGetDefaultMemPool", unsafe {
            sys::cuDeviceGetDefaultMemPool(&mut pool, self.dev).result()
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
        })
    }

    /// Makes this GPU's context current on the calling thread.
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: a live context.
        check("cuCtxSetCurrent", unsafe { cu::ctx::set_current(self.ctx) })
    }

    pub fn alloc(&self, bytes: usize) -> Result<DevBuf, CudaError> {
        self.bind()?;
        DevBuf::new(self.ctx, bytes)
    }

    pub fn alloc_pinned(&self, bytes: usize) -> Result<PinnedBuf, CudaError> {
        self.bind()?;
        PinnedBuf::new(bytes)
    }

    /// `bytes` (at least 4) from the stream's memory pool, in stream order; freed in stream
    /// order when the buffer drops.
    pub fn alloc_async(&self, bytes: usize) -> Result<StreamBuf, CudaError> {
        // SAFETY: stream-ordered allocation on our live stream; freed by StreamBuf's Drop.
        let ptr = check("cuMemAllocAsync", unsafe {
            cu::malloc_async(self.stream, bytes.max(4))
        })?;
        Ok(StreamBuf {
            ptr,
            bytes,
            stream: self.stream,
        })
    }

    /// Enqueues the copy of `data` to device address `dst` on this GPU's stream. `data` is
    /// first copied into this GPU's pinned staging memory (not reused before the next
    /// [`Gpu::sync`]), so it may go away as soon as the call returns, and the copy itself is
    /// asynchronous.
    ///
    /// # Safety
    /// `dst` is an allocation of this GPU's context with at least `size_of_val(data)` bytes
    /// from it on, alive until the copy has run (stream-ordered frees keep that).
    pub unsafe fn copy_in_async<T: Pod>(&self, dst: u64, data: &[T]) -> Result<(), CudaError> {
        let n = std::mem::size_of_val(data);
        if n == 0 {
            return Ok(());
        }
        let mut st = self.staging.borrow_mut();
        let cap = st.current.as_ref().map_or(0, |b| b.bytes);
        let off = match stage_at(cap, st.used, n) {
            Ok(off) => off,
            Err(bytes) => {
                let fresh = self.alloc_pinned(bytes)?;
                if let Some(old) = st.current.replace(fresh) {
                    st.retired.push(old);
                }
                0
            }
        };
        st.used = off + n;
        let Some(buf) = st.current.as_mut() else {
            return Err(CudaError::Check("no staging buffer".into()));
        };
        let stage = &mut buf.as_mut_slice::<u8>()[off..off + n];
        // SAFETY: `data` is `n` bytes of plain old data.
        parallel_copy(stage, unsafe {
            std::slice::from_raw_parts(data.as_ptr() as *const u8, n)
        });
        // SAFETY: the caller's contract for `dst`; the source is pinned memory that stays
        // untouched until the stream's next synchronisation.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, stage.as_ptr() as *const c_void, n, self.stream).result()
        })
    }

    /// `len` elements from device address `src`, after everything enqueued on this GPU's
    /// stream so far (waits for the copy).
    ///
    /// # Safety
    /// `src` is an allocation of this GPU's context holding at least `len` elements of `T`.
    pub unsafe fn copy_out<T: Pod>(&self, src: u64, len: usize) -> Result<Vec<T>, CudaError> {
        let mut v = vec![T::default(); len];
        if len == 0 {
            return Ok(v);
        }
        // SAFETY: the caller's contract for `src`; `v` holds `len` elements, and we wait for
        // the copy before `v` is read or moved.
        check("cuMemcpyDtoHAsync", unsafe {
            cu::memcpy_dtoh_async(&mut v, src, self.stream)
        })?;
        self.sync()?;
        Ok(v)
    }

    /// Enqueues zeroing `bytes` from device address `dst` on this GPU's stream.
    ///
    /// # Safety
    /// `dst` is an allocation of this GPU's context with at least `bytes` bytes from it on.
    pub unsafe fn zero_async(&self, dst: u64, bytes: usize) -> Result<(), CudaError> {
        // SAFETY: the caller's contract.
        check("cuMemsetD8Async", unsafe {
            cu::memset_d8_async(dst, 0, bytes, self.stream)
        })
    }

    /// Enqueues the copy of `bytes` from device address `src` to `dst` on this GPU's stream.
    ///
    /// # Safety
    /// `src` and `dst` are allocations of this GPU's context with at least `bytes` from them
    /// on, not overlapping, alive until the copy has run (stream-ordered frees keep that).
    pub unsafe fn copy_on_device(&self, dst: u64, src: u64, bytes: usize) -> Result<(), CudaError> {
        if bytes == 0 {
            return Ok(());
        }
        // SAFETY: the caller's contract.
        check("cuMemcpyDtoDAsync", unsafe {
            cu::memcpy_dtod_async(dst, src, bytes, self.stream)
        })
    }

    /// Copies host data into a new device buffer, in order on this GPU's stream, and waits
    /// for it: a synchronous `cuMemcpyHtoD` is ordered only against the legacy default stream,
    /// never against our non-blocking one, so work already queued there could still read the
    /// buffer's memory, and work queued after could run before the copy had landed.
    pub fn upload<T: Pod>(&self, data: &[T]) -> Result<DevBuf, CudaError> {
        let b = self.alloc(std::mem::size_of_val(data))?;
        self.upload_into(&b, data)?;
        Ok(b)
    }

    /// Copies `data` into the start of `b` on this GPU's stream and waits for the copy
    /// (pageable host memory: the driver stages it, and `data` must live until it is done).
    pub fn upload_into<T: Pod>(&self, b: &DevBuf, data: &[T]) -> Result<(), CudaError> {
        if std::mem::size_of_val(data) > b.bytes {
            return Err(CudaError::Check(format!(
                "upload of {} bytes into a {}-byte buffer",
                std::mem::size_of_val(data),
                b.bytes
            )));
        }
        self.bind()?;
        // SAFETY: `b` holds at least size_of_val(data) bytes (checked above); we wait for the
        // copy before `data` can go away.
        unsafe { self.copy_in_async(b.ptr, data)? };
        self.sync()
    }

    /// Copies a whole device buffer back as `T`s, after the work queued before it on this
    /// GPU's stream.
    pub fn download<T: Pod>(&self, b: &DevBuf) -> Result<Vec<T>, CudaError> {
        self.bind()?;
        // SAFETY: the buffer holds bytes / size_of::<T>() whole elements.
        unsafe { self.copy_out(b.ptr, b.bytes / std::mem::size_of::<T>()) }
    }

    pub fn zero(&self, b: &DevBuf) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: the whole buffer, on our stream.
        unsafe { self.zero_async(b.ptr, b.bytes) }
    }

    /// The host's waits for this GPU's stream so far ([`Gpu::sync`]).
    pub fn syncs(&self) -> u64 {
        self.syncs.get()
    }

    pub fn sync(&self) -> Result<(), CudaError> {
        self.syncs.set(self.syncs.get() + 1);
        // SAFETY: live stream.
        check("cuStreamSynchronize", unsafe {
            cu::stream::synchronize(self.stream)
        })?;
        // Every staged upload has landed: the staging memory may be reused.
        let mut st = self.staging.borrow_mut();
        st.used = 0;
        st.retired.clear();
        Ok(())
    }

    /// The function `kernel`, compiling and loading its source on first use: SASS for this
    /// GPU's architecture when NVRTC knows it, else PTX for the driver to JIT.
    pub fn function(&mut self, kernel: &str) -> Result<sys::CUfunction, CudaError> {
        let source = nvrtc::source_of(kernel)
            .ok_or_else(|| CudaError::Check(format!("no kernel named {kernel}")))?;
        self.bind()?;
        if !self.modules.iter().any(|m| m.file == source.file) {
            let arch = self.arch();
            let supported = nvrtc::supported_archs()?;
            let target = source.target_on(arch, &supported).map_err(|why| {
                CudaError::Unsupported(format!(
                    "NVRTC {}: {why}",
                    nvrtc::version()
                        .map(|v| format!("{}.{}", v.0, v.1))
                        .unwrap_or_default(),
                ))
            })?;
            let compiled = nvrtc::compile(source, target)?;
            let mut image = compiled.image;
            if !compiled.target.is_sass() {
                image.push(0); // PTX is loaded as a C string
            }
            // SAFETY: a complete cubin or NUL-terminated PTX image.
            let module = check("cuModuleLoadData", unsafe {
                cu::module::load_data(image.as_ptr() as *const c_void)
            })?;
            self.modules.push(Module {
                file: source.file,
                module,
                loaded_as: compiled.target.name(),
            });
        }
        let m = self
            .modules
            .iter()
            .find(|m| m.file == source.file)
            .ok_or_else(|| CudaError::Check("module vanished".into()))?;
        let name =
            std::ffi::CString::new(kernel).map_err(|_| CudaError::Check("kernel name".into()))?;
        // SAFETY: a loaded module.
        check(&format!("cuModuleGetFunction({kernel})"), unsafe {
            cu::module::get_function(m.module, name)
        })
    }

    /// How each loaded source was compiled (`fma.cu: sm_90`).
    pub fn loaded(&self) -> Vec<String> {
        self.modules
            .iter()
            .map(|m| format!("{}: {}", m.file, m.loaded_as))
            .collect()
    }

    /// Launches `f` on this GPU's stream.
    ///
    /// # Safety
    /// `f` comes from [`Gpu::function`] of this GPU, and `args` has one pointer per kernel
    /// parameter, in order, each to a value of the parameter's exact type (device pointers as
    /// `CUdeviceptr`), with every buffer they point to alive until the kernel has finished.
    pub unsafe fn launch(
        &self,
        f: sys::CUfunction,
        grid: u32,
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract above; cuLaunchKernel copies the argument values.
        check("cuLaunchKernel", unsafe {
            cu::launch_kernel(f, (grid, 1, 1), (block, 1, 1), 0, self.stream, args)
        })
    }

    /// [`Gpu::launch`] over a two-dimensional grid (`grid.1` ≤ 65535).
    ///
    /// # Safety
    /// As [`Gpu::launch`].
    pub unsafe fn launch_2d(
        &self,
        f: sys::CUfunction,
        grid: (u32, u32),
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        // SAFETY: the caller's contract; cuLaunchKernel copies the argument values.
        check("cuLaunchKernel", unsafe {
            cu::launch_kernel(f, (grid.0, grid.1, 1), (block, 1, 1), 0, self.stream, args)
        })
    }

    /// Seconds taken on the GPU by what `work` enqueues on this GPU's stream.
    pub fn time(&self, mut work: impl FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
        let (start, end) = (Event::new()?, Event::new()?);
        start.record(self.stream)?;
        work()?;
        end.record(self.stream)?;
        start.seconds_to(&end)
    }

    /// Blocks of `block` threads that fill every SM `per_sm_threads` deep.
    pub fn grid_for(&self, block: u32, per_sm_threads: u32) -> u32 {
        (self.sms * (per_sm_threads.min(self.max_threads_per_sm.max(block)) / block)).max(1)
    }
}

/// A GPU's timer for the driver: CUDA events around the work on its stream; settling syncs
/// the stream.
pub struct Events<'a>(pub &'a Gpu);

impl crate::driver::Timer for Events<'_> {
    type Error = CudaError;
    fn time(&mut self, work: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
        self.0.time(work)
    }
    fn settle(&mut self) -> Result<(), CudaError> {
        self.0.sync()
    }
    fn observe(&mut self) {
        self.0.observe();
    }
}

impl Gpu {
    /// Reads this GPU's conditions with `reader` at the end of every timed sample from now on.
    pub fn set_reader(&self, reader: Reader) {
        self.watch.borrow_mut().reader = Some(reader);
    }

    /// One reading, at the end of a timed sample (nothing without a reader).
    pub(crate) fn observe(&self) {
        let mut w = self.watch.borrow_mut();
        if let Some(r) = &w.reader {
            let reading = r();
            w.readings.push(reading);
        }
    }

    /// Runs `measure` (which times its samples with [`Events`] on this GPU) and returns its
    /// result with the conditions of its samples: NVML's readings at the end of each, a
    /// throttled sample left out ([`SampleConditions::gpu`]). `None` without a reader, or when
    /// the readings are not one per sample of `samples(&result)`.
    ///
    /// [`SampleConditions::gpu`]: roofline_model::conditions::SampleConditions::gpu
    pub fn watched<T, E>(
        &self,
        measure: impl FnOnce() -> Result<T, E>,
        samples: impl Fn(&T) -> usize,
    ) -> Result<(T, Option<roofline_model::conditions::SampleConditions>), E> {
        self.watch.borrow_mut().readings.clear();
        let out = measure()?;
        let readings = std::mem::take(&mut self.watch.borrow_mut().readings);
        let conditions = (!readings.is_empty() && readings.len() == samples(&out)).then(|| {
            roofline_model::conditions::SampleConditions::gpu(
                readings.iter().map(|r| r.sm_clock_mhz).collect(),
                readings.iter().map(|r| r.power_w).collect(),
                readings.into_iter().map(|r| r.throttle).collect(),
            )
        });
        Ok((out, conditions))
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        // SAFETY: everything below was created by this Gpu and is released once.
        unsafe {
            let _ = cu::ctx::set_current(self.ctx);
            let _ = cu::stream::synchronize(self.stream);
            // The staging memory is freed while its context lives.
            *self.staging.get_mut() = Staging::default();
            for m in self.modules.drain(..) {
                let _ = cu::module::unload(m.module);
            }
            let _ = cu::stream::destroy(self.stream);
            let _ = cu::primary_ctx::release(self.dev);
        }
    }
}

#[cfg(test)]
mod tests;
