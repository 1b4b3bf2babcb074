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

/// Refuses targets an atomic rename must not replace: directories, paths without a file name,
/// and anything that exists but is not a regular file (renaming over `/dev/null` as root would
/// replace the device).
pub fn check_target(path: &Path) -> Result<(), ModelError> {
    let refuse = |why: &'static str| {
        Err(ModelError::Target {
            path: path.display().to_string(),
            why,
        })
    };
    if path.as_os_str().is_empty() || path.file_name().is_none() {
        return refuse("no file name; give one, e.g. -o machine.json");
    }
    match std::fs::metadata(path) {
        Ok(m) if m.is_dir() => refuse("it is a directory; give a file name"),
        Ok(m) if !m.is_file() => refuse("it exists and is not a regular file; give a file name"),
        _ => Ok(()),
    }
}

/// Fails early (before minutes of work) when `path` cannot be written: a target an atomic
/// rename must not replace ([`check_target`]), or a folder where its temporary file cannot be
/// created.
pub fn check_writable(path: &Path) -> Result<(), ModelError> {
    check_target(path)?;
    let tmp = temp_path(path);
    std::fs::File::create(&tmp)
        .and_then(|_| std::fs::remove_file(&tmp))
        .map_err(|source| ModelError::Write {
            path: path.display().to_string(),
            source,
        })
}

/// Writes `contents` to `path` atomically.
pub fn write_atomic(path: &Path, contents: &[u8]) -> Result<(), ModelError> {
    let err = |e: std::io::Error| ModelError::Write {
        path: path.display().to_string(),
        source: e,
    };
    check_target(path)?;
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
        assert!(write_atomic(Path::new(""), b"x").is_err());
        assert!(write_atomic(Path::new("/dev/null"), b"x").is_err());
        assert!(std::fs::metadata("/dev/null")
            .map(|m| !m.is_file())
            .unwrap_or(true));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
