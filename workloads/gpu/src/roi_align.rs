//! The detector's multi-scale RoIAlign on the GPU (`kernels/cuda/roi_align.cu`), the GPU layer
//! of [`roofline_models::detect::roi_align::MultiScale`]: the host builds a plan of the regions (level,
//! image, the first sample's corner and the bin sizes in that level's cells) and, per level, the
//! regions of each image and of each tile of [`TILE`] × [`TILE`] cells; the forward kernel
//! pools, the backward kernel gathers each feature element's gradient from the regions of its
//! tile that touch it, atomics-free, so the result is the same bits on every run, and its cost
//! follows the regions' overlap with the maps, not the elements times the regions.

use super::*;
use roofline_models::detect::boxes::BBox;
use roofline_models::detect::roi_align::{fpn_level, MultiScale};

/// Floats per region in the plan: level, image, y1, x1, bin height, bin width.
const PER_ROI: usize = 6;

/// The side, in cells, of the tiles whose regions the backward kernel visits.
pub const TILE: usize = 8;

/// The regions as the kernels read them.
#[derive(Clone, Debug, PartialEq)]
pub struct RoiPlan {
    pub out: usize,
    pub samples: usize,
    pub rois: usize,
    pub images: usize,
    /// `PER_ROI` floats per region.
    pub plan: Vec<f32>,
    /// Per level (P2–P5): the regions of image b are `list[start[b] .. start[b + 1]]`.
    pub start: [Vec<i32>; 4],
    pub list: [Vec<i32>; 4],
}

impl RoiPlan {
    /// The plan of `rois` (image index, box in image pixels) over `images` images, as
    /// [`MultiScale`] pools them: each from the level `fpn_level` gives it (k0 = 4, P2–P5).
    pub fn new(ms: &MultiScale, rois: &[(usize, BBox)], images: usize) -> RoiPlan {
        let mut plan = Vec::with_capacity(PER_ROI * rois.len());
        let mut per: [Vec<Vec<i32>>; 4] = std::array::from_fn(|_| vec![Vec::new(); images]);
        for (r, (img, roi)) in rois.iter().enumerate() {
            let l = (fpn_level(roi, 4, 2, 5) - 2) as usize;
            let scale = 1.0 / (4usize << l) as f64;
            // The CPU's geometry (`RoiAlign::cells`), in f64, then stored as f32.
            let (x1, y1) = (roi[0] * scale - 0.5, roi[1] * scale - 0.5);
            let (x2, y2) = (roi[2] * scale - 0.5, roi[3] * scale - 0.5);
            let (bh, bw) = ((y2 - y1) / ms.out as f64, (x2 - x1) / ms.out as f64);
            plan.extend([
                l as f32,
                *img as f32,
                y1 as f32,
                x1 as f32,
                bh as f32,
                bw as f32,
            ]);
            if *img < images {
                per[l][*img].push(r as i32);
            }
        }
        let mut start: [Vec<i32>; 4] = Default::default();
        let mut list: [Vec<i32>; 4] = Default::default();
        for l in 0..4 {
            start[l].push(0);
            for b in &per[l] {
                list[l].extend(b);
                start[l].push(list[l].len() as i32);
            }
        }
        RoiPlan {
            out: ms.out,
            samples: ms.samples,
            rois: rois.len(),
            images,
            plan,
            start,
            list,
        }
    }

    /// The cells of an `n`-cell axis that region `r`'s samples may touch along it (`y` or not
    /// `x`): the kernel's bounds test widened by a cell each way, clamped to the map; every
    /// cell when the geometry is not finite.
    fn footprint(&self, r: usize, y: bool, n: usize) -> (usize, usize) {
        let g = &self.plan[PER_ROI * r..PER_ROI * (r + 1)];
        let (start, bin) = if y { (g[2], g[4]) } else { (g[3], g[5]) };
        let ts = self.out * self.samples;
        let s = self.samples as f64;
        let at = |t: usize| {
            start as f64
                + (t / self.samples) as f64 * bin as f64
                + ((t % self.samples) as f64 + 0.5) * bin as f64 / s
        };
        let (a, b) = (at(0), at(ts - 1));
        if !(a.is_finite() && b.is_finite()) {
            return (0, n - 1);
        }
        let lo = a.min(b).max(0.0).floor() - 1.0;
        let hi = a.max(b).max(0.0).floor() + 2.0;
        let clamp = |v: f64| v.clamp(0.0, (n - 1) as f64) as usize;
        (clamp(lo), clamp(hi))
    }

    /// Level `l`'s (maps of `h × w` cells) regions by tile of [`TILE`] cells: the regions that
    /// may touch tile k (image-major, then row-major, ceil(h / TILE) × ceil(w / TILE) an
    /// image) are `list[start[k] .. start[k + 1]]`, in plan order.
    pub fn tiles(&self, l: usize, h: usize, w: usize) -> (Vec<i32>, Vec<i32>) {
        let (th, tw) = (h.div_ceil(TILE), w.div_ceil(TILE));
        let mut per: Vec<Vec<i32>> = vec![Vec::new(); self.images * th * tw];
        for b in 0..self.images {
            let (lo, hi) = (self.start[l][b] as usize, self.start[l][b + 1] as usize);
            for &r in &self.list[l][lo..hi] {
                let (y0, y1) = self.footprint(r as usize, true, h);
                let (x0, x1) = self.footprint(r as usize, false, w);
                for ty in y0 / TILE..=y1 / TILE {
                    for tx in x0 / TILE..=x1 / TILE {
                        per[(b * th + ty) * tw + tx].push(r);
                    }
                }
            }
        }
        let mut start = Vec::with_capacity(per.len() + 1);
        start.push(0);
        let mut list = Vec::new();
        for t in per {
            list.extend(t);
            start.push(list.len() as i32);
        }
        (start, list)
    }
}

/// The plan on the device, kept for the backward pass.
pub struct DevPlan {
    plan: Buf,
    hw: Buf,
    /// Per level, [`RoiPlan::tiles`]'s segments.
    start: Vec<Buf>,
    list: Vec<Buf>,
    pub host: RoiPlan,
    /// (h, w) of P2–P5.
    dims: [(usize, usize); 4],
    c: usize,
}

impl Ctx {
    /// The regions of `plan` over maps P2–P5 (each `images × h × w × c`) on the device.
    pub fn roi_plan(&self, plan: RoiPlan, maps: [&GTensor; 4]) -> Result<DevPlan, CudaError> {
        let c = maps[0].c;
        for m in maps {
            if m.n != plan.images || m.c != c {
                return Err(CudaError::Check(format!(
                    "RoIAlign maps of {}×{}×{}×{}, the plan has {} images of {c} channels",
                    m.n, m.h, m.w, m.c, plan.images
                )));
            }
        }
        let dims = maps.map(|m| (m.h, m.w));
        let hw: Vec<i32> = dims
            .iter()
            .flat_map(|&(h, w)| [h as i32, w as i32])
            .collect();
        let mut start = Vec::with_capacity(4);
        let mut list = Vec::with_capacity(4);
        for (l, &(h, w)) in dims.iter().enumerate() {
            let (s, k) = plan.tiles(l, h, w);
            start.push(self.upload_buf(&s)?);
            list.push(self.upload_buf(&k)?);
        }
        Ok(DevPlan {
            plan: self.upload_buf(&plan.plan)?,
            hw: self.upload_buf(&hw)?,
            start,
            list,
            host: plan,
            dims,
            c,
        })
    }

    /// `rois × out × out × c` pooled features from P2–P5.
    pub fn roi_align_forward(
        &mut self,
        maps: [&GTensor; 4],
        p: &DevPlan,
    ) -> Result<GTensor, CudaError> {
        let (out, s) = (p.host.out, p.host.samples);
        let y = self.tensor(p.host.rois, out, out, p.c)?;
        let (rois, out_i, s_i, c_i) = (p.host.rois as i32, out as i32, s as i32, p.c as i32);
        let ptrs = maps.map(|m| m.ptr());
        let yp = y.ptr();
        // SAFETY: roi_align_forward(p2, p3, p4, p5, hw, plan, rois, out, samples, c, y): the
        // maps are the plan's (checked in `roi_plan`), y holds rois·out²·c floats; every buffer
        // outlives the kernel (stream-ordered frees).
        unsafe {
            self.launch(
                "roi_align_forward",
                y.len(),
                &mut [
                    arg(&ptrs[0]),
                    arg(&ptrs[1]),
                    arg(&ptrs[2]),
                    arg(&ptrs[3]),
                    arg(&p.hw.ptr),
                    arg(&p.plan.ptr),
                    arg(&rois),
                    arg(&out_i),
                    arg(&s_i),
                    arg(&c_i),
                    arg(&yp),
                ],
            )?;
        }
        Ok(y)
    }

    /// The gradients of P2–P5 from the pooled features' `dy` (each map's shape; regions get
    /// none, as on the CPU).
    pub fn roi_align_backward(
        &mut self,
        dy: &GTensor,
        p: &DevPlan,
    ) -> Result<Vec<GTensor>, CudaError> {
        let (out, s) = (p.host.out as i32, p.host.samples as i32);
        if dy.len() != p.host.rois * p.host.out * p.host.out * p.c {
            return Err(CudaError::Check(format!(
                "RoIAlign backward: dy holds {} values, the plan {} regions",
                dy.len(),
                p.host.rois
            )));
        }
        let mut grads = Vec::with_capacity(4);
        for (l, &(h, w)) in p.dims.iter().enumerate() {
            let dx = self.tensor(p.host.images, h, w, p.c)?;
            let (n_i, h_i, w_i, c_i) = (p.host.images as i32, h as i32, w as i32, p.c as i32);
            let tile = TILE as i32;
            let (dxp, dyp) = (dx.ptr(), dy.ptr());
            // SAFETY: roi_align_backward(dx, n, h, w, c, tile, start, list, plan, dy, out,
            // samples): dx holds n·h·w·c floats, start one more than the level's tiles of
            // `tile` cells (`RoiPlan::tiles` for these h, w) and list their regions (indices
            // below rois), dy rois·out²·c; all outlive the kernel.
            unsafe {
                self.launch(
                    "roi_align_backward",
                    dx.len(),
                    &mut [
                        arg(&dxp),
                        arg(&n_i),
                        arg(&h_i),
                        arg(&w_i),
                        arg(&c_i),
                        arg(&tile),
                        arg(&p.start[l].ptr),
                        arg(&p.list[l].ptr),
                        arg(&p.plan.ptr),
                        arg(&dyp),
                        arg(&out),
                        arg(&s),
                    ],
                )?;
            }
            grads.push(dx);
        }
        Ok(grads)
    }
}

/// The kernels' algorithm on the CPU, step for step (f64 arithmetic on the plan's f32 values),
/// so that the plan, the bounds test and the gather's order are tested without a GPU.
#[cfg(test)]
mod emulation {
    use super::*;

    pub fn sample_at(start: f64, bin: f64, t: usize, samples: usize) -> f64 {
        start + (t / samples) as f64 * bin + ((t % samples) as f64 + 0.5) * bin / samples as f64
    }

    /// `taps1d`: the two cells a sample interpolates and the second's weight, or nothing.
    fn taps1d(v: f64, n: usize) -> Option<(usize, usize, f64)> {
        if v < -1.0 || v > n as f64 {
            return None;
        }
        let v = v.max(0.0);
        let a = v.floor() as usize;
        Some(if a >= n - 1 {
            (n - 1, n - 1, 0.0)
        } else {
            (a, a + 1, v - a as f64)
        })
    }

    pub fn lin_weight(v: f64, i: usize, n: usize) -> f64 {
        match taps1d(v, n) {
            None => 0.0,
            Some((i0, i1, l)) => {
                (if i == i0 { 1.0 - l } else { 0.0 }) + (if i == i1 { l } else { 0.0 })
            }
        }
    }

    pub fn geometry(p: &RoiPlan, r: usize) -> (usize, usize, [f64; 4]) {
        let g = &p.plan[PER_ROI * r..PER_ROI * (r + 1)];
        (
            g[0] as usize,
            g[1] as usize,
            [g[2] as f64, g[3] as f64, g[4] as f64, g[5] as f64],
        )
    }

    /// `roi_align_forward`, with the separable weights (the kernel's four taps give the same).
    pub fn forward(p: &RoiPlan, maps: &[Tensor<f64>]) -> Vec<f64> {
        let (out, s, c) = (p.out, p.samples, maps[0].c);
        let mut y = vec![0.0; p.rois * out * out * c];
        for r in 0..p.rois {
            let (l, img, [y1, x1, bh, bw]) = geometry(p, r);
            let m = &maps[l];
            for py in 0..out {
                for px in 0..out {
                    for ch in 0..c {
                        let mut acc = 0.0;
                        for iy in 0..s {
                            let yv = sample_at(y1, bh, py * s + iy, s);
                            for ix in 0..s {
                                let xv = sample_at(x1, bw, px * s + ix, s);
                                for yy in 0..m.h {
                                    let wy = lin_weight(yv, yy, m.h);
                                    if wy == 0.0 {
                                        continue;
                                    }
                                    for xx in 0..m.w {
                                        let wx = lin_weight(xv, xx, m.w);
                                        acc += wy
                                            * wx
                                            * m.data[((img * m.h + yy) * m.w + xx) * c + ch];
                                    }
                                }
                            }
                        }
                        y[((r * out + py) * out + px) * c + ch] = acc / (s * s) as f64;
                    }
                }
            }
        }
        y
    }

    /// `sample_range`: the samples of an axis that may touch cell `q`, widened by two.
    pub fn sample_range(start: f64, bin: f64, s: usize, q: usize, ts: usize) -> (usize, usize) {
        let step = bin / s as f64;
        let a = (q as f64 - 1.0 - start) / step - 0.5;
        let b = (q as f64 + 1.0 - start) / step - 0.5;
        let far = 65536.0;
        if !(step.abs() >= 1.0 / 64.0
            && start.abs() <= far
            && bin.abs() * ts as f64 <= far
            && a.is_finite()
            && b.is_finite())
        {
            return (0, ts - 1);
        }
        let last = (ts - 1) as f64;
        let lo = (a.min(b).floor() - 2.0).clamp(0.0, last);
        let hi = (a.max(b).ceil() + 2.0).clamp(0.0, last);
        (lo as usize, hi as usize)
    }

    /// `roi_align_backward` for level `l`: the gather, in the kernel's order and with its
    /// bounds test; `tiled`, over the tile's regions and the samples `sample_range` gives, as
    /// the kernel, or else over every region of the image and every sample.
    pub fn backward(
        p: &RoiPlan,
        dy: &[f64],
        (l, h, w, c): (usize, usize, usize, usize),
        tiled: bool,
    ) -> Vec<f64> {
        let (out, s) = (p.out, p.samples);
        let ts = out * s;
        let (tstart, tlist) = p.tiles(l, h, w);
        let (th, tw) = (h.div_ceil(TILE), w.div_ceil(TILE));
        let mut dx = vec![0.0; p.images * h * w * c];
        for b in 0..p.images {
            for yq in 0..h {
                for xq in 0..w {
                    let regions = if tiled {
                        let k = (b * th + yq / TILE) * tw + xq / TILE;
                        &tlist[tstart[k] as usize..tstart[k + 1] as usize]
                    } else {
                        &p.list[l][p.start[l][b] as usize..p.start[l][b + 1] as usize]
                    };
                    for ch in 0..c {
                        let mut acc = 0.0;
                        for &r in regions {
                            let (_, _, [y1, x1, bh, bw]) = geometry(p, r as usize);
                            let y_lo = sample_at(y1, bh, 0, s).max(0.0);
                            let y_hi = sample_at(y1, bh, ts - 1, s).max(0.0);
                            if (yq as f64) < y_lo.floor() || yq as f64 > y_hi.floor() + 1.0 {
                                continue;
                            }
                            let x_lo = sample_at(x1, bw, 0, s).max(0.0);
                            let x_hi = sample_at(x1, bw, ts - 1, s).max(0.0);
                            if (xq as f64) < x_lo.floor() || xq as f64 > x_hi.floor() + 1.0 {
                                continue;
                            }
                            let ((t0, t1), (u0, u1)) = if tiled {
                                (
                                    sample_range(y1, bh, s, yq, ts),
                                    sample_range(x1, bw, s, xq, ts),
                                )
                            } else {
                                ((0, ts - 1), (0, ts - 1))
                            };
                            for t in t0..=t1 {
                                let wy = lin_weight(sample_at(y1, bh, t, s), yq, h);
                                if wy == 0.0 {
                                    continue;
                                }
                                for u in u0..=u1 {
                                    let wx = lin_weight(sample_at(x1, bw, u, s), xq, w);
                                    if wx == 0.0 {
                                        continue;
                                    }
                                    let bin = (t / s) * out + u / s;
                                    acc += wy * wx * dy[(r as usize * out * out + bin) * c + ch];
                                }
                            }
                        }
                        dx[((b * h + yq) * w + xq) * c + ch] = acc / (s * s) as f64;
                    }
                }
            }
        }
        dx
    }
}

/// Maps P2–P5 of `images` images for an `h × w` input, `c` channels, random values; and
/// regions of every size (so that every level gets some), some reaching past the image's edges.
pub(super) fn test_case(
    images: usize,
    h: usize,
    w: usize,
    c: usize,
    rng: &mut roofline_models::data::Rng,
) -> (Vec<Tensor<f32>>, Vec<(usize, BBox)>) {
    let maps = (0..4)
        .map(|l| {
            let (mh, mw) = (h >> (l + 2), w >> (l + 2));
            let data = (0..images * mh * mw * c)
                .map(|_| rng.normal() as f32)
                .collect();
            Tensor::from_vec(images, mh, mw, c, data)
        })
        .collect();
    let mut rois = Vec::new();
    for k in 0..24usize {
        // Sides from 8 to ~1000 pixels: levels 2 to 5 by fpn_level.
        let side = 8.0 * 1.25f64.powi(k as i32);
        let (cx, cy) = (rng.uniform(0.0, w as f64), rng.uniform(0.0, h as f64));
        let aspect = rng.uniform(0.5, 1.5);
        let (bw, bh) = (side * aspect, side / aspect);
        rois.push((
            k % images,
            [cx - bw / 2.0, cy - bh / 2.0, cx + bw / 2.0, cy + bh / 2.0],
        ));
    }
    (maps, rois)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn as_f64(t: &Tensor<f32>) -> Tensor<f64> {
        Tensor::from_vec(
            t.n,
            t.h,
            t.w,
            t.c,
            t.data.iter().map(|v| *v as f64).collect(),
        )
    }

    /// The kernels' algorithm (plan, separable weights, gather with its bounds test) gives what
    /// the CPU's MultiScale RoIAlign gives, forward and backward, over every level.
    #[test]
    fn the_kernels_algorithm_equals_the_cpu_roi_align() {
        let mut rng = roofline_models::data::Rng::new(0xA11);
        let (images, h, w, c) = (2, 64, 96, 3);
        let (maps32, rois) = test_case(images, h, w, c, &mut rng);
        let maps: Vec<Tensor<f64>> = maps32.iter().map(as_f64).collect();
        let ms = MultiScale { out: 7, samples: 2 };
        let plan = RoiPlan::new(&ms, &rois, images);
        // Every level has regions.
        for l in 0..4 {
            assert!(!plan.list[l].is_empty(), "no region on P{}", l + 2);
        }
        let cpu = ms.forward(&maps, &rois);
        let emu = emulation::forward(&plan, &maps);
        let err = |a: &[f64], b: &[f64]| {
            let d: f64 = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum();
            let n: f64 = b.iter().map(|y| y * y).sum();
            (d / n.max(1e-300)).sqrt()
        };
        assert!(
            err(&emu, &cpu.data) < 1e-6,
            "forward {}",
            err(&emu, &cpu.data)
        );
        let dy: Vec<f64> = (0..cpu.data.len()).map(|_| rng.normal()).collect();
        let dyt = Tensor::from_vec(cpu.n, cpu.h, cpu.w, cpu.c, dy.clone());
        let grads = ms.backward(&dyt, &maps, &rois);
        for (l, g) in grads.iter().enumerate() {
            let emu = emulation::backward(&plan, &dy, (l, g.h, g.w, c), true);
            // The tiles and the sample ranges leave out only what weighs nothing: the same
            // sums, bit for bit, as visiting every region of the image and every sample.
            let all = emulation::backward(&plan, &dy, (l, g.h, g.w, c), false);
            assert!(emu == all, "P{}: the tiles change the sums", l + 2);
            assert!(
                g.data.iter().any(|v| *v != 0.0),
                "P{} has no gradient",
                l + 2
            );
            assert!(
                err(&emu, &g.data) < 1e-6,
                "P{}: {}",
                l + 2,
                err(&emu, &g.data)
            );
        }
    }

    #[test]
    fn the_plan_groups_regions_by_level_and_image_in_order() {
        let ms = MultiScale { out: 7, samples: 2 };
        let rois = vec![
            (1, [0.0, 0.0, 32.0, 32.0]),   // small: P2
            (0, [0.0, 0.0, 900.0, 900.0]), // large: P5
            (0, [10.0, 10.0, 40.0, 50.0]), // P2
        ];
        let p = RoiPlan::new(&ms, &rois, 2);
        assert_eq!(p.start[0], vec![0, 1, 2]);
        assert_eq!(p.list[0], vec![2, 0]);
        assert_eq!(p.start[3], vec![0, 1, 1]);
        assert_eq!(p.list[3], vec![1]);
        // Region 0 on P2 (scale 1/4): y1 = x1 = -0.5, bins of 32/4/7 cells.
        let bin = (8.0f64 / 7.0) as f32;
        assert_eq!(&p.plan[..6], &[0.0, 1.0, -0.5, -0.5, bin, bin]);
    }

    /// Every region with a sample of nonzero weight at a cell is in that cell's tile, and that
    /// sample within the cell's `sample_range`: over regions of every size on maps larger than
    /// a tile, past the edges, of zero height and tiny.
    #[test]
    fn every_region_that_touches_a_cell_is_in_its_tile() {
        use emulation::{geometry, lin_weight, sample_at, sample_range};
        let mut rng = roofline_models::data::Rng::new(0x711E);
        let (images, h, w) = (2, 256, 384);
        let ms = MultiScale { out: 7, samples: 2 };
        let mut rois = Vec::new();
        for k in 0..60usize {
            let side = 4.0 * 1.12f64.powi(k as i32);
            let (cx, cy) = (
                rng.uniform(-40.0, w as f64 + 40.0),
                rng.uniform(-40.0, h as f64 + 40.0),
            );
            let aspect = rng.uniform(0.3, 3.0);
            let (bw, bh) = (side * aspect, side / aspect);
            rois.push((
                k % images,
                [cx - bw / 2.0, cy - bh / 2.0, cx + bw / 2.0, cy + bh / 2.0],
            ));
        }
        rois.push((0, [100.0, 50.0, 140.0, 50.0])); // zero height
        rois.push((1, [10.0, 10.0, 10.01, 10.02])); // tiny
        let p = RoiPlan::new(&ms, &rois, images);
        let (s, ts) = (p.samples, p.out * p.samples);
        let mut checked = 0;
        for l in 0..4 {
            let (mh, mw) = (h >> (l + 2), w >> (l + 2));
            let (start, list) = p.tiles(l, mh, mw);
            let (th, tw) = (mh.div_ceil(TILE), mw.div_ceil(TILE));
            assert_eq!(start.len(), images * th * tw + 1);
            for (r, (img, _)) in rois.iter().enumerate() {
                let (lr, _, [y1, x1, bh, bw]) = geometry(&p, r);
                if lr != l {
                    continue;
                }
                for yq in 0..mh {
                    for xq in 0..mw {
                        let ys: Vec<usize> = (0..ts)
                            .filter(|&t| lin_weight(sample_at(y1, bh, t, s), yq, mh) != 0.0)
                            .collect();
                        let xs: Vec<usize> = (0..ts)
                            .filter(|&u| lin_weight(sample_at(x1, bw, u, s), xq, mw) != 0.0)
                            .collect();
                        if ys.is_empty() || xs.is_empty() {
                            continue;
                        }
                        let k = (img * th + yq / TILE) * tw + xq / TILE;
                        let tile = &list[start[k] as usize..start[k + 1] as usize];
                        assert!(
                            tile.contains(&(r as i32)),
                            "region {r} missing at P{} ({yq}, {xq})",
                            l + 2
                        );
                        let (t0, t1) = sample_range(y1, bh, s, yq, ts);
                        let (u0, u1) = sample_range(x1, bw, s, xq, ts);
                        assert!(
                            ys.iter().all(|t| (t0..=t1).contains(t)),
                            "rows of {r} at {yq}"
                        );
                        assert!(
                            xs.iter().all(|u| (u0..=u1).contains(u)),
                            "columns of {r} at {xq}"
                        );
                        checked += 1;
                    }
                }
            }
            // Each tile's regions are in plan order.
            for k in 0..start.len() - 1 {
                let t = &list[start[k] as usize..start[k + 1] as usize];
                assert!(t.windows(2).all(|p| p[0] < p[1]));
            }
        }
        assert!(checked > 1000, "{checked} cells checked");
    }
}
