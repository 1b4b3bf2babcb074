//! AIPerf's AutoML benchmark on the embedded trainer, the top floor of the workloads: a master
//! holds the history of trained networks and their accuracies and hands out candidates through
//! a shared buffer; workers (each on its own share of the cores) make each child from its
//! parent by network morphism and train it in the one training loop; the score is the FLOPS the machine sustains while
//! searching, counted analytically (AIPerf's rules) for every finished epoch, sampled over
//! time, with the error folded in as the regulated score.
//!
//! - `roofline_workloads::graph::morph` (below, with the networks it changes): the morphisms
//!   (deeper, wider, skip) with function-preserving weights.
//! - [`search`]: the Gaussian process over architectures, UCB and simulated annealing.
//! - [`propose`]: the search as a worker runs it, from the shared history.
//! - [`rules`]: AIPerf's per-trial rules (patience, early stopping on the validation loss,
//!   the predicted accuracy, the per-trial TPE draw).
//! - [`curve`]: the accuracy curve's fit, as scipy's `curve_fit` makes it.
//! - [`worker`]: a worker's loop.
//! - [`master`]: the run (recording proposals, watchdog, time series, `automl.json`, resume).
//! - [`scale`]: a grown history and the master's share at scale (the bench `automl_scale`).

pub mod buffer;
pub mod curve;
pub mod master;
pub mod propose;
#[cfg(feature = "mpi")]
pub mod ranks;
pub mod rules;
pub mod scale;
pub mod search;
pub mod setup;
pub mod tally;
pub mod worker;

#[cfg(test)]
mod tests;

pub use master::{automl, Settings};
