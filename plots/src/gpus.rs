//! A node's GPU matrix as a heat map: the copy engines' and the SMs' one-way copies between
//! every ordered pair of GPUs (rows: from, columns: to), and the host to and from each GPU,
//! each cell coloured by the fraction of its NVLink or PCIe figure it reached (green at the
//! figure, through yellow, to red at half of it or less; blue-grey where no figure is known),
//! its rate written in it and its figures in its tooltip.

use crate::labels::esc;
use crate::links::colour;
use crate::si;
use roofline_model::ceiling_id::{GpuCopy, PeerCopy};
use roofline_model::gpu_matrix::{Entry, GpuMatrix};

const CELL: f64 = 64.0;
const NO_FIGURE: &str = "rgb(150,165,185)";

/// One cell at (`x`, `y`): `entry`'s rate, coloured by its fraction of the figure.
fn cell(s: &mut String, x: f64, y: f64, what: &str, entry: Option<&Entry>) {
    let Some(e) = entry else {
        s.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{CELL}\" height=\"{CELL}\" fill=\"#eee\" stroke=\"#fff\"/>\n"
        ));
        return;
    };
    let fill = e.fraction().map_or(NO_FIGURE.to_string(), colour);
    let of_figure = match (e.fraction(), &e.source) {
        (Some(f), Some(src)) => format!(
            "{:.0}% of {}B/s ({})",
            100.0 * f,
            si(e.peak.unwrap_or(0.0)),
            src
        ),
        _ => "no NVLink or PCIe figure known".to_string(),
    };
    let tip = format!("{what}: {}B/s, {of_figure}", si(e.value));
    s.push_str(&format!(
        "<rect class=\"hit\" x=\"{x:.1}\" y=\"{y:.1}\" width=\"{CELL}\" height=\"{CELL}\" fill=\"{fill}\" stroke=\"#fff\" data-cell=\"{}\" data-tip=\"{}\"><title>{}</title></rect>\n",
        esc(what),
        esc(&tip),
        esc(&tip)
    ));
    let pct = e
        .fraction()
        .map(|f| format!("{:.0}%", 100.0 * f))
        .unwrap_or_default();
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" pointer-events=\"none\">{}B/s</text>\n<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\" pointer-events=\"none\">{pct}</text>\n",
        x + CELL / 2.0,
        y + CELL / 2.0 - 2.0,
        si(e.value),
        x + CELL / 2.0,
        y + CELL / 2.0 + 12.0
    ));
}

/// The heat map of `m`, titled `title`.
pub fn matrix_svg(m: &GpuMatrix, title: &str) -> String {
    let n = m.gpus.len().max(1);
    let (left, top) = (70.0, 110.0);
    let panel = CELL * n as f64;
    let gap = 40.0;
    // Copy engine, SMs, then the host's two columns.
    let xs = [left, left + panel + gap, left + 2.0 * (panel + gap)];
    let width = xs[2] + 2.0 * CELL + 30.0;
    let height = top + panel + 80.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\">\n"
    );
    s.push_str(&format!(
        "<text x=\"10\" y=\"20\" font-size=\"14\">{}</text>\n<text x=\"10\" y=\"38\" font-size=\"12\">one-way copies, rows from, columns to: by the copy engine (cuMemcpyPeerAsync),</text>\n<text x=\"10\" y=\"53\" font-size=\"12\">by the SMs (a kernel storing into the peer), and from (h2d) and to (d2h) pinned host memory;</text>\n<text x=\"10\" y=\"68\" font-size=\"12\">each cell against its NVLink or PCIe figure</text>\n",
        esc(title)
    ));
    for (x, heading) in [(xs[0], "copy engine"), (xs[1], "SMs"), (xs[2], "host")] {
        s.push_str(&format!(
            "<text x=\"{x:.1}\" y=\"{:.1}\" font-size=\"12\">{heading}</text>\n",
            top - 30.0
        ));
    }
    for (i, g) in m.gpus.iter().enumerate() {
        let y = top + CELL * i as f64;
        s.push_str(&format!(
            "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\" dominant-baseline=\"middle\">gpu{g}</text>\n",
            left - 6.0,
            y + CELL / 2.0
        ));
        for (p, how) in [PeerCopy::Engine, PeerCopy::Sm].into_iter().enumerate() {
            for (j, h) in m.gpus.iter().enumerate() {
                let x = xs[p] + CELL * j as f64;
                if i == 0 {
                    s.push_str(&format!(
                        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">gpu{h}</text>\n",
                        x + CELL / 2.0,
                        top - 8.0
                    ));
                }
                if g == h {
                    s.push_str(&format!(
                        "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{CELL}\" height=\"{CELL}\" fill=\"#ddd\" stroke=\"#fff\"/>\n"
                    ));
                    continue;
                }
                let what = format!(
                    "gpu{g} → gpu{h} by the {}",
                    if how == PeerCopy::Engine {
                        "copy engine"
                    } else {
                        "SMs"
                    }
                );
                cell(&mut s, x, y, &what, m.peer(*g, *h, how));
            }
        }
        for (j, (dir, label)) in [(GpuCopy::H2d, "h2d"), (GpuCopy::D2h, "d2h")]
            .into_iter()
            .enumerate()
        {
            let x = xs[2] + CELL * j as f64;
            if i == 0 {
                s.push_str(&format!(
                    "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"middle\">{label}</text>\n",
                    x + CELL / 2.0,
                    top - 8.0
                ));
            }
            let what = match dir {
                GpuCopy::H2d => format!("host → gpu{g}"),
                _ => format!("gpu{g} → host"),
            };
            cell(&mut s, x, y, &what, m.host(*g, dir));
        }
    }
    let ly = top + panel + 30.0;
    for (i, r) in [0.5, 0.75, 1.0].iter().enumerate() {
        let x = left + 150.0 * i as f64;
        s.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"14\" height=\"14\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{ly:.1}\" font-size=\"12\">{}</text>\n",
            ly - 11.0,
            colour(*r),
            x + 18.0,
            if *r < 0.6 { "≤ 50% of the figure".to_string() } else { format!("{:.0}%", 100.0 * r) }
        ));
    }
    s.push_str(&format!(
        "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"14\" height=\"14\" fill=\"{NO_FIGURE}\"/><text x=\"{:.1}\" y=\"{ly:.1}\" font-size=\"12\">no figure known</text>\n",
        left + 450.0,
        ly - 11.0,
        left + 468.0
    ));
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_model::gpu_matrix::one_sample_copy;
    use roofline_model::{Ceiling, CeilingId};

    fn copy(id: &str, value: f64, peak: Option<f64>) -> Ceiling {
        one_sample_copy(
            CeilingId::parse(id).unwrap(),
            value,
            peak.map(|p| (p, "NVLink <4>")),
        )
    }

    /// Two GPUs: every measured one-way copy a cell, the diagonal and what was not measured
    /// blank, the host's columns, each cell's rate and fraction written.
    #[test]
    fn a_cell_per_copy_each_against_its_figure() {
        let m = GpuMatrix::of(&[
            copy("gpu0-gpu1/p2p", 360e9, Some(450e9)),
            copy("gpu1-gpu0/p2p", 180e9, Some(450e9)),
            copy("gpu0-gpu1/p2p/sm", 400e9, Some(450e9)),
            copy("gpu0/h2d", 55e9, Some(64e9)),
            copy("gpu0/d2h", 52e9, Some(64e9)),
            copy("gpu1/h2d", 25e9, None),
        ])
        .unwrap();
        let svg = matrix_svg(&m, "gpus <test>");
        assert_eq!(svg.matches("data-cell=").count(), 6);
        assert!(
            svg.contains(
                "gpu1 → gpu0 by the copy engine: 180 GB/s, 40% of 450 GB/s (NVLink &lt;4&gt;)"
            ),
            "{svg}"
        );
        assert!(
            svg.contains("host → gpu1: 25.0 GB/s, no NVLink or PCIe figure known"),
            "{svg}"
        );
        assert!(svg.contains(&colour(0.4)) && svg.contains(NO_FIGURE));
        assert!(svg.contains("gpus &lt;test&gt;"));
    }
}
