//! A training run as HPC AI500's score counts it: the run's record (time-to-quality, FLOPS,
//! VFLOPS, energy, AIPerf's regulated score, V3.0's FLOPS per epoch), the configuration the report
//! lists, and why a run is not comparable with published scores.

use super::prepare::{Kind, Prepared, Resolution, Spec};
use crate::bagging::Plan;
use crate::resnet::Version;
use crate::run::Depth;
use crate::train::Summary;
use roofline_model::placement::Energy;
use roofline_model::score::{aiperf_regulated, vflops, Level, Run, Target};
use serde_json::json;

/// AIPerf's FLOPS curve of `s`, `batch` images a step: after each step, the operations of
/// every step so far over their wall time so far (AIPerf reports the benchmark's FLOPS as it
/// grows with the run, and "the highest FLOPS is considered as the final score"), not each
/// step's own rate.
pub fn flops_series(s: &Summary, batch: usize) -> Vec<f64> {
    cumulative_rate(
        s.flops_step_per_image * batch as f64,
        s.timing.iter().map(|t| t.seconds),
    )
}

/// After each step of `seconds`, `ops` a step: the operations so far over the time so far.
fn cumulative_rate(ops: f64, seconds: impl Iterator<Item = f64>) -> Vec<f64> {
    let mut elapsed = 0.0;
    seconds
        .enumerate()
        .map(|(i, t)| {
            elapsed += t;
            ops * (i + 1) as f64 / elapsed.max(1e-12)
        })
        .collect()
}

/// How a score's runs are run and counted: HPC AI500 V2.0's rules, or the deviations asked for.
#[derive(Clone, Debug, PartialEq)]
pub struct Rules {
    /// Operations per image FLOPS counts: the paper's published count for its model.
    pub published_ops: Option<f64>,
    /// roofline's analytic training FLOPs per image (the placement's).
    pub analytic_ops: f64,
    /// Runs timed to the end of their epochs (§5.3.2), not stopped at the target.
    pub fixed_epochs: bool,
    /// Weight decay on every parameter (§5.4).
    pub decay_all: bool,
}

impl Rules {
    /// The rules of a score of `a` run as `run` says, whose model counts `analytic_ops` per
    /// image: the published count where the model, its resolution and classes are the paper's.
    pub fn of(a: &Spec, run: &crate::run::RunOptions, analytic_ops: f64) -> Rules {
        Rules {
            published_ops: papers_model(a)
                .then(|| roofline_model::score::published_ops_per_image(a.workload.name()))
                .flatten(),
            analytic_ops,
            fixed_epochs: !run.stop_at_target,
            decay_all: run.decay_all,
        }
    }

    /// The operations per sample a bagged run (HPC AI500 V3.0) counts: the paper's published
    /// count where this is the paper's model, as V2.0's FLOPS counts it (V3.0's APC example:
    /// 11 776 GFLOP for 512 images, 23 each), else `v3_analytic` (roofline's count by V3.0's
    /// table 3); and the analytic count beside it when the published one is counted.
    pub fn bagged_ops(&self, v3_analytic: f64) -> (f64, Option<f64>) {
        match self.published_ops {
            Some(p) => (p, Some(v3_analytic)),
            None => (v3_analytic, None),
        }
    }

    /// The operations per image FLOPS counts, and which count they are.
    pub fn ops(&self) -> (f64, &'static str) {
        match self.published_ops {
            Some(p) => (p, "published"),
            None => (self.analytic_ops, "analytic"),
        }
    }

    /// The rules as the report names them, one line each.
    pub fn describe(&self, workload: Kind) -> Vec<String> {
        let g = |x: f64| format!("{}FLOP", roofline_model::si(x));
        let table = "HPC AI500 V2.0 Table 10";
        vec![
            match self.published_ops {
                Some(p) => format!(
                    "operations: {} an image, the paper's count ({table}); roofline's analytic count, {}, is the placement's and is shown beside",
                    g(p),
                    g(self.analytic_ops)
                ),
                None => format!(
                    "operations: roofline's analytic count, {} an image (the paper's count, {table}, is its own model's)",
                    g(self.analytic_ops)
                ),
            },
            if self.fixed_epochs {
                format!(
                    "timing: from the first batch read to the end of the run's epochs (§5.3.2; the rules' {}), FLOPS over that whole time",
                    rule_epochs(workload)
                )
            } else {
                "timing: from the first batch read until the target was reached (--stop-at-target), FLOPS over that time".into()
            },
            if self.decay_all {
                "weight decay: 1e-4 on every parameter, batch norm's γ and β and the biases included (§5.4)".into()
            } else {
                "weight decay: 1e-4 on the convolution and classifier weights alone (--weight-decay-on weights)".into()
            },
            "aggregation: the runs with the highest and the lowest VFLOPS dropped, every figure averaged over the rest (§5.3.2)".into(),
        ]
    }
}

/// The epochs the rules train for: 90 (resnet50), 50 (ewa).
fn rule_epochs(w: Kind) -> usize {
    if w == Kind::Ewa {
        50
    } else {
        90
    }
}

/// The resolution the rules train at.
fn rule_resolution(w: Kind) -> Resolution {
    if w == Kind::Ewa {
        Resolution { h: 768, w: 1152 }
    } else {
        Resolution { h: 224, w: 224 }
    }
}

/// Whether `a` trains the paper's model: its depth, width, version, classes and resolution.
fn papers_model(a: &Spec) -> bool {
    let ewa = a.workload == Kind::Ewa;
    a.width == 1.0
        && a.depth == Depth([3, 4, 6, 3])
        && a.version == Version::V1_5
        && (ewa || a.classes == 1000)
        && a.resolution
            .is_none_or(|r| r == rule_resolution(a.workload))
}

/// Run `i` (seed `seed`) that ended with `s`, scored against `target` by `rules`;
/// `v3_per_image` is V3.0's training FLOPs per image, counted as a bagged run counts them
/// ([`Rules::bagged_ops`]: the published count for the paper's model), `energy` the run's.
#[allow(clippy::too_many_arguments)]
pub fn record(
    i: usize,
    seed: u64,
    s: &Summary,
    batch: usize,
    target: &Target,
    rules: &Rules,
    v3_per_image: f64,
    energy: &Energy,
) -> Run {
    let quality = s
        .evals
        .last()
        .map(|e| e.map.unwrap_or(e.top1))
        .unwrap_or(0.0);
    let top5 = s.evals.last().filter(|e| e.map.is_none()).map(|e| e.top5);
    // Timed from the first batch read: to the end of the epochs (the rules'), or to the target.
    let (reached, ttq) = if rules.fixed_epochs {
        (quality >= target.value, s.elapsed_seconds)
    } else {
        (
            s.time_to_quality.is_some(),
            s.time_to_quality.unwrap_or(s.elapsed_seconds),
        )
    };
    let seconds = ttq.max(1e-12);
    let (ops, count) = rules.ops();
    let flops = ops * s.images as f64 / seconds;
    let analytic = rules.analytic_ops * s.images as f64 / seconds;
    let v = vflops(flops, quality, target.value, target.exponent);
    let series = flops_series(s, batch);
    let (energy_j, watts) = (energy.joules_per_step, energy.average_watts);
    Run {
        run: i + 1,
        seed,
        time_to_quality_s: ttq,
        reached_target: reached,
        quality,
        top5,
        steps: s.steps,
        images: s.images,
        train_seconds: s.train_seconds,
        flops,
        ops_per_image: ops,
        ops_count: count.into(),
        analytic_flops: rules.published_ops.map(|_| analytic),
        fixed_epochs: rules.fixed_epochs,
        first_reached_s: s.time_to_quality,
        vflops: v,
        energy_j,
        average_watts: watts,
        vflops_per_watt: watts.map(|w| v / w),
        flops_per_watt: watts.map(|w| flops / w),
        flops_series_max: series.iter().copied().fold(0.0, f64::max),
        flops_series: series,
        aiperf_regulated: aiperf_regulated(flops, quality),
        v3_flops_per_epoch: v3_per_image * s.images as f64 / s.train_seconds.max(1e-12),
        bagging: None,
    }
}

/// ImageNet's training and validation images (ILSVRC 2012): the sets the rules train and
/// evaluate ResNet-50 on.
pub const IMAGENET_TRAIN: usize = 1_281_167;
pub const IMAGENET_EVAL: usize = 50_000;

/// What a score declares beside its run's spec, that the rules check: the level, its target
/// (and whether it is the user's), and the images its runs train and evaluate on.
pub struct Declared<'a> {
    pub level: Level,
    pub custom_target: bool,
    pub target: &'a Target,
    pub train_images: usize,
    pub eval_images: usize,
}

/// Why top-1 from `n` images at quality `q` is not the full set's: its standard error
/// (binomial, √(q(1 − q)/n)) in points, and what it does to VFLOPS through the exponent `e`
/// (relative error e × se / q): 1,000 images at 0.763, ±1.3 points, ±9% on VFLOPS.
pub fn evaluation_error(n: usize, q: f64, e: i32) -> (f64, f64) {
    let se = (q * (1.0 - q) / n.max(1) as f64).sqrt();
    (100.0 * se, 100.0 * e as f64 * se / q)
}

/// Why run `a` cannot be compared with published scores (empty: it can).
pub fn not_comparable(a: &Spec, d: &Declared, rules: &Rules) -> Vec<String> {
    let mut v = Vec::new();
    let ewa = a.workload == Kind::Ewa;
    let custom_target = d.custom_target;
    v.extend(d.level.not_comparable().map(String::from));
    let subset = a
        .train_images
        .map(|t| format!(" (--train-images {t})"))
        .unwrap_or_default();
    if ewa && a.train_images.is_some() {
        v.push(format!(
            "trained on {} images{subset}; the rules train on the whole of the Extreme Weather data's training years",
            d.train_images
        ));
    } else if !ewa && d.train_images < IMAGENET_TRAIN {
        v.push(format!(
            "trained on {} images{subset}; the rules train on ImageNet's {IMAGENET_TRAIN}",
            d.train_images
        ));
    }
    if ewa {
        v.push(format!(
            "evaluated on {} images held out of the files given (--eval-images); the rules evaluate on the Extreme Weather data's own test split",
            d.eval_images
        ));
    } else if d.eval_images < IMAGENET_EVAL {
        let (se, on_vflops) = evaluation_error(d.eval_images, d.target.value, d.target.exponent);
        v.push(format!(
            "evaluated on {} images (--eval-images); the rules evaluate on ImageNet's {IMAGENET_EVAL} validation images: top-1 from {} has a standard error of ±{se:.1} points at {}, ±{on_vflops:.0}% on VFLOPS through the exponent {}",
            d.eval_images, d.eval_images, d.target.value, d.target.exponent
        ));
    }
    if !rules.fixed_epochs {
        v.push("runs stopped at the target (--stop-at-target); the rules time a fixed number of epochs to their end (§5.3.2)".into());
    }
    if !rules.decay_all {
        v.push("weight decay on the weights alone (--weight-decay-on weights); the rules decay every parameter, batch norm's γ and β included (§5.4)".into());
    }
    if a.label_smoothing != 0.0 {
        v.push(format!(
            "label smoothing {} (--label-smoothing); the rules change only the batch size and the learning-rate policy and keep every other hyper-parameter as the reference implementation sets it (§5.1.2); the paper lists label smoothing among other work's optimisations, and this score's reference setting trains on hard labels",
            a.label_smoothing
        ));
    }
    if let Some(f) = &a.init {
        v.push(format!(
            "started from pretrained weights (--init {}); the rules train from a random initialisation to the target quality",
            f.display()
        ));
    }
    if custom_target {
        v.push(if ewa {
            format!(
                "its own target quality (--target-map {})",
                a.target_map.unwrap_or(0.0)
            )
        } else {
            format!(
                "its own target quality (--target-top1 {})",
                a.target_top1.unwrap_or(0.0)
            )
        });
    }
    if a.data.is_none() {
        v.push(if ewa {
            "synthetic fields, not the Extreme Weather data".into()
        } else {
            "synthetic data, not ImageNet".into()
        });
    }
    let (rule, epochs) = (rule_resolution(a.workload), rule_epochs(a.workload));
    if let Some(r) = a.resolution.filter(|r| *r != rule) {
        v.push(format!("resolution {r} (the rules: {rule})"));
    }
    if a.width != 1.0 || a.depth != Depth([3, 4, 6, 3]) || a.version != Version::V1_5 {
        v.push(format!(
            "a scaled model (ResNet-50 v{}, width {}, depth {}): its FLOPS counted analytically, {}FLOP an image (the paper's count is its own model's)",
            a.version,
            a.width,
            a.depth,
            roofline_model::si(rules.analytic_ops)
        ));
    }
    if !ewa && a.classes != 1000 {
        v.push(format!("{} classes", a.classes));
    }
    if !matches!(a.epochs, Some(e) if e >= epochs) {
        v.push(match a.epochs {
            Some(e) => format!("{e} epochs (the rules: {epochs})"),
            None => format!("a run counted in steps, not the rules' {epochs} epochs"),
        });
    }
    v
}

/// The configuration a score's report lists for run `p` (of a model of `parameters`) against
/// `target` (on GPU `gpu`, over `ranks` ranks, bagged by `plan`).
pub fn configuration(
    p: &Prepared,
    parameters: Option<usize>,
    target: &Target,
    gpu: Option<&str>,
    ranks: usize,
    plan: Option<&Plan>,
) -> serde_json::Map<String, serde_json::Value> {
    let comm = p.run().comm;
    let mut entries = vec![
        ("model", json!(p.model_name())),
        ("parameters", json!(parameters)),
        ("data", json!(p.data_name())),
    ];
    entries.extend(p.workload().describe());
    entries.extend([
        ("resolution", json!(p.resolution.to_string())),
        ("global batch", json!(p.batch())),
        ("steps", json!(p.steps())),
        ("epochs", json!(p.spec.epochs)),
        (
            "optimizer",
            json!(if p.run().decay_all {
                "SGD, momentum 0.9, weight decay 1e-4 on every parameter"
            } else {
                "SGD, momentum 0.9, weight decay 1e-4 (not on batch norm or biases)"
            }),
        ),
        ("evaluate every (steps)", json!(p.run().eval_every)),
        (
            "target",
            json!(format!(
                "{} {} (VFLOPS exponent {})",
                target.metric, target.value, target.exponent
            )),
        ),
        (
            "device",
            json!(match gpu {
                Some(g) => format!("cuda: {g}, {}", p.spec.precision),
                None => format!("cpu, {}", roofline_model::count(p.threads, "thread")),
            }),
        ),
        ("ranks", json!(ranks)),
        (
            "gradient exchange",
            json!(format!(
                "fused buckets of {} elements, compression {}, {}",
                comm.bucket,
                comm.wire.name(),
                if comm.overlap {
                    "overlapped with the backward pass"
                } else {
                    "after the backward pass"
                }
            )),
        ),
        ("first seed", json!(p.spec.seed)),
    ]);
    if let Some(b) = plan {
        entries.push((
            "bagging (HPC AI500 V3.0)",
            json!(format!(
                "{} × {} each (Sys_scale {}), each on a bootstrap sample of the {} training images with its own seed; {}",
                roofline_model::count(b.models, "model"),
                roofline_model::count(b.ranks_per_model, "rank"),
                b.sys_scale(),
                p.workload().train_images(),
                if ranks > 1 {
                    "each model data parallel over its team of ranks, no synchronisation between teams"
                } else {
                    "side by side in one process on shares of its cores"
                }
            )),
        ));
    }
    entries
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The paper's ResNet-50 run as a spec: ImageNet, 224², 90 epochs.
    fn papers() -> Spec {
        Spec {
            workload: Kind::Resnet50,
            data: Some("/data/imagenet".into()),
            batch: Some(256),
            resolution: None,
            steps: None,
            epochs: Some(90),
            train_images: None,
            eval_images: 50_000,
            target_top1: None,
            target_map: None,
            eval_every: None,
            classes: 1000,
            anchors: 9,
            width: 1.0,
            depth: Depth([3, 4, 6, 3]),
            version: Version::V1_5,
            warmup_steps: None,
            lr: None,
            label_smoothing: 0.0,
            seed: 1,
            threads: None,
            device: super::super::Device::Cpu,
            precision: roofline_model::Precision::F32,
            gpu: None,
            cuda_graph: Default::default(),
            decay_all: true,
            comm: Default::default(),
            init: None,
        }
    }

    /// The rules' own declaration: the system level, the published target, ImageNet whole.
    fn full() -> Declared<'static> {
        static TARGET: std::sync::OnceLock<Target> = std::sync::OnceLock::new();
        Declared {
            level: Level::System,
            custom_target: false,
            target: TARGET.get_or_init(|| Target::published("resnet50").unwrap()),
            train_images: IMAGENET_TRAIN,
            eval_images: IMAGENET_EVAL,
        }
    }

    #[test]
    fn a_subset_another_level_or_a_custom_target_is_not_comparable() {
        let (a, rules) = (
            papers(),
            Rules::of(&papers(), &options(false, true), 24.3e9),
        );
        let why = |d: Declared| not_comparable(&a, &d, &rules);
        // 1,000 images at 0.763: ±1.3 points of top-1, ±9% on VFLOPS (exponent 5).
        let few = why(Declared {
            eval_images: 1000,
            ..full()
        });
        assert_eq!(few.len(), 1, "{few:?}");
        assert!(
            few[0].contains("evaluated on 1000 images")
                && few[0].contains("±1.3 points at 0.763, ±9% on VFLOPS"),
            "{few:?}"
        );
        let part = why(Declared {
            train_images: 12_800,
            ..full()
        });
        assert!(
            part.len() == 1 && part[0].contains("trained on 12800 images"),
            "{part:?}"
        );
        for (level, says) in [
            (Level::Hardware, "reference implementation"),
            (Level::Free, "not one of HPC AI500 V2.0's levels"),
        ] {
            let w = why(Declared { level, ..full() });
            assert!(w.len() == 1 && w[0].contains(says), "{w:?}");
        }
        let smoothed = Spec {
            label_smoothing: 0.1,
            ..papers()
        };
        let w = not_comparable(&smoothed, &full(), &rules);
        assert!(
            w.len() == 1 && w[0].contains("label smoothing 0.1"),
            "{w:?}"
        );
        let own = why(Declared {
            custom_target: true,
            ..full()
        });
        assert!(
            own.len() == 1 && own[0].contains("its own target"),
            "{own:?}"
        );
        assert_eq!(
            evaluation_error(50_000, 0.763, 5).0,
            100.0 * (0.763f64 * 0.237 / 5e4).sqrt()
        );
    }

    fn options(stop_at_target: bool, decay_all: bool) -> crate::run::RunOptions {
        crate::run::RunOptions {
            stop_at_target,
            decay_all,
            ..crate::run::RunOptions::new(256, 10, 1)
        }
    }

    #[test]
    fn the_papers_run_by_the_rules_is_comparable_and_counts_the_published_operations() {
        let a = papers();
        let rules = Rules::of(&a, &options(false, true), 24.3e9);
        assert_eq!(rules.ops(), (23e9, "published"));
        assert!(not_comparable(&a, &full(), &rules).is_empty());
        let lines = rules.describe(a.workload);
        assert!(
            lines[0].contains("23.0 GFLOP") && lines[0].contains("24.3 GFLOP"),
            "{lines:?}"
        );
        assert!(lines[1].contains("90"), "{lines:?}");
        // EWA's model at its data's size: 691 GFLOP an image.
        let e = Spec {
            workload: Kind::Ewa,
            epochs: Some(50),
            ..papers()
        };
        assert_eq!(
            Rules::of(&e, &options(false, true), 1.07e12).ops(),
            (691e9, "published")
        );
        // V3.0's bagged APC counts the same: 11 776 GFLOP for 512 images of ResNet-50, with
        // the analytic count beside; another model counts the analytic one alone.
        let (ops, analytic) = rules.bagged_ops(24.6e9);
        assert_eq!(analytic, Some(24.6e9));
        assert_eq!(roofline_model::bagging::bagged_apc(1, 512, ops), 11_776e9);
        let small = Spec {
            width: 0.25,
            ..papers()
        };
        assert_eq!(
            Rules::of(&small, &options(false, true), 1e9).bagged_ops(1.2e9),
            (1.2e9, None)
        );
    }

    #[test]
    fn aiperfs_curve_is_the_operations_so_far_over_the_time_so_far() {
        // 10 operations a step, steps of 4, 1 and 1 s: the curve is 2.5, 4, 5 (the steps' own
        // rates, 2.5, 10, 10, would have made the maximum 10).
        let c = cumulative_rate(10.0, [4.0, 1.0, 1.0].into_iter());
        assert_eq!(c, [2.5, 4.0, 5.0]);
    }

    #[test]
    fn each_deviation_from_the_rules_is_named() {
        let a = papers();
        let early = Rules::of(&a, &options(true, true), 24.3e9);
        let why = not_comparable(&a, &full(), &early);
        assert_eq!(why.len(), 1);
        assert!(why[0].contains("stopped at the target"), "{why:?}");
        let weights = Rules::of(&a, &options(false, false), 24.3e9);
        let why = not_comparable(&a, &full(), &weights);
        assert!(why.len() == 1 && why[0].contains("weight decay"), "{why:?}");
        let pretrained = Spec {
            init: Some("resnet50.safetensors".into()),
            ..papers()
        };
        let rules = Rules::of(&pretrained, &options(false, true), 24.3e9);
        let why = not_comparable(&pretrained, &full(), &rules);
        assert!(
            why.len() == 1 && why[0].contains("--init resnet50.safetensors"),
            "{why:?}"
        );
        // A scaled model: the analytic count, said in its reason.
        let small = Spec {
            width: 0.25,
            ..papers()
        };
        let rules = Rules::of(&small, &options(false, true), 1.5e9);
        assert_eq!(rules.ops(), (1.5e9, "analytic"));
        let why = not_comparable(&small, &full(), &rules);
        assert!(
            why.iter()
                .any(|w| w.contains("counted analytically, 1.50 GFLOP")),
            "{why:?}"
        );
        // Another resolution is another model's count too.
        let r160 = Spec {
            resolution: Some(Resolution { h: 160, w: 160 }),
            ..papers()
        };
        assert_eq!(
            Rules::of(&r160, &options(false, true), 9e9).ops().1,
            "analytic"
        );
    }
}
