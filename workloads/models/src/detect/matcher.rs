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

    /// Each candidate's label.
    pub fn assign(&self, candidates: &[BBox], truth: &[BBox]) -> Vec<Label> {
        self.assign_chunks(&[candidates], truth)
    }

    /// The labels of the candidates of every chunk in turn (a pyramid's levels of anchors:
    /// no concatenated copy of ~660,000 anchors). Two passes over the candidates × truth
    /// overlaps, recomputed rather than kept (a kept matrix of an image's anchors is ~50 MB):
    /// the first finds each candidate's best truth box and each truth box's best overlap, the
    /// second gives the candidates at that best to the truth box (the last one, where several).
    pub fn assign_chunks(&self, chunks: &[&[BBox]], truth: &[BBox]) -> Vec<Label> {
        let g = truth.len();
        let all = chunks.iter().flat_map(|c| c.iter());
        if g == 0 {
            return all.map(|_| Label::Bg).collect();
        }
        let mut best = vec![0.0f64; g];
        let mut labels: Vec<Label> = all
            .clone()
            .map(|c| {
                let (mut j, mut top) = (0, f64::NEG_INFINITY);
                for (i, t) in truth.iter().enumerate() {
                    let v = iou(c, t);
                    if v > top {
                        (j, top) = (i, v);
                    }
                    best[i] = best[i].max(v);
                }
                if top >= self.high {
                    Label::Fg(j)
                } else if top < self.low {
                    Label::Bg
                } else {
                    Label::Ignore
                }
            })
            .collect();
        if self.allow_best && best.iter().any(|&b| b > 0.0) {
            for (c, label) in all.zip(labels.iter_mut()) {
                if let Some(j) = (0..g)
                    .rev()
                    .find(|&j| best[j] > 0.0 && iou(c, &truth[j]) == best[j])
                {
                    *label = Label::Fg(j);
                }
            }
        }
        labels
    }
}

/// Which of one kind's candidates (foreground or background) a draw keeps: all of them, or
/// these offsets into the kind's candidates in index order (distinct, in the order drawn).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Picks {
    All,
    These(Vec<usize>),
}

impl Picks {
    /// How many of `of` candidates are kept.
    pub fn kept(&self, of: usize) -> usize {
        match self {
            Picks::All => of,
            Picks::These(v) => v.len(),
        }
    }
}

/// [`sample`]'s draw from the counts alone: of `fg` foreground and `bg` background candidates,
/// at most `total · fraction` foreground (all when there are no more) and background for the
/// rest of `total`, each kind drawn by `Rng::choose` (foreground first). The GPU's RPN loss
/// draws with it on the host from the device's counts, so both devices keep the same anchors.
pub fn draw(fg: usize, bg: usize, total: usize, fraction: f64, rng: &mut Rng) -> (Picks, Picks) {
    let pick = |of: usize, keep: usize, rng: &mut Rng| {
        if of <= keep {
            Picks::All
        } else {
            Picks::These(rng.choose(of, keep))
        }
    };
    let f = pick(fg, (total as f64 * fraction) as usize, rng);
    let kept_fg = f.kept(fg);
    let b = pick(bg, total.saturating_sub(kept_fg), rng);
    (f, b)
}

/// Keeps at most `total` labels, at most `fraction` of them foreground (the rest background),
/// chosen at random ([`draw`]); the others become `Ignore`.
pub fn sample(labels: &mut [Label], total: usize, fraction: f64, rng: &mut Rng) {
    let fg: Vec<usize> = (0..labels.len())
        .filter(|&i| matches!(labels[i], Label::Fg(_)))
        .collect();
    let bg: Vec<usize> = (0..labels.len())
        .filter(|&i| labels[i] == Label::Bg)
        .collect();
    let (pf, pb) = draw(fg.len(), bg.len(), total, fraction, rng);
    for (idx, picks) in [(fg, pf), (bg, pb)] {
        if let Picks::These(offsets) = picks {
            let mut chosen = vec![false; idx.len()];
            offsets.into_iter().for_each(|o| chosen[o] = true);
            for (&i, kept) in idx.iter().zip(chosen) {
                if !kept {
                    labels[i] = Label::Ignore;
                }
            }
        }
    }
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
