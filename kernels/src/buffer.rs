//! Page-aligned, zero-initialised buffers of plain numbers (aligned for 512-bit and
//! non-temporal accesses; first touched by the thread that allocates them).

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// Alignment of every buffer: a 4 KiB page.
pub const ALIGN: usize = 4096;

/// Marker for the element types a [`Buffer`] may hold: plain numbers for which all-zero bytes
/// are a valid value.
///
/// # Safety
/// Implementors must be valid for the all-zero bit pattern and have no drop glue.
pub unsafe trait Zeroable: Copy + Send + Sync + 'static {}
unsafe impl Zeroable for f32 {}
unsafe impl Zeroable for f64 {}
unsafe impl Zeroable for u8 {}
unsafe impl Zeroable for i8 {}
unsafe impl Zeroable for i32 {}
unsafe impl Zeroable for u64 {}
unsafe impl Zeroable for half::f16 {}
unsafe impl Zeroable for half::bf16 {}

/// A heap buffer aligned to [`ALIGN`] (or starting `offset` bytes past a page boundary).
pub struct Buffer<T: Zeroable> {
    ptr: NonNull<T>,
    len: usize,
    /// Bytes between the allocation's start (page-aligned) and the first element.
    offset: usize,
}

// SAFETY: Buffer owns its allocation exclusively, like Vec<T>.
unsafe impl<T: Zeroable> Send for Buffer<T> {}
unsafe impl<T: Zeroable> Sync for Buffer<T> {}

impl<T: Zeroable> Buffer<T> {
    fn layout(len: usize, offset: usize) -> Option<Layout> {
        let bytes = len
            .checked_mul(std::mem::size_of::<T>())?
            .checked_add(offset)?
            .max(1);
        Layout::from_size_align(bytes, ALIGN).ok()
    }

    /// `len` zeroed elements, or `None` when the allocation fails.
    pub fn zeroed(len: usize) -> Option<Buffer<T>> {
        Buffer::zeroed_at(len, 0)
    }

    /// `len` zeroed elements starting `offset` bytes past a page boundary (a multiple of 64
    /// below [`ALIGN`]: arrays at different page offsets do not alias in the 4 KiB address
    /// bits that the core compares between loads and earlier stores), or `None` when the
    /// allocation fails or the offset is not such a multiple.
    pub fn zeroed_at(len: usize, offset: usize) -> Option<Buffer<T>> {
        if !offset.is_multiple_of(64)
            || offset >= ALIGN
            || !offset.is_multiple_of(std::mem::align_of::<T>())
        {
            return None;
        }
        let layout = Self::layout(len, offset)?;
        // SAFETY: layout has non-zero size; T is valid as all zeroes (Zeroable); `offset` is
        // inside the allocation (len · size + offset bytes) and keeps T's alignment.
        let base = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(base)?;
        // SAFETY: as above, `offset` bytes into the allocation.
        let ptr = unsafe { ptr.add(offset) }.cast::<T>();
        Some(Buffer { ptr, len, offset })
    }

    /// A buffer filled by `f(index)`, starting `offset` bytes past a page boundary.
    pub fn from_fn_at(
        len: usize,
        offset: usize,
        mut f: impl FnMut(usize) -> T,
    ) -> Option<Buffer<T>> {
        let mut b = Buffer::zeroed_at(len, offset)?;
        for (i, x) in b.iter_mut().enumerate() {
            *x = f(i);
        }
        Some(b)
    }

    /// A buffer filled by `f(index)`.
    pub fn from_fn(len: usize, f: impl FnMut(usize) -> T) -> Option<Buffer<T>> {
        Buffer::from_fn_at(len, 0, f)
    }
}

impl<T: Zeroable> Deref for Buffer<T> {
    type Target = [T];
    fn deref(&self) -> &[T] {
        // SAFETY: ptr is valid for len initialised elements for the lifetime of self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> DerefMut for Buffer<T> {
    fn deref_mut(&mut self) -> &mut [T] {
        // SAFETY: as above, and &mut self guarantees exclusivity.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl<T: Zeroable> Drop for Buffer<T> {
    fn drop(&mut self) {
        if let Some(layout) = Self::layout(self.len, self.offset) {
            // SAFETY: allocated in `zeroed_at` with this same layout, `offset` bytes before
            // the first element.
            unsafe { dealloc((self.ptr.as_ptr() as *mut u8).sub(self.offset), layout) }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_zeroed_and_filled() {
        let b: Buffer<f64> = Buffer::from_fn(1000, |i| i as f64).unwrap();
        assert_eq!(b.as_ptr() as usize % ALIGN, 0);
        assert_eq!(b[999], 999.0);
        let z: Buffer<f32> = Buffer::zeroed(0).unwrap();
        assert!(z.is_empty());
        let o: Buffer<f64> = Buffer::from_fn_at(1000, 1088, |i| i as f64).unwrap();
        assert_eq!(o.as_ptr() as usize % ALIGN, 1088);
        assert_eq!((o[0], o[999]), (0.0, 999.0));
        assert!(
            Buffer::<f64>::zeroed_at(8, 100).is_none(),
            "not a multiple of 64"
        );
        assert!(Buffer::<f64>::zeroed_at(8, ALIGN).is_none(), "a whole page");
    }
}
