//! The web console's browser tests (tests/console/ui.rs): `playwright-core` provisioned like the other
//! npm test dependencies (`npm ci` of the committed `tests/console/package-lock.json` into
//! `<target dir>/test-deps/console/`), driving the system's Chromium (`/usr/bin/chromium`, the
//! Debian `chromium` package that `.ci/run` installs). No browser is ever downloaded.

use std::fs;
use std::path::PathBuf;
use std::process::Command;

use super::provision::{deps_dir, ensure, manifest_dir, run};

/// One browser at a time in this process (the tests of `console` share it): the machine may have
/// two cores.
pub static BROWSER: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The browser the tests drive.
pub const CHROMIUM: &str = "/usr/bin/chromium";

/// The folder where `npm ci` installed `tests/console/package-lock.json`; the driver scripts are
/// copied into it (see [`script`]) so that Node resolves `playwright-core` from its
/// `node_modules/`.
pub fn deps() -> PathBuf {
    let src = manifest_dir().join("tests/console");
    let files = ["package.json", "package-lock.json"];
    let mut key = String::from("npm ci --no-audit --no-fund --ignore-scripts\n");
    for name in files {
        let text = fs::read_to_string(src.join(name))
            .unwrap_or_else(|e| panic!("read {}: {e}", src.join(name).display()));
        key.push_str(&text);
    }
    let dir = deps_dir().join("console");
    let ready = dir.join("node_modules/playwright-core/package.json");
    ensure(&dir, &key, &ready, |dir| {
        for name in files {
            fs::copy(src.join(name), dir.join(name))
                .unwrap_or_else(|e| panic!("copy {name} to {}: {e}", dir.display()));
        }
        let mut npm = Command::new("npm");
        // --ignore-scripts: no install script runs (playwright-core has none; never a download).
        npm.args(["ci", "--no-audit", "--no-fund", "--ignore-scripts"])
            .env("PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD", "1")
            .current_dir(dir);
        run(
            npm,
            "npm",
            "Node.js with npm, and access to the npm registry",
        );
    });
    dir
}

/// A copy of `tests/console/<name>` inside [`deps`].
pub fn script(name: &str) -> PathBuf {
    let dir = deps();
    let src = manifest_dir().join("tests/console").join(name);
    let dest = dir.join(name);
    // Tests run side by side in one process: each copy gets a name of its own.
    static COPIES: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = COPIES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".{name}.{}.{n}.tmp", std::process::id()));
    fs::copy(&src, &tmp).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    fs::rename(&tmp, &dest).unwrap_or_else(|e| panic!("rename to {}: {e}", dest.display()));
    dest
}

/// `<target dir>/console-shots/`: where the browser tests save their screenshots.
pub fn shots_dir() -> PathBuf {
    let dir = deps_dir()
        .parent()
        .expect("test-deps lies in the target dir")
        .join("console-shots");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    dir
}

/// Panics with how to install it when the system's Chromium is missing.
pub fn chromium() -> &'static str {
    assert!(
        std::path::Path::new(CHROMIUM).is_file(),
        "{CHROMIUM} is missing: the console's browser tests drive the system's Chromium \
         (Debian/Ubuntu: apt-get install -y --no-install-recommends chromium; .ci/run does it)"
    );
    CHROMIUM
}
