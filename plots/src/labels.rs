//! Text labels that never collide: each label is a candidate list of positions (anchor point,
//! angle, alignment); the placer takes the first candidate whose box overlaps no placed label
//! and crosses no obstacle segment (the roofs, for labels that are not on a roof), and falls
//! back to a leader line out to a free spot. Boxes are oriented rectangles in pixels, from the
//! text's width in DejaVu Sans (the widest of the common sans-serif faces, and the one a Linux
//! browser picks for `sans-serif`: every other face fits inside); the same estimate reads every
//! `<text>` of an SVG back (`text_boxes`), so that tests can check a whole figure, plotters'
//! own text included. Every line a figure draws is an obstacle ([`Line`]) with an owner: a
//! label is never placed across a line that is not its own (`crate::check` confirms it in a
//! browser).

/// Where a label may go.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Spot {
    /// The text's anchor point (baseline), pixels.
    pub x: f64,
    pub y: f64,
    /// Degrees, counter-clockwise on screen (SVG rotates clockwise: the emitted transform is
    /// its negation).
    pub angle: f64,
    pub anchor: Anchor,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Anchor {
    Start,
    Middle,
    End,
}

impl Anchor {
    fn svg(self) -> &'static str {
        match self {
            Anchor::Start => "start",
            Anchor::Middle => "middle",
            Anchor::End => "end",
        }
    }
}

/// A label to place.
#[derive(Clone, Debug)]
pub struct Label {
    pub text: String,
    pub size: f64,
    pub color: (u8, u8, u8),
    pub bold: bool,
    /// Candidates, best first.
    pub spots: Vec<Spot>,
    /// Whether the roofs (obstacles) may not cross it.
    pub avoid_lines: bool,
    /// The points a leader line may start from when no candidate is free, best first: a
    /// marker's centre; points along a roof. Empty: the first candidate's anchor.
    pub owners: Vec<(f64, f64)>,
    /// A tooltip (SVG `<title>`, and `data-tip` for the interactive page).
    pub title: Option<String>,
    /// Labels placed as one (a stack of roofs' labels, so that they keep the roofs' order):
    /// see [`Unit`].
    pub unit: Option<Unit>,
    /// What it belongs to, as a `data-` attribute (`roof` → a ceiling id, `group` → a placed
    /// workload): the interactive page switches them on and off together.
    pub data: Option<(&'static str, String)>,
    /// The drawn line(s) it labels ([`Line::own`]): only those may touch it. Written as
    /// `data-own`.
    pub own: String,
}

impl Label {
    /// Whether it labels a placed point (`data` "group"), not a roof or a ridge.
    fn is_point(&self) -> bool {
        self.data.as_ref().is_some_and(|(k, _)| *k == "group")
    }
}

/// Consecutive labels with the same unit `id` are set down together, at the first of their
/// `arrangements` (one entry per label) where every label with a spot in it is free there.
/// Those without a spot in it (all of them, where no arrangement is free) are placed after
/// every other label: their own [`Label::spots`] first, then out on a leader.
#[derive(Clone, Debug, PartialEq)]
pub struct Unit {
    pub id: u32,
    pub arrangements: Vec<Option<Spot>>,
}

/// A drawn line, as an obstacle for the labels: its pixels and what it belongs to.
#[derive(Clone, Debug, PartialEq)]
pub struct Line {
    pub seg: Segment,
    pub own: String,
    /// A roof, a measured curve, a series: a line a reader follows, of which a point's leader
    /// crosses at most one band ([`Placer::untangled`]). A point's dotted line up to its
    /// bound and a trajectory are not: a leader may cross those.
    pub roof: bool,
}

/// An oriented rectangle: four corners.
pub type Quad = [(f64, f64); 4];

/// A line segment in pixels.
pub type Segment = ((f64, f64), (f64, f64));

/// A character's advance in DejaVu Sans, in em (Book; Bold is about 12% wider).
fn advance(c: char) -> f64 {
    match c {
        ' ' | ',' | '.' | '·' => 0.3179,
        'i' | 'j' | 'l' | 'I' | 'J' | '\'' | '|' => 0.28,
        ':' | ';' | '/' | '\\' => 0.337,
        'f' | 't' => 0.39,
        '(' | ')' | '[' | ']' | '{' | '}' | 'r' | '-' | '²' => 0.41,
        'm' => 0.974,
        'w' => 0.818,
        'W' => 0.989,
        'M' | '%' | '@' => 0.95,
        '0'..='9' | 'a'..='z' | '$' | '_' | '*' | '?' => 0.636,
        'A'..='Z' | '&' => 0.78,
        _ => 0.84,
    }
}

/// The width of `text` in pixels at font size `size`.
pub fn text_width(text: &str, size: f64, bold: bool) -> f64 {
    let w: f64 = text.chars().map(advance).sum();
    w * size * if bold { 1.12 } else { 1.0 }
}

/// The box of `text` at `spot` in font size `size`.
pub fn quad(text: &str, size: f64, spot: &Spot) -> Quad {
    quad_of(text, size, false, spot)
}

/// The box of `text` (bold or not) at `spot` in font size `size`.
pub fn quad_of(text: &str, size: f64, bold: bool, spot: &Spot) -> Quad {
    let w = text_width(text, size, bold);
    let (h_up, h_down) = (0.8 * size, 0.25 * size);
    let x0 = match spot.anchor {
        Anchor::Start => 0.0,
        Anchor::Middle => -w / 2.0,
        Anchor::End => -w,
    };
    let a = spot.angle.to_radians();
    let (c, s) = (a.cos(), a.sin());
    // Screen y grows downward: a counter-clockwise angle lifts the far end.
    let rot = |u: f64, v: f64| (spot.x + u * c + v * s, spot.y - u * s + v * c);
    [
        rot(x0, -h_up),
        rot(x0 + w, -h_up),
        rot(x0 + w, h_down),
        rot(x0, h_down),
    ]
}

fn project(q: &Quad, axis: (f64, f64)) -> (f64, f64) {
    let d: Vec<f64> = q.iter().map(|p| p.0 * axis.0 + p.1 * axis.1).collect();
    (
        d.iter().cloned().fold(f64::INFINITY, f64::min),
        d.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
    )
}

/// Whether two oriented rectangles overlap (separating axis theorem), by more than `margin`
/// pixels.
pub fn overlap(a: &Quad, b: &Quad, margin: f64) -> bool {
    for q in [a, b] {
        for i in 0..2 {
            let (p, r) = (q[i], q[i + 1]);
            let (ex, ey) = (r.0 - p.0, r.1 - p.1);
            let n = (ex * ex + ey * ey).sqrt().max(1e-12);
            let axis = (-ey / n, ex / n);
            let (a0, a1) = project(a, axis);
            let (b0, b1) = project(b, axis);
            if a1 - margin <= b0 || b1 - margin <= a0 {
                return false;
            }
        }
    }
    true
}

/// Whether two segments cross each other properly (each one's ends on opposite sides of the
/// other; segments that only touch, at a shared owner point, do not cross).
pub fn segments_cross(a: Segment, b: Segment) -> bool {
    let side = |p: (f64, f64), q: (f64, f64), r: (f64, f64)| {
        (q.0 - p.0) * (r.1 - p.1) - (q.1 - p.1) * (r.0 - p.0)
    };
    let eps = 1e-6;
    let (d1, d2) = (side(a.0, a.1, b.0), side(a.0, a.1, b.1));
    let (d3, d4) = (side(b.0, b.1, a.0), side(b.0, b.1, a.1));
    ((d1 > eps && d2 < -eps) || (d1 < -eps && d2 > eps))
        && ((d3 > eps && d4 < -eps) || (d3 < -eps && d4 > eps))
}

/// Whether segment (p, q) crosses the rectangle (by more than half a pixel).
pub fn crosses(quad: &Quad, p: (f64, f64), q: (f64, f64)) -> bool {
    meets(quad, p, q, -0.5)
}

/// Whether segment (p, q) crosses the rectangle or passes within [`CLEARANCE`] of it: how a
/// drawn line and a label it does not own are kept apart (the placer's boxes are estimates of
/// the browser's: a line grazing an estimated edge may cross the drawn text).
pub fn grazes(quad: &Quad, p: (f64, f64), q: (f64, f64)) -> bool {
    meets(quad, p, q, CLEARANCE)
}

/// Whether segment (p, q) comes within `clearance` of the rectangle (a negative clearance: into
/// it by that much).
fn meets(quad: &Quad, p: (f64, f64), q: (f64, f64), clearance: f64) -> bool {
    // The segment as a degenerate rectangle.
    let seg: Quad = [p, q, q, p];
    let (dx, dy) = (q.0 - p.0, q.1 - p.1);
    let n = (dx * dx + dy * dy).sqrt();
    if n < 1e-9 {
        return false;
    }
    // Axes: the rectangle's two edge normals and the segment's normal and direction.
    let mut axes = Vec::new();
    for i in 0..2 {
        let (a, b) = (quad[i], quad[i + 1]);
        let (ex, ey) = (b.0 - a.0, b.1 - a.1);
        let m = (ex * ex + ey * ey).sqrt().max(1e-12);
        axes.push((-ey / m, ex / m));
    }
    axes.push((-dy / n, dx / n));
    axes.push((dx / n, dy / n));
    axes.iter().all(|&ax| {
        let (a0, a1) = project(quad, ax);
        let (b0, b1) = project(&seg, ax);
        a1 > b0 - clearance && b1 > a0 - clearance
    })
}

/// Pixels a line keeps clear of a label it does not own.
pub const CLEARANCE: f64 = 1.5;

/// A placed label.
#[derive(Clone, Debug)]
pub struct Placed {
    pub label: Label,
    pub spot: Spot,
    pub leader: Option<Segment>,
    /// Out on a leader the eye cannot follow ([`crate::order::tangled`]): no spot with a
    /// clean one was left when it was placed.
    pub tangled: bool,
}

/// Places `labels` in order (earlier labels win) inside the `area` (x0, y0, x1, y1), avoiding
/// `taken` boxes (the axes' own text, the markers) and, for labels that ask, every line of
/// `lines` that is not their own, and every leader line drawn before them. A label with no
/// free candidate goes out on a leader line (from one of its owner points) to the nearest free
/// spot whose leader keeps clear of every placed label ([`leader_spot`]); a label with nowhere
/// free is left out (returned in the second list: the caller names it elsewhere). A [`Unit`]'s
/// labels are placed together; those of them left without a row wait until every other label
/// is placed.
///
/// Placing in one order is greedy: a point's label placed after the roofs' may find every
/// spot near it taken, and only a leader across the roofs left (a ResNet-50 placement's
/// cluster of layers, under a stack of roof labels), or no spot at all. Such labels
/// ([`Placed::tangled`], and those left out, each with its [`Unit`]) are placed first next
/// time, after those so moved before (moving the newest to the very front went round in a
/// circle: each label first in turn pushed another out), up to [`ROUNDS`] times; the round
/// with the fewest labels left out, then the fewest tangled, is kept (the earliest of equals).
pub fn place(
    labels: Vec<Label>,
    taken: &[Quad],
    lines: &[Line],
    area: (f64, f64, f64, f64),
) -> (Vec<Placed>, Vec<Label>) {
    // A label's key across rounds: its unit, else its owner and text.
    let key = |l: &Label| match &l.unit {
        Some(u) => (u.id.to_string(), String::new()),
        None => (l.own.clone(), l.text.clone()),
    };
    let mut pinned: Vec<(String, String)> = Vec::new();
    let mut best: Option<(Vec<Placed>, Vec<Label>)> = None;
    let score =
        |r: &(Vec<Placed>, Vec<Label>)| (r.1.len(), r.0.iter().filter(|p| p.tangled).count());
    for _ in 0..ROUNDS {
        // The pinned labels first, in the order pinned (a unit's together, in its order),
        // then the rest in the order given.
        let rank = |l: &Label| {
            pinned
                .iter()
                .position(|k| *k == key(l))
                .unwrap_or(pinned.len())
        };
        let mut order: Vec<(usize, usize, Label)> = labels
            .iter()
            .enumerate()
            .map(|(i, l)| (rank(l), i, l.clone()))
            .collect();
        order.sort_by_key(|o| (o.0, o.1));
        let round = place_in_order(order.into_iter().map(|o| o.2).collect(), taken, lines, area);
        let tangled: Vec<(String, String)> = round
            .0
            .iter()
            .filter(|p| p.tangled)
            .map(|p| &p.label)
            .chain(&round.1)
            .map(key)
            .filter(|k| !pinned.contains(k))
            .collect();
        if best.as_ref().is_none_or(|b| score(&round) < score(b)) {
            best = Some(round);
        }
        if tangled.is_empty() {
            break;
        }
        for k in tangled {
            if !pinned.contains(&k) {
                pinned.push(k);
            }
        }
    }
    best.unwrap_or_default()
}

/// How many orders [`place`] tries.
pub const ROUNDS: usize = 6;

/// [`place`] in the order given.
fn place_in_order(
    labels: Vec<Label>,
    taken: &[Quad],
    lines: &[Line],
    area: (f64, f64, f64, f64),
) -> (Vec<Placed>, Vec<Label>) {
    let mut state = Placer {
        boxes: taken.to_vec(),
        lines: lines.to_vec(),
        drawn: lines.len(),
        area,
    };
    let mut out = Vec::with_capacity(labels.len());
    let (mut left_out, mut deferred) = (Vec::new(), Vec::new());
    let mut rest = labels.into_iter().peekable();
    while let Some(first) = rest.next() {
        let mut unit = vec![first];
        while let (Some(u), Some(next)) = (unit[0].unit.as_ref(), rest.peek()) {
            if next.unit.as_ref().map(|n| n.id) != Some(u.id) {
                break;
            }
            unit.extend(rest.next());
        }
        // A unit's labels at one arrangement together: the first where every label that has
        // a spot in it is free there.
        let arrangement = |l: &Label, t: usize| l.unit.as_ref().and_then(|u| u.arrangements[t]);
        let arrangements = unit
            .iter()
            .map(|l| l.unit.as_ref().map_or(0, |u| u.arrangements.len()))
            .min()
            .unwrap_or(0);
        let together = (0..arrangements).find(|&t| {
            let mut trial: Vec<Quad> = Vec::new();
            unit.iter().all(|l| {
                let Some(s) = arrangement(l, t) else {
                    return true;
                };
                let q = quad_of(&l.text, l.size, l.bold, &s);
                let ok = state.free(l, &s, false) && !trial.iter().any(|b| overlap(&q, b, -1.0));
                trial.push(q);
                ok
            })
        });
        // Those with a spot in it now; the others (all, where none is free) after every
        // other label, on their own candidates or out on a leader: a leader reaches anywhere,
        // where a point's label needs the room beside its point.
        for l in unit {
            match together.and_then(|t| arrangement(&l, t)) {
                Some(s) => state.put(l, (s, None, false), &mut out),
                None if l.unit.is_some() => deferred.push(l),
                None => match state.find(&l) {
                    Some(at) => state.put(l, at, &mut out),
                    None => left_out.push(l),
                },
            }
        }
    }
    for l in deferred {
        match state.find(&l) {
            Some(at) => state.put(l, at, &mut out),
            None => left_out.push(l),
        }
    }
    (out, left_out)
}

/// What [`place`] has placed so far: the boxes taken and the lines drawn (leaders included).
struct Placer {
    boxes: Vec<Quad>,
    /// The figure's lines, then the leaders placed.
    lines: Vec<Line>,
    /// How many of `lines` are the figure's own (the rest are leaders).
    drawn: usize,
    area: (f64, f64, f64, f64),
}

impl Placer {
    /// Whether `l` fits at `s`: inside the area, on no placed box, and off every line it
    /// avoids: those not its own and, out on a leader, its own too (its leader joins them).
    fn free(&self, l: &Label, s: &Spot, on_leader: bool) -> bool {
        let q = quad_of(&l.text, l.size, l.bold, s);
        let a = self.area;
        q.iter()
            .all(|p| p.0 >= a.0 && p.0 <= a.2 && p.1 >= a.1 && p.1 <= a.3)
            && !self.boxes.iter().any(|b| overlap(&q, b, -1.0))
            && !self.lines.iter().any(|k| {
                let avoid = if k.own == l.own {
                    on_leader
                } else {
                    l.avoid_lines
                };
                avoid && grazes(&q, k.seg.0, k.seg.1)
            })
    }

    /// Sets `l` down at `spot` (out on `leader`, `tangled` or not): its box and leader become
    /// obstacles.
    fn put(
        &mut self,
        l: Label,
        (spot, leader, tangled): (Spot, Option<Segment>, bool),
        out: &mut Vec<Placed>,
    ) {
        self.boxes.push(quad_of(&l.text, l.size, l.bold, &spot));
        if let Some(seg) = leader {
            self.lines.push(Line {
                seg,
                own: l.own.clone(),
                roof: false,
            });
        }
        out.push(Placed {
            label: l,
            spot,
            leader,
            tangled,
        });
    }

    /// `l`'s first free candidate, else a spot out on a leader ([`leader_spot`]), and whether
    /// that leader is tangled.
    fn find(&self, l: &Label) -> Option<(Spot, Option<Segment>, bool)> {
        if let Some(s) = l.spots.iter().find(|s| self.free(l, s, false)) {
            return Some((*s, None, false));
        }
        let first = l
            .spots
            .first()
            .map_or((self.area.0, self.area.1), |s| (s.x, s.y));
        let owners = if l.owners.is_empty() {
            vec![first]
        } else {
            l.owners.clone()
        };
        // A leader the eye can follow ([`Placer::untangled`]). A roof's label may go out
        // past other lines to the nearest free spot (its colour and its row name its roof);
        // a point's may not: out past a stack of roofs it could be anyone's (a ResNet-50
        // layer's across 8 roofs), so it is left out, and named under the figure, and its
        // marker's tooltip and the legend's colour name it.
        let point = l.is_point();
        [true, false]
            .into_iter()
            .take(if point { 1 } else { 2 })
            .find_map(|strict| {
                leader_spot(l.size, &owners, self.area, |s, seg, clearance| {
                    self.free(l, s, true)
                        && leader_clear(&self.boxes, seg, clearance)
                        && (!strict || self.untangled(l, seg))
                })
                .map(|(s, seg)| (s, Some(seg), !strict))
            })
    }

    /// Whether a leader for `l` along `seg` reads as its own: it crosses no other leader,
    /// and a placed point's (`data` "group") crosses at most one band of the figure's lines
    /// not its own ([`crate::order::bands_crossed`]: a roof it must reach past), so that the
    /// eye can follow it (a leader across five roofs, or two leaders crossing, could not be
    /// told from another's). A roof's label, out on a leader from its own roof inside a
    /// stack, may cross the stack.
    fn untangled(&self, l: &Label, seg: Segment) -> bool {
        let (figure, leaders) = self.lines.split_at(self.drawn);
        if leaders
            .iter()
            .any(|k| k.own != l.own && segments_cross(k.seg, seg))
        {
            return false;
        }
        let point = l.is_point();
        let others = figure.iter().filter(|k| k.roof && k.own != l.own);
        !point
            || crate::order::bands_crossed(seg, others.map(|k| (k.own.as_str(), k.seg)), 1.0).len()
                <= 1
    }
}

/// Ring spacing and directions per ring of the leader search, pixels.
const RING: f64 = 16.0;
const DIRECTIONS: usize = 48;
/// At most this many owner points are tried (spread over the list): a long roof offers
/// dozens, and every one multiplies the search.
const MAX_OWNERS: usize = 12;

/// The nearest spot for a label of font size `size` on a leader line from one of `owners`, as
/// (spot, leader): on rings of growing radius around each owner, out to the plot area's far
/// corner, the first spot that `ok` accepts with the leader, horizontal text pointing away
/// from the owner. First
/// every ring with a leader clear of every placed box by the lines' clearance, then every
/// ring with half of it; never closer: a leader that only did not cross a box by half a pixel
/// ran down a label's estimated end and crossed the text the browser drew (a score report,
/// twice). Rings of 13 × 16 px around one point at the roof's end (the earlier search) found
/// nothing for a roof whose stretch was crowded by slanted roofs and ridge labels (a CI run's
/// quick probe): the whole area, from points along the roof, is searched.
fn leader_spot(
    size: f64,
    owners: &[(f64, f64)],
    area: (f64, f64, f64, f64),
    ok: impl Fn(&Spot, Segment, f64) -> bool,
) -> Option<(Spot, Segment)> {
    let step = owners.len().div_ceil(MAX_OWNERS).max(1);
    let owners: Vec<(f64, f64)> = owners.iter().step_by(step).copied().collect();
    let reach = owners
        .iter()
        .map(|&(ox, oy)| {
            let dx = (ox - area.0).abs().max((area.2 - ox).abs());
            let dy = (oy - area.1).abs().max((area.3 - oy).abs());
            (dx * dx + dy * dy).sqrt()
        })
        .fold(0.0, f64::max);
    let rings = (reach / RING).ceil() as usize;
    for clearance in [CLEARANCE, CLEARANCE / 2.0] {
        for ring in 1..=rings {
            let r = RING * ring as f64;
            for &(ox, oy) in &owners {
                for k in 0..DIRECTIONS {
                    let t = std::f64::consts::TAU * k as f64 / DIRECTIONS as f64;
                    let (x, y) = (ox + r * t.cos(), oy - r * t.sin());
                    if x < area.0 || x > area.2 || y < area.1 || y > area.3 {
                        continue;
                    }
                    // Text pointing away from the owner, the leader at its side's middle;
                    // steeply above or below it, also centred on the leader, which ends at
                    // the text's near edge (a long label beside a point at the plot's edge
                    // has room only there).
                    let away = if t.cos() >= 0.0 {
                        Anchor::Start
                    } else {
                        Anchor::End
                    };
                    let near_edge = if y > oy {
                        y - 0.8 * size - 1.0
                    } else {
                        y + 0.25 * size + 1.0
                    };
                    let centred = (t.sin().abs() > 0.7).then_some((Anchor::Middle, near_edge));
                    for (anchor, end_y) in [(away, y - 0.3 * size)].into_iter().chain(centred) {
                        let s = Spot {
                            x,
                            y,
                            angle: 0.0,
                            anchor,
                        };
                        let seg = ((ox, oy), (x, end_y));
                        if ok(&s, seg, clearance) {
                            return Some((s, seg));
                        }
                    }
                }
            }
        }
    }
    None
}

/// Whether a leader line keeps `clearance` from every placed box, as drawn lines keep
/// [`CLEARANCE`] from the labels they do not own (a leader run along a label's estimated edge,
/// within half a pixel of it, crossed the text the browser drew). Its first 3 pixels, at its
/// owner point (where a label of the same point may start), are not held to it, nor is a box
/// around the owner point (its marker: a leader from a marker's centre is inside it, and no
/// leader from a ridge or a placed point ever passed).
fn leader_clear(boxes: &[Quad], seg: Segment, clearance: f64) -> bool {
    let ((x0, y0), (x1, y1)) = seg;
    let n = ((x1 - x0).powi(2) + (y1 - y0).powi(2)).sqrt();
    let skip = (2.0 * CLEARANCE).min(n / 2.0) / n.max(1e-9);
    let p = (x0 + (x1 - x0) * skip, y0 + (y1 - y0) * skip);
    !boxes
        .iter()
        .any(|b| !contains(b, seg.0) && meets(b, p, seg.1, clearance))
}

/// Whether point `p` lies in the rectangle.
fn contains(q: &Quad, p: (f64, f64)) -> bool {
    (0..2).all(|i| {
        let (a, b) = (q[i], q[i + 1]);
        let (ex, ey) = (b.0 - a.0, b.1 - a.1);
        let m = (ex * ex + ey * ey).sqrt().max(1e-12);
        let axis = (-ey / m, ex / m);
        let (lo, hi) = project(q, axis);
        let d = p.0 * axis.0 + p.1 * axis.1;
        d >= lo && d <= hi
    })
}

/// ` data-<key>="<value>"`, or nothing.
pub fn data_attr(d: &Option<(&'static str, String)>) -> String {
    d.as_ref()
        .map(|(k, v)| format!(" data-{k}=\"{}\"", esc(v)))
        .unwrap_or_default()
}

/// XML text escaping.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// Relative luminance (WCAG 2) of an sRGB colour.
fn luminance((r, g, b): (u8, u8, u8)) -> f64 {
    let lin = |c: u8| {
        let c = c as f64 / 255.0;
        if c <= 0.039_28 {
            c / 12.92
        } else {
            ((c + 0.055) / 1.055).powf(2.4)
        }
    };
    0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b)
}

/// The contrast ratio (WCAG 2) of a colour against the white background.
pub fn contrast_on_white(c: (u8, u8, u8)) -> f64 {
    1.05 / (luminance(c) + 0.05)
}

/// A label's text colour: its line's colour, darkened (same hue) until it reads on white at
/// WCAG's 4.5:1 for text (a light line colour, olive or cyan, drew text at 2:1).
pub fn readable(c: (u8, u8, u8)) -> (u8, u8, u8) {
    let mut d = c;
    let mut k = 1.0;
    while contrast_on_white(d) < 4.5 && k > 0.0 {
        k -= 0.05;
        let f = |x: u8| (x as f64 * k).round() as u8;
        d = (f(c.0), f(c.1), f(c.2));
    }
    d
}

/// The placed labels as an SVG group (`<g id="labels">`), leader lines first.
pub fn svg(placed: &[Placed]) -> String {
    let mut s = String::from("<g id=\"labels\">\n");
    for p in placed {
        if let Some(((x0, y0), (x1, y1))) = p.leader {
            let (r, g, b) = p.label.color;
            s.push_str(&format!(
                "<line class=\"leader\" data-own=\"{}\" x1=\"{x0:.1}\" y1=\"{y0:.1}\" x2=\"{x1:.1}\" y2=\"{y1:.1}\" stroke=\"rgb({r},{g},{b})\" stroke-width=\"0.8\"{}/>\n",
                esc(&p.label.own),
                data_attr(&p.label.data)
            ));
        }
    }
    for p in placed {
        let (r, g, b) = readable(p.label.color);
        let sp = &p.spot;
        let rotate = if sp.angle.abs() > 1e-6 {
            format!(
                " transform=\"rotate({:.2}, {:.1}, {:.1})\"",
                -sp.angle, sp.x, sp.y
            )
        } else {
            String::new()
        };
        let title = p
            .label
            .title
            .as_ref()
            .map(|t| format!("<title>{}</title>", esc(t)))
            .unwrap_or_default();
        let tip = p
            .label
            .title
            .as_ref()
            .map(|t| format!(" data-tip=\"{}\"", esc(t)))
            .unwrap_or_default();
        s.push_str(&format!(
            "<text class=\"label\" data-own=\"{}\" x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"{}\" font-family=\"sans-serif\" font-size=\"{:.1}\"{} fill=\"rgb({r},{g},{b})\"{rotate}{}{tip}>{title}{}</text>\n",
            esc(&p.label.own),
            sp.x,
            sp.y,
            sp.anchor.svg(),
            p.label.size,
            if p.label.bold { " font-weight=\"bold\"" } else { "" },
            data_attr(&p.label.data),
            esc(&p.label.text)
        ));
    }
    s.push_str("</g>\n");
    s
}

/// Every `<text>` of an SVG as (text, box): our labels' and plotters' (its `dy` baseline
/// shifts and `rotate(a, x, y)` transforms read back), for overlap checks.
pub fn text_boxes(svg: &str) -> Vec<(String, Quad)> {
    let attr = |tag: &str, name: &str| -> Option<String> {
        let k = format!(" {name}=\"");
        let i = tag.find(&k)? + k.len();
        Some(tag[i..].split('"').next()?.to_string())
    };
    let mut out = Vec::new();
    let mut rest = svg;
    while let Some(i) = rest.find("<text") {
        let after = &rest[i..];
        let Some(close) = after.find('>') else { break };
        let tag = &after[..close];
        let Some(end) = after.find("</text>") else {
            break;
        };
        let inner = &after[close + 1..end];
        // Drop a <title> inside; keep the text.
        let text = match inner.find("</title>") {
            Some(t) => &inner[t + 8..],
            None => inner,
        }
        .trim()
        .replace("&apos;", "'")
        .replace("&amp;", "&")
        .replace("&lt;", "<")
        .replace("&gt;", ">")
        .replace("&quot;", "\"");
        rest = &after[end + 7..];
        let num = |n: &str| attr(tag, n).and_then(|v| v.parse::<f64>().ok());
        let (Some(x), Some(mut y), Some(size)) = (num("x"), num("y"), num("font-size")) else {
            continue;
        };
        // plotters' baselines: dy="0.76em" puts the top at y, dy="-0.5ex" the middle.
        match attr(tag, "dy").as_deref() {
            Some("0.76em") => y += 0.76 * size,
            Some("-0.5ex") => y -= 0.25 * size,
            _ => {}
        }
        let anchor = match attr(tag, "text-anchor").as_deref() {
            Some("middle") => Anchor::Middle,
            Some("end") => Anchor::End,
            _ => Anchor::Start,
        };
        let angle = attr(tag, "transform")
            .and_then(|t| {
                t.strip_prefix("rotate(")?
                    .split([',', ')'])
                    .next()?
                    .trim()
                    .parse::<f64>()
                    .ok()
            })
            .map_or(0.0, |a| -a);
        if text.is_empty() {
            continue;
        }
        let spot = Spot {
            x,
            y,
            angle,
            anchor,
        };
        let bold = attr(tag, "font-weight").as_deref() == Some("bold");
        out.push((text.to_string(), quad_of(&text, size, bold, &spot)));
    }
    out
}

/// Pairs of texts of an SVG whose boxes overlap (by more than half a pixel; the placer keeps
/// a pixel of clearance). A text drawn twice at the same place (plotters repeats some log-axis
/// ticks) reads as one.
pub fn collisions(svg: &str) -> Vec<(String, String)> {
    let mut b = text_boxes(svg);
    let key = |t: &(String, Quad)| format!("{}@{:?}", t.0, t.1);
    let mut seen = std::collections::HashSet::new();
    b.retain(|t| seen.insert(key(t)));
    let mut v = Vec::new();
    for i in 0..b.len() {
        for j in i + 1..b.len() {
            if overlap(&b[i].1, &b[j].1, 0.5) {
                v.push((b[i].0.clone(), b[j].0.clone()));
            }
        }
    }
    v
}

#[cfg(test)]
mod tests;
