//! The classic roofline's drawing: the title and subtitle above the chart (fixed, never
//! displaced), plotters' axes with 1-2-5 ticks, then every roof, curve, trajectory and point as
//! SVG of our own, each line an obstacle owned by what it draws, and the labels' candidates.

use super::points::{around, point_groups, points, square};
use super::*;

/// The height of the title band above the chart, and of the footer below it.
const HEAD: u32 = 64;
const FOOT: u32 = 26;
/// Font sizes (pixels of the figure at its own size: readable at 1100 × 760).
const ROOF_FONT: f64 = 13.0;
pub(super) const SMALL_FONT: f64 = 12.0;
/// A flat roof's label moves left from the right end in this many steps of 70 px.
const SHIFTS: usize = 14;

pub(super) fn draw(
    root: &Area,
    m: &Machine,
    model: &ClassicModel,
    opt: &ClassicOptions,
) -> Result<LabelLayer, Box<dyn std::error::Error>> {
    root.fill(&WHITE)?;
    let (x0, x1) = model.x_range;
    let (y0, y1) = model.y_range;
    let title = opt.title.clone().unwrap_or_else(|| title_of(m, opt));
    let (_, body) = root.split_vertically(HEAD);
    let (body, _) = body.split_vertically(opt.height.saturating_sub(HEAD + FOOT));
    let mut chart = ChartBuilder::on(&body)
        .margin(16)
        .margin_top(6)
        .x_label_area_size(52)
        .y_label_area_size(84)
        .build_cartesian_2d(
            (x0..x1).log_scale().with_key_points(log_ticks(x0, x1)),
            (y0..y1).log_scale().with_key_points(log_ticks(y0, y1)),
        )?;
    chart
        .configure_mesh()
        .x_desc(if opt.model == Model::Classic {
            "Operational intensity [FLOP/byte of memory traffic]"
        } else {
            "Communication intensity, COI [FLOP per bus byte: payload × 2(n−1)/n, as busbw]"
        })
        .y_desc("Performance [FLOP/s]")
        .label_style(("sans-serif", 16))
        .axis_desc_style(("sans-serif", 18))
        .x_label_formatter(&|x| tick(*x))
        .y_label_formatter(&|y| tick(*y))
        .light_line_style(RGBColor(235, 235, 235))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()?;

    // Pixels of a data point (the chart's own log-log mapping, its pixel range owned).
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
    let mut lines: Vec<labels::Line> = Vec::new();
    let mut markers: Vec<labels::Quad> = Vec::new();
    let mut shapes = String::new();
    // The title and the subtitle (what is placed, when and where the machine was measured),
    // in their own band: always drawn.
    let cx = opt.width as f64 / 2.0;
    shapes.push_str(&text_svg(&title, (cx, 28.0), 22.0, "middle"));
    shapes.push_str(&subtitle(m, opt, (cx, 52.0)));
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
    let tooltip = |r: &DrawnRoof| {
        let unit = if r.slanted { "B/s" } else { "FLOP/s" };
        let peak = r
            .peak
            .map(|p| format!("; theoretical peak {}FLOP/s", si(p)))
            .unwrap_or_default();
        match m.ceilings.iter().find(|c| c.id == r.label) {
            Some(c) => format!(
                "{}: {}{} ({} samples, cv {:.2}%){peak}: {}",
                c.id,
                si(c.value),
                c.unit,
                c.stats.samples,
                100.0 * c.stats.cv,
                c.method
            ),
            None => format!("{}: {}{unit}", r.label, si(r.value)),
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
        let xa = x0.max(y0 / r.value);
        let xb = x_end.min(y1 / r.value);
        if xb <= xa {
            continue;
        }
        let (pa, pb) = (px(xa, r.value * xa), px(xb, r.value * xb));
        lines.push(labels::Line {
            seg: (pa, pb),
            own: r.label.clone(),
            roof: true,
        });
        shapes.push_str(&roof_line(
            &r.label,
            &tooltip(r),
            (pa, pb),
            rgb(c),
            width_of(&r.label),
            false,
        ));
        let angle = (-(pb.1 - pa.1)).atan2(pb.0 - pa.0).to_degrees();
        let along = |t: f64, above: bool| {
            let x = (xa.ln() + t * (xb.ln() - xa.ln())).exp();
            let (sx, sy) = px(x, r.value * x);
            // Beside the line: perpendicular to it, 3 pixels out (below: a line's height).
            let a = angle.to_radians();
            let d = if above { 3.0 } else { -(ROOF_FONT + 2.0) };
            labels::Spot {
                x: sx - d * a.sin(),
                y: sy - d * a.cos(),
                angle,
                anchor: labels::Anchor::Middle,
            }
        };
        let ts = [0.5, 0.4, 0.6, 0.3, 0.7, 0.2, 0.8, 0.12, 0.88];
        let spots = ts
            .iter()
            .map(|&t| along(t, true))
            .chain(ts.iter().map(|&t| along(t, false)))
            .collect();
        // Leaders start on the line: from its middle first, then out towards its ends.
        let owners = ts
            .iter()
            .map(|&t| {
                let x = (xa.ln() + t * (xb.ln() - xa.ln())).exp();
                px(x, r.value * x)
            })
            .collect();
        labels.push(labels::Label {
            text: format!("{} {}B/s", roof_name(&r.label), si(r.value)),
            size: ROOF_FONT,
            color: rgb(c),
            bold: binding.contains(&r.label.as_str()),
            spots,
            avoid_lines: true,
            owners,
            title: Some(tooltip(r)),
            unit: None,
            data: Some(("roof", r.label.clone())),
            own: r.label.clone(),
        });
    }
    // Flat roofs: drawn from where they meet the highest bandwidth roof to the right edge.
    // Roofs closer than a label's height form a stack: their labels go above (or below) the
    // stack, one row each in the roofs' order, never between two of its lines.
    let mut flat: Vec<(&DrawnRoof, RGBColor, labels::Segment)> = Vec::new();
    for r in &model.flat {
        let c = if r.dashed {
            RGBColor(90, 90, 90)
        } else {
            color += 1;
            COLORS[(color - 1) % COLORS.len()]
        };
        let x_start = if top_bw > 0.0 {
            (r.value / top_bw).max(x0)
        } else {
            x0
        };
        let seg = (px(x_start, r.value), px(x1, r.value));
        lines.push(labels::Line {
            seg,
            own: r.label.clone(),
            roof: true,
        });
        shapes.push_str(&roof_line(
            &r.label,
            &tooltip(r),
            seg,
            rgb(c),
            if r.dashed { 1 } else { width_of(&r.label) },
            r.dashed,
        ));
        flat.push((r, c, seg));
    }
    flat.sort_by(|a, b| a.2 .0 .1.total_cmp(&b.2 .0 .1));
    let row = ROOF_FONT * 1.3;
    let mut stacks: Vec<Vec<usize>> = Vec::new();
    for i in 0..flat.len() {
        match stacks.last_mut() {
            Some(s) if flat[i].2 .0 .1 - flat[*s.last().unwrap()].2 .0 .1 < row + 2.0 => s.push(i),
            _ => stacks.push(vec![i]),
        }
    }
    for (n, stack) in stacks.iter().enumerate() {
        let (top, bottom) = (flat[stack[0]].2 .0 .1, flat[*stack.last().unwrap()].2 .0 .1);
        let k = stack.len();
        let gap = if k > 1 { 2.0 } else { 0.0 };
        let text_of = |f: usize| {
            let r = flat[f].0;
            let size = if r.dashed { SMALL_FONT } else { ROOF_FONT };
            (flat_text(r), size, binding.contains(&r.label.as_str()))
        };
        // Row i of the stack's `above` side (the top roof's label highest), counted out from
        // the stack, at the right end shifted left by `j` steps.
        let slot = |i: usize, row_out: usize, above: bool, j: usize, size: f64| labels::Spot {
            x: flat[stack[i]].2 .1 .0 - 6.0 - 70.0 * j as f64,
            // In a stack of several, 2 px further out: the row next to the stack is another
            // roof's label, and must clear the outer roof by the lines' clearance.
            y: if above {
                top - 4.0 - gap - row_out as f64 * row
            } else {
                bottom + size + 3.0 + gap + row_out as f64 * row
            },
            angle: 0.0,
            anchor: labels::Anchor::End,
        };
        // A row fits where it starts after its roof does, crosses no other line, and has no
        // roof outside the stack between it and the stack (a label beyond another roof reads
        // as that roof's).
        let fits = |i: usize, q: &labels::Quad| {
            let f = stack[i];
            let (ys, xs) = (q.map(|p| p.1), q.map(|p| p.0));
            let (lo, hi) = (
                ys.iter().copied().fold(f64::MAX, f64::min),
                ys.iter().copied().fold(f64::MIN, f64::max),
            );
            let (left, right) = (
                xs.iter().copied().fold(f64::MAX, f64::min),
                xs.iter().copied().fold(f64::MIN, f64::max),
            );
            let centre = (lo + hi) / 2.0;
            left >= flat[f].2 .0 .0 + 4.0
                && !lines
                    .iter()
                    .any(|l| l.own != flat[f].0.label && labels::grazes(q, l.seg.0, l.seg.1))
                && !flat.iter().enumerate().any(|(g, o)| {
                    let y = o.2 .0 .1;
                    !stack.contains(&g)
                        && (y - centre) * (y - (top + bottom) / 2.0) < 0.0
                        && o.2 .0 .0 < right
                        && o.2 .1 .0 > left
                })
        };
        // Whether row `out` of side `above` at shift `j` fits label `i`, worked out once.
        let mut fit = vec![false; k * k * 2 * SHIFTS];
        for (n, fit) in fit.iter_mut().enumerate() {
            let (i, out, above, j) = (
                n / (k * 2 * SHIFTS),
                n / (2 * SHIFTS) % k,
                (n / SHIFTS).is_multiple_of(2),
                n % SHIFTS,
            );
            let (text, size, bold) = text_of(stack[i]);
            *fit = fits(
                i,
                &labels::quad_of(&text, size, bold, &slot(i, out, above, j, size)),
            );
        }
        let fits_at = |i: usize, out: usize, above: bool, j: usize| {
            fit[((i * k + out) * 2 + usize::from(!above)) * SHIFTS + j]
        };
        // The arrangements that keep the roofs' order: the top `a` labels in rows above the
        // stack, the bottom `b` in rows below it, the rest out on leaders (which show whose
        // they are); the most labels beside the stack first, then the shift, then all above,
        // all below, the splits. The placer takes the first where every row is free.
        let mut order: Vec<(usize, usize, usize)> = Vec::new();
        for beside in (1..=k).rev() {
            for j in 0..SHIFTS {
                for a in [beside, 0].into_iter().chain((1..beside).rev()) {
                    order.push((a, beside - a, j));
                }
            }
        }
        order.push((0, 0, 0));
        let mut arrangements: Vec<Vec<Option<labels::Spot>>> = vec![Vec::new(); k];
        for (a, b, j) in order {
            let row_of = |i: usize| {
                if i < a {
                    Some((a - 1 - i, true))
                } else if i >= k - b {
                    Some((i - (k - b), false))
                } else {
                    None
                }
            };
            if (0..k).all(|i| row_of(i).is_none_or(|(out, up)| fits_at(i, out, up, j))) {
                for (i, list) in arrangements.iter_mut().enumerate() {
                    let size = text_of(stack[i]).1;
                    list.push(row_of(i).map(|(out, up)| slot(i, out, up, j, size)));
                }
            }
        }
        for (i, &f) in stack.iter().enumerate() {
            let (r, c, (pa, pb)) = flat[f];
            let (text, size, bold) = text_of(f);
            let arrangements = std::mem::take(&mut arrangements[i]);
            labels.push(labels::Label {
                text,
                size,
                color: rgb(c),
                bold,
                spots: Vec::new(),
                avoid_lines: true,
                // Leaders start on the roof: near its right end first, then every 40 px
                // towards its start (its middle, where it is shorter than that).
                owners: (0..)
                    .map(|k| (pb.0 - 40.0 - 40.0 * k as f64, pb.1))
                    .take_while(|p| p.0 > pa.0 + 8.0)
                    .chain([((pa.0 + pb.0) / 2.0, pb.1)])
                    .collect(),
                title: Some(tooltip(r)),
                unit: Some(labels::Unit {
                    id: n as u32,
                    arrangements,
                }),
                data: Some(("roof", r.label.clone())),
                own: r.label.clone(),
            });
        }
    }
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
            .map(|p| px(p.x, p.value))
            .collect();
        if let Some(&(lx, ly)) = pts.last() {
            shapes.push_str(&polyline(&curve.id, &pts, (0, 0, 0), 1.0));
            for w in pts.windows(2) {
                lines.push(labels::Line {
                    seg: (w[0], w[1]),
                    own: curve.id.clone(),
                    roof: true,
                });
            }
            labels.push(labels::Label {
                text: format!("{} (measured)", curve.id),
                size: SMALL_FONT,
                color: (0, 0, 0),
                bold: false,
                spots: around(lx, ly, 3.0),
                avoid_lines: true,
                owners: vec![(lx, ly)],
                title: Some(format!("{}: FLOPs per element swept", curve.id)),
                unit: None,
                data: None,
                own: curve.id.clone(),
            });
        }
    }
    for rdg in &model.ridges {
        let level = if opt.model == Model::Classic {
            rdg.memory.split('/').nth(2).unwrap_or("")
        } else {
            rdg.memory.as_str()
        };
        let (x, y) = px(rdg.intensity, rdg.performance);
        shapes.push_str(&format!(
            "<circle data-roof=\"{}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"4\" fill=\"black\"/>\n",
            labels::esc(&rdg.memory)
        ));
        markers.push(square(x, y, 5.0));
        // Below the compute roof (above it is the roof's own label's place); where the roofs
        // crowd it, in a list at the top left of the plot, whose corner the roofs leave free.
        let spots = around(x, y, 4.0)
            .into_iter()
            .filter(|s| s.y > y)
            .chain((0..model.ridges.len()).map(|k| labels::Spot {
                x: ax0 + 8.0,
                y: ay0 + 8.0 + SMALL_FONT + k as f64 * SMALL_FONT * 1.3,
                angle: 0.0,
                anchor: labels::Anchor::Start,
            }))
            .collect();
        labels.push(labels::Label {
            text: format!("{level} ridge {:.3} FLOP/B", rdg.intensity),
            size: SMALL_FONT,
            color: (0, 0, 0),
            bold: false,
            spots,
            avoid_lines: true,
            owners: vec![(x, y)],
            title: Some(format!(
                "ridge of {} and {}: {:.4} FLOP/B, {}FLOP/s",
                rdg.memory,
                rdg.compute,
                rdg.intensity,
                si(rdg.performance)
            )),
            unit: None,
            data: Some(("roof", rdg.memory.clone())),
            own: format!("ridge {}", rdg.memory),
        });
    }
    // Trajectories: thin grey lines through points in order, under the points.
    for (i, t) in opt.trajectories.iter().enumerate() {
        let pts: Vec<(f64, f64)> = t
            .iter()
            .map(|&(x, y)| px(x.clamp(x0, x1), y.clamp(y0, y1)))
            .collect();
        if pts.len() > 1 {
            let own = format!("trajectory {i}");
            shapes.push_str(&polyline(&own, &pts, (110, 110, 110), 1.0));
            for w in pts.windows(2) {
                lines.push(labels::Line {
                    seg: (w[0], w[1]),
                    own: own.clone(),
                    roof: false,
                });
            }
        }
    }
    let unlabelled = points(
        opt,
        &px,
        (x0, x1, y0, y1),
        &mut shapes,
        &mut lines,
        &mut markers,
        &mut labels,
    );
    Ok(LabelLayer {
        shapes,
        labels,
        lines,
        markers,
        area,
        unlabelled,
    })
}

/// A flat roof's label: "FMA f32 574 of 577 GFLOP/s" for a measured roof with its peak ("FMA
/// f64 at peak, 118 GFLOP/s" at or above it), "f32 peak (theoretical, all) 577 GFLOP/s" for a
/// dashed one.
fn flat_text(r: &DrawnRoof) -> String {
    if r.dashed {
        let name = r
            .label
            .replace("theoretical", "peak")
            .replace(" peak (", " (theoretical, ");
        return format!("{name} {}FLOP/s", si(r.value));
    }
    match r.peak {
        // Measured at or above the theoretical peak (within the peak's own uncertainty, or the
        // roof would be flagged): "118 of 117 GFLOP/s peak" read as above it.
        Some(p) if r.value >= p => {
            format!("{} at peak, {}FLOP/s", roof_name(&r.label), si(r.value))
        }
        Some(p) => {
            let (v, pk) = (si(r.value), si(p));
            // "574 G" and "577 G": one prefix, said once.
            match (v.split_once(' '), pk.split_once(' ')) {
                (Some((a, pa)), Some((b, pb))) if pa == pb => {
                    format!("{} {a} of {b} {pa}FLOP/s peak", roof_name(&r.label))
                }
                _ => format!("{} {v}FLOP/s of {pk}FLOP/s peak", roof_name(&r.label)),
            }
        }
        None => format!("{} {}FLOP/s", roof_name(&r.label), si(r.value)),
    }
}

/// The figure's title.
fn title_of(m: &Machine, opt: &ClassicOptions) -> String {
    let cluster = m
        .provenance
        .cluster
        .as_ref()
        .map(|c| format!("{} nodes, {} ranks", c.nodes, c.ranks))
        .unwrap_or_else(|| "one node".into());
    if opt.model == Model::NodeCoi {
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
        // A GPU whose GEMM or tensor roofs ran into the power cap: say which figure is drawn.
        let capped = m.ceilings.iter().any(|c| {
            c.sustained.is_some() && c.id.to_string().starts_with(&format!("{}/", opt.device))
        });
        let which = match (capped, opt.burst) {
            (false, _) => "",
            (true, false) => " (power-capped roofs: sustained)",
            (true, true) => " (power-capped roofs: burst, before the cap)",
        };
        format!("Roofline: {} {name}{which}", opt.device)
    }
}

/// The subtitle at `(x, y)`: what is placed, and when and where the machine was measured.
/// Where the points' colours tell groups apart (two or more), each group is named in its
/// colour, with its marker: the figure's legend.
fn subtitle(m: &Machine, opt: &ClassicOptions, (x, y): (f64, f64)) -> String {
    let groups = point_groups(opt);
    let placed = match groups.len() {
        0 => String::new(),
        1 => format!("placed: {} · ", labels::esc(groups[0])),
        _ => {
            let named: Vec<String> = groups
                .iter()
                .enumerate()
                .map(|(i, g)| {
                    let (r, gr, b) = rgb(POINT_COLORS[i % POINT_COLORS.len()]);
                    format!(
                        "<tspan data-legend=\"{0}\" fill=\"rgb({r},{gr},{b})\" font-weight=\"bold\">● {0}</tspan>",
                        labels::esc(g)
                    )
                })
                .collect();
            format!("placed: {} · ", named.join(", "))
        }
    };
    format!(
        "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"middle\" font-family=\"sans-serif\" font-size=\"14.0\" fill=\"rgb(40,40,40)\">{placed}{}</text>\n",
        labels::esc(&format!(
            "measured {} on {}{}",
            m.provenance.time_utc,
            m.provenance.host,
            if m.provenance.quick {
                " (quick probe)"
            } else {
                ""
            }
        ))
    )
}
