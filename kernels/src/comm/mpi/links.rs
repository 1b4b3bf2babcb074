//! The link matrix: latency and bandwidth between every pair of nodes (their lowest ranks, on
//! the inter-node communicator), in the rounds of disjoint pairs of
//! `roofline_model::links::rounds` — n − 1 rounds for n nodes, all pairs of a round at once —
//! so that the matrix takes time linear in the nodes. Every round starts with an arrival check
//! that names a node that never came (with its host and its partner of that round); every
//! transfer runs under the watchdog with the pair and their hosts as its label; every message's
//! bytes are checked. The root is handed the links measured so far before each round, to keep
//! them (a hang or a dead node loses nothing measured).

use super::p2p::{pattern, window_exchange};
use super::*;
use roofline_model::links::{rounds, Link, LinkMatrix};

/// How the links are measured.
pub struct LinkConfig {
    /// Bytes of one bandwidth message.
    pub bytes: usize,
    pub quick: bool,
    /// The fleet's margin: a link short of the median link by more than it (plus its noise)
    /// is measured again.
    pub margin: f64,
}

/// What the root gets: the links, the rounds and their wall time.
pub struct LinkRun {
    pub links: Vec<Link>,
    pub rounds: usize,
    pub seconds: f64,
    /// Pairs took turns inside a round (pretend nodes share one host's cores).
    pub in_turns: bool,
    /// Bytes of one bandwidth message.
    pub bytes: usize,
}

/// What one rank measured in a round, for the root: the pair, the latency (the pair's lower
/// node only) and the bandwidth of the direction it sent.
struct Half {
    a: usize,
    b: usize,
    latency: Vec<f64>,
    sent: Vec<f64>,
}

impl Half {
    fn to_bytes(&self) -> Vec<u8> {
        let mut v = vec![
            self.a as f64,
            self.b as f64,
            self.latency.len() as f64,
            self.sent.len() as f64,
        ];
        v.extend(&self.latency);
        v.extend(&self.sent);
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn from_bytes(b: &[u8]) -> Option<Half> {
        let v: Vec<f64> = b
            .chunks_exact(8)
            .map(|c| f64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
            .collect();
        let (nl, ns) = (*v.get(2)? as usize, *v.get(3)? as usize);
        if v.len() != 4 + nl + ns {
            return None;
        }
        Some(Half {
            a: v[0] as usize,
            b: v[1] as usize,
            latency: v[4..4 + nl].to_vec(),
            sent: v[4 + nl..].to_vec(),
        })
    }
}

impl World {
    /// Each node's name for messages and the matrix: its host, or with pretend nodes (all on
    /// one host) the host and the node's number.
    pub fn node_names(&self) -> Vec<String> {
        let hosts = self.cluster_info().hosts;
        if self.layout.fake {
            hosts
                .iter()
                .enumerate()
                .map(|(k, h)| format!("{h}#{k}"))
                .collect()
        } else {
            hosts
        }
    }

    /// The link rounds. Every rank calls it; the root gets the links (None elsewhere, and for
    /// a world of one node). `keep(links, round, rounds)` is called on the root before each
    /// round and after the last.
    pub fn link_rounds(
        &self,
        cfg: &LinkConfig,
        progress: &dyn crate::probe::Progress,
        keep: &mut dyn FnMut(&[Link], usize, usize),
    ) -> Result<Option<LinkRun>, CommError> {
        self.rounds_with(cfg, progress, keep, &mut HostLinks)
    }

    /// The link rounds over `transport` (MPI between host buffers, or NCCL between GPUs):
    /// the schedule's rounds, then each link that read slow measured again in a round of its
    /// own (at most as many rounds again as the schedule has, the farthest short first),
    /// keeping the better of its two figures ([`Link::better_of`]): one unlucky reading names
    /// no link.
    pub(super) fn rounds_with(
        &self,
        cfg: &LinkConfig,
        progress: &dyn crate::probe::Progress,
        keep: &mut dyn FnMut(&[Link], usize, usize),
        transport: &mut dyn Transport,
    ) -> Result<Option<LinkRun>, CommError> {
        let nodes = self.layout.nodes();
        let Some(inter) = self.inter.as_ref().filter(|_| nodes > 1) else {
            self.wait_all("the end of the link rounds");
            return Ok(None);
        };
        let names = self.node_names();
        let schedule = rounds(nodes);
        let start = Instant::now();
        let mut links = Vec::new();
        progress.begin(schedule.len() as u64);
        for (round, pairs) in schedule.iter().enumerate() {
            if self.is_root() {
                keep(&links, round, schedule.len());
            }
            let label = format!(
                "{}link round {} of {}",
                transport.prefix(),
                round + 1,
                schedule.len()
            );
            progress.advance(&format!(
                "{}links: round {} of {}",
                transport.prefix(),
                round + 1,
                schedule.len()
            ));
            links.extend(self.round(inter, &names, pairs, round, &label, cfg, transport)?);
        }
        // The slow ones again, each alone, at most as many rounds again as the schedule had.
        // One judgement: the typical link comes from the rounds' own figures, which a link
        // measured again keeps (`Link::round_value`), so measuring again only ever clears a
        // link, never names another.
        let mut total = schedule.len();
        let again = self.to_confirm(inter, &names, &links, cfg, schedule.len(), transport);
        if !again.is_empty() {
            progress.begin(again.len() as u64);
        }
        let planned = total + again.len();
        for (k, &pair) in again.iter().enumerate() {
            let round = total;
            total += 1;
            if self.is_root() {
                keep(&links, round, planned);
            }
            let label = format!(
                "{}link round {} of {planned} (a slow link measured again, alone)",
                transport.prefix(),
                round + 1,
            );
            progress.advance(&format!(
                "{}links: a slow link again, {} of {}",
                transport.prefix(),
                k + 1,
                again.len()
            ));
            for second in self.round(inter, &names, &[pair], round, &label, cfg, transport)? {
                if let Some(l) = links
                    .iter_mut()
                    .find(|l| (l.a, l.b) == (second.a, second.b))
                {
                    *l = l.better_of(&second);
                }
            }
        }
        if self.is_root() {
            keep(&links, total, total);
        }
        self.wait_all("the end of the link rounds");
        Ok(self.is_root().then(|| LinkRun {
            links,
            rounds: total,
            seconds: start.elapsed().as_secs_f64(),
            in_turns: self.layout.fake,
            bytes: cfg.bytes.max(1),
        }))
    }

    /// The pairs to measure again (at most `cap`), judged on the root from the links so far
    /// and told to every node of `inter`.
    fn to_confirm(
        &self,
        inter: &Group,
        names: &[String],
        links: &[Link],
        cfg: &LinkConfig,
        cap: usize,
        transport: &dyn Transport,
    ) -> Vec<(usize, usize)> {
        let mut encoded: Vec<u64> = Vec::new();
        if self.is_root() {
            let judged = LinkMatrix::judge(
                names.to_vec(),
                String::new(),
                cfg.bytes,
                0,
                0.0,
                links.to_vec(),
                cfg.margin,
            );
            encoded = judged
                .to_confirm(cap)
                .into_iter()
                .flat_map(|(a, b)| [a as u64, b as u64])
                .collect();
        }
        let mut count = encoded.len() as u64;
        watchdog::arm(&format!(
            "{}the links to measure again, from the root",
            transport.prefix()
        ));
        inter.comm.process_at_rank(0).broadcast_into(&mut count);
        encoded.resize(count as usize, 0);
        inter
            .comm
            .process_at_rank(0)
            .broadcast_into(&mut encoded[..]);
        watchdog::disarm();
        encoded
            .chunks_exact(2)
            .map(|p| (p[0] as usize, p[1] as usize))
            .collect()
    }

    /// One round on every node of `inter`: the arrival check, the `pairs` measured (at once,
    /// or in turns for pretend nodes), the halves gathered; the root gets the round's links
    /// (nothing elsewhere). `names`: the nodes' names (`node_names`, read once for all the
    /// rounds); `label` names the round for the watchdog and errors.
    #[allow(clippy::too_many_arguments)]
    fn round(
        &self,
        inter: &Group,
        names: &[String],
        pairs: &[(usize, usize)],
        round: usize,
        label: &str,
        cfg: &LinkConfig,
        transport: &mut dyn Transport,
    ) -> Result<Vec<Link>, CommError> {
        let me = inter.rank();
        let node_of_rank = |r: usize| self.layout.node_of.get(r).copied().unwrap_or(0);
        let partner = |n: usize| {
            pairs
                .iter()
                .find(|(a, b)| *a == n || *b == n)
                .map(|&(a, b)| if a == n { b } else { a })
        };
        let name = |r: usize| {
            let n = node_of_rank(r);
            let with = partner(n)
                .map(|p| format!(", to be paired with node {p} ({})", names[p]))
                .unwrap_or_default();
            format!("rank {r} (node {n}, {}{with})", names[n])
        };
        arrival_named(inter, label, self.timeout, &name)?;
        // Pretend nodes share one host's cores: their pairs take turns.
        let turns: Vec<&[(usize, usize)]> = if self.layout.fake {
            pairs.chunks(1).collect()
        } else {
            vec![pairs]
        };
        let mut half = None;
        for turn in turns {
            if let Some(&(a, b)) = turn.iter().find(|(a, b)| *a == me || *b == me) {
                let pair = format!(
                    "{label}: node {a} ({}) and node {b} ({})",
                    names[a], names[b]
                );
                half = Some(measure_pair(inter, me, a, b, cfg, &pair, transport)?);
            }
            if self.layout.fake {
                relaxed_barrier(&inter.comm, label, None);
            }
        }
        watchdog::arm(&format!("gathering the results of {label}"));
        let bytes = half.as_ref().map(Half::to_bytes).unwrap_or_default();
        let gathered = self.gather_from_leaders(&bytes);
        watchdog::disarm();
        let mut links = Vec::new();
        let Some(all) = gathered else {
            return Ok(links);
        };
        let halves: Vec<Half> = all.iter().filter_map(|b| Half::from_bytes(b)).collect();
        for &(a, b) in pairs {
            let from_a = halves
                .iter()
                .find(|h| h.a == a && h.b == b && !h.latency.is_empty());
            let from_b = halves
                .iter()
                .find(|h| h.a == a && h.b == b && h.latency.is_empty());
            let (Some(ha), Some(hb)) = (from_a, from_b) else {
                return Err(CommError::WrongResult(format!(
                    "{label}: the results of node {a} ({}) and node {b} ({}) did not both arrive",
                    names[a], names[b]
                )));
            };
            let stats = |v: &[f64], what: &str| {
                Stats::from_samples(v).ok_or_else(|| {
                    CommError::WrongResult(format!(
                        "{label}: node {a} and node {b}: no valid {what} sample"
                    ))
                })
            };
            links.push(Link {
                a,
                b,
                round,
                latency: stats(&ha.latency, "latency")?,
                bandwidth_ab: stats(&ha.sent, "bandwidth")?,
                bandwidth_ba: stats(&hb.sent, "bandwidth")?,
                again: None,
                in_round: None,
            });
        }
        Ok(links)
    }
}

/// How one pair's bytes travel: MPI between host buffers ([`HostLinks`]), or NCCL between
/// GPUs (`gpu_links`). Peers are nodes: ranks of the inter-node communicator `inter`.
pub(super) trait Transport {
    /// Put before the progress line and the watchdog's labels ("" or "GPU ").
    fn prefix(&self) -> &'static str;
    /// `rounds` half round trips of 8 B with `peer`, seconds, on the side that sends first
    /// (`first`); nothing on the other.
    fn ping_pong(
        &mut self,
        inter: &Group,
        first: bool,
        peer: usize,
        rounds: usize,
    ) -> Result<Vec<f64>, CommError>;
    /// One direction: one untimed and `samples` timed windows of `bytes`-byte messages to
    /// (`sending`) or from `peer`, the bytes checked where they arrive and the verdict told to
    /// both sides; the sender gets B/s per timed window. `Ok((_, false))`: bytes arrived wrong.
    fn one_way(
        &mut self,
        inter: &Group,
        sending: bool,
        peer: usize,
        bytes: usize,
        samples: usize,
    ) -> Result<(Vec<f64>, bool), CommError>;
}

/// MPI point to point between host buffers.
pub(super) struct HostLinks;

impl Transport for HostLinks {
    fn prefix(&self) -> &'static str {
        ""
    }

    fn ping_pong(
        &mut self,
        inter: &Group,
        first: bool,
        peer: usize,
        rounds: usize,
    ) -> Result<Vec<f64>, CommError> {
        ping_pong(inter.comm.as_raw(), first, peer as c_int, rounds)
    }

    fn one_way(
        &mut self,
        inter: &Group,
        sending: bool,
        peer: usize,
        bytes: usize,
        samples: usize,
    ) -> Result<(Vec<f64>, bool), CommError> {
        let window = (64usize << 20).checked_div(bytes).unwrap_or(1).clamp(1, 16);
        let send: Vec<u8> = (0..bytes).map(|i| pattern(bytes, i)).collect();
        let mut recv = vec![0u8; bytes * window];
        let role = if sending { 0 } else { 1 };
        let comm = inter.comm.as_raw();
        let mut rates = Vec::new();
        for it in 0..samples + 1 {
            let t0 = mpi::time();
            let ok = window_exchange(comm, role, peer as c_int, &send, &mut recv, window, false)?;
            let t = mpi::time() - t0;
            if !ok {
                return Ok((rates, false));
            }
            if it > 0 && sending {
                rates.push((bytes * window) as f64 / t);
            }
        }
        Ok((rates, true))
    }
}

/// One pair: the latency (half round trips of 8 B, from `a`), then `cfg.bytes` messages from
/// a to b and from b to a, checked where they arrive. `me` is this rank's node (a or b);
/// `label` names the pair and their hosts.
fn measure_pair(
    inter: &Group,
    me: usize,
    a: usize,
    b: usize,
    cfg: &LinkConfig,
    label: &str,
    transport: &mut dyn Transport,
) -> Result<Half, CommError> {
    let peer = if me == a { b } else { a };
    watchdog::arm(&format!("{label}: latency"));
    let latency = transport.ping_pong(inter, me == a, peer, if cfg.quick { 100 } else { 500 })?;
    watchdog::disarm();
    let bytes = cfg.bytes.max(1);
    let samples = if cfg.quick { 3 } else { 5 };
    let mut sent = Vec::new();
    for (from, to) in [(a, b), (b, a)] {
        watchdog::arm(&format!(
            "{label}: {} from node {from} to node {to}",
            human(bytes)
        ));
        let (rates, ok) = transport.one_way(inter, me == from, peer, bytes, samples)?;
        if !ok {
            return Err(CommError::WrongResult(format!(
                "{label}: a {} message from node {from} to node {to} arrived wrong",
                human(bytes)
            )));
        }
        if me == from {
            sent = rates;
        }
        watchdog::disarm();
    }
    Ok(Half {
        a,
        b,
        latency,
        sent,
    })
}

/// `rounds` ping-pongs of 8 B with `peer` after 10 untimed ones: the side that sends first
/// gets each one's half round trip (seconds), the other side nothing.
pub(super) fn ping_pong(
    comm: ffi::MPI_Comm,
    first: bool,
    peer: c_int,
    rounds: usize,
) -> Result<Vec<f64>, CommError> {
    let mut small = [0u8; 8];
    let mut out = Vec::new();
    for i in 0..rounds + 10 {
        let t0 = mpi::time();
        if first {
            send_bytes(comm, &small, peer, TAG_DATA)?;
            recv_bytes(comm, &mut small, peer, TAG_DATA)?;
            if i >= 10 {
                out.push((mpi::time() - t0) / 2.0);
            }
        } else {
            recv_bytes(comm, &mut small, peer, TAG_DATA)?;
            send_bytes(comm, &small, peer, TAG_DATA)?;
        }
    }
    Ok(out)
}
