//! Traces and the request/turn log lines, as an operator sees them: every span of a turn, its
//! parent and its attributes, recorded by a subscriber layer in this process (the same spans the
//! `otlp` feature exports); the INFO line of each request and of each turn's end; and the real
//! binary's log written to a pipe, with no colour codes in it.

use std::time::{Duration, Instant};

use crate::common::tracing_capture::{recorder, Recorder, SpanRec};
use crate::common::{config_text, setup, TestServer};
use serde_json::json;
use turnstile::testkit::fake_openai::{FakeOpenAi, Reply};

fn field<'a>(span: &'a SpanRec, name: &str) -> &'a str {
    span.fields
        .get(name)
        .map(String::as_str)
        .unwrap_or_else(|| panic!("span {} has no field {name}: {:?}", span.name, span.fields))
}

const POLICY: &str = r#"
[policy]
trust = ["deliver_file"]
default = "ask"
"#;

/// A session whose workspace holds report.txt, and an upstream scripted to deliver it then
/// answer: one turn of two model calls and one server tool call.
async fn a_turn_that_delivers_a_file() -> (FakeOpenAi, TestServer, String) {
    let (fake, server) = setup(POLICY).await;
    let sid = server.session(json!({})).await;
    let workspace = server.dir.path().join("sandboxes").join(&sid);
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("report.txt"), "the report\n").unwrap();
    fake.push(
        Reply::tool_calls(&[("call_1", "deliver_file", json!({"path": "report.txt"}))])
            .usage(10, 3),
    );
    fake.push(Reply::text("Here it is.").usage(20, 4));
    (fake, server, sid)
}

/// Checks the span tree of the session's one turn under `request`: the turn span, its two model
/// calls and its tool call, with their attributes; and the INFO line the turn ended with.
fn check_turn_tree(rec: &Recorder, request: &SpanRec, sid: &str) {
    let turns = rec.children(request.seq, "turn");
    assert_eq!(turns.len(), 1, "one turn under the request: {turns:?}");
    let turn = &turns[0];
    assert!(turn.closed);
    assert_eq!(field(turn, "session"), sid);
    assert!(field(turn, "turn").starts_with("turn_"), "{turn:?}");
    assert_eq!(field(turn, "agent"), "assistant");
    assert_eq!(field(turn, "outcome"), "completed");
    assert_eq!(field(turn, "reason"), "end_turn");
    assert_eq!(field(turn, "steps"), "2");
    assert_eq!(field(turn, "tokens_in"), "30");
    assert_eq!(field(turn, "tokens_out"), "7");
    assert_eq!(
        field(request, "turn"),
        field(turn, "turn"),
        "the request names its turn"
    );

    let models = rec.children(turn.seq, "model_call");
    assert_eq!(
        models.len(),
        2,
        "two model calls under the turn: {models:?}"
    );
    for (m, tokens_in) in models.iter().zip(["10", "20"]) {
        assert_eq!(field(m, "upstream"), "default");
        assert_eq!(field(m, "provider"), "openai");
        assert_eq!(field(m, "model"), "fake-model");
        assert_eq!(field(m, "attempt"), "1");
        assert_eq!(field(m, "outcome"), "ok");
        assert_eq!(field(m, "tokens_in"), tokens_in);
    }
    let tools = rec.children(turn.seq, "tool_call");
    assert_eq!(tools.len(), 1, "one tool call under the turn: {tools:?}");
    assert_eq!(field(&tools[0], "server"), "builtin");
    assert_eq!(field(&tools[0], "tool"), "deliver_file");
    assert_eq!(field(&tools[0], "verdict"), "trust");
    assert_eq!(field(&tools[0], "outcome"), "ok");

    let ended = rec.events_in(turn.seq, "turn ended");
    assert_eq!(ended.len(), 1, "one INFO line at the turn's end");
    let e = &ended[0];
    assert_eq!(e.level, tracing::Level::INFO);
    for (k, v) in [
        ("outcome", "completed"),
        ("reason", "end_turn"),
        ("steps", "2"),
        ("tokens_in", "30"),
        ("tokens_out", "7"),
    ] {
        assert_eq!(e.fields.get(k).map(String::as_str), Some(v), "{k}: {e:?}");
    }
    assert!(e.fields.contains_key("duration_ms"), "{e:?}");
}

/// A streamed AAP turn, which the request's own task runs while it streams (a driven turn):
/// request → turn → model calls and tool call, the request named by its route template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_turns_span_tree_is_request_turn_model_and_tool_calls() {
    let rec = recorder();
    let (_fake, server, sid) = a_turn_that_delivers_a_file().await;
    let body = json!({"stream": "message", "messages": [{"role": "user", "content": "report?"}]});
    let events = server
        .http
        .post_sse(&format!("/sessions/{sid}/turns"), &body)
        .await;
    assert!(
        events.iter().any(|e| e.event == "turn_stop"),
        "the turn ended: {events:?}"
    );
    let request = rec.request("/sessions/{id}/turns", &sid).await;
    assert_eq!(field(&request, "method"), "POST");
    assert_eq!(request.parent, None, "a request span is a root");
    assert_eq!(field(&request, "status"), "200");
    check_turn_tree(rec, &request, &sid);

    let lines = rec.events_in(request.seq, "request");
    assert_eq!(lines.len(), 1, "one line per request");
    assert_eq!(lines[0].level, tracing::Level::INFO);
    assert_eq!(lines[0].fields["status"], "200");
    assert!(lines[0].fields.contains_key("duration_ms"));
}

/// A turn started by `POST /sessions/{id}/messages` runs on a task spawned for it: its span is
/// still the request's child.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turn_on_a_task_of_its_own_is_still_its_requests_child() {
    let rec = recorder();
    let (_fake, server, sid) = a_turn_that_delivers_a_file().await;
    let (status, v) = server
        .http
        .post(
            &format!("/sessions/{sid}/messages"),
            &json!({"content": "report?"}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let request = rec.request("/sessions/{id}/messages", &sid).await;
    assert_eq!(field(&request, "status"), "202");
    check_turn_tree(rec, &request, &sid);
}

/// The real binary logging to a pipe: no ANSI colour codes; one INFO line per request with
/// the route template and the session id, and one per turn end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_log_written_to_a_pipe_has_no_colour_and_one_line_per_request_and_turn() {
    use tokio::io::{AsyncBufReadExt, BufReader};
    let fake = FakeOpenAi::start().await;
    fake.push(Reply::text("hello").usage(5, 1));
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, "")).unwrap();
    let mut child = crate::common::binary::command()
        .args(["serve", "--config"])
        .arg(dir.path().join("tools.toml"))
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut log = Vec::new();
    let addr: std::net::SocketAddr = loop {
        let line = lines.next_line().await.unwrap().expect("exited early");
        log.push(line.clone());
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    let http = crate::common::Http::new(addr);
    let (status, v) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = v["sessionId"].as_str().unwrap().to_string();
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": "hi"}]});
    let (status, v) = http.post(&format!("/sessions/{sid}/turns"), &body).await;
    assert_eq!(status, 200, "{v}");
    // Both lines come at the latest when the request has answered; read until they are there.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let has =
        |log: &[String], needle: &[&str]| log.iter().any(|l| needle.iter().all(|n| l.contains(n)));
    let request_line = [
        " INFO ",
        "method=POST",
        "route=/sessions/{id}/turns",
        &format!("session={sid}"),
        "turn=turn_",
        "status=200",
        "duration_ms=",
    ];
    let turn_line = [
        " INFO ",
        "turn ended",
        "outcome=completed",
        "reason=end_turn",
        "steps=1",
        "tokens_in=5",
        "tokens_out=1",
        "agent=assistant",
    ];
    while !(has(&log, &request_line) && has(&log, &turn_line)) {
        let line = tokio::time::timeout_at(deadline, lines.next_line())
            .await
            .unwrap_or_else(|_| panic!("log lines missing; the log:\n{}", log.join("\n")))
            .unwrap()
            .expect("exited early");
        log.push(line);
    }
    let all = log.join("\n");
    assert!(!all.contains('\u{1b}'), "ANSI codes in a piped log:\n{all}");
    assert!(
        !all.contains(&format!("/sessions/{sid}/turns")),
        "the raw path is not the route:\n{all}"
    );
    child.kill().await.ok();
}

/// An OTLP/HTTP collector on port 0: every span it is sent, from the protobuf body of
/// `POST /v1/traces`.
#[cfg(feature = "otlp")]
mod collector {
    use std::sync::{Arc, Mutex};

    use bytes::Bytes;
    use http_body_util::{BodyExt, Full};
    use hyper::service::service_fn;
    use hyper_util::rt::TokioIo;
    use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    use opentelemetry_proto::tonic::trace::v1::Span;
    use prost::Message;

    pub type Spans = Arc<Mutex<Vec<(String, Span)>>>;

    /// Starts it; its address and the spans (with their service name) received so far.
    pub async fn start() -> (std::net::SocketAddr, Spans) {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let spans: Spans = Arc::default();
        let got = spans.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let got = got.clone();
                let service = service_fn(move |req: hyper::Request<hyper::body::Incoming>| {
                    let got = got.clone();
                    async move {
                        let path = req.uri().path().to_string();
                        let body = req.into_body().collect().await?.to_bytes();
                        if path == "/v1/traces" {
                            let export = ExportTraceServiceRequest::decode(body).expect("OTLP");
                            for rs in export.resource_spans {
                                let service = rs
                                    .resource
                                    .iter()
                                    .flat_map(|r| r.attributes.iter())
                                    .find(|a| a.key == "service.name")
                                    .map(|a| value(a.value.as_ref()))
                                    .unwrap_or_default();
                                for ss in rs.scope_spans {
                                    for s in ss.spans {
                                        got.lock().unwrap().push((service.clone(), s));
                                    }
                                }
                            }
                        }
                        let status = if path == "/v1/traces" { 200 } else { 404 };
                        Ok::<_, hyper::Error>(
                            hyper::Response::builder()
                                .status(status)
                                .header("content-type", "application/x-protobuf")
                                .body(Full::new(Bytes::new()))
                                .unwrap(),
                        )
                    }
                });
                tokio::spawn(
                    hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service),
                );
            }
        });
        (addr, spans)
    }

    pub fn value(v: Option<&opentelemetry_proto::tonic::common::v1::AnyValue>) -> String {
        match v.and_then(|v| v.value.as_ref()) {
            Some(Value::StringValue(s)) => s.clone(),
            Some(Value::IntValue(i)) => i.to_string(),
            Some(Value::BoolValue(b)) => b.to_string(),
            Some(Value::DoubleValue(d)) => d.to_string(),
            other => format!("{other:?}"),
        }
    }

    pub fn attr(span: &Span, key: &str) -> String {
        span.attributes
            .iter()
            .find(|a| a.key == key)
            .map(|a| value(a.value.as_ref()))
            .unwrap_or_else(|| panic!("span {} has no attribute {key}", span.name))
    }
}

/// The real binary with `[telemetry] otlp_endpoint`: one turn's spans reach an OTLP collector as
/// one trace, request → turn → model calls and tool call, with their attributes.
#[cfg(feature = "otlp")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_turns_spans_are_exported_over_otlp_as_one_tree() {
    use collector::attr;
    use tokio::io::{AsyncBufReadExt, BufReader};
    let (collector_addr, spans) = collector::start().await;
    let fake = FakeOpenAi::start().await;
    let dir = tempfile::tempdir().unwrap();
    let extra = format!("{POLICY}\n[telemetry]\notlp_endpoint = \"http://{collector_addr}\"\n");
    std::fs::write(dir.path().join("tools.toml"), config_text(&fake, &extra)).unwrap();
    let mut child = crate::common::binary::command()
        .args(["serve", "--config"])
        .arg(dir.path().join("tools.toml"))
        .args(["--listen", "127.0.0.1:0"])
        .env("RUST_LOG", "info")
        // Spans are sent 50 ms after they end rather than 5 s.
        .env("OTEL_BSP_SCHEDULE_DELAY", "50")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn turnstile");
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let addr: std::net::SocketAddr = loop {
        let line = lines.next_line().await.unwrap().expect("exited early");
        if let Some(rest) = line.split("listening on http://").nth(1) {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    let http = crate::common::Http::new(addr);
    let (status, v) = http.post("/sessions", &json!({})).await;
    assert_eq!(status, 201);
    let sid = v["sessionId"].as_str().unwrap().to_string();
    let workspace = dir.path().join("sandboxes").join(&sid);
    std::fs::create_dir_all(&workspace).unwrap();
    std::fs::write(workspace.join("report.txt"), "the report\n").unwrap();
    fake.push(
        Reply::tool_calls(&[("call_1", "deliver_file", json!({"path": "report.txt"}))])
            .usage(10, 3),
    );
    fake.push(Reply::text("Here it is.").usage(20, 4));
    let body = json!({"stream": "none", "messages": [{"role": "user", "content": "report?"}]});
    let (status, v) = http.post(&format!("/sessions/{sid}/turns"), &body).await;
    assert_eq!(status, 200, "{v}");

    // The request's span ends after its turn's: once it is in, the whole tree is.
    let request_name = "POST /sessions/{id}/turns";
    let deadline = Instant::now() + Duration::from_secs(15);
    let got = loop {
        let got = spans.lock().unwrap().clone();
        if got.iter().any(|(_, s)| s.name == request_name) {
            break got;
        }
        assert!(
            Instant::now() < deadline,
            "no request span exported: {got:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(got.iter().all(|(service, _)| service == "turnstile"));
    let one = |name: &str| {
        let of: Vec<_> = got
            .iter()
            .map(|(_, s)| s)
            .filter(|s| s.name == name)
            .collect();
        of
    };
    let request = one(request_name)[0];
    assert!(request.parent_span_id.is_empty(), "the request is the root");
    assert_eq!(attr(request, "route"), "/sessions/{id}/turns");
    assert_eq!(attr(request, "session"), sid);
    assert_eq!(attr(request, "status"), "200");
    let turns = one("turn");
    assert_eq!(turns.len(), 1);
    let turn = turns[0];
    assert_eq!(turn.trace_id, request.trace_id, "one trace");
    assert_eq!(turn.parent_span_id, request.span_id);
    assert_eq!(attr(turn, "session"), sid);
    assert_eq!(attr(turn, "turn"), attr(request, "turn"));
    assert_eq!(attr(turn, "agent"), "assistant");
    assert_eq!(attr(turn, "outcome"), "completed");
    assert_eq!(attr(turn, "steps"), "2");
    let models = one("model_call");
    assert_eq!(models.len(), 2);
    for m in &models {
        assert_eq!(m.parent_span_id, turn.span_id);
        assert_eq!(attr(m, "provider"), "openai");
        assert_eq!(attr(m, "model"), "fake-model");
        assert_eq!(attr(m, "attempt"), "1");
    }
    let tools = one("tool_call");
    assert_eq!(tools.len(), 1);
    assert_eq!(tools[0].parent_span_id, turn.span_id);
    assert_eq!(attr(tools[0], "server"), "builtin");
    assert_eq!(attr(tools[0], "tool"), "deliver_file");
    assert_eq!(attr(tools[0], "verdict"), "trust");
    child.kill().await.ok();
}
