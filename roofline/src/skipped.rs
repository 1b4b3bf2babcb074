//! For the tests: a check skipped for want of a tool (Chromium, NVRTC, nvdisasm, a CUDA
//! library, MPI) says so on stderr and in the file `ROOFLINE_SKIPPED` names, where the test
//! command (`scripts/test.sh`) reads it back to end with what was skipped and how to install it.

use std::io::Write;

/// The environment variable naming the file of skipped checks.
pub const ENV: &str = "ROOFLINE_SKIPPED";

/// Records that `what` was skipped because `why` (one line each).
pub fn skipped(what: &str, why: &str) {
    let line = format!("{what}: {why}");
    eprintln!("skipped {line}");
    if let Some(path) = std::env::var_os(ENV) {
        if let Ok(mut f) = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
        {
            let _ = writeln!(f, "{}", line.replace('\n', " "));
        }
    }
}
