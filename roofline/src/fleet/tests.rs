use super::*;
use crate::machine::{CeilingKind, PerIteration};
use crate::Stats;

fn ceiling(id: &str, unit: &str, samples: &[f64]) -> Ceiling {
    let stats = Stats::from_samples(samples).unwrap();
    Ceiling::measured(
        CeilingId::parse(id).unwrap(),
        if unit == "s" {
            CeilingKind::Comm
        } else {
            CeilingKind::Compute
        },
        unit,
        1,
        stats,
        PerIteration {
            ops: 1.0,
            bytes: 0.0,
        },
        "m".into(),
    )
}

fn node(i: usize, fma: f64, triad: f64) -> NodeCeilings {
    NodeCeilings {
        node: i,
        host: format!("n{i}"),
        ceilings: vec![
            ceiling("cpu/fma/f32/all", "FLOP/s", &[fma, fma * 0.99, fma * 0.995]),
            ceiling("cpu/mem/DRAM/triad/all", "B/s", &[triad, triad * 0.99]),
        ],
    }
}

fn clocks(all_hz: f64) -> Conditions {
    Conditions {
        clock_t1_hz: Some(3e9),
        clock_all_hz: Some(all_hz),
        ..Conditions::default()
    }
}

/// A node at half the fleet's FMA rate with half the clock is named on that ceiling with the
/// clock as its cause; its DRAM, at the fleet's rate, is not; a uniform fleet names nobody.
#[test]
fn a_slow_node_is_named_with_its_clock() {
    let nodes: Vec<NodeCeilings> = (0..4)
        .map(|i| node(i, if i == 2 { 50e9 } else { 100e9 }, 20e9))
        .collect();
    let cond: Vec<Conditions> = (0..4)
        .map(|i| clocks(if i == 2 { 1.5e9 } else { 3e9 }))
        .collect();
    let f = screen(&nodes, &cond, DEFAULT_MARGIN);
    assert_eq!(f.nodes, 4);
    assert_eq!(f.ceilings.len(), 2);
    assert_eq!(f.ceilings[0].median, 100e9);
    assert_eq!(f.outliers.len(), 1, "{:?}", f.outliers);
    let o = &f.outliers[0];
    assert_eq!((o.node, o.host.as_str()), (2, "n2"));
    assert_eq!(o.id.to_string(), "cpu/fma/f32/all");
    assert!((o.short_by - 0.5).abs() < 1e-12);
    assert_eq!(
        o.causes,
        vec![Cause::LowerClock {
            threads: Threads::All,
            clock_hz: 1.5e9,
            fleet_hz: 3e9
        }]
    );
    assert!(o.causes[0].to_string().contains("1.50 GHz"));
    assert_eq!(f.named_nodes(), vec![2]);

    let even: Vec<NodeCeilings> = (0..4)
        .map(|i| node(i, 100e9 * (1.0 - 0.01 * i as f64), 20e9))
        .collect();
    assert!(screen(&even, &[], DEFAULT_MARGIN).outliers.is_empty());
}

/// The margin is the stated one; the node's own noise is allowed on top; a time is short when
/// above the median; a ceiling on one node only is not screened.
#[test]
fn margin_noise_direction_and_coverage() {
    let mut nodes: Vec<NodeCeilings> = (0..3).map(|i| node(i, 100e9, 20e9)).collect();
    nodes[1].ceilings[0] = ceiling("cpu/fma/f32/all", "FLOP/s", &[85e9, 85e9]);
    assert_eq!(screen(&nodes, &[], 0.10).outliers.len(), 1);
    assert!(screen(&nodes, &[], 0.20).outliers.is_empty());
    // 85 best, samples spread widely: the noise (cv) covers the shortfall.
    nodes[1].ceilings[0] = ceiling("cpu/fma/f32/all", "FLOP/s", &[85e9, 60e9, 40e9]);
    assert!(screen(&nodes, &[], 0.10).outliers.is_empty());
    for (i, n) in nodes.iter_mut().enumerate() {
        let lat = if i == 0 { 9e-6 } else { 2e-6 };
        n.ceilings
            .push(ceiling("net/p2p/intra/latency", "s", &[lat, lat]));
    }
    nodes[2]
        .ceilings
        .push(ceiling("cpu/fma/f64/all", "FLOP/s", &[1.0, 1.0]));
    let f = screen(&nodes, &[], 0.10);
    assert_eq!(f.outliers.len(), 1);
    assert_eq!(f.outliers[0].id.to_string(), "net/p2p/intra/latency");
    assert_eq!(f.outliers[0].node, 0);
    assert!((f.outliers[0].short_by - 3.5).abs() < 1e-12);
    assert!(!f.ceilings.iter().any(|c| c.id == "cpu/fma/f64/all"));
}

/// A GPU ceiling's causes: the throttle reasons NVML saw (idle left out), a lower SM clock,
/// a PCIe link below its maximum.
#[test]
fn gpu_causes() {
    let nodes: Vec<NodeCeilings> = (0..3)
        .map(|i| {
            let v = if i == 0 { 300e12 } else { 700e12 };
            NodeCeilings {
                node: i,
                host: format!("g{i}"),
                ceilings: vec![ceiling("gpu1/mma/bf16", "FLOP/s", &[v, v])],
            }
        })
        .collect();
    let gpu = |clock: f64, reasons: &[&str], pcie| Conditions {
        gpus: vec![GpuConditions {
            index: 1,
            throttle_reasons: reasons.iter().map(|s| s.to_string()).collect(),
            sm_clock_mhz: Some(clock),
            pcie,
        }],
        ..Conditions::default()
    };
    let cond = vec![
        gpu(900.0, &["GPU_IDLE", "SW_POWER_CAP"], Some((4, 5, 8, 16))),
        gpu(1980.0, &["GPU_IDLE"], Some((5, 5, 16, 16))),
        gpu(1980.0, &[], None),
    ];
    let f = screen(&nodes, &cond, DEFAULT_MARGIN);
    assert_eq!(f.outliers.len(), 1);
    let c = &f.outliers[0].causes;
    assert_eq!(c.len(), 3, "{c:?}");
    assert_eq!(
        c[0],
        Cause::Throttled {
            gpu: 1,
            reasons: vec!["SW_POWER_CAP".into()]
        }
    );
    assert!(matches!(c[1], Cause::LowerGpuClock { gpu: 1, .. }));
    assert!(c[2].to_string().contains("gen 4 x8, its maximum gen 5 x16"));
    // Read back as written.
    let text = serde_json::to_string(&f).unwrap();
    let back: Fleet = serde_json::from_str(&text).unwrap();
    assert_eq!(back, f);
}

/// The GPU links travel beside the host links: through machine.json, its validation and the
/// gate's inputs (`gpu-link/…` beside `link/…`); a GPU link naming a node the fleet does not
/// have is refused.
#[test]
fn gpu_links_are_kept_validated_and_gated_beside_the_host_links() {
    use crate::links::{Link, LinkMatrix};
    let matrix = |bw: f64, b: usize| {
        let s = |v: f64| Stats::from_samples(&[v, v * 0.99, v * 1.01]).unwrap();
        LinkMatrix::judge(
            vec!["n0".into(), "n1".into()],
            "m".into(),
            1 << 20,
            1,
            0.1,
            vec![Link {
                a: 0,
                b,
                round: 0,
                latency: s(2e-6),
                bandwidth_ab: s(bw),
                bandwidth_ba: s(bw),
                again: None,
                in_round: None,
            }],
            0.1,
        )
    };
    let mut m = crate::placement::tests::machine();
    let mut f = screen(&[node(0, 1e11, 2e10), node(1, 1e11, 2e10)], &[], 0.1);
    f.links = Some(matrix(10e9, 1));
    f.gpu_links = Some(matrix(45e9, 1));
    m.fleet = Some(f);
    let text = m.to_json().unwrap();
    let back = crate::Machine::from_json(&text).unwrap();
    assert_eq!(back.fleet, m.fleet);
    let g = crate::gate::read_input(&text).unwrap();
    let value = |id: &str| g.metrics.iter().find(|x| x.id == id).map(|x| x.value);
    assert_eq!(value("link/node0-node1/bandwidth"), Some(10e9));
    assert_eq!(value("gpu-link/node0-node1/bandwidth"), Some(45e9));
    assert_eq!(value("gpu-link/node0-node1/latency"), Some(2e-6));
    // A GPU link to a third node of a two-node fleet.
    m.fleet.as_mut().unwrap().gpu_links = Some(matrix(45e9, 2));
    let err = crate::Machine::from_json(&m.to_json().unwrap()).unwrap_err();
    assert!(err.to_string().contains("fleet GPU link 0-2"), "{err}");
}
