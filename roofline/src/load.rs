//! Whether a result was measured on a quiet machine: the share of the CPUs other processes
//! took just before the work, during it and just after it, and the one-core clock measured
//! idle before the work and again after it, against the clock measured during it. A busy
//! machine's results understate it (and its measured clock, which scales the theoretical
//! peak, is the contended one): such a file says so, and `gate` does not compare it.

use serde::{Deserialize, Serialize};

/// What the load check saw (`provenance.load`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LoadCheck {
    /// Share (0 to 1) of all the CPUs' time other processes and the hypervisor (steal) took
    /// in a short window before the work, during the work, and in one after it.
    pub others_before: Option<f64>,
    pub others_during: Option<f64>,
    pub others_after: Option<f64>,
    /// The one-core clock measured idle before the work and again after it, Hz.
    pub clock_before_hz: Option<f64>,
    pub clock_after_hz: Option<f64>,
    /// The one-core clock measured during the work (the median of its samples), Hz.
    pub clock_during_hz: Option<f64>,
    /// Why the results are not to be trusted; empty when the machine was quiet.
    pub busy: Vec<String>,
}

impl LoadCheck {
    /// Other processes taking more than this share of the CPUs make the machine busy.
    pub const OTHERS_MAX: f64 = 0.10;
    /// A clock during (or after) the work below this fraction of the idle reference makes it
    /// busy (turbo and thermal drift stay well within it on a quiet machine).
    pub const CLOCK_MIN: f64 = 0.90;

    /// The verdict on what was seen.
    pub fn judge(
        others: [Option<f64>; 3],
        clock_before_hz: Option<f64>,
        clock_during_hz: Option<f64>,
        clock_after_hz: Option<f64>,
    ) -> LoadCheck {
        let mut busy = Vec::new();
        for (share, when) in others.iter().zip(["before", "during", "after"]) {
            if let Some(s) = share.filter(|s| *s > Self::OTHERS_MAX) {
                busy.push(format!(
                    "other processes took {:.0}% of the CPUs {when} the work",
                    100.0 * s
                ));
            }
        }
        if let Some(r) = clock_before_hz.filter(|r| *r > 0.0) {
            for (c, when) in [(clock_during_hz, "during"), (clock_after_hz, "after")] {
                if let Some(c) = c.filter(|c| *c < Self::CLOCK_MIN * r) {
                    busy.push(format!(
                        "the one-core clock {when} the work was {:.2} GHz, {:.0}% of the {:.2} GHz measured idle before it",
                        c / 1e9,
                        100.0 * c / r,
                        r / 1e9
                    ));
                }
            }
        }
        LoadCheck {
            others_before: others[0],
            others_during: others[1],
            others_after: others[2],
            clock_before_hz,
            clock_after_hz,
            clock_during_hz,
            busy,
        }
    }

    pub fn is_busy(&self) -> bool {
        !self.busy.is_empty()
    }

    /// One line for the table and the notes.
    pub fn warning(&self) -> Option<String> {
        self.is_busy().then(|| {
            format!(
                "the machine was busy while it was measured ({}): every ceiling may understate it, and `gate` will not compare this file; probe again when it is idle",
                self.busy.join("; ")
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn busy_against_the_idle_reference_not_against_itself() {
        // Two probes at once: half the CPUs taken by the other, the clock during at half the
        // idle one.
        let c = LoadCheck::judge(
            [Some(0.02), Some(0.48), Some(0.01)],
            Some(4.25e9),
            Some(2.0e9),
            Some(4.2e9),
        );
        assert!(c.is_busy());
        assert_eq!(c.busy.len(), 2, "{:?}", c.busy);
        assert!(c.busy[0].contains("48% of the CPUs during"));
        assert!(c.busy[1].contains("2.00 GHz, 47% of the 4.25 GHz"));
        assert!(c.warning().unwrap().contains("gate"));
        // Quiet: a little noise, the clock within 10%.
        let q = LoadCheck::judge(
            [Some(0.01), Some(0.03), Some(0.0)],
            Some(4.25e9),
            Some(4.0e9),
            Some(4.1e9),
        );
        assert!(!q.is_busy() && q.warning().is_none());
        // Busy before the work starts (the reference itself contended) is caught by the share.
        let b = LoadCheck::judge([Some(0.5), None, None], Some(2.0e9), Some(2.0e9), None);
        assert!(b.is_busy());
    }
}
