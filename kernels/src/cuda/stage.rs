//! Training batches staged ahead of the step that trains on them. The loader's thread, as soon
//! as it has read a batch, writes it into pinned memory in the trainer's storage format (f32,
//! or rounded to f16/bf16: half the bytes on the bus) and enqueues its upload on a copy stream
//! of its own, while the GPU is still training on the previous batch. The step then makes its
//! stream wait for that upload on the device (no host wait) and copies the batch out of the
//! stager's device buffer (device to device: microseconds), so the GPU waits neither for the
//! host's copy nor for the bus.
//!
//! Two slots, used in turn: a slot's pinned memory is rewritten only after its last upload has
//! finished (the loader's thread waits for that upload's event), and its device buffer only
//! after the step that read it has copied it out (the copy stream waits for that copy's
//! event). A step takes a batch only if a slot holds exactly it: the same address, length and
//! sampled contents, taken once; anything else is uploaded the ordinary way.

use super::device::{check, DevBuf, Event, Gpu, PinnedBuf};
use super::{CudaError, Storage};
use cudarc::driver::result as cu;
use cudarc::driver::sys;
use std::ffi::c_void;
use std::sync::Mutex;

/// Which batch a slot holds: its host address and length, and four of its values' bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    addr: usize,
    len: usize,
    sample: [u32; 4],
}

impl Held {
    fn of(data: &[f32]) -> Held {
        let n = data.len();
        let at = |i: usize| {
            data.get(i.min(n.saturating_sub(1)))
                .map_or(0, |v| v.to_bits())
        };
        Held {
            addr: data.as_ptr() as usize,
            len: n,
            sample: [at(0), at(n / 3), at(2 * n / 3), at(n.saturating_sub(1))],
        }
    }
}

struct Slot {
    host: Option<PinnedBuf>,
    dev: Option<DevBuf>,
    /// Recorded on the copy stream after the slot's upload.
    uploaded: Event,
    /// Recorded on the training stream after the step's copy out of the slot.
    consumed: Event,
    used: bool,
    holds: Option<Held>,
}

/// See the module's documentation.
pub struct Stager {
    /// The GPU's primary context, retained by the stager (the loop may hold it after the
    /// trainer has gone).
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    store: Storage,
    slots: [Mutex<Slot>; 2],
    next: Mutex<usize>,
    /// The first staging failure was reported (later ones fall back silently: the step
    /// uploads the batch itself).
    reported: std::sync::atomic::AtomicBool,
}

// SAFETY: the context and stream are driver handles, usable from any thread (the driver API is
// thread-safe; each call binds the context first); the slots' memory is reached only under
// their mutexes.
unsafe impl Send for Stager {}
// SAFETY: as above: every mutable state is behind a Mutex.
unsafe impl Sync for Stager {}

impl Drop for Stager {
    fn drop(&mut self) {
        // SAFETY: our retained context and our stream; the stream is drained before the
        // slots' memory goes, and the context is released last.
        unsafe {
            let _ = cu::ctx::set_current(self.ctx);
            let _ = cu::stream::synchronize(self.stream);
            for s in &self.slots {
                let mut slot = s.lock().unwrap_or_else(|e| e.into_inner());
                let _ = slot.consumed.synchronize();
                slot.host = None;
                slot.dev = None;
            }
            let _ = cu::stream::destroy(self.stream);
            let _ = cu::primary_ctx::release(self.dev);
        }
    }
}

impl Stager {
    /// A stager for `gpu`'s trainer, whose batches are stored as `store`.
    pub fn new(gpu: &Gpu, store: Storage) -> Result<Stager, CudaError> {
        gpu.bind()?;
        // SAFETY: a valid device; released in Drop (or below, on failure).
        let ctx = check("cuDevicePrimaryCtxRetain", unsafe {
            cu::primary_ctx::retain(gpu.dev)
        })?;
        let release = || {
            // SAFETY: retained above.
            unsafe {
                let _ = cu::primary_ctx::release(gpu.dev);
            }
        };
        let stream = match check(
            "cuStreamCreate",
            cu::stream::create(cu::stream::StreamKind::NonBlocking),
        ) {
            Ok(s) => s,
            Err(e) => {
                release();
                return Err(e);
            }
        };
        let slot = || -> Result<Mutex<Slot>, CudaError> {
            Ok(Mutex::new(Slot {
                host: None,
                dev: None,
                uploaded: Event::new()?,
                consumed: Event::new()?,
                used: false,
                holds: None,
            }))
        };
        let slots = match (slot(), slot()) {
            (Ok(a), Ok(b)) => [a, b],
            (Err(e), _) | (_, Err(e)) => {
                // SAFETY: created above, unused.
                unsafe {
                    let _ = cu::stream::destroy(stream);
                }
                release();
                return Err(e);
            }
        };
        Ok(Stager {
            dev: gpu.dev,
            ctx,
            stream,
            store,
            slots,
            next: Mutex::new(0),
            reported: Default::default(),
        })
    }

    /// On any thread: `data` into the next slot, in the storage format, and its upload
    /// enqueued on the copy stream. A failure is reported once, on standard error, and the
    /// step then uploads the batch itself.
    pub fn stage(&self, data: &[f32]) {
        if let Err(e) = self.try_stage(data) {
            if !self
                .reported
                .swap(true, std::sync::atomic::Ordering::Relaxed)
            {
                eprintln!("note: batches are uploaded at each step's start: staging failed: {e}");
            }
        }
    }

    fn try_stage(&self, data: &[f32]) -> Result<(), CudaError> {
        let i = {
            let mut next = self.next.lock().unwrap_or_else(|e| e.into_inner());
            let i = *next;
            *next = (i + 1) % self.slots.len();
            i
        };
        let mut guard = self.slots[i].lock().unwrap_or_else(|e| e.into_inner());
        let slot = &mut *guard;
        slot.holds = None;
        // SAFETY: a live context.
        check("cuCtxSetCurrent", unsafe { cu::ctx::set_current(self.ctx) })?;
        let bytes = data.len() * self.store.bytes();
        if slot.used {
            // The slot's last upload has left its pinned memory.
            slot.uploaded.synchronize()?;
        }
        if slot.host.as_ref().is_none_or(|h| h.bytes < bytes) {
            // A larger batch: the old buffers go once nothing reads them.
            slot.consumed.synchronize()?;
            slot.host = None;
            slot.dev = None;
            slot.host = Some(pinned(bytes)?);
            slot.dev = Some(device(self.ctx, bytes)?);
        }
        let (Some(host), Some(dev)) = (slot.host.as_mut(), slot.dev.as_ref()) else {
            return Err(CudaError::Check("a staging slot without memory".into()));
        };
        match self.store {
            Storage::F32 => super::device::parallel_copy(
                &mut host.as_mut_slice::<u8>()[..bytes],
                // SAFETY: f32 is plain old data; the view is `bytes` long.
                unsafe { std::slice::from_raw_parts(data.as_ptr() as *const u8, bytes) },
            ),
            dt => narrow_into(dt, &mut host.as_mut_slice::<u16>()[..data.len()], data),
        }
        let (dst, src) = (dev.ptr, host.as_mut_slice::<u8>().as_ptr());
        if slot.used {
            // The step that read this slot's device buffer has copied it out.
            slot.consumed.wait_in(self.stream)?;
        }
        // SAFETY: `dst` holds `bytes` (allocated above for at least that), `src` is pinned
        // memory of at least `bytes` that nothing rewrites before `uploaded` has passed.
        check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dst, src as *const c_void, bytes, self.stream).result()
        })?;
        slot.uploaded.record_in(self.stream)?;
        slot.used = true;
        slot.holds = Some(Held::of(data));
        Ok(())
    }

    /// On the training thread: when a slot holds `data` (staged, not yet taken), makes
    /// `gpu`'s stream wait for its upload, enqueues its copy to `dst` and returns true; else
    /// false (nothing enqueued).
    ///
    /// # Safety
    /// `dst` is a device allocation of `gpu`'s context with room for `data.len()` values of
    /// the storage type, alive until the copy has run (stream-ordered frees keep that).
    pub unsafe fn take(&self, gpu: &Gpu, data: &[f32], dst: u64) -> Result<bool, CudaError> {
        let want = Held::of(data);
        for s in &self.slots {
            let mut guard = s.lock().unwrap_or_else(|e| e.into_inner());
            let slot = &mut *guard;
            if slot.holds != Some(want) {
                continue;
            }
            slot.holds = None;
            let Some(dev) = slot.dev.as_ref() else {
                return Ok(false);
            };
            gpu.bind()?;
            slot.uploaded.wait_on(gpu)?;
            let bytes = data.len() * self.store.bytes();
            // SAFETY: the caller's contract for `dst`; the slot's buffer holds `bytes`, and
            // is not rewritten before `consumed` has passed.
            check("cuMemcpyDtoDAsync", unsafe {
                cu::memcpy_dtod_async(dst, dev.ptr, bytes, gpu.stream)
            })?;
            slot.consumed.record_on(gpu)?;
            return Ok(true);
        }
        Ok(false)
    }
}

/// `bytes` of pinned host memory (the context current).
fn pinned(bytes: usize) -> Result<PinnedBuf, CudaError> {
    PinnedBuf::new(bytes)
}

/// `bytes` of device memory in `ctx` (current).
fn device(ctx: sys::CUcontext, bytes: usize) -> Result<DevBuf, CudaError> {
    DevBuf::new(ctx, bytes)
}

/// `src` rounded to nearest even into `dt`'s 16 bits (f16 or bf16), on up to 8 threads when it
/// is large (a ResNet-50 batch of 128 is 19 M values).
pub fn narrow_into(dt: Storage, dst: &mut [u16], src: &[f32]) {
    let one = |d: &mut [u16], s: &[f32]| match dt {
        Storage::F16 => d
            .iter_mut()
            .zip(s)
            .for_each(|(d, s)| *d = half::f16::from_f32(*s).to_bits()),
        _ => d
            .iter_mut()
            .zip(s)
            .for_each(|(d, s)| *d = half::bf16::from_f32(*s).to_bits()),
    };
    super::device::in_slices(dst, src, 1 << 20, one);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn narrowing_on_threads_rounds_every_value_as_one_thread_does() {
        let src: Vec<f32> = (0..(3 << 20) + 7)
            .map(|i| ((i as f32) * 0.618).sin() * 1000.0)
            .collect();
        for dt in [Storage::F16, Storage::Bf16] {
            let mut d = vec![0u16; src.len()];
            narrow_into(dt, &mut d, &src);
            let mut e = vec![0u16; 5];
            narrow_into(dt, &mut e, &src[..5]);
            assert_eq!(&d[..5], &e[..]);
            let last = src.len() - 1;
            let want = match dt {
                Storage::F16 => half::f16::from_f32(src[last]).to_bits(),
                _ => half::bf16::from_f32(src[last]).to_bits(),
            };
            assert_eq!(d[last], want, "{}", dt.name());
        }
    }

    #[test]
    fn a_batch_is_known_by_address_length_and_contents() {
        let a = vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0];
        let mut b = a.clone();
        assert_eq!(Held::of(&a), Held::of(&a));
        // Another buffer with the same values: another address.
        assert_ne!(Held::of(&a), Held::of(&b));
        // The same buffer rewritten (a batch read into reused memory): other contents.
        let before = Held::of(&b);
        b[5] = 7.0;
        assert_ne!(before, Held::of(&b));
        assert_ne!(Held::of(&a[..5]), Held::of(&a));
        assert_eq!(Held::of(&[]).len, 0);
    }
}
