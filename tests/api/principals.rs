//! `[keys.NAME]` principals: each sees only its agents and tools (`/meta`, sessions, what the
//! model is offered, `/mcp`, `/tools`), owns its sessions by name (so a rotated key keeps them),
//! and only an admin sees another's sessions and approvals.

use serde_json::{json, Value};
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

use crate::common::mcp_http::McpHttp;
use crate::common::{config_text, TestServer};

const ALICE: &str = "alice-secret";
const BOB: &str = "bob-secret";
const ROOT: &str = "root-secret";
const ENV_KEY: &str = "env-key";

/// SHA-256 of `BOB`, in hex.
fn bob_sha256() -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, BOB.as_bytes());
    d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// Two agents over the example server; alice may use `alpha` with `echo` only, bob `beta`
/// with `add` and `deliver_file`, root is an admin, and `api_keys_env` holds one more key.
fn config(fake: &FakeOpenAi, keys: &str) -> String {
    let extra = format!(
        "[agents.alpha]\n[agents.beta]\n\n{}\n[policy]\ntrust = [\"mcp__ex__echo\", \"mcp__ex__add\", \"deliver_file\"]\ndefault = \"ask\"\n\n[mcp_endpoint]\nenabled = true\nagents = [\"alpha\", \"beta\"]\n\n{keys}",
        crate::common::mcp::example_server("ex", ""),
    );
    config_text(fake, &extra).replace(
        "[server]",
        "[server]\npublic_meta = false\napi_keys_env = \"TEST_PRINCIPALS_ENV_KEYS\"",
    )
}

fn keys() -> String {
    format!(
        "[keys.alice]\nkey_env = \"TEST_ALICE_KEY\"\nagents = [\"alpha\"]\ntools = [\"mcp__ex__echo\"]\n\n[keys.bob]\nkey_sha256 = \"{}\"\nagents = [\"beta\"]\ntools = [\"mcp__ex__add\", \"deliver_file\"]\n\n[keys.root]\nkey_env = \"TEST_ROOT_KEY\"\nadmin = true\n",
        bob_sha256()
    )
}

const VARS: &[(&str, &str)] = &[
    ("TEST_ALICE_KEY", ALICE),
    ("TEST_ROOT_KEY", ROOT),
    ("TEST_PRINCIPALS_ENV_KEYS", ENV_KEY),
];

async fn start() -> (FakeOpenAi, TestServer) {
    let fake = FakeOpenAi::start().await;
    let server = TestServer::start_with_env(&config(&fake, &keys()), VARS).await;
    (fake, server)
}

fn names(tools: &Value, field: &str) -> Vec<String> {
    let mut out: Vec<String> = tools
        .as_array()
        .unwrap_or(&vec![])
        .iter()
        .map(|t| {
            t.pointer(field)
                .and_then(Value::as_str)
                .unwrap()
                .to_string()
        })
        .collect();
    out.sort();
    out
}

#[tokio::test]
async fn each_principal_sees_and_uses_only_its_agents_and_tools() {
    let log = crate::common::tracing_capture::log_lines();
    let (fake, server) = start().await;
    let alice = server.http.with_key(ALICE);
    let bob = server.http.with_key(BOB);

    let (status, meta) = alice.get("/meta").await;
    assert_eq!(status, 200, "{meta}");
    assert_eq!(names(&meta["agents"], "/name"), ["alpha"]);
    assert_eq!(
        names(&meta["agents"][0]["tools"], "/name"),
        ["mcp__ex__echo"]
    );
    let (_, meta) = bob.get("/meta").await;
    assert_eq!(names(&meta["agents"], "/name"), ["beta"]);
    assert_eq!(
        names(&meta["agents"][0]["tools"], "/name"),
        ["deliver_file", "mcp__ex__add"]
    );
    // A key of api_keys_env is a principal with every agent and tool, as before.
    let (_, meta) = server.http.with_key(ENV_KEY).get("/meta").await;
    assert_eq!(names(&meta["agents"], "/name"), ["alpha", "beta"]);
    assert!(meta["agents"][0]["tools"].as_array().unwrap().len() > 2);

    // Another principal's agent: 403, for a session and for a run.
    let (status, err) = alice
        .post("/sessions", &json!({"agent": {"name": "beta"}}))
        .await;
    assert_eq!(status, 403, "{err}");
    assert_eq!(err["error"]["type"], "forbidden");
    assert!(err["error"]["message"].as_str().unwrap().contains("beta"));
    // A tool outside alice's globs is as if the agent did not have it.
    let outside =
        json!({"agent": {"name": "alpha", "tools": [{"name": "mcp__ex__add", "trust": true}]}});
    let (status, err) = alice.post("/sessions", &outside).await;
    assert_eq!(status, 400, "{err}");

    // Without an agent: alice's first agent, with her tools only.
    let (status, created) = alice.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap();
    let (_, info) = alice.get(&format!("/sessions/{sid}")).await;
    assert_eq!(info["agent"]["name"], "alpha");
    assert_eq!(names(&info["agent"]["tools"], "/name"), ["mcp__ex__echo"]);

    // The model is offered alice's tools only; a call to another is refused as unknown.
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__add",
        json!({"a": 1, "b": 2}),
    )]));
    fake.push(Reply::text("done"));
    let turn = json!({"messages": [{"role": "user", "content": "add"}]});
    let (status, out) = alice.post(&format!("/sessions/{sid}/turns"), &turn).await;
    assert_eq!(status, 200, "{out}");
    let requests = fake.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(
        names(&requests[0]["tools"], "/function/name"),
        ["mcp__ex__echo"]
    );
    let result = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .expect("the call's result");
    assert!(
        result["content"]
            .to_string()
            .contains("Unknown tool mcp__ex__add"),
        "{result}"
    );

    // The turn's log lines name its principal.
    let text = String::from_utf8_lossy(&log.lock().unwrap()).to_string();
    let ended: Vec<&str> = text
        .lines()
        .filter(|l| l.contains(sid) && l.contains("turn ended"))
        .collect();
    assert_eq!(ended.len(), 1, "{text}");
    assert!(ended[0].contains("principal=key:alice"), "{}", ended[0]);

    // Nor can a turn's settings enable it.
    let widen = json!({"agent": {"name": "alpha", "tools": [{"name": "mcp__ex__add", "trust": true}]},
        "messages": [{"role": "user", "content": "add"}]});
    let (status, err) = alice.post(&format!("/sessions/{sid}/turns"), &widen).await;
    assert_eq!(status, 400, "{err}");
    assert_eq!(fake.requests().len(), 2, "no model call");

    // `GET /tools` shows a principal the tools within its globs, `/status` (every server
    // and agent) only an unnarrowed or admin one.
    let (_, tools) = alice.get("/tools").await;
    assert_eq!(names(&tools["tools"], "/name"), ["mcp__ex__echo"]);
    let (status, err) = alice.get("/status").await;
    assert_eq!(status, 403, "{err}");
    assert_eq!(err["error"]["type"], "forbidden");
    assert_eq!(server.http.with_key(ROOT).get("/status").await.0, 200);
    assert_eq!(server.http.with_key(ENV_KEY).get("/status").await.0, 200);
}

#[tokio::test]
async fn the_mcp_endpoint_serves_a_principal_its_agents_and_tools_only() {
    let (_fake, server) = start().await;
    let mcp = McpHttp::new(server.addr);
    let alice = mcp.agent_with_key("alpha", ALICE);
    let sid = alice.open().await;
    let listed = alice.call(&sid, "tools/list", json!({})).await;
    let tools = &listed.message.as_ref().unwrap()["result"]["tools"];
    assert_eq!(names(tools, "/name"), ["mcp__ex__echo"]);
    let call = json!({"name": "mcp__ex__add", "arguments": {"a": 1, "b": 2}});
    let refused = alice.call(&sid, "tools/call", call).await;
    let result = &refused.message.as_ref().unwrap()["result"];
    assert_eq!(result["isError"], true, "{result}");
    assert!(!result.to_string().contains("\"3\""), "not run: {result}");
    let call = json!({"name": "mcp__ex__echo", "arguments": {"text": "hi"}});
    let ran = alice.call(&sid, "tools/call", call).await;
    let result = &ran.message.as_ref().unwrap()["result"];
    assert_ne!(result["isError"], true, "{result}");

    // Another principal's agent: 403 before any session is opened.
    let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
        "protocolVersion": crate::common::mcp_http::VERSION, "capabilities": {},
        "clientInfo": {"name": "t", "version": "0"}}});
    let other = mcp
        .agent_with_key("beta", ALICE)
        .send("POST", None, Some(init))
        .await;
    assert_eq!(other.status, 403, "{other:?}");
    let bob = mcp.agent_with_key("alpha", BOB);
    let theirs = bob.call(&sid, "tools/list", json!({})).await;
    assert_eq!(
        theirs.status, 403,
        "bob may not use alpha at all: {theirs:?}"
    );
    // An MCP session is its opener's alone, an admin's reach notwithstanding.
    let root = mcp.agent_with_key("alpha", ROOT);
    let theirs = root.call(&sid, "tools/list", json!({})).await;
    assert_eq!(theirs.status, 404, "{theirs:?}");
    // `/mcp` serves each principal its first agent there, as narrowed for it.
    let bob = mcp.with_key(BOB);
    let theirs = bob.open().await;
    let listed = bob.call(&theirs, "tools/list", json!({})).await;
    let tools = &listed.message.as_ref().unwrap()["result"]["tools"];
    assert_eq!(names(tools, "/name"), ["deliver_file", "mcp__ex__add"]);
    // Root, unnarrowed, sees every tool of alpha.
    let own = root.open().await;
    let listed = root.call(&own, "tools/list", json!({})).await;
    let tools = &listed.message.as_ref().unwrap()["result"]["tools"];
    assert!(
        names(tools, "/name").contains(&"mcp__ex__add".to_string()),
        "{tools}"
    );
}

#[tokio::test]
async fn sessions_belong_to_their_principal_and_an_admin_sees_every_one() {
    let (fake, server) = start().await;
    let alice = server.http.with_key(ALICE);
    let bob = server.http.with_key(BOB);
    let root = server.http.with_key(ROOT);
    // A session that waits for a person's permission (alice does not trust echo).
    let body =
        json!({"agent": {"name": "alpha", "tools": [{"name": "mcp__ex__echo", "trust": false}]}});
    let (status, created) = alice.post("/sessions", &body).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    fake.push(Reply::tool_calls(&[(
        "call_1",
        "mcp__ex__echo",
        json!({"text": "x"}),
    )]));
    let turn = json!({"messages": [{"role": "user", "content": "echo"}]});
    let (status, out) = alice.post(&format!("/sessions/{sid}/turns"), &turn).await;
    assert_eq!(status, 200, "{out}");

    let listed = |v: &Value| names(&v["sessions"], "/sessionId");
    // Bob: none of it exists.
    assert!(listed(&bob.get("/sessions").await.1).is_empty());
    for path in [
        format!("/sessions/{sid}"),
        format!("/sessions/{sid}/history?type=full"),
        format!("/sessions/{sid}/events/history"),
        format!("/console/pending?session={sid}"),
    ] {
        let (status, v) = bob.get(&path).await;
        let hidden = status == 404 || v["pending"] == json!([]);
        assert!(hidden, "{path}: {status} {v}");
    }
    assert_eq!(bob.get("/console/pending").await.1["pending"], json!([]));
    assert_eq!(bob.delete(&format!("/sessions/{sid}")).await.0, 404);
    let (status, _) = bob
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "hi"}),
        )
        .await;
    assert_eq!(status, 404);

    // Files are their owner's alone, an admin's reach notwithstanding.
    let resp = alice
        .request_raw("POST", "/files?filename=a.txt", Some(b"hello".to_vec()))
        .await;
    assert_eq!(resp.status(), 201);
    use http_body_util::BodyExt;
    let file: Value =
        serde_json::from_slice(&resp.into_body().collect().await.unwrap().to_bytes()).unwrap();
    let fid = file["id"].as_str().unwrap();
    assert_eq!(alice.get(&format!("/files/{fid}")).await.0, 200);
    for other in [&bob, &root] {
        assert_eq!(other.get(&format!("/files/{fid}")).await.0, 404);
        assert_eq!(other.get(&format!("/files/{fid}/content")).await.0, 404);
    }
    let (status, created) = bob.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let bobs = created["sessionId"].as_str().unwrap();
    let message = json!({"content": "see", "files": [fid]});
    let (status, err) = bob
        .post(&format!("/sessions/{bobs}/messages"), &message)
        .await;
    assert_eq!(status, 404, "{err}");

    // Root (admin): every session and approval.
    let mut every = vec![sid.clone(), bobs.to_string()];
    every.sort();
    assert_eq!(listed(&root.get("/sessions").await.1), every);
    let (status, info) = root.get(&format!("/sessions/{sid}")).await;
    assert_eq!(status, 200, "{info}");
    assert_eq!(info["status"], "awaiting_client");
    // Its tools as alice sees them, not as root would.
    assert_eq!(names(&info["agent"]["tools"], "/name"), ["mcp__ex__echo"]);
    let (_, pending) = root.get("/console/pending").await;
    assert_eq!(pending["pending"][0]["session"], sid.as_str(), "{pending}");
    let (_, pending) = alice.get("/console/pending").await;
    assert_eq!(pending["pending"][0]["toolCallId"], "call_1", "{pending}");
    // Root's own listing holds alice's, and alice's holds only hers.
    let (status, _) = root.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    assert_eq!(
        root.get("/sessions").await.1["sessions"]
            .as_array()
            .unwrap()
            .len(),
        3
    );
    assert_eq!(listed(&alice.get("/sessions").await.1), [sid.as_str()]);
}

#[tokio::test]
async fn a_rotated_key_keeps_its_sessions() {
    let fake = FakeOpenAi::start().await;
    let rotating =
        "[keys.alice]\nkey_env = \"TEST_ALICE_KEY\"\nkey_env_next = \"TEST_ALICE_NEXT\"\n";
    let vars = [
        ("TEST_ALICE_KEY", "old-secret"),
        ("TEST_ALICE_NEXT", "new-secret"),
        ("TEST_PRINCIPALS_ENV_KEYS", ENV_KEY),
    ];
    let first = config(&fake, rotating);
    let server = TestServer::start_with_env(&first, &vars).await;
    let old = server.http.with_key("old-secret");
    let new = server.http.with_key("new-secret");
    let (status, created) = old.post("/sessions", &json!({})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    // During the overlap both secrets are alice.
    assert_eq!(new.get(&format!("/sessions/{sid}")).await.0, 200);
    assert_eq!(
        names(&new.get("/sessions").await.1["sessions"], "/sessionId"),
        [sid.as_str()]
    );
    assert_eq!(
        server
            .http
            .with_key(ENV_KEY)
            .get(&format!("/sessions/{sid}"))
            .await
            .0,
        404
    );

    // After the rotation: only the new secret, and the session is still alice's.
    let dir = server.stop().await;
    let rotated = "[keys.alice]\nkey_env = \"TEST_ALICE_KEY\"\n";
    let vars = [
        ("TEST_ALICE_KEY", "new-secret"),
        ("TEST_PRINCIPALS_ENV_KEYS", ENV_KEY),
    ];
    // The same file but for the key (and so the same store, PostgreSQL's too).
    let server = TestServer::start_in_with_env(dir, &first.replace(rotating, rotated), &vars).await;
    let new = server.http.with_key("new-secret");
    assert_eq!(new.get(&format!("/sessions/{sid}")).await.0, 200);
    assert_eq!(
        names(&new.get("/sessions").await.1["sessions"], "/sessionId"),
        [sid]
    );
    assert_eq!(
        server.http.with_key("old-secret").get("/sessions").await.0,
        401
    );
}

#[tokio::test]
async fn a_digest_principal_takes_its_key_and_nothing_else() {
    let (_fake, server) = start().await;
    let (status, v) = server.http.with_key(BOB).get("/sessions").await;
    assert_eq!(status, 200, "{v}");
    for wrong in ["bob-secreT", bob_sha256().as_str(), ""] {
        let (status, err) = server.http.with_key(wrong).get("/sessions").await;
        assert_eq!(status, 401, "{wrong:?}");
        assert_eq!(err["error"]["type"], "unauthorized");
    }
}

#[tokio::test]
async fn a_key_variable_that_is_unset_or_shared_stops_the_server() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, config(&fake, &keys())).unwrap();
    let start = |vars: &[(&str, &str)]| {
        let cfg = turnstile::config::load(&path, &crate::common::env(vars)).unwrap();
        turnstile::startup::start(cfg, "127.0.0.1:0".parse().unwrap(), Default::default())
    };
    let err = start(&[
        ("TEST_ROOT_KEY", ROOT),
        ("TEST_PRINCIPALS_ENV_KEYS", ENV_KEY),
    ])
    .await
    .err()
    .expect("refused");
    let shown = err.to_string();
    assert!(
        shown.contains("[keys.alice] key_env names TEST_ALICE_KEY, which is unset"),
        "{shown}"
    );
    assert!(!shown.contains('\n'), "one line: {shown}");
    // One secret for two principals (alice's is an api_keys_env key too).
    let err = start(&[
        ("TEST_ALICE_KEY", ENV_KEY),
        ("TEST_ROOT_KEY", ROOT),
        ("TEST_PRINCIPALS_ENV_KEYS", ENV_KEY),
    ])
    .await
    .err()
    .expect("refused");
    assert!(
        err.to_string()
            .contains("the same key as a key of [server] api_keys_env"),
        "{err}"
    );
}

#[tokio::test]
async fn keys_tables_alone_allow_a_public_address() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    let text = config_text(&fake, "[keys.alice]\nkey_env = \"TEST_ALICE_KEY\"\n");
    std::fs::write(&path, text).unwrap();
    let cfg =
        turnstile::config::load(&path, &crate::common::env(&[("TEST_ALICE_KEY", ALICE)])).unwrap();
    let running = turnstile::startup::start(cfg, "0.0.0.0:0".parse().unwrap(), Default::default())
        .await
        .expect("a keyed server may listen on a public address");
    running.stop().await;
}

#[tokio::test]
async fn a_principal_whose_agents_change_reads_its_sessions_but_runs_no_turn_there() {
    let fake = FakeOpenAi::start().await;
    let scoped =
        |agents: &str| format!("[keys.alice]\nkey_env = \"TEST_ALICE_KEY\"\nagents = [{agents}]\n");
    let vars = [
        ("TEST_ALICE_KEY", ALICE),
        ("TEST_PRINCIPALS_ENV_KEYS", ENV_KEY),
    ];
    let first = config(&fake, &scoped("\"alpha\""));
    let server = TestServer::start_with_env(&first, &vars).await;
    let (status, created) = server
        .http
        .with_key(ALICE)
        .post("/sessions", &json!({}))
        .await;
    assert_eq!(status, 201, "{created}");
    let sid = created["sessionId"].as_str().unwrap().to_string();
    let dir = server.stop().await;
    let server = TestServer::start_in_with_env(
        dir,
        &first.replace(&scoped("\"alpha\""), &scoped("\"beta\"")),
        &vars,
    )
    .await;
    let alice = server.http.with_key(ALICE);
    assert_eq!(alice.get(&format!("/sessions/{sid}")).await.0, 200);
    let turn = json!({"messages": [{"role": "user", "content": "hi"}]});
    for (path, body) in [
        (format!("/sessions/{sid}/turns"), turn),
        (
            format!("/sessions/{sid}/messages"),
            json!({"content": "hi"}),
        ),
        (format!("/sessions/{sid}/run"), json!({"goal": "hi"})),
    ] {
        let (status, err) = alice.post(&path, &body).await;
        assert_eq!(status, 403, "{path}: {err}");
        assert_eq!(err["error"]["type"], "forbidden");
    }
    assert!(fake.requests().is_empty(), "the model was never called");
}
