//! The one driver every probe runs under. Each device brings its [`Timer`] (the CPU's wall
//! clock, a GPU's CUDA events on its stream, the MPI clock after a barrier of the ranks) and
//! [`sample`] does what every backend does with it: warm up, let the device settle, take the
//! timed samples, stop when interrupted. On the CPU, `measure_here` and `measure_threads` add
//! what the CPU kernels need: an iteration count that makes a sample long enough to time, the
//! kernel built on each pinned thread, all threads released together, and every thread checking
//! its own result.

use crate::affinity::pin_current_thread;
use crate::ProbeError;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::Instant;

/// How one sample is timed on a device.
pub trait Timer {
    type Error;
    /// Seconds `work` took, as this device times it.
    fn time(
        &mut self,
        work: &mut dyn FnMut() -> Result<(), Self::Error>,
    ) -> Result<f64, Self::Error>;
    /// Waits until everything started has finished (a GPU's stream); the CPU has nothing to wait
    /// for.
    fn settle(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
    /// Called at the end of every kept sample: a device that records its conditions (a GPU's
    /// clock, power and throttle reasons, through NVML) reads them here. Nothing by default.
    fn observe(&mut self) {}
}

/// The CPU's timer: the wall clock around the work.
pub struct WallClock;

impl Timer for WallClock {
    type Error = ProbeError;
    fn time(
        &mut self,
        work: &mut dyn FnMut() -> Result<(), ProbeError>,
    ) -> Result<f64, ProbeError> {
        let t0 = Instant::now();
        work()?;
        Ok(t0.elapsed().as_secs_f64())
    }
}

/// What every backend does with its timer: `warmup` untimed runs of `work`, the device settled,
/// then `samples` runs each timed by `timer`, `stop` asked before each (an interruption ends the
/// measurement with its error). Returns each sample's seconds.
pub fn sample<T: Timer>(
    timer: &mut T,
    warmup: usize,
    samples: usize,
    stop: &mut dyn FnMut() -> Result<(), T::Error>,
    work: &mut dyn FnMut() -> Result<(), T::Error>,
) -> Result<Vec<f64>, T::Error> {
    for _ in 0..warmup {
        work()?;
    }
    timer.settle()?;
    let mut seconds = Vec::with_capacity(samples);
    for _ in 0..samples {
        stop()?;
        seconds.push(timer.time(work)?);
        timer.observe();
    }
    Ok(seconds)
}

/// The calibration rule of every backend: after a run of `iters` iterations that took `dt`
/// seconds, the next count to try — grown towards `target` seconds with 20% to spare, at least
/// ×2 and at most ×16 at a time, never above `cap` — or `None` when this count is long enough
/// (or is the cap).
pub fn grow(iters: u64, dt: f64, target: f64, cap: u64) -> Option<u64> {
    if dt >= target || iters >= cap {
        return None;
    }
    let factor = if dt > 0.0 {
        (1.2 * target / dt).clamp(2.0, 16.0)
    } else {
        16.0
    };
    Some(((iters as f64 * factor).ceil() as u64).min(cap))
}

/// The iteration count (from `start`, at most `cap`) that makes one run of `work` last at least
/// `target` seconds on `timer`, by [`grow`]; one untimed run first (a first launch loads and
/// compiles).
pub fn calibrate<T: Timer>(
    timer: &mut T,
    start: u64,
    cap: u64,
    target: f64,
    work: &mut dyn FnMut(u64) -> Result<(), T::Error>,
) -> Result<u64, T::Error> {
    let mut n = start.max(1);
    work(n)?;
    loop {
        let dt = timer.time(&mut || work(n))?;
        match grow(n, dt, target, cap) {
            None => return Ok(n),
            Some(next) => n = next,
        }
    }
}

/// Times an operation that may be short (one copy, one pass over a buffer): `run(n)` does it
/// `n` times back to back, and each sample runs it as many times (from 1, at most `cap`) as
/// make the sample last `target` seconds by [`calibrate`], so that a sample's fixed cost (a
/// launch, a pair of events: a few µs) stays far under 1% of it however short one operation
/// is. Returns the seconds of one operation in each of `samples` samples (after one warm-up),
/// and the operations per sample.
pub fn per_operation<T: Timer>(
    timer: &mut T,
    samples: usize,
    target: f64,
    cap: u64,
    stop: &mut dyn FnMut() -> Result<(), T::Error>,
    run: &mut dyn FnMut(u64) -> Result<(), T::Error>,
) -> Result<(Vec<f64>, u64), T::Error> {
    let reps = calibrate(timer, 1, cap, target, run)?.max(1);
    let seconds = sample(timer, 1, samples, stop, &mut || run(reps))?;
    Ok((seconds.iter().map(|t| t / reps as f64).collect(), reps))
}

/// [`per_operation`] for an operation issued once per call: `one` called back to back.
pub fn repeated<T: Timer>(
    timer: &mut T,
    samples: usize,
    target: f64,
    cap: u64,
    stop: &mut dyn FnMut() -> Result<(), T::Error>,
    one: &mut dyn FnMut() -> Result<(), T::Error>,
) -> Result<(Vec<f64>, u64), T::Error> {
    per_operation(timer, samples, target, cap, stop, &mut |n| {
        for _ in 0..n.max(1) {
            one()?;
        }
        Ok(())
    })
}

/// How a kernel's check of its own result failed: the value that is wrong, where, and what it
/// must be.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
pub enum CheckError {
    /// A value the work determines exactly (a count, a bit-exact chain) is not that value.
    #[error("{what}: {got}, expected {want}")]
    Exact {
        what: String,
        got: String,
        want: String,
    },
    /// A value outside its error bound: `err` is its error relative to `scale`.
    #[error("{what}: {got}, expected {want} (error {err:.2e} of {scale}, bound {bound:.0e})")]
    Bound {
        what: String,
        got: f64,
        want: f64,
        err: f64,
        scale: &'static str,
        bound: f64,
    },
    /// The check of one part of the work (a thread, a layer of a convolution).
    #[error("{part}: {source}")]
    In {
        part: String,
        #[source]
        source: Box<CheckError>,
    },
    /// The driver finished without a measurement (a thread left before recording it).
    #[error("no measurement was recorded")]
    NoMeasurement,
}

impl CheckError {
    /// An exact value that is wrong.
    pub fn exact(what: impl Into<String>, got: impl ToString, want: impl ToString) -> CheckError {
        CheckError::Exact {
            what: what.into(),
            got: got.to_string(),
            want: want.to_string(),
        }
    }
    /// This error, found in `part` of the work.
    pub fn within(self, part: impl Into<String>) -> CheckError {
        CheckError::In {
            part: part.into(),
            source: Box::new(self),
        }
    }
}

/// What a probe kernel states about itself and how it runs.
pub trait Kernel {
    /// Operations (FLOPs, or integer ops) per iteration, this thread's share.
    fn ops_per_iter(&self) -> f64;
    /// Bytes counted per iteration, this thread's share.
    fn bytes_per_iter(&self) -> f64;
    /// Runs `iters` iterations.
    fn run(&mut self, iters: u64);
    /// Checks the result of everything run so far against a reference. Returns the largest
    /// relative error seen (0 for exact checks) or what was wrong.
    fn check(&mut self) -> Result<f64, CheckError>;
    /// True for a reference measurement that is not a ceiling (the clock's add chain): the
    /// test's controlled slowdown ([`test_slowdown`]) leaves it alone.
    fn is_reference(&self) -> bool {
        false
    }
}

/// How long and how often to measure.
#[derive(Clone, Copy, Debug)]
pub struct Plan {
    /// Timed samples kept.
    pub samples: usize,
    /// Samples run and discarded before the kept ones.
    pub warmup: usize,
    /// Minimum duration of one sample, seconds.
    pub min_sample_s: f64,
    /// Upper bound on iterations per sample (a kernel whose iteration is already long).
    pub max_iters: u64,
}

impl Plan {
    pub fn new(samples: usize, warmup: usize, min_sample_s: f64) -> Plan {
        Plan {
            samples: samples.max(1),
            warmup,
            min_sample_s,
            max_iters: u64::MAX / 4,
        }
    }
}

/// The raw outcome of one measurement.
#[derive(Clone, Debug)]
pub struct Measurement {
    /// Wall time of each kept sample, seconds (the earliest thread's start to the latest
    /// thread's end).
    pub seconds: Vec<f64>,
    /// Iterations per sample on every thread.
    pub iters: u64,
    /// Operations per iteration, all threads together.
    pub ops_per_iter: f64,
    /// Bytes per iteration, all threads together.
    pub bytes_per_iter: f64,
    pub threads: usize,
    /// Largest relative error any thread's check reported.
    pub max_rel_error: f64,
    /// The core clock around each kept sample: the add chain's rate (adds per second; the
    /// probe applies the cycle counter's factor) read right before and right after it on every
    /// thread ([`crate::cpu::clock::sample_hz`]): the slowest thread's reading at each end,
    /// the higher of the two ends. Empty where it was not read.
    pub clock_hz: Vec<f64>,
}

impl Measurement {
    /// Operations per second of each sample.
    pub fn op_rates(&self) -> Vec<f64> {
        self.seconds
            .iter()
            .map(|s| self.ops_per_iter * self.iters as f64 / s)
            .collect()
    }
    /// Bytes per second of each sample.
    pub fn byte_rates(&self) -> Vec<f64> {
        self.seconds
            .iter()
            .map(|s| self.bytes_per_iter * self.iters as f64 / s)
            .collect()
    }
}

/// Runs a kernel on the calling thread (no pinning, no extra threads): for kernels that
/// parallelise themselves (a GEMM inside a pinned rayon pool).
pub fn measure_here<K: Kernel>(
    plan: &Plan,
    cancel: &AtomicBool,
    kernel: &mut K,
) -> Result<Measurement, ProbeError> {
    let mut ctl = Controller::new(plan);
    loop {
        // The clock before this run, which is also the clock after the one before it.
        ctl.clocks.push(crate::cpu::clock::sample_hz());
        if cancel.load(Ordering::Relaxed) {
            return Err(ProbeError::Interrupted);
        }
        let n = ctl.iters;
        let dt = WallClock.time(&mut || {
            kernel.run(n);
            Ok(())
        })?;
        if !ctl.record(dt) {
            break;
        }
    }
    ctl.clocks.push(crate::cpu::clock::sample_hz());
    let err = kernel.check()?;
    ctl.reference = kernel.is_reference();
    Ok(ctl.finish(kernel.ops_per_iter(), kernel.bytes_per_iter(), 1, err))
}

/// Runs one kernel per CPU in `cpus`, each thread pinned and building its own kernel with
/// `make(thread_index)` (so that its memory is first touched, and therefore placed, locally).
/// All threads run the same iteration count per sample; a sample's time is from the earliest
/// thread's start to the latest thread's end (STREAM's max(end) − min(start)).
pub fn measure_threads<K, F>(
    cpus: &[usize],
    plan: &Plan,
    cancel: &AtomicBool,
    make: F,
) -> Result<Measurement, ProbeError>
where
    K: Kernel,
    F: Fn(usize) -> Result<K, ProbeError> + Sync,
{
    measure_threads_with(cpus, plan, cancel, make, &|_| {})
}

/// `measure_threads`, with `before_start(thread)` called by each thread between the common
/// release and its start stamp (tests make a thread late with it).
fn measure_threads_with<K, F>(
    cpus: &[usize],
    plan: &Plan,
    cancel: &AtomicBool,
    make: F,
    before_start: &(dyn Fn(usize) + Sync),
) -> Result<Measurement, ProbeError>
where
    K: Kernel,
    F: Fn(usize) -> Result<K, ProbeError> + Sync,
{
    let threads = cpus.len().max(1);
    // Each thread's start and end of the current sample, nanoseconds since `base`: a sample
    // lasts from the earliest start to the latest end (a thread released late must not shorten
    // it, or best-of-samples would pick exactly the samples where one was late).
    let base = Instant::now();
    let starts: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
    let ends: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
    // Each thread's clock reading (f64 bits) taken before the barrier that starts a run: the
    // clock after the run before and before the next.
    let clocks: Vec<AtomicU64> = (0..threads).map(|_| AtomicU64::new(0)).collect();
    let barrier = Barrier::new(threads);
    let iters = AtomicU64::new(0);
    let failed = AtomicBool::new(false);
    let check_failed = AtomicBool::new(false);
    let errors: Mutex<Vec<ProbeError>> = Mutex::new(Vec::new());
    let totals: Mutex<(f64, f64, f64)> = Mutex::new((0.0, 0.0, 0.0));
    let result: Mutex<Option<Measurement>> = Mutex::new(None);

    std::thread::scope(|scope| {
        for (t, &cpu) in cpus.iter().enumerate() {
            let (barrier, iters, failed, check_failed, errors, totals, result, make) = (
                &barrier,
                &iters,
                &failed,
                &check_failed,
                &errors,
                &totals,
                &result,
                &make,
            );
            let (starts, ends, clocks) = (&starts, &ends, &clocks);
            scope.spawn(move || {
                pin_current_thread(cpu);
                let fail = |e: ProbeError| {
                    failed.store(true, Ordering::SeqCst);
                    if let Ok(mut v) = errors.lock() {
                        v.push(e);
                    }
                };
                let mut kernel = match make(t) {
                    Ok(k) => Some(k),
                    Err(e) => {
                        fail(e);
                        None
                    }
                };
                let mut ctl = Controller::new(plan);
                if t == 0 {
                    iters.store(ctl.iters, Ordering::SeqCst);
                    ctl.reference = kernel.as_ref().is_some_and(|k| k.is_reference());
                }
                barrier.wait();
                let mut aborted = false;
                loop {
                    clocks[t].store(crate::cpu::clock::sample_hz().to_bits(), Ordering::SeqCst);
                    // Every thread reads the same `failed` here: it is written only before the
                    // first barrier and by thread 0 after the end-of-sample barrier.
                    barrier.wait();
                    if t == 0 {
                        // Every thread wrote its reading before this barrier and writes the
                        // next only after the end-of-sample one.
                        let slowest = clocks
                            .iter()
                            .map(|c| f64::from_bits(c.load(Ordering::SeqCst)))
                            .fold(f64::INFINITY, f64::min);
                        ctl.clocks.push(slowest);
                    }
                    if failed.load(Ordering::SeqCst) {
                        aborted = true;
                        break;
                    }
                    let n = iters.load(Ordering::SeqCst);
                    if n == 0 {
                        break;
                    }
                    before_start(t);
                    starts[t].store(nanos_since(base), Ordering::SeqCst);
                    if let Some(k) = kernel.as_mut() {
                        k.run(n);
                    }
                    ends[t].store(nanos_since(base), Ordering::SeqCst);
                    barrier.wait();
                    if t == 0 {
                        let more = ctl.record(window(starts, ends));
                        let next = if cancel.load(Ordering::Relaxed) {
                            fail(ProbeError::Interrupted);
                            0
                        } else if more {
                            ctl.iters
                        } else {
                            0
                        };
                        iters.store(next, Ordering::SeqCst);
                    }
                }
                if aborted {
                    return;
                }
                if let Some(k) = kernel.as_mut() {
                    match k.check() {
                        Ok(err) => {
                            if let Ok(mut tot) = totals.lock() {
                                tot.0 += k.ops_per_iter();
                                tot.1 += k.bytes_per_iter();
                                tot.2 = tot.2.max(err);
                            }
                        }
                        Err(e) => {
                            // Not `fail`: `failed` must not change while other threads may
                            // still be reading it in the loop above.
                            check_failed.store(true, Ordering::SeqCst);
                            if let Ok(mut v) = errors.lock() {
                                v.push(e.within(format!("thread {t} (CPU {cpu})")).into());
                            }
                        }
                    }
                }
                barrier.wait();
                if t == 0 && !check_failed.load(Ordering::SeqCst) {
                    let (ops, bytes, err) = totals.lock().map(|t| *t).unwrap_or_default();
                    if let Ok(mut r) = result.lock() {
                        *r = Some(ctl.finish(ops, bytes, threads, err));
                    }
                }
            });
        }
    });

    let mut errors = errors.into_inner().unwrap_or_default();
    if !errors.is_empty() {
        // An interruption wins over the errors it may have caused; otherwise the first error.
        if errors.iter().any(|e| matches!(e, ProbeError::Interrupted)) {
            return Err(ProbeError::Interrupted);
        }
        return Err(errors.swap_remove(0));
    }
    result
        .into_inner()
        .ok()
        .flatten()
        .ok_or(ProbeError::Check(CheckError::NoMeasurement))
}

fn nanos_since(base: Instant) -> u64 {
    base.elapsed().as_nanos() as u64
}

/// Seconds from the earliest start to the latest end of the threads' stamps (nanoseconds).
fn window(starts: &[AtomicU64], ends: &[AtomicU64]) -> f64 {
    let first = starts.iter().map(|s| s.load(Ordering::SeqCst)).min();
    let last = ends.iter().map(|e| e.load(Ordering::SeqCst)).max();
    match (first, last) {
        (Some(a), Some(b)) => b.saturating_sub(a) as f64 * 1e-9,
        _ => 0.0,
    }
}

/// The environment variable of [`test_slowdown`].
pub const TEST_SLOWDOWN: &str = "ROOFLINE_TEST_SLOWDOWN";

/// A controlled slowdown for testing what reads the ceilings (`roofline gate`):
/// `ROOFLINE_TEST_SLOWDOWN=0.15` stretches every kept CPU sample so that every CPU ceiling
/// comes out 15% lower, as a real regression would. 0 (no slowdown) when unset; a value outside
/// [0, 0.9] is ignored. A probe that runs under it says so in its notes.
pub fn test_slowdown() -> f64 {
    static SLOWDOWN: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *SLOWDOWN.get_or_init(|| {
        std::env::var(TEST_SLOWDOWN)
            .ok()
            .and_then(|v| v.trim().parse::<f64>().ok())
            .filter(|f| (0.0..=0.9).contains(f))
            .unwrap_or(0.0)
    })
}

/// The iteration-count and sample bookkeeping shared by both drivers.
struct Controller {
    plan: Plan,
    iters: u64,
    calibrating: bool,
    warmups_left: usize,
    seconds: Vec<f64>,
    /// Runs recorded so far (calibration, warm-up and kept).
    runs: usize,
    /// The run each kept sample was.
    kept: Vec<usize>,
    /// Clock readings between runs: `clocks[r]` before run r, `clocks[r + 1]` after it.
    clocks: Vec<f64>,
    /// The kernel is a reference, not a ceiling ([`Kernel::is_reference`]).
    reference: bool,
}

impl Controller {
    fn new(plan: &Plan) -> Controller {
        Controller {
            plan: *plan,
            iters: 1,
            calibrating: true,
            warmups_left: plan.warmup,
            seconds: Vec::with_capacity(plan.samples),
            runs: 0,
            kept: Vec::with_capacity(plan.samples),
            clocks: Vec::new(),
            reference: false,
        }
    }

    /// Records the time of the run just done; returns whether to run again (with `self.iters`).
    fn record(&mut self, dt: f64) -> bool {
        let run = self.runs;
        self.runs += 1;
        let target = self.plan.min_sample_s;
        if self.calibrating {
            if let Some(next) = grow(self.iters, dt, target, self.plan.max_iters) {
                self.iters = next;
                return true;
            }
            self.calibrating = false;
            // This run was long enough: it counts as the first warm-up.
            self.warmups_left = self.warmups_left.saturating_sub(1);
            return true;
        }
        if self.warmups_left > 0 {
            self.warmups_left -= 1;
            return true;
        }
        self.seconds.push(dt);
        self.kept.push(run);
        self.seconds.len() < self.plan.samples
    }

    fn finish(self, ops: f64, bytes: f64, threads: usize, err: f64) -> Measurement {
        // A sample's clock: the higher of the readings before and after it (a throttle that
        // lasts through the sample shows in both; a moment's dip in one reading, an interrupt
        // or a busy SMT sibling, is not the sample's clock). All samples or none.
        let around = |r: usize| Some(self.clocks.get(r)?.max(*self.clocks.get(r + 1)?));
        let clock_hz: Option<Vec<f64>> = self.kept.iter().map(|&r| around(r)).collect();
        let clock_hz = clock_hz
            .filter(|c| c.iter().all(|x| x.is_finite() && *x > 0.0))
            .unwrap_or_default();
        // The test's controlled slowdown: every sample of a ceiling stretched.
        let stretch = if self.reference {
            1.0
        } else {
            1.0 / (1.0 - test_slowdown())
        };
        Measurement {
            clock_hz,
            seconds: self.seconds.iter().map(|s| s * stretch).collect(),
            iters: self.iters,
            ops_per_iter: ops,
            bytes_per_iter: bytes,
            threads,
            max_rel_error: err,
        }
    }
}

#[cfg(test)]
mod tests;
