//! The score report: one self-contained HTML page (inline SVG and CSS, no script, no external
//! asset) with the system under test, the configuration, every run, the scores, the other
//! papers' figures and the workload on the roofline.

use crate::si;
use roofline_model::score::{Score, Summary};

/// Escapes text for HTML.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

fn row(cells: &[String]) -> String {
    format!(
        "<tr>{}</tr>",
        cells
            .iter()
            .map(|c| format!("<td>{c}</td>"))
            .collect::<String>()
    )
}

fn head(cells: &[&str]) -> String {
    format!(
        "<tr>{}</tr>",
        cells
            .iter()
            .map(|c| format!("<th>{}</th>", escape(c)))
            .collect::<String>()
    )
}

fn summary_row(name: &str, unit: &str, s: &Summary, fmt: &dyn Fn(f64) -> String) -> String {
    row(&[
        escape(name),
        format!("{}{}", fmt(s.mean), escape(unit)),
        format!("{:.2}%", 100.0 * s.variation),
        format!("{}{}", fmt(s.min), escape(unit)),
        format!("{}{}", fmt(s.max), escape(unit)),
    ])
}

/// HPC AI500 V3.0's bagging: M, P, Sys_scale, the figures over the runs, and each run's models.
fn bagging(
    h: &mut String,
    score: &Score,
    b: &roofline_model::bagging::BaggingScores,
    flops: &dyn Fn(f64) -> String,
) {
    h.push_str(&format!(
        "<h2>Bagging (HPC AI500 V3.0)</h2>\n<p>{} base models of {} each (Sys_scale {}), each trained on its own bootstrap sample with its own seed, no synchronisation between them. Bagged APC (eq. 4) {}FLOP per iteration ({}); FLOPS (eq. 6) = iterations per epoch × APC / T_epoch, T_epoch set by the slowest model; VFLOPS (eqs. 7–8) with the ensemble's quality. The runs' FLOPS and VFLOPS above are these.</p>\n<table id=\"bagging\">",
        b.models,
        roofline_model::count(b.ranks_per_model, "rank"),
        b.sys_scale,
        si(b.apc_flops),
        match b.analytic_flops_per_sample {
            Some(a) => format!(
                "{}FLOP a sample, the paper's count; roofline's analytic count by V3.0's table 3, {}FLOP, is the placement's",
                si(b.flops_per_sample),
                si(a)
            ),
            None => format!(
                "{}FLOP a sample, roofline's analytic count by V3.0's table 3",
                si(b.flops_per_sample)
            ),
        }
    ));
    h.push_str(&head(&["figure", "mean", "variation", "min", "max"]));
    let q = |v: f64| format!("{v:.4}");
    h.push_str(&summary_row("T_epoch", " s", &b.epoch_seconds, &|v| {
        format!("{v:.2}")
    }));
    h.push_str(&summary_row(
        "ensemble quality",
        "",
        &b.ensemble_quality,
        &q,
    ));
    h.push_str(&summary_row(
        "models' mean quality",
        "",
        &b.member_quality,
        &q,
    ));
    h.push_str(&summary_row(
        "the first model alone: FLOPS",
        "FLOP/s",
        &b.single_model_flops,
        flops,
    ));
    h.push_str(&summary_row(
        "the first model alone: VFLOPS",
        "FLOP/s",
        &b.single_model_vflops,
        flops,
    ));
    h.push_str("</table>\n<table id=\"members\">");
    h.push_str(&head(&[
        "run",
        "model",
        "seed",
        "sample seed",
        "distinct images",
        "quality",
        "s per step",
        "FLOPS alone",
        "VFLOPS alone",
    ]));
    for r in &score.runs {
        let Some(bag) = &r.bagging else { continue };
        for m in &bag.members {
            h.push_str(&row(&[
                r.run.to_string(),
                m.model.to_string(),
                m.seed.to_string(),
                m.sample_seed.to_string(),
                format!("{} of {}", m.distinct_images, m.sample_images),
                format!("{:.4}", m.quality),
                format!("{:.4}", m.step_seconds),
                si(m.flops),
                si(m.vflops),
            ]));
        }
    }
    h.push_str(&format!(
        "</table>\n<p>Ensemble: {}.</p>\n",
        escape(
            &score
                .runs
                .iter()
                .find_map(|r| r.bagging.as_ref().map(|b| b.ensemble_rule.clone()))
                .unwrap_or_default()
        )
    ));
}

/// The report page. `roofline_svg`: the machine's roofline with the workload placed, when a
/// machine.json was given.
pub fn html(score: &Score, roofline_svg: Option<&str>) -> String {
    let mut h = String::new();
    let first = score.headline();
    h.push_str("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">");
    h.push_str(&format!(
        "<title>roofline score: {}</title>",
        escape(&score.workload)
    ));
    h.push_str(
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px;color:#222}\
         table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #bbb;padding:3px 8px;text-align:left}\
         th{background:#eee}.warn{background:#fff3cd;border:1px solid #e0c060;padding:8px;font-weight:bold}\
         .ok{background:#e6f4ea;border:1px solid #8c8;padding:8px;font-weight:bold}\
         #roofline svg{max-width:100%;height:auto}</style></head><body>\n",
    );
    h.push_str(&format!(
        "<p id=\"verdict\" class=\"{}\">{}</p>\n",
        if score.comparable && score.valid {
            "ok"
        } else {
            "warn"
        },
        escape(&first)
    ));
    h.push_str(&format!(
        "<h1>{} — {} run(s), target {} {} (VFLOPS exponent {})</h1>\n",
        escape(&score.workload),
        score.runs.len(),
        escape(&score.target.metric),
        score.target.value,
        score.target.exponent
    ));
    for w in &score.warnings {
        h.push_str(&format!("<p class=\"warn\">{}</p>\n", escape(w)));
    }
    if !score.not_comparable.is_empty() {
        h.push_str("<h2>Where this score departs from the rules</h2>\n<ul id=\"deviations\">");
        for d in &score.not_comparable {
            h.push_str(&format!("<li>{}</li>", escape(d)));
        }
        h.push_str("</ul>\n");
    }
    if !score.rules.is_empty() {
        h.push_str("<h2>The rules it was made by</h2>\n<ul id=\"rules\">");
        for r in &score.rules {
            h.push_str(&format!("<li>{}</li>", escape(r)));
        }
        h.push_str("</ul>\n");
    }
    let s = &score.scores;
    h.push_str("<h2>Scores (HPC AI500 V2.0 section 5.3)</h2>\n<p>Mean of the runs without the two whose VFLOPS are the highest and the lowest (whole runs: every figure over the same runs); variation = standard deviation / mean over every run.</p>\n<table id=\"scores\">");
    h.push_str(&head(&["figure", "mean", "variation", "min", "max"]));
    let flops = |v: f64| si(v);
    let secs = |v: f64| format!("{v:.2} ");
    let frac = |v: f64| format!("{:.4}", v);
    match &s.time_to_quality_s {
        Some(t) => h.push_str(&summary_row("time to quality", "s", t, &secs)),
        None => h.push_str(&row(&[
            "time to quality".into(),
            format!(
                "not reached ({} of {} runs reached {} {})",
                s.runs_reached,
                score.runs.len(),
                escape(&score.target.metric),
                score.target.value
            ),
            String::new(),
            String::new(),
            String::new(),
        ])),
    }
    h.push_str(&summary_row(&score.target.metric, "", &s.quality, &frac));
    h.push_str(&summary_row("FLOPS", "FLOP/s", &s.flops, &flops));
    h.push_str(&summary_row("VFLOPS", "FLOP/s", &s.vflops, &flops));
    for (name, per_watt) in [
        ("FLOPS per watt", &s.flops_per_watt),
        ("VFLOPS per watt", &s.vflops_per_watt),
    ] {
        match per_watt {
            Some(w) => h.push_str(&summary_row(name, "FLOP/s/W", w, &flops)),
            None => h.push_str(&row(&[
                name.into(),
                format!("not reported: {}", escape(&score.energy_note)),
                String::new(),
                String::new(),
                String::new(),
            ])),
        }
    }
    h.push_str("</table>\n<h2>The other papers' figures</h2>\n<table id=\"other\">");
    h.push_str(&head(&["figure", "mean", "variation", "min", "max"]));
    h.push_str(&summary_row(
        "AIPerf regulated score −ln(Error) × FLOPS",
        "FLOP/s",
        &s.aiperf_regulated,
        &flops,
    ));
    h.push_str(&row(&[
        "AIPerf FLOPS time series, maximum".into(),
        format!("{}FLOP/s", si(s.aiperf_flops_max)),
        String::new(),
        String::new(),
        String::new(),
    ]));
    h.push_str(&summary_row(
        "HPC AI500 V3.0 analytic FLOPS per epoch",
        "FLOP/s",
        &s.v3_flops_per_epoch,
        &flops,
    ));
    h.push_str("</table>\n<h2>Runs</h2>\n<table id=\"runs\">");
    h.push_str(&head(&[
        "run",
        "seed",
        "time to quality [s]",
        "reached",
        "quality",
        "Top-5",
        "steps",
        "images",
        "FLOPS",
        "operations an image",
        "FLOPS, analytic count",
        "VFLOPS",
        "energy [J]",
        "power [W]",
        "AIPerf max FLOPS",
    ]));
    for r in &score.runs {
        h.push_str(&row(&[
            r.run.to_string(),
            r.seed.to_string(),
            if r.reached_target || r.fixed_epochs {
                format!("{:.2}", r.time_to_quality_s)
            } else {
                "not reached".into()
            },
            if r.reached_target { "yes" } else { "no" }.into(),
            format!("{:.4}", r.quality),
            r.top5.map(|v| format!("{v:.4}")).unwrap_or_default(),
            r.steps.to_string(),
            r.images.to_string(),
            si(r.flops),
            format!("{}FLOP ({})", si(r.ops_per_image), escape(&r.ops_count)),
            r.analytic_flops.map(si).unwrap_or("—".into()),
            si(r.vflops),
            r.energy_j.map(|v| format!("{v:.1}")).unwrap_or("—".into()),
            r.average_watts
                .map(|v| format!("{v:.1}"))
                .unwrap_or("—".into()),
            si(r.flops_series_max),
        ]));
    }
    h.push_str("</table>\n");
    if let Some(b) = &s.bagging {
        bagging(&mut h, score, b, &flops);
    }
    h.push_str("<h2>The workload on the roofline</h2>\n<div id=\"roofline\">");
    match (roofline_svg, &score.placement) {
        (Some(svg), Some(p)) => {
            h.push_str(svg.trim_start_matches(|c| c != '<'));
            h.push_str(&format!(
                "<p>{}: {}FLOP/s at OI {:.2} FLOP/B, {} under {} (attainable {}FLOP/s).</p>",
                escape(&p.point.label),
                si(p.point.achieved_flops),
                p.point.oi.analytic,
                p.point.bound.kind.as_str(),
                escape(&p.point.bound.ceiling),
                si(p.point.bound.attainable)
            ));
            for a in &p.advice {
                h.push_str(&format!(
                    "<p>advice ({}): {}</p>",
                    escape(&a.topic),
                    escape(&a.text)
                ));
            }
        }
        _ => h.push_str(
            "<p>No machine.json was given (<code>roofline score --machine machine.json</code>): run <code>roofline probe</code> to place the workload on the machine's roofline.</p>",
        ),
    }
    h.push_str("</div>\n<h2>System under test</h2>\n<table id=\"system\">");
    let sys = &score.system;
    let items: Vec<(&str, String)> = vec![
        (
            "CPU",
            format!(
                "{} ({} socket(s), {} cores, {} logical CPUs)",
                sys.cpu, sys.sockets, sys.cores, sys.logical_cpus
            ),
        ),
        ("memory", format!("{}B", si(sys.memory_bytes as f64))),
        (
            "accelerators",
            if sys.accelerators.is_empty() {
                "none".into()
            } else {
                sys.accelerators.join("; ")
            },
        ),
        ("intra-node links", sys.intra_node_links.join("; ")),
        ("inter-node links", sys.inter_node_links.join("; ")),
        ("ranks / nodes", format!("{} / {}", sys.ranks, sys.nodes)),
        ("OS", format!("{} (kernel {})", sys.os, sys.kernel)),
        ("driver", sys.driver.clone().unwrap_or("none".into())),
        ("libraries", sys.libraries.join(", ")),
        ("compiler", sys.compiler.clone()),
        ("host", score.provenance.host.clone()),
        ("measured", score.provenance.time_utc.clone()),
        (
            "tool",
            format!(
                "{}{}",
                score.provenance.tool,
                score
                    .provenance
                    .git_revision
                    .as_ref()
                    .map(|g| format!(" ({g})"))
                    .unwrap_or_default()
            ),
        ),
        ("command line", score.provenance.command_line.join(" ")),
    ];
    for (k, v) in items {
        h.push_str(&row(&[escape(k), escape(&v)]));
    }
    h.push_str("</table>\n<h2>Configuration</h2>\n<table id=\"configuration\">");
    h.push_str(&row(&[
        "benchmark level".into(),
        escape(score.level.name()),
    ]));
    for (k, v) in &score.configuration {
        h.push_str(&row(&[escape(k), escape(&crate::html::config_value(v))]));
    }
    h.push_str(&format!(
        "</table>\n<p>Energy: {}</p>\n</body></html>\n",
        escape(&score.energy_note)
    ));
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping() {
        assert_eq!(escape("a<b & \"c\""), "a&lt;b &amp; &quot;c&quot;");
    }
}
