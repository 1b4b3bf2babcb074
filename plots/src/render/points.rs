//! Placed points on the classic roofline: one colour per workload, a dotted line up to the
//! attainable bound, and labels out on leaders. Points whose markers touch (a ResNet's repeated
//! blocks: one shape, one intensity, one rate) share one label, "layer3.{1,2,4}.conv2": three
//! labels for one spot had to reach past every roof to find room.

use super::*;
use draw::SMALL_FONT;

/// Placed points: one colour per workload, a dotted line up to the attainable bound; the
/// workload's own label first, then its layers' by their share of the step. Each marker has a
/// white rim, so that points at one intensity stay apart; their labels go out on leaders.
/// Labels the largest layers ([`LAYER_LABELS`]) and returns how many it left unlabelled.
pub(super) fn points(
    opt: &ClassicOptions,
    px: &dyn Fn(f64, f64) -> (f64, f64),
    (x0, x1, y0, y1): (f64, f64, f64, f64),
    shapes: &mut String,
    lines: &mut Vec<labels::Line>,
    markers: &mut Vec<labels::Quad>,
    labels: &mut Vec<labels::Label>,
) -> usize {
    let groups = point_groups(opt);
    let mut point_labels: Vec<PointLabel> = Vec::new();
    for p in opt
        .points
        .iter()
        .filter(|p| p.intensity > 0.0 && p.achieved > 0.0)
    {
        let g = groups.iter().position(|g| *g == p.group).unwrap_or(0);
        let c = POINT_COLORS[g % POINT_COLORS.len()];
        let (x, y) = (p.intensity.clamp(x0, x1), p.achieved.clamp(y0, y1));
        let top = p.attainable.clamp(y0, y1);
        // Area by share of the step's time (layers), the workload itself larger.
        let r = if p.main {
            7.0
        } else {
            3.0 + 6.0 * p.share.unwrap_or(0.0).clamp(0.0, 1.0).sqrt()
        };
        let (sx, sy) = px(x, y);
        let tip = format!(
            "{}: {}FLOP/s at {:.3} FLOP/B; the roofline allows {}FLOP/s{}{}",
            p.label,
            si(p.achieved),
            p.intensity,
            si(p.attainable),
            p.binding
                .as_ref()
                .map(|b| format!(" under {b}"))
                .unwrap_or_default(),
            p.share
                .map(|s| format!("; {:.1}% of the step", 100.0 * s))
                .unwrap_or_default()
        );
        let own = format!("{}: {}", p.group, p.label);
        let top_px = (top > y).then(|| px(x, top).1);
        let shape = |top| point_shape(&p.group, &own, &tip, (sx, sy), top, r, rgb(c));
        let mut drawn = Drawn {
            labelled: shape(top_px),
            bare: shape(None),
            lines: Vec::new(),
        };
        if let Some(t) = top_px {
            for seg in [((sx, sy), (sx, t)), ((sx - 6.0, t), (sx + 6.0, t))] {
                drawn.lines.push(labels::Line {
                    seg,
                    own: own.clone(),
                    roof: false,
                });
            }
        }
        markers.push(square(sx, sy, r + 1.0));
        let text = if p.main {
            format!("{} ({}FLOP/s)", p.label, si(p.achieved))
        } else {
            p.label.clone()
        };
        point_labels.push(PointLabel {
            main: p.main,
            share: p.share.unwrap_or(0.0),
            at: (sx, sy, r),
            names: vec![p.label.clone()],
            drawn: vec![drawn],
            label: labels::Label {
                text,
                size: if p.main { 14.0 } else { SMALL_FONT },
                color: rgb(c),
                bold: p.main,
                spots: around(sx, sy, r),
                avoid_lines: true,
                owners: vec![(sx, sy)],
                title: Some(tip),
                unit: None,
                data: Some(("group", p.group.clone())),
                own,
            },
        });
    }
    point_labels.sort_by(|a, b| b.main.cmp(&a.main).then(b.share.total_cmp(&a.share)));
    let shared = shared(point_labels);
    // The figure's layer labels shared among the workloads that have layers.
    let mut with_layers: Vec<&str> = Vec::new();
    for (main, l, _) in &shared {
        let g = l.data.as_ref().map_or("", |d| d.1.as_str());
        if !main && !with_layers.contains(&g) {
            with_layers.push(g);
        }
    }
    let each = LAYER_LABELS
        .0
        .min(LAYER_LABELS.1 / with_layers.len().max(1));
    let mut per_group: Vec<(String, usize)> = Vec::new();
    let mut layers = 0;
    let mut unlabelled = 0;
    for (main, l, drawn) in shared {
        let group = l.data.as_ref().map_or(String::new(), |d| d.1.clone());
        let i = per_group
            .iter()
            .position(|g| g.0 == group)
            .unwrap_or_else(|| {
                per_group.push((group, 0));
                per_group.len() - 1
            });
        let labelled = main || (per_group[i].1 < each && layers < LAYER_LABELS.1);
        if labelled && !main {
            per_group[i].1 += 1;
            layers += 1;
        }
        // An unlabelled layer keeps its marker and tooltip, and leaves out its line up to
        // the bound with its label: 20 dotted lines of small layers walled in the labels of
        // the rest.
        for d in drawn {
            if labelled {
                shapes.push_str(&d.labelled);
                lines.extend(d.lines);
            } else {
                shapes.push_str(&d.bare);
            }
        }
        if labelled {
            labels.push(l);
        } else {
            unlabelled += 1;
        }
    }
    unlabelled
}

/// A point's SVG, with its line up to the bound (`labelled`, with that line as obstacles) and
/// without it (`bare`).
struct Drawn {
    labelled: String,
    bare: String,
    lines: Vec<labels::Line>,
}

/// At most this many layers' labels per workload, and in the figure (shared among the
/// workloads with layers): past them (the largest by their share of the step), labels crowd
/// one another into leaders no eye can follow (35 of an EWA run's layers beside ResNet-50's),
/// and a marker's tooltip names it.
pub(super) const LAYER_LABELS: (usize, usize) = (8, 16);

/// A placed point's label, before those of touching markers are joined.
struct PointLabel {
    main: bool,
    /// Its share of the step (layers), which orders the labels.
    share: f64,
    /// The marker's centre and radius, pixels.
    at: (f64, f64, f64),
    /// The names its label stands for, and their points.
    names: Vec<String>,
    drawn: Vec<Drawn>,
    label: labels::Label,
}

/// The labels of `points` (in order), one for each run of a workload's layers whose markers
/// touch: the first one's, naming them all ([`joined`]), with a leader from any of them and
/// every tooltip. A workload's own point keeps its own label.
fn shared(points: Vec<PointLabel>) -> Vec<(bool, labels::Label, Vec<Drawn>)> {
    let mut out: Vec<PointLabel> = Vec::new();
    for p in points {
        let touching = (!p.main)
            .then(|| {
                out.iter_mut().find(|q| {
                    let (dx, dy) = (q.at.0 - p.at.0, q.at.1 - p.at.1);
                    !q.main
                        && q.label.data == p.label.data
                        && (dx * dx + dy * dy).sqrt() <= q.at.2 + p.at.2 + 1.0
                })
            })
            .flatten();
        match touching {
            Some(q) => {
                q.names.extend(p.names);
                q.drawn.extend(p.drawn);
                q.label.owners.extend(p.label.owners);
                if let (Some(a), Some(b)) = (&mut q.label.title, p.label.title) {
                    a.push('\n');
                    a.push_str(&b);
                }
            }
            None => out.push(p),
        }
    }
    out.into_iter()
        .map(|mut p| {
            if p.names.len() > 1 {
                p.label.text = joined(&p.names);
            }
            (p.main, p.label, p.drawn)
        })
        .collect()
}

/// Names said once: "layer3.{1,2,4}.conv2" for names that differ in one dotted part (in
/// order), each such run once, the rest listed: "layer3.{1,2}.conv2, layer4.0.conv1"; names
/// without a dot that differ only in their last word, "ewa at L1, L2".
pub(crate) fn joined(names: &[String]) -> String {
    let last_word = |n: &String| n.rsplit_once(' ').map(|(head, _)| head.to_string());
    if !names.iter().any(|n| n.contains('.')) {
        if let Some(head) =
            last_word(&names[0]).filter(|h| names.iter().all(|n| last_word(n).as_ref() == Some(h)))
        {
            let words: Vec<&str> = names.iter().map(|n| &n[head.len() + 1..]).collect();
            return format!("{head} {}", words.join(", "));
        }
    }
    let mut runs: Vec<Vec<Vec<&str>>> = Vec::new();
    for n in names {
        let parts: Vec<&str> = n.split('.').collect();
        let fits = |run: &Vec<Vec<&str>>| {
            let differ = |i: usize| run.iter().any(|p| p[i] != parts[i]);
            run[0].len() == parts.len()
                && (0..parts.len())
                    .filter(|&i| differ(i) || run.iter().any(|p| p[i] != run[0][i]))
                    .count()
                    <= 1
        };
        match runs.iter_mut().find(|r| fits(r)) {
            Some(run) => run.push(parts),
            None => runs.push(vec![parts]),
        }
    }
    let said: Vec<String> = runs
        .into_iter()
        .map(|run| {
            let Some(i) = (0..run[0].len()).find(|&i| run.iter().any(|p| p[i] != run[0][i])) else {
                return run[0].join(".");
            };
            let mut which: Vec<&str> = run.iter().map(|p| p[i]).collect();
            which.sort_by_key(|w| (w.parse::<u64>().unwrap_or(u64::MAX), *w));
            let mut out: Vec<String> = run[0].iter().map(|s| s.to_string()).collect();
            out[i] = format!("{{{}}}", which.join(","));
            out.join(".")
        })
        .collect();
    said.join(", ")
}

/// Candidate spots around a marker of radius `r` at (x, y): right, left, above, below.
pub(super) fn around(x: f64, y: f64, r: f64) -> Vec<labels::Spot> {
    let s = |dx: f64, dy: f64, anchor| labels::Spot {
        x: x + dx,
        y: y + dy,
        angle: 0.0,
        anchor,
    };
    use labels::Anchor::{End, Middle, Start};
    vec![
        s(r + 4.0, 4.0, Start),
        s(r + 4.0, 17.0, Start),
        s(r + 4.0, -9.0, Start),
        s(-r - 4.0, 4.0, End),
        s(-r - 4.0, 17.0, End),
        s(-r - 4.0, -9.0, End),
        s(0.0, -r - 5.0, Middle),
        s(0.0, r + 15.0, Middle),
    ]
}

/// The box of a marker.
pub(super) fn square(x: f64, y: f64, r: f64) -> labels::Quad {
    [
        (x - r, y - r),
        (x + r, y - r),
        (x + r, y + r),
        (x - r, y + r),
    ]
}

/// The groups of the points drawn, in the order their colours are given
/// (`POINT_COLORS[i]`).
pub(super) fn point_groups(opt: &ClassicOptions) -> Vec<&str> {
    let mut groups: Vec<&str> = Vec::new();
    for p in opt
        .points
        .iter()
        .filter(|p| p.intensity > 0.0 && p.achieved > 0.0)
    {
        if !groups.contains(&p.group.as_str()) {
            groups.push(&p.group);
        }
    }
    groups
}
