//! Memory of one GPU: the working-set sweep (read, write, copy, triad → L2 and HBM plateaus),
//! every word checked on the GPU, and the ERT FLOPs-per-element sweep.

use super::*;
use roofline_model::Plateau;

// ---------------------------------------------------------------------------------------------
// Memory: working-set sweep

pub(super) const MEM_BLOCK: u32 = 256;
pub(super) const MEM_OPS: [MemOp; 4] = MemOp::ALL;

/// pattern(i, seed) of stream.cu: small integers as f32 bits.
pub(super) fn pattern(i: u64, seed: u32) -> u32 {
    (((i as u32).wrapping_mul(7).wrapping_add(seed) & 1023) as f32).to_bits()
}

/// Wrapping sum of pattern(w, seed) for w < words (periodic in w with period 1024).
pub(super) fn pattern_sum(words: u64, seed: u32) -> u32 {
    let period: u32 = (0..1024u64).fold(0u32, |s, w| s.wrapping_add(pattern(w, seed)));
    let full = words / 1024;
    let mut s = period.wrapping_mul(full as u32);
    for w in full * 1024..words {
        s = s.wrapping_add(pattern(w, seed));
    }
    s
}

pub(super) struct MemBufs {
    a: DevBuf,
    b: DevBuf,
    c: DevBuf,
    sums: DevBuf,
    bad: DevBuf,
    /// Capacity of each buffer in 16-byte words.
    words16: u64,
}

pub(super) fn mem_sizes(ctx: &Ctx, gpu: &Gpu) -> Result<Vec<u64>, CudaError> {
    gpu.bind()?;
    let (free, _) = check_mem_info()?;
    let cap = (free as u64 / 4).min(4 << 30);
    let top = match ctx.mode {
        Mode::Check => 16 << 20,
        _ => (8 * gpu.l2_bytes).max(1 << 30).min(cap),
    };
    let step = if ctx.mode == Mode::Full { 2 } else { 4 };
    let mut sizes = Vec::new();
    let mut s: u64 = 1 << 20;
    while s <= top {
        sizes.push(s);
        s *= step;
    }
    if sizes.is_empty() {
        return Err(CudaError::Unsupported(format!(
            "only {free} bytes of GPU memory free"
        )));
    }
    Ok(sizes)
}

pub(super) fn check_mem_info() -> Result<(usize, usize), CudaError> {
    device::check("cuMemGetInfo", cu::mem_get_info())
}

pub(super) fn mem_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let sizes = match mem_sizes(ctx, gpu) {
        Ok(s) => s,
        Err(e) => return ctx.checked(gpu.ordinal, "stream", Err(e)),
    };
    let max = *sizes.last().unwrap_or(&(1 << 20));
    let grid = gpu.grid_for(MEM_BLOCK, gpu.max_threads_per_sm);
    let bufs = MemBufs {
        a: gpu.alloc(max as usize)?,
        b: gpu.alloc(max as usize)?,
        c: gpu.alloc(max as usize)?,
        sums: gpu.alloc((grid * MEM_BLOCK) as usize * 4)?,
        bad: gpu.alloc(8)?,
        words16: max / 16,
    };
    let init = gpu.function("stream_init")?;
    for (buf, seed) in [(&bufs.b, 1u32), (&bufs.c, 2u32), (&bufs.a, 3u32)] {
        let n = bufs.words16;
        unsafe {
            gpu.launch(
                init,
                grid,
                MEM_BLOCK,
                &mut [arg(&buf.ptr), arg(&n), arg(&seed)],
            )
        }?;
    }
    gpu.sync()?;
    let l2 = gpu.l2_bytes;
    for mem_op in MEM_OPS {
        let op = mem_op;
        let mut points = Vec::new();
        let mut worst: Option<String> = None;
        for &size in &sizes {
            ctx.cancelled()?;
            match mem_point(ctx, gpu, &bufs, op, size, grid) {
                Ok((rates, size)) => {
                    if let Some(stats) = Stats::from_samples(&rates) {
                        let level = if size * 2 <= l2 {
                            Some(Level::L2)
                        } else if size >= 4 * l2 {
                            Some(Level::Hbm)
                        } else {
                            None
                        };
                        points.push(CurvePoint {
                            x: size as f64,
                            value: stats.max,
                            stats,
                            level,
                        });
                    }
                }
                Err(e) => {
                    worst = Some(e.to_string());
                    ctx.checked(
                        gpu.ordinal,
                        &format!(
                            "stream_{op} {}",
                            crate::probe::cpu::human_bytes(size as f64)
                        ),
                        Err(e),
                    )?;
                }
            }
        }
        if worst.is_none() {
            ctx.checked(
                gpu.ordinal,
                &format!("stream_{op}"),
                Ok(format!("{} sizes checked", sizes.len())),
            )?;
        }
        for level in [Level::L2, Level::Hbm] {
            // The level's ceiling is its window's median point (each point its best sample),
            // as on the CPU: not the window's best edge; the window's spread is kept.
            let window: Vec<&CurvePoint> = points
                .iter()
                .filter(|p| {
                    p.level == Some(level) && (level != Level::L2 || p.x >= (2 << 20) as f64)
                })
                .collect();
            let values: Vec<f64> = window.iter().map(|p| p.value).collect();
            if let Some((i, plateau)) = Plateau::of(&values) {
                let p = window[i];
                let peak = if level == Level::Hbm {
                    ctx.memory_peak(gpu)
                } else {
                    None
                };
                let samples = p.stats.values.clone();
                let roof = RoofId::Memory {
                    on: On::Gpu(gpu.ordinal),
                    level,
                    op: mem_op,
                };
                ctx.push(
                    roof,
                    CeilingKind::Memory,
                    "B/s",
                    &samples,
                    PerIteration { ops: 0.0, bytes: p.x },
                    format!(
                        "NVRTC kernel stream_{op}: 16-byte ld.global.cg/st.global, {grid} blocks × {MEM_BLOCK} threads, grid-stride; the median of {} working sets of the {level} plateau ({}; spread {:.1}%{}), here {}, repeated in-kernel so a sample lasts ≥ {:.0} ms; bytes counted: {}; every word checked on the GPU",
                        plateau.points,
                        if level == Level::L2 { format!("working sets ≤ half the {} L2", crate::probe::cpu::human_bytes(l2 as f64)) } else { format!("working sets ≥ 4× the L2, {} device memory", crate::probe::cpu::human_bytes(gpu.memory_bytes as f64)) },
                        100.0 * plateau.spread,
                        if plateau.flat() { "" } else { ": NOT FLAT" },
                        crate::probe::cpu::human_bytes(p.x),
                        ctx.mode.sample_seconds() * 1e3,
                        stream_counted(op)
                    ),
                    peak,
                    None,
                );
                let id = roof.to_string();
                if let Some(c) = ctx.out.ceilings.last_mut().filter(|c| c.id == id) {
                    c.plateau = Some(plateau);
                }
            }
        }
        if ctx.mode != Mode::Check {
            ctx.out.curves.push(Curve {
                id: format!("gpu{}/mem/sweep/{op}", gpu.ordinal),
                x_label: "working set (all arrays)".into(),
                x_unit: "B".into(),
                unit: "B/s".into(),
                threads: 1,
                points,
            });
        }
    }
    Ok(())
}

/// The arrays `op` touches (its working set is their sum).
pub(super) fn stream_factor(op: MemOp) -> f64 {
    op.arrays() as f64
}

pub(super) fn stream_counted(op: MemOp) -> &'static str {
    match op {
        MemOp::Read => "one read per word",
        MemOp::Write => "one write per word",
        MemOp::Copy => "a read and a write per word",
        MemOp::Triad => "two reads and a write per word",
    }
}

/// Measures `op` over a working set of `size` bytes (all its arrays together); returns B/s
/// samples after checking the result, and the working set actually used.
pub(super) fn mem_point(
    ctx: &Ctx,
    gpu: &mut Gpu,
    bufs: &MemBufs,
    op: MemOp,
    size: u64,
    grid: u32,
) -> Result<(Vec<f64>, u64), CudaError> {
    // `size` is the whole working set (all arrays), as in the CPU sweep: each array gets its share.
    let n: u64 = (size as f64 / stream_factor(op)) as u64 / 16;
    let size = n * 16; // bytes per array
    if n > bufs.words16 {
        return Err(CudaError::Check(
            "working set larger than the buffers".into(),
        ));
    }
    let f = gpu.function(&format!("stream_{op}"))?;
    let chk = gpu.function("stream_check")?;
    let per_pass = size as f64 * stream_factor(op);
    // A first guess of passes per launch from the bytes (at least 64 MB moved), then the
    // calibration below sets them so that one timed sample lasts the mode's sample time
    // (5 ms quick, 20 ms full): long against the launch and event overheads (a few µs) at
    // every working-set size, L2-resident ones included.
    let guess: i32 = if ctx.mode == Mode::Check {
        1
    } else {
        ((64e6 / per_pass).ceil() as i32).clamp(1, 1 << 16)
    };
    let value: u32 = 0x3F80_0000 ^ (size as u32);
    let s: f32 = 2.0;
    let launch_reps = |gpu: &Gpu, reps: i32| -> Result<(), CudaError> {
        match op {
            MemOp::Read => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&bufs.sums.ptr), arg(&bufs.b.ptr), arg(&n), arg(&reps)],
                )
            },
            MemOp::Write => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&bufs.a.ptr), arg(&n), arg(&value), arg(&reps)],
                )
            },
            MemOp::Copy => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&bufs.a.ptr), arg(&bufs.b.ptr), arg(&n), arg(&reps)],
                )
            },
            MemOp::Triad => unsafe {
                gpu.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [
                        arg(&bufs.a.ptr),
                        arg(&bufs.b.ptr),
                        arg(&bufs.c.ptr),
                        arg(&s),
                        arg(&n),
                        arg(&reps),
                    ],
                )
            },
        }
    };
    let g: &Gpu = gpu;
    let reps = calibrate(ctx, g, guess, 1 << 24, |r| launch_reps(g, r))?;
    // A point of the sweep: its samples' conditions are not kept (a plateau ceiling is a
    // window's median point, not one measurement).
    let (times, _) = timed(ctx, g, || launch_reps(g, reps))?;
    // Check what the last launch left.
    let words = n * 4;
    // The check's kind of each op: the read's sum here, the others' words on the GPU.
    let kind: i32 = match op {
        MemOp::Read => -1,
        MemOp::Write => 0,
        MemOp::Copy => 1,
        MemOp::Triad => 2,
    };
    if op == MemOp::Read {
        let sums: Vec<u32> = g.download(&bufs.sums)?;
        let got = sums.iter().fold(0u32, |s, v| s.wrapping_add(*v));
        let want = pattern_sum(words, 1).wrapping_mul(reps as u32);
        if got != want {
            return Err(CudaError::Check(format!(
                "stream_read over {size} B: sum {got:#x}, expected {want:#x}"
            )));
        }
    } else {
        g.zero(&bufs.bad)?;
        let (sb, sc) = (1u32, 2u32);
        unsafe {
            g.launch(
                chk,
                grid,
                MEM_BLOCK,
                &mut [
                    arg(&bufs.bad.ptr),
                    arg(&bufs.a.ptr),
                    arg(&words),
                    arg(&kind),
                    arg(&value),
                    arg(&sb),
                    arg(&sc),
                    arg(&s),
                ],
            )
        }?;
        let bad: Vec<u64> = g.download(&bufs.bad)?;
        if bad.first().copied().unwrap_or(1) != 0 {
            return Err(CudaError::Check(format!(
                "stream_{op} over {size} B: {} of {words} words wrong",
                bad[0]
            )));
        }
    }
    let bytes = per_pass * reps as f64;
    Ok((times.iter().map(|t| bytes / t).collect(), per_pass as u64))
}

// ---------------------------------------------------------------------------------------------
// ERT: FLOPs per element sweep

pub(super) const ERT_K: [u32; 10] = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512];

pub(super) fn ert_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let r = ert(ctx, gpu);
    ctx.checked(
        gpu.ordinal,
        "ert_f32",
        r.map(|n| format!("{n} elements checked")),
    )
}

pub(super) fn ert(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<usize, CudaError> {
    let bytes: u64 = match ctx.mode {
        Mode::Check => 4 << 20,
        Mode::Quick => (4 * gpu.l2_bytes).max(64 << 20),
        Mode::Full => (4 * gpu.l2_bytes).max(256 << 20),
    };
    let (free, _) = check_mem_info()?;
    let bytes = bytes.min(free as u64 / 2) / 16 * 16;
    let n16: u64 = bytes / 16;
    let data = gpu.alloc(bytes as usize)?;
    let init = gpu.function("stream_init")?;
    let grid = gpu.grid_for(MEM_BLOCK, gpu.max_threads_per_sm);
    let seed = 5u32;
    unsafe {
        gpu.launch(
            init,
            grid,
            MEM_BLOCK,
            &mut [arg(&data.ptr), arg(&n16), arg(&seed)],
        )
    }?;
    let (a, b) = (0.999f32, 0.001f32);
    let mut applied: u64 = 0; // FMAs applied to every element so far
    let mut points = Vec::new();
    for k in ERT_K {
        ctx.cancelled()?;
        let f = gpu.function(&format!("ert_f32_{k}"))?;
        let g: &Gpu = gpu;
        // Every pass of every launch (calibration and warm-up included) applies k FMAs to
        // every element: counted here for the check below.
        let passes = std::cell::Cell::new(0u64);
        let launch = |reps: i32| {
            passes.set(passes.get() + reps as u64);
            // SAFETY: ert_f32_K(data, n, a, b, reps) over a buffer of n16 16-byte elements.
            unsafe {
                g.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&data.ptr), arg(&n16), arg(&a), arg(&b), arg(&reps)],
                )
            }
        };
        // Passes per launch so that a sample lasts the mode's sample time: one pass at k = 1
        // over a few hundred MB takes well under a millisecond on an HBM GPU.
        let (times, _, _) = timed_passes(ctx, g, 1 << 16, launch)?;
        applied += passes.get() * k as u64;
        let flops = 2.0 * k as f64 * (n16 * 4) as f64;
        let rates: Vec<f64> = times.iter().map(|t| flops / t).collect();
        if let Some(stats) = Stats::from_samples(&rates) {
            // Operational intensity: 2k FLOPs per 8 bytes (one f32 read, one written).
            points.push(CurvePoint {
                x: 2.0 * k as f64 / 8.0,
                value: stats.max,
                stats,
                level: None,
            });
        }
    }
    // Check a sample of elements against the recurrence applied `applied` times.
    let v: Vec<f32> = gpu.download(&data)?;
    let words = v.len();
    let sample: Vec<usize> = (0..64)
        .map(|i| i * (words / 64) + i % 5)
        .filter(|&i| i < words)
        .collect();
    for &i in &sample {
        let mut x = f32::from_bits(pattern(i as u64, seed));
        for _ in 0..applied {
            x = x.mul_add(a, b);
        }
        let err = ((v[i] - x) / x).abs();
        if err > 1e-6 {
            return Err(CudaError::Check(format!(
                "ert element {i}: GPU {} CPU {x}",
                v[i]
            )));
        }
    }
    if ctx.mode != Mode::Check {
        ctx.out.curves.push(Curve {
            id: format!("gpu{}/ert/f32", gpu.ordinal),
            x_label: "operational intensity".into(),
            x_unit: "FLOP/B".into(),
            unit: "FLOP/s".into(),
            threads: 1,
            points,
        });
    }
    Ok(sample.len())
}
