//! A per-operation deadline for communication: a rank that dies or hangs must not hang the
//! others forever. `arm` before an operation, `disarm` after; when an armed deadline passes,
//! the watchdog thread prints which rank waited for what, and ends the process (exit 1), which
//! makes the MPI launcher end the job. Results are written at the end, except what a long
//! phase keeps as it goes ([`keep`]: the link rounds' root keeps the machine measured so far,
//! and the watchdog writes it before it ends the process).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

struct State {
    start: Instant,
    timeout: Duration,
    who: String,
    /// Milliseconds since `start` when the armed operation times out; 0 = disarmed.
    deadline_ms: AtomicU64,
    label: Mutex<String>,
}

static STATE: OnceLock<State> = OnceLock::new();

/// What to write when the watchdog ends the process: a file and its text.
static KEPT: Mutex<Option<(std::path::PathBuf, String)>> = Mutex::new(None);

/// Keeps `text` to be written to `path` (atomically) if the watchdog ends the process; `None`
/// forgets it. The caller also writes it itself where it can: this is for the rank that hangs.
pub fn keep(kept: Option<(std::path::PathBuf, String)>) {
    if let Ok(mut k) = KEPT.lock() {
        *k = kept;
    }
}

/// Writes what was kept; returns where, when it was written.
fn write_kept() -> Option<std::path::PathBuf> {
    let (path, text) = KEPT.lock().ok()?.clone()?;
    let tmp = path.with_extension("partial.tmp");
    std::fs::write(&tmp, text.as_bytes()).ok()?;
    std::fs::rename(&tmp, &path).ok()?;
    Some(path)
}

/// Starts the watchdog thread (once per process). `who` names this rank in messages.
pub fn start(timeout: Duration, who: String) {
    if STATE
        .set(State {
            start: Instant::now(),
            timeout,
            who,
            deadline_ms: AtomicU64::new(0),
            label: Mutex::new(String::new()),
        })
        .is_err()
    {
        return;
    }
    let _ = std::thread::Builder::new()
        .name("roofline-watchdog".into())
        .spawn(|| loop {
            std::thread::sleep(Duration::from_millis(100));
            let Some(s) = STATE.get() else { return };
            let d = s.deadline_ms.load(Ordering::SeqCst);
            if d != 0 && s.start.elapsed().as_millis() as u64 > d {
                let label = s.label.lock().map(|l| l.clone()).unwrap_or_default();
                let written = match write_kept() {
                    Some(p) => format!("what was measured so far is in {}", p.display()),
                    None => "nothing was written".into(),
                };
                eprintln!(
                    "roofline: error: {}: {label} did not complete within {:.0} s: a rank died or stopped answering (raise the limit with --comm-timeout); {written}",
                    s.who,
                    s.timeout.as_secs_f64()
                );
                std::process::exit(1);
            }
        });
}

/// The timeout in force (if the watchdog runs).
pub fn timeout() -> Option<Duration> {
    STATE.get().map(|s| s.timeout)
}

/// Arms the deadline for the operation `label` (e.g. "allreduce 16 MiB (intra)").
pub fn arm(label: &str) {
    if let Some(s) = STATE.get() {
        if let Ok(mut l) = s.label.lock() {
            l.clear();
            l.push_str(label);
        }
        let d = s.start.elapsed() + s.timeout;
        s.deadline_ms
            .store(d.as_millis() as u64 + 1, Ordering::SeqCst);
    }
}

pub fn disarm() {
    if let Some(s) = STATE.get() {
        s.deadline_ms.store(0, Ordering::SeqCst);
    }
}
