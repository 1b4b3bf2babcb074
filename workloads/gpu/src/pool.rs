//! The trainer's device memory, recycled. Every buffer a step takes ([`Ctx::alloc`]) goes back,
//! when it drops, to a free list of its size class, and the next request of that class takes
//! it instead of allocating: after the first two steps, a step of the same shapes allocates
//! nothing (its requests repeat, in the same order; the second may still allocate where a
//! buffer the first kept for good was taken from the free list at a moment of low demand). All of it is used on the training stream alone,
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

/// Free buffers (`B`: device buffers; plain ids in the tests) by size class, and how many the
/// pool had to allocate.
pub(super) struct Pool<B = StreamBuf> {
    free: HashMap<usize, Vec<B>>,
    allocations: u64,
    /// While a step is captured into a CUDA graph: only free buffers are handed out (an
    /// allocation would be captured as the graph's own, and the pool would keep an address
    /// that no launch had allocated yet).
    sealed: bool,
}

impl<B> Default for Pool<B> {
    fn default() -> Self {
        Pool {
            free: HashMap::new(),
            allocations: 0,
            sealed: false,
        }
    }
}

impl<B> Pool<B> {
    /// A buffer of `class`: a free one, or a new one from `alloc` (counted); none, with
    /// `sealed()`'s error, when sealed and none of its class is free.
    fn take<E>(
        &mut self,
        class: usize,
        alloc: impl FnOnce() -> Result<B, E>,
        sealed: impl FnOnce() -> E,
    ) -> Result<B, E> {
        if let Some(b) = self.free.get_mut(&class).and_then(Vec::pop) {
            return Ok(b);
        }
        if self.sealed {
            return Err(sealed());
        }
        let b = alloc()?;
        self.allocations += 1;
        Ok(b)
    }

    fn give(&mut self, class: usize, b: B) {
        self.free.entry(class).or_default().push(b);
    }

    /// Drops every free buffer (how many there were); buffers in use still come back.
    fn clear(&mut self) -> usize {
        self.free.drain().map(|(_, v)| v.len()).sum()
    }
}

/// A device buffer of the trainer's, handed back to its pool when it drops.
pub struct Buf {
    pub ptr: u64,
    /// The bytes asked for (its class may hold more).
    pub bytes: usize,
    inner: Option<StreamBuf>,
    pool: Weak<RefCell<Pool>>,
}

impl Buf {
    /// The same memory under a second name that hands nothing back when it drops: for a
    /// buffer that must outlive the step that consumes it (a captured step's input, read at
    /// every launch), given to that step while its owner keeps the buffer. The alias must not
    /// outlive the owner.
    pub(super) fn alias(&self) -> Buf {
        Buf {
            ptr: self.ptr,
            bytes: self.bytes,
            inner: None,
            pool: Weak::new(),
        }
    }
}

impl Drop for Buf {
    fn drop(&mut self) {
        if let (Some(b), Some(pool)) = (self.inner.take(), self.pool.upgrade()) {
            let class = b.bytes;
            pool.borrow_mut().give(class, b);
        }
        // Without the pool (the context is gone) the buffer is freed in stream order.
    }
}

impl Ctx {
    /// `bytes` of device memory for work on the training stream: a recycled buffer of its
    /// class, or a new one.
    pub fn alloc(&self, bytes: usize) -> Result<Buf, CudaError> {
        let class = size_class(bytes);
        let inner = self.pool.borrow_mut().take(
            class,
            || self.gpu.alloc_async(class),
            || {
                CudaError::Check(format!(
                    "a step being captured into a CUDA graph asked for {bytes} bytes that the pool did not hold"
                ))
            },
        )?;
        Ok(Buf {
            ptr: inner.ptr,
            bytes,
            inner: Some(inner),
            pool: Rc::downgrade(&self.pool),
        })
    }

    /// Seals the pool (`on`: only the buffers it holds are handed out; an allocation fails),
    /// or unseals it.
    pub(super) fn seal_pool(&self, on: bool) {
        self.pool.borrow_mut().sealed = on;
    }

    /// Hands the free buffers back to the driver, in stream order (its memory pool keeps them
    /// for any size): for a context that trains another network next (AutoML's worker), whose
    /// size classes are not this one's, so that the pool does not grow with every candidate.
    pub fn release_free_buffers(&self) -> usize {
        self.pool.borrow_mut().clear()
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

    #[test]
    fn from_the_third_step_on_a_step_of_the_same_shapes_allocates_nothing() {
        // A step's requests of one class, as a trainer makes them: transient buffers taken
        // and handed back, and, in the first step only, one kept for good (batch norm's
        // running statistics) taken from the free list after the transient peak has passed:
        // the second step's peak then finds one buffer short.
        let mut pool = Pool::<u32>::default();
        let mut next = 0u32;
        let mut kept = Vec::new();
        let mut per_step = Vec::new();
        for step in 0..4 {
            let before = pool.allocations;
            let mut alloc = || -> Result<u32, ()> {
                next += 1;
                Ok(next)
            };
            let live: Vec<u32> = (0..3)
                .map(|_| pool.take(1024, &mut alloc, || ()).unwrap())
                .collect();
            for b in live {
                pool.give(1024, b);
            }
            if step == 0 {
                kept.push(pool.take(1024, &mut alloc, || ()).unwrap());
            }
            per_step.push(pool.allocations - before);
        }
        assert_eq!(per_step, [3, 1, 0, 0]);
        assert_eq!(kept.len(), 1);
    }

    #[test]
    fn a_cleared_pool_holds_nothing_and_allocates_again() {
        let mut pool = Pool::<u32>::default();
        let mut next = 0u32;
        let mut alloc = || -> Result<u32, ()> {
            next += 1;
            Ok(next)
        };
        let (a, b) = (
            pool.take(1024, &mut alloc, || ()).unwrap(),
            pool.take(2048, &mut alloc, || ()).unwrap(),
        );
        pool.give(1024, a);
        pool.give(2048, b);
        assert_eq!(pool.clear(), 2);
        assert_eq!(pool.clear(), 0);
        let before = pool.allocations;
        pool.take(1024, &mut alloc, || ()).unwrap();
        assert_eq!(pool.allocations, before + 1);
    }

    #[test]
    fn a_sealed_pool_hands_out_what_it_holds_and_allocates_nothing() {
        let mut pool = Pool::<u32>::default();
        let mut next = 0u32;
        let mut alloc = || -> Result<u32, &str> {
            next += 1;
            Ok(next)
        };
        let a = pool.take(512, &mut alloc, || "sealed").unwrap();
        pool.give(512, a);
        pool.sealed = true;
        // The free buffer is handed out again; a second of its class, or one of another
        // class, would need an allocation: refused, and nothing counted.
        assert_eq!(pool.take(512, &mut alloc, || "sealed"), Ok(a));
        assert_eq!(pool.take(512, &mut alloc, || "sealed"), Err("sealed"));
        assert_eq!(pool.take(1024, &mut alloc, || "sealed"), Err("sealed"));
        assert_eq!(pool.allocations, 1);
        pool.sealed = false;
        assert_eq!(pool.take(1024, &mut alloc, || "sealed"), Ok(2));
    }
}
