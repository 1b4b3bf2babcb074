//! What the tests under `mpirun` share: running it, temporary folders, and one lock on the
//! machine (a test that measures speed takes it alone; the others hold it shared).
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The tests of a file run at once, except one that measures the fleet: it compares the
/// nodes' speed and takes the machine alone (the others hold it shared).
pub static MACHINE: std::sync::RwLock<()> = std::sync::RwLock::new(());

pub fn shared() -> std::sync::RwLockReadGuard<'static, ()> {
    MACHINE.read().unwrap_or_else(|e| e.into_inner())
}

pub fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("roofline-mpi-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// `mpirun -np <n> [mpi args] roofline <args>`.
pub fn mpirun(n: usize, mpi_args: &[&str], args: &[&str], out: Option<&Path>) -> Output {
    let mut c = Command::new("mpirun");
    c.args([
        "--allow-run-as-root",
        "--oversubscribe",
        "-np",
        &n.to_string(),
    ]);
    c.args(mpi_args);
    c.arg(env!("CARGO_BIN_EXE_roofline"));
    c.args(args);
    if let Some(p) = out {
        c.arg("-o").arg(p);
    }
    c.output().expect("mpirun runs (Open MPI's openmpi-bin)")
}

pub fn text(o: &Output) -> String {
    format!(
        "status {:?}\nstdout:\n{}\nstderr:\n{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}
