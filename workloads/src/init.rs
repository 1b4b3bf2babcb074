//! Pretrained starting weights for the ResNet classifier (`--init FILE`), from the files users
//! have:
//!
//! - **torchvision's state dict saved as safetensors** (`safetensors.torch.save_file(
//!   resnet50(weights=…).state_dict(), …)`): the names are this trainer's own (`conv1`, `bn1`,
//!   `layer1.0.conv1`, `layer1.0.downsample.0`, `fc`); convolutions are stored out × in × h × w
//!   and the classifier out × in, this trainer's h × w × in × out and in × out (transposed on
//!   reading); `num_batches_tracked` is left out.
//! - **Keras's ResNet50 weights in HDF5** (`model.save_weights("….h5")`, Keras 2's layout, the
//!   file AIPerf's reference loads): `conv1_conv`, `conv1_bn`, `conv{s}_block{b}_{i}_conv` and
//!   `_bn` (i = 0 the shortcut), `predictions`, each with `kernel:0`, `bias:0`, `gamma:0`,
//!   `beta:0`, `moving_mean:0`, `moving_variance:0`. Kernels are h × w × in × out already.
//!   Keras's convolutions have a bias and this trainer's do not: each feeds a batch norm, and
//!   `BN(x + b)` with running mean `m` is `BN(x)` with running mean `m − b`, so the bias is
//!   folded into the running mean (exact in inference; in training the batch's mean absorbs it).
//!
//! Every tensor of the model must be in the file with its shape, and every tensor of the file
//! must have its place in the model; the first that does not is refused in one line.

use crate::checkpoint::{Checkpoint, CheckpointError, RunningStats};
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
}

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

/// A Keras layer's name as this trainer's (without the variable).
fn keras_name(layer: &str) -> Option<String> {
    match layer {
        "conv1_conv" => return Some("conv1".into()),
        "conv1_bn" => return Some("bn1".into()),
        "predictions" | "fc1000" => return Some("fc".into()),
        _ => {}
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
        let ours = keras_name(&layer)
            .ok_or_else(|| mismatch(format!("{layer}/{var}: not a layer of Keras's ResNet50")))?;
        let field = match var {
            "kernel" | "gamma" => "weight",
            "bias" if layer.ends_with("_conv") => {
                biases.push((layer.clone(), ours, v));
                continue;
            }
            "bias" | "beta" => "bias",
            "moving_mean" => "running_mean",
            "moving_variance" => "running_var",
            other => {
                return Err(mismatch(format!(
                    "{layer}/{other}: not a ResNet50 variable"
                )))
            }
        };
        tensors.insert(format!("{ours}.{field}"), (shape, v));
    }
    // A convolution's bias into its batch norm's running mean.
    for (layer, _, b) in biases {
        let bn = keras_name(&format!("{}_bn", layer.trim_end_matches("_conv")))
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
        ] {
            assert_eq!(keras_name(k).as_deref(), Some(ours), "{k}");
        }
        for k in [
            "conv6_block1_1_conv",
            "conv2_block0_1_conv",
            "dense",
            "conv2_block1_4_conv",
        ] {
            assert_eq!(keras_name(k), None, "{k}");
        }
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
