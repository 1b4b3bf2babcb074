//! Data: a deterministic random generator, and a synthetic, learnable image set (class-dependent
//! patterns with noise, any resolution, any number of classes).

use crate::tensor::{Float, Tensor};
use rayon::prelude::*;
use std::path::PathBuf;

/// Why the data could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DataError {
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: no such file or folder", .0.display())]
    Missing(PathBuf),
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: {source}")]
    Image {
        path: PathBuf,
        #[source]
        source: image::ImageError,
    },
    /// A data file whose layout or content is not what was expected (HDF5's own errors are
    /// kept as their text).
    #[error("{path}: {what}")]
    File { path: PathBuf, what: String },
    #[error("{0}")]
    Invalid(String),
    #[error("no batch was fetched")]
    NotFetched,
    #[error("a data loader thread panicked")]
    LoaderPanicked,
}

/// xorshift64* with Box-Muller normals: small, fast, reproducible across runs and threads.
#[derive(Clone, Debug)]
pub struct Rng {
    state: u64,
    spare: Option<f64>,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        // SplitMix64 of the seed, so that nearby seeds give unrelated streams.
        let mut z = seed.wrapping_add(0x9E37_79B9_7F4A_7C15);
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        Rng {
            state: (z ^ (z >> 31)) | 1,
            spare: None,
        }
    }

    /// The generator's whole state (for checkpoints).
    pub fn state(&self) -> (u64, Option<f64>) {
        (self.state, self.spare)
    }

    /// The generator `state` returned (a resumed run continues the stream exactly). Any
    /// non-zero state is a state of the stream (xorshift's states are even as often as odd).
    pub fn from_state(state: u64, spare: Option<f64>) -> Rng {
        Rng {
            state: if state == 0 { 1 } else { state },
            spare,
        }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        self.state.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    pub fn uniform(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.unit()
    }

    /// Standard normal.
    pub fn normal(&mut self) -> f64 {
        if let Some(s) = self.spare.take() {
            return s;
        }
        let u1 = self.unit().max(1e-300);
        let u2 = self.unit();
        let r = (-2.0 * u1.ln()).sqrt();
        let t = 2.0 * std::f64::consts::PI * u2;
        self.spare = Some(r * t.sin());
        r * t.cos()
    }

    /// A permutation of 0..n (Fisher-Yates).
    pub fn permutation(&mut self, n: usize) -> Vec<usize> {
        let mut v: Vec<usize> = (0..n).collect();
        for i in (1..n).rev() {
            let j = (self.next_u64() % (i as u64 + 1)) as usize;
            v.swap(i, j);
        }
        v
    }

    /// `k` distinct draws from 0..n (all n when k ≥ n), in the order drawn: a Fisher-Yates
    /// shuffle stopped after k steps, so k random numbers, not n (128 of ~660,000 anchors).
    /// Where k is small beside n only the moved entries are held (a map of at most 2k), not
    /// the n values: the same draws either way.
    pub fn choose(&mut self, n: usize, k: usize) -> Vec<usize> {
        let k = k.min(n);
        if k.saturating_mul(16) >= n {
            let mut v: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + (self.next_u64() % (n - i) as u64) as usize;
                v.swap(i, j);
            }
            v.truncate(k);
            return v;
        }
        // Position i holds moved[i] when moved, else i; position i is final after step i.
        let mut moved: std::collections::HashMap<usize, usize> =
            std::collections::HashMap::with_capacity(2 * k);
        let mut out = Vec::with_capacity(k);
        for i in 0..k {
            let j = i + (self.next_u64() % (n - i) as u64) as usize;
            let at_j = moved.get(&j).copied().unwrap_or(j);
            let at_i = moved.get(&i).copied().unwrap_or(i);
            moved.insert(j, at_i);
            out.push(at_j);
        }
        out
    }
}

/// A synthetic image set: image `i` has label `i % classes` and shows that class's pattern
/// (oriented stripes of a class-specific frequency, phase and colour) plus Gaussian noise, all
/// drawn deterministically from (seed, i).
#[derive(Clone, Debug)]
pub struct Synthetic {
    pub classes: usize,
    pub resolution: usize,
    pub seed: u64,
    /// Standard deviation of the noise (the pattern's amplitude is 1).
    pub noise: f64,
}

/// A class's stripes: sin((x·cos angle + y·sin angle)·freq + phase), scaled per channel by
/// `colour`, plus 0.3·colour.
struct Pattern {
    angle: f64,
    freq: f64,
    phase: f64,
    colour: [f64; 3],
}

/// 2¹⁶ standard normal samples, drawn once from a fixed seed: the synthetic images' noise.
fn normal_table() -> &'static [f64] {
    static TABLE: std::sync::OnceLock<Vec<f64>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| {
        let mut r = Rng::new(0x005E_ED0F_D15C);
        (0..1 << 16).map(|_| r.normal()).collect()
    })
}

impl Synthetic {
    pub fn new(classes: usize, resolution: usize, seed: u64) -> Synthetic {
        Synthetic {
            classes,
            resolution,
            seed,
            noise: 0.6,
        }
    }

    pub fn label(&self, i: u64) -> usize {
        (i % self.classes as u64) as usize
    }

    /// Class `k`'s stripes, from a generator seeded by the class alone.
    fn pattern(&self, k: usize) -> Pattern {
        let mut cls = Rng::new(self.seed ^ (0xC1A5_5000 + k as u64));
        Pattern {
            angle: cls.uniform(0.0, std::f64::consts::PI),
            freq: cls.uniform(1.5, 6.0) * 2.0 * std::f64::consts::PI / self.resolution as f64,
            phase: cls.uniform(0.0, 2.0 * std::f64::consts::PI),
            colour: [
                cls.uniform(-1.0, 1.0),
                cls.uniform(-1.0, 1.0),
                cls.uniform(-1.0, 1.0),
            ],
        }
    }

    /// Image `i`'s own generator: the shift of its pattern, then its noise.
    fn own(&self, i: u64) -> Rng {
        Rng::new(self.seed.wrapping_mul(0x9E37_79B9).wrapping_add(i))
    }

    /// Image `i`, HWC with 3 channels.
    pub fn image<T: Float>(&self, i: u64, out: &mut [T]) {
        let r = self.resolution;
        let Pattern {
            angle,
            freq,
            phase,
            colour,
        } = self.pattern(self.label(i));
        let (ca, sa) = (angle.cos(), angle.sin());
        // The image's own noise and a random shift of the pattern.
        let mut own = self.own(i);
        let shift = own.uniform(0.0, 2.0 * std::f64::consts::PI);
        // The images are made beside the training, on the same cores: a sine per pixel and
        // Box–Muller noise (a logarithm, a square root and a sine and cosine per two values)
        // took ~3% of a 2-core ResNet-50 step's CPU time. The pattern along a row is a
        // rotation (sin(θ + x·δ) by angle addition, from the row's own start), and the noise
        // comes from a table of normal samples, three 16-bit indices per random draw.
        let table = normal_table();
        let (ds, dc) = (ca * freq).sin_cos();
        for y in 0..r {
            let (mut s, mut c) = (y as f64 * sa * freq + phase + shift).sin_cos();
            for x in 0..r {
                let bits = own.next_u64();
                for ch in 0..3 {
                    let z = table[(bits >> (16 * ch)) as usize & 0xFFFF];
                    out[(y * r + x) * 3 + ch] =
                        T::from_f64(s * colour[ch] + 0.3 * colour[ch] + self.noise * z);
                }
                (s, c) = (s * dc + c * ds, c * dc - s * ds);
            }
        }
    }

    /// Images `ids` as one NHWC batch, with their labels.
    pub fn batch<T: Float>(&self, ids: &[u64]) -> (Tensor<T>, Vec<usize>) {
        let r = self.resolution;
        let mut t = Tensor::zeros(ids.len(), r, r, 3);
        t.data
            .par_chunks_mut(r * r * 3)
            .zip(ids.par_iter())
            .for_each(|(img, &i)| self.image(i, img));
        (t, ids.iter().map(|&i| self.label(i)).collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// k distinct values of 0..n, the same for the same seed, all n when k ≥ n; over many
    /// draws every value as likely (each of 10 drawn ~300 times in 1000 draws of 3).
    #[test]
    fn choose_draws_distinct_values_uniformly() {
        let mut seen = [0usize; 10];
        let mut rng = Rng::new(4);
        for _ in 0..1000 {
            let c = rng.choose(10, 3);
            let mut d = c.clone();
            d.sort_unstable();
            d.dedup();
            assert_eq!((c.len(), d.len()), (3, 3));
            c.iter().for_each(|&v| seen[v] += 1);
        }
        assert!(seen.iter().all(|&s| (240..=360).contains(&s)), "{seen:?}");
        assert_eq!(Rng::new(8).choose(50, 5), Rng::new(8).choose(50, 5));
        let mut all = Rng::new(1).choose(4, 9);
        all.sort_unstable();
        assert_eq!(all, vec![0, 1, 2, 3]);
    }

    /// The sparse draw (k small beside n) is the dense shuffle's, draw for draw.
    #[test]
    fn the_sparse_draw_is_the_shuffles() {
        let dense = |rng: &mut Rng, n: usize, k: usize| {
            let mut v: Vec<usize> = (0..n).collect();
            for i in 0..k {
                let j = i + (rng.next_u64() % (n - i) as u64) as usize;
                v.swap(i, j);
            }
            v.truncate(k);
            v
        };
        for (n, k, seed) in [(1000, 3, 1), (660_000, 128, 2), (5000, 300, 3), (17, 1, 4)] {
            let (mut a, mut b) = (Rng::new(seed), Rng::new(seed));
            for _ in 0..3 {
                assert_eq!(a.choose(n, k), dense(&mut b, n, k), "n {n}, k {k}");
            }
            assert_eq!(a.next_u64(), b.next_u64(), "the same numbers drawn");
        }
    }

    /// Without noise an image is its class's pattern, sin((x·cos a + y·sin a)·f + φ + shift)
    /// scaled by the colour plus an offset (the row-wise rotation stays on it); with noise the
    /// residual has the noise's mean and spread.
    #[test]
    fn synthetic_images_are_the_pattern_plus_normal_noise() {
        let r = 48;
        let mut clean = Synthetic::new(3, r, 9);
        clean.noise = 0.0;
        let noisy = Synthetic::new(3, r, 9);
        let (mut a, mut b) = (vec![0f64; r * r * 3], vec![0f64; r * r * 3]);
        clean.image(4, &mut a);
        noisy.image(4, &mut b);
        let Pattern {
            angle,
            freq,
            phase,
            colour,
        } = clean.pattern(clean.label(4));
        let mut own = clean.own(4);
        let shift = own.uniform(0.0, 2.0 * std::f64::consts::PI);
        let (mut sum, mut sq) = (0.0, 0.0);
        for y in 0..r {
            for x in 0..r {
                let s = ((x as f64 * angle.cos() + y as f64 * angle.sin()) * freq + phase + shift)
                    .sin();
                for (ch, col) in colour.iter().enumerate() {
                    let at = (y * r + x) * 3 + ch;
                    let want = s * col + 0.3 * col;
                    assert!((a[at] - want).abs() < 1e-12, "({x}, {y}, {ch})");
                    let e = (b[at] - want) / 0.6;
                    sum += e;
                    sq += e * e;
                }
            }
        }
        let n = (r * r * 3) as f64;
        let (mean, var) = (sum / n, sq / n - (sum / n).powi(2));
        assert!(
            mean.abs() < 0.05 && (var - 1.0).abs() < 0.1,
            "noise mean {mean}, variance {var}"
        );
    }

    /// A generator restored from its state continues its stream, whatever the state (an even
    /// state once came back odd, and a resumed run drew another permutation at its next
    /// epoch).
    #[test]
    fn a_restored_generator_continues_its_stream() {
        let mut a = Rng::new(3);
        let mut evens = 0;
        for _ in 0..64 {
            let (state, spare) = a.state();
            evens += usize::from(state % 2 == 0);
            let mut b = Rng::from_state(state, spare);
            assert_eq!(a.clone().permutation(50), b.permutation(50));
            a.normal();
        }
        assert!(evens > 0, "some states are even");
    }

    #[test]
    fn generator_is_deterministic_and_normal() {
        let mut a = Rng::new(5);
        let mut b = Rng::new(5);
        let xs: Vec<f64> = (0..20000).map(|_| a.normal()).collect();
        let ys: Vec<f64> = (0..20000).map(|_| b.normal()).collect();
        assert_eq!(xs, ys);
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!(
            mean.abs() < 0.03 && (var - 1.0).abs() < 0.05,
            "{mean} {var}"
        );
        let mut p = Rng::new(1).permutation(100);
        p.sort_unstable();
        assert_eq!(p, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn synthetic_images_are_reproducible_and_class_dependent() {
        let d = Synthetic::new(4, 16, 7);
        let (a, la) = d.batch::<f32>(&[0, 1, 2, 3, 4]);
        let (b, _) = d.batch::<f32>(&[0, 1, 2, 3, 4]);
        assert_eq!(a, b);
        assert_eq!(la, [0, 1, 2, 3, 0]);
        // Two images of one class are closer than images of different classes, on average
        // over the noise.
        let img = |i: u64| {
            let mut v = vec![0f64; 16 * 16 * 3];
            let mut q = d.clone();
            q.noise = 0.0;
            q.image(i, &mut v);
            v
        };
        assert_ne!(img(0), img(1));
    }
}
