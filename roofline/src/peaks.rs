//! The theoretical-peak database (`data/peaks.toml`, compiled in) and the CPU peak rule.

use crate::ModelError;
use serde::{Deserialize, Serialize};

/// The database text, as shipped in the repository.
pub const PEAKS_TOML: &str = include_str!("../data/peaks.toml");
/// The schema tag of the database.
pub const PEAKS_SCHEMA: &str = "roofline/peaks/v1";

/// One vendor figure.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Peak {
    /// `f64`, `f32`, `tf32`, `f16`, `bf16`, `fp8`, `int8`, `int4`.
    pub precision: String,
    /// `vector`, `matrix` or `packed`.
    pub engine: String,
    pub sparse: bool,
    pub value: f64,
    /// `FLOP/s` or `OP/s`.
    pub unit: String,
    /// True when the datasheet does not print the figure and it is computed (see `note`).
    #[serde(default)]
    pub derived: bool,
    #[serde(default)]
    pub note: Option<String>,
}

/// One accelerator.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Device {
    pub name: String,
    /// Substrings of the name the driver reports that identify this device.
    #[serde(rename = "match")]
    pub matches: Vec<String>,
    pub vendor: String,
    /// The clock the figures assume, MHz.
    pub clock_mhz: f64,
    pub memory_bytes: u64,
    /// B/s
    pub memory_bandwidth: f64,
    pub source: String,
    pub peaks: Vec<Peak>,
}

/// FMA units per core for one microarchitecture.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct FmaUnits {
    pub name: String,
    #[serde(default)]
    pub vendor: Option<String>,
    #[serde(default)]
    pub family: Option<u32>,
    /// Inclusive model ranges.
    #[serde(default)]
    pub models: Vec<[u32; 2]>,
    /// Full-width 512-bit FMAs per cycle per core.
    pub avx512: u32,
    /// 256-bit FMAs per cycle per core.
    pub avx2: u32,
    /// 128-bit NEON FMA pipes (aarch64 cores); 0 when the entry does not say.
    #[serde(default)]
    pub neon: u32,
    pub source: String,
}

/// The CPU rule: cores × clock × lanes × FMA units × 2.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CpuRule {
    pub formula: String,
    pub note: String,
    pub fma_units: Vec<FmaUnits>,
    pub default: FmaUnits,
}

/// The whole database.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct PeakDb {
    pub schema: String,
    pub cpu_rule: CpuRule,
    #[serde(rename = "device")]
    pub devices: Vec<Device>,
}

impl PeakDb {
    /// The database shipped with roofline.
    pub fn builtin() -> Result<PeakDb, ModelError> {
        PeakDb::parse(PEAKS_TOML)
    }

    pub fn parse(text: &str) -> Result<PeakDb, ModelError> {
        let db: PeakDb = toml::from_str(text).map_err(ModelError::PeaksToml)?;
        if db.schema != PEAKS_SCHEMA {
            return Err(ModelError::Schema {
                expected: PEAKS_SCHEMA.into(),
                found: format!("\"{}\"", db.schema),
            });
        }
        for d in &db.devices {
            for p in &d.peaks {
                let valid = p.value.is_finite()
                    && p.value > 0.0
                    && matches!(p.unit.as_str(), "FLOP/s" | "OP/s");
                if !valid {
                    return Err(ModelError::Peaks(format!(
                        "{}: {} {} has value {} {}; expected a positive FLOP/s or OP/s figure",
                        d.name, p.precision, p.engine, p.value, p.unit
                    )));
                }
            }
        }
        Ok(db)
    }

    /// The device whose match strings occur in the name the driver reports.
    pub fn device(&self, reported_name: &str) -> Option<&Device> {
        let name = reported_name.to_ascii_lowercase();
        self.devices.iter().find(|d| {
            d.matches
                .iter()
                .any(|m| name.contains(&m.to_ascii_lowercase()))
        })
    }

    /// The FMA-unit entry for a CPU.
    pub fn fma_units(&self, vendor: &str, family: u32, model: u32) -> &FmaUnits {
        self.cpu_rule
            .fma_units
            .iter()
            .find(|f| {
                f.vendor.as_deref() == Some(vendor)
                    && f.family == Some(family)
                    && f.models.iter().any(|[lo, hi]| (*lo..=*hi).contains(&model))
            })
            .unwrap_or(&self.cpu_rule.default)
    }
}

impl Device {
    /// The dense peak for a precision on one engine (`vector` or `matrix`).
    pub fn engine_peak(&self, precision: &str, engine: &str) -> Option<&Peak> {
        self.peaks
            .iter()
            .find(|p| p.precision == precision && p.engine == engine && !p.sparse)
    }

    /// The dense peak for a precision, the highest over engines.
    pub fn dense_peak(&self, precision: &str) -> Option<&Peak> {
        self.peaks
            .iter()
            .filter(|p| p.precision == precision && !p.sparse)
            .max_by(|a, b| a.value.total_cmp(&b.value))
    }
}

/// Element bits of a CPU precision and the FMA-equivalents one lane does per instruction.
fn lane_factors(precision: &str) -> Option<(u32, f64)> {
    match precision {
        "f64" => Some((64, 1.0)),
        // f16 has no native FMA on most x86 cores: it is converted and computed in f32.
        "f32" | "f16" => Some((32, 1.0)),
        // vdpbf16ps: per 32-bit lane, two bf16 products accumulated (2 FMAs).
        "bf16" => Some((32, 2.0)),
        // vpdpbusd: per 32-bit lane, four u8×i8 products accumulated (4 multiply-adds).
        "int8" => Some((32, 4.0)),
        _ => None,
    }
}

/// The CPU rule evaluated: cores × clock × lanes × FMA units × 2, with the factors written out.
pub fn cpu_peak(
    cores: usize,
    clock_hz: f64,
    vector_bits: u32,
    fma_units: u32,
    precision: &str,
) -> Option<(f64, String)> {
    let (elem_bits, per_lane) = lane_factors(precision)?;
    if fma_units == 0 || vector_bits < elem_bits {
        return None;
    }
    let lanes = (vector_bits / elem_bits) as f64;
    let value = cores as f64 * clock_hz * lanes * per_lane * fma_units as f64 * 2.0;
    let dot = if per_lane > 1.0 {
        format!(" × {per_lane} products per lane")
    } else {
        String::new()
    };
    let text = format!(
        "CPU rule: {cores} cores × {:.3} GHz (measured) × {lanes} lanes ({vector_bits}-bit / {elem_bits}-bit){dot} × {fma_units} FMA units × 2",
        clock_hz / 1e9
    );
    Some((value, text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtin_database_parses_and_covers_the_required_devices() {
        let db = PeakDb::builtin().unwrap();
        for name in [
            "Tesla V100-SXM2-32GB",
            "NVIDIA A100-SXM4-80GB",
            "NVIDIA A100-PCIE-80GB",
            "NVIDIA H100 80GB HBM3",
            "NVIDIA H100 PCIe",
            "NVIDIA H200",
            "NVIDIA L40S",
            "Tesla T4",
            "AMD Instinct MI250X",
            "AMD Instinct MI300X",
        ] {
            let d = db.device(name).unwrap_or_else(|| panic!("{name} missing"));
            assert!(
                d.dense_peak("f32").is_some() || d.dense_peak("f16").is_some(),
                "{name}"
            );
            assert!(
                d.source.starts_with("https://"),
                "{name} has no public source"
            );
            assert!(d.clock_mhz > 500.0);
        }
        let h100 = db.device("NVIDIA H100 80GB HBM3").unwrap();
        assert_eq!(h100.name, "NVIDIA H100 SXM5");
        assert_eq!(h100.dense_peak("bf16").unwrap().value, 989.5e12);
        // Sparse figures are exactly twice the dense ones wherever both exist.
        for d in &db.devices {
            for p in d.peaks.iter().filter(|p| p.sparse) {
                let dense = d
                    .peaks
                    .iter()
                    .find(|q| !q.sparse && q.precision == p.precision && q.engine == p.engine)
                    .unwrap();
                let r = p.value / dense.value;
                assert!(
                    (r - 2.0).abs() < 0.01,
                    "{} {} sparse/dense = {r}",
                    d.name,
                    p.precision
                );
            }
        }
    }

    #[test]
    fn cpu_rule_matches_known_cores() {
        let db = PeakDb::builtin().unwrap();
        assert_eq!(db.fma_units("AuthenticAMD", 26, 2).avx512, 2);
        // Zen 5 mobile (Strix Point 0x24, Krackan 0x60): the 256-bit datapath; Granite Ridge
        // (0x44) and Strix Halo (0x70) the full 512-bit one.
        assert_eq!(db.fma_units("AuthenticAMD", 26, 0x24).avx512, 1);
        assert_eq!(db.fma_units("AuthenticAMD", 26, 0x60).avx512, 1);
        assert_eq!(db.fma_units("AuthenticAMD", 26, 0x44).avx512, 2);
        assert_eq!(db.fma_units("AuthenticAMD", 26, 0x70).avx512, 2);
        // An unlisted core assumes one 512-bit unit (client cores), two 256-bit ones; Cannon
        // Lake (102) is listed with one, Xeon Phi (87) with two.
        assert_eq!(db.cpu_rule.default.avx512, 1);
        assert_eq!(db.cpu_rule.default.avx2, 2);
        assert_eq!(db.fma_units("GenuineIntel", 6, 102).avx512, 1);
        assert_eq!(db.fma_units("GenuineIntel", 6, 87).avx512, 2);
        assert_eq!(db.fma_units("AuthenticAMD", 25, 17).avx512, 1);
        // Zen 1 (family 23, e.g. model 1): one 256-bit FMA per cycle, not two; Zen 2 two.
        assert_eq!(db.fma_units("AuthenticAMD", 23, 1).avx2, 1);
        assert_eq!(db.fma_units("AuthenticAMD", 23, 49).avx2, 2);
        // Ice Lake client (model 126): one 512-bit FMA unit; a Xeon (model 106) two.
        assert_eq!(db.fma_units("GenuineIntel", 6, 126).avx512, 1);
        assert_eq!(db.fma_units("GenuineIntel", 6, 106).avx512, 2);
        // Grace and Graviton4 (Neoverse V2), Graviton3 (V1), Graviton2 (N1).
        assert_eq!(db.fma_units("ARM", 8, 0xd4f).neon, 4);
        assert_eq!(db.fma_units("ARM", 8, 0xd40).neon, 4);
        assert_eq!(db.fma_units("ARM", 8, 0xd0c).neon, 2);
        assert_eq!(db.cpu_rule.default.neon, 0);
        // One Grace core at 3.1 GHz: 2 f64 lanes × 4 pipes × 2 = 16 FLOP per cycle.
        let (v, _) = cpu_peak(1, 3.1e9, 128, 4, "f64").unwrap();
        assert!((v - 49.6e9).abs() < 1.0, "{v}");
        assert_eq!(
            db.fma_units("SomeVendor", 1, 1).name,
            db.cpu_rule.default.name
        );
        // One Zen 5 core at 4 GHz: 16 f32 lanes × 2 units × 2 = 64 FLOP/cycle = 256 GFLOP/s.
        let (v, text) = cpu_peak(1, 4e9, 512, 2, "f32").unwrap();
        assert_eq!(v, 256e9);
        assert!(text.contains("16 lanes"));
        assert_eq!(cpu_peak(2, 4e9, 512, 2, "f64").unwrap().0, 256e9);
        assert_eq!(cpu_peak(1, 4e9, 512, 2, "bf16").unwrap().0, 512e9);
        assert_eq!(cpu_peak(1, 4e9, 512, 2, "int8").unwrap().0, 1024e9);
        assert!(cpu_peak(1, 4e9, 512, 0, "f32").is_none());
        assert!(cpu_peak(1, 4e9, 512, 2, "f8").is_none());
    }

    #[test]
    fn rejects_bad_databases() {
        assert!(PeakDb::parse("schema = \"other\"").is_err());
        let bad = PEAKS_TOML.replacen("value = 7.8e12", "value = -1.0", 1);
        assert!(PeakDb::parse(&bad).is_err());
    }
}
