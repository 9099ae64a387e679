//! AAP sessions and the HTTP edge: create, list, get, delete, validation errors, limits, auth.

use crate::common::{config_text, setup, TestServer};
use serde_json::json;
use turnstile::testkit::fake_openai::FakeOpenAi;

#[tokio::test]
async fn sessions_are_created_listed_in_pages_read_and_deleted() {
    let (_fake, server) = setup("").await;
    let (status, created) = server.http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let id = created["sessionId"].as_str().unwrap().to_string();
    assert!(id.starts_with("sess_"));
    assert_eq!(created["id"], id.as_str());
    let created_at = created["created_at"].as_str().unwrap();
    assert_eq!(
        created_at.len(),
        24,
        "RFC 3339 with milliseconds: {created_at}"
    );

    let mut ids = vec![id.clone()];
    for _ in 0..54 {
        ids.push(server.session(json!({})).await);
    }
    let (_, page1) = server.http.get("/sessions").await;
    assert_eq!(page1["sessions"].as_array().unwrap().len(), 50);
    let next = page1["next"].as_str().expect("next cursor").to_string();
    let (_, page2) = server.http.get(&format!("/sessions?after={next}")).await;
    assert_eq!(page2["sessions"].as_array().unwrap().len(), 5);
    assert!(page2.get("next").is_none(), "no next on the last page");
    let listed: Vec<String> = page1["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .chain(page2["sessions"].as_array().unwrap())
        .map(|s| s["sessionId"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(listed, ids, "every session once, in creation order");

    let (status, info) = server.http.get(&format!("/sessions/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(info["agent"]["name"], "assistant");
    assert_eq!(info["status"], "idle");

    let workspace = server.dir.path().join("sandboxes").join(&id);
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("f.txt"), "x").unwrap();
    let (status, body) = server.http.delete(&format!("/sessions/{id}")).await;
    assert_eq!(status, 204);
    assert!(body.is_null());
    assert!(!workspace.exists(), "the session's workspace goes with it");
    let (status, err) = server.http.get(&format!("/sessions/{id}")).await;
    assert_eq!(status, 404);
    assert_eq!(err["error"]["type"], "not_found");
    let (status, _) = server
        .http
        .get(&format!("/sessions/{id}/history?type=full"))
        .await;
    assert_eq!(status, 404);
    let (status, _) = server.http.delete(&format!("/sessions/{id}")).await;
    assert_eq!(status, 404);
}

/// Readers racing a delete never bring the session back: once `DELETE` has answered, it is gone
/// from the API, the list, and memory (it used to leave memory before its delete was committed,
/// so a read in between loaded it again from the log).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_read_while_it_is_deleted_stays_deleted() {
    let (_fake, server) = setup("").await;
    for _ in 0..40 {
        let id = server.session(json!({})).await;
        let path = format!("/sessions/{id}");
        let readers: Vec<_> = (0..3)
            .map(|_| {
                let (http, path) = (server.http.clone(), path.clone());
                tokio::spawn(async move {
                    // Until the delete shows; every answer before it is the session itself.
                    loop {
                        match http.get(&path).await {
                            (200, info) => assert_eq!(info["sessionId"], path[10..]),
                            (404, _) => return,
                            other => panic!("GET during a delete: {other:?}"),
                        }
                    }
                })
            })
            .collect();
        assert_eq!(server.http.delete(&path).await.0, 204);
        assert_eq!(server.http.get(&path).await.0, 404);
        for r in readers {
            r.await.unwrap();
        }
        assert_eq!(server.http.get(&path).await.0, 404);
        assert!(!server.engine().in_memory(&id).1, "{id} is back in memory");
        let (_, list) = server.http.get("/sessions").await;
        assert!(
            !list["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .any(|s| s["sessionId"] == id),
            "{id} is still listed: {list}"
        );
    }
}

#[tokio::test]
async fn a_session_without_an_agent_object_gets_the_default_agent() {
    let (_fake, server) = setup("[agents.first]\n[agents.second]\n").await;
    let id = server.session(json!({})).await;
    let (_, info) = server.http.get(&format!("/sessions/{id}")).await;
    assert_eq!(info["agent"]["name"], "first");
    let id2 = server.session(json!({"agent": {"name": "second"}})).await;
    let (_, info) = server.http.get(&format!("/sessions/{id2}")).await;
    assert_eq!(info["agent"]["name"], "second");
}

#[tokio::test]
async fn bad_requests_get_a_clear_json_error_and_change_nothing() {
    let (fake, server) = setup("[agents.assistant]\nmodels = [\"a\", \"b\"]\n").await;
    let id = server.session(json!({})).await;
    let turns = format!("/sessions/{id}/turns");
    let cases = [
        (
            "POST",
            "/sessions".to_string(),
            json!({"agent": {"name": "nope"}}),
            400,
            "unknown agent",
        ),
        (
            "POST",
            "/sessions".to_string(),
            json!({"agent": {"name": "assistant", "options": {"model": "c"}}}),
            400,
            "must be one of",
        ),
        (
            "POST",
            "/sessions".to_string(),
            json!({"agent": {"name": "assistant", "options": {"color": "red"}}}),
            400,
            "no option",
        ),
        (
            "POST",
            "/sessions".to_string(),
            json!({"agent": {"name": "assistant", "tools": [{"name": "ghost", "trust": true}]}}),
            400,
            "does not expose",
        ),
        (
            "POST",
            "/sessions".to_string(),
            json!({"mesages": []}),
            400,
            "unknown field",
        ),
        (
            "POST",
            "/sessions".to_string(),
            json!({"tools": [{"name": "t", "parameters": {}}, {"name": "t", "parameters": {}}]}),
            400,
            "unique",
        ),
        (
            "POST",
            turns.clone(),
            json!({"messages": []}),
            400,
            "messages is empty",
        ),
        (
            "POST",
            turns.clone(),
            json!({"messages": [{"role": "robot", "content": "x"}]}),
            400,
            "unknown variant",
        ),
        (
            "POST",
            turns.clone(),
            json!({"messages": [{"role": "system", "content": "x"}]}),
            400,
            "only user",
        ),
        (
            "POST",
            turns.clone(),
            json!({"messages": [{"role": "user", "content": 42}]}),
            400,
            "expected a string or an array of content blocks",
        ),
        (
            "POST",
            turns.clone(),
            json!({"messages": [{"role": "user", "content": [{"type": "video", "url": "x"}]}]}),
            400,
            "unknown variant `video`",
        ),
        (
            "POST",
            turns.clone(),
            json!({"stream": "fast", "messages": [{"role": "user", "content": "x"}]}),
            400,
            "unknown variant",
        ),
        (
            "POST",
            turns.clone(),
            json!({"agent": {"name": "other"}, "messages": [{"role": "user", "content": "x"}]}),
            400,
            "cannot change",
        ),
        (
            "POST",
            turns.clone(),
            json!({"messages": [{"role": "tool", "toolCallId": "c1", "content": "x"}]}),
            409,
            "no tool calls are pending",
        ),
        (
            "POST",
            turns.clone(),
            json!({"messages": [{"role": "user", "content": [{"type": "tool_use", "toolCallId": "x", "name": "n", "input": {}}]}]}),
            400,
            "only text and image",
        ),
        (
            "GET",
            format!("/sessions/{id}/history"),
            json!(null),
            400,
            "type is required",
        ),
        (
            "GET",
            format!("/sessions/{id}/history?type=everything"),
            json!(null),
            404,
            "full",
        ),
        (
            "POST",
            "/sessions/sess_00000000000000000000000/turns".to_string(),
            json!({"messages": [{"role": "user", "content": "x"}]}),
            404,
            "not found",
        ),
        (
            "GET",
            "/sessions/../../etc/passwd".to_string(),
            json!(null),
            404,
            "",
        ),
        ("PUT", "/sessions".to_string(), json!({}), 405, "allowed"),
        ("GET", "/nowhere".to_string(), json!(null), 404, "no route"),
    ];
    for (method, path, body, want, needle) in cases {
        let body = (!body.is_null()).then_some(body);
        let (status, err) = server.http.call(method, &path, body.as_ref()).await;
        assert_eq!(status, want, "{method} {path} {body:?}: {err}");
        let message = err["error"]["message"]
            .as_str()
            .unwrap_or_else(|| panic!("{method} {path}: no error message: {err}"));
        assert!(err["error"]["type"].is_string(), "{err}");
        assert!(
            message.contains(needle),
            "{method} {path}: {message:?} should mention {needle:?}"
        );
    }
    // Invalid JSON.
    let resp = server
        .http
        .request_raw("POST", "/sessions", Some(b"{not json".to_vec()))
        .await;
    assert_eq!(resp.status(), 400);
    // None of it reached the model or changed the session.
    assert!(fake.requests().is_empty());
    let (_, info) = server.http.get(&format!("/sessions/{id}")).await;
    assert_eq!(info["status"], "idle");
    assert_eq!(
        info["agent"]["options"]["model"], "a",
        "a rejected turn applies no override"
    );
}

#[tokio::test]
async fn a_client_tool_may_not_take_a_name_twice() {
    let (_fake, server) = setup("").await;
    let id = server
        .session(json!({"tools": [{"name": "lookup", "description": "", "parameters": {"type": "object"}}]}))
        .await;
    let (status, err) = server
        .http
        .post(
            &format!("/sessions/{id}/turns"),
            &json!({"tools": [{"name": "a", "parameters": {"type": "object"}}, {"name": "a", "parameters": {"type": "object"}}],
                    "messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(status, 400);
    assert!(err["error"]["message"].as_str().unwrap().contains("\"a\""));
    let (_, info) = server.http.get(&format!("/sessions/{id}")).await;
    assert_eq!(
        info["tools"][0]["name"], "lookup",
        "the old client tools are kept"
    );
}

#[tokio::test]
async fn bodies_over_the_limit_are_413() {
    let (_fake, server) = setup("").await;
    let cfg = std::fs::read_to_string(server.dir.path().join("tools.toml")).unwrap();
    let server =
        TestServer::start(&cfg.replace("[server]", "[server]\nmax_body_bytes = 1024")).await;
    let big = json!({"messages": [{"role": "user", "content": "x".repeat(2000)}]});
    let (status, err) = server.http.post("/sessions", &big).await;
    assert_eq!(status, 413);
    assert_eq!(err["error"]["type"], "body_too_large");
    assert!(err["error"]["message"]
        .as_str()
        .unwrap()
        .contains("max_body_bytes"));
}

#[tokio::test]
async fn api_keys_guard_every_route_and_sessions_belong_to_their_key() {
    let fake = FakeOpenAi::start().await;
    let var = "TURNSTILE_TEST_KEYS_A";
    let cfg =
        config_text(&fake, "").replace("[server]", &format!("[server]\napi_keys_env = \"{var}\""));
    let server = TestServer::start_with_env(&cfg, &[(var, "key-one, key-two")]).await;
    let (status, _) = server.http.get("/healthz").await;
    assert_eq!(status, 200, "healthz is public");
    let (status, _) = server.http.get("/meta").await;
    assert_eq!(status, 200, "meta is public by default");
    let (status, err) = server.http.get("/sessions").await;
    assert_eq!(status, 401);
    assert_eq!(err["error"]["type"], "unauthorized");
    let (status, _) = server.http.with_key("wrong").get("/sessions").await;
    assert_eq!(status, 401);

    let one = server.http.with_key("key-one");
    let two = server.http.with_key("key-two");
    let (status, created) = one.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let id = created["sessionId"].as_str().unwrap();
    assert_eq!(one.get(&format!("/sessions/{id}")).await.0, 200);
    assert_eq!(
        two.get(&format!("/sessions/{id}")).await.0,
        404,
        "another key's session does not exist for you"
    );
    assert_eq!(two.delete(&format!("/sessions/{id}")).await.0, 404);
    assert_eq!(
        one.get("/sessions").await.1["sessions"]
            .as_array()
            .unwrap()
            .len(),
        1
    );
    assert_eq!(
        two.get("/sessions").await.1["sessions"]
            .as_array()
            .unwrap()
            .len(),
        0
    );
}

#[tokio::test]
async fn a_public_address_without_keys_is_refused() {
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("tools.toml");
    std::fs::write(&path, config_text(&fake, "")).unwrap();
    let cfg = turnstile::config::load(&path, &crate::common::env(&[])).unwrap();
    let err = turnstile::startup::start(cfg, "0.0.0.0:0".parse().unwrap(), Default::default())
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("--insecure"), "{err}");
}

#[tokio::test]
async fn health_and_metrics_answer() {
    let (fake, server) = setup("").await;
    let id = server.session(json!({})).await;
    fake.push(turnstile::testkit::fake_openai::Reply::text("hi"));
    server
        .http
        .post(
            &format!("/sessions/{id}/turns"),
            &json!({"messages": [{"role": "user", "content": "x"}]}),
        )
        .await;
    assert_eq!(server.http.get("/healthz").await.1, json!({"status": "ok"}));
    let resp = server.http.request_raw("GET", "/metrics", None).await;
    assert_eq!(resp.status(), 200);
    use http_body_util::BodyExt;
    let text = String::from_utf8(
        resp.into_body()
            .collect()
            .await
            .unwrap()
            .to_bytes()
            .to_vec(),
    )
    .unwrap();
    assert!(
        text.contains("# TYPE turnstile_turns_started_total counter"),
        "{text}"
    );
    let count = |name: &str| -> u64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing: {text}"))
    };
    assert!(count("turnstile_turns_started_total") >= 1);
    assert!(count("turnstile_turns_total{agent=\"assistant\",outcome=\"completed\"}") >= 1);
    assert!(count("turnstile_upstream_calls_total{provider=\"openai\",model=\"fake-model\",outcome=\"ok\"}") >= 1);
}
