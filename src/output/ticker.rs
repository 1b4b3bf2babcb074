//! Progress for a log (stderr not a terminal: a CI job, `2> log`, a batch system): plain lines
//! where a terminal shows a bar, so that nothing long runs in silence.

use std::sync::Mutex;
use std::time::{Duration, Instant};

/// At most one line every [`Ticker::EVERY`] seconds, and one whenever the group (a probe's
/// section) changes or the caller says the moment matters (a run's first and last step).
pub struct Ticker {
    start: Instant,
    /// When the last line was said, and its group.
    last: Mutex<Option<(Instant, String)>>,
}

impl Ticker {
    pub const EVERY: Duration = Duration::from_secs(10);

    pub fn new() -> Ticker {
        Ticker {
            start: Instant::now(),
            last: Mutex::new(None),
        }
    }

    /// Says `line()` on stderr, with the time since the start, when `group` differs from the
    /// last line's, [`Self::EVERY`] has passed since it, or `now` is true.
    pub fn tick(&self, group: &str, now: bool, line: impl FnOnce() -> String) {
        let mut last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        let due = match &*last {
            None => true,
            Some((at, g)) => now || g != group || at.elapsed() >= Self::EVERY,
        };
        if due {
            let t = self.start.elapsed().as_secs();
            eprintln!("roofline: [{}:{:02}] {}", t / 60, t % 60, line());
            *last = Some((Instant::now(), group.to_string()));
        }
    }
}
