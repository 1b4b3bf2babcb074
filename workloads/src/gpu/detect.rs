//! The detector's layers on the GPU, the twins of `crate::detect`'s: the box head and predictor
//! (two fully connected layers with ReLU, class logits, class-specific deltas) on cuBLAS, with
//! the CPU's parameter names and order, so that a checkpoint moves between devices.

use super::*;

/// The GPU twin of [`crate::detect::head::BoxHead`]: fc6 and fc7 with ReLU, then `cls` and
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
        cpu: &crate::detect::head::BoxHead<f32>,
        slots: &[Slot],
    ) -> Result<GBoxHead, CudaError> {
        if slots.len() != 8 {
            return Err(CudaError::Check(format!(
                "the box head has 8 parameters, {} slots were given",
                slots.len()
            )));
        }
        let lin = |l: &crate::layers::Linear<f32>, i: usize| GLinear {
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
        elementwise(ctx, "add_into", d7.ptr(), d7b.ptr(), d7.len())?;
        elementwise(ctx, "relu_mask", h7.ptr(), d7.ptr(), d7.len())?;
        self.fc7.backward_params(ctx, flat, &h6, &d7)?;
        let d6 = self.fc7.backward_data(ctx, flat, &d7)?;
        elementwise(ctx, "relu_mask", h6.ptr(), d6.ptr(), d6.len())?;
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
