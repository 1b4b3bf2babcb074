//! One bagged run of a score (`roofline score --bagging M`, HPC AI500 V3.0): M base models,
//! each on its own bootstrap sample and seed, trained with no synchronisation between them — under mpirun
//! each by its team of P = N / M ranks (data parallel inside the team), without a launcher side
//! by side in this process on M shares of its cores — then the ensemble of their held-out
//! predictions ([`crate::bagging`]), and V3.0's figures (`roofline_model::bagging`).

use super::{execute, Prepared, Ranks, RunError};
use crate::bagging::{ensemble, Member, Predictions};
use crate::detect::map::Detection;
use crate::layers::Reducer;
use crate::train::{Quiet, Summary};
use roofline_model::bagging::{BaggedRun, EpochTime, Member as MemberScore};
use roofline_model::placement::Energy;
use roofline_model::score::{aiperf_regulated, vflops, Run, Target};
use std::time::Instant;

/// What a bagged run gives the score (on the reporting rank).
pub struct Bagged {
    pub run: BaggedRun,
    pub top5: Option<f64>,
    /// Seconds from the start to the last model's end (the models run side by side).
    pub wall_seconds: f64,
    /// Images trained on by all the models.
    pub images: usize,
    /// The first model's run (this rank's share of it under mpirun), as a single model.
    pub first: Summary,
    pub gpu: Option<String>,
}

/// A member's figures, as the ranks exchange them: quality, seconds per steady step, training
/// seconds, images.
const STATS: usize = 4;

fn stats_of(s: &Summary) -> [f64; STATS] {
    let quality = s.evals.last().map_or(0.0, |e| e.map.unwrap_or(e.top1));
    // Steady steps: after the first (which pays for first-touch allocations), when there are.
    let steady: Vec<f64> = s
        .timing
        .iter()
        .filter(|t| s.timing.len() < 2 || t.step > s.start_step + 1)
        .map(|t| t.seconds)
        .collect();
    let step = steady.iter().sum::<f64>() / steady.len().max(1) as f64;
    [quality, step, s.train_seconds, s.images as f64]
}

/// Trains the ensemble of `ranks.plan` from `seed` and scores it against `target`, each
/// sample's training step counting `ops.0` FLOPs (the published count, or V3.0 table 3's
/// rules), with roofline's analytic count `ops.1` beside a published one. Every rank calls
/// it; the reporting rank gets the result.
pub fn run(
    prep: &Prepared,
    ranks: &Ranks,
    seed: u64,
    target: &Target,
    (flops_per_sample, analytic): (f64, Option<f64>),
    epoch_time: EpochTime,
) -> Result<Option<Bagged>, RunError> {
    let plan = ranks
        .plan
        .ok_or_else(|| RunError::Run("a bagged run without a plan".into()))?;
    let m = plan.models;
    let n = prep.workload().train_images();
    let start = Instant::now();
    let members: Vec<Member> = (0..m).map(|k| Member::new(seed, k, n)).collect();
    let (stats, predictions, first, gpu) = match &ranks.world {
        None => side_by_side(prep, &members)?,
        Some(world) => {
            let team = ranks
                .team
                .as_ref()
                .ok_or_else(|| RunError::Run("a bagged run without its team".into()))?;
            let k = plan.model_of(world.rank());
            let cpus = prep.cpus.clone();
            let p = prep.member(members[k].clone(), &cpus)?;
            let (s, gpu) = execute(&p, &Quiet, Some(team.clone()))?;
            let lead = team.rank() == 0;
            // Each team's first rank puts its model's figures and predictions in its slot.
            let mut stats = vec![0.0; m * STATS];
            if lead {
                stats[k * STATS..(k + 1) * STATS].copy_from_slice(&stats_of(&s));
            }
            world.sum_f64(&mut stats);
            let own = s.predictions.clone().ok_or_else(|| {
                RunError::Run(format!("model {} kept no held-out predictions", k + 1))
            })?;
            let predictions = share(world.as_ref(), m, k, lead, own)?;
            (
                stats
                    .chunks(STATS)
                    .map(|c| c.try_into().unwrap_or([0.0; STATS]))
                    .collect(),
                predictions,
                s,
                gpu,
            )
        }
    };
    let wall_seconds = start.elapsed().as_secs_f64();
    if !ranks.root {
        return Ok(None);
    }
    let e = ensemble(&predictions).map_err(|e| RunError::Run(format!("the ensemble: {e}")))?;
    // Each model alone, counted by the same rule as the ensemble: its batch's FLOPs per
    // steady step.
    let alone = |st: &[f64; STATS]| flops_per_sample * prep.batch() as f64 / st[1].max(1e-12);
    let scores: Vec<MemberScore> = members
        .iter()
        .zip(&stats)
        .map(|(mb, st)| MemberScore {
            model: mb.model + 1,
            seed: mb.seed,
            sample_seed: mb.sample_seed,
            sample_images: mb.sample.len(),
            distinct_images: mb.distinct(),
            quality: st[0],
            step_seconds: st[1],
            train_seconds: st[2],
            trained_images: st[3] as usize,
            flops: alone(st),
            vflops: vflops(alone(st), st[0], target.value, target.exponent),
        })
        .collect();
    let images = stats.iter().map(|s| s[3] as usize).sum();
    let mut run = BaggedRun::new(
        scores,
        plan.ranks_per_model,
        prep.batch(),
        flops_per_sample,
        n,
        e.rule,
        e.quality,
        (target.value, target.exponent),
        epoch_time,
    );
    run.analytic_flops_per_sample = analytic;
    Ok(Some(Bagged {
        run,
        top5: e.top5,
        wall_seconds,
        images,
        first,
        gpu,
    }))
}

type Outcome = (Vec<[f64; STATS]>, Vec<Predictions>, Summary, Option<String>);

/// The M models in this process at once, each on its share of the cores (a model per core,
/// and cores shared round-robin when there are more models than cores).
fn side_by_side(prep: &Prepared, members: &[Member]) -> Result<Outcome, RunError> {
    let cpus = prep.cpus.clone();
    let m = members.len();
    let share = |k: usize| -> Vec<usize> {
        if m <= cpus.len() {
            cpus[k * cpus.len() / m..(k + 1) * cpus.len() / m].to_vec()
        } else {
            vec![cpus[k % cpus.len()]]
        }
    };
    let results: Vec<Result<(Summary, Option<String>), RunError>> = std::thread::scope(|s| {
        let handles: Vec<_> = members
            .iter()
            .enumerate()
            .map(|(k, mb)| {
                let cores = share(k);
                s.spawn(move || {
                    let p = prep.member(mb.clone(), &cores)?;
                    execute(&p, &Quiet, None)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(RunError::Run("a model's thread panicked".into())))
            })
            .collect()
    });
    let mut stats = Vec::with_capacity(m);
    let mut predictions = Vec::with_capacity(m);
    let mut first = None;
    let mut gpu = None;
    for (k, r) in results.into_iter().enumerate() {
        let (s, g) = r?;
        stats.push(stats_of(&s));
        predictions.push(s.predictions.clone().ok_or_else(|| {
            RunError::Run(format!("model {} kept no held-out predictions", k + 1))
        })?);
        gpu = gpu.or(g);
        if first.is_none() {
            first = Some(s);
        }
    }
    let first = first.ok_or_else(|| RunError::Run("no model ran".into()))?;
    Ok((stats, predictions, first, gpu))
}

/// Every model's held-out predictions on every rank, from the first rank of each team (`lead`)
/// of model `k`: the classifier's probabilities summed over the models (their mean, as one
/// prediction: all the ensemble needs), the detector's detections gathered model by model.
fn share(
    world: &dyn Reducer,
    m: usize,
    k: usize,
    lead: bool,
    own: Predictions,
) -> Result<Vec<Predictions>, RunError> {
    match own {
        Predictions::Classes {
            classes,
            probabilities,
            labels,
        } => {
            let mut sum = if lead {
                probabilities
            } else {
                vec![0.0f32; probabilities.len()]
            };
            world.sum_f32(&mut sum);
            sum.iter_mut().for_each(|v| *v /= m as f32);
            Ok(vec![Predictions::Classes {
                classes,
                probabilities: sum,
                labels,
            }])
        }
        Predictions::Boxes {
            classes,
            detections,
            truths,
        } => {
            const ROW: usize = 7;
            let mut counts = vec![0.0f64; m];
            if lead {
                counts[k] = detections.len() as f64;
            }
            world.sum_f64(&mut counts);
            let counts: Vec<usize> = counts.iter().map(|c| *c as usize).collect();
            let offset: usize = counts[..k].iter().sum();
            let mut rows = vec![0.0f64; ROW * counts.iter().sum::<usize>()];
            if lead {
                for (i, d) in detections.iter().enumerate() {
                    rows[ROW * (offset + i)..ROW * (offset + i + 1)].copy_from_slice(&[
                        d.image as f64,
                        d.class as f64,
                        d.score,
                        d.bbox[0],
                        d.bbox[1],
                        d.bbox[2],
                        d.bbox[3],
                    ]);
                }
            }
            world.sum_f64(&mut rows);
            let mut out = Vec::with_capacity(m);
            let mut at = 0;
            for c in counts {
                let dets = rows[ROW * at..ROW * (at + c)]
                    .chunks(ROW)
                    .map(|r| Detection {
                        image: r[0] as usize,
                        class: r[1] as usize,
                        score: r[2],
                        bbox: [r[3], r[4], r[5], r[6]],
                    })
                    .collect();
                out.push(Predictions::Boxes {
                    classes,
                    detections: dets,
                    truths: truths.clone(),
                });
                at += c;
            }
            Ok(out)
        }
    }
}

/// A bagged run as the score's run: the ensemble's quality, V3.0's FLOPS and VFLOPS, the time
/// of the whole ensemble; the first model's FLOPS series (AIPerf's) as a single model's.
impl Bagged {
    pub fn record(
        &self,
        i: usize,
        seed: u64,
        target: &Target,
        energy: &Energy,
        batch: usize,
    ) -> Run {
        let b = self;
        let r = &b.run;
        let s = &b.first;
        let series = super::score::flops_series(s, batch);
        let watts = energy.average_watts;
        Run {
            run: i + 1,
            seed,
            time_to_quality_s: b.wall_seconds,
            reached_target: r.ensemble_quality >= target.value,
            quality: r.ensemble_quality,
            top5: b.top5,
            steps: s.steps,
            images: b.images,
            train_seconds: r.epoch_seconds / r.iterations_per_epoch.max(1e-12) * s.steps as f64,
            flops: r.flops,
            // V3.0's eq. 6 over its analytic APC (table 3).
            ops_per_image: r.apc_flops / (r.models.max(1) * batch.max(1)) as f64,
            ops_count: if r.analytic_flops_per_sample.is_some() {
                "published (V3.0's APC of the paper's model)".into()
            } else {
                "analytic (V3.0's APC, table 3)".into()
            },
            analytic_flops: None,
            // The score sets it from its rules.
            fixed_epochs: false,
            first_reached_s: None,
            vflops: r.vflops,
            energy_j: energy.joules_per_step,
            average_watts: watts,
            vflops_per_watt: watts.map(|w| r.vflops / w),
            flops_per_watt: watts.map(|w| r.flops / w),
            flops_series_max: series.iter().copied().fold(0.0, f64::max),
            flops_series: series,
            aiperf_regulated: aiperf_regulated(r.flops, r.ensemble_quality),
            v3_flops_per_epoch: r.flops,
            bagging: Some(r.clone()),
        }
    }
}
