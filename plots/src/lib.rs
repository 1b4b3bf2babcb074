//! SVG rooflines. Knows only the model's types.
//!
//! The classic roofline (log-log, operational intensity in FLOP/byte against FLOP/s): every
//! memory level a slanted roof (bandwidth × intensity) drawn up to the highest compute roof,
//! every compute ceiling a flat roof drawn from where it meets the highest bandwidth roof,
//! theoretical peaks dashed, the ridge points (peak / bandwidth) marked and labelled exactly.

pub mod html;
pub mod labels;
pub mod report;
pub mod sweep;

use plotters::prelude::*;
use roofline_model::{Ceiling, CeilingKind, Machine};

/// Errors of plotting.
#[derive(Debug, thiserror::Error)]
pub enum PlotError {
    #[error("nothing to plot: {0}")]
    Empty(String),
    #[error("drawing failed: {0}")]
    Draw(String),
}

/// What to draw.
#[derive(Clone, Debug)]
pub struct ClassicOptions {
    /// Which roofline: memory (classic), or communication (HPC AI500's COI models).
    pub model: Model,
    /// Whose roofline: `cpu`, or a GPU as `gpu0`, `gpu1`, ... (classic model).
    pub device: String,
    /// Which thread configuration (CPU only): ids ending in `/t1` or `/all`.
    pub threads: String,
    /// Which memory operation's ceilings make the slanted roofs (`triad`, `read`, ...).
    pub op: String,
    pub width: u32,
    pub height: u32,
    /// Workloads placed on the plot (`roofline place`).
    pub points: Vec<PlotPoint>,
    /// Replaces the generated title.
    pub title: Option<String>,
    /// Lines joining points in order (a sweep's trajectory as its problem grows), each a list
    /// of (intensity, FLOP/s).
    pub trajectories: Vec<Vec<(f64, f64)>>,
}

/// A placed workload or layer: drawn at (intensity, achieved) with a tick at the attainable
/// bound above it (a dotted line between them: the headroom).
#[derive(Clone, Debug, PartialEq)]
pub struct PlotPoint {
    pub label: String,
    /// One colour per group (a workload and its layers share it).
    pub group: String,
    /// FLOP/byte (OI for the classic model, COI for the COI models).
    pub intensity: f64,
    pub achieved: f64,
    pub attainable: f64,
    /// The workload itself (a larger marker) rather than one of its layers.
    pub main: bool,
    /// Its share of the step's time (a layer's): the marker's area grows with it.
    pub share: Option<f64>,
    /// The ceiling that binds it (its roof is drawn thicker).
    pub binding: Option<String>,
}

impl Default for ClassicOptions {
    fn default() -> Self {
        ClassicOptions {
            model: Model::Classic,
            device: "cpu".into(),
            threads: "all".into(),
            op: "triad".into(),
            width: 1100,
            height: 760,
            points: Vec::new(),
            title: None,
            trajectories: Vec::new(),
        }
    }
}

/// The rooflines `roofline plot` draws.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Model {
    /// Operational intensity (FLOP per byte of memory traffic): memory roofs.
    Classic,
    /// HPC AI500 V2.0's single-node COI roofline: FLOP per byte communicated; flat roofs are
    /// the node's compute, GEMM and convolution ceilings; slanted roofs its intra-node
    /// communication and its memory bandwidth.
    NodeCoi,
    /// The distributed COI roofline: flat roofs are the aggregate (all nodes) compute
    /// ceilings; slanted roofs the inter-node network, and intra-node communication as the
    /// better ceiling.
    DistCoi,
}

impl Model {
    pub fn parse(s: &str) -> Option<Model> {
        match s {
            "classic" => Some(Model::Classic),
            "node-coi" => Some(Model::NodeCoi),
            "dist-coi" => Some(Model::DistCoi),
            _ => None,
        }
    }
}

/// Whether `c` is a flat roof of the COI model `model`.
fn coi_flat(c: &Ceiling, model: Model) -> bool {
    if c.kind != CeilingKind::Compute || c.unit != "FLOP/s" {
        return false;
    }
    let id = c.id.as_str();
    match model {
        Model::NodeCoi => {
            (id.starts_with("cpu/") && id.ends_with("/all"))
                || (id.starts_with("gpu")
                    && (id.contains("/gemm/") || (id.contains("/conv/") && id.ends_with("/fwd"))))
        }
        Model::DistCoi => {
            id.starts_with("agg/") && (!id.starts_with("agg/cpu/") || id.ends_with("/all"))
        }
        Model::Classic => false,
    }
}

/// Whether `c` is a slanted roof of the COI model `model`.
fn coi_slanted(c: &Ceiling, model: Model, op: &str) -> bool {
    let id = c.id.as_str();
    match model {
        Model::NodeCoi => {
            matches!(
                id,
                "net/allreduce/intra" | "net/p2p/intra/bw" | "net/nccl/allreduce/world"
            ) || (c.kind == CeilingKind::Memory
                && (id == format!("cpu/mem/DRAM/{op}/all")
                    || (id.starts_with("gpu") && id.ends_with(&format!("/mem/HBM/{op}")))))
        }
        Model::DistCoi => matches!(
            id,
            "net/allreduce/inter"
                | "net/p2p/inter/bw"
                | "net/allreduce/intra"
                | "net/nccl/allreduce/world"
        ),
        Model::Classic => false,
    }
}

/// One roof as drawn.
#[derive(Clone, Debug, PartialEq)]
pub struct DrawnRoof {
    pub label: String,
    pub value: f64,
    pub slanted: bool,
    pub dashed: bool,
}

/// A ridge point: where a bandwidth roof meets the top compute roof.
#[derive(Clone, Debug, PartialEq)]
pub struct Ridge {
    pub memory: String,
    pub compute: String,
    /// FLOP/byte
    pub intensity: f64,
    /// FLOP/s
    pub performance: f64,
}

/// The roofs and ridges the classic plot shows, computed from the machine (testable without
/// rendering).
#[derive(Clone, Debug)]
pub struct ClassicModel {
    pub flat: Vec<DrawnRoof>,
    pub slanted: Vec<DrawnRoof>,
    pub ridges: Vec<Ridge>,
    pub x_range: (f64, f64),
    pub y_range: (f64, f64),
}

fn suffix_matches(c: &Ceiling, threads: &str) -> bool {
    c.id.rsplit('/').next() == Some(threads)
}

/// Whether `c` belongs on the chosen device's plot: CPU ceilings of the chosen thread
/// configuration, or a GPU's own ceilings (compute: FMA, mma and GEMM roofs; convolution
/// ceilings stay in the table to keep the plot readable).
fn selected(c: &Ceiling, opt: &ClassicOptions) -> bool {
    if opt.device == "cpu" {
        return c.id.starts_with("cpu/") && suffix_matches(c, &opt.threads);
    }
    let mut parts = c.id.split('/');
    if parts.next() != Some(opt.device.as_str()) {
        return false;
    }
    match c.kind {
        CeilingKind::Compute => matches!(parts.next(), Some("fma" | "mma" | "gemm")),
        CeilingKind::Memory => parts.next() == Some("mem"),
        _ => false,
    }
}

/// The configuration named in the legend and the title.
fn config_name(opt: &ClassicOptions) -> String {
    if opt.device == "cpu" {
        opt.threads.clone()
    } else {
        opt.device.clone()
    }
}

/// Level order for the legend: L1, L2, L3, DRAM.
fn level_rank(level: &str) -> u32 {
    level
        .strip_prefix('L')
        .and_then(|n| n.parse().ok())
        .unwrap_or(100)
}

/// Picks the roofs of the classic plot.
pub fn classic_model(m: &Machine, opt: &ClassicOptions) -> Result<ClassicModel, PlotError> {
    let mut flat: Vec<DrawnRoof> = Vec::new();
    let flat_roof = |c: &Ceiling| match opt.model {
        Model::Classic => c.kind == CeilingKind::Compute && c.unit == "FLOP/s" && selected(c, opt),
        model => coi_flat(c, model),
    };
    for c in m.ceilings.iter().filter(|c| flat_roof(c)) {
        flat.push(DrawnRoof {
            label: c.id.clone(),
            value: c.value,
            slanted: false,
            dashed: false,
        });
        if let Some(p) = &c.theoretical_peak {
            // One dashed roof per precision (GEMM and FMA share the rule's peak; the first
            // ceiling of a precision, the FMA one, gives it).
            let prec = c.precision.clone().unwrap_or_default();
            let label = format!("theoretical {prec} peak ({})", config_name(opt));
            let drawn = flat.iter().any(|r| {
                r.dashed && (r.label == label || (r.value - p.value).abs() <= 1e-9 * p.value)
            });
            if p.unit == "FLOP/s" && !drawn {
                flat.push(DrawnRoof {
                    label,
                    value: p.value,
                    slanted: false,
                    dashed: true,
                });
            }
        }
    }
    let mut mem: Vec<&Ceiling> = m
        .ceilings
        .iter()
        .filter(|c| match opt.model {
            Model::Classic => {
                c.kind == CeilingKind::Memory
                    && selected(c, opt)
                    && c.id.split('/').nth(3) == Some(opt.op.as_str())
            }
            model => coi_slanted(c, model, &opt.op),
        })
        .collect();
    // L1, L2, L3, then DRAM/HBM.
    mem.sort_by_key(|c| level_rank(c.level.as_deref().unwrap_or("")));
    let slanted: Vec<DrawnRoof> = mem
        .iter()
        .map(|c| DrawnRoof {
            label: c.id.clone(),
            value: c.value,
            slanted: true,
            dashed: false,
        })
        .collect();
    if flat.is_empty() && slanted.is_empty() {
        return Err(PlotError::Empty(match opt.model {
            Model::Classic => format!(
                "machine.json has no compute or `{}` memory ceilings for `{}`; run `roofline probe` without --only, or pick --device / --threads / --op",
                opt.op,
                config_name(opt)
            ),
            Model::NodeCoi => "machine.json has no node compute or intra-node communication ceilings; run `mpirun -np 2 roofline probe` (a build with --features mpi)".into(),
            Model::DistCoi => "machine.json has no aggregate or inter-node ceilings; run `roofline probe` under mpirun across two or more nodes".into(),
        }));
    }
    if opt.model == Model::DistCoi && !slanted.iter().any(|r| r.label.contains("inter")) {
        return Err(PlotError::Empty(
            "machine.json has no inter-node communication ceilings: it was probed on one node; run `roofline probe` under mpirun across two or more nodes".into(),
        ));
    }
    // Ridge points against the single-precision peak (HPC AI500's reference precision), or the
    // highest measured compute roof when there is none.
    let measured = || flat.iter().filter(|r| !r.dashed);
    let f32_peak = measured()
        .filter(|r| match opt.model {
            Model::Classic => {
                r.label.starts_with("cpu/fma/f32/") || r.label == format!("{}/fma/f32", opt.device)
            }
            Model::NodeCoi => r.label == "cpu/fma/f32/all",
            Model::DistCoi => r.label == "agg/cpu/fma/f32/all",
        })
        .map(|r| (r.value, r.label.clone()))
        .next();
    let top = f32_peak.or_else(|| {
        measured()
            .map(|r| (r.value, r.label.clone()))
            .fold(None::<(f64, String)>, |a, b| match a {
                Some(a) if a.0 >= b.0 => Some(a),
                _ => Some(b),
            })
    });
    let mut ridges = Vec::new();
    if let Some((peak, label)) = &top {
        for s in &slanted {
            ridges.push(Ridge {
                memory: s.label.clone(),
                compute: label.clone(),
                intensity: peak / s.value,
                performance: *peak,
            });
        }
    }
    // Ranges: around the ridges; FLOP/s from the lowest roof at the left edge to above the top.
    let (mut xmin, mut xmax) = (f64::INFINITY, 0.0f64);
    for r in &ridges {
        xmin = xmin.min(r.intensity);
        xmax = xmax.max(r.intensity);
    }
    if !xmin.is_finite() {
        (xmin, xmax) = (1.0, 1.0);
    }
    for p in opt.points.iter().filter(|p| p.intensity > 0.0) {
        xmin = xmin.min(p.intensity);
        xmax = xmax.max(p.intensity);
    }
    let x_range = (pow10_floor(xmin / 4.0), pow10_ceil(xmax * 4.0));
    let ymax = if flat.is_empty() {
        slanted
            .iter()
            .map(|r| r.value * x_range.1)
            .fold(0.0, f64::max)
    } else {
        flat.iter().map(|r| r.value).fold(0.0, f64::max)
    };
    let ymin = slanted
        .iter()
        .map(|r| r.value * x_range.0)
        .chain(flat.iter().map(|r| r.value))
        .chain(
            opt.points
                .iter()
                .filter(|p| p.achieved > 0.0)
                .map(|p| p.achieved),
        )
        .fold(f64::INFINITY, f64::min);
    let ymax = opt
        .points
        .iter()
        .map(|p| p.achieved.max(p.attainable))
        .fold(ymax, f64::max);
    let y_range = (pow10_floor(ymin / 1.5), pow10_ceil(ymax * 1.5));
    Ok(ClassicModel {
        flat,
        slanted,
        ridges,
        x_range,
        y_range,
    })
}

/// The largest of 1, 2, 5 × 10^k not above `x`.
fn pow10_floor(x: f64) -> f64 {
    let d = 10f64.powf(x.log10().floor());
    [5.0, 2.0, 1.0]
        .into_iter()
        .map(|m| m * d)
        .find(|v| *v <= x * (1.0 + 1e-9))
        .unwrap_or(d)
}
/// The smallest of 1, 2, 5 × 10^k not below `x`.
fn pow10_ceil(x: f64) -> f64 {
    let d = 10f64.powf(x.log10().floor());
    [1.0, 2.0, 5.0, 10.0]
        .into_iter()
        .map(|m| m * d)
        .find(|v| *v >= x * (1.0 - 1e-9))
        .unwrap_or(10.0 * d)
}

/// SI prefix formatting: 1.2e11 → "120 G".
pub fn si(v: f64) -> String {
    let (p, s) = [
        (1e15, "P"),
        (1e12, "T"),
        (1e9, "G"),
        (1e6, "M"),
        (1e3, "k"),
        (1.0, ""),
        (1e-3, "m"),
        (1e-6, "µ"),
        (1e-9, "n"),
    ]
    .into_iter()
    .find(|(p, _)| v.abs() >= *p)
    .unwrap_or((1e-9, "n"));
    let x = v / p;
    let digits = if x >= 100.0 {
        0
    } else if x >= 10.0 {
        1
    } else {
        2
    };
    format!("{x:.digits$} {s}")
}

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
                .find(|c| suffix_matches(c, &opt.threads))
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

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_model::*;

    pub fn machine() -> Machine {
        let stats = |v: f64| Stats::from_samples(&[v]).unwrap();
        let c =
            |id: &str, kind, v: f64, unit: &str, level: Option<&str>, peak: Option<f64>| Ceiling {
                id: id.into(),
                kind,
                value: v,
                unit: unit.into(),
                threads: 2,
                precision: Some("f32".into()),
                level: level.map(String::from),
                stats: stats(v),
                theoretical_peak: peak.map(|p| TheoreticalPeak {
                    value: p,
                    unit: unit.into(),
                    source: "rule".into(),
                    uncertainty: 0.0,
                }),
                above_peak: false,
                method: "test".into(),
                per_iteration: PerIteration {
                    ops: 1.0,
                    bytes: 1.0,
                },
            };
        Machine {
            schema: MACHINE_SCHEMA.into(),
            provenance: Provenance {
                tool: "roofline test".into(),
                git_revision: None,
                command_line: vec![],
                compiler: String::new(),
                libraries: vec![],
                time_utc: "2026-01-01T00:00:00Z".into(),
                host: "h".into(),
                os: "os".into(),
                kernel: "k".into(),
                cpu: CpuInfo {
                    shared_cores: None,
                    vendor: "v".into(),
                    model_name: "Test CPU".into(),
                    family: 0,
                    model: 0,
                    stepping: 0,
                    sockets: 1,
                    cores: 2,
                    logical_cpus: 2,
                    features: vec![],
                    simd: "avx512".into(),
                    caches: vec![],
                    cpuinfo_mhz: None,
                    measured_clock_hz_t1: None,
                    measured_clock_hz_all: None,
                },
                devices: vec![],
                gpus: vec![],
                notes: vec![],
                cluster: None,
                quick: true,
                duration_s: 1.0,
            },
            ceilings: vec![
                c(
                    "cpu/fma/f32/all",
                    CeilingKind::Compute,
                    5e11,
                    "FLOP/s",
                    None,
                    Some(5.1e11),
                ),
                c(
                    "cpu/gemm/f32/all",
                    CeilingKind::Compute,
                    4.5e11,
                    "FLOP/s",
                    None,
                    Some(5.1e11),
                ),
                c(
                    "cpu/fma/int8/all",
                    CeilingKind::Compute,
                    2e12,
                    "OP/s",
                    None,
                    None,
                ),
                c(
                    "cpu/mem/L1/triad/all",
                    CeilingKind::Memory,
                    1e12,
                    "B/s",
                    Some("L1"),
                    None,
                ),
                c(
                    "cpu/mem/DRAM/triad/all",
                    CeilingKind::Memory,
                    5e10,
                    "B/s",
                    Some("DRAM"),
                    None,
                ),
                c(
                    "cpu/mem/DRAM/read/all",
                    CeilingKind::Memory,
                    6e10,
                    "B/s",
                    Some("DRAM"),
                    None,
                ),
                c(
                    "cpu/mem/DRAM/triad/t1",
                    CeilingKind::Memory,
                    3e10,
                    "B/s",
                    Some("DRAM"),
                    None,
                ),
            ],
            curves: vec![],
            tables: vec![],
            nodes: vec![],
        }
    }

    #[test]
    fn roofs_and_exact_ridges() {
        let m = machine();
        let model = classic_model(&m, &ClassicOptions::default()).unwrap();
        assert_eq!(model.slanted.len(), 2, "L1 and DRAM triad of `all`");
        assert_eq!(model.slanted[0].label, "cpu/mem/L1/triad/all");
        // Two measured flat roofs (int8 OP/s is not a FLOP/s roof) and one theoretical.
        assert_eq!(model.flat.iter().filter(|r| !r.dashed).count(), 2);
        assert_eq!(model.flat.iter().filter(|r| r.dashed).count(), 1);
        let dram = model
            .ridges
            .iter()
            .find(|r| r.memory.contains("DRAM"))
            .unwrap();
        assert_eq!(dram.intensity, 5e11 / 5e10);
        assert_eq!(dram.compute, "cpu/fma/f32/all");
        assert!(model.x_range.0 <= 0.5 / 4.0 && model.x_range.1 >= 40.0);
    }

    #[test]
    fn renders_svg_with_axes_units_and_legend() {
        let svg = classic_svg(&machine(), &ClassicOptions::default()).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("Operational intensity [FLOP/byte of memory traffic]"));
        assert!(svg.contains("Performance [FLOP/s]"));
        assert!(svg.contains("cpu/mem/DRAM/triad/all"));
        assert!(svg.contains("DRAM ridge 10.000 FLOP/B"));
        assert!(svg.contains("stroke-dasharray") || svg.contains("theoretical"));
    }

    /// `machine()` with one GPU's ceilings and ERT curve added.
    fn machine_with_gpu() -> Machine {
        let mut m = machine();
        let template = m.ceilings[0].clone();
        let mk = |id: &str, kind, v: f64, level: Option<&str>| {
            let mut c = template.clone();
            c.id = id.into();
            c.kind = kind;
            c.value = v;
            c.unit = if kind == CeilingKind::Memory {
                "B/s"
            } else {
                "FLOP/s"
            }
            .into();
            c.level = level.map(String::from);
            c.theoretical_peak = None;
            c.threads = 1;
            c
        };
        m.ceilings.extend([
            mk("gpu0/fma/f32", CeilingKind::Compute, 6e13, None),
            mk("gpu0/mma/f16", CeilingKind::Compute, 6e14, None),
            mk("gpu0/gemm/f16", CeilingKind::Compute, 7e14, None),
            mk("gpu0/conv/f16/fwd", CeilingKind::Compute, 5e14, None),
            mk("gpu0/mem/L2/triad", CeilingKind::Memory, 1e13, Some("L2")),
            mk("gpu0/mem/HBM/triad", CeilingKind::Memory, 3e12, Some("HBM")),
            mk("gpu0/d2d", CeilingKind::Memory, 2.5e12, None),
        ]);
        m.provenance.gpus.push(GpuInfo {
            index: 0,
            name: "Test GPU".into(),
            ..GpuInfo::default()
        });
        let stats = Stats::from_samples(&[1.0]).unwrap();
        m.curves.push(Curve {
            id: "gpu0/ert/f32".into(),
            x_label: "operational intensity".into(),
            x_unit: "FLOP/B".into(),
            unit: "FLOP/s".into(),
            threads: 1,
            points: [0.25, 1.0, 4.0, 16.0, 64.0]
                .iter()
                .map(|&x| CurvePoint {
                    x,
                    value: (3e12 * x).min(6e13) * 0.9,
                    stats: stats.clone(),
                    level: None,
                })
                .collect(),
        });
        m
    }

    #[test]
    fn gpu_plot_takes_only_that_gpus_roofs() {
        let m = machine_with_gpu();
        let opt = ClassicOptions {
            device: "gpu0".into(),
            ..ClassicOptions::default()
        };
        let model = classic_model(&m, &opt).unwrap();
        let flat: Vec<&str> = model.flat.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(flat, ["gpu0/fma/f32", "gpu0/mma/f16", "gpu0/gemm/f16"]);
        let slanted: Vec<&str> = model.slanted.iter().map(|r| r.label.as_str()).collect();
        assert_eq!(slanted, ["gpu0/mem/L2/triad", "gpu0/mem/HBM/triad"]);
        // Ridges against the GPU's own f32 FMA roof: 6e13 / 3e12 = 20 FLOP/B for HBM.
        let hbm = model
            .ridges
            .iter()
            .find(|r| r.memory == "gpu0/mem/HBM/triad")
            .unwrap();
        assert_eq!(hbm.compute, "gpu0/fma/f32");
        assert!((hbm.intensity - 20.0).abs() < 1e-12);
        // The CPU plot of the same file is unchanged by the GPU's ceilings.
        let cpu = classic_model(&m, &ClassicOptions::default()).unwrap();
        assert!(cpu
            .flat
            .iter()
            .chain(&cpu.slanted)
            .all(|r| r.label.starts_with("cpu/") || r.dashed));
        let svg = classic_svg(&m, &opt).unwrap();
        assert!(svg.contains("Test GPU"));
        assert!(svg.contains("gpu0/ert/f32 (measured"));
    }

    #[test]
    fn coi_models_take_communication_roofs() {
        let mut m = machine();
        let template = m.ceilings[0].clone();
        let mk = |id: &str, kind, v: f64, unit: &str| {
            let mut c = template.clone();
            c.id = id.into();
            c.kind = kind;
            c.value = v;
            c.unit = unit.into();
            c.theoretical_peak = None;
            c
        };
        m.ceilings.extend([
            mk("net/allreduce/intra", CeilingKind::Comm, 1e10, "B/s"),
            mk("net/allgather/intra", CeilingKind::Comm, 2e10, "B/s"),
            mk("net/p2p/intra/latency", CeilingKind::Comm, 1e-6, "s"),
        ]);
        let node = ClassicOptions {
            model: Model::NodeCoi,
            ..ClassicOptions::default()
        };
        let model = classic_model(&m, &node).unwrap();
        let mut slanted: Vec<&str> = model.slanted.iter().map(|r| r.label.as_str()).collect();
        slanted.sort_unstable();
        assert_eq!(slanted, ["cpu/mem/DRAM/triad/all", "net/allreduce/intra"]);
        let flat: Vec<&str> = model
            .flat
            .iter()
            .filter(|r| !r.dashed)
            .map(|r| r.label.as_str())
            .collect();
        assert_eq!(flat, ["cpu/fma/f32/all", "cpu/gemm/f32/all"]);
        // COI ridge of intra-node allreduce against the f32 peak: 5e11 / 1e10 = 50 FLOP/B.
        let r = model
            .ridges
            .iter()
            .find(|r| r.memory == "net/allreduce/intra")
            .unwrap();
        assert!((r.intensity - 50.0).abs() < 1e-9);
        assert!(classic_svg(&m, &node).unwrap().contains("COI"));
        // No inter-node ceilings: the distributed model refuses with a reason.
        let dist = ClassicOptions {
            model: Model::DistCoi,
            ..ClassicOptions::default()
        };
        assert!(matches!(classic_model(&m, &dist), Err(PlotError::Empty(_))));
        m.ceilings.push(mk(
            "agg/cpu/fma/f32/all",
            CeilingKind::Compute,
            1e12,
            "FLOP/s",
        ));
        m.ceilings
            .push(mk("net/allreduce/inter", CeilingKind::Comm, 2e9, "B/s"));
        let model = classic_model(&m, &dist).unwrap();
        let mut slanted: Vec<&str> = model.slanted.iter().map(|r| r.label.as_str()).collect();
        slanted.sort_unstable();
        assert_eq!(slanted, ["net/allreduce/inter", "net/allreduce/intra"]);
        let r = model
            .ridges
            .iter()
            .find(|r| r.memory == "net/allreduce/inter")
            .unwrap();
        assert_eq!(r.compute, "agg/cpu/fma/f32/all");
        assert!((r.intensity - 500.0).abs() < 1e-9);
    }

    #[test]
    fn nothing_to_plot_is_an_error() {
        let mut m = machine();
        m.ceilings.clear();
        assert!(matches!(
            classic_svg(&m, &ClassicOptions::default()),
            Err(PlotError::Empty(_))
        ));
    }

    #[test]
    fn ranges_snap_to_1_2_5() {
        assert_eq!(pow10_floor(0.0999), 0.05);
        assert_eq!(pow10_floor(0.1), 0.1);
        assert_eq!(pow10_floor(3.7e9), 2e9);
        assert_eq!(pow10_ceil(1.13e12 * 1.5), 2e12);
        assert_eq!(pow10_ceil(6e3), 1e4);
    }

    #[test]
    fn si_prefixes() {
        assert_eq!(si(1.2e11), "120 G");
        assert_eq!(si(2.5e9), "2.50 G");
        assert_eq!(si(0.25), "250 m");
    }
}
