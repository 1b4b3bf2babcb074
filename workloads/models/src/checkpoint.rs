//! Checkpoints in the safetensors format (an 8-byte little-endian header length, a JSON header
//! naming each tensor's dtype, shape and byte range, then the raw little-endian data), written
//! atomically, with string metadata under `__metadata__`.

use crate::layers::Param;
use crate::tensor::Float;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Why a checkpoint could not be read, written or restored.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot write the checkpoint: {0}")]
    Write(#[source] roofline_model::ModelError),
    /// A file that is not a checkpoint, or a damaged one.
    #[error("{path}: {source}")]
    InFile {
        path: PathBuf,
        #[source]
        source: Box<CheckpointError>,
    },
    #[error("not a safetensors file: {0}")]
    NotSafetensors(String),
    #[error("not a safetensors file: {0}")]
    Header(#[source] serde_json::Error),
    #[error("{tensor}: {what}")]
    Tensor { tensor: String, what: String },
    #[error("the checkpoint has no {0}")]
    Missing(String),
    /// A checkpoint of another run (model, batch, workload) or with values this run cannot
    /// take.
    #[error("{0}")]
    Mismatch(String),
}

/// One stored tensor.
#[derive(Clone, Debug, PartialEq)]
pub struct Stored {
    pub dtype: String,
    pub shape: Vec<usize>,
    pub data: Vec<u8>,
}

impl Stored {
    pub fn f32s(v: impl IntoIterator<Item = f64>) -> Stored {
        let data: Vec<u8> = v
            .into_iter()
            .flat_map(|x| (x as f32).to_le_bytes())
            .collect();
        Stored {
            dtype: "F32".into(),
            shape: vec![data.len() / 4],
            data,
        }
    }

    pub fn f64s(v: impl IntoIterator<Item = f64>) -> Stored {
        let data: Vec<u8> = v.into_iter().flat_map(|x| x.to_le_bytes()).collect();
        Stored {
            dtype: "F64".into(),
            shape: vec![data.len() / 8],
            data,
        }
    }

    pub fn u64s(v: impl IntoIterator<Item = u64>) -> Stored {
        let data: Vec<u8> = v.into_iter().flat_map(|x| x.to_le_bytes()).collect();
        Stored {
            dtype: "U64".into(),
            shape: vec![data.len() / 8],
            data,
        }
    }

    /// The values as f64 (F32 or F64 tensors).
    pub fn to_f64s(&self) -> Result<Vec<f64>, CheckpointError> {
        match self.dtype.as_str() {
            "F32" => Ok(self
                .data
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]) as f64)
                .collect()),
            "F64" => Ok(self
                .data
                .chunks_exact(8)
                .map(|b| f64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
                .collect()),
            d => Err(CheckpointError::Mismatch(format!(
                "expected a floating-point tensor, found {d}"
            ))),
        }
    }

    pub fn to_u64s(&self) -> Result<Vec<u64>, CheckpointError> {
        if self.dtype != "U64" {
            return Err(CheckpointError::Mismatch(format!(
                "expected U64, found {}",
                self.dtype
            )));
        }
        Ok(self
            .data
            .chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect())
    }
}

/// A whole checkpoint.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Checkpoint {
    pub tensors: BTreeMap<String, Stored>,
    pub metadata: BTreeMap<String, String>,
}

fn element_size(dtype: &str) -> Option<usize> {
    match dtype {
        "F32" | "I32" | "U32" => Some(4),
        "F64" | "I64" | "U64" => Some(8),
        "F16" | "BF16" | "I16" | "U16" => Some(2),
        "U8" | "I8" | "BOOL" => Some(1),
        _ => None,
    }
}

impl Checkpoint {
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut header = serde_json::Map::new();
        let mut offset = 0usize;
        for (name, t) in &self.tensors {
            header.insert(
                name.clone(),
                serde_json::json!({"dtype": t.dtype, "shape": t.shape, "data_offsets": [offset, offset + t.data.len()]}),
            );
            offset += t.data.len();
        }
        if !self.metadata.is_empty() {
            header.insert("__metadata__".into(), serde_json::json!(self.metadata));
        }
        let mut text = serde_json::Value::Object(header).to_string().into_bytes();
        // The data starts 8-byte aligned.
        while !(8 + text.len()).is_multiple_of(8) {
            text.push(b' ');
        }
        let mut out = Vec::with_capacity(8 + text.len() + offset);
        out.extend_from_slice(&(text.len() as u64).to_le_bytes());
        out.extend_from_slice(&text);
        for t in self.tensors.values() {
            out.extend_from_slice(&t.data);
        }
        out
    }

    pub fn from_bytes(bytes: &[u8]) -> Result<Checkpoint, CheckpointError> {
        let not = |what: &str| CheckpointError::NotSafetensors(what.into());
        let n = u64::from_le_bytes(
            bytes
                .get(..8)
                .ok_or_else(|| not("shorter than 8 bytes"))?
                .try_into()
                .map_err(|_| not("header length"))?,
        ) as usize;
        let header = bytes
            .get(8..8usize.saturating_add(n))
            .ok_or_else(|| not("the header runs past the end"))?;
        let data = &bytes[8 + n..];
        let v: serde_json::Value =
            serde_json::from_slice(header).map_err(CheckpointError::Header)?;
        let obj = v
            .as_object()
            .ok_or_else(|| not("the header is not an object"))?;
        let mut c = Checkpoint::default();
        for (name, t) in obj {
            if name == "__metadata__" {
                for (k, val) in t.as_object().into_iter().flatten() {
                    c.metadata
                        .insert(k.clone(), val.as_str().unwrap_or_default().to_string());
                }
                continue;
            }
            let bad = |what: &str| CheckpointError::Tensor {
                tensor: name.clone(),
                what: what.into(),
            };
            let dtype = t["dtype"]
                .as_str()
                .ok_or_else(|| bad("no dtype"))?
                .to_string();
            let shape: Vec<usize> = t["shape"]
                .as_array()
                .ok_or_else(|| bad("no shape"))?
                .iter()
                .map(|d| {
                    d.as_u64()
                        .map(|d| d as usize)
                        .ok_or_else(|| bad("bad shape"))
                })
                .collect::<Result<_, _>>()?;
            let off = t["data_offsets"]
                .as_array()
                .ok_or_else(|| bad("no data_offsets"))?;
            let (b, e) = (
                off.first()
                    .and_then(|x| x.as_u64())
                    .ok_or_else(|| bad("bad offsets"))? as usize,
                off.get(1)
                    .and_then(|x| x.as_u64())
                    .ok_or_else(|| bad("bad offsets"))? as usize,
            );
            let size =
                element_size(&dtype).ok_or_else(|| bad(&format!("unknown dtype {dtype}")))?;
            if e < b || e > data.len() || (e - b) != shape.iter().product::<usize>() * size {
                return Err(bad("its byte range does not match its shape"));
            }
            c.tensors.insert(
                name.clone(),
                Stored {
                    dtype,
                    shape,
                    data: data[b..e].to_vec(),
                },
            );
        }
        Ok(c)
    }

    pub fn save(&self, path: &Path) -> Result<(), CheckpointError> {
        roofline_model::write::write_atomic(path, &self.to_bytes()).map_err(CheckpointError::Write)
    }

    pub fn load(path: &Path) -> Result<Checkpoint, CheckpointError> {
        let bytes = std::fs::read(path).map_err(|source| CheckpointError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Checkpoint::from_bytes(&bytes).map_err(|e| CheckpointError::InFile {
            path: path.to_path_buf(),
            source: Box::new(e),
        })
    }

    pub fn tensor(&self, name: &str) -> Result<&Stored, CheckpointError> {
        self.tensors
            .get(name)
            .ok_or_else(|| CheckpointError::Missing(format!("tensor {name}")))
    }

    pub fn meta(&self, key: &str) -> Result<&str, CheckpointError> {
        self.metadata
            .get(key)
            .map(String::as_str)
            .ok_or_else(|| CheckpointError::Missing(key.into()))
    }
}

/// A model's running statistics by name: (name, mean, variance).
pub type RunningStats<'a, T> = Vec<(String, &'a mut Vec<T>, &'a mut Vec<T>)>;

/// `v` stored in the model's width (f64 models in f64, the others in f32).
fn stored<T: Float>(v: &[T]) -> Stored {
    let it = v.iter().map(|x| x.to_f64());
    if std::mem::size_of::<T>() == 8 {
        Stored::f64s(it)
    } else {
        Stored::f32s(it)
    }
}

impl Checkpoint {
    /// Stores every parameter (`name`, `name.momentum`).
    pub fn put_params<T: Float>(&mut self, params: Vec<&mut Param<T>>) {
        for p in params {
            self.tensors.insert(p.name.clone(), stored(&p.value));
            self.tensors
                .insert(format!("{}.momentum", p.name), stored(&p.momentum));
        }
    }

    /// Stores running statistics (`name.running_mean`, `name.running_var`).
    pub fn put_stats<T: Float>(&mut self, stats: RunningStats<'_, T>) {
        for (name, mean, var) in stats {
            self.tensors
                .insert(format!("{name}.running_mean"), stored(mean));
            self.tensors
                .insert(format!("{name}.running_var"), stored(var));
        }
    }

    /// `name` into `dst`, which must have its length.
    fn fill<T: Float>(&self, dst: &mut [T], name: &str) -> Result<(), CheckpointError> {
        let v = self.tensor(name)?.to_f64s()?;
        if v.len() != dst.len() {
            return Err(CheckpointError::Tensor {
                tensor: name.into(),
                what: format!("{} values, the model has {}", v.len(), dst.len()),
            });
        }
        for (d, x) in dst.iter_mut().zip(v) {
            *d = T::from_f64(x);
        }
        Ok(())
    }

    /// Restores what `put_params` stored.
    pub fn take_params<T: Float>(&self, params: Vec<&mut Param<T>>) -> Result<(), CheckpointError> {
        for p in params {
            self.fill(&mut p.value, &p.name)?;
            self.fill(&mut p.momentum, &format!("{}.momentum", p.name))?;
        }
        Ok(())
    }

    /// Restores what `put_stats` stored.
    pub fn take_stats<T: Float>(&self, stats: RunningStats<'_, T>) -> Result<(), CheckpointError> {
        for (name, mean, var) in stats {
            self.fill(mean, &format!("{name}.running_mean"))?;
            self.fill(var, &format!("{name}.running_var"))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Errors keep their causes: the I/O error of a missing file, what is wrong inside a file
    /// with the file's name around it.
    #[test]
    fn errors_keep_their_causes() {
        use std::error::Error;
        let dir = std::env::temp_dir().join(format!("roofline-ckpt-err-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let missing = dir.join("missing.safetensors");
        let e = Checkpoint::load(&missing).unwrap_err();
        let io = e
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>())
            .unwrap();
        assert_eq!(io.kind(), std::io::ErrorKind::NotFound);
        let junk = dir.join("junk.safetensors");
        std::fs::write(&junk, b"\x04\0\0\0\0\0\0\0nope").unwrap();
        let e = Checkpoint::load(&junk).unwrap_err();
        assert!(matches!(e, CheckpointError::InFile { .. }), "{e:?}");
        let inner = e
            .source()
            .and_then(|s| s.downcast_ref::<Box<CheckpointError>>())
            .unwrap();
        assert!(matches!(**inner, CheckpointError::Header(_)), "{inner:?}");
        assert!(inner.source().is_some_and(|s| s.is::<serde_json::Error>()));
        assert!(
            e.to_string().contains("junk.safetensors")
                && e.to_string().contains("not a safetensors file")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn round_trip_and_corruption() {
        let mut c = Checkpoint::default();
        c.tensors.insert("a".into(), Stored::f32s([1.0, 2.5, -3.0]));
        c.tensors.insert("b".into(), Stored::u64s([7, 8]));
        c.tensors.insert("c".into(), Stored::f64s([0.1]));
        c.metadata.insert("step".into(), "3".into());
        let bytes = c.to_bytes();
        assert_eq!(
            (8 + u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize) % 8,
            0
        );
        let back = Checkpoint::from_bytes(&bytes).unwrap();
        assert_eq!(back, c);
        assert_eq!(
            back.tensor("a").unwrap().to_f64s().unwrap(),
            [1.0, 2.5, -3.0]
        );
        assert_eq!(back.meta("step").unwrap(), "3");
        assert!(Checkpoint::from_bytes(&bytes[..bytes.len() - 1]).is_err());
        assert!(Checkpoint::from_bytes(b"xx").is_err());
    }
}
