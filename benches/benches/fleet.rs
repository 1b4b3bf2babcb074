//! What fleet screening and the link matrix's judgement cost rank 0 on a 512-node cluster:
//! every node's ceilings (the CPU set a quick probe writes: 30) screened against the fleet's
//! medians, and the 130,816 links of 511 rounds judged against the median link. The
//! measurements themselves (the node probes, the link rounds) are not here: they are timed by
//! the probe (`fleet.links.seconds`).

use criterion::{black_box, criterion_group, criterion_main, Criterion};
use roofline_model::fleet::{screen, Conditions};
use roofline_model::links::{rounds, Link, LinkMatrix};
use roofline_model::{Ceiling, CeilingId, CeilingKind, NodeCeilings, PerIteration, Stats};

const NODES: usize = 512;

fn ids() -> Vec<&'static str> {
    vec![
        "cpu/fma/f64/t1",
        "cpu/fma/f64/all",
        "cpu/fma/f32/t1",
        "cpu/fma/f32/all",
        "cpu/fma/bf16/t1",
        "cpu/fma/bf16/all",
        "cpu/fma/int8/t1",
        "cpu/fma/int8/all",
        "cpu/gemm/f64/t1",
        "cpu/gemm/f64/all",
        "cpu/gemm/f32/t1",
        "cpu/gemm/f32/all",
        "cpu/mem/L1/triad/t1",
        "cpu/mem/L2/triad/t1",
        "cpu/mem/DRAM/triad/all",
    ]
}

/// Node `n`'s ceilings: 5 samples each, node 7 a fifth slow.
fn node(n: usize) -> NodeCeilings {
    let ceilings = ids()
        .into_iter()
        .enumerate()
        .map(|(i, id)| {
            let base = 1e11 * (1.0 + i as f64) * if n == 7 { 0.8 } else { 1.0 };
            let samples: Vec<f64> = (0..5)
                .map(|k| base * (1.0 - 0.002 * ((n * 7 + k * 3) % 5) as f64))
                .collect();
            let kind = if id.contains("/mem/") {
                CeilingKind::Memory
            } else {
                CeilingKind::Compute
            };
            let unit = if kind == CeilingKind::Memory {
                "B/s"
            } else {
                "FLOP/s"
            };
            Ceiling::measured(
                CeilingId::parse(id).expect("a valid id"),
                kind,
                unit,
                1,
                Stats::from_samples(&samples).expect("finite samples"),
                PerIteration {
                    ops: 1.0,
                    bytes: 1.0,
                },
                String::new(),
            )
        })
        .collect();
    NodeCeilings {
        node: n,
        host: format!("node{n:03}"),
        ceilings,
    }
}

fn links() -> Vec<Link> {
    let s = |v: f64| Stats::from_samples(&[v, v * 1.01, v * 0.99]).expect("finite samples");
    rounds(NODES)
        .into_iter()
        .enumerate()
        .flat_map(|(r, pairs)| {
            pairs.into_iter().map(move |(a, b)| {
                let bw = if a == 7 || b == 7 { 6e9 } else { 12e9 };
                Link {
                    a: a.min(b),
                    b: a.max(b),
                    round: r,
                    latency: s(2e-6),
                    bandwidth_ab: s(bw),
                    bandwidth_ba: s(bw),
                    again: None,
                    in_round: None,
                }
            })
        })
        .collect()
}

fn fleet(c: &mut Criterion) {
    let nodes: Vec<NodeCeilings> = (0..NODES).map(node).collect();
    let conditions = vec![Conditions::default(); NODES];
    let f = screen(&nodes, &conditions, 0.10);
    assert_eq!(f.named_nodes(), vec![7], "the slow node is found");
    c.bench_function("fleet screen, 512 nodes × 15 ceilings", |b| {
        b.iter(|| screen(black_box(&nodes), &conditions, 0.10))
    });
    let l = links();
    let hosts: Vec<String> = (0..NODES).map(|n| format!("node{n:03}")).collect();
    c.bench_function("link matrix judged, 512 nodes (130,816 links)", |b| {
        b.iter(|| {
            LinkMatrix::judge(
                hosts.clone(),
                String::new(),
                1 << 22,
                NODES - 1,
                0.0,
                black_box(l.clone()),
                0.10,
            )
        })
    });
}

criterion_group! {
    name = benches;
    config = Criterion::default().sample_size(10);
    targets = fleet
}
criterion_main!(benches);
