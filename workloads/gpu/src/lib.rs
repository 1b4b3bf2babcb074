//! The trainer on one NVIDIA GPU: the same ResNet, layer for layer, on cuDNN (convolutions in
//! three directions), cuBLAS (the classifier) and the NVRTC kernels of `kernels/cuda/train.cu`
//! (batch norm, ReLU, residual adds, pooling, loss, SGD, casts), with f32 master weights and,
//! as an option, f16/bf16 training: activations and their gradients stored in 16 bits between
//! layers (a [`GTensor`]'s [`Storage`]), the convolutions reading the optimizer's 16-bit copy
//! of the weights, and dynamic loss scaling for f16. Data parallel over NCCL
//! (gradients) plus the CPU trainer's [`Reducer`] for the batch-norm statistics and the loss.
//!
//! Every CUDA call's status is checked and becomes an error naming the call; nothing here runs
//! without a driver (the caller gets `CudaError::Missing`). Written without a GPU to run it on:
//! [`self_test`] compares every layer, and one whole training step, with the CPU layers on
//! small shapes, and `roofline train --device cuda --check` runs it.

// What every module of the trainer names (each `use super::*`).
use roofline_kernels::comm::nccl::{Communicator, Elem};
use roofline_kernels::cuda::blas::Prec;
use roofline_kernels::cuda::device::{arg, Event, Gpu};
use roofline_kernels::cuda::dnn::{ConvPlan, PlanChoice};
use roofline_kernels::cuda::{CudaError, Storage, Typed};
use roofline_models::conv::ConvShape;
use roofline_models::exchange::{CommOptions, Wire};
use roofline_models::layers::{BatchNorm, Conv2d, Reducer};
use roofline_models::resnet::{Bottleneck, ResNet, BWD, FWD};
use roofline_models::tensor::Tensor;
use std::collections::HashMap;
use std::ffi::c_void;
use std::rc::Rc;
use std::sync::Arc;

mod bn;
mod body;
mod check;
mod check_described;
mod check_detector;
mod check_detector_step;
mod check_graph;
mod check_step;
mod classify;
mod ctx;
mod described;
mod detect;
mod detector;
mod fpn;
mod graph;
mod head_loss;
mod layers;
mod pool;
mod proposals;
mod reference;
mod region_match;
mod resnet;
mod roi_align;
mod rpn_loss;
mod trainer;
use bn::*;
use body::*;
pub use check::*;
pub use check_described::{described_checks, COARSE};
pub use check_detector::*;
use check_detector_step::*;
use check_step::*;
use classify::{softmax_xent, step_start, StepIo};
pub use ctx::*;
pub use described::GpuGraph;
pub use detect::*;
pub use detector::*;
pub use graph::{GraphMode, GraphReport, Plan, Policy, TRIAL_STEPS};
pub use head_loss::{head_loss_sums, head_terms_bytes, HeadLoss};
pub use layers::conv_algorithms;
use layers::*;
pub use proposals::{proposal_mismatch, Proposals, MAX_PRE_NMS, PROPOSAL_TOLERANCE};
use reference::*;
pub use region_match::CandidateLabels;
pub use resnet::*;
pub use roi_align::*;
pub use roofline_models::train::SearchReport;
pub use rpn_loss::{rpn_loss_sums, terms_bytes, RpnLoss, MAX_TRUTH};
pub use trainer::*;

#[cfg(test)]
mod tests;
