//! The region proposal network: a head shared by every pyramid level (a 3×3 convolution with
//! ReLU, then 1×1 convolutions to A objectness logits and 4A box deltas per cell, all with
//! biases) and the proposals it makes (deltas decoded onto the anchors, clipped, tiny boxes
//! dropped, the best `pre_nms` of each level kept, non-maximum suppression within each level as
//! torchvision's `batched_nms`, the best `post_nms` of all levels kept).

use super::boxes::{clip, nms, top_k, BBox, Coder};
use crate::conv::{self, ConvShape};
use crate::layers::Param;
use crate::tensor::{Float, Tensor};

/// A convolution whose weights several inputs share (the pyramid's levels): the backward pass
/// takes the input it is for and adds to the weight gradient.
pub struct SharedConv<T> {
    pub weight: Param<T>,
    pub bias: Param<T>,
    /// The filter (n, h, w are set per input).
    pub shape: ConvShape,
}

impl<T: Float> SharedConv<T> {
    pub fn new(
        name: &str,
        c: usize,
        k: usize,
        r: usize,
        rng: &mut crate::data::Rng,
        std: f64,
    ) -> SharedConv<T> {
        let w = (0..r * r * c * k)
            .map(|_| T::from_f64(rng.normal() * std))
            .collect();
        SharedConv {
            weight: Param::new(format!("{name}.weight"), w, true),
            bias: Param::new(format!("{name}.bias"), vec![T::zero(); k], false),
            shape: ConvShape {
                n: 0,
                c,
                h: 0,
                w: 0,
                k,
                r,
                s: r,
                stride: 1,
                pad: r / 2,
            },
        }
    }

    fn shape(&self, x: &Tensor<T>) -> ConvShape {
        crate::layers::shape_for(&self.shape, &self.weight.name, x)
    }

    pub fn forward(&self, x: &Tensor<T>) -> Tensor<T> {
        let sh = self.shape(x);
        let mut y = Tensor::zeros(x.n, sh.oh(), sh.ow(), sh.k);
        conv::forward(&x.data, &self.weight.value, &mut y.data, &sh);
        for row in y.data.chunks_exact_mut(sh.k) {
            for (v, b) in row.iter_mut().zip(&self.bias.value) {
                *v += *b;
            }
        }
        y
    }

    /// Adds this input's share to the gradients; returns the input's gradient.
    pub fn backward(&mut self, x: &Tensor<T>, dy: &Tensor<T>) -> Tensor<T> {
        let sh = self.shape(x);
        let mut dw = vec![T::zero(); self.weight.grad.len()];
        conv::backward_filter(&x.data, &dy.data, &mut dw, &sh);
        for (g, d) in self.weight.grad.iter_mut().zip(dw) {
            *g += d;
        }
        for row in dy.data.chunks_exact(sh.k) {
            for (g, v) in self.bias.grad.iter_mut().zip(row) {
                *g += *v;
            }
        }
        let mut dx = Tensor::zeros(x.n, x.h, x.w, x.c);
        conv::backward_data(&dy.data, &self.weight.value, &mut dx.data, &sh);
        dx
    }

    pub fn zero_grad(&mut self) {
        self.weight.grad.iter_mut().for_each(|g| *g = T::zero());
        self.bias.grad.iter_mut().for_each(|g| *g = T::zero());
    }
}

pub struct RpnHead<T> {
    pub conv: SharedConv<T>,
    pub cls: SharedConv<T>,
    pub reg: SharedConv<T>,
    pub anchors: usize,
    /// Per level: the input and the hidden activation (after ReLU).
    kept: Vec<(Tensor<T>, Tensor<T>)>,
}

impl<T: Float> RpnHead<T> {
    /// torchvision's initialisation: normal(0, 0.01) weights, zero biases.
    pub fn new(width: usize, anchors: usize, rng: &mut crate::data::Rng) -> RpnHead<T> {
        RpnHead {
            conv: SharedConv::new("rpn.conv", width, width, 3, rng, 0.01),
            cls: SharedConv::new("rpn.cls_logits", width, anchors, 1, rng, 0.01),
            reg: SharedConv::new("rpn.bbox_pred", width, 4 * anchors, 1, rng, 0.01),
            anchors,
            kept: Vec::new(),
        }
    }

    /// Per level: (objectness logits n·h·w·A, deltas n·h·w·4A), NHWC (anchor a of a cell is
    /// channel a; its deltas channels 4a..4a+4).
    pub fn forward(&mut self, levels: &[Tensor<T>]) -> Vec<(Tensor<T>, Tensor<T>)> {
        self.kept.clear();
        levels
            .iter()
            .map(|p| {
                let mut h = self.conv.forward(p);
                h.data.iter_mut().for_each(|v| *v = v.max(T::zero()));
                let out = (self.cls.forward(&h), self.reg.forward(&h));
                self.kept.push((p.clone(), h));
                out
            })
            .collect()
    }

    /// Gradients of the head's parameters (over every level) from the outputs' gradients;
    /// returns each level's input gradient.
    pub fn backward(&mut self, grads: &[(Tensor<T>, Tensor<T>)]) -> Vec<Tensor<T>> {
        for c in [&mut self.conv, &mut self.cls, &mut self.reg] {
            c.zero_grad();
        }
        let kept = std::mem::take(&mut self.kept);
        kept.iter()
            .zip(grads)
            .map(|((x, h), (go, gd))| {
                let mut dh = self.cls.backward(h, go);
                let d2 = self.reg.backward(h, gd);
                for ((a, b), v) in dh.data.iter_mut().zip(&d2.data).zip(&h.data) {
                    *a = if *v > T::zero() { *a + *b } else { T::zero() };
                }
                self.conv.backward(x, &dh)
            })
            .collect()
    }

    pub fn params(&mut self) -> Vec<&mut Param<T>> {
        let mut v = Vec::new();
        for c in [&mut self.conv, &mut self.cls, &mut self.reg] {
            v.push(&mut c.weight);
            v.push(&mut c.bias);
        }
        v
    }
}

/// Proposal settings (torchvision's training defaults: 2000 per level, 2000 after NMS at 0.7).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ProposalRule {
    pub pre_nms: usize,
    pub post_nms: usize,
    pub nms: f64,
    pub min_size: f64,
}

/// The proposals of image `n`: (box, objectness logit), best first. `outputs[l]` and
/// `anchors[l]` are level l's head outputs and anchors (cell-major, A per cell, as
/// `boxes::anchors` lays them out); boxes are clipped to `width × height`. Per level: the best
/// `pre_nms` anchors by a selection ([`top_k`], not a sort of the ~500,000), decoded, clipped,
/// tiny boxes dropped, then NMS within the level (a box suppresses only boxes of its own level,
/// as torchvision's `batched_nms` with the level as the category); then every level's kept
/// boxes ranked together by logit (ties: the lower level, then the better rank within it) and
/// the best `post_nms` kept.
pub fn proposals<T: Float>(
    outputs: &[(Tensor<T>, Tensor<T>)],
    anchors: &[Vec<BBox>],
    n: usize,
    width: f64,
    height: f64,
    rule: &ProposalRule,
) -> Vec<(BBox, f64)> {
    let coder = Coder::new([1.0, 1.0, 1.0, 1.0]);
    // (logit, level, rank in the level's NMS order, box)
    let mut kept: Vec<(f64, usize, usize, BBox)> = Vec::new();
    for (level, ((logits, deltas), anc)) in outputs.iter().zip(anchors).enumerate() {
        let per = logits.h * logits.w * logits.c;
        assert_eq!(per, anc.len(), "anchors of a level");
        let base = n * per;
        let scores: Vec<f64> = logits.data[base..base + per]
            .iter()
            .map(|v| v.to_f64())
            .collect();
        let (mut boxes, mut best) = (Vec::new(), Vec::new());
        for i in top_k(&scores, rule.pre_nms) {
            let d = &deltas.data[(base + i) * 4..(base + i) * 4 + 4];
            let b = clip(
                &coder.decode(
                    &anc[i],
                    &[d[0].to_f64(), d[1].to_f64(), d[2].to_f64(), d[3].to_f64()],
                ),
                width,
                height,
            );
            if b[2] - b[0] >= rule.min_size && b[3] - b[1] >= rule.min_size {
                boxes.push(b);
                best.push(scores[i]);
            }
        }
        for (rank, i) in nms(&boxes, &best, rule.nms).into_iter().enumerate() {
            kept.push((best[i], level, rank, boxes[i]));
        }
    }
    kept.sort_unstable_by(|x, y| y.0.total_cmp(&x.0).then(x.1.cmp(&y.1)).then(x.2.cmp(&y.2)));
    kept.into_iter()
        .take(rule.post_nms)
        .map(|(score, _, _, b)| (b, score))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Rng;
    use crate::detect::boxes::anchors;
    use crate::detect::testing::{check_params, rand};

    /// The head over two levels against finite differences: the inputs and every parameter
    /// (weights shared by the levels, so their gradients add).
    #[test]
    fn head_gradient_check() {
        let mut rng = Rng::new(21);
        let levels = vec![rand(2, 4, 5, 3, &mut rng), rand(2, 2, 3, 3, &mut rng)];
        let mut head = RpnHead::<f64>::new(3, 2, &mut Rng::new(4));
        // Larger weights than the 0.01 default, so that the check sees every path.
        for p in head.params() {
            p.value.iter_mut().for_each(|v| *v = *v * 50.0 + 0.1);
        }
        let out = head.forward(&levels);
        let g: Vec<(Tensor<f64>, Tensor<f64>)> = out
            .iter()
            .map(|(o, d)| {
                (
                    rand(o.n, o.h, o.w, o.c, &mut rng),
                    rand(d.n, d.h, d.w, d.c, &mut rng),
                )
            })
            .collect();
        let dx = head.backward(&g);
        let loss = |head: &mut RpnHead<f64>, levels: &[Tensor<f64>]| -> f64 {
            head.forward(levels)
                .iter()
                .zip(&g)
                .map(|((o, d), (go, gd))| {
                    o.data.iter().zip(&go.data).map(|(a, b)| a * b).sum::<f64>()
                        + d.data.iter().zip(&gd.data).map(|(a, b)| a * b).sum::<f64>()
                })
                .sum()
        };
        let h = 1e-6;
        for l in 0..2 {
            for i in (0..levels[l].len()).step_by(5) {
                let (mut up, mut down) = (levels.clone(), levels.clone());
                up[l].data[i] += h;
                down[l].data[i] -= h;
                let fd = (loss(&mut head, &up) - loss(&mut head, &down)) / (2.0 * h);
                assert!(
                    (fd - dx[l].data[i]).abs() < 1e-6 * (1.0 + fd.abs()),
                    "level {l}[{i}]: {fd} vs {}",
                    dx[l].data[i]
                );
            }
        }
        check_params(&mut head, RpnHead::<f64>::params, 3, |m| loss(m, &levels));
    }

    /// With zero deltas the proposals are the anchors: the best-scoring one first, its
    /// overlapping neighbours suppressed, clipped to the image, capped in number.
    #[test]
    fn proposals_are_decoded_ranked_and_suppressed() {
        let (rows, cols) = (2, 3);
        let anc = anchors(rows, cols, 16.0, &[32.0], &[1.0]);
        let mut logits = Tensor::<f64>::zeros(1, rows, cols, 1);
        logits.data = vec![0.1, 0.9, 0.2, 0.3, 0.8, 0.4];
        let deltas = Tensor::<f64>::zeros(1, rows, cols, 4);
        let rule = ProposalRule {
            pre_nms: 10,
            post_nms: 10,
            nms: 0.3,
            min_size: 1.0,
        };
        let p = proposals(
            &[(logits.clone(), deltas.clone())],
            std::slice::from_ref(&anc),
            0,
            48.0,
            32.0,
            &rule,
        );
        // Cell (0, 1) first: its anchor [8, -8, 40, 24] clipped to [8, 0, 40, 24].
        assert_eq!(p[0], ([8.0, 0.0, 40.0, 24.0], 0.9));
        // Anchors of adjacent cells overlap by half: IoU ⅓ > 0.3, so the neighbours go.
        assert!(p.iter().all(|(b, _)| b[0] != 24.0 || b[1] != 0.0), "{p:?}");
        let few = ProposalRule {
            post_nms: 1,
            ..rule
        };
        assert_eq!(
            proposals(&[(logits, deltas)], &[anc], 0, 48.0, 32.0, &few).len(),
            1
        );
    }

    /// Two levels whose anchors coincide: NMS runs within a level (as torchvision's
    /// `batched_nms`), so a box of one level never suppresses the other level's; `pre_nms`
    /// caps each level; the levels' kept boxes are ranked together by logit; the second image
    /// of the batch reads its own logits.
    #[test]
    fn nms_runs_per_level_and_the_levels_are_ranked_together() {
        let anc = anchors(1, 3, 16.0, &[32.0], &[1.0]);
        let level = |scores: [f64; 6]| {
            let mut logits = Tensor::<f64>::zeros(2, 1, 3, 1);
            logits.data = scores.to_vec();
            (logits, Tensor::<f64>::zeros(2, 1, 3, 4))
        };
        let outputs = [
            level([0.9, 0.8, 0.1, 0.0, 0.0, 0.0]),
            level([0.85, 0.2, 0.7, 0.0, 0.5, 0.0]),
        ];
        let both = [anc.clone(), anc.clone()];
        let rule = ProposalRule {
            pre_nms: 2,
            post_nms: 10,
            nms: 0.3,
            min_size: 1.0,
        };
        let p = proposals(&outputs, &both, 0, 48.0, 16.0, &rule);
        let scores: Vec<f64> = p.iter().map(|x| x.1).collect();
        // Level 0: cells 0 and 1 are its best two; cell 1 overlaps cell 0 (IoU ⅓): gone.
        // Level 1: cells 0 and 2 (0.85, 0.7), apart. Cell 0 of level 1 is level 0's cell 0's
        // box, kept all the same.
        assert_eq!(scores, vec![0.9, 0.85, 0.7], "{p:?}");
        assert_eq!(p[0].0, p[1].0, "the same box from two levels");
        // Image 1: level 1's cell 1 alone scores.
        let p = proposals(&outputs, &both, 1, 48.0, 16.0, &rule);
        assert_eq!(p[0].1, 0.5);
    }
}

/// The region proposal network's losses over a batch (torchvision's normalisation): per image,
/// every anchor of every level assigned by `Matcher::RPN` to the image's `truth`, `per_image`
/// of them sampled (at most half foreground, `seed` fixing the draw); the objectness loss is the
/// binary cross-entropy averaged over the sampled anchors of the batch, the box loss the
/// smooth-L1 (β = 1/9) of the foreground anchors' deltas against their encoded targets, summed
/// and divided by the same count. Returns (objectness loss, box loss, the gradients of their
/// sum with respect to each level's outputs).
#[allow(clippy::type_complexity)]
pub fn rpn_loss<T: Float>(
    outputs: &[(Tensor<T>, Tensor<T>)],
    anchors: &[Vec<BBox>],
    truth: &[Vec<BBox>],
    per_image: usize,
    seed: u64,
) -> (f64, f64, Vec<(Tensor<T>, Tensor<T>)>) {
    use super::loss::{bce_with_logits, smooth_l1};
    use super::matcher::{sample, Label, Matcher};
    let coder = Coder::new([1.0, 1.0, 1.0, 1.0]);
    let mut grads: Vec<(Tensor<T>, Tensor<T>)> = outputs
        .iter()
        .map(|(o, d)| {
            (
                Tensor::zeros(o.n, o.h, o.w, o.c),
                Tensor::zeros(d.n, d.h, d.w, d.c),
            )
        })
        .collect();
    let levels: Vec<&[BBox]> = anchors.iter().map(Vec::as_slice).collect();
    let mut rng = crate::data::Rng::new(seed);
    // Per sampled anchor: (level, flat index in the level's outputs, target, box target).
    let mut picked: Vec<(usize, usize, f64, Option<[f64; 4]>)> = Vec::new();
    for (n, t) in truth.iter().enumerate() {
        let mut labels = Matcher::RPN.assign_chunks(&levels, t);
        sample(&mut labels, per_image, 0.5, &mut rng);
        // The labels run over the levels in turn.
        let mut first = 0;
        for (l, anc) in anchors.iter().enumerate() {
            for (i, lab) in labels[first..first + anc.len()].iter().enumerate() {
                let at = n * anc.len() + i;
                match lab {
                    Label::Fg(g) => picked.push((l, at, 1.0, Some(coder.encode(&anc[i], &t[*g])))),
                    Label::Bg => picked.push((l, at, 0.0, None)),
                    Label::Ignore => {}
                }
            }
            first += anc.len();
        }
    }
    let count = picked.len().max(1) as f64;
    let (mut obj, mut reg) = (0.0, 0.0);
    for (l, at, target, boxt) in picked {
        let z = outputs[l].0.data[at].to_f64();
        let (lo, go) = bce_with_logits(&[z], &[target]);
        obj += lo / count;
        grads[l].0.data[at] += T::from_f64(go[0] / count);
        if let Some(bt) = boxt {
            let d: Vec<f64> = outputs[l].1.data[4 * at..4 * at + 4]
                .iter()
                .map(|v| v.to_f64())
                .collect();
            let (lr, gr) = smooth_l1(&d, &bt, 1.0 / 9.0);
            reg += lr / count;
            for (k, g) in gr.iter().enumerate() {
                grads[l].1.data[4 * at + k] += T::from_f64(g / count);
            }
        }
    }
    (obj, reg, grads)
}

#[cfg(test)]
mod loss_tests {
    use super::*;
    use crate::data::Rng;
    use crate::detect::boxes::anchors;

    /// The losses' gradients against finite differences of their sum (the same draw each time),
    /// and a hand case: an anchor exactly on an object, logit 0 and zero deltas.
    #[test]
    fn rpn_loss_gradients_and_a_hand_case() {
        let levels = [(4usize, 4usize, 8.0), (2, 2, 16.0)];
        let anc: Vec<Vec<BBox>> = levels
            .iter()
            .map(|&(r, c, s)| anchors(r, c, s, &[2.0 * s], &[0.5, 1.0, 2.0]))
            .collect();
        let mut rng = Rng::new(6);
        let outputs: Vec<(Tensor<f64>, Tensor<f64>)> = levels
            .iter()
            .map(|&(r, c, _)| {
                let o = (0..2 * r * c * 3).map(|_| rng.normal()).collect();
                let d = (0..2 * r * c * 12).map(|_| 0.3 * rng.normal()).collect();
                (
                    Tensor::from_vec(2, r, c, 3, o),
                    Tensor::from_vec(2, r, c, 12, d),
                )
            })
            .collect();
        let truth = vec![
            vec![[2.0, 3.0, 20.0, 17.0]],
            vec![[10.0, 10.0, 30.0, 30.0], [0.0, 0.0, 8.0, 30.0]],
        ];
        let (obj, reg, g) = rpn_loss(&outputs, &anc, &truth, 16, 3);
        assert!(obj > 0.0 && reg > 0.0);
        let total = |o: &[(Tensor<f64>, Tensor<f64>)]| {
            let (a, b, _) = rpn_loss(o, &anc, &truth, 16, 3);
            a + b
        };
        let h = 1e-6;
        let mut nonzero = 0;
        for l in 0..2 {
            for (which, len) in [(0, outputs[l].0.len()), (1, outputs[l].1.len())] {
                for i in 0..len {
                    let (mut up, mut down) = (outputs.clone(), outputs.clone());
                    let (u, d) = if which == 0 {
                        (&mut up[l].0.data[i], &mut down[l].0.data[i])
                    } else {
                        (&mut up[l].1.data[i], &mut down[l].1.data[i])
                    };
                    *u += h;
                    *d -= h;
                    let fd = (total(&up) - total(&down)) / (2.0 * h);
                    let an = if which == 0 {
                        g[l].0.data[i]
                    } else {
                        g[l].1.data[i]
                    };
                    assert!(
                        (fd - an).abs() < 1e-6,
                        "level {l} output {which}[{i}]: {fd} vs {an}"
                    );
                    nonzero += usize::from(an != 0.0);
                }
            }
        }
        assert!(nonzero > 10);
        // Hand case: one anchor, exactly the object: foreground; logit 0 → ln 2; deltas 0 → 0.
        let one = vec![vec![[0.0, 0.0, 16.0, 16.0]]];
        let out = vec![(
            Tensor::<f64>::zeros(1, 1, 1, 1),
            Tensor::<f64>::zeros(1, 1, 1, 4),
        )];
        let (obj, reg, _) = rpn_loss(&out, &one, &[vec![[0.0, 0.0, 16.0, 16.0]]], 256, 1);
        assert!((obj - 2f64.ln()).abs() < 1e-15);
        assert_eq!(reg, 0.0);
    }
}
