//! NVML: a GPU's inventory (clocks, power limit, PCIe, NVLink, driver, persistence, ECC) and a
//! sampler that records clocks, power, temperature and throttle reasons while a probe runs.
//!
//! NVML is opened at run time from the path the caller found (libnvidia-ml ships with the
//! driver); without it every function here returns an error or nothing, never panics.

use nvml_wrapper::bitmasks::device::ThrottleReasons;
use nvml_wrapper::enum_wrappers::device::{Clock, TemperatureSensor};
pub use nvml_wrapper::Nvml;
use roofline_model::{GpuInfo, GpuTelemetry, NvLink, Stats};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// NVML's largest link count (NVML_NVLINK_MAX_LINKS).
const MAX_NVLINKS: u32 = 18;

/// Why NVML could not say what was asked. Clone (the causes shared) so that one failed opening
/// can be the reason of every GPU's missing inventory.
#[derive(Clone, Debug, thiserror::Error)]
pub enum NvmlError {
    #[error("NVML: {0}")]
    Open(#[source] Arc<nvml_wrapper::error::NvmlError>),
    #[error("NVML has no device {uuid}: {source}")]
    NoDevice {
        uuid: String,
        #[source]
        source: Arc<nvml_wrapper::error::NvmlError>,
    },
    /// NVML did not open, so nothing it would have said is known.
    #[error("no NVML inventory or telemetry: {0}")]
    Unavailable(#[source] Box<NvmlError>),
    /// There is no GPU to sample; the text says why.
    #[error("no GPU to sample: {0}")]
    NoGpu(String),
}

/// Opens NVML from `lib_path` (or the linker's default name when `None`).
pub fn open(lib_path: Option<&str>) -> Result<Arc<Nvml>, NvmlError> {
    let mut b = Nvml::builder();
    let path;
    if let Some(p) = lib_path {
        path = std::ffi::OsString::from(p);
        b.lib_path(&path);
    }
    b.init()
        .map(Arc::new)
        .map_err(|e| NvmlError::Open(Arc::new(e)))
}

/// Fills the NVML half of `info` (found by `info.uuid`, NVML's `GPU-…` form); fields NVML
/// refuses stay `None`.
pub fn fill_inventory(nvml: &Nvml, info: &mut GpuInfo) -> Result<(), NvmlError> {
    let d = nvml
        .device_by_uuid(info.uuid.as_str())
        .map_err(|e| NvmlError::NoDevice {
            uuid: info.uuid.clone(),
            source: Arc::new(e),
        })?;
    info.pci_bus_id = d.pci_info().ok().map(|p| p.bus_id);
    info.sm_clock_mhz = d.clock_info(Clock::SM).ok();
    info.sm_clock_max_mhz = d.max_clock_info(Clock::SM).ok();
    info.memory_clock_mhz = d.clock_info(Clock::Memory).ok();
    info.memory_clock_max_mhz = d.max_clock_info(Clock::Memory).ok();
    info.power_limit_w = d
        .enforced_power_limit()
        .or_else(|_| d.power_management_limit())
        .ok()
        .map(|mw| mw as f64 / 1000.0);
    info.pcie_generation = d.current_pcie_link_gen().ok();
    info.pcie_generation_max = d.max_pcie_link_gen().ok();
    info.pcie_width = d.current_pcie_link_width().ok();
    info.pcie_width_max = d.max_pcie_link_width().ok();
    info.driver_version = nvml.sys_driver_version().ok();
    info.cuda_driver_version = nvml
        .sys_cuda_driver_version()
        .ok()
        .map(|v| format!("{}.{}", v / 1000, (v % 1000) / 10));
    info.persistence_mode = d.is_in_persistent_mode().ok();
    info.ecc_enabled = d.is_ecc_enabled().ok().map(|e| e.currently_enabled);
    info.nvlinks = (0..MAX_NVLINKS)
        .filter_map(|l| {
            let link = d.link_wrapper_for(l);
            if !link.is_active().ok()? {
                return None;
            }
            Some(NvLink {
                link: l,
                version: link.version().unwrap_or(0),
                remote_pci_bus_id: link.remote_pci_info().map(|p| p.bus_id).unwrap_or_default(),
            })
        })
        .collect();
    Ok(())
}

/// `fill_inventory` when NVML opened, else the reason it did not, as the error.
pub fn inventory(nvml: &Result<Arc<Nvml>, NvmlError>, info: &mut GpuInfo) -> Result<(), NvmlError> {
    match nvml {
        Ok(n) => fill_inventory(n, info),
        Err(e) => Err(NvmlError::Unavailable(Box::new(e.clone()))),
    }
}

/// What NVML reports of a GPU at one moment: the end of one timed sample.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Reading {
    pub sm_clock_mhz: Option<f64>,
    pub power_w: Option<f64>,
    /// The throttle (clock event) reasons set, idle excluded ([`throttle_names`]).
    pub throttle: Vec<String>,
}

/// GPU `uuid`'s SM clock, power draw and throttle reasons now (each `None`, or no reasons,
/// where NVML refuses it: a reading never fails the sample it describes).
pub fn reading(nvml: &Nvml, uuid: &str) -> Reading {
    let Ok(d) = nvml.device_by_uuid(uuid) else {
        return Reading::default();
    };
    Reading {
        sm_clock_mhz: d.clock_info(Clock::SM).ok().map(|v| v as f64),
        power_w: d.power_usage().ok().map(|v| v as f64 / 1000.0),
        throttle: d
            .current_throttle_reasons()
            .map(throttle_names)
            .unwrap_or_default(),
    }
}

/// Names of the throttle (clock event) reasons set in `r`, idle excluded.
pub fn throttle_names(r: ThrottleReasons) -> Vec<String> {
    let all = [
        (
            ThrottleReasons::APPLICATIONS_CLOCKS_SETTING,
            "APPLICATIONS_CLOCKS_SETTING",
        ),
        (ThrottleReasons::SW_POWER_CAP, "SW_POWER_CAP"),
        (ThrottleReasons::HW_SLOWDOWN, "HW_SLOWDOWN"),
        (ThrottleReasons::SYNC_BOOST, "SYNC_BOOST"),
        (ThrottleReasons::SW_THERMAL_SLOWDOWN, "SW_THERMAL_SLOWDOWN"),
        (ThrottleReasons::HW_THERMAL_SLOWDOWN, "HW_THERMAL_SLOWDOWN"),
        (
            ThrottleReasons::HW_POWER_BRAKE_SLOWDOWN,
            "HW_POWER_BRAKE_SLOWDOWN",
        ),
        (
            ThrottleReasons::DISPLAY_CLOCK_SETTING,
            "DISPLAY_CLOCK_SETTING",
        ),
    ];
    all.iter()
        .filter(|(bit, _)| r.contains(*bit))
        .map(|(_, n)| n.to_string())
        .collect()
}

#[derive(Default)]
struct Series {
    sm: Vec<f64>,
    mem: Vec<f64>,
    power: Vec<f64>,
    temp: Vec<f64>,
    reasons: Vec<String>,
    energy_start_mj: Option<u64>,
    energy_end_mj: Option<u64>,
}

/// Samples every GPU every `interval` on a background thread until `stop`.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Series>>>,
    interval: Duration,
}

impl Sampler {
    pub fn start(nvml: Arc<Nvml>, uuids: Vec<String>, interval: Duration) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::Builder::new()
            .name("nvml-sampler".into())
            .spawn(move || {
                let devices: Vec<_> = uuids
                    .iter()
                    .map(|u| nvml.device_by_uuid(u.as_str()).ok())
                    .collect();
                let mut series: Vec<Series> = devices.iter().map(|_| Series::default()).collect();
                for (d, s) in devices.iter().zip(series.iter_mut()) {
                    s.energy_start_mj = d.as_ref().and_then(|d| d.total_energy_consumption().ok());
                }
                loop {
                    let t = Instant::now();
                    for (d, s) in devices.iter().zip(series.iter_mut()) {
                        let Some(d) = d else { continue };
                        if let Ok(v) = d.clock_info(Clock::SM) {
                            s.sm.push(v as f64);
                        }
                        if let Ok(v) = d.clock_info(Clock::Memory) {
                            s.mem.push(v as f64);
                        }
                        if let Ok(v) = d.power_usage() {
                            s.power.push(v as f64 / 1000.0);
                        }
                        if let Ok(v) = d.temperature(TemperatureSensor::Gpu) {
                            s.temp.push(v as f64);
                        }
                        if let Ok(r) = d.current_throttle_reasons() {
                            for n in throttle_names(r) {
                                if !s.reasons.contains(&n) {
                                    s.reasons.push(n);
                                }
                            }
                        }
                    }
                    if flag.load(Ordering::Relaxed) {
                        break;
                    }
                    let spent = t.elapsed();
                    if spent < interval {
                        std::thread::sleep(interval - spent);
                    }
                }
                for (d, s) in devices.iter().zip(series.iter_mut()) {
                    s.energy_end_mj = d.as_ref().and_then(|d| d.total_energy_consumption().ok());
                }
                series
            })
            .ok();
        Sampler {
            stop,
            handle,
            interval,
        }
    }

    /// Stops sampling and returns one telemetry record per GPU, in `uuids` order.
    pub fn stop(mut self) -> Vec<GpuTelemetry> {
        self.stop.store(true, Ordering::Relaxed);
        let series = self
            .handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default();
        series
            .into_iter()
            .map(|s| GpuTelemetry {
                samples: s.sm.len().max(s.power.len()),
                interval_ms: self.interval.as_millis() as u64,
                sm_clock_mhz: Stats::from_samples(&s.sm),
                memory_clock_mhz: Stats::from_samples(&s.mem),
                power_w: Stats::from_samples(&s.power),
                temperature_c: Stats::from_samples(&s.temp),
                throttle_reasons: s.reasons,
                energy_j: match (s.energy_start_mj, s.energy_end_mj) {
                    (Some(a), Some(b)) if b >= a => Some((b - a) as f64 / 1000.0),
                    _ => None,
                },
            })
            .collect()
    }
}

impl Drop for Sampler {
    /// A sampler dropped without `stop` (a run that ended early) stops its thread all the same.
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// A GPU's energy over `seconds` from its telemetry: NVML's total-energy counter, or (where
/// the GPU has none) the mean sampled power × the time, with the source named.
pub fn energy(t: &GpuTelemetry, seconds: f64) -> Option<(f64, &'static str)> {
    match (t.energy_j, &t.power_w) {
        (Some(j), _) if j > 0.0 => Some((j, "NVML total-energy counter")),
        (_, Some(p)) if p.samples > 0 => Some((
            p.mean * seconds,
            "NVML power samples × time (no energy counter on this GPU)",
        )),
        _ => None,
    }
}

/// `reading` (the CPU packages' energy) with the GPU's from its NVML `telemetry` over `seconds`
/// added, or standing alone without a CPU reading; with a note when the GPU's could not be
/// measured (no sampler, or neither an energy counter nor power samples), the reading as it was.
pub fn with_gpu_energy(
    reading: Result<crate::energy::Reading, crate::energy::EnergyError>,
    telemetry: Result<Vec<GpuTelemetry>, NvmlError>,
    seconds: f64,
) -> (
    Result<crate::energy::Reading, crate::energy::EnergyError>,
    Option<String>,
) {
    let t = match telemetry {
        Ok(t) => t,
        Err(e) => return (reading, Some(format!("GPU energy not measured: {e}"))),
    };
    let Some((j, src)) = t.first().and_then(|t| energy(t, seconds)) else {
        return (
            reading,
            Some("NVML gave no energy or power for the GPU".into()),
        );
    };
    let gpu_src = format!("{src} (gpu)");
    let r = match reading {
        Ok(mut r) => {
            r.joules += j;
            r.sources.push(gpu_src);
            r
        }
        Err(_) => crate::energy::Reading {
            joules: j,
            seconds,
            sources: vec![gpu_src],
        },
    };
    (Ok(r), None)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The GPU's NVML energy joins the CPU packages' reading, stands alone without one, and
    /// leaves the reading as it was (with a note) when NVML could not be sampled.
    #[test]
    fn gpu_energy_joins_the_cpu_reading() {
        use crate::energy::Reading;
        let gpu = GpuTelemetry {
            samples: 3,
            interval_ms: 100,
            energy_j: Some(250.0),
            ..Default::default()
        };
        let cpu = Reading {
            joules: 100.0,
            seconds: 2.0,
            sources: vec!["powercap intel-rapl:0 (package-0)".into()],
        };
        let (r, note) = with_gpu_energy(Ok(cpu.clone()), Ok(vec![gpu.clone()]), 2.0);
        let r = r.unwrap();
        assert!(note.is_none());
        assert_eq!(r.joules, 350.0);
        assert!(r.sources[1].contains("NVML total-energy counter (gpu)"));
        let none = || {
            Err(crate::energy::EnergyError::NoZone {
                root: "/sys/class/powercap".into(),
            })
        };
        let alone = with_gpu_energy(none(), Ok(vec![gpu]), 2.0).0.unwrap();
        assert_eq!((alone.joules, alone.seconds), (250.0, 2.0));
        // Power samples only: mean power × time.
        let sampled = GpuTelemetry {
            power_w: Some(roofline_model::Stats::from_samples(&[100.0, 300.0]).unwrap()),
            ..Default::default()
        };
        let (p, _) = with_gpu_energy(none(), Ok(vec![sampled]), 3.0);
        assert_eq!(p.unwrap().joules, 600.0);
        let no_gpu = NvmlError::NoGpu("no NVML".into());
        let (none, note) = with_gpu_energy(Ok(cpu.clone()), Err(no_gpu), 2.0);
        assert_eq!(none.unwrap(), cpu);
        assert!(note.unwrap().contains("no NVML"));
    }

    #[test]
    fn throttle_names_skip_idle() {
        let r = ThrottleReasons::GPU_IDLE
            | ThrottleReasons::SW_POWER_CAP
            | ThrottleReasons::HW_THERMAL_SLOWDOWN;
        assert_eq!(
            throttle_names(r),
            vec!["SW_POWER_CAP", "HW_THERMAL_SLOWDOWN"]
        );
    }

    #[test]
    fn energy_from_the_counter_or_the_power_samples() {
        let mut t = GpuTelemetry {
            samples: 3,
            interval_ms: 100,
            sm_clock_mhz: None,
            memory_clock_mhz: None,
            power_w: Stats::from_samples(&[100.0, 200.0, 300.0]),
            temperature_c: None,
            throttle_reasons: Vec::new(),
            energy_j: Some(42.0),
        };
        assert_eq!(energy(&t, 10.0), Some((42.0, "NVML total-energy counter")));
        t.energy_j = None;
        let (j, src) = energy(&t, 10.0).unwrap();
        assert_eq!(j, 2000.0);
        assert!(src.contains("power samples"));
        t.power_w = None;
        assert_eq!(energy(&t, 10.0), None);
    }

    #[test]
    fn missing_library_is_an_error_not_a_panic() {
        assert!(open(Some("/nonexistent/libnvidia-ml.so.1")).is_err());
    }
}
