//! The accuracy curve's model (AIPerf's predicted accuracy, `rules::predicted`): a fit of
//! `a·log₂(x + b) + c` to the validation curve.

/// The fit of `a·log₂(x + b) + c` to `(x, y)` points: for each `b` on a grid, least squares
/// for `a` and `c`; the `b` with the smallest residual. `None` with fewer than three points or
/// a curve that does not rise.
pub fn log_fit(points: &[(f64, f64)]) -> Option<(f64, f64, f64)> {
    if points.len() < 3 {
        return None;
    }
    let mut best: Option<(f64, (f64, f64, f64))> = None;
    for i in 0..=60 {
        let b = 10f64.powf(-2.0 + 4.0 * i as f64 / 60.0);
        let xs: Vec<f64> = points.iter().map(|p| (p.0 + b).log2()).collect();
        let n = xs.len() as f64;
        let (mx, my) = (
            xs.iter().sum::<f64>() / n,
            points.iter().map(|p| p.1).sum::<f64>() / n,
        );
        let sxx: f64 = xs.iter().map(|x| (x - mx).powi(2)).sum();
        if sxx <= 0.0 {
            continue;
        }
        let sxy: f64 = xs
            .iter()
            .zip(points)
            .map(|(x, p)| (x - mx) * (p.1 - my))
            .sum();
        let a = sxy / sxx;
        let c = my - a * mx;
        let sse: f64 = xs
            .iter()
            .zip(points)
            .map(|(x, p)| (a * x + c - p.1).powi(2))
            .sum();
        if best.is_none_or(|(e, _)| sse < e) {
            best = Some((sse, (a, b, c)));
        }
    }
    best.map(|(_, f)| f).filter(|f| f.0 > 0.0)
}

/// The accuracy the fit predicts after `epochs` epochs, in [0, 1].
pub fn predict(points: &[(f64, f64)], epochs: f64) -> Option<f64> {
    let (a, b, c) = log_fit(points)?;
    Some((a * (epochs + b).log2() + c).clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A curve made by the model is found again, and predicts its own continuation.
    #[test]
    fn log_fit_recovers_its_curve() {
        let (a, b, c) = (0.08, 1.0, 0.2);
        let pts: Vec<(f64, f64)> = (1..=6)
            .map(|x| (x as f64, a * (x as f64 + b).log2() + c))
            .collect();
        let (fa, fb, fc) = log_fit(&pts).unwrap();
        assert!(
            (fa - a).abs() < 2e-3 && (fb - b).abs() < 0.1 && (fc - c).abs() < 5e-3,
            "{fa} {fb} {fc}"
        );
        let want = a * (61.0f64).log2() + c;
        assert!((predict(&pts, 60.0).unwrap() - want).abs() < 5e-3);
        assert!(log_fit(&pts[..2]).is_none(), "two points are not a curve");
        let falling: Vec<(f64, f64)> = pts.iter().map(|p| (p.0, 1.0 - p.1)).collect();
        assert!(
            log_fit(&falling).is_none(),
            "a falling curve predicts nothing"
        );
    }
}
