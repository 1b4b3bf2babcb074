//! Drawing the classic roofline: plotters draws the axes, the grid, the ERT curve, the ridge
//! dots and the trajectories; the roofs, the placed points and every label are drawn in a layer
//! of their own (`data-roof`/`data-group` and tooltips for the interactive page), the labels
//! placed so that none collides (`crate::labels`).

use crate::*;
use plotters::prelude::*;
use roofline_model::Machine;

/// Renders the classic roofline of `m` as SVG text: the roofs and points by plotters, then
/// every label on its roof or beside its point, placed so that no two collide
/// (`labels::place`), each with a tooltip.
pub fn classic_svg(m: &Machine, opt: &ClassicOptions) -> Result<String, PlotError> {
    let model = classic_model(m, opt)?;
    let mut svg = String::new();
    let layer = {
        let root = SVGBackend::with_string(&mut svg, (opt.width, opt.height)).into_drawing_area();
        let layer = draw(&root, m, &model, opt).map_err(|e| PlotError::Draw(e.to_string()))?;
        root.present().map_err(|e| PlotError::Draw(e.to_string()))?;
        layer
    };
    // plotters' own text (caption, axes) is taken before any label is placed.
    let taken: Vec<labels::Quad> = labels::text_boxes(&svg).into_iter().map(|t| t.1).collect();
    let placed = labels::place(layer.labels, &taken, &layer.lines, layer.area);
    let group = format!(
        "<g id=\"shapes\">\n{}</g>\n{}",
        layer.shapes,
        labels::svg(&placed)
    );
    match svg.rfind("</svg>") {
        Some(i) => svg.insert_str(i, &group),
        None => svg.push_str(&group),
    }
    Ok(svg)
}

/// What `draw` leaves for the label layer: the labels, the roofs as pixel segments, the plot
/// area in pixels.
struct LabelLayer {
    /// The roofs and the placed points, as SVG with `data-roof`/`data-group` and `data-tip`
    /// attributes (drawn here rather than by plotters so that the interactive page can switch
    /// them and show their tooltips).
    shapes: String,
    labels: Vec<labels::Label>,
    lines: Vec<labels::Segment>,
    area: (f64, f64, f64, f64),
}

/// A roof's name on the plot: `cpu/mem/L2/triad/t1` → "L2 triad", `gpu0/gemm/bf16` →
/// "GEMM bf16", `cpu/fma/f32/all` → "FMA f32".
pub fn roof_name(id: &str) -> String {
    let mut parts: Vec<&str> = id.split('/').collect();
    if parts.len() > 1 && (parts[0] == "cpu" || parts[0] == "agg" || parts[0].starts_with("gpu")) {
        parts.remove(0);
        if parts.first() == Some(&"cpu") {
            parts.remove(0);
        }
    }
    if matches!(parts.last(), Some(&"t1") | Some(&"all")) && parts.len() > 1 {
        parts.pop();
    }
    let words: Vec<String> = match parts.first() {
        Some(&"mem") => parts[1..].iter().map(|s| s.to_string()).collect(),
        Some(&k) if ["fma", "gemm", "mma", "ert"].contains(&k) => std::iter::once(k.to_uppercase())
            .chain(parts[1..].iter().map(|s| s.to_string()))
            .collect(),
        _ => parts.iter().map(|s| s.to_string()).collect(),
    };
    words.join(" ")
}

fn rgb(c: RGBColor) -> (u8, u8, u8) {
    (c.0, c.1, c.2)
}

/// A roof as SVG: the visible line and a wider transparent one over it that takes the pointer
/// (its tooltip), both tagged with the ceiling's id.
fn roof_line(
    id: &str,
    tip: &str,
    ((xa, ya), (xb, yb)): labels::Segment,
    (r, g, b): (u8, u8, u8),
    width: u32,
    dashed: bool,
) -> String {
    let (id, tip) = (labels::esc(id), labels::esc(tip));
    let dash = if dashed {
        " stroke-dasharray=\"6,4\""
    } else {
        ""
    };
    format!(
        "<line class=\"roof\" data-roof=\"{id}\" x1=\"{xa:.1}\" y1=\"{ya:.1}\" x2=\"{xb:.1}\" y2=\"{yb:.1}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"{width}\"{dash}/>\n<line class=\"hit\" data-roof=\"{id}\" data-tip=\"{tip}\" x1=\"{xa:.1}\" y1=\"{ya:.1}\" x2=\"{xb:.1}\" y2=\"{yb:.1}\" stroke=\"rgba(0,0,0,0)\" stroke-width=\"10\"><title>{tip}</title></line>\n"
    )
}

/// A placed point as SVG: a dotted line up to its attainable bound (`top`, pixels) with a
/// tick there, and the marker, tagged with its workload.
fn point_shape(
    group: &str,
    tip: &str,
    (x, y): (f64, f64),
    top: Option<f64>,
    radius: f64,
    (r, g, b): (u8, u8, u8),
) -> String {
    let (group, tip) = (labels::esc(group), labels::esc(tip));
    let mut s = String::new();
    if let Some(t) = top {
        s.push_str(&format!(
            "<line data-group=\"{group}\" x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{x:.1}\" y2=\"{t:.1}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"1\" stroke-dasharray=\"3,3\"/>\n<line data-group=\"{group}\" x1=\"{:.1}\" y1=\"{t:.1}\" x2=\"{:.1}\" y2=\"{t:.1}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"2\"/>\n",
            x - 6.0,
            x + 6.0
        ));
    }
    s.push_str(&format!(
        "<circle class=\"point\" data-group=\"{group}\" data-tip=\"{tip}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{radius:.1}\" fill=\"rgb({r},{g},{b})\"><title>{tip}</title></circle>\n"
    ));
    s
}

const COLORS: [RGBColor; 14] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(23, 190, 207),
    RGBColor(188, 189, 34),
    RGBColor(127, 127, 127),
    RGBColor(0, 0, 128),
    RGBColor(128, 0, 0),
    RGBColor(0, 100, 0),
    RGBColor(184, 134, 11),
];

/// Point colours, distinct from the roofs' palette's first entries.
pub(crate) const POINT_COLORS: [RGBColor; 6] = [
    RGBColor(220, 20, 60),
    RGBColor(0, 128, 128),
    RGBColor(255, 140, 0),
    RGBColor(75, 0, 130),
    RGBColor(34, 139, 34),
    RGBColor(30, 30, 30),
];

type Area<'a> = DrawingArea<SVGBackend<'a>, plotters::coord::Shift>;

fn draw(
    root: &Area,
    m: &Machine,
    model: &ClassicModel,
    opt: &ClassicOptions,
) -> Result<LabelLayer, Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let (x0, x1) = model.x_range;
    let (y0, y1) = model.y_range;
    let cluster = m
        .provenance
        .cluster
        .as_ref()
        .map(|c| format!("{} nodes, {} ranks", c.nodes, c.ranks))
        .unwrap_or_else(|| "one node".into());
    let title = if opt.model == Model::NodeCoi {
        format!("Single-node COI roofline: {}", m.provenance.cpu.model_name)
    } else if opt.model == Model::DistCoi {
        format!("Distributed COI roofline: {cluster}")
    } else if opt.device == "cpu" {
        format!(
            "Roofline: {} ({} threads: {})",
            m.provenance.cpu.model_name,
            opt.threads,
            m.ceilings
                .iter()
                .find(|c| suffix_matches(c, opt.threads))
                .map(|c| c.threads)
                .unwrap_or(0)
        )
    } else {
        let name = m
            .provenance
            .gpus
            .iter()
            .find(|g| format!("gpu{}", g.index) == opt.device)
            .map(|g| g.name.clone())
            .unwrap_or_default();
        format!("Roofline: {} {name}", opt.device)
    };
    let title = opt.title.clone().unwrap_or(title);
    let mut chart = ChartBuilder::on(root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(48)
        .y_label_area_size(80)
        .build_cartesian_2d((x0..x1).log_scale(), (y0..y1).log_scale())?;
    chart
        .configure_mesh()
        .x_desc(if opt.model == Model::Classic {
            "Operational intensity [FLOP/byte of memory traffic]"
        } else {
            "Communication intensity, COI [FLOP/byte communicated]"
        })
        .y_desc("Performance [FLOP/s]")
        .x_label_formatter(&|x| si(*x))
        .y_label_formatter(&|y| si(*y))
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;

    // Pixels of a data point, and the plot area.
    // Log-log: the same mapping as the chart's (its pixel range, owned, so that the chart can
    // be drawn on meanwhile).
    let (xr, yr) = chart.plotting_area().get_pixel_range();
    let (lx0, lx1, ly0, ly1) = (x0.ln(), x1.ln(), y0.ln(), y1.ln());
    let px = move |x: f64, y: f64| {
        let fx = (x.ln() - lx0) / (lx1 - lx0);
        let fy = (y.ln() - ly0) / (ly1 - ly0);
        (
            xr.start as f64 + fx * (xr.end - xr.start - 1) as f64,
            yr.end as f64 - 1.0 - fy * (yr.end - yr.start - 1) as f64,
        )
    };
    let (ax0, ay0) = px(x0, y1);
    let (ax1, ay1) = px(x1, y0);
    let area = (ax0, ay0, ax1, ay1);
    let mut labels: Vec<labels::Label> = Vec::new();
    let mut lines: Vec<labels::Segment> = Vec::new();
    let mut roof_labels: Vec<labels::Label> = Vec::new();
    let mut shapes = String::new();
    // The subtitle: what is placed, and when the machine was measured.
    let groups_placed: Vec<&str> = {
        let mut g: Vec<&str> = Vec::new();
        for p in opt.points.iter().filter(|p| p.main) {
            if !g.contains(&p.group.as_str()) {
                g.push(&p.group);
            }
        }
        g
    };
    let subtitle = format!(
        "{}measured {} on {}{}",
        if groups_placed.is_empty() {
            String::new()
        } else {
            format!("placed: {} · ", groups_placed.join(", "))
        },
        m.provenance.time_utc,
        m.provenance.host,
        if m.provenance.quick {
            " (quick probe)"
        } else {
            ""
        }
    );
    labels.push(labels::Label {
        text: subtitle,
        size: 12.0,
        color: (70, 70, 70),
        bold: false,
        spots: vec![labels::Spot {
            x: (ax0 + ax1) / 2.0,
            y: ay0 - 6.0,
            angle: 0.0,
            anchor: labels::Anchor::Middle,
        }],
        avoid_lines: false,
        owner: None,
        title: None,
        data: None,
    });
    // The roofs that bind a placed workload are drawn thicker.
    let binding: Vec<&str> = opt
        .points
        .iter()
        .filter(|p| p.main)
        .filter_map(|p| p.binding.as_deref())
        .collect();
    let width_of = |label: &str| if binding.contains(&label) { 4 } else { 2 };

    let top_bw = model.slanted.iter().map(|r| r.value).fold(0.0, f64::max);
    let top_flat = model
        .flat
        .iter()
        .filter(|r| !r.dashed)
        .map(|r| r.value)
        .fold(0.0, f64::max);
    let unit = |r: &DrawnRoof| if r.slanted { "B/s" } else { "FLOP/s" };
    let tooltip = |r: &DrawnRoof| {
        let c = m.ceilings.iter().find(|c| c.id == r.label);
        match c {
            Some(c) => format!(
                "{}: {}{} ({} samples, cv {:.2}%): {}",
                c.id,
                si(c.value),
                c.unit,
                c.stats.samples,
                100.0 * c.stats.cv,
                c.method
            ),
            None => format!("{}: {}{}", r.label, si(r.value), unit(r)),
        }
    };
    let mut color = 0;
    for r in &model.slanted {
        let c = COLORS[color % COLORS.len()];
        color += 1;
        // From the left edge up to the highest compute roof (or the right edge).
        let x_end = if top_flat > 0.0 {
            (top_flat / r.value).min(x1)
        } else {
            x1
        };
        // The visible stretch (inside the y range), and the label along it.
        let xa = x0.max(y0 / r.value);
        let xb = x_end.min(y1 / r.value);
        if xb > xa {
            let (pa, pb) = (px(xa, r.value * xa), px(xb, r.value * xb));
            lines.push((pa, pb));
            shapes.push_str(&roof_line(
                &r.label,
                &tooltip(r),
                (pa, pb),
                rgb(c),
                width_of(&r.label),
                false,
            ));
            let angle = (-(pb.1 - pa.1)).atan2(pb.0 - pa.0).to_degrees();
            let spots = [0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.12, 0.88]
                .iter()
                .map(|t| {
                    let x = (xa.ln() + t * (xb.ln() - xa.ln())).exp();
                    let (sx, sy) = px(x, r.value * x);
                    // Just above the line: perpendicular to it, 3 pixels out.
                    let a = angle.to_radians();
                    labels::Spot {
                        x: sx - 3.0 * a.sin(),
                        y: sy - 3.0 * a.cos(),
                        angle,
                        anchor: labels::Anchor::Middle,
                    }
                })
                .collect();
            roof_labels.push(labels::Label {
                text: format!("{} {}B/s", roof_name(&r.label), si(r.value)),
                size: 11.0,
                color: rgb(c),
                bold: binding.contains(&r.label.as_str()),
                spots,
                avoid_lines: true,
                owner: None,
                title: Some(tooltip(r)),
                data: Some(("roof", r.label.clone())),
            });
        }
    }
    let mut flat_labels = Vec::new();
    for r in &model.flat {
        let c = if r.dashed {
            RGBColor(90, 90, 90)
        } else {
            COLORS[color % COLORS.len()]
        };
        if !r.dashed {
            color += 1;
        }
        // From where it meets the highest bandwidth roof to the right edge.
        let x_start = if top_bw > 0.0 {
            (r.value / top_bw).max(x0)
        } else {
            x0
        };
        let (pa, pb) = (px(x_start, r.value), px(x1, r.value));
        lines.push((pa, pb));
        shapes.push_str(&roof_line(
            &r.label,
            &tooltip(r),
            (pa, pb),
            rgb(c),
            if r.dashed { 1 } else { width_of(&r.label) },
            r.dashed,
        ));
        // At its right end, above the line; then below it; then further left (near-equal
        // roofs take turns).
        let mut spots = Vec::new();
        for k in 0..16 {
            let x = pb.0 - 6.0 - 60.0 * k as f64;
            if x < pa.0 + 40.0 {
                break;
            }
            for dy in [-6.0, 14.0] {
                spots.push(labels::Spot {
                    x,
                    y: pb.1 + dy,
                    angle: 0.0,
                    anchor: labels::Anchor::End,
                });
            }
        }
        let name = if r.dashed {
            r.label
                .replace("theoretical", "peak")
                .replace(" peak (", " (theoretical, ")
        } else {
            roof_name(&r.label)
        };
        flat_labels.push(labels::Label {
            text: format!("{name} {}FLOP/s", si(r.value)),
            size: if r.dashed { 10.0 } else { 11.0 },
            color: rgb(c),
            bold: binding.contains(&r.label.as_str()),
            spots,
            avoid_lines: true,
            owner: None,
            title: Some(tooltip(r)),
            data: Some(("roof", r.label.clone())),
        });
    }
    // Flat roofs first (their spots are few), then the slanted ones.
    labels.extend(flat_labels);
    labels.extend(roof_labels);
    // The measured ERT curve (FLOPs per element swept), where the probe made one.
    if let Some(curve) = m
        .curves
        .iter()
        .find(|c| c.id == format!("{}/ert/f32", opt.device) && c.unit == "FLOP/s")
    {
        let pts: Vec<(f64, f64)> = curve
            .points
            .iter()
            .filter(|p| p.x >= x0 && p.x <= x1 && p.value >= y0 && p.value <= y1)
            .map(|p| (p.x, p.value))
            .collect();
        if let Some(&last) = pts.last() {
            chart.draw_series(LineSeries::new(pts.clone(), BLACK.stroke_width(1)))?;
            chart.draw_series(pts.iter().map(|p| Cross::new(*p, 4, BLACK.stroke_width(1))))?;
            let (lx, ly) = px(last.0, last.1);
            labels.push(labels::Label {
                text: format!("{} (measured)", curve.id),
                size: 10.0,
                color: (0, 0, 0),
                bold: false,
                spots: vec![labels::Spot {
                    x: lx + 6.0,
                    y: ly + 4.0,
                    angle: 0.0,
                    anchor: labels::Anchor::Start,
                }],
                avoid_lines: true,
                owner: Some((lx, ly)),
                title: Some(format!("{}: FLOPs per element swept", curve.id)),
                data: None,
            });
        }
    }
    let around = |x: f64, y: f64, r: f64| -> Vec<labels::Spot> {
        let s = |dx: f64, dy: f64, anchor| labels::Spot {
            x: x + dx,
            y: y + dy,
            angle: 0.0,
            anchor,
        };
        use labels::Anchor::{End, Middle, Start};
        vec![
            s(r + 4.0, 4.0, Start),
            s(r + 4.0, 16.0, Start),
            s(r + 4.0, -8.0, Start),
            s(-r - 4.0, 4.0, End),
            s(-r - 4.0, 16.0, End),
            s(-r - 4.0, -8.0, End),
            s(0.0, -r - 5.0, Middle),
            s(0.0, r + 14.0, Middle),
        ]
    };
    for (i, rdg) in model.ridges.iter().enumerate() {
        chart.draw_series(std::iter::once(Circle::new(
            (rdg.intensity, rdg.performance),
            4,
            BLACK.filled(),
        )))?;
        let level = if opt.model == Model::Classic {
            rdg.memory.split('/').nth(2).unwrap_or("")
        } else {
            rdg.memory.as_str()
        };
        let (x, y) = px(rdg.intensity, rdg.performance);
        // Below the compute roof (above it is the roof's own label's place).
        let mut spots: Vec<labels::Spot> =
            around(x, y, 4.0).into_iter().filter(|s| s.y > y).collect();
        spots.push(labels::Spot {
            x: x + 8.0,
            y: y + 28.0 + 12.0 * i as f64,
            angle: 0.0,
            anchor: labels::Anchor::Start,
        });
        labels.push(labels::Label {
            text: format!("{level} ridge {:.3} FLOP/B", rdg.intensity),
            size: 10.0,
            color: (0, 0, 0),
            bold: false,
            spots,
            avoid_lines: true,
            owner: Some((x, y)),
            title: Some(format!(
                "ridge of {} and {}: {:.4} FLOP/B, {}FLOP/s",
                rdg.memory,
                rdg.compute,
                rdg.intensity,
                si(rdg.performance)
            )),
            data: Some(("roof", rdg.memory.clone())),
        });
    }
    // Trajectories: thin grey lines through points in order, under the points.
    for t in &opt.trajectories {
        let pts: Vec<(f64, f64)> = t
            .iter()
            .map(|&(x, y)| (x.clamp(x0, x1), y.clamp(y0, y1)))
            .collect();
        if pts.len() > 1 {
            chart.draw_series(LineSeries::new(
                pts,
                RGBColor(110, 110, 110).stroke_width(1),
            ))?;
        }
    }
    // Placed points: one colour per workload, a dotted line up to the attainable bound; the
    // workload's own label first, then its layers' by size.
    let mut groups: Vec<&str> = Vec::new();
    let mut point_labels: Vec<(bool, f64, labels::Label)> = Vec::new();
    for p in opt
        .points
        .iter()
        .filter(|p| p.intensity > 0.0 && p.achieved > 0.0)
    {
        let g = match groups.iter().position(|g| *g == p.group) {
            Some(i) => i,
            None => {
                groups.push(&p.group);
                groups.len() - 1
            }
        };
        let c = POINT_COLORS[g % POINT_COLORS.len()];
        let (x, y) = (p.intensity.clamp(x0, x1), p.achieved.clamp(y0, y1));
        let top = p.attainable.clamp(y0, y1);
        // Area by share of the step's time (layers), the workload itself larger.
        let r = if p.main {
            7.0
        } else {
            3.0 + 9.0 * p.share.unwrap_or(0.0).clamp(0.0, 1.0).sqrt()
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
        shapes.push_str(&point_shape(
            &p.group,
            &tip,
            (sx, sy),
            if top > y { Some(px(x, top).1) } else { None },
            r,
            rgb(c),
        ));
        let text = if p.main {
            format!("{} ({}FLOP/s)", p.label, si(p.achieved))
        } else {
            p.label.clone()
        };
        point_labels.push((
            p.main,
            p.share.unwrap_or(0.0),
            labels::Label {
                text,
                size: if p.main { 13.0 } else { 10.0 },
                color: rgb(c),
                bold: p.main,
                spots: around(sx, sy, r),
                avoid_lines: true,
                owner: Some((sx, sy)),
                title: Some(tip),
                data: Some(("group", p.group.clone())),
            },
        ));
    }
    point_labels.sort_by(|a, b| b.0.cmp(&a.0).then(b.1.total_cmp(&a.1)));
    labels.extend(point_labels.into_iter().map(|p| p.2));
    Ok(LabelLayer {
        shapes,
        labels,
        lines,
        area,
    })
}
