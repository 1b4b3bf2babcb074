//! The CI gate against the real CUDA libraries, on a machine with no GPU: NVIDIA's CUDA 13
//! wheels (cuBLAS/cuBLASLt, cuDNN 9, NCCL 2, NVRTC; `.ci/run` installs them and points
//! `ROOFLINE_CUDA_LIBS` at them). Everything that needs no device is exercised:
//! - each library loads as the binary loads it (roofline's search, then cudarc's bindings),
//!   and the file the bindings call is the file found;
//! - every symbol the code can call — taken from the sources themselves, direct `sys` calls
//!   and the cudarc `result` functions the code uses — resolves in the file found;
//! - every cuDNN descriptor the convolution probe and both trainers (ResNet-50, the EWA
//!   detector) build, in every training precision, is accepted, and cuDNN's output size of
//!   each equals the CPU model's;
//! - every cuBLASLt operation, layout and preference of the GEMM probe, every precision and
//!   shape, reads back as it was meant;
//! - NCCL's version and a unique id.
//!
//! What only a GPU can check (handles, algorithms, execution, results) is `roofline probe
//! --check` and `roofline train --check` on one. Without the libraries the tests skip, except
//! under `CI=true`, where they fail.

use roofline_kernels::cpu::conv::ConvShape;
use roofline_kernels::cuda::libs::{self, Lib};
use roofline_model::Precision;
use std::path::{Path, PathBuf};

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// Whether `lib` is here to test; under CI=true its absence fails.
fn have(lib: Lib) -> bool {
    match libs::require(lib) {
        Ok(()) => true,
        Err(e) => {
            assert!(!in_ci(), "CI=true and {} cannot be used: {e}", lib.label());
            roofline_model::skipped::skipped(
                &format!("the CUDA library gate ({})", lib.label()),
                &e.to_string(),
            );
            false
        }
    }
}

const LIBS: [Lib; 5] = [
    Lib::Nvrtc,
    Lib::Cublas,
    Lib::CublasLt,
    Lib::Cudnn,
    Lib::Nccl,
];

#[test]
fn each_library_loads_as_the_binary_loads_it_and_is_the_file_called() {
    for lib in LIBS {
        if !have(lib) {
            continue;
        }
        let found = libs::locate(lib).unwrap();
        let used = libs::in_use(lib).unwrap();
        assert!(
            libs::same_file(&found, &used),
            "{}: found {found}, bindings call {used}",
            lib.label()
        );
        if let Some(list) = std::env::var_os("ROOFLINE_CUDA_LIBS") {
            let found = std::fs::canonicalize(&found).unwrap();
            let roots: Vec<PathBuf> = std::env::split_paths(&list)
                .filter_map(|r| std::fs::canonicalize(r).ok())
                .collect();
            assert!(
                roots.iter().any(|r| found.starts_with(r)),
                "{}: {} is not under ROOFLINE_CUDA_LIBS {roots:?}",
                lib.label(),
                found.display()
            );
        }
        let v = roofline_kernels::cuda::doctor::version(lib);
        println!(
            "{:<24} {:<12} {}",
            lib.label(),
            v.unwrap_or_default(),
            found
        );
    }
}

/// The library a symbol belongs to, by its prefix.
fn lib_of(symbol: &str) -> Option<Lib> {
    let upper_after = |p: &str| {
        symbol
            .strip_prefix(p)
            .and_then(|r| r.chars().next())
            .is_some_and(|c| c.is_ascii_uppercase())
    };
    if upper_after("cublasLt") {
        Some(Lib::CublasLt)
    } else if upper_after("cublas") {
        Some(Lib::Cublas)
    } else if upper_after("cudnn") {
        Some(Lib::Cudnn)
    } else if upper_after("nvrtc") {
        Some(Lib::Nvrtc)
    } else if upper_after("nccl") {
        Some(Lib::Nccl)
    } else {
        None
    }
}

/// `text` without its `//` comments (documentation names functions it does not call).
fn code_only(text: &str) -> String {
    text.lines()
        .map(|l| l.split_once("//").map_or(l, |(code, _)| code))
        .collect::<Vec<_>>()
        .join("\n")
}

/// The identifiers of `text` (ASCII words), each with the character after it.
fn words(text: &str) -> Vec<(&str, Option<char>)> {
    let mut out = Vec::new();
    let b = text.as_bytes();
    let mut i = 0;
    while i < b.len() {
        if b[i].is_ascii_alphabetic() || b[i] == b'_' {
            let start = i;
            while i < b.len() && (b[i].is_ascii_alphanumeric() || b[i] == b'_') {
                i += 1;
            }
            out.push((&text[start..i], text[i..].chars().next()));
        } else {
            i += 1;
        }
    }
    out
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// cudarc's `result` layer for one library: each public function's name and the C symbols
/// its body calls. Found in cargo's registry beside this build's cudarc.
fn cudarc_result_layer() -> Vec<(String, Vec<String>)> {
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")));
    let Some(src) = home.map(|h| h.join("registry/src")) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for reg in std::fs::read_dir(src).into_iter().flatten().flatten() {
        for krate in std::fs::read_dir(reg.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            let name = krate.file_name().to_string_lossy().into_owned();
            if !name.starts_with("cudarc-0.19.") {
                continue;
            }
            for m in ["cublas", "cublaslt", "cudnn", "nvrtc", "nccl"] {
                let Ok(text) =
                    std::fs::read_to_string(krate.path().join(format!("src/{m}/result.rs")))
                else {
                    continue;
                };
                // Split at each `fn name(`: the calls up to the next function are its body's.
                let mut cur: Option<(String, Vec<String>)> = None;
                let text = code_only(&text);
                let w = words(&text);
                for (i, (word, next)) in w.iter().enumerate() {
                    if *word == "fn" {
                        if let Some(f) = cur.take() {
                            out.push(f);
                        }
                        cur = w.get(i + 1).map(|(n, _)| (n.to_string(), Vec::new()));
                    } else if *next == Some('(') && lib_of(word).is_some() {
                        if let Some((_, calls)) = cur.as_mut() {
                            calls.push(word.to_string());
                        }
                    }
                }
                out.extend(cur);
            }
        }
    }
    out
}

#[test]
fn every_symbol_the_code_calls_resolves_in_the_file_found() {
    if !LIBS.iter().all(|l| have(*l)) {
        return;
    }
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut files = Vec::new();
    for d in ["kernels/src", "workloads/src", "collectors/src", "src"] {
        rust_files(&root.join(d), &mut files);
    }
    let result_layer = cudarc_result_layer();
    let mut symbols = std::collections::BTreeSet::new();
    let mut via_cudarc = 0;
    for f in &files {
        let text = code_only(&std::fs::read_to_string(f).unwrap());
        // A name of roofline's own NCCL table, looked up by its C string (`c"ncclCommInitRank"`).
        for (i, _) in text.match_indices("c\"") {
            let rest = &text[i + 2..];
            let name: String = rest
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            if lib_of(&name).is_some() && rest[name.len()..].starts_with('"') {
                symbols.insert(name);
            }
        }
        for (word, next) in words(&text) {
            // A direct call (`sys::cudnnSetStream(`).
            if next == Some('(') && lib_of(word).is_some() && !word.ends_with("_t") {
                symbols.insert(word.to_string());
            }
            // A cudarc result function (`dnn::create_tensor_descriptor(`): the symbols it calls.
            if next == Some('(') {
                for (name, calls) in result_layer.iter().filter(|(n, _)| n == word) {
                    debug_assert_eq!(name, word);
                    via_cudarc += 1;
                    symbols.extend(calls.iter().cloned());
                }
            }
        }
    }
    assert!(
        symbols.len() >= 40,
        "only {} CUDA library symbols found in the sources: the scan is broken",
        symbols.len()
    );
    assert!(
        result_layer.is_empty() || via_cudarc > 0,
        "cudarc's result layer was read but no call of the code matched it"
    );
    let missing: Vec<String> = symbols
        .iter()
        .filter(|s| !libs::resolves(lib_of(s).unwrap(), s))
        .map(|s| {
            format!(
                "{s} ({})",
                libs::locate(lib_of(s).unwrap()).unwrap_or_default()
            )
        })
        .collect();
    println!(
        "{} symbols resolved ({} calls through cudarc's result layer)",
        symbols.len() - missing.len(),
        via_cudarc
    );
    assert!(
        missing.is_empty(),
        "symbols the code calls, not in the file found:\n{}",
        missing.join("\n")
    );
}

/// Every convolution of the probe and of both trainers, as (where, shape).
fn every_convolution() -> Vec<(String, ConvShape)> {
    let mut v: Vec<(String, ConvShape)> = Vec::new();
    // The convolution probe: ResNet-50's distinct layers at each mode's batch.
    for batch in [2, roofline_kernels::probe::gpu::CONV_BATCH] {
        for l in roofline_kernels::cpu::conv::resnet50_layers(batch) {
            v.push((format!("probe {} (batch {batch})", l.name), l.shape));
        }
    }
    let at = |c: &ConvShape, n: usize, (h, w): (usize, usize)| ConvShape { n, h, w, ..*c };
    let out = |s: &ConvShape| (s.oh(), s.ow());
    // A ResNet's convolutions walked through the built model, each input the last output.
    let walk = |m: &roofline_workloads::resnet::ResNet<f32>,
                n: usize,
                hw: (usize, usize),
                what: &str,
                v: &mut Vec<(String, ConvShape)>|
     -> Vec<(usize, usize)> {
        let stem = at(&m.stem.shape, n, hw);
        v.push((format!("{what} stem"), stem));
        let (h, w) = out(&stem);
        let mut size = ((h + 2 - 3) / 2 + 1, (w + 2 - 3) / 2 + 1); // the max pool
        let mut stage_out = Vec::new();
        for (i, b) in m.blocks.iter().enumerate() {
            // Each stage starts with a block that has a shortcut convolution: the size before
            // it is the last stage's output (C2, C3, C4; C5 after the loop).
            if i > 0 && b.down.is_some() {
                stage_out.push(size);
            }
            let c1 = at(&b.conv1.shape, n, size);
            let c2 = at(&b.conv2.shape, n, out(&c1));
            let c3 = at(&b.conv3.shape, n, out(&c2));
            v.push((format!("{what} {}.conv1", b.name), c1));
            v.push((format!("{what} {}.conv2", b.name), c2));
            v.push((format!("{what} {}.conv3", b.name), c3));
            if let Some((d, _)) = &b.down {
                let d = at(&d.shape, n, size);
                assert_eq!(
                    out(&d),
                    out(&c3),
                    "{what} {}: shortcut and body disagree",
                    b.name
                );
                v.push((format!("{what} {}.downsample", b.name), d));
            }
            size = out(&c3);
        }
        stage_out.push(size);
        stage_out
    };
    let resnet = roofline_workloads::resnet::ResNet::<f32>::new(
        roofline_workloads::resnet::Config::resnet50(1000),
        1,
    );
    walk(&resnet, 32, (224, 224), "resnet50", &mut v);
    // The EWA detector: its backbone, the pyramid's lateral and output convolutions at each
    // stage's size, and the RPN's three at each level (P2–P6).
    let cfg = roofline_workloads::detect::model::DetectorConfig::ewa();
    let det = roofline_workloads::detect::model::Detector::<f32>::new(cfg.clone(), 1);
    let (h, w) = (768, 1152);
    let stages = walk(&det.backbone, 2, (h, w), "ewa backbone", &mut v);
    let levels = cfg.level_sizes(h, w);
    assert_eq!(
        &stages[stages.len() - 4..],
        &levels[..4],
        "the backbone's stage sizes"
    );
    for (i, (lat, outc)) in det.fpn.lateral.iter().zip(&det.fpn.output).enumerate() {
        v.push((format!("ewa fpn lateral {i}"), at(&lat.shape, 2, levels[i])));
        v.push((format!("ewa fpn output {i}"), at(&outc.shape, 2, levels[i])));
    }
    for (l, size) in levels.iter().enumerate() {
        for (name, c) in [
            ("conv", &det.rpn.conv),
            ("cls", &det.rpn.cls),
            ("reg", &det.rpn.reg),
        ] {
            v.push((format!("ewa rpn {name} P{}", l + 2), at(&c.shape, 2, *size)));
        }
    }
    // AutoML's candidates on the GPU (described networks): ResNet-50 v1 at 224² and its
    // children by a deeper block early and late at each of AIPerf's kernels (3, 5, 7) and by a
    // wider layer, each convolution as the description gives it (its input's size and
    // channels, padding kernel / 2).
    use roofline_workloads::graph::morph::{applicable, child, Morphism};
    use roofline_workloads::graph::{Description, Op};
    let start = Description::resnet(&roofline_workloads::resnet::Config::resnet50(1000), 3);
    let mut nets = vec![("automl start".to_string(), start.clone())];
    for kernel in [3, 5, 7] {
        let all = applicable(&start, 224, 224, kernel);
        let deeper: Vec<&Morphism> = all
            .iter()
            .filter(|m| matches!(m, Morphism::Deeper { .. }))
            .collect();
        let wider = all.iter().find(|m| matches!(m, Morphism::Wider { .. }));
        let picks = [deeper.first(), deeper.last(), wider.as_ref()];
        for m in picks.into_iter().flatten() {
            let d = child(&start, **m, (224, 224)).expect("an applicable morphism");
            nets.push((format!("automl child ({m})"), d));
        }
    }
    assert!(nets.len() >= 7, "{} AutoML networks", nets.len());
    for (what, d) in &nets {
        let shapes = d.shapes(224, 224).expect("a valid description");
        for (i, node) in d.nodes.iter().enumerate() {
            if let Op::Conv {
                channels,
                kernel,
                stride,
            } = node.op
            {
                let (h, w, c) = shapes[node.inputs[0]];
                let s = ConvShape {
                    n: 32,
                    c,
                    h,
                    w,
                    k: channels,
                    r: kernel,
                    s: kernel,
                    stride,
                    pad: kernel / 2,
                };
                assert_eq!(
                    (s.oh(), s.ow(), s.k),
                    shapes[i + 1],
                    "{what} node {i}: the description's output size"
                );
                v.push((format!("{what} node{i}"), s));
            }
        }
    }
    v
}

/// The shapes the convolution probe measures for the detector are the detector's: its
/// distinct convolutions, walked through the built model, and the probe's list are one set;
/// so are ResNet-50's (no library needed).
#[test]
fn the_probes_convolution_shapes_are_the_models() {
    use roofline_kernels::cpu::conv::{ewa_layers, resnet50_layers, EWA_BATCH};
    let convs = every_convolution();
    let of = |what: &str, n: usize| {
        let mut v: Vec<ConvShape> = convs
            .iter()
            .filter(|(w, _)| w.starts_with(what))
            .map(|(_, s)| ConvShape { n, ..*s })
            .collect();
        v.sort_by_key(|s| format!("{s:?}"));
        v.dedup();
        v
    };
    let sorted = |mut v: Vec<ConvShape>| {
        v.sort_by_key(|s| format!("{s:?}"));
        v
    };
    let probe_ewa = sorted(ewa_layers(EWA_BATCH).iter().map(|l| l.shape).collect());
    assert_eq!(probe_ewa, of("ewa", EWA_BATCH), "the detector's shapes");
    assert!(probe_ewa.len() > 30, "{} detector shapes", probe_ewa.len());
    let probe_resnet = sorted(resnet50_layers(32).iter().map(|l| l.shape).collect());
    assert_eq!(probe_resnet, of("resnet50", 32), "ResNet-50's shapes");
}

#[test]
fn every_cudnn_descriptor_of_the_probe_and_the_trainers_matches_the_cpu_model() {
    if !have(Lib::Cudnn) {
        return;
    }
    let (version, cudart) = roofline_kernels::cuda::dnn::versions().expect("cuDNN version checks");
    println!("cuDNN {version}, built for CUDA runtime {cudart}");
    assert!(version >= 90000, "cuDNN {version}: roofline needs cuDNN 9");
    let convs = every_convolution();
    assert!(convs.len() > 100, "{} convolutions", convs.len());
    let mut checked = 0;
    for p in [
        Precision::F32,
        Precision::Tf32,
        Precision::F16,
        Precision::Bf16,
    ] {
        for (what, s) in &convs {
            let got = roofline_kernels::cuda::dnn::output_dims(s, p)
                .unwrap_or_else(|e| panic!("{what} {p}: {e}"));
            assert_eq!(
                got,
                [s.n, s.k, s.oh(), s.ow()],
                "{what} {p}: cuDNN's output size, the CPU model's"
            );
            checked += 1;
        }
    }
    println!("{checked} cuDNN descriptor sets built, every output size the CPU model's");
    // A layer with no filters: cuDNN refuses its descriptor, and the error names the call.
    let bad = ConvShape {
        n: 1,
        c: 3,
        h: 8,
        w: 8,
        k: 0,
        r: 3,
        s: 3,
        stride: 1,
        pad: 1,
    };
    // A filter larger than the padded input: refused before cuDNN, with the sizes.
    let too_big = ConvShape {
        h: 2,
        w: 2,
        r: 7,
        s: 7,
        k: 4,
        ..bad
    };
    let e = roofline_kernels::cuda::dnn::output_dims(&too_big, Precision::F32).unwrap_err();
    assert!(e.to_string().contains("does not fit a 2×2 input"), "{e}");
    let e = roofline_kernels::cuda::dnn::output_dims(&bad, Precision::F32).unwrap_err();
    assert!(
        e.to_string().contains("cudnnSetTensor4dDescriptor(y)")
            && e.to_string().contains("CUDNN_STATUS_BAD_PARAM"),
        "{e}"
    );
}

/// The backend API's side of the same convolutions: every direction's operation graph node
/// (tensors, convolution, operation, with β = 0 and the trainer's β = 1 for backward-data) is
/// accepted and finalised by cuDNN, which checks the dimensions and strides against each
/// other; a graph needs a handle, so the engines wait for a GPU.
#[test]
fn every_backend_convolution_operation_is_finalised_by_cudnn() {
    use roofline_kernels::cuda::dnn_graph::ConvOp;
    if !have(Lib::Cudnn) {
        return;
    }
    let mut built = 0;
    let mut shapes: Vec<(String, ConvShape)> = every_convolution();
    shapes.dedup_by(|a, b| a.1 == b.1);
    for p in [
        Precision::F32,
        Precision::Tf32,
        Precision::F16,
        Precision::Bf16,
    ] {
        for (what, s) in &shapes {
            for dir in roofline_model::ConvDir::ALL {
                ConvOp::new(s, p, dir, 0.0)
                    .unwrap_or_else(|e| panic!("{what} {p} {}: {e}", dir.name()));
                built += 1;
            }
        }
    }
    // The trainer's backward-data that adds into dx.
    let (what, s) = &shapes[0];
    ConvOp::new(s, Precision::Bf16, roofline_model::ConvDir::BwdData, 1.0)
        .unwrap_or_else(|e| panic!("{what} β = 1: {e}"));
    println!("{built} cuDNN backend convolution operations finalised");
    // A filter larger than the padded input: refused before cuDNN, with the sizes.
    let too_big = ConvShape {
        h: 2,
        w: 2,
        r: 7,
        s: 7,
        pad: 0,
        ..*s
    };
    let e = ConvOp::new(&too_big, Precision::F32, roofline_model::ConvDir::Fwd, 0.0)
        .err()
        .unwrap();
    assert!(e.to_string().contains("does not fit a 2×2 input"), "{e}");
    // A layer with no filters: refused, naming the dimensions.
    let e = ConvOp::new(
        &ConvShape { k: 0, ..*s },
        Precision::F32,
        roofline_model::ConvDir::Fwd,
        0.0,
    )
    .err()
    .unwrap();
    assert!(e.to_string().contains("no dimension may be 0"), "{e}");
}

#[test]
fn every_cublaslt_descriptor_of_the_gemm_probe_reads_back_as_meant() {
    if !have(Lib::CublasLt) {
        return;
    }
    let shapes = roofline_kernels::probe::gpu::gemm_shapes();
    assert!(shapes.len() >= 5, "{shapes:?}");
    let mut n = 0;
    for p in Precision::ALL {
        for &(m, nn, k) in &shapes {
            let (got, want) = roofline_kernels::cuda::blas::lt_read_back(p, m, nn, k)
                .unwrap_or_else(|e| panic!("{p} {m}×{nn}×{k}: {e}"));
            assert_eq!(got, want, "{p} {m}×{nn}×{k}");
            n += 1;
        }
    }
    println!("{n} cuBLASLt descriptor sets read back as meant");
}

// The id's bytes are c_char: i8 or u8 by platform.
#[allow(clippy::unnecessary_cast)]
#[test]
fn nccl_gives_its_version_and_a_unique_id_without_a_gpu() {
    if !have(Lib::Nccl) {
        return;
    }
    let nccl = roofline_kernels::cuda::nccl_lib::get().expect("NCCL");
    let v = nccl.version().expect("ncclGetVersion");
    println!("NCCL {}", roofline_kernels::comm::nccl::version_string(v));
    assert!(v >= 22000, "NCCL {v}");
    let a = nccl.unique_id().expect("ncclGetUniqueId");
    let b = nccl.unique_id().expect("ncclGetUniqueId");
    let a: Vec<u8> = a.internal.iter().map(|c| *c as u8).collect();
    let b: Vec<u8> = b.internal.iter().map(|c| *c as u8).collect();
    assert!(a.iter().any(|x| *x != 0), "an all-zero unique id");
    assert_ne!(a, b, "two unique ids alike");
}
