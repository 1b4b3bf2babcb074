//! The search for the next candidate, as a worker runs it (AIPerf moves architecture
//! generation from the master to the slaves, the master being the bottleneck at scale): from
//! the shared history (the master's log of every candidate's latest state, read as it grows,
//! and the trained weights), the starting network first; until a network is trained, random children of those
//! already taken; then the Gaussian process's proposal from the best trained parents. A child
//! starts from its parent's hyper-parameters (the reference's father's best); the master only
//! records what a worker proposes, refusing a network already taken.

use crate::rules::Space;
use crate::search::{self, Gp, Signature, Trained};
use roofline_model::automl::{Automl, Candidate, Outcome};
use roofline_workloads::data::Rng;
use roofline_workloads::graph::morph::{self, Limits, Morphism};
use roofline_workloads::graph::Description;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// What every worker's search needs (the master writes it into the shared buffer).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Plan {
    pub start: Description,
    /// The images' side.
    pub side: usize,
    /// The starting batch and kernel.
    pub batch: usize,
    pub kernel: usize,
    pub limits: Limits,
    /// Children sampled per morphism step (AIPerf: 8).
    pub neighbours: usize,
    /// The per-trial TPE's space (from round 4).
    pub space: Space,
    pub seed: u64,
    /// The trained weights' folder.
    pub weights: PathBuf,
}

/// A worker's proposal.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Proposal {
    pub parent: Option<usize>,
    pub morphisms: Vec<Morphism>,
    pub description: Description,
    /// The GP's mean accuracy and its upper confidence bound.
    pub expected: Option<(f64, f64)>,
    pub batch: usize,
    pub kernel: usize,
}

/// The candidates so far (each in its latest state) and their networks.
#[derive(Default)]
pub struct History {
    pub candidates: Vec<Candidate>,
    pub nets: Vec<Description>,
    /// Where each id is.
    at: std::collections::HashMap<usize, usize>,
}

/// Half the observations the GP holds at most.
const GP_HALF: usize = 32;

/// The `half` most accurate and the `half` latest of `(id, accuracy)`, each once.
fn best_and_latest(mut v: Vec<(usize, f64)>, half: usize) -> Vec<(usize, f64)> {
    if v.len() <= 2 * half {
        return v;
    }
    v.sort_by(|a, b| b.1.total_cmp(&a.1));
    let mut keep: Vec<(usize, f64)> = v[..half].to_vec();
    let mut rest = v[half..].to_vec();
    rest.sort_by_key(|x| std::cmp::Reverse(x.0));
    keep.extend(rest.into_iter().take(half));
    keep
}

impl History {
    /// The candidates of `doc` with their networks.
    pub fn of(doc: &Automl) -> Result<History, String> {
        let mut h = History::default();
        for c in &doc.candidates {
            h.update(c.clone())?;
        }
        Ok(h)
    }

    /// A candidate's latest state (a line of the master's log): it replaces the earlier one.
    pub fn update(&mut self, c: Candidate) -> Result<(), String> {
        let net: Description = serde_json::from_value(c.description.clone())
            .map_err(|e| format!("candidate {}: {e}", c.id))?;
        match self.at.get(&c.id) {
            Some(&i) => {
                self.candidates[i] = c;
                self.nets[i] = net;
            }
            None => {
                self.at.insert(c.id, self.candidates.len());
                self.candidates.push(c);
                self.nets.push(net);
            }
        }
        Ok(())
    }

    fn index(&self, id: usize) -> Option<usize> {
        self.at.get(&id).copied()
    }

    /// The trained candidates (with their weights in `weights`) and their accuracy for the
    /// search: the best observed, or the predicted one when higher.
    pub fn trained(&self, weights: &Path) -> Vec<(usize, f64)> {
        self.candidates
            .iter()
            .filter(|c| {
                matches!(
                    c.outcome,
                    Outcome::Trained | Outcome::EarlyStopped | Outcome::Cut
                )
            })
            .filter(|c| {
                !c.epochs.is_empty() && weights.join(format!("{}.safetensors", c.id)).is_file()
            })
            .map(|c| {
                let acc = c
                    .best_top1()
                    .unwrap_or(0.0)
                    .max(c.predicted_top1.unwrap_or(0.0));
                (c.id, acc)
            })
            .collect()
    }

    /// Whether a candidate has network `d` already.
    pub fn taken(&self, d: &Description) -> Option<usize> {
        self.nets
            .iter()
            .position(|n| n == d)
            .map(|i| self.candidates[i].id)
    }
}

/// The next candidate from `h`, or `None` when the limits leave none.
pub fn propose(h: &History, plan: &Plan, rng: &mut Rng) -> Option<Proposal> {
    let trained = h.trained(&plan.weights);
    if h.taken(&plan.start).is_none() {
        return Some(Proposal {
            parent: None,
            morphisms: Vec::new(),
            description: plan.start.clone(),
            expected: None,
            batch: plan.batch,
            kernel: plan.kernel,
        });
    }
    if trained.is_empty() {
        // Nothing trained yet (or no weights kept): a child of the start, or of a network
        // already taken, trained from its seed.
        for net in std::iter::once(&plan.start).chain(&h.nets) {
            let ns = morph::neighbours(
                net,
                plan.side,
                plan.kernel,
                plan.limits,
                plan.neighbours,
                rng,
            );
            if let Some((m, d)) = ns.into_iter().find(|(_, d)| h.taken(d).is_none()) {
                return Some(Proposal {
                    parent: None,
                    morphisms: vec![m],
                    description: d,
                    expected: None,
                    batch: plan.batch,
                    kernel: plan.kernel,
                });
            }
        }
        return None;
    }
    // The GP on the best and the latest trained networks (at most 2 × GP_HALF): its cost grows
    // with the square of what it holds.
    let obs: Vec<(Signature, f64)> = best_and_latest(trained.clone(), GP_HALF)
        .iter()
        .filter_map(|&(id, acc)| Some((Signature::of(&h.nets[h.index(id)?]), acc)))
        .collect();
    let gp = Gp::fit(&obs)?;
    let best = trained.iter().max_by(|a, b| a.1.total_cmp(&b.1))?.0;
    let kernel = h.candidates[h.index(best)?].kernel;
    let list: Vec<Trained> = trained
        .iter()
        .filter_map(|&(id, accuracy)| {
            Some(Trained {
                id,
                description: &h.nets[h.index(id)?],
                accuracy,
            })
        })
        .collect();
    let settings = search::Settings {
        side: plan.side,
        kernel,
        limits: plan.limits,
        neighbours: plan.neighbours,
        depth: 3,
        t0: 1.0,
        cooling: 0.9,
        evaluations: 96,
    };
    let prop = search::propose(&gp, &list, &h.nets, settings, rng)?;
    // The child starts from its parent's hyper-parameters.
    let parent = &h.candidates[h.index(prop.parent)?];
    Some(Proposal {
        parent: Some(prop.parent),
        morphisms: prop.morphisms,
        description: prop.description,
        expected: Some((prop.mean, prop.ucb)),
        batch: parent.batch,
        kernel: parent.kernel,
    })
}
