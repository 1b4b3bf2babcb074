//! What a gate can see: the smallest regression each kind of figure would show, in words
//! ("FMA 6%, L1 14%; cannot see 30% on this runner: DRAM 65%"), so that a green gate says how
//! large a regression it could have missed.

use super::{Comparison, Report, Verdict};

/// The kind of figure an id is, as a reader names it: `FMA`, `GEMM`, `conv`, `L1` … `DRAM`,
/// `GPU compute`, `GPU memory`, `GPU links`, `network`, `links`, `storage`, and the result
/// kinds (`placement`, `score`, `AutoML`); a node's prefix is left off.
pub fn family(id: &str) -> String {
    let bare = id
        .strip_prefix("node")
        .and_then(|r| r.split_once('/'))
        .filter(|(n, _)| n.chars().all(|c| c.is_ascii_digit()))
        .map_or(id, |(_, r)| r);
    let parts: Vec<&str> = bare.split('/').collect();
    let name = match parts.as_slice() {
        ["cpu", "fma", ..] => "FMA",
        ["cpu", "gemm", ..] => "GEMM",
        ["cpu", "conv", ..] => "conv",
        ["cpu", "mem", level, ..] => return level.to_string(),
        ["gpu-link", ..] => "GPU links",
        [g, "mem", ..] if g.starts_with("gpu") => "GPU memory",
        [g, ..] if g.starts_with("gpu") => "GPU compute",
        ["net", ..] => "network",
        ["link", ..] => "links",
        ["io", ..] => "storage",
        ["agg", ..] => "aggregates",
        ["automl", ..] => "AutoML",
        [first, ..] => return first.to_string(),
        [] => "",
    };
    name.to_string()
}

/// One kind of figure's reach: the largest of its ids' smallest detectable regressions.
#[derive(Clone, Debug, PartialEq)]
pub struct Reach {
    pub family: String,
    /// The largest smallest-detectable regression among its ids (the weakest of them).
    pub detectable: f64,
    /// Ids of this kind, and how many of them cannot see [`super::noise::BLIND`].
    pub ids: usize,
    pub blind: usize,
}

/// Every kind of figure compared, in the order first seen.
pub fn reach(r: &Report) -> Vec<Reach> {
    let mut out: Vec<Reach> = Vec::new();
    for c in &r.comparisons {
        let f = family(&c.id);
        let blind = usize::from(c.verdict == Verdict::Noisy);
        match out.iter_mut().find(|x| x.family == f) {
            Some(x) => {
                x.detectable = x.detectable.max(c.detectable);
                x.ids += 1;
                x.blind += blind;
            }
            None => out.push(Reach {
                family: f,
                detectable: c.detectable,
                ids: 1,
                blind,
            }),
        }
    }
    out
}

fn pct(x: f64) -> String {
    if x >= 10.0 {
        "over 1000%".into()
    } else {
        format!("{:.0}%", 100.0 * x)
    }
}

/// The reach in one sentence: what is caught from which size, and what cannot be seen.
pub fn sentence(r: &Report) -> String {
    let all = reach(r);
    let seen: Vec<String> = all
        .iter()
        .filter(|x| x.blind < x.ids)
        .map(|x| {
            // A kind with some blind ids: the reach of the ones gated.
            let worst = r
                .comparisons
                .iter()
                .filter(|c| family(&c.id) == x.family && c.verdict != Verdict::Noisy)
                .map(|c: &Comparison| c.detectable)
                .fold(0.0, f64::max);
            format!("{} {}", x.family, pct(worst))
        })
        .collect();
    let blind: Vec<String> = all
        .iter()
        .filter(|x| x.blind > 0)
        .map(|x| {
            let worst = r
                .comparisons
                .iter()
                .filter(|c| family(&c.id) == x.family && c.verdict == Verdict::Noisy)
                .map(|c| c.detectable)
                .fold(0.0, f64::max);
            let part = if x.blind < x.ids {
                format!(" ({} of {} ids)", x.blind, x.ids)
            } else {
                String::new()
            };
            format!("{}{part} only {} or more", x.family, pct(worst))
        })
        .collect();
    let mut s = String::new();
    if !seen.is_empty() {
        s += &format!(
            "regressions caught 19 times in 20 from: {}",
            seen.join(", ")
        );
    }
    if !blind.is_empty() {
        if !s.is_empty() {
            s += "; ";
        }
        s += &format!(
            "not gated, they cannot see 30% on this runner: {}",
            blind.join(", ")
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families() {
        assert_eq!(family("cpu/fma/f64/t1"), "FMA");
        assert_eq!(family("node2/cpu/mem/L1/read/all"), "L1");
        assert_eq!(family("cpu/mem/DRAM/triad/t1"), "DRAM");
        assert_eq!(family("gpu0/mem/HBM/triad"), "GPU memory");
        assert_eq!(family("gpu1/mma/bf16"), "GPU compute");
        assert_eq!(family("gpu-link/node0-node1/bandwidth"), "GPU links");
        assert_eq!(family("placement/resnet50/step"), "placement");
        assert_eq!(family("automl/flops"), "AutoML");
    }
}
