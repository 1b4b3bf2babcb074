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
    // plotters' own text (axes) and the markers are taken before any label is placed.
    let taken: Vec<labels::Quad> = labels::text_boxes(&svg)
        .into_iter()
        .map(|t| t.1)
        .chain(layer.markers.iter().copied())
        .collect();
    let (placed, left_out) = labels::place(layer.labels, &taken, &layer.lines, layer.area);
    let mut group = format!(
        "<g id=\"shapes\">\n{}</g>\n{}",
        layer.shapes,
        labels::svg(&placed)
    );
    // What found no free place is named under the figure, never drawn across a line; the
    // layers past the figure's share of labels are counted there.
    let mut names: Vec<String> = left_out.iter().map(|l| l.text.clone()).collect();
    match layer.unlabelled {
        0 => {}
        1 => names.push("1 smaller layer".into()),
        n => names.push(format!("{n} smaller layers")),
    }
    if !names.is_empty() {
        group.push_str(&text_svg(
            &format!(
                "not labelled for want of room (hover for each): {}",
                names.join("; ")
            ),
            (16.0, opt.height as f64 - 10.0),
            12.0,
            "start",
        ));
    }
    match svg.rfind("</svg>") {
        Some(i) => svg.insert_str(i, &group),
        None => svg.push_str(&group),
    }
    Ok(svg)
}

/// A plain text of the figure (title, subtitle, footer) as SVG.
fn text_svg(text: &str, (x, y): (f64, f64), size: f64, anchor: &str) -> String {
    format!(
        "<text x=\"{x:.1}\" y=\"{y:.1}\" text-anchor=\"{anchor}\" font-family=\"sans-serif\" font-size=\"{size:.1}\" fill=\"rgb(40,40,40)\">{}</text>\n",
        labels::esc(text)
    )
}

/// A line through `pts` as SVG, owned by `own` (labels other than its own keep off it).
pub(crate) fn polyline(
    own: &str,
    pts: &[(f64, f64)],
    (r, g, b): (u8, u8, u8),
    width: f64,
) -> String {
    let p: Vec<String> = pts.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
    format!(
        "<polyline data-own=\"{}\" points=\"{}\" fill=\"none\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"{width}\"/>\n",
        labels::esc(own),
        p.join(" ")
    )
}

/// Tick positions of a log axis from `lo` to `hi`: 1, 2, 5 (1, 2, 3, 5 on a short axis; the
/// decades alone on a long one) times powers of ten.
pub(crate) fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let decades = (hi / lo).log10();
    let mults: &[f64] = if decades <= 1.3 {
        &[1.0, 2.0, 3.0, 5.0]
    } else if decades <= 3.5 {
        &[1.0, 2.0, 5.0]
    } else {
        &[1.0]
    };
    let mut out = Vec::new();
    for k in lo.log10().floor() as i32..=hi.log10().ceil() as i32 {
        for m in mults {
            let v = m * 10f64.powi(k);
            if v >= lo * (1.0 - 1e-9) && v <= hi * (1.0 + 1e-9) {
                out.push(v);
            }
        }
    }
    out
}

/// A tick's text: the fewest digits that name it, with an SI prefix from a thousand on
/// (0.05, 2, 500, 1 k, 20 G).
pub(crate) fn tick(v: f64) -> String {
    if v < 1000.0 {
        let t = format!("{v:.3}");
        return t.trim_end_matches('0').trim_end_matches('.').to_string();
    }
    const P: [&str; 6] = ["k", "M", "G", "T", "P", "E"];
    let e = ((v.log10() + 1e-9) / 3.0).floor() as i32;
    let e = e.clamp(1, P.len() as i32);
    let m = v / 10f64.powi(3 * e);
    let t = format!("{m:.2}");
    format!(
        "{} {}",
        t.trim_end_matches('0').trim_end_matches('.'),
        P[(e - 1) as usize]
    )
}

/// What `draw` leaves for the label layer: the labels, the roofs as pixel segments, the plot
/// area in pixels.
struct LabelLayer {
    /// The roofs and the placed points, as SVG with `data-roof`/`data-group` and `data-tip`
    /// attributes (drawn here rather than by plotters so that the interactive page can switch
    /// them and show their tooltips).
    shapes: String,
    labels: Vec<labels::Label>,
    lines: Vec<labels::Line>,
    /// The markers (points, ridge dots): no label covers one.
    markers: Vec<labels::Quad>,
    area: (f64, f64, f64, f64),
    /// Layers drawn without a label ([`points::LAYER_LABELS`]): their markers' tooltips name
    /// them.
    unlabelled: usize,
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
        Some(&k) if ["fma", "gemm", "mma", "wgmma", "ert"].contains(&k) => {
            std::iter::once(k.to_uppercase())
                .chain(parts[1..].iter().map(|s| s.to_string()))
                .collect()
        }
        _ => parts.iter().map(|s| s.to_string()).collect(),
    };
    words.join(" ")
}

pub(crate) fn rgb(c: RGBColor) -> (u8, u8, u8) {
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
        "<line class=\"roof\" data-roof=\"{id}\" data-own=\"{id}\" x1=\"{xa:.1}\" y1=\"{ya:.1}\" x2=\"{xb:.1}\" y2=\"{yb:.1}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"{width}\"{dash}/>\n<line class=\"hit\" data-roof=\"{id}\" data-tip=\"{tip}\" x1=\"{xa:.1}\" y1=\"{ya:.1}\" x2=\"{xb:.1}\" y2=\"{yb:.1}\" stroke=\"rgba(0,0,0,0)\" stroke-width=\"10\"><title>{tip}</title></line>\n"
    )
}

/// A placed point as SVG: a dotted line up to its attainable bound (`top`, pixels) with a
/// tick there, and the marker, tagged with its workload.
fn point_shape(
    group: &str,
    own: &str,
    tip: &str,
    (x, y): (f64, f64),
    top: Option<f64>,
    radius: f64,
    (r, g, b): (u8, u8, u8),
) -> String {
    let (group, own, tip) = (labels::esc(group), labels::esc(own), labels::esc(tip));
    let mut s = String::new();
    if let Some(t) = top {
        s.push_str(&format!(
            "<line data-group=\"{group}\" data-own=\"{own}\" x1=\"{x:.1}\" y1=\"{y:.1}\" x2=\"{x:.1}\" y2=\"{t:.1}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"1\" stroke-dasharray=\"3,3\"/>\n<line data-group=\"{group}\" data-own=\"{own}\" x1=\"{:.1}\" y1=\"{t:.1}\" x2=\"{:.1}\" y2=\"{t:.1}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"2\"/>\n",
            x - 6.0,
            x + 6.0
        ));
    }
    s.push_str(&format!(
        "<circle class=\"point\" data-group=\"{group}\" data-tip=\"{tip}\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{radius:.1}\" fill=\"rgb({r},{g},{b})\" stroke=\"white\" stroke-width=\"1\"><title>{tip}</title></circle>\n"
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

mod draw;
mod points;
use draw::draw;
#[cfg(test)]
pub(crate) use points::joined;
