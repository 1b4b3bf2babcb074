//! The models and the one training loop that trains them, above the tensor engine
//! (`roofline_nn`, re-exported under its old paths): ResNet-50 and the detector on the CPU
//! layers, networks built from a description and their morphisms (`graph`), the analytic
//! accounting, initialisation, checkpoints, the data readers, the ranks' gradient exchange,
//! the loop itself (`train`: generic over a `Model`, a `Task` and a `Device`), EWA's task and
//! the ensemble of bagged models. Nothing here knows the GPU: the device trainer sits above.

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
pub mod graph;
pub mod init;
pub mod resnet;
pub mod train;
