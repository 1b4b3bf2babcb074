//! The one-dimensional transforms of the minimal filtering algorithms F(m×m, 3×3) (Lavin &
//! Gray, 2016), written out: a loop over the matrices' entries compared their zeros and ones at
//! run time, and the transforms took most of the layer's time. `tests` holds the matrices and
//! checks each formula against its matrix or its transpose.

use super::Vecs;
use crate::tensor::Float;

/// F(m×m, 3×3) on `A = m + 2` points: its input transform `Bᵀ` and output transform `Aᵀ`
/// (`A × A` and `M × A`), its filter transform `G` (`A × 3`), and their adjoints, which the
/// backward passes apply in reverse order.
pub(super) trait Minimal<const A: usize, const M: usize> {
    /// `Bᵀ d` (A → A): the input transform.
    fn bt<T: Float, const N: usize>(d: &Vecs<T, N, A>) -> Vecs<T, N, A>;
    /// `B v` (A → A): the adjoint of the input transform.
    fn b<T: Float, const N: usize>(v: &Vecs<T, N, A>) -> Vecs<T, N, A>;
    /// `Aᵀ m` (A → M): the output transform.
    fn at<T: Float, const N: usize>(m: &Vecs<T, N, A>) -> Vecs<T, N, M>;
    /// `A o` (M → A): the adjoint of the output transform.
    fn a<T: Float, const N: usize>(o: &Vecs<T, N, M>) -> Vecs<T, N, A>;
    /// `G g` (3 → A): the filter transform.
    fn gf<T: Float, const N: usize>(g: &Vecs<T, N, 3>) -> Vecs<T, N, A>;
    /// `Gᵀ u` (A → 3): the adjoint of the filter transform.
    fn gt<T: Float, const N: usize>(u: &Vecs<T, N, A>) -> Vecs<T, N, 3>;
}

/// F(4×4, 3×3): points 0, ±1, ±2, ∞; 36 multiplies per 16 outputs where the direct sum takes
/// 144, with constants up to 8 and 1/24 (a few bits of f32, ten times bf16's error).
pub(super) struct F4;

impl Minimal<6, 4> for F4 {
    /// `Bᵀ d` (6 → 6): the input transform.
    #[inline(always)]
    fn bt<T: Float, const N: usize>(d: &Vecs<T, N, 6>) -> Vecs<T, N, 6> {
        let (two, four, five) = (T::from_f64(2.0), T::from_f64(4.0), T::from_f64(5.0));
        let mut t = [[T::zero(); N]; 6];
        for l in 0..N {
            let [d0, d1, d2, d3, d4, d5] = [d[0][l], d[1][l], d[2][l], d[3][l], d[4][l], d[5][l]];
            t[0][l] = four * d0 - five * d2 + d4;
            t[1][l] = (d3 + d4) - four * (d1 + d2);
            t[2][l] = (d4 - d3) + four * (d1 - d2);
            t[3][l] = (d4 - d2) + two * (d3 - d1);
            t[4][l] = (d4 - d2) + two * (d1 - d3);
            t[5][l] = four * d1 - five * d3 + d5;
        }
        t
    }

    /// `B v` (6 → 6): the adjoint of the input transform.
    #[inline(always)]
    fn b<T: Float, const N: usize>(v: &Vecs<T, N, 6>) -> Vecs<T, N, 6> {
        let (two, four, five) = (T::from_f64(2.0), T::from_f64(4.0), T::from_f64(5.0));
        let mut a = [[T::zero(); N]; 6];
        for l in 0..N {
            let [v0, v1, v2, v3, v4, v5] = [v[0][l], v[1][l], v[2][l], v[3][l], v[4][l], v[5][l]];
            a[0][l] = four * v0;
            a[1][l] = four * ((v2 - v1) + v5) + two * (v4 - v3);
            a[2][l] = -(five * v0 + four * (v1 + v2) + (v3 + v4));
            a[3][l] = (v1 - v2) + two * (v3 - v4) - five * v5;
            a[4][l] = v0 + (v1 + v2) + (v3 + v4);
            a[5][l] = v5;
        }
        a
    }

    /// `Aᵀ m` (6 → 4): the output transform.
    #[inline(always)]
    fn at<T: Float, const N: usize>(m: &Vecs<T, N, 6>) -> Vecs<T, N, 4> {
        let (two, four, eight) = (T::from_f64(2.0), T::from_f64(4.0), T::from_f64(8.0));
        let mut o = [[T::zero(); N]; 4];
        for l in 0..N {
            let [m0, m1, m2, m3, m4, m5] = [m[0][l], m[1][l], m[2][l], m[3][l], m[4][l], m[5][l]];
            let (p12, d12, p34, d34) = (m1 + m2, m1 - m2, m3 + m4, m3 - m4);
            o[0][l] = m0 + p12 + p34;
            o[1][l] = d12 + two * d34;
            o[2][l] = p12 + four * p34;
            o[3][l] = d12 + eight * d34 + m5;
        }
        o
    }

    /// `A o` (4 → 6): the adjoint of the output transform.
    #[inline(always)]
    fn a<T: Float, const N: usize>(o: &Vecs<T, N, 4>) -> Vecs<T, N, 6> {
        let (two, four, eight) = (T::from_f64(2.0), T::from_f64(4.0), T::from_f64(8.0));
        let mut p = [[T::zero(); N]; 6];
        for l in 0..N {
            let [o0, o1, o2, o3] = [o[0][l], o[1][l], o[2][l], o[3][l]];
            let (even, odd) = (o0 + o2, o1 + o3);
            let (even2, odd2) = (o0 + four * o2, two * o1 + eight * o3);
            p[0][l] = o0;
            p[1][l] = even + odd;
            p[2][l] = even - odd;
            p[3][l] = even2 + odd2;
            p[4][l] = even2 - odd2;
            p[5][l] = o3;
        }
        p
    }

    /// `G g` (3 → 6): the filter transform.
    #[inline(always)]
    fn gf<T: Float, const N: usize>(g: &Vecs<T, N, 3>) -> Vecs<T, N, 6> {
        let (q, s, e, t) = (
            T::from_f64(0.25),
            T::from_f64(1.0 / 6.0),
            T::from_f64(1.0 / 12.0),
            T::from_f64(1.0 / 24.0),
        );
        let mut u = [[T::zero(); N]; 6];
        for l in 0..N {
            let [g0, g1, g2] = [g[0][l], g[1][l], g[2][l]];
            let (outer, outer4) = (g0 + g2, t * g0 + s * g2);
            u[0][l] = q * g0;
            u[1][l] = -(s * (outer + g1));
            u[2][l] = -(s * (outer - g1));
            u[3][l] = outer4 + e * g1;
            u[4][l] = outer4 - e * g1;
            u[5][l] = g2;
        }
        u
    }

    /// `Gᵀ u` (6 → 3): the adjoint of the filter transform.
    #[inline(always)]
    fn gt<T: Float, const N: usize>(u: &Vecs<T, N, 6>) -> Vecs<T, N, 3> {
        let (q, s, e, t) = (
            T::from_f64(0.25),
            T::from_f64(1.0 / 6.0),
            T::from_f64(1.0 / 12.0),
            T::from_f64(1.0 / 24.0),
        );
        let mut r = [[T::zero(); N]; 3];
        for l in 0..N {
            let [u0, u1, u2, u3, u4, u5] = [u[0][l], u[1][l], u[2][l], u[3][l], u[4][l], u[5][l]];
            let (p12, p34) = (u1 + u2, u3 + u4);
            r[0][l] = q * u0 - s * p12 + t * p34;
            r[1][l] = s * (u2 - u1) + e * (u3 - u4);
            r[2][l] = s * (p34 - p12) + u5;
        }
        r
    }
}

/// F(2×2, 3×3): points 0, ±1, ∞; 16 multiplies per 4 outputs where the direct sum takes 36,
/// with constants 1 and 1/2 (its error with the transformed tiles rounded to bf16 is
/// 1.2–1.5× the direct sum's: `scripts/winograd-bf16-error.py`).
pub(super) struct F2;

impl Minimal<4, 2> for F2 {
    #[inline(always)]
    fn bt<T: Float, const N: usize>(d: &Vecs<T, N, 4>) -> Vecs<T, N, 4> {
        let mut t = [[T::zero(); N]; 4];
        for l in 0..N {
            let [d0, d1, d2, d3] = [d[0][l], d[1][l], d[2][l], d[3][l]];
            t[0][l] = d0 - d2;
            t[1][l] = d1 + d2;
            t[2][l] = d2 - d1;
            t[3][l] = d1 - d3;
        }
        t
    }

    #[inline(always)]
    fn b<T: Float, const N: usize>(v: &Vecs<T, N, 4>) -> Vecs<T, N, 4> {
        let mut a = [[T::zero(); N]; 4];
        for l in 0..N {
            let [v0, v1, v2, v3] = [v[0][l], v[1][l], v[2][l], v[3][l]];
            a[0][l] = v0;
            a[1][l] = (v1 - v2) + v3;
            a[2][l] = (v1 + v2) - v0;
            a[3][l] = -v3;
        }
        a
    }

    #[inline(always)]
    fn at<T: Float, const N: usize>(m: &Vecs<T, N, 4>) -> Vecs<T, N, 2> {
        let mut o = [[T::zero(); N]; 2];
        for l in 0..N {
            let [m0, m1, m2, m3] = [m[0][l], m[1][l], m[2][l], m[3][l]];
            o[0][l] = (m0 + m1) + m2;
            o[1][l] = (m1 - m2) - m3;
        }
        o
    }

    #[inline(always)]
    fn a<T: Float, const N: usize>(o: &Vecs<T, N, 2>) -> Vecs<T, N, 4> {
        let mut p = [[T::zero(); N]; 4];
        for l in 0..N {
            let [o0, o1] = [o[0][l], o[1][l]];
            p[0][l] = o0;
            p[1][l] = o0 + o1;
            p[2][l] = o0 - o1;
            p[3][l] = -o1;
        }
        p
    }

    #[inline(always)]
    fn gf<T: Float, const N: usize>(g: &Vecs<T, N, 3>) -> Vecs<T, N, 4> {
        let half = T::from_f64(0.5);
        let mut u = [[T::zero(); N]; 4];
        for l in 0..N {
            let [g0, g1, g2] = [g[0][l], g[1][l], g[2][l]];
            let outer = g0 + g2;
            u[0][l] = g0;
            u[1][l] = half * (outer + g1);
            u[2][l] = half * (outer - g1);
            u[3][l] = g2;
        }
        u
    }

    #[inline(always)]
    fn gt<T: Float, const N: usize>(u: &Vecs<T, N, 4>) -> Vecs<T, N, 3> {
        let half = T::from_f64(0.5);
        let mut r = [[T::zero(); N]; 3];
        for l in 0..N {
            let [u0, u1, u2, u3] = [u[0][l], u[1][l], u[2][l], u[3][l]];
            let p12 = half * (u1 + u2);
            r[0][l] = u0 + p12;
            r[1][l] = half * (u1 - u2);
            r[2][l] = p12 + u3;
        }
        r
    }
}
