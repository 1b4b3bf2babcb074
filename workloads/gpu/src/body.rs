//! The ResNet body on the GPU, shared by both models: the stem (7×7/2 convolution, batch norm,
//! ReLU, 3×3/2 max pool) and the bottleneck stages. The classifier (`GpuResNet`) puts average
//! pooling and a fully connected layer on its last stage; the detector (`GpuDetector`) takes
//! the four stage outputs C2–C5 for its pyramid — the twins of the CPU's `ResNet::forward` and
//! `ResNet::forward_features`.

use super::*;

pub(super) struct GBody {
    pub(super) stem: GConv,
    pub(super) stem_bn: GBn,
    pub(super) blocks: Vec<GBlock>,
    /// Blocks per stage.
    pub(super) stages: [usize; 4],
    pub(super) stem_out: Option<Rc<GTensor>>,
    pub(super) pool_arg: Option<Buf>,
    pub(super) pool_in: (usize, usize, usize, usize),
}

impl GBody {
    /// The body of `model` over the next slots of a flat store (the CPU's parameter order:
    /// stem, stem batch norm, then each block's).
    pub(super) fn new(
        model: &ResNet<f32>,
        next: &mut impl FnMut() -> Result<Slot, CudaError>,
        r: &impl Fn() -> Option<Arc<dyn Reducer>>,
    ) -> Result<GBody, CudaError> {
        let stem = GConv::timed(&model.stem, next()?);
        let stem_bn = GBn::new(&model.stem_bn, next()?, next()?, r());
        let mut blocks = Vec::new();
        for b in &model.blocks {
            blocks.push(gblock(b, next, r)?);
        }
        Ok(GBody {
            stem,
            stem_bn,
            blocks,
            stages: model.config.blocks,
            stem_out: None,
            pool_arg: None,
            pool_in: (0, 0, 0, 0),
        })
    }

    /// The stage outputs for an NHWC batch: all four (C2–C5) when `features`, else the last.
    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: GTensor,
        train: bool,
        features: bool,
    ) -> Result<Vec<Rc<GTensor>>, CudaError> {
        let x = Rc::new(x);
        let t = self.stem.forward(ctx, flat, &x, train)?;
        let s = Rc::new(self.stem_bn.forward(ctx, flat, t, train, true)?);
        // Max pool 3×3 / 2, padding 1.
        let t0 = ctx.mark()?;
        let (oh, ow) = (pool_out(s.h), pool_out(s.w));
        let p = ctx.tensor_like(&s, s.n, oh, ow, s.c)?;
        // Each output's winning tap (0–8), a byte.
        let argb = ctx.alloc(p.len())?;
        let dims = [s.n, s.h, s.w, s.c, oh, ow];
        // SAFETY: s holds n·h·w·c, p n·oh·ow·c values of s's storage; arg n·oh·ow·c bytes.
        unsafe {
            pool_launch(
                ctx,
                s.kernel(MAXPOOL_FORWARD),
                p.len(),
                [s.ptr(), p.ptr(), argb.ptr],
                dims,
            )?
        };
        ctx.close(FWD, || "maxpool".into(), t0)?;
        if train {
            self.pool_arg = Some(argb);
            self.pool_in = (s.n, s.h, s.w, s.c);
            self.stem_out = Some(Rc::clone(&s));
        }
        let mut h = Rc::new(p);
        let mut out = Vec::with_capacity(4);
        let mut next = 0;
        for (stage, &n) in self.stages.iter().enumerate() {
            for b in &mut self.blocks[next..next + n] {
                h = b.forward(ctx, flat, &h, train)?;
            }
            next += n;
            if features || stage == 3 {
                out.push(Rc::clone(&h));
            }
        }
        Ok(out)
    }

    /// Every body parameter's gradient from the gradients of the stage outputs (`d[s]` for
    /// stage s, None where the stage's output feeds nothing but the next stage), after a
    /// training forward pass; `sync` is told after each block which gradients are final.
    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        mut d: Vec<Option<GTensor>>,
        mut sync: Option<&mut GradSync>,
    ) -> Result<(), CudaError> {
        let missing = || CudaError::Check("backward before a training forward pass".into());
        if d.len() != 4 {
            return Err(CudaError::Check("one gradient per stage".into()));
        }
        let mut g: Option<GTensor> = None;
        let mut end = self.blocks.len();
        for stage in (0..4).rev() {
            let ds = d.pop().flatten();
            let mut cur = match (g.take(), ds) {
                (Some(x), Some(ds)) => {
                    // A stage whose output feeds the pyramid too: its two gradients summed.
                    let t0 = ctx.mark()?;
                    elementwise(ctx, ADD_INTO, &x, &ds)?;
                    ctx.close(BWD, || format!("layer{}.output", stage + 1), t0)?;
                    x
                }
                (Some(x), None) | (None, Some(x)) => x,
                (None, None) => return Err(missing()),
            };
            let n = self.stages[stage];
            for b in self.blocks[end - n..end].iter_mut().rev() {
                cur = b.backward(ctx, flat, cur)?;
                if let Some(s) = sync.as_deref_mut() {
                    s.finished(ctx, flat, b.c1.w.off)?;
                }
            }
            end -= n;
            g = Some(cur);
        }
        let d = g.ok_or_else(missing)?;
        // Max pool backward: each input gathers the gradients of the windows it won.
        let t0 = ctx.mark()?;
        let (n, h, w, c) = self.pool_in;
        if d.n != n || d.c != c || d.h != pool_out(h) || d.w != pool_out(w) {
            return Err(CudaError::Check(
                "max pool backward: the gradient's shape is not the pool's output".into(),
            ));
        }
        let ds = ctx.tensor_like(&d, n, h, w, c)?;
        let argb = self.pool_arg.take().ok_or_else(missing)?;
        let dims = [n, h, w, c, d.h, d.w];
        // SAFETY: d and arg hold n·oh·ow·c values (of d's storage; bytes), ds n·h·w·c.
        unsafe {
            pool_launch(
                ctx,
                d.kernel(MAXPOOL_BACKWARD),
                ds.len(),
                [d.ptr(), argb.ptr, ds.ptr()],
                dims,
            )?
        };
        ctx.close(BWD, || "maxpool".into(), t0)?;
        let s = self.stem_out.take().ok_or_else(missing)?;
        let dstem = self.stem_bn.backward(ctx, flat, &ds, Some(&s))?;
        // The image needs no gradient: the stem's filter gradient only.
        self.stem.backward(ctx, flat, &dstem, false)?;
        Ok(())
    }

    /// Every batch norm sums across ranks through `comm` (NCCL on the training stream).
    pub(super) fn sum_on_device(&mut self, comm: &Rc<Communicator>) {
        self.stem_bn.sum_on_device(Rc::clone(comm));
        for b in &mut self.blocks {
            for bn in [&mut b.b1, &mut b.b2, &mut b.b3] {
                bn.sum_on_device(Rc::clone(comm));
            }
            if let Some((_, bn)) = &mut b.down {
                bn.sum_on_device(Rc::clone(comm));
            }
        }
    }

    /// The batch norms in the CPU's `running_stats` order.
    pub(super) fn bns(&self) -> Vec<&GBn> {
        let mut bns: Vec<&GBn> = vec![&self.stem_bn];
        for b in &self.blocks {
            bns.extend([&b.b1, &b.b2, &b.b3]);
            if let Some((_, bn)) = &b.down {
                bns.push(bn);
            }
        }
        bns
    }
}

/// The max pool's (3×3, stride 2, padding 1) output size for an input size.
pub(super) fn pool_out(h: usize) -> usize {
    (h + 2 - 3) / 2 + 1
}

/// Launches a max-pool kernel over `items`: its three buffers, then (n, h, w, c, oh, ow) of
/// the input and output.
///
/// # Safety
/// The buffers hold what the kernel reads and writes for those dimensions.
pub(super) unsafe fn pool_launch(
    ctx: &mut Ctx,
    kernel: &'static str,
    items: usize,
    bufs: [u64; 3],
    dims: [usize; 6],
) -> Result<(), CudaError> {
    let d = dims.map(|v| v as i32);
    // SAFETY: the caller's contract; (u64, u64, u64, 6 × i32) as the kernels take them.
    unsafe {
        ctx.launch(
            kernel,
            items,
            &mut [
                arg(&bufs[0]),
                arg(&bufs[1]),
                arg(&bufs[2]),
                arg(&d[0]),
                arg(&d[1]),
                arg(&d[2]),
                arg(&d[3]),
                arg(&d[4]),
                arg(&d[5]),
            ],
        )
    }
}

/// (depth = r·s·c, k) of every convolution filter of a ResNet, by parameter name.
pub(super) fn conv_shapes(model: &ResNet<f32>) -> HashMap<String, (usize, usize)> {
    let mut v = HashMap::new();
    let mut add = |c: &Conv2d<f32>| {
        v.insert(c.weight.name.clone(), (c.shape.depth(), c.shape.k));
    };
    add(&model.stem);
    for b in &model.blocks {
        add(&b.conv1);
        add(&b.conv2);
        add(&b.conv3);
        if let Some((c, _)) = &b.down {
            add(c);
        }
    }
    v
}

pub(super) fn gblock(
    b: &Bottleneck<f32>,
    next: &mut impl FnMut() -> Result<Slot, CudaError>,
    r: &impl Fn() -> Option<Arc<dyn Reducer>>,
) -> Result<GBlock, CudaError> {
    let c1 = GConv::timed(&b.conv1, next()?);
    let b1 = GBn::new(&b.bn1, next()?, next()?, r());
    let c2 = GConv::timed(&b.conv2, next()?);
    let b2 = GBn::new(&b.bn2, next()?, next()?, r());
    let c3 = GConv::timed(&b.conv3, next()?);
    let b3 = GBn::new(&b.bn3, next()?, next()?, r());
    let down = match &b.down {
        Some((c, bn)) => {
            let gc = GConv::timed(c, next()?);
            Some((gc, GBn::new(bn, next()?, next()?, r())))
        }
        None => None,
    };
    Ok(GBlock {
        c1,
        b1,
        c2,
        b2,
        c3,
        b3,
        down,
        a1: None,
        a2: None,
        out: None,
    })
}

/// A flat store of `params` (convolution filters, named in `convs` with their (depth, k), go
/// KRSC), their values and momenta uploaded.
pub(super) fn flat_params(
    ctx: &Ctx,
    params: &[&mut roofline_models::layers::Param<f32>],
    convs: &HashMap<String, (usize, usize)>,
) -> Result<Flat, CudaError> {
    let layout: Vec<ParamShape> = params
        .iter()
        .map(|p| (p.value.len(), p.decay, convs.get(&p.name).copied()))
        .collect();
    if layout.iter().filter(|l| l.2.is_some()).count() != convs.len() {
        return Err(CudaError::Check(
            "a convolution filter is missing from the parameters".into(),
        ));
    }
    let values: Vec<&[f32]> = params.iter().map(|p| &p.value[..]).collect();
    let moms: Vec<&[f32]> = params.iter().map(|p| &p.momentum[..]).collect();
    Flat::new(ctx, &layout, &values, &moms)
}

/// What a step leaves on the device for the host, read in one copy at the step's end (the
/// step's one wait): `bytes` the model's loss wrote (ResNet: each row's loss and rank), then
/// the loss-scale overflow flag (an i32).
pub(super) struct Readout {
    pub buf: Buf,
    pub bytes: usize,
}

impl Readout {
    /// Room for `bytes` (a multiple of 4) and the flag, the flag zeroed.
    pub(super) fn new(ctx: &Ctx, bytes: usize) -> Result<Readout, CudaError> {
        let bytes = bytes.next_multiple_of(4);
        let buf = ctx.alloc(bytes + 4)?;
        ctx.zero(buf.ptr + bytes as u64, 4)?;
        Ok(Readout { buf, bytes })
    }

    fn flag(&self) -> u64 {
        self.buf.ptr + self.bytes as u64
    }

    /// Zeroes the flag in stream order (a step captured in a graph zeroes it at every launch).
    pub(super) fn clear_flag(&self, ctx: &Ctx) -> Result<(), CudaError> {
        ctx.zero(self.flag(), 4)
    }
}

/// A step's scalars as its kernels read them from the device: [learning rate, 1 / (loss scale
/// × ranks) (the gradients' unscaling to the global batch's mean), loss scale, 0].
pub(super) fn step_scalars(lr: f64, loss_scale: &LossScale, ranks: usize) -> [f32; 4] {
    let scale = loss_scale.scale;
    [
        lr as f32,
        (1.0 / (scale * ranks as f64)) as f32,
        scale as f32,
        0.0,
    ]
}

/// The end of a step for either model: the loss-scale overflow check (when `dynamic`) into
/// the readout's flag, then SGD on every slot at the learning rate and unscaling that `scalars`
/// holds on the device ([`step_scalars`]), skipped on the device when the flag is set. Every
/// value that changes from step to step is read from the device, so that this can be captured
/// in a CUDA graph.
pub(super) fn update(
    ctx: &mut Ctx,
    flat: &Flat,
    dynamic: bool,
    readout: &Readout,
    scalars: u64,
    sgd: &roofline_models::train::Sgd,
) -> Result<(), CudaError> {
    let t0 = ctx.mark()?;
    let skip = if dynamic {
        let (gp, n, fp) = (flat.grads.ptr, flat.total as u64, readout.flag());
        // SAFETY: the gradients hold `total` f32, the flag one i32.
        unsafe { ctx.launch("nonfinite", flat.total, &mut [arg(&gp), arg(&n), arg(&fp)])? };
        fp
    } else {
        0
    };
    let (mu, wd) = (sgd.momentum as f32, sgd.weight_decay as f32);
    let slots = flat.slots.len();
    if slots > 65535 {
        return Err(CudaError::Check(format!(
            "{slots} parameter slots: one optimizer launch takes at most 65535"
        )));
    }
    if slots > 0 {
        let s64 = slots as u64;
        let (w, g, m) = (flat.values.ptr, flat.grads.ptr, flat.moms.ptr);
        let (off, len, decay) = (
            flat.table.ptr,
            flat.table.ptr + 8 * s64,
            flat.table.ptr + 16 * s64,
        );
        let all = i32::from(sgd.decay_all);
        // The 16-bit copy of the weights that mixed precision's convolutions read.
        let (w16, w16_type) = match &flat.half {
            None => (0u64, 0i32),
            Some((Storage::F16, b)) => (b.ptr, 1),
            Some((_, b)) => (b.ptr, 2),
        };
        // Enough blocks along each slot to fill the GPU with the longest ones.
        let gx = flat.longest.div_ceil(1024).clamp(1, 256) as u32;
        let f = ctx.function("sgd_slots")?;
        // SAFETY: values, gradients and momenta hold `total` f32, the 16-bit copy (or null)
        // `total` of its type; the table holds each slot's offset and length (u64, within
        // `total`) and decay flag (u32); scalars four f32; skip is null or the readout's flag;
        // one block row per slot, 256 threads as the kernel strides.
        unsafe {
            ctx.gpu.launch_2d(
                f,
                (gx, slots as u32),
                256,
                &mut [
                    arg(&w),
                    arg(&g),
                    arg(&m),
                    arg(&w16),
                    arg(&w16_type),
                    arg(&off),
                    arg(&len),
                    arg(&decay),
                    arg(&all),
                    arg(&scalars),
                    arg(&mu),
                    arg(&wd),
                    arg(&skip),
                ],
            )?
        };
    }
    ctx.close("optimizer", || "sgd".into(), t0)?;
    Ok(())
}

/// What [`finish_step`] found at a step's end.
pub(super) struct Finished {
    /// Bytes this rank put into gradient allreduces.
    pub comm_bytes: f64,
    /// False when a loss-scale overflow skipped the update.
    pub applied: bool,
    /// The readout's `bytes` (the model's loss).
    pub loss_bytes: Vec<u8>,
    /// The host's waits for the GPU during the step.
    pub host_syncs: u64,
    /// The device allocations during the step.
    pub device_allocations: u64,
}

/// The context's counters at a step's start: the host's waits and the device allocations.
#[derive(Clone, Copy, Debug)]
pub(super) struct Counters {
    syncs: u64,
    allocations: u64,
}

impl Counters {
    pub(super) fn now(ctx: &Ctx) -> Counters {
        Counters {
            syncs: ctx.gpu.syncs(),
            allocations: ctx.allocations(),
        }
    }
}

/// The end of either model's step once its backward pass has queued everything: the update
/// (`update`, the global batch's mean over the communicator's ranks), then [`conclude`].
pub(super) fn finish_step(
    ctx: &mut Ctx,
    flat: &Flat,
    sync: Option<&GradSync>,
    (loss_scale, skipped): (&mut LossScale, &mut usize),
    (lr, sgd): (f64, &roofline_models::train::Sgd),
    readout: Readout,
    at_start: Counters,
) -> Result<Finished, CudaError> {
    let ranks = sync.map_or(1, |g| g.nccl.ranks);
    let scalars = ctx.upload_buf(&step_scalars(lr, loss_scale, ranks))?;
    update(ctx, flat, loss_scale.dynamic, &readout, scalars.ptr, sgd)?;
    conclude(ctx, sync, (loss_scale, skipped), &readout, at_start)
}

/// A step's last host work, after everything of it is queued (or its graph launched): one
/// copy of the readout, which waits for the whole step (the NCCL sums included: the compute
/// stream waits for them); the loss scale moves, a skipped step is counted, the layers'
/// timings go on the timeline.
pub(super) fn conclude(
    ctx: &mut Ctx,
    sync: Option<&GradSync>,
    (loss_scale, skipped): (&mut LossScale, &mut usize),
    readout: &Readout,
    at_start: Counters,
) -> Result<Finished, CudaError> {
    let comm_bytes = sync.map_or(0.0, |g| g.bytes);
    let mut raw: Vec<u8> = ctx.get(readout.buf.ptr, readout.bytes + 4)?;
    let flag = i32::from_ne_bytes([
        raw[readout.bytes],
        raw[readout.bytes + 1],
        raw[readout.bytes + 2],
        raw[readout.bytes + 3],
    ]);
    raw.truncate(readout.bytes);
    let applied = loss_scale.update(flag != 0);
    if !applied {
        *skipped += 1;
    }
    let host_syncs = ctx.gpu.syncs() - at_start.syncs;
    let device_allocations = ctx.allocations() - at_start.allocations;
    ctx.clock_flush()?;
    Ok(Finished {
        comm_bytes,
        applied,
        loss_bytes: raw,
        host_syncs,
        device_allocations,
    })
}

/// Reads a flat store's values and momenta back into `params` (the CPU layout).
pub(super) fn store_params(
    ctx: &Ctx,
    flat: &Flat,
    params: Vec<&mut roofline_models::layers::Param<f32>>,
) -> Result<(), CudaError> {
    let values: Vec<f32> = ctx.get(flat.values.ptr, flat.total)?;
    let moms: Vec<f32> = ctx.get(flat.moms.ptr, flat.total)?;
    if params.len() != flat.slots.len() {
        return Err(CudaError::Check(format!(
            "{} parameters for {} slots",
            params.len(),
            flat.slots.len()
        )));
    }
    for (p, s) in params.into_iter().zip(&flat.slots) {
        p.value = s.host_layout(&values[s.off..s.off + s.len]);
        p.momentum = s.host_layout(&moms[s.off..s.off + s.len]);
    }
    Ok(())
}
