//! The GPU layers, one for each CPU layer of `roofline_models::layers`: a convolution on cuDNN (its
//! three directions), the elementwise kernels of `kernels/cuda/train.cu`, the bottleneck block
//! (batch norm is `bn.rs`); their parameters live in one flat device buffer (`Flat`, `Slot`).

use super::*;

/// A parameter's place in the flat value/gradient/momentum buffers.
#[derive(Clone, Copy, Debug)]
pub(super) struct Slot {
    pub(super) off: usize,
    pub(super) len: usize,
    pub(super) decay: bool,
    /// A convolution filter: (depth = r·s·c, k), stored KRSC on the GPU, RSCK on the CPU.
    pub(super) conv: Option<(usize, usize)>,
}

impl Slot {
    /// The GPU layout of a CPU parameter value (or momentum).
    pub(super) fn device_layout(self, v: &[f32]) -> Vec<f32> {
        match self.conv {
            Some((depth, k)) => rsck_to_krsc(v, depth, k),
            None => v.to_vec(),
        }
    }

    pub(super) fn host_layout(self, v: &[f32]) -> Vec<f32> {
        match self.conv {
            Some((depth, k)) => krsc_to_rsck(v, depth, k),
            None => v.to_vec(),
        }
    }
}

/// A parameter as `Flat::new` lays it out: (length, weight decay, convolution (depth, k)).
pub(super) type ParamShape = (usize, bool, Option<(usize, usize)>);

/// All parameters in three flat device buffers, so that one allreduce covers every gradient.
pub(super) struct Flat {
    pub(super) values: Buf,
    pub(super) grads: Buf,
    pub(super) moms: Buf,
    pub(super) slots: Vec<Slot>,
    pub(super) total: usize,
    /// The slots for `sgd_slots`: [offset (u64) × slots | length (u64) × slots | decays (u32)
    /// × slots].
    pub(super) table: Buf,
    /// The longest slot's length.
    pub(super) longest: usize,
    /// The values in 16 bits for mixed precision's convolutions (f16 or bf16, as the context's
    /// precision), rewritten by every optimizer step; None in f32 and tf32.
    pub(super) half: Option<(Storage, Buf)>,
}

impl Flat {
    /// Slots laid out one after the other for parameters of these lengths (CPU layout in
    /// `values` and `moms`, one per slot), uploaded in the GPU layout; gradients zeroed.
    pub(super) fn new(
        ctx: &Ctx,
        params: &[ParamShape],
        values: &[&[f32]],
        moms: &[&[f32]],
    ) -> Result<Flat, CudaError> {
        let mut slots = Vec::with_capacity(params.len());
        let (mut hv, mut hm) = (Vec::new(), Vec::new());
        for ((&(len, decay, conv), v), m) in params.iter().zip(values).zip(moms) {
            let s = Slot {
                off: hv.len(),
                len,
                decay,
                conv,
            };
            hv.extend(s.device_layout(v));
            hm.extend(s.device_layout(m));
            slots.push(s);
        }
        let total = hv.len();
        let grads = ctx.alloc(4 * total)?;
        ctx.zero(grads.ptr, 4 * total)?;
        let table = slot_table(&slots);
        // Rounded to nearest even on the host, as the optimizer's kernel rounds them later.
        let half = match Storage::of(ctx.prec) {
            Storage::F32 => None,
            dt => Some((dt, ctx.upload_buf(&narrow(dt, &hv))?)),
        };
        Ok(Flat {
            half,
            values: ctx.upload_buf(&hv)?,
            grads,
            moms: ctx.upload_buf(&hm)?,
            longest: slots.iter().map(|s| s.len).max().unwrap_or(0),
            table: ctx.upload_buf(&table)?,
            slots,
            total,
        })
    }

    pub(super) fn value(&self, s: Slot) -> u64 {
        self.values.ptr + 4 * s.off as u64
    }
    pub(super) fn grad(&self, s: Slot) -> u64 {
        self.grads.ptr + 4 * s.off as u64
    }

    /// Slot `s`'s values stored as `dt`: the f32 master values, or their 16-bit copy.
    pub(super) fn value_in(&self, s: Slot, dt: Storage) -> Result<u64, CudaError> {
        match (&self.half, dt) {
            (_, Storage::F32) => Ok(self.value(s)),
            (Some((h, b)), dt) if *h == dt => Ok(b.ptr + 2 * s.off as u64),
            _ => Err(CudaError::Check(format!(
                "no {} copy of the weights",
                dt.name()
            ))),
        }
    }
}

/// `sgd_slots`' table of `slots`: [offset (u64) × n | length (u64) × n | decays (u32) × n].
pub(super) fn slot_table(slots: &[Slot]) -> Vec<u8> {
    let mut table: Vec<u8> = Vec::with_capacity(20 * slots.len());
    table.extend(slots.iter().flat_map(|s| (s.off as u64).to_ne_bytes()));
    table.extend(slots.iter().flat_map(|s| (s.len as u64).to_ne_bytes()));
    table.extend(slots.iter().flat_map(|s| u32::from(s.decay).to_ne_bytes()));
    table
}

/// RSCK (the CPU's im2col order: depth × k) → KRSC (cuDNN's NHWC filters).
pub(super) fn rsck_to_krsc(w: &[f32], depth: usize, k: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for d in 0..depth {
        for j in 0..k {
            t[j * depth + d] = w[d * k + j];
        }
    }
    t
}

pub(super) fn krsc_to_rsck(w: &[f32], depth: usize, k: usize) -> Vec<f32> {
    let mut t = vec![0.0f32; w.len()];
    for j in 0..k {
        for d in 0..depth {
            t[d * k + j] = w[j * depth + d];
        }
    }
    t
}

/// Where a convolution's backward pass puts its data gradient.
pub(super) enum Target<'a> {
    /// Nowhere (the image: the stem's filter gradient only).
    None,
    /// A new tensor.
    New,
    /// Added to this tensor (of the input's shape, in the convolution's type).
    Add(&'a GTensor),
}

pub(super) struct GConv {
    pub(super) shape: ConvShape,
    pub(super) w: Slot,
    /// The timeline span of its passes (the CPU's layer name), when timed on its own.
    pub(super) span: Option<String>,
    pub(super) plans: Vec<((usize, usize, usize), ConvPlan)>,
    pub(super) input: Option<Rc<GTensor>>,
}

impl GConv {
    pub(super) fn new(c: &Conv2d<f32>, w: Slot) -> GConv {
        GConv {
            shape: c.shape,
            w,
            span: None,
            plans: Vec::new(),
            input: None,
        }
    }

    /// A convolution whose passes are spans of their own on the timeline (the body's).
    pub(super) fn timed(c: &Conv2d<f32>, w: Slot) -> GConv {
        GConv {
            span: Some(layer_name(&c.weight.name)),
            ..GConv::new(c, w)
        }
    }

    pub(super) fn shape_for(&self, x: &GTensor) -> ConvShape {
        ConvShape {
            n: x.n,
            h: x.h,
            w: x.w,
            ..self.shape
        }
    }

    pub(super) fn plan(&mut self, ctx: &mut Ctx, sh: &ConvShape) -> Result<usize, CudaError> {
        let key = (sh.n, sh.h, sh.w);
        if let Some(i) = self.plans.iter().position(|(k, _)| *k == key) {
            return Ok(i);
        }
        let plan = ctx.conv_plan(sh)?;
        if let Some(span) = &self.span {
            record_algorithms(span, &plan.describe());
        }
        self.plans.push((key, plan));
        Ok(self.plans.len() - 1)
    }

    /// The output, stored as `x` is. cuDNN reads and writes operands already in the
    /// convolution's type (every activation of a 16-bit ResNet) in place; f32 activations of a
    /// 16-bit convolution (the detector's, whose activations are still f32) are cast in and out.
    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: &Rc<GTensor>,
        train: bool,
    ) -> Result<GTensor, CudaError> {
        let sh = self.shape_for(x);
        let i = self.plan(ctx, &sh)?;
        let t0 = timing(ctx, &self.span)?;
        let dt = Storage::of(ctx.prec);
        let y = ctx.tensor_like(x, x.n, sh.oh(), sh.ow(), sh.k)?;
        let w = flat.value_in(self.w, dt)?;
        let (xp, _xc) = ctx.operand(x.ptr(), x.dt, dt, x.len())?;
        let yc = ctx.result_buf(&y, dt)?;
        let yp = yc.as_ref().map_or(y.ptr(), |b| b.ptr);
        let plan = &self.plans[i].1;
        let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
        plan.forward(&ctx.dnn, xp, w, yp, ws)?;
        if let Some(b) = yc {
            ctx.cast_between(dt, y.dt, b.ptr, y.ptr(), y.len())?;
        }
        if train {
            self.input = Some(Rc::clone(x));
        }
        ctx.close(FWD, || self.span.clone().unwrap_or_default(), t0)?;
        Ok(y)
    }

    /// The filter gradient into the flat gradients, and dx unless `data_grad` is false.
    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        data_grad: bool,
    ) -> Result<Option<GTensor>, CudaError> {
        let dw = flat.grad(self.w);
        self.backward_to(ctx, flat, dy, data_grad, dw)
    }

    /// `backward` with the data gradient added to `acc` (x's shape and storage: a block's
    /// shortcut gradient), which is returned: cuDNN adds it as it writes (one pass, no sum of
    /// its own) where `acc` is stored in the convolution's type, else a separate add.
    pub(super) fn backward_into(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        acc: GTensor,
    ) -> Result<GTensor, CudaError> {
        if acc.dt != Storage::of(ctx.prec) {
            let dx = self
                .backward(ctx, flat, dy, true)?
                .ok_or_else(|| CudaError::Check("no data gradient".into()))?;
            elementwise(ctx, ADD_INTO, &acc, &dx)?;
            return Ok(acc);
        }
        let t0 = timing(ctx, &self.span)?;
        let dw = flat.grad(self.w);
        self.passes_back(ctx, flat, dy, Target::Add(&acc), dw)?;
        ctx.close(BWD, || self.span.clone().unwrap_or_default(), t0)?;
        Ok(acc)
    }

    /// `backward` with the filter gradient written (overwritten) at `dw` (KRSC f32).
    pub(super) fn backward_to(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        data_grad: bool,
        dw: u64,
    ) -> Result<Option<GTensor>, CudaError> {
        let t0 = timing(ctx, &self.span)?;
        let target = if data_grad { Target::New } else { Target::None };
        let dx = self.passes_back(ctx, flat, dy, target, dw)?;
        ctx.close(BWD, || self.span.clone().unwrap_or_default(), t0)?;
        Ok(dx)
    }

    fn passes_back(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
        data: Target<'_>,
        dw: u64,
    ) -> Result<Option<GTensor>, CudaError> {
        let x = self
            .input
            .take()
            .ok_or_else(|| CudaError::Check("convolution backward before forward".into()))?;
        let sh = self.shape_for(&x);
        let i = self.plan(ctx, &sh)?;
        let dt = Storage::of(ctx.prec);
        let (xp, _xc) = ctx.operand(x.ptr(), x.dt, dt, x.len())?;
        let (dyp, _dyc) = ctx.operand(dy.ptr(), dy.dt, dt, dy.len())?;
        // cuDNN writes the filter gradient in the data's type: in 16 bits it is widened into
        // the f32 flat gradients (the optimizer's and the allreduce's), a filter's worth.
        let dwc = match dt {
            Storage::F32 => None,
            _ => Some(ctx.alloc(dt.bytes() * self.w.len)?),
        };
        let plan = &self.plans[i].1;
        let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
        plan.backward_filter(&ctx.dnn, xp, dyp, dwc.as_ref().map_or(dw, |b| b.ptr), ws)?;
        if let Some(b) = dwc {
            ctx.cast_between(dt, Storage::F32, b.ptr, dw, self.w.len)?;
        }
        let w = flat.value_in(self.w, dt)?;
        match data {
            Target::None => Ok(None),
            Target::Add(acc) => {
                if acc.dt != dt || acc.len() != x.len() {
                    return Err(CudaError::Check(
                        "a convolution's data gradient added to a tensor of another shape or type"
                            .into(),
                    ));
                }
                let plan = &self.plans[i].1;
                let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
                plan.backward_data_add(&ctx.dnn, w, dyp, acc.ptr(), ws)?;
                Ok(None)
            }
            Target::New => {
                let dx = ctx.tensor_like(&x, x.n, x.h, x.w, x.c)?;
                let dxc = ctx.result_buf(&dx, dt)?;
                let out = dxc.as_ref().map_or(dx.ptr(), |b| b.ptr);
                let plan = &self.plans[i].1;
                let ws = ctx.workspace(plan.workspace).map(|b| (b.ptr, b.bytes))?;
                plan.backward_data(&ctx.dnn, w, dyp, out, ws)?;
                if let Some(b) = dxc {
                    ctx.cast_between(dt, dx.dt, b.ptr, dx.ptr(), dx.len())?;
                }
                Ok(Some(dx))
            }
        }
    }
}

/// The cuDNN algorithms each timed convolution runs, by its span name (the latest plan's):
/// `place` names them beside the layer.
static ALGORITHMS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

fn record_algorithms(span: &str, described: &str) {
    let mut a = ALGORITHMS.lock().unwrap_or_else(|e| e.into_inner());
    a.retain(|(s, _)| s != span);
    a.push((span.to_string(), described.to_string()));
}

/// The cuDNN algorithms of the convolutions planned in this process, by layer (span) name.
pub fn conv_algorithms() -> Vec<(String, String)> {
    ALGORITHMS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A parameter's layer: its name without `.weight` (`layer1.0.conv1`), the CPU's span name.
pub(super) fn layer_name(param: &str) -> String {
    param.strip_suffix(".weight").unwrap_or(param).to_string()
}

/// The start of a layer's span when the step is timed and the layer has a span of its own.
pub(super) fn timing(ctx: &mut Ctx, span: &Option<String>) -> Result<Option<Event>, CudaError> {
    match span {
        Some(_) => ctx.mark(),
        None => Ok(None),
    }
}

/// y op= s over y's elements, in their storage: [`ADD_INTO`] (y += s), [`RELU_MASK`] (s = 0
/// where y ≤ 0: here `y` is the forward output and `s` the gradient).
pub(super) fn elementwise(
    ctx: &mut Ctx,
    k: Typed,
    y: &GTensor,
    s: &GTensor,
) -> Result<(), CudaError> {
    let dt = same_storage(k.0[0], &[y, s])?;
    if y.len() != s.len() {
        return Err(CudaError::Check(format!(
            "{}: {} and {} elements",
            k.0[0],
            y.len(),
            s.len()
        )));
    }
    let (yp, sp, n64) = (y.ptr(), s.ptr(), y.len() as u64);
    // SAFETY: both tensors hold n elements of storage dt.
    unsafe { ctx.launch(dt.kernel(k), y.len(), &mut [arg(&yp), arg(&sp), arg(&n64)]) }
}

/// y += s over `n` f32 values (gradient buffers that are no tensor).
pub(super) fn add_f32(ctx: &mut Ctx, y: u64, s: u64, n: usize) -> Result<(), CudaError> {
    let n64 = n as u64;
    // SAFETY: the caller's y and s hold n f32 each.
    unsafe {
        ctx.launch(
            Storage::F32.kernel(ADD_INTO),
            n,
            &mut [arg(&y), arg(&s), arg(&n64)],
        )
    }
}

pub(super) struct GBlock {
    pub(super) c1: GConv,
    pub(super) b1: GBn,
    pub(super) c2: GConv,
    pub(super) b2: GBn,
    pub(super) c3: GConv,
    pub(super) b3: GBn,
    pub(super) down: Option<(GConv, GBn)>,
    pub(super) a1: Option<Rc<GTensor>>,
    pub(super) a2: Option<Rc<GTensor>>,
    pub(super) out: Option<Rc<GTensor>>,
}

impl GBlock {
    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: &Rc<GTensor>,
        train: bool,
    ) -> Result<Rc<GTensor>, CudaError> {
        let t = self.c1.forward(ctx, flat, x, train)?;
        let a = Rc::new(self.b1.forward(ctx, flat, t, train, true)?);
        let t = self.c2.forward(ctx, flat, &a, train)?;
        let b = Rc::new(self.b2.forward(ctx, flat, t, train, true)?);
        let t = self.c3.forward(ctx, flat, &b, train)?;
        let shortcut = match &mut self.down {
            Some((conv, bn)) => {
                let t = conv.forward(ctx, flat, x, train)?;
                Some(bn.forward(ctx, flat, t, train, false)?)
            }
            None => None,
        };
        // The block's end in one pass: bn3, the shortcut's sum and the ReLU.
        let s = shortcut.as_ref().unwrap_or(x);
        let c = self.b3.forward_add_relu(ctx, flat, t, train, s)?;
        let out = Rc::new(c);
        if train {
            self.a1 = Some(a);
            self.a2 = Some(b);
            self.out = Some(Rc::clone(&out));
        }
        Ok(out)
    }

    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        d: GTensor,
    ) -> Result<GTensor, CudaError> {
        let missing = || CudaError::Check("block backward before forward".into());
        let out = self.out.take().ok_or_else(missing)?;
        let (a1, a2) = (
            self.a1.take().ok_or_else(missing)?,
            self.a2.take().ok_or_else(missing)?,
        );
        // bn3's backward pass applies the ReLU's mask as it reads d, and leaves d masked for
        // the shortcut.
        let t = self.b3.backward_end(ctx, flat, &d, &out)?;
        let db = self.c3.backward(ctx, flat, &t, true)?.ok_or_else(missing)?;
        let t = self.b2.backward(ctx, flat, &db, Some(&a2))?;
        let da = self.c2.backward(ctx, flat, &t, true)?.ok_or_else(missing)?;
        let t = self.b1.backward(ctx, flat, &da, Some(&a1))?;
        // The shortcut's gradient first; conv1's data gradient is then added to it as cuDNN
        // writes it (the residual sum's backward pass, with no pass of its own).
        let ds = match &mut self.down {
            Some((conv, bn)) => {
                let t = bn.backward(ctx, flat, &d, None)?;
                conv.backward(ctx, flat, &t, true)?.ok_or_else(missing)?
            }
            None => d,
        };
        self.c1.backward_into(ctx, flat, &t, ds)
    }
}

/// The GPU twin of [`roofline_models::layers::Linear`]: `y = x·W + b` for `rows × inputs` activations,
/// W stored `inputs × outputs` row-major (the CPU's layout) in the flat store, on cuBLAS; its
/// backward pass in two parts, so that the gradient exchange can take W's and b's gradients
/// before the data gradient is formed.
#[derive(Clone, Copy, Debug)]
pub(super) struct GLinear {
    pub(super) w: Slot,
    pub(super) b: Slot,
    pub(super) inputs: usize,
    pub(super) outputs: usize,
}

impl GLinear {
    /// `rows × outputs` from `x` (rows × inputs, any n·h·w = rows).
    pub(super) fn forward(
        &self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: &GTensor,
    ) -> Result<GTensor, CudaError> {
        if x.c != self.inputs {
            return Err(CudaError::Check(format!(
                "linear layer of {} inputs given {} features",
                self.inputs, x.c
            )));
        }
        let rows = x.rows();
        // Row-major y (rows × out) = x (rows × in) · W (in × out), as column-major yᵀ = Wᵀ·xᵀ.
        let y = ctx.tensor(rows, 1, 1, self.outputs)?;
        ctx.sgemm(
            false,
            false,
            self.outputs,
            rows,
            self.inputs,
            flat.value(self.w),
            self.outputs,
            x.ptr(),
            self.inputs,
            y.ptr(),
            self.outputs,
        )?;
        let (yp, bp, ny, k) = (
            y.ptr(),
            flat.value(self.b),
            y.len() as u64,
            self.outputs as i32,
        );
        // SAFETY: add_bias(y, b, n, k): y holds rows·out, b out elements.
        unsafe {
            ctx.launch(
                "add_bias",
                y.len(),
                &mut [arg(&yp), arg(&bp), arg(&ny), arg(&k)],
            )?
        };
        Ok(y)
    }

    /// W's and b's gradients (overwritten) from the forward input `x` and `dy` (rows × out).
    pub(super) fn backward_params(
        &self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: &GTensor,
        dy: &GTensor,
    ) -> Result<(), CudaError> {
        let rows = dy.rows();
        // dW (in × out) = xᵀ · dy: column-major dWᵀ = dyᵀ · x.
        ctx.sgemm(
            false,
            true,
            self.outputs,
            self.inputs,
            rows,
            dy.ptr(),
            self.outputs,
            x.ptr(),
            self.inputs,
            flat.grad(self.w),
            self.outputs,
        )?;
        let (dyp, dbp, ri, ki) = (
            dy.ptr(),
            flat.grad(self.b),
            rows as i32,
            self.outputs as i32,
        );
        // SAFETY: column_sums(dy, db, rows, k): dy holds rows × out, db out elements.
        unsafe {
            ctx.launch(
                "column_sums",
                self.outputs,
                &mut [arg(&dyp), arg(&dbp), arg(&ri), arg(&ki)],
            )
        }
    }

    /// The input's gradient (rows × in) from `dy`: dx = dy · Wᵀ.
    pub(super) fn backward_data(
        &self,
        ctx: &mut Ctx,
        flat: &Flat,
        dy: &GTensor,
    ) -> Result<GTensor, CudaError> {
        let rows = dy.rows();
        // Column-major dxᵀ = W · dyᵀ.
        let dx = ctx.tensor(rows, 1, 1, self.inputs)?;
        ctx.sgemm(
            true,
            false,
            self.inputs,
            rows,
            self.outputs,
            flat.value(self.w),
            self.outputs,
            dy.ptr(),
            self.outputs,
            dx.ptr(),
            self.inputs,
        )?;
        Ok(dx)
    }

    /// The first parameter's offset in the flat store (where the exchange's bucket ends).
    pub(super) fn first_offset(&self) -> usize {
        self.w.off.min(self.b.off)
    }
}

/// `channel_sums`' kernel for `c` channels stored as `dt`, its tiles of channels (the grid is a
/// multiple of them) and the rows a block takes at a time, as the kernels lay their 256 threads
/// out: bn_sums 32 channels by 8 rows; bn_sums_v cp = min(c / V, 32) packs of V values (16
/// bytes) by 256 / cp rows.
pub(super) fn sums_tiling(dt: Storage, c: usize) -> (&'static str, usize, usize) {
    if c.is_multiple_of(8) {
        let packs = c / (16 / dt.bytes());
        let cp = packs.min(32);
        (dt.kernel(BN_SUMS_V), packs.div_ceil(cp), 256 / cp)
    } else {
        (dt.kernel(BN_SUMS), c.div_ceil(32), 8)
    }
}

impl Ctx {
    /// Per-channel (Σ g, Σ g·b) over `rows` rows of `c` channels in f64, g = a masked by
    /// `mask` > 0 (0: no mask), b = a when 0, all three stored as `dt`: 2c f64 on the device
    /// (`bn_sums`), no host wait.
    pub(super) fn channel_sums(
        &mut self,
        dt: Storage,
        a: u64,
        b: u64,
        mask: u64,
        rows: usize,
        c: usize,
    ) -> Result<Buf, CudaError> {
        let s = self.alloc(16 * c)?;
        self.zero(s.ptr, 16 * c)?;
        // Blocks of 256 threads: a tile of channels by `rows_per` rows at a time, a channel a
        // thread (bn_sums), or a 16-byte pack of them where c is a multiple of 8 (bn_sums_v).
        let (kernel, tiles, rows_per) = sums_tiling(dt, c);
        let slices = (rows.div_ceil(rows_per)).clamp(
            1,
            ((self.gpu.sms.max(1) as usize) * 8).div_ceil(tiles).max(1),
        );
        let f = self.function(kernel)?;
        let (rows64, ci, ti) = (rows as u64, c as i32, tiles as i32);
        let (s1, s2) = (s.ptr, s.ptr + 8 * c as u64);
        // SAFETY: a, b (or 0), mask (or 0) hold rows × c of dt; s holds 2c f64; 256 threads per
        // block as the kernel assumes, and a grid that is a multiple of `tiles`.
        unsafe {
            self.gpu.launch(
                f,
                (tiles * slices) as u32,
                256,
                &mut [
                    arg(&a),
                    arg(&b),
                    arg(&mask),
                    arg(&rows64),
                    arg(&ci),
                    arg(&ti),
                    arg(&s1),
                    arg(&s2),
                ],
            )?
        };
        Ok(s)
    }

    /// A convolution's bias gradient from its output gradient `dy` (Σ over rows per channel,
    /// in f64): written at `db`, or added to it when `accumulate`.
    pub(super) fn bias_grad(
        &mut self,
        dy: &GTensor,
        db: u64,
        accumulate: bool,
    ) -> Result<(), CudaError> {
        let s = self.channel_sums(dy.dt, dy.ptr(), 0, 0, dy.rows(), dy.c)?;
        let (sp, k, acc) = (s.ptr, dy.c as i32, accumulate as i32);
        // SAFETY: bias_from_sums(s, db, k, accumulate): s holds k f64 (its first half), db k f32.
        unsafe {
            self.launch(
                "bias_from_sums",
                dy.c,
                &mut [arg(&sp), arg(&db), arg(&k), arg(&acc)],
            )
        }
    }
}
