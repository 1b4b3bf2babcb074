//! The feature pyramid (Lin et al.): lateral 1×1 convolutions bring C2–C5 to one width, a
//! top-down path adds each coarser level, upsampled ×2 (nearest), to the next finer one, and a
//! 3×3 convolution smooths each sum into P2–P5; P6 is P5 subsampled by 2 (the RPN's largest
//! anchors). The convolutions carry no bias (the RPN and box heads that follow have theirs).

use crate::layers::{add_into, Conv2d, Param};
use crate::tensor::{Float, Tensor};
use std::sync::Arc;

pub struct Fpn<T> {
    pub lateral: Vec<Conv2d<T>>,
    pub output: Vec<Conv2d<T>>,
    /// P5's shape, for P6's backward pass.
    p5: (usize, usize, usize, usize),
}

/// Nearest-neighbour upsampling of `x` to `h × w` (each output cell takes the input cell
/// `⌊y·h_in/h⌋, ⌊x·w_in/w⌋`).
pub fn upsample<T: Float>(x: &Tensor<T>, h: usize, w: usize) -> Tensor<T> {
    let mut y = Tensor::zeros(x.n, h, w, x.c);
    for n in 0..x.n {
        for oy in 0..h {
            let iy = oy * x.h / h;
            for ox in 0..w {
                let ix = ox * x.w / w;
                let src = ((n * x.h + iy) * x.w + ix) * x.c;
                let dst = ((n * h + oy) * w + ox) * x.c;
                y.data[dst..dst + x.c].copy_from_slice(&x.data[src..src + x.c]);
            }
        }
    }
    y
}

/// The backward pass of `upsample`: each output gradient added to its source cell.
pub fn upsample_backward<T: Float>(dy: &Tensor<T>, h: usize, w: usize) -> Tensor<T> {
    let mut dx = Tensor::zeros(dy.n, h, w, dy.c);
    for n in 0..dy.n {
        for oy in 0..dy.h {
            let iy = oy * h / dy.h;
            for ox in 0..dy.w {
                let ix = ox * w / dy.w;
                let src = ((n * dy.h + oy) * dy.w + ox) * dy.c;
                let dst = ((n * h + iy) * w + ix) * dy.c;
                for k in 0..dy.c {
                    dx.data[dst + k] += dy.data[src + k];
                }
            }
        }
    }
    dx
}

/// Every other cell of `x` (a 1×1 max pool with stride 2).
pub fn subsample<T: Float>(x: &Tensor<T>) -> Tensor<T> {
    let (h, w) = (x.h.div_ceil(2), x.w.div_ceil(2));
    let mut y = Tensor::zeros(x.n, h, w, x.c);
    for n in 0..x.n {
        for oy in 0..h {
            for ox in 0..w {
                let src = ((n * x.h + 2 * oy) * x.w + 2 * ox) * x.c;
                let dst = ((n * h + oy) * w + ox) * x.c;
                y.data[dst..dst + x.c].copy_from_slice(&x.data[src..src + x.c]);
            }
        }
    }
    y
}

/// The backward pass of `subsample`: `dy` at every other cell of a zero map of `shape`.
pub fn subsample_backward<T: Float>(
    dy: &Tensor<T>,
    shape: (usize, usize, usize, usize),
) -> Tensor<T> {
    let (n0, h, w, c) = shape;
    let mut dx = Tensor::zeros(n0, h, w, c);
    for n in 0..dy.n {
        for oy in 0..dy.h {
            for ox in 0..dy.w {
                let src = ((n * dy.h + oy) * dy.w + ox) * c;
                let dst = ((n * h + 2 * oy) * w + 2 * ox) * c;
                dx.data[dst..dst + c].copy_from_slice(&dy.data[src..src + c]);
            }
        }
    }
    dx
}

impl<T: Float> Fpn<T> {
    /// A pyramid over inputs of `channels` (C2–C5) to `width` channels.
    pub fn new(channels: [usize; 4], width: usize, rng: &mut crate::data::Rng) -> Fpn<T> {
        let lateral = (0..4)
            .map(|i| Conv2d::new(&format!("fpn.inner{i}"), channels[i], width, 1, 1, 0, rng))
            .collect();
        let output = (0..4)
            .map(|i| Conv2d::new(&format!("fpn.layer{i}"), width, width, 3, 1, 1, rng))
            .collect();
        Fpn {
            lateral,
            output,
            p5: (0, 0, 0, 0),
        }
    }

    /// P2–P6 from C2–C5.
    pub fn forward(&mut self, c: &[Arc<Tensor<T>>]) -> Vec<Tensor<T>> {
        assert_eq!(c.len(), 4, "C2–C5");
        let mut top: Option<Tensor<T>> = None;
        let mut p: Vec<Tensor<T>> = Vec::with_capacity(5);
        for i in (0..4).rev() {
            let mut l = self.lateral[i].forward(&c[i]);
            if let Some(t) = &top {
                let up = upsample(t, l.h, l.w);
                add_into(&mut l, &up);
            }
            let l = Arc::new(l);
            p.push(self.output[i].forward(&l));
            top = Some(Arc::try_unwrap(l).unwrap_or_else(|a| (*a).clone()));
        }
        p.reverse();
        let p5 = &p[3];
        self.p5 = (p5.n, p5.h, p5.w, p5.c);
        let p6 = subsample(p5);
        p.push(p6);
        p
    }

    /// Gradients of the parameters from those of P2–P6; returns those of C2–C5.
    pub fn backward(&mut self, mut dp: Vec<Tensor<T>>) -> Vec<Tensor<T>> {
        assert_eq!(dp.len(), 5, "P2–P6");
        let d6 = dp.pop().expect("P6");
        add_into(&mut dp[3], &subsample_backward(&d6, self.p5));
        // The top-down sums, from the finest: each level's gradient also flows to the coarser.
        let mut dsum: Vec<Option<Tensor<T>>> = (0..4)
            .map(|i| Some(self.output[i].backward(&dp[i])))
            .collect();
        let mut dc: Vec<Tensor<T>> = Vec::with_capacity(4);
        // dsum[i] is the gradient of level i's sum; its upsampled input is level i + 1's sum:
        // walk from the finest level up, pushing each level's gradient to the coarser one.
        for i in 0..3 {
            let g = dsum[i].as_ref().expect("gradient");
            let (h, w) = {
                let s = dsum[i + 1].as_ref().expect("gradient");
                (s.h, s.w)
            };
            let up = upsample_backward(g, h, w);
            add_into(dsum[i + 1].as_mut().expect("gradient"), &up);
        }
        for (i, g) in dsum.into_iter().enumerate() {
            dc.push(self.lateral[i].backward(&g.expect("gradient")));
        }
        dc
    }

    pub fn params(&mut self) -> Vec<&mut Param<T>> {
        self.lateral
            .iter_mut()
            .chain(self.output.iter_mut())
            .map(|c| &mut c.weight)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::data::Rng;
    use crate::detect::testing::{check_params, rand};

    #[test]
    fn upsampling_by_hand_and_its_adjoint() {
        let x = Tensor::from_vec(1, 1, 2, 1, vec![1.0f64, 2.0]);
        assert_eq!(
            upsample(&x, 2, 4).data,
            vec![1.0, 1.0, 2.0, 2.0, 1.0, 1.0, 2.0, 2.0]
        );
        // ⟨up(x), y⟩ = ⟨x, up*(y)⟩ for odd sizes too.
        let mut rng = Rng::new(2);
        let (a, b) = (rand(2, 3, 5, 2, &mut rng), rand(2, 5, 9, 2, &mut rng));
        let l: f64 = upsample(&a, 5, 9)
            .data
            .iter()
            .zip(&b.data)
            .map(|(p, q)| p * q)
            .sum();
        let r: f64 = a
            .data
            .iter()
            .zip(&upsample_backward(&b, 3, 5).data)
            .map(|(p, q)| p * q)
            .sum();
        assert!((l - r).abs() < 1e-12);
    }

    /// Shapes P2–P6 and every gradient (C2–C5 and the weights) against finite differences of
    /// Σ g·P.
    #[test]
    fn pyramid_gradient_check() {
        let mut rng = Rng::new(11);
        let shapes = [(8, 3), (4, 5), (2, 6), (1, 7)];
        let c: Vec<Arc<Tensor<f64>>> = shapes
            .iter()
            .map(|&(s, ch)| Arc::new(rand(2, s, s + 1, ch, &mut rng)))
            .collect();
        let mut f = Fpn::<f64>::new([3, 5, 6, 7], 4, &mut Rng::new(3));
        let p = f.forward(&c);
        assert_eq!(
            p.iter().map(|t| (t.h, t.w, t.c)).collect::<Vec<_>>(),
            vec![(8, 9, 4), (4, 5, 4), (2, 3, 4), (1, 2, 4), (1, 1, 4)]
        );
        let g: Vec<Tensor<f64>> = p
            .iter()
            .map(|t| rand(t.n, t.h, t.w, t.c, &mut rng))
            .collect();
        let dc = f.backward(g.clone());
        let loss = |f: &mut Fpn<f64>, c: &[Arc<Tensor<f64>>]| -> f64 {
            f.forward(c)
                .iter()
                .zip(&g)
                .map(|(a, b)| a.data.iter().zip(&b.data).map(|(x, y)| x * y).sum::<f64>())
                .sum()
        };
        let h = 1e-6;
        for (li, ci) in c.iter().enumerate() {
            for i in (0..ci.len()).step_by(7) {
                let (mut up, mut down) = (c.to_vec(), c.to_vec());
                let mut u = (**ci).clone();
                u.data[i] += h;
                up[li] = Arc::new(u);
                let mut d = (**ci).clone();
                d.data[i] -= h;
                down[li] = Arc::new(d);
                let fd = (loss(&mut f, &up) - loss(&mut f, &down)) / (2.0 * h);
                assert!(
                    (fd - dc[li].data[i]).abs() < 1e-6 * (1.0 + fd.abs()),
                    "C{}[{i}]: {fd} vs {}",
                    li + 2,
                    dc[li].data[i]
                );
            }
        }
        check_params(&mut f, Fpn::<f64>::params, 5, |m| loss(m, &c));
    }
}
