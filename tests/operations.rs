//! Operating turnstile: `/readyz`, `/status`, `turnstile check` progress and `--json`,
//! `${VAR}` in stdio servers' `args` and `env`, `TURNSTILE_<KEY>` overrides of `[server]`,
//! and the upstream through an HTTP proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`) with the
//! extra `[upstream] headers`.

mod common;

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::mcp::example_server;
use common::{config_text, Http, TestServer};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// A shared server whose command does not exist: it never comes up.
const BROKEN: &str =
    "[mcp_servers.broken]\ncommand = \"/nonexistent/turnstile-no-such-server\"\nstartup_timeout_s = 1\n";

const POLICY: &str = "[policy]\ntrust = [\"mcp__ex__*\"]\nask = [\"mcp__nothing__*\"]\n";

/// Polls `f` until it returns `Some`, for at most 10 s.
async fn eventually<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// GET `path`: status, `Retry-After`, body as JSON.
async fn get_raw(addr: std::net::SocketAddr, path: &str) -> (u16, Option<String>, Value) {
    let mut conn = TcpStream::connect(addr).await.unwrap();
    conn.write_all(
        format!("GET {path} HTTP/1.1\r\nhost: t\r\nconnection: close\r\n\r\n").as_bytes(),
    )
    .await
    .unwrap();
    let mut raw = Vec::new();
    conn.read_to_end(&mut raw).await.unwrap();
    let text = String::from_utf8_lossy(&raw).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
    let retry_after = head
        .lines()
        .find_map(|l| l.strip_prefix("retry-after: ").map(str::to_string));
    (
        status,
        retry_after,
        serde_json::from_str(body).unwrap_or(Value::Null),
    )
}

#[tokio::test]
async fn readyz_is_200_when_the_store_and_shared_servers_are_up() {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start(&config_text(
        &fake,
        &format!("{}\n{POLICY}", example_server("ex", "")),
    ))
    .await;
    let (status, _, body) = get_raw(server.addr, "/readyz").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "ready");
    assert_eq!(body["store"]["writable"], true);
    assert_eq!(body["servers"][0]["name"], "ex");
    assert_eq!(body["servers"][0]["state"], "up");
}

#[tokio::test]
async fn readyz_is_503_naming_a_shared_server_that_is_down() {
    let fake = FakeOpenAi::start().await;
    let extra = format!("{}\n{BROKEN}\n{POLICY}", example_server("ex", ""));
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let (status, retry_after, body) = get_raw(server.addr, "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(retry_after.is_some(), "a 503 carries Retry-After");
    let error = &body["error"];
    assert_eq!(error["type"], "not_ready");
    let message = error["message"].as_str().unwrap();
    assert!(
        message.contains("MCP server broken is failed") && !message.contains("server ex "),
        "{message}"
    );
    let broken = error["servers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == "broken")
        .unwrap();
    assert_eq!(broken["state"], "failed");
    assert!(
        broken["last_error"]
            .as_str()
            .unwrap()
            .contains("cannot start"),
        "{broken}"
    );
    // The store itself is fine.
    assert_eq!(error["store"]["writable"], true);
}

#[tokio::test]
async fn readyz_needs_no_key_but_status_does() {
    std::env::set_var("TURNSTILE_OPS_TEST_KEYS", "k-ops");
    let fake = FakeOpenAi::start().await;
    let extra = "[server]\n".to_string();
    let config = config_text(&fake, "").replace(
        "[server]\n",
        &format!("{extra}api_keys_env = \"TURNSTILE_OPS_TEST_KEYS\"\n"),
    );
    let server = TestServer::start(&config).await;
    assert_eq!(get_raw(server.addr, "/readyz").await.0, 200);
    assert_eq!(get_raw(server.addr, "/status").await.0, 401);
    let (status, body) = server.http.with_key("k-ops").get("/status").await;
    assert_eq!(status, 200, "{body}");
}

#[tokio::test]
async fn status_shows_each_servers_state_pid_tools_restarts_last_call_and_the_store_size() {
    let fake = FakeOpenAi::start().await;
    let extra = format!("{}\n{POLICY}", example_server("ex", ""));
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let (_, tools) = server.http.get("/tools").await;
    let listed = tools["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["server"] == "ex")
        .count();

    let (status, body) = server.http.get("/status").await;
    assert_eq!(status, 200, "{body}");
    let ex = &body["mcp_servers"][0];
    assert_eq!(ex["name"], "ex");
    assert_eq!(ex["scope"], "shared");
    assert_eq!(ex["state"], "up");
    assert_eq!(ex["tools"], listed);
    assert_eq!(ex["restarts"], 0);
    assert!(ex["last_call"].is_null(), "{ex}");
    let pid = ex["pid"].as_u64().expect("a stdio server has a pid");
    assert!(Path::new(&format!("/proc/{pid}")).exists());
    assert_eq!(body["agents"][0]["name"], "assistant");
    assert_eq!(body["agents"][0]["active_turns"], 0);
    assert!(body["store"]["db_bytes"].as_u64().unwrap() > 0, "{body}");
    assert_eq!(body["store"]["files_bytes"], 0);

    // A call is seen as the server's last call.
    let sid = server.session(json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "c1",
        "mcp__ex__add",
        json!({"a": 1, "b": 2}),
    )]));
    fake.push(Reply::text("3"));
    let (status, resp) = server
        .http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "1+2"}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    let (_, body) = server.http.get("/status").await;
    assert!(
        body["mcp_servers"][0]["last_call"]
            .as_str()
            .is_some_and(|t| t.ends_with('Z')),
        "{body}"
    );

    // Killed, it is restarted: a new pid, one restart, the reason kept.
    // SAFETY: kill only sends a signal to the child the server started.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
    }
    let ex = eventually("the server to restart", || async {
        let (_, body) = server.http.get("/status").await;
        let ex = body["mcp_servers"][0].clone();
        (ex["state"] == "up" && ex["restarts"] == 1).then_some(ex)
    })
    .await;
    assert_ne!(ex["pid"].as_u64().unwrap(), pid, "{ex}");
    assert_eq!(ex["last_error"], "the server exited", "{ex}");
}

/// Runs `turnstile check` (with `args`) on `config` in a new folder, with `env`.
async fn check(config: &str, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, config).unwrap();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_turnstile"));
    cmd.arg("check").arg("--config").arg(&path).args(args);
    cmd.env("RUST_LOG", "error");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().await.expect("run turnstile check");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn check_prints_a_progress_line_per_server_as_it_answers() {
    let config = format!("{}\n{BROKEN}\n{POLICY}", example_server("ex", ""));
    let (code, stdout, stderr) = check(&config, &[], &[]).await;
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    assert!(
        stderr.contains("starting 2 MCP servers (up to 30 s): ex, broken"),
        "{stderr}"
    );
    let ex = stderr
        .lines()
        .find(|l| l.trim_start().starts_with("ex: up, "))
        .unwrap_or_else(|| panic!("no progress line for ex:\n{stderr}"));
    assert!(ex.contains(" tools ("), "{ex}");
    assert!(
        stderr
            .lines()
            .any(|l| l.trim_start().starts_with("broken: failed: cannot start")),
        "{stderr}"
    );
    assert!(stdout.contains("mcp__ex__add"), "{stdout}");
}

#[tokio::test]
async fn check_json_reports_tools_servers_unused_patterns_and_errors() {
    let config = format!("{}\n{BROKEN}\n{POLICY}", example_server("ex", ""));
    let (code, stdout, stderr) = check(&config, &["--json"], &[]).await;
    assert_eq!(code, 1, "{stdout}\n{stderr}");
    let doc: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| panic!("{e}: {stdout}"));
    assert_eq!(doc["ok"], false);
    let add = doc["tools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["name"] == "mcp__ex__add")
        .unwrap();
    assert_eq!(add["verdict"], "trust");
    assert_eq!(add["rule"], "mcp__ex__*");
    assert_eq!(add["server"], "ex");
    let servers = doc["servers"].as_array().unwrap();
    assert_eq!(servers[0]["name"], "ex");
    assert_eq!(servers[0]["state"], "up");
    assert_eq!(servers[1]["name"], "broken");
    assert_eq!(servers[1]["state"], "failed");
    assert!(servers[1]["error"]
        .as_str()
        .unwrap()
        .contains("cannot start"));
    assert_eq!(doc["unused_patterns"][0]["pattern"], "mcp__nothing__*");
    assert_eq!(doc["unused_patterns"][0]["list"], "ask");
    assert!(
        doc["errors"][0].as_str().unwrap().contains("broken"),
        "{doc}"
    );

    // Without the broken server: ok, exit 0.
    let config = format!("{}\n{POLICY}", example_server("ex", ""));
    let (code, stdout, _) = check(&config, &["--json"], &[]).await;
    assert_eq!(code, 0, "{stdout}");
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(doc["ok"], true);
    assert_eq!(doc["errors"], json!([]));

    // A config error is JSON too.
    let (code, stdout, _) = check("[server]\nlisten = 5\n", &["--json"], &[]).await;
    assert_eq!(code, 1);
    let doc: Value = serde_json::from_str(&stdout).unwrap();
    assert!(
        doc["errors"][0].as_str().unwrap().contains("listen"),
        "{doc}"
    );
}
