//! The official MCP conformance framework's SERVER scenarios against `/mcp`.
//!
//! `@modelcontextprotocol/conformance` (pinned, with Node 22; provisioned into
//! `target/test-deps/mcp_conformance` exactly as tests/mcp/conformance.rs does) runs each server
//! scenario (`conformance server --url http://127.0.0.1:PORT/mcp --suite all`) against the
//! real turnstile binary with `/mcp` on, federating the fixture server `fx`
//! (tests/mcp_endpoint_resources/child.py: the framework's reference tools, resources,
//! template, prompts and completions), everything trusted, sampling allowed.
//!
//! The scenarios address the reference server's own names (a tool `test_image_content`, a
//! prompt `test_simple_prompt`), so `/mcp` serves them with `names = "own"`: what passes is
//! turnstile passing the server through (content of every kind, progress, sampling and
//! elicitation relayed to the framework's client, schemas as listed). It runs twice: over a
//! shared fixture, where [`FAIL`] (logging) must fail, each with why, and over a
//! session-scoped one (an instance per MCP session), where every scenario must pass. A
//! scenario that starts passing fails this test until it is moved.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::provision::{self, deps_dir, ensure, manifest_dir};
use serde_json::Value;

/// Server scenarios that pass (against a session-scoped server, those in [`FAIL`] too).
const PASS: &[&str] = &[
    "server-initialize",
    "ping",
    "tools-list",
    "tools-call-simple-text",
    "tools-call-image",
    "tools-call-audio",
    "tools-call-embedded-resource",
    "tools-call-mixed-content",
    "tools-call-error",
    "tools-call-with-progress",
    // The child's sampling request, relayed to the framework's client (which declared sampling).
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
    "json-schema-2020-12",
    "server-sse-polling",
    "server-sse-multiple-streams",
    "dns-rebinding-protection",
    "resources-list",
    "resources-read-text",
    "resources-read-binary",
    "resources-templates-read",
    "resources-subscribe",
    "resources-unsubscribe",
    "prompts-list",
    "prompts-get-simple",
    "prompts-get-with-args",
    "prompts-get-embedded-resource",
    "prompts-get-with-image",
    "completion-complete",
];

/// Why a shared server's logging is not passed through.
const SHARED_LOGS: &str = "a shared server's log level and its notifications/message belong to no one session: setting it for one client, or relaying its messages to whoever has a call open, would reach (or hand over) every key's";

/// Scenarios that fail against a shared server, with why.
const FAIL: &[(&str, &str)] = &[
    ("logging-set-level", "logging/setLevel is not served: LOGS"),
    (
        "tools-call-with-logging",
        "sets a log level, then expects the tool's three log messages: LOGS",
    ),
];

/// The framework's folder: `npm ci` of tests/mcp_conformance/package-lock.json (the same key
/// and folder as tests/mcp/conformance.rs, so one install serves both).
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

/// The framework's server scenarios (`conformance list`).
fn listed_scenarios(dir: &Path) -> Vec<String> {
    let bin = dir.join("node_modules/.bin");
    let out = Command::new(bin.join("conformance"))
        .arg("list")
        .env("PATH", path_with(&bin))
        .output()
        .expect("run conformance list");
    assert!(out.status.success(), "conformance list failed: {out:?}");
    let text = String::from_utf8_lossy(&out.stdout);
    let server = text
        .split("Server scenarios")
        .nth(1)
        .and_then(|s| s.split("Client scenarios").next())
        .expect("a server section");
    server
        .lines()
        .filter_map(|l| l.trim().strip_prefix("- "))
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect()
}

/// Run every server scenario (`--suite all`) against `url` in one go: the framework's output,
/// and each scenario's checks as it saved them into `results` (`server-<scenario>-<time>/`,
/// the time with five dashes).
async fn run_all(dir: &Path, url: &str, results: &Path) -> (String, HashMap<String, Vec<Value>>) {
    let bin = dir.join("node_modules/.bin");
    let run = tokio::process::Command::new(bin.join("conformance"))
        .args(["server", "--url", url, "--suite", "all", "-o"])
        .arg(results)
        .env("PATH", path_with(&bin))
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("the scenarios ran within 300 s")
        .expect("run conformance server");
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let mut checks = HashMap::new();
    for entry in std::fs::read_dir(results).into_iter().flatten().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(scenario) = name
            .strip_prefix("server-")
            .and_then(|rest| rest.rsplitn(7, '-').nth(6))
        else {
            continue;
        };
        let json = std::fs::read_to_string(entry.path().join("checks.json")).unwrap_or_default();
        let list: Vec<Value> = serde_json::from_str(&json).unwrap_or_default();
        checks.insert(scenario.to_string(), list);
    }
    (text, checks)
}

/// Passed when it has checks and none failed; with its counts.
fn outcome(checks: &[Value]) -> (bool, String) {
    let count = |status: &str| checks.iter().filter(|c| c["status"] == status).count();
    let (ok, failed) = (count("SUCCESS"), count("FAILURE"));
    (
        !checks.is_empty() && failed == 0,
        format!("{ok} checks passed, {failed} failed"),
    )
}

/// `/mcp` over the fixture `fx` with `names = "own"`, its `[mcp_servers.fx]` table with
/// `extra` lines.
fn config(dir: &Path, extra: &str) -> PathBuf {
    let text = format!(
        "[server]\ndata_dir = {:?}\nsandboxes = {:?}\n\n[agents.assistant]\ntools = [\"*\"]\n\n{}sampling = true\n{extra}\n\n[policy]\ndefault = \"trust\"\n\n[mcp_endpoint]\nenabled = true\nnames = \"own\"\n",
        dir.join("data").display().to_string(),
        dir.join("sandboxes").display().to_string(),
        crate::common::fixture_server::fixture_server("fx"),
    );
    let path = dir.join("tools.toml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_scenarios_against_a_shared_server() {
    scenarios("a shared server", "", FAIL).await;
}

/// Each MCP session gets its own instance of the fixture (`scope = "session"`), whose log
/// messages are its session's: logging passes too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_scenarios_against_a_session_scoped_server() {
    scenarios("a session-scoped server", "scope = \"session\"", &[]).await;
}

/// Run every server scenario against `/mcp` over the fixture (`extra` in its table): each one
/// listed must pass but those in `fail`, which must fail.
async fn scenarios(what: &str, extra: &str, fail: &[(&str, &str)]) {
    let framework = framework();
    let listed = listed_scenarios(&framework);
    let known: Vec<&str> = PASS
        .iter()
        .copied()
        .chain(FAIL.iter().map(|(s, _)| *s))
        .collect();
    for s in &listed {
        assert!(
            known.contains(&s.as_str()),
            "the framework lists server scenario {s}, which this test does not know: add it to PASS or FAIL"
        );
    }
    for s in &known {
        assert!(
            listed.iter().any(|l| l == s),
            "{s} is no longer a server scenario"
        );
    }
    let dir = tempfile::tempdir().unwrap();
    let (_child, addr) = crate::common::binary::serve(&config(dir.path(), extra)).await;
    let url = format!("http://{addr}/mcp");
    let (output, checks) = run_all(&framework, &url, &dir.path().join("results")).await;
    let results: Vec<(String, bool, String)> = listed
        .iter()
        .map(|s| {
            let checks = checks.get(s).map(Vec::as_slice).unwrap_or_default();
            let (ok, counts) = outcome(checks);
            let details = serde_json::to_string_pretty(checks).unwrap_or_default();
            (s.clone(), ok, format!("{counts}\n{details}"))
        })
        .collect();
    let passed = results.iter().filter(|r| r.1).count();
    println!(
        "MCP conformance, server scenarios against /mcp over {what}: {passed} passed, {} failed, of {}",
        results.len() - passed,
        results.len()
    );
    let mut wrong = Vec::new();
    for (scenario, ok, out) in &results {
        let why = fail
            .iter()
            .find(|(s, _)| s == scenario)
            .map(|(_, why)| format!(" ({})", why.replace("LOGS", SHARED_LOGS)))
            .unwrap_or_default();
        println!(
            "  {} {scenario}{why}  {}",
            if *ok { "PASS" } else { "FAIL" },
            out.lines().next().unwrap_or_default()
        );
        let expected = !fail.iter().any(|(s, _)| s == scenario);
        // A pass must be the reference tools' own answers, never an "Unknown tool" refusal.
        if *ok != expected || (*ok && out.contains("Unknown tool")) {
            wrong.push(scenario.clone());
        }
    }
    for (s, _, out) in results.iter().filter(|r| wrong.contains(&r.0)) {
        eprintln!("===== {s} =====\n{out}");
    }
    if !wrong.is_empty() {
        eprintln!("===== the framework's output =====\n{output}");
    }
    assert!(
        wrong.is_empty(),
        "scenarios not as expected (a PASS failed, or a FAIL passed: move it): {wrong:?}"
    );
}
