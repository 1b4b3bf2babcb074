//! A described network ([`Graph`]) on the one loop: the loop's [`Model`], and [`GraphTask`], a
//! classification task on [`TrainConfig`]'s data, schedule and evaluation with the network in
//! place of ResNet-50 (`classify`'s model is not used). What AutoML trains.

use super::{
    softmax_loss, Eval, EvalError, Infer, Labels, Loader, Model, Order, RunOptions, Schedule, Task,
    TrainConfig, TrainError,
};
use crate::checkpoint::{Checkpoint, CheckpointError, RunningStats};
use crate::graph::{Description, Graph, GraphError, Layer};
use crate::layers::{Param, Reducer};
use crate::resnet::Flops;
use crate::tensor::{Float, Tensor};
use std::ops::Range;
use std::sync::Arc;

impl<T: Float> Model<T> for Graph<T> {
    type Truth = Labels;
    type Output = Tensor<T>;
    type Loss = f64;

    fn describe(&self) -> String {
        format!("{:?}", self.description)
    }
    fn params(&mut self) -> Vec<&mut Param<T>> {
        Graph::params(self)
    }
    fn backward_order(&mut self) -> Vec<&mut Param<T>> {
        self.layers
            .iter_mut()
            .rev()
            .flat_map(|l| l.params())
            .collect()
    }
    fn running_stats(&mut self) -> RunningStats<'_, T> {
        Graph::running_stats(self)
    }
    fn synced_channels(&mut self) -> usize {
        Graph::running_stats(self)
            .iter()
            .map(|(_, m, _)| m.len())
            .sum()
    }
    fn set_reducer(&mut self, r: Arc<dyn Reducer>) {
        for l in &mut self.layers {
            if let Layer::BatchNorm { bn, .. } = l {
                bn.reducer = Some(Arc::clone(&r));
            }
        }
    }
    fn train_step(
        &mut self,
        x: &Tensor<T>,
        truth: &Labels,
        _seed: u64,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) -> f64 {
        let z = self.forward(x, true);
        let (loss, g) = softmax_loss(&z, truth);
        self.backward_with(&g, ready);
        loss
    }
    fn infer(&mut self, x: &Tensor<T>) -> Tensor<T> {
        self.forward(x, false)
    }
}

/// A described network trained on a classification task's data, schedule and evaluation
/// (`classify`'s model is not used).
#[derive(Clone, Debug)]
pub struct GraphTask {
    pub net: Description,
    pub classify: TrainConfig,
    /// The weights the network starts from instead of its seed's (a morphed parent's:
    /// [`crate::graph::morph`]), parameters, zero momenta and running statistics.
    pub init: Option<Arc<Checkpoint>>,
}

impl GraphTask {
    /// The network for this task's images, or what is wrong with its description.
    pub fn new(net: Description, classify: TrainConfig) -> Result<GraphTask, GraphError> {
        let r = classify.data.resolution();
        net.shapes(r, r)?;
        Ok(GraphTask {
            net,
            classify,
            init: None,
        })
    }

    fn side(&self) -> usize {
        self.classify.data.resolution()
    }
}

impl<T: Float> Task<T> for GraphTask {
    type Model = Graph<T>;
    type Order = Order;

    fn name(&self) -> &'static str {
        "graph"
    }
    fn options(&self) -> &RunOptions {
        &self.classify.run
    }
    fn check(&self, ranks: usize) -> Result<(), TrainError> {
        self.net
            .shapes(self.side(), self.side())
            .map_err(|e| TrainError::Setup(format!("the network: {e}")))?;
        <TrainConfig as Task<T>>::check(&self.classify, ranks)
    }
    fn build(&self) -> Graph<T> {
        let s = self.side();
        let mut g = Graph::new(self.net.clone(), s, s, self.classify.run.seed)
            .expect("checked in GraphTask::new");
        if let Some(c) = &self.init {
            // Made by the morphism for exactly this description.
            g.load(c).expect("initial weights made for this network");
        }
        g
    }
    fn schedule(&self) -> Schedule {
        <TrainConfig as Task<T>>::schedule(&self.classify)
    }
    fn flops(&self, _: &Graph<T>) -> Flops {
        let s = self.side();
        let c = crate::accounting::trainer(&self.net.layers(s, s).unwrap_or_default());
        Flops {
            forward: c.forward,
            backward: c.backward,
        }
    }
    fn first_order(&self) -> Order {
        <TrainConfig as Task<T>>::first_order(&self.classify)
    }
    fn next_batch(&self, order: &mut Order, step: usize, rows: Range<usize>) -> Loader<T, Labels> {
        <TrainConfig as Task<T>>::next_batch(&self.classify, order, step, rows)
    }
    fn save_order(&self, order: &Order, c: &mut Checkpoint) {
        <TrainConfig as Task<T>>::save_order(&self.classify, order, c)
    }
    fn load_order(&self, c: &Checkpoint) -> Result<Order, CheckpointError> {
        <TrainConfig as Task<T>>::load_order(&self.classify, c)
    }
    fn step_seed(&self, step: usize, rank: usize) -> u64 {
        <TrainConfig as Task<T>>::step_seed(&self.classify, step, rank)
    }
    fn evaluates(&self) -> bool {
        <TrainConfig as Task<T>>::evaluates(&self.classify)
    }
    fn evaluate(
        &self,
        infer: &mut Infer<'_, T, Tensor<T>>,
        step: usize,
        local: usize,
    ) -> Result<Eval, EvalError> {
        <TrainConfig as Task<T>>::evaluate(&self.classify, infer, step, local)
    }
    fn predict(
        &self,
        infer: &mut Infer<'_, T, Tensor<T>>,
        local: usize,
    ) -> Result<crate::bagging::Predictions, EvalError> {
        <TrainConfig as Task<T>>::predict(&self.classify, infer, local)
    }
}
