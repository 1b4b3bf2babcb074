//! The second stage's box head and predictor (torchvision's TwoMLPHead + FastRCNNPredictor):
//! each region's pooled features, flattened, through two fully connected layers of `hidden`
//! units with ReLU, then class logits (the classes and background) and class-specific box
//! deltas (4 per class).

use crate::layers::{relu_backward, Linear, Param};
use crate::tensor::{Float, Tensor};

pub struct BoxHead<T> {
    pub fc6: Linear<T>,
    pub fc7: Linear<T>,
    pub cls: Linear<T>,
    pub reg: Linear<T>,
    h6: Option<Tensor<T>>,
    h7: Option<Tensor<T>>,
}

impl<T: Float> BoxHead<T> {
    /// `features` inputs per region (7·7·C), `hidden` units (1024), `classes` with background.
    pub fn new(
        features: usize,
        hidden: usize,
        classes: usize,
        rng: &mut crate::data::Rng,
    ) -> BoxHead<T> {
        BoxHead {
            fc6: Linear::new("roi_heads.box_head.fc6", features, hidden, rng),
            fc7: Linear::new("roi_heads.box_head.fc7", hidden, hidden, rng),
            cls: Linear::new("roi_heads.box_predictor.cls_score", hidden, classes, rng),
            reg: Linear::new(
                "roi_heads.box_predictor.bbox_pred",
                hidden,
                4 * classes,
                rng,
            ),
            h6: None,
            h7: None,
        }
    }

    /// (class logits R × K, deltas R × 4K) for R regions' flattened features (R × features).
    pub fn forward(&mut self, x: &Tensor<T>) -> (Tensor<T>, Tensor<T>) {
        let relu = |mut t: Tensor<T>| {
            t.data.iter_mut().for_each(|v| *v = v.max(T::zero()));
            t
        };
        let h6 = relu(self.fc6.forward(x));
        let h7 = relu(self.fc7.forward(&h6));
        let out = (self.cls.forward(&h7), self.reg.forward(&h7));
        self.h6 = Some(h6);
        self.h7 = Some(h7);
        out
    }

    /// Parameter gradients from the outputs' gradients; returns the features' gradient.
    pub fn backward(&mut self, dcls: &Tensor<T>, dreg: &Tensor<T>) -> Tensor<T> {
        let (h6, h7) = (
            self.h6.take().expect("backward before forward"),
            self.h7.take().expect("backward before forward"),
        );
        let mut d7 = self.cls.backward(dcls);
        let d7b = self.reg.backward(dreg);
        for (a, b) in d7.data.iter_mut().zip(&d7b.data) {
            *a += *b;
        }
        relu_backward(&h7, &mut d7);
        let mut d6 = self.fc7.backward(&d7);
        relu_backward(&h6, &mut d6);
        self.fc6.backward(&d6)
    }

    pub fn params(&mut self) -> Vec<&mut Param<T>> {
        let mut v = Vec::new();
        for l in [&mut self.fc6, &mut self.fc7, &mut self.cls, &mut self.reg] {
            v.push(&mut l.weight);
            v.push(&mut l.bias);
        }
        v
    }

    /// FLOPs of the forward pass for `regions` (2 per multiply-add, and the biases).
    pub fn flops(&self, regions: usize) -> f64 {
        [&self.fc6, &self.fc7, &self.cls, &self.reg]
            .iter()
            .map(|l| (2 * l.inputs * l.outputs + l.outputs) as f64)
            .sum::<f64>()
            * regions as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Rng;
    use crate::detect::testing::check_params;

    #[test]
    fn head_gradient_check_and_flops() {
        let mut rng = Rng::new(5);
        let (r, f, hidden, k) = (3, 12, 6, 5);
        let x = Tensor::from_vec(r, 1, 1, f, (0..r * f).map(|_| rng.normal()).collect());
        let mut head = BoxHead::<f64>::new(f, hidden, k, &mut Rng::new(9));
        let (c, d) = head.forward(&x);
        assert_eq!((c.c, d.c, c.rows()), (k, 4 * k, r));
        let gc: Vec<f64> = (0..c.len()).map(|_| rng.normal()).collect();
        let gd: Vec<f64> = (0..d.len()).map(|_| rng.normal()).collect();
        let dx = head.backward(
            &Tensor::from_vec(r, 1, 1, k, gc.clone()),
            &Tensor::from_vec(r, 1, 1, 4 * k, gd.clone()),
        );
        let loss = |head: &mut BoxHead<f64>, x: &Tensor<f64>| -> f64 {
            let (c, d) = head.forward(x);
            c.data.iter().zip(&gc).map(|(a, b)| a * b).sum::<f64>()
                + d.data.iter().zip(&gd).map(|(a, b)| a * b).sum::<f64>()
        };
        let h = 1e-6;
        for i in 0..x.len() {
            let (mut up, mut down) = (x.clone(), x.clone());
            up.data[i] += h;
            down.data[i] -= h;
            let fd = (loss(&mut head, &up) - loss(&mut head, &down)) / (2.0 * h);
            assert!(
                (fd - dx.data[i]).abs() < 1e-6 * (1.0 + fd.abs()),
                "x[{i}]: {fd} vs {}",
                dx.data[i]
            );
        }
        check_params(&mut head, BoxHead::<f64>::params, 4, |m| loss(m, &x));
        // 2·(12·6 + 6·6 + 6·5 + 6·20) + (6 + 6 + 5 + 20) per region.
        assert_eq!(
            head.flops(3),
            3.0 * (2.0 * (72.0 + 36.0 + 30.0 + 120.0) + 37.0)
        );
    }
}

/// The second stage's training regions of one image (torchvision's roi_heads sampling): the
/// proposals and the ground-truth boxes themselves, assigned by `Matcher::HEAD` (IoU ≥ 0.5:
/// foreground), `per_image` sampled with at most a quarter foreground. Returns the regions,
/// their labels (0 background, 1 + class) and box targets (coding weights 10, 10, 5, 5; zeros
/// for background).
pub fn sample_regions(
    proposals: &[super::boxes::BBox],
    truth: &[super::boxes::BBox],
    classes: &[usize],
    per_image: usize,
    rng: &mut crate::data::Rng,
) -> (Vec<super::boxes::BBox>, Vec<usize>, Vec<[f64; 4]>) {
    let labels = super::matcher::Matcher::HEAD.assign(&candidates(proposals, truth), truth);
    sample_labelled(proposals, labels, truth, classes, per_image, rng)
}

/// The second stage's candidates of one image: its proposals, then its ground-truth boxes.
pub fn candidates(
    proposals: &[super::boxes::BBox],
    truth: &[super::boxes::BBox],
) -> Vec<super::boxes::BBox> {
    proposals.iter().chain(truth.iter()).copied().collect()
}

/// [`sample_regions`] from its candidates' labels, made elsewhere (on a GPU, by
/// `Matcher::HEAD`'s contract): `labels[i]` is candidate i's ([`candidates`]' order).
pub fn sample_labelled(
    proposals: &[super::boxes::BBox],
    mut labels: Vec<super::matcher::Label>,
    truth: &[super::boxes::BBox],
    classes: &[usize],
    per_image: usize,
    rng: &mut crate::data::Rng,
) -> (Vec<super::boxes::BBox>, Vec<usize>, Vec<[f64; 4]>) {
    use super::matcher::{sample, Label};
    assert_eq!(truth.len(), classes.len(), "one class per box");
    let candidates = candidates(proposals, truth);
    assert_eq!(labels.len(), candidates.len(), "one label per candidate");
    let coder = super::boxes::Coder::new([10.0, 10.0, 5.0, 5.0]);
    sample(&mut labels, per_image, 0.25, rng);
    let (mut regions, mut cls, mut targets) = (Vec::new(), Vec::new(), Vec::new());
    for (b, l) in candidates.iter().zip(&labels) {
        match *l {
            Label::Fg(g) => {
                regions.push(*b);
                cls.push(1 + classes[g]);
                targets.push(coder.encode(b, &truth[g]));
            }
            Label::Bg => {
                regions.push(*b);
                cls.push(0);
                targets.push([0.0; 4]);
            }
            Label::Ignore => {}
        }
    }
    (regions, cls, targets)
}

/// Fast R-CNN's losses for R regions: softmax cross-entropy of the class logits (R × K) against
/// `labels`, averaged; smooth-L1 (β = 1/9) of each foreground region's deltas for its own class
/// against its targets, summed and divided by R. Returns (class loss, box loss, their
/// gradients with respect to the logits and the deltas).
pub fn head_loss<T: Float>(
    logits: &Tensor<T>,
    deltas: &Tensor<T>,
    labels: &[usize],
    targets: &[[f64; 4]],
) -> (f64, f64, Tensor<T>, Tensor<T>) {
    let (cls, dlogits, _, _) = crate::layers::softmax_cross_entropy(logits, labels, 0.0);
    let r = labels.len().max(1) as f64;
    let mut ddeltas = Tensor::zeros(deltas.n, deltas.h, deltas.w, deltas.c);
    let mut reg = 0.0;
    for (i, (&l, t)) in labels.iter().zip(targets).enumerate() {
        if l == 0 {
            continue;
        }
        let at = i * deltas.c + 4 * l;
        let d: Vec<f64> = deltas.data[at..at + 4].iter().map(|v| v.to_f64()).collect();
        let (lr, g) = super::loss::smooth_l1(&d, t, 1.0 / 9.0);
        reg += lr / r;
        for (o, gk) in ddeltas.data[at..at + 4].iter_mut().zip(&g) {
            *o = T::from_f64(gk / r);
        }
    }
    (cls, reg, dlogits, ddeltas)
}

#[cfg(test)]
mod loss_tests {
    use super::*;
    use crate::data::Rng;

    #[test]
    fn regions_include_the_truth_and_cap_the_foreground() {
        let truth = [[10.0, 10.0, 50.0, 50.0]];
        let mut proposals = vec![[12.0, 10.0, 50.0, 50.0]]; // IoU 0.95: foreground
        proposals.extend((0..20).map(|i| [100.0 + i as f64, 100.0, 140.0, 140.0])); // background
        let (regions, labels, targets) =
            sample_regions(&proposals, &truth, &[3], 8, &mut Rng::new(1));
        assert_eq!(regions.len(), 8);
        assert_eq!(
            labels.iter().filter(|&&l| l == 4).count(),
            2,
            "the proposal and the truth itself"
        );
        let i = regions
            .iter()
            .position(|b| *b == truth[0])
            .expect("the truth is a region");
        assert_eq!((labels[i], targets[i]), (4, [0.0; 4]));
        assert!(labels
            .iter()
            .zip(&targets)
            .all(|(&l, t)| l != 0 || *t == [0.0; 4]));
    }

    #[test]
    fn head_loss_gradients_and_a_hand_case() {
        let mut rng = Rng::new(4);
        let (r, k) = (4, 3);
        let logits = Tensor::from_vec(r, 1, 1, k, (0..r * k).map(|_| rng.normal()).collect());
        let deltas = Tensor::from_vec(
            r,
            1,
            1,
            4 * k,
            (0..r * 4 * k).map(|_| 0.2 * rng.normal()).collect(),
        );
        let labels = [0, 2, 1, 0];
        let targets = [
            [0.0; 4],
            [0.1, -0.05, 0.3, 0.0],
            [-0.2, 0.02, 0.0, 0.5],
            [0.0; 4],
        ];
        let (_, _, gl, gd) = head_loss(&logits, &deltas, &labels, &targets);
        let total = |l: &Tensor<f64>, d: &Tensor<f64>| {
            let (a, b, _, _) = head_loss(l, d, &labels, &targets);
            a + b
        };
        let h = 1e-6;
        for i in 0..logits.len() {
            let (mut u, mut d) = (logits.clone(), logits.clone());
            u.data[i] += h;
            d.data[i] -= h;
            let fd = (total(&u, &deltas) - total(&d, &deltas)) / (2.0 * h);
            assert!(
                (fd - gl.data[i]).abs() < 1e-6,
                "logit {i}: {fd} vs {}",
                gl.data[i]
            );
        }
        for i in 0..deltas.len() {
            let (mut u, mut d) = (deltas.clone(), deltas.clone());
            u.data[i] += h;
            d.data[i] -= h;
            let fd = (total(&logits, &u) - total(&logits, &d)) / (2.0 * h);
            assert!(
                (fd - gd.data[i]).abs() < 1e-6,
                "delta {i}: {fd} vs {}",
                gd.data[i]
            );
        }
        // Background rows and the other classes' deltas get no box gradient.
        assert!(gd.data[..12].iter().all(|v| *v == 0.0));
        // Hand case: uniform logits over 3 classes → ln 3; deltas on target → 0.
        let z = Tensor::<f64>::zeros(1, 1, 1, 3);
        let mut d = Tensor::<f64>::zeros(1, 1, 1, 12);
        d.data[4..8].copy_from_slice(&[0.1, 0.2, 0.3, 0.4]);
        let (c, b, _, _) = head_loss(&z, &d, &[1], &[[0.1, 0.2, 0.3, 0.4]]);
        assert!((c - 3f64.ln()).abs() < 1e-12);
        assert_eq!(b, 0.0);
    }
}
