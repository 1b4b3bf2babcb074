//! The optimiser (SGD with momentum and weight decay) and the learning-rate schedule (HPC AI500
//! V2.0 section 5.1.2: linear warm-up, then cosine or step decay).

use crate::layers::Param;
use crate::tensor::Float;
use rayon::prelude::*;

/// SGD with momentum (PyTorch's form: v = μv + g + λw; w −= lr·v), weight decay only on the
/// parameters that ask for it (not batch-norm parameters or biases, unless `decay_all`).
#[derive(Clone, Debug)]
pub struct Sgd {
    pub momentum: f64,
    pub weight_decay: f64,
    pub decay_all: bool,
}

impl Default for Sgd {
    fn default() -> Self {
        Sgd {
            momentum: 0.9,
            weight_decay: 1e-4,
            decay_all: false,
        }
    }
}

impl Sgd {
    pub fn step<T: Float>(&self, params: Vec<&mut Param<T>>, lr: f64) {
        let (mu, lr_t) = (T::from_f64(self.momentum), T::from_f64(lr));
        params.into_par_iter().for_each(|p| {
            let wd = T::from_f64(if p.decay || self.decay_all {
                self.weight_decay
            } else {
                0.0
            });
            for ((w, g), v) in p.value.iter_mut().zip(&p.grad).zip(p.momentum.iter_mut()) {
                *v = mu * *v + *g + wd * *w;
                *w -= lr_t * *v;
            }
        });
    }
}

/// The decay after the warm-up.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Decay {
    /// Half a cosine from the peak to zero at the last step.
    Cosine,
    /// ×0.1 at each of these fractions of the run (e.g. epochs 30, 60, 80 of 90).
    Step,
}

/// Learning rate: base 0.1 per 256 images, scaled linearly with the global batch; linear
/// warm-up over `warmup_steps`, then the decay.
#[derive(Clone, Debug)]
pub struct Schedule {
    pub base_lr_per_256: f64,
    pub global_batch: usize,
    pub warmup_steps: usize,
    pub total_steps: usize,
    pub decay: Decay,
}

impl Schedule {
    pub fn peak(&self) -> f64 {
        self.base_lr_per_256 * self.global_batch as f64 / 256.0
    }

    pub fn lr(&self, step: usize) -> f64 {
        let peak = self.peak();
        if step < self.warmup_steps {
            return peak * (step + 1) as f64 / self.warmup_steps as f64;
        }
        let span = self.total_steps.saturating_sub(self.warmup_steps).max(1) as f64;
        let t = ((step - self.warmup_steps) as f64 / span).min(1.0);
        match self.decay {
            Decay::Cosine => peak * 0.5 * (1.0 + (std::f64::consts::PI * t).cos()),
            Decay::Step => {
                peak * 0.1f64.powi(
                    [30.0 / 90.0, 60.0 / 90.0, 80.0 / 90.0]
                        .iter()
                        .filter(|m| t >= **m)
                        .count() as i32,
                )
            }
        }
    }
}
