//! Building blocks of the EWA workload's detector (Faster R-CNN with a ResNet-50-FPN backbone,
//! HPC AI500 V2.0): the feature pyramid, the region proposal network's head and proposals, the box head and predictor, box arithmetic, anchors, non-maximum suppression, anchor and proposal
//! assignment with sampling, RoIAlign with its backward pass and FPN level assignment, the
//! losses with their gradients, and the mAP@0.5 metric. Each is tested on its own (hand-computed cases,
//! finite differences); `model` puts them together into the detector.

pub mod boxes;
pub mod fpn;
pub mod head;
pub mod host;
pub mod loss;
pub mod map;
pub mod matcher;
pub mod model;
pub mod roi_align;
pub mod rpn;

/// What the detector's gradient checks share.
#[cfg(test)]
pub(crate) mod testing {
    use crate::data::Rng;
    use crate::layers::Param;
    use crate::tensor::Tensor;

    /// An NHWC tensor of standard normal values.
    pub fn rand(n: usize, h: usize, w: usize, c: usize, rng: &mut Rng) -> Tensor<f64> {
        Tensor::from_vec(
            n,
            h,
            w,
            c,
            (0..n * h * w * c).map(|_| rng.normal()).collect(),
        )
    }

    /// Central differences (h = 1e-6) of `loss` over every `step`-th entry of every parameter
    /// that `params` hands out, against the gradient the backward pass left in it:
    /// |fd − g| < 1e-6·(1 + |fd|).
    pub fn check_params<M>(
        m: &mut M,
        params: impl Fn(&mut M) -> Vec<&mut Param<f64>>,
        step: usize,
        loss: impl Fn(&mut M) -> f64,
    ) {
        check_params_within(m, params, step, 1e-6, loss)
    }

    /// `check_params` with the bound |fd − g| < tol·(1 + |fd|).
    pub fn check_params_within<M>(
        m: &mut M,
        params: impl Fn(&mut M) -> Vec<&mut Param<f64>>,
        step: usize,
        tol: f64,
        loss: impl Fn(&mut M) -> f64,
    ) {
        let h = 1e-6;
        let grads: Vec<Vec<f64>> = params(m).iter().map(|p| p.grad.clone()).collect();
        for (pi, grad) in grads.iter().enumerate() {
            for i in (0..grad.len()).step_by(step) {
                let v = params(m)[pi].value[i];
                params(m)[pi].value[i] = v + h;
                let lu = loss(m);
                params(m)[pi].value[i] = v - h;
                let ld = loss(m);
                params(m)[pi].value[i] = v;
                let fd = (lu - ld) / (2.0 * h);
                assert!(
                    (fd - grad[i]).abs() < tol * (1.0 + fd.abs()),
                    "param {pi}[{i}]: {fd} vs {}",
                    grad[i]
                );
            }
        }
    }
}
