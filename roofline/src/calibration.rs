//! A baseline that carries its runner's noise: N probes of one machine merged into one
//! `machine.json` (`roofline probe --runs N`), keeping every run's ceilings and clock, so that
//! `gate` holds a later single run to the spread measured between these runs on this runner
//! rather than to a table measured on another one.
//!
//! Each merged ceiling is the one of the run whose value is the median of the runs' values for
//! that id (with its own samples, method and conditions: a real measurement, never an average
//! of several); [`Calibration::runs`] keeps every run's value beside it.

use crate::machine::Machine;
use crate::stats::Stats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The runs a calibrated baseline was merged from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Calibration {
    /// Runs asked for (`--runs`).
    pub asked: usize,
    /// The runs kept, in the order they were measured.
    pub runs: Vec<CalibrationRun>,
    /// Runs left out, and why (a busy machine: its ceilings would widen every tolerance).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub left_out: Vec<String>,
}

/// One run of a calibration.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct CalibrationRun {
    /// The run's one-core clock (the median of its samples), Hz, where it was measured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clock_hz_t1: Option<f64>,
    /// Seconds the run took.
    pub duration_s: f64,
    /// Every ceiling's value in this run, by id.
    pub values: BTreeMap<String, f64>,
}

impl Calibration {
    /// Every run's value of `id`, in run order (runs without it skipped).
    pub fn values(&self, id: &str) -> Vec<f64> {
        self.runs
            .iter()
            .filter_map(|r| r.values.get(id).copied())
            .collect()
    }

    /// Every run's one-core clock, where all were measured.
    pub fn clocks(&self) -> Option<Vec<f64>> {
        self.runs.iter().map(|r| r.clock_hz_t1).collect()
    }
}

/// Why runs cannot be merged.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum MergeError {
    #[error("no run to merge")]
    Empty,
    #[error(
        "run {run} measured other ceilings than run 1 ({what}): merge runs of one probe command"
    )]
    OtherIds { run: usize, what: String },
}

fn run_of(m: &Machine) -> CalibrationRun {
    CalibrationRun {
        clock_hz_t1: m
            .provenance
            .cpu
            .measured_clock_hz_t1
            .as_ref()
            .map(|s| s.median),
        duration_s: m.provenance.duration_s,
        values: m
            .ceilings
            .iter()
            .map(|c| (c.id.to_string(), c.value))
            .collect(),
    }
}

/// Merges the runs of one probe command into one calibrated baseline. Runs measured on a busy
/// machine are left out (and named) while a quiet one remains; when every run was busy the
/// last is kept as it is, busy, so that `gate` refuses it with its reason. Each ceiling is the
/// median run's for that id; the provenance is the first kept run's, with its one-core clock
/// the median of the kept runs' clocks and its duration the runs' total.
pub fn merge(runs: Vec<Machine>) -> Result<Machine, MergeError> {
    let asked = runs.len();
    let total: f64 = runs.iter().map(|m| m.provenance.duration_s).sum();
    let busy = |m: &Machine| m.provenance.load.as_ref().is_some_and(|l| l.is_busy());
    let mut left_out = Vec::new();
    let mut kept = Vec::new();
    for (i, m) in runs.iter().enumerate() {
        if busy(m) {
            let why = m.provenance.load.as_ref().map(|l| l.busy.join("; "));
            left_out.push(format!(
                "run {}: measured on a busy machine ({})",
                i + 1,
                why.unwrap_or_default()
            ));
        } else {
            kept.push(m);
        }
    }
    if kept.is_empty() {
        return runs.into_iter().last().ok_or(MergeError::Empty);
    }
    let ids =
        |m: &Machine| -> Vec<String> { m.ceilings.iter().map(|c| c.id.to_string()).collect() };
    let first_ids = ids(kept[0]);
    for (i, m) in runs.iter().enumerate() {
        let these = ids(m);
        if these != first_ids {
            let extra: Vec<&String> = these.iter().filter(|x| !first_ids.contains(x)).collect();
            let gone: Vec<&String> = first_ids.iter().filter(|x| !these.contains(x)).collect();
            return Err(MergeError::OtherIds {
                run: i + 1,
                what: format!("{} more, {} fewer", extra.len(), gone.len()),
            });
        }
    }
    let mut merged = kept[0].clone();
    for c in merged.ceilings.iter_mut() {
        let id = c.id.clone();
        let mut from: Vec<&crate::machine::Ceiling> =
            kept.iter().filter_map(|m| m.ceiling_of(&id)).collect();
        from.sort_by(|a, b| a.value.total_cmp(&b.value));
        // The lower of the two middle runs for an even count: never an invented value.
        *c = from[(from.len() - 1) / 2].clone();
    }
    let calibration = Calibration {
        asked,
        runs: kept.iter().map(|m| run_of(m)).collect(),
        left_out,
    };
    if let Some(clocks) = calibration.clocks() {
        let mut sorted = clocks.clone();
        sorted.sort_by(f64::total_cmp);
        if let Some(mut s) = Stats::from_samples(&clocks) {
            s.median = sorted[(sorted.len() - 1) / 2];
            merged.provenance.cpu.measured_clock_hz_t1 = Some(s);
        }
    }
    merged.provenance.duration_s = total;
    merged.calibration = Some(calibration);
    Ok(merged)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(scale: f64, clock: f64, busy: bool) -> Machine {
        let mut m = crate::placement::tests::machine();
        for c in m.ceilings.iter_mut() {
            c.value *= scale;
        }
        m.provenance.cpu.measured_clock_hz_t1 = Stats::from_samples(&[clock]);
        m.provenance.duration_s = 20.0;
        if busy {
            m.provenance.load = Some(crate::LoadCheck::judge(
                [Some(0.0), Some(0.4), Some(0.0)],
                None,
                None,
                None,
            ));
        }
        m
    }

    /// The merged ceiling is the median run's, every run's value is kept, a busy run is left
    /// out and named, and the clock is the runs' median.
    #[test]
    fn merges_the_median_run_and_keeps_every_run() {
        let runs = vec![
            run(1.0, 3.0e9, false),
            run(0.5, 2.0e9, true),
            run(1.2, 3.2e9, false),
            run(0.9, 2.9e9, false),
        ];
        let base = crate::placement::tests::machine();
        let m = merge(runs).unwrap();
        let cal = m.calibration.as_ref().unwrap();
        assert_eq!(cal.asked, 4);
        assert_eq!(cal.runs.len(), 3);
        assert!(
            cal.left_out[0].starts_with("run 2: measured on a busy machine ("),
            "{:?}",
            cal.left_out
        );
        let id = base.ceilings[0].id.to_string();
        let v0 = base.ceilings[0].value;
        let vals = cal.values(&id);
        assert_eq!(vals.len(), 3);
        assert!((vals[1] / v0 - 1.2).abs() < 1e-12);
        assert!(
            (m.ceilings[0].value / v0 - 1.0).abs() < 1e-12,
            "the median run"
        );
        let clock = m.provenance.cpu.measured_clock_hz_t1.as_ref().unwrap();
        assert_eq!(clock.median, 3.0e9);
        assert_eq!(m.provenance.duration_s, 80.0);
        // It reads back as it was written.
        let back = Machine::from_json(&m.to_json().unwrap()).unwrap();
        assert_eq!(back.calibration, m.calibration);
    }

    #[test]
    fn every_run_busy_keeps_the_last_busy_and_other_ids_are_refused() {
        let m = merge(vec![run(1.0, 3e9, true), run(0.8, 3e9, true)]).unwrap();
        assert!(m.provenance.load.unwrap().is_busy());
        assert!(m.calibration.is_none());
        let mut other = run(1.0, 3e9, false);
        other.ceilings.pop();
        let e = merge(vec![run(1.0, 3e9, false), other]).unwrap_err();
        assert_eq!(
            e,
            MergeError::OtherIds {
                run: 2,
                what: "0 more, 1 fewer".into()
            }
        );
        assert_eq!(merge(vec![]).unwrap_err(), MergeError::Empty);
    }
}
