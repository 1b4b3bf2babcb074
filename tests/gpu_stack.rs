//! The GPU stack without a GPU: `roofline doctor` (its report, its exit code, the same words
//! as the GPU commands) and the bring-up kit (packed, under the carry limit, and its binary
//! starts).

use std::path::Path;
use std::process::Command;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_roofline"))
}

fn driver_present() -> bool {
    roofline_kernels::cuda::libs::present(roofline_kernels::cuda::libs::Lib::Driver)
}

#[test]
fn doctor_without_a_driver_exits_2_and_names_the_fix_in_the_probes_words() {
    if driver_present() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    let o = bin().arg("doctor").output().unwrap();
    assert_eq!(o.status.code(), Some(2));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = "no NVIDIA driver (libcuda) found: looked for libcuda.so.1";
    assert!(text.contains(&format!("missing: {line}")), "{text}");
    assert!(text.contains("fix: install the NVIDIA driver"), "{text}");
    assert!(text.contains("not ready"), "{text}");
    // The GPU commands stop with the same words.
    for args in [vec!["probe", "--device", "cuda"], vec!["probe", "--check"]] {
        let p = bin().args(&args).output().unwrap();
        assert_eq!(p.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8_lossy(&p.stderr);
        assert!(err.contains(line), "{args:?}: {err}");
        assert!(err.contains("install the NVIDIA driver"), "{args:?}: {err}");
    }
}

#[test]
fn doctor_json_lists_every_library_and_the_problems_with_their_severity() {
    let o = bin().args(["doctor", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("doctor --json is JSON");
    let libs = v["libraries"].as_array().unwrap();
    let names: Vec<&str> = libs.iter().map(|l| l["name"].as_str().unwrap()).collect();
    for want in [
        "libcuda",
        "libnvidia-ml",
        "libnvrtc",
        "libcublas)",
        "libcublasLt",
        "libcudnn",
        "libnccl",
    ] {
        assert!(
            names.iter().any(|n| n.contains(want)),
            "{want} in {names:?}"
        );
    }
    let problems = v["problems"].as_array().unwrap();
    let blockers = problems
        .iter()
        .filter(|p| p["severity"] == "blocker")
        .count();
    // Exit 0 exactly when there is no blocker.
    assert_eq!(o.status.code(), Some(if blockers == 0 { 0 } else { 2 }));
    for p in problems {
        assert!(!p["fix"].as_str().unwrap().is_empty(), "{p}");
    }
    // Where NVRTC is installed (CI installs the wheels and sets ROOFLINE_CUDA_LIBS), it is
    // reported with its version and the very file the bindings call.
    if std::env::var("CI").is_ok_and(|c| c == "true") {
        let nvrtc = libs
            .iter()
            .find(|l| l["name"].as_str().unwrap().contains("libnvrtc"))
            .unwrap();
        assert!(
            nvrtc["version"]
                .as_str()
                .is_some_and(|s| s.starts_with("12.") || s.starts_with("13.")),
            "{nvrtc}"
        );
        let file = nvrtc["in_use"].as_str().unwrap();
        assert!(file.contains("libnvrtc.so.1"), "{file}");
        assert!(Path::new(file).is_file());
    }
}

/// `scripts/gpu-bringup.sh pack` builds the kit: a stripped binary and the scripts, well under
/// the 64 MiB a GPU machine is sent, and the packed binary starts.
#[test]
fn the_bringup_kit_packs_under_the_carry_limit_and_its_binary_starts() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let out = std::env::temp_dir().join(format!("roofline-kit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&out);
    let o = Command::new("bash")
        .arg(root.join("scripts/gpu-bringup.sh"))
        .arg("pack")
        .env("ROOFLINE_KIT_DIR", &out)
        // The test's own binary: no second release build inside the test run.
        .env("ROOFLINE_KIT_BINARY", env!("CARGO_BIN_EXE_roofline"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "pack failed:\n{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let mut total = 0u64;
    for e in std::fs::read_dir(&out).unwrap().flatten() {
        total += e.metadata().unwrap().len();
    }
    assert!(total < 48 << 20, "the kit is {total} bytes");
    for f in [
        "roofline",
        "gpu-bringup.sh",
        "peers.py",
        "conv_peers.py",
        "automl_summary.py",
        "kit_summary.py",
        "summary.schema.json",
        "step-times.tsv",
    ] {
        assert!(out.join(f).is_file(), "{f} missing from the kit");
    }
    let v = Command::new(out.join("roofline"))
        .arg("--version")
        .output()
        .unwrap();
    assert!(v.status.success());
    assert!(String::from_utf8_lossy(&v.stdout).starts_with("roofline "));
    // Stripped: smaller than the binary it was made from (symbols and debug info gone).
    let packed = std::fs::metadata(out.join("roofline")).unwrap().len();
    let built = std::fs::metadata(env!("CARGO_BIN_EXE_roofline"))
        .unwrap()
        .len();
    assert!(packed < built, "packed {packed} bytes, built {built}");
    let _ = std::fs::remove_dir_all(&out);
}

/// `place --device cuda` places a training run on a GPU's ceilings: refused, before any
/// training, when the machine.json has none; a kernel workload on the GPU is pointed to the
/// probe.
#[test]
fn placing_on_a_gpu_needs_that_gpus_ceilings_and_a_training_workload() {
    let machine = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/machine-example.json");
    let o = bin()
        .args([
            "place",
            "--workload",
            "resnet50",
            "--device",
            "cuda",
            "--machine",
        ])
        .arg(&machine)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("has no gpu0 ceilings") && err.contains("roofline probe --device cuda"),
        "{err}"
    );
    assert!(!err.contains("placing resnet50"), "it trained first: {err}");
    let o = bin()
        .args([
            "place",
            "--workload",
            "gemm:64x64x64",
            "--device",
            "cuda",
            "--gpu",
            "1",
            "--machine",
        ])
        .arg(&machine)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&o.stderr).contains("no gpu1 ceilings"));
    // With a GPU's ceilings, a kernel workload is pointed to the probe.
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&machine).unwrap()).unwrap();
    let mut c = v["ceilings"][0].clone();
    c["id"] = "gpu0/gemm/f32".into();
    v["ceilings"].as_array_mut().unwrap().push(c);
    let with_gpu = std::env::temp_dir().join(format!("roofline-gpu-m-{}.json", std::process::id()));
    std::fs::write(&with_gpu, v.to_string()).unwrap();
    let o = bin()
        .args([
            "place",
            "--workload",
            "gemm:64x64x64",
            "--device",
            "cuda",
            "--machine",
        ])
        .arg(&with_gpu)
        .output()
        .unwrap();
    let _ = std::fs::remove_file(&with_gpu);
    assert_eq!(o.status.code(), Some(2));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("places a training run"), "{err}");
}

/// A second NVRTC on the dynamic linker's path under the unversioned name cudarc opens first
/// (`libnvrtc.so`, as a toolkit's `lib64` has it), beside the wheel roofline finds: `roofline
/// kernels` refuses (exit 2) naming both files and the fix, instead of compiling with the copy.
/// Needs NVRTC (the CUDA wheels CI installs); skipped without it, except under CI=true.
#[test]
fn a_second_copy_of_a_library_on_the_linker_path_is_refused() {
    use roofline_kernels::cuda::libs::{self, Lib};
    let Some(found) = libs::locate(Lib::Nvrtc).filter(|p| p.contains('/')) else {
        assert!(
            std::env::var("CI").map_or(true, |v| v != "true"),
            "CI=true and no NVRTC wheel found (ROOFLINE_CUDA_LIBS)"
        );
        roofline_model::skipped::skipped("the CUDA library search test", "no NVRTC file found");
        return;
    };
    let dir = std::env::temp_dir().join(format!("roofline-shadow-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // A copy (another file, as a toolkit's would be), under the name cudarc tries first.
    let copy = dir.join("libnvrtc.so");
    std::fs::copy(&found, &copy).unwrap();
    let o = bin()
        .args(["kernels", "--arch", "80"])
        .env("LD_LIBRARY_PATH", &dir)
        .env("ROOFLINE_CUDA_LIBS", Path::new(&found).parent().unwrap())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(
        o.status.code(),
        Some(2),
        "stdout: {}\nstderr: {err}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(err.contains("two copies of NVRTC"), "{err}");
    assert!(err.contains(&copy.display().to_string()), "{err}");
    assert!(err.contains("LD_LIBRARY_PATH"), "{err}");
    // The same files without the copy on the path: compiled.
    let o = bin()
        .args(["kernels", "--arch", "80"])
        .env("ROOFLINE_CUDA_LIBS", Path::new(&found).parent().unwrap())
        .output()
        .unwrap();
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
