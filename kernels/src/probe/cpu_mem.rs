//! The CPU memory probe: a working-set sweep of the STREAM kernels, each level's ceiling read
//! off the plateau of its window, bounded by what the core's ports and line fills can move.

use super::cpu::{configs, human_bytes, pinned, CpuResult, Ctx};
use super::{ceiling, rate_stats};
use crate::cpu::isa::Isa;
use crate::cpu::stream::{self, Op, StreamKernel};
use crate::driver::{measure_threads, Measurement};
use crate::ProbeError;
use roofline_model::{
    CacheInfo, CeilingKind, Curve, CurvePoint, Level, On, Plateau, RoofId, Stats, TheoreticalPeak,
    Threads,
};

/// Working-set sizes of the memory sweep (all arrays of all threads together), bytes: from
/// 4 KiB by √2 (×2 when quick) to 4 × the last level (at least 512 MiB), that point included.
pub fn sweep_sizes(caches: &[CacheInfo], quick: bool) -> Vec<usize> {
    let llc = llc_total(caches).unwrap_or(0);
    let max = (4 * llc).max(512 << 20);
    let step: f64 = if quick { 2.0 } else { std::f64::consts::SQRT_2 };
    let mut v = Vec::new();
    let mut x = 4096.0f64;
    while x <= max as f64 * 1.0001 {
        let b = (x.round() as usize) / 4096 * 4096;
        if v.last() != Some(&b) {
            v.push(b);
        }
        x *= step;
    }
    // The largest point is 4 × LLC itself (or 512 MiB) even when the grid steps over it (an LLC
    // of 384 MiB: the grid's last point, 1.41 GiB, is short of 1.5 GiB, and the DRAM window
    // would hold no point at all).
    let top = max / 4096 * 4096;
    if v.last().is_some_and(|&b| b < top) {
        v.push(top);
    }
    v
}

/// The largest cache's capacity over all its instances, bytes.
fn llc_total(caches: &[CacheInfo]) -> Option<usize> {
    caches
        .iter()
        .map(|c| c.size_bytes as usize * c.instances.max(1))
        .max()
}

/// A cache level's capacity available to one of `threads` threads (one per physical core),
/// bytes: shared between the cores that share an instance, SMT siblings counted once (the
/// probe runs no thread on a sibling).
fn per_thread_capacity(cache: &CacheInfo, threads: usize) -> f64 {
    let sharing = cache.cores_sharing().min(threads.max(1));
    cache.size_bytes as f64 / sharing as f64
}

/// The level a per-thread working set lies clearly inside, if any. Windows: L1 from a quarter
/// to half its size (smaller sets time the loop's start and end, not the cache: 4 KiB read
/// 20% slower than 16 KiB); L(i) from twice L(i−1) to half L(i); DRAM from four times the last level (all threads)
/// and from half the sweep's largest working set `max_ws` (caches of the host of a virtual
/// machine, or victim caches, can still serve part of a set four times the reported LLC).
pub fn level_of(
    caches: &[CacheInfo],
    total_ws: usize,
    threads: usize,
    max_ws: usize,
) -> Option<Level> {
    let data: Vec<&CacheInfo> = {
        let mut v: Vec<&CacheInfo> = caches
            .iter()
            .filter(|c| c.cache_type != "Instruction")
            .collect();
        v.sort_by_key(|c| c.level);
        v
    };
    let per_thread = total_ws as f64 / threads.max(1) as f64;
    let mut prev: Option<f64> = None;
    for c in &data {
        let cap = per_thread_capacity(c, threads);
        let from = prev.map_or(0.25 * cap, |p| 2.0 * p);
        // 1% slack: working sets are rounded down to whole blocks of elements.
        if per_thread >= 0.99 * from && per_thread <= 0.5 * cap {
            return Level::cache(c.level);
        }
        prev = Some(cap);
    }
    let llc_total = data
        .last()
        .map(|c| c.size_bytes as f64 * c.instances.max(1) as f64)
        .unwrap_or(64e6);
    // 1% slack: working sets are rounded down to whole blocks of elements.
    (total_ws as f64 >= 0.99 * (4.0 * llc_total).max(max_ws as f64 / 2.0)).then_some(Level::Dram)
}

/// The most bytes one core moves per cycle, counted as STREAM counts them, for `op` at `level`
/// with `isa`'s vectors — an upper bound for every x86-64 and Arm core we know, so that a
/// measurement above it is wrong, not fast:
/// - the load and store ports: at most 4 loads (128 B) and 2 stores (64 B) of `isa`'s width
///   per cycle (Zen 5 and Intel's AVX-512 server cores: 2 × 64 B loads, 1 × 64 B store;
///   Golden Cove with AVX2: 3 × 32 B loads, 2 × 32 B stores; Neoverse V2: 3 × 16 B loads,
///   2 × 16 B stores); the portable kernels count as 128-bit;
/// - beyond L1, the line fills and evictions between L1 and L2: one 64-byte line per cycle
///   each way (every core listed; Zen 3's L2 fills 32 B per cycle, below the bound).
///
/// Returns (bytes per cycle, how the bound was made).
pub fn bytes_per_cycle_bound(op: Op, level: Level, isa: Isa) -> (f64, String) {
    let width = f64::from(isa.bits().max(128)) / 8.0;
    let (loads, stores) = ((4.0 * width).min(128.0), (2.0 * width).min(64.0));
    // Elements' reads and writes, 8 bytes each.
    let (r, w) = match op {
        Op::Read => (1.0, 0.0),
        Op::Write => (0.0, 1.0),
        Op::Copy => (1.0, 1.0),
        Op::Triad => (2.0, 1.0),
    };
    let counted = 8.0 * (r + w);
    // Cycles per element: the busier of the load and store ports, then of the fill and
    // eviction paths.
    let ports = f64::max(8.0 * r / loads, 8.0 * w / stores);
    let mut cycles = ports;
    let mut how = format!("ports: {loads:.0} B loaded and {stores:.0} B stored per cycle");
    if level != Level::L1 {
        let lines = f64::max(8.0 * r / 64.0, 8.0 * w / 64.0);
        if lines > cycles {
            cycles = lines;
        }
        how.push_str("; one 64-byte line per cycle each way beyond L1");
    }
    (counted / cycles, how)
}

/// The bytes-per-cycle bound of a cache level for `threads` cores at the run's highest clock
/// (memory beyond the caches has none here: its channels are not known).
fn level_bound(
    out: &CpuResult,
    op: Op,
    level: Level,
    isa: Isa,
    threads: usize,
) -> Option<TheoreticalPeak> {
    if level == Level::Dram {
        return None;
    }
    let clock = out.clock(threads)?;
    let (per_cycle, how) = bytes_per_cycle_bound(op, level, isa);
    Some(TheoreticalPeak {
        value: per_cycle * clock.max * threads as f64,
        unit: "B/s".into(),
        source: format!(
            "bytes-per-cycle bound: {threads} cores × {:.3} GHz (the run's highest clock) × {per_cycle:.0} B/cycle for {} ({how})",
            clock.max / 1e9,
            op.name()
        ),
        // The clock of the memory runs may lie a little above the clock runs' highest sample
        // (at least 2%, or as far as that sample lies above their median).
        uncertainty: ((clock.max - clock.median) / clock.max).max(0.02),
    })
}

/// One point of a level's window: working set, statistics, measurement, non-temporal stores.
struct Point {
    ws: usize,
    stats: Stats,
    m: Measurement,
    nt: bool,
}

pub(super) fn memory(ctx: &Ctx, out: &mut CpuResult) -> Result<(), ProbeError> {
    let mem_isa = Isa::current();
    let sizes = sweep_sizes(&ctx.cfg.caches, ctx.cfg.quick);
    let max_ws = sizes.last().copied().unwrap_or(0);
    let llc_total = llc_total(&ctx.cfg.caches).unwrap_or(32 << 20);
    for op in Op::ALL {
        for (suffix, cpus) in configs(ctx.cfg) {
            let threads = cpus.len();
            let mut points = Vec::new();
            let mut windows: Vec<(Level, Vec<Point>)> = Vec::new();
            for &ws in &sizes {
                ctx.progress.advance(&format!(
                    "memory {} {suffix} {}",
                    op.name(),
                    human_bytes(ws as f64)
                ));
                // Beyond the caches, non-temporal stores: no write-allocate, counted = moved.
                let nt = ws > llc_total;
                let per_thread = ws / threads;
                let m = measure_threads(&cpus, &ctx.plan, ctx.cancel, |_| {
                    StreamKernel::new(op, per_thread, nt)
                })?;
                let actual =
                    stream::elems_for(op, per_thread) * stream::bytes_per_elem(op) * threads;
                let Some(stats) = rate_stats(&m, CeilingKind::Memory) else {
                    continue;
                };
                let level = level_of(&ctx.cfg.caches, actual, threads, max_ws);
                points.push(CurvePoint {
                    x: actual as f64,
                    value: stats.max,
                    stats: stats.clone(),
                    level,
                });
                if let Some(l) = level {
                    let p = Point {
                        ws: actual,
                        stats,
                        m,
                        nt,
                    };
                    match windows.iter_mut().find(|w| w.0 == l) {
                        Some(w) => w.1.push(p),
                        None => windows.push((l, vec![p])),
                    }
                }
            }
            out.curves.push(Curve {
                id: format!("cpu/mem/sweep/{}/{suffix}", op.name()),
                x_label: "working set (all arrays, all threads)".into(),
                x_unit: "B".into(),
                unit: "B/s".into(),
                threads,
                points,
            });
            for (level, window) in windows {
                let bests: Vec<f64> = window.iter().map(|p| p.stats.max).collect();
                let Some((i, plateau)) = Plateau::of(&bests) else {
                    continue;
                };
                let p = &window[i];
                out.ceilings.push(level_ceiling(
                    out, op, level, suffix, threads, mem_isa, p, &window, plateau,
                ));
            }
        }
    }
    Ok(())
}

/// The ceiling of `level` from its window's median point `p`.
#[allow(clippy::too_many_arguments)]
fn level_ceiling(
    out: &CpuResult,
    op: Op,
    level: Level,
    suffix: Threads,
    threads: usize,
    isa: Isa,
    p: &Point,
    window: &[Point],
    plateau: Plateau,
) -> roofline_model::Ceiling {
    let (first, last) = (
        window.iter().map(|p| p.ws).min().unwrap_or(0),
        window.iter().map(|p| p.ws).max().unwrap_or(0),
    );
    let flatness = if plateau.flat() {
        format!("spread {:.1}%", 100.0 * plateau.spread)
    } else {
        format!(
            "NOT FLAT: spread {:.0}% > {:.0}%, points from {:.1} to {:.1} GB/s",
            100.0 * plateau.spread,
            100.0 * Plateau::FLAT,
            plateau.low / 1e9,
            plateau.high / 1e9
        )
    };
    let method = format!(
        "{} {}: the median of the best samples of {} working sets from {} to {} (the plateau; {flatness}), here {} ({} per thread), {}; bytes counted as STREAM counts them (reads + writes, no write-allocate){}; every pass checked (sums accumulated, triad's destination alternating); arrays at page offsets {:?} B; {} kernels ({}-bit)",
        op.name(),
        stream_formula(op),
        plateau.points,
        human_bytes(first as f64),
        human_bytes(last as f64),
        human_bytes(p.ws as f64),
        human_bytes(p.ws as f64 / threads as f64),
        pinned(threads),
        if p.nt { "; non-temporal stores" } else { "" },
        stream::OFFSETS,
        isa.name(),
        isa.bits()
    );
    let mut c = ceiling(
        RoofId::Memory {
            on: On::Cpu(suffix),
            level,
            op,
        },
        CeilingKind::Memory,
        "B/s",
        threads,
        p.stats.clone(),
        &p.m,
        method,
        level_bound(out, op, level, isa, threads),
    );
    c.level = Some(roofline_model::ceiling_id::Tier::Memory(level));
    c.isa = Some(isa.name().to_string());
    c.plateau = Some(plateau);
    c
}

fn stream_formula(op: Op) -> &'static str {
    match op {
        Op::Read => "(s += b[i], 8 B/element)",
        Op::Write => "(a[i] = q, 8 B/element)",
        Op::Copy => "(a[i] = b[i], 16 B/element)",
        Op::Triad => "(a[i] = b[i] + q·c[i], 24 B/element)",
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub fn caches() -> Vec<CacheInfo> {
        let c = |level, t: &str, kib: u64, shared, instances| CacheInfo {
            level,
            cache_type: t.into(),
            size_bytes: kib * 1024,
            shared_by_cpus: shared,
            shared_by_cores: shared,
            instances,
        };
        vec![
            c(1, "Data", 48, 1, 2),
            c(1, "Instruction", 32, 1, 2),
            c(2, "Unified", 1024, 1, 2),
            c(3, "Unified", 32768, 2, 1),
        ]
    }

    #[test]
    fn working_sets_map_to_levels() {
        let c = caches();
        let max = 512 << 20;
        assert_eq!(level_of(&c, 16 << 10, 1, max), Some(Level::L1));
        // Under a quarter of L1: the loop's overhead, not the cache.
        assert_eq!(level_of(&c, 8 << 10, 1, max), None);
        assert_eq!(level_of(&c, 12 << 10, 1, max), Some(Level::L1));
        assert_eq!(level_of(&c, 40 << 10, 1, max), None); // between L1/2 and 2·L1
        assert_eq!(level_of(&c, 256 << 10, 1, max), Some(Level::L2));
        assert_eq!(level_of(&c, 8 << 20, 1, max), Some(Level::L3));
        assert_eq!(level_of(&c, 20 << 20, 1, max), None);
        assert_eq!(level_of(&c, 512 << 20, 1, max), Some(Level::Dram));
        assert_eq!(level_of(&c, (256 << 20) - 1024, 1, max), Some(Level::Dram));
        // Four times the LLC but under half the sweep: not trusted as DRAM.
        assert_eq!(level_of(&c, 128 << 20, 1, max), None);
        assert_eq!(level_of(&c, 128 << 20, 1, 128 << 20), Some(Level::Dram));
        // Two threads: L1 and L2 are private, L3 is split.
        assert_eq!(level_of(&c, 32 << 10, 2, max), Some(Level::L1));
        assert_eq!(level_of(&c, 16 << 10, 2, max), None);
        assert_eq!(level_of(&c, 16 << 20, 2, max), Some(Level::L3));
        assert_eq!(level_of(&c, 24 << 20, 2, max), None);
    }

    /// SMT: each core's L1 and L2 are shared by its two hardware threads (shared_by_cpus 2),
    /// but the probe runs one thread per core, so each of its threads has a whole L1 and L2.
    /// Counting the siblings halved them: 40 KiB per thread fell out of L1's window and the L2
    /// window started at 48 KiB, where L1 still serves part of the set.
    #[test]
    fn smt_siblings_do_not_split_a_cores_caches() {
        let mut c = caches();
        for x in c.iter_mut().filter(|x| x.level <= 2) {
            x.shared_by_cpus = 2;
            x.shared_by_cores = 1;
        }
        c[3].shared_by_cpus = 4;
        let max = 512 << 20;
        assert_eq!(level_of(&c, 2 * (20 << 10), 2, max), Some(Level::L1));
        assert_eq!(level_of(&c, 2 * (64 << 10), 2, max), None);
        assert_eq!(level_of(&c, 2 * (256 << 10), 2, max), Some(Level::L2));
        // A file written before cores were recorded: the CPUs' count, as before.
        c[0].shared_by_cores = 0;
        assert_eq!(level_of(&c, 2 * (20 << 10), 2, max), None);
    }

    #[test]
    fn sweep_covers_4k_to_512m_and_four_times_the_llc() {
        let mut caches = caches();
        let s = sweep_sizes(&caches, true);
        assert_eq!(s[0], 4096);
        assert_eq!(*s.last().unwrap(), 512 << 20);
        let fine = sweep_sizes(&caches, false);
        assert!(fine.len() > s.len());
        caches[3].size_bytes = 256 << 20;
        assert_eq!(*sweep_sizes(&caches, false).last().unwrap(), 1 << 30);
        // A 384 MiB LLC: 4 × LLC (1.5 GiB) falls between the grid's points, and is added: the
        // DRAM window then holds a point.
        caches[3].size_bytes = 384 << 20;
        let s = sweep_sizes(&caches, false);
        assert_eq!(*s.last().unwrap(), 1536 << 20);
        assert!(s.windows(2).all(|w| w[0] < w[1]));
        let top = *s.last().unwrap();
        assert_eq!(level_of(&caches, top, 1, top), Some(Level::Dram));
    }

    /// A window's ceiling is its median point, and a window whose points lie more than 10%
    /// apart is not flat — the L2 read window (186, 190, 252 GB/s) read 252 as the
    /// best edge; its plateau is 190 and it is flagged.
    #[test]
    fn a_window_reports_its_median_and_flags_its_spread() {
        let (i, p) = Plateau::of(&[186.5e9, 190.2e9, 252.0e9]).unwrap();
        assert_eq!(i, 1);
        assert!(!p.flat());
        assert!((p.spread - (252.0 - 186.5) / 190.2).abs() < 1e-12);
        let (i, p) = Plateau::of(&[60e9, 47e9, 45e9]).unwrap();
        assert_eq!((i, p.low, p.high), (1, 45e9, 60e9));
        let (i, p) = Plateau::of(&[100.0, 104.0, 101.0, 99.0]).unwrap();
        assert_eq!(i, 2, "the upper median of an even count");
        assert!(p.flat());
        assert_eq!(Plateau::of(&[5.0]).unwrap().1.spread, 0.0);
        assert!(Plateau::of(&[]).is_none());
        assert!(Plateau::of(&[1.0, f64::NAN]).is_none());
    }

    /// The bound per op and level: AVX-512 L1 read is two 64-byte loads a cycle, triad is
    /// limited by its two loads (24 B per 16 B loaded: 192 B/cycle), write by one 64-byte store;
    /// beyond L1 a line a cycle bounds a read at 64 B/cycle. Measured figures of this project's
    /// own machine (Zen 5 at 4.1 GHz: L1 read 501 GB/s = 122 B/cycle, L2 read 252 GB/s = 61
    /// B/cycle) lie under it.
    #[test]
    fn the_bytes_per_cycle_bound_follows_the_ports_and_the_lines() {
        let b = |op, level, isa| bytes_per_cycle_bound(op, level, isa).0;
        assert_eq!(b(Op::Read, Level::L1, Isa::Avx512), 128.0);
        assert_eq!(b(Op::Triad, Level::L1, Isa::Avx512), 192.0);
        assert_eq!(b(Op::Write, Level::L1, Isa::Avx512), 64.0);
        assert_eq!(b(Op::Copy, Level::L1, Isa::Avx512), 128.0);
        assert_eq!(b(Op::Read, Level::L2, Isa::Avx512), 64.0);
        assert_eq!(b(Op::Triad, Level::L3, Isa::Avx512), 96.0);
        assert_eq!(b(Op::Read, Level::L1, Isa::Avx2), 128.0);
        assert_eq!(b(Op::Write, Level::L1, Isa::Avx2), 64.0);
        assert_eq!(b(Op::Read, Level::L1, Isa::Neon), 64.0);
        assert_eq!(b(Op::Read, Level::L1, Isa::Scalar), 64.0);
        assert!(501e9 / 4.1e9 < b(Op::Read, Level::L1, Isa::Avx512));
        assert!(252e9 / 4.1e9 < b(Op::Read, Level::L2, Isa::Avx512));
    }

    /// The bound becomes the memory ceiling's theoretical peak, and a value above it is
    /// flagged as a compute ceiling above its peak is; DRAM has none.
    #[test]
    fn a_level_above_its_bound_is_flagged() {
        let mut out = CpuResult::default();
        out.clock_t1 = Stats::from_samples(&[4.0e9, 4.1e9]);
        let peak = level_bound(&out, Op::Read, Level::L2, Isa::Avx512, 1).unwrap();
        assert_eq!(peak.value, 64.0 * 4.1e9);
        assert!(peak.source.contains("64 B/cycle"), "{}", peak.source);
        assert!(level_bound(&out, Op::Read, Level::Dram, Isa::Avx512, 1).is_none());
        let c = |v: f64| {
            roofline_model::Ceiling::measured(
                roofline_model::CeilingId::parse("cpu/mem/L2/read/t1").unwrap(),
                CeilingKind::Memory,
                "B/s",
                1,
                Stats::from_samples(&[v]).unwrap(),
                roofline_model::PerIteration {
                    ops: 0.0,
                    bytes: 1.0,
                },
                String::new(),
            )
            .with_peak(Some(peak.clone()))
        };
        assert!(!c(250e9).above_peak);
        assert!(c(300e9).above_peak, "300 GB/s is 73 B/cycle at 4.1 GHz");
    }
}
