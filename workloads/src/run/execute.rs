//! Runs a prepared training on the CPU's pinned pool or on this rank's GPU.

use super::prepare::{Device, Job, Prepared};
use super::RunError;
use crate::gpu::{Ctx, CudaTrainer, GpuDetector, GpuGraph, GpuModel, GpuResNet, GraphMode};
use crate::layers::Reducer;
use crate::train::{self, Monitor, Summary};
use roofline_kernels::cuda::blas::Prec;
use roofline_kernels::cuda::device::{self, Gpu};
use std::sync::Arc;

pub use roofline_kernels::comm::local_rank;

/// The GPU this rank trains on (`gpu`, else the launcher's local rank modulo the GPU count),
/// opened; no driver or no such GPU is an input error that says what was looked for.
pub fn open_gpu(gpu: Option<usize>) -> Result<(Gpu, usize), RunError> {
    let count = device::init().map_err(RunError::NoGpu)?;
    let ordinal = gpu.unwrap_or(local_rank() % count);
    if ordinal >= count {
        return Err(RunError::Input(format!(
            "--gpu {ordinal}: this machine has {count} GPU(s)"
        )));
    }
    let gpu = Gpu::open(ordinal)
        .map_err(|e| RunError::Run(format!("--device cuda: GPU {ordinal}: {e}")))?;
    Ok((gpu, ordinal))
}

/// The energy of a span of this rank's work: the CPU packages' counters, and with `cuda` the
/// NVML sampler (power, energy counter) of the GPU this rank trains on (`gpu` as `open_gpu`
/// chooses it).
pub fn energy_span(cuda: bool, gpu: Option<usize>) -> roofline_collectors::energy::Span {
    roofline_collectors::energy::Span::start(cuda.then(|| gpu_sampler(gpu)))
}

/// A monitor that starts the energy span ([`energy_span`]) when the run's `warm`-th step ends
/// (its first when `warm` is 0; a resumed run counts from where it resumed) and passes every
/// step on to `inner`; [`EnergyAfter::stop`] reads it over the steps after `warm`.
pub(super) struct EnergyAfter<'a> {
    warm: usize,
    seen: std::sync::atomic::AtomicUsize,
    cuda: bool,
    gpu: Option<usize>,
    inner: &'a (dyn Fn(usize, usize, f64, f64) + Sync),
    span: std::sync::Mutex<Option<roofline_collectors::energy::Span>>,
}

impl<'a> EnergyAfter<'a> {
    pub(super) fn new(
        warm: usize,
        (cuda, gpu): (bool, Option<usize>),
        inner: &'a (dyn Fn(usize, usize, f64, f64) + Sync),
    ) -> EnergyAfter<'a> {
        EnergyAfter {
            warm,
            seen: Default::default(),
            cuda,
            gpu,
            inner,
            span: std::sync::Mutex::new(None),
        }
    }

    /// The energy over the steps after `warm` (their seconds from `timing`), and what the
    /// GPU's sampler had to say.
    pub(super) fn stop(
        self,
        timing: &[train::StepTiming],
    ) -> (
        Result<roofline_collectors::energy::Reading, roofline_collectors::energy::EnergyError>,
        Option<String>,
    ) {
        let seconds = timing.iter().skip(self.warm).map(|t| t.seconds).sum();
        match self.span.into_inner().unwrap_or_else(|e| e.into_inner()) {
            Some(span) => span.stop(seconds),
            None => (
                Err(roofline_collectors::energy::EnergyError::NotStarted),
                None,
            ),
        }
    }
}

impl Monitor for EnergyAfter<'_> {
    fn step(&self, step: usize, steps: usize, loss: f64, images_per_second: f64) {
        let seen = self.seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        if seen == self.warm.max(1) {
            *self.span.lock().unwrap_or_else(|e| e.into_inner()) =
                Some(energy_span(self.cuda, self.gpu));
        }
        (self.inner)(step, steps, loss, images_per_second);
    }
}

fn gpu_sampler(
    gpu: Option<usize>,
) -> Result<roofline_collectors::nvml::Sampler, roofline_collectors::nvml::NvmlError> {
    let nvml = roofline_kernels::probe::node::open_nvml()?;
    let (gpu, _) =
        open_gpu(gpu).map_err(|e| roofline_collectors::nvml::NvmlError::NoGpu(e.to_string()))?;
    let uuid = roofline_kernels::probe::gpu::roofline_uuid(&gpu.uuid);
    Ok(roofline_collectors::nvml::Sampler::start(
        nvml,
        vec![uuid],
        std::time::Duration::from_millis(100),
    ))
}

/// Runs `p` on the CPU or (`--device cuda`) this rank's GPU, its gradients summed over
/// `reducer`'s ranks; returns the summary and the GPU's name.
pub fn execute(
    p: &Prepared,
    monitor: &(dyn Monitor + Sync),
    reducer: Option<Arc<dyn Reducer>>,
) -> Result<(Summary, Option<String>), RunError> {
    if p.spec.device != Device::Cuda {
        let s = match &p.job {
            Job::Detector(cfg) => p
                .pool
                .install(|| train::train::<f32, _>(cfg, monitor, reducer)),
            Job::Classifier(cfg) => p
                .pool
                .install(|| train::train::<f32, _>(cfg, monitor, reducer)),
            Job::Graph { task, .. } => p
                .pool
                .install(|| train::train::<f32, _>(task, monitor, reducer)),
        }?;
        return Ok((s, None));
    }
    let on = GpuRun {
        gpu: p.spec.gpu,
        precision: p.spec.precision,
        graph: p.spec.cuda_graph,
        keep: false,
    };
    let (s, name) = match &p.job {
        Job::Detector(cfg) => on.train::<GpuDetector, _>(cfg, monitor, reducer)?,
        Job::Classifier(cfg) => on.train::<GpuResNet, _>(cfg, monitor, reducer)?,
        Job::Graph { task, .. } => on.train::<GpuGraph, _>(task, monitor, reducer)?,
    };
    Ok((s, Some(name)))
}

/// Where and how a training runs on a GPU: the GPU (`open_gpu`'s choice when None), the
/// convolutions' precision, the CUDA-graph mode, and whether the thread keeps its context for
/// its next training on the same GPU and precision (AutoML's workers, which train an epoch at
/// a time: NVRTC's compilation, the library handles and the measured convolution algorithms
/// are then made once a worker, not once an epoch).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct GpuRun {
    pub gpu: Option<usize>,
    pub precision: Prec,
    pub graph: GraphMode,
    pub keep: bool,
}

thread_local! {
    /// The context this thread's last training with `keep` left: its GPU, precision, context.
    static KEPT: std::cell::RefCell<Option<(usize, Prec, Ctx)>> = const { std::cell::RefCell::new(None) };
}

impl GpuRun {
    /// Trains `task` with `N`, its model's GPU copy, on this rank's GPU (this thread drives
    /// it: the GPU's handles are not Send; data loads on their own threads), the gradients
    /// summed over `reducer`'s ranks by NCCL; the summary and the GPU's name.
    pub fn train<N, W>(
        &self,
        task: &W,
        monitor: &(dyn Monitor + Sync),
        reducer: Option<Arc<dyn Reducer>>,
    ) -> Result<(Summary, String), RunError>
    where
        N: GpuModel,
        W: train::Task<f32, Model = N::Cpu>,
    {
        let ctx = self.context()?;
        let ordinal = ctx.gpu.ordinal;
        let name = ctx.gpu.name.clone();
        let nccl = match &reducer {
            Some(r) if r.ranks() > 1 => Some(
                crate::gpu::communicator(r.as_ref(), ordinal)
                    .map_err(|e| RunError::Run(format!("--device cuda: NCCL: {e}")))?,
            ),
            _ => None,
        };
        let mut dev = CudaTrainer::<N>::new(ctx, nccl, reducer, task.options().comm);
        let s = train::run(task, monitor, &mut dev);
        // Kept after a run that went well only: a CUDA error may have left the context unusable.
        if self.keep && s.is_ok() {
            if let Some(ctx) = dev.into_ctx() {
                KEPT.with(|k| *k.borrow_mut() = Some((ordinal, self.precision, ctx)));
            }
        }
        Ok((s?, name))
    }

    /// The context to train on: the one this thread kept for this GPU and precision, or a new
    /// one.
    fn context(&self) -> Result<Ctx, RunError> {
        if self.keep {
            let kept = KEPT.with(|k| k.borrow_mut().take());
            if let Some((ordinal, prec, ctx)) = kept {
                let same_gpu = self.gpu.is_none_or(|g| g == ordinal);
                if same_gpu && prec == self.precision {
                    let mut ctx = ctx;
                    ctx.release_free_buffers();
                    ctx.graph = self.graph;
                    return Ok(ctx);
                }
            }
        }
        let (gpu, _) = open_gpu(self.gpu)?;
        let mut ctx = Ctx::new(gpu, self.precision).map_err(RunError::Gpu)?;
        ctx.graph = self.graph;
        Ok(ctx)
    }
}
