//! roofline's model: the `machine.json` types, ceilings and their statistics, the attainable
//! bound, ridge points and binding ceilings, and the theoretical-peak database.
//!
//! Pure: no hardware, no unsafe, no threads. Every other crate of the workspace depends on this
//! one; it depends on none of them.

pub mod automl;
pub mod bagging;
pub mod bound;
pub mod calibration;
pub mod conditions;
pub mod fleet;
pub mod gate;
pub mod gpu_matrix;
pub mod identity;
pub mod launcher;
#[macro_use]
pub mod ids;
pub mod ceiling_id;
pub mod links;
pub mod load;
pub mod machine;
pub mod peaks;
pub mod placement;
pub mod plateau;
pub mod score;
pub mod skipped;
pub mod stats;
pub mod sweep;
pub mod validate;
pub mod write;

pub use bound::{binding, Binding, Roof, Roofline, Side};
pub use ceiling_id::CeilingId;
pub use ids::{ConvDir, Family, Level, MemOp, On, Precision, RoofId, Threads};
pub use load::LoadCheck;
pub use machine::*;
pub use peaks::{cpu_peak, PeakDb};
pub use stats::Stats;

/// Errors of the model: reading, parsing and writing its files.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("cannot read {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("malformed JSON: {0}")]
    Json(#[source] serde_json::Error),
    #[error("unknown schema {found}; expected \"{expected}\" (was the file written by another tool or another version of roofline?)")]
    Schema { expected: String, found: String },
    #[error("{path}: {inner}")]
    InFile {
        path: String,
        #[source]
        inner: Box<ModelError>,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A target an atomic write must not replace.
    #[error("cannot write {path}: {why}")]
    Target { path: String, why: &'static str },
    #[error("peak database: {0}")]
    PeaksToml(#[source] toml::de::Error),
    #[error("peak database: {0}")]
    Peaks(String),
    #[error("a value no run could have written: {0}")]
    Invalid(#[from] validate::Invalid),
}

/// Parses `text` as a document of `schema`, rejecting any other schema, and any value that
/// cannot be (`validate`), with a clear error.
pub fn from_json_with_schema<T: serde::de::DeserializeOwned + validate::Validate>(
    text: &str,
    schema: &str,
) -> Result<T, ModelError> {
    let value: serde_json::Value = serde_json::from_str(text).map_err(ModelError::Json)?;
    let found = value.get("schema").and_then(|s| s.as_str());
    if found != Some(schema) {
        return Err(ModelError::Schema {
            expected: schema.into(),
            found: found
                .map(|s| format!("\"{s}\""))
                .unwrap_or_else(|| "no \"schema\" field".into()),
        });
    }
    let doc: T = serde_json::from_value(value).map_err(ModelError::Json)?;
    doc.validate()?;
    Ok(doc)
}

/// Reads a document of `schema` from `path`.
pub fn read_with_schema<T: serde::de::DeserializeOwned + validate::Validate>(
    path: &std::path::Path,
    schema: &str,
) -> Result<T, ModelError> {
    let text = std::fs::read_to_string(path).map_err(|e| ModelError::Io {
        path: path.display().to_string(),
        source: e,
    })?;
    from_json_with_schema(&text, schema).map_err(|e| e.in_file(path))
}

impl ModelError {
    /// Attaches the file the error came from (I/O errors already name it).
    pub fn in_file(self, path: &std::path::Path) -> ModelError {
        match self {
            e @ (ModelError::Io { .. }
            | ModelError::Write { .. }
            | ModelError::Target { .. }
            | ModelError::InFile { .. }) => e,
            e => ModelError::InFile {
                path: path.display().to_string(),
                inner: Box::new(e),
            },
        }
    }
}

/// A count and its noun, the noun plural unless the count is one: `count(1, "thread")` is
/// "1 thread", `count(2, "thread")` "2 threads".
pub fn count(n: usize, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

/// SI prefix formatting: 1.2e11 → "120 G".
pub fn si(v: f64) -> String {
    let (p, s) = [
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
        (1.0, ""),
        (1e-3, "m"),
        (1e-6, "µ"),
        (1e-9, "n"),
    ]
    .into_iter()
    .find(|(p, _)| v.abs() >= *p)
    .unwrap_or((1e-9, "n"));
    let x = v / p;
    let digits = if x >= 100.0 {
        0
    } else if x >= 10.0 {
        1
    } else {
        2
    };
    format!("{x:.digits$} {s}")
}
