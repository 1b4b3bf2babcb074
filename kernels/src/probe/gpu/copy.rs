//! Copies of one GPU and between GPUs: host↔device (pinned and pageable), device↔device, and
//! peer to peer by copy engine and by an SM kernel, every word checked; their PCIe and NVLink peaks.

use super::*;

// ---------------------------------------------------------------------------------------------
// Copies: host <-> device, device <-> device, peer to peer

/// Theoretical PCIe bandwidth per direction for a generation and width.
pub fn pcie_peak(gen: u32, width: u32) -> Option<f64> {
    // GT/s per lane and line-code efficiency: 8b/10b up to gen 2, 128b/130b from gen 3;
    // gen 6 (FLIT, PAM4) counted at 242/256.
    let (gts, eff) = match gen {
        1 => (2.5, 0.8),
        2 => (5.0, 0.8),
        3 => (8.0, 128.0 / 130.0),
        4 => (16.0, 128.0 / 130.0),
        5 => (32.0, 128.0 / 130.0),
        6 => (64.0, 242.0 / 256.0),
        _ => return None,
    };
    Some(gts * 1e9 * eff * width as f64 / 8.0)
}

pub(super) fn copy_bytes(mode: Mode) -> usize {
    match mode {
        Mode::Check => 4 << 20,
        Mode::Quick => 64 << 20,
        Mode::Full => 256 << 20,
    }
}

pub(super) fn fill_pattern(v: &mut [u32], seed: u32) {
    for (i, x) in v.iter_mut().enumerate() {
        *x = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed);
    }
}

pub(super) fn first_mismatch(v: &[u32], seed: u32) -> Option<usize> {
    v.iter()
        .enumerate()
        .position(|(i, x)| *x != (i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed))
}

pub(super) fn copy_section(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<(), CudaError> {
    let r = copies(ctx, gpu);
    ctx.checked(gpu.ordinal, "copies", r)
}

pub(super) fn copies(ctx: &mut Ctx, gpu: &mut Gpu) -> Result<String, CudaError> {
    let bytes = copy_bytes(ctx.mode);
    let words = bytes / 4;
    let dev = gpu.alloc(bytes)?;
    let dev2 = gpu.alloc(bytes)?;
    let mut pinned = gpu.alloc_pinned(bytes)?;
    let mut pinned2 = gpu.alloc_pinned(bytes)?;
    fill_pattern(pinned.as_mut_slice::<u32>(), 11);
    let mut pageable = vec![0u32; words];
    fill_pattern(&mut pageable, 13);
    let stream = gpu.stream;
    let pcie = ctx
        .out
        .gpus
        .iter()
        .find(|g| g.index == gpu.ordinal)
        // The link's maximum: an idle link reports a lower current generation (power saving).
        .and_then(|g| {
            Some((
                g.pcie_generation_max.or(g.pcie_generation)?,
                g.pcie_width_max.or(g.pcie_width)?,
            ))
        });
    let pcie_peak = |_: ()| {
        pcie.and_then(|(g, w)| pcie_peak(g, w))
            .map(|v| TheoreticalPeak {
                value: v,
                unit: "B/s".into(),
                source: format!(
                    "PCIe gen {} x{} per direction (line code counted)",
                    pcie.map_or(0, |p| p.0),
                    pcie.map_or(0, |p| p.1)
                ),
                uncertainty: 0.0,
            })
    };
    // Pinned host -> device.
    let src = pinned.as_mut_slice::<u32>().as_ptr();
    let (h2d, h2d_reps, h2d_cond) = timed_repeated(ctx, gpu, || {
        // SAFETY: pinned buffer of `bytes` bytes into a device buffer of `bytes` bytes.
        device::check("cuMemcpyHtoDAsync", unsafe {
            sys::cuMemcpyHtoDAsync_v2(dev.ptr, src as *const _, bytes, stream).result()
        })
    })?;
    let back: Vec<u32> = gpu.download(&dev)?;
    if let Some(i) = first_mismatch(&back, 11) {
        return Err(CudaError::Check(format!(
            "host-to-device copy: word {i} wrong"
        )));
    }
    // Device -> pinned host.
    let dst = pinned2.as_mut_slice::<u32>().as_mut_ptr();
    let (d2h, d2h_reps, d2h_cond) = timed_repeated(ctx, gpu, || {
        // SAFETY: device buffer of `bytes` bytes into a pinned buffer of `bytes` bytes.
        device::check("cuMemcpyDtoHAsync", unsafe {
            sys::cuMemcpyDtoHAsync_v2(dst as *mut _, dev.ptr, bytes, stream).result()
        })
    })?;
    gpu.sync()?;
    if let Some(i) = first_mismatch(pinned2.as_mut_slice::<u32>(), 11) {
        return Err(CudaError::Check(format!(
            "device-to-host copy: word {i} wrong"
        )));
    }
    // Both directions at once, on two streams (wall clock around both).
    let other = device::check(
        "cuStreamCreate",
        cu::stream::create(cu::stream::StreamKind::NonBlocking),
    )?;
    let both = (|| -> Result<Vec<f64>, CudaError> {
        let mut t = Vec::new();
        for _ in 0..ctx.mode.samples() + 1 {
            ctx.cancelled()?;
            gpu.sync()?;
            let start = Instant::now();
            // SAFETY: as above; the two copies touch different buffers.
            unsafe {
                device::check(
                    "cuMemcpyHtoDAsync",
                    sys::cuMemcpyHtoDAsync_v2(dev2.ptr, src as *const _, bytes, stream).result(),
                )?;
                device::check(
                    "cuMemcpyDtoHAsync",
                    sys::cuMemcpyDtoHAsync_v2(dst as *mut _, dev.ptr, bytes, other).result(),
                )?;
                device::check("cuStreamSynchronize", cu::stream::synchronize(stream))?;
                device::check("cuStreamSynchronize", cu::stream::synchronize(other))?;
            }
            t.push(start.elapsed().as_secs_f64());
        }
        t.remove(0); // warm-up
        Ok(t)
    })();
    // SAFETY: created above, idle (synchronized) or failed.
    unsafe {
        let _ = cu::stream::synchronize(other);
        let _ = cu::stream::destroy(other);
    }
    let both = both?;
    // Pageable host memory, wall clock from the call to the end of a stream synchronisation:
    // a pageable cuMemcpyHtoD returns once the data is staged, before the last DMA has landed,
    // so timing the call alone overstates the rate. The copies go on the probe's stream (staged
    // by the driver as for the synchronous call), and the clock stops when it is done.
    let mut pageable_h2d = Vec::new();
    let mut pageable_d2h = Vec::new();
    let mut host_back = vec![0u32; words];
    for i in 0..ctx.mode.samples() + 1 {
        ctx.cancelled()?;
        gpu.bind()?;
        gpu.sync()?;
        let t = Instant::now();
        // SAFETY: `pageable` has exactly `bytes` bytes and outlives the synchronisation.
        device::check("cuMemcpyHtoDAsync(pageable)", unsafe {
            cu::memcpy_htod_async(dev2.ptr, &pageable, stream)
        })?;
        gpu.sync()?;
        let a = t.elapsed().as_secs_f64();
        let t = Instant::now();
        // SAFETY: `host_back` has exactly `bytes` bytes and is read only after the sync.
        device::check("cuMemcpyDtoHAsync(pageable)", unsafe {
            cu::memcpy_dtoh_async(&mut host_back, dev2.ptr, stream)
        })?;
        gpu.sync()?;
        let b = t.elapsed().as_secs_f64();
        if i > 0 {
            pageable_h2d.push(a);
            pageable_d2h.push(b);
        }
    }
    if let Some(i) = first_mismatch(&host_back, 13) {
        return Err(CudaError::Check(format!(
            "pageable round trip: word {i} wrong"
        )));
    }
    // Device -> device.
    let (d2d, d2d_reps, d2d_cond) = timed_repeated(ctx, gpu, || {
        // SAFETY: two device buffers of `bytes` bytes.
        device::check("cuMemcpyDtoDAsync", unsafe {
            cu::memcpy_dtod_async(dev2.ptr, dev.ptr, bytes, stream)
        })
    })?;
    let back: Vec<u32> = gpu.download(&dev2)?;
    if let Some(i) = first_mismatch(&back, 11) {
        return Err(CudaError::Check(format!(
            "device-to-device copy: word {i} wrong"
        )));
    }
    let b = bytes as f64;
    let rate = |t: &[f64], bytes: f64| -> Vec<f64> { t.iter().map(|t| bytes / t).collect() };
    let o = gpu.ordinal;
    let size = crate::probe::cpu::human_bytes(bytes as f64);
    type Entry = (
        GpuCopy,
        Vec<f64>,
        f64,
        String,
        Option<TheoreticalPeak>,
        Option<SampleConditions>,
    );
    let entries: [Entry; 6] = [
        (GpuCopy::H2d, rate(&h2d, b), b, format!("cuMemcpyHtoDAsync from pinned host memory, {size}, {h2d_reps} back to back per CUDA-event-timed sample"), pcie_peak(()), h2d_cond),
        (GpuCopy::D2h, rate(&d2h, b), b, format!("cuMemcpyDtoHAsync into pinned host memory, {size}, {d2h_reps} back to back per CUDA-event-timed sample"), pcie_peak(()), d2h_cond),
        (GpuCopy::Both, rate(&both, 2.0 * b), 2.0 * b, format!("both directions at once on two streams, {size} each way, pinned; bytes of both directions counted; wall clock"), pcie_peak(()).map(|mut p| { p.value *= 2.0; p.source += ", both directions"; p }), None),
        (GpuCopy::H2dPageable, rate(&pageable_h2d, b), b, format!("cuMemcpyHtoDAsync from pageable (malloc'd) memory, {size}, wall clock to the end of cuStreamSynchronize"), pcie_peak(()), None),
        (GpuCopy::D2hPageable, rate(&pageable_d2h, b), b, format!("cuMemcpyDtoHAsync into pageable memory, {size}, wall clock to the end of cuStreamSynchronize"), pcie_peak(()), None),
        (GpuCopy::D2d, rate(&d2d, 2.0 * b), 2.0 * b, format!("cuMemcpyDtoDAsync, {size}, {d2d_reps} back to back per CUDA-event-timed sample; a read and a write counted per byte copied (as STREAM copy)"), ctx.memory_peak(gpu), d2d_cond),
    ];
    for (copy, rates, bytes, method, peak, conditions) in entries {
        let kind = match copy {
            GpuCopy::D2d => CeilingKind::Memory,
            _ => CeilingKind::Comm,
        };
        ctx.push(
            CeilingId::Copy { gpu: o, copy },
            kind,
            "B/s",
            &rates,
            PerIteration { ops: 0.0, bytes },
            format!("{method}; data verified"),
            peak,
            conditions,
        );
    }
    Ok(format!("{size} each way verified"))
}

pub(super) fn p2p(ctx: &mut Ctx, a: &mut Gpu, b: &mut Gpu) -> Result<(), CudaError> {
    let r = p2p_pair(ctx, a, b);
    let label = format!("p2p gpu{}->gpu{}", a.ordinal, b.ordinal);
    ctx.checked(a.ordinal, &label, r)
}

pub(super) fn enable_peer(from: &Gpu, to: &Gpu) -> Result<bool, CudaError> {
    let mut can = 0;
    // SAFETY: out-parameter, valid devices.
    device::check("cuDeviceCanAccessPeer", unsafe {
        sys::cuDeviceCanAccessPeer(&mut can, from.dev, to.dev).result()
    })?;
    if can == 0 {
        return Ok(false);
    }
    from.bind()?;
    // SAFETY: live contexts; "already enabled" is fine.
    match unsafe { sys::cuCtxEnablePeerAccess(to.ctx, 0) } {
        sys::cudaError_enum::CUDA_SUCCESS
        | sys::cudaError_enum::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED => Ok(true),
        e => device::check("cuCtxEnablePeerAccess", e.result()).map(|_| true),
    }
}

pub(super) fn p2p_pair(ctx: &mut Ctx, a: &mut Gpu, b: &mut Gpu) -> Result<String, CudaError> {
    let bytes = copy_bytes(ctx.mode);
    let words = bytes / 4;
    let peer = enable_peer(a, b)? && enable_peer(b, a)?;
    let mut host = vec![0u32; words];
    fill_pattern(&mut host, 17);
    let src = a.upload(&host)?;
    let dst = b.alloc(bytes)?;
    let back_src = b.upload(&host)?;
    let back_dst = a.alloc(bytes)?;
    let (sa, sb) = (a.stream, b.stream);
    // Copy engine, one way.
    a.bind()?;
    let (one, one_reps, one_cond) = timed_repeated(ctx, a, || {
        // SAFETY: buffers of `bytes` bytes in their own contexts.
        device::check("cuMemcpyPeerAsync", unsafe {
            cu::memcpy_peer_async(b.ctx, dst.ptr, a.ctx, src.ptr, bytes, sa)
        })
    })?;
    let got: Vec<u32> = b.download(&dst)?;
    if let Some(i) = first_mismatch(&got, 17) {
        return Err(CudaError::Check(format!(
            "peer copy gpu{}->gpu{}: word {i} wrong",
            a.ordinal, b.ordinal
        )));
    }
    // Both ways at once (wall clock).
    let mut both = Vec::new();
    for i in 0..ctx.mode.samples() + 1 {
        ctx.cancelled()?;
        a.sync()?;
        b.sync()?;
        let t = Instant::now();
        // As many copies each way between the synchronisations as the one-way sample took,
        // so that the synchronisations' cost stays small against the copies.
        for _ in 0..one_reps {
            // SAFETY: as above, on each GPU's own stream.
            unsafe {
                device::check(
                    "cuMemcpyPeerAsync",
                    cu::memcpy_peer_async(b.ctx, dst.ptr, a.ctx, src.ptr, bytes, sa),
                )?;
                device::check(
                    "cuMemcpyPeerAsync",
                    cu::memcpy_peer_async(a.ctx, back_dst.ptr, b.ctx, back_src.ptr, bytes, sb),
                )?;
            }
        }
        a.sync()?;
        b.sync()?;
        if i > 0 {
            both.push(t.elapsed().as_secs_f64() / one_reps as f64);
        }
    }
    let got: Vec<u32> = a.download(&back_dst)?;
    if let Some(i) = first_mismatch(&got, 17) {
        return Err(CudaError::Check(format!(
            "peer copy gpu{}->gpu{}: word {i} wrong",
            b.ordinal, a.ordinal
        )));
    }
    // SM copy kernel on `a` writing into `b`'s memory (needs peer access).
    let mut sm = Vec::new();
    let mut sm_cond = None;
    let mut sm_both = Vec::new();
    if peer {
        b.zero(&dst)?;
        b.sync()?;
        let f = a.function("stream_copy")?;
        let grid = a.grid_for(MEM_BLOCK, a.max_threads_per_sm);
        let n = (bytes / 16) as u64;
        // Passes per launch (the kernel's own repetition count) calibrated so that a sample
        // lasts the mode's sample time.
        let g: &Gpu = a;
        let launch = |reps: i32| unsafe {
            g.launch(
                f,
                grid,
                MEM_BLOCK,
                &mut [arg(&dst.ptr), arg(&src.ptr), arg(&n), arg(&reps)],
            )
        };
        let reps;
        (sm, reps, sm_cond) = timed_passes(ctx, g, 1 << 12, launch)?;
        let got: Vec<u32> = b.download(&dst)?;
        if let Some(i) = first_mismatch(&got, 17) {
            return Err(CudaError::Check(format!(
                "SM peer copy gpu{}->gpu{}: word {i} wrong",
                a.ordinal, b.ordinal
            )));
        }
        // Both ways at once: a's SMs write into b while b's SMs write into a (wall clock).
        a.zero(&back_dst)?;
        let fb = b.function("stream_copy")?;
        let grid_b = b.grid_for(MEM_BLOCK, b.max_threads_per_sm);
        for i in 0..ctx.mode.samples() + 1 {
            ctx.cancelled()?;
            a.sync()?;
            b.sync()?;
            let t = Instant::now();
            a.bind()?;
            // SAFETY: stream_copy(dst, src, n, reps) with buffers of `bytes` bytes that live
            // until both GPUs are synchronized below.
            unsafe {
                a.launch(
                    f,
                    grid,
                    MEM_BLOCK,
                    &mut [arg(&dst.ptr), arg(&src.ptr), arg(&n), arg(&reps)],
                )?;
            }
            b.bind()?;
            // SAFETY: as above, on b (peer access was enabled both ways).
            unsafe {
                b.launch(
                    fb,
                    grid_b,
                    MEM_BLOCK,
                    &mut [arg(&back_dst.ptr), arg(&back_src.ptr), arg(&n), arg(&reps)],
                )?;
            }
            a.sync()?;
            b.sync()?;
            if i > 0 {
                sm_both.push(t.elapsed().as_secs_f64() / reps as f64);
            }
        }
        let got: Vec<u32> = a.download(&back_dst)?;
        if let Some(i) = first_mismatch(&got, 17) {
            return Err(CudaError::Check(format!(
                "SM peer copy gpu{}->gpu{}: word {i} wrong",
                b.ordinal, a.ordinal
            )));
        }
    } else {
        ctx.out.notes.push(format!(
            "gpu{} and gpu{} have no peer access: copies between them are staged through host memory",
            a.ordinal, b.ordinal
        ));
    }
    let bf = bytes as f64;
    let nvlink_peak = nvlink_peak(ctx, a.ordinal);
    let rate = |t: &[f64], x: f64| -> Vec<f64> { t.iter().map(|t| x / t).collect() };
    let peer_id = |copy| CeilingId::PeerCopy {
        from: a.ordinal,
        to: b.ordinal,
        copy,
    };
    let size = crate::probe::cpu::human_bytes(bytes as f64);
    ctx.push(
        peer_id(PeerCopy::Engine),
        CeilingKind::Comm,
        "B/s",
        &rate(&one, bf),
        PerIteration {
            ops: 0.0,
            bytes: bf,
        },
        format!(
            "cuMemcpyPeerAsync (copy engine), {size} one way, {one_reps} back to back per CUDA-event-timed sample, verified{}",
            if peer {
                ""
            } else {
                "; no peer access (staged through the host)"
            }
        ),
        nvlink_peak.clone(),
        one_cond,
    );
    ctx.push(peer_id(PeerCopy::EngineBidir), CeilingKind::Comm, "B/s", &rate(&both, 2.0 * bf), PerIteration { ops: 0.0, bytes: 2.0 * bf }, format!("cuMemcpyPeerAsync both ways at once, {size} each way, {one_reps} each way per sample, both directions counted, wall clock, verified"), nvlink_peak.clone().map(|mut p| { p.value *= 2.0; p }), None);
    if !sm.is_empty() {
        ctx.push(peer_id(PeerCopy::Sm), CeilingKind::Comm, "B/s", &rate(&sm, bf), PerIteration { ops: 0.0, bytes: bf }, format!("NVRTC kernel stream_copy on gpu{} storing into gpu{}'s memory (16-byte accesses), {size}, CUDA-event timed, verified", a.ordinal, b.ordinal), nvlink_peak.clone(), sm_cond);
    }
    if !sm_both.is_empty() {
        ctx.push(
            peer_id(PeerCopy::SmBidir),
            CeilingKind::Comm,
            "B/s",
            &rate(&sm_both, 2.0 * bf),
            PerIteration { ops: 0.0, bytes: 2.0 * bf },
            format!("NVRTC kernel stream_copy on both GPUs at once, each storing into the other's memory, {size} each way, both directions counted, wall clock, verified"),
            nvlink_peak.map(|mut p| {
                p.value *= 2.0;
                p
            }),
            None,
        );
    }
    Ok(format!(
        "{size} verified, peer access {}",
        if peer { "on" } else { "unavailable" }
    ))
}

/// Bytes/s per direction of one NVLink link, from NVML's `nvmlNvlinkVersion_t` (not the
/// NVLink generation: 1 = 1.0, 2 = 2.0, 3 = 2.2, 4 = 3.0, 5 = 3.1, 6 = 4.0, 7 = 5.0): 20 GB/s
/// for NVLink 1, 25 GB/s for NVLink 2, 3 and 4 (V100, A100, H100: 18 links × 25 = 450 GB/s),
/// 50 GB/s for NVLink 5 (B200). Some drivers report 7 (5.0) for H100's NVLink 4: on a
/// compute-capability 9 GPU that is read as 25 GB/s. `None` for unknown values.
pub fn nvlink_link_rate(nvml_version: u32, cc_major: u32) -> Option<f64> {
    match nvml_version {
        1 => Some(20e9),
        2..=6 => Some(25e9),
        7 if cc_major == 9 => Some(25e9),
        7 => Some(50e9),
        _ => None,
    }
}

/// NVLink bandwidth per direction of `gpu`: the sum of its active links' rates.
pub(super) fn nvlink_peak(ctx: &Ctx, gpu: usize) -> Option<TheoreticalPeak> {
    let info = ctx.out.gpus.iter().find(|g| g.index == gpu)?;
    let cc_major: u32 = info
        .compute_capability
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    let rates: Vec<f64> = info
        .nvlinks
        .iter()
        .filter_map(|l| nvlink_link_rate(l.version, cc_major))
        .collect();
    if rates.is_empty() {
        return None;
    }
    let value: f64 = rates.iter().sum();
    Some(TheoreticalPeak {
        value,
        unit: "B/s".into(),
        source: format!(
            "{} active NVLink links, {:.0} GB/s per direction in all (NVML link versions {:?})",
            rates.len(),
            value / 1e9,
            info.nvlinks.iter().map(|l| l.version).collect::<Vec<_>>()
        ),
        uncertainty: 0.0,
    })
}
