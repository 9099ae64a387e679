//! MCP servers whose answers break the wire's rules: an answer over the 16 MiB an MCP message
//! may have (over stdio and over streamable HTTP), a log message that large, and a remote server
//! (behind a gateway) answering HTTP 500. Each call ends at once, well before its `timeout_s`,
//! with a result that says in words what failed (no Rust type names), and the server goes on
//! serving the next call.
//!
//! The servers are real: the example rmcp server (`examples/mcp_example.rs`, its `big` test
//! tool) as a stdio child of the real binary (whose log is checked) and over HTTP; the gateway
//! is a small HTTP proxy in front of it that answers 500 to one tool.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use crate::common::mcp::example_server_path;
use crate::common::{config_text, Http, TestServer};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// Each server's `timeout_s`: a call that ends only by it takes this long.
const TIMEOUT_S: u64 = 120;
/// A call that ends at once ends well within this.
const AT_ONCE: Duration = Duration::from_secs(TIMEOUT_S / 2);
/// An answer's text over the limit (17 MiB).
const BIG: u64 = 17 << 20;

/// The tool result of one call of `tool` in a turn of `sid`, as the model got it, and how long
/// the turn took.
async fn call_tool(
    http: &Http,
    fake: &FakeOpenAi,
    sid: &str,
    tool: &str,
    args: Value,
) -> (String, Duration) {
    static N: AtomicUsize = AtomicUsize::new(0);
    let id = format!("call_{}", N.fetch_add(1, Ordering::SeqCst));
    fake.push(Reply::tool_calls(&[(&id, tool, args)]));
    fake.push(Reply::text("done"));
    let started = Instant::now();
    let (status, resp) = http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": format!("call {tool}")}]}),
        )
        .await;
    assert_eq!(status, 200, "{resp}");
    let took = started.elapsed();
    let result = fake
        .requests()
        .iter()
        .rev()
        .flat_map(|r| r["messages"].as_array().cloned().unwrap_or_default())
        .find(|m| m["role"] == "tool" && m["tool_call_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id}"))["content"]
        .as_str()
        .expect("text content")
        .to_string();
    (result, took)
}

async fn session(http: &Http) -> String {
    let (status, v) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    v["sessionId"].as_str().unwrap().to_string()
}

/// What a result that reports a failure must never hold: Rust paths and generics.
fn in_words(result: &str) {
    assert!(
        !result.contains("::") && !result.contains('<'),
        "Rust type syntax in a tool result: {result}"
    );
}

/// Wait until `dir/log.txt` (the binary's WARN and ERROR lines) has a line with all `needles`.
async fn logged(dir: &Path, needles: &[&str]) -> String {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        let log = std::fs::read_to_string(dir.join("log.txt")).unwrap_or_default();
        if let Some(line) = log.lines().find(|l| needles.iter().all(|n| l.contains(n))) {
            return line.to_string();
        }
        assert!(
            Instant::now() < end,
            "no log line with {needles:?} in:\n{log}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_stdio_answer_over_16_mib_ends_its_call_at_once_with_the_reason() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!(
        "[mcp_servers.ex]\ncommand = {:?}\nargs = [\"--test-tools\"]\ntimeout_s = {TIMEOUT_S}\n\n[policy]\ntrust = [\"mcp__*\"]\n",
        example_server_path().display().to_string()
    );
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, &extra)).unwrap();
    let (mut child, http) = crate::common::binary::serve_in(dir.path()).await;
    let sid = session(&http).await;
    let (pid, _) = call_tool(&http, &fake, &sid, "mcp__ex__pid", json!({})).await;

    let (result, took) = call_tool(&http, &fake, &sid, "mcp__ex__big", json!({"bytes": BIG})).await;
    assert!(
        took < AT_ONCE,
        "the call took {took:?} (timeout_s {TIMEOUT_S})"
    );
    in_words(&result);
    assert!(
        result.starts_with("the answer of MCP server ex was 17")
            && result.ends_with("MiB, over the 16 MiB an MCP message may have"),
        "{result}"
    );
    let line = logged(dir.path(), &["WARN", "ex", "over the size", "size_bytes="]).await;
    assert!(line.contains("its call ended with the reason"), "{line}");

    // A log message that large answers no call: dropped, logged with the server and its size,
    // and the call it came with is answered.
    let (result, took) = call_tool(
        &http,
        &fake,
        &sid,
        "mcp__ex__big",
        json!({"bytes": BIG, "log": true}),
    )
    .await;
    assert_eq!(result, format!("logged {BIG} bytes"));
    assert!(took < AT_ONCE, "{took:?}");
    logged(
        dir.path(),
        &["WARN", "ex", "a notification over the size", "size_bytes="],
    )
    .await;

    // The same child serves the next calls: no restart, nothing out of step.
    let (echo, _) = call_tool(
        &http,
        &fake,
        &sid,
        "mcp__ex__echo",
        json!({"text": "after"}),
    )
    .await;
    assert_eq!(echo, "after");
    let (again, _) = call_tool(&http, &fake, &sid, "mcp__ex__pid", json!({})).await;
    assert_eq!(again, pid);
    let (fits, _) = call_tool(
        &http,
        &fake,
        &sid,
        "mcp__ex__big",
        json!({"bytes": 15 << 20}),
    )
    .await;
    // Under the limit it arrives whole: the model gets its first part, the workspace all of it.
    assert!(fits.starts_with("bbbb"), "{}", &fits[..200.min(fits.len())]);
    let kept = dir.path().join("sandboxes").join(&sid).join("tool_results");
    let whole = std::fs::read_dir(&kept)
        .unwrap()
        .flatten()
        .any(|f| f.metadata().unwrap().len() == 15 << 20);
    assert!(whole, "no 15 MiB result in {}", kept.display());
    child.kill().await.unwrap();
}

/// The example server over streamable HTTP; its URL.
async fn http_example() -> (tokio::process::Child, String) {
    let mut child = tokio::process::Command::new(example_server_path())
        .args(["--http", "127.0.0.1:0", "--test-tools"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut out = tokio::io::BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    tokio::io::AsyncBufReadExt::read_line(&mut out, &mut line)
        .await
        .unwrap();
    let url = line
        .trim()
        .strip_prefix("listening on ")
        .expect("url line")
        .to_string();
    (child, url)
}

fn remote(name: &str, url: &str) -> String {
    format!("[mcp_servers.{name}]\nurl = {url:?}\ntimeout_s = {TIMEOUT_S}\n")
}

#[tokio::test]
async fn a_streamable_http_answer_over_16_mib_ends_its_call_at_once_with_the_reason() {
    let (_child, url) = http_example().await;
    let fake = FakeOpenAi::start().await;
    let extra = format!("{}\n[policy]\ntrust = [\"mcp__*\"]\n", remote("far", &url));
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = session(&server.http).await;
    let (result, took) = call_tool(
        &server.http,
        &fake,
        &sid,
        "mcp__far__big",
        json!({"bytes": BIG}),
    )
    .await;
    assert!(
        took < AT_ONCE,
        "the call took {took:?} (timeout_s {TIMEOUT_S})"
    );
    in_words(&result);
    assert!(
        result.starts_with("the answer of MCP server far was 17")
            && result.ends_with("over the 16 MiB an MCP message may have"),
        "{result}"
    );
    let (result, _) = call_tool(
        &server.http,
        &fake,
        &sid,
        "mcp__far__big",
        json!({"bytes": BIG, "log": true}),
    )
    .await;
    assert_eq!(result, format!("logged {BIG} bytes"));
    let (echo, _) = call_tool(
        &server.http,
        &fake,
        &sid,
        "mcp__far__echo",
        json!({"text": "after"}),
    )
    .await;
    assert_eq!(echo, "after");
    server.stop().await;
}

/// A gateway in front of `upstream`: passes every request through, but answers a `tools/call`
/// of `echo` with the text "boom" with HTTP 500 and an HTML page.
async fn gateway(upstream: String) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                return;
            };
            let client = client.clone();
            let upstream = upstream.clone();
            let service = hyper::service::service_fn(move |req: hyper::Request<Incoming>| {
                let client = client.clone();
                let upstream = upstream.clone();
                async move {
                    let (mut parts, body) = req.into_parts();
                    let body = body.collect().await?.to_bytes();
                    let rpc: Value = serde_json::from_slice(&body).unwrap_or_default();
                    if rpc["method"] == "tools/call" && rpc["params"]["arguments"]["text"] == "boom"
                    {
                        let page = "<html><body>Internal Server Error</body></html>";
                        let answer = hyper::Response::builder()
                            .status(500)
                            .header("content-type", "text/html")
                            .body(http_body_util::Either::Left(Full::new(Bytes::from(page))))
                            .unwrap();
                        return Ok::<_, hyper::Error>(answer);
                    }
                    parts.uri = upstream.parse().unwrap();
                    parts.headers.remove("host");
                    let forwarded = hyper::Request::from_parts(parts, Full::new(body));
                    let answer = client.request(forwarded).await.unwrap();
                    Ok(answer.map(http_body_util::Either::Right))
                }
            });
            tokio::spawn(
                hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service),
            );
        }
    });
    addr
}

#[tokio::test]
async fn an_http_500_is_a_result_in_words_naming_the_status() {
    let (_child, url) = http_example().await;
    let gw = gateway(url).await;
    let fake = FakeOpenAi::start().await;
    let extra = format!(
        "{}\n[policy]\ntrust = [\"mcp__*\"]\n",
        remote("shop", &format!("http://{gw}/mcp"))
    );
    let server = TestServer::start(&config_text(&fake, &extra)).await;
    let sid = session(&server.http).await;
    let (ok, _) = call_tool(
        &server.http,
        &fake,
        &sid,
        "mcp__shop__echo",
        json!({"text": "fine"}),
    )
    .await;
    assert_eq!(ok, "fine");
    let (result, took) = call_tool(
        &server.http,
        &fake,
        &sid,
        "mcp__shop__echo",
        json!({"text": "boom"}),
    )
    .await;
    assert!(took < AT_ONCE, "{took:?}");
    in_words(&result);
    assert_eq!(result, "MCP server shop answered HTTP 500");
    // The AAP client and the log see the same error result.
    let (status, history) = server
        .http
        .get(&format!("/sessions/{sid}/history?type=full"))
        .await;
    assert_eq!(status, 200, "{history}");
    assert!(
        history
            .to_string()
            .contains("MCP server shop answered HTTP 500"),
        "{history}"
    );
    let (again, _) = call_tool(
        &server.http,
        &fake,
        &sid,
        "mcp__shop__echo",
        json!({"text": "still here"}),
    )
    .await;
    assert_eq!(again, "still here");
    server.stop().await;
}
