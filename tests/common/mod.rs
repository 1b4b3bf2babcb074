//! What the end-to-end tests of the `roofline` binary share: running it, temporary folders,
//! one quick probe for every test binary, headless Chromium, and the bad-input check.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The tests of one binary run side by side, and on a VM whose two vCPUs are one core's two
/// hardware threads a neighbour halves what a one-thread probe measures (seen on an Intel Xeon:
/// the core's clock measured at 1.87 GHz against 3.63 alone). A test that compares two probes
/// of its own (the gate's) runs `alone()`; every other test of its binary holds `shared()`.
static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

/// A small, quick AutoML search, after `automl --budget B`: 32² synthetic images of 4 classes,
/// rounds of 1 and 2 epochs (the AutoML tests, alone and under mpirun).
pub const SMALL_AUTOML: [&str; 10] = [
    "--rounds",
    "1,2",
    "--classes",
    "4",
    "--train-images",
    "64",
    "--eval-images",
    "32",
    "--batch",
    "16",
];

pub fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

pub fn alone() -> std::sync::RwLockWriteGuard<'static, ()> {
    MACHINE.write().unwrap_or_else(|e| e.into_inner())
}

pub fn bin() -> Command {
    Command::new(env!("CARGO_BIN_EXE_roofline"))
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roofline-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

pub fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// One quick probe shared by the tests that need a machine.json, across the test binaries
/// too: kept in the temporary folder under the binary's size and time, so that the first test
/// binary to need it probes and the others read it.
pub fn quick_machine() -> &'static (PathBuf, String) {
    static M: OnceLock<(PathBuf, String)> = OnceLock::new();
    M.get_or_init(|| {
        let exe = std::fs::metadata(env!("CARGO_BIN_EXE_roofline")).unwrap();
        let stamp = exe
            .modified()
            .ok()
            .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
            .map_or(0, |d| d.as_nanos());
        let dir = std::env::temp_dir().join(format!("roofline-cli-machine-{}-{stamp}", exe.len()));
        let (out, text) = (dir.join("machine.json"), dir.join("stdout.txt"));
        // A probe of this binary with its output and its log.
        let complete = || out.exists() && dir.join("stderr.txt").exists();
        if let (true, Ok(t)) = (complete(), std::fs::read_to_string(&text)) {
            return (out, t);
        }
        let tmp = tmpdir("quick");
        let o = bin()
            .args(["probe", "--quick", "-o"])
            .arg(tmp.join("machine.json"))
            .output()
            .unwrap();
        assert!(o.status.success(), "probe failed: {}", stderr(&o));
        let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
        std::fs::write(tmp.join("stdout.txt"), &stdout).unwrap();
        // Its progress, as a log shows it (stderr is not a terminal here).
        std::fs::write(tmp.join("stderr.txt"), &o.stderr).unwrap();
        // Into place in one step (another binary may have got there first: then use its).
        if std::fs::rename(&tmp, &dir).is_err() && !complete() {
            return (tmp.join("machine.json"), stdout);
        }
        (out, stdout)
    })
}

/// Headless Chromium (Debian's chromium package; .ci/run installs it), or None after saying
/// that `what` is skipped; under CI=true its absence fails the test.
pub fn chromium(what: &str) -> Option<&'static str> {
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
        roofline_model::skipped::skipped(what, "no chromium");
    }
    found
}

/// Runs the binary and expects exit code 2 and one line on stderr naming `needle`.
pub fn expect_input_error(args: &[&str], extra: Option<&Path>, needle: &str) {
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

/// The figure check (`roofline_plots::check`) run on `file` (an SVG, or an HTML page holding
/// figures) in headless Chromium, as the browser lays it out; None (after saying so) when no
/// Chromium is here. Asserts that the script ran.
pub fn figure_check(file: &Path) -> Option<roofline_plots::check::Found> {
    let chrome = chromium("the figure check")?;
    let doc = std::fs::read_to_string(file).unwrap();
    let page = file.with_extension("check.html");
    std::fs::write(&page, roofline_plots::check::page(&doc)).unwrap();
    let o = Command::new(chrome)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&o.stdout);
    let found = roofline_plots::check::Found::from_dom(&dom)
        .unwrap_or_else(|| panic!("the figure check did not run on {}", file.display()));
    assert!(found.texts > 0, "{}: no text at all", file.display());
    Some(found)
}

/// Asserts that every figure of `files` is fit for a report: every roof's label read as its
/// own, and every leader followed to its label: no two crossing, none across more than one
/// band of roofs (`roofline_plots::order`, from the SVG, without a browser); no text
/// overlapping another, none crossed by a line that is not its own, none smaller than the
/// minimum font.
pub fn assert_figures_fit(files: &[&Path]) {
    for f in files {
        let doc = std::fs::read_to_string(f).unwrap();
        let misread = roofline_plots::order::misread(&doc);
        assert!(misread.is_empty(), "{}: {misread:#?}", f.display());
        let tangled = roofline_plots::order::tangled(&doc);
        assert!(tangled.is_empty(), "{}: {tangled:#?}", f.display());
        if let Some(found) = figure_check(f) {
            assert!(found.clean(), "{}: {found:?}", f.display());
        }
    }
}

/// Writes `--init`'s test files into `dir` (`scripts/make-init-files.py`: tv.safetensors,
/// keras.h5, keras1.h5, one small ResNet's weights) with a Python that has h5py, safetensors
/// and numpy: `.venv-init` (scripts/install-test-tools.sh makes it), else python3 if it has
/// them. Without one, false: `test` is listed as skipped, or fails under CI=true.
pub fn init_files(dir: &Path, test: &str) -> bool {
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join(".venv-init/bin/python");
    let py = [venv, PathBuf::from("python3")].into_iter().find(|py| {
        Command::new(py)
            .args(["-c", "import h5py, safetensors, numpy"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let Some(py) = py else {
        let why = "no Python with h5py, safetensors and numpy (scripts/install-test-tools.sh makes .venv-init)";
        if std::env::var("CI").is_ok_and(|v| v == "true") {
            panic!("{why}");
        }
        roofline_model::skipped::skipped(&format!("--init's files ({test})"), why);
        return false;
    };
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/make-init-files.py");
    let o = Command::new(&py).arg(&script).arg(dir).output().unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    true
}
