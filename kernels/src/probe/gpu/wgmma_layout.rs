//! wgmma's layout check. The peak kernels (`kernels/cuda/wgmma.cu`) fill A and B with one
//! value each, so their exact check holds whatever the layout: a wrong descriptor offset,
//! swizzle or transposition could not show in it. Beside each peak kernel its layout kernel
//! (`wgmma_layout_*`) runs one wgmma of the same instruction through the same descriptors on
//! shared-memory images the host builds here with distinct small values at the places the
//! layout model gives, and writes every accumulator out; the host compares each with A × Bᵀ in
//! f64 through the accumulator's fragment layout. The model also stands in for the instruction
//! on the CPU, so that the tests show the check finding a wrong layout (and the uniform values
//! missing it).

use super::wgmma::WgmmaSpec;
use crate::cuda::device::{arg, Gpu};
use crate::cuda::CudaError;

/// The instruction's M and N (m64n256k*), and the threads of its warpgroup.
pub(super) const M: usize = 64;
pub(super) const N: usize = 256;
const THREADS: usize = 128;
/// Accumulator registers a thread: M·N / 128.
const REGS: usize = M * N / THREADS;
/// The kernels' shared-memory images (`A_WORDS`, `B_WORDS` in wgmma.cu).
const A_BYTES: usize = 4096;
const B_BYTES: usize = 12288;

/// An operand's element type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Elem {
    F16,
    Bf16,
    Tf32,
    E4m3,
    E5m2,
    S8,
}

impl Elem {
    pub(super) fn of(kernel: &str) -> Option<Elem> {
        Some(match kernel {
            "wgmma_f16" => Elem::F16,
            "wgmma_bf16" => Elem::Bf16,
            "wgmma_tf32" => Elem::Tf32,
            "wgmma_e4m3" => Elem::E4m3,
            "wgmma_e5m2" => Elem::E5m2,
            "wgmma_int8" => Elem::S8,
            _ => return None,
        })
    }

    pub(super) fn bytes(self) -> usize {
        match self {
            Elem::F16 | Elem::Bf16 => 2,
            Elem::Tf32 => 4,
            Elem::E4m3 | Elem::E5m2 | Elem::S8 => 1,
        }
    }

    /// The bits of small integer `v` (|v| ≤ 3: exact in every type).
    pub(super) fn encode(self, v: i32) -> u32 {
        let f = v as f32;
        let fp8 = |bias: i32, man: u32| -> u32 {
            if v == 0 {
                return 0;
            }
            let a = v.unsigned_abs();
            let e = 31 - a.leading_zeros(); // floor(log2 |v|)
            let frac = (a - (1 << e)) << man >> e; // the bits after the leading one
            let sign = if v < 0 { 0x80 } else { 0 };
            sign | (((e as i32 + bias) as u32) << man) | frac
        };
        match self {
            Elem::F16 => u32::from(half::f16::from_f32(f).to_bits()),
            Elem::Bf16 => u32::from(half::bf16::from_f32(f).to_bits()),
            Elem::Tf32 => f.to_bits(),
            Elem::E4m3 => fp8(7, 3),
            Elem::E5m2 => fp8(15, 2),
            Elem::S8 => u32::from(v as i8 as u8),
        }
    }

    /// The value of an element's bits (normal numbers and zero: what `encode` writes).
    pub(super) fn decode(self, bits: u32) -> f64 {
        let fp8 = |bias: i32, man: u32| -> f64 {
            let sign = if bits & 0x80 != 0 { -1.0 } else { 1.0 };
            let e = ((bits & 0x7F) >> man) as i32;
            let m = bits & ((1 << man) - 1);
            if e == 0 && m == 0 {
                return 0.0;
            }
            sign * (1.0 + f64::from(m) / f64::from(1u32 << man)) * 2f64.powi(e - bias)
        };
        match self {
            Elem::F16 => half::f16::from_bits(bits as u16).to_f64(),
            Elem::Bf16 => half::bf16::from_bits(bits as u16).to_f64(),
            Elem::Tf32 => f64::from(f32::from_bits(bits)),
            Elem::E4m3 => fp8(7, 3),
            Elem::E5m2 => fp8(15, 2),
            Elem::S8 => f64::from(bits as u8 as i8),
        }
    }
}

/// Where the kernels' descriptors (`smem_desc` in wgmma.cu) say an operand's element lives:
/// K-major core matrices of 8 rows × 16 bytes, `lbo` bytes between core matrices adjacent along
/// K, `sbo` bytes between those adjacent along M (or N), no swizzle; `start` the image's offset.
/// `swizzle_128`: the 128-byte swizzle (16-byte chunk index XOR row within 8), a mutation the
/// tests try.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Layout {
    pub(super) start: usize,
    pub(super) lbo: usize,
    pub(super) sbo: usize,
    pub(super) swizzle_128: bool,
}

/// The kernels' layout: 128 bytes between the two core matrices along K, 256 between rows of
/// them (wgmma.cu's `(128ull >> 4) << 16`, `(256ull >> 4) << 32`).
pub(super) const KERNEL_LAYOUT: Layout = Layout {
    start: 0,
    lbo: 128,
    sbo: 256,
    swizzle_128: false,
};

impl Layout {
    /// The byte offset of element (`row`, `k`) of an operand of type `e`.
    pub(super) fn offset(&self, row: usize, k: usize, e: Elem) -> usize {
        let kb = k * e.bytes();
        let mut o = (row / 8) * self.sbo + (kb / 16) * self.lbo + (row % 8) * 16 + kb % 16;
        if self.swizzle_128 {
            o ^= ((o >> 7) & 7) << 4;
        }
        self.start + o
    }
}

/// Operand `which` (0: A, 1: B) at (`row`, `k`): a small nonzero integer, ±1 to ±3 by a hash
/// of the place, so that a value read from a wrong place is another value; exact in every
/// type, and a sum of K ≤ 32 products (at most 288) exact in the accumulator.
pub(super) fn value(which: u64, row: usize, k: usize) -> i32 {
    let mut z = (which << 40) ^ ((row as u64) << 20) ^ k as u64;
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    [-3, -2, -1, 1, 2, 3][(z % 6) as usize]
}

/// The shared-memory image (`bytes` long) of an operand of `rows` × `k` elements of type `e`,
/// element (r, c) holding `val(r, c)` where `layout` puts it.
pub(super) fn image(
    rows: usize,
    k: usize,
    e: Elem,
    layout: &Layout,
    bytes: usize,
    val: &dyn Fn(usize, usize) -> i32,
) -> Vec<u8> {
    let mut img = vec![0u8; bytes];
    for r in 0..rows {
        for c in 0..k {
            let o = layout.offset(r, c, e);
            let bits = e.encode(val(r, c)).to_le_bytes();
            img[o..o + e.bytes()].copy_from_slice(&bits[..e.bytes()]);
        }
    }
    img
}

/// An element read from an image where `layout` says it is (0 past the image's end).
fn read(img: &[u8], layout: &Layout, row: usize, k: usize, e: Elem) -> f64 {
    let o = layout.offset(row, k, e);
    let mut w = [0u8; 4];
    if o + e.bytes() <= img.len() {
        w[..e.bytes()].copy_from_slice(&img[o..o + e.bytes()]);
    }
    e.decode(u32::from_le_bytes(w))
}

/// The CPU model of one wgmma reading its operands through descriptors of `layout`: D[m][n]
/// (row-major, M × N) = Σₖ A(m, k) · B(n, k).
pub(super) fn model(a: &[u8], b: &[u8], k: usize, e: Elem, layout: &Layout) -> Vec<f64> {
    let mut d = vec![0.0; M * N];
    for m in 0..M {
        for n in 0..N {
            d[m * N + n] = (0..k)
                .map(|c| read(a, layout, m, c, e) * read(b, layout, n, c, e))
                .sum();
        }
    }
    d
}

/// A × Bᵀ from the values themselves (M × N, row-major).
pub(super) fn product(k: usize) -> Vec<f64> {
    let mut d = vec![0.0; M * N];
    for m in 0..M {
        for n in 0..N {
            d[m * N + n] = (0..k)
                .map(|c| f64::from(value(0, m, c) * value(1, n, c)))
                .sum();
        }
    }
    d
}

/// (row, column) of accumulator register `j` of thread `t` of the warpgroup, in wgmma's
/// m64nN D fragment: warp `t / 32` holds rows 16·w to 16·w + 15; each 8 columns take four
/// registers, the first two on row `lane / 4` (columns 2·(lane % 4) and the next), the other
/// two eight rows below.
pub(super) fn fragment(t: usize, j: usize) -> (usize, usize) {
    let (w, lane) = (t / 32, t % 32);
    let row = 16 * w + lane / 4 + 8 * ((j / 2) % 2);
    let col = 8 * (j / 4) + 2 * (lane % 4) + j % 2;
    (row, col)
}

/// The first accumulator (thread-major: thread t's register j at t·128 + j) that differs from
/// `want`, named by its thread, register, row and column.
pub(super) fn compare(out: &[f64], want: &[f64]) -> Result<(), String> {
    if out.len() != THREADS * REGS {
        return Err(format!(
            "{} accumulators, not {}",
            out.len(),
            THREADS * REGS
        ));
    }
    for (i, &got) in out.iter().enumerate() {
        let (t, j) = (i / REGS, i % REGS);
        let (row, col) = fragment(t, j);
        let w = want[row * N + col];
        if got != w {
            return Err(format!(
                "thread {t} register {j} (D[{row}][{col}]): GPU {got}, A x B^T {w}"
            ));
        }
    }
    Ok(())
}

/// `spec`'s layout kernel on `gpu`: one wgmma on images of distinct values built by the kernels'
/// layout, every accumulator against A × Bᵀ. Returns what it checked.
pub(super) fn check_layout(gpu: &mut Gpu, spec: &WgmmaSpec) -> Result<String, CudaError> {
    let e = Elem::of(spec.kernel)
        .ok_or_else(|| CudaError::Check(format!("no layout check for {}", spec.kernel)))?;
    let k = spec.k as usize;
    let layout_kernel = spec.kernel.replace("wgmma_", "wgmma_layout_");
    let f = gpu.function(&layout_kernel)?;
    let a = image(M, k, e, &KERNEL_LAYOUT, A_BYTES, &|r, c| value(0, r, c));
    let b = image(N, k, e, &KERNEL_LAYOUT, B_BYTES, &|r, c| value(1, r, c));
    let (da, db) = (gpu.upload(&a)?, gpu.upload(&b)?);
    let out = gpu.alloc(THREADS * REGS * 4)?;
    // SAFETY: the kernel's arguments (out: 128 × 128 accumulators, the two images of A_BYTES
    // and B_BYTES), one block of one warpgroup.
    unsafe {
        gpu.launch(
            f,
            1,
            THREADS as u32,
            &mut [arg(&out.ptr), arg(&da.ptr), arg(&db.ptr)],
        )
    }?;
    gpu.sync()?;
    let got = super::peaks::download_f64(gpu, &out, spec.int)?;
    // What the instruction computes from these images read through the kernels' descriptors,
    // by the model: A x B^T (the tests show the model gives it, and no other layout does).
    let want = model(&a, &b, k, e, &KERNEL_LAYOUT);
    if want != product(k) {
        return Err(CudaError::Check(format!(
            "{layout_kernel}: the layout model's images do not give A x B^T on the host"
        )));
    }
    compare(&got, &want).map_err(|why| {
        CudaError::Check(format!(
            "{layout_kernel}: the descriptors or the fragment layout are not the model's: {why}"
        ))
    })?;
    Ok(format!(
        "layout checked: one wgmma on distinct values, all {} accumulators equal A x B^T",
        M * N
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ELEMS: [(Elem, usize); 6] = [
        (Elem::F16, 16),
        (Elem::Bf16, 16),
        (Elem::Tf32, 8),
        (Elem::E4m3, 32),
        (Elem::E5m2, 32),
        (Elem::S8, 32),
    ];

    #[test]
    fn every_value_round_trips_in_every_type() {
        for (e, _) in ELEMS {
            for v in -3..=3 {
                assert_eq!(e.decode(e.encode(v)), f64::from(v), "{e:?} {v}");
            }
        }
        // The peak kernels' fp8 ones (wgmma.rs): 1.0 is 0x38 in e4m3, 0x3C in e5m2.
        assert_eq!(Elem::E4m3.encode(1), 0x38);
        assert_eq!(Elem::E5m2.encode(1), 0x3C);
        assert_eq!(Elem::E4m3.encode(-3), 0xC4);
    }

    /// The fragment covers D: every (row, column) exactly once.
    #[test]
    fn the_accumulator_fragment_is_a_bijection_onto_d() {
        let mut seen = vec![false; M * N];
        for t in 0..THREADS {
            for j in 0..REGS {
                let (r, c) = fragment(t, j);
                assert!(r < M && c < N, "{t} {j}");
                assert!(!seen[r * N + c], "({r}, {c}) twice");
                seen[r * N + c] = true;
            }
        }
        assert!(seen.iter().all(|&s| s));
    }

    /// The layout fits the kernels' images and is what wgmma.cu's descriptors say.
    #[test]
    fn the_layout_is_the_kernels_and_fits_their_images() {
        let cu = include_str!("../../../cuda/wgmma.cu");
        assert!(cu.contains("((128ull >> 4) << 16) | ((256ull >> 4) << 32)"));
        assert!(cu.contains("#define A_WORDS 1024") && cu.contains("#define B_WORDS 3072"));
        for (e, k) in ELEMS {
            assert_eq!(k * e.bytes(), 32, "{e:?}: two core matrices along K");
            let last = KERNEL_LAYOUT.offset(N - 1, k - 1, e) + e.bytes();
            assert!(last <= B_BYTES, "{e:?}: {last}");
            assert!(KERNEL_LAYOUT.offset(M - 1, k - 1, e) + e.bytes() <= A_BYTES);
        }
    }

    type Val = Box<dyn Fn(usize, usize) -> i32>;

    fn d_of(e: Elem, k: usize, built: &Layout, read: &Layout, uniform: bool) -> Vec<f64> {
        let (va, vb): (Val, Val) = if uniform {
            (Box::new(|_, _| 1), Box::new(|_, _| 2))
        } else {
            (
                Box::new(|r, c| value(0, r, c)),
                Box::new(|r, c| value(1, r, c)),
            )
        };
        let a = image(M, k, e, built, A_BYTES, &*va);
        let b = image(N, k, e, built, B_BYTES, &*vb);
        model(&a, &b, k, e, read)
    }

    /// The right layout gives A × Bᵀ exactly; each wrong one — LBO and SBO swapped, the start
    /// 16 bytes off, the 128-byte swizzle, K-major read as M-major (A transposed) — gives
    /// another D on the distinct values, while on the peak kernels' uniform values every one
    /// of them still gives the closed form: the uniform check could not see them.
    #[test]
    fn a_wrong_layout_shows_on_distinct_values_and_hides_on_uniform_ones() {
        let swapped = Layout {
            lbo: 256,
            sbo: 128,
            ..KERNEL_LAYOUT
        };
        let shifted = Layout {
            start: 16,
            ..KERNEL_LAYOUT
        };
        let swizzled = Layout {
            swizzle_128: true,
            ..KERNEL_LAYOUT
        };
        for (e, k) in ELEMS {
            let want = product(k);
            let right = d_of(e, k, &KERNEL_LAYOUT, &KERNEL_LAYOUT, false);
            assert_eq!(right, want, "{e:?}");
            let uniform = d_of(e, k, &KERNEL_LAYOUT, &KERNEL_LAYOUT, true);
            for (what, read) in [
                ("LBO and SBO swapped", swapped),
                ("start 16 bytes off", shifted),
                ("128-byte swizzle", swizzled),
            ] {
                let d = d_of(e, k, &KERNEL_LAYOUT, &read, false);
                let diff = d.iter().zip(&want).filter(|(x, y)| x != y).count();
                assert!(diff > M * N / 4, "{e:?} {what}: only {diff} entries differ");
                // The uniform images read the same wrong way: a shift past the end reads zeros
                // (the image's tail), every other mutation the same closed form everywhere.
                if what != "start 16 bytes off" {
                    assert_eq!(
                        d_of(e, k, &KERNEL_LAYOUT, &read, true),
                        uniform,
                        "{e:?} {what}"
                    );
                }
            }
            // A stored transposed (each element (m, c) where (c, m) belongs, within the image).
            let a = image(M, k, e, &KERNEL_LAYOUT, A_BYTES, &|r, c| {
                if c < k && r < k {
                    value(0, c, r)
                } else {
                    value(0, r, c)
                }
            });
            let b = image(N, k, e, &KERNEL_LAYOUT, B_BYTES, &|r, c| value(1, r, c));
            let d = model(&a, &b, k, e, &KERNEL_LAYOUT);
            assert_ne!(d, want, "{e:?}: a transposed A");
        }
        // And the comparison names the first wrong accumulator.
        let want = product(16);
        let mut out: Vec<f64> = (0..THREADS * REGS)
            .map(|i| {
                let (r, c) = fragment(i / REGS, i % REGS);
                want[r * N + c]
            })
            .collect();
        assert!(compare(&out, &want).is_ok());
        out[5] += 1.0;
        let e = compare(&out, &want).unwrap_err();
        assert!(e.starts_with("thread 0 register 5"), "{e}");
    }
}
