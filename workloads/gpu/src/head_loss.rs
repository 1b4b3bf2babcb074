//! The box head's losses on the GPU (`kernels/cuda/detect.cu`'s `head_loss_terms`), the twin of
//! [`roofline_models::detect::head::head_loss`] with its contract: the softmax cross-entropy of each
//! region's class logits, the smooth L1 (β = 1/9) of a foreground region's deltas of its class
//! against its target, both divided by the regions, and their gradients (times the loss scale)
//! made on the device. What crosses the bus: the regions' labels and targets up (20 bytes a
//! region, which the host's sampling made) and two doubles a region, read with the step's last
//! copy and summed in region order ([`head_loss_sums`]). Where the host path copied the box
//! head's outputs down (one synchronisation) and their gradients up.

use super::*;

/// The box head's smooth-L1 β (`head_loss`'s 1/9).
const BETA: f64 = 1.0 / 9.0;

/// The bytes the terms of `rows` regions take (two doubles each).
pub fn head_terms_bytes(rows: usize) -> usize {
    16 * rows
}

/// (class loss, box loss) from the terms of `rows` regions (each region's cross-entropy, then
/// its smooth-L1 sum), as `head_loss` sums them: in region order, the cross-entropies then
/// divided by the regions, each smooth-L1 sum divided before it is added.
pub fn head_loss_sums(terms: &[f64], rows: usize) -> (f64, f64) {
    let r = rows.max(1) as f64;
    let t = &terms[..(2 * rows).min(terms.len())];
    let (cls, reg) = t
        .chunks_exact(2)
        .fold((0.0, 0.0), |(c, g), v| (c + v[0], g + v[1] / r));
    (cls / r, reg)
}

/// The box head's losses of a batch on the device.
pub struct HeadLoss {
    /// The gradients of the (class + box) loss with respect to the logits and the deltas, f32,
    /// times the loss scale.
    pub dlogits: GTensor,
    pub ddeltas: GTensor,
    /// The regions (the terms written).
    pub rows: usize,
}

impl Ctx {
    /// The box head's losses for `logits` (R × K) and `deltas` (R × 4K) against each region's
    /// `labels` (0: background) and `targets` (a foreground region's encoded box), the
    /// gradients times `scale`; the terms written at `terms` (room for
    /// [`head_terms_bytes`]`(R)`, 8-byte aligned).
    pub fn head_loss(
        &mut self,
        logits: &GTensor,
        deltas: &GTensor,
        labels: &[usize],
        targets: &[[f64; 4]],
        scale: f64,
        terms: u64,
    ) -> Result<HeadLoss, CudaError> {
        let (rows, k, dc) = (logits.rows(), logits.c, deltas.c);
        if deltas.rows() != rows || labels.len() != rows || targets.len() != rows {
            return Err(CudaError::Check(format!(
                "the box head's loss: {rows} rows of logits, {} of deltas, {} labels, {} targets",
                deltas.rows(),
                labels.len(),
                targets.len()
            )));
        }
        if let Some(l) = labels.iter().find(|&&l| l >= k || 4 * l + 4 > dc) {
            return Err(CudaError::Check(format!(
                "the box head's loss: label {l} out of range ({k} classes, {dc} deltas a region)"
            )));
        }
        if logits.dt != Storage::F32 || deltas.dt != Storage::F32 || !terms.is_multiple_of(8) {
            return Err(CudaError::Check(
                "the box head's loss takes f32 outputs and 8-byte aligned terms".into(),
            ));
        }
        let lab: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
        let tg: Vec<f64> = targets.iter().flatten().copied().collect();
        let (lab_b, tg_b) = (self.upload_buf(&lab)?, self.upload_buf(&tg)?);
        let dlogits = self.tensor(logits.n, logits.h, logits.w, k)?;
        let ddeltas = self.tensor(deltas.n, deltas.h, deltas.w, dc)?;
        let (ri, ki, dci) = (rows as i32, k as i32, dc as i32);
        let (sf, beta) = (scale as f32, BETA);
        let (zp, dp, gzp, gdp) = (logits.ptr(), deltas.ptr(), dlogits.ptr(), ddeltas.ptr());
        // SAFETY: head_loss_terms(z, d, label, target, rows, k, dc, scale, beta, dz, dd,
        // terms): z and dz hold rows × k f32, d and dd rows × dc f32, label rows i32 each below
        // k with 4·label + 4 ≤ dc (checked), target 4·rows f64, terms the caller's 2·rows f64;
        // every buffer outlives the kernel (stream-ordered frees).
        unsafe {
            self.launch(
                "head_loss_terms",
                rows,
                &mut [
                    arg(&zp),
                    arg(&dp),
                    arg(&lab_b.ptr),
                    arg(&tg_b.ptr),
                    arg(&ri),
                    arg(&ki),
                    arg(&dci),
                    arg(&sf),
                    arg(&beta),
                    arg(&gzp),
                    arg(&gdp),
                    arg(&terms),
                ],
            )?;
        }
        Ok(HeadLoss {
            dlogits,
            ddeltas,
            rows,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_models::detect::head::head_loss;

    /// The kernel's algorithm on the host, thread for thread: each region's terms and its
    /// gradients (times `scale`).
    fn kernel(
        z: &Tensor<f32>,
        d: &Tensor<f32>,
        labels: &[usize],
        targets: &[[f64; 4]],
        scale: f32,
    ) -> (Vec<f64>, Vec<f32>, Vec<f32>) {
        let (rows, k, dc) = (z.rows(), z.c, d.c);
        let n = rows as f64;
        let (mut terms, mut dz, mut dd) = (Vec::new(), vec![0.0; rows * k], vec![0.0; rows * dc]);
        for r in 0..rows {
            let zr = &z.data[r * k..(r + 1) * k];
            let m = zr.iter().fold(f64::NEG_INFINITY, |m, v| m.max(*v as f64));
            let s = zr.iter().fold(0.0, |s, v| s + (*v as f64 - m).exp());
            let lse = m + s.ln();
            let mut lc = 0.0;
            for (j, v) in zr.iter().enumerate() {
                let zl = *v as f64 - lse;
                let t = if j == labels[r] { 1.0 } else { 0.0 };
                lc -= t * zl;
                dz[r * k + j] = ((zl.exp() - t) / n) as f32 * scale;
            }
            let mut lr = 0.0;
            if labels[r] > 0 {
                for (q, t) in targets[r].iter().enumerate() {
                    let at = r * dc + 4 * labels[r] + q;
                    let x = d.data[at] as f64 - t;
                    let g = if x.abs() < BETA {
                        lr += 0.5 * x * x / BETA;
                        x / BETA
                    } else {
                        lr += x.abs() - 0.5 * BETA;
                        x.signum()
                    };
                    dd[at] = (g / n) as f32 * scale;
                }
            }
            terms.extend([lc, lr]);
        }
        (terms, dz, dd)
    }

    /// Regions of every kind: background, foreground of each class, deltas near and far from
    /// their targets (both branches of the smooth L1), logits large enough that the softmax's
    /// shift matters.
    fn case(
        rows: usize,
        k: usize,
        rng: &mut roofline_models::data::Rng,
    ) -> (Tensor<f32>, Tensor<f32>, Vec<usize>, Vec<[f64; 4]>) {
        let z = Tensor::from_vec(
            rows,
            1,
            1,
            k,
            (0..rows * k).map(|_| (rng.normal() * 8.0) as f32).collect(),
        );
        let d = Tensor::from_vec(
            rows,
            1,
            1,
            4 * k,
            (0..rows * 4 * k)
                .map(|_| (rng.normal() * 0.2) as f32)
                .collect(),
        );
        let labels: Vec<usize> = (0..rows)
            .map(|r| if r % 3 == 0 { 0 } else { r % k })
            .collect();
        let targets: Vec<[f64; 4]> = labels
            .iter()
            .map(|&l| {
                if l == 0 {
                    [0.0; 4]
                } else {
                    std::array::from_fn(|_| rng.normal() * 0.1)
                }
            })
            .collect();
        (z, d, labels, targets)
    }

    /// The kernel's terms, summed by `head_loss_sums`, and its gradients are `head_loss`'s, bit
    /// for bit (the host's exp and ln on both sides: on the GPU only those may differ).
    #[test]
    fn the_kernels_algorithm_is_head_loss() {
        let mut rng = roofline_models::data::Rng::new(0x4EAD);
        for (rows, k) in [(1, 2), (7, 3), (512, 5)] {
            let (z, d, labels, targets) = case(rows, k, &mut rng);
            let (cls, reg, gz, gd) = head_loss(&z, &d, &labels, &targets);
            for scale in [1.0f32, 1024.0] {
                let (terms, dz, dd) = kernel(&z, &d, &labels, &targets, scale);
                assert_eq!(head_loss_sums(&terms, rows), (cls, reg), "{rows} × {k}");
                let unscaled = |v: &[f32]| v.iter().map(|x| x / scale).collect::<Vec<f32>>();
                assert_eq!(unscaled(&dz), gz.data);
                assert_eq!(unscaled(&dd), gd.data);
            }
            // Past one region, both losses have terms (the first region is background).
            assert!(cls > 0.0 && (rows == 1 || reg > 0.0));
        }
    }

    #[test]
    fn the_sums_take_their_regions_terms_only() {
        // Two regions' terms and a third's left over from a larger batch.
        let terms = [1.0, 0.5, 3.0, 0.25, 100.0, 100.0];
        assert_eq!(head_loss_sums(&terms, 2), (2.0, 0.375));
        assert_eq!(head_loss_sums(&[], 0), (0.0, 0.0));
    }
}
