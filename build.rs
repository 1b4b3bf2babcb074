//! Records the git revision the binary was built from (empty outside a git checkout).
fn main() {
    let rev = std::process::Command::new("git")
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let dirty = std::process::Command::new("git")
        .args(["status", "--porcelain", "--untracked-files=no"])
        .output()
        .ok()
        .filter(|o| o.status.success() && !o.stdout.is_empty())
        .map(|_| "-dirty")
        .unwrap_or("");
    let rev = if rev.is_empty() {
        rev
    } else {
        format!("{rev}{dirty}")
    };
    println!("cargo:rustc-env=ROOFLINE_GIT_REVISION={rev}");

    // Versions of the compiler and of the libraries that do measured work, for provenance.
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());
    let rustc_version = std::process::Command::new(rustc)
        .arg("--version")
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    println!("cargo:rustc-env=ROOFLINE_RUSTC_VERSION={rustc_version}");
    let lock = std::fs::read_to_string("Cargo.lock").unwrap_or_default();
    let mut libs = Vec::new();
    for name in ["gemm", "plotters", "cudarc", "nvml-wrapper"] {
        let needle = format!("name = \"{name}\"\nversion = \"");
        if let Some(i) = lock.find(&needle) {
            let rest = &lock[i + needle.len()..];
            if let Some(end) = rest.find('"') {
                libs.push(format!("{name} {}", &rest[..end]));
            }
        }
    }
    println!("cargo:rustc-env=ROOFLINE_LIBRARIES={}", libs.join(", "));
    println!("cargo:rerun-if-changed=Cargo.lock");
    println!("cargo:rerun-if-changed=.git/HEAD");
    println!("cargo:rerun-if-changed=.git/index");
}
