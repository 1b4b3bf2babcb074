//! The training loop's device on one GPU ([`CudaTrainer`], a [`roofline_models::train::Device`] for any
//! network with a GPU copy: [`GpuModel`]), and the NCCL communicator of a data-parallel run.

use super::*;
use roofline_kernels::cuda::stage::Stager;
use roofline_models::detect::map::Detection;
use roofline_models::detect::model::{Detector, Losses, Target};
use roofline_models::train::{Device, Model, Stage, Stepped};

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

/// A network's copy on the GPU, as the loop's CUDA device drives it: built from the CPU model
/// (its parameters, momenta and running statistics), stepped, asked for inference, written
/// back. ResNet-50 ([`GpuResNet`]) and the detector ([`GpuDetector`]) are two.
pub trait GpuModel: Sized {
    /// The CPU model it mirrors.
    type Cpu: Model<f32>;
    /// Builds the GPU copy of `model` on `ctx`; `nccl` sums the gradients over its ranks as
    /// `comm` says and `reducer` (the same ranks, over MPI) the batch-norm statistics.
    fn build(
        ctx: Ctx,
        model: &mut Self::Cpu,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<Self, CudaError>;
    /// The context and the gradient sync, taken back to build the next copy.
    fn into_parts(self) -> (Ctx, Option<GradSync>);
    /// One step on this rank's share of the batch: its losses, the bytes it put into gradient
    /// allreduces, and the host's waits for the GPU during it.
    #[allow(clippy::too_many_arguments)]
    fn step(
        &mut self,
        x: &Tensor<f32>,
        truth: &<Self::Cpu as Model<f32>>::Truth,
        seed: u64,
        lr: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<Stepped<<Self::Cpu as Model<f32>>::Loss>, CudaError>;
    /// Inference on a batch.
    fn infer(&mut self, x: &Tensor<f32>) -> Result<<Self::Cpu as Model<f32>>::Output, CudaError>;
    /// Writes parameters, momenta and running statistics back into `model`.
    fn store(&mut self, model: &mut Self::Cpu) -> Result<(), CudaError>;
    /// Where batches are staged ahead of their step (None: each step uploads its own).
    fn stager(&self) -> Option<Arc<Stager>> {
        None
    }
    /// What the run did with CUDA graphs (None: this model's step is never captured).
    fn cuda_graph(&self) -> Option<GraphReport> {
        None
    }
    /// The context the model trains on.
    fn ctx(&self) -> &Ctx;
}

impl GpuModel for GpuResNet {
    type Cpu = ResNet<f32>;
    fn build(
        ctx: Ctx,
        model: &mut ResNet<f32>,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<Self, CudaError> {
        GpuResNet::new(ctx, model, nccl, reducer, comm)
    }
    fn into_parts(self) -> (Ctx, Option<GradSync>) {
        (self.ctx, self.sync)
    }
    fn step(
        &mut self,
        x: &Tensor<f32>,
        truth: &roofline_models::train::Labels,
        _seed: u64,
        lr: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<Stepped<f64>, CudaError> {
        Ok(GpuResNet::step(self, x, &truth.classes, lr, truth.smoothing, sgd)?.stepped())
    }
    fn infer(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, CudaError> {
        self.logits(x)
    }
    fn store(&mut self, model: &mut ResNet<f32>) -> Result<(), CudaError> {
        GpuResNet::store(self, model)
    }
    fn stager(&self) -> Option<Arc<Stager>> {
        Some(Arc::clone(&self.stager))
    }
    fn cuda_graph(&self) -> Option<GraphReport> {
        Some(GpuResNet::cuda_graph(self))
    }
    fn ctx(&self) -> &Ctx {
        &self.ctx
    }
}

impl GpuModel for GpuDetector {
    type Cpu = Detector<f32>;
    fn build(
        ctx: Ctx,
        model: &mut Detector<f32>,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<Self, CudaError> {
        GpuDetector::new(ctx, model, nccl, reducer, comm)
    }
    fn into_parts(self) -> (Ctx, Option<GradSync>) {
        (self.ctx, self.sync)
    }
    fn step(
        &mut self,
        x: &Tensor<f32>,
        truth: &Vec<Target>,
        seed: u64,
        lr: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<Stepped<Losses>, CudaError> {
        let r = GpuDetector::step(self, x, truth, seed, lr, sgd, None)?;
        Ok(Stepped {
            loss: r.losses,
            comm_bytes: r.comm_bytes,
            comm_wait_s: 0.0,
            host_syncs: r.host_syncs,
            device_allocations: r.device_allocations,
        })
    }
    fn infer(&mut self, x: &Tensor<f32>) -> Result<Vec<Vec<Detection>>, CudaError> {
        self.detect(x)
    }
    fn store(&mut self, model: &mut Detector<f32>) -> Result<(), CudaError> {
        GpuDetector::store(self, model)
    }
    fn stager(&self) -> Option<Arc<Stager>> {
        Some(Arc::clone(&self.stager))
    }
    fn ctx(&self) -> &Ctx {
        &self.ctx
    }
}

/// The CUDA path as the loop's [`roofline_models::train::Device`]: the model moves to the GPU at the
/// start of the run (after a resume) and back for checkpoints and the summary.
pub struct CudaTrainer<N: GpuModel> {
    parts: Parts,
    pub net: Option<N>,
}

impl<N: GpuModel> CudaTrainer<N> {
    /// Trains on `ctx`'s GPU; `nccl` sums the gradients over its ranks as `comm` says and
    /// `reducer` (the same ranks, over MPI) the batch-norm statistics.
    pub fn new(
        ctx: Ctx,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> CudaTrainer<N> {
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

    /// The context back once the run is over (the model's, or the one it was never built on).
    pub fn into_ctx(self) -> Option<Ctx> {
        match (self.net, self.parts.ctx) {
            (Some(n), _) => Some(n.into_parts().0),
            (None, ctx) => ctx,
        }
    }

    pub(super) fn net(&mut self) -> Result<&mut N, CudaError> {
        self.net
            .as_mut()
            .ok_or_else(|| CudaError::Check("the GPU model was not loaded".into()))
    }
}

impl<N: GpuModel> Device<f32, N::Cpu> for CudaTrainer<N> {
    fn reducer(&self) -> Option<Arc<dyn Reducer>> {
        self.parts.reducer.clone()
    }

    fn begin(&mut self, model: &mut N::Cpu) -> Result<(), CudaError> {
        let (ctx, nccl) = self.parts.take(self.net.take().map(N::into_parts))?;
        let p = &self.parts;
        self.net = Some(N::build(ctx, model, nccl, p.reducer.clone(), p.comm)?);
        Ok(())
    }

    fn step(
        &mut self,
        _: &mut N::Cpu,
        x: &Tensor<f32>,
        truth: &<N::Cpu as Model<f32>>::Truth,
        seed: u64,
        lr: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<Stepped<<N::Cpu as Model<f32>>::Loss>, CudaError> {
        self.net()?.step(x, truth, seed, lr, sgd)
    }

    fn infer(
        &mut self,
        _: &mut N::Cpu,
        x: &Tensor<f32>,
    ) -> Result<<N::Cpu as Model<f32>>::Output, CudaError> {
        self.net()?.infer(x)
    }

    fn store(&mut self, model: &mut N::Cpu) -> Result<(), CudaError> {
        self.net()?.store(model)
    }

    fn stager(&self) -> Option<Arc<dyn Stage<f32>>> {
        let s = self.net.as_ref()?.stager()?;
        Some(s as Arc<dyn Stage<f32>>)
    }

    fn cuda_graph(&self) -> Option<GraphReport> {
        self.net.as_ref()?.cuda_graph()
    }

    fn conv_search(&self) -> Option<crate::SearchReport> {
        Some(self.net.as_ref()?.ctx().search_report())
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
