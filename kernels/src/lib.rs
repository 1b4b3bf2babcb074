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
    Check(#[from] driver::CheckError),
    #[error("cannot allocate {0} bytes")]
    Alloc(usize),
    #[error("not supported here: {0}")]
    Unsupported(String),
    #[error("no CPU to run on")]
    NoCpu,
    #[error("cannot start the probe's threads: {0}")]
    Threads(#[source] rayon::ThreadPoolBuildError),
    #[error("a thread of the probe panicked: {0}")]
    Panicked(&'static str),
    #[error("the peak database: {0}")]
    Peaks(#[source] roofline_model::ModelError),
    #[error("{what} {}: {source}", path.display())]
    Io {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} is not a folder", .0.display())]
    NotAFolder(std::path::PathBuf),
}
