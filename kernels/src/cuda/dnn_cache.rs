//! The convolution algorithms cuDNN measured, kept in a file so that a later run on the same GPU
//! with the same driver and cuDNN starts without measuring again (`ConvPlan::measured` takes a
//! few seconds over ResNet-50's shapes). The file is a hint, never trusted: one written for
//! another GPU, driver or cuDNN is ignored with a note, so is one that does not parse, an entry
//! with a code this cuDNN does not define is dropped, and a cached choice is checked with cuDNN
//! before it is used (`ConvPlan::from_choice`). Written whole to a temporary file and renamed,
//! so that an interrupted run leaves the old file or the new one.

use super::blas::Prec;
use super::dnn::PlanChoice;
use super::dnn_graph::EngineConfig;
use crate::cpu::conv::ConvShape;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// v2: every entry's methods were checked at its shape against f64 sums before they were
/// chosen (the trainer's search, as the probe's); a v1 file's were not, and it is measured
/// again.
const SCHEMA: &str = "roofline/cudnn-algorithms/v2";

/// What a cached choice is valid for: the GPU, its driver and the cuDNN that measured it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheKey {
    pub gpu: String,
    /// Compute capability, e.g. (9, 0).
    pub cc: (i32, i32),
    /// The driver's CUDA version (`cuDriverGetVersion`, e.g. "13.0").
    pub driver: String,
    /// `cudnnGetVersion`, e.g. 91900.
    pub cudnn: usize,
}

/// One shape's choice: its numbers as cuDNN defines them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
struct Entry {
    /// n, c, h, w, k, r, s, stride, pad.
    shape: [usize; 9],
    precision: String,
    /// The forward, backward-data and backward-filter algorithms.
    algos: [u32; 3],
    /// The math type each wants.
    maths: [u32; 3],
    /// The backend engine each direction runs instead, where the search chose one (absent in
    /// a file of a roofline that searched the legacy API only: its choices stand).
    #[serde(default)]
    engines: [Option<EngineConfig>; 3],
}

#[derive(Debug, Serialize, Deserialize)]
struct File {
    schema: String,
    key: CacheKey,
    entries: Vec<Entry>,
}

/// The cache for one GPU, as read at the start of a run.
#[derive(Debug)]
pub struct AlgoCache {
    path: PathBuf,
    key: CacheKey,
    entries: Vec<Entry>,
    /// Why the file's entries were not taken (another GPU, driver or cuDNN; not readable as
    /// this schema), for the run to say.
    pub note: Option<String>,
}

fn dims(s: &ConvShape) -> [usize; 9] {
    [s.n, s.c, s.h, s.w, s.k, s.r, s.s, s.stride, s.pad]
}

impl AlgoCache {
    /// `ROOFLINE_CACHE_DIR`, else `$XDG_CACHE_HOME/roofline`, else `~/.cache/roofline`, with
    /// the file `cudnn-algorithms.json`; None without any of them.
    pub fn default_path() -> Option<PathBuf> {
        let var = |v: &str| {
            std::env::var_os(v)
                .filter(|s| !s.is_empty())
                .map(PathBuf::from)
        };
        let dir = var("ROOFLINE_CACHE_DIR")
            .or_else(|| var("XDG_CACHE_HOME").map(|d| d.join("roofline")))
            .or_else(|| var("HOME").map(|h| h.join(".cache").join("roofline")))?;
        Some(dir.join("cudnn-algorithms.json"))
    }

    /// The cache of `gpu` in the default folder (its name, compute capability, the driver's
    /// CUDA version and cuDNN's version make the key; `note` says why an existing file's
    /// entries were not taken); None where there is no cache folder or a version cannot be
    /// read (every shape is then measured). The probe writes its checked choices into it, and
    /// the trainer reads them.
    pub fn for_gpu(gpu: &super::device::Gpu) -> Option<AlgoCache> {
        let path = AlgoCache::default_path()?;
        let key = CacheKey {
            gpu: gpu.name.clone(),
            cc: gpu.cc,
            driver: super::device::driver_version().ok()?,
            cudnn: super::dnn::versions().ok()?.0,
        };
        Some(AlgoCache::open(&path, key))
    }

    /// The cache at `path` for `key`: its entries when the file was written for this key;
    /// none (and a note saying why) when it was written for another, or cannot be read as this
    /// schema; none without a note when there is no file yet.
    pub fn open(path: &Path, key: CacheKey) -> AlgoCache {
        let mut cache = AlgoCache {
            path: path.to_path_buf(),
            key,
            entries: Vec::new(),
            note: None,
        };
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return cache,
            Err(e) => {
                cache.note = Some(format!(
                    "{}: not read ({e}); measuring again",
                    path.display()
                ));
                return cache;
            }
        };
        match serde_json::from_str::<File>(&text) {
            Ok(f) if f.schema != SCHEMA => {
                cache.note = Some(format!(
                    "{}: schema {:?}, not {SCHEMA}; measuring again",
                    path.display(),
                    f.schema
                ));
            }
            Ok(f) if f.key != cache.key => {
                cache.note = Some(format!(
                    "{}: measured on {} (cc {}.{}, CUDA driver {}, cuDNN {}), not this {} (cc {}.{}, CUDA driver {}, cuDNN {}); measuring again",
                    path.display(),
                    f.key.gpu,
                    f.key.cc.0,
                    f.key.cc.1,
                    f.key.driver,
                    f.key.cudnn,
                    cache.key.gpu,
                    cache.key.cc.0,
                    cache.key.cc.1,
                    cache.key.driver,
                    cache.key.cudnn
                ));
            }
            Ok(f) => {
                let n = f.entries.len();
                cache.entries = f
                    .entries
                    .into_iter()
                    .filter(|e| PlanChoice::from_codes(e.algos, e.maths).is_some())
                    .collect();
                if cache.entries.len() < n {
                    cache.note = Some(format!(
                        "{}: {} of {n} entries name algorithms this cuDNN does not define; those shapes are measured again",
                        path.display(),
                        n - cache.entries.len()
                    ));
                }
            }
            Err(e) => {
                cache.note = Some(format!(
                    "{}: not a cache this roofline reads ({e}); measuring again",
                    path.display()
                ));
            }
        }
        cache
    }

    /// The cached choice for `shape` in `p`.
    pub fn get(&self, shape: &ConvShape, p: Prec) -> Option<PlanChoice> {
        let d = dims(shape);
        self.entries
            .iter()
            .find(|e| e.shape == d && e.precision == p.name())
            .and_then(|e| {
                PlanChoice::from_codes(e.algos, e.maths).map(|c| c.with_engines(e.engines.clone()))
            })
    }

    /// Records `choice` for `shape` in `p` (replacing an older one) and writes the file.
    pub fn put(&mut self, shape: &ConvShape, p: Prec, choice: &PlanChoice) -> std::io::Result<()> {
        let d = dims(shape);
        self.entries
            .retain(|e| !(e.shape == d && e.precision == p.name()));
        let (algos, maths) = choice.codes();
        self.entries.push(Entry {
            shape: d,
            precision: p.name().to_string(),
            algos,
            maths,
            engines: choice.engines.clone(),
        });
        self.save()
    }

    fn save(&self) -> std::io::Result<()> {
        let file = File {
            schema: SCHEMA.into(),
            key: self.key.clone(),
            entries: self.entries.clone(),
        };
        let text = serde_json::to_string_pretty(&file).map_err(std::io::Error::other)?;
        if let Some(dir) = self.path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tmp = self
            .path
            .with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.path).inspect_err(|_| {
            let _ = std::fs::remove_file(&tmp);
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> CacheKey {
        CacheKey {
            gpu: "NVIDIA H200".into(),
            cc: (9, 0),
            driver: "13.0".into(),
            cudnn: 91900,
        }
    }

    fn shape() -> ConvShape {
        ConvShape {
            n: 128,
            c: 64,
            h: 56,
            w: 56,
            k: 64,
            r: 3,
            s: 3,
            stride: 1,
            pad: 1,
        }
    }

    fn dir(name: &str) -> PathBuf {
        let d =
            std::env::temp_dir().join(format!("roofline-algo-cache-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        d
    }

    #[test]
    fn a_choice_comes_back_for_its_shape_and_precision_only() {
        let path = dir("round").join("c.json");
        let choice = PlanChoice::from_codes([1, 1, 3], [1, 1, 1]).unwrap();
        let mut c = AlgoCache::open(&path, key());
        assert!(c.note.is_none(), "no file yet is no note");
        c.put(&shape(), Prec::Bf16, &choice).unwrap();
        let again = AlgoCache::open(&path, key());
        assert!(again.note.is_none(), "{:?}", again.note);
        assert_eq!(
            again.get(&shape(), Prec::Bf16).map(|c| c.codes()),
            Some(choice.codes())
        );
        assert!(again.get(&shape(), Prec::F16).is_none());
        let other = ConvShape { n: 256, ..shape() };
        assert!(again.get(&other, Prec::Bf16).is_none());
        // Replaced, not duplicated.
        let mut again = again;
        let newer = PlanChoice::from_codes([0, 0, 0], [3, 3, 3]).unwrap();
        again.put(&shape(), Prec::Bf16, &newer).unwrap();
        let read = AlgoCache::open(&path, key());
        assert_eq!(read.entries.len(), 1);
        assert_eq!(
            read.get(&shape(), Prec::Bf16).map(|c| c.codes()),
            Some(newer.codes())
        );
    }

    /// A direction that runs a backend engine keeps it, knobs and all, through the file; an
    /// entry without engines (a file of a roofline that searched the legacy API only) reads as
    /// legacy choices.
    #[test]
    fn an_engine_choice_comes_back_and_an_older_entry_is_legacy() {
        let path = dir("engine").join("c.json");
        let engine = EngineConfig {
            index: 41,
            knobs: vec![(3, 2), (17, 1)],
        };
        let choice = PlanChoice::from_codes([1, 1, 3], [1, 1, 1])
            .unwrap()
            .with_engines([None, Some(engine.clone()), None]);
        AlgoCache::open(&path, key())
            .put(&shape(), Prec::Bf16, &choice)
            .unwrap();
        let back = AlgoCache::open(&path, key())
            .get(&shape(), Prec::Bf16)
            .unwrap();
        assert_eq!(back.engines, [None, Some(engine), None]);
        assert_eq!(back.codes(), choice.codes());
        let text = std::fs::read_to_string(&path).unwrap();
        let older = text.replace(
            &serde_json::to_string(&choice.engines).unwrap(),
            "[null,null,null]",
        );
        let mut v: serde_json::Value = serde_json::from_str(&older).unwrap();
        v["entries"][0].as_object_mut().unwrap().remove("engines");
        std::fs::write(&path, v.to_string()).unwrap();
        let c = AlgoCache::open(&path, key());
        assert!(c.note.is_none(), "{:?}", c.note);
        let legacy = c.get(&shape(), Prec::Bf16).unwrap();
        assert_eq!(legacy.engines, [None, None, None]);
        assert_eq!(legacy.codes(), choice.codes());
    }

    /// A cache file at `path` for `key()` holding one f32 choice for `shape()`.
    fn written_f32(path: &Path) {
        let mut c = AlgoCache::open(path, key());
        let choice = PlanChoice::from_codes([1, 0, 1], [3, 3, 3]).unwrap();
        c.put(&shape(), Prec::F32, &choice).unwrap();
    }

    #[test]
    fn another_gpu_driver_or_cudnn_or_a_corrupt_file_is_ignored_with_a_note() {
        let path = dir("stale").join("c.json");
        written_f32(&path);
        for other in [
            CacheKey {
                gpu: "NVIDIA H100 80GB HBM3".into(),
                ..key()
            },
            CacheKey {
                driver: "13.1".into(),
                ..key()
            },
            CacheKey {
                cudnn: 92000,
                ..key()
            },
        ] {
            let stale = AlgoCache::open(&path, other);
            assert!(stale.get(&shape(), Prec::F32).is_none());
            assert!(
                stale
                    .note
                    .as_deref()
                    .is_some_and(|n| n.contains("measuring again")),
                "{:?}",
                stale.note
            );
        }
        for bad in ["{not json", "{\"schema\":\"other/v9\",\"key\":{\"gpu\":\"x\",\"cc\":[9,0],\"driver\":\"1\",\"cudnn\":1},\"entries\":[]}", ""] {
            std::fs::write(&path, bad).unwrap();
            let c = AlgoCache::open(&path, key());
            assert!(c.entries.is_empty());
            assert!(c.note.is_some(), "{bad:?}");
        }
        // An entry whose code this cuDNN does not define is dropped, the others kept.
        written_f32(&path);
        let text = std::fs::read_to_string(&path).unwrap();
        let mut f: File = serde_json::from_str(&text).unwrap();
        let mut bad = f.entries[0].clone();
        bad.precision = "tf32".into();
        bad.algos = [99, 0, 0];
        f.entries.push(bad);
        std::fs::write(&path, serde_json::to_string(&f).unwrap()).unwrap();
        let c = AlgoCache::open(&path, key());
        assert_eq!(c.entries.len(), 1);
        assert!(c.get(&shape(), Prec::F32).is_some());
        assert!(
            c.note.as_deref().is_some_and(|n| n.contains("1 of 2")),
            "{:?}",
            c.note
        );
    }
}
