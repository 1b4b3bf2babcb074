//! Batch norm on the GPU, the twin of `roofline_models::layers::BatchNorm`: per-channel f64 sums
//! (`bn_sums`), the statistics, running statistics and backward coefficients computed on the
//! device from them (`bn_stats`, `bn_running_stats`, `bn_backward_coefficients`), then one pass
//! to apply it (with the fused ReLU) and one for its input gradient. On one GPU nothing leaves
//! the device; across ranks the sums are summed by NCCL on the training stream where the
//! gradients go through NCCL, else on the host by the reducer ([`Across`]).

use super::*;

/// How batch norm's channel sums are summed across ranks.
pub(super) enum Across {
    /// One rank: they are the global batch's already.
    Alone,
    /// On the host, through the MPI reducer: a wait for the GPU per call.
    Host(Arc<dyn Reducer>),
    /// By NCCL, in f64, on the training stream: no wait.
    Device(Rc<Communicator>),
}

/// The kernel for `t`'s elements, scalar or by 16-byte packs (where its channels, and so its
/// rows, come in multiples of 8), and the number of items its grid strides over.
fn by_packs(t: &GTensor, scalar: Typed, packs: Typed) -> (&'static str, usize) {
    if t.c.is_multiple_of(8) {
        (t.kernel(packs), t.len() / (16 / t.dt.bytes()))
    } else {
        (t.kernel(scalar), t.len())
    }
}

impl Across {
    fn ranks(&self) -> usize {
        match self {
            Across::Alone => 1,
            Across::Host(r) => r.ranks(),
            Across::Device(c) => c.ranks,
        }
    }
}

pub(super) struct GBn {
    /// The timeline span of its passes (the CPU's layer name).
    pub(super) span: Option<String>,
    pub(super) c: usize,
    pub(super) gamma: Slot,
    pub(super) beta: Slot,
    /// The running statistics the model started with; on the device from the first pass on
    /// (`running`), read back by [`GBn::running`].
    running_mean: Vec<f32>,
    running_var: Vec<f32>,
    /// [running mean | running variance] on the device, moved by every training pass.
    running: Option<Buf>,
    pub(super) momentum: f64,
    pub(super) eps: f64,
    pub(super) input: Option<GTensor>,
    /// [mean | 1/σ] on the device, from the forward pass for the backward pass.
    pub(super) stats: Option<Buf>,
    pub(super) across: Across,
}

impl GBn {
    pub(super) fn new(
        b: &BatchNorm<f32>,
        gamma: Slot,
        beta: Slot,
        reducer: Option<Arc<dyn Reducer>>,
    ) -> GBn {
        GBn {
            span: Some(layer_name(&b.gamma.name)),
            c: b.gamma.value.len(),
            gamma,
            beta,
            running_mean: b.running_mean.clone(),
            running_var: b.running_var.clone(),
            running: None,
            momentum: b.momentum,
            eps: b.eps,
            input: None,
            stats: None,
            across: reducer.map_or(Across::Alone, Across::Host),
        }
    }

    /// Sums across ranks by NCCL on the training stream, through `comm` (the ranks of the
    /// reducer it replaces, in the same order).
    pub(super) fn sum_on_device(&mut self, comm: Rc<Communicator>) {
        self.across = Across::Device(comm);
    }

    /// The running statistics (mean, variance) as they stand (a copy from the device, after
    /// everything enqueued: one synchronisation; checkpoints and the summary, not the step).
    pub(super) fn running(&self, ctx: &Ctx) -> Result<(Vec<f32>, Vec<f32>), CudaError> {
        match &self.running {
            Some(r) => {
                let mut mean: Vec<f32> = ctx.get(r.ptr, 2 * self.c)?;
                let var = mean.split_off(self.c);
                Ok((mean, var))
            }
            None => Ok((self.running_mean.clone(), self.running_var.clone())),
        }
    }

    /// The device's running statistics, uploaded at the first pass.
    fn running_buf(&mut self, ctx: &Ctx) -> Result<u64, CudaError> {
        if self.running.is_none() {
            let both = [&self.running_mean[..], &self.running_var[..]].concat();
            self.running = Some(ctx.upload_buf(&both)?);
        }
        self.running
            .as_ref()
            .map(|r| r.ptr)
            .ok_or_else(|| CudaError::Check("batch norm running statistics".into()))
    }

    /// Per-channel [Σ g | Σ g·b] in f64 on the device, over every rank's rows (g = a masked by
    /// `mask` > 0). On one GPU nothing leaves the device; across ranks the sums go through
    /// NCCL on the training stream, or the host's reducer (a synchronisation per call).
    fn sums(
        &self,
        ctx: &mut Ctx,
        a: &GTensor,
        b: Option<&GTensor>,
        mask: Option<&GTensor>,
    ) -> Result<Buf, CudaError> {
        let mut all = vec![a];
        all.extend(b);
        all.extend(mask);
        let dt = same_storage("batch norm sums", &all)?;
        let (bp, mp) = (b.map_or(0, |t| t.ptr()), mask.map_or(0, |t| t.ptr()));
        let s = ctx.channel_sums(dt, a.ptr(), bp, mp, a.rows(), self.c)?;
        match &self.across {
            Across::Alone => {}
            Across::Host(r) => {
                let mut v: Vec<f64> = ctx.get(s.ptr, 2 * self.c)?;
                r.sum_f64(&mut v);
                ctx.put(s.ptr, &v)?;
            }
            Across::Device(comm) => {
                comm.all_reduce_sum_on(&ctx.gpu, s.ptr, 2 * self.c, Elem::F64)?;
                ctx.gpu.bind()?;
            }
        }
        Ok(s)
    }

    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: GTensor,
        train: bool,
        relu: bool,
    ) -> Result<GTensor, CudaError> {
        self.forward_plus(ctx, flat, x, train, (None, relu))
    }

    /// relu(batch norm of x + the residual `s`), in one pass over x: a block's end.
    pub(super) fn forward_add_relu(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: GTensor,
        train: bool,
        s: &GTensor,
    ) -> Result<GTensor, CudaError> {
        self.forward_plus(ctx, flat, x, train, (Some(s), true))
    }

    /// The forward pass with `residual` (a tensor of x's shape and storage) added before the
    /// ReLU (when `relu`); the output stored as x is.
    fn forward_plus(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: GTensor,
        train: bool,
        (residual, relu): (Option<&GTensor>, bool),
    ) -> Result<GTensor, CudaError> {
        if let Some(s) = residual {
            same_storage("batch norm's residual", &[&x, s])?;
            if s.len() != x.len() {
                return Err(CudaError::Check(format!(
                    "batch norm's residual: {} elements for {}",
                    s.len(),
                    x.len()
                )));
            }
        }
        let residual = residual.map_or(0, |s| s.ptr());
        let t0 = timing(ctx, &self.span)?;
        let c = self.c;
        let ranks = self.across.ranks();
        let m = (x.rows() * ranks) as f64;
        let (ci, eps) = (c as i32, self.eps);
        let running = self.running_buf(ctx)?;
        let stats = ctx.alloc(8 * c)?;
        let sp = stats.ptr;
        if train {
            let s = self.sums(ctx, &x, None, None)?;
            let (sums, momentum) = (s.ptr, self.momentum);
            // SAFETY: s holds 2c f64; stats and running 2c f32 each.
            unsafe {
                ctx.launch(
                    "bn_stats",
                    c,
                    &mut [
                        arg(&sums),
                        arg(&m),
                        arg(&eps),
                        arg(&momentum),
                        arg(&sp),
                        arg(&running),
                        arg(&ci),
                    ],
                )?
            };
        } else {
            // SAFETY: running and stats hold 2c f32 each.
            unsafe {
                ctx.launch(
                    "bn_running_stats",
                    c,
                    &mut [arg(&running), arg(&eps), arg(&sp), arg(&ci)],
                )?
            };
        }
        let y = ctx.tensor_like(&x, x.n, x.h, x.w, c)?;
        let (xp, yp, g, b) = (
            x.ptr(),
            y.ptr(),
            flat.value(self.gamma),
            flat.value(self.beta),
        );
        let (mp, ip) = (sp, sp + 4 * c as u64);
        let (n, r) = (x.len() as u64, relu as i32);
        let (kernel, items) = by_packs(&x, BN_APPLY, BN_APPLY_V);
        // SAFETY: x, y and the residual (or 0) hold n values of x's storage (a pack kernel
        // only where c, and so n, is a multiple of 8); gamma, beta, mean, inv hold c f32 each.
        unsafe {
            ctx.launch(
                kernel,
                items,
                &mut [
                    arg(&xp),
                    arg(&yp),
                    arg(&g),
                    arg(&b),
                    arg(&mp),
                    arg(&ip),
                    arg(&residual),
                    arg(&n),
                    arg(&ci),
                    arg(&r),
                ],
            )?
        };
        if train {
            self.input = Some(x);
            self.stats = Some(stats);
        }
        ctx.close(FWD, || self.span.clone().unwrap_or_default(), t0)?;
        Ok(y)
    }

    /// dx from dy (masked by `relu_out` > 0 when the forward pass applied ReLU); γ and β
    /// gradients into the flat gradients (each rank's share of the global sums, as on the CPU).
    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        relu_out: Option<&GTensor>,
    ) -> Result<GTensor, CudaError> {
        self.backward_masking(ctx, flat, dy, relu_out, false)
    }

    /// `backward` of a block's end, masked by the block's output `out` > 0, which also leaves
    /// `dy` masked in place (its buffer is written: the shortcut takes the masked gradient).
    pub(super) fn backward_end(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        out: &GTensor,
    ) -> Result<GTensor, CudaError> {
        self.backward_masking(ctx, flat, dy, Some(out), true)
    }

    fn backward_masking(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        relu_out: Option<&GTensor>,
        mask_dy: bool,
    ) -> Result<GTensor, CudaError> {
        let x = self
            .input
            .take()
            .ok_or_else(|| CudaError::Check("batch norm backward before forward".into()))?;
        let stats = self
            .stats
            .take()
            .ok_or_else(|| CudaError::Check("batch norm backward before forward".into()))?;
        if dy.len() != x.len() || relu_out.is_some_and(|t| t.len() != x.len()) {
            return Err(CudaError::Check(format!(
                "batch norm backward: a gradient of {} elements for {}",
                dy.len(),
                x.len()
            )));
        }
        let t0 = timing(ctx, &self.span)?;
        let c = self.c;
        let ranks = self.across.ranks();
        let m = (dy.rows() * ranks) as f64;
        let share = 1.0 / ranks as f64;
        let s = self.sums(ctx, dy, Some(&x), relu_out)?;
        let mask = relu_out.map_or(0, |t| t.ptr());
        let coef = ctx.alloc(8 * c)?;
        let (sums, sp, cp) = (s.ptr, stats.ptr, coef.ptr);
        let (dg, db) = (flat.grad(self.gamma), flat.grad(self.beta));
        let ci = c as i32;
        // SAFETY: s holds 2c f64; stats and coef 2c f32; the γ and β gradients c f32 each.
        unsafe {
            ctx.launch(
                "bn_backward_coefficients",
                c,
                &mut [
                    arg(&sums),
                    arg(&sp),
                    arg(&m),
                    arg(&share),
                    arg(&dg),
                    arg(&db),
                    arg(&cp),
                    arg(&ci),
                ],
            )?
        };
        let dx = ctx.tensor_like(dy, dy.n, dy.h, dy.w, c)?;
        let (dyp, xp, dxp, g) = (dy.ptr(), x.ptr(), dx.ptr(), flat.value(self.gamma));
        let (mp, ip) = (sp, sp + 4 * c as u64);
        let (mdb, mdg) = (cp, cp + 4 * c as u64);
        let n = dy.len() as u64;
        let masked_out = if mask_dy && mask != 0 { dyp } else { 0 };
        // SAFETY: dy, x, mask (or 0), dx hold n values of one storage (`sums` checked it), the
        // masked output (or 0) is dy's own buffer, which each thread rewrites only at the
        // element it has read; the per-channel vectors c f32 each.
        let (kernel, items) = by_packs(dy, BN_BACKWARD_DX, BN_BACKWARD_DX_V);
        unsafe {
            ctx.launch(
                kernel,
                items,
                &mut [
                    arg(&dyp),
                    arg(&xp),
                    arg(&mask),
                    arg(&dxp),
                    arg(&masked_out),
                    arg(&g),
                    arg(&mp),
                    arg(&ip),
                    arg(&mdb),
                    arg(&mdg),
                    arg(&n),
                    arg(&ci),
                ],
            )?
        };
        ctx.close(BWD, || self.span.clone().unwrap_or_default(), t0)?;
        Ok(dx)
    }
}

/// Writes the running statistics of `bns` (read from the device) into `stats`, the CPU model's
/// in the same order: checkpoints, evaluation on the CPU, the summary.
pub(super) fn store_running<'a>(
    ctx: &Ctx,
    stats: roofline_models::checkpoint::RunningStats<'_, f32>,
    bns: impl IntoIterator<Item = &'a GBn>,
) -> Result<(), CudaError> {
    let bns: Vec<&GBn> = bns.into_iter().collect();
    if stats.len() != bns.len() {
        return Err(CudaError::Check(format!(
            "{} running statistics for {} batch norms",
            stats.len(),
            bns.len()
        )));
    }
    for ((_, mean, var), bn) in stats.into_iter().zip(bns) {
        let (m, v) = bn.running(ctx)?;
        *mean = m;
        *var = v;
    }
    Ok(())
}
