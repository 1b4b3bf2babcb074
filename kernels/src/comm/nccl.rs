//! NCCL collectives on device memory: one rank per GPU, the communicator bootstrapped by the
//! MPI driver (which broadcasts NCCL's unique id), the same collectives, sizes, bus-bandwidth
//! factors and result checks as on host memory. Alltoall is grouped ncclSend/ncclRecv (NCCL has
//! no alltoall call). NCCL's own choice of algorithm and protocol is read from its TUNING debug
//! output (NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=TUNING, NCCL_DEBUG_FILE) and recorded, because
//! busbw stops meaning wire bandwidth under NVLS, tree or CollNet/SHARP.
//!
//! Built in every build; it needs a GPU and libnccl only when it runs.

use super::{expected, first_difference, send_data, Collective};
use crate::cuda::device::{self, DevBuf, Gpu};
use crate::cuda::nccl_lib::{self, Nccl};
use crate::cuda::CudaError;
use cudarc::nccl::sys as ns;
use std::ffi::c_void;

/// Whether NCCL can be used; the error says where we looked and how to install it.
pub fn available() -> Result<(), CudaError> {
    nccl_lib::get().map(|_| ())
}

/// NCCL's version from its code: 22105 → "2.21.5" (codes from 2.9 on: major·10000 +
/// minor·100 + patch; before: major·1000 + minor·100 + patch).
pub fn version_string(v: i32) -> String {
    if v >= 10000 {
        format!("{}.{}.{}", v / 10000, (v % 10000) / 100, v % 100)
    } else {
        format!("{}.{}.{}", v / 1000, (v % 1000) / 100, v % 100)
    }
}

/// NCCL's version, e.g. "2.21.5".
pub fn version() -> Result<String, CudaError> {
    Ok(version_string(nccl_lib::get()?.version()?))
}

/// Asks NCCL to log its algorithm and protocol choices into `path` (call before the first
/// communicator is created; NCCL reads these at initialisation).
pub fn log_tuning_to(path: &std::path::Path) {
    std::env::set_var("NCCL_DEBUG", "INFO");
    std::env::set_var("NCCL_DEBUG_SUBSYS", "INIT,TUNING");
    std::env::set_var("NCCL_DEBUG_FILE", path);
}

/// NCCL's algorithm and protocol numbers (nccl.h's NCCL_ALGO_* and NCCL_PROTO_*), as older
/// releases logged them.
fn algo_name(n: u32) -> &'static str {
    match n {
        0 => "Tree",
        1 => "Ring",
        2 => "CollNetDirect",
        3 => "CollNetChain",
        4 => "NVLS",
        5 => "NVLSTree",
        6 => "PAT",
        _ => "?",
    }
}

fn proto_name(n: u32) -> &'static str {
    match n {
        0 => "LL",
        1 => "LL128",
        2 => "Simple",
        _ => "?",
    }
}

/// An algorithm as NCCL writes it, by number (before 2.19) or by name (`RING`, `Tree`,
/// `COLLNET_DIRECT`, `NVLS_TREE`: 2.19 on, `ncclAlgoToString`), in one spelling.
fn algo_of(word: &str) -> Option<&'static str> {
    if let Ok(n) = word.parse::<u32>() {
        return Some(algo_name(n));
    }
    let key: String = word
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect::<String>()
        .to_ascii_uppercase();
    Some(match key.as_str() {
        "TREE" => "Tree",
        "RING" => "Ring",
        "COLLNETDIRECT" => "CollNetDirect",
        "COLLNETCHAIN" => "CollNetChain",
        "NVLS" => "NVLS",
        "NVLSTREE" => "NVLSTree",
        "PAT" => "PAT",
        _ => return None,
    })
}

/// A protocol as NCCL writes it, by number or by name (`LL`, `LL128`, `SIMPLE` or `Simple`).
fn proto_of(word: &str) -> Option<&'static str> {
    if let Ok(n) = word.parse::<u32>() {
        return Some(proto_name(n));
    }
    Some(match word.to_ascii_uppercase().as_str() {
        "LL" => "LL",
        "LL128" => "LL128",
        "SIMPLE" => "Simple",
        _ => return None,
    })
}

/// The algorithm/protocol choices in an NCCL debug log: lines such as
/// `AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}` (2.19 on, by
/// name) or `AllReduce: 4194304 Bytes -> Algo 1 proto 2 time 34.5` (older, by number),
/// returned as ("AllReduce 4194304 B", "Ring/Simple"), each distinct line once.
pub fn parse_tuning(log: &str) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    for line in log.lines() {
        let Some(pos) = line.find("-> Algo ") else {
            continue;
        };
        let before = &line[..pos];
        let after = &line[pos + "-> Algo ".len()..];
        let mut words = after.split_whitespace();
        let algo = words.next().and_then(algo_of);
        let proto = match (words.next(), words.next()) {
            (Some(p), Some(n)) if p.eq_ignore_ascii_case("proto") => proto_of(n),
            _ => None,
        };
        let (Some(a), Some(p)) = (algo, proto) else {
            continue;
        };
        // "... NCCL INFO AllReduce: 4194304 Bytes " → "AllReduce 4194304 B"
        let what = before
            .rsplit("INFO")
            .next()
            .unwrap_or(before)
            .replace(':', "")
            .replace("Bytes", "B");
        let what = what.split_whitespace().collect::<Vec<_>>().join(" ");
        let choice = format!("{a}/{p}");
        if !out.iter().any(|(w, c)| *w == what && *c == choice) {
            out.push((what, choice));
        }
    }
    out
}

/// One rank's NCCL communicator on its GPU, destroyed on drop.
pub struct Communicator {
    pub gpu: Gpu,
    lib: &'static Nccl,
    comm: ns::ncclComm_t,
    pub rank: usize,
    pub ranks: usize,
}

impl Drop for Communicator {
    fn drop(&mut self) {
        let _ = self.gpu.bind();
        let _ = self.gpu.sync();
        // SAFETY: created by ncclCommInitRank, destroyed once.
        unsafe {
            let _ = self.lib.comm_destroy(self.comm);
        }
    }
}

/// Element types of [`Communicator::all_reduce_sum`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Elem {
    F32,
    F16,
    Bf16,
    /// Batch norm's channel sums, summed across ranks in f64 as on the host.
    F64,
}

impl Elem {
    pub fn bytes(self) -> usize {
        match self {
            Elem::F64 => 8,
            Elem::F32 => 4,
            Elem::F16 | Elem::Bf16 => 2,
        }
    }
}

/// A new unique id (on the root rank; the MPI driver broadcasts its 128 bytes).
pub fn unique_id() -> Result<[u8; 128], CudaError> {
    let id = nccl_lib::get()?.unique_id()?;
    // c_char: i8 on x86-64, u8 on aarch64.
    #[allow(clippy::unnecessary_cast)]
    Ok(std::array::from_fn(|i| id.internal[i] as u8))
}

/// The timer of an NCCL collective: the ranks' barrier, then CUDA events around the work on
/// this rank's stream; settling syncs the stream.
struct AfterBarrier<'a> {
    gpu: &'a Gpu,
    barrier: &'a mut dyn FnMut(),
}

impl crate::driver::Timer for AfterBarrier<'_> {
    type Error = CudaError;
    fn time(&mut self, work: &mut dyn FnMut() -> Result<(), CudaError>) -> Result<f64, CudaError> {
        (self.barrier)();
        self.gpu.bind()?;
        self.gpu.time(work)
    }
    fn settle(&mut self) -> Result<(), CudaError> {
        self.gpu.sync()
    }
}

impl Communicator {
    /// Joins the communicator `id` as `rank` of `ranks`, on GPU `ordinal`.
    pub fn new(
        id: &[u8; 128],
        ranks: usize,
        rank: usize,
        ordinal: usize,
    ) -> Result<Communicator, CudaError> {
        Communicator::join(Communicator::gpu(ordinal)?, id, ranks, rank)
    }

    /// What one rank must have before the collective `ncclCommInitRank`: NCCL, the driver and
    /// its GPU opened. A rank that fails here has not entered the collective call, so the
    /// ranks can agree to give NCCL up before any of them waits in it.
    pub fn gpu(ordinal: usize) -> Result<Gpu, CudaError> {
        nccl_lib::get()?;
        device::init()?;
        Gpu::open(ordinal)
    }

    /// Joins the communicator `id` as `rank` of `ranks` on `gpu` (collective: every rank calls
    /// it with the same id).
    pub fn join(
        gpu: Gpu,
        id: &[u8; 128],
        ranks: usize,
        rank: usize,
    ) -> Result<Communicator, CudaError> {
        let lib = nccl_lib::get()?;
        let uid = ns::ncclUniqueId {
            internal: std::array::from_fn(|i| id[i] as std::ffi::c_char),
        };
        gpu.bind()?;
        // SAFETY: every rank calls this collectively with the same id, its GPU current.
        let comm = unsafe { lib.comm_init_rank(ranks as i32, uid, rank as i32) }?;
        Ok(Communicator {
            gpu,
            lib,
            comm,
            rank,
            ranks,
        })
    }

    fn stream(&self) -> ns::cudaStream_t {
        self.gpu.stream as ns::cudaStream_t
    }

    /// Sums `count` elements of `elem` at device address `ptr` over the ranks, in place, on
    /// this GPU's stream (the trainer's gradient buckets; 16-bit when compressed for the wire).
    pub fn all_reduce_sum(&self, ptr: u64, count: usize, elem: Elem) -> Result<(), CudaError> {
        self.gpu.bind()?;
        self.sum_in(ptr, count, elem, self.stream())
    }

    /// `all_reduce_sum` on `gpu`'s stream (a stream of this communicator's device), ordered
    /// with the work queued there: batch norm's sums on the training stream, which the next
    /// kernel needs (no event handoff, no host wait). Every rank queues the same sums in the
    /// same order.
    pub fn all_reduce_sum_on(
        &self,
        gpu: &Gpu,
        ptr: u64,
        count: usize,
        elem: Elem,
    ) -> Result<(), CudaError> {
        if gpu.dev != self.gpu.dev {
            return Err(CudaError::Check(format!(
                "an NCCL sum of GPU {} queued on GPU {}",
                self.gpu.ordinal, gpu.ordinal
            )));
        }
        gpu.bind()?;
        self.sum_in(ptr, count, elem, gpu.stream as ns::cudaStream_t)
    }

    fn sum_in(
        &self,
        ptr: u64,
        count: usize,
        elem: Elem,
        stream: ns::cudaStream_t,
    ) -> Result<(), CudaError> {
        let ty = match elem {
            Elem::F64 => ns::ncclDataType_t::ncclFloat64,
            Elem::F32 => ns::ncclDataType_t::ncclFloat32,
            Elem::F16 => ns::ncclDataType_t::ncclFloat16,
            Elem::Bf16 => ns::ncclDataType_t::ncclBfloat16,
        };
        // SAFETY: the caller's buffer on this communicator's GPU holds `count` elements of
        // `elem`; in-place allreduce is allowed (send = receive); `stream` is a live stream of
        // that GPU.
        unsafe {
            self.lib.all_reduce(
                ptr as *const c_void,
                ptr as *mut c_void,
                count,
                ty,
                ns::ncclRedOp_t::ncclSum,
                self.comm,
                stream,
            )
        }
    }

    /// Enqueues, in one NCCL group on this GPU's stream, `count` sends of the first `bytes`
    /// bytes of `buf` to `peer` (the same bytes each time): ncclSend as ncclUint8. The stream
    /// waits in it until the peer has posted its receives.
    pub fn send_to(
        &self,
        peer: usize,
        buf: &DevBuf,
        bytes: usize,
        count: usize,
    ) -> Result<(), CudaError> {
        self.point_to_point(peer, buf, bytes, count, true)
    }

    /// Enqueues, in one NCCL group on this GPU's stream, `count` receives of `bytes` bytes
    /// from `peer` into consecutive pieces of `buf`: ncclRecv as ncclUint8.
    pub fn recv_from(
        &self,
        peer: usize,
        buf: &DevBuf,
        bytes: usize,
        count: usize,
    ) -> Result<(), CudaError> {
        self.point_to_point(peer, buf, bytes, count, false)
    }

    fn point_to_point(
        &self,
        peer: usize,
        buf: &DevBuf,
        bytes: usize,
        count: usize,
        send: bool,
    ) -> Result<(), CudaError> {
        let needed = if send { bytes } else { bytes * count };
        if peer >= self.ranks || peer == self.rank || needed > buf.bytes {
            return Err(CudaError::Check(format!(
                "NCCL point to point from rank {} to peer {peer} of {} ranks: {count} × {bytes} B in a buffer of {} B",
                self.rank, self.ranks, buf.bytes
            )));
        }
        self.gpu.bind()?;
        let (lib, comm, st) = (self.lib, self.comm, self.stream());
        let u8t = ns::ncclDataType_t::ncclUint8;
        lib.group_start()?;
        let mut result = Ok(());
        for k in 0..count {
            // SAFETY: `buf` is a device buffer of this GPU holding `needed` bytes (checked
            // above); a send reads its first `bytes`, receive k writes bytes [k·bytes, (k+1)·bytes).
            result = unsafe {
                if send {
                    lib.send(buf.ptr as *const c_void, bytes, u8t, peer as i32, comm, st)
                } else {
                    let p = (buf.ptr + (k * bytes) as u64) as *mut c_void;
                    lib.recv(p, bytes, u8t, peer as i32, comm, st)
                }
            };
            if result.is_err() {
                break;
            }
        }
        // The group is always closed, even after a failed call.
        let end = lib.group_end();
        result.and(end)
    }

    /// Enqueues one collective of `send_count`/`recv_count` f32 elements.
    fn enqueue(
        &self,
        c: Collective,
        send: &DevBuf,
        recv: &DevBuf,
        send_count: usize,
        recv_count: usize,
    ) -> Result<(), CudaError> {
        let f32t = ns::ncclDataType_t::ncclFloat32;
        let sum = ns::ncclRedOp_t::ncclSum;
        let (s, r) = (send.ptr as *const c_void, recv.ptr as *mut c_void);
        let (lib, comm, st) = (self.lib, self.comm, self.stream());
        // SAFETY: device buffers of this GPU, sized by `counts` for this collective.
        unsafe {
            match c {
                Collective::AllReduce => lib.all_reduce(s, r, recv_count, f32t, sum, comm, st),
                Collective::AllGather => lib.all_gather(s, r, send_count, f32t, comm, st),
                Collective::ReduceScatter => {
                    lib.reduce_scatter(s, r, recv_count, f32t, sum, comm, st)
                }
                Collective::Broadcast => lib.broadcast(s, r, recv_count, f32t, 0, comm, st),
                Collective::AllToAll => {
                    let per = send_count / self.ranks.max(1);
                    lib.group_start()?;
                    let mut result = Ok(());
                    for peer in 0..self.ranks {
                        let off = (peer * per * 4) as u64;
                        let sp = (send.ptr + off) as *const c_void;
                        let rp = (recv.ptr + off) as *mut c_void;
                        result = lib
                            .send(sp, per, f32t, peer as i32, comm, st)
                            .and_then(|_| lib.recv(rp, per, f32t, peer as i32, comm, st));
                        if result.is_err() {
                            break;
                        }
                    }
                    // The group is always closed, even after a failed call.
                    let end = lib.group_end();
                    result.and(end)
                }
            }
        }
    }

    /// Measures `c` at `bytes`: `iters` timed operations after a warm-up, each preceded by
    /// `barrier`; returns this rank's seconds per operation (the caller takes the maximum over
    /// ranks) after checking the result against the CPU's expectation.
    pub fn measure(
        &self,
        c: Collective,
        bytes: usize,
        iters: usize,
        barrier: &mut dyn FnMut(),
    ) -> Result<Vec<f64>, CudaError> {
        let Some((sc, rc)) = c.counts(bytes, self.ranks) else {
            return Ok(Vec::new());
        };
        let send = self.gpu.upload(&send_data(c, self.rank, self.ranks, sc))?;
        let recv = self.gpu.alloc(rc * 4)?;
        self.gpu.zero(&recv)?;
        let times = crate::driver::sample(
            &mut AfterBarrier {
                gpu: &self.gpu,
                barrier,
            },
            1,
            iters,
            &mut || Ok(()),
            &mut || self.enqueue(c, &send, &recv, sc, rc),
        )?;
        let got: Vec<f32> = self.gpu.download(&recv)?;
        if let Some((i, g, w)) = first_difference(&got, &expected(c, self.rank, self.ranks, rc)) {
            return Err(CudaError::Check(format!(
                "NCCL {} of {bytes} B on rank {}: element {i} is {g}, expected {w}",
                c.name(),
                self.rank
            )));
        }
        Ok(times)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tuning_lines_are_parsed() {
        let log = "host:123:456 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 1 proto 2 time 34.500000\n\
                   host:123:456 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo 1 proto 2 time 34.500000\n\
                   host:123:456 [0] NCCL INFO AllGather: 1024 Bytes -> Algo 4 proto 0 time 5.0\n\
                   host:123:456 [0] NCCL INFO Channel 00/02 : 0 1\n";
        let t = parse_tuning(log);
        assert_eq!(
            t,
            vec![
                ("AllReduce 4194304 B".to_string(), "Ring/Simple".to_string()),
                ("AllGather 1024 B".to_string(), "NVLS/LL".to_string()),
            ]
        );
    }

    /// NCCL 2.19 on (2.28 included) writes the algorithm and protocol by name
    /// (`ncclAlgoToString`, `ncclProtoToString`), in capitals, with the channel range after.
    #[test]
    fn tuning_lines_by_name_are_parsed() {
        let log = "h:1:2 [0] NCCL INFO AllReduce: 4194304 Bytes -> Algo RING proto SIMPLE channel{Lo..Hi}={0..31}\n\
                   h:1:2 [0] NCCL INFO AllReduce: 8 Bytes -> Algo TREE proto LL channel{Lo..Hi}={0..0}\n\
                   h:1:2 [0] NCCL INFO AllGather: 1048576 Bytes -> Algo NVLS_TREE proto LL128 channel{Lo..Hi}={0..15}\n\
                   h:1:2 [0] NCCL INFO ReduceScatter: 65536 Bytes -> Algo COLLNET_DIRECT proto Simple channel{Lo..Hi}={0..1} comm 0x55a7\n\
                   h:1:2 [0] NCCL INFO Broadcast: 64 Bytes -> Algo WARP proto LL channel{Lo..Hi}={0..0}\n";
        assert_eq!(
            parse_tuning(log),
            vec![
                ("AllReduce 4194304 B".to_string(), "Ring/Simple".to_string()),
                ("AllReduce 8 B".to_string(), "Tree/LL".to_string()),
                (
                    "AllGather 1048576 B".to_string(),
                    "NVLSTree/LL128".to_string()
                ),
                (
                    "ReduceScatter 65536 B".to_string(),
                    "CollNetDirect/Simple".to_string()
                ),
            ]
        );
    }

    #[test]
    fn without_nccl_the_error_says_what_to_do() {
        use crate::cuda::libs::{self, Lib};
        if libs::present(Lib::Nccl) {
            return;
        }
        let err = unique_id().unwrap_err().to_string();
        assert!(
            err.contains("NCCL")
                && err.contains("libnccl.so.2")
                && err.contains("nvidia-nccl-cu13"),
            "{err}"
        );
    }

    #[test]
    fn version_codes_of_both_schemes_are_read() {
        assert_eq!(version_string(22105), "2.21.5");
        assert_eq!(version_string(22803), "2.28.3");
        assert_eq!(version_string(2804), "2.8.4");
    }
}
