//! What the CUDA gates share: a CUDA tool found beside the NVRTC they load.

use std::path::PathBuf;

/// The CUDA tool `name` (ptxas, nvdisasm): `env`'s path if set, then beside the NVRTC loaded —
/// its root's `bin` (a CUDA 13 wheel's `cu13/bin`, a toolkit's `bin`), then each of `wheels`
/// under the `nvidia` folder of a wheel tree (`cuda_nvcc/bin`: CUDA 12's ptxas) — then
/// `CUDA_HOME/bin` and `/usr/local/cuda/bin`.
pub fn tool_beside_nvrtc(name: &str, env: Option<&str>, wheels: &[&str]) -> Option<PathBuf> {
    use roofline_kernels::cuda::libs::{self, Lib};
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(p) = env.and_then(std::env::var_os) {
        candidates.push(PathBuf::from(p));
    }
    if let Some(nvrtc) = libs::in_use(Lib::Nvrtc) {
        if let Some(root) = std::path::Path::new(&nvrtc)
            .parent()
            .and_then(|d| d.parent())
        {
            candidates.push(root.join("bin").join(name));
            if let Some(nvidia) = root.parent() {
                for w in wheels {
                    candidates.push(nvidia.join(w).join(name));
                }
            }
        }
    }
    if let Some(home) = std::env::var_os("CUDA_HOME") {
        candidates.push(PathBuf::from(home).join("bin").join(name));
    }
    candidates.push(PathBuf::from("/usr/local/cuda/bin").join(name));
    candidates.into_iter().find(|p| p.is_file())
}
