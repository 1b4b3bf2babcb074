//! Every file's provenance, built in one place: what built the binary (set once at start-up by
//! the binary, [`set_build`]), where and when it runs (this host), the CPU it runs on.

use roofline_model::{CpuInfo, Provenance};
use std::sync::OnceLock;
use std::time::Instant;

/// What built the binary: its name and version, the git revision, the compiler, the libraries
/// that do measured work.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Build {
    pub tool: String,
    pub git_revision: Option<String>,
    pub compiler: String,
    pub libraries: Vec<String>,
}

static BUILD: OnceLock<Build> = OnceLock::new();

/// Records what built the binary (the first call wins; the binary makes it before any work).
pub fn set_build(build: Build) {
    let _ = BUILD.set(build);
}

/// What built the binary, as recorded (a library caller that set nothing: this crate's name and
/// version, nothing else known).
pub fn build() -> Build {
    BUILD.get().cloned().unwrap_or_else(|| Build {
        tool: format!("roofline {}", env!("CARGO_PKG_VERSION")),
        ..Build::default()
    })
}

/// The provenance of a run on this host that started at `start`, on `cpu`: the build, the
/// command line, the time, the host, its OS and kernel. Devices, notes and the load check are
/// the caller's to add.
pub fn here(cpu: CpuInfo, quick: bool, start: Instant) -> Provenance {
    let b = build();
    Provenance {
        tool: b.tool,
        git_revision: b.git_revision,
        command_line: std::env::args().collect(),
        compiler: b.compiler,
        libraries: b.libraries,
        time_utc: crate::now_utc(),
        host: crate::hostname(),
        os: crate::os_name(),
        kernel: crate::kernel_release(),
        cpu,
        devices: Vec::new(),
        gpus: Vec::new(),
        notes: Vec::new(),
        cluster: None,
        quick,
        duration_s: start.elapsed().as_secs_f64(),
        load: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The build recorded once is the build of every provenance; the run's own facts come from
    /// the host.
    #[test]
    fn the_build_is_recorded_once_and_used_everywhere() {
        set_build(Build {
            tool: "roofline 9.9.9".into(),
            git_revision: Some("abc".into()),
            compiler: "rustc x".into(),
            libraries: vec!["gemm 1".into()],
        });
        set_build(Build::default());
        let cpu: CpuInfo = serde_json::from_value(serde_json::json!({
            "vendor": "v", "model_name": "m", "family": 1, "model": 2, "stepping": 3,
            "sockets": 1, "cores": 2, "logical_cpus": 2, "features": [], "simd": "avx2",
            "caches": []
        }))
        .unwrap();
        let p = here(cpu, true, Instant::now());
        assert_eq!(p.tool, "roofline 9.9.9");
        assert_eq!(p.git_revision.as_deref(), Some("abc"));
        assert_eq!(p.libraries, ["gemm 1"]);
        assert!(p.quick);
        assert_eq!(p.host, crate::hostname());
        assert!(p.duration_s >= 0.0);
    }
}
