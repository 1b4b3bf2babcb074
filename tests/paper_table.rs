//! docs/paper-to-roofline.md names, for every formula and check value of the papers, the test
//! that reproduces it: each file it names exists, and each test it names is a function of that
//! file. A test renamed or removed fails here until the table follows.

use std::path::Path;

#[test]
fn every_test_the_paper_table_names_is_there() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let table = std::fs::read_to_string(root.join("docs/paper-to-roofline.md")).unwrap();
    let mut seen: Vec<String> = Vec::new();
    let mut named = 0;
    for line in table.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = line.trim_matches('|').split('|').collect();
        let Some(last) = cells.last() else { continue };
        if cells.len() < 4 || last.trim() == "test" || last.trim().starts_with("---") {
            continue;
        }
        let mut file: Option<String> = None;
        for (i, token) in last.split('`').enumerate() {
            if i % 2 == 0 {
                continue;
            }
            if token.ends_with(".rs") {
                // A full path, or the end of one named before in the table.
                let path = if root.join(token).is_file() {
                    token.to_string()
                } else {
                    let ends: Vec<&String> = seen
                        .iter()
                        .filter(|p| p.ends_with(&format!("/{token}")))
                        .collect();
                    match ends[..] {
                        [p] => p.clone(),
                        [] => panic!("{token}: no such file, nor named before: {line}"),
                        _ => panic!("{token}: which of {ends:?}? {line}"),
                    }
                };
                if !seen.contains(&path) {
                    seen.push(path.clone());
                }
                file = Some(path);
                continue;
            }
            let f = file
                .as_ref()
                .unwrap_or_else(|| panic!("test {token} named before its file: {line}"));
            let text = std::fs::read_to_string(root.join(f)).unwrap();
            assert!(
                text.contains(&format!("fn {token}(")),
                "docs/paper-to-roofline.md names {token} in {f}, which has no such test"
            );
            named += 1;
        }
    }
    assert!(named >= 20, "only {named} tests named");
}
