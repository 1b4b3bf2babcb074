//! The RPN's losses on the GPU (`kernels/cuda/detect.cu`: `anchor_match`, `anchor_best`,
//! `anchor_scan`, `rpn_loss_terms`), the twin of [`roofline_models::detect::rpn::rpn_loss`] with the same
//! contract: every anchor of every level, made on the device from its [`AnchorGrid`], labelled
//! by `Matcher::RPN` (`assign_chunks`' two passes, IoUs in the host's f64 rounding), then
//! `rpn_per_image` of each image's anchors kept by [`draw`] (the host's `Rng` from the device's
//! counts: the same anchors as the CPU keeps), then each kept anchor's cross-entropy and
//! smooth-L1 terms and their gradients, written into zeroed gradient tensors on the device.
//! What crosses the bus: the counts up to the host (two integers an image, one
//! synchronisation), the draw's offsets down (at most `rpn_per_image` an image), and the kept
//! anchors' terms, three doubles each, which the caller reads with the step's last copy and
//! sums in the anchors' order ([`rpn_loss_sums`]). Where the host path copied every level's
//! outputs up and dense gradients back.

use super::proposals::fit;
use super::*;
use roofline_models::data::Rng;
use roofline_models::detect::boxes::{AnchorGrid, BBox};
use roofline_models::detect::matcher::{draw, Matcher, Picks};

/// The most ground-truth boxes an image the device's matching takes (`detect.cu`'s MAX_TRUTH:
/// they and their best overlaps are held in shared memory).
pub const MAX_TRUTH: usize = 256;

/// Threads a block of the matching kernels (`detect.cu`'s MATCH_THREADS), one anchor each.
const THREADS: usize = 1024;

/// The RPN's smooth-L1 β (torchvision's 1/9, as `rpn_loss`).
const BETA: f64 = 1.0 / 9.0;

/// The RPN's losses of a batch on the device.
pub struct RpnLoss {
    /// The gradients of (objectness + box) loss for each level's (logits, deltas), f32, times
    /// the loss scale.
    pub grads: Vec<(GTensor, GTensor)>,
    /// The anchors kept over the batch (the terms written).
    pub kept: usize,
}

impl RpnLoss {
    /// The divisor of every term (the kept anchors, at least 1: `rpn_loss`'s count).
    pub fn count(&self) -> f64 {
        self.kept.max(1) as f64
    }
}

/// The bytes the terms of a batch of `images` images take at most (`per_image` kept anchors an
/// image, three doubles each).
pub fn terms_bytes(images: usize, per_image: usize) -> usize {
    24 * images * per_image
}

/// (objectness loss, box loss) from the first `kept` terms (anchor key, cross-entropy, smooth-L1
/// sum) in any order: sorted by the key (image, then the anchor's place over the levels, as
/// `rpn_loss` visits them), each divided by `count`, summed in that order.
pub fn rpn_loss_sums(terms: &[f64], kept: usize, count: f64) -> (f64, f64) {
    let mut t: Vec<&[f64]> = terms[..3 * kept.min(terms.len() / 3)]
        .chunks_exact(3)
        .collect();
    t.sort_by(|a, b| a[0].total_cmp(&b[0]));
    t.iter().fold((0.0, 0.0), |(obj, reg), v| {
        (obj + v[1] / count, reg + v[2] / count)
    })
}

/// Each image's draw as the kernels read it: `pick` (first, count) of its foreground offsets in
/// `chosen` then of its background's (count −1: all of them), `chosen` the sorted offsets; and
/// the anchors kept. `totals[b]`: image b's foreground anchors (low half) and background (high).
fn draws(totals: &[u64], per_image: usize, seed: u64) -> (Vec<i32>, Vec<u32>, usize) {
    let mut rng = Rng::new(seed);
    let (mut pick, mut chosen, mut kept) = (Vec::new(), Vec::new(), 0);
    for &t in totals {
        let (fg, bg) = ((t & 0xFFFF_FFFF) as usize, (t >> 32) as usize);
        let (pf, pb) = draw(fg, bg, per_image, 0.5, &mut rng);
        kept += pf.kept(fg) + pb.kept(bg);
        for p in [pf, pb] {
            match p {
                Picks::All => pick.extend([chosen.len() as i32, -1]),
                Picks::These(mut v) => {
                    v.sort_unstable();
                    pick.extend([chosen.len() as i32, v.len() as i32]);
                    chosen.extend(v.into_iter().map(|o| o as u32));
                }
            }
        }
    }
    (pick, chosen, kept)
}

impl Ctx {
    /// The RPN's losses of a batch from the head's `outputs` on the device, for anchors on
    /// `grids` and each image's `truth` boxes: `per_image` anchors kept an image, `seed` fixing
    /// the draw, the gradients times `scale`; the kept anchors' terms written at `terms` (room
    /// for [`terms_bytes`]), read after the step by [`rpn_loss_sums`]. Checked against
    /// `rpn_loss` by `train --workload ewa --device cuda --check`.
    #[allow(clippy::too_many_arguments)]
    pub fn rpn_loss(
        &mut self,
        outputs: &[(GTensor, GTensor)],
        grids: &[AnchorGrid],
        truth: &[Vec<BBox>],
        per_image: usize,
        seed: u64,
        scale: f64,
        terms: u64,
    ) -> Result<RpnLoss, CudaError> {
        let (images, a) = fit(outputs, grids, "the RPN's losses")?;
        if truth.len() != images {
            return Err(CudaError::Check(format!(
                "the RPN's losses on the GPU: {} images' boxes for {images} images",
                truth.len()
            )));
        }
        if let Some(t) = truth.iter().find(|t| t.len() > MAX_TRUTH) {
            return Err(CudaError::Unsupported(format!(
                "the GPU matches anchors to at most {MAX_TRUTH} boxes an image; an image has {}",
                t.len()
            )));
        }
        let mut grads = Vec::with_capacity(outputs.len());
        for (o, d) in outputs {
            let (go, gd) = (
                self.tensor(o.n, o.h, o.w, o.c)?,
                self.tensor(d.n, d.h, d.w, d.c)?,
            );
            self.zero(go.ptr(), 4 * go.len())?;
            self.zero(gd.ptr(), 4 * gd.len())?;
            grads.push((go, gd));
        }
        let tables = self.grid_tables(grids)?;
        let n = tables.anchors;
        if images == 0 || n == 0 || per_image == 0 {
            return Ok(RpnLoss { grads, kept: 0 });
        }
        let f32_out = self.f32_outputs(outputs)?;
        let nb = n.div_ceil(THREADS);
        // The boxes (one dummy where there are none: no buffer is empty) and where each
        // image's start.
        let mut flat: Vec<f64> = truth.iter().flatten().flatten().copied().collect();
        let boxes = flat.len() / 4;
        flat.resize(flat.len().max(4), 0.0);
        let mut tstart = vec![0i32];
        for t in truth {
            tstart.push(tstart.last().copied().unwrap_or(0) + t.len() as i32);
        }
        let (truth_b, tstart_b) = (self.upload_buf(&flat)?, self.upload_buf(&tstart)?);
        let label = self.alloc(4 * images * n)?;
        let best = self.alloc(8 * boxes.max(1))?;
        self.zero(best.ptr, 8 * boxes.max(1))?;
        let counts = self.alloc(8 * images * nb)?;
        let offsets = self.alloc(8 * images * nb)?;
        let totals = self.alloc(8 * images)?;
        let m = Matcher::RPN;
        let (levels_i, a_i, nb_i) = (grids.len() as i32, a as i32, nb as i32);
        let allow_best = i32::from(m.allow_best);
        let grid = (nb as u32, images as u32);
        let t = &tables;
        // The parameters the matching kernels and rpn_loss_terms begin with: the anchors'
        // geometry and the boxes.
        let geometry = [
            arg(&t.first.ptr),
            arg(&levels_i),
            arg(&t.cols.ptr),
            arg(&t.stride.ptr),
            arg(&t.wh.ptr),
            arg(&a_i),
            arg(&truth_b.ptr),
            arg(&tstart_b.ptr),
        ];
        let with_geometry = |rest: &[*mut c_void]| -> Vec<*mut c_void> {
            geometry.iter().chain(rest).copied().collect()
        };
        // SAFETY (every launch below): first holds levels + 1 counts (its last, n, the anchors
        // an image), cols and stride `levels` values, wh levels·A pairs; truth tstart[images]
        // boxes (at least one) and tstart images + 1 starts, each image's at most MAX_TRUTH
        // (checked); label images·n ints, best a slot per box, counts and offsets images·nb,
        // totals images; the pointer tables one f32 buffer a level of images·per[l] logits
        // (4× as many deltas and gradients: `fit` checked the shapes); each kernel's parameters
        // in order and type; grid (nb, images) of 1024 threads as detect.cu says.
        unsafe {
            self.launch_grid(
                "anchor_match",
                grid,
                THREADS as u32,
                &mut with_geometry(&[arg(&m.high), arg(&m.low), arg(&label.ptr), arg(&best.ptr)]),
            )?;
            self.launch_grid(
                "anchor_best",
                grid,
                THREADS as u32,
                &mut with_geometry(&[
                    arg(&allow_best),
                    arg(&best.ptr),
                    arg(&label.ptr),
                    arg(&counts.ptr),
                ]),
            )?;
            self.launch_grid(
                "anchor_scan",
                (images as u32, 1),
                THREADS as u32,
                &mut [
                    arg(&counts.ptr),
                    arg(&nb_i),
                    arg(&offsets.ptr),
                    arg(&totals.ptr),
                ],
            )?;
        }
        // The one synchronisation: the counts the host draws from.
        let tot: Vec<u64> = self.get(totals.ptr, images)?;
        let (pick, mut chosen, kept) = draws(&tot, per_image, seed);
        chosen.resize(chosen.len().max(1), 0);
        let (pick_b, chosen_b) = (self.upload_buf(&pick)?, self.upload_buf(&chosen)?);
        let dl: Vec<u64> = grads.iter().map(|g| g.0.ptr()).collect();
        let dd: Vec<u64> = grads.iter().map(|g| g.1.ptr()).collect();
        let (dl_b, dd_b) = (self.upload_buf(&dl)?, self.upload_buf(&dd)?);
        let slots = self.alloc(4)?;
        self.zero(slots.ptr, 4)?;
        let count = kept.max(1) as f64;
        let scale_f = scale as f32;
        // SAFETY: as above; pick holds 4·images ints whose (first, count) lie in chosen (at
        // least one value); the gradient tables the shapes of the outputs; terms room for
        // [`terms_bytes`] (the caller's), of which `kept` ≤ images·per_image triples are
        // written (the draw keeps at most per_image an image).
        unsafe {
            self.launch_grid(
                "rpn_loss_terms",
                grid,
                THREADS as u32,
                &mut with_geometry(&[
                    arg(&label.ptr),
                    arg(&offsets.ptr),
                    arg(&pick_b.ptr),
                    arg(&chosen_b.ptr),
                    arg(&f32_out.logits.ptr),
                    arg(&f32_out.deltas.ptr),
                    arg(&count),
                    arg(&scale_f),
                    arg(&BETA),
                    arg(&dl_b.ptr),
                    arg(&dd_b.ptr),
                    arg(&slots.ptr),
                    arg(&terms),
                ]),
            )?;
        }
        Ok(RpnLoss { grads, kept })
    }
}

#[cfg(test)]
mod tests {
    //! The kernels' algorithm run step for step on the host (blocks of a few anchors, the
    //! packed counts, their scan, the draw from the totals, the ordinals, the terms in a
    //! scrambled order) against `rpn_loss`: the same anchors kept, bit for bit the same losses
    //! and gradients. This checks the algorithm and its shared draw, not the CUDA.
    use super::*;
    use roofline_models::detect::boxes::{iou, Coder};
    use roofline_models::detect::loss::{bce_with_logits, smooth_l1};
    use roofline_models::detect::rpn::rpn_loss;
    use roofline_models::tensor::Tensor;

    type Outputs = Vec<(Tensor<f32>, Tensor<f32>)>;

    /// The four kernels, in `block`-anchor blocks.
    fn model(
        outputs: &Outputs,
        grids: &[AnchorGrid],
        truth: &[Vec<BBox>],
        per_image: usize,
        seed: u64,
        block: usize,
    ) -> (f64, f64, Outputs) {
        let anc: Vec<BBox> = grids.iter().flat_map(|g| g.anchors()).collect();
        let per: Vec<usize> = grids.iter().map(|g| g.anchors().len()).collect();
        let first: Vec<usize> = per
            .iter()
            .scan(0, |s, p| {
                let f = *s;
                *s += p;
                Some(f)
            })
            .collect();
        let n = anc.len();
        let nb = n.div_ceil(block);
        let m = Matcher::RPN;
        let mut labels = vec![vec![-2i64; n]; truth.len()];
        let mut offsets = vec![vec![0u64; nb]; truth.len()];
        let mut totals = Vec::new();
        for (b, t) in truth.iter().enumerate() {
            // anchor_match: labels and each box's best (blocks' maxima, then the maximum).
            let mut best = vec![0u64; t.len()];
            for blk in 0..nb {
                let mut top_s = vec![0u64; t.len()];
                for a in blk * block..((blk + 1) * block).min(n) {
                    let (mut jb, mut top) = (0, f64::NEG_INFINITY);
                    for (j, gt) in t.iter().enumerate() {
                        let v = iou(&anc[a], gt);
                        if v > top {
                            (jb, top) = (j, v);
                        }
                        if v > 0.0 {
                            top_s[j] = top_s[j].max(v.to_bits());
                        }
                    }
                    labels[b][a] = if t.is_empty() || top < m.low {
                        -1
                    } else if top >= m.high {
                        jb as i64
                    } else {
                        -2
                    };
                }
                for (g, s) in best.iter_mut().zip(top_s) {
                    *g = (*g).max(s);
                }
            }
            // anchor_best and its counts; anchor_scan.
            let mut counts = vec![0u64; nb];
            for (a, lab) in labels[b].iter_mut().enumerate() {
                for j in (0..t.len()).rev() {
                    let bj = f64::from_bits(best[j]);
                    if bj > 0.0 && iou(&anc[a], &t[j]) == bj {
                        *lab = j as i64;
                        break;
                    }
                }
                counts[a / block] += match *lab {
                    l if l >= 0 => 1,
                    -1 => 1 << 32,
                    _ => 0,
                };
            }
            let mut carry = 0;
            for (o, c) in offsets[b].iter_mut().zip(&counts) {
                *o = carry;
                carry += c;
            }
            totals.push(carry);
        }
        let (pick, chosen, kept) = draws(&totals, per_image, seed);
        let count = kept.max(1) as f64;
        let coder = Coder::new([1.0; 4]);
        let mut grads: Outputs = outputs
            .iter()
            .map(|(o, d)| {
                (
                    Tensor::zeros(o.n, o.h, o.w, o.c),
                    Tensor::zeros(d.n, d.h, d.w, d.c),
                )
            })
            .collect();
        let mut terms = Vec::new();
        // rpn_loss_terms, its blocks in reverse (the slots' order is not the anchors').
        for b in (0..truth.len()).rev() {
            for blk in (0..nb).rev() {
                let mut prefix = 0u64;
                for a in blk * block..((blk + 1) * block).min(n) {
                    let lab = labels[b][a];
                    let mine: u64 = match lab {
                        l if l >= 0 => 1,
                        -1 => 1 << 32,
                        _ => 0,
                    };
                    let ord = offsets[b][blk] + prefix;
                    prefix += mine;
                    if mine == 0 {
                        continue;
                    }
                    let fg = lab >= 0;
                    let o = if fg { ord & 0xFFFF_FFFF } else { ord >> 32 } as u32;
                    let p = &pick[4 * b + if fg { 0 } else { 2 }..][..2];
                    let set = &chosen[p[0] as usize..][..p[1].max(0) as usize];
                    if p[1] >= 0 && set.binary_search(&o).is_err() {
                        continue;
                    }
                    let l = first.iter().rposition(|&f| a >= f).unwrap();
                    let at = b * per[l] + a - first[l];
                    let z = outputs[l].0.data[at] as f64;
                    let (lo, go) = bce_with_logits(&[z], &[if fg { 1.0 } else { 0.0 }]);
                    grads[l].0.data[at] = (go[0] / count) as f32;
                    let mut lr = 0.0;
                    if fg {
                        let e = coder.encode(&anc[a], &truth[b][lab as usize]);
                        let d: Vec<f64> = outputs[l].1.data[4 * at..4 * at + 4]
                            .iter()
                            .map(|&v| v as f64)
                            .collect();
                        let (s, g) = smooth_l1(&d, &e, BETA);
                        lr = s;
                        for (q, gq) in g.iter().enumerate() {
                            grads[l].1.data[4 * at + q] = (gq / count) as f32;
                        }
                    }
                    terms.extend([(b * n + a) as f64, lo, lr]);
                }
            }
        }
        assert_eq!(terms.len(), 3 * kept);
        let (obj, reg) = rpn_loss_sums(&terms, kept, count);
        (obj, reg, grads)
    }

    fn case(seed: u64) -> (Outputs, Vec<AnchorGrid>) {
        let mut rng = Rng::new(seed);
        let grids = vec![
            AnchorGrid::new(6, 8, 8.0, &[16.0, 24.0], &[0.5, 1.0, 2.0]),
            AnchorGrid::new(3, 4, 16.0, &[32.0, 48.0], &[0.5, 1.0, 2.0]),
            AnchorGrid::new(2, 2, 32.0, &[64.0, 96.0], &[0.5, 1.0, 2.0]),
        ];
        let outputs = grids
            .iter()
            .map(|g| {
                let k = g.rows * g.cols * g.per_cell();
                let o = (0..3 * k).map(|_| rng.normal() as f32).collect();
                let d = (0..3 * k * 4).map(|_| 0.3 * rng.normal() as f32).collect();
                (
                    Tensor::from_vec(3, g.rows, g.cols, g.per_cell(), o),
                    Tensor::from_vec(3, g.rows, g.cols, 4 * g.per_cell(), d),
                )
            })
            .collect();
        (outputs, grids)
    }

    #[test]
    fn the_kernels_algorithm_is_rpn_loss() {
        let (outputs, grids) = case(5);
        let anc: Vec<Vec<BBox>> = grids.iter().map(AnchorGrid::anchors).collect();
        // An image with two boxes, one with many (more foreground than half the draw), one
        // without any (all background).
        let many: Vec<BBox> = (0..12)
            .map(|i| {
                let x = 4.0 + 5.0 * i as f64;
                [x, 2.0 + 2.0 * i as f64, x + 14.0, 20.0 + 2.0 * i as f64]
            })
            .collect();
        let truth = vec![
            vec![[2.0, 3.0, 20.0, 17.0], [10.0, 10.0, 50.0, 40.0]],
            many,
            vec![],
        ];
        for (per_image, seed, block) in [(16, 3, 64), (256, 9, 32), (40, 1, 1024), (8, 2, 7)] {
            let (obj, reg, g) = rpn_loss(&outputs, &anc, &truth, per_image, seed);
            let (mo, mr, mg) = model(&outputs, &grids, &truth, per_image, seed, block);
            assert_eq!((mo, mr), (obj, reg), "per_image {per_image}, block {block}");
            assert!(obj > 0.0 && reg > 0.0);
            for (l, ((a, b), (c, d))) in mg.iter().zip(&g).enumerate() {
                assert_eq!(a.data, c.data, "level {l}'s logit gradients");
                assert_eq!(b.data, d.data, "level {l}'s delta gradients");
            }
        }
    }

    /// The sums read the terms in any order, divide each by the count, and add them in the
    /// anchors' order; `kept` bounds what is read.
    #[test]
    fn the_sums_follow_the_anchors_order() {
        let terms = [
            5.0, 0.5, 0.0, 1.0, 0.25, 1.0, 3.0, 1e-17, 2.0, 9.0, 7.0, 7.0,
        ];
        let (obj, reg) = rpn_loss_sums(&terms, 3, 2.0);
        assert_eq!(obj, 0.25 / 2.0 + 1e-17 / 2.0 + 0.5 / 2.0);
        assert_eq!(reg, 1.0 / 2.0 + 2.0 / 2.0);
        assert_eq!(rpn_loss_sums(&terms, 0, 1.0), (0.0, 0.0));
    }

    /// The draw's table: `all` as −1, offsets sorted, the kept anchors counted.
    #[test]
    fn the_draws_table() {
        // Image 0: 3 foreground, 100 background; image 1: 500 foreground, 2 background.
        let totals = [3 | (100u64 << 32), 500 | (2u64 << 32)];
        let (pick, chosen, kept) = draws(&totals, 16, 4);
        assert_eq!(&pick[..2], &[0, -1]);
        assert_eq!(pick[3], 13, "background fills the rest of 16");
        assert_eq!(pick[5], 8, "half of 16 at most foreground");
        assert_eq!(&pick[6..], &[21, -1]);
        assert_eq!(kept, 16 + 8 + 2);
        assert_eq!(chosen.len(), 21);
        for (f, c) in [(pick[2], pick[3]), (pick[4], pick[5])] {
            let s = &chosen[f as usize..(f + c) as usize];
            assert!(s.windows(2).all(|w| w[0] < w[1]), "{s:?}");
        }
    }
}
