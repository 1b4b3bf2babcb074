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
    /// A fourth cache level (eDRAM, or a memory-side cache).
    L4,
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
    pub const ALL: [Level; 6] = [
        Level::L1,
        Level::L2,
        Level::L3,
        Level::L4,
        Level::Dram,
        Level::Hbm,
    ];

    /// The cache of `level` (1 = L1); `None` past the fourth.
    pub fn cache(level: u32) -> Option<Level> {
        match level {
            1 => Some(Level::L1),
            2 => Some(Level::L2),
            3 => Some(Level::L3),
            4 => Some(Level::L4),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Level::L1 => "L1",
            Level::L2 => "L2",
            Level::L3 => "L3",
            Level::L4 => "L4",
            Level::Dram => "DRAM",
            Level::Hbm => "HBM",
        }
    }

    /// Main memory (DRAM or HBM), not a cache.
    pub fn is_main_memory(self) -> bool {
        matches!(self, Level::Dram | Level::Hbm)
    }
}

/// A memory operation of the bandwidth probes (STREAM's kernels and a pure read and write).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum MemOp {
    Read,
    Write,
    Copy,
    Triad,
}

impl MemOp {
    pub const ALL: [MemOp; 4] = [MemOp::Read, MemOp::Write, MemOp::Copy, MemOp::Triad];

    /// The arrays the operation touches (STREAM's: a read or a write one, a copy two, a triad
    /// three); its bytes per element are these arrays' element sizes.
    pub fn arrays(self) -> usize {
        match self {
            MemOp::Read | MemOp::Write => 1,
            MemOp::Copy => 2,
            MemOp::Triad => 3,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            MemOp::Read => "read",
            MemOp::Write => "write",
            MemOp::Copy => "copy",
            MemOp::Triad => "triad",
        }
    }
}

/// The CPU threads a ceiling ran on: one (`t1`) or one pinned thread per core (`all`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
#[serde(rename_all = "lowercase")]
pub enum Threads {
    T1,
    All,
}

impl Threads {
    pub const ALL: [Threads; 2] = [Threads::T1, Threads::All];

    pub fn name(self) -> &'static str {
        match self {
            Threads::T1 => "t1",
            Threads::All => "all",
        }
    }
}

/// A compute ceiling's kind of kernel: the FMA peak (CUDA cores or SIMD units), the
/// tensor-core peak (mma.sync), a GEMM library, a convolution library.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Family {
    Fma,
    /// Warp-level `mma.sync`.
    Mma,
    /// Hopper's warpgroup `wgmma` (sm_90a).
    Wgmma,
    Gemm,
    Conv,
}

impl Family {
    pub const ALL: [Family; 5] = [
        Family::Fma,
        Family::Mma,
        Family::Wgmma,
        Family::Gemm,
        Family::Conv,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Family::Fma => "fma",
            Family::Mma => "mma",
            Family::Wgmma => "wgmma",
            Family::Gemm => "gemm",
            Family::Conv => "conv",
        }
    }
}

/// A convolution's direction (the GPU's convolution ceilings have one each).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ConvDir {
    Fwd,
    BwdData,
    BwdFilter,
}

impl ConvDir {
    pub const ALL: [ConvDir; 3] = [ConvDir::Fwd, ConvDir::BwdData, ConvDir::BwdFilter];

    pub fn name(self) -> &'static str {
        match self {
            ConvDir::Fwd => "fwd",
            ConvDir::BwdData => "bwd_data",
            ConvDir::BwdFilter => "bwd_filter",
        }
    }
}

/// Where a roof was measured: the CPU on `t1` or `all` threads, or GPU `n`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum On {
    Cpu(Threads),
    Gpu(usize),
}

/// The id of a roof of the roofline (a compute or memory ceiling), typed; written as the
/// ceiling ids of the files: `cpu/fma/f32/all`, `cpu/mem/L2/triad/t1`, `gpu0/mma/bf16`,
/// `gpu0/conv/f16/fwd`, `gpu0/mem/HBM/triad`. Other ids (communication, storage, tables,
/// sweeps, `agg/…`) are not roofs and do not parse.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RoofId {
    Compute {
        on: On,
        family: Family,
        precision: Precision,
        /// GPU convolutions only.
        direction: Option<ConvDir>,
    },
    Memory {
        on: On,
        level: Level,
        op: MemOp,
    },
}

impl RoofId {
    pub fn on(&self) -> On {
        match self {
            RoofId::Compute { on, .. } | RoofId::Memory { on, .. } => *on,
        }
    }

    /// Parses a roof's id (`None`: not a roof's id).
    pub fn parse(id: &str) -> Option<RoofId> {
        let parts: Vec<&str> = id.split('/').collect();
        let gpu = |s: &str| s.strip_prefix("gpu")?.parse::<usize>().ok();
        let threads = |s: &str| Threads::ALL.into_iter().find(|t| t.name() == s);
        let family = |s: &str| Family::ALL.into_iter().find(|f| f.name() == s);
        let dir = |s: &str| ConvDir::ALL.into_iter().find(|d| d.name() == s);
        let op = |s: &str| MemOp::ALL.into_iter().find(|o| o.name() == s);
        let level = |s: &str| s.parse::<Level>().ok();
        let prec = |s: &str| s.parse::<Precision>().ok();
        match parts[..] {
            ["cpu", "mem", l, o, t] => Some(RoofId::Memory {
                on: On::Cpu(threads(t)?),
                level: level(l)?,
                op: op(o)?,
            }),
            ["cpu", f, p, t] => Some(RoofId::Compute {
                on: On::Cpu(threads(t)?),
                family: family(f)?,
                precision: prec(p)?,
                direction: None,
            }),
            [g, "mem", l, o] => Some(RoofId::Memory {
                on: On::Gpu(gpu(g)?),
                level: level(l)?,
                op: op(o)?,
            }),
            [g, "conv", p, d] => Some(RoofId::Compute {
                on: On::Gpu(gpu(g)?),
                family: Family::Conv,
                precision: prec(p)?,
                direction: Some(dir(d)?),
            }),
            [g, f, p] if f != "conv" => Some(RoofId::Compute {
                on: On::Gpu(gpu(g)?),
                family: family(f)?,
                precision: prec(p)?,
                direction: None,
            }),
            _ => None,
        }
    }
}

impl fmt::Display for RoofId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            RoofId::Compute {
                on,
                family,
                precision,
                direction,
            } => match on {
                On::Cpu(t) => write!(f, "cpu/{}/{precision}/{}", family.name(), t.name()),
                On::Gpu(g) => {
                    write!(f, "gpu{g}/{}/{precision}", family.name())?;
                    match direction {
                        Some(d) => write!(f, "/{}", d.name()),
                        None => Ok(()),
                    }
                }
            },
            RoofId::Memory { on, level, op } => match on {
                On::Cpu(t) => write!(f, "cpu/mem/{level}/{}/{}", op.name(), t.name()),
                On::Gpu(g) => write!(f, "gpu{g}/mem/{level}/{}", op.name()),
            },
        }
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

/// `Display` and `FromStr` for a closed set of names (`ALL`, `name()`): the files' spelling.
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
named!(MemOp, "memory operation");
named!(Threads, "thread count (t1 or all)");

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

    /// Every roof id the probes write parses and is written back the same; other ids do not
    /// parse.
    #[test]
    fn roof_ids_round_trip() {
        for id in [
            "cpu/fma/f32/all",
            "cpu/fma/int8/t1",
            "cpu/gemm/f16/t1",
            "cpu/conv/f32/all",
            "cpu/mem/L2/triad/t1",
            "cpu/mem/DRAM/write/all",
            "gpu0/fma/f64",
            "gpu1/mma/bf16",
            "gpu0/wgmma/fp8",
            "gpu0/gemm/fp8",
            "gpu0/conv/f16/bwd_filter",
            "gpu3/mem/HBM/triad",
            "gpu0/mem/L2/read",
        ] {
            let parsed = RoofId::parse(id).unwrap_or_else(|| panic!("{id}"));
            assert_eq!(parsed.to_string(), id);
        }
        assert_eq!(
            RoofId::parse("cpu/mem/L3/copy/all"),
            Some(RoofId::Memory {
                on: On::Cpu(Threads::All),
                level: Level::L3,
                op: MemOp::Copy
            })
        );
        for not_a_roof in [
            "cpu/mem/sweep/triad/all",
            "cpu/gemm/f32/all/shapes",
            "gpu0/gemm/f16/table",
            "gpu0/conv/f16",
            "gpu0-gpu1/p2p",
            "agg/cpu/fma/f32/all",
            "node/intra/allreduce",
            "cpu/fma/f33/all",
            "gpux/mem/HBM/triad",
        ] {
            assert_eq!(RoofId::parse(not_a_roof), None, "{not_a_roof}");
        }
    }
}
