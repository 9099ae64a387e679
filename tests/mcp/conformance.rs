//! The official MCP conformance framework's client scenarios, played by turnstile's MCP client.
//!
//! `@modelcontextprotocol/conformance` (pinned, with the Node 22 it needs from npm's `node`
//! package; see tests/mcp_conformance/package.json) is provisioned into
//! `target/test-deps/mcp_conformance`. For each client scenario the framework starts the
//! scenario's server and runs `tests/mcp_conformance/driver.py URL`, which points
//! `[mcp_servers.conf]` at it and drives the real turnstile binary (login when the scenario
//! needs an authorization, then serve, a session that calls every tool). The framework judges
//! from what its server saw.
//!
//! Every non-draft client scenario runs; those in [`SUPPORTED`] must pass. The others are
//! listed in [`NOT_YET`] with why; they run too and their outcome is printed, so a scenario
//! that starts passing shows in the summary.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use crate::common::provision::{self, deps_dir, ensure, manifest_dir};

/// Client scenarios that must pass.
const SUPPORTED: &[&str] = &[
    "initialize",
    "tools_call",
    "sse-retry",
    "elicitation-sep1034-client-defaults",
    "auth/metadata-default",
    "auth/metadata-var1",
    "auth/metadata-var2",
    "auth/metadata-var3",
    "auth/basic-cimd",
    "auth/scope-from-www-authenticate",
    "auth/scope-from-scopes-supported",
    "auth/scope-omitted-when-undefined",
    "auth/scope-step-up",
    "auth/scope-retry-limit",
    "auth/token-endpoint-auth-basic",
    "auth/token-endpoint-auth-post",
    "auth/token-endpoint-auth-none",
    "auth/pre-registration",
    "auth/2025-03-26-oauth-metadata-backcompat",
    "auth/2025-03-26-oauth-endpoint-fallback",
    "auth/client-credentials-jwt",
    "auth/client-credentials-basic",
    "auth/cross-app-access-complete-flow",
];

/// Non-draft client scenarios not yet supported, with why.
const NOT_YET: &[(&str, &str)] = &[];

/// The framework's folder: `npm ci` of tests/mcp_conformance/package-lock.json.
fn framework() -> PathBuf {
    let src = manifest_dir().join("tests/mcp_conformance");
    let files = ["package.json", "package-lock.json"];
    let mut key = String::from("npm ci --no-audit --no-fund\n");
    for name in files {
        key.push_str(&std::fs::read_to_string(src.join(name)).expect("read package files"));
    }
    let dir = deps_dir().join("mcp_conformance");
    let ready = dir.join("node_modules/.bin/conformance");
    ensure(&dir, &key, &ready, |dir| {
        for name in files {
            std::fs::copy(src.join(name), dir.join(name)).expect("copy package files");
        }
        let mut npm = Command::new("npm");
        npm.args(["ci", "--no-audit", "--no-fund"]).current_dir(dir);
        provision::run(
            npm,
            "npm",
            "Node.js with npm, and access to the npm registry",
        );
    });
    dir
}

/// Node 22 and the framework's binaries first on `PATH`.
fn path_with(bin: &Path) -> String {
    let old = std::env::var("PATH").unwrap_or_default();
    format!("{}:{old}", bin.display())
}

/// The framework's list of client scenarios, without the draft ones.
fn listed_scenarios(dir: &Path) -> Vec<String> {
    let bin = dir.join("node_modules/.bin");
    let out = Command::new(bin.join("conformance"))
        .arg("list")
        .env("PATH", path_with(&bin))
        .output()
        .expect("run conformance list");
    assert!(out.status.success(), "conformance list failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let client = text
        .split("Client scenarios")
        .nth(1)
        .expect("client section");
    client
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter(|l| !l.contains("[draft]"))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Run one scenario; its outcome and the framework's output.
fn run_scenario(dir: &Path, scenario: &str) -> (bool, String) {
    let bin = dir.join("node_modules/.bin");
    let driver = manifest_dir().join("tests/mcp_conformance/driver.py");
    let out = Command::new(bin.join("conformance"))
        .args(["client", "--timeout", "60000", "--scenario", scenario])
        .arg("--command")
        .arg(format!("python3 {}", driver.display()))
        .env("PATH", path_with(&bin))
        .env("TURNSTILE_BIN", env!("CARGO_BIN_EXE_turnstile"))
        .env("RUST_LOG", "info")
        .output()
        .expect("run conformance client");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

/// The framework's closing counts line of a scenario (`Passed: N/M, ...`), for the summary.
fn counts(output: &str) -> String {
    output
        .lines()
        .rev()
        .find(|l| l.contains("Passed:") || l.contains("passed"))
        .unwrap_or("")
        .trim()
        .to_string()
}

#[test]
fn client_scenarios() {
    let dir = framework();
    let listed = listed_scenarios(&dir);
    let mut known: Vec<&str> = SUPPORTED.to_vec();
    known.extend(NOT_YET.iter().map(|(s, _)| *s));
    for s in &listed {
        assert!(
            known.contains(&s.as_str()),
            "the framework lists client scenario {s}, which this test does not know: add it to SUPPORTED or NOT_YET"
        );
    }
    // Two scenarios at a time (each runs a turnstile process and the framework's server).
    let queue = Mutex::new(listed.clone());
    let results = Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..2 {
            s.spawn(|| loop {
                let Some(scenario) = queue.lock().unwrap().pop() else {
                    break;
                };
                let (ok, out) = run_scenario(&dir, &scenario);
                results.lock().unwrap().push((scenario, ok, out));
            });
        }
    });
    let mut results = results.into_inner().unwrap();
    results.sort_by(|a, b| a.0.cmp(&b.0));
    let passed = results.iter().filter(|r| r.1).count();
    println!(
        "MCP conformance, client scenarios: {passed} passed, {} failed",
        results.len() - passed
    );
    for (scenario, ok, out) in &results {
        let why = NOT_YET
            .iter()
            .find(|(s, _)| s == scenario)
            .map(|(_, why)| format!(" (not yet supported: {why})"))
            .unwrap_or_default();
        println!(
            "  {} {scenario}{why}  {}",
            if *ok { "PASS" } else { "FAIL" },
            counts(out)
        );
    }
    let failed: Vec<&(String, bool, String)> = results
        .iter()
        .filter(|(s, ok, _)| !ok && SUPPORTED.contains(&s.as_str()))
        .collect();
    for (s, _, out) in &failed {
        eprintln!("===== {s} =====\n{out}");
    }
    assert!(
        failed.is_empty(),
        "supported scenarios failed: {:?}",
        failed.iter().map(|f| &f.0).collect::<Vec<_>>()
    );
    for s in SUPPORTED {
        assert!(
            listed.iter().any(|l| l == s),
            "{s} is no longer a client scenario"
        );
    }
}
