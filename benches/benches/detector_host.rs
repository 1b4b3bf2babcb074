//! The detector's host steps at the paper's size (768×1152, pyramid P2–P6, nine anchors a cell:
//! 662,904 anchors an image), on random RPN outputs: one image's training proposals (per-level
//! selection, decoding, NMS, the best 2000), and the RPN's loss for a batch of two with ten
//! truth boxes each (every anchor matched through the IoU matrix, 256 sampled, the losses and
//! the dense gradients). Criterion prints anchors per second. These are what the CPU detector
//! and the GPU one (which runs them on the host today) spend between the RPN head and the box
//! head: `cargo bench -p roofline-benches --bench detector_host`.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use roofline_workloads::data::Rng;
use roofline_workloads::detect::boxes::BBox;
use roofline_workloads::detect::model::DetectorConfig;
use roofline_workloads::detect::rpn::{proposals, rpn_loss};
use roofline_workloads::tensor::Tensor;

fn host_steps(c: &mut Criterion) {
    let cfg = DetectorConfig::ewa();
    let (ih, iw) = (768usize, 1152usize);
    let sizes: Vec<(usize, usize)> = (0..5).map(|l| (ih >> (l + 2), iw >> (l + 2))).collect();
    let anchors = cfg.level_anchors(&sizes);
    let total: usize = anchors.iter().map(Vec::len).sum();
    let a = cfg.ratios.len() * 3;
    let batch = 2;
    let mut rng = Rng::new(5);
    let outputs: Vec<(Tensor<f32>, Tensor<f32>)> = sizes
        .iter()
        .map(|&(h, w)| {
            let o = (0..batch * h * w * a)
                .map(|_| rng.normal() as f32)
                .collect();
            let d = (0..batch * h * w * a * 4)
                .map(|_| 0.1 * rng.normal() as f32)
                .collect();
            (
                Tensor::from_vec(batch, h, w, a, o),
                Tensor::from_vec(batch, h, w, 4 * a, d),
            )
        })
        .collect();
    let truth: Vec<Vec<BBox>> = (0..batch)
        .map(|_| {
            (0..10)
                .map(|_| {
                    let (x, y) = (rng.uniform(0.0, 1000.0), rng.uniform(0.0, 650.0));
                    let (w, h) = (rng.uniform(16.0, 156.0), rng.uniform(16.0, 126.0));
                    [x, y, (x + w).min(iw as f64), (y + h).min(ih as f64)]
                })
                .collect()
        })
        .collect();
    let mut g = c.benchmark_group("detector_host");
    g.sample_size(10);
    g.throughput(Throughput::Elements(total as u64));
    g.bench_function("proposals_train_1_image", |b| {
        b.iter(|| proposals(&outputs, &anchors, 0, iw as f64, ih as f64, &cfg.rpn_train).len())
    });
    g.throughput(Throughput::Elements((batch * total) as u64));
    g.bench_function("rpn_loss_batch_2", |b| {
        b.iter(|| rpn_loss(&outputs, &anchors, &truth, cfg.rpn_per_image, 9).0)
    });
    g.finish();
}

criterion_group!(benches, host_steps);
criterion_main!(benches);
