//! `mma.sync`'s layout check. The peak kernels (`kernels/cuda/mma.cu`, `mma_fp8.cu`) give every
//! register of every lane the same value, so their check holds whatever the fragment layout:
//! a wrong fragment, packing or transposition could not show in it. Beside each peak kernel its
//! layout kernel (`mma_layout_*`) runs one mma of the same instruction on registers the host
//! fills here from matrices of distinct small values by PTX's fragment layouts (ISA, "Matrix
//! Fragments for mma.m16n8k*"), and writes each lane's four D elements out; the host compares
//! them with A × B in f64. The same fragments, read back on the CPU, are the model the tests
//! mutate.

use super::wgmma_layout::{value, Elem};
use crate::cuda::device::{arg, Gpu};
use crate::cuda::CudaError;

/// The instruction's M and N (m16n8k*).
const M: usize = 16;
const N: usize = 8;

/// One mma shape's fragments: its element type and K.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Frag {
    pub(super) e: Elem,
    pub(super) k: usize,
}

impl Frag {
    pub(super) fn of(kernel: &str) -> Option<Frag> {
        let (e, k) = match kernel {
            "mma_f16" => (Elem::F16, 16),
            "mma_bf16" => (Elem::Bf16, 16),
            "mma_tf32" => (Elem::Tf32, 8),
            "mma_int8" => (Elem::S8, 32),
            "mma_fp8" => (Elem::E4m3, 32),
            _ => return None,
        };
        Some(Frag { e, k })
    }

    /// Elements a 32-bit register packs.
    fn per_reg(&self) -> usize {
        4 / self.e.bytes()
    }

    /// (row, k) of element `i` of lane `lane`'s A fragment (16 × K, row-major); elements are
    /// packed into the four registers in order, the first in the low bits.
    pub(super) fn a(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        match self.per_reg() {
            // m16n8k16 (f16, bf16): 8 elements.
            2 => (g + 8 * ((i / 2) % 2), 2 * t + (i & 1) + 8 * (i / 4)),
            // m16n8k8 (tf32): 4 elements.
            1 => (g + 8 * (i % 2), t + 4 * (i / 2)),
            // m16n8k32 (s8, e4m3): 16 elements.
            _ => (g + 8 * ((i / 4) % 2), 4 * t + (i & 3) + 16 * (i / 8)),
        }
    }

    /// (k, column) of element `i` of lane `lane`'s B fragment (K × 8, "col": column-major).
    pub(super) fn b(&self, lane: usize, i: usize) -> (usize, usize) {
        let (g, t) = (lane / 4, lane % 4);
        match self.per_reg() {
            2 => (2 * t + (i & 1) + 8 * (i / 2), g),
            1 => (t + 4 * i, g),
            _ => (4 * t + (i & 3) + 16 * (i / 4), g),
        }
    }

    /// (row, column) of element `i` of lane `lane`'s D fragment (16 × 8).
    pub(super) fn d(lane: usize, i: usize) -> (usize, usize) {
        (lane / 4 + 8 * (i / 2), 2 * (lane % 4) + (i & 1))
    }

    /// Lane `lane`'s registers: four of A, two of B, each element `val`'s at its place.
    pub(super) fn registers(
        &self,
        lane: usize,
        a: &dyn Fn(usize, usize) -> i32,
        b: &dyn Fn(usize, usize) -> i32,
    ) -> ([u32; 4], [u32; 2]) {
        let (per, bits) = (self.per_reg(), 8 * self.e.bytes() as u32);
        let mut ra = [0u32; 4];
        let mut rb = [0u32; 2];
        for i in 0..4 * per {
            let (r, c) = self.a(lane, i);
            ra[i / per] |= self.e.encode(a(r, c)) << (bits * (i % per) as u32);
        }
        for i in 0..2 * per {
            let (k, n) = self.b(lane, i);
            rb[i / per] |= self.e.encode(b(k, n)) << (bits * (i % per) as u32);
        }
        (ra, rb)
    }

    /// The CPU model: A and B read back from every lane's registers through the fragments,
    /// then D = A × B (16 × 8, row-major).
    pub(super) fn model(&self, regs: &[([u32; 4], [u32; 2])]) -> Vec<f64> {
        let (per, bits) = (self.per_reg(), 8 * self.e.bytes() as u32);
        let mask = if bits == 32 {
            u32::MAX
        } else {
            (1 << bits) - 1
        };
        let mut a = vec![0.0; M * self.k];
        let mut b = vec![0.0; self.k * N];
        for (lane, (ra, rb)) in regs.iter().enumerate() {
            for i in 0..4 * per {
                let (r, c) = self.a(lane, i);
                a[r * self.k + c] = self
                    .e
                    .decode((ra[i / per] >> (bits * (i % per) as u32)) & mask);
            }
            for i in 0..2 * per {
                let (k, n) = self.b(lane, i);
                b[k * N + n] = self
                    .e
                    .decode((rb[i / per] >> (bits * (i % per) as u32)) & mask);
            }
        }
        let mut d = vec![0.0; M * N];
        for m in 0..M {
            for n in 0..N {
                d[m * N + n] = (0..self.k).map(|c| a[m * self.k + c] * b[c * N + n]).sum();
            }
        }
        d
    }

    /// A × B from the values: A(m, k) = value(0, m, k), B(k, n) = value(1, n, k).
    pub(super) fn product(&self) -> Vec<f64> {
        let mut d = vec![0.0; M * N];
        for m in 0..M {
            for n in 0..N {
                d[m * N + n] = (0..self.k)
                    .map(|c| f64::from(value(0, m, c) * value(1, n, c)))
                    .sum();
            }
        }
        d
    }

    /// Every lane's registers of the distinct values.
    pub(super) fn all_registers(&self) -> Vec<([u32; 4], [u32; 2])> {
        (0..32)
            .map(|l| self.registers(l, &|m, c| value(0, m, c), &|c, n| value(1, n, c)))
            .collect()
    }
}

/// The first lane's D element (lane-major: lane l's element i at 4·l + i) that differs from
/// `want`.
pub(super) fn compare(out: &[f64], want: &[f64]) -> Result<(), String> {
    if out.len() != 128 {
        return Err(format!("{} D elements, not 128", out.len()));
    }
    for (j, &got) in out.iter().enumerate() {
        let (r, c) = Frag::d(j / 4, j % 4);
        if got != want[r * N + c] {
            return Err(format!(
                "lane {} element {} (D[{r}][{c}]): GPU {got}, A x B {}",
                j / 4,
                j % 4,
                want[r * N + c]
            ));
        }
    }
    Ok(())
}

/// `kernel`'s layout kernel on `gpu`: one mma on distinct values, every lane's D against A × B.
pub(super) fn check_mma_layout(
    gpu: &mut Gpu,
    kernel: &str,
    int: bool,
) -> Result<String, CudaError> {
    let frag = Frag::of(kernel)
        .ok_or_else(|| CudaError::Check(format!("no layout check for {kernel}")))?;
    let layout_kernel = kernel.replace("mma_", "mma_layout_");
    let f = gpu.function(&layout_kernel)?;
    let regs = frag.all_registers();
    let want = frag.model(&regs);
    if want != frag.product() {
        return Err(CudaError::Check(format!(
            "{layout_kernel}: the fragment model does not give A x B on the host"
        )));
    }
    let a: Vec<u32> = regs.iter().flat_map(|r| r.0).collect();
    let b: Vec<u32> = regs.iter().flat_map(|r| r.1).collect();
    let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let out = gpu.alloc(128 * 4)?;
    // SAFETY: out holds 32 lanes × 4 elements, a 32 × 4 and b 32 × 2 registers; one warp.
    unsafe { gpu.launch(f, 1, 32, &mut [arg(&out.ptr), arg(&da.ptr), arg(&db.ptr)]) }?;
    gpu.sync()?;
    let got = super::peaks::download_f64(gpu, &out, int)?;
    compare(&got, &want).map_err(|why| {
        CudaError::Check(format!(
            "{layout_kernel}: the fragments are not the model's: {why}"
        ))
    })?;
    Ok("layout checked: one mma on distinct values equals A x B in every lane".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KERNELS: [&str; 5] = ["mma_f16", "mma_bf16", "mma_tf32", "mma_int8", "mma_fp8"];

    /// Each fragment covers its matrix, every element once.
    #[test]
    fn every_fragment_is_a_bijection_onto_its_matrix() {
        for k in KERNELS {
            let f = Frag::of(k).unwrap();
            let per = f.per_reg();
            let mut a = vec![0; M * f.k];
            let mut b = vec![0; f.k * N];
            let mut d = vec![0; M * N];
            for lane in 0..32 {
                for i in 0..4 * per {
                    let (r, c) = f.a(lane, i);
                    a[r * f.k + c] += 1;
                }
                for i in 0..2 * per {
                    let (kk, n) = f.b(lane, i);
                    b[kk * N + n] += 1;
                }
                for i in 0..4 {
                    let (r, c) = Frag::d(lane, i);
                    d[r * N + c] += 1;
                }
            }
            assert!(a.iter().chain(&b).chain(&d).all(|&n| n == 1), "{k}");
        }
    }

    /// The right fragments give A × B; a transposed A, B read row-major, A's registers rotated
    /// or A's packing reversed each give another D on distinct values, while on the peak
    /// kernels' uniform values every one of them gives the same closed form.
    #[test]
    fn a_wrong_fragment_shows_on_distinct_values_and_hides_on_uniform_ones() {
        for k in KERNELS {
            let f = Frag::of(k).unwrap();
            let regs = f.all_registers();
            assert_eq!(f.model(&regs), f.product(), "{k}");
            let uniform: Vec<_> = (0..32)
                .map(|l| f.registers(l, &|_, _| 1, &|_, _| 2))
                .collect();
            let closed = f.model(&uniform);
            assert!(closed.iter().all(|&x| x == 2.0 * f.k as f64), "{k}");
            type Mutation = Box<dyn Fn(usize, ([u32; 4], [u32; 2])) -> ([u32; 4], [u32; 2])>;
            let bits = 8 * f.e.bytes() as u32;
            let mutations: Vec<(&str, Mutation)> = vec![
                (
                    "A transposed",
                    Box::new(move |l, _| {
                        f.registers(l, &|m, c| value(0, c % M, m + M * (c / M)), &|c, n| {
                            value(1, n, c)
                        })
                    }),
                ),
                (
                    "B row-major",
                    Box::new(move |l, _| {
                        f.registers(l, &|m, c| value(0, m, c), &|c, n| {
                            value(1, c % N, n + N * (c / N))
                        })
                    }),
                ),
                (
                    "registers rotated",
                    Box::new(|_, (a, b)| ([a[1], a[2], a[3], a[0]], b)),
                ),
                (
                    // (A's alone: both operands' packing reversed together permutes K in both,
                    // and leaves A × B as it is.)
                    "A's packing reversed",
                    Box::new(move |_, (a, b)| {
                        let rev = |w: u32| if bits == 32 { w } else { w.rotate_left(bits) };
                        (a.map(rev), b)
                    }),
                ),
            ];
            for (what, m) in &mutations {
                if what.contains("packing") && bits == 32 {
                    continue; // tf32: one element a register
                }
                let wrong: Vec<_> = regs.iter().enumerate().map(|(l, r)| m(l, *r)).collect();
                assert_ne!(f.model(&wrong), f.product(), "{k}: {what} went unseen");
                let wrong_uniform: Vec<_> =
                    uniform.iter().enumerate().map(|(l, r)| m(l, *r)).collect();
                if !what.contains("transposed") && !what.contains("row-major") {
                    assert_eq!(f.model(&wrong_uniform), closed, "{k}: {what}");
                }
            }
        }
        // The comparison names the first wrong element.
        let f = Frag::of("mma_f16").unwrap();
        let want = f.product();
        let mut out: Vec<f64> = (0..128)
            .map(|j| {
                let (r, c) = Frag::d(j / 4, j % 4);
                want[r * N + c]
            })
            .collect();
        assert!(compare(&out, &want).is_ok());
        out[9] = -out[9] - 1.0;
        assert!(compare(&out, &want)
            .unwrap_err()
            .starts_with("lane 2 element 1"));
    }
}
