//! The CI gate for the CUDA kernels: every `.cu` source compiles with NVRTC to PTX for
//! compute_80 and compute_90 and to SASS for sm_80, sm_89 and sm_90, with ptxas's register and
//! spill report for every kernel; the PTX holds each kernel's work; and the standalone ptxas
//! (the pip wheel `nvidia-cuda-nvcc-cu12`) assembles the PTX for sm_80 and sm_90, as the
//! driver's JIT would. Needs NVRTC (the pip wheel `nvidia-cuda-nvrtc-cu12` or, for CUDA 13,
//! `nvidia-cuda-nvrtc`, found through `ROOFLINE_CUDA_LIBS` or the linker path). Without it the
//! tests skip, except under `CI=true`, where they fail: CI must never pass without compiling the
//! kernels. CI runs the gate once per CUDA generation, with `ROOFLINE_EXPECT_NVRTC_MAJOR` set
//! to the generation it installed, so that a run cannot pass on the other one.

use roofline_kernels::cuda::nvrtc::{self, Target, SOURCES};
use roofline_kernels::cuda::CudaError;

mod common;

fn nvrtc_or_skip() -> bool {
    match nvrtc::ensure_nvrtc() {
        Ok(()) => true,
        Err(e) => {
            if std::env::var("CI").is_ok_and(|v| v == "true") {
                panic!("CI=true and NVRTC is missing, so the CUDA kernels cannot be checked: {e}");
            }
            roofline_model::skipped::skipped("the NVRTC kernel gate", &e.to_string());
            false
        }
    }
}

/// The PTX of one entry point (up to the next one).
fn entry_body<'a>(ptx: &'a str, kernel: &str) -> &'a str {
    let start = ptx.find(&format!(".entry {kernel}(")).unwrap_or(0);
    let rest = &ptx[start + 1..];
    let end = rest
        .find(".entry ")
        .map(|e| e + start + 1)
        .unwrap_or(ptx.len());
    &ptx[start..end]
}

/// An instruction each kernel's PTX must hold at least so many times (`a|b`: either form, as
/// NVRTC 12 writes a reduction whose result is unused as `red` and NVRTC 13 as `atom`).
fn expected_work(kernel: &str, cc: u32) -> Option<(&'static str, usize)> {
    // train.cu's kernels per storage type: the 16-bit ones convert as they read or write.
    if let Some((base, suffix)) = nvrtc::storage_variant(kernel) {
        // The pack kernels load 16 bytes at a time: bn_apply_v x (and the residual: the
        // compiler may share one load instruction between the two paths), bn_backward_dx_v dy
        // and x at least.
        return match (base, suffix) {
            ("bn_apply_v", _) => Some(("ld.global.v4.u32|ld.global.nc.v4.u32", 1)),
            ("bn_backward_dx_v", _) => Some(("ld.global.v4.u32|ld.global.nc.v4.u32", 2)),
            // The f64 channel sums are reductions (red) in global memory.
            ("bn_sums" | "bn_sums_v", _) => Some(("red.global.add.f64|atom.global.add.f64", 2)),
            ("avgpool_backward", "_f16") => Some(("cvt.rn.f16.f32", 1)),
            (_, "_f16") => Some(("cvt.f32.f16", 1)),
            ("relu_mask" | "avgpool_forward", "_bf16") => None,
            (_, "_bf16") => Some(("cvt.rn.bf16.f32", 1)),
            _ => expected_plain(kernel, cc),
        };
    }
    expected_plain(kernel, cc)
}

/// `expected_work` of the kernels written once.
fn expected_plain(kernel: &str, cc: u32) -> Option<(&'static str, usize)> {
    Some(match kernel {
        // fma.cu: 8 chains × 16 unrolled steps per loop iteration.
        "fma_f64" => ("fma.rn.f64", 128),
        "fma_f32" => ("fma.rn.f32", 128),
        "fma_f16x2" => ("fma.rn.f16x2", 128),
        "fma_bf16x2" => ("fma.rn.bf16x2", 128),
        // mma.cu: 4 independent accumulators per iteration.
        "mma_f16" => ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 4),
        "mma_bf16" => ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 4),
        "mma_tf32" => ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 4),
        "mma_int8" => ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", 4),
        "mma_fp8" if cc >= 89 => ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 4),
        // Their layout checks: one mma each.
        "mma_layout_f16" => ("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32", 1),
        "mma_layout_bf16" => ("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32", 1),
        "mma_layout_tf32" => ("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32", 1),
        "mma_layout_int8" => ("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32", 1),
        "mma_layout_fp8" if cc >= 89 => ("mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32", 1),
        // wgmma.cu: UNROLL (4) warpgroup MMAs per iteration, m64n256.
        "wgmma_f16" => ("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", 4),
        "wgmma_bf16" => ("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", 4),
        "wgmma_tf32" => ("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", 4),
        "wgmma_e4m3" => ("wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3", 4),
        "wgmma_e5m2" => ("wgmma.mma_async.sync.aligned.m64n256k32.f32.e5m2.e5m2", 4),
        "wgmma_int8" => ("wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8", 4),
        // Their layout checks: one wgmma each.
        "wgmma_layout_f16" => ("wgmma.mma_async.sync.aligned.m64n256k16.f32.f16.f16", 1),
        "wgmma_layout_bf16" => ("wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16", 1),
        "wgmma_layout_tf32" => ("wgmma.mma_async.sync.aligned.m64n256k8.f32.tf32.tf32", 1),
        "wgmma_layout_e4m3" => ("wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3", 1),
        "wgmma_layout_e5m2" => ("wgmma.mma_async.sync.aligned.m64n256k32.f32.e5m2.e5m2", 1),
        "wgmma_layout_int8" => ("wgmma.mma_async.sync.aligned.m64n256k32.s32.s8.s8", 1),
        "stream_read" | "stream_copy" => ("ld.global.cg.v4.u32", 1),
        "stream_triad" => ("ld.global.cg.v4.u32", 2),
        "stream_write" => ("st.global.v4.u32", 1),
        "ert_f32_512" => ("fma.rn.f32", 4 * 512),
        // train.cu: the casts are PTX cvt.
        "bn_stats" | "bn_running_stats" => ("sqrt.rn.f64", 1),
        "bn_backward_coefficients" => ("div.rn.f64", 2),
        // One optimizer pass writes the 16-bit copy of the weights in either format.
        "sgd_slots" => ("cvt.rn.f16.f32|cvt.rn.bf16.f32", 2),
        "f32_to_f16" => ("cvt.rn.f16.f32", 1),
        "f32_to_bf16" => ("cvt.rn.bf16.f32", 1),
        // Four bilinear taps per sample (fused or not: fma, or mul then add).
        "roi_align_forward" => ("ld.global.f32|ld.global.nc.f32", 4),
        // detect.cu: the warp-aggregated histogram, the IoU's division (IEEE, as the host's),
        // the sweep's warp barrier.
        "rpn_topk" => ("match.any.sync.b32", 1),
        "nms_mask" => ("div.rn.f64", 1),
        "nms_sweep" => ("bar.warp.sync", 1),
        // The best overlaps as maxima of their bits, the block's counts, the terms' slots.
        // (".op.type" after the atomic's state space, whatever the qualifiers' spelling.)
        "anchor_match" => (".max.u64", 2),
        "anchor_best" => ("red.popc.u32", 2),
        "rpn_loss_terms" => (".add.u32", 1),
        // The box head's gradients divided by the regions in IEEE f64, logits' and deltas'.
        "head_loss_terms" => ("div.rn.f64", 2),
        // The proposals' IoUs with the boxes, in IEEE f64 as the host's.
        "region_match" => ("div.rn.f64", 1),
        _ => return None,
    })
}

#[test]
fn every_kernel_compiles_to_ptx_and_sass_for_sm80_and_sm90() {
    if !nvrtc_or_skip() {
        return;
    }
    let (major, minor) = nvrtc::version().expect("nvrtcVersion");
    println!(
        "NVRTC {major}.{minor} ({})",
        roofline_kernels::cuda::libs::in_use(roofline_kernels::cuda::libs::Lib::Nvrtc)
            .unwrap_or_default()
    );
    if let Ok(want) = std::env::var("ROOFLINE_EXPECT_NVRTC_MAJOR") {
        assert_eq!(
            major.to_string(),
            want,
            "ROOFLINE_EXPECT_NVRTC_MAJOR={want}, but NVRTC {major}.{minor} was loaded"
        );
    }
    println!(
        "{:<12} {:<12} {:<12} {:>5} {:>6} {:>6} {:>6}",
        "source", "kernel", "target", "regs", "smem", "spillS", "spillL"
    );
    for source in SOURCES {
        for target in source.ci_targets() {
            let c = nvrtc::compile(source, target).unwrap_or_else(|e| panic!("{e}"));
            match target {
                Target::Ptx(cc) | Target::PtxA(cc) => {
                    let ptx = String::from_utf8(c.image).expect("PTX is text");
                    let want = target.name().replace("compute_", "sm_");
                    assert!(
                        ptx.lines().any(|l| l.trim() == format!(".target {want}")),
                        "{} PTX lacks .target {want}",
                        source.file
                    );
                    for k in source.kernels {
                        assert!(
                            ptx.contains(&format!(".entry {k}(")),
                            "{} PTX lacks entry {k}",
                            source.file
                        );
                        // Deterministic by construction: no atomic or reduction instruction.
                        if k.starts_with("roi_align")
                            || k.starts_with("upsample")
                            || k.starts_with("maxpool_backward")
                        {
                            let body = entry_body(&ptx, k);
                            assert!(
                                !body.contains("atom.") && !body.contains("red."),
                                "{k} (compute_{cc}) uses atomics"
                            );
                        }
                        // Batch norm's statistics and NMS's overlaps equal the CPU's bit for
                        // bit: no f64 multiply-add contracted (the CPU rounds each product).
                        if [
                            "bn_stats",
                            "bn_running_stats",
                            "bn_backward_coefficients",
                            "nms_mask",
                            "anchor_match",
                            "anchor_best",
                        ]
                        .contains(k)
                        {
                            let body = entry_body(&ptx, k);
                            assert!(
                                !body.contains("fma.rn.f64"),
                                "{k} (compute_{cc}) contracts an f64 multiply-add"
                            );
                        }
                        // The work is really there: the compiler neither folded nor dropped it.
                        if let Some((instr, min)) = expected_work(k, cc) {
                            let body = entry_body(&ptx, k);
                            let n: usize = instr.split('|').map(|i| body.matches(i).count()).sum();
                            assert!(
                                n >= min,
                                "{k} (compute_{cc}): {n} × `{instr}`, expected ≥ {min}"
                            );
                        }
                    }
                }
                Target::Sass(_) | Target::SassA(_) => {
                    assert_eq!(&c.image[..4], b"\x7fELF", "cubin is an ELF file");
                    // A serialized wgmma would halve the tensor-core ceiling, silently.
                    let serialized = nvrtc::serialized_wgmma(&c.log);
                    assert!(
                        serialized.is_empty(),
                        "ptxas serialized wgmma on {} in {}: {serialized:?}",
                        target.name(),
                        source.file
                    );
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

/// ptxas of the same CUDA generation as the NVRTC loaded, found beside it: a CUDA 13 wheel
/// (`nvidia/cu13/lib/libnvrtc.so.13` → `nvidia/cu13/bin/ptxas`), a CUDA 12 wheel
/// (`nvidia/cuda_nvrtc/lib` → `nvidia/cuda_nvcc/bin/ptxas`, the `nvidia-cuda-nvcc-cu12` wheel)
/// or a toolkit (`lib64` → `bin/ptxas`); else `CUDA_HOME`'s or `/usr/local/cuda`'s.
fn ptxas() -> Option<std::path::PathBuf> {
    common::tool_beside_nvrtc("ptxas", None, &["cuda_nvcc/bin"])
}

/// The driver's path for PTX: every kernel's PTX (compute_80, and compute_90) assembles with the
/// standalone ptxas for every newer real architecture, without spills.
#[test]
fn ptx_assembles_with_ptxas_for_every_target() {
    if !nvrtc_or_skip() {
        return;
    }
    let Some(ptxas) = ptxas() else {
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("CI=true and ptxas is missing beside NVRTC (pip wheel nvidia-cuda-nvcc-cu12, or nvidia-cuda-nvcc for CUDA 13)");
        }
        roofline_model::skipped::skipped(
            "the ptxas (SASS) compile of the kernels",
            "no ptxas beside NVRTC",
        );
        return;
    };
    println!("ptxas: {}", ptxas.display());
    let dir = std::env::temp_dir().join(format!("roofline-ptxas-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for source in SOURCES {
        // Arch-specific PTX (compute_90a) assembles for its own architecture only.
        let pairs: Vec<(Target, String)> = match source.arch_specific {
            Some(a) => vec![(Target::PtxA(a), format!("sm_{a}a"))],
            None => [(80, 80), (80, 90), (90, 90)]
                .iter()
                .map(|&(v, r)| (Target::Ptx(v), format!("sm_{r}")))
                .collect(),
        };
        for (target, real) in pairs {
            let virt = target.name();
            let c = nvrtc::compile(source, target).unwrap_or_else(|e| panic!("{e}"));
            let ptx = dir.join(format!("{}.{virt}.ptx", source.file));
            std::fs::write(&ptx, &c.image).unwrap();
            let out = std::process::Command::new(&ptxas)
                .arg(format!("-arch={real}"))
                .arg("-v")
                .arg(&ptx)
                .arg("-o")
                .arg(dir.join("out.cubin"))
                .output()
                .unwrap();
            let log = String::from_utf8_lossy(&out.stderr).into_owned()
                + &String::from_utf8_lossy(&out.stdout);
            assert!(
                out.status.success(),
                "ptxas {real} on {} {virt}:\n{log}",
                source.file
            );
            let serialized = nvrtc::serialized_wgmma(&log);
            assert!(
                serialized.is_empty(),
                "ptxas {real} serialized wgmma in {}: {serialized:?}",
                source.file
            );
            let report = nvrtc::parse_ptxas_report(&log);
            for k in source.kernels {
                let r = report
                    .iter()
                    .find(|r| r.kernel == *k)
                    .unwrap_or_else(|| panic!("ptxas reported nothing for {k}:\n{log}"));
                assert!(r.registers > 0, "{k}: no registers reported");
                assert_eq!(
                    r.spill_store_bytes + r.spill_load_bytes,
                    0,
                    "{k} spills ({real})"
                );
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}
