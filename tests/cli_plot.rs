//! End-to-end tests of the `roofline` binary: `plot`: every plot kind of a machine, labels that never overlap, the interactive page.

mod common;

use common::*;
use std::process::Command;

#[test]
fn plot_draws_the_machine() {
    let (path, _) = quick_machine();
    let dir = tmpdir("plot");
    let svg = dir.join("r.svg");
    let o = bin()
        .arg("plot")
        .arg(path)
        .arg("-o")
        .arg(&svg)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let text = std::fs::read_to_string(&svg).unwrap();
    assert!(
        text.contains("<svg") && text.contains("cpu/mem/DRAM/triad/all") && text.contains("ridge")
    );
    let o = bin()
        .arg("plot")
        .arg(path)
        .args(["--threads", "t1", "--op", "read", "-o"])
        .arg(dir.join("t1.svg"))
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(std::fs::read_to_string(dir.join("t1.svg"))
        .unwrap()
        .contains("cpu/mem/DRAM/read/t1"));
    // A COI roofline needs communication ceilings: one process measured none.
    expect_input_error(
        &[
            "plot",
            path.to_str().unwrap(),
            "--model",
            "node-coi",
            "-o",
            "/tmp/nc.svg",
        ],
        None,
        "no communication ceilings",
    );
    // Every roof named on the plot with its value, no two texts overlapping, none crossed by
    // a line not its own, in every plot kind a single machine has (in Chromium).
    for model in ["classic", "hierarchical"] {
        let f = dir.join(format!("{model}.svg"));
        let o = bin()
            .arg("plot")
            .arg(path)
            .args(["--model", model, "-o"])
            .arg(&f)
            .output()
            .unwrap();
        assert!(o.status.success(), "{model}: {}", stderr(&o));
        let svg = std::fs::read_to_string(&f).unwrap();
        let clash = roofline_plots::labels::collisions(&svg);
        assert!(clash.is_empty(), "{model}: overlapping labels {clash:?}");
        let texts: Vec<String> = roofline_plots::labels::text_boxes(&svg)
            .into_iter()
            .map(|t| t.0)
            .collect();
        assert_figures_fit(&[&f]);
        for name in ["L1 triad", "DRAM triad", "FMA f32", "GEMM f32"] {
            assert!(
                texts
                    .iter()
                    .any(|t| t.starts_with(name) && t.contains("/s")),
                "{model}: no label for {name} in {texts:?}"
            );
        }
        assert!(
            texts.iter().any(|t| t.starts_with("measured ")),
            "{model}: the subtitle"
        );
    }
}

/// `plot -o roofline.html`: one self-contained page with the figure, a switch per roof and per
/// placed workload, and tooltips; in headless Chromium (Debian's chromium; .ci/run installs
/// it) the page's self-check shows a tooltip naming a ceiling with its samples, switches a roof
/// off, and finds no two labels overlapping as the browser lays them out.
#[test]
fn plot_writes_an_interactive_page() {
    let (machine, _) = quick_machine();
    let dir = tmpdir("html");
    let page = dir.join("roofline.html");
    let o = bin()
        .arg("plot")
        .arg(machine)
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.contains("<svg"));
    assert!(
        !html.contains("src=\"http") && !html.contains("<link") && !html.contains("href=\"http"),
        "no external asset"
    );
    assert!(html.contains("data-key=\"roof\" data-value=\"cpu/mem/DRAM/triad/all\""));
    assert!(html.matches("data-tip=").count() > 10);
    let Some(chrome) = chromium("the browser check") else {
        return;
    };
    let dom = Command::new(chrome)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}#selftest", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    let body = dom
        .find("<body")
        .map(|i| &dom[i..i + dom[i..].find('>').unwrap_or(0)])
        .unwrap_or("");
    assert!(body.contains("data-overlaps=\"0\""), "{body}");
    assert!(body.contains("data-crossed=\"0\""), "{body}");
    assert!(body.contains("samples, cv"), "the tooltip shows: {body}");
    assert!(
        body.contains("data-switched=\"cpu/"),
        "a roof switched off: {body}"
    );
}

/// `plot --model gpus`: a CPU-only machine has no GPU matrix (one line, exit 2); with GPU copy
/// ceilings (written into the quick machine here: no GPU runs the tests) every one-way copy
/// is a cell against its figure, and the page passes the browser's figure check.
#[test]
fn plot_draws_the_gpu_matrix() {
    let (path, _) = quick_machine();
    let dir = tmpdir("gpus");
    expect_input_error(
        &[
            "plot",
            path.to_str().unwrap(),
            "--model",
            "gpus",
            "-o",
            dir.join("none.svg").to_str().unwrap(),
        ],
        None,
        "has no GPU copies",
    );
    expect_input_error(
        &[
            "plot",
            path.to_str().unwrap(),
            "--model",
            "gpu-links",
            "-o",
            dir.join("none.svg").to_str().unwrap(),
        ],
        None,
        "has no GPU link matrix",
    );
    let mut m = roofline_model::Machine::read(path).unwrap();
    let copy = |id: &str, value: f64, peak: Option<f64>| {
        roofline_model::Ceiling::measured(
            roofline_model::CeilingId::parse(id).unwrap(),
            roofline_model::CeilingKind::Comm,
            "B/s",
            1,
            roofline_model::Stats::from_samples(&[value * 0.98, value]).unwrap(),
            roofline_model::PerIteration {
                ops: 0.0,
                bytes: 1.0,
            },
            "test".into(),
        )
        .with_peak(peak.map(|p| roofline_model::TheoreticalPeak {
            value: p,
            unit: "B/s".into(),
            source: "NVLink 4".into(),
            uncertainty: 0.0,
        }))
    };
    for (a, b) in [(0, 1), (1, 0), (0, 2), (2, 0), (1, 2), (2, 1)] {
        let slow = if (a, b) == (2, 1) { 0.4 } else { 0.9 };
        m.ceilings.push(copy(
            &format!("gpu{a}-gpu{b}/p2p"),
            450e9 * slow,
            Some(450e9),
        ));
        m.ceilings
            .push(copy(&format!("gpu{a}-gpu{b}/p2p/sm"), 400e9, Some(450e9)));
    }
    for g in 0..3 {
        m.ceilings
            .push(copy(&format!("gpu{g}/h2d"), 55e9, Some(64e9)));
        m.ceilings.push(copy(&format!("gpu{g}/d2h"), 50e9, None));
    }
    let gpus = dir.join("gpus.json");
    std::fs::write(&gpus, serde_json::to_string(&m).unwrap()).unwrap();
    let page = dir.join("gpus.html");
    let o = bin()
        .arg("plot")
        .arg(&gpus)
        .args(["--model", "gpus", "-o"])
        .arg(&page)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    let html = std::fs::read_to_string(&page).unwrap();
    assert_eq!(html.matches("data-cell=").count(), 6 + 6 + 6);
    assert!(html.contains("gpu2 → gpu1 by the copy engine: 180 GB/s, 40% of 450 GB/s"));
    // Held to every figure's rules (no text under 12 px among them).
    assert_figures_fit(&[&page]);
    let Some(chrome) = chromium("the browser check") else {
        return;
    };
    let dom = Command::new(chrome)
        .args(["--headless", "--no-sandbox", "--disable-gpu", "--dump-dom"])
        .arg(format!("file://{}#selftest", page.display()))
        .output()
        .unwrap();
    let dom = String::from_utf8_lossy(&dom.stdout);
    let body = dom
        .find("<body")
        .map(|i| &dom[i..i + dom[i..].find('>').unwrap_or(0)])
        .unwrap_or("");
    assert!(body.contains("data-overlaps=\"0\""), "{body}");
    assert!(body.contains("data-crossed=\"0\""), "{body}");
}
