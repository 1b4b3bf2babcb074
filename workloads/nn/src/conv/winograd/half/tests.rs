use super::*;
use crate::conv::tests::{data, direct, shape};
use crate::conv::winograd::{backward_data as exact_data, backward_filter as exact_filter};
use crate::tensor::as_uninit;
use half::bf16;

/// `Bᵀ` of Lavin & Gray's F(2×2, 3×3), points 0, ±1, ∞ (rows: the transform points).
const BT: [[f64; 4]; 4] = [
    [1.0, 0.0, -1.0, 0.0],
    [0.0, 1.0, 1.0, 0.0],
    [0.0, -1.0, 1.0, 0.0],
    [0.0, 1.0, 0.0, -1.0],
];

/// `G` (4 × 3).
const GM: [[f64; 3]; 4] = [
    [1.0, 0.0, 0.0],
    [0.5, 0.5, 0.5],
    [0.5, -0.5, 0.5],
    [0.0, 0.0, 1.0],
];

/// `Aᵀ` (2 × 4).
const ATM: [[f64; 4]; 2] = [[1.0, 1.0, 1.0, 0.0], [0.0, 1.0, -1.0, -1.0]];

/// The written-out transforms are the matrices (and their transposes, for the adjoints).
#[test]
fn the_formulas_are_lavin_and_grays_matrices() {
    super::super::tests::check_minimal::<F2, 4, 2>(&BT, &GM, &ATM);
}

/// The fast products where the CPU has them, else the portable ones (the same sums).
fn fast() -> Bf16Gemm {
    Bf16Gemm::detect().unwrap_or_else(|_| Bf16Gemm::portable())
}

/// Each value rounded to bf16 as the products round their operands, in f64.
fn rounded(v: &[f32]) -> Vec<f64> {
    let r = roofline_kernels::cpu::bf16::round;
    v.iter()
        .map(|&a| f32::from_bits((r(a) as u32) << 16) as f64)
        .collect()
}

fn f64s(v: &[f32]) -> Vec<f64> {
    v.iter().map(|&a| a as f64).collect()
}

fn abs(v: &[f64]) -> Vec<f64> {
    v.iter().map(|a| a.abs()).collect()
}

/// `‖got − want‖ / ‖want‖`.
fn normwise(got: &[f64], want: &[f64]) -> f64 {
    let d: f64 = got.iter().zip(want).map(|(a, b)| (a - b).powi(2)).sum();
    let n: f64 = want.iter().map(|b| b * b).sum();
    (d / n).sqrt()
}

/// The three passes in f64 by the exact F(4×4, 3×3) passes (whose agreement with direct sums
/// is `winograd::tests`): `(y, dx, dw)`.
fn exact(x: &[f64], w: &[f64], g: &[f64], sh: &ConvShape) -> [Vec<f64>; 3] {
    let mut dx = vec![0.0; sh.input_len()];
    let mut dw = vec![0.0; sh.weight_len()];
    // SAFETY: dx is written over.
    unsafe { exact_data(g, w, as_uninit(&mut dx), sh, false) };
    exact_filter(x, g, &mut dw, sh);
    [direct(x, w, sh), dx, dw]
}

/// Each value rounded to bf16, kept so.
fn halves(v: &[f32]) -> Vec<bf16> {
    v.iter()
        .map(|&a| bf16::from_bits(roofline_kernels::cpu::bf16::round(a)))
        .collect()
}

/// The three passes (the input gradient added to `prior`) in blocks of the given tiles.
fn passes(
    gemm: &Bf16Gemm,
    (x, w, g, prior): (&[f32], &[f32], &[f32], &[f32]),
    sh: &ConvShape,
    (tb, tbf): (usize, usize),
) -> [Vec<f64>; 4] {
    let mut y = vec![0f32; sh.output_len()];
    let mut dx = vec![0f32; sh.input_len()];
    let mut sum = prior.to_vec();
    let mut dw = vec![0f32; sh.weight_len()];
    let (x, g) = (&halves(x)[..], &halves(g)[..]);
    // SAFETY: y and dx are written over, sum is initialised.
    unsafe {
        forward_by(gemm, x, w, as_uninit(&mut y), sh, tb);
        backward_data_by(gemm, g, w, as_uninit(&mut dx), sh, false, tb);
        backward_data_by(gemm, g, w, as_uninit(&mut sum), sh, true, tb);
    }
    backward_filter_by(gemm, x, g, &mut dw, sh, tbf);
    [f64s(&y), f64s(&dx), f64s(&sum), f64s(&dw)]
}

/// Each pass against the exact sums: normwise within a small multiple of the error of the
/// direct sums of the same operands rounded to bf16 (the error the im2col products make):
/// 2.5× on uniform noise, where every pass measured 1.8–2.0× (0.39% against 0.21%), 3.5× on
/// smooth data, whose sums cancel (1.4–2.9×); F(4×4, 3×3) would be ten times it. And every
/// entry within 2⁻⁶ of its terms' magnitudes (a tile in a wrong place, or a term missing, is
/// off by about its whole value). On whole and cut
/// tiles, channels in vectors and not, blocks of one tile to many, the last one short, images
/// grouped per input-gradient task, filter-gradient parts of one block and of several; on the
/// CPU's products and the portable ones.
#[test]
fn the_three_passes_stay_within_bf16_rounding_of_the_exact_sums() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let cases = [
        (shape(2, 19, 9, 21, 3, 1, 1), (28, 32), fast()),
        (shape(9, 32, 5, 48, 3, 1, 1), (14, 64), fast()),
        (shape(3, 64, 8, 40, 3, 1, 1), (1, 256), fast()),
        (
            shape(2, 48, 12, 64, 3, 1, 1),
            (block_tiles(48, 64), 96),
            fast(),
        ),
        (shape(2, 7, 6, 18, 3, 1, 1), (14, 32), Bf16Gemm::portable()),
    ];
    for (sh, blocks, gemm) in cases {
        // Uniform noise, and smooth data (sines along the channels: sums that cancel).
        for (make, bound) in [(noise as fn(usize, f64) -> Vec<f64>, 2.5), (data, 3.5)] {
            let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
            let (x, w, g, prior) = (
                f32s(make(sh.input_len(), 0.3)),
                f32s(make(sh.weight_len(), 1.1)),
                f32s(make(sh.output_len(), 4.2)),
                f32s(make(sh.input_len(), 2.7)),
            );
            let [y, dx, sum, dw] =
                pool.install(|| passes(&gemm, (&x, &w, &g, &prior), &sh, blocks));
            let want = exact(&f64s(&x), &f64s(&w), &f64s(&g), &sh);
            let direct_bf16 = exact(&rounded(&x), &rounded(&w), &rounded(&g), &sh);
            let size = exact(&abs(&f64s(&x)), &abs(&f64s(&w)), &abs(&f64s(&g)), &sh);
            for (i, (what, got)) in [
                ("forward", &y),
                ("backward data", &dx),
                ("backward filter", &dw),
            ]
            .into_iter()
            .enumerate()
            {
                let (e, e_direct) = (normwise(got, &want[i]), normwise(&direct_bf16[i], &want[i]));
                assert!(
                    e <= bound * e_direct,
                    "{} {what}: error {e:.2e}, direct bf16 {e_direct:.2e}",
                    sh.describe()
                );
                for (j, ((a, b), s)) in got.iter().zip(&want[i]).zip(&size[i]).enumerate() {
                    assert!(
                        (a - b).abs() <= s / 64.0,
                        "{} {what}[{j}]: {a}, want {b} (of {s})",
                        sh.describe()
                    );
                }
            }
            // The input gradient added to the prior in the f32 sums.
            for ((s, p), d) in sum.iter().zip(&prior).zip(&dx) {
                let p = *p as f64;
                assert!(
                    (s - (p + d)).abs() <= 1e-5 * (p.abs() + d.abs()).max(1.0),
                    "{}: {s} vs {p} + {d}",
                    sh.describe()
                );
            }
        }
    }
}

/// Values spread evenly over (−1, 1) in no order (splitmix64 of the index).
fn noise(len: usize, seed: f64) -> Vec<f64> {
    let s = (seed * 1000.0) as u64;
    (0..len as u64)
        .map(|i| {
            let mut z = (i + (s << 32)).wrapping_mul(0x9E37_79B9_7F4A_7C15);
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            (z ^ (z >> 31)) as f64 / u64::MAX as f64 * 2.0 - 1.0
        })
        .collect()
}

/// The forward pass and the input gradient have the same bits on one thread and on three; an
/// input kept in bf16 gives the bits of its f32 value (which the passes round first);
/// `conv`'s passes take this path for 3×3 stride-1 layers of f32 tensors under bf16 products.
#[test]
fn threads_storage_and_dispatch_change_no_bit() {
    // Every pass on F(2×2, 3×3): 8 × 9 images (tiles cover 8 × 10), 128 channels.
    let sh = shape(3, 128, 8, 128, 3, 1, 1);
    assert!(applies_to(sh.h, sh.w) && filter_applies_to(sh.h, sh.w, sh.c, sh.k));
    let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
    let (x, w, g) = (
        f32s(noise(sh.input_len(), 0.5)),
        f32s(noise(sh.weight_len(), 1.3)),
        f32s(noise(sh.output_len(), 3.3)),
    );
    let (xh, gh) = (halves(&x), halves(&g));
    let gemm = fast();
    let run = |threads: usize| {
        let pool = rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap();
        pool.install(|| {
            let (mut y, mut dx) = (vec![0f32; sh.output_len()], vec![0f32; sh.input_len()]);
            // SAFETY: written over.
            unsafe {
                forward_by(&gemm, &xh, &w, as_uninit(&mut y), &sh, 14);
                backward_data_by(&gemm, &gh, &w, as_uninit(&mut dx), &sh, false, 14);
            }
            (y, dx)
        })
    };
    let one = run(1);
    assert!(run(3) == one, "three threads");

    // On the vector kernels, which F(2×2) is for (on AMX, conv's passes stay on im2col).
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let gemm = gemm.without_amx();
    crate::tensor::set_products(&pool, crate::tensor::Products::Bf16(gemm));
    pool.install(|| {
        let (mut a, mut b) = (vec![0f32; sh.output_len()], vec![0f32; sh.output_len()]);
        let (mut da, mut db) = (vec![0f32; sh.input_len()], vec![0f32; sh.input_len()]);
        let (mut wa, mut wb) = (vec![0f32; sh.weight_len()], vec![0f32; sh.weight_len()]);
        // SAFETY: written over.
        unsafe {
            forward(&gemm, &xh, &w, as_uninit(&mut a), &sh);
            backward_data(&gemm, &gh, &w, as_uninit(&mut da), &sh, false);
        }
        backward_filter(&gemm, &xh, &gh, &mut wa, &sh);
        // From f32, through conv's entry points, which must take this path.
        crate::conv::forward(&x, &w, &mut b, &sh);
        crate::conv::backward_data(&g, &w, &mut db, &sh);
        crate::conv::backward_filter(&x, &g, &mut wb, &sh);
        assert!(a == b, "forward");
        assert!(da == db, "backward data");
        assert!(wa == wb, "backward filter");
    });
}

/// The written-out tile transforms against the generic ones (`two_d` over `F2`'s formulas),
/// on whole and cut tiles, 19 channels (a vector and three alone): within f32 rounding (they
/// apply the two one-dimensional passes in another order).
#[test]
fn the_written_out_tiles_are_the_generic_transforms() {
    use super::super::{input_gradient_tile, input_tile, output_gradient_tile, output_tile, Out};
    let sh = shape(2, 19, 5, 19, 3, 1, 1);
    let g = Grid::new(&sh, 2);
    let c = sh.c;
    let f32s = |v: Vec<f64>| v.into_iter().map(|a| a as f32).collect::<Vec<f32>>();
    let x = halves(&f32s(noise(sh.input_len(), 0.9)));
    // The generic routines read f32: the bf16 values widened (exactly).
    let xw: Vec<f32> = x.iter().map(|v| v.to_f32()).collect();
    let rows = f32s(noise(XI * c, 1.7));
    let close = |a: &[f32], b: &[f32], what: &str| {
        for (i, (p, q)) in a.iter().zip(b).enumerate() {
            assert!(
                (p - q).abs() <= 1e-6 * (1.0 + q.abs()),
                "{what}[{i}]: {p} {q}"
            );
        }
    };
    for t in 0..g.tiles() {
        let (mut fast, mut slow) = (vec![0f32; XI * c], vec![0f32; XI * c]);
        // SAFETY: one row of 16 points of c values each.
        unsafe {
            tiles::input(&x, &g, c, t, fast.as_mut_ptr());
            input_tile::<f32, F2, 4, 2>(&xw, g, c, t, Out(slow.as_mut_ptr()), (1, 0));
        }
        close(&fast, &slow, "input");
        // The output gradient: x read as an output gradient (same sizes: c = k, stride 1).
        // SAFETY: as above.
        unsafe {
            tiles::output_gradient(&x, &g, c, t, fast.as_mut_ptr());
            output_gradient_tile::<f32, F2, 4, 2>(&xw, g, c, t, Out(slow.as_mut_ptr()), (1, 0));
        }
        close(&fast, &slow, "output gradient");
        let (mut yf, mut ys) = (vec![0f32; sh.output_len()], vec![0f32; sh.output_len()]);
        // SAFETY: rows holds 16 points of c values; y is the grid's outputs.
        unsafe {
            tiles::output(rows.as_ptr(), &g, c, t, yf.as_mut_ptr());
            output_tile::<f32, F2, 4, 2>(&rows, (1, 0), g, c, t, Out(ys.as_mut_ptr()));
        }
        close(&yf, &ys, "output");
        let per = g.per_image();
        let img = t / per;
        let len = sh.h * sh.w * c;
        let (mut df, mut ds) = (vec![0.5f32; len], vec![0.5f32; len]);
        // SAFETY: rows holds 16 points of c values.
        unsafe { tiles::input_gradient(rows.as_ptr(), &g, c, t, &mut df) };
        input_gradient_tile::<f32, F2, 4, 2>(&rows, (1, 0), g, c, t, &mut ds);
        close(&df, &ds, &format!("input gradient of image {img}"));
    }
}

/// The shapes the passes take: ResNet-50's 56², 28², 14² images, not its 7² ones; the filter
/// gradient with 128 channels or more; products on the vector kernels, not on AMX.
#[test]
fn the_rules_take_the_shapes_measured_faster() {
    assert!(pays_with(Path::Avx512Bf16) && pays_with(Path::Portable));
    assert!(!pays_with(Path::Amx));
    for side in [56, 28, 14] {
        assert!(applies_to(side, side), "{side}");
        assert!(filter_applies_to(side, side, 128, 128), "{side}");
        assert!(!filter_applies_to(side, side, 64, 64), "{side}");
    }
    assert!(!applies_to(7, 7));
    assert!(!filter_applies_to(7, 7, 512, 512));
}
