//! The embedded trainer above the tensor engine (`roofline_nn`, re-exported under its old
//! paths): the models (ResNet-50, the detector, described networks and their morphisms, the
//! analytic accounting, checkpoints, the readers), the device trainer (`gpu`), the one training
//! loop and data parallelism, and the benchmarks' runs (`run`: place, score, sweep; bagging).

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
