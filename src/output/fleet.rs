//! The fleet's part of the probe's table: the outliers (nodes short of the fleet's median,
//! with their causes) and the link matrix's slow links and suspect nodes.

use roofline_model::fleet::Fleet;
use roofline_plots::si;

fn figure(v: f64, unit: &str) -> String {
    if unit == "s" {
        format!("{}s", si(v))
    } else {
        format!("{}{unit}", si(v))
    }
}

/// Prints the screening of a distributed probe.
pub fn table(f: &Fleet) {
    outln!(
        "\nfleet: {} nodes, {} ceilings screened against the fleet's median (margin {:.0}% plus each node's own noise)",
        f.nodes,
        f.ceilings.len(),
        100.0 * f.margin
    );
    if f.outliers.is_empty() {
        outln!("outliers: none");
    } else {
        outln!(
            "outliers ({} on {} nodes):",
            f.outliers.len(),
            f.named_nodes().len()
        );
        outln!(
            "  {:<24} {:<28} {:>12} {:>12} {:>8}  causes",
            "node",
            "ceiling",
            "value",
            "median",
            "short"
        );
        for o in &f.outliers {
            let causes: Vec<String> = o.causes.iter().map(|c| c.to_string()).collect();
            outln!(
                "  {:<24} {:<28} {:>12} {:>12} {:>7.0}%  {}",
                format!("{} ({})", o.node, o.host),
                o.id.to_string(),
                figure(o.value, &o.unit),
                figure(o.median, &o.unit),
                100.0 * o.short_by,
                if causes.is_empty() {
                    "none seen by the probe".to_string()
                } else {
                    causes.join("; ")
                }
            );
        }
    }
    for (l, what) in [(&f.links, "links"), (&f.gpu_links, "GPU links (NCCL)")] {
        if let Some(l) = l {
            links(l, what);
        }
    }
}

/// One link matrix's summary line, its slow links and its suspect nodes.
fn links(l: &roofline_model::links::LinkMatrix, what: &str) {
    let again = l.links.iter().filter(|k| k.again.is_some()).count();
    outln!(
        "{what}: {} pairs in {} rounds{} ({:.1} s); median link {} and {} one way{}",
        l.links.len(),
        l.rounds,
        if again > 0 {
            format!(" ({again} of them a slow link measured again, alone)")
        } else {
            String::new()
        },
        l.seconds,
        figure(l.median_bandwidth, "B/s"),
        figure(l.median_latency, "s"),
        if l.links.len() < 3 {
            " (fewer than 3 links: none judged)"
        } else {
            ""
        }
    );
    if let Some(why) = &l.incomplete {
        outln!("  INCOMPLETE: {why}");
    }
    for s in &l.slow {
        outln!(
            "  slow link {} – {}: {} {} against the median {} ({:.0}% {}){}",
            s.host_a,
            s.host_b,
            s.metric.name(),
            figure(s.value, s.metric.unit()),
            figure(s.median, s.metric.unit()),
            100.0 * s.short_by,
            if s.metric.unit() == "s" {
                "above"
            } else {
                "short"
            },
            if l.link(s.a, s.b).is_some_and(|k| k.again.is_some()) {
                "; slow again when measured alone"
            } else {
                ""
            }
        );
    }
    for s in &l.suspects {
        outln!(
            "  node {} ({}): {} of its {} links slow — its own interface, port or driver rather than one cable",
            s.node, s.host, s.slow_links, s.links
        );
    }
}
