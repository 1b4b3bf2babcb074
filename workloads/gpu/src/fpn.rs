//! The feature pyramid's own kernels on the GPU (`kernels/cuda/fpn.cu`), beside the cuDNN
//! convolutions of its lateral and output layers: the top-down path's nearest-neighbour
//! upsampling added into the finer level, P6 as P5 subsampled by 2, and their backward passes
//! (the upsampling's as a gather: no atomics, the same bits on every run). The same functions as
//! [`roofline_models::detect::fpn::upsample`], [`roofline_models::detect::fpn::upsample_backward`] and
//! [`roofline_models::detect::fpn::subsample`].

use super::*;

impl Ctx {
    fn dims(t: &GTensor) -> [i32; 4] {
        [t.n as i32, t.h as i32, t.w as i32, t.c as i32]
    }

    /// `y += top` upsampled to `y`'s size (nearest: cell (oy, ox) takes top's
    /// (oy·top.h / y.h, ox·top.w / y.w)).
    pub fn upsample_add(&mut self, y: &GTensor, top: &GTensor) -> Result<(), CudaError> {
        if top.n != y.n || top.c != y.c {
            return Err(CudaError::Check(format!(
                "upsample_add: {}×{}×{}×{} into {}×{}×{}×{}",
                top.n, top.h, top.w, top.c, y.n, y.h, y.w, y.c
            )));
        }
        let [n, h, w, c] = Self::dims(y);
        let (th, tw) = (top.h as i32, top.w as i32);
        let (yp, tp) = (y.ptr(), top.ptr());
        // SAFETY: upsample_add(y, top, n, h, w, th, tw, c) with tensors of those shapes, alive
        // until the kernel has run.
        unsafe {
            self.launch(
                "upsample_add",
                y.len(),
                &mut [
                    arg(&yp),
                    arg(&tp),
                    arg(&n),
                    arg(&h),
                    arg(&w),
                    arg(&th),
                    arg(&tw),
                    arg(&c),
                ],
            )
        }
    }

    /// `dtop +=` the upsampling's backward pass of `dy` (each coarse cell the sum of the fine
    /// cells that copied it).
    pub fn upsample_backward_add(&mut self, dtop: &GTensor, dy: &GTensor) -> Result<(), CudaError> {
        if dtop.n != dy.n || dtop.c != dy.c {
            return Err(CudaError::Check(
                "upsample_backward_add: shapes differ".into(),
            ));
        }
        let [n, h, w, c] = Self::dims(dy);
        let (th, tw) = (dtop.h as i32, dtop.w as i32);
        let (dp, gp) = (dtop.ptr(), dy.ptr());
        // SAFETY: upsample_backward_add(dtop, dy, n, h, w, th, tw, c), tensors of those shapes.
        unsafe {
            self.launch(
                "upsample_backward_add",
                dtop.len(),
                &mut [
                    arg(&dp),
                    arg(&gp),
                    arg(&n),
                    arg(&h),
                    arg(&w),
                    arg(&th),
                    arg(&tw),
                    arg(&c),
                ],
            )
        }
    }

    /// Every other cell of `x`: P6 from P5 (n × ⌈h/2⌉ × ⌈w/2⌉ × c).
    pub fn subsample2(&mut self, x: &GTensor) -> Result<GTensor, CudaError> {
        let y = self.tensor(x.n, x.h.div_ceil(2), x.w.div_ceil(2), x.c)?;
        let [n, h, w, c] = Self::dims(x);
        let (yp, xp) = (y.ptr(), x.ptr());
        // SAFETY: subsample2(y, x, n, h, w, c); y was made for x's shape.
        unsafe {
            self.launch(
                "subsample2",
                y.len(),
                &mut [arg(&yp), arg(&xp), arg(&n), arg(&h), arg(&w), arg(&c)],
            )?;
        }
        Ok(y)
    }

    /// `dx +=` `dy` (P6's gradient) at every other cell (P5's).
    pub fn subsample2_backward_add(&mut self, dx: &GTensor, dy: &GTensor) -> Result<(), CudaError> {
        if dy.n != dx.n || dy.c != dx.c || dy.h != dx.h.div_ceil(2) || dy.w != dx.w.div_ceil(2) {
            return Err(CudaError::Check(
                "subsample2_backward_add: shapes differ".into(),
            ));
        }
        let [n, h, w, c] = Self::dims(dx);
        let (dp, gp) = (dx.ptr(), dy.ptr());
        // SAFETY: subsample2_backward_add(dx, dy, n, h, w, c), tensors of those shapes.
        unsafe {
            self.launch(
                "subsample2_backward_add",
                dy.len(),
                &mut [arg(&dp), arg(&gp), arg(&n), arg(&h), arg(&w), arg(&c)],
            )
        }
    }
}

#[cfg(test)]
mod tests {
    /// `first_fine` of fpn.cu: the first fine index copying coarse index i is ⌈i·f / t⌉, and
    /// the run up to the next one is exactly the fine cells whose source is i, for every pair
    /// of sizes the pyramid can have (the top-down upsampling's gather covers each fine cell
    /// once).
    #[test]
    fn the_gathers_runs_are_the_inverse_of_nearest_upsampling() {
        let first = |i: usize, f: usize, t: usize| (i * f).div_ceil(t);
        for t in 1..20 {
            for f in t..3 * t + 2 {
                let mut seen = vec![0; f];
                for i in 0..t {
                    let (lo, hi) = (first(i, f, t), first(i + 1, f, t).min(f));
                    for (o, s) in seen.iter_mut().enumerate().take(hi).skip(lo) {
                        assert_eq!(o * t / f, i, "f={f} t={t} o={o}");
                        *s += 1;
                    }
                }
                assert!(seen.iter().all(|s| *s == 1), "f={f} t={t}: {seen:?}");
            }
        }
    }
}
