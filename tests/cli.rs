//! End-to-end tests of the `roofline` binary: a quick probe, the plot, and bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_roofline"))
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roofline-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One quick probe shared by the tests that need a machine.json.
fn quick_machine() -> &'static (PathBuf, String) {
    static M: OnceLock<(PathBuf, String)> = OnceLock::new();
    M.get_or_init(|| {
        let dir = tmpdir("quick");
        let out = dir.join("machine.json");
        let o = bin()
            .args(["probe", "--quick", "-o"])
            .arg(&out)
            .output()
            .unwrap();
        assert!(o.status.success(), "probe failed: {}", stderr(&o));
        (out, String::from_utf8_lossy(&o.stdout).into_owned())
    })
}

#[test]
fn quick_probe_writes_every_required_ceiling_with_statistics() {
    let (path, table) = quick_machine();
    let m = roofline_model::Machine::read(path).unwrap();
    assert_eq!(m.schema, "roofline/machine/v1");
    let mut required: Vec<String> = [
        "cpu/fma/f64/t1",
        "cpu/fma/f32/t1",
        "cpu/fma/f64/all",
        "cpu/fma/f32/all",
        "cpu/gemm/f32/t1",
        "cpu/gemm/f32/all",
        "cpu/gemm/f64/all",
        "cpu/conv/f32/all",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // Every cache level the OS reports, and DRAM.
    let mut levels: Vec<String> = m
        .provenance
        .cpu
        .caches
        .iter()
        .filter(|c| c.cache_type != "Instruction")
        .map(|c| format!("L{}", c.level))
        .collect();
    levels.dedup();
    levels.push("DRAM".into());
    for level in &levels {
        for op in ["read", "copy", "triad"] {
            for t in ["t1", "all"] {
                required.push(format!("cpu/mem/{level}/{op}/{t}"));
            }
        }
    }
    for id in &required {
        let c = m.ceiling(id).unwrap_or_else(|| panic!("{id} missing"));
        assert!(c.value > 0.0 && c.value.is_finite(), "{id}");
        assert_eq!(c.stats.samples, c.stats.values.len());
        assert!(c.stats.samples >= 3);
        assert_eq!(c.value, c.stats.max, "{id}: value is the best sample");
        assert!(c.unit == "FLOP/s" || c.unit == "B/s", "{id}: {}", c.unit);
        assert!(table.contains(id.as_str()), "the table shows {id}");
    }
    // Compute ceilings carry a theoretical peak from the CPU rule; the flag is consistent.
    for c in m.ceilings.iter().filter(|c| c.id.starts_with("cpu/fma/f")) {
        let p = c.theoretical_peak.as_ref().expect("peak");
        assert!(p.source.contains("CPU rule"));
        assert!(p.uncertainty >= 0.005);
        assert_eq!(c.above_peak, c.value > p.value * (1.0 + p.uncertainty));
    }
    // Bandwidth falls (or stays) from L1 to DRAM: the plateaus are attributed in order.
    let bw = |l: &str| m.ceiling(&format!("cpu/mem/{l}/read/t1")).unwrap().value;
    assert!(
        bw("L1") > bw("DRAM"),
        "L1 {} vs DRAM {}",
        bw("L1"),
        bw("DRAM")
    );
    // The memory curves are kept, from 4 KiB to at least 512 MiB.
    let curve = m
        .curves
        .iter()
        .find(|c| c.id == "cpu/mem/sweep/triad/t1")
        .unwrap();
    assert!(curve.points.first().unwrap().x <= 4096.0);
    assert!(curve.points.last().unwrap().x >= 0.99 * (512 << 20) as f64);
    assert!(
        m.provenance
            .cpu
            .measured_clock_hz_t1
            .as_ref()
            .unwrap()
            .median
            > 1e8
    );
    assert!(m
        .tables
        .iter()
        .any(|t| t.id == "cpu/gemm/f32/t1/shapes" && t.rows.len() >= 3));
}

#[test]
fn plot_draws_the_machine() {
    let (path, _) = quick_machine();
    let dir = tmpdir("plot");
    let svg = dir.join("r.svg");
    let o = bin()
        .arg("plot")
        .arg(path)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<svg") && text.contains("cpu/mem/DRAM/triad/all") && text.contains("ridge")
    );
    let o = bin()
        .arg("plot")
        .arg(path)
        .args(["--threads", "t1", "--op", "read", "-o"])
        .arg(dir.join("t1.svg"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(dir.join("t1.svg"))
        .unwrap()
        .contains("cpu/mem/DRAM/read/t1"));
    // Every roof named on the plot with its value, and no two texts overlapping, in every
    // plot kind a single machine has.
    for model in ["classic", "hierarchical", "node-coi"] {
        let f = dir.join(format!("{model}.svg"));
        let o = bin()
            .arg("plot")
            .arg(path)
            .args(["--model", model, "-o"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        let svg = std::fs::read_to_string(&f).unwrap();
        let clash = roofline_plots::labels::collisions(&svg);
        assert!(clash.is_empty(), "{model}: overlapping labels {clash:?}");
        let texts: Vec<String> = roofline_plots::labels::text_boxes(&svg)
            .into_iter()
            .map(|t| t.0)
            .collect();
        if model != "node-coi" {
            for name in ["L1 triad", "DRAM triad", "FMA f32", "GEMM f32"] {
                assert!(
                    texts
                        .iter()
                        .any(|t| t.starts_with(name) && t.ends_with("/s")),
                    "{model}: no label for {name} in {texts:?}"
                );
            }
        }
        assert!(
            texts.iter().any(|t| t.starts_with("measured ")),
            "{model}: the subtitle"
        );
    }
}

/// Headless Chromium (Debian's chromium package; .ci/run installs it), or None after saying
/// that `what` is skipped; under CI=true its absence fails the test.
fn chromium(what: &str) -> Option<&'static str> {
    let found = ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        });
    if found.is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true and no chromium"
        );
        eprintln!("skipped {what}: no chromium");
    }
    found
}

/// Runs the binary and expects exit code 2 and one line on stderr naming `needle`.
fn expect_input_error(args: &[&str], extra: Option<&Path>, needle: &str) {
    let mut cmd = bin();
    cmd.args(args);
    if let Some(p) = extra {
        cmd.arg(p);
    }
    let o = cmd.output().unwrap();
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line, got: {err}"
    );
    assert!(err.contains(needle), "{args:?}: `{needle}` not in: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn bad_input_is_one_clear_line_and_exit_code_2() {
    let dir = tmpdir("bad");
    expect_input_error(&["plot"], Some(&dir.join("missing.json")), "cannot read");
    let malformed = dir.join("malformed.json");
    std::fs::write(&malformed, "{ not json").unwrap();
    expect_input_error(&["plot"], Some(&malformed), "malformed JSON");
    let other = dir.join("other.json");
    std::fs::write(
        &other,
        r#"{"schema": "roofline/machine/v99", "ceilings": []}"#,
    )
    .unwrap();
    expect_input_error(&["plot"], Some(&other), "unknown schema");
    let noschema = dir.join("noschema.json");
    std::fs::write(&noschema, r#"{"ceilings": []}"#).unwrap();
    expect_input_error(&["plot"], Some(&noschema), "unknown schema");
    expect_input_error(
        &["probe", "--only", "fma,cache", "-o"],
        Some(&dir.join("m.json")),
        "unknown --only entry `cache`",
    );
    expect_input_error(
        &["probe", "--quick", "-o"],
        Some(&dir.join("no/such/dir/m.json")),
        "cannot write",
    );
    expect_input_error(&["probe", "--quick", "-o"], Some(&dir), "directory");
    expect_input_error(
        &["probe", "--quick", "-o", "/dev/null"],
        None,
        "not a regular file",
    );
    expect_input_error(
        &["probe", "--threads", "100000", "-o"],
        Some(&dir.join("m.json")),
        "--threads",
    );
    // Nothing was written by the failed probes.
    assert!(!dir.join("m.json").exists());
}

#[test]
fn ctrl_c_leaves_no_file_behind() {
    let dir = tmpdir("sigint");
    let out = dir.join("machine.json");
    let child = bin()
        .args(["probe", "-o"])
        .arg(&out)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(stderr(&o).contains("nothing was written"));
    let left: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "files left behind: {left:?}");
}

#[test]
fn peaks_lists_the_database() {
    let o = bin().arg("peaks").output().unwrap();
    assert!(o.status.success());
    let text = String::from_utf8_lossy(&o.stdout);
    for name in [
        "V100",
        "A100",
        "H100 SXM5",
        "H100 PCIe",
        "H200",
        "L40S",
        "T4",
        "MI250X",
        "MI300X",
        "CPU rule",
    ] {
        assert!(text.contains(name), "{name}");
    }
    let o = bin().args(["peaks", "--json"]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(v["schema"], "roofline/peaks/v1");
}

#[test]
fn json_output_and_fewer_threads() {
    let dir = tmpdir("json");
    let out = dir.join("m.json");
    let o = bin()
        .args([
            "probe",
            "--quick",
            "--only",
            "fma",
            "--threads",
            "1",
            "--json",
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    // stdout is exactly the machine.json that was written.
    let printed = roofline_model::Machine::from_json(&String::from_utf8_lossy(&o.stdout)).unwrap();
    let written = roofline_model::Machine::read(&out).unwrap();
    assert_eq!(printed, written);
    let all = written.ceiling("cpu/fma/f32/all").unwrap();
    assert_eq!(
        all.threads, 1,
        "--threads 1 runs the `all` ceilings on one core"
    );
    assert!(written
        .provenance
        .notes
        .iter()
        .any(|n| n.contains("--threads 1")));
    assert!(
        written.ceiling("cpu/mem/L1/triad/t1").is_none(),
        "--only fma measures no memory"
    );
    assert!(all.method.contains("instruction count"));
}

#[test]
fn a_closed_pipe_ends_quietly() {
    let mut child = bin()
        .arg("peaks")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Close our end of stdout before the table is written.
    drop(child.stdout.take());
    let o = child.wait_with_output().unwrap();
    assert!(!stderr(&o).contains("panicked"), "{}", stderr(&o));
}

fn driver_present() -> bool {
    roofline_kernels::cuda::libs::present(roofline_kernels::cuda::libs::Lib::Driver)
}

#[test]
fn without_a_gpu_cuda_is_refused_and_auto_probes_the_cpu() {
    if driver_present() {
        eprintln!("skipped: this machine has an NVIDIA driver");
        return;
    }
    let dir = tmpdir("nogpu");
    let out = dir.join("m.json");
    let out_s = out.to_str().unwrap();
    for args in [
        vec!["probe", "--device", "cuda", "-o", out_s],
        vec!["probe", "--device", "cuda", "--check"],
        vec!["probe", "--check"],
    ] {
        expect_input_error(
            &args,
            None,
            "no NVIDIA driver (libcuda) found: looked for libcuda.so.1",
        );
    }
    assert!(!out.exists());
    // auto (the default): the CPU is probed and the file says no GPU was found.
    let o = bin()
        .args(["probe", "--quick", "--only", "fma", "-o"])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("no GPU found"), "{}", stderr(&o));
    let m = roofline_model::Machine::read(&out).unwrap();
    assert!(m.provenance.gpus.is_empty() && m.provenance.devices.is_empty());
    assert!(m
        .provenance
        .notes
        .iter()
        .any(|n| n.starts_with("no GPU found: no NVIDIA driver")));
    assert!(m.ceiling("cpu/fma/f32/all").is_some());
    // --device cpu says why the GPUs were not probed, and --check does not go with it.
    expect_input_error(
        &["probe", "--device", "cpu", "--check"],
        None,
        "--check tests the GPU kernels",
    );
    // A GPU plot of a CPU-only machine.json.
    expect_input_error(
        &["plot", "--device", "gpu0", "-o", "/tmp/x.svg"],
        Some(&out),
        "has no GPU",
    );
}

#[test]
fn kernels_lists_every_cuda_kernel_or_says_nvrtc_is_missing() {
    expect_input_error(&["kernels", "--arch", "eighty"], None, "--arch eighty");
    let o = bin().args(["kernels", "--arch", "80,90"]).output().unwrap();
    if roofline_kernels::cuda::nvrtc::ensure_nvrtc().is_err() {
        assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
        assert!(
            stderr(&o).contains("no NVRTC (libnvrtc) found"),
            "{}",
            stderr(&o)
        );
        return;
    }
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    for src in roofline_kernels::cuda::nvrtc::SOURCES {
        for k in src.kernels {
            for arch in ["sm_80", "sm_90"] {
                assert!(
                    text.lines()
                        .any(|l| l.split_whitespace().next() == Some(k) && l.contains(arch)),
                    "{k} {arch} missing from:\n{text}"
                );
            }
        }
    }
    let o = bin()
        .args(["kernels", "--json", "--arch", "90"])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let ks = v["kernels"].as_array().unwrap();
    assert!(ks
        .iter()
        .all(|k| k["registers"].as_u64().unwrap() > 0 && k["arch"] == "sm_90"));
}

#[test]
fn communication_needs_mpirun_and_storage_is_measured_then_removed() {
    // A world of one says nothing about communication.
    if roofline_kernels::comm::launched_ranks().is_none() {
        expect_input_error(
            &["probe", "--only", "comm", "-o", "/tmp/roofline-comm.json"],
            None,
            "world of one",
        );
    }
    let dir = tmpdir("io");
    let data = dir.join("data");
    std::fs::create_dir_all(&data).unwrap();
    let out = dir.join("m.json");
    let o = bin()
        .args(["probe", "--quick", "--only", "io", "--io"])
        .arg(&data)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let m = roofline_model::Machine::read(&out).unwrap();
    for id in ["io/data/seq", "io/data/small", "io/data/small/files"] {
        let c = m.ceiling(id).unwrap_or_else(|| panic!("{id} missing"));
        assert!(c.value > 0.0);
    }
    assert_eq!(m.ceiling("io/data/small/files").unwrap().unit, "file/s");
    assert_eq!(
        std::fs::read_dir(&data).unwrap().count(),
        0,
        "test files left behind"
    );
    expect_input_error(
        &["probe", "--only", "io", "--io", "/nonexistent/dir", "-o"],
        Some(&dir.join("x.json")),
        "is not a folder",
    );
    // The COI rooflines need communication ceilings.
    expect_input_error(
        &["plot", "--model", "node-coi", "-o", "/tmp/x.svg"],
        Some(&out),
        "intra-node",
    );
}

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
        "apply to --device cuda",
    );
    expect_input_error(&["train", "--steps", "0"], None, "nothing to train");
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

/// `place` puts a GEMM right of the ridge (compute-bound), a large triad left of it
/// (memory-bound on the DRAM roof), and a small ResNet with its layers, time breakdown,
/// advice, plot and trace. Nothing here depends on how fast the machine is.
#[test]
fn place_puts_workloads_on_the_roofline() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("place");
    let read = |p: &Path| -> serde_json::Value {
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
    };
    let place = |args: &[&str], out: &Path| {
        let o = bin()
            .args(["place", "--machine"])
            .arg(machine)
            .arg("-o")
            .arg(out)
            .args(args)
            .output()
            .unwrap();
        assert!(o.status.success(), "{args:?}: {}", stderr(&o));
        read(out)
    };
    let g = place(
        &[
            "--workload",
            "gemm:512x512x512",
            "--steps",
            "3",
            "--warm",
            "1",
        ],
        &dir.join("g.json"),
    );
    assert_eq!(g["schema"], "roofline/placement/v1");
    assert_eq!(g["point"]["bound"]["kind"], "compute");
    assert_eq!(g["point"]["bound"]["ceiling"], "cpu/gemm/f32/all");
    let oi = g["point"]["oi"]["analytic"].as_f64().unwrap();
    assert!((oi - 2.0 * 512.0 / (4.0 * 3.0)).abs() < 1e-9, "OI {oi}");
    assert_eq!(g["point"]["achieved"]["samples"], 3);
    let a = g["point"]["achieved_flops"].as_f64().unwrap();
    let att = g["point"]["bound"]["attainable"].as_f64().unwrap();
    assert!((g["point"]["bound"]["headroom"].as_f64().unwrap() - att / a).abs() < 1e-9 * att / a);
    assert!(g["energy"]["note"].as_str().unwrap().contains("energy"));
    let svg = std::fs::read_to_string(dir.join("g.svg")).unwrap();
    assert!(
        svg.contains("gemm:512x512x512:f32"),
        "the point is labelled on the plot"
    );
    let s = place(
        &[
            "--workload",
            "stream:268435456",
            "--steps",
            "2",
            "--warm",
            "1",
        ],
        &dir.join("s.json"),
    );
    assert_eq!(s["point"]["bound"]["kind"], "memory");
    assert_eq!(s["point"]["bound"]["ceiling"], "cpu/mem/DRAM/triad/all");
    assert!((s["point"]["oi"]["analytic"].as_f64().unwrap() - 1.0 / 12.0).abs() < 1e-12);
    let r = place(
        &[
            "--workload",
            "resnet50",
            "--width",
            "0.125",
            "--depth",
            "1,1,1,1",
            "--resolution",
            "32",
            "--classes",
            "4",
            "--batch",
            "8",
            "--steps",
            "2",
            "--warm",
            "1",
            "--top",
            "5",
            "--trace",
            dir.join("r.trace.json").to_str().unwrap(),
        ],
        &dir.join("r.json"),
    );
    assert_eq!(r["workload"]["kind"], "training");
    assert_eq!(r["workload"]["measured_steps"], 2);
    let layers = r["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 5, "the top five layers are placed");
    for l in layers {
        assert!(l["share_of_step"].as_f64().unwrap() > 0.0);
        assert!(l["oi"]["analytic"].as_f64().unwrap() > 0.0);
        assert!(l["bound"]["roofs"].as_array().unwrap().len() >= 2);
    }
    let t = &r["time"];
    let sum: f64 = ["compute_s", "communication_s", "data_s", "idle_s"]
        .iter()
        .map(|k| t[*k].as_f64().unwrap())
        .sum();
    assert!(sum <= t["total_s"].as_f64().unwrap() * 1.0001 + 1e-9, "{t}");
    assert!(!r["advice"].as_array().unwrap().is_empty());
    let trace = read(&dir.join("r.trace.json"));
    let ev = trace["traceEvents"].as_array().unwrap();
    for cat in ["forward", "backward", "optimizer", "step"] {
        assert!(
            ev.iter().any(|e| e["cat"] == cat && e["ph"] == "X"),
            "no {cat} span"
        );
    }
    assert!(ev.iter().any(|e| e["name"] == "layer1.0.conv2"));
    let svg = std::fs::read_to_string(dir.join("r.svg")).unwrap();
    let clash = roofline_plots::labels::collisions(&svg);
    assert!(
        clash.is_empty(),
        "the placement's labels overlap: {clash:?}"
    );
    assert!(svg.contains("resnet50"));
    // A placement gates against itself (ids placement/<workload>/…).
    let o = bin()
        .arg("gate")
        .arg("--baseline")
        .arg(dir.join("r.json"))
        .arg("--current")
        .arg(dir.join("r.json"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("placement/resnet50/achieved"));
    // The EWA detector, scaled down, placed like resnet50: its parts are layers.
    let e = bin()
        .args(["place", "--machine"])
        .arg(machine)
        .arg("-o")
        .arg(dir.join("e.json"))
        .args([
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
            "--steps",
            "2",
            "--warm",
            "1",
            "--top",
            "40",
        ])
        // The synthetic year file goes to the temporary folder: this test's.
        .env("TMPDIR", &dir)
        .output()
        .unwrap();
    assert!(e.status.success(), "{}", stderr(&e));
    let e = read(&dir.join("e.json"));
    assert_eq!(e["workload"]["name"], "ewa");
    assert_eq!(e["workload"]["batch"], 2);
    let names: Vec<&str> = e["layers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| l["label"].as_str().unwrap())
        .collect();
    for part in ["fpn", "rpn.head", "roi_align", "box_head", "conv1"] {
        assert!(names.contains(&part), "{part} not in {names:?}");
    }
    assert!(e["point"]["oi"]["analytic"].as_f64().unwrap() > 1.0);
    // Several placements on one plot, in every classic model: the EWA detector beside
    // resnet50.
    for model in ["classic", "hierarchical"] {
        let o = bin()
            .arg("plot")
            .arg(machine)
            .args(["--model", model, "--placement"])
            .arg(dir.join("g.json"))
            .arg("--placement")
            .arg(dir.join("r.json"))
            .arg("--placement")
            .arg(dir.join("e.json"))
            .arg("-o")
            .arg(dir.join("all.svg"))
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", stderr(&o));
        let svg = std::fs::read_to_string(dir.join("all.svg")).unwrap();
        assert!(svg.contains("gemm:512x512x512:f32") && svg.contains("resnet50"));
        assert!(
            svg.contains(">ewa<") || svg.contains("ewa ("),
            "the detector's point"
        );
    }
    expect_input_error(
        &["plot", "--placement", "/nonexistent.json"],
        Some(machine),
        "nonexistent",
    );
    // Bad input: one line, exit 2, nothing written.
    expect_input_error(
        &["place", "--workload", "bert", "--machine"],
        Some(machine),
        "expected",
    );
    expect_input_error(
        &[
            "place",
            "--workload",
            "gemm:8x8x8",
            "--machine",
            "/nonexistent/m.json",
            "-o",
        ],
        Some(&dir.join("x.json")),
        "roofline probe",
    );
    expect_input_error(
        &[
            "place",
            "--workload",
            "gemm:64x64x64",
            "--trace",
            "/tmp/t.json",
            "--machine",
        ],
        Some(machine),
        "--workload resnet50",
    );
    assert!(!dir.join("x.json").exists());
}

/// `score` on a scaled-down synthetic run: score.json with every run and the olympic scores,
/// a report whose first line says it is not comparable, and the HTML page rendered by headless
/// Chromium with its plot and score table visible.
#[test]
fn score_writes_score_json_and_a_report_that_renders() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("score");
    let out = dir.join("score.json");
    let o = bin()
        .args([
            "score",
            "--runs",
            "3",
            "--width",
            "0.125",
            "--depth",
            "1,1,0,0",
            "--resolution",
            "32",
            "--classes",
            "4",
            "--batch",
            "8",
            "--steps",
            "6",
            "--train-images",
            "64",
            "--eval-images",
            "32",
            "--target-top1",
            "0.5",
            "--machine",
        ])
        .arg(machine)
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("NOT COMPARABLE"), "{text}");
    assert!(text.contains("not valid"), "{text}");
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(s["schema"], "roofline/score/v1");
    assert_eq!(s["valid"], false);
    assert_eq!(s["comparable"], false);
    let runs = s["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3);
    // The olympic mean of three runs is the middle one.
    let mut f: Vec<f64> = runs.iter().map(|r| r["flops"].as_f64().unwrap()).collect();
    f.sort_by(|a, b| a.total_cmp(b));
    assert_eq!(s["scores"]["flops"]["mean"].as_f64().unwrap(), f[1]);
    for r in runs {
        let v = r["flops"].as_f64().unwrap() * (r["quality"].as_f64().unwrap() / 0.5).powi(5);
        assert!((r["vflops"].as_f64().unwrap() - v).abs() <= 1e-9 * v.abs());
    }
    assert!(s["energy_note"].as_str().unwrap().contains("energy"));
    assert_eq!(s["placement"]["schema"], "roofline/placement/v1");
    let html = std::fs::read_to_string(dir.join("score.html")).unwrap();
    assert!(html.contains("<table id=\"scores\">") && html.contains("<svg"));
    assert!(
        !html.contains("src=\"http") && !html.contains("<link") && !html.contains("<script"),
        "no external assets, no script"
    );
    let Some(chrome) = chromium("the rendering check") else {
        return;
    };
    let png = dir.join("report.png");
    let url = format!("file://{}", dir.join("score.html").display());
    let shot = Command::new(chrome)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            "--window-size=1200,3200",
        ])
        .arg(format!("--screenshot={}", png.display()))
        .arg(&url)
        .output()
        .unwrap();
    assert!(shot.status.success() && png.exists(), "{}", stderr(&shot));
    let img = image::open(&png).unwrap().to_rgb8();
    let count = |c: [u8; 3]| img.pixels().filter(|p| p.0 == c).count();
    // The placed point (crimson) and the roofs are drawn; the tables' header cells (#eee) show.
    assert!(
        count([220, 20, 60]) > 50,
        "the workload's point is not visible"
    );
    assert!(
        count([238, 238, 238]) > 1000,
        "the score table's header is not visible"
    );
    let dom = Command::new(chrome)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(&url)
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    assert!(
        dom.contains("id=\"scores\"") && dom.contains("VFLOPS"),
        "{dom}"
    );
}

fn half(v: &serde_json::Value) -> serde_json::Value {
    serde_json::json!(v.as_f64().unwrap() * 0.5)
}

/// `gate`: a result against itself passes; with the FMA ceilings' samples halved it fails and
/// names them, in every format; a different CPU is a warning (an error with --strict); missing
/// ids fail only with --strict; --update-baseline replaces the baseline; bad input exits 2.
#[test]
fn gate_catches_a_slower_fma_and_not_an_identical_run() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("gate");
    let base = dir.join("base.json");
    std::fs::copy(machine, &base).unwrap();
    let gate = |args: &[&str]| {
        bin()
            .arg("gate")
            .arg("--baseline")
            .arg(&base)
            .args(args)
            .output()
            .unwrap()
    };
    let same = gate(&["--current", base.to_str().unwrap()]);
    assert_eq!(same.status.code(), Some(0), "{}", stderr(&same));
    let out = String::from_utf8_lossy(&same.stdout);
    assert!(
        out.contains("PASS") && out.contains("cpu/fma/f32/all"),
        "{out}"
    );
    // The FMA probe "forced slower": every sample and value of cpu/fma/* halved.
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(machine).unwrap()).unwrap();
    for c in m["ceilings"].as_array_mut().unwrap() {
        if c["id"].as_str().unwrap().starts_with("cpu/fma/") {
            c["value"] = half(&c["value"]);
            let vals: Vec<serde_json::Value> = c["stats"]["values"]
                .as_array()
                .unwrap()
                .iter()
                .map(half)
                .collect();
            c["stats"]["values"] = serde_json::Value::Array(vals);
            for f in ["min", "median", "max", "mean"] {
                c["stats"][f] = half(&c["stats"][f]);
            }
        }
    }
    m["provenance"]["cpu"]["model_name"] = serde_json::json!("Another CPU");
    let slow = dir.join("slow.json");
    std::fs::write(&slow, serde_json::to_string(&m).unwrap()).unwrap();
    let s = slow.to_str().unwrap();
    let o = gate(&["--current", s]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("REGRESSED") && out.contains("FAIL"), "{out}");
    assert!(
        out.contains("CPU: baseline"),
        "the changed CPU is reported: {out}"
    );
    let regressed: Vec<&str> = out.lines().filter(|l| l.contains("REGRESSED")).collect();
    assert!(
        regressed.iter().all(|l| l.starts_with("cpu/fma/")),
        "{regressed:?}"
    );
    let md = String::from_utf8_lossy(&gate(&["--current", s, "--format", "markdown"]).stdout)
        .into_owned();
    assert!(
        md.contains("| `cpu/fma/f32/all` |") && md.contains("**REGRESSED**"),
        "{md}"
    );
    let junit =
        String::from_utf8_lossy(&gate(&["--current", s, "--format", "junit"]).stdout).into_owned();
    assert!(
        junit.starts_with("<?xml") && junit.contains("<failure message=\"regressed"),
        "{junit}"
    );
    let gh =
        String::from_utf8_lossy(&gate(&["--current", s, "--format", "github"]).stdout).into_owned();
    assert!(
        gh.contains("::error title=roofline gate: cpu/fma/f32/all regressed::"),
        "{gh}"
    );
    assert!(
        gh.contains("::warning title=roofline gate: different machine"),
        "{gh}"
    );
    // The provenance alone fails only with --strict; so do missing ids.
    m["ceilings"]
        .as_array_mut()
        .unwrap()
        .retain(|c| !c["id"].as_str().unwrap().starts_with("cpu/fma/"));
    let other = dir.join("other.json");
    std::fs::write(&other, serde_json::to_string(&m).unwrap()).unwrap();
    let o = gate(&["--current", other.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    assert!(String::from_utf8_lossy(&o.stdout)
        .contains("missing from the current result: cpu/fma/f32/all"));
    let o = gate(&["--current", other.to_str().unwrap(), "--strict"]);
    assert_eq!(o.status.code(), Some(1));
    // Rules: ignore the FMA ceilings, and the slower run passes.
    let rules = dir.join("gate.toml");
    std::fs::write(&rules, "[default]\ntolerance = 0.1\n\n[[rule]]\npattern = \"cpu/fma/*\"\ntolerance = 0.0\nignore = true\n").unwrap();
    let o = gate(&["--current", s, "--rules", rules.to_str().unwrap()]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // --update-baseline makes the current result the baseline.
    let o = gate(&["--current", s, "--update-baseline"]);
    assert_eq!(o.status.code(), Some(0));
    assert_eq!(std::fs::read(&base).unwrap(), std::fs::read(&slow).unwrap());
    // Several runs per side are pooled; a first --update-baseline creates the baseline.
    let o = gate(&["--current", s, s]);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let fresh = dir.join("fresh.json");
    let o = bin()
        .args(["gate", "--update-baseline", "--current", s, "--baseline"])
        .arg(&fresh)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert_eq!(
        std::fs::read(&fresh).unwrap(),
        std::fs::read(&slow).unwrap()
    );
    // Bad input.
    expect_input_error(
        &["gate", "--current", s, "--baseline"],
        Some(Path::new("/nonexistent.json")),
        "nonexistent",
    );
    std::fs::write(&rules, "[default]\ntolerance = 5\n").unwrap();
    expect_input_error(
        &["gate", "--baseline", s, "--current", s, "--rules"],
        Some(&rules),
        "fractions",
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

/// `score --bagging 2` without a launcher: two models side by side on bootstrap samples, the
/// ensemble scored by V3.0's equations beside the first model alone, in score.json, the report
/// and the gate; `--bagging 0` is refused.
#[test]
fn score_bags_two_models_in_one_process() {
    let dir = tmpdir("bagging");
    let out = dir.join("bag.json");
    let o = bin()
        .args([
            "score",
            "--bagging",
            "2",
            "--runs",
            "1",
            "--width",
            "0.125",
            "--depth",
            "1,1,0,0",
            "--resolution",
            "32",
            "--classes",
            "4",
            "--batch",
            "16",
            "--steps",
            "14",
            "--train-images",
            "128",
            "--eval-images",
            "64",
        ])
        .arg("-o")
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(
        text.contains("bagging: 2 models × 1 ranks (Sys_scale 2)"),
        "{text}"
    );
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    let run = &s["runs"][0];
    let b = &run["bagging"];
    assert_eq!(
        (b["models"].as_u64(), b["sys_scale"].as_u64()),
        (Some(2), Some(2))
    );
    let members = b["members"].as_array().unwrap();
    assert_eq!(members.len(), 2);
    assert_ne!(members[0]["sample_seed"], members[1]["sample_seed"]);
    for m in members {
        let d = m["distinct_images"].as_u64().unwrap();
        assert!((60..110).contains(&d), "about 63% of 128 distinct: {d}");
    }
    // Eq. 4 and 6 from the file's own figures: APC = M·B·f, FLOPS = (N/B)·APC / T_epoch,
    // T_epoch = the slowest model's step time × N/B.
    let f = b["flops_per_sample"].as_f64().unwrap();
    let apc = b["apc_flops"].as_f64().unwrap();
    assert_eq!(apc, 2.0 * 16.0 * f);
    assert_eq!(b["iterations_per_epoch"].as_f64(), Some(8.0));
    let slowest = members
        .iter()
        .map(|m| m["step_seconds"].as_f64().unwrap())
        .fold(0.0, f64::max);
    let t = b["epoch_seconds"].as_f64().unwrap();
    assert!((t - 8.0 * slowest).abs() <= 1e-12 * t);
    let flops = b["flops"].as_f64().unwrap();
    assert!((flops - 8.0 * apc / t).abs() <= 1e-9 * flops);
    // The run's figures are the ensemble's.
    assert_eq!(run["flops"], b["flops"]);
    assert_eq!(run["quality"], b["ensemble_quality"]);
    assert!(
        s["scores"]["bagging"]["single_model_flops"]["mean"]
            .as_f64()
            .unwrap()
            > 0.0
    );
    assert!(s["configuration"]["bagging (HPC AI500 V3.0)"]
        .as_str()
        .unwrap()
        .contains("side by side"));
    let html = std::fs::read_to_string(dir.join("bag.html")).unwrap();
    assert!(html.contains("id=\"bagging\"") && html.contains("id=\"members\""));
    let o = bin()
        .arg("gate")
        .arg("--baseline")
        .arg(&out)
        .arg("--current")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    let g = String::from_utf8_lossy(&o.stdout);
    assert!(
        g.contains("score/resnet50/bagging/ensemble_quality")
            && g.contains("score/resnet50/bagging/single_model_flops"),
        "{g}"
    );
    let o = bin()
        .args(["score", "--bagging", "0", "--runs", "1"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("at least one model"), "{}", stderr(&o));
}

/// `sweep`: two data sizes × two thread counts of a small model, and SAIH's model filter
/// choosing among variants; every point placed, the strong-scaling series computed from the
/// points' own step times, the charts written, bad input refused.
#[test]
fn sweep_places_a_grid_and_scales_it() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("sweep");
    let out = dir.join("s.json");
    let o = bin()
        .args(["sweep", "--machine"])
        .arg(machine)
        .args([
            "--images",
            "32,128",
            "--resolution",
            "32",
            "--width",
            "0.125",
            "--depth",
            "1,1,0,0",
            "--threads",
            "1,2",
            "--batch",
            "8",
            "--steps",
            "2",
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let s: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(s["schema"], "roofline/sweep/v1");
    let pts = s["points"].as_array().unwrap();
    assert_eq!(pts.len(), 4);
    // Smallest problem first; SAIH's problem size = FLOPs per sample × samples.
    let sizes: Vec<f64> = pts
        .iter()
        .map(|p| p["problem_flops"].as_f64().unwrap())
        .collect();
    assert!(sizes.windows(2).all(|w| w[0] <= w[1]), "{sizes:?}");
    for p in pts {
        let f = p["flops_per_sample"].as_f64().unwrap();
        let n = p["problem"]["images"].as_f64().unwrap();
        assert_eq!(p["problem_flops"].as_f64().unwrap(), f * n);
        let pct = p["percent_of_peak"].as_f64().unwrap();
        assert!(pct > 0.0 && pct < 100.0, "{p}");
        let share = p["io_share"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&share));
        assert!(dir
            .join("s-points")
            .join(p["placement"].as_str().unwrap())
            .exists());
    }
    let scaling = s["scaling"].as_array().unwrap();
    assert_eq!(scaling.len(), 2, "each data size at 1 and 2 threads");
    for sc in scaling {
        let sp = sc["points"].as_array().unwrap();
        let t = |i: usize| sp[i]["step_seconds"].as_f64().unwrap();
        let speedup = sp[1]["speedup"].as_f64().unwrap();
        assert!((speedup - t(0) / t(1)).abs() < 1e-12);
        assert!((sp[1]["efficiency"].as_f64().unwrap() - speedup / 2.0).abs() < 1e-12);
    }
    for chart in ["s-trend.svg", "s-scaling.svg", "s-roofline.svg"] {
        let svg = std::fs::read_to_string(dir.join(chart)).unwrap();
        assert!(svg.contains("<svg"), "{chart}");
        let clash = roofline_plots::labels::collisions(&svg);
        assert!(clash.is_empty(), "{chart}: overlapping labels {clash:?}");
    }
    // The model filter: of widths 0.125 and 0.25 at depth 1,1,0,0 only the variants in range.
    let fout = dir.join("f.json");
    let small = pts[0]["flops_per_sample"].as_f64().unwrap();
    let range = format!("{}..{}", small * 0.5, small * 1.5);
    let o = bin()
        .args(["sweep", "--machine"])
        .arg(machine)
        .args([
            "--images",
            "32",
            "--resolution",
            "32",
            "--width",
            "0.125,0.25",
            "--depth",
            "1,1,0,0",
            "--model-flops",
            &range,
            "--threads",
            "1",
            "--batch",
            "8",
            "--steps",
            "1",
            "-o",
        ])
        .arg(&fout)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let f: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&fout).unwrap()).unwrap();
    assert_eq!(f["points"].as_array().unwrap().len(), 1);
    assert_eq!(f["points"][0]["problem"]["width"], 0.125);
    assert!(f["notes"][0]
        .as_str()
        .unwrap()
        .contains("left out by --model-flops: width 0.25"));
    for (args, needle) in [
        (vec!["--model-flops", "5..1"], "LO < HI"),
        (vec!["--model-flops", "1e30..1e31"], "no model variant"),
        (vec!["--ranks", "3", "--batch", "8"], "does not divide"),
    ] {
        let o = bin()
            .args(["sweep", "--machine"])
            .arg(machine)
            .args(&args)
            .arg("-o")
            .arg(dir.join("x.json"))
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(stderr(&o).contains(needle), "{args:?}: {}", stderr(&o));
    }
}

/// `plot -o roofline.html`: one self-contained page with the figure, a switch per roof and per
/// placed workload, and tooltips; in headless Chromium (Debian's chromium; .ci/run installs
/// it) the page's self-check shows a tooltip naming a ceiling with its samples, switches a roof
/// off, and finds no two labels overlapping as the browser lays them out.
#[test]
fn plot_writes_an_interactive_page() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("html");
    let page = dir.join("roofline.html");
    let o = bin()
        .arg("plot")
        .arg(machine)
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg"));
    assert!(
        !html.contains("src=\"http") && !html.contains("<link") && !html.contains("href=\"http"),
        "no external asset"
    );
    assert!(html.contains("data-key=\"roof\" data-value=\"cpu/mem/DRAM/triad/all\""));
    assert!(html.matches("data-tip=").count() > 10);
    let Some(chrome) = chromium("the browser check") else {
        return;
    };
    let dom = Command::new(chrome)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}#selftest", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    let body = dom
        .find("<body")
        .map(|i| &dom[i..i + dom[i..].find('>').unwrap_or(0)])
        .unwrap_or("");
    assert!(body.contains("data-overlaps=\"0\""), "{body}");
    assert!(body.contains("samples, cv"), "the tooltip shows: {body}");
    assert!(
        body.contains("data-switched=\"cpu/"),
        "a roof switched off: {body}"
    );
}
