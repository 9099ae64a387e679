//! OAuth refresh for a remote MCP server, against a real authorization server and the MCP server
//! it protects (tests/mcp_oauth_refresh/oauth_server.py), with the real binary: `turnstile login`
//! stores a token pair; a call works; the access token expires; the next call refreshes it
//! (`grant_type=refresh_token` with the stored refresh token and the `resource`), the token file
//! is rewritten, still encrypted, and the call succeeds; a refresh refused (`invalid_grant`)
//! turns into "needs a login" in the tool's error and in `turnstile check`.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use crate::common::Http;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

/// The variable `[server] secret_key_env` names, given to every turnstile this file starts.
const KEY_VAR: &str = "TURNSTILE_TEST_OAUTH_REFRESH_KEY";
const SECRETS: [(&str, &str); 1] = [(KEY_VAR, "a test secret of some length")];

/// The authorization + MCP server, killed on drop.
struct AuthServer {
    _child: Child,
    addr: SocketAddr,
    http: Http,
}

async fn auth_server() -> AuthServer {
    let script =
        crate::common::provision::manifest_dir().join("tests/mcp_oauth_refresh/oauth_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start python3");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the OAuth server did not start within 10 s")
        .unwrap()
        .expect("the OAuth server exited");
    let port: u16 = line.strip_prefix("PORT ").unwrap().parse().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    AuthServer {
        _child: child,
        addr,
        http: Http::new(addr),
    }
}

impl AuthServer {
    /// The token requests it received: `{grant_type, refresh_token, resource, client_id}`.
    async fn token_requests(&self) -> Vec<Value> {
        let (status, v) = self.http.get("/control/log").await;
        assert_eq!(status, 200);
        v.as_array().unwrap().clone()
    }

    /// The bearer tokens `/mcp` refused.
    async fn rejected(&self) -> Vec<Value> {
        let (status, v) = self.http.get("/control/rejected").await;
        assert_eq!(status, 200);
        v.as_array().unwrap().clone()
    }

    async fn control(&self, what: &str) {
        let (status, _) = self
            .http
            .post(&format!("/control/{what}"), &json!({}))
            .await;
        assert_eq!(status, 200);
    }
}

/// A config in `dir` federating the protected server as `srv`, its tokens under `dir/data`.
fn write_config(dir: &Path, fake: &FakeOpenAi, auth: &AuthServer) -> PathBuf {
    let extra = format!(
        "[mcp_servers.srv]\nurl = \"http://{}/mcp\"\n\n[policy]\ntrust = [\"mcp__srv__*\"]\n",
        auth.addr
    );
    let text = crate::common::config_text(fake, &extra).replace(
        "[server]\n",
        &format!("[server]\nsecret_key_env = \"{KEY_VAR}\"\n"),
    );
    let text = text.replace(
        "data_dir = \"data\"",
        &format!("data_dir = {:?}", dir.join("data").display().to_string()),
    );
    let path = dir.join("tools.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// `turnstile login srv`, with the test as the browser: it opens the printed URL (the server
/// approves at once) and follows the redirect to turnstile's loopback listener.
async fn login(config: &Path) {
    let mut child = crate::common::binary::command()
        .envs(SECRETS)
        .args(["login", "srv", "--config"])
        .arg(config)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile login");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let url = loop {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("login printed no URL within 20 s")
            .unwrap()
            .expect("login exited before printing the URL");
        if line.starts_with("http") {
            break line;
        }
    };
    let redirect = follow(&url).await;
    assert!(
        redirect.contains("/callback?code="),
        "not a redirect to the loopback listener: {redirect}"
    );
    let (status, _) = get(&redirect).await;
    assert_eq!(status, 200, "the loopback listener refused the redirect");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let exit = tokio::time::timeout(Duration::from_secs(20), child.wait())
        .await
        .expect("login did not end within 20 s")
        .unwrap();
    assert!(exit.success(), "turnstile login failed: {exit}");
}

/// `GET url`: its status and `Location`.
async fn get(url: &str) -> (u16, String) {
    let rest = url.strip_prefix("http://").unwrap();
    let (host, path) = rest.split_at(rest.find('/').unwrap());
    let resp = Http::new(host.parse().unwrap())
        .request_raw("GET", path, None)
        .await;
    let location = resp
        .headers()
        .get("location")
        .map(|v| v.to_str().unwrap().to_string())
        .unwrap_or_default();
    (resp.status().as_u16(), location)
}

/// The authorization URL's redirect target.
async fn follow(url: &str) -> String {
    let (status, location) = get(url).await;
    assert_eq!(status, 302, "the authorization endpoint did not redirect");
    location
}

/// One turn whose model calls `mcp__srv__whoami`: the tool's result and error flag.
async fn call_whoami(api: &Http, fake: &FakeOpenAi, sid: &str, n: usize) -> (String, bool) {
    let id = format!("call_{n}");
    fake.push(Reply::tool_calls(&[(
        id.as_str(),
        "mcp__srv__whoami",
        json!({}),
    )]));
    fake.push(Reply::text("ok"));
    let body = json!({"messages": [{"role": "user", "content": "who am I"}]});
    let (status, v) = tokio::time::timeout(
        Duration::from_secs(60),
        api.post(&format!("/sessions/{sid}/turns"), &body),
    )
    .await
    .expect("the turn did not finish within 60 s");
    assert_eq!(status, 200, "{v}");
    let (status, v) = api
        .get(&format!("/sessions/{sid}/events/history?limit=1000"))
        .await;
    assert_eq!(status, 200, "{v}");
    let result = v["events"]
        .as_array()
        .unwrap()
        .iter()
        .find(|e| e["type"] == "agent.tool_result" && e["tool_use_id"] == id)
        .unwrap_or_else(|| panic!("no result for {id}: {v}"))
        .clone();
    let text = match &result["content"] {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    (text, result["is_error"].as_bool().unwrap_or(false))
}

/// The stored token file: its bytes and what it opens to with the key.
fn stored(dir: &Path, auth: &AuthServer) -> (Vec<u8>, turnstile::tools::mcp::oauth::store::Saved) {
    let data = dir.join("data");
    let bytes = std::fs::read(data.join("oauth/srv.tokens")).expect("the token file");
    let store = turnstile::tools::mcp::oauth::store::TokenStore::new(
        &data,
        "srv",
        &format!("http://{}/mcp", auth.addr),
        Some(KEY_VAR),
        &turnstile::config::Env::from_vars(SECRETS),
    );
    (
        bytes,
        store.load().expect("the token file opens with the key"),
    )
}

fn assert_sealed(bytes: &[u8], secrets: &[&str]) {
    let text = String::from_utf8_lossy(bytes);
    for s in secrets {
        assert!(!text.contains(s), "the token file holds {s} in clear");
    }
    assert!(
        serde_json::from_slice::<Value>(bytes).is_err(),
        "the token file is plain JSON"
    );
}

/// `turnstile check`: exit success, and stdout + stderr.
async fn check(config: &Path) -> (bool, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        crate::common::binary::command()
            .envs(SECRETS)
            .args(["check", "--config"])
            .arg(config)
            .output(),
    )
    .await
    .expect("check did not end within 60 s")
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_token_is_refreshed_and_stored_and_a_refused_refresh_asks_for_a_login() {
    let auth = auth_server().await;
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake, &auth);

    login(&config).await;
    let (first_bytes, first) = stored(dir.path(), &auth);
    assert_eq!(first.access_token, "at-1");
    assert_eq!(first.refresh_token.as_deref(), Some("rt-1"));
    assert_sealed(&first_bytes, &["at-1", "rt-1"]);

    let (mut child, addr) = crate::common::binary::serve_with_env(&config, &SECRETS).await;
    let api = Http::new(addr);
    let (status, v) = api.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    let sid = v["sessionId"].as_str().unwrap().to_string();

    // The stored token works.
    assert!(auth.rejected().await.is_empty());
    assert_eq!(
        call_whoami(&api, &fake, &sid, 1).await,
        ("token=at-1".into(), false)
    );

    // It expires: the next call is refused once, refreshes, and goes through.
    auth.control("expire").await;
    assert_eq!(
        call_whoami(&api, &fake, &sid, 2).await,
        ("token=at-2".into(), false)
    );
    let grants = auth.token_requests().await;
    let grant_types: Vec<&str> = grants
        .iter()
        .map(|g| g["grant_type"].as_str().unwrap())
        .collect();
    assert_eq!(grant_types, ["authorization_code", "refresh_token"]);
    assert_eq!(grants[1]["refresh_token"], "rt-1");
    assert_eq!(grants[1]["resource"], format!("http://{}/mcp", auth.addr));
    assert_eq!(grants[1]["client_id"], "client-1");
    assert_eq!(auth.rejected().await, [json!("at-1")]);
    let (bytes, now) = stored(dir.path(), &auth);
    assert_eq!(now.access_token, "at-2");
    assert_eq!(now.refresh_token.as_deref(), Some("rt-2"));
    assert_ne!(bytes, first_bytes);
    assert_sealed(&bytes, &["at-2", "rt-2"]);

    // It expires again and the refresh is refused: the call says a login is needed.
    auth.control("expire").await;
    auth.control("refuse_refresh").await;
    let (text, is_error) = call_whoami(&api, &fake, &sid, 3).await;
    assert!(is_error, "{text}");
    assert_eq!(
        text,
        "MCP server srv needs a login: the server needs an authorization: run `turnstile login srv`"
    );
    let _ = child.kill().await;

    // So does `turnstile check`.
    let (ok, out) = check(&config).await;
    assert!(!ok, "check passed: {out}");
    assert!(
        out.contains("MCP server srv") && out.contains("run `turnstile login srv`"),
        "{out}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_about_to_expire_is_refreshed_before_it_is_sent() {
    let auth = auth_server().await;
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake, &auth);
    // The login's token is good for 30 s: within the minute before expiry in which turnstile
    // refreshes first.
    auth.control("short_once").await;
    login(&config).await;

    let (mut child, addr) = crate::common::binary::serve_with_env(&config, &SECRETS).await;
    let api = Http::new(addr);
    let (status, v) = api.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    let sid = v["sessionId"].as_str().unwrap().to_string();
    assert_eq!(
        call_whoami(&api, &fake, &sid, 1).await,
        ("token=at-2".into(), false)
    );
    let _ = child.kill().await;
    // Refreshed without the server ever refusing a token.
    assert!(auth.rejected().await.is_empty());
    let grants = auth.token_requests().await;
    assert_eq!(grants.len(), 2, "{grants:?}");
    assert_eq!(grants[1]["grant_type"], "refresh_token");
    assert_eq!(grants[1]["refresh_token"], "rt-1");
    let (bytes, now) = stored(dir.path(), &auth);
    assert_eq!(now.access_token, "at-2");
    assert_sealed(&bytes, &["at-2", "rt-2"]);
}
