//! What a file may hold: every document roofline reads (machine.json, placement.json,
//! score.json, sweep.json) is checked after parsing for values no probe or run could have
//! written — non-finite numbers, zero or negative rates and times, a value outside its own
//! samples' range, statistics out of order, a unit that does not fit the ceiling's kind — and
//! refused naming the id and the field (the reader adds the file).

use crate::machine::{Ceiling, CeilingKind, Machine};
use crate::placement::{Placement, Point};
use crate::score::{Score, Summary};
use crate::stats::Stats;
use crate::sweep::Sweep;

/// A value that cannot be.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[error("{id}: {field} {why}")]
pub struct Invalid {
    /// The ceiling, point, run or figure it belongs to.
    pub id: String,
    pub field: String,
    pub why: String,
}

/// A document checked after parsing.
pub trait Validate {
    fn validate(&self) -> Result<(), Invalid>;
}

fn bad(id: &str, field: &str, why: String) -> Invalid {
    Invalid {
        id: id.to_string(),
        field: field.to_string(),
        why,
    }
}

/// Finite and > 0.
pub fn positive(id: &str, field: &str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(bad(
            id,
            field,
            format!("is {v}: it must be a finite number above 0"),
        ))
    }
}

/// Finite and ≥ 0.
pub fn non_negative(id: &str, field: &str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(bad(
            id,
            field,
            format!("is {v}: it must be a finite number, 0 or above"),
        ))
    }
}

fn fraction(id: &str, field: &str, v: f64) -> Result<(), Invalid> {
    if v.is_finite() && (0.0..=1.0).contains(&v) {
        Ok(())
    } else {
        Err(bad(id, field, format!("is {v}: it must lie in [0, 1]")))
    }
}

/// `v` inside [lo, hi] up to rounding.
fn inside(v: f64, lo: f64, hi: f64) -> bool {
    let slack = 1e-9 * lo.abs().max(hi.abs()).max(1e-300);
    v >= lo - slack && v <= hi + slack
}

/// Statistics in order: finite, min ≤ median, mean ≤ max, a spread of 0 or more, every sample
/// inside [min, max]; with `positive`, every sample above 0 (rates, times).
pub fn stats(id: &str, field: &str, s: &Stats, positive_values: bool) -> Result<(), Invalid> {
    let f = |name: &str| format!("{field}.{name}");
    if s.samples == 0 {
        return Err(bad(id, &f("samples"), "is 0: statistics of nothing".into()));
    }
    for (name, v) in [
        ("min", s.min),
        ("median", s.median),
        ("max", s.max),
        ("mean", s.mean),
    ] {
        if positive_values {
            positive(id, &f(name), v)?;
        } else if !v.is_finite() {
            return Err(bad(id, &f(name), format!("is {v}: not a finite number")));
        }
    }
    non_negative(id, &f("cv"), s.cv)?;
    if !(inside(s.median, s.min, s.max) && inside(s.mean, s.min, s.max)) {
        return Err(bad(
            id,
            field,
            format!(
                "is out of order: min {} median {} mean {} max {}",
                s.min, s.median, s.mean, s.max
            ),
        ));
    }
    if let Some(v) = s.values.iter().find(|v| !inside(**v, s.min, s.max)) {
        return Err(bad(
            id,
            &f("values"),
            format!("holds {v}, outside [min {}, max {}]", s.min, s.max),
        ));
    }
    Ok(())
}

fn ceiling(c: &Ceiling) -> Result<(), Invalid> {
    let id = &c.id.to_string()[..];
    positive(id, "value", c.value)?;
    stats(id, "stats", &c.stats, true)?;
    // An aggregate (`agg/…`) is the sum over nodes of its samples; any other ceiling is one of
    // its own samples' values or their median.
    let (lo, hi) = if c.id.is_aggregate() {
        let n = c.stats.samples as f64;
        (c.stats.min * n, c.stats.max * n)
    } else {
        (c.stats.min, c.stats.max)
    };
    if !inside(c.value, lo, hi) {
        return Err(bad(
            id,
            "value",
            format!("{} lies outside its samples' range [{lo}, {hi}]", c.value),
        ));
    }
    let units: &[&str] = match c.kind {
        CeilingKind::Compute => &["FLOP/s", "OP/s"],
        CeilingKind::Memory => &["B/s"],
        // Communication: bandwidth, or a latency in seconds (`net/p2p/…/latency`).
        CeilingKind::Comm => &["B/s", "s"],
        // Storage: bytes, or files (small-file metadata rates) per second.
        CeilingKind::Io => &["B/s", "file/s"],
    };
    if !units.contains(&c.unit.as_str()) {
        return Err(bad(
            id,
            "unit",
            format!(
                "is {:?}: a {:?} ceiling is measured in {}",
                c.unit,
                c.kind,
                units.join(" or ")
            ),
        ));
    }
    if let Some(p) = &c.theoretical_peak {
        positive(id, "theoretical_peak.value", p.value)?;
    }
    if let Some(why) = c
        .conditions
        .as_ref()
        .and_then(|k| k.inconsistency(c.stats.samples))
    {
        return Err(bad(id, "conditions", why));
    }
    Ok(())
}

impl Validate for Machine {
    fn validate(&self) -> Result<(), Invalid> {
        for c in self
            .ceilings
            .iter()
            .chain(self.nodes.iter().flat_map(|n| n.ceilings.iter()))
        {
            ceiling(c)?;
        }
        for cv in &self.curves {
            for (i, p) in cv.points.iter().enumerate() {
                let field = |f: &str| format!("points[{i}].{f}");
                positive(&cv.id, &field("x"), p.x)?;
                positive(&cv.id, &field("value"), p.value)?;
                stats(&cv.id, &field("stats"), &p.stats, true)?;
            }
        }
        if let Some(f) = &self.fleet {
            fleet(f)?;
        }
        Ok(())
    }
}

/// The fleet: medians that are rates or times, outliers of screened nodes, links between
/// nodes of the matrix with samples that are rates and times.
fn fleet(f: &crate::fleet::Fleet) -> Result<(), Invalid> {
    non_negative("fleet", "margin", f.margin)?;
    for c in &f.ceilings {
        positive(&format!("fleet {}", c.id), "median", c.median)?;
    }
    for o in &f.outliers {
        if o.node >= f.nodes {
            return Err(bad(
                &format!("fleet outlier {}", o.id),
                "node",
                format!("is {}: the fleet has {} nodes", o.node, f.nodes),
            ));
        }
        positive(&format!("fleet outlier {}", o.id), "value", o.value)?;
    }
    for (m, what) in [(&f.links, "link"), (&f.gpu_links, "GPU link")] {
        let Some(m) = m else { continue };
        for l in &m.links {
            let id = format!("fleet {what} {}-{}", l.a, l.b);
            if l.a >= l.b || l.b >= m.hosts.len() {
                return Err(bad(
                    &id,
                    "a, b",
                    format!("name nodes {} and {} of {}", l.a, l.b, m.hosts.len()),
                ));
            }
            stats(&id, "latency", &l.latency, true)?;
            stats(&id, "bandwidth_ab", &l.bandwidth_ab, true)?;
            stats(&id, "bandwidth_ba", &l.bandwidth_ba, true)?;
        }
    }
    Ok(())
}

fn point(p: &Point, main: bool) -> Result<(), Invalid> {
    let id = p.label.as_str();
    let need = |f: &str, v: f64| {
        if main {
            positive(id, f, v)
        } else {
            non_negative(id, f, v)
        }
    };
    need("flops_per_step", p.flops_per_step)?;
    need("achieved_flops", p.achieved_flops)?;
    stats(id, "seconds_per_step", &p.seconds_per_step, true)?;
    stats(id, "achieved", &p.achieved, false)?;
    non_negative(id, "achieved.min", p.achieved.min)?;
    non_negative(id, "footprint_bytes", p.footprint_bytes)?;
    need("oi.analytic", p.oi.analytic)?;
    non_negative(id, "oi.analytic_min_bytes", p.oi.analytic_min_bytes)?;
    if let Some(m) = p.oi.measured {
        positive(id, "oi.measured", m)?;
    }
    if let Some(s) = p.share_of_step {
        fraction(id, "share_of_step", s)?;
    }
    if let Some(c) = &p.coi {
        non_negative(id, "coi.intra_node_bytes", c.intra_node_bytes)?;
        non_negative(id, "coi.inter_node_bytes", c.inter_node_bytes)?;
        for (f, v) in [
            ("coi.intra_node", c.intra_node),
            ("coi.inter_node", c.inter_node),
        ] {
            if let Some(v) = v {
                positive(id, f, v)?;
            }
        }
    }
    need("bound.attainable", p.bound.attainable)?;
    non_negative(id, "bound.headroom", p.bound.headroom)?;
    for r in &p.bound.roofs {
        positive(&r.ceiling, "value", r.value)?;
        non_negative(&r.ceiling, "allows", r.allows)?;
    }
    Ok(())
}

impl Validate for Placement {
    fn validate(&self) -> Result<(), Invalid> {
        point(&self.point, true)?;
        for l in &self.layers {
            point(l, false)?;
        }
        let t = &self.time;
        for (f, v) in [
            ("time.total_s", t.total_s),
            ("time.compute_s", t.compute_s),
            ("time.communication_s", t.communication_s),
            ("time.data_s", t.data_s),
            ("time.idle_s", t.idle_s),
        ] {
            non_negative("placement", f, v)?;
        }
        let e = &self.energy;
        for (f, v) in [
            ("energy.joules_per_step", e.joules_per_step),
            ("energy.average_watts", e.average_watts),
            ("energy.flops_per_watt", e.flops_per_watt),
        ] {
            if let Some(v) = v {
                non_negative("placement", f, v)?;
            }
        }
        Ok(())
    }
}

fn summary(id: &str, s: &Summary) -> Result<(), Invalid> {
    for (f, v) in [("mean", s.mean), ("min", s.min), ("max", s.max)] {
        non_negative(id, f, v)?;
    }
    non_negative(id, "variation", s.variation)?;
    if s.min > s.max {
        return Err(bad(id, "min", format!("{} is above max {}", s.min, s.max)));
    }
    Ok(())
}

/// Every run of a score (or of its journal) checked: qualities are fractions, figures not
/// negative, a bagged run's members and scale consistent.
fn runs(runs: &[crate::score::Run]) -> Result<(), Invalid> {
    for r in runs {
        let id = format!("run {}", r.run);
        fraction(&id, "quality", r.quality)?;
        if let Some(t5) = r.top5 {
            fraction(&id, "top5", t5)?;
        }
        for (f, v) in [
            ("time_to_quality_s", r.time_to_quality_s),
            ("train_seconds", r.train_seconds),
            ("flops", r.flops),
            ("vflops", r.vflops),
            ("flops_series_max", r.flops_series_max),
            ("aiperf_regulated", r.aiperf_regulated),
            ("v3_flops_per_epoch", r.v3_flops_per_epoch),
        ] {
            non_negative(&id, f, v)?;
        }
        if let Some(v) = r
            .flops_series
            .iter()
            .find(|v| !(v.is_finite() && **v >= 0.0))
        {
            return Err(bad(&id, "flops_series", format!("holds {v}")));
        }
        for (f, v) in [
            ("energy_j", r.energy_j),
            ("average_watts", r.average_watts),
            ("vflops_per_watt", r.vflops_per_watt),
        ] {
            if let Some(v) = v {
                non_negative(&id, f, v)?;
            }
        }
        if let Some(b) = &r.bagging {
            for (f, v) in [
                ("bagging.apc_flops", b.apc_flops),
                ("bagging.epoch_seconds", b.epoch_seconds),
                ("bagging.flops", b.flops),
                ("bagging.vflops", b.vflops),
            ] {
                non_negative(&id, f, v)?;
            }
            fraction(&id, "bagging.ensemble_quality", b.ensemble_quality)?;
            if b.members.len() != b.models || b.sys_scale != b.models * b.ranks_per_model {
                return Err(bad(
                    &id,
                    "bagging",
                    format!(
                        "has {} members for {} models and Sys_scale {} for {} × {}",
                        b.members.len(),
                        b.models,
                        b.sys_scale,
                        b.models,
                        b.ranks_per_model
                    ),
                ));
            }
        }
    }
    Ok(())
}

impl Validate for crate::score::Journal {
    fn validate(&self) -> Result<(), Invalid> {
        runs(&self.runs)
    }
}

impl Validate for Score {
    fn validate(&self) -> Result<(), Invalid> {
        let t = &self.target;
        if !(t.value > 0.0 && t.value <= 1.0) {
            return Err(bad(
                "target",
                "value",
                format!("is {}: a quality lies in (0, 1]", t.value),
            ));
        }
        runs(&self.runs)?;
        let s = &self.scores;
        if let Some(t) = &s.time_to_quality_s {
            summary("scores.time_to_quality_s", t)?;
        }
        for (id, x) in [
            ("scores.quality", &s.quality),
            ("scores.flops", &s.flops),
            ("scores.vflops", &s.vflops),
            ("scores.aiperf_regulated", &s.aiperf_regulated),
            ("scores.v3_flops_per_epoch", &s.v3_flops_per_epoch),
        ] {
            summary(id, x)?;
        }
        if let Some(p) = &self.placement {
            p.validate()?;
        }
        Ok(())
    }
}

impl Validate for Sweep {
    fn validate(&self) -> Result<(), Invalid> {
        for p in &self.points {
            let id = format!("point {}", p.index);
            positive(&id, "step_seconds", p.step_seconds)?;
            for (f, v) in [
                ("flops_per_sample", p.flops_per_sample),
                ("problem_flops", p.problem_flops),
                ("flops_per_step", p.flops_per_step),
                ("achieved_flops", p.achieved_flops),
                ("per_process_flops", p.per_process_flops),
                ("peak_flops", p.peak_flops),
                ("fraction_of_peak", p.fraction_of_peak),
                ("analytic_flop_per_byte", p.analytic_flop_per_byte),
                ("attainable_flops", p.attainable_flops),
            ] {
                non_negative(&id, f, v)?;
            }
            fraction(&id, "io_share", p.io_share)?;
            if p.problem.processes == 0 {
                return Err(bad(&id, "problem.processes", "is 0".into()));
            }
        }
        for s in &self.scaling {
            for p in &s.points {
                positive(&s.problem, "step_seconds", p.step_seconds)?;
                non_negative(&s.problem, "speedup", p.speedup)?;
                non_negative(&s.problem, "efficiency", p.efficiency)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_out_of_order_or_outside_are_named() {
        let s = Stats::from_samples(&[1.0, 2.0, 3.0]).unwrap();
        assert!(stats("c", "stats", &s, true).is_ok());
        let mut t = s.clone();
        t.median = 5.0;
        let e = stats("c", "stats", &t, true).unwrap_err();
        assert!(e.to_string().contains("out of order"), "{e}");
        let mut t = s.clone();
        t.values.push(9.0);
        assert_eq!(
            stats("c", "stats", &t, true).unwrap_err().field,
            "stats.values"
        );
        let mut t = s.clone();
        t.min = -1.0;
        assert_eq!(
            stats("c", "stats", &t, true).unwrap_err().field,
            "stats.min"
        );
        t.min = f64::NAN;
        assert!(stats("c", "stats", &t, false).is_err());
        assert!(positive("c", "value", 0.0).is_err() && positive("c", "value", -5.0).is_err());
        assert!(
            non_negative("c", "v", 0.0).is_ok() && non_negative("c", "v", f64::INFINITY).is_err()
        );
    }
}
