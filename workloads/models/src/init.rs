//! Pretrained starting weights for the ResNet classifier (`--init FILE`), from the files users
//! have:
//!
//! - **torchvision's state dict saved as safetensors** (`safetensors.torch.save_file(
//!   resnet50(weights=…).state_dict(), …)`): the names are this trainer's own (`conv1`, `bn1`,
//!   `layer1.0.conv1`, `layer1.0.downsample.0`, `fc`); convolutions are stored out × in × h × w
//!   and the classifier out × in, this trainer's h × w × in × out and in × out (transposed on
//!   reading); `num_batches_tracked` is left out.
//! - **Keras's ResNet50 weights in HDF5** (`model.save_weights("….h5")`, the file AIPerf's
//!   reference loads, `resnet50_weights_tf_dim_ordering_tf_kernels.h5`), in either of Keras's
//!   namings: `tf.keras.applications`' (`conv1_conv`, `conv1_bn`, `conv{s}_block{b}_{i}_conv`
//!   and `_bn` with i = 0 the shortcut, `predictions`) or the older `keras_applications`'
//!   (`conv1`, `bn_conv1`, `res{s}{a,b,…}_branch{2a,2b,2c,1}`, `bn{s}{a,b,…}_branch…`,
//!   `fc1000`); each with `kernel:0`, `bias:0`, `gamma:0`, `beta:0`, `moving_mean:0`,
//!   `moving_variance:0`. Kernels are h × w × in × out already.
//!   Keras's convolutions have a bias and this trainer's do not: each feeds a batch norm, and
//!   `BN(x + b)` with running mean `m` is `BN(x)` with running mean `m − b`, so the bias is
//!   folded into the running mean (exact in inference; in training the batch's mean absorbs it).
//!
//! Every tensor of the model must be in the file with its shape, and every tensor of the file
//! must have its place in the model; the first that does not is refused in one line.
//!
//! AutoML's candidates ([`Pretrained::into_graph`]) take the file as AIPerf's reference does:
//! every candidate starts from it, never from its parent, each layer that is still ResNet-50's
//! with its shape filled from the file and every other layer (added or reshaped by a morphism)
//! from its own initialisation.

use crate::checkpoint::{Checkpoint, CheckpointError, RunningStats, Stored};
use crate::graph::{Description, Graph, GraphError};
use crate::layers::Param;
use crate::tensor::Float;
use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Path, PathBuf};

/// Which file it was.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    Torchvision,
    Keras,
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Layout::Torchvision => "torchvision safetensors",
            Layout::Keras => "Keras HDF5",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("--init {}: {source}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("--init {}: {source}", path.display())]
    Safetensors {
        path: PathBuf,
        #[source]
        source: CheckpointError,
    },
    #[error("--init {} (HDF5): {source}", path.display())]
    Hdf5 {
        path: PathBuf,
        #[source]
        source: hdf5_pure::Error,
    },
    #[error("--init {} ({layout}): {what}", path.display())]
    Mismatch {
        path: PathBuf,
        layout: Layout,
        what: String,
    },
    #[error("--init into the network: {0}")]
    Network(#[from] GraphError),
}

pub use roofline_model::automl::Filled;

/// A file's tensors in this trainer's names and layouts.
#[derive(Clone, Debug)]
pub struct Pretrained {
    pub path: PathBuf,
    pub layout: Layout,
    /// Name → shape and values.
    pub tensors: BTreeMap<String, (Vec<usize>, Vec<f64>)>,
}

const HDF5_MAGIC: &[u8; 8] = b"\x89HDF\r\n\x1a\n";

impl Pretrained {
    /// The file at `path`: HDF5 (by its signature) as Keras's, anything else as safetensors.
    pub fn read(path: &Path) -> Result<Pretrained, InitError> {
        let mut head = [0u8; 8];
        let n = std::fs::File::open(path)
            .and_then(|mut f| f.read(&mut head))
            .map_err(|source| InitError::Read {
                path: path.to_path_buf(),
                source,
            })?;
        if n == 8 && &head == HDF5_MAGIC {
            keras(path)
        } else {
            torchvision(path)
        }
    }

    fn mismatch(&self, what: String) -> InitError {
        InitError::Mismatch {
            path: self.path.clone(),
            layout: self.layout,
            what,
        }
    }

    /// Refuses a file that does not fit a model of these tensors (name → shape).
    pub fn check(&self, model: &BTreeMap<String, Vec<usize>>) -> Result<(), InitError> {
        for (name, shape) in model {
            match self.tensors.get(name) {
                None => return Err(self.mismatch(format!("no {name} in the file (the model's {shape:?})"))),
                Some((s, _)) if s != shape => {
                    return Err(self.mismatch(format!(
                        "{name} is {s:?} in the file, {shape:?} in the model (--classes, --width, --depth must be the file's)"
                    )))
                }
                Some(_) => {}
            }
        }
        if let Some(extra) = self.tensors.keys().find(|k| !model.contains_key(*k)) {
            return Err(self.mismatch(format!(
                "the file's {extra} has no place in the model (another network?)"
            )));
        }
        Ok(())
    }

    fn fill<T: Float>(&self, dst: &mut [T], name: &str) -> Result<(), InitError> {
        let (_, v) = self
            .tensors
            .get(name)
            .ok_or_else(|| self.mismatch(format!("no {name} in the file")))?;
        if v.len() != dst.len() {
            return Err(self.mismatch(format!(
                "{name} has {} values in the file, {} in the model",
                v.len(),
                dst.len()
            )));
        }
        for (d, x) in dst.iter_mut().zip(v) {
            *d = T::from_f64(*x);
        }
        Ok(())
    }

    /// The file's values into the parameters (momenta zero: a fresh optimiser); `check` first.
    pub fn params<T: Float>(&self, params: Vec<&mut Param<T>>) -> Result<(), InitError> {
        for p in params {
            self.fill(&mut p.value, &p.name)?;
            p.momentum.iter_mut().for_each(|m| *m = T::zero());
        }
        Ok(())
    }

    /// The file's running statistics into the model's.
    pub fn stats<T: Float>(&self, stats: RunningStats<'_, T>) -> Result<(), InitError> {
        for (name, mean, var) in stats {
            self.fill(mean, &format!("{name}.running_mean"))?;
            self.fill(var, &format!("{name}.running_var"))?;
        }
        Ok(())
    }

    /// The layers of a described network (`side × side` images) the file fills: every named
    /// layer ([`crate::graph::Node::name`]) whose tensors the file has, all in the same shapes;
    /// by node, with its name. Layers a morphism added have no name, and one it reshaped
    /// (wider's) no longer fits.
    fn fitting(
        &self,
        d: &Description,
        side: usize,
    ) -> Result<(Vec<(usize, String)>, usize), InitError> {
        let shapes = d.shapes(side, side)?;
        let (mut fit, mut of) = (Vec::new(), 0);
        for (i, n) in d.nodes.iter().enumerate() {
            if crate::graph::prefix(n.op).is_none() {
                continue;
            }
            of += 1;
            let Some(name) = &n.name else { continue };
            let fits = crate::graph::tensors(n.op, shapes[n.inputs[0]].2)
                .iter()
                .all(|(field, shape)| {
                    matches!(self.tensors.get(&format!("{name}.{field}")), Some((s, _)) if s == shape)
                });
            if fits {
                fit.push((i, name.clone()));
            }
        }
        Ok((fit, of))
    }

    /// How many of the network's layers with weights the file fills.
    pub fn filled(&self, d: &Description, side: usize) -> Result<Filled, InitError> {
        let (fit, of) = self.fitting(d, side)?;
        Ok(Filled {
            layers: fit.len(),
            of,
        })
    }

    /// A described network's starting weights for `side × side` images (a checkpoint
    /// `Graph::load` takes, momenta zero): the graph's own initialisation from `seed` (what
    /// `Graph::new` with that seed draws), with the layers the file fills (`filled`) taking
    /// the file's values.
    pub fn into_graph(
        &self,
        d: &Description,
        side: usize,
        seed: u64,
    ) -> Result<(Checkpoint, Filled), InitError> {
        let shapes = d.shapes(side, side)?;
        let (fit, of) = self.fitting(d, side)?;
        let mut c = Graph::<f32>::new(d.clone(), side, side, seed)?.snapshot();
        for (i, name) in &fit {
            let n = &d.nodes[*i];
            let prefix = crate::graph::prefix(n.op).expect("a layer with weights");
            for (field, _) in crate::graph::tensors(n.op, shapes[n.inputs[0]].2) {
                let (_, v) = &self.tensors[&format!("{name}.{field}")];
                let key = format!("node{i}.{prefix}.{field}");
                if !c.tensors.contains_key(&key) {
                    return Err(self.mismatch(format!(
                        "the network has no {key} for the file's {name}.{field}"
                    )));
                }
                c.tensors.insert(key, Stored::f64s(v.iter().copied()));
            }
        }
        Ok((
            c,
            Filled {
                layers: fit.len(),
                of,
            },
        ))
    }
}

/// A row-major out × in × h × w kernel as h × w × in × out.
fn oihw_to_hwio(shape: &[usize], v: &[f64]) -> (Vec<usize>, Vec<f64>) {
    let (o, i, h, w) = (shape[0], shape[1], shape[2], shape[3]);
    let mut out = vec![0.0; v.len()];
    for a in 0..o {
        for b in 0..i {
            for y in 0..h {
                for x in 0..w {
                    out[((y * w + x) * i + b) * o + a] = v[((a * i + b) * h + y) * w + x];
                }
            }
        }
    }
    (vec![h, w, i, o], out)
}

/// A row-major `r × c` matrix transposed.
fn transpose(r: usize, c: usize, v: &[f64]) -> Vec<f64> {
    let mut out = vec![0.0; v.len()];
    for i in 0..r {
        for j in 0..c {
            out[j * r + i] = v[i * c + j];
        }
    }
    out
}

fn torchvision(path: &Path) -> Result<Pretrained, InitError> {
    let c = Checkpoint::load(path).map_err(|source| InitError::Safetensors {
        path: path.to_path_buf(),
        source,
    })?;
    let mut tensors = BTreeMap::new();
    for (name, t) in &c.tensors {
        if name.ends_with("num_batches_tracked") {
            continue;
        }
        let v = t.to_f64s().map_err(|source| InitError::Safetensors {
            path: path.to_path_buf(),
            source,
        })?;
        let entry = match t.shape.as_slice() {
            s @ [_, _, _, _] => oihw_to_hwio(s, &v),
            &[o, i] => (vec![i, o], transpose(o, i, &v)),
            s => (s.to_vec(), v),
        };
        tensors.insert(name.clone(), entry);
    }
    Ok(Pretrained {
        path: path.to_path_buf(),
        layout: Layout::Torchvision,
        tensors,
    })
}

/// A Keras layer's name as this trainer's (without the variable), in either naming.
fn keras_name(layer: &str) -> Option<String> {
    match layer {
        "conv1_conv" | "conv1" => return Some("conv1".into()),
        "conv1_bn" | "bn_conv1" => return Some("bn1".into()),
        "predictions" | "fc1000" => return Some("fc".into()),
        _ => {}
    }
    if let Some(name) = keras_applications_name(layer) {
        return Some(name);
    }
    // conv{s}_block{b}_{i}_{conv|bn}
    let rest = layer.strip_prefix("conv")?;
    let (stage, rest) = rest.split_once("_block")?;
    let (block, rest) = rest.split_once('_')?;
    let (i, kind) = rest.split_once('_')?;
    let (stage, block, i): (usize, usize, usize) =
        (stage.parse().ok()?, block.parse().ok()?, i.parse().ok()?);
    if !(2..=5).contains(&stage) || block == 0 || i > 3 {
        return None;
    }
    let prefix = format!("layer{}.{}", stage - 1, block - 1);
    Some(match (i, kind) {
        (0, "conv") => format!("{prefix}.downsample.0"),
        (0, "bn") => format!("{prefix}.downsample.1"),
        (i, "conv") => format!("{prefix}.conv{i}"),
        (i, "bn") => format!("{prefix}.bn{i}"),
        _ => return None,
    })
}

/// `keras_applications`' names: `res2a_branch2a` (stage 2, block a, the main path's first
/// convolution), `bn2a_branch2a` its batch norm, `res2a_branch1` the shortcut.
fn keras_applications_name(layer: &str) -> Option<String> {
    let (bn, rest) = match layer.strip_prefix("bn") {
        Some(r) => (true, r),
        None => (false, layer.strip_prefix("res")?),
    };
    let (block, branch) = rest.split_once("_branch")?;
    let mut chars = block.chars();
    let stage = chars.next()?.to_digit(10)? as usize;
    let letters: String = chars.collect();
    // Blocks a, b, c, …; ResNet-101/152's files number them b1, b2, … after a.
    let index = match letters.as_bytes() {
        [l @ b'a'..=b'z'] => (l - b'a') as usize,
        [b'b', digits @ ..] if !digits.is_empty() => {
            std::str::from_utf8(digits).ok()?.parse::<usize>().ok()?
        }
        _ => return None,
    };
    if !(2..=5).contains(&stage) {
        return None;
    }
    let layer = match (branch, bn) {
        ("1", false) => "downsample.0".to_string(),
        ("1", true) => "downsample.1".to_string(),
        (b, false) => format!("conv{}", main_branch(b)?),
        (b, true) => format!("bn{}", main_branch(b)?),
    };
    Some(format!("layer{}.{index}.{layer}", stage - 1))
}

/// `2a`, `2b`, `2c`: the main path's first, second and third layers.
fn main_branch(b: &str) -> Option<usize> {
    match b {
        "2a" => Some(1),
        "2b" => Some(2),
        "2c" => Some(3),
        _ => None,
    }
}

/// The batch norm a convolution of this trainer feeds (`conv1` → `bn1`,
/// `layer1.0.conv2` → `layer1.0.bn2`, `….downsample.0` → `….downsample.1`).
fn bn_of(conv: &str) -> Option<String> {
    if let Some(block) = conv.strip_suffix("downsample.0") {
        return Some(format!("{block}downsample.1"));
    }
    let (head, i) = conv.rsplit_once("conv")?;
    i.parse::<usize>().ok()?;
    Some(format!("{head}bn{i}"))
}

fn keras(path: &Path) -> Result<Pretrained, InitError> {
    let h5 = |source| InitError::Hdf5 {
        path: path.to_path_buf(),
        source,
    };
    let mismatch = |what: String| InitError::Mismatch {
        path: path.to_path_buf(),
        layout: Layout::Keras,
        what,
    };
    let file = hdf5_pure::File::open(path).map_err(h5)?;
    // Every dataset with the group it lies in: `/conv1_conv/conv1_conv/kernel:0`.
    let mut found: Vec<(String, String, Vec<usize>, Vec<f64>)> = Vec::new();
    let mut groups = vec![(String::new(), file.root())];
    while let Some((name, g)) = groups.pop() {
        for (d, ds) in g.iter_datasets().map_err(h5)? {
            let shape = ds
                .shape()
                .map_err(h5)?
                .into_iter()
                .map(|x| x as usize)
                .collect();
            found.push((name.clone(), d, shape, ds.read_f64().map_err(h5)?));
        }
        for (child, cg) in g.iter_groups().map_err(h5)? {
            groups.push((child, cg));
        }
    }
    let mut tensors = BTreeMap::new();
    let mut biases: Vec<(String, String, Vec<f64>)> = Vec::new();
    for (layer, var, shape, v) in found {
        let var = var.strip_suffix(":0").unwrap_or(&var);
        // Keras 1's datasets carry their layer's name: `res2a_branch2a_W:0`.
        let var = var
            .strip_prefix(layer.as_str())
            .and_then(|v| v.strip_prefix('_'))
            .unwrap_or(var);
        let ours = keras_name(&layer)
            .ok_or_else(|| mismatch(format!("{layer}/{var}: not a layer of Keras's ResNet50")))?;
        // Keras 1's names: W, b, and running_std for what is the variance (Keras 2 reads it
        // as moving_variance).
        let field = match var {
            "kernel" | "W" | "gamma" => "weight",
            "bias" | "b" if bn_of(&ours).is_some() => {
                biases.push((layer.clone(), ours, v));
                continue;
            }
            "bias" | "b" | "beta" => "bias",
            "moving_mean" | "running_mean" => "running_mean",
            "moving_variance" | "running_std" => "running_var",
            other => {
                return Err(mismatch(format!(
                    "{layer}/{other}: not a ResNet50 variable"
                )))
            }
        };
        tensors.insert(format!("{ours}.{field}"), (shape, v));
    }
    // A convolution's bias into its batch norm's running mean.
    for (layer, ours, b) in biases {
        let bn = bn_of(&ours)
            .ok_or_else(|| mismatch(format!("{layer}: no batch norm to fold its bias into")))?;
        let key = format!("{bn}.running_mean");
        let (_, mean) = tensors
            .get_mut(&key)
            .ok_or_else(|| mismatch(format!("{layer}'s bias: no {key} to fold it into")))?;
        if mean.len() != b.len() {
            return Err(mismatch(format!(
                "{layer}'s bias has {} values, {key} {}",
                b.len(),
                mean.len()
            )));
        }
        for (m, x) in mean.iter_mut().zip(b) {
            *m -= x;
        }
    }
    Ok(Pretrained {
        path: path.to_path_buf(),
        layout: Layout::Keras,
        tensors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keras's names become this trainer's; other names are none of ResNet50's.
    #[test]
    fn keras_names_map_to_torchvision_s() {
        for (k, ours) in [
            ("conv1_conv", "conv1"),
            ("conv1_bn", "bn1"),
            ("conv2_block1_0_conv", "layer1.0.downsample.0"),
            ("conv2_block1_0_bn", "layer1.0.downsample.1"),
            ("conv3_block4_2_conv", "layer2.3.conv2"),
            ("conv5_block3_3_bn", "layer4.2.bn3"),
            ("predictions", "fc"),
            // keras_applications' names, AIPerf's file.
            ("conv1", "conv1"),
            ("bn_conv1", "bn1"),
            ("res2a_branch2a", "layer1.0.conv1"),
            ("bn2a_branch2a", "layer1.0.bn1"),
            ("res2a_branch1", "layer1.0.downsample.0"),
            ("bn2a_branch1", "layer1.0.downsample.1"),
            ("res3d_branch2b", "layer2.3.conv2"),
            ("bn4f_branch2c", "layer3.5.bn3"),
            ("res4b22_branch2a", "layer3.22.conv1"),
            ("fc1000", "fc"),
        ] {
            assert_eq!(keras_name(k).as_deref(), Some(ours), "{k}");
        }
        for k in [
            "conv6_block1_1_conv",
            "conv2_block0_1_conv",
            "dense",
            "conv2_block1_4_conv",
            "res6a_branch2a",
            "res2a_branch2d",
            "res2A_branch1",
            "bn2a_branch3",
        ] {
            assert_eq!(keras_name(k), None, "{k}");
        }
    }

    /// A file's weights go into a described ResNet by name: ResNet's own (every parameter and
    /// statistic moved off its initial value) give the graph ResNet's logits in inference;
    /// the named tensors are ResNet's, one for one; a morphism's new layers keep the graph's
    /// own initialisation (not deeper's identity), and a widened convolution, the batch norm
    /// its channels pass and the layer that reads them are not filled.
    #[test]
    fn a_file_fills_a_described_resnet_by_name() {
        use crate::data::Rng;
        use crate::graph::morph::{self, Morphism};
        use crate::graph::Op;
        use crate::resnet::{Config, ResNet, Version};
        let cfg = Config {
            version: Version::V1,
            blocks: [1, 1, 0, 0],
            width: 0.125,
            classes: 4,
            zero_init_residual: false,
        };
        let side = 32;
        let d = Description::resnet(&cfg, 3);
        let mut r = ResNet::<f64>::new(cfg.clone(), 5);
        let shapes = r.shapes();
        assert_eq!(d.named_shapes(side, side).unwrap(), shapes);
        let mut rng = Rng::new(9);
        let mut tensors = BTreeMap::new();
        for p in r.params() {
            p.value
                .iter_mut()
                .for_each(|v| *v += rng.uniform(-0.05, 0.05));
            tensors.insert(p.name.clone(), (shapes[&p.name].clone(), p.value.clone()));
        }
        for (name, mean, var) in r.running_stats() {
            mean.iter_mut().for_each(|v| *v = rng.uniform(-0.2, 0.2));
            var.iter_mut().for_each(|v| *v = rng.uniform(0.5, 1.5));
            for (f, v) in [("running_mean", &*mean), ("running_var", &*var)] {
                let key = format!("{name}.{f}");
                tensors.insert(key.clone(), (shapes[&key].clone(), v.clone()));
            }
        }
        assert_eq!(tensors.len(), shapes.len());
        let file = Pretrained {
            path: "test.safetensors".into(),
            layout: Layout::Torchvision,
            tensors,
        };
        let weighted = d
            .nodes
            .iter()
            .filter(|n| crate::graph::prefix(n.op).is_some())
            .count();
        let (c, filled) = file.into_graph(&d, side, 77).unwrap();
        assert_eq!(
            filled,
            Filled {
                layers: weighted,
                of: weighted
            }
        );
        let mut g = Graph::<f64>::new(d.clone(), side, side, 0).unwrap();
        g.load(&c).unwrap();
        let x = crate::graph::tests::rand(2, side, side, 3, 4);
        let (a, b) = (g.forward(&x, false), r.forward(&x, false));
        for (u, v) in a.data.iter().zip(&b.data) {
            assert!((u - v).abs() <= 1e-9 * v.abs().max(1.0), "{u} vs {v}");
        }
        // Deeper: two new layers from the graph's seed, the rest from the file.
        let after = d
            .nodes
            .iter()
            .position(|n| n.op == Op::Relu)
            .expect("a block's ReLU")
            + 1;
        let m = Morphism::Deeper { after, kernel: 3 };
        let deeper = morph::child(&d, m, (side, side)).unwrap();
        let (c, filled) = file.into_graph(&deeper, side, 77).unwrap();
        assert_eq!(
            filled,
            Filled {
                layers: weighted,
                of: weighted + 2
            }
        );
        let fresh = Graph::<f32>::new(deeper.clone(), side, side, 77)
            .unwrap()
            .snapshot();
        let new = format!("node{after}.conv.weight");
        assert_eq!(
            c.tensors[&new].to_f64s().unwrap(),
            fresh.tensors[&new].to_f64s().unwrap()
        );
        assert_eq!(deeper.nodes[after].name, None);
        // Wider: the convolution, the batch norm after it and the next convolution differ.
        let node = d
            .nodes
            .iter()
            .position(|n| n.name.as_deref() == Some("layer1.0.conv1"))
            .unwrap();
        let wider = morph::child(&d, Morphism::Wider { node }, (side, side)).unwrap();
        assert_eq!(
            file.filled(&wider, side).unwrap(),
            Filled {
                layers: weighted - 3,
                of: weighted
            }
        );
    }

    /// out×in×h×w to h×w×in×out and a matrix's transpose, element by element.
    #[test]
    fn layouts_by_hand() {
        let (o, i, h, w) = (2, 3, 2, 2);
        let v: Vec<f64> = (0..o * i * h * w).map(|x| x as f64).collect();
        let (s, t) = oihw_to_hwio(&[o, i, h, w], &v);
        assert_eq!(s, vec![h, w, i, o]);
        for a in 0..o {
            for b in 0..i {
                for y in 0..h {
                    for x in 0..w {
                        assert_eq!(
                            t[((y * w + x) * i + b) * o + a],
                            v[((a * i + b) * h + y) * w + x]
                        );
                    }
                }
            }
        }
        assert_eq!(
            transpose(2, 3, &[1., 2., 3., 4., 5., 6.]),
            vec![1., 4., 2., 5., 3., 6.]
        );
    }
}
