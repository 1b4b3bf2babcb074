//! Network morphisms (AIPerf's, after Auto-Keras): a child network made from a trained parent
//! by one edit of its description, its weights carried over so that it computes what the
//! parent computes (Net2Net's function-preserving transfer) and goes on learning from there.
//!
//! - *Deeper*: a `k × k` convolution (as many channels as its input), batch norm and ReLU
//!   inserted after a value that is already non-negative (a ReLU's); the convolution starts as
//!   the identity (1 at the kernel's centre, channel to itself), the batch norm as the identity
//!   on its running statistics (mean 0, variance 1, γ = √(1 + ε), β = 0), and ReLU leaves a
//!   non-negative value as it is.
//! - *Wider*: a convolution's output channels doubled. Every new channel copies an old one
//!   (filter, and the batch norms on the way, which must be per-channel layers only), and the
//!   next convolution or dense layer splits each old input's weights between the channel and
//!   its copy in random shares `α`, `1 − α` (α in [0.3, 0.7], per weight): the sum is the old
//!   weight, and the copies learn apart.
//! - *Skip*: a non-negative value added, through a 1×1 convolution of zeros (strided to the
//!   size), to a convolution's output before the batch norm that reads it.
//!
//! Exact in inference (batch norm on running statistics) up to rounding. In training mode a
//! batch norm normalises with the batch's statistics, so the identity of a new batch norm
//! holds only on its running statistics: the child's first training step is not the parent's.

use crate::checkpoint::{Checkpoint, CheckpointError, Stored};
use crate::data::Rng;
use crate::graph::{Description, GraphError, Node, Op};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One edit of a description.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", tag = "kind")]
pub enum Morphism {
    /// Convolution, batch norm and ReLU after value `after`.
    Deeper { after: usize, kernel: usize },
    /// Convolution node `node`'s channels doubled.
    Wider { node: usize },
    /// Value `from` added to convolution node `to`'s output.
    Skip { from: usize, to: usize },
}

impl std::fmt::Display for Morphism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Morphism::Deeper { after, kernel } => {
                write!(f, "deeper: {kernel}×{kernel} block after value {after}")
            }
            Morphism::Wider { node } => write!(f, "wider: node {node}'s channels doubled"),
            Morphism::Skip { from, to } => write!(f, "skip: value {from} into node {to}"),
        }
    }
}

/// What is wrong with a morphism or the weights it starts from.
#[derive(Debug, thiserror::Error)]
pub enum MorphError {
    #[error("{0} does not apply to this network: {1}")]
    NotApplicable(Morphism, String),
    #[error("the child network: {0}")]
    Graph(#[from] GraphError),
    #[error("the parent's weights: {0}")]
    Weights(#[from] CheckpointError),
}

/// A network's parameters and running statistics by node (`conv.weight`, `bn.weight`,
/// `bn.bias`, `bn.running_mean`, `bn.running_var`, `fc.weight`, `fc.bias`), as f64.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Weights {
    pub nodes: Vec<BTreeMap<String, Vec<f64>>>,
}

impl Weights {
    /// The weights of a `nodes`-node graph from its checkpoint (momenta and data order left).
    pub fn from_checkpoint(c: &Checkpoint, nodes: usize) -> Result<Weights, CheckpointError> {
        let mut w = Weights {
            nodes: vec![BTreeMap::new(); nodes],
        };
        for (name, t) in &c.tensors {
            let Some(rest) = name.strip_prefix("node") else {
                continue;
            };
            let Some((i, field)) = rest.split_once('.') else {
                continue;
            };
            if field.ends_with(".momentum") {
                continue;
            }
            let i: usize = i.parse().map_err(|_| CheckpointError::Tensor {
                tensor: name.clone(),
                what: "not a node's tensor".into(),
            })?;
            let slot = w.nodes.get_mut(i).ok_or_else(|| CheckpointError::Tensor {
                tensor: name.clone(),
                what: format!("node {i} of a {nodes}-node network"),
            })?;
            slot.insert(field.to_string(), t.to_f64s()?);
        }
        Ok(w)
    }

    /// A checkpoint a graph loads (`Graph::load`): every parameter with a zero momentum (a
    /// child's optimiser starts afresh).
    pub fn to_checkpoint(&self) -> Checkpoint {
        let mut c = Checkpoint::default();
        for (i, fields) in self.nodes.iter().enumerate() {
            for (field, v) in fields {
                let name = format!("node{i}.{field}");
                if !field.contains("running_") {
                    c.tensors.insert(
                        format!("{name}.momentum"),
                        Stored::f64s(v.iter().map(|_| 0.0)),
                    );
                }
                c.tensors.insert(name, Stored::f64s(v.iter().copied()));
            }
        }
        c
    }

    fn get(&self, node: usize, field: &str) -> Result<&Vec<f64>, CheckpointError> {
        self.nodes
            .get(node)
            .and_then(|n| n.get(field))
            .ok_or_else(|| CheckpointError::Missing(format!("node{node}.{field}")))
    }
}

/// The nodes that read value `v`.
fn readers(d: &Description, v: usize) -> Vec<usize> {
    (0..d.nodes.len())
        .filter(|&i| d.nodes[i].inputs.contains(&v))
        .collect()
}

/// Whether value `v` is non-negative by construction (a ReLU's output).
fn non_negative(d: &Description, v: usize) -> bool {
    v >= 1
        && matches!(
            d.nodes[v - 1].op,
            Op::Relu | Op::BatchNorm { relu: true } | Op::MaxPool
        )
        && (d.nodes[v - 1].op != Op::MaxPool || non_negative(d, d.nodes[v - 1].inputs[0]))
}

/// Wider's path from convolution `node`: the per-channel nodes its channels pass through (each
/// value read once) and the convolution or dense layer that consumes them.
fn wider_path(d: &Description, node: usize) -> Option<(Vec<usize>, usize)> {
    if !matches!(d.nodes.get(node)?.op, Op::Conv { .. }) {
        return None;
    }
    let mut through = Vec::new();
    let mut v = node + 1;
    loop {
        let r = readers(d, v);
        let [r] = r[..] else { return None };
        match d.nodes[r].op {
            Op::BatchNorm { .. } | Op::Relu | Op::MaxPool | Op::GlobalAvgPool => {
                through.push(r);
                v = r + 1;
            }
            Op::Conv { .. } | Op::Dense { .. } => return Some((through, r)),
            Op::Add => return None,
        }
    }
}

/// Skip's 1×1 convolution stride from value `from` to convolution `to`'s output, if one gives
/// its size exactly.
fn skip_stride(
    d: &Description,
    shapes: &[(usize, usize, usize)],
    from: usize,
    to: usize,
) -> Option<usize> {
    let (fh, fw, _) = shapes[from];
    let (th, tw, _) = shapes[to + 1];
    let s = fh.div_ceil(th).max(1);
    let fits = (fh - 1) / s + 1 == th && (fw - 1) / s + 1 == tw;
    let reader = readers(d, to + 1);
    let feeds_bn = matches!(reader[..], [r] if matches!(d.nodes[r].op, Op::BatchNorm { .. }));
    (fits && feeds_bn && from <= to && non_negative(d, from)).then_some(s)
}

/// Every morphism that applies to `d` on `h × w` images, deeper ones with `kernel`.
pub fn applicable(d: &Description, h: usize, w: usize, kernel: usize) -> Vec<Morphism> {
    let Ok(shapes) = d.shapes(h, w) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for (v, &(h, w, _)) in shapes.iter().enumerate().skip(1) {
        if non_negative(d, v) && h * w > 1 {
            out.push(Morphism::Deeper { after: v, kernel });
        }
    }
    for node in 0..d.nodes.len() {
        if wider_path(d, node).is_some() {
            out.push(Morphism::Wider { node });
        }
        if matches!(d.nodes[node].op, Op::Conv { .. }) {
            for from in 1..=node {
                // Not from the value the convolution itself reads (that is a plain residual
                // the block has already, or a duplicate path).
                if from != d.nodes[node].inputs[0] && skip_stride(d, &shapes, from, node).is_some()
                {
                    out.push(Morphism::Skip { from, to: node });
                }
            }
        }
    }
    out
}

/// Inserts `new` nodes at node index `at` (their inputs in the new numbering; values before
/// `at` keep theirs), moving every later node's inputs along, and makes the old readers of
/// value `redirect` read the last new node's value instead.
fn insert(
    d: &Description,
    w: &Weights,
    at: usize,
    new: Vec<(Node, BTreeMap<String, Vec<f64>>)>,
    redirect: usize,
) -> (Description, Weights) {
    let m = new.len();
    let shift = |v: usize| if v > at { v + m } else { v };
    let mut nodes: Vec<Node> = Vec::with_capacity(d.nodes.len() + m);
    let mut weights = Vec::with_capacity(d.nodes.len() + m);
    let old = |i: usize| {
        let n = &d.nodes[i];
        Node {
            op: n.op,
            inputs: n
                .inputs
                .iter()
                .map(|&v| if v == redirect { at + m } else { shift(v) })
                .collect(),
            name: n.name.clone(),
        }
    };
    for i in 0..at {
        nodes.push(old(i));
        weights.push(w.nodes.get(i).cloned().unwrap_or_default());
    }
    for (n, nw) in new {
        nodes.push(n);
        weights.push(nw);
    }
    for i in at..d.nodes.len() {
        nodes.push(old(i));
        weights.push(w.nodes.get(i).cloned().unwrap_or_default());
    }
    (
        Description {
            channels: d.channels,
            nodes,
        },
        Weights { nodes: weights },
    )
}

/// The batch norm's ε (`BatchNorm::new`'s).
const EPS: f64 = 1e-5;

/// The child of `d` (weights `w`, trained on `h × w` images) by `m`, and its starting weights;
/// `seed` draws wider's shares.
pub fn apply(
    d: &Description,
    w: &Weights,
    m: Morphism,
    side: (usize, usize),
    seed: u64,
) -> Result<(Description, Weights), MorphError> {
    let shapes = d.shapes(side.0, side.1)?;
    let no = |why: &str| MorphError::NotApplicable(m, why.to_string());
    let (child, weights) = match m {
        Morphism::Deeper { after, kernel } => {
            if after == 0 || after > d.nodes.len() || !non_negative(d, after) {
                return Err(no("the value is not a ReLU's output"));
            }
            if kernel == 0 || kernel.is_multiple_of(2) {
                return Err(no("the kernel must be odd"));
            }
            let c = shapes[after].2;
            let mut conv = vec![0.0; kernel * kernel * c * c];
            let centre = (kernel / 2) * kernel + kernel / 2;
            for ch in 0..c {
                conv[(centre * c + ch) * c + ch] = 1.0;
            }
            let bn = BTreeMap::from([
                ("bn.weight".to_string(), vec![(1.0 + EPS).sqrt(); c]),
                ("bn.bias".to_string(), vec![0.0; c]),
                ("bn.running_mean".to_string(), vec![0.0; c]),
                ("bn.running_var".to_string(), vec![1.0; c]),
            ]);
            let new = vec![
                (
                    Node {
                        op: Op::Conv {
                            channels: c,
                            kernel,
                            stride: 1,
                        },
                        inputs: vec![after],
                        name: None,
                    },
                    BTreeMap::from([("conv.weight".to_string(), conv)]),
                ),
                (
                    Node {
                        op: Op::BatchNorm { relu: true },
                        inputs: vec![after + 1],
                        name: None,
                    },
                    bn,
                ),
            ];
            insert(d, w, after, new, after)
        }
        Morphism::Skip { from, to } => {
            if to >= d.nodes.len() || !matches!(d.nodes[to].op, Op::Conv { .. }) {
                return Err(no("the target is not a convolution"));
            }
            let stride = skip_stride(d, &shapes, from, to).ok_or_else(|| {
                no("the value is not a ReLU's before the convolution, or its size does not reduce to the convolution's, or no batch norm reads the convolution")
            })?;
            let (cin, cout) = (shapes[from].2, shapes[to + 1].2);
            let new = vec![
                (
                    Node {
                        op: Op::Conv {
                            channels: cout,
                            kernel: 1,
                            stride,
                        },
                        inputs: vec![from],
                        name: None,
                    },
                    BTreeMap::from([("conv.weight".to_string(), vec![0.0; cin * cout])]),
                ),
                (
                    Node {
                        op: Op::Add,
                        inputs: vec![to + 1, to + 2],
                        name: None,
                    },
                    BTreeMap::new(),
                ),
            ];
            insert(d, w, to + 1, new, to + 1)
        }
        Morphism::Wider { node } => widen(d, w, node, &shapes, seed).map_err(|e| match e {
            Widen::Path => no("its channels reach an addition or more than one layer"),
            Widen::Weights(e) => MorphError::Weights(e),
        })?,
    };
    child.shapes(side.0, side.1)?;
    Ok((child, weights))
}

/// The child of `d` by `m`, its description only: what the search sizes, and what a
/// candidate that starts from a pretrained file rather than its parent trains.
pub fn child(
    d: &Description,
    m: Morphism,
    side: (usize, usize),
) -> Result<Description, MorphError> {
    match m {
        // Wider's weights are not needed to know its shape.
        Morphism::Wider { node } => {
            if wider_path(d, node).is_none() {
                return Err(MorphError::NotApplicable(
                    m,
                    "its channels reach an addition or more than one layer".into(),
                ));
            }
            let mut c = d.clone();
            if let Op::Conv { channels, .. } = &mut c.nodes[node].op {
                *channels *= 2;
            }
            c.shapes(side.0, side.1)?;
            Ok(c)
        }
        _ => apply(d, &Weights::default(), m, side, 0).map(|(c, _)| c),
    }
}

enum Widen {
    Path,
    Weights(CheckpointError),
}

fn widen(
    d: &Description,
    w: &Weights,
    node: usize,
    shapes: &[(usize, usize, usize)],
    seed: u64,
) -> Result<(Description, Weights), Widen> {
    let (through, consumer) = wider_path(d, node).ok_or(Widen::Path)?;
    let we = Widen::Weights;
    let c = shapes[node + 1].2;
    let mut child = d.clone();
    let mut weights = w.clone();
    weights.nodes.resize(d.nodes.len(), BTreeMap::new());
    // The filters: RSCK, the output channel fastest; channel c + j copies channel j.
    let old = w.get(node, "conv.weight").map_err(we)?;
    let mut conv = Vec::with_capacity(old.len() * 2);
    for row in old.chunks_exact(c) {
        conv.extend_from_slice(row);
        conv.extend_from_slice(row);
    }
    weights.nodes[node].insert("conv.weight".into(), conv);
    if let Op::Conv { channels, .. } = &mut child.nodes[node].op {
        *channels = 2 * c;
    }
    // Per-channel layers on the way copy their channel's statistics and affine.
    for &t in &through {
        let fields: Vec<String> = weights.nodes[t].keys().cloned().collect();
        for f in fields {
            let v = weights.nodes[t].get_mut(&f).expect("listed");
            let copy = v.clone();
            v.extend(copy);
        }
    }
    // The consumer splits each input's weights between the channel and its copy.
    let mut rng = Rng::new(seed ^ 0x9e37_79b9_7f4a_7c15);
    let (field, outputs) = match d.nodes[consumer].op {
        Op::Conv { channels, .. } => ("conv.weight", channels),
        Op::Dense { outputs } => ("fc.weight", outputs),
        _ => return Err(Widen::Path),
    };
    let old = w.get(consumer, field).map_err(we)?;
    // Both layouts are [taps][input channel][output]: RSCK, and in × out for dense.
    let mut split = Vec::with_capacity(old.len() * 2);
    for tap in old.chunks_exact(c * outputs) {
        let alpha: Vec<f64> = (0..c * outputs).map(|_| rng.uniform(0.3, 0.7)).collect();
        split.extend(tap.iter().zip(&alpha).map(|(x, a)| x * a));
        split.extend(tap.iter().zip(&alpha).map(|(x, a)| x * (1.0 - a)));
    }
    weights.nodes[consumer].insert(field.into(), split);
    Ok((child, weights))
}

/// How large a candidate may grow.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub struct Limits {
    /// Convolution and dense layers at most.
    pub layers: usize,
    /// Parameters at most.
    pub parameters: f64,
}

/// Trainable layers (convolutions and dense) of a description.
pub fn layer_count(d: &Description) -> usize {
    d.nodes
        .iter()
        .filter(|n| matches!(n.op, Op::Conv { .. } | Op::Dense { .. }))
        .count()
}

/// Up to `n` children of `d` within `limits`, drawn at random (AIPerf samples 8).
pub fn neighbours(
    d: &Description,
    side: usize,
    kernel: usize,
    limits: Limits,
    n: usize,
    rng: &mut Rng,
) -> Vec<(Morphism, Description)> {
    let mut all = applicable(d, side, side, kernel);
    // Fisher–Yates with the run's generator: reproducible for a seed.
    for i in (1..all.len()).rev() {
        let j = (rng.next_u64() % (i as u64 + 1)) as usize;
        all.swap(i, j);
    }
    let mut out = Vec::new();
    for m in all {
        if out.len() == n {
            break;
        }
        // The description only (weights come when the child is trained).
        let Ok(child) = child(d, m, (side, side)) else {
            continue;
        };
        let params = child
            .layers(side, side)
            .map(|l| l.iter().map(|x| x.params).sum::<f64>());
        if layer_count(&child) <= limits.layers && params.is_ok_and(|p| p <= limits.parameters) {
            out.push((m, child));
        }
    }
    out
}

#[cfg(test)]
mod tests;
