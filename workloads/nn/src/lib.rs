//! The CPU tensor engine the trainer is built on: dense tensors and the GEMM they reduce to
//! (`tensor`), convolutions (`conv`: im2col, Winograd, 16-bit), layers with explicit forward
//! and backward passes, each checked against finite differences (`layers`), the caching
//! allocator of the training loop's large blocks (`alloc`), and the deterministic generator
//! and synthetic images (`data`). It knows nothing of models, devices or benchmarks.

pub mod alloc;
pub mod conv;
pub mod data;
pub mod layers;
pub mod tensor;
