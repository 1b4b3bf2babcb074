//! The GPU probe's logic that runs without a GPU.

use super::*;

#[test]
fn pattern_sum_matches_a_plain_loop() {
    for words in [0u64, 1, 1023, 1024, 1025, 5000, 1 << 16] {
        let plain = (0..words).fold(0u32, |s, w| s.wrapping_add(pattern(w, 1)));
        assert_eq!(pattern_sum(words, 1), plain, "{words}");
    }
}

#[test]
fn nvlink_rates_follow_nvmls_enum_not_the_generation() {
    // A100: NVML_NVLINK_VERSION_3_0 = 4, 12 links → 300 GB/s per direction.
    assert_eq!(nvlink_link_rate(4, 8).map(|r| r * 12.0), Some(300e9));
    // H100: NVML_NVLINK_VERSION_4_0 = 6, 18 links → 450 GB/s.
    assert_eq!(nvlink_link_rate(6, 9).map(|r| r * 18.0), Some(450e9));
    // H100 reported as 5.0 (7) by some drivers: still NVLink 4's 25 GB/s.
    assert_eq!(nvlink_link_rate(7, 9), Some(25e9));
    // B200: NVLink 5, 18 links → 900 GB/s.
    assert_eq!(nvlink_link_rate(7, 10).map(|r| r * 18.0), Some(900e9));
    assert_eq!(nvlink_link_rate(0, 9), None);
}

#[test]
fn pcie_peaks() {
    assert!((pcie_peak(4, 16).unwrap() - 31.5e9).abs() < 0.1e9);
    assert!((pcie_peak(5, 16).unwrap() - 63.0e9).abs() < 0.1e9);
    assert_eq!(pcie_peak(9, 16), None);
}

/// fp8 mma.sync is measured only where it is QMMA (sm_89, sm_120): on sm_90 and sm_100
/// ptxas emulates it, and the row says so instead of a number (the SASS gate checks the
/// instruction on every architecture this allows).
#[test]
fn fp8_mma_only_where_the_tensor_cores_run_it() {
    for arch in [89, 120, 121] {
        assert_eq!(mma_support("mma_fp8", arch), Ok(()), "sm_{arch}");
    }
    for arch in [90, 100, 103] {
        let why = mma_support("mma_fp8", arch).unwrap_err();
        assert!(
            why.starts_with("not supported here") && why.contains("gpu/gemm/fp8"),
            "{why}"
        );
    }
    assert!(mma_support("mma_fp8", 80).unwrap_err().contains("sm_89"));
    for k in ["mma_f16", "mma_bf16", "mma_tf32", "mma_int8"] {
        for arch in [80, 86, 89, 90, 100, 120] {
            assert_eq!(mma_support(k, arch), Ok(()), "{k} sm_{arch}");
        }
    }
    // A layout kernel runs where its peak kernel does.
    assert_eq!(mma_support("mma_layout_fp8", 89), Ok(()));
    assert!(mma_support("mma_layout_fp8", 90).is_err());
    assert_eq!(mma_support("mma_layout_bf16", 90), Ok(()));
    assert!(mma_support("fma_f32", 90).is_err());
}

#[test]
fn mma_closed_form_constants() {
    // f16 1.0 and 2^-10, bf16 1.0 and 2^-10, e4m3 1.0 and 2^-6.
    assert_eq!(half::f16::from_f64(1.0).to_bits(), 0x3C00);
    assert_eq!(half::f16::from_f64(1.0 / 1024.0).to_bits(), 0x1400);
    assert_eq!(half::bf16::from_f64(1.0).to_bits(), 0x3F80);
    assert_eq!(half::bf16::from_f64(1.0 / 1024.0).to_bits(), 0x3A80);
    assert_eq!(f32::from_bits(0x3A80_0000), 1.0 / 1024.0);
    // e4m3: bias 7, 3 mantissa bits: 0x38 = 2^0, 0x08 = 2^(1-7).
    let e4m3 = |b: u8| 2f64.powi(((b >> 3) & 15) as i32 - 7) * (1.0 + (b & 7) as f64 / 8.0);
    assert_eq!(e4m3(0x38), 1.0);
    assert_eq!(e4m3(0x08), 1.0 / 64.0);
    for s in &MMA {
        let k = s.ops / (2.0 * 16.0 * 8.0);
        let (a, b) = match s.precision {
            Precision::F16 => (1.0, 1.0 / 1024.0),
            Precision::Bf16 | Precision::Tf32 => (1.0, 1.0 / 1024.0),
            Precision::Int8 => (1.0, 1.0),
            _ => (1.0, 1.0 / 64.0),
        };
        assert_eq!(s.per_mma, k * a * b, "{}", s.precision);
    }
}

/// The GPU's roofs are written as the files spell them, and a ceiling built as a roof
/// carries the precision or level its id names.
#[test]
fn gpu_roof_ids_are_the_files_ids() {
    use roofline_model::ConvDir;
    let cases = [
        (
            compute_roof(0, Family::Mma, Precision::Bf16, None),
            "gpu0/mma/bf16",
        ),
        (
            compute_roof(0, Family::Fma, Precision::F64, None),
            "gpu0/fma/f64",
        ),
        (
            compute_roof(1, Family::Gemm, Precision::Tf32, None),
            "gpu1/gemm/tf32",
        ),
        (
            compute_roof(1, Family::Conv, Precision::F16, Some(ConvDir::BwdData)),
            "gpu1/conv/f16/bwd_data",
        ),
        (
            RoofId::Memory {
                on: On::Gpu(0),
                level: Level::Hbm,
                op: MemOp::Triad,
            },
            "gpu0/mem/HBM/triad",
        ),
    ];
    for (roof, id) in cases {
        assert_eq!(roof.to_string(), id);
        assert_eq!(RoofId::parse(id), Some(roof));
    }
    let stats = Stats::from_samples(&[1.0, 2.0]).unwrap();
    let per = PerIteration {
        ops: 1.0,
        bytes: 1.0,
    };
    let c = Ceiling::measured(
        cases[1].0,
        CeilingKind::Memory,
        "B/s",
        1,
        stats.clone(),
        per.clone(),
        "m".into(),
    )
    .as_roof(cases[4].0);
    assert_eq!(
        (
            c.id.to_string().as_str(),
            c.level.map(|l| l.to_string()).as_deref(),
            c.precision
        ),
        ("gpu0/mem/HBM/triad", Some("HBM"), None)
    );
    let c = Ceiling::measured(
        cases[1].0,
        CeilingKind::Compute,
        "FLOP/s",
        1,
        stats,
        per,
        "m".into(),
    )
    .as_roof(cases[0].0);
    assert_eq!(
        (c.id.to_string().as_str(), c.precision),
        ("gpu0/mma/bf16", Some(Precision::Bf16))
    );
}

#[test]
fn half_fma_rounds_once() {
    // 0.75 * x + 0.125 from 1.0 is 0.875, exact in both formats.
    for bf in [false, true] {
        let one = half_bits(1.0, bf);
        let r = half_fma(one, half_bits(0.75, bf), half_bits(0.125, bf), bf);
        assert_eq!(half_value(r, bf), 0.875);
    }
}

#[test]
fn fma_reference_matches_closed_form() {
    // x_n = a^n x0 + b (1 - a^n) / (1 - a), summed over the chains.
    let (a, b, iters) = (0.5f64, 0.25f64, 3usize);
    let n = (iters * FMA_UNROLL) as i32;
    let want: f64 = (0..FMA_ACC)
        .map(|i| a.powi(n) * fma_start_f64(7, i) + b * (1.0 - a.powi(n)) / (1.0 - a))
        .sum();
    assert!((fma_ref_f64(7, a, b, iters) - want).abs() < 1e-12);
}

#[test]
fn a_failed_setup_is_a_note_and_a_failed_check_costs_only_its_own_kernel() {
    let peaks = PeakDb::builtin().unwrap();
    let cancel = AtomicBool::new(false);
    let mut ctx = Ctx {
        mode: Mode::Full,
        cancel: &cancel,
        peaks: &peaks,
        out: GpuResult::default(),
    };
    let refused = CudaError::Call {
        call: "cublasLtMatmulAlgoGetHeuristic".into(),
        detail: "CUBLAS_STATUS_INVALID_VALUE".into(),
    };
    assert!(ctx.section(0, "gemm", Err(refused)).is_ok());
    let compile = CudaError::Compile {
        file: "mma_fp8.cu".into(),
        target: "sm_90".into(),
        log: "ptxas fatal".into(),
    };
    assert!(ctx.checked(0, "mma_fp8", Err(compile)).is_ok());
    assert_eq!(ctx.out.notes.len(), 2, "{:?}", ctx.out.notes);
    assert!(ctx.out.checks.is_empty());
    assert!(ctx.out.notes[0].starts_with("gpu0 gemm: not measured: cublasLtMatmulAlgoGetHeuristic"));
    // A wrong result: recorded as a failure, and the probe goes on to the next section.
    let wrong = CudaError::Check("stream_read: sum 0x1, expected 0x2".into());
    assert!(ctx.section(0, "mem", Err(wrong)).is_ok());
    let last = ctx.out.checks.last().unwrap();
    assert!(!last.skipped && last.kernel == "mem");
    assert!(last.failure.as_deref().unwrap().contains("sum 0x1"));
    assert!(ctx
        .out
        .notes
        .last()
        .unwrap()
        .contains("RESULT CHECK FAILED"));
    assert!(ctx.out.ceilings.is_empty());
    // Two copies of a library end it (the verbs refuse them).
    assert!(matches!(
        ctx.section(0, "gemm", Err(CudaError::Shadowed("two copies".into()))),
        Err(CudaError::Shadowed(_))
    ));
    assert!(matches!(
        ctx.section(0, "fma", Err(CudaError::Interrupted)),
        Err(CudaError::Interrupted)
    ));
    // In --check mode every failure is a line of the table, none ends the run.
    ctx.mode = Mode::Check;
    assert!(ctx
        .checked(0, "fma_f32", Err(CudaError::Check("x".into())))
        .is_ok());
    assert!(ctx.out.checks.last().unwrap().failure.is_some());
}

#[test]
fn uuid_format() {
    let b: [u8; 16] = std::array::from_fn(|i| i as u8);
    assert_eq!(
        roofline_uuid(&b),
        "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    );
}

/// A minifloat's value from its bits: `exp` exponent bits of bias `bias`, `man` mantissa
/// bits (normal numbers only, which is all the probes use).
fn minifloat(bits: u32, exp: u32, man: u32, bias: i32) -> f64 {
    let e = ((bits >> man) & ((1 << exp) - 1)) as i32;
    let m = (bits & ((1 << man) - 1)) as f64 / (1u64 << man) as f64;
    assert!(e > 0, "a normal number");
    (1.0 + m) * 2f64.powi(e - bias)
}

/// Each wgmma kernel's operands are what its closed form assumes: a = 1 and b a power of two
/// in the precision's own format, repeated over the 32-bit word, each instruction adding
/// K · a · b; and the most a launch accumulates (1024 iterations of 4) is exact in 12 bits,
/// below the about 14 bits fp8 keeps.
#[test]
fn wgmma_operands_give_their_closed_form() {
    for s in &WGMMA {
        let (a, b, repeat) = match s.kernel {
            "wgmma_f16" => (
                minifloat(s.a & 0xFFFF, 5, 10, 15),
                minifloat(s.b & 0xFFFF, 5, 10, 15),
                16,
            ),
            "wgmma_bf16" => (
                minifloat(s.a & 0xFFFF, 8, 7, 127),
                minifloat(s.b & 0xFFFF, 8, 7, 127),
                16,
            ),
            "wgmma_tf32" => (f32::from_bits(s.a) as f64, f32::from_bits(s.b) as f64, 32),
            "wgmma_e4m3" => (
                minifloat(s.a & 0xFF, 4, 3, 7),
                minifloat(s.b & 0xFF, 4, 3, 7),
                8,
            ),
            "wgmma_e5m2" => (
                minifloat(s.a & 0xFF, 5, 2, 15),
                minifloat(s.b & 0xFF, 5, 2, 15),
                8,
            ),
            "wgmma_int8" => ((s.a & 0xFF) as f64, (s.b & 0xFF) as f64, 8),
            k => panic!("{k}"),
        };
        let mask = (1u64 << repeat) - 1;
        for w in [s.a, s.b] {
            let lane = w as u64 & mask;
            let tiled = (0..32 / repeat).fold(0u64, |t, i| t | lane << (i * repeat));
            assert_eq!(
                tiled, w as u64,
                "{}: the element repeats over the word",
                s.kernel
            );
        }
        assert_eq!(a, 1.0, "{}", s.kernel);
        assert_eq!(s.per_wgmma, s.k * a * b, "{}", s.kernel);
        let most = wgmma_expected(s, 1024.0 * WGMMA_UNROLL);
        if !s.int {
            // Exact in 12 significant bits: the largest value over the smallest step.
            assert!(most / s.per_wgmma <= 4096.0, "{}", s.kernel);
        }
        assert!(most < 2f64.powi(31), "{}", s.kernel);
    }
    assert_eq!(
        WGMMA.iter().filter(|s| s.ceiling).count(),
        5,
        "e5m2 beside e4m3"
    );
}

/// wgmma is sm_90a code: the probe runs it on sm_90 only and says why elsewhere; the source
/// is built for compute_90a and sm_90a alone, and for a GPU only on its own architecture.
#[test]
fn wgmma_only_on_hopper() {
    use crate::cuda::nvrtc::{source_of, Target};
    assert_eq!(wgmma_support(90), Ok(()));
    for arch in [80, 89, 100, 120] {
        assert!(
            wgmma_support(arch).unwrap_err().contains("sm_90"),
            "sm_{arch}"
        );
    }
    let src = source_of("wgmma_bf16").unwrap();
    assert_eq!(src.ci_targets(), vec![Target::PtxA(90), Target::SassA(90)]);
    assert_eq!(src.target_on(90, &[80, 89, 90]), Ok(Target::SassA(90)));
    assert_eq!(Target::SassA(90).name(), "sm_90a");
    assert!(src
        .target_on(100, &[90, 100])
        .unwrap_err()
        .contains("sm_90 only"));
    assert!(src
        .target_on(90, &[75, 80, 86, 89])
        .unwrap_err()
        .contains("cannot build sm_90a"));
    // A portable source goes on as before.
    let mma = source_of("mma_f16").unwrap();
    assert_eq!(mma.target_on(90, &[80, 90]), Ok(Target::Sass(90)));
    assert_eq!(mma.target_on(100, &[80, 90]), Ok(Target::Ptx(90)));
    assert!(mma.target_on(70, &[75, 80]).is_err());
}
