//! Point-to-point between two ranks of a group: the half round trip of 8 B and the bandwidth of
//! windows of messages one way and both ways, the last message of each window checked against
//! its pattern (the probe's pairs, and the link rounds of `links.rs` and `gpu_links.rs`).

use super::links::ping_pong;
use super::*;

/// Point-to-point results of one pair.
pub struct P2p {
    /// Half round trips of 8 B, seconds.
    pub latency: Vec<f64>,
    /// (bytes, B/s samples) per size.
    pub one_way: Vec<(usize, Vec<f64>)>,
    pub both_ways: Vec<(usize, Vec<f64>)>,
}

pub(super) fn pattern(bytes: usize, i: usize) -> u8 {
    (i.wrapping_mul(31) ^ bytes) as u8
}

/// Latency and bandwidth between the group's ranks 0 and 1 (the others wait). `None` on the
/// ranks that are not in the pair, and on a group of one.
pub(super) fn p2p_pair(
    g: &Group,
    sweep: &[usize],
    quick: bool,
    timeout: Duration,
) -> Result<Option<P2p>, CommError> {
    if g.size() < 2 {
        return Ok(None);
    }
    let label = format!("point-to-point ({})", g.scope.name());
    arrival(g, &label, timeout)?;
    let r = g.rank();
    if r > 1 {
        return Ok(None);
    }
    let peer: c_int = 1 - r as c_int;
    let comm = g.comm.as_raw();
    let mut out = P2p {
        latency: Vec::new(),
        one_way: Vec::new(),
        both_ways: Vec::new(),
    };
    watchdog::arm(&format!("{label}: latency"));
    out.latency = ping_pong(comm, r == 0, peer, if quick { 200 } else { 2000 })?;
    watchdog::disarm();
    for &bytes in sweep {
        let window = (64usize << 20).checked_div(bytes).unwrap_or(1).clamp(1, 64);
        let send: Vec<u8> = (0..bytes).map(|i| pattern(bytes, i)).collect();
        let mut recv = vec![0u8; bytes * window];
        let iters = iterations(bytes * window, quick).min(if quick { 10 } else { 30 });
        for both in [false, true] {
            watchdog::arm(&format!(
                "{label}: {} B {}",
                bytes,
                if both { "both ways" } else { "one way" }
            ));
            let mut samples = Vec::with_capacity(iters);
            for it in 0..iters + 1 {
                let t0 = mpi::time();
                let ok = window_exchange(comm, r, peer, &send, &mut recv, window, both)?;
                let t = mpi::time() - t0;
                if !ok {
                    return Err(CommError::WrongResult(format!(
                        "{label}: a {bytes} B message arrived wrong"
                    )));
                }
                if it > 0 {
                    let moved = (bytes * window) as f64 * if both { 2.0 } else { 1.0 };
                    samples.push(moved / t);
                }
            }
            watchdog::disarm();
            if both {
                out.both_ways.push((bytes, samples));
            } else {
                out.one_way.push((bytes, samples));
            }
        }
    }
    Ok((r == 0).then_some(out))
}

/// One window: `window` messages of `send` from rank 0 to rank 1 (and back at once when `both`),
/// then an acknowledgement from rank 1 that says whether its last message arrived intact.
pub(super) fn window_exchange(
    comm: ffi::MPI_Comm,
    r: usize,
    peer: c_int,
    send: &[u8],
    recv: &mut [u8],
    window: usize,
    both: bool,
) -> Result<bool, CommError> {
    let bytes = send.len();
    let mut reqs: Vec<ffi::MPI_Request> = Vec::with_capacity(2 * window);
    // SAFETY: every request's buffer (`send`, a distinct chunk of `recv`) outlives MPI_Waitall
    // below; counts fit in c_int (sizes ≤ 2 GiB).
    unsafe {
        let post_recvs =
            |reqs: &mut Vec<ffi::MPI_Request>, recv: &mut [u8]| -> Result<(), CommError> {
                for k in 0..window {
                    let mut q = std::mem::zeroed();
                    check_rc(
                        "MPI_Irecv",
                        ffi::MPI_Irecv(
                            recv[k * bytes..].as_mut_ptr() as *mut c_void,
                            bytes as c_int,
                            ffi::RSMPI_UINT8_T,
                            peer,
                            TAG_DATA,
                            comm,
                            &mut q,
                        ),
                    )?;
                    reqs.push(q);
                }
                Ok(())
            };
        let post_sends = |reqs: &mut Vec<ffi::MPI_Request>| -> Result<(), CommError> {
            for _ in 0..window {
                let mut q = std::mem::zeroed();
                check_rc(
                    "MPI_Isend",
                    ffi::MPI_Isend(
                        send.as_ptr() as *const c_void,
                        bytes as c_int,
                        ffi::RSMPI_UINT8_T,
                        peer,
                        TAG_DATA,
                        comm,
                        &mut q,
                    ),
                )?;
                reqs.push(q);
            }
            Ok(())
        };
        if r == 1 || both {
            post_recvs(&mut reqs, recv)?;
        }
        if r == 0 || both {
            post_sends(&mut reqs)?;
        }
        check_rc(
            "MPI_Waitall",
            ffi::MPI_Waitall(
                reqs.len() as c_int,
                reqs.as_mut_ptr(),
                ffi::RSMPI_STATUSES_IGNORE,
            ),
        )?;
        let mut ack = [0u8; 1];
        if r == 1 {
            let last = &recv[(window - 1) * bytes..window * bytes];
            ack[0] = if last
                .iter()
                .enumerate()
                .all(|(i, b)| *b == pattern(bytes, i))
            {
                1
            } else {
                2
            };
            send_bytes(comm, &ack, peer, TAG_ACK)?;
            Ok(ack[0] == 1)
        } else {
            recv_bytes(comm, &mut ack, peer, TAG_ACK)?;
            let mine = !both || {
                let last = &recv[(window - 1) * bytes..window * bytes];
                last.iter()
                    .enumerate()
                    .all(|(i, b)| *b == pattern(bytes, i))
            };
            Ok(ack[0] == 1 && mine)
        }
    }
}
