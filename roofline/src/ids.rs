//! The model's typed names: a compute ceiling's precision and a memory ceiling's level,
//! written to and read from the files as the strings they always were (`f32`, `L2`, `HBM`).

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// A number format that compute ceilings and workloads run in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Precision {
    F64,
    F32,
    /// f32 storage, tensor-core multiplication with 10-bit mantissas.
    Tf32,
    F16,
    Bf16,
    /// 8-bit floating point (e4m3 / e5m2).
    Fp8,
    Int8,
}

impl Precision {
    pub const ALL: [Precision; 7] = [
        Precision::F64,
        Precision::F32,
        Precision::Tf32,
        Precision::F16,
        Precision::Bf16,
        Precision::Int8,
        Precision::Fp8,
    ];

    /// The name in ceiling ids and files.
    pub fn name(self) -> &'static str {
        match self {
            Precision::F64 => "f64",
            Precision::F32 => "f32",
            Precision::Tf32 => "tf32",
            Precision::F16 => "f16",
            Precision::Bf16 => "bf16",
            Precision::Fp8 => "fp8",
            Precision::Int8 => "int8",
        }
    }

    /// Bytes per element in memory (tf32 is stored as f32).
    pub fn bytes(self) -> usize {
        match self {
            Precision::F64 => 8,
            Precision::F32 | Precision::Tf32 => 4,
            Precision::F16 | Precision::Bf16 => 2,
            Precision::Fp8 | Precision::Int8 => 1,
        }
    }

    /// Integer formats count operations (OP/s), not floating-point operations.
    pub fn is_integer(self) -> bool {
        self == Precision::Int8
    }
}

/// A level of the memory hierarchy that has a bandwidth ceiling.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Level {
    L1,
    L2,
    L3,
    /// A CPU's main memory.
    #[serde(rename = "DRAM")]
    #[cfg_attr(feature = "clap", value(name = "DRAM"))]
    Dram,
    /// A GPU's high-bandwidth memory.
    #[serde(rename = "HBM")]
    #[cfg_attr(feature = "clap", value(name = "HBM"))]
    Hbm,
}

impl Level {
    pub const ALL: [Level; 5] = [Level::L1, Level::L2, Level::L3, Level::Dram, Level::Hbm];

    pub fn name(self) -> &'static str {
        match self {
            Level::L1 => "L1",
            Level::L2 => "L2",
            Level::L3 => "L3",
            Level::Dram => "DRAM",
            Level::Hbm => "HBM",
        }
    }

    /// Main memory (DRAM or HBM), not a cache.
    pub fn is_main_memory(self) -> bool {
        matches!(self, Level::Dram | Level::Hbm)
    }
}

/// A name that is not one of a type's values.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{found:?} is not a {what}; expected one of {expected}")]
pub struct UnknownName {
    pub what: &'static str,
    pub found: String,
    pub expected: String,
}

macro_rules! named {
    ($t:ty, $what:literal) => {
        impl fmt::Display for $t {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }

        impl FromStr for $t {
            type Err = UnknownName;
            fn from_str(s: &str) -> Result<$t, UnknownName> {
                <$t>::ALL
                    .into_iter()
                    .find(|v| v.name() == s)
                    .ok_or_else(|| UnknownName {
                        what: $what,
                        found: s.to_string(),
                        expected: <$t>::ALL.map(|v| v.name()).join(", "),
                    })
            }
        }
    };
}

named!(Precision, "precision");
named!(Level, "memory level");

#[cfg(test)]
mod tests {
    use super::*;

    /// Each value's name, its serialisation and its parse agree, so files keep their strings.
    #[test]
    fn names_round_trip_as_the_files_spell_them() {
        for p in Precision::ALL {
            assert_eq!(serde_json::to_string(&p).unwrap(), format!("\"{p}\""));
            assert_eq!(p.name().parse::<Precision>(), Ok(p));
        }
        for l in Level::ALL {
            assert_eq!(serde_json::to_string(&l).unwrap(), format!("\"{l}\""));
            assert_eq!(
                serde_json::from_str::<Level>(&format!("\"{l}\"")).unwrap(),
                l
            );
        }
        assert_eq!(Level::Dram.to_string(), "DRAM");
        let e = "fp64".parse::<Precision>().unwrap_err();
        assert!(e.to_string().contains("f64, f32, tf32"), "{e}");
        assert!("dram".parse::<Level>().is_err());
    }
}
