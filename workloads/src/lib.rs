//! The embedded trainer: tensors, layers with explicit forward and backward passes (each checked
//! against finite differences), ResNet-50, the optimiser and schedule, synthetic data, and the
//! training loop whose every FLOP is counted analytically.

// The CPU tensor engine, a crate of its own (workloads/nn), under its old paths.
pub use roofline_nn::{alloc, conv, data, layers, tensor};

pub mod accounting;
pub mod bagging;
pub mod checkpoint;
pub mod detect;
pub mod ewa;
pub mod ewa_data;
pub mod exchange;
pub mod folder;
pub mod gpu;
pub mod graph;
pub mod init;
pub mod resnet;
pub mod run;
pub mod train;
