//! The GPU matrix's part of the probe's table: one-way copies between every ordered pair of
//! GPUs by the copy engine and by the SMs, and the host to and from each GPU, each with the
//! fraction of its NVLink or PCIe figure (`roofline plot --model gpus` draws it).

use roofline_model::ceiling_id::{GpuCopy, PeerCopy};
use roofline_model::gpu_matrix::{Entry, GpuMatrix};
use roofline_plots::si;

/// `12.3 GB/s 96%` (the fraction where a figure is known), `-` where not measured.
fn cell(e: Option<&Entry>) -> String {
    match e {
        None => "-".into(),
        Some(e) => match e.fraction() {
            Some(f) => format!("{}B/s {:.0}%", si(e.value), 100.0 * f),
            None => format!("{}B/s", si(e.value)),
        },
    }
}

/// The matrix as text lines.
pub fn lines(m: &GpuMatrix) -> Vec<String> {
    let mut out = vec![String::new()];
    out.push("GPU copies, one way (rows from, columns to; % of the NVLink or PCIe figure):".into());
    let header: String = m
        .gpus
        .iter()
        .map(|g| format!("{:>20}", format!("gpu{g}")))
        .collect();
    for (how, name) in [(PeerCopy::Engine, "copy engine"), (PeerCopy::Sm, "SMs")] {
        if !m.peers.iter().any(|p| p.2 == how) {
            continue;
        }
        out.push(format!("  {name:<12}{header}"));
        for a in &m.gpus {
            let row: String = m
                .gpus
                .iter()
                .map(|b| {
                    let c = if a == b {
                        "".into()
                    } else {
                        cell(m.peer(*a, *b, how))
                    };
                    format!("{c:>20}")
                })
                .collect();
            out.push(format!("  {:<12}{row}", format!("gpu{a}")));
        }
    }
    if !m.host.is_empty() {
        out.push(format!(
            "  {:<12}{:>20}{:>20}",
            "host", "host → gpu", "gpu → host"
        ));
        for g in &m.gpus {
            out.push(format!(
                "  {:<12}{:>20}{:>20}",
                format!("gpu{g}"),
                cell(m.host(*g, GpuCopy::H2d)),
                cell(m.host(*g, GpuCopy::D2h))
            ));
        }
    }
    out
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
            peak.map(|p| (p, "PCIe")),
        )
    }

    #[test]
    fn rows_from_columns_to_and_the_host() {
        let m = GpuMatrix::of(&[
            copy("gpu0-gpu1/p2p", 360e9, Some(450e9)),
            copy("gpu1-gpu0/p2p", 180e9, Some(450e9)),
            copy("gpu0/h2d", 55e9, Some(64e9)),
        ])
        .unwrap();
        let t = lines(&m).join("\n");
        assert!(t.contains("copy engine"), "{t}");
        assert!(!t.contains("SMs"), "no SM copies measured: {t}");
        let row1 = t
            .lines()
            .find(|l| l.trim_start().starts_with("gpu1") && l.contains("180"))
            .unwrap();
        assert!(row1.contains("180 GB/s 40%"), "{row1}");
        assert!(
            t.contains("55.0 GB/s 86%") && t.contains("host → gpu"),
            "{t}"
        );
    }
}
