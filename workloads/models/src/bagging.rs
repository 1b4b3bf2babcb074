//! HPC AI500 V3.0 bagging for the embedded trainer: how M base models split the ranks (P each),
//! each model's bootstrap sample of the training set (drawn with replacement, seeded), the
//! held-out predictions a model keeps for the ensemble, and the ensemble's quality: the models'
//! class probabilities averaged (classification), or their detections fused (detection; see
//! [`fuse_detections`]). V3.0's equations (bagged APC, FLOPS per epoch) are
//! `roofline_model::bagging`'s.

use crate::data::Rng;
use crate::detect::boxes::iou;
use crate::detect::map::{mean_average_precision, Detection, Truth};
use std::sync::Arc;

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum BaggingError {
    #[error("--bagging 0: an ensemble needs at least one model")]
    NoModel,
    #[error(
        "--bagging {models} over {ranks} ranks: {ranks} is not a multiple of {models}, so the models cannot have the same number of ranks each (start {models}·P ranks, e.g. mpirun -np {suggestion})"
    )]
    Uneven {
        models: usize,
        ranks: usize,
        suggestion: usize,
    },
    #[error(
        "--bagging {models}: the global batch {batch} does not divide among the {per_model} ranks of each model"
    )]
    Batch {
        models: usize,
        batch: usize,
        per_model: usize,
    },
}

/// M models of P ranks each over the world's ranks: world rank r trains model r / P (a
/// model's ranks are consecutive, so that a model stays on as few nodes as the launcher's
/// placement allows).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    pub models: usize,
    pub ranks_per_model: usize,
}

impl Plan {
    /// `models` models over `ranks` ranks (1 without a launcher), each model of `batch`.
    pub fn new(models: usize, ranks: usize, batch: usize) -> Result<Plan, BaggingError> {
        if models == 0 {
            return Err(BaggingError::NoModel);
        }
        if !ranks.is_multiple_of(models) && ranks > 1 {
            return Err(BaggingError::Uneven {
                models,
                ranks,
                suggestion: models * ranks.div_ceil(models),
            });
        }
        let per_model = (ranks / models).max(1);
        if !batch.is_multiple_of(per_model) {
            return Err(BaggingError::Batch {
                models,
                batch,
                per_model,
            });
        }
        Ok(Plan {
            models,
            ranks_per_model: per_model,
        })
    }

    /// Sys_scale = M × P.
    pub fn sys_scale(&self) -> usize {
        self.models * self.ranks_per_model
    }

    /// The model (0-based) world rank `rank` trains.
    pub fn model_of(&self, rank: usize) -> usize {
        rank / self.ranks_per_model
    }
}

/// A base model of the ensemble: which one, its seeds, its bootstrap sample.
#[derive(Clone, Debug, PartialEq)]
pub struct Member {
    /// 0-based.
    pub model: usize,
    /// The seed of its initialisation and data order.
    pub seed: u64,
    pub sample_seed: u64,
    /// Positions in the training set, `n` of them drawn with replacement.
    pub sample: Arc<Vec<usize>>,
}

impl Member {
    /// Model `model` of an ensemble started from `seed`, over a training set of `n` images: its
    /// own seed and its bootstrap sample, both functions of (seed, model) alone.
    pub fn new(seed: u64, model: usize, n: usize) -> Member {
        let sample_seed = seed ^ 0xBA66_1D00_0000_0000 ^ (model as u64).wrapping_mul(0x9E37_79B9);
        Member {
            model,
            seed: seed.wrapping_add(1000 * model as u64),
            sample_seed,
            sample: Arc::new(bootstrap(n, sample_seed)),
        }
    }

    /// Distinct images in the sample.
    pub fn distinct(&self) -> usize {
        let mut seen = vec![false; self.sample.len()];
        for &i in self.sample.iter() {
            if let Some(s) = seen.get_mut(i) {
                *s = true;
            }
        }
        seen.iter().filter(|s| **s).count()
    }
}

/// `n` draws with replacement from `0..n` (Breiman's bootstrap: each image appears a
/// Poisson(1)-like number of times, about 63.2% of them at least once).
pub fn bootstrap(n: usize, seed: u64) -> Vec<usize> {
    let mut rng = Rng::new(seed);
    (0..n)
        .map(|_| (rng.next_u64() % n.max(1) as u64) as usize)
        .collect()
}

/// A model's predictions on the held-out images, kept for the ensemble.
#[derive(Clone, Debug, PartialEq)]
pub enum Predictions {
    /// Softmax probabilities (images × classes, row-major) and the true labels.
    Classes {
        classes: usize,
        probabilities: Vec<f32>,
        labels: Vec<usize>,
    },
    /// Every image's detections (`image` is the held-out image's id) and the ground truth.
    Boxes {
        classes: usize,
        detections: Vec<Detection>,
        truths: Vec<Truth>,
    },
}

/// The ensemble's quality and how it was formed.
#[derive(Clone, Debug, PartialEq)]
pub struct Ensemble {
    /// Top-1 (classification) or mAP@0.5 (detection).
    pub quality: f64,
    /// Top-5 (classification).
    pub top5: Option<f64>,
    pub rule: &'static str,
}

/// How the classifier's models are combined.
pub const MEAN_PROBABILITIES: &str =
    "the models' softmax probabilities averaged, then Top-1/Top-5 of the mean";
/// How the detector's models are combined.
pub const FUSED_BOXES: &str = "weighted box fusion: per image and class, the models' detections clustered greedily by score (IoU >= 0.55 with the cluster's best box, one box per model), each cluster's box the score-weighted mean of its boxes and its score the sum of their scores / M; the best 100 per image kept; mAP@0.5 of the fused detections";

/// Why the models' predictions make no ensemble.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum EnsembleError {
    #[error("no model's predictions")]
    Empty,
    #[error("the models predicted different kinds of things")]
    MixedKinds,
    #[error("the models predicted different held-out images")]
    DifferentImages,
    #[error("the held-out images hold no ground-truth box")]
    NoTruth,
}

/// The ensemble of `members`' predictions (one per model, of the same held-out images).
pub fn ensemble(members: &[Predictions]) -> Result<Ensemble, EnsembleError> {
    match members.first() {
        None => Err(EnsembleError::Empty),
        Some(Predictions::Classes {
            classes, labels, ..
        }) => {
            let mut mean = vec![0.0f64; labels.len() * classes];
            for m in members {
                let Predictions::Classes {
                    probabilities: p,
                    labels: l,
                    ..
                } = m
                else {
                    return Err(EnsembleError::MixedKinds);
                };
                if p.len() != mean.len() || l != labels {
                    return Err(EnsembleError::DifferentImages);
                }
                for (a, b) in mean.iter_mut().zip(p) {
                    *a += *b as f64 / members.len() as f64;
                }
            }
            let (t1, t5) = top_k(&mean, labels, *classes);
            Ok(Ensemble {
                quality: t1,
                top5: Some(t5),
                rule: MEAN_PROBABILITIES,
            })
        }
        Some(Predictions::Boxes {
            classes, truths, ..
        }) => {
            let mut per_model = Vec::with_capacity(members.len());
            for m in members {
                let Predictions::Boxes { detections, .. } = m else {
                    return Err(EnsembleError::MixedKinds);
                };
                per_model.push(detections.clone());
            }
            let fused = fuse_detections(&per_model, 0.55, 100);
            let (map, _) = mean_average_precision(&fused, truths, *classes, 0.5);
            Ok(Ensemble {
                quality: map.ok_or(EnsembleError::NoTruth)?,
                top5: None,
                rule: FUSED_BOXES,
            })
        }
    }
}

/// Top-1 and Top-5 of probabilities (rows of `classes`) against `labels`.
pub fn top_k(p: &[f64], labels: &[usize], classes: usize) -> (f64, f64) {
    let (mut t1, mut t5) = (0usize, 0usize);
    for (row, &l) in p.chunks(classes.max(1)).zip(labels) {
        let higher = row.iter().filter(|v| **v > row[l]).count();
        t1 += usize::from(higher == 0);
        t5 += usize::from(higher < 5);
    }
    let n = labels.len().max(1) as f64;
    (t1 as f64 / n, t5 as f64 / n)
}

/// Weighted box fusion of M models' detections (Solovyev et al., simplified): per image and
/// class, all boxes by score, best first; each box not yet taken starts a cluster, which takes
/// from each other model its best remaining box of IoU ≥ `iou_min` with the starting box; the
/// cluster's box is the score-weighted mean of its boxes, its score the sum of their scores
/// divided by M (a box every model found keeps its probability, a box one model found counts
/// 1/M). The best `keep` per image.
pub fn fuse_detections(per_model: &[Vec<Detection>], iou_min: f64, keep: usize) -> Vec<Detection> {
    let m = per_model.len().max(1) as f64;
    let mut all: Vec<(usize, Detection)> = per_model
        .iter()
        .enumerate()
        .flat_map(|(k, d)| d.iter().map(move |x| (k, *x)))
        .collect();
    all.sort_by(|a, b| {
        (a.1.image, a.1.class)
            .cmp(&(b.1.image, b.1.class))
            .then(b.1.score.total_cmp(&a.1.score))
    });
    let mut out: Vec<Detection> = Vec::new();
    let mut start = 0;
    while start < all.len() {
        let key = (all[start].1.image, all[start].1.class);
        let end = start
            + all[start..]
                .iter()
                .take_while(|(_, d)| (d.image, d.class) == key)
                .count();
        let group = &all[start..end];
        let mut taken = vec![false; group.len()];
        for i in 0..group.len() {
            if taken[i] {
                continue;
            }
            taken[i] = true;
            let (mi, lead) = group[i];
            let mut members = vec![lead];
            let mut models = vec![mi];
            for j in i + 1..group.len() {
                let (mj, d) = group[j];
                if !taken[j] && !models.contains(&mj) && iou(&lead.bbox, &d.bbox) >= iou_min {
                    taken[j] = true;
                    models.push(mj);
                    members.push(d);
                }
            }
            let w: f64 = members.iter().map(|d| d.score).sum();
            let mut bbox = [0.0; 4];
            for d in &members {
                for (b, v) in bbox.iter_mut().zip(d.bbox) {
                    *b += v * d.score / w.max(1e-300);
                }
            }
            out.push(Detection {
                image: key.0,
                class: key.1,
                score: w / m,
                bbox,
            });
        }
        start = end;
    }
    // The best `keep` of each image.
    out.sort_by(|a, b| a.image.cmp(&b.image).then(b.score.total_cmp(&a.score)));
    let mut kept = Vec::with_capacity(out.len());
    let mut count = 0;
    for (i, d) in out.iter().enumerate() {
        if i > 0 && out[i - 1].image != d.image {
            count = 0;
        }
        if count < keep {
            kept.push(*d);
        }
        count += 1;
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::train::RunOptions;

    #[test]
    fn plans_split_the_ranks_or_say_why_not() {
        let p = Plan::new(2, 4, 8).unwrap();
        assert_eq!((p.models, p.ranks_per_model, p.sys_scale()), (2, 2, 4));
        assert_eq!(
            (p.model_of(0), p.model_of(1), p.model_of(2), p.model_of(3)),
            (0, 0, 1, 1)
        );
        // Without a launcher every model has the one process's share.
        assert_eq!(Plan::new(3, 1, 5).unwrap().ranks_per_model, 1);
        let e = Plan::new(3, 4, 8).unwrap_err();
        assert_eq!(
            e,
            BaggingError::Uneven {
                models: 3,
                ranks: 4,
                suggestion: 6
            }
        );
        assert!(e.to_string().contains("4 is not a multiple of 3"), "{e}");
        assert!(e.to_string().contains("mpirun -np 6"), "{e}");
        assert_eq!(Plan::new(0, 1, 8), Err(BaggingError::NoModel));
        assert!(Plan::new(2, 4, 3)
            .unwrap_err()
            .to_string()
            .contains("batch 3"));
    }

    /// A bootstrap sample: n draws in range, repeats, about 63.2% distinct for large n, the
    /// same for a seed, different between models.
    #[test]
    fn bootstrap_samples_differ_between_models_and_repeat_images() {
        let n = 20_000;
        let a = Member::new(7, 0, n);
        let b = Member::new(7, 1, n);
        assert_eq!(a.sample.len(), n);
        assert!(a.sample.iter().all(|&i| i < n));
        assert_eq!(a, Member::new(7, 0, n), "a function of (seed, model)");
        assert_ne!(a.sample, b.sample);
        assert_ne!(a.seed, b.seed);
        let f = a.distinct() as f64 / n as f64;
        assert!((f - (1.0 - (-1.0f64).exp())).abs() < 0.01, "{f}");
        assert!(bootstrap(0, 1).is_empty());
    }

    /// Three small classifiers, each on its bootstrap sample of the synthetic set: different
    /// models (parameters, held-out predictions), and their ensemble at least as good as the
    /// mean of its members. (Early in training it need not be: at 10 steps these three score
    /// 0.43, 0.67, 0.73 and their mean probabilities 0.58.)
    #[test]
    fn an_ensemble_of_bootstrap_models_beats_its_mean_member() {
        use crate::resnet::{Config, Version};
        use crate::train::{train, Decay, Quiet, Source, TrainConfig};
        let base = TrainConfig {
            model: Config {
                version: Version::V1_5,
                blocks: [1, 1, 0, 0],
                width: 0.125,
                classes: 4,
                zero_init_residual: false,
            },
            data: Source::Synthetic(crate::data::Synthetic::new(4, 32, 5)),
            train_images: 128,
            eval_images: 128,
            base_lr_per_256: 2.0,
            label_smoothing: 0.0,
            decay: Decay::Cosine,
            run: RunOptions {
                batch: 16,
                steps: 14,
                warmup_steps: 4,
                seed: 3,
                target: None,
                stop_at_target: true,
                decay_all: false,
                eval_every: 14,
                checkpoint: None,
                resume: None,
                stop_at: None,
                checkpoint_every: None,
                comm: Default::default(),
                ensemble: None,
                stop: None,
                init: None,
            },
        };
        let mut preds = Vec::new();
        let mut quality = Vec::new();
        let mut norms = Vec::new();
        for k in 0..3 {
            let m = Member::new(base.run.seed, k, base.train_images);
            let cfg = TrainConfig {
                run: RunOptions {
                    seed: m.seed,
                    ensemble: Some(m),
                    ..base.run.clone()
                },
                ..base.clone()
            };
            let s = train::<f32, _>(&cfg, &Quiet, None).unwrap();
            quality.push(s.evals.last().unwrap().top1);
            norms.push(s.param_norm);
            preds.push(s.predictions.unwrap());
        }
        assert!(norms[0] != norms[1] && norms[1] != norms[2], "{norms:?}");
        assert_ne!(preds[0], preds[1]);
        // The kept predictions are the model's: their Top-1 is its last evaluation's.
        let Predictions::Classes {
            probabilities,
            labels,
            classes,
        } = &preds[0]
        else {
            panic!("class predictions")
        };
        let p64: Vec<f64> = probabilities.iter().map(|v| *v as f64).collect();
        assert_eq!(top_k(&p64, labels, *classes).0, quality[0]);
        let mean = quality.iter().sum::<f64>() / 3.0;
        let e = ensemble(&preds).unwrap();
        eprintln!("models {quality:?}, ensemble {}", e.quality);
        // Partly trained (here about 0.55, 0.90 and 1.0): the ensemble has something to add.
        assert!(mean > 0.4, "the models learned: {quality:?}");
        assert!(quality.iter().any(|q| *q < 0.9), "{quality:?}");
        assert!(
            e.quality >= mean,
            "ensemble {} < mean member {mean}",
            e.quality
        );
    }

    #[test]
    fn averaged_probabilities_by_hand() {
        // Two images, three classes. Model A: image 0 → class 0 (wrong, label 1), image 1 →
        // class 2 (right). Model B: image 0 → class 1 strongly. Mean: image 0 → 1, image 1 → 2.
        let a = Predictions::Classes {
            classes: 3,
            probabilities: vec![0.5, 0.4, 0.1, 0.1, 0.2, 0.7],
            labels: vec![1, 2],
        };
        let b = Predictions::Classes {
            classes: 3,
            probabilities: vec![0.1, 0.8, 0.1, 0.3, 0.3, 0.4],
            labels: vec![1, 2],
        };
        let e = ensemble(&[a.clone(), b]).unwrap();
        assert_eq!(e.quality, 1.0);
        assert_eq!(ensemble(&[a]).unwrap().quality, 0.5);
        assert_eq!(top_k(&[0.1, 0.2, 0.7], &[0], 3), (0.0, 1.0));
    }

    fn det(image: usize, class: usize, score: f64, bbox: [f64; 4]) -> Detection {
        Detection {
            image,
            class,
            score,
            bbox,
        }
    }

    /// Two models agreeing on a box fuse it into one at their weighted mean with the mean
    /// score; a box one model alone found keeps half its score; classes and images stay apart.
    #[test]
    fn fused_detections_by_hand() {
        let a = vec![
            det(0, 0, 0.9, [0.0, 0.0, 10.0, 10.0]),
            det(0, 0, 0.6, [50.0, 50.0, 60.0, 60.0]),
            det(1, 0, 0.8, [0.0, 0.0, 10.0, 10.0]),
        ];
        let b = vec![
            det(0, 0, 0.3, [1.0, 1.0, 11.0, 11.0]),
            det(0, 1, 0.5, [0.0, 0.0, 10.0, 10.0]),
        ];
        let f = fuse_detections(&[a, b], 0.55, 100);
        assert_eq!(f.len(), 4);
        let fused = f
            .iter()
            .find(|d| d.image == 0 && d.class == 0 && d.bbox[0] < 5.0)
            .unwrap();
        assert!((fused.score - 0.6).abs() < 1e-12);
        // (0.9·0 + 0.3·1) / 1.2 = 0.25.
        assert!((fused.bbox[0] - 0.25).abs() < 1e-12 && (fused.bbox[2] - 10.25).abs() < 1e-12);
        let alone = f.iter().find(|d| d.bbox[0] == 50.0).unwrap();
        assert!((alone.score - 0.3).abs() < 1e-12);
        assert!(f
            .iter()
            .any(|d| d.class == 1 && (d.score - 0.25).abs() < 1e-12));
        assert!(f
            .iter()
            .any(|d| d.image == 1 && (d.score - 0.4).abs() < 1e-12));
        // Capped per image, best first.
        let many: Vec<Detection> = (0..5)
            .map(|i| {
                det(
                    0,
                    0,
                    i as f64 / 10.0,
                    [20.0 * i as f64, 0.0, 20.0 * i as f64 + 5.0, 5.0],
                )
            })
            .collect();
        let capped = fuse_detections(&[many], 0.55, 3);
        assert_eq!(capped.len(), 3);
        assert!((capped[0].score - 0.4).abs() < 1e-12);
    }
}
