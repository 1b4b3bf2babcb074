//! The benchmarks' runs on the embedded trainer (`run`): a training run of either workload set
//! up from typed choices and driven on the CPU or a GPU, `place`, `score` (HPC AI500's rules,
//! bagging), `sweep`. The floors below it are crates of their own, re-exported here under their
//! old paths: the tensor engine (`roofline_nn`), the models and the training loop
//! (`roofline_models`), the device trainer (`roofline_gpu`, as `gpu`).

pub use roofline_gpu as gpu;
pub use roofline_models::{
    accounting, bagging, checkpoint, detect, ewa, ewa_data, exchange, folder, graph, init, resnet,
    train,
};
pub use roofline_nn::{alloc, conv, data, layers, tensor};

pub mod run;
