//! The storage read ceiling: how fast training data can come off a file system.
//!
//! Two patterns, each with several reader threads: large files read sequentially (4 MiB
//! requests), and the small-file pattern of an image dataset (files of 100 KiB read whole, in a
//! random order). The probe writes its own test data under the given folder (a fresh
//! subfolder), reads it back with O_DIRECT where the file system allows (else after asking the
//! kernel to drop the files from the page cache, and saying that the cache may still help),
//! checks every byte, and removes everything when it ends — also on an error or Ctrl-C.

use crate::driver::CheckError;
use crate::ProbeError;
use roofline_model::ceiling_id::IoTest;
use roofline_model::CeilingId;
use roofline_model::{Ceiling, CeilingKind, PerIteration, Stats};
use std::alloc::Layout;
use std::fs::File;
use std::io::{Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::Instant;

const ALIGN: usize = 4096;
const REQUEST: usize = 4 << 20;
pub const SMALL_FILE: usize = 100 * 1024;

pub struct IoConfig {
    /// The folder to test (a subfolder is created in it and removed afterwards).
    pub path: PathBuf,
    pub readers: usize,
    pub quick: bool,
}

pub struct IoResult {
    pub ceilings: Vec<Ceiling>,
    pub notes: Vec<String>,
    /// Whether O_DIRECT was used (else the page cache may have helped).
    pub direct: bool,
}

/// A page-aligned buffer (O_DIRECT needs aligned memory).
struct Aligned {
    ptr: *mut u8,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Result<Aligned, ProbeError> {
        let layout =
            Layout::from_size_align(len.max(ALIGN), ALIGN).map_err(|_| ProbeError::Alloc(len))?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(ProbeError::Alloc(len));
        }
        Ok(Aligned { ptr, len })
    }

    fn as_mut(&mut self) -> &mut [u8] {
        // SAFETY: `len` bytes allocated above, owned by self.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for Aligned {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe {
            std::alloc::dealloc(
                self.ptr,
                Layout::from_size_align_unchecked(self.len.max(ALIGN), ALIGN),
            )
        }
    }
}

// SAFETY: a plain owned allocation.
unsafe impl Send for Aligned {}

/// The 8-byte word `k` of file `f`.
fn word(f: usize, k: usize) -> u64 {
    ((f as u64) << 40) ^ (k as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

fn fill(f: usize, offset: usize, buf: &mut [u8]) {
    for (i, chunk) in buf.chunks_exact_mut(8).enumerate() {
        chunk.copy_from_slice(&word(f, offset / 8 + i).to_le_bytes());
    }
}

fn verify(f: usize, offset: usize, buf: &[u8]) -> bool {
    buf.chunks_exact(8)
        .enumerate()
        .all(|(i, c)| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])) == word(f, offset / 8 + i))
}

/// Removes the test folder when dropped (end, error, Ctrl-C).
struct TestDir(PathBuf);

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn io_err(what: &'static str, p: &Path, e: std::io::Error) -> ProbeError {
    ProbeError::Io {
        what,
        path: p.to_path_buf(),
        source: e,
    }
}

/// Writes file `f` of `len` bytes and flushes it to the device.
fn write_file(path: &Path, f: usize, len: usize) -> Result<(), ProbeError> {
    let mut file = File::create(path).map_err(|e| io_err("cannot create", path, e))?;
    let mut buf = vec![0u8; REQUEST.min(len)];
    let mut off = 0;
    while off < len {
        let n = buf.len().min(len - off);
        fill(f, off, &mut buf[..n]);
        file.write_all(&buf[..n])
            .map_err(|e| io_err("cannot write", path, e))?;
        off += n;
    }
    file.sync_all()
        .map_err(|e| io_err("cannot sync", path, e))?;
    Ok(())
}

/// Opens for reading: O_DIRECT when `direct`, else buffered after dropping cached pages.
fn open_read(path: &Path, direct: bool) -> Result<File, ProbeError> {
    let mut o = std::fs::OpenOptions::new();
    o.read(true);
    if direct {
        o.custom_flags(libc::O_DIRECT);
    }
    let f = o.open(path).map_err(|e| io_err("cannot open", path, e))?;
    if !direct {
        use std::os::fd::AsRawFd;
        // SAFETY: a valid descriptor; advice only.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
    Ok(f)
}

/// Whether the folder's file system takes O_DIRECT reads of aligned requests.
fn direct_works(sample: &Path) -> bool {
    let Ok(mut f) = open_read(sample, true) else {
        return false;
    };
    let Ok(mut b) = Aligned::new(ALIGN) else {
        return false;
    };
    f.read(b.as_mut()).is_ok()
}

/// Reads a whole file into `buf` (reused), checking it; returns the bytes read.
fn read_file(path: &Path, f: usize, direct: bool, buf: &mut Aligned) -> Result<usize, ProbeError> {
    let mut file = open_read(path, direct)?;
    let mut off = 0;
    loop {
        let b = buf.as_mut();
        let n = file.read(b).map_err(|e| io_err("cannot read", path, e))?;
        if n == 0 {
            break;
        }
        if !verify(f, off, &b[..n - n % 8]) {
            return Err(CheckError::exact(
                format!("{} near byte {off}", path.display()),
                "other bytes",
                "the bytes written",
            )
            .into());
        }
        off += n;
    }
    Ok(off)
}

/// Runs `readers` threads that take file indices from `order` until it is exhausted (file `f`
/// holds content `id_of(f)`); returns (bytes, files, seconds).
fn read_all(
    paths: &[PathBuf],
    order: &[usize],
    id_of: &(dyn Fn(usize) -> usize + Sync),
    readers: usize,
    direct: bool,
    bufsize: usize,
    cancel: &AtomicBool,
) -> Result<(usize, usize, f64), ProbeError> {
    let next = AtomicUsize::new(0);
    let start = Instant::now();
    let results: Vec<Result<(usize, usize), ProbeError>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..readers)
            .map(|_| {
                s.spawn(|| -> Result<(usize, usize), ProbeError> {
                    let mut buf = Aligned::new(bufsize)?;
                    let (mut bytes, mut files) = (0, 0);
                    loop {
                        if cancel.load(Ordering::Relaxed) {
                            return Err(ProbeError::Interrupted);
                        }
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(&f) = order.get(i) else { break };
                        bytes += read_file(&paths[f], id_of(f), direct, &mut buf)?;
                        files += 1;
                    }
                    Ok((bytes, files))
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or(Err(ProbeError::Panicked("a reader"))))
            .collect()
    });
    let t = start.elapsed().as_secs_f64();
    let (mut bytes, mut files) = (0, 0);
    for r in results {
        let (b, f) = r?;
        bytes += b;
        files += f;
    }
    Ok((bytes, files, t))
}

/// A short label for a path: the folder's own name, or `tmp` for the default.
pub fn label_for(path: &Path) -> String {
    let s: String = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "root".into())
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() {
        "root".into()
    } else {
        s
    }
}

/// Deterministic shuffle (xorshift, Fisher-Yates).
fn shuffled(n: usize, seed: u64) -> Vec<usize> {
    let mut v: Vec<usize> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..n).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.swap(i, (x % (i as u64 + 1)) as usize);
    }
    v
}

/// Measures both patterns under `cfg.path`; `label` names the ceilings (`io/<label>/…`).
pub fn run(
    cfg: &IoConfig,
    label: &str,
    cancel: &AtomicBool,
    progress: &dyn crate::probe::Progress,
) -> Result<IoResult, ProbeError> {
    if !cfg.path.is_dir() {
        return Err(ProbeError::NotAFolder(cfg.path.clone()));
    }
    let dir = cfg.path.join(format!("roofline-io-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| io_err("cannot create the test folder", &dir, e))?;
    let guard = TestDir(dir.clone());
    let readers = cfg.readers.max(1);
    let (big_files, big_len, small_files, passes) = if cfg.quick {
        (readers, 64usize << 20, 1000usize, 2usize)
    } else {
        (readers, 512usize << 20, 5000usize, 3usize)
    };
    progress.begin(4);
    progress.advance("io: writing the test files");
    let big: Vec<PathBuf> = (0..big_files)
        .map(|i| dir.join(format!("big-{i}")))
        .collect();
    for (i, p) in big.iter().enumerate() {
        if cancel.load(Ordering::Relaxed) {
            return Err(ProbeError::Interrupted);
        }
        write_file(p, i, big_len)?;
    }
    let small: Vec<PathBuf> = (0..small_files)
        .map(|i| dir.join(format!("small-{i:06}.jpg")))
        .collect();
    for (i, p) in small.iter().enumerate() {
        if i % 256 == 0 && cancel.load(Ordering::Relaxed) {
            return Err(ProbeError::Interrupted);
        }
        write_file(p, 1000 + i, SMALL_FILE)?;
    }
    let direct = direct_works(&big[0]);
    let mut notes = Vec::new();
    if !direct {
        notes.push(format!(
            "io/{label}: the file system of {} refuses O_DIRECT: files were read buffered after asking the kernel to drop them from the page cache (POSIX_FADV_DONTNEED); the page cache may still help",
            cfg.path.display()
        ));
    }
    progress.advance("io: sequential reads");
    let mut seq = Vec::new();
    let order: Vec<usize> = (0..big_files).collect();
    for _ in 0..passes {
        let (bytes, _, t) = read_all(&big, &order, &|f| f, readers, direct, REQUEST, cancel)?;
        if bytes != big_files * big_len {
            return Err(CheckError::exact(
                "bytes a sequential read returned",
                bytes,
                big_files * big_len,
            )
            .into());
        }
        seq.push(bytes as f64 / t);
    }
    progress.advance("io: small files");
    let mut small_bw = Vec::new();
    let mut small_rate = Vec::new();
    let small_paths: Vec<PathBuf> = small.clone();
    for pass in 0..passes {
        let order = shuffled(small_files, 0x5EED + pass as u64);
        // Small file i holds content id 1000 + i.
        let bufsize = SMALL_FILE.next_multiple_of(ALIGN);
        let (bytes, files, t) = read_all(
            &small_paths,
            &order,
            &|f| 1000 + f,
            readers,
            direct,
            bufsize,
            cancel,
        )?;
        if files != small_files || bytes != small_files * SMALL_FILE {
            return Err(CheckError::exact(
                "files and bytes a small-file pass read",
                format!("{files} files, {bytes} bytes"),
                format!("{small_files} files, {} bytes", small_files * SMALL_FILE),
            )
            .into());
        }
        small_bw.push(bytes as f64 / t);
        small_rate.push(files as f64 / t);
    }
    progress.advance("io: removing the test files");
    drop(guard);
    let how = if direct {
        "O_DIRECT"
    } else {
        "buffered after POSIX_FADV_DONTNEED (no O_DIRECT)"
    };
    let mut ceilings = Vec::new();
    let mk = |id: CeilingId,
              unit: &str,
              samples: &[f64],
              bytes: f64,
              method: String|
     -> Option<Ceiling> {
        let stats = Stats::from_samples(samples)?;
        let per_iteration = PerIteration { ops: 0.0, bytes };
        Some(Ceiling::measured(
            id,
            CeilingKind::Io,
            unit,
            readers,
            stats,
            per_iteration,
            method,
        ))
    };
    ceilings.extend(mk(
        CeilingId::Io {
            label: label.to_string(),
            test: IoTest::Sequential,
        },
        "B/s",
        &seq,
        (big_files * big_len) as f64,
        format!(
            "{readers} readers, one {} file each, read sequentially in 4 MiB requests, {how}, {}; every byte checked; best of {passes} passes",
            crate::probe::cpu::human_bytes(big_len as f64),
            cfg.path.display()
        ),
    ));
    let small_method = format!(
        "{small_files} files of 100 KiB (an image dataset's pattern) read whole in a random order by {readers} readers, {how}, {}; every byte checked; best of {passes} passes",
        cfg.path.display()
    );
    ceilings.extend(mk(
        CeilingId::Io {
            label: label.to_string(),
            test: IoTest::Small,
        },
        "B/s",
        &small_bw,
        (small_files * SMALL_FILE) as f64,
        small_method.clone(),
    ));
    ceilings.extend(mk(
        CeilingId::Io {
            label: label.to_string(),
            test: IoTest::SmallFiles,
        },
        "file/s",
        &small_rate,
        (small_files * SMALL_FILE) as f64,
        small_method,
    ));
    Ok(IoResult {
        ceilings,
        notes,
        direct,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_patterns_measured_checked_and_removed() {
        let base = std::env::temp_dir().join(format!("roofline-io-test-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        let cfg = IoConfig {
            path: base.clone(),
            readers: 2,
            quick: true,
        };
        let r = run(&cfg, "t", &AtomicBool::new(false), &crate::probe::Silent).unwrap();
        let ids: Vec<String> = r.ceilings.iter().map(|c| c.id.to_string()).collect();
        assert_eq!(ids, ["io/t/seq", "io/t/small", "io/t/small/files"]);
        assert!(r
            .ceilings
            .iter()
            .all(|c| c.value > 0.0 && c.stats.samples == 2));
        // Nothing left behind.
        assert_eq!(std::fs::read_dir(&base).unwrap().count(), 0);
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn corruption_is_found() {
        let mut b = vec![0u8; 4096];
        fill(3, 8192, &mut b);
        assert!(verify(3, 8192, &b));
        b[100] ^= 1;
        assert!(!verify(3, 8192, &b));
        assert!(!verify(4, 8192, &[0u8; 64]));
    }

    #[test]
    fn shuffle_is_a_permutation_and_labels_are_safe() {
        let mut s = shuffled(1000, 7);
        assert_ne!(s[..10], (0..10).collect::<Vec<_>>()[..]);
        s.sort_unstable();
        assert_eq!(s, (0..1000).collect::<Vec<_>>());
        assert_eq!(label_for(Path::new("/mnt/lustre/data set")), "data_set");
        assert_eq!(label_for(Path::new("/")), "root");
    }

    #[test]
    fn a_missing_folder_is_an_error() {
        let cfg = IoConfig {
            path: "/nonexistent/roofline".into(),
            readers: 1,
            quick: true,
        };
        assert!(run(&cfg, "x", &AtomicBool::new(false), &crate::probe::Silent).is_err());
    }
}
