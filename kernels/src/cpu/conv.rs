//! 2-D convolution, f32, NHWC activations and RSCK (HWIO) weights, written for both the probe
//! and the trainer: a 1×1 stride-1 convolution is one GEMM over the activations as they lie;
//! every other shape is an im2col in blocks of output rows (each block's patch matrix stays in
//! the cache) followed by a GEMM of the block, blocks spread over the rayon pool.

use crate::buffer::Buffer;
use crate::cpu::gemm::{check_product, matmul, noise, Shape};
use crate::driver::{CheckError, Kernel};
use crate::ProbeError;
use gemm::Parallelism;
use rayon::prelude::*;
use std::cell::RefCell;

/// One convolution layer's shape: input `n × h × w × c`, `k` filters of `r × s × c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConvShape {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub r: usize,
    pub s: usize,
    pub stride: usize,
    pub pad: usize,
}

impl ConvShape {
    pub fn oh(&self) -> usize {
        (self.h + 2 * self.pad - self.r) / self.stride + 1
    }
    pub fn ow(&self) -> usize {
        (self.w + 2 * self.pad - self.s) / self.stride + 1
    }
    /// Output rows of the implicit GEMM (n × oh × ow).
    pub fn rows(&self) -> usize {
        self.n * self.oh() * self.ow()
    }
    /// Reduction length of the implicit GEMM (r × s × c).
    pub fn depth(&self) -> usize {
        self.r * self.s * self.c
    }
    /// FLOPs of the forward pass: 2 × n × oh × ow × k × r × s × c.
    pub fn flops(&self) -> f64 {
        2.0 * self.rows() as f64 * self.k as f64 * self.depth() as f64
    }
    /// Bytes the forward pass must move at least: input, weights and output once each.
    pub fn min_bytes(&self) -> f64 {
        4.0 * (self.n * self.h * self.w * self.c + self.depth() * self.k + self.rows() * self.k)
            as f64
    }
    pub fn input_len(&self) -> usize {
        self.n * self.h * self.w * self.c
    }
    pub fn weight_len(&self) -> usize {
        self.depth() * self.k
    }
    pub fn output_len(&self) -> usize {
        self.rows() * self.k
    }
    pub fn valid(&self) -> bool {
        self.n > 0
            && self.c > 0
            && self.k > 0
            && self.r > 0
            && self.s > 0
            && self.stride > 0
            && self.h + 2 * self.pad >= self.r
            && self.w + 2 * self.pad >= self.s
    }
    pub fn describe(&self) -> String {
        format!(
            "n={} c={} h={} w={} k={} r={} s={} stride={} pad={}",
            self.n, self.c, self.h, self.w, self.k, self.r, self.s, self.stride, self.pad
        )
    }
    /// 1×1, stride 1, no padding: the convolution is one GEMM (the GEMM ceiling's kernel).
    pub fn is_pointwise(&self) -> bool {
        self.r == 1 && self.s == 1 && self.stride == 1 && self.pad == 0
    }
}

/// A named layer shape.
#[derive(Clone, Debug)]
pub struct Layer {
    pub name: String,
    pub shape: ConvShape,
}

/// The distinct convolution shapes of ResNet-50 v1.5 (stride 2 in the 3×3 convolution of each
/// down-sampling bottleneck) for a batch of `n` images of 224×224.
pub fn resnet50_layers(n: usize) -> Vec<Layer> {
    distinct(resnet50_convs(n, 3, (224, 224), ""))
}

/// All 53 convolutions of ResNet-50 v1.5, in order (shapes repeat), for `n` images of 224×224.
pub fn resnet50_all(n: usize) -> Vec<Layer> {
    resnet50_convs(n, 3, (224, 224), "")
}

/// The batch the EWA detector trains at (`train --workload ewa`).
pub const EWA_BATCH: usize = 2;

/// The distinct convolution shapes of the EWA detector (Faster R-CNN, ResNet-50-FPN) for `n`
/// images of 16 channels and 768×1152: the backbone, the pyramid's lateral 1×1 and output 3×3
/// convolutions at C2–C5's sizes, and the RPN's 3×3, objectness and box convolutions at each
/// level P2–P6 (9 anchors a cell). The workloads' gate checks this list against the model's own
/// walk.
pub fn ewa_layers(n: usize) -> Vec<Layer> {
    let mut v = resnet50_convs(n, 16, (768, 1152), "ewa backbone ");
    let layer = |name: String, c, (h, w): (usize, usize), k, r| Layer {
        name,
        shape: ConvShape {
            n,
            c,
            h,
            w,
            k,
            r,
            s: r,
            stride: 1,
            pad: r / 2,
        },
    };
    // C2–C5: after the stem (7×7/2) and the max pool, then halved by each stage.
    let half = |x: usize| (x + 2 - 3) / 2 + 1;
    let stem = |x: usize| (x + 6 - 7) / 2 + 1;
    let mut sizes = vec![(half(stem(768)), half(stem(1152)))];
    for l in 1..4 {
        let (h, w): (usize, usize) = sizes[l - 1];
        sizes.push((half(h), half(w)));
    }
    let (h5, w5) = sizes[3];
    let p6 = (h5.div_ceil(2), w5.div_ceil(2));
    for (i, (&size, c)) in sizes.iter().zip([256, 512, 1024, 2048]).enumerate() {
        v.push(layer(format!("ewa fpn lateral {i} 1x1"), c, size, 256, 1));
        v.push(layer(format!("ewa fpn output {i} 3x3"), 256, size, 256, 3));
    }
    for (l, size) in sizes.iter().copied().chain([p6]).enumerate() {
        let p = l + 2;
        v.push(layer(format!("ewa rpn conv P{p} 3x3"), 256, size, 256, 3));
        v.push(layer(format!("ewa rpn cls P{p} 1x1"), 256, size, 9, 1));
        v.push(layer(format!("ewa rpn reg P{p} 1x1"), 256, size, 36, 1));
    }
    distinct(v)
}

/// `layers` without the shapes that repeat (the first name kept).
pub fn distinct(mut v: Vec<Layer>) -> Vec<Layer> {
    let mut seen = Vec::new();
    v.retain(|l| {
        let dup = seen.contains(&l.shape);
        seen.push(l.shape);
        !dup
    });
    v
}

/// All 53 of ResNet-50 v1.5's convolutions, in order, for `n` images of `c_in` channels and `(h, w)`,
/// each named after `prefix`.
fn resnet50_convs(n: usize, c_in: usize, (h, w): (usize, usize), prefix: &str) -> Vec<Layer> {
    let conv = |name: &str, c, (h, w): (usize, usize), k, r, stride| Layer {
        name: format!("{prefix}{name}"),
        shape: ConvShape {
            n,
            c,
            h,
            w,
            k,
            r,
            s: r,
            stride,
            pad: r / 2,
        },
    };
    let stem = conv("conv1 7x7/2", c_in, (h, w), 64, 7, 2);
    let pool = |x: usize| (x + 2 - 3) / 2 + 1;
    let mut size = (pool(stem.shape.oh()), pool(stem.shape.ow()));
    let mut v = vec![stem];
    // (stage, input channels, bottleneck width, blocks)
    for (stage, cin, width, blocks) in [
        (2, 64, 64, 3),
        (3, 256, 128, 4),
        (4, 512, 256, 6),
        (5, 1024, 512, 3),
    ] {
        let out = 4 * width;
        let first_stride = if stage == 2 { 1 } else { 2 };
        let p = format!("layer{}", stage - 1);
        let c2 = conv(
            &format!("{p}.0 conv2 3x3/{first_stride}"),
            width,
            size,
            width,
            3,
            first_stride,
        );
        let hout = (c2.shape.oh(), c2.shape.ow());
        v.push(conv(&format!("{p}.0 conv1 1x1"), cin, size, width, 1, 1));
        v.push(c2);
        v.push(conv(&format!("{p}.0 conv3 1x1"), width, hout, out, 1, 1));
        v.push(conv(
            &format!("{p}.0 downsample 1x1/{first_stride}"),
            cin,
            size,
            out,
            1,
            first_stride,
        ));
        for b in 1..blocks {
            v.push(conv(&format!("{p}.{b} conv1 1x1"), out, hout, width, 1, 1));
            v.push(conv(
                &format!("{p}.{b} conv2 3x3"),
                width,
                hout,
                width,
                3,
                1,
            ));
            v.push(conv(&format!("{p}.{b} conv3 1x1"), width, hout, out, 1, 1));
        }
        size = hout;
    }
    v
}

thread_local! {
    static SCRATCH: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

/// Output rows per im2col block: the patch block near 512 KiB, between 64 and 1024 rows.
fn block_rows(depth: usize) -> usize {
    ((512 * 1024) / (4 * depth)).clamp(64, 1024) / 16 * 16
}

/// Writes the patch rows `[r0, r0 + rows)` of the implicit GEMM into `patch` (rows × depth);
/// rows count across images (row = image · OH·OW + oy · OW + ox). Padding reads as
/// `T::default()` (zero for the float types). Shared with the trainer's convolutions.
pub fn im2col<T: Copy + Default>(x: &[T], sh: &ConvShape, r0: usize, rows: usize, patch: &mut [T]) {
    let (oh, ow, c, depth) = (sh.oh(), sh.ow(), sh.c, sh.depth());
    for (t, prow) in patch.chunks_exact_mut(depth).take(rows).enumerate() {
        let row = r0 + t;
        let img = row / (oh * ow);
        let oy = (row / ow) % oh;
        let ox = row % ow;
        // The s taps of one filter row read s·c consecutive inputs (NHWC): one copy where the
        // whole run lies inside the image, tap by tap at its edges.
        let run = sh.s * c;
        let x0 = (ox * sh.stride) as isize - sh.pad as isize;
        let inside_x = x0 >= 0 && x0 as usize + sh.s <= sh.w;
        for ky in 0..sh.r {
            let iy = (oy * sh.stride + ky) as isize - sh.pad as isize;
            let dst = &mut prow[ky * run..(ky + 1) * run];
            if iy < 0 || iy as usize >= sh.h {
                dst.fill(T::default());
                continue;
            }
            let line = (img * sh.h + iy as usize) * sh.w;
            if inside_x {
                let src = (line + x0 as usize) * c;
                dst.copy_from_slice(&x[src..src + run]);
                continue;
            }
            for (kx, d) in dst.chunks_exact_mut(c).enumerate() {
                let ix = x0 + kx as isize;
                if ix >= 0 && (ix as usize) < sh.w {
                    let src = (line + ix as usize) * c;
                    d.copy_from_slice(&x[src..src + c]);
                } else {
                    d.fill(T::default());
                }
            }
        }
    }
}

/// Forward convolution `y = conv(x, w)`: x is NHWC, w is RSCK, y is N·OH·OW × K (NHWC).
/// `parallel` spreads the work over the current rayon pool.
///
/// Panics if the slices do not have the lengths the shape implies (a programming error).
pub fn conv2d_forward(x: &[f32], w: &[f32], y: &mut [f32], sh: &ConvShape, parallel: bool) {
    assert!(sh.valid(), "invalid convolution shape {}", sh.describe());
    assert_eq!(x.len(), sh.input_len(), "input length");
    assert_eq!(w.len(), sh.weight_len(), "weight length");
    assert_eq!(y.len(), sh.output_len(), "output length");
    let (rows, depth, k) = (sh.rows(), sh.depth(), sh.k);
    if sh.is_pointwise() {
        let par = if parallel {
            Parallelism::Rayon(rayon::current_num_threads())
        } else {
            Parallelism::None
        };
        // SAFETY: x is rows × c (= depth), w is depth × k, y is rows × k, all dense row-major.
        unsafe {
            matmul(
                Shape {
                    m: rows,
                    n: k,
                    k: depth,
                },
                y.as_mut_ptr(),
                k,
                x.as_ptr(),
                depth,
                w.as_ptr(),
                k,
                par,
            )
        };
        return;
    }
    let mb = block_rows(depth);
    let block = |(bi, yb): (usize, &mut [f32])| {
        let r0 = bi * mb;
        let nrows = yb.len() / k;
        SCRATCH.with(|s| {
            let mut patch = s.borrow_mut();
            if patch.len() < nrows * depth {
                patch.resize(mb * depth, 0.0);
            }
            im2col(x, sh, r0, nrows, &mut patch);
            // SAFETY: patch holds nrows × depth, w depth × k, yb nrows × k.
            unsafe {
                matmul(
                    Shape {
                        m: nrows,
                        n: k,
                        k: depth,
                    },
                    yb.as_mut_ptr(),
                    k,
                    patch.as_ptr(),
                    depth,
                    w.as_ptr(),
                    k,
                    Parallelism::None,
                )
            };
        });
    };
    if parallel {
        y.par_chunks_mut(mb * k).enumerate().for_each(block);
    } else {
        y.chunks_mut(mb * k).enumerate().for_each(block);
    }
}

/// The convolution probe kernel: forward passes over its own tensors.
pub struct ConvKernel {
    shape: ConvShape,
    x: Buffer<f32>,
    w: Buffer<f32>,
    y: Buffer<f32>,
    parallel: bool,
}

impl ConvKernel {
    pub fn new(shape: ConvShape, parallel: bool) -> Result<ConvKernel, ProbeError> {
        if !shape.valid() {
            return Err(ProbeError::Unsupported(format!(
                "invalid convolution shape {}",
                shape.describe()
            )));
        }
        let alloc = |len: usize, seed: u64| {
            Buffer::from_fn(len, |i| noise(seed, i) as f32).ok_or(ProbeError::Alloc(len * 4))
        };
        Ok(ConvKernel {
            shape,
            x: alloc(shape.input_len(), 11)?,
            w: alloc(shape.weight_len(), 12)?,
            y: Buffer::zeroed(shape.output_len())
                .ok_or(ProbeError::Alloc(shape.output_len() * 4))?,
            parallel,
        })
    }

    /// The output (N·OH·OW × K).
    pub fn output(&self) -> &[f32] {
        &self.y
    }
}

/// Checks 16 outputs against a direct f64 convolution.
pub fn check_conv(x: &[f32], w: &[f32], y: &[f32], sh: &ConvShape) -> Result<f64, CheckError> {
    // Build the 16 sampled patch rows explicitly and reuse the GEMM check.
    let (rows, depth, k) = (sh.rows(), sh.depth(), sh.k);
    let mut worst = 0.0f64;
    for s in 0..16usize {
        let row = (s * 7919 + 3) % rows;
        let col = (s * 104_729 + 5) % k;
        let mut patch = vec![0.0f32; depth];
        im2col_direct(x, sh, row, &mut patch);
        let one = Shape {
            m: 1,
            n: 1,
            k: depth,
        };
        let wcol: Vec<f32> = (0..depth).map(|p| w[p * k + col]).collect();
        let err = check_product(
            one,
            &patch,
            depth,
            &wcol,
            1,
            &y[row * k + col..row * k + col + 1],
            1,
        )
        .map_err(|e| {
            e.within(format!(
                "convolution {} output row {row} channel {col}",
                sh.describe()
            ))
        })?;
        worst = worst.max(err);
    }
    Ok(worst)
}

/// One patch row computed index by index (independent of the blocked im2col).
fn im2col_direct(x: &[f32], sh: &ConvShape, row: usize, out: &mut [f32]) {
    let (oh, ow) = (sh.oh(), sh.ow());
    let (img, oy, ox) = (row / (oh * ow), (row / ow) % oh, row % ow);
    for ky in 0..sh.r {
        for kx in 0..sh.s {
            for ch in 0..sh.c {
                let iy = (oy * sh.stride + ky) as isize - sh.pad as isize;
                let ix = (ox * sh.stride + kx) as isize - sh.pad as isize;
                let inside = iy >= 0 && (iy as usize) < sh.h && ix >= 0 && (ix as usize) < sh.w;
                out[(ky * sh.s + kx) * sh.c + ch] = if inside {
                    x[((img * sh.h + iy as usize) * sh.w + ix as usize) * sh.c + ch]
                } else {
                    0.0
                };
            }
        }
    }
}

impl Kernel for ConvKernel {
    fn ops_per_iter(&self) -> f64 {
        self.shape.flops()
    }
    fn bytes_per_iter(&self) -> f64 {
        self.shape.min_bytes()
    }
    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            conv2d_forward(&self.x, &self.w, &mut self.y, &self.shape, self.parallel);
        }
    }
    fn check(&mut self) -> Result<f64, CheckError> {
        check_conv(&self.x, &self.w, &self.y, &self.shape)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// ResNet-50 v1.5 has 53 convolutions (the stem, 16 bottlenecks of three, 4 shortcuts),
    /// about 4.1 G multiply-adds a 224×224 image forward, and 23 distinct shapes.
    #[test]
    fn resnet50_has_its_53_convolutions_and_23_shapes() {
        let all = resnet50_all(1);
        assert_eq!(all.len(), 53);
        let gflop: f64 = all.iter().map(|l| l.shape.flops()).sum::<f64>() / 1e9;
        assert!((8.0..8.4).contains(&gflop), "{gflop} GFLOP (2 per MAC)");
        assert_eq!(resnet50_layers(1).len(), 23);
        for l in resnet50_layers(4) {
            assert!(resnet50_all(4)
                .iter()
                .any(|a| a.shape == l.shape && a.name == l.name));
        }
    }

    /// The run-by-run im2col against the index-by-index one: the stem's shape (runs of 21
    /// values, stride 2), 3×3 stride 1 and 2, a single channel, and every image edge (tap by
    /// tap there).
    #[test]
    fn im2col_copies_every_run_as_the_direct_one() {
        for (c, r, stride, pad) in [(3, 7, 2, 3), (8, 3, 1, 1), (5, 3, 2, 1), (1, 7, 1, 3)] {
            let sh = ConvShape {
                n: 2,
                c,
                h: 11,
                w: 13,
                k: 4,
                r,
                s: r,
                stride,
                pad,
            };
            let x: Vec<f32> = (0..sh.input_len()).map(|i| i as f32 + 0.5).collect();
            let depth = sh.depth();
            let mut patch = vec![f32::NAN; sh.rows() * depth];
            im2col(&x, &sh, 0, sh.rows(), &mut patch);
            let mut want = vec![0.0; depth];
            for row in 0..sh.rows() {
                im2col_direct(&x, &sh, row, &mut want);
                assert_eq!(
                    &patch[row * depth..(row + 1) * depth],
                    &want[..],
                    "{} row {row}",
                    sh.describe()
                );
            }
        }
    }

    #[test]
    fn resnet50_has_the_known_distinct_shapes_and_flops() {
        let layers = resnet50_layers(1);
        assert_eq!(layers.len(), 23);
        assert!(layers.iter().all(|l| l.shape.valid()));
        // Every 3×3 convolution of ResNet-50 does 2 × 56² × 64² × 9 FLOPs per image.
        for l in layers.iter().filter(|l| l.shape.r == 3) {
            assert_eq!(
                l.shape.flops(),
                2.0 * 56.0 * 56.0 * 64.0 * 64.0 * 9.0,
                "{}",
                l.name
            );
        }
        // conv1: 2 × 112² × 64 × 147.
        assert_eq!(layers[0].shape.flops(), 2.0 * 112.0 * 112.0 * 64.0 * 147.0);
        assert_eq!((layers[0].shape.oh(), layers[0].shape.ow()), (112, 112));
    }

    #[test]
    fn forward_matches_direct_convolution_for_every_kind_of_shape() {
        let shapes = [
            ConvShape {
                n: 2,
                c: 3,
                h: 11,
                w: 9,
                k: 5,
                r: 3,
                s: 3,
                stride: 1,
                pad: 1,
            },
            ConvShape {
                n: 1,
                c: 4,
                h: 12,
                w: 12,
                k: 8,
                r: 7,
                s: 7,
                stride: 2,
                pad: 3,
            },
            ConvShape {
                n: 3,
                c: 16,
                h: 6,
                w: 6,
                k: 7,
                r: 1,
                s: 1,
                stride: 1,
                pad: 0,
            },
            ConvShape {
                n: 2,
                c: 8,
                h: 7,
                w: 7,
                k: 4,
                r: 1,
                s: 1,
                stride: 2,
                pad: 0,
            },
            ConvShape {
                n: 1,
                c: 2,
                h: 5,
                w: 4,
                k: 3,
                r: 2,
                s: 3,
                stride: 3,
                pad: 0,
            },
            ConvShape {
                n: 2,
                c: 64,
                h: 20,
                w: 20,
                k: 32,
                r: 3,
                s: 3,
                stride: 2,
                pad: 1,
            },
        ];
        let pool = crate::affinity::pinned_pool(&crate::affinity::allowed_cpus()).unwrap();
        for sh in shapes {
            for parallel in [false, true] {
                let mut k = ConvKernel::new(sh, parallel).unwrap();
                pool.install(|| k.run(1));
                // Every output, not only the 16 sampled.
                for row in 0..sh.rows() {
                    let mut patch = vec![0.0; sh.depth()];
                    im2col_direct(&k.x, &sh, row, &mut patch);
                    for col in 0..sh.k {
                        let want: f64 = (0..sh.depth())
                            .map(|p| patch[p] as f64 * k.w[p * sh.k + col] as f64)
                            .sum();
                        let got = k.y[row * sh.k + col] as f64;
                        assert!(
                            (got - want).abs() < 1e-4,
                            "{} parallel={parallel}: {got} vs {want}",
                            sh.describe()
                        );
                    }
                }
                assert!(k.check().is_ok());
                // The first sampled output is row 3 % rows, channel 5 % k.
                let at = (3 % sh.rows()) * sh.k + 5 % sh.k;
                k.y[at] += 1.0;
                assert!(k.check().is_err(), "a wrong output is caught");
            }
        }
    }
}
