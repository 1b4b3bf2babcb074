//! The AutoML report: one self-contained HTML page (inline SVG and CSS, no script) with the
//! verdict, the score, AIPerf's three time series (FLOPS, error, regulated score), the table of
//! time points, the tree of candidates (each under its parent, with its morphisms) and every
//! candidate's figures.

use crate::report::escape;
use crate::si;
use roofline_model::automl::{Automl, Candidate, Outcome};

/// A chart's title, how its values read, and its `(seconds, value)` points.
type Panel<'a> = (&'a str, &'a dyn Fn(f64) -> String, Vec<(f64, f64)>);

/// The panels side by side in one inline SVG (one coordinate space, so that the figure check
/// sees them where the browser draws them).
fn charts(id: &str, panels: &[Panel<'_>]) -> String {
    let (pw, h, l, b) = (460.0, 240.0, 88.0, 42.0);
    let w = pw * panels.len() as f64;
    let mut s = format!(
        "<svg id=\"{id}\" xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" viewBox=\"0 0 {w} {h}\" font-size=\"12\" font-family=\"sans-serif\">"
    );
    for (k, (title, fmt, pts)) in panels.iter().enumerate() {
        let xmax = pts.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-9);
        let ymax = pts.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-12);
        let x = |v: f64| l + (pw - l - 24.0) * v / xmax;
        let y = |v: f64| (h - b) - (h - b - 30.0) * v / ymax;
        s.push_str(&format!(
            "<g transform=\"translate({},0)\"><text x=\"{l}\" y=\"16\" font-weight=\"bold\">{}</text>\
             <line x1=\"{l}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#444\"/><line x1=\"{l}\" y1=\"30\" x2=\"{l}\" y2=\"{}\" stroke=\"#444\"/>",
            pw * k as f64,
            escape(title),
            h - b,
            pw - 24.0,
            h - b,
            h - b
        ));
        for t in 0..=4 {
            let v = ymax * t as f64 / 4.0;
            s.push_str(&format!(
                "<text x=\"{}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
                l - 6.0,
                y(v) + 4.0,
                escape(&fmt(v))
            ));
        }
        let (step, digits) = time_step(xmax);
        let mut at = 0.0;
        while at <= xmax * (1.0 + 1e-9) {
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{}\" text-anchor=\"middle\">{at:.digits$} s</text>",
                x(at),
                h - b + 18.0,
            ));
            at += step;
        }
        let path: Vec<String> = pts
            .iter()
            .map(|p| format!("{:.1},{:.1}", x(p.0), y(p.1)))
            .collect();
        s.push_str(&format!(
            "<polyline fill=\"none\" stroke=\"#1565c0\" stroke-width=\"1.5\" points=\"{}\"/>",
            path.join(" ")
        ));
        for p in pts {
            s.push_str(&format!(
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.5\" fill=\"#1565c0\"><title>{:.0} s: {}</title></circle>",
                x(p.0),
                y(p.1),
                p.0,
                escape(&fmt(p.1))
            ));
        }
        s.push_str(&format!(
            "<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">time since the start</text></g>",
            (l + pw - 24.0) / 2.0,
            h - 4.0
        ));
    }
    s.push_str("</svg>");
    s
}

/// FLOP/s with an SI prefix, 0 as 0.
fn rate(v: f64) -> String {
    if v == 0.0 {
        "0".into()
    } else {
        format!("{}FLOP/s", si(v))
    }
}

fn outcome(c: &Candidate) -> String {
    match &c.outcome {
        Outcome::Failed { why } => format!("failed: {why}"),
        Outcome::EarlyStopped => "early stopped".into(),
        o => format!("{o:?}").to_lowercase(),
    }
}

fn top1(c: &Candidate) -> String {
    c.best_top1().map_or("—".into(), |a| format!("{:.3}", a))
}

/// The candidates under `parent`, as nested lists.
fn tree(h: &mut String, doc: &Automl, parent: Option<usize>, best: Option<usize>) {
    let kids: Vec<&Candidate> = doc
        .candidates
        .iter()
        .filter(|c| c.parent == parent)
        .collect();
    if kids.is_empty() {
        return;
    }
    h.push_str("<ul>");
    for c in kids {
        let how = if c.morphisms.is_empty() {
            if parent.is_none() && c.id == 0 {
                "the starting network".to_string()
            } else {
                "from its seed".to_string()
            }
        } else {
            c.morphisms
                .iter()
                .map(|m| {
                    m.get("kind")
                        .and_then(|k| k.as_str())
                        .unwrap_or("?")
                        .to_string()
                })
                .collect::<Vec<_>>()
                .join(" + ")
        };
        let how = match c.pretrained {
            Some(f) => format!(
                "{how}, {} of {} layers from the pretrained file",
                f.layers, f.of
            ),
            None => how,
        };
        h.push_str(&format!(
            "<li{}>#{} {} — top-1 {}, {} parameters, {}FLOP per image, batch {}, kernel {}, {}, {}",
            if Some(c.id) == best {
                " class=\"best\""
            } else {
                ""
            },
            c.id,
            escape(&how),
            top1(c),
            si(c.parameters),
            si(c.ops_per_image.total),
            c.batch,
            c.kernel,
            epochs(c),
            escape(&outcome(c))
        ));
        tree(h, doc, Some(c.id), best);
        h.push_str("</li>");
    }
    h.push_str("</ul>");
}

/// A candidate's epochs, and its second training's (the per-trial TPE's) when it had one.
fn epochs(c: &roofline_model::automl::Candidate) -> String {
    let n = |pass| c.epochs.iter().filter(|e| e.pass == pass).count();
    match &c.retrain {
        None => format!("{} epoch(s)", c.epochs.len()),
        Some(r) => format!(
            "{} epoch(s), then {} with the TPE draw (batch {}, kernel {}, dropout {:.3}), {}",
            n(0),
            n(1),
            r.batch,
            r.kernel,
            r.dropout,
            if r.won { "kept" } else { "not kept" }
        ),
    }
}

/// A round step for time ticks over 0..`max` seconds (1, 2 or 5 × a power of ten, three to
/// six ticks) and the decimals that show it, so that no two ticks read alike.
fn time_step(max: f64) -> (f64, usize) {
    let raw = (max / 4.0).max(1e-6);
    let p = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| max / s <= 5.0)
        .unwrap_or(10.0 * p);
    let digits = if step >= 1.0 {
        0
    } else {
        (-step.log10()).ceil() as usize
    };
    (step, digits)
}

/// The report for `doc`.
pub fn html(doc: &Automl) -> String {
    let mut h = String::from("<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>roofline automl</title>");
    h.push_str(
        "<style>body{font-family:sans-serif;margin:2em;max-width:1200px;color:#222}\
         table{border-collapse:collapse;margin:0.5em 0 1.5em}td,th{border:1px solid #bbb;padding:3px 8px;text-align:left}\
         th{background:#eee}.warn{background:#fff3cd;border:1px solid #e0c060;padding:8px;font-weight:bold}\
         .ok{background:#e6f4ea;border:1px solid #8c8;padding:8px;font-weight:bold}\
         .charts{display:flex;flex-wrap:wrap;gap:12px}li.best{font-weight:bold}ul{margin:2px 0}</style></head><body>\n",
    );
    h.push_str(&format!(
        "<p id=\"verdict\" class=\"{}\">{}</p>\n",
        if doc.valid { "ok" } else { "warn" },
        escape(&doc.headline())
    ));
    let s = &doc.score;
    h.push_str("<h1>AIPerf AutoML benchmark</h1>\n<h2>Score</h2>\n<table id=\"score\">");
    for (k, v) in [
        (
            "score: highest FLOPS of the series",
            format!("{}FLOP/s", si(s.flops)),
        ),
        (
            "regulated score (−ln(error) × FLOPS), highest",
            format!("{}FLOP/s", si(s.regulated)),
        ),
        ("error (1 − best top-1)", format!("{:.4}", s.error)),
        (
            "best candidate",
            s.best_candidate.map_or("—".into(), |b| format!("#{b}")),
        ),
        ("elapsed", format!("{:.0} s", s.elapsed_s)),
        (
            "candidates per minute",
            format!("{:.2}", s.candidates_per_minute),
        ),
        (
            "workers' share of the run in training",
            format!("{:.1} %", 100.0 * s.training_share),
        ),
        (
            "the workers' search (all together)",
            format!("{:.1} s", s.search_seconds),
        ),
        (
            "the master busy (recording, hand-outs, the history)",
            format!(
                "{:.1} s, {:.2} % of the run",
                s.master_seconds,
                if s.elapsed_s > 0.0 {
                    100.0 * s.master_seconds / s.elapsed_s
                } else {
                    0.0
                }
            ),
        ),
    ] {
        h.push_str(&format!(
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(k),
            escape(&v)
        ));
    }
    h.push_str("</table>\n");
    let series = |f: &dyn Fn(&roofline_model::automl::Sample) -> f64| -> Vec<(f64, f64)> {
        doc.series.iter().map(|p| (p.at_s, f(p))).collect()
    };
    h.push_str("<h2>Over time</h2>\n<div class=\"charts\">");
    let fraction = |v: f64| format!("{v:.3}");
    h.push_str(&charts(
        "over-time",
        &[
            ("FLOPS", &rate, series(&|p| p.flops)),
            ("error (1 − best top-1)", &fraction, series(&|p| p.error)),
            ("regulated score", &rate, series(&|p| p.regulated)),
        ],
    ));
    h.push_str("</div>\n<table id=\"series\">");
    h.push_str(
        "<tr><th>time</th><th>operations</th><th>FLOPS</th><th>error</th><th>regulated</th></tr>",
    );
    for p in &doc.series {
        h.push_str(&format!(
            "<tr><td>{:.0} s</td><td>{}</td><td>{}FLOP/s</td><td>{:.4}</td><td>{}FLOP/s</td></tr>",
            p.at_s,
            si(p.ops),
            si(p.flops),
            p.error,
            si(p.regulated)
        ));
    }
    h.push_str("</table>\n<h2>The candidates' tree</h2>\n<div id=\"tree\">");
    tree(&mut h, doc, None, s.best_candidate);
    h.push_str("</div>\n<h2>Workers</h2>\n<table id=\"workers\"><tr><th>worker</th><th>trials</th><th>busy</th><th>alive at the end</th></tr>");
    for w in &doc.workers {
        h.push_str(&format!(
            "<tr><td>{}</td><td>{}</td><td>{:.1} s</td><td>{}</td></tr>",
            w.id,
            w.trials,
            w.train_seconds,
            if w.alive { "yes" } else { "no" }
        ));
    }
    h.push_str("</table>\n");
    if !doc.valid {
        h.push_str("<h2>Why the run is not valid by AIPerf's rules</h2><ul>");
        for w in &doc.invalid_because {
            h.push_str(&format!("<li>{}</li>", escape(w)));
        }
        h.push_str("</ul>\n");
    }
    if !doc.deviations.is_empty() {
        h.push_str(
            "<h2>Where the run departs from AIPerf's reference code</h2><ul id=\"deviations\">",
        );
        for d in &doc.deviations {
            h.push_str(&format!("<li>{}</li>", escape(d)));
        }
        h.push_str("</ul>\n");
    }
    h.push_str("<h2>Configuration</h2>\n<table id=\"configuration\">");
    for (k, v) in &doc.configuration {
        h.push_str(&format!(
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(&crate::html::config_key(k)),
            escape(&crate::html::config_value(v))
        ));
    }
    h.push_str(&format!(
        "</table>\n<p>{} · {} · {}</p>\n</body></html>\n",
        escape(&doc.provenance.tool),
        escape(&doc.provenance.host),
        escape(&doc.provenance.time_utc)
    ));
    h
}

#[cfg(test)]
mod tests {

    /// Time ticks are round and distinct, whatever the run's length (a 2.4 s run read
    /// "0 s, 0 s, 1 s, 1 s, 2 s").
    #[test]
    fn time_ticks_are_round_and_distinct() {
        for (max, step, digits) in [
            (2.4, 0.5, 1),
            (180.0, 50.0, 0),
            (3600.0, 1000.0, 0),
            (0.3, 0.1, 1),
        ] {
            assert_eq!(time_step(max), (step, digits), "{max}");
            let labels: Vec<String> = (0..=(max / step) as usize)
                .map(|k| format!("{:.*}", digits, k as f64 * step))
                .collect();
            let mut unique = labels.clone();
            unique.dedup();
            assert_eq!(unique, labels);
        }
    }
    use super::*;
    use roofline_model::automl::{sample, AutomlScore, Epoch, Ops};

    fn candidate(id: usize, parent: Option<usize>, top1: f64) -> Candidate {
        Candidate {
            id,
            parent,
            morphisms: if parent.is_some() {
                vec![serde_json::json!({"kind": "wider", "node": 0})]
            } else {
                Vec::new()
            },
            description: serde_json::json!({}),
            parameters: 1e6,
            ops_per_image: Ops {
                forward: 1e9,
                backward: 2e9,
                total: 3e9,
            },
            batch: 32,
            kernel: 3,
            round: 0,
            epochs_planned: 1,
            patience: 2,
            expected: None,
            worker: 0,
            started_s: 0.0,
            finished_s: Some(1.0),
            epochs: vec![Epoch {
                epoch: 1,
                top1,
                loss: 1.0,
                seconds: 1.0,
                ops: 1e12,
                at_s: 1.0,
                pass: 0,
            }],
            predicted_top1: None,
            retrain: None,
            pretrained: None,
            outcome: Outcome::Trained,
        }
    }

    /// The page has the verdict, the three series, a row per time point and each candidate
    /// under its parent; text is escaped.
    #[test]
    fn the_report_shows_series_tree_and_verdict() {
        let doc = Automl {
            schema: roofline_model::automl::AUTOML_SCHEMA.into(),
            provenance: serde_json::from_value(serde_json::json!({
                "tool": "roofline <test>", "command_line": [], "time_utc": "t", "host": "h",
                "os": "o", "kernel": "k", "cpu": {"vendor": "v", "model_name": "m", "family": 0,
                "model": 0, "stepping": 0, "sockets": 1, "cores": 1, "logical_cpus": 1,
                "features": [], "simd": "", "caches": []}, "quick": true, "duration_s": 0.0
            }))
            .unwrap(),
            configuration: serde_json::Map::new(),
            running: false,
            candidates: vec![
                candidate(0, None, 0.4),
                candidate(1, Some(0), 0.6),
                candidate(2, Some(1), 0.5),
            ],
            series: vec![
                sample(10.0, 1e12, 10.0, Some(0.4)),
                sample(20.0, 3e12, 20.0, Some(0.6)),
            ],
            workers: Vec::new(),
            score: AutomlScore {
                flops: 1.5e11,
                regulated: 1.4e11,
                error: 0.4,
                best_candidate: Some(1),
                elapsed_s: 20.0,
                candidates_per_minute: 9.0,
                training_share: 0.9,
                search_seconds: 1.0,
                master_seconds: 0.5,
            },
            epoch_seconds: None,
            valid: false,
            invalid_because: vec!["ran 20 s, the rules ask at least 3600 s".into()],
            deviations: vec!["dropout drawn, not applied".into()],
        };
        let h = html(&doc);
        assert!(h.contains("class=\"warn\"") && h.contains("NOT VALID: ran 20 s"));
        for title in [">FLOPS<", ">error (1 − best top-1)<", ">regulated score<"] {
            assert!(h.contains(title), "{title}");
        }
        assert_eq!(h.matches("<polyline").count(), 3, "three series");
        assert_eq!(h.matches("<tr><td>").count(), 2, "a row per time point");
        // #2 nested inside #1's item, inside #0's.
        let (a, b, c) = (
            h.find("#0 the starting").unwrap(),
            h.find("#1 wider").unwrap(),
            h.find("#2 wider").unwrap(),
        );
        assert!(a < b && b < c);
        assert!(h[b..c].contains("<ul>"), "the child is under its parent");
        assert!(h.contains("<li class=\"best\">#1"));
        assert!(h.contains("&lt;test&gt;"), "escaped");
        assert!(
            h.contains("<ul id=\"deviations\"><li>dropout drawn, not applied</li>"),
            "each deviation from the reference named"
        );
        assert!(h.contains("0.5 s, 2.50 % of the run"), "the master's share");
        let mut c = candidate(3, Some(1), 0.6);
        c.epochs.push(Epoch {
            pass: 1,
            ..c.epochs[0].clone()
        });
        c.retrain = Some(roofline_model::automl::Retrain {
            batch: 16,
            kernel: 5,
            dropout: 0.1,
            top1: Some(0.6),
            won: false,
        });
        assert_eq!(
            epochs(&c),
            "1 epoch(s), then 1 with the TPE draw (batch 16, kernel 5, dropout 0.100), not kept"
        );
        // A candidate started from --init's file says how much of it the file filled.
        let mut d = doc.clone();
        d.candidates[2].pretrained = Some(roofline_model::automl::Filled { layers: 9, of: 12 });
        assert!(html(&d).contains("#2 wider, 9 of 12 layers from the pretrained file"));
    }
}
