//! AIPerf's AutoML benchmark on the embedded trainer: a master holds the history of trained
//! networks and their accuracies and hands out candidates through a shared buffer; workers
//! (each on its own share of the cores) make each child from its parent by network morphism
//! and train it in the one training loop; the score is the FLOPS the machine sustains while
//! searching, counted analytically (AIPerf's rules) for every finished epoch, sampled over
//! time, with the error folded in as the regulated score.
//!
//! - [`morph`]: the morphisms (deeper, wider, skip) with function-preserving weights.
//! - [`search`]: the Gaussian process over architectures, UCB and simulated annealing.
//! - [`tpe`]: the hyper-parameter search and the warm-up's accuracy prediction.
//! - [`worker`]: a worker's loop.
//! - [`master`]: the run (hand-out, watchdog, time series, `automl.json`, resume).

pub mod buffer;
pub mod master;
pub mod morph;
#[cfg(feature = "mpi")]
pub mod ranks;
pub mod search;
pub mod setup;
pub mod tally;
pub mod tpe;
pub mod worker;

#[cfg(test)]
mod tests;

pub use master::{automl, Settings};
