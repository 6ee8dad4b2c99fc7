//! The production build (`--no-default-features`, as deploy/Dockerfile builds it) leaves the
//! test world out: no `demo`, no `sim`, no `kubelet`, and neither the simulator nor the real-Airflow stage
//! linked in. `scripts/test.sh` builds it beside the workspace's own binary and names it in
//! `PODSTREAM_PRODUCTION_BIN`.

use std::path::{Path, PathBuf};
use std::process::Command;

use podstream_tests::podstream_binary;

/// The variable naming the production binary.
const PRODUCTION_BIN: &str = "PODSTREAM_PRODUCTION_BIN";

/// The commands every build has.
const PRODUCTION_COMMANDS: [&str; 11] = [
    "decide", "ingest", "process", "apply", "sink", "collect", "replay", "run", "tail", "check",
    "help",
];

/// The commands only the test world has.
const TEST_WORLD_COMMANDS: [&str; 3] = ["demo", "sim", "kubelet"];

fn production_binary() -> PathBuf {
    std::env::var_os(PRODUCTION_BIN)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "{PRODUCTION_BIN} names the binary of `cargo build -p podstream-cli \
             --no-default-features`; scripts/test.sh builds it"
            )
        })
}

/// The subcommands `binary --help` lists, in its order.
fn commands(binary: &Path) -> Vec<String> {
    let output = Command::new(binary).arg("--help").output().unwrap();
    assert!(
        output.status.success(),
        "{} --help failed",
        binary.display()
    );
    let help = String::from_utf8(output.stdout).unwrap();
    help.split("Commands:\n")
        .nth(1)
        .expect("--help lists commands")
        .lines()
        .take_while(|line| line.starts_with("  "))
        .filter_map(|line| line.split_whitespace().next())
        .map(str::to_owned)
        .collect()
}

/// Whether the binary holds `needle` anywhere in its bytes.
fn holds(binary: &Path, needle: &[u8]) -> bool {
    let bytes = std::fs::read(binary).unwrap();
    memchr::memmem::find(&bytes, needle).is_some()
}

#[test]
fn the_production_build_lists_only_production_commands() {
    let production = commands(&production_binary());
    assert_eq!(production, PRODUCTION_COMMANDS, "production --help");
    // The workspace's build has the test world too: the check above is not vacuous.
    let full = commands(podstream_binary());
    for command in PRODUCTION_COMMANDS.iter().chain(&TEST_WORLD_COMMANDS) {
        assert!(full.iter().any(|c| c == command), "{command} in {full:?}");
    }
}

#[test]
fn the_production_build_links_neither_the_simulator_nor_the_stage() {
    // Source paths that panic locations and debug info carry from each crate.
    let test_world: [&[u8]; 2] = [b"sim/src/", b"stage/src/"];
    for path in test_world {
        let name = String::from_utf8_lossy(path);
        assert!(
            holds(podstream_binary(), path),
            "the full build holds {name}"
        );
        assert!(
            !holds(&production_binary(), path),
            "the production build holds {name}"
        );
    }
}
