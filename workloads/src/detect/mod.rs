//! Building blocks of the EWA workload's detector (Faster R-CNN with a ResNet-50-FPN backbone,
//! HPC AI500 V2.0): the feature pyramid, the region proposal network's head and proposals, the box head and predictor, box arithmetic, anchors, non-maximum suppression, anchor and proposal
//! assignment with sampling, RoIAlign with its backward pass and FPN level assignment, the
//! losses with their gradients, and the mAP@0.5 metric. Each is tested on its own (hand-computed cases,
//! finite differences); the model that puts them together is not built yet.

pub mod boxes;
pub mod fpn;
pub mod head;
pub mod loss;
pub mod map;
pub mod matcher;
pub mod roi_align;
pub mod rpn;
