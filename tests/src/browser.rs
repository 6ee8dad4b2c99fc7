//! Headless Chromium (Debian's `chromium-headless-shell`, installed by scripts/setup.sh): a
//! page's DOM as the browser builds it, and a screenshot.

use std::path::Path;
use std::process::Command;

fn chromium(args: &[&str], page: &Path) -> std::process::Output {
    let output = Command::new("chromium-headless-shell")
        .args(["--no-sandbox", "--disable-gpu", "--hide-scrollbars"])
        .args(args)
        .arg(format!("file://{}", page.display()))
        .output()
        .unwrap_or_else(|e| panic!("chromium-headless-shell (scripts/setup.sh installs it): {e}"));
    assert!(
        output.status.success(),
        "chromium-headless-shell failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    output
}

/// The page's DOM after its scripts ran, as the browser serializes it.
///
/// # Panics
/// When the browser cannot run.
pub fn dom(page: &Path) -> String {
    String::from_utf8_lossy(&chromium(&["--dump-dom"], page).stdout).into_owned()
}

/// A `width`×`height` PNG screenshot of the page, written to `png`.
///
/// # Panics
/// When the browser cannot run.
pub fn screenshot(page: &Path, width: u32, height: u32, png: &Path) {
    chromium(
        &[
            &format!("--window-size={width},{height}"),
            &format!("--screenshot={}", png.display()),
        ],
        page,
    );
}
