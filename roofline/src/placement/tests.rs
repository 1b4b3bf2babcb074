use super::*;
use crate::machine::{CacheInfo, Ceiling, PerIteration};

pub(crate) fn machine() -> Machine {
    let c = |id: &str, kind, value: f64, precision: Option<&str>, level: Option<&str>| Ceiling {
        id: id.parse().unwrap(),
        kind,
        value,
        unit: if kind == CeilingKind::Compute {
            "FLOP/s".into()
        } else {
            "B/s".into()
        },
        threads: 2,
        precision: precision.map(|p| p.parse().unwrap()),
        level: level.map(|l| l.parse().unwrap()),
        isa: None,
        stats: Stats::from_samples(&[value]).unwrap(),
        theoretical_peak: None,
        above_peak: false,
        method: String::new(),
        per_iteration: PerIteration {
            ops: 0.0,
            bytes: 0.0,
        },
        plateau: None,
        conditions: None,
        burst: None,
        sustained: None,
    };
    let mut m: Machine = serde_json::from_value(serde_json::json!({
        "schema": crate::MACHINE_SCHEMA,
        "provenance": {
            "tool": "roofline 0", "command_line": [], "time_utc": "t", "host": "h", "os": "o",
            "kernel": "k", "quick": true, "duration_s": 1.0,
            "cpu": { "vendor": "v", "model_name": "m", "family": 1, "model": 2, "stepping": 3,
                     "sockets": 1, "cores": 2, "logical_cpus": 2, "features": [], "simd": "avx512",
                     "caches": [] }
        },
        "ceilings": []
    }))
    .unwrap();
    let cache = |level, size, shared, instances| CacheInfo {
        level,
        cache_type: if level == 1 { "Data" } else { "Unified" }.into(),
        size_bytes: size,
        shared_by_cpus: shared,
        shared_by_cores: shared,
        instances,
    };
    m.provenance.cpu.caches = vec![
        cache(1, 48 << 10, 1, 2),
        cache(2, 1 << 20, 1, 2),
        cache(3, 32 << 20, 2, 1),
    ];
    m.ceilings = vec![
        c(
            "cpu/fma/f32/all",
            CeilingKind::Compute,
            800e9,
            Some("f32"),
            None,
        ),
        c(
            "cpu/gemm/f32/all",
            CeilingKind::Compute,
            500e9,
            Some("f32"),
            None,
        ),
        c(
            "cpu/conv/f32/all",
            CeilingKind::Compute,
            400e9,
            Some("f32"),
            None,
        ),
        c(
            "cpu/fma/bf16/all",
            CeilingKind::Compute,
            1600e9,
            Some("bf16"),
            None,
        ),
        c(
            "cpu/mem/L1/triad/all",
            CeilingKind::Memory,
            1000e9,
            None,
            Some("L1"),
        ),
        c(
            "cpu/mem/L2/triad/all",
            CeilingKind::Memory,
            400e9,
            None,
            Some("L2"),
        ),
        c(
            "cpu/mem/L3/triad/all",
            CeilingKind::Memory,
            200e9,
            None,
            Some("L3"),
        ),
        c(
            "cpu/mem/DRAM/triad/all",
            CeilingKind::Memory,
            20e9,
            None,
            Some("DRAM"),
        ),
        c("net/allreduce/intra", CeilingKind::Comm, 10e9, None, None),
    ];
    m
}

#[test]
fn the_footprint_picks_the_memory_level() {
    let m = machine();
    // Private L1/L2 count once per thread; the shared L3 once.
    assert_eq!(memory_level(&m, 90e3, 2), Level::L1);
    assert_eq!(memory_level(&m, 100e3, 2), Level::L2);
    assert_eq!(memory_level(&m, 100e3, 1), Level::L2);
    assert_eq!(memory_level(&m, 3e6, 2), Level::L3);
    assert_eq!(memory_level(&m, 1e9, 2), Level::Dram);
}

/// A GEMM far right of the ridge binds on the lowest compute roof; a DRAM triad (OI 1/12)
/// on the DRAM roof; a point that communicates a lot on the allreduce roof.
#[test]
fn bounds_pick_the_lowest_roof_at_the_point() {
    let m = machine();
    let r = cpu_roofs(
        &m,
        Precision::F32,
        &[Family::Gemm, Family::Conv, Family::Fma],
        2,
        3.0 * 64e6,
        None,
    );
    let g = bound(&r, 683.0, None, 480e9).unwrap();
    assert_eq!(
        (g.kind, g.ceiling.as_str()),
        (BoundKind::Compute, "cpu/conv/f32/all")
    );
    assert_eq!(g.attainable, 400e9);
    assert!((g.headroom - 400.0 / 480.0).abs() < 1e-12);
    let s = bound(&r, 1.0 / 12.0, None, 1.6e9).unwrap();
    assert_eq!(
        (s.kind, s.ceiling.as_str()),
        (BoundKind::Memory, "cpu/mem/DRAM/triad/all")
    );
    assert!((s.attainable - 20e9 / 12.0).abs() < 1.0);
    // Two ranks: bus bytes are the payload.
    let coi = Coi::allreduce(2e9, 100e6, 2, 1).unwrap();
    assert_eq!((coi.intra_node_bytes, coi.intra_node), (100e6, Some(20.0)));
    let r = cpu_roofs(
        &m,
        Precision::F32,
        &[Family::Gemm, Family::Conv, Family::Fma],
        2,
        1e9,
        Some(&coi),
    );
    assert_eq!(
        r.len(),
        5,
        "three compute roofs, DRAM, the intra-node allreduce"
    );
    let c = bound(&r, 50.0, Some(&coi), 100e9).unwrap();
    // 10 GB/s × 20 FLOP/B = 200 GFLOP/s < 400 (conv) < 1000 (DRAM × 50).
    assert_eq!(c.kind, BoundKind::Communication);
    assert_eq!(c.attainable, 200e9);
    assert_eq!(c.roofs.len(), 5);
    assert!(bound(&[], 1.0, None, 1.0).is_none());
    // A GEMM is not held against the convolution roof.
    let r = cpu_roofs(
        &m,
        Precision::F32,
        &[Family::Gemm, Family::Fma],
        2,
        3.0 * 64e6,
        None,
    );
    assert_eq!(
        bound(&r, 683.0, None, 480e9).unwrap().ceiling,
        "cpu/gemm/f32/all"
    );
}

/// On AMX the bf16 GEMM runs past the vdpbf16ps FMA roof: a bf16 network is held against the
/// GEMM, not bound below what the probe measured; where the GEMM is below the FMA roof (f32
/// here), the FMA roof stays among the roofs.
#[test]
fn a_gemm_above_the_fma_roof_replaces_it() {
    let mut m = machine();
    let fma = m.ceiling("cpu/fma/bf16/all").unwrap().clone();
    let mut gemm = fma.clone();
    gemm.id = "cpu/gemm/bf16/all".parse().unwrap();
    gemm.value = 3000e9;
    m.ceilings.push(gemm);
    let families = [Family::Conv, Family::Gemm, Family::Fma];
    let r = cpu_roofs(&m, Precision::Bf16, &families, 2, 3.0 * 64e6, None);
    assert!(r.iter().all(|(x, _)| !x.ceiling.contains("/fma/")), "{r:?}");
    let b = bound(&r, 500.0, None, 1000e9).unwrap();
    assert_eq!(
        (b.ceiling.as_str(), b.attainable),
        ("cpu/gemm/bf16/all", 3000e9)
    );
    let f = cpu_roofs(&m, Precision::F32, &families, 2, 3.0 * 64e6, None);
    assert!(f.iter().any(|(x, _)| x.ceiling == "cpu/fma/f32/all"));
}

fn point(kind: BoundKind, ceiling: &str, headroom: f64, achieved: f64) -> Point {
    Point {
        label: "x".into(),
        flops_per_step: 1.0,
        seconds_per_step: Stats::from_samples(&[1.0]).unwrap(),
        achieved_flops: achieved,
        achieved: Stats::from_samples(&[achieved]).unwrap(),
        footprint_bytes: 1.0,
        oi: Intensity {
            analytic_min_bytes: 1.0,
            analytic: 0.5,
            measured: None,
            measured_note: String::new(),
        },
        coi: None,
        share_of_step: Some(0.2),
        note: None,
        bound: Bound {
            kind,
            ceiling: ceiling.into(),
            attainable: achieved * headroom,
            headroom,
            roofs: vec![RoofAt {
                ceiling: "cpu/gemm/f32/all".into(),
                kind: BoundKind::Compute,
                value: 500e9,
                unit: "FLOP/s".into(),
                allows: 500e9,
            }],
        },
    }
}

#[test]
fn advice_follows_the_bound() {
    let m = machine();
    let w = WorkloadInfo {
        name: "resnet50".into(),
        kind: "training".into(),
        description: String::new(),
        precision: "f32".into(),
        device: "cpu".into(),
        threads: 2,
        ranks: 2,
        nodes: 1,
        warm_steps: 1,
        measured_steps: 3,
        parameters: None,
        batch: None,
    };
    let time = TimeBreakdown {
        total_s: 1.0,
        compute_s: 0.6,
        communication_s: 0.05,
        data_s: 0.3,
        idle_s: 0.05,
    };
    let comm = point(BoundKind::Communication, "net/allreduce/intra", 1.5, 100e9);
    let a = advise(&w, &comm, &[], &time, &m);
    assert!(
        a[0].text.contains("fp16") && a[0].text.contains("overlap"),
        "{a:?}"
    );
    assert!(
        a.iter().any(|x| x.topic == "data"),
        "30% data wait is named"
    );
    let comp = point(BoundKind::Compute, "cpu/gemm/f32/all", 1.7, 300e9);
    let bn = Point {
        label: "layer1.0.bn1".into(),
        ..point(BoundKind::Memory, "cpu/mem/DRAM/triad/all", 1.1, 5e9)
    };
    let a = advise(&w, &comp, &[bn], &time, &m);
    assert!(
        a[0].text.contains("60% of the GEMM ceiling"),
        "{}",
        a[0].text
    );
    assert!(
        a[0].text.contains("cpu/fma/bf16/all"),
        "names the faster precision"
    );
    assert!(a
        .iter()
        .any(|x| x.topic == "memory" && x.text.contains("layer1.0.bn1")));
    let above = point(BoundKind::Compute, "cpu/gemm/f32/all", 0.8, 600e9);
    let a = advise(&w, &above, &[], &TimeBreakdown::default(), &m);
    assert!(a.iter().any(|x| x.topic == "measurement"));
}

#[test]
fn other_schemas_are_rejected() {
    let e = Placement::from_json(r#"{"schema": "roofline/machine/v1"}"#).unwrap_err();
    assert!(e.to_string().contains(PLACEMENT_SCHEMA), "{e}");
}

#[test]
fn a_gpu_point_is_held_against_its_gpus_library_roofs_and_l2_or_hbm() {
    let mut m = machine();
    let template = m.ceilings[0].clone();
    for (id, kind, value) in [
        ("gpu0/gemm/bf16", CeilingKind::Compute, 700e12),
        ("gpu0/conv/bf16/fwd", CeilingKind::Compute, 400e12),
        ("gpu0/conv/bf16/bwd_data", CeilingKind::Compute, 300e12),
        ("gpu0/fma/bf16", CeilingKind::Compute, 100e12),
        ("gpu0/mem/L2/triad", CeilingKind::Memory, 10e12),
        ("gpu0/mem/HBM/triad", CeilingKind::Memory, 3e12),
        ("gpu1/gemm/bf16", CeilingKind::Compute, 1.0),
    ] {
        m.ceilings.push(Ceiling {
            id: id.parse().unwrap(),
            kind,
            value,
            ..template.clone()
        });
    }
    m.provenance.gpus.push(crate::GpuInfo {
        index: 0,
        l2_bytes: 50 << 20,
        ..Default::default()
    });
    let ids = |r: &[(RoofAt, Axis)]| r.iter().map(|x| x.0.ceiling.clone()).collect::<Vec<_>>();
    let big = gpu_roofs(
        &m,
        0,
        Precision::Bf16,
        &[Family::Conv, Family::Gemm, Family::Fma],
        1e9,
        None,
    );
    assert_eq!(
        ids(&big),
        ["gpu0/conv/bf16/fwd", "gpu0/gemm/bf16", "gpu0/mem/HBM/triad"]
    );
    let small = gpu_roofs(
        &m,
        0,
        Precision::Bf16,
        &[Family::Conv, Family::Gemm],
        1e6,
        None,
    );
    assert_eq!(ids(&small)[2], "gpu0/mem/L2/triad");
    // At OI 1000 the convolution roof binds, not the CUDA cores' FMA; at OI 10, HBM.
    assert_eq!(
        bound(&big, 1000.0, None, 200e12).unwrap().ceiling,
        "gpu0/conv/bf16/fwd"
    );
    assert_eq!(
        bound(&big, 10.0, None, 20e12).unwrap().ceiling,
        "gpu0/mem/HBM/triad"
    );
}

#[test]
fn coi_counts_bus_bytes_as_the_allreduce_roofs_count_busbw() {
    // By hand: 4 ranks put 100 MB each into a ring allreduce; each sends and receives
    // 2·(4−1)/4 = 1.5 times that over its link (nccl-tests' busbw factor): 150 MB, and a step
    // of 3 GFLOP has a COI of 3e9 / 150e6 = 20 FLOP per bus byte.
    let c = Coi::allreduce(3e9, 100e6, 4, 1).unwrap();
    assert_eq!(c.bus_factor, 1.5);
    assert_eq!(
        (c.payload_bytes, c.intra_node_bytes, c.inter_node_bytes),
        (100e6, 150e6, 0.0)
    );
    assert_eq!((c.intra_node, c.inter_node), (Some(20.0), None));
    // Against a 10 GB/s busbw roof: 10e9 × 20 = 200 GFLOP/s; the payload's intensity (30)
    // would have allowed 300, 1.5 times too much.
    let m = machine();
    let r = cpu_roofs(&m, Precision::F32, &[Family::Gemm], 2, 1e9, Some(&c));
    let b = bound(&r, 1e6, Some(&c), 1e9).unwrap();
    assert_eq!(b.kind, BoundKind::Communication);
    assert_eq!(b.attainable, 200e9);
    // Several nodes: the same bus bytes between them.
    let c = Coi::allreduce(3e9, 100e6, 8, 2).unwrap();
    assert_eq!(
        (c.bus_factor, c.inter_node_bytes, c.intra_node_bytes),
        (1.75, 175e6, 0.0)
    );
    assert_eq!(c.inter_node, Some(3e9 / 175e6));
    assert!(Coi::allreduce(3e9, 100e6, 1, 1).is_none());
    assert!(Coi::allreduce(3e9, 0.0, 4, 1).is_none());
    // A file written before the fields were kept reads as two ranks' payload.
    let old: Coi = serde_json::from_str(
        r#"{"intra_node_bytes": 5.0, "inter_node_bytes": 0.0, "intra_node": 2.0}"#,
    )
    .unwrap();
    assert_eq!((old.bus_factor, old.payload_bytes), (1.0, 0.0));
}

/// A GPU layer that is one convolution of a shape the probe measured takes the rate of its
/// directions at their measured rates (their equal FLOPs over the sum of their times) as its
/// compute roof; the stem has no backward-data; a shape missing in a direction (another
/// batch) has none.
#[test]
fn a_measured_convolution_shape_is_its_layers_roof() {
    use crate::ceiling_id::{TableId, TableRows};
    use crate::ids::{ConvDir, On, RoofId};
    let mut m = machine();
    let shape = "n=128 c=64 h=56 w=56 k=64 r=3 s=3 stride=1 pad=1";
    let row = |value: f64| crate::machine::TableRow {
        name: "layer1.0 conv2 3x3/1".into(),
        shape: shape.into(),
        precision: Some("bf16".into()),
        threads: 1,
        value,
        stats: Stats::from_samples(&[value]).unwrap(),
        max_rel_error: None,
        detail: None,
        heuristic: None,
        roof: None,
        efficiency: None,
    };
    for (dir, value) in [
        (ConvDir::Fwd, 400e12),
        (ConvDir::BwdData, 200e12),
        (ConvDir::BwdFilter, 100e12),
    ] {
        m.tables.push(crate::machine::Table {
            id: TableId {
                of: RoofId::Compute {
                    on: On::Gpu(0),
                    family: Family::Conv,
                    precision: Precision::Bf16,
                    direction: Some(dir),
                },
                rows: TableRows::Table,
            },
            unit: "FLOP/s".into(),
            rows: vec![row(value)],
        });
    }
    let conv = |first| LayerConv {
        shape: shape.into(),
        first,
    };
    let r = measured_conv_roof(&m, 0, Precision::Bf16, &conv(false)).unwrap();
    // 3 / (1/400 + 1/200 + 1/100) T = 171.4 TFLOP/s.
    assert!((r.value - 3.0 / (1.0 / 400e12 + 1.0 / 200e12 + 1.0 / 100e12)).abs() < 1e3);
    assert_eq!(r.kind, BoundKind::Compute);
    assert!(
        r.ceiling.contains(shape) && r.ceiling.contains("bwd_data"),
        "{}",
        r.ceiling
    );
    let stem = measured_conv_roof(&m, 0, Precision::Bf16, &conv(true)).unwrap();
    assert!((stem.value - 2.0 / (1.0 / 400e12 + 1.0 / 100e12)).abs() < 1e3);
    assert!(!stem.ceiling.contains("bwd_data"));
    // Another batch, another precision, another GPU: no row, no roof.
    let other = LayerConv {
        shape: shape.replace("n=128", "n=64"),
        first: false,
    };
    assert!(measured_conv_roof(&m, 0, Precision::Bf16, &other).is_none());
    assert!(measured_conv_roof(&m, 0, Precision::F16, &conv(false)).is_none());
    assert!(measured_conv_roof(&m, 1, Precision::Bf16, &conv(false)).is_none());
    // A direction missing: none.
    m.tables.retain(|t| {
        !matches!(
            t.id.of,
            RoofId::Compute {
                direction: Some(ConvDir::BwdFilter),
                ..
            }
        )
    });
    assert!(measured_conv_roof(&m, 0, Precision::Bf16, &conv(false)).is_none());
}

/// A layer's share of the step is its median step's over the median step: one stalled step
/// (the layer 0.9 s of a 1.0 s step, the others 0.1 of 0.2) leaves it at a half, where the mean
/// layer time (0.37 s) over the median step (0.2 s) read 1.8; never past 1.
#[test]
fn a_layers_share_of_the_step_stays_within_the_step() {
    use super::assemble::share_of_step;
    let layer = Stats::from_samples(&[0.1, 0.1, 0.9]).unwrap();
    let step = Stats::from_samples(&[0.2, 0.2, 1.0]).unwrap();
    assert_eq!(share_of_step(layer.median, step.median), 0.5);
    assert!(layer.mean / step.median > 1.0);
    assert_eq!(share_of_step(0.3, 0.2), 1.0);
    assert_eq!(share_of_step(0.0, 0.0), 0.0);
}
