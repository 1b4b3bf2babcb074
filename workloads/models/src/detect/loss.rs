//! The detector's losses with their gradients: binary cross-entropy on logits (objectness) and
//! smooth L1 (box regression; β = 1/9 for the RPN, 1 for the box head, as torchvision). Each
//! returns the summed loss and the gradient of that sum; the caller divides by its count.

/// Σ BCE(sigmoid(z), t) and its gradient sigmoid(z) − t, computed stably for large |z|.
pub fn bce_with_logits(z: &[f64], t: &[f64]) -> (f64, Vec<f64>) {
    let mut loss = 0.0;
    let grad = z
        .iter()
        .zip(t)
        .map(|(&z, &t)| {
            // log(1 + e^z) − t·z, with log1p(e^−|z|) + max(z, 0).
            loss += z.max(0.0) - t * z + (-z.abs()).exp().ln_1p();
            1.0 / (1.0 + (-z).exp()) - t
        })
        .collect();
    (loss, grad)
}

/// Σ smooth-L1(x − t): ½(d²)/β where |d| < β, |d| − ½β elsewhere; gradient d/β or sign(d).
pub fn smooth_l1(x: &[f64], t: &[f64], beta: f64) -> (f64, Vec<f64>) {
    let mut loss = 0.0;
    let grad = x
        .iter()
        .zip(t)
        .map(|(&x, &t)| {
            let d = x - t;
            if d.abs() < beta {
                loss += 0.5 * d * d / beta;
                d / beta
            } else {
                loss += d.abs() - 0.5 * beta;
                d.signum()
            }
        })
        .collect();
    (loss, grad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(f: impl Fn(&[f64]) -> (f64, Vec<f64>), x: &[f64]) {
        let (_, g) = f(x);
        for i in 0..x.len() {
            let (mut up, mut down) = (x.to_vec(), x.to_vec());
            up[i] += 1e-6;
            down[i] -= 1e-6;
            let fd = (f(&up).0 - f(&down).0) / 2e-6;
            assert!((fd - g[i]).abs() < 1e-6, "{i}: {fd} vs {}", g[i]);
        }
    }

    #[test]
    fn gradients_match_finite_differences() {
        let z = [-3.0, -0.2, 0.0, 0.7, 4.0];
        let t = [0.0, 1.0, 1.0, 0.0, 1.0];
        check(|z| bce_with_logits(z, &t), &z);
        let x = [-2.0, -0.05, 0.03, 0.5, 1.7];
        let tt = [0.0; 5];
        check(|x| smooth_l1(x, &tt, 1.0 / 9.0), &x);
        check(|x| smooth_l1(x, &tt, 1.0), &x);
    }

    #[test]
    fn values_by_hand() {
        // z = 0: log 2 whatever the target.
        assert!((bce_with_logits(&[0.0], &[1.0]).0 - 2f64.ln()).abs() < 1e-15);
        // Large logits stay finite: −log σ(−800) ≈ 800.
        let (l, g) = bce_with_logits(&[800.0], &[0.0]);
        assert!((l - 800.0).abs() < 1e-9 && (g[0] - 1.0).abs() < 1e-12);
        // d = 0.5, β = 1: ½·0.25 = 0.125; d = 2: 2 − ½ = 1.5.
        assert_eq!(smooth_l1(&[0.5, 2.0], &[0.0, 0.0], 1.0).0, 1.625);
    }
}
