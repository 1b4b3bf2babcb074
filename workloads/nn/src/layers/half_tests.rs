//! The layers' bf16 storage in bf16 training (convolution outputs, block-to-block gradients):
//! each against the f32 pass of the same values.

use super::tests::{f32s, rand_tensor, rounded};
use super::*;
use crate::tensor::{bf16, bf16_pool};

/// `t` rounded to bf16, and those values back in f32 (exactly).
fn halves(t: &Tensor<f32>) -> (Tensor<bf16>, Tensor<f32>) {
    let half = Tensor {
        data: rounded(&t.data),
        n: t.n,
        h: t.h,
        w: t.w,
        c: t.c,
    };
    let wide = Act::Half(Arc::new(half.clone())).into_full();
    (half, wide)
}

/// A block's end from an output gradient kept in bf16 (the next block's shortcut gradient in
/// bf16 training) gives the input gradients of the pass fed the same values in f32; an
/// identity shortcut's gradient stays in bf16 (the masked values: exact), a projection's is
/// its batch norm's input gradient in f32.
#[test]
fn half_block_end_takes_a_bf16_output_gradient() {
    let x = f32s(rand_tensor(2, 12, 11, 32, 81));
    let s = f32s(rand_tensor(2, 12, 11, 32, 82));
    let dy = f32s(rand_tensor(2, 12, 11, 32, 83));
    let (half_dy, wide_dy) = halves(&dy);
    let bn = |name| BatchNorm::<f32>::new(name, 32, 0.8);
    let full = |t: &Tensor<f32>| Act::Full(Arc::new(t.clone()));
    bf16_pool().install(|| {
        let (mut b1, mut b2) = (bn("b"), bn("b"));
        let y = b1.forward_add_relu_act(x.clone(), Shortcut::Identity(&s), true);
        b2.forward_add_relu_act(x.clone(), Shortcut::Identity(&s), true);
        let (g1, s1) = b1.backward_add_relu_act(full(&wide_dy), &y, None);
        let (g2, s2) = b2.backward_add_relu_act(Act::Half(Arc::new(half_dy.clone())), &y, None);
        assert_eq!(
            g1.into_full(),
            g2.into_full(),
            "identity: the branch's input gradient"
        );
        assert_eq!(b1.gamma.grad, b2.gamma.grad);
        let Act::Half(s2) = s2 else {
            panic!("a bf16 shortcut gradient stays bf16")
        };
        assert_eq!(
            s2.data,
            rounded(&s1.full().data),
            "identity: the masked gradient"
        );
        assert!(
            s2.data.iter().any(|v| v.to_f32() == 0.0),
            "masked somewhere"
        );
        let (mut b1, mut b2, mut p1, mut p2) = (bn("b"), bn("b"), bn("p"), bn("p"));
        let y = b1.forward_add_relu_act(x.clone(), Shortcut::Projected(&mut p1, s.clone()), true);
        b2.forward_add_relu_act(x.clone(), Shortcut::Projected(&mut p2, s.clone()), true);
        let (g1, s1) = b1.backward_add_relu_act(full(&wide_dy), &y, Some(&mut p1));
        let (g2, s2) =
            b2.backward_add_relu_act(Act::Half(Arc::new(half_dy.clone())), &y, Some(&mut p2));
        assert_eq!(
            g1.into_full(),
            g2.into_full(),
            "projected: the branch's input gradient"
        );
        let (Act::Full(s1), Act::Full(s2)) = (s1, s2) else {
            panic!("a projection's input gradient is f32")
        };
        assert_eq!(s1, s2, "projected: the projection's input gradient");
        assert_eq!(p1.gamma.grad, p2.gamma.grad);
    });
}

/// A batch norm + ReLU whose input is kept in bf16 (`forward_relu_kept`, a 1×1 convolution's
/// output in bf16 training) gives, forward and backward, the bits of the pass fed the same
/// values in f32.
#[test]
fn half_batch_norm_input_gives_the_f32_pass_of_its_values() {
    let x = f32s(rand_tensor(2, 12, 11, 32, 91));
    let dy = f32s(rand_tensor(2, 12, 11, 32, 92));
    let (half_x, wide_x) = halves(&x);
    bf16_pool().install(|| {
        let (mut b1, mut b2) = (
            BatchNorm::<f32>::new("b", 32, 0.8),
            BatchNorm::<f32>::new("b", 32, 0.8),
        );
        let y1 = b1.forward_relu(wide_x.clone(), true);
        let y2 = b2.forward_relu_kept(Kept::Half(half_x.clone()), true);
        let (Act::Half(h1), Act::Half(h2)) = (&y1, &y2) else {
            panic!("bf16 products keep bf16 activations")
        };
        assert_eq!(h1.data, h2.data, "forward");
        assert_eq!(b1.running_mean, b2.running_mean);
        let (Act::Half(g1), Act::Half(g2)) = (
            b1.backward_relu_act(&dy, &y1),
            b2.backward_relu_act(&dy, &y2),
        ) else {
            panic!("bf16 products keep bf16 gradients")
        };
        assert_eq!(g1.data, g2.data, "backward");
        assert_eq!(b1.gamma.grad, b2.gamma.grad);
        assert_eq!(b1.beta.grad, b2.beta.grad);
    });
}

/// A block's end whose branch input is kept in bf16 (`forward_add_relu_kept`, conv3's output
/// in bf16 training), or whose projection's is (`Shortcut::ProjectedHalf`), or both, gives the
/// output of the pass fed the same values in f32, and backward its gradients: each one whose
/// input was kept in bf16 rounded to bf16 (a convolution's output gradient), the others as
/// they were — with an identity shortcut and with a projection.
#[test]
fn half_block_end_input_gives_the_f32_pass_of_its_values() {
    let x = f32s(rand_tensor(2, 12, 11, 32, 101));
    let s = f32s(rand_tensor(2, 12, 11, 32, 102));
    let dy = f32s(rand_tensor(2, 12, 11, 32, 103));
    let (half_x, wide_x) = halves(&x);
    let (half_s, wide_s) = halves(&s);
    let bn = |name| BatchNorm::<f32>::new(name, 32, 0.8);
    let full = || Act::Full(Arc::new(dy.clone()));
    let kept = |half: bool, h: &Tensor<bf16>, w: &Tensor<f32>| {
        if half {
            Kept::Half(h.clone())
        } else {
            Kept::Full(w.clone())
        }
    };
    // (branch in bf16, projection: None for an identity, Some(in bf16)).
    let cases = [
        (true, None),
        (true, Some(false)),
        (true, Some(true)),
        (false, Some(true)),
    ];
    bf16_pool().install(|| {
        for (half_branch, projection) in cases {
            let case = format!("branch in bf16 {half_branch}, projection {projection:?}");
            let (mut b1, mut b2, mut p1, mut p2) = (bn("b"), bn("b"), bn("p"), bn("p"));
            let x2 = kept(half_branch, &half_x, &wide_x);
            let (y1, y2) = match projection {
                Some(half_p) => (
                    b1.forward_add_relu_act(
                        wide_x.clone(),
                        Shortcut::Projected(&mut p1, wide_s.clone()),
                        true,
                    ),
                    b2.forward_add_relu_kept(
                        x2,
                        Shortcut::projected(&mut p2, kept(half_p, &half_s, &wide_s)),
                        true,
                    ),
                ),
                None => (
                    b1.forward_add_relu_act(wide_x.clone(), Shortcut::Identity(&wide_s), true),
                    b2.forward_add_relu_kept(x2, Shortcut::Identity(&wide_s), true),
                ),
            };
            let (Act::Half(h1), Act::Half(h2)) = (&y1, &y2) else {
                panic!("bf16 products keep the block's end in bf16")
            };
            assert_eq!(h1.data, h2.data, "forward, {case}");
            let projected = projection.is_some();
            let (q1, q2) = (projected.then_some(&mut p1), projected.then_some(&mut p2));
            let (g1, s1) = b1.backward_add_relu_act(full(), &y1, q1);
            let (g2, s2) = b2.backward_add_relu_act(full(), &y2, q2);
            let same_or_rounded = |half: bool, a: Act<f32>, b: Act<f32>, what: &str| match (a, b) {
                (Act::Full(a), Act::Half(b)) if half => {
                    assert_eq!(b.data, rounded(&a.data), "{what}, {case}")
                }
                (a, b) if !half => assert_eq!(a.into_full(), b.into_full(), "{what}, {case}"),
                _ => panic!("{what}: f32 from an f32 input, bf16 from a bf16 one, {case}"),
            };
            same_or_rounded(half_branch, g1, g2, "the branch's gradient");
            same_or_rounded(projection == Some(true), s1, s2, "the shortcut's gradient");
            assert_eq!(b1.gamma.grad, b2.gamma.grad);
            assert_eq!(p1.gamma.grad, p2.gamma.grad);
            assert_eq!(p1.beta.grad, p2.beta.grad);
        }
    });
}

/// The stem's convolution output kept in bf16 (`Conv2d::forward_kept` on the 7×7 stride-2
/// path) gives the batch norm's map, the max pool (reading it through that map) and the
/// batch norm's input gradient of the pass fed the same values in f32, to the bit.
#[test]
fn half_stem_output_gives_the_f32_pass_of_its_values() {
    let x = f32s(rand_tensor(2, 9, 8, 3, 111));
    let dy = f32s(rand_tensor(2, 5, 4, 16, 112));
    let mut rng = super::super::data::Rng::new(113);
    let mut conv = Conv2d::<f32>::new("s", 3, 16, 7, 2, 3, &mut rng);
    bf16_pool().install(|| {
        let Kept::Half(half) = conv.forward_kept(&Act::of(&x)) else {
            panic!("bf16 products keep the stem's output in bf16")
        };
        let wide = Act::Half(Arc::new(half.clone())).into_full();
        let (mut b1, mut b2) = (
            BatchNorm::<f32>::new("b", 16, 0.8),
            BatchNorm::<f32>::new("b", 16, 0.8),
        );
        let (m1, m2) = (b1.relu_maps(&wide, true), b2.relu_maps(&half, true));
        assert_eq!(m1, m2, "the batch norm's map");
        let (mut p1, mut p2) = (MaxPool::<f32>::default(), MaxPool::<f32>::default());
        let y1 = p1.forward_relu_affine(&wide, &m1.0, &m1.1);
        let y2 = p2.forward_relu_affine(&half, &m2.0, &m2.1);
        assert_eq!(y1, y2, "max pool");
        assert!((0..y1.len()).all(|o| p1.source(o) == p2.source(o)), "taps");
        b1.keep_relu_input(Kept::Full(wide), m1);
        b2.keep_relu_input(Kept::Half(half), m2);
        let (Act::Half(g1), Act::Half(g2)) = (
            b1.backward_relu_recomputed_act(&dy),
            b2.backward_relu_recomputed_act(&dy),
        ) else {
            panic!("bf16 products keep bf16 gradients")
        };
        assert_eq!(g1.data, g2.data, "backward");
        assert_eq!(b1.gamma.grad, b2.gamma.grad);
        assert_eq!(b1.beta.grad, b2.beta.grad);
    });
}
