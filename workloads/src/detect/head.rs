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
        let grads: Vec<Vec<f64>> = head.params().iter().map(|p| p.grad.clone()).collect();
        for (pi, grad) in grads.iter().enumerate() {
            for i in (0..grad.len()).step_by(4) {
                let v = head.params()[pi].value[i];
                head.params()[pi].value[i] = v + h;
                let lu = loss(&mut head, &x);
                head.params()[pi].value[i] = v - h;
                let ld = loss(&mut head, &x);
                head.params()[pi].value[i] = v;
                let fd = (lu - ld) / (2.0 * h);
                assert!(
                    (fd - grad[i]).abs() < 1e-6 * (1.0 + fd.abs()),
                    "param {pi}[{i}]: {fd} vs {}",
                    grad[i]
                );
            }
        }
        // 2·(12·6 + 6·6 + 6·5 + 6·20) + (6 + 6 + 5 + 20) per region.
        assert_eq!(
            head.flops(3),
            3.0 * (2.0 * (72.0 + 36.0 + 30.0 + 120.0) + 37.0)
        );
    }
}
