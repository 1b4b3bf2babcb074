//! Fleet screening (`machine.json` → `fleet`): in a distributed probe every node measured its
//! own ceilings; for each ceiling the fleet's median and spread, and every node that falls
//! short of the median by more than the noise of its own samples plus a stated margin, named
//! with the ceiling, its value, the median and the causes the probe can see (a lower measured
//! clock, shared cores, throttle reasons, a PCIe link below its maximum). The link matrix
//! between the nodes is [`crate::links`].

use crate::ids::{On, Threads};
use crate::machine::{Ceiling, Machine, NodeCeilings};
use crate::CeilingId;
use serde::{Deserialize, Serialize};
use std::fmt;

/// The margin by default: a node more than 10% (plus its own noise) short of the fleet's
/// median is named.
pub const DEFAULT_MARGIN: f64 = 0.10;

/// The screening of a distributed probe's nodes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Fleet {
    /// Nodes screened.
    pub nodes: usize,
    /// The stated margin (a fraction of the median).
    pub margin: f64,
    /// How a node is judged, in words.
    pub rule: String,
    /// Every ceiling measured on at least two nodes: the fleet's median and spread.
    pub ceilings: Vec<FleetCeiling>,
    /// The nodes short of the median, worst first (empty when none is).
    pub outliers: Vec<Outlier>,
    /// Point-to-point links between every pair of nodes (absent when not measured).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub links: Option<crate::links::LinkMatrix>,
    /// The same between the nodes' GPUs, over NCCL send/recv (absent without GPUs and NCCL).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_links: Option<crate::links::LinkMatrix>,
}

/// One ceiling over the fleet.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FleetCeiling {
    pub id: CeilingId,
    pub unit: String,
    /// Nodes that measured it.
    pub nodes: usize,
    pub median: f64,
    pub min: f64,
    pub max: f64,
    /// The median absolute deviation of the nodes' values over their median.
    pub spread: f64,
}

/// One node short of the fleet on one ceiling.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Outlier {
    pub node: usize,
    pub host: String,
    pub id: CeilingId,
    pub unit: String,
    pub value: f64,
    /// The fleet's median of this ceiling.
    pub median: f64,
    /// How far short of the median, a fraction of it (for a time: how far above it).
    pub short_by: f64,
    /// The noise of the node's own samples (their coefficient of variation) that was allowed
    /// on top of the margin.
    pub noise: f64,
    /// What the probe saw on that node that explains it (empty: nothing it can see).
    pub causes: Vec<Cause>,
}

/// A likely cause the probe can see on a node.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cause", rename_all = "snake_case")]
pub enum Cause {
    /// The node's measured core clock (for the ceiling's thread count) below the fleet's.
    LowerClock {
        threads: Threads,
        clock_hz: f64,
        fleet_hz: f64,
    },
    /// The all-core clock far below the one-core clock: the cores were shared (SMT siblings,
    /// another load) while the `all` ceilings ran.
    SharedCores { ratio: f64 },
    /// The node's load check found it busy while it was measured (its own words).
    Busy { why: Vec<String> },
    /// NVML reported throttle (clock event) reasons on the GPU during the probe.
    Throttled { gpu: usize, reasons: Vec<String> },
    /// The GPU's SM clock during the probe below the fleet's.
    LowerGpuClock {
        gpu: usize,
        clock_mhz: f64,
        fleet_mhz: f64,
    },
    /// The GPU's PCIe link trained below its maximum generation or width.
    PcieBelowMax {
        gpu: usize,
        generation: u32,
        generation_max: u32,
        width: u32,
        width_max: u32,
    },
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::LowerClock {
                threads,
                clock_hz,
                fleet_hz,
            } => write!(
                f,
                "lower measured clock ({} cores: {:.2} GHz, fleet median {:.2} GHz)",
                threads.name(),
                clock_hz / 1e9,
                fleet_hz / 1e9
            ),
            Cause::SharedCores { ratio } => write!(
                f,
                "shared cores (all-core clock {:.0}% of one core's)",
                100.0 * ratio
            ),
            Cause::Busy { why } => write!(f, "busy while measured: {}", why.join("; ")),
            Cause::Throttled { gpu, reasons } => {
                write!(f, "gpu{gpu} throttled ({})", reasons.join(", "))
            }
            Cause::LowerGpuClock {
                gpu,
                clock_mhz,
                fleet_mhz,
            } => write!(
                f,
                "gpu{gpu} SM clock {clock_mhz:.0} MHz, fleet median {fleet_mhz:.0} MHz"
            ),
            Cause::PcieBelowMax {
                gpu,
                generation,
                generation_max,
                width,
                width_max,
            } => write!(
                f,
                "gpu{gpu} PCIe link at gen {generation} x{width}, its maximum gen {generation_max} x{width_max}"
            ),
        }
    }
}

/// The median of the finite values of `v` (of an even count: the mean of the middle two), as
/// every figure's statistics take it.
pub fn median(v: &[f64]) -> Option<f64> {
    let finite: Vec<f64> = v.iter().copied().filter(|x| x.is_finite()).collect();
    crate::Stats::from_samples(&finite).map(|s| s.median)
}

/// Whether a ceiling in `unit` is better when lower (a time).
fn lower_is_better(unit: &str) -> bool {
    unit == "s"
}

/// How far `value` is short of `median`, a fraction of the median (negative: better).
pub fn shortfall(value: f64, median: f64, unit: &str) -> f64 {
    if median <= 0.0 {
        return 0.0;
    }
    if lower_is_better(unit) {
        (value - median) / median
    } else {
        (median - value) / median
    }
}

/// What a node's own probe saw of its conditions, for the causes.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Conditions {
    pub clock_t1_hz: Option<f64>,
    pub clock_all_hz: Option<f64>,
    pub shared_cores: Option<f64>,
    /// What the node's load check found (empty: quiet, or not checked).
    pub busy: Vec<String>,
    /// Per GPU index: throttle reasons, median SM clock, PCIe (gen, gen max, width, width max).
    pub gpus: Vec<GpuConditions>,
}

#[derive(Clone, Debug, Default, PartialEq)]
pub struct GpuConditions {
    pub index: usize,
    pub throttle_reasons: Vec<String>,
    pub sm_clock_mhz: Option<f64>,
    pub pcie: Option<(u32, u32, u32, u32)>,
}

impl Conditions {
    /// What a node's `machine` (its own probe's result) says of its conditions.
    pub fn of(m: &Machine) -> Conditions {
        let cpu = &m.provenance.cpu;
        Conditions {
            clock_t1_hz: cpu.measured_clock_hz_t1.as_ref().map(|s| s.median),
            clock_all_hz: cpu.measured_clock_hz_all.as_ref().map(|s| s.median),
            shared_cores: cpu.shared_cores.as_ref().map(|s| s.ratio),
            busy: m
                .provenance
                .load
                .as_ref()
                .map(|l| l.busy.clone())
                .unwrap_or_default(),
            gpus: m
                .provenance
                .gpus
                .iter()
                .map(|g| {
                    let t = g.telemetry.as_ref();
                    GpuConditions {
                        index: g.index,
                        throttle_reasons: t.map(|t| t.throttle_reasons.clone()).unwrap_or_default(),
                        sm_clock_mhz: t.and_then(|t| t.sm_clock_mhz.as_ref()).map(|s| s.median),
                        pcie: match (
                            g.pcie_generation,
                            g.pcie_generation_max,
                            g.pcie_width,
                            g.pcie_width_max,
                        ) {
                            (Some(a), Some(b), Some(c), Some(d)) => Some((a, b, c, d)),
                            _ => None,
                        },
                    }
                })
                .collect(),
        }
    }
}

/// The device a ceiling ran on: a CPU thread count, or the GPUs it involves.
fn devices_of(id: &CeilingId) -> (Option<Threads>, Vec<usize>) {
    match id {
        CeilingId::Roof(r) => match r.on() {
            On::Cpu(t) => (Some(t), Vec::new()),
            On::Gpu(g) => (None, vec![g]),
        },
        CeilingId::Copy { gpu, .. } => (None, vec![*gpu]),
        CeilingId::PeerCopy { from, to, .. } => (None, vec![*from, *to]),
        CeilingId::Aggregate(inner) => devices_of(inner),
        _ => (None, Vec::new()),
    }
}

/// The causes of node `n`'s shortfall on ceiling `id` that its conditions show, against the
/// fleet's (`all`). A clock counts when more than half the margin below the fleet's median.
fn causes(id: &CeilingId, n: &Conditions, all: &[Conditions], margin: f64) -> Vec<Cause> {
    let mut out = Vec::new();
    let (threads, gpus) = devices_of(id);
    if let Some(t) = threads {
        let clock = |c: &Conditions| match t {
            Threads::T1 => c.clock_t1_hz,
            Threads::All => c.clock_all_hz,
        };
        let fleet: Vec<f64> = all.iter().filter_map(clock).collect();
        if let (Some(mine), Some(fleet_hz)) = (clock(n), median(&fleet)) {
            if mine < fleet_hz * (1.0 - margin / 2.0) {
                out.push(Cause::LowerClock {
                    threads: t,
                    clock_hz: mine,
                    fleet_hz,
                });
            }
        }
        if let (Threads::All, Some(ratio)) = (t, n.shared_cores) {
            out.push(Cause::SharedCores { ratio });
        }
        if !n.busy.is_empty() {
            out.push(Cause::Busy {
                why: n.busy.clone(),
            });
        }
    }
    for g in gpus {
        let Some(mine) = n.gpus.iter().find(|x| x.index == g) else {
            continue;
        };
        let reasons: Vec<String> = mine
            .throttle_reasons
            .iter()
            .filter(|r| !r.eq_ignore_ascii_case("GPU_IDLE") && !r.eq_ignore_ascii_case("NONE"))
            .cloned()
            .collect();
        if !reasons.is_empty() {
            out.push(Cause::Throttled { gpu: g, reasons });
        }
        let fleet: Vec<f64> = all
            .iter()
            .filter_map(|c| c.gpus.iter().find(|x| x.index == g)?.sm_clock_mhz)
            .collect();
        if let (Some(clock), Some(fleet_mhz)) = (mine.sm_clock_mhz, median(&fleet)) {
            if clock < fleet_mhz * (1.0 - margin / 2.0) {
                out.push(Cause::LowerGpuClock {
                    gpu: g,
                    clock_mhz: clock,
                    fleet_mhz,
                });
            }
        }
        if let Some((generation, generation_max, width, width_max)) = mine.pcie {
            if generation < generation_max || width < width_max {
                out.push(Cause::PcieBelowMax {
                    gpu: g,
                    generation,
                    generation_max,
                    width,
                    width_max,
                });
            }
        }
    }
    out
}

/// Screens the nodes: `nodes[i]`'s ceilings with `conditions[i]` (same order; missing
/// conditions count as none seen). A ceiling measured on fewer than two nodes is not screened.
pub fn screen(nodes: &[NodeCeilings], conditions: &[Conditions], margin: f64) -> Fleet {
    let none = Conditions::default();
    let cond = |i: usize| conditions.get(i).unwrap_or(&none);
    // Ceiling ids in the order the first node that has each wrote them.
    let mut ids: Vec<(&CeilingId, &str)> = Vec::new();
    for n in nodes {
        for c in &n.ceilings {
            if !ids.iter().any(|(id, _)| *id == &c.id) {
                ids.push((&c.id, &c.unit));
            }
        }
    }
    let mut ceilings = Vec::new();
    let mut outliers = Vec::new();
    for (id, unit) in ids {
        let have: Vec<(usize, &NodeCeilings, &Ceiling)> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((i, n, n.ceilings.iter().find(|c| &c.id == id)?)))
            .filter(|(_, _, c)| c.unit == unit && c.value.is_finite())
            .collect();
        if have.len() < 2 {
            continue;
        }
        let values: Vec<f64> = have.iter().map(|(_, _, c)| c.value).collect();
        let Some(med) = median(&values) else { continue };
        let deviations: Vec<f64> = values.iter().map(|v| (v - med).abs()).collect();
        let mad = median(&deviations).unwrap_or(0.0);
        ceilings.push(FleetCeiling {
            id: id.clone(),
            unit: unit.to_string(),
            nodes: have.len(),
            median: med,
            min: values.iter().copied().fold(f64::INFINITY, f64::min),
            max: values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            spread: if med > 0.0 { mad / med } else { 0.0 },
        });
        let all: Vec<Conditions> = have.iter().map(|(i, _, _)| cond(*i).clone()).collect();
        for (i, n, c) in &have {
            let short_by = shortfall(c.value, med, unit);
            let noise = c.stats.cv.max(0.0);
            if short_by > margin + noise {
                outliers.push(Outlier {
                    node: *i,
                    host: n.host.clone(),
                    id: id.clone(),
                    unit: unit.to_string(),
                    value: c.value,
                    median: med,
                    short_by,
                    noise,
                    causes: causes(id, cond(*i), &all, margin),
                });
            }
        }
    }
    outliers.sort_by(|a, b| b.short_by.total_cmp(&a.short_by));
    Fleet {
        nodes: nodes.len(),
        margin,
        rule: format!(
            "a node is named when one of its ceilings is short of the fleet's median by more than {:.0}% plus the coefficient of variation of its own samples (for a time: above it by as much); causes are what its own probe saw: its measured clock more than {:.0}% below the fleet's, shared cores, another load, GPU throttle reasons, a GPU clock below the fleet's, a PCIe link below its maximum",
            100.0 * margin,
            50.0 * margin
        ),
        ceilings,
        outliers,
        links: None,
        gpu_links: None,
    }
}

impl Fleet {
    /// The nodes named, each once, in node order.
    pub fn named_nodes(&self) -> Vec<usize> {
        let mut v: Vec<usize> = self.outliers.iter().map(|o| o.node).collect();
        v.sort_unstable();
        v.dedup();
        v
    }
}

#[cfg(test)]
mod tests;
