//! The two sides of a gate, each one or more runs read from named files: checked to be
//! comparable with the first baseline (one kind of result, the same work, quiet machines, the
//! same hardware) and pooled, so that a verb hands over files and gets two results to compare.

use super::{not_comparable, other_machine, pool, GateInput};
use std::collections::BTreeSet;

/// A run as read from a file, with the name the user gave it.
#[derive(Clone, Debug)]
pub struct Named {
    pub name: String,
    pub input: GateInput,
}

/// Why two sides cannot be compared.
#[derive(Debug, thiserror::Error)]
pub enum SidesError {
    #[error("{baseline} and {current} are results of kinds {base_kinds:?} and {current_kinds:?}: gate compares results of one kind")]
    Kinds {
        baseline: String,
        current: String,
        base_kinds: BTreeSet<&'static str>,
        current_kinds: BTreeSet<&'static str>,
    },
    #[error("{baseline} and {other} are not comparable: {why}")]
    NotComparable {
        baseline: String,
        other: String,
        why: String,
    },
    #[error("{baseline} and {other} were measured on different machines: {why}. A change between them is the hardware's, not the code's; gate a baseline from this kind of machine, or pass --allow-other-machine to compare anyway (--per-clock, where only the clock differs)")]
    OtherMachine {
        baseline: String,
        other: String,
        why: String,
    },
    #[error("{file} was measured on a busy machine ({why}): its figures may understate the machine, so gate compares no file measured so; probe again when it is idle")]
    Busy { file: String, why: String },
    #[error("{file} was measured with the one-core clock {drop:.0}% below the baseline's ({current_ghz:.2} against {baseline_ghz:.2} GHz): the runner was slowed (another tenant, a power cap, throttling), and every clock-bound figure with it, so its figures say nothing of the code; probe again, or pass --per-clock to compare the clock-bound figures per cycle (a fleet check that wants the slower clock found reads it here)")]
    Slowed {
        file: String,
        drop: f64,
        current_ghz: f64,
        baseline_ghz: f64,
    },
    #[error("nothing to compare: a side without a run")]
    Empty,
}

/// Both sides pooled, and what was compared anyway (other hardware, allowed).
#[derive(Debug)]
pub struct Sides {
    pub base: GateInput,
    pub current: GateInput,
    pub warnings: Vec<String>,
}

/// Checks every run against the first baseline and pools each side ([`pool`]). A run from
/// other hardware ([`other_machine`]) is refused, or with `allow_other_machine` compared with
/// a warning; with `per_clock` (the figures compared per cycle) a clock of another class is
/// a warning, not another machine: a cloud VM's clock can wander past the class between runs
/// (2.60 to 3.22 GHz on one Zen 3 VM).
pub fn sides(
    baseline: Vec<Named>,
    current: Vec<Named>,
    allow_other_machine: bool,
    per_clock: bool,
) -> Result<Sides, SidesError> {
    let (Some(first), false) = (baseline.first(), current.is_empty()) else {
        return Err(SidesError::Empty);
    };
    let names = |v: &[Named]| {
        v.iter()
            .map(|n| n.name.as_str())
            .collect::<Vec<_>>()
            .join(" ")
    };
    let kinds = |v: &[Named]| v.iter().map(|n| n.input.kind).collect::<BTreeSet<_>>();
    let (base_kinds, current_kinds) = (kinds(&baseline), kinds(&current));
    if base_kinds.len() != 1 || base_kinds != current_kinds {
        return Err(SidesError::Kinds {
            baseline: names(&baseline),
            current: names(&current),
            base_kinds,
            current_kinds,
        });
    }
    // A busy file is named by its own name, whichever side it is on.
    for n in baseline.iter().chain(&current) {
        if let Some(l) = n.input.provenance.load.as_ref().filter(|l| l.is_busy()) {
            return Err(SidesError::Busy {
                file: n.name.clone(),
                why: l.busy.join("; "),
            });
        }
    }
    let mut warnings = Vec::new();
    for n in baseline.iter().chain(&current) {
        let why = not_comparable(&first.input, &n.input);
        if !why.is_empty() {
            return Err(SidesError::NotComparable {
                baseline: first.name.clone(),
                other: n.name.clone(),
                why: why.join("; "),
            });
        }
        let mut other = other_machine(&first.input, &n.input);
        if per_clock {
            let (clock, rest): (Vec<String>, Vec<String>) = other
                .into_iter()
                .partition(|d| d.starts_with(crate::identity::CLOCK_PHRASE));
            for d in clock {
                warnings.push(format!(
                    "{} and {}: {d}; compared per cycle (--per-clock)",
                    first.name, n.name
                ));
            }
            other = rest;
        }
        if other.is_empty() {
            continue;
        }
        if !allow_other_machine {
            return Err(SidesError::OtherMachine {
                baseline: first.name.clone(),
                other: n.name.clone(),
                why: other.join("; "),
            });
        }
        warnings.push(format!(
            "{} and {} were measured on different machines ({}): compared anyway, as --allow-other-machine asks",
            first.name,
            n.name,
            other.join("; ")
        ));
    }
    let current_names = current
        .iter()
        .map(|n| n.name.as_str())
        .collect::<Vec<_>>()
        .join(" ");
    let inputs = |v: Vec<Named>| v.into_iter().map(|n| n.input).collect();
    let (Some(base), Some(current)) = (pool(inputs(baseline)), pool(inputs(current))) else {
        return Err(SidesError::Empty);
    };
    // A runner whose clock fell as far as the probe's own load check calls busy within a run
    // (below 90% of the reference) was slowed between the runs. Not a fleet's: there a node's
    // slower clock is the finding, named node by node.
    let fleet = base.provenance.cluster.is_some() || current.provenance.cluster.is_some();
    if let (Some(b), Some(c), false) = (
        super::clock::clock_of(&base),
        super::clock::clock_of(&current),
        per_clock || fleet,
    ) {
        if c < crate::LoadCheck::CLOCK_MIN * b {
            return Err(SidesError::Slowed {
                file: current_names,
                drop: 100.0 * (1.0 - c / b),
                current_ghz: c / 1e9,
                baseline_ghz: b / 1e9,
            });
        }
    }
    Ok(Sides {
        base,
        current,
        warnings,
    })
}
