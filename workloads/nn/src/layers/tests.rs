//! Finite-difference gradient checks in f64: for a layer f and a fixed random projection r,
//! L(x, θ) = Σ r·f(x, θ); the backward pass fed with r must give ∂L/∂x and ∂L/∂θ.
use super::*;
use crate::data::Rng;

pub(super) fn rand_tensor(n: usize, h: usize, w: usize, c: usize, seed: u64) -> Tensor<f64> {
    let mut r = Rng::new(seed);
    Tensor::from_vec(n, h, w, c, (0..n * h * w * c).map(|_| r.normal()).collect())
}

/// `t` rounded to f32.
pub(super) fn f32s(t: Tensor<f64>) -> Tensor<f32> {
    let data = t.data.iter().map(|&v| v as f32).collect();
    Tensor::from_vec(t.n, t.h, t.w, t.c, data)
}

fn dot(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

/// Central differences of `loss` over a sample of `v`'s entries against `grad`.
fn check(name: &str, v: &mut [f64], grad: &[f64], mut loss: impl FnMut(&[f64]) -> f64) {
    let h = 1e-5;
    let step = (v.len() / 23).max(1);
    for i in (0..v.len()).step_by(step) {
        let orig = v[i];
        v[i] = orig + h;
        let up = loss(v);
        v[i] = orig - h;
        let down = loss(v);
        v[i] = orig;
        let fd = (up - down) / (2.0 * h);
        let err = (fd - grad[i]).abs() / (fd.abs() + grad[i].abs()).max(1e-6);
        assert!(
            err < 1e-5,
            "{name}[{i}]: finite difference {fd}, backward {}",
            grad[i]
        );
    }
}

#[test]
fn conv_gradients() {
    let mut rng = Rng::new(1);
    for (stride, pad, r) in [(1, 1, 3), (2, 1, 3), (1, 0, 1), (2, 0, 1)] {
        let mut layer = Conv2d::<f64>::new("c", 3, 4, r, stride, pad, &mut rng);
        let x = Arc::new(rand_tensor(2, 5, 6, 3, 2));
        let y = layer.forward(&x);
        let proj = rand_tensor(y.n, y.h, y.w, y.c, 3);
        let dx = layer.backward(&proj);
        let mut xv = x.data.clone();
        let w = layer.weight.value.clone();
        let mut l2 = Conv2d::<f64>::new("c", 3, 4, r, stride, pad, &mut rng);
        l2.weight.value = w.clone();
        check("conv x", &mut xv, &dx.data, |v| {
            dot(
                &l2.forward(&Arc::new(Tensor::from_vec(2, 5, 6, 3, v.to_vec())))
                    .data,
                &proj.data,
            )
        });
        let mut wv = w.clone();
        let grad = layer.weight.grad.clone();
        check("conv w", &mut wv, &grad, |v| {
            l2.weight.value = v.to_vec();
            dot(&l2.forward(&x).data, &proj.data)
        });
    }
}

#[test]
fn batch_norm_gradients_and_running_statistics() {
    let mut bn = BatchNorm::<f64>::new("bn", 3, 1.0);
    bn.gamma.value = vec![0.5, 1.5, -0.7];
    bn.beta.value = vec![0.1, -0.2, 0.3];
    let x = rand_tensor(2, 3, 4, 3, 5);
    let y = bn.forward(&x, true);
    let proj = rand_tensor(2, 3, 4, 3, 6);
    let dx = bn.backward(&proj);
    let (g, b) = (bn.gamma.value.clone(), bn.beta.value.clone());
    let fresh = |g: &[f64], b: &[f64]| {
        let mut l = BatchNorm::<f64>::new("bn", 3, 1.0);
        l.gamma.value = g.to_vec();
        l.beta.value = b.to_vec();
        l
    };
    let mut xv = x.data.clone();
    check("bn x", &mut xv, &dx.data, |v| {
        dot(
            &fresh(&g, &b)
                .forward(&Tensor::from_vec(2, 3, 4, 3, v.to_vec()), true)
                .data,
            &proj.data,
        )
    });
    let mut gv = g.clone();
    check("bn gamma", &mut gv, &bn.gamma.grad.clone(), |v| {
        dot(&fresh(v, &b).forward(&x, true).data, &proj.data)
    });
    let mut bv = b.clone();
    check("bn beta", &mut bv, &bn.beta.grad.clone(), |v| {
        dot(&fresh(&g, v).forward(&x, true).data, &proj.data)
    });
    // Training output: per channel mean β, and running statistics moved 10% of the way.
    let m = y.rows() as f64;
    for j in 0..3 {
        let mean: f64 = (0..y.rows()).map(|r| y.data[r * 3 + j]).sum::<f64>() / m;
        assert!((mean - bn.beta.value[j]).abs() < 1e-12);
        let xm: f64 = (0..x.rows()).map(|r| x.data[r * 3 + j]).sum::<f64>() / m;
        assert!((bn.running_mean[j] - 0.1 * xm).abs() < 1e-12);
    }
    // Inference uses the running statistics.
    let yi = bn.forward(&x, false);
    let want = g[0] * (x.data[0] - bn.running_mean[0]) / (bn.running_var[0] + 1e-5).sqrt() + b[0];
    assert!((yi.data[0] - want).abs() < 1e-12);
}

#[test]
fn fused_batch_norm_relu_and_residual_match_the_separate_layers() {
    let x = rand_tensor(2, 3, 4, 3, 21);
    let proj = rand_tensor(2, 3, 4, 3, 22);
    let mut a = BatchNorm::<f64>::new("a", 3, 1.0);
    let mut b = BatchNorm::<f64>::new("b", 3, 1.0);
    let mut y1 = a.forward(&x, true);
    relu_forward(&mut y1);
    let y2 = b.forward_act(x.clone(), true, true);
    assert_eq!(y1, y2);
    let mut d1 = proj.clone();
    relu_backward(&y1, &mut d1);
    assert_eq!(a.backward(&d1), b.backward_act(&proj, Some(&y2)));
    assert_eq!(a.gamma.grad, b.gamma.grad);
    let mut r1 = x.clone();
    add_into(&mut r1, &proj);
    relu_forward(&mut r1);
    let mut r2 = x.clone();
    add_relu(&mut r2, &proj);
    assert_eq!(r1, r2);
}

/// The ReLU's mask recomputed from the kept input (`Gate::Affine`) against the ReLU's output
/// read (`Gate::Output`): the same bits, in f32, over a whole group of channels summed in
/// registers and the channels past it (69 = 64 + 5), and a chunk of rows and part of one.
#[test]
fn the_relu_mask_recomputed_from_the_input_gives_the_bits_of_the_output_read() {
    let (x, dy) = (
        f32s(rand_tensor(3, 11, 9, 69, 31)),
        f32s(rand_tensor(3, 11, 9, 69, 32)),
    );
    let run = |recompute: bool| {
        let mut bn = BatchNorm::<f32>::new("bn", 69, 1.0);
        bn.beta
            .value
            .iter_mut()
            .enumerate()
            .for_each(|(j, b)| *b = (j % 5) as f32 * 0.1 - 0.2);
        let y = bn.forward_act(x.clone(), true, true);
        assert!(bn.relu_affine.is_some());
        if !recompute {
            bn.relu_affine = None;
        }
        let dx = bn.backward_act(&dy, Some(&y));
        (dx, bn.gamma.grad.clone(), bn.beta.grad.clone())
    };
    assert_eq!(run(true), run(false));
}

#[test]
fn a_blocks_end_in_one_pass_matches_the_separate_layers_bit_for_bit() {
    let x = rand_tensor(2, 3, 4, 5, 31);
    let s = rand_tensor(2, 3, 4, 5, 32);
    let dsr = rand_tensor(2, 3, 4, 5, 33);
    for train in [true, false] {
        // Identity shortcut: bn, then relu(y + s).
        let (mut a, mut b) = (
            BatchNorm::<f64>::new("a", 5, 0.7),
            BatchNorm::<f64>::new("b", 5, 0.7),
        );
        let mut want = a.forward_act(x.clone(), train, false);
        add_relu(&mut want, &s);
        let got = b.forward_add_relu(x.clone(), Shortcut::Identity(&s), train);
        assert_eq!(want, got, "identity, train {train}");
        assert_eq!(a.running_mean, b.running_mean);
        // Projection: both batch norms, the sum and the ReLU; both keep their inputs for the
        // backward pass.
        let (mut a, mut b) = (
            BatchNorm::<f64>::new("a", 5, 0.7),
            BatchNorm::<f64>::new("b", 5, 0.7),
        );
        let (mut pa, mut pb) = (
            BatchNorm::<f64>::new("p", 5, 1.3),
            BatchNorm::<f64>::new("q", 5, 1.3),
        );
        let mut want = a.forward_act(x.clone(), train, false);
        let p = pa.forward_act(dsr.clone(), train, false);
        add_relu(&mut want, &p);
        let got = b.forward_add_relu(x.clone(), Shortcut::Projected(&mut pb, dsr.clone()), train);
        assert_eq!(want, got, "projected, train {train}");
        assert_eq!(pa.running_var, pb.running_var);
        if train {
            // Backward: the ReLU's mask, then each batch norm, against the fused passes.
            let dy = rand_tensor(2, 3, 4, 5, 34);
            let mut g = dy.clone();
            relu_backward(&want, &mut g);
            let (gx, gs) = b.backward_add_relu(dy, &got, Some(&mut pb));
            assert_eq!(a.backward(&g), gx, "projected: branch gradient");
            assert_eq!(pa.backward(&g), gs, "projected: shortcut gradient");
            assert_eq!(a.gamma.grad, b.gamma.grad);
            assert_eq!(a.beta.grad, b.beta.grad);
            assert_eq!(pa.gamma.grad, pb.gamma.grad);
            assert_eq!(pa.beta.grad, pb.beta.grad);
        }
    }
    // The identity shortcut's backward pass hands back the masked gradient itself.
    let (mut a, mut b) = (
        BatchNorm::<f64>::new("a", 5, 0.7),
        BatchNorm::<f64>::new("b", 5, 0.7),
    );
    let mut want = a.forward_act(x.clone(), true, false);
    add_relu(&mut want, &s);
    let got = b.forward_add_relu(x.clone(), Shortcut::Identity(&s), true);
    let dy = rand_tensor(2, 3, 4, 5, 35);
    let mut g = dy.clone();
    relu_backward(&want, &mut g);
    let (gx, gs) = b.backward_add_relu(dy, &got, None);
    assert_eq!(a.backward(&g), gx, "identity: branch gradient");
    assert_eq!(g, gs, "identity: shortcut gradient");
    assert_eq!(a.gamma.grad, b.gamma.grad);
}

/// The block end's backward pass against finite differences of Σ r·relu(bn(x) + bn_s(s)), for
/// x, s and both batch norms' γ and β.
#[test]
fn a_blocks_end_backward_matches_finite_differences() {
    let x = rand_tensor(2, 3, 2, 4, 41);
    let s = rand_tensor(2, 3, 2, 4, 42);
    let proj = rand_tensor(2, 3, 2, 4, 43);
    let (g, b) = (vec![0.5, 1.5, -0.7, 1.1], vec![0.1, -0.2, 0.3, 0.0]);
    let (gs, bs) = (vec![0.9, -1.2, 0.4, 0.8], vec![-0.1, 0.2, 0.05, 0.3]);
    let bn = |g: &[f64], b: &[f64]| {
        let mut l = BatchNorm::<f64>::new("bn", 4, 1.0);
        l.gamma.value = g.to_vec();
        l.beta.value = b.to_vec();
        l
    };
    let loss = |x: &[f64], s: &[f64], p: [&[f64]; 4]| {
        let (mut m, mut ms) = (bn(p[0], p[1]), bn(p[2], p[3]));
        let t = |v: &[f64]| Tensor::from_vec(2, 3, 2, 4, v.to_vec());
        let y = m.forward_add_relu(t(x), Shortcut::Projected(&mut ms, t(s)), true);
        dot(&y.data, &proj.data)
    };
    let (mut m, mut ms) = (bn(&g, &b), bn(&gs, &bs));
    let y = m.forward_add_relu(x.clone(), Shortcut::Projected(&mut ms, s.clone()), true);
    let (dx, ds) = m.backward_add_relu(proj.clone(), &y, Some(&mut ms));
    let p = [&g[..], &b[..], &gs[..], &bs[..]];
    let mut xv = x.data.clone();
    check("end x", &mut xv, &dx.data, |v| loss(v, &s.data, p));
    let mut sv = s.data.clone();
    check("end shortcut", &mut sv, &ds.data, |v| loss(&x.data, v, p));
    let grads = [
        m.gamma.grad.clone(),
        m.beta.grad.clone(),
        ms.gamma.grad.clone(),
        ms.beta.grad.clone(),
    ];
    for (i, grad) in grads.iter().enumerate() {
        let mut v = p[i].to_vec();
        check("end γ/β", &mut v, grad, |v| {
            let mut q = p;
            q[i] = v;
            loss(&x.data, &s.data, q)
        });
    }
}

#[test]
fn relu_pool_linear_and_loss_gradients() {
    // ReLU
    let x = rand_tensor(2, 3, 3, 2, 7);
    let proj = rand_tensor(2, 3, 3, 2, 8);
    let mut y = x.clone();
    relu_forward(&mut y);
    let mut dx = proj.clone();
    relu_backward(&y, &mut dx);
    let mut xv = x.data.clone();
    check("relu", &mut xv, &dx.data, |v| {
        let mut t = Tensor::from_vec(2, 3, 3, 2, v.to_vec());
        relu_forward(&mut t);
        dot(&t.data, &proj.data)
    });
    // Max pool
    let x = rand_tensor(2, 7, 6, 3, 9);
    let mut mp = MaxPool::<f64>::default();
    let y = mp.forward(&x);
    assert_eq!((y.h, y.w), (4, 3));
    let proj = rand_tensor(y.n, y.h, y.w, y.c, 10);
    let dx = mp.backward(&proj);
    let mut xv = x.data.clone();
    check("maxpool", &mut xv, &dx.data, |v| {
        dot(
            &MaxPool::default()
                .forward(&Tensor::from_vec(2, 7, 6, 3, v.to_vec()))
                .data,
            &proj.data,
        )
    });
    // Max pool against the direct definition (each output the largest valid tap, the first
    // in (ky, kx) order among equals: ties in half the values), and its gradient routed there.
    let mut x = rand_tensor(2, 9, 8, 5, 13);
    for v in x.data.iter_mut().step_by(2) {
        *v = 0.25;
    }
    let y = mp.forward(&x);
    for n in 0..2 {
        for oy in 0..y.h {
            for ox in 0..y.w {
                for j in 0..5 {
                    let mut best: Option<(f64, usize)> = None;
                    for ky in 0..3 {
                        for kx in 0..3 {
                            let (iy, ix) = (oy * 2 + ky, ox * 2 + kx);
                            if iy == 0 || ix == 0 || iy > 9 || ix > 8 {
                                continue;
                            }
                            let i = ((iy - 1) * 8 + ix - 1) * 5 + j;
                            let v = x.data[n * 9 * 8 * 5 + i];
                            if best.is_none_or(|(b, _)| v > b) {
                                best = Some((v, i));
                            }
                        }
                    }
                    let o = ((n * y.h + oy) * y.w + ox) * 5 + j;
                    assert_eq!(
                        (y.data[o], mp.source(o)),
                        (best.unwrap().0, Some(best.unwrap().1)),
                        "output {o}"
                    );
                }
            }
        }
    }
    // Its gradient gathered per input element: the bits of a scatter of the output gradients
    // into zeros in output order (on the tied input above, where taps matter).
    let proj = rand_tensor(y.n, y.h, y.w, y.c, 14);
    let dx = mp.backward(&proj);
    let mut scatter = vec![0.0f64; x.data.len()];
    let per_out = y.h * y.w * 5;
    for (o, g) in proj.data.iter().enumerate() {
        let i = mp.source(o).expect("every window holds its centre");
        scatter[(o / per_out) * 9 * 8 * 5 + i] += g;
    }
    assert_eq!(dx.data, scatter, "max pool gradient");
    // With a batch norm's map and ReLU applied as the taps are read: the bits and the taps of
    // the pool of the mapped tensor (ties at zero from the ReLU included).
    let (a, d) = ([0.5, -1.5, 2.0, 0.0, 1.0], [0.1, 0.0, -0.2, 0.3, -0.05]);
    let mapped = Tensor::from_vec(
        x.n,
        x.h,
        x.w,
        x.c,
        x.data
            .iter()
            .enumerate()
            .map(|(i, v)| (v * a[i % 5] + d[i % 5]).max(0.0))
            .collect(),
    );
    let mut fused = MaxPool::<f64>::default();
    let want = mp.forward(&mapped);
    assert_eq!(
        fused.forward_relu_affine(&x, &a, &d).data,
        want.data,
        "mapped pool"
    );
    assert!(
        (0..want.len()).all(|o| fused.source(o) == mp.source(o)),
        "mapped pool's taps"
    );
    // Global average pool
    let x = rand_tensor(2, 3, 4, 5, 11);
    let proj = rand_tensor(2, 1, 1, 5, 12);
    let dx = avgpool_backward(&proj, 3, 4);
    let mut xv = x.data.clone();
    check("avgpool", &mut xv, &dx.data, |v| {
        dot(
            &avgpool_forward(&Tensor::from_vec(2, 3, 4, 5, v.to_vec())).data,
            &proj.data,
        )
    });
    // Linear
    let mut rng = Rng::new(13);
    let mut lin = Linear::<f64>::new("fc", 5, 4, &mut rng);
    let x = rand_tensor(3, 1, 1, 5, 14);
    let y = lin.forward(&x);
    let proj = rand_tensor(y.n, 1, 1, 4, 15);
    let dx = lin.backward(&proj);
    let (w, b) = (lin.weight.value.clone(), lin.bias.value.clone());
    let mut other = Linear::<f64>::new("fc", 5, 4, &mut rng);
    let mut xv = x.data.clone();
    other.weight.value = w.clone();
    other.bias.value = b.clone();
    check("linear x", &mut xv, &dx.data, |v| {
        dot(
            &other
                .forward(&Tensor::from_vec(3, 1, 1, 5, v.to_vec()))
                .data,
            &proj.data,
        )
    });
    let mut wv = w.clone();
    check("linear w", &mut wv, &lin.weight.grad.clone(), |v| {
        other.weight.value = v.to_vec();
        dot(&other.forward(&x).data, &proj.data)
    });
    other.weight.value = w.clone();
    let mut bv = b.clone();
    check("linear b", &mut bv, &lin.bias.grad.clone(), |v| {
        other.bias.value = v.to_vec();
        dot(&other.forward(&x).data, &proj.data)
    });
    // Softmax cross-entropy with label smoothing
    let z = rand_tensor(4, 1, 1, 6, 16);
    let labels = [0usize, 5, 2, 2];
    let (_, g, _, _) = softmax_cross_entropy(&z, &labels, 0.1);
    let mut zv = z.data.clone();
    check("loss", &mut zv, &g.data, |v| {
        softmax_cross_entropy(&Tensor::from_vec(4, 1, 1, 6, v.to_vec()), &labels, 0.1).0
    });
}

#[test]
fn loss_values() {
    // Uniform logits: loss = ln K whatever the smoothing; top-1 counts ties as wrong only
    // when a larger logit exists.
    let z = Tensor::<f64>::zeros(2, 1, 1, 10);
    let (l, _, top1, top5) = softmax_cross_entropy(&z, &[3, 7], 0.1);
    assert!((l - 10f64.ln()).abs() < 1e-12);
    assert_eq!((top1, top5), (2, 2));
}

use crate::tensor::bf16_pool;

/// `v` rounded to bf16 as the products round their operands.
pub(super) fn rounded(v: &[f32]) -> Vec<crate::tensor::bf16> {
    let mut out = vec![std::mem::MaybeUninit::uninit(); v.len()];
    crate::tensor::round_bf16(v, &mut out);
    // SAFETY: round_bf16 wrote every element.
    out.iter().map(|b| unsafe { b.assume_init() }).collect()
}

/// With bf16 products, a batch norm + ReLU kept in bf16 gives the next convolution, its
/// filter gradient and the ReLU's backward pass the same bits as the f32 output (which every
/// product rounds as it packs it), for a 3×3 and a 1×1 convolution.
#[test]
fn half_activations_give_the_products_the_same_bits() {
    let pool = bf16_pool();
    let x = f32s(rand_tensor(2, 6, 5, 16, 51));
    for (r, pad) in [(3, 1), (1, 0)] {
        pool.install(|| {
            let mut rng = Rng::new(52);
            let conv = Conv2d::<f32>::new("c", 16, 24, r, 1, pad, &mut rng);
            let (mut c1, mut c2) = (conv, Conv2d::<f32>::new("c", 16, 24, r, 1, pad, &mut rng));
            c2.weight.value = c1.weight.value.clone();
            let (mut b1, mut b2) = (
                BatchNorm::<f32>::new("b", 16, 0.8),
                BatchNorm::<f32>::new("b", 16, 0.8),
            );
            let y = Arc::new(b1.forward_act(x.clone(), true, true));
            let h = b2.forward_relu(x.clone(), true);
            assert!(
                matches!(h, Act::Half(_)),
                "bf16 products keep bf16 activations"
            );
            let (z1, z2) = (c1.forward(&y), c2.forward_act(&h));
            assert_eq!(z1, z2, "{r}×{r} forward");
            let dz = f32s(rand_tensor(z1.n, z1.h, z1.w, z1.c, 53));
            let (d1, d2) = (c1.backward(&dz), c2.backward(&dz));
            assert_eq!(d1, d2, "{r}×{r} input gradient");
            assert_eq!(c1.weight.grad, c2.weight.grad, "{r}×{r} filter gradient");
            // The batch norm's input gradient, in f32 and kept in bf16, into the convolution
            // before it (as conv2's output gradient in a bottleneck): the same bits.
            let u = Arc::new(f32s(rand_tensor(2, 6, 5, 8, 54)));
            let mut rng = Rng::new(55);
            let (mut p1, mut p2, mut q1, mut q2) = (
                Conv2d::<f32>::new("p", 8, 16, r, 1, pad, &mut rng),
                Conv2d::<f32>::new("p", 8, 16, r, 1, pad, &mut rng),
                Conv2d::<f32>::new("q", 8, 16, r, 1, pad, &mut rng),
                Conv2d::<f32>::new("q", 8, 16, r, 1, pad, &mut rng),
            );
            p2.weight.value = p1.weight.value.clone();
            (q1.weight.value, q2.weight.value) = (p1.weight.value.clone(), p1.weight.value.clone());
            for c in [&mut p1, &mut p2, &mut q1, &mut q2] {
                c.forward(&u);
            }
            let g1 = b1.backward_act(&d1, Some(&y));
            let g2 = b2.backward_relu_act(&d2, &h);
            assert!(
                matches!(g2, Act::Half(_)),
                "bf16 products keep bf16 gradients"
            );
            assert_eq!(b1.gamma.grad, b2.gamma.grad);
            assert_eq!(b1.beta.grad, b2.beta.grad);
            assert_eq!(
                p1.backward(&g1),
                p2.backward_act(&g2),
                "{r}×{r} input gradient from bf16"
            );
            assert_eq!(
                p1.weight.grad, p2.weight.grad,
                "{r}×{r} filter gradient from bf16"
            );
            let prior = f32s(rand_tensor(2, 6, 5, 8, 56));
            let (mut s1, mut s2) = (prior.clone(), prior);
            q1.backward_add(&Act::Full(Arc::new(g1)), &mut s1);
            q2.backward_add(&g2, &mut s2);
            assert_eq!(s1, s2, "{r}×{r} input gradient added, from bf16");
            assert_eq!(q1.weight.grad, q2.weight.grad);
        });
    }
}

/// A batch norm + ReLU kept in bf16 rounds exactly the f32 pass's values, forward and
/// backward, where its rows go in several blocks per chunk (32 channels: 128 rows a block, 264
/// rows, the last block short).
#[test]
fn half_batch_norm_rounds_the_f32_values_block_by_block() {
    let pool = bf16_pool();
    let x = f32s(rand_tensor(2, 12, 11, 32, 61));
    let dy = f32s(rand_tensor(2, 12, 11, 32, 62));
    pool.install(|| {
        let (mut b1, mut b2) = (
            BatchNorm::<f32>::new("b", 32, 0.8),
            BatchNorm::<f32>::new("b", 32, 0.8),
        );
        let y = b1.forward_act(x.clone(), true, true);
        let h = b2.forward_relu(x.clone(), true);
        let Act::Half(hh) = &h else {
            panic!("bf16 products keep bf16 activations")
        };
        assert_eq!(hh.data, rounded(&y.data), "forward");
        let g1 = b1.backward_act(&dy, Some(&y));
        let Act::Half(g2) = b2.backward_relu_act(&dy, &h) else {
            panic!("bf16 products keep bf16 gradients")
        };
        assert_eq!(g2.data, rounded(&g1.data), "backward");
    });
}

/// The stem's path in bf16: the image kept in bf16 (`Act::of`) gives the convolution's output
/// and filter gradient the bits of the f32 image, and the batch norm's input gradient through
/// the recomputed ReLU mask (`backward_relu_recomputed_act`, no output kept) rounds exactly the
/// f32 pass's values. Without bf16 products both stay f32.
#[test]
fn half_stem_rounds_the_f32_values() {
    let x = f32s(rand_tensor(2, 9, 8, 3, 71));
    let dy = f32s(rand_tensor(2, 5, 4, 16, 72));
    let mut rng = Rng::new(73);
    let conv = Conv2d::<f32>::new("s", 3, 16, 7, 2, 3, &mut rng);
    let run = |act: Act<f32>| {
        let mut c = Conv2d::<f32>::new("s", 3, 16, 7, 2, 3, &mut Rng::new(73));
        c.weight.value = conv.weight.value.clone();
        let s = c.forward_act(&act);
        let mut b = BatchNorm::<f32>::new("b", 16, 0.8);
        let map = b.relu_maps(&s, true);
        b.keep_relu_input(Kept::Full(s.clone()), map);
        (c, b, s)
    };
    bf16_pool().install(|| {
        let h = Act::of(&x);
        assert!(matches!(h, Act::Half(_)), "the image in bf16");
        let (mut c1, mut b1, s1) = run(Act::Full(Arc::new(x.clone())));
        let (mut c2, mut b2, s2) = run(h);
        assert_eq!(s1, s2, "forward");
        let g1 = b1.backward_relu_recomputed(&dy);
        let g2 = b2.backward_relu_recomputed_act(&dy);
        let Act::Half(g2h) = &g2 else {
            panic!("bf16 products keep bf16 gradients")
        };
        assert_eq!(g2h.data, rounded(&g1.data), "batch norm's input gradient");
        assert_eq!(b1.gamma.grad, b2.gamma.grad);
        c1.backward_filter_only(&g1);
        c2.backward_filter_only_act(&g2);
        assert_eq!(c1.weight.grad, c2.weight.grad, "filter gradient");
    });
    assert!(matches!(Act::of(&x), Act::Full(_)), "f32 products keep f32");
    let (_, mut b, _) = run(Act::of(&x));
    assert!(matches!(b.backward_relu_recomputed_act(&dy), Act::Full(_)));
}

/// A block's end kept in bf16 (`forward_add_relu_act` with bf16 products) rounds exactly the
/// f32 pass's values, with its identity shortcut read from bf16 (the last block's output) or
/// a projection, in several blocks of rows per chunk; its backward pass reads the ReLU's mask
/// from the bf16 output and gives the f32 pass's gradients. Without bf16 products it keeps f32.
#[test]
fn half_block_end_rounds_the_f32_values() {
    let x = f32s(rand_tensor(2, 12, 11, 32, 71));
    let s = f32s(rand_tensor(2, 12, 11, 32, 72));
    let dy = f32s(rand_tensor(2, 12, 11, 32, 73));
    let half_s = Tensor {
        n: s.n,
        h: s.h,
        w: s.w,
        c: s.c,
        data: rounded(&s.data),
    };
    // The shortcut as the f32 pass reads it: bf16's values, widened.
    let wide_s = Tensor {
        data: half_s.data.iter().map(|v| v.to_f32()).collect(),
        ..s.clone()
    };
    let bn = |name| BatchNorm::<f32>::new(name, 32, 0.8);
    bf16_pool().install(|| {
        // The block's input as the max pool's output is kept, and back in f32 (a stage's
        // output for a feature pyramid).
        let Act::Half(kept) = Act::kept(s.clone()) else {
            panic!("bf16 products keep bf16 activations")
        };
        assert_eq!(kept.data, half_s.data, "kept: rounded");
        assert_eq!(*Act::Half(kept).full(), wide_s, "full: widened exactly");
        let (mut b1, mut b2) = (bn("b"), bn("b"));
        let y = b1.forward_add_relu(x.clone(), Shortcut::Identity(&wide_s), true);
        let Act::Half(h) =
            b2.forward_add_relu_act(x.clone(), Shortcut::IdentityHalf(&half_s), true)
        else {
            panic!("bf16 products keep the block's end in bf16")
        };
        assert_eq!(h.data, rounded(&y.data), "identity forward");
        let (g1, s1) = b1.backward_add_relu(dy.clone(), &y, None);
        let (g2, s2) = b2.backward_add_relu(dy.clone(), &h, None);
        assert_eq!((g1, s1), (g2, s2), "identity backward");
        assert_eq!(b1.gamma.grad, b2.gamma.grad);
        let (mut b1, mut b2, mut p1, mut p2) = (bn("b"), bn("b"), bn("p"), bn("p"));
        let y = b1.forward_add_relu(x.clone(), Shortcut::Projected(&mut p1, s.clone()), true);
        let Act::Half(h) =
            b2.forward_add_relu_act(x.clone(), Shortcut::Projected(&mut p2, s.clone()), true)
        else {
            panic!("bf16 products keep the block's end in bf16")
        };
        assert_eq!(h.data, rounded(&y.data), "projected forward");
        let want = b1.backward_add_relu(dy.clone(), &y, Some(&mut p1));
        assert_eq!(
            want,
            b2.backward_add_relu(dy.clone(), &h, Some(&mut p2)),
            "projected backward"
        );
        assert_eq!(p1.gamma.grad, p2.gamma.grad);
    });
    let mut b = bn("b");
    let kept = b.forward_add_relu_act(x.clone(), Shortcut::Identity(&s), true);
    assert!(matches!(kept, Act::Full(_)), "f32 products keep f32");
    assert!(
        matches!(Act::kept(s), Act::Full(_)),
        "f32 products keep f32"
    );
}
