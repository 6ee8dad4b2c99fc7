//! The repository carries its own spec: every relative link in its Markdown resolves inside
//! the clone, and nothing in code, docs or help text points outside it to the design folder
//! a clone does not have.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("the tests crate sits in the workspace")
        .to_path_buf()
}

/// Every file under `dir` whose name ends in one of `endings`, leaving out build output,
/// installed tools and version control.
fn files(dir: &Path, endings: &[&str], found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if path.is_dir() {
            if !matches!(
                name.as_str(),
                "target" | ".git" | "node_modules" | ".venv" | "__pycache__"
            ) && !name.ends_with(".egg-info")
            {
                files(&path, endings, found);
            }
        } else if endings.iter().any(|ending| name.ends_with(ending)) {
            found.push(path);
        }
    }
}

/// The targets of the inline links `[text](target)` of a Markdown text, code spans and
/// fenced blocks left out.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Code spans may hold `](` that is no link.
        let prose: String = line.split('`').step_by(2).collect::<Vec<_>>().join(" ");
        let mut rest = prose.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            targets.push(after[..end].trim().to_owned());
            rest = &after[end..];
        }
    }
    targets
}

#[test]
fn every_relative_markdown_link_resolves_in_the_repository() {
    let root = root();
    let mut markdown = Vec::new();
    files(&root, &[".md"], &mut markdown);
    assert!(
        markdown.iter().any(|p| p.ends_with("docs/semantics.md"))
            && markdown.iter().any(|p| p.ends_with("docs/contract.md")),
        "the spec lives in docs/"
    );
    let mut dangling = Vec::new();
    for file in &markdown {
        let text = std::fs::read_to_string(file).unwrap();
        for target in link_targets(&text) {
            let path = target.split('#').next().unwrap_or_default();
            let external = target.contains("://") || target.starts_with("mailto:");
            if external || path.is_empty() {
                continue;
            }
            let resolved = file.parent().unwrap().join(path);
            let inside = resolved
                .canonicalize()
                .is_ok_and(|real| real.starts_with(&root));
            if !inside {
                dangling.push(format!("{}: {target}", file.display()));
            }
        }
    }
    assert!(
        dangling.is_empty(),
        "links that lead nowhere in a clone:\n{}",
        dangling.join("\n")
    );
}

#[test]
fn links_are_read_as_markdown_reads_them() {
    let text = "See [a](docs/a.md) and [b](b.md#x).\n`[no](code.md)` but [c](../c.md)\n```\n[no](fenced.md)\n```\n";
    assert_eq!(link_targets(text), ["docs/a.md", "b.md#x", "../c.md"]);
}

#[test]
fn nothing_points_to_the_design_folder_outside_the_clone() {
    let root = root();
    let mut texts = Vec::new();
    files(
        &root,
        &[
            ".md", ".rs", ".py", ".sh", ".toml", ".yaml", ".yml", ".json", ".cfg", ".txt",
        ],
        &mut texts,
    );
    texts.push(root.join(".ci/run"));
    // Spelled in two parts, so this file does not name what it looks for.
    let outside = ["../", "shared/design"].concat();
    let design = ["shared", "/design/"].concat();
    let this_file = Path::new(file!()).file_name().unwrap();
    let mut found = Vec::new();
    for file in texts.iter().filter(|f| f.file_name() != Some(this_file)) {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for (number, line) in text.lines().enumerate() {
            if line.contains(&outside) || line.contains(&design) || line.contains("../shared") {
                found.push(format!("{}:{}: {line}", file.display(), number + 1));
            }
        }
    }
    assert!(
        found.is_empty(),
        "mentions of a folder a clone does not have:\n{}",
        found.join("\n")
    );
}
