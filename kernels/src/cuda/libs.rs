//! Finding the CUDA libraries before cudarc touches them.
//!
//! cudarc (feature `dynamic-loading`) opens each library by name on first use and panics when
//! it is missing. We look first: `present(Lib::X)` tries the usual directories by absolute path
//! (the CUDA toolkit, `CUDA_HOME`/`CUDA_PATH`, pip wheels under `ROOFLINE_CUDA_LIBS`, then the
//! dynamic linker's own search) and keeps the first that opens loaded. A later `dlopen` of the
//! same soname by cudarc then finds the already-loaded library, wherever it lay. The directories
//! looked in are kept for the error message.

use std::ffi::CString;
use std::path::PathBuf;
use std::sync::Mutex;

/// The CUDA libraries roofline uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lib {
    /// The driver API (libcuda), installed with the NVIDIA driver.
    Driver,
    Nvrtc,
    Cublas,
    CublasLt,
    Cudnn,
    Nccl,
    Nvml,
}

impl Lib {
    /// File names to try, most specific first.
    fn names(self) -> &'static [&'static str] {
        match self {
            Lib::Driver => &["libcuda.so.1", "libcuda.so"],
            // CUDA 12 only: the bindings are cudarc's cuda-12040 ones.
            Lib::Nvrtc => &["libnvrtc.so.12", "libnvrtc.so"],
            Lib::Cublas => &["libcublas.so.12", "libcublas.so"],
            Lib::CublasLt => &["libcublasLt.so.12", "libcublasLt.so"],
            Lib::Cudnn => &["libcudnn.so.9", "libcudnn.so"],
            Lib::Nccl => &["libnccl.so.2", "libnccl.so"],
            Lib::Nvml => &["libnvidia-ml.so.1", "libnvidia-ml.so"],
        }
    }

    /// The pip wheel folder (under site-packages/nvidia/) that ships this library.
    fn wheel_dir(self) -> Option<&'static str> {
        match self {
            Lib::Nvrtc => Some("cuda_nvrtc/lib"),
            Lib::Cublas | Lib::CublasLt => Some("cublas/lib"),
            Lib::Cudnn => Some("cudnn/lib"),
            Lib::Nccl => Some("nccl/lib"),
            Lib::Driver | Lib::Nvml => None,
        }
    }

    pub fn label(self) -> &'static str {
        match self {
            Lib::Driver => "NVIDIA driver (libcuda)",
            Lib::Nvrtc => "NVRTC (libnvrtc)",
            Lib::Cublas => "cuBLAS (libcublas)",
            Lib::CublasLt => "cuBLASLt (libcublasLt)",
            Lib::Cudnn => "cuDNN (libcudnn)",
            Lib::Nccl => "NCCL (libnccl)",
            Lib::Nvml => "NVML (libnvidia-ml)",
        }
    }
}

/// The directories searched by absolute path, in order; the dynamic linker's own search
/// (`LD_LIBRARY_PATH`, ld.so.cache, system directories) is tried after them.
pub fn search_dirs(lib: Lib) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    // ROOFLINE_CUDA_LIBS: a colon-separated list of folders, each either a library folder or a
    // Python site-packages/nvidia folder of the CUDA pip wheels.
    if let Some(list) = std::env::var_os("ROOFLINE_CUDA_LIBS") {
        for d in std::env::split_paths(&list) {
            if let Some(w) = lib.wheel_dir() {
                dirs.push(d.join(w));
            }
            dirs.push(d);
        }
    }
    for var in ["CUDA_HOME", "CUDA_PATH"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(PathBuf::from(&root).join("lib64"));
            dirs.push(PathBuf::from(root).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    if lib == Lib::Driver || lib == Lib::Nvml {
        // Where distributions and the NVIDIA installer put the driver's libraries.
        dirs.push(PathBuf::from("/usr/lib/x86_64-linux-gnu"));
        dirs.push(PathBuf::from("/usr/lib64"));
        dirs.push(PathBuf::from("/usr/lib/wsl/lib"));
    }
    dirs
}

struct Loaded {
    lib: Lib,
    path: String,
}

static LOADED: Mutex<Vec<Loaded>> = Mutex::new(Vec::new());

fn try_open(spec: &str) -> bool {
    let Ok(c) = CString::new(spec) else {
        return false;
    };
    // SAFETY: dlopen with a valid C string; the handle is deliberately never closed so the
    // library stays loaded for cudarc's later dlopen by soname.
    let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
    !handle.is_null()
}

/// Where `lib` was loaded from, loading it if needed; `None` when it is nowhere to be found.
pub fn locate(lib: Lib) -> Option<String> {
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = loaded.iter().find(|l| l.lib == lib) {
        return Some(l.path.clone());
    }
    let mut found = None;
    'dirs: for dir in search_dirs(lib) {
        for name in lib.names() {
            let p = dir.join(name);
            if p.exists() && try_open(&p.to_string_lossy()) {
                found = Some(p.to_string_lossy().into_owned());
                break 'dirs;
            }
        }
    }
    if found.is_none() {
        found = lib
            .names()
            .iter()
            .find(|n| try_open(n))
            .map(|n| n.to_string());
    }
    let path = found?;
    loaded.push(Loaded {
        lib,
        path: path.clone(),
    });
    Some(path)
}

/// Whether `lib` can be used, after our search and cudarc's own check.
pub fn present(lib: Lib) -> bool {
    if locate(lib).is_none() {
        return false;
    }
    // SAFETY: cudarc's presence checks only try to open the library by name.
    unsafe {
        match lib {
            Lib::Driver => cudarc::driver::sys::is_culib_present(),
            Lib::Nvrtc => cudarc::nvrtc::sys::is_culib_present(),
            Lib::Cublas => cudarc::cublas::sys::is_culib_present(),
            Lib::CublasLt => cudarc::cublaslt::sys::is_culib_present(),
            Lib::Cudnn => cudarc::cudnn::sys::is_culib_present(),
            Lib::Nccl => cudarc::nccl::sys::is_culib_present(),
            Lib::Nvml => true,
        }
    }
}

/// One line saying that `lib` was not found and where we looked.
pub fn not_found(lib: Lib) -> String {
    let dirs: Vec<String> = search_dirs(lib)
        .iter()
        .map(|d| d.display().to_string())
        .collect();
    format!(
        "no {} found: looked for {} in {} and the dynamic linker's path (LD_LIBRARY_PATH, ld.so.cache); \
         set ROOFLINE_CUDA_LIBS to the folder that holds it",
        lib.label(),
        lib.names().join(" / "),
        dirs.join(", ")
    )
}
