//! The README and docs render as written: every code fence closes (a fence with an info
//! string, "```sh", never appears inside an open block, where it would close it and leave the
//! rest of the page inside code), no heading is swallowed by a block, and every relative link
//! and `#anchor` resolves. A copy of a paragraph that ended in an opening fence once swallowed
//! twenty lines of the README, a heading among them.

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn markdown_files() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap().flatten() {
            let p = e.path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let mut v = vec![root().join("README.md")];
    walk(&root().join("docs"), &mut v);
    v
}

/// GitHub's anchor of a heading: lower case, punctuation but `-` and `_` dropped, spaces to `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn is_heading(line: &str) -> bool {
    let hashes = line.chars().take_while(|c| *c == '#').count();
    (1..=6).contains(&hashes) && line[hashes..].starts_with(' ')
}

/// What is wrong with one page, one line each.
fn problems(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    let mut out = Vec::new();
    let mut open: Option<usize> = None;
    let mut anchors = Vec::new();
    let mut prose: Vec<(usize, &str)> = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.starts_with("```") {
            match open {
                Some(at) if line.trim() != "```" => out.push(format!(
                    "line {n}: a fence with an info string ({line:?}) inside the block opened at line {at}"
                )),
                Some(_) => open = None,
                None => open = Some(n),
            }
            continue;
        }
        match open {
            Some(at) if is_heading(line) && !line.starts_with("# ") => out.push(format!(
                "line {n}: the heading {line:?} is inside the code block opened at line {at}"
            )),
            Some(_) => {}
            None => {
                if is_heading(line) {
                    anchors.push(slug(line.trim_start_matches('#')));
                }
                prose.push((n, line));
            }
        }
    }
    if let Some(at) = open {
        out.push(format!("line {at}: a code block that never closes"));
    }
    for (n, line) in prose {
        let mut rest = line;
        while let Some(k) = rest.find("](") {
            let after = &rest[k + 2..];
            let Some(end) = after.find(')') else { break };
            let target = &after[..end];
            rest = &after[end..];
            if target.contains("://") || target.starts_with("mailto:") || target.contains(' ') {
                continue;
            }
            let (file, anchor) = target.split_once('#').unwrap_or((target, ""));
            if file.is_empty() {
                if !anchor.is_empty() && !anchors.iter().any(|a| a == anchor) {
                    out.push(format!("line {n}: no heading for the anchor #{anchor}"));
                }
            } else if !path.parent().unwrap().join(file).exists() {
                out.push(format!("line {n}: the link {target} leads nowhere"));
            }
        }
    }
    out
}

#[test]
fn the_readme_and_docs_render_as_written() {
    let files = markdown_files();
    assert!(files.len() > 10, "{files:?}");
    let mut all = Vec::new();
    for f in &files {
        for p in problems(f) {
            all.push(format!("{}: {p}", f.display()));
        }
    }
    assert!(all.is_empty(), "{}", all.join("\n"));
}

/// The checks find what they are for: the README's old doubled fence, a truncated paragraph
/// whose fence swallows a heading, and links to nothing.
#[test]
fn the_checks_catch_a_doubled_fence_a_swallowed_heading_and_a_dead_link() {
    let dir = std::env::temp_dir().join(format!("roofline-readme-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let page = dir.join("page.md");
    std::fs::write(
        &page,
        "# t\n\n## The commands\n\n```sh\n```sh\nroofline probe\n```\n\none\n```\n\n## On a cluster\n\nsee [x](nowhere.md) and [y](#the-commands) and [z](#gone)\n",
    )
    .unwrap();
    let text = problems(&page).join("\n");
    assert!(
        text.contains("line 6: a fence with an info string"),
        "{text}"
    );
    assert!(
        text.contains("the heading \"## On a cluster\" is inside"),
        "{text}"
    );
    assert!(text.contains("a code block that never closes"), "{text}");
    std::fs::write(
        &page,
        "# t\n\n## The commands\n\nsee [x](nowhere.md) and [y](#the-commands) and [z](#gone)\n",
    )
    .unwrap();
    let text = problems(&page).join("\n");
    std::fs::remove_dir_all(&dir).ok();
    assert!(
        text.contains("line 5: the link nowhere.md leads nowhere"),
        "{text}"
    );
    assert!(
        text.contains("line 5: no heading for the anchor #gone"),
        "{text}"
    );
    assert!(!text.contains("#the-commands"), "{text}");
    assert_eq!(
        slug(" On a cluster: mpirun or Slurm"),
        "on-a-cluster-mpirun-or-slurm"
    );
}
