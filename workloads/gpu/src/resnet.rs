//! The ResNet on the GPU built from the GPU layers: forward, backward, the loss scale for f16,
//! the bucketed NCCL gradient exchange overlapped with the backward pass, and SGD.

use super::*;

/// Loss scaling for f16 (bf16 and f32 need none): start at 2¹⁰, halve on an overflow (and skip
/// that step), double after 1000 steps without one.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LossScale {
    pub scale: f64,
    pub(super) good: usize,
    pub(super) dynamic: bool,
}

impl LossScale {
    /// Dynamic for f16 convolutions, and for f16 gradients on the wire (NCCL sums them in f16:
    /// an overflow skips the step and halves the scale; the scale keeps small gradients out of
    /// f16's subnormals).
    pub fn for_step(p: Prec, wire: Wire) -> LossScale {
        let dynamic = p == Prec::F16 || wire == Wire::F16;
        LossScale {
            scale: if dynamic { 1024.0 } else { 1.0 },
            good: 0,
            dynamic,
        }
    }

    /// After a step: whether to apply it (no overflow), and the scale for the next one.
    pub fn update(&mut self, overflow: bool) -> bool {
        if !self.dynamic {
            return !overflow;
        }
        if overflow {
            self.scale = (self.scale / 2.0).max(1.0);
            self.good = 0;
            return false;
        }
        self.good += 1;
        if self.good >= 1000 {
            self.scale *= 2.0;
            self.good = 0;
        }
        true
    }
}

/// ResNet on the GPU, built from (and written back into) the CPU model.
pub struct GpuResNet {
    pub(super) flat: Flat,
    pub(super) body: GBody,
    pub(super) fc: GLinear,
    pub(super) pool_in_hw: (usize, usize),
    pub(super) last: Option<GTensor>,
    /// How activations and their gradients are stored between layers: in the convolutions'
    /// 16 bits in f16 and bf16, else f32.
    pub store: Storage,
    /// Batches staged by the loader's thread and uploaded on a copy stream ahead of their
    /// step (in `store`'s format).
    pub(super) stager: Arc<roofline_kernels::cuda::stage::Stager>,
    pub loss_scale: LossScale,
    /// Steps skipped because the scaled gradients overflowed.
    pub skipped: usize,
    pub(super) sync: Option<GradSync>,
    /// Whether this step runs as a CUDA graph ([`Policy`]), the graph once captured, and the
    /// events that time the trial's steps.
    pub(super) graphs: Policy,
    pub(super) captured: Option<Captured>,
    timer: (Event, Event),
    /// Declared last: dropped after every buffer above has been freed on its stream.
    pub ctx: Ctx,
}

/// A captured step and the buffers its launches read and write.
pub(super) struct Captured {
    graph: roofline_kernels::cuda::graph::Graph,
    io: StepIo,
}

/// The NCCL side of a step. The flat gradients are laid out in the forward order, so what the
/// backward pass has finished is always a suffix `[lo, total)`: each bucket is the newly
/// finished stretch, summed on the communicator's stream once the compute stream gets there
/// (an event, no host wait) while the backward pass goes on.
pub struct GradSync {
    pub(super) nccl: Communicator,
    pub(super) opts: CommOptions,
    /// The gradients in the wire's 16-bit format, when compressed.
    pub(super) wire: Option<Buf>,
    pub(super) ready: Event,
    pub(super) done: Event,
    /// Gradients from here on are queued.
    pub(super) sent: usize,
    pub(super) bytes: f64,
}

impl GradSync {
    pub(super) fn new(
        ctx: &Ctx,
        nccl: Communicator,
        opts: CommOptions,
        total: usize,
    ) -> Result<GradSync, CudaError> {
        let wire = match opts.wire {
            Wire::F32 => None,
            _ => Some(ctx.alloc(2 * total)?),
        };
        Ok(GradSync {
            nccl,
            opts,
            wire,
            ready: Event::new()?,
            done: Event::new()?,
            sent: total,
            bytes: 0.0,
        })
    }

    /// A model's exchange over `nccl` (none for a single GPU) of `total` gradients, and the
    /// loss scale its convolutions' precision and the wire's format call for.
    pub(super) fn with_scale(
        ctx: &Ctx,
        nccl: Option<Communicator>,
        comm: CommOptions,
        total: usize,
    ) -> Result<(Option<GradSync>, LossScale), CudaError> {
        let sync = match nccl {
            Some(c) => Some(GradSync::new(ctx, c, comm, total)?),
            None => None,
        };
        let wire = if sync.is_some() { comm.wire } else { Wire::F32 };
        Ok((sync, LossScale::for_step(ctx.prec, wire)))
    }

    pub(super) fn begin(&mut self, total: usize) {
        self.sent = total;
        self.bytes = 0.0;
    }

    /// The backward pass has finished the gradients from `lo` on.
    pub(super) fn finished(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        lo: usize,
    ) -> Result<(), CudaError> {
        if self.opts.overlap && self.sent - lo >= self.opts.bucket.max(1) {
            self.send(ctx, flat, lo)?;
        }
        Ok(())
    }

    /// Queues the sums of `[lo, sent)`, in buckets from the top.
    pub(super) fn send(&mut self, ctx: &mut Ctx, flat: &Flat, lo: usize) -> Result<(), CudaError> {
        let (hi, bucket) = (self.sent, self.opts.bucket.max(1));
        if hi <= lo {
            return Ok(());
        }
        let n = hi - lo;
        let elem = match self.opts.wire {
            Wire::F32 => Elem::F32,
            Wire::F16 => Elem::F16,
            Wire::Bf16 => Elem::Bf16,
        };
        let (base, width) = match &self.wire {
            Some(w) => {
                ctx.cast_between(
                    Storage::F32,
                    wire_storage(self.opts.wire),
                    flat.grads.ptr + 4 * lo as u64,
                    w.ptr + 2 * lo as u64,
                    n,
                )?;
                (w.ptr, 2)
            }
            None => (flat.grads.ptr, 4),
        };
        // The communicator's stream starts when the compute stream has got here.
        self.ready.record_on(&ctx.gpu)?;
        self.ready.wait_on(&self.nccl.gpu)?;
        let mut top = hi;
        while top > lo {
            let start = top.saturating_sub(bucket).max(lo);
            self.nccl
                .all_reduce_sum(base + (width * start) as u64, top - start, elem)?;
            top = start;
        }
        self.bytes += (n * elem.bytes()) as f64;
        self.sent = lo;
        ctx.gpu.bind()
    }

    /// Queues the rest, and makes the compute stream wait for every sum (and widen them back).
    pub(super) fn end(&mut self, ctx: &mut Ctx, flat: &Flat) -> Result<(), CudaError> {
        self.send(ctx, flat, 0)?;
        self.done.record_on(&self.nccl.gpu)?;
        self.done.wait_on(&ctx.gpu)?;
        ctx.gpu.bind()?;
        if let Some(w) = &self.wire {
            let dt = wire_storage(self.opts.wire);
            ctx.cast_between(dt, Storage::F32, w.ptr, flat.grads.ptr, flat.total)?;
        }
        Ok(())
    }
}

/// Where the gradients go through NCCL, batch norm's sums go through NCCL too: a communicator
/// of their own (its id broadcast by `reducer`, or made here for one rank without one), whose
/// sums run on the training stream, apart from the gradient buckets' stream.
pub(super) fn bn_communicator(
    ctx: &Ctx,
    grads: &GradSync,
    reducer: Option<&dyn Reducer>,
) -> Result<Communicator, CudaError> {
    let ordinal = ctx.gpu.ordinal;
    match reducer {
        Some(r) => communicator(r, ordinal),
        None if grads.nccl.ranks == 1 => {
            Communicator::new(&roofline_kernels::comm::nccl::unique_id()?, 1, 0, ordinal)
        }
        None => Err(CudaError::Check(format!(
            "{} NCCL ranks and no reducer to share batch norm's communicator",
            grads.nccl.ranks
        ))),
    }
}

/// How gradients in the wire's format are stored.
fn wire_storage(w: Wire) -> Storage {
    match w {
        Wire::F32 => Storage::F32,
        Wire::F16 => Storage::F16,
        Wire::Bf16 => Storage::Bf16,
    }
}

impl GpuResNet {
    /// Uploads `model` (parameters, running statistics) to `ctx`'s GPU. With `nccl`, gradients
    /// are summed over its ranks; `reducer` (the same ranks) sums the batch-norm statistics.
    pub fn new(
        ctx: Ctx,
        model: &mut ResNet<f32>,
        nccl: Option<Communicator>,
        reducer: Option<Arc<dyn Reducer>>,
        comm: CommOptions,
    ) -> Result<GpuResNet, CudaError> {
        // The order of `model.params()`; convolution filters (and momenta) go KRSC.
        let convs = conv_shapes(model);
        let flat = flat_params(&ctx, &model.params(), &convs)?;
        let mut it = flat.slots.clone().into_iter();
        let mut next = || {
            it.next()
                .ok_or_else(|| CudaError::Check("parameter list".into()))
        };
        let r = || reducer.clone();
        let mut body = GBody::new(model, &mut next, &r)?;
        let fc_w = next()?;
        let fc_b = next()?;
        let (sync, loss_scale) = GradSync::with_scale(&ctx, nccl, comm, flat.total)?;
        if let Some(g) = &sync {
            body.sum_on_device(&Rc::new(bn_communicator(&ctx, g, reducer.as_deref())?));
        }
        let store = Storage::of(ctx.prec);
        let stager = Arc::new(roofline_kernels::cuda::stage::Stager::new(&ctx.gpu, store)?);
        // A step that waits for the host, or runs NCCL on a stream of its own, is not captured.
        let barred = if sync.is_some() {
            Some("not captured: the gradients cross ranks through NCCL on a stream of their own (a one-GPU step is)".into())
        } else if reducer.is_some() {
            Some("not captured: batch norm's sums cross ranks on the host (MPI), a wait in every batch norm".into())
        } else {
            None
        };
        let graphs = Policy::new(ctx.graph, barred, TRIAL_STEPS);
        Ok(GpuResNet {
            graphs,
            captured: None,
            timer: (Event::new()?, Event::new()?),
            stager,
            ctx,
            flat,
            body,
            fc: GLinear {
                w: fc_w,
                b: fc_b,
                inputs: model.fc.inputs,
                outputs: model.fc.outputs,
            },
            pool_in_hw: (0, 0),
            last: None,
            store,
            loss_scale,
            skipped: 0,
            sync,
        })
    }

    /// Logits (rows × classes) for an NHWC batch on the device.
    pub(super) fn forward(&mut self, x: GTensor, train: bool) -> Result<GTensor, CudaError> {
        let h = self
            .body
            .forward(&mut self.ctx, &self.flat, x, train, false)?
            .pop()
            .ok_or_else(|| CudaError::Check("the body has no stage".into()))?;
        // Global average pool → n × c, in f32 whatever the activations' storage: the
        // classifier (n × 2048 → n × classes, on cuBLAS) runs in f32.
        let t0 = self.ctx.mark()?;
        let pooled = self.ctx.tensor(h.n, 1, 1, h.c)?;
        let (hp, op) = (h.ptr(), pooled.ptr());
        let (n, hw, c) = (h.n as i32, (h.h * h.w) as i32, h.c as i32);
        // SAFETY: h holds n·hw·c values of its storage, pooled n·c f32.
        unsafe {
            self.ctx.launch(
                h.kernel(AVGPOOL_FORWARD),
                h.n * h.c,
                &mut [arg(&hp), arg(&op), arg(&n), arg(&hw), arg(&c)],
            )?
        };
        self.ctx.close(FWD, || "avgpool".into(), t0)?;
        // Classifier: y (n × out) = pooled (n × in) · W (in × out) + b.
        let t0 = self.ctx.mark()?;
        let y = self.fc.forward(&mut self.ctx, &self.flat, &pooled)?;
        self.ctx.close(FWD, || "fc".into(), t0)?;
        if train {
            self.last = Some(pooled);
            self.pool_in_hw = (h.h, h.w);
        }
        Ok(y)
    }
}

/// What one training step reports.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    /// Mean loss over this rank's rows.
    pub loss: f64,
    pub top1: usize,
    pub top5: usize,
    /// Bytes this rank put into gradient allreduces.
    pub comm_bytes: f64,
    /// False when a loss-scale overflow skipped the update.
    pub applied: bool,
    /// The host's waits for the GPU during the step.
    pub host_syncs: u64,
    /// The device allocations during the step (none once the pool holds what a step needs).
    pub device_allocations: u64,
}

impl GpuResNet {
    pub(super) fn backward(&mut self, dlogits: &GTensor) -> Result<(), CudaError> {
        let missing = || CudaError::Check("backward before a training forward pass".into());
        let pooled = self.last.take().ok_or_else(missing)?;
        let rows = dlogits.rows();
        let inp = self.fc.inputs;
        let ctx = &mut self.ctx;
        let flat = &self.flat;
        let mut sync = self.sync.as_mut();
        if let Some(g) = sync.as_deref_mut() {
            g.begin(flat.total);
        }
        let t0 = ctx.mark()?;
        self.fc.backward_params(ctx, flat, &pooled, dlogits)?;
        if let Some(g) = sync.as_deref_mut() {
            g.finished(ctx, flat, self.fc.first_offset())?;
        }
        let dp = self.fc.backward_data(ctx, flat, dlogits)?;
        ctx.close(BWD, || "fc".into(), t0)?;
        let t0 = ctx.mark()?;
        let (hh, hw) = self.pool_in_hw;
        let d = ctx.tensor_in(self.store, rows, hh, hw, inp)?;
        let (dpp, dp2, n, hwi, c) = (dp.ptr(), d.ptr(), rows as i32, (hh * hw) as i32, inp as i32);
        // SAFETY: dp holds n × c f32, d n × hw × c values of its storage.
        unsafe {
            ctx.launch(
                d.kernel(AVGPOOL_BACKWARD),
                d.len(),
                &mut [arg(&dpp), arg(&dp2), arg(&n), arg(&hwi), arg(&c)],
            )?
        };
        ctx.close(BWD, || "avgpool".into(), t0)?;
        self.body.backward(
            ctx,
            flat,
            vec![None, None, None, Some(d)],
            sync.as_deref_mut(),
        )?;
        if let Some(g) = sync {
            g.end(ctx, flat)?;
        }
        Ok(())
    }

    /// A step's whole device work on `io`: forward, loss, backward (and the gradients'
    /// allreduce where there is one), update. It reads everything that changes between steps
    /// from `io`, so that it can be captured once and launched again.
    fn body(
        &mut self,
        io: &StepIo,
        smoothing: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<(), CudaError> {
        io.readout.clear_flag(&self.ctx)?;
        let z = self.forward(io.input(), true)?;
        let g = softmax_xent(&mut self.ctx, &z, io, smoothing)?;
        drop(z);
        self.backward(&g)?;
        let dynamic = self.loss_scale.dynamic;
        update(
            &mut self.ctx,
            &self.flat,
            dynamic,
            &io.readout,
            io.scalars.ptr,
            sgd,
        )
    }

    /// Captures [`GpuResNet::body`] on `io` into a graph (the pool sealed: a buffer it does
    /// not hold fails the capture), without running it.
    fn capture(
        &mut self,
        io: &StepIo,
        smoothing: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<roofline_kernels::cuda::graph::Graph, CudaError> {
        self.ctx.gpu.begin_capture()?;
        self.ctx.seal_pool(true);
        let work = self.body(io, smoothing, sgd);
        self.ctx.seal_pool(false);
        self.ctx.gpu.end_capture(work).map(|(g, ())| g)
    }

    /// One training step on this rank's share of the batch: forward, loss, backward, gradient
    /// allreduce (NCCL, in buckets), loss-scale check, SGD at `lr`; enqueued call by call or
    /// launched as the captured graph, as the [`Policy`] says; the host waits for the GPU
    /// once, at the end.
    pub fn step(
        &mut self,
        x: &Tensor<f32>,
        labels: &[usize],
        lr: f64,
        smoothing: f64,
        sgd: &roofline_models::train::Sgd,
    ) -> Result<StepResult, CudaError> {
        let (at_start, l32, scalars) = step_start(
            &mut self.ctx,
            (labels, x.n, self.fc.outputs),
            lr,
            &self.loss_scale,
            self.sync.as_ref(),
        )?;
        let mut plan = self.graphs.plan(x.n, self.ctx.clock.is_some());
        if matches!(plan, Plan::Replay { .. })
            && !self.captured.as_ref().is_some_and(|c| c.io.fits(x))
        {
            plan = Plan::Eager { timed: false };
        }
        if plan.timed() {
            self.timer.0.record_on(&self.ctx.gpu)?;
        }
        // The step's buffers when they are its own (None: the captured graph's).
        let (ran, own) = match plan {
            Plan::Eager { .. } => {
                let io = StepIo::new(&self.ctx, self.store, x)?;
                io.fill(&mut self.ctx, &self.stager, x, &l32, &scalars)?;
                self.body(&io, smoothing, sgd)?;
                (plan, Some(io))
            }
            Plan::Capture => {
                let io = StepIo::new(&self.ctx, self.store, x)?;
                io.fill(&mut self.ctx, &self.stager, x, &l32, &scalars)?;
                match self.capture(&io, smoothing, sgd) {
                    Ok(graph) => {
                        graph.launch(&self.ctx.gpu)?;
                        self.captured = Some(Captured { graph, io });
                        (plan, None)
                    }
                    Err(e) => {
                        eprintln!("note: the training step was not captured as a CUDA graph ({e}); every step is enqueued call by call");
                        self.graphs.failed(e.to_string());
                        self.body(&io, smoothing, sgd)?;
                        (Plan::Eager { timed: false }, Some(io))
                    }
                }
            }
            Plan::Replay { .. } => {
                let c = self
                    .captured
                    .take()
                    .ok_or_else(|| CudaError::Check("no captured step to launch".into()))?;
                let filled = c.io.fill(&mut self.ctx, &self.stager, x, &l32, &scalars);
                let launched = filled.and_then(|()| c.graph.launch(&self.ctx.gpu));
                self.captured = Some(c);
                launched?;
                (plan, None)
            }
        };
        if plan.timed() {
            self.timer.1.record_on(&self.ctx.gpu)?;
        }
        let readout = match (&own, &self.captured) {
            (Some(io), _) => &io.readout,
            (None, Some(c)) => &c.io.readout,
            (None, None) => return Err(CudaError::Check("the step's readout is gone".into())),
        };
        // The sums were queued during the backward pass, and the compute stream waits for them.
        let done = conclude(
            &mut self.ctx,
            self.sync.as_ref(),
            (&mut self.loss_scale, &mut self.skipped),
            readout,
            at_start,
        )?;
        let seconds = if ran.timed() {
            Some(self.timer.0.seconds_to(&self.timer.1)?)
        } else {
            None
        };
        self.graphs.done(ran, done.device_allocations, seconds);
        if !self.graphs.keeps_graph() {
            self.captured = None;
        }
        StepResult::of(&done, x.n)
    }

    /// What the run did with CUDA graphs.
    pub fn cuda_graph(&self) -> GraphReport {
        self.graphs.report()
    }

    /// Inference logits for a batch.
    pub fn logits(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, CudaError> {
        self.ctx.gpu.bind()?;
        let xg = self.ctx.upload_in(self.store, x)?;
        let z = self.forward(xg, false)?;
        self.ctx.download(&z)
    }

    /// Writes the parameters, momenta and running statistics back into `model` (checkpoints,
    /// evaluation on the CPU, the summary).
    pub fn store(&mut self, model: &mut ResNet<f32>) -> Result<(), CudaError> {
        store_params(&self.ctx, &self.flat, model.params())?;
        store_running(&self.ctx, model.running_stats(), self.body.bns())
    }
}
