//! Where a GPU convolution rounds, emulated on the CPU: the CPU references of `--check`
//! (`gpu/reference.rs` for the classifier, the detector's check) round as the GPU does, so a
//! GPU step is compared with a CPU step that differs from it by the order of its sums, not by
//! its precision.
//!
//! [`Rounding`] names the rounding points of one precision. [`with_conv_rounding`] runs a CPU
//! step with every convolution of the calling thread (`conv::forward_into`,
//! `backward_data_into`, `backward_data_add`, `backward_filter` on f32 data) rounded as a cuDNN
//! convolution of that precision on f32 activations (the detector's GPU layers): the operands
//! (input, filter, output gradient) read in the convolution's type, each result (output, input
//! gradient, filter gradient) written in it and widened back to f32, and an input gradient that
//! adds to another one added in f32 after its rounding.

use roofline_kernels::cuda::blas::Prec;
use roofline_kernels::cuda::Storage;
use std::cell::Cell;

/// Where a GPU step in one precision rounds.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rounding {
    /// How activations and their gradients are stored between layers (and the type the
    /// convolutions write).
    pub store: Storage,
    /// The convolutions' operands rounded to tf32 (tf32's tensor cores), storage f32.
    pub tf32: bool,
    /// Another order of sums, simulated (0: none): with seed `jitter`, each convolution result
    /// moves by a random relative u·√K·2⁻²³ (|u| ≤ 1, K the terms of its sum) and each batch
    /// norm output by u·2⁻²³ before it is stored: what a GPU's other order of f32 sums (and its
    /// fused multiply-adds) does to them. The steps of a few seeds measure how far a correct
    /// implementation with these rounding points can drift from the reference.
    pub jitter: u64,
}

impl Rounding {
    pub fn of(p: Prec) -> Rounding {
        Rounding {
            store: Storage::of(p),
            tf32: p == Prec::Tf32,
            jitter: 0,
        }
    }

    /// `v` (the results of sums of `terms` terms, told apart by `salt`) moved as another order
    /// of the sums might move them (see `jitter`); nothing without a seed.
    pub fn perturb(self, v: &mut [f32], terms: usize, salt: u64) {
        if self.jitter == 0 {
            return;
        }
        let size = (terms.max(1) as f64).sqrt() * 2f64.powi(-23);
        for (i, x) in v.iter_mut().enumerate() {
            let h = mix(self.jitter ^ mix(salt ^ mix(i as u64)));
            let u = (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            *x = (*x as f64 * (1.0 + u * size)) as f32;
        }
    }

    /// `v` as the GPU stores it (16 bits, rounded to nearest even, read back exactly).
    pub fn stored(self, v: &mut [f32]) {
        match self.store {
            Storage::F16 => v
                .iter_mut()
                .for_each(|x| *x = half::f16::from_f32(*x).to_f32()),
            Storage::Bf16 => v
                .iter_mut()
                .for_each(|x| *x = half::bf16::from_f32(*x).to_f32()),
            _ => {}
        }
    }

    /// `v` as a convolution reads it.
    pub fn operand(self, v: &[f32]) -> Vec<f32> {
        let mut o = v.to_vec();
        if self.tf32 {
            o.iter_mut().for_each(|x| *x = tf32(*x));
        } else {
            self.stored(&mut o);
        }
        o
    }
}

/// `x` rounded to tf32's 10 mantissa bits, to nearest with ties away from zero (PTX
/// `cvt.rna.tf32.f32`).
pub fn tf32(x: f32) -> f32 {
    if !x.is_finite() {
        return x;
    }
    f32::from_bits((x.to_bits() + 0x1000) & !0x1fff)
}

/// splitmix64's finaliser: a well-mixed hash of `x`.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A salt for `perturb` from a tensor's identity (its length and a pass number).
pub fn salt(what: u64, v: &[f32]) -> u64 {
    mix(what ^ ((v.len() as u64) << 8) ^ v.first().map_or(0, |x| x.to_bits() as u64) << 32)
}

thread_local! {
    /// The rounding this thread's convolutions emulate (None: none), and how many did.
    static CONV: Cell<Option<Rounding>> = const { Cell::new(None) };
    static EMULATED: Cell<u64> = const { Cell::new(0) };
}

/// Restores the thread's rounding when dropped.
pub(crate) struct Restore(Option<Rounding>);

impl Drop for Restore {
    fn drop(&mut self) {
        CONV.with(|c| c.set(self.0));
    }
}

/// `f` with this thread's convolutions rounded as `r` says (see the module's description);
/// what was in force before is restored after, even on a panic.
pub fn with_conv_rounding<R>(r: Rounding, f: impl FnOnce() -> R) -> R {
    let _restore = Restore(CONV.with(|c| c.replace(Some(r))));
    f()
}

/// `f` with no rounding emulated by this thread's convolutions (a reference that rounds them
/// itself); what was in force before is restored after.
pub fn without_conv_rounding<R>(f: impl FnOnce() -> R) -> R {
    let _restore = Restore(CONV.with(|c| c.replace(None)));
    f()
}

/// How many convolutions this thread has emulated so far (a reference checks that its step
/// did round).
pub fn emulated_convolutions() -> u64 {
    EMULATED.with(|e| e.get())
}

/// The rounding a convolution over element types `T` (results), `S` and `D` (operands) is to
/// emulate: None unless one is in force and all three are f32. While the guard lives the
/// thread has none, so that the convolution's own calls run as they are.
pub(crate) fn take<T: 'static, S: 'static, D: 'static>() -> Option<(Rounding, Restore)> {
    use std::any::TypeId;
    let f32_id = TypeId::of::<f32>();
    if [TypeId::of::<T>(), TypeId::of::<S>(), TypeId::of::<D>()]
        .iter()
        .any(|t| *t != f32_id)
    {
        return None;
    }
    let r = CONV.with(|c| c.get())?;
    EMULATED.with(|e| e.set(e.get() + 1));
    Some((r, Restore(CONV.with(|c| c.replace(None)))))
}

/// `v` (of element type `S`, which [`take`] found to be f32) as f32.
pub(crate) fn as_f32<S: 'static>(v: &[S]) -> &[f32] {
    assert_eq!(std::any::TypeId::of::<S>(), std::any::TypeId::of::<f32>());
    // SAFETY: S is f32 (asserted).
    unsafe { std::slice::from_raw_parts(v.as_ptr() as *const f32, v.len()) }
}

/// `v` (of element type `T`, f32) as mutable f32.
pub(crate) fn as_f32_mut<T: 'static>(v: &mut [T]) -> &mut [f32] {
    assert_eq!(std::any::TypeId::of::<T>(), std::any::TypeId::of::<f32>());
    // SAFETY: T is f32 (asserted).
    unsafe { std::slice::from_raw_parts_mut(v.as_mut_ptr() as *mut f32, v.len()) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conv::{self, ConvShape};

    #[test]
    fn tf32_rounds_to_ten_mantissa_bits_ties_away() {
        // 1 + 2⁻¹¹ is halfway between 1 and 1 + 2⁻¹⁰: away from zero.
        assert_eq!(tf32(1.0 + 2f32.powi(-11)), 1.0 + 2f32.powi(-10));
        assert_eq!(tf32(-(1.0 + 2f32.powi(-11))), -(1.0 + 2f32.powi(-10)));
        assert_eq!(tf32(1.0 + 2f32.powi(-12)), 1.0);
        assert_eq!(tf32(3.0), 3.0);
        assert!(tf32(f32::NAN).is_nan());
    }

    fn bf16(v: &[f32]) -> Vec<f32> {
        v.iter()
            .map(|x| half::bf16::from_f32(*x).to_f32())
            .collect()
    }

    /// Under a bf16 rounding every convolution entry point reads its operands in bf16 and
    /// writes each result in bf16 (an added input gradient rounded before the f32 sum),
    /// counts itself, and the rounding ends with the closure; without one nothing changes.
    #[test]
    fn each_convolution_rounds_as_a_gpu_convolution_in_bf16() {
        let sh = ConvShape {
            n: 2,
            c: 3,
            h: 6,
            w: 5,
            k: 4,
            r: 3,
            s: 3,
            stride: 1,
            pad: 1,
        };
        let mut rng = crate::data::Rng::new(0xB16);
        let mut rand = |n: usize| (0..n).map(|_| rng.normal() as f32).collect::<Vec<f32>>();
        let (x, w, dy, acc) = (
            rand(sh.input_len()),
            rand(sh.weight_len()),
            rand(sh.output_len()),
            rand(sh.input_len()),
        );
        let plain = |x: &[f32], w: &[f32], dy: &[f32]| {
            let mut y = vec![0.0; sh.output_len()];
            conv::forward(x, w, &mut y, &sh);
            let mut dx = vec![0.0; sh.input_len()];
            conv::backward_data(dy, w, &mut dx, &sh);
            let mut dw = vec![0.0; sh.weight_len()];
            conv::backward_filter(x, dy, &mut dw, &sh);
            let mut added = acc.clone();
            conv::backward_data_add(dy, w, &mut added, &sh);
            (y, dx, dw, added)
        };
        let r = Rounding::of(Prec::Bf16);
        let before = emulated_convolutions();
        let got = with_conv_rounding(r, || plain(&x, &w, &dy));
        assert_eq!(emulated_convolutions() - before, 4);
        // The same convolutions on the rounded operands, each result rounded.
        let (y, dx, dw, _) = plain(&bf16(&x), &bf16(&w), &bf16(&dy));
        assert_eq!(got.0, bf16(&y));
        assert_eq!(got.1, bf16(&dx));
        assert_eq!(got.2, bf16(&dw));
        let added: Vec<f32> = acc.iter().zip(bf16(&dx)).map(|(a, d)| a + d).collect();
        assert_eq!(got.3, added);
        assert_ne!(got.0, y, "the operands' rounding shows");
        // After the closure (and outside any), convolutions are the CPU's own.
        let again = plain(&x, &w, &dy);
        assert_eq!(emulated_convolutions() - before, 4);
        assert_ne!(again.0, got.0);
        // A jitter moves the results by a few f32 ulps before their rounding: some change.
        let moved = with_conv_rounding(
            Rounding {
                store: Storage::F32,
                tf32: false,
                jitter: 3,
            },
            || plain(&x, &w, &dy),
        );
        assert_ne!(moved.0, again.0);
        let d = moved
            .0
            .iter()
            .zip(&again.0)
            .map(|(a, b)| ((a - b) / b.abs().max(1e-3)).abs())
            .fold(0.0f32, f32::max);
        assert!(d < 1e-5, "{d}");
    }
}
