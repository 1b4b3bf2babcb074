//! `roofline doctor`: what the GPU path would use, and for each thing missing the exact fix.
//!
//! The same discovery as every GPU command ([`super::libs`]), so a library the doctor reports
//! missing is missing for `probe`, `train` and `place` too, in the same words. Beyond finding
//! files it tries what a first run does: a context on every GPU, one NVRTC kernel compiled and
//! loaded there, a cuBLAS, cuBLASLt and cuDNN handle, NCCL's version; and it checks that the
//! generations fit together (libraries of one CUDA major, none newer than the driver, the
//! library cudarc calls the one discovery found).

use super::device::{self, Gpu};
use super::libs::{self, Lib};
use super::CudaError;
use roofline_model::GpuInfo;
use serde::Serialize;

/// How much a missing or broken part matters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// The GPU path cannot run: `doctor` exits 2.
    Blocker,
    /// Part of it is lost (telemetry, multi-GPU, PTX fallback): reported, exit 0.
    Warning,
}

/// One thing wrong, and what to do about it.
#[derive(Clone, Debug, Serialize)]
pub struct Problem {
    pub severity: Severity,
    pub what: String,
    pub fix: String,
}

/// One library: the file discovery found, the file the bindings call into, its version.
#[derive(Clone, Debug, Serialize)]
pub struct LibStatus {
    pub name: &'static str,
    pub path: Option<String>,
    pub in_use: Option<String>,
    pub version: Option<String>,
    /// What roofline uses it for.
    pub role: &'static str,
}

/// One GPU as the driver and NVML describe it, and whether a kernel loaded on it.
#[derive(Clone, Debug, Serialize)]
pub struct GpuStatus {
    pub info: GpuInfo,
    pub sm_clock_khz: Option<i32>,
    pub memory_clock_khz: Option<i32>,
    pub memory_bus_bits: Option<i32>,
    /// How roofline's kernels load there (`stream.cu: sm_90`), or why not.
    pub kernels: Result<String, String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct MpiStatus {
    /// Whether this binary was built with `--features mpi`.
    pub built_in: bool,
    /// `mpirun --version`'s first line, where `mpirun` is on the PATH.
    pub mpirun: Option<String>,
    /// Ranks when this process was started by mpirun or srun.
    pub launched_ranks: Option<usize>,
}

/// Everything `roofline doctor` reports.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// The CUDA version the driver supports, e.g. (13, 0).
    pub driver_cuda: Option<(u32, u32)>,
    /// The driver's own version (NVML), e.g. "580.82.07".
    pub driver_version: Option<String>,
    pub libraries: Vec<LibStatus>,
    pub gpus: Vec<GpuStatus>,
    pub mpi: MpiStatus,
    pub problems: Vec<Problem>,
}

impl Report {
    /// Whether everything the GPU path needs is there (no blocker).
    pub fn ok(&self) -> bool {
        !self
            .problems
            .iter()
            .any(|p| p.severity == Severity::Blocker)
    }
}

fn role(lib: Lib) -> &'static str {
    match lib {
        Lib::Driver => "every GPU command",
        Lib::Nvml => "inventory (clocks, power limit, PCIe, NVLink) and telemetry",
        Lib::Nvrtc => "roofline's own kernels (FMA, mma, memory, ERT, trainer layers)",
        Lib::Cublas => "GEMM ceilings, the trainer's fully connected layer",
        Lib::CublasLt => "GEMM ceilings (fp8, int8, and the heuristic's best)",
        Lib::Cudnn => "convolution ceilings and the trainer's convolutions",
        Lib::Nccl => "collectives between GPUs and ranks",
    }
}

/// The library's version, where it can be asked without a handle (the library present).
pub fn version(lib: Lib) -> Option<String> {
    match lib {
        Lib::Driver => device::driver_version().ok(),
        Lib::Nvrtc => {
            let (a, b) = super::nvrtc::version().ok()?;
            let archs = super::nvrtc::supported_archs().unwrap_or_default();
            Some(match (archs.iter().min(), archs.iter().max()) {
                (Some(lo), Some(hi)) => format!("{a}.{b} (sm_{lo}…sm_{hi})"),
                _ => format!("{a}.{b}"),
            })
        }
        Lib::Cublas => {
            use cudarc::cublas::sys as b;
            let mut parts = [0i32; 3];
            let props = [
                b::libraryPropertyType::MAJOR_VERSION,
                b::libraryPropertyType::MINOR_VERSION,
                b::libraryPropertyType::PATCH_LEVEL,
            ];
            // SAFETY: out-parameters; each status is checked.
            let ok = props
                .iter()
                .zip(parts.iter_mut())
                .all(|(p, out)| unsafe { b::cublasGetProperty(*p, out).result().is_ok() });
            ok.then(|| format!("{}.{}.{}", parts[0], parts[1], parts[2]))
        }
        Lib::CublasLt => {
            // SAFETY: no arguments. 130001 → 13.0.1 (major·10000 + minor·100 + patch).
            let v = unsafe { cudarc::cublaslt::sys::cublasLtGetVersion() };
            Some(format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100))
        }
        Lib::Cudnn => {
            let v = cudarc::cudnn::result::get_version();
            let rt = cudarc::cudnn::result::get_cudart_version();
            // cuDNN 9: major·10000 + minor·100 + patch; built for CUDA runtime rt (e.g. 12080).
            Some(format!(
                "{}.{}.{} (for CUDA {}.{})",
                v / 10000,
                (v % 10000) / 100,
                v % 100,
                rt / 1000,
                (rt % 1000) / 10
            ))
        }
        Lib::Nccl => crate::comm::nccl::version().ok(),
        Lib::Nvml => None,
    }
}

/// The leading `major.minor` of a version text ("12.8 (sm_50…sm_90)" → (12, 8)).
fn major_minor(v: &str) -> (u32, u32) {
    let mut it = v.split('.').map(|part| {
        part.chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse::<u32>()
            .unwrap_or(0)
    });
    (it.next().unwrap_or(0), it.next().unwrap_or(0))
}

/// The CUDA major a library's version belongs to (cuBLAS 13.x → 13; cuDNN "for CUDA 12.8" → 12).
fn cuda_major(lib: Lib, version: &str) -> Option<u32> {
    let text = match lib {
        Lib::Nvrtc | Lib::Cublas | Lib::CublasLt => version,
        Lib::Cudnn => version.split("for CUDA ").nth(1)?,
        _ => return None,
    };
    text.split('.').next()?.trim().parse().ok()
}

/// Runs every check; `enrich` adds NVML's part of each GPU's inventory.
pub fn diagnose(
    enrich: &dyn Fn(&mut GpuInfo) -> Result<(), roofline_collectors::nvml::NvmlError>,
) -> Report {
    let mut problems = Vec::new();
    let blocker = |what: String, fix: String| Problem {
        severity: Severity::Blocker,
        what,
        fix,
    };
    let driver_cuda = device::driver_version().ok().and_then(|v| {
        let mut it = v.split('.');
        Some((it.next()?.parse().ok()?, it.next()?.parse().ok()?))
    });
    let gpu_count = match device::init() {
        Ok(n) => n,
        // The library loop below reports the missing driver with its fix.
        Err(CudaError::Missing(_)) => 0,
        Err(e) => {
            problems.push(blocker(
                e.to_string(),
                "check `nvidia-smi`; in a container pass the GPUs through (docker --gpus all); under Slurm ask for them (--gpus); CUDA_VISIBLE_DEVICES must not be empty".into(),
            ));
            0
        }
    };
    let launched = crate::comm::launched_ranks();
    let mut libraries = Vec::new();
    for lib in Lib::ALL {
        let path = libs::locate(lib);
        let present = path.is_some() && libs::present(lib);
        let in_use = if present { libs::in_use(lib) } else { None };
        let version = if present { version(lib) } else { None };
        if !present {
            let needed = match lib {
                Lib::Nvml => false,
                // One GPU and one rank need no collectives.
                Lib::Nccl => gpu_count > 1 || launched.is_some(),
                _ => true,
            };
            let what = libs::not_found(lib);
            let what = what.split("; fix:").next().unwrap_or(&what).to_string();
            problems.push(Problem {
                severity: if needed {
                    Severity::Blocker
                } else {
                    Severity::Warning
                },
                what: if needed {
                    what
                } else {
                    format!("{what} (needed for: {})", role(lib))
                },
                fix: lib.fix(),
            });
        }
        // The same refusal as every GPU verb's (`libs::require`), in the doctor's two parts.
        if let Some(two) = present.then(|| libs::shadowed(lib)).flatten() {
            problems.push(blocker(two.what(), two.fix()));
        }
        libraries.push(LibStatus {
            name: lib.label(),
            path,
            in_use,
            version,
            role: role(lib),
        });
    }
    generation_checks(&libraries, driver_cuda, &mut problems);
    let mut gpus = Vec::new();
    let mut first: Option<Gpu> = None;
    for i in 0..gpu_count {
        match gpu_status(i, enrich) {
            Ok((g, gpu)) => {
                // The first GPU, kept open for the library handles below.
                if first.is_none() {
                    first = Some(gpu);
                }
                if let Err(why) = &g.kernels {
                    problems.push(blocker(
                        format!("gpu{i}: roofline's kernels do not load: {why}"),
                        "use an NVRTC of the driver's CUDA major or older (pip install nvidia-cuda-nvrtc-cu12 for a CUDA 12 driver), or upgrade the driver".into(),
                    ));
                }
                let major: u32 = g
                    .info
                    .compute_capability
                    .split('.')
                    .next()
                    .and_then(|m| m.parse().ok())
                    .unwrap_or(0);
                if major < 8 {
                    problems.push(Problem {
                        severity: Severity::Warning,
                        what: format!(
                            "gpu{i} ({}) is compute capability {}: roofline's own kernels need 8.0 or newer; only the libraries and copies are measured",
                            g.info.name, g.info.compute_capability
                        ),
                        fix: "use an Ampere (sm_80) or newer GPU for the full probe".into(),
                    });
                }
                gpus.push(g);
            }
            Err(e) => problems.push(blocker(
                format!("gpu{i} cannot be opened: {e}"),
                "check `nvidia-smi` (compute mode, processes holding the GPU, Xid errors in dmesg)"
                    .into(),
            )),
        }
    }
    if let Some(gpu) = &first {
        handle_checks(gpu, &mut problems);
    }
    let driver_version = gpus.iter().find_map(|g| g.info.driver_version.clone());
    Report {
        driver_cuda,
        driver_version,
        libraries,
        gpus,
        mpi: mpi_status(),
        problems,
    }
}

/// Libraries of one CUDA major, none newer than the driver.
fn generation_checks(
    libraries: &[LibStatus],
    driver_cuda: Option<(u32, u32)>,
    problems: &mut Vec<Problem>,
) {
    let majors: Vec<(Lib, u32)> = Lib::ALL
        .iter()
        .zip(libraries)
        .filter_map(|(l, s)| Some((*l, cuda_major(*l, s.version.as_deref()?)?)))
        .collect();
    if let Some((dmaj, dmin)) = driver_cuda {
        for (lib, m) in &majors {
            if *m > dmaj {
                problems.push(Problem {
                    severity: Severity::Blocker,
                    what: format!(
                        "{} is for CUDA {m}, the driver supports CUDA {dmaj}.{dmin}",
                        lib.label()
                    ),
                    fix: format!(
                        "upgrade the driver (CUDA {m} needs R{}+) or install the CUDA {dmaj} build of the library",
                        if *m >= 13 { 580 } else { 525 }
                    ),
                });
            }
        }
        if let Some(v) = libraries
            .iter()
            .zip(Lib::ALL)
            .find(|(_, l)| *l == Lib::Nvrtc)
            .and_then(|(s, _)| s.version.clone())
        {
            let nv = major_minor(&v);
            if nv.0 == dmaj && nv > (dmaj, dmin) {
                problems.push(Problem {
                    severity: Severity::Warning,
                    what: format!("NVRTC {}.{} is newer than the driver's CUDA {dmaj}.{dmin}: SASS loads, but the PTX fallback (for a GPU NVRTC cannot target) would not", nv.0, nv.1),
                    fix: format!("install NVRTC {dmaj}.{dmin} or older, or a newer driver"),
                });
            }
        }
    }
    let blas: Vec<u32> = majors
        .iter()
        .filter(|(l, _)| matches!(l, Lib::Cublas | Lib::CublasLt))
        .map(|(_, m)| *m)
        .collect();
    if blas.len() == 2 && blas[0] != blas[1] {
        problems.push(Problem {
            severity: Severity::Blocker,
            what: format!(
                "cuBLAS is CUDA {} but cuBLASLt is CUDA {}: cuBLAS needs the cuBLASLt it shipped with",
                blas[0], blas[1]
            ),
            fix: "install cuBLAS and cuBLASLt from one package (nvidia-cublas, or nvidia-cublas-cu12)".into(),
        });
    }
}

fn gpu_status(
    ordinal: usize,
    enrich: &dyn Fn(&mut GpuInfo) -> Result<(), roofline_collectors::nvml::NvmlError>,
) -> Result<(GpuStatus, Gpu), CudaError> {
    let mut gpu = Gpu::open(ordinal)?;
    let mut info = crate::probe::gpu::inventory(&gpu);
    let _ = enrich(&mut info);
    use cudarc::driver::sys::CUdevice_attribute as A;
    let kernels = if libs::present(Lib::Nvrtc) {
        gpu.function("stream_init")
            .map(|_| gpu.loaded().join(", "))
            .map_err(|e| e.to_string())
    } else {
        Err("no NVRTC".into())
    };
    let status = GpuStatus {
        sm_clock_khz: gpu.attribute(A::CU_DEVICE_ATTRIBUTE_CLOCK_RATE).ok(),
        memory_clock_khz: gpu.attribute(A::CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE).ok(),
        memory_bus_bits: gpu
            .attribute(A::CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH)
            .ok(),
        info,
        kernels,
    };
    Ok((status, gpu))
}

/// A cuBLAS, cuBLASLt and cuDNN handle on the first GPU: the libraries initialise with this
/// driver (a library of a newer CUDA than the driver fails here).
fn handle_checks(gpu: &Gpu, problems: &mut Vec<Problem>) {
    let ordinal = gpu.ordinal;
    let mut fail = |what: String| {
        problems.push(Problem {
            severity: Severity::Blocker,
            what,
            fix: "install the library build of the driver's CUDA major (see the versions above)"
                .into(),
        })
    };
    if libs::present(Lib::Cublas) {
        match cudarc::cublas::result::create_handle() {
            // SAFETY: created just above, destroyed once.
            Ok(h) => unsafe {
                let _ = cudarc::cublas::result::destroy_handle(h);
            },
            Err(e) => fail(format!("cublasCreate on gpu{ordinal}: {e:?}")),
        }
    }
    if libs::present(Lib::CublasLt) {
        match cudarc::cublaslt::result::create_handle() {
            // SAFETY: created just above, destroyed once.
            Ok(h) => unsafe {
                let _ = cudarc::cublaslt::result::destroy_handle(h);
            },
            Err(e) => fail(format!("cublasLtCreate on gpu{ordinal}: {e:?}")),
        }
    }
    if libs::present(Lib::Cudnn) {
        if let Err(e) = super::dnn::Handle::new(gpu) {
            fail(format!("cudnnCreate on gpu{ordinal}: {e}"));
        }
    }
}

fn mpi_status() -> MpiStatus {
    let mpirun = std::process::Command::new("mpirun")
        .arg("--version")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(|l| l.trim().to_string())
        });
    MpiStatus {
        built_in: cfg!(feature = "mpi"),
        mpirun,
        launched_ranks: crate::comm::launched_ranks(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lib(name: &'static str, version: &str) -> LibStatus {
        LibStatus {
            name,
            path: Some("/x".into()),
            in_use: Some("/x".into()),
            version: Some(version.into()),
            role: "",
        }
    }

    /// The statuses in `Lib::ALL` order: driver, NVML, NVRTC, cuBLAS, cuBLASLt, cuDNN, NCCL.
    fn stack(nvrtc: &str, cublas: &str, cublaslt: &str, cudnn: &str) -> Vec<LibStatus> {
        vec![
            lib("driver", "13.0"),
            lib("nvml", ""),
            lib("nvrtc", nvrtc),
            lib("cublas", cublas),
            lib("cublaslt", cublaslt),
            lib("cudnn", cudnn),
            lib("nccl", "2.27.7"),
        ]
    }

    #[test]
    fn a_cuda13_stack_on_a_cuda13_driver_passes() {
        let mut p = Vec::new();
        let libs = stack(
            "13.0 (sm_75…sm_121)",
            "13.0.2",
            "13.0.2",
            "9.13.0 (for CUDA 13.0)",
        );
        generation_checks(&libs, Some((13, 0)), &mut p);
        assert!(p.is_empty(), "{p:?}");
    }

    #[test]
    fn cuda13_libraries_on_a_cuda12_driver_are_blockers_with_the_fix() {
        let mut p = Vec::new();
        let libs = stack("13.0", "13.0.2", "13.0.2", "9.13.0 (for CUDA 13.0)");
        generation_checks(&libs, Some((12, 4)), &mut p);
        assert_eq!(p.len(), 4, "{p:?}");
        assert!(p.iter().all(|x| x.severity == Severity::Blocker));
        assert!(p[0].fix.contains("R580"), "{}", p[0].fix);
    }

    #[test]
    fn mixed_cublas_generations_and_a_newer_nvrtc_minor_are_reported() {
        let mut p = Vec::new();
        let libs = stack("12.8", "12.4.5", "13.0.2", "9.1.0 (for CUDA 12.2)");
        generation_checks(&libs, Some((13, 0)), &mut p);
        assert!(p.iter().any(|x| x.what.contains("cuBLASLt is CUDA 13")));
        let mut p = Vec::new();
        let libs = stack(
            "12.8 (sm_50…sm_120)",
            "12.4.5",
            "12.4.5",
            "9.1.0 (for CUDA 12.2)",
        );
        generation_checks(&libs, Some((12, 4)), &mut p);
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(p[0].severity, Severity::Warning);
        assert!(p[0].what.contains("PTX fallback"));
    }

    #[test]
    fn without_a_driver_the_report_says_so_and_is_not_ok() {
        if libs::present(Lib::Driver) {
            return;
        }
        let r = diagnose(&|_| Ok(()));
        assert!(!r.ok());
        let p = &r.problems[0];
        assert_eq!(p.severity, Severity::Blocker);
        assert!(p.what.contains("NVIDIA driver (libcuda)"), "{}", p.what);
        assert!(p.fix.contains("install the NVIDIA driver"), "{}", p.fix);
        assert!(r.gpus.is_empty());
        // NCCL is not needed without GPUs or ranks: a warning, not a blocker.
        if launched_is_none() {
            assert!(r
                .problems
                .iter()
                .filter(|p| p.what.contains("NCCL"))
                .all(|p| p.severity == Severity::Warning));
        }
    }

    fn launched_is_none() -> bool {
        crate::comm::launched_ranks().is_none()
    }
}
