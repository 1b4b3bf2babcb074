//! A node's GPU matrix, read off its copy ceilings: every ordered pair of GPUs by the copy
//! engine (`gpuA-gpuB/p2p`) and by the SMs (`…/p2p/sm`), so each way of each pair, and
//! the host to and from each GPU (`gpuN/h2d`, `gpuN/d2h`), each entry against its NVLink or
//! PCIe figure (the ceiling's theoretical peak). machine.json keeps the ceilings; this is the
//! table and the heat map's view of them (nvbandwidth's matrices, with the datasheet beside
//! every entry).

use crate::ceiling_id::{GpuCopy, PeerCopy};
use crate::{Ceiling, CeilingId};

/// One measured copy rate and the figure it is held to.
#[derive(Clone, Debug, PartialEq)]
pub struct Entry {
    /// B/s.
    pub value: f64,
    /// The NVLink or PCIe figure, B/s, where one is known.
    pub peak: Option<f64>,
    /// Where that figure comes from.
    pub source: Option<String>,
}

impl Entry {
    fn of(c: &Ceiling) -> Entry {
        let p = c
            .theoretical_peak
            .as_ref()
            .filter(|p| p.unit == c.unit && p.value > 0.0);
        Entry {
            value: c.value,
            peak: p.map(|p| p.value),
            source: p.map(|p| p.source.clone()),
        }
    }

    /// The fraction of the figure reached.
    pub fn fraction(&self) -> Option<f64> {
        self.peak.map(|p| self.value / p)
    }
}

/// The matrix of one node's GPUs.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuMatrix {
    /// The GPUs seen in any copy ceiling, in index order.
    pub gpus: Vec<usize>,
    /// (from, to, how, entry) for every one-way peer copy measured.
    pub peers: Vec<(usize, usize, PeerCopy, Entry)>,
    /// (gpu, direction, entry) for the pinned host copies (`H2d`, `D2h`).
    pub host: Vec<(usize, GpuCopy, Entry)>,
}

impl GpuMatrix {
    /// The one-way copies of `ceilings` (bidirectional and pageable ones are ceilings of
    /// their own, not entries); `None` when there are none.
    pub fn of(ceilings: &[Ceiling]) -> Option<GpuMatrix> {
        let mut gpus = Vec::new();
        let mut peers = Vec::new();
        let mut host = Vec::new();
        for c in ceilings {
            match &c.id {
                CeilingId::PeerCopy { from, to, copy } => {
                    if matches!(copy, PeerCopy::Engine | PeerCopy::Sm) {
                        peers.push((*from, *to, *copy, Entry::of(c)));
                        gpus.extend([*from, *to]);
                    }
                }
                CeilingId::Copy { gpu, copy } => {
                    if matches!(copy, GpuCopy::H2d | GpuCopy::D2h) {
                        host.push((*gpu, *copy, Entry::of(c)));
                        gpus.push(*gpu);
                    }
                }
                _ => {}
            }
        }
        if peers.is_empty() && host.is_empty() {
            return None;
        }
        gpus.sort_unstable();
        gpus.dedup();
        Some(GpuMatrix { gpus, peers, host })
    }

    /// The copy from `from` to `to` by `how`.
    pub fn peer(&self, from: usize, to: usize, how: PeerCopy) -> Option<&Entry> {
        self.peers
            .iter()
            .find(|(a, b, k, _)| *a == from && *b == to && *k == how)
            .map(|x| &x.3)
    }

    /// The pinned copy between the host and `gpu` in `direction` (`H2d` or `D2h`).
    pub fn host(&self, gpu: usize, direction: GpuCopy) -> Option<&Entry> {
        self.host
            .iter()
            .find(|(g, d, _)| *g == gpu && *d == direction)
            .map(|x| &x.2)
    }
}

/// A copy ceiling of one sample, `bytes_per_s`, against `peak` (its figure and the figure's
/// source): the matrix's input as its readers' examples and tests build it.
pub fn one_sample_copy(id: CeilingId, bytes_per_s: f64, peak: Option<(f64, &str)>) -> Ceiling {
    Ceiling::measured(
        id,
        crate::CeilingKind::Comm,
        "B/s",
        1,
        crate::Stats::from_samples(&[bytes_per_s]).expect("one finite sample"),
        crate::PerIteration {
            ops: 0.0,
            bytes: 1.0,
        },
        String::new(),
    )
    .with_peak(peak.map(|(value, source)| crate::TheoreticalPeak {
        value,
        unit: "B/s".into(),
        source: source.into(),
        uncertainty: 0.0,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn copy(id: &str, value: f64, peak: Option<f64>) -> Ceiling {
        one_sample_copy(
            CeilingId::parse(id).unwrap(),
            value,
            peak.map(|p| (p, "NVLink 4 × 18 links")),
        )
    }

    #[test]
    fn each_way_of_each_pair_and_the_host_against_their_figures() {
        let ceilings = vec![
            copy("gpu0-gpu1/p2p", 360e9, Some(450e9)),
            copy("gpu1-gpu0/p2p", 180e9, Some(450e9)),
            copy("gpu0-gpu1/p2p/sm", 400e9, Some(450e9)),
            copy("gpu0-gpu1/p2p/bidir", 700e9, Some(900e9)),
            copy("gpu0/h2d", 55e9, Some(64e9)),
            copy("gpu1/d2h", 50e9, None),
            copy("gpu1/h2d/pageable", 10e9, None),
        ];
        let m = GpuMatrix::of(&ceilings).unwrap();
        assert_eq!(m.gpus, vec![0, 1]);
        assert_eq!(m.peers.len(), 3, "one-way copies only");
        let e = m.peer(1, 0, PeerCopy::Engine).unwrap();
        assert_eq!(e.fraction(), Some(0.4));
        assert!(m.peer(1, 0, PeerCopy::Sm).is_none());
        assert_eq!(
            m.host(0, GpuCopy::H2d).unwrap().fraction(),
            Some(55.0 / 64.0)
        );
        assert_eq!(m.host(1, GpuCopy::D2h).unwrap().fraction(), None);
        assert!(m.host(1, GpuCopy::H2d).is_none());
        assert!(GpuMatrix::of(&[]).is_none());
    }
}
