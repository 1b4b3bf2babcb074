//! The driver's tests: calibration, samples and their clocks, threads, checks, interruption.

use super::*;

/// A device whose samples cost 5 µs of their own (a launch, two events) and whose
/// operation takes 10 µs: one operation per sample would read 15 µs, 50% slow. Repeated to
/// the 5 ms target, the fixed cost is 0.1%.
#[test]
fn short_operations_are_repeated_until_the_overhead_is_negligible() {
    struct Simulated<'a>(&'a std::cell::Cell<u64>);
    impl Timer for Simulated<'_> {
        type Error = ();
        fn time(&mut self, work: &mut dyn FnMut() -> Result<(), ()>) -> Result<f64, ()> {
            let before = self.0.get();
            work()?;
            Ok(5e-6 + (self.0.get() - before) as f64 * 10e-6)
        }
    }
    let ops = std::cell::Cell::new(0u64);
    let (seconds, reps) = repeated(
        &mut Simulated(&ops),
        5,
        5e-3,
        1 << 12,
        &mut || Ok(()),
        &mut || {
            ops.set(ops.get() + 1);
            Ok(())
        },
    )
    .unwrap();
    assert_eq!(seconds.len(), 5);
    assert!(reps >= 500, "{reps} repetitions per sample");
    for s in seconds {
        assert!((s - 10e-6).abs() < 0.01 * 10e-6, "{s} s per operation");
    }
    // With no target (check mode), once.
    let (_, reps) = repeated(
        &mut Simulated(&ops),
        1,
        0.0,
        1 << 12,
        &mut || Ok(()),
        &mut || Ok(()),
    )
    .unwrap();
    assert_eq!(reps, 1);
}

/// A timer that counts: the driver warms up untimed, settles once, times each sample, and
/// ends at the first stop.
#[test]
fn sample_warms_up_settles_and_stops() {
    struct Fake {
        timed: usize,
        settled: usize,
    }
    impl Timer for Fake {
        type Error = String;
        fn time(&mut self, work: &mut dyn FnMut() -> Result<(), String>) -> Result<f64, String> {
            self.timed += 1;
            work()?;
            Ok(self.timed as f64)
        }
        fn settle(&mut self) -> Result<(), String> {
            self.settled += 1;
            Ok(())
        }
    }
    let mut t = Fake {
        timed: 0,
        settled: 0,
    };
    let mut runs = 0;
    let s = sample(&mut t, 2, 3, &mut || Ok(()), &mut || {
        runs += 1;
        Ok(())
    })
    .unwrap();
    assert_eq!(
        (s, runs, t.timed, t.settled),
        (vec![1.0, 2.0, 3.0], 5, 3, 1)
    );
    let mut asked = 0;
    let e = sample(
        &mut t,
        0,
        5,
        &mut || {
            asked += 1;
            if asked == 3 {
                Err("interrupted".to_string())
            } else {
                Ok(())
            }
        },
        &mut || Ok(()),
    );
    assert_eq!(e, Err("interrupted".to_string()));
    assert_eq!(t.timed, 5);
}

/// Calibration grows the count (×2 to ×16 a step, never past the cap) until a run lasts the
/// target, on any timer: here one whose runs take 1 ms per iteration, and one that reads 0 s.
#[test]
fn calibration_reaches_the_target_or_the_cap() {
    use std::cell::Cell;
    struct PerIter<'a>(&'a Cell<u64>, f64);
    impl Timer for PerIter<'_> {
        type Error = ();
        fn time(&mut self, work: &mut dyn FnMut() -> Result<(), ()>) -> Result<f64, ()> {
            work()?;
            Ok(self.0.get() as f64 * self.1)
        }
    }
    let ran = Cell::new(0u64);
    let mut counts = Vec::new();
    let n = calibrate(&mut PerIter(&ran, 1e-3), 1, 1 << 20, 0.05, &mut |n| {
        ran.set(n);
        counts.push(n);
        Ok(())
    })
    .unwrap();
    // Warm-up at 1, then 1 (1 ms: ×16), 16 (16 ms: ×3.75), 60: the first to last 50 ms.
    assert_eq!(counts, vec![1, 1, 16, 60]);
    assert_eq!(n, 60);
    assert!(n as f64 * 1e-3 >= 0.05);
    // A timer that reads 0 s: ×16 a step until the cap.
    let n = calibrate(&mut PerIter(&ran, 0.0), 1, 1 << 20, 0.05, &mut |n| {
        ran.set(n);
        Ok(())
    });
    assert_eq!(n, Ok(1 << 20));
    assert_eq!(grow(10, 0.001, 0.05, 1000), Some(160));
    assert_eq!(grow(10, 0.04, 0.05, 1000), Some(20));
    assert_eq!(grow(10, 0.06, 0.05, 1000), None);
    assert_eq!(grow(900, 0.001, 0.05, 1000), Some(1000));
    assert_eq!(grow(1000, 0.001, 0.05, 1000), None);
}

/// Sums a vector: the result is known, and a wrong count of runs is caught.
struct Summer {
    data: Vec<u64>,
    runs: u64,
    acc: u64,
}

impl Kernel for Summer {
    fn ops_per_iter(&self) -> f64 {
        self.data.len() as f64
    }
    fn bytes_per_iter(&self) -> f64 {
        8.0 * self.data.len() as f64
    }
    fn run(&mut self, iters: u64) {
        for _ in 0..iters {
            self.acc = self
                .acc
                .wrapping_add(std::hint::black_box(&self.data).iter().sum::<u64>());
        }
        self.runs += iters;
    }
    fn check(&mut self) -> Result<f64, CheckError> {
        let per: u64 = self.data.iter().sum();
        let want = per.wrapping_mul(self.runs);
        if self.acc == want {
            Ok(0.0)
        } else {
            Err(CheckError::exact("sum", self.acc, want))
        }
    }
}

fn summer() -> Summer {
    Summer {
        data: (0..4096).collect(),
        runs: 0,
        acc: 0,
    }
}

#[test]
fn threads_agree_and_samples_are_long_enough() {
    let cpus = crate::affinity::allowed_cpus();
    let plan = Plan::new(3, 1, 0.002);
    let m = measure_threads(&cpus, &plan, &AtomicBool::new(false), |_| Ok(summer())).unwrap();
    assert_eq!(m.seconds.len(), 3);
    assert_eq!(m.threads, cpus.len());
    assert_eq!(m.ops_per_iter, 4096.0 * cpus.len() as f64);
    assert!(m.seconds.iter().all(|&s| s > 0.0));
    // Calibration chose a count (usually thousands; under a preempted core it can be 1, so
    // nothing more is asserted: tests never assert timings).
    assert!(m.iters >= 1);
    // One clock per kept sample, each a clock (adds per second of a chain: above 100 MHz
    // on anything that runs these tests).
    assert_eq!(m.clock_hz.len(), 3);
    assert!(m.clock_hz.iter().all(|&hz| hz > 1e8), "{:?}", m.clock_hz);
}

/// The clock around sample k is the higher of the readings taken before run r_k and after
/// it, whatever the calibration and warm-up runs before.
#[test]
fn each_kept_sample_gets_the_readings_around_its_own_run() {
    let plan = Plan::new(2, 1, 0.5);
    let mut c = Controller::new(&plan);
    // Run 0 calibrates (long enough: it is also the warm-up), runs 1 and 2 are kept.
    for (i, dt) in [1.0, 1.0, 1.0].into_iter().enumerate() {
        c.clocks.push([3.0e9, 2.0e9, 3.5e9][i]);
        c.record(dt);
    }
    c.clocks.push(1.0e9);
    let m = c.finish(1.0, 1.0, 1, 0.0);
    assert_eq!(m.seconds.len(), 2);
    // Run 1: readings 2.0 (before) and 3.5 (after); run 2: 3.5 and 1.0.
    assert_eq!(m.clock_hz, vec![3.5e9, 3.5e9]);
    // measure_here reads them too.
    let m = measure_here(
        &Plan::new(3, 0, 0.001),
        &AtomicBool::new(false),
        &mut summer(),
    )
    .unwrap();
    assert_eq!(m.clock_hz.len(), 3);
}

#[test]
fn a_failed_check_and_a_failed_setup_are_errors_not_hangs() {
    struct Bad;
    impl Kernel for Bad {
        fn ops_per_iter(&self) -> f64 {
            1.0
        }
        fn bytes_per_iter(&self) -> f64 {
            1.0
        }
        fn run(&mut self, _: u64) {}
        fn check(&mut self) -> Result<f64, CheckError> {
            Err(CheckError::exact("deliberately wrong", 1, 2))
        }
    }
    let plan = Plan::new(2, 0, 0.0);
    let cancel = AtomicBool::new(false);
    let e = measure_threads(&[0, 0], &plan, &cancel, |_| Ok(Bad)).unwrap_err();
    assert!(
        e.to_string().contains("deliberately wrong: 1, expected 2"),
        "{e}"
    );
    // The failing thread is named, and the kernel's own error is kept as the cause.
    let ProbeError::Check(CheckError::In { part, source }) = e else {
        panic!("{e:?}")
    };
    assert!(part.starts_with("thread "), "{part}");
    assert!(matches!(*source, CheckError::Exact { .. }));
    let e = measure_threads(&[0, 0], &plan, &cancel, |t| {
        if t == 1 {
            Err(ProbeError::Alloc(1 << 40))
        } else {
            Ok(summer())
        }
    })
    .unwrap_err();
    assert!(matches!(e, ProbeError::Alloc(_)));
    assert!(measure_here(&plan, &cancel, &mut Bad).is_err());
}

/// A sample lasts from the earliest start to the latest end: thread 0 released 30 ms late
/// while thread 1 works 60 ms from the release does not shorten it (timed from thread 0's
/// start, each sample read ~30 ms, and rates twice too high).
#[test]
fn a_late_thread_does_not_shorten_the_window() {
    struct Sleeper(u64);
    impl Kernel for Sleeper {
        fn ops_per_iter(&self) -> f64 {
            1.0
        }
        fn bytes_per_iter(&self) -> f64 {
            0.0
        }
        fn run(&mut self, iters: u64) {
            std::thread::sleep(std::time::Duration::from_millis(self.0 * iters));
        }
        fn check(&mut self) -> Result<f64, CheckError> {
            Ok(0.0)
        }
    }
    let plan = Plan::new(2, 0, 0.0);
    let late = |t: usize| {
        if t == 0 {
            std::thread::sleep(std::time::Duration::from_millis(30));
        }
    };
    let m = measure_threads_with(
        &[0, 0],
        &plan,
        &AtomicBool::new(false),
        |t| Ok(Sleeper(if t == 0 { 0 } else { 60 })),
        &late,
    )
    .unwrap();
    assert_eq!(m.seconds.len(), 2);
    for s in &m.seconds {
        assert!(
            *s >= 0.060,
            "a sample of {s} s is shorter than thread 1's 60 ms"
        );
    }
}

#[test]
fn cancellation_stops_the_run() {
    let cancel = AtomicBool::new(true);
    let plan = Plan::new(1000, 0, 0.01);
    let e = measure_threads(&[0, 0], &plan, &cancel, |_| Ok(summer())).unwrap_err();
    assert!(matches!(e, ProbeError::Interrupted));
    let e = measure_here(&plan, &cancel, &mut summer()).unwrap_err();
    assert!(matches!(e, ProbeError::Interrupted));
}
