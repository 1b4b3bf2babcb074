//! What a classifier's training step does on the GPU whatever its network (the ResNet's, a
//! described network's): the step's inputs and readout in buffers of its own ([`StepIo`]), the
//! labels checked, the batch taken from the stager (or uploaded), the softmax cross-entropy
//! queued into the readout ([`softmax_xent`]) and read back once the step has ended ([`Loss`]).

use super::*;
use roofline_kernels::cuda::stage::Stager;

/// What a step reads and leaves outside its kernels, in buffers of its own: the batch (in the
/// activations' storage), the labels (i32), the scalars ([`step_scalars`]) and the readout.
/// The host fills the first three before the step's work is enqueued, or its graph launched,
/// and reads the readout after: a captured step keeps its `StepIo` and is handed each batch
/// through it.
pub(super) struct StepIo {
    pub(super) x: GTensor,
    pub(super) labels: Buf,
    pub(super) scalars: Buf,
    pub(super) readout: Readout,
}

impl StepIo {
    /// Buffers for a step on a batch of `x`'s shape, the batch stored as `store`.
    pub(super) fn new(ctx: &Ctx, store: Storage, x: &Tensor<f32>) -> Result<StepIo, CudaError> {
        Ok(StepIo {
            x: ctx.tensor_in(store, x.n, x.h, x.w, x.c)?,
            labels: ctx.alloc(4 * x.n)?,
            scalars: ctx.alloc(16)?,
            readout: Readout::new(ctx, 12 * x.n)?,
        })
    }

    /// Whether `x` (NHWC) has this input's shape.
    pub(super) fn fits(&self, x: &Tensor<f32>) -> bool {
        (self.x.n, self.x.h, self.x.w, self.x.c) == (x.n, x.h, x.w, x.c)
    }

    /// The batch as the network's input: a view of this step's buffer.
    pub(super) fn input(&self) -> GTensor {
        GTensor {
            buf: self.x.buf.alias(),
            ..self.x
        }
    }

    /// Writes a step's batch, labels and scalars into these buffers, in stream order: the
    /// batch out of `stager` when the loader's thread staged it (its upload already ran on the
    /// copy stream; the step's stream waits for it on the device and copies it out), else
    /// uploaded now (and, for 16-bit storage, cast on the device: the step's one cast).
    pub(super) fn fill(
        &self,
        ctx: &mut Ctx,
        stager: &Stager,
        x: &Tensor<f32>,
        labels: &[i32],
        scalars: &[f32; 4],
    ) -> Result<(), CudaError> {
        // The batch's copy to the GPU: data, not idle time (`place` adds these spans to the
        // step's wait for data).
        let t0 = ctx.mark()?;
        let store = self.x.dt;
        // SAFETY: self.x holds x's values in the stager's storage (the model's), and lives
        // until the copy has run (stream-ordered).
        if !unsafe { stager.take(&ctx.gpu, &x.data, self.x.ptr())? } {
            if store == Storage::F32 {
                ctx.put(self.x.ptr(), &x.data)?;
            } else {
                let g = ctx.upload(x)?;
                ctx.cast_between(Storage::F32, store, g.ptr(), self.x.ptr(), g.len())?;
            }
        }
        ctx.close(UPLOAD, || "input".into(), t0)?;
        ctx.put(self.labels.ptr, labels)?;
        ctx.put(self.scalars.ptr, scalars)
    }
}

/// A classifier step's start on `ctx`: the GPU bound, the counters as they stand, the
/// timeline's clock started; `labels` (of `rows` rows, each one of `classes`) as the loss reads
/// them; the step's scalars at `lr` and the loss scale (the gradients' mean over `sync`'s
/// ranks).
pub(super) fn step_start(
    ctx: &mut Ctx,
    (labels, rows, classes): (&[usize], usize, usize),
    lr: f64,
    loss_scale: &LossScale,
    sync: Option<&GradSync>,
) -> Result<(Counters, Vec<i32>, [f32; 4]), CudaError> {
    ctx.gpu.bind()?;
    let at_start = Counters::now(ctx);
    ctx.clock_start()?;
    let l32 = class_labels(labels, rows, classes)?;
    let ranks = sync.map_or(1, |g| g.nccl.ranks);
    Ok((at_start, l32, step_scalars(lr, loss_scale, ranks)))
}

/// `labels` as the loss kernel reads them, each checked to name one of `classes`.
pub(super) fn class_labels(
    labels: &[usize],
    rows: usize,
    classes: usize,
) -> Result<Vec<i32>, CudaError> {
    if labels.len() != rows {
        return Err(CudaError::Check(format!(
            "{} labels for {rows} rows",
            labels.len()
        )));
    }
    if let Some(l) = labels.iter().find(|&&l| l >= classes) {
        return Err(CudaError::Check(format!(
            "label {l} out of range: {classes} classes"
        )));
    }
    Ok(labels.iter().map(|&l| l as i32).collect())
}

/// Softmax cross-entropy of the logits `z` (rows × classes, f32) against `io`'s labels,
/// queued: ∂loss/∂z × the loss scale (read from `io`'s scalars), and `io`'s readout filled
/// with each row's loss (f64) and the rank of its label (i32), read at the step's end
/// ([`Loss::read`]).
pub(super) fn softmax_xent(
    ctx: &mut Ctx,
    z: &GTensor,
    io: &StepIo,
    smoothing: f64,
) -> Result<GTensor, CudaError> {
    let rows = z.rows();
    if z.dt != Storage::F32 {
        return Err(CudaError::Check(format!(
            "the loss reads f32 logits, not {}",
            z.dt.name()
        )));
    }
    if io.labels.bytes < 4 * rows || io.readout.bytes < 12 * rows {
        return Err(CudaError::Check(format!(
            "{} bytes of labels and {} of readout for {rows} rows",
            io.labels.bytes, io.readout.bytes
        )));
    }
    let grad = ctx.tensor(z.n, z.h, z.w, z.c)?;
    let rb = io.readout.buf.ptr;
    let (lossp, rankp) = (rb, rb + 8 * rows as u64);
    let (zp, lp, gp, sp) = (z.ptr(), io.labels.ptr, grad.ptr(), io.scalars.ptr);
    let (ri, ki, sm) = (rows as i32, z.c as i32, smoothing as f32);
    let t0 = ctx.mark()?;
    // SAFETY: z and grad hold rows × k f32, labels rows i32 in [0, k) (checked by
    // `class_labels`); the readout holds rows f64 (losses) then rows i32 (ranks), 8-byte
    // aligned; the scalars four f32.
    unsafe {
        ctx.launch(
            "softmax_xent",
            rows,
            &mut [
                arg(&zp),
                arg(&lp),
                arg(&gp),
                arg(&lossp),
                arg(&rankp),
                arg(&ri),
                arg(&ki),
                arg(&sm),
                arg(&sp),
            ],
        )?
    };
    ctx.close(FWD, || "loss".into(), t0)?;
    Ok(grad)
}

/// A queued loss over `rows` rows, read from its readout's bytes once the step has ended.
pub(super) struct Loss {
    pub(super) rows: usize,
}

impl Loss {
    /// (mean loss, top-1, top-5) from the readout: rows f64 losses, then rows i32 ranks.
    pub(super) fn read(&self, bytes: &[u8]) -> Result<(f64, usize, usize), CudaError> {
        let rows = self.rows;
        if bytes.len() < 12 * rows {
            return Err(CudaError::Check(format!(
                "the loss readout: {} bytes for {rows} rows",
                bytes.len()
            )));
        }
        let (losses, ranks) = bytes[..12 * rows].split_at(8 * rows);
        let loss: f64 = losses
            .chunks_exact(8)
            .map(|b| f64::from_ne_bytes(b.try_into().unwrap_or_default()))
            .sum();
        let ranks: Vec<i32> = ranks
            .chunks_exact(4)
            .map(|b| i32::from_ne_bytes(b.try_into().unwrap_or_default()))
            .collect();
        let top1 = ranks.iter().filter(|&&r| r == 1).count();
        let top5 = ranks.iter().filter(|&&r| r <= 5).count();
        Ok((loss / rows.max(1) as f64, top1, top5))
    }
}

impl StepResult {
    /// A classifier step's result from what [`conclude`] read at its end: the mean loss and
    /// the top-1 and top-5 counts of its `rows` rows out of the readout.
    pub(super) fn of(done: &Finished, rows: usize) -> Result<StepResult, CudaError> {
        let (loss, top1, top5) = Loss { rows }.read(&done.loss_bytes)?;
        Ok(StepResult {
            loss,
            top1,
            top5,
            comm_bytes: done.comm_bytes,
            applied: done.applied,
            host_syncs: done.host_syncs,
            device_allocations: done.device_allocations,
        })
    }

    /// The step as the training loop takes it.
    pub(super) fn stepped(&self) -> roofline_models::train::Stepped<f64> {
        roofline_models::train::Stepped {
            loss: self.loss,
            comm_bytes: self.comm_bytes,
            comm_wait_s: 0.0,
            host_syncs: self.host_syncs,
            device_allocations: self.device_allocations,
        }
    }
}
