//! The CI gate for the CUDA kernels: every `.cu` source compiles with NVRTC to PTX for
//! compute_80 and compute_90 and to SASS for sm_80 and sm_90, with ptxas's register and spill
//! report for every kernel. Needs NVRTC (the pip wheel `nvidia-cuda-nvrtc-cu12`, found through
//! `ROOFLINE_CUDA_LIBS` or the linker path). Without it the test skips, except under `CI=true`,
//! where it fails: CI must never pass without compiling the kernels.

use roofline_kernels::cuda::nvrtc::{self, Target, CI_TARGETS, SOURCES};
use roofline_kernels::cuda::CudaError;

fn nvrtc_or_skip() -> bool {
    match nvrtc::ensure_nvrtc() {
        Ok(()) => true,
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and NVRTC is missing, so the CUDA kernels cannot be checked: {e}");
            }
            eprintln!("skipped: {e}");
            false
        }
    }
}

#[test]
fn every_kernel_compiles_to_ptx_and_sass_for_sm80_and_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = nvrtc::version().expect("nvrtcVersion");
    println!("NVRTC {major}.{minor}");
    println!(
        "{:<12} {:<12} {:<12} {:>5} {:>6} {:>6} {:>6}",
        "source", "kernel", "target", "regs", "smem", "spillS", "spillL"
    );
    for source in SOURCES {
        for target in CI_TARGETS {
            let c = nvrtc::compile(source, target).unwrap_or_else(|e| panic!("{e}"));
            match target {
                Target::Ptx(cc) => {
                    let ptx = String::from_utf8(c.image).expect("PTX is text");
                    assert!(
                        ptx.contains(&format!(".target sm_{cc}")),
                        "{} PTX lacks .target sm_{cc}",
                        source.file
                    );
                    for k in source.kernels {
                        assert!(
                            ptx.contains(&format!(".entry {k}(")),
                            "{} PTX lacks entry {k}",
                            source.file
                        );
                    }
                }
                Target::Sass(_) => {
                    assert_eq!(&c.image[..4], b"\x7fELF", "cubin is an ELF file");
                    for k in source.kernels {
                        let r = c
                            .resources
                            .iter()
                            .find(|r| r.kernel == *k)
                            .unwrap_or_else(|| {
                                panic!(
                                    "ptxas reported nothing for {k} ({}):\n{}",
                                    target.name(),
                                    c.log
                                )
                            });
                        assert!(
                            r.registers > 0 && r.registers <= 255,
                            "{k}: {} registers",
                            r.registers
                        );
                        println!(
                            "{:<12} {:<12} {:<12} {:>5} {:>6} {:>6} {:>6}",
                            source.file,
                            k,
                            target.name(),
                            r.registers,
                            r.shared_bytes,
                            r.spill_store_bytes,
                            r.spill_load_bytes
                        );
                        // Spills in a peak kernel would make it measure local memory, not the ALUs.
                        assert_eq!(
                            r.spill_store_bytes + r.spill_load_bytes,
                            0,
                            "{k} spills on {}",
                            target.name()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn a_syntax_error_fails_with_nvrtcs_log() {
    if !nvrtc_or_skip() {
        return;
    }
    let broken = "extern \"C\" __global__ void broken(float* x) { x[0] = 1.0f }";
    match nvrtc::compile_text("broken.cu", broken, Target::Sass(80)) {
        Err(CudaError::Compile { file, target, log }) => {
            assert_eq!(file, "broken.cu");
            assert_eq!(target, "sm_80");
            assert!(log.contains("error"), "log: {log}");
        }
        other => panic!("a kernel with a syntax error compiled: {other:?}"),
    }
}
