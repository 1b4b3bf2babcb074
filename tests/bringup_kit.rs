//! The GPU bring-up kit (`scripts/gpu-bringup.sh`) on this CPU: its plan fits a lease, and its
//! dry run (the same steps, `--device cpu` where a step has one, PyTorch's side from
//! `tests/fixtures/bringup`, the budget on the estimate clock) leaves at most four files, a
//! summary valid against `docs/gpu/summary.schema.json` rewritten as every step starts and
//! ends, with every field a reader of `docs/gpu/*.json` needs; a failing step stops nothing,
//! and a call killed mid-step keeps its summary.

mod common;

use common::{shared, tmpdir};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The kit's script with the test's binary.
fn kit(args: &[&str]) -> Command {
    let mut c = Command::new("bash");
    c.arg(root().join("scripts/gpu-bringup.sh"))
        .args(args)
        .env("ROOFLINE", env!("CARGO_BIN_EXE_roofline"))
        .env_remove("ROOFLINE_BRINGUP_FAIL")
        .env_remove("ROOFLINE_BRINGUP_HANG")
        .env_remove("ROOFLINE_BRINGUP_FROM")
        .env_remove("ROOFLINE_BRINGUP_BUDGET")
        .env_remove("ROOFLINE_BRINGUP_CLOCK")
        .env_remove("ROOFLINE_BRINGUP_WORK");
    c
}

fn text(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr)
}

fn read(path: &Path) -> Value {
    let t = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&t).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// `kit_summary.py --validate`: the summary against the schema in docs/gpu.
fn assert_valid(summary: &Path) {
    let o = Command::new("python3")
        .arg(root().join("scripts/kit_summary.py"))
        .arg("--validate")
        .arg(summary)
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", text(&o));
}

/// The call's output folder holds the four files and nothing else.
fn assert_four_files(out: &Path) {
    let mut names: Vec<String> = std::fs::read_dir(out)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    assert_eq!(
        names,
        [
            "bundle.tar.gz",
            "log-tail.txt",
            "summary.json",
            "summary.txt"
        ],
        "{}",
        out.display()
    );
    let bundle = std::fs::metadata(out.join("bundle.tar.gz")).unwrap().len();
    assert!(bundle < 16 << 20, "bundle {bundle} bytes");
}

fn step<'a>(summary: &'a Value, name: &str) -> &'a Value {
    summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap_or_else(|| panic!("no step {name}: {summary:#}"))
}

/// The steps that started (ran, or were stopped while running): each wrote the summary as it
/// started and as it ended.
fn started(summary: &Value) -> usize {
    summary["steps"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["seconds"].is_number() || s["status"] == "running")
        .count()
}

#[test]
fn the_plan_puts_call_one_within_its_budget_and_names_every_estimate() {
    let o = kit(&["plan", "1"]).output().unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    // "  11 steps, estimated 420 s of the 435 s the steps may take"
    let line = t.lines().find(|l| l.contains("estimated")).expect(&t);
    let nums: Vec<u64> = line
        .split_whitespace()
        .filter_map(|w| w.parse().ok())
        .collect();
    let (est, room) = (nums[1], nums[2]);
    assert!(est <= room && room + 45 <= 480, "{line}");
    for want in [
        "probe-check",
        "train-check-f32",
        "train-check-bf16",
        "peers-resnet50-b128",
    ] {
        assert!(t.contains(want), "{want}: {t}");
    }
    for p in ["bf16", "f16", "tf32", "f32"] {
        assert!(t.contains(&format!("resnet50-{p}-b128")), "{t}");
    }
    // Every step says where its estimate comes from.
    let rows: Vec<&str> = t
        .lines()
        .filter(|l| {
            l.starts_with("  ") && !l.contains("estimated") && !l.contains("limit  estimate")
        })
        .collect();
    assert_eq!(rows.len(), 11, "{t}");
    for l in rows {
        assert!(
            l.contains("estimate:") || l.contains("measured:") || l.contains("run ("),
            "{l}"
        );
    }
    // A smaller budget does not fit: plan says so and fails.
    let o = kit(&["plan", "1"])
        .env("ROOFLINE_BRINGUP_BUDGET", "300")
        .output()
        .unwrap();
    assert!(
        !o.status.success() && text(&o).contains("OVER"),
        "{}",
        text(&o)
    );
}

#[test]
fn a_dry_run_of_both_calls_keeps_every_figure_and_survives_a_failing_step() {
    let _g = shared();
    let d = tmpdir("bringup-dry");
    let (one, two) = (d.join("call1"), d.join("call2"));
    // Call 1, with one step made to fail.
    let o = kit(&["run", one.to_str().unwrap(), "1", "--dry-run"])
        .env("ROOFLINE_BRINGUP_FAIL", "resnet50-f16-b128")
        .output()
        .unwrap();
    let t = text(&o);
    assert_eq!(o.status.code(), Some(1), "one failed step: {t}");
    assert_four_files(&one);
    let s1 = one.join("summary.json");
    assert_valid(&s1);
    let s = read(&s1);
    assert_eq!(step(&s, "resnet50-f16-b128")["status"], "fail");
    assert!(step(&s, "resnet50-f16-b128")["why"]
        .as_str()
        .unwrap()
        .contains("on purpose"));
    // The steps after it ran.
    for name in [
        "resnet50-tf32-b128",
        "resnet50-f32-b128",
        "peers-resnet50-b128",
    ] {
        assert_eq!(step(&s, name)["status"], "pass", "{name}: {s:#}");
    }
    assert_eq!(step(&s, "probe-check")["status"], "skipped");
    // Rewritten as every step started and ended, and once at the end.
    assert_eq!(
        s["kit"]["writes"].as_u64().unwrap() as usize,
        2 * started(&s) + 1,
        "{:#}",
        s["kit"]
    );
    assert!(s["kit"]["spent_s"].as_f64().unwrap() <= 480.0 - 45.0);
    // ResNet-50 beside the fixture's PyTorch figures: precision, batch, ratio.
    let r50 = s["resnet50"].as_array().unwrap();
    let bf16 = r50
        .iter()
        .find(|r| r["precision"] == "bf16" && r["batch"] == 128)
        .expect("bf16 b128");
    assert!(bf16["ratio"].as_f64().unwrap() > 0.0, "{bf16:#}");
    assert_eq!(bf16["steady_kind"], "eager");
    assert!(r50.iter().all(|r| r["precision"] != "f16"), "f16 failed");
    let ceilings = s["ceilings"].as_array().unwrap();
    assert!(ceilings
        .iter()
        .any(|c| c["id"] == "cpu/fma/f32/all" && c["of_peak"].as_f64().unwrap() > 0.3));
    let txt = std::fs::read_to_string(one.join("summary.txt")).unwrap();
    assert!(txt.contains("ResNet-50 train bf16 b128"), "{txt}");

    // Call 2 from call 1's bundle: its machine file joins the summary.
    let o = kit(&["run", two.to_str().unwrap(), "2", "--dry-run"])
        .env("ROOFLINE_BRINGUP_FROM", &one)
        .output()
        .unwrap();
    let t = text(&o);
    assert!(o.status.success(), "{t}");
    assert_four_files(&two);
    let s2 = two.join("summary.json");
    assert_valid(&s2);
    let s = read(&s2);
    let ids: Vec<&str> = s["ceilings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(ids.contains(&"cpu/gemm/f32/all"), "call 1's GEMM: {ids:?}");
    assert!(ids.contains(&"cpu/conv/f32/all"), "call 2's conv: {ids:?}");
    let ewa = s["ewa"].as_array().unwrap();
    for anchors in [9, 3] {
        let row = ewa
            .iter()
            .find(|r| r["anchors_per_cell"] == anchors && r["precision"] == "bf16")
            .unwrap_or_else(|| panic!("ewa bf16 at {anchors} anchors: {ewa:?}"));
        assert_eq!(row["batch"], 2);
        assert!(row["ratio"].as_f64().unwrap() > 0.0, "{row:#}");
    }
    let conv = s["conv"].as_array().unwrap();
    assert!(!conv.is_empty() && conv.iter().all(|c| c["ratio"].as_f64().is_some()));
    let automl = s["automl"].as_array().unwrap();
    assert_eq!(automl.len(), 1);
    assert_eq!(automl[0]["device"], "cpu");
    assert!(automl[0]["candidates_per_minute"].as_f64().unwrap() > 0.0);
    assert!(automl[0]["flops"].as_f64().unwrap() > 0.0);
    assert!(s["resnet50"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["batch"] == 256 && r["ratio"].as_f64().is_some()));

    // peers.py --summary alone, on the fixtures and call 1's bundle.
    let x = d.join("x");
    std::fs::create_dir_all(&x).unwrap();
    let o = Command::new("tar")
        .arg("xzf")
        .arg(one.join("bundle.tar.gz"))
        .arg("-C")
        .arg(&x)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let mut lines = String::new();
    for e in std::fs::read_dir(x.join("train")).unwrap() {
        let v = read(&e.unwrap().path());
        lines += &format!("{v}\n");
    }
    std::fs::write(x.join("train.jsonl"), lines).unwrap();
    let o = Command::new("python3")
        .arg(root().join("scripts/peers.py"))
        .arg("--summary")
        .arg("--machine")
        .arg(x.join("machine.json"))
        .arg("--train")
        .arg(x.join("train.jsonl"))
        .arg("--peers")
        .arg(root().join("tests/fixtures/bringup/peers.json"))
        .arg("--json")
        .arg(x.join("s.json"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    let s = read(&x.join("s.json"));
    // The CPU's trainings ran f32 at batch 4; the fixture has no figure for them.
    let r = &s["resnet50"].as_array().unwrap()[0];
    assert_eq!(
        (r["precision"].as_str(), r["batch"].as_u64()),
        (Some("f32"), Some(4))
    );
    assert!(r["images_per_second"].as_f64().unwrap() > 0.0);
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn a_call_killed_mid_step_keeps_its_summary() {
    let _g = shared();
    let d = tmpdir("bringup-killed");
    let out = d.join("out");
    // Its own process group, so that the kill takes the kit and the step it runs.
    let mut child = {
        use std::os::unix::process::CommandExt;
        kit(&["run", out.to_str().unwrap(), "1", "--dry-run"])
            .env("ROOFLINE_BRINGUP_HANG", "resnet50-tf32-b128")
            .env("ROOFLINE_BRINGUP_WORK", d.join("work"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()
            .unwrap()
    };
    let summary = out.join("summary.json");
    let t0 = Instant::now();
    loop {
        let running = std::fs::read_to_string(&summary)
            .ok()
            .and_then(|t| serde_json::from_str::<Value>(&t).ok())
            .is_some_and(|s| {
                s["steps"].as_array().is_some_and(|v| {
                    v.iter()
                        .any(|x| x["name"] == "resnet50-tf32-b128" && x["status"] == "running")
                })
            });
        if running {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(120),
            "the hanging step never showed as running"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // As the device's time limit would: SIGKILL to the whole group, mid-step.
    // SAFETY: a plain kill(2) of the child's own process group.
    unsafe { libc::kill(-(child.id() as i32), libc::SIGKILL) };
    let _ = child.wait();
    assert_four_files(&out);
    assert_valid(&summary);
    let s = read(&summary);
    assert_eq!(step(&s, "resnet50-tf32-b128")["status"], "running");
    assert_eq!(step(&s, "probe-quick")["status"], "pass");
    assert_eq!(s["kit"]["counts"]["running"], 1);
    // What finished is there: the quick probe's ceilings, the trainings before the kill.
    assert!(!s["ceilings"].as_array().unwrap().is_empty());
    assert!(s["resnet50"]
        .as_array()
        .unwrap()
        .iter()
        .any(|r| r["precision"] == "f16" && r["images_per_second"].as_f64().is_some()));
    let tail = std::fs::read_to_string(out.join("log-tail.txt")).unwrap();
    assert!(tail.contains("== resnet50-tf32-b128"), "{tail}");
    let _ = std::fs::remove_dir_all(&d);
}
