//! CPU kernels.

pub mod bf16;
pub mod clock;
pub mod conv;
pub mod fma;
pub mod gemm;
pub mod isa;
pub mod sgemm;
pub mod stream;
mod tiles;
pub use tiles::{grow, line, line_start, pad, LINE};
