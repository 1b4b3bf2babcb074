//! Analytic operation counts of ResNet per image, layer by layer, under both rule sets of the
//! papers: AIPerf's operation weights (multiply-accumulate 2, add/compare 1, divide 4, exp 8;
//! backward pass per its table II: twice the forward of each convolution and dense layer plus
//! the parameter update, no data gradient for the first layer) and HPC AI500 V3.0's table 3
//! (one operation per element for element-wise, pooling and normalisation; C_in × C_out for the
//! fully-connected layer; training counted as three forward passes). Also the minimum bytes each
//! layer must move in a forward pass (f32: its input, its weights and its output, once).

use crate::detect::model::{DetectorConfig, DetectorFlops};
use crate::resnet::{Config, Flops, ResNet, Version};
use crate::tensor::Float;

/// What one layer does per image.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct LayerCount {
    pub name: String,
    pub kind: Kind,
    /// Multiply-accumulates (convolution, dense).
    pub macs: f64,
    pub params: f64,
    pub inputs: f64,
    pub outputs: f64,
    /// Output rows × columns and channels, where a following layer needs them (convolutions,
    /// pooling, each block's last layer); zero otherwise.
    pub size: (usize, usize),
    pub channels: usize,
    /// A convolution's input rows × columns (zero for other layers).
    pub input_size: (usize, usize),
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Kind {
    /// `first`: the stem, whose input needs no gradient; a `kernel × kernel` window moved by
    /// `stride` (padding `kernel / 2`).
    Conv {
        first: bool,
        kernel: usize,
        stride: usize,
    },
    BatchNorm,
    Relu,
    MaxPool {
        window: usize,
    },
    AvgPool,
    #[default]
    Add,
    Dense,
    Softmax,
    /// RoIAlign with `samples²` bilinear samples per output element.
    RoiAlign {
        samples: usize,
    },
}

/// A convolution layer's shape for `n` images (None for another layer): its channels from its
/// parameters and output, padding `kernel / 2` as every convolution here.
pub fn conv_shape(l: &LayerCount, n: usize) -> Option<roofline_kernels::cpu::conv::ConvShape> {
    let Kind::Conv { kernel, stride, .. } = l.kind else {
        return None;
    };
    let k = l.channels;
    let c = (l.params / (kernel * kernel * k.max(1)) as f64).round() as usize;
    Some(roofline_kernels::cpu::conv::ConvShape {
        n,
        c,
        h: l.input_size.0,
        w: l.input_size.1,
        k,
        r: kernel,
        s: kernel,
        stride,
        pad: kernel / 2,
    })
}

/// Every layer of the network for one image at `resolution`.
pub fn layers(cfg: &Config, resolution: usize) -> Vec<LayerCount> {
    classifier(cfg, 3, resolution, resolution)
}

/// `layers` for `h × w` images of `channels` channels.
pub fn classifier(cfg: &Config, channels: usize, h: usize, w: usize) -> Vec<LayerCount> {
    let mut v = backbone(cfg, channels, h, w);
    let (c, h, w) = v
        .last()
        .map(|l| (l.channels, l.size.0, l.size.1))
        .expect("a stem at least");
    let cin = c;
    v.push(LayerCount {
        name: "avgpool".into(),
        kind: Kind::AvgPool,
        macs: 0.0,
        params: 0.0,
        inputs: (h * w * cin) as f64,
        outputs: cin as f64,
        ..Default::default()
    });
    v.push(LayerCount {
        name: "fc".into(),
        kind: Kind::Dense,
        macs: (cin * cfg.classes) as f64,
        params: ((cin + 1) * cfg.classes) as f64,
        inputs: cin as f64,
        outputs: cfg.classes as f64,
        ..Default::default()
    });
    v.push(LayerCount {
        name: "softmax".into(),
        kind: Kind::Softmax,
        macs: 0.0,
        params: 0.0,
        inputs: cfg.classes as f64,
        outputs: cfg.classes as f64,
        ..Default::default()
    });
    v
}

/// A convolution's count for an `h × w` input (square filter, zero padding); returns its output
/// size.
#[allow(clippy::too_many_arguments)]
fn conv(
    v: &mut Vec<LayerCount>,
    name: String,
    cin: usize,
    cout: usize,
    k: usize,
    stride: usize,
    pad: usize,
    (h, w): (usize, usize),
    first: bool,
) -> (usize, usize) {
    let oh = (h + 2 * pad - k) / stride + 1;
    let ow = (w + 2 * pad - k) / stride + 1;
    v.push(LayerCount {
        name,
        kind: Kind::Conv {
            first,
            kernel: k,
            stride,
        },
        macs: (k * k * cin * oh * ow * cout) as f64,
        params: (k * k * cin * cout) as f64,
        inputs: (h * w * cin) as f64,
        outputs: (oh * ow * cout) as f64,
        size: (oh, ow),
        channels: cout,
        input_size: (h, w),
    });
    (oh, ow)
}

/// An element-wise layer over `n` values.
fn elementwise(v: &mut Vec<LayerCount>, name: String, kind: Kind, n: usize, params: usize) {
    v.push(LayerCount {
        name,
        kind,
        macs: 0.0,
        params: params as f64,
        inputs: n as f64,
        outputs: n as f64,
        ..Default::default()
    });
}

/// The convolutional layers of the network (stem to the last block) for one `h × w` image of
/// `channels` channels; each stage's last layer records its output size and channels.
pub fn backbone(cfg: &Config, channels: usize, h: usize, w: usize) -> Vec<LayerCount> {
    let ch = |b: usize| ((b as f64 * cfg.width).round() as usize).max(1);
    let mut v = Vec::new();
    let c0 = ch(64);
    let mut hw = conv(&mut v, "conv1".into(), channels, c0, 7, 2, 3, (h, w), true);
    let px = |s: (usize, usize)| s.0 * s.1;
    elementwise(&mut v, "bn1".into(), Kind::BatchNorm, px(hw) * c0, 2 * c0);
    elementwise(&mut v, "relu".into(), Kind::Relu, px(hw) * c0, 0);
    let pool = |x: usize| (x + 2 - 3) / 2 + 1;
    let ph = (pool(hw.0), pool(hw.1));
    v.push(LayerCount {
        name: "maxpool".into(),
        kind: Kind::MaxPool { window: 3 },
        macs: 0.0,
        params: 0.0,
        inputs: (px(hw) * c0) as f64,
        outputs: (px(ph) * c0) as f64,
        size: ph,
        channels: c0,
        ..Default::default()
    });
    hw = ph;
    let mut cin = c0;
    for (stage, &n) in cfg.blocks.iter().enumerate() {
        let mid = ch(64 << stage);
        let out = mid * 4;
        for b in 0..n {
            let stride = if stage > 0 && b == 0 { 2 } else { 1 };
            let (s1, s2) = match cfg.version {
                Version::V1 => (stride, 1),
                Version::V1_5 => (1, stride),
            };
            let name = format!("layer{}.{b}", stage + 1);
            let h1 = conv(
                &mut v,
                format!("{name}.conv1"),
                cin,
                mid,
                1,
                s1,
                0,
                hw,
                false,
            );
            elementwise(
                &mut v,
                format!("{name}.bn1"),
                Kind::BatchNorm,
                px(h1) * mid,
                2 * mid,
            );
            elementwise(&mut v, format!("{name}.relu1"), Kind::Relu, px(h1) * mid, 0);
            let h2 = conv(
                &mut v,
                format!("{name}.conv2"),
                mid,
                mid,
                3,
                s2,
                1,
                h1,
                false,
            );
            elementwise(
                &mut v,
                format!("{name}.bn2"),
                Kind::BatchNorm,
                px(h2) * mid,
                2 * mid,
            );
            elementwise(&mut v, format!("{name}.relu2"), Kind::Relu, px(h2) * mid, 0);
            let h3 = conv(
                &mut v,
                format!("{name}.conv3"),
                mid,
                out,
                1,
                1,
                0,
                h2,
                false,
            );
            elementwise(
                &mut v,
                format!("{name}.bn3"),
                Kind::BatchNorm,
                px(h3) * out,
                2 * out,
            );
            if stride != 1 || cin != out {
                conv(
                    &mut v,
                    format!("{name}.downsample.0"),
                    cin,
                    out,
                    1,
                    stride,
                    0,
                    hw,
                    false,
                );
                elementwise(
                    &mut v,
                    format!("{name}.downsample.1"),
                    Kind::BatchNorm,
                    px(h3) * out,
                    2 * out,
                );
            }
            elementwise(&mut v, format!("{name}.add"), Kind::Add, px(h3) * out, 0);
            elementwise(&mut v, format!("{name}.relu3"), Kind::Relu, px(h3) * out, 0);
            if let Some(l) = v.last_mut() {
                l.size = h3;
                l.channels = out;
            }
            hw = h3;
            cin = out;
        }
    }
    v
}

/// Every layer of the EWA detector for one `h × w` training image: the backbone, the pyramid
/// (lateral and output convolutions, top-down sums), the RPN head at each level (its weights
/// read again at each), RoIAlign and the box head for `roi_per_image` regions (a region's pooled
/// values stand for its input too: the samples it reads are at most four per value).
pub fn detector(cfg: &DetectorConfig, h: usize, w: usize) -> Vec<LayerCount> {
    let mut v = backbone(&cfg.backbone, cfg.in_channels, h, w);
    let sizes = cfg.level_sizes(h, w);
    let chans = cfg.stage_channels();
    let width = cfg.fpn_width;
    let px = |s: (usize, usize)| s.0 * s.1;
    for l in (0..4).rev() {
        conv(
            &mut v,
            format!("fpn.inner{l}"),
            chans[l],
            width,
            1,
            1,
            0,
            sizes[l],
            false,
        );
        if l < 3 {
            elementwise(
                &mut v,
                format!("fpn.add{l}"),
                Kind::Add,
                px(sizes[l]) * width,
                0,
            );
        }
        conv(
            &mut v,
            format!("fpn.layer{l}"),
            width,
            width,
            3,
            1,
            1,
            sizes[l],
            false,
        );
    }
    let a = cfg.anchors_per_cell();
    for (l, &s) in sizes.iter().enumerate() {
        let p = l + 2;
        conv(
            &mut v,
            format!("rpn.head.conv.p{p}"),
            width,
            width,
            3,
            1,
            1,
            s,
            false,
        );
        elementwise(
            &mut v,
            format!("rpn.head.relu.p{p}"),
            Kind::Relu,
            px(s) * width,
            0,
        );
        conv(
            &mut v,
            format!("rpn.head.cls.p{p}"),
            width,
            a,
            1,
            1,
            0,
            s,
            false,
        );
        conv(
            &mut v,
            format!("rpn.head.reg.p{p}"),
            width,
            4 * a,
            1,
            1,
            0,
            s,
            false,
        );
    }
    let r = cfg.roi_per_image as f64;
    let pooled = (cfg.pool.out * cfg.pool.out * width) as f64;
    v.push(LayerCount {
        name: "roi_align".into(),
        kind: Kind::RoiAlign {
            samples: cfg.pool.samples,
        },
        inputs: r * pooled,
        outputs: r * pooled,
        ..Default::default()
    });
    let k = (cfg.classes + 1) as f64;
    let hidden = cfg.hidden as f64;
    let mut dense = |name: &str, i: f64, o: f64| {
        v.push(LayerCount {
            name: format!("box_head.{name}"),
            kind: Kind::Dense,
            macs: r * i * o,
            params: (i + 1.0) * o,
            inputs: r * i,
            outputs: r * o,
            ..Default::default()
        })
    };
    dense("fc6", pooled, hidden);
    dense("fc7", hidden, hidden);
    dense("cls_score", hidden, k);
    dense("bbox_pred", hidden, 4.0 * k);
    for n in ["relu6", "relu7"] {
        elementwise(
            &mut v,
            format!("box_head.{n}"),
            Kind::Relu,
            cfg.roi_per_image * cfg.hidden,
            0,
        );
    }
    v
}

/// Operations per image: forward, backward (gradients and the parameter update), total.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Count {
    pub forward: f64,
    pub backward: f64,
}

impl Count {
    pub fn total(&self) -> f64 {
        self.forward + self.backward
    }
}

/// RoIAlign's FLOPs for `outputs` pooled values of `samples`² bilinear samples each: four
/// multiply-adds per sample and the average (the backward pass scatters through the same
/// weights: as many).
fn roi_align(samples: usize, outputs: f64) -> f64 {
    (8.0 * (samples * samples) as f64 + 1.0) * outputs
}

/// AIPerf's tables I–III.
pub fn aiperf(layers: &[LayerCount]) -> Count {
    let (mut f, mut b) = (0.0, 0.0);
    for l in layers {
        match l.kind {
            Kind::Conv { first, .. } => {
                f += 2.0 * l.macs;
                // BP: MACC = 2·(K²·Ci·Ho·Wo·Co) + K²·Ci·Co; the first layer computes no data
                // gradient (AIPerf's table III: BP/FP = 1.9755 for ResNet-50's convolutions).
                b += 2.0 * (if first { 1.0 } else { 2.0 } * l.macs + l.params);
            }
            Kind::Dense => {
                f += 2.0 * l.macs;
                b += 2.0 * (2.0 * l.macs + l.params);
            }
            // MACC + Add + Div per element: 2 + 1 + 4.
            Kind::BatchNorm => f += 7.0 * l.outputs,
            Kind::Relu | Kind::Add => f += l.outputs,
            Kind::MaxPool { window } => f += (window * window) as f64 * l.outputs,
            // Adds over the input, one division per channel.
            Kind::AvgPool => f += l.inputs + 4.0 * l.outputs,
            // exp (8), sum (1), division (4) per class, and the max (1) and subtraction (1).
            Kind::Softmax => f += 21.0 * l.outputs,
            // Four multiply-adds per bilinear sample and the average; the backward pass
            // scatters through the same weights.
            Kind::RoiAlign { samples } => {
                f += roi_align(samples, l.outputs);
                b += roi_align(samples, l.outputs);
            }
        }
    }
    Count {
        forward: f,
        backward: b,
    }
}

/// HPC AI500 V3.0's table 3 (forward), training counted as three forward passes.
pub fn hpc_ai500_v3(layers: &[LayerCount]) -> Count {
    let mut f = 0.0;
    for l in layers {
        f += match l.kind {
            Kind::Conv { .. } => 2.0 * l.macs,
            Kind::Dense => l.macs,
            Kind::BatchNorm | Kind::Relu | Kind::Add => l.outputs,
            Kind::MaxPool { .. } | Kind::AvgPool => l.inputs,
            Kind::Softmax => 0.0,
            // Not in the table: counted as AIPerf counts it.
            Kind::RoiAlign { samples } => roi_align(samples, l.outputs),
        };
    }
    Count {
        forward: f,
        backward: 2.0 * f,
    }
}

/// The trainer's own count, the FLOPs its FLOP/s are of (one count for both workloads, from
/// the layers above): a multiply-add is 2 FLOPs in convolutions and dense layers, whose bias
/// adds count too (dense); their backward passes (data and weight gradients) are twice the
/// forward, the stem's (no data gradient) once; RoIAlign's bilinear samples count both ways;
/// element-wise layers are not counted.
pub fn trainer(layers: &[LayerCount]) -> Count {
    let (mut f, mut b) = (0.0, 0.0);
    for l in layers {
        match l.kind {
            Kind::Conv { first, .. } => {
                f += 2.0 * l.macs;
                b += if first { 2.0 } else { 4.0 } * l.macs;
            }
            Kind::Dense => {
                f += 2.0 * l.macs + l.outputs;
                b += 2.0 * (2.0 * l.macs + l.outputs);
            }
            Kind::RoiAlign { samples } => {
                f += roi_align(samples, l.outputs);
                b += roi_align(samples, l.outputs);
            }
            _ => {}
        }
    }
    Count {
        forward: f,
        backward: b,
    }
}

/// The minimum bytes a forward pass must move per image (f32; each layer reads its input and
/// weights once and writes its output once).
pub fn min_bytes_forward(layers: &[LayerCount]) -> f64 {
    layers
        .iter()
        .map(|l| 4.0 * (l.inputs + l.params + l.outputs))
        .sum()
}

/// The layers a timeline span covers (`crate::resnet`'s span names): `layer1.0.bn1+relu1` is
/// `layer1.0.bn1` and `layer1.0.relu1` (the parts after the first take its prefix); a span that
/// names no layer covers the layers under it (`fpn`: `fpn.inner0`, …).
pub fn span_layers<'a>(layers: &'a [LayerCount], span: &str) -> Vec<&'a LayerCount> {
    if !layers.iter().any(|l| l.name == span) && !span.contains('+') {
        let prefix = format!("{span}.");
        let under: Vec<&LayerCount> = layers
            .iter()
            .filter(|l| l.name.starts_with(&prefix))
            .collect();
        if !under.is_empty() {
            return under;
        }
    }
    let mut parts = span.split('+');
    let Some(first) = parts.next() else {
        return Vec::new();
    };
    let prefix = first.rfind('.').map_or("", |i| &first[..=i]);
    std::iter::once(first.to_string())
        .chain(parts.map(|p| format!("{prefix}{p}")))
        .filter_map(|n| layers.iter().find(|l| l.name == n))
        .collect()
}

/// The minimum bytes one layer's training pass moves per image (f32): the forward pass reads
/// its input and weights and writes its output; the backward pass reads the output's gradient,
/// the input and the weights and writes the input's gradient (not for the first layer) and the
/// weights' gradient.
pub fn min_bytes_training(l: &LayerCount) -> f64 {
    let dx = if matches!(l.kind, Kind::Conv { first: true, .. }) {
        0.0
    } else {
        l.inputs
    };
    4.0 * ((l.inputs + l.params + l.outputs) + (l.outputs + l.inputs + l.params + dx + l.params))
}

/// ResNet `model`'s analytic FLOPs per `h × w` image (multiply-accumulate = 2): convolutions and
/// the classifier, forward; the training step adds backward-data (not for the stem, whose input
/// needs no gradient) and backward-weight passes of the same size each. The trainer count
/// ([`trainer`]) of its layers ([`classifier`]).
pub fn resnet_flops<T: Float>(model: &ResNet<T>, h: usize, w: usize) -> Flops {
    let c = trainer(&classifier(&model.config, model.stem.shape.c, h, w));
    Flops {
        forward: c.forward,
        backward: c.backward,
    }
}

/// The detector's analytic FLOPs per `h × w` image by part: the trainer count of the
/// configuration's layers ([`detector`]), grouped by part (the backbone, the pyramid, the RPN,
/// RoIAlign, the box head).
pub fn detector_flops(cfg: &DetectorConfig, h: usize, w: usize) -> DetectorFlops {
    let layers = detector(cfg, h, w);
    let part = |keep: &dyn Fn(&str) -> bool| {
        let these: Vec<_> = layers.iter().filter(|l| keep(&l.name)).cloned().collect();
        let c = trainer(&these);
        Flops {
            forward: c.forward,
            backward: c.backward,
        }
    };
    let heads = ["fpn.", "rpn.", "roi_align", "box_head."];
    DetectorFlops {
        backbone: part(&|n| !heads.iter().any(|p| n.starts_with(p))),
        fpn: part(&|n| n.starts_with("fpn.")),
        rpn: part(&|n| n.starts_with("rpn.")),
        roi_align: part(&|n| n == "roi_align"),
        box_head: part(&|n| n.starts_with("box_head.")),
    }
}

#[cfg(test)]
mod tests;
