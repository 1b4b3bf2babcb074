//! Every ceiling id the probe writes, typed ([`CeilingId`]): the roofs ([`RoofId`]: compute
//! and memory), communication between ranks (MPI's and NCCL's collectives, point to point),
//! a GPU's copies to and from the host and between GPUs, storage, and the aggregates of a
//! distributed probe. Written and read as the strings the files always held (`net/allreduce/
//! intra`, `gpu0/h2d/pageable`, `gpu0-gpu1/p2p/sm/bidir`, `io/scratch/small/files`,
//! `agg/cpu/fma/f32/all`); an id added in one place fails to compile where it is not handled.

use crate::ids::{RoofId, UnknownName};
use std::fmt;
use std::str::FromStr;

/// A collective operation of the communication probes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Collective {
    AllReduce,
    AllGather,
    ReduceScatter,
    Broadcast,
    AllToAll,
}

impl Collective {
    pub const ALL: [Collective; 5] = [
        Collective::AllReduce,
        Collective::AllGather,
        Collective::ReduceScatter,
        Collective::Broadcast,
        Collective::AllToAll,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Collective::AllReduce => "allreduce",
            Collective::AllGather => "allgather",
            Collective::ReduceScatter => "reducescatter",
            Collective::Broadcast => "broadcast",
            Collective::AllToAll => "alltoall",
        }
    }

    /// busbw = algbw × this (nccl-tests' PERFORMANCE.md): the bandwidth each link must carry,
    /// comparable with the hardware's, whatever the rank count.
    pub fn bus_factor(self, ranks: usize) -> f64 {
        let n = ranks.max(1) as f64;
        match self {
            Collective::AllReduce => 2.0 * (n - 1.0) / n,
            Collective::AllGather | Collective::ReduceScatter | Collective::AllToAll => {
                (n - 1.0) / n
            }
            Collective::Broadcast => 1.0,
        }
    }

    /// Elements of f32 per rank in the send and receive buffers for a "size" of `bytes`
    /// (nccl-tests' convention: the whole buffer — the gathered output of allgather, the input
    /// of reduce-scatter, each rank's whole buffer of alltoall). `None` when the size is too
    /// small to give every rank one element.
    pub fn counts(self, bytes: usize, ranks: usize) -> Option<(usize, usize)> {
        let total = bytes / 4;
        let per = total / ranks.max(1);
        match self {
            Collective::AllReduce | Collective::Broadcast => (total >= 1).then_some((total, total)),
            Collective::AllGather => (per >= 1).then_some((per, per * ranks)),
            Collective::ReduceScatter => (per >= 1).then_some((per * ranks, per)),
            Collective::AllToAll => (per >= 1).then_some((per * ranks, per * ranks)),
        }
    }

    /// The bytes the size stands for, once rounded to whole elements per rank.
    pub fn size_bytes(self, bytes: usize, ranks: usize) -> Option<usize> {
        self.counts(bytes, ranks).map(|(s, r)| {
            4 * match self {
                Collective::AllGather => r,
                _ => s,
            }
        })
    }
}

/// Which ranks a communication ceiling spans: the ranks of one node, one rank per node, every
/// rank.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Scope {
    Intra,
    Inter,
    World,
}

impl Scope {
    pub const ALL: [Scope; 3] = [Scope::Intra, Scope::Inter, Scope::World];

    pub fn name(self) -> &'static str {
        match self {
            Scope::Intra => "intra",
            Scope::Inter => "inter",
            Scope::World => "world",
        }
    }
}

/// Where a ceiling sits: a memory ceiling's level (`L2`, `DRAM`, `HBM`), a communication
/// ceiling's scope (`intra`, `inter`, `world`); written as those names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Tier {
    Memory(crate::ids::Level),
    Comm(Scope),
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Tier::Memory(l) => f.write_str(l.name()),
            Tier::Comm(s) => f.write_str(s.name()),
        }
    }
}

impl FromStr for Tier {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<Tier, UnknownName> {
        if let Ok(l) = s.parse::<crate::ids::Level>() {
            return Ok(Tier::Memory(l));
        }
        s.parse::<Scope>()
            .map(Tier::Comm)
            .ok()
            .ok_or_else(|| UnknownName {
                what: "memory level or communication scope",
                found: s.to_string(),
                expected: "L1, L2, L3, L4, DRAM, HBM, intra, inter, world".into(),
            })
    }
}

impl serde::Serialize for Tier {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for Tier {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Tier, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The library a collective ran in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum CommLib {
    /// The MPI library's own collectives on host memory (`net/<op>/<scope>`).
    Mpi,
    /// NCCL on device memory (`net/nccl/<op>/<scope>`).
    Nccl,
}

/// What a point-to-point ceiling measures between two ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum P2pMetric {
    /// Half the round trip of 8 B (seconds).
    Latency,
    /// One way.
    Bandwidth,
    /// Both ways at once, both directions counted.
    BandwidthBidir,
}

impl P2pMetric {
    pub const ALL: [P2pMetric; 3] = [
        P2pMetric::Latency,
        P2pMetric::Bandwidth,
        P2pMetric::BandwidthBidir,
    ];

    pub fn name(self) -> &'static str {
        match self {
            P2pMetric::Latency => "latency",
            P2pMetric::Bandwidth => "bw",
            P2pMetric::BandwidthBidir => "bw_bidir",
        }
    }
}

/// A GPU's copies: to and from host memory, and within its own memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum GpuCopy {
    /// Host to device from pinned memory.
    H2d,
    /// Device to host into pinned memory.
    D2h,
    /// Both directions at once (both counted).
    Both,
    /// Host to device from pageable memory.
    H2dPageable,
    /// Device to host into pageable memory.
    D2hPageable,
    /// Device to device within the GPU's memory (a read and a write per byte: a memory
    /// ceiling).
    D2d,
}

impl GpuCopy {
    pub const ALL: [GpuCopy; 6] = [
        GpuCopy::H2d,
        GpuCopy::D2h,
        GpuCopy::Both,
        GpuCopy::H2dPageable,
        GpuCopy::D2hPageable,
        GpuCopy::D2d,
    ];

    pub fn name(self) -> &'static str {
        match self {
            GpuCopy::H2d => "h2d",
            GpuCopy::D2h => "d2h",
            GpuCopy::Both => "h2d+d2h",
            GpuCopy::H2dPageable => "h2d/pageable",
            GpuCopy::D2hPageable => "d2h/pageable",
            GpuCopy::D2d => "d2d",
        }
    }
}

/// A copy between two GPUs: by the copy engines (`cuMemcpyPeer`) or by the SMs (a kernel
/// storing into the peer's memory), one way or both ways at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PeerCopy {
    Engine,
    EngineBidir,
    Sm,
    SmBidir,
}

impl PeerCopy {
    pub const ALL: [PeerCopy; 4] = [
        PeerCopy::Engine,
        PeerCopy::EngineBidir,
        PeerCopy::Sm,
        PeerCopy::SmBidir,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PeerCopy::Engine => "p2p",
            PeerCopy::EngineBidir => "p2p/bidir",
            PeerCopy::Sm => "p2p/sm",
            PeerCopy::SmBidir => "p2p/sm/bidir",
        }
    }
}

/// A storage ceiling: large files read sequentially, small files' bytes, small files per
/// second.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum IoTest {
    Sequential,
    Small,
    SmallFiles,
}

impl IoTest {
    pub const ALL: [IoTest; 3] = [IoTest::Sequential, IoTest::Small, IoTest::SmallFiles];

    pub fn name(self) -> &'static str {
        match self {
            IoTest::Sequential => "seq",
            IoTest::Small => "small",
            IoTest::SmallFiles => "small/files",
        }
    }
}

named!(Collective, "collective");
named!(Scope, "communication scope");
named!(P2pMetric, "point-to-point metric");
named!(GpuCopy, "GPU copy");
named!(PeerCopy, "peer copy");
named!(IoTest, "storage test");

/// Any ceiling's id.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum CeilingId {
    /// A compute or memory roof.
    Roof(RoofId),
    /// A collective between ranks.
    Collective {
        lib: CommLib,
        op: Collective,
        scope: Scope,
    },
    /// Point to point between two ranks.
    P2p { scope: Scope, metric: P2pMetric },
    /// GPU `gpu`'s copies (with host memory, within its own).
    Copy { gpu: usize, copy: GpuCopy },
    /// Copies from GPU `from` to GPU `to`.
    PeerCopy {
        from: usize,
        to: usize,
        copy: PeerCopy,
    },
    /// Storage at the folder labelled `label` (`tmp`, or the tested folder's name).
    Io { label: String, test: IoTest },
    /// A distributed probe's aggregate of every node's ceiling `of` (their sum, or for a
    /// latency the worst).
    Aggregate(Box<CeilingId>),
}

impl CeilingId {
    /// The roof this id names, if it is one.
    pub fn roof(&self) -> Option<RoofId> {
        match self {
            CeilingId::Roof(r) => Some(*r),
            _ => None,
        }
    }

    /// Whether this is a distributed probe's aggregate.
    pub fn is_aggregate(&self) -> bool {
        matches!(self, CeilingId::Aggregate(_))
    }

    /// Parses any id the probe writes (None: not a ceiling id).
    pub fn parse(id: &str) -> Option<CeilingId> {
        if let Some(inner) = id.strip_prefix("agg/") {
            return Some(CeilingId::Aggregate(Box::new(CeilingId::parse(inner)?)));
        }
        if let Some(r) = RoofId::parse(id) {
            return Some(CeilingId::Roof(r));
        }
        let scope = |s: &str| s.parse::<Scope>().ok();
        let coll = |s: &str| s.parse::<Collective>().ok();
        let gpu = |s: &str| s.strip_prefix("gpu")?.parse::<usize>().ok();
        if let Some(rest) = id.strip_prefix("net/") {
            let parts: Vec<&str> = rest.split('/').collect();
            return match parts[..] {
                ["p2p", s, m] => Some(CeilingId::P2p {
                    scope: scope(s)?,
                    metric: m.parse().ok()?,
                }),
                ["nccl", op, s] => Some(CeilingId::Collective {
                    lib: CommLib::Nccl,
                    op: coll(op)?,
                    scope: scope(s)?,
                }),
                [op, s] => Some(CeilingId::Collective {
                    lib: CommLib::Mpi,
                    op: coll(op)?,
                    scope: scope(s)?,
                }),
                _ => None,
            };
        }
        if let Some(rest) = id.strip_prefix("io/") {
            // The longest test name first (`small/files` before `small`).
            let (label, test) = [IoTest::SmallFiles, IoTest::Small, IoTest::Sequential]
                .into_iter()
                .find_map(|t| {
                    let label = rest.strip_suffix(t.name())?.strip_suffix('/')?;
                    (!label.is_empty()).then_some((label, t))
                })?;
            return Some(CeilingId::Io {
                label: label.to_string(),
                test,
            });
        }
        let (head, tail) = id.split_once('/')?;
        if let Some((a, b)) = head.split_once('-') {
            return Some(CeilingId::PeerCopy {
                from: gpu(a)?,
                to: gpu(b)?,
                copy: tail.parse().ok()?,
            });
        }
        Some(CeilingId::Copy {
            gpu: gpu(head)?,
            copy: tail.parse().ok()?,
        })
    }
}

impl fmt::Display for CeilingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CeilingId::Roof(r) => write!(f, "{r}"),
            CeilingId::Collective { lib, op, scope } => match lib {
                CommLib::Mpi => write!(f, "net/{}/{}", op.name(), scope.name()),
                CommLib::Nccl => write!(f, "net/nccl/{}/{}", op.name(), scope.name()),
            },
            CeilingId::P2p { scope, metric } => {
                write!(f, "net/p2p/{}/{}", scope.name(), metric.name())
            }
            CeilingId::Copy { gpu, copy } => write!(f, "gpu{gpu}/{}", copy.name()),
            CeilingId::PeerCopy { from, to, copy } => {
                write!(f, "gpu{from}-gpu{to}/{}", copy.name())
            }
            CeilingId::Io { label, test } => write!(f, "io/{label}/{}", test.name()),
            CeilingId::Aggregate(of) => write!(f, "agg/{of}"),
        }
    }
}

impl FromStr for CeilingId {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<CeilingId, UnknownName> {
        CeilingId::parse(s).ok_or_else(|| UnknownName {
            what: "ceiling id",
            found: s.to_string(),
            expected: "a roof (cpu/fma/f32/all, cpu/mem/L2/triad/t1, gpu0/mma/bf16, gpu0/mem/HBM/triad), net/<collective>/<scope>, net/nccl/<collective>/<scope>, net/p2p/<scope>/<latency|bw|bw_bidir>, gpuN/<h2d|d2h|h2d+d2h|h2d/pageable|d2h/pageable|d2d>, gpuA-gpuB/<p2p|p2p/bidir|p2p/sm|p2p/sm/bidir>, io/<label>/<seq|small|small/files> or agg/<id>".into(),
        })
    }
}

/// Compares with an id as the files spell it.
impl PartialEq<str> for CeilingId {
    fn eq(&self, other: &str) -> bool {
        CeilingId::parse(other).is_some_and(|o| o == *self)
    }
}

impl PartialEq<&str> for CeilingId {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl PartialEq<String> for CeilingId {
    fn eq(&self, other: &String) -> bool {
        *self == *other.as_str()
    }
}

impl From<RoofId> for CeilingId {
    fn from(r: RoofId) -> CeilingId {
        CeilingId::Roof(r)
    }
}

impl serde::Serialize for CeilingId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for CeilingId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<CeilingId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// What a table of measurements behind a roof lists: the shapes a CPU GEMM ceiling is the best
/// of, the layers of the CPU convolution ceiling, a GPU library's shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum TableRows {
    Shapes,
    Layers,
    Table,
}

impl TableRows {
    pub const ALL: [TableRows; 3] = [TableRows::Shapes, TableRows::Layers, TableRows::Table];

    pub fn name(self) -> &'static str {
        match self {
            TableRows::Shapes => "shapes",
            TableRows::Layers => "layers",
            TableRows::Table => "table",
        }
    }
}

/// A table's id: the roof it is behind and what it lists (`cpu/gemm/f32/all/shapes`,
/// `cpu/conv/f32/all/layers`, `gpu0/gemm/f16/table`, `gpu0/conv/f16/fwd/table`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TableId {
    pub of: RoofId,
    pub rows: TableRows,
}

impl TableId {
    /// Parses a table's id (None: not one).
    pub fn parse(id: &str) -> Option<TableId> {
        let (roof, rows) = id.rsplit_once('/')?;
        Some(TableId {
            of: RoofId::parse(roof)?,
            rows: rows.parse().ok()?,
        })
    }
}

named!(TableRows, "table's rows");

impl fmt::Display for TableId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.of, self.rows.name())
    }
}

impl FromStr for TableId {
    type Err = UnknownName;
    fn from_str(s: &str) -> Result<TableId, UnknownName> {
        TableId::parse(s).ok_or_else(|| UnknownName {
            what: "table id",
            found: s.to_string(),
            expected: "<roof id>/shapes, <roof id>/layers or <roof id>/table".into(),
        })
    }
}

impl PartialEq<str> for TableId {
    fn eq(&self, other: &str) -> bool {
        TableId::parse(other).is_some_and(|o| o == *self)
    }
}

impl PartialEq<&str> for TableId {
    fn eq(&self, other: &&str) -> bool {
        *self == **other
    }
}

impl serde::Serialize for TableId {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> serde::Deserialize<'de> for TableId {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<TableId, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every table id the probe writes round-trips, typed.
    #[test]
    fn table_ids_round_trip() {
        for id in [
            "cpu/gemm/f32/all/shapes",
            "cpu/gemm/f16/t1/shapes",
            "cpu/conv/f32/all/layers",
            "gpu0/gemm/f16/table",
            "gpu1/conv/bf16/bwd_data/table",
        ] {
            let t: TableId = id.parse().unwrap();
            assert_eq!(t.to_string(), id);
            assert_eq!(
                serde_json::from_str::<TableId>(&serde_json::to_string(&t).unwrap()).unwrap(),
                t
            );
        }
        assert!(TableId::parse("cpu/gemm/f32/all/rows").is_none());
        assert!(TableId::parse("cpu/mem/sweep/triad/t1").is_none());
    }

    /// Every id the probe writes reads back as itself, typed: the roofs, MPI's and NCCL's
    /// collectives, point to point, the GPU's copies, storage (labels with slashes too), the
    /// aggregates.
    #[test]
    fn every_id_the_probe_writes_round_trips() {
        let mut ids: Vec<String> = vec![
            "cpu/fma/f32/all",
            "cpu/mem/L2/triad/t1",
            "gpu0/mma/bf16",
            "gpu3/conv/f16/bwd_filter",
            "gpu0/mem/HBM/triad",
            "net/p2p/intra/latency",
            "net/p2p/inter/bw",
            "net/p2p/world/bw_bidir",
            "gpu0-gpu1/p2p",
            "gpu0-gpu1/p2p/bidir",
            "gpu1-gpu0/p2p/sm",
            "gpu2-gpu3/p2p/sm/bidir",
            "io/tmp/seq",
            "io/scratch/small",
            "io/scratch/small/files",
            "agg/cpu/fma/f32/all",
            "agg/net/p2p/inter/latency",
        ]
        .into_iter()
        .map(String::from)
        .collect();
        for op in Collective::ALL {
            for s in Scope::ALL {
                ids.push(format!("net/{}/{}", op.name(), s.name()));
                ids.push(format!("net/nccl/{}/{}", op.name(), s.name()));
            }
        }
        for c in GpuCopy::ALL {
            ids.push(format!("gpu7/{}", c.name()));
        }
        for id in &ids {
            let typed: CeilingId = id.parse().unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(typed.to_string(), *id);
            let json = serde_json::to_string(&typed).unwrap();
            assert_eq!(json, format!("\"{id}\""));
            assert_eq!(serde_json::from_str::<CeilingId>(&json).unwrap(), typed);
        }
        assert_eq!(
            CeilingId::parse("io/scratch/small/files"),
            Some(CeilingId::Io {
                label: "scratch".into(),
                test: IoTest::SmallFiles
            })
        );
        assert!(CeilingId::parse("agg/agg/cpu/fma/f32/all").is_some());
        for bad in [
            "net/allreduce/galaxy",
            "net/p2p/intra/speed",
            "gpu0/h2x",
            "gpuX-gpu1/p2p",
            "io//seq",
            "cpu/fma/f33/all",
            "agg/",
            "cpu/mem/sweep/read/all",
        ] {
            assert!(CeilingId::parse(bad).is_none(), "{bad}");
        }
        let e = "net/x".parse::<CeilingId>().unwrap_err().to_string();
        assert!(
            e.contains("not a ceiling id") && e.contains("net/p2p/<scope>"),
            "{e}"
        );
    }
}
