//! `train --device cuda --check`, run: the precision checked against the trainer's, the GPU
//! opened, then each of the device trainer's self-tests (`gpu::self_test`,
//! `gpu::described_checks`, `gpu::detector_self_test`) as a stage of its own.

use super::RunError;
use crate::gpu::Check;
use roofline_kernels::cuda::blas::Prec;
use roofline_kernels::cuda::device::Gpu;
use roofline_kernels::cuda::CudaError;

/// `train --device cuda --check`: GPU `gpu` (the launcher's local rank's by default) opened
/// and shown to `opened`, its layers and a small ResNet's step against the CPU's in `p`, the
/// described networks (AutoML's candidates: `check_described.rs`) against the CPU graph, and
/// with `detector` the detector's parts and step. Every stage runs, each on a context of its
/// own: a stage that ends in a hard error gives one failed row with the error
/// ([`Check::hard`]) and the next stage runs on a fresh context, so that one error hides no
/// other stage's rows. Only an interruption, a precision the trainer lacks or a GPU that
/// cannot be opened at all ends the check.
pub fn check_all(
    gpu: Option<usize>,
    p: Prec,
    detector: bool,
    opened: impl FnOnce(&Gpu),
) -> Result<Vec<Check>, RunError> {
    let p = super::prepare::trainer_precision(p)?;
    let (gpu, ordinal) = super::open_gpu(gpu)?;
    opened(&gpu);
    let mut checks = Vec::new();
    let mut stage = |name: &str, r: Result<Vec<Check>, CudaError>| match r {
        Ok(rows) => {
            checks.extend(rows);
            Ok(())
        }
        Err(CudaError::Interrupted) => Err(RunError::Interrupted),
        Err(e) => {
            checks.push(Check::hard(name, &e));
            Ok(())
        }
    };
    stage(
        "GPU self-test (layers and a whole step)",
        crate::gpu::self_test(gpu, p),
    )?;
    // Described networks (AutoML's candidates), on contexts of their own (one a precision).
    stage(
        "GPU described-network self-test",
        crate::gpu::described_checks(ordinal, p),
    )?;
    if detector {
        stage(
            "GPU detector self-test",
            Gpu::open(ordinal).and_then(|gpu| crate::gpu::detector_self_test(gpu, p)),
        )?;
    }
    Ok(checks)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trainer refuses the probe's other precisions before it looks for a GPU.
    #[test]
    fn a_precision_the_trainer_lacks_is_refused_before_any_gpu() {
        let e = check_all(None, Prec::Fp8, false, |_| {}).unwrap_err();
        assert!(
            e.is_input() && e.to_string().contains("f32, tf32, f16 or bf16"),
            "{e}"
        );
    }
}
