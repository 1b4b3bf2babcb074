//! What watches hardware: the system inventory that goes into every result's provenance (CPU
//! model, topology, caches, OS, kernel, host), NVML, CPU energy counters, and timeline spans.

pub mod energy;
pub mod load;
pub mod nvml;
pub mod provenance;
pub mod timeline;

use roofline_model::{CacheInfo, CpuInfo};
use std::collections::BTreeSet;
use std::fs;
use std::path::Path;

/// The fields of /proc/cpuinfo's first processor block that matter here.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CpuIdent {
    pub vendor: String,
    pub model_name: String,
    pub family: u32,
    pub model: u32,
    pub stepping: u32,
    pub mhz: Option<f64>,
    pub flags: BTreeSet<String>,
}

/// Parses /proc/cpuinfo text (first processor block).
pub fn parse_cpuinfo(text: &str) -> CpuIdent {
    let mut id = CpuIdent::default();
    for line in text.lines() {
        if line.trim().is_empty() && !id.vendor.is_empty() {
            break;
        }
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let (k, v) = (k.trim(), v.trim());
        match k {
            "vendor_id" => id.vendor = v.to_string(),
            "model name" => id.model_name = v.to_string(),
            "cpu family" => id.family = v.parse().unwrap_or(0),
            "model" => id.model = v.parse().unwrap_or(0),
            "stepping" => id.stepping = v.parse().unwrap_or(0),
            "cpu MHz" => id.mhz = v.parse().ok(),
            "flags" => id.flags = v.split_whitespace().map(String::from).collect(),
            // aarch64: the implementer (0x41 Arm Ltd, whose Neoverse cores Grace and Graviton
            // use) as the vendor, the architecture as the family, the part as the model.
            "CPU implementer" => id.vendor = arm_implementer(v),
            "CPU architecture" => id.family = v.parse().unwrap_or(0),
            "CPU part" => {
                id.model = u32::from_str_radix(v.trim_start_matches("0x"), 16).unwrap_or(0)
            }
            "Features" => id.flags = v.split_whitespace().map(String::from).collect(),
            _ => {}
        }
    }
    if id.model_name.is_empty() && id.vendor == "ARM" {
        id.model_name = arm_part_name(id.model)
            .map(String::from)
            .unwrap_or_else(|| format!("Arm part {:#x}", id.model));
    }
    id
}

/// The vendor of an aarch64 `CPU implementer` code.
fn arm_implementer(code: &str) -> String {
    match code {
        "0x41" => "ARM".into(),
        "0x4e" => "NVIDIA".into(),
        "0x61" => "Apple".into(),
        "0xc0" => "Ampere".into(),
        other => format!("implementer {other}"),
    }
}

/// The name of an Arm Ltd core by its `CPU part`.
fn arm_part_name(part: u32) -> Option<&'static str> {
    Some(match part {
        0xd0c => "Arm Neoverse N1",
        0xd40 => "Arm Neoverse V1",
        0xd49 => "Arm Neoverse N2",
        0xd4f => "Arm Neoverse V2",
        0xd84 => "Arm Neoverse V3",
        _ => return None,
    })
}

/// Parses sizes like `48K`, `1024K`, `32M`.
pub fn parse_size(s: &str) -> Option<u64> {
    let s = s.trim();
    let (num, mult) = match s.chars().last()? {
        'K' | 'k' => (&s[..s.len() - 1], 1024),
        'M' | 'm' => (&s[..s.len() - 1], 1024 * 1024),
        'G' | 'g' => (&s[..s.len() - 1], 1024 * 1024 * 1024),
        _ => (s, 1),
    };
    num.trim().parse::<u64>().ok().map(|n| n * mult)
}

/// Every CPU this process may be given on its node: the cgroup's cpuset, else every online
/// CPU (empty when neither can be read).
pub fn node_cpus() -> Vec<usize> {
    [
        "/sys/fs/cgroup/cpuset.cpus.effective",
        "/sys/devices/system/cpu/online",
    ]
    .iter()
    .find_map(|p| fs::read_to_string(p).ok().filter(|s| !s.trim().is_empty()))
    .map(|s| parse_cpu_list(&s))
    .unwrap_or_default()
}

/// Parses CPU lists like `0-3,8,10-11`.
pub fn parse_cpu_list(s: &str) -> Vec<usize> {
    let mut v = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                if let (Ok(a), Ok(b)) = (a.trim().parse::<usize>(), b.trim().parse::<usize>()) {
                    v.extend(a..=b);
                }
            }
            None => {
                if let Ok(a) = part.trim().parse() {
                    v.push(a);
                }
            }
        }
    }
    v
}

fn read(p: &Path) -> Option<String> {
    fs::read_to_string(p).ok().map(|s| s.trim().to_string())
}

/// The caches of the machine from sysfs (`/sys/devices/system/cpu/cpu*/cache/index*`),
/// one entry per distinct (level, type), with the number of instances.
pub fn caches_from_sysfs(root: &Path) -> Vec<CacheInfo> {
    let mut found: Vec<(CacheInfo, BTreeSet<String>)> = Vec::new();
    let Ok(cpus) = fs::read_dir(root) else {
        return Vec::new();
    };
    for cpu in cpus.flatten() {
        let name = cpu.file_name().to_string_lossy().into_owned();
        if !(name.starts_with("cpu")
            && name[3..].chars().all(|c| c.is_ascii_digit())
            && name.len() > 3)
        {
            continue;
        }
        let Ok(indices) = fs::read_dir(cpu.path().join("cache")) else {
            continue;
        };
        for idx in indices.flatten() {
            let p = idx.path();
            if !idx.file_name().to_string_lossy().starts_with("index") {
                continue;
            }
            let (Some(level), Some(ty), Some(size)) = (
                read(&p.join("level")).and_then(|s| s.parse::<u32>().ok()),
                read(&p.join("type")),
                read(&p.join("size")).and_then(|s| parse_size(&s)),
            ) else {
                continue;
            };
            let shared = read(&p.join("shared_cpu_list")).unwrap_or_default();
            let cpus = parse_cpu_list(&shared);
            let sharing = cpus.len().max(1);
            // SMT siblings are one core: count distinct (package, core) pairs; without topology
            // files, every CPU is a core.
            let cores: BTreeSet<(u32, u32)> = cpus
                .iter()
                .map(|&c| core_of(root, c).unwrap_or((u32::MAX, c as u32)))
                .collect();
            match found
                .iter_mut()
                .find(|(c, _)| c.level == level && c.cache_type == ty)
            {
                Some((_, sets)) => {
                    sets.insert(shared);
                }
                None => found.push((
                    CacheInfo {
                        level,
                        cache_type: ty,
                        size_bytes: size,
                        shared_by_cpus: sharing,
                        shared_by_cores: cores.len().max(1),
                        instances: 0,
                    },
                    BTreeSet::from([shared]),
                )),
            }
        }
    }
    let mut out: Vec<CacheInfo> = found
        .into_iter()
        .map(|(mut c, sets)| {
            c.instances = sets.len();
            c
        })
        .collect();
    out.sort_by(|a, b| (a.level, &a.cache_type).cmp(&(b.level, &b.cache_type)));
    out
}

/// (package, core) of a logical CPU from sysfs topology.
fn core_of(root: &Path, cpu: usize) -> Option<(u32, u32)> {
    let t = root.join(format!("cpu{cpu}/topology"));
    let pkg = read(&t.join("physical_package_id"))?.parse().ok()?;
    let core = read(&t.join("core_id"))?.parse().ok()?;
    Some((pkg, core))
}

/// From the CPUs this process may use, the first logical CPU of every physical core.
/// Without topology information every allowed CPU counts as a core.
pub fn one_cpu_per_core(root: &Path, allowed: &[usize]) -> Vec<usize> {
    let mut seen = BTreeSet::new();
    let mut out = Vec::new();
    for &c in allowed {
        match core_of(root, c) {
            Some(k) => {
                if seen.insert(k) {
                    out.push(c);
                }
            }
            None => out.push(c),
        }
    }
    out
}

/// The sysfs directory of CPUs.
pub const SYSFS_CPU: &str = "/sys/devices/system/cpu";

/// The CPU inventory from its identity (see [`cpu_ident`]); the SIMD level, features and
/// measured clocks are left empty for the probe to fill.
pub fn cpu_info(id: &CpuIdent, cores: usize) -> CpuInfo {
    let root = Path::new(SYSFS_CPU);
    let logical = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let mut packages = BTreeSet::new();
    for c in 0..logical {
        if let Some((p, _)) = core_of(root, c) {
            packages.insert(p);
        }
    }
    CpuInfo {
        shared_cores: None,
        vendor: id.vendor.clone(),
        model_name: id.model_name.clone(),
        family: id.family,
        model: id.model,
        stepping: id.stepping,
        sockets: packages.len().max(1),
        cores,
        logical_cpus: logical,
        features: Vec::new(),
        simd: String::new(),
        caches: caches_from_sysfs(root),
        cpuinfo_mhz: id.mhz,
        measured_clock_hz_t1: None,
        measured_clock_hz_all: None,
    }
}

/// The CPU identity alone (vendor, family, model) for the peak rule.
pub fn cpu_ident() -> CpuIdent {
    parse_cpuinfo(&fs::read_to_string("/proc/cpuinfo").unwrap_or_default())
}

/// Physical memory (MemTotal of /proc/meminfo), bytes; 0 where unknown.
pub fn memory_bytes() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

/// Bytes in binary units, one decimal (`23.4 GiB`, `5.5 PiB`).
pub fn binary_bytes(b: f64) -> String {
    let units = ["bytes", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"];
    let mut v = b;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < units.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{v:.0} bytes")
    } else {
        format!("{v:.1} {}", units[i])
    }
}

/// Work that cannot fit in this machine's memory, refused before anything is allocated:
/// `what` needs at least `needed` bytes (a lower bound: a refusal is never wrong), said
/// against what the machine has. Where the machine's memory is unknown, nothing is refused.
pub fn fits_in_memory(needed: f64, what: &str) -> Result<(), String> {
    let have = memory_bytes();
    if have > 0 && needed > have as f64 {
        return Err(format!(
            "{what} needs at least {} of memory, and this machine has {}",
            binary_bytes(needed),
            binary_bytes(have as f64)
        ));
    }
    Ok(())
}

/// Host name.
pub fn hostname() -> String {
    read(Path::new("/proc/sys/kernel/hostname"))
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into())
}

/// `PRETTY_NAME` of /etc/os-release, else the OS family.
pub fn os_name() -> String {
    fs::read_to_string("/etc/os-release")
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("PRETTY_NAME=")
                    .map(|v| v.trim_matches('"').to_string())
            })
        })
        .unwrap_or_else(|| std::env::consts::OS.to_string())
}

/// The kernel release (`uname -r`).
pub fn kernel_release() -> String {
    read(Path::new("/proc/sys/kernel/osrelease")).unwrap_or_else(|| "unknown".into())
}

/// Now, UTC, RFC 3339 (seconds).
pub fn now_utc() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    rfc3339(secs)
}

/// Seconds since the epoch as RFC 3339 UTC.
pub fn rfc3339(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil from days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_is_said_in_binary_units_and_refused_only_past_the_machine() {
        assert_eq!(binary_bytes(512.0), "512 bytes");
        assert_eq!(binary_bytes(1536.0), "1.5 KiB");
        assert_eq!(binary_bytes(60_211_200_000_000.0), "54.8 TiB");
        if memory_bytes() > 0 {
            assert!(fits_in_memory(1024.0, "a kibibyte").is_ok());
            let e = fits_in_memory(1e18, "--batch 100000000").unwrap_err();
            assert!(
                e.starts_with(
                    "--batch 100000000 needs at least 888.2 PiB of memory, and this machine has "
                ),
                "{e}"
            );
        }
    }

    /// An aarch64 /proc/cpuinfo (NVIDIA Grace, Neoverse V2): implementer, architecture and part
    /// stand for vendor, family and model; Features are the flags.
    #[test]
    fn arm_cpuinfo_names_the_core() {
        let text = "processor\t: 0\nBogoMIPS\t: 2000.00\nFeatures\t: fp asimd evtstrm sve sve2 bf16\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x0\nCPU part\t: 0xd4f\nCPU revision\t: 0\n\nprocessor\t: 1\n";
        let id = parse_cpuinfo(text);
        assert_eq!((id.vendor.as_str(), id.family, id.model), ("ARM", 8, 0xd4f));
        assert_eq!(id.model_name, "Arm Neoverse V2");
        assert!(id.flags.iter().any(|f| f == "asimd"));
    }

    #[test]
    fn parses_cpuinfo() {
        let text = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\nmodel name\t: AMD EPYC\nstepping\t: 1\ncpu MHz\t\t: 2600.000\nflags\t\t: fpu avx512f fma\n\nprocessor\t: 1\nvendor_id\t: Other\n";
        let id = parse_cpuinfo(text);
        assert_eq!(
            (id.vendor.as_str(), id.family, id.model, id.stepping),
            ("AuthenticAMD", 26, 2, 1)
        );
        assert_eq!(id.model_name, "AMD EPYC");
        assert_eq!(id.mhz, Some(2600.0));
        assert!(id.flags.contains("avx512f"));
    }

    #[test]
    fn parses_sizes_and_lists() {
        assert_eq!(parse_size("48K"), Some(48 * 1024));
        assert_eq!(parse_size("32M"), Some(32 << 20));
        assert_eq!(parse_size("512"), Some(512));
        assert_eq!(parse_size("x"), None);
        assert_eq!(parse_cpu_list("0-3,8,10-11"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("0-3,8,10-11\n"), vec![0, 1, 2, 3, 8, 10, 11]);
        assert_eq!(parse_cpu_list("5"), vec![5]);
        assert_eq!(parse_cpu_list(""), Vec::<usize>::new());
    }

    #[test]
    fn reads_a_fake_sysfs_tree() {
        let root = std::env::temp_dir().join(format!("roofline-sysfs-{}", std::process::id()));
        for cpu in 0..4 {
            let idx = |i: usize, level: u32, ty: &str, size: &str, shared: &str| {
                let p = root.join(format!("cpu{cpu}/cache/index{i}"));
                fs::create_dir_all(&p).unwrap();
                fs::write(p.join("level"), level.to_string()).unwrap();
                fs::write(p.join("type"), ty).unwrap();
                fs::write(p.join("size"), size).unwrap();
                fs::write(p.join("shared_cpu_list"), shared).unwrap();
            };
            // Two cores with two hardware threads each; one L3.
            let core = cpu / 2;
            let pair = format!("{}-{}", 2 * core, 2 * core + 1);
            idx(0, 1, "Data", "32K", &pair);
            idx(1, 2, "Unified", "1024K", &pair);
            idx(2, 3, "Unified", "16M", "0-3");
            let t = root.join(format!("cpu{cpu}/topology"));
            fs::create_dir_all(&t).unwrap();
            fs::write(t.join("physical_package_id"), "0").unwrap();
            fs::write(t.join("core_id"), core.to_string()).unwrap();
        }
        let caches = caches_from_sysfs(&root);
        assert_eq!(caches.len(), 3);
        assert_eq!(
            (
                caches[0].size_bytes,
                caches[0].shared_by_cpus,
                caches[0].instances
            ),
            (32768, 2, 2)
        );
        // The two hardware threads of a core are one core: a probe's one-thread-per-core run
        // has each L1 and L2 to itself, and all of its threads share the L3.
        assert_eq!(caches[0].shared_by_cores, 1);
        assert_eq!(caches[0].cores_sharing(), 1);
        assert_eq!(caches[1].cores_sharing(), 1);
        assert_eq!(caches[2].cores_sharing(), 2);
        assert_eq!(
            (
                caches[2].size_bytes,
                caches[2].shared_by_cpus,
                caches[2].instances
            ),
            (16 << 20, 4, 1)
        );
        assert_eq!(one_cpu_per_core(&root, &[0, 1, 2, 3]), vec![0, 2]);
        assert_eq!(one_cpu_per_core(&root, &[1, 3, 9]), vec![1, 3, 9]);
        fs::remove_dir_all(&root).unwrap();
    }

    #[test]
    fn formats_time() {
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339(951_782_400), "2000-02-29T00:00:00Z");
        assert_eq!(rfc3339(1_795_219_200 + 3661), "2026-11-21T01:01:01Z");
    }
}
