//! Communication ceilings: collectives and point-to-point transfers between ranks (MPI on host
//! memory; NCCL on device memory), in three scopes — inside a node, between nodes, the whole
//! world. This module holds what needs no MPI: the collectives' definitions, the bus-bandwidth
//! factors of nccl-tests, the size sweep, the data each rank sends and the result it must get.
//! The MPI driver is `comm::mpi` (cargo feature `mpi`).

#[cfg(feature = "mpi")]
pub mod mpi;
pub mod nccl;
pub mod watchdog;

/// Sums across the ranks of a data-parallel run (MPI allreduce); a single process is a world of
/// one, where summing changes nothing.
pub trait Reducer: Send + Sync {
    fn ranks(&self) -> usize;
    fn rank(&self) -> usize;
    /// Element-wise sum over ranks, in place.
    fn sum_f64(&self, v: &mut [f64]);
    fn sum_f32(&self, v: &mut [f32]);
    /// Sends `send` to rank `to` while receiving `recv.len()` values from rank `from` (one
    /// MPI_Sendrecv): the hops of the compressed gradient ring.
    fn exchange_u16(&self, to: usize, send: &[u16], from: usize, recv: &mut [u16]);
    /// Nodes the ranks run on (communication inside a node and between nodes differ).
    fn nodes(&self) -> usize {
        1
    }
    /// Rank 0's `bytes` on every rank: a sum in which the other ranks add zeros (exact for
    /// bytes in f64). The CUDA path sends NCCL's unique id this way.
    fn broadcast(&self, bytes: &mut [u8]) {
        let root = self.rank() == 0;
        let mut v: Vec<f64> = bytes
            .iter()
            .map(|&b| if root { b as f64 } else { 0.0 })
            .collect();
        self.sum_f64(&mut v);
        for (b, x) in bytes.iter_mut().zip(v) {
            *b = x as u8;
        }
    }
}

/// A collective operation, and which ranks a measurement spans: the model's types (the ids
/// of the ceilings they make are spelt in one place).
pub use roofline_model::ceiling_id::{Collective, Scope};
pub use roofline_model::launcher::{Launch, LaunchedBy};

/// Message sizes: 8 B doubling to `max` (inclusive when a power of two).
pub fn sizes(max: usize) -> Vec<usize> {
    let mut v = Vec::new();
    let mut s = 8usize;
    while s <= max {
        v.push(s);
        s *= 2;
    }
    v
}

/// Repetitions per size: many for small messages, a few for large ones.
pub fn iterations(bytes: usize, quick: bool) -> usize {
    let want = (256usize << 20) / bytes.max(1);
    // At least 10 even when quick: the ceiling is the best iteration, and fewer samples of a
    // noisy shared-memory transfer pull it down.
    if quick {
        want.clamp(10, 40)
    } else {
        want.clamp(10, 200)
    }
}

/// Small integers (exact in f32 sums over thousands of ranks).
fn v(rank: usize, i: usize) -> f32 {
    ((rank * 7 + i * 3) % 17) as f32
}

/// Element `j` of rank `s`'s alltoall send buffer (`per` elements per destination): block d
/// goes to rank d and says where it came from and where it goes.
fn a2a(s: usize, ranks: usize, per: usize, j: usize) -> f32 {
    let per = per.max(1);
    ((s * ranks + j / per) % 4093) as f32 + (j % per % 3) as f32 * 8192.0
}

/// What rank `rank` of `ranks` sends, `count` elements.
pub fn send_data(c: Collective, rank: usize, ranks: usize, count: usize) -> Vec<f32> {
    match c {
        Collective::AllToAll => {
            let per = count / ranks.max(1);
            (0..count).map(|j| a2a(rank, ranks, per, j)).collect()
        }
        _ => (0..count).map(|i| v(rank, i)).collect(),
    }
}

/// What rank `rank` must hold after the collective (broadcast root: rank 0).
pub fn expected(c: Collective, rank: usize, ranks: usize, recv_count: usize) -> Vec<f32> {
    match c {
        Collective::AllReduce => (0..recv_count)
            .map(|i| (0..ranks).map(|r| v(r, i)).sum())
            .collect(),
        Collective::Broadcast => (0..recv_count).map(|i| v(0, i)).collect(),
        Collective::AllGather => {
            let per = recv_count / ranks.max(1);
            (0..recv_count)
                .map(|i| v(i / per.max(1), i % per.max(1)))
                .collect()
        }
        Collective::ReduceScatter => (0..recv_count)
            .map(|i| (0..ranks).map(|r| v(r, rank * recv_count + i)).sum())
            .collect(),
        Collective::AllToAll => {
            // Block s of the result came from rank s: it is block `rank` of s's send buffer.
            let per = recv_count / ranks.max(1);
            (0..recv_count)
                .map(|i| a2a(i / per.max(1), ranks, per, rank * per + i % per.max(1)))
                .collect()
        }
    }
}

/// The first index where `got` differs from `want`, with both values.
pub fn first_difference(got: &[f32], want: &[f32]) -> Option<(usize, f32, f32)> {
    if got.len() != want.len() {
        return Some((got.len().min(want.len()), f32::NAN, f32::NAN));
    }
    got.iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .map(|i| (i, got[i], want[i]))
}

/// Where the ranks of this process's world live: the node identity of every rank.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// Node index of every world rank (nodes numbered by their lowest rank).
    pub node_of: Vec<usize>,
    pub fake: bool,
}

impl Layout {
    /// Nodes from host names (one per distinct host), or, with `fake_nodes = Some(k)`
    /// (`ROOFLINE_FAKE_NODES`), k nodes of consecutive ranks.
    pub fn new(hosts: &[String], fake_nodes: Option<usize>) -> Layout {
        let n = hosts.len();
        if let Some(k) = fake_nodes.filter(|k| *k >= 1) {
            let per = n.div_ceil(k.min(n.max(1)));
            return Layout {
                node_of: (0..n).map(|r| r / per.max(1)).collect(),
                fake: true,
            };
        }
        let mut seen: Vec<&String> = Vec::new();
        let node_of = hosts
            .iter()
            .map(|h| match seen.iter().position(|s| *s == h) {
                Some(i) => i,
                None => {
                    seen.push(h);
                    seen.len() - 1
                }
            })
            .collect();
        Layout {
            node_of,
            fake: false,
        }
    }

    pub fn nodes(&self) -> usize {
        self.node_of.iter().max().map_or(0, |m| m + 1)
    }

    pub fn ranks_on(&self, node: usize) -> Vec<usize> {
        (0..self.node_of.len())
            .filter(|r| self.node_of[*r] == node)
            .collect()
    }

    /// The lowest rank of each node, in node order.
    pub fn leaders(&self) -> Vec<usize> {
        (0..self.nodes())
            .filter_map(|n| self.ranks_on(n).first().copied())
            .collect()
    }
}

/// `ROOFLINE_FAKE_NODES`: pretend the ranks are spread over this many nodes (tests on one host).
pub fn fake_nodes_from_env() -> Result<Option<usize>, String> {
    match std::env::var("ROOFLINE_FAKE_NODES") {
        Err(_) => Ok(None),
        Ok(s) => s
            .trim()
            .parse::<usize>()
            .ok()
            .filter(|k| *k >= 1)
            .map(Some)
            .ok_or_else(|| format!("ROOFLINE_FAKE_NODES={s}: expected a number of nodes ≥ 1")),
    }
}

/// Whether this process was started by an MPI launcher with more than one rank (whatever MPI
/// support this binary was built with): the world's size ([`Launch`]).
pub fn launched_ranks() -> Option<usize> {
    Launch::here().map(|l| l.size)
}

/// This process's rank as the launcher set it (before any MPI call), when under a launcher.
pub fn launched_rank() -> Option<usize> {
    Launch::here().map(|l| l.rank)
}

/// The launcher's local rank (the GPU a rank takes by default); 0 outside a launch.
pub fn local_rank() -> usize {
    Launch::here().map_or(0, |l| l.local_rank)
}

/// The first two local ranks whose GPUs have the same identity (a UUID, zero-padded; all
/// zeros: no GPU), if any: two ranks on one GPU, which `ncclCommInitRank` refuses.
pub fn shared_gpu(keys: &[[u8; 64]]) -> Option<(usize, usize)> {
    for (a, ka) in keys.iter().enumerate() {
        if ka.iter().all(|b| *b == 0) {
            continue;
        }
        if let Some(b) = keys[a + 1..].iter().position(|kb| kb == ka) {
            return Some((a, a + 1 + b));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Two local ranks that see the same single GPU are found (each sees it as ordinal 0, so
    /// only the UUID tells); ranks without a GPU (all zeros) never match.
    #[test]
    fn two_ranks_on_one_gpu_are_found_by_uuid() {
        let key = |s: &str| -> [u8; 64] {
            let mut k = [0u8; 64];
            k[..s.len()].copy_from_slice(s.as_bytes());
            k
        };
        let a = key("GPU-00010203-0405-0607-0809-0a0b0c0d0e0f");
        let b = key("GPU-ffffffff-0405-0607-0809-0a0b0c0d0e0f");
        assert_eq!(shared_gpu(&[a, b]), None);
        assert_eq!(shared_gpu(&[a, b, a]), Some((0, 2)));
        assert_eq!(shared_gpu(&[b, a, a]), Some((1, 2)));
        assert_eq!(shared_gpu(&[[0; 64], [0; 64], a]), None);
    }

    /// Simulates every collective on `ranks` ranks in memory and checks `expected`.
    fn simulate(c: Collective, ranks: usize, bytes: usize) {
        let Some((sc, rc)) = c.counts(bytes, ranks) else {
            return;
        };
        let sends: Vec<Vec<f32>> = (0..ranks).map(|r| send_data(c, r, ranks, sc)).collect();
        for rank in 0..ranks {
            let got: Vec<f32> = match c {
                Collective::AllReduce => {
                    (0..rc).map(|i| sends.iter().map(|s| s[i]).sum()).collect()
                }
                Collective::Broadcast => sends[0].clone(),
                Collective::AllGather => sends.iter().flat_map(|s| s.iter().copied()).collect(),
                Collective::ReduceScatter => (0..rc)
                    .map(|i| sends.iter().map(|s| s[rank * rc + i]).sum())
                    .collect(),
                Collective::AllToAll => {
                    let per = rc / ranks;
                    (0..ranks)
                        .flat_map(|s| sends[s][rank * per..(rank + 1) * per].to_vec())
                        .collect()
                }
            };
            assert_eq!(
                first_difference(&got, &expected(c, rank, ranks, rc)),
                None,
                "{c:?} {ranks} {bytes}"
            );
        }
    }

    #[test]
    fn expected_results_match_a_simulation_of_every_collective() {
        for c in Collective::ALL {
            for ranks in [1, 2, 3, 4, 7] {
                for bytes in [8, 64, 1000, 4096] {
                    simulate(c, ranks, bytes);
                }
            }
        }
    }

    #[test]
    fn a_wrong_result_is_found() {
        let mut got = expected(Collective::AllReduce, 0, 4, 100);
        got[37] += 1.0;
        assert_eq!(
            first_difference(&got, &expected(Collective::AllReduce, 0, 4, 100)).map(|d| d.0),
            Some(37)
        );
    }

    #[test]
    fn bus_factors_are_nccl_tests() {
        assert_eq!(Collective::AllReduce.bus_factor(8), 1.75);
        assert_eq!(Collective::AllGather.bus_factor(4), 0.75);
        assert_eq!(Collective::Broadcast.bus_factor(4), 1.0);
        assert_eq!(Collective::AllReduce.bus_factor(1), 0.0);
    }

    #[test]
    fn sizes_and_counts() {
        let s = sizes(256 << 20);
        assert_eq!(s.first(), Some(&8));
        assert_eq!(s.last(), Some(&(256 << 20)));
        assert_eq!(s.len(), 26);
        assert_eq!(Collective::AllGather.counts(8, 4), None);
        assert_eq!(Collective::AllGather.counts(64, 4), Some((4, 16)));
        assert_eq!(Collective::ReduceScatter.counts(64, 4), Some((16, 4)));
        assert_eq!(Collective::AllReduce.size_bytes(64, 3), Some(64));
        assert_eq!(Collective::AllToAll.size_bytes(64, 3), Some(60));
    }

    #[test]
    fn layout_by_host_and_fake() {
        let hosts: Vec<String> = ["a", "a", "b", "a", "b"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        let l = Layout::new(&hosts, None);
        assert_eq!(l.node_of, [0, 0, 1, 0, 1]);
        assert_eq!(l.leaders(), [0, 2]);
        assert_eq!(l.ranks_on(0), [0, 1, 3]);
        let f = Layout::new(&hosts[..4], Some(2));
        assert_eq!(f.node_of, [0, 0, 1, 1]);
        assert!(f.fake);
        assert_eq!(Layout::new(&hosts[..3], Some(2)).node_of, [0, 0, 1]);
    }
}
