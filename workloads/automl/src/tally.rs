//! A run's figures from its candidates: the time series' points, the score (AIPerf's highest
//! FLOPS, the regulated score, candidates a minute, the workers' share in training) and the
//! verdict by AIPerf's rules.

use roofline_model::automl::{invalid_because, sample, Automl, AutomlScore, Conditions};
use roofline_model::Stats;

/// The point at `at_s` (operations of every finished epoch over the time to the last one's end,
/// as AIPerf's `score.py` counts; the best top-1 so far); it replaces the last point when that
/// is less than `close` seconds older.
pub fn add_sample(doc: &mut Automl, at_s: f64, close: f64) {
    let epochs = doc.candidates.iter().flat_map(|c| &c.epochs);
    let ops: f64 = epochs.clone().map(|e| e.ops).sum();
    let last_end = epochs.map(|e| e.at_s).fold(0.0, f64::max);
    let best = doc
        .candidates
        .iter()
        .filter_map(|c| c.best_top1())
        .reduce(f64::max);
    let point = sample(at_s, ops, last_end, best);
    match doc
        .series
        .last_mut()
        .filter(|l| point.at_s - l.at_s < close)
    {
        Some(last) => *last = point,
        None => doc.series.push(point),
    }
}

/// What a run is, for AIPerf's validity rules (besides its time and its error).
#[derive(Clone, Debug, PartialEq)]
pub struct Checks {
    /// ImageNet at 224².
    pub imagenet_224: bool,
    /// The search starts from ResNet-50 (width 1, 3,4,6,3).
    pub start_resnet50: bool,
    pub eval_images: usize,
    pub precision: roofline_model::Precision,
}

/// The score and the verdict after `elapsed` seconds with `workers` workers, the workers having
/// searched for `busy.0` seconds and the master been busy for `busy.1`.
pub fn rescore(doc: &mut Automl, elapsed: f64, workers: usize, busy: (f64, f64), checks: &Checks) {
    let best = doc
        .candidates
        .iter()
        .filter_map(|c| Some((c.id, c.best_top1()?)))
        .max_by(|a, b| a.1.total_cmp(&b.1));
    let seconds: Vec<f64> = doc
        .candidates
        .iter()
        .flat_map(|c| &c.epochs)
        .map(|e| e.seconds)
        .collect();
    let finished = doc
        .candidates
        .iter()
        .filter(|c| c.finished_s.is_some())
        .count();
    let capacity = elapsed * workers as f64;
    doc.score = AutomlScore {
        flops: doc.series.iter().map(|s| s.flops).fold(0.0, f64::max),
        regulated: doc.series.iter().map(|s| s.regulated).fold(0.0, f64::max),
        error: 1.0 - best.map_or(0.0, |b| b.1),
        best_candidate: best.map(|b| b.0),
        elapsed_s: elapsed,
        candidates_per_minute: if elapsed > 0.0 {
            finished as f64 * 60.0 / elapsed
        } else {
            0.0
        },
        training_share: if capacity > 0.0 {
            (seconds.iter().sum::<f64>() / capacity).min(1.0)
        } else {
            0.0
        },
        search_seconds: busy.0,
        master_seconds: busy.1,
    };
    doc.epoch_seconds = Stats::from_samples(&seconds);
    doc.invalid_because = invalid_because(&Conditions {
        elapsed_s: elapsed,
        error: doc.score.error,
        imagenet_224: checks.imagenet_224,
        start_resnet50: checks.start_resnet50,
        eval_images: checks.eval_images,
        precision: checks.precision,
    });
    doc.valid = doc.invalid_because.is_empty();
}
