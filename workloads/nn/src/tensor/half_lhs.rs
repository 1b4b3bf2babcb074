//! Convolution inputs stored in bf16: a product's left-hand side in the layers' type or in
//! bf16 (`Lhs`), the sign a ReLU's backward pass reads from either (`Positive`), and the
//! rounding that makes them.

use super::{operand, products, scratch_run, Float, Mat, Products, Rhs};
use half::bf16;
use roofline_kernels::cpu::bf16::Operand;

/// What a product's operand (a convolution's input, or its output gradient) may be stored in:
/// the layers' own type, or bf16 (a batch norm's ReLU output in bf16 training, rounded once where every product
/// that read it rounded it again: the same bits, in half the bytes, with no rounding left for
/// the packing).
pub trait Lhs<T>: Copy + Default + Send + Sync + 'static {
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
    /// The operand as the bf16 products take it: f32 or bf16, `None` for other types.
    fn half_operand(x: Mat<Self>) -> Option<HalfOperand>;
    /// The stored value in the layers' type (exact: bf16 widens without rounding).
    fn widen(self) -> T;
    /// A lane mask: every bit set where `keep`, else none (for `and_mask`).
    fn lane_mask(keep: bool) -> Self;
    /// `self` where `mask` (a `lane_mask`) keeps it, else +0: the bits anded.
    fn and_mask(self, mask: Self) -> Self;
}

/// An operand of the bf16 products, in either of the storages they read.
pub enum HalfOperand {
    F32(Operand<f32>),
    Bf16(Operand<bf16>),
}

/// `c[m×n] (+)= a·b` with each operand in the layers' type or in bf16 (a convolution's input
/// and its output gradient, each kept in bf16 where the products round them anyway). Both in
/// `T`: `gemm`. Otherwise the thread's products must be bf16 (the only place bf16 operands
/// are made).
///
/// # Safety
/// As `gemm`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_mixed<T: Float, A: Lhs<T>, B: Lhs<T>>(
    m: usize,
    n: usize,
    k: usize,
    c: *mut T,
    ldc: usize,
    accumulate: bool,
    a: Mat<A>,
    b: Mat<B>,
    parallel: bool,
) {
    if native::<T, A, B>() {
        let (a, b) = (a.cast::<T>(), b.cast::<T>());
        return super::gemm(m, n, k, c, ldc, accumulate, a, b, parallel);
    }
    let (Products::Bf16(g), Some(c)) = (products(), f32_out(c)) else {
        panic!("{HALF_ONLY}")
    };
    use HalfOperand::{Bf16, F32};
    match (A::half_operand(a), B::half_operand(b)) {
        (Some(F32(a)), Some(F32(b))) => g.gemm(m, n, k, c, ldc, accumulate, a, b, parallel),
        (Some(F32(a)), Some(Bf16(b))) => g.gemm(m, n, k, c, ldc, accumulate, a, b, parallel),
        (Some(Bf16(a)), Some(F32(b))) => g.gemm(m, n, k, c, ldc, accumulate, a, b, parallel),
        (Some(Bf16(a)), Some(Bf16(b))) => g.gemm(m, n, k, c, ldc, accumulate, a, b, parallel),
        _ => panic!("{HALF_ONLY}"),
    }
}

/// `gemm_mixed` on this thread with `b` packed first, on roofline's f32 kernels (f32 layers
/// with f32 products on AVX-512): each block of A's rows then runs through all of k with its
/// part of C in cache, each next tile of C prefetched while one is multiplied. Returns
/// false, having done nothing, elsewhere (bf16 products, which gained nothing measurable
/// this way, the gemm crate's, an operand in bf16).
///
/// # Safety
/// As `gemm`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm_rhs_first<T: Float, A: Lhs<T>, B: Lhs<T>>(
    m: usize,
    n: usize,
    k: usize,
    c: *mut T,
    ldc: usize,
    accumulate: bool,
    a: Mat<A>,
    b: Mat<B>,
) -> bool {
    let (Products::Native, Some(g), true, Some(c)) = (
        products(),
        super::own_f32::<T>().filter(roofline_kernels::cpu::sgemm::F32Gemm::is_avx512),
        native::<T, A, B>(),
        f32_out(c),
    ) else {
        return false;
    };
    let p = g.pack_b(k, n, operand(b.cast()), false);
    g.gemm_packed(m, c, ldc, accumulate, operand(a.cast()), &p, false);
    true
}

/// Whether both operands are stored in the layers' own type `T` (no bf16 operand).
fn native<T: 'static, A: 'static, B: 'static>() -> bool {
    let is_t = |id| id == std::any::TypeId::of::<T>();
    is_t(std::any::TypeId::of::<A>()) && is_t(std::any::TypeId::of::<B>())
}

/// Whether the current thread's `T` layers keep their ReLU outputs in bf16 (f32 layers with
/// bf16 products).
pub fn half_activations<T: 'static>() -> bool {
    matches!(products(), Products::Bf16(_))
        && std::any::TypeId::of::<T>() == std::any::TypeId::of::<f32>()
}

impl<T: Float> Lhs<T> for T {
    #[inline(always)]
    fn widen(self) -> T {
        self
    }
    #[inline(always)]
    fn lane_mask(keep: bool) -> Self {
        if keep {
            T::all_bits()
        } else {
            T::zero()
        }
    }
    #[inline(always)]
    fn and_mask(self, mask: Self) -> Self {
        self.and_bits(mask)
    }
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        <T as Float>::with_scratch(len, f)
    }
    fn half_operand(x: Mat<T>) -> Option<HalfOperand> {
        f32_out(x.ptr as *mut T).map(|_| HalfOperand::F32(operand(x.cast())))
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
    #[inline(always)]
    fn widen(self) -> T {
        // bf16 is f32's upper half: the shift is exact (and vectorises, where `to_f32` may not).
        T::from_f64(f32::from_bits((self.to_bits() as u32) << 16) as f64)
    }
    #[inline(always)]
    fn lane_mask(keep: bool) -> Self {
        bf16::from_bits(if keep { u16::MAX } else { 0 })
    }
    #[inline(always)]
    fn and_mask(self, mask: Self) -> Self {
        bf16::from_bits(self.to_bits() & mask.to_bits())
    }
    fn half_operand(x: Mat<bf16>) -> Option<HalfOperand> {
        Some(HalfOperand::Bf16(operand(x)))
    }
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        thread_local! {
            static SCRATCH: std::cell::Cell<Vec<bf16>> = const { std::cell::Cell::new(Vec::new()) };
        }
        scratch_run(&SCRATCH, len, f)
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
        match rhs.bf16_packed() {
            Some((g, p)) => {
                let c = f32_out(c).expect(HALF_ONLY);
                g.gemm_packed(m, c, ldc, accumulate, operand(a), p, parallel)
            }
            None => gemm_mixed(m, rhs.n, rhs.k, c, ldc, accumulate, a, rhs.b, parallel),
        }
    }
}

/// The layers' float types as bits: a lane mask's and (`Lhs::and_mask`).
pub trait Bits {
    /// The bits of `self` and `mask` anded.
    fn and_bits(self, mask: Self) -> Self;
    /// Every bit set (a lane mask that keeps its value).
    fn all_bits() -> Self;
}

macro_rules! bits {
    ($t:ty, $u:ty) => {
        impl Bits for $t {
            #[inline(always)]
            fn and_bits(self, mask: Self) -> Self {
                <$t>::from_bits(self.to_bits() & mask.to_bits())
            }
            #[inline(always)]
            fn all_bits() -> Self {
                <$t>::from_bits(<$u>::MAX)
            }
        }
    };
}
bits!(f32, u32);
bits!(f64, u64);

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
