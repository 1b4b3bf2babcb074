//! The convolution probe's operands and its CPU reference: counter-based operand values,
//! the exact f64 value of any output element of each direction, and the bytes a direction
//! moves at least.

use super::super::gemm::{encode, Rng};
use crate::cpu::conv::ConvShape;
use crate::cuda::blas::{GemmPrec, Prec};
use crate::cuda::dnn::Dir;

/// One operand's values: element `i` is `Rng`'s value of precision `p` seeded by `seed` and
/// `i` (exact in `p`, never zero).
#[derive(Clone, Copy)]
pub(super) struct Operand {
    pub(super) seed: u64,
    pub(super) p: Prec,
}

impl Operand {
    pub(super) fn at(&self, i: usize) -> f64 {
        // SplitMix64 of (seed, i): a nonzero state for the generator.
        let mut z = self.seed ^ (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^= z >> 31;
        Rng(z | 1).value(self.p)
    }

    /// The `n` elements encoded in `p`, made in parallel chunks.
    pub(super) fn bytes(&self, n: usize) -> Vec<u8> {
        use rayon::prelude::*;
        const CHUNK: usize = 1 << 20;
        let chunks: Vec<Vec<u8>> = (0..n.div_ceil(CHUNK))
            .into_par_iter()
            .map(|c| {
                let v: Vec<f64> = (c * CHUNK..((c + 1) * CHUNK).min(n))
                    .map(|i| self.at(i))
                    .collect();
                encode(self.p, &v)
            })
            .collect();
        chunks.concat()
    }
}

/// Element `i` of an output downloaded in `p`'s storage type.
pub(super) fn decode(p: Prec, bytes: &[u8], i: usize) -> f64 {
    match p {
        Prec::F16 => {
            half::f16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f64()
        }
        Prec::Bf16 => {
            half::bf16::from_bits(u16::from_le_bytes([bytes[2 * i], bytes[2 * i + 1]])).to_f64()
        }
        _ => f32::from_le_bytes([
            bytes[4 * i],
            bytes[4 * i + 1],
            bytes[4 * i + 2],
            bytes[4 * i + 3],
        ]) as f64,
    }
}

/// Output element count of a direction: y (fwd), dx (bwd_data), dw (bwd_filter).
pub(super) fn out_len(s: &ConvShape, dir: Dir) -> usize {
    match dir {
        Dir::Fwd => s.n * s.oh() * s.ow() * s.k,
        Dir::BwdData => s.n * s.h * s.w * s.c,
        Dir::BwdFilter => s.k * s.r * s.s * s.c,
    }
}

/// The reference value of output element `idx` and Σ|terms| (for a normwise error).
pub(super) fn reference(
    s: &ConvShape,
    hx: &dyn Fn(usize) -> f64,
    hw: &dyn Fn(usize) -> f64,
    hdy: &dyn Fn(usize) -> f64,
    dir: Dir,
    idx: usize,
) -> (f64, f64) {
    let (oh, ow) = (s.oh() as isize, s.ow() as isize);
    let xi = |n: usize, y: isize, x: isize, c: usize| -> Option<f64> {
        if y < 0 || x < 0 || y >= s.h as isize || x >= s.w as isize {
            return None;
        }
        Some(hx(((n * s.h + y as usize) * s.w + x as usize) * s.c + c))
    };
    let wi = |k: usize, r: usize, q: usize, c: usize| hw(((k * s.r + r) * s.s + q) * s.c + c);
    let dyi = |n: usize, p: usize, q: usize, k: usize| {
        hdy(((n * oh as usize + p) * ow as usize + q) * s.k + k)
    };
    let (st, pad) = (s.stride as isize, s.pad as isize);
    let (mut sum, mut abs) = (0.0, 0.0);
    let mut add = |v: f64| {
        sum += v;
        abs += v.abs();
    };
    match dir {
        Dir::Fwd => {
            let k = idx % s.k;
            let q = (idx / s.k) % ow as usize;
            let p = (idx / s.k / ow as usize) % oh as usize;
            let n = idx / s.k / ow as usize / oh as usize;
            for r in 0..s.r {
                for u in 0..s.s {
                    for c in 0..s.c {
                        if let Some(x) = xi(
                            n,
                            p as isize * st - pad + r as isize,
                            q as isize * st - pad + u as isize,
                            c,
                        ) {
                            add(x * wi(k, r, u, c));
                        }
                    }
                }
            }
        }
        Dir::BwdData => {
            let c = idx % s.c;
            let x = ((idx / s.c) % s.w) as isize;
            let y = ((idx / s.c / s.w) % s.h) as isize;
            let n = idx / s.c / s.w / s.h;
            for r in 0..s.r as isize {
                for u in 0..s.s as isize {
                    let (py, qx) = (y + pad - r, x + pad - u);
                    if py % st != 0 || qx % st != 0 {
                        continue;
                    }
                    let (p, q) = (py / st, qx / st);
                    if p < 0 || q < 0 || p >= oh || q >= ow {
                        continue;
                    }
                    for k in 0..s.k {
                        add(dyi(n, p as usize, q as usize, k) * wi(k, r as usize, u as usize, c));
                    }
                }
            }
        }
        Dir::BwdFilter => {
            let c = idx % s.c;
            let u = (idx / s.c) % s.s;
            let r = (idx / s.c / s.s) % s.r;
            let k = idx / s.c / s.s / s.r;
            for n in 0..s.n {
                for p in 0..oh as usize {
                    for q in 0..ow as usize {
                        if let Some(x) = xi(
                            n,
                            p as isize * st - pad + r as isize,
                            q as isize * st - pad + u as isize,
                            c,
                        ) {
                            add(dyi(n, p, q, k) * x);
                        }
                    }
                }
            }
        }
    }
    (sum, abs)
}

/// The bytes a direction moves at least: its two operands read and its output written, in
/// the storage precision.
pub(super) fn min_bytes(s: &ConvShape, p: Prec, dir: Dir) -> f64 {
    let (x, w, y) = (
        s.n * s.h * s.w * s.c,
        s.k * s.r * s.s * s.c,
        s.n * s.oh() * s.ow() * s.k,
    );
    let elements = match dir {
        Dir::Fwd => x + w + y,
        Dir::BwdData => y + w + x,
        Dir::BwdFilter => x + y + w,
    };
    (elements * p.in_bytes()) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::dnn::DIRECTIONS;

    const PRECISIONS: [Prec; 4] = [Prec::F32, Prec::Tf32, Prec::F16, Prec::Bf16];

    /// The CPU references of the three directions agree with each other through the adjoint
    /// identity <conv(x, w), dy> = <x, bwd_data(dy, w)> = <w, bwd_filter(x, dy)>.
    #[test]
    fn references_satisfy_the_adjoint_identities() {
        let s = ConvShape {
            n: 2,
            c: 3,
            h: 7,
            w: 6,
            k: 4,
            r: 3,
            s: 3,
            stride: 2,
            pad: 1,
        };
        let mut rng = Rng(3);
        let p = Prec::F64;
        let mut t_host = |n| (0..n).map(|_| rng.value(p)).collect::<Vec<f64>>();
        let hx = t_host(s.n * s.h * s.w * s.c);
        let hw = (0..s.k * s.r * s.s * s.c)
            .map(|i| ((i * 37) % 11) as f64 - 5.0)
            .collect::<Vec<_>>();
        let hdy = (0..s.n * s.oh() * s.ow() * s.k)
            .map(|i| ((i * 13) % 7) as f64 - 3.0)
            .collect::<Vec<_>>();
        let dot = |dir: Dir, other: &[f64]| -> f64 {
            (0..out_len(&s, dir))
                .map(|i| reference(&s, &|j| hx[j], &|j| hw[j], &|j| hdy[j], dir, i).0 * other[i])
                .sum()
        };
        let a = dot(Dir::Fwd, &hdy);
        let b = dot(Dir::BwdData, &hx);
        let c = dot(Dir::BwdFilter, &hw);
        assert!((a - b).abs() < 1e-9 * a.abs().max(1.0), "{a} vs {b}");
        assert!((a - c).abs() < 1e-9 * a.abs().max(1.0), "{a} vs {c}");
    }

    /// An operand's upload is its values, element for element, in every precision: the bytes
    /// made in parallel chunks decode to what the reference computes again from the index;
    /// values are exact in the precision and never zero, and two seeds differ.
    #[test]
    fn operands_upload_what_the_reference_reads() {
        for p in PRECISIONS {
            let op = Operand { seed: 7, p };
            let n = (1 << 20) + 37; // two chunks, the second short
            let bytes = op.bytes(n);
            assert_eq!(bytes.len(), n * p.in_bytes());
            for i in [0, 1, 5, (1 << 20) - 1, 1 << 20, n - 1] {
                let v = op.at(i);
                assert!(v != 0.0 && v.abs() <= 1.0, "{v}");
                assert_eq!(decode(p, &bytes, i), v, "{} element {i}", p.name());
            }
            let other = Operand { seed: 8, p };
            assert!((0..64).any(|i| other.at(i) != op.at(i)));
        }
    }

    /// The bytes a direction moves at least, by hand: a 1×1 convolution of 64 to 256 channels
    /// on 2 × 4 × 4 at stride 1 reads x (2·4·4·64) and w (256·64) and writes y (2·4·4·256),
    /// in the storage precision's bytes; the backward directions move the same three tensors.
    #[test]
    fn a_direction_moves_its_three_tensors() {
        let s = ConvShape {
            n: 2,
            c: 64,
            h: 4,
            w: 4,
            k: 256,
            r: 1,
            s: 1,
            stride: 1,
            pad: 0,
        };
        let elements = (2 * 4 * 4 * 64 + 256 * 64 + 2 * 4 * 4 * 256) as f64;
        for dir in DIRECTIONS {
            assert_eq!(min_bytes(&s, Prec::Bf16, dir), 2.0 * elements);
            assert_eq!(min_bytes(&s, Prec::F32, dir), 4.0 * elements);
        }
    }
}
