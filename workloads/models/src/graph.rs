//! Networks described as data: layers and their connections in a [`Description`] (built at
//! run time, read from JSON), checked for shapes, built into a [`Graph`] of the trainer's own
//! layers and trained by the one loop as ResNet-50 and the detector are (the loop's side of it,
//! a `Model` and a classification task, `GraphTask`, is `train::described`). What AutoML's
//! candidates are made of.
//!
//! Value 0 is the input image; node `i` makes value `i + 1` from the values it names (earlier
//! ones only, so a description is a DAG in topological order). The last node's value is the
//! logits.

use crate::accounting::{Kind, LayerCount};
use crate::checkpoint::{Checkpoint, CheckpointError, RunningStats};
use crate::data::Rng;
use crate::layers::{
    add_into, avgpool_backward, avgpool_forward, relu_backward, relu_forward, BatchNorm, Conv2d,
    Linear, MaxPool, Param,
};
use crate::resnet::{BWD, FWD};
use crate::tensor::{Float, Tensor};
use roofline_collectors::timeline::timed;
use serde::{Deserialize, Serialize};
use std::sync::Arc;

/// One layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "op")]
pub enum Op {
    /// A convolution without bias, `kernel × kernel`, padding `kernel / 2`.
    Conv {
        channels: usize,
        kernel: usize,
        stride: usize,
    },
    /// Batch normalisation, followed by ReLU when `relu` (one pass).
    BatchNorm {
        relu: bool,
    },
    Relu,
    /// 3×3 max pooling, stride 2, padding 1 (ResNet's).
    MaxPool,
    /// The sum of its two inputs (a skip connection).
    Add,
    /// The mean over rows and columns.
    GlobalAvgPool,
    /// A dense layer with bias, on a 1×1 input.
    Dense {
        outputs: usize,
    },
}

impl Op {
    /// How many inputs the layer takes.
    pub fn arity(&self) -> usize {
        match self {
            Op::Add => 2,
            _ => 1,
        }
    }
}

/// A layer and the values it reads.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    pub op: Op,
    pub inputs: Vec<usize>,
    /// The ResNet layer it is (`layer1.0.conv1`, `bn1`, `fc`: the trainer's and torchvision's
    /// names), for a network described from ResNet and kept by the morphisms; none for a layer
    /// a morphism added. Pretrained weights (`--init`) go by it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

/// A network as data.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Description {
    /// The input image's channels.
    pub channels: usize,
    pub nodes: Vec<Node>,
}

/// What makes a description not a network.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    #[error("node {node} ({op:?}) takes {want} input(s), not {got}")]
    Arity {
        node: usize,
        op: Op,
        want: usize,
        got: usize,
    },
    #[error("node {node} reads value {value}, which is not made before it (values 0..={node})")]
    Order { node: usize, value: usize },
    #[error("node {node} ({op:?}): {why}")]
    Shape { node: usize, op: Op, why: String },
    #[error("the network has no layers")]
    Empty,
    #[error("the last node must give 1×1 logits, not {h}×{w}×{c}")]
    Output { h: usize, w: usize, c: usize },
}

/// A value's rows, columns and channels.
pub type Shape = (usize, usize, usize);

impl Description {
    /// A plain chain: each node reads the one before it.
    pub fn chain(channels: usize, ops: &[Op]) -> Description {
        Description {
            channels,
            nodes: ops
                .iter()
                .enumerate()
                .map(|(i, &op)| Node {
                    op,
                    inputs: vec![i],
                    name: None,
                })
                .collect(),
        }
    }

    /// ResNet (v1 or v1.5) as a description, node for node the layers of
    /// [`crate::resnet::ResNet`] created in its order (so that a graph built from it with the
    /// same seed starts from the same weights); every batch norm's γ starts at 1
    /// (`zero_init_residual` is not described).
    pub fn resnet(cfg: &crate::resnet::Config, channels: usize) -> Description {
        let width = |base: usize| ((base as f64 * cfg.width).round() as usize).max(1);
        let mut nodes: Vec<Node> = Vec::new();
        let mut push = |op: Op, inputs: Vec<usize>, name: String| {
            nodes.push(Node {
                op,
                inputs,
                name: Some(name),
            });
            nodes.len()
        };
        let conv = |channels, kernel, stride| Op::Conv {
            channels,
            kernel,
            stride,
        };
        let bn = |relu| Op::BatchNorm { relu };
        let c0 = width(64);
        let v = push(conv(c0, 7, 2), vec![0], "conv1".into());
        let v = push(bn(true), vec![v], "bn1".into());
        let mut x = push(Op::MaxPool, vec![v], "maxpool".into());
        let mut cin = c0;
        for (stage, &n) in cfg.blocks.iter().enumerate() {
            let mid = width(64 << stage);
            for b in 0..n {
                let stride = if stage > 0 && b == 0 { 2 } else { 1 };
                let (s1, s2) = match cfg.version {
                    crate::resnet::Version::V1 => (stride, 1),
                    crate::resnet::Version::V1_5 => (1, stride),
                };
                let out = mid * 4;
                let block = format!("layer{}.{b}", stage + 1);
                let at = |layer: &str| format!("{block}.{layer}");
                // The shortcut's convolution first: ResNet draws its weights first.
                let short = if stride != 1 || cin != out {
                    let d = push(conv(out, 1, stride), vec![x], at("downsample.0"));
                    push(bn(false), vec![d], at("downsample.1"))
                } else {
                    x
                };
                let v = push(conv(mid, 1, s1), vec![x], at("conv1"));
                let v = push(bn(true), vec![v], at("bn1"));
                let v = push(conv(mid, 3, s2), vec![v], at("conv2"));
                let v = push(bn(true), vec![v], at("bn2"));
                let v = push(conv(out, 1, 1), vec![v], at("conv3"));
                let v = push(bn(false), vec![v], at("bn3"));
                let v = push(Op::Add, vec![v, short], at("add"));
                x = push(Op::Relu, vec![v], at("relu"));
                cin = out;
            }
        }
        let v = push(Op::GlobalAvgPool, vec![x], "avgpool".into());
        push(
            Op::Dense {
                outputs: cfg.classes,
            },
            vec![v],
            "fc".into(),
        );
        Description { channels, nodes }
    }

    /// Every named layer's parameters and running statistics, by their ResNet names, in the
    /// trainer's layouts (a convolution r × s × in × out, the dense layer in × out): for
    /// ResNet's description, [`crate::resnet::ResNet::shapes`]; what `--init` fills.
    pub fn named_shapes(
        &self,
        h: usize,
        w: usize,
    ) -> Result<std::collections::BTreeMap<String, Vec<usize>>, GraphError> {
        let s = self.shapes(h, w)?;
        let mut m = std::collections::BTreeMap::new();
        for n in &self.nodes {
            let Some(name) = &n.name else { continue };
            for (field, shape) in tensors(n.op, s[n.inputs[0]].2) {
                m.insert(format!("{name}.{field}"), shape);
            }
        }
        Ok(m)
    }

    /// Every value's shape for an `h × w` input (value 0 the input), or what is wrong.
    pub fn shapes(&self, h: usize, w: usize) -> Result<Vec<Shape>, GraphError> {
        if self.nodes.is_empty() {
            return Err(GraphError::Empty);
        }
        let mut s: Vec<Shape> = vec![(h, w, self.channels)];
        for (i, n) in self.nodes.iter().enumerate() {
            let op = n.op;
            if n.inputs.len() != op.arity() {
                return Err(GraphError::Arity {
                    node: i,
                    op,
                    want: op.arity(),
                    got: n.inputs.len(),
                });
            }
            if let Some(&value) = n.inputs.iter().find(|&&v| v > i) {
                return Err(GraphError::Order { node: i, value });
            }
            let bad = |why: String| GraphError::Shape { node: i, op, why };
            let (ih, iw, ic) = s[n.inputs[0]];
            let out = match op {
                Op::Conv {
                    channels,
                    kernel,
                    stride,
                } => {
                    if channels == 0 || kernel == 0 || stride == 0 {
                        return Err(bad("channels, kernel and stride must be positive".into()));
                    }
                    let p = kernel / 2;
                    if ih + 2 * p < kernel || iw + 2 * p < kernel {
                        return Err(bad(format!("a {kernel}×{kernel} kernel on {ih}×{iw}")));
                    }
                    (
                        (ih + 2 * p - kernel) / stride + 1,
                        (iw + 2 * p - kernel) / stride + 1,
                        channels,
                    )
                }
                Op::BatchNorm { .. } | Op::Relu => (ih, iw, ic),
                Op::MaxPool => ((ih + 2 - 3) / 2 + 1, (iw + 2 - 3) / 2 + 1, ic),
                Op::Add => {
                    let other = s[n.inputs[1]];
                    if other != (ih, iw, ic) {
                        return Err(bad(format!(
                            "adds {ih}×{iw}×{ic} and {}×{}×{}",
                            other.0, other.1, other.2
                        )));
                    }
                    (ih, iw, ic)
                }
                Op::GlobalAvgPool => (1, 1, ic),
                Op::Dense { outputs } => {
                    if (ih, iw) != (1, 1) || outputs == 0 {
                        return Err(bad(format!(
                            "{outputs} outputs from a {ih}×{iw} input (1×1 needed)"
                        )));
                    }
                    (1, 1, outputs)
                }
            };
            if out.0 == 0 || out.1 == 0 {
                return Err(bad(format!("an empty output from {ih}×{iw}")));
            }
            s.push(out);
        }
        let &(h, w, c) = s.last().expect("not empty");
        if (h, w) != (1, 1) {
            return Err(GraphError::Output { h, w, c });
        }
        Ok(s)
    }

    /// Every layer's count per `h × w` image (the accounting's rules).
    pub fn layers(&self, h: usize, w: usize) -> Result<Vec<LayerCount>, GraphError> {
        let s = self.shapes(h, w)?;
        let size = |v: Shape| (v.0 * v.1 * v.2) as f64;
        Ok(self
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let (input, out) = (s[n.inputs[0]], s[i + 1]);
                let (kind, macs, params) = match n.op {
                    Op::Conv { kernel, stride, .. } => {
                        let k = (kernel * kernel * input.2) as f64;
                        let first = n.inputs[0] == 0;
                        let kind = Kind::Conv {
                            first,
                            kernel,
                            stride,
                        };
                        (kind, k * size(out), k * out.2 as f64)
                    }
                    Op::BatchNorm { .. } => (Kind::BatchNorm, 0.0, 2.0 * out.2 as f64),
                    Op::Relu => (Kind::Relu, 0.0, 0.0),
                    Op::MaxPool => (Kind::MaxPool { window: 3 }, 0.0, 0.0),
                    Op::Add => (Kind::Add, 0.0, 0.0),
                    Op::GlobalAvgPool => (Kind::AvgPool, 0.0, 0.0),
                    Op::Dense { outputs } => (
                        Kind::Dense,
                        (input.2 * outputs) as f64,
                        ((input.2 + 1) * outputs) as f64,
                    ),
                };
                let inputs = n.inputs.iter().map(|&v| size(s[v])).sum();
                LayerCount {
                    name: format!("node{i}"),
                    kind,
                    macs,
                    params,
                    inputs,
                    outputs: size(out),
                    size: (out.0, out.1),
                    channels: out.2,
                    input_size: (input.0, input.1),
                }
            })
            .collect())
    }
}

/// A layer's parameters and running statistics (by the field its graph node names them with,
/// `node{i}.{prefix}.{field}`, and as a named layer's `{name}.{field}`) with their shapes, for
/// `op` on `c` input channels; none for layers without weights.
pub fn tensors(op: Op, c: usize) -> Vec<(&'static str, Vec<usize>)> {
    match op {
        Op::Conv {
            channels, kernel, ..
        } => vec![("weight", vec![kernel, kernel, c, channels])],
        Op::BatchNorm { .. } => ["weight", "bias", "running_mean", "running_var"]
            .into_iter()
            .map(|f| (f, vec![c]))
            .collect(),
        Op::Dense { outputs } => vec![("weight", vec![c, outputs]), ("bias", vec![outputs])],
        Op::Relu | Op::MaxPool | Op::Add | Op::GlobalAvgPool => Vec::new(),
    }
}

/// The prefix a graph node's tensors carry after `node{i}.` (`Graph::new`'s).
pub fn prefix(op: Op) -> Option<&'static str> {
    match op {
        Op::Conv { .. } => Some("conv"),
        Op::BatchNorm { .. } => Some("bn"),
        Op::Dense { .. } => Some("fc"),
        Op::Relu | Op::MaxPool | Op::Add | Op::GlobalAvgPool => None,
    }
}

/// A layer of a built graph (the GPU's twin walks them: `GpuGraph`, in the device trainer).
pub enum Layer<T> {
    Conv(Conv2d<T>),
    BatchNorm { bn: BatchNorm<T>, relu: bool },
    Relu,
    MaxPool(MaxPool<T>),
    Add,
    GlobalAvgPool,
    Dense(Linear<T>),
}

impl<T: Float> Layer<T> {
    pub(crate) fn params(&mut self) -> Vec<&mut Param<T>> {
        match self {
            Layer::Conv(c) => vec![&mut c.weight],
            Layer::BatchNorm { bn, .. } => vec![&mut bn.gamma, &mut bn.beta],
            Layer::Dense(d) => vec![&mut d.weight, &mut d.bias],
            _ => Vec::new(),
        }
    }
}

/// A described network built from the trainer's layers (He-initialised convolutions, batch
/// norms at γ = 1, as ResNet's).
pub struct Graph<T> {
    pub description: Description,
    pub(crate) layers: Vec<Layer<T>>,
    /// The values of the last training forward pass (the backward pass reads them).
    values: Vec<Option<Arc<Tensor<T>>>>,
}

impl<T: Float> Graph<T> {
    /// Builds `d` for `h × w` inputs, initialised from `seed`.
    pub fn new(d: Description, h: usize, w: usize, seed: u64) -> Result<Graph<T>, GraphError> {
        let s = d.shapes(h, w)?;
        let mut rng = Rng::new(seed);
        let layers = d
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let name = format!("node{i}");
                let c = s[n.inputs[0]].2;
                match n.op {
                    Op::Conv {
                        channels,
                        kernel,
                        stride,
                    } => Layer::Conv(Conv2d::new(
                        &format!("{name}.conv"),
                        c,
                        channels,
                        kernel,
                        stride,
                        kernel / 2,
                        &mut rng,
                    )),
                    Op::BatchNorm { relu } => Layer::BatchNorm {
                        bn: BatchNorm::new(&format!("{name}.bn"), c, 1.0),
                        relu,
                    },
                    Op::Relu => Layer::Relu,
                    Op::MaxPool => Layer::MaxPool(MaxPool::default()),
                    Op::Add => Layer::Add,
                    Op::GlobalAvgPool => Layer::GlobalAvgPool,
                    Op::Dense { outputs } => {
                        Layer::Dense(Linear::new(&format!("{name}.fc"), c, outputs, &mut rng))
                    }
                }
            })
            .collect();
        Ok(Graph {
            description: d,
            layers,
            values: Vec::new(),
        })
    }

    /// The layers, one a node, in the description's order.
    pub fn layers(&self) -> &[Layer<T>] {
        &self.layers
    }

    /// Every parameter, node by node (the loop's `Model::params`).
    pub fn params(&mut self) -> Vec<&mut Param<T>> {
        self.layers.iter_mut().flat_map(|l| l.params()).collect()
    }

    /// Every batch norm's running statistics, named `node{i}.bn`.
    pub fn running_stats(&mut self) -> RunningStats<'_, T> {
        self.layers
            .iter_mut()
            .enumerate()
            .filter_map(|(i, l)| match l {
                Layer::BatchNorm { bn, .. } => Some((
                    format!("node{i}.bn"),
                    &mut bn.running_mean,
                    &mut bn.running_var,
                )),
                _ => None,
            })
            .collect()
    }

    /// Parameters (with their momenta) and running statistics from a checkpoint of this
    /// network.
    pub fn load(&mut self, c: &Checkpoint) -> Result<(), CheckpointError> {
        c.take_params(self.params())?;
        c.take_stats(self.running_stats())
    }

    /// Parameters (with their momenta) and running statistics as a checkpoint.
    pub fn snapshot(&mut self) -> Checkpoint {
        let mut c = Checkpoint::default();
        c.put_params(self.params());
        c.put_stats(self.running_stats());
        c
    }

    /// The multiply-accumulates per image of the convolutions and dense layers as built and
    /// run on `x` (their filters' sizes times the outputs they made): what the analytic count
    /// from the description must equal.
    #[cfg(test)]
    pub(crate) fn ran_macs(&mut self, x: &Tensor<T>) -> f64 {
        self.forward(x, true);
        let mut macs = 0.0;
        for (i, l) in self.layers.iter_mut().enumerate() {
            let out = self.values[i + 1].as_ref().expect("kept");
            match l {
                Layer::Conv(c) => macs += (c.weight.value.len() * out.h * out.w) as f64,
                Layer::Dense(d) => macs += d.weight.value.len() as f64,
                _ => {}
            }
        }
        macs
    }

    /// The logits of a batch; a training pass keeps what the backward pass needs.
    pub fn forward(&mut self, x: &Tensor<T>, train: bool) -> Tensor<T> {
        let mut values: Vec<Option<Arc<Tensor<T>>>> = vec![Some(Arc::new(x.clone()))];
        let value = |v: &[Option<Arc<Tensor<T>>>], k: usize| -> Arc<Tensor<T>> {
            Arc::clone(v[k].as_ref().expect("made before"))
        };
        for (i, (node, layer)) in self
            .description
            .nodes
            .iter()
            .zip(&mut self.layers)
            .enumerate()
        {
            let a = value(&values, node.inputs[0]);
            let label = || format!("node{i}");
            let y = timed(FWD, label, || match layer {
                Layer::Conv(c) => c.forward(&a),
                Layer::BatchNorm { bn, relu } => bn.forward_act((*a).clone(), train, *relu),
                Layer::Relu => {
                    let mut y = (*a).clone();
                    relu_forward(&mut y);
                    y
                }
                Layer::MaxPool(p) => p.forward(&a),
                Layer::Add => {
                    let mut y = (*a).clone();
                    add_into(&mut y, &value(&values, node.inputs[1]));
                    y
                }
                Layer::GlobalAvgPool => avgpool_forward(&a),
                Layer::Dense(d) => d.forward(&a),
            });
            values.push(Some(Arc::new(y)));
        }
        let out = (*value(&values, values.len() - 1)).clone();
        if train {
            self.values = values;
        }
        out
    }

    /// Gradients of every parameter from ∂loss/∂logits (after a training forward pass), each
    /// node's handed to `ready` as soon as they are final (the order of `backward_order`).
    pub fn backward_with(
        &mut self,
        dlogits: &Tensor<T>,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) {
        let values = std::mem::take(&mut self.values);
        let n = self.layers.len();
        let mut grads: Vec<Option<Tensor<T>>> = (0..=n).map(|_| None).collect();
        grads[n] = Some(dlogits.clone());
        for i in (0..n).rev() {
            let Some(dy) = grads[i + 1].take() else {
                // Nothing downstream reads this value: no gradient flows through it.
                ready(self.layers[i].params());
                continue;
            };
            let node = &self.description.nodes[i];
            let input = node.inputs[0];
            let label = || format!("node{i}");
            let dx: Option<Tensor<T>> = timed(BWD, label, || match &mut self.layers[i] {
                // The image needs no gradient.
                Layer::Conv(c) if input == 0 => {
                    c.backward_filter_only(&dy);
                    None
                }
                Layer::Conv(c) => Some(c.backward(&dy)),
                Layer::BatchNorm { bn, relu } => {
                    let out = relu.then(|| values[i + 1].as_deref().expect("kept"));
                    Some(bn.backward_act(&dy, out))
                }
                Layer::Relu => {
                    let mut d = dy.clone();
                    let y = values[i + 1].as_ref().expect("kept");
                    relu_backward(y, &mut d);
                    Some(d)
                }
                Layer::MaxPool(p) => Some(p.backward(&dy)),
                Layer::Add => Some(dy.clone()),
                Layer::GlobalAvgPool => {
                    let x = values[input].as_ref().expect("kept");
                    Some(avgpool_backward(&dy, x.h, x.w))
                }
                Layer::Dense(d) => Some(d.backward(&dy)),
            });
            let mut send = |k: usize, d: Tensor<T>| {
                if k == 0 {
                    return;
                }
                match &mut grads[k] {
                    Some(g) => add_into(g, &d),
                    slot => *slot = Some(d),
                }
            };
            if let Some(dx) = dx {
                if let Layer::Add = self.layers[i] {
                    send(node.inputs[1], dx.clone());
                }
                send(input, dx);
            }
            ready(self.layers[i].params());
        }
    }
}

pub mod morph;

#[cfg(test)]
pub(crate) mod tests;
