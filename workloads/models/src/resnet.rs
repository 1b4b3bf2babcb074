//! ResNet-50 v1.5 (stride 2 in the 3×3 convolution of each down-sampling bottleneck) and v1
//! (stride in the first 1×1), He initialisation, optional zero-initialised last batch-norm γ of
//! each block, width and depth multipliers for small test models; and its analytic FLOP count.

use crate::data::Rng;
use crate::layers::{
    add_into, avgpool_backward, avgpool_forward_act, Act, BatchNorm, Conv2d, Kept, Linear, MaxPool,
    Param, Shortcut,
};
use crate::tensor::{Float, Tensor};
use roofline_collectors::timeline::timed;
use std::sync::Arc;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Version {
    /// Stride 2 in the first 1×1 convolution of a down-sampling block (the original paper).
    #[cfg_attr(feature = "clap", value(name = "1"))]
    V1,
    /// Stride 2 in the 3×3 convolution (torchvision, MLPerf, HPC AI500).
    #[cfg_attr(feature = "clap", value(name = "1.5"))]
    V1_5,
}

impl std::fmt::Display for Version {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Version::V1 => "1",
            Version::V1_5 => "1.5",
        })
    }
}

#[derive(Clone, Debug)]
pub struct Config {
    pub version: Version,
    /// Bottlenecks per stage: [3, 4, 6, 3] for ResNet-50.
    pub blocks: [usize; 4],
    /// Multiplier on every width (64 base channels, 4× expansion).
    pub width: f64,
    pub classes: usize,
    /// Zero-initialise the last batch-norm γ of each block (Goyal et al.).
    pub zero_init_residual: bool,
}

impl Config {
    pub fn resnet50(classes: usize) -> Config {
        Config {
            version: Version::V1_5,
            blocks: [3, 4, 6, 3],
            width: 1.0,
            classes,
            zero_init_residual: false,
        }
    }

    fn channels(&self, base: usize) -> usize {
        ((base as f64 * self.width).round() as usize).max(1)
    }
}

/// Timeline categories of the layers' passes; span names are the accounting's layer names
/// (`crate::accounting::layers`), fused layers joined by `+` (`layer1.0.bn1+relu1`).
pub const FWD: &str = "forward";
pub const BWD: &str = "backward";

fn name(layer: &'static str) -> impl FnOnce() -> String {
    move || layer.to_string()
}

/// One bottleneck: 1×1 → 3×3 → 1×1 (×4 expansion) plus the shortcut.
pub struct Bottleneck<T> {
    pub conv1: Conv2d<T>,
    pub bn1: BatchNorm<T>,
    pub conv2: Conv2d<T>,
    pub bn2: BatchNorm<T>,
    pub conv3: Conv2d<T>,
    pub bn3: BatchNorm<T>,
    pub down: Option<(Conv2d<T>, BatchNorm<T>)>,
    /// `layer1.0`, …: the prefix of its layers' names (timeline spans, accounting).
    pub name: String,
    /// The ReLU outputs inside the block and at its end (bf16 in bf16 training: `Act`).
    a1: Act<T>,
    b1: Act<T>,
    out: Act<T>,
}

impl<T: Float> Bottleneck<T> {
    #[allow(clippy::too_many_arguments)]
    fn new(
        name: &str,
        cin: usize,
        mid: usize,
        stride: usize,
        version: Version,
        zero_last: bool,
        rng: &mut Rng,
    ) -> Bottleneck<T> {
        let out = mid * 4;
        let (s1, s2) = match version {
            Version::V1 => (stride, 1),
            Version::V1_5 => (1, stride),
        };
        let down = (stride != 1 || cin != out).then(|| {
            (
                Conv2d::new(&format!("{name}.downsample.0"), cin, out, 1, stride, 0, rng),
                BatchNorm::new(&format!("{name}.downsample.1"), out, 1.0),
            )
        });
        Bottleneck {
            conv1: Conv2d::new(&format!("{name}.conv1"), cin, mid, 1, s1, 0, rng),
            bn1: BatchNorm::new(&format!("{name}.bn1"), mid, 1.0),
            conv2: Conv2d::new(&format!("{name}.conv2"), mid, mid, 3, s2, 1, rng),
            bn2: BatchNorm::new(&format!("{name}.bn2"), mid, 1.0),
            conv3: Conv2d::new(&format!("{name}.conv3"), mid, out, 1, 1, 0, rng),
            bn3: BatchNorm::new(
                &format!("{name}.bn3"),
                out,
                if zero_last { 0.0 } else { 1.0 },
            ),
            down,
            name: name.to_string(),
            a1: Act::Full(Arc::new(Tensor::zeros(0, 0, 0, 0))),
            b1: Act::Full(Arc::new(Tensor::zeros(0, 0, 0, 0))),
            out: Act::Full(Arc::new(Tensor::zeros(0, 0, 0, 0))),
        }
    }

    fn forward(&mut self, x: &Act<T>, train: bool) -> Act<T> {
        let n = &self.name;
        let f = |layer: &'static str| move || format!("{n}.{layer}");
        let a = timed(FWD, f("conv1"), || self.conv1.forward_kept(x));
        let a = timed(FWD, f("bn1+relu1"), || self.bn1.forward_relu_kept(a, train));
        let b = timed(FWD, f("conv2"), || self.conv2.forward_kept(&a));
        let b = timed(FWD, f("bn2+relu2"), || self.bn2.forward_relu_kept(b, train));
        let c = timed(FWD, f("conv3"), || self.conv3.forward_kept(&b));
        // The block's end in one pass: bn3, the projection's batch norm, the sum and the ReLU.
        let bn3 = &mut self.bn3;
        let c = match self.down.as_mut() {
            Some((conv, bn)) => {
                let d = timed(FWD, f("downsample.0"), || conv.forward_kept(x));
                timed(FWD, f("bn3+downsample.1+add+relu3"), || {
                    bn3.forward_add_relu_kept(c, Shortcut::projected(bn, d), train)
                })
            }
            None => timed(FWD, f("bn3+add+relu3"), || {
                bn3.forward_add_relu_kept(c, Shortcut::identity(x), train)
            }),
        };
        if train {
            self.a1 = a;
            self.b1 = b;
            self.out = c.clone();
        }
        c
    }

    /// The block's input gradient from its output's, `d`. In bf16 training the shortcut
    /// gradient goes from block to block in bf16 (`Act::Half`): an identity block's first
    /// convolution adds its input gradient into it (`Conv2d::backward_add_half`), and a
    /// projection block rounds its sum when `half_out` (not for the first block, whose input
    /// gradient the max pool reads in f32).
    fn backward(&mut self, d: Act<T>, half_out: bool) -> Act<T> {
        let n = &self.name;
        let f = |layer: &'static str| move || format!("{n}.{layer}");
        // Spans named as the forward pass's fused ones, so that the placement has one row for
        // those layers: the block's end (the ReLU, bn3, the projection's batch norm) in two
        // passes, the shortcut's sum inside conv1's products.
        let end = if self.down.is_some() {
            "bn3+downsample.1+add+relu3"
        } else {
            "bn3+add+relu3"
        };
        let (bn3, out, down) = (&mut self.bn3, &self.out, &mut self.down);
        let (g, ds) = timed(BWD, f(end), || {
            bn3.backward_add_relu_act(d, out, down.as_mut().map(|(_, bn)| bn))
        });
        let db = timed(BWD, f("conv3"), || self.conv3.backward_act(&g));
        let g = timed(BWD, f("bn2+relu2"), || {
            self.bn2.backward_relu_act(&db, &self.b1)
        });
        let da = timed(BWD, f("conv2"), || self.conv2.backward_act(&g));
        let g = timed(BWD, f("bn1+relu1"), || {
            self.bn1.backward_relu_act(&da, &self.a1)
        });
        match (&mut self.down, ds) {
            (Some((conv, _)), ds) => {
                let mut dx = timed(BWD, f("downsample.0"), || conv.backward_act(&ds));
                timed(BWD, f("conv1"), || self.conv1.backward_add(&g, &mut dx));
                if half_out {
                    Act::kept(dx)
                } else {
                    Act::Full(Arc::new(dx))
                }
            }
            (None, Act::Half(ds)) => {
                let mut dx = Arc::unwrap_or_clone(ds);
                timed(BWD, f("conv1"), || {
                    self.conv1.backward_add_half(&g, &mut dx)
                });
                Act::Half(Arc::new(dx))
            }
            (None, ds) => {
                let mut dx = ds.into_full();
                timed(BWD, f("conv1"), || self.conv1.backward_add(&g, &mut dx));
                Act::Full(Arc::new(dx))
            }
        }
    }

    fn params(&mut self) -> Vec<&mut Param<T>> {
        let mut v = vec![
            &mut self.conv1.weight,
            &mut self.bn1.gamma,
            &mut self.bn1.beta,
            &mut self.conv2.weight,
            &mut self.bn2.gamma,
            &mut self.bn2.beta,
            &mut self.conv3.weight,
            &mut self.bn3.gamma,
            &mut self.bn3.beta,
        ];
        if let Some((c, b)) = &mut self.down {
            v.push(&mut c.weight);
            v.push(&mut b.gamma);
            v.push(&mut b.beta);
        }
        v
    }
}

/// The network.
pub struct ResNet<T> {
    pub config: Config,
    pub stem: Conv2d<T>,
    pub stem_bn: BatchNorm<T>,
    pool: MaxPool<T>,
    pub blocks: Vec<Bottleneck<T>>,
    pub fc: Linear<T>,
    last_hw: (usize, usize),
}

impl<T: Float> ResNet<T> {
    pub fn new(config: Config, seed: u64) -> ResNet<T> {
        let mut rng = Rng::new(seed);
        let c0 = config.channels(64);
        let stem = Conv2d::new("conv1", 3, c0, 7, 2, 3, &mut rng);
        let mut blocks = Vec::new();
        let mut cin = c0;
        for (stage, &n) in config.blocks.iter().enumerate() {
            let mid = config.channels(64 << stage);
            for b in 0..n {
                let stride = if stage > 0 && b == 0 { 2 } else { 1 };
                let name = format!("layer{}.{b}", stage + 1);
                blocks.push(Bottleneck::new(
                    &name,
                    cin,
                    mid,
                    stride,
                    config.version,
                    config.zero_init_residual,
                    &mut rng,
                ));
                cin = mid * 4;
            }
        }
        let fc = Linear::new("fc", cin, config.classes, &mut rng);
        ResNet {
            config,
            stem,
            stem_bn: BatchNorm::new("bn1", c0, 1.0),
            pool: MaxPool::default(),
            blocks,
            fc,
            last_hw: (0, 0),
        }
    }

    /// A ResNet whose stem takes `channels` input channels (16 for the Extreme Weather
    /// fields), initialised as `new` otherwise.
    pub fn with_input_channels(config: Config, seed: u64, channels: usize) -> ResNet<T> {
        let mut m = ResNet::new(config, seed);
        let mut rng = Rng::new(seed ^ 0x57E4);
        m.stem = Conv2d::new("conv1", channels, m.stem.shape.k, 7, 2, 3, &mut rng);
        m
    }

    /// Stem convolution, batch norm + ReLU, max pool. The max pool applies the batch norm's
    /// map and the ReLU as it reads the convolution's output (the normalised tensor is never
    /// written), so `place`'s `bn1+relu` forward is the statistics pass and its `maxpool`
    /// forward includes the normalisation. The batch norm keeps its input for the backward
    /// pass when training. The max pool's output is kept as the blocks' are (`Act::kept`: in
    /// bf16 in bf16 training, rounded once for layer1.0's conv1 and projection).
    /// The image goes in as the activations are kept (`Act::of`: in bf16 in bf16 training, which
    /// the products would round it to anyway), so that the stem's patches are bf16 too; the
    /// convolution's output is kept as the other convolutions' are (`forward_kept`: in bf16 in
    /// bf16 training, read so by the statistics, the max pool and the backward pass).
    fn stem_forward(&mut self, x: &Tensor<T>, train: bool) -> Act<T> {
        let s = timed(FWD, name("conv1"), || self.stem.forward_kept(&Act::of(x)));
        let (bn, pool) = (&mut self.stem_bn, &mut self.pool);
        let (a, d) = timed(FWD, name("bn1+relu"), || match &s {
            Kept::Full(s) => bn.relu_maps(s, train),
            Kept::Half(s) => bn.relu_maps(s, train),
        });
        let h = timed(FWD, name("maxpool"), || {
            Act::kept(match &s {
                Kept::Full(s) => pool.forward_relu_affine(s, &a, &d),
                Kept::Half(s) => pool.forward_relu_affine(s, &a, &d),
            })
        });
        if train {
            self.stem_bn.keep_relu_input(s, (a, d));
        }
        h
    }

    /// The stem's gradients from that of the max pool's output. The input image needs no
    /// gradient: only the filter gradient of the stem convolution, from the output gradient
    /// kept as the blocks keep theirs (in bf16 in bf16 training).
    fn stem_backward(&mut self, d: &Tensor<T>) {
        let ds = timed(BWD, name("maxpool"), || self.pool.backward(d));
        let dstem = timed(BWD, name("bn1+relu"), || {
            self.stem_bn.backward_relu_recomputed_act(&ds)
        });
        timed(BWD, name("conv1"), || {
            self.stem.backward_filter_only_act(&dstem)
        });
    }

    /// The backbone's four stage outputs (C2–C5 of a feature pyramid, strides 4, 8, 16, 32) for
    /// an NHWC batch; every stage needs at least one block.
    pub fn forward_features(&mut self, x: &Tensor<T>, train: bool) -> Vec<Arc<Tensor<T>>> {
        assert!(
            self.config.blocks.iter().all(|&b| b > 0),
            "a feature pyramid needs a block in every stage"
        );
        let mut h = self.stem_forward(x, train);
        let mut out = Vec::with_capacity(4);
        let mut next = 0;
        for &n in &self.config.blocks {
            for b in &mut self.blocks[next..next + n] {
                h = b.forward(&h, train);
            }
            next += n;
            out.push(h.full());
        }
        out
    }

    /// Gradients of every backbone parameter from the gradients of the four stage outputs
    /// (after `forward_features` in training mode); the classifier is not used.
    pub fn backward_features(&mut self, mut d: Vec<Tensor<T>>) {
        assert_eq!(d.len(), 4, "one gradient per stage");
        let mut g: Option<Act<T>> = None;
        let mut end = self.blocks.len();
        for stage in (0..4).rev() {
            let ds = d.pop().expect("four stages");
            let mut cur = match g.take() {
                Some(x) => {
                    let mut x = x.into_full();
                    add_into(&mut x, &ds);
                    Act::Full(Arc::new(x))
                }
                None => Act::Full(Arc::new(ds)),
            };
            let n = self.config.blocks[stage];
            for (i, b) in self.blocks[end - n..end].iter_mut().enumerate().rev() {
                cur = b.backward(cur, end - n + i > 0);
            }
            end -= n;
            g = Some(cur);
        }
        self.stem_backward(&g.expect("a gradient").into_full());
    }

    /// Logits for an NHWC batch of 3-channel images.
    pub fn forward(&mut self, x: &Tensor<T>, train: bool) -> Tensor<T> {
        let mut h = self.stem_forward(x, train);
        for b in &mut self.blocks {
            h = b.forward(&h, train);
        }
        let (_, hh, hw, _) = h.dims();
        self.last_hw = (hh, hw);
        let p = timed(FWD, name("avgpool"), || avgpool_forward_act(&h));
        timed(FWD, name("fc"), || self.fc.forward(&p))
    }

    /// Gradients of every parameter from ∂loss/∂logits (after a training forward pass).
    pub fn backward(&mut self, dlogits: &Tensor<T>) {
        self.backward_with(dlogits, &mut |_| {});
    }

    /// `backward`, handing each group of parameters to `ready` as soon as their gradients are
    /// final (the classifier, then each block from the last, then the stem): the order of
    /// [`ResNet::backward_order`]. The gradient exchange starts on them while the rest runs.
    pub fn backward_with(
        &mut self,
        dlogits: &Tensor<T>,
        ready: &mut dyn FnMut(Vec<&mut Param<T>>),
    ) {
        let dp = timed(BWD, name("fc"), || self.fc.backward(dlogits));
        ready(vec![&mut self.fc.weight, &mut self.fc.bias]);
        let (h, w) = self.last_hw;
        let d = timed(BWD, name("avgpool"), || avgpool_backward(&dp, h, w));
        let mut d = Act::Full(Arc::new(d));
        for (i, b) in self.blocks.iter_mut().enumerate().rev() {
            d = b.backward(d, i > 0);
            ready(b.params());
        }
        self.stem_backward(&d.into_full());
        ready(Self::stem_params(&mut self.stem, &mut self.stem_bn).into());
    }

    fn stem_params<'a>(stem: &'a mut Conv2d<T>, bn: &'a mut BatchNorm<T>) -> [&'a mut Param<T>; 3] {
        [&mut stem.weight, &mut bn.gamma, &mut bn.beta]
    }

    /// The parameters in the order the backward pass finishes them.
    pub fn backward_order(&mut self) -> Vec<&mut Param<T>> {
        let mut v: Vec<&mut Param<T>> = vec![&mut self.fc.weight, &mut self.fc.bias];
        for b in self.blocks.iter_mut().rev() {
            v.extend(b.params());
        }
        v.extend(Self::stem_params(&mut self.stem, &mut self.stem_bn));
        v
    }

    pub fn params(&mut self) -> Vec<&mut Param<T>> {
        let mut v: Vec<&mut Param<T>> = Self::stem_params(&mut self.stem, &mut self.stem_bn).into();
        for b in &mut self.blocks {
            v.extend(b.params());
        }
        v.push(&mut self.fc.weight);
        v.push(&mut self.fc.bias);
        v
    }

    /// Makes every batch norm use global-batch statistics through `r` (data parallel).
    pub fn set_reducer(&mut self, r: Arc<dyn crate::layers::Reducer>) {
        self.stem_bn.reducer = Some(Arc::clone(&r));
        for b in &mut self.blocks {
            for bn in [&mut b.bn1, &mut b.bn2, &mut b.bn3] {
                bn.reducer = Some(Arc::clone(&r));
            }
            if let Some((_, bn)) = &mut b.down {
                bn.reducer = Some(Arc::clone(&r));
            }
        }
    }

    /// Every parameter's and running statistic's shape in this trainer's layouts (a
    /// convolution r × s × in × out, the classifier in × out), by name (`--init`'s check).
    pub fn shapes(&self) -> std::collections::BTreeMap<String, Vec<usize>> {
        let mut m = std::collections::BTreeMap::new();
        let conv = |m: &mut std::collections::BTreeMap<String, Vec<usize>>, c: &Conv2d<T>| {
            let s = &c.shape;
            m.insert(c.weight.name.clone(), vec![s.r, s.s, s.c, s.k]);
        };
        let bn = |m: &mut std::collections::BTreeMap<String, Vec<usize>>, b: &BatchNorm<T>| {
            let base = b.gamma.name.trim_end_matches(".weight");
            for f in ["weight", "bias", "running_mean", "running_var"] {
                m.insert(format!("{base}.{f}"), vec![b.gamma.value.len()]);
            }
        };
        conv(&mut m, &self.stem);
        bn(&mut m, &self.stem_bn);
        for b in &self.blocks {
            for (c, n) in [(&b.conv1, &b.bn1), (&b.conv2, &b.bn2), (&b.conv3, &b.bn3)] {
                conv(&mut m, c);
                bn(&mut m, n);
            }
            if let Some((c, n)) = &b.down {
                conv(&mut m, c);
                bn(&mut m, n);
            }
        }
        m.insert(
            self.fc.weight.name.clone(),
            vec![self.fc.inputs, self.fc.outputs],
        );
        m.insert(self.fc.bias.name.clone(), vec![self.fc.outputs]);
        m
    }

    /// Every batch norm's running statistics, by name (for checkpoints).
    pub fn running_stats(&mut self) -> Vec<(String, &mut Vec<T>, &mut Vec<T>)> {
        let mut v = vec![(
            "bn1".to_string(),
            &mut self.stem_bn.running_mean,
            &mut self.stem_bn.running_var,
        )];
        for b in &mut self.blocks {
            let name = b
                .conv1
                .weight
                .name
                .trim_end_matches(".conv1.weight")
                .to_string();
            v.push((
                format!("{name}.bn1"),
                &mut b.bn1.running_mean,
                &mut b.bn1.running_var,
            ));
            v.push((
                format!("{name}.bn2"),
                &mut b.bn2.running_mean,
                &mut b.bn2.running_var,
            ));
            v.push((
                format!("{name}.bn3"),
                &mut b.bn3.running_mean,
                &mut b.bn3.running_var,
            ));
            if let Some((_, bn)) = &mut b.down {
                v.push((
                    format!("{name}.downsample.1"),
                    &mut bn.running_mean,
                    &mut bn.running_var,
                ));
            }
        }
        v
    }

    pub fn parameter_count(&mut self) -> usize {
        self.params().iter().map(|p| p.value.len()).sum()
    }
}

/// FLOPs per image of a forward pass and of the backward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Flops {
    pub forward: f64,
    pub backward: f64,
}

impl Flops {
    pub fn training(&self) -> f64 {
        self.forward + self.backward
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::layers::softmax_cross_entropy;

    #[test]
    fn resnet50_has_the_standard_parameter_count_and_flops() {
        let mut m = ResNet::<f32>::new(Config::resnet50(1000), 1);
        // torchvision's resnet50: 25,557,032 parameters (v1 and v1.5 alike).
        assert_eq!(m.parameter_count(), 25_557_032);
        let f = crate::accounting::resnet_flops(&m, 224, 224);
        // v1.5 forward: 4.09 GMAC of convolutions and classifier → ≈ 8.18 GFLOP.
        assert!((f.forward / 1e9 - 8.18).abs() < 0.05, "{}", f.forward);
        let mut v1 = Config::resnet50(1000);
        v1.version = Version::V1;
        let m1 = ResNet::<f32>::new(v1, 1);
        // v1 moves the stride to the first 1×1: fewer FLOPs (3.86 GMAC ≈ 7.72 GFLOP).
        assert!(crate::accounting::resnet_flops(&m1, 224, 224).forward < f.forward);
        assert!((crate::accounting::resnet_flops(&m1, 224, 224).forward / 1e9 - 7.72).abs() < 0.05);
    }

    /// A v1.5 model of width 1/16 with three classes.
    fn tiny(blocks: [usize; 4]) -> Config {
        Config {
            version: Version::V1_5,
            blocks,
            width: 1.0 / 16.0,
            classes: 3,
            zero_init_residual: false,
        }
    }

    /// The backward pass hands every parameter over exactly once, in `backward_order`, with
    /// its final gradient (the exchange may send it at once).
    #[test]
    fn backward_hands_over_final_gradients_in_backward_order() {
        let cfg = tiny([1, 2, 0, 0]);
        let count = ResNet::<f64>::new(cfg.clone(), 3).params().len();
        let mut m = ResNet::<f64>::new(cfg, 3);
        let mut rng = Rng::new(4);
        let x = Tensor::from_vec(
            2,
            16,
            16,
            3,
            (0..2 * 16 * 16 * 3).map(|_| rng.normal()).collect(),
        );
        let z = m.forward(&x, true);
        let (_, g, _, _) = softmax_cross_entropy(&z, &[0, 2], 0.0);
        let mut seen: Vec<(String, Vec<f64>)> = Vec::new();
        m.backward_with(&g, &mut |ps| {
            seen.extend(ps.into_iter().map(|p| (p.name.clone(), p.grad.clone())))
        });
        let order = m.backward_order();
        assert_eq!(seen.len(), order.len());
        assert_eq!(order.len(), count);
        for ((name, grad), p) in seen.iter().zip(&order) {
            assert_eq!(name, &p.name);
            assert_eq!(grad, &p.grad, "{name} changed after it was handed over");
            assert!(grad.iter().any(|v| *v != 0.0), "{name}: no gradient");
        }
    }

    /// The backbone's features (16 input channels) and their backward pass against finite
    /// differences of Σ g·C over the four stages.
    #[test]
    fn feature_backbone_gradient_check() {
        let cfg = tiny([1, 1, 1, 1]);
        let mut rng = Rng::new(8);
        let x = Tensor::from_vec(
            2,
            32,
            32,
            16,
            (0..2 * 32 * 32 * 16).map(|_| rng.normal()).collect(),
        );
        let mut m = ResNet::<f64>::with_input_channels(cfg.clone(), 5, 16);
        let c = m.forward_features(&x, true);
        assert_eq!(
            c.iter().map(|t| (t.h, t.c)).collect::<Vec<_>>(),
            vec![(8, 16), (4, 32), (2, 64), (1, 128)]
        );
        let g: Vec<Vec<f64>> = c
            .iter()
            .map(|t| (0..t.len()).map(|_| rng.normal()).collect())
            .collect();
        m.backward_features(
            c.iter()
                .zip(&g)
                .map(|(t, g)| Tensor::from_vec(t.n, t.h, t.w, t.c, g.clone()))
                .collect(),
        );
        let grads: Vec<Vec<f64>> = m.params().iter().map(|p| p.grad.clone()).collect();
        let values: Vec<Vec<f64>> = m.params().iter().map(|p| p.value.clone()).collect();
        let loss = |vals: &[Vec<f64>]| {
            let mut n = ResNet::<f64>::with_input_channels(cfg.clone(), 5, 16);
            for (p, v) in n.params().into_iter().zip(vals) {
                p.value = v.clone();
            }
            n.forward_features(&x, true)
                .iter()
                .zip(&g)
                .map(|(t, g)| t.data.iter().zip(g).map(|(a, b)| a * b).sum::<f64>())
                .sum::<f64>()
        };
        let h = 1e-6;
        let mut checked = 0;
        // The stem, a block in the first stage and one in the last (the classifier has none).
        for pi in [0, 3, values.len() - 6] {
            for i in (0..values[pi].len()).step_by((values[pi].len() / 3).max(1)) {
                let mut up = values.clone();
                up[pi][i] += h;
                let mut down = values.clone();
                down[pi][i] -= h;
                let fd = (loss(&up) - loss(&down)) / (2.0 * h);
                let an = grads[pi][i];
                assert!(
                    (fd - an).abs() <= 1e-5 * (1.0 + fd.abs()),
                    "param {pi}[{i}]: {fd} vs {an}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 6);
        assert_eq!(
            grads[grads.len() - 1].iter().filter(|v| **v != 0.0).count(),
            0
        );
    }

    /// The whole network's backward pass, through every layer, against finite differences of
    /// the loss on a tiny model in f64.
    #[test]
    fn tiny_network_gradient_check() {
        let cfg = tiny([1, 1, 0, 0]);
        let mut m = ResNet::<f64>::new(cfg.clone(), 3);
        let mut rng = Rng::new(4);
        let x = Tensor::from_vec(
            2,
            16,
            16,
            3,
            (0..2 * 16 * 16 * 3).map(|_| rng.normal()).collect(),
        );
        let labels = [1usize, 2];
        let logits = m.forward(&x, true);
        let (_, g, _, _) = softmax_cross_entropy(&logits, &labels, 0.0);
        m.backward(&g);
        let grads: Vec<Vec<f64>> = m.params().iter().map(|p| p.grad.clone()).collect();
        let values: Vec<Vec<f64>> = m.params().iter().map(|p| p.value.clone()).collect();
        let loss = |vals: &[Vec<f64>]| {
            let mut n = ResNet::<f64>::new(cfg.clone(), 3);
            for (p, v) in n.params().into_iter().zip(vals) {
                p.value = v.clone();
            }
            let z = n.forward(&x, true);
            softmax_cross_entropy(&z, &labels, 0.0).0
        };
        let h = 1e-5;
        let mut checked = 0;
        for (pi, vals) in values.iter().enumerate() {
            for i in (0..vals.len()).step_by((vals.len() / 3).max(1)) {
                let mut up = values.clone();
                up[pi][i] += h;
                let mut down = values.clone();
                down[pi][i] -= h;
                let fd = (loss(&up) - loss(&down)) / (2.0 * h);
                let g = grads[pi][i];
                // Absolute floor: gradients of ~0 (a channel ReLU switched off) are noise-level.
                let err = (fd - g).abs() / (fd.abs() + g.abs()).max(1e-6);
                assert!(
                    err < 1e-4,
                    "param {pi} [{i}]: finite difference {fd}, backward {g}"
                );
                checked += 1;
            }
        }
        assert!(checked > 40);
    }
}
