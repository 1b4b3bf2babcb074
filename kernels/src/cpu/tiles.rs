//! What roofline's two GEMMs (`bf16`, `sgemm`) share: where a tile of C goes and how it is
//! stored, the per-thread buffers their packed blocks live in, and C's pointer across tasks.

use std::cell::Cell;

/// Where a tile goes: `rows × cols` of C at `c` with leading dimension `ldc`, overwritten or
/// added to.
#[derive(Clone, Copy)]
pub(crate) struct Dest {
    pub c: *mut f32,
    pub ldc: usize,
    pub rows: usize,
    pub cols: usize,
    pub overwrite: bool,
}

impl Dest {
    /// Stores `acc`'s first `rows × cols` values (rows `W` apart), through raw pointers: an
    /// overwritten C may not be initialised yet (it is never read).
    ///
    /// # Safety
    /// `self` covers its rows and columns.
    pub unsafe fn store_portable<const W: usize>(&self, acc: &[[f32; W]]) {
        for (i, row) in acc.iter().enumerate().take(self.rows) {
            let dst = self.c.add(i * self.ldc);
            for (j, &x) in row.iter().enumerate().take(self.cols) {
                let y = dst.add(j);
                *y = if self.overwrite { x } else { *y + x };
            }
        }
    }

    /// Stores rows of `V` 16-lane vectors, masked to `cols` (inlined into an AVX-512 caller).
    ///
    /// # Safety
    /// As `store_portable`; AVX-512 F present (the caller's target features).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub unsafe fn store<const V: usize>(&self, acc: &[[std::arch::x86_64::__m512; V]]) {
        use std::arch::x86_64::*;
        let masks: [u16; V] = std::array::from_fn(|v| {
            let n = self.cols.saturating_sub(16 * v).min(16);
            ((1u32 << n) - 1) as u16
        });
        for (i, row) in acc.iter().enumerate().take(self.rows) {
            let dst = self.c.add(i * self.ldc);
            for (h, (&v, &mk)) in row.iter().zip(&masks).enumerate() {
                let p = dst.add(16 * h);
                let v = if self.overwrite {
                    v
                } else {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(mk, p), v)
                };
                _mm512_mask_storeu_ps(p, mk, v);
            }
        }
    }
}

impl Dest {
    /// Stores rows of two 8-lane vectors (16 columns), masked to `cols` where they are fewer
    /// (inlined into an AVX2 caller).
    ///
    /// # Safety
    /// As `store_portable`; AVX2 present (the caller's target features).
    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    pub unsafe fn store_avx2(&self, acc: &[[std::arch::x86_64::__m256; 2]]) {
        use std::arch::x86_64::*;
        let lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
        let masks: [__m256i; 2] = [
            _mm256_cmpgt_epi32(_mm256_set1_epi32(self.cols.min(8) as i32), lanes),
            _mm256_cmpgt_epi32(
                _mm256_set1_epi32(self.cols.saturating_sub(8).min(8) as i32),
                lanes,
            ),
        ];
        let whole = [self.cols >= 8, self.cols >= 16];
        for (i, row) in acc.iter().enumerate().take(self.rows) {
            let dst = self.c.add(i * self.ldc);
            for (h, &v) in row.iter().enumerate() {
                let p = dst.add(8 * h);
                if whole[h] {
                    let v = if self.overwrite {
                        v
                    } else {
                        _mm256_add_ps(_mm256_loadu_ps(p), v)
                    };
                    _mm256_storeu_ps(p, v);
                } else if 8 * h < self.cols {
                    let v = if self.overwrite {
                        v
                    } else {
                        _mm256_add_ps(_mm256_maskload_ps(p, masks[h]), v)
                    };
                    _mm256_maskstore_ps(p, masks[h], v);
                }
            }
        }
    }
}

/// An empty product (no rows, columns or k): C left as it is, or zeroed where the product
/// overwrites it. Whether it was one.
///
/// # Safety
/// `c` covers `m × n` with leading dimension `ldc`.
pub(crate) unsafe fn empty_product(
    m: usize,
    n: usize,
    k: usize,
    c: *mut f32,
    ldc: usize,
    accumulate: bool,
) -> bool {
    if m == 0 || n == 0 {
        return true;
    }
    if k > 0 {
        return false;
    }
    if !accumulate {
        for i in 0..m {
            // A raw write: C may not be initialised yet.
            std::ptr::write_bytes(c.add(i * ldc), 0, n);
        }
    }
    true
}

/// The threads a product spreads over: the current rayon pool's where `parallel`.
pub(crate) fn threads(parallel: bool) -> usize {
    if parallel {
        rayon::current_num_threads().max(1)
    } else {
        1
    }
}

/// A thread's buffer from `slot`, long enough for [`line`] to cut `len` elements from it,
/// holding whatever its last user left: the packing writes every element that reaches a stored
/// result (an edge tile's rows past its block are read from stale elements, and their results
/// dropped). Taken out of the slot while in use (a nested product gets one of its own); put
/// back with `slot.set`.
pub(crate) fn scratch<T: Copy + Default>(
    slot: &'static std::thread::LocalKey<Cell<Vec<T>>>,
    len: usize,
) -> Vec<T> {
    let mut v = slot.take();
    grow(&mut v, len);
    v
}

/// Grows `v` (new elements default) so that [`line`] can cut `len` elements from it.
pub fn grow<T: Copy + Default>(v: &mut Vec<T>, len: usize) {
    if v.len() < len + pad::<T>() {
        v.resize(len + pad::<T>(), T::default());
    }
}

/// A cache line.
pub const LINE: usize = 64;

/// Elements past a buffer's length that let [`line`] start on a cache line.
pub fn pad<T>() -> usize {
    LINE / std::mem::size_of::<T>().max(1)
}

/// The index of `v`'s first element on a cache line (below [`pad`]).
pub fn line_start<T>(v: &[T]) -> usize {
    v.as_ptr().align_offset(LINE).min(pad::<T>())
}

/// `len` elements of `v` (at least `len + pad` long) from its first 64-byte boundary: packed
/// panels that start on a cache line. The allocator puts a small buffer 16 bytes past one, and
/// then every 64-byte row of a panel spans two lines: the AMX tile loads, which read such rows,
/// ran at half speed (a bf16 product with m = k = 4096, n = 1024: 0.62 → 1.54 TFLOP/s).
pub fn line<T>(v: &mut [T], len: usize) -> &mut [T] {
    let off = line_start(v);
    &mut v[off..off + len]
}

/// C's pointer, shared by the tasks of one product.
#[derive(Clone, Copy)]
pub(crate) struct SendPtr(pub *mut f32);
// SAFETY: the tasks write disjoint tiles of C.
unsafe impl Send for SendPtr {}
unsafe impl Sync for SendPtr {}
impl SendPtr {
    pub fn get(self) -> *mut f32 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::{line, pad};

    #[test]
    fn line_cuts_the_length_asked_from_a_cache_line_whatever_the_buffer_start() {
        // Every start a buffer of u32 or f32 can have relative to a line.
        let mut v = vec![0u32; 1000 + 16 + pad::<u32>()];
        for skip in 0..16 {
            let buf = &mut v[skip..skip + 1000 + pad::<u32>()];
            let start = buf.as_ptr() as usize;
            let cut = line(buf, 1000);
            assert_eq!(cut.len(), 1000);
            assert_eq!(cut.as_ptr() as usize % 64, 0, "skip {skip}");
            assert!(cut.as_ptr() as usize - start < 64);
        }
        let mut w = vec![0u16; 10 + pad::<u16>()];
        assert_eq!(line(&mut w, 10).as_ptr() as usize % 64, 0);
    }
}
