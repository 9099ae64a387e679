//! Third-party test dependencies, installed on first use into `<target dir>/test-deps/`, so that
//! `cargo test` passes on a fresh clone with only Rust, Python 3 (with venv) and Node/npm:
//!
//! - `venv/`: a Python virtual environment (`python3 -m venv`) with the pinned PyPI packages of
//!   [`PY_REQUIREMENTS`]: `mcp-server-time` (federated by tests/mcp/federation.rs), the runs
//!   spec's Python client needs (tests/api/runs.rs) and the official `anthropic` SDK (reads the
//!   fake Messages API, tests/upstream/anthropic_thinking.rs);
//! - `spec_clients/`: `npm ci` from the committed `tests/spec_clients/package-lock.json`:
//!   `@modelcontextprotocol/server-filesystem` (tests/api/deliver_file.rs) and `eventsource` (the
//!   spec's JavaScript client, tests/api/runs.rs).
//!
//! Each folder holds a marker recording what was installed (the requirement list, the package
//! files): once it matches, a run does nothing more than read it. Test binaries run as separate
//! processes (and tests as threads), so the check and the install happen under an exclusive
//! `flock` on `test-deps/.lock`. An install that fails or a missing `python3`/`npm` panics with what
//! is missing and the installer's own output; nothing is skipped.

use std::fs::{self, File};
use std::io::ErrorKind;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The PyPI packages the tests need, pinned (the newest of each when they were pinned).
pub const PY_REQUIREMENTS: &[&str] = &[
    "mcp-server-time==2026.10.19",
    // The official MCP Python SDK: the client of the /mcp tests and the child servers written
    // for the tests (elicitation, sampling); pinned here, not only through mcp-server-time.
    "mcp==2.3.0",
    "sseclient-py==1.9.0",
    "requests==2.34.2",
    "anthropic==2.10.0",
];

/// The Python interpreter of the provisioned venv (no system site-packages): it imports
/// `mcp_server_time`, `sseclient`, `requests` and `anthropic`.
pub fn python() -> PathBuf {
    let dir = deps_dir().join("venv");
    let python = dir.join("bin").join("python");
    let key = format!(
        "python3 -m venv; pip install {}\n",
        PY_REQUIREMENTS.join(" ")
    );
    ensure(&dir, &key, &python, |dir| {
        let mut venv = Command::new("python3");
        venv.arg("-m").arg("venv").arg(dir);
        run(
            venv,
            "python3",
            "Python 3 with its venv module (Debian/Ubuntu: apt install python3 python3-venv)",
        );
        let mut pip = Command::new(dir.join("bin").join("python"));
        pip.args([
            "-m",
            "pip",
            "install",
            "--no-input",
            "--disable-pip-version-check",
        ])
        .args(PY_REQUIREMENTS);
        run(
            pip,
            "pip (of the test venv)",
            "access to the Python package index",
        );
    });
    python
}

/// The folder where `npm ci` installed `tests/spec_clients/package-lock.json`: its
/// `node_modules/` resolves the imports of scripts copied into it (see [`node_script`]).
pub fn spec_clients() -> PathBuf {
    let src = manifest_dir().join("tests/spec_clients");
    let files = ["package.json", "package-lock.json"];
    let mut key = String::from("npm ci --no-audit --no-fund\n");
    for name in files {
        let text = fs::read_to_string(src.join(name))
            .unwrap_or_else(|e| panic!("read {}: {e}", src.join(name).display()));
        key.push_str(&text);
    }
    let dir = deps_dir().join("spec_clients");
    let ready = dir.join("node_modules");
    ensure(&dir, &key, &ready, |dir| {
        for name in files {
            fs::copy(src.join(name), dir.join(name))
                .unwrap_or_else(|e| panic!("copy {name} to {}: {e}", dir.display()));
        }
        let mut npm = Command::new("npm");
        npm.args(["ci", "--no-audit", "--no-fund"]).current_dir(dir);
        run(
            npm,
            "npm",
            "Node.js with npm, and access to the npm registry",
        );
    });
    dir
}

/// The entry point of the provisioned `@modelcontextprotocol/server-filesystem` (run with `node`).
pub fn server_filesystem() -> PathBuf {
    let path =
        spec_clients().join("node_modules/@modelcontextprotocol/server-filesystem/dist/index.js");
    assert!(path.is_file(), "{} is missing after npm ci", path.display());
    path
}

/// A copy of `tests/spec_clients/<name>` inside [`spec_clients`], so that Node resolves its
/// imports (ES modules ignore `NODE_PATH`) from the provisioned `node_modules/`.
pub fn node_script(name: &str) -> PathBuf {
    let dir = spec_clients();
    let src = manifest_dir().join("tests/spec_clients").join(name);
    let dest = dir.join(name);
    // Copy then rename: a reader never sees a half-written script.
    let tmp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    fs::copy(&src, &tmp).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    fs::rename(&tmp, &dest).unwrap_or_else(|e| panic!("rename to {}: {e}", dest.display()));
    dest
}

pub fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `<target dir>/test-deps`: the target dir is `$CARGO_TARGET_DIR` when set (relative to the
/// manifest folder, where cargo runs tests), else `<manifest>/target`.
pub fn deps_dir() -> PathBuf {
    let target = match std::env::var_os("CARGO_TARGET_DIR") {
        Some(dir) if !dir.is_empty() => manifest_dir().join(dir),
        _ => manifest_dir().join("target"),
    };
    target.join("test-deps")
}

/// Under the lock: when `dir`'s marker says `key` and `ready` exists, nothing; else a fresh `dir`,
/// `install(dir)`, then the marker (written last, so an interrupted install is redone).
pub fn ensure(dir: &Path, key: &str, ready: &Path, install: impl FnOnce(&Path)) {
    let deps = deps_dir();
    fs::create_dir_all(&deps).unwrap_or_else(|e| panic!("create {}: {e}", deps.display()));
    let _lock = lock(&deps.join(".lock"));
    let marker = dir.join(".provisioned");
    if ready.exists() && fs::read_to_string(&marker).is_ok_and(|m| m == key) {
        return;
    }
    match fs::remove_dir_all(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == ErrorKind::NotFound => {}
        Err(e) => panic!("remove {}: {e}", dir.display()),
    }
    fs::create_dir_all(dir).unwrap_or_else(|e| panic!("create {}: {e}", dir.display()));
    install(dir);
    assert!(
        ready.exists(),
        "{} is missing after installing into {}",
        ready.display(),
        dir.display()
    );
    fs::write(&marker, key).unwrap_or_else(|e| panic!("write {}: {e}", marker.display()));
}

/// An exclusive `flock` on `path`, held until the file is dropped (also by a panic's unwinding;
/// the kernel drops it if the process dies).
fn lock(path: &Path) -> File {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()));
    loop {
        // SAFETY: flock on a file descriptor that `file` owns and keeps open.
        if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX) } == 0 {
            return file;
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != ErrorKind::Interrupted {
            panic!("flock {}: {e}", path.display());
        }
    }
}

/// Run an installer step; panic naming `what` and `needs` when it cannot start or fails, with the
/// tail of its output.
pub fn run(mut cmd: Command, what: &str, needs: &str) {
    let line = format!("{cmd:?}");
    let out = match cmd.stdin(std::process::Stdio::null()).output() {
        Ok(out) => out,
        Err(e) if e.kind() == ErrorKind::NotFound => panic!(
            "`{what}` was not found ({e}): the tests that use third-party MCP servers and the \
             spec's client examples provision them into target/test-deps and need {needs}"
        ),
        Err(e) => panic!("{line} could not start: {e}"),
    };
    if !out.status.success() {
        panic!(
            "provisioning test dependencies failed: {line} exited with {} (it needs {needs})\n\
             --- stderr (last lines) ---\n{}\n--- stdout (last lines) ---\n{}",
            out.status,
            tail(&out.stderr),
            tail(&out.stdout)
        );
    }
}

fn tail(bytes: &[u8]) -> String {
    let text = String::from_utf8_lossy(bytes);
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}
