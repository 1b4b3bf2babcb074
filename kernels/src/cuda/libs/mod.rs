//! Finding the CUDA libraries, CUDA 12 and CUDA 13 alike, before cudarc touches them.
//!
//! cudarc (feature `dynamic-loading`) opens each library by file name on first use and panics
//! when it is missing. We look first: [`locate`] tries the usual places by absolute path and
//! keeps the first that opens loaded (`RTLD_GLOBAL`). cudarc's later `dlopen` by soname then
//! finds the library already loaded, wherever it lay: glibc matches a file name against the
//! sonames of loaded objects. cudarc is built with the CUDA 13.0 bindings, whose candidate
//! names include both `lib*.so.13` and `lib*.so.12` (the 12.x bindings never try `.13`); the
//! functions and enum values roofline uses are the same in both generations (checked when the
//! bindings were chosen: no shared enum value differs), and the one driver entry point those
//! bindings would take from a newer driver (`cuEventElapsedTime_v2`, R570+) is called by its
//! first name instead ([`crate::cuda::device::Event::seconds_to`]). NCCL (`libnccl.so.2`, a
//! name cudarc never tries) is called through roofline's own table ([`crate::cuda::nccl_lib`]).
//!
//! First, for NVRTC, cuBLAS, cuBLASLt and cuDNN and unless `ROOFLINE_CUDA_LIBS` is set, the
//! file the dynamic linker gives for the unversioned name (`libcublas.so`), if any: the bindings
//! open that name first, so a copy on `LD_LIBRARY_PATH` or in ld.so.cache is the one they call
//! whatever else is loaded. Then, where we look, in order (the list is kept for the error
//! message):
//! 1. `ROOFLINE_CUDA_LIBS`: folders, each a library folder, a Python `site-packages` (or its
//!    `nvidia` folder) holding NVIDIA's CUDA wheels, or a virtual environment;
//! 2. the active virtual environment (`VIRTUAL_ENV`), any virtual environment whose `bin` is on
//!    the PATH, and the conda environment (`CONDA_PREFIX`: its `lib` and its wheels);
//! 3. `CUDA_HOME`, `CUDA_PATH`, `CUDA_ROOT` (`lib64`, `lib`, `targets/x86_64-linux/lib`, on
//!    aarch64 `targets/sbsa-linux/lib`);
//! 4. `/usr/local/cuda`, then `/usr/local/cuda-13.*` and `/usr/local/cuda-12.*`, newest first;
//! 5. for the driver and NVML, the distributions' library folders;
//! 6. the dynamic linker's own search (`LD_LIBRARY_PATH`, ld.so.cache) by soname.
//!
//! Wheel layouts: CUDA 12 puts each library in its own folder (`nvidia/cuda_nvrtc/lib`,
//! `nvidia/cublas/lib`); CUDA 13 puts them together in `nvidia/cu13/lib`. cuDNN
//! (`nvidia/cudnn/lib/libcudnn.so.9`) and NCCL (`nvidia/nccl/lib/libnccl.so.2`) keep theirs.
//!
//! Generations: where the driver is loaded first and supports only CUDA 12, `.so.13` files are
//! passed over (CUDA 13 libraries need driver R580 or newer).

use std::ffi::{c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The CUDA libraries roofline uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    pub const ALL: [Lib; 7] = [
        Lib::Driver,
        Lib::Nvml,
        Lib::Nvrtc,
        Lib::Cublas,
        Lib::CublasLt,
        Lib::Cudnn,
        Lib::Nccl,
    ];

    /// File names to try, newest generation first.
    pub fn names(self) -> &'static [&'static str] {
        match self {
            Lib::Driver => &["libcuda.so.1", "libcuda.so"],
            Lib::Nvrtc => &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
            Lib::Cublas => &["libcublas.so.13", "libcublas.so.12", "libcublas.so"],
            Lib::CublasLt => &["libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"],
            Lib::Cudnn => &["libcudnn.so.9", "libcudnn.so"],
            Lib::Nccl => &["libnccl.so.2", "libnccl.so"],
            Lib::Nvml => &["libnvidia-ml.so.1", "libnvidia-ml.so"],
        }
    }

    /// The folders under a `site-packages/nvidia` folder of NVIDIA's wheels that ship this
    /// library: CUDA 13's shared folder first, then CUDA 12's own.
    pub fn wheel_dirs(self) -> &'static [&'static str] {
        match self {
            Lib::Nvrtc => &["cu13/lib", "cuda_nvrtc/lib"],
            Lib::Cublas | Lib::CublasLt => &["cu13/lib", "cublas/lib"],
            Lib::Cudnn => &["cudnn/lib"],
            Lib::Nccl => &["nccl/lib"],
            Lib::Driver | Lib::Nvml => &[],
        }
    }

    /// Whether cudarc's bindings open it by its unversioned name first, through the dynamic
    /// linker, so that a copy there wins over every folder we search ([`locate`]). Not the
    /// driver (a toolkit's `stubs/libcuda.so` must never be taken for it), NVML, or NCCL (called
    /// through our own table, by the file we found).
    fn linker_first(self) -> bool {
        matches!(self, Lib::Nvrtc | Lib::Cublas | Lib::CublasLt | Lib::Cudnn)
    }

    /// The libraries it opens by soname itself, to be loaded before it.
    fn needs(self) -> &'static [Lib] {
        match self {
            Lib::Cublas => &[Lib::CublasLt],
            Lib::Cudnn => &[Lib::CublasLt, Lib::Nvrtc],
            _ => &[],
        }
    }

    /// The pip packages that install it, per CUDA generation, for the fix in an error.
    pub fn wheels(self) -> Option<(&'static str, &'static str)> {
        match self {
            Lib::Nvrtc => Some(("nvidia-cuda-nvrtc-cu12", "nvidia-cuda-nvrtc")),
            Lib::Cublas | Lib::CublasLt => Some(("nvidia-cublas-cu12", "nvidia-cublas")),
            Lib::Cudnn => Some(("nvidia-cudnn-cu12", "nvidia-cudnn-cu13")),
            Lib::Nccl => Some(("nvidia-nccl-cu12", "nvidia-nccl-cu13")),
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

    /// A function every version exports, to ask the loader which file cudarc really uses.
    fn probe_symbol(self) -> &'static CStr {
        match self {
            Lib::Driver => c"cuInit",
            Lib::Nvrtc => c"nvrtcVersion",
            Lib::Cublas => c"cublasGetProperty",
            Lib::CublasLt => c"cublasLtGetVersion",
            Lib::Cudnn => c"cudnnGetVersion",
            Lib::Nccl => c"ncclGetVersion",
            Lib::Nvml => c"nvmlInit_v2",
        }
    }

    /// The exact fix for a missing library, for `roofline doctor` and the errors.
    pub fn fix(self) -> String {
        match self.wheels() {
            Some((w12, w13)) => format!(
                "pip install {w13} (CUDA 13, driver R580+) or {w12} (CUDA 12) into the active virtual environment, or set ROOFLINE_CUDA_LIBS to the folder that holds {}",
                self.names()[0]
            ),
            None => "install the NVIDIA driver (it ships libcuda.so.1 and libnvidia-ml.so.1); in a container, run it with the GPU passed through (docker --gpus all, or enroot/pyxis)".into(),
        }
    }
}

/// The environment discovery reads, apart so that tests can give their own.
#[derive(Clone, Debug, Default)]
pub struct SearchEnv {
    pub roofline_cuda_libs: Option<std::ffi::OsString>,
    pub virtual_env: Option<PathBuf>,
    /// Virtual environments whose `bin` is on the PATH (a `python3` there with `pyvenv.cfg`
    /// beside its folder): the environment a user runs Python from, activated or not.
    pub path_venvs: Vec<PathBuf>,
    pub conda_prefix: Option<PathBuf>,
    pub cuda_roots: Vec<PathBuf>,
    /// `/usr/local`: where the toolkits' `cuda-XY.Z` folders are looked for.
    pub toolkit_parent: PathBuf,
}

impl SearchEnv {
    /// This process's environment.
    pub fn from_process() -> SearchEnv {
        SearchEnv {
            roofline_cuda_libs: std::env::var_os("ROOFLINE_CUDA_LIBS"),
            virtual_env: std::env::var_os("VIRTUAL_ENV").map(PathBuf::from),
            path_venvs: std::env::var_os("PATH")
                .map(|p| venvs_on_path(&p))
                .unwrap_or_default(),
            conda_prefix: std::env::var_os("CONDA_PREFIX").map(PathBuf::from),
            cuda_roots: ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"]
                .iter()
                .filter_map(|v| std::env::var_os(v).map(PathBuf::from))
                .collect(),
            toolkit_parent: PathBuf::from("/usr/local"),
        }
    }
}

/// The virtual environments whose `bin` folder is on `path`, in the PATH's order.
pub fn venvs_on_path(path: &std::ffi::OsStr) -> Vec<PathBuf> {
    std::env::split_paths(path)
        .filter(|bin| bin.join("python3").exists())
        .filter_map(|bin| {
            let root = bin.parent()?.to_path_buf();
            root.join("pyvenv.cfg").is_file().then_some(root)
        })
        .collect()
}

/// The `site-packages` folders of a virtual or conda environment (`lib/python3.*/site-packages`).
fn site_packages(env_root: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for lib in ["lib", "lib64"] {
        if let Ok(rd) = std::fs::read_dir(env_root.join(lib)) {
            let mut v: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .is_some_and(|n| n.to_string_lossy().starts_with("python"))
                })
                .map(|p| p.join("site-packages"))
                .filter(|p| p.is_dir())
                .collect();
            v.sort();
            out.extend(v);
        }
    }
    out
}

/// The library folders of a wheel tree for `lib`: `root` may be a `site-packages/nvidia`
/// folder, a `site-packages` folder or an environment's root.
fn wheel_folders(lib: Lib, root: &Path) -> Vec<PathBuf> {
    let mut nvidia_dirs = vec![root.to_path_buf(), root.join("nvidia")];
    for sp in site_packages(root) {
        nvidia_dirs.push(sp.join("nvidia"));
    }
    let mut out = Vec::new();
    for n in nvidia_dirs {
        for w in lib.wheel_dirs() {
            out.push(n.join(w));
        }
    }
    out
}

/// The toolkit folders under `parent` (`cuda-13.0`, `cuda-12.4`, ...), newest first.
fn toolkits(parent: &Path) -> Vec<PathBuf> {
    let mut v: Vec<((u32, u32), PathBuf)> = std::fs::read_dir(parent)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let ver = name.strip_prefix("cuda-")?;
            let mut it = ver.split('.');
            let major = it.next()?.parse().ok()?;
            let minor = it.next().and_then(|m| m.parse().ok()).unwrap_or(0);
            Some(((major, minor), e.path()))
        })
        .collect();
    v.sort_by_key(|e| std::cmp::Reverse(e.0));
    v.into_iter().map(|(_, p)| p).collect()
}

fn toolkit_lib_dirs(root: &Path) -> [PathBuf; 3] {
    [
        root.join("lib64"),
        root.join("lib"),
        root.join(TOOLKIT_TARGET),
    ]
}

/// The CUDA toolkit's per-target library folder: x86-64, or Arm servers (SBSA: Grace).
const TOOLKIT_TARGET: &str = if cfg!(target_arch = "aarch64") {
    "targets/sbsa-linux/lib"
} else {
    "targets/x86_64-linux/lib"
};

/// Where Debian-style distributions put the driver's libraries on this architecture.
const MULTIARCH_LIB: &str = if cfg!(target_arch = "aarch64") {
    "/usr/lib/aarch64-linux-gnu"
} else {
    "/usr/lib/x86_64-linux-gnu"
};

/// The directories searched by absolute path for `lib`, in order; the dynamic linker's own
/// search (`LD_LIBRARY_PATH`, ld.so.cache, system directories) is tried after them.
pub fn search_dirs_in(lib: Lib, env: &SearchEnv) -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(list) = &env.roofline_cuda_libs {
        for d in std::env::split_paths(list) {
            dirs.extend(wheel_folders(lib, &d));
            dirs.push(d);
        }
    }
    if let Some(v) = &env.virtual_env {
        dirs.extend(wheel_folders(lib, v));
    }
    for v in &env.path_venvs {
        dirs.extend(wheel_folders(lib, v));
    }
    if let Some(c) = &env.conda_prefix {
        dirs.extend(wheel_folders(lib, c));
        dirs.push(c.join("lib"));
    }
    for root in &env.cuda_roots {
        dirs.extend(toolkit_lib_dirs(root));
    }
    dirs.extend(toolkit_lib_dirs(&env.toolkit_parent.join("cuda")));
    for tk in toolkits(&env.toolkit_parent) {
        dirs.extend(toolkit_lib_dirs(&tk));
    }
    if lib == Lib::Driver || lib == Lib::Nvml {
        // Where distributions and the NVIDIA installer put the driver's libraries.
        dirs.push(PathBuf::from(MULTIARCH_LIB));
        dirs.push(PathBuf::from("/usr/lib64"));
        dirs.push(PathBuf::from("/usr/lib/wsl/lib"));
    }
    let mut seen = std::collections::HashSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

/// The directories searched for `lib` in this process's environment.
pub fn search_dirs(lib: Lib) -> Vec<PathBuf> {
    search_dirs_in(lib, &SearchEnv::from_process())
}

/// The CUDA major version a file name carries (`libnvrtc.so.13` → 13), for the libraries
/// versioned by CUDA generation; `None` for unversioned names and those of other schemes.
pub fn generation_of(lib: Lib, file: &str) -> Option<u32> {
    if !matches!(lib, Lib::Nvrtc | Lib::Cublas | Lib::CublasLt) {
        return None;
    }
    let name = Path::new(file).file_name()?.to_string_lossy().into_owned();
    name.split(".so.").nth(1)?.split('.').next()?.parse().ok()
}

/// Whether file `name` of `lib` may be loaded under a driver of CUDA generation `max` (none:
/// any): names of a newer CUDA generation are passed over.
fn fits(lib: Lib, name: &str, max: Option<u32>) -> bool {
    match (max, generation_of(lib, name)) {
        (Some(max), Some(g)) => g <= max,
        _ => true,
    }
}

/// The files that exist for `lib`, in the order they are tried; names of a CUDA generation
/// newer than `max_generation` (the driver's) are passed over.
pub fn candidates_in(lib: Lib, env: &SearchEnv, max_generation: Option<u32>) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for dir in search_dirs_in(lib, env) {
        for name in lib.names() {
            if !fits(lib, name, max_generation) {
                continue;
            }
            let p = dir.join(name);
            if p.is_file() && !out.contains(&p) {
                out.push(p);
            }
        }
    }
    out
}

struct Loaded {
    lib: Lib,
    path: String,
}

static LOADED: Mutex<Vec<Loaded>> = Mutex::new(Vec::new());

/// Errors of `dlopen` for the files tried and refused, for the doctor's report.
static REFUSED: Mutex<Vec<(Lib, String)>> = Mutex::new(Vec::new());

/// `dlopen(spec, RTLD_NOW | RTLD_GLOBAL)`, never closed: the library stays loaded for cudarc's
/// later `dlopen` by soname. Null when it would not load.
fn dlopen_global(spec: &str) -> *mut c_void {
    let Ok(c) = CString::new(spec) else {
        return std::ptr::null_mut();
    };
    // SAFETY: dlopen with a valid C string.
    unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) }
}

fn try_open(lib: Lib, spec: &str) -> bool {
    let handle = dlopen_global(spec);
    if handle.is_null() && spec.contains('/') {
        // SAFETY: dlerror returns a thread-local C string or null.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "dlopen failed".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        REFUSED
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((lib, why));
    }
    !handle.is_null()
}

/// The CUDA major version the loaded driver supports (`cuDriverGetVersion` / 1000), when the
/// driver has been located.
fn driver_generation() -> Option<u32> {
    let loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    let path = loaded.iter().find(|l| l.lib == Lib::Driver)?.path.clone();
    drop(loaded);
    let c = CString::new(path).ok()?;
    // SAFETY: the driver is already loaded (RTLD_NOLOAD only looks it up); cuDriverGetVersion
    // takes one out-parameter and needs no cuInit.
    unsafe {
        let h = libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        if h.is_null() {
            return None;
        }
        let f = libc::dlsym(h, c"cuDriverGetVersion".as_ptr());
        if f.is_null() {
            return None;
        }
        let f: unsafe extern "C" fn(*mut i32) -> i32 = std::mem::transmute(f);
        let mut v = 0;
        (f(&mut v) == 0 && v > 0).then_some(v as u32 / 1000)
    }
}

/// The CUDA generation that bounds `lib`'s files: the driver's (located first), for every
/// library but the driver's own two.
fn driver_bound(lib: Lib) -> Option<u32> {
    if matches!(lib, Lib::Driver | Lib::Nvml) {
        None
    } else {
        locate(Lib::Driver).and_then(|_| driver_generation())
    }
}

/// Where `lib` was loaded from, loading it if needed; `None` when it is nowhere to be found.
pub fn locate(lib: Lib) -> Option<String> {
    if let Some(l) = LOADED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .find(|l| l.lib == lib)
    {
        return Some(l.path.clone());
    }
    // The driver first, so that its CUDA generation bounds the libraries'.
    let max_generation = driver_bound(lib);
    // What the library opens by soname itself, loaded first from where we find it: cuBLAS
    // needs its cuBLASLt; cuDNN opens cuBLASLt (legacy convolutions) and NVRTC (runtime-
    // compiled engines) at run time. A missing one is the library's own concern, not ours.
    for dep in lib.needs() {
        let _ = locate(*dep);
    }
    // What the bindings open first is the unversioned name (`libcublas.so`) through the
    // dynamic linker's own search: where that resolves (a toolkit or a distribution's package
    // on LD_LIBRARY_PATH or in ld.so.cache), cudarc calls that file whatever we load, so it is
    // the one to use; a wheel's copy found first would make two ([`shadowed`]). Seen on an
    // H200 image with CUDA 13.0 in /usr/local/cuda-13.0 and cuDNN 9.14 in /usr/lib beside
    // PyTorch's wheels (2026-11-26). Not when ROOFLINE_CUDA_LIBS names the folders to use: a
    // copy on the linker's path then contradicts that choice, and `shadowed` says so.
    let env = SearchEnv::from_process();
    let mut found = (lib.linker_first() && env.roofline_cuda_libs.is_none())
        .then(|| lib.names().iter().find(|n| n.ends_with(".so")))
        .flatten()
        .and_then(|bare| linker_file(bare, lib.probe_symbol()))
        .filter(|file| fits(lib, file, max_generation));
    if found.is_none() {
        found = candidates_in(lib, &env, max_generation)
            .into_iter()
            .map(|p| p.to_string_lossy().into_owned())
            .find(|p| try_open(lib, p));
    }
    if found.is_none() {
        found = lib
            .names()
            .iter()
            .filter(|n| fits(lib, n, max_generation))
            .find(|n| try_open(lib, n))
            .map(|n| n.to_string());
    }
    let path = found?;
    load_companions(lib, &path);
    let mut loaded = LOADED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(l) = loaded.iter().find(|l| l.lib == lib) {
        return Some(l.path.clone());
    }
    loaded.push(Loaded {
        lib,
        path: path.clone(),
    });
    Some(path)
}

/// The file the dynamic linker's own search gives for `name` (opened, `RTLD_GLOBAL`, and
/// kept open), found through the object that defines `symbol`; `None` when the name does not
/// resolve or the symbol is not in it.
pub fn linker_file(name: &str, symbol: &CStr) -> Option<String> {
    let handle = dlopen_global(name);
    if handle.is_null() {
        return None;
    }
    // SAFETY: `handle` is a loaded object; dlsym only reads its tables.
    file_of(unsafe { libc::dlsym(handle, symbol.as_ptr()) })
}

/// Loads the libraries `lib` itself opens by bare name from beside its file, so that the
/// loader finds them by soname wherever they lie:
/// - NVRTC 13 opens `libnvrtc-builtins.so.13.0` through the linker's search only (not its own
///   folder): from a wheel folder on no search path every compilation fails with
///   NVRTC_ERROR_BUILTIN_OPERATION_FAILURE;
/// - cuDNN 9's `libcudnn.so.9` is a dispatcher that opens its sub-libraries (`libcudnn_graph`,
///   `_ops`, `_cnn`, `_adv`, `_heuristic`, `_engines_*`) by bare soname at first use.
///
/// Several passes, since a sub-library loads only after those it needs.
fn load_companions(lib: Lib, path: &str) {
    let prefix = match lib {
        Lib::Nvrtc => "libnvrtc-builtins.so.",
        Lib::Cudnn => "libcudnn_",
        _ => return,
    };
    let Some(dir) = Path::new(path)
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
    else {
        return;
    };
    let Ok(rd) = std::fs::read_dir(dir) else {
        return;
    };
    let mut todo: Vec<PathBuf> = rd
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                // Versioned shared objects only (not .a archives, not NVRTC's `.alt` variant).
                n.starts_with(prefix) && n.contains(".so.") && !n.contains(".alt.")
            })
        })
        .collect();
    todo.sort();
    while !todo.is_empty() {
        let before = todo.len();
        todo.retain(|p| dlopen_global(&p.to_string_lossy()).is_null());
        if todo.len() == before {
            break;
        }
    }
}

/// Why files that exist for `lib` would not load (`dlopen`'s words), if any were refused.
pub fn refused(lib: Lib) -> Vec<String> {
    REFUSED
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .filter(|(l, _)| *l == lib)
        .map(|(_, w)| w.clone())
        .collect()
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
            // Called through roofline's own table, from the file found above.
            Lib::Nccl => super::nccl_lib::get().is_ok(),
            Lib::Nvml => true,
        }
    }
}

/// Fails unless `lib` is found and the file the bindings call is the file roofline found:
/// `Missing` (where we looked, the fix) or `Shadowed` (both files, the fix). Every use of a
/// library starts here.
pub fn require(lib: Lib) -> Result<(), super::CudaError> {
    if !present(lib) {
        return Err(super::CudaError::Missing(not_found(lib)));
    }
    match shadowed(lib) {
        Some(two) => Err(super::CudaError::Shadowed(two.to_string())),
        None => Ok(()),
    }
}

/// Two files of one library in the process: the one roofline found, and the one cudarc's
/// bindings would call.
#[derive(Clone, Debug)]
pub struct TwoCopies {
    pub lib: Lib,
    pub found: String,
    pub used: String,
}

impl TwoCopies {
    fn used_dir(&self) -> String {
        Path::new(&self.used)
            .parent()
            .map(|d| d.display().to_string())
            .unwrap_or_default()
    }

    pub fn what(&self) -> String {
        format!(
            "two copies of {}: roofline found {}, but the bindings would call {}, a second copy that the dynamic linker's path (LD_LIBRARY_PATH, ld.so.cache) gives for its unversioned name; one process must not mix two CUDA library versions",
            self.lib.label(),
            self.found,
            self.used
        )
    }

    pub fn fix(&self) -> String {
        let dir = self.used_dir();
        format!(
            "take {dir} off LD_LIBRARY_PATH (or run ldconfig without it), or set ROOFLINE_CUDA_LIBS={dir} to use that copy throughout (`roofline doctor` shows every library's file)"
        )
    }
}

impl std::fmt::Display for TwoCopies {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}. Fix: {}", self.what(), self.fix())
    }
}

/// Whether the bindings would call another file of `lib` than the one roofline found. cudarc
/// opens each library by its unversioned name first (`libcublas.so`, then `libcublas.so.13`):
/// where a toolkit's copy lies on the dynamic linker's path (`LD_LIBRARY_PATH`, ld.so.cache),
/// that name opens it beside the wheel's file roofline loaded, and the two mix versions (a
/// toolkit's cuBLAS 13.0 calling the wheel's cuBLASLt 13.1 through 76 internal symbols).
/// `None` when they are the same file, or `lib` is absent.
pub fn shadowed(lib: Lib) -> Option<TwoCopies> {
    let found = locate(lib)?;
    let used = in_use(lib)?;
    if !found.contains('/') || same_file(&found, &used) {
        return None;
    }
    Some(TwoCopies { lib, found, used })
}

/// The first library of those present whose bindings would call another file than the one
/// roofline found ([`shadowed`]), for the verbs to refuse before any GPU work. Asked once per
/// process (every GPU verb's `device::init` asks): a loaded library stays loaded.
pub fn all_consistent() -> Result<(), super::CudaError> {
    static FIRST_SHADOWED: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let why = FIRST_SHADOWED.get_or_init(|| {
        Lib::ALL
            .into_iter()
            .filter(|l| *l != Lib::Nvml)
            .find_map(|l| shadowed(l).map(|two| two.to_string()))
    });
    match why {
        Some(why) => Err(super::CudaError::Shadowed(why.clone())),
        None => Ok(()),
    }
}

/// The file the bindings really call into: the object that defines `lib`'s probe symbol in
/// cudarc's handle (or, for NCCL and NVML, ours). `None` when it is not loaded.
pub fn in_use(lib: Lib) -> Option<String> {
    if !present(lib) {
        return None;
    }
    let sym = lib.probe_symbol();
    // SAFETY: the libraries are present (checked above), so cudarc's loaders do not panic;
    // `get` only looks a symbol up; dladdr reads the loader's tables.
    unsafe {
        let addr: *const c_void = match lib {
            Lib::Driver => *cudarc::driver::sys::culib()
                .get::<*const c_void>(sym.to_bytes_with_nul())
                .ok()?,
            Lib::Nvrtc => *cudarc::nvrtc::sys::culib()
                .get::<*const c_void>(sym.to_bytes_with_nul())
                .ok()?,
            Lib::Cublas => *cudarc::cublas::sys::culib()
                .get::<*const c_void>(sym.to_bytes_with_nul())
                .ok()?,
            Lib::CublasLt => *cudarc::cublaslt::sys::culib()
                .get::<*const c_void>(sym.to_bytes_with_nul())
                .ok()?,
            Lib::Cudnn => *cudarc::cudnn::sys::culib()
                .get::<*const c_void>(sym.to_bytes_with_nul())
                .ok()?,
            Lib::Nccl | Lib::Nvml => {
                let path = CString::new(locate(lib)?).ok()?;
                let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
                if h.is_null() {
                    return None;
                }
                libc::dlsym(h, sym.as_ptr())
            }
        };
        file_of(addr)
    }
}

/// Whether the file roofline found for `lib` exports `symbol` (looked up in that file, as
/// loaded; false when `lib` is not found). The gate resolves every call of the code with it.
pub fn resolves(lib: Lib, symbol: &str) -> bool {
    let (Some(path), Ok(sym)) = (locate(lib), CString::new(symbol)) else {
        return false;
    };
    let Ok(path) = CString::new(path) else {
        return false;
    };
    // SAFETY: RTLD_NOLOAD only looks the loaded object up; dlsym reads its tables.
    unsafe {
        let h = libc::dlopen(path.as_ptr(), libc::RTLD_NOW | libc::RTLD_NOLOAD);
        !h.is_null() && !libc::dlsym(h, sym.as_ptr()).is_null()
    }
}

/// The file of the loaded object that holds `addr`, its links resolved.
fn file_of(addr: *const c_void) -> Option<String> {
    if addr.is_null() {
        return None;
    }
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr fills `info` for an address inside a loaded object.
    if unsafe { libc::dladdr(addr, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a C string owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    Some(
        std::fs::canonicalize(&name)
            .map(|p| p.to_string_lossy().into_owned())
            .unwrap_or(name),
    )
}

/// Whether two paths name the same file (links resolved).
pub fn same_file(a: &str, b: &str) -> bool {
    match (std::fs::canonicalize(a), std::fs::canonicalize(b)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a == b,
    }
}

/// One line saying that `lib` was not found, where we looked, and the fix.
pub fn not_found(lib: Lib) -> String {
    let dirs: Vec<String> = search_dirs(lib)
        .iter()
        .filter(|d| d.is_dir())
        .map(|d| d.display().to_string())
        .collect();
    let refused = refused(lib);
    // Files of a newer CUDA than the driver's, passed over (`locate`).
    let driver = driver_bound(lib);
    let passed_over: Vec<String> = match driver {
        Some(max) => candidates_in(lib, &SearchEnv::from_process(), None)
            .into_iter()
            .filter(|p| generation_of(lib, &p.to_string_lossy()).is_some_and(|g| g > max))
            .map(|p| p.display().to_string())
            .collect(),
        None => Vec::new(),
    };
    format!(
        "no {} found: looked for {} in {}the dynamic linker's path (LD_LIBRARY_PATH, ld.so.cache){}{}; fix: {} (`roofline doctor` checks the whole GPU stack)",
        lib.label(),
        lib.names().join(" / "),
        if dirs.is_empty() {
            String::new()
        } else {
            format!("{}, ", dirs.join(", "))
        },
        if refused.is_empty() {
            String::new()
        } else {
            format!(" (refused: {})", refused.join("; "))
        },
        if passed_over.is_empty() {
            String::new()
        } else {
            format!(
                " (passed over, being for a newer CUDA than the driver's {}: {}; CUDA 13 libraries need driver R580 or newer)",
                driver.unwrap_or(0),
                passed_over.join(", ")
            )
        },
        lib.fix()
    )
}

#[cfg(test)]
mod tests;
