use roofline_workloads::detect::model::DetectorConfig;
use roofline_workloads::detect::roi_align::MultiScale;
use roofline_workloads::detect::rpn::ProposalRule;
use roofline_workloads::ewa::{train, EwaConfig};
use roofline_workloads::ewa_data::{write_synthetic, EwaSet};
use roofline_workloads::resnet::{Config, Version};
use roofline_workloads::train::Monitor;
use std::sync::Arc;

struct P;
impl Monitor for P {
    fn step(&self, s: usize, n: usize, loss: f64, ips: f64) {
        if s % 20 == 0 || s == n {
            eprintln!("step {s}/{n} loss {loss:.4} {ips:.1} img/s");
        }
    }
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let arg = |i: usize, d: f64| a.get(i).and_then(|s| s.parse().ok()).unwrap_or(d);
    let (h, w) = (arg(1, 64.0) as usize, arg(2, 96.0) as usize);
    let steps = arg(3, 200.0) as usize;
    let lr = arg(4, 0.02);
    let width = arg(5, 0.25);
    let fpn = arg(6, 64.0) as usize;
    let ntrain = arg(7, 256.0) as usize;
    let batch = arg(8, 8.0) as usize;
    let path = std::env::temp_dir().join(format!("ewa-tune-{h}x{w}-{ntrain}.h5"));
    if !path.exists() {
        write_synthetic(&path, ntrain + 64, h, w, 42).unwrap();
    }
    let data = Arc::new(EwaSet::open(&[path], h, w).unwrap());
    let rule = |n| ProposalRule { pre_nms: n, post_nms: n, nms: 0.7, min_size: 1e-3 };
    let model = DetectorConfig {
        backbone: Config { version: Version::V1_5, blocks: [1, 1, 1, 1], width, classes: 1, zero_init_residual: false },
        in_channels: 16,
        fpn_width: fpn,
        anchor_base: 8.0,
        ratios: vec![0.5, 1.0, 2.0],
        hidden: 256,
        classes: 4,
        rpn_per_image: 128,
        rpn_train: rule(300),
        rpn_test: rule(100),
        roi_per_image: 128,
        pool: MultiScale { out: 7, samples: 2 },
        score_threshold: 0.05,
        nms: 0.5,
        detections: 50,
    };
    let cfg = EwaConfig {
        model,
        data,
        train: 0..ntrain,
        eval: ntrain..ntrain + 64,
        batch,
        steps,
        warmup_steps: steps / 10,
        base_lr_per_16: lr,
        seed: 1,
        target_map: None,
        eval_every: arg(9, steps as f64) as usize,
        checkpoint: None,
        resume: None,
        stop_at: None,
        checkpoint_every: None,
        comm: Default::default(),
    };
    let t = std::time::Instant::now();
    let s = train::<f32>(&cfg, &P, None).unwrap();
    eprintln!("{} s; loss {:.4}; evals {:?}", t.elapsed().as_secs_f64(), s.final_loss, s.evals.iter().map(|e| (e.step, e.map)).collect::<Vec<_>>());
}
