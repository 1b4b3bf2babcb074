//! RoIAlign (Mask R-CNN; torchvision's `aligned=True`): each region of interest, in image
//! pixels, is scaled to a feature map by `scale` (1 / its stride), shifted by half a pixel, and
//! split into `out × out` bins; each bin averages `samples × samples` bilinear samples of the
//! feature map. Features are one image's HWC map. The backward pass scatters each output
//! gradient back through the same bilinear weights (regions get no gradient, as in
//! torchvision).
//!
//! FLOPs (for the accounting): per output element, `samples²` bilinear samples of 4
//! multiply-adds (8 FLOPs) each, plus the average (1): `(8·samples² + 1)` per element, the same
//! again for the backward pass.

use super::boxes::BBox;
use crate::tensor::{Float, Tensor};

/// RoIAlign's shape.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct RoiAlign {
    pub out: usize,
    pub samples: usize,
    /// Feature cells per image pixel (1/4 for P2, …).
    pub scale: f64,
}

/// The four taps of a bilinear sample at (y, x) on an `h × w` map: (index, weight) pairs;
/// empty outside the map (as torchvision: beyond one cell out, zero).
fn taps(y: f64, x: f64, h: usize, w: usize) -> Vec<(usize, f64)> {
    if y < -1.0 || y > h as f64 || x < -1.0 || x > w as f64 {
        return Vec::new();
    }
    let (y, x) = (y.max(0.0), x.max(0.0));
    let (mut y0, mut x0) = (y.floor() as usize, x.floor() as usize);
    let (y1, x1);
    let (mut ly, mut lx) = (y - y0 as f64, x - x0 as f64);
    if y0 >= h - 1 {
        y0 = h - 1;
        y1 = h - 1;
        ly = 0.0;
    } else {
        y1 = y0 + 1;
    }
    if x0 >= w - 1 {
        x0 = w - 1;
        x1 = w - 1;
        lx = 0.0;
    } else {
        x1 = x0 + 1;
    }
    let (hy, hx) = (1.0 - ly, 1.0 - lx);
    vec![
        (y0 * w + x0, hy * hx),
        (y0 * w + x1, hy * lx),
        (y1 * w + x0, ly * hx),
        (y1 * w + x1, ly * lx),
    ]
}

impl RoiAlign {
    /// FLOPs of the forward pass for `rois` regions of `channels` channels.
    pub fn flops(&self, rois: usize, channels: usize) -> f64 {
        let s = (self.samples * self.samples) as f64;
        (rois * self.out * self.out * channels) as f64 * (8.0 * s + 1.0)
    }

    /// For each output cell of `roi`: its taps (feature cell, weight), averaged over the samples.
    fn cells(&self, roi: &BBox, h: usize, w: usize) -> Vec<Vec<(usize, f64)>> {
        let off = 0.5;
        let (x1, y1) = (roi[0] * self.scale - off, roi[1] * self.scale - off);
        let (x2, y2) = (roi[2] * self.scale - off, roi[3] * self.scale - off);
        let (bh, bw) = ((y2 - y1) / self.out as f64, (x2 - x1) / self.out as f64);
        let s = self.samples;
        let norm = 1.0 / (s * s) as f64;
        let mut out = Vec::with_capacity(self.out * self.out);
        for py in 0..self.out {
            for px in 0..self.out {
                let mut t = Vec::with_capacity(4 * s * s);
                for iy in 0..s {
                    let y = y1 + py as f64 * bh + (iy as f64 + 0.5) * bh / s as f64;
                    for ix in 0..s {
                        let x = x1 + px as f64 * bw + (ix as f64 + 0.5) * bw / s as f64;
                        t.extend(taps(y, x, h, w).into_iter().map(|(i, wt)| (i, wt * norm)));
                    }
                }
                out.push(t);
            }
        }
        out
    }

    /// `rois.len() × out × out × c` pooled features from an `h × w × c` map.
    pub fn forward(&self, feat: &[f64], h: usize, w: usize, c: usize, rois: &[BBox]) -> Vec<f64> {
        let mut y = vec![0.0; rois.len() * self.out * self.out * c];
        for (r, roi) in rois.iter().enumerate() {
            for (k, taps) in self.cells(roi, h, w).iter().enumerate() {
                let o = &mut y[(r * self.out * self.out + k) * c..][..c];
                for &(i, wt) in taps {
                    for (v, f) in o.iter_mut().zip(&feat[i * c..(i + 1) * c]) {
                        *v += wt * f;
                    }
                }
            }
        }
        y
    }

    /// The feature map's gradient from the pooled features' `dy`.
    pub fn backward(&self, dy: &[f64], h: usize, w: usize, c: usize, rois: &[BBox]) -> Vec<f64> {
        let mut dx = vec![0.0; h * w * c];
        for (r, roi) in rois.iter().enumerate() {
            for (k, taps) in self.cells(roi, h, w).iter().enumerate() {
                let g = &dy[(r * self.out * self.out + k) * c..][..c];
                for &(i, wt) in taps {
                    for (d, v) in dx[i * c..(i + 1) * c].iter_mut().zip(g) {
                        *d += wt * v;
                    }
                }
            }
        }
        dx
    }
}

/// RoIAlign over a feature pyramid (P2–P5, strides 4–32): each region, of some image of the
/// batch, pooled from the level `fpn_level` gives it (k0 = 4), as torchvision's
/// MultiScaleRoIAlign.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MultiScale {
    pub out: usize,
    pub samples: usize,
}

impl MultiScale {
    fn align(&self, level: usize) -> RoiAlign {
        RoiAlign {
            out: self.out,
            samples: self.samples,
            scale: 1.0 / (4usize << level) as f64,
        }
    }

    /// `rois.len() × out × out × C` from the four levels' NHWC maps.
    pub fn forward<T: Float>(&self, maps: &[Tensor<T>], rois: &[(usize, BBox)]) -> Tensor<T> {
        assert_eq!(maps.len(), 4, "P2–P5");
        let c = maps[0].c;
        let cells = self.out * self.out;
        let mut y = Tensor::zeros(rois.len(), self.out, self.out, c);
        for (r, (img, roi)) in rois.iter().enumerate() {
            let l = (fpn_level(roi, 4, 2, 5) - 2) as usize;
            let m = &maps[l];
            let base = img * m.h * m.w;
            for (k, taps) in self.align(l).cells(roi, m.h, m.w).iter().enumerate() {
                let o = &mut y.data[(r * cells + k) * c..][..c];
                for &(i, wt) in taps {
                    let wt = T::from_f64(wt);
                    for (v, f) in o
                        .iter_mut()
                        .zip(&m.data[(base + i) * c..(base + i + 1) * c])
                    {
                        *v += wt * *f;
                    }
                }
            }
        }
        y
    }

    /// The four maps' gradients from the pooled features' `dy`.
    pub fn backward<T: Float>(
        &self,
        dy: &Tensor<T>,
        maps: &[Tensor<T>],
        rois: &[(usize, BBox)],
    ) -> Vec<Tensor<T>> {
        let mut dx: Vec<Tensor<T>> = maps
            .iter()
            .map(|m| Tensor::zeros(m.n, m.h, m.w, m.c))
            .collect();
        let c = maps[0].c;
        let cells = self.out * self.out;
        for (r, (img, roi)) in rois.iter().enumerate() {
            let l = (fpn_level(roi, 4, 2, 5) - 2) as usize;
            let (h, w) = (maps[l].h, maps[l].w);
            let base = img * h * w;
            for (k, taps) in self.align(l).cells(roi, h, w).iter().enumerate() {
                let g = &dy.data[(r * cells + k) * c..][..c];
                for &(i, wt) in taps {
                    let wt = T::from_f64(wt);
                    for (d, v) in dx[l].data[(base + i) * c..(base + i + 1) * c]
                        .iter_mut()
                        .zip(g)
                    {
                        *d += wt * *v;
                    }
                }
            }
        }
        dx
    }
}

/// The FPN level a region is pooled from (Lin et al., eq. 1): `k0 + log2(√(w·h) / 224)`
/// rounded down, clamped to the pyramid's levels (P2–P5 by default: k0 = 4).
pub fn fpn_level(roi: &BBox, k0: i32, min: i32, max: i32) -> i32 {
    let s = ((roi[2] - roi[0]).max(0.0) * (roi[3] - roi[1]).max(0.0)).sqrt();
    let k = (k0 as f64 + (s / 224.0 + 1e-6).log2()).floor() as i32;
    k.clamp(min, max)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// On a map that is linear in x and y, bilinear sampling is exact: each bin's value is the
    /// map at the bin's centre.
    #[test]
    fn a_linear_map_pools_to_the_bin_centres() {
        let (h, w) = (8, 10);
        let feat: Vec<f64> = (0..h * w)
            .map(|i| 2.0 * (i / w) as f64 + 0.5 * (i % w) as f64)
            .collect();
        let ra = RoiAlign {
            out: 2,
            samples: 2,
            scale: 0.5,
        };
        // Image box [4, 2, 12, 10] → map [2, 1, 6, 5] − ½: bins 2 × 2 map cells.
        let y = ra.forward(&feat, h, w, 1, &[[4.0, 2.0, 12.0, 10.0]]);
        let at = |yy: f64, xx: f64| 2.0 * yy + 0.5 * xx;
        let want = [at(1.5, 2.5), at(1.5, 4.5), at(3.5, 2.5), at(3.5, 4.5)];
        for (g, e) in y.iter().zip(want) {
            assert!((g - e).abs() < 1e-12, "{y:?} vs {want:?}");
        }
        assert_eq!(ra.flops(1, 1), 4.0 * 33.0);
    }

    /// Each region pooled from its level equals single-level RoIAlign on that level's map of
    /// its image; the backward pass is the forward pass's adjoint.
    #[test]
    fn multi_scale_pools_each_region_from_its_level() {
        let mut rng = crate::data::Rng::new(31);
        let (n, c) = (2, 3);
        let maps: Vec<Tensor<f64>> = (0..4)
            .map(|l| {
                let s = 32 >> l;
                Tensor::from_vec(
                    n,
                    s,
                    s,
                    c,
                    (0..n * s * s * c).map(|_| rng.normal()).collect(),
                )
            })
            .collect();
        // Sizes that land on P2, P3 and P4, in both images.
        let rois: Vec<(usize, BBox)> = vec![
            (0, [10.0, 12.0, 40.0, 50.0]),
            (1, [5.0, 5.0, 120.0, 110.0]),
            (0, [0.0, 0.0, 230.0, 220.0]),
            (1, [3.0, 7.0, 127.0, 127.0]),
            (1, [0.0, 0.0, 128.0, 128.0]),
        ];
        let ms = MultiScale { out: 2, samples: 2 };
        let y = ms.forward(&maps, &rois);
        for (r, (img, roi)) in rois.iter().enumerate() {
            let l = (fpn_level(roi, 4, 2, 5) - 2) as usize;
            let m = &maps[l];
            let plane = m.h * m.w * c;
            let single = ms.align(l).forward(
                &m.data[img * plane..(img + 1) * plane],
                m.h,
                m.w,
                c,
                &[*roi],
            );
            assert_eq!(
                &y.data[r * 4 * c..(r + 1) * 4 * c],
                &single[..],
                "region {r}"
            );
        }
        let levels: Vec<usize> = rois
            .iter()
            .map(|(_, b)| fpn_level(b, 4, 2, 5) as usize)
            .collect();
        assert!(levels.contains(&2) && levels.contains(&4), "{levels:?}");
        let g: Vec<f64> = (0..y.len()).map(|_| rng.normal()).collect();
        let dx = ms.backward(
            &Tensor::from_vec(y.n, y.h, y.w, y.c, g.clone()),
            &maps,
            &rois,
        );
        let lhs: f64 = y.data.iter().zip(&g).map(|(a, b)| a * b).sum();
        let rhs: f64 = maps
            .iter()
            .zip(&dx)
            .map(|(m, d)| m.data.iter().zip(&d.data).map(|(a, b)| a * b).sum::<f64>())
            .sum();
        assert!(
            (lhs - rhs).abs() < 1e-9 * (1.0 + lhs.abs()),
            "{lhs} vs {rhs}"
        );
    }

    #[test]
    fn fpn_levels() {
        let sq = |s: f64| [0.0, 0.0, s, s];
        assert_eq!(fpn_level(&sq(224.0), 4, 2, 5), 4);
        assert_eq!(fpn_level(&sq(112.0), 4, 2, 5), 3);
        assert_eq!(fpn_level(&sq(448.0), 4, 2, 5), 5);
        assert_eq!(fpn_level(&sq(16.0), 4, 2, 5), 2, "clamped to P2");
        assert_eq!(fpn_level(&sq(4000.0), 4, 2, 5), 5, "clamped to P5");
    }

    /// The backward pass against finite differences of Σ g·y, with regions reaching over the
    /// map's edges.
    #[test]
    fn backward_matches_finite_differences() {
        let (h, w, c) = (6, 7, 3);
        let mut rng = crate::data::Rng::new(17);
        let feat: Vec<f64> = (0..h * w * c).map(|_| rng.normal()).collect();
        let rois = [
            [1.0, 2.0, 9.5, 7.0],
            [-3.0, -1.0, 5.0, 13.0],
            [10.0, 8.0, 16.0, 14.0],
        ];
        let ra = RoiAlign {
            out: 3,
            samples: 2,
            scale: 0.5,
        };
        let g: Vec<f64> = (0..rois.len() * 9 * c).map(|_| rng.normal()).collect();
        let loss = |f: &[f64]| -> f64 {
            ra.forward(f, h, w, c, &rois)
                .iter()
                .zip(&g)
                .map(|(a, b)| a * b)
                .sum()
        };
        let dx = ra.backward(&g, h, w, c, &rois);
        let eps = 1e-6;
        let mut nonzero = 0;
        for i in 0..feat.len() {
            let (mut up, mut down) = (feat.clone(), feat.clone());
            up[i] += eps;
            down[i] -= eps;
            let fd = (loss(&up) - loss(&down)) / (2.0 * eps);
            assert!(
                (fd - dx[i]).abs() < 1e-7 * (1.0 + fd.abs()),
                "{i}: {fd} vs {}",
                dx[i]
            );
            nonzero += usize::from(dx[i] != 0.0);
        }
        assert!(nonzero > 10);
    }
}
