//! Convolution inputs stored in bf16: a product's left-hand side in the layers' type or in
//! bf16 (`Lhs`), the sign a ReLU's backward pass reads from either (`Positive`), and the
//! rounding that makes them.

use super::{operand, products, scratch_run, Float, Mat, Products, Rhs};
use half::bf16;
use roofline_kernels::cpu::bf16::Operand;

/// What a product's left-hand side (a convolution's input) may be stored in: the layers' own
/// type, or bf16 (a batch norm's ReLU output in bf16 training, rounded once where every product
/// that read it rounded it again: the same bits, in half the bytes, with no rounding left for
/// the packing).
pub trait Lhs<T>: Copy + Default + Send + Sync + 'static {
    /// `gemm` with this left-hand side.
    ///
    /// # Safety
    /// As `gemm`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        c: *mut T,
        ldc: usize,
        accumulate: bool,
        a: Mat<Self>,
        b: Mat<T>,
        parallel: bool,
    );
    /// `Rhs::gemm` with this left-hand side.
    ///
    /// # Safety
    /// As `gemm`.
    unsafe fn gemm_rhs(
        rhs: &Rhs<T>,
        m: usize,
        c: *mut T,
        ldc: usize,
        accumulate: bool,
        a: Mat<Self>,
        parallel: bool,
    );
    /// `Float::with_scratch` for this type.
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
}

/// Whether the current thread's `T` layers keep their ReLU outputs in bf16 (f32 layers with
/// bf16 products).
pub fn half_activations<T: 'static>() -> bool {
    matches!(products(), Products::Bf16(_))
        && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

impl<T: Float> Lhs<T> for T {
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        <T as Float>::with_scratch(len, f)
    }
    unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        c: *mut T,
        ldc: usize,
        accumulate: bool,
        a: Mat<T>,
        b: Mat<T>,
        parallel: bool,
    ) {
        super::gemm(m, n, k, c, ldc, accumulate, a, b, parallel)
    }
    unsafe fn gemm_rhs(
        rhs: &Rhs<T>,
        m: usize,
        c: *mut T,
        ldc: usize,
        accumulate: bool,
        a: Mat<T>,
        parallel: bool,
    ) {
        rhs.gemm(m, c, ldc, accumulate, a, parallel)
    }
}

/// Why a bf16 left-hand side cannot multiply: it is only made where the products are bf16.
const HALF_ONLY: &str = "a bf16 activation multiplies only in f32 layers with bf16 products";

/// `c` as f32 where `T` is f32.
fn f32_out<T: 'static>(c: *mut T) -> Option<*mut f32> {
    (std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()).then_some(c as *mut f32)
}

impl<T: Float> Lhs<T> for bf16 {
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        thread_local! {
            static SCRATCH: std::cell::Cell<Vec<bf16>> = const { std::cell::Cell::new(Vec::new()) };
        }
        scratch_run(&SCRATCH, len, f)
    }
    unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        c: *mut T,
        ldc: usize,
        accumulate: bool,
        a: Mat<bf16>,
        b: Mat<T>,
        parallel: bool,
    ) {
        let (Products::Bf16(g), Some(c)) = (products(), f32_out(c)) else {
            panic!("{HALF_ONLY}")
        };
        let b = Operand {
            ptr: b.ptr as *const f32,
            rs: b.rs,
            cs: b.cs,
        };
        g.gemm(m, n, k, c, ldc, accumulate, operand(a), b, parallel)
    }
    unsafe fn gemm_rhs(
        rhs: &Rhs<T>,
        m: usize,
        c: *mut T,
        ldc: usize,
        accumulate: bool,
        a: Mat<bf16>,
        parallel: bool,
    ) {
        match &rhs.packed {
            Some((g, p)) => {
                let c = f32_out(c).expect(HALF_ONLY);
                g.gemm_packed(m, c, ldc, accumulate, operand(a), p, parallel)
            }
            None => <bf16 as Lhs<T>>::gemm(m, rhs.n, rhs.k, c, ldc, accumulate, a, rhs.b, parallel),
        }
    }
}

/// A stored value as a ReLU's backward pass reads it: positive or not.
pub trait Positive: Copy + Send + Sync {
    fn positive(self) -> bool;
}

impl<T: Float> Positive for T {
    #[inline(always)]
    fn positive(self) -> bool {
        self > T::zero()
    }
}

impl Positive for bf16 {
    #[inline(always)]
    fn positive(self) -> bool {
        (self.to_bits() as i16) > 0
    }
}

/// `src` rounded to bf16 into `dst` (every element written), as the products round their
/// operands.
pub fn round_bf16<T: Float>(src: &[T], dst: &mut [std::mem::MaybeUninit<bf16>]) {
    if std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>() {
        // SAFETY: T is f32.
        let s = unsafe { &*(src as *const [T] as *const [f32]) };
        roofline_kernels::cpu::bf16::round_slice(s, dst);
    } else {
        for (d, s) in dst.iter_mut().zip(src) {
            d.write(bf16::from_bits(roofline_kernels::cpu::bf16::round(
                s.to_f64() as f32,
            )));
        }
    }
}
