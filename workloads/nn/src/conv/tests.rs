use super::*;
use crate::tensor::bf16_pool;

pub(super) fn shape(
    n: usize,
    c: usize,
    h: usize,
    k: usize,
    r: usize,
    stride: usize,
    pad: usize,
) -> ConvShape {
    ConvShape {
        n,
        c,
        h,
        w: h + 1,
        k,
        r,
        s: r,
        stride,
        pad,
    }
}

pub(super) fn direct(x: &[f64], w: &[f64], sh: &ConvShape) -> Vec<f64> {
    let mut y = vec![0.0; sh.output_len()];
    for n in 0..sh.n {
        for oy in 0..sh.oh() {
            for ox in 0..sh.ow() {
                for k in 0..sh.k {
                    let mut s = 0.0;
                    for ky in 0..sh.r {
                        for kx in 0..sh.s {
                            let iy = (oy * sh.stride + ky) as isize - sh.pad as isize;
                            let ix = (ox * sh.stride + kx) as isize - sh.pad as isize;
                            if iy < 0 || ix < 0 || iy >= sh.h as isize || ix >= sh.w as isize {
                                continue;
                            }
                            for c in 0..sh.c {
                                s += x[((n * sh.h + iy as usize) * sh.w + ix as usize) * sh.c + c]
                                    * w[((ky * sh.s + kx) * sh.c + c) * sh.k + k];
                            }
                        }
                    }
                    y[((n * sh.oh() + oy) * sh.ow() + ox) * sh.k + k] = s;
                }
            }
        }
    }
    y
}

/// The filter gradient by direct sums, and the sum of its terms' magnitudes, per element:
/// `dw[(ky·s + kx)·c + ci][k] = Σ x[n][iy][ix][ci] · g[n][oy][ox][k]`.
fn direct_filter(x: &[f64], g: &[f64], sh: &ConvShape) -> (Vec<f64>, Vec<f64>) {
    let (mut dw, mut size) = (vec![0.0; sh.weight_len()], vec![0.0; sh.weight_len()]);
    for n in 0..sh.n {
        for oy in 0..sh.oh() {
            for ox in 0..sh.ow() {
                let gr = &g[((n * sh.oh() + oy) * sh.ow() + ox) * sh.k..][..sh.k];
                for ky in 0..sh.r {
                    for kx in 0..sh.s {
                        let iy = (oy * sh.stride + ky) as isize - sh.pad as isize;
                        let ix = (ox * sh.stride + kx) as isize - sh.pad as isize;
                        if iy < 0 || ix < 0 || iy >= sh.h as isize || ix >= sh.w as isize {
                            continue;
                        }
                        let at = ((n * sh.h + iy as usize) * sh.w + ix as usize) * sh.c;
                        for ci in 0..sh.c {
                            let row = ((ky * sh.s + kx) * sh.c + ci) * sh.k;
                            for (k, gk) in gr.iter().enumerate() {
                                let t = x[at + ci] * gk;
                                dw[row + k] += t;
                                size[row + k] += t.abs();
                            }
                        }
                    }
                }
            }
        }
    }
    (dw, size)
}

/// Every element of `got` within `rel` of its terms' magnitude from the direct sums: where
/// one wrong or missing term moves it by about magnitude / terms.
fn assert_filter_gradient(got: &[f32], x: &[f64], g: &[f64], sh: &ConvShape, rel: f64) {
    let (want, size) = direct_filter(x, g, sh);
    for (i, ((a, b), s)) in got.iter().zip(&want).zip(&size).enumerate() {
        let err = (*a as f64 - b).abs();
        assert!(
            err <= rel * s,
            "{}: dw[{i}] {a}, want {b} (of {s})",
            sh.describe()
        );
    }
}

/// Each value rounded to f32.
fn f32s(v: &[f64]) -> Vec<f32> {
    v.iter().map(|&a| a as f32).collect()
}

/// Each f32 value, exactly, in f64 (a reference's inputs).
fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&a| a as f64).collect()
}

pub(super) fn data(len: usize, seed: f64) -> Vec<f64> {
    (0..len)
        .map(|i| ((i as f64 + seed) * 0.618).sin())
        .collect()
}

/// Forward against a direct loop; both backward passes through the adjoint identities
/// <conv(x,w), g> = <x, bwd_data(g,w)> = <w, bwd_filter(x,g)>; on two threads and on 16,
/// more than some shapes have rows for (the filter gradient's last parts start past the
/// end, as on a 16-core GPU host).
#[test]
fn all_three_passes_agree_with_direct_sums() {
    for threads in [2, 16] {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(all_three_passes);
    }
}

fn all_three_passes() {
    for sh in [
        shape(2, 3, 7, 4, 3, 1, 1),
        shape(2, 5, 8, 3, 3, 2, 1),
        shape(3, 4, 5, 6, 1, 1, 0),
        // Depth above k: the filter gradient computed transposed.
        shape(3, 6, 5, 4, 1, 1, 0),
        // 18 rows: on 16 threads, parts of 2 rows, the last six past the end.
        shape(3, 4, 2, 6, 1, 1, 0),
        shape(3, 6, 2, 4, 1, 1, 0),
        shape(2, 4, 6, 5, 1, 2, 0),
        shape(1, 3, 9, 2, 7, 2, 3),
        // Small images, several to a task and block, the last task short.
        shape(9, 3, 4, 5, 3, 1, 1),
        shape(11, 2, 5, 3, 3, 2, 1),
    ] {
        let x = data(sh.input_len(), 0.1);
        let w = data(sh.weight_len(), 2.0);
        let g = data(sh.output_len(), 5.0);
        let mut y = vec![0.0; sh.output_len()];
        forward(&x, &w, &mut y, &sh);
        let want = direct(&x, &w, &sh);
        for (a, b) in y.iter().zip(&want) {
            assert!((a - b).abs() < 1e-10, "{}", sh.describe());
        }
        let mut dx = vec![0.0; sh.input_len()];
        backward_data(&g, &w, &mut dx, &sh);
        // Added to a gradient already there: the same sums, plus what was there.
        let prior = data(sh.input_len(), 7.0);
        let mut sum = prior.clone();
        backward_data_add(&g, &w, &mut sum, &sh);
        for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
            assert!(
                (s - (p + d)).abs() < 1e-12,
                "{}: {s} vs {p} + {d}",
                sh.describe()
            );
        }
        let mut dw = vec![0.0; sh.weight_len()];
        backward_filter(&x, &g, &mut dw, &sh);
        let yg: f64 = y.iter().zip(&g).map(|(a, b)| a * b).sum();
        let xdx: f64 = x.iter().zip(&dx).map(|(a, b)| a * b).sum();
        let wdw: f64 = w.iter().zip(&dw).map(|(a, b)| a * b).sum();
        assert!(
            (yg - xdx).abs() < 1e-9 * yg.abs().max(1.0),
            "{}: {yg} {xdx}",
            sh.describe()
        );
        assert!(
            (yg - wdw).abs() < 1e-9 * yg.abs().max(1.0),
            "{}: {yg} {wdw}",
            sh.describe()
        );
    }
}

/// A 1×1 layer's f32 filter gradient over many pixels (each part of the rows a long
/// reduction: roofline's f32 kernels where the CPU has AVX-512, A and B read in place or
/// B packed: as dwᵀ = dyᵀ·x with more output channels than input ones, 64 and 200 against
/// 48, x's rows in place; as dw = xᵀ·dy with fewer, 80 and 32 against 96, dy's rows packed
/// and in place) against f64 sums; the forward and backward-data products over the pool
/// (A's rows in place) too.
#[test]
fn pointwise_f32_products_over_many_pixels_agree_with_f64_sums() {
    for (c, k) in [(48, 64), (48, 200), (96, 80), (96, 32)] {
        // 16640 rows: at least 4096 a part on up to 4 threads.
        let sh = shape(4, c, 64, k, 1, 1, 0);
        let rows = sh.rows();
        let (x, w, dy) = (
            f32s(&data(sh.input_len(), 0.1)),
            f32s(&data(sh.weight_len(), 0.2)),
            f32s(&data(sh.output_len(), 0.3)),
        );
        let mut dw = vec![0f32; sh.weight_len()];
        backward_filter(&x, &dy, &mut dw, &sh);
        let mut y = vec![0f32; sh.output_len()];
        forward(&x, &w, &mut y, &sh);
        let mut dx = vec![0f32; sh.input_len()];
        backward_data(&dy, &w, &mut dx, &sh);
        let c = sh.c;
        // Each value against f64 sums: within a few f32 roundings of the terms' magnitude,
        // where one wrong or missing term moves it by about magnitude / terms.
        let check = |got: f32, terms: &mut dyn Iterator<Item = f64>, rel: f64, what: &str| {
            let (want, size) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
            let err = (got as f64 - want).abs();
            assert!(
                err <= rel * size,
                "k {k}: {what} {got}, want {want} (of {size})"
            );
        };
        for i in 0..c {
            for j in 0..k {
                let mut terms = (0..rows).map(|p| x[p * c + i] as f64 * dy[p * k + j] as f64);
                check(dw[i * k + j], &mut terms, 1e-5, &format!("dw[{i},{j}]"));
            }
        }
        for p in (0..rows).step_by(97) {
            for j in 0..k {
                let mut terms = (0..c).map(|i| x[p * c + i] as f64 * w[i * k + j] as f64);
                check(y[p * k + j], &mut terms, 2e-6, &format!("y[{p},{j}]"));
            }
            for i in 0..c {
                let mut terms = (0..k).map(|j| dy[p * k + j] as f64 * w[i * k + j] as f64);
                check(dx[p * c + i], &mut terms, 2e-6, &format!("dx[{p},{i}]"));
            }
        }
    }
}

/// f32 layers with filters of 2 MiB and more (packed once per call for the f32 kernels
/// where the CPU has AVX-512, the gemm crate elsewhere): all three passes agree with f64
/// sums within f32 rounding, the strided 3×3 and 1×1 (im2col) paths (3×3 stride 1 goes
/// through Winograd: its own tests); their filter gradients element by element, the first
/// and last (a 1×1 of 40 pixels) on kernels that take B packed first (`rhs_first`).
#[test]
fn f32_products_with_large_filters_agree_with_direct_sums() {
    for (sh, first) in [
        (shape(3, 256, 6, 256, 3, 2, 1), true),
        (shape(2, 1024, 3, 1024, 1, 2, 0), false),
        (shape(2, 1024, 4, 600, 1, 1, 0), true),
    ] {
        let (depth, k) = (sh.depth(), sh.k);
        assert_eq!(rhs_first(depth, k), first, "{}", sh.describe());
        let w = data(sh.weight_len(), 1.0);
        let w32 = f32s(&w);
        // SAFETY: w32 outlives the Rhs.
        let rhs = unsafe { Rhs::new(depth, k, Mat::rows(w32.as_ptr(), k)) };
        let own = roofline_kernels::cpu::sgemm::F32Gemm::detect().is_some()
            && std::env::var_os("ROOFLINE_F32_GEMM").is_none();
        assert_eq!(rhs.is_packed(), own, "{}", sh.describe());
        // The f32 inputs, exactly, in f64 for the reference.
        let x32 = f32s(&data(sh.input_len(), 0.3));
        let g32 = f32s(&data(sh.output_len(), 4.0));
        let (x, gy, w) = (f64s(&x32), f64s(&g32), f64s(&w32));
        let mut y = vec![0f32; sh.output_len()];
        let mut dx = vec![0f32; sh.input_len()];
        let mut dw = vec![0f32; sh.weight_len()];
        forward(&x32, &w32, &mut y, &sh);
        backward_data(&g32, &w32, &mut dx, &sh);
        backward_filter(&x32, &g32, &mut dw, &sh);
        let prior: Vec<f32> = (0..sh.input_len()).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut sum = prior.clone();
        backward_data_add(&g32, &w32, &mut sum, &sh);
        let bound = 1e-6 * depth as f64;
        for (a, b) in y.iter().zip(direct(&x, &w, &sh)) {
            assert!((*a as f64 - b).abs() < bound, "{}: {a} {b}", sh.describe());
        }
        for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
            let err = (s - (p + d)).abs();
            assert!(
                err <= 1e-5 * (p.abs() + d.abs()).max(1.0),
                "{}: {s} {p} {d}",
                sh.describe()
            );
        }
        // Backward data and filter by the adjoint identities, against the f64 forward.
        let yg: f64 = direct(&x, &w, &sh)
            .iter()
            .zip(&gy)
            .map(|(a, b)| a * b)
            .sum();
        let xdx: f64 = x.iter().zip(&dx).map(|(a, b)| a * *b as f64).sum();
        let wdw: f64 = w.iter().zip(&dw).map(|(a, b)| a * *b as f64).sum();
        assert_filter_gradient(&dw, &x, &gy, &sh, 1e-5);
        // Within f32 rounding of the sum's terms, Σ |x|·|w|·|g|, not of the sum, which can be
        // small beside them: on a Zen 3 (AVX2, the gemm crate) the last shape's backward data
        // came 1.3e-4 of the sum from f64's, 5e-10 of the terms (at most 4e-9 here).
        let abs = |v: &[f64]| v.iter().map(|a| a.abs()).collect::<Vec<f64>>();
        let terms: f64 = direct(&abs(&x), &abs(&w), &sh)
            .iter()
            .zip(&gy)
            .map(|(a, b)| a * b.abs())
            .sum();
        for (what, v) in [("backward data", xdx), ("backward filter", wdw)] {
            assert!(
                (yg - v).abs() < 1e-7 * terms,
                "{} {what}: {yg} {v} (terms {terms})",
                sh.describe()
            );
        }
    }
}

/// With bf16 products (the filter packed once per call), forward and backward-data of f32
/// tensors agree with f64 sums within bf16 rounding, across image groups and ragged blocks.
#[test]
fn bf16_products_agree_with_direct_sums() {
    let pool = bf16_pool();
    for sh in [
        shape(9, 16, 4, 40, 3, 1, 1),
        shape(3, 8, 12, 33, 3, 2, 1),
        shape(4, 48, 6, 40, 1, 1, 0),
    ] {
        let x = data(sh.input_len(), 0.3);
        let w = data(sh.weight_len(), 1.0);
        let gy = data(sh.output_len(), 4.0);
        let (x32, w32, g32) = (f32s(&x), f32s(&w), f32s(&gy));
        let (mut y, mut dx) = (vec![0f32; sh.output_len()], vec![0f32; sh.input_len()]);
        let prior: Vec<f32> = (0..sh.input_len()).map(|i| (i % 7) as f32 - 3.0).collect();
        let mut sum = prior.clone();
        pool.install(|| {
            forward(&x32, &w32, &mut y, &sh);
            backward_data(&g32, &w32, &mut dx, &sh);
            backward_data_add(&g32, &w32, &mut sum, &sh);
        });
        // The sum in the products' f32 accumulators: within f32 rounding of prior + dx.
        for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
            assert!(
                (s - (p + d)).abs() <= 1e-5 * (p.abs() + d.abs()).max(1.0),
                "{}: {s} vs {p} + {d}",
                sh.describe()
            );
        }
        let want = direct(&x, &w, &sh);
        for (a, b) in y.iter().zip(&want) {
            assert!(
                (*a as f64 - b).abs() < 0.02 * (sh.depth() as f64).sqrt(),
                "{}",
                sh.describe()
            );
        }
        // Backward-data through the adjoint identity <conv(x,w), g> = <x, bwd_data(g,w)>.
        let yg: f64 = want.iter().zip(&gy).map(|(a, b)| a * b).sum();
        let xdx: f64 = x.iter().zip(&dx).map(|(a, b)| a * *b as f64).sum();
        assert!(
            (yg - xdx).abs() < 1e-2 * yg.abs().max(1.0),
            "{}: {yg} {xdx}",
            sh.describe()
        );
    }
}

/// With bf16 products, filter gradients of f32 tensors agree element by element with f64
/// sums within bf16 rounding of their terms, on the shapes whose f32 products take B packed
/// first (`rhs_first`: a strided 3×3, a 1×1) and on others.
#[test]
fn bf16_filter_gradients_agree_with_direct_sums() {
    let pool = bf16_pool();
    for (sh, first) in [
        (shape(3, 8, 12, 33, 3, 2, 1), false),
        (shape(3, 256, 6, 256, 3, 2, 1), true),
        (shape(2, 1024, 3, 1024, 1, 2, 0), false),
        (shape(2, 1024, 4, 600, 1, 1, 0), true),
    ] {
        assert_eq!(rhs_first(sh.depth(), sh.k), first, "{}", sh.describe());
        let (x32, g32) = (
            f32s(&data(sh.input_len(), 0.3)),
            f32s(&data(sh.output_len(), 4.0)),
        );
        let mut dw = vec![0f32; sh.weight_len()];
        pool.install(|| backward_filter(&x32, &g32, &mut dw, &sh));
        let (x, gy) = (f64s(&x32), f64s(&g32));
        // Each term's two roundings to bf16: within 2·2⁻⁹ of it, and the f32 sums.
        assert_filter_gradient(&dw, &x, &gy, &sh, 5e-3);
    }
}

/// With bf16 products, an input gradient added into one kept in bf16
/// (`backward_data_add_half`) is the f32 sum of the kept value and the f32 products' gradient,
/// rounded once, element by element: on a 1×1 layer (blocks of rows through scratch, the last
/// one short) and on a strided 3×3 one (the gradient whole, then added).
#[test]
fn bf16_input_gradient_added_in_bf16_rounds_the_f32_sum() {
    let pool = bf16_pool();
    let round = |v: &[f32]| {
        let mut out = vec![std::mem::MaybeUninit::uninit(); v.len()];
        round_bf16(v, &mut out);
        // SAFETY: round_bf16 wrote every element.
        out.iter()
            .map(|b| unsafe { b.assume_init() })
            .collect::<Vec<bf16>>()
    };
    for sh in [shape(12, 48, 9, 40, 1, 1, 0), shape(3, 8, 12, 33, 3, 2, 1)] {
        assert!(sh.rows() > block_rows::<f32>(sh.depth()) || !pointwise(&sh));
        let (w32, g32) = (
            f32s(&data(sh.weight_len(), 1.0)),
            f32s(&data(sh.output_len(), 4.0)),
        );
        let prior = round(&f32s(&data(sh.input_len(), 2.0)));
        let mut dx = vec![0f32; sh.input_len()];
        let mut sum = prior.clone();
        pool.install(|| {
            backward_data(&g32, &w32, &mut dx, &sh);
            backward_data_add_half(&g32, &w32, &mut sum, &sh);
        });
        let want: Vec<f32> = prior.iter().zip(&dx).map(|(p, d)| p.to_f32() + d).collect();
        assert_eq!(sum, round(&want), "{}", sh.describe());
        assert!(sum.iter().zip(&prior).any(|(s, p)| s != p), "added");
    }
}

/// With bf16 products, a layer's output rounded to bf16 as it is stored (`forward_half`) is the
/// f32 output rounded, element by element: a 1×1 layer (blocks of rows through scratch, the
/// last one short), a 3×3 one on F(2×2, 3×3) where that path is taken (not on AMX: its output
/// transform rounding lane by lane, 16 channels at a time and the rest one by one), and the
/// im2col layers: a strided 1×1 (a projection), a strided 3×3 in blocks of rows, and a 3×3 on
/// 5×5 images taken several images to a block (`tiling`).
#[test]
fn bf16_output_rounded_as_stored_is_the_f32_output_rounded() {
    let pool = bf16_pool();
    let shapes = [
        shape(12, 40, 9, 48, 1, 1, 0),
        shape(2, 24, 10, 40, 3, 1, 1),
        shape(3, 8, 12, 33, 1, 2, 0),
        shape(2, 64, 63, 40, 3, 2, 1),
        shape(9, 16, 5, 24, 3, 1, 1),
    ];
    for sh in shapes {
        let (x32, w32) = (
            f32s(&data(sh.input_len(), 0.3)),
            f32s(&data(sh.weight_len(), 1.0)),
        );
        let mut y = vec![0f32; sh.output_len()];
        let mut h = vec![std::mem::MaybeUninit::uninit(); sh.output_len()];
        pool.install(|| {
            forward(&x32, &w32, &mut y, &sh);
            forward_half(&x32, &w32, &mut h, &sh);
        });
        assert!(!pointwise(&sh) || sh.rows() > block_rows::<f32>(sh.k));
        let mut want = vec![std::mem::MaybeUninit::uninit(); y.len()];
        round_bf16(&y, &mut want);
        // SAFETY: both were written whole.
        let (h, want): (Vec<bf16>, Vec<bf16>) = unsafe {
            (
                h.iter().map(|v| v.assume_init()).collect(),
                want.iter().map(|v| v.assume_init()).collect(),
            )
        };
        assert_eq!(h, want, "{}", sh.describe());
    }
}
