//! The vector instruction sets the CPU kernels are written for (x86-64: AVX-512, AVX2; aarch64:
//! NEON), which this CPU has, and the cap `ROOFLINE_ISA` (or `roofline probe --isa`) puts on
//! them, so that a machine can run and check its narrower paths as well.

/// An instruction set of the CPU kernels, from the widest down.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Isa {
    /// Portable code: what the compiler makes of it for the baseline target (SSE2 on x86-64,
    /// NEON on aarch64 where the compiler vectorises).
    Scalar,
    /// aarch64's 128-bit Advanced SIMD (every ARMv8-A core: Grace's Neoverse V2, Graviton).
    Neon,
    /// 256-bit AVX2 with FMA.
    Avx2,
    /// 512-bit AVX-512 (F; the FMA probe's bf16 and int8 need BF16 and VNNI too).
    Avx512,
}

/// The environment variable that caps the instruction set (`avx512`, `avx2`, `neon`, `scalar`).
pub const ENV: &str = "ROOFLINE_ISA";

/// A cap that names no instruction set of this architecture.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{ENV}={value:?}: expected {expected}", value = .0, expected = Isa::expected())]
pub struct UnknownIsa(pub String);

impl Isa {
    pub const ALL: [Isa; 4] = [Isa::Avx512, Isa::Avx2, Isa::Neon, Isa::Scalar];

    pub fn name(self) -> &'static str {
        match self {
            Isa::Avx512 => "avx512",
            Isa::Avx2 => "avx2",
            Isa::Neon => "neon",
            Isa::Scalar => "scalar",
        }
    }

    /// The instruction sets of this architecture, widest first.
    pub fn of_this_arch() -> &'static [Isa] {
        if cfg!(target_arch = "x86_64") {
            &[Isa::Avx512, Isa::Avx2, Isa::Scalar]
        } else if cfg!(target_arch = "aarch64") {
            &[Isa::Neon, Isa::Scalar]
        } else {
            &[Isa::Scalar]
        }
    }

    /// "avx512, avx2 or scalar": what a cap may name here.
    pub fn expected() -> String {
        let names: Vec<&str> = Isa::of_this_arch().iter().map(|i| i.name()).collect();
        match names.split_last() {
            Some((last, [])) => last.to_string(),
            Some((last, rest)) => format!("{} or {last}", rest.join(", ")),
            None => String::new(),
        }
    }

    /// Vector width in bits.
    pub fn bits(self) -> u32 {
        match self {
            Isa::Avx512 => 512,
            Isa::Avx2 => 256,
            Isa::Neon => 128,
            Isa::Scalar => 64,
        }
    }

    /// An instruction set of this architecture by name.
    pub fn parse(s: &str) -> Option<Isa> {
        Isa::of_this_arch()
            .iter()
            .copied()
            .find(|i| i.name() == s.trim())
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
        #[cfg(target_arch = "aarch64")]
        {
            if std::arch::is_aarch64_feature_detected!("neon") {
                return Isa::Neon;
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
        Isa::of_this_arch()
            .iter()
            .copied()
            .filter(|i| *i <= best)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_order_and_availability() {
        for &i in Isa::of_this_arch() {
            assert_eq!(Isa::parse(i.name()), Some(i));
        }
        assert_eq!(Isa::parse("sse"), None);
        // Another architecture's set is not a cap here.
        let other = if cfg!(target_arch = "aarch64") {
            "avx2"
        } else {
            "neon"
        };
        assert_eq!(Isa::parse(other), None);
        assert!(Isa::Avx512 > Isa::Avx2 && Isa::Avx2 > Isa::Scalar && Isa::Neon > Isa::Scalar);
        assert!(
            Isa::expected().ends_with(" or scalar"),
            "{}",
            Isa::expected()
        );
        let a = Isa::available();
        assert_eq!(a[0], Isa::detected());
        assert_eq!(*a.last().unwrap(), Isa::Scalar);
        assert!(Isa::current() <= Isa::detected());
    }
}
