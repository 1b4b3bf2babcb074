//! Every measured figure in the README and docs carries the machine, the date and the revision
//! it came from: each Markdown section that quotes a rate (GB/s, GFLOP/s, images/s, ...) holds
//! a stamp line `Measured on <machine>, <YYYY-MM-DD>, revision <hex>` (any case) (or is marked
//! `<!-- figures: datasheet -->`: vendors' figures, not ours), and each saved comparison
//! (`docs/**/*.txt`) starts with one (`scripts/compare.sh` writes it). The README's probe table is
//! regenerated and stamped by `scripts/readme-figures.sh` (and docs/methodology.md's).

const UNITS: [&str; 9] = [
    "GB/s", "MB/s", "TB/s", "GiB/s", "GFLOP/s", "TFLOP/s", "PFLOP/s", "images/s", "GOP/s",
];

/// Whether `line` quotes a rate: a number, an optional space, a unit.
fn has_figure(line: &str) -> bool {
    UNITS.iter().any(|u| {
        line.match_indices(u).any(|(k, _)| {
            let before = line[..k].strip_suffix(' ').unwrap_or(&line[..k]);
            before.chars().last().is_some_and(|c| c.is_ascii_digit())
        })
    })
}

/// Whether `line` holds `<YYYY-MM-DD>, revision <7+ hex digits>`.
fn has_date_and_revision(line: &str) -> bool {
    line.match_indices(", revision ").any(|(k, m)| {
        let date = line[..k].rsplit(' ').next().unwrap_or("");
        let date_ok = date.len() == 10
            && date.char_indices().all(|(i, c)| match i {
                4 | 7 => c == '-',
                _ => c.is_ascii_digit(),
            });
        let rev: String = line[k + m.len()..]
            .chars()
            .take_while(|c| c.is_ascii_hexdigit())
            .collect();
        date_ok && rev.len() >= 7
    })
}

fn is_stamp(line: &str) -> bool {
    line.to_ascii_lowercase().contains("measured on ") && has_date_and_revision(line)
}

/// The sections of a Markdown text (heading, lines) that quote figures without a stamp.
fn unstamped(text: &str) -> Vec<String> {
    let mut sections: Vec<(String, Vec<&str>)> = vec![("(top)".into(), Vec::new())];
    let mut fenced = false;
    for line in text.lines() {
        if line.starts_with("```") {
            fenced = !fenced;
        }
        if !fenced && line.starts_with('#') {
            sections.push((line.to_string(), Vec::new()));
        } else if let Some(s) = sections.last_mut() {
            s.1.push(line);
        }
    }
    sections
        .into_iter()
        .filter(|(_, lines)| {
            lines.iter().any(|l| has_figure(l))
                && !lines.iter().any(|l| is_stamp(l))
                && !lines
                    .iter()
                    .any(|l| l.contains("<!-- figures: datasheet -->"))
        })
        .map(|(h, lines)| {
            let first = lines.iter().find(|l| has_figure(l)).unwrap_or(&"");
            format!("{h}: {first}")
        })
        .collect()
}

#[test]
fn the_checker_finds_figures_and_stamps() {
    assert!(has_figure("L2 triad 449 GB/s here"));
    assert!(has_figure("(12.1–12.4 images/s)"));
    assert!(has_figure("256GFLOP/s"));
    assert!(!has_figure("the unit is GB/s"));
    assert!(is_stamp(
        "Measured on AMD EPYC (family 26 model 2), 2 cores, 2026-11-23, revision 52fedc8."
    ));
    assert!(!is_stamp("Measured on AMD EPYC, 2026-11-23."));
    assert!(!is_stamp("Measured on AMD EPYC, 2026-11, revision 52fedc8"));
    assert!(!is_stamp("Measured on AMD EPYC, 2026-11-23, revision 52f"));
    let doc = "# A\nno figures\n# B\nit does 450 GB/s\n# C\n3 images/s\nMeasured on x, 2026-01-02, revision abcdef0\n# D\n<!-- figures: datasheet -->\n25 GB/s per link\n";
    assert_eq!(unstamped(doc), vec!["# B: it does 450 GB/s".to_string()]);
    // A `#` inside a code block is not a heading.
    let fenced =
        "# A\n```\n# not a heading\n9 GB/s\n```\nMeasured on x, 2026-01-02, revision abcdef0\n";
    assert!(unstamped(fenced).is_empty());
}

#[test]
fn every_figure_in_the_readme_and_docs_is_stamped() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut missing = Vec::new();
    let mut files = vec![root.join("README.md")];
    // docs/ and its folders (performance/, gpu/).
    let mut dirs = vec![root.join("docs")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(d).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else {
                files.push(p);
            }
        }
    }
    for f in files {
        let ext = f.extension().and_then(|e| e.to_str()).unwrap_or("");
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        match ext {
            "md" => missing.extend(
                unstamped(&text)
                    .into_iter()
                    .map(|s| format!("{}: {s}", f.display())),
            ),
            "txt"
                if text.lines().any(has_figure)
                    && !text.lines().take(3).any(has_date_and_revision) =>
            {
                missing.push(format!(
                    "{}: no `<date>, revision <hex>` in its first lines",
                    f.display()
                ));
            }
            _ => {}
        }
    }
    assert!(
        missing.is_empty(),
        "figures without the machine, date and revision they came from:\n{}",
        missing.join("\n")
    );
}
