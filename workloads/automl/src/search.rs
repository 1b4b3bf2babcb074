//! The architecture search (Auto-Keras's, as AIPerf runs it): a Gaussian process over the
//! networks already trained, with a kernel on their edit distance, an upper-confidence-bound
//! acquisition, and simulated annealing over chains of morphisms from the trained networks to
//! pick the next one to train.

use roofline_workloads::data::Rng;
use roofline_workloads::graph::morph::{self, Limits, Morphism};
use roofline_workloads::graph::{Description, Op};

/// A network's shape as the distance sees it: its trainable layers in order (kind, width,
/// kernel) and its additions as pairs of layer depths.
#[derive(Clone, Debug, PartialEq)]
pub struct Signature {
    layers: Vec<(bool, usize, usize)>,
    skips: Vec<(usize, usize)>,
}

impl Signature {
    pub fn of(d: &Description) -> Signature {
        // The number of trainable layers before each value.
        let mut depth = vec![0usize; d.nodes.len() + 1];
        let mut layers = Vec::new();
        for (i, n) in d.nodes.iter().enumerate() {
            let before = n.inputs.iter().map(|&v| depth[v]).max().unwrap_or(0);
            depth[i + 1] = before;
            match n.op {
                Op::Conv {
                    channels, kernel, ..
                } => {
                    layers.push((true, channels, kernel));
                    depth[i + 1] = before + 1;
                }
                Op::Dense { outputs } => {
                    layers.push((false, outputs, 1));
                    depth[i + 1] = before + 1;
                }
                _ => {}
            }
        }
        let mut skips: Vec<(usize, usize)> = d
            .nodes
            .iter()
            .filter(|n| n.op == Op::Add)
            .map(|n| {
                let (a, b) = (depth[n.inputs[0]], depth[n.inputs[1]]);
                (a.min(b), a.max(b))
            })
            .collect();
        skips.sort_unstable();
        Signature { layers, skips }
    }
}

/// Two layers' distance: 0 for the same, the relative width difference for two of a kind (and
/// kernel), 1 for a convolution against a dense layer.
fn layer_distance(a: (bool, usize, usize), b: (bool, usize, usize)) -> f64 {
    if a.0 != b.0 {
        return 1.0;
    }
    let w = (a.1 as f64 - b.1 as f64).abs() / a.1.max(b.1) as f64;
    let k = if a.2 == b.2 { 0.0 } else { 0.5 };
    (w + k).min(1.0)
}

/// Levenshtein distance with substitution cost `sub` and unit insertions and deletions.
fn edit<X: Copy>(a: &[X], b: &[X], sub: impl Fn(X, X) -> f64) -> f64 {
    let mut prev: Vec<f64> = (0..=b.len()).map(|j| j as f64).collect();
    for (i, &x) in a.iter().enumerate() {
        let mut row = vec![(i + 1) as f64; b.len() + 1];
        for (j, &y) in b.iter().enumerate() {
            row[j + 1] = (prev[j] + sub(x, y))
                .min(prev[j + 1] + 1.0)
                .min(row[j] + 1.0);
        }
        prev = row;
    }
    prev[b.len()]
}

/// Auto-Keras's edit distance: layers' plus skip connections'.
pub fn distance(a: &Signature, b: &Signature) -> f64 {
    let layers = edit(&a.layers, &b.layers, layer_distance);
    let skips = edit(&a.skips, &b.skips, |x, y| {
        let d = x.0.abs_diff(y.0) + x.1.abs_diff(y.1);
        (d as f64 / 4.0).min(1.0)
    });
    layers + skips
}

/// A Gaussian process on networks: kernel `exp(−d / length)`, observations standardised.
pub struct Gp {
    x: Vec<Signature>,
    alpha: Vec<f64>,
    chol: Vec<Vec<f64>>,
    mean: f64,
    scale: f64,
    length: f64,
}

impl Gp {
    /// Fits `(network, accuracy)` observations; `None` without any.
    pub fn fit(obs: &[(Signature, f64)]) -> Option<Gp> {
        if obs.is_empty() {
            return None;
        }
        let n = obs.len();
        let ys: Vec<f64> = obs.iter().map(|o| o.1).collect();
        let mean = ys.iter().sum::<f64>() / n as f64;
        let var = ys.iter().map(|y| (y - mean).powi(2)).sum::<f64>() / n as f64;
        let scale = var.sqrt().max(1e-3);
        // The length: the median distance between observations (1 when all coincide).
        let mut ds = Vec::new();
        for i in 0..n {
            for j in 0..i {
                ds.push(distance(&obs[i].0, &obs[j].0));
            }
        }
        ds.sort_by(f64::total_cmp);
        let length = ds
            .get(ds.len() / 2)
            .copied()
            .filter(|&d| d > 0.0)
            .unwrap_or(1.0);
        let x: Vec<Signature> = obs.iter().map(|o| o.0.clone()).collect();
        let y: Vec<f64> = ys.iter().map(|v| (v - mean) / scale).collect();
        // Noise on the diagonal; more when the matrix is not positive definite (an edit
        // distance is not a metric a Laplacian kernel is always positive definite on).
        let mut noise = 1e-2;
        loop {
            let mut k = vec![vec![0.0; n]; n];
            for i in 0..n {
                for j in 0..n {
                    k[i][j] = (-distance(&x[i], &x[j]) / length).exp();
                }
                k[i][i] += noise;
            }
            if let Some(chol) = cholesky(&k) {
                let alpha = solve(&chol, &y);
                return Some(Gp {
                    x,
                    alpha,
                    chol,
                    mean,
                    scale,
                    length,
                });
            }
            noise *= 10.0;
        }
    }

    /// The posterior mean and standard deviation at `s`, in accuracy units.
    pub fn predict(&self, s: &Signature) -> (f64, f64) {
        let k: Vec<f64> = self
            .x
            .iter()
            .map(|x| (-distance(x, s) / self.length).exp())
            .collect();
        let mu = k.iter().zip(&self.alpha).map(|(a, b)| a * b).sum::<f64>();
        let v = forward(&self.chol, &k);
        let var = (1.0 - v.iter().map(|x| x * x).sum::<f64>()).max(0.0);
        (self.mean + mu * self.scale, var.sqrt() * self.scale)
    }
}

fn cholesky(a: &[Vec<f64>]) -> Option<Vec<Vec<f64>>> {
    let n = a.len();
    let mut l = vec![vec![0.0; n]; n];
    for i in 0..n {
        for j in 0..=i {
            let s: f64 = (0..j).map(|k| l[i][k] * l[j][k]).sum();
            if i == j {
                let d = a[i][i] - s;
                if d <= 0.0 || !d.is_finite() {
                    return None;
                }
                l[i][j] = d.sqrt();
            } else {
                l[i][j] = (a[i][j] - s) / l[j][j];
            }
        }
    }
    Some(l)
}

/// `L v = b`.
fn forward(l: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let mut v = vec![0.0; b.len()];
    for i in 0..b.len() {
        v[i] = (b[i] - (0..i).map(|k| l[i][k] * v[k]).sum::<f64>()) / l[i][i];
    }
    v
}

/// `L Lᵀ x = b`.
fn solve(l: &[Vec<f64>], b: &[f64]) -> Vec<f64> {
    let v = forward(l, b);
    let n = b.len();
    let mut x = vec![0.0; n];
    for i in (0..n).rev() {
        x[i] = (v[i] - (i + 1..n).map(|k| l[k][i] * x[k]).sum::<f64>()) / l[i][i];
    }
    x
}

/// The upper confidence bound's β (Auto-Keras's).
pub const BETA: f64 = 2.576;

/// A trained network the search may start from.
pub struct Trained<'a> {
    pub id: usize,
    pub description: &'a Description,
    pub accuracy: f64,
}

/// What the search proposes: a trained parent and the morphisms that make the child.
#[derive(Clone, Debug, PartialEq)]
pub struct Proposal {
    pub parent: usize,
    pub morphisms: Vec<Morphism>,
    pub description: Description,
    /// The acquisition's value (UCB) and the GP's mean.
    pub ucb: f64,
    pub mean: f64,
}

/// How the search runs.
#[derive(Clone, Copy, Debug)]
pub struct Settings {
    pub side: usize,
    pub kernel: usize,
    pub limits: Limits,
    /// Children sampled per morphism step (AIPerf: 8).
    pub neighbours: usize,
    /// Longest chain of morphisms from a trained parent.
    pub depth: usize,
    /// Annealing: starting temperature, cooling factor, acquisitions evaluated at most.
    pub t0: f64,
    pub cooling: f64,
    pub evaluations: usize,
}

/// Simulated annealing over chains of morphisms from the trained networks (best first),
/// maximising the UCB of `gp`; networks in `taken` (trained or handed out) are never proposed.
pub fn propose(
    gp: &Gp,
    trained: &[Trained<'_>],
    taken: &[Description],
    s: Settings,
    rng: &mut Rng,
) -> Option<Proposal> {
    let mut order: Vec<&Trained> = trained.iter().collect();
    order.sort_by(|a, b| b.accuracy.total_cmp(&a.accuracy));
    // The annealing starts from the best few trained networks; when their every child is
    // taken or over the limits, from the next few.
    for start in order.chunks(s.neighbours.max(1)) {
        if let Some(p) = anneal(gp, start, taken, s, rng) {
            return Some(p);
        }
    }
    None
}

/// One annealing from `start`.
fn anneal(
    gp: &Gp,
    start: &[&Trained<'_>],
    taken: &[Description],
    s: Settings,
    rng: &mut Rng,
) -> Option<Proposal> {
    let mut best: Option<Proposal> = None;
    let mut evaluations = 0;
    let mut t = s.t0;
    // Each element: a parent, a chain of morphisms and the network it makes, and its UCB.
    let mut queue: Vec<(usize, Vec<Morphism>, Description, f64)> = start
        .iter()
        .map(|tr| {
            let (m, sd) = gp.predict(&Signature::of(tr.description));
            (tr.id, Vec::new(), tr.description.clone(), m + BETA * sd)
        })
        .collect();
    queue.reverse();
    while let Some((parent, chain, net, ucb)) = queue.pop() {
        if evaluations >= s.evaluations || chain.len() >= s.depth {
            continue;
        }
        for (m, child) in morph::neighbours(&net, s.side, s.kernel, s.limits, s.neighbours, rng) {
            evaluations += 1;
            if taken.contains(&child) {
                continue;
            }
            let (mean, sd) = gp.predict(&Signature::of(&child));
            let value = mean + BETA * sd;
            let mut next = chain.clone();
            next.push(m);
            if best.as_ref().is_none_or(|b| value > b.ucb) {
                best = Some(Proposal {
                    parent,
                    morphisms: next.clone(),
                    description: child.clone(),
                    ucb: value,
                    mean,
                });
            }
            // Metropolis: a better child always goes on, a worse one with probability
            // exp(Δ / T).
            let accept = ((value - ucb) / t.max(1e-12)).exp();
            if value >= ucb || rng.unit() < accept {
                queue.push((parent, next, child, value));
            }
        }
        t *= s.cooling;
    }
    best
}
