//! The gradient exchange of data-parallel training (HPC AI500 V2.0 section 7.5: fusion, overlap,
//! compression). Gradients travel in fused buckets (Horovod's tensor fusion) that a
//! communication thread sums while the backward pass goes on producing the next ones, and may be
//! compressed to 16-bit floats on the wire (section 7.5.2).
//!
//! Collectives must start in the same order on every rank, and MPI is initialised for one
//! calling thread at a time; so once an [`Exchange`] runs, every reduction of the run (the
//! synchronised batch-norm statistics, the loss, the buckets) goes through its thread, in the
//! order the training thread asked for them, which is the same on every rank.

use crate::layers::Reducer;
use roofline_collectors::timeline::span;
use std::collections::VecDeque;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};

/// The number format of gradients on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Wire {
    /// f32: the allreduce of the MPI library (exact sums up to reassociation).
    #[default]
    #[cfg_attr(feature = "clap", value(name = "none"))]
    F32,
    /// IEEE half precision, scaled per bucket into its range (no overflow, least underflow).
    #[cfg_attr(feature = "clap", value(name = "fp16"))]
    F16,
    /// bfloat16: f32's range, 8 bits of mantissa.
    Bf16,
}

impl Wire {
    pub fn name(self) -> &'static str {
        match self {
            Wire::F32 => "none",
            Wire::F16 => "fp16",
            Wire::Bf16 => "bf16",
        }
    }

    /// Bytes per gradient element on the wire.
    pub fn bytes(self) -> usize {
        match self {
            Wire::F32 => 4,
            Wire::F16 | Wire::Bf16 => 2,
        }
    }

    /// `dst` = `src` in this 16-bit format (round to nearest even; F16C/NEON when present).
    fn encode(self, src: &[f32], dst: &mut [u16]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        match self {
            Wire::Bf16 => dst
                .reinterpret_cast_mut::<half::bf16>()
                .convert_from_f32_slice(src),
            _ => dst
                .reinterpret_cast_mut::<half::f16>()
                .convert_from_f32_slice(src),
        }
    }

    fn decode(self, src: &[u16], dst: &mut [f32]) {
        use half::slice::{HalfBitsSliceExt, HalfFloatSliceExt};
        match self {
            Wire::Bf16 => src
                .reinterpret_cast::<half::bf16>()
                .convert_to_f32_slice(dst),
            _ => src
                .reinterpret_cast::<half::f16>()
                .convert_to_f32_slice(dst),
        }
    }
}

/// How a data-parallel run exchanges its gradients.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CommOptions {
    pub wire: Wire,
    /// Sum each bucket as soon as the backward pass has finished its gradients (otherwise all
    /// of them after the backward pass).
    pub overlap: bool,
    /// Elements per fused bucket.
    pub bucket: usize,
}

impl Default for CommOptions {
    fn default() -> Self {
        CommOptions {
            wire: Wire::F32,
            overlap: true,
            bucket: BUCKET,
        }
    }
}

/// Gradient buckets of the allreduce (Horovod-style tensor fusion): 4 Mi elements.
pub const BUCKET: usize = 4 << 20;

/// Sums `v` over the ranks of `r` through a ring (reduce-scatter, then allgather) whose messages
/// are `wire`'s 16-bit values; every rank gets the same bits. Partial sums are rounded to the
/// wire format at each hop, as NCCL does. For f16, the bucket is first scaled by a power of two
/// that the ranks agree on (from the sum of their largest magnitudes) so that no sum can
/// overflow and small gradients keep what precision the format has.
pub fn ring_sum_16(r: &dyn Reducer, v: &mut [f32], wire: Wire) {
    let (n, rank) = (r.ranks(), r.rank());
    if n <= 1 || v.is_empty() {
        return;
    }
    let scale = if wire == Wire::F16 {
        let mut m = [v.iter().fold(0.0f64, |m, x| m.max(x.abs() as f64))];
        r.sum_f64(&mut m);
        if m[0] > 0.0 && m[0].is_finite() {
            // Sums stay below 2¹⁵ (f16's largest finite value is 65504).
            2f64.powi((32768.0 / m[0]).log2().floor().clamp(-120.0, 120.0) as i32)
        } else {
            1.0
        }
    } else {
        1.0
    };
    let len = v.len();
    let scale = scale as f32;
    if scale != 1.0 {
        v.iter_mut().for_each(|x| *x *= scale);
    }
    let mut enc = vec![0u16; len];
    wire.encode(v, &mut enc);
    let bound = |j: usize| j * len / n;
    let chunk = |j: usize| bound(j)..bound(j + 1);
    let (next, prev) = ((rank + 1) % n, (rank + n - 1) % n);
    let most = len / n + 1;
    let (mut buf, mut mine, mut theirs) = (vec![0u16; most], vec![0f32; most], vec![0f32; most]);
    // Reduce-scatter: after n − 1 hops this rank holds the whole sum of chunk rank + 1.
    for s in 0..n - 1 {
        let (out, inn) = (chunk((rank + n - s) % n), chunk((rank + 2 * n - s - 1) % n));
        let k = inn.len();
        r.exchange_u16(next, &enc[out], prev, &mut buf[..k]);
        wire.decode(&enc[inn.clone()], &mut mine[..k]);
        wire.decode(&buf[..k], &mut theirs[..k]);
        for (a, b) in mine[..k].iter_mut().zip(&theirs[..k]) {
            *a += *b;
        }
        wire.encode(&mine[..k], &mut enc[inn]);
    }
    // Allgather: the summed chunks go round.
    for s in 0..n - 1 {
        let (out, inn) = (chunk((rank + 1 + n - s) % n), chunk((rank + n - s) % n));
        let k = inn.len();
        r.exchange_u16(next, &enc[out], prev, &mut buf[..k]);
        enc[inn].copy_from_slice(&buf[..k]);
    }
    wire.decode(&enc, v);
    if scale != 1.0 {
        let inv = 1.0 / scale;
        v.iter_mut().for_each(|x| *x *= inv);
    }
}

/// Sums a bucket over the ranks in `wire`'s format.
fn sum_bucket(r: &dyn Reducer, v: &mut [f32], wire: Wire) {
    match wire {
        Wire::F32 => r.sum_f32(v),
        Wire::F16 | Wire::Bf16 => ring_sum_16(r, v, wire),
    }
}

enum Job {
    F64(Vec<f64>, mpsc::Sender<Vec<f64>>),
    F32(Vec<f32>, mpsc::Sender<Vec<f32>>),
    U16 {
        to: usize,
        send: Vec<u16>,
        from: usize,
        recv: Vec<u16>,
        back: mpsc::Sender<Vec<u16>>,
    },
    Bucket(Vec<f32>, Wire, mpsc::Sender<Vec<f32>>),
}

/// The communication thread: owns every reduction of the run, in the order they were asked for.
pub struct Exchange {
    jobs: Mutex<Option<mpsc::Sender<Job>>>,
    thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    ranks: usize,
    rank: usize,
}

const GONE: &str = "the communication thread stopped (a collective failed on this rank)";

impl Exchange {
    /// Starts the thread that calls `inner` from now on.
    pub fn start(inner: Arc<dyn Reducer>) -> Arc<Exchange> {
        let (tx, rx) = mpsc::channel::<Job>();
        let (ranks, rank) = (inner.ranks(), inner.rank());
        let thread = std::thread::Builder::new()
            .name("roofline-comm".into())
            .spawn(move || {
                // A dropped answer channel means the trainer stopped waiting: nothing to do.
                for job in rx {
                    match job {
                        Job::F64(mut v, back) => {
                            inner.sum_f64(&mut v);
                            let _ = back.send(v);
                        }
                        Job::F32(mut v, back) => {
                            inner.sum_f32(&mut v);
                            let _ = back.send(v);
                        }
                        Job::U16 {
                            to,
                            send,
                            from,
                            mut recv,
                            back,
                        } => {
                            inner.exchange_u16(to, &send, from, &mut recv);
                            let _ = back.send(recv);
                        }
                        Job::Bucket(mut v, wire, back) => {
                            let _s = span("comm", || {
                                format!("allreduce {} gradients ({})", v.len(), wire.name())
                            });
                            sum_bucket(inner.as_ref(), &mut v, wire);
                            let _ = back.send(v);
                        }
                    }
                }
            })
            .expect("cannot start the communication thread");
        Arc::new(Exchange {
            jobs: Mutex::new(Some(tx)),
            thread: Mutex::new(Some(thread)),
            ranks,
            rank,
        })
    }

    fn submit(&self, job: Job) {
        let jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        jobs.as_ref().expect(GONE).send(job).expect(GONE);
    }

    /// Queues the sum of a gradient bucket; the answer arrives on the returned channel.
    pub fn sum_later(&self, v: Vec<f32>, wire: Wire) -> mpsc::Receiver<Vec<f32>> {
        let (tx, rx) = mpsc::channel();
        self.submit(Job::Bucket(v, wire, tx));
        rx
    }

    /// Finishes the queued work and stops the thread (also on drop).
    pub fn stop(&self) {
        drop(self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take());
        if let Some(t) = self.thread.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = t.join();
        }
    }
}

impl Drop for Exchange {
    fn drop(&mut self) {
        self.stop();
    }
}

impl Reducer for Exchange {
    fn ranks(&self) -> usize {
        self.ranks
    }
    fn rank(&self) -> usize {
        self.rank
    }
    fn sum_f64(&self, v: &mut [f64]) {
        let (tx, rx) = mpsc::channel();
        self.submit(Job::F64(v.to_vec(), tx));
        v.copy_from_slice(&rx.recv().expect(GONE));
    }
    fn sum_f32(&self, v: &mut [f32]) {
        let (tx, rx) = mpsc::channel();
        self.submit(Job::F32(v.to_vec(), tx));
        v.copy_from_slice(&rx.recv().expect(GONE));
    }
    fn exchange_u16(&self, to: usize, send: &[u16], from: usize, recv: &mut [u16]) {
        let (tx, rx) = mpsc::channel();
        self.submit(Job::U16 {
            to,
            send: send.to_vec(),
            from,
            recv: vec![0; recv.len()],
            back: tx,
        });
        recv.copy_from_slice(&rx.recv().expect(GONE));
    }
}

/// One step's gradient buckets: filled in the order the backward pass finishes parameters,
/// each sent off to the exchange when full (with `overlap`) or all at the end.
pub struct Buckets<'a> {
    exchange: &'a Exchange,
    opts: CommOptions,
    fill: Vec<f32>,
    held: Vec<Vec<f32>>,
    sent: VecDeque<mpsc::Receiver<Vec<f32>>>,
    /// Payload bytes put into the reductions (elements × the wire's bytes).
    pub bytes: f64,
}

impl<'a> Buckets<'a> {
    pub fn new(exchange: &'a Exchange, opts: CommOptions) -> Buckets<'a> {
        Buckets {
            exchange,
            opts,
            fill: Vec::new(),
            held: Vec::new(),
            sent: VecDeque::new(),
            bytes: 0.0,
        }
    }

    /// Appends one finished gradient (whole: parameters are never split between buckets).
    pub fn push(&mut self, grad: impl ExactSizeIterator<Item = f32>) {
        if !self.fill.is_empty() && self.fill.len() + grad.len() > self.opts.bucket {
            self.close();
        }
        self.bytes += (grad.len() * self.opts.wire.bytes()) as f64;
        self.fill.extend(grad);
    }

    fn close(&mut self) {
        if self.fill.is_empty() {
            return;
        }
        let v = std::mem::take(&mut self.fill);
        if self.opts.overlap {
            self.sent
                .push_back(self.exchange.sum_later(v, self.opts.wire));
        } else {
            self.held.push(v);
        }
    }

    /// Waits for every bucket's sum (a `comm` span on the timeline) and writes the mean over
    /// `ranks` into the gradients of `params`, which must be the parameters pushed, in the order
    /// pushed. Returns the seconds waited.
    pub fn finish_into<T: crate::tensor::Float>(
        self,
        params: Vec<&mut crate::layers::Param<T>>,
        ranks: usize,
    ) -> f64 {
        let waited = std::time::Instant::now();
        let sums = roofline_collectors::timeline::timed(
            "comm",
            || "wait for gradient sums".into(),
            || self.finish(),
        );
        let seconds = waited.elapsed().as_secs_f64();
        let scale = T::from_f64(1.0 / ranks as f64);
        let mut off = 0;
        for p in params {
            for (g, v) in p.grad.iter_mut().zip(&sums[off..]) {
                *g = T::from_f64(*v as f64) * scale;
            }
            off += p.grad.len();
        }
        assert_eq!(off, sums.len(), "the parameters pushed");
        seconds
    }

    /// The summed gradients, concatenated in the order they were pushed.
    pub fn finish(mut self) -> Vec<f32> {
        self.close();
        for v in std::mem::take(&mut self.held) {
            self.sent
                .push_back(self.exchange.sum_later(v, self.opts.wire));
        }
        let mut out = Vec::new();
        for rx in self.sent.drain(..) {
            out.extend(rx.recv().expect(GONE));
        }
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Messages waiting, by (sender, receiver).
    type Mailboxes = std::collections::HashMap<(usize, usize), VecDeque<Vec<u16>>>;

    /// Ranks as threads of one process: sums through shared memory, point-to-point through
    /// mailboxes.
    pub struct Shared {
        acc: Mutex<Vec<f64>>,
        barrier: std::sync::Barrier,
        mail: Mutex<Mailboxes>,
        arrived: std::sync::Condvar,
        ranks: usize,
    }

    impl Shared {
        pub fn new(ranks: usize) -> Arc<Shared> {
            Arc::new(Shared {
                acc: Mutex::new(Vec::new()),
                barrier: std::sync::Barrier::new(ranks),
                mail: Mutex::new(Default::default()),
                arrived: std::sync::Condvar::new(),
                ranks,
            })
        }
    }

    pub struct ThreadReducer {
        pub shared: Arc<Shared>,
        pub rank: usize,
    }

    impl ThreadReducer {
        fn sum(&self, v: &mut [f64]) {
            let s = &self.shared;
            {
                let mut acc = s.acc.lock().unwrap();
                if acc.len() != v.len() {
                    *acc = vec![0.0; v.len()];
                }
                for (a, x) in acc.iter_mut().zip(v.iter()) {
                    *a += *x;
                }
            }
            s.barrier.wait();
            v.copy_from_slice(&s.acc.lock().unwrap());
            s.barrier.wait();
            if self.rank == 0 {
                s.acc.lock().unwrap().clear();
            }
            s.barrier.wait();
        }
    }

    impl Reducer for ThreadReducer {
        fn ranks(&self) -> usize {
            self.shared.ranks
        }
        fn rank(&self) -> usize {
            self.rank
        }
        fn sum_f64(&self, v: &mut [f64]) {
            self.sum(v);
        }
        fn sum_f32(&self, v: &mut [f32]) {
            let mut w: Vec<f64> = v.iter().map(|x| *x as f64).collect();
            self.sum(&mut w);
            for (a, b) in v.iter_mut().zip(&w) {
                *a = *b as f32;
            }
        }
        fn exchange_u16(&self, to: usize, send: &[u16], from: usize, recv: &mut [u16]) {
            let s = &self.shared;
            let mut mail = s.mail.lock().unwrap();
            mail.entry((self.rank, to))
                .or_default()
                .push_back(send.to_vec());
            s.arrived.notify_all();
            loop {
                if let Some(m) = mail.get_mut(&(from, self.rank)).and_then(|q| q.pop_front()) {
                    assert_eq!(m.len(), recv.len(), "message length");
                    recv.copy_from_slice(&m);
                    return;
                }
                mail = s.arrived.wait(mail).unwrap();
            }
        }
    }

    /// Runs `f` on `n` thread-ranks and returns their results in rank order.
    pub fn on_ranks<R: Send>(n: usize, f: impl Fn(Arc<dyn Reducer>) -> R + Sync) -> Vec<R> {
        let shared = Shared::new(n);
        std::thread::scope(|sc| {
            let hs: Vec<_> = (0..n)
                .map(|rank| {
                    let r: Arc<dyn Reducer> = Arc::new(ThreadReducer {
                        shared: Arc::clone(&shared),
                        rank,
                    });
                    let f = &f;
                    sc.spawn(move || f(r))
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        })
    }

    fn local(rank: usize, len: usize) -> Vec<f32> {
        let mut rng = crate::data::Rng::new(rank as u64 + 5);
        (0..len).map(|_| (rng.normal() * 1e-3) as f32).collect()
    }

    #[test]
    fn wire_formats_round_trip() {
        for w in [Wire::F16, Wire::Bf16] {
            let (mut e, mut d) = ([0u16; 3], [0f32; 3]);
            w.encode(&[0.5, -3.0, 1.0 + 1.0 / 4096.0], &mut e);
            w.decode(&e, &mut d);
            // Exact where the format holds the value; rounded where it does not.
            assert_eq!(&d[..2], &[0.5, -3.0]);
            assert_eq!(d[2], 1.0, "{w:?}");
        }
        assert_eq!(Wire::F16.bytes() + Wire::F32.bytes(), 6);
    }

    /// The compressed ring gives every rank the same bits, close to the exact sum, for rank
    /// counts that do and do not divide the length.
    #[test]
    fn compressed_ring_sums_match_the_exact_sum_on_every_rank() {
        for (ranks, len, wire, tol) in [
            (2, 1000, Wire::F16, 2e-3),
            (3, 1001, Wire::F16, 2e-3),
            (4, 7, Wire::Bf16, 2e-2),
            (3, 2, Wire::F16, 2e-3),
        ] {
            let exact: Vec<f64> = (0..len)
                .map(|i| (0..ranks).map(|r| local(r, len)[i] as f64).sum())
                .collect();
            let out = on_ranks(ranks, |r| {
                let mut v = local(r.rank(), len);
                ring_sum_16(r.as_ref(), &mut v, wire);
                v
            });
            for o in &out[1..] {
                assert_eq!(
                    o.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    out[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                    "ranks disagree ({ranks} ranks, {wire:?})"
                );
            }
            let err = out[0]
                .iter()
                .zip(&exact)
                .map(|(a, b)| (*a as f64 - b).powi(2))
                .sum::<f64>()
                .sqrt()
                / exact.iter().map(|b| b * b).sum::<f64>().sqrt();
            assert!(err < tol, "{ranks} ranks, {wire:?}: relative error {err:e}");
            assert!(err > 0.0, "no rounding at all: was it compressed?");
        }
    }

    /// Gradients of 1e-6 (below f16's normal range, 6.1e-5) survive thanks to the shared
    /// scale; values of 1e5 (above its largest, 65504) do not overflow.
    #[test]
    fn f16_ring_scales_into_range() {
        for mag in [1e-6f32, 1e5] {
            let out = on_ranks(2, |r| {
                let mut v: Vec<f32> = (0..64).map(|i| mag * (1.0 + i as f32 / 64.0)).collect();
                ring_sum_16(r.as_ref(), &mut v, Wire::F16);
                v
            });
            for (i, x) in out[0].iter().enumerate() {
                let want = 2.0 * mag * (1.0 + i as f32 / 64.0);
                assert!(
                    ((x - want) / want).abs() < 2e-3,
                    "{mag:e}: element {i} is {x:e}, wanted {want:e}"
                );
            }
        }
    }

    /// Through the exchange thread: buckets (overlapped or not) and interleaved blocking sums
    /// arrive in order with the right values.
    #[test]
    fn buckets_through_the_exchange_thread_keep_their_order() {
        for overlap in [true, false] {
            let out = on_ranks(2, |r| {
                let ex = Exchange::start(r);
                let opts = CommOptions {
                    wire: Wire::F32,
                    overlap,
                    bucket: 5,
                };
                let mut b = Buckets::new(&ex, opts);
                let mut stats = Vec::new();
                for k in 0..6 {
                    let rank = ex.rank() as f32;
                    b.push((0..3).map(|i| (10 * k + i) as f32 + rank));
                    // A batch-norm-like blocking sum between pushes.
                    let mut s = [k as f64];
                    ex.sum_f64(&mut s);
                    stats.push(s[0]);
                }
                let bytes = b.bytes;
                (b.finish(), stats, bytes)
            });
            let (sum, stats, bytes) = &out[0];
            let want: Vec<f32> = (0..6)
                .flat_map(|k| (0..3).map(move |i| (2 * (10 * k + i) + 1) as f32))
                .collect();
            assert_eq!(sum, &want, "overlap {overlap}");
            assert_eq!(stats, &[0.0, 2.0, 4.0, 6.0, 8.0, 10.0]);
            assert_eq!(*bytes, 18.0 * 4.0);
            assert_eq!(out[1].0, want);
        }
    }
}
