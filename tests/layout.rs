//! The house rules that hold the layout (docs/architecture.md): the verbs in `src/` parse, call
//! one library function and print — they never import one another; the crates' arrows point one
//! way; no source file grows past the size a reader takes in.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The verbs of `src/` (`<verb>_cmd.rs`).
fn verbs() -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(root().join("src"))
        .unwrap()
        .flatten()
        .filter_map(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.strip_suffix("_cmd.rs").map(|s| format!("{s}_cmd"))
        })
        .collect();
    v.sort();
    v
}

#[test]
fn verbs_never_import_one_another() {
    let verbs = verbs();
    assert!(verbs.len() >= 8, "{verbs:?}");
    let mut found = Vec::new();
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    for f in files {
        let name = f.file_stem().unwrap().to_string_lossy().into_owned();
        if name == "main" {
            // The dispatcher names every verb.
            continue;
        }
        let text = std::fs::read_to_string(&f).unwrap();
        for v in &verbs {
            if *v == name {
                continue;
            }
            for pat in [
                format!("crate::{v}"),
                format!("super::{v}"),
                format!("use {v}"),
            ] {
                if text.contains(&pat) {
                    found.push(format!("{} uses {pat}", f.display()));
                }
            }
        }
    }
    assert!(
        found.is_empty(),
        "a verb imports another:\n{}",
        found.join("\n")
    );
}

/// `src/` keeps argument parsing, output and exit codes: no module of it is a workflow (MPI
/// teams, the score loop, the probe's choreography live in the libraries), and no verb is
/// longer than ~300 lines.
#[test]
fn the_command_line_stays_thin() {
    let mut files = Vec::new();
    rust_files(&root().join("src"), &mut files);
    for f in &files {
        let text = std::fs::read_to_string(f).unwrap();
        let lines = text.lines().count();
        let name = f.file_name().unwrap().to_string_lossy();
        if name.ends_with("_cmd.rs") {
            assert!(
                lines <= 330,
                "{}: {lines} lines (a verb parses, calls, prints)",
                f.display()
            );
        }
        for workflow in ["World::init", "form_teams", "comm_probe(", "thread::scope"] {
            assert!(
                !text.contains(workflow),
                "{} runs a workflow ({workflow}): it belongs in a library crate",
                f.display()
            );
        }
    }
}

/// The crates' dependencies point one way: the model imports no other crate of ours, plots
/// only the model, collectors only the model, kernels the model and collectors, the tensor
/// engine (workloads/nn) only the kernels, workloads not plots, AutoML (workloads/automl) on
/// top of workloads; no library imports the command line.
#[test]
fn crate_arrows_point_one_way() {
    let ours = [
        "roofline-model",
        "roofline-kernels",
        "roofline-collectors",
        "roofline-nn",
        "roofline-workloads",
        "roofline-automl",
        "roofline-plots",
        "roofline-cli",
    ];
    let allowed: &[(&str, &[&str])] = &[
        ("roofline", &[]),
        ("plots", &["roofline-model"]),
        ("collectors", &["roofline-model"]),
        ("kernels", &["roofline-model", "roofline-collectors"]),
        ("workloads/nn", &["roofline-kernels"]),
        (
            "workloads",
            &[
                "roofline-model",
                "roofline-kernels",
                "roofline-collectors",
                "roofline-nn",
            ],
        ),
        (
            "workloads/automl",
            &[
                "roofline-model",
                "roofline-kernels",
                "roofline-collectors",
                "roofline-workloads",
            ],
        ),
    ];
    for (dir, ok) in allowed {
        let toml = std::fs::read_to_string(root().join(dir).join("Cargo.toml")).unwrap();
        let deps = toml
            .split("[dependencies]")
            .nth(1)
            .unwrap_or("")
            .split("\n[")
            .next()
            .unwrap_or("");
        for line in deps.lines() {
            let name = line.split(['=', '.', ' ']).next().unwrap_or("").trim();
            if ours.contains(&name) {
                assert!(ok.contains(&name), "{dir}/ depends on {name}");
            }
        }
    }
}

/// Every library crate says its job at the top of its `lib.rs`.
#[test]
fn every_crate_says_its_job_first() {
    for dir in [
        "roofline",
        "kernels",
        "collectors",
        "workloads/nn",
        "workloads",
        "workloads/automl",
        "plots",
    ] {
        let lib = std::fs::read_to_string(root().join(dir).join("src/lib.rs")).unwrap();
        assert!(
            lib.starts_with("//! "),
            "{dir}/src/lib.rs does not open with its job"
        );
    }
}

/// No source file past ~800 lines (the three measured exceptions are listed at their size;
/// they are to shrink).
#[test]
fn no_file_grows_past_what_a_reader_takes_in() {
    let mut files = Vec::new();
    for d in [
        "src",
        "roofline",
        "kernels",
        "collectors",
        "workloads",
        "plots",
        "benches",
        "tests",
    ] {
        rust_files(&root().join(d), &mut files);
    }
    let known = [("fma.rs", 810), ("probe.rs", 812), ("driver.rs", 803)];
    for f in files {
        if f.components().any(|c| c.as_os_str() == "target") {
            continue;
        }
        let lines = std::fs::read_to_string(&f).unwrap().lines().count();
        let name = f.file_name().unwrap().to_string_lossy().into_owned();
        let limit = known
            .iter()
            .find(|(n, _)| *n == name)
            .map_or(800, |(_, l)| *l);
        assert!(
            lines <= limit,
            "{}: {lines} lines (over {limit})",
            f.display()
        );
    }
}
