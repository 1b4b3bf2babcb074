//! The sweep's charts (`roofline sweep`, SAIH's figures): % of peak against problem size, one
//! line per process count (the trend as data and model grow); strong scaling, speedup and
//! efficiency against processes with the ideal line, one line per problem; and the points on the
//! roofline joined in order of size (the workload's trajectory, `classic_svg` with
//! `ClassicOptions::trajectories`).

use crate::{PlotError, POINT_COLORS};
use plotters::prelude::*;
use roofline_model::placement::Placement;
use roofline_model::sweep::{Scaling, Sweep, SweepPoint};
use roofline_model::Machine;

fn err(e: impl std::fmt::Display) -> PlotError {
    PlotError::Draw(e.to_string())
}

/// "1 thread", "2 threads" (`unit` is the sweep's: threads, or processes).
pub fn count(n: usize, unit: &str) -> String {
    if n == 1 {
        format!("1 {}", unit.strip_suffix('s').unwrap_or(unit))
    } else {
        format!("{n} {unit}")
    }
}

/// The sweep's series: one per process count and model variant (resolution, width, depth),
/// its points' indices into `points` in order of problem size, named by the count and by what
/// varies between the variants ("1 thread, 64×64"). Within one, only the data grows: two
/// variants' points of one size (64 images at 64×64 and 256 at 32×32 are one size) never
/// join into a vertical line.
pub fn series(points: &[SweepPoint], unit: &str) -> Vec<(String, Vec<usize>)> {
    let variant = |p: &SweepPoint| {
        (
            p.problem.resolution.clone(),
            p.problem.width.to_bits(),
            p.problem.depth.clone(),
        )
    };
    let differs = |f: &dyn Fn(&SweepPoint) -> String| points.iter().any(|p| f(p) != f(&points[0]));
    let (res, width, depth) = (
        differs(&|p| p.problem.resolution.clone()),
        differs(&|p| p.problem.width.to_string()),
        differs(&|p| p.problem.depth.clone()),
    );
    // (processes, resolution, width's bits, depth), the name, the points.
    type Key = (usize, (String, u64, String));
    let mut out: Vec<(Key, String, Vec<usize>)> = Vec::new();
    for (i, p) in points.iter().enumerate() {
        let key = (p.problem.processes, variant(p));
        match out.iter_mut().find(|s| s.0 == key) {
            Some(s) => s.2.push(i),
            None => {
                let mut name = count(p.problem.processes, unit);
                if res {
                    name.push_str(&format!(", {}", p.problem.resolution.replace('x', "×")));
                }
                if width {
                    name.push_str(&format!(", width {}", p.problem.width));
                }
                if depth {
                    name.push_str(&format!(", depth {}", p.problem.depth));
                }
                out.push((key, name, vec![i]));
            }
        }
    }
    out.sort_by_key(|s| s.0 .0);
    out.into_iter()
        .map(|(_, name, mut idx)| {
            idx.sort_by(|&a, &b| points[a].problem_flops.total_cmp(&points[b].problem_flops));
            (name, idx)
        })
        .collect()
}

/// % of peak against problem size (training FLOPs per epoch), log x, one line per process
/// (or thread) count and model variant ([`series`]), `unit` naming which.
pub fn trend_svg(points: &[SweepPoint], title: &str, unit: &str) -> Result<String, PlotError> {
    if points.is_empty() {
        return Err(PlotError::Draw("no sweep point to draw".into()));
    }
    let xs = points.iter().map(|p| p.problem_flops.max(1.0));
    let (x0, x1) = (
        xs.clone().fold(f64::INFINITY, f64::min) / 1.5,
        xs.fold(0.0, f64::max) * 1.5,
    );
    let y1 = points
        .iter()
        .map(|p| 100.0 * p.fraction_of_peak)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.15;
    // Values no sweep could have written stop here, not in the axes' tick search.
    let (x0, x1) = crate::checked_range("problem size", (x0, x1))?;
    if !y1.is_finite() {
        return Err(PlotError::Range {
            axis: "% of peak",
            from: 0.0,
            to: y1,
        });
    }
    let mut svg = String::new();
    let mut labels: Vec<crate::labels::Label> = Vec::new();
    let mut lines: Vec<crate::labels::Line> = Vec::new();
    let mut shapes = String::new();
    let area;
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 640)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let mut chart = ChartBuilder::on(&root)
            .caption(title, ("sans-serif", 22))
            .margin(16)
            .x_label_area_size(48)
            .y_label_area_size(70)
            .build_cartesian_2d(
                (x0..x1)
                    .log_scale()
                    .with_key_points(crate::render::log_ticks(x0, x1)),
                0.0..y1,
            )
            .map_err(err)?;
        chart
            .configure_mesh()
            .x_desc("Problem size: training FLOPs per epoch (FLOPs per sample × samples)")
            .y_desc("% of peak")
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .x_label_formatter(&|x| crate::render::tick(*x))
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        // Pixels of a point (log x, linear y), for the labels placed after plotters' text.
        let (xr, yr) = chart.plotting_area().get_pixel_range();
        area = (
            xr.start as f64,
            yr.start as f64,
            xr.end as f64,
            yr.end as f64,
        );
        let px = |x: f64, y: f64| {
            let fx = (x.ln() - x0.ln()) / (x1.ln() - x0.ln());
            (
                xr.start as f64 + fx * (xr.end - xr.start - 1) as f64,
                yr.end as f64 - 1.0 - y / y1 * (yr.end - yr.start - 1) as f64,
            )
        };
        for (i, (own, idx)) in series(points, unit).into_iter().enumerate() {
            let c = POINT_COLORS[i % POINT_COLORS.len()];
            let pts: Vec<(f64, f64)> = idx
                .iter()
                .map(|&k| {
                    let q = &points[k];
                    (q.problem_flops.max(1.0), 100.0 * q.fraction_of_peak)
                })
                .collect();
            // The line is ours (an obstacle for the other lines' labels); the legend's entry
            // plotters'.
            let pix: Vec<(f64, f64)> = pts.iter().map(|&(x, y)| px(x, y)).collect();
            shapes.push_str(&crate::render::polyline(&own, &pix, (c.0, c.1, c.2), 2.0));
            for w in pix.windows(2) {
                lines.push(crate::labels::Line {
                    seg: (w[0], w[1]),
                    own: own.clone(),
                    roof: true,
                });
            }
            chart
                .draw_series(std::iter::empty::<Circle<(f64, f64), i32>>())
                .map_err(err)?
                .label(own.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            chart
                .draw_series(pts.iter().map(|&q| Circle::new(q, 5, c.filled())))
                .map_err(err)?;
            for (&(x, y), k) in pts.iter().zip(&idx) {
                let (sx, sy) = px(x, y);
                let spot = |dx: f64, dy: f64, anchor| crate::labels::Spot {
                    x: sx + dx,
                    y: sy + dy,
                    angle: 0.0,
                    anchor,
                };
                use crate::labels::Anchor::{End, Middle, Start};
                labels.push(crate::labels::Label {
                    text: format!("{y:.1}%"),
                    size: 12.0,
                    color: (c.0, c.1, c.2),
                    bold: false,
                    spots: vec![
                        spot(0.0, -9.0, Middle),
                        spot(8.0, -4.0, Start),
                        spot(0.0, 18.0, Middle),
                        spot(-8.0, -4.0, End),
                        spot(8.0, 12.0, Start),
                        spot(-8.0, 12.0, End),
                    ],
                    avoid_lines: true,
                    owners: vec![(sx, sy)],
                    title: None,
                    unit: None,
                    data: None,
                    // Its own, not the line's: no line strikes through a figure.
                    own: format!("{own} #{k}"),
                });
            }
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    let taken: Vec<crate::labels::Quad> = crate::labels::text_boxes(&svg)
        .into_iter()
        .map(|t| t.1)
        .collect();
    let (placed, _) = crate::labels::place(labels, &taken, &lines, area);
    if let Some(i) = svg.rfind("</svg>") {
        svg.insert_str(i, &format!("{shapes}{}", crate::labels::svg(&placed)));
    }
    Ok(svg)
}

/// Strong scaling: speedup (top, with the ideal p / p₀) and efficiency (bottom) against
/// processes, one line per problem.
pub fn scaling_svg(series: &[Scaling], title: &str, unit: &str) -> Result<String, PlotError> {
    if series.is_empty() {
        return Err(PlotError::Draw(
            "no problem ran at two process counts: nothing to scale".into(),
        ));
    }
    let pmax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.processes))
        .max()
        .unwrap_or(1) as f64;
    let pmin = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.processes))
        .min()
        .unwrap_or(1) as f64;
    let smax = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.speedup))
        .fold(pmax / pmin, f64::max)
        * 1.15;
    // An integer axis of process counts a machine can have; a finite speedup.
    if pmax > 1e7 || !smax.is_finite() {
        return Err(PlotError::Range {
            axis: "processes",
            from: pmin,
            to: pmax.max(smax),
        });
    }
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (1000, 900)).into_drawing_area();
        root.fill(&WHITE).map_err(err)?;
        let root = root.titled(title, ("sans-serif", 22)).map_err(err)?;
        let (top, bottom) = root.split_vertically(450);
        // Whole-number ticks (an integer axis), named by what was swept.
        let pad = ((pmax - pmin) / 10.0).ceil().max(1.0) as i32;
        let xs = (pmin as i32 - pad).max(0)..pmax as i32 + pad;
        let x_desc = {
            let mut c = unit.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        };
        let mut a = ChartBuilder::on(&top)
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xs.clone(), 0.0..smax)
            .map_err(err)?;
        a.configure_mesh()
            .x_desc(x_desc.as_str())
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .x_labels(((pmax - pmin) as usize + 2 * pad as usize).min(12))
            .y_desc("Speedup over the fewest")
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        a.draw_series(DashedLineSeries::new(
            vec![(pmin as i32, 1.0), (pmax as i32, pmax / pmin)],
            6,
            4,
            RGBColor(90, 90, 90).stroke_width(1),
        ))
        .map_err(err)?
        .label("ideal")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], RGBColor(90, 90, 90)));
        let mut b = ChartBuilder::on(&bottom)
            .margin(16)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(xs.clone(), 0.0..1.25f64)
            .map_err(err)?;
        b.configure_mesh()
            .x_desc(x_desc.as_str())
            .label_style(("sans-serif", 16))
            .axis_desc_style(("sans-serif", 18))
            .x_labels(((pmax - pmin) as usize + 2 * pad as usize).min(12))
            .y_desc("Efficiency")
            .light_line_style(RGBColor(235, 235, 235))
            .draw()
            .map_err(err)?;
        for (i, s) in series.iter().enumerate() {
            let c = POINT_COLORS[i % POINT_COLORS.len()];
            let sp: Vec<(i32, f64)> = s
                .points
                .iter()
                .map(|p| (p.processes as i32, p.speedup))
                .collect();
            let ef: Vec<(i32, f64)> = s
                .points
                .iter()
                .map(|p| (p.processes as i32, p.efficiency))
                .collect();
            a.draw_series(LineSeries::new(sp.clone(), c.stroke_width(2)))
                .map_err(err)?
                .label(s.problem.clone())
                .legend(move |(x, y)| {
                    PathElement::new(vec![(x, y), (x + 18, y)], c.stroke_width(2))
                });
            a.draw_series(sp.iter().map(|&q| Circle::new(q, 5, c.filled())))
                .map_err(err)?;
            b.draw_series(LineSeries::new(ef.clone(), c.stroke_width(2)))
                .map_err(err)?;
            b.draw_series(ef.iter().map(|&q| Circle::new(q, 5, c.filled())))
                .map_err(err)?;
        }
        a.configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .label_font(("sans-serif", 16))
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(err)?;
        root.present().map_err(err)?;
    }
    Ok(svg)
}

/// A sweep's charts, each with the suffix of its file: `trend` (% of peak as the problem
/// grows), `scaling` (speedup and efficiency, when points share a problem), `roofline` (every
/// point on `m`'s roofline from its placement, each process count's points joined in order of
/// size; `placements` are the points', in their order).
pub fn charts(
    s: &Sweep,
    placements: &[Placement],
    m: &Machine,
) -> Result<Vec<(&'static str, String)>, PlotError> {
    let mut out = Vec::new();
    out.push((
        "trend",
        trend_svg(
            &s.points,
            &format!("{}: % of peak as the problem grows", s.workload),
            &s.processes,
        )?,
    ));
    if !s.scaling.is_empty() {
        out.push((
            "scaling",
            scaling_svg(
                &s.scaling,
                &format!("{}: strong scaling ({})", s.workload, s.processes),
                &s.processes,
            )?,
        ));
    }
    // The trajectory: every point on the roofline, each process count's points joined in order
    // of size.
    if !placements.is_empty() {
        let mut points = Vec::new();
        let mut trajectories = Vec::new();
        // Each series' points in order of size (the sweep's order need not be), each at its
        // median step's rate: the figure the table prints (the placement's own point is its
        // best step). Coloured by process count, joined within a model variant.
        for (_, idx) in series(&s.points, &s.processes) {
            let mut line = Vec::new();
            for k in idx {
                let Some(pl) = placements.get(k) else {
                    continue;
                };
                let sp = &s.points[k];
                line.push((pl.point.oi.analytic, sp.achieved_flops));
                points.push(crate::PlotPoint {
                    label: format!("#{}", sp.index),
                    group: count(sp.problem.processes, &s.processes),
                    intensity: pl.point.oi.analytic,
                    achieved: sp.achieved_flops,
                    attainable: pl.point.bound.attainable,
                    main: true,
                    share: None,
                    binding: Some(pl.point.bound.ceiling.clone()),
                });
            }
            trajectories.push(line);
        }
        let svg = crate::classic_svg(
            m,
            &crate::ClassicOptions {
                // One thread's roofs only when every point ran on one thread.
                threads: if s.processes == "threads"
                    && placements.iter().all(|p| p.workload.threads <= 1)
                {
                    roofline_model::Threads::T1
                } else {
                    roofline_model::Threads::All
                },
                points,
                trajectories,
                title: Some(format!(
                    "{}: the sweep's points in order of size (#0 smallest)",
                    s.workload
                )),
                ..Default::default()
            },
        )?;
        out.push(("roofline", svg));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_model::sweep::{Problem, ScalingPoint};

    #[test]
    fn the_sweeps_charts_draw_their_series() {
        let p = |images: usize, procs: usize, pct: f64| SweepPoint {
            index: 0,
            problem: Problem {
                images,
                resolution: "32".into(),
                width: 0.25,
                depth: "1,1,1,1".into(),
                processes: procs,
                batch: 16,
            },
            flops_per_sample: 1e9,
            problem_flops: 1e9 * images as f64,
            epoch_seconds: images as f64,
            epochs: None,
            flops_per_step: 1e10,
            step_seconds: 1.0,
            achieved_flops: 1e10,
            per_process_flops: 1e10,
            peak_ceiling: "cpu/conv/f32/all".into(),
            peak_flops: 1e11,
            fraction_of_peak: pct / 100.0,
            analytic_flop_per_byte: 10.0,
            bound: "compute-bound".into(),
            attainable_flops: 1e11,
            io_share: 0.1,
            placement: "p.json".into(),
        };
        let pts = vec![
            p(64, 1, 5.2),
            p(256, 1, 31.0),
            p(1024, 1, 59.6),
            p(64, 2, 4.0),
        ];
        let svg = trend_svg(&pts, "trend", "threads").unwrap();
        assert!(
            svg.contains("59.6%") && svg.contains("\n1 thread\n") && svg.contains("\n2 threads\n")
        );
        assert!(!svg.contains("processes"), "a thread sweep says threads");
        let s = vec![Scaling {
            problem: "64 images".into(),
            points: vec![
                ScalingPoint {
                    processes: 1,
                    step_seconds: 2.0,
                    speedup: 1.0,
                    efficiency: 1.0,
                },
                ScalingPoint {
                    processes: 2,
                    step_seconds: 1.25,
                    speedup: 1.6,
                    efficiency: 0.8,
                },
            ],
        }];
        let svg = scaling_svg(&s, "scaling", "ranks").unwrap();
        assert!(svg.contains("ideal") && svg.contains("64 images") && svg.contains("Efficiency"));
        assert!(svg.contains("\nRanks\n"), "the axis names what was swept");
        // Whole counts on the x axis (an integer axis: "1", "2", never "1.2").
        assert!(svg.contains("\n1\n") && svg.contains("\n2\n"), "{svg}");
        assert!(scaling_svg(&[], "x", "ranks").is_err());
        assert!(trend_svg(&[], "x", "ranks").is_err());
        // 64 images at 64×64 and 256 at 32×32 are one problem size: each resolution its own
        // line, none of them vertical, and no line through a figure (each its own owner).
        let at = |images: usize, res: &str, procs: usize, pct: f64| {
            let mut q = p(images, procs, pct);
            q.problem.resolution = res.into();
            q.flops_per_sample = if res == "64" { 4e9 } else { 1e9 };
            q.problem_flops = q.flops_per_sample * images as f64;
            q
        };
        let grid = vec![
            at(64, "32", 1, 25.8),
            at(256, "32", 1, 23.8),
            at(64, "64", 1, 32.9),
            at(256, "64", 1, 33.8),
            at(64, "32", 2, 15.7),
            at(256, "32", 2, 16.7),
            at(64, "64", 2, 25.3),
            at(256, "64", 2, 19.7),
        ];
        let named: Vec<String> = series(&grid, "threads").into_iter().map(|s| s.0).collect();
        assert_eq!(
            named,
            [
                "1 thread, 32",
                "1 thread, 64",
                "2 threads, 32",
                "2 threads, 64"
            ]
        );
        let svg = trend_svg(&grid, "trend", "threads").unwrap();
        let mut lines = 0;
        for (i, _) in svg.match_indices("<polyline data-own=") {
            let tag = &svg[i..i + svg[i..].find("/>").unwrap()];
            let pts = tag
                .split("points=\"")
                .nth(1)
                .unwrap()
                .split('"')
                .next()
                .unwrap();
            let xs: Vec<f64> = pts
                .split_whitespace()
                .map(|p| p.split(',').next().unwrap().parse().unwrap())
                .collect();
            assert!(xs.windows(2).all(|w| w[1] > w[0] + 1.0), "{tag}");
            lines += 1;
        }
        assert_eq!(lines, 4);
        assert!(svg.contains("data-own=\"1 thread, 32 #1\""), "{svg}");
    }
}
