//! A caching allocator for the training loop's large, recurring blocks.
//!
//! Every training step allocates the same activations, gradients and im2col buffers and frees
//! them again. glibc serves blocks above 32 MiB with a fresh `mmap` each time and returns them
//! with `munmap`, so each step pays a page fault and a kernel page clear for every 4 KiB of every
//! large tensor: about 10% of a ResNet-50 step on this machine (`perf`: `asm_exc_page_fault`,
//! `clear_page_erms`). Like PyTorch's caching allocator, [`Caching`] keeps freed blocks of at
//! least [`MIN_BLOCK`] bytes and hands them back to the next request of the same size and
//! alignment. It is off until [`enable`] is called (the trainer enables it; the probe, whose
//! sweeps allocate many different sizes once, does not), and it holds at most the `cap` given to
//! [`enable`]; the oldest cached block goes back to the system first.
//!
//! Whether or not the cache is on, it starts every block of at least [`MIN_BLOCK`] bytes on a
//! cache line (`placed`): the bf16 products, whose AMX tiles read and write 64-byte rows of
//! the activations, ran a ResNet-50 bf16 step 30% slower on glibc's blocks, 16 bytes past one.
//!
//! The binary installs it with `#[global_allocator]`; a library user who does not keeps the
//! system allocator and loses nothing but the speed-up.

use roofline_kernels::cpu::LINE;
use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

/// Blocks below this size go straight to the system allocator.
pub const MIN_BLOCK: usize = 1 << 20;
/// Slots for cached blocks, reserved when the cache is enabled so that caching never allocates
/// while the cache's lock is held.
const SLOTS: usize = 4096;

static ENABLED: AtomicBool = AtomicBool::new(false);
static CAP: AtomicUsize = AtomicUsize::new(0);
static HITS: AtomicUsize = AtomicUsize::new(0);
static MISSES: AtomicUsize = AtomicUsize::new(0);

struct Block {
    ptr: usize,
    size: usize,
    align: usize,
}

struct Cache {
    blocks: Vec<Block>,
    bytes: usize,
}

static CACHE: Mutex<Cache> = Mutex::new(Cache {
    blocks: Vec::new(),
    bytes: 0,
});

/// The global allocator: the system's, plus the cache of large blocks once [`enable`]d.
pub struct Caching;

/// Starts caching freed blocks of at least [`MIN_BLOCK`] bytes, holding at most `cap` bytes.
/// Returns false when this process's global allocator is not [`Caching`] (nothing is cached
/// then: the blocks never come back through it).
pub fn enable(cap: usize) -> bool {
    {
        let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        let have = c.blocks.capacity();
        if have < SLOTS {
            c.blocks.reserve_exact(SLOTS - have);
        }
    }
    CAP.store(cap, Ordering::Relaxed);
    ENABLED.store(true, Ordering::Release);
    installed()
}

/// [`enable`] with a cap of half the physical memory (8 GiB when it cannot be read).
pub fn enable_for_training() -> bool {
    // SAFETY: sysconf has no preconditions.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let phys = if pages > 0 && size > 0 {
        pages as usize * size as usize
    } else {
        16 << 30
    };
    enable(phys / 2)
}

/// Stops caching and returns every cached block to the system.
pub fn disable() {
    ENABLED.store(false, Ordering::Release);
    let blocks = {
        let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        c.bytes = 0;
        std::mem::take(&mut c.blocks)
    };
    for b in &blocks {
        // SAFETY: every cached block came from System.alloc with this size and alignment and
        // is owned by the cache alone.
        unsafe {
            System.dealloc(
                b.ptr as *mut u8,
                Layout::from_size_align_unchecked(b.size, b.align),
            )
        };
    }
}

/// (requests served from the cache, large requests that were not) since the start.
pub fn stats() -> (usize, usize) {
    (HITS.load(Ordering::Relaxed), MISSES.load(Ordering::Relaxed))
}

/// Whether the global allocator is [`Caching`]: a large block allocated and freed while the
/// cache is enabled comes back on the next request.
fn installed() -> bool {
    let (hits, _) = stats();
    // black_box: an allocation nothing uses may be removed by the optimiser (it was, inlined
    // into a bench binary).
    let v: Vec<u8> = std::hint::black_box(Vec::with_capacity(MIN_BLOCK));
    drop(v);
    let v: Vec<u8> = std::hint::black_box(Vec::with_capacity(MIN_BLOCK));
    drop(v);
    stats().0 > hits
}

impl Caching {
    fn take(layout: Layout) -> Option<*mut u8> {
        if layout.size() < MIN_BLOCK || !ENABLED.load(Ordering::Acquire) {
            return None;
        }
        let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        // Newest first: the block freed last is the likeliest to be in cache.
        let i = c
            .blocks
            .iter()
            .rposition(|b| b.size == layout.size() && b.align == layout.align());
        match i {
            Some(i) => {
                let b = c.blocks.remove(i);
                c.bytes -= b.size;
                HITS.fetch_add(1, Ordering::Relaxed);
                Some(b.ptr as *mut u8)
            }
            None => {
                MISSES.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// Keeps a freed block (returning the oldest cached ones to the system while over the cap);
    /// false when the block is not cached and the system must take it back.
    fn keep(ptr: *mut u8, layout: Layout) -> bool {
        if layout.size() < MIN_BLOCK || !ENABLED.load(Ordering::Acquire) {
            return false;
        }
        let cap = CAP.load(Ordering::Relaxed);
        if layout.size() > cap {
            return false;
        }
        let mut c = CACHE.lock().unwrap_or_else(|e| e.into_inner());
        if c.blocks.len() == c.blocks.capacity() {
            return false;
        }
        while c.bytes + layout.size() > cap {
            let old = c.blocks.remove(0);
            c.bytes -= old.size;
            // SAFETY: as in `disable`; System.dealloc does not come back into this allocator.
            unsafe {
                System.dealloc(
                    old.ptr as *mut u8,
                    Layout::from_size_align_unchecked(old.size, old.align),
                )
            };
        }
        c.bytes += layout.size();
        c.blocks.push(Block {
            ptr: ptr as usize,
            size: layout.size(),
            align: layout.align(),
        });
        true
    }
}

/// The layout a request is served with: blocks of at least [`MIN_BLOCK`] bytes start on a
/// cache line (glibc's large blocks start 16 bytes past a page, so that every row of a tensor
/// whose rows are a multiple of 64 bytes long crossed two cache lines: an AVX-512 store or an
/// AMX tile row then touches two lines, and the bf16 products ran at half speed).
fn placed(layout: Layout) -> Layout {
    if layout.size() >= MIN_BLOCK && layout.align() < LINE {
        // SAFETY: LINE is a power of two and the size was valid with a smaller alignment
        // (sizes this large are far below isize::MAX rounded to a line).
        unsafe { Layout::from_size_align_unchecked(layout.size(), LINE) }
    } else {
        layout
    }
}

// SAFETY: every block handed out is either fresh from System or a System block of exactly the
// requested size and alignment that nobody else holds (it left the cache under the lock).
unsafe impl GlobalAlloc for Caching {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let layout = placed(layout);
        match Caching::take(layout) {
            Some(p) => p,
            None => System.alloc(layout),
        }
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let layout = placed(layout);
        match Caching::take(layout) {
            Some(p) => {
                std::ptr::write_bytes(p, 0, layout.size());
                p
            }
            None => System.alloc_zeroed(layout),
        }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        let layout = placed(layout);
        if !Caching::keep(ptr, layout) {
            System.dealloc(ptr, layout)
        }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        if layout.size() < MIN_BLOCK && new_size < MIN_BLOCK {
            return System.realloc(ptr, layout, new_size);
        }
        let new = Layout::from_size_align_unchecked(new_size, layout.align());
        let p = self.alloc(new);
        if !p.is_null() {
            std::ptr::copy_nonoverlapping(ptr, p, layout.size().min(new_size));
            self.dealloc(ptr, layout);
        }
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    // The test binary's allocator is the system's, so these drive `Caching` directly.
    #[test]
    fn freed_large_blocks_come_back_zeroed_and_small_ones_bypass_the_cache() {
        let a = Caching;
        enable(8 * MIN_BLOCK);
        let big = Layout::from_size_align(3 * MIN_BLOCK, 64).unwrap();
        let (h0, _) = stats();
        // SAFETY: layouts are non-zero; every pointer is freed once with its layout.
        unsafe {
            let p = a.alloc(big);
            assert!(!p.is_null());
            std::ptr::write_bytes(p, 7, big.size());
            a.dealloc(p, big);
            let q = a.alloc_zeroed(big);
            assert_eq!(q, p, "the freed block is handed back");
            assert!(std::slice::from_raw_parts(q, big.size())
                .iter()
                .all(|&b| b == 0));
            // Another alignment is another block.
            let other = Layout::from_size_align(3 * MIN_BLOCK, 4096).unwrap();
            a.dealloc(q, big);
            let r = a.alloc(other);
            assert_ne!(r, q);
            a.dealloc(r, other);
            // Over the cap, the oldest blocks go back to the system.
            let huge = Layout::from_size_align(7 * MIN_BLOCK, 64).unwrap();
            let s = a.alloc(huge);
            a.dealloc(s, huge);
            let c = CACHE.lock().unwrap();
            assert!(c.bytes <= 8 * MIN_BLOCK);
            assert_eq!(c.blocks.last().map(|b| b.size), Some(huge.size()));
            drop(c);
            let small = Layout::from_size_align(1000, 8).unwrap();
            let t = a.alloc(small);
            a.dealloc(t, small);
        }
        assert!(stats().0 > h0);
        // A large block asked with a small alignment starts on a cache line, cached or not.
        let rows = Layout::from_size_align(MIN_BLOCK + 4, 4).unwrap();
        for _ in 0..2 {
            // SAFETY: as above.
            unsafe {
                let p = a.alloc(rows);
                assert_eq!(p as usize % 64, 0);
                a.dealloc(p, rows);
            }
        }
        disable();
        assert_eq!(CACHE.lock().unwrap().bytes, 0);
        assert!(
            !enable(MIN_BLOCK),
            "the test binary's allocator is not Caching"
        );
        disable();
    }
}
