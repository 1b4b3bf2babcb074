//! Whether the master stays out of the way at scale: a synthetic history of `n` trained
//! candidates grown from the starting network by the search's own morphisms, and what each
//! side's work costs on it (the bench `automl_scale` times it at 64 to 4096 candidates and turns
//! it into the master's share of a run with 64 and 512 workers).
//!
//! - A worker's proposal: the new lines of the master's history log read (a candidate's
//!   state each) and the search run on the history (`propose::propose`: the GP on at most 64
//!   observations, the annealing, the taken check against every network).
//! - The master's work: on a proposal, the check against every network taken and a line
//!   appended to the log; on a candidate's end, a line appended; `automl.json` rewritten at most
//!   every 20 × its writing time (at least a second), so at most 5 % of the master's time.

use crate::propose::{History, Plan};
use crate::rules::Space;
use roofline_model::automl::{Automl, AutomlScore, Candidate, Epoch, Ops, Outcome};
use roofline_workloads::accounting;
use roofline_workloads::data::Rng;
use roofline_workloads::graph::morph::{self, Limits};
use roofline_workloads::graph::Description;
use std::path::Path;

/// A history of `n` candidates grown from `start` (each a child of an earlier one by one to
/// three morphisms, trained for `epochs` epochs with an accuracy drawn in [0.5, 0.75]), with an
/// empty weights file for each in `weights` (the search only asks that one exists).
pub fn history(
    start: &Description,
    side: usize,
    n: usize,
    epochs: usize,
    weights: &Path,
    seed: u64,
) -> std::io::Result<Automl> {
    std::fs::create_dir_all(weights)?;
    let mut rng = Rng::new(seed);
    let limits = Limits {
        layers: usize::MAX,
        parameters: f64::INFINITY,
    };
    let mut nets: Vec<Description> = vec![start.clone()];
    let mut candidates = Vec::with_capacity(n);
    while candidates.len() < n {
        let id = candidates.len();
        let (parent, description) = if id == 0 {
            (None, start.clone())
        } else {
            let p = (rng.unit() * nets.len() as f64) as usize % nets.len();
            let mut d = nets[p].clone();
            for _ in 0..1 + (rng.unit() * 3.0) as usize {
                if let Some((_, c)) = morph::neighbours(&d, side, 3, limits, 1, &mut rng).pop() {
                    d = c;
                }
            }
            if nets.contains(&d) {
                continue;
            }
            (Some(p), d)
        };
        let layers = description
            .layers(side, side)
            .map_err(|e| std::io::Error::other(e.to_string()))?;
        let ops = accounting::aiperf(&layers);
        let top1 = 0.5 + 0.25 * rng.unit();
        candidates.push(Candidate {
            id,
            parent,
            morphisms: Vec::new(),
            description: serde_json::to_value(&description).expect("plain data"),
            parameters: layers.iter().map(|l| l.params).sum(),
            ops_per_image: Ops {
                forward: ops.forward,
                backward: ops.backward,
                total: ops.total(),
            },
            batch: 256,
            kernel: 3,
            round: id / 64,
            epochs_planned: epochs,
            patience: 6,
            expected: None,
            worker: id % 64,
            started_s: id as f64,
            finished_s: Some(id as f64 + 1.0),
            epochs: (1..=epochs)
                .map(|e| Epoch {
                    epoch: e,
                    top1: top1 * e as f64 / epochs as f64,
                    loss: 2.0 / e as f64,
                    seconds: 60.0,
                    ops: 1.28e6 * ops.total(),
                    at_s: id as f64 + e as f64,
                    pass: 0,
                })
                .collect(),
            predicted_top1: None,
            retrain: None,
            pretrained: None,
            outcome: Outcome::Trained,
        });
        std::fs::write(weights.join(format!("{id}.safetensors")), b"")?;
        if id > 0 {
            nets.push(description);
        }
    }
    Ok(Automl {
        schema: roofline_model::automl::AUTOML_SCHEMA.into(),
        provenance: roofline_collectors::provenance::here(
            roofline_kernels::probe::node::cpu_here(1),
            true,
            std::time::Instant::now(),
        ),
        configuration: serde_json::Map::new(),
        running: true,
        candidates,
        series: Vec::new(),
        workers: Vec::new(),
        score: AutomlScore::fresh(),
        epoch_seconds: None,
        valid: false,
        invalid_because: vec!["a synthetic history".into()],
        deviations: Vec::new(),
    })
}

/// The plan a worker searches with (the candidates' weights in `weights`).
pub fn plan(start: &Description, side: usize, weights: &Path) -> Plan {
    Plan {
        start: start.clone(),
        side,
        batch: 256,
        kernel: 3,
        limits: Limits {
            layers: usize::MAX,
            parameters: f64::INFINITY,
        },
        neighbours: 8,
        space: Space {
            kernels: vec![3, 5, 7],
            batch: (12 * 80, 14 * 80),
            dropout: (0.0, 0.2),
        },
        seed: 1,
        weights: weights.to_path_buf(),
    }
}

/// The master's check of a proposal against every network taken (as `Run::record` does).
pub fn taken(h: &History, d: &Description) -> Option<usize> {
    h.taken(d)
}

/// What the master spends on each thing it does.
#[derive(Clone, Copy, Debug)]
pub struct MasterCosts {
    /// An epoch's event (read, recorded in memory).
    pub epoch_s: f64,
    /// A proposal (checked against every network, recorded, a line logged, acknowledged) and
    /// a candidate's end (a line logged).
    pub proposal_s: f64,
    pub end_s: f64,
    /// automl.json written once; the master writes it at most every `max(1 s, 20 × this)`.
    pub write_s: f64,
}

/// The share of the master's time a run keeps busy: `workers` workers, each finishing an
/// epoch every `epoch_s` seconds and a candidate every `epochs` epochs.
pub fn master_share(workers: usize, epoch_s: f64, epochs: f64, c: MasterCosts) -> f64 {
    let epochs_a_second = workers as f64 / epoch_s;
    let candidates_a_second = epochs_a_second / epochs;
    let writes_a_second = 1.0 / (20.0 * c.write_s).max(1.0);
    epochs_a_second * c.epoch_s
        + candidates_a_second * (c.proposal_s + c.end_s)
        + writes_a_second * c.write_s
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_workloads::graph::Op;

    /// The synthetic history is a valid automl.json of distinct networks grown by morphisms,
    /// each trained with weights on disk; a worker proposes on it a network none has; the
    /// master's share is its events a second times their cost.
    #[test]
    fn a_grown_history_is_searched_and_checked() {
        let start = Description::chain(
            3,
            &[
                Op::Conv {
                    channels: 4,
                    kernel: 3,
                    stride: 2,
                },
                Op::BatchNorm { relu: true },
                Op::GlobalAvgPool,
                Op::Dense { outputs: 4 },
            ],
        );
        let dir = std::env::temp_dir().join(format!("roofline-scale-{}", std::process::id()));
        let weights = dir.join("w");
        let doc = history(&start, 8, 40, 3, &weights, 5).unwrap();
        let json = doc.to_json().unwrap();
        let h = History::of(&Automl::from_json(&json).unwrap()).unwrap();
        assert_eq!(h.candidates.len(), 40);
        for (i, n) in h.nets.iter().enumerate() {
            assert!(!h.nets[..i].contains(n), "candidate {i} repeats a network");
        }
        assert_eq!(h.trained(&weights).len(), 40);
        let p = plan(&start, 8, &weights);
        let prop = crate::propose::propose(&h, &p, &mut Rng::new(2)).unwrap();
        assert!(prop.parent.is_some() && taken(&h, &prop.description).is_none());
        assert_eq!(taken(&h, &start), Some(0));
        // 512 workers, an epoch a minute, 40 epochs a candidate; 1 ms an epoch, 50 ms a
        // proposal, 2 ms an end; writes of 0.5 s every 10 s.
        let c = MasterCosts {
            epoch_s: 0.001,
            proposal_s: 0.05,
            end_s: 0.002,
            write_s: 0.5,
        };
        let share = master_share(512, 60.0, 40.0, c);
        let by_hand = 512.0 / 60.0 * (0.001 + 0.052 / 40.0) + 0.5 / 10.0;
        assert!((share - by_hand).abs() < 1e-12, "{share} {by_hand}");
        // A short write is at most once a second.
        let quick = MasterCosts { write_s: 0.01, ..c };
        assert!((master_share(0, 60.0, 40.0, quick) - 0.01).abs() < 1e-12);
        let _ = std::fs::remove_dir_all(&dir);
    }
}
