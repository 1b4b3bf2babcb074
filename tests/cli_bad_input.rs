//! The bad-input sweep: every bad value of every verb's numeric and path options is answered
//! with exit 2 and one line on stderr, before any work starts, and nothing aborts (sizes that
//! cannot fit in memory are refused against the machine's memory, not allocated).

mod common;

use common::*;

/// Each verb's bad values and a word of the line that must answer them.
#[test]
fn every_bad_value_is_one_line_and_exit_2() {
    let _machine = shared();
    let (machine, _) = quick_machine();
    let m = machine.to_str().unwrap();
    let tiny = [
        "--resolution",
        "32",
        "--width",
        "0.125",
        "--depth",
        "1,1,0,0",
    ];
    let cases: Vec<(Vec<&str>, &str)> = vec![
        // probe
        (vec!["probe", "--runs", "0"], "--runs"),
        (vec!["probe", "--threads", "0"], "--threads 0"),
        (vec!["probe", "--threads", "999"], "--threads 999"),
        (
            vec!["probe", "--fleet-margin", "-10"],
            "from 0 to below 100",
        ),
        (vec!["probe", "--fleet-margin", "x"], "percentage"),
        (vec!["probe", "--max-size", "0"], "--max-size"),
        (vec!["probe", "--comm-timeout", "x"], "seconds"),
        (vec!["probe", "--only", "bogus"], "bogus"),
        (vec!["probe", "-o", "/nonexistent/m.json"], "-o"),
        (vec!["probe", "--io", "/nonexistent/dir"], "--io"),
        // train: numbers out of range, sizes past memory, paths
        (vec!["train", "--batch", "x"], "--batch"),
        (vec!["train", "--batch", "0"], "--batch 0"),
        (vec!["train", "--batch", "-1"], "--batch"),
        (
            vec!["train", "--batch", "1000000000", "--steps", "1"],
            "of memory",
        ),
        (vec!["train", "--train-images", "100000000000"], "of memory"),
        (vec!["train", "--resolution", "1000000"], "of memory"),
        (vec!["train", "--steps", "0"], "--steps"),
        (vec!["train", "--width", "-1"], "--width -1"),
        (vec!["train", "--label-smoothing", "2"], "below 1"),
        (vec!["train", "--label-smoothing", "-0.5"], "below 1"),
        (vec!["train", "--lr", "0"], "above 0"),
        (vec!["train", "--lr", "-0.1"], "above 0"),
        (vec!["train", "--eval-every", "0"], "--eval-every"),
        (vec!["train", "--bucket-elements", "0"], "--bucket-elements"),
        (
            vec!["train", "--target-top1", "2", "--eval-images", "8"],
            "--target-top1",
        ),
        (vec!["train", "--threads", "999"], "--threads 999"),
        (vec!["train", "--resume", "/nonexistent.st"], "--resume"),
        (
            vec!["train", "--checkpoint", "/nonexistent/c.st"],
            "--checkpoint",
        ),
        (vec!["train", "--trace", "/nonexistent/t.json"], "--trace"),
        (vec!["train", "--init", "/nonexistent.h5"], "--init"),
        (vec!["train", "--data", "/nonexistent"], "--data"),
        (
            vec!["train", "--workload", "ewa", "--label-smoothing", "0.1"],
            "resnet50",
        ),
        // place
        (
            vec!["place", "--machine", "/nonexistent.json"],
            "/nonexistent.json",
        ),
        (
            vec![
                "place",
                "--machine",
                m,
                "--workload",
                "gemm:99999999x99999999x99999999",
            ],
            "of memory",
        ),
        (
            vec![
                "place",
                "--machine",
                m,
                "--workload",
                "stream:99999999999999",
            ],
            "of memory",
        ),
        (
            vec![
                "place",
                "--machine",
                m,
                "--workload",
                "resnet50",
                "--batch",
                "100000000",
            ],
            "of memory",
        ),
        (
            vec!["place", "--machine", m, "--workload", "gemm:0x1x1"],
            "positive",
        ),
        (
            vec!["place", "--machine", m, "--workload", "stream:1"],
            "1536",
        ),
        (vec!["place", "--machine", m, "--steps", "0"], "--steps 0"),
        (
            vec!["place", "--machine", m, "-o", "/nonexistent/p.json"],
            "-o",
        ),
        // score
        (vec!["score", "--runs", "0"], "--runs 0"),
        (vec!["score", "--bagging", "0"], "--bagging 0"),
        (vec!["score", "-o", "/nonexistent/s.json"], "-o"),
        (vec!["score", "--report", "/nonexistent/s.html"], "--report"),
        (
            vec![
                "score",
                "--resume",
                "-o",
                "/tmp/roofline-no-such-score.json",
            ],
            "no runs were kept",
        ),
        // sweep
        (
            vec!["sweep", "--machine", "/nonexistent.json"],
            "/nonexistent.json",
        ),
        (
            vec!["sweep", "--machine", m, "--threads", "9"],
            "--threads 9",
        ),
        (vec!["sweep", "--machine", m, "--epochs", "0"], "--epochs"),
        // automl
        (vec!["automl", "--budget", "x"], "--budget"),
        (vec!["automl", "--workers", "0"], "--workers"),
        (
            vec!["automl", "-o", "/nonexistent/a.json"],
            "choose another path with -o",
        ),
        // plot, gate
        (vec!["plot", "/nonexistent.json"], "/nonexistent.json"),
        (vec!["gate", "--current", "x"], "--baseline"),
        (
            vec!["gate", "--baseline", "/nonexistent.json", "--current", m],
            "/nonexistent.json",
        ),
        // unknown verbs and flags
        (vec!["bogus"], "bogus"),
        (vec!["train", "--bogus"], "--bogus"),
    ];
    for (args, needle) in cases {
        let mut a = args.clone();
        // A small model where the case names none (a mistake must be refused before the
        // work, whatever its size).
        for pair in tiny.chunks(2) {
            if a[0] == "train" && !a.contains(&pair[0]) {
                a.extend(pair);
            }
        }
        if a[0] == "place" && !a.contains(&"--workload") {
            a.extend(["--workload", "resnet50"]);
        }
        expect_input_error(&a, None, needle);
    }
}

/// Help and the version go to standard output, checked as every output is: a full disk is
/// exit 2 and one line, not a silent 0.
#[test]
fn help_to_a_full_disk_is_an_error() {
    let full = std::path::Path::new("/dev/full");
    if !full.exists() {
        return;
    }
    for args in [vec!["--help"], vec!["train", "--help"], vec!["--version"]] {
        let o = bin()
            .args(&args)
            .stdout(std::fs::OpenOptions::new().write(true).open(full).unwrap())
            .output()
            .unwrap();
        assert_eq!(o.status.code(), Some(2), "{args:?}");
        assert!(
            stderr(&o).contains("cannot write to standard output"),
            "{args:?}: {}",
            stderr(&o)
        );
    }
}
