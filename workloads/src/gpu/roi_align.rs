//! The detector's multi-scale RoIAlign on the GPU (`kernels/cuda/roi_align.cu`), the GPU layer
//! of [`crate::detect::roi_align::MultiScale`]: the host builds a plan of the regions (level,
//! image, the first sample's corner and the bin sizes in that level's cells) and, per level, the
//! regions of each image; the forward kernel pools, the backward kernel gathers each feature
//! element's gradient from the regions that touch it, atomics-free, so the result is the same
//! bits on every run.

use super::*;
use crate::detect::boxes::BBox;
use crate::detect::roi_align::{fpn_level, MultiScale};

/// Floats per region in the plan: level, image, y1, x1, bin height, bin width.
const PER_ROI: usize = 6;

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
}

/// The plan on the device, kept for the backward pass.
pub struct DevPlan {
    plan: Buf,
    hw: Buf,
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
        let bufs = |v: &[Vec<i32>; 4]| -> Result<Vec<Buf>, CudaError> {
            v.iter().map(|x| self.upload_buf(x)).collect()
        };
        Ok(DevPlan {
            plan: self.upload_buf(&plan.plan)?,
            hw: self.upload_buf(&hw)?,
            start: bufs(&plan.start)?,
            list: bufs(&plan.list)?,
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
            let (dxp, dyp) = (dx.ptr(), dy.ptr());
            // SAFETY: roi_align_backward(dx, n, h, w, c, start, list, plan, dy, out, samples):
            // dx holds n·h·w·c floats, start n + 1 and list this level's regions (indices below
            // rois), dy rois·out²·c; all outlive the kernel.
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

    fn sample_at(start: f64, bin: f64, t: usize, samples: usize) -> f64 {
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

    fn lin_weight(v: f64, i: usize, n: usize) -> f64 {
        match taps1d(v, n) {
            None => 0.0,
            Some((i0, i1, l)) => {
                (if i == i0 { 1.0 - l } else { 0.0 }) + (if i == i1 { l } else { 0.0 })
            }
        }
    }

    fn geometry(p: &RoiPlan, r: usize) -> (usize, usize, [f64; 4]) {
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

    /// `roi_align_backward` for level `l`: the gather, in the kernel's order and with its
    /// bounds test.
    pub fn backward(p: &RoiPlan, dy: &[f64], l: usize, h: usize, w: usize, c: usize) -> Vec<f64> {
        let (out, s) = (p.out, p.samples);
        let ts = out * s;
        let mut dx = vec![0.0; p.images * h * w * c];
        for b in 0..p.images {
            for yq in 0..h {
                for xq in 0..w {
                    for ch in 0..c {
                        let mut acc = 0.0;
                        let (lo, hi) = (p.start[l][b] as usize, p.start[l][b + 1] as usize);
                        for &r in &p.list[l][lo..hi] {
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
                            for t in 0..ts {
                                let wy = lin_weight(sample_at(y1, bh, t, s), yq, h);
                                if wy == 0.0 {
                                    continue;
                                }
                                for u in 0..ts {
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
    rng: &mut crate::data::Rng,
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
        let mut rng = crate::data::Rng::new(0xA11);
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
            let emu = emulation::backward(&plan, &dy, l, g.h, g.w, c);
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
}
