//! The training loop's accelerator on one GPU (`crate::train::Accelerator`), and the NCCL
//! communicator of a data-parallel run.

use super::*;

/// What a GPU model is built from at the start of a run: the context and the communicator
/// (taken back from the previous model when a run begins again), the reducer and the exchange's
/// options.
pub(super) struct Parts {
    ctx: Option<Ctx>,
    nccl: Option<Communicator>,
    pub(super) reducer: Option<Arc<dyn Reducer>>,
    pub(super) comm: CommOptions,
}

impl Parts {
    /// The context and communicator for a new model: the ones given at the start, or `old`'s.
    fn take(
        &mut self,
        old: Option<(Ctx, Option<GradSync>)>,
    ) -> Result<(Ctx, Option<Communicator>), CudaError> {
        let ctx = match (self.ctx.take(), old) {
            (Some(c), _) => c,
            (None, Some((ctx, sync))) => {
                self.nccl = sync.map(|g| g.nccl);
                ctx
            }
            (None, None) => return Err(CudaError::Check("the GPU context is gone".into())),
        };
        Ok((ctx, self.nccl.take()))
    }
}

/// The CUDA path as the trainer's [`crate::train::Accelerator`]: the model moves to the GPU at
/// the start of the run (after a resume) and back for checkpoints and the summary.
pub struct CudaTrainer {
    parts: Parts,
    pub net: Option<GpuResNet>,
}

impl CudaTrainer {
    /// Trains on `ctx`'s GPU; `nccl` sums the gradients over its ranks as `comm` says and
    /// `reducer` (the same ranks, over MPI) the batch-norm statistics.
    pub fn new(
        ctx: Ctx,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> CudaTrainer {
        CudaTrainer {
            parts: Parts {
                ctx: Some(ctx),
                nccl,
                reducer,
                comm,
            },
            net: None,
        }
    }

    pub(super) fn net(&mut self) -> Result<&mut GpuResNet, CudaError> {
        self.net
            .as_mut()
            .ok_or_else(|| CudaError::Check("the GPU model was not loaded".into()))
    }
}

/// An NCCL communicator over the ranks of `reducer` on GPU `ordinal`: rank 0 makes the unique
/// id and every rank receives it through the reducer.
pub fn communicator(reducer: &dyn Reducer, ordinal: usize) -> Result<Communicator, CudaError> {
    let mut id = [0u8; 128];
    if reducer.rank() == 0 {
        id = roofline_kernels::comm::nccl::unique_id()?;
    }
    reducer.broadcast(&mut id);
    Communicator::new(&id, reducer.ranks(), reducer.rank(), ordinal)
}

impl crate::train::Accelerator<f32> for CudaTrainer {
    fn begin(&mut self, model: &mut ResNet<f32>) -> Result<(), CudaError> {
        let (ctx, nccl) = self.parts.take(self.net.take().map(|n| (n.ctx, n.sync)))?;
        let p = &self.parts;
        let net = GpuResNet::new(ctx, model, nccl, p.reducer.clone(), p.comm)?;
        self.net = Some(net);
        Ok(())
    }

    fn step(
        &mut self,
        x: &Tensor<f32>,
        labels: &[usize],
        lr: f64,
        smoothing: f64,
        sgd: &crate::train::Sgd,
    ) -> Result<(f64, f64), CudaError> {
        let r = self.net()?.step(x, labels, lr, smoothing, sgd)?;
        Ok((r.loss, r.comm_bytes))
    }

    fn logits(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, CudaError> {
        self.net()?.logits(x)
    }

    fn store(&mut self, model: &mut ResNet<f32>) -> Result<(), CudaError> {
        self.net()?.store(model)
    }
}

/// The CUDA path as the EWA trainer's [`crate::ewa::DetectorDevice`]: the detector moves to
/// the GPU at the start of the run (after a resume) and back for checkpoints and the summary.
pub struct CudaDetectorTrainer {
    parts: Parts,
    pub net: Option<GpuDetector>,
}

impl CudaDetectorTrainer {
    /// Trains on `ctx`'s GPU; `nccl` sums the gradients over its ranks as `comm` says and
    /// `reducer` (the same ranks, over MPI) the batch-norm statistics.
    pub fn new(
        ctx: Ctx,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> CudaDetectorTrainer {
        CudaDetectorTrainer {
            parts: Parts {
                ctx: Some(ctx),
                nccl,
                reducer,
                comm,
            },
            net: None,
        }
    }

    fn net(&mut self) -> Result<&mut GpuDetector, CudaError> {
        self.net
            .as_mut()
            .ok_or_else(|| CudaError::Check("the GPU detector was not loaded".into()))
    }
}

impl crate::ewa::DetectorDevice<f32> for CudaDetectorTrainer {
    fn begin(&mut self, model: &mut crate::detect::model::Detector<f32>) -> Result<(), CudaError> {
        let (ctx, nccl) = self.parts.take(self.net.take().map(|n| (n.ctx, n.sync)))?;
        let p = &self.parts;
        let net = GpuDetector::new(ctx, model, nccl, p.reducer.clone(), p.comm)?;
        self.net = Some(net);
        Ok(())
    }

    fn step(
        &mut self,
        x: &Tensor<f32>,
        truth: &[crate::detect::model::Target],
        seed: u64,
        lr: f64,
        sgd: &crate::train::Sgd,
    ) -> Result<(crate::detect::model::Losses, f64), CudaError> {
        let r = self.net()?.step(x, truth, seed, lr, sgd, None)?;
        Ok((r.losses, r.comm_bytes))
    }

    fn detect(
        &mut self,
        x: &Tensor<f32>,
    ) -> Result<Vec<Vec<crate::detect::map::Detection>>, CudaError> {
        self.net()?.detect(x)
    }

    fn store(&mut self, model: &mut crate::detect::model::Detector<f32>) -> Result<(), CudaError> {
        self.net()?.store(model)
    }
}
