//! What makes two results the same hardware: the identity `gate`, `place` and `plot` check
//! before they hold one file's figures against another's, or against this machine.
//!
//! Cloud machines report generic CPU names ("AMD EPYC", "Intel Xeon Processor"), so the name
//! says little: the identity is the CPU's vendor, family, model and stepping, its sockets and
//! cores, its caches, the SIMD the probes ran with, the GPUs (name, memory, driver major; no
//! UUID, so that two machines of one kind are one identity) and the class of its measured clock.
//! A field one side does not record (an older file, a run that did not measure the clock) is
//! not compared.

use crate::machine::{CacheInfo, CpuInfo, GpuInfo, Provenance};

/// Two best one-core clocks further apart than this (relative) are different clock classes:
/// another SKU of the same family and model, or a machine held at another frequency. Wider than
/// a quiet machine's run-to-run spread of its best clock sample (a few per cent).
pub const CLOCK_CLASS: f64 = 0.15;

/// How [`Identity::differences`] names a clock of another class.
pub const CLOCK_PHRASE: &str = "one-core clock (best measured)";

/// One GPU as the identity sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuModel {
    pub name: String,
    /// Memory, GiB rounded (drivers report a few MiB more or less across versions).
    pub memory_gib: u64,
    /// The driver's major version (`580` of `580.95.05`), when recorded.
    pub driver_major: Option<u32>,
}

impl std::fmt::Display for GpuModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {} GiB", self.name, self.memory_gib)?;
        if let Some(d) = self.driver_major {
            write!(f, " driver {d}")?;
        }
        Ok(())
    }
}

/// A machine's identity, from a result's provenance ([`Identity::of`]).
#[derive(Clone, Debug, PartialEq)]
pub struct Identity {
    pub vendor: String,
    pub family: u32,
    pub model: u32,
    pub stepping: u32,
    pub sockets: usize,
    pub cores: usize,
    /// Every cache level: `L1 Data 32 KiB ×2`; empty when not recorded.
    pub caches: Vec<String>,
    /// The widest SIMD the probes ran with; empty when not recorded.
    pub simd: String,
    pub gpus: Vec<GpuModel>,
    /// The best one-core clock sample, Hz (none when not measured).
    pub clock_hz: Option<f64>,
}

/// How the core counts compare.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cores {
    /// Two results: the same count.
    Equal,
    /// A file against this machine: the file may have been probed on a subset of its cores (a
    /// cpuset, `taskset`), never on more than it has.
    AtMostHere,
}

fn cache_line(c: &CacheInfo) -> String {
    let size = if c.size_bytes.is_multiple_of(1 << 20) {
        format!("{} MiB", c.size_bytes >> 20)
    } else {
        format!("{} KiB", c.size_bytes >> 10)
    };
    format!("L{} {} {size}", c.level, c.cache_type)
}

fn gpu_model(g: &GpuInfo) -> GpuModel {
    GpuModel {
        name: g.name.clone(),
        memory_gib: (g.memory_bytes as f64 / (1u64 << 30) as f64).round() as u64,
        driver_major: g
            .driver_version
            .as_deref()
            .and_then(|v| v.split('.').next())
            .and_then(|m| m.trim().parse().ok()),
    }
}

impl Identity {
    /// The identity of the machine a result was measured on.
    pub fn of(p: &Provenance) -> Identity {
        Identity::of_parts(&p.cpu, &p.gpus)
    }

    /// The identity of a CPU and its GPUs.
    pub fn of_parts(cpu: &CpuInfo, gpus: &[GpuInfo]) -> Identity {
        Identity {
            vendor: cpu.vendor.clone(),
            family: cpu.family,
            model: cpu.model,
            stepping: cpu.stepping,
            sockets: cpu.sockets,
            cores: cpu.cores,
            caches: cpu.caches.iter().map(cache_line).collect(),
            simd: cpu.simd.clone(),
            gpus: gpus.iter().map(gpu_model).collect(),
            clock_hz: cpu
                .measured_clock_hz_t1
                .as_ref()
                .map(|s| s.max)
                .filter(|h| h.is_finite() && *h > 0.0),
        }
    }

    /// What differs between `self` (called `a`) and `other` (called `b`), one phrase each
    /// ("CPU family/model/stepping: baseline 26/2/0, current 25/17/1"); empty when they are
    /// the same machine. Fields either side lacks are not compared.
    pub fn differences(&self, other: &Identity, (a, b): (&str, &str), cores: Cores) -> Vec<String> {
        let mut out = Vec::new();
        let mut diff = |what: &str, x: String, y: String| {
            if x != y {
                out.push(format!("{what}: {a} {x}, {b} {y}"));
            }
        };
        diff("CPU vendor", self.vendor.clone(), other.vendor.clone());
        diff(
            "CPU family/model/stepping",
            format!("{}/{}/{}", self.family, self.model, self.stepping),
            format!("{}/{}/{}", other.family, other.model, other.stepping),
        );
        diff(
            "sockets",
            self.sockets.to_string(),
            other.sockets.to_string(),
        );
        if match cores {
            Cores::Equal => self.cores != other.cores,
            Cores::AtMostHere => self.cores > other.cores,
        } {
            diff("cores", self.cores.to_string(), other.cores.to_string());
        }
        if !self.caches.is_empty() && !other.caches.is_empty() {
            diff("caches", self.caches.join(", "), other.caches.join(", "));
        }
        if !self.simd.is_empty() && !other.simd.is_empty() {
            diff("SIMD", self.simd.clone(), other.simd.clone());
        }
        let gpus = |g: &[GpuModel]| {
            if g.is_empty() {
                "none".to_string()
            } else {
                g.iter()
                    .map(|x| x.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        };
        // A driver major recorded on one side only is not a difference.
        let same_gpus = self.gpus.len() == other.gpus.len()
            && self.gpus.iter().zip(&other.gpus).all(|(x, y)| {
                x.name == y.name
                    && x.memory_gib == y.memory_gib
                    && (x.driver_major.is_none()
                        || y.driver_major.is_none()
                        || x.driver_major == y.driver_major)
            });
        if !same_gpus {
            diff(
                "GPUs",
                format!("[{}]", gpus(&self.gpus)),
                format!("[{}]", gpus(&other.gpus)),
            );
        }
        if let (Some(x), Some(y)) = (self.clock_hz, other.clock_hz) {
            if (y / x - 1.0).abs() > CLOCK_CLASS {
                diff(
                    CLOCK_PHRASE,
                    format!("{:.2} GHz", x / 1e9),
                    format!(
                        "{:.2} GHz (more than {:.0}% apart)",
                        y / 1e9,
                        CLOCK_CLASS * 100.0
                    ),
                );
            }
        }
        out
    }
}

/// How the machine a placement ran on differs from the machine file it is drawn with (empty:
/// the same machine), in everything but the clock class. A placement records its CPU, and its GPUs only where it ran on them; the
/// file may have been probed on a subset of the cores.
pub fn placed_elsewhere(m: &crate::Machine, p: &crate::placement::Placement) -> Vec<String> {
    let gpus = if p.provenance.gpus.is_empty() {
        &[][..]
    } else {
        &m.provenance.gpus[..]
    };
    // Not the clock class: the placement's is one quick measurement, the file's a probe's,
    // possibly under mpirun (its ranks share the node): `gate` compares clocks between probes.
    let mut file = Identity::of_parts(&m.provenance.cpu, gpus);
    file.clock_hz = None;
    file.differences(
        &Identity::of(&p.provenance),
        ("the machine file", "the placement"),
        Cores::AtMostHere,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Stats;

    fn cpu() -> CpuInfo {
        serde_json::from_value(serde_json::json!({
            "vendor": "AuthenticAMD", "model_name": "AMD EPYC", "family": 25, "model": 17,
            "stepping": 1, "sockets": 1, "cores": 2, "logical_cpus": 2, "features": [],
            "simd": "avx2",
            "caches": [{"level": 1, "type": "Data", "size_bytes": 32768, "shared_by_cpus": 1,
                        "instances": 2},
                       {"level": 3, "type": "Unified", "size_bytes": 33554432,
                        "shared_by_cpus": 2, "instances": 1}]
        }))
        .unwrap()
    }

    fn id(f: impl Fn(&mut CpuInfo)) -> Identity {
        let mut c = cpu();
        f(&mut c);
        Identity::of_parts(&c, &[])
    }

    const NAMES: (&str, &str) = ("baseline", "current");

    /// The same generic name with another family and model, another L1, another core count,
    /// another SIMD: each is another machine, and says which field differs.
    #[test]
    fn every_field_of_the_identity_is_compared() {
        let here = id(|_| {});
        assert!(here.differences(&here, NAMES, Cores::Equal).is_empty());
        type Change<'a> = &'a dyn Fn(&mut CpuInfo);
        let cases: [(Change, &str); 6] = [
            (
                &|c| c.family = 26,
                "CPU family/model/stepping: baseline 25/17/1, current 26/17/1",
            ),
            (&|c| c.stepping = 2, "CPU family/model/stepping"),
            (
                &|c| c.caches[0].size_bytes = 49152,
                "caches: baseline L1 Data 32 KiB, L3 Unified 32 MiB, current L1 Data 48 KiB",
            ),
            (&|c| c.cores = 4, "cores: baseline 2, current 4"),
            (
                &|c| c.simd = "avx512".into(),
                "SIMD: baseline avx2, current avx512",
            ),
            (&|c| c.vendor = "GenuineIntel".into(), "CPU vendor"),
        ];
        for (change, says) in cases {
            let other = id(change);
            let d = here.differences(&other, NAMES, Cores::Equal);
            assert_eq!(d.len(), 1, "{d:?}");
            assert!(d[0].starts_with(says), "{d:?} should start with {says}");
        }
        // The name alone is not the identity: a renamed CPU of one kind is the same machine.
        let renamed = id(|c| c.model_name = "AMD EPYC 7763 64-Core Processor".into());
        assert!(here.differences(&renamed, NAMES, Cores::Equal).is_empty());
    }

    /// Unknown fields (an older file without SIMD or clock) are not compared; a file probed on
    /// a subset of this machine's cores is this machine, one with more cores is not.
    #[test]
    fn unknown_fields_and_core_subsets() {
        let full = id(|c| {
            c.measured_clock_hz_t1 = Stats::from_samples(&[3.0e9, 3.3e9]);
        });
        let old = id(|c| c.simd.clear());
        assert!(full.differences(&old, NAMES, Cores::Equal).is_empty());
        let big = id(|c| c.cores = 8);
        assert!(full.differences(&big, NAMES, Cores::AtMostHere).is_empty());
        assert_eq!(
            big.differences(&full, NAMES, Cores::AtMostHere),
            vec!["cores: baseline 8, current 2".to_string()]
        );
        // The clock: within the class the same, beyond it another machine.
        let near = id(|c| c.measured_clock_hz_t1 = Stats::from_samples(&[3.1e9]));
        assert!(full.differences(&near, NAMES, Cores::Equal).is_empty());
        let slow = id(|c| c.measured_clock_hz_t1 = Stats::from_samples(&[2.2e9]));
        let d = full.differences(&slow, NAMES, Cores::Equal);
        assert!(
            d[0].starts_with("one-core clock (best measured): baseline 3.30 GHz, current 2.20 GHz"),
            "{d:?}"
        );
    }

    /// GPUs: name and memory, not the UUID; the driver's major version where both record it.
    #[test]
    fn gpus_by_model_memory_and_driver_major() {
        let g = |name: &str, gib: u64, driver: Option<&str>, uuid: &str| GpuInfo {
            name: name.into(),
            uuid: uuid.into(),
            memory_bytes: gib << 30,
            driver_version: driver.map(str::to_string),
            ..GpuInfo::default()
        };
        let with = |gpus: &[GpuInfo]| Identity::of_parts(&cpu(), gpus);
        let a = with(&[g("NVIDIA H200", 141, Some("580.95.05"), "GPU-1")]);
        let b = with(&[g("NVIDIA H200", 141, Some("580.65.06"), "GPU-2")]);
        assert!(a.differences(&b, NAMES, Cores::Equal).is_empty());
        let c = with(&[g("NVIDIA H200", 141, None, "GPU-3")]);
        assert!(a.differences(&c, NAMES, Cores::Equal).is_empty());
        let d = with(&[g("NVIDIA H200", 141, Some("590.1"), "GPU-1")]);
        assert_eq!(
            a.differences(&d, NAMES, Cores::Equal),
            vec!["GPUs: baseline [NVIDIA H200 141 GiB driver 580], current [NVIDIA H200 141 GiB driver 590]".to_string()]
        );
        let h100 = with(&[g("NVIDIA H100 80GB HBM3", 80, Some("580.95.05"), "GPU-1")]);
        assert_eq!(a.differences(&h100, NAMES, Cores::Equal).len(), 1);
        let none = with(&[]);
        assert_eq!(
            none.differences(&a, NAMES, Cores::Equal),
            vec!["GPUs: baseline [none], current [NVIDIA H200 141 GiB driver 580]".to_string()]
        );
    }
}
