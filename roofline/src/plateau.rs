//! A plateau ceiling's window ([`Plateau`]): how flat the sweep's points behind it lie.

use serde::{Deserialize, Serialize};

/// The window of a sweep behind a plateau ceiling: its points' values (each point's best
/// sample) and how far apart they lie. The ceiling is the window's median point, not its best
/// edge; a window whose spread is over [`Plateau::FLAT`] is not flat and is flagged.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plateau {
    /// Points (working-set sizes) in the window.
    pub points: usize,
    /// The lowest and highest point values, in the ceiling's unit.
    pub low: f64,
    pub high: f64,
    /// (high − low) / the median point's value.
    pub spread: f64,
}

impl Plateau {
    /// The spread above which a window is not flat.
    pub const FLAT: f64 = 0.10;

    /// The plateau of a window whose points have the values `values` (each its best sample):
    /// the index of its median point (the upper median of an even count) and the window's
    /// spread. `None` for an empty window or one holding a non-finite value.
    pub fn of(values: &[f64]) -> Option<(usize, Plateau)> {
        if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
            return None;
        }
        let mut order: Vec<usize> = (0..values.len()).collect();
        order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
        let median = order[values.len() / 2];
        let (low, high) = (values[order[0]], values[order[values.len() - 1]]);
        let spread = if values[median] > 0.0 {
            (high - low) / values[median]
        } else {
            0.0
        };
        Some((
            median,
            Plateau {
                points: values.len(),
                low,
                high,
                spread,
            },
        ))
    }

    /// Whether the window is flat (spread at most [`Plateau::FLAT`]).
    pub fn flat(&self) -> bool {
        self.spread <= Plateau::FLAT
    }
}
