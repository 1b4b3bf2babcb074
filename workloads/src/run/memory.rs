//! What a run needs in memory, checked before anything is allocated: a size that cannot fit
//! is refused with one line, not an abort.

use super::prepare::{Device, Prepared};

impl Prepared {
    /// The host memory one of `ranks` ranks needs at the least to train a step: its share of
    /// the batch's images and the training set's order, and on the CPU every layer's output kept for the backward pass and
    /// the weights, their gradients and momentum (16-bit products: 2 bytes an activation). A
    /// lower bound, checked before anything is allocated, so a refusal is never wrong.
    pub fn least_memory(&self, ranks: usize) -> f64 {
        let layers = self.layers();
        let images = self.batch().div_ceil(ranks.max(1)) as f64;
        // The images' shuffled order, one index each.
        let order = 8.0 * self.workload().train_images() as f64;
        let input = layers.first().map_or(0.0, |l| l.inputs) * 4.0 * images + order;
        if self.spec.device == Device::Cuda {
            return input;
        }
        let activation = if self.spec.precision.bytes() < 4 {
            2.0
        } else {
            4.0
        };
        let outputs: f64 = layers.iter().map(|l| l.outputs).sum();
        let params: f64 = layers.iter().map(|l| l.params).sum();
        input + outputs * activation * images + 3.0 * 4.0 * params
    }
}
