//! The assembled detector: Faster R-CNN with a ResNet-50-FPN backbone (HPC AI500 V2.0's EWA
//! model), taking 16-channel fields. One training step runs the backbone (C2–C5), the feature
//! pyramid (P2–P6), the region proposal network over every level (its losses on sampled
//! anchors), proposals per image (no gradient flows through them, as in torchvision), the
//! second stage's sampled regions pooled by multi-scale RoIAlign from P2–P5, the box head and
//! predictor (their losses), and the backward pass through all of it.
//!
//! FLOP accounting (`DetectorConfig::flops`), 2 per multiply-add: the backbone as the classifier's
//! count (stem: no data gradient), the pyramid's and RPN head's convolutions at each level's
//! size (backward: data and weight gradients, 2× forward), RoIAlign's `8·s² + 1` per pooled
//! element (backward the same again), the box head's fully connected layers with biases
//! (backward 2× forward) — for `roi_per_image` regions per image in training and
//! `rpn_test.post_nms` at inference. Box coding, NMS, matching and the losses are not counted.

use super::boxes::BBox;
use super::fpn::Fpn;
use super::head::{head_loss, BoxHead};
use super::host::Regions;
use super::map::Detection;
use super::roi_align::MultiScale;
use super::rpn::{rpn_loss, ProposalRule, RpnHead};
use crate::data::Rng;
use crate::layers::{Param, Reducer};
use crate::resnet::{Config, Flops, ResNet, BWD, FWD};
use crate::tensor::{Float, Tensor};
use roofline_collectors::timeline::timed;
use std::sync::Arc;

/// The detector's shape and its training and inference settings.
#[derive(Clone, Debug)]
pub struct DetectorConfig {
    /// The backbone (its classifier is not used).
    pub backbone: Config,
    pub in_channels: usize,
    /// Channels of every pyramid level (256).
    pub fpn_width: usize,
    /// Anchor side at P2 in pixels; level l (P2 + l) has the `scales` first of the sizes
    /// `base·2^l·{1, 2^⅓, 2^⅔}`, each in every ratio of `ratios`.
    pub anchor_base: f64,
    /// Anchor sizes per level: 3 (the paper's model, nine anchors a cell) or 1 (torchvision's
    /// default, `base·2^l` alone: three a cell); `--anchors 9|3`.
    pub scales: usize,
    pub ratios: Vec<f64>,
    /// Units of the box head's two fully connected layers (1024).
    pub hidden: usize,
    /// Object classes (background not included).
    pub classes: usize,
    /// Anchors sampled per image for the RPN's losses (256).
    pub rpn_per_image: usize,
    pub rpn_train: ProposalRule,
    pub rpn_test: ProposalRule,
    /// Regions sampled per image for the second stage's losses (512).
    pub roi_per_image: usize,
    pub pool: MultiScale,
    /// Detections below this class probability are dropped (0.05).
    pub score_threshold: f64,
    /// Per-class NMS of the detections (0.5).
    pub nms: f64,
    /// Detections kept per image (100).
    pub detections: usize,
}

impl DetectorConfig {
    /// The paper's model: ResNet-50 v1.5 backbone, 16 input channels, FPN of 256, anchors of
    /// 32·2^l·{1, 2^⅓, 2^⅔} × ratios {0.5, 1, 2} (nine per cell), box head of 1024, four
    /// classes; torchvision's training and inference settings.
    pub fn ewa() -> DetectorConfig {
        DetectorConfig {
            backbone: Config::resnet50(1),
            in_channels: crate::ewa_data::CHANNELS,
            fpn_width: 256,
            anchor_base: 32.0,
            scales: 3,
            ratios: vec![0.5, 1.0, 2.0],
            hidden: 1024,
            classes: crate::ewa_data::CLASSES.len(),
            rpn_per_image: 256,
            rpn_train: ProposalRule {
                pre_nms: 2000,
                post_nms: 2000,
                nms: 0.7,
                min_size: 1e-3,
            },
            rpn_test: ProposalRule {
                pre_nms: 1000,
                post_nms: 1000,
                nms: 0.7,
                min_size: 1e-3,
            },
            roi_per_image: 512,
            pool: MultiScale { out: 7, samples: 2 },
            score_threshold: 0.05,
            nms: 0.5,
            detections: 100,
        }
    }

    /// The paper's model scaled for small machines: backbone `width` and `blocks` per stage,
    /// pyramid and box head narrowed by the same factor (256·width, 1024·width), anchors scaled
    /// with the image height (32 at 768 rows, at least 8), and the sampled anchors, proposals
    /// and regions per image scaled with the image's area against 768×1152 (at least 128
    /// anchors, 300 proposals in training and 100 at inference, 128 regions); the paper's
    /// settings at full size.
    pub fn scaled(
        width: f64,
        blocks: [usize; 4],
        height: usize,
        image_width: usize,
    ) -> DetectorConfig {
        let full = DetectorConfig::ewa();
        let area = ((height * image_width) as f64 / (768.0 * 1152.0)).min(1.0);
        let at_least =
            |paper: usize, floor: usize| ((paper as f64 * area).round() as usize).max(floor);
        DetectorConfig {
            backbone: Config {
                width,
                blocks,
                ..full.backbone.clone()
            },
            fpn_width: ((256.0 * width).round() as usize).max(8),
            hidden: ((1024.0 * width).round() as usize).max(16),
            anchor_base: (32.0 * height as f64 / 768.0).max(8.0),
            rpn_per_image: at_least(full.rpn_per_image, 128),
            rpn_train: ProposalRule {
                pre_nms: at_least(full.rpn_train.pre_nms, 300),
                post_nms: at_least(full.rpn_train.post_nms, 300),
                ..full.rpn_train
            },
            rpn_test: ProposalRule {
                pre_nms: at_least(full.rpn_test.pre_nms, 100),
                post_nms: at_least(full.rpn_test.post_nms, 100),
                ..full.rpn_test
            },
            roi_per_image: at_least(full.roi_per_image, 128),
            ..full
        }
    }

    /// Anchors per cell.
    pub fn anchors_per_cell(&self) -> usize {
        self.scales * self.ratios.len()
    }

    /// Level l's anchor sizes (`scales` of them).
    pub fn sizes(&self, level: usize) -> Vec<f64> {
        let s = self.anchor_base * (1u64 << level) as f64;
        [s, s * 2f64.powf(1.0 / 3.0), s * 2f64.powf(2.0 / 3.0)][..self.scales.clamp(1, 3)].to_vec()
    }

    /// The configuration with `per_cell` anchors a cell: 9 (three sizes, the paper's model) or
    /// 3 (one size, torchvision's default), each size in every ratio of `ratios`.
    pub fn with_anchors(self, per_cell: usize) -> Result<DetectorConfig, String> {
        let r = self.ratios.len();
        match per_cell {
            n if n == 3 * r => Ok(DetectorConfig { scales: 3, ..self }),
            n if n == r => Ok(DetectorConfig { scales: 1, ..self }),
            n => Err(format!(
                "{n}: a cell has {} anchors (three sizes × {r} ratios, the paper's model) or {r} (one size × {r} ratios, torchvision's default)",
                3 * r
            )),
        }
    }

    /// C2–C5 channels of the backbone.
    pub fn stage_channels(&self) -> [usize; 4] {
        let c = |base: usize| ((base as f64 * self.backbone.width).round() as usize).max(1) * 4;
        [c(64), c(128), c(256), c(512)]
    }

    /// P2–P6 sizes for `h × w` inputs (the backbone's strides as its layers compute them).
    pub fn level_sizes(&self, h: usize, w: usize) -> [(usize, usize); 5] {
        let stem = |x: usize| (x + 6 - 7) / 2 + 1;
        let half = |x: usize| (x + 2 - 3) / 2 + 1; // max pool and the 3×3 stride-2 convolutions
        let mut s = [(0, 0); 5];
        s[0] = (half(stem(h)), half(stem(w)));
        for l in 1..4 {
            s[l] = (half(s[l - 1].0), half(s[l - 1].1));
        }
        s[4] = (s[3].0.div_ceil(2), s[3].1.div_ceil(2));
        s
    }
}

/// One image's ground truth: boxes in pixels of the input and their classes (0-based).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Target {
    pub boxes: Vec<BBox>,
    pub classes: Vec<usize>,
}

/// One training step's losses (each a mean, as torchvision normalises them).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Losses {
    pub rpn_objectness: f64,
    pub rpn_box: f64,
    pub classifier: f64,
    pub box_reg: f64,
    /// Regions the second stage trained on.
    pub regions: usize,
}

impl Losses {
    pub fn total(&self) -> f64 {
        self.rpn_objectness + self.rpn_box + self.classifier + self.box_reg
    }
}

/// FLOPs per image of each part, forward and backward.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DetectorFlops {
    pub backbone: Flops,
    pub fpn: Flops,
    pub rpn: Flops,
    pub roi_align: Flops,
    pub box_head: Flops,
}

impl DetectorFlops {
    pub fn parts(&self) -> [(&'static str, Flops); 5] {
        [
            ("backbone", self.backbone),
            ("fpn", self.fpn),
            ("rpn", self.rpn),
            ("roi_align", self.roi_align),
            ("box_head", self.box_head),
        ]
    }

    pub fn total(&self) -> Flops {
        let p = self.parts();
        Flops {
            forward: p.iter().map(|(_, f)| f.forward).sum(),
            backward: p.iter().map(|(_, f)| f.backward).sum(),
        }
    }
}

/// The backbone's parameters without its classifier (which the detector does not use).
fn backbone_params<T: Float>(b: &mut ResNet<T>) -> Vec<&mut Param<T>> {
    b.params()
        .into_iter()
        .filter(|p| !p.name.starts_with("fc."))
        .collect()
}

/// How a step runs the backbone's body: the model's own layers ([`OwnBody`]), or a twin of
/// them (`--check`'s CPU reference with a GPU's rounding points, `gpu/reference.rs`).
pub trait Body<T> {
    /// The four stage outputs C2–C5 for an NHWC batch.
    fn forward(&mut self, m: &mut ResNet<T>, x: &Tensor<T>, train: bool) -> Vec<Arc<Tensor<T>>>;
    /// Every backbone parameter's gradient from the stage outputs' gradients (after a training
    /// `forward`).
    fn backward(&mut self, m: &mut ResNet<T>, dc: Vec<Tensor<T>>);
}

/// The backbone's own layers.
pub struct OwnBody;

impl<T: Float> Body<T> for OwnBody {
    fn forward(&mut self, m: &mut ResNet<T>, x: &Tensor<T>, train: bool) -> Vec<Arc<Tensor<T>>> {
        m.forward_features(x, train)
    }

    fn backward(&mut self, m: &mut ResNet<T>, dc: Vec<Tensor<T>>) {
        m.backward_features(dc)
    }
}

pub struct Detector<T> {
    pub cfg: DetectorConfig,
    pub backbone: ResNet<T>,
    pub fpn: Fpn<T>,
    pub rpn: RpnHead<T>,
    pub head: BoxHead<T>,
}

impl<T: Float> Detector<T> {
    /// He-initialised backbone and pyramid, the RPN and predictor as torchvision (normal
    /// 0.01 for the RPN and class scores, 0.001 for the box deltas, zero biases), the box head's
    /// hidden layers uniform ±1/√fan-in.
    pub fn new(cfg: DetectorConfig, seed: u64) -> Detector<T> {
        let backbone = ResNet::with_input_channels(cfg.backbone.clone(), seed, cfg.in_channels);
        let mut rng = Rng::new(seed ^ 0x00DE_7EC7);
        let fpn = Fpn::new(cfg.stage_channels(), cfg.fpn_width, &mut rng);
        let rpn = RpnHead::new(cfg.fpn_width, cfg.anchors_per_cell(), &mut rng);
        let pooled = cfg.pool.out * cfg.pool.out * cfg.fpn_width;
        let mut head = BoxHead::new(pooled, cfg.hidden, cfg.classes + 1, &mut rng);
        for (l, std) in [(&mut head.cls, 0.01), (&mut head.reg, 0.001)] {
            l.weight
                .value
                .iter_mut()
                .for_each(|v| *v = T::from_f64(rng.normal() * std));
            l.bias.value.iter_mut().for_each(|v| *v = T::zero());
        }
        Detector {
            cfg,
            backbone,
            fpn,
            rpn,
            head,
        }
    }

    /// Every trainable parameter (the backbone's unused classifier left out).
    pub fn params(&mut self) -> Vec<&mut Param<T>> {
        let mut v = backbone_params(&mut self.backbone);
        v.extend(self.fpn.params());
        v.extend(self.rpn.params());
        v.extend(self.head.params());
        v
    }

    pub fn parameter_count(&mut self) -> usize {
        self.params().iter().map(|p| p.value.len()).sum()
    }

    /// Batch norm with statistics over every rank's images (data parallel).
    pub fn set_reducer(&mut self, r: Arc<dyn Reducer>) {
        self.backbone.set_reducer(r);
    }

    /// Backbone, pyramid and RPN head: (P2–P6, the head's outputs per level, anchors).
    #[allow(clippy::type_complexity)]
    pub(crate) fn first_stage(
        &mut self,
        x: &Tensor<T>,
        train: bool,
    ) -> (Vec<Tensor<T>>, Vec<(Tensor<T>, Tensor<T>)>, Vec<Vec<BBox>>) {
        self.first_stage_in(x, train, &mut OwnBody)
    }

    /// `first_stage` with the body run by `body`.
    #[allow(clippy::type_complexity)]
    pub fn first_stage_in(
        &mut self,
        x: &Tensor<T>,
        train: bool,
        body: &mut dyn Body<T>,
    ) -> (Vec<Tensor<T>>, Vec<(Tensor<T>, Tensor<T>)>, Vec<Vec<BBox>>) {
        assert_eq!(x.c, self.cfg.in_channels, "input channels");
        let c = body.forward(&mut self.backbone, x, train);
        let p = timed(FWD, || "fpn".into(), || self.fpn.forward(&c));
        drop(c);
        let out = timed(FWD, || "rpn.head".into(), || self.rpn.forward(&p));
        let sizes: Vec<(usize, usize)> = p.iter().map(|m| (m.h, m.w)).collect();
        let anc = self.cfg.level_anchors(&sizes);
        (p, out, anc)
    }

    /// Forward and backward for a batch (NHWC, `in_channels`) and its ground truth: leaves
    /// every parameter's gradient of the sum of the four losses and returns the losses. `seed`
    /// fixes the sampling of anchors and regions.
    pub fn train_step(&mut self, x: &Tensor<T>, truth: &[Target], seed: u64) -> Losses {
        self.step_with(x, truth, seed, None, &mut |_| {}).0
    }

    /// `train_step`, handing each group of parameters to `ready` as soon as the backward pass
    /// has finished its gradients (box head, RPN head, pyramid, backbone: `backward_order`),
    /// so that a data-parallel run sums them while the rest of the backward pass runs.
    pub fn train_step_with(
        &mut self,
        x: &Tensor<T>,
        truth: &[Target],
        seed: u64,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) -> Losses {
        self.step_with(x, truth, seed, None, ready).0
    }

    /// Every parameter in the order the backward pass finishes them.
    pub fn backward_order(&mut self) -> Vec<&mut Param<T>> {
        let mut v = self.head.params();
        v.extend(self.rpn.params());
        v.extend(self.fpn.params());
        v.extend(backbone_params(&mut self.backbone));
        v
    }

    /// `train_step`, with each image's proposals given (`fixed`) rather than made from the
    /// RPN's outputs; returns the proposals used. Gradients never flow through proposals, so
    /// a finite-difference check must hold them fixed.
    pub(crate) fn step_with(
        &mut self,
        x: &Tensor<T>,
        truth: &[Target],
        seed: u64,
        fixed: Option<&[Vec<BBox>]>,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) -> (Losses, Vec<Vec<BBox>>) {
        self.step_in(x, truth, seed, (fixed, ready), (&mut OwnBody, 1.0))
    }

    /// `step_with` with the body run by `body`, the losses' gradients times `scale` before the
    /// backward pass (a loss-scaled GPU step's; 1: none), so that every parameter's gradient
    /// comes out times `scale` for the caller to divide.
    #[allow(clippy::type_complexity)]
    pub fn step_in(
        &mut self,
        x: &Tensor<T>,
        truth: &[Target],
        seed: u64,
        (fixed, ready): (Option<&[Vec<BBox>]>, &mut dyn FnMut(Vec<&mut Param<T>>)),
        (body, scale): (&mut dyn Body<T>, f64),
    ) -> (Losses, Vec<Vec<BBox>>) {
        let s = T::from_f64(scale);
        let scaled = |mut t: Tensor<T>| {
            if scale != 1.0 {
                t.data.iter_mut().for_each(|v| *v *= s);
            }
            t
        };
        assert_eq!(truth.len(), x.n, "one target per image");
        let (ih, iw) = (x.h as f64, x.w as f64);
        let (p, out, anc) = self.first_stage_in(x, true, body);
        let boxes: Vec<Vec<BBox>> = truth.iter().map(|t| t.boxes.clone()).collect();
        let (rpn_objectness, rpn_box, rpn_grads) = timed(
            FWD,
            || "rpn.loss".into(),
            || rpn_loss(&out, &anc, &boxes, self.cfg.rpn_per_image, seed),
        );
        let rpn_grads: Vec<(Tensor<T>, Tensor<T>)> = rpn_grads
            .into_iter()
            .map(|(o, d)| (scaled(o), scaled(d)))
            .collect();
        let Regions {
            rois,
            labels,
            targets,
            proposals: used,
        } = timed(
            FWD,
            || "proposals".into(),
            || self.cfg.regions(&out, &anc, truth, seed, fixed, (ih, iw)),
        );
        let mut losses = Losses {
            rpn_objectness,
            rpn_box,
            regions: rois.len(),
            ..Losses::default()
        };
        let mut dp: Vec<Tensor<T>> = if rois.is_empty() {
            // No region in the whole batch (no objects and no proposals): the second stage
            // has no loss and its parameters no gradient.
            for prm in self.head.params() {
                prm.grad.iter_mut().for_each(|g| *g = T::zero());
            }
            ready(self.head.params());
            p[..4]
                .iter()
                .map(|m| Tensor::zeros(m.n, m.h, m.w, m.c))
                .collect()
        } else {
            let pooled = timed(
                FWD,
                || "roi_align".into(),
                || self.cfg.pool.forward(&p[..4], &rois),
            );
            let (r, s, c) = (pooled.n, pooled.h, pooled.c);
            let flat = Tensor::from_vec(r, 1, 1, s * s * c, pooled.data);
            let (logits, deltas) = timed(FWD, || "box_head".into(), || self.head.forward(&flat));
            let (cls, reg, dl, dd) = head_loss(&logits, &deltas, &labels, &targets);
            let (dl, dd) = (scaled(dl), scaled(dd));
            losses.classifier = cls;
            losses.box_reg = reg;
            let dflat = timed(BWD, || "box_head".into(), || self.head.backward(&dl, &dd));
            ready(self.head.params());
            let dpooled = Tensor::from_vec(r, s, s, c, dflat.data);
            timed(
                BWD,
                || "roi_align".into(),
                || self.cfg.pool.backward(&dpooled, &p[..4], &rois),
            )
        };
        let p6 = &p[4];
        dp.push(Tensor::zeros(p6.n, p6.h, p6.w, p6.c));
        let drpn = timed(BWD, || "rpn.head".into(), || self.rpn.backward(&rpn_grads));
        ready(self.rpn.params());
        for (d, g) in dp.iter_mut().zip(&drpn) {
            crate::layers::add_into(d, g);
        }
        drop(p);
        let dc = timed(BWD, || "fpn".into(), || self.fpn.backward(dp));
        ready(self.fpn.params());
        body.backward(&mut self.backbone, dc);
        ready(backbone_params(&mut self.backbone));
        (losses, used)
    }

    /// Detections for a batch (inference: batch norm on running statistics): per image, each
    /// proposal's class probabilities, its class-specific box, boxes under the score threshold
    /// dropped, per-class NMS, the best `detections` kept. `image` is the index in the batch.
    pub fn detect(&mut self, x: &Tensor<T>) -> Vec<Vec<Detection>> {
        let (ih, iw) = (x.h as f64, x.w as f64);
        let (p, out, anc) = self.first_stage(x, false);
        let rois = self.cfg.test_regions(&out, &anc, x.n, (ih, iw));
        if rois.is_empty() {
            return vec![Vec::new(); x.n];
        }
        let pooled = self.cfg.pool.forward(&p[..4], &rois);
        let (r, s, c) = (pooled.n, pooled.h, pooled.c);
        let (logits, deltas) =
            self.head
                .forward(&Tensor::from_vec(r, 1, 1, s * s * c, pooled.data));
        self.cfg.detections(&rois, &logits, &deltas, x.n, (ih, iw))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--anchors 3`: one size a level (torchvision's default, 32·2^l), three anchors a cell;
    /// the RPN head's two 1×1 layers make a third of their outputs, and the FLOP count falls
    /// by exactly those; any other count is refused.
    #[test]
    fn three_anchors_a_cell_is_torchvisions_default() {
        let nine = DetectorConfig::ewa();
        let three = nine.clone().with_anchors(3).unwrap();
        assert_eq!((nine.anchors_per_cell(), three.anchors_per_cell()), (9, 3));
        assert_eq!(three.sizes(2), vec![128.0]);
        assert_eq!(nine.sizes(2).len(), 3);
        let grid: Vec<(usize, usize)> = (0..5).map(|l| (768 >> (l + 2), 1152 >> (l + 2))).collect();
        let cells: usize = grid.iter().map(|(h, w)| h * w).sum();
        let anchors: usize = three.level_anchors(&grid).iter().map(Vec::len).sum();
        assert_eq!(anchors, 3 * cells);
        let fwd = |c: &DetectorConfig| crate::accounting::detector_flops(c, 768, 1152).rpn.forward;
        let fewer = 2.0 * cells as f64 * 256.0 * (5.0 * 9.0 - 5.0 * 3.0);
        assert!(
            (fwd(&nine) - fwd(&three) - fewer).abs() < 1.0,
            "{} {}",
            fwd(&nine) - fwd(&three),
            fewer
        );
        assert!(nine.clone().with_anchors(5).is_err());
        assert_eq!(nine.with_anchors(9).unwrap().scales, 3);
    }
    use crate::detect::testing::{check_params_within, rand};
    use crate::resnet::Version;

    fn tiny() -> DetectorConfig {
        DetectorConfig {
            backbone: Config {
                version: Version::V1_5,
                blocks: [1, 1, 1, 1],
                width: 0.0625,
                classes: 1,
                zero_init_residual: false,
            },
            in_channels: 3,
            fpn_width: 4,
            anchor_base: 8.0,
            scales: 3,
            ratios: vec![0.5, 1.0],
            hidden: 6,
            classes: 2,
            rpn_per_image: 32,
            rpn_train: ProposalRule {
                pre_nms: 40,
                post_nms: 20,
                nms: 0.7,
                min_size: 1e-3,
            },
            rpn_test: ProposalRule {
                pre_nms: 40,
                post_nms: 20,
                nms: 0.7,
                min_size: 1e-3,
            },
            roi_per_image: 16,
            pool: MultiScale { out: 2, samples: 2 },
            score_threshold: 0.0,
            nms: 0.5,
            detections: 10,
        }
    }

    /// The whole detector against finite differences of its total loss (the same sampling
    /// each time): every parameter group — backbone, pyramid, RPN, box head — has its gradient
    /// right, through RoIAlign and the shared RPN head, and the second stage trained.
    #[test]
    fn detector_gradient_check() {
        let mut rng = Rng::new(3);
        let x = rand(2, 32, 48, 3, &mut rng);
        let truth = vec![
            Target {
                boxes: vec![[4.0, 6.0, 20.0, 18.0]],
                classes: vec![1],
            },
            Target {
                boxes: vec![[20.0, 2.0, 44.0, 14.0], [2.0, 16.0, 12.0, 30.0]],
                classes: vec![0, 1],
            },
        ];
        let mut m = Detector::<f64>::new(tiny(), 5);
        // Larger head weights than the initialisation's, so that every path carries gradient.
        for p in m.rpn.params().into_iter().chain(m.head.params()) {
            p.value.iter_mut().for_each(|v| *v = *v * 5.0 + 0.05);
        }
        let (losses, props) = m.step_with(&x, &truth, 11, None, &mut |_| {});
        assert!(losses.regions > 0 && losses.total().is_finite());
        assert!(losses.rpn_box > 0.0 && losses.box_reg > 0.0, "{losses:?}");
        let names: Vec<String> = m.params().iter().map(|p| p.name.clone()).collect();
        // The groups handed over during the backward pass: every parameter once, in
        // backward_order's order.
        let mut handed = Vec::new();
        m.step_with(&x, &truth, 11, Some(&props), &mut |ps| {
            handed.extend(ps.into_iter().map(|p| p.name.clone()))
        });
        let order: Vec<String> = m.backward_order().iter().map(|p| p.name.clone()).collect();
        assert_eq!(handed, order);
        let (mut a, mut b) = (handed.clone(), names.clone());
        a.sort();
        b.sort();
        assert_eq!(a, b);
        for part in ["layer4.0.conv2", "fpn.layer0", "rpn.conv", "box_predictor"] {
            assert!(names.iter().any(|n| n.contains(part)), "{part}");
        }
        // Looser than the parts' own checks (1e-6): max pooling and ReLU kinks over the whole
        // network move central differences by up to ~1e-5 of the value; a wrong connection
        // would be off by its whole size.
        check_params_within(&mut m, Detector::<f64>::params, 37, 1e-4, |m| {
            m.step_with(&x, &truth, 11, Some(&props), &mut |_| {})
                .0
                .total()
        });
    }

    #[test]
    fn detections_are_ranked_per_image_and_capped() {
        let mut m = Detector::<f64>::new(tiny(), 5);
        let x = rand(2, 32, 48, 3, &mut Rng::new(8));
        // A training step first, so that batch norm has running statistics.
        m.train_step(&x, &[Target::default(), Target::default()], 1);
        let d = m.detect(&x);
        assert_eq!(d.len(), 2);
        for (n, dets) in d.iter().enumerate() {
            assert!(dets.len() <= 10);
            assert!(dets.windows(2).all(|w| w[0].score >= w[1].score));
            for det in dets {
                assert_eq!(det.image, n);
                assert!(det.class < 2);
                let b = det.bbox;
                assert!(b[0] >= 0.0 && b[1] >= 0.0 && b[2] <= 48.0 && b[3] <= 32.0);
            }
        }
    }

    /// The paper's model: its parameter count near 41 M, and its FLOPs per image at 768×1152
    /// from each part, the backbone's as the classifier's rule gives at that size.
    #[test]
    fn full_size_parameters_and_flops() {
        let mut m = Detector::<f32>::new(DetectorConfig::ewa(), 1);
        let n = m.parameter_count();
        assert!((40_000_000..42_000_000).contains(&n), "{n}");
        let f = crate::accounting::detector_flops(&m.cfg, 768, 1152);
        // The configuration's count is the built layers': the backbone's convolutions walked
        // through the built model (its shapes, sizes from each convolution's output), the box
        // head's as its layers do.
        let conv = |c: &crate::layers::Conv2d<f32>, (h, w): (usize, usize)| {
            let sh = crate::conv::ConvShape {
                n: 1,
                h,
                w,
                ..c.shape
            };
            (sh.flops(), (sh.oh(), sh.ow()))
        };
        let b = &m.backbone;
        let (stem, (oh, ow)) = conv(&b.stem, (768, 1152));
        let (mut fwd, mut bwd) = (stem, stem);
        let mut size = ((oh + 2 - 3) / 2 + 1, (ow + 2 - 3) / 2 + 1);
        for blk in &b.blocks {
            let (f1, s1) = conv(&blk.conv1, size);
            let (f2, s2) = conv(&blk.conv2, s1);
            let (f3, s3) = conv(&blk.conv3, s2);
            let fd = blk.down.as_ref().map_or(0.0, |(d, _)| conv(d, size).0);
            fwd += f1 + f2 + f3 + fd;
            bwd += 2.0 * (f1 + f2 + f3 + fd);
            size = s3;
        }
        assert_eq!((f.backbone.forward, f.backbone.backward), (fwd, bwd));
        assert_eq!(f.box_head.forward, m.head.flops(512));
        // The backbone alone: ~4.1 G multiply-adds at 224², scaled by the pixels (±10%).
        let r50 = crate::accounting::resnet_flops(&m.backbone, 224, 224).forward * (768.0 * 1152.0)
            / (224.0 * 224.0);
        assert!((f.backbone.forward / r50 - 1.0).abs() < 0.1);
        assert_eq!(m.cfg.level_sizes(768, 1152)[0], (192, 288));
        assert_eq!(m.cfg.level_sizes(768, 1152)[4], (12, 18));
        // The heads: 512 regions of 7·7·256 through 12544→1024→1024→(5, 20).
        let head = 512.0 * (2.0 * (12544.0 * 1024.0 + 1024.0 * 1024.0 + 1024.0 * 25.0) + 2073.0);
        assert_eq!(f.box_head.forward, head);
        assert_eq!(f.roi_align.forward, 512.0 * 49.0 * 256.0 * 33.0);
        let t = f.total();
        assert!(t.forward > f.backbone.forward && t.backward > t.forward);
    }
}
