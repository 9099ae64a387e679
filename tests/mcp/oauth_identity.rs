//! Enterprise-managed authorization (`grant = "identity_assertion"`) for a remote MCP server,
//! with the real binary, against an IdP, the server's authorization server and the server
//! itself (tests/mcp_oauth_identity/idp_server.py): `turnstile login` checks the configuration
//! by fetching a token (the user's ID token, read from a file, exchanged at the IdP for an
//! ID-JAG, presented to the authorization server); serve uses the stored token; when it
//! expires, the call is refused once and a new exchange is made with the file's new content;
//! when the IdP refuses, the tool's error says what it answered. Neither the assertion nor a
//! token is ever in the log or in clear in the token file.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::Http;
use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

const KEY_VAR: &str = "TURNSTILE_TEST_OAUTH_IDENTITY_KEY";
const AS_SECRET_VAR: &str = "TURNSTILE_TEST_OAUTH_IDENTITY_AS_SECRET";
const IDP_SECRET_VAR: &str = "TURNSTILE_TEST_OAUTH_IDENTITY_IDP_SECRET";

/// The secrets the config names, given to every turnstile this file starts.
const SECRETS: [(&str, &str); 3] = [
    (KEY_VAR, "a test secret of some length"),
    (AS_SECRET_VAR, "as-secret"),
    (IDP_SECRET_VAR, "idp-secret"),
];

/// The IdP + authorization server + MCP server, killed on drop.
struct Servers {
    _child: Child,
    addr: SocketAddr,
    http: Http,
}

async fn servers() -> Servers {
    let script =
        crate::common::provision::manifest_dir().join("tests/mcp_oauth_identity/idp_server.py");
    let mut child = Command::new("python3")
        .arg(script)
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("start python3");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .expect("the IdP did not start within 10 s")
        .unwrap()
        .expect("the IdP exited");
    let port: u16 = line.strip_prefix("PORT ").unwrap().parse().unwrap();
    let addr: SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    Servers {
        _child: child,
        addr,
        http: Http::new(addr),
    }
}

impl Servers {
    fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every token request: `{endpoint, authorization, form}`.
    async fn log(&self) -> Vec<Value> {
        let (status, v) = self.http.get("/control/log").await;
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

/// A config in `dir`: `srv` behind the authorization server, the user's ID token in
/// `dir/id_token`.
fn write_config(dir: &Path, fake: &FakeOpenAi, s: &Servers) -> PathBuf {
    let extra = format!(
        "[mcp_servers.srv]\nurl = \"{base}/mcp\"\n\n[mcp_servers.srv.oauth]\ngrant = \"identity_assertion\"\nclient_id = \"as-client\"\nclient_secret_env = \"{AS_SECRET_VAR}\"\nidp_token_endpoint = \"{base}/idp/token\"\nidp_client_id = \"idp-client\"\nidp_client_secret_env = \"{IDP_SECRET_VAR}\"\nidentity_assertion_file = \"id_token\"\n\n[policy]\ntrust = [\"mcp__srv__*\"]\n",
        base = s.base()
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

/// `turnstile serve`, its whole log kept.
async fn serve(config: &Path) -> (Child, SocketAddr, Arc<Mutex<Vec<String>>>) {
    let mut child = crate::common::binary::command()
        .envs(SECRETS)
        .args(["serve", "--config"])
        .arg(config)
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "debug")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let log = Arc::new(Mutex::new(Vec::new()));
    let addr = loop {
        let line = tokio::time::timeout(Duration::from_secs(30), lines.next_line())
            .await
            .expect("turnstile did not listen within 30 s")
            .unwrap()
            .expect("turnstile exited before listening");
        log.lock().unwrap().push(line.clone());
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let kept = log.clone();
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            kept.lock().unwrap().push(line);
        }
    });
    (child, addr, log)
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

fn stored(dir: &Path, s: &Servers) -> (Vec<u8>, turnstile::tools::mcp::oauth::store::Saved) {
    let data = dir.join("data");
    let bytes = std::fs::read(data.join("oauth/srv.tokens")).expect("the token file");
    let store = turnstile::tools::mcp::oauth::store::TokenStore::new(
        &data,
        "srv",
        &format!("{}/mcp", s.base()),
        Some(KEY_VAR),
        &turnstile::config::Env::from_vars(SECRETS),
    );
    (
        bytes,
        store.load().expect("the token file opens with the key"),
    )
}

fn basic(user: &str, secret: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{secret}"))
    )
}

/// `turnstile login srv`: exit status and output.
async fn login(config: &Path) -> (bool, String) {
    let out = tokio::time::timeout(
        Duration::from_secs(60),
        crate::common::binary::command()
            .envs(SECRETS)
            .args(["login", "srv", "--config"])
            .arg(config)
            .output(),
    )
    .await
    .expect("login did not end within 60 s")
    .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_id_token_is_exchanged_at_the_idp_and_again_when_the_token_expires() {
    let s = servers().await;
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fake, &s);
    std::fs::write(dir.path().join("id_token"), "idtoken-alice\n").unwrap();

    // `turnstile login` on this grant fetches and stores a token: no browser.
    let (ok, out) = login(&config).await;
    assert!(ok, "{out}");
    let log = s.log().await;
    assert_eq!(log.len(), 2, "{log:?}");
    let (ex, grant) = (&log[0], &log[1]);
    assert_eq!(ex["endpoint"], "/idp/token");
    assert_eq!(ex["authorization"], basic("idp-client", "idp-secret"));
    assert_eq!(
        ex["form"],
        json!({
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
            "subject_token": "idtoken-alice",
            "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
            "audience": s.base(),
            "resource": format!("{}/mcp", s.base()),
        })
    );
    assert_eq!(grant["endpoint"], "/token");
    assert_eq!(grant["authorization"], basic("as-client", "as-secret"));
    assert_eq!(
        grant["form"],
        json!({
            "grant_type": "urn:ietf:params:oauth:grant-type:jwt-bearer",
            "assertion": "idjag-1",
            "resource": format!("{}/mcp", s.base()),
        })
    );
    let (bytes, saved) = stored(dir.path(), &s);
    assert_eq!(saved.access_token, "access-tok-1");
    let text = String::from_utf8_lossy(&bytes);
    assert!(
        !text.contains("access-tok-1") && !text.contains("idtoken"),
        "{text}"
    );

    // Serve uses the stored token: no new exchange.
    let (mut child, addr, server_log) = serve(&config).await;
    let api = Http::new(addr);
    let (status, v) = api.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{v}");
    let sid = v["sessionId"].as_str().unwrap().to_string();
    assert_eq!(
        call_whoami(&api, &fake, &sid, 1).await,
        ("token=access-tok-1".into(), false)
    );
    assert_eq!(s.log().await.len(), 2);

    // The user signed in again (a new ID token in the file); the access token expires: the
    // call is refused once and a new exchange is made with the new ID token.
    std::fs::write(dir.path().join("id_token"), "idtoken-bob").unwrap();
    s.control("expire").await;
    assert_eq!(
        call_whoami(&api, &fake, &sid, 2).await,
        ("token=access-tok-2".into(), false)
    );
    let log = s.log().await;
    assert_eq!(log.len(), 4, "{log:?}");
    assert_eq!(log[2]["form"]["subject_token"], "idtoken-bob");
    assert_eq!(log[3]["form"]["assertion"], "idjag-2");
    assert_eq!(stored(dir.path(), &s).1.access_token, "access-tok-2");

    // The IdP revokes the access: the call's error says what it answered.
    s.control("refuse_idp").await;
    s.control("expire").await;
    let (text, is_error) = call_whoami(&api, &fake, &sid, 3).await;
    assert!(is_error, "{text}");
    assert!(
        text.contains("MCP server srv")
            && text.contains("invalid_grant")
            && text.contains("access to this server was revoked"),
        "{text}"
    );
    let _ = child.kill().await;
    let lines = server_log.lock().unwrap().join("\n");
    for secret in [
        "idtoken-",
        "idjag-",
        "access-tok-",
        "as-secret",
        "idp-secret",
    ] {
        assert!(!lines.contains(secret), "the log holds {secret}:\n{lines}");
    }
}
