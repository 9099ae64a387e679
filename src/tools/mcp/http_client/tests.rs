use std::time::Duration;

use http::HeaderMap;
use http_body_util::BodyExt;

use super::bounded_events::SseParser;
use super::responses::challenge_scope;
use super::wire::Sse;
use std::sync::Mutex;

use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rmcp::model::CallToolRequestParams;
use rmcp::ServiceExt;
use serde_json::{json, Value};

use super::*;

/// One request as the fake server saw it.
#[derive(Debug, Clone)]
struct Seen {
    method: Method,
    headers: HeaderMap,
    /// The JSON-RPC method of a POST.
    rpc: Option<String>,
}

/// A streamable-HTTP MCP server just good enough for the client: `initialize` answered
/// with JSON and a session id, `tools/list` with an SSE stream, `tools/call` with JSON,
/// notifications with 202, GET with 405 (no server stream), DELETE with 200. With `fail`,
/// every POST gets a 500.
struct Fake {
    url: String,
    seen: Arc<Mutex<Vec<Seen>>>,
}

impl Fake {
    async fn start(fail: bool) -> Fake {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/mcp", listener.local_addr().unwrap());
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                let log = log.clone();
                let service = service_fn(move |req| answer(req, log.clone(), fail));
                tokio::spawn(http1::Builder::new().serve_connection(TokioIo::new(stream), service));
            }
        });
        Fake { url, seen }
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().unwrap().clone()
    }
}

async fn answer(
    req: Request<Incoming>,
    log: Arc<Mutex<Vec<Seen>>>,
    fail: bool,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    let (parts, body) = req.into_parts();
    let body = body.collect().await?.to_bytes();
    let rpc: Option<Value> = serde_json::from_slice(&body).ok();
    let method = rpc
        .as_ref()
        .and_then(|m| m["method"].as_str())
        .map(str::to_owned);
    log.lock().unwrap().push(Seen {
        method: parts.method.clone(),
        headers: parts.headers,
        rpc: method.clone(),
    });
    let reply = |status: u16, ct: Option<&str>, body: String| {
        let mut r = Response::builder().status(status);
        if let Some(ct) = ct {
            r = r.header(CONTENT_TYPE, ct);
        }
        Ok(r.body(Full::new(Bytes::from(body))).unwrap())
    };
    match parts.method {
        Method::GET => return reply(405, None, String::new()),
        Method::DELETE => return reply(200, None, String::new()),
        _ if fail => return reply(500, Some("text/plain"), "boom".into()),
        _ => {}
    }
    let rpc = rpc.unwrap_or_default();
    let result = |result: Value| json!({"jsonrpc": "2.0", "id": rpc["id"], "result": result});
    match method.as_deref().unwrap_or_default() {
        "initialize" => {
            // What servers deployed today answer, whatever the client proposes (rmcp 3.11
            // proposes 2026-07-28; echoing that would add its Mcp-Method/Mcp-Name headers).
            let init = result(json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {"listChanged": true}},
                "serverInfo": {"name": "fake", "version": "1.0.0"}
            }));
            let mut r = reply(200, Some(JSON), init.to_string())?;
            r.headers_mut()
                .insert(SESSION_ID, HeaderValue::from_static("sess-1"));
            Ok(r)
        }
        "tools/list" => {
            let tools = result(json!({"tools": [
                {"name": "echo", "description": "Echo", "inputSchema": {"type": "object"}},
                {"name": "add", "inputSchema": {"type": "object", "properties": {"a": {"type": "number"}}}}
            ]}));
            // A keep-alive comment, then the response split over CRLF-terminated lines.
            let sse = format!(": keep-alive\r\nevent: message\r\ndata: {tools}\r\n\r\n");
            reply(200, Some("text/event-stream; charset=utf-8"), sse)
        }
        "tools/call" => {
            let args = &rpc["params"]["arguments"];
            if let Some(n) = args["big"].as_u64() {
                // An answer of n bytes of text, chunked (no Content-Length) if asked.
                let text = json!({"content": [{"type": "text", "text": "b".repeat(n as usize)}]});
                let mut r = reply(200, Some(JSON), result(text).to_string())?;
                if args["chunked"] == true {
                    r.headers_mut()
                        .insert("transfer-encoding", HeaderValue::from_static("chunked"));
                }
                return Ok(r);
            }
            let text = json!({"content": [{"type": "text", "text": args.to_string()}]});
            reply(200, Some(JSON), result(text).to_string())
        }
        _ => reply(202, None, String::new()),
    }
}

fn bearer() -> HashMap<HeaderName, HeaderValue> {
    HashMap::from([(AUTHORIZATION, HeaderValue::from_static("Bearer x"))])
}

#[tokio::test]
async fn handshake_session_sse_listing_and_custom_headers() {
    let fake = Fake::start(false).await;
    let client = ().serve(transport(&fake.url, bearer(), None)).await.expect("handshake");
    assert_eq!(
        client
            .peer_info()
            .unwrap()
            .server_info
            .as_ref()
            .unwrap()
            .name,
        "fake"
    );

    let tools = client.list_all_tools().await.expect("tools/list");
    let names: Vec<&str> = tools.iter().map(|t| t.name.as_ref()).collect();
    assert_eq!(names, ["echo", "add"]);

    let args = json!({"a": 1}).as_object().cloned().unwrap();
    let called = client
        .call_tool(CallToolRequestParams::new("add").with_arguments(args))
        .await
        .expect("tools/call");
    assert_eq!(called.content[0].as_text().unwrap().text, r#"{"a":1}"#);

    client.cancel().await.expect("close");
    let seen = fake.seen();
    let rpcs: Vec<(&Method, Option<&str>)> =
        seen.iter().map(|s| (&s.method, s.rpc.as_deref())).collect();
    let post = |rpc| (&Method::POST, Some(rpc));
    for expected in [
        post("initialize"),
        post("notifications/initialized"),
        (&Method::GET, None),
        post("tools/list"),
        post("tools/call"),
        (&Method::DELETE, None),
    ] {
        assert!(
            rpcs.contains(&expected),
            "{expected:?} missing from {rpcs:?}"
        );
    }
    assert_eq!(rpcs[0], post("initialize"));
    for s in &seen {
        let header = |name: &str| s.headers.get(name).and_then(|v| v.to_str().ok());
        assert_eq!(header("authorization"), Some("Bearer x"), "{s:?}");
        if s.rpc.as_deref() == Some("initialize") {
            assert_eq!(header("mcp-session-id"), None);
        } else {
            assert_eq!(header("mcp-session-id"), Some("sess-1"), "{s:?}");
            assert_eq!(header("mcp-protocol-version"), Some("2025-06-18"), "{s:?}");
        }
        if s.method == Method::POST {
            assert_eq!(header("content-type"), Some(JSON));
            let accept = header("accept").unwrap();
            assert!(
                accept.contains(JSON) && accept.contains(EVENT_STREAM),
                "{accept}"
            );
        }
    }
}

#[tokio::test]
async fn a_failing_server_is_an_error() {
    let fake = Fake::start(true).await;
    let served = tokio::time::timeout(
        Duration::from_secs(20),
        ().serve(transport(&fake.url, HashMap::new(), None)),
    )
    .await
    .expect("the handshake must fail, not hang");
    let Err(error) = served else {
        panic!("a 500 must fail the handshake");
    };
    let error = error.to_string();
    assert!(error.contains("HTTP 500"), "{error}");
}

/// A JSON answer over the limit ends its call at once with the reason, with its size when
/// the server gave it; the connection goes on serving.
#[tokio::test]
async fn a_json_answer_over_the_limit_becomes_its_error() {
    let fake = Fake::start(false).await;
    let client =
        ().serve(server_transport("shop", &fake.url, HashMap::new(), None))
            .await
            .expect("handshake");
    let call = |args: Value| {
        let params =
            CallToolRequestParams::new("echo").with_arguments(args.as_object().cloned().unwrap());
        client.call_tool(params)
    };
    for (chunked, size) in [(false, "was 17 MiB, over"), (true, "was over the 16 MiB")] {
        let args = json!({"big": 17 << 20, "chunked": chunked});
        let error = tokio::time::timeout(Duration::from_secs(20), call(args))
            .await
            .expect("the call ends at once")
            .expect_err("an answer over the limit is an error");
        let words = crate::tools::mcp::describe_error("MCP server shop", &error);
        assert!(
            words.starts_with("the answer of MCP server shop was ") && words.contains(size),
            "{words}"
        );
    }
    let fits = call(json!({"big": 1 << 20})).await.expect("1 MiB fits");
    assert_eq!(fits.content[0].as_text().unwrap().text.len(), 1 << 20);
    client.cancel().await.expect("close");
}

#[tokio::test]
async fn reserved_custom_headers_are_refused() {
    let headers = HashMap::from([(ACCEPT, HeaderValue::from_static("text/plain"))]);
    let request = HyperMcpClient::request(Method::GET, "http://h/", None, None, headers);
    let error = request.expect_err("accept is reserved");
    assert!(matches!(error, Error::ReservedHeaderConflict(_)), "{error}");
}

fn parse(chunks: &[&[u8]], max: usize) -> Result<Vec<Sse>, String> {
    let mut parser = SseParser::new(max, Arc::from("shop"));
    for chunk in chunks {
        parser.feed(chunk).map_err(|e| e.to_string())?;
    }
    Ok(parser.ready.into_iter().collect())
}

#[test]
fn sse_events_across_chunks_and_line_endings() {
    let events = parse(
        &[
            b"\xEF\xBB\xBFdata: a\r",
            b"\ndata:b\r\r: hi\nid: 7\nretry: 50\nev",
            b"ent: x\n\n",
        ],
        1024,
    )
    .unwrap();
    assert_eq!(events.len(), 2);
    assert_eq!(events[0].data.as_deref(), Some("a\nb"));
    assert_eq!(events[1].id.as_deref(), Some("7"));
    assert_eq!(events[1].retry, Some(50));
    assert_eq!(events[1].event.as_deref(), Some("x"));
    assert_eq!(events[1].data, None);
    // An event cut off by the end of the body is not emitted.
    assert!(parse(&[b"data: half"], 1024).unwrap().is_empty());
}

#[test]
fn sse_event_size_is_bounded() {
    assert_eq!(parse(&[b"data: 12345\n\n"], 12).unwrap().len(), 1);
    // Over the limit, and no response: dropped; the events after it are read.
    let events = parse(&[b"data: 12345\ndata: 6\n\ndata: 7\n\n"], 12).unwrap();
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].data.as_deref(), Some("7"));
    // The limit is per event, and comments do not count.
    assert_eq!(
        parse(&[b": 0123456789\ndata: 1\n\ndata: 2\n\n"], 12)
            .unwrap()
            .len(),
        2
    );
}

/// A response over the limit becomes the JSON-RPC error ending its call, whichever end of
/// it holds the id and however it is cut into chunks and lines; a request or notification
/// is dropped, its event id kept.
#[test]
fn an_sse_response_over_the_limit_becomes_its_error() {
    let text = "t".repeat(5000);
    let first = format!("id: 9\ndata: {{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{{\"content\":[{{\"text\":\"{text}\"}}]}}}}\n\n");
    let last = format!("data: {{\"result\":{{\"content\":[{{\"text\":\"{text}\"}}]}},\ndata: \"jsonrpc\":\"2.0\",\r\ndata:\"id\":\"a\\\"b\"}}\n\n");
    let note = format!("id: 10\ndata: {{\"jsonrpc\":\"2.0\",\"method\":\"notifications/message\",\"params\":{{\"data\":\"{text}\"}}}}\n\ndata: after\n\n");
    for (input, id, event_id) in [(first, json!(3), Some("9")), (last, json!("a\"b"), None)] {
        for chunk in [1, 7, 4096] {
            let chunks: Vec<&[u8]> = input.as_bytes().chunks(chunk).collect();
            let events = parse(&chunks, 1024).unwrap();
            assert_eq!(events.len(), 1, "{events:?}");
            assert_eq!(events[0].id.as_deref(), event_id);
            let answer: Value = serde_json::from_str(events[0].data.as_deref().unwrap()).unwrap();
            assert_eq!(answer["id"], id);
            let message = answer["error"]["message"].as_str().unwrap();
            assert!(
                message.starts_with("the answer of MCP server shop was over")
                    || message.contains("MiB, over the 16 MiB"),
                "{message}"
            );
        }
    }
    let events = parse(&[note.as_bytes()], 1024).unwrap();
    assert_eq!(events.len(), 2, "{events:?}");
    assert_eq!(
        (events[0].id.as_deref(), events[0].data.as_deref()),
        (Some("10"), None)
    );
    assert_eq!(events[1].data.as_deref(), Some("after"));
}

#[test]
fn headers_and_challenges() {
    assert!(media_type_is(
        &HeaderValue::from_static("Application/JSON; charset=utf-8"),
        JSON
    ));
    assert!(!media_type_is(
        &HeaderValue::from_static("application/jsonx"),
        JSON
    ));
    let quoted = r#"Bearer error="insufficient_scope", scope="files:read files:write""#;
    assert_eq!(
        challenge_scope(quoted).as_deref(),
        Some("files:read files:write")
    );
    assert_eq!(
        challenge_scope("Bearer scope=read, x=y").as_deref(),
        Some("read")
    );
    assert_eq!(challenge_scope("Bearer"), None);
}
