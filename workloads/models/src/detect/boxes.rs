//! Boxes as `[x1, y1, x2, y2]` in pixels (continuous coordinates: a box's width is `x2 − x1`),
//! Faster R-CNN's box coding, clipping, non-maximum suppression and anchors.

/// `[x1, y1, x2, y2]`.
pub type BBox = [f64; 4];

pub fn area(b: &BBox) -> f64 {
    (b[2] - b[0]).max(0.0) * (b[3] - b[1]).max(0.0)
}

/// Intersection over union; 0 for two empty boxes.
pub fn iou(a: &BBox, b: &BBox) -> f64 {
    let w = (a[2].min(b[2]) - a[0].max(b[0])).max(0.0);
    let h = (a[3].min(b[3]) - a[1].max(b[1])).max(0.0);
    let inter = w * h;
    let union = area(a) + area(b) - inter;
    if union > 0.0 {
        inter / union
    } else {
        0.0
    }
}

/// The weights of the box coding: (10, 10, 5, 5) for the second stage, (1, 1, 1, 1) for the
/// region proposal network (torchvision's defaults).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Coder {
    pub weights: [f64; 4],
    /// Largest width/height delta before the exponential (log(1000/16): boxes at most ~62× the
    /// reference).
    pub clamp: f64,
}

impl Coder {
    pub fn new(weights: [f64; 4]) -> Coder {
        Coder {
            weights,
            clamp: (1000.0f64 / 16.0).ln(),
        }
    }

    /// The deltas that move `reference` onto `target`.
    pub fn encode(&self, reference: &BBox, target: &BBox) -> [f64; 4] {
        let (rw, rh) = (reference[2] - reference[0], reference[3] - reference[1]);
        let (rx, ry) = (reference[0] + 0.5 * rw, reference[1] + 0.5 * rh);
        let (tw, th) = (target[2] - target[0], target[3] - target[1]);
        let (tx, ty) = (target[0] + 0.5 * tw, target[1] + 0.5 * th);
        let w = self.weights;
        [
            w[0] * (tx - rx) / rw,
            w[1] * (ty - ry) / rh,
            w[2] * (tw / rw).ln(),
            w[3] * (th / rh).ln(),
        ]
    }

    /// The box that `deltas` make of `reference`.
    pub fn decode(&self, reference: &BBox, deltas: &[f64; 4]) -> BBox {
        let (rw, rh) = (reference[2] - reference[0], reference[3] - reference[1]);
        let (rx, ry) = (reference[0] + 0.5 * rw, reference[1] + 0.5 * rh);
        let w = self.weights;
        let (dx, dy) = (deltas[0] / w[0], deltas[1] / w[1]);
        let dw = (deltas[2] / w[2]).min(self.clamp);
        let dh = (deltas[3] / w[3]).min(self.clamp);
        let (cx, cy) = (rx + dx * rw, ry + dy * rh);
        let (pw, ph) = (rw * dw.exp(), rh * dh.exp());
        [cx - 0.5 * pw, cy - 0.5 * ph, cx + 0.5 * pw, cy + 0.5 * ph]
    }
}

/// `b` clipped to an image of `width` × `height`.
pub fn clip(b: &BBox, width: f64, height: f64) -> BBox {
    [
        b[0].clamp(0.0, width),
        b[1].clamp(0.0, height),
        b[2].clamp(0.0, width),
        b[3].clamp(0.0, height),
    ]
}

/// Greedy non-maximum suppression: indices of the kept boxes, best score first; a box is
/// dropped when its IoU with a kept one exceeds `threshold`. Ties keep the lower index first.
pub fn nms(boxes: &[BBox], scores: &[f64], threshold: f64) -> Vec<usize> {
    let mut order: Vec<usize> = (0..boxes.len()).collect();
    order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut keep: Vec<usize> = Vec::new();
    for i in order {
        if keep.iter().all(|&k| iou(&boxes[k], &boxes[i]) <= threshold) {
            keep.push(i);
        }
    }
    keep
}

/// The indices of the `k` highest `scores`, best first, ties by the lower index: exactly a full
/// sort's first `k`, in O(n + k log k) (a selection on that total order, then a sort of the k
/// selected). A level of the pyramid holds ~500,000 anchors an image, of which 2000 are kept.
pub fn top_k(scores: &[f64], k: usize) -> Vec<usize> {
    let order = |a: &usize, b: &usize| scores[*b].total_cmp(&scores[*a]).then(a.cmp(b));
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    if k == 0 {
        return Vec::new();
    }
    if k < idx.len() {
        idx.select_nth_unstable_by(k - 1, order);
        idx.truncate(k);
    }
    idx.sort_unstable_by(order);
    idx
}

/// Anchors of one feature level: for every cell (row-major), every size × aspect ratio
/// (height / width), centred on the cell's centre `((x + ½)·stride, (y + ½)·stride)`, of area
/// size² (width = size / √ratio, height = size · √ratio).
pub fn anchors(rows: usize, cols: usize, stride: f64, sizes: &[f64], ratios: &[f64]) -> Vec<BBox> {
    AnchorGrid::new(rows, cols, stride, sizes, ratios).anchors()
}

/// One pyramid level's anchors as a grid: `rows × cols` cells `stride` apart, each with anchors
/// of these (width, height) (what [`anchors`] lays out; the GPU makes them from this).
#[derive(Clone, Debug, PartialEq)]
pub struct AnchorGrid {
    pub rows: usize,
    pub cols: usize,
    pub stride: f64,
    pub shapes: Vec<(f64, f64)>,
}

impl AnchorGrid {
    pub fn new(rows: usize, cols: usize, stride: f64, sizes: &[f64], ratios: &[f64]) -> Self {
        AnchorGrid {
            rows,
            cols,
            stride,
            shapes: anchor_shapes(sizes, ratios),
        }
    }

    /// Anchors a cell.
    pub fn per_cell(&self) -> usize {
        self.shapes.len()
    }

    /// Every anchor, cell-major ([`anchors`]' layout).
    pub fn anchors(&self) -> Vec<BBox> {
        let mut out = Vec::with_capacity(self.rows * self.cols * self.shapes.len());
        for y in 0..self.rows {
            for x in 0..self.cols {
                let (cx, cy) = (
                    (x as f64 + 0.5) * self.stride,
                    (y as f64 + 0.5) * self.stride,
                );
                for &(w, h) in &self.shapes {
                    out.push([cx - 0.5 * w, cy - 0.5 * h, cx + 0.5 * w, cy + 0.5 * h]);
                }
            }
        }
        out
    }
}

/// The (width, height) of a cell's anchors, in [`anchors`]' order (sizes, then ratios): what
/// the GPU's proposals (`kernels/cuda/detect.cu`) make the anchors from, with the same
/// arithmetic.
pub fn anchor_shapes(sizes: &[f64], ratios: &[f64]) -> Vec<(f64, f64)> {
    sizes
        .iter()
        .flat_map(|&s| ratios.iter().map(move |&r| (s / r.sqrt(), s * r.sqrt())))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn iou_by_hand() {
        // Two 2×2 squares overlapping in a 1×2 strip: 2 / (4 + 4 − 2) = 1/3.
        assert!((iou(&[0.0, 0.0, 2.0, 2.0], &[1.0, 0.0, 3.0, 2.0]) - 1.0 / 3.0).abs() < 1e-15);
        assert_eq!(iou(&[0.0, 0.0, 1.0, 1.0], &[2.0, 2.0, 3.0, 3.0]), 0.0);
        assert_eq!(iou(&[0.0, 0.0, 1.0, 1.0], &[0.0, 0.0, 1.0, 1.0]), 1.0);
        assert_eq!(iou(&[1.0; 4], &[1.0; 4]), 0.0, "empty boxes");
    }

    #[test]
    fn coding_round_trips_and_matches_hand_values() {
        let c = Coder::new([10.0, 10.0, 5.0, 5.0]);
        let r = [10.0, 20.0, 30.0, 60.0]; // 20 × 40, centre (20, 40)
        let t = [15.0, 20.0, 45.0, 80.0]; // 30 × 60, centre (30, 50)
        let d = c.encode(&r, &t);
        assert!((d[0] - 10.0 * 10.0 / 20.0).abs() < 1e-12);
        assert!((d[1] - 10.0 * 10.0 / 40.0).abs() < 1e-12);
        assert!((d[2] - 5.0 * 1.5f64.ln()).abs() < 1e-12);
        assert!((d[3] - 5.0 * 1.5f64.ln()).abs() < 1e-12);
        let back = c.decode(&r, &d);
        for i in 0..4 {
            assert!((back[i] - t[i]).abs() < 1e-9, "{back:?}");
        }
        // Huge deltas are clamped, not infinite.
        assert!(c
            .decode(&r, &[0.0, 0.0, 1e9, 1e9])
            .iter()
            .all(|v| v.is_finite()));
        assert_eq!(
            clip(&[-5.0, 3.0, 120.0, 70.0], 100.0, 50.0),
            [0.0, 3.0, 100.0, 50.0]
        );
    }

    #[test]
    fn nms_keeps_the_best_of_each_cluster() {
        let b = [
            [0.0, 0.0, 10.0, 10.0],
            [1.0, 1.0, 11.0, 11.0],   // IoU 0.68 with box 0
            [20.0, 20.0, 30.0, 30.0], // apart
            [0.0, 0.0, 10.0, 9.0],    // IoU 0.9 with box 0
        ];
        let s = [0.8, 0.9, 0.5, 0.7];
        assert_eq!(nms(&b, &s, 0.5), vec![1, 2]);
        // A looser threshold keeps box 0 (IoU 0.68 with box 1 < 0.7), not box 3 (0.9 with 0).
        assert_eq!(nms(&b, &s, 0.7), vec![1, 0, 2]);
        assert!(nms(&[], &[], 0.5).is_empty());
    }

    /// The first k of a stable full sort (best first, ties by the lower index), for every k,
    /// with many ties and with NaN.
    #[test]
    fn top_k_is_a_full_sorts_first_k() {
        let mut rng = crate::data::Rng::new(7);
        let mut scores: Vec<f64> = (0..500).map(|_| (rng.normal() * 4.0).round()).collect();
        scores[17] = f64::NAN;
        let mut full: Vec<usize> = (0..scores.len()).collect();
        full.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]));
        for k in [0, 1, 2, 9, 100, 499, 500, 501, 5000] {
            assert_eq!(top_k(&scores, k), full[..k.min(500)], "k = {k}");
        }
        assert!(top_k(&[], 3).is_empty());
    }

    #[test]
    fn anchors_cover_the_grid_with_the_given_areas_and_ratios() {
        let a = anchors(2, 3, 16.0, &[32.0, 64.0, 128.0], &[0.5, 1.0, 2.0]);
        assert_eq!(a.len(), 2 * 3 * 9);
        // The first cell's centre is (8, 8); the 32 × 32 square anchor is its second.
        assert_eq!(a[1], [-8.0, -8.0, 24.0, 24.0]);
        for b in &a {
            let s = [32.0, 64.0, 128.0]
                .iter()
                .any(|s: &f64| (area(b) - s * s).abs() < 1e-9);
            assert!(s, "{b:?}");
        }
        let tall = a[2]; // ratio 2: height = √2 · width
        assert!(((tall[3] - tall[1]) / (tall[2] - tall[0]) - 2.0).abs() < 1e-12);
        // The last cell (row 1, column 2) is centred at (40, 24).
        let last = a[a.len() - 5];
        assert_eq!(
            ((last[0] + last[2]) / 2.0, (last[1] + last[3]) / 2.0),
            (40.0, 24.0)
        );
    }
}
