//! End-to-end tests of the `roofline` binary: `place` and `sweep`: workloads and kernels on the roofline, grids of them.

mod common;

use common::*;
use std::path::Path;

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
    // A STREAM footprint past the last-level cache, which can be large (480 MiB of L3 on one
    // of the Xeons CI runs on): twice every data cache together, at least 256 MiB.
    let m = read(machine);
    let caches: u64 = m["provenance"]["cpu"]["caches"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["cache_type"] != "Instruction")
        .map(|c| c["size_bytes"].as_u64().unwrap() * c["instances"].as_u64().unwrap().max(1))
        .sum();
    let bytes = (2 * caches).max(256 << 20).next_multiple_of(64 << 20);
    let stream = format!("stream:{bytes}");
    let s = place(
        &["--workload", &stream, "--steps", "2", "--warm", "1"],
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
        // The 3×3 stride-1 convolutions (v1.5: every block's conv2 but the first of layers
        // 2–4) ran by Winograd's algorithm in f32 on the CPU, and say so.
        let name = l["label"].as_str().unwrap();
        let winograd =
            name.ends_with(".conv2") && !name.contains(".0.") || name == "layer1.0.conv2";
        assert_eq!(
            l["note"].as_str().is_some_and(|n| n.contains("Winograd")),
            winograd,
            "{name}"
        );
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
    // Its top layers share one intensity: in Chromium no label overlaps or is crossed, and
    // the hierarchical plot of it too.
    let hier = dir.join("h.svg");
    let o = bin()
        .arg("plot")
        .arg(quick_machine().0.as_path())
        .args(["--model", "hierarchical", "--placement"])
        .arg(dir.join("r.json"))
        .arg("-o")
        .arg(&hier)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(&hier)
        .unwrap()
        .contains("resnet50 at L1"));
    assert_figures_fit(&[&dir.join("r.svg"), &hier]);
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
        assert_figures_fit(&[&dir.join("all.svg"), &dir.join("g.svg")]);
        assert!(
            svg.contains(">ewa<") || svg.contains("ewa (") || svg.contains("ewa at L"),
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

/// `sweep` of a small model (32², width 0.125, depth 1,1,0,0, batch 8) over `images` at 1 and
/// 2 threads on the quick machine, with `extra` options, into `out`: its output and sweep.json.
fn small_sweep(
    images: &str,
    extra: &[&str],
    out: &Path,
) -> (std::process::Output, serde_json::Value) {
    let (machine, _) = quick_machine();
    let o = bin()
        .args(["sweep", "--machine"])
        .arg(machine)
        .args(["--images", images, "--resolution", "32", "--width", "0.125"])
        .args(["--depth", "1,1,0,0", "--threads", "1,2", "--batch", "8"])
        .args(extra)
        .arg("-o")
        .arg(out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let s = serde_json::from_str(&std::fs::read_to_string(out).unwrap()).unwrap();
    (o, s)
}

/// `sweep --epochs 1`: each point reads every one of its images (⌈images / batch⌉ steps, the
/// warm-up among them), its epoch time is its steps × its median step, and the data grown with
/// the threads (16 images a thread) is a weak-scaling series.
#[test]
fn sweep_epochs_read_every_image_and_scale_weakly() {
    let dir = tmpdir("sweep-epochs");
    let (o, s) = small_sweep("16,32", &["--epochs", "1"], &dir.join("s.json"));
    // Every image read: SAIH's data axis; what always differs from SAIH still named.
    let dev = s["deviations"].as_array().unwrap();
    assert!(
        dev.iter()
            .all(|d| !d.as_str().unwrap().contains("--epochs E")),
        "{dev:?}"
    );
    assert!(
        dev.iter()
            .any(|d| d.as_str().unwrap().contains("32 times ours")),
        "{dev:?}"
    );
    let pts = s["points"].as_array().unwrap();
    assert_eq!(pts.len(), 4, "notes: {}", s["notes"]);
    for p in pts {
        assert_eq!(p["epochs"], 1);
        let images = p["problem"]["images"].as_u64().unwrap();
        let steps = images.div_ceil(8);
        let placed: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.join("s-points").join(p["placement"].as_str().unwrap()))
                .unwrap(),
        )
        .unwrap();
        // The warm-up step and the measured ones cover the epoch.
        assert_eq!(
            placed["workload"]["measured_steps"].as_u64(),
            Some(steps - 1),
            "{p}"
        );
        let e = p["epoch_seconds"].as_f64().unwrap();
        assert!((e - steps as f64 * p["step_seconds"].as_f64().unwrap()).abs() < 1e-9 * e);
    }
    let weak = s["weak_scaling"].as_array().unwrap();
    assert_eq!(weak.len(), 1, "{weak:?}");
    assert!(weak[0]["problem"]
        .as_str()
        .unwrap()
        .starts_with("16 images per process"));
    let wp = weak[0]["points"].as_array().unwrap();
    let epoch = |threads: u64, images: u64| {
        pts.iter()
            .find(|p| p["problem"]["processes"] == threads && p["problem"]["images"] == images)
            .and_then(|p| p["epoch_seconds"].as_f64())
            .unwrap()
    };
    let eff = wp[1]["efficiency"].as_f64().unwrap();
    assert!((eff - epoch(1, 16) / epoch(2, 32)).abs() < 1e-12);
    assert!(String::from_utf8_lossy(&o.stdout).contains("weak scaling at 16 images per process"));
}

/// SAIH's node and data scaling: `--per-process-batch` holds each thread's batch (8 on 1, 16
/// on 2), the speedup then the epochs' ratio (⌈32 / 8⌉ steps against ⌈32 / 16⌉); and
/// `--data-shares 2,1` trains on half and all of 32 images, each share's FLOP/s per process
/// against the half's. SAIH's Table 3 is printed beside our units.
#[test]
fn sweep_runs_saih_node_and_data_scaling() {
    let dir = tmpdir("sweep-saih");
    let (o, s) = small_sweep(
        "32",
        &[
            "--per-process-batch",
            "--data-shares",
            "2,1",
            "--steps",
            "1",
        ],
        &dir.join("s.json"),
    );
    assert_eq!(s["per_process_batch"], true);
    let dev = s["deviations"].as_array().unwrap();
    assert!(
        dev.iter()
            .all(|d| !d.as_str().unwrap().contains("--per-process-batch runs")),
        "{dev:?}"
    );
    let pts = s["points"].as_array().unwrap();
    assert_eq!(pts.len(), 4, "notes: {}", s["notes"]);
    let at = |threads: u64, images: u64| {
        pts.iter()
            .find(|p| p["problem"]["processes"] == threads && p["problem"]["images"] == images)
            .unwrap()
    };
    for (threads, batch) in [(1, 8), (2, 16)] {
        assert_eq!(at(threads, 32)["problem"]["batch"], batch);
    }
    let step = |threads: u64| at(threads, 32)["step_seconds"].as_f64().unwrap();
    let full = s["scaling"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["problem"].as_str().unwrap().starts_with("32 images"))
        .unwrap();
    let speedup = full["points"][1]["speedup"].as_f64().unwrap();
    let want = 4.0 * step(1) / (2.0 * step(2));
    assert!((speedup - want).abs() < 1e-9 * want, "{speedup} vs {want}");
    let data = s["data_scaling"].as_array().unwrap();
    assert_eq!(data.len(), 2, "a series per thread count: {data:?}");
    for d in data {
        let p = d["points"].as_array().unwrap();
        let shares: Vec<f64> = p.iter().map(|x| x["share"].as_f64().unwrap()).collect();
        assert_eq!(shares, vec![0.5, 1.0]);
        let f = |i: usize| p[i]["per_process_flops"].as_f64().unwrap();
        assert_eq!(p[0]["relative"].as_f64(), Some(1.0));
        assert!((p[1]["relative"].as_f64().unwrap() - f(1) / f(0)).abs() < 1e-12);
    }
    let t3 = &s["intensity_units"]["saih_table_3"];
    assert!((t3[0]["saih_intensity"].as_f64().unwrap() / 808.0 - 1.0).abs() < 2e-3);
    assert!(pts[0]["analytic_flop_per_byte"].as_f64().unwrap() > 0.0);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("data scaling of 32×32"), "{out}");
    assert!(out.contains("SAIH's Table 3"), "{out}");
    // A share the set cannot give is refused before anything runs.
    let (machine, _) = quick_machine();
    let o = bin()
        .args(["sweep", "--machine"])
        .arg(machine)
        .args(["--images", "4", "--data-shares", "8", "-o"])
        .arg(dir.join("x.json"))
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("no 1/8 share"), "{}", stderr(&o));
}

/// `sweep`: two data sizes × two thread counts of a small model, and SAIH's model filter
/// choosing among variants; every point placed, the strong-scaling series computed from the
/// points' own step times, the charts written, bad input refused.
#[test]
fn sweep_places_a_grid_and_scales_it() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("sweep");
    let (o, s) = small_sweep("32,128", &["--steps", "2"], &dir.join("s.json"));
    assert_eq!(s["schema"], "roofline/sweep/v1");
    // Fixed steps whatever the images: the data axis is estimated, and the sweep says so.
    assert!(
        s["deviations"][0]
            .as_str()
            .unwrap()
            .contains("--epochs E reads every image"),
        "{s}"
    );
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(out.contains("departs from SAIH: each point trains"));
    assert!(
        out.contains(": 1 thread ×1.00 (100%), 2 threads ×") && !out.contains("1 threads"),
        "{out}"
    );
    let pts = s["points"].as_array().unwrap();
    assert_eq!(pts.len(), 4, "notes: {}", s["notes"]);
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
        // Fractions, both.
        let of_peak = p["fraction_of_peak"].as_f64().unwrap();
        assert!(of_peak > 0.0 && of_peak < 1.0, "{p}");
        let share = p["io_share"].as_f64().unwrap();
        assert!((0.0..1.0).contains(&share));
        assert!(dir
            .join("s-points")
            .join(p["placement"].as_str().unwrap())
            .exists());
    }
    let scaling = s["scaling"].as_array().unwrap();
    assert_eq!(scaling.len(), 2, "each data size at 1 and 2 threads");
    // And SAIH's data scaling: each thread count over the two data sizes.
    assert_eq!(s["data_scaling"].as_array().unwrap().len(), 2);
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
        assert_figures_fit(&[&dir.join(chart)]);
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

/// A machine file of other hardware (the same name, another family) is refused by `place`, in
/// one line saying what differs; `--allow-other-machine` places anyway with a warning; and
/// `plot` refuses that placement beside the file it was not placed on.
#[test]
fn place_and_plot_refuse_another_machine() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("other-machine");
    let mut m: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(machine).unwrap()).unwrap();
    let f = m["provenance"]["cpu"]["family"].as_u64().unwrap();
    m["provenance"]["cpu"]["family"] = serde_json::json!(f + 1);
    let other = dir.join("other.json");
    std::fs::write(&other, serde_json::to_string(&m).unwrap()).unwrap();
    let out = dir.join("p.json");
    expect_input_error(
        &[
            "place",
            "--workload",
            "stream:1048576",
            "--steps",
            "1",
            "-o",
            out.to_str().unwrap(),
            "--machine",
        ],
        Some(&other),
        "does not describe this machine: CPU family/model/stepping",
    );
    assert!(!out.exists());
    let o = bin()
        .args([
            "place",
            "--workload",
            "stream:1048576",
            "--steps",
            "1",
            "--warm",
            "0",
        ])
        .arg("--allow-other-machine")
        .arg("-o")
        .arg(&out)
        .arg("--machine")
        .arg(&other)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("warning:"), "{}", stderr(&o));
    // The placement ran here; drawn against the other machine's file it is refused.
    let svg = dir.join("r.svg");
    let plot = |machine: &std::path::Path| {
        bin()
            .arg("plot")
            .arg(machine)
            .arg("--placement")
            .arg(&out)
            .arg("-o")
            .arg(&svg)
            .output()
            .unwrap()
    };
    let o = plot(&other);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("was placed on another machine"),
        "{}",
        stderr(&o)
    );
    assert!(!svg.exists());
    // Beside this machine's own file it is drawn.
    let o = plot(machine.as_ref());
    assert!(o.status.success(), "{}", stderr(&o));
    // A bitmap name is refused, not written as SVG; --steps 0 is refused.
    expect_input_error(&["plot", "-o", "/tmp/roofline.png"], Some(machine), ".svg");
    expect_input_error(
        &[
            "place",
            "--workload",
            "stream:4096",
            "--steps",
            "0",
            "--machine",
        ],
        Some(machine),
        "--steps 0",
    );
    // The machine option given a placement: never a suggestion to overwrite it with a probe.
    let o = bin()
        .args(["place", "--workload", "stream:4096", "--machine"])
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(2));
    assert!(
        !stderr(&o).contains("probe -o") && stderr(&o).contains("machine.json"),
        "{}",
        stderr(&o)
    );
}

/// A full disk on stdout is exit 2 with one line, not a panic.
#[test]
fn a_full_stdout_is_one_line_and_exit_2() {
    if !std::path::Path::new("/dev/full").exists() {
        return;
    }
    let full = std::fs::OpenOptions::new()
        .write(true)
        .open("/dev/full")
        .unwrap();
    let o = bin().arg("peaks").stdout(full).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let err = stderr(&o);
    assert!(
        err.contains("cannot write to standard output")
            && err.lines().count() == 1
            && !err.contains("panicked"),
        "{err}"
    );
}
