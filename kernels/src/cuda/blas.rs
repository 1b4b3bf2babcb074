//! cuBLAS (`cublasGemmEx`) and cuBLASLt (`cublasLtMatmul`) wrapped for the GEMM probe: the
//! handles and workspace, each precision's types and scalars, cuBLASLt's plans, and one "TN"
//! GEMM enqueued (A is k×m, B is k×n, column-major; C = Aᵀ·B is m×n: the layout every
//! precision supports, fp8 and int8 need it). The probe section is `probe::gpu::gemm`.

use super::device::{self, Gpu};
use super::libs::{self, Lib};
use super::CudaError;
use cudarc::cublas::{result as blas, sys as bsys};
use cudarc::cublaslt::{result as lt, sys as lsys};
use std::ffi::c_void;

/// A library's "not supported" status becomes `Unsupported` (a note and a skipped check),
/// not a failed probe: the GPU or library version lacks that precision or shape.
pub(crate) fn not_supported(e: CudaError) -> CudaError {
    match e {
        CudaError::Call { call, detail }
            if detail.contains("NOT_SUPPORTED") || detail.contains("ARCH_MISMATCH") =>
        {
            CudaError::Unsupported(format!("{call}: {detail}"))
        }
        e => e,
    }
}

/// GEMM precisions: the model's [`Precision`](roofline_model::Precision); what GEMM needs of
/// each (element bytes of A/B and of C, the minimum architecture, the check's tolerance) is
/// [`GemmPrec`].
pub use roofline_model::Precision as Prec;

/// What GEMM needs to know of a precision.
pub trait GemmPrec: Copy {
    fn in_bytes(self) -> usize;
    fn out_bytes(self) -> usize;
    fn min_arch(self) -> u32;
    /// Normwise relative error bound: |C - ref| / Σ|a·b|.
    fn tolerance(self) -> f64;
    fn unit(self) -> &'static str;
}

impl GemmPrec for Prec {
    fn in_bytes(self) -> usize {
        match self {
            Prec::F64 => 8,
            Prec::F32 | Prec::Tf32 => 4,
            Prec::F16 | Prec::Bf16 => 2,
            Prec::Int8 | Prec::Fp8 => 1,
        }
    }

    fn out_bytes(self) -> usize {
        match self {
            Prec::F64 => 8,
            Prec::F32 | Prec::Tf32 | Prec::Int8 => 4,
            Prec::F16 | Prec::Bf16 | Prec::Fp8 => 2,
        }
    }

    fn min_arch(self) -> u32 {
        match self {
            Prec::Fp8 => 89,
            Prec::Tf32 | Prec::Bf16 => 80,
            _ => 70,
        }
    }

    fn tolerance(self) -> f64 {
        match self {
            Prec::F64 => 1e-12,
            Prec::F32 => 1e-5,
            Prec::Tf32 => 5e-4,
            Prec::F16 | Prec::Bf16 | Prec::Fp8 => 1e-2,
            Prec::Int8 => 0.0,
        }
    }

    fn unit(self) -> &'static str {
        if self == Prec::Int8 {
            "OP/s"
        } else {
            "FLOP/s"
        }
    }
}

pub(crate) struct Handles {
    blas: bsys::cublasHandle_t,
    lt: lsys::cublasLtHandle_t,
    workspace: device::DevBuf,
}

impl Drop for Handles {
    fn drop(&mut self) {
        // SAFETY: created in `handles`, destroyed once.
        unsafe {
            let _ = blas::destroy_handle(self.blas);
            let _ = lt::destroy_handle(self.lt);
        }
    }
}

const WORKSPACE: usize = 32 << 20;

pub(crate) fn handles(gpu: &Gpu) -> Result<Handles, CudaError> {
    for l in [Lib::Cublas, Lib::CublasLt] {
        libs::require(l)?;
    }
    gpu.bind()?;
    let workspace = gpu.alloc(WORKSPACE)?;
    let b = blas::create_handle().map_err(|e| CudaError::call("cublasCreate", e))?;
    // SAFETY: a live handle and stream.
    if let Err(e) = unsafe { blas::set_stream(b, gpu.stream as bsys::cudaStream_t) } {
        // SAFETY: created above.
        unsafe {
            let _ = blas::destroy_handle(b);
        }
        return Err(CudaError::call("cublasSetStream", e));
    }
    let l = match lt::create_handle() {
        Ok(l) => l,
        Err(e) => {
            // SAFETY: created above.
            unsafe {
                let _ = blas::destroy_handle(b);
            }
            return Err(CudaError::call("cublasLtCreate", e));
        }
    };
    Ok(Handles {
        blas: b,
        lt: l,
        workspace,
    })
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Library {
    Cublas,
    CublasLt,
}

impl Library {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Library::Cublas => "cuBLAS cublasGemmEx",
            Library::CublasLt => "cuBLASLt cublasLtMatmul",
        }
    }
}

/// cublasGemmEx's types for `p`: (A/B type, C type, compute type); `None` for fp8 (Lt only).
fn gemm_ex_types(
    p: Prec,
) -> Option<(
    bsys::cudaDataType,
    bsys::cudaDataType,
    bsys::cublasComputeType_t,
)> {
    use bsys::cublasComputeType_t as C;
    use bsys::cudaDataType as T;
    Some(match p {
        Prec::F64 => (T::CUDA_R_64F, T::CUDA_R_64F, C::CUBLAS_COMPUTE_64F),
        Prec::F32 => (T::CUDA_R_32F, T::CUDA_R_32F, C::CUBLAS_COMPUTE_32F),
        Prec::Tf32 => (
            T::CUDA_R_32F,
            T::CUDA_R_32F,
            C::CUBLAS_COMPUTE_32F_FAST_TF32,
        ),
        Prec::F16 => (T::CUDA_R_16F, T::CUDA_R_16F, C::CUBLAS_COMPUTE_32F),
        Prec::Bf16 => (T::CUDA_R_16BF, T::CUDA_R_16BF, C::CUBLAS_COMPUTE_32F),
        Prec::Int8 => (T::CUDA_R_8I, T::CUDA_R_32I, C::CUBLAS_COMPUTE_32I),
        Prec::Fp8 => return None,
    })
}

/// cuBLASLt's types for `p`: (A/B, C/D, compute, scale).
fn lt_types(
    p: Prec,
) -> (
    lsys::cudaDataType,
    lsys::cudaDataType,
    lsys::cublasComputeType_t,
    lsys::cudaDataType,
) {
    use lsys::cublasComputeType_t as C;
    use lsys::cudaDataType as T;
    match p {
        Prec::F64 => (
            T::CUDA_R_64F,
            T::CUDA_R_64F,
            C::CUBLAS_COMPUTE_64F,
            T::CUDA_R_64F,
        ),
        Prec::F32 => (
            T::CUDA_R_32F,
            T::CUDA_R_32F,
            C::CUBLAS_COMPUTE_32F,
            T::CUDA_R_32F,
        ),
        Prec::Tf32 => (
            T::CUDA_R_32F,
            T::CUDA_R_32F,
            C::CUBLAS_COMPUTE_32F_FAST_TF32,
            T::CUDA_R_32F,
        ),
        Prec::F16 => (
            T::CUDA_R_16F,
            T::CUDA_R_16F,
            C::CUBLAS_COMPUTE_32F,
            T::CUDA_R_32F,
        ),
        Prec::Bf16 => (
            T::CUDA_R_16BF,
            T::CUDA_R_16BF,
            C::CUBLAS_COMPUTE_32F,
            T::CUDA_R_32F,
        ),
        Prec::Int8 => (
            T::CUDA_R_8I,
            T::CUDA_R_32I,
            C::CUBLAS_COMPUTE_32I,
            T::CUDA_R_32I,
        ),
        Prec::Fp8 => (
            T::CUDA_R_8F_E4M3,
            T::CUDA_R_16BF,
            C::CUBLAS_COMPUTE_32F,
            T::CUDA_R_32F,
        ),
    }
}

/// alpha = 1, beta = 0 in the scale type.
struct Scalars {
    f64s: [f64; 2],
    f32s: [f32; 2],
    i32s: [i32; 2],
}

const SCALARS: Scalars = Scalars {
    f64s: [1.0, 0.0],
    f32s: [1.0, 0.0],
    i32s: [1, 0],
};

fn scalars(p: Prec) -> (*const c_void, *const c_void) {
    match p {
        Prec::F64 => (
            &SCALARS.f64s[0] as *const f64 as _,
            &SCALARS.f64s[1] as *const f64 as _,
        ),
        Prec::Int8 => (
            &SCALARS.i32s[0] as *const i32 as _,
            &SCALARS.i32s[1] as *const i32 as _,
        ),
        _ => (
            &SCALARS.f32s[0] as *const f32 as _,
            &SCALARS.f32s[1] as *const f32 as _,
        ),
    }
}

/// One GEMM's cuBLASLt descriptors (the operation, A's, B's and C's layouts, the
/// preference), destroyed on drop. Built without a handle: the gate builds every one the probe
/// does on a machine with no GPU.
pub(crate) struct LtDescs {
    desc: lsys::cublasLtMatmulDesc_t,
    la: lsys::cublasLtMatrixLayout_t,
    lb: lsys::cublasLtMatrixLayout_t,
    lc: lsys::cublasLtMatrixLayout_t,
    pref: lsys::cublasLtMatmulPreference_t,
}

impl Drop for LtDescs {
    fn drop(&mut self) {
        // SAFETY: created in `lt_descs`, destroyed once (null handles are skipped).
        unsafe {
            for l in [self.la, self.lb, self.lc] {
                if !l.is_null() {
                    let _ = lt::destroy_matrix_layout(l);
                }
            }
            if !self.desc.is_null() {
                let _ = lt::destroy_matmul_desc(self.desc);
            }
            if !self.pref.is_null() {
                let _ = lt::destroy_matmul_pref(self.pref);
            }
        }
    }
}

/// A cuBLASLt plan: descriptors and the heuristic's algorithm, destroyed on drop.
pub(crate) struct LtPlan {
    d: LtDescs,
    algo: lsys::cublasLtMatmulAlgo_t,
    workspace: usize,
}

fn lt_err(call: &'static str) -> impl Fn(lt::CublasError) -> CudaError {
    move |err| CudaError::call(call, err)
}

/// The descriptors of the "TN" GEMM C (m×n) = Aᵀ (A k×m) · B (k×n), column-major, in `p`'s
/// types, and a preference allowing the probe's workspace.
pub(crate) fn lt_descs(p: Prec, m: usize, n: usize, k: usize) -> Result<LtDescs, CudaError> {
    libs::require(Lib::CublasLt)?;
    let (tab, tc, compute, scale) = lt_types(p);
    let e = lt_err;
    let mut d = LtDescs {
        desc: lt::create_matmul_desc(compute, scale).map_err(e("cublasLtMatmulDescCreate"))?,
        la: std::ptr::null_mut(),
        lb: std::ptr::null_mut(),
        lc: std::ptr::null_mut(),
        pref: std::ptr::null_mut(),
    };
    let transa: i32 = 1; // CUBLAS_OP_T
                         // SAFETY: live descriptor; the attribute value is an i32 of the right size.
    unsafe {
        lt::set_matmul_desc_attribute(
            d.desc,
            lsys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
            &transa as *const i32 as *const c_void,
            std::mem::size_of::<i32>(),
        )
        .map_err(e("cublasLtMatmulDescSetAttribute(TRANSA)"))?;
    }
    d.la = lt::create_matrix_layout(tab, k as u64, m as u64, k as i64)
        .map_err(e("cublasLtMatrixLayoutCreate(A)"))?;
    d.lb = lt::create_matrix_layout(tab, k as u64, n as u64, k as i64)
        .map_err(e("cublasLtMatrixLayoutCreate(B)"))?;
    d.lc = lt::create_matrix_layout(tc, m as u64, n as u64, m as i64)
        .map_err(e("cublasLtMatrixLayoutCreate(C)"))?;
    d.pref = lt::create_matmul_pref().map_err(e("cublasLtMatmulPreferenceCreate"))?;
    let ws = WORKSPACE as u64;
    // SAFETY: live preference; the value is a u64 of the right size.
    unsafe {
        lt::set_matmul_pref_attribute(
            d.pref,
            lsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
            &ws as *const u64 as *const c_void,
            std::mem::size_of::<u64>(),
        )
        .map_err(e("cublasLtMatmulPreferenceSetAttribute"))?;
    }
    Ok(d)
}

/// What cuBLASLt reads back from one GEMM's descriptors: each layout's (type, rows, columns,
/// leading dimension), the operation's TRANSA, compute and scale types, the preference's
/// workspace limit. The gate compares them with what was meant.
#[derive(Debug, PartialEq, Eq)]
pub struct LtReadBack {
    pub layouts: [(u32, u64, u64, i64); 3],
    pub transa: i32,
    pub compute_type: u32,
    pub scale_type: u32,
    pub max_workspace: u64,
}

/// Builds `p`'s descriptors for an m×n×k GEMM exactly as the probe does and reads them back
/// (no handle, no GPU needed); the second value is what they should hold.
pub fn lt_read_back(
    p: Prec,
    m: usize,
    n: usize,
    k: usize,
) -> Result<(LtReadBack, LtReadBack), CudaError> {
    let d = lt_descs(p, m, n, k)?;
    let (tab, tc, compute, scale) = lt_types(p);
    let want = LtReadBack {
        layouts: [
            (tab as u32, k as u64, m as u64, k as i64),
            (tab as u32, k as u64, n as u64, k as i64),
            (tc as u32, m as u64, n as u64, m as i64),
        ],
        transa: 1,
        compute_type: compute as u32,
        scale_type: scale as u32,
        max_workspace: WORKSPACE as u64,
    };
    use lsys::cublasLtMatmulDescAttributes_t as DA;
    use lsys::cublasLtMatrixLayoutAttribute_t as LA;
    // SAFETY: live descriptors; `attr` reads each value with its own size.
    unsafe {
        let layout = |l: lsys::cublasLtMatrixLayout_t| -> Result<(u32, u64, u64, i64), CudaError> {
            let get = |a, v, n, got| lsys::cublasLtMatrixLayoutGetAttribute(l, a, v, n, got);
            let call = "cublasLtMatrixLayoutGetAttribute";
            Ok((
                attr(call, get, LA::CUBLASLT_MATRIX_LAYOUT_TYPE)?,
                attr(call, get, LA::CUBLASLT_MATRIX_LAYOUT_ROWS)?,
                attr(call, get, LA::CUBLASLT_MATRIX_LAYOUT_COLS)?,
                attr(call, get, LA::CUBLASLT_MATRIX_LAYOUT_LD)?,
            ))
        };
        let desc = |a, v, n, got| lsys::cublasLtMatmulDescGetAttribute(d.desc, a, v, n, got);
        let call = "cublasLtMatmulDescGetAttribute";
        Ok((
            LtReadBack {
                layouts: [layout(d.la)?, layout(d.lb)?, layout(d.lc)?],
                transa: attr(call, desc, DA::CUBLASLT_MATMUL_DESC_TRANSA)?,
                compute_type: attr(call, desc, DA::CUBLASLT_MATMUL_DESC_COMPUTE_TYPE)?,
                scale_type: attr(call, desc, DA::CUBLASLT_MATMUL_DESC_SCALE_TYPE)?,
                max_workspace: attr(
                    "cublasLtMatmulPreferenceGetAttribute",
                    |a, v, n, got| lsys::cublasLtMatmulPreferenceGetAttribute(d.pref, a, v, n, got),
                    lsys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                )?,
            },
            want,
        ))
    }
}

/// One attribute of a cuBLASLt object, read by its getter `get` (attribute, buffer, its size,
/// bytes written) into a `T` of the attribute's size.
///
/// # Safety
/// `get` reads a live object, and `T` is the attribute's type.
unsafe fn attr<A, T: Default>(
    call: &'static str,
    get: impl Fn(A, *mut c_void, usize, *mut usize) -> lsys::cublasStatus_t,
    a: A,
) -> Result<T, CudaError> {
    let mut v = T::default();
    let mut got = 0usize;
    get(
        a,
        &mut v as *mut T as *mut c_void,
        std::mem::size_of::<T>(),
        &mut got,
    )
    .result()
    .map_err(lt_err(call))?;
    Ok(v)
}

pub(crate) fn lt_plan(
    h: &Handles,
    p: Prec,
    m: usize,
    n: usize,
    k: usize,
) -> Result<LtPlan, CudaError> {
    let d = lt_descs(p, m, n, k)?;
    // SAFETY: live handle and descriptors.
    let heuristic = unsafe {
        lt::get_matmul_algo_heuristic(h.lt, d.desc, d.la, d.lb, d.lc, d.lc, d.pref)
            .map_err(lt_err("cublasLtMatmulAlgoGetHeuristic"))
    }?;
    Ok(LtPlan {
        d,
        algo: heuristic.algo,
        workspace: heuristic.workspaceSize,
    })
}

/// The operands of one "TN" GEMM on the device: A is k×m, B is k×n (column-major, in the
/// precision's input type), C = Aᵀ·B is m×n (its output type).
pub(crate) struct Operands<'a> {
    pub m: usize,
    pub n: usize,
    pub k: usize,
    pub a: &'a device::DevBuf,
    pub b: &'a device::DevBuf,
    pub c: &'a device::DevBuf,
}

/// Enqueues one GEMM on `gpu`'s stream with `lib` (cuBLASLt with its `plan`).
pub(crate) fn enqueue(
    gpu: &Gpu,
    h: &Handles,
    lib: Library,
    p: Prec,
    pr: &Operands,
    plan: Option<&LtPlan>,
) -> Result<(), CudaError> {
    let (alpha, beta) = scalars(p);
    let (a, b) = (pr.a.ptr as *const c_void, pr.b.ptr as *const c_void);
    let c = pr.c.ptr as *mut c_void;
    match lib {
        Library::Cublas => {
            let (tab, tc, compute) = gemm_ex_types(p)
                .ok_or_else(|| CudaError::Unsupported("fp8 GEMM needs cuBLASLt".into()))?;
            // SAFETY: device buffers sized for the TN problem; host scalars of the compute type.
            unsafe {
                blas::gemm_ex(
                    h.blas,
                    bsys::cublasOperation_t::CUBLAS_OP_T,
                    bsys::cublasOperation_t::CUBLAS_OP_N,
                    pr.m as i32,
                    pr.n as i32,
                    pr.k as i32,
                    alpha,
                    a,
                    tab,
                    pr.k as i32,
                    b,
                    tab,
                    pr.k as i32,
                    beta,
                    c,
                    tc,
                    pr.m as i32,
                    compute,
                    bsys::cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| {
                CudaError::call(
                    &format!("cublasGemmEx({} {}x{}x{})", p.name(), pr.m, pr.n, pr.k),
                    e,
                )
            })
        }
        Library::CublasLt => {
            let plan = plan.ok_or_else(|| CudaError::Check("no cuBLASLt plan".into()))?;
            // SAFETY: as above; the workspace is at least the heuristic's size.
            unsafe {
                lt::matmul(
                    h.lt,
                    plan.d.desc,
                    alpha,
                    beta,
                    a,
                    plan.d.la,
                    b,
                    plan.d.lb,
                    c,
                    plan.d.lc,
                    c,
                    plan.d.lc,
                    &plan.algo,
                    h.workspace.ptr as *mut c_void,
                    plan.workspace.min(WORKSPACE),
                    gpu.stream as lsys::cudaStream_t,
                )
            }
            .map_err(|e| {
                CudaError::call(
                    &format!("cublasLtMatmul({} {}x{}x{})", p.name(), pr.m, pr.n, pr.k),
                    e,
                )
            })
        }
    }
}

/// A cuBLAS handle on a GPU's stream, for the trainer's f32 products.
///
/// Its workspace is a buffer of its own (`cublasSetWorkspace`, after `cublasSetStream`, which
/// resets it), not cuBLAS's default pool: a product captured into a CUDA graph then reads and
/// writes the same memory at every launch, and the capture allocates nothing.
pub struct Blas(bsys::cublasHandle_t, #[allow(dead_code)] device::DevBuf);

/// The trainer's cuBLAS workspace (NVIDIA's recommendation for Hopper; ample before it).
const HANDLE_WORKSPACE: usize = 32 << 20;

impl Blas {
    /// A handle on `gpu`'s stream (cuBLAS's absence is an error that says what was looked for).
    pub fn new(gpu: &Gpu) -> Result<Blas, CudaError> {
        libs::require(Lib::Cublas)?;
        let ws = gpu.alloc(HANDLE_WORKSPACE)?;
        let h = blas::create_handle().map_err(|e| CudaError::call("cublasCreate", e))?;
        let handle = Blas(h, ws);
        // SAFETY: live handle and stream (the handle is destroyed by Drop if this fails).
        unsafe { blas::set_stream(h, gpu.stream as bsys::cudaStream_t) }
            .map_err(|e| CudaError::call("cublasSetStream", e))?;
        // SAFETY: live handle; the workspace is a device buffer of this context (256-byte
        // aligned, as cuMemAlloc's are) that lives as long as the handle (dropped after it).
        unsafe {
            bsys::cublasSetWorkspace_v2(h, handle.1.ptr as *mut c_void, handle.1.bytes).result()
        }
        .map_err(|e| CudaError::call("cublasSetWorkspace", e))?;
        Ok(handle)
    }

    /// Column-major `c(m×n) = op(a) · op(b)` in f32 on the handle's stream (`beta` 0:
    /// overwrite).
    ///
    /// # Safety
    /// `a`, `b` and `c` are device addresses on the handle's GPU holding the matrices the sizes
    /// and leading dimensions describe, alive until the stream has run the product.
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn sgemm(
        &self,
        (ta, tb): (bool, bool),
        (m, n, k): (usize, usize, usize),
        (a, lda): (u64, usize),
        (b, ldb): (u64, usize),
        (c, ldc): (u64, usize),
    ) -> Result<(), CudaError> {
        let op = |t: bool| {
            if t {
                bsys::cublasOperation_t::CUBLAS_OP_T
            } else {
                bsys::cublasOperation_t::CUBLAS_OP_N
            }
        };
        let (one, zero) = (1.0f32, 0.0f32);
        // SAFETY: live handle; the caller vouches for the buffers.
        unsafe {
            blas::sgemm(
                self.0,
                op(ta),
                op(tb),
                m as i32,
                n as i32,
                k as i32,
                &one,
                a as *const f32,
                lda as i32,
                b as *const f32,
                ldb as i32,
                &zero,
                c as *mut f32,
                ldc as i32,
            )
        }
        .map_err(|e| CudaError::call("cublasSgemm", e))
    }
}

impl Drop for Blas {
    fn drop(&mut self) {
        // SAFETY: created in `new`, destroyed once.
        unsafe {
            let _ = blas::destroy_handle(self.0);
        }
    }
}
