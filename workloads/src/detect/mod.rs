//! Building blocks of the EWA workload's detector (Faster R-CNN with a ResNet-50-FPN backbone,
//! HPC AI500 V2.0): box arithmetic, anchors, non-maximum suppression, RoIAlign with its
//! backward pass, and the mAP@0.5 metric. Each is tested on its own (hand-computed cases,
//! finite differences); the model that puts them together is not built yet.

pub mod boxes;
pub mod map;
pub mod roi_align;
