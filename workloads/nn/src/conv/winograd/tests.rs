use super::*;
use crate::conv::tests::{data, direct, shape};
use crate::tensor::as_uninit;

fn forward_vec<T: Float>(x: &[T], w: &[T], sh: &ConvShape) -> Vec<T> {
    let mut y = vec![T::zero(); sh.output_len()];
    // SAFETY: forward writes every element.
    forward(x, w, unsafe { as_uninit(&mut y) }, sh);
    y
}

fn backward_data_vec<T: Float>(dy: &[T], w: &[T], sh: &ConvShape, prior: Option<&[T]>) -> Vec<T> {
    let mut dx = prior.map_or_else(|| vec![T::zero(); sh.input_len()], |p| p.to_vec());
    // SAFETY: dx is initialised.
    unsafe { backward_data(dy, w, as_uninit(&mut dx), sh, prior.is_some()) };
    dx
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Sides that are and are not multiples of 4 (whole and cut tiles), channels in full vectors,
/// alone and with a remainder: the forward pass against direct sums, both backward passes
/// through the adjoint identities <conv(x,w), g> = <x, bwd_data(g,w)> = <w, bwd_filter(x,g)>,
/// and the input gradient added to one already there.
#[test]
fn the_three_passes_in_f64_agree_with_direct_sums() {
    for sh in [
        shape(2, 3, 7, 4, 3, 1, 1),
        shape(1, 19, 8, 21, 3, 1, 1),
        shape(3, 16, 5, 32, 3, 1, 1),
        shape(2, 2, 1, 3, 3, 1, 1),
        shape(1, 33, 14, 17, 3, 1, 1),
    ] {
        assert!(applies(&sh));
        let x = data(sh.input_len(), 0.1);
        let w = data(sh.weight_len(), 2.0);
        let g = data(sh.output_len(), 5.0);
        let y = forward_vec(&x, &w, &sh);
        let want = direct(&x, &w, &sh);
        let scale = want.iter().fold(1.0f64, |m, v| m.max(v.abs()));
        for (a, b) in y.iter().zip(&want) {
            assert!((a - b).abs() < 1e-12 * scale, "{}: {a} {b}", sh.describe());
        }
        let dx = backward_data_vec(&g, &w, &sh, None);
        let mut dw = vec![0.0; sh.weight_len()];
        backward_filter(&x, &g, &mut dw, &sh);
        let yg = dot(&want, &g);
        for (what, v) in [("data", dot(&x, &dx)), ("filter", dot(&w, &dw))] {
            assert!(
                (yg - v).abs() < 1e-10 * yg.abs().max(1.0),
                "{} backward {what}: {yg} {v}",
                sh.describe()
            );
        }
        let prior = data(sh.input_len(), 7.0);
        let sum = backward_data_vec(&g, &w, &sh, Some(&prior));
        for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
            assert!((s - (p + d)).abs() < 1e-12, "{}", sh.describe());
        }
    }
}

/// Each entry of the backward passes against its own direct sum (not only their inner
/// products): the input gradient is the transposed convolution, the filter gradient the
/// correlation of the input with the output gradient.
#[test]
fn each_gradient_entry_is_its_direct_sum() {
    let sh = shape(2, 5, 6, 7, 3, 1, 1);
    let (x, w, g) = (
        data(sh.input_len(), 0.4),
        data(sh.weight_len(), 1.5),
        data(sh.output_len(), 3.0),
    );
    let dx = backward_data_vec(&g, &w, &sh, None);
    let mut dw = vec![0.0; sh.weight_len()];
    backward_filter(&x, &g, &mut dw, &sh);
    let (h, wd, c, k) = (sh.h as isize, sh.w as isize, sh.c, sh.k);
    let at = |n: usize, y: isize, x: isize, ch: usize, chans: usize| {
        ((n * sh.h + y as usize) * sh.w + x as usize) * chans + ch
    };
    for n in 0..sh.n {
        for iy in 0..h {
            for ix in 0..wd {
                for ci in 0..c {
                    let mut s = 0.0;
                    for r in 0..3 {
                        for q in 0..3 {
                            let (oy, ox) = (iy + 1 - r as isize, ix + 1 - q as isize);
                            if oy < 0 || ox < 0 || oy >= h || ox >= wd {
                                continue;
                            }
                            for ko in 0..k {
                                s += g[at(n, oy, ox, ko, k)] * w[((r * 3 + q) * c + ci) * k + ko];
                            }
                        }
                    }
                    let got = dx[at(n, iy, ix, ci, c)];
                    assert!((got - s).abs() < 1e-12, "dx {n} {iy} {ix} {ci}: {got} {s}");
                }
            }
        }
    }
    for r in 0..3 {
        for q in 0..3 {
            for ci in 0..c {
                for ko in 0..k {
                    let mut s = 0.0;
                    for n in 0..sh.n {
                        for oy in 0..h {
                            for ox in 0..wd {
                                let (iy, ix) = (oy + r as isize - 1, ox + q as isize - 1);
                                if iy < 0 || ix < 0 || iy >= h || ix >= wd {
                                    continue;
                                }
                                s += x[at(n, iy, ix, ci, c)] * g[at(n, oy, ox, ko, k)];
                            }
                        }
                    }
                    let got = dw[((r * 3 + q) * c + ci) * k + ko];
                    assert!((got - s).abs() < 1e-12, "dw {r} {q} {ci} {ko}: {got} {s}");
                }
            }
        }
    }
}

/// In f32, on ResNet-50's layer shapes (64 to 256 channels, sides 56, 14 and 7: whole tiles
/// and cut ones), every pass stays within a small multiple of f32 rounding of the f64 sums,
/// normwise: the transforms' constants (up to 8 and 1/24) cost a few bits, not more.
#[test]
fn f32_errors_stay_near_f32_rounding_on_resnet_shapes() {
    for sh in [
        shape(1, 64, 56, 64, 3, 1, 1),
        shape(2, 256, 14, 256, 3, 1, 1),
        shape(2, 128, 7, 96, 3, 1, 1),
    ] {
        let sh = ConvShape { w: sh.h, ..sh };
        let f = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<f32>>();
        let back = |v: &[f32]| v.iter().map(|&a| a as f64).collect::<Vec<f64>>();
        let (x32, w32, g32) = (
            f(&data(sh.input_len(), 0.3)),
            f(&data(sh.weight_len(), 1.0)),
            f(&data(sh.output_len(), 4.0)),
        );
        let (x, w, g) = (back(&x32), back(&w32), back(&g32));
        let rel = |got: &[f32], want: &[f64]| {
            let err: f64 = got
                .iter()
                .zip(want)
                .map(|(a, b)| (*a as f64 - b).powi(2))
                .sum();
            (err / dot(want, want)).sqrt()
        };
        let y = rel(&forward_vec(&x32, &w32, &sh), &direct(&x, &w, &sh));
        // The f64 Winograd passes as the references of the backward ones (their agreement with
        // direct sums is the test above).
        let dx = rel(
            &backward_data_vec(&g32, &w32, &sh, None),
            &backward_data_vec(&g, &w, &sh, None),
        );
        let mut dw32 = vec![0f32; sh.weight_len()];
        let mut dw = vec![0f64; sh.weight_len()];
        backward_filter(&x32, &g32, &mut dw32, &sh);
        backward_filter(&x, &g, &mut dw, &sh);
        let dw = rel(&dw32, &dw);
        for (what, e) in [
            ("forward", y),
            ("backward data", dx),
            ("backward filter", dw),
        ] {
            assert!(e < 2e-5, "{} {what}: normwise error {e:.2e}", sh.describe());
        }
    }
}

/// Block by block (layers with a small transformed filter) or over the whole batch: the same
/// sums but for the products' rounding, on whole and cut tiles, channels in vectors and not, images of one block and of
/// several (the last one short), filter-gradient parts of one image and of several (nine
/// images in eight parts), in f32 and f64.
#[test]
fn the_blocked_passes_agree_with_the_whole_batch_passes() {
    fn both<T: Float>(sh: &ConvShape) {
        let f = |v: Vec<f64>| v.into_iter().map(T::from_f64).collect::<Vec<T>>();
        let (x, w, g) = (
            f(data(sh.input_len(), 0.4)),
            f(data(sh.weight_len(), 0.9)),
            f(data(sh.output_len(), 2.3)),
        );
        let prior = f(data(sh.input_len(), 3.1));
        let run = |by_block: bool| {
            let mut y = vec![T::zero(); sh.output_len()];
            let mut dx = prior.clone();
            // SAFETY: y is written whole; dx is initialised.
            unsafe {
                forward_by(&x, &w, as_uninit(&mut y), sh, by_block);
                backward_data_by(&g, &w, as_uninit(&mut dx), sh, true, by_block);
            }
            let mut dw = vec![T::zero(); sh.weight_len()];
            backward_filter_by(&x, &g, &mut dw, sh, by_block);
            (y, dx, dw)
        };
        assert!(blocked::applies::<T>(sh.c, sh.k), "{}", sh.describe());
        let ((y1, dx1, dw1), (y0, dx0, dw0)) = (run(true), run(false));
        // Normwise, in units of T's rounding: the products over fewer rows round differently
        // (the gemm crate's kernels for short matrices: 8 units on the third shape's backward
        // data pass, amplified by the transforms as in the whole-batch pass's own error) and
        // the filter gradient sums the batch in another order (53 units on the last shape),
        // where a tile in a wrong place would be off by its whole value (10¹⁵ units in f64).
        let rel = |p: &[T], q: &[T]| {
            let d: f64 = p
                .iter()
                .zip(q)
                .map(|(a, b)| (*a - *b).to_f64().powi(2))
                .sum();
            let n: f64 = q.iter().map(|b| b.to_f64().powi(2)).sum();
            let eps = if std::mem::size_of::<T>() == 4 {
                f32::EPSILON as f64
            } else {
                f64::EPSILON
            };
            (d / n).sqrt() / eps
        };
        for (what, e, bound) in [
            ("forward", rel(&y1, &y0), 32.0),
            ("backward data", rel(&dx1, &dx0), 32.0),
            ("backward filter", rel(&dw1, &dw0), 256.0),
        ] {
            assert!(
                e < bound,
                "{} {what}: {e:.2} units of rounding apart",
                sh.describe()
            );
        }
    }
    for sh in [
        shape(9, 48, 40, 64, 3, 1, 1),
        shape(2, 48, 13, 64, 3, 1, 1),
        shape(3, 20, 9, 24, 3, 1, 1),
        shape(2, 17, 16, 5, 3, 1, 1),
    ] {
        let sh = ConvShape { w: sh.h + 3, ..sh };
        both::<f64>(&sh);
        both::<f32>(&sh);
    }
}

/// The same bits whatever the pool: one thread, two, five.
#[test]
fn the_thread_count_changes_no_bit() {
    let sh = shape(3, 20, 9, 24, 3, 1, 1);
    let f = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
    let (x, w, g) = (
        f(data(sh.input_len(), 0.2)),
        f(data(sh.weight_len(), 0.7)),
        f(data(sh.output_len(), 1.9)),
    );
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let mut dw = vec![0f32; sh.weight_len()];
            backward_filter(&x, &g, &mut dw, &sh);
            (
                forward_vec(&x, &w, &sh),
                backward_data_vec(&g, &w, &sh, None),
                dw,
            )
        })
    };
    let one = run(1);
    for threads in [2, 5] {
        assert!(run(threads) == one, "{threads} threads");
    }
}

/// `Bᵀ` of Lavin & Gray's F(4×4, 3×3), points 0, ±1, ±2, ∞ (rows: the transform points).
const BT: [[f64; 6]; 6] = [
    [4.0, 0.0, -5.0, 0.0, 1.0, 0.0],
    [0.0, -4.0, -4.0, 1.0, 1.0, 0.0],
    [0.0, 4.0, -4.0, -1.0, 1.0, 0.0],
    [0.0, -2.0, -1.0, 2.0, 1.0, 0.0],
    [0.0, 2.0, -1.0, -2.0, 1.0, 0.0],
    [0.0, 4.0, 0.0, -5.0, 0.0, 1.0],
];

/// `G` (6 × 3).
const GM: [[f64; 3]; 6] = [
    [1.0 / 4.0, 0.0, 0.0],
    [-1.0 / 6.0, -1.0 / 6.0, -1.0 / 6.0],
    [-1.0 / 6.0, 1.0 / 6.0, -1.0 / 6.0],
    [1.0 / 24.0, 1.0 / 12.0, 1.0 / 6.0],
    [1.0 / 24.0, -1.0 / 12.0, 1.0 / 6.0],
    [0.0, 0.0, 1.0],
];

/// `Aᵀ` (4 × 6).
const ATM: [[f64; 6]; 4] = [
    [1.0, 1.0, 1.0, 1.0, 1.0, 0.0],
    [0.0, 1.0, -1.0, 2.0, -2.0, 0.0],
    [0.0, 1.0, 1.0, 4.0, 4.0, 0.0],
    [0.0, 1.0, -1.0, 8.0, -8.0, 1.0],
];

/// Column `i` of the matrix a formula applies (its image of the unit vector `i`), each entry
/// against the matrix (`transposed`: its transpose).
fn check<const Q: usize, const P: usize, const R: usize, const C: usize>(
    name: &str,
    f: impl Fn(&Vecs<f64, 1, Q>) -> Vecs<f64, 1, P>,
    m: &[[f64; C]; R],
    transposed: bool,
) {
    for i in 0..Q {
        let mut e = [[0.0]; Q];
        e[i] = [1.0];
        let col = f(&e);
        for (j, got) in col.iter().enumerate() {
            let want = if transposed { m[i][j] } else { m[j][i] };
            assert!(
                (got[0] - want).abs() < 1e-15,
                "{name}[{j}][{i}]: {} vs {want}",
                got[0]
            );
        }
    }
}

/// `F`'s written-out transforms are the matrices `bt` (`Bᵀ`), `g` (`G`) and `at` (`Aᵀ`), and
/// their adjoints the transposes.
pub(super) fn check_minimal<F: Minimal<A, M>, const A: usize, const M: usize>(
    bt: &[[f64; A]; A],
    g: &[[f64; 3]; A],
    at: &[[f64; A]; M],
) {
    check("Bᵀ", F::bt::<f64, 1>, bt, false);
    check("B", F::b::<f64, 1>, bt, true);
    check("Aᵀ", F::at::<f64, 1>, at, false);
    check("A", F::a::<f64, 1>, at, true);
    check("G", F::gf::<f64, 1>, g, false);
    check("Gᵀ", F::gt::<f64, 1>, g, true);
}

/// The written-out transforms are the matrices (and their transposes, for the adjoints).
#[test]
fn the_formulas_are_lavin_and_grays_matrices() {
    check_minimal::<F4, 6, 4>(&BT, &GM, &ATM);
}
