//! End-to-end tests of the `roofline` binary: `train`: the classifier on synthetic data and an image folder, the EWA detector.

mod common;

use common::*;
use std::path::Path;

#[test]
fn train_runs_a_small_resnet_and_reports_json() {
    let o = bin()
        .args([
            "train",
            "--workload",
            "resnet50",
            "--synthetic",
            "--width",
            "0.125",
            "--depth",
            "1,1,1,1",
            "--resolution",
            "32",
            "--classes",
            "4",
            "--batch",
            "4",
            "--steps",
            "3",
            "--eval-images",
            "8",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["steps"], 3);
    assert_eq!(v["images"], 12);
    assert!(v["parameters"].as_u64().unwrap() > 1000);
    for k in [
        "images_per_second",
        "achieved_flops",
        "flops_forward_per_image",
        "flops_step_per_image",
        "final_loss",
    ] {
        assert!(v[k].as_f64().unwrap() > 0.0, "{k}: {}", v[k]);
    }
    assert!(v["top1"].as_f64().is_some());
    // The CPU never waits for a GPU; its energy is measured where the packages' counters are
    // readable, and otherwise says why not (never a number made up).
    assert_eq!(v["host_syncs_per_step"], 0);
    assert_eq!(v["device_allocations_per_step"], 0);
    // No CUDA graph on the CPU: the field is there, and null.
    assert!(
        v.get("cuda_graph").is_some_and(|g| g.is_null()),
        "{}",
        v["cuda_graph"]
    );
    let e = &v["energy"];
    match e["measured"].as_bool() {
        Some(true) => assert!(e["joules_per_image"].as_f64().unwrap() > 0.0, "{e}"),
        Some(false) => {
            assert!(e["joules_per_image"].is_null(), "{e}");
            assert!(
                e["note"]
                    .as_str()
                    .unwrap()
                    .starts_with("energy not measured"),
                "{e}"
            );
        }
        None => panic!("no energy in {v}"),
    }
    assert!(
        v["aiperf_ops_per_image"]["total"].as_f64().unwrap()
            > v["aiperf_ops_per_image"]["forward"].as_f64().unwrap()
    );
    expect_input_error(&["train", "--depth", "1,2"], None, "--depth 1,2");
    expect_input_error(
        &["train", "--resume", "/nonexistent.safetensors"],
        None,
        "no such file",
    );
    expect_input_error(
        &["train", "--checkpoint", "/nonexistent/dir/c.safetensors"],
        None,
        "cannot write",
    );
    // A checkpoint, and a resume that continues it.
    let dir = tmpdir("ckpt");
    let ck = dir.join("c.safetensors");
    let small = [
        "train",
        "--width",
        "0.125",
        "--depth",
        "1,1,0,0",
        "--resolution",
        "32",
        "--classes",
        "4",
        "--batch",
        "4",
        "--train-images",
        "16",
        "--json",
    ];
    let o = bin()
        .args(small)
        .args(["--steps", "2", "--checkpoint"])
        .arg(&ck)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::metadata(&ck).unwrap().len() > 1000);
    let o = bin()
        .args(small)
        .args(["--steps", "3", "--resume"])
        .arg(&ck)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["steps"], 3);
    assert_eq!(v["images"], 4);
    // A checkpoint at the run's end leaves nothing to train: one line and exit 2, not a run
    // of no steps and a NaN loss.
    let mut again: Vec<&str> = small.to_vec();
    again.extend(["--steps", "2", "--resume"]);
    expect_input_error(&again, Some(&ck), "nothing is left to train");
    // On a log (stderr not a terminal) the run says its first and last steps.
    let plain: Vec<&str> = small.iter().copied().filter(|a| *a != "--json").collect();
    let o = bin().args(&plain).args(["--steps", "3"]).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("step 1/3: loss ") && err.contains("step 3/3: loss "),
        "{err}"
    );
    // No GPU here: the CUDA path and its self-test say so (exit 2) and never panic.
    expect_input_error(
        &["train", "--device", "cuda", "--steps", "1"],
        None,
        "no NVIDIA driver",
    );
    expect_input_error(
        &["train", "--device", "cuda", "--check"],
        None,
        "no NVIDIA driver",
    );
    expect_input_error(
        &["train", "--device", "cpu", "--check"],
        None,
        "use it with --device cuda",
    );
    expect_input_error(
        &["train", "--precision", "f16"],
        None,
        "applies to --device cuda",
    );
    expect_input_error(&["train", "--steps", "0"], None, "nothing to train");
}

#[test]
fn bf16_on_a_cpu_without_it_is_one_line_and_exit_2() {
    // Under an AVX2 cap (what an AVX2-only CPU is to the trainer) or on a CPU without
    // AVX512_BF16, --precision bf16 is refused before anything runs.
    let o = bin()
        .env("ROOFLINE_ISA", "avx2")
        .args(["train", "--precision", "bf16", "--steps", "1"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("--precision bf16 on the CPU"), "{err}");
    assert!(
        err.contains("AVX-512") || err.contains("AVX512_BF16"),
        "{err}"
    );
}

/// A cap that names no instruction set is refused as `probe` refuses it; one below this CPU's
/// set is said in a line before the run, with what it does not reach (the gemm crate).
#[test]
fn the_isa_cap_is_checked_and_said() {
    let o = bin()
        .env("ROOFLINE_ISA", "avx3")
        .args(["train", "--steps", "1"])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("ROOFLINE_ISA=\"avx3\": expected"), "{err}");
    let o = bin()
        .env("ROOFLINE_ISA", "scalar")
        .args([
            "train",
            "--steps",
            "1",
            "--batch",
            "2",
            "--resolution",
            "32",
        ])
        .output()
        .unwrap();
    let err = stderr(&o);
    assert!(o.status.success(), "{err}");
    let capped = err.contains("ROOFLINE_ISA=scalar: the trainer's element-wise passes");
    let scalar_cpu =
        roofline_kernels::cpu::isa::Isa::detected() == roofline_kernels::cpu::isa::Isa::Scalar;
    assert!(capped != scalar_cpu, "{err}");
}

#[test]
fn train_reads_an_image_folder() {
    let dir = tmpdir("folder");
    roofline_workloads::folder::write_test_folder(&dir.join("train"), 3, 6, 40).unwrap();
    roofline_workloads::folder::write_test_folder(&dir.join("val"), 3, 2, 40).unwrap();
    let o = bin()
        .args(["train", "--data"])
        .arg(&dir)
        .args([
            "--width",
            "0.125",
            "--depth",
            "1,1,0,0",
            "--resolution",
            "32",
            "--batch",
            "6",
            "--epochs",
            "2",
            "--eval-images",
            "6",
            "--json",
        ])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    // 18 training images, 2 epochs, batch 6: 6 steps; 3 classes from the folders.
    assert_eq!(v["steps"], 6);
    assert!(v["top1"].as_f64().is_some());
    expect_input_error(
        &["train", "--data", "/nonexistent/imagenet"],
        None,
        "--data: cannot read",
    );
}

/// `train` and `score` with --workload ewa: the detector's report beside the paper's figures,
/// its score by mAP@0.5, and clear refusals.
#[test]
fn ewa_trains_and_scores() {
    let dir = tmpdir("ewa");
    let small = [
        "--workload",
        "ewa",
        "--width",
        "0.125",
        "--depth",
        "1,1,1,1",
        "--resolution",
        "64x96",
        "--batch",
        "2",
        "--train-images",
        "6",
        "--eval-images",
        "2",
    ];
    let o = bin()
        .arg("train")
        .args(small)
        .args(["--steps", "2", "--json"])
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["steps"], 2);
    assert_eq!(v["resolution"], serde_json::json!([64, 96]));
    assert_eq!(v["paper_parameters"], 41_000_000);
    assert_eq!(v["paper_flops_per_image"], 691e9);
    // The full model at 768×1152, forward and backward: hundreds of GFLOPs per image.
    let full = v["flops_step_per_image_at_768x1152"].as_f64().unwrap();
    assert!(full > 3e11 && full < 3e12, "{full:e}");
    let parts = v["flops_per_image_by_part"].as_object().unwrap();
    assert_eq!(parts.len(), 5);
    let sum: f64 = parts.values().map(|p| p["forward"].as_f64().unwrap()).sum();
    assert!((sum / v["flops_forward_per_image"].as_f64().unwrap() - 1.0).abs() < 1e-9);
    assert!(v["map50"]
        .as_f64()
        .is_some_and(|m| (0.0..=1.0).contains(&m)));
    // The synthetic year was written once, as HDF5, into the temporary folder.
    assert!(std::fs::read_dir(&dir).unwrap().any(|e| e
        .unwrap()
        .file_name()
        .to_string_lossy()
        .ends_with(".h5")));
    let out = dir.join("score.json");
    let o = bin()
        .arg("score")
        .args(small)
        .args(["--runs", "1", "--steps", "2", "--target-map", "0.9", "-o"])
        .arg(&out)
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("synthetic fields"), "{text}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(s["workload"], "ewa");
    assert_eq!(s["target"]["metric"], "map50");
    assert_eq!(s["target"]["value"], 0.9);
    assert!(s["runs"][0]["top5"].is_null());
    assert!(s["configuration"]["model"]
        .as_str()
        .unwrap()
        .contains("Faster R-CNN"));
    for (args, needle) in [
        (
            // Without a GPU, ewa's CUDA path says why it cannot start (a machine with a GPU
            // would train: --check is the test there).
            vec![
                "train",
                "--workload",
                "ewa",
                "--device",
                "cuda",
                "--gpu",
                "99",
                "--resolution",
                "64x96",
                "--train-images",
                "4",
                "--steps",
                "1",
            ],
            "--device cuda",
        ),
        (
            vec!["train", "--workload", "resnet50", "--resolution", "64x96"],
            "square",
        ),
        (
            vec!["train", "--workload", "ewa", "--target-top1", "0.5"],
            "--target-map",
        ),
        (
            vec!["train", "--workload", "ewa", "--resolution", "32x48"],
            "64x64",
        ),
        (vec!["train", "--resolution", "12y"], "HxW"),
        // Refused before any data is written.
        (
            vec!["train", "--workload", "ewa", "--anchors", "5"],
            "a cell has 9 anchors",
        ),
        (
            vec!["train", "--workload", "resnet50", "--anchors", "3"],
            "--anchors 3 is ewa's",
        ),
        (
            vec!["train", "--workload", "ewa", "--data", "/nonexistent"],
            "no such file",
        ),
        (
            vec![
                "score",
                "--workload",
                "ewa",
                "--resolution",
                "64x96",
                "--train-images",
                "2",
            ],
            "--eval-images",
        ),
    ] {
        let mut cmd = bin();
        cmd.args(&args).env("TMPDIR", &dir);
        let o = cmd.output().unwrap();
        let err = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: `{needle}` not in: {err}");
    }
}

/// One rule for cores, the same for every verb: `--threads` beyond the physical cores is an
/// input error (exit 2) naming how many there are, for training verbs as for `probe`; and the
/// `--help` of each says the rule.
#[test]
fn threads_follow_one_rule_in_every_verb() {
    let dir = tmpdir("threads-rule");
    let out = dir.join("x.json");
    let out = out.to_str().unwrap();
    let mut messages = Vec::new();
    for args in [
        vec!["probe", "--quick", "--only", "fma", "-o", out],
        vec![
            "train",
            "--steps",
            "1",
            "--width",
            "0.125",
            "--resolution",
            "32",
        ],
        vec![
            "score", "--runs", "1", "--steps", "1", "--width", "0.125", "-o", out,
        ],
    ] {
        let o = bin()
            .args(&args)
            .args(["--threads", "100000"])
            .output()
            .unwrap();
        let e = stderr(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {e}");
        assert!(
            e.contains("--threads 100000: this machine lets roofline use")
                && e.contains("one thread per physical core"),
            "{args:?}: {e}"
        );
        messages.push(e.lines().last().unwrap_or("").to_string());
    }
    // The same sentence from every verb.
    let rule = |m: &str| m[m.find("--threads").unwrap()..].to_string();
    assert!(
        messages.windows(2).all(|w| rule(&w[0]) == rule(&w[1])),
        "{messages:?}"
    );
    for verb in ["probe", "train", "place", "score"] {
        let help = bin().args([verb, "--help"]).output().unwrap();
        let text = String::from_utf8_lossy(&help.stdout).replace('\n', " ");
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        assert!(
            text.contains("one pinned per physical core")
                && text.contains("the rule of every verb"),
            "{verb}: --help does not say the rule"
        );
    }
}

/// `--init` reads torchvision's safetensors and Keras's HDF5, written by a script in their own
/// layouts from the same weights (Keras's with a bias on every convolution, its moving mean
/// raised by it): both read as the same tensors in this trainer's layouts (convolutions
/// transposed from out×in×h×w, the bias folded back), a run starts from them, and a file
/// that does not fit the model, or a workload that has none, is one line and exit 2.
#[test]
fn train_starts_from_pretrained_weights() {
    let dir = tmpdir("init");
    if !init_files(&dir, "train_starts_from_pretrained_weights") {
        return;
    }
    let (tv, keras) = (dir.join("tv.safetensors"), dir.join("keras.h5"));
    use roofline_workloads::init::{Layout, Pretrained};
    let a = Pretrained::read(&tv).unwrap();
    assert_eq!(a.layout, Layout::Torchvision);
    // Keras 2's names, and keras_applications' in Keras 1's layout (AIPerf's file).
    for file in [keras.clone(), dir.join("keras1.h5")] {
        let b = Pretrained::read(&file).unwrap();
        assert_eq!(b.layout, Layout::Keras);
        assert_eq!(
            a.tensors.keys().collect::<Vec<_>>(),
            b.tensors.keys().collect::<Vec<_>>(),
            "{}",
            file.display()
        );
        for (name, (shape, v)) in &a.tensors {
            let (s, w) = &b.tensors[name];
            assert_eq!(shape, s, "{name}");
            let worst = v
                .iter()
                .zip(w)
                .map(|(x, y)| (x - y).abs())
                .fold(0.0, f64::max);
            assert!(worst < 1e-6, "{}: {name}: {worst}", file.display());
        }
    }
    assert_eq!(
        a.tensors["conv1.weight"].0,
        vec![7, 7, 3, 8],
        "h × w × in × out"
    );
    assert_eq!(a.tensors["fc.weight"].0, vec![256, 4], "in × out");
    let args = |init: &Path, classes: &str| -> Vec<String> {
        [
            "train",
            "--workload",
            "resnet50",
            "--synthetic",
            "--width",
            "0.125",
            "--depth",
            "1,1,1,1",
            "--resolution",
            "32",
            "--classes",
            classes,
            "--batch",
            "4",
            "--steps",
            "2",
            "--eval-images",
            "8",
            "--json",
            "--init",
        ]
        .iter()
        .map(|s| s.to_string())
        .chain([init.display().to_string()])
        .collect()
    };
    // The same weights from either file: the same run, to the last bit; without them, another.
    let loss = |a: &[String]| -> f64 {
        let o = bin().args(a).output().unwrap();
        assert!(o.status.success(), "{a:?}: {}", stderr(&o));
        let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        v["final_loss"].as_f64().unwrap()
    };
    let (from_tv, from_keras) = (loss(&args(&tv, "4")), loss(&args(&keras, "4")));
    let mut seeded = args(&tv, "4");
    seeded.truncate(seeded.len() - 2);
    let from_seed = loss(&seeded);
    assert!(
        (from_tv - from_keras).abs() <= 1e-6 * from_tv.abs(),
        "{from_tv} {from_keras}"
    );
    assert_ne!(from_tv, from_seed, "the file's weights were not used");
    let five = args(&tv, "5");
    let five: Vec<&str> = five.iter().map(|s| s.as_str()).collect();
    expect_input_error(&five, None, "fc.bias is [4] in the file, [5] in the model");
    let deep = args(&keras, "4");
    let mut deep: Vec<&str> = deep.iter().map(|s| s.as_str()).collect();
    deep[7] = "1,1,2,1";
    expect_input_error(&deep, None, "no layer3.1.bn1.bias in the file");
    expect_input_error(
        &[
            "train",
            "--workload",
            "ewa",
            "--synthetic",
            "--steps",
            "1",
            "--init",
        ],
        Some(&tv),
        "--init loads ResNet-50 weights for resnet50",
    );
    let junk = dir.join("junk.h5");
    std::fs::write(&junk, b"\x89HDF\r\n\x1a\nnot really").unwrap();
    let mut bad = args(&junk, "4");
    bad.pop();
    let bad: Vec<&str> = bad.iter().map(|s| s.as_str()).collect();
    expect_input_error(&bad, Some(&junk), "--init");
}
