//! Tensors: dense NHWC arrays of f32 (training) or f64 (gradient checks), and the GEMM that
//! every heavy layer reduces to.

use gemm::Parallelism;
pub use roofline_kernels::cpu::bf16::Bf16Gemm;
use roofline_kernels::cpu::bf16::{Operand, PackedB};
use roofline_kernels::cpu::sgemm::{F32Gemm, PackedF32};
use std::fmt::Debug;
use std::ops::{Add, AddAssign, Div, Mul, MulAssign, Neg, Sub, SubAssign};

/// The element types the layers run in: f32 for training, f64 for gradient checks.
pub trait Float:
    Copy
    + Default
    + Debug
    + PartialOrd
    + Send
    + Sync
    + 'static
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + Div<Output = Self>
    + Neg<Output = Self>
    + AddAssign
    + SubAssign
    + MulAssign
    + half_lhs::Bits
{
    fn from_f64(v: f64) -> Self;
    fn to_f64(self) -> f64;
    fn sqrt(self) -> Self;
    fn exp(self) -> Self;
    fn ln(self) -> Self;
    /// Runs `f` on a buffer of `len` elements that is this thread's own and kept between
    /// calls, holding whatever its last user left (the convolutions' im2col patches and
    /// partial sums, taken for every block: allocated and zeroed each time, they cost a few
    /// percent of a training step in `memset` and page faults). Taken out of the thread's slot
    /// while `f` runs: a nested call (a rayon job stolen inside `f`) gets a buffer of its own.
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R;
    fn zero() -> Self {
        Self::from_f64(0.0)
    }
    fn one() -> Self {
        Self::from_f64(1.0)
    }
    fn max(self, o: Self) -> Self {
        if self >= o {
            self
        } else {
            o
        }
    }
    /// Runs `c (+)= a·b` through `g` (bf16 operands, f32 sums) where this type can, and says
    /// whether it did: f32 can, f64 (gradient checks) keeps its own precision.
    ///
    /// # Safety
    /// As `gemm`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn bf16_gemm(
        _g: &Bf16Gemm,
        _m: usize,
        _n: usize,
        _k: usize,
        _c: *mut Self,
        _ldc: usize,
        _accumulate: bool,
        _a: Mat<Self>,
        _b: Mat<Self>,
        _parallel: bool,
    ) -> bool {
        false
    }
    /// `b` packed for `g` where this type multiplies in bf16 (f32), else `None`.
    ///
    /// # Safety
    /// `b` must cover the k×n matrix its strides describe.
    unsafe fn bf16_pack(
        _g: &Bf16Gemm,
        _k: usize,
        _n: usize,
        _b: Mat<Self>,
        _parallel: bool,
    ) -> Option<PackedB> {
        None
    }
    /// `c (+)= a·b` with `b` from `bf16_pack`; whether it ran (f32 only).
    ///
    /// # Safety
    /// As `gemm`.
    #[allow(clippy::too_many_arguments)]
    unsafe fn bf16_gemm_packed(
        _g: &Bf16Gemm,
        _m: usize,
        _c: *mut Self,
        _ldc: usize,
        _accumulate: bool,
        _a: Mat<Self>,
        _b: &PackedB,
        _parallel: bool,
    ) -> bool {
        false
    }
}

mod half_lhs;
pub use half::bf16;
pub use half_lhs::{
    gemm_mixed, gemm_rhs_first, half_activations, round_bf16, HalfOperand, Lhs, Positive,
};

/// `Float::with_scratch` on a thread's slot.
fn scratch_run<T: Copy + Default, R>(
    slot: &'static std::thread::LocalKey<std::cell::Cell<Vec<T>>>,
    len: usize,
    f: impl FnOnce(&mut [T]) -> R,
) -> R {
    // From a cache line on: a buffer under `alloc::MIN_BLOCK` starts 16 bytes past one, and its
    // 64-byte rows (im2col patches, Winograd's tiles) would each span two lines.
    use roofline_kernels::cpu::{grow, line};
    let mut v = slot.take();
    grow(&mut v, len);
    let r = f(line(&mut v, len));
    slot.set(v);
    r
}

fn operand<T>(x: Mat<T>) -> Operand<T> {
    Operand {
        ptr: x.ptr,
        rs: x.rs,
        cs: x.cs,
    }
}

impl Float for f32 {
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        thread_local! {
            static SCRATCH: std::cell::Cell<Vec<f32>> = const { std::cell::Cell::new(Vec::new()) };
        }
        scratch_run(&SCRATCH, len, f)
    }
    fn from_f64(v: f64) -> Self {
        v as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn sqrt(self) -> Self {
        f32::sqrt(self)
    }
    fn exp(self) -> Self {
        f32::exp(self)
    }
    fn ln(self) -> Self {
        f32::ln(self)
    }
    unsafe fn bf16_gemm(
        g: &Bf16Gemm,
        m: usize,
        n: usize,
        k: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Mat<f32>,
        b: Mat<f32>,
        parallel: bool,
    ) -> bool {
        g.gemm(
            m,
            n,
            k,
            c,
            ldc,
            accumulate,
            operand(a),
            operand(b),
            parallel,
        );
        true
    }
    unsafe fn bf16_pack(
        g: &Bf16Gemm,
        k: usize,
        n: usize,
        b: Mat<f32>,
        parallel: bool,
    ) -> Option<PackedB> {
        Some(g.pack_b(k, n, operand(b), parallel))
    }
    unsafe fn bf16_gemm_packed(
        g: &Bf16Gemm,
        m: usize,
        c: *mut f32,
        ldc: usize,
        accumulate: bool,
        a: Mat<f32>,
        b: &PackedB,
        parallel: bool,
    ) -> bool {
        g.gemm_packed(m, c, ldc, accumulate, operand(a), b, parallel);
        true
    }
}

impl Float for f64 {
    fn with_scratch<R>(len: usize, f: impl FnOnce(&mut [Self]) -> R) -> R {
        thread_local! {
            static SCRATCH: std::cell::Cell<Vec<f64>> = const { std::cell::Cell::new(Vec::new()) };
        }
        scratch_run(&SCRATCH, len, f)
    }
    fn from_f64(v: f64) -> Self {
        v
    }
    fn to_f64(self) -> f64 {
        self
    }
    fn sqrt(self) -> Self {
        f64::sqrt(self)
    }
    fn exp(self) -> Self {
        f64::exp(self)
    }
    fn ln(self) -> Self {
        f64::ln(self)
    }
}

/// Runs `f` compiled for the widest vector unit this CPU has (AVX-512, else AVX2 + FMA) under
/// the `ROOFLINE_ISA` cap (read once per process): the element-wise layers are built for
/// baseline x86-64 (SSE2) so that the binary runs anywhere, and without this their loops use
/// 128-bit vectors only. `f` must be inlined into the dispatching function for the wider
/// instructions to be used, so callers pass small `#[inline(always)]` closures. Lanes are the
/// channels, so the results are the same bits on every path (no reassociation; Rust never
/// contracts `a * b + c` into an FMA by itself).
#[inline(always)]
pub fn simd<R>(f: impl FnOnce() -> R) -> R {
    #[cfg(target_arch = "x86_64")]
    {
        #[target_feature(enable = "avx512f,avx512vl,avx512bw,avx512dq,avx2,fma")]
        unsafe fn avx512<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        #[target_feature(enable = "avx2,fma")]
        unsafe fn avx2<R>(f: impl FnOnce() -> R) -> R {
            f()
        }
        use roofline_kernels::cpu::isa::Isa;
        match simd_isa() {
            // SAFETY: simd_isa checked that the CPU has every feature the function is compiled
            // for.
            Isa::Avx512 => return unsafe { avx512(f) },
            // SAFETY: as above.
            Isa::Avx2 => return unsafe { avx2(f) },
            _ => {}
        }
    }
    f()
}

/// `simd`'s choice: the instruction set the kernels use under the `ROOFLINE_ISA` cap
/// (`Isa::current`: AVX-512 F, else AVX2 + FMA), with AVX-512 only where the CPU also has VL,
/// BW and DQ (which `simd`'s build needs), decided once per process.
pub fn simd_isa() -> roofline_kernels::cpu::isa::Isa {
    use roofline_kernels::cpu::isa::Isa;
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(|| {
        let isa = Isa::current();
        #[cfg(target_arch = "x86_64")]
        {
            use std::is_x86_feature_detected as has;
            if isa == Isa::Avx512 && !(has!("avx512vl") && has!("avx512bw") && has!("avx512dq")) {
                return Isa::Avx2;
            }
        }
        isa
    })
}

/// An NHWC tensor (a matrix is `n × 1 × 1 × c`).
#[derive(Clone, Debug, PartialEq)]
pub struct Tensor<T> {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub data: Vec<T>,
}

/// A tensor not yet written ([`Tensor::uninit`]): its writer stores every element of `data`,
/// then [`Uninit::assume_init`] makes it a [`Tensor`].
pub struct Uninit<T> {
    pub n: usize,
    pub h: usize,
    pub w: usize,
    pub c: usize,
    pub data: Vec<std::mem::MaybeUninit<T>>,
}

impl<T> Uninit<T> {
    /// The tensor, its storage reused as is.
    ///
    /// # Safety
    /// Every element of `data` has been written.
    pub unsafe fn assume_init(self) -> Tensor<T> {
        let mut v = std::mem::ManuallyDrop::new(self.data);
        let (ptr, len, cap) = (v.as_mut_ptr() as *mut T, v.len(), v.capacity());
        Tensor {
            n: self.n,
            h: self.h,
            w: self.w,
            c: self.c,
            // SAFETY: `MaybeUninit<T>` has `T`'s size and alignment, so the allocation fits a
            // `Vec<T>` of the same length and capacity; every element is initialised (caller).
            data: Vec::from_raw_parts(ptr, len, cap),
        }
    }
}

/// `s` with every element set to `v`, as initialised values.
pub fn fill_uninit<T: Copy>(s: &mut [std::mem::MaybeUninit<T>], v: T) -> &mut [T] {
    for e in s.iter_mut() {
        e.write(v);
    }
    // SAFETY: every element was just written; `MaybeUninit<T>` and `T` share their layout.
    unsafe { &mut *(s as *mut [std::mem::MaybeUninit<T>] as *mut [T]) }
}

/// An initialised slice seen as one to overwrite (for functions that write their output through
/// `MaybeUninit`).
///
/// # Safety
/// Only initialised values may be written through the result (writing
/// `MaybeUninit::uninit()` would leave `s` holding uninitialised `T`s).
pub(crate) unsafe fn as_uninit<T>(s: &mut [T]) -> &mut [std::mem::MaybeUninit<T>] {
    // SAFETY: `MaybeUninit<T>` and `T` share their layout; the caller writes only `T` values.
    &mut *(s as *mut [T] as *mut [std::mem::MaybeUninit<T>])
}

impl<T: Float> Tensor<T> {
    pub fn zeros(n: usize, h: usize, w: usize, c: usize) -> Tensor<T> {
        Tensor {
            n,
            h,
            w,
            c,
            data: vec![T::zero(); n * h * w * c],
        }
    }

    /// A tensor whose every element the caller overwrites before reading. (Zero-filled: the
    /// hot layers use [`Tensor::uninit`] instead, which skips the fill.)
    pub fn for_overwrite(n: usize, h: usize, w: usize, c: usize) -> Tensor<T> {
        Tensor::zeros(n, h, w, c)
    }

    /// Storage for a tensor that its writer fills element by element, without a zero-fill
    /// first: that pass over every convolution and batch-norm output cost 20% of a bf16
    /// ResNet-50 step on a 2-core Xeon (3.1 → 2.4 s). [`Uninit::assume_init`] hands it over.
    pub fn uninit(n: usize, h: usize, w: usize, c: usize) -> Uninit<T> {
        let len = n * h * w * c;
        let mut data = Vec::with_capacity(len);
        // SAFETY: `MaybeUninit` elements need no initialisation; the capacity is `len`.
        unsafe { data.set_len(len) };
        Uninit { n, h, w, c, data }
    }

    pub fn from_vec(n: usize, h: usize, w: usize, c: usize, data: Vec<T>) -> Tensor<T> {
        assert_eq!(data.len(), n * h * w * c, "tensor data length");
        Tensor { n, h, w, c, data }
    }

    pub fn len(&self) -> usize {
        self.data.len()
    }

    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// Rows of the NHWC matrix view (n·h·w, each of c channels).
    pub fn rows(&self) -> usize {
        self.n * self.h * self.w
    }

    pub fn same_shape(&self, o: &Tensor<T>) -> bool {
        (self.n, self.h, self.w, self.c) == (o.n, o.h, o.w, o.c)
    }
}

/// The parallel reductions' partition count: fixed for a given thread count, so that every sum
/// is added up in the same order on every run (reproducible training).
pub fn partitions() -> usize {
    rayon::current_num_threads().max(1)
}

/// `out = Σ part(p)` over `parts` parts computed in parallel, added in index order
/// (deterministic whatever the threads): `f(p, buf)` writes every element of `buf` (it is
/// never read first: no zero-fill). Part 0 goes straight into `out`, the others into buffers
/// of their own, then added to it in order.
pub fn ordered_sum_into<T: Float>(
    out: &mut [T],
    parts: usize,
    f: impl Fn(usize, &mut [std::mem::MaybeUninit<T>]) + Sync + Send,
) {
    use rayon::prelude::*;
    let len = out.len();
    let mut rest: Vec<Vec<T>> = (1..parts).map(|_| Vec::with_capacity(len)).collect();
    rayon::join(
        // SAFETY: f writes only values, every element.
        || f(0, unsafe { as_uninit(out) }),
        || {
            rest.par_iter_mut().enumerate().for_each(|(i, v)| {
                f(i + 1, &mut v.spare_capacity_mut()[..len]);
                // SAFETY: f wrote the first len elements.
                unsafe { v.set_len(len) };
            })
        },
    );
    for v in &rest {
        for (t, x) in out.iter_mut().zip(v) {
            *t += *x;
        }
    }
}

/// A matrix operand: base pointer and strides (row stride, column stride), so that transposes
/// cost nothing.
#[derive(Clone, Copy)]
pub struct Mat<T> {
    pub ptr: *const T,
    pub rs: isize,
    pub cs: isize,
}

impl<T> Mat<T> {
    /// The same matrix read as `U` (for a `T` that is `U`).
    pub fn cast<U>(self) -> Mat<U> {
        Mat {
            ptr: self.ptr as *const U,
            rs: self.rs,
            cs: self.cs,
        }
    }

    /// A row-major matrix with leading dimension `ld`.
    pub fn rows(ptr: *const T, ld: usize) -> Mat<T> {
        Mat {
            ptr,
            rs: ld as isize,
            cs: 1,
        }
    }

    /// The transpose of a row-major matrix with leading dimension `ld`.
    pub fn transposed(ptr: *const T, ld: usize) -> Mat<T> {
        Mat {
            ptr,
            rs: 1,
            cs: ld as isize,
        }
    }
}

/// What the layers' matrix products (convolutions, fully connected layers) compute in.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Products {
    /// The tensors' own type (f32 training, f64 gradient checks).
    #[default]
    Native,
    /// bf16 operands (rounded to nearest even as they are packed), f32 products and sums: mixed
    /// precision on CPUs with AVX512_BF16. Only f32 layers use it; f64 layers stay in f64.
    Bf16(Bf16Gemm),
}

thread_local! {
    static PRODUCTS: std::cell::Cell<Products> = const { std::cell::Cell::new(Products::Native) };
}

/// Sets the products of every thread of `pool` (the trainer's pinned pool: each step runs on
/// its threads, so this is the run's precision). Other pools and threads are not touched.
pub fn set_products(pool: &rayon::ThreadPool, p: Products) {
    pool.broadcast(|_| PRODUCTS.with(|c| c.set(p)));
}

/// Two threads whose products are bf16 (the AVX-512 kernels where the CPU has them, the
/// portable ones elsewhere), as `--precision bf16` sets them: for tests.
#[cfg(test)]
pub(crate) fn bf16_pool() -> rayon::ThreadPool {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let g = Bf16Gemm::detect().unwrap_or_else(|_| Bf16Gemm::portable());
    set_products(&pool, Products::Bf16(g));
    pool
}

/// The products of the current thread.
pub fn products() -> Products {
    PRODUCTS.with(|c| c.get())
}

/// `c[m×n] (+)= a[m×k] · b[k×n]`, `c` row-major with leading dimension `ldc`; accumulates into
/// `c` when `accumulate`. f32 operands multiply in bf16 where the thread's `products` say so.
///
/// # Safety
/// The operands must cover the matrices their sizes and strides describe; `c` must not overlap
/// them.
#[allow(clippy::too_many_arguments)]
pub unsafe fn gemm<T: Float>(
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
    if let Products::Bf16(g) = products() {
        if T::bf16_gemm(&g, m, n, k, c, ldc, accumulate, a, b, parallel) {
            return;
        }
    }
    plain_gemm(m, n, k, c, ldc, accumulate, a, b, parallel)
}

/// The product in `T`, on roofline's f32 kernels where they beat the gemm crate (f32 on
/// AVX-512): over the pool, A's rows read in place (k contiguous) and tall (`OWN_F32_MIN_ROWS`):
/// a 1×1 convolution's forward and backward-data products; on one thread, a long reduction
/// into a small C (`long_on_own`): its filter gradient. Else the crate's (`native_gemm`).
///
/// # Safety
/// As `gemm`.
#[allow(clippy::too_many_arguments)]
unsafe fn plain_gemm<T: Float>(
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
    if let Some(g) = own_f32::<T>().filter(F32Gemm::is_avx512) {
        let tall = parallel && a.cs == 1 && a.rs >= 0 && m >= OWN_F32_MIN_ROWS;
        let long = !parallel && long_on_own(m, n, k, a, b);
        if tall || long {
            let (a, b) = (operand(a.cast()), operand(b.cast()));
            return g.gemm(m, n, k, c as *mut f32, ldc, accumulate, a, b, parallel);
        }
    }
    native_gemm(m, n, k, c, ldc, accumulate, a, b, parallel)
}

/// Whether `gemm` on one thread runs this product on roofline's f32 kernels for long
/// reductions (`F32Gemm::long_reduction`: `xᵀ·dy` over many pixels into a small C).
pub fn long_on_own<T: Float>(m: usize, n: usize, k: usize, a: Mat<T>, b: Mat<T>) -> bool {
    products() == Products::Native
        && own_f32::<T>().is_some_and(|g| g.is_avx512())
        && F32Gemm::long_reduction(m, n, k, operand(a.cast()), operand(b.cast()))
}

/// The fewest rows of A for which a product over the pool goes to the f32 kernels
/// (`plain_gemm`).
const OWN_F32_MIN_ROWS: usize = 4096;

/// A right-hand side for many products (a convolution's filter, multiplied by every block of
/// patch rows): packed once in bf16 where the products of the thread that makes it are bf16,
/// packed once for roofline's f32 kernels where it is large (`OWN_F32_MAX_CRATE`), used as it
/// is otherwise.
pub struct Rhs<T> {
    b: Mat<T>,
    k: usize,
    n: usize,
    packed: Option<Packed>,
}

/// How an `Rhs` was packed.
enum Packed {
    /// For the bf16 products.
    Bf16(Bf16Gemm, PackedB),
    /// For the f32 kernels (f32 layers with f32 products on AVX-512 or AVX2).
    F32(F32Gemm, PackedF32),
}

// SAFETY: an Rhs only reads its matrix, which its maker keeps alive and unchanged (`Rhs::new`).
unsafe impl<T: Sync> Send for Rhs<T> {}
unsafe impl<T: Sync> Sync for Rhs<T> {}

impl<T: Float> Rhs<T> {
    /// The k×n matrix `b`, packed over the current pool where the products are bf16.
    ///
    /// # Safety
    /// `b` must cover the matrix its strides describe, and stay alive and unchanged as long as
    /// the `Rhs`.
    pub unsafe fn new(k: usize, n: usize, b: Mat<T>) -> Rhs<T> {
        let packed = match (products(), own_f32::<T>()) {
            (Products::Bf16(g), _) => T::bf16_pack(&g, k, n, b, true).map(|p| Packed::Bf16(g, p)),
            (Products::Native, Some(g)) if k * n > OWN_F32_MAX_CRATE => {
                Some(Packed::F32(g, g.pack_b(k, n, operand(b.cast()), true)))
            }
            (Products::Native, _) => None,
        };
        Rhs { b, k, n, packed }
    }

    /// Whether it was packed (bf16 products, or the f32 kernels).
    pub fn is_packed(&self) -> bool {
        self.packed.is_some()
    }

    /// The bf16 products and their packing of this matrix, where it has one.
    pub(super) fn bf16_packed(&self) -> Option<(&Bf16Gemm, &PackedB)> {
        match &self.packed {
            Some(Packed::Bf16(g, p)) => Some((g, p)),
            _ => None,
        }
    }

    /// `c[m×n] (+)= a[m×k] · self`, as `gemm` (one thread unless `parallel`).
    ///
    /// # Safety
    /// As `gemm`.
    pub unsafe fn gemm(
        &self,
        m: usize,
        c: *mut T,
        ldc: usize,
        accumulate: bool,
        a: Mat<T>,
        parallel: bool,
    ) {
        match &self.packed {
            // The bf16 product runs for f32 layers (and says so); f64 layers are never packed.
            Some(Packed::Bf16(g, p))
                if T::bf16_gemm_packed(g, m, c, ldc, accumulate, a, p, parallel) => {}
            Some(Packed::F32(g, p)) => {
                let (c, a) = (c as *mut f32, operand(a.cast()));
                g.gemm_packed(m, c, ldc, accumulate, a, p, parallel)
            }
            _ => plain_gemm(m, self.n, self.k, c, ldc, accumulate, a, self.b, parallel),
        }
    }
}

/// The product in `T` itself (the gemm crate).
///
/// # Safety
/// As `gemm`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn native_gemm<T: Float>(
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
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            for i in 0..m {
                for j in 0..n {
                    *c.add(i * ldc + j) = T::zero();
                }
            }
        }
        return;
    }
    let par = if parallel {
        Parallelism::Rayon(rayon::current_num_threads())
    } else {
        Parallelism::None
    };
    gemm::gemm(
        m,
        n,
        k,
        c,
        1,
        ldc as isize,
        accumulate,
        a.ptr,
        a.cs,
        a.rs,
        b.ptr,
        b.cs,
        b.rs,
        T::one(),
        T::one(),
        false,
        false,
        false,
        par,
    );
}

/// The largest right-hand side (elements, 2 MiB) left to the gemm crate in f32 layers; larger
/// ones (layer3/4 3×3 filters, layer4's projection) are packed once per call for the f32
/// kernels: the crate packed them again for every block of patch rows, streaming them from L3
/// (place, f32: layer4 3×3 backward 258–267 → 150–159 ms per step, forward 95–101 → 72–81;
/// layer3's 3×3 backward 319–337 → 286–297; the 2 MiB projection of layer3 ran slower, 21 → 25
/// ms forward, and stays with the crate).
const OWN_F32_MAX_CRATE: usize = 1 << 19;

/// The f32 kernels for `T` = f32 on a CPU with AVX-512 or AVX2 (unless
/// `ROOFLINE_F32_GEMM=crate`, which keeps the gemm crate's), else none. On AVX2 only a large
/// packed filter (`Rhs`) and the stem's taps take them (`F32Gemm::is_avx512`).
pub(crate) fn own_f32<T: 'static>() -> Option<F32Gemm> {
    static OWN: std::sync::OnceLock<Option<F32Gemm>> = std::sync::OnceLock::new();
    if std::any::TypeId::of::<T>() != std::any::TypeId::of::<f32>() {
        return None;
    }
    *OWN.get_or_init(|| {
        if std::env::var("ROOFLINE_F32_GEMM").is_ok_and(|v| v == "crate") {
            return None;
        }
        F32Gemm::detect()
    })
}

/// Safe row-major `c = a · b` (tests, small layers).
pub fn matmul<T: Float>(a: &[T], b: &[T], m: usize, k: usize, n: usize) -> Vec<T> {
    assert_eq!(a.len(), m * k);
    assert_eq!(b.len(), k * n);
    let mut c = vec![T::zero(); m * n];
    // SAFETY: lengths checked above.
    unsafe {
        gemm(
            m,
            n,
            k,
            c.as_mut_ptr(),
            n,
            false,
            Mat::rows(a.as_ptr(), k),
            Mat::rows(b.as_ptr(), n),
            false,
        )
    };
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gemm_with_transposes_matches_a_loop() {
        let (m, k, n) = (5, 7, 3);
        let a: Vec<f64> = (0..m * k).map(|i| (i as f64 * 0.37).sin()).collect();
        let b: Vec<f64> = (0..k * n).map(|i| (i as f64 * 0.11).cos()).collect();
        let c = matmul(&a, &b, m, k, n);
        for i in 0..m {
            for j in 0..n {
                let want: f64 = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
                assert!((c[i * n + j] - want).abs() < 1e-12);
            }
        }
        // aᵀ (k×m) · c (m×n) through strides.
        let mut d = vec![0.0f64; k * n];
        // SAFETY: sizes as described.
        unsafe {
            gemm(
                k,
                n,
                m,
                d.as_mut_ptr(),
                n,
                false,
                Mat::transposed(a.as_ptr(), k),
                Mat::rows(c.as_ptr(), n),
                false,
            )
        };
        for p in 0..k {
            for j in 0..n {
                let want: f64 = (0..m).map(|i| a[i * k + p] * c[i * n + j]).sum();
                assert!((d[p * n + j] - want).abs() < 1e-12);
            }
        }
    }
}
