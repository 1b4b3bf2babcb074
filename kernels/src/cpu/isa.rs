//! The x86 vector instruction sets the CPU kernels are written for, which this CPU has, and the
//! cap `ROOFLINE_ISA` (or `roofline probe --isa`) puts on them, so that an AVX-512 machine can
//! run and check the AVX2 and the portable paths as well.

/// An instruction set of the CPU kernels, from the widest down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable code: what the compiler makes of it for the baseline target (SSE2 on x86-64).
    Scalar,
    /// 256-bit AVX2 with FMA.
    Avx2,
    /// 512-bit AVX-512 (F; the FMA probe's bf16 and int8 need BF16 and VNNI too).
    Avx512,
}

/// The environment variable that caps the instruction set (`avx512`, `avx2` or `scalar`).
pub const ENV: &str = "ROOFLINE_ISA";

/// A cap that names no instruction set.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{ENV}={0:?}: expected avx512, avx2 or scalar")]
pub struct UnknownIsa(pub String);

impl Isa {
    pub const ALL: [Isa; 3] = [Isa::Avx512, Isa::Avx2, Isa::Scalar];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Scalar => "scalar",
        }
    }

    /// Vector width in bits.
    pub fn bits(self) -> u32 {
        match self {
            Isa::Avx512 => 512,
            Isa::Avx2 => 256,
            Isa::Scalar => 64,
        }
    }

    pub fn parse(s: &str) -> Option<Isa> {
        Isa::ALL.into_iter().find(|i| i.name() == s.trim())
    }

    /// The widest instruction set this CPU runs the kernels with (no cap).
    pub fn detected() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// The cap `ROOFLINE_ISA` sets, if any; a value that names no instruction set is an error.
    pub fn cap() -> Result<Option<Isa>, UnknownIsa> {
        match std::env::var(ENV) {
            Err(_) => Ok(None),
            Ok(s) if s.trim().is_empty() => Ok(None),
            Ok(s) => Isa::parse(&s).map(Some).ok_or(UnknownIsa(s)),
        }
    }

    /// The instruction set the kernels use: the detected one under the cap (an invalid cap is
    /// refused where the probe starts, `cap`, and ignored here).
    pub fn current() -> Isa {
        match Isa::cap() {
            Ok(Some(cap)) => Isa::detected().min(cap),
            _ => Isa::detected(),
        }
    }

    /// Every instruction set this CPU can run the kernels with, widest first (for tests that
    /// check each path).
    pub fn available() -> Vec<Isa> {
        let best = Isa::detected();
        Isa::ALL.into_iter().filter(|i| *i <= best).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_order_and_availability() {
        for i in Isa::ALL {
            assert_eq!(Isa::parse(i.name()), Some(i));
        }
        assert_eq!(Isa::parse("sse"), None);
        assert!(Isa::Avx512 > Isa::Avx2 && Isa::Avx2 > Isa::Scalar);
        let a = Isa::available();
        assert_eq!(a[0], Isa::detected());
        assert_eq!(*a.last().unwrap(), Isa::Scalar);
        assert!(Isa::current() <= Isa::detected());
    }
}
