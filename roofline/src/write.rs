//! Atomic writes: a temporary file beside the target, flushed, then renamed over it, so that an
//! interrupted run never leaves a torn file.

use crate::ModelError;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The temporary path used while writing `path`.
pub fn temp_path(path: &Path) -> PathBuf {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    path.with_file_name(format!(".{name}.tmp.{}", std::process::id()))
}

/// Writes `contents` to `path` atomically.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), ModelError> {
    let err = |e: std::io::Error| ModelError::Write {
        path: path.display().to_string(),
        message: e.to_string(),
    };
    if path.is_dir() {
        return Err(ModelError::Write {
            path: path.display().to_string(),
            message: "it is a directory; give a file name".into(),
        });
    }
    let tmp = temp_path(path);
    let result = (|| {
        let mut f = std::fs::File::create(&tmp)?;
        f.write_all(contents)?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result.map_err(err)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_and_replaces() {
        let dir = std::env::temp_dir().join(format!("roofline-write-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("x.json");
        write_atomic(&p, b"one").unwrap();
        write_atomic(&p, b"two").unwrap();
        assert_eq!(std::fs::read(&p).unwrap(), b"two");
        assert!(!temp_path(&p).exists());
        assert!(write_atomic(&dir.join("missing/x.json"), b"x").is_err());
        assert!(write_atomic(&dir, b"x").is_err());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
