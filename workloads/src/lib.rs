//! The embedded trainer: tensors, layers with explicit forward and backward passes (each checked
//! against finite differences), ResNet-50, the optimiser and schedule, synthetic data, and the
//! training loop whose every FLOP is counted analytically.

pub mod accounting;
pub mod alloc;
pub mod automl;
pub mod bagging;
pub mod checkpoint;
pub mod conv;
pub mod data;
pub mod detect;
pub mod ewa;
pub mod ewa_data;
pub mod exchange;
pub mod folder;
pub mod gpu;
pub mod graph;
pub mod init;
pub mod layers;
pub mod resnet;
pub mod run;
pub mod tensor;
pub mod train;
