//! What runs on hardware: CPU kernels (peak FMA, streaming memory, GEMM, convolution), the one
//! driver that times them, and the probes that sweep them and turn measurements into ceilings.

pub mod affinity;
pub mod buffer;
pub mod comm;
pub mod cpu;
pub mod cuda;
pub mod driver;
pub mod io;
pub mod micro;
pub mod perf;
pub mod probe;

/// Errors of kernels and probes.
#[derive(Debug, thiserror::Error)]
pub enum ProbeError {
    #[error("interrupted")]
    Interrupted,
    #[error("result check failed: {0}")]
    Check(String),
    #[error("cannot allocate {0} bytes")]
    Alloc(usize),
    #[error("not supported here: {0}")]
    Unsupported(String),
    #[error("cannot start threads: {0}")]
    Threads(String),
    #[error("{0}")]
    Io(String),
}
