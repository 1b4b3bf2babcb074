//! F(2×2, 3×3)'s four tile transforms, written for f32 values in vectors of 16 channels: the
//! generic ones (`two_d` over `Minimal`'s formulas), with four outputs to a tile where
//! F(4×4, 3×3) has sixteen, spent more time per tile than the products of a 64-channel layer
//! (trainer_conv, layer1.0 conv2 forward in bf16: output transform 7.9 ms, input 4.5, products
//! 4.5). A tile's transformed row holds its 16 points, point ξ = 4·i + j at `ξ · width`, as
//! `two_d` lays them out (the tests hold each against the generic transform).

use super::super::Grid;
use half::bf16;

/// `N` values from `p`.
///
/// # Safety
/// `p` points at `N` readable f32.
#[inline(always)]
unsafe fn get<const N: usize>(p: *const f32) -> [f32; N] {
    // SAFETY: the caller's contract.
    unsafe { (p as *const [f32; N]).read_unaligned() }
}

/// `N` values to `p`.
///
/// # Safety
/// `p` points at `N` writable f32.
#[inline(always)]
unsafe fn put<const N: usize>(p: *mut f32, v: [f32; N]) {
    // SAFETY: the caller's contract.
    unsafe { (p as *mut [f32; N]).write_unaligned(v) }
}

/// Where an output transform's lanes are stored: f32, or bf16 (a batch norm's input in bf16
/// training), rounded lane by lane as `round_slice` rounds (`round_lanes`, branch-free so that
/// the loop vectorises).
pub(super) trait Lanes: Copy {
    /// `N` values to `p`.
    ///
    /// # Safety
    /// `p` points at `N` writable elements.
    unsafe fn put<const N: usize>(p: *mut Self, v: [f32; N]);
}

impl Lanes for f32 {
    #[inline(always)]
    unsafe fn put<const N: usize>(p: *mut f32, v: [f32; N]) {
        // SAFETY: the caller's contract.
        unsafe { put(p, v) }
    }
}

impl Lanes for bf16 {
    #[inline(always)]
    unsafe fn put<const N: usize>(p: *mut bf16, v: [f32; N]) {
        let mut r = [bf16::ZERO; N];
        for l in 0..N {
            r[l] = bf16::from_bits(roofline_kernels::cpu::bf16::round_lanes(v[l]));
        }
        // SAFETY: the caller's contract.
        unsafe { (p as *mut [bf16; N]).write_unaligned(r) }
    }
}

// Lane by lane in plain loops: `std::array::from_fn` and `map` were not always inlined (perf:
// `try_map` called for every vector).

/// `N` bf16 values widened (exactly) to f32.
#[inline(always)]
fn wide<const N: usize>(s: &[bf16]) -> [f32; N] {
    let s = &s[..N];
    let mut r = [0f32; N];
    for l in 0..N {
        r[l] = f32::from_bits((s[l].to_bits() as u32) << 16);
    }
    r
}

#[inline(always)]
fn add<const N: usize>(mut a: [f32; N], b: [f32; N]) -> [f32; N] {
    for l in 0..N {
        a[l] += b[l];
    }
    a
}

#[inline(always)]
fn sub<const N: usize>(mut a: [f32; N], b: [f32; N]) -> [f32; N] {
    for l in 0..N {
        a[l] -= b[l];
    }
    a
}

#[inline(always)]
fn neg<const N: usize>(mut a: [f32; N]) -> [f32; N] {
    for v in &mut a {
        *v = -*v;
    }
    a
}

/// Column `j` of `R` rows of vectors.
#[inline(always)]
fn column<const N: usize, const R: usize, const C: usize>(
    rows: &[[[f32; N]; C]; R],
    j: usize,
) -> [[f32; N]; R] {
    let mut col = [[0f32; N]; R];
    for (c, row) in col.iter_mut().zip(rows) {
        *c = row[j];
    }
    col
}

/// `Bᵀ d` (4 → 4).
#[inline(always)]
fn bt<const N: usize>([d0, d1, d2, d3]: [[f32; N]; 4]) -> [[f32; N]; 4] {
    [sub(d0, d2), add(d1, d2), sub(d2, d1), sub(d1, d3)]
}

/// `B v` (4 → 4).
#[inline(always)]
fn b<const N: usize>([v0, v1, v2, v3]: [[f32; N]; 4]) -> [[f32; N]; 4] {
    [v0, add(sub(v1, v2), v3), sub(add(v1, v2), v0), neg(v3)]
}

/// `Aᵀ m` (4 → 2).
#[inline(always)]
fn at<const N: usize>([m0, m1, m2, m3]: [[f32; N]; 4]) -> [[f32; N]; 2] {
    [add(add(m0, m1), m2), sub(sub(m1, m2), m3)]
}

/// `A o` (2 → 4).
#[inline(always)]
fn a<const N: usize>([o0, o1]: [[f32; N]; 2]) -> [[f32; N]; 4] {
    [o0, add(o0, o1), sub(o0, o1), neg(o1)]
}

/// Runs `$body` for the channels `0..$c` in vectors of 16 (`$n` = 16), the rest one by one.
macro_rules! by_16 {
    ($c:expr, |$c0:ident, $n:ident| $body:block) => {{
        let full = $c / 16 * 16;
        for $c0 in (0..full).step_by(16) {
            const $n: usize = 16;
            $body
        }
        for $c0 in full..$c {
            const $n: usize = 1;
            $body
        }
    }};
}

/// Tile `t`'s input transform `Bᵀ d B` (`x` NHWC, `c` channels, zero outside the image) to
/// `v` (`v[ξ · c + ch]`).
///
/// # Safety
/// `v` points at `16 · c` writable f32.
#[inline(always)]
pub(super) unsafe fn input(x: &[bf16], g: &Grid, c: usize, t: usize, v: *mut f32) {
    let (img, oy, ox) = g.origin(t);
    by_16!(c, |c0, N| {
        let mut d = [[[0f32; N]; 4]; 4];
        for (r, row) in d.iter_mut().enumerate() {
            let iy = oy + r;
            if iy == 0 || iy > g.h {
                continue;
            }
            for (s, lanes) in row.iter_mut().enumerate() {
                let ix = ox + s;
                if ix == 0 || ix > g.w {
                    continue;
                }
                *lanes = wide(&x[((img * g.h + iy - 1) * g.w + ix - 1) * c + c0..]);
            }
        }
        let mut rows = [[[0f32; N]; 4]; 4];
        for (r, row) in rows.iter_mut().zip(d) {
            *r = bt(row);
        }
        for j in 0..4 {
            for (i, val) in bt(column(&rows, j)).into_iter().enumerate() {
                // SAFETY: the caller's contract.
                unsafe { put(v.add((4 * i + j) * c + c0), val) };
            }
        }
    });
}

/// Tile `t`'s output-gradient transform `A dY Aᵀ` (`dy` NHWC, `k` channels, zero past the
/// image) to `dm` (`dm[ξ · k + ch]`).
///
/// # Safety
/// `dm` points at `16 · k` writable f32.
#[inline(always)]
pub(super) unsafe fn output_gradient(dy: &[bf16], g: &Grid, k: usize, t: usize, dm: *mut f32) {
    let (img, oy, ox) = g.origin(t);
    by_16!(k, |k0, N| {
        let mut d = [[[0f32; N]; 2]; 2];
        for (r, row) in d.iter_mut().enumerate().take(g.h - oy) {
            for (s, lanes) in row.iter_mut().enumerate().take(g.w - ox) {
                *lanes = wide(&dy[((img * g.h + oy + r) * g.w + ox + s) * k + k0..]);
            }
        }
        let mut rows = [[[0f32; N]; 4]; 2];
        for (r, row) in rows.iter_mut().zip(d) {
            *r = a(row);
        }
        for j in 0..4 {
            for (i, val) in a(column(&rows, j)).into_iter().enumerate() {
                // SAFETY: the caller's contract.
                unsafe { put(dm.add((4 * i + j) * k + k0), val) };
            }
        }
    });
}

/// Tile `t`'s outputs `Aᵀ M A` from `m` (`m[ξ · k + ch]`) into `y` (NHWC, `k` channels), those
/// inside the image.
///
/// # Safety
/// `m` points at `16 · k` readable f32, `y` at `g`'s outputs, tile `t`'s written by no other
/// thread.
#[inline(always)]
pub(super) unsafe fn output<O: Lanes>(m: *const f32, g: &Grid, k: usize, t: usize, y: *mut O) {
    let (img, oy, ox) = g.origin(t);
    by_16!(k, |k0, N| {
        let mut rows = [[[0f32; N]; 2]; 4];
        for (i, row) in rows.iter_mut().enumerate() {
            // SAFETY: the caller's contract (16 points of k values).
            let p = |j: usize| unsafe { get(m.add((4 * i + j) * k + k0)) };
            *row = at([p(0), p(1), p(2), p(3)]);
        }
        for j in 0..2.min(g.w - ox) {
            let col = at(column(&rows, j));
            for (i, val) in col.into_iter().enumerate().take(g.h - oy) {
                let p = ((img * g.h + oy + i) * g.w + ox + j) * k + k0;
                // SAFETY: the caller's contract.
                unsafe { O::put(y.add(p), val) };
            }
        }
    });
}

/// Adds tile `t`'s input gradient `B dV Bᵀ` from `dv` (`dv[ξ · c + ch]`) into its image's
/// gradient `dx_img` (HWC, `c` channels), the parts inside the image.
///
/// # Safety
/// `dv` points at `16 · c` readable f32.
#[inline(always)]
pub(super) unsafe fn input_gradient(
    dv: *const f32,
    g: &Grid,
    c: usize,
    t: usize,
    dx_img: &mut [f32],
) {
    let (_, oy, ox) = g.origin(t);
    by_16!(c, |c0, N| {
        let mut rows = [[[0f32; N]; 4]; 4];
        for (i, row) in rows.iter_mut().enumerate() {
            // SAFETY: the caller's contract (16 points of c values).
            let p = |j: usize| unsafe { get(dv.add((4 * i + j) * c + c0)) };
            *row = b([p(0), p(1), p(2), p(3)]);
        }
        for s in 0..4 {
            let ix = ox + s;
            if ix == 0 || ix > g.w {
                continue;
            }
            let col = b(column(&rows, s));
            for (r, val) in col.into_iter().enumerate() {
                let iy = oy + r;
                if iy == 0 || iy > g.h {
                    continue;
                }
                let p = ((iy - 1) * g.w + ix - 1) * c + c0;
                for (d, v) in dx_img[p..p + N].iter_mut().zip(val) {
                    *d += v;
                }
            }
        }
    });
}
