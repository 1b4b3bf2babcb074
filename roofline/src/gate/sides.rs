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
    #[error("{baseline} and {other} were measured on different machines: {why}. A change between them is the hardware's, not the code's; gate a baseline from this kind of machine, or pass --allow-other-machine to compare anyway")]
    OtherMachine {
        baseline: String,
        other: String,
        why: String,
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
/// a warning.
pub fn sides(
    baseline: Vec<Named>,
    current: Vec<Named>,
    allow_other_machine: bool,
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
        let other = other_machine(&first.input, &n.input);
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
    let inputs = |v: Vec<Named>| v.into_iter().map(|n| n.input).collect();
    match (pool(inputs(baseline)), pool(inputs(current))) {
        (Some(base), Some(current)) => Ok(Sides {
            base,
            current,
            warnings,
        }),
        _ => Err(SidesError::Empty),
    }
}
