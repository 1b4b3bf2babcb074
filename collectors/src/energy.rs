//! CPU energy from the Linux powercap interface (RAPL on Intel, and on AMD where the kernel
//! exposes it): `/sys/class/powercap/<zone>/energy_uj`, a counter of microjoules that wraps at
//! `max_energy_range_uj`. Only package zones (`package-N`) are summed, so that a core or DRAM
//! sub-zone is not counted twice. Nothing is estimated: without readable zones there is no
//! meter, and the reason says what was looked for.

use crate::nvml::{NvmlError, Sampler};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

/// Why there is no CPU energy reading.
#[derive(Clone, Debug, thiserror::Error)]
pub enum EnergyError {
    #[error("no CPU energy counters: {} is not readable ({source})", root.display())]
    Unreadable {
        root: PathBuf,
        #[source]
        source: Arc<std::io::Error>,
    },
    #[error("no CPU energy counters: {zones} package zone(s) under {} exist but energy_uj is not readable (root only since Linux 5.10)", root.display())]
    Restricted { root: PathBuf, zones: usize },
    #[error("no CPU energy counters: no package zone under {} (no RAPL driver, or a virtual machine)", root.display())]
    NoZone { root: PathBuf },
    #[error("{zone}: the counter stopped being readable")]
    Stopped { zone: String },
    /// The span's measured part never began (a run that stopped during its warm-up).
    #[error("the measured steps did not start")]
    NotStarted,
}

/// One readable package zone.
#[derive(Clone, Debug)]
struct Zone {
    name: String,
    counter: PathBuf,
    range_uj: u64,
    start_uj: u64,
}

/// Energy counters started at one moment.
#[derive(Debug)]
pub struct Meter {
    zones: Vec<Zone>,
    t0: Instant,
}

/// What a meter measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Reading {
    pub joules: f64,
    pub seconds: f64,
    /// e.g. `powercap intel-rapl:0 (package-0)`.
    pub sources: Vec<String>,
}

/// Energy per step from a reading over `steps` steps; `span` says what it covers in the note.
/// No reading, or counters that did not advance: not measured, and why.
pub fn per_step(
    reading: &Result<Reading, EnergyError>,
    steps: usize,
    span: &str,
) -> roofline_model::placement::Energy {
    use roofline_model::placement::Energy;
    match reading {
        Ok(r) if r.joules > 0.0 && steps > 0 => Energy {
            measured: true,
            sources: r.sources.clone(),
            joules_per_step: Some(r.joules / steps as f64),
            average_watts: Some(r.joules / r.seconds.max(1e-12)),
            flops_per_watt: None,
            note: format!("energy {span} from {}", r.sources.join(", ")),
        },
        Ok(_) => Energy {
            note: "energy not measured: the energy counters did not advance; no per-watt figure is reported".into(),
            ..Default::default()
        },
        Err(e) => Energy {
            note: format!("energy not measured: {e}; no per-watt figure is reported"),
            ..Default::default()
        },
    }
}

fn read_u64(p: &Path) -> Option<u64> {
    std::fs::read_to_string(p).ok()?.trim().parse().ok()
}

impl Meter {
    /// Starts every readable package zone under `root` (normally `/sys/class/powercap`), or
    /// says why there is none.
    pub fn start_at(root: &Path) -> Result<Meter, EnergyError> {
        let entries = std::fs::read_dir(root).map_err(|e| EnergyError::Unreadable {
            root: root.to_path_buf(),
            source: Arc::new(e),
        })?;
        let mut zones = Vec::new();
        let mut unreadable = 0;
        let mut dirs: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
        dirs.sort();
        for d in dirs {
            let Some(name) = std::fs::read_to_string(d.join("name")).ok() else {
                continue;
            };
            let name = name.trim().to_string();
            if !name.starts_with("package") {
                continue;
            }
            let counter = d.join("energy_uj");
            match (read_u64(&counter), read_u64(&d.join("max_energy_range_uj"))) {
                (Some(start_uj), Some(range_uj)) if range_uj > 0 => zones.push(Zone {
                    name: format!(
                        "powercap {} ({name})",
                        d.file_name().unwrap_or_default().to_string_lossy()
                    ),
                    counter,
                    range_uj,
                    start_uj,
                }),
                _ => unreadable += 1,
            }
        }
        if zones.is_empty() {
            let root = root.to_path_buf();
            return Err(if unreadable > 0 {
                EnergyError::Restricted {
                    root,
                    zones: unreadable,
                }
            } else {
                EnergyError::NoZone { root }
            });
        }
        Ok(Meter {
            zones,
            t0: Instant::now(),
        })
    }

    pub fn start() -> Result<Meter, EnergyError> {
        Meter::start_at(Path::new("/sys/class/powercap"))
    }

    /// Joules since `start` (each counter's wrap-around undone once).
    pub fn read(&self) -> Result<Reading, EnergyError> {
        let mut joules = 0.0;
        for z in &self.zones {
            let now = read_u64(&z.counter).ok_or_else(|| EnergyError::Stopped {
                zone: z.name.clone(),
            })?;
            let uj = if now >= z.start_uj {
                now - z.start_uj
            } else {
                now + z.range_uj - z.start_uj
            };
            joules += uj as f64 * 1e-6;
        }
        Ok(Reading {
            joules,
            seconds: self.t0.elapsed().as_secs_f64(),
            sources: self.zones.iter().map(|z| z.name.clone()).collect(),
        })
    }
}

/// The energy of one span of work: the CPU packages' counters and, on a GPU, its NVML sampler,
/// both started together.
pub struct Span {
    cpu: Result<Meter, EnergyError>,
    gpu: Option<Result<Sampler, NvmlError>>,
}

impl Span {
    /// Starts the CPU's meter now, with `gpu` (a GPU's sampler, or why there is none) when a GPU
    /// does the work.
    pub fn start(gpu: Option<Result<Sampler, NvmlError>>) -> Span {
        Span {
            cpu: Meter::start(),
            gpu,
        }
    }

    /// The energy since `start`: the CPU packages' reading with the GPU's over `gpu_seconds`
    /// added (or standing alone without a CPU reading), and a note when a GPU's energy could not
    /// be measured.
    pub fn stop(self, gpu_seconds: f64) -> (Result<Reading, EnergyError>, Option<String>) {
        let reading = self.cpu.and_then(|m| m.read());
        match self.gpu {
            None => (reading, None),
            Some(sampler) => {
                crate::nvml::with_gpu_energy(reading, sampler.map(|s| s.stop()), gpu_seconds)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn zone(root: &Path, dir: &str, name: &str, uj: u64, range: u64) {
        let d = root.join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("name"), format!("{name}\n")).unwrap();
        std::fs::write(d.join("energy_uj"), format!("{uj}\n")).unwrap();
        std::fs::write(d.join("max_energy_range_uj"), format!("{range}\n")).unwrap();
    }

    #[test]
    fn package_zones_are_summed_and_wraps_undone() {
        let root = std::env::temp_dir().join(format!("roofline-powercap-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        zone(&root, "intel-rapl:0", "package-0", 1_000_000, 10_000_000);
        zone(&root, "intel-rapl:0:0", "core", 5, 10_000_000);
        zone(&root, "intel-rapl:1", "package-1", 9_500_000, 10_000_000);
        let m = Meter::start_at(&root).unwrap();
        // +2 J on package 0; package 1 wraps: 9.5 → 10 → 0.25 J: +0.75 J.
        std::fs::write(root.join("intel-rapl:0/energy_uj"), "3000000").unwrap();
        std::fs::write(root.join("intel-rapl:1/energy_uj"), "250000").unwrap();
        std::fs::write(root.join("intel-rapl:0:0/energy_uj"), "999999999").unwrap();
        let r = m.read().unwrap();
        assert!((r.joules - 2.75).abs() < 1e-9, "{}", r.joules);
        assert_eq!(r.sources.len(), 2, "{:?}", r.sources);
        assert!(r.sources[0].contains("package-0"));
        let empty = root.join("none");
        std::fs::create_dir_all(&empty).unwrap();
        assert!(matches!(
            Meter::start_at(&empty),
            Err(EnergyError::NoZone { .. })
        ));
        let missing = Meter::start_at(&root.join("missing")).unwrap_err();
        assert!(missing.to_string().contains("not readable"), "{missing}");
        // The I/O error is kept as the cause.
        assert!(std::error::Error::source(&missing).is_some());
        std::fs::remove_dir_all(&root).unwrap();
    }
}
