//! The CUDA backend: library discovery, NVRTC kernels, and (on a machine with an NVIDIA GPU)
//! the device, library and copy measurements. Everything here builds with no CUDA installed:
//! cudarc loads every library at run time, and nothing calls into a library before
//! [`libs::require`] says it is there, and is the file roofline found.

pub mod blas;
pub mod conv_search;
pub mod device;
pub mod dnn;
pub mod dnn_cache;
pub mod dnn_graph;
pub mod dnn_plan;
pub mod doctor;
pub mod graph;
pub mod libs;
pub mod nccl_lib;
pub mod nvrtc;
pub mod slices;
pub mod stage;

use blas::Prec;

/// How the trainer stores a tensor on the GPU: f32, or 16 bits (f16, bf16) that its kernels
/// read into f32 registers and round to nearest even on the way back. The kernels of
/// `train.cu` that read or write activations are compiled once per storage type, as
/// `<kernel>_f32`, `<kernel>_f16` and `<kernel>_bf16` ([`Typed`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Storage {
    F32,
    F16,
    Bf16,
}

impl Storage {
    pub fn bytes(self) -> usize {
        match self {
            Storage::F32 => 4,
            Storage::F16 | Storage::Bf16 => 2,
        }
    }

    /// The storage of a convolution's operands in precision `p` (cuDNN's data type): 16 bits
    /// for f16 and bf16, f32 for f32 and tf32 (and the precisions the trainer refuses).
    pub fn of(p: Prec) -> Storage {
        match p {
            Prec::F16 => Storage::F16,
            Prec::Bf16 => Storage::Bf16,
            _ => Storage::F32,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Storage::F32 => "f32",
            Storage::F16 => "f16",
            Storage::Bf16 => "bf16",
        }
    }

    /// `k`'s entry point for this storage type.
    pub fn kernel(self, k: Typed) -> &'static str {
        k.0[self as usize]
    }
}

/// A `train.cu` kernel compiled once per [`Storage`] type: its three entry points in the order
/// f32, f16, bf16 (see [`typed!`](crate::typed)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Typed(pub [&'static str; 3]);

/// The [`Typed`] kernel of base name `$name`: `$name_f32`, `$name_f16`, `$name_bf16`.
#[macro_export]
macro_rules! typed {
    ($name:literal) => {
        $crate::cuda::Typed([
            concat!($name, "_f32"),
            concat!($name, "_f16"),
            concat!($name, "_bf16"),
        ])
    };
}

/// Errors of the CUDA backend. Every library call's failure names the call.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// A library is not installed; the text says which and where we looked.
    #[error("{0}")]
    Missing(String),
    /// A library's bindings would call another file than the one roofline found (a second
    /// copy on the dynamic linker's path): the text names both and the fix.
    #[error("{0}")]
    Shadowed(String),
    /// The driver is there but reports no device.
    #[error("the NVIDIA driver is installed but reports no GPU ({0})")]
    NoDevice(String),
    /// A CUDA, NVRTC, cuBLAS, cuBLASLt, cuDNN or NCCL call returned an error.
    #[error("{call} failed: {detail}")]
    Call { call: String, detail: String },
    #[error("NVRTC could not compile {file} for {target}:\n{log}")]
    Compile {
        file: String,
        target: String,
        log: String,
    },
    /// A GPU result disagreed with its CPU reference.
    #[error("result check failed: {0}")]
    Check(String),
    /// A GPU result outside the bound of its CPU reference (the checks shared with the CPU's).
    #[error("result check failed: {0}")]
    Verify(#[from] crate::driver::CheckError),
    #[error("not supported on this GPU: {0}")]
    Unsupported(String),
    #[error("interrupted")]
    Interrupted,
}

impl CudaError {
    /// The error of library call `call`.
    pub fn call(call: &str, e: impl std::fmt::Debug) -> CudaError {
        CudaError::Call {
            call: call.to_string(),
            detail: format!("{e:?}"),
        }
    }
}
