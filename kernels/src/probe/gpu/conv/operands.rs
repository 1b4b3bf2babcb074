//! A convolution's operands on the device and the check of its output against f64 sums: the
//! probe's and the trainer's searches' (`ConvPlan::measured`).

use super::reference::{decode, out_len, reference, Operand};
use crate::cpu::conv::ConvShape;
use crate::cuda::blas::{GemmPrec, Prec};
use crate::cuda::device::{DevBuf, Gpu};
use crate::cuda::dnn::{Dir, DIRECTIONS};
use crate::cuda::CudaError;
use std::cell::OnceCell;

/// A convolution's operands on the device — counter-based values ([`Operand`]: element `i`
/// a function of the seed and `i`, never zero, exact in the precision) — and the check of any
/// direction's output against f64 sums of 24 of its entries on the CPU: the probe's check of
/// every method it times, and the trainer's of every method its search adopts
/// (`ConvPlan::measured`), each at its own shape.
pub struct ConvOperands {
    x: DevBuf,
    w: DevBuf,
    dy: DevBuf,
    /// The output: the largest of y, dx and dw.
    y: DevBuf,
    hx: Operand,
    hw: Operand,
    hdy: Operand,
    shape: ConvShape,
    p: Prec,
    /// Each direction's reference entries, made the first time its output is checked.
    refs: [OnceCell<Vec<(usize, f64, f64)>>; 3],
}

impl ConvOperands {
    /// `s`'s operands in `p` on `gpu`, x, w and dy from seeds `seed`, `seed + 1`, `seed + 2`.
    pub fn new(gpu: &Gpu, s: &ConvShape, p: Prec, seed: u64) -> Result<ConvOperands, CudaError> {
        let (hx, hw, hdy) = (
            Operand { seed, p },
            Operand { seed: seed + 1, p },
            Operand { seed: seed + 2, p },
        );
        let out_bytes = DIRECTIONS.iter().map(|d| out_len(s, *d)).max().unwrap_or(0) * p.in_bytes();
        Ok(ConvOperands {
            x: gpu.upload(&hx.bytes(s.n * s.h * s.w * s.c))?,
            w: gpu.upload(&hw.bytes(s.k * s.r * s.s * s.c))?,
            dy: gpu.upload(&hdy.bytes(s.n * s.oh() * s.ow() * s.k))?,
            y: gpu.alloc(out_bytes)?,
            hx,
            hw,
            hdy,
            shape: *s,
            p,
            refs: Default::default(),
        })
    }

    /// x, w, dy and the output, as `ConvPlan::measured` takes them.
    pub fn ptrs(&self) -> [u64; 4] {
        [self.x.ptr, self.w.ptr, self.dy.ptr, self.y.ptr]
    }

    /// A direction's operands as `execute` and the search take them (the output last).
    pub fn operands(&self, dir: Dir) -> [u64; 3] {
        match dir {
            Dir::Fwd => [self.x.ptr, self.w.ptr, self.y.ptr],
            Dir::BwdData => [self.w.ptr, self.dy.ptr, self.y.ptr],
            Dir::BwdFilter => [self.x.ptr, self.dy.ptr, self.y.ptr],
        }
    }

    /// The worst normwise error of `dir`'s output over its reference entries (each read back
    /// alone), or why it is wrong: an entry beyond the precision's tolerance, or not a number.
    pub fn check(&self, gpu: &Gpu, dir: Dir) -> Result<f64, String> {
        let di = DIRECTIONS.iter().position(|d| *d == dir).unwrap_or(0);
        let refs = self.refs[di].get_or_init(|| self.references(dir));
        let e = self.p.in_bytes();
        let mut worst = 0.0f64;
        for &(idx, want, abs) in refs {
            // SAFETY: `y` holds the direction's whole output, and idx < its length.
            let bytes: Vec<u8> = unsafe { gpu.copy_out(self.y.ptr + (idx * e) as u64, e) }
                .map_err(|err| err.to_string())?;
            let g = decode(self.p, &bytes, 0);
            let err = (g - want).abs() / abs.max(1e-30);
            worst = worst.max(err);
            if err.is_nan() || err > self.p.tolerance() {
                return Err(format!(
                    "element {idx}: GPU {g}, reference {want} (normwise error {err:.2e})"
                ));
            }
        }
        Ok(worst)
    }

    /// 24 entries of a direction's output: (index, the f64 reference, Σ|terms|), computed in
    /// parallel (a backward-filter entry at batch 128 sums millions of terms).
    fn references(&self, dir: Dir) -> Vec<(usize, f64, f64)> {
        use rayon::prelude::*;
        let s = &self.shape;
        let len = out_len(s, dir);
        let (hx, hw, hdy) = (self.hx, self.hw, self.hdy);
        (0..24usize)
            .into_par_iter()
            .map(|j| {
                let idx = (j * 2_654_435_761usize) % len;
                let (want, abs) =
                    reference(s, &|i| hx.at(i), &|i| hw.at(i), &|i| hdy.at(i), dir, idx);
                (idx, want, abs)
            })
            .collect()
    }
}
