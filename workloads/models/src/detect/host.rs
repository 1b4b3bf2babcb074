//! The detector's steps that run on the host whatever device runs the layers: the anchors of
//! every level, the second stage's training regions of a batch (proposals from the RPN's
//! outputs, matched to the ground truth and sampled), and the detections made from the box
//! head's outputs (class probabilities, class-specific boxes, score threshold, per-class NMS).
//! The CPU detector (`model`) and the GPU one (the device trainer) both call these, so that the two
//! differ only in where the layers run.

use super::boxes::{clip, nms, AnchorGrid, BBox, Coder};
use super::head::{sample_labelled, sample_regions};
use super::map::Detection;
use super::matcher::Label;
use super::model::{DetectorConfig, Target};
use super::rpn::proposals;
use crate::data::Rng;
use crate::tensor::{Float, Tensor};

/// One image's sampled regions, their labels and their box targets (`head::sample_regions`).
type Sampled = (Vec<BBox>, Vec<usize>, Vec<[f64; 4]>);

/// The second stage's training regions of a batch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Regions {
    /// (image in the batch, box in pixels).
    pub rois: Vec<(usize, BBox)>,
    /// 0 background, 1 + class.
    pub labels: Vec<usize>,
    /// Box targets (coding weights 10, 10, 5, 5; zeros for background).
    pub targets: Vec<[f64; 4]>,
    /// Each image's proposals (what a finite-difference check holds fixed).
    pub proposals: Vec<Vec<BBox>>,
}

impl DetectorConfig {
    /// Anchors of every level for pyramid maps of these (rows, columns) (nominal strides 4–64).
    pub fn level_anchors(&self, sizes: &[(usize, usize)]) -> Vec<Vec<BBox>> {
        self.level_grids(sizes)
            .iter()
            .map(AnchorGrid::anchors)
            .collect()
    }

    /// The anchor grids of every level for pyramid maps of these (rows, columns): what
    /// [`level_anchors`](Self::level_anchors) lays out, as the GPU makes it.
    pub fn level_grids(&self, sizes: &[(usize, usize)]) -> Vec<AnchorGrid> {
        sizes
            .iter()
            .enumerate()
            .map(|(l, &(h, w))| {
                AnchorGrid::new(h, w, (4usize << l) as f64, &self.sizes(l), &self.ratios)
            })
            .collect()
    }

    /// The training regions of a batch of `ih × iw` images: per image, its proposals (`fixed`,
    /// or made from the RPN's `outputs` by the training rule), then `roi_per_image` regions
    /// sampled among them and the ground truth; `seed` fixes the draw.
    pub fn regions<T: Float>(
        &self,
        outputs: &[(Tensor<T>, Tensor<T>)],
        anchors: &[Vec<BBox>],
        truth: &[Target],
        seed: u64,
        fixed: Option<&[Vec<BBox>]>,
        (ih, iw): (f64, f64),
    ) -> Regions {
        let props = (0..truth.len()).map(|n| match fixed {
            Some(f) => f[n].clone(),
            None => proposals(outputs, anchors, n, iw, ih, &self.rpn_train)
                .into_iter()
                .map(|p| p.0)
                .collect(),
        });
        self.sampled(truth, seed, props, |props, t, rng| {
            sample_regions(props, &t.boxes, &t.classes, self.roi_per_image, rng)
        })
    }

    /// [`regions`](Self::regions) from each image's proposals and the labels of its
    /// candidates (its proposals, then its boxes), matched elsewhere (on a GPU, by
    /// `Matcher::HEAD`'s contract): the same draw from the same labels.
    pub fn regions_labelled(
        &self,
        truth: &[Target],
        seed: u64,
        props: Vec<Vec<BBox>>,
        labels: Vec<Vec<Label>>,
    ) -> Regions {
        assert_eq!(labels.len(), truth.len(), "one list of labels per image");
        let mut labels = labels.into_iter();
        self.sampled(truth, seed, props.into_iter(), |props, t, rng| {
            let l = labels.next().unwrap_or_default();
            sample_labelled(props, l, &t.boxes, &t.classes, self.roi_per_image, rng)
        })
    }

    /// Each image's regions sampled by `sample` from its proposals, in image order with one
    /// draw (`seed`'s).
    fn sampled(
        &self,
        truth: &[Target],
        seed: u64,
        props: impl Iterator<Item = Vec<BBox>>,
        mut sample: impl FnMut(&[BBox], &Target, &mut Rng) -> Sampled,
    ) -> Regions {
        let mut rng = Rng::new(seed ^ 0x005E_C04D);
        let mut r = Regions::default();
        for ((n, t), props) in truth.iter().enumerate().zip(props) {
            let (b, l, tg) = sample(&props, t, &mut rng);
            r.rois.extend(b.into_iter().map(|b| (n, b)));
            r.labels.extend(l);
            r.targets.extend(tg);
            r.proposals.push(props);
        }
        r
    }

    /// The inference regions of a batch of `images` images of `ih × iw`: each image's proposals
    /// by the test rule.
    pub fn test_regions<T: Float>(
        &self,
        outputs: &[(Tensor<T>, Tensor<T>)],
        anchors: &[Vec<BBox>],
        images: usize,
        (ih, iw): (f64, f64),
    ) -> Vec<(usize, BBox)> {
        let mut rois = Vec::new();
        for n in 0..images {
            rois.extend(
                proposals(outputs, anchors, n, iw, ih, &self.rpn_test)
                    .into_iter()
                    .map(|p| (n, p.0)),
            );
        }
        rois
    }

    /// Detections from the box head's outputs for `rois` (logits R × K, deltas R × 4K): per
    /// image, each region's class probabilities, its class-specific box, boxes under the score
    /// threshold dropped, per-class NMS, the best `detections` kept. `image` is the index in
    /// the batch.
    pub fn detections<T: Float>(
        &self,
        rois: &[(usize, BBox)],
        logits: &Tensor<T>,
        deltas: &Tensor<T>,
        images: usize,
        (ih, iw): (f64, f64),
    ) -> Vec<Vec<Detection>> {
        let k = self.classes + 1;
        let coder = Coder::new([10.0, 10.0, 5.0, 5.0]);
        // Per image and class: candidate boxes and scores.
        let mut cand: Vec<Vec<(Vec<BBox>, Vec<f64>)>> =
            vec![vec![(Vec::new(), Vec::new()); self.classes]; images];
        for (i, (n, roi)) in rois.iter().enumerate() {
            let z: Vec<f64> = logits.data[i * k..(i + 1) * k]
                .iter()
                .map(|v| v.to_f64())
                .collect();
            let m = z.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = z.iter().map(|v| (v - m).exp()).collect();
            let sum: f64 = e.iter().sum();
            for cls in 1..k {
                let score = e[cls] / sum;
                if score < self.score_threshold {
                    continue;
                }
                let d = &deltas.data[i * 4 * k + 4 * cls..][..4];
                let b = clip(
                    &coder.decode(
                        roi,
                        &[d[0].to_f64(), d[1].to_f64(), d[2].to_f64(), d[3].to_f64()],
                    ),
                    iw,
                    ih,
                );
                if b[2] - b[0] >= 1e-2 && b[3] - b[1] >= 1e-2 {
                    cand[*n][cls - 1].0.push(b);
                    cand[*n][cls - 1].1.push(score);
                }
            }
        }
        cand.into_iter()
            .enumerate()
            .map(|(n, per_class)| {
                let mut dets: Vec<Detection> = Vec::new();
                for (class, (boxes, scores)) in per_class.into_iter().enumerate() {
                    for i in nms(&boxes, &scores, self.nms) {
                        dets.push(Detection {
                            image: n,
                            class,
                            score: scores[i],
                            bbox: boxes[i],
                        });
                    }
                }
                dets.sort_by(|a, b| b.score.total_cmp(&a.score));
                dets.truncate(self.detections);
                dets
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::detect::head::candidates;
    use crate::detect::matcher::Matcher;

    /// Labels matched elsewhere by `Matcher::HEAD`'s contract (a GPU's) give the regions the
    /// host's own matching gives: the same draw from the same labels; other labels give others.
    #[test]
    fn regions_from_given_labels_are_the_hosts() {
        let mut rng = Rng::new(11);
        let mut random_box = || -> BBox {
            let (x, y) = (rng.uniform(0.0, 200.0), rng.uniform(0.0, 200.0));
            [x, y, x + rng.uniform(4.0, 60.0), y + rng.uniform(4.0, 60.0)]
        };
        let truth: Vec<Target> = [4, 0, 9]
            .iter()
            .map(|&g| Target {
                boxes: (0..g).map(|_| random_box()).collect(),
                classes: (0..g).map(|i| i % 3).collect(),
            })
            .collect();
        let props: Vec<Vec<BBox>> = [900, 40, 0]
            .iter()
            .map(|&p| (0..p).map(|_| random_box()).collect())
            .collect();
        let cfg = DetectorConfig::scaled(0.0625, [1, 1, 1, 1], 64, 96);
        let none: Vec<(Tensor<f32>, Tensor<f32>)> = Vec::new();
        let want = cfg.regions(&none, &[], &truth, 7, Some(&props), (256.0, 256.0));
        let labels: Vec<Vec<Label>> = props
            .iter()
            .zip(&truth)
            .map(|(p, t)| Matcher::HEAD.assign(&candidates(p, &t.boxes), &t.boxes))
            .collect();
        let got = cfg.regions_labelled(&truth, 7, props.clone(), labels.clone());
        assert_eq!(got, want);
        assert!(want.labels.iter().any(|&l| l > 0) && want.labels.contains(&0));
        // Every foreground label turned background: other regions.
        let bg: Vec<Vec<Label>> = labels
            .iter()
            .map(|l| l.iter().map(|_| Label::Bg).collect())
            .collect();
        let other = cfg.regions_labelled(&truth, 7, props, bg);
        assert!(other.labels.iter().all(|&l| l == 0) && other != want);
    }
}
