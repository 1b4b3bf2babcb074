//! The detector's layers on the GPU, the twins of `roofline_models::detect`'s: the box head and predictor
//! (two fully connected layers with ReLU, class logits, class-specific deltas) on cuBLAS, with
//! the CPU's parameter names and order, so that a checkpoint moves between devices.

use super::*;

/// The GPU twin of [`roofline_models::detect::head::BoxHead`]: fc6 and fc7 with ReLU, then `cls` and
/// `reg`; its parameters are 8 slots of a flat store in the CPU's order (each layer's weight,
/// then bias: fc6, fc7, cls, reg).
pub struct GBoxHead {
    pub(super) fc6: GLinear,
    pub(super) fc7: GLinear,
    pub(super) cls: GLinear,
    pub(super) reg: GLinear,
    input: Option<GTensor>,
    h6: Option<GTensor>,
    h7: Option<GTensor>,
}

impl GBoxHead {
    /// The head over `slots` (8, in the CPU's parameter order) of a flat store holding `cpu`'s
    /// parameters.
    pub(super) fn new(
        cpu: &roofline_models::detect::head::BoxHead<f32>,
        slots: &[Slot],
    ) -> Result<GBoxHead, CudaError> {
        if slots.len() != 8 {
            return Err(CudaError::Check(format!(
                "the box head has 8 parameters, {} slots were given",
                slots.len()
            )));
        }
        let lin = |l: &roofline_models::layers::Linear<f32>, i: usize| GLinear {
            w: slots[i],
            b: slots[i + 1],
            inputs: l.inputs,
            outputs: l.outputs,
        };
        Ok(GBoxHead {
            fc6: lin(&cpu.fc6, 0),
            fc7: lin(&cpu.fc7, 2),
            cls: lin(&cpu.cls, 4),
            reg: lin(&cpu.reg, 6),
            input: None,
            h6: None,
            h7: None,
        })
    }

    /// (class logits R × K, deltas R × 4K) for R regions' flattened features `x` (R rows of
    /// `fc6.inputs`: RoIAlign's R × 7 × 7 × C output as it is).
    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: GTensor,
    ) -> Result<(GTensor, GTensor), CudaError> {
        // RoIAlign's R × 7 × 7 × C is R rows of 49·C features in NHWC order, the CPU's flattening.
        let x = GTensor {
            h: 1,
            w: 1,
            c: x.h * x.w * x.c,
            ..x
        };
        let h6 = self.fc6.forward(ctx, flat, &x)?;
        ctx.relu(&h6)?;
        let h7 = self.fc7.forward(ctx, flat, &h6)?;
        ctx.relu(&h7)?;
        let out = (
            self.cls.forward(ctx, flat, &h7)?,
            self.reg.forward(ctx, flat, &h7)?,
        );
        self.input = Some(x);
        self.h6 = Some(h6);
        self.h7 = Some(h7);
        Ok(out)
    }

    /// The parameters' gradients (overwritten) from the outputs' gradients; returns the
    /// features' gradient (R rows of `fc6.inputs`).
    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        dcls: &GTensor,
        dreg: &GTensor,
    ) -> Result<GTensor, CudaError> {
        let missing = || CudaError::Check("box head backward before a forward pass".into());
        let x = self.input.take().ok_or_else(missing)?;
        let h6 = self.h6.take().ok_or_else(missing)?;
        let h7 = self.h7.take().ok_or_else(missing)?;
        self.cls.backward_params(ctx, flat, &h7, dcls)?;
        self.reg.backward_params(ctx, flat, &h7, dreg)?;
        let d7 = self.cls.backward_data(ctx, flat, dcls)?;
        let d7b = self.reg.backward_data(ctx, flat, dreg)?;
        if d7.len() != d7b.len() || h7.len() != d7.len() {
            return Err(CudaError::Check("box head: hidden sizes differ".into()));
        }
        elementwise(ctx, ADD_INTO, &d7, &d7b)?;
        elementwise(ctx, RELU_MASK, &h7, &d7)?;
        self.fc7.backward_params(ctx, flat, &h6, &d7)?;
        let d6 = self.fc7.backward_data(ctx, flat, &d7)?;
        elementwise(ctx, RELU_MASK, &h6, &d6)?;
        self.fc6.backward_params(ctx, flat, &x, &d6)?;
        self.fc6.backward_data(ctx, flat, &d6)
    }
}

impl Ctx {
    /// `y = max(y, 0)` in place.
    pub(super) fn relu(&mut self, y: &GTensor) -> Result<(), CudaError> {
        let (p, n) = (y.ptr(), y.len() as u64);
        // SAFETY: relu(y, n): y holds n floats.
        unsafe { self.launch("relu", y.len(), &mut [arg(&p), arg(&n)]) }
    }
}

/// The GPU twin of [`roofline_models::detect::rpn::SharedConv`]: one filter and bias that several inputs
/// (the pyramid's levels) share; each input's filter and bias gradients are added up.
pub(super) struct GShared {
    pub(super) conv: GConv,
    pub(super) b: Slot,
    /// The inputs of the training forward passes, by level.
    pub(super) inputs: Vec<Rc<GTensor>>,
}

impl GShared {
    pub(super) fn new(
        cpu: &roofline_models::detect::rpn::SharedConv<f32>,
        w: Slot,
        b: Slot,
    ) -> GShared {
        GShared {
            conv: GConv {
                shape: cpu.shape,
                w,
                plans: Vec::new(),
                input: None,
                span: None,
            },
            b,
            inputs: Vec::new(),
        }
    }

    /// `x ⊛ W + b`; a training pass keeps `x` as the next level's input.
    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        x: &Rc<GTensor>,
        train: bool,
    ) -> Result<GTensor, CudaError> {
        let y = self.conv.forward(ctx, flat, x, false)?;
        let (yp, bp, n, k) = (y.ptr(), flat.value(self.b), y.len() as u64, y.c as i32);
        // SAFETY: add_bias(y, b, n, k): y holds n f32 with k channels, b k.
        unsafe {
            ctx.launch(
                "add_bias",
                y.len(),
                &mut [arg(&yp), arg(&bp), arg(&n), arg(&k)],
            )?
        };
        if train {
            self.inputs.push(Rc::clone(x));
        }
        Ok(y)
    }

    /// Level `level`'s backward pass: its filter and bias gradients written (`first`) or added
    /// to the others'; returns its input's gradient.
    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        level: usize,
        dy: &GTensor,
        first: bool,
    ) -> Result<GTensor, CudaError> {
        let x = self.inputs.get(level).cloned().ok_or_else(|| {
            CudaError::Check(format!("shared convolution: no input of level {level}"))
        })?;
        self.conv.input = Some(x);
        let missing = || CudaError::Check("shared convolution: no data gradient".into());
        let dx = if first {
            let dw = flat.grad(self.conv.w);
            self.conv.backward_to(ctx, flat, dy, true, dw)?
        } else {
            // cuDNN overwrites the filter gradient: this level's goes to a scratch buffer first.
            let tmp = ctx.alloc(4 * self.conv.w.len)?;
            let dx = self.conv.backward_to(ctx, flat, dy, true, tmp.ptr)?;
            add_f32(ctx, flat.grad(self.conv.w), tmp.ptr, self.conv.w.len)?;
            dx
        };
        ctx.bias_grad(dy, flat.grad(self.b), !first)?;
        dx.ok_or_else(missing)
    }
}

/// The GPU twin of [`roofline_models::detect::rpn::RpnHead`]: a 3×3 convolution with ReLU, then 1×1
/// convolutions to the objectness logits and box deltas, shared by every level; parameters in
/// the CPU's order (conv, cls_logits, bbox_pred: weight, bias each).
pub(super) struct GRpn {
    pub(super) conv: GShared,
    pub(super) cls: GShared,
    pub(super) reg: GShared,
}

impl GRpn {
    pub(super) fn new(
        cpu: &roofline_models::detect::rpn::RpnHead<f32>,
        slots: &[Slot],
    ) -> Result<GRpn, CudaError> {
        if slots.len() != 6 {
            return Err(CudaError::Check(format!(
                "the RPN head has 6 parameters, {} slots were given",
                slots.len()
            )));
        }
        Ok(GRpn {
            conv: GShared::new(&cpu.conv, slots[0], slots[1]),
            cls: GShared::new(&cpu.cls, slots[2], slots[3]),
            reg: GShared::new(&cpu.reg, slots[4], slots[5]),
        })
    }

    /// Per level: (objectness logits n·h·w·A, deltas n·h·w·4A).
    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        levels: &[Rc<GTensor>],
        train: bool,
    ) -> Result<Vec<(GTensor, GTensor)>, CudaError> {
        for c in [&mut self.conv, &mut self.cls, &mut self.reg] {
            c.inputs.clear();
        }
        let mut out = Vec::with_capacity(levels.len());
        for p in levels {
            let h = self.conv.forward(ctx, flat, p, train)?;
            ctx.relu(&h)?;
            let h = Rc::new(h);
            out.push((
                self.cls.forward(ctx, flat, &h, train)?,
                self.reg.forward(ctx, flat, &h, train)?,
            ));
        }
        Ok(out)
    }

    /// The head's gradients (over every level) from the outputs' gradients; returns each
    /// level's input gradient.
    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        grads: &[(GTensor, GTensor)],
    ) -> Result<Vec<GTensor>, CudaError> {
        if grads.len() != self.conv.inputs.len() {
            return Err(CudaError::Check(format!(
                "RPN backward: {} levels of gradients, {} forward",
                grads.len(),
                self.conv.inputs.len()
            )));
        }
        let mut dx = Vec::with_capacity(grads.len());
        for (l, (go, gd)) in grads.iter().enumerate() {
            let first = l == 0;
            let dh = self.cls.backward(ctx, flat, l, go, first)?;
            let d2 = self.reg.backward(ctx, flat, l, gd, first)?;
            elementwise(ctx, ADD_INTO, &dh, &d2)?;
            let h = Rc::clone(&self.cls.inputs[l]);
            elementwise(ctx, RELU_MASK, &h, &dh)?;
            dx.push(self.conv.backward(ctx, flat, l, &dh, first)?);
        }
        for c in [&mut self.conv, &mut self.cls, &mut self.reg] {
            c.inputs.clear();
        }
        Ok(dx)
    }
}

/// The GPU twin of [`roofline_models::detect::fpn::Fpn`]: lateral 1×1 and output 3×3 convolutions
/// (cuDNN), the top-down nearest upsampling with adds and P6 (`fpn.cu`); parameters in the
/// CPU's order (lateral 0–3, then output 0–3).
pub(super) struct GFpn {
    pub(super) lateral: Vec<GConv>,
    pub(super) output: Vec<GConv>,
}

impl GFpn {
    pub(super) fn new(
        cpu: &roofline_models::detect::fpn::Fpn<f32>,
        slots: &[Slot],
    ) -> Result<GFpn, CudaError> {
        if slots.len() != 8 || cpu.lateral.len() != 4 || cpu.output.len() != 4 {
            return Err(CudaError::Check(format!(
                "the pyramid has 8 parameters, {} slots were given",
                slots.len()
            )));
        }
        Ok(GFpn {
            lateral: (0..4)
                .map(|i| GConv::new(&cpu.lateral[i], slots[i]))
                .collect(),
            output: (0..4)
                .map(|i| GConv::new(&cpu.output[i], slots[4 + i]))
                .collect(),
        })
    }

    /// P2–P6 from C2–C5.
    pub(super) fn forward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        c: &[Rc<GTensor>],
        train: bool,
    ) -> Result<Vec<Rc<GTensor>>, CudaError> {
        if c.len() != 4 {
            return Err(CudaError::Check("the pyramid takes C2–C5".into()));
        }
        let mut top: Option<Rc<GTensor>> = None;
        let mut p = Vec::with_capacity(5);
        for i in (0..4).rev() {
            let l = self.lateral[i].forward(ctx, flat, &c[i], train)?;
            if let Some(t) = &top {
                ctx.upsample_add(&l, t)?;
            }
            let l = Rc::new(l);
            p.push(Rc::new(self.output[i].forward(ctx, flat, &l, train)?));
            top = Some(l);
        }
        p.reverse();
        let p6 = ctx.subsample2(&p[3])?;
        p.push(Rc::new(p6));
        Ok(p)
    }

    /// The parameters' gradients from those of P2–P6; returns those of C2–C5.
    pub(super) fn backward(
        &mut self,
        ctx: &mut Ctx,
        flat: &Flat,
        mut dp: Vec<GTensor>,
    ) -> Result<Vec<GTensor>, CudaError> {
        let missing = || CudaError::Check("pyramid backward before a forward pass".into());
        if dp.len() != 5 {
            return Err(CudaError::Check("the pyramid's gradients: P2–P6".into()));
        }
        let d6 = dp.pop().ok_or_else(missing)?;
        ctx.subsample2_backward_add(&dp[3], &d6)?;
        let mut dsum = Vec::with_capacity(4);
        for (conv, d) in self.output.iter_mut().zip(&dp) {
            dsum.push(conv.backward(ctx, flat, d, true)?.ok_or_else(missing)?);
        }
        // Each level's sum also fed the next finer one, upsampled: from the finest up, each
        // finished gradient goes to the coarser level before that one is used.
        for i in 0..3 {
            ctx.upsample_backward_add(&dsum[i + 1], &dsum[i])?;
        }
        let mut dc = Vec::with_capacity(4);
        for (conv, d) in self.lateral.iter_mut().zip(&dsum) {
            dc.push(conv.backward(ctx, flat, d, true)?.ok_or_else(missing)?);
        }
        Ok(dc)
    }
}
