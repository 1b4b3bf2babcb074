use super::*;

/// A value pattern with no exact cancellation: distinct per seed and index.
fn data(len: usize, seed: u64) -> Vec<f32> {
    (0..len)
        .map(|i| {
            let x = (i as u64)
                .wrapping_mul(2_654_435_761)
                .wrapping_add(seed * 97)
                % 1999;
            x as f32 / 999.5 - 1.0
        })
        .collect()
}

/// The portable kernel first, then every vector kernel this CPU has (AVX-512 and AVX2 both
/// where it has both).
fn kernels() -> Vec<F32Gemm> {
    let mut all = vec![F32Gemm::portable()];
    all.extend(F32Gemm::detect());
    all.extend(F32Gemm::avx2().filter(|g| !all.contains(g)));
    all
}

/// C (m×n, leading dimension ldc) from A and B as strided reads, summed in f64.
fn reference(m: usize, n: usize, k: usize, a: Operand<f32>, b: Operand<f32>) -> Vec<f64> {
    let mut c = vec![0f64; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0f64;
            for p in 0..k {
                // SAFETY: the tests' operands cover their matrices.
                let (x, y) = unsafe {
                    (
                        *a.ptr.offset(i as isize * a.rs + p as isize * a.cs),
                        *b.ptr.offset(p as isize * b.rs + j as isize * b.cs),
                    )
                };
                s += x as f64 * y as f64;
            }
            c[i * n + j] = s;
        }
    }
    c
}

/// Every way A and B may be laid out, products with and without a packed B, overwritten and
/// accumulated, against f64 sums; the vector kernel gives the same bits as the portable one,
/// and the thread count does not change a bit.
#[test]
fn products_match_f64_sums_in_every_layout() {
    let kernels = kernels();
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(3)
        .build()
        .unwrap();
    // Shapes past each block size and with edges everywhere: m past MC and MR, n past NC and
    // NR, k past KC.
    for (m, n, k) in [
        (1, 1, 1),
        (15, 33, 17),
        (171, 40, 300),
        (29, 1030, 40),
        (3, 5, 513),
        // Long reductions (`long`: A's rows read in place on one thread; B's rows in place, 40
        // apart, or packed, 70 apart).
        (30, 40, 4200),
        (30, 70, 4200),
    ] {
        let a = data(m * k, 1);
        let b = data(k * n, 2);
        let a_layouts = [
            ("rows", Operand::rows(a.as_ptr(), k)),
            ("cols", Operand::transposed(a.as_ptr(), m)),
            // Neither stride 1: every other element of a longer buffer.
            (
                "strided",
                Operand {
                    ptr: a.as_ptr(),
                    rs: 1,
                    cs: m as isize,
                },
            ),
        ];
        let b_layouts = [
            ("rows", Operand::rows(b.as_ptr(), n)),
            ("cols", Operand::transposed(b.as_ptr(), k)),
        ];
        let a2 = data(m * k * 2, 3);
        let strided_a = Operand {
            ptr: a2.as_ptr(),
            rs: 2 * k as isize,
            cs: 2,
        };
        // Rows read in place (k contiguous) with a leading dimension past k.
        let padded_a = Operand {
            ptr: a2.as_ptr(),
            rs: k as isize + 7,
            cs: 1,
        };
        let more = [("gapped", strided_a), ("padded", padded_a)];
        for (an, a_op) in a_layouts.into_iter().chain(more) {
            for (bn, b_op) in b_layouts {
                let want = reference(m, n, k, a_op, b_op);
                // |a|, |b| ≤ 1: any order of f32 sums is within k·ε·Σ|a·b| ≤ ε·k² of the exact sum.
                let bound = f32::EPSILON as f64 * (k * k) as f64;
                let mut first: Option<Vec<f32>> = None;
                for g in &kernels {
                    for packed in [false, true] {
                        for parallel in [false, true] {
                            let ldc = n + 3;
                            let mut c = vec![f32::NAN; m * ldc];
                            let run = |c: &mut Vec<f32>, acc: bool| unsafe {
                                if packed {
                                    let p = g.pack_b(k, n, b_op, parallel);
                                    assert_eq!(p.dims(), (k, n));
                                    g.gemm_packed(m, c.as_mut_ptr(), ldc, acc, a_op, &p, parallel);
                                } else {
                                    g.gemm(m, n, k, c.as_mut_ptr(), ldc, acc, a_op, b_op, parallel);
                                }
                            };
                            pool.install(|| run(&mut c, false));
                            let what = format!("{g:?} A {an} B {bn} {m}×{n}×{k} packed {packed} parallel {parallel}");
                            let mut got = Vec::with_capacity(m * n);
                            for i in 0..m {
                                for j in 0..n {
                                    let x = c[i * ldc + j];
                                    let err = (x as f64 - want[i * n + j]).abs();
                                    assert!(
                                        err <= bound,
                                        "{what}: C[{i},{j}] = {x}, want {}",
                                        want[i * n + j]
                                    );
                                    got.push(x);
                                }
                                assert!(
                                    c[i * ldc + n..i * ldc + ldc].iter().all(|x| x.is_nan()),
                                    "{what}: wrote past row {i}"
                                );
                            }
                            match &first {
                                None => first = Some(got.clone()),
                                Some(f) => assert!(
                                    f.iter().zip(&got).all(|(x, y)| x.to_bits() == y.to_bits()),
                                    "{what}: bits differ"
                                ),
                            }
                            // Accumulating adds the same product again.
                            pool.install(|| run(&mut c, true));
                            for i in 0..m {
                                for j in 0..n {
                                    let x = c[i * ldc + j] as f64;
                                    assert!(
                                        (x - 2.0 * want[i * n + j]).abs() <= 2.0 * bound,
                                        "{what}: accumulated C[{i},{j}]"
                                    );
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

#[test]
fn an_empty_reduction_zeroes_or_keeps_c() {
    let g = F32Gemm::detect().unwrap_or(F32Gemm::portable());
    let (a, b) = ([0f32; 1], [0f32; 1]);
    let mut c = vec![5f32; 6];
    unsafe {
        g.gemm(
            2,
            3,
            0,
            c.as_mut_ptr(),
            3,
            true,
            Operand::rows(a.as_ptr(), 0),
            Operand::rows(b.as_ptr(), 3),
            false,
        );
        assert_eq!(c, [5.0; 6]);
        g.gemm(
            2,
            3,
            0,
            c.as_mut_ptr(),
            3,
            false,
            Operand::rows(a.as_ptr(), 0),
            Operand::rows(b.as_ptr(), 3),
            false,
        );
    }
    assert_eq!(c, [0.0; 6]);
}

/// The taps kernels against f64 sums over the patch they describe: one output row of a padded
/// image, forward (`c = patch · w`, a partial tile of pixels) and filter gradient (`dw (+)=
/// patchᵀ · dy`, a partial tile of taps, runs shorter and longer than a tile); the vector
/// kernels give the portable ones' bits.
#[test]
fn taps_match_f64_sums_over_their_patch() {
    let kernels = kernels();
    // (filter rows, run, pixel stride, pixels, columns)
    for (rows, run, pixel, m, n) in [(7, 21, 6, 19, 64), (3, 3, 1, 30, 32), (2, 40, 8, 14, 32)] {
        let row = (m + MR) * pixel + run;
        let img = data(rows * row + MR * pixel, 5);
        let t = Taps {
            a: img.as_ptr(),
            pixel,
            row,
            rows,
            run,
        };
        let depth = t.depth();
        assert!(taps_apply(depth, n));
        let patch = |i: usize, d: usize| img[d / run * row + d % run + i * pixel] as f64;
        let w = data(depth * n, 6);
        let dy = data(m * n, 7);
        let bound = f32::EPSILON as f64 * (depth.max(m) * depth.max(m)) as f64;
        let mut bits: Vec<(Vec<f32>, Vec<f32>)> = Vec::new();
        for g in &kernels {
            // SAFETY: the buffers cover what the kernels read and write (slack of MR pixels).
            let (y, dw) = unsafe {
                let p = g.pack_b(depth, n, Operand::rows(w.as_ptr(), n), false);
                let mut y = vec![f32::NAN; m * (n + 1)];
                g.taps_forward(t, m, y.as_mut_ptr(), n + 1, &p);
                let mut dw = vec![f32::NAN; depth * n];
                g.taps_filter(t, m, dy.as_ptr(), n, n, dw.as_mut_ptr(), n, false);
                // Accumulated: twice the sum.
                g.taps_filter(t, m, dy.as_ptr(), n, n, dw.as_mut_ptr(), n, true);
                (y, dw)
            };
            for i in 0..m {
                for j in 0..n {
                    let want: f64 = (0..depth).map(|d| patch(i, d) * w[d * n + j] as f64).sum();
                    let got = y[i * (n + 1) + j] as f64;
                    assert!((got - want).abs() <= bound, "{g:?} y[{i},{j}] {got} {want}");
                }
                assert!(y[i * (n + 1) + n].is_nan(), "{g:?}: wrote past row {i}");
            }
            for d in 0..depth {
                for j in 0..n {
                    let want: f64 = (0..m).map(|i| patch(i, d) * dy[i * n + j] as f64).sum();
                    let got = dw[d * n + j] as f64;
                    assert!(
                        (got - 2.0 * want).abs() <= 2.0 * bound,
                        "{g:?} dw[{d},{j}] {got} {want}"
                    );
                }
            }
            bits.push((y, dw));
        }
        for (y, dw) in &bits[1..] {
            let same =
                |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(
                same(y, &bits[0].0) && same(dw, &bits[0].1),
                "vector and portable bits differ"
            );
        }
    }
}
