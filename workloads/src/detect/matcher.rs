//! Training-time assignment of anchors and proposals to ground truth (Faster R-CNN):
//! each candidate takes its best-overlapping ground-truth box; above `high` it is foreground,
//! below `low` background, in between ignored; optionally every ground-truth box also claims
//! the candidates that overlap it best (so that no object is left without a positive). Then a
//! fixed number is sampled with at most a fraction of foreground.

use super::boxes::{iou, BBox};
use crate::data::Rng;

/// What a candidate became.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Label {
    /// Foreground, matched to this ground-truth box.
    Fg(usize),
    Bg,
    Ignore,
}

/// The assignment rule: RPN (0.7, 0.3, best matches allowed) or the box head (0.5, 0.5, none).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Matcher {
    pub high: f64,
    pub low: f64,
    pub allow_best: bool,
}

impl Matcher {
    pub const RPN: Matcher = Matcher {
        high: 0.7,
        low: 0.3,
        allow_best: true,
    };
    pub const HEAD: Matcher = Matcher {
        high: 0.5,
        low: 0.5,
        allow_best: false,
    };

    pub fn assign(&self, candidates: &[BBox], truth: &[BBox]) -> Vec<Label> {
        if truth.is_empty() {
            return vec![Label::Bg; candidates.len()];
        }
        let overlaps: Vec<Vec<f64>> = candidates
            .iter()
            .map(|c| truth.iter().map(|t| iou(c, t)).collect())
            .collect();
        let mut labels: Vec<Label> = overlaps
            .iter()
            .map(|o| {
                let (g, best) = o
                    .iter()
                    .enumerate()
                    .fold(
                        (0, f64::NEG_INFINITY),
                        |a, (i, &v)| if v > a.1 { (i, v) } else { a },
                    );
                if best >= self.high {
                    Label::Fg(g)
                } else if best < self.low {
                    Label::Bg
                } else {
                    Label::Ignore
                }
            })
            .collect();
        if self.allow_best {
            for g in 0..truth.len() {
                let best = overlaps.iter().map(|o| o[g]).fold(0.0, f64::max);
                if best <= 0.0 {
                    continue;
                }
                for (c, o) in overlaps.iter().enumerate() {
                    if o[g] == best {
                        labels[c] = Label::Fg(g);
                    }
                }
            }
        }
        labels
    }
}

/// Keeps at most `total` labels, at most `fraction` of them foreground (the rest background),
/// chosen at random; the others become `Ignore`.
pub fn sample(labels: &mut [Label], total: usize, fraction: f64, rng: &mut Rng) {
    let pick = |idx: Vec<usize>, keep: usize, labels: &mut [Label], rng: &mut Rng| {
        if idx.len() <= keep {
            return idx.len();
        }
        let order = rng.permutation(idx.len());
        for &o in &order[keep..] {
            labels[idx[o]] = Label::Ignore;
        }
        keep
    };
    let fg: Vec<usize> = (0..labels.len())
        .filter(|&i| matches!(labels[i], Label::Fg(_)))
        .collect();
    let kept_fg = pick(fg, (total as f64 * fraction) as usize, labels, rng);
    let bg: Vec<usize> = (0..labels.len())
        .filter(|&i| labels[i] == Label::Bg)
        .collect();
    pick(bg, total - kept_fg, labels, rng);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thresholds_and_best_matches() {
        let truth = [[0.0, 0.0, 10.0, 10.0], [50.0, 50.0, 60.0, 60.0]];
        let cands = [
            [0.0, 0.0, 10.0, 9.0],    // IoU 0.9 with truth 0: foreground
            [0.0, 0.0, 10.0, 5.0],    // 0.5: ignored by the RPN
            [30.0, 30.0, 40.0, 40.0], // 0: background
            [52.0, 50.0, 64.0, 60.0], // 0.57 with truth 1: its best, claimed
        ];
        let l = Matcher::RPN.assign(&cands, &truth);
        assert_eq!(
            l,
            vec![Label::Fg(0), Label::Ignore, Label::Bg, Label::Fg(1)]
        );
        let h = Matcher::HEAD.assign(&cands, &truth);
        assert_eq!(h, vec![Label::Fg(0), Label::Fg(0), Label::Bg, Label::Fg(1)]);
        assert_eq!(Matcher::RPN.assign(&cands, &[]), vec![Label::Bg; 4]);
    }

    #[test]
    fn sampling_caps_the_foreground_and_the_total() {
        let mut l: Vec<Label> = (0..100)
            .map(|i| if i < 40 { Label::Fg(0) } else { Label::Bg })
            .collect();
        sample(&mut l, 32, 0.25, &mut Rng::new(3));
        let fg = l.iter().filter(|x| matches!(x, Label::Fg(_))).count();
        let bg = l.iter().filter(|x| **x == Label::Bg).count();
        assert_eq!((fg, bg), (8, 24));
        // Too few foreground: background fills the rest.
        let mut l: Vec<Label> = (0..100)
            .map(|i| if i < 3 { Label::Fg(0) } else { Label::Bg })
            .collect();
        sample(&mut l, 32, 0.5, &mut Rng::new(3));
        let fg = l.iter().filter(|x| matches!(x, Label::Fg(_))).count();
        assert_eq!((fg, l.iter().filter(|x| **x == Label::Bg).count()), (3, 29));
    }
}
