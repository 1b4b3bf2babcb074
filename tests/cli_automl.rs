//! End-to-end tests of `roofline automl`: a short search, its report, gate and place on its
//! result, Ctrl-C and --resume, and bad input as one line and exit 2.

mod common;

use common::*;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A small, quick search: 32² synthetic images of 4 classes, rounds of 1 and 2 epochs.
fn small(cmd: &mut Command, out: &std::path::Path, budget: &str) {
    cmd.args(["automl", "--budget", budget])
        .args(SMALL_AUTOML)
        .arg("-o")
        .arg(out);
}

/// A search writes automl.json (valid by its schema, candidates made from trained parents and,
/// with --from-parent, from their weights, the series) and the report (its figures fit); gate
/// compares it with itself and passes; place puts its best candidate on the machine's roofline
/// from its trained weights.
#[test]
fn automl_searches_reports_gates_and_places() {
    let dir = tmpdir("automl");
    let out = dir.join("run.json");
    let mut cmd = bin();
    small(&mut cmd, &out, "12s");
    let o = cmd.arg("--from-parent").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.starts_with("AIPerf AutoML: "), "{text}");
    assert!(
        text.contains("NOT VALID") && text.contains("3600 s"),
        "{text}"
    );
    assert!(text.contains("candidates a minute"), "{text}");
    let doc = roofline_model::automl::Automl::read(&out).unwrap();
    assert!(!doc.running);
    assert!(doc.candidates.len() >= 3, "{}", stderr(&o));
    assert!(
        doc.candidates.iter().any(|c| c.parent.is_some()),
        "children were made"
    );
    assert!(!doc.series.is_empty() && doc.score.flops > 0.0);
    assert_eq!(doc.configuration["resolution"], 32);
    // The parent's weights, named as neither AIPerf's default nor its reference's start; the
    // short run's sampling and its own image count named where they differ from score.py's.
    assert_eq!(doc.configuration["weights"], "parent");
    assert!(
        doc.deviations[0].contains("--from-parent"),
        "{:?}",
        doc.deviations
    );
    for d in ["score.py samples every hour", "fixed 1,280,000"] {
        assert!(
            doc.deviations.iter().any(|x| x.contains(d)),
            "{d}: {:?}",
            doc.deviations
        );
    }
    let html = dir.join("run.html");
    let page = std::fs::read_to_string(&html).unwrap();
    for id in [
        "id=\"over-time\"",
        "id=\"tree\"",
        "id=\"series\"",
        "id=\"score\"",
    ] {
        assert!(page.contains(id), "{id} not in the report");
    }
    assert_figures_fit(&[&html]);
    let g = bin()
        .args(["gate", "--baseline"])
        .arg(&out)
        .arg("--current")
        .arg(&out)
        .output()
        .unwrap();
    assert_eq!(
        g.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&g.stdout)
    );
    let table = String::from_utf8_lossy(&g.stdout);
    assert!(
        table.contains("automl/flops") && table.contains("automl/regulated"),
        "{table}"
    );
    let (machine, _) = quick_machine();
    let best = doc.score.best_candidate.expect("a best candidate");
    let placed = dir.join("best.json");
    let p = bin()
        .args(["place", "--workload"])
        .arg(format!("automl:{}", out.display()))
        .arg("--machine")
        .arg(machine)
        .args(["--steps", "2", "--warm", "1", "-o"])
        .arg(&placed)
        .output()
        .unwrap();
    assert!(p.status.success(), "{}", stderr(&p));
    let pl: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&placed).unwrap()).unwrap();
    assert_eq!(pl["workload"]["name"], format!("automl#{best}"));
    // From its trained weights on the run's data: the first loss is far below chance (ln 4).
    let first = stderr(&p)
        .lines()
        .find_map(|l| {
            l.split("loss ")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|v| v.parse::<f64>().ok())
        })
        .expect("a step line");
    assert!(
        first < 0.8 * 4f64.ln(),
        "first loss {first}: {}",
        stderr(&p)
    );
    // Weights that are not the candidate's: one line, exit 2, no panic.
    let other = doc
        .candidates
        .iter()
        .find(|c| {
            c.id != best
                && c.parameters
                    != doc
                        .candidates
                        .iter()
                        .find(|x| x.id == best)
                        .unwrap()
                        .parameters
        })
        .unwrap()
        .id;
    let w = dir.join("run.weights");
    std::fs::copy(
        w.join(format!("{other}.safetensors")),
        w.join(format!("{best}.safetensors")),
    )
    .unwrap();
    let workload = format!("automl:{}#{best}", out.display());
    expect_input_error(
        &[
            "place",
            "--workload",
            &workload,
            "--machine",
            machine.to_str().unwrap(),
            "-o",
            placed.to_str().unwrap(),
        ],
        None,
        "not candidate",
    );
}

/// Ctrl-C keeps what was found (exit 130, automl.json valid, the report written) and
/// --resume goes on from it with the same candidates and a later clock.
#[test]
fn automl_interrupted_keeps_its_candidates_and_resumes() {
    let dir = tmpdir("automl-int");
    let out = dir.join("run.json");
    let mut cmd = bin();
    small(&mut cmd, &out, "60s");
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let t0 = Instant::now();
    // Until an epoch has been written.
    loop {
        let has_epoch = std::fs::read_to_string(&out)
            .ok()
            .and_then(|t| roofline_model::automl::Automl::from_json(&t).ok())
            .is_some_and(|d| d.candidates.iter().filter(|c| !c.epochs.is_empty()).count() >= 2);
        if has_epoch || t0.elapsed() > Duration::from_secs(50) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // SAFETY: sending a signal to our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let o = child.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(130), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("kept") && stderr(&o).contains("--resume"),
        "{}",
        stderr(&o)
    );
    let before = roofline_model::automl::Automl::read(&out).unwrap();
    assert!(!before.running);
    // AIPerf's default start (Table IV), named as such.
    assert_eq!(before.configuration["weights"], "he");
    assert!(
        before.deviations[0].contains("He initialisation"),
        "{:?}",
        before.deviations
    );
    assert!(dir.join("run.html").is_file());
    let trained: Vec<usize> = before
        .candidates
        .iter()
        .filter(|c| !c.epochs.is_empty())
        .map(|c| c.id)
        .collect();
    assert!(trained.len() >= 2);
    // Its candidates started from He's initialisation: going on from parents is refused.
    let mut cmd = bin();
    small(&mut cmd, &out, "60s");
    let o = cmd.args(["--resume", "--from-parent"]).output().unwrap();
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("started with He's"), "{}", stderr(&o));
    let mut cmd = bin();
    small(
        &mut cmd,
        &out,
        &format!("{:.0}s", before.score.elapsed_s + 6.0),
    );
    let o = cmd.arg("--resume").output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let after = roofline_model::automl::Automl::read(&out).unwrap();
    for id in trained {
        assert!(
            after.candidates.iter().any(|c| c.id == id),
            "candidate {id} kept"
        );
    }
    assert!(after.candidates.len() > before.candidates.len());
    assert!(after.score.elapsed_s > before.score.elapsed_s);
}

/// `--init FILE` starts every candidate from the pretrained file as AIPerf's reference does
/// (here the reference's own naming, keras_applications' res2a_branch2a in Keras 1's layout):
/// the start takes all its layers from the file, a child all those it still has from
/// ResNet-50 with their shapes and none of its own new ones; the run records the file and the
/// deviation that remains; going on without the file, or a file that does not fit the starting
/// network, is one line, exit 2.
#[test]
fn automl_starts_every_candidate_from_the_pretrained_file() {
    let dir = tmpdir("automl-init");
    if !init_files(
        &dir,
        "automl_starts_every_candidate_from_the_pretrained_file",
    ) {
        return;
    }
    let out = dir.join("run.json");
    let mut cmd = bin();
    small(&mut cmd, &out, "12s");
    let o = cmd
        .arg("--init")
        .arg(dir.join("keras1.h5"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = roofline_model::automl::Automl::read(&out).unwrap();
    assert_eq!(doc.configuration["init"]["layout"], "Keras HDF5");
    assert!(doc.candidates.len() >= 3, "{}", stderr(&o));
    assert!(
        doc.deviations[0].contains("by name and shape"),
        "{:?}",
        doc.deviations
    );
    for c in &doc.candidates {
        let f = c
            .pretrained
            .unwrap_or_else(|| panic!("candidate {}: no pretrained", c.id));
        let net: roofline_workloads::graph::Description =
            serde_json::from_value(c.description.clone()).unwrap();
        let unnamed = net
            .nodes
            .iter()
            .filter(|n| n.name.is_none() && roofline_workloads::graph::prefix(n.op).is_some())
            .count();
        // Widened anywhere in its lineage (a child of a widened network keeps the wider
        // layer's shape).
        let mut widened = 0;
        let mut at = Some(c);
        while let Some(x) = at {
            widened += x.morphisms.iter().filter(|m| m["kind"] == "wider").count();
            at = x
                .parent
                .and_then(|p| doc.candidates.iter().find(|y| y.id == p));
        }
        if widened == 0 {
            assert_eq!(f.layers, f.of - unnamed, "candidate {}: {f:?}", c.id);
        } else {
            assert!(f.layers < f.of - unnamed, "candidate {}: {f:?}", c.id);
        }
        if c.parent.is_none() && c.morphisms.is_empty() {
            assert_eq!((f.layers, unnamed), (f.of, 0), "the start is ResNet's");
        }
    }
    assert!(
        doc.candidates.iter().any(|c| !c.morphisms.is_empty()),
        "children were made"
    );
    // Its candidates came from the file: going on without it is refused.
    expect_input_error(
        &[
            "automl",
            "--classes",
            "4",
            "--resume",
            "-o",
            out.to_str().unwrap(),
        ],
        None,
        "started with --init",
    );
    let five = dir.join("five.json");
    let tv = dir.join("tv.safetensors");
    expect_input_error(
        &[
            "automl",
            "--classes",
            "5",
            "-o",
            five.to_str().unwrap(),
            "--init",
            tv.to_str().unwrap(),
        ],
        None,
        "fc.bias is [4] in the file, [5] in the model",
    );
    assert!(!five.exists());
}

/// Bad input: one line, exit 2, nothing run.
#[test]
fn automl_bad_input_is_one_line() {
    let dir = tmpdir("automl-bad");
    let empty = dir.join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    let out = dir.join("x.json");
    let o = out.to_str().unwrap();
    expect_input_error(
        &["automl", "--data", "/nonexistent/imagenet", "-o", o],
        None,
        "--data",
    );
    expect_input_error(
        &["automl", "--data", empty.to_str().unwrap(), "-o", o],
        None,
        "--data",
    );
    expect_input_error(
        &["automl", "--official", "-o", o],
        None,
        "--official runs on ImageNet",
    );
    expect_input_error(
        &[
            "automl",
            "--budget",
            "1s",
            "--resolution",
            "64",
            "--width",
            "0.5",
            "--train-images",
            "4096",
            "-o",
            o,
        ],
        None,
        "shorter than one trial",
    );
    expect_input_error(&["automl", "--rounds", "1,0", "-o", o], None, "--rounds");
    // clap's own message for a value it cannot parse (its usual three lines), exit 2.
    let c = bin()
        .args(["automl", "--budget", "soon", "-o", o])
        .output()
        .unwrap();
    assert_eq!(c.status.code(), Some(2));
    assert!(stderr(&c).contains("expected seconds or a number with s, m or h"));
    expect_input_error(&["automl", "--resume", "-o", o], None, "does not exist");
    expect_input_error(
        &["automl", "--workers", "64", "-o", o],
        None,
        "--workers 64",
    );
    // No GPU here: the GPU workers say so (exit 2) and never panic; the CPU trains in f32.
    expect_input_error(
        &["automl", "--device", "cuda", "-o", o],
        None,
        "no NVIDIA driver",
    );
    expect_input_error(
        &["automl", "--device", "cuda", "--workers", "1", "-o", o],
        None,
        "no NVIDIA driver",
    );
    expect_input_error(
        &["automl", "--precision", "f16", "-o", o],
        None,
        "automl trains on the CPU in f32",
    );
    expect_input_error(&["automl", "--team", "2", "-o", o], None, "--team 2");
    assert!(!out.exists());
}

/// On a JPEG folder (DIR/train, DIR/val): the candidates train on its images and classes, and
/// the run records the folder so that `place` finds it again.
#[test]
fn automl_searches_an_image_folder() {
    let dir = tmpdir("automl-folder");
    let data = dir.join("images");
    roofline_workloads::folder::write_test_folder(&data.join("train"), 3, 8, 40).unwrap();
    roofline_workloads::folder::write_test_folder(&data.join("val"), 3, 4, 40).unwrap();
    let out = dir.join("run.json");
    let o = bin()
        .args(["automl", "--data"])
        .arg(&data)
        .args([
            "--budget",
            "10s",
            "--rounds",
            "1",
            "--train-images",
            "24",
            "--eval-images",
            "12",
            "--batch",
            "8",
            "-o",
        ])
        .arg(&out)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let doc = roofline_model::automl::Automl::read(&out).unwrap();
    assert!(
        doc.candidates
            .iter()
            .filter(|c| !c.epochs.is_empty())
            .count()
            >= 2,
        "{}",
        stderr(&o)
    );
    assert_eq!(doc.configuration["classes"], 3, "the folder's classes");
    assert_eq!(doc.configuration["data_path"], data.display().to_string());
    for c in &doc.candidates {
        let last = &c.description["nodes"].as_array().unwrap().last().unwrap()["op"];
        assert_eq!(last["outputs"], 3);
    }
}
