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
