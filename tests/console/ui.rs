//! The web console (issue 21), in a real browser: the system's headless Chromium driven by
//! `tests/console/drive.mjs` (playwright-core, provisioned by `crate::common::console`) against the real
//! turnstile binary, the scripted fake upstream and the example MCP server under an `ask` policy.
//! Screenshots of each state go to `<target dir>/console-shots/`. Plus the assets themselves:
//! each is served with its content type and the strict Content-Security-Policy.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::common::mcp::example_server;
use crate::common::{config_text, console};
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

const KEY_VAR: &str = "TURNSTILE_CONSOLE_TEST_KEYS";
const KEY: &str = "console-key-7f3a";
/// A second key: it sees none of [`KEY`]'s sessions.
const OTHER_KEY: &str = "console-key-other";

/// The example server (`echo` asks, `add` is trusted, its calls logged), `deliver_file` trusted;
/// a permission expires after `ttl_s`; with `keys`, the API needs [`KEY`].
fn config_ttl(fake: &FakeOpenAi, dir: &Path, keys: bool, ttl_s: u64) -> String {
    let server = example_server(
        "ex",
        &format!(
            "args = [\"--log-calls\", {:?}]",
            dir.join("calls.log").display().to_string()
        ),
    );
    let extra = format!(
        "{server}\n[policy]\nask = [\"mcp__ex__echo\"]\ntrust = [\"mcp__ex__add\", \"deliver_file\"]\ndefault = \"ask\"\n"
    );
    let text = config_text(
        fake,
        &format!("[agents.assistant]\napproval_ttl_s = {ttl_s}\n\n{extra}"),
    );
    if keys {
        text.replace(
            "[server]",
            &format!("[server]\napi_keys_env = \"{KEY_VAR}\""),
        )
    } else {
        text
    }
}

/// The real binary on this config, in a temp folder (killed on drop).
struct Served {
    _child: tokio::process::Child,
    addr: SocketAddr,
    dir: tempfile::TempDir,
}

async fn serve(fake: &FakeOpenAi, keys: bool) -> Served {
    serve_with(fake, keys, 3600).await
}

async fn serve_with(fake: &FakeOpenAi, keys: bool, ttl_s: u64) -> Served {
    let dir = tempfile::tempdir().unwrap();
    let text = config_ttl(fake, dir.path(), keys, ttl_s);
    std::fs::write(dir.path().join("tools.toml"), text).unwrap();
    let key_list = format!("{KEY},{OTHER_KEY}");
    let vars: &[(&str, &str)] = if keys { &[(KEY_VAR, &key_list)] } else { &[] };
    let (child, addr) =
        crate::common::binary::serve_with_env(&dir.path().join("tools.toml"), vars).await;
    Served {
        _child: child,
        addr,
        dir,
    }
}

/// Run one scenario of drive.mjs; its `RESULT` JSON. Panics with the script's output on failure.
async fn drive(served: &Served, scenario: &str, env: &[(&str, &str)]) -> Value {
    let chromium = console::chromium();
    let script = console::script("drive.mjs");
    let shots = console::shots_dir();
    let _one = console::BROWSER.lock().await;
    let started = std::time::Instant::now();
    let mut cmd = tokio::process::Command::new("node");
    cmd.arg(&script)
        .current_dir(script.parent().unwrap())
        .env("BASE", format!("http://{}", served.addr))
        .env("SCENARIO", scenario)
        .env("SHOTS", &shots)
        .env("CHROMIUM", chromium)
        .kill_on_drop(true);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(120), cmd.output())
        .await
        .expect("the browser scenario finishes within 2 minutes")
        .expect("run node (Node.js is needed by the console's browser tests)");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "browser scenario {scenario} failed ({}); screenshots in {}\n--- stderr ---\n{stderr}\n--- stdout ---\n{stdout}",
        out.status,
        shots.display()
    );
    eprintln!(
        "console scenario {scenario}: {:.1} s; screenshots in {}",
        started.elapsed().as_secs_f64(),
        shots.display()
    );
    let line = stdout
        .lines()
        .rev()
        .find_map(|l| l.strip_prefix("RESULT "))
        .unwrap_or_else(|| panic!("no RESULT line from {scenario}: {stdout}"));
    serde_json::from_str(line).expect("RESULT json")
}

/// A text answer streamed in small, spaced deltas: a person sees it grow.
fn slow_text(text: &str, every_ms: u64) -> Reply {
    Reply::text(text)
        .chunk_chars(3)
        .pace(Duration::from_millis(every_ms))
}

fn calls_logged(dir: &Path) -> Vec<String> {
    std::fs::read_to_string(dir.join("calls.log"))
        .unwrap_or_default()
        .lines()
        .map(String::from)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signs_in_creates_a_session_streams_the_answer_lists_and_deletes_sessions() {
    let fake = FakeOpenAi::start().await;
    let answer = "Turnstiles let one person through at a time, after a decision.";
    fake.push(slow_text(answer, 60));
    let served = serve(&fake, true).await;
    let result = drive(
        &served,
        "signin_stream",
        &[("KEY", KEY), ("ANSWER", answer)],
    )
    .await;
    assert!(result["partial_chars"].as_u64().unwrap() > 0, "{result}");
    // The deleted session is gone for the API too.
    let http = crate::common::Http::new(served.addr).with_key(KEY);
    let (status, _) = http
        .get(&format!(
            "/sessions/{}",
            result["deleted"].as_str().unwrap()
        ))
        .await;
    assert_eq!(status, 404);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn approves_one_ask_call_and_denies_another_with_a_reason_and_shows_both_results() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::tool_calls(&[
        ("call_a", "mcp__ex__echo", json!({"text": "alpha"})),
        ("call_b", "mcp__ex__echo", json!({"text": "beta"})),
    ]));
    let answer = "One ran, one was refused.";
    fake.push(Reply::text(answer));
    let served = serve(&fake, false).await;
    drive(&served, "approvals", &[("ANSWER", answer)]).await;
    // Only the approved call reached the MCP server, once.
    let calls = calls_logged(served.dir.path());
    assert_eq!(
        calls,
        vec![r#"echo {"text":"alpha"}"#.to_string()],
        "{calls:?}"
    );
    // The model was told about the denial with the reason.
    let last = fake.requests().last().cloned().expect("a model request");
    assert!(
        last.to_string().contains("Tool call denied: not this one"),
        "{last}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn confirms_an_edited_plan_and_the_model_gets_the_edited_plan() {
    let fake = FakeOpenAi::start().await;
    let plan = "1. Read the changelog\n2. Write the notes";
    let edited = "1. Write the notes from memory";
    let answer = "Notes written by the edited plan.";
    fake.push(Reply::text(plan));
    fake.push(Reply::text(answer));
    let served = serve(&fake, false).await;
    drive(
        &served,
        "plan",
        &[("PLAN", plan), ("EDITED", edited), ("ANSWER", answer)],
    )
    .await;
    let last = fake.requests().last().cloned().expect("a model request");
    assert!(last.to_string().contains(edited), "{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_attached_file_delivered_back_downloads_with_the_same_bytes() {
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::tool_calls(&[(
        "call_f",
        "deliver_file",
        json!({"path": "data.bin"}),
    )]));
    let answer = "Here it is.";
    fake.push(Reply::text(answer));
    let served = serve(&fake, false).await;
    // Every byte value, then some text: a download that re-encodes anything shows.
    let mut bytes: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
    bytes.extend_from_slice("é ✓ end\n".as_bytes());
    let file: PathBuf = served.dir.path().join("upload.bin");
    std::fs::write(&file, &bytes).unwrap();
    let result = drive(
        &served,
        "files",
        &[("FILE", file.to_str().unwrap()), ("ANSWER", answer)],
    )
    .await;
    assert_eq!(result["bytes"].as_u64(), Some(bytes.len() as u64));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_stream_and_a_reload_mid_answer_lose_and_double_nothing() {
    let fake = FakeOpenAi::start().await;
    let answer = "Every event has an id; the console remembers the last one it saw and asks the \
                  stream to go on after it, so a dropped connection costs nothing. A reload starts \
                  over from the log, and the stored answer replaces whatever was streamed before. \
                  That is why this sentence appears exactly once.";
    // About 100 deltas 80 ms apart: eight seconds of streaming to cut and reload in.
    fake.push(slow_text(answer, 80));
    let served = serve(&fake, false).await;
    let result = drive(&served, "reload", &[("ANSWER", answer)]).await;
    assert!(
        !result["resumed"].as_array().unwrap().is_empty(),
        "{result}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_a_streaming_turn_and_shows_an_approval_that_expired() {
    let fake = FakeOpenAi::start().await;
    // A minute of streaming, cut short by Cancel.
    fake.push(slow_text(&"la ".repeat(600), 100));
    fake.push(Reply::tool_calls(&[(
        "call_g",
        "mcp__ex__echo",
        json!({"text": "gamma"}),
    )]));
    let served = serve_with(&fake, false, 1).await;
    drive(&served, "cancel_expiry", &[]).await;
    assert!(
        calls_logged(served.dir.path()).is_empty(),
        "an expired call never runs"
    );
}

#[tokio::test]
async fn console_pending_lists_the_callers_waiting_permissions_with_the_rule_that_asked() {
    let fake = FakeOpenAi::start().await;
    let served = serve(&fake, true).await;
    let http = crate::common::Http::new(served.addr).with_key(KEY);
    let (status, created) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let (_, idle) = http.post("/sessions", &json!({})).await;
    fake.push(Reply::tool_calls(&[(
        "call_p",
        "mcp__ex__echo",
        json!({"text": "pi"}),
    )]));
    let (status, turn) = http
        .post(
            &format!("/sessions/{sid}/turns"),
            &json!({"messages": [{"role": "user", "content": "echo pi"}]}),
        )
        .await;
    assert_eq!(
        (status, turn["stopReason"].as_str()),
        (200, Some("tool_use")),
        "{turn}"
    );
    let (status, all) = http.get("/console/pending").await;
    assert_eq!(status, 200, "{all}");
    let pending = all["pending"].as_array().unwrap();
    assert_eq!(pending.len(), 1, "{all}");
    let p = &pending[0];
    assert_eq!(p["session"], sid.as_str());
    assert_eq!(p["toolCallId"], "call_p");
    assert_eq!(p["name"], "mcp__ex__echo");
    assert_eq!(p["input"], json!({"text": "pi"}));
    assert_eq!(
        (&p["server"], &p["tool"], &p["verdict"], &p["rule"]),
        (
            &json!("ex"),
            &json!("echo"),
            &json!("ask"),
            &json!("mcp__ex__echo")
        ),
        "{p}"
    );
    assert!(p["expires_at"].is_string(), "{p}");
    // One session's, an idle one's (none), another key's (none), no key (401).
    let (_, one) = http.get(&format!("/console/pending?session={sid}")).await;
    assert_eq!(one["pending"], all["pending"]);
    let idle_id = idle["sessionId"].as_str().unwrap();
    let (_, none) = http
        .get(&format!("/console/pending?session={idle_id}"))
        .await;
    assert_eq!(none["pending"], json!([]));
    let other = crate::common::Http::new(served.addr).with_key(OTHER_KEY);
    let (status, theirs) = other.get("/console/pending").await;
    assert_eq!((status, &theirs["pending"]), (200, &json!([])));
    let (status, _) = other.get(&format!("/console/pending?session={sid}")).await;
    assert_eq!(status, 200, "another key's session is simply not listed");
    let (status, _, _) = get(served.addr, "/console/pending", "").await;
    assert_eq!(status, 401);
}

// ------------------------------------------------------------------ the assets, over plain HTTP

/// `GET path` over a fresh connection: the status line and headers (lower-cased names), and the
/// body.
async fn get(addr: SocketAddr, path: &str, extra: &str) -> (u16, Vec<(String, String)>, Vec<u8>) {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    let req = format!("GET {path} HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n{extra}\r\n");
    conn.write_all(req.as_bytes()).await.unwrap();
    let mut raw = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut raw))
        .await
        .expect("the answer comes")
        .unwrap();
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a head");
    let head = String::from_utf8_lossy(&raw[..split]).to_string();
    let body = raw[split + 4..].to_vec();
    let mut lines = head.lines();
    let status = lines
        .next()
        .unwrap()
        .split(' ')
        .nth(1)
        .unwrap()
        .parse()
        .unwrap();
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_string()))
        .collect();
    (status, headers, body)
}

fn header<'a>(headers: &'a [(String, String)], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v.as_str())
}

#[tokio::test]
async fn every_console_asset_is_served_with_the_csp_its_content_type_and_no_key() {
    let fake = FakeOpenAi::start().await;
    // A server with keys: the assets hold no data and need none (the app signs in).
    let served = serve(&fake, true).await;
    let expected = [
        ("/console", "text/html; charset=utf-8", "console/index.html"),
        (
            "/console/",
            "text/html; charset=utf-8",
            "console/index.html",
        ),
        (
            "/console/app.js",
            "text/javascript; charset=utf-8",
            "console/app.js",
        ),
        (
            "/console/style.css",
            "text/css; charset=utf-8",
            "console/style.css",
        ),
        (
            "/console/favicon.svg",
            "image/svg+xml",
            "console/favicon.svg",
        ),
    ];
    let csp = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; \
               connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'";
    for (path, content_type, file) in expected {
        let (status, headers, body) = get(served.addr, path, "").await;
        assert_eq!(status, 200, "{path}");
        assert_eq!(
            header(&headers, "content-type"),
            Some(content_type),
            "{path}"
        );
        assert_eq!(
            header(&headers, "content-security-policy"),
            Some(csp),
            "{path}"
        );
        assert_eq!(
            header(&headers, "x-content-type-options"),
            Some("nosniff"),
            "{path}"
        );
        assert_eq!(
            header(&headers, "cache-control"),
            Some("no-cache"),
            "{path}"
        );
        let on_disk = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        assert_eq!(body, on_disk, "{path} serves {file} as built");
        // Revalidation by ETag: 304, no body.
        let etag = header(&headers, "etag").expect("an etag").to_string();
        let (status, _, body) = get(served.addr, path, &format!("if-none-match: {etag}\r\n")).await;
        assert_eq!((status, body.len()), (304, 0), "{path}");
    }
    // The page loads no script or style of its own inline (the CSP would block it).
    let (_, _, html) = get(served.addr, "/console", "").await;
    let html = String::from_utf8(html).unwrap();
    assert!(
        !html.contains("<script>") && !html.contains("style="),
        "{html}"
    );
    // An unknown asset is a JSON 404; the API itself still needs the key.
    let (status, headers, body) = get(served.addr, "/console/nope.js", "").await;
    assert_eq!(status, 404);
    assert_eq!(header(&headers, "content-type"), Some("application/json"));
    let err: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(err["error"]["type"], "not_found");
    let (status, _, _) = get(served.addr, "/sessions", "").await;
    assert_eq!(status, 401);
}
