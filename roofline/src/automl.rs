//! `automl.json` (schema `roofline/automl/v1`): an AIPerf AutoML run — every candidate network
//! the search made and trained, the FLOPS time series, the score, the regulated score and
//! whether the run is valid by AIPerf's rules. Rewritten (atomically) after every finished
//! epoch, so that an interrupted run keeps what it found and can be resumed from it.

use crate::stats::Stats;
use crate::validate::{non_negative, positive, Invalid, Validate};
use crate::{ModelError, Provenance};
use serde::{Deserialize, Serialize};

/// The schema tag every `automl.json` of this version carries.
pub const AUTOML_SCHEMA: &str = "roofline/automl/v1";

/// AIPerf's rules (paper, table IV): at least an hour, at least FP16, an error of at most 30 %
/// (the paper's text says 35 %; the table is kept).
pub const MIN_SECONDS: f64 = 3600.0;
pub const MAX_ERROR: f64 = 0.30;

/// Operations per image by AIPerf's rules.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Ops {
    pub forward: f64,
    pub backward: f64,
    /// Forward, backward and update: what one training image costs.
    pub total: f64,
}

/// How a candidate's training ended.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "status")]
pub enum Outcome {
    /// Handed out, not finished (a resumed run trains it again).
    Running,
    /// All its epochs.
    Trained,
    /// Its validation accuracy stopped improving for `patience` epochs.
    EarlyStopped,
    /// The run's time budget ended it; its finished epochs count.
    Cut,
    /// Its worker sent nothing for longer than the stall limit: the trial was ended and the
    /// candidate handed to another worker (as a new candidate with the same network).
    Stalled,
    /// Its worker failed (the message).
    Failed { why: String },
}

/// One finished epoch of a candidate.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Epoch {
    pub epoch: usize,
    pub top1: f64,
    pub loss: f64,
    /// Training and evaluation, seconds.
    pub seconds: f64,
    /// AIPerf operations of the epoch: training images × total + evaluation images × forward.
    pub ops: f64,
    /// Seconds since the run began when it finished.
    pub at_s: f64,
    /// The candidate's training it belongs to: 0, or 1 for the per-trial TPE's second.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub pass: usize,
}

fn is_zero(n: &usize) -> bool {
    *n == 0
}

/// The per-trial TPE's second training of a candidate (AIPerf's, from round 4): its draw and
/// best top-1, and whether it beat the first (the candidate is then the second's).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Retrain {
    pub batch: usize,
    pub kernel: usize,
    /// Drawn from [0, 0.2] as the reference draws it. The reference sets it on a network's
    /// dropout layers, and no candidate has one there or here (its deeper morphism stops at the
    /// global pooling, and no other adds one): recorded, with no effect in either.
    pub dropout: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top1: Option<f64>,
    pub won: bool,
}

/// How many of a network's layers with weights a pretrained file (`--init`) filled; the rest
/// started from their own initialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Filled {
    pub layers: usize,
    pub of: usize,
}

/// One candidate network.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Candidate {
    pub id: usize,
    /// The trained network it was made from (none for the starting network).
    pub parent: Option<usize>,
    /// The morphisms from the parent, in order (`roofline_workloads::graph::morph::Morphism`).
    pub morphisms: Vec<serde_json::Value>,
    /// The network (`roofline_workloads::graph::Description`).
    pub description: serde_json::Value,
    pub parameters: f64,
    pub ops_per_image: Ops,
    /// Hyper-parameters: images per step, and the kernel of the layers deeper inserts.
    pub batch: usize,
    pub kernel: usize,
    /// Its round (AIPerf's warm-up rounds train longer each), epochs planned and patience.
    pub round: usize,
    pub epochs_planned: usize,
    pub patience: usize,
    /// The search's expectation: the GP's mean accuracy and its upper confidence bound.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected: Option<(f64, f64)>,
    pub worker: usize,
    pub started_s: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finished_s: Option<f64>,
    pub epochs: Vec<Epoch>,
    /// AIPerf's predicted accuracy at epoch 90 (trials of 10 to 79 epochs: the validation
    /// curve and the anchor (120, 0.75) fitted, less twice the fit's RMSE).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub predicted_top1: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retrain: Option<Retrain>,
    /// Its layers filled from `--init`'s file (AIPerf's start: every candidate from the
    /// pretrained file, never its parent); none when it started from its parent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretrained: Option<Filled>,
    #[serde(flatten)]
    pub outcome: Outcome,
}

impl Candidate {
    /// The best observed top-1.
    pub fn best_top1(&self) -> Option<f64> {
        self.epochs.iter().map(|e| e.top1).reduce(f64::max)
    }
}

/// One point of the time series (every 0.1 hour; AIPerf's `score.py` every hour).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Sample {
    pub at_s: f64,
    /// Operations of every finished epoch so far.
    pub ops: f64,
    /// Those operations over the time from the start to the end of the last of those epochs
    /// (`score.py`'s `run_sec`: the latest epoch's end, not the sample's moment).
    pub flops: f64,
    /// 1 − the best top-1 so far.
    pub error: f64,
    /// −ln(error) × FLOPS.
    pub regulated: f64,
}

/// The score.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AutomlScore {
    /// AIPerf's score: the series' highest FLOPS.
    pub flops: f64,
    /// The series' highest regulated score.
    pub regulated: f64,
    pub error: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub best_candidate: Option<usize>,
    pub elapsed_s: f64,
    pub candidates_per_minute: f64,
    /// The share of the workers' time spent in training and evaluation (the rest: the master,
    /// the search, building children and hand-offs).
    pub training_share: f64,
    /// Seconds the workers spent choosing candidates (the GP, the annealing), all together.
    #[serde(default)]
    pub search_seconds: f64,
    /// Seconds the master was busy (recording, hand-outs, the watchdog, writing the history),
    /// its waits for the workers left out.
    #[serde(default)]
    pub master_seconds: f64,
}

impl AutomlScore {
    /// A run's score before anything is measured (error 1: nothing learnt yet).
    pub fn fresh() -> AutomlScore {
        AutomlScore {
            flops: 0.0,
            regulated: 0.0,
            error: 1.0,
            best_candidate: None,
            elapsed_s: 0.0,
            candidates_per_minute: 0.0,
            training_share: 0.0,
            search_seconds: 0.0,
            master_seconds: 0.0,
        }
    }
}

/// A worker: its rank(s), trials and busy time.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Worker {
    pub id: usize,
    pub trials: usize,
    pub train_seconds: f64,
    pub alive: bool,
}

/// The whole `automl.json`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Automl {
    pub schema: String,
    pub provenance: Provenance,
    /// Every setting, by name.
    pub configuration: serde_json::Map<String, serde_json::Value>,
    /// Whether the run still goes on (false once it ended).
    pub running: bool,
    pub candidates: Vec<Candidate>,
    pub series: Vec<Sample>,
    pub workers: Vec<Worker>,
    pub score: AutomlScore,
    /// Seconds per epoch over all candidates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch_seconds: Option<Stats>,
    /// Valid by AIPerf's rules, and why not.
    pub valid: bool,
    #[serde(default)]
    pub invalid_because: Vec<String>,
    /// Where this run departs from AIPerf's reference code, each with its reason (a valid run
    /// with deviations is not comparable with the reference's results).
    #[serde(default)]
    pub deviations: Vec<String>,
}

impl Automl {
    pub fn from_json(text: &str) -> Result<Automl, ModelError> {
        crate::from_json_with_schema(text, AUTOML_SCHEMA)
    }

    pub fn read(path: &std::path::Path) -> Result<Automl, ModelError> {
        crate::read_with_schema(path, AUTOML_SCHEMA)
    }

    pub fn to_json(&self) -> Result<String, ModelError> {
        serde_json::to_string_pretty(self).map_err(ModelError::Json)
    }

    /// The report's first line.
    pub fn headline(&self) -> String {
        format!(
            "AIPerf AutoML: {} candidates in {:.0} s{}",
            self.candidates.len(),
            self.score.elapsed_s,
            if self.valid {
                String::new()
            } else {
                format!(" — NOT VALID: {}", self.invalid_because.join("; "))
            }
        )
    }
}

/// The series point at `at_s` with `ops` done by epochs the last of which ended at `last_end_s`,
/// and `best_top1` the best accuracy: FLOPS is `ops / last_end_s`, as AIPerf's `score.py`
/// divides the operations of the epochs finished by a sample's time by the time to the latest
/// of them (its `run_sec`).
pub fn sample(at_s: f64, ops: f64, last_end_s: f64, best_top1: Option<f64>) -> Sample {
    let flops = if last_end_s > 0.0 {
        ops / last_end_s
    } else {
        0.0
    };
    let error = 1.0 - best_top1.unwrap_or(0.0);
    Sample {
        at_s,
        ops,
        flops,
        error,
        regulated: crate::score::aiperf_regulated(flops, 1.0 - error),
    }
}

/// The held-out images AIPerf's reference evaluates and counts (ImageNet's validation set).
pub const EVAL_IMAGES: usize = 50_000;

/// ImageNet's training images, and the fixed number AIPerf's `score.py` counts an epoch by.
pub const IMAGENET_TRAIN_IMAGES: usize = 1_281_167;
pub const SCORE_PY_TRAIN_IMAGES: usize = 1_280_000;

/// The operations of one finished epoch of a candidate of `train_ops` and `eval_ops` per image
/// that trained `trained` images and evaluated `evaluated`, on a training set of
/// `train_images`: on ImageNet's set as `score.py` counts them (a fixed 1,280,000 training and
/// 50,000 held-out images); on any other set the images it trained and evaluated (`score.py`'s
/// constants are ImageNet's).
pub fn epoch_ops(
    train_ops: f64,
    eval_ops: f64,
    trained: usize,
    evaluated: usize,
    train_images: usize,
) -> f64 {
    let (t, e) = if counts_as_score_py(train_images) {
        (SCORE_PY_TRAIN_IMAGES, EVAL_IMAGES)
    } else {
        (trained, evaluated)
    };
    t as f64 * train_ops + e as f64 * eval_ops
}

/// Whether an epoch over `train_images` is counted as `score.py` counts it ([`epoch_ops`]).
pub fn counts_as_score_py(train_images: usize) -> bool {
    train_images == IMAGENET_TRAIN_IMAGES
}

/// What AIPerf's validity rules look at.
#[derive(Clone, Debug, PartialEq)]
pub struct Conditions {
    pub elapsed_s: f64,
    pub error: f64,
    /// ImageNet at 224².
    pub imagenet_224: bool,
    /// The search started from ResNet-50 (width 1, 3,4,6,3 bottlenecks, 1000 classes).
    pub start_resnet50: bool,
    /// Held-out images evaluated after every epoch.
    pub eval_images: usize,
    /// The precision the candidates train in.
    pub precision: crate::Precision,
}

/// Why a run is not valid by AIPerf's rules (empty: valid).
pub fn invalid_because(c: &Conditions) -> Vec<String> {
    use crate::Precision as P;
    let mut why = Vec::new();
    if c.elapsed_s < MIN_SECONDS {
        why.push(format!(
            "ran {:.0} s, the rules ask at least {MIN_SECONDS:.0} s",
            c.elapsed_s
        ));
    }
    if c.error > MAX_ERROR {
        why.push(format!(
            "error {:.1} %, the rules allow at most {:.0} % (table IV; the paper's text says 35 %)",
            c.error * 100.0,
            MAX_ERROR * 100.0
        ));
    }
    if !c.imagenet_224 {
        why.push("not ImageNet at 224×224".into());
    }
    if !c.start_resnet50 {
        why.push("the search did not start from ResNet-50 (width 1, 3,4,6,3 bottlenecks)".into());
    }
    if c.eval_images != EVAL_IMAGES {
        why.push(format!(
            "{} held-out images evaluated, the reference evaluates and counts ImageNet's {EVAL_IMAGES}",
            c.eval_images
        ));
    }
    if matches!(c.precision, P::Fp8 | P::Int8) {
        why.push(format!("trained in {:?}, below FP16", c.precision));
    }
    why
}

fn fraction(id: &str, field: &str, v: f64) -> Result<(), Invalid> {
    if (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(Invalid {
            id: id.into(),
            field: field.into(),
            why: format!("is {v}: it lies in [0, 1]"),
        })
    }
}

impl Validate for Automl {
    fn validate(&self) -> Result<(), Invalid> {
        let mut ids: Vec<usize> = self.candidates.iter().map(|c| c.id).collect();
        ids.sort_unstable();
        if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
            return Err(Invalid {
                id: format!("candidate {}", w[0]),
                field: "id".into(),
                why: "appears twice".into(),
            });
        }
        for c in &self.candidates {
            let id = format!("candidate {}", c.id);
            positive(&id, "ops_per_image.total", c.ops_per_image.total)?;
            positive(&id, "parameters", c.parameters)?;
            if c.batch == 0 {
                return Err(Invalid {
                    id,
                    field: "batch".into(),
                    why: "is 0".into(),
                });
            }
            if let Some(p) = c.parent {
                if p >= c.id {
                    return Err(Invalid {
                        id,
                        field: "parent".into(),
                        why: format!("is {p}: a parent comes before its child"),
                    });
                }
            }
            for e in &c.epochs {
                fraction(&id, "top1", e.top1)?;
                non_negative(&id, "seconds", e.seconds)?;
                positive(&id, "ops", e.ops)?;
            }
        }
        let mut last = 0.0;
        for s in &self.series {
            non_negative("series", "at_s", s.at_s)?;
            if s.at_s < last {
                return Err(Invalid {
                    id: "series".into(),
                    field: "at_s".into(),
                    why: format!("goes back from {last} to {}", s.at_s),
                });
            }
            last = s.at_s;
            non_negative("series", "flops", s.flops)?;
            fraction("series", "error", s.error)?;
            non_negative("series", "regulated", s.regulated)?;
        }
        non_negative("score", "flops", self.score.flops)?;
        non_negative("score", "elapsed_s", self.score.elapsed_s)?;
        non_negative("score", "search_seconds", self.score.search_seconds)?;
        non_negative("score", "master_seconds", self.score.master_seconds)?;
        non_negative(
            "score",
            "candidates_per_minute",
            self.score.candidates_per_minute,
        )?;
        non_negative("score", "regulated", self.score.regulated)?;
        fraction("score", "training_share", self.score.training_share)?;
        fraction("score", "error", self.score.error)?;
        if self.valid != self.invalid_because.is_empty() {
            return Err(Invalid {
                id: "verdict".into(),
                field: "valid".into(),
                why: "disagrees with invalid_because".into(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Precision;

    /// `score.py`'s divisor: 6 epochs' 3.6e15 operations, the last ending at 1,800 s, sampled
    /// at 3,600 s: 2 TFLOP/s (over the sample's 3,600 s it would have been 1).
    #[test]
    fn a_sample_divides_by_the_last_epochs_end() {
        let s = sample(3600.0, 3.6e15, 1800.0, Some(0.75));
        assert_eq!(s.flops, 2e12);
        assert!((s.regulated - (-(0.25f64).ln()) * 2e12).abs() < 1.0);
        assert_eq!(sample(10.0, 0.0, 0.0, None).flops, 0.0);
    }

    /// An ImageNet epoch counts `score.py`'s 1,280,000 and 50,000 images whatever the batch
    /// left out (1,281,167 at batch 256 trains 5,004 steps, 1,281,024 images); another set
    /// counts what it trained and evaluated.
    #[test]
    fn an_imagenet_epoch_counts_as_score_py() {
        let imagenet = epoch_ops(3.0, 1.0, 5004 * 256, 50_000, IMAGENET_TRAIN_IMAGES);
        assert_eq!(imagenet, 3.0 * 1_280_000.0 + 50_000.0);
        assert_eq!(epoch_ops(3.0, 1.0, 256, 128, 256), 3.0 * 256.0 + 128.0);
        assert_eq!(
            epoch_ops(3.0, 1.0, 1024, 10, 1_000_000),
            3.0 * 1024.0 + 10.0
        );
    }

    /// AIPerf's validity rules, each alone: an hour, 30 % error, ImageNet at 224², ResNet-50 as
    /// the start, ImageNet's 50 000 held-out images, FP16 or wider.
    #[test]
    fn each_validity_rule_is_checked() {
        let ok = Conditions {
            elapsed_s: 3600.0,
            error: 0.30,
            imagenet_224: true,
            start_resnet50: true,
            eval_images: EVAL_IMAGES,
            precision: Precision::F16,
        };
        assert!(invalid_because(&ok).is_empty());
        let cases: [(Conditions, &str); 7] = [
            (
                Conditions {
                    elapsed_s: 3599.0,
                    ..ok.clone()
                },
                "at least 3600 s",
            ),
            (
                Conditions {
                    error: 0.31,
                    ..ok.clone()
                },
                "at most 30 %",
            ),
            (
                Conditions {
                    imagenet_224: false,
                    ..ok.clone()
                },
                "not ImageNet",
            ),
            (
                Conditions {
                    start_resnet50: false,
                    ..ok.clone()
                },
                "ResNet-50",
            ),
            (
                Conditions {
                    eval_images: 128,
                    ..ok.clone()
                },
                "128 held-out images",
            ),
            (
                Conditions {
                    precision: Precision::Fp8,
                    ..ok.clone()
                },
                "below FP16",
            ),
            (
                Conditions {
                    precision: Precision::Int8,
                    ..ok.clone()
                },
                "below FP16",
            ),
        ];
        for (c, want) in cases {
            let why = invalid_because(&c);
            assert_eq!(why.len(), 1, "{why:?}");
            assert!(why[0].contains(want), "{why:?} lacks {want}");
        }
        for p in [
            Precision::Bf16,
            Precision::Tf32,
            Precision::F32,
            Precision::F64,
        ] {
            assert!(invalid_because(&Conditions {
                precision: p,
                ..ok.clone()
            })
            .is_empty());
        }
    }
}
