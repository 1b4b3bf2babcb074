//! The trainer's device memory, recycled. Every buffer a step takes ([`Ctx::alloc`]) goes back,
//! when it drops, to a free list of its size class, and the next request of that class takes
//! it instead of allocating: after the first step, a step of the same shapes allocates nothing
//! (its requests repeat, in the same order). All of it is used on the training stream alone,
//! so a buffer handed back while kernels that read it are still queued is safe to hand out
//! again: whatever is enqueued with it next runs after them. Sizes are rounded up to a class
//! (2ᵏ·(1 + j/4)), so that at most a fifth is wasted and a request of a nearby size (the
//! detector's proposals) still finds a buffer.

use super::*;
use roofline_kernels::cuda::device::StreamBuf;
use std::cell::RefCell;
use std::rc::Weak;

/// The class of a request of `bytes`: the next of 2ᵏ, 2ᵏ·5/4, 2ᵏ·6/4, 2ᵏ·7/4 at or above it
/// (256 bytes at least).
pub(super) fn size_class(bytes: usize) -> usize {
    let b = bytes.max(256);
    let base = 1usize << (usize::BITS - 1 - b.leading_zeros());
    let quarter = base / 4;
    base + (b - base).div_ceil(quarter) * quarter
}

/// Free buffers by size class, and how many the pool had to allocate.
#[derive(Default)]
pub(super) struct Pool {
    free: HashMap<usize, Vec<StreamBuf>>,
    allocations: u64,
}

/// A device buffer of the trainer's, handed back to its pool when it drops.
pub struct Buf {
    pub ptr: u64,
    /// The bytes asked for (its class may hold more).
    pub bytes: usize,
    inner: Option<StreamBuf>,
    pool: Weak<RefCell<Pool>>,
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let (Some(b), Some(pool)) = (self.inner.take(), self.pool.upgrade()) {
            let class = b.bytes;
            pool.borrow_mut().free.entry(class).or_default().push(b);
        }
        // Without the pool (the context is gone) the buffer is freed in stream order.
    }
}

impl Ctx {
    /// `bytes` of device memory for work on the training stream: a recycled buffer of its
    /// class, or a new one.
    pub fn alloc(&self, bytes: usize) -> Result<Buf, CudaError> {
        let class = size_class(bytes);
        let reused = self
            .pool
            .borrow_mut()
            .free
            .get_mut(&class)
            .and_then(Vec::pop);
        let inner = match reused {
            Some(b) => b,
            None => {
                let b = self.gpu.alloc_async(class)?;
                self.pool.borrow_mut().allocations += 1;
                b
            }
        };
        Ok(Buf {
            ptr: inner.ptr,
            bytes,
            inner: Some(inner),
            pool: Rc::downgrade(&self.pool),
        })
    }

    /// The device allocations made so far (a step that made none took every buffer from the
    /// pool).
    pub fn allocations(&self) -> u64 {
        self.pool.borrow().allocations
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_size_class_holds_its_request_and_wastes_at_most_a_fifth() {
        let mut last = 0;
        for b in (1..5000).chain([65_536, 65_537, 77_070_336, (1 << 30) + 1]) {
            let c = size_class(b);
            assert!(c >= b && c >= 256, "{b} → {c}");
            if b > 256 {
                assert!((c - b) as f64 <= 0.2 * c as f64, "{b} → {c}");
            }
            // Classes never shrink as requests grow, and a class is its own class.
            assert!(c >= last);
            assert_eq!(size_class(c), c);
            last = c;
        }
        assert_eq!(size_class(257), 320);
        assert_eq!(size_class(1024), 1024);
        assert_eq!(size_class(1025), 1280);
    }
}
