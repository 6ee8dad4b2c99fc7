//! The house's rooms depend one way: within a crate, no two files use each other, directly or
//! round a longer circle. A child module reading its parent's definitions (and a parent its
//! children's) is how Rust nests rooms and does not count.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use podstream_tests::workspace_root;

/// A module by its path from the crate root (`[]` is `lib.rs` or `main.rs`).
type Module = Vec<String>;

/// The crates whose sources are checked: every `src/` of the workspace.
const CRATES: &[&str] = &[
    "proto",
    "bus",
    "ingest",
    "processor",
    "sink",
    "sim",
    "stage",
    "cli",
    "tests",
];

fn rust_files(dir: &Path, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, found);
        } else if path.extension().is_some_and(|e| e == "rs") {
            found.push(path);
        }
    }
}

/// The module a file under `src` defines.
fn module_of(src: &Path, file: &Path) -> Module {
    let relative = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Module = relative
        .iter()
        .map(|p| p.to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The paths a text names after `from::` (`a::b`, and each item of `{a, b::c}`), as segments.
fn paths_after<'a>(text: &'a str, from: &str) -> Vec<Vec<&'a str>> {
    let mut found = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find(from) {
        let before = rest[..at].chars().next_back();
        rest = &rest[at + from.len()..];
        if before.is_some_and(|c| is_ident(c) || c == ':') {
            continue;
        }
        found.extend(path_items(rest));
    }
    found
}

/// The path (or brace group of paths) at the start of `text`.
fn path_items(text: &str) -> Vec<Vec<&str>> {
    if let Some(group) = text.strip_prefix('{') {
        let end = group.find('}').unwrap_or(group.len());
        return group[..end]
            .split(',')
            .flat_map(|item| path_items(item.trim()))
            .collect();
    }
    let mut segments = Vec::new();
    let mut rest = text;
    loop {
        let end = rest.find(|c: char| !is_ident(c)).unwrap_or(rest.len());
        if end == 0 {
            break;
        }
        segments.push(&rest[..end]);
        match rest[end..].strip_prefix("::") {
            Some(next) if !next.starts_with('{') => rest = next,
            _ => break,
        }
    }
    if segments.is_empty() {
        Vec::new()
    } else {
        vec![segments]
    }
}

/// The modules of the crate `module` (a file of it) uses, from its text; comments left out.
fn used_modules(text: &str, module: &Module, modules: &BTreeSet<Module>) -> BTreeSet<Module> {
    let code: String = text
        .lines()
        .map(|line| match line.find("//") {
            Some(at) => &line[..at],
            None => line,
        })
        .collect::<Vec<_>>()
        .join("\n");
    let mut used = BTreeSet::new();
    let mut resolve = |base: Module, path: &[&str]| {
        let mut full = base;
        full.extend(path.iter().map(|s| (*s).to_owned()));
        // The longest prefix that is a file of the crate.
        while !full.is_empty() && !modules.contains(&full) {
            full.pop();
        }
        used.insert(full);
    };
    for path in paths_after(&code, "crate::") {
        resolve(Vec::new(), &path);
    }
    for path in paths_after(&code, "super::") {
        // `super::super::x` climbs twice.
        let climbs = 1 + path.iter().take_while(|s| **s == "super").count();
        let base = module[..module.len().saturating_sub(climbs)].to_vec();
        resolve(base, &path[climbs - 1..]);
    }
    used
}

/// Whether one module holds the other (or is it).
fn nested(a: &Module, b: &Module) -> bool {
    a.starts_with(b) || b.starts_with(a)
}

/// A circle of `graph` through `start`, if any.
fn circle(
    graph: &BTreeMap<Module, BTreeSet<Module>>,
    start: &Module,
    at: &Module,
    path: &mut Vec<Module>,
) -> Option<Vec<Module>> {
    for next in graph.get(at).into_iter().flatten() {
        if next == start {
            let mut found = path.clone();
            found.push(start.clone());
            return Some(found);
        }
        if !path.contains(next) && next > start {
            path.push(next.clone());
            if let Some(found) = circle(graph, start, next, path) {
                return Some(found);
            }
            path.pop();
        }
    }
    None
}

#[test]
fn no_two_files_of_a_crate_use_each_other() {
    let mut circles = Vec::new();
    for name in CRATES {
        let src = workspace_root().join(name).join("src");
        let mut files = Vec::new();
        rust_files(&src, &mut files);
        let modules: BTreeSet<Module> = files.iter().map(|f| module_of(&src, f)).collect();
        let mut graph: BTreeMap<Module, BTreeSet<Module>> = BTreeMap::new();
        for file in &files {
            let module = module_of(&src, file);
            let text = std::fs::read_to_string(file).unwrap();
            let used = used_modules(&text, &module, &modules)
                .into_iter()
                .filter(|other| !nested(other, &module))
                .collect();
            graph.insert(module, used);
        }
        for start in graph.keys() {
            if let Some(found) = circle(&graph, start, start, &mut vec![start.clone()]) {
                let shown: Vec<String> = found.iter().map(|m| m.join("::")).collect();
                circles.push(format!("{name}: {}", shown.join(" -> ")));
            }
        }
    }
    assert!(
        circles.is_empty(),
        "import circles:\n{}",
        circles.join("\n")
    );
}

/// The check sees a circle where there is one, and none where a child reads its parent.
#[test]
fn the_circle_check_finds_circles() {
    let modules: BTreeSet<Module> = [
        vec![],
        vec!["service".to_owned()],
        vec!["service".to_owned(), "consume".to_owned()],
        vec!["service".to_owned(), "worker".to_owned()],
    ]
    .into_iter()
    .collect();
    let consume = vec!["service".to_owned(), "consume".to_owned()];
    let worker = vec!["service".to_owned(), "worker".to_owned()];
    let used = used_modules(
        "use super::worker::{Worker, Delivery};\nuse super::Config; // super::nothing\n",
        &consume,
        &modules,
    );
    assert!(used.contains(&worker) && used.contains(&vec!["service".to_owned()]));
    let mut graph = BTreeMap::new();
    graph.insert(consume.clone(), BTreeSet::from([worker.clone()]));
    graph.insert(
        worker.clone(),
        used_modules("use super::consume::ack;", &worker, &modules),
    );
    assert!(circle(&graph, &consume, &consume, &mut vec![consume.clone()]).is_some());
    assert!(nested(&vec!["service".to_owned()], &consume));
}
