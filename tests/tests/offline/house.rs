//! The house's rooms depend one way. A folder is a room with one job: among the rooms of one
//! folder (its files and subfolders), no two use each other, directly or round a longer
//! circle, counting every file inside a subfolder as its room's. A child reading its
//! parent's definitions (or a parent its child's) is how rooms nest and does not count.
//! The same holds for the Python package's modules, lazy (in-function) imports included, and
//! for the crates, which use each other only as `CRATE_USES` says.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use podstream_tests::workspace_root;

/// A module by its path from the crate root (`[]` is `lib.rs` or `main.rs`).
type Module = Vec<String>;

/// Which rooms use which.
type Graph<N> = BTreeMap<N, BTreeSet<N>>;

/// Every library crate: what the binary and the test harness may use.
const EVERY_LIBRARY: &[&str] = &[
    "proto",
    "bus",
    "ingest",
    "rules",
    "processor",
    "sink",
    "collector",
    "sim",
    "stage",
];

/// The workspace crates each crate's `[dependencies]` may name: the crate graph of
/// docs/architecture.md. The collector is the sink's sibling: it shares the rules, not the
/// processor's service.
const CRATE_USES: &[(&str, &[&str])] = &[
    ("proto", &[]),
    ("bus", &["proto"]),
    ("ingest", &["proto", "bus"]),
    ("rules", &["proto"]),
    ("processor", &["proto", "bus", "rules"]),
    ("sink", &["proto", "bus"]),
    ("collector", &["proto", "bus", "rules"]),
    ("sim", &[]),
    ("stage", &["proto", "bus", "sink", "sim"]),
    ("tests", EVERY_LIBRARY),
    ("cli", EVERY_LIBRARY),
];

/// The Python package whose modules are checked, from the workspace root.
const PYTHON_PACKAGE: &str = "podstream-airflow/src/podstream_airflow";

/// The workspace's crates, as the root `Cargo.toml` lists them.
fn workspace_crates() -> Vec<String> {
    let manifest = std::fs::read_to_string(workspace_root().join("Cargo.toml")).unwrap();
    let members = manifest
        .lines()
        .find_map(|line| line.trim().strip_prefix("members = "))
        .expect("the root Cargo.toml lists its members on one line");
    members
        .trim_matches(|c| c == '[' || c == ']')
        .split(',')
        .map(|member| member.trim().trim_matches('"').to_owned())
        .filter(|member| !member.is_empty())
        .collect()
}

fn files_with(dir: &Path, extension: &str, found: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            files_with(&path, extension, found);
        } else if path.extension().is_some_and(|e| e == extension) {
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

/// The edge a use of `to` from `from` draws: between the two sibling rooms under their
/// common folder that hold them; none when one holds the other.
fn room_edge(from: &Module, to: &Module) -> Option<(Module, Module)> {
    let common = from.iter().zip(to).take_while(|(a, b)| a == b).count();
    if common == from.len() || common == to.len() {
        return None;
    }
    Some((from[..=common].to_vec(), to[..=common].to_vec()))
}

/// The rooms of one crate and which use which, from its files' modules and texts.
fn rust_rooms(files: &[(Module, String)]) -> Graph<Module> {
    let modules: BTreeSet<Module> = files.iter().map(|(module, _)| module.clone()).collect();
    let mut graph = Graph::new();
    for (module, text) in files {
        for used in used_modules(text, module, &modules) {
            if let Some((from, to)) = room_edge(module, &used) {
                graph.entry(from).or_default().insert(to);
            }
        }
    }
    graph
}

/// The modules of the Python package one imports, anywhere in its text (a lazy import in a
/// function is a use too); the package's `__init__` holds them all and does not count.
fn python_imports(text: &str, modules: &BTreeSet<String>) -> BTreeSet<String> {
    let mut used = BTreeSet::new();
    for line in text.lines().map(str::trim) {
        let named: Vec<&str> = if let Some(rest) = line
            .strip_prefix("from podstream_airflow.")
            .or_else(|| line.strip_prefix("from ."))
            .filter(|rest| !rest.starts_with(' '))
        {
            vec![rest.split([' ', '.']).next().unwrap_or("")]
        } else if let Some(rest) = line
            .strip_prefix("from podstream_airflow import ")
            .or_else(|| line.strip_prefix("from . import "))
        {
            rest.split(',')
                .map(|name| name.split_whitespace().next().unwrap_or(""))
                .collect()
        } else if let Some(rest) = line.strip_prefix("import podstream_airflow.") {
            vec![rest.split([' ', '.']).next().unwrap_or("")]
        } else {
            Vec::new()
        };
        used.extend(
            named
                .into_iter()
                .filter(|name| modules.contains(*name) && *name != "__init__")
                .map(str::to_owned),
        );
    }
    used
}

/// The Python package's modules and which import which, from their names and texts.
fn python_rooms(files: &[(String, String)]) -> Graph<String> {
    let modules: BTreeSet<String> = files.iter().map(|(module, _)| module.clone()).collect();
    let mut graph = Graph::new();
    for (module, text) in files.iter().filter(|(module, _)| module != "__init__") {
        let used = python_imports(text, &modules);
        graph
            .entry(module.clone())
            .or_default()
            .extend(used.into_iter().filter(|used| used != module));
    }
    graph
}

/// The circles of `graph`: each found once, from its least room.
fn circles<N: Ord + Clone>(graph: &Graph<N>) -> Vec<Vec<N>> {
    fn from<N: Ord + Clone>(graph: &Graph<N>, start: &N, path: &mut Vec<N>) -> Option<Vec<N>> {
        let at = path.last().cloned()?;
        for next in graph.get(&at).into_iter().flatten() {
            if next == start {
                let mut found = path.clone();
                found.push(start.clone());
                return Some(found);
            }
            if !path.contains(next) && next > start {
                path.push(next.clone());
                if let Some(found) = from(graph, start, path) {
                    return Some(found);
                }
                path.pop();
            }
        }
        None
    }
    graph
        .keys()
        .filter_map(|start| from(graph, start, &mut vec![start.clone()]))
        .collect()
}

fn shown(circle: &[Module]) -> String {
    let rooms: Vec<String> = circle
        .iter()
        .map(|m| {
            if m.is_empty() {
                "crate".to_owned()
            } else {
                m.join("::")
            }
        })
        .collect();
    rooms.join(" -> ")
}

#[test]
fn no_two_rooms_of_a_crate_use_each_other() {
    let mut found = Vec::new();
    let crates = workspace_crates();
    assert!(
        crates.len() >= 10,
        "members of the root Cargo.toml: {crates:?}"
    );
    for name in &crates {
        let src = workspace_root().join(name).join("src");
        let mut paths = Vec::new();
        files_with(&src, "rs", &mut paths);
        assert!(
            !paths.is_empty(),
            "{name}: no sources under {}",
            src.display()
        );
        let files: Vec<(Module, String)> = paths
            .iter()
            .map(|path| {
                (
                    module_of(&src, path),
                    std::fs::read_to_string(path).unwrap(),
                )
            })
            .collect();
        for circle in circles(&rust_rooms(&files)) {
            found.push(format!("{name}: {}", shown(&circle)));
        }
    }
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn no_two_modules_of_the_python_package_import_each_other() {
    let package = workspace_root().join(PYTHON_PACKAGE);
    let mut paths = Vec::new();
    files_with(&package, "py", &mut paths);
    let files: Vec<(String, String)> = paths
        .iter()
        .map(|path| {
            let stem = path.file_stem().unwrap().to_string_lossy().into_owned();
            (stem, std::fs::read_to_string(path).unwrap())
        })
        .collect();
    assert!(
        files.len() > 5,
        "modules of {}: {}",
        package.display(),
        files.len()
    );
    let graph = python_rooms(&files);
    assert!(
        graph.values().any(|used| !used.is_empty()),
        "no imports seen between the package's modules: the reader is broken"
    );
    let found: Vec<String> = circles(&graph).iter().map(|c| c.join(" -> ")).collect();
    assert!(found.is_empty(), "import circles:\n{}", found.join("\n"));
}

#[test]
fn the_crates_use_each_other_as_the_architecture_says() {
    let crates = workspace_crates();
    let allowed: BTreeMap<&str, &[&str]> = CRATE_USES.iter().copied().collect();
    let listed: BTreeSet<&str> = allowed.keys().copied().collect();
    let members: BTreeSet<&str> = crates.iter().map(String::as_str).collect();
    assert_eq!(
        listed, members,
        "CRATE_USES names each workspace member once"
    );
    for name in &crates {
        let manifest =
            std::fs::read_to_string(workspace_root().join(name).join("Cargo.toml")).unwrap();
        let dependencies = manifest
            .split("\n[")
            .find(|section| section.starts_with("dependencies]"))
            .unwrap_or("");
        let used: BTreeSet<&str> = dependencies
            .lines()
            .filter_map(|line| line.strip_prefix("podstream-"))
            .filter_map(|rest| rest.split(['.', ' ', '=']).next())
            .collect();
        let may: BTreeSet<&str> = allowed[name.as_str()].iter().copied().collect();
        let extra: Vec<&&str> = used.difference(&may).collect();
        assert!(
            extra.is_empty(),
            "{name} depends on {extra:?}, which CRATE_USES (docs/architecture.md) does not allow"
        );
    }
}

fn module(path: &str) -> Module {
    path.split("::")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
        .collect()
}

fn rust_files(files: &[(&str, &str)]) -> Vec<(Module, String)> {
    files
        .iter()
        .map(|(path, text)| (module(path), (*text).to_owned()))
        .collect()
}

/// Two sibling files, one reading a constant the other defines and re-exports: the shape of
/// `collected.rs` and `service/` naming one `BUCKET_ROLE`.
#[test]
fn the_room_check_finds_two_files_using_each_other() {
    let files = rust_files(&[
        ("", "mod collected;\nmod service;"),
        ("collected", "use crate::service::BUCKET_ROLE;"),
        ("service", "pub use crate::collected::Action;"),
        ("service::start", "use super::Config; // crate::collected"),
    ]);
    let found = circles(&rust_rooms(&files));
    assert_eq!(
        found,
        vec![vec![
            module("collected"),
            module("service"),
            module("collected")
        ]]
    );
}

/// A file in one folder using a file in another whose sibling uses the first folder back:
/// the shape of `spark/service.rs` reaching `service/`'s error alias while
/// `service/start.rs` starts the Spark consumer.
#[test]
fn the_room_check_finds_a_circle_between_folders() {
    let files = rust_files(&[
        ("spark", "pub mod service;"),
        ("spark::service", "use crate::service::ProcessError;"),
        ("service", "mod start;"),
        (
            "service::start",
            "use crate::spark::service::SparkConsumer;",
        ),
    ]);
    let found = circles(&rust_rooms(&files));
    assert_eq!(
        found,
        vec![vec![module("service"), module("spark"), module("service")]]
    );
}

/// A child reading its parent's definitions, and a parent re-exporting its child's, nest
/// rooms: no circle.
#[test]
fn the_room_check_lets_rooms_nest() {
    let files = rust_files(&[
        ("service", "mod consume;\npub use consume::Handler;"),
        (
            "service::consume",
            "use super::Config;\nuse crate::service::worker::Worker;",
        ),
        ("service::worker", "use super::super::service::Config;"),
    ]);
    assert_eq!(circles(&rust_rooms(&files)), Vec::<Vec<Module>>::new());
}

/// Two modules importing each other only inside functions: the shape of `check.py` and
/// `executor.py` sharing `TI_POD_TABLE` through lazy imports.
#[test]
fn the_python_check_finds_lazy_import_circles() {
    let files: Vec<(String, String)> = [
        (
            "__init__",
            "from podstream_airflow.executor import PodstreamKubernetesExecutor\n",
        ),
        (
            "executor",
            "from podstream_airflow.config import PodstreamConfig\n\
             def get_cli_commands():\n    from podstream_airflow.check import cli_commands\n",
        ),
        (
            "check",
            "def check(session):\n    from .executor import TI_POD_TABLE  # lazy\n",
        ),
        ("config", "from podstream_airflow import wire\n"),
        ("wire", "DEFAULT_PREFIX = 'podstream'\n"),
    ]
    .iter()
    .map(|(m, t)| ((*m).to_owned(), (*t).to_owned()))
    .collect();
    let graph = python_rooms(&files);
    assert!(graph["config"].contains("wire"), "{graph:?}");
    let found = circles(&graph);
    assert_eq!(
        found,
        vec![vec![
            "check".to_owned(),
            "executor".to_owned(),
            "check".to_owned()
        ]]
    );
}
