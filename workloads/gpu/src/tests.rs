//! What runs without a GPU: the layout transposes, the loss scaler, the comparisons, that the
//! CUDA path fails with a clear error when there is no driver, and the CPU twins of the
//! `train.cu` kernels whose indexing is their own (each run as the GPU runs it, thread by
//! thread, on shapes that cross its blocks' edges).

use super::*;
use roofline_kernels::cuda::device;

#[test]
fn filter_layouts_round_trip_and_put_k_outermost() {
    let (depth, k) = (3 * 3 * 2, 4);
    let w: Vec<f32> = (0..depth * k).map(|i| i as f32).collect();
    let t = rsck_to_krsc(&w, depth, k);
    // KRSC: filter j's depth run is contiguous; element (d, j) of RSCK is d·k + j.
    assert_eq!(t[2 * depth + 5], w[5 * k + 2]);
    assert_eq!(krsc_to_rsck(&t, depth, k), w);
}

/// `sgd_slots` as the GPU runs it, thread by thread: block row `s` of the 2-D grid takes
/// slot `s` from the table, `gx` blocks of 256 threads stride over it; the 16-bit copy (bits)
/// in `w16`'s storage when there is one.
fn sgd_slots_twin(
    (w, g, v): (&mut [f32], &[f32], &mut [f32]),
    mut w16: Option<(Storage, &mut [u16])>,
    table: &[u8],
    slots: usize,
    gx: usize,
    (decay_all, step, mu, wd): (bool, &[f32; 4], f32, f32),
) {
    // The step's scalars as the kernel reads them from the device: [lr, inv_scale, ...].
    let (lr, inv) = (step[0], step[1]);
    let u64_at = |k: usize| u64::from_ne_bytes(table[8 * k..8 * k + 8].try_into().unwrap());
    let u32_at = |k: usize| {
        let b = 16 * slots + 4 * k;
        u32::from_ne_bytes(table[b..b + 4].try_into().unwrap())
    };
    for s in 0..slots {
        let (o, n) = (u64_at(s) as usize, u64_at(slots + s) as usize);
        let d = if decay_all || u32_at(s) != 0 { wd } else { 0.0 };
        for bx in 0..gx {
            for tx in 0..256 {
                let mut i = bx * 256 + tx;
                while i < n {
                    let j = o + i;
                    let vi = mu * v[j] + g[j] * inv + d * w[j];
                    v[j] = vi;
                    let wj = w[j] - lr * vi;
                    w[j] = wj;
                    if let Some((dt, h)) = w16.as_mut() {
                        h[j] = narrow(*dt, &[wj])[0];
                    }
                    i += gx * 256;
                }
            }
        }
    }
}

#[test]
fn one_optimizer_launch_updates_every_slot_once_as_slot_by_slot_sgd_does() {
    // Lengths that cross the block edges (255, 256, 257), span several strides, and one
    // slot of a single element; decays as a ResNet's (filters yes, batch norm no).
    let lens = [255, 256, 257, 1, 3000, 700];
    let decays = [true, false, true, false, true, false];
    let mut slots = Vec::new();
    let mut off = 0;
    for (&len, &decay) in lens.iter().zip(&decays) {
        slots.push(Slot {
            off,
            len,
            decay,
            conv: None,
        });
        off += len;
    }
    let total = off;
    let wave = |k: usize, a: f32| {
        (0..total)
            .map(|i| ((i * k) % 97) as f32 / 97.0 - a)
            .collect::<Vec<f32>>()
    };
    let (w0, g, v0) = (wave(7, 0.5), wave(13, 0.4), wave(29, 0.1));
    let (mu, wd) = (0.9f32, 1e-4);
    let f16_scale = LossScale {
        scale: 1024.0,
        good: 0,
        dynamic: true,
    };
    // What the host writes for the kernel: lr 0.1, unscaled by 1024 on one rank.
    let step = step_scalars(0.1, &f16_scale, 1);
    assert_eq!(step, [0.1, 1.0 / 1024.0, 1024.0, 0.0]);
    assert_eq!(step_scalars(0.1, &f16_scale, 4)[1], 1.0 / 4096.0);
    let (lr, inv) = (step[0], step[1]);
    for (decay_all, w16) in [
        (false, None),
        (true, None),
        (false, Some(Storage::F16)),
        (true, Some(Storage::Bf16)),
    ] {
        for gx in [1, 2, 5] {
            let (mut w, mut v) = (w0.clone(), v0.clone());
            let mut h = vec![0u16; total];
            let table = slot_table(&slots);
            sgd_slots_twin(
                (&mut w, &g, &mut v),
                w16.map(|dt| (dt, &mut h[..])),
                &table,
                slots.len(),
                gx,
                (decay_all, &step, mu, wd),
            );
            // Slot by slot, every element once.
            let (mut w2, mut v2) = (w0.clone(), v0.clone());
            for s in &slots {
                let d = if decay_all || s.decay { wd } else { 0.0 };
                for j in s.off..s.off + s.len {
                    v2[j] = mu * v2[j] + g[j] * inv + d * w2[j];
                    w2[j] -= lr * v2[j];
                }
            }
            assert_eq!(w, w2, "gx {gx}, decay_all {decay_all}");
            assert_eq!(v, v2);
            // The 16-bit copy is the new f32 weights rounded, every element written.
            if let Some(dt) = w16 {
                assert_eq!(h, narrow(dt, &w2), "gx {gx}, {}", dt.name());
            }
        }
    }
}

#[test]
fn a_loss_readout_is_read_as_softmax_xent_writes_it() {
    // Three rows: losses 1, 2, 3 (f64), then the ranks of their labels 1, 3, 7 (i32).
    let mut bytes: Vec<u8> = [1.0f64, 2.0, 3.0]
        .iter()
        .flat_map(|v| v.to_ne_bytes())
        .collect();
    bytes.extend([1i32, 3, 7].iter().flat_map(|r| r.to_ne_bytes()));
    let (loss, top1, top5) = classify::Loss { rows: 3 }.read(&bytes).unwrap();
    assert_eq!((loss, top1, top5), (2.0, 1, 2));
    assert!(classify::Loss { rows: 3 }.read(&bytes[..30]).is_err());
}

#[test]
fn f16_loss_scale_halves_on_overflow_and_grows_after_a_run_of_good_steps() {
    let mut s = LossScale::for_step(Prec::F16, Wire::F32);
    assert_eq!(s.scale, 1024.0);
    assert!(!s.update(true), "an overflow skips the step");
    assert_eq!(s.scale, 512.0);
    for _ in 0..999 {
        assert!(s.update(false));
    }
    assert_eq!(s.scale, 512.0);
    assert!(s.update(false));
    assert_eq!(s.scale, 1024.0);
    let mut b = LossScale::for_step(Prec::Bf16, Wire::F32);
    assert_eq!(b.scale, 1.0);
    assert!(b.update(false));
    assert_eq!(b.scale, 1.0);
    // f16 gradients on the wire scale even f32 convolutions; bf16 on the wire needs none.
    assert_eq!(LossScale::for_step(Prec::F32, Wire::F16).scale, 1024.0);
    assert_eq!(LossScale::for_step(Prec::Tf32, Wire::Bf16).scale, 1.0);
}

#[test]
fn normwise_error_and_precision_names() {
    assert_eq!(normwise(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
    assert!((normwise(&[1.0, 0.0], &[0.0, 1.0]) - 2f64.sqrt()).abs() < 1e-12);
    assert!(normwise(&[f32::NAN], &[1.0]).is_infinite());
    assert!(normwise(&[1.0], &[1.0, 2.0]).is_infinite());
    assert!(tolerance(Prec::F32) < tolerance(Prec::Tf32));
    // A stage stopped by an error is a failed row that keeps the stage's name and the error.
    let hard = Check::hard(
        "GPU detector self-test",
        &CudaError::Check("no kernel".into()),
    );
    assert!(!hard.passed() && hard.stopped());
    assert!(!Check {
        name: "conv".into(),
        error: f64::INFINITY,
        tolerance: 1e-4
    }
    .stopped());
    assert!(
        hard.name
            .starts_with("GPU detector self-test: stopped by an error")
            && hard.name.contains("no kernel"),
        "{}",
        hard.name
    );
}

#[test]
fn without_a_driver_the_gpu_cannot_open_and_says_why() {
    if roofline_kernels::cuda::libs::present(roofline_kernels::cuda::libs::Lib::Driver) {
        return; // a machine with a driver: nothing to show here
    }
    let e = device::init().unwrap_err().to_string();
    assert!(e.contains("no NVIDIA driver"), "{e}");
}

#[test]
fn sixteen_bit_storage_rounds_to_nearest_even_and_widens_exactly() {
    // bf16: 1 + 2⁻⁸ is halfway between 1 and 1 + 2⁻⁷: the even one (1) wins; 1 + 3·2⁻⁸ is
    // halfway between 1 + 2⁻⁷ and 1 + 2⁻⁶: the even one (1 + 2⁻⁶) wins.
    let v = [
        1.0 + 2f32.powi(-8),
        1.0 + 3.0 * 2f32.powi(-8),
        -2.5,
        65504.0,
        1e-8,
    ];
    let b = narrow(Storage::Bf16, &v);
    assert_eq!(b[0], 0x3f80);
    assert_eq!(b[1], 0x3f82);
    assert_eq!(widen(Storage::Bf16, &b)[2], -2.5);
    // f16: 1 + 2⁻¹¹ ties to 1; 65504 is f16's largest; 1e-8 is below its smallest subnormal
    // (2⁻²⁴ ≈ 6e-8) and rounds to zero.
    let h = narrow(Storage::F16, &[1.0 + 2f32.powi(-11), 65504.0, 1e-8, -2.5]);
    assert_eq!(widen(Storage::F16, &h), vec![1.0, 65504.0, 0.0, -2.5]);
    // Widening is exact: every 16-bit value comes back from f32 as itself.
    for bits in (0..=u16::MAX).step_by(7) {
        for dt in [Storage::F16, Storage::Bf16] {
            let f = widen(dt, &[bits])[0];
            if f.is_finite() {
                assert_eq!(narrow(dt, &[f])[0], bits, "{} {bits:#06x}", dt.name());
            }
        }
    }
}

#[test]
fn the_kernels_channel_stepping_is_the_index_mod_c() {
    // first_channel / channel_step / next_channel of train.cu (and the pack kernels' own, by
    // 4 or 8 values a thread where c is a multiple of 8), thread by thread: the channel each
    // grid-stride iteration reads is i mod c, and every element is visited once, for channel
    // counts below, at and above the block size and grids of one block, a few, and many.
    for c in [1usize, 3, 64, 255, 256, 257, 1000, 2048, 8, 24] {
        for pack in [1usize, 4, 8] {
            if pack > 1 && c % 8 != 0 {
                continue;
            }
            for (n, sms) in [(1000, 1), (5 * 256 + 3, 132), (200_003, 1), (200_003, 7)] {
                let n = n * c.min(8);
                let items = n / pack;
                let grid = grid_for(items, sms);
                let stride = grid * 256;
                let step = (stride * pack) % c;
                let mut seen = vec![false; items * pack];
                for t in 0..stride {
                    let mut ch = (t * pack) % c;
                    let mut p = t;
                    while p < items {
                        let i = p * pack;
                        assert_eq!(ch, i % c, "c {c}, pack {pack}, n {n}, grid {grid}");
                        assert!(ch + pack <= c, "a pack crosses a row");
                        for s in &mut seen[i..i + pack] {
                            assert!(!*s, "an element twice");
                            *s = true;
                        }
                        ch += step;
                        if ch >= c {
                            ch -= c;
                        }
                        p += stride;
                    }
                }
                assert!(seen.iter().all(|s| *s), "an element missed");
            }
        }
    }
}

/// `maxpool_forward` as the GPU runs it: each output its window's first maximum and the tap
/// (ky·3 + kx) it came from.
fn maxpool_forward_twin(x: &Tensor<f32>) -> (Tensor<f32>, Vec<u8>) {
    let (oh, ow) = (pool_out(x.h), pool_out(x.w));
    let (h, w, c) = (x.h, x.w, x.c);
    let mut y = Tensor::zeros(x.n, oh, ow, c);
    let mut tap = vec![0u8; y.data.len()];
    for (o, t) in tap.iter_mut().enumerate() {
        let (ch, p) = (o % c, o / c);
        let (ox, oy, img) = (p % ow, (p / ow) % oh, p / (ow * oh));
        let (mut best, mut at, mut found) = (0.0f32, 9u8, false);
        for ky in 0..3 {
            let iy = (oy * 2 + ky) as isize - 1;
            if iy < 0 || iy >= h as isize {
                continue;
            }
            for kx in 0..3 {
                let ix = (ox * 2 + kx) as isize - 1;
                if ix < 0 || ix >= w as isize {
                    continue;
                }
                let v = x.data[img * h * w * c + (iy as usize * w + ix as usize) * c + ch];
                if !found || v > best {
                    (best, at, found) = (v, (ky * 3 + kx) as u8, true);
                }
            }
        }
        y.data[o] = best;
        *t = at;
    }
    (y, tap)
}

/// `maxpool_backward` as the GPU runs it: each input element gathers, in output order, the
/// gradients of the windows whose winning tap it was.
fn maxpool_backward_twin(
    dy: &Tensor<f32>,
    tap: &[u8],
    (n, h, w): (usize, usize, usize),
) -> Tensor<f32> {
    let (c, oh, ow) = (dy.c, dy.h, dy.w);
    let mut dx = Tensor::zeros(n, h, w, c);
    for i in 0..dx.data.len() {
        let (ch, p) = (i % c, i / c);
        let (ix, iy, img) = (p % w, (p / w) % h, p / (w * h));
        let (oy0, oy1) = (iy / 2, iy.div_ceil(2).min(oh - 1));
        let (ox0, ox1) = (ix / 2, ix.div_ceil(2).min(ow - 1));
        let mut s = 0.0f32;
        for oy in oy0..=oy1 {
            for ox in ox0..=ox1 {
                let o = ((img * oh + oy) * ow + ox) * c + ch;
                let t = (iy + 1 - 2 * oy) * 3 + (ix + 1 - 2 * ox);
                if tap[o] as usize == t {
                    s += dy.data[o];
                }
            }
        }
        dx.data[i] = s;
    }
    dx
}

#[test]
fn max_pool_kernels_give_the_cpus_bits_ties_included() {
    let mut rng = roofline_models::data::Rng::new(0x9001);
    // Odd and even sizes (edge windows with 4 or 6 taps), channel counts around a warp, and
    // values on a coarse grid so that windows tie and the first maximum must win.
    for (n, h, w, c) in [(2, 7, 9, 3), (1, 8, 8, 5), (3, 13, 6, 33), (1, 2, 3, 1)] {
        let len = n * h * w * c;
        let x = Tensor::from_vec(
            n,
            h,
            w,
            c,
            (0..len)
                .map(|_| (rng.normal() * 2.0).round() as f32 / 2.0)
                .collect(),
        );
        let mut pool = roofline_models::layers::MaxPool::<f32>::default();
        let y = pool.forward(&x);
        let (yt, tap) = maxpool_forward_twin(&x);
        assert_eq!(yt.data, y.data, "{n}×{h}×{w}×{c} forward");
        let dy = Tensor::from_vec(
            y.n,
            y.h,
            y.w,
            c,
            (0..y.data.len()).map(|_| rng.normal() as f32).collect(),
        );
        let dx = pool.backward(&dy);
        let dxt = maxpool_backward_twin(&dy, &tap, (n, h, w));
        let same = dxt
            .data
            .iter()
            .zip(&dx.data)
            .all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{n}×{h}×{w}×{c} backward");
    }
}

/// `bn_sums_v` as the GPU runs it, with the host's launch (`sums_tiling`, `channel_sums`'
/// slices): how many times each (row, channel) is summed.
fn bn_sums_v_coverage(dt: Storage, rows: usize, c: usize, sms: usize) -> Vec<u32> {
    let (kernel, tiles, rows_per) = sums_tiling(dt, c);
    assert!(kernel.starts_with("bn_sums_v_"), "{kernel}");
    let slices = rows
        .div_ceil(rows_per)
        .clamp(1, (sms * 8).div_ceil(tiles).max(1));
    let v = 16 / dt.bytes();
    let packs = c / v;
    let cp = packs.min(32);
    let r_block = 256 / cp;
    assert_eq!(r_block, rows_per);
    let mut seen = vec![0u32; rows * c];
    for block in 0..tiles * slices {
        let (tile, slice) = (block % tiles, block / tiles);
        for thread in 0..256 {
            let (tx, ty) = (thread % cp, thread / cp);
            let pack = tile * cp + tx;
            if ty >= r_block || pack >= packs {
                continue;
            }
            let mut r = slice * r_block + ty;
            while r < rows {
                for k in 0..v {
                    seen[r * c + pack * v + k] += 1;
                }
                r += slices * r_block;
            }
        }
        // The reduction: thread j < cp·V adds column j of its tile, channel tile·cp·V + j.
        let width = cp * v;
        assert!(width <= 256 && r_block * width <= 2048, "shared memory");
    }
    seen
}

#[test]
fn the_pack_sums_cover_every_value_once() {
    // Channel counts from 8 (a pack per row) to past a 32-pack tile (2048), rows below,
    // at and past a block's, and grids of one SM and many.
    for dt in [Storage::F32, Storage::F16, Storage::Bf16] {
        for c in [8, 16, 24, 64, 72, 256, 264, 1024, 2048] {
            for rows in [1, 7, 31, 256, 1000] {
                for sms in [1, 132] {
                    let seen = bn_sums_v_coverage(dt, rows, c, sms);
                    assert!(
                        seen.iter().all(|&n| n == 1),
                        "{} c {c} rows {rows} sms {sms}",
                        dt.name()
                    );
                }
            }
        }
    }
}

/// The described-network check's networks: the small ResNet, its child by each morphism and
/// by all three, every op a description has in the last, each child starting from weights
/// that compute what its parent computes (the morphisms preserve the function), and the CPU
/// step that `--check` holds the GPU to moving every parameter.
#[test]
fn the_described_network_check_covers_every_morphism_and_op() {
    use roofline_models::graph::{Graph, Op};
    let nets = check_described::networks().unwrap();
    let names: Vec<&str> = nets.iter().map(|n| n.0.as_str()).collect();
    assert_eq!(nets.len(), 5, "{names:?}");
    for (i, kind) in ["deeper", "wider", "skip"].iter().enumerate() {
        assert!(names[i + 1].starts_with(kind), "{names:?}");
    }
    let (_, x, ..) = check_step::setup();
    let all = &nets[4].1;
    let has = |f: &dyn Fn(&Op) -> bool| all.nodes.iter().any(|n| f(&n.op));
    assert!(has(&|o| matches!(o, Op::Conv { kernel: 1, .. })));
    assert!(has(&|o| matches!(o, Op::Conv { kernel: 3, .. })));
    assert!(has(&|o| matches!(o, Op::Conv { kernel: 7, .. })));
    assert!(has(&|o| matches!(o, Op::BatchNorm { relu: true })));
    assert!(has(&|o| matches!(o, Op::BatchNorm { relu: false })));
    for op in [Op::Relu, Op::MaxPool, Op::Add, Op::GlobalAvgPool] {
        assert!(has(&|o| *o == op), "{op:?}");
    }
    assert!(has(&|o| matches!(o, Op::Dense { .. })));
    assert!(nets[1..].iter().all(|n| n.1 != nets[0].1 && n.2.is_some()));
    let logits = |d: &roofline_models::graph::Description,
                  c: Option<&roofline_models::checkpoint::Checkpoint>| {
        let mut g = Graph::<f32>::new(d.clone(), x.h, x.w, 11).unwrap();
        if let Some(c) = c {
            g.load(c).unwrap();
        }
        g.forward(&x, false).data
    };
    let parent = logits(&nets[0].1, None);
    for (name, d, init) in &nets[1..] {
        let e = normwise(&logits(d, init.as_ref()), &parent);
        assert!(
            e < 1e-4,
            "{name}: the child computes another function ({e})"
        );
    }
    for (name, d, init) in &nets {
        let o = check_described::cpu_outcome(d, init.as_ref()).unwrap();
        assert!(o.loss.is_finite(), "{name}");
        for (p, u) in &o.updates {
            assert!(u.iter().any(|v| *v != 0.0), "{name}: {p} did not move");
        }
    }
}
