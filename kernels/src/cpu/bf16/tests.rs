use super::*;
use crate::cpu::gemm::noise;

/// The paths this CPU can run (the portable one everywhere).
fn paths() -> Vec<Bf16Gemm> {
    let mut v = vec![Bf16Gemm::portable()];
    if Bf16Gemm::cpu_has() {
        v.push(Bf16Gemm {
            path: Path::Avx512Bf16,
        });
    }
    if Bf16Gemm::amx_available() {
        v.push(Bf16Gemm { path: Path::Amx });
    } else {
        eprintln!("no AMX-BF16 granted here: the AMX path is not tested");
    }
    v
}

fn rounded(x: f32) -> f64 {
    half::bf16::from_bits(round(x)).to_f64()
}

struct Case {
    m: usize,
    n: usize,
    k: usize,
    a: Vec<f32>,
    b: Vec<f32>,
    c0: Vec<f32>,
}

impl Case {
    fn new(m: usize, n: usize, k: usize, seed: u64) -> Case {
        let v = |len: usize, s: u64| (0..len).map(|i| noise(s, i) as f32).collect::<Vec<_>>();
        Case {
            m,
            n,
            k,
            a: v(m * k, seed),
            b: v(k * n, seed + 1),
            c0: v(m * n, seed + 2),
        }
    }

    /// B stored transposed (n × k, row-major).
    fn bt(&self) -> Vec<f32> {
        let mut t = vec![0.0; self.b.len()];
        for p in 0..self.k {
            for j in 0..self.n {
                t[j * self.k + p] = self.b[p * self.n + j];
            }
        }
        t
    }

    /// C as the product of the rounded inputs in f64; and Σ|a·b| per entry.
    fn reference(&self, accumulate: bool) -> (Vec<f64>, Vec<f64>) {
        let (mut want, mut scale) = (vec![0.0; self.m * self.n], vec![0.0; self.m * self.n]);
        for i in 0..self.m {
            for j in 0..self.n {
                let (mut s, mut t) = (0.0f64, 0.0f64);
                for p in 0..self.k {
                    let x = rounded(self.a[i * self.k + p]) * rounded(self.b[p * self.n + j]);
                    s += x;
                    t += x.abs();
                }
                let c0 = if accumulate {
                    self.c0[i * self.n + j] as f64
                } else {
                    0.0
                };
                want[i * self.n + j] = s + c0;
                scale[i * self.n + j] = t + c0.abs();
            }
        }
        (want, scale)
    }

    /// Runs the product with A and B stored as asked (`t`: transposed storage), from f32 or bf16.
    fn run(&self, g: Bf16Gemm, ta: bool, tb: bool, bf16: bool, acc: bool, par: bool) -> Vec<f32> {
        let (m, n, k) = (self.m, self.n, self.k);
        let store = |x: &[f32], rows: usize, cols: usize, t: bool| -> Vec<f32> {
            if !t {
                return x.to_vec();
            }
            let mut y = vec![0.0; x.len()];
            for i in 0..rows {
                for j in 0..cols {
                    y[j * rows + i] = x[i * cols + j];
                }
            }
            y
        };
        let (sa, sb) = (store(&self.a, m, k, ta), store(&self.b, k, n, tb));
        fn op<T>(p: *const T, t: bool, rows: usize, cols: usize) -> Operand<T> {
            if t {
                Operand::transposed(p, rows)
            } else {
                Operand::rows(p, cols)
            }
        }
        let mut c = self.c0.clone();
        // SAFETY: the operands are the m×k and k×n matrices described, c is m×n.
        unsafe {
            if bf16 {
                let h = |x: &[f32]| {
                    x.iter()
                        .map(|&v| half::bf16::from_f32(v))
                        .collect::<Vec<_>>()
                };
                let (ha, hb) = (h(&sa), h(&sb));
                g.gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    n,
                    acc,
                    op(ha.as_ptr(), ta, m, k),
                    op(hb.as_ptr(), tb, k, n),
                    par,
                );
            } else {
                g.gemm(
                    m,
                    n,
                    k,
                    c.as_mut_ptr(),
                    n,
                    acc,
                    op(sa.as_ptr(), ta, m, k),
                    op(sb.as_ptr(), tb, k, n),
                    par,
                );
            }
        }
        c
    }
}

fn shapes() -> Vec<(usize, usize, usize)> {
    vec![
        (1, 1, 1),
        (3, 5, 2),
        (37, 50, 129),
        (MR * 2, NR * 3, 64),
        // AMX: whole 32-row tiles with k a multiple of 32, and with a tail of pairs.
        (64, 64, 96),
        (96, 32, 40),
        (70, 45, 300),
        // Crosses blocks of rows, columns and k, with ragged ends in each.
        (MC + 5, NC + 40, 2 * KC + 3),
    ]
}

#[test]
fn products_of_rounded_inputs_every_layout_and_path() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (s, &(m, n, k)) in shapes().iter().enumerate() {
        let case = Case::new(m, n, k, 10 * s as u64);
        for acc in [false, true] {
            let (want, scale) = case.reference(acc);
            for g in paths() {
                // The big shape on the fast path only, in every layout; the portable path once.
                let big = m * n * k > 1 << 24;
                if big && g.path() == Path::Portable {
                    continue;
                }
                for (ta, tb, bf16) in [
                    (false, false, false),
                    (true, false, false),
                    (false, true, false),
                    (true, true, false),
                    (false, false, true),
                    (true, true, true),
                ] {
                    let got = pool.install(|| case.run(g, ta, tb, bf16, acc, true));
                    for (e, ((&x, &w), &sc)) in got.iter().zip(&want).zip(&scale).enumerate() {
                        let err = (x as f64 - w).abs() / sc.max(f64::MIN_POSITIVE);
                        assert!(
                            err <= 2e-6 * (k as f64).sqrt() + 1e-6,
                            "{g:?} m={m} n={n} k={k} ta={ta} tb={tb} bf16={bf16} acc={acc}: entry {e} {x} vs {w} (err {err:.1e})"
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn inputs_are_rounded_not_truncated_or_kept() {
    // 1 + 2⁻⁸ + 2⁻¹⁰ rounds up to 1 + 2⁻⁷ in bf16 (8 bits); truncation gives 1, keeping f32
    // gives the value itself.
    let x = 1.0 + 2f32.powi(-8) + 2f32.powi(-10);
    for g in paths() {
        let (a, b) = (vec![x; 32], vec![1.0f32; 32]);
        let mut c = vec![0.0f32; 1];
        // SAFETY: 1×32 times 32×1 into 1×1.
        unsafe {
            g.gemm(
                1,
                1,
                32,
                c.as_mut_ptr(),
                1,
                false,
                Operand::rows(a.as_ptr(), 32),
                Operand::rows(b.as_ptr(), 1),
                false,
            )
        };
        assert_eq!(c[0], 32.0 * (1.0 + 2f32.powi(-7)), "{g:?}");
    }
}

#[test]
fn threads_do_not_change_a_bit() {
    for g in paths() {
        let case = Case::new(MC + 30, 200, 300, 7);
        let one = case.run(g, false, true, false, true, false);
        for threads in [2, 3] {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .unwrap();
            let many = pool.install(|| case.run(g, false, true, false, true, true));
            assert!(
                one.iter()
                    .zip(&many)
                    .all(|(x, y)| x.to_bits() == y.to_bits()),
                "{g:?} {threads}"
            );
        }
        // Short and wide: the threads split the columns.
        let case = Case::new(8, 300, 100, 8);
        let one = case.run(g, true, false, false, false, false);
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(2)
            .build()
            .unwrap();
        let many = pool.install(|| case.run(g, true, false, false, false, true));
        assert_eq!(one, many, "{g:?}");
    }
}

#[test]
fn a_packed_rhs_gives_the_same_bits_as_packing_on_the_fly() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    for (s, &(m, n, k)) in shapes().iter().enumerate() {
        let case = Case::new(m, n, k, 40 + s as u64);
        for g in paths() {
            if m * n * k > 1 << 24 && g.path() == Path::Portable {
                continue;
            }
            for (tb, acc, par) in [
                (false, false, false),
                (true, true, true),
                (false, true, true),
            ] {
                let plain = pool.install(|| case.run(g, false, tb, false, acc, par));
                let bt = case.bt();
                let (a, b0, c0) = (&case.a, &case.b, &case.c0);
                let c = pool.install(|| {
                    let b = if tb {
                        Operand::transposed(bt.as_ptr(), k)
                    } else {
                        Operand::rows(b0.as_ptr(), n)
                    };
                    let mut c = c0.clone();
                    // SAFETY: b is k×n as described, a m×k, c m×n.
                    unsafe {
                        let packed = g.pack_b(k, n, b, par);
                        assert_eq!(packed.dims(), (k, n));
                        let a = Operand::rows(a.as_ptr(), k);
                        g.gemm_packed(m, c.as_mut_ptr(), n, acc, a, &packed, par);
                    }
                    c
                });
                assert!(
                    plain
                        .iter()
                        .zip(&c)
                        .all(|(x, y)| x.to_bits() == y.to_bits()),
                    "{g:?} m={m} n={n} k={k} tb={tb} acc={acc} par={par}"
                );
            }
        }
    }
}

#[test]
fn packing_paths_give_the_same_words() {
    if !Bf16Gemm::cpu_has() {
        eprintln!("no AVX512_BF16 here: the vector packing is not compared");
        return;
    }
    // Ties both ways, subnormals (flushed), the largest finite values, signed zeros.
    let specials = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -(1.0 + 2f32.powi(-8)),
        1e-40,
        -1e-40,
        f32::MIN_POSITIVE,
        f32::MAX,
        -0.0,
        0.0,
        3.0e38,
    ];
    let (rows, kk) = (21, 37);
    let x: Vec<f32> = (0..rows * kk)
        .map(|i| {
            if i % 3 == 0 {
                specials[(i / 3) % specials.len()]
            } else {
                noise(5, i) as f32 * 1e3
            }
        })
        .collect();
    for (rs, ks) in [(kk as isize, 1), (1, rows as isize)] {
        let stored: Vec<f32> = if ks == 1 {
            x.clone()
        } else {
            let mut y = vec![0.0; x.len()];
            for r in 0..rows {
                for p in 0..kk {
                    y[p * rows + r] = x[r * kk + p];
                }
            }
            y
        };
        let view = View {
            ptr: stored.as_ptr(),
            rs,
            ks,
        };
        for (r0, n, w) in [(0, 14, MR), (14, 7, MR), (0, 21, NR)] {
            let words = kk.div_ceil(2) * w;
            let (mut s, mut v) = (vec![1u32; words], vec![1u32; words]);
            // SAFETY: the view covers rows × kk; the CPU has AVX512_BF16.
            unsafe {
                pack::panel(view, r0, n, 0, kk, w, &mut s, false);
                pack::panel(view, r0, n, 0, kk, w, &mut v, true);
            }
            assert_eq!(s, v, "rs={rs} ks={ks} r0={r0} n={n} w={w}");
        }
        // Several panels in one pass (`panels`: pair by pair where the rows are contiguous),
        // from an odd k on, against the scalar packing panel by panel.
        for w in [MR, 8, NR] {
            let (k0, kn) = (3, kk - 3);
            let size = kn.div_ceil(2) * w;
            let count = rows.div_ceil(w);
            let (mut s, mut v) = (vec![1u32; count * size], vec![1u32; count * size]);
            // SAFETY: as above.
            unsafe {
                for q in 0..count {
                    let n = w.min(rows - q * w);
                    let out = &mut s[q * size..(q + 1) * size];
                    pack::panel(view, q * w, n, k0, kn, w, out, false);
                }
                pack::panels(view, 0, rows, k0, kn, w, &mut v, true);
            }
            assert_eq!(s, v, "panels: rs={rs} ks={ks} w={w}");
        }
    }
}

#[test]
fn detect_honours_the_cap() {
    match Bf16Gemm::detect() {
        Ok(g) => {
            let off = std::env::var("ROOFLINE_AMX").is_ok_and(|v| v == "0" || v == "off");
            let want = if Bf16Gemm::amx_available() && !off {
                Path::Amx
            } else {
                Path::Avx512Bf16
            };
            assert_eq!(g.path(), want)
        }
        Err(Unsupported::NoInstruction) => assert!(!Bf16Gemm::cpu_has()),
        Err(Unsupported::Capped(_)) => {
            assert!(crate::cpu::isa::Isa::current() < crate::cpu::isa::Isa::Avx512)
        }
    }
}

/// The branch-free rounding gives `round`'s bits: on the special values (NaNs, infinities,
/// zeros, subnormals, the largest finite values, ties either way) and on a sweep of bit
/// patterns across every exponent.
#[test]
fn round_lanes_gives_rounds_bits() {
    let mut xs = vec![
        0.0f32,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        -f32::NAN,
        f32::from_bits(0x7f80_0001),
        f32::from_bits(0xffc1_2345),
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x807f_ffff),
        f32::MAX,
        f32::MIN,
        f32::from_bits(0x7f7f_8000),
        f32::from_bits(0x3f80_8000),
        f32::from_bits(0x3f81_8000),
        f32::from_bits(0x3f80_7fff),
    ];
    let mut b = 0x9e37_79b9u32;
    for _ in 0..200_000 {
        b = b.wrapping_mul(0x0019_660d).wrapping_add(0x3c6e_f35f);
        xs.push(f32::from_bits(b));
    }
    for x in xs {
        assert_eq!(round_lanes(x), round(x), "{x:e} ({:#010x})", x.to_bits());
    }
}
