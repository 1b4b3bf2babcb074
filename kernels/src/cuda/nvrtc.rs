//! The CUDA C kernel sources and their compilation by NVRTC, to PTX (for the driver to JIT) or
//! to SASS (a cubin for one architecture), with ptxas's resource report (registers, shared
//! memory, spills) for every kernel.

use super::libs::{self, Lib};
use super::CudaError;
use cudarc::nvrtc::{result as nvrtc, sys};
use std::ffi::{c_char, CString};

/// One `.cu` file of `kernels/cuda/` and the kernels it defines.
#[derive(Clone, Copy, Debug)]
pub struct Source {
    pub file: &'static str,
    pub text: &'static str,
    pub kernels: &'static [&'static str],
    /// What the kernels measure, for `roofline kernels`.
    pub purpose: &'static str,
    /// Arch-specific code (`sm_90a`'s wgmma): built for this one architecture only, as its
    /// `a` target, and run on no other; none for portable sources.
    pub arch_specific: Option<u32>,
}

/// A source's kernel names: the `plain` ones, then each `typed` one once per storage type
/// (`<name>_f32`, `<name>_f16`, `<name>_bf16`, as [`typed!`](crate::typed) names them).
macro_rules! kernel_list {
    ([$($plain:literal),*], typed[$($typed:literal),*]) => {
        &[
            $($plain,)*
            $(concat!($typed, "_f32"), concat!($typed, "_f16"), concat!($typed, "_bf16"),)*
        ]
    };
}

/// Every kernel source roofline compiles at run time.
pub const SOURCES: &[Source] = &[
    Source {
        file: "fma.cu",
        text: include_str!("../../cuda/fma.cu"),
        kernels: &["fma_f64", "fma_f32", "fma_f16x2", "fma_bf16x2"],
        purpose: "FMA peak per precision (CUDA cores)",
        arch_specific: None,
    },
    Source {
        file: "mma.cu",
        text: include_str!("../../cuda/mma.cu"),
        kernels: &[
            "mma_f16",
            "mma_bf16",
            "mma_tf32",
            "mma_int8",
            "mma_layout_f16",
            "mma_layout_bf16",
            "mma_layout_tf32",
            "mma_layout_int8",
        ],
        purpose: "tensor-core peak through mma.sync",
        arch_specific: None,
    },
    Source {
        file: "mma_fp8.cu",
        text: include_str!("../../cuda/mma_fp8.cu"),
        kernels: &["mma_fp8", "mma_layout_fp8"],
        purpose: "fp8 (e4m3) tensor-core peak through mma.sync (sm_89+, NVRTC 12.4+)",
        arch_specific: None,
    },
    Source {
        file: "stream.cu",
        text: include_str!("../../cuda/stream.cu"),
        kernels: &[
            "stream_init",
            "stream_read",
            "stream_write",
            "stream_copy",
            "stream_triad",
            "stream_check",
        ],
        purpose: "memory bandwidth sweep (L2, HBM) and the SM copy kernel for peer copies",
        arch_specific: None,
    },
    Source {
        file: "ert.cu",
        text: include_str!("../../cuda/ert.cu"),
        kernels: &[
            "ert_f32_1",
            "ert_f32_2",
            "ert_f32_4",
            "ert_f32_8",
            "ert_f32_16",
            "ert_f32_32",
            "ert_f32_64",
            "ert_f32_128",
            "ert_f32_256",
            "ert_f32_512",
        ],
        purpose: "ERT sweep of FLOPs per element: the roofline curve between its two ends",
        arch_specific: None,
    },
    Source {
        file: "fpn.cu",
        text: include_str!("../../cuda/fpn.cu"),
        kernels: &[
            "upsample_add",
            "upsample_backward_add",
            "subsample2",
            "subsample2_backward_add",
        ],
        purpose:
            "the feature pyramid's top-down upsampling and P6, with atomics-free backward passes",
        arch_specific: None,
    },
    Source {
        file: "roi_align.cu",
        text: include_str!("../../cuda/roi_align.cu"),
        kernels: &["roi_align_forward", "roi_align_backward"],
        purpose:
            "the detector's multi-scale RoIAlign: forward, and an atomics-free gather backward",
        arch_specific: None,
    },
    Source {
        file: "detect.cu",
        text: include_str!("../../cuda/detect.cu"),
        kernels: &[
            "rpn_topk",
            "rpn_decode",
            "nms_mask",
            "nms_sweep",
            "rpn_merge",
            "anchor_match",
            "anchor_best",
            "anchor_scan",
            "rpn_loss_terms",
            "head_loss_terms",
            "region_match",
        ],
        purpose: "the RPN's proposals (per-level top-k, decoding, bitmask NMS, the levels' merge) and losses (anchor matching, counts for the draw, the kept anchors' terms), the box head's losses, and the second stage's matching of the proposals",
        arch_specific: None,
    },
    Source {
        file: "train.cu",
        text: include_str!("../../cuda/train.cu"),
        kernels: kernel_list!(
            [
                "bn_stats",
                "bn_running_stats",
                "bn_backward_coefficients",
                "relu",
                "add_bias",
                "column_sums",
                "bias_from_sums",
                "softmax_xent",
                "sgd_slots",
                "nonfinite",
                "f32_to_f16",
                "f16_to_f32",
                "f32_to_bf16",
                "bf16_to_f32"
            ],
            typed[
                "bn_sums",
                "bn_apply",
                "bn_backward_dx",
                "bn_sums_v",
                "bn_apply_v",
                "bn_backward_dx_v",
                "relu_mask",
                "add_into",
                "maxpool_forward",
                "maxpool_backward",
                "avgpool_forward",
                "avgpool_backward"
            ]
        ),
        purpose:
            "the trainer's layers on the GPU: batch norm, ReLU, residual, pooling, loss, SGD, casts",
        arch_specific: None,
    },
    Source {
        file: "wgmma.cu",
        text: include_str!("../../cuda/wgmma.cu"),
        kernels: &[
            "wgmma_f16",
            "wgmma_bf16",
            "wgmma_tf32",
            "wgmma_e4m3",
            "wgmma_e5m2",
            "wgmma_int8",
            "wgmma_layout_f16",
            "wgmma_layout_bf16",
            "wgmma_layout_tf32",
            "wgmma_layout_e4m3",
            "wgmma_layout_e5m2",
            "wgmma_layout_int8",
        ],
        purpose: "Hopper's tensor-core peak through warpgroup wgmma (sm_90a only)",
        arch_specific: Some(90),
    },
];

/// The source that defines `kernel`.
pub fn source_of(kernel: &str) -> Option<&'static Source> {
    SOURCES.iter().find(|s| s.kernels.contains(&kernel))
}

/// The suffixes of a kernel compiled once per storage type, in [`crate::cuda::Storage`]'s order.
const STORAGE_SUFFIXES: [&str; 3] = ["_f32", "_f16", "_bf16"];

/// A kernel compiled once per storage type (`kernel_list!`'s `typed`): its base name and its
/// storage suffix (`("bn_apply", "_f16")` for `bn_apply_f16`); None for any other kernel, even
/// one whose name ends like a storage type (`f32_to_f16`, `mma_f16`).
pub fn storage_variant(kernel: &str) -> Option<(&str, &'static str)> {
    let src = source_of(kernel)?;
    STORAGE_SUFFIXES.iter().find_map(|&suffix| {
        let base = kernel.strip_suffix(suffix)?;
        STORAGE_SUFFIXES
            .iter()
            .all(|s| src.kernels.contains(&format!("{base}{s}").as_str()))
            .then_some((base, suffix))
    })
}

/// What to compile to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Target {
    /// PTX for a virtual architecture (`compute_XY`), JIT-compiled by the driver.
    Ptx(u32),
    /// SASS (a cubin) for a real architecture (`sm_XY`).
    Sass(u32),
    /// PTX for an architecture's arch-specific features (`compute_90a`): runs on that
    /// architecture only.
    PtxA(u32),
    /// SASS with an architecture's arch-specific features (`sm_90a`: wgmma).
    SassA(u32),
}

impl Target {
    pub fn arch_option(self) -> String {
        format!("--gpu-architecture={}", self.name())
    }

    pub fn name(self) -> String {
        match self {
            Target::Ptx(cc) => format!("compute_{cc}"),
            Target::Sass(cc) => format!("sm_{cc}"),
            Target::PtxA(cc) => format!("compute_{cc}a"),
            Target::SassA(cc) => format!("sm_{cc}a"),
        }
    }

    /// Machine code (a cubin), not PTX.
    pub fn is_sass(self) -> bool {
        matches!(self, Target::Sass(_) | Target::SassA(_))
    }
}

impl Source {
    /// What CI compiles this source for: [`CI_TARGETS`], or an arch-specific source's own
    /// `compute_XYa` and `sm_XYa`.
    pub fn ci_targets(&self) -> Vec<Target> {
        match self.arch_specific {
            Some(a) => vec![Target::PtxA(a), Target::SassA(a)],
            None => CI_TARGETS.to_vec(),
        }
    }

    /// What to compile this source to for a GPU of architecture `arch` with an NVRTC that
    /// targets `supported` ([`target_for`]; an arch-specific source its own `sm_XYa`, on
    /// that architecture only); `Err` says why there is none.
    pub fn target_on(&self, arch: u32, supported: &[u32]) -> Result<Target, String> {
        match self.arch_specific {
            Some(a) if a != arch => Err(format!(
                "{} is sm_{a}a code, which runs on sm_{a} only; this GPU is sm_{arch}",
                self.file
            )),
            Some(a) if !supported.contains(&a) => Err(format!(
                "this NVRTC cannot build sm_{a}a ({}): it compiles for {}",
                self.file,
                supported
                    .iter()
                    .map(|s| format!("sm_{s}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )),
            Some(a) => Ok(Target::SassA(a)),
            None => target_for(arch, supported).ok_or_else(|| {
                format!(
                    "this NVRTC compiles for sm_{}…sm_{}, and this GPU is sm_{arch}: use the NVRTC of an older CUDA (CUDA 13 dropped GPUs before sm_75)",
                    supported.iter().min().copied().unwrap_or(0),
                    supported.iter().max().copied().unwrap_or(0),
                )
            }),
        }
    }
}

/// The architectures CI compiles every kernel for: PTX and SASS for Ampere (sm_80) and Hopper
/// (sm_90), and SASS for Ada (sm_89, the first with fp8 mma).
pub const CI_TARGETS: [Target; 5] = [
    Target::Ptx(80),
    Target::Ptx(90),
    Target::Sass(80),
    Target::Sass(89),
    Target::Sass(90),
];

/// ptxas's resource report for one kernel.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Resources {
    pub kernel: String,
    pub registers: u32,
    pub shared_bytes: u32,
    pub spill_store_bytes: u32,
    pub spill_load_bytes: u32,
    pub stack_bytes: u32,
}

/// The result of one compilation.
#[derive(Clone, Debug)]
pub struct Compiled {
    pub target: Target,
    /// PTX text (for `Target::Ptx`) or the cubin (for `Target::Sass`).
    pub image: Vec<u8>,
    /// One entry per kernel (SASS targets only: ptxas reports when it runs).
    pub resources: Vec<Resources>,
    pub log: String,
}

/// NVRTC's version, e.g. (12, 4).
pub fn version() -> Result<(i32, i32), CudaError> {
    ensure_nvrtc()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: plain out-parameters.
    unsafe { sys::nvrtcVersion(&mut major, &mut minor) }
        .result()
        .map_err(|e| CudaError::call("nvrtcVersion", e))?;
    Ok((major, minor))
}

/// The real architectures this NVRTC compiles SASS for (`nvrtcGetSupportedArchs`), e.g.
/// 50…90 for NVRTC 12.4, 75…121 for 13.0: CUDA 13 dropped everything before Turing.
pub fn supported_archs() -> Result<Vec<u32>, CudaError> {
    ensure_nvrtc()?;
    let mut n = 0i32;
    // SAFETY: one out-parameter.
    unsafe { sys::nvrtcGetNumSupportedArchs(&mut n) }
        .result()
        .map_err(|e| CudaError::call("nvrtcGetNumSupportedArchs", e))?;
    let mut v = vec![0i32; n.max(0) as usize];
    // SAFETY: an array of the length NVRTC gave.
    unsafe { sys::nvrtcGetSupportedArchs(v.as_mut_ptr()) }
        .result()
        .map_err(|e| CudaError::call("nvrtcGetSupportedArchs", e))?;
    Ok(v.into_iter().filter(|a| *a > 0).map(|a| a as u32).collect())
}

/// What to compile for a GPU of architecture `arch` with an NVRTC that targets `supported`:
/// SASS for it when NVRTC knows it, else PTX for the newest architecture NVRTC knows below it
/// (the driver JIT-compiles that PTX for the GPU); `None` when NVRTC knows none at or below it.
pub fn target_for(arch: u32, supported: &[u32]) -> Option<Target> {
    if supported.contains(&arch) {
        return Some(Target::Sass(arch));
    }
    supported
        .iter()
        .copied()
        .filter(|a| *a <= arch)
        .max()
        .map(Target::Ptx)
}

/// Fails with the "not found, looked in ..." message when NVRTC is absent, and with both files
/// and the fix when the bindings would call another NVRTC than the one found.
pub fn ensure_nvrtc() -> Result<(), CudaError> {
    libs::require(Lib::Nvrtc)
}

/// Compiles `source` for `target` with `-O3`-level defaults, C++17, and (SASS) ptxas's
/// verbose report. A compilation error returns NVRTC's log in the error.
pub fn compile(source: &Source, target: Target) -> Result<Compiled, CudaError> {
    compile_text(source.file, source.text, target)
}

/// `compile` for any text (the tests feed it a broken kernel).
pub fn compile_text(file: &str, text: &str, target: Target) -> Result<Compiled, CudaError> {
    ensure_nvrtc()?;
    let src = CString::new(text).map_err(|_| CudaError::Compile {
        file: file.into(),
        target: target.name(),
        log: "source has a NUL byte".into(),
    })?;
    let name = CString::new(file).unwrap_or_default();
    let prog = nvrtc::create_program(&src, Some(&name))
        .map_err(|e| CudaError::call("nvrtcCreateProgram", e))?;
    let mut options = vec![target.arch_option(), "--std=c++17".to_string()];
    if target.is_sass() {
        options.push("--ptxas-options=-v".to_string());
    }
    // SAFETY: `prog` is live until destroy_program below; every call's status is checked.
    let result = unsafe {
        let compiled = nvrtc::compile_program(prog, &options);
        let log = nvrtc::get_program_log(prog)
            .map(|l| c_chars_to_string(&l))
            .unwrap_or_default();
        match compiled {
            Err(e) if e.0 == sys::nvrtcResult::NVRTC_ERROR_COMPILATION => Err(CudaError::Compile {
                file: file.into(),
                target: target.name(),
                log,
            }),
            Err(e) => Err(CudaError::Call {
                call: format!("nvrtcCompileProgram({file}, {})", target.name()),
                detail: if log.trim().is_empty() {
                    format!("{e:?}")
                } else {
                    format!("{e:?}: {}", log.trim())
                },
            }),
            Ok(()) => image(prog, target).map(|image| Compiled {
                target,
                resources: parse_ptxas_report(&log),
                image,
                log,
            }),
        }
    };
    // SAFETY: created above, destroyed once.
    let destroyed = unsafe { nvrtc::destroy_program(prog) };
    let compiled = result?;
    destroyed.map_err(|e| CudaError::call("nvrtcDestroyProgram", e))?;
    Ok(compiled)
}

unsafe fn image(prog: sys::nvrtcProgram, target: Target) -> Result<Vec<u8>, CudaError> {
    match target {
        Target::Ptx(_) | Target::PtxA(_) => {
            let ptx = nvrtc::get_ptx(prog).map_err(|e| CudaError::call("nvrtcGetPTX", e))?;
            Ok(c_chars_to_string(&ptx).into_bytes())
        }
        Target::Sass(_) | Target::SassA(_) => {
            let mut size = 0usize;
            sys::nvrtcGetCUBINSize(prog, &mut size)
                .result()
                .map_err(|e| CudaError::call("nvrtcGetCUBINSize", e))?;
            let mut cubin = vec![0u8; size];
            sys::nvrtcGetCUBIN(prog, cubin.as_mut_ptr() as *mut c_char)
                .result()
                .map_err(|e| CudaError::call("nvrtcGetCUBIN", e))?;
            if cubin.len() < 4 || &cubin[..4] != b"\x7fELF" {
                return Err(CudaError::Check(format!(
                    "NVRTC returned no cubin for {} ({} bytes)",
                    target.name(),
                    cubin.len()
                )));
            }
            Ok(cubin)
        }
    }
}

// c_char: i8 on x86-64, u8 on aarch64.
#[allow(clippy::unnecessary_cast)]
fn c_chars_to_string(v: &[c_char]) -> String {
    let bytes: Vec<u8> = v.iter().map(|&c| c as u8).take_while(|&b| b != 0).collect();
    String::from_utf8_lossy(&bytes).into_owned()
}

/// Parses ptxas `-v` output:
/// ```text
/// ptxas info    : Compiling entry function 'fma_f32' for 'sm_80'
/// ptxas info    : Function properties for fma_f32
///     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
/// ptxas info    : Used 30 registers, 376 bytes cmem[0]
/// ```
/// ("Used N registers, M bytes smem, ..." when the kernel has shared memory.)
pub fn parse_ptxas_report(log: &str) -> Vec<Resources> {
    let mut out: Vec<Resources> = Vec::new();
    for line in log.lines() {
        let line = line.trim();
        if let Some(rest) = line.split("Compiling entry function '").nth(1) {
            let name = rest.split('\'').next().unwrap_or("").to_string();
            out.push(Resources {
                kernel: name,
                ..Resources::default()
            });
            continue;
        }
        let Some(cur) = out.last_mut() else { continue };
        if line.contains("bytes stack frame") {
            // NVRTC 12: `    8 bytes stack frame, ...`; NVRTC 13: `ptxas . 8 bytes stack
            // frame, ...`: the number is the word before "bytes".
            for part in line.split(',') {
                let n = number_before_bytes(part);
                if part.contains("stack frame") {
                    cur.stack_bytes = n;
                } else if part.contains("spill stores") {
                    cur.spill_store_bytes = n;
                } else if part.contains("spill loads") {
                    cur.spill_load_bytes = n;
                }
            }
        } else if let Some(rest) = line.split("Used ").nth(1) {
            for part in rest.split(',') {
                let n = leading_number(part);
                if part.contains("registers") {
                    cur.registers = n;
                } else if part.contains("smem") {
                    cur.shared_bytes = n;
                }
            }
        }
    }
    out
}

/// ptxas's warnings that a kernel's `wgmma.mma_async` instructions were serialized, as
/// `(kernel, why)`: each means the warpgroup MMAs wait for one another, and a ceiling measured
/// with them about half what the tensor cores give. ptxas writes, with `-v`:
/// ```text
/// ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function 'wgmma_f16'
/// ```
pub fn serialized_wgmma(log: &str) -> Vec<(String, String)> {
    log.lines()
        .filter(|l| l.contains("wgmma") && l.contains("serialized"))
        .map(|l| {
            let kernel = l
                .rsplit_once("in the function '")
                .map_or("?", |(_, k)| k.trim_end().trim_end_matches('\''))
                .to_string();
            let why = l
                .split_once("serialized")
                .map_or("", |(_, w)| w)
                .split(" in the function '")
                .next()
                .unwrap_or("")
                .trim()
                .to_string();
            (kernel, why)
        })
        .collect()
}

/// The number just before the word "bytes" in `s` (0 when there is none).
fn number_before_bytes(s: &str) -> u32 {
    let words: Vec<&str> = s.split_whitespace().collect();
    words
        .iter()
        .position(|w| *w == "bytes")
        .and_then(|i| i.checked_sub(1))
        .and_then(|i| words[i].parse().ok())
        .unwrap_or(0)
}

fn leading_number(s: &str) -> u32 {
    s.split_whitespace()
        .next()
        .and_then(|w| w.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_target_is_sass_when_nvrtc_knows_the_gpu_else_the_newest_ptx_below_it() {
        let nvrtc_12_4: Vec<u32> = vec![50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90];
        let nvrtc_13_0: Vec<u32> = vec![75, 80, 86, 87, 88, 89, 90, 100, 103, 110, 120, 121];
        assert_eq!(target_for(90, &nvrtc_12_4), Some(Target::Sass(90)));
        // A Blackwell GPU with NVRTC 12.4: PTX for sm_90, which the driver JITs.
        assert_eq!(target_for(100, &nvrtc_12_4), Some(Target::Ptx(90)));
        assert_eq!(target_for(100, &nvrtc_13_0), Some(Target::Sass(100)));
        // A Volta GPU with NVRTC 13: nothing NVRTC 13 can build runs there.
        assert_eq!(target_for(70, &nvrtc_13_0), None);
    }

    #[test]
    fn a_serialized_wgmma_is_found_with_its_kernel_and_cause() {
        let log = "ptxas info    : Compiling entry function 'wgmma_f16' for 'sm_90a'\n\
            ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized due to non wgmma instructions defining accumulator registers of a wgmma between start and end of the pipeline stage in the function 'wgmma_f16'\n\
            ptxas info    : Used 168 registers, 65536 bytes smem, 376 bytes cmem[0]\n\
            ptxas info    : (C7511) Potential Performance Loss: wgmma.mma_async instructions are serialized due to insufficient register resources for the wgmma pipeline in the function 'wgmma_bf16'\n";
        let found = serialized_wgmma(log);
        assert_eq!(found.len(), 2);
        assert_eq!(found[0].0, "wgmma_f16");
        assert!(
            found[0].1.starts_with("due to non wgmma instructions"),
            "{}",
            found[0].1
        );
        assert_eq!(found[1].0, "wgmma_bf16");
        assert!(
            found[1].1.contains("insufficient register"),
            "{}",
            found[1].1
        );
        // The report itself is still read, and a clean log has no warning.
        assert_eq!(parse_ptxas_report(log)[0].registers, 168);
        assert!(serialized_wgmma("ptxas info    : Used 30 registers").is_empty());
    }

    #[test]
    fn ptxas_report_is_parsed() {
        let log = "ptxas info    : 0 bytes gmem\n\
            ptxas info    : Compiling entry function 'fma_f32' for 'sm_80'\n\
            ptxas info    : Function properties for fma_f32\n\
            \x20   8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads\n\
            ptxas info    : Used 30 registers, 2048 bytes smem, 376 bytes cmem[0]\n\
            ptxas info    : Compiling entry function 'fma_f64' for 'sm_80'\n\
            ptxas info    : Function properties for fma_f64\n\
            \x20   0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n\
            ptxas info    : Used 40 registers, 376 bytes cmem[0]\n";
        let r = parse_ptxas_report(log);
        assert_eq!(r.len(), 2);
        assert_eq!(
            r[0],
            Resources {
                kernel: "fma_f32".into(),
                registers: 30,
                shared_bytes: 2048,
                spill_store_bytes: 4,
                spill_load_bytes: 12,
                stack_bytes: 8,
            }
        );
        assert_eq!(r[1].registers, 40);
        assert_eq!(r[1].spill_store_bytes, 0);
        // NVRTC 13 starts the properties line with `ptxas .`.
        let log13 = "ptxas info    : Compiling entry function 'mma_fp8' for 'sm_90'\n\
            ptxas info    : Function properties for mma_fp8\n\
            ptxas .     24 bytes stack frame, 8 bytes spill stores, 16 bytes spill loads\n\
            ptxas info    : Used 37 registers, used 0 barriers\n";
        let r = parse_ptxas_report(log13);
        assert_eq!(
            r,
            vec![Resources {
                kernel: "mma_fp8".into(),
                registers: 37,
                shared_bytes: 0,
                spill_store_bytes: 8,
                spill_load_bytes: 16,
                stack_bytes: 24,
            }]
        );
    }

    #[test]
    fn a_per_storage_kernel_is_known_by_its_three_names() {
        assert_eq!(storage_variant("bn_apply_f16"), Some(("bn_apply", "_f16")));
        assert_eq!(
            storage_variant("bn_sums_v_f32"),
            Some(("bn_sums_v", "_f32"))
        );
        // Names that end like a storage type, of kernels written once.
        for k in [
            "f32_to_f16",
            "bf16_to_f32",
            "mma_f16",
            "fma_f32",
            "sgd_slots",
            "nope_f16",
        ] {
            assert_eq!(storage_variant(k), None, "{k}");
        }
    }

    #[test]
    fn every_kernel_name_is_unique_and_found() {
        let mut names: Vec<&str> = SOURCES
            .iter()
            .flat_map(|s| s.kernels.iter().copied())
            .collect();
        let n = names.len();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), n);
        for s in SOURCES {
            for k in s.kernels {
                // A kernel per storage type is written once, as `void <base>_##S(`.
                let typed = storage_variant(k)
                    .is_some_and(|(base, _)| s.text.contains(&format!("void {base}_##S(")));
                // `void __launch_bounds__(128) wgmma_f16(`: the bound between.
                let bounded = [128, 1024].iter().any(|b| {
                    s.text
                        .contains(&format!("void __launch_bounds__({b}) {k}("))
                });
                assert!(
                    s.text.contains(&format!("void {k}("))
                        || bounded
                        || typed
                        || s.text.contains("ERT(")
                        || s.text.contains("(NAME"),
                    "{k} not in {}",
                    s.file
                );
                assert_eq!(source_of(k).map(|x| x.file), Some(s.file));
            }
        }
    }
}
