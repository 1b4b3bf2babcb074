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
    pub(super) stem: GConv,
    pub(super) stem_bn: GBn,
    pub(super) blocks: Vec<GBlock>,
    pub(super) fc: GLinear,
    pub(super) stem_out: Option<Rc<GTensor>>,
    pub(super) pool_arg: Option<Buf>,
    pub(super) pool_in: (usize, usize, usize, usize),
    pub(super) pool_in_hw: (usize, usize),
    pub(super) last: Option<GTensor>,
    pub loss_scale: LossScale,
    /// Steps skipped because the scaled gradients overflowed.
    pub skipped: usize,
    pub(super) sync: Option<GradSync>,
    /// Declared last: dropped after every buffer above has been freed on its stream.
    pub ctx: Ctx,
}

/// The NCCL side of a step. The flat gradients are laid out in the forward order, so what the
/// backward pass has finished is always a suffix `[lo, total)`: each bucket is the newly
/// finished stretch, summed on the communicator's stream once the compute stream gets there
/// (an event, no host wait) while the backward pass goes on.
pub(super) struct GradSync {
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
                ctx.cast(
                    elem == Elem::Bf16,
                    true,
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
            ctx.cast(
                self.opts.wire == Wire::Bf16,
                false,
                w.ptr,
                flat.grads.ptr,
                flat.total,
            )?;
        }
        Ok(())
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
        let params = model.params();
        let layout: Vec<_> = params
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
        let flat = Flat::new(&ctx, &layout, &values, &moms)?;
        let mut it = flat.slots.clone().into_iter();
        let mut next = || {
            it.next()
                .ok_or_else(|| CudaError::Check("parameter list".into()))
        };
        let r = || reducer.clone();
        let stem = GConv::new(&model.stem, next()?);
        let stem_bn = GBn::new(&model.stem_bn, next()?, next()?, r());
        let mut blocks = Vec::new();
        for b in &model.blocks {
            blocks.push(gblock(b, &mut next, &r)?);
        }
        let fc_w = next()?;
        let fc_b = next()?;
        let prec = ctx.prec;
        let sync = match nccl {
            Some(c) => Some(GradSync::new(&ctx, c, comm, flat.total)?),
            None => None,
        };
        let wire = if sync.is_some() { comm.wire } else { Wire::F32 };
        Ok(GpuResNet {
            ctx,
            flat,
            stem,
            stem_bn,
            blocks,
            fc: GLinear {
                w: fc_w,
                b: fc_b,
                inputs: model.fc.inputs,
                outputs: model.fc.outputs,
            },
            stem_out: None,
            pool_arg: None,
            pool_in: (0, 0, 0, 0),
            pool_in_hw: (0, 0),
            last: None,
            loss_scale: LossScale::for_step(prec, wire),
            skipped: 0,
            sync,
        })
    }

    /// Logits (rows × classes) for an NHWC batch on the device.
    pub(super) fn forward(&mut self, x: GTensor, train: bool) -> Result<GTensor, CudaError> {
        let x = Rc::new(x);
        let t = self.stem.forward(&mut self.ctx, &self.flat, &x, train)?;
        let s = Rc::new(
            self.stem_bn
                .forward(&mut self.ctx, &self.flat, t, train, true)?,
        );
        // Max pool 3×3 / 2, padding 1.
        let (oh, ow) = ((s.h + 2 - 3) / 2 + 1, (s.w + 2 - 3) / 2 + 1);
        let p = self.ctx.tensor(s.n, oh, ow, s.c)?;
        let argb = self.ctx.alloc(4 * p.len())?;
        let (sp, pp, ap) = (s.ptr(), p.ptr(), argb.ptr);
        let dims = [
            s.n as i32, s.h as i32, s.w as i32, s.c as i32, oh as i32, ow as i32,
        ];
        // SAFETY: s holds n·h·w·c, p and arg n·oh·ow·c elements.
        unsafe {
            self.ctx.launch(
                "maxpool_forward",
                p.len(),
                &mut [
                    arg(&sp),
                    arg(&pp),
                    arg(&ap),
                    arg(&dims[0]),
                    arg(&dims[1]),
                    arg(&dims[2]),
                    arg(&dims[3]),
                    arg(&dims[4]),
                    arg(&dims[5]),
                ],
            )?
        };
        if train {
            self.pool_arg = Some(argb);
            self.pool_in = (s.n, s.h, s.w, s.c);
            self.stem_out = Some(Rc::clone(&s));
        }
        let mut h = Rc::new(p);
        for b in &mut self.blocks {
            h = b.forward(&mut self.ctx, &self.flat, &h, train)?;
        }
        // Global average pool → n × c.
        let pooled = self.ctx.tensor(h.n, 1, 1, h.c)?;
        let (hp, op) = (h.ptr(), pooled.ptr());
        let (n, hw, c) = (h.n as i32, (h.h * h.w) as i32, h.c as i32);
        // SAFETY: h holds n·hw·c, pooled n·c.
        unsafe {
            self.ctx.launch(
                "avgpool_forward",
                h.n * h.c,
                &mut [arg(&hp), arg(&op), arg(&n), arg(&hw), arg(&c)],
            )?
        };
        // Classifier: y (n × out) = pooled (n × in) · W (in × out) + b.
        let y = self.fc.forward(&mut self.ctx, &self.flat, &pooled)?;
        if train {
            self.last = Some(pooled);
            self.pool_in_hw = (h.h, h.w);
        }
        Ok(y)
    }
}

/// (depth = r·s·c, k) of every convolution filter, by parameter name.
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
    let c1 = GConv::new(&b.conv1, next()?);
    let b1 = GBn::new(&b.bn1, next()?, next()?, r());
    let c2 = GConv::new(&b.conv2, next()?);
    let b2 = GBn::new(&b.bn2, next()?, next()?, r());
    let c3 = GConv::new(&b.conv3, next()?);
    let b3 = GBn::new(&b.bn3, next()?, next()?, r());
    let down = match &b.down {
        Some((c, bn)) => {
            let gc = GConv::new(c, next()?);
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
        self.fc.backward_params(ctx, flat, &pooled, dlogits)?;
        if let Some(g) = sync.as_deref_mut() {
            g.finished(ctx, flat, self.fc.first_offset())?;
        }
        let dp = self.fc.backward_data(ctx, flat, dlogits)?;
        let (hh, hw) = self.pool_in_hw;
        let mut d = ctx.tensor(rows, hh, hw, inp)?;
        let (dpp, dp2, n, hwi, c) = (dp.ptr(), d.ptr(), rows as i32, (hh * hw) as i32, inp as i32);
        // SAFETY: dp holds n × c, d n × hw × c.
        unsafe {
            ctx.launch(
                "avgpool_backward",
                d.len(),
                &mut [arg(&dpp), arg(&dp2), arg(&n), arg(&hwi), arg(&c)],
            )?
        };
        for b in self.blocks.iter_mut().rev() {
            d = b.backward(ctx, flat, d)?;
            if let Some(g) = sync.as_deref_mut() {
                g.finished(ctx, flat, b.c1.w.off)?;
            }
        }
        // Max pool backward: scatter-add into a zeroed input gradient.
        let (n, h, w, c) = self.pool_in;
        let ds = ctx.tensor(n, h, w, c)?;
        ctx.zero(ds.ptr(), 4 * ds.len())?;
        let argb = self.pool_arg.take().ok_or_else(missing)?;
        let (dp3, ap, dsp) = (d.ptr(), argb.ptr, ds.ptr());
        let (ni, hwc, per) = (n as i32, (h * w * c) as i32, (d.h * d.w * d.c) as i32);
        // SAFETY: d and arg hold n × per_out, ds n × h·w·c elements; arg < h·w·c.
        unsafe {
            ctx.launch(
                "maxpool_backward",
                d.len(),
                &mut [
                    arg(&dp3),
                    arg(&ap),
                    arg(&dsp),
                    arg(&ni),
                    arg(&hwc),
                    arg(&per),
                ],
            )?
        };
        let s = self.stem_out.take().ok_or_else(missing)?;
        let dstem = self.stem_bn.backward(ctx, flat, &ds, Some(&s))?;
        // The image needs no gradient: the stem's filter gradient only.
        self.stem.backward(ctx, flat, &dstem, false)?;
        if let Some(g) = sync {
            g.end(ctx, flat)?;
        }
        Ok(())
    }

    /// Softmax cross-entropy of `z` against `labels`: (mean loss, top-1, top-5, ∂loss/∂z × the
    /// loss scale).
    pub(super) fn loss(
        &mut self,
        z: &GTensor,
        labels: &[usize],
        smoothing: f64,
        scale: f64,
    ) -> Result<(f64, usize, usize, GTensor), CudaError> {
        let rows = z.rows();
        if labels.len() != rows {
            return Err(CudaError::Check(format!(
                "{} labels for {rows} rows",
                labels.len()
            )));
        }
        let l32: Vec<i32> = labels.iter().map(|&l| l as i32).collect();
        if l32.iter().any(|&l| l < 0 || l as usize >= z.c) {
            return Err(CudaError::Check("label out of range".into()));
        }
        let lb = self.ctx.upload_buf(&l32)?;
        let grad = self.ctx.tensor(z.n, z.h, z.w, z.c)?;
        let lossb = self.ctx.alloc(8 * rows)?;
        let rankb = self.ctx.alloc(4 * rows)?;
        let (zp, lp, gp, losp, rp) = (z.ptr(), lb.ptr, grad.ptr(), lossb.ptr, rankb.ptr);
        let (ri, ki, sm, sc) = (rows as i32, z.c as i32, smoothing as f32, scale as f32);
        // SAFETY: z and grad hold rows × k f32, labels rows i32 in [0, k), loss rows f64, rank
        // rows i32.
        unsafe {
            self.ctx.launch(
                "softmax_xent",
                rows,
                &mut [
                    arg(&zp),
                    arg(&lp),
                    arg(&gp),
                    arg(&losp),
                    arg(&rp),
                    arg(&ri),
                    arg(&ki),
                    arg(&sm),
                    arg(&sc),
                ],
            )?
        };
        let losses: Vec<f64> = self.ctx.get(lossb.ptr, rows)?;
        let ranks: Vec<i32> = self.ctx.get(rankb.ptr, rows)?;
        let top1 = ranks.iter().filter(|&&r| r == 1).count();
        let top5 = ranks.iter().filter(|&&r| r <= 5).count();
        Ok((
            losses.iter().sum::<f64>() / rows.max(1) as f64,
            top1,
            top5,
            grad,
        ))
    }

    /// One training step on this rank's share of the batch: forward, loss, backward, gradient
    /// allreduce (NCCL, in buckets), loss-scale check, SGD at `lr`.
    pub fn step(
        &mut self,
        x: &Tensor<f32>,
        labels: &[usize],
        lr: f64,
        smoothing: f64,
        sgd: &crate::train::Sgd,
    ) -> Result<StepResult, CudaError> {
        self.ctx.gpu.bind()?;
        let xg = self.ctx.upload(x)?;
        let z = self.forward(xg, true)?;
        let scale = self.loss_scale.scale;
        let (loss, top1, top5, g) = self.loss(&z, labels, smoothing, scale)?;
        self.backward(&g)?;
        // The sums were queued during the backward pass, and the compute stream waits for them.
        let (comm_bytes, ranks) = self
            .sync
            .as_ref()
            .map_or((0.0, 1), |g| (g.bytes, g.nccl.ranks));
        let overflow = if self.loss_scale.dynamic {
            let flag = self.ctx.alloc(4)?;
            self.ctx.zero(flag.ptr, 4)?;
            let (gp, n, fp) = (self.flat.grads.ptr, self.flat.total as u64, flag.ptr);
            // SAFETY: the gradients hold `total` f32, flag one i32.
            unsafe {
                self.ctx.launch(
                    "nonfinite",
                    self.flat.total,
                    &mut [arg(&gp), arg(&n), arg(&fp)],
                )?
            };
            self.ctx.get::<i32>(flag.ptr, 1)?[0] != 0
        } else {
            false
        };
        let applied = self.loss_scale.update(overflow);
        if applied {
            let inv = (1.0 / (scale * ranks as f64)) as f32;
            let (lr32, mu) = (lr as f32, sgd.momentum as f32);
            for &s in &self.flat.slots {
                let wd = if s.decay || sgd.decay_all {
                    sgd.weight_decay as f32
                } else {
                    0.0
                };
                let (w, g, m, n) = (
                    self.flat.value(s),
                    self.flat.grad(s),
                    self.flat.moms.ptr + 4 * s.off as u64,
                    s.len as u64,
                );
                // SAFETY: each slot's value, gradient and momentum hold `len` f32.
                unsafe {
                    self.ctx.launch(
                        "sgd_step",
                        s.len,
                        &mut [
                            arg(&w),
                            arg(&g),
                            arg(&m),
                            arg(&n),
                            arg(&lr32),
                            arg(&mu),
                            arg(&wd),
                            arg(&inv),
                        ],
                    )?
                };
            }
        } else {
            self.skipped += 1;
        }
        self.ctx.gpu.sync()?;
        Ok(StepResult {
            loss,
            top1,
            top5,
            comm_bytes,
            applied,
        })
    }

    /// Inference logits for a batch.
    pub fn logits(&mut self, x: &Tensor<f32>) -> Result<Tensor<f32>, CudaError> {
        self.ctx.gpu.bind()?;
        let xg = self.ctx.upload(x)?;
        let z = self.forward(xg, false)?;
        self.ctx.download(&z)
    }

    /// Writes the parameters, momenta and running statistics back into `model` (checkpoints,
    /// evaluation on the CPU, the summary).
    pub fn store(&mut self, model: &mut ResNet<f32>) -> Result<(), CudaError> {
        let values: Vec<f32> = self.ctx.get(self.flat.values.ptr, self.flat.total)?;
        let moms: Vec<f32> = self.ctx.get(self.flat.moms.ptr, self.flat.total)?;
        for (p, s) in model.params().into_iter().zip(&self.flat.slots) {
            p.value = s.host_layout(&values[s.off..s.off + s.len]);
            p.momentum = s.host_layout(&moms[s.off..s.off + s.len]);
        }
        let mut bns: Vec<&GBn> = vec![&self.stem_bn];
        for b in &self.blocks {
            bns.extend([&b.b1, &b.b2, &b.b3]);
            if let Some((_, bn)) = &b.down {
                bns.push(bn);
            }
        }
        for ((_, mean, var), bn) in model.running_stats().into_iter().zip(bns) {
            mean.clone_from(&bn.running_mean);
            var.clone_from(&bn.running_var);
        }
        Ok(())
    }
}
