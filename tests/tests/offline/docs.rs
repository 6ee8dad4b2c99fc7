//! The repository carries its own spec: every relative link in its Markdown resolves inside
//! the clone, and nothing in code, docs or help text points outside it to the design folder
//! a clone does not have.

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

/// The lines of a Markdown text outside its fenced blocks.
fn unfenced_lines(markdown: &str) -> impl Iterator<Item = &str> {
    let mut fenced = false;
    markdown.lines().filter(move |line| {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            return false;
        }
        !fenced
    })
}

/// The targets of the inline links `[text](target)` of a Markdown text, code spans and
/// fenced blocks left out.
fn link_targets(markdown: &str) -> Vec<String> {
    let mut targets = Vec::new();
    for line in unfenced_lines(markdown) {
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

/// The code spans of a Markdown text (fenced blocks left out) that name a path of the
/// repository: a top-level entry of `root` (not the build output), then `/`-separated
/// names, an optional `:line` dropped.
fn repository_paths(markdown: &str, root: &Path) -> Vec<String> {
    let mut paths = Vec::new();
    for line in unfenced_lines(markdown) {
        for span in line.split('`').skip(1).step_by(2) {
            let path = span.split(':').next().unwrap_or_default().trim();
            let named = path.contains('/')
                && path
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "/_.-".contains(c));
            let first = path.split('/').next().unwrap_or_default();
            if named && !first.is_empty() && first != "target" && root.join(first).exists() {
                paths.push(path.to_owned());
            }
        }
    }
    paths
}

#[test]
fn paths_in_code_spans_are_read_as_paths() {
    let root = root();
    let text = "`docs/semantics.md` and `cli/src/main.rs:12`, `target/tools`, `a/b`,\n\
                `proto/.../x.rs`, `podstream.commands.>`\n```\n`deploy/none.yaml`\n```\n";
    assert_eq!(
        repository_paths(text, &root),
        ["docs/semantics.md", "cli/src/main.rs", "proto/.../x.rs"]
    );
}

/// Every repository path the README and docs/ name in code exists: a file moved or renamed
/// takes its mentions with it.
#[test]
fn every_path_the_docs_name_exists() {
    let root = root();
    let mut pages = vec![root.join("README.md")];
    files(&root.join("docs"), &[".md"], &mut pages);
    let mut stale = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(page).unwrap();
        for path in repository_paths(&text, &root) {
            if !root.join(&path).exists() {
                stale.push(format!("{}: {path}", page.display()));
            }
        }
    }
    assert!(
        stale.is_empty(),
        "paths named in the docs that are not there:\n{}",
        stale.join("\n")
    );
}

/// Every source file of every crate appears in docs/architecture.md, by its name or its
/// path under `src/` (a `mod.rs` by its folder): the house is drawn whole.
#[test]
fn every_source_file_appears_in_the_architecture() {
    let root = root();
    let architecture = std::fs::read_to_string(root.join("docs/architecture.md")).unwrap();
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&root).unwrap() {
        let krate = entry.unwrap().path();
        let src = krate.join("src");
        if !krate.join("Cargo.toml").exists() || !src.is_dir() {
            continue;
        }
        let mut sources = Vec::new();
        files(&src, &[".rs"], &mut sources);
        for source in sources {
            let name = source.file_name().unwrap().to_string_lossy().into_owned();
            let relative = source.strip_prefix(&src).unwrap().display().to_string();
            let folder = source
                .parent()
                .and_then(Path::file_name)
                .map(|f| format!("{}/", f.to_string_lossy()))
                .unwrap_or_default();
            let shown = match name.as_str() {
                "lib.rs" | "main.rs" => true,
                "mod.rs" => architecture.contains(&folder),
                _ => architecture.contains(&name) || architecture.contains(&relative),
            };
            if !shown {
                missing.push(source.strip_prefix(&root).unwrap().display().to_string());
            }
        }
    }
    assert!(
        missing.is_empty(),
        "source files docs/architecture.md does not name:\n{}",
        missing.join("\n")
    );
}
