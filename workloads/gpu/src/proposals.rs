//! The RPN's proposals on the GPU (`kernels/cuda/detect.cu`), the twin of
//! [`roofline_models::detect::rpn::proposals`] with the same contract: per image and level the best
//! `pre_nms` anchors (a radix select, ties by the lower index, as `boxes::top_k`), decoded onto
//! anchors made on the device from each level's [`AnchorGrid`], clipped, tiny boxes marked, NMS
//! within the level (suppression bitmasks and a one-warp sweep, as `boxes::nms` decides), then
//! every level's kept boxes ranked together (logit, the lower level, the rank within it) and the
//! best `post_nms` kept. Boxes are f64 with the host's rounding at every step; only `exp` is
//! CUDA's (within 1 ulp). Only the proposals come down, `images × (1 + 5·post_nms)` doubles in
//! one copy (one synchronisation), where the host path needs the RPN's whole outputs. In
//! training the second stage's candidates (each image's proposals, then its boxes) are matched
//! there too (`region_match`, `Matcher::HEAD`), their labels in the same copy.

use super::region_match::{label_stride, match_fits, parse_labels};
use super::*;
use roofline_models::detect::boxes::{AnchorGrid, BBox, Coder};
use roofline_models::detect::matcher::Matcher;
use roofline_models::detect::rpn::ProposalRule;

/// The most anchors a level keeps before NMS on the GPU (`detect.cu`'s MAX_K: the top-k's keys
/// and the sweep's bits are held in shared memory).
pub const MAX_PRE_NMS: usize = 4096;

/// Each image's proposals: (box, objectness logit), best first.
pub type Proposals = Vec<Vec<(BBox, f64)>>;

/// Checks that `outputs` (per level: logits n·h·w·A, deltas n·h·w·4A) fit `grids`; returns
/// (images, anchors a cell). `what` names the caller in the error.
pub(super) fn fit(
    outputs: &[(GTensor, GTensor)],
    grids: &[AnchorGrid],
    what: &str,
) -> Result<(usize, usize), CudaError> {
    let bad = |m: String| Err(CudaError::Check(format!("{what} on the GPU: {m}")));
    if outputs.len() != grids.len() {
        return bad(format!(
            "{} levels of outputs, {} of anchors",
            outputs.len(),
            grids.len()
        ));
    }
    let images = outputs.first().map_or(0, |o| o.0.n);
    let a = grids.first().map_or(0, AnchorGrid::per_cell);
    let mut total = 0usize;
    for (l, ((o, d), g)) in outputs.iter().zip(grids).enumerate() {
        let fits = o.n == images
            && d.n == images
            && (o.h, o.w, d.h, d.w) == (g.rows, g.cols, g.rows, g.cols)
            && g.per_cell() == a
            && o.c == a
            && d.c == 4 * a;
        if !fits {
            return bad(format!(
                "level {l}: logits {}×{}×{}×{}, deltas {}×{}×{}×{}, anchors {}×{}×{} (of {images} images, {a} anchors a cell)",
                o.n, o.h, o.w, o.c, d.n, d.h, d.w, d.c, g.rows, g.cols, g.per_cell()
            ));
        }
        total += o.len() / images.max(1);
    }
    if total >= i32::MAX as usize || images > 65535 {
        return bad(format!("{images} images of {total} anchors"));
    }
    Ok((images, a))
}

/// Checks that `rule` fits the proposal kernels for `levels` levels of `images` images.
fn rule_fits(rule: &ProposalRule, images: usize, levels: usize) -> Result<(), CudaError> {
    if rule.pre_nms > MAX_PRE_NMS {
        return Err(CudaError::Unsupported(format!(
            "the GPU keeps at most {MAX_PRE_NMS} anchors a level before NMS; the rule asks for {}",
            rule.pre_nms
        )));
    }
    let segments = levels * images;
    if rule.pre_nms.div_ceil(64) * segments > 65535 {
        return Err(CudaError::Check(format!(
            "RPN proposals on the GPU: {images} images × {levels} levels is more than one launch holds at {} anchors a level",
            rule.pre_nms
        )));
    }
    if rule.post_nms > i32::MAX as usize / 8 {
        return Err(CudaError::Check(format!(
            "RPN proposals on the GPU: {} proposals an image",
            rule.post_nms
        )));
    }
    Ok(())
}

/// The RPN head's outputs as f32 on the device: one pointer table of the levels' logits and
/// one of their deltas, and the widened copies of 16-bit outputs (alive while the tables are
/// read).
pub(super) struct F32Outputs {
    pub logits: Buf,
    pub deltas: Buf,
    _widened: Vec<GTensor>,
}

/// The levels' anchor grids as the kernels read them: first[l] (the image's anchors before
/// level l, levels + 1 of them), per[l] (level l's anchors an image), cols[l], stride[l], and
/// wh (levels·A (width, height) pairs).
pub(super) struct GridTables {
    pub first: Buf,
    pub per: Buf,
    pub cols: Buf,
    pub stride: Buf,
    pub wh: Buf,
    /// Anchors an image, over every level.
    pub anchors: usize,
}

impl Ctx {
    /// `outputs` as f32 pointer tables (16-bit outputs widened first).
    pub(super) fn f32_outputs(
        &mut self,
        outputs: &[(GTensor, GTensor)],
    ) -> Result<F32Outputs, CudaError> {
        let mut widened = Vec::new();
        let mut ptrs = (Vec::new(), Vec::new());
        for (o, d) in outputs {
            for (t, to) in [(o, &mut ptrs.0), (d, &mut ptrs.1)] {
                if t.dt == Storage::F32 {
                    to.push(t.ptr());
                } else {
                    let w = self.tensor(t.n, t.h, t.w, t.c)?;
                    self.cast_between(t.dt, Storage::F32, t.ptr(), w.ptr(), t.len())?;
                    to.push(w.ptr());
                    widened.push(w);
                }
            }
        }
        Ok(F32Outputs {
            logits: self.upload_buf(&ptrs.0)?,
            deltas: self.upload_buf(&ptrs.1)?,
            _widened: widened,
        })
    }

    /// `grids` uploaded as [`GridTables`].
    pub(super) fn grid_tables(&self, grids: &[AnchorGrid]) -> Result<GridTables, CudaError> {
        let per: Vec<i32> = grids
            .iter()
            .map(|g| (g.rows * g.cols * g.per_cell()) as i32)
            .collect();
        let mut first = vec![0i32];
        for p in &per {
            first.push(first.last().copied().unwrap_or(0) + p);
        }
        let cols: Vec<i32> = grids.iter().map(|g| g.cols as i32).collect();
        let strides: Vec<f64> = grids.iter().map(|g| g.stride).collect();
        let wh: Vec<f64> = grids
            .iter()
            .flat_map(|g| g.shapes.iter().flat_map(|&(w, h)| [w, h]))
            .collect();
        Ok(GridTables {
            anchors: first.last().copied().unwrap_or(0) as usize,
            first: self.upload_buf(&first)?,
            per: self.upload_buf(&per)?,
            cols: self.upload_buf(&cols)?,
            stride: self.upload_buf(&strides)?,
            wh: self.upload_buf(&wh)?,
        })
    }
}

impl Ctx {
    /// Each image's proposals from the RPN head's `outputs` on the device, for anchors on
    /// `grids` and images of `ih × iw`, by `rule` (`rpn::proposals`' contract, checked against
    /// it by `train --workload ewa --device cuda --check`).
    pub fn rpn_proposals(
        &mut self,
        outputs: &[(GTensor, GTensor)],
        grids: &[AnchorGrid],
        rule: &ProposalRule,
        dims: (f64, f64),
    ) -> Result<Proposals, CudaError> {
        Ok(self
            .proposals_and_labels(outputs, grids, rule, dims, None)?
            .0)
    }

    /// [`rpn_proposals`](Self::rpn_proposals), and each image's second-stage candidates (its
    /// proposals, then its boxes `truth`) labelled on the device by `matcher`
    /// (`Matcher::assign`'s contract without best matches: `head::sample_regions`'
    /// assignment), the labels in the proposals' one copy.
    pub fn rpn_proposals_matched(
        &mut self,
        outputs: &[(GTensor, GTensor)],
        grids: &[AnchorGrid],
        rule: &ProposalRule,
        dims: (f64, f64),
        (truth, matcher): (&[Vec<BBox>], Matcher),
    ) -> Result<(Proposals, CandidateLabels), CudaError> {
        let (p, l) =
            self.proposals_and_labels(outputs, grids, rule, dims, Some((truth, matcher)))?;
        Ok((p, l.unwrap_or_default()))
    }

    /// The proposals and, with `matching`, their labels (see the two callers).
    fn proposals_and_labels(
        &mut self,
        outputs: &[(GTensor, GTensor)],
        grids: &[AnchorGrid],
        rule: &ProposalRule,
        (ih, iw): (f64, f64),
        matching: Option<(&[Vec<BBox>], Matcher)>,
    ) -> Result<(Proposals, Option<CandidateLabels>), CudaError> {
        let (images, a) = fit(outputs, grids, "RPN proposals")?;
        rule_fits(rule, images, grids.len())?;
        if let Some((truth, m)) = matching {
            match_fits(truth, m, images)?;
        }
        if images == 0 || grids.is_empty() || rule.pre_nms == 0 || rule.post_nms == 0 {
            // No proposal: each image's candidates are its boxes alone (labelled here: no
            // kernel runs for them).
            let labels = matching.map(|(t, m)| t.iter().map(|t| m.assign(t, t)).collect());
            return Ok((vec![Vec::new(); images], labels));
        }
        let f32_out = self.f32_outputs(outputs)?;
        let tables = self.grid_tables(grids)?;
        let (levels, k) = (grids.len(), rule.pre_nms);
        let (segs, words) = (levels * images, k.div_ceil(64));
        let (logits, deltas) = (&f32_out.logits, &f32_out.deltas);
        let (per_b, cols_b) = (&tables.per, &tables.cols);
        let (stride_b, wh_b) = (&tables.stride, &tables.wh);
        let sel = self.alloc(4 * segs * k)?;
        let boxes = self.alloc(32 * segs * k)?;
        let scores = self.alloc(4 * segs * k)?;
        let valid = self.alloc(4 * segs * k)?;
        let mask = self.alloc(8 * segs * k * words)?;
        let keep = self.alloc(4 * segs * k)?;
        let kept = self.alloc(4 * segs)?;
        let row = 1 + 5 * rule.post_nms;
        // The rows of proposals, then (when matching) each image's labels.
        let stride = label_stride(rule.post_nms, matching);
        let out = self.alloc(8 * images * (row + stride))?;
        let (images_i, levels_i, k_i, a_i) = (images as i32, levels as i32, k as i32, a as i32);
        let post_i = rule.post_nms as i32;
        let clamp = Coder::new([1.0; 4]).clamp;
        let (nms, min_size) = (rule.nms, rule.min_size);
        let b = (
            sel.ptr, boxes.ptr, scores.ptr, valid.ptr, mask.ptr, keep.ptr, kept.ptr, out.ptr,
        );
        // SAFETY (every launch below): the pointer tables hold one f32 buffer a level of
        // images·per[l] logits and 4× as many deltas (checked in `fit`, widened above and
        // alive until the copy at the end); per, cols and stride hold `levels` values, wh
        // levels·A pairs; the scratch buffers hold segs·K slots of their types (mask segs·K·W
        // words, kept segs, out images·row doubles); each kernel's parameters in order and
        // type; grids and blocks as detect.cu says (K ≤ MAX_K, W·segs ≤ 65535, checked).
        unsafe {
            self.launch_grid(
                "rpn_topk",
                (images as u32, levels as u32),
                1024,
                &mut [
                    arg(&logits.ptr),
                    arg(&per_b.ptr),
                    arg(&images_i),
                    arg(&k_i),
                    arg(&b.0),
                ],
            )?;
            self.launch(
                "rpn_decode",
                segs * k,
                &mut [
                    arg(&logits.ptr),
                    arg(&deltas.ptr),
                    arg(&per_b.ptr),
                    arg(&cols_b.ptr),
                    arg(&stride_b.ptr),
                    arg(&wh_b.ptr),
                    arg(&a_i),
                    arg(&b.0),
                    arg(&images_i),
                    arg(&levels_i),
                    arg(&k_i),
                    arg(&clamp),
                    arg(&iw),
                    arg(&ih),
                    arg(&min_size),
                    arg(&b.1),
                    arg(&b.2),
                    arg(&b.3),
                ],
            )?;
            self.launch_grid(
                "nms_mask",
                (words as u32, (words * segs) as u32),
                64,
                &mut [arg(&b.1), arg(&k_i), arg(&nms), arg(&b.4)],
            )?;
            self.launch_grid(
                "nms_sweep",
                (segs as u32, 1),
                32,
                &mut [arg(&b.4), arg(&b.3), arg(&k_i), arg(&b.5), arg(&b.6)],
            )?;
            self.launch(
                "rpn_merge",
                segs * k,
                &mut [
                    arg(&b.1),
                    arg(&b.2),
                    arg(&b.5),
                    arg(&b.6),
                    arg(&images_i),
                    arg(&levels_i),
                    arg(&k_i),
                    arg(&post_i),
                    arg(&b.7),
                ],
            )?;
        }
        let labels_at = out.ptr + 8 * (images * row) as u64;
        if let Some(m) = matching {
            self.match_regions(
                out.ptr,
                (images, row, rule.post_nms),
                m,
                (labels_at, stride),
            )?;
        }
        let host: Vec<f64> = self.get(out.ptr, images * (row + stride))?;
        drop(f32_out);
        let (rows, labels) = host.split_at(images * row);
        let props: Proposals = rows
            .chunks_exact(row)
            .map(|r| {
                let count = (r[0] as usize).min(rule.post_nms);
                r[1..1 + 5 * count]
                    .chunks_exact(5)
                    .map(|p| ([p[0], p[1], p[2], p[3]], p[4]))
                    .collect()
            })
            .collect();
        let labels = matching.map(|(truth, _)| {
            let counts: Vec<usize> = props.iter().map(Vec::len).collect();
            parse_labels(labels, stride, &counts, truth)
        });
        Ok((props, labels))
    }

    /// Launches kernel `name` over `grid` blocks of `block` threads.
    ///
    /// # Safety
    /// As [`Ctx::launch`]; the kernel is written for this grid and block.
    pub(super) unsafe fn launch_grid(
        &mut self,
        name: &'static str,
        grid: (u32, u32),
        block: u32,
        args: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let f = self.function(name)?;
        // SAFETY: the caller's contract.
        unsafe { self.gpu.launch_2d(f, grid, block, args) }
    }
}

/// What [`proposal_mismatch`] may read between the device's proposals and the host's: none
/// missing, none out of order. (A box within an ulp of exp of the NMS threshold could flip a
/// decision; none is expected.)
pub const PROPOSAL_TOLERANCE: f64 = 0.0;

/// How far two sets of each image's proposals disagree: the share of proposals on either side
/// with no partner on the other (the same logit, every coordinate within 1e-9 relative: `exp`
/// is the one function that is not the host's), plus the share of neighbours in `a` out of
/// order (a lower logit before a higher). 0 when they agree.
pub fn proposal_mismatch(a: &Proposals, b: &Proposals) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    let close = |x: &BBox, y: &BBox| {
        x.iter()
            .zip(y)
            .all(|(p, q)| (p - q).abs() <= 1e-9 * p.abs().max(q.abs()).max(1.0))
    };
    let (mut bad, mut total) = (0usize, 0usize);
    for (pa, pb) in a.iter().zip(b) {
        total += pa.len() + pb.len();
        let mut by_score: HashMap<u64, Vec<usize>> = HashMap::new();
        for (i, (_, s)) in pb.iter().enumerate() {
            by_score.entry(s.to_bits()).or_default().push(i);
        }
        let mut used = vec![false; pb.len()];
        for (bx, s) in pa {
            let partner = by_score
                .get(&s.to_bits())
                .and_then(|c| c.iter().find(|&&i| !used[i] && close(bx, &pb[i].0)));
            match partner {
                Some(&i) => used[i] = true,
                None => bad += 1,
            }
        }
        bad += used.iter().filter(|u| !**u).count();
        bad += pa.windows(2).filter(|w| w[0].1 < w[1].1).count();
    }
    bad as f64 / total.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_models::detect::boxes::{clip, iou};

    // detect.cu's algorithms step for step on the host (the threads of a block in turn: the
    // kernels' results do not depend on their order), so that the selection's early exit, the
    // bitonic network's indices, the sweep's words and the merge's counting are checked here
    // against `top_k` and `rpn::proposals`; the GPU check covers the CUDA itself.

    fn order_key(v: f32) -> u32 {
        let b = v.to_bits();
        if b & 0x8000_0000 != 0 {
            !b
        } else {
            b | 0x8000_0000
        }
    }

    fn rank_key(v: f32, i: u32) -> u64 {
        (u64::from(order_key(v)) << 32) | u64::from(u32::MAX - i)
    }

    /// rpn_topk.
    fn topk(z: &[f32], kmax: usize) -> Vec<u32> {
        let n = z.len() as u32;
        let k = (kmax as u32).min(n);
        let (mut prefix, mut mask, mut need, mut done) = (0u64, 0u64, k, k == n);
        for shift in (0..8).rev().map(|p| 8 * p) {
            if done {
                break;
            }
            let mut hist = [0u32; 256];
            for i in 0..n {
                let key = rank_key(z[i as usize], i);
                if key & mask == prefix {
                    hist[((key >> shift) & 255) as usize] += 1;
                }
            }
            let mut above = 0;
            for d in (0..256).rev() {
                let h = hist[d];
                if above + h >= need {
                    prefix |= (d as u64) << shift;
                    mask |= 255u64 << shift;
                    need -= above;
                    done = h == need;
                    break;
                }
                above += h;
            }
        }
        let mut cand: Vec<u64> = (0..n)
            .map(|i| rank_key(z[i as usize], i))
            .filter(|&key| key >= prefix)
            .collect();
        assert_eq!(cand.len() as u32, k, "the selection takes exactly k");
        let p = (k as usize).next_power_of_two().max(1);
        cand.resize(p, 0);
        let mut size = 2;
        while size <= p {
            let mut stride = size / 2;
            while stride > 0 {
                for t in 0..p / 2 {
                    let lo = 2 * t - (t & (stride - 1));
                    let hi = lo + stride;
                    let descending = lo & size == 0;
                    if (cand[lo] < cand[hi]) == descending {
                        cand.swap(lo, hi);
                    }
                }
                stride /= 2;
            }
            size *= 2;
        }
        cand[..k as usize]
            .iter()
            .map(|c| u32::MAX - (*c & 0xFFFF_FFFF) as u32)
            .collect()
    }

    /// nms_mask and nms_sweep over one segment's K slots.
    fn sweep(boxes: &[BBox], valid: &[bool], threshold: f64) -> Vec<usize> {
        let k = boxes.len();
        let w = k.div_ceil(64);
        let mut mask = vec![0u64; k * w];
        for i in 0..k {
            for cb in 0..w {
                if cb < i / 64 {
                    continue;
                }
                for q in 0..(k - 64 * cb).min(64) {
                    let j = 64 * cb + q;
                    // The kernel's IoU is boxes::iou operation for operation; `!(≤)`, as
                    // boxes::nms: a NaN overlap suppresses.
                    let overlap = iou(&boxes[i], &boxes[j]);
                    let suppressed = matches!(
                        overlap.partial_cmp(&threshold),
                        Some(std::cmp::Ordering::Greater) | None
                    );
                    if j > i && suppressed {
                        mask[i * w + cb] |= 1 << q;
                    }
                }
            }
        }
        let mut removed: Vec<u64> = (0..w)
            .map(|wd| {
                (0..64).fold(0u64, |bits, q| {
                    let j = 64 * wd + q;
                    if j >= k || !valid[j] {
                        bits | 1 << q
                    } else {
                        bits
                    }
                })
            })
            .collect();
        let mut keep = Vec::new();
        for i in 0..k {
            if (removed[i >> 6] >> (i & 63)) & 1 == 1 {
                continue;
            }
            keep.push(i);
            for wd in i >> 6..w {
                removed[wd] |= mask[i * w + wd];
            }
        }
        keep
    }

    /// rpn_topk, rpn_decode (the host's Coder and anchors), the sweep and rpn_merge for one
    /// image of `levels` (logits, deltas of the image, anchors).
    fn pipeline(
        levels: &[(Vec<f32>, Vec<f32>, Vec<BBox>)],
        (ih, iw): (f64, f64),
        rule: &ProposalRule,
    ) -> Vec<(BBox, f64)> {
        let coder = Coder::new([1.0; 4]);
        // Per level: (the kept slots' keys, boxes, logits).
        let mut kept: Vec<Vec<(u32, BBox, f32)>> = Vec::new();
        for (z, d, anc) in levels {
            let sel = topk(z, rule.pre_nms);
            let (mut boxes, mut valid) = (Vec::new(), Vec::new());
            for &i in &sel {
                let i = i as usize;
                let dl: Vec<f64> = d[4 * i..4 * i + 4].iter().map(|v| f64::from(*v)).collect();
                let b = clip(
                    &coder.decode(&anc[i], &[dl[0], dl[1], dl[2], dl[3]]),
                    iw,
                    ih,
                );
                valid.push(b[2] - b[0] >= rule.min_size && b[3] - b[1] >= rule.min_size);
                boxes.push(b);
            }
            kept.push(
                sweep(&boxes, &valid, rule.nms)
                    .into_iter()
                    .map(|p| (order_key(z[sel[p] as usize]), boxes[p], z[sel[p] as usize]))
                    .collect(),
            );
        }
        let total: usize = kept.iter().map(Vec::len).sum();
        let mut out = vec![None; total.min(rule.post_nms)];
        for (l, list) in kept.iter().enumerate() {
            for (r, &(key, b, z)) in list.iter().enumerate() {
                let mut pos = r;
                for (l2, other) in kept.iter().enumerate() {
                    if l2 != l {
                        pos +=
                            other.partition_point(|e| if l2 < l { e.0 >= key } else { e.0 > key });
                    }
                }
                if pos < out.len() {
                    assert!(out[pos].is_none(), "two proposals ranked {pos}");
                    out[pos] = Some((b, f64::from(z)));
                }
            }
        }
        out.into_iter()
            .map(|p| p.expect("every rank filled"))
            .collect()
    }

    #[test]
    fn the_selection_is_top_k() {
        let mut rng = roofline_models::data::Rng::new(11);
        for (n, k, spread) in [
            (5000, 300, 2.0),
            (700, 700, 1.0),
            (64, 100, 0.0),
            (3000, 2048, 8.0),
        ] {
            let z: Vec<f32> = (0..n)
                .map(|_| (rng.normal() * spread).round() as f32 / 2.0)
                .collect();
            let wide: Vec<f64> = z.iter().map(|v| f64::from(*v)).collect();
            let want: Vec<u32> = roofline_models::detect::boxes::top_k(&wide, k)
                .into_iter()
                .map(|i| i as u32)
                .collect();
            assert_eq!(topk(&z, k), want, "n {n}, k {k}");
        }
        // Negative zero, infinities: total_cmp's order.
        let z = [0.0, -0.0, f32::INFINITY, -1.0, f32::NEG_INFINITY, 0.0];
        let wide: Vec<f64> = z.iter().map(|v| f64::from(*v)).collect();
        let want: Vec<u32> = roofline_models::detect::boxes::top_k(&wide, 4)
            .into_iter()
            .map(|i| i as u32)
            .collect();
        assert_eq!(topk(&z, 4), want);
    }

    /// The kernels' algorithm over three levels of ties, tiny and clipped boxes, against
    /// `rpn::proposals`.
    #[test]
    fn the_kernels_algorithm_is_rpn_proposals() {
        use roofline_models::detect::boxes::AnchorGrid;
        let mut rng = roofline_models::data::Rng::new(5);
        let (ih, iw) = (64.0, 96.0);
        let grids: Vec<AnchorGrid> = [(16, 24, 4.0), (8, 12, 8.0), (2, 3, 32.0)]
            .iter()
            .map(|&(r, c, st)| AnchorGrid::new(r, c, st, &[2.0 * st], &[0.5, 1.0, 2.0]))
            .collect();
        let a = 3;
        let mut host = Vec::new();
        let mut levels = Vec::new();
        for g in &grids {
            let m = g.rows * g.cols * a;
            let z: Vec<f32> = (0..2 * m)
                .map(|_| (rng.normal() * 3.0).round() as f32)
                .collect();
            let d: Vec<f32> = (0..8 * m).map(|_| rng.normal() as f32).collect();
            levels.push((z[m..].to_vec(), d[4 * m..].to_vec(), g.anchors()));
            host.push((
                Tensor::from_vec(2, g.rows, g.cols, a, z),
                Tensor::from_vec(2, g.rows, g.cols, 4 * a, d),
            ));
        }
        let anc: Vec<Vec<BBox>> = grids.iter().map(AnchorGrid::anchors).collect();
        for rule in [
            ProposalRule {
                pre_nms: 200,
                post_nms: 300,
                nms: 0.7,
                min_size: 1e-3,
            },
            ProposalRule {
                pre_nms: 1000,
                post_nms: 100,
                nms: 0.5,
                min_size: 4.0,
            },
        ] {
            // Image 1 of the batch.
            let want = roofline_models::detect::rpn::proposals(&host, &anc, 1, iw, ih, &rule);
            assert_eq!(pipeline(&levels, (ih, iw), &rule), want, "{rule:?}");
        }
    }

    #[test]
    fn mismatch_counts_the_missing_and_the_out_of_order() {
        let p = |v: &[(f64, f64)]| -> Vec<(BBox, f64)> {
            v.iter()
                .map(|&(x, s)| ([x, 0.0, x + 10.0, 10.0], s))
                .collect()
        };
        let a = vec![p(&[(0.0, 3.0), (5.0, 2.0), (9.0, 2.0)]), p(&[])];
        assert_eq!(proposal_mismatch(&a, &a), 0.0);
        // Ties may come in either order; an ulp of a coordinate is no difference.
        let mut b = vec![p(&[(0.0, 3.0), (9.0, 2.0), (5.0, 2.0)]), p(&[])];
        b[0][1].0[2] = f64::from_bits(b[0][1].0[2].to_bits() + 1);
        assert_eq!(proposal_mismatch(&b, &a), 0.0);
        // One box moved: missing on both sides, 2 of 6.
        let c = vec![p(&[(0.0, 3.0), (5.5, 2.0), (9.0, 2.0)]), p(&[])];
        assert!((proposal_mismatch(&c, &a) - 2.0 / 6.0).abs() < 1e-15);
        // Out of order: 1 of 6; one missing: 1 of 5.
        let d = vec![p(&[(5.0, 2.0), (0.0, 3.0), (9.0, 2.0)]), p(&[])];
        assert!((proposal_mismatch(&d, &a) - 1.0 / 6.0).abs() < 1e-15);
        let e = vec![p(&[(0.0, 3.0), (5.0, 2.0)]), p(&[])];
        assert!((proposal_mismatch(&e, &a) - 1.0 / 5.0).abs() < 1e-15);
        assert_eq!(proposal_mismatch(&a[..1].to_vec(), &a), f64::INFINITY);
    }
}
