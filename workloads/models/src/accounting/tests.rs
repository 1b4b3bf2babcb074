//! The accounting's checks: the papers' tables by hand, and what the trainer runs.

use super::*;

fn v1() -> Config {
    let mut c = Config::resnet50(1000);
    c.version = Version::V1;
    c
}

#[test]
fn aiperf_check_values_for_resnet50_v1() {
    let l = layers(&v1(), 224);
    let c = aiperf(&l);
    // AIPerf: forward 7.81E09, backward 1.52E10, total 2.31E10 per image.
    for (got, want) in [
        (c.forward, 7.81e9),
        (c.backward, 1.52e10),
        (c.total(), 2.31e10),
    ] {
        assert!((got / want - 1.0).abs() < 0.01, "{got:e} vs {want:e}");
    }
    // Table III's rows: convolutions 7.71E09, batch norm 7.41E07, ReLU 9.08E06, max pool
    // 1.81E06, add 5.52E06.
    let sum = |k: fn(&Kind) -> bool, w: f64| {
        l.iter()
            .filter(|x| k(&x.kind))
            .map(|x| w * x.outputs)
            .sum::<f64>()
    };
    let conv: f64 = l
        .iter()
        .filter(|x| matches!(x.kind, Kind::Conv { .. }))
        .map(|x| 2.0 * x.macs)
        .sum();
    assert!((conv / 7.71e9 - 1.0).abs() < 0.01, "{conv:e}");
    assert!((sum(|k| *k == Kind::BatchNorm, 7.0) / 7.41e7 - 1.0).abs() < 0.01);
    assert!((sum(|k| *k == Kind::Relu, 1.0) / 9.08e6 - 1.0).abs() < 0.01);
    assert!((sum(|k| matches!(k, Kind::MaxPool { .. }), 9.0) / 1.81e6 - 1.0).abs() < 0.01);
    assert!((sum(|k| *k == Kind::Add, 1.0) / 5.52e6 - 1.0).abs() < 0.01);
    // The parameters add up to ResNet-50's.
    assert_eq!(l.iter().map(|x| x.params).sum::<f64>() as usize, 25_557_032);
}

/// AIPerf's Table VII, the analytic column: ResNet-50's operations over an epoch of
/// ImageNet at batch 1: FP 1.00E16 and BP 1.95E16 in training (BP/FP 1.9533), 2.95E16 in
/// all; the 50 000 validation images' FP 3.90E14; 2.99E16 with it.
#[test]
fn aiperf_table_vii_per_epoch() {
    let c = aiperf(&layers(&v1(), 224));
    let (train, eval) = (1_281_167.0, 50_000.0);
    for (got, want) in [
        (c.forward * train, 1.00e16),
        (c.backward * train, 1.95e16),
        (c.total() * train, 2.95e16),
        (c.forward * eval, 3.90e14),
        (c.total() * train + c.forward * eval, 2.99e16),
    ] {
        assert!((got / want - 1.0).abs() < 0.01, "{got:e} vs {want:e}");
    }
    assert!((c.backward / c.forward / 1.9533 - 1.0).abs() < 0.01);
}

#[test]
fn spans_name_their_layers() {
    let l = layers(&Config::resnet50(1000), 224);
    let names =
        |s: &str| -> Vec<String> { span_layers(&l, s).iter().map(|x| x.name.clone()).collect() };
    assert_eq!(
        names("layer1.0.bn1+relu1"),
        ["layer1.0.bn1", "layer1.0.relu1"]
    );
    assert_eq!(names("bn1+relu"), ["bn1", "relu"]);
    assert_eq!(
        names("layer2.0.add+relu3"),
        ["layer2.0.add", "layer2.0.relu3"]
    );
    assert_eq!(names("fc"), ["fc"]);
    assert!(names("nothing").is_empty());
    // The stem computes no input gradient: its backward moves less.
    let stem = &l[0];
    assert_eq!(
        min_bytes_training(stem),
        4.0 * (2.0 * stem.inputs + 3.0 * stem.params + 2.0 * stem.outputs)
    );
}

/// The detector's layers: the paper's model at 768×1152 counts its convolutions and dense
/// layers as `DetectorConfig::flops` does (AIPerf's forward = 2·MACs), its RoIAlign by the stated
/// rule, and spans name their parts.
#[test]
fn detector_layers_match_the_models_count() {
    use crate::detect::model::{Detector, DetectorConfig};
    let m = Detector::<f32>::new(DetectorConfig::ewa(), 1);
    let l = detector(&m.cfg, 768, 1152);
    let f = detector_flops(&m.cfg, 768, 1152);
    let macs = |p: &str| -> f64 {
        l.iter()
            .filter(|x| x.name.starts_with(p) && x.macs > 0.0)
            .map(|x| 2.0 * x.macs)
            .sum()
    };
    let rel = |a: f64, b: f64| (a / b - 1.0).abs();
    assert!(rel(macs("fpn."), f.fpn.forward) < 1e-12);
    assert!(rel(macs("rpn.head."), f.rpn.forward) < 1e-12);
    assert!(rel(macs("box_head."), f.box_head.forward) < 1e-3);
    let stem_to_c5: f64 = l
        .iter()
        .filter(|x| matches!(x.kind, Kind::Conv { .. }))
        .filter(|x| !x.name.starts_with("fpn") && !x.name.starts_with("rpn"))
        .map(|x| 2.0 * x.macs)
        .sum();
    assert!(rel(stem_to_c5, f.backbone.forward) < 1e-12);
    let ra = span_layers(&l, "roi_align");
    assert_eq!(
        aiperf(&ra.into_iter().cloned().collect::<Vec<_>>()).forward,
        f.roi_align.forward
    );
    assert_eq!(span_layers(&l, "fpn").len(), 11);
    assert_eq!(span_layers(&l, "rpn.head").len(), 20);
    assert_eq!(span_layers(&l, "box_head").len(), 6);
    assert!(span_layers(&l, "proposals").is_empty());
}

/// The trainer's rule on one layer of each kind, by hand.
#[test]
fn the_trainer_counts_by_its_rule() {
    let l = |kind, macs: f64, outputs: f64| LayerCount {
        name: String::new(),
        kind,
        macs,
        outputs,
        ..Default::default()
    };
    let c = trainer(&[
        l(
            Kind::Conv {
                first: true,
                kernel: 7,
                stride: 2,
            },
            10.0,
            0.0,
        ),
        l(
            Kind::Conv {
                first: false,
                kernel: 3,
                stride: 1,
            },
            100.0,
            0.0,
        ),
        l(Kind::Dense, 1000.0, 3.0),
        l(Kind::RoiAlign { samples: 2 }, 0.0, 5.0),
        l(Kind::Relu, 0.0, 7.0),
    ]);
    assert_eq!(c.forward, 20.0 + 200.0 + 2003.0 + 33.0 * 5.0);
    assert_eq!(c.backward, 20.0 + 400.0 + 4006.0 + 33.0 * 5.0);
}

/// The shapes the counted layers name are the probe's: every convolution of ResNet-50 at
/// 224×224 is one of the probe's distinct shapes, and every one of those is met.
#[test]
fn every_counted_convolution_has_the_probes_shape() {
    let probe: Vec<_> = roofline_kernels::cpu::conv::resnet50_layers(128)
        .into_iter()
        .map(|l| l.shape)
        .collect();
    let counted: Vec<_> = layers(&Config::resnet50(1000), 224)
        .iter()
        .filter_map(|l| conv_shape(l, 128))
        .collect();
    assert_eq!(counted.len(), 53, "ResNet-50's convolutions");
    for s in &counted {
        assert!(probe.contains(s), "{} is not a probe shape", s.describe());
    }
    for s in &probe {
        assert!(counted.contains(s), "{} is not counted", s.describe());
    }
    assert!(layers(&Config::resnet50(1000), 224)
        .iter()
        .filter(|l| !matches!(l.kind, Kind::Conv { .. }))
        .all(|l| conv_shape(l, 1).is_none()));
}

#[test]
fn v15_counts_more_than_v1() {
    let a = aiperf(&layers(&Config::resnet50(1000), 224));
    let b = aiperf(&layers(&v1(), 224));
    assert!(
        a.forward > b.forward * 1.04,
        "{:e} {:e}",
        a.forward,
        b.forward
    );
    let v3 = hpc_ai500_v3(&layers(&Config::resnet50(1000), 224));
    // About 23 GFLOP per training image (HPC AI500 V3.0: 11 776 GFLOP per 512 images).
    assert!((v3.total() / 1e9 - 23.0).abs() < 2.0, "{}", v3.total());
    assert!(min_bytes_forward(&layers(&Config::resnet50(1000), 224)) > 1e8);
}
