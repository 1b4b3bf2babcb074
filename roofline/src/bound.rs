//! The roofline itself: attainable performance, ridge points, and which ceiling binds a point.

use crate::machine::{Ceiling, CeilingKind};

/// A roof: flat (compute, in ops/s) or slanted (bandwidth, in B/s, multiplied by intensity).
#[derive(Clone, Debug, PartialEq)]
pub struct Roof {
    pub id: String,
    pub slanted: bool,
    /// ops/s for a flat roof, B/s for a slanted one.
    pub value: f64,
}

impl Roof {
    /// The roof a ceiling draws: compute ceilings are flat, every other kind is slanted.
    pub fn from_ceiling(c: &Ceiling) -> Roof {
        Roof {
            id: c.id.to_string(),
            slanted: c.kind != CeilingKind::Compute,
            value: c.value,
        }
    }

    /// The performance this roof allows at intensity `oi` (ops per byte).
    pub fn at(&self, oi: f64) -> f64 {
        if self.slanted {
            self.value * oi
        } else {
            self.value
        }
    }
}

/// A classic roofline: one flat compute roof and one slanted bandwidth roof.
#[derive(Clone, Debug, PartialEq)]
pub struct Roofline {
    /// ops/s
    pub peak: f64,
    /// B/s
    pub bandwidth: f64,
}

/// Which side of the ridge a point of given intensity falls on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// Left of the ridge: bandwidth (memory or communication) bounds it.
    Bandwidth,
    /// Right of (or at) the ridge: compute bounds it.
    Compute,
}

impl Roofline {
    pub fn new(peak: f64, bandwidth: f64) -> Roofline {
        Roofline { peak, bandwidth }
    }

    /// `min(peak, bandwidth × oi)`.
    pub fn attainable(&self, oi: f64) -> f64 {
        (self.bandwidth * oi).min(self.peak)
    }

    /// The intensity where the slanted roof meets the flat one: `peak / bandwidth` (ops per byte).
    pub fn ridge(&self) -> f64 {
        self.peak / self.bandwidth
    }

    /// Which roof bounds a point of intensity `oi`.
    pub fn side(&self, oi: f64) -> Side {
        if oi < self.ridge() {
            Side::Bandwidth
        } else {
            Side::Compute
        }
    }
}

/// The outcome of [`binding`]: the roof that bounds a measured point and the room above it.
#[derive(Clone, Debug, PartialEq)]
pub struct Binding {
    pub roof: Roof,
    /// The roof's value at the point's intensity (ops/s).
    pub attainable: f64,
    /// `attainable / achieved` (≥ 1 unless the point is above every roof).
    pub headroom: f64,
}

/// The ceiling that binds a measured point `(oi, achieved ops/s)`: among the roofs that lie on or
/// above the point at its intensity, the lowest. When the point lies above every roof (a ceiling
/// was under-measured), the highest roof is returned with a headroom below 1.
pub fn binding(roofs: &[Roof], oi: f64, achieved: f64) -> Option<Binding> {
    let mut above: Option<(&Roof, f64)> = None;
    let mut highest: Option<(&Roof, f64)> = None;
    for r in roofs {
        let a = r.at(oi);
        if a >= achieved && above.is_none_or(|(_, b)| a < b) {
            above = Some((r, a));
        }
        if highest.is_none_or(|(_, b)| a > b) {
            highest = Some((r, a));
        }
    }
    let (roof, attainable) = above.or(highest)?;
    Some(Binding {
        roof: roof.clone(),
        attainable,
        headroom: if achieved > 0.0 {
            attainable / achieved
        } else {
            f64::INFINITY
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn attainable_and_ridge() {
        // 1 TFLOP/s, 100 GB/s: ridge at 10 FLOP/B.
        let r = Roofline::new(1e12, 1e11);
        assert_eq!(r.ridge(), 10.0);
        assert_eq!(r.attainable(1.0), 1e11);
        assert_eq!(r.attainable(10.0), 1e12);
        assert_eq!(r.attainable(100.0), 1e12);
        assert_eq!(r.side(9.99), Side::Bandwidth);
        assert_eq!(r.side(10.0), Side::Compute);
    }

    fn roofs() -> Vec<Roof> {
        vec![
            Roof {
                id: "fma".into(),
                slanted: false,
                value: 1e12,
            },
            Roof {
                id: "gemm".into(),
                slanted: false,
                value: 8e11,
            },
            Roof {
                id: "L1".into(),
                slanted: true,
                value: 1e12,
            },
            Roof {
                id: "DRAM".into(),
                slanted: true,
                value: 1e11,
            },
        ]
    }

    #[test]
    fn lowest_roof_above_the_point_binds() {
        // At OI 1: DRAM allows 1e11, L1 1e12, gemm 8e11, fma 1e12.
        let b = binding(&roofs(), 1.0, 5e10).unwrap();
        assert_eq!(b.roof.id, "DRAM");
        assert_eq!(b.headroom, 2.0);
        // Above the DRAM roof: the data must come from a cache; gemm is the next roof up.
        let b = binding(&roofs(), 1.0, 2e11).unwrap();
        assert_eq!(b.roof.id, "gemm");
        // At OI 100 every slanted roof is above the flat ones: gemm binds.
        let b = binding(&roofs(), 100.0, 7e11).unwrap();
        assert_eq!(b.roof.id, "gemm");
    }

    #[test]
    fn point_above_every_roof_is_reported_with_headroom_below_one() {
        let b = binding(&roofs(), 0.5, 2e12).unwrap();
        assert_eq!(b.roof.id, "fma");
        assert!(b.headroom < 1.0);
        assert!(binding(&[], 1.0, 1.0).is_none());
    }
}
