//! The CUDA backend: library discovery, NVRTC kernels, and (on a machine with an NVIDIA GPU)
//! the device, library and copy measurements. Everything here builds with no CUDA installed:
//! cudarc loads every library at run time, and nothing calls into a library before
//! [`libs::require`] says it is there, and is the file roofline found.

pub mod blas;
pub mod device;
pub mod dnn;
pub mod dnn_cache;
pub mod doctor;
pub mod libs;
pub mod nccl_lib;
pub mod nvrtc;

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
