//! The link matrix between GPUs: NCCL's ncclSend/ncclRecv between the GPUs of the lowest ranks
//! of every pair of nodes, on the world's NCCL communicator, in the rounds, arrival checks,
//! watchdog labels and gathering of the host links (`links.rs`): only the transport differs.
//! Latency is half the round trip of 8 B as the host sees it (each send and receive enqueued,
//! the stream synchronised: what a training step waits for); bandwidth is CUDA events around
//! a window of sends on the sender's stream, started once the receiver has posted its receives
//! (an MPI handshake), and the receiver checks the last window's bytes against the pattern.

use super::links::{LinkConfig, LinkRun, Transport};
use super::p2p::pattern;
use super::*;
use crate::comm::nccl::Communicator;
use crate::cuda::device::DevBuf;
use crate::cuda::CudaError;
use roofline_model::links::Link;

/// The receive window: up to 16 messages, at most 256 MiB in all (a GPU's memory is not the
/// limit a host's is, and fast links need long windows to reach their rate).
fn window(bytes: usize) -> usize {
    (256usize << 20)
        .checked_div(bytes)
        .unwrap_or(1)
        .clamp(1, 16)
}

/// NCCL point to point between the GPUs of the pair's lowest ranks.
struct GpuLinks<'a> {
    comm: &'a Communicator,
    small: DevBuf,
    /// The pattern of the message size last sent, and the receive window.
    send: Option<DevBuf>,
    recv: Option<DevBuf>,
}

fn nccl(e: CudaError) -> CommError {
    CommError::Nccl(e)
}

impl GpuLinks<'_> {
    /// The NCCL rank (the world rank) of node `peer`'s lowest rank.
    fn nccl_rank(inter: &Group, peer: usize) -> Result<usize, CommError> {
        inter.members.get(peer).copied().ok_or_else(|| {
            CommError::Setup(format!(
                "node {peer} is not among the {} nodes",
                inter.size()
            ))
        })
    }

    /// A device buffer of at least `bytes` in `slot`, filled by `fill` when new.
    fn buffer<'b>(
        gpu: &crate::cuda::device::Gpu,
        slot: &'b mut Option<DevBuf>,
        bytes: usize,
        fill: bool,
    ) -> Result<&'b DevBuf, CudaError> {
        if slot.as_ref().is_none_or(|b| b.bytes != bytes) {
            *slot = None;
            *slot = Some(if fill {
                let data: Vec<u8> = (0..bytes).map(|i| pattern(bytes, i)).collect();
                gpu.upload(&data)?
            } else {
                gpu.alloc(bytes)?
            });
        }
        Ok(slot.as_ref().expect("filled above"))
    }
}

impl Transport for GpuLinks<'_> {
    fn prefix(&self) -> &'static str {
        "GPU "
    }

    fn ping_pong(
        &mut self,
        inter: &Group,
        first: bool,
        peer: usize,
        rounds: usize,
    ) -> Result<Vec<f64>, CommError> {
        let p = Self::nccl_rank(inter, peer)?;
        let (c, small) = (self.comm, &self.small);
        let mut out = Vec::new();
        for i in 0..rounds + 10 {
            let t0 = Instant::now();
            if first {
                c.send_to(p, small, 8, 1).map_err(nccl)?;
                c.recv_from(p, small, 8, 1).map_err(nccl)?;
            } else {
                c.recv_from(p, small, 8, 1).map_err(nccl)?;
                c.send_to(p, small, 8, 1).map_err(nccl)?;
            }
            c.gpu.sync().map_err(nccl)?;
            if first && i >= 10 {
                out.push(t0.elapsed().as_secs_f64() / 2.0);
            }
        }
        Ok(out)
    }

    fn one_way(
        &mut self,
        inter: &Group,
        sending: bool,
        peer: usize,
        bytes: usize,
        samples: usize,
    ) -> Result<(Vec<f64>, bool), CommError> {
        let p = Self::nccl_rank(inter, peer)?;
        let (ic, mp) = (inter.comm.as_raw(), peer as c_int);
        let w = window(bytes);
        let c = self.comm;
        let mut rates = Vec::new();
        if sending {
            let send = Self::buffer(&c.gpu, &mut self.send, bytes, true).map_err(nccl)?;
            for it in 0..samples + 1 {
                // (The untimed first window also makes NCCL connect the pair, which needs
                // both sides inside NCCL: no handshake before it.)
                if it > 0 {
                    let mut ready = [0u8; 1];
                    recv_bytes(ic, &mut ready, mp, TAG_ACK)?;
                }
                let t = c.gpu.time(|| c.send_to(p, send, bytes, w)).map_err(nccl)?;
                if it > 0 {
                    rates.push((bytes * w) as f64 / t);
                }
            }
            let mut verdict = [0u8; 1];
            recv_bytes(ic, &mut verdict, mp, TAG_ACK)?;
            Ok((rates, verdict[0] == 1))
        } else {
            let recv = Self::buffer(&c.gpu, &mut self.recv, bytes * w, false).map_err(nccl)?;
            for it in 0..samples + 1 {
                if it == samples {
                    // The last window lands on zeros: what is checked arrived in it.
                    c.gpu.zero(recv).map_err(nccl)?;
                }
                c.recv_from(p, recv, bytes, w).map_err(nccl)?;
                if it > 0 {
                    send_bytes(ic, &[1], mp, TAG_ACK)?;
                }
                c.gpu.sync().map_err(nccl)?;
            }
            let got: Vec<u8> = c.gpu.download(recv).map_err(nccl)?;
            let last = &got[(w - 1) * bytes..w * bytes];
            let ok = last
                .iter()
                .enumerate()
                .all(|(i, b)| *b == pattern(bytes, i));
            send_bytes(ic, &[if ok { 1 } else { 2 }], mp, TAG_ACK)?;
            Ok((rates, ok))
        }
    }
}

impl World {
    /// The link rounds between GPUs, on `comm` (the world's NCCL communicator, one GPU per
    /// rank). Every rank calls it; the root gets the links (None elsewhere, and for a world of
    /// one node). A hang is named by the watchdog with the pair, as for the host links; the
    /// links measured before it are not written (the NCCL section keeps no partial file).
    pub(super) fn gpu_link_rounds(
        &self,
        comm: &Communicator,
        cfg: &LinkConfig,
        progress: &dyn crate::probe::Progress,
    ) -> Result<Option<LinkRun>, CommError> {
        let small = comm.gpu.alloc(8).map_err(nccl)?;
        comm.gpu.zero(&small).map_err(nccl)?;
        let mut t = GpuLinks {
            comm,
            small,
            send: None,
            recv: None,
        };
        let mut keep = |_: &[Link], _: usize, _: usize| {};
        self.rounds_with(cfg, progress, &mut keep, &mut t)
    }
}

#[cfg(test)]
mod tests {
    use super::window;

    #[test]
    fn the_window_holds_up_to_16_messages_within_256_mib() {
        assert_eq!(window(8 << 20), 16);
        assert_eq!(window(64 << 20), 4);
        assert_eq!(window(1 << 30), 1);
        assert_eq!(window(0), 1);
    }
}
