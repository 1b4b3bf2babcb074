//! Whether a reader matches every flat roof's label with its roof: a label beside a stack of
//! roofs is read by its row (the top roof's label highest), and a label with another roof
//! between it and its own reads as that roof's. [`misread`] lists the labels of an SVG that
//! break either, and [`tangled`] the leader lines a reader cannot follow (the tests run both
//! on every figure they draw).

use crate::labels::{segments_cross, text_boxes, Quad, Segment};

/// A flat roof's label as drawn: its roof's height, its box's centre and horizontal extent.
struct Beside {
    roof: String,
    roof_y: f64,
    centre: f64,
    span: (f64, f64),
}

/// The value of ` name="…"` in a tag.
fn attr<'a>(tag: &'a str, name: &str) -> Option<&'a str> {
    let k = format!(" {name}=\"");
    let i = tag.find(&k)? + k.len();
    tag[i..].split('"').next()
}

fn num(tag: &str, name: &str) -> Option<f64> {
    attr(tag, name)?.parse().ok()
}

/// Every tag of `svg` that starts with `open`, with the rest of the element up to `close`.
fn elements<'a>(svg: &'a str, open: &'a str, close: &'a str) -> impl Iterator<Item = &'a str> {
    svg.match_indices(open).filter_map(move |(i, _)| {
        let end = svg[i..].find(close)? + i + close.len();
        Some(&svg[i..end])
    })
}

fn extent(q: &Quad, axis: usize) -> (f64, f64) {
    q.iter().fold((f64::MAX, f64::MIN), |(lo, hi), p| {
        let v = if axis == 0 { p.0 } else { p.1 };
        (lo.min(v), hi.max(v))
    })
}

/// The labels of `svg`'s flat roofs that a reader would match with the wrong roof: a roof
/// between a label and its own whose label is not on the same side of it, in the same order;
/// or two labels one above the other in the opposite order of their roofs. Labels out on a
/// leader line (which shows what they belong to) and slanted roofs are left out.
pub fn misread(svg: &str) -> Vec<String> {
    let mut roofs: Vec<(String, f64, (f64, f64))> = Vec::new();
    for tag in elements(svg, "<line class=\"roof\"", ">") {
        let (Some(id), Some(x1), Some(y1), Some(x2), Some(y2)) = (
            attr(tag, "data-roof"),
            num(tag, "x1"),
            num(tag, "y1"),
            num(tag, "x2"),
            num(tag, "y2"),
        ) else {
            continue;
        };
        if (y1 - y2).abs() < 0.05 {
            roofs.push((id.to_string(), y1, (x1.min(x2), x1.max(x2))));
        }
    }
    let leadered: Vec<&str> = elements(svg, "<line class=\"leader\"", ">")
        .filter_map(|t| attr(t, "data-own"))
        .collect();
    let mut beside: Vec<Beside> = Vec::new();
    for el in elements(svg, "<text class=\"label\"", "</text>") {
        let Some(own) = attr(el, "data-own") else {
            continue;
        };
        let Some(&(_, roof_y, _)) = roofs.iter().find(|r| r.0 == own) else {
            continue;
        };
        if leadered.contains(&own) || el.contains(" transform=\"rotate(") {
            continue;
        }
        let Some((_, q)) = text_boxes(el).into_iter().next() else {
            continue;
        };
        let (lo, hi) = extent(&q, 1);
        beside.push(Beside {
            roof: own.to_string(),
            roof_y,
            centre: (lo + hi) / 2.0,
            span: extent(&q, 0),
        });
    }
    let overlaps = |a: (f64, f64), b: (f64, f64)| a.0 < b.1 && b.0 < a.1;
    let mut out = Vec::new();
    for l in &beside {
        for (id, y, span) in &roofs {
            let between = (y - l.centre) * (y - l.roof_y) < 0.0;
            if id == &l.roof || !between || !overlaps(*span, l.span) {
                continue;
            }
            // Another roof between them: a stack's, read by the rows, or a misreading.
            let kept = beside.iter().any(|o| {
                &o.roof == id
                    && (o.centre - y) * (l.centre - l.roof_y) > 0.0
                    && (o.centre - l.centre) * (y - l.roof_y) > 0.0
            });
            if !kept {
                out.push(format!(
                    "{}'s label has {id} between it and its roof",
                    l.roof
                ));
            }
        }
        for o in &beside {
            if o.roof != l.roof
                && overlaps(l.span, o.span)
                && o.roof_y > l.roof_y
                && o.centre <= l.centre
            {
                out.push(format!(
                    "{}'s label is above {}'s, whose roof is lower",
                    o.roof, l.roof
                ));
            }
        }
    }
    out
}

/// Every `<line>` of `svg` whose tag starts with `open`: its `data-own` (or `data-roof`) and
/// its segment.
fn lines_of(svg: &str, open: &str) -> Vec<(String, Segment)> {
    elements(svg, open, ">")
        .filter_map(|tag| {
            let own = attr(tag, "data-own").or_else(|| attr(tag, "data-roof"))?;
            let seg = (
                (num(tag, "x1")?, num(tag, "y1")?),
                (num(tag, "x2")?, num(tag, "y2")?),
            );
            Some((own.to_string(), seg))
        })
        .collect()
}

/// The leader lines of `svg` a reader cannot follow to their label: two leaders that cross,
/// and a placed point's leader that crosses more than one band of roofs ([`bands_crossed`]; a
/// roof's own label, out on a leader from inside a stack, may cross the stack).
pub fn tangled(svg: &str) -> Vec<String> {
    let leaders = lines_of(svg, "<line class=\"leader\"");
    let roofs = lines_of(svg, "<line class=\"roof\"");
    let mut out = Vec::new();
    for (i, (a, sa)) in leaders.iter().enumerate() {
        for (b, sb) in &leaders[i + 1..] {
            if a != b && segments_cross(*sa, *sb) {
                out.push(format!("the leaders of {a} and {b} cross"));
            }
        }
        if roofs.iter().any(|(r, _)| r == a) {
            continue;
        }
        let others = roofs.iter().filter(|(r, _)| r != a);
        let bands = bands_crossed(*sa, others.map(|(r, s)| (r.as_str(), *s)), 0.0);
        if bands.len() > 1 {
            let names: Vec<String> = bands.iter().map(|b| b.join(" and ")).collect();
            out.push(format!(
                "the leader of {a} crosses {} roofs: {}",
                bands.len(),
                names.join(", ")
            ));
        }
    }
    out
}

/// Where a leader leaves its point, pixels from the point: a roof crossed this close runs
/// through the point's marker (the largest is 9 px with its rim), and any way out of a point
/// among roofs crosses it.
pub const NEAR: f64 = 10.0;
/// Roofs crossed closer together than this, pixels along the leader, are one band to the eye
/// (ceilings within a few per cent of one another): closer than a line of the labels' text,
/// no label fits between them.
pub const BAND: f64 = 12.0;

/// The lines of `lines` (owner, segment) that the leader `seg` crosses past [`NEAR`] of its
/// start, in order from it, as bands ([`BAND`]): the lines a reader follows it across.
/// `slack` pixels off both make it stricter (the placer's: the SVG's coordinates are
/// rounded to a tenth of a pixel, and a leader it keeps must pass this check read back).
pub fn bands_crossed<'a>(
    seg: Segment,
    lines: impl IntoIterator<Item = (&'a str, Segment)>,
    slack: f64,
) -> Vec<Vec<&'a str>> {
    let ((x0, y0), (x1, y1)) = seg;
    let (dx, dy) = (x1 - x0, y1 - y0);
    let length = (dx * dx + dy * dy).sqrt();
    let mut at: Vec<(f64, &str)> = lines
        .into_iter()
        .filter(|(_, s)| segments_cross(seg, *s))
        .filter_map(|(own, ((a, b), (c, d)))| {
            // seg.0 + t (seg.1 - seg.0) on the line through (a, b) and (c, d).
            let (ex, ey) = (c - a, d - b);
            let den = dx * ey - dy * ex;
            let t = ((a - x0) * ey - (b - y0) * ex) / den;
            (den.abs() > 1e-12 && t * length > NEAR - slack).then_some((t * length, own))
        })
        .collect();
    at.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut bands: Vec<Vec<&str>> = Vec::new();
    let mut last = f64::NEG_INFINITY;
    for (d, own) in at {
        let seen = bands.iter().flatten().any(|o| *o == own);
        match bands.last_mut() {
            Some(band) if d - last < BAND - slack => {
                if !seen {
                    band.push(own);
                }
            }
            _ if seen => {}
            _ => bands.push(vec![own]),
        }
        last = d;
    }
    bands
}

#[cfg(test)]
mod tests {
    use super::{misread, tangled};

    #[test]
    fn crossing_leaders_and_a_leader_across_roofs_are_tangled() {
        let leader = |own: &str, x1: f64, y1: f64, x2: f64, y2: f64| {
            format!("<line class=\"leader\" data-own=\"{own}\" x1=\"{x1}\" y1=\"{y1}\" x2=\"{x2}\" y2=\"{y2}\"/>\n")
        };
        let roofs = roof("gemm", 200.0) + &roof("conv", 210.0) + &roof("f16", 240.0);
        // Two leaders that cross, as layer3.0.downsample.0's and layer4.0.conv1's did.
        let x = leader("a", 400.0, 100.0, 500.0, 150.0) + &leader("b", 400.0, 150.0, 500.0, 100.0);
        assert_eq!(tangled(&x), ["the leaders of a and b cross"]);
        // Side by side, or from one point: followed.
        let apart =
            leader("a", 400.0, 100.0, 500.0, 100.0) + &leader("b", 400.0, 150.0, 500.0, 150.0);
        assert!(tangled(&apart).is_empty());
        let fan = leader("a", 400.0, 100.0, 500.0, 50.0) + &leader("a", 400.0, 100.0, 500.0, 150.0);
        assert!(tangled(&fan).is_empty());
        // Down through the roof stack: f16, then the band of conv and gemm 10 px apart;
        // through one: allowed.
        let deep = roofs.clone() + &leader("p", 600.0, 260.0, 600.0, 150.0);
        assert_eq!(
            tangled(&deep),
            ["the leader of p crosses 2 roofs: f16, conv and gemm"]
        );
        let one = roofs.clone() + &leader("p", 600.0, 260.0, 600.0, 220.0);
        assert!(tangled(&one).is_empty());
        // Roofs 4 px apart are one band; a roof through the point's own marker is left.
        let band = roof("a", 200.0) + &roof("b", 204.0) + &roof("c", 208.0);
        let across = band.clone() + &leader("p", 600.0, 230.0, 600.0, 150.0);
        assert!(tangled(&across).is_empty(), "{:?}", tangled(&across));
        let on = band + &roof("d", 240.0) + &leader("p", 600.0, 202.0, 600.0, 260.0);
        assert!(tangled(&on).is_empty(), "{:?}", tangled(&on));
        let beyond = roofs + &roof("d", 255.0) + &leader("p", 600.0, 202.0, 600.0, 260.0);
        assert_eq!(
            tangled(&beyond),
            ["the leader of p crosses 2 roofs: f16, d"]
        );
    }

    fn roof(id: &str, y: f64) -> String {
        format!("<line class=\"roof\" data-roof=\"{id}\" data-own=\"{id}\" x1=\"300.0\" y1=\"{y:.1}\" x2=\"1000.0\" y2=\"{y:.1}\"/>\n")
    }

    fn label(id: &str, y: f64) -> String {
        format!("<text class=\"label\" data-own=\"{id}\" x=\"990.0\" y=\"{y:.1}\" text-anchor=\"end\" font-family=\"sans-serif\" font-size=\"13.0\">{id} 1 GFLOP/s</text>\n")
    }

    #[test]
    fn a_label_beyond_another_roof_or_out_of_order_is_misread() {
        let roofs = roof("gemm", 200.0) + &roof("conv", 204.0) + &roof("f16", 240.0);
        // Each beside its roof: f16 under its own line, the stack's two above it in order.
        let good =
            roofs.clone() + &label("gemm", 180.0) + &label("conv", 196.0) + &label("f16", 256.0);
        assert_eq!(misread(&good), Vec::<String>::new());
        // The stack's labels below the f16 roof (the report's "GEMM f32 227" under the 176
        // GFLOP/s "GEMM f16" line).
        let below =
            roofs.clone() + &label("gemm", 256.0) + &label("conv", 272.0) + &label("f16", 236.0);
        assert!(
            misread(&below)
                .iter()
                .any(|m| m.contains("has f16 between")),
            "{:?}",
            misread(&below)
        );
        // The stack's rows swapped: the lower roof's label on top.
        let swapped =
            roofs.clone() + &label("conv", 180.0) + &label("gemm", 196.0) + &label("f16", 256.0);
        assert!(misread(&swapped)
            .iter()
            .any(|m| m.contains("conv's label is above gemm's")));
        // Out on a leader, a label may sit anywhere.
        let leader = "<line class=\"leader\" data-own=\"f16\" x1=\"500\" y1=\"240\" x2=\"500\" y2=\"150\"/>\n";
        let far =
            roofs + &label("gemm", 180.0) + &label("conv", 196.0) + &label("f16", 150.0) + leader;
        assert_eq!(misread(&far), Vec::<String>::new());
    }
}
