//! Operating turnstile: `/readyz`, `/status`, `turnstile check` progress and `--json`,
//! `${VAR}` in stdio servers' `args` and `env`, `TURNSTILE_<KEY>` overrides of `[server]`,
//! and the upstream through an HTTP proxy (`HTTP_PROXY`, `HTTPS_PROXY`, `NO_PROXY`) with the
//! extra `[upstream] headers`.

use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::common::mcp::example_server;
use crate::common::{config_text, Http, TestServer};
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::Child;
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
        format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").as_bytes(),
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
    let fake = FakeOpenAi::start().await;
    let extra = "[server]\n".to_string();
    let config = config_text(&fake, "").replace(
        "[server]\n",
        &format!("{extra}api_keys_env = \"TURNSTILE_OPS_TEST_KEYS\"\n"),
    );
    let server = TestServer::start_with_env(&config, &[("TURNSTILE_OPS_TEST_KEYS", "k-ops")]).await;
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
    let mut cmd = crate::common::binary::command();
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

/// A `turnstile serve` child: its address and everything it logged so far.
struct Served {
    _child: Child,
    addr: std::net::SocketAddr,
    log: Arc<Mutex<Vec<String>>>,
    _dir: tempfile::TempDir,
}

/// Spawns `turnstile serve` on `config` (in a new folder) with `env` and `args`; waits for it
/// to listen, or returns its exit code and log when it stops first.
async fn serve(config: &str, env: &[(&str, &str)], args: &[&str]) -> Result<Served, (i32, String)> {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config).unwrap();
    let mut cmd = crate::common::binary::command();
    cmd.current_dir(dir.path())
        .args(["serve", "--config", "tools.toml"])
        .args(args)
        .env("RUST_LOG", "info")
        .env("NO_COLOR", "1")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    for var in ["HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY"] {
        cmd.env_remove(var).env_remove(var.to_ascii_lowercase());
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn turnstile");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let log = Arc::new(Mutex::new(Vec::new()));
    let addr = loop {
        match lines.next_line().await.expect("stderr") {
            Some(line) => {
                log.lock().unwrap().push(line.clone());
                if let Some(rest) = line.split("listening on http://").nth(1) {
                    break rest.split_whitespace().next().unwrap().parse().unwrap();
                }
            }
            None => {
                let code = child.wait().await.unwrap().code().unwrap_or(-1);
                return Err((code, log.lock().unwrap().join("\n")));
            }
        }
    };
    let sink = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            sink.lock().unwrap().push(line);
        }
    });
    Ok(Served {
        _child: child,
        addr,
        log,
        _dir: dir,
    })
}

/// One turn on a new session: the turn's answer.
async fn one_turn(http: &Http) -> (u16, Value) {
    let (status, s) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{s}");
    let sid = s["sessionId"].as_str().unwrap();
    http.post(
        &format!("/sessions/{sid}/turns"),
        &json!({"messages": [{"role": "user", "content": "hi"}]}),
    )
    .await
}

#[tokio::test]
async fn variables_in_a_stdio_servers_args_and_env_reach_the_child() {
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "{}\n{POLICY}",
        example_server(
            "ex",
            "args = [\"--test-tools\", \"--label\", \"id=${OPS_LABEL}\"]\nenv = { GREETING = \"${OPS_GREETING}\" }"
        )
    );
    let served = serve(
        &config_text(&fake, &extra),
        &[
            ("OPS_LABEL", "label-from-env"),
            ("OPS_GREETING", "hello-from-env"),
        ],
        &["--listen", "127.0.0.1:0"],
    )
    .await
    .unwrap_or_else(|(code, log)| panic!("exit {code}: {log}"));
    fake.push(Reply::tool_calls(&[
        ("c1", "mcp__ex__env", json!({"name": "GREETING"})),
        ("c2", "mcp__ex__argv", json!({})),
    ]));
    fake.push(Reply::text("done"));
    let (status, body) = one_turn(&Http::new(served.addr)).await;
    assert_eq!(status, 200, "{body}");
    let reqs = fake.requests();
    // The two calls run side by side: find each result by its call id, not by its place.
    let result = |id: &str| -> String {
        reqs[1]["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
            .map(|m| m["content"].to_string())
            .unwrap_or_else(|| panic!("no result for {id}: {}", reqs[1]))
    };
    assert!(result("c1").contains("hello-from-env"), "{}", result("c1"));
    assert!(
        result("c2").contains("id=label-from-env"),
        "{}",
        result("c2")
    );
    // Secrets are not logged.
    let log = served.log.lock().unwrap().join("\n");
    assert!(
        !log.contains("hello-from-env") && !log.contains("label-from-env"),
        "{log}"
    );
}

#[tokio::test]
async fn an_unset_variable_in_args_or_env_fails_check_and_serve_naming_it() {
    let config = format!(
        "{}\n{POLICY}",
        example_server("ex", "args = [\"--label\", \"${OPS_SURELY_UNSET_LABEL}\"]")
    );
    let (code, _, stderr) = check(&config, &[], &[]).await;
    assert_eq!(code, 1, "{stderr}");
    assert!(
        stderr.contains("mcp_servers.ex.args")
            && stderr.contains("${OPS_SURELY_UNSET_LABEL} is not set"),
        "{stderr}"
    );
    let config = format!(
        "{}\n{POLICY}",
        example_server(
            "ex",
            "env = { TOKEN = \"Bearer ${OPS_SURELY_UNSET_TOKEN}\" }"
        )
    );
    let Err((code, log)) = serve(&config, &[], &["--listen", "127.0.0.1:0"]).await else {
        panic!("serve started with an unset variable");
    };
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains("mcp_servers.ex.env.TOKEN") && log.contains("OPS_SURELY_UNSET_TOKEN"),
        "{log}"
    );
}

#[tokio::test]
async fn server_keys_come_from_turnstile_variables_below_the_command_line() {
    let fake = FakeOpenAi::start().await;
    // The file's address cannot be listened on here: only the variable makes serve start.
    let config = config_text(&fake, "").replace(
        "[server]\n",
        "[server]\nlisten = \"192.0.2.1:8787\"\nmax_body_bytes = 1000000\n",
    );
    let served = serve(
        &config,
        &[
            ("TURNSTILE_LISTEN", "127.0.0.1:0"),
            ("TURNSTILE_MAX_BODY_BYTES", "100"),
        ],
        &[],
    )
    .await
    .unwrap_or_else(|(code, log)| panic!("exit {code}: {log}"));
    let http = Http::new(served.addr);
    let (status, body) = http
        .post("/sessions", &json!({"metadata": {"pad": "x".repeat(200)}}))
        .await;
    assert_eq!(status, 413, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("max_body_bytes"),
        "{body}"
    );
    assert_eq!(http.post("/sessions", &json!({})).await.0, 201);

    // --listen beats the variable.
    let served = serve(
        &config,
        &[("TURNSTILE_LISTEN", "192.0.2.1:1")],
        &["--listen", "127.0.0.1:0"],
    )
    .await
    .unwrap_or_else(|(code, log)| panic!("exit {code}: {log}"));
    assert!(served.addr.ip().is_loopback());

    // A value that is not a number is an error naming the variable.
    let Err((code, log)) = serve(
        &config,
        &[("TURNSTILE_MAX_BODY_BYTES", "lots")],
        &["--listen", "127.0.0.1:0"],
    )
    .await
    else {
        panic!("serve started with TURNSTILE_MAX_BODY_BYTES=lots");
    };
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains("TURNSTILE_MAX_BODY_BYTES") && log.contains("not a whole number"),
        "{log}"
    );
}

/// A tiny HTTP proxy: `CONNECT` tunnels and absolute-form requests, each connection's first
/// request line recorded.
struct TestProxy {
    addr: std::net::SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl TestProxy {
    async fn start() -> TestProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let record = seen.clone();
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let record = record.clone();
                tokio::spawn(async move {
                    let _ = proxy_one(conn, record).await;
                });
            }
        });
        TestProxy { addr, seen }
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

async fn proxy_one(conn: TcpStream, seen: Arc<Mutex<Vec<String>>>) -> std::io::Result<()> {
    let mut conn = BufReader::new(conn);
    let mut head = String::new();
    loop {
        let mut line = String::new();
        if conn.read_line(&mut line).await? == 0 {
            return Ok(());
        }
        head.push_str(&line);
        if line == "\r\n" {
            break;
        }
    }
    let request_line = head.lines().next().unwrap_or_default().to_string();
    seen.lock().unwrap().push(request_line.clone());
    let mut parts = request_line.split_whitespace();
    let method = parts.next().unwrap_or_default();
    let target = parts.next().unwrap_or_default();
    if method == "CONNECT" {
        let mut upstream = TcpStream::connect(target).await?;
        conn.get_mut()
            .write_all(b"HTTP/1.1 200 Connection established\r\n\r\n")
            .await?;
        tokio::io::copy_bidirectional(conn.get_mut(), &mut upstream).await?;
    } else {
        let uri: http::Uri = target.parse().map_err(std::io::Error::other)?;
        let mut upstream = TcpStream::connect(uri.authority().unwrap().as_str()).await?;
        // Servers accept the absolute form too: pass the head on as it came.
        upstream.write_all(head.as_bytes()).await?;
        let buffered = conn.buffer().to_vec();
        upstream.write_all(&buffered).await?;
        let mut conn = conn.into_inner();
        tokio::io::copy_bidirectional(&mut conn, &mut upstream).await?;
    }
    Ok(())
}

#[tokio::test]
async fn the_upstream_is_reached_through_http_proxy_with_the_extra_headers_and_no_proxy_bypasses_it(
) {
    let fake = FakeOpenAi::start().await;
    let proxy = TestProxy::start().await;
    let config = config_text(&fake, "").replace(
        "retries = 0\n",
        "retries = 0\nheaders = { X-Org = \"${OPS_ORG}\", X-Static = \"s\" }\n",
    );
    let proxy_url = format!("http://{}", proxy.addr);
    let served = serve(
        &config,
        &[("http_proxy", &proxy_url), ("OPS_ORG", "acme")],
        &["--listen", "127.0.0.1:0"],
    )
    .await
    .unwrap_or_else(|(code, log)| panic!("exit {code}: {log}"));
    fake.push(Reply::text("through the proxy"));
    let (status, body) = one_turn(&Http::new(served.addr)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        proxy.seen(),
        vec![format!(
            "POST http://{}/v1/chat/completions HTTP/1.1",
            fake.addr()
        )],
        "the request went to the proxy in absolute form"
    );
    let headers = fake.request_headers();
    assert_eq!(headers[0]["x-org"], "acme");
    assert_eq!(headers[0]["x-static"], "s");
    drop(served);

    // NO_PROXY names the upstream's address: straight there.
    let served = serve(
        &config,
        &[
            ("HTTP_PROXY", &proxy_url),
            ("NO_PROXY", "example.com,127.0.0.0/8"),
            ("OPS_ORG", "acme"),
        ],
        &["--listen", "127.0.0.1:0"],
    )
    .await
    .unwrap_or_else(|(code, log)| panic!("exit {code}: {log}"));
    fake.push(Reply::text("direct"));
    let (status, body) = one_turn(&Http::new(served.addr)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(proxy.seen().len(), 1, "{:?}", proxy.seen());
    assert_eq!(fake.request_headers().len(), 2);

    // An unset variable in [upstream] headers stops start-up, naming it.
    let Err((code, log)) = serve(&config, &[], &["--listen", "127.0.0.1:0"]).await else {
        panic!("serve started with OPS_ORG unset");
    };
    assert_eq!(code, 1, "{log}");
    assert!(
        log.contains("OPS_ORG") && log.contains("upstream.headers.X-Org"),
        "{log}"
    );
}

#[tokio::test]
async fn an_https_upstream_is_reached_through_a_connect_tunnel() {
    // The tunnel is made and used: the TLS handshake then fails, since the fake upstream speaks
    // plain HTTP, which says the TLS went end to end through the tunnel.
    let fake = FakeOpenAi::start().await;
    let proxy = TestProxy::start().await;
    let https_url = format!("https://{}/v1", fake.addr());
    let config = config_text(&fake, "").replace(&fake.base_url(), &https_url);
    let served = serve(
        &config,
        &[("HTTPS_PROXY", &format!("http://{}", proxy.addr))],
        &["--listen", "127.0.0.1:0"],
    )
    .await
    .unwrap_or_else(|(code, log)| panic!("exit {code}: {log}"));
    let (status, body) = one_turn(&Http::new(served.addr)).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        proxy.seen(),
        vec![format!("CONNECT {} HTTP/1.1", fake.addr())]
    );
    assert_eq!(
        fake.request_count(),
        0,
        "no plain request reached the upstream"
    );
}
