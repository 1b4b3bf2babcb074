//! The link matrix as a heat map: one cell per pair of nodes, coloured by the link's bandwidth
//! (its slower direction's median) against the median link — green at or above it, through
//! yellow, to red at half of it or less — slow links outlined, every cell's figures (both
//! directions, latency, round) in its tooltip.

use crate::labels::esc;
use crate::si;
use roofline_model::links::{LinkMatrix, LinkMetric};

/// The colour of a link at `ratio` of the median link's bandwidth.
pub(crate) fn colour(ratio: f64) -> String {
    // 0.5 or less: red; 1 or more: green; yellow between.
    let t = ((ratio - 0.5) / 0.5).clamp(0.0, 1.0);
    let (r, g) = if t < 0.5 {
        (220.0, 60.0 + 2.0 * t * 160.0)
    } else {
        (
            220.0 - 2.0 * (t - 0.5) * 170.0,
            220.0 - 2.0 * (t - 0.5) * 40.0,
        )
    };
    format!("rgb({:.0},{:.0},70)", r, g)
}

/// The heat map of `l`, titled `title`.
pub fn heat_map_svg(l: &LinkMatrix, title: &str) -> String {
    let n = l.hosts.len().max(1);
    let cell = (640.0 / n as f64).clamp(3.0, 36.0);
    // Hosts named beside their rows and above their columns where a 12 px name fits a cell
    // (the smallest text on a figure; the tooltips name them all).
    let labelled = cell >= 14.0;
    let margin_left = if labelled { 150.0 } else { 40.0 };
    let top = if labelled { 150.0 } else { 60.0 };
    // Wide enough for the legend and its note whatever the matrix's size.
    let width = (margin_left + cell * n as f64 + 40.0).max(margin_left + 600.0);
    let height = top + cell * n as f64 + 70.0;
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{width:.0}\" height=\"{height:.0}\" viewBox=\"0 0 {width:.0} {height:.0}\" font-family=\"sans-serif\">\n"
    );
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"20\" font-size=\"14\">{}</text>\n",
        10.0,
        esc(title)
    ));
    s.push_str(&format!(
        "<text x=\"10\" y=\"38\" font-size=\"12\">median link {}B/s, {}s one way; {} links in {} rounds{}</text>\n",
        si(l.median_bandwidth),
        si(l.median_latency),
        l.links.len(),
        l.rounds,
        l.incomplete
            .as_ref()
            .map(|w| format!(" — INCOMPLETE: {}", esc(w)))
            .unwrap_or_default()
    ));
    if labelled {
        for (i, h) in l.hosts.iter().enumerate() {
            let c = margin_left + cell * (i as f64 + 0.5);
            s.push_str(&format!(
                "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\" text-anchor=\"end\" dominant-baseline=\"middle\">{}</text>\n",
                margin_left - 4.0,
                top + cell * (i as f64 + 0.5),
                esc(h)
            ));
            s.push_str(&format!(
                "<text x=\"{c:.1}\" y=\"{:.1}\" font-size=\"12\" transform=\"rotate(-60 {c:.1} {:.1})\" dominant-baseline=\"middle\">{}</text>\n",
                top - 4.0,
                top - 4.0,
                esc(h)
            ));
        }
    }
    for i in 0..n {
        let (x, y) = (margin_left + cell * i as f64, top + cell * i as f64);
        s.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{cell:.1}\" height=\"{cell:.1}\" fill=\"#ddd\"/>\n"
        ));
    }
    for k in &l.links {
        let bw = k.value(LinkMetric::Bandwidth);
        let ratio = if l.median_bandwidth > 0.0 {
            bw / l.median_bandwidth
        } else {
            1.0
        };
        let slow = l.slow.iter().any(|x| x.a == k.a && x.b == k.b);
        let host = |i: usize| l.hosts.get(i).map(String::as_str).unwrap_or("?");
        let tip = format!(
            "{} – {}: {}B/s {} → {}, {}B/s back, latency {}s (median of {} round trips); {:.0}% of the median link; round {}{}",
            host(k.a),
            host(k.b),
            si(k.bandwidth_ab.median),
            host(k.a),
            host(k.b),
            si(k.bandwidth_ba.median),
            si(k.latency.median),
            k.latency.samples,
            100.0 * ratio,
            k.round + 1,
            if slow { "; SLOW" } else { "" }
        );
        // The matrix is symmetric: both cells of the pair.
        for (r, c) in [(k.a, k.b), (k.b, k.a)] {
            s.push_str(&format!(
                "<rect class=\"hit\" x=\"{:.1}\" y=\"{:.1}\" width=\"{cell:.1}\" height=\"{cell:.1}\" fill=\"{}\"{} data-link=\"{}-{}\" data-tip=\"{}\"><title>{}</title></rect>\n",
                margin_left + cell * c as f64,
                top + cell * r as f64,
                colour(ratio),
                if slow {
                    " stroke=\"#000\" stroke-width=\"2\""
                } else {
                    ""
                },
                k.a,
                k.b,
                esc(&tip),
                esc(&tip)
            ));
        }
    }
    let ly = top + cell * n as f64 + 24.0;
    for (i, r) in [0.5, 0.75, 1.0].iter().enumerate() {
        let x = margin_left + 170.0 * i as f64;
        s.push_str(&format!(
            "<rect x=\"{x:.1}\" y=\"{:.1}\" width=\"14\" height=\"14\" fill=\"{}\"/><text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">{}</text>\n",
            ly - 11.0,
            colour(*r),
            x + 18.0,
            ly,
            if *r < 0.6 {
                "≤ 50% of the median".to_string()
            } else {
                format!("{:.0}%", 100.0 * r)
            }
        ));
    }
    s.push_str(&format!(
        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"12\">outlined: slow (short of the median by more than {:.0}% plus its own noise)</text>\n",
        margin_left,
        ly + 20.0,
        100.0 * l.margin
    ));
    s.push_str("</svg>\n");
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use roofline_model::links::{rounds, Link};
    use roofline_model::Stats;

    /// Two cells per link, the slow ones outlined, a tooltip naming both hosts.
    #[test]
    fn a_cell_per_pair_and_the_slow_ones_outlined() {
        let st = |v: f64| Stats::from_samples(&[v, v]).unwrap();
        let links: Vec<Link> = rounds(5)
            .concat()
            .into_iter()
            .map(|(a, b)| Link {
                a,
                b,
                round: 0,
                latency: st(2e-6),
                bandwidth_ab: st(if b == 4 { 2e9 } else { 1e10 }),
                bandwidth_ba: st(1e10),
                again: None,
                in_round: None,
            })
            .collect();
        let hosts: Vec<String> = (0..5).map(|i| format!("node-{i}")).collect();
        let l = LinkMatrix::judge(hosts, "m".into(), 1 << 20, 5, 1.0, links, 0.1);
        assert_eq!(l.slow.len(), 4);
        let svg = heat_map_svg(&l, "links <test>");
        assert_eq!(svg.matches("data-link=").count(), 20);
        assert_eq!(svg.matches("stroke=\"#000\"").count(), 8);
        assert!(svg.contains("node-0 – node-4") && svg.contains("SLOW"));
        assert!(svg.contains("links &lt;test&gt;"));
        assert_eq!(colour(0.2), colour(0.5));
        assert_ne!(colour(0.5), colour(1.0));
    }
}
