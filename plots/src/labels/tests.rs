//! The placer's tests: geometry, contrast, leaders, collisions.

use super::*;

/// Every roof colour's text reads on white (WCAG 4.5:1); a dark colour is kept as it is.
#[test]
fn label_text_reads_on_white() {
    for c in [
        (188, 189, 34),
        (23, 190, 207),
        (255, 127, 14),
        (227, 119, 194),
        (127, 127, 127),
    ] {
        let d = readable(c);
        assert!(
            contrast_on_white(d) >= 4.5,
            "{c:?} → {d:?}: {:.2}",
            contrast_on_white(d)
        );
        assert!(contrast_on_white(c) < 4.5, "{c:?} was light");
    }
    assert_eq!(readable((0, 0, 128)), (0, 0, 128));
}

/// A line grazing a label's estimated edge counts as crossing it (a placement once put a
/// roof label's end 0.1 px past a point's drop line, and the browser saw the crossing); one
/// clear of it by more than the clearance does not.
#[test]
fn a_line_grazing_a_label_crosses_it() {
    let spot = Spot {
        x: 867.0,
        y: 264.3,
        angle: 0.0,
        anchor: Anchor::End,
    };
    let q = quad("GEMM f64 29.3 GFLOP/s", 13.0, &spot);
    let vertical = |x: f64| ((x, 231.1), (x, 507.0));
    let (p, r) = vertical(866.9);
    assert!(grazes(&q, p, r), "0.1 px inside the edge");
    let (p, r) = vertical(868.0);
    assert!(grazes(&q, p, r), "1 px outside: within the clearance");
    assert!(!crosses(&q, p, r), "but it does not cross it");
    let (p, r) = vertical(867.0 + CLEARANCE + 0.5);
    assert!(!grazes(&q, p, r), "clear of it");
}

/// The leader of a score report's roof label ran down the end of another roof's label
/// (both ending at x = 1043): on the estimated edge, so not "crossing" it, and the browser
/// saw the text crossed. A leader keeps the lines' clearance, and even the placer's
/// second rule (half of it) refuses this one (the earlier fallback, not crossing by half a
/// pixel, took it: a CI run's score report, again).
#[test]
fn a_leader_along_a_label_edge_is_refused() {
    let spot = Spot {
        x: 1043.0,
        y: 336.9,
        anchor: Anchor::End,
        angle: 0.0,
    };
    let placed = [quad("FMA f32 428 of 460 GFLOP/s peak", 13.0, &spot)];
    let along = ((1043.0, 298.1), (1043.0, 358.5));
    assert!(!crosses(&placed[0], along.0, along.1));
    assert!(!leader_clear(&placed, along, CLEARANCE / 2.0));
    let clear = (
        (1043.0 + CLEARANCE + 0.5, 298.1),
        (1043.0 + CLEARANCE + 0.5, 358.5),
    );
    assert!(leader_clear(&placed, clear, CLEARANCE));
}

/// A point's label with no free candidate goes out on a leader from the point's marker (a
/// taken box around its owner point, which every leader from it starts inside: no such
/// leader was ever drawn), and, out there, keeps off its own line as well.
#[test]
fn a_leader_starts_inside_its_marker_and_its_label_keeps_off_its_own_line() {
    let (x, y) = (200.0, 150.0);
    let marker = [
        (x - 5.0, y - 5.0),
        (x + 5.0, y - 5.0),
        (x + 5.0, y + 5.0),
        (x - 5.0, y + 5.0),
    ];
    // Its own line runs through the point, level: out on a leader, the text is not on it.
    let own = Line {
        seg: ((0.0, y), (400.0, y)),
        own: "p".into(),
        roof: true,
    };
    let label = Label {
        text: "point p".into(),
        size: 12.0,
        color: (0, 0, 0),
        bold: false,
        // The only candidate is off the area.
        spots: vec![Spot {
            x: 500.0,
            y,
            angle: 0.0,
            anchor: Anchor::Start,
        }],
        avoid_lines: true,
        owners: vec![(x, y)],
        title: None,
        unit: None,
        data: None,
        own: "p".into(),
    };
    let (placed, left_out) = place(
        vec![label],
        &[marker],
        std::slice::from_ref(&own),
        (0.0, 0.0, 400.0, 300.0),
    );
    assert!(left_out.is_empty(), "left out");
    let p = &placed[0];
    assert_eq!(
        p.leader.map(|l| l.0),
        Some((x, y)),
        "a leader from the point"
    );
    let q = quad_of(&p.label.text, p.label.size, false, &p.spot);
    assert!(
        !grazes(&q, own.seg.0, own.seg.1),
        "on its own line: {:?}",
        p.spot
    );
}

#[test]
fn boxes_overlap_by_geometry_and_the_placer_avoids_them() {
    let s = |x: f64, y: f64| Spot {
        x,
        y,
        angle: 0.0,
        anchor: Anchor::Start,
    };
    let a = quad("abcd", 10.0, &s(0.0, 0.0));
    assert!(overlap(&a, &quad("x", 10.0, &s(10.0, 2.0)), 0.5));
    assert!(!overlap(&a, &quad("x", 10.0, &s(30.0, 0.0)), 0.5));
    // A rotated box: 45° up from the origin does not reach (20, 5) below the baseline.
    let r = Spot {
        angle: 45.0,
        ..s(0.0, 0.0)
    };
    assert!(!overlap(
        &quad("abcdefgh", 10.0, &r),
        &quad("x", 10.0, &s(20.0, 12.0)),
        0.5
    ));
    assert!(crosses(&a, (-5.0, -3.0), (30.0, -3.0)));
    assert!(!crosses(&a, (-5.0, 20.0), (30.0, 20.0)));
    let label = |t: &str, spots: Vec<Spot>| Label {
        text: t.into(),
        size: 10.0,
        color: (0, 0, 0),
        bold: false,
        spots,
        avoid_lines: true,
        owners: vec![(50.0, 50.0)],
        title: None,
        unit: None,
        data: None,
        own: t.into(),
    };
    let (placed, left_out) = place(
        vec![
            label("first", vec![s(50.0, 50.0)]),
            label("second", vec![s(52.0, 50.0)]),
        ],
        &[],
        &[],
        (0.0, 0.0, 400.0, 300.0),
    );
    assert_eq!(placed.len(), 2);
    assert!(left_out.is_empty());
    assert!(
        placed[1].leader.is_some(),
        "the second moved out on a leader line"
    );
    let svg = format!("<svg>{}</svg>", svg(&placed));
    assert!(collisions(&svg).is_empty(), "{svg}");
    assert_eq!(text_boxes(&svg).len(), 2);
}
